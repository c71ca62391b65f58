//! `wasmkeep`: run a node, deploy apps, call and inspect actors.
//!
//! `serve` starts a node (the runtime plus its HTTP edge); every other
//! subcommand is a small HTTP client of a node's API. This binary holds no
//! logic of its own beyond wiring and printing.

mod bucket;
mod client;
mod config;
mod dev;
mod output;
mod project;
mod scaffold;

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
        #[command(flatten)]
        what: client::DeployArgs,
    },
    /// List an app's kept versions, newest first: every deploy is one
    /// (`app_versions_max` are kept).
    Versions {
        #[command(flatten)]
        conn: client::Conn,
        /// `tenant/app`
        target: String,
    },
    /// Deploy a kept version of an app again (its component and its
    /// manifest), as a new version; the actors keep their data.
    Rollback {
        #[command(flatten)]
        conn: client::Conn,
        /// `tenant/app`
        target: String,
        /// The version to return to [default: the one before the current].
        #[arg(long)]
        to: Option<u64>,
    },
    /// Replay recorded events of an app's actors against a new build and
    /// show what it does differently (the app must record, ADR 0062):
    /// `wasmkeep replay acme/shop --with new.wasm`. Exits 1 if it differs.
    Replay {
        #[command(flatten)]
        conn: client::Conn,
        #[command(flatten)]
        what: client::ReplayArgs,
    },
    /// Call an actor: `wasmkeep call -X POST demo/examples/counter/a/increment`.
    Call {
        #[command(flatten)]
        conn: client::Conn,
        /// `tenant/app/class/name[/path][?query]`; percent-encode a name
        /// that contains `/` (`a%2Fb`).
        target: String,
        /// The HTTP method.
        #[arg(short = 'X', long, default_value = "GET")]
        method: String,
        /// Request body (default: none).
        #[arg(short, long)]
        data: Option<String>,
    },
    /// List actors of a class by name.
    Actors {
        #[command(flatten)]
        conn: client::Conn,
        /// `tenant/app/class`
        target: String,
        #[command(flatten)]
        query: client::ActorsQuery,
    },
    /// Show an actor (size, alarm), or run read-only SQL on its database.
    Inspect {
        #[command(flatten)]
        conn: client::Conn,
        /// `tenant/app/class/name`, the name percent-encoded as in its URL.
        target: String,
        /// A read-only statement; internal tables are visible here
        /// [default: none: the actor's summary].
        #[arg(long, conflicts_with_all = ["tables", "kv", "workflows"])]
        sql: Option<String>,
        /// List the actor's tables.
        #[arg(long, conflicts_with_all = ["kv", "workflows"])]
        tables: bool,
        /// List the actor's workflow instances (the SDKs' `workflow`),
        /// latest first, each with its state and the steps it recorded
        /// (`name:attempts`).
        #[arg(long, conflicts_with = "kv")]
        workflows: bool,
        /// List the actor's key-value pairs (`kv.*`), values as text where
        /// they are UTF-8, `x'…'` hex otherwise.
        #[arg(long)]
        kv: bool,
        /// With `--kv`: only keys that start with this (default: all).
        #[arg(long, requires = "kv", default_value = "")]
        prefix: String,
        /// With `--kv`: at most this many pairs, in key order.
        #[arg(long, requires = "kv", default_value_t = 100)]
        limit: usize,
    },
    /// List a tenant's pending alarms, earliest first.
    Alarms {
        #[command(flatten)]
        conn: client::Conn,
        tenant: String,
        /// At most this many alarms.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Print a node's recent log lines about a tenant, app, class or actor
    /// (the actor's own lines, failed alarms and requests, and access lines
    /// when the access log is on), and with `--follow` each new one.
    Logs {
        #[command(flatten)]
        conn: client::Conn,
        /// `tenant[/app[/class[/name]]]`, the name as it is (`a/b`, not
        /// percent-encoded: the CLI encodes it).
        scope: String,
        /// Keep printing new lines as they come, until Ctrl-C or the node
        /// stops.
        #[arg(short, long)]
        follow: bool,
        /// The lowest level shown: trace, debug, info, warn or error.
        #[arg(long, default_value = "info")]
        level: String,
        /// How many of the kept lines to print first.
        #[arg(long, default_value_t = 100)]
        lines: usize,
    },
    /// Make a new actor project in `./NAME`: a Rust crate (Cargo.toml,
    /// src/lib.rs: a counter with an alarm, a test with the test kit), or
    /// with `--lang ts` a TypeScript package (package.json and its lock
    /// file, tsconfig.json, src/index.ts, tests).
    New(scaffold::NewArgs),
    /// Build an actor project's component, a Rust crate or a TypeScript
    /// package, and print its path.
    Build(BuildArgs),
    /// Run a node for one actor crate and keep it deployed: build, deploy,
    /// then rebuild and redeploy on every saved change, printing each
    /// request and the actor's log lines.
    Dev(dev::DevArgs),
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
    /// Move a cluster node's actors to the other nodes while it keeps
    /// serving (it forwards their requests rather than refuse them, and
    /// takes no new actor), then wait until it holds none: stop it then, or
    /// end the drain with `--undo`. `wasmkeep drain 1b36b488df81ce377ba5488a9be996b1`, or
    /// the node's address: `wasmkeep drain http://10.0.0.7:8080`.
    Drain {
        #[command(flatten)]
        conn: client::Conn,
        /// The node: its id (as `wasmkeep cluster` lists it, looked up
        /// through `--server`) or its address (`http://host:port`).
        node: String,
        /// End a drain instead: the node takes actors again.
        #[arg(long)]
        undo: bool,
        /// How long to wait for the node to hold no actor (0: start the
        /// drain and do not wait).
        #[arg(long, default_value_t = 120_000)]
        wait_ms: u64,
    },
    /// Write an actor's database to a plain SQLite file: through the node
    /// that runs it (`--server`, the default: every write it acknowledged,
    /// from any node, with or without a bucket), or, with `--bucket`, as
    /// the bucket holds it, now or at a past point (`--at`):
    /// `wasmkeep export demo/examples/counter/a -o a.db`.
    Export {
        #[command(flatten)]
        conn: client::Conn,
        /// Read the bucket directly instead of asking a node:
        /// `s3://bucket/prefix` (AWS_* environment) or `file:///path`
        /// (or WASMKEEP_BUCKET) [default: through the node at --server].
        #[arg(long, env = "WASMKEEP_BUCKET")]
        bucket: Option<String>,
        /// `tenant/app/class/name`, the name percent-encoded as in its URL.
        target: String,
        /// With --bucket, the point to export: a sequence number (`42`),
        /// unix milliseconds (`1764471600000ms`) or an RFC 3339 time;
        /// default: the latest.
        #[arg(long)]
        at: Option<String>,
        /// The file to write (required; it must not exist).
        #[arg(short, long)]
        output: PathBuf,
        /// The nodes' configuration file: its replica bounds
        /// (`database_bytes_max`, `replica_snapshot_*`) and lease timings
        /// are the ones this command reads the bucket with [default: none,
        /// every setting at its default].
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Make a SQLite file an actor's database: through the node that runs
    /// it (`--server`, the default), as the actor's next event, so that
    /// every write acknowledged before is kept (in the bucket's history,
    /// or beside the database) and every one after builds on it (at most
    /// 256 MiB, `restore_bytes_max`); or, with `--bucket`, straight into
    /// the bucket while no node runs the actor, any size.
    Restore {
        #[command(flatten)]
        conn: client::Conn,
        /// Write into this bucket directly instead of through a node (no
        /// node may be running on it: refused while a cluster node's lease
        /// is live) [default: through the node at --server].
        #[arg(long)]
        bucket: Option<String>,
        /// With --bucket: write even though cluster nodes are live (a node
        /// holding the actor then drops its writes that were not uploaded
        /// yet, and keeps them aside in its data folder).
        #[arg(long)]
        force: bool,
        /// `tenant/app/class/name`, the name percent-encoded as in its URL.
        target: String,
        /// The SQLite file (required; for example one `export` wrote).
        #[arg(short, long)]
        input: PathBuf,
        /// With --bucket: the nodes' configuration file, as for `export`
        /// [default: none, every setting at its default].
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Copy an actor, as the bucket holds it now or at a past point, to a
    /// new actor through the node: `wasmkeep fork --bucket s3://b/p
    /// demo/examples/counter/a demo/examples/counter/a-before --at
    /// 2026-12-04T10:00:00Z`. The source is not touched; an existing
    /// target is refused unless --replace.
    Fork {
        #[command(flatten)]
        conn: client::Conn,
        /// The bucket the nodes replicate to (required, here or in
        /// WASMKEEP_BUCKET).
        #[arg(long, env = "WASMKEEP_BUCKET")]
        bucket: String,
        /// The actor to copy, `tenant/app/class/name`.
        source: String,
        /// The new actor, `tenant/app/class/name` (its app and class must be
        /// deployed).
        target: String,
        /// The point to copy, as for `export` (a sequence number,
        /// `<unix ms>ms` or an RFC 3339 time) [default: the latest].
        #[arg(long)]
        at: Option<String>,
        /// Replace the target if it exists (its state stays in the
        /// bucket's history, as after `restore`).
        #[arg(long)]
        replace: bool,
        /// The nodes' configuration file, as for `export` [default: none].
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Upload every actor of a (stopped) node's data folder that the bucket
    /// does not hold yet, as the first entry of its chain.
    Upload {
        /// The bucket, as for `export` (required, here or in
        /// WASMKEEP_BUCKET).
        #[arg(long, env = "WASMKEEP_BUCKET")]
        bucket: String,
        /// The node's data folder (required).
        #[arg(long)]
        data: PathBuf,
        /// The nodes' configuration file: its replica bounds
        /// (`database_bytes_max`, `replica_snapshot_*`) and lease timings
        /// are the ones this command reads the bucket with [default: none,
        /// every setting at its default].
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Run the benchmark workloads (docs/benchmarks.md) against nodes it
    /// starts itself, or against `--server URL`.
    Bench(wasmkeep_bench::BenchArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Data directory (actors' databases, deployed apps) [default:
    /// ./wasmkeep-data, or the config file's `data`].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080, or the config
    /// file's `listen`].
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// A TOML configuration file (see the README's table) [default: none,
    /// every setting at its default].
    #[arg(long)]
    config: Option<PathBuf>,
    /// Also deploy the bundled examples as tenant `demo`: app `examples`
    /// (Rust) and app `examples-ts` (the same routes, in TypeScript).
    #[arg(long)]
    examples: bool,
    /// `fsync` or `process` [default: fsync, or the config file's
    /// `durability`].
    #[arg(long, value_parser = parse_durability)]
    durability: Option<Durability>,
    /// Allow a non-loopback address without an admin token: actors are then
    /// open to the network, while the admin API still answers only to
    /// loopback peers.
    #[arg(long)]
    insecure: bool,
    /// Token for the admin API [default: none: the admin API answers
    /// loopback peers only].
    #[arg(long, env = "WASMKEEP_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Replicate every actor to this bucket: `s3://bucket/prefix` (endpoint,
    /// region and credentials from AWS_ENDPOINT_URL, AWS_REGION,
    /// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ALLOW_HTTP) or
    /// `file:///path` [default: none: no replication].
    #[arg(long, env = "WASMKEEP_BUCKET")]
    bucket: Option<String>,
    /// Join the cluster on `--bucket`, reachable by other nodes at this
    /// address (`http://HOST:PORT`). Without it (the default) `--bucket`
    /// only replicates.
    #[arg(long)]
    advertise: Option<String>,
    /// The secret every node of the cluster shares (needed when listening
    /// beyond loopback) [default: none].
    #[arg(long, env = "WASMKEEP_CLUSTER_TOKEN", hide_env_values = true)]
    cluster_token: Option<String>,
    /// Export the spans of traced requests over OTLP/HTTP to this collector
    /// (`http://HOST:PORT`; `/v1/traces` is added) [default: none: spans stay
    /// in the node's ring, for the console and `/admin/v1/traces`].
    #[arg(long, env = "WASMKEEP_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Test mode, for test kits: the node's clock starts at START_MS (unix
    /// milliseconds) and stands still until `POST
    /// /admin/v1/test/clock?advance_ms=N` moves it, running the alarms that
    /// come due on the way. Only on a loopback address, not in a cluster
    /// [default: none: the real clock].
    #[arg(long, value_name = "START_MS")]
    test_clock: Option<u64>,
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
    let cli = parse_args();
    let out = |conn: &client::Conn| output::Output { json: conn.json };
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Deploy { conn, what } => client::deploy(&conn, out(&conn), &what),
        Command::Versions { conn, target } => client::versions(&conn, out(&conn), &target),
        Command::Rollback { conn, target, to } => client::rollback(&conn, out(&conn), &target, to),
        Command::Replay { conn, what } => client::replay(&conn, out(&conn), &what),
        Command::Call {
            conn,
            target,
            method,
            data,
        } => client::call(&conn, &target, &method, data),
        Command::Actors {
            conn,
            target,
            query,
        } => client::actors(&conn, out(&conn), &target, query),
        Command::Inspect {
            conn,
            target,
            sql,
            tables,
            kv,
            workflows,
            prefix,
            limit,
        } => {
            let what = inspect_what(sql, tables, kv, workflows, prefix, limit);
            client::inspect(&conn, out(&conn), &target, what)
        }
        Command::Alarms {
            conn,
            tenant,
            limit,
        } => client::alarms(&conn, out(&conn), &tenant, limit),
        Command::Logs {
            conn,
            scope,
            follow,
            level,
            lines,
        } => client::logs(&conn, out(&conn), &scope, follow, &level, lines),
        Command::New(args) => scaffold::new(args),
        Command::Build(args) => build(args),
        Command::Dev(args) => dev::run(args),
        Command::Apps { conn } => client::apps(&conn, out(&conn)),
        Command::Secret {
            conn,
            action,
            target,
            name,
        } => client::secret(&conn, out(&conn), &action, &target, name.as_deref()),
        Command::Cluster { conn } => client::cluster(&conn, out(&conn)),
        Command::Drain {
            conn,
            node,
            undo,
            wait_ms,
        } => client::drain(&conn, out(&conn), &node, undo, wait_ms),
        Command::Restore {
            conn,
            bucket: None,
            target,
            input,
            ..
        } => client::restore(&conn, out(&conn), &target, &input),
        Command::Fork {
            conn,
            bucket,
            source,
            target,
            at,
            replace,
            config,
        } => client::fork(
            &conn,
            out(&conn),
            &client::Fork {
                bucket: &bucket,
                settings: &bucket::Settings::of(config.as_deref())?,
                source: &source,
                target: &target,
                at: at.as_deref(),
                replace,
            },
        ),
        c @ (Command::Export { .. } | Command::Restore { .. } | Command::Upload { .. }) => {
            bucket_command(c)
        }
        Command::Bench(args) => wasmkeep_bench::run(args),
    }
}

/// What `inspect`'s flags ask for (clap keeps them apart).
fn inspect_what(
    sql: Option<String>,
    tables: bool,
    kv: bool,
    workflows: bool,
    prefix: String,
    limit: usize,
) -> client::InspectWhat {
    use client::InspectWhat;
    match (sql, tables, kv) {
        (Some(sql), _, _) => InspectWhat::Sql(sql),
        (None, true, _) => InspectWhat::Tables,
        (None, false, true) => InspectWhat::Kv { prefix, limit },
        (None, false, false) if workflows => InspectWhat::Workflows,
        (None, false, false) => InspectWhat::Summary,
    }
}

/// The command line; a mistake in it exits 1 like every other mistake
/// (clap's own is 2), `--help` and `--version` exit 0.
fn parse_args() -> Cli {
    Cli::try_parse().unwrap_or_else(|e| {
        let _ = e.print();
        std::process::exit(if e.use_stderr() { 1 } else { 0 })
    })
}

/// The commands that read or write the bucket directly, with the nodes'
/// settings (`--config`), and `export` through a node.
fn bucket_command(command: Command) -> Result<()> {
    match command {
        Command::Export {
            conn,
            bucket: None,
            target,
            at,
            output,
            ..
        } => client::export(&conn, &target, at.as_deref(), &output),
        Command::Export {
            bucket: Some(bucket),
            target,
            at,
            output,
            config,
            ..
        } => bucket::export(
            &bucket,
            &bucket::Settings::of(config.as_deref())?,
            &target,
            at.as_deref(),
            &output,
        ),
        Command::Restore {
            bucket: Some(bucket),
            force,
            target,
            input,
            config,
            ..
        } => bucket::restore(
            &bucket,
            &bucket::Settings::of(config.as_deref())?,
            &target,
            &input,
            force,
        ),
        Command::Upload {
            bucket,
            data,
            config,
        } => bucket::upload(&bucket, &bucket::Settings::of(config.as_deref())?, &data),
        _ => unreachable!("not a bucket command"),
    }
}

/// The node's log on stderr: `WASMKEEP_LOG` (an `EnvFilter`) or
/// `default`; colours only when stderr is a terminal and `NO_COLOR` is
/// unset.
#[derive(clap::Args)]
struct BuildArgs {
    /// The actor project [default: the current directory].
    path: Option<PathBuf>,
}

/// `wasmkeep build`: the project's component, built as `dev` builds it.
fn build(args: BuildArgs) -> Result<()> {
    let dir = match args.path {
        Some(p) => p,
        None => std::env::current_dir().context("find the current directory")?,
    };
    let started = wasmkeep_runtime::clock::instant();
    let out = project::build(&dir)?;
    let bytes = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    println!(
        "built {} ({bytes} bytes) in {:.1} s",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

pub(crate) fn init_tracing(default: &str) {
    use std::io::IsTerminal;
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WASMKEEP_LOG")
                .unwrap_or_else(|_| default.into()),
        )
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        .init();
}

/// Called once the node listens, with its runtime and address (`dev`
/// starts its build loop there).
pub(crate) type OnListening = Box<dyn FnOnce(Runtime, std::net::SocketAddr) + Send>;

fn serve(args: ServeArgs) -> Result<()> {
    init_tracing("info,cranelift=warn,wasmtime=warn");
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
    if args.otlp_endpoint.is_some() {
        cfg.otlp_endpoint = args.otlp_endpoint;
    }
    let test_clock = match args.test_clock {
        Some(start_ms) => {
            if !cfg.listen.ip().is_loopback() || cfg.advertise.is_some() {
                anyhow::bail!(
                    "--test-clock is for tests on one machine: it needs a loopback --listen (got {}) and no --advertise",
                    cfg.listen
                );
            }
            Some(Arc::new(wasmkeep_runtime::ManualClock::new(start_ms)))
        }
        None => None,
    };
    run_node(cfg, args.examples, None, test_clock)
}

/// Raises the soft bound on open files to the hard one: a node holds a
/// descriptor per connection and socket (`connections_max` 1,024 and
/// `sockets_max` besides) and two per open database (the file and its
/// log), and many systems start processes with a soft bound of 1,024.
/// Says when even the hard bound keeps open databases below
/// `instances_max`: past `open_databases_max` (derived from the bound)
/// the least recently used open actors close their databases and keep
/// their instances (ADR 0068), and each event of such an actor opens its
/// database again. (`sockets_max` is a ceiling far above what most nodes
/// hold and is left out.)
fn raise_open_files_limit(cfg: &NodeConfig) {
    let need = 2 * u64::from(cfg.instances_max) + wasmkeep_runtime::OPEN_FILES_KEPT;
    // SAFETY: `getrlimit` fills the plain struct it is given; `setrlimit`
    // only changes this process's own soft bound, within the hard one.
    unsafe {
        let mut l: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return;
        }
        if l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                tracing::warn!(error = %std::io::Error::last_os_error(), "could not raise the open files limit");
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
            }
        }
        if (l.rlim_cur as u64) < need && cfg.open_databases_max == 0 {
            tracing::info!(
                limit = l.rlim_cur as u64,
                need,
                instances_max = cfg.instances_max,
                open_databases_max = wasmkeep_runtime::open_databases_max_for(0, l.rlim_cur as u64),
                "the open files limit holds fewer databases than instances (two files each): past open_databases_max the least recently used open actors close their databases and keep their instances, and open them again at their next event; raise the limit (ulimit -n, systemd's LimitNOFILE) to keep them all open"
            );
        }
    }
}

/// Runs a node with `cfg` until SIGTERM or Ctrl-C.
/// `test_clock`: the clock of a node in test mode (`--test-clock`).
pub(crate) fn run_node(
    cfg: NodeConfig,
    examples: bool,
    on_listening: Option<OnListening>,
    test_clock: Option<Arc<wasmkeep_runtime::ManualClock>>,
) -> Result<()> {
    cfg.check_exposure()?;
    let cluster = cfg.cluster()?;
    raise_open_files_limit(&cfg);
    // Rules a test-faults build was asked to switch off (none otherwise),
    // applied before the runtime opens a database.
    let unsafe_rules = UnsafeRules::from_env().map_err(anyhow::Error::msg)?;
    unsafe_rules.apply_to_process();
    let rc = runtime_config(&cfg)?;
    // One bucket (and so one set of request counters) for replication and
    // the cluster protocol: `wasmkeep_bucket_*` counts both.
    let bucket = rc.bucket.clone();
    let clock: Arc<dyn wasmkeep_runtime::Clock> = match &test_clock {
        Some(c) => Arc::clone(c) as _,
        None => Arc::new(SystemClock),
    };
    let rt = Runtime::start(rc, clock)
        .with_context(|| format!("start the runtime on {}", cfg.data.display()))?;
    let examples = if examples {
        let info = rt
            .deploy("demo", "examples", wasmkeep_guests::DEMO, "")
            .context("deploy the bundled examples")?;
        // The same classes in TypeScript, answering the same routes. Its
        // first deploy compiles QuickJS (about two seconds); the compile
        // cache keeps it for the next start.
        rt.deploy("demo", "examples-ts", wasmkeep_guests::EXAMPLES_TS, "")
            .context("deploy the bundled examples in TypeScript")?;
        Some(info.classes)
    } else {
        None
    };
    let stop_asked = Arc::new(std::sync::OnceLock::new());
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .build()?;
    tokio.block_on(serve_node(Serving {
        cfg: &cfg,
        cluster: &cluster,
        bucket: &bucket,
        rt: &rt,
        stop_asked: &stop_asked,
        examples,
        on_listening,
        unsafe_rules,
        test_clock,
    }))?;
    // One budget for stopping: what the connections' drain left of
    // `shutdown_drain_ms` is what running events get before every guest
    // statement is stopped.
    let drain = std::time::Duration::from_millis(cfg.shutdown_drain_ms);
    let spent = stop_asked.get().map(|t| t.elapsed()).unwrap_or_default();
    rt.shutdown(drain.saturating_sub(spent));
    Ok(())
}

/// The runtime's configuration from `cfg`, with compile workers run as
/// child processes of this program (`compile_in_child`) and the bucket.
fn runtime_config(cfg: &NodeConfig) -> Result<wasmkeep_runtime::RuntimeConfig> {
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
    Ok(rc)
}

/// What `run_node` serves with once its runtime runs.
struct Serving<'a> {
    cfg: &'a NodeConfig,
    cluster: &'a Option<wasmkeep_server::cluster::ClusterSettings>,
    bucket: &'a Option<wasmkeep_replica::Bucket>,
    rt: &'a Runtime,
    /// When the node was asked to stop, set by the shutdown.
    stop_asked: &'a Arc<std::sync::OnceLock<std::time::Instant>>,
    /// The classes of the bundled examples, when they were deployed.
    examples: Option<Vec<String>>,
    on_listening: Option<OnListening>,
    unsafe_rules: UnsafeRules,
    test_clock: Option<Arc<wasmkeep_runtime::ManualClock>>,
}

/// Listens, says so, and serves until a signal stops the node and the
/// connections are drained.
async fn serve_node(s: Serving<'_>) -> Result<()> {
    let Serving {
        cfg,
        cluster,
        bucket,
        rt,
        stop_asked,
        examples,
        on_listening,
        unsafe_rules,
        test_clock,
    } = s;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("listen on {}", cfg.listen))?;
    let addr = listener.local_addr()?;
    let base = format!("http://{addr}");
    // The handlers are in place before the node says it listens: a
    // SIGTERM or Ctrl-C right after that line stops it cleanly instead
    // of killing it (tokio installs a handler only when asked).
    #[cfg(unix)]
    let (term, int) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::terminate()).context("install a SIGTERM handler")?,
            signal(SignalKind::interrupt()).context("install a SIGINT handler")?,
        )
    };
    // The node takes its next epoch (durably) before it says it listens.
    let node = start_cluster_node(cluster, bucket, &cfg.data, rt).await?;
    // A cluster node serves the apps' versions the bucket names from its
    // first request (ADR 0058), even if it was down when they were deployed.
    if let Some(n) = &node {
        let limit =
            std::time::Duration::from_millis(cfg.cluster_bucket_timeout_ms.saturating_mul(3));
        n.sync_deploys(rt, limit).await;
    }
    print_listening(cfg, &base);
    if let Some(classes) = examples {
        print_examples(addr, &classes);
    }
    if let Some(hook) = on_listening {
        hook(rt.clone(), addr);
    }
    use std::io::Write;
    std::io::stdout().flush()?;
    let asked = Arc::clone(stop_asked);
    let state = node.as_ref().map(|n| n.state());
    let stopping_rt = rt.clone();
    let drain = std::time::Duration::from_millis(cfg.shutdown_drain_ms);
    let linger = std::time::Duration::from_millis(cfg.cluster_owner_cache_ttl_ms);
    let shutdown = stop_when_asked(Stopping {
        #[cfg(unix)]
        term,
        #[cfg(unix)]
        int,
        asked,
        node,
        rt: stopping_rt,
        drain,
        linger,
    });
    let mut server = cfg.server();
    server.cluster = state;
    server.unsafe_rules = unsafe_rules;
    server.test_clock = test_clock;
    if server.unsafe_rules.any() {
        tracing::warn!(rules = ?server.unsafe_rules, "safety rules switched off for a test ({})", wasmkeep_server::unsafe_rules::ENV);
    }
    let served = wasmkeep_server::serve(rt.clone(), server, listener, shutdown).await;
    served?;
    anyhow::Ok(())
}

