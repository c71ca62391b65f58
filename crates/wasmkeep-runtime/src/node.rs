//! The node's shared state: [`Inner`], which every worker, actor turn,
//! upload and delivery takes (through [`crate::Runtime`] from outside), and
//! the [`RunGate`] a cluster sets on it. `runtime.rs` builds it, starts the
//! node's threads over it and is the public door; this module is what the
//! actors' layer may use of it (`tests/layers.rs`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::{Mutex, RwLock};
use tokio::sync::oneshot;
use wasmkeep_store::sqlite_setup::release_free_memory;
use wasmkeep_store::{ActorId, paths};
use wasmtime::Engine;
use wasmtime::component::Linker;

use crate::actor::{Actor, Event, EventKind, Outcome, Queue};
use crate::app::{App, CompileSlots};
use crate::clock::Clock;
use crate::compile_cache::CacheKey;
use crate::config::RuntimeConfig;
use crate::dispatch::Dispatcher;
use crate::durability::DurabilityStage;
use crate::error::RuntimeError;
use crate::host::HostState;
use crate::metrics::Metrics;
use crate::outbox::{Inbound, MessageAnswer};
use crate::replication::Replication;
use crate::timer::Timer;

/// An evicted actor, its `last_used_ms` when it was picked, and what of
/// it closes.
pub(crate) type ToClose = (Arc<Actor>, u64, Closes);

/// What the closer thread closes of an actor it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Closes {
    /// Its instance and database (`make_room`, `instances_max`).
    Instance,
    /// Its database only; the instance stays and opens it again at its
    /// next event (`make_room_for_database`, `open_databases_max`).
    Database,
}

/// Open files a node keeps for what is not an actor's database (its
/// connections up to the default `connections_max` of 1,024, sockets,
/// compiled code, logs) when it derives `open_databases_max` from the
/// open-files limit.
pub const OPEN_FILES_KEPT: u64 = 2_048;
/// How long an open actor goes unused before its log index gives back
/// its zero pages (ADR 0078): one reaper pass.
pub(crate) const INDEX_IDLE_MS: u64 = 1_000;

/// The least `open_databases_max` derived from a small open-files limit.
pub(crate) const OPEN_DATABASES_MIN: usize = 64;
/// Most databases one pass of `make_room_for_database` sends the closer
/// thread: half its queue (`CLOSE_QUEUE_MAX`, 128), so that the
/// instances `make_room` sends still find room.
const DATABASES_CLOSED_PER_PASS_MAX: usize = 64;

/// Actors with unsent messages a cluster node keeps to resume once it
/// acts (the start-up scan's); past it, an actor's rows go out when it
/// opens next.
pub(crate) const OUTBOX_RESUMES_KEPT_MAX: usize = 100_000;

/// `open_databases_max` for a setting of `configured` (0: derived) and an
/// open-files limit of `open_files`: two files per database, within what
/// [`OPEN_FILES_KEPT`] leaves (half the limit when it is below twice
/// that), less a sixteenth for the databases still open while the closer
/// thread closes a pass of them.
pub fn open_databases_max_for(configured: u32, open_files: u64) -> usize {
    if configured > 0 {
        return configured as usize;
    }
    // A limit below twice what is kept keeps half of it instead.
    let kept = OPEN_FILES_KEPT.min(open_files / 2);
    let databases = open_files.saturating_sub(kept) / 2;
    ((databases - databases / 16) as usize).max(OPEN_DATABASES_MIN)
}

/// `candidates` (actors with when they were last used), the `batch + 1`
/// least recently used first, in order (the rest after them, unordered):
/// one pass of eviction looks at the first ones, and at the rest only when
/// they were running.
fn least_recent_first(
    mut candidates: Vec<(u64, Arc<Actor>)>,
    batch: usize,
) -> Vec<(u64, Arc<Actor>)> {
    if candidates.len() > batch {
        candidates.select_nth_unstable_by_key(batch, |(used, _)| *used);
    }
    let head = candidates.len().min(batch + 1);
    candidates[..head].sort_by_key(|(used, _)| *used);
    candidates
}

/// This process's open-files limit (its soft bound), if it can be read.
pub(crate) fn open_files_limit() -> Option<u64> {
    // SAFETY: `getrlimit` fills the plain struct it is given.
    unsafe {
        let mut l: libc::rlimit = std::mem::zeroed();
        (libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0).then_some(l.rlim_cur as u64)
    }
}

/// An app's version being rolled out, and the share of its actors that
/// run it (ADR 0059).
pub(crate) type Candidate = (Arc<App>, u8);

