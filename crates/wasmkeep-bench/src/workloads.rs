//! The single-node workloads of `docs/benchmarks.md` (W1, W1-hot,
//! W1-durable, W2, W2-restart, W3, W4; the cluster ones are in
//! [`crate::cluster`]). Each run measures, then checks its own
//! correctness; a failed check makes the whole command fail.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use hyper::Method;
use serde::Serialize;

use crate::BenchArgs;
use crate::client::{self, Conn, Endpoint};
use crate::load::{self, LoadSpec};
use crate::node::{Node, NodeSpec, log_tail};

/// The bundled examples' address prefix.
/// The bundled examples in Rust.
pub(crate) const EXAMPLES_RUST: &str = "/v1/demo/examples";
/// The same classes in TypeScript (`serve --examples` deploys both).
pub(crate) const EXAMPLES_TS: &str = "/v1/demo/examples-ts";

/// Whether the workloads call the TypeScript examples (`--lang ts`).
static LANG_TS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes every workload call the TypeScript examples (`--lang ts`) or the
/// Rust ones; `run` sets it once, before any workload.
pub(crate) fn use_typescript(ts: bool) {
    LANG_TS.store(ts, std::sync::atomic::Ordering::Relaxed);
}

/// The app the workloads call, as a path prefix: [`EXAMPLES_RUST`], or
/// [`EXAMPLES_TS`] with `--lang ts`. A `Display` so that paths read
/// `format!("{EXAMPLES}/counter/...")`.
pub(crate) struct Examples;

impl Examples {
    pub(crate) fn path(&self) -> &'static str {
        if LANG_TS.load(std::sync::atomic::Ordering::Relaxed) {
            EXAMPLES_TS
        } else {
            EXAMPLES_RUST
        }
    }
}

impl std::fmt::Display for Examples {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.path())
    }
}

/// The examples app every workload calls (see [`Examples`]).
pub(crate) static EXAMPLES: Examples = Examples;
/// W2-restart: the node is killed this long before the due time…
const ALARM_KILL_BEFORE_MS: u64 = 2_000;
/// …and restarted this long after it.
const ALARM_RESTART_AFTER_MS: u64 = 1_000;
/// W2: the first look at the fired records, after the due time. Looking
/// earlier would put the benchmark's own reads on the node while it fires.
const ALARM_FIRST_POLL_AFTER_MS: u64 = 1_000;
/// W2: how often the node's metrics are read while its alarms fire (see
/// [`wait_for_the_node_to_fire`])…
const ALARM_METRICS_INTERVAL_MS: u64 = 100;
/// …and how long a count of fired alarms that does not rise ends the wait.
const ALARM_METRICS_STALL_MS: u64 = 5_000;
const ALARM_POLL_INTERVAL_MS: u64 = 250;
/// W2: how long after the due time an alarm may still fire before it
/// counts as lost.
const ALARM_WAIT_MS_MAX: u64 = 60_000;
/// W4: the node's idle timeout for this workload (`actor_idle_ms`).
const W4_ACTOR_IDLE_MS: u64 = 2_000;
/// W4: how long to wait for every actor to be closed, beyond the timeout.
const W4_IDLE_WAIT_MS_MAX: u64 = 30_000;
/// W4: a pause after the last actor closed, before RSS is read.
const W4_SETTLE_MS: u64 = 1_000;

/// One correctness check of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

/// What one run of a workload produced.
#[derive(Debug, Default, Serialize)]
pub struct RunOutput {
    /// Figures in report order (name, value); units are in the names.
    pub figures: Vec<(String, f64)>,
    pub checks: Vec<Check>,
}

impl RunOutput {
    pub(crate) fn fig(&mut self, name: &str, v: f64) {
        self.figures.push((name.to_string(), v));
    }

    pub(crate) fn check(&mut self, name: &str, ok: bool, detail: impl Into<String>) {
        self.checks.push(Check {
            name: name.to_string(),
            ok,
            detail: detail.into(),
        });
    }
}

/// Where a run sends its requests.
pub enum Target {
    /// A node the run starts itself.
    Own {
        exe: PathBuf,
        durability: &'static str,
        compile_cache: PathBuf,
        /// This run's directory (data, log, config).
        dir: PathBuf,
    },
    /// A node someone else runs (`--server`).
    Server(Endpoint),
}

/// A run's view of its target: the node it started, if any.
pub struct Env<'a> {
    pub args: &'a BenchArgs,
    pub target: &'a Target,
    /// Makes actor names unique against a shared server.
    pub nonce: u64,
}

