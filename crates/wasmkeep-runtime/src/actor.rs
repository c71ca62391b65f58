//! One actor's queue and its turns.
//!
//! Events for an actor wait in its bounded queue. When the queue goes from
//! empty to non-empty the actor is put on the node's run queue, and one
//! worker takes it: that worker alone runs the actor's events until the
//! queue is empty, so at most one event runs per actor at a time and each
//! runs to completion before the next (serial turns).
//!
//! A worker takes all queued events (up to `batch_events_max`) and runs them
//! in one SQLite transaction, each in a savepoint of its own: an event that
//! fails rolls back alone. The transaction commits once; the replies then go
//! to the durability stage, which releases them when the commit is on disk.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tokio::sync::oneshot;
use wasmkeep_cluster::retry::{RetryPolicy, after_alarm_run};
use wasmkeep_store::{ActorDb, ActorId, AlarmState, OpenMode, StoreError, paths};
use wasmtime::Store;

use crate::app::App;
use crate::config::Durability;
use crate::config::epoch_ticks;
use crate::durability::SyncJob;
use crate::error::RuntimeError;
use crate::host::{self, AlarmOp, HostState};
use crate::index::{DeliverStep, Delivered};
use crate::metrics::Metrics;
use crate::outbox::{Answer, Inbound, MessageAnswer};
use crate::replication::{self, ActorReplica};
use crate::runtime::Inner;

/// An HTTP-shaped request for one actor.
#[derive(Debug, Clone, Default)]
pub struct ActorRequest {
    pub method: String,
    /// The path after the actor's address, starting with `/`.
    pub path: String,
    /// The query string without `?`.
    pub query: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Answer only once the bucket holds the event's commit (the
    /// `wasmkeep-durability: replicated` header); otherwise after the
    /// local commit.
    pub replicated: bool,
}

/// What an actor answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActorResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The request's event accepted a WebSocket upgrade (ADR 0043): the
    /// socket's id, registered in the node's table once the event was
    /// durable; the edge completes the upgrade.
    pub socket: Option<u64>,
}

/// Something that happened on one of an actor's sockets (ADR 0043).
#[derive(Debug, Clone)]
pub enum SocketEvent {
    Message {
        id: u64,
        message: crate::sockets::Message,
        /// The socket as it was when the message arrived (filled by
        /// `Runtime::socket_event`): what the event carries if the socket
        /// closed before it ran, so a message sent just before a close is
        /// not lost.
        sent_as: Option<crate::sockets::SocketInfo>,
    },
    /// The socket is gone from the table; `info` is what it was.
    Closed {
        info: crate::sockets::SocketInfo,
        code: u16,
        reason: String,
    },
}

/// What a finished event reports to whoever waits for it.
#[derive(Debug)]
pub enum Outcome {
    Response(ActorResponse),
    /// An alarm ran (`true`) or found nothing due (`false`).
    Alarm(bool),
    /// A delete removed data (`true`) or found none (`false`).
    Deleted(bool),
    /// An operator's database became the actor's (`crate::restore`).
    Restored(crate::restore::Restored),
    /// What a sweep's delivery of an index entry found.
    Delivered(crate::index::Delivered),
    /// What a message's receiver answered (ADR 0040).
    Answered(MessageAnswer),
    Done,
}

pub use crate::reply::Reply;

mod inbound;
use inbound::{offer_outbox, outbox_opened, outbox_ready, run_message, run_response};

pub enum EventKind {
    Request(ActorRequest),
    /// Run the alarm if the committed one is due (or, with `force`, now).
    Alarm {
        force: bool,
    },
    /// Open the actor ahead of an alarm, running nothing.
    Prepare,
    /// A sweep delivers the alarm index entry at `at_ms` (ADR 0009): run
    /// the alarm if it is the committed one and due, otherwise find out
    /// what may be removed (a cluster node only).
    Deliver {
        at_ms: u64,
        /// The entry is in the actor's app's index: stale entries are
        /// removed in the turn (see `index::deliver`).
        remove_here: bool,
    },
    /// Remove the actor's data.
    Delete,
    /// Make the database file at this path the actor's: an operator's
    /// restore, between two events (`crate::restore`).
    Restore(std::path::PathBuf),
    /// Read the actor's database between events (the admin API): through
    /// its own connection if it is open, which holds the file while it is.
    Inspect(InspectFn),
    /// Upload what is committed and not yet in the bucket (after an upload
    /// ended and more had been committed meanwhile).
    Replicate,
    /// A message from another actor, or the answer to one this actor sent
    /// (ADR 0040).
    Inbound(Inbound),
    /// A socket's message or close (ADR 0043).
    Socket(SocketEvent),
    /// Hand the outbox's rows up to `upto` to the dispatcher (after a
    /// batch that sent, once its commit is durable and, with a bucket, in
    /// the bucket); with `None`, all of them again (after a restart, or
    /// once the dispatcher has room).
    OutboxResume {
        upto: Option<u64>,
    },
}

