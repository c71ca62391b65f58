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
use crate::node::Inner;
use crate::outbox::{Answer, Inbound, MessageAnswer};
use crate::replication::{self, ActorReplica};

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
    /// The request is traced: its event's spans go under this request
    /// span (ADR 0064).
    pub trace: Option<Arc<crate::trace::EventTrace>>,
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
        /// The server sampled this message (`trace_sample_pct`): its event
        /// is the root of a trace of its own (ADR 0064).
        trace: Option<Arc<crate::trace::EventTrace>>,
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
    /// A replay's sandbox: the request parked its reply (ADR 0062), which
    /// no later event there completes.
    Parked,
    Done,
}

pub use crate::reply::Reply;
pub use crate::response::ActorResponse;

mod alarm;
pub mod awaiting;
mod batch;
mod between;
mod inbound;
mod instance;
mod request;
pub use request::VERSION_HEADER;
mod socket;
use alarm::{delivered_without_state, rehearse_alarm, run_alarm, run_delivery};
use batch::run_batch;
pub use between::Between;
use between::run_between;
use inbound::{offer_outbox, outbox_opened, outbox_ready, run_message, run_response};
use instance::{
    commit_event, drop_if_disowned, end_event, ensure_init, enter, finish_call, instantiate, load,
};
use request::{run_request, when_uploaded};
use socket::{apply_socket_ops, run_socket};

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
    /// An event that runs on its own between two batches, outside their
    /// transaction (a delete, a restore, an inspection, an upload).
    Between(Between),
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
    /// The deadline of the wait on outbox row `seq` passed (ADR 0056).
    AwaitDeadline {
        seq: u64,
    },
}

/// What a [`Between::Inspect`] runs; it sends its own result.
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
    /// An event of the actor is suspended on a wait (ADR 0056): only what
    /// the gate admits is taken (`awaiting::admitted`).
    pub awaiting: Option<awaiting::Awaiting>,
    /// The task that enqueues the wait's deadline (cancelled when the gate
    /// changes).
    pub deadline_task: Option<tokio::task::AbortHandle>,
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
    /// Where the actor's records go while its app records (ADR 0062).
    recording: Option<crate::recording::ActorRecording>,
    /// The database is known to name no recording generation (read once
    /// per open): a batch that is not recorded has no run to end.
    recording_clear: bool,
    /// No recording generation starts before this time (node clock, ms).
    recording_paused_until_ms: u64,
}