/// The shared core; workers and the server hold it through [`Runtime`].
pub struct Inner {
    pub config: RuntimeConfig,
    pub clock: Arc<dyn Clock>,
    pub engine: Engine,
    pub(crate) linker: Linker<HostState>,
    pub(crate) apps: RwLock<HashMap<(String, String), Arc<App>>>,
    /// Apps with a version being rolled out (ADR 0059): that version, and
    /// the share of actors (by [`rollout_share`]) below which they run it.
    pub(crate) candidates: RwLock<HashMap<(String, String), Candidate>>,
    pub(crate) app_version: AtomicU64,
    /// Held while a deploy writes its app's folder and version.
    pub(crate) deploys: Mutex<()>,
    pub(crate) actors: Mutex<HashMap<ActorId, Arc<Actor>>>,
    /// Actors waiting for a turn, by tenant ([`crate::scheduler`]).
    pub(crate) runq: crate::scheduler::RunQueue,
    /// Passes of the reaper that closed actors; workers give memory back
    /// after one (see `worker`).
    pub(crate) reaped: AtomicU64,
    /// Evicted actors for the closer thread, with their `last_used_ms`
    /// when picked (see `make_room`).
    pub(crate) close_tx: std::sync::mpsc::SyncSender<ToClose>,
    pub(crate) close_rx: Mutex<Option<std::sync::mpsc::Receiver<ToClose>>>,
    /// Instances queued for the closer and not closed yet: they still count
    /// in `instances_active` but are on their way out.
    pub(crate) closing: AtomicU64,
    /// Databases queued for the closer ([`Closes::Database`]) and not
    /// closed yet.
    pub(crate) parking: AtomicU64,
    /// `open_databases_max` as it applies (derived at start if 0).
    pub(crate) open_databases_max: usize,
    pub durability: DurabilityStage,
    /// The node's commit log (ADR 0074), with `durability = "fsync"` and
    /// `commit_log` on; the stage makes groups durable through it.
    pub commit_log: Option<Arc<wasmkeep_store::commit_log::CommitLog>>,
    /// Folders for new actors made ahead (ADR 0075); `None` once the node
    /// stopped, or if they could not be started.
    pub spares: Mutex<Option<wasmkeep_store::spare_actors::Spares>>,
    /// The bucket side, when the node has one.
    pub replication: Option<Replication>,
    pub timer: Timer,
    pub metrics: Arc<Metrics>,
    pub(crate) started: Instant,
    /// Set when the node stops; every open database shares it, so a
    /// running guest statement stops too (`ActorDb::set_stop_flag`).
    pub stopping: Arc<AtomicBool>,
    /// Bytes of requests queued for all actors (`node_queue_bytes_max`).
    pub queued_bytes: AtomicU64,
    pub(crate) cache_dir: PathBuf,
    /// The key compiled code in the cache is tagged with; `None`: the cache
    /// is not used (see `cache_key`).
    pub(crate) cache_key: Option<CacheKey>,
    /// Compilations running, abandoned ones included.
    pub(crate) compiles: Arc<CompileSlots>,
    /// Faults a test may inject (the test kit's switches; none in a
    /// build without `test-faults`).
    pub faults: crate::faults::Faults,
    /// Who may run an actor's alarms on this node ([`RunGate`]); unset:
    /// every actor, as on a single node.
    pub(crate) gate: std::sync::OnceLock<Arc<dyn RunGate>>,
    /// Due alarms the gate kept from running here.
    pub(crate) alarms_gated_total: AtomicU64,
    /// Delivers what actors sent (ADR 0040).
    pub outbox: Dispatcher,
    /// Apps' secrets (ADR 0041).
    pub secrets: crate::app_config::SecretStore,
    /// Replies parked until a later event completes them (ADR 0042).
    pub parked: Arc<crate::parked::ParkedReplies>,
    /// Open WebSockets (ADR 0043).
    pub sockets: Arc<crate::sockets::SocketTable>,
    /// Recent log lines about actors, for `wasmkeep logs` (issue 22).
    pub logs: Arc<crate::logs::LogHub>,
    /// Spans of traced requests (ADR 0064).
    pub traces: Arc<crate::trace::Traces>,
    /// Whether events that do not pass the HTTP edge (messages, socket
    /// events) write access lines to the node's log: the server's
    /// `access_log`, set through [`crate::Runtime::set_access_log`].
    pub access_log: AtomicBool,
    /// Cuts failing-alarm warnings in the node's log to a rate.
    pub alarm_failure_rate: crate::logs::RateCut,
    /// Series labelled by tenant, app and class (also in `metrics`).
    pub class_metrics: Arc<crate::class_metrics::ClassMetricsRegistry>,
    /// What the host holds for tenants besides SQLite and guests.
    pub pools: crate::pools::Pools,
    /// Each tenant's actors and bytes on this node, and their bounds.
    pub quotas: Arc<crate::quotas::Quotas>,
    /// Classes a deploy is migrating (ADR 0060): their events are refused.
    pub migrating: crate::class_migrations::Gates,
    /// Held by a pass of the reaper, from taking actors off the node to
    /// closing them (a migration waits for it).
    pub(crate) reaping: Mutex<()>,
    /// Bytes of recording bases per app on this node (ADR 0062).
    pub(crate) recording_bytes: crate::recording::AppBytes,
    /// Held while a replay runs: one at a time on a node (each runs two
    /// sandbox runtimes).
    pub(crate) replaying: Mutex<()>,
    /// A replay's sandbox: the time and seed of the next event.
    pub(crate) sandbox_tape: Mutex<Option<crate::guest_tape::EventTape>>,
    /// The data directory's lock, held from the start to the end of
    /// [`crate::Runtime::shutdown`] (`wasmkeep_store::data_lock`).
    pub(crate) data_lock: Mutex<Option<wasmkeep_store::data_lock::DataLock>>,
    /// Set by the first [`crate::Runtime::shutdown`]: a later call (a
    /// cluster node's, after it released its holds) changes nothing, the
    /// folder being another node's to use from the first one's end.
    pub(crate) shut_down: AtomicBool,
    /// Actors with unsent rows a cluster node found before it acted, at
    /// most [`OUTBOX_RESUMES_KEPT_MAX`].
    pub(crate) outbox_resumes_kept: Mutex<std::collections::HashSet<ActorId>>,
}

