//! A node's runtime settings and their defaults, in one place.
//!
//! Every bound is named with its unit last. The README's configuration table
//! documents each field; a test in the CLI crate checks that it does.

use std::ffi::OsString;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use wasmkeep_replica::{Bucket, ReplicaConfig};
use wasmkeep_store::StoreLimits;

/// How often the engine's epoch advances; the unit of the CPU deadline.
pub const EPOCH_TICK_MS: u64 = 10;

/// Epoch ticks that make up `ms` of run time.
pub fn epoch_ticks(ms: u64) -> u64 {
    ms.div_ceil(EPOCH_TICK_MS).max(1)
}

/// The deepest a guest's stack may grow (wasmtime's default, made
/// explicit): it runs on the worker's own stack, with room left for the
/// host calls it makes. Fixed, because worker threads are sized for it.
pub const WASM_STACK_BYTES_MAX: usize = 512 * 1024;

/// Where components are compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compile {
    /// On a thread of the node's process: unbounded memory, not cancellable.
    Thread,
    /// In a child process: `program args… <settings>`, where the program
    /// calls [`worker_main`] with the settings argument, with `env` added
    /// to the node's environment.
    Process {
        program: PathBuf,
        args: Vec<OsString>,
        env: Vec<(OsString, OsString)>,
    },
}

/// Default of `event_log_lines_max`.
pub(crate) const EVENT_LOG_LINES_MAX: u32 = 1000;
/// Default of `event_log_bytes_max`.
pub(crate) const EVENT_LOG_BYTES_MAX: usize = 256 * 1024;

/// Default of `restore_refused_retry_ms`.
pub(crate) const RESTORE_REFUSED_RETRY_MS: u64 = 60_000;

/// Default of `replica_upload_interval_ms`: Litestream's sync interval.
pub(crate) const REPLICA_UPLOAD_INTERVAL_MS: u64 = 1_000;

/// When a response may leave, relative to the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// After the event's commit is fsynced: an acknowledged write survives
    /// SIGKILL and power loss (Durable Objects' output gate).
    #[default]
    Fsync,
    /// After the commit reached the operating system: an acknowledged write
    /// survives a crash of the process, not of the machine.
    Process,
}