impl Drop for Loaded {
    /// An actor closing with its database open writes the records it
    /// holds (ADR 0067); a failure path closed the database first.
    fn drop(&mut self) {
        self.write_held_records(true);
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

    /// The database, for a new instance of another version: the records
    /// held are written first, as at a close.
    fn take_db(mut self) -> ActorDb {
        self.write_held_records(true);
        self.store
            .data_mut()
            .db
            .take()
            .expect("a loaded actor holds its database")
    }

    /// Gives back its log index's zero pages (ADR 0028), between events;
    /// returns the bytes given back.
    pub(crate) fn give_back_index_pages(&self) -> usize {
        self.store
            .data()
            .db
            .as_ref()
            .map_or(0, ActorDb::give_back_index_pages)
    }

    /// Whether the instance holds its database open (not closed by
    /// [`Loaded::park_db`]).
    pub(crate) fn has_db(&self) -> bool {
        self.store.data().db.is_some()
    }

    /// Closes the database of an open actor between events to stay within
    /// `open_databases_max` (ADR 0068); the instance stays, and its next
    /// turn opens the database again ([`Loaded::reopen_db`]). The records
    /// it holds are written first, as at a close. `false` if it had none
    /// open.
    pub(crate) fn park_db(&mut self) -> bool {
        if !self.has_db() {
            return false;
        }
        self.write_held_records(true);
        drop(self.store.data_mut().db.take());
        true
    }

    /// Opens again the database [`Loaded::park_db`] closed. On `Err` the
    /// caller drops the instance (the actor closes).
    fn reopen_db(&mut self, rt: &Inner, id: &ActorId) -> Result<(), RuntimeError> {
        let dir = paths::actor_dir(&rt.config.data_dir, id);
        let db =
            ActorDb::open(&dir, &self.app.store_limits, OpenMode::Existing)?.ok_or_else(|| {
                RuntimeError::Internal("the database of an open actor is gone".into())
            })?;
        db.set_stop_flag(Arc::clone(&rt.stopping));
        self.store.data_mut().db = Some(db);
        Ok(())
    }

    /// The database, if open, for a new instance of another version (the
    /// records held written first, as at a close); `None` for an instance
    /// whose database [`Loaded::park_db`] closed.
    fn take_open_db(self) -> Option<ActorDb> {
        self.has_db().then(|| self.take_db())
    }

    /// Writes the records of committed events the actor holds in memory
    /// (`crate::recording::write_held_between`), between events.
    fn write_held_records(&mut self, closing: bool) {
        if let Some(db) = self.store.data_mut().db.as_mut() {
            crate::recording::write_held_between(&mut self.recording, db, closing);
        }
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
            Ok(mut fresh) => {
                // The batch goes on in the same transaction: its recording
                // with it (ADR 0062).
                fresh.recording = self.recording.take();
                fresh.recording_clear = self.recording_clear;
                fresh.recording_paused_until_ms = self.recording_paused_until_ms;
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
    /// `last_used_ms` when the reaper last gave back its log index's zero
    /// pages (`Inner::give_back_idle_index_pages`, ADR 0078).
    pub index_given_back_at: AtomicU64,
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
            index_given_back_at: AtomicU64::new(u64::MAX),
            repl: Mutex::new(ActorReplica::default()),
            repl_done: Condvar::new(),
            outbox_offered: AtomicU64::new(0),
            outbox_durable: AtomicU64::new(0),
        }
    }

    pub fn is_loaded(&self) -> bool {
        self.slot.try_lock().map(|s| s.is_some()).unwrap_or(true)
    }

    /// The app version of the actor's live instance, if it has one and it
    /// is not running an event now.
    pub fn loaded_version(&self) -> Option<u64> {
        self.slot
            .try_lock()
            .and_then(|s| s.as_ref().map(|l| l.app.deploy_version))
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
    park: Option<crate::replies::Park>,
    /// The request accepted a WebSocket (ADR 0043).
    accepted: Option<crate::sockets::Accepted>,
    /// The event is traced (ADR 0064), and when it was queued: its spans
    /// are recorded when its reply is released.
    trace: Option<(Arc<crate::trace::EventTrace>, Instant)>,
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
        let events = awaiting::take_admitted(&mut q, rt.config.batch_events_max);
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
    if awaiting::has_admitted(&q) {
        rt.schedule(Arc::clone(actor));
    } else {
        // Empty, or holding only what waits for the gate to open.
        q.scheduled = false;
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
    // Events taken before an event of this turn suspended, which its gate
    // holds (ADR 0056); the gate is read again after each batch.
    let mut held: Vec<Event> = Vec::new();
    let mut gate: Option<u64> = None;
    while let Some(ev) = rest.next() {
        if gate.is_some_and(|seq| !awaiting::admitted(&ev.kind, seq)) {
            held.push(ev);
            continue;
        }
        let Event {
            kind,
            reply,
            enqueued,
        } = ev;
        let between = match kind {
            EventKind::Between(between) => between,
            kind => {
                run.push(Event {
                    kind,
                    reply,
                    enqueued,
                });
                continue;
            }
        };
        let left = run_batch(rt, actor, slot, std::mem::take(&mut run), yield_at);
        if !left.is_empty() {
            let ev = Event {
                kind: EventKind::Between(between),
                reply,
                enqueued,
            };
            return left
                .into_iter()
                .chain(std::iter::once(ev))
                .chain(rest)
                .chain(held)
                .collect();
        }
        run_between(rt, actor, slot, between, reply);
        gate = actor.queue.lock().awaiting.as_ref().map(|a| a.seq);
    }
    let mut left = run_batch(rt, actor, slot, run, yield_at);
    left.extend(held);
    left
}

fn fail_all(events: Vec<Event>, err: impl Fn() -> RuntimeError) {
    for ev in events {
        reply(ev.reply, Err(err()));
    }
}
