//! `wasmkeep bench`: the fixed workloads of `docs/benchmarks.md` run against
//! a real node, with a closed-loop HTTP/1.1 load generator of its own.
//!
//! What it is: a command that starts a fresh node per run (the same binary,
//! `serve --examples` on a temporary data directory and a loopback port),
//! or uses one given by `--server`, drives the W1, W1-hot, W1-durable, W2,
//! W2-restart, W3, W4 and W7 (the outbox, [`outbox`]) workloads through the
//! public HTTP API, checks each run's correctness (no lost writes, every
//! alarm fired once, every message answered once), and reports
//! the median, minimum and maximum of every figure over `--runs` runs as a
//! table and as JSON. The cluster workloads W6 (forwarded requests) and
//! W5-kill (takeover after a SIGKILL) start three such nodes per run on a
//! folder bucket ([`cluster`]); they take about a minute a run and are
//! not in the default set (ask for them with `--workloads w6,w5-kill`).
//!
//! What it is not: a general-purpose load tester, an open-loop latency
//! meter (see [`load`] on coordinated omission), or a profiler. It knows the
//! node only through HTTP, `/metrics` and `/proc/PID/status`; it links no
//! runtime code. The generator runs on the same machine as the node and on
//! one thread (a tokio current-thread runtime), so that it takes as little
//! as possible of the cores the node is measured on; every report says so.
//!
//! Errors are `anyhow`: this crate is the body of a CLI command, and every
//! error ends as a message to the person running it.

pub mod client;
mod clock;
pub mod cluster;
pub mod deploys;
pub mod isolation;
pub mod large;
pub mod load;
pub mod node;
pub mod outbox;
mod report;
pub mod sockets;
pub mod workloads;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::ValueEnum;

use crate::client::Endpoint;
use crate::report::{RunRecord, Skipped};
use crate::workloads::{Env, Target};

/// A workload of `docs/benchmarks.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// Counter-spread: increments over `--actors` counters.
    #[value(name = "w1")]
    W1,
    /// Every increment to one counter.
    #[value(name = "w1-hot")]
    W1Hot,
    /// W1 on the TypeScript counter (`demo/examples-ts`).
    #[value(name = "w1-ts")]
    W1Ts,
    /// W1 with the examples recording every event for replay.
    #[value(name = "w1-recording")]
    W1Recording,
    /// W1 with every request traced (`trace_sample_pct = 100`, spans kept
    /// in the node's ring).
    #[value(name = "w1-traced")]
    W1Traced,
    /// W1 with every response waiting for the bucket (`--bucket`).
    #[value(name = "w1-durable")]
    W1Durable,
    /// W1-durable on `--large-actors` actors of `--large-mb` each, then on
    /// small ones: a write's cost against the actor's size.
    #[value(name = "w1-durable-large")]
    W1DurableLarge,
    /// `--alarms` alarms due at the same instant.
    #[value(name = "w2")]
    W2,
    /// W2 with the node SIGKILLed before the due time and restarted after.
    #[value(name = "w2-restart")]
    W2Restart,
    /// First request to never-seen actors, one after another.
    #[value(name = "w3")]
    W3,
    /// W3 on the TypeScript counter.
    #[value(name = "w3-ts")]
    W3Ts,
    /// RSS per open actor, 1,000 Rust and 1,000 TypeScript counters.
    #[value(name = "w4-open")]
    W4Open,
    /// RSS after W1 and per idle actor.
    #[value(name = "w4")]
    W4,
    /// Failover of alarms: 3 nodes, alarms set on one, SIGKILLed before
    /// they are due; the others' sweeps fire them.
    #[value(name = "w5")]
    W5,
    /// W1 on a 3-node cluster: sent to the owners, and to other nodes.
    #[value(name = "w6")]
    W6,
    /// SIGKILL of a node of a 3-node cluster under replicated W1.
    #[value(name = "w5-kill")]
    W5Kill,
    /// The outbox: messages between `--actors` actors, and outbound HTTP
    /// calls to a loopback server.
    #[value(name = "w7")]
    W7,
    /// 1,000 actors each running a ten-step durable workflow at once.
    #[value(name = "w7-workflows")]
    W7Workflows,
    /// `--sockets` WebSockets over 100 hibernated rooms: memory per idle
    /// socket, broadcast fan-out, round trips.
    #[value(name = "w8")]
    W8,
    /// Isolation: a neighbour's latency while another tenant runs
    /// statements that never end on twice as many actors as there are
    /// cores.
    #[value(name = "w11")]
    W11,
    /// A deploy and a rollback under load to an app with 10,000 open
    /// actors.
    #[value(name = "w12")]
    W12,
}