/// Settings of the runtime (the part of a node that runs actors).
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Where actors' databases and deployed apps live.
    pub data_dir: PathBuf,
    pub durability: Durability,
    /// With `durability = "fsync"`: a group of commits is made durable by
    /// one `fdatasync` of the node's commit log, where every write to an
    /// actor's write-ahead log is recorded, instead of a `syncfs` over the
    /// actors' files (ADR 0074). A log a crash left is replayed at start
    /// whatever this says.
    pub commit_log: bool,
    /// Wall time one event may run before it is interrupted.
    pub event_cpu_ms_max: u64,
    /// Memory one instance may grow to: all its linear memories and tables
    /// together.
    pub instance_memory_bytes_max: usize,
    /// Bytes of each memory and table slot of a freed instance that stay
    /// resident for the slot's next instance: the pages the instance wrote
    /// are reset by writing them, up to this much, instead of being handed
    /// back to the kernel, which on a multi-core host interrupts every
    /// core (ADR 0078). Lowered so that all slots of the instance pool
    /// together keep at most a quarter of `node_memory_bytes_max`
    /// ([`crate::runtime::instance_keep_resident_bytes`]; what they keep:
    /// `wasmkeep_instance_slots_resident_bytes`); 0 hands everything back.
    /// Used only where the kernel can report the written pages (Linux 6.7
    /// and later).
    pub instance_keep_resident_bytes: usize,
    /// Instances alive at once; past it the least recently used idle actor
    /// is closed to make room (a request never fails for it).
    pub instances_max: u32,
    /// Actors' databases open at once in this process (each holds two
    /// files); past it the least recently used idle actors close their
    /// database and keep their instance, and open it again at their next
    /// event (a cluster node closes them whole) (ADR 0068). 0: derived at
    /// start from the open-files limit
    /// ([`crate::node::open_databases_max_for`]).
    pub open_databases_max: u32,
    /// An actor with nothing to do for this long is closed.
    pub actor_idle_ms: u64,
    /// Events waiting for one actor; past it requests get `actor_overloaded`.
    pub actor_queue_events_max: usize,
    /// Bytes of requests (bodies, paths, headers) waiting for one actor;
    /// past it requests get `actor_overloaded`.
    pub actor_queue_bytes_max: u64,
    /// Bytes of requests waiting for all actors of the node together;
    /// past it requests get `node_overloaded`.
    pub node_queue_bytes_max: u64,
    /// Memory all tenants together may make the node hold: guests' linear
    /// memories and tables plus SQLite's heap. Past it a guest's memory
    /// stops growing (`memory_exceeded`) and a guest's statement fails
    /// (`node_memory_exhausted`).
    pub node_memory_bytes_max: u64,
    /// Request bodies being read, all tenants together (`None`: an eighth of
    /// `node_memory_bytes_max`), and WebSocket messages being received
    /// (`None`: a sixteenth); see [`crate::pools`].
    pub request_bodies_bytes_max: Option<u64>,
    pub socket_buffers_bytes_max: Option<u64>,
    /// The changed pages uploads hold (`None`: an eighth of
    /// `node_memory_bytes_max`).
    pub replica_buffers_bytes_max: Option<u64>,
    /// The share of each pool one tenant may hold, in percent.
    pub tenant_share_pct: u8,
    /// Actors one tenant may have on this node ([`crate::quotas`]).
    pub tenant_actors_max: u64,
    /// Bytes one tenant's databases may take on this node together
    /// (`None`: `tenant_share_pct` of the data folder's filesystem).
    pub tenant_disk_bytes_max: Option<u64>,
    /// Bytes one tenant may hold in the bucket, all nodes together, as last
    /// measured (`None`: four times `tenant_disk_bytes_max`, what a
    /// database's snapshots and log keep beside it); see
    /// [`crate::quotas`].
    pub tenant_bucket_bytes_max: Option<u64>,
    /// How often a tenant's bytes and actors in the bucket are measured
    /// (0: never, and the bucket quota is not checked).
    pub bucket_usage_interval_ms: u64,
    /// Events of one actor that share one transaction.
    pub batch_events_max: usize,
    /// A turn starts no new event once it has run this long: the rest of
    /// the actor's queue waits for its next turn, behind other actors.
    pub batch_time_budget_ms: u64,
    /// Worker threads running events (0: one per core, at least 2).
    pub workers: usize,
    /// Threads beside `workers` that run turns only while others have run
    /// past `turn_slice_ms` (`None`: twice `workers`), so that short turns
    /// are not stuck behind runaway ones (see `scheduler`).
    pub workers_spare: Option<usize>,
    /// A turn that has run longer than this makes room for another on a
    /// spare thread.
    pub turn_slice_ms: u64,
    /// Turns of one tenant running at once, long ones included (`None`: as
    /// many as `workers`): a tenant's runaway events hold its own share
    /// only.
    pub tenant_workers_max: Option<usize>,
    /// Largest component a deploy accepts.
    pub component_bytes_max: usize,
    /// Versions kept per app for `rollback` (each deploy that changes the
    /// component or the manifest is one; at least 1 is kept); older ones,
    /// and components no kept version names, are removed.
    pub app_versions_max: usize,
    /// Wall time compiling one component may take before its deploy is
    /// refused (`compile_timeout`). In a child process ([`Compile::Process`])
    /// the child is stopped then; on a thread ([`Compile::Thread`]) the
    /// compilation cannot be cancelled: it runs on to its end, holding one
    /// of `app::COMPILES_RUNNING_MAX` places, and its result is dropped.
    pub component_compile_ms_max: u64,
    /// Memory (heap and private writable mappings) one compilation in a
    /// child process may take (`compile_memory_exceeded`); a compilation
    /// on a thread is not bounded.
    pub component_compile_memory_bytes_max: u64,
    /// Where components are compiled: a child process (bounded, stopped at
    /// its deadline) or a thread of the node (for trusted components only).
    pub compile: Compile,
    /// Core instances, linear memories and tables one component may
    /// contain; checked when it is compiled (a deploy past them is
    /// refused), and they size the instance pool with `instances_max`.
    pub component_core_instances_max: u32,
    pub component_memories_max: u32,
    pub component_tables_max: u32,
    /// Log lines, and bytes of them, one call into a guest may write; past
    /// either, its further lines are dropped and one line says how many.
    pub event_log_lines_max: u32,
    pub event_log_bytes_max: usize,
    /// Largest response body a guest may return.
    pub response_body_bytes_max: usize,
    /// The cluster protocol's settings (ADR 0009, 0020): lease timings, the
    /// sweep, and the alarm backoff (`retry_first_ms`, doubling per failure
    /// up to `retry_max_ms`), the one source of that backoff for committed
    /// retries, the index rules and the sweep alike, in a cluster or not.
    /// (The backoff was two settings once, and the sweep kept the default
    /// cap whatever the node's `alarm_retry_max_ms` said.)
    pub protocol: wasmkeep_cluster::ClusterConfig,
    /// Actors whose alarm is due within this long are opened ahead of time.
    pub alarm_prepare_ms: u64,
    /// How long an actor answers a repeated `Idempotency-Key` with the
    /// recorded answer (`idempotency`).
    pub idempotency_retention_ms: u64,
    /// Alarms handed to workers per timer pass.
    pub alarm_fire_batch_max: usize,
    /// Whether the first actor of a class prepared ahead of its alarm, while
    /// nothing is learned of the class's handler, runs the handler once on a
    /// throwaway instance and rolls it back, to learn its statements
    /// (ADR 0030).
    pub alarm_rehearse: bool,
    /// Limits of each actor's database (an app's manifest may override
    /// them, up to `app_limit_ceilings`).
    pub store: StoreLimits,
    /// The highest value an app's manifest may give each of its `[limits]`;
    /// an unset one (the default) is the node's own setting, so manifests
    /// may only lower it. A ceiling below the node's setting counts as the
    /// node's setting. A deploy above a ceiling is refused
    /// (`limit_above_node_ceiling`); an app deployed before a ceiling was
    /// lowered is clamped to it at start-up, with a warning.
    pub app_limit_ceilings: AppLimits,
    /// Where compiled components are cached (default: `<data>/cache`).
    /// Entries are named by component hash and engine settings, so nodes
    /// and tests may share one folder.
    pub compile_cache_dir: Option<PathBuf>,
    /// The secret that tags compiled components in the cache (default:
    /// `<data>/compile-cache.key`, or `WASMKEEP_COMPILE_CACHE_KEY`); only
    /// code tagged with it is loaded. Nodes sharing a cache folder share
    /// compiled code only if they share this key.
    pub compile_cache_key_path: Option<PathBuf>,
    /// The node is a replay's sandbox (ADR 0062): each event takes its
    /// time and seed from the replay's tape, nothing is recorded, and no
    /// outbox row is handed over (a replay reaches nothing outside).
    pub replay_sandbox: bool,
    /// Where every actor's database is replicated (ADR 0007); `None`: the
    /// node is purely local.
    pub bucket: Option<Bucket>,
    /// How each actor's chain in the bucket is snapshotted and kept.
    pub replica: ReplicaConfig,
    /// How long a restore refused because of what the bucket holds
    /// (`storage_corrupt`) is remembered: meanwhile the actor's events get
    /// the same error without a request to the bucket. 0: every turn
    /// tries again.
    pub restore_refused_retry_ms: u64,
    /// Least time between the starts of two uploads of one actor, unless a
    /// `replicated` request waits for the later one (it starts as soon as
    /// the one in flight ends). Bounds what a busy actor costs in PUTs: at
    /// most one per interval for plain replies. 0: upload after every
    /// commit, as soon as the previous upload ended.
    pub replica_upload_interval_ms: u64,
    /// A cluster node (`--advertise`): it keeps ADR 0009's alarm index,
    /// and uploads only actors it holds (see `index`). The hold comes from
    /// the [`RunGate`](crate::RunGate) the node sets before it serves;
    /// until then nothing is uploaded.
    pub cluster: bool,
    /// The outbox's bounds (ADR 0040; `outbox_*` in the configuration).
    pub outbox: OutboxLimits,
    /// The highest each app's `[outbound]` may set, and what an app that
    /// sets none gets (its hosts list stays empty: nothing is allowed).
    pub outbound: OutboundCeilings,
    /// Parked replies' bounds (ADR 0042).
    pub parked: ParkedLimits,
    /// WebSockets' bounds (ADR 0043).
    pub sockets: SocketLimits,
    /// The recent log lines kept for `wasmkeep logs` ([`crate::logs`]).
    pub logs: crate::logs::LogHubLimits,
    /// Classes with label sets of their own in `/metrics`; past it, a
    /// deployed class counts under `_other` ([`crate::class_metrics`]).
    pub metrics_classes_max: usize,
    /// How often the data folder is walked for each class's disk use (0:
    /// never).
    pub metrics_census_ms: u64,
}

