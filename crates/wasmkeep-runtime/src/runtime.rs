//! [`Runtime`]: the node's actors, apps, workers and timers, and the API the
//! server (and the test kit) drive.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use tokio::sync::oneshot;
use wasmkeep_store::db::inspect_query;
use wasmkeep_store::sqlite_setup::release_free_memory;
use wasmkeep_store::{ActorId, InspectBounds, QueryResult, paths};
use wasmtime::Engine;
use wasmtime::component::Linker;

use crate::actor::{
    self, Actor, ActorRequest, ActorResponse, Between, DbAccess, Event, EventKind, Outcome,
};
use crate::app::{self, AppInfo, Compiler, OverCeiling};
use crate::app_versions::{self, AppVersion};
use crate::clock::Clock;
use crate::compile_cache::CacheKey;
use crate::compile_process::EngineSettings;
use crate::config::{Durability, RuntimeConfig};
use crate::dispatch::Dispatcher;
use crate::durability::DurabilityStage;
use crate::error::RuntimeError;
use crate::host::{self, HostState};
use crate::metrics::Metrics;
use crate::node::{Inner, ToClose, deliver_inbound};
use crate::outbox::{Inbound, MessageAnswer};
use crate::replication::Replication;
use crate::timer::Timer;
use wasmkeep_store::commit_log::CommitLog;

pub use crate::config::{EPOCH_TICK_MS, WASM_STACK_BYTES_MAX, epoch_ticks};

/// The native stack of each worker thread: the deepest wasm stack a guest
/// may have, the stack SQLite is guaranteed on a guest's behalf
/// (`wasmkeep_store::stack::SQL_STACK_BYTES_MIN`, checked before every
/// call into it), and room for wasmtime's and the host's own frames.
/// Only the pages a thread touches are resident.
pub const WORKER_STACK_BYTES: usize = 16 * 1024 * 1024;
const _: () = assert!(
    WORKER_STACK_BYTES
        >= WASM_STACK_BYTES_MAX + wasmkeep_store::stack::SQL_STACK_BYTES_MIN + 2 * 1024 * 1024
);

/// The stack a worker is spawned with: [`WORKER_STACK_BYTES`], or Rust's
/// default in the unsafe variant of the stack rule (a `test-faults` build).
pub(crate) fn worker_stack_bytes() -> usize {
    if wasmkeep_store::stack::rule_dropped() {
        2 * 1024 * 1024
    } else {
        WORKER_STACK_BYTES
    }
}

/// How often the idle reaper looks for actors to close.
const REAP_INTERVAL_MS: u64 = 1000;

/// How long a start waits for the data directory's lock: a node of this
/// process (or another) that is stopping lets go at the end of its stop.
const DATA_LOCK_WAIT: Duration = Duration::from_secs(10);
/// A worker that waited this long for work after the reaper closed actors
/// gives the memory its allocator no longer uses back to the system.
const WORKER_IDLE_COLLECT_MS: u64 = 500;
/// Actors evicted by `make_room` waiting for the closer thread (one
/// eviction pass at the default `instances_max`). When it is full, the
/// worker that needs room closes the actor itself. Their instances are
/// still alive, so the instance pool has room for them too.
pub(crate) const CLOSE_QUEUE_MAX: usize = 128;

/// How a deploy reaches the app's actors (ADR 0059).
#[derive(Debug, Clone)]
pub struct DeployOptions<'a> {
    /// Who the client says deployed it.
    pub by: &'a str,
    /// For a rollback: the version deployed again.
    pub rollback_of: Option<u64>,
    /// The share of actors that run it, 1 to 100 (by a hash of their
    /// address); the others keep the app's newest whole version.
    pub percent: u8,
    /// Open actors keep their version until they close.
    pub deferred: bool,
}

impl<'a> DeployOptions<'a> {
    /// Every actor, at its next event.
    pub fn whole(by: &'a str) -> DeployOptions<'a> {
        DeployOptions {
            by,
            rollback_of: None,
            percent: 100,
            deferred: false,
        }
    }
}

/// An app's component compiled and checked, not yet served
/// ([`Runtime::prepare`]).
pub struct PreparedApp {
    built: app::App,
    wasm: Vec<u8>,
    manifest: String,
}

impl PreparedApp {
    /// The app as it would be deployed: hash, classes, size.
    pub fn info(&self) -> AppInfo {
        self.built.info()
    }

    /// The component's bytes.
    pub fn wasm(&self) -> &[u8] {
        &self.wasm
    }
}

/// What the admin API shows about one actor.
#[derive(Debug, Clone, Serialize)]
pub struct ActorInfo {
    pub tenant: String,
    pub app: String,
    pub class: String,
    pub name: String,
    pub database_bytes: u64,
    /// The committed alarm (during retries: the next attempt).
    pub alarm_ms: Option<u64>,
    pub alarm_retry_count: u32,
    /// When the database last changed on disk (unix ms).
    pub last_write_ms: Option<u64>,
    /// Whether an instance is alive on this node now.
    pub active: bool,
    /// What its open SQLite connection holds in memory (SQLite's own
    /// accounting); `None` while the database is closed.
    pub sqlite_memory: Option<SqliteMemoryInfo>,
    /// In a cluster: the alarm index entry the database names
    /// (`alarm_indexed`, ADR 0009) and the owner fence last uploaded
    /// (`owner_fence`: the hold generation and nonce of the owner that
    /// ended the history before removing stale entries); `None` when unset.
    pub alarm_indexed: Option<String>,
    pub owner_fence: Option<String>,
    /// The app version it runs: its live instance's, else the one its next
    /// event would load (a rollout's or the whole one, ADR 0059).
    pub version: Option<u64>,
}

/// One open connection's memory, in bytes (see `ActorDb::memory`). The
/// lookaside buffer is not in these figures.
#[derive(Debug, Clone, Serialize)]
pub struct SqliteMemoryInfo {
    pub cache_bytes: u64,
    pub schema_bytes: u64,
    pub statement_bytes: u64,
    /// The write-ahead log's index pages that are resident (ADR 0028).
    pub wal_index_bytes: u64,
}

/// A node's runtime. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

/// The node's compile cache key (`compile_cache_key_path`, else
/// `WASMKEEP_COMPILE_CACHE_KEY`, else `<data>/compile-cache.key`), created
/// if there is none. Without a usable key the node still runs: it compiles
/// every component it loads, and says so.
fn cache_key(config: &RuntimeConfig) -> Option<CacheKey> {
    let path = cache_key_path(config);
    match CacheKey::load_or_create(&path) {
        Ok(key) => Some(key),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "no usable compile cache key: every component is compiled, none is cached");
            None
        }
    }
}

/// Where the node's compile cache key is (see [`cache_key`]).
pub(crate) fn cache_key_path(config: &RuntimeConfig) -> PathBuf {
    config
        .compile_cache_key_path
        .clone()
        .or_else(|| std::env::var_os("WASMKEEP_COMPILE_CACHE_KEY").map(PathBuf::from))
        .unwrap_or_else(|| config.data_dir.join("compile-cache.key"))
}

/// The settings of a node's engine: room in the pool for every instance,
/// plus the evicted ones waiting for the closer (and the one it is
/// closing), one per worker (a running actor pins its instance while
/// another is made room for) and deploys' checks.
pub(crate) fn engine_settings(config: &RuntimeConfig) -> EngineSettings {
    EngineSettings {
        instances: config.instances_max
            + CLOSE_QUEUE_MAX as u32
            + 1
            + config.turn_threads() as u32
            + 16,
        cores: config.component_core_instances_max,
        memories: config.component_memories_max,
        tables: config.component_tables_max,
        memory_bytes_max: config.instance_memory_bytes_max,
    }
}

/// The share of `node_memory_bytes_max` that freed instance slots may
/// keep resident together, at most (ADR 0078).
const SLOTS_RESIDENT_SHARE: u64 = 4;

/// What each memory and table slot of a freed instance keeps resident
/// for its next instance (ADR 0078): `instance_keep_resident_bytes`,
/// lowered so that every slot of the pool together keeps at most a
/// quarter of `node_memory_bytes_max`, in whole pages of the host; 0
/// where the kernel cannot report which pages an instance wrote (before
/// Linux 6.7).
pub fn instance_keep_resident_bytes(config: &RuntimeConfig) -> usize {
    if !wasmtime::PoolingAllocationConfig::is_pagemap_scan_available() {
        return 0;
    }
    let s = engine_settings(config);
    let slots = u64::from(s.instances) * (u64::from(s.memories) + u64::from(s.tables));
    let page = wasmkeep_store::os_page_bytes() as u64;
    keep_resident_within(
        config.instance_keep_resident_bytes as u64,
        config.node_memory_bytes_max,
        slots,
        page,
    )
}

/// `configured` bytes per slot, lowered so that `slots` slots keep at
/// most a quarter of `budget`, rounded down to whole `page`s (wasmtime
/// rounds up to the page: rounding down keeps the bound).
fn keep_resident_within(configured: u64, budget: u64, slots: u64, page: u64) -> usize {
    let share = budget / SLOTS_RESIDENT_SHARE / slots.max(1);
    let bytes = configured.min(share);
    usize::try_from(bytes - bytes % page.max(1)).unwrap_or(0)
}

/// What a node's runtime is built from besides its configuration and
/// clock (see `Runtime::start`).
struct Parts {
    engine: Engine,
    linker: Linker<HostState>,
    metrics: Arc<Metrics>,
    class_metrics: Arc<crate::class_metrics::ClassMetricsRegistry>,
    replication: Option<Replication>,
}