/// What an [`EventKind::Inspect`] runs; it sends its own result.
pub(crate) type InspectFn = Box<dyn FnOnce(DbAccess<'_>) + Send>;

/// How an inspection reaches an actor's database.
pub enum DbAccess<'a> {
    /// The actor is open: its own connection, between events.
    Open(&'a ActorDb),
    /// The actor is not open, and cannot be opened while this runs (its
    /// turn holds it): the database file, which may not exist.
    Closed(&'a std::path::Path),
}

pub struct Event {
    pub kind: EventKind,
    pub reply: Option<Reply>,
    pub enqueued: Instant,
}

impl Event {
    pub fn new(
        kind: EventKind,
        reply: Option<oneshot::Sender<Result<Outcome, RuntimeError>>>,
    ) -> Event {
        Event {
            kind,
            reply: reply.map(Reply::new),
            enqueued: crate::clock::instant(),
        }
    }

    fn is_request(&self) -> bool {
        matches!(self.kind, EventKind::Request(_))
    }

    /// Whether the event may create the actor (a request or a message).
    fn creates(&self) -> bool {
        matches!(
            self.kind,
            EventKind::Request(_) | EventKind::Inbound(Inbound::Message { .. })
        )
    }

    /// What the event holds in memory while it waits in a queue (a
    /// request's body, path and headers; other events are small).
    pub fn queued_bytes(&self) -> u64 {
        match &self.kind {
            EventKind::Request(r) => {
                let headers: usize = r.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
                (r.body.len() + r.path.len() + r.query.len() + r.method.len() + headers) as u64
            }
            EventKind::Inbound(Inbound::Message { body, .. }) => body.len() as u64,
            EventKind::Socket(SocketEvent::Message { message, .. }) => match message {
                crate::sockets::Message::Text(t) => t.len() as u64,
                crate::sockets::Message::Binary(b) => b.len() as u64,
            },
            EventKind::Inbound(Inbound::Response { answer, .. }) => match answer {
                Answer::Message(MessageAnswer::Reply(b)) => b.len() as u64,
                Answer::Http { body, headers, .. } => {
                    let h: usize = headers.iter().map(|(k, v)| k.len() + v.len()).sum();
                    (body.len() + h) as u64
                }
                _ => 0,
            },
            _ => 0,
        }
    }

    /// Whether the event's answer waits for the bucket too (with one): a
    /// `replicated` request, and every message or answer between actors,
    /// since its sender acts on it (deletes its row, sends the next) as if
    /// it could not be lost.
    fn is_replicated(&self) -> bool {
        match &self.kind {
            EventKind::Request(r) => r.replicated,
            EventKind::Inbound(_) => true,
            _ => false,
        }
    }
}

#[derive(Default)]
pub struct Queue {
    pub events: VecDeque<Event>,
    /// On the run queue or being run by a worker.
    pub scheduled: bool,
    /// Closed for good; whoever finds it so looks the actor up again.
    pub retired: bool,
    /// What the queued events hold (`Event::queued_bytes`), summed.
    pub bytes: u64,
}

/// A live instance and the database it owns.
pub struct Loaded {
    store: Store<HostState>,
    /// `None` after a trap: the next event gets a fresh instance.
    bindings: Option<host::Actor>,
    /// The app's `inbox` export, if it has one (ADR 0040).
    inbox: Option<host::inbox_exports::InboxExports>,
    /// The app's `socket-handler` export, if it has one (ADR 0043).
    socket_handler: Option<host::socket_exports::SocketExports>,
    app: Arc<App>,
    metrics: Arc<Metrics>,
}

impl Drop for Loaded {
    fn drop(&mut self) {
        self.metrics.instances_active.dec();
    }
}

impl Loaded {
    fn db(&mut self) -> &mut ActorDb {
        self.store
            .data_mut()
            .db
            .as_mut()
            .expect("a loaded actor holds its database")
    }

    fn take_db(mut self) -> ActorDb {
        self.store
            .data_mut()
            .db
            .take()
            .expect("a loaded actor holds its database")
    }

    /// Closes the instance's database, rolled back already: a failure path
    /// closes it before it re-arms the timer (which reads the committed
    /// alarm on a connection of its own, and would wait for this one) and
    /// before anyone hears back. The instance is dropped with the turn.
    fn close_db(&mut self) {
        drop(self.store.data_mut().db.take());
    }

    /// Replaces a trapped instance with a fresh one over the same
    /// database. On `Err` the database is closed and this instance holds
    /// none: the caller closes the actor.
    fn fresh_instance(
        &mut self,
        rt: &Arc<Inner>,
        app: &Arc<App>,
        id: &ActorId,
    ) -> Result<(), RuntimeError> {
        let Some(db) = self.store.data_mut().db.take() else {
            return Err(RuntimeError::Internal(
                "the instance lost its database".into(),
            ));
        };
        // The trapped instance goes first, as a close would drop it: its
        // memory counts against the node's budget until then.
        let empty = HostState::new(None, id.clone(), Arc::clone(&rt.clock), 0);
        drop(std::mem::replace(
            &mut self.store,
            Store::new(&rt.engine, empty),
        ));
        self.bindings = None;
        self.inbox = None;
        self.socket_handler = None;
        match instantiate(rt, app, id, db) {
            Ok(fresh) => {
                *self = fresh;
                Ok(())
            }
            // The database comes back with the error and is closed here.
            Err(failed) => Err(failed.0),
        }
    }
}

pub struct Actor {
    pub id: ActorId,
    /// The actor's tenant, shared with the run queue's tenant queues.
    pub tenant: Arc<str>,
    pub queue: Mutex<Queue>,
    pub slot: Mutex<Option<Loaded>>,
    /// Milliseconds since the runtime started, at the last event.
    pub last_used_ms: AtomicU64,
    /// Queued for the closer thread (`Inner::make_room`).
    pub evicting: AtomicBool,
    /// Where the actor's replica stands (unused without a bucket).
    pub repl: Mutex<ActorReplica>,
    /// Signalled when an upload of this actor ends.
    pub repl_done: Condvar,
    /// The highest outbox row handed to the dispatcher since the actor was
    /// opened (0 after opening: all of them are offered again).
    pub outbox_offered: AtomicU64,
    /// The highest outbox row known durable (and, with a bucket, in the
    /// bucket): what may be offered again without waiting.
    pub outbox_durable: AtomicU64,
}

impl Actor {
    pub fn new(id: ActorId) -> Actor {
        Actor {
            tenant: Arc::from(id.tenant.as_str()),
            id,
            queue: Mutex::new(Queue::default()),
            slot: Mutex::new(None),
            last_used_ms: AtomicU64::new(0),
            evicting: AtomicBool::new(false),
            repl: Mutex::new(ActorReplica::default()),
            repl_done: Condvar::new(),
            outbox_offered: AtomicU64::new(0),
            outbox_durable: AtomicU64::new(0),
        }
    }

    pub fn is_loaded(&self) -> bool {
        self.slot.try_lock().map(|s| s.is_some()).unwrap_or(true)
    }
}

/// An event of a batch that ran, waiting for the batch's commit (and its
/// durability) to be answered.
struct Ran {
    reply: Option<Reply>,
    out: Result<Outcome, RuntimeError>,
    /// When a request was enqueued (for its latency).
    started: Option<Instant>,
    /// Whether it waits for the bucket too.
    replicated: bool,
    /// The request parked its reply (ADR 0042): it waits for a later
    /// event to complete it instead of leaving.
    park: Option<crate::parked::Park>,
    /// The request accepted a WebSocket (ADR 0043).
    accepted: Option<crate::sockets::Accepted>,
}

fn ms_between(a: Instant, b: Instant) -> f64 {
    b.saturating_duration_since(a).as_secs_f64() * 1000.0
}

fn reply(r: Option<Reply>, v: Result<Outcome, RuntimeError>) {
    if let Some(r) = r {
        let _ = r.send(v);
    }
}

/// Runs one turn of `actor`: the events queued now, up to the batch bound,
/// until the turn has run `batch_time_budget_ms`; what it did not start
/// goes back to the front of the queue, and the actor behind the others of
/// its tenant (`scheduler`).
pub fn run_turn(rt: &Arc<Inner>, actor: &Arc<Actor>) {
    let events: Vec<Event> = {
        let mut q = actor.queue.lock();
        let n = q.events.len().min(rt.config.batch_events_max);
        let events: Vec<Event> = q.events.drain(..n).collect();
        let bytes: u64 = events.iter().map(Event::queued_bytes).sum();
        q.bytes -= bytes;
        rt.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
        events
    };
    actor.last_used_ms.store(rt.elapsed_ms(), Ordering::Relaxed);
    let yield_at = crate::clock::instant() + Duration::from_millis(rt.config.batch_time_budget_ms);
    let not_started = {
        let mut slot = actor.slot.lock();
        run_turn_events(rt, actor, &mut slot, events, yield_at)
    };
    let mut q = actor.queue.lock();
    if !not_started.is_empty() {
        let bytes: u64 = not_started.iter().map(Event::queued_bytes).sum();
        q.bytes += bytes;
        rt.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
        for ev in not_started.into_iter().rev() {
            q.events.push_front(ev);
        }
    }
    if q.events.is_empty() {
        q.scheduled = false;
    } else {
        rt.schedule(Arc::clone(actor));
    }
}

/// Runs a turn's events in order: batches of ordinary events, and deletes,
/// uploads and inspections each on its own between them. Returns the
/// events it did not start because the turn ran out of time (in order).
fn run_turn_events(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    slot: &mut Option<Loaded>,
    events: Vec<Event>,
    yield_at: Instant,
) -> Vec<Event> {
    let mut run: Vec<Event> = Vec::new();
    let mut rest = events.into_iter();
    while let Some(ev) = rest.next() {
        if !matches!(
            ev.kind,
            EventKind::Delete
                | EventKind::Restore(_)
                | EventKind::Replicate
                | EventKind::Inspect(_)
        ) {
            run.push(ev);
            continue;
        }
        let left = run_batch(rt, actor, slot, std::mem::take(&mut run), yield_at);
        if !left.is_empty() {
            return left
                .into_iter()
                .chain(std::iter::once(ev))
                .chain(rest)
                .collect();
        }
        match ev.kind {
            EventKind::Delete => run_delete(rt, actor, slot, ev),
            EventKind::Restore(file) => {
                let r = run_restore(rt, actor, slot, &file).map(Outcome::Restored);
                reply(ev.reply, r);
            }
            EventKind::Replicate => {
                if let Some(repl) = &rt.replication {
                    replication::upload_pending(rt, repl, actor, slot.as_mut().map(|l| l.db()));
                }
            }
            EventKind::Inspect(f) => run_inspect(rt, actor, slot, f),
            _ => unreachable!("only deletes, uploads and inspections run on their own"),
        }
    }
    run_batch(rt, actor, slot, run, yield_at)
}

/// Runs an inspection between two events: through the actor's own
/// connection if it is open, on its file otherwise.
fn run_inspect(rt: &Arc<Inner>, actor: &Arc<Actor>, slot: &mut Option<Loaded>, f: InspectFn) {
    if slot.is_none()
        && let Some(repl) = &rt.replication
        && let Err(e) = replication::ensure_open(rt, repl, actor)
    {
        // Inspection reads what is local; say why it may be missing or
        // stale.
        tracing::warn!(actor = %actor.id, error = %e, "could not bring the actor in line with the bucket before inspecting it");
    }
    if rt.keeps_index() && actor.repl.lock().awaits_first_plan() {
        // Opened (and held) for an inspection with local data the bucket
        // lacks: uploaded now, its alarm listed first, rather than left for
        // a close to forget.
        let _ = rt.enqueue(&actor.id, Event::new(EventKind::Replicate, None), false);
    }
    match slot.as_mut() {
        Some(l) => f(DbAccess::Open(l.db())),
        None => f(DbAccess::Closed(&paths::actor_db(
            &rt.config.data_dir,
            &actor.id,
        ))),
    }
}

fn run_delete(rt: &Arc<Inner>, actor: &Arc<Actor>, slot: &mut Option<Loaded>, ev: Event) {
    // The entry the database names goes once the tombstone landed (R2).
    let named = if rt.keeps_index() {
        match slot.as_mut() {
            Some(l) => crate::index::read_record(l.db()).ok().flatten(),
            None => crate::index::read_record_at(&paths::actor_db(&rt.config.data_dir, &actor.id)),
        }
    } else {
        None
    };
    let path = paths::actor_db(&rt.config.data_dir, &actor.id);
    let size = match slot.as_mut() {
        Some(l) => l.db().size_bytes().ok(),
        None => wasmkeep_store::db::size_bytes_at(&path).ok(),
    };
    *slot = None;
    if let Some(repl) = &rt.replication
        && let Err(e) = replication::delete(rt, repl, actor)
    {
        return reply(ev.reply, Err(e));
    }
    if let (Some(named), Some(repl)) = (named, &rt.replication) {
        crate::index::remove_named(rt, repl, &actor.id, &named);
    }
    rt.timer.set(&actor.id, None);
    rt.outbox.forget(&actor.id);
    rt.parked.drop_actor(&actor.id);
    rt.sockets.close_all(
        Some(&actor.id),
        crate::sockets::close_code::TRY_AGAIN,
        "the actor was deleted",
    );
    actor.outbox_offered.store(0, Ordering::Relaxed);
    actor.outbox_durable.store(0, Ordering::Relaxed);
    let dir = paths::actor_dir(&rt.config.data_dir, &actor.id);
    wasmkeep_store::page_capture::untrack(&dir);
    let existed = dir.join(paths::DB_FILE).exists();
    if existed {
        rt.quotas
            .counted(&actor.id.tenant, false, size.unwrap_or(0));
    }
    let r = if existed {
        // Renamed first so that a crash mid-removal never leaves a
        // half-deleted database where the actor would find it.
        let grave = dir.with_extension(format!("deleted-{}", rt.elapsed_ms()));
        std::fs::rename(&dir, &grave)
            .and_then(|()| std::fs::remove_dir_all(&grave))
            .map(|()| Outcome::Deleted(true))
            .map_err(|e| RuntimeError::Store(e.into()))
    } else {
        Ok(Outcome::Deleted(false))
    };
    reply(ev.reply, r);
}

/// An operator's restore, between two turns (`crate::restore`).
fn run_restore(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    slot: &mut Option<Loaded>,
    file: &std::path::Path,
) -> Result<crate::restore::Restored, RuntimeError> {
    let bytes = crate::restore::check(file)?;
    if let Some(repl) = &rt.replication {
        replication::flush_for_restore(rt, repl, actor, slot.as_mut().map(|l| l.db()))?;
    }
    // Closed before its file is replaced.
    *slot = None;
    let before =
        wasmkeep_store::db::size_bytes_at(&paths::actor_db(&rt.config.data_dir, &actor.id)).ok();
    let (replaced, kept) = crate::restore::swap(rt, actor, file)?;
    if replaced {
        rt.quotas
            .counted(&actor.id.tenant, false, before.unwrap_or(0));
    }
    rt.quotas.counted(&actor.id.tenant, true, bytes);
    let bucket_seq = match &rt.replication {
        Some(repl) => {
            let db = paths::actor_db(&rt.config.data_dir, &actor.id);
            Some(replication::upload_restored(rt, repl, actor, &db)?)
        }
        None => None,
    };
    crate::restore::follow(rt, actor);
    tracing::info!(actor = %actor.id, bytes, replaced, ?kept, ?bucket_seq, "restored the actor's database from an operator's file");
    Ok(crate::restore::Restored {
        replaced,
        kept,
        bucket_seq,
        bytes,
    })
}

fn fail_all(events: Vec<Event>, err: impl Fn() -> RuntimeError) {
    for ev in events {
        reply(ev.reply, Err(err()));
    }
}

fn instantiate(
    rt: &Arc<Inner>,
    app: &Arc<App>,
    id: &ActorId,
    db: ActorDb,
) -> Result<Loaded, Box<(RuntimeError, Option<ActorDb>)>> {
    let started = crate::clock::instant();
    let mut state = HostState::new(
        Some(db),
        id.clone(),
        Arc::clone(&rt.clock),
        rt.config.instance_memory_bytes_max,
    );
    state.alarm_statements = app.alarm_statements.for_class(&id.class);
    if rt.faults.unsafe_outbox_before_commit() {
        state.sent_before_commit = Some(Vec::new());
    }
    state.parked = Some(Arc::clone(&rt.parked));
    state.sockets = Some(Arc::clone(&rt.sockets));
    state.logs = Some(Arc::clone(&rt.logs));
    state.response_body_bytes_max = rt.config.response_body_bytes_max;
    state.config = crate::app_config::InstanceConfig {
        vars: Arc::clone(&app.vars),
        secrets: rt.secrets.of(&id.tenant, &id.app),
    };
    state.outbox = crate::outbox::OutboxSettings {
        limits: rt.config.outbox.clone(),
        policy: Arc::clone(&app.outbound),
    };
    state.log_budget = crate::log_budget::LogBudget::new(
        rt.config.event_log_lines_max,
        rt.config.event_log_bytes_max,
    );
    let mut store = Store::new(&rt.engine, state);
    store.limiter(|s| &mut s.memory);
    store.set_epoch_deadline(epoch_ticks(app.event_cpu_ms_max));
    let instantiated = app
        .pre
        .instance_pre()
        .instantiate(&mut store)
        .and_then(|instance| {
            let bindings = app.indices.load(&mut store, &instance)?;
            let inbox = match &app.inbox {
                Some(i) => Some(i.load(&mut store, &instance)?),
                None => None,
            };
            let sockets = match &app.socket_handler {
                Some(i) => Some(i.load(&mut store, &instance)?),
                None => None,
            };
            Ok((bindings, inbox, sockets))
        });
    match instantiated {
        Ok((bindings, inbox, socket_handler)) => {
            rt.metrics
                .phase_instantiate
                .observe_ms(started.elapsed().as_secs_f64() * 1000.0);
            rt.metrics.instances_active.inc();
            Metrics::inc(&rt.metrics.instantiations_total);
            Ok(Loaded {
                store,
                bindings: Some(bindings),
                inbox,
                socket_handler,
                app: Arc::clone(app),
                metrics: Arc::clone(&rt.metrics),
            })
        }
        Err(e) => {
            let state = store.data_mut();
            let db = state.db.take();
            let err = if state.memory.node_refused {
                RuntimeError::Store(wasmkeep_store::StoreError::NodeMemoryExhausted {
                    limit: wasmkeep_store::memory_budget::node_bytes_max(),
                })
            } else {
                RuntimeError::Internal(format!("instantiate: {e:#}"))
            };
            Err(Box::new((err, db)))
        }
    }
}

/// A current instance of the actor, taken out of `slot` (the turn owns it
/// while it runs, and puts it back if the actor stays open) or made
/// afresh; `Ok(None)` if the actor has no database and `create` is false.
fn load(
    rt: &Arc<Inner>,
    actor: &Actor,
    app: &Arc<App>,
    slot: &mut Option<Loaded>,
    create: bool,
) -> Result<Option<Loaded>, RuntimeError> {
    let id = &actor.id;
    if rt.replication.is_some() && {
        let st = actor.repl.lock();
        st.given_up() || (rt.keeps_index() && st.stale_epoch(rt.gate_epoch()))
    } {
        // The bucket no longer agrees with this instance's state, or the
        // copy is from before a lapse of the node's lease: drop it and
        // open the actor afresh from the bucket.
        *slot = None;
    }
    if let Some(l) = slot.take_if(|l| l.app.version == app.version && l.bindings.is_some()) {
        return Ok(Some(l));
    }
    let db = match slot.take() {
        Some(l) => l.take_db(),
        None => {
            if let Some(repl) = &rt.replication {
                replication::ensure_open(rt, repl, actor)?;
            }
            let mode = if create {
                OpenMode::Create
            } else {
                OpenMode::Existing
            };
            let dir = paths::actor_dir(&rt.config.data_dir, id);
            if create && !dir.join(paths::DB_FILE).exists() {
                // A new actor: within its tenant's quota, or not at all.
                rt.quotas.may_create(&id.tenant)?;
            }
            match ActorDb::open(&dir, &app.store_limits, mode)? {
                Some(db) => {
                    if db.created() {
                        rt.quotas.counted(&id.tenant, true, 0);
                    }
                    db.set_stop_flag(Arc::clone(&rt.stopping));
                    if rt.replication.is_some() {
                        replication::after_open(actor, &db)?;
                    }
                    db
                }
                None => return Ok(None),
            }
        }
    };
    rt.make_room(id);
    let failed = match instantiate(rt, app, id, db) {
        Ok(l) => return Ok(Some(l)),
        Err(failed) => failed,
    };
    let (err, db) = *failed;
    let (RuntimeError::Store(StoreError::NodeMemoryExhausted { .. }), Some(db)) = (&err, db) else {
        return Err(err);
    };
    // Tenants' memory is full. Idle instances hold most of it (an actor
    // that grew its memory and went quiet keeps it until it is closed):
    // close the least recently used ones and try once more, so that one
    // tenant's idle actors cannot keep every other actor from opening.
    if rt.evict_for_memory(id) == 0 {
        return Err(err);
    }
    match instantiate(rt, app, id, db) {
        Ok(l) => Ok(Some(l)),
        Err(failed) => Err(failed.0),
    }
}

fn trap_error(e: wasmtime::Error, state: &mut HostState, cpu_ms_max: u64) -> RuntimeError {
    if let Some(wasmtime::Trap::Interrupt) = e.downcast_ref::<wasmtime::Trap>() {
        return RuntimeError::CpuTimeExceeded { limit: cpu_ms_max };
    }
    if state.memory.node_refused {
        return RuntimeError::Store(wasmkeep_store::StoreError::NodeMemoryExhausted {
            limit: wasmkeep_store::memory_budget::node_bytes_max(),
        });
    }
    if state.memory.exceeded {
        return RuntimeError::MemoryExceeded {
            limit: state.memory.bytes_max,
        };
    }
    match state.panic_message.take() {
        Some(p) => RuntimeError::Trap(format!("panicked: {p}")),
        None => RuntimeError::Trap(format!("{e:#}")),
    }
}

/// Prepares the instance's per-event state before calling into it.
fn enter(l: &mut Loaded) {
    let cpu_ms = l.app.event_cpu_ms_max;
    l.store.set_epoch_deadline(epoch_ticks(cpu_ms));
    let s = l.store.data_mut();
    // The guest's statements stop at the same deadline as its code: the
    // wasm deadline cannot interrupt a host call into SQLite.
    if let Some(db) = &s.db {
        db.set_deadline(Some(
            crate::clock::instant() + std::time::Duration::from_millis(cpu_ms),
        ));
    }
    s.sql_stopped = None;
    s.memory.exceeded = false;
    s.memory.node_refused = false;
    s.panic_message = None;
    s.poison = None;
    s.in_alarm = false;
    s.alarm_op = AlarmOp::Untouched;
}

/// Calls `on-init` if the actor has not committed one yet. Runs inside the
/// event's savepoint, so a failing first event leaves no trace of init.
fn ensure_init(rt: &Inner, l: &mut Loaded, initialized: &mut bool) -> Result<(), RuntimeError> {
    if *initialized {
        return Ok(());
    }
    enter(l);
    let class = l.store.data().id.class.clone();
    // Init runs once in an actor's life: its statements are not kept.
    l.db().keep_statements(false);
    let bindings = l.bindings.as_ref().expect("instance is live");
    let r = bindings
        .wasmkeep_actor_handler()
        .call_on_init(&mut l.store, &class);
    l.db().keep_statements(true);
    finish_call(l, r)?;
    l.db().mark_initialized(rt.clock.now_ms())?;
    *initialized = true;
    Ok(())
}

/// Turns the result of a guest call into the event's result, dropping the
/// instance after a trap.
fn finish_call<T>(
    l: &mut Loaded,
    r: wasmtime::Result<Result<T, host::WitError>>,
) -> Result<T, RuntimeError> {
    let cpu = l.app.event_cpu_ms_max;
    let s = l.store.data_mut();
    let dropped = s.log_budget.finish_call(&s.id);
    l.metrics.guest_log_lines_dropped_total.inc_by(dropped);
    if let Some(stop) = l.store.data_mut().sql_stopped.take() {
        // A statement was stopped at the deadline (or by the node
        // stopping): the event fails for it even if the guest swallowed
        // the error and went on.
        if r.is_err() {
            l.bindings = None;
        }
        return Err(match stop {
            host::SqlStopped::Deadline => RuntimeError::CpuTimeExceeded { limit: cpu },
            host::SqlStopped::Stopping => RuntimeError::ShuttingDown,
        });
    }
    match r {
        Ok(Ok(v)) => match l.store.data_mut().poison.take() {
            Some(e) => Err(RuntimeError::Guest {
                code: e.code,
                message: e.message,
            }),
            None => Ok(v),
        },
        // The guest's own words reach callers and the node's log: without
        // the app's secret values (ADR 0041).
        Ok(Err(e)) => Err(RuntimeError::Guest {
            code: e.code,
            message: l.store.data().config.scrub(e.message),
        }),
        Err(e) => {
            // A trapped instance may not be entered again.
            l.bindings = None;
            let state = l.store.data_mut();
            let err = trap_error(e, state, cpu);
            Err(match err {
                RuntimeError::Trap(m) => RuntimeError::Trap(state.config.scrub(m)),
                other => other,
            })
        }
    }
}

/// A socket's message or close, as an event of its actor (ADR 0043): its
/// handler runs in a savepoint like a request's; an app without
/// `socket-handler` ignores it.
fn run_socket(rt: &Inner, l: &mut Loaded, ev: SocketEvent) -> Result<Outcome, RuntimeError> {
    if l.socket_handler.is_none() {
        return Ok(Outcome::Done);
    }
    if !rt.holds_actor(&l.store.data().id) {
        // A cluster node that no longer holds the actor: its events run on
        // its owner now, and its clients reconnect there.
        rt.sockets.close_all(
            Some(&l.store.data().id),
            crate::sockets::close_code::MOVED,
            "this node no longer holds the actor: reconnect",
        );
        return Ok(Outcome::Done);
    }
    let table = l.store.data().sockets.clone();
    l.db().event_begin()?;
    enter(l);
    let class = l.store.data().id.class.clone();
    let id = l.store.data().id.clone();
    let exports = l.socket_handler.as_ref().expect("checked above");
    let r = match ev {
        SocketEvent::Message {
            id: socket,
            message,
            sent_as,
        } => {
            let Some(info) = table.and_then(|t| t.info(&id, socket)).or(sent_as) else {
                commit_event(l)?;
                return Ok(Outcome::Done);
            };
            let (info, message) = (
                crate::host::wasmkeep::actor::sockets::SocketInfo::from(&info),
                crate::host::wasmkeep::actor::sockets::Message::from(&message),
            );
            let r = exports
                .wasmkeep_actor_socket_handler()
                .call_on_socket_message(&mut l.store, &class, &info, &message);
            finish_call(l, r)
        }
        SocketEvent::Closed { info, code, reason } => {
            let info = crate::host::wasmkeep::actor::sockets::SocketInfo::from(&info);
            let r = exports
                .wasmkeep_actor_socket_handler()
                .call_on_socket_close(&mut l.store, &class, &info, code, &reason);
            finish_call(l, r)
        }
    };
    end_event(l, r)
}

/// Applies what a batch sent to sockets once it is durable: at once
/// without a bucket, once the bucket holds it with one (a client must not
/// see what a restore would not have).
fn apply_socket_ops(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    ops: Vec<crate::sockets::SocketOp>,
    mark: Option<replication::Mark>,
) {
    let Some(mark) = mark else {
        rt.sockets.apply(&actor.id, ops);
        return;
    };
    let id = actor.id.clone();
    when_uploaded(rt, actor, mark, move |rt| rt.sockets.apply(&id, ops));
}

/// Runs `then` once the bucket holds everything up to `mark` (on the
/// outbox's runtime); never if the actor was given up meanwhile.
fn when_uploaded(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    mark: replication::Mark,
    then: impl FnOnce(&Arc<Inner>) + Send + 'static,
) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    replication::hold_until_uploaded(
        &rt.metrics,
        actor,
        mark,
        Reply::new(tx),
        Ok(Outcome::Done),
        None,
    );
    rt.outbox.when_uploaded(rx, then);
}

/// Ends an event begun with `event_begin` that answers nothing but done:
/// kept if its handler succeeded, rolled back if it failed.
/// Releases the event's savepoint. When SQLite abandoned the whole
/// transaction under the guest (a full database, the tenant's quota), the
/// event fails with that statement's error, whatever the guest made of
/// it, rather than with the savepoint SQLite dropped.
fn commit_event(l: &mut Loaded) -> Result<(), RuntimeError> {
    if let Some(e) = l.store.data_mut().tx_lost.take()
        && !l.db().in_transaction()
    {
        return Err(RuntimeError::Guest {
            code: e.code,
            message: e.message,
        });
    }
    Ok(l.db().event_commit()?)
}

fn end_event(l: &mut Loaded, r: Result<(), RuntimeError>) -> Result<Outcome, RuntimeError> {
    match r {
        Ok(()) => {
            commit_event(l)?;
            Ok(Outcome::Done)
        }
        Err(e) => {
            if l.db().in_transaction() {
                l.db().event_rollback()?;
            }
            Err(e)
        }
    }
}

fn run_request(
    rt: &Arc<Inner>,
    l: &mut Loaded,
    req: ActorRequest,
    initialized: &mut bool,
) -> Result<Outcome, RuntimeError> {
    let was_initialized = *initialized;
    l.db().event_begin()?;
    let r = (|| {
        ensure_init(rt, l, initialized)?;
        enter(l);
        let class = l.store.data().id.class.clone();
        l.store.data_mut().request_is_upgrade = req
            .headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("upgrade") && v.eq_ignore_ascii_case("websocket"));
        let request = host::Request {
            method: req.method,
            path: req.path,
            query: req.query,
            headers: req.headers,
            body: req.body,
        };
        let bindings = l.bindings.as_ref().expect("instance is live");
        // Headers and body arrive through the `response` imports, checked
        // before they are copied (`crate::response`); the status is the
        // result.
        l.store
            .data_mut()
            .response
            .start(rt.config.response_body_bytes_max);
        let r = bindings
            .wasmkeep_actor_handler()
            .call_on_request(&mut l.store, &class, &request);
        let parts = l.store.data_mut().response.finish();
        let status = finish_call(l, r);
        // A limit the guest ran into is the event's error, whatever the
        // guest did with the error it got.
        let (headers, body) = parts?;
        let socket = l.store.data().socket_accepted.as_ref().map(|a| a.id);
        Ok(ActorResponse {
            status: status?,
            headers,
            body,
            socket,
        })
    })();
    match r {
        Ok(resp) => {
            commit_event(l)?;
            Ok(Outcome::Response(resp))
        }
        Err(e) => {
            *initialized = was_initialized;
            if l.db().in_transaction() {
                l.db().event_rollback()?;
            }
            Err(e)
        }
    }
}