/// Cluster mode's node, when the node has cluster settings (and so a
/// bucket), attached to the runtime; none on a single node.
async fn start_cluster_node(
    cluster: &Option<wasmkeep_server::cluster::ClusterSettings>,
    bucket: &Option<wasmkeep_replica::Bucket>,
    data: &std::path::Path,
    rt: &Runtime,
) -> Result<Option<wasmkeep_server::cluster::ClusterNode>> {
    let node = match (cluster, bucket) {
        (Some(settings), Some(bucket)) => {
            // Every cluster has a secret that signs what its nodes send
            // each other: the configured one, or the bucket's.
            let mut settings = settings.clone();
            let secret = wasmkeep_server::cluster::sign::cluster_secret(
                settings.cluster_token.as_deref(),
                bucket,
            )
            .await
            .context("read or create the cluster secret in the bucket")?;
            settings.cluster_token = Some(secret);
            // A configured id (ADR 0069): its next epoch goes past those the
            // bucket registered for it, whatever the data directory says (a
            // lost disk, a new machine, a directory restored from a copy),
            // and a live lease of its newest epoch is fenced first.
            let registered = match &settings.node_id {
                Some(id) => wasmkeep_server::cluster::take_up_identity(
                    bucket,
                    id,
                    settings.bucket_timeout_ms,
                )
                .await
                .context("start cluster mode")?,
                _ => 0,
            };
            let node = wasmkeep_server::cluster::ClusterNode::start(
                settings,
                bucket.clone(),
                data,
                registered,
            )
            .context("start cluster mode")?;
            let mut node = node;
            node.attach_runtime(rt);
            Some(node)
        }
        _ => None,
    };
    Ok(node)
}