/// Whether this node may run an actor's alarms now. A single node always
/// may. In a cluster only while its lease lets it act and it holds the
/// actor: an alarm due for an actor another node holds is that node's to
/// fire, and one this node fired after losing its lease could run twice.
/// Requests are gated at the HTTP edge, which knows who owns an actor.
pub trait RunGate: Send + Sync {
    fn may_run(&self, id: &ActorId) -> bool;

    /// The generation of the hold under which this node has `id` now, if
    /// its lease lets it act and it holds the actor; what index entries
    /// are tagged with (R1, R3).
    fn hold_generation(&self, _id: &ActorId) -> Option<u64> {
        None
    }

    /// A random number this node never used before for an entry (R1).
    fn nonce(&self) -> u64 {
        0
    }

    /// The epoch of the lease in which this node routes actors now (a
    /// cluster node; `None` while it does not). An actor's copy opened in
    /// an earlier epoch is stale: the node may have lost and retaken the
    /// actor since, so its next turn opens it afresh from the bucket.
    fn epoch(&self) -> Option<u64> {
        None
    }

    /// Whether this node measures `tenant`'s use of the bucket (and
    /// publishes it) rather than reading another node's measurement: in a
    /// cluster one node per tenant does ([`crate::quotas`]).
    fn measures_usage(&self, _tenant: &str) -> bool {
        true
    }
}

/// Instances one open closes at most when tenants' memory is full
/// (`Inner::evict_for_memory`).
pub(crate) const EVICT_FOR_MEMORY_MAX: usize = 16;

/// Runs an inbound event (ADR 0040) on this node and returns what a
/// message's receiver answered.
pub(crate) async fn deliver_inbound(
    rt: &Arc<Inner>,
    to: ActorId,
    ev: Inbound,
) -> Result<Option<MessageAnswer>, RuntimeError> {
    let (tx, rx) = oneshot::channel();
    rt.enqueue(&to, Event::new(EventKind::Inbound(ev), Some(tx)), true)?;
    match rx.await {
        Ok(Ok(Outcome::Answered(a))) => Ok(Some(a)),
        Ok(Ok(_)) => Ok(None),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(RuntimeError::ShuttingDown),
    }
}

impl Inner {
    /// Whether this node holds `id` now (always, on a single node); never
    /// waits for the actor's slot in the cluster's table.
    pub(crate) fn holds_actor(&self, id: &ActorId) -> bool {
        self.gate
            .get()
            .is_none_or(|g| g.hold_generation(id).is_some())
    }

    /// Opens `id` to hand its outbox's rows to the dispatcher again (after
    /// a restart, or once the dispatcher has room).
    pub fn resume_outbox(&self, id: &ActorId) {
        self.enqueue_outbox_resume(id, None);
    }