/// The engine and its linker, the node's series, and the bucket side when
/// the node has a bucket (its upload threads start here).
fn runtime_parts(config: &RuntimeConfig) -> Result<Parts, RuntimeError> {
    let engine = engine_settings(config).engine(instance_keep_resident_bytes(config))?;
    let mut linker: Linker<HostState> = Linker::new(&engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
        .map_err(|e| RuntimeError::Internal(format!("linker: {e:#}")))?;
    host::add_to_linker(&mut linker)
        .map_err(|e| RuntimeError::Internal(format!("linker: {e:#}")))?;
    let mut metrics = Metrics::default();
    let class_metrics = Arc::new(crate::class_metrics::ClassMetricsRegistry::new(
        config.metrics_classes_max,
    ));
    metrics.classes = Some(Arc::clone(&class_metrics));
    let replication = match &config.bucket {
        Some(bucket) => {
            metrics.bucket = Some(Arc::clone(bucket.metrics()));
            // Wall time, whatever clock the node runs on: a later start
            // has a later generation.
            let generation = crate::clock::SystemClock.now_ms();
            Some(Replication::start(
                bucket.clone(),
                config.replica.clone(),
                generation,
                config.restore_refused_retry_ms,
                config.replica_upload_interval_ms,
            )?)
        }
        None => None,
    };
    let metrics = Arc::new(metrics);
    Ok(Parts {
        engine,
        linker,
        metrics,
        class_metrics,
        replication,
    })
}

/// Where compiled components are cached: `compile_cache_dir`, else
/// `WASMKEEP_COMPILE_CACHE`, else `<data>/cache`.
fn compile_cache_dir(config: &RuntimeConfig) -> PathBuf {
    config
        .compile_cache_dir
        .clone()
        .or_else(|| std::env::var_os("WASMKEEP_COMPILE_CACHE").map(PathBuf::from))
        .unwrap_or_else(|| config.data_dir.join("cache"))
}

/// Each tenant's bounds on this node, with what each has here already.
fn tenant_quotas(config: &RuntimeConfig) -> Arc<crate::quotas::Quotas> {
    let disk_bytes_max = config.tenant_disk_bytes_max.unwrap_or_else(|| {
        crate::quotas::default_tenant_disk_bytes(&config.data_dir, config.tenant_share_pct)
    });
    let quotas = Arc::new(crate::quotas::Quotas::new(
        config.tenant_actors_max,
        disk_bytes_max,
        config
            .tenant_bucket_bytes_max
            .unwrap_or(disk_bytes_max.saturating_mul(4)),
    ));
    // What each tenant has here, before any request: the quotas hold
    // from the start.
    quotas.set_counted(by_tenant(&walk_classes(
        &config.data_dir,
        &AtomicBool::new(false),
    )));
    quotas
}

/// The shared core of a node's runtime, from its parts: starts the
/// durability stage and opens the apps' secrets; no worker runs yet.
fn build_inner(
    config: RuntimeConfig,
    clock: Arc<dyn Clock>,
    parts: Parts,
    commit_log: Option<Arc<CommitLog>>,
    spares: Option<wasmkeep_store::spare_actors::Spares>,
) -> Arc<Inner> {
    let sandbox = config.replay_sandbox;
    let Parts {
        engine,
        linker,
        metrics,
        class_metrics,
        replication,
    } = parts;
    let cache_dir = compile_cache_dir(&config);
    let cache_key = cache_key(&config);
    let (close_tx, close_rx) = std::sync::mpsc::sync_channel(CLOSE_QUEUE_MAX);
    let open_databases_max = crate::node::open_databases_max_for(
        config.open_databases_max,
        crate::node::open_files_limit().unwrap_or(1_024),
    );
    let config_data_dir = config.data_dir.clone();
    let parked_limits = config.parked.clone();
    let shares = crate::scheduler::Shares::of(&config);
    let pool_limits = config.pool_limits();
    let quotas = tenant_quotas(&config);
    let socket_limits = config.sockets.clone();
    let log_limits = config.logs;
    let parked_metrics = Arc::clone(&metrics);
    let outbox_dispatcher = Dispatcher::new(
        config.outbox.clone(),
        config.outbound.private_allowed,
        config.tenant_share_pct,
        Arc::clone(&metrics),
    );
    Arc::new(Inner {
        durability: DurabilityStage::start(
            config.data_dir.clone(),
            commit_log.clone(),
            Arc::clone(&metrics),
        ),
        commit_log,
        spares: Mutex::new(spares),
        replication,
        config,
        clock,
        engine,
        linker,
        apps: RwLock::new(HashMap::new()),
        candidates: RwLock::new(HashMap::new()),
        app_version: AtomicU64::new(1),
        deploys: Mutex::new(()),
        actors: Mutex::new(HashMap::new()),
        runq: crate::scheduler::RunQueue::new(shares),
        reaped: AtomicU64::new(0),
        close_tx,
        close_rx: Mutex::new(Some(close_rx)),
        closing: AtomicU64::new(0),
        parking: AtomicU64::new(0),
        open_databases_max,
        timer: Timer::default(),
        metrics,
        started: crate::clock::instant(),
        stopping: Arc::new(AtomicBool::new(false)),
        queued_bytes: AtomicU64::new(0),
        cache_dir,
        cache_key,
        compiles: Arc::default(),
        faults: crate::faults::Faults::default(),
        gate: std::sync::OnceLock::new(),
        alarms_gated_total: AtomicU64::new(0),
        outbox: outbox_dispatcher,
        secrets: crate::app_config::SecretStore::open(&config_data_dir),
        sockets: Arc::new(crate::sockets::SocketTable::new(socket_limits)),
        logs: Arc::new(crate::logs::LogHub::new(log_limits)),
        traces: Arc::default(),
        access_log: AtomicBool::new(false),
        alarm_failure_rate: Default::default(),
        class_metrics,
        pools: crate::pools::Pools::new(&pool_limits),
        quotas,
        migrating: Default::default(),
        reaping: Mutex::new(()),
        recording_bytes: Default::default(),
        replaying: Mutex::new(()),
        sandbox_tape: Mutex::new(None),
        data_lock: Mutex::new(None),
        shut_down: AtomicBool::new(false),
        outbox_resumes_kept: Mutex::new(Default::default()),
        parked: Arc::new({
            let p = crate::parked::ParkedReplies::new(parked_limits, Arc::clone(&parked_metrics));
            if sandbox { p.numbered_from_one() } else { p }
        }),
    })
}

impl Runtime {
    /// Starts a runtime on `config.data_dir`: loads deployed apps, starts
    /// workers, the durability stage, the idle reaper and, on a real clock,
    /// the alarm timer, and schedules every alarm found on disk.
    pub fn start(config: RuntimeConfig, clock: Arc<dyn Clock>) -> Result<Runtime, RuntimeError> {
        std::fs::create_dir_all(config.data_dir.join("actors"))
            .map_err(|e| RuntimeError::Store(e.into()))?;
        // Before anything in the folder is touched: one node at a time. A
        // runtime of this process that is stopping lets go at the end of
        // its shutdown.
        let data_lock = wasmkeep_store::data_lock::DataLock::take(&config.data_dir, DATA_LOCK_WAIT)
            .map_err(RuntimeError::InvalidConfig)?;
        // Only a node that promises durability relies on its syncs.
        if config.durability == Durability::Fsync {
            wasmkeep_store::commit_log::actors_on_the_data_filesystem(&config.data_dir)
                .map_err(RuntimeError::InvalidConfig)?;
        }
        // Files a restore staged and a crash left behind, and replays'
        // sandboxes (ADR 0062) a crash cut short.
        let _ = std::fs::remove_dir_all(config.data_dir.join("staging"));
        let _ = std::fs::remove_dir_all(config.data_dir.join("replay"));
        wasmkeep_store::memory_budget::set_node_bytes_max(config.node_memory_bytes_max);
        // Before any actor's database opens: what a power cut took from the
        // actors' logs is put back from the commit log (ADR 0074).
        let store_io = |e: std::io::Error| RuntimeError::Store(e.into());
        let with_log = config.durability == Durability::Fsync && config.commit_log;
        let commit_log = if with_log && wasmkeep_store::commit_log::supported(&config.data_dir) {
            Some(CommitLog::start(&config.data_dir).map_err(store_io)?.0)
        } else {
            if with_log {
                tracing::warn!(
                    data = %config.data_dir.display(),
                    "no commit log: the data directory's filesystem gives no file birth times, \
                     which the log needs (ADR 0074); groups are made durable by syncfs"
                );
            }
            wasmkeep_store::commit_log::recover(&config.data_dir).map_err(store_io)?;
            None
        };
        // Without spares, new actors make their own folders (ADR 0075). A
        // replay's sandbox creates no actor: its spares would only be
        // inodes made and freed on the data's filesystem.
        let spares = if config.replay_sandbox {
            None
        } else {
            wasmkeep_store::spare_actors::Spares::start(&config.data_dir)
                .inspect_err(|e| {
                    tracing::warn!(error = %e, "no spare folders for new actors");
                })
                .ok()
        };
        let parts = runtime_parts(&config)?;
        let inner = build_inner(config, clock, parts, commit_log, spares);
        *inner.data_lock.lock() = Some(data_lock);
        inner.outbox.attach(Arc::downgrade(&inner));
        let rt = Runtime { inner };
        // Loading an app runs its `classes()`: the epoch must advance by
        // then, or a guest that loops there would hang the start.
        rt.spawn_epoch();
        // A class migration a stop cut short moves its data first (ADR
        // 0060): apps and the alarm scan then see it where it belongs.
        let with_bucket = rt.inner.replication.is_some();
        let later =
            crate::class_migrations::finish_pending(&rt.inner.config.data_dir, with_bucket)?;
        rt.load_apps()?;
        rt.spawn_threads();
        // With a bucket, the actors move through their own events.
        for (plan, version) in &later {
            crate::class_migrations::resume(&rt.inner, plan, *version)?;
        }
        rt.scan_alarms();
        Ok(rt)
    }

    fn load_apps(&self) -> Result<(), RuntimeError> {
        let data = self.inner.config.data_dir.clone();
        for stored in app::load_all(&data).map_err(|e| RuntimeError::Store(e.into()))? {
            let app::StoredApp {
                tenant,
                app,
                stable,
                candidate,
            } = stored;
            let Some(whole) = self.load_version(&tenant, &app, stable) else {
                continue;
            };
            let key = (tenant.clone(), app.clone());
            self.inner.apps.write().insert(key.clone(), Arc::new(whole));
            if let Some(c) = candidate {
                let percent = c.version.as_ref().map_or(100, |v| v.percent);
                if let Some(partial) = self.load_version(&tenant, &app, c) {
                    let entry = (Arc::new(partial), percent);
                    self.inner.candidates.write().insert(key, entry);
                }
            }
        }
        Ok(())
    }

    /// Compiles one stored version of an app at start; `None` (logged) if
    /// it no longer loads.
    fn load_version(&self, tenant: &str, app: &str, v: app::StoredVersion) -> Option<app::App> {
        let version = self.inner.app_version.fetch_add(1, Ordering::SeqCst);
        // Deployed before: a limit above a ceiling lowered since is
        // clamped, not refused (see `OverCeiling`).
        match self.compiler().build(
            tenant,
            app,
            &v.wasm,
            &v.manifest,
            version,
            OverCeiling::Clamp,
        ) {
            Ok(mut a) => {
                self.register_classes(tenant, app, &a.info().classes);
                if let Some(kept) = &v.version {
                    a.deploy_version = kept.version;
                    a.deferred = kept.deferred;
                }
                Some(a)
            }
            Err(e) => {
                tracing::error!(%tenant, %app, error = %e, "a deployed app no longer loads");
                None
            }
        }
    }

    /// Gives an app's classes their label sets in `/metrics` (while
    /// `metrics_classes_max` allows).
    fn register_classes(&self, tenant: &str, app: &str, classes: &[String]) {
        for class in classes {
            self.inner.class_metrics.register(tenant, app, class);
        }
    }

    fn compiler(&self) -> Compiler<'_> {
        Compiler {
            engine: &self.inner.engine,
            linker: &self.inner.linker,
            config: &self.inner.config,
            clock: Arc::clone(&self.inner.clock),
            cache_dir: self.inner.cache_dir.clone(),
            cache_key: self.inner.cache_key.as_ref(),
            compiles: &self.inner.compiles,
            settings: engine_settings(&self.inner.config),
            metrics: &self.inner.metrics,
            unsafe_trust_cache: self.inner.faults.unsafe_trust_compile_cache(),
        }
    }

    /// Starts the thread that advances the engine's epoch (the CPU
    /// deadline's clock).
    fn spawn_epoch(&self) {
        let engine = self.inner.engine.clone();
        let weak = Arc::downgrade(&self.inner);
        std::thread::Builder::new()
            .name("wasmkeep-epoch".into())
            .spawn(move || {
                while weak.strong_count() > 0 {
                    std::thread::sleep(Duration::from_millis(EPOCH_TICK_MS));
                    engine.increment_epoch();
                }
            })
            .expect("spawn epoch thread");
    }

    fn spawn_threads(&self) {
        for slot in 0..self.inner.config.turn_threads() {
            spawn_worker(Arc::clone(&self.inner), slot).expect("spawn worker");
        }
        if let Some(rx) = self.inner.close_rx.lock().take() {
            let weak = Arc::downgrade(&self.inner);
            std::thread::Builder::new()
                .name("wasmkeep-closer".into())
                .spawn(move || closer(rx, weak))
                .expect("spawn closer");
        }
        // The class census (disk per class) on a thread of its own: a walk
        // of a big data folder must not hold up the reaper. It holds what
        // it reads and writes, not the runtime.
        let every = self.inner.config.metrics_census_ms;
        if every > 0 {
            let data = self.inner.config.data_dir.clone();
            let classes = Arc::clone(&self.inner.class_metrics);
            let quotas = Arc::clone(&self.inner.quotas);
            let stopping = Arc::clone(&self.inner.stopping);
            std::thread::Builder::new()
                .name("wasmkeep-census".into())
                .spawn(move || {
                    while !stopping.load(Ordering::Relaxed) {
                        census(&data, &classes, &quotas, &stopping);
                        sleep_unless_stopping(every, &stopping);
                    }
                })
                .expect("spawn census");
        }
        if self.inner.replication.is_some() && self.inner.config.bucket_usage_interval_ms > 0 {
            let weak = Arc::downgrade(&self.inner);
            std::thread::Builder::new()
                .name("wasmkeep-usage".into())
                .spawn(move || measure_bucket_usage(weak))
                .expect("spawn usage");
        }
        let weak = Arc::downgrade(&self.inner);
        std::thread::Builder::new()
            .name("wasmkeep-reaper".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(Duration::from_millis(REAP_INTERVAL_MS));
                    let Some(rt) = weak.upgrade() else { return };
                    if rt.stopping.load(Ordering::Relaxed) {
                        return;
                    }
                    rt.reap_idle();
                    rt.resume_kept_outboxes();
                    rt.give_back_idle_index_pages(crate::node::INDEX_IDLE_MS);
                    rt.read_instance_slots_resident();
                    rt.sockets.close_idle(rt.clock.now_ms());
                }
            })
            .expect("spawn reaper");
        if self.inner.clock.is_real() {
            let weak = Arc::downgrade(&self.inner);
            std::thread::Builder::new()
                .name("wasmkeep-timer".into())
                .spawn(move || {
                    loop {
                        let Some(rt) = weak.upgrade() else { return };
                        if rt.stopping.load(Ordering::Relaxed) {
                            return;
                        }
                        let now = rt.clock.now_ms();
                        rt.fire_due(now);
                        rt.prepare_soon(now);
                        let timer_wait = rt.config.alarm_prepare_ms.clamp(10, 500);
                        // Hold only a weak reference while asleep.
                        let rt2 = Arc::clone(&rt);
                        drop(rt);
                        rt2.timer.wait(rt2.clock.now_ms(), timer_wait);
                    }
                })
                .expect("spawn timer");
        }
    }

    /// Reads every actor's committed alarm from disk into the timer.
    fn scan_alarms(&self) {
        let rt = Arc::clone(&self.inner);
        let scan = move || {
            let started = crate::clock::instant();
            let ids = all_actors(&rt.config.data_dir);
            // Opening each database is CPU work (about 0.9 ms an actor, see
            // docs/benchmarks.md): spread it over as many threads as workers.
            let threads = rt.config.worker_threads().max(1);
            let chunk = ids.len().div_ceil(threads).max(1);
            let found = AtomicU64::new(0);
            let unshipped = Mutex::new(Vec::new());
            // After a crash, actors whose file may hold commits no upload
            // carried (ADR 0082) are opened too: their uploads then ship
            // them without waiting for a request.
            let crashed = rt
                .data_lock
                .lock()
                .as_ref()
                .is_some_and(|l| l.previous_holder_crashed());
            std::thread::scope(|s| {
                for part in ids.chunks(chunk) {
                    let (rt, found, unshipped) = (&rt, &found, &unshipped);
                    s.spawn(move || {
                        for id in part {
                            let path = paths::actor_db(&rt.config.data_dir, id);
                            if rt.replication.is_some()
                                && (!wasmkeep_replica::sidecar_path(&path).exists()
                                    || crashed && wasmkeep_replica::may_be_ahead(&path))
                            {
                                unshipped.lock().push(id.clone());
                            }
                            // One read for both: the alarm, and messages
                            // an earlier run did not finish delivering (ADR
                            // 0040), which the actor hands to the
                            // dispatcher again once opened.
                            match wasmkeep_store::db::read_wake(&path) {
                                Ok((alarm, outbox)) => {
                                    if outbox {
                                        rt.resume_outbox(id);
                                    }
                                    if let Some(a) = alarm {
                                        // An actor that ran meanwhile put
                                        // its own, newer, alarm in the timer.
                                        rt.timer.set_if_absent(id, a.at_ms, a.retry_count);
                                        found.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                                // Open already: its turns keep the timer.
                                Err(wasmkeep_store::StoreError::Busy) => {}
                                Err(e) => {
                                    tracing::warn!(actor = %id, error = %e, "could not read the alarm and outbox")
                                }
                            }
                        }
                    });
                }
            });
            rt.metrics.alarms_pending.set(rt.timer.len() as u64);
            tracing::info!(
                actors = ids.len(),
                alarms = found.load(Ordering::Relaxed),
                ms = started.elapsed().as_millis() as u64,
                "alarm scan done"
            );
            // Local data the bucket may never have seen (no sidecar: never
            // uploaded or restored here), or may lack the last commits of
            // (after a crash): each actor's turn checks it against the
            // bucket and ships what it lacks.
            let unshipped = unshipped.into_inner();
            if !unshipped.is_empty() {
                tracing::info!(
                    actors = unshipped.len(),
                    "uploading local actors the bucket may lack"
                );
            }
            if let Some(repl) = &rt.replication {
                if crashed {
                    repl.crash_unchecked
                        .lock()
                        .extend(unshipped.iter().cloned());
                }
                repl.crash_scan_done.store(true, Ordering::SeqCst);
            }
            for id in unshipped {
                let _ = rt.enqueue(
                    &id,
                    Event::new(EventKind::Between(Between::Replicate), None),
                    false,
                );
            }
        };
        if self.inner.clock.is_real() {
            std::thread::Builder::new()
                .name("wasmkeep-scan".into())
                .spawn(scan)
                .expect("spawn scan");
        } else {
            // Under a manual clock (tests) everything is synchronous.
            scan();
        }
    }

    // ---- the API ----

    /// Sends a request to an actor and waits for its response, which
    /// leaves only after the event's commit is durable.
    pub async fn request(
        &self,
        id: ActorId,
        req: ActorRequest,
    ) -> Result<ActorResponse, RuntimeError> {
        Metrics::inc(&self.inner.metrics.requests_total);
        let class = self.inner.class_metrics.of(&id);
        if let Some(c) = &class {
            c.requests.inc();
        }
        let failed = |e: RuntimeError| {
            Metrics::inc(&self.inner.metrics.request_errors_total);
            if let Some(c) = &class {
                c.error(&e.code());
            }
            Err(e)
        };
        if req.replicated && self.inner.replication.is_none() {
            return failed(RuntimeError::ReplicationUnavailable);
        }
        if let Err(e) = crate::idempotency::key_of(&req.headers) {
            return failed(e);
        }
        let (tx, rx) = oneshot::channel();
        if let Err(e) = self
            .inner
            .enqueue(&id, Event::new(EventKind::Request(req), Some(tx)), true)
        {
            return failed(e);
        }
        match rx.await {
            Ok(Ok(Outcome::Response(r))) => Ok(r),
            Ok(Ok(_)) => failed(RuntimeError::Internal("unexpected outcome".into())),
            Ok(Err(e)) => failed(e),
            Err(_) => failed(RuntimeError::ShuttingDown),
        }
    }

    /// Deploys (or replaces) an app. Blocking: compiles the component.
    pub fn deploy(
        &self,
        tenant: &str,
        app: &str,
        wasm: &[u8],
        manifest: &str,
    ) -> Result<AppInfo, RuntimeError> {
        self.deploy_by(tenant, app, wasm, manifest, "")
            .map(|(info, _)| info)
    }

    /// [`Runtime::deploy`], recording `by` (who the client says it is) in
    /// the app's new version, which it returns too.
    pub fn deploy_by(
        &self,
        tenant: &str,
        app: &str,
        wasm: &[u8],
        manifest: &str,
        by: &str,
    ) -> Result<(AppInfo, AppVersion), RuntimeError> {
        let prepared = self.prepare(tenant, app, wasm, manifest)?;
        self.install(prepared, &DeployOptions::whole(by))
    }

    /// Compiles and checks a component for an app without serving it yet
    /// (blocking). A cluster deploy records the version in the bucket
    /// between this and [`Runtime::install_recorded`] (ADR 0058), so that
    /// the bucket never names a component its nodes cannot run.
    pub fn prepare(
        &self,
        tenant: &str,
        app: &str,
        wasm: &[u8],
        manifest: &str,
    ) -> Result<PreparedApp, RuntimeError> {
        let version = self.inner.app_version.fetch_add(1, Ordering::SeqCst);
        let built =
            self.compiler()
                .build(tenant, app, wasm, manifest, version, OverCeiling::Refuse)?;
        Ok(PreparedApp {
            built,
            wasm: wasm.to_vec(),
            manifest: manifest.to_owned(),
        })
    }

    /// The class migrations a deploy of `prepared` to a cluster must apply
    /// before it records the version (ADR 0071), checked against the
    /// component and the bucket; `None` when its manifest lists none this
    /// node has not applied.
    pub fn migration_plan(
        &self,
        prepared: &PreparedApp,
        percent: u8,
    ) -> Result<Option<crate::class_migrations::Plan>, RuntimeError> {
        let b = &prepared.built;
        crate::class_migrations::plan(
            &self.inner,
            &b.tenant,
            &b.name,
            &b.manifest.migrations,
            &b.classes,
            percent,
        )
    }

    /// Closes `classes` on this node for a cluster's closing record
    /// (ADR 0071): their events are refused with `class_migrating` until
    /// [`Runtime::open_classes`], and their open actors finish their
    /// queued events and close. Blocking (at most `MIGRATION_DRAIN_MS`);
    /// `Err(migration_busy)` while some still run (the classes stay
    /// closed: call again).
    pub fn close_classes(
        &self,
        record: &str,
        classes: &[crate::class_migrations::ClassKey],
    ) -> Result<(), RuntimeError> {
        crate::class_migrations::close_for_record(&self.inner, record, classes)
    }

    /// Opens what [`Runtime::close_classes`] closed for `record`.
    pub fn open_classes(&self, record: &str) {
        crate::class_migrations::open_for_record(&self.inner, record);
    }

    /// The closing records this node keeps classes closed for.
    pub fn closing_records(&self) -> Vec<String> {
        crate::class_migrations::closed_records(&self.inner)
    }

    /// `class_migrating` if a class migration closed the actor's class
    /// (its events are refused): what a cluster node answers before it
    /// would take the actor.
    pub fn migration_refusal(&self, id: &ActorId) -> Option<RuntimeError> {
        self.inner.migrating.refuses(id)
    }

    /// The names of a class's actors: on this node's disk and, with a
    /// bucket, live there. Blocking.
    pub fn class_actors(
        &self,
        tenant: &str,
        app: &str,
        class: &str,
    ) -> Result<Vec<String>, RuntimeError> {
        crate::class_migrations::class_actors(&self.inner, tenant, app, class)
    }

    /// A cluster migration's check of an actor of a closed class this node
    /// holds: `migration_conflict` if it has messages not yet delivered;
    /// `Ok(false)` if it has no data. Blocking.
    pub fn migration_check(&self, id: &ActorId) -> Result<bool, RuntimeError> {
        crate::class_migrations::check_actor(&self.inner, id)
    }

    /// Moves an actor of a closed class this node holds to `new` (holding
    /// it too), or deletes it (`None`): restored there, then deleted here.
    /// `Ok(false)` if it had no data (moved already). Blocking.
    pub fn migrate_actor(
        &self,
        old: &ActorId,
        new: Option<&ActorId>,
    ) -> Result<bool, RuntimeError> {
        crate::class_migrations::move_actor(&self.inner, old, new)
    }

    /// Serves a prepared app as this node's next version of it (a single
    /// node's deploy), to the share of actors `options` says.
    pub fn install(
        &self,
        prepared: PreparedApp,
        options: &DeployOptions<'_>,
    ) -> Result<(AppInfo, AppVersion), RuntimeError> {
        let origin = app::DeployOrigin {
            by: options.by,
            rollback_of: options.rollback_of,
            recorded: None,
            percent: options.percent,
            deferred: options.deferred,
        };
        self.install_with(prepared, &origin)
    }

    /// Serves a prepared app as the version the cluster's bucket recorded
    /// (its number, time, author): this node's list of versions follows
    /// the bucket's (ADR 0058).
    pub fn install_recorded(
        &self,
        prepared: PreparedApp,
        recorded: &AppVersion,
    ) -> Result<(AppInfo, AppVersion), RuntimeError> {
        let origin = app::DeployOrigin {
            by: &recorded.by,
            rollback_of: recorded.rollback_of,
            recorded: Some(recorded),
            percent: recorded.percent,
            deferred: recorded.deferred,
        };
        self.install_with(prepared, &origin)
    }

    fn install_with(
        &self,
        prepared: PreparedApp,
        origin: &app::DeployOrigin<'_>,
    ) -> Result<(AppInfo, AppVersion), RuntimeError> {
        let PreparedApp {
            mut built,
            wasm,
            manifest,
        } = prepared;
        let (tenant, app) = (built.tenant.clone(), built.name.clone());
        if !(1..=100).contains(&origin.percent) {
            return Err(RuntimeError::InvalidConfig(format!(
                "percent={} must be 1 to 100",
                origin.percent
            )));
        }
        // One deploy of a node at a time writes apps' folders: two deploys
        // of one app must not interleave their versions.
        let _writing = self.inner.deploys.lock();
        let previous = self.inner.app(&tenant, &app);
        if origin.percent < 100 && previous.is_none() {
            return Err(RuntimeError::rollout_without_whole(
                &tenant,
                &app,
                origin.percent,
            ));
        }
        let data = &self.inner.config.data_dir;
        // Class migrations (ADR 0060): checked, their classes closed and
        // drained, the plan recorded; moved once the version is written.
        // The classes open again when this returns, after the new app is
        // in place.
        // A cluster node installs a version whose migrations the deploying
        // node applied (ADR 0071): it records their tags only.
        let mut migration = if self.inner.keeps_index() {
            None
        } else {
            crate::class_migrations::start(
                &self.inner,
                &tenant,
                &app,
                &built.manifest.migrations,
                &built.classes,
                origin.percent,
            )?
        };
        let kept = app::persist(
            data,
            &built,
            &wasm,
            &manifest,
            origin,
            previous.as_deref(),
            self.inner.config.app_versions_max,
        )
        .map_err(|e| {
            if let Some((p, _)) = &migration {
                crate::class_migrations::abandon(data, p);
            }
            RuntimeError::Store(e.into())
        })?;
        if let Some((p, gate)) = &migration
            && let Err(e) = crate::class_migrations::apply(&self.inner, p, gate, kept.version)
        {
            // Its version is written: the next start finishes the plan.
            // Until then nothing may open an actor of its classes.
            tracing::error!(%tenant, %app, tags = ?p.tags, error = %e, "a class migration failed half-way; its classes stay closed until the node restarts, which finishes it");
            if let Some((_, gate)) = migration.take() {
                gate.keep_closed();
            }
            return Err(e);
        }
        if self.inner.keeps_index() && !built.manifest.migrations.is_empty() {
            crate::class_migrations::record_applied(
                data,
                &tenant,
                &app,
                &built.manifest.migrations,
                kept.version,
            )?;
        }
        built.deploy_version = kept.version;
        built.deferred = kept.deferred;
        let info = built.info();
        self.register_classes(&tenant, &app, &info.classes);
        let key = (tenant.clone(), app.clone());
        if kept.percent < 100 {
            let entry = (Arc::new(built), kept.percent);
            self.inner.candidates.write().insert(key, entry);
        } else {
            self.inner.apps.write().insert(key.clone(), Arc::new(built));
            self.inner.candidates.write().remove(&key);
        }
        tracing::info!(%tenant, %app, hash = %info.hash, version = kept.version, percent = kept.percent, deferred = kept.deferred, classes = ?info.classes, "deployed");
        Ok((info, kept))
    }

    /// A component this node stored for an app, by its hash (kept while a
    /// kept version names it).
    pub fn stored_component(&self, tenant: &str, app: &str, hash: &str) -> Option<Vec<u8>> {
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let dir = app::app_dir(&self.inner.config.data_dir, tenant, app);
        std::fs::read(dir.join(format!("{hash}.wasm"))).ok()
    }

    /// The manifest this node stored with an app's component, by the
    /// component's hash (empty if none was given or it is gone).
    pub fn stored_manifest(&self, tenant: &str, app: &str, hash: &str) -> String {
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return String::new();
        }
        let dir = app::app_dir(&self.inner.config.data_dir, tenant, app);
        std::fs::read_to_string(dir.join(format!("{hash}.toml"))).unwrap_or_default()
    }

    /// The app's kept versions, oldest first (`wasmkeep versions`). An app
    /// deployed before versions existed lists its current deploy as
    /// version 1.
    pub fn versions(&self, tenant: &str, app: &str) -> Result<Vec<AppVersion>, RuntimeError> {
        let Some(current) = self.inner.app(tenant, app) else {
            return Err(self.app_missing(tenant, app));
        };
        let dir = app::app_dir(&self.inner.config.data_dir, tenant, app);
        let kept = app_versions::read(&dir).map_err(|e| RuntimeError::Store(e.into()))?;
        if !kept.is_empty() {
            return Ok(kept);
        }
        Ok(vec![app_versions::legacy_version(
            &current.hash,
            &current.classes,
            current.component_bytes,
            current.deployed_ms,
        )])
    }

    /// Deploys a kept version again (`wasmkeep rollback`): its component
    /// and its manifest, as a new version that names it. `to: None` is the
    /// version before the current one. Blocking: compiles the component
    /// (from the compile cache, when the node compiled it before).
    pub fn rollback(
        &self,
        tenant: &str,
        app: &str,
        to: Option<u64>,
        by: &str,
    ) -> Result<(AppInfo, AppVersion), RuntimeError> {
        let kept = self.versions(tenant, app)?;
        let missing = |version| RuntimeError::VersionNotFound {
            app: format!("{tenant}/{app}"),
            version,
        };
        let target = match to {
            Some(n) => kept.iter().find(|v| v.version == n).ok_or(missing(n))?,
            None => app_versions::rollback_target(&kept).ok_or(missing(0))?,
        };
        if let Some(migrated) = crate::class_migrations::newest_migrating_version(
            &self.inner.config.data_dir,
            tenant,
            app,
        )? && target.version < migrated
        {
            return Err(RuntimeError::ClassMigration {
                code: "rollback_past_migration",
                message: format!(
                    "version {migrated} of {tenant}/{app} migrated classes' data; version {} is from before, and its classes would find none: roll back to version {migrated} or later, or deploy a build for the migrated classes",
                    target.version
                ),
            });
        }
        let dir = app::app_dir(&self.inner.config.data_dir, tenant, app);
        let store = |e: std::io::Error| RuntimeError::Store(e.into());
        let wasm = std::fs::read(dir.join(format!("{}.wasm", target.hash))).map_err(store)?;
        let manifest =
            match std::fs::read_to_string(app_versions::manifest_path(&dir, target.version)) {
                Ok(text) => text,
                // Version 1 of an app from before versions: its manifest by hash.
                Err(_) => std::fs::read_to_string(dir.join(format!("{}.toml", target.hash)))
                    .unwrap_or_default(),
            };
        let prepared = self.prepare(tenant, app, &wasm, &manifest)?;
        let options = DeployOptions {
            rollback_of: Some(target.version),
            ..DeployOptions::whole(by)
        };
        self.install(prepared, &options)
    }

    pub fn apps(&self) -> Vec<AppInfo> {
        let mut v: Vec<AppInfo> = self.inner.apps.read().values().map(|a| a.info()).collect();
        v.sort_by(|a, b| (&a.tenant, &a.app).cmp(&(&b.tenant, &b.app)));
        v
    }

    pub fn app(&self, tenant: &str, app: &str) -> Option<AppInfo> {
        self.inner.app(tenant, app).map(|a| a.info())
    }

    /// The app's version being rolled out, if any, and the share of its
    /// actors that run it (ADR 0059).
    pub fn rollout(&self, tenant: &str, app: &str) -> Option<(AppInfo, u8)> {
        self.inner
            .candidate(tenant, app)
            .map(|(a, percent)| (a.info(), percent))
    }

    /// Names of a class's actors in byte order, after `after`.
    pub fn list_actors(
        &self,
        tenant: &str,
        app: &str,
        class: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, RuntimeError> {
        self.list_actors_with_prefix(tenant, app, class, "", after, limit)
    }

    /// [`Runtime::list_actors`] of the names that start with `prefix`.
    pub fn list_actors_with_prefix(
        &self,
        tenant: &str,
        app: &str,
        class: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, RuntimeError> {
        ActorId::new(tenant, app, class, "x")?;
        let dir = paths::class_dir(&self.inner.config.data_dir, tenant, app, class);
        paths::list_names_with_prefix(&dir, prefix, after, limit)
            .map_err(|e| RuntimeError::Store(e.into()))
    }

    /// What is known about one actor, read between its events.
    /// `app_not_found` or `class_not_found` unless the app is deployed
    /// here with that class: what a typo in an admin call gets (issue 22),
    /// rather than an empty answer or `actor_not_found`.
    pub fn check_class(&self, tenant: &str, app: &str, class: &str) -> Result<(), RuntimeError> {
        let Some(a) = self.inner.app(tenant, app) else {
            return Err(self.app_missing(tenant, app));
        };
        let in_rollout = || {
            self.inner
                .candidate(tenant, app)
                .is_some_and(|(c, _)| c.classes.iter().any(|c| c == class))
        };
        if !a.classes.iter().any(|c| c == class) && !in_rollout() {
            return Err(RuntimeError::ClassNotFound {
                app: format!("{tenant}/{app}"),
                class: class.to_owned(),
            });
        }
        Ok(())
    }

    /// [`Runtime::check_class`] for one actor: its class must be one of the
    /// version that actor runs. During a rollout (ADR 0059) an actor outside
    /// the share runs the whole version, which may lack a class only the
    /// new version has: `class_not_found` for it here, before a cluster
    /// node takes it, as its event would answer.
    pub fn check_actor_class(&self, id: &ActorId) -> Result<(), RuntimeError> {
        self.check_class(&id.tenant, &id.app, &id.class)?;
        match self.inner.app_for(id) {
            Some(a) if a.classes.contains(&id.class) => Ok(()),
            _ => Err(RuntimeError::ClassNotFound {
                app: format!("{}/{}", id.tenant, id.app),
                class: id.class.clone(),
            }),
        }
    }

    /// `app_not_found` unless the app is deployed here (`tenant_not_found`
    /// if no app of its tenant is).
    pub fn check_app(&self, tenant: &str, app: &str) -> Result<(), RuntimeError> {
        match self.inner.app(tenant, app) {
            Some(_) => Ok(()),
            None => Err(self.app_missing(tenant, app)),
        }
    }

    fn app_missing(&self, tenant: &str, app: &str) -> RuntimeError {
        match self.check_tenant(tenant) {
            Err(e) => e,
            Ok(()) => RuntimeError::AppNotFound(format!("{tenant}/{app}")),
        }
    }

    /// `tenant_not_found` unless some app of `tenant` is deployed here.
    pub fn check_tenant(&self, tenant: &str) -> Result<(), RuntimeError> {
        if self.apps().iter().any(|a| a.tenant == tenant) {
            Ok(())
        } else {
            Err(RuntimeError::TenantNotFound(tenant.to_owned()))
        }
    }

    /// What the reaper does each pass with one second (ADR 0078): the open
    /// actors unused for `idle_ms` give back their log index's zero pages.
    /// Returns the bytes given back. For tests.
    #[doc(hidden)]
    pub fn give_back_idle_index_pages(&self, idle_ms: u64) -> usize {
        self.inner.give_back_idle_index_pages(idle_ms)
    }

    /// The bytes freed instance slots keep resident for their next
    /// instance now (`instance_keep_resident_bytes`, ADR 0078); also sets
    /// `wasmkeep_instance_slots_resident_bytes`, which the reaper refreshes
    /// each second.
    pub fn instance_slots_resident_bytes(&self) -> u64 {
        self.inner.read_instance_slots_resident()
    }

    pub fn actor_info(&self, id: &ActorId) -> Result<ActorInfo, RuntimeError> {
        self.check_class(&id.tenant, &id.app, &id.class)?;
        let path = paths::actor_db(&self.inner.config.data_dir, id);
        // With a bucket, an actor not yet restored here may still exist.
        if !path.exists() && self.inner.replication.is_none() {
            return Err(RuntimeError::ActorNotFound(id.to_string()));
        }
        let (active, loaded) = self
            .inner
            .actors
            .lock()
            .get(id)
            .map_or((false, None), |a| (a.is_loaded(), a.loaded_version()));
        let version = loaded.or_else(|| self.inner.app_for(id).map(|a| a.deploy_version));
        let name = id.to_string();
        let (size, alarm, memory, index) = self.with_db(id, move |db| match db {
            DbAccess::Open(db) => {
                let m = db.memory();
                let memory = SqliteMemoryInfo {
                    cache_bytes: m.cache_bytes,
                    schema_bytes: m.schema_bytes,
                    statement_bytes: m.statement_bytes,
                    wal_index_bytes: m.wal_index_bytes,
                };
                let index = (
                    db.meta_get(crate::index::ALARM_INDEXED_META)?,
                    db.meta_get(crate::index::OWNER_FENCE_META)?,
                );
                Ok((db.size_bytes()?, db.alarm()?, Some(memory), index))
            }
            DbAccess::Closed(path) => {
                if !path.exists() {
                    return Err(RuntimeError::ActorNotFound(name));
                }
                // Databases differ in page size (ADR 0027).
                let size = wasmkeep_store::db::size_bytes_at(path)?;
                let index = (
                    crate::index::read_meta_at(path, crate::index::ALARM_INDEXED_META),
                    crate::index::read_meta_at(path, crate::index::OWNER_FENCE_META),
                );
                Ok((size, wasmkeep_store::db::read_alarm(path)?, None, index))
            }
        })?;
        let mtime = |p: PathBuf| {
            std::fs::metadata(p)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as u64)
        };
        let last_write_ms =
            mtime(path.with_file_name(format!("{}-wal", paths::DB_FILE))).max(mtime(path.clone()));
        Ok(ActorInfo {
            tenant: id.tenant.clone(),
            app: id.app.clone(),
            class: id.class.clone(),
            name: id.name.clone(),
            database_bytes: size,
            alarm_ms: alarm.map(|a| a.at_ms),
            alarm_retry_count: alarm.map(|a| a.retry_count).unwrap_or(0),
            alarm_indexed: index.0.filter(|v| !v.is_empty()),
            owner_fence: index.1.filter(|v| !v.is_empty()),
            last_write_ms,
            active,
            sqlite_memory: memory,
            version,
        })
    }

    /// Read-only SQL over an actor's committed database, internal tables
    /// included, run between its events, within a guest statement's
    /// bounds: `event_cpu_ms_max`, `statement_memory_bytes_max`,
    /// `query_result_bytes_max`, and the node's stop.
    pub fn inspect_sql(
        &self,
        id: &ActorId,
        sql: &str,
        rows_max: usize,
    ) -> Result<QueryResult, RuntimeError> {
        self.check_class(&id.tenant, &id.app, &id.class)?;
        let path = paths::actor_db(&self.inner.config.data_dir, id);
        if !path.exists() && self.inner.replication.is_none() {
            return Err(RuntimeError::ActorNotFound(id.to_string()));
        }
        let (sql, name) = (sql.to_owned(), id.to_string());
        let mut bounds = InspectBounds::new(&self.inner.config.store, rows_max);
        bounds.stop = Some(Arc::clone(&self.inner.stopping));
        let cpu_ms = self.inner.config.event_cpu_ms_max;
        self.with_db(id, move |db| {
            // The guest's deadline, counted from when the inspection runs:
            // it reads what a tenant wrote (issue 33: a view over a
            // never-ending query held a worker past any bound).
            bounds.deadline = Some(crate::clock::instant() + Duration::from_millis(cpu_ms));
            match db {
                DbAccess::Open(db) => Ok(db.inspect(&sql, &bounds)?),
                DbAccess::Closed(path) if path.exists() => Ok(inspect_query(path, &sql, &bounds)?),
                DbAccess::Closed(_) => Err(RuntimeError::ActorNotFound(name)),
            }
        })
    }

    /// Copies an actor's committed database into a new SQLite file at
    /// `dest`, between two of its events (so every acknowledged write is
    /// in it and no half of an event is); the bytes written. What
    /// `wasmkeep export --server` downloads: a node without a bucket has
    /// no other copy to read. Blocking, like [`Self::with_db`].
    pub fn export_actor(&self, id: &ActorId, dest: PathBuf) -> Result<u64, RuntimeError> {
        self.check_class(&id.tenant, &id.app, &id.class)?;
        let path = paths::actor_db(&self.inner.config.data_dir, id);
        if !path.exists() && self.inner.replication.is_none() {
            return Err(RuntimeError::ActorNotFound(id.to_string()));
        }
        let name = id.to_string();
        self.with_db(id, move |db| match db {
            DbAccess::Open(db) => Ok(db.copy_to(&dest)?),
            DbAccess::Closed(path) if path.exists() => {
                Ok(wasmkeep_store::db::copy_at(path, &dest)?)
            }
            DbAccess::Closed(_) => Err(RuntimeError::ActorNotFound(name)),
        })
    }

    /// Runs `f` on an actor's database as the actor's next event (so
    /// between two of its events), and waits for it. Blocking: call it from
    /// a thread that may block, not from an async task.
    pub fn with_db<T: Send + 'static>(
        &self,
        id: &ActorId,
        f: impl FnOnce(DbAccess<'_>) -> Result<T, RuntimeError> + Send + 'static,
    ) -> Result<T, RuntimeError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let run: actor::InspectFn = Box::new(move |db| {
            let _ = tx.send(f(db));
        });
        self.inner.enqueue(
            id,
            Event::new(EventKind::Between(Between::Inspect(run)), None),
            false,
        )?;
        // A dropped event (the node stopping) drops the sender.
        rx.recv().unwrap_or(Err(RuntimeError::ShuttingDown))
    }

    /// Deletes an actor's data (and so its alarm), as its next event.
    pub async fn delete_actor(&self, id: ActorId) -> Result<bool, RuntimeError> {
        let (tx, rx) = oneshot::channel();
        self.inner.enqueue(
            &id,
            Event::new(EventKind::Between(Between::Delete), Some(tx)),
            false,
        )?;
        match rx.await {
            Ok(Ok(Outcome::Deleted(b))) => Ok(b),
            Ok(Ok(_)) => Err(RuntimeError::Internal("unexpected outcome".into())),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(RuntimeError::ShuttingDown),
        }
    }

    /// Makes the SQLite file `file` the actor's database, as its next
    /// event (`crate::restore`); the file is moved, or removed if the
    /// restore is refused.
    pub async fn restore_actor(
        &self,
        id: ActorId,
        file: PathBuf,
    ) -> Result<crate::restore::Restored, RuntimeError> {
        self.check_class(&id.tenant, &id.app, &id.class)?;
        let (tx, rx) = oneshot::channel();
        let queued = self.inner.enqueue(
            &id,
            Event::new(
                EventKind::Between(Between::Restore(file.clone(), None)),
                Some(tx),
            ),
            false,
        );
        let out = match queued {
            Ok(()) => match rx.await {
                Ok(Ok(Outcome::Restored(r))) => Ok(r),
                Ok(Ok(_)) => Err(RuntimeError::Internal("unexpected outcome".into())),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(RuntimeError::ShuttingDown),
            },
            Err(e) => Err(e),
        };
        // Moved into place when the restore went through.
        let _ = std::fs::remove_file(&file);
        out
    }

    /// A fresh path under the data folder for a file on its way to
    /// becoming an actor's database (same filesystem: moved, not copied),
    /// or on its way out as an export. The folder is emptied at start.
    pub fn staging_path(&self) -> Result<PathBuf, RuntimeError> {
        let dir = self.inner.config.data_dir.join("staging");
        std::fs::create_dir_all(&dir).map_err(|e| RuntimeError::Store(e.into()))?;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Ok(dir.join(format!("stage-{}-{n}.db", self.inner.clock.now_ms())))
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The fault switches (for tests).
    pub fn faults(&self) -> &crate::faults::Faults {
        &self.inner.faults
    }

    /// Asks `id`'s next turn to hand its outbox to the dispatcher again, as
    /// the start-up scan does for an actor with unsent rows (tests).
    #[cfg(any(test, feature = "test-faults"))]
    pub fn resume_outbox(&self, id: &ActorId) {
        self.inner.resume_outbox(id);
    }

    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// Closes every actor with nothing queued or running, whatever its idle
    /// time: what a cluster node does when its lease ends, so that it takes
    /// and restores each actor again before serving it. Returns how many it
    /// closed; busy ones close on a later pass of the idle reaper.
    pub fn close_idle_now(&self) -> usize {
        self.inner.reap_idle_after(0)
    }

    /// Closes `id` if nothing of it is queued or running and its uploads
    /// are done, as the idle reaper would; true if it is not open now (a
    /// cluster node's drain hands an actor over only then). Checkpoints its
    /// database when it closes: call it off the async threads.
    pub fn close_if_idle(&self, id: &ActorId) -> bool {
        self.inner.close_if_idle(id)
    }

    /// The node's open WebSockets (ADR 0043).
    pub fn sockets(&self) -> &Arc<crate::sockets::SocketTable> {
        &self.inner.sockets
    }

    /// The memory pools for what the host holds for tenants.
    pub fn pools(&self) -> &crate::pools::Pools {
        &self.inner.pools
    }

    /// The recent log lines about actors (`wasmkeep logs`).
    pub fn logs(&self) -> &Arc<crate::logs::LogHub> {
        &self.inner.logs
    }

    /// The node's recent spans (ADR 0064).
    pub fn traces(&self) -> &Arc<crate::trace::Traces> {
        &self.inner.traces
    }

    /// Turns the access lines of actor messages and socket events on in
    /// the node's log (the HTTP edge writes the requests' own).
    pub fn set_access_log(&self, on: bool) {
        self.inner.access_log.store(on, Ordering::Relaxed);
    }

    /// The series labelled by class (`wasmkeep_class_*`).
    pub fn class_metrics(&self) -> &Arc<crate::class_metrics::ClassMetricsRegistry> {
        &self.inner.class_metrics
    }

    /// Whether this node may run `id`'s events now (a cluster node: its
    /// lease lets it act and it holds the actor; a single node: always).
    pub fn may_run_actor(&self, id: &ActorId) -> bool {
        // The hold's generation, never waiting on the actor's slot: a
        // route or release scan holding it must not read as "moved".
        self.inner
            .gate
            .get()
            .is_none_or(|g| g.hold_generation(id).is_some())
    }

    /// Brings a socket's message or close to its actor as an event
    /// (bounded like a request: `actor_overloaded` when its queue is full).
    pub fn socket_event(
        &self,
        id: &ActorId,
        ev: crate::actor::SocketEvent,
    ) -> Result<(), RuntimeError> {
        // A close is always taken (the actor's view of its sockets must
        // not drift); a message is bounded like a request.
        let mut ev = ev;
        let bounded = match &mut ev {
            crate::actor::SocketEvent::Message {
                id: socket,
                sent_as,
                ..
            } => {
                self.inner
                    .sockets
                    .touch(id, *socket, self.inner.clock.now_ms());
                *sent_as = self.inner.sockets.info(id, *socket);
                true
            }
            crate::actor::SocketEvent::Closed { .. } => false,
        };
        self.inner
            .enqueue(id, Event::new(EventKind::Socket(ev), None), bounded)
    }

    /// Expires the parked replies whose deadline the node's clock has
    /// passed; returns how many. The real clock's timers do it by
    /// themselves; the test kit calls this as it moves its manual clock.
    pub fn expire_parked_replies(&self) -> usize {
        self.inner.parked.expire_due(self.inner.clock.now_ms())
    }

    /// Hands each suspended event (ADR 0056) whose deadline has passed on
    /// the node's clock its deadline; returns how many. The real clock's
    /// timers do it by themselves; the test kit calls this as it moves its
    /// manual clock, so that a test's `advance` ends waits as real time
    /// would.
    pub(crate) fn expire_await_deadlines(&self) -> usize {
        let now = self.inner.clock.now_ms();
        let due: Vec<(ActorId, u64)> = self
            .await_deadlines()
            .into_iter()
            .filter(|(_, _, at)| *at <= now)
            .map(|(id, seq, _)| (id, seq))
            .collect();
        for (id, seq) in &due {
            let _ = self.inner.enqueue(
                id,
                Event::new(EventKind::AwaitDeadline { seq: *seq }, None),
                false,
            );
        }
        due.len()
    }

    /// The earliest deadline of a suspended event on this node, if any.
    pub(crate) fn next_await_deadline_ms(&self) -> Option<u64> {
        self.await_deadlines()
            .into_iter()
            .map(|(_, _, at)| at)
            .min()
    }

    /// Each actor of this node whose event is suspended: its awaited seq
    /// and the wait's deadline. (A suspended actor closed since is not
    /// among them: its real-time deadline task still ends its wait.)
    fn await_deadlines(&self) -> Vec<(ActorId, u64, u64)> {
        let open: Vec<Arc<Actor>> = self.inner.actors.lock().values().cloned().collect();
        open.iter()
            .filter_map(|a| {
                let q = a.queue.lock();
                let w = q.awaiting.as_ref()?;
                Some((a.id.clone(), w.seq, w.deadline_ms))
            })
            .collect()
    }

    /// Replies parked now (ADR 0042).
    pub fn parked_replies(&self) -> usize {
        self.inner.parked.len()
    }

    /// The node's outbox dispatcher (ADR 0040).
    pub fn outbox(&self) -> &Dispatcher {
        &self.inner.outbox
    }

    /// Runs an inbound event on this node (the cluster's router, for an
    /// actor this node holds).
    pub async fn inbound(
        &self,
        to: ActorId,
        ev: Inbound,
    ) -> Result<Option<MessageAnswer>, RuntimeError> {
        deliver_inbound(&self.inner, to, ev).await
    }

    /// Whether `id` has a queue or an instance on this node now (a cluster
    /// node releases an actor's hold only once it is not open here, so that
    /// no copy stays open after another node may have taken it).
    pub fn is_open(&self, id: &ActorId) -> bool {
        self.inner.actors.lock().contains_key(id)
    }

    /// Whether any actor has events queued or running.
    pub fn busy(&self) -> bool {
        self.inner
            .actors
            .lock()
            .values()
            .any(|a| a.queue.lock().scheduled)
    }

    /// Actors with a queue or an instance on this node now.
    pub fn active_actors(&self) -> usize {
        self.inner.actors.lock().len()
    }

    /// Whether [`Runtime::shutdown`] has begun (background tasks of the
    /// node's edge end then).
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::Relaxed)
    }

    /// Stops taking events, lets queued ones finish, and closes every
    /// actor (a long log is checkpointed at the close, ADR 0076), then
    /// lets go of the data directory. Once: a second call does nothing
    /// (the folder may be another node's by then, ADR 0081).
    pub fn shutdown(&self, wait: Duration) {
        let rt = &self.inner;
        if rt.shut_down.swap(true, Ordering::SeqCst) {
            return;
        }
        let deadline = crate::clock::instant() + wait;
        if let Some(repl) = &rt.replication {
            crate::replication::flush_deferred(rt, repl);
        }
        while crate::clock::instant() < deadline {
            // Queued events run, and what they committed reaches the bucket.
            let busy = rt
                .actors
                .lock()
                .values()
                .any(|a| a.queue.lock().scheduled || a.repl.lock().busy());
            if !busy {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        rt.stopping.store(true, Ordering::SeqCst);
        rt.sockets.close_all(
            None,
            crate::sockets::close_code::GOING_AWAY,
            "the node is stopping: reconnect",
        );
        // Deliveries in flight stop; their rows stay in their databases.
        rt.outbox.shutdown();
        rt.runq.wake_all();
        rt.timer.notify();
        let actors: Vec<Arc<Actor>> = rt.actors.lock().drain().map(|(_, a)| a).collect();
        for a in &actors {
            a.queue.lock().retired = true;
            *a.slot.lock() = None;
        }
        // Every turn has ended (the slot waits for a running one). The next
        // start must look for unshipped commits again (ADR 0082) if this
        // one's look is not done: an actor it queued not yet checked
        // against the bucket, or one whose commits the bucket still lacks
        // (it was down, say). Commits of `replicated` requests the bucket
        // lacks must not come back at all.
        let look_again = rt.replication.as_ref().is_some_and(|repl| {
            crate::replication::void_unanswered_at_stop(rt, &actors);
            let crashed = rt
                .data_lock
                .lock()
                .as_ref()
                .is_some_and(|l| l.previous_holder_crashed());
            (crashed
                && (!repl.crash_scan_done.load(Ordering::SeqCst)
                    || !repl.crash_unchecked.lock().is_empty()))
                || actors.iter().any(|a| !a.repl.lock().settled())
        });
        // No actor is made from here on: the spares' thread stops (what
        // it made is deleted at the next start).
        drop(rt.spares.lock().take());
        // Every actor closed: what the log holds is made durable in the
        // actors' files, so the next start has nothing to replay.
        if let Some(log) = &rt.commit_log
            && let Err(e) = log.cut_now()
        {
            tracing::warn!(error = %e, "could not cut the commit log at the stop");
        }
        // Without the log, commits nobody waited for (an alarm's) are
        // made durable here: a close no longer syncs a short log (ADR
        // 0076). Not for a node that promises no sync, nor a replay's
        // sandbox (its files are thrown away).
        if rt.commit_log.is_none()
            && rt.config.durability == Durability::Fsync
            && !rt.config.replay_sandbox
            && let Err(e) = wasmkeep_store::sync::sync_filesystem(&rt.config.data_dir)
        {
            tracing::warn!(error = %e, "could not sync the data directory at the stop");
        }
        // Another node may use the folder from here on; it finds this stop
        // a clean one unless commits may still be unshipped.
        if let Some(lock) = rt.data_lock.lock().take()
            && !look_again
        {
            lock.stopped();
        }
    }
}

/// Closes the actors `make_room` evicted, and the databases
/// `make_room_for_database` picked (their instances stay). The close
/// happens under the actor's slot lock, so the actor's next turn (a
/// request, an alarm, its deletion) waits for it and never opens the
/// database while the old connection still holds it. An actor used again
/// since it was picked, or running now, stays open.
fn closer(rx: std::sync::mpsc::Receiver<ToClose>, weak: std::sync::Weak<Inner>) {
    while let Ok((a, used, closes)) = rx.recv() {
        let Some(rt) = weak.upgrade() else { return };
        if closes == crate::node::Closes::Database {
            if let Some(mut slot) = a.slot.try_lock()
                && a.last_used_ms.load(Ordering::Relaxed) == used
                && let Some(loaded) = slot.as_mut()
                && loaded.park_db()
            {
                Metrics::inc(&rt.metrics.databases_parked_total);
            }
            a.evicting.store(false, Ordering::Relaxed);
            rt.parking.fetch_sub(1, Ordering::Relaxed);
            continue;
        }
        let delay = rt.faults.close_delay_ms();
        if let Some(mut slot) = a.slot.try_lock()
            && a.last_used_ms.load(Ordering::Relaxed) == used
            && let Some(loaded) = slot.take()
        {
            if rt.faults.unsafe_close_outside_slot() {
                // The mutation the closer's test kills: the slot is free
                // while the old connection still holds the file.
                drop(slot);
            }
            std::thread::sleep(Duration::from_millis(delay));
            drop(loaded);
            Metrics::inc(&rt.metrics.evictions_total);
        }
        a.evicting.store(false, Ordering::Relaxed);
        rt.closing.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Starts the thread that runs turns in place `slot` of the run queue.
fn spawn_worker(rt: Arc<Inner>, slot: usize) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(format!("wasmkeep-worker-{slot}"))
        .stack_size(worker_stack_bytes())
        .spawn(move || worker(rt, slot))
        .map(drop)
}

/// A thread that runs turns; `slot` is its place in the run queue.
fn worker(rt: Arc<Inner>, slot: usize) {
    rt.runq.register(slot);
    // The reaper's passes that closed actors, as of this worker's last
    // return of memory: a closed actor's memory sits in the pages of the
    // workers that allocated it until they collect.
    let mut reaped_seen = rt.reaped.load(Ordering::Relaxed);
    let idle = Duration::from_millis(WORKER_IDLE_COLLECT_MS);
    loop {
        let taken = rt.runq.take(slot, &rt.stopping, idle, || {
            let reaped = rt.reaped.load(Ordering::Relaxed);
            if reaped != reaped_seen {
                // Quiet for a while after the reaper closed actors:
                // return what they used (W4's memory once W1's actors
                // closed). Not after any work: memory returned before a
                // burst is faulted in again during it (W2's alarms fired
                // 20-40% later when every quiet worker returned memory).
                reaped_seen = reaped;
                release_free_memory();
            }
        });
        let crate::scheduler::Taken::Turn(actor) = taken else {
            return;
        };
        run_turn_surviving_panics(&rt, &actor);
        drop(actor);
        if rt.runq.done(slot) == crate::scheduler::Done::Retire {
            // This thread ran a long turn at a lowered priority, which the
            // process may not raise again: a fresh thread takes its place.
            wasmkeep_store::memory_budget::fold_thread();
            if let Err(e) = spawn_worker(Arc::clone(&rt), slot) {
                tracing::error!(error = %e, slot, "could not start a worker in place of one that ran a long turn; this one goes on at a low priority");
                continue;
            }
            return;
        }
    }
}

/// Runs one turn of `actor`, and survives a panic in it (a bug: guests
/// trap, they do not panic the host). Without this, the worker thread
/// would die with the actor still marked as scheduled, and the actor's
/// queue would never be run again. The events of the batch that panicked
/// are answered with an internal error as they are dropped (`Reply`); the
/// instance is dropped, which closes the database and rolls back what the
/// batch had not committed; the actor's next event opens it afresh.
fn run_turn_surviving_panics(rt: &Arc<Inner>, actor: &Arc<Actor>) {
    let turn = std::panic::catch_unwind(AssertUnwindSafe(|| actor::run_turn(rt, actor)));
    let Err(panic) = turn else {
        return;
    };
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    Metrics::inc(&rt.metrics.worker_panics_total);
    tracing::error!(actor = %actor.id, panic = %message, "a worker panicked running this actor's turn: its events failed, its instance is dropped, the worker goes on");
    let loaded = actor.slot.lock().take();
    if std::panic::catch_unwind(AssertUnwindSafe(move || drop(loaded))).is_err() {
        tracing::error!(actor = %actor.id, "closing the actor after the panic panicked too");
    }
    // The turn may have taken the actor's alarm from the timer.
    rt.rearm_after_failure(&actor.id);
    let mut q = actor.queue.lock();
    if q.events.is_empty() {
        q.scheduled = false;
    } else {
        rt.schedule(Arc::clone(actor));
    }
}

/// The folders in `p` with UTF-8 names (a tenant's, an app's, a class's
/// level of the data folder); none if it cannot be read.
fn subdirs(p: &std::path::Path) -> Vec<(String, PathBuf)> {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
                .collect()
        })
        .unwrap_or_default()
}

