//! The alarm's events: the timer's `Alarm` (run it if due, with the retry
//! rule of `wasmkeep_cluster::retry`), a sweep's `Deliver` (ADR 0009, through
//! `crate::index`), and the rehearsal that prepares an alarm's statements
//! ahead of it (ADR 0026).

use super::*;

/// Calls `on-alarm` for the committed alarm `state`, inside the caller's
/// transaction. The alarm counts as set only until it starts: it is
/// cleared first, so inside the handler get-alarm sees none unless the
/// handler sets one.
pub(super) fn call_on_alarm(
    l: &mut Loaded,
    state: AlarmState,
) -> Result<wasmtime::Result<Result<(), host::WitError>>, RuntimeError> {
    l.db().set_alarm(None)?;
    Ok(invoke_on_alarm(l, state))
}

/// Calls `on-alarm` for `state` (the caller cleared the alarm).
pub(super) fn invoke_on_alarm(
    l: &mut Loaded,
    state: AlarmState,
) -> wasmtime::Result<Result<(), host::WitError>> {
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
    r
}

/// A sweep's delivery of the entry at `at_ms` (see `index::deliver`). A
/// fence or a wait for the bucket answers `Fenced`, once the batch's
/// commits are uploaded (the caller makes the event wait for them).
pub(super) fn run_delivery(
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
pub(super) fn delivered_without_state(
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
    let delivered = match no_state_step(rt, at_ms, crate::index::Standing::of(actor)) {
        NoStateStep::Leave { retry_at_ms } => Delivered::Leave { retry_at_ms },
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

pub(super) fn run_alarm(
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
    if l.app.waits {
        // A handler that waits is suspended with its alarm (ADR 0056).
        let mut awaits = crate::awaits::EventAwaits::first(Vec::new());
        awaits.alarm = Some(state);
        l.store.data_mut().awaits = Some(awaits);
    }
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
            if super::awaiting::waits(l) {
                // It waits: suspended by the turn, not retried.
                return Err(e);
            }
            retry_after_failure(rt, l, state, op, &e)?;
            Err(e)
        }
    }
}

/// A failed `on-alarm` run (its writes rolled back): commits the alarm's
/// retry by the retry rule, or drops it past `retries_max`, and says so.
pub(super) fn retry_after_failure(
    rt: &Arc<Inner>,
    l: &mut Loaded,
    state: AlarmState,
    op: AlarmOp,
    e: &RuntimeError,
) -> Result<(), RuntimeError> {
    let class = rt.class_metrics.of(&l.store.data().id);
    {
        {
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
            // A retry runs under the link of the alarm it retries.
            l.store.data_mut().alarm_retried = Some((state.at_ms, next.map(|n| n.at_ms)));
            Metrics::inc(&rt.metrics.alarms_failed_total);
            if let Some(c) = &class {
                c.alarm_runs_failed.inc();
            }
            let id = l.store.data().id.clone();
            log_alarm_failure(rt, id, e, state.retry_count, out.dropped, next, now);
            Ok(())
        }
    }
}

/// A failing alarm is a warning with its count of failures so far and
/// what happens next (issue 22), in the node's log and the actor's
/// (`wasmkeep logs`); `next` is the attempt committed, if any.
fn log_alarm_failure(
    rt: &Inner,
    id: ActorId,
    e: &RuntimeError,
    retry_count: u32,
    dropped: bool,
    next: Option<AlarmState>,
    now: u64,
) {
    let failures = retry_count + 1;
    // A guest's error can be megabytes: formatted once, cut once.
    let error = crate::logs::clip(&e.to_string(), crate::logs::LINE_BYTES_MAX).into_owned();
    let message = match next {
        _ if dropped => {
            Metrics::inc(&rt.metrics.alarms_abandoned_total);
            format!("alarm failed ({failures} failures): dropped after retries_max; error: {error}")
        }
        Some(n) => format!(
            "alarm failed ({failures} failures so far), retry in {} ms; error: {error}",
            n.at_ms.saturating_sub(now)
        ),
        None => format!("alarm failed ({failures} failures so far); error: {error}"),
    };
    // Many failing actors must not flood the node's log: the warnings are
    // cut to a rate (each actor's own lines are not).
    if let Some(left_out) = rt.alarm_failure_rate.admit(ALARM_FAILURE_LOG_PER_S) {
        tracing::warn!(actor = %id, %error, retry_count, dropped, left_out, "alarm failed");
    }
    use crate::logs::{Level, LogLine, Source};
    rt.logs
        .push(LogLine::new(now, Level::Warn, Source::Runtime, id, message));
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
pub(super) fn rehearse_alarm(rt: &Arc<Inner>, app: &Arc<App>, l: &mut Loaded) -> bool {
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