    /// Asks `id`'s next turn to hand its outbox's rows up to `upto` (all
    /// of them, read again from the first, with `None`) to the dispatcher.
    pub(crate) fn enqueue_outbox_resume(&self, id: &ActorId, upto: Option<u64>) {
        let _ = self.enqueue(
            id,
            Event::new(EventKind::OutboxResume { upto }, None),
            false,
        );
    }

    pub fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Whether this node keeps the alarm index: a cluster node with a bucket.
    pub fn keeps_index(&self) -> bool {
        self.replication.is_some() && self.config.cluster
    }

    /// The hold generation index entries of `id` are tagged with.
    pub fn hold_generation(&self, id: &ActorId) -> Option<u64> {
        self.gate.get().and_then(|g| g.hold_generation(id))
    }

    /// Whether this node may open `id` for work no one asked of it (an
    /// outbox resume). A node without a cluster gate may. A cluster node
    /// takes the actor first, as for an alarm (`RunGate::may_run`; ADR
    /// 0020: a copy opened while another node holds it would be served,
    /// stale, once this node took it again); one another node holds sends
    /// its rows from there when it opens. Before the node acts (its gate
    /// not attached yet, or no lease epoch yet: the start-up scan) the
    /// actor is kept, and resumed once it does
    /// ([`Inner::resume_kept_outboxes`]).
    pub(crate) fn may_open_unasked(&self, id: &ActorId) -> bool {
        let acting = |g: &Arc<dyn RunGate>| g.epoch().is_some();
        if let Some(g) = self.gate.get()
            && acting(g)
        {
            return g.may_run(id);
        }
        if !self.keeps_index() {
            return true;
        }
        let mut kept = self.outbox_resumes_kept.lock();
        // Acting meanwhile: the reaper resumes what is kept under this lock.
        if let Some(g) = self.gate.get()
            && acting(g)
        {
            drop(kept);
            return g.may_run(id);
        }
        if kept.len() < OUTBOX_RESUMES_KEPT_MAX {
            kept.insert(id.clone());
        } else {
            tracing::warn!(actor = %id, limit = OUTBOX_RESUMES_KEPT_MAX,
                "too many actors with unsent messages before the node acts: this one's go out when it opens next");
        }
        false
    }

    /// Resumes the outboxes [`Inner::may_open_unasked`] kept, once the
    /// node acts (the reaper's pass).
    pub(crate) fn resume_kept_outboxes(&self) {
        let kept = {
            let mut kept = self.outbox_resumes_kept.lock();
            if kept.is_empty() || self.gate.get().is_none_or(|g| g.epoch().is_none()) {
                return;
            }
            std::mem::take(&mut *kept)
        };
        for id in &kept {
            self.resume_outbox(id);
        }
    }

    /// The gate's routing epoch (0 on a single node, and while a cluster
    /// node does not route).
    pub fn gate_epoch(&self) -> u64 {
        self.gate.get().and_then(|g| g.epoch()).unwrap_or(0)
    }

    /// A fresh nonce for an index entry.
    pub fn index_nonce(&self) -> u64 {
        self.gate.get().map_or(0, |g| g.nonce())
    }

    /// How many of a tenant's apps deployed here have a class named `class`.
    pub fn apps_with_class(&self, tenant: &str, class: &str) -> usize {
        self.apps
            .read()
            .iter()
            .filter(|((t, _), a)| t == tenant && a.classes.iter().any(|c| c == class))
            .count()
    }

    /// The app version `id` runs: the candidate of a rollout if the actor
    /// is within its share, else the app's whole version.
    pub fn app_for(&self, id: &ActorId) -> Option<Arc<App>> {
        let key = (id.tenant.clone(), id.app.clone());
        if let Some((candidate, percent)) = self.candidates.read().get(&key)
            && rollout_share(id) < *percent
        {
            return Some(Arc::clone(candidate));
        }
        self.apps.read().get(&key).cloned()
    }

    /// The app's version being rolled out, and its share.
    pub fn candidate(&self, tenant: &str, app: &str) -> Option<Candidate> {
        self.candidates
            .read()
            .get(&(tenant.to_owned(), app.to_owned()))
            .cloned()
    }

    pub fn app(&self, tenant: &str, app: &str) -> Option<Arc<App>> {
        self.apps
            .read()
            .get(&(tenant.to_owned(), app.to_owned()))
            .cloned()
    }

    /// Puts an actor on the run queue.
    pub fn schedule(&self, actor: Arc<Actor>) {
        self.runq.push(actor);
    }