/// The node's bounds on outbound HTTP calls; an app's `[outbound]` may
/// lower each, never raise it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundCeilings {
    /// Per attempt.
    pub timeout_ms_max: u64,
    pub response_bytes_max: usize,
    /// Calls one actor has in flight.
    pub per_actor_max: usize,
    /// Calls one app has in flight on this node.
    pub per_app_max: usize,
    /// Whether tenants may reach loopback, private and link-local
    /// addresses (off: an allowed name that resolves there is refused).
    pub private_allowed: bool,
}

impl Default for OutboundCeilings {
    fn default() -> Self {
        OutboundCeilings {
            timeout_ms_max: 30_000,
            response_bytes_max: 4 * 1024 * 1024,
            per_actor_max: 4,
            per_app_max: 256,
            private_allowed: false,
        }
    }
}

impl RuntimeConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        RuntimeConfig {
            data_dir: data_dir.into(),
            durability: Durability::Fsync,
            commit_log: true,
            event_cpu_ms_max: 30_000,
            instance_memory_bytes_max: 128 * 1024 * 1024,
            instance_keep_resident_bytes: 1024 * 1024,
            instances_max: 2048,
            open_databases_max: 0,
            actor_idle_ms: 60_000,
            actor_queue_events_max: 1000,
            actor_queue_bytes_max: 64 * 1024 * 1024,
            node_queue_bytes_max: 1024 * 1024 * 1024,
            node_memory_bytes_max: crate::pools::default_node_memory_bytes(),
            request_bodies_bytes_max: None,
            socket_buffers_bytes_max: None,
            replica_buffers_bytes_max: None,
            tenant_share_pct: crate::pools::TENANT_SHARE_PCT,
            tenant_actors_max: 1_000_000,
            tenant_disk_bytes_max: None,
            tenant_bucket_bytes_max: None,
            bucket_usage_interval_ms: 300_000,
            batch_events_max: 256,
            batch_time_budget_ms: 20,
            workers: 0,
            workers_spare: None,
            turn_slice_ms: 100,
            tenant_workers_max: None,
            component_bytes_max: 64 * 1024 * 1024,
            app_versions_max: 10,
            component_compile_ms_max: 60_000,
            component_compile_memory_bytes_max: 2 * 1024 * 1024 * 1024,
            compile: Compile::Thread,
            // A TypeScript app (QuickJS and its adapters, ADR 0048) has
            // 13 core instances and 3 memories.
            component_core_instances_max: 16,
            component_memories_max: 3,
            component_tables_max: 4,
            event_log_lines_max: EVENT_LOG_LINES_MAX,
            event_log_bytes_max: EVENT_LOG_BYTES_MAX,
            response_body_bytes_max: 32 * 1024 * 1024,
            protocol: wasmkeep_cluster::ClusterConfig::default(),
            alarm_prepare_ms: 2_000,
            idempotency_retention_ms: 24 * 3_600_000,
            alarm_fire_batch_max: 4096,
            alarm_rehearse: true,
            store: StoreLimits::default(),
            app_limit_ceilings: AppLimits::default(),
            compile_cache_dir: None,
            compile_cache_key_path: None,
            bucket: None,
            replica: ReplicaConfig::default(),
            restore_refused_retry_ms: RESTORE_REFUSED_RETRY_MS,
            replica_upload_interval_ms: REPLICA_UPLOAD_INTERVAL_MS,
            cluster: false,
            outbox: Default::default(),
            outbound: OutboundCeilings::default(),
            parked: Default::default(),
            sockets: Default::default(),
            logs: Default::default(),
            metrics_classes_max: 1_000,
            metrics_census_ms: 60_000,
            replay_sandbox: false,
        }
    }

    /// Worker threads that run turns side by side (the cores' worth).
    pub fn worker_threads(&self) -> usize {
        if self.workers > 0 {
            self.workers
        } else {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                .max(2)
        }
    }

    /// The pools' bounds ([`crate::pools`]).
    pub fn pool_limits(&self) -> crate::pools::PoolLimits {
        crate::pools::PoolLimits {
            request_bodies_bytes_max: self
                .request_bodies_bytes_max
                .unwrap_or(self.node_memory_bytes_max / 8),
            socket_buffers_bytes_max: self
                .socket_buffers_bytes_max
                .unwrap_or(self.node_memory_bytes_max / 16),
            replica_buffers_bytes_max: self
                .replica_buffers_bytes_max
                .unwrap_or(self.node_memory_bytes_max / 8),
            tenant_share_pct: self.tenant_share_pct,
        }
    }

    /// Every thread that may run a turn: the workers and the spares.
    pub fn turn_threads(&self) -> usize {
        let spare = self.workers_spare.unwrap_or(2 * self.worker_threads());
        self.worker_threads() + spare
    }
}