impl Workload {
    pub fn id(self) -> &'static str {
        match self {
            Workload::W1 => "w1",
            Workload::W1Hot => "w1-hot",
            Workload::W1Durable => "w1-durable",
            Workload::W1DurableLarge => "w1-durable-large",
            Workload::W2 => "w2",
            Workload::W2Restart => "w2-restart",
            Workload::W1Ts => "w1-ts",
            Workload::W1Recording => "w1-recording",
            Workload::W1Traced => "w1-traced",
            Workload::W3 => "w3",
            Workload::W3Ts => "w3-ts",
            Workload::W4 => "w4",
            Workload::W4Open => "w4-open",
            Workload::W5 => "w5",
            Workload::W6 => "w6",
            Workload::W5Kill => "w5-kill",
            Workload::W7 => "w7",
            Workload::W7Workflows => "w7-workflows",
            Workload::W8 => "w8",
            Workload::W11 => "w11",
            Workload::W12 => "w12",
        }
    }

    /// Why the workload cannot run here, if it cannot.
    fn unavailable(self, server: bool) -> Option<&'static str> {
        match self {
            Workload::W1DurableLarge if workloads::EXAMPLES.path() == workloads::EXAMPLES_TS => {
                Some("needs the `notes` class, which the TypeScript examples do not have")
            }
            Workload::W8 | Workload::W11 | Workload::W12 if server => Some(
                "needs a node started by the benchmark (its RSS, its settings); not run against --server",
            ),
            Workload::W7 if server => Some(
                "needs a node started by the benchmark (it lets actors reach loopback); not run against --server",
            ),
            Workload::W2Restart | Workload::W4 | Workload::W4Open if server => Some(
                "needs a node started by the benchmark (restart, RSS); not run against --server",
            ),
            Workload::W5 | Workload::W6 | Workload::W5Kill if server => {
                Some("needs a cluster of nodes started by the benchmark; not run against --server")
            }
            _ => None,
        }
    }
}

/// The workloads run when none is named: every single-node one (those
/// that cannot run here are listed as such); not the cluster ones, which
/// take about a minute a run each ([`NOT_BY_DEFAULT`]).
const DEFAULT_WORKLOADS: &[Workload] = &[
    Workload::W1,
    Workload::W1Recording,
    Workload::W1Traced,
    Workload::W1Ts,
    Workload::W1Hot,
    Workload::W1Durable,
    Workload::W2,
    Workload::W2Restart,
    Workload::W3,
    Workload::W3Ts,
    Workload::W4,
    Workload::W4Open,
    Workload::W7,
    Workload::W7Workflows,
    Workload::W11,
];

/// Left out of the default set, and said so in the report.
const NOT_BY_DEFAULT: &[Workload] = &[
    Workload::W1DurableLarge,
    Workload::W8,
    Workload::W5,
    Workload::W6,
    Workload::W5Kill,
    Workload::W12,
];

/// The node's durability for the runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    /// fsync before the response (the default of a node).
    Fsync,
    /// The commit reached the OS; survives a process crash, not power loss.
    Process,
    /// Each workload once per durability.
    Both,
}