impl Env<'_> {
    fn spec(&self, config: Option<PathBuf>) -> Result<Option<NodeSpec>> {
        match self.target {
            Target::Own {
                exe,
                durability,
                compile_cache,
                dir,
            } => Ok(Some(NodeSpec {
                exe: exe.clone(),
                data: dir.join("data"),
                durability,
                config: self.node_config(dir, config)?,
                compile_cache: compile_cache.clone(),
                log: dir.join("node.log"),
                bucket: None,
                cluster_port: None,
                examples: true,
            })),
            Target::Server(_) => Ok(None),
        }
    }

    /// The node's configuration file: `--node-config`'s settings, then the
    /// workload's own (`config`), in one file in the run's directory.
    fn node_config(&self, dir: &Path, config: Option<PathBuf>) -> Result<Option<PathBuf>> {
        let Some(base) = &self.args.node_config else {
            return Ok(config);
        };
        let mut text = std::fs::read_to_string(base)
            .with_context(|| format!("--node-config {}", base.display()))?;
        if let Some(own) = &config {
            text.push('\n');
            text.push_str(&std::fs::read_to_string(own)?);
        }
        let merged = dir.join("node-settings.toml");
        std::fs::write(&merged, text)?;
        Ok(Some(merged))
    }

    /// The run's own directory, when the benchmark started the node.
    pub(crate) fn own_dir(&self) -> Option<&Path> {
        match self.target {
            Target::Own { dir, .. } => Some(dir),
            Target::Server(_) => None,
        }
    }

    pub(crate) async fn start(&self, config: Option<PathBuf>) -> Result<Option<Node>> {
        self.start_on(config, None).await
    }

    /// A node of its own without the bundled examples: the workload
    /// deploys what it needs.
    pub(crate) async fn start_bare(&self, config: Option<PathBuf>) -> Result<Node> {
        let mut s = self
            .spec(config)?
            .ok_or_else(|| anyhow!("this workload needs a node started by the benchmark"))?;
        s.examples = false;
        Node::start(&s).await
    }

    pub(crate) async fn start_on(
        &self,
        config: Option<PathBuf>,
        bucket: Option<String>,
    ) -> Result<Option<Node>> {
        match self.spec(config)? {
            Some(mut s) => {
                s.bucket = bucket;
                Ok(Some(Node::start(&s).await?))
            }
            None => Ok(None),
        }
    }

    pub(crate) fn endpoint(&self, node: &Option<Node>) -> Endpoint {
        match (node, self.target) {
            (Some(n), _) => n.endpoint.clone(),
            (None, Target::Server(e)) => e.clone(),
            (None, Target::Own { .. }) => unreachable!("an own target always has a node"),
        }
    }

    /// A name prefix: `plain` on a fresh node, unique on a shared server.
    pub(crate) fn prefix(&self, plain: &str) -> String {
        match self.target {
            Target::Own { .. } => plain.to_string(),
            Target::Server(_) => format!("{plain}{}-", self.nonce),
        }
    }
}

/// Starts a node once and stops it, before the first run, so that the
/// compile cache holds the examples' compiled code: every run's node then
/// starts as a node restarting on its data directory does, whichever
/// workloads ran before it. (Without this, W4's RSS included the memory
/// compiling leaves behind when W4 ran first, and not otherwise.)
pub async fn warm_compile_cache(
    args: &BenchArgs,
    exe: &Path,
    durability: &'static str,
    compile_cache: &Path,
    dir: &Path,
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let target = Target::Own {
        exe: exe.to_owned(),
        durability,
        compile_cache: compile_cache.to_owned(),
        dir: dir.to_owned(),
    };
    let env = Env {
        args,
        target: &target,
        nonce: 0,
    };
    let mut node = env.start(None).await?.expect("own node");
    node.stop().await?;
    Ok(())
}

/// Stops a node the run started, and records how long it took and whether
/// it exited cleanly.
pub(crate) async fn finish(node: Option<Node>, out: &mut RunOutput) {
    if let Some(mut n) = node {
        match n.stop().await {
            Ok(ms) => {
                out.fig("shutdown_ms", ms);
                out.check("clean_shutdown", true, "exit 0 after SIGTERM");
            }
            Err(e) => out.check(
                "clean_shutdown",
                false,
                format!("{e:#}\n{}", log_tail(&n.log, 20)),
            ),
        }
    }
}

pub(crate) use crate::clock::now_ms;

pub(crate) async fn sleep_until_ms(t: u64) {
    let now = now_ms();
    if t > now {
        tokio::time::sleep(Duration::from_millis(t - now)).await;
    }
}

/// Nearest-rank quantile of sorted values.
pub fn quantile<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

pub(crate) fn json_of(r: &Result<(u16, bytes::Bytes)>) -> Option<serde_json::Value> {
    match r {
        Ok((200, b)) => serde_json::from_slice(b).ok(),
        _ => None,
    }
}

/// Reads `{"value":N}` of every counter; the first failure is an error.
pub(crate) async fn read_counters(
    ep: &Endpoint,
    conns: usize,
    names: &[String],
) -> Result<Vec<u64>> {
    read_counters_of(EXAMPLES.path(), ep, conns, names).await
}

/// [`read_counters`] of the app at `app` (`EXAMPLES` or `EXAMPLES_TS`).
async fn read_counters_of(
    app: &str,
    ep: &Endpoint,
    conns: usize,
    names: &[String],
) -> Result<Vec<u64>> {
    let reqs = names
        .iter()
        .map(|n| (Method::GET, format!("{app}/counter/{n}/value")))
        .collect();
    let rs = client::send_all(ep, conns, reqs).await?;
    names
        .iter()
        .zip(&rs)
        .map(|(n, r)| {
            json_of(r)
                .and_then(|v| v["value"].as_u64())
                .ok_or_else(|| anyhow!("read counter `{n}`: {}", client::describe(r)))
        })
        .collect()
}

/// W1's load on `names` (every request increments one of them), then the
/// lost-write check: the counters grew by exactly the number of
/// acknowledged increments.
async fn counter_load(
    env: &Env<'_>,
    ep: &Endpoint,
    names: Vec<String>,
    query: &str,
    out: &mut RunOutput,
) -> Result<u64> {
    counter_load_of(EXAMPLES.path(), env, ep, names, query, out).await
}