/// Disk use and actor count of each class: (tenant, app, class) to
/// (bytes, actors).
type ClassUsage = HashMap<(String, String, String), (u64, u64)>;

/// The bucket quota's measurements (`wasmkeep-usage`), every
/// `bucket_usage_interval_ms` until the node stops, the first at once.
fn measure_bucket_usage(weak: std::sync::Weak<Inner>) {
    loop {
        let Some(rt) = weak.upgrade() else { return };
        let Some(repl) = &rt.replication else { return };
        let mut tenants: Vec<String> = rt.apps.read().values().map(|a| a.info().tenant).collect();
        tenants.sort_unstable();
        tenants.dedup();
        let gate = rt.gate.get().cloned();
        let mine = |t: &str| gate.as_ref().is_none_or(|g| g.measures_usage(t));
        let now = rt.clock.now_ms();
        crate::quotas::measure_bucket(repl, &rt.quotas, &tenants, &mine, now, &rt.stopping);
        let every = rt.config.bucket_usage_interval_ms;
        let stopping = Arc::clone(&rt.stopping);
        drop(rt);
        if !sleep_unless_stopping(every, &stopping) {
            return;
        }
    }
}

/// Sleeps `every_ms` in steps of at most 200 ms so that a stopping node is
/// noticed; false if it stopped.
fn sleep_unless_stopping(every_ms: u64, stopping: &AtomicBool) -> bool {
    let until = crate::clock::instant() + Duration::from_millis(every_ms);
    while crate::clock::instant() < until {
        if stopping.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(every_ms.min(200)));
    }
    !stopping.load(Ordering::Relaxed)
}