    /// Adds an event to an actor's queue, scheduling the actor if it was idle.
    pub fn enqueue(&self, id: &ActorId, ev: Event, bounded: bool) -> Result<(), RuntimeError> {
        // An upload of what an actor committed passes a migration's gate:
        // the migration waits for it (ADR 0060), and it runs no guest code.
        let gated = !matches!(
            ev.kind,
            crate::actor::EventKind::Between(crate::actor::Between::Replicate)
        );
        self.enqueue_gated(id, ev, bounded, gated)
    }

    /// A class migration's own event on an actor of a class it closed
    /// (its copy, restore or delete, ADR 0060): past the gate that
    /// refuses every other event of the class.
    pub(crate) fn enqueue_migrating(&self, id: &ActorId, ev: Event) -> Result<(), RuntimeError> {
        self.enqueue_gated(id, ev, false, false)
    }

    fn enqueue_gated(
        &self,
        id: &ActorId,
        ev: Event,
        bounded: bool,
        gated: bool,
    ) -> Result<(), RuntimeError> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err(RuntimeError::ShuttingDown);
        }
        loop {
            let actor = {
                let mut actors = self.actors.lock();
                // Under the actors' lock: a migration closing the class
                // takes it too before it looks at the class's actors.
                if gated && let Some(refused) = self.migrating.refuses(id) {
                    return Err(refused);
                }
                Arc::clone(
                    actors
                        .entry(id.clone())
                        .or_insert_with(|| Arc::new(Actor::new(id.clone()))),
                )
            };
            let mut q = actor.queue.lock();
            if q.retired {
                continue;
            }
            // What a suspended actor waits for is never refused for the
            // events it holds meanwhile.
            let awaited = q
                .awaiting
                .as_ref()
                .is_some_and(|a| crate::actor::awaiting::admitted(&ev.kind, a.seq));
            if bounded && !awaited {
                self.admit(&q, &ev)?;
            }
            let ev = match &q.awaiting {
                Some(a) => match crate::actor::awaiting::at_gate(id, a, ev) {
                    Some(ev) => ev,
                    None => return Ok(()),
                },
                None => ev,
            };
            let runs_now = q
                .awaiting
                .as_ref()
                .is_none_or(|a| crate::actor::awaiting::admitted(&ev.kind, a.seq));
            let bytes = ev.queued_bytes();
            q.bytes += bytes;
            self.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
            q.events.push_back(ev);
            if !q.scheduled && runs_now {
                q.scheduled = true;
                drop(q);
                self.schedule(actor);
            }
            return Ok(());
        }
    }

    /// Whether `ev` may join an actor's queue: bounded in events and bytes
    /// per actor, and in bytes for the whole node, so that a wedged or slow
    /// actor cannot make the node hold its callers' bodies without bound.
    fn admit(&self, q: &Queue, ev: &Event) -> Result<(), RuntimeError> {
        let c = &self.config;
        let bytes = ev.queued_bytes();
        let refused = if q.events.len() >= c.actor_queue_events_max {
            Some(RuntimeError::ActorOverloaded {
                queued: q.events.len(),
                limit: c.actor_queue_events_max,
            })
        } else if q.bytes + bytes > c.actor_queue_bytes_max {
            Some(RuntimeError::QueueBytesExceeded {
                scope: "actor",
                limit_name: "actor_queue_bytes_max",
                queued: q.bytes,
                limit: c.actor_queue_bytes_max,
            })
        } else {
            let node = self.queued_bytes.load(Ordering::Relaxed);
            (node + bytes > c.node_queue_bytes_max).then_some(RuntimeError::QueueBytesExceeded {
                scope: "node",
                limit_name: "node_queue_bytes_max",
                queued: node,
                limit: c.node_queue_bytes_max,
            })
        };
        match refused {
            Some(e) => {
                Metrics::inc(&self.metrics.overloaded_total);
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Closes idle actors: instance dropped, database closed.
    pub(crate) fn reap_idle(&self) {
        self.reap_idle_after(self.config.actor_idle_ms);
    }

    /// Closes `id` if it has nothing queued or running and its uploads are
    /// done (what the idle reaper checks); true if it is not open now.
    pub(crate) fn close_if_idle(&self, id: &ActorId) -> bool {
        let _pass = self.reaping.lock();
        let closed = {
            let mut actors = self.actors.lock();
            let Some(a) = actors.get(id) else {
                return true;
            };
            let Some(mut q) = a.queue.try_lock() else {
                return false;
            };
            if q.scheduled || !q.events.is_empty() || a.repl.try_lock().is_none_or(|r| r.busy()) {
                return false;
            }
            q.retired = true;
            drop(q);
            actors.remove(id)
        };
        if let Some(a) = closed {
            *a.slot.lock() = None;
            self.reaped.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Closes the actors unused for `idle` ms with nothing queued, running
    /// or uploading; returns how many.
    pub(crate) fn reap_idle_after(&self, idle: u64) -> usize {
        let _pass = self.reaping.lock();
        let now = self.elapsed_ms();
        let mut closed = Vec::new();
        {
            let mut actors = self.actors.lock();
            actors.retain(|_, a| {
                let used = a.last_used_ms.load(Ordering::Relaxed);
                if now.saturating_sub(used) < idle {
                    return true;
                }
                let Some(mut q) = a.queue.try_lock() else {
                    return true;
                };
                if q.scheduled || !q.events.is_empty() {
                    return true;
                }
                // Its uploads still need it (and its waiters, an answer).
                if a.repl.try_lock().is_none_or(|r| r.busy()) {
                    return true;
                }
                q.retired = true;
                closed.push(Arc::clone(a));
                false
            });
        }
        if closed.is_empty() {
            return 0;
        }
        let n = closed.len();
        for a in closed {
            *a.slot.lock() = None;
        }
        self.reaped.fetch_add(1, Ordering::Relaxed);
        release_free_memory();
        n
    }

    /// Gives back the log index's zero pages (ADR 0028) of the open
    /// actors unused for `idle` ms that did not give them back since their
    /// last event, and unmaps the index blocks kept for reuse if no open
    /// took one since the last pass; returns the bytes given back. The
    /// reaper calls this each pass with [`INDEX_IDLE_MS`]: an actor that
    /// committed a few times (from its sixteenth commit on one open, its
    /// commits give the pages back themselves) and closes sooner returns
    /// its index whole, for the next open to reuse without a system call
    /// (ADR 0078).
    pub(crate) fn give_back_idle_index_pages(&self, idle: u64) -> usize {
        let now = self.elapsed_ms();
        let idle_ones: Vec<(u64, Arc<Actor>)> = self
            .actors
            .lock()
            .values()
            .filter_map(|a| {
                let used = a.last_used_ms.load(Ordering::Relaxed);
                (now.saturating_sub(used) >= idle
                    && a.index_given_back_at.load(Ordering::Relaxed) != used)
                    .then(|| (used, Arc::clone(a)))
            })
            .collect();
        let mut bytes = 0;
        for (used, a) in idle_ones {
            // A held lock means the actor is running: next pass.
            let Some(slot) = a.slot.try_lock() else {
                continue;
            };
            if let Some(l) = slot.as_ref() {
                bytes += l.give_back_index_pages();
            }
            a.index_given_back_at.store(used, Ordering::Relaxed);
        }
        wasmkeep_store::db::trim_kept_index_blocks();
        bytes
    }

    /// Reads what freed instance slots keep resident for their next
    /// instance (ADR 0078) into `wasmkeep_instance_slots_resident_bytes`;
    /// returns it. The reaper calls this each pass.
    pub(crate) fn read_instance_slots_resident(&self) -> u64 {
        let kept = self.engine.pooling_allocator_metrics().map_or(0, |pool| {
            pool.unused_memory_bytes_resident() + pool.unused_table_bytes_resident()
        }) as u64;
        self.metrics.instance_slots_resident_bytes.set(kept);
        kept
    }

    /// Instances that stay once the queued closes are done.
    fn instances_staying(&self) -> u64 {
        self.metrics
            .instances_active
            .get()
            .saturating_sub(self.closing.load(Ordering::Relaxed))
    }

    /// Before an instance is created: while the node is at
    /// `instances_max`, drops the instances of the least recently used
    /// actors that are not running. Only running actors (at most one per
    /// worker) pin their instance, so there is always one to drop; a
    /// dropped actor keeps its queue and is instantiated again for its next
    /// turn. One pass over the actors evicts a sixteenth of the pool at
    /// once, so a stream of new actors does not scan the map for each one.
    ///
    /// The evicted actors are closed by the closer thread, not here: a
    /// close of a long log checkpoints it and syncs the file, about a
    /// millisecond (a short one is left as it is, ADR 0076), and a pass of
    /// a hundred of them stalled the worker and every actor queued behind
    /// it (ADR 0024).
    pub fn make_room(&self, for_id: &ActorId) {
        let max = self.config.instances_max as u64;
        if self.instances_staying() < max {
            return;
        }
        let batch = (self.config.instances_max as usize / 16).max(1);
        let candidates = least_recent_first(self.loaded_actors_but(for_id), batch);
        let mut evicted = 0;
        for (used, a) in candidates {
            if evicted >= batch && self.instances_staying() < max {
                break;
            }
            // A held lock means the actor is running: skip it. So is one
            // whose snapshot reads its file (closing would tear it).
            if !a.slot.try_lock().is_some_and(|s| s.is_some())
                || a.repl.try_lock().is_none_or(|r| r.snapshot_reads_file())
                || a.evicting.swap(true, Ordering::Relaxed)
            {
                continue;
            }
            self.closing.fetch_add(1, Ordering::Relaxed);
            match self.close_tx.try_send((a, used, Closes::Instance)) {
                Ok(()) => evicted += 1,
                Err(
                    std::sync::mpsc::TrySendError::Full((a, _, _))
                    | std::sync::mpsc::TrySendError::Disconnected((a, _, _)),
                ) => {
                    self.closing.fetch_sub(1, Ordering::Relaxed);
                    a.evicting.store(false, Ordering::Relaxed);
                    if let Some(mut slot) = a.slot.try_lock()
                        && slot.take().is_some()
                    {
                        Metrics::inc(&self.metrics.evictions_total);
                        evicted += 1;
                    }
                }
            }
        }
    }

    /// Before an actor's database is opened: while the process holds
    /// `open_databases_max` of them (less those queued to close), sends the
    /// least recently used open actors that are not running, up to a
    /// sixteenth of the bound (and the closer's queue), to the closer
    /// thread, which closes their databases and keeps their instances (a
    /// node with a bucket: closes them whole, as `make_room` does). The
    /// count is the process's (`wasmkeep_store::db::open_actor_databases`),
    /// as the open-files limit is; the actors are this node's (ADR 0068).
    pub fn make_room_for_database(&self, for_id: &ActorId) {
        let max = self.open_databases_max;
        let (closes, queued) = if self.replication.is_some() {
            (Closes::Instance, &self.closing)
        } else {
            // Instances `make_room` queued are mostly ones whose database
            // is closed already (the least recently used): not counted.
            (Closes::Database, &self.parking)
        };
        let staying = || {
            wasmkeep_store::db::open_actor_databases()
                .saturating_sub(queued.load(Ordering::Relaxed) as usize)
        };
        if staying() < max {
            return;
        }
        let batch = (max / 16).clamp(1, DATABASES_CLOSED_PER_PASS_MAX);
        // Only actors whose database is open: those already closed are the
        // least recently used and would fill the head of the order.
        let mut candidates = self.loaded_actors_but(for_id);
        candidates.retain(|(_, a)| {
            a.slot
                .try_lock()
                .is_some_and(|s| s.as_ref().is_some_and(|l| l.has_db()))
        });
        let candidates = least_recent_first(candidates, batch);
        let mut sent = 0;
        for (used, a) in candidates {
            if sent >= batch && staying() < max {
                break;
            }
            // A held lock means the actor is running; one whose database is
            // closed already has nothing to give.
            if !a
                .slot
                .try_lock()
                .is_some_and(|s| s.as_ref().is_some_and(|l| l.has_db()))
                || a.repl.try_lock().is_none_or(|r| r.snapshot_reads_file())
                || a.evicting.swap(true, Ordering::Relaxed)
            {
                continue;
            }
            let counter = match closes {
                Closes::Instance => &self.closing,
                Closes::Database => &self.parking,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            if self
                .close_tx
                .try_send((Arc::clone(&a), used, closes))
                .is_err()
            {
                // The closer is behind: the next open tries again.
                counter.fetch_sub(1, Ordering::Relaxed);
                a.evicting.store(false, Ordering::Relaxed);
                break;
            }
            sent += 1;
        }
    }

    /// Every actor with an instance except `for_id`, with when it was last
    /// used: the candidates for eviction.
    fn loaded_actors_but(&self, for_id: &ActorId) -> Vec<(u64, Arc<Actor>)> {
        let actors = self.actors.lock();
        actors
            .iter()
            .filter(|(id, a)| *id != for_id && a.is_loaded())
            .map(|(_, a)| (a.last_used_ms.load(Ordering::Relaxed), Arc::clone(a)))
            .collect()
    }

    /// Closes, on this thread, up to `EVICT_FOR_MEMORY_MAX` of the least
    /// recently used instances that are not running, to give their memory
    /// back to the node's budget (`node_memory_bytes_max`); returns how
    /// many it closed. Rare (the budget is full), so it does not wait for
    /// the closer thread.
    pub fn evict_for_memory(&self, for_id: &ActorId) -> usize {
        let mut candidates = self.loaded_actors_but(for_id);
        candidates.sort_by_key(|(used, _)| *used);
        let mut closed = 0;
        for (_, a) in candidates {
            if closed >= EVICT_FOR_MEMORY_MAX {
                break;
            }
            // A held lock means the actor is running: skip it. So is one
            // whose snapshot reads its file (closing would tear it).
            if a.repl.try_lock().is_none_or(|r| r.snapshot_reads_file()) {
                continue;
            }
            if let Some(mut slot) = a.slot.try_lock()
                && slot.take().is_some()
            {
                Metrics::inc(&self.metrics.evictions_total);
                closed += 1;
            }
        }
        closed
    }

    /// After a batch failed in a way that may leave a past-due alarm
    /// committed: look again after the first retry delay, not at once.
    /// Called with the actor's database closed; if it cannot be read, the
    /// timer looks again anyway (an alarm event with nothing due changes
    /// nothing and puts the committed alarm back in the timer).
    pub fn rearm_after_failure(&self, id: &ActorId) {
        let path = paths::actor_db(&self.config.data_dir, id);
        let later = self.clock.now_ms() + self.config.protocol.retry_first_ms;
        let next = match wasmkeep_store::db::read_alarm(&path) {
            Ok(committed) => committed.map(|a| (a.at_ms.max(later), a.retry_count)),
            Err(e) => {
                tracing::warn!(actor = %id, error = %e, "could not read the committed alarm; looking again later");
                Some((later, 0))
            }
        };
        self.timer.set_alarm(id, next);
    }

    /// Whether the gate lets this node run `id`'s alarm now.
    pub(crate) fn may_run(&self, id: &ActorId) -> bool {
        let allowed = self.gate.get().is_none_or(|g| g.may_run(id));
        if !allowed {
            // Dropped from this node's timer: whoever holds the actor fires
            // it, and a restore here arms the timer again from the database.
            self.alarms_gated_total.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(actor = %id, "alarm not run: this node may not run the actor now");
        }
        allowed
    }

    /// Hands due alarms to their actors.
    pub(crate) fn fire_due(&self, now: u64) {
        let due = self.timer.pop_due(now, self.config.alarm_fire_batch_max);
        for (id, _) in due {
            if !self.may_run(&id) {
                continue;
            }
            let fired = self.enqueue(
                &id,
                Event::new(EventKind::Alarm { force: false }, None),
                false,
            );
            if let Err(RuntimeError::ClassMigration { .. }) = fired {
                // Its class is being migrated: the alarm stays in the
                // database; look again shortly (gone, if it moved).
                self.rearm_after_failure(&id);
            }
        }
        self.metrics.alarms_pending.set(self.timer.len() as u64);
    }

    /// Opens actors whose alarm is due soon, so the due instant only costs
    /// the handler: at most as many, waiting for their alarm, as the node
    /// holds instances (more would close the ones prepared first, whose
    /// alarms come first; ADR 0077).
    pub(crate) fn prepare_soon(&self, now: u64) {
        if self.config.alarm_prepare_ms == 0 {
            return;
        }
        let room = (self.config.instances_max as usize).max(1);
        for id in self
            .timer
            .to_prepare(now + self.config.alarm_prepare_ms, room)
        {
            if self.gate.get().is_some_and(|g| !g.may_run(&id)) {
                continue;
            }
            let _ = self.enqueue(&id, Event::new(EventKind::Prepare, None), false);
        }
    }
}

/// An actor's place in its app's rollouts, 0 to 99: stable for its
/// address (a hash of it), so that raising a rollout's share only ever
/// adds actors to it (ADR 0059).
pub(crate) fn rollout_share(id: &ActorId) -> u8 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [&id.tenant, &id.app, &id.class, &id.name] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let d = h.finalize();
    let n = u64::from_le_bytes(d[..8].try_into().expect("8 bytes"));
    (n % 100) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_databases_max_follows_the_open_files_limit_unless_set() {
        assert_eq!(open_databases_max_for(500, 20_000), 500);
        // Half of what 2,048 files leave, less a sixteenth.
        assert_eq!(open_databases_max_for(0, 20_000), 8_415);
        // 1,024 (a common soft limit): half kept, 256 databases less a
        // sixteenth.
        assert_eq!(open_databases_max_for(0, 1_024), 240);
        assert_eq!(open_databases_max_for(0, 100), OPEN_DATABASES_MIN);
        assert!(open_databases_max_for(0, 1 << 20) > 400_000);
    }
}