/// [`counter_load`] on the counters of the app at `app`.
pub(crate) async fn counter_load_of(
    app: &str,
    env: &Env<'_>,
    ep: &Endpoint,
    names: Vec<String>,
    query: &str,
    out: &mut RunOutput,
) -> Result<u64> {
    let a = env.args;
    // A baseline, so the check also holds on a server whose counters are
    // not at zero.
    let before: u64 = read_counters_of(app, ep, a.connections, &names)
        .await?
        .iter()
        .sum();
    let paths: Vec<String> = names
        .iter()
        .map(|n| format!("{app}/counter/{n}/increment{query}"))
        .collect();
    let spec = LoadSpec {
        connections: a.connections,
        warmup: Duration::from_secs_f64(a.warmup_s),
        measure: Duration::from_secs_f64(a.measure_s),
        method: Method::POST,
        paths: Arc::new(paths),
        seed: a.seed,
    };
    let r = load::closed_loop(ep, &spec).await?;
    out.fig("requests_per_s", r.requests_per_s());
    out.fig("p50_ms", r.quantile_ms(0.50));
    out.fig("p99_ms", r.quantile_ms(0.99));
    out.fig("max_ms", r.latency_us.max() as f64 / 1000.0);
    out.fig("requests_ok", r.ok_total as f64);
    out.fig("errors", r.errors_total as f64);
    out.check(
        "no_errors",
        r.errors_total == 0,
        if r.errors_total == 0 {
            "every request answered 2xx".to_string()
        } else {
            format!(
                "{} requests failed; first: {}",
                r.errors_total,
                r.error_samples.join(" | ")
            )
        },
    );
    let after: u64 = read_counters_of(app, ep, a.connections, &names)
        .await?
        .iter()
        .sum();
    let applied = after.saturating_sub(before);
    let lost = r.ok_total.saturating_sub(applied);
    out.fig("lost_writes", lost as f64);
    // An increment whose request failed in transport may or may not have
    // been applied: those (and only those) may appear as extra.
    let extra = applied.saturating_sub(r.ok_total);
    let ok = lost == 0 && extra <= r.errors_total;
    out.check(
        "no_lost_writes",
        ok,
        format!(
            "acknowledged {} increments; the counters grew by {applied} ({before} -> {after}); \
             lost {lost}, unacknowledged but applied {extra} (failed requests: {})",
            r.ok_total, r.errors_total
        ),
    );
    Ok(r.ok_total + r.errors_total)
}

/// W1 (`hot = false`) and W1-hot.
pub async fn w1(env: &Env<'_>, hot: bool) -> Result<RunOutput> {
    w1_of(EXAMPLES.path(), env, hot).await
}

/// W1-ts: W1 on the TypeScript counter.
pub async fn w1_ts(env: &Env<'_>) -> Result<RunOutput> {
    w1_of(EXAMPLES_TS, env, false).await
}

/// W1-traced: W1 on a node that traces every request
/// (`trace_sample_pct = 100`, ADR 0064): each increment records its
/// request, queue, guest, sql, commit and durable spans in the node's
/// ring. Compared with W1 in the same run, what tracing costs.
pub async fn w1_traced(env: &Env<'_>) -> Result<RunOutput> {
    let mut out = RunOutput::default();
    let Target::Own { dir, .. } = env.target else {
        bail!("W1-traced needs a node started by the benchmark");
    };
    let config = dir.join("traced.toml");
    std::fs::write(&config, "trace_sample_pct = 100\n")?;
    let node = env.start(Some(config)).await?.expect("own node");
    let ep = node.endpoint.clone();
    let names = (0..env.args.actors).map(|i| format!("a{i}")).collect();
    let r = async {
        let events = counter_load_of(EXAMPLES.path(), env, &ep, names, "", &mut out).await?;
        let r = client::send_all(
            &ep,
            1,
            vec![(Method::GET, "/admin/v1/traces?limit=1".to_string())],
        )
        .await?;
        let spans = match &r[0] {
            Ok((200, b)) => serde_json::from_slice::<serde_json::Value>(b)?["spans_recorded"]
                .as_u64()
                .unwrap_or(0),
            other => bail!("GET /admin/v1/traces: {}", client::describe(other)),
        };
        out.fig("spans_recorded", spans as f64);
        // At least a request, queue, guest, commit and durable span each.
        out.check(
            "every_request_traced",
            spans >= 5 * events,
            format!("{spans} spans recorded for {events} measured requests"),
        );
        Ok::<_, anyhow::Error>(())
    }
    .await;
    finish(Some(node), &mut out).await;
    r.map(|()| out)
}