/// Walks the data folder for each class's disk use and actor count
/// (`wasmkeep_class_database_bytes`, `wasmkeep_class_actors`, and the
/// tenants' quotas). It reads file sizes only (no database is opened), and
/// holds one directory iterator per level it is in, never a class's list
/// of actors: memory stays flat however many actors a class has. It stops
/// early when the node stops (the counts of that walk are then dropped).
fn census(
    data: &std::path::Path,
    classes: &crate::class_metrics::ClassMetricsRegistry,
    quotas: &crate::quotas::Quotas,
    stopping: &AtomicBool,
) {
    let per_class = walk_classes(data, stopping);
    if stopping.load(Ordering::Relaxed) {
        return;
    }
    classes.set_census(&per_class);
    quotas.set_counted(by_tenant(&per_class));
}

/// [`census`]'s walk.
fn walk_classes(data: &std::path::Path, stopping: &AtomicBool) -> ClassUsage {
    let mut per_class = ClassUsage::new();
    for (tenant, tp) in subdirs(&data.join("actors")) {
        for (app, ap) in subdirs(&tp) {
            for (class, cp) in subdirs(&ap) {
                if stopping.load(Ordering::Relaxed) {
                    return per_class;
                }
                let (mut bytes, mut actors) = (0u64, 0u64);
                let mut open: Vec<std::fs::ReadDir> = std::fs::read_dir(&cp).into_iter().collect();
                while let Some(level) = open.last_mut() {
                    let Some(entry) = level.next() else {
                        open.pop();
                        continue;
                    };
                    let Ok(e) = entry else { continue };
                    let Ok(meta) = e.metadata() else { continue };
                    if meta.is_dir() {
                        if let Ok(rd) = std::fs::read_dir(e.path()) {
                            open.push(rd);
                        }
                    } else {
                        bytes += meta.len();
                        if e.file_name() == paths::DB_FILE {
                            actors += 1;
                        }
                    }
                }
                per_class.insert((tenant.clone(), app.clone(), class), (bytes, actors));
            }
        }
    }
    per_class
}