/// The durability a request names (`wasmkeep-durability`), for the
/// workloads where a node's default would decide otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReplyDurability {
    /// Answered after the local commit (W1's request).
    Local,
    /// Answered once the bucket holds the commit.
    Replicated,
}

impl ReplyDurability {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplyDurability::Local => "local",
            ReplyDurability::Replicated => "replicated",
        }
    }
}

/// `wasmkeep bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Workloads, comma-separated: w1, w1-ts (on the TypeScript counter),
    /// w1-hot, w1-durable, w2, w2-restart, w3, w3-ts, w4, w4-open (memory
    /// per open actor, Rust and TypeScript), w1-durable-large (large actors against small ones; minutes
    /// a run at the default 4 actors of 1 GiB), and the cluster ones w5
    /// (alarms of a killed node), w6 (forwarded requests) and w5-kill
    /// (takeover after a SIGKILL), which start three nodes per run and
    /// take about a minute each. Default: all but w1-durable-large, w5, w6
    /// and w5-kill.
    #[arg(long, alias = "workload", value_enum, value_delimiter = ',')]
    pub workloads: Option<Vec<Workload>>,
    /// The examples the workloads call: `rust` (`demo/examples`) or `ts`
    /// (`demo/examples-ts`, the same classes in TypeScript). w1-ts, w3-ts
    /// and w4-open call both whatever this says; w1-durable-large needs
    /// the `notes` class, which only Rust has.
    #[arg(long, value_parser = ["rust", "ts"], default_value = "rust")]
    pub lang: String,
    /// Runs of each workload (a fresh node per run); the report gives
    /// median, min and max.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Durability of the nodes the benchmark starts.
    #[arg(long, value_enum, default_value_t = DurabilityArg::Fsync)]
    pub durability: DurabilityArg,
    /// Use this node (`http://HOST:PORT`) instead of starting one; only the
    /// workloads that need no restart and no RSS run [default: none: the
    /// benchmark starts its own nodes].
    #[arg(long)]
    pub server: Option<String>,
    /// Write every run's raw figures and checks here [default: none].
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// W1: concurrent keep-alive connections (closed loop); also the
    /// concurrency of the set-up and check phases.
    #[arg(long, default_value_t = 64)]
    pub connections: usize,
    /// W1: warm-up seconds (not measured; its writes are checked).
    #[arg(long, default_value_t = 3.0)]
    pub warmup_s: f64,
    /// W1: measured seconds.
    #[arg(long, default_value_t = 15.0)]
    pub measure_s: f64,
    /// W1, W6, W5-kill: number of counter actors `a0..` (`k0..`).
    #[arg(long, default_value_t = 1000)]
    pub actors: usize,
    /// W2, W5: number of alarms (one actor each).
    #[arg(long, default_value_t = 2000)]
    pub alarms: usize,
    /// W2: seconds from the start of setting the alarms to their due time
    /// (the workload says 5; a run whose alarms are not all set by then
    /// fails, as its lateness would measure set-up).
    #[arg(long, default_value_t = 5.0)]
    pub alarm_lead_s: f64,
    /// W5: seconds from the start of setting the alarms to their due
    /// time; node 0 is killed once all are set, which must be before then.
    #[arg(long, default_value_t = 30.0)]
    pub w5_lead_s: f64,
    /// W1-durable-large: how many large actors (as many small ones, at
    /// most 16).
    #[arg(long, default_value_t = 4)]
    pub large_actors: usize,
    /// W1-durable-large: each large actor's database, in notes of about
    /// 1 MiB.
    #[arg(long, default_value_t = 1024)]
    pub large_mb: usize,
    /// W3: number of never-seen actors.
    #[arg(long, default_value_t = 200)]
    pub cold_actors: usize,
    /// W4: actors touched once after W1, then left to go idle.
    #[arg(long, default_value_t = 10_000)]
    pub idle_actors: usize,
    /// W12: actors open during the deploy (each holds two or three open
    /// files: the node needs an open-files limit of about twice this).
    #[arg(long, default_value_t = 10_000)]
    pub open_actors: usize,
    /// W8: WebSockets opened over its 100 rooms.
    #[arg(long, default_value_t = 10_000)]
    pub sockets: usize,
    /// Seed of the generator's choice of actors.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where the temporary data directories go (default: the system's
    /// temporary directory). Its file system decides what fsync costs.
    #[arg(long)]
    pub data_root: Option<PathBuf>,
    /// Keep the data directories and node logs, and print where they are.
    #[arg(long)]
    pub keep_data: bool,
    /// W1-durable: the bucket of the nodes it starts, `s3://bucket/prefix`
    /// (with the AWS_* environment, as `serve --bucket`) or `file:///path`.
    /// Default: a folder in the run's directory, which measures the
    /// runtime's side of replication but not a network round trip.
    #[arg(long)]
    pub bucket: Option<String>,
    /// Settings for every node the benchmark starts, as `KEY = VALUE`
    /// lines of `wasmkeep serve`'s configuration file (for instance
    /// `sqlite_page_bytes = 1024`). W4 adds its own `actor_idle_ms`
    /// [default: none].
    #[arg(long)]
    pub node_config: Option<PathBuf>,
    /// W6, W5-kill: the nodes' `lease_period_ms` (the node's default; the
    /// timings that must follow a shorter lease are set to match).
    #[arg(long, default_value_t = cluster::DEFAULT_LEASE_PERIOD_MS)]
    pub lease_period_ms: u64,
    /// W6, W5-kill: the nodes' `lease_grace_ms` (the node's default). A
    /// killed node's actors move after lease + grace at most.
    #[arg(long, default_value_t = cluster::DEFAULT_LEASE_GRACE_MS)]
    pub lease_grace_ms: u64,
    /// W6: the durability its increments name. `local` is W1's request
    /// (answered after the local commit), so that the ratio measures the
    /// forwarding; `replicated` is what a cluster node answers a request
    /// that names none (ADR 0034). W5-kill always sends `replicated`.
    #[arg(long, value_enum, default_value_t = ReplyDurability::Local)]
    pub w6_durability: ReplyDurability,
}