/// W1-recording: W1 on the examples deployed again with `[recording]`
/// (ADR 0062), so that every increment also writes its record; compared
/// with W1 in the same run, what recording costs.
pub async fn w1_recording(env: &Env<'_>) -> Result<RunOutput> {
    let mut out = RunOutput::default();
    let node = env.start(None).await?;
    let ep = env.endpoint(&node);
    let r = async {
        let (app, wasm) = if EXAMPLES.path() == EXAMPLES_TS {
            ("demo/examples-ts", wasmkeep_guests::EXAMPLES_TS)
        } else {
            ("demo/examples", wasmkeep_guests::DEMO)
        };
        let mut admin = Conn::connect(&ep).await?;
        let a = admin
            .send_with_body(
                &Method::PUT,
                &format!("/admin/v1/apps/{app}?manifest=%5Brecording%5D%0A"),
                bytes::Bytes::from_static(wasm),
            )
            .await?;
        if a.status != 200 {
            bail!(
                "deploying {app} with [recording]: {} {}",
                a.status,
                String::from_utf8_lossy(&a.body)
            );
        }
        let names = (0..env.args.actors).map(|i| format!("a{i}")).collect();
        let events = counter_load_of(EXAMPLES.path(), env, &ep, names, "", &mut out).await?;
        let recorded = scrape(&ep)
            .await?
            .get("wasmkeep_events_recorded_total")
            .copied()
            .unwrap_or(0.0);
        out.fig("events_recorded", recorded);
        // The warm-up's requests are recorded too: at least one record
        // per measured request.
        out.check(
            "every_request_recorded",
            recorded >= events as f64,
            format!("{recorded} events recorded for {events} measured requests"),
        );
        Ok(())
    }
    .await;
    finish(node, &mut out).await;
    r.map(|()| out)
}

async fn w1_of(app: &str, env: &Env<'_>, hot: bool) -> Result<RunOutput> {
    let mut out = RunOutput::default();
    let node = env.start(None).await?;
    let ep = env.endpoint(&node);
    let names = if hot {
        vec![format!("{}hot", env.prefix(""))]
    } else {
        (0..env.args.actors).map(|i| format!("a{i}")).collect()
    };
    let r = counter_load_of(app, env, &ep, names, "", &mut out).await;
    finish(node, &mut out).await;
    r.map(|_| out)
}

/// The node's counters from `/metrics` (name -> value).
pub(crate) async fn scrape(ep: &Endpoint) -> Result<std::collections::HashMap<String, f64>> {
    let r = client::send_all(ep, 1, vec![(Method::GET, "/metrics".to_string())]).await?;
    let body = match &r[0] {
        Ok((200, b)) => String::from_utf8_lossy(b).into_owned(),
        other => bail!("GET /metrics: {}", client::describe(other)),
    };
    Ok(body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect())
}

/// The bucket of a node a durable workload starts: `--bucket`, or a folder
/// in the run's directory; none for a `--server` node (it has its own).
pub(crate) fn bucket_of(env: &Env<'_>) -> Result<Option<String>> {
    Ok(match (&env.args.bucket, env.target) {
        (Some(b), _) => Some(b.clone()),
        (None, Target::Own { dir, .. }) => {
            let d = dir.join("bucket");
            std::fs::create_dir_all(&d)?;
            Some(format!("file://{}", d.display()))
        }
        (None, Target::Server(_)) => None,
    })
}

/// W1-durable: W1 where every increment asks for `replicated` durability,
/// on a node with a bucket; adds what the bucket was asked per request.
pub async fn w1_durable(env: &Env<'_>) -> Result<RunOutput> {
    let mut out = RunOutput::default();
    let node = env.start_on(None, bucket_of(env)?).await?;
    let ep = env.endpoint(&node);
    let names: Vec<String> = (0..env.args.actors)
        .map(|i| format!("{}d{i}", env.prefix("")))
        .collect();
    // Create the actors first (each one's first entry is a PUT of its own)
    // and let their uploads finish, so the per-request figures count the
    // load's requests only.
    read_counters(&ep, env.args.connections, &names).await?;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let before = scrape(&ep).await?;
    let r = counter_load(env, &ep, names, "?wasmkeep-durability=replicated", &mut out).await;
    let after = scrape(&ep).await;
    if let (Ok(sent), Ok(after)) = (&r, &after) {
        let d =
            |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
        let per = |k: &str| d(k) / (*sent).max(1) as f64;
        let puts = d("wasmkeep_bucket_puts_total");
        out.fig("puts_per_request", per("wasmkeep_bucket_puts_total"));
        out.fig("gets_per_request", per("wasmkeep_bucket_gets_total"));
        out.fig("lists_per_request", per("wasmkeep_bucket_lists_total"));
        out.fig(
            "put_kib_per_request",
            per("wasmkeep_bucket_put_bytes_total") / 1024.0,
        );
        let uploads = d("wasmkeep_replica_uploads_total");
        out.fig("requests_per_upload", *sent as f64 / uploads.max(1.0));
        let timed = d("wasmkeep_replica_upload_seconds_count");
        if timed > 0.0 {
            out.fig(
                "upload_mean_ms",
                d("wasmkeep_replica_upload_seconds_sum") / timed * 1000.0,
            );
        }
        let given_up = d("wasmkeep_replica_given_up_total");
        out.check(
            "no_actor_given_up",
            given_up == 0.0,
            format!("{given_up} actors given up; {puts} PUTs for {sent} requests"),
        );
    }
    finish(node, &mut out).await;
    r.map(|_| out)
}

