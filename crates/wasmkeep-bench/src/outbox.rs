//! W7, the outbox (ADR 0040): actor-to-actor messages and outbound HTTP
//! calls, delivered by the node's dispatcher.
//!
//! Messages: `--actors` actors of the bundled `pinger` class each send 10
//! messages to the next one (`/ping?to=…&n=10`, one event each), which
//! answers each; the benchmark waits until every answer was applied and
//! reads, from the senders' own databases, when each message was sent and
//! when its answer's event ran. Then calls: each actor makes 5 outbound
//! `GET`s to an HTTP server in the benchmark's process on loopback.
//!
//! Figures: messages (and calls) per second from the first send to the
//! last answer applied, send-to-answer latency p50/p99 (the node's clock,
//! in the guest), and the checks: none lost, none applied twice (by the
//! receiver or by the sender). The node runs with `outbound_private_allowed
//! = true` (loopback is a private address) and the app is deployed as
//! `bench/outbox` with the server in its `[outbound] hosts`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use hyper::Method;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{self, Conn, Endpoint};
use crate::workloads::{Env, RunOutput, finish, quantile};

/// Messages each actor sends.
pub const MESSAGES_PER_ACTOR: u64 = 10;
/// Outbound calls each actor makes.
pub const CALLS_PER_ACTOR: u64 = 5;
/// How long the benchmark waits for every answer.
const SETTLE_LIMIT: Duration = Duration::from_secs(120);
const APP: &str = "/v1/bench/outbox/pinger";

/// A loopback HTTP server answering `ok` to every request (one request a
/// connection), counting them.
async fn loopback_server() -> Result<(u16, Arc<AtomicU64>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let served = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&served);
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let mut buf = Vec::with_capacity(1024);
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    if buf.len() > 64 * 1024 {
                        return;
                    }
                }
                count.fetch_add(1, Ordering::Relaxed);
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    Ok((port, served))
}

fn json(r: &Result<(u16, Bytes)>) -> Option<serde_json::Value> {
    match r {
        Ok((200, b)) => serde_json::from_slice(b).ok(),
        _ => None,
    }
}

/// Sums a field of every actor's JSON answer to `GET {route}`.
async fn sum(
    ep: &Endpoint,
    conns: usize,
    names: &[String],
    route: &str,
    fields: &[&str],
) -> Result<Vec<u64>> {
    let reqs = names
        .iter()
        .map(|n| (Method::GET, format!("{APP}/{n}{route}")))
        .collect();
    let rs = client::send_all(ep, conns, reqs).await?;
    let mut totals = vec![0u64; fields.len()];
    for (n, r) in names.iter().zip(&rs) {
        let v = json(r).ok_or_else(|| anyhow!("{route} of {n}: {}", client::describe(r)))?;
        for (t, f) in totals.iter_mut().zip(fields) {
            *t += v[*f].as_u64().unwrap_or(0);
        }
    }
    Ok(totals)
}

/// Every actor's answered `[sent_ms, answered_ms]` pairs of `kind`.
async fn pairs(
    ep: &Endpoint,
    conns: usize,
    names: &[String],
    kind: &str,
) -> Result<Vec<(u64, u64)>> {
    let reqs = names
        .iter()
        .map(|n| (Method::GET, format!("{APP}/{n}/latencies")))
        .collect();
    let rs = client::send_all(ep, conns, reqs).await?;
    let mut out = Vec::new();
    for (n, r) in names.iter().zip(&rs) {
        let v = json(r).ok_or_else(|| anyhow!("latencies of {n}: {}", client::describe(r)))?;
        for p in v[kind].as_array().into_iter().flatten() {
            out.push((p[0].as_u64().unwrap_or(0), p[1].as_u64().unwrap_or(0)));
        }
    }
    Ok(out)
}