/// Calls `on-alarm` for the committed alarm `state`, inside the caller's
/// transaction. The alarm counts as set only until it starts: it is
/// cleared first, so inside the handler get-alarm sees none unless the
/// handler sets one.
fn call_on_alarm(
    l: &mut Loaded,
    state: AlarmState,
) -> Result<wasmtime::Result<Result<(), host::WitError>>, RuntimeError> {
    l.db().set_alarm(None)?;
    enter(l);
    l.store.data_mut().in_alarm = true;
    let class = l.store.data().id.class.clone();
    let info = host::AlarmInfo {
        retry_count: state.retry_count,
        is_retry: state.retry_count > 0,
        scheduled_ms: state.at_ms,
    };
    let bindings = l.bindings.as_ref().expect("instance is live");
    let r = bindings
        .wasmkeep_actor_handler()
        .call_on_alarm(&mut l.store, &class, info);
    l.store.data_mut().in_alarm = false;
    Ok(r)
}

/// A sweep's delivery of the entry at `at_ms` (see `index::deliver`). A
/// fence or a wait for the bucket answers `Fenced`, once the batch's
/// commits are uploaded (the caller makes the event wait for them).
fn run_delivery(
    rt: &Arc<Inner>,
    actor: &Actor,
    l: &mut Loaded,
    initialized: bool,
    at_ms: u64,
    remove_here: bool,
) -> Result<Outcome, RuntimeError> {
    let standing = crate::index::Standing::of(actor);
    let step = crate::index::deliver(
        rt,
        l.db(),
        &actor.id,
        at_ms,
        initialized,
        standing,
        remove_here,
    )?;
    match step {
        DeliverStep::Run => match run_alarm(rt, l, initialized, false)? {
            Outcome::Alarm(true) => Ok(Outcome::Delivered(Delivered::Ran)),
            _ => Ok(Outcome::Delivered(Delivered::NotDue)),
        },
        DeliverStep::Fence | DeliverStep::Wait => Ok(Outcome::Delivered(Delivered::Fenced)),
        DeliverStep::Done(d) => Ok(Outcome::Delivered(d)),
    }
}

