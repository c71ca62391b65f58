//! `wasmkeep`: run a node, deploy apps, call and inspect actors.
//!
//! `serve` starts a node (the runtime plus its HTTP edge); every other
//! subcommand is a small HTTP client of a node's API. This binary holds no
//! logic of its own beyond wiring and printing.

mod bucket;
mod client;
mod config;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use wasmkeep_runtime::{Compile, Durability, Runtime, SystemClock};
use wasmkeep_server::UnsafeRules;

use crate::config::NodeConfig;

/// mimalloc instead of glibc's allocator: an actor's SQLite connection and
/// instance allocate on whichever worker runs it and free on another, and
/// glibc's arenas then make the workers wait on each other's arena locks
/// (seen in a profile of W2: workers asleep in `__lll_lock_wait_private`
/// under malloc and free while due alarms waited). mimalloc frees across
/// threads without that lock.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "wasmkeep",
    version,
    about = "Durable actors on WebAssembly and SQLite"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node.
    Serve(ServeArgs),
    /// Deploy (or replace) an app: `wasmkeep deploy TENANT/APP app.wasm`.
    Deploy {
        #[command(flatten)]
        conn: client::Conn,
        /// `tenant/app`
        target: String,
        /// The component (built for wasm32-wasip2).
        component: PathBuf,
        /// The app's TOML manifest.
        #[arg(long)]
        manifest: Option<PathBuf>,
    },
    /// Call an actor: `wasmkeep call -X POST demo/examples/counter/a/increment`.
    Call {
        #[command(flatten)]
        conn: client::Conn,
        /// `tenant/app/class/name[/path][?query]`; percent-encode a name
        /// that contains `/` (`a%2Fb`).
        target: String,
        #[arg(short = 'X', long, default_value = "GET")]
        method: String,
        /// Request body.
        #[arg(short, long)]
        data: Option<String>,
    },
    /// List actors of a class by name.
    Actors {
        #[command(flatten)]
        conn: client::Conn,
        /// `tenant/app/class`
        target: String,
        #[arg(long)]
        after: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Show an actor (size, alarm), or run read-only SQL on its database.
    Inspect {
        #[command(flatten)]
        conn: client::Conn,
        /// `tenant/app/class/name`
        target: String,
        /// A read-only statement; internal tables are visible here.
        #[arg(long)]
        sql: Option<String>,
        /// List the actor's tables.
        #[arg(long)]
        tables: bool,
    },
    /// List a tenant's pending alarms, earliest first.
    Alarms {
        #[command(flatten)]
        conn: client::Conn,
        tenant: String,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Set, remove or list an app's secrets on a node (ADR 0041):
    /// `wasmkeep secret set acme/shop API_KEY` reads the value from stdin.
    Secret {
        #[command(flatten)]
        conn: client::Conn,
        /// `set`, `delete` or `list`.
        action: String,
        /// `tenant/app`
        target: String,
        /// The secret's name (not for `list`).
        name: Option<String>,
    },
    /// List deployed apps.
    Apps {
        #[command(flatten)]
        conn: client::Conn,
    },
    /// Show the cluster's live nodes: addresses, epochs, lease ages, held
    /// actors (`GET /admin/v1/cluster`).
    Cluster {
        #[command(flatten)]
        conn: client::Conn,
    },
    /// Write an actor's database, as the bucket holds it, to a plain SQLite
    /// file: `wasmkeep export --bucket s3://b/p demo/examples/counter/a -o a.db`.
    Export {
        /// `s3://bucket/prefix` (AWS_* environment) or `file:///path`.
        #[arg(long, env = "WASMKEEP_BUCKET")]
        bucket: String,
        /// `tenant/app/class/name`; percent-encode a name that contains `/`.
        target: String,
        /// The point to export: a sequence number (`42`), unix milliseconds
        /// (`1764471600000ms`) or an RFC 3339 time; default: the latest.
        #[arg(long)]
        at: Option<String>,
        /// The file to write (must not exist).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Make a SQLite file an actor's latest state in the bucket (a node
    /// holding the actor restores it on its next upload).
    Restore {
        #[arg(long, env = "WASMKEEP_BUCKET")]
        bucket: String,
        /// `tenant/app/class/name`
        target: String,
        /// The SQLite file (for example one `export` wrote).
        #[arg(short, long)]
        input: PathBuf,
    },
    /// Upload every actor of a (stopped) node's data folder that the bucket
    /// does not hold yet, as the first entry of its chain.
    Upload {
        #[arg(long, env = "WASMKEEP_BUCKET")]
        bucket: String,
        /// The node's data folder.
        #[arg(long)]
        data: PathBuf,
    },
    /// Run the benchmark workloads (docs/benchmarks.md) against nodes it
    /// starts itself, or against `--server URL`.
    Bench(wasmkeep_bench::BenchArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Data directory (actors' databases, deployed apps).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// A TOML configuration file (see the README's table).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Also deploy the bundled examples as tenant `demo`, app `examples`.
    #[arg(long)]
    examples: bool,
    /// `fsync` (default) or `process`.
    #[arg(long, value_parser = parse_durability)]
    durability: Option<Durability>,
    /// Allow a non-loopback address without an admin token: actors are then
    /// open to the network, while the admin API still answers only to
    /// loopback peers.
    #[arg(long)]
    insecure: bool,
    /// Token for the admin API.
    #[arg(long, env = "WASMKEEP_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Replicate every actor to this bucket: `s3://bucket/prefix` (endpoint,
    /// region and credentials from AWS_ENDPOINT_URL, AWS_REGION,
    /// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ALLOW_HTTP) or
    /// `file:///path`.
    #[arg(long, env = "WASMKEEP_BUCKET")]
    bucket: Option<String>,
    /// Join the cluster on `--bucket`, reachable by other nodes at this
    /// address (`http://HOST:PORT`). Without it `--bucket` only replicates.
    #[arg(long)]
    advertise: Option<String>,
    /// The secret every node of the cluster shares (needed when listening
    /// beyond loopback).
    #[arg(long, env = "WASMKEEP_CLUSTER_TOKEN", hide_env_values = true)]
    cluster_token: Option<String>,
}

fn parse_durability(s: &str) -> Result<Durability, String> {
    match s {
        "fsync" => Ok(Durability::Fsync),
        "process" => Ok(Durability::Process),
        _ => Err(format!("unknown durability `{s}`: use fsync or process")),
    }
}

/// The hidden first argument that makes this binary a compile worker (see
/// `wasmkeep_runtime::compile_process`): a node compiles hostile components
/// in a child running its own program, never on its own threads.
const COMPILE_WORKER: &str = "__compile-worker";

/// A user's mistake is one line on stderr and exit code 1, whatever
/// `RUST_BACKTRACE` says (issue 22): no backtrace for a typo.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(COMPILE_WORKER) {
        std::process::exit(wasmkeep_runtime::compile_process::worker_main(&args[2..]));
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Deploy {
            conn,
            target,
            component,
            manifest,
        } => client::deploy(&conn, &target, &component, manifest.as_deref()),
        Command::Call {
            conn,
            target,
            method,
            data,
        } => client::call(&conn, &target, &method, data),
        Command::Actors {
            conn,
            target,
            after,
            limit,
        } => client::actors(&conn, &target, after, limit),
        Command::Inspect {
            conn,
            target,
            sql,
            tables,
        } => client::inspect(&conn, &target, sql, tables),
        Command::Alarms {
            conn,
            tenant,
            limit,
        } => client::alarms(&conn, &tenant, limit),
        Command::Apps { conn } => client::apps(&conn),
        Command::Secret {
            conn,
            action,
            target,
            name,
        } => client::secret(&conn, &action, &target, name.as_deref()),
        Command::Cluster { conn } => client::cluster(&conn),
        Command::Export {
            bucket,
            target,
            at,
            output,
        } => bucket::export(&bucket, &target, at.as_deref(), &output),
        Command::Restore {
            bucket,
            target,
            input,
        } => bucket::restore(&bucket, &target, &input),
        Command::Upload { bucket, data } => bucket::upload(&bucket, &data),
        Command::Bench(args) => wasmkeep_bench::run(args),
    }
}

fn serve(args: ServeArgs) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WASMKEEP_LOG")
                .unwrap_or_else(|_| "info,cranelift=warn,wasmtime=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut cfg = match &args.config {
        Some(p) => NodeConfig::load(p)?,
        None => NodeConfig::default(),
    };
    if let Some(d) = args.data {
        cfg.data = d;
    }
    if let Some(l) = args.listen {
        cfg.listen = l;
    }
    if let Some(d) = args.durability {
        cfg.durability = d;
    }
    if args.insecure {
        cfg.insecure = true;
    }
    if args.admin_token.is_some() {
        cfg.admin_token = args.admin_token;
    }
    if args.bucket.is_some() {
        cfg.bucket = args.bucket;
    }
    if args.advertise.is_some() {
        cfg.advertise = args.advertise;
    }
    if args.cluster_token.is_some() {
        cfg.cluster_token = args.cluster_token;
    }
    cfg.check_exposure()?;
    let cluster = cfg.cluster()?;
    // Rules a test-faults build was asked to switch off (none otherwise),
    // applied before the runtime opens a database.
    let unsafe_rules = UnsafeRules::from_env().map_err(anyhow::Error::msg)?;
    unsafe_rules.apply_to_process();
    let mut rc = cfg.runtime();
    if cfg.compile_in_child {
        rc.compile = Compile::Process {
            program: std::env::current_exe().context("find this program to run compile workers")?,
            args: vec![COMPILE_WORKER.into()],
            // mimalloc reserves address space in 1 GiB arenas, writable,
            // which counts against the worker's data limit whole and would
            // make the limit refuse a small compilation; without arenas it
            // maps what it uses.
            env: vec![("MIMALLOC_ARENA_RESERVE".into(), "0".into())],
        };
    }
    if let Some(url) = &cfg.bucket {
        rc.bucket =
            Some(wasmkeep_replica::Bucket::from_url(url).with_context(|| format!("bucket {url}"))?);
    }
    // One bucket (and so one set of request counters) for replication and
    // the cluster protocol: `wasmkeep_bucket_*` counts both.
    let bucket = rc.bucket.clone();
    let rt = Runtime::start(rc, Arc::new(SystemClock))
        .with_context(|| format!("start the runtime on {}", cfg.data.display()))?;
    let examples = if args.examples {
        let info = rt
            .deploy("demo", "examples", wasmkeep_guests::DEMO, "")
            .context("deploy the bundled examples")?;
        Some(info.classes)
    } else {
        None
    };
    let stop_asked = Arc::new(std::sync::OnceLock::new());
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .build()?;
    tokio.block_on(async {
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .with_context(|| format!("listen on {}", cfg.listen))?;
        let addr = listener.local_addr()?;
        let base = format!("http://{addr}");
        // The handlers are in place before the node says it listens: a
        // SIGTERM or Ctrl-C right after that line stops it cleanly instead
        // of killing it (tokio installs a handler only when asked).
        #[cfg(unix)]
        let (mut term, mut int) = {
            use tokio::signal::unix::{SignalKind, signal};
            (
                signal(SignalKind::terminate()).context("install a SIGTERM handler")?,
                signal(SignalKind::interrupt()).context("install a SIGINT handler")?,
            )
        };
        // The node takes its next epoch (durably) before it says it listens.
        let node = match (&cluster, &bucket) {
            (Some(settings), Some(bucket)) => {
                let node = wasmkeep_server::cluster::ClusterNode::start(
                    settings.clone(),
                    bucket.clone(),
                    &cfg.data,
                )
                .context("start cluster mode")?;
                let mut node = node;
                node.attach_runtime(&rt);
                Some(node)
            }
            _ => None,
        };
        println!(
            "wasmkeep {} listening on {base} (data: {}, durability: {:?}, bucket: {})",
            env!("CARGO_PKG_VERSION"),
            cfg.data.display(),
            cfg.durability,
            cfg.bucket.as_deref().unwrap_or("none")
        );
        if let Some(classes) = examples {
            print_examples(addr, &classes);
        }
        use std::io::Write;
        std::io::stdout().flush()?;
        let asked = Arc::clone(&stop_asked);
        let state = node.as_ref().map(|n| n.state());
        let stopping_rt = rt.clone();
        let drain = std::time::Duration::from_millis(cfg.shutdown_drain_ms);
        let linger = std::time::Duration::from_millis(cfg.cluster_owner_cache_ttl_ms);
        let shutdown = async move {
            #[cfg(unix)]
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
            #[cfg(not(unix))]
            let _ = tokio::signal::ctrl_c().await;
            let started = std::time::Instant::now();
            let _ = asked.set(started);
            tracing::info!("shutting down");
            // Open WebSockets hear 1001 now, while the node can still
            // write to them (ADR 0043); their clients reconnect elsewhere.
            stopping_rt.sockets().close_all(
                None,
                wasmkeep_runtime::sockets::close_code::GOING_AWAY,
                "the node is stopping: reconnect",
            );
            // A cluster node hands its actors over with its listener still
            // open: closing it first would reset forwards already on their
            // way, whose sender cannot tell whether they ran. New actor
            // requests get 503 node_not_acting (a forwarding node routes
            // again), those in flight finish, queued events and uploads
            // finish, the holds and the lease are released; then it lingers
            // for the owner cache's lifetime, so no node still sends here
            // when the listener closes.
            if let Some(node) = node {
                let state = node.state();
                state.start_draining();
                while state.in_flight() > 0 && started.elapsed() < drain {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                let left = drain.saturating_sub(started.elapsed());
                let _ = tokio::task::spawn_blocking(move || stopping_rt.shutdown(left)).await;
                node.release().await;
                tokio::time::sleep(linger).await;
            }
        };
        let mut server = cfg.server();
        server.cluster = state;
        server.unsafe_rules = unsafe_rules;
        if server.unsafe_rules.any() {
            tracing::warn!(rules = ?server.unsafe_rules, "safety rules switched off for a test ({})", wasmkeep_server::unsafe_rules::ENV);
        }
        let served = wasmkeep_server::serve(rt.clone(), server, listener, shutdown).await;
        served?;
        anyhow::Ok(())
    })?;
    // One budget for stopping: what the connections' drain left of
    // `shutdown_drain_ms` is what running events get before every guest
    // statement is stopped.
    let drain = std::time::Duration::from_millis(cfg.shutdown_drain_ms);
    let spent = stop_asked.get().map(|t| t.elapsed()).unwrap_or_default();
    rt.shutdown(drain.saturating_sub(spent));
    Ok(())
}

/// Prints what to try on the bundled examples. The commands go through
/// loopback: without an admin token the admin API answers nothing else
/// (and no `Host` but a loopback one), and 0.0.0.0 is no address to send to.
fn print_examples(addr: std::net::SocketAddr, classes: &[String]) {
    let mut local = addr;
    if local.ip().is_unspecified() {
        local.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let base = format!("http://{local}");
    println!(
        "examples deployed as demo/examples (classes: {}). Try:",
        classes.join(", ")
    );
    println!("  curl -X POST {base}/v1/demo/examples/counter/hello/increment");
    println!("  curl {base}/v1/demo/examples/counter/hello/value");
    println!("  curl -X POST '{base}/v1/demo/examples/notes/mine/notes?title=first' -d 'hello'");
    println!("  curl {base}/v1/demo/examples/notes/mine/notes");
    println!("  curl -X POST '{base}/v1/demo/examples/reminder/r1/set?at_ms=<unix ms>'");
    println!("  curl {base}/admin/v1/actors/demo/examples/counter");
}
