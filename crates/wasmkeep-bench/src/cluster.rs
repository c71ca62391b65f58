//! The cluster workloads of `docs/benchmarks.md`'s second wave, on three
//! nodes the benchmark starts (the same binary, as README "Running a
//! cluster" does: `serve --data DIR --listen 127.0.0.1:PORT --bucket
//! file:///BUCKET --advertise http://127.0.0.1:PORT --examples`), each with
//! its own data directory and log, sharing a folder bucket in the run's
//! directory:
//!
//! - **W6, forwarded** ([`w6`]): W1's counters, touched one by one through
//!   node `i % 3` so that each node takes a third of them (the answer's
//!   `x-wasmkeep-node` says which node did), then W1's closed loop in two
//!   phases that take turns in one-second slices of the same run: every
//!   request sent to its actor's owner, and every request sent to the node
//!   after the owner (which forwards it). The increments name their
//!   durability (`--w6-durability`, default `local` as W1's; a cluster
//!   node's own default is `replicated`). Reported: both phases'
//!   requests/s and p50/p99, and forwarded / owner ratios; checked: no lost
//!   write, no failed request, and every answer ran on the owner expected
//!   (an answer from another node means ownership moved).
//! - **W5-kill, takeover** ([`w5_kill`]): `replicated` increments through
//!   all three nodes to counters spread over them; SIGKILL of the node that
//!   owns the most; the load goes on through the two others, which ask for
//!   each of the dead node's actors in turn (again after
//!   [`PROBE_RETRY_MS`] while it fails) until it answers from another node.
//!   Reported: the time from the kill to each such actor's first answer
//!   (p50/p99/max) beside lease + grace + 1 s; checked: every acknowledged
//!   value is at most the counter's final value (none lost), no value
//!   acknowledged twice (a split brain would), every such actor answered.
//!
//! Lease timings come from `--lease-period-ms` and `--lease-grace-ms`
//! (the node's defaults unless given), written with the timings derived
//! from them into a configuration file every node of the run reads.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use hdrhistogram::Histogram;
use hyper::Method;

use wasmkeep_cluster::ClusterConfig;
use wasmkeep_cluster::config::BUCKET_TIMEOUT_MS;

use crate::BenchArgs;
use crate::client::{self, Answer, Conn, Endpoint};
use crate::load::{self, PhasedSpec, SplitMix, Targets, User};
use crate::node::{Node, NodeSpec, free_port, log_tail};
use crate::workloads::{
    EXAMPLES, Env, RunOutput, Target, now_ms, quantile, read_counters, scrape, sleep_until_ms,
};

/// Nodes of a cluster run (the workloads say three).
pub const CLUSTER_NODES: usize = 3;
/// Tries at starting a node on a port found free (another process may
/// take it between the look and the node's bind).
const START_ATTEMPTS: usize = 3;
/// Longest wait for a node to act and to see every other node.
const CLUSTER_READY_MS_MAX: u64 = 60_000;
const POLL_MS: u64 = 50;
/// W6: the two phases take turns in slices of about this long.
const SLICE_S: f64 = 1.0;
/// W5-kill: after a dead node's actor failed, how long before it is asked
/// again (the resolution of the takeover times).
pub const PROBE_RETRY_MS: u64 = 200;
/// W5-kill: a virtual user's pause after any other failed request.
const ERROR_PAUSE_MS: u64 = 20;
/// W5-kill: how long past lease + grace the dead node's actors may take to
/// answer before the run fails `all_answered_again`.
const TAKEOVER_WAIT_EXTRA_MS: u64 = 60_000;
/// W5-kill: the load goes on this long after the last of them answered.
const AFTER_TAKEOVER_MS: u64 = 1_000;
/// The bar: another node answers within lease + grace + this.
const BAR_EXTRA_MS: u64 = 1_000;
/// Failure descriptions kept per run.
const SAMPLES_MAX: usize = 8;
const REPLICATED: &str = "?wasmkeep-durability=replicated";

/// The node's defaults (`lease_period_ms`, `lease_grace_ms`).
pub const DEFAULT_LEASE_PERIOD_MS: u64 = 10_000;
pub const DEFAULT_LEASE_GRACE_MS: u64 = 5_000;

/// The lease timings of a cluster run.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    pub lease_period_ms: u64,
    pub lease_grace_ms: u64,
}

impl Timings {
    pub fn of(args: &BenchArgs) -> Timings {
        Timings {
            lease_period_ms: args.lease_period_ms,
            lease_grace_ms: args.lease_grace_ms,
        }
    }

    /// The bar for a takeover: lease + grace + 1 s.
    pub fn bar_ms(&self) -> u64 {
        self.lease_period_ms + self.lease_grace_ms + BAR_EXTRA_MS
    }

    /// The nodes' configuration: these timings and those that must follow
    /// a short lease (at the defaults they are the node's defaults), then
    /// `--node-config`'s settings (`base`), which may set the derived ones
    /// but not the lease itself.
    pub fn config_text(&self, base: &str) -> Result<String> {
        for key in ["lease_period_ms", "lease_grace_ms"] {
            if sets_key(base, key) {
                bail!(
                    "--node-config sets {key}: give the cluster workloads' lease timings \
                     with --lease-period-ms and --lease-grace-ms, so that the report has them"
                );
            }
        }
        let p = self.lease_period_ms;
        let mut text = format!(
            "lease_period_ms = {p}\nlease_grace_ms = {}\n",
            self.lease_grace_ms
        );
        // A node stops acting this long before its lease ends (less than
        // two thirds of the period), retries registering, and gives up on
        // a bucket request within a renewal interval or so: scaled to a
        // short period, never above the node's defaults.
        let defaults = ClusterConfig::default();
        let derived = [
            ("owner_margin_ms", (p / 5).min(defaults.owner_margin_ms)),
            (
                "lease_register_retry_ms",
                (p / 5).clamp(1, defaults.lease_register_retry_ms),
            ),
            (
                "cluster_bucket_timeout_ms",
                (p * 2 / 3).clamp(1, BUCKET_TIMEOUT_MS),
            ),
        ];
        for (key, v) in derived {
            if !sets_key(base, key) {
                text.push_str(&format!("{key} = {v}\n"));
            }
        }
        // Top-level keys first: `base` may end inside a table.
        text.push_str(base);
        Ok(text)
    }
}

/// Whether a configuration text sets `key` (a `key = …` line).
fn sets_key(text: &str, key: &str) -> bool {
    text.lines().any(|l| {
        l.trim_start()
            .strip_prefix(key)
            .is_some_and(|rest| rest.trim_start().starts_with('='))
    })
}

/// A node of the run's cluster; `node` is None once it was killed.
struct Member {
    node: Option<Node>,
    id: String,
    endpoint: Endpoint,
}

/// Three nodes on one folder bucket, each acting and seeing the others.
struct Cluster {
    members: Vec<Member>,
}

impl Cluster {
    async fn start(env: &Env<'_>, timings: &Timings) -> Result<Cluster> {
        let Target::Own {
            exe,
            durability,
            compile_cache,
            dir,
        } = env.target
        else {
            bail!("a cluster workload needs nodes the benchmark starts");
        };
        let bucket = dir.join("bucket");
        std::fs::create_dir_all(&bucket)?;
        let base = match &env.args.node_config {
            Some(p) => std::fs::read_to_string(p)
                .with_context(|| format!("--node-config {}", p.display()))?,
            None => String::new(),
        };
        let config = dir.join("cluster.toml");
        std::fs::write(&config, timings.config_text(&base)?)?;
        let mut members = Vec::with_capacity(CLUSTER_NODES);
        for k in 0..CLUSTER_NODES {
            let mut spec = NodeSpec {
                exe: exe.clone(),
                data: dir.join(format!("node{k}")),
                durability,
                config: Some(config.clone()),
                compile_cache: compile_cache.clone(),
                log: dir.join(format!("node{k}.log")),
                bucket: Some(format!("file://{}", bucket.display())),
                cluster_port: None,
                examples: true,
            };
            let node = start_on_a_free_port(&mut spec)
                .await
                .with_context(|| format!("start cluster node {k}"))?;
            members.push(Member {
                endpoint: node.endpoint.clone(),
                node: Some(node),
                id: String::new(),
            });
        }
        for (k, m) in members.iter_mut().enumerate() {
            m.id = wait_acting(&m.endpoint)
                .await
                .with_context(|| format!("cluster node {k} (log: {})", log_of(m)))?;
        }
        for (k, m) in members.iter().enumerate() {
            wait_sees(&m.endpoint, CLUSTER_NODES)
                .await
                .with_context(|| format!("cluster node {k} (log: {})", log_of(m)))?;
        }
        Ok(Cluster { members })
    }