/// W2: sets `--alarms` alarms due at `due`, one actor each (the set
/// requests also create the actors, as the workload says); records how long
/// that took, and checks every alarm was set, and set before its due time.
async fn set_alarms(
    env: &Env<'_>,
    ep: &Endpoint,
    prefix: &str,
    due: u64,
    out: &mut RunOutput,
) -> Result<f64> {
    let a = env.args;
    let t_set = crate::clock::now();
    let reqs = (0..a.alarms)
        .map(|i| {
            (
                Method::POST,
                format!("{EXAMPLES}/reminder/{prefix}{i}/set?at_ms={due}"),
            )
        })
        .collect();
    let rs = client::send_all(ep, a.connections, reqs).await?;
    let set_s = t_set.elapsed().as_secs_f64();
    out.fig("set_s", set_s);
    let bad: Vec<String> = rs
        .iter()
        .enumerate()
        .filter(|(_, r)| json_of(r).and_then(|v| v["alarm"].as_u64()) != Some(due))
        .take(5)
        .map(|(i, r)| format!("{prefix}{i}: {}", client::describe(r)))
        .collect();
    out.check(
        "alarms_set",
        bad.is_empty(),
        if bad.is_empty() {
            format!("{} alarms set for {due} in {set_s:.2} s", a.alarms)
        } else {
            format!("some alarms were not set: {}", bad.join(" | "))
        },
    );
    let set_done = now_ms();
    out.check(
        "set_before_due",
        set_done < due,
        format!(
            "the last alarm was set {} ms before its due time{}",
            due as i64 - set_done as i64,
            if set_done < due {
                ""
            } else {
                "; lateness would measure set-up time: give more --alarm-lead-s"
            }
        ),
    );
    Ok(set_s)
}

/// W2-restart: SIGKILLs the node [`ALARM_KILL_BEFORE_MS`] before `due` and
/// starts it again [`ALARM_RESTART_AFTER_MS`] after; `node` and `ep` are
/// then the restarted node's.
async fn kill_and_restart(
    env: &Env<'_>,
    node: &mut Option<Node>,
    ep: &mut Endpoint,
    due: u64,
    set_s: f64,
    out: &mut RunOutput,
) -> Result<()> {
    let kill_at = due.saturating_sub(ALARM_KILL_BEFORE_MS);
    if now_ms() >= kill_at {
        out.check(
            "set_before_kill",
            false,
            format!(
                "setting the alarms took {set_s:.2} s, past the kill time (due − {ALARM_KILL_BEFORE_MS} ms)"
            ),
        );
    }
    sleep_until_ms(kill_at).await;
    let n = node.as_mut().expect("W2-restart runs on its own node");
    n.kill().await?;
    sleep_until_ms(due + ALARM_RESTART_AFTER_MS).await;
    let spec = env.spec(None)?.expect("own node");
    let n = Node::start(&spec).await.context("restart the node")?;
    out.fig("restart_ms", n.start_ms);
    *ep = n.endpoint.clone();
    *node = Some(n);
    Ok(())
}

/// W2: waits, reading only the node's metrics, until it has fired
/// `alarms` alarms since `fired_before`, at most until
/// [`ALARM_WAIT_MS_MAX`] after `due`, or [`ALARM_METRICS_STALL_MS`]
/// without one more (the timer's pending count will not do: it drops when
/// an alarm is handed to its actor, before it runs). Each actor records
/// when its alarm ran, so lateness needs no earlier look at the actors;
/// reading every actor that has not fired yet while thousands fire
/// (`--alarms 20000`) would open those actors for the benchmark's own reads
/// and compete with the alarms it measures. The actors are read after
/// ([`poll_until_fired`]), whatever this found: a metric that cannot be
/// read ends the wait early, never the check.
async fn wait_for_the_node_to_fire(ep: &Endpoint, fired_before: f64, alarms: usize, due: u64) {
    let (mut last, mut rose_at) = (f64::NAN, now_ms());
    while now_ms() < due + ALARM_WAIT_MS_MAX {
        let Ok(m) = scrape(ep).await else { return };
        let fired = metric_sum(&m, "wasmkeep_alarms_fired_total") - fired_before;
        if fired >= alarms as f64 {
            return;
        }
        if fired != last {
            (last, rose_at) = (fired, now_ms());
        } else if now_ms() - rose_at > ALARM_METRICS_STALL_MS {
            return;
        }
        tokio::time::sleep(Duration::from_millis(ALARM_METRICS_INTERVAL_MS)).await;
    }
}

/// The sum of a metric's series (every label set) in a [`scrape`].
fn metric_sum(m: &std::collections::HashMap<String, f64>, name: &str) -> f64 {
    m.iter()
        .filter(|(k, _)| k.split('{').next() == Some(name))
        .map(|(_, v)| v)
        .sum()
}

/// W2: where actor `i`'s fired records are read.
fn fired_path(prefix: &str, i: usize) -> String {
    format!("{EXAMPLES}/reminder/{prefix}{i}/fired")
}

/// W2: polls the actors that have not fired yet, until all have or
/// [`ALARM_WAIT_MS_MAX`] after `due` has passed; the first few errors.
async fn poll_until_fired(
    env: &Env<'_>,
    ep: &Endpoint,
    prefix: &str,
    due: u64,
) -> Result<Vec<String>> {
    let a = env.args;
    let mut pending: Vec<usize> = (0..a.alarms).collect();
    let mut poll_errors = Vec::new();
    while !pending.is_empty() && now_ms() < due + ALARM_WAIT_MS_MAX {
        let reqs = pending
            .iter()
            .map(|&i| (Method::GET, fired_path(prefix, i)))
            .collect();
        let rs = client::send_all(ep, a.connections, reqs).await?;
        let mut still = Vec::new();
        for (&i, r) in pending.iter().zip(&rs) {
            let fired = json_of(r).is_some_and(|v| {
                v["fired"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|e| e["due_ms"].as_u64() == Some(due)))
            });
            if !fired {
                if r.as_ref().map(|(s, _)| *s != 200).unwrap_or(true) && poll_errors.len() < 5 {
                    poll_errors.push(format!("{prefix}{i}: {}", client::describe(r)));
                }
                still.push(i);
            }
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(ALARM_POLL_INTERVAL_MS)).await;
        }
    }
    Ok(poll_errors)
}