/// A delivery for an actor with no database, here or in the bucket: never
/// run. Its entries go when the bucket holds the actor's history (a
/// tombstone) and this opening ended that history (a fence: a tombstone
/// above the one restored); they stay (R2's empty-bucket clause) when the
/// bucket never had the actor.
fn delivered_without_state(
    rt: &Inner,
    actor: &Actor,
    at_ms: u64,
    remove_here: bool,
) -> Result<Outcome, RuntimeError> {
    use crate::index::{NoStateStep, no_state_step, removal};
    let generation = crate::index::generation(rt, &actor.id)?;
    let Some(repl) = rt.replication.as_ref() else {
        return Ok(Outcome::Delivered(Delivered::NotDue));
    };
    let delivered = match no_state_step(crate::index::Standing::of(actor)) {
        NoStateStep::Leave => crate::index::leave(rt.clock.now_ms(), &rt.config.protocol),
        // No database to write `owner_fence` in: a tombstone above the
        // one restored ends the history, and the entries go at once.
        NoStateStep::Fence => {
            replication::fence_deleted(rt, repl, actor)?;
            removal(rt, &actor.id, at_ms, None, generation, remove_here)?
        }
        // An upload still in flight: deliver again.
        NoStateStep::Wait => Delivered::Fenced,
        NoStateStep::Remove => removal(rt, &actor.id, at_ms, None, generation, remove_here)?,
    };
    Ok(Outcome::Delivered(delivered))
}