/// Runs the benchmark; an error if any run failed or any check failed.
pub fn run(args: BenchArgs) -> Result<()> {
    workloads::use_typescript(args.lang == "ts");
    // One thread: the generator must leave the cores to the node it measures.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run_async(args))
}

/// Refuses arguments no run can use.
fn check_args(args: &BenchArgs) -> Result<()> {
    if args.runs == 0 || args.connections == 0 || args.actors == 0 || args.alarms == 0 {
        bail!("--runs, --connections, --actors and --alarms must be at least 1");
    }
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !positive(args.alarm_lead_s) {
        bail!("--alarm-lead-s must be positive");
    }
    if !positive(args.measure_s) || !(args.warmup_s == 0.0 || positive(args.warmup_s)) {
        bail!("--measure-s must be positive and --warmup-s not negative");
    }
    if args.lease_period_ms < 300 {
        bail!("--lease-period-ms must be at least 300");
    }
    Ok(())
}

/// What every run of the invocation shares: the node to use (or none),
/// the durabilities, the directory the runs write in, the binary and the
/// compile cache of the nodes it starts, and the machine.
struct Invocation {
    server: Option<Endpoint>,
    durabilities: Vec<&'static str>,
    root: tempfile::TempDir,
    exe: PathBuf,
    compile_cache: PathBuf,
    machine: report::Machine,
}