/// W2: what the last read of every actor's fired records found.
#[derive(Default)]
struct Fired {
    /// Each fired alarm's lateness (ms after `due`; negative if early).
    lateness: Vec<i64>,
    /// Runs of an alarm beyond its first.
    duplicates: u64,
    /// The alarms that fired before they were due.
    early: Vec<String>,
    /// Alarms whose first run was a retry.
    retried: u64,
    /// Actors whose records could not be read.
    unreadable: Vec<String>,
    /// When the last alarm fired.
    last_fired: u64,
}

/// W2: one last read of every actor: the figures, and duplicates that a
/// "has it fired yet" poll would not see.
async fn read_fired(env: &Env<'_>, ep: &Endpoint, prefix: &str, due: u64) -> Result<Fired> {
    let a = env.args;
    let reqs = (0..a.alarms)
        .map(|i| (Method::GET, fired_path(prefix, i)))
        .collect();
    let rs = client::send_all(ep, a.connections, reqs).await?;
    let mut f = Fired::default();
    for (i, r) in rs.iter().enumerate() {
        let Some(v) = json_of(r) else {
            f.unreadable
                .push(format!("{prefix}{i}: {}", client::describe(r)));
            continue;
        };
        let recs: Vec<&serde_json::Value> = v["fired"]
            .as_array()
            .map(|f| {
                f.iter()
                    .filter(|e| e["due_ms"].as_u64() == Some(due))
                    .collect()
            })
            .unwrap_or_default();
        let Some(first) = recs.first() else { continue };
        f.duplicates += recs.len().saturating_sub(1) as u64;
        let fired_ms = first["fired_ms"].as_u64().unwrap_or(0);
        if fired_ms < due {
            f.early
                .push(format!("{prefix}{i} fired at {fired_ms}, due {due}"));
        }
        if first["retry_count"].as_u64().unwrap_or(0) > 0 {
            f.retried += 1;
        }
        f.last_fired = f.last_fired.max(fired_ms);
        f.lateness.push(fired_ms as i64 - due as i64);
    }
    f.lateness.sort_unstable();
    Ok(f)
}

/// W2: the lateness figures and the counts of what fired.
fn fired_figures(out: &mut RunOutput, alarms: usize, due: u64, f: &Fired) {
    let fired = f.lateness.len();
    let q = |q| {
        quantile(&f.lateness, q)
            .map(|v| v as f64)
            .unwrap_or(f64::NAN)
    };
    out.fig("lateness_min_ms", q(0.0));
    out.fig("lateness_p50_ms", q(0.50));
    out.fig("lateness_p99_ms", q(0.99));
    out.fig("lateness_max_ms", q(1.0));
    out.fig(
        "all_fired_after_ms",
        if fired == alarms {
            f.last_fired.saturating_sub(due) as f64
        } else {
            f64::NAN
        },
    );
    out.fig("fired", fired as f64);
    out.fig("lost", (alarms - fired) as f64);
    out.fig("duplicates", f.duplicates as f64);
    out.fig("retried", f.retried as f64);
}

/// W2's checks: every alarm fired, once, and none before it was due.
fn fired_checks(out: &mut RunOutput, alarms: usize, f: &Fired, poll_errors: &[String]) {
    let fired = f.lateness.len();
    out.check(
        "all_fired",
        fired == alarms,
        format!(
            "{fired} of {alarms} alarms fired within {ALARM_WAIT_MS_MAX} ms of the due time{}{}",
            if f.unreadable.is_empty() {
                String::new()
            } else {
                format!(
                    "; unreadable: {}",
                    f.unreadable[..f.unreadable.len().min(5)].join(" | ")
                )
            },
            if poll_errors.is_empty() {
                String::new()
            } else {
                format!("; poll errors: {}", poll_errors.join(" | "))
            }
        ),
    );
    out.check(
        "fired_once",
        f.duplicates == 0,
        format!(
            "{} extra runs of an alarm that had already fired",
            f.duplicates
        ),
    );
    out.check(
        "never_early",
        f.early.is_empty(),
        if f.early.is_empty() {
            "no alarm fired before it was due".to_string()
        } else {
            f.early[..f.early.len().min(5)].join(" | ")
        },
    );
}