/// Failing-alarm warnings written to the node's log per second at most
/// (the rest are counted in the next one's `left_out`).
pub(crate) const ALARM_FAILURE_LOG_PER_S: u64 = 100;

fn run_alarm(
    rt: &Arc<Inner>,
    l: &mut Loaded,
    initialized: bool,
    force: bool,
) -> Result<Outcome, RuntimeError> {
    let now = rt.clock.now_ms();
    let Some(state) = l.db().alarm()? else {
        return Ok(Outcome::Alarm(false));
    };
    if (state.at_ms > now && !force) || !initialized {
        return Ok(Outcome::Alarm(false));
    }
    let late_ms = now.saturating_sub(state.at_ms) as f64;
    rt.metrics.alarm_lateness.observe_ms(late_ms);
    let class = rt.class_metrics.of(&l.store.data().id);
    if let Some(c) = &class {
        c.alarm_lateness.observe_ms(late_ms);
        if state.retry_count > 0 {
            c.alarm_retries.inc();
        }
    }
    l.db().event_begin()?;
    let r = call_on_alarm(l, state)?;
    let op = l.store.data().alarm_op;
    match finish_call(l, r) {
        Ok(()) => {
            commit_event(l)?;
            Metrics::inc(&rt.metrics.alarms_fired_total);
            if let Some(c) = &class {
                c.alarm_runs_ok.inc();
            }
            Ok(Outcome::Alarm(true))
        }
        Err(e) => {
            if !l.db().in_transaction() {
                // SQLite dropped the whole transaction (see run_batch).
                return Err(e);
            }
            l.db().event_rollback()?;
            let policy = RetryPolicy {
                first_ms: rt.config.protocol.retry_first_ms,
                max_ms: rt.config.protocol.retry_max_ms,
                retries_max: l.app.manifest.alarms.retries_max,
            };
            // The alarm the handler left before it failed: the one that
            // ran if it did not touch it, due now even if it was run early
            // (the test kit's `run_alarm_now`), so that it backs off.
            let now = rt.clock.now_ms();
            let left = match op {
                AlarmOp::Cleared => None,
                AlarmOp::Set(at) => Some(at),
                AlarmOp::Untouched => Some(state.at_ms.min(now)),
            };
            let out = after_alarm_run(&policy, false, left, state.retry_count, now);
            let next = out.at_ms.map(|at_ms| AlarmState {
                at_ms,
                retry_count: out.retry_count,
            });
            l.db().event_begin()?;
            l.db().set_alarm(next)?;
            commit_event(l)?;
            Metrics::inc(&rt.metrics.alarms_failed_total);
            if let Some(c) = &class {
                c.alarm_runs_failed.inc();
            }
            // A failing alarm is a warning with its count of failures so
            // far and what happens next (issue 22), in the node's log and
            // the actor's (`wasmkeep logs`).
            let id = l.store.data().id.clone();
            let failures = state.retry_count + 1;
            // A guest's error can be megabytes: formatted once, cut once.
            let error = crate::logs::clip(&e.to_string(), crate::logs::LINE_BYTES_MAX).into_owned();
            let message = match next {
                _ if out.dropped => {
                    Metrics::inc(&rt.metrics.alarms_abandoned_total);
                    format!(
                        "alarm failed ({failures} failures): dropped after retries_max; error: {error}"
                    )
                }
                Some(n) => format!(
                    "alarm failed ({failures} failures so far), retry in {} ms; error: {error}",
                    n.at_ms.saturating_sub(now)
                ),
                None => format!("alarm failed ({failures} failures so far); error: {error}"),
            };
            // Many failing actors must not flood the node's log: the
            // warnings are cut to a rate (each actor's own lines are not).
            if let Some(left_out) = rt.alarm_failure_rate.admit(ALARM_FAILURE_LOG_PER_S) {
                tracing::warn!(actor = %id, %error, retry_count = state.retry_count, dropped = out.dropped, left_out, "alarm failed");
            }
            use crate::logs::{Level, LogLine, Source};
            rt.logs
                .push(LogLine::new(now, Level::Warn, Source::Runtime, id, message));
            Err(e)
        }
    }
}

/// Runs the class's alarm handler once, for nothing, so that its statements
/// are learned before the first of the class's alarms is due (ADR 0030).
/// Only the first actor of a class prepared while nothing is learned of the
/// class does this. The handler runs as at its due time, except that:
/// its instance is a new one, dropped after (the actor's own instance and
/// its memory are untouched); everything it writes is in a transaction
/// rolled back (rows, key-value pairs, the alarm); its log lines are
/// dropped. What stays is what the rehearsal is for: the statements it ran,
/// prepared on this actor's connection and noted for the class.
/// Returns whether the actor stays open (its database came back).
fn rehearse_alarm(rt: &Arc<Inner>, app: &Arc<App>, l: &mut Loaded) -> bool {
    let Some(notes) = l.store.data().alarm_statements.clone() else {
        return true;
    };
    if !notes.may_need_rehearsal() {
        return true;
    }
    let Ok(Some(state)) = l.db().alarm() else {
        return true;
    };
    let Some(_rehearsing) = notes.claim_rehearsal() else {
        return true;
    };
    let id = l.store.data().id.clone();
    let Some(db) = l.store.data_mut().db.take() else {
        return false;
    };
    let mut r = match instantiate(rt, app, &id, db) {
        Ok(r) => r,
        Err(failed) => {
            // The database comes back with the error; without it the
            // actor is closed and opened again by its next event.
            return match failed.1 {
                Some(db) => {
                    l.store.data_mut().db = Some(db);
                    true
                }
                None => false,
            };
        }
    };
    Metrics::inc(&rt.metrics.alarm_rehearsals_total);
    let ran = (|| -> Result<(), RuntimeError> {
        r.db().begin()?;
        r.store.data_mut().log_enabled = false;
        let call = call_on_alarm(&mut r, state)?;
        finish_call(&mut r, call)
    })();
    let learned = notes.texts().len();
    if rt.faults.unsafe_rehearsal_commits() {
        let _ = r.db().commit();
    }
    r.db().rollback();
    tracing::debug!(actor = %id, statements = learned, outcome = ?ran.err(), "alarm rehearsed");
    l.store.data_mut().db = Some(r.take_db());
    true
}

/// One turn: the batch's events in one transaction, in the phases below,
/// each its own function. Once the actor is open the turn owns its
/// instance ([`Opened`]) and hands each phase `&mut Loaded`; a phase that
/// ends the turn early (it answered every event itself) says whether the
/// actor stays open ([`Stop`]), and the instance goes back to the slot
/// only then.
///
/// 1. [`resolve_class`]: the actor's app and class still exist.
/// 2. [`open_for_turn`]: the database and an instance are loaded.
/// 3. [`prepare_turn`]: a turn opened ahead of an alarm warms it up.
/// 4. [`run_events`]: each event in the transaction, a savepoint each.
/// 5. [`commit_turn`]: the alarm index is planned, the transaction commits.
/// 6. [`after_commit`]: the timer follows the committed alarm, and the
///    commit is handed to replication.
/// 7. [`release_replies`]: the replies go out once the commit is durable
///    (and, for `replicated` ones, once it is in the bucket).
///
/// Returns the events [`run_events`] did not start because `yield_at`
/// passed (in order), for the actor's next turn.
fn run_batch(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    slot: &mut Option<Loaded>,
    events: Vec<Event>,
    yield_at: Instant,
) -> Vec<Event> {
    if events.is_empty() {
        return Vec::new();
    }
    let Some((app, events)) = resolve_class(rt, &actor.id, events) else {
        return Vec::new();
    };
    let turn = Turn::new(rt, &events, slot.is_some());
    let Some(opened) = open_for_turn(rt, actor, &app, slot, events, &turn) else {
        return Vec::new();
    };
    debug_assert!(slot.is_none(), "the turn owns the instance while it runs");
    let (kept, not_started) = run_opened(rt, actor, &app, &turn, opened, yield_at);
    *slot = kept;
    not_started
}