/// Rate, p50 and p99 of `(sent, answered)` pairs, into `out` as `{name}_…`.
fn figures(out: &mut RunOutput, name: &str, pairs: &[(u64, u64)]) {
    let first = pairs.iter().map(|p| p.0).min().unwrap_or(0);
    let last = pairs.iter().map(|p| p.1).max().unwrap_or(0);
    let span_s = (last.saturating_sub(first) as f64 / 1000.0).max(0.001);
    out.fig(&format!("{name}_per_s"), pairs.len() as f64 / span_s);
    let mut lat: Vec<u64> = pairs.iter().map(|(s, a)| a.saturating_sub(*s)).collect();
    lat.sort_unstable();
    out.fig(
        &format!("{name}_p50_ms"),
        quantile(&lat, 0.50).unwrap_or(0) as f64,
    );
    out.fig(
        &format!("{name}_p99_ms"),
        quantile(&lat, 0.99).unwrap_or(0) as f64,
    );
}

/// Polls `done` until it holds or [`SETTLE_LIMIT`] passes.
async fn settle<F, Fut>(mut done: F) -> Result<bool>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let t = crate::clock::now();
    while t.elapsed() < SETTLE_LIMIT {
        if done().await? {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(false)
}

/// The bytes [`encode`] escapes: all but RFC 3986's unreserved characters
/// (`A-Z a-z 0-9 - . _ ~`), which a query parameter may hold as they are.
/// Every other byte is escaped: `&`, `=`, `+` and `%` would change what the
/// node decodes, and a manifest's newlines, quotes and spaces cannot stand
/// in a request line (the bytes of a non-ASCII character are always
/// escaped).
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `s` as a query parameter's value.
fn encode(s: &str) -> String {
    utf8_percent_encode(s, QUERY_VALUE).to_string()
}

pub async fn w7(env: &Env<'_>) -> Result<RunOutput> {
    let mut out = RunOutput::default();
    let config = env.own_dir().map(|d| d.join("w7.toml"));
    if let Some(path) = &config {
        std::fs::write(path, "outbound_private_allowed = true\n")?;
    }
    let node = env.start(config).await?;
    let ep = env.endpoint(&node);
    let r = run(env, &ep, &mut out).await;
    finish(node, &mut out).await;
    r.map(|_| out)
}

/// Deploys the demo guests as `bench/outbox`, allowed to call the loopback
/// server on `port`.
async fn deploy(ep: &Endpoint, port: u16) -> Result<()> {
    let manifest = format!("[outbound]\nhosts = [\"127.0.0.1:{port}\"]\nper_actor_max = 4\n");
    let mut admin = Conn::connect(ep).await?;
    let deployed = admin
        .send_with_body(
            &Method::PUT,
            &format!("/admin/v1/apps/bench/outbox?manifest={}", encode(&manifest)),
            // The pinger of the language the run calls (`--lang`).
            Bytes::from_static(
                if crate::workloads::EXAMPLES.path() == crate::workloads::EXAMPLES_TS {
                    wasmkeep_guests::EXAMPLES_TS
                } else {
                    wasmkeep_guests::DEMO
                },
            ),
        )
        .await?;
    if deployed.status != 200 {
        bail!(
            "deploy bench/outbox: {} {}",
            deployed.status,
            String::from_utf8_lossy(&deployed.body)
        );
    }
    Ok(())
}

/// Sends `reqs` over `conns` connections; an error naming the first failure
/// if any `what` request was not answered 200.
async fn send_all_ok(
    ep: &Endpoint,
    conns: usize,
    reqs: Vec<(Method, String)>,
    what: &str,
) -> Result<()> {
    let rs = client::send_all(ep, conns, reqs).await?;
    let refused = rs.iter().filter(|r| !matches!(r, Ok((200, _)))).count();
    if refused > 0 {
        let first = rs.iter().find(|r| !matches!(r, Ok((200, _)))).expect("one");
        bail!(
            "{refused} {what} requests failed; first: {}",
            client::describe(first)
        );
    }
    Ok(())
}

/// Messages: each actor pings the next one [`MESSAGES_PER_ACTOR`] times;
/// waits for every answer, then records the figures and checks that none
/// was lost or applied twice.
async fn messages(
    ep: &Endpoint,
    conns: usize,
    names: &[String],
    out: &mut RunOutput,
) -> Result<()> {
    let n = names.len();
    let sends = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let to = &names[(i + 1) % n];
            (
                Method::POST,
                format!("{APP}/{name}/ping?to={to}&n={MESSAGES_PER_ACTOR}"),
            )
        })
        .collect();
    send_all_ok(ep, conns, sends, "ping").await?;
    let expected = n as u64 * MESSAGES_PER_ACTOR;
    let settled = settle(|| async {
        let t = sum(ep, conns, names, "/pongs", &["answered"]).await?;
        Ok(t[0] >= expected)
    })
    .await?;
    let pongs = sum(
        ep,
        conns,
        names,
        "/pongs",
        &["sent", "answered", "duplicates"],
    )
    .await?;
    let stats = sum(
        ep,
        conns,
        names,
        "/stats",
        &["received", "received_twice", "failed"],
    )
    .await?;
    let (sent, answered, duplicates) = (pongs[0], pongs[1], pongs[2]);
    let (received, twice, failed) = (stats[0], stats[1], stats[2]);
    let msgs = pairs(ep, conns, names, "pings").await?;
    figures(out, "messages", &msgs);
    out.fig("messages_sent", sent as f64);
    out.fig("messages_lost", sent.saturating_sub(answered) as f64);
    out.fig("applied_twice", (duplicates + twice) as f64);
    out.check(
        "no_lost_messages",
        settled && answered == expected && received == expected && failed == 0,
        format!(
            "sent {sent} (expected {expected}); answered {answered}; received {received}; failed {failed}; settled within {} s: {settled}",
            SETTLE_LIMIT.as_secs()
        ),
    );
    out.check(
        "none_applied_twice",
        duplicates == 0 && twice == 0,
        format!("answers applied twice {duplicates}; messages applied twice {twice}"),
    );
    Ok(())
}