/// W2 (`restart = false`) and W2-restart.
pub async fn w2(env: &Env<'_>, restart: bool) -> Result<RunOutput> {
    let mut out = RunOutput::default();
    let a = env.args;
    let mut node = env.start(None).await?;
    let mut ep = env.endpoint(&node);
    let prefix = env.prefix("r");
    // If setting takes longer than the lead time, the alarms set after
    // their due time fire at once and "lateness" would measure the set-up:
    // the run then fails `set_before_due` and `--alarm-lead-s` can give the
    // node more time.
    let due = now_ms() + (a.alarm_lead_s * 1000.0) as u64;
    let set_s = set_alarms(env, &ep, &prefix, due, &mut out).await?;
    if restart {
        kill_and_restart(env, &mut node, &mut ep, due, set_s, &mut out).await?;
    }
    // A restarted node counts from zero, and may have fired some already.
    let fired_before = if restart {
        0.0
    } else {
        scrape(&ep)
            .await
            .map(|m| metric_sum(&m, "wasmkeep_alarms_fired_total"))
            .unwrap_or(0.0)
    };
    sleep_until_ms(due + ALARM_FIRST_POLL_AFTER_MS).await;
    wait_for_the_node_to_fire(&ep, fired_before, a.alarms, due).await;
    let poll_errors = poll_until_fired(env, &ep, &prefix, due).await?;
    let fired = read_fired(env, &ep, &prefix, due).await?;
    fired_figures(&mut out, a.alarms, due, &fired);
    fired_checks(&mut out, a.alarms, &fired, &poll_errors);
    finish(node, &mut out).await;
    Ok(out)
}

/// W3: the first request to never-seen actors, one after another.
pub async fn w3(env: &Env<'_>) -> Result<RunOutput> {
    w3_of(EXAMPLES.path(), env).await
}

/// W3-ts: W3 on the TypeScript counter.
pub async fn w3_ts(env: &Env<'_>) -> Result<RunOutput> {
    w3_of(EXAMPLES_TS, env).await
}

async fn w3_of(app: &str, env: &Env<'_>) -> Result<RunOutput> {
    let mut out = RunOutput::default();
    let node = env.start(None).await?;
    let ep = env.endpoint(&node);
    let prefix = env.prefix("cold");
    let mut conn = Conn::connect(&ep).await?;
    // Warm the connection and the class (its component is instantiated
    // once), so each measured request costs only a new actor.
    let warm = conn
        .send(
            &Method::POST,
            &format!("{app}/counter/{prefix}warm/increment"),
        )
        .await?;
    anyhow::ensure!(
        warm.0 == 200,
        "warm-up request: {}",
        client::describe(&Ok(warm))
    );
    let mut ms = Vec::with_capacity(env.args.cold_actors);
    let mut bad = Vec::new();
    for i in 0..env.args.cold_actors {
        let path = format!("{app}/counter/{prefix}{i}/increment");
        let t0 = crate::clock::now();
        let r = conn.send(&Method::POST, &path).await;
        ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        if json_of(&r).and_then(|v| v["value"].as_u64()) != Some(1) && bad.len() < 5 {
            bad.push(format!("{prefix}{i}: {}", client::describe(&r)));
        }
    }
    ms.sort_by(f64::total_cmp);
    out.fig("p50_ms", quantile(&ms, 0.50).unwrap_or(f64::NAN));
    out.fig("p99_ms", quantile(&ms, 0.99).unwrap_or(f64::NAN));
    out.fig("max_ms", quantile(&ms, 1.0).unwrap_or(f64::NAN));
    out.check(
        "first_requests_ok",
        bad.is_empty(),
        if bad.is_empty() {
            format!("{} new actors each answered {{\"value\":1}}", ms.len())
        } else {
            bad.join(" | ")
        },
    );
    finish(node, &mut out).await;
    Ok(out)
}