/// Finds the node, the durabilities and the directories, and prints the
/// report's preamble.
async fn prepare(args: &BenchArgs) -> Result<Invocation> {
    let server = match &args.server {
        Some(url) => Some(Endpoint::parse(url).await?),
        None => None,
    };
    let durabilities: Vec<&'static str> = match (&server, args.durability) {
        (Some(_), _) => vec!["server"],
        (None, DurabilityArg::Fsync) => vec!["fsync"],
        (None, DurabilityArg::Process) => vec!["process"],
        (None, DurabilityArg::Both) => vec!["fsync", "process"],
    };
    let data_root = args.data_root.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&data_root)?;
    let root = tempfile::Builder::new()
        .prefix("wasmkeep-bench-")
        .tempdir_in(&data_root)
        .with_context(|| format!("create a directory under {}", data_root.display()))?;
    let exe = std::env::current_exe().context("find the wasmkeep binary")?;
    // A compile cache shared by every node of this invocation (or the one
    // the environment names): node start-up is in no figure but W2-restart's.
    let compile_cache = std::env::var_os("WASMKEEP_COMPILE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.path().join("compile-cache"));
    let machine = report::Machine::probe(root.path());
    eprintln!("{}", report::preamble(args, &machine, server.is_some()));
    Ok(Invocation {
        server,
        durabilities,
        root,
        exe,
        compile_cache,
        machine,
    })
}