/// Phases 3 to 7, on an open actor. Returns the instance if the actor
/// stays open, and the events not started.
fn run_opened(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    app: &Arc<App>,
    turn: &Turn,
    opened: Opened,
    yield_at: Instant,
) -> (Option<Loaded>, Vec<Event>) {
    let Opened {
        mut loaded,
        events,
        mut initialized,
    } = opened;
    let l = &mut loaded;
    let events = match prepare_turn(rt, app, l, events, initialized) {
        Ok(events) => events,
        Err(stop) => return (stop.end(loaded), Vec::new()),
    };
    let mut ran = match run_events(rt, actor, app, l, events, &mut initialized, yield_at) {
        Ok(ran) => ran,
        Err(stop) => return (stop.end(loaded), Vec::new()),
    };
    let not_started = std::mem::take(&mut ran.not_started);
    let (ran, committed_at) = match commit_turn(rt, actor, l, ran, initialized) {
        Ok(committed) => committed,
        Err(stop) => return (stop.end(loaded), not_started),
    };
    let (after, results) = match after_commit(rt, actor, l, turn, ran, initialized) {
        Ok(after) => after,
        Err(stop) => return (stop.end(loaded), not_started),
    };
    // A new actor whose first event failed is no actor: its instance and
    // folder go before anyone hears back.
    let kept = match &after.removed {
        Some(dir) => Stop::CloseAndRemove(dir.clone()).end(loaded),
        None => Some(loaded),
    };
    release_replies(rt, actor, results, after, committed_at);
    (kept, not_started)
}

/// How a phase that ended the turn early leaves the actor.
enum Stop {
    /// Open: the instance goes back to the slot.
    Keep,
    /// Closed: a failure left the instance or its transaction unusable;
    /// the actor's next event opens it afresh.
    Close,
    /// Closed, and its folder removed: a new actor whose first event
    /// failed.
    CloseAndRemove(std::path::PathBuf),
}

impl Stop {
    /// The instance, if the actor stays open; otherwise it is dropped (its
    /// database closed) before the folder, if any, is removed.
    fn end(self, loaded: Loaded) -> Option<Loaded> {
        match self {
            Stop::Keep => Some(loaded),
            Stop::Close => None,
            Stop::CloseAndRemove(dir) => {
                drop(loaded);
                let _ = std::fs::remove_dir_all(&dir);
                None
            }
        }
    }
}

/// An actor open for a turn: its instance, owned by the turn, the events
/// left to run and whether its init has run.
struct Opened {
    loaded: Loaded,
    events: Vec<Event>,
    initialized: bool,
}

/// What the phases of one turn share about its events.
struct Turn {
    has_request: bool,
    /// The timer popped this actor's alarm to deliver it: the turn puts
    /// the committed one back, even when nothing was due.
    has_alarm: bool,
    /// The actor was open before this turn.
    was_loaded: bool,
}

impl Turn {
    fn new(rt: &Inner, events: &[Event], was_loaded: bool) -> Turn {
        if let Some(first) = events.first() {
            rt.metrics
                .phase_queue
                .observe_ms(ms_between(first.enqueued, crate::clock::instant()));
        }
        Turn {
            has_request: events.iter().any(Event::creates),
            has_alarm: events
                .iter()
                .any(|e| matches!(e.kind, EventKind::Alarm { .. } | EventKind::Deliver { .. })),
            was_loaded,
        }
    }
}

/// What [`run_events`] leaves for the commit.
struct EventsRan {
    results: Vec<Ran>,
    /// Parked replies the batch's successful events completed.
    completions: Vec<(u64, ActorResponse)>,
    /// What the batch's successful events sent to sockets.
    socket_ops: Vec<crate::sockets::SocketOp>,
    /// An event sent something (committed or not).
    outbox_sent: bool,
    /// An alarm or a delivery ran.
    alarm_ran: bool,
    /// A delivery wrote the owner's fence: the batch plans the index and
    /// its delivery answers once the upload landed.
    fenced: bool,
    alarm_writes_before: u64,
    /// With a bucket: the database's change mark before the batch.
    mark_before: Option<(u64, i64)>,
    /// The database's size before the batch (for the tenant's quota).
    size_before: u64,
    /// Events the batch did not start: the turn's time budget ran out.
    not_started: Vec<Event>,
}

/// What [`after_commit`] leaves for the release of the replies.
struct AfterCommit {
    /// The upload that will carry this commit, with a bucket.
    repl_mark: Option<replication::Mark>,
    /// The first event of a new actor failed: its folder, to remove.
    removed: Option<std::path::PathBuf>,
    wal: std::path::PathBuf,
    dirs: Vec<std::path::PathBuf>,
    /// The outbox's highest row after a batch that sent: rows up to it go
    /// to the dispatcher once the commit is durable (and in the bucket).
    outbox: Option<u64>,
    /// Parked replies this batch completed, sent once it is durable.
    completions: Vec<(u64, ActorResponse)>,
    /// What it sent to sockets, applied once it is durable.
    socket_ops: Vec<crate::sockets::SocketOp>,
}

/// Phase 1: the actor's app and class, or every event fails with
/// `app_not_found` / `class_not_found` (an app deleted or redeployed
/// without the class since the events were queued).
fn resolve_class(rt: &Inner, id: &ActorId, events: Vec<Event>) -> Option<(Arc<App>, Vec<Event>)> {
    let Some(app) = rt.app(&id.tenant, &id.app) else {
        rt.timer.set(id, None);
        fail_all(events, || {
            RuntimeError::AppNotFound(format!("{}/{}", id.tenant, id.app))
        });
        return None;
    };
    if !app.classes.contains(&id.class) {
        rt.timer.set(id, None);
        fail_all(events, || RuntimeError::ClassNotFound {
            app: format!("{}/{}", id.tenant, id.app),
            class: id.class.clone(),
        });
        return None;
    }
    Some((app, events))
}

/// Phase 2: the database and an instance, and whether the actor's init
/// ran. An actor with no database gets one only from a request; an alarm
/// for an actor with no state does not create it.
fn open_for_turn(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    app: &Arc<App>,
    slot: &mut Option<Loaded>,
    events: Vec<Event>,
    turn: &Turn,
) -> Option<Opened> {
    let id = &actor.id;
    let started = crate::clock::instant();
    let loaded = load(rt, actor, app, slot, turn.has_request);
    if !turn.was_loaded {
        rt.metrics
            .phase_open
            .observe_ms(started.elapsed().as_secs_f64() * 1000.0);
    }
    let mut loaded = match loaded {
        Ok(Some(loaded)) => loaded,
        Ok(None) => {
            rt.timer.set(id, None);
            for ev in events {
                let out = match ev.kind {
                    EventKind::Alarm { .. } => Ok(Outcome::Alarm(false)),
                    EventKind::Deliver { at_ms, remove_here } => {
                        delivered_without_state(rt, actor, at_ms, remove_here)
                    }
                    _ => Ok(Outcome::Done),
                };
                reply(ev.reply, out);
            }
            return None;
        }
        Err(RuntimeError::QuotaExceeded {
            tenant,
            what,
            limit_name,
            limit,
        }) => {
            // The tenant's doing: every event hears of its quota.
            fail_all(events, || RuntimeError::QuotaExceeded {
                tenant: tenant.clone(),
                what,
                limit_name,
                limit,
            });
            return None;
        }
        Err(e) => {
            tracing::warn!(actor = %id, error = %e, "could not open actor");
            let msg = e.to_string();
            let code_err = move || RuntimeError::Internal(msg.clone());
            if matches!(e, RuntimeError::Store(_)) {
                // Keep the real store error for the first waiter.
                let mut events = events;
                let first = events.remove(0);
                reply(first.reply, Err(e));
                fail_all(events, code_err);
                return None;
            }
            fail_all(events, code_err);
            return None;
        }
    };
    let l = &mut loaded;
    if !turn.was_loaded {
        // What an earlier run (or another node) left unsent goes out again.
        outbox_opened(rt, actor, l);
    }
    let (resumes, events): (Vec<Event>, Vec<Event>) = events
        .into_iter()
        .partition(|e| matches!(e.kind, EventKind::OutboxResume { .. }));
    for ev in resumes {
        match ev.kind {
            EventKind::OutboxResume { upto: Some(upto) } => offer_outbox(rt, actor, l, Some(upto)),
            // All of them again (room in the dispatcher), but only those
            // known durable (and in the bucket): a batch still on its way
            // there hands its own over when it arrives.
            _ if turn.was_loaded => {
                actor.outbox_offered.store(0, Ordering::Relaxed);
                let durable = actor.outbox_durable.load(Ordering::Relaxed);
                offer_outbox(rt, actor, l, Some(durable));
            }
            _ => {}
        }
        reply(ev.reply, Ok(Outcome::Done));
    }
    if events.is_empty() {
        *slot = Some(loaded);
        return None;
    }
    match l.db().is_initialized() {
        Ok(initialized) => Some(Opened {
            loaded,
            events,
            initialized,
        }),
        Err(e) => {
            // The instance is dropped: the actor closes, before anyone
            // hears back.
            drop(loaded);
            let msg = e.to_string();
            fail_all(events, || RuntimeError::Internal(msg.clone()));
            None
        }
    }
}

