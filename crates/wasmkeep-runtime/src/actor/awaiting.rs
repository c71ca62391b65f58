//! The actor's side of waits (issue 36, ADR 0056): suspending an event
//! whose handler waited for an answer it did not have, the gate that holds
//! the actor's other events meanwhile, and the run of the event again when
//! the answer (or the deadline) comes.
//!
//! - **Suspending** ([`after_handler`]): the handler's run is rolled back
//!   (`finish_call` fails a run that waited); in a savepoint of its own,
//!   the call goes into the outbox (context `awaits::AWAIT_CONTEXT`), the event
//!   into `_wasmkeep_await` (its input, journal, deadline, the request's
//!   parked reply, the time and seed it ran with) and an alarm that ran is
//!   cleared (it is the suspended event's now). The batch stops there:
//!   its other events go back to the queue.
//! - **The gate** ([`Awaiting`], in the actor's queue, set once the batch
//!   is committed, and read from the database when the actor opens): only
//!   the awaited answer, the deadline, and events that run no handler
//!   (inspections, deletes, restores, outbox hand-overs) are taken; the
//!   rest waits in the queue (`actor_queue_events_max` still bounds it). A
//!   request whose chain of waiting actors names this actor, or the one it
//!   waits on, closes a cycle of waits and is refused at once with
//!   `await_deadlock`.
//! - **Running again** ([`resume`]): the answer's event takes the outbox
//!   row and the suspended event, adds the answer to the journal and runs
//!   the event from its start with the first run's time and seed. If it
//!   waits again it is suspended again; if it ends, its request's parked
//!   reply is completed with what it answered (or its error) and the gate
//!   opens once the batch commits.
//! - **Deadlines**: a task on the outbox's runtime enqueues the deadline
//!   ([`EventKind::AwaitDeadline`]) when it passes; the wait then gets
//!   `failed` with `await_timeout`. Armed again whenever the actor opens
//!   suspended (after a restart or a move).

use super::batch::EventsRan;
use super::*;
use crate::awaits::{EventAwaits, error_response, timed_out};
use crate::guest_tape::EventTape;
use wasmkeep_store::db::Suspended;

/// What a suspended actor waits on: the queue's gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Awaiting {
    /// The outbox row of the awaited call.
    pub seq: u64,
    /// The actor the call goes to (a message), for finding cycles.
    pub target: Option<String>,
    /// When the wait ends without an answer (node clock, ms).
    pub deadline_ms: u64,
}

impl Awaiting {
    fn of(s: &Suspended) -> Awaiting {
        Awaiting {
            seq: s.seq,
            target: (!s.target().is_empty()).then(|| s.target().to_owned()),
            deadline_ms: s.deadline_ms,
        }
    }
}

/// The actor waited on, from a suspended event's chain (its last entry
/// is the actor itself; the awaited target follows a `>`).
trait Target {
    fn target(&self) -> &str;
}

impl Target for Suspended {
    fn target(&self) -> &str {
        self.chain.split_once('>').map_or("", |(_, t)| t)
    }
}

