//! A turn's batch: open the actor for it, run its events each in a
//! savepoint, commit once, then what follows the commit (the timer, the
//! outbox, uploads, replies released at their durability). `Stop` says what
//! becomes of the instance when the turn ends.

use super::*;
use crate::trace::EventTrace;

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
pub(super) fn run_batch(
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
    let Some(mut opened) = open_for_turn(rt, actor, &app, slot, events, &turn) else {
        return Vec::new();
    };
    debug_assert!(slot.is_none(), "the turn owns the instance while it runs");
    let held = std::mem::take(&mut opened.held);
    let (kept, mut not_started) = run_opened(rt, actor, &app, &turn, opened, yield_at);
    *slot = kept;
    // What the gate holds goes back behind what it lets run.
    not_started.extend(held);
    not_started
}

/// Phases 3 to 7, on an open actor. Returns the instance if the actor
/// stays open, and the events not started.
pub(super) fn run_opened(
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
        held: _,
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
pub(super) enum Stop {
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
pub(super) struct Opened {
    loaded: Loaded,
    events: Vec<Event>,
    initialized: bool,
    /// Events of the turn the actor's gate holds: it opened suspended
    /// (ADR 0056).
    held: Vec<Event>,
}

/// What the phases of one turn share about its events.
pub(super) struct Turn {
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
pub(super) struct EventsRan {
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
    /// The restore to a bookmark the batch's last successful event asked
    /// for (applied once the batch is in the bucket).
    restore: Option<crate::bookmarks::PendingRestore>,
    /// What the batch's last event that set or cleared the alarm leaves
    /// as the alarm's trace link (ADR 0064): `Some(None)` none, `Some(x)`
    /// the alarm due at `x.0` set by the traced event `x.1`. Applied once
    /// the batch committed; dropped with a rolled-back batch.
    alarm_link: Option<AlarmLink>,
    /// The gate the batch leaves (ADR 0056): `Some(Some(a))` an event
    /// suspended on `a`, `Some(None)` the suspended event ended. Applied
    /// once the batch committed.
    pub(super) awaiting: Option<Option<super::awaiting::Awaiting>>,
}

/// An alarm's due time and the `guest` span of the traced event that set
/// it, or none.
type AlarmLink = Option<(u64, crate::trace::TraceContext)>;

/// What [`after_commit`] leaves for the release of the replies.
pub(super) struct AfterCommit {
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
    /// A restore to a bookmark, scheduled once the bucket holds the batch.
    restore: Option<crate::bookmarks::PendingRestore>,
}

/// Phase 1: the actor's app and class, or every event fails with
/// `app_not_found` / `class_not_found` (an app deleted or redeployed
/// without the class since the events were queued).
pub(super) fn resolve_class(
    rt: &Inner,
    id: &ActorId,
    events: Vec<Event>,
) -> Option<(Arc<App>, Vec<Event>)> {
    let Some(app) = rt.app_for(id) else {
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

/// An actor with no database, and none created for these events (no
/// request among them): an alarm finds nothing to run, a delivery's entry
/// goes by the no-state rule, anything else is done.
fn answer_without_database(rt: &Arc<Inner>, actor: &Arc<Actor>, events: Vec<Event>) {
    rt.timer.set(&actor.id, None);
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
}

/// The actor could not be opened: every event hears why (a tenant's quota
/// as itself, a store error as itself for the first waiter, anything else
/// as internal).
fn fail_to_open(id: &ActorId, e: RuntimeError, events: Vec<Event>) {
    if let RuntimeError::QuotaExceeded {
        tenant,
        what,
        limit_name,
        limit,
    } = e
    {
        // The tenant's doing: every event hears of its quota.
        fail_all(events, || RuntimeError::QuotaExceeded {
            tenant: tenant.clone(),
            what,
            limit_name,
            limit,
        });
        return;
    }
    tracing::warn!(actor = %id, error = %e, "could not open actor");
    let msg = e.to_string();
    let code_err = move || RuntimeError::Internal(msg.clone());
    let mut events = events;
    if matches!(e, RuntimeError::Store(_)) && !events.is_empty() {
        // Keep the real store error for the first waiter.
        let first = events.remove(0);
        reply(first.reply, Err(e));
    }
    fail_all(events, code_err);
}

/// Hands the outbox's rows to the dispatcher for the `OutboxResume`
/// events among `events`, answers them, and returns the others.
fn run_outbox_resumes(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    l: &mut Loaded,
    events: Vec<Event>,
    turn: &Turn,
) -> Vec<Event> {
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
    events
}

/// Phase 2: the database and an instance, and whether the actor's init
/// ran. An actor with no database gets one only from a request; an alarm
/// for an actor with no state does not create it.
pub(super) fn open_for_turn(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    app: &Arc<App>,
    slot: &mut Option<Loaded>,
    events: Vec<Event>,
    turn: &Turn,
) -> Option<Opened> {
    let id = &actor.id;
    // Outbox resumes alone, for an actor this node may not open unasked
    // now (a cluster node that could not take it; open or not, as a copy
    // from a lapsed epoch may be): the rows go out where the actor opens
    // (`outbox_opened`).
    if events
        .iter()
        .all(|e| matches!(e.kind, EventKind::OutboxResume { .. }))
        && !rt.faults.unsafe_resume_unheld()
        && !rt.may_open_unasked(id)
    {
        for ev in events {
            reply(ev.reply, Ok(Outcome::Done));
        }
        return None;
    }
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
            answer_without_database(rt, actor, events);
            return None;
        }
        Err(e) => {
            fail_to_open(id, e, events);
            return None;
        }
    };
    let l = &mut loaded;
    let mut held = Vec::new();
    let mut events = events;
    if !turn.was_loaded {
        // What an earlier run (or another node) left unsent goes out again.
        outbox_opened(rt, actor, l);
        // An event suspended on a wait holds the others (ADR 0056).
        (events, held) = super::awaiting::gate_at_open(rt, actor, l, events);
    }
    let events = run_outbox_resumes(rt, actor, l, events, turn);
    if events.is_empty() {
        *slot = Some(loaded);
        requeue_held(rt, actor, held);
        return None;
    }
    match l.db().is_initialized() {
        Ok(initialized) => Some(Opened {
            loaded,
            events,
            initialized,
            held,
        }),
        Err(e) => {
            // The instance is dropped: the actor closes, before anyone
            // hears back.
            drop(loaded);
            let msg = e.to_string();
            fail_all(events, || RuntimeError::Internal(msg.clone()));
            requeue_held(rt, actor, held);
            None
        }
    }
}

/// Puts events the gate holds back at the front of the queue (in order).
fn requeue_held(rt: &Inner, actor: &Arc<Actor>, held: Vec<Event>) {
    if held.is_empty() {
        return;
    }
    let mut q = actor.queue.lock();
    for ev in held.into_iter().rev() {
        let bytes = ev.queued_bytes();
        q.bytes += bytes;
        rt.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
        q.events.push_front(ev);
    }
}

/// Phase 3: a turn opened ahead of an alarm prepares what the due instant
/// will run: the turn's own statements, and those the class's handler ran
/// on other actors (ADR 0026) or in a rehearsal (ADR 0030). A statement
/// that does not prepare here (a table the handler has not created yet) is
/// parsed when it runs, as without this. Done before the batch's
/// transaction, also when requests came in meanwhile and share the turn;
/// a turn of `Prepare` events only ends here.
pub(super) fn prepare_turn(
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
pub(super) fn run_events(
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
        let enqueued = ev.enqueued;
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
        let traced = begin_trace(rt, l, &ev.kind, &ran);
        // Only an event that records or replays touches the tape.
        let taped = (l.recording.is_some() || rt.config.replay_sandbox)
            .then(|| l.store.data().tape.clone());
        let recorder = taped.as_ref().and_then(|tape| {
            crate::recording::begin_event(rt, l.recording.is_some(), tape, &ev.kind)
        });
        let may_wait = super::awaiting::start_run(rt, l, &ev.kind, recorder.as_ref());
        let r = run_event(
            rt,
            actor,
            l,
            ev.kind,
            initialized,
            &mut ran,
            &mut replicated,
        );
        super::awaiting::end_run(l, may_wait && recorder.is_none());
        if let (Some(recorder), Some(tape)) = (recorder, &taped) {
            let mut recording = l.recording.take();
            let version = l.app.deploy_version;
            let parked = l.store.data().replies.park.is_some();
            let mut paused = l.recording_paused_until_ms;
            crate::recording::end_event(
                rt,
                id,
                recorder,
                tape,
                (&mut recording, &mut paused),
                l.db(),
                (version, &r, parked),
            );
            l.recording_paused_until_ms = paused;
            l.recording = recording;
        }
        if r.is_err() {
            Metrics::inc(&rt.metrics.event_failures_total);
        }
        note_alarm_link(rt, l, traced.as_ref(), &r, &mut ran);
        let trace = end_trace(l, traced, &r);
        // Read before a trap's instance is replaced (which would lose it).
        let (park, accepted) = take_event_effects(rt, l, r.is_ok(), &mut ran);
        ran.results.push(Ran {
            reply: ev.reply,
            out: r,
            started,
            replicated,
            park,
            accepted,
            trace: trace.map(|t| (t, enqueued)),
        });
        if rt.faults.panic_in_batch() {
            panic!("injected panic in a batch (test fault)");
        }
        offer_before_commit(rt, actor, l);
        if !l.db().in_transaction() {
            batch_rolled_back(id, l, &mut ran, initialized);
        }
        let suspended = matches!(ran.awaiting, Some(Some(_)));
        if suspended || (crate::clock::instant() >= yield_at && events.len() > 0) {
            // An event suspended (the rest waits behind the gate this batch
            // sets, ADR 0056), or the turn's time is up: the rest waits for
            // the actor's next turn, behind other actors (issue 33).
            ran.not_started = events.collect();
            if !suspended {
                Metrics::inc(&rt.metrics.turns_yielded_total);
            }
            break;
        }
    }
    rt.metrics
        .phase_events
        .observe_ms(events_started.elapsed().as_secs_f64() * 1000.0);
    Ok(ran)
}

/// A traced event begins (ADR 0064): the host notes its statements; the
/// trace and when its handler began.
fn begin_trace(
    rt: &Inner,
    l: &mut Loaded,
    kind: &EventKind,
    ran: &EventsRan,
) -> Option<(Arc<EventTrace>, Instant)> {
    let trace = match kind {
        EventKind::Request(r) => r.trace.clone()?,
        // A message or an answer whose call was traced: its spans go
        // under the sender's `send` or `fetch` span.
        EventKind::Inbound(
            Inbound::Message { trace: Some(c), .. } | Inbound::Response { trace: Some(c), .. },
        ) => EventTrace::new(*c),
        // An alarm a traced event set: a trace of its own, linked to it,
        // if the link is for the alarm committed now (not one an earlier
        // life of the actor, or a restore, left).
        EventKind::Alarm { .. } => {
            let (at, set_by) = alarm_link_now(rt, l, ran)?;
            let committed = l.db().alarm().ok().flatten()?;
            if committed.at_ms != at {
                return None;
            }
            EventTrace::root("alarm", Some(set_by))
        }
        EventKind::Socket(SocketEvent::Message { trace, .. }) => trace.clone()?,
        _ => return None,
    };
    l.store.data_mut().trace = Some(Arc::clone(&trace));
    Some((trace, crate::clock::instant()))
}

/// What a successful event did to the alarm becomes the batch's pending
/// trace link (ADR 0064): an alarm it set is linked to its `guest` span if
/// it is traced, and to nothing if not; an alarm it cleared, or an alarm's
/// run that left none, has no link. A failed event's alarm was rolled back
/// (and a failed alarm's retry keeps its link: `run_alarm` moves it).
fn note_alarm_link(
    rt: &Inner,
    l: &Loaded,
    traced: Option<&(Arc<EventTrace>, Instant)>,
    r: &Result<Outcome, RuntimeError>,
    ran: &mut EventsRan,
) {
    let outcome = match r {
        Ok(o) => o,
        Err(_) => {
            // A failed alarm's retry keeps the link of the alarm it
            // retries, moved to the retry's time.
            if let Some((from, to)) = l.store.data().alarm_retried
                && let Some((at, by)) = alarm_link_now(rt, l, ran)
                && at == from
            {
                ran.alarm_link = Some(to.map(|to| (to, by)));
            }
            return;
        }
    };
    match (l.store.data().alarm_op, outcome) {
        (AlarmOp::Set(at), _) => {
            ran.alarm_link = Some(traced.map(|(t, _)| (at, t.guest_context())));
        }
        (AlarmOp::Cleared, _)
        | (AlarmOp::Untouched, Outcome::Alarm(true) | Outcome::Delivered(Delivered::Ran)) => {
            ran.alarm_link = Some(None);
        }
        _ => {}
    }
}

/// The actor's alarm link as the batch leaves it so far: its pending
/// change, else the node's.
fn alarm_link_now(
    rt: &Inner,
    l: &Loaded,
    ran: &EventsRan,
) -> Option<(u64, crate::trace::TraceContext)> {
    match ran.alarm_link {
        Some(pending) => pending,
        None => rt.traces.alarm_link(&l.store.data().id),
    }
}

/// An event's handler ended with `r`: a traced event's `guest` span is
/// noted and the host stops noting statements. An alarm's event that found
/// nothing due is no trace.
fn end_trace(
    l: &mut Loaded,
    traced: Option<(Arc<EventTrace>, Instant)>,
    r: &Result<Outcome, RuntimeError>,
) -> Option<Arc<EventTrace>> {
    if matches!(r, Ok(Outcome::Alarm(false))) {
        l.store.data_mut().trace = None;
        return None;
    }
    let (trace, started) = traced?;
    let error = r.as_ref().err().map(RuntimeError::code);
    let id = &l.store.data().id;
    let actor = format!("{}/{}/{}/{}", id.tenant, id.app, id.class, id.name);
    trace.guest((started, crate::clock::instant()), actor, error);
    l.store.data_mut().trace = None;
    Some(trace)
}

/// The batch's transaction begins, under the room the tenant's disk quota
/// leaves this database; what the commit will compare against is noted.
/// `Err` (why) if the transaction cannot begin: the actor closes.
pub(super) fn begin_batch(
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
    // Known once per open for an app that does not record; otherwise
    // decided per batch (ADR 0062).
    let batch = if l.app.manifest.recording.is_some() || !l.recording_clear {
        let current = l.recording.take();
        let app = Arc::clone(&l.app);
        let (mut clear, mut paused) = (l.recording_clear, l.recording_paused_until_ms);
        let b = crate::recording::before_batch(
            rt,
            id,
            app.manifest.recording.as_ref(),
            current,
            l.db(),
            (&mut clear, &mut paused),
        );
        (l.recording_clear, l.recording_paused_until_ms) = (clear, paused);
        Some(b)
    } else {
        None
    };
    l.db().begin().map_err(|e| e.to_string())?;
    if let Some(b) = batch {
        l.recording = crate::recording::after_begin(b, l.db());
    }
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
        restore: None,
        alarm_link: None,
        awaiting: None,
    })
}

/// What one event may leave in the instance's state starts empty: the
/// parked replies earlier events of the batch parked may be completed by
/// this one; nothing else carries over.
pub(super) fn reset_event_state(l: &mut Loaded, ran: &EventsRan) {
    let parked_in_batch = ran
        .results
        .iter()
        .filter_map(|r| r.park)
        .map(|p| p.ticket)
        .collect();
    let accepted_in_batch = ran.results.iter().filter(|r| r.accepted.is_some()).count();
    let state = l.store.data_mut();
    state.replies = crate::replies::ReplyOps {
        parked_in_batch,
        ..Default::default()
    };
    state.socket_ops.clear();
    state.tx_lost = None;
    state.socket_accepted = None;
    state.sockets_accepted_in_batch = accepted_in_batch;
    state.request_is_upgrade = false;
    state.socket_sent_bytes = 0;
    state.restore = None;
    // Counted over the whole event (its `on-init` included), whether or
    // not it calls the guest.
    state.alarm_op = AlarmOp::Untouched;
    state.alarm_retried = None;
    state.awaits = None;
    state.await_tape = None;
}

/// Runs one event of the batch by its kind.
pub(super) fn run_event(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    l: &mut Loaded,
    kind: EventKind,
    initialized: &mut bool,
    ran: &mut EventsRan,
    replicated: &mut bool,
) -> Result<Outcome, RuntimeError> {
    use super::awaiting::{Run, after_handler, resume};
    match kind {
        EventKind::Request(req) => {
            let awaits = l
                .app
                .waits
                .then(|| crate::awaits::EventAwaits::first(crate::awaits::chain_of(&req.headers)));
            let r = run_request(rt, l, req, initialized, awaits);
            after_handler(rt, l, ran, r, Run::Request)
        }
        EventKind::Alarm { force } => {
            ran.alarm_ran = true;
            let r = run_alarm(rt, l, *initialized, force);
            after_handler(rt, l, ran, r, Run::Alarm)
        }
        EventKind::AwaitDeadline { seq } => resume(rt, l, initialized, ran, seq, None),
        EventKind::Inbound(Inbound::Response {
            life, seq, answer, ..
        }) if super::awaiting::answers_wait(rt, actor, l, seq) => {
            resume(rt, l, initialized, ran, seq, Some((life, answer)))
        }
        EventKind::Deliver { at_ms, remove_here } => {
            ran.alarm_ran = true;
            let r = run_delivery(rt, actor, l, *initialized, at_ms, remove_here);
            let r = match after_handler(rt, l, ran, r, Run::Alarm) {
                Ok(Outcome::Alarm(true)) => Ok(Outcome::Delivered(Delivered::Ran)),
                r => r,
            };
            if matches!(r, Ok(Outcome::Delivered(Delivered::Fenced))) {
                // Answered once the bucket holds what this turn (and
                // every earlier one) committed.
                ran.fenced = true;
                *replicated = true;
            }
            r
        }
        EventKind::Prepare | EventKind::OutboxResume { .. } => Ok(Outcome::Done),
        EventKind::Socket(ev) => {
            let what = match &ev {
                SocketEvent::Message { id, message, .. } => {
                    let bytes = match message {
                        crate::sockets::Message::Text(t) => t.len(),
                        crate::sockets::Message::Binary(b) => b.len(),
                    };
                    format!("message on socket {id} ({bytes} bytes)")
                }
                SocketEvent::Closed { info, code, .. } => {
                    format!("close of socket {} ({code})", info.id)
                }
            };
            let started = crate::clock::instant();
            let r = run_socket(rt, l, ev);
            let version = l.app.deploy_version;
            note_event(rt, &actor.id, "SOCKET", (&what, version), started, &r);
            r
        }
        EventKind::Inbound(Inbound::Message {
            from,
            life,
            seq,
            body,
            ..
        }) => {
            let what = format!("from {from} #{seq}");
            let started = crate::clock::instant();
            let r = run_message(rt, l, &from, life, seq, body, initialized);
            let version = l.app.deploy_version;
            note_event(rt, &actor.id, "MESSAGE", (&what, version), started, &r);
            r
        }
        EventKind::Inbound(Inbound::Response {
            life,
            seq,
            answer,
            attempts,
            discard,
            trace: _,
        }) => run_response(rt, l, life, seq, answer, attempts, discard),
        // `run_turn_events` runs these between batches, never in one.
        EventKind::Between(_) => unreachable!("a between-batches event in a batch"),
    }
}

/// The access line and the class's count of an event that did not come
/// through the HTTP edge (issue 37): an actor message (`MESSAGE`, its
/// sender and sequence number) or a socket's message or close (`SOCKET`).
/// Counted always; the line goes to the node's log when its access log is
/// on, and to the tenant's (`wasmkeep logs`, `dev`) when the access log is
/// on or someone follows it, as the edge does for requests.
fn note_event(
    rt: &Inner,
    id: &ActorId,
    kind: &'static str,
    (what, version): (&str, u64),
    started: Instant,
    r: &Result<Outcome, RuntimeError>,
) {
    if let Some(c) = rt.class_metrics.of(id) {
        match kind {
            "MESSAGE" => c.messages.inc(),
            _ => c.socket_events.inc(),
        };
    }
    let access_on = rt.access_log.load(Ordering::Relaxed);
    if !access_on && !rt.logs.followed() {
        return;
    }
    let (status, code, detail) = match r {
        Ok(Outcome::Answered(MessageAnswer::Refused { code, message })) => (
            422u16,
            Some(code.clone()),
            format!("refused {code}: {message}"),
        ),
        Ok(_) => (200, None, "ok".to_owned()),
        Err(e) => (
            500,
            Some(e.code().to_string()),
            format!("failed {}: {e}", e.code()),
        ),
    };
    let duration_us = started.elapsed().as_micros() as u64;
    let ms = duration_us as f64 / 1000.0;
    if access_on {
        tracing::info!(target: "wasmkeep::access", kind, actor = %id, what, status, ms, code = code.as_deref().unwrap_or("-"), version);
    }
    use crate::logs::{Access, Level, LogLine, Source};
    let mut line = LogLine::new(
        rt.clock.now_ms(),
        if status >= 500 {
            Level::Warn
        } else {
            Level::Info
        },
        Source::Access,
        id.clone(),
        format!("{kind} {what} {detail} {ms:.1} ms"),
    );
    line.access = Some(Access {
        method: kind.to_owned(),
        path: what.to_owned(),
        status,
        duration_us,
        code,
        version: Some(version),
    });
    rt.logs.push(line);
}

/// What the event left for after the commit: whether it sent, the parked
/// replies it completed and its socket operations (a failed event's are
/// dropped); returns the reply it parked and the socket it accepted.
pub(super) fn take_event_effects(
    rt: &Inner,
    l: &mut Loaded,
    ok: bool,
    ran: &mut EventsRan,
) -> (
    Option<crate::replies::Park>,
    Option<crate::sockets::Accepted>,
) {
    ran.outbox_sent |= l.store.data().outbox_sent;
    let state = l.store.data_mut();
    let ops = std::mem::take(&mut state.replies);
    let socket_ops = std::mem::take(&mut state.socket_ops);
    let socket_accepted = state.socket_accepted.take();
    let restore = state.restore.take();
    if ok {
        if restore.is_some() {
            ran.restore = restore;
        }
        // A parked reply says which version completed it, as a direct
        // answer says which answered (a rollout runs two).
        let version = l.app.deploy_version.to_string();
        ran.completions
            .extend(ops.completions.into_iter().map(|(ticket, mut resp)| {
                resp.headers
                    .push((super::VERSION_HEADER.to_owned(), version.clone()));
                (ticket, resp)
            }));
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
pub(super) fn offer_before_commit(rt: &Inner, actor: &Actor, l: &mut Loaded) {
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
pub(super) fn batch_rolled_back(
    id: &ActorId,
    l: &mut Loaded,
    ran: &mut EventsRan,
    initialized: &mut bool,
) {
    // The alarm the batch set or cleared went with it, and so did what
    // its events did to a suspended event (the gate stays as it was).
    ran.alarm_link = None;
    ran.awaiting = None;
    for r in ran.results.iter_mut() {
        if r.out.is_ok() {
            r.out = Err(RuntimeError::TransactionAborted);
        }
        r.park = None;
        r.accepted = None;
        // Its work went with the transaction: no commit of the next one
        // is its own.
        if let Some((t, _)) = &r.trace {
            t.rolled_back(&RuntimeError::TransactionAborted.code());
        }
    }
    ran.completions.clear();
    ran.socket_ops.clear();
    ran.restore = None;
    *initialized = l.db().is_initialized().unwrap_or(false);
    if let Err(e) = l.db().begin() {
        tracing::error!(actor = %id, error = %e, "could not begin again");
    }
    // The records went with the transaction, and the rest of the batch
    // runs unrecorded: the run of generations ends here (ADR 0062).
    if l.recording.take().is_some() || !l.recording_clear {
        crate::recording::end_run(l.db());
    }
}

/// Phase 5: a cluster node lists the committed alarm in the index (ADR
/// 0009: the record goes in with the batch, the bucket writes wait for its
/// upload), then the transaction commits. A failure of either rolls the
/// batch back, closes the actor and answers every event with it.
pub(super) fn commit_turn(
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
    for (t, _) in ran.results.iter().filter_map(|r| r.trace.as_ref()) {
        t.commit(commit_started, committed_at);
    }
    Ok((ran, committed_at))
}

/// Phase 6: the timer follows what is committed, the commit is handed to
/// replication (with a bucket), and the folder of a new actor whose first
/// event failed is removed (there is no actor).
pub(super) fn after_commit(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    l: &mut Loaded,
    turn: &Turn,
    ran: EventsRan,
    initialized: bool,
) -> Result<(AfterCommit, Vec<Ran>), Stop> {
    timer_follows_commit(rt, &actor.id, l, turn, &ran);
    if let Some(gate) = ran.awaiting.clone() {
        super::awaiting::apply_gate(rt, actor, gate);
    }
    if let Some(link) = ran.alarm_link {
        rt.traces.link_alarm(&actor.id, link);
    }
    let dir = l.db().dir().to_owned();
    // Only the first durable batch of a new actor syncs its folders.
    let dirs = l.db().take_new_dirs();
    let wal = l.db().wal_path();
    let suspended = matches!(ran.awaiting, Some(Some(_)));
    // A new actor whose first event suspended keeps its folder: the
    // event runs (its init too) when the answer comes.
    let removed = l.db().created() && !initialized && !suspended;
    if removed {
        rt.quotas.counted(&actor.id.tenant, false, ran.size_before);
        if let Some(c) = rt.class_metrics.of(&actor.id) {
            c.actors.dec();
        }
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
            let replicated = !ran.completions.is_empty()
                || ran
                    .results
                    .iter()
                    .any(|r| r.replicated && r.reply.is_some());
            let urgent = replicated || outbox.is_some() || ran.restore.is_some();
            Some(replication::after_commit(
                rt,
                repl,
                actor,
                l.db(),
                changed,
                (urgent, replicated),
            ))
        }
        _ => None,
    };
    // Replies this batch parked can be completed from the next batch on,
    // before this one is durable (their replies are attached when it is).
    for r in &ran.results {
        if let (Some(park), Ok(_)) = (r.park, &r.out) {
            let now = rt.clock.now_ms();
            let handle = rt.outbox.handle();
            rt.parked
                .reserve(&actor.id, park, r.replicated, now, handle);
        }
    }
    // The folder of a removed actor goes once its instance is dropped
    // (`run_opened`), before anyone hears back.
    let removed = removed.then_some(dir);
    if turn.has_request && rt.faults.crash_after_commit() {
        crash_after_commit(l, removed.as_deref(), ran.results);
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
            restore: ran.restore,
        },
        ran.results,
    ))
}

/// The test switch `crash_after_commit`: as if the process died after
/// the commit, which stands while nobody hears of it, and the in-memory
/// instance is gone (a removed actor's folder with it) before the replies
/// go.
fn crash_after_commit(l: &mut Loaded, removed: Option<&std::path::Path>, results: Vec<Ran>) {
    l.close_db();
    if let Some(dir) = removed {
        let _ = std::fs::remove_dir_all(dir);
    }
    for r in results {
        let crash = RuntimeError::Internal("injected crash after commit".into());
        reply(r.reply, Err(crash));
    }
}

/// The timer follows the committed alarm: read back after the batch that
/// opened the actor, one that delivered an alarm, and any that wrote the
/// alarm (rolled back or not); other batches left it as the timer has it.
fn timer_follows_commit(rt: &Inner, id: &ActorId, l: &mut Loaded, turn: &Turn, ran: &EventsRan) {
    if turn.was_loaded && !turn.has_alarm && l.db().alarm_writes() == ran.alarm_writes_before {
        return;
    }
    match l.db().alarm() {
        Ok(a) => {
            if !turn.was_loaded && a.is_none() {
                // Opening read pages (the init mark, the alarm) that the
                // actor's next events do not, with a statement they do
                // not run: both would stay as long as it is open (W4).
                // An actor with an alarm keeps them: its alarm turn reads
                // them again, maybe together with thousands of others (W2).
                l.db().shrink_cache();
                l.db().forget_alarm_read();
            }
            rt.timer.set_alarm(id, a.map(|a| (a.at_ms, a.retry_count)));
        }
        Err(_) => rt.rearm_after_failure(id),
    }
}

/// One event's reply, once its batch's commit is durable (or failed to
/// become so): a socket it accepted is registered, a parked reply waits
/// for its completion, a `replicated` one for the upload; the rest leave.
fn release_one(
    rt: Option<&Arc<Inner>>,
    metrics: &Arc<Metrics>,
    actor: &Arc<Actor>,
    sync: &Result<(), String>,
    ran: Ran,
    repl_mark: Option<replication::Mark>,
) {
    let Ran {
        reply: r,
        out,
        started,
        replicated,
        park,
        accepted,
        trace,
    } = ran;
    let out = match (sync, out) {
        (Err(e), Ok(_)) => Err(RuntimeError::Internal(e.clone())),
        (_, out) => out,
    };
    if let (Some(a), Ok(_), Some(rt)) = (accepted, &out, rt) {
        // Registered before the reply leaves: the edge connects to it when
        // the reply tells it the id.
        rt.sockets.register(&actor.id, a, rt.clock.now_ms());
    }
    let r = match (park, &out, r, rt) {
        (Some(park), Ok(_), r, Some(rt)) if rt.config.replay_sandbox => {
            // A replay runs one event at a time: it hears "parked" now,
            // and the ticket stays for a later event to complete (its
            // answer goes nowhere).
            let (nowhere, _) = tokio::sync::oneshot::channel();
            rt.parked
                .attach(metrics, actor, park.ticket, Reply::new(nowhere), started);
            reply(r, Ok(Outcome::Parked));
            return;
        }
        (Some(park), Ok(_), Some(r), Some(rt)) => {
            // Parked: it leaves when a later event completes it (or did
            // already, while this batch was made durable).
            rt.parked.attach(metrics, actor, park.ticket, r, started);
            return;
        }
        (Some(park), _, r, Some(rt)) => {
            // Reserved at the commit, which did not become durable: the
            // request hears the error.
            rt.parked.cancel(park.ticket);
            r
        }
        (_, _, r, _) => r,
    };
    let r = match (replicated && out.is_ok(), repl_mark, r) {
        (true, Some(mark), Some(r)) => {
            let upload = trace.zip(rt).map(|((t, _), rt)| replication::UploadSpan {
                traces: Arc::clone(&rt.traces),
                parent: t.parent(),
                since: crate::clock::instant(),
            });
            let spans = (started, upload);
            if rt.is_some_and(|rt| rt.faults.unsafe_fail_landed_after_give_up()) {
                replication::hold_ignoring_landed(metrics, actor, mark, r, out, spans);
            } else {
                replication::hold_until_uploaded(metrics, actor, mark, r, out, spans);
            }
            return;
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

/// Phase 7: the replies, once the commit is on disk (`fsync` durability,
/// when anyone waits); a `replicated` one waits for the upload that
/// carries the commit too. A failed sync fails the events that succeeded.
pub(super) fn release_replies(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    results: Vec<Ran>,
    after: AfterCommit,
    committed_at: Instant,
) {
    let waiting = results.iter().any(|r| r.reply.is_some())
        || after.restore.is_some()
        || after.outbox.is_some()
        || !after.completions.is_empty()
        || !after.socket_ops.is_empty();
    let completions = after.completions;
    let socket_ops = after.socket_ops;
    let restore = after.restore;
    let metrics = Arc::clone(&rt.metrics);
    let actor = Arc::clone(actor);
    let repl_mark = after.repl_mark;
    let outbox = after.outbox;
    let weak = Arc::downgrade(rt);
    let traces = Arc::clone(&rt.traces);
    let release = move |sync: Result<(), String>| {
        metrics
            .phase_durable
            .observe_ms(committed_at.elapsed().as_secs_f64() * 1000.0);
        let rt = weak.upgrade();
        if let Some(rt) = &rt {
            rt.faults.wait_while_durability_held();
        }
        for ran in &results {
            // Spans first: they are in the ring before the reply leaves.
            if let Some((t, queued)) = &ran.trace {
                t.finish(&traces, *queued);
            }
        }
        for ran in results {
            release_one(rt.as_ref(), &metrics, &actor, &sync, ran, repl_mark);
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
                if let (Some(restore), Some(mark)) = (restore, repl_mark) {
                    super::between::restore_to_bookmark(&rt, &actor, mark, restore);
                }
            }
            crate::dispatch::drop_elsewhere(rt);
        }
    };
    // A new actor's first batch syncs its folders even with no one
    // waiting: a later batch finds the actor existing and would not.
    let creation = !after.dirs.is_empty();
    if rt.config.durability == Durability::Fsync && (waiting || creation) && after.removed.is_none()
    {
        rt.durability.submit(SyncJob {
            files: vec![after.wal],
            dirs: after.dirs,
            done: Box::new(release),
        });
    } else {
        release(Ok(()));
    }
}