/// Starts a node once, when the benchmark starts its own, so that every
/// run's node starts with compiled code.
async fn fill_compile_cache(args: &BenchArgs, inv: &Invocation) -> Result<()> {
    if inv.server.is_some() {
        return Ok(());
    }
    let t = crate::clock::now();
    workloads::warm_compile_cache(
        args,
        &inv.exe,
        inv.durabilities[0],
        &inv.compile_cache,
        &inv.root.path().join("warm-up"),
    )
    .await
    .context("start a node once to fill the compile cache")?;
    eprintln!(
        "compile cache filled by a first node ({:.1} s): every run's node starts with compiled code",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The workloads the report lists as not run: those left out of the
/// default set (when none is named), then those that cannot run here.
fn skipped_workloads(args: &BenchArgs, workloads: &[Workload], server: bool) -> Vec<Skipped> {
    let mut skipped = Vec::new();
    if args.workloads.is_none() {
        for &w in NOT_BY_DEFAULT {
            let reason = match w {
                Workload::W8 => {
                    "not in the default set (20,000 open files, about half a minute a run): \
                     ask for it with --workloads"
                }
                Workload::W1DurableLarge => {
                    "not in the default set (about 90 s and 15 GB of disk a run): \
                     ask for it with --workloads"
                }
                Workload::W12 => {
                    "not in the default set (10,000 open actors, a pool of 10,240 instances): \
                     ask for it with --workloads"
                }
                _ => {
                    "not in the default set (a 3-node cluster, about a minute a run): \
                     ask for it with --workloads"
                }
            };
            skipped.push(Skipped {
                workload: w.id(),
                reason,
            });
        }
    }
    for &w in workloads {
        if let Some(why) = w.unavailable(server) {
            skipped.push(Skipped {
                workload: w.id(),
                reason: why,
            });
        }
    }
    skipped
}

/// Runs workload `w` once on `env`.
async fn run_workload(w: Workload, env: &Env<'_>) -> Result<workloads::RunOutput> {
    match w {
        Workload::W1 => workloads::w1(env, false).await,
        Workload::W1Hot => workloads::w1(env, true).await,
        Workload::W2 => workloads::w2(env, false).await,
        Workload::W2Restart => workloads::w2(env, true).await,
        Workload::W1Ts => workloads::w1_ts(env).await,
        Workload::W1Recording => workloads::w1_recording(env).await,
        Workload::W1Traced => workloads::w1_traced(env).await,
        Workload::W3 => workloads::w3(env).await,
        Workload::W3Ts => workloads::w3_ts(env).await,
        Workload::W4 => workloads::w4(env).await,
        Workload::W4Open => workloads::w4_open(env).await,
        Workload::W1Durable => workloads::w1_durable(env).await,
        Workload::W1DurableLarge => large::w1_durable_large(env).await,
        Workload::W6 => cluster::w6(env).await,
        Workload::W5Kill => cluster::w5_kill(env).await,
        Workload::W5 => cluster::w5(env).await,
        Workload::W7 => outbox::w7(env).await,
        Workload::W7Workflows => outbox::w7_workflows(env).await,
        Workload::W8 => sockets::w8(env).await,
        Workload::W11 => isolation::w11(env).await,
        Workload::W12 => deploys::w12(env).await,
    }
}

/// Run `run` of workload `w` at `durability`, on a fresh node in a
/// directory of its own (or on `--server`): its record, with its wall time
/// and the machine's other load meanwhile.
async fn run_once(
    args: &BenchArgs,
    inv: &Invocation,
    w: Workload,
    durability: &'static str,
    run: usize,
) -> Result<RunRecord> {
    let dir = inv
        .root
        .path()
        .join(format!("{}-{durability}-{run}", w.id()));
    let target = match &inv.server {
        Some(ep) => Target::Server(ep.clone()),
        None => {
            std::fs::create_dir_all(&dir)?;
            Target::Own {
                exe: inv.exe.clone(),
                durability,
                compile_cache: inv.compile_cache.clone(),
                dir: dir.clone(),
            }
        }
    };
    let env = Env {
        args,
        target: &target,
        nonce: clock::now_ms(),
    };
    eprintln!("{} {durability} run {run}/{} …", w.id(), args.runs);
    let cpu0 = report::CpuSample::now();
    let t0 = crate::clock::now();
    let result = run_workload(w, &env).await;
    let mut record = RunRecord::new(w.id(), durability, run, result, &dir);
    record.wall_s = t0.elapsed().as_secs_f64();
    match (cpu0, report::CpuSample::now()) {
        // Against --server the node's CPU is "other": not measured.
        (Some(a), Some(b)) if inv.server.is_none() => {
            record.set_interference(b.since(&a), inv.machine.cpus)
        }
        _ => {}
    }
    eprintln!("  {}", record.one_line());
    // The run's directory stays until the end: deleting ten
    // thousand databases would load the disk during the next run.
    // W1-durable-large's are a few large files (about 15 GB a
    // run at the defaults), which three runs would not fit.
    if w == Workload::W1DurableLarge && !args.keep_data {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(record)
}

/// Prints the report (and writes its JSON), keeps the data if asked; an
/// error if any check failed.
fn finish(
    args: &BenchArgs,
    inv: Invocation,
    records: Vec<RunRecord>,
    skipped: Vec<Skipped>,
) -> Result<()> {
    let server = inv.server.is_some();
    let report = report::Report::new(args, inv.machine, server, records, skipped);
    println!("{}", report.table());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report.json())?)
            .with_context(|| format!("write {}", path.display()))?;
        println!("JSON: {}", path.display());
    }
    if args.keep_data {
        println!("data and node logs kept in {}", inv.root.keep().display());
    }
    let failures = report.failures();
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("FAILED: {f}");
        }
        bail!(
            "{} benchmark check(s) failed; the figures above are not valid",
            failures.len()
        );
    }
    Ok(())
}

/// Checks the arguments, runs every workload `--runs` times at each
/// durability, and reports.
async fn run_async(args: BenchArgs) -> Result<()> {
    check_args(&args)?;
    let workloads = args
        .workloads
        .clone()
        .unwrap_or_else(|| DEFAULT_WORKLOADS.to_vec());
    let inv = prepare(&args).await?;
    fill_compile_cache(&args, &inv).await?;
    let mut records = Vec::new();
    let skipped = skipped_workloads(&args, &workloads, inv.server.is_some());
    for &durability in &inv.durabilities {
        for &w in &workloads {
            if w.unavailable(inv.server.is_some()).is_some() {
                continue;
            }
            for run in 1..=args.runs {
                records.push(run_once(&args, &inv, w, durability, run).await?);
            }
        }
    }
    finish(&args, inv, records, skipped)
}