/// The chain of actors waiting on a suspended event, this one last.
fn chain_of(s: &Suspended) -> Vec<String> {
    let chain = s.chain.split_once('>').map_or(s.chain.as_str(), |(c, _)| c);
    chain
        .split(',')
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Whether an event may run while the actor waits on row `seq`.
pub(crate) fn admitted(kind: &EventKind, seq: u64) -> bool {
    match kind {
        EventKind::Inbound(Inbound::Response { seq: s, .. }) => *s == seq,
        EventKind::AwaitDeadline { .. }
        | EventKind::Between(_)
        | EventKind::Prepare
        | EventKind::OutboxResume { .. } => true,
        _ => false,
    }
}

/// Whether the running handler waited for an answer it does not have.
pub(super) fn waits(l: &Loaded) -> bool {
    l.store
        .data()
        .awaits
        .as_ref()
        .is_some_and(|a| a.pending.is_some())
}

/// Whether the answer to row `seq` is the one the actor waits for.
pub(super) fn answers_wait(rt: &Inner, actor: &Actor, l: &mut Loaded, seq: u64) -> bool {
    if rt.faults.unsafe_await_without_gate() {
        // No gate to ask: the database says.
        return l
            .db()
            .suspended()
            .ok()
            .flatten()
            .is_some_and(|s| s.seq == seq);
    }
    actor
        .queue
        .lock()
        .awaiting
        .as_ref()
        .is_some_and(|a| a.seq == seq)
}

/// Whether the queue has an event the gate lets run.
pub(super) fn has_admitted(q: &Queue) -> bool {
    match &q.awaiting {
        None => !q.events.is_empty(),
        Some(a) => q.events.iter().any(|e| admitted(&e.kind, a.seq)),
    }
}

/// Takes up to `n` events the gate lets run, in order; the others stay.
pub(super) fn take_admitted(q: &mut Queue, n: usize) -> Vec<Event> {
    let Some(a) = &q.awaiting else {
        let n = q.events.len().min(n);
        return q.events.drain(..n).collect();
    };
    let seq = a.seq;
    let mut taken = Vec::new();
    let mut kept = VecDeque::with_capacity(q.events.len());
    for ev in q.events.drain(..) {
        if taken.len() < n && admitted(&ev.kind, seq) {
            taken.push(ev);
        } else {
            kept.push_back(ev);
        }
    }
    q.events = kept;
    taken
}

/// Why a request arriving at an actor that waits closes a cycle of waits,
/// if it does: its chain names this actor, or the one this actor waits on.
pub(crate) fn closes_cycle(id: &ActorId, a: &Awaiting, ev: &Event) -> Option<String> {
    let chain = match &ev.kind {
        EventKind::Request(req) => crate::awaits::chain_of(&req.headers),
        EventKind::Inbound(Inbound::Message { chain, .. }) => chain.clone(),
        _ => return None,
    };
    if chain.is_empty() && a.target.is_none() {
        return None;
    }
    let me = crate::awaits::chain_name(id);
    let cycle = chain
        .iter()
        .any(|c| *c == me || a.target.as_deref() == Some(c.as_str()));
    cycle.then(|| {
        format!(
            "{id} waits for an answer, and this call comes from an actor waiting on it (chain {}): a cycle of waits, which would never end",
            chain.join(" > ")
        )
    })
}

/// What a suspended actor does with an event arriving for it: `Some` to
/// hold it in its queue (or run it, if the gate admits it); `None` when it
/// was answered here: a sweep's delivery is told to come again after the
/// deadline (held, it would keep one of the sweep's slots), a message
/// that closes a cycle of waits hears the receiver's refusal (which ends
/// the waiting sender's wait), a request that closes one 409
/// `await_deadlock`.
pub(crate) fn at_gate(id: &ActorId, a: &Awaiting, ev: Event) -> Option<Event> {
    let answer = match &ev.kind {
        EventKind::Deliver { .. } => Ok(Outcome::Delivered(Delivered::Leave {
            retry_at_ms: a.deadline_ms,
        })),
        _ => match closes_cycle(id, a, &ev) {
            None => return Some(ev),
            Some(why) if matches!(ev.kind, EventKind::Inbound(Inbound::Message { .. })) => {
                Ok(Outcome::Answered(MessageAnswer::Refused {
                    code: "await_deadlock".into(),
                    message: why,
                }))
            }
            Some(why) => Err(RuntimeError::Refused {
                code: "await_deadlock",
                message: why,
            }),
        },
    };
    if let Some(r) = ev.reply {
        let _ = r.send(answer);
    }
    None
}

/// Before an event runs: an app that may wait runs its requests and
/// alarms with a time and seed (a fresh one, or the recording's) that a
/// suspended event runs again with. Returns whether it set them.
pub(super) fn start_run(
    rt: &Inner,
    l: &mut Loaded,
    kind: &EventKind,
    recorder: Option<&crate::recording::EventRecorder>,
) -> bool {
    let may_wait = l.app.waits
        && matches!(
            kind,
            EventKind::Request(_) | EventKind::Alarm { .. } | EventKind::Deliver { .. }
        );
    if !may_wait {
        return false;
    }
    let tape = recorder.map(|r| r.tape()).unwrap_or_else(|| {
        let mut seed = [0u8; 32];
        rand::Rng::fill_bytes(&mut rand::rng(), &mut seed);
        EventTape {
            at_ms: rt.clock.now_ms(),
            seed,
        }
    });
    let state = l.store.data_mut();
    state.tape.play(&tape);
    state.await_tape = Some(tape);
    true
}

/// After an event ran: the instance's clock and random go back to the
/// node's, if [`start_run`] set them (and no recording does it).
pub(super) fn end_run(l: &mut Loaded, started: bool) {
    if started {
        l.store.data().tape.stop();
    }
}

/// What ran: a first run of a request or an alarm, or a suspended event
/// run again.
pub(super) enum Run {
    Request,
    Alarm,
    Again(Suspended),
}

/// After a handler that may wait ran: if it waited for an answer it did
/// not have, suspends its event (see the module's documentation) and
/// returns what its caller hears now; otherwise returns `r`.
pub(super) fn after_handler(
    rt: &Arc<Inner>,
    l: &mut Loaded,
    ran: &mut EventsRan,
    r: Result<Outcome, RuntimeError>,
    run: Run,
) -> Result<Outcome, RuntimeError> {
    let Some(aw) = l.store.data_mut().awaits.take() else {
        return r;
    };
    let Some(pending) = aw.pending else {
        return r;
    };
    if !l.db().in_transaction() {
        // SQLite dropped the batch: nothing can be kept.
        return r.and(Err(RuntimeError::Internal(
            "the transaction was lost while the event suspended".into(),
        )));
    }
    forget_run(l);
    let tape = l.store.data().await_tape.unwrap_or(EventTape {
        at_ms: rt.clock.now_ms(),
        seed: [0; 32],
    });
    let (kind, input, ticket) = match &run {
        Run::Request => {
            let Some((kind, input)) = aw.input else {
                return r;
            };
            (kind.to_owned(), input, None)
        }
        Run::Alarm => {
            let Some(a) = &aw.alarm else {
                return r;
            };
            ("alarm".to_owned(), alarm_input(a), Some(0))
        }
        Run::Again(s) => (s.kind.clone(), s.input.clone(), Some(s.ticket)),
    };
    let deadline_ms = deadline_of(rt, l, pending.within_ms, tape.at_ms);
    let target = pending.target.clone().unwrap_or_default();
    let mut chain = aw.chain.clone();
    chain.push(crate::awaits::chain_name(&l.store.data().id));
    l.db().event_begin()?;
    let kept = (|| {
        prepare_suspension(l, &run)?;
        let seq = l
            .store
            .data_mut()
            .push(pending.row)
            .map_err(|e| RuntimeError::Guest {
                code: e.code,
                message: e.message,
            })?;
        let ticket = match ticket {
            Some(t) => t,
            None => park_reply(l)?,
        };
        let journal = crate::recording::encode_journal(&aw.journal, &pending.digest);
        l.db().suspend(&Suspended {
            kind,
            input,
            journal,
            seq,
            deadline_ms,
            ticket,
            at_ms: tape.at_ms,
            seed: tape.seed.to_vec(),
            chain: format!("{}>{target}", chain.join(",")),
        })?;
        Ok::<_, RuntimeError>(seq)
    })();
    match kept {
        Ok(seq) => {
            commit_event(l)?;
            ran.awaiting = Some(Some(Awaiting {
                seq,
                target: (!target.is_empty()).then_some(target),
                deadline_ms,
            }));
            Metrics::inc(&rt.metrics.awaits_suspended_total);
            Ok(match run {
                // The reply is parked: what is answered here is not heard.
                Run::Request => Outcome::Response(ActorResponse {
                    status: 202,
                    headers: Vec::new(),
                    body: Vec::new(),
                    socket: None,
                }),
                Run::Alarm => Outcome::Alarm(true),
                Run::Again(_) => Outcome::Done,
            })
        }
        Err(e) => {
            if l.db().in_transaction() {
                l.db().event_rollback()?;
            }
            Err(e)
        }
    }
}

/// Checks a suspension may be written, in its savepoint: never two (a
/// first run cannot suspend while another event waits); an alarm that ran
/// is the suspended event's now, so it is cleared.
fn prepare_suspension(l: &mut Loaded, run: &Run) -> Result<(), RuntimeError> {
    if !matches!(run, Run::Again(_)) && l.db().suspended()?.is_some() {
        return Err(RuntimeError::Internal(
            "an event ran while another of the actor was suspended".into(),
        ));
    }
    if matches!(run, Run::Alarm) {
        l.db().set_alarm(None)?;
    }
    Ok(())
}

/// When a wait of `within_ms` ends: one event waits at most
/// `AWAIT_WITHIN_MS_MAX` over all its waits (from its first run at
/// `first_ms`), and no longer than its request's reply stays parked.
fn deadline_of(rt: &Inner, l: &Loaded, within_ms: u64, first_ms: u64) -> u64 {
    let cap = l
        .store
        .data()
        .parked
        .as_ref()
        .map_or(crate::awaits::AWAIT_WITHIN_MS_MAX, |t| {
            t.limits().reply_ms_max
        })
        .min(crate::awaits::AWAIT_WITHIN_MS_MAX);
    (rt.clock.now_ms() + within_ms).min(first_ms + cap)
}

/// What the rolled-back run did is gone: its parked replies, socket
/// operations and restores with it.
fn forget_run(l: &mut Loaded) {
    let state = l.store.data_mut();
    state.replies.completions.clear();
    state.replies.park = None;
    state.socket_ops.clear();
    state.socket_accepted = None;
    state.restore = None;
    state.alarm_op = AlarmOp::Untouched;
}

/// Parks the running request's reply for the wait (as `replies.park`
/// would, for as long as the node lets a reply wait).
fn park_reply(l: &mut Loaded) -> Result<u64, RuntimeError> {
    let state = l.store.data_mut();
    let Some(table) = state.parked.clone() else {
        return Err(RuntimeError::Internal("no parked replies here".into()));
    };
    let already = state.replies.parked_in_batch.len();
    let ticket = table
        .ticket(&state.id, already)
        .map_err(|m| RuntimeError::Refused {
            code: "too_many_parked",
            message: m,
        })?;
    state.replies.park = Some(crate::replies::Park {
        ticket,
        timeout_ms: table.limits().reply_ms_max,
    });
    Ok(ticket)
}

fn alarm_input(a: &AlarmState) -> Vec<u8> {
    let mut v = a.at_ms.to_be_bytes().to_vec();
    v.extend_from_slice(&a.retry_count.to_be_bytes());
    v
}

fn alarm_of(input: &[u8]) -> Option<AlarmState> {
    Some(AlarmState {
        at_ms: u64::from_be_bytes(input.get(..8)?.try_into().ok()?),
        retry_count: u32::from_be_bytes(input.get(8..12)?.try_into().ok()?),
    })
}

/// The answer to row `seq` (or, with `None`, its deadline) for the
/// suspended event: runs it again (see the module's documentation). An
/// answer or deadline for a call the actor no longer waits on does
/// nothing but bring the gate in line with the database. Whatever fails
/// on the way ends the suspended event (its client hears the error): kept,
/// it would hold the actor's events for good.
pub(super) fn resume(
    rt: &Arc<Inner>,
    l: &mut Loaded,
    initialized: &mut bool,
    ran: &mut EventsRan,
    seq: u64,
    answer: Option<(u64, Answer)>,
) -> Result<Outcome, RuntimeError> {
    let s = match l.db().suspended()? {
        Some(s) if s.seq == seq => s,
        other => {
            ran.awaiting = Some(other.as_ref().map(Awaiting::of));
            return Ok(Outcome::Done);
        }
    };
    if let Some((life, _)) = &answer
        && l.db().outbox_life_if_any()? != Some(*life)
    {
        // An answer to an earlier life of this actor (deleted since).
        return Ok(Outcome::Done);
    }
    if answer.is_none() && rt.clock.now_ms() < s.deadline_ms {
        // Early (a clock stepped back, or an earlier wait's deadline with
        // its seq numbered again after a delete): armed again for this
        // wait's own.
        ran.awaiting = Some(Some(Awaiting::of(&s)));
        return Ok(Outcome::Done);
    }
    let answer = answer.map(|(_, a)| a);
    let (ticket, kind) = (s.ticket, s.kind.clone());
    let alarm = (kind == "alarm").then(|| alarm_of(&s.input)).flatten();
    l.db().event_begin()?;
    match run_again(rt, l, initialized, ran, s, answer) {
        Ok(out) => {
            commit_event(l)?;
            Ok(out)
        }
        Err(e) => {
            if l.db().in_transaction() {
                l.db().event_rollback()?;
                give_up(l, ran, seq, (&kind, ticket), &e)?;
                // Ended with its error, which its client hears; an alarm
                // takes its retry rule, as one whose handler failed.
                tracing::warn!(actor = %l.store.data().id, error = %e, "a suspended event could not run again: it ended with its error");
                if let Some(a) = alarm {
                    super::alarm::retry_after_failure(rt, l, a, AlarmOp::Untouched, &e)?;
                }
                return Ok(Outcome::Done);
            } else {
                // SQLite dropped the batch: the next deadline tries again.
                let a = Awaiting {
                    seq,
                    target: None,
                    deadline_ms: rt.clock.now_ms() + RESUME_RETRY_MS,
                };
                let _ = arm_deadline(rt, &l.store.data().id.clone(), &a);
            }
            Err(e)
        }
    }
}

/// How long after a resume that could not write its outcome the deadline
/// tries again.
const RESUME_RETRY_MS: u64 = 1_000;

/// Ends a suspended event that cannot run again: its row and call go, its
/// request's client hears `e`, the gate opens.
fn give_up(
    l: &mut Loaded,
    ran: &mut EventsRan,
    seq: u64,
    (kind, ticket): (&str, u64),
    e: &RuntimeError,
) -> Result<(), RuntimeError> {
    l.db().event_begin()?;
    let ended = l.db().outbox_take(seq).and_then(|_| l.db().resume_done());
    if let Err(e) = ended {
        l.db().event_rollback()?;
        return Err(e.into());
    }
    commit_event(l)?;
    if kind == "request" && ticket != 0 {
        l.store
            .data_mut()
            .replies
            .completions
            .push((ticket, error_response(e)));
    }
    ran.awaiting = Some(None);
    Ok(())
}

/// [`resume`]'s run of the event, inside its savepoint.
fn run_again(
    rt: &Arc<Inner>,
    l: &mut Loaded,
    initialized: &mut bool,
    ran: &mut EventsRan,
    s: Suspended,
    answer: Option<Answer>,
) -> Result<Outcome, RuntimeError> {
    // The row goes with this event: a late answer finds nothing.
    l.db().outbox_take(s.seq)?;
    if rt.faults.fail_resumes() {
        return Err(RuntimeError::Internal(
            "injected failure to run again".into(),
        ));
    }
    let (mut journal, waiting) = crate::recording::decode_journal(&s.journal).ok_or_else(|| {
        RuntimeError::Internal("a suspended event's journal does not decode".into())
    })?;
    let answer = answer.unwrap_or_else(timed_out);
    let held: u64 = journal.iter().map(|(_, a)| a.bytes()).sum();
    let answer = if held + answer.bytes() > crate::awaits::AWAIT_JOURNAL_BYTES_MAX {
        Answer::Failed {
            code: "await_journal_too_large".into(),
            message: format!(
                "the event's answers would pass await_journal_bytes_max={}",
                crate::awaits::AWAIT_JOURNAL_BYTES_MAX
            ),
        }
    } else {
        answer
    };
    journal.push((waiting, answer));
    let mut chain = chain_of(&s);
    chain.pop();
    let tape = EventTape {
        at_ms: s.at_ms,
        seed: s.seed.clone().try_into().unwrap_or([0; 32]),
    };
    let state = l.store.data_mut();
    state.tape.play(&tape);
    state.await_tape = Some(tape);
    let mut awaits = EventAwaits::resumed(journal, chain);
    if s.kind == "request" && s.ticket != 0 {
        awaits.ticket = Some(s.ticket);
    }
    let r = match (
        s.kind.as_str(),
        crate::recording::event_of(&s.kind, &s.input),
    ) {
        ("request", Some(EventKind::Request(req))) => {
            run_request(rt, l, req, initialized, Some(awaits))
        }
        ("alarm", _) => match alarm_of(&s.input) {
            Some(a) => run_alarm_again(rt, l, *initialized, a, awaits),
            None => Err(RuntimeError::Internal(
                "a suspended alarm does not decode".into(),
            )),
        },
        _ => Err(RuntimeError::Internal(format!(
            "a suspended event of kind `{}` cannot run again",
            s.kind
        ))),
    };
    l.store.data().tape.stop();
    if waits(l) {
        // It waits again.
        return after_handler(rt, l, ran, r, Run::Again(s));
    }
    l.store.data_mut().awaits = None;
    if !l.db().in_transaction() {
        return r.and(Err(RuntimeError::TransactionAborted));
    }
    l.db().resume_done()?;
    if s.kind == "request" && s.ticket != 0 {
        let resp = match r {
            Ok(Outcome::Response(mut resp)) => {
                // The completion says which version answered.
                resp.headers.retain(|(k, _)| k != super::VERSION_HEADER);
                resp
            }
            Ok(_) => error_response(&RuntimeError::Internal(
                "the request ended without an answer".into(),
            )),
            Err(e) => {
                // A failed run completes nothing but its own reply.
                l.store.data_mut().replies.completions.clear();
                error_response(&e)
            }
        };
        let parked_again = l.store.data().replies.park.is_some();
        let replies = &mut l.store.data_mut().replies;
        replies.park = None;
        if !parked_again {
            replies.completions.push((s.ticket, resp));
        }
    }
    ran.awaiting = Some(None);
    Ok(Outcome::Done)
}

/// Runs `on-alarm` again for a suspended alarm (its alarm was cleared when
/// it suspended). A run that fails sets the alarm's retry, as a failed
/// alarm does.
fn run_alarm_again(
    rt: &Arc<Inner>,
    l: &mut Loaded,
    initialized: bool,
    state: AlarmState,
    awaits: EventAwaits,
) -> Result<Outcome, RuntimeError> {
    if !initialized {
        return Ok(Outcome::Alarm(false));
    }
    l.db().event_begin()?;
    l.store.data_mut().awaits = Some(awaits);
    let r = super::alarm::invoke_on_alarm(l, state);
    let op = l.store.data().alarm_op;
    match finish_call(l, r) {
        Ok(()) => {
            commit_event(l)?;
            Ok(Outcome::Alarm(true))
        }
        Err(e) => {
            if !l.db().in_transaction() {
                return Err(e);
            }
            l.db().event_rollback()?;
            if waits(l) {
                return Err(e);
            }
            super::alarm::retry_after_failure(rt, l, state, op, &e)?;
            Err(e)
        }
    }
}

/// Reads whether the actor opened suspended: sets the gate (and its
/// deadline) and returns the turn's events it holds.
pub(super) fn gate_at_open(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    l: &mut Loaded,
    events: Vec<Event>,
) -> (Vec<Event>, Vec<Event>) {
    let s = match l.db().suspended() {
        Ok(Some(s)) => s,
        _ => {
            // Nothing suspended: a gate left from before goes.
            if actor.queue.lock().awaiting.is_some() {
                apply_gate(rt, actor, None);
            }
            return (events, Vec::new());
        }
    };
    let a = Awaiting::of(&s);
    apply_gate(rt, actor, Some(a.clone()));
    if rt.faults.unsafe_await_without_gate() {
        return (events, Vec::new());
    }
    let (mut run, mut held) = (Vec::new(), Vec::new());
    for ev in events {
        if admitted(&ev.kind, a.seq) {
            run.push(ev);
            continue;
        }
        // What arrived while the actor was closed meets the gate now.
        held.extend(at_gate(&actor.id, &a, ev));
    }
    (run, held)
}

/// Enqueues the wait's deadline when it passes; the task's handle, to
/// cancel it once the wait ends. A replay's sandbox arms none (its clock
/// moves only with the recorded events, among which the deadline is).
pub(super) fn arm_deadline(
    rt: &Arc<Inner>,
    id: &ActorId,
    a: &Awaiting,
) -> Option<tokio::task::AbortHandle> {
    if rt.config.replay_sandbox {
        return None;
    }
    let wait = a.deadline_ms.saturating_sub(rt.clock.now_ms());
    let weak = Arc::downgrade(rt);
    let (id, seq) = (id.clone(), a.seq);
    let task = rt.outbox.handle().spawn(async move {
        tokio::time::sleep(Duration::from_millis(wait)).await;
        if let Some(rt) = weak.upgrade() {
            let _ = rt.enqueue(
                &id,
                Event::new(EventKind::AwaitDeadline { seq }, None),
                false,
            );
        }
    });
    Some(task.abort_handle())
}

/// Sets the gate a committed batch leaves (`Some(None)`: open), with its
/// deadline (the previous one's task is cancelled).
pub(super) fn apply_gate(rt: &Arc<Inner>, actor: &Arc<Actor>, gate: Option<Awaiting>) {
    let task = gate.as_ref().and_then(|a| arm_deadline(rt, &actor.id, a));
    let mut q = actor.queue.lock();
    if let Some(old) = std::mem::replace(&mut q.deadline_task, task) {
        old.abort();
    }
    if gate.is_some() && rt.faults.unsafe_await_without_gate() {
        return;
    }
    q.awaiting = gate;
}