/// The node's bounds on the outbox (`RuntimeConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxLimits {
    /// Messages one actor may have waiting for their answer.
    pub pending_max: u64,
    /// Largest message body or HTTP request body.
    pub body_bytes_max: usize,
    /// Largest context a sender attaches.
    pub context_bytes_max: usize,
    /// Deliveries of one message tried before it fails for good.
    pub attempts_max: u32,
    /// The first retry's wait; each next one doubles, up to
    /// `retry_max_ms`.
    pub retry_first_ms: u64,
    pub retry_max_ms: u64,
    /// Times an answer is offered to a failing `on-response` before it is
    /// dropped.
    pub response_attempts_max: u32,
    /// Messages the node delivers at once (all actors).
    pub in_flight_max: usize,
    /// Messages one actor has in delivery at once.
    pub per_actor_max: usize,
    /// Bytes of bodies and contexts the dispatcher holds in memory; past
    /// it, an actor's rows stay in its database until there is room.
    pub node_bytes_max: u64,
}

impl Default for OutboxLimits {
    fn default() -> Self {
        OutboxLimits {
            pending_max: 1_000,
            body_bytes_max: 1024 * 1024,
            context_bytes_max: 64 * 1024,
            attempts_max: 10,
            retry_first_ms: 200,
            retry_max_ms: 60_000,
            response_attempts_max: 5,
            in_flight_max: 1_024,
            per_actor_max: 16,
            node_bytes_max: 256 * 1024 * 1024,
        }
    }
}