/// Waits until the node has no live instance (every actor closed).
async fn wait_all_idle(ep: &Endpoint, limit_ms: u64) -> Result<bool> {
    let deadline = crate::clock::now() + Duration::from_millis(limit_ms);
    let mut conn = Conn::connect(ep).await?;
    loop {
        let (s, body) = conn.send(&Method::GET, "/metrics").await?;
        anyhow::ensure!(s == 200, "GET /metrics answered {s}");
        let text = String::from_utf8_lossy(&body);
        let active = text
            .lines()
            .find_map(|l| l.strip_prefix("wasmkeep_instances_active "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| anyhow!("no wasmkeep_instances_active in /metrics"))?;
        if active == 0 {
            return Ok(true);
        }
        if crate::clock::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

const MIB: f64 = 1024.0;

/// W4: RSS after W1, and the cost of actors that were touched and went idle.
pub async fn w4(env: &Env<'_>) -> Result<RunOutput> {
    let mut out = RunOutput::default();
    let a = env.args;
    let Target::Own { dir, .. } = env.target else {
        return Err(anyhow!("W4 needs a node started by the benchmark"));
    };
    let config = dir.join("node.toml");
    std::fs::write(&config, format!("actor_idle_ms = {W4_ACTOR_IDLE_MS}\n"))?;
    let node = env.start(Some(config)).await?.expect("own node");
    let ep = node.endpoint.clone();
    let mut w1 = RunOutput::default();
    let names = (0..a.actors).map(|i| format!("a{i}")).collect();
    let r = async {
        counter_load(env, &ep, names, "", &mut w1).await?;
        let after_w1 = node.rss_kib()? as f64;
        out.fig("rss_after_w1_mib", after_w1 / MIB);
        out.fig("pss_after_w1_mib", node.pss_kib()? as f64 / MIB);
        let idle_limit = W4_ACTOR_IDLE_MS + W4_IDLE_WAIT_MS_MAX;
        let idle1 = wait_all_idle(&ep, idle_limit).await?;
        tokio::time::sleep(Duration::from_millis(W4_SETTLE_MS)).await;
        let before = node.rss_kib()? as f64;
        out.fig("rss_w1_idle_mib", before / MIB);
        let t = crate::clock::now();
        let reqs = (0..a.idle_actors)
            .map(|i| (Method::POST, format!("{EXAMPLES}/counter/idle{i}/increment")))
            .collect();
        let rs = client::send_all(&ep, a.connections, reqs).await?;
        out.fig("touch_s", t.elapsed().as_secs_f64());
        let bad: Vec<String> = rs
            .iter()
            .enumerate()
            .filter(|(_, r)| json_of(r).and_then(|v| v["value"].as_u64()) != Some(1))
            .take(5)
            .map(|(i, r)| format!("idle{i}: {}", client::describe(r)))
            .collect();
        out.check(
            "touches_ok",
            bad.is_empty(),
            if bad.is_empty() {
                format!("{} new actors each answered {{\"value\":1}}", a.idle_actors)
            } else {
                bad.join(" | ")
            },
        );
        let idle2 = wait_all_idle(&ep, idle_limit).await?;
        out.check(
            "actors_went_idle",
            idle1 && idle2,
            format!(
                "wasmkeep_instances_active reached 0 within {idle_limit} ms: after W1 {idle1}, after the touches {idle2}"
            ),
        );
        tokio::time::sleep(Duration::from_millis(W4_SETTLE_MS)).await;
        let after = node.rss_kib()? as f64;
        out.fig("rss_after_idle_mib", after / MIB);
        out.fig("kib_per_idle_actor", (after - before) / a.idle_actors as f64);
        out.fig("peak_rss_mib", node.peak_rss_kib()? as f64 / MIB);
        anyhow::Ok(())
    }
    .await;
    // W1's correctness checks hold here too; its figures belong to W1.
    for c in w1.checks {
        out.checks.push(Check {
            name: format!("w1_{}", c.name),
            ..c
        });
    }
    finish(Some(node), &mut out).await;
    r.map(|()| out)
}

/// Actors W4-open opens in each language.
const OPEN_ACTORS: usize = 1_000;
/// W4-open's idle time: longer than the run, so every actor stays open.
const OPEN_ACTOR_IDLE_MS: u64 = 600_000;
/// W4-open's wait before it reads the RSS its actors added: an open actor
/// that committed once gives back its log index's zero pages once it was
/// idle for a second, at the reaper's next pass (ADR 0078); the figure is
/// what an open actor holds, not what it held in its first second.
const OPEN_ACTOR_SETTLE_MS: u64 = 2_500;

/// W4-open: resident memory per open actor, Rust and TypeScript side by
/// side on one node: 1,000 new counters of each app are touched once and
/// kept open; the figure is the RSS they added, per actor, beyond what
/// the app's first actor (its shared image) cost.
pub async fn w4_open(env: &Env<'_>) -> Result<RunOutput> {
    let mut out = RunOutput::default();
    let Target::Own { dir, .. } = env.target else {
        return Err(anyhow!("W4-open needs a node started by the benchmark"));
    };
    let config = dir.join("node.toml");
    std::fs::write(&config, format!("actor_idle_ms = {OPEN_ACTOR_IDLE_MS}\n"))?;
    let node = env.start(Some(config)).await?.expect("own node");
    let ep = node.endpoint.clone();
    let r = async {
        for (lang, app) in [("rust", EXAMPLES_RUST), ("ts", EXAMPLES_TS)] {
            // The app's first actor: its instance image, shared by the rest.
            let first = client::send_all(&ep, 1, vec![(Method::POST, format!("{app}/counter/open-first/increment"))]).await?;
            anyhow::ensure!(json_of(&first[0]).is_some(), "{lang}: first actor: {}", client::describe(&first[0]));
            tokio::time::sleep(Duration::from_millis(W4_SETTLE_MS)).await;
            let before = node.rss_kib()? as f64;
            let reqs = (0..OPEN_ACTORS)
                .map(|i| (Method::POST, format!("{app}/counter/open{i}/increment")))
                .collect();
            let rs = client::send_all(&ep, env.args.connections, reqs).await?;
            let bad = rs.iter().filter(|r| json_of(r).and_then(|v| v["value"].as_u64()) != Some(1)).count();
            tokio::time::sleep(Duration::from_millis(OPEN_ACTOR_SETTLE_MS)).await;
            let after = node.rss_kib()? as f64;
            let active = scrape(&ep).await?.get("wasmkeep_instances_active").copied().unwrap_or(0.0);
            out.fig(&format!("{lang}_kib_per_open_actor"), (after - before) / OPEN_ACTORS as f64);
            out.fig(&format!("{lang}_rss_after_mib"), after / MIB);
            out.check(
                &format!("{lang}_actors_open"),
                bad == 0,
                format!("{OPEN_ACTORS} new {lang} counters answered {{\"value\":1}} but {bad}; {active} instances active after"),
            );
        }
        anyhow::Ok(())
    }
    .await;
    finish(Some(node), &mut out).await;
    r.map(|()| out)
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<u32> = (1..=200).collect();
        assert_eq!(quantile(&v, 0.5), Some(100));
        assert_eq!(quantile(&v, 0.99), Some(198));
        assert_eq!(quantile(&v, 1.0), Some(200));
        assert_eq!(quantile(&v, 0.0), Some(1));
        assert_eq!(quantile::<u32>(&[], 0.5), None);
    }
}