/// Outbound calls: each actor makes [`CALLS_PER_ACTOR`] calls to the
/// loopback server on `port` (which counts them in `served`); waits for
/// their answers, then records the figures and checks that every call was
/// answered.
async fn calls(
    ep: &Endpoint,
    conns: usize,
    names: &[String],
    port: u16,
    served: &AtomicU64,
    out: &mut RunOutput,
) -> Result<()> {
    let url = format!("http://127.0.0.1:{port}/w7");
    let calls = names
        .iter()
        .map(|name| {
            (
                Method::POST,
                format!(
                    "{APP}/{name}/fetch?url={}&n={CALLS_PER_ACTOR}",
                    encode(&url)
                ),
            )
        })
        .collect();
    send_all_ok(ep, conns, calls, "fetch").await?;
    let expected_calls = names.len() as u64 * CALLS_PER_ACTOR;
    let t = crate::clock::now();
    let mut got = pairs(ep, conns, names, "calls").await?;
    while (got.len() as u64) < expected_calls && t.elapsed() < SETTLE_LIMIT {
        tokio::time::sleep(Duration::from_millis(200)).await;
        got = pairs(ep, conns, names, "calls")
            .await
            .context("waiting for the calls' answers")?;
    }
    let settled = got.len() as u64 >= expected_calls;
    figures(out, "calls", &got);
    let served = served.load(Ordering::Relaxed);
    out.check(
        "every_call_answered",
        settled && got.len() as u64 == expected_calls,
        format!(
            "{} of {expected_calls} calls answered 200; the server saw {served} requests",
            got.len()
        ),
    );
    Ok(())
}