/// Classes' use summed per tenant.
fn by_tenant(per_class: &ClassUsage) -> HashMap<String, crate::quotas::Usage> {
    let mut out: HashMap<String, crate::quotas::Usage> = HashMap::new();
    for ((tenant, _, _), (bytes, actors)) in per_class {
        let u = out.entry(tenant.clone()).or_default();
        u.bytes += bytes;
        u.actors += actors;
    }
    out
}

/// Every actor with a database under `data`.
pub fn all_actors(data: &std::path::Path) -> Vec<ActorId> {
    let mut out = Vec::new();
    for (tenant, tp) in subdirs(&data.join("actors")) {
        for (app, ap) in subdirs(&tp) {
            for (class, cp) in subdirs(&ap) {
                for name in paths::list_names(&cp, None, usize::MAX).unwrap_or_default() {
                    if let Ok(id) = ActorId::new(&tenant, &app, &class, &name) {
                        out.push(id);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod keep_resident_tests {
    use super::*;

    #[test]
    fn freed_slots_keep_at_most_a_quarter_of_the_node_budget() {
        const MIB: u64 = 1 << 20;
        // 12 GiB over 15,393 slots: 204 KiB each, under the 1 MiB asked.
        let per_slot = keep_resident_within(MIB, 12 << 30, 15_393, 4096) as u64;
        assert_eq!(per_slot, 204 * 1024);
        assert!(per_slot * 15_393 <= (12 << 30) / 4);
        // A budget with room: what was asked, in whole pages.
        assert_eq!(
            keep_resident_within(MIB + 1, 1 << 40, 15_393, 4096),
            1 << 20
        );
        assert_eq!(keep_resident_within(MIB, 1 << 40, 10, 65_536), 1 << 20);
        assert_eq!(keep_resident_within(70_000, 1 << 40, 10, 65_536), 65_536);
        // Less than a page, a tiny budget, no slots: nothing or the share.
        assert_eq!(keep_resident_within(4095, 1 << 40, 10, 4096), 0);
        assert_eq!(keep_resident_within(MIB, 64 * MIB, 15_393, 4096), 0);
        assert_eq!(keep_resident_within(MIB, 4 * MIB, 0, 4096), MIB as usize);
    }
}