/// Prints the line that says the node listens, and where and on what.
fn print_listening(cfg: &NodeConfig, base: &str) {
    println!(
        "wasmkeep {} listening on {base} (data: {}, durability: {}, bucket: {})",
        env!("CARGO_PKG_VERSION"),
        cfg.data.display(),
        match cfg.durability {
            Durability::Fsync => "fsync",
            Durability::Process => "process",
        },
        cfg.bucket.as_deref().unwrap_or("none")
    );
}

/// What stopping the node takes: the signals that ask for it, where the
/// time they did goes, a cluster node whose actors to release, and the
/// time bounds.
struct Stopping {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    asked: Arc<std::sync::OnceLock<std::time::Instant>>,
    node: Option<wasmkeep_server::cluster::ClusterNode>,
    rt: Runtime,
    /// `shutdown_drain_ms`.
    drain: std::time::Duration,
    /// `cluster_owner_cache_ttl_ms`.
    linger: std::time::Duration,
}

/// Waits for SIGTERM or Ctrl-C, then closes the node's WebSockets and
/// releases a cluster node's actors and lease (others take them at their
/// next request; `wasmkeep drain` hands them over first); the server closes its listener and
/// drains its connections once this returns.
async fn stop_when_asked(s: Stopping) {
    let Stopping {
        #[cfg(unix)]
        mut term,
        #[cfg(unix)]
        mut int,
        asked,
        node,
        rt: stopping_rt,
        drain,
        linger,
    } = s;
    #[cfg(unix)]
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
    let started = wasmkeep_runtime::clock::instant();
    let _ = asked.set(started);
    tracing::info!("shutting down");
    // Open WebSockets hear 1001 now, while the node can still
    // write to them (ADR 0043); their clients reconnect elsewhere.
    stopping_rt.sockets().close_all(
        None,
        wasmkeep_runtime::sockets::close_code::GOING_AWAY,
        "the node is stopping: reconnect",
    );
    // A cluster node releases its actors with its listener still
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
}

/// The URL to reach a node listening on `addr` from this machine: through
/// loopback, since without an admin token the admin API answers nothing
/// else (and no `Host` but a loopback one), and 0.0.0.0 is no address to
/// send to.
pub(crate) fn local_base(addr: std::net::SocketAddr) -> String {
    let mut local = addr;
    if local.ip().is_unspecified() {
        local.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    format!("http://{local}")
}

/// Prints what to try on the bundled examples.
fn print_examples(addr: std::net::SocketAddr, classes: &[String]) {
    let base = local_base(addr);
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
    println!(
        "the same in TypeScript as demo/examples-ts (classes: chat, counter, pinger, reminder):"
    );
    println!("  curl -X POST {base}/v1/demo/examples-ts/counter/hello/increment");
}