/// The node's bounds on parked replies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedLimits {
    /// Longest a reply may stay parked (and the most `park` may ask).
    pub reply_ms_max: u64,
    /// Replies parked on the node at once.
    pub node_max: usize,
    /// Replies one actor has parked at once.
    pub per_actor_max: usize,
    /// Replies one tenant's actors have parked at once on the node, so
    /// that one tenant cannot take every place the node has.
    pub per_tenant_max: usize,
}

impl Default for ParkedLimits {
    fn default() -> Self {
        ParkedLimits {
            reply_ms_max: 300_000,
            // Each parked reply holds its request's connection: below the
            // default connections_max (1,024), whose requests in flight
            // are bounded per tenant too (the server's `shares`).
            node_max: 768,
            per_actor_max: 256,
            per_tenant_max: 256,
        }
    }
}

/// The node's bounds on sockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketLimits {
    pub per_actor_max: usize,
    /// Sockets one tenant's actors hold on the node together, so that one
    /// tenant cannot take every socket the node allows.
    pub per_tenant_max: usize,
    pub node_max: usize,
    /// Largest message either way.
    pub message_bytes_max: usize,
    /// Bytes queued for one socket's client before it is closed (1008).
    pub send_buffer_bytes_max: usize,
    /// A socket that neither sends nor receives for this long is closed
    /// (1001); 0: never.
    pub idle_ms: u64,
}

impl Default for SocketLimits {
    fn default() -> Self {
        SocketLimits {
            per_actor_max: 10_000,
            per_tenant_max: 50_000,
            node_max: 100_000,
            message_bytes_max: 1024 * 1024,
            send_buffer_bytes_max: 1024 * 1024,
            idle_ms: 600_000,
        }
    }
}

/// Per-app overrides of the node's limits; unset fields keep the node's.
/// The node's `app_limit_ceilings` has the same shape: the highest value
/// each may be given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppLimits {
    pub value_bytes_max: Option<usize>,
    pub sql_bytes_max: Option<usize>,
    pub sql_params_max: Option<usize>,
    pub key_bytes_max: Option<usize>,
    pub database_bytes_max: Option<u64>,
    pub kv_list_entries_max: Option<u32>,
    pub event_cpu_ms_max: Option<u64>,
}
