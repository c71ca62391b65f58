//! W11, isolation: a neighbour's latency while another tenant runs
//! statements that never end on twice as many actors as the node has
//! workers (issue 33's bar: its p99 within 2x of its p99 without them).
//!
//! The attacker is the `hostile` guest deployed as tenant `evil`; each of
//! its actors runs `POST /forever` (a recursive query that stops only at
//! `event_cpu_ms_max`) again as soon as it ends. The neighbour is the demo
//! app's counter, incremented one request after another, first with the
//! node quiet and then under the attack.

use std::time::Duration;

use anyhow::{Result, bail};
use bytes::Bytes;
use hyper::Method;

use crate::client::{self, Conn, Endpoint};
use crate::workloads::{EXAMPLES, Env, RunOutput, finish, quantile};

/// Sequential increments of the neighbour in each phase.
const REQUESTS: usize = 500;

/// W11.
pub async fn w11(env: &Env<'_>) -> Result<RunOutput> {
    let mut out = RunOutput::default();
    let node = env.start(None).await?;
    let ep = env.endpoint(&node);
    let r = run(env, &ep, &mut out).await;
    finish(node, &mut out).await;
    r.map(|_| out)
}

async fn run(env: &Env<'_>, ep: &Endpoint, out: &mut RunOutput) -> Result<()> {
    let mut admin = Conn::connect(ep).await?;
    let deployed = admin
        .send_with_body(
            &Method::PUT,
            "/admin/v1/apps/evil/x",
            Bytes::from_static(wasmkeep_guests::HOSTILE),
        )
        .await?;
    if deployed.status != 200 {
        bail!(
            "deploy evil/x: {} {}",
            deployed.status,
            String::from_utf8_lossy(&deployed.body)
        );
    }
    let name = format!("{}neighbour", env.prefix(""));
    let mut conn = Conn::connect(ep).await?;
    // The neighbour's actor exists before anything is measured.
    let first = conn
        .send(
            &Method::POST,
            &format!("{EXAMPLES}/counter/{name}/increment"),
        )
        .await;
    anyhow::ensure!(
        crate::workloads::json_of(&first).is_some(),
        "the neighbour's first increment: {}",
        client::describe(&first)
    );
    let (calm, calm_bad) = increments(&mut conn, &name, 1).await?;
    // Twice as many runaway actors as the machine has cores: more than
    // the node has workers.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let attackers: Vec<_> = (0..2 * cores)
        .map(|i| {
            let ep = ep.clone();
            tokio::spawn(async move {
                let Ok(mut c) = Conn::connect(&ep).await else {
                    return;
                };
                loop {
                    let _ = c
                        .send(
                            &Method::POST,
                            &format!("/v1/evil/x/attacker/run{i}/forever"),
                        )
                        .await;
                }
            })
        })
        .collect();
    // Lets the statements start, and run past a turn's slice.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (attacked, attacked_bad) = increments(&mut conn, &name, 1 + REQUESTS as u64).await?;
    for a in attackers {
        a.abort();
    }
    let fig = |out: &mut RunOutput, what: &str, ms: &[f64]| {
        out.fig(
            &format!("{what}_p50_ms"),
            quantile(ms, 0.50).unwrap_or(f64::NAN),
        );
        out.fig(
            &format!("{what}_p99_ms"),
            quantile(ms, 0.99).unwrap_or(f64::NAN),
        );
        out.fig(
            &format!("{what}_max_ms"),
            quantile(ms, 1.0).unwrap_or(f64::NAN),
        );
    };
    fig(out, "calm", &calm);
    fig(out, "attacked", &attacked);
    let ratio =
        quantile(&attacked, 0.99).unwrap_or(f64::NAN) / quantile(&calm, 0.99).unwrap_or(f64::NAN);
    out.fig("p99_ratio", ratio);
    let bad: Vec<String> = calm_bad.into_iter().chain(attacked_bad).collect();
    out.check(
        "neighbour_counted",
        bad.is_empty(),
        if bad.is_empty() {
            format!("{} increments each counted by one", 2 * REQUESTS)
        } else {
            bad.join(" | ")
        },
    );
    Ok(())
}

/// [`REQUESTS`] increments of `name`, one after another (it stood at
/// `from`): each one's time, sorted, and what went wrong (at most five).
async fn increments(conn: &mut Conn, name: &str, from: u64) -> Result<(Vec<f64>, Vec<String>)> {
    let mut ms = Vec::with_capacity(REQUESTS);
    let mut bad = Vec::new();
    for i in 1..=REQUESTS as u64 {
        let t0 = crate::clock::now();
        let r = conn
            .send(
                &Method::POST,
                &format!("{EXAMPLES}/counter/{name}/increment"),
            )
            .await;
        ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        let value = crate::workloads::json_of(&r).and_then(|v| v["value"].as_u64());
        if value != Some(from + i) && bad.len() < 5 {
            bad.push(format!("increment {i}: {}", client::describe(&r)));
        }
    }
    ms.sort_by(f64::total_cmp);
    Ok((ms, bad))
}