    fn index_of(&self, id: Option<&str>) -> Option<usize> {
        let id = id?;
        self.members.iter().position(|m| m.id == id)
    }

    /// Stops every node still running (SIGTERM, all at once: each hands
    /// its actors over), and records how long the slowest took and whether
    /// all exited cleanly.
    async fn stop(self, out: &mut RunOutput) {
        let mut tasks = Vec::new();
        for (k, m) in self.members.into_iter().enumerate() {
            if let Some(mut node) = m.node {
                tasks.push((
                    k,
                    tokio::spawn(async move {
                        let r = node.stop().await;
                        (r, node.log.clone())
                    }),
                ));
            }
        }
        if tasks.is_empty() {
            return;
        }
        let (mut slowest, mut bad) = (0.0f64, Vec::new());
        let stopped = tasks.len();
        for (k, t) in tasks {
            match t.await {
                Ok((Ok(ms), _)) => slowest = slowest.max(ms),
                Ok((Err(e), log)) => bad.push(format!("node{k}: {e:#}\n{}", log_tail(&log, 20))),
                Err(e) => bad.push(format!("node{k}: {e}")),
            }
        }
        out.fig("shutdown_ms", slowest);
        out.check(
            "clean_shutdown",
            bad.is_empty(),
            if bad.is_empty() {
                format!("{stopped} nodes exited 0 after SIGTERM")
            } else {
                bad.join("\n")
            },
        );
    }
}

fn log_of(m: &Member) -> String {
    m.node
        .as_ref()
        .map(|n| n.log.display().to_string())
        .unwrap_or_default()
}

/// Starts a node listening on (and advertising) a port found free, with
/// another port if that one was taken meanwhile.
async fn start_on_a_free_port(spec: &mut NodeSpec) -> Result<Node> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        spec.cluster_port = Some(free_port()?);
        match Node::start(spec).await {
            Ok(n) => return Ok(n),
            Err(e) if attempt < START_ATTEMPTS => {
                eprintln!("  a node did not start ({e:#}); again on another port");
            }
            Err(e) => return Err(e),
        }
    }
}

async fn get_json(ep: &Endpoint, path: &str) -> Result<serde_json::Value> {
    let mut conn = Conn::connect(ep).await?;
    let (s, body) = conn.send(&Method::GET, path).await?;
    ensure!(
        s == 200,
        "GET {path}: {s} {}",
        String::from_utf8_lossy(&body[..body.len().min(300)])
    );
    serde_json::from_slice(&body).with_context(|| format!("GET {path}: not JSON"))
}