/// Typed calls (ADR 0051), beside the raw messages: each `caller` actor
/// makes [`MESSAGES_PER_ACTOR`] `tally_api.add` calls to the next
/// actor's `tally` in one event; the caller records, for each typed
/// answer, the time the call was sent (its note) and applied.
async fn typed_calls(
    ep: &Endpoint,
    conns: usize,
    names: &[String],
    out: &mut RunOutput,
) -> Result<()> {
    let caller = APP.replace("/pinger", "/caller");
    let n = names.len();
    let sends = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let to = &names[(i + 1) % n];
            (
                Method::POST,
                format!("{caller}/{name}/add?name={to}&by=1&n={MESSAGES_PER_ACTOR}"),
            )
        })
        .collect();
    send_all_ok(ep, conns, sends, "typed call").await?;
    let expected = n as u64 * MESSAGES_PER_ACTOR;
    let read = || async {
        let reqs = names
            .iter()
            .map(|name| (Method::GET, format!("{caller}/{name}/replies")))
            .collect();
        let rs = client::send_all(ep, conns, reqs).await?;
        let mut got = Vec::new();
        let mut failed = 0u64;
        for (name, r) in names.iter().zip(&rs) {
            let v = json(r).ok_or_else(|| anyhow!("replies of {name}: {}", client::describe(r)))?;
            for x in v["replies"].as_array().into_iter().flatten() {
                if x["ok"] != true {
                    failed += 1;
                }
                let sent: u64 = x["note"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0);
                got.push((sent, x["answered_ms"].as_u64().unwrap_or(0)));
            }
        }
        anyhow::Ok((got, failed))
    };
    let t = crate::clock::now();
    let (mut got, mut failed) = read().await?;
    while (got.len() as u64) < expected && t.elapsed() < SETTLE_LIMIT {
        tokio::time::sleep(Duration::from_millis(200)).await;
        (got, failed) = read().await?;
    }
    figures(out, "typed_calls", &got);
    out.check(
        "every_typed_call_answered",
        got.len() as u64 == expected && failed == 0,
        format!(
            "{} of {expected} typed calls answered; {failed} refused",
            got.len()
        ),
    );
    Ok(())
}

/// Waits each `waiter` actor makes in the awaited phase.
pub const AWAITS_PER_ACTOR: u64 = 5;

/// Typed calls waited for inside the handler (ADR 0056), beside the raw
/// messages and the typed calls: [`AWAITS_PER_ACTOR`] requests to each
/// `waiter` actor, all sent at once, each waiting for the next actor's
/// `tally_api.add(1)`; an actor runs its requests one after another (each
/// waits with the whole actor). The figure is requests answered per
/// second over the phase's wall time, as the client sees it (the guest's
/// clock repeats the first run's time, so it cannot time the wait).
async fn awaited_calls(
    ep: &Endpoint,
    conns: usize,
    names: &[String],
    out: &mut RunOutput,
) -> Result<()> {
    let waiter = APP.replace("/pinger", "/waiter");
    let n = names.len();
    let reqs: Vec<(Method, String)> = (0..AWAITS_PER_ACTOR)
        .flat_map(|_| {
            names.iter().enumerate().map(|(i, name)| {
                let to = &names[(i + 1) % n];
                (Method::POST, format!("{waiter}/{name}/add?name={to}&by=1"))
            })
        })
        .collect();
    let expected = reqs.len();
    let t = crate::clock::now();
    let rs = client::send_all(ep, conns, reqs).await?;
    let secs = t.elapsed().as_secs_f64().max(0.001);
    let ok = rs.iter().filter(|r| matches!(r, Ok((200, _)))).count();
    out.fig("awaited_calls_per_s", ok as f64 / secs);
    let first = rs
        .iter()
        .find(|r| !matches!(r, Ok((200, _))))
        .map(client::describe)
        .unwrap_or_default();
    out.check(
        "every_awaited_call_answered",
        ok == expected,
        format!("{ok} of {expected} requests that wait for a typed answer answered 200 {first}"),
    );
    Ok(())
}

/// W7's run on a started node: deploys the app, then the messages, the
/// typed calls, the awaited calls and the outbound calls.
async fn run(env: &Env<'_>, ep: &Endpoint, out: &mut RunOutput) -> Result<()> {
    let conns = env.args.connections;
    let (port, served) = loopback_server().await?;
    deploy(ep, port).await?;
    let n = env.args.actors.max(2);
    let names: Vec<String> = (0..n).map(|i| format!("{}m{i}", env.prefix(""))).collect();
    messages(ep, conns, &names, out).await?;
    typed_calls(ep, conns, &names, out).await?;
    awaited_calls(ep, conns, &names, out).await?;
    calls(ep, conns, &names, port, &served, out).await
}