/// Phase 3: a turn opened ahead of an alarm prepares what the due instant
/// will run: the turn's own statements, and those the class's handler ran
/// on other actors (ADR 0026) or in a rehearsal (ADR 0030). A statement
/// that does not prepare here (a table the handler has not created yet) is
/// parsed when it runs, as without this. Done before the batch's
/// transaction, also when requests came in meanwhile and share the turn;
/// a turn of `Prepare` events only ends here.
fn prepare_turn(
    rt: &Arc<Inner>,
    app: &Arc<App>,
    l: &mut Loaded,
    events: Vec<Event>,
    initialized: bool,
) -> Result<Vec<Event>, Stop> {
    if !events.iter().any(|e| matches!(e.kind, EventKind::Prepare)) {
        return Ok(events);
    }
    let _ = l.db().warm_alarm_turn();
    let _ = l.db().extend_log_ahead(4);
    if rt.config.alarm_rehearse && initialized && !rehearse_alarm(rt, app, l) {
        fail_all(events, || {
            RuntimeError::Internal("the actor closed while being prepared".into())
        });
        return Err(Stop::Close);
    }
    let learned = l.store.data().alarm_statements.as_ref().map(|s| s.texts());
    for sql in learned.into_iter().flatten() {
        let _ = l.db().warm(&sql);
    }
    if events.iter().all(|e| matches!(e.kind, EventKind::Prepare)) {
        for ev in events {
            reply(ev.reply, Ok(Outcome::Done));
        }
        return Err(Stop::Keep);
    }
    Ok(events)
}

/// Phase 4: the transaction, and each event in it. An event that traps
/// leaves the next one a fresh instance; one that makes SQLite roll the
/// whole transaction back turns what earlier events did into
/// `transaction_aborted`.
fn run_events(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    app: &Arc<App>,
    l: &mut Loaded,
    events: Vec<Event>,
    initialized: &mut bool,
    yield_at: Instant,
) -> Result<EventsRan, Stop> {
    let id = &actor.id;
    let mut ran = match begin_batch(rt, id, l, events.len()) {
        Ok(ran) => ran,
        Err(msg) => {
            l.close_db();
            fail_all(events, || RuntimeError::Internal(msg.clone()));
            return Err(Stop::Close);
        }
    };
    let events_started = crate::clock::instant();
    let mut events = events.into_iter();
    while let Some(ev) = events.next() {
        Metrics::inc(&rt.metrics.events_total);
        let started = ev.is_request().then_some(ev.enqueued);
        let mut replicated = ev.is_replicated();
        if l.bindings.is_none()
            && let Err(e) = l.fresh_instance(rt, app, id)
        {
            // Without an instance the batch cannot go on: what ran before
            // is rolled back with the transaction (the database closed
            // with the failed instance, so that its alarm can be read).
            rt.rearm_after_failure(id);
            reply(ev.reply, Err(e));
            for r in ran.results {
                reply(
                    r.reply,
                    Err(RuntimeError::Internal("instance lost mid-batch".into())),
                );
            }
            return Err(Stop::Close);
        }
        reset_event_state(l, &ran);
        let r = run_event(
            rt,
            actor,
            l,
            ev.kind,
            initialized,
            &mut ran,
            &mut replicated,
        );
        if r.is_err() {
            Metrics::inc(&rt.metrics.event_failures_total);
        }
        // Read before a trap's instance is replaced (which would lose it).
        let (park, accepted) = take_event_effects(rt, l, r.is_ok(), &mut ran);
        ran.results.push(Ran {
            reply: ev.reply,
            out: r,
            started,
            replicated,
            park,
            accepted,
        });
        if rt.faults.panic_in_batch() {
            panic!("injected panic in a batch (test fault)");
        }
        offer_before_commit(rt, actor, l);
        if !l.db().in_transaction() {
            batch_rolled_back(id, l, &mut ran, initialized);
        }
        if crate::clock::instant() >= yield_at && events.len() > 0 {
            // The turn's time is up: the rest waits for the actor's next
            // turn, behind other actors (fair shares, issue 33).
            ran.not_started = events.collect();
            Metrics::inc(&rt.metrics.turns_yielded_total);
            break;
        }
    }
    rt.metrics
        .phase_events
        .observe_ms(events_started.elapsed().as_secs_f64() * 1000.0);
    Ok(ran)
}

/// The batch's transaction begins, under the room the tenant's disk quota
/// leaves this database; what the commit will compare against is noted.
/// `Err` (why) if the transaction cannot begin: the actor closes.
fn begin_batch(
    rt: &Inner,
    id: &ActorId,
    l: &mut Loaded,
    events: usize,
) -> Result<EventsRan, String> {
    let alarm_writes_before = l.db().alarm_writes();
    let mark_before = match rt.replication {
        Some(_) => l.db().change_mark().ok(),
        None => None,
    };
    let size_before = l.db().size_bytes().unwrap_or(0);
    let room = rt.quotas.room(&id.tenant);
    if let Err(e) = l
        .db()
        .cap_pages(size_before, Some(room.left), (room.limit_name, room.limit))
    {
        tracing::warn!(actor = %id, error = %e, "could not apply the tenant's disk quota");
    }
    l.db().begin().map_err(|e| e.to_string())?;
    l.store.data_mut().outbox_sent = false;
    Ok(EventsRan {
        outbox_sent: false,
        completions: Vec::new(),
        socket_ops: Vec::new(),
        results: Vec::with_capacity(events),
        alarm_ran: false,
        fenced: false,
        alarm_writes_before,
        mark_before,
        size_before,
        not_started: Vec::new(),
    })
}

/// What one event may leave in the instance's state starts empty: the
/// parked replies earlier events of the batch parked may be completed by
/// this one; nothing else carries over.
fn reset_event_state(l: &mut Loaded, ran: &EventsRan) {
    let parked_in_batch = ran
        .results
        .iter()
        .filter_map(|r| r.park)
        .map(|p| p.ticket)
        .collect();
    let accepted_in_batch = ran.results.iter().filter(|r| r.accepted.is_some()).count();
    let state = l.store.data_mut();
    state.replies = crate::parked::ReplyOps {
        parked_in_batch,
        ..Default::default()
    };
    state.socket_ops.clear();
    state.tx_lost = None;
    state.socket_accepted = None;
    state.sockets_accepted_in_batch = accepted_in_batch;
    state.request_is_upgrade = false;
    state.socket_sent_bytes = 0;
}

/// Runs one event of the batch by its kind.
fn run_event(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    l: &mut Loaded,
    kind: EventKind,
    initialized: &mut bool,
    ran: &mut EventsRan,
    replicated: &mut bool,
) -> Result<Outcome, RuntimeError> {
    match kind {
        EventKind::Request(req) => run_request(rt, l, req, initialized),
        EventKind::Alarm { force } => {
            ran.alarm_ran = true;
            run_alarm(rt, l, *initialized, force)
        }
        EventKind::Deliver { at_ms, remove_here } => {
            ran.alarm_ran = true;
            let r = run_delivery(rt, actor, l, *initialized, at_ms, remove_here);
            if matches!(r, Ok(Outcome::Delivered(Delivered::Fenced))) {
                // Answered once the bucket holds what this turn (and
                // every earlier one) committed.
                ran.fenced = true;
                *replicated = true;
            }
            r
        }
        EventKind::Prepare | EventKind::OutboxResume { .. } => Ok(Outcome::Done),
        EventKind::Socket(ev) => run_socket(rt, l, ev),
        EventKind::Inbound(Inbound::Message {
            from,
            life,
            seq,
            body,
        }) => run_message(rt, l, &from, life, seq, body, initialized),
        EventKind::Inbound(Inbound::Response {
            life,
            seq,
            answer,
            attempts,
            discard,
        }) => run_response(rt, l, life, seq, answer, attempts, discard),
        EventKind::Delete
        | EventKind::Restore(_)
        | EventKind::Inspect(_)
        | EventKind::Replicate => {
            unreachable!("deletes, restores, inspections and uploads run on their own")
        }
    }
}

/// What the event left for after the commit: whether it sent, the parked
/// replies it completed and its socket operations (a failed event's are
/// dropped); returns the reply it parked and the socket it accepted.
fn take_event_effects(
    rt: &Inner,
    l: &mut Loaded,
    ok: bool,
    ran: &mut EventsRan,
) -> (
    Option<crate::parked::Park>,
    Option<crate::sockets::Accepted>,
) {
    ran.outbox_sent |= l.store.data().outbox_sent;
    let state = l.store.data_mut();
    let ops = std::mem::take(&mut state.replies);
    let socket_ops = std::mem::take(&mut state.socket_ops);
    let socket_accepted = state.socket_accepted.take();
    if ok {
        ran.completions.extend(ops.completions);
        ran.socket_ops.extend(socket_ops);
        (ops.park, socket_accepted)
    } else {
        if rt.faults.unsafe_completions_from_failed_events() {
            ran.completions.extend(ops.completions);
        }
        (None, None)
    }
}

/// The unsafe variant of ADR 0040's first rule: rows an event wrote are
/// handed to the dispatcher before the commit, whatever becomes of it.
fn offer_before_commit(rt: &Inner, actor: &Actor, l: &mut Loaded) {
    if let Some(early) = l.store.data_mut().sent_before_commit.as_mut()
        && !early.is_empty()
    {
        let rows = std::mem::take(early);
        let life = l.db().outbox_life().unwrap_or(0);
        rt.outbox
            .offer(&actor.id, life, rows, Arc::clone(&l.app.outbound));
    }
}

/// SQLite rolled the whole batch back after an error (a full database, an
/// I/O error): what earlier events of the batch did is gone, so their
/// callers must not hear "done"; the batch goes on in a new transaction.
fn batch_rolled_back(id: &ActorId, l: &mut Loaded, ran: &mut EventsRan, initialized: &mut bool) {
    for r in ran.results.iter_mut() {
        if r.out.is_ok() {
            r.out = Err(RuntimeError::TransactionAborted);
        }
        r.park = None;
        r.accepted = None;
    }
    ran.completions.clear();
    ran.socket_ops.clear();
    *initialized = l.db().is_initialized().unwrap_or(false);
    if let Err(e) = l.db().begin() {
        tracing::error!(actor = %id, error = %e, "could not begin again");
    }
}