/// Polls `GET /admin/v1/node` until the node acts; returns its id.
async fn wait_acting(ep: &Endpoint) -> Result<String> {
    let deadline = crate::clock::now() + Duration::from_millis(CLUSTER_READY_MS_MAX);
    loop {
        let last = match get_json(ep, "/admin/v1/node").await {
            Ok(v) if v["cluster"]["serving"] == true => {
                return v["cluster"]["node"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| anyhow!("/admin/v1/node names no node: {v}"));
            }
            Ok(v) => format!("not acting yet: {v}"),
            Err(e) => format!("{e:#}"),
        };
        if crate::clock::now() >= deadline {
            bail!("the node did not act within {CLUSTER_READY_MS_MAX} ms: {last}");
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// Polls `GET /admin/v1/cluster` until it lists `n` live nodes.
async fn wait_sees(ep: &Endpoint, n: usize) -> Result<()> {
    let deadline = crate::clock::now() + Duration::from_millis(CLUSTER_READY_MS_MAX);
    loop {
        let last = match get_json(ep, "/admin/v1/cluster").await {
            Ok(v) if v["nodes"].as_array().is_some_and(|a| a.len() >= n) => return Ok(()),
            Ok(v) => format!("{v}"),
            Err(e) => format!("{e:#}"),
        };
        if crate::clock::now() >= deadline {
            bail!("the node did not list {n} live nodes within {CLUSTER_READY_MS_MAX} ms: {last}");
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// Sends `paths[i]` through node `i % 3`, each node's share over its own
/// connections: a request for an actor no live node holds makes the node
/// that receives it take it. Every answer must be 2xx.
async fn spread(
    c: &Cluster,
    connections: usize,
    paths: &[String],
    method: &Method,
) -> Result<Vec<Answer>> {
    let n = c.members.len();
    let mut answers: Vec<Option<Answer>> = vec![None; paths.len()];
    for (k, m) in c.members.iter().enumerate() {
        let idx: Vec<usize> = (k..paths.len()).step_by(n).collect();
        let reqs = idx
            .iter()
            .map(|&i| (method.clone(), paths[i].clone()))
            .collect();
        let rs = client::send_all_full(&m.endpoint, (connections / n).max(1), reqs).await?;
        for (&i, r) in idx.iter().zip(rs) {
            let a = r.with_context(|| format!("{method} {} through node {k}", paths[i]))?;
            ensure!(
                (200..300).contains(&a.status),
                "{method} {} through node {k}: {} {}",
                paths[i],
                a.status,
                String::from_utf8_lossy(&a.body[..a.body.len().min(300)])
            );
            answers[i] = Some(a);
        }
    }
    Ok(answers
        .into_iter()
        .map(|a| a.expect("every path was sent"))
        .collect())
}

/// The node (index) that ran each answer.
fn owners_of(c: &Cluster, answers: &[Answer]) -> Result<Vec<usize>> {
    answers
        .iter()
        .enumerate()
        .map(|(i, a)| {
            c.index_of(a.node.as_deref()).ok_or_else(|| {
                anyhow!(
                    "actor {i}: the answer names no node of the cluster (x-wasmkeep-node: {:?})",
                    a.node
                )
            })
        })
        .collect()
}

/// Records how the actors are spread; an error if a node has none (the
/// workloads need every node to own some).
fn record_spread(owners: &[usize], nodes: usize, out: &mut RunOutput) -> Result<Vec<usize>> {
    let mut per = vec![0usize; nodes];
    for &o in owners {
        per[o] += 1;
    }
    let elsewhere = owners
        .iter()
        .enumerate()
        .filter(|(i, o)| i % nodes != **o)
        .count();
    out.fig(
        "actors_per_node_min",
        *per.iter().min().unwrap_or(&0) as f64,
    );
    out.fig(
        "actors_per_node_max",
        *per.iter().max().unwrap_or(&0) as f64,
    );
    let ok = per.iter().all(|&p| p > 0);
    out.check(
        "actors_spread",
        ok,
        format!(
            "actors owned per node: {per:?} ({elsewhere} taken by another node than the one asked)"
        ),
    );
    ensure!(ok, "a node owns no actor: {per:?}");
    Ok(per)
}

/// The sum of a `/metrics` counter over the nodes still running.
async fn metric_sum(c: &Cluster, names: &[&str]) -> Result<f64> {
    let mut sum = 0.0;
    for m in c.members.iter().filter(|m| m.node.is_some()) {
        let all = scrape(&m.endpoint).await?;
        sum += names
            .iter()
            .map(|k| all.get(*k).copied().unwrap_or(0.0))
            .sum::<f64>();
    }
    Ok(sum)
}

const LAPSES: [&str; 2] = [
    "wasmkeep_cluster_lease_lapses_total",
    "wasmkeep_cluster_lease_fences_total",
];

/// W6: W1 sent to each actor's owner and, interleaved in the same run, to
/// a node that is not its owner.
pub async fn w6(env: &Env<'_>) -> Result<RunOutput> {
    let timings = Timings::of(env.args);
    let cluster = Cluster::start(env, &timings).await?;
    let mut out = RunOutput::default();
    let r = w6_run(env, &cluster, &mut out).await;
    cluster.stop(&mut out).await;
    r.map(|()| out)
}

/// W6's virtual users: user `u` sends through node `u % 3`, in phase 0
/// the increments of the actors that node owns, in phase 1 those of the
/// node before it (each actor goes to the node after its owner).
fn w6_users(
    c: &Cluster,
    names: &[String],
    owners: &[usize],
    durability: &str,
    connections: usize,
) -> Vec<User> {
    let n = c.members.len();
    let increments_of = |k: usize| -> Vec<String> {
        (0..names.len())
            .filter(|&i| owners[i] == k)
            .map(|i| {
                format!(
                    "{EXAMPLES}/counter/{}/increment?wasmkeep-durability={durability}",
                    names[i]
                )
            })
            .collect()
    };
    let owned: Vec<Vec<String>> = (0..n).map(increments_of).collect();
    let phase = |k: usize, forwarded: bool| {
        let owner = if forwarded { (k + n - 1) % n } else { k };
        Arc::new(Targets {
            paths: owned[owner].clone(),
            expect: Some(c.members[owner].id.clone()),
        })
    };
    let per_node: Vec<Vec<Arc<Targets>>> = (0..n)
        .map(|k| vec![phase(k, false), phase(k, true)])
        .collect();
    (0..connections)
        .map(|u| User {
            endpoint: c.members[u % n].endpoint.clone(),
            phases: per_node[u % n].clone(),
        })
        .collect()
}

/// W6's figures: both phases' rates and latencies side by side, with
/// their ratios, and what the nodes counted (forwards, lease lapses).
fn w6_figures(
    out: &mut RunOutput,
    own: &load::LoadOutcome,
    fwd: &load::LoadOutcome,
    forwards: f64,
    lapses: f64,
) {
    let ratio = |x: f64, y: f64| if y > 0.0 { x / y } else { f64::NAN };
    out.fig("owner_requests_per_s", own.requests_per_s());
    out.fig("forwarded_requests_per_s", fwd.requests_per_s());
    out.fig(
        "ratio_requests_per_s",
        ratio(fwd.requests_per_s(), own.requests_per_s()),
    );
    out.fig("owner_p50_ms", own.quantile_ms(0.50));
    out.fig("forwarded_p50_ms", fwd.quantile_ms(0.50));
    out.fig("owner_p99_ms", own.quantile_ms(0.99));
    out.fig("forwarded_p99_ms", fwd.quantile_ms(0.99));
    out.fig(
        "ratio_p99",
        ratio(fwd.quantile_ms(0.99), own.quantile_ms(0.99)),
    );
    out.fig("owner_max_ms", own.latency_us.max() as f64 / 1000.0);
    out.fig("forwarded_max_ms", fwd.latency_us.max() as f64 / 1000.0);
    out.fig("requests_ok", (own.ok_total + fwd.ok_total) as f64);
    out.fig("errors", (own.errors_total + fwd.errors_total) as f64);
    out.fig("owner_moved", own.unexpected_node as f64);
    out.fig("forwarded_moved", fwd.unexpected_node as f64);
    out.fig(
        "forwards_per_request",
        forwards / (fwd.ok_total + fwd.errors_total).max(1) as f64,
    );
    out.fig("lease_lapses", lapses);
}

/// W6's checks on the load: no request failed, and every answer ran on
/// the owner found at the start.
fn w6_load_checks(
    out: &mut RunOutput,
    own: &load::LoadOutcome,
    fwd: &load::LoadOutcome,
    lapses: f64,
) {
    let errors = own.errors_total + fwd.errors_total;
    out.check(
        "no_errors",
        errors == 0,
        if errors == 0 {
            "every request answered 2xx".to_string()
        } else {
            let mut s: Vec<String> = own.error_samples.clone();
            s.extend(fwd.error_samples.iter().cloned());
            format!(
                "{} to the owner and {} forwarded requests failed; first: {}",
                own.errors_total,
                fwd.errors_total,
                s.join(" | ")
            )
        },
    );
    let moved = own.unexpected_node + fwd.unexpected_node;
    out.check(
        "owners_unchanged",
        moved == 0,
        if moved == 0 {
            format!(
                "every 2xx answer ran on the actor's owner found at the start \
                 (lease lapses or fences on the nodes: {lapses})"
            )
        } else {
            let mut s = own.unexpected_samples.clone();
            s.extend(fwd.unexpected_samples.iter().cloned());
            format!(
                "{} answers to the owner phase and {} forwarded ones ran on another node than \
                 the owner found at the start (ownership moved; lease lapses or fences: \
                 {lapses}); first: {}",
                own.unexpected_node,
                fwd.unexpected_node,
                s.join(" | ")
            )
        },
    );
}

/// W6's run on a started cluster: the actors spread over the nodes, the
/// two phases' load, then the figures and checks.
async fn w6_run(env: &Env<'_>, c: &Cluster, out: &mut RunOutput) -> Result<()> {
    let a = env.args;
    let n = c.members.len();
    let names: Vec<String> = (0..a.actors).map(|i| format!("a{i}")).collect();
    // A read takes the actor as a write would, and leaves every counter at
    // its baseline.
    let reads: Vec<String> = names
        .iter()
        .map(|x| format!("{EXAMPLES}/counter/{x}/value"))
        .collect();
    let owners = owners_of(c, &spread(c, a.connections, &reads, &Method::GET).await?)?;
    record_spread(&owners, n, out)?;
    let durability = a.w6_durability.as_str();
    let users = w6_users(c, &names, &owners, durability, a.connections);
    let before: u64 = read_counters(&c.members[0].endpoint, a.connections, &names)
        .await?
        .iter()
        .sum();
    let forwards0 = metric_sum(c, &["wasmkeep_cluster_forwards_total"]).await?;
    let lapses0 = metric_sum(c, &LAPSES).await?;
    let slices = (a.measure_s / SLICE_S).round().max(1.0);
    let spec = PhasedSpec {
        users,
        warmup: Duration::from_secs_f64(a.warmup_s),
        measure: Duration::from_secs_f64(a.measure_s),
        slice: Duration::from_secs_f64(a.measure_s / slices),
        method: Method::POST,
        seed: a.seed,
    };
    let rs = load::closed_loop_phased(&spec).await?;
    let (own, fwd) = (&rs[0], &rs[1]);
    let forwards = metric_sum(c, &["wasmkeep_cluster_forwards_total"]).await? - forwards0;
    let lapses = metric_sum(c, &LAPSES).await? - lapses0;
    w6_figures(out, own, fwd, forwards, lapses);
    w6_load_checks(out, own, fwd, lapses);
    let ok_total = own.ok_total + fwd.ok_total;
    let errors = own.errors_total + fwd.errors_total;
    // Read through another node than the baseline was.
    let after: u64 = read_counters(&c.members[n - 1].endpoint, a.connections, &names)
        .await?
        .iter()
        .sum();
    let applied = after.saturating_sub(before);
    let lost = ok_total.saturating_sub(applied);
    let extra = applied.saturating_sub(ok_total);
    out.fig("lost_writes", lost as f64);
    out.check(
        "no_lost_writes",
        lost == 0 && extra <= errors,
        format!(
            "acknowledged {ok_total} `{durability}` increments (both phases); the counters \
             grew by {applied} ({before} through node 0 -> {after} through node {}); lost {lost}, \
             unacknowledged but applied {extra} (failed requests: {errors})",
            n - 1
        ),
    );
    Ok(())
}

/// W5-kill's shared state: where the virtual users send, and what the
/// kill changed.
struct KillState {
    endpoints: Vec<Endpoint>,
    ids: Vec<String>,
    paths: Vec<String>,
    alive: Vec<AtomicBool>,
    /// The node that ran each actor's latest acknowledged increment.
    latest_owner: Vec<AtomicUsize>,
    /// A dead node's actor that has not answered from another node since
    /// the kill: asked only through `probes`.
    pending: Vec<AtomicBool>,
    /// Pending actors and when to ask each next.
    probes: Mutex<VecDeque<(usize, Instant)>>,
    /// Users asking for a pending actor now, and how many may: the others
    /// go on with the load on the live nodes' actors (a request for a dead
    /// node's actor may wait a while before it fails).
    probing: AtomicUsize,
    probing_max: usize,
    /// Acknowledged increments of actors that were not pending.
    live_acks: AtomicU64,
    /// Time from the kill to the first answer, per actor.
    answered_again: Mutex<Vec<Option<Duration>>>,
    /// When the kill was sent, and to which node.
    kill: Mutex<Option<(Instant, usize)>>,
    stop: AtomicBool,
    warm_end: Instant,
    measure_end: Instant,
}

impl KillState {
    /// The state of a run whose users increment `paths` on the cluster
    /// `c`, each actor first owned by `owners[i]`; the warm-up starts now.
    fn new(c: &Cluster, paths: Vec<String>, owners: &[usize], a: &BenchArgs) -> KillState {
        let n = c.members.len();
        let actors = paths.len();
        let start = crate::clock::now();
        let warm_end = start + Duration::from_secs_f64(a.warmup_s);
        let measure_end = warm_end + Duration::from_secs_f64(a.measure_s);
        KillState {
            endpoints: c.members.iter().map(|m| m.endpoint.clone()).collect(),
            ids: c.members.iter().map(|m| m.id.clone()).collect(),
            paths,
            alive: (0..n).map(|_| AtomicBool::new(true)).collect(),
            latest_owner: owners.iter().map(|&o| AtomicUsize::new(o)).collect(),
            pending: (0..actors).map(|_| AtomicBool::new(false)).collect(),
            probes: Mutex::new(VecDeque::new()),
            probing: AtomicUsize::new(0),
            probing_max: (a.connections / 2).max(1),
            live_acks: AtomicU64::new(0),
            answered_again: Mutex::new(vec![None; actors]),
            kill: Mutex::new(None),
            stop: AtomicBool::new(false),
            warm_end,
            measure_end,
        }
    }

    /// A pending actor due to be asked again, counted as probing until
    /// [`Self::probed`].
    fn due_probe(&self, now: Instant) -> Option<usize> {
        if self.probing.load(Ordering::Relaxed) >= self.probing_max {
            return None;
        }
        let mut q = self.probes.lock().expect("not poisoned");
        match q.front() {
            Some(&(a, at)) if at <= now => {
                q.pop_front();
                self.probing.fetch_add(1, Ordering::Relaxed);
                Some(a)
            }
            _ => None,
        }
    }

    fn probed(&self) {
        self.probing.fetch_sub(1, Ordering::Relaxed);
    }

    fn ask_again_later(&self, actor: usize) {
        self.probes.lock().expect("not poisoned").push_back((
            actor,
            crate::clock::now() + Duration::from_millis(PROBE_RETRY_MS),
        ));
    }

    /// The first live node after `node`, if any is.
    fn live_node_after(&self, node: usize) -> Option<usize> {
        let nodes = self.endpoints.len();
        (1..nodes)
            .map(|d| (node + d) % nodes)
            .find(|&k| self.alive[k].load(Ordering::Relaxed))
    }

    /// The actor to ask next, and whether it is a probe: a pending actor
    /// that is due, else a random one that is not pending (None if the
    /// draws found only pending ones).
    fn next_actor(&self, rng: &mut SplitMix) -> Option<(usize, bool)> {
        if let Some(a) = self.due_probe(crate::clock::now()) {
            return Some((a, true));
        }
        let mut a = rng.below(self.paths.len());
        for _ in 0..16 {
            if !self.pending[a].load(Ordering::Relaxed) {
                break;
            }
            a = rng.below(self.paths.len());
        }
        if self.pending[a].load(Ordering::Relaxed) {
            return None;
        }
        Some((a, false))
    }
}

/// What one virtual user saw.
struct UserLog {
    /// (actor, value) of every acknowledged increment.
    acks: Vec<(u32, u64)>,
    /// Actors of the increments whose outcome is unknown (failed).
    failed: Vec<u32>,
    failed_by_status: BTreeMap<u16, u64>,
    errors_before_kill: u64,
    client_errors: u64,
    samples: Vec<String>,
    /// Latency of the acknowledged requests of the measured window before
    /// the kill, in microseconds.
    hist: Histogram<u64>,
}

/// One request of a W5-kill user: the actor, whether it was a probe of a
/// dead node's actor, and when it was sent and answered.
#[derive(Clone, Copy)]
struct Sent {
    actor: usize,
    probe: bool,
    t0: Instant,
    t1: Instant,
}

impl UserLog {
    /// A log with nothing in it yet.
    fn new() -> UserLog {
        UserLog {
            acks: Vec::new(),
            failed: Vec::new(),
            failed_by_status: BTreeMap::new(),
            errors_before_kill: 0,
            client_errors: 0,
            samples: Vec::new(),
            hist: load::histogram_us(),
        }
    }

    /// Keeps `sample` if fewer than [`SAMPLES_MAX`] are kept.
    fn sample(&mut self, sample: impl FnOnce() -> String) {
        if self.samples.len() < SAMPLES_MAX {
            self.samples.push(sample());
        }
    }

    /// An increment acknowledged with `value` by answer `a`: records who
    /// ran it and its latency; a probe's actor is no longer pending once it
    /// answered from another node than the victim since the kill.
    fn ack(
        &mut self,
        st: &KillState,
        s: Sent,
        value: u64,
        a: &Answer,
        kill: Option<(Instant, usize)>,
    ) {
        self.acks.push((s.actor as u32, value));
        let by = a
            .node
            .as_deref()
            .and_then(|id| st.ids.iter().position(|x| x == id));
        if let Some(k) = by {
            st.latest_owner[s.actor].store(k, Ordering::Relaxed);
        }
        if s.t0 >= st.warm_end && s.t1 <= st.measure_end {
            self.hist
                .saturating_record((s.t1 - s.t0).as_micros().max(1) as u64);
        }
        if !s.probe {
            st.live_acks.fetch_add(1, Ordering::Relaxed);
        }
        if s.probe {
            match kill {
                Some((at, victim)) if s.t0 >= at && by.is_some_and(|k| k != victim) => {
                    st.answered_again.lock().expect("not poisoned")[s.actor] = Some(s.t1 - at);
                    st.pending[s.actor].store(false, Ordering::Relaxed);
                }
                _ => st.ask_again_later(s.actor),
            }
        }
    }

    /// An increment whose outcome is unknown (`r` is not a 200 with a
    /// value), sent through `node`.
    fn fail(
        &mut self,
        st: &KillState,
        s: Sent,
        node: usize,
        r: &Result<Answer>,
        kill: Option<(Instant, usize)>,
    ) {
        self.failed.push(s.actor as u32);
        let status = r.as_ref().map(|a| a.status).unwrap_or(0);
        *self.failed_by_status.entry(status).or_default() += 1;
        if kill.is_none_or(|(at, _)| s.t1 < at) {
            self.errors_before_kill += 1;
        }
        if (400..500).contains(&status) {
            self.client_errors += 1;
        }
        self.sample(|| {
            let described = r.as_ref().map(|a| (a.status, a.body.clone()));
            format!(
                "{} via node {node}: {}",
                st.paths[s.actor],
                match &described {
                    Ok(x) => client::describe(&Ok(x.clone())),
                    Err(e) => format!("{e:#}"),
                }
            )
        });
    }
}

/// The virtual users; dropping them stops them.
struct Users {
    state: Arc<KillState>,
    tasks: Vec<tokio::task::JoinHandle<UserLog>>,
}

impl Users {
    fn start(state: &Arc<KillState>, connections: usize, seed: u64) -> Users {
        let tasks = (0..connections)
            .map(|u| tokio::spawn(kill_user(Arc::clone(state), u, seed)))
            .collect();
        Users {
            state: Arc::clone(state),
            tasks,
        }
    }

    async fn finish(mut self) -> Result<Vec<UserLog>> {
        self.state.stop.store(true, Ordering::Relaxed);
        let mut logs = Vec::new();
        for t in std::mem::take(&mut self.tasks) {
            logs.push(t.await?);
        }
        Ok(logs)
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// One virtual user of W5-kill: a keep-alive connection to a live node
/// (another one once its node is killed), `replicated` increments of
/// random actors, and the dead node's actors whenever one is due.
async fn kill_user(st: Arc<KillState>, u: usize, seed: u64) -> UserLog {
    let mut node = u % st.endpoints.len();
    let mut conn: Option<Conn> = None;
    let mut rng = SplitMix::new(seed ^ (u as u64).wrapping_mul(0x1000_0000_01B3));
    let mut log = UserLog::new();
    let pause = || tokio::time::sleep(Duration::from_millis(ERROR_PAUSE_MS));
    while !st.stop.load(Ordering::Relaxed) {
        if !st.alive[node].load(Ordering::Relaxed) {
            if let Some(k) = st.live_node_after(node) {
                node = k;
            }
            conn = None;
        }
        if conn.is_none() {
            match Conn::connect(&st.endpoints[node]).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    log.sample(|| format!("connect to node {node}: {e:#}"));
                    pause().await;
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected above");
        let Some((actor, probe)) = st.next_actor(&mut rng) else {
            pause().await;
            continue;
        };
        let t0 = crate::clock::now();
        let r = c.send_full(&Method::POST, &st.paths[actor]).await;
        let t1 = crate::clock::now();
        if probe {
            st.probed();
        }
        let sent = Sent {
            actor,
            probe,
            t0,
            t1,
        };
        let kill = *st.kill.lock().expect("not poisoned");
        let value = match &r {
            Ok(a) if a.status == 200 => serde_json::from_slice::<serde_json::Value>(&a.body)
                .ok()
                .and_then(|v| v["value"].as_u64()),
            _ => None,
        };
        match (value, &r) {
            (Some(v), Ok(a)) => log.ack(&st, sent, v, a, kill),
            _ => {
                log.fail(&st, sent, node, &r, kill);
                if r.is_err() {
                    conn = None;
                }
                if probe {
                    st.ask_again_later(actor);
                } else {
                    pause().await;
                }
            }
        }
    }
    log
}

/// W5-kill: SIGKILL of a node under `replicated` W1 load through all
/// three; how long until each of its actors answers again, and whether
/// any acknowledged write was lost or acknowledged twice.
pub async fn w5_kill(env: &Env<'_>) -> Result<RunOutput> {
    let timings = Timings::of(env.args);
    let mut cluster = Cluster::start(env, &timings).await?;
    let mut out = RunOutput::default();
    out.fig("lease_period_ms", timings.lease_period_ms as f64);
    out.fig("lease_grace_ms", timings.lease_grace_ms as f64);
    out.fig("bar_ms", timings.bar_ms() as f64);
    let r = w5_kill_run(env, &mut cluster, &timings, &mut out).await;
    cluster.stop(&mut out).await;
    r.map(|()| out)
}

/// W5-kill: each actor's value acknowledged by its first increment (the
/// start of its acknowledged history); checks every actor answered one.
fn first_acks(names: &[String], touched: &[Answer], out: &mut RunOutput) -> Vec<Vec<u64>> {
    let mut acked: Vec<Vec<u64>> = vec![Vec::new(); names.len()];
    let mut bad_touch = Vec::new();
    for (i, t) in touched.iter().enumerate() {
        let v = serde_json::from_slice::<serde_json::Value>(&t.body)
            .ok()
            .and_then(|v| v["value"].as_u64());
        match v {
            Some(v) => acked[i].push(v),
            None => bad_touch.push(format!("{}: {} {:?}", names[i], t.status, t.body)),
        }
    }
    out.check(
        "touched",
        bad_touch.is_empty(),
        if bad_touch.is_empty() {
            format!("{} actors answered their first increment", names.len())
        } else {
            bad_touch[..bad_touch.len().min(5)].join(" | ")
        },
    );
    acked
}

/// W5-kill's kill: the node killed, its actors, and what the wait for
/// them to answer again saw.
struct Outage {
    /// Actors whose latest acknowledged increment each node ran.
    per: Vec<usize>,
    victim: usize,
    /// The victim's actors.
    dead: Vec<usize>,
    survivors: Vec<usize>,
    killed_at: Instant,
    /// The longest the run waited for the dead actors.
    deadline: Instant,
    /// The cluster's takeovers before the kill.
    takeovers0: f64,
    /// From the kill to the end of the wait, in seconds.
    outage_s: f64,
    /// Acknowledged increments of the other actors meanwhile.
    outage_live_acks: u64,
}

/// The victim: the node that ran the latest acknowledged increment of the
/// most actors; with how many each node ran.
fn choose_victim(state: &KillState, n: usize) -> (usize, Vec<usize>) {
    let mut per = vec![0usize; n];
    for o in &state.latest_owner {
        per[o.load(Ordering::Relaxed).min(n - 1)] += 1;
    }
    let victim = (0..n).max_by_key(|&k| per[k]).expect("three nodes");
    (victim, per)
}

/// Marks the victim's actors pending, due to be asked at once, and the
/// victim dead, then SIGKILLs it; when the kill was sent, and the live
/// acknowledgements then.
async fn kill_victim(
    c: &mut Cluster,
    state: &KillState,
    victim: usize,
    dead: &[usize],
) -> Result<(Instant, u64)> {
    // No await from here to the signal: no user runs in between, so none
    // sends to the victim or asks for its actors before the kill instant.
    let killed_at = crate::clock::now();
    {
        for &d in dead {
            state.pending[d].store(true, Ordering::Relaxed);
        }
        state
            .probes
            .lock()
            .expect("not poisoned")
            .extend(dead.iter().map(|&d| (d, killed_at)));
        state.alive[victim].store(false, Ordering::Relaxed);
        *state.kill.lock().expect("not poisoned") = Some((killed_at, victim));
    }
    let live_acks0 = state.live_acks.load(Ordering::Relaxed);
    let mut node = c.members[victim].node.take().expect("the victim runs");
    node.kill().await.context("SIGKILL the victim")?;
    drop(node);
    Ok((killed_at, live_acks0))
}

/// Kills the victim under the load, then waits until each of its actors
/// answered from another node, or lease + grace +
/// [`TAKEOVER_WAIT_EXTRA_MS`] passed.
async fn kill_and_wait(c: &mut Cluster, state: &KillState, timings: &Timings) -> Result<Outage> {
    let n = c.members.len();
    let (victim, per) = choose_victim(state, n);
    let dead: Vec<usize> = (0..state.paths.len())
        .filter(|&i| state.latest_owner[i].load(Ordering::Relaxed) == victim)
        .collect();
    let survivors: Vec<usize> = (0..n).filter(|&k| k != victim).collect();
    let takeovers0 = metric_sum(c, &["wasmkeep_cluster_takeovers_total"]).await?;
    let (killed_at, live_acks0) = kill_victim(c, state, victim, &dead).await?;
    let deadline = killed_at
        + Duration::from_millis(
            timings.lease_period_ms + timings.lease_grace_ms + TAKEOVER_WAIT_EXTRA_MS,
        );
    loop {
        let left = dead
            .iter()
            .filter(|&&d| state.pending[d].load(Ordering::Relaxed))
            .count();
        if left == 0 || crate::clock::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    Ok(Outage {
        per,
        victim,
        dead,
        survivors,
        killed_at,
        deadline,
        takeovers0,
        outage_s: killed_at.elapsed().as_secs_f64(),
        outage_live_acks: state.live_acks.load(Ordering::Relaxed) - live_acks0,
    })
}

/// What the W5-kill users saw, added up.
struct KillTally {
    /// Latency of the measured window before the kill.
    hist: Histogram<u64>,
    ok_total: u64,
    errors: u64,
    errors_before_kill: u64,
    client_errors: u64,
    by_status: BTreeMap<u16, u64>,
    samples: Vec<String>,
    /// Failed increments (outcome unknown) per actor.
    unknown: HashMap<usize, u64>,
}

/// Adds up the users' logs; their acknowledged values go into `acked`.
fn tally_logs(logs: &[UserLog], acked: &mut [Vec<u64>]) -> KillTally {
    let mut t = KillTally {
        hist: load::histogram_us(),
        ok_total: 0,
        errors: 0,
        errors_before_kill: 0,
        client_errors: 0,
        by_status: BTreeMap::new(),
        samples: Vec::new(),
        unknown: HashMap::new(),
    };
    for l in logs {
        t.hist.add(&l.hist).expect("same bounds");
        t.ok_total += l.acks.len() as u64;
        t.errors += l.failed.len() as u64;
        t.errors_before_kill += l.errors_before_kill;
        t.client_errors += l.client_errors;
        for (s, k) in &l.failed_by_status {
            *t.by_status.entry(*s).or_default() += k;
        }
        for s in &l.samples {
            if t.samples.len() < SAMPLES_MAX {
                t.samples.push(s.clone());
            }
        }
        for &(actor, v) in &l.acks {
            acked[actor as usize].push(v);
        }
        for &actor in &l.failed {
            *t.unknown.entry(actor as usize).or_default() += 1;
        }
    }
    t
}

/// The takeover's figures (time from the kill to each dead actor's first
/// answer, beside the bar) and the check that every one answered again.
fn takeover_report(
    out: &mut RunOutput,
    state: &KillState,
    o: &Outage,
    takeovers: f64,
    timings: &Timings,
) {
    let again = state.answered_again.lock().expect("not poisoned").clone();
    let mut ms: Vec<f64> = o
        .dead
        .iter()
        .filter_map(|&d| again[d].map(|t| t.as_secs_f64() * 1000.0))
        .collect();
    ms.sort_by(f64::total_cmp);
    let q = |x| quantile(&ms, x).unwrap_or(f64::NAN);
    out.fig("dead_actors", o.dead.len() as f64);
    out.fig("takeover_min_ms", q(0.0));
    out.fig("takeover_p50_ms", q(0.50));
    out.fig("takeover_p99_ms", q(0.99));
    out.fig("takeover_max_ms", q(1.0));
    let bar = timings.bar_ms() as f64;
    out.fig(
        "takeover_over_bar",
        ms.iter().filter(|&&m| m > bar).count() as f64,
    );
    out.fig("takeovers", takeovers);
    // The load on the other actors while the dead node's waited.
    out.fig(
        "takeover_live_req_per_s",
        o.outage_live_acks as f64 / o.outage_s,
    );
    out.check(
        "all_answered_again",
        ms.len() == o.dead.len(),
        format!(
            "{} of the {} actors of node {} (killed; {} actors per node {:?}) answered \
             from another node within {} ms of the kill (lease {} + grace {} + {} ms); \
             p99 {:.0} ms against the bar lease + grace + 1 s = {bar:.0} ms",
            ms.len(),
            o.dead.len(),
            o.victim,
            o.per.len(),
            o.per,
            o.deadline.duration_since(o.killed_at).as_millis(),
            timings.lease_period_ms,
            timings.lease_grace_ms,
            TAKEOVER_WAIT_EXTRA_MS,
            q(0.99),
        ),
    );
}

/// Every counter read through each survivor; checks they agree, and
/// returns the values.
async fn read_finals(
    c: &Cluster,
    connections: usize,
    names: &[String],
    survivors: &[usize],
    out: &mut RunOutput,
) -> Result<Vec<u64>> {
    let mut finals: Option<Vec<u64>> = None;
    let mut disagree = Vec::new();
    for &k in survivors {
        let vals = read_counters(&c.members[k].endpoint, connections, names)
            .await
            .with_context(|| format!("read the counters through node {k}"))?;
        match &finals {
            None => finals = Some(vals),
            Some(f) => {
                for (i, (x, y)) in f.iter().zip(&vals).enumerate() {
                    if x != y && disagree.len() < 5 {
                        disagree.push(format!("{}: {x} vs {y} through node {k}", names[i]));
                    }
                }
            }
        }
    }
    let finals = finals.expect("two survivors");
    out.check(
        "nodes_agree",
        disagree.is_empty(),
        if disagree.is_empty() {
            format!("every counter read the same through nodes {survivors:?}")
        } else {
            disagree.join(" | ")
        },
    );
    Ok(finals)
}

/// What the acknowledged histories say against the final values.
struct History {
    /// Acknowledged values above their counter's final value.
    lost: u64,
    /// Values acknowledged twice for one actor.
    twice: u64,
    /// Counters above their acknowledged plus failed increments.
    invented: u64,
    examples: Vec<String>,
}

/// The history: no acknowledged value above the final one (lost), none
/// acknowledged twice (split brain), and no final value above what may
/// have run (acknowledged + unknown outcomes).
fn history(
    names: &[String],
    acked: &mut [Vec<u64>],
    finals: &[u64],
    unknown: &HashMap<usize, u64>,
) -> History {
    let mut h = History {
        lost: 0,
        twice: 0,
        invented: 0,
        examples: Vec::new(),
    };
    for (i, values) in acked.iter_mut().enumerate() {
        values.sort_unstable();
        let fin = finals[i];
        let dup = values.windows(2).filter(|w| w[0] == w[1]).count() as u64;
        let above = values.iter().filter(|&&v| v > fin).count() as u64;
        let may_have_run = values.len() as u64 + unknown.get(&i).copied().unwrap_or(0);
        if (dup > 0 || above > 0 || fin > may_have_run) && h.examples.len() < 5 {
            h.examples.push(format!(
                "{}: final {fin}, highest acknowledged {:?}, {dup} acknowledged twice, \
                 {may_have_run} may have run",
                names[i],
                values.last()
            ));
        }
        h.twice += dup;
        h.lost += above;
        h.invented += u64::from(fin > may_have_run);
    }
    h
}

/// W5-kill's history figures and checks, and the failed requests'.
fn history_report(out: &mut RunOutput, actors: usize, h: &History, t: &KillTally) {
    let (lost, twice, invented) = (h.lost, h.twice, h.invented);
    let (errors, errors_before_kill, client_errors) =
        (t.errors, t.errors_before_kill, t.client_errors);
    out.fig("requests_ok", t.ok_total as f64);
    out.fig("errors", errors as f64);
    out.fig("errors_before_kill", errors_before_kill as f64);
    out.fig("lost_acknowledged", lost as f64);
    out.fig("acknowledged_twice", twice as f64);
    let tail = if h.examples.is_empty() {
        String::new()
    } else {
        format!("; {}", h.examples.join(" | "))
    };
    out.check(
        "no_lost_acknowledged_writes",
        lost == 0,
        format!(
            "{} acknowledged increments ({actors} actors); {lost} acknowledged values above their \
             counter's final value{tail}",
            t.ok_total + actors as u64,
        ),
    );
    out.check(
        "no_split_brain",
        twice == 0,
        format!("{twice} values acknowledged twice for one actor{tail}"),
    );
    out.check(
        "no_invented_writes",
        invented == 0,
        format!("{invented} counters above their acknowledged plus failed increments{tail}"),
    );
    let failures = format!(
        "{errors} failed requests (by status, 0 = no answer: {:?}); first: {}",
        t.by_status,
        t.samples.join(" | ")
    );
    out.check(
        "no_errors_before_kill",
        errors_before_kill == 0,
        format!("{errors_before_kill} before the kill; {failures}"),
    );
    out.check(
        "no_client_errors",
        client_errors == 0,
        format!("{client_errors} answered 4xx; {failures}"),
    );
}

/// W5-kill's run on a started cluster: the actors spread over the nodes,
/// the load, the kill and the wait for the takeover, then the figures and
/// the checks of every acknowledged value.
async fn w5_kill_run(
    env: &Env<'_>,
    c: &mut Cluster,
    timings: &Timings,
    out: &mut RunOutput,
) -> Result<()> {
    let a = env.args;
    let n = c.members.len();
    let names: Vec<String> = (0..a.actors).map(|i| format!("k{i}")).collect();
    let paths: Vec<String> = names
        .iter()
        .map(|x| format!("{EXAMPLES}/counter/{x}/increment{REPLICATED}"))
        .collect();
    // The first increment of each actor, through node i % 3, takes it there.
    let touched = spread(c, a.connections, &paths, &Method::POST).await?;
    let owners = owners_of(c, &touched)?;
    record_spread(&owners, n, out)?;
    let mut acked = first_acks(&names, &touched, out);
    let state = Arc::new(KillState::new(c, paths, &owners, a));
    let users = Users::start(&state, a.connections, a.seed);
    tokio::time::sleep_until(state.measure_end.into()).await;
    let outage = kill_and_wait(c, &state, timings).await?;
    tokio::time::sleep(Duration::from_millis(AFTER_TAKEOVER_MS)).await;
    let logs = users.finish().await?;
    let takeovers = metric_sum(c, &["wasmkeep_cluster_takeovers_total"]).await? - outage.takeovers0;
    // Before the kill: the load's figures.
    let t = tally_logs(&logs, &mut acked);
    out.fig("requests_per_s", t.hist.len() as f64 / a.measure_s);
    out.fig("p50_ms", t.hist.value_at_quantile(0.50) as f64 / 1000.0);
    out.fig("p99_ms", t.hist.value_at_quantile(0.99) as f64 / 1000.0);
    takeover_report(out, &state, &outage, takeovers, timings);
    let finals = read_finals(c, a.connections, &names, &outage.survivors, out).await?;
    let h = history(&names, &mut acked, &finals, &t.unknown);
    history_report(out, names.len(), &h, &t);
    Ok(())
}

/// W5: how long past the last possible instant (due + lease + grace +
/// sweep) the run waits for the orphaned alarms before it fails
/// `all_fired`.
const W5_WAIT_EXTRA_MS: u64 = 120_000;
/// W5: how often the survivors' counters are read while waiting.
const W5_POLL_MS: u64 = 500;

/// W5, failover of alarms: `--alarms` reminders set through node 0 (which
/// takes every one of their actors) for one instant `--w5-lead-s` after
/// the set-up started, SIGKILL of node 0 as soon as all are set, then
/// nothing but waiting: no request reaches the actors until every alarm
/// ran (a request would take an actor and fire its alarm from the
/// restored database; here only the survivors' sweeps can). Reported:
/// fired / scheduled, lateness (fired − due) p50/p99/max beside the bar
/// lease + grace + sweep interval, and each survivor's drain rate (the
/// alarms it ran over the time from its first to its last); checked: all
/// fired, none early, none twice, none on the dead node.
pub async fn w5(env: &Env<'_>) -> Result<RunOutput> {
    let timings = Timings::of(env.args);
    let mut cluster = Cluster::start(env, &timings).await?;
    let mut out = RunOutput::default();
    let r = w5_run(env, &mut cluster, &timings, &mut out).await;
    cluster.stop(&mut out).await;
    r.map(|()| out)
}

/// W5: sets every alarm through node 0, due at `due`; checks node 0 holds
/// every actor (an error if not). Returns node 0's id.
async fn set_alarms_on_node0(
    c: &Cluster,
    connections: usize,
    names: &[String],
    due: u64,
    out: &mut RunOutput,
) -> Result<String> {
    let reqs = names
        .iter()
        .map(|n| {
            (
                Method::POST,
                format!("{EXAMPLES}/reminder/{n}/set{REPLICATED}&at_ms={due}"),
            )
        })
        .collect();
    let t_set = crate::clock::now();
    let owner = c.members[0].endpoint.clone();
    let set = client::send_all_full(&owner, connections, reqs).await?;
    out.fig("set_s", t_set.elapsed().as_secs_f64());
    let victim_id = c.members[0].id.clone();
    let bad: Vec<String> = set
        .iter()
        .zip(names)
        .filter(|(r, _)| {
            !r.as_ref()
                .is_ok_and(|a| a.status == 200 && a.node.as_deref() == Some(victim_id.as_str()))
        })
        .take(5)
        .map(|(r, n)| match r {
            Ok(a) => format!("{n}: {} on {:?}", a.status, a.node),
            Err(e) => format!("{n}: {e:#}"),
        })
        .collect();
    out.check(
        "alarms_set_on_one_node",
        bad.is_empty(),
        if bad.is_empty() {
            format!(
                "{} alarms set for {due} through node 0, which holds every actor",
                names.len()
            )
        } else {
            bad.join(" | ")
        },
    );
    ensure!(bad.is_empty(), "the alarms were not all set on node 0");
    Ok(victim_id)
}

/// W5: SIGKILLs node 0, checking it is before the alarms are due.
async fn kill_node0(c: &mut Cluster, due: u64, out: &mut RunOutput) -> Result<()> {
    let killed_at = now_ms();
    out.check(
        "killed_before_due",
        killed_at < due,
        format!(
            "node 0 killed {} ms before the alarms' instant{}",
            due as i64 - killed_at as i64,
            if killed_at < due {
                ""
            } else {
                ": give more --w5-lead-s"
            }
        ),
    );
    let mut node = c.members[0].node.take().expect("node 0 runs");
    node.kill().await.context("SIGKILL node 0")?;
    drop(node);
    Ok(())
}

/// W5: waits, without touching the actors, until the survivors' sweeps ran
/// `alarms` alarms or `deadline` (ms) passed; records what the sweeps did.
async fn wait_for_sweeps(
    c: &Cluster,
    alarms: usize,
    due: u64,
    deadline: u64,
    out: &mut RunOutput,
) -> Result<()> {
    sleep_until_ms(due).await;
    let mut ran = 0.0;
    while now_ms() < deadline {
        ran = metric_sum(c, &["wasmkeep_alarm_sweep_alarms_run_total"]).await?;
        if ran >= alarms as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(W5_POLL_MS)).await;
    }
    out.fig("run_by_sweeps", ran);
    let deliveries = metric_sum(c, &["wasmkeep_alarm_sweep_deliveries_total"]).await?;
    let takeovers = metric_sum(c, &["wasmkeep_alarm_sweep_takeovers_total"]).await?;
    out.fig("sweep_deliveries", deliveries);
    out.fig("sweep_takeovers", takeovers);
    Ok(())
}

/// W5: what every actor's runs of the alarm say.
#[derive(Default)]
struct AlarmRuns {
    /// Each fired alarm's first run, ms after `due` (negative if early).
    lateness: Vec<f64>,
    /// Runs beyond an alarm's first.
    twice: usize,
    /// Alarms first run before they were due.
    early: usize,
    /// Alarms answered by the killed node.
    on_victim: usize,
    /// Actors whose runs could not be read.
    unread: Vec<String>,
    /// Per node that answered: alarms, first and last run (ms).
    per_node: BTreeMap<String, (usize, u64, u64)>,
}

/// W5: reads every actor's runs through `reader` (the owner answers).
async fn read_alarm_runs(
    reader: &Endpoint,
    connections: usize,
    names: &[String],
    due: u64,
    victim_id: &str,
) -> Result<AlarmRuns> {
    let reqs = names
        .iter()
        .map(|n| (Method::GET, format!("{EXAMPLES}/reminder/{n}/fired")))
        .collect();
    let read = client::send_all_full(reader, connections, reqs).await?;
    let mut runs = AlarmRuns::default();
    for (r, n) in read.iter().zip(names) {
        let Some((v, node)) = r.as_ref().ok().and_then(|a| {
            let v: serde_json::Value = serde_json::from_slice(&a.body).ok()?;
            Some((v, a.node.clone().unwrap_or_default()))
        }) else {
            runs.unread.push(n.clone());
            continue;
        };
        let fired: Vec<u64> = v["fired"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["due_ms"].as_u64() == Some(due))
            .filter_map(|e| e["fired_ms"].as_u64())
            .collect();
        let Some(&first) = fired.first() else {
            continue;
        };
        runs.twice += fired.len().saturating_sub(1);
        if first < due {
            runs.early += 1;
        }
        if node == victim_id {
            runs.on_victim += 1;
        }
        runs.lateness.push(first as f64 - due as f64);
        let e = runs.per_node.entry(node).or_insert((0, u64::MAX, 0));
        e.0 += 1;
        e.1 = e.1.min(first);
        e.2 = e.2.max(first);
    }
    runs.lateness.sort_by(|x, y| x.total_cmp(y));
    Ok(runs)
}

/// W5's figures (lateness, each survivor's drain rate) and checks.
fn alarm_runs_report(out: &mut RunOutput, scheduled: usize, runs: &AlarmRuns, bar_ms: u64) {
    let lateness = &runs.lateness;
    let fired = lateness.len();
    out.fig("scheduled", scheduled as f64);
    out.fig("fired", fired as f64);
    if !lateness.is_empty() {
        out.fig(
            "lateness_p50_ms",
            quantile(lateness, 0.50).unwrap_or(f64::NAN),
        );
        out.fig(
            "lateness_p99_ms",
            quantile(lateness, 0.99).unwrap_or(f64::NAN),
        );
        out.fig("lateness_max_ms", *lateness.last().expect("not empty"));
    }
    let mut rates = Vec::new();
    for (node, (count, first, last)) in &runs.per_node {
        // A node that ran one alarm (or all in one millisecond) has no span.
        let span_s = ((last - first) as f64 / 1000.0).max(0.001);
        let rate = *count as f64 / span_s;
        eprintln!("  W5: node {node} ran {count} alarms in {span_s:.2} s ({rate:.0}/s)");
        rates.push(rate);
    }
    if let Some(min) = rates.iter().copied().reduce(f64::min) {
        out.fig("drain_per_live_node_min_per_s", min);
    }
    out.fig("live_nodes_that_ran_alarms", runs.per_node.len() as f64);
    out.check(
        "all_fired",
        fired == scheduled && runs.unread.is_empty(),
        format!(
            "{fired} of {scheduled} fired; unreadable: {}",
            runs.unread.len()
        ),
    );
    let (early, twice, on_victim) = (runs.early, runs.twice, runs.on_victim);
    out.check(
        "none_early_none_twice",
        early == 0 && twice == 0,
        format!("{early} fired before their due time, {twice} ran twice"),
    );
    out.check(
        "none_on_the_dead_node",
        on_victim == 0,
        format!("{on_victim} answered by the killed node"),
    );
    // The target, reported (not a check: it is a speed): lateness at p99
    // within lease + grace + one sweep interval.
    out.fig(
        "lateness_over_bar",
        lateness.iter().filter(|&&m| m > bar_ms as f64).count() as f64,
    );
}

/// W5's run on a started cluster: the alarms set on node 0, its kill, the
/// wait for the survivors' sweeps, then every actor's runs.
async fn w5_run(
    env: &Env<'_>,
    c: &mut Cluster,
    timings: &Timings,
    out: &mut RunOutput,
) -> Result<()> {
    let a = env.args;
    let sweep_ms = sweep_ms_of(env)?;
    let bar_ms = timings.lease_period_ms + timings.lease_grace_ms + sweep_ms;
    out.fig("lease_period_ms", timings.lease_period_ms as f64);
    out.fig("lease_grace_ms", timings.lease_grace_ms as f64);
    out.fig("alarm_sweep_ms", sweep_ms as f64);
    out.fig("bar_ms", bar_ms as f64);
    let due = now_ms() + (a.w5_lead_s * 1000.0) as u64;
    let names: Vec<String> = (0..a.alarms).map(|i| format!("f{i}")).collect();
    let victim_id = set_alarms_on_node0(c, a.connections, &names, due, out).await?;
    kill_node0(c, due, out).await?;
    // Wait, without touching the actors, until the survivors ran them all.
    let survivors: Vec<usize> = (1..c.members.len()).collect();
    let deadline = due + bar_ms + W5_WAIT_EXTRA_MS;
    wait_for_sweeps(c, names.len(), due, deadline, out).await?;
    // Then read every actor's runs (through a survivor: the owner answers).
    let reader = c.members[survivors[0]].endpoint.clone();
    let runs = read_alarm_runs(&reader, a.connections, &names, due, &victim_id).await?;
    alarm_runs_report(out, names.len(), &runs, bar_ms);
    Ok(())
}

/// The nodes' `alarm_sweep_ms`: `--node-config`'s, else the node's default.
fn sweep_ms_of(env: &Env<'_>) -> Result<u64> {
    let Some(p) = &env.args.node_config else {
        return Ok(DEFAULT_ALARM_SWEEP_MS);
    };
    let text = std::fs::read_to_string(p)?;
    for l in text.lines() {
        if let Some(rest) = l.trim_start().strip_prefix("alarm_sweep_ms")
            && let Some(v) = rest.trim_start().strip_prefix('=')
        {
            return v
                .trim()
                .parse()
                .with_context(|| format!("alarm_sweep_ms in {}", p.display()));
        }
    }
    Ok(DEFAULT_ALARM_SWEEP_MS)
}

/// The node's default `alarm_sweep_ms` (ADR 0009).
pub const DEFAULT_ALARM_SWEEP_MS: u64 = 10_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_config_follows_the_lease_and_leaves_base_keys_alone() {
        let t = |p, g| Timings {
            lease_period_ms: p,
            lease_grace_ms: g,
        };
        // The defaults derive the node's defaults.
        let text = t(10_000, 5_000).config_text("").unwrap();
        for line in [
            "lease_period_ms = 10000",
            "lease_grace_ms = 5000",
            "owner_margin_ms = 1000",
            "lease_register_retry_ms = 1000",
            "cluster_bucket_timeout_ms = 2000",
        ] {
            assert!(text.contains(line), "{text}");
        }
        let text = t(1_500, 1_000)
            .config_text("owner_margin_ms = 250\n[app_limit_ceilings]\n")
            .unwrap();
        assert!(!text.contains("owner_margin_ms = 300"), "{text}");
        assert!(text.contains("cluster_bucket_timeout_ms = 1000"), "{text}");
        assert!(text.ends_with("[app_limit_ceilings]\n"), "{text}");
        assert!(t(1_500, 1_000).config_text(" lease_grace_ms=1").is_err());
        assert!(sets_key(
            "a = 1\n  lease_period_ms   = 2",
            "lease_period_ms"
        ));
        assert!(!sets_key("lease_period_ms_x = 2", "lease_period_ms"));
        assert_eq!(t(10_000, 5_000).bar_ms(), 16_000);
    }
}