/// Actors of the workflow workload, each running one workflow.
pub const WORKFLOW_ACTORS: usize = 1_000;
/// Steps of that workflow (`ten` of the `orders` class).
pub const WORKFLOW_STEPS: u64 = 10;

/// The workflow workload (issue 36): [`WORKFLOW_ACTORS`] `orders` actors
/// each start the ten-step workflow `ten` at once; the figure is steps
/// per second from the first start to the last step recorded (the
/// node's clock, read from each instance's history), and the time from
/// start to done per workflow.
pub async fn w7_workflows(env: &Env<'_>) -> Result<RunOutput> {
    let mut out = RunOutput::default();
    let node = env.start(None).await?;
    let ep = env.endpoint(&node);
    let r = workflows(env, &ep, &mut out).await;
    finish(node, &mut out).await;
    r.map(|_| out)
}

async fn workflows(env: &Env<'_>, ep: &Endpoint, out: &mut RunOutput) -> Result<()> {
    let conns = env.args.connections;
    let base = format!("{}/orders", crate::workloads::EXAMPLES.path());
    let names: Vec<String> = (0..WORKFLOW_ACTORS)
        .map(|i| format!("{}wf{i}", env.prefix("")))
        .collect();
    let started_ms = crate::clock::now_ms();
    let starts = names
        .iter()
        .map(|n| (Method::POST, format!("{base}/{n}/start-ten?id=w")))
        .collect();
    let rs = client::send_all(ep, conns, starts).await?;
    if let Some(bad) = rs.iter().find(|r| !matches!(r, Ok((204, _)))) {
        bail!("a workflow did not start: {}", client::describe(bad));
    }
    let t = crate::clock::now();
    loop {
        let reqs = names
            .iter()
            .map(|n| (Method::GET, format!("{base}/{n}/status?id=w")))
            .collect();
        let rs = client::send_all(ep, conns, reqs).await?;
        let states: Vec<serde_json::Value> = rs.iter().filter_map(json).collect();
        let done = states.iter().filter(|s| s["state"] == "done").count();
        if done == names.len() || t.elapsed() >= SETTLE_LIMIT {
            let mut last = started_ms;
            let mut spans: Vec<u64> = Vec::new();
            let mut steps = 0u64;
            for s in &states {
                let h = s["history"].as_array().cloned().unwrap_or_default();
                steps += h.len() as u64;
                let end = h
                    .iter()
                    .filter_map(|x| x["done_ms"].as_u64())
                    .max()
                    .unwrap_or(0);
                last = last.max(end);
                spans.push(end.saturating_sub(started_ms));
            }
            spans.sort_unstable();
            let span_s = (last.saturating_sub(started_ms) as f64 / 1000.0).max(0.001);
            out.fig("workflow_steps_per_s", steps as f64 / span_s);
            out.fig(
                "workflow_done_p50_ms",
                quantile(&spans, 0.50).unwrap_or(0) as f64,
            );
            out.fig(
                "workflow_done_p99_ms",
                quantile(&spans, 0.99).unwrap_or(0) as f64,
            );
            let expected = names.len() as u64 * WORKFLOW_STEPS;
            out.check(
                "every_workflow_done",
                done == names.len() && steps == expected,
                format!(
                    "{done} of {} done; {steps} of {expected} steps recorded",
                    names.len()
                ),
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::encode;

    #[test]
    fn query_values_escape_all_but_the_unreserved_characters() {
        assert_eq!(encode("a b"), "a%20b");
        assert_eq!(encode("/w7"), "%2Fw7");
        assert_eq!(encode("100%"), "100%25");
        assert_eq!(encode("é"), "%C3%A9");
        assert_eq!(encode("Az09-._~"), "Az09-._~");
        assert_eq!(
            encode("http://127.0.0.1:80/w7?a=1&b=+"),
            "http%3A%2F%2F127.0.0.1%3A80%2Fw7%3Fa%3D1%26b%3D%2B"
        );
        assert_eq!(
            encode("hosts = [\"h\"]\n"),
            "hosts%20%3D%20%5B%22h%22%5D%0A"
        );
    }
}