/// Phase 5: a cluster node lists the committed alarm in the index (ADR
/// 0009: the record goes in with the batch, the bucket writes wait for its
/// upload), then the transaction commits. A failure of either rolls the
/// batch back, closes the actor and answers every event with it.
fn commit_turn(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    l: &mut Loaded,
    ran: EventsRan,
    initialized: bool,
) -> Result<(EventsRan, Instant), Stop> {
    let id = &actor.id;
    let commit_started = crate::clock::instant();
    let plan_index = rt.keeps_index()
        && (initialized || !l.db().created())
        && (ran.fenced
            || l.db().alarm_writes() != ran.alarm_writes_before
            || actor.repl.lock().needs_plan);
    let planned = if plan_index {
        crate::index::plan_before_commit(rt, actor, l.db()).map(|_| ())
    } else {
        Ok(())
    };
    if let Err(e) = planned {
        tracing::warn!(actor = %id, error = %e, "the alarm index could not be brought in line: the batch is rolled back");
        l.db().rollback();
        l.close_db();
        crate::index::forget_planned(actor);
        rt.rearm_after_failure(id);
        let msg = e.to_string();
        for r in ran.results {
            reply(r.reply, Err(RuntimeError::ReplicationFailed(msg.clone())));
        }
        return Err(Stop::Close);
    }
    let injected = ran.alarm_ran && rt.faults.fail_alarm_commits();
    let committed = if injected {
        Err(wasmkeep_store::StoreError::Io(
            "injected commit failure".into(),
        ))
    } else {
        l.db().commit()
    };
    if let Err(e) = committed {
        Metrics::inc(&rt.metrics.commits_failed_total);
        tracing::error!(actor = %id, error = %e, "commit failed");
        l.db().rollback();
        l.close_db();
        // Index writes planned for this commit name what never committed.
        crate::index::forget_planned(actor);
        let msg = e.to_string();
        // Re-arm before anyone hears back, so a waiter that moves on (the
        // test kit's clock) finds the retry already scheduled.
        rt.rearm_after_failure(id);
        for r in ran.results {
            reply(
                r.reply,
                Err(RuntimeError::Internal(format!("commit failed: {msg}"))),
            );
        }
        return Err(Stop::Close);
    }
    Metrics::inc(&rt.metrics.batches_total);
    if plan_index {
        actor.repl.lock().needs_plan = false;
    }
    if initialized {
        // Rolled-back inits reset `initialized`: the mark is committed.
        l.db().init_mark_committed();
    }
    let committed_at = crate::clock::instant();
    rt.metrics
        .phase_commit
        .observe_ms(ms_between(commit_started, committed_at));
    Ok((ran, committed_at))
}

/// Phase 6: the timer follows what is committed, the commit is handed to
/// replication (with a bucket), and the folder of a new actor whose first
/// event failed is removed (there is no actor).
fn after_commit(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    l: &mut Loaded,
    turn: &Turn,
    ran: EventsRan,
    initialized: bool,
) -> Result<(AfterCommit, Vec<Ran>), Stop> {
    let id = &actor.id;
    // Read back after the batch that opened the actor, one that delivered
    // an alarm, and any that wrote the alarm (rolled back or not); other
    // batches left it as the timer has it.
    if !turn.was_loaded || turn.has_alarm || l.db().alarm_writes() != ran.alarm_writes_before {
        match l.db().alarm() {
            Ok(a) => {
                if !turn.was_loaded && a.is_none() {
                    // Opening read pages (the init mark, the alarm) that the
                    // actor's next events do not, with a statement they do
                    // not run: both would stay as long as it is open (W4).
                    // An actor with an alarm keeps them: its alarm turn
                    // reads them again, maybe together with thousands of
                    // others (W2).
                    l.db().shrink_cache();
                    l.db().forget_alarm_read();
                }
                rt.timer.set(id, a.map(|a| a.at_ms))
            }
            Err(_) => rt.rearm_after_failure(id),
        }
    }
    let dir = l.db().dir().to_owned();
    // Only the first durable batch of a new actor syncs its folders.
    let dirs = l.db().take_new_dirs();
    let wal = l.db().wal_path();
    let removed = l.db().created() && !initialized;
    if removed {
        rt.quotas.counted(&actor.id.tenant, false, ran.size_before);
    } else {
        let after = l.db().size_bytes().unwrap_or(ran.size_before);
        rt.quotas.resized(&actor.id.tenant, ran.size_before, after);
    }
    let outbox = if ran.outbox_sent && !removed {
        l.db().outbox_max_seq().ok().flatten()
    } else {
        None
    };
    let repl_mark = match &rt.replication {
        Some(repl) if !removed => {
            let changed = match ran.mark_before {
                Some(before) => l.db().change_mark().ok() != Some(before),
                None => true,
            };
            // A `replicated` request waits for this batch's upload: it
            // does not wait for the upload interval.
            // So does a batch that sent something: its messages leave
            // once the bucket holds it.
            let urgent = outbox.is_some()
                || !ran.completions.is_empty()
                || ran
                    .results
                    .iter()
                    .any(|r| r.replicated && r.reply.is_some());
            Some(replication::after_commit(
                rt,
                repl,
                actor,
                l.db(),
                changed,
                urgent,
            ))
        }
        _ => None,
    };
    // Replies this batch parked can be completed from the next batch on,
    // before this one is durable (their replies are attached when it is).
    for r in &ran.results {
        if let (Some(park), Ok(_)) = (r.park, &r.out) {
            rt.parked.reserve(
                &actor.id,
                park,
                r.replicated,
                rt.clock.now_ms(),
                rt.outbox.handle(),
            );
        }
    }
    // The folder of a removed actor goes once its instance is dropped
    // (`run_opened`), before anyone hears back.
    let removed = removed.then_some(dir);
    if turn.has_request && rt.faults.crash_after_commit() {
        // As if the process died here: the commit stands, nobody hears of
        // it, and the in-memory instance is gone (a removed actor's folder
        // with it) before the replies go.
        l.close_db();
        if let Some(dir) = &removed {
            let _ = std::fs::remove_dir_all(dir);
        }
        for r in ran.results {
            reply(
                r.reply,
                Err(RuntimeError::Internal("injected crash after commit".into())),
            );
        }
        return Err(Stop::Close);
    }
    Ok((
        AfterCommit {
            repl_mark,
            removed,
            wal,
            dirs,
            outbox,
            completions: ran.completions,
            socket_ops: ran.socket_ops,
        },
        ran.results,
    ))
}

/// Phase 7: the replies, once the commit is on disk (`fsync` durability,
/// when anyone waits); a `replicated` one waits for the upload that
/// carries the commit too. A failed sync fails the events that succeeded.
fn release_replies(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    results: Vec<Ran>,
    after: AfterCommit,
    committed_at: Instant,
) {
    let waiting = results.iter().any(|r| r.reply.is_some())
        || after.outbox.is_some()
        || !after.completions.is_empty()
        || !after.socket_ops.is_empty();
    let completions = after.completions;
    let socket_ops = after.socket_ops;
    let metrics = Arc::clone(&rt.metrics);
    let actor = Arc::clone(actor);
    let repl_mark = after.repl_mark;
    let outbox = after.outbox;
    let weak = Arc::downgrade(rt);
    let release = move |sync: Result<(), String>| {
        metrics
            .phase_durable
            .observe_ms(committed_at.elapsed().as_secs_f64() * 1000.0);
        let rt = weak.upgrade();
        for Ran {
            reply: r,
            out,
            started,
            replicated,
            park,
            accepted,
        } in results
        {
            let out = match (&sync, out) {
                (Err(e), Ok(_)) => Err(RuntimeError::Internal(e.clone())),
                (_, out) => out,
            };
            if let (Some(a), Ok(_), Some(rt)) = (accepted, &out, &rt) {
                // Registered before the reply leaves: the edge connects to
                // it when the reply tells it the id.
                rt.sockets.register(&actor.id, a, rt.clock.now_ms());
            }
            let r = match (park, &out, r, &rt) {
                (Some(park), Ok(_), Some(r), Some(rt)) => {
                    // Parked: it leaves when a later event completes it
                    // (or did already, while this batch was made durable).
                    rt.parked.attach(&metrics, &actor, park.ticket, r, started);
                    continue;
                }
                (Some(park), _, r, Some(rt)) => {
                    // Reserved at the commit, which did not become
                    // durable: the request hears the error.
                    rt.parked.cancel(park.ticket);
                    r
                }
                (_, _, r, _) => r,
            };
            let r = match (replicated && out.is_ok(), repl_mark, r) {
                (true, Some(mark), Some(r)) => {
                    replication::hold_until_uploaded(&metrics, &actor, mark, r, out, started);
                    continue;
                }
                (_, _, r) => r,
            };
            if let Some(t) = started {
                metrics
                    .event_latency
                    .observe_ms(t.elapsed().as_secs_f64() * 1000.0);
            }
            reply(r, out);
        }
        if let Some(rt) = rt {
            if sync.is_ok() {
                for (ticket, resp) in completions {
                    rt.parked
                        .complete(&metrics, &actor, ticket, resp, repl_mark);
                }
                if let Some(upto) = outbox {
                    outbox_ready(&rt, &actor, upto, repl_mark);
                }
                if !socket_ops.is_empty() {
                    apply_socket_ops(&rt, &actor, socket_ops, repl_mark);
                }
            }
            crate::outbox::drop_elsewhere(rt);
        }
    };
    if rt.config.durability == Durability::Fsync && waiting && after.removed.is_none() {
        rt.durability.submit(SyncJob {
            files: vec![after.wal],
            dirs: after.dirs,
            done: Box::new(release),
        });
    } else {
        release(Ok(()));
    }
}
