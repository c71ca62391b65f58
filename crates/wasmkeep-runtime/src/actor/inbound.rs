//! The outbox's part of a turn (ADR 0040): messages and answers arriving,
//! and committed rows leaving for the dispatcher.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use wasmkeep_store::{ActorId, InboxSeen};

use super::{Actor, Loaded, Outcome, end_event, ensure_init, enter, finish_call};
use crate::dispatch::Offered;
use crate::error::RuntimeError;
use crate::host::inbox_exports::inbox;
use crate::host::wasmkeep::actor::types::Address;
use crate::node::Inner;
use crate::outbox::{Answer, MessageAnswer};
use crate::replication;

/// Hands rows above the actor's mark (up to `upto`, or all) to the
/// dispatcher, read now from the database in sequence order, and moves
/// the mark only if the dispatcher took them (one that set them aside
/// sends an `OutboxResume` when it has room, which reads them again).
pub(super) fn offer_outbox(rt: &Inner, actor: &Actor, l: &mut Loaded, upto: Option<u64>) {
    if rt.config.replay_sandbox {
        // A replay reaches nothing outside: its rows stay where they are.
        return;
    }
    if let Some(upto) = upto {
        // Offered up to `upto` only once it is durable (see the callers).
        actor.outbox_durable.fetch_max(upto, Ordering::Relaxed);
    }
    let after = actor.outbox_offered.load(Ordering::Relaxed);
    let limit = rt.config.outbox.pending_max as usize;
    let mut rows = match l.db().outbox_pending(after, limit) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(actor = %actor.id, error = %e, "could not read the outbox: its rows go out when the actor opens again");
            return;
        }
    };
    if let Some(upto) = upto {
        rows.retain(|r| r.seq <= upto);
    }
    let Some(last) = rows.last().map(|r| r.seq) else {
        return;
    };
    let life = match l.db().outbox_life_if_any() {
        Ok(Some(n)) => n,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(actor = %actor.id, error = %e, "could not read the outbox's life");
            return;
        }
    };
    let policy = Arc::clone(&l.app.outbound);
    if rt.outbox.offer(&actor.id, life, rows, policy) == Offered::Taken {
        actor.outbox_offered.store(last, Ordering::Relaxed);
    }
}

/// After a batch that sent, once its commit is durable: its rows (up to
/// `upto`) go out in a later turn of the actor (an `OutboxResume` event,
/// which reads them from the database), at once without a bucket, once
/// the bucket holds the commit with one: a message must not leave for a
/// commit that a restore from the bucket would not have.
pub(super) fn outbox_ready(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    upto: u64,
    mark: Option<replication::Mark>,
) {
    let mark = mark.filter(|_| !rt.faults.unsafe_outbox_before_upload());
    let Some(mark) = mark else {
        rt.enqueue_outbox_resume(&actor.id, Some(upto));
        return;
    };
    let id = actor.id.clone();
    super::when_uploaded(rt, actor, mark, move |rt| {
        rt.enqueue_outbox_resume(&id, Some(upto))
    });
}

/// At opening: what the outbox holds goes out, at once without a bucket,
/// and with one once everything committed so far is in the bucket.
pub(super) fn outbox_opened(rt: &Arc<Inner>, actor: &Arc<Actor>, l: &mut Loaded) {
    actor.outbox_offered.store(0, Ordering::Relaxed);
    let max = match l.db().outbox_max_seq() {
        Ok(Some(m)) => m,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(actor = %actor.id, error = %e, "could not read the outbox");
            return;
        }
    };
    match &rt.replication {
        // What a database holds when it is opened is on disk.
        None => offer_outbox(rt, actor, l, Some(max)),
        Some(_) => outbox_ready(rt, actor, max, Some(replication::current_mark(actor))),
    }
}

/// What the receiver keeps an answer as (`_wasmkeep_inbox`).
fn seen_of(seq: u64, a: &MessageAnswer) -> InboxSeen {
    match a {
        MessageAnswer::Reply(b) => InboxSeen {
            seq,
            ok: true,
            answer: b.clone(),
        },
        MessageAnswer::Refused { code, message } => InboxSeen {
            seq,
            ok: false,
            answer: format!("{code}\n{message}").into_bytes(),
        },
    }
}

fn answer_of(seen: InboxSeen) -> MessageAnswer {
    if seen.ok {
        return MessageAnswer::Reply(seen.answer);
    }
    let text = String::from_utf8_lossy(&seen.answer).into_owned();
    let (code, message) = text.split_once('\n').unwrap_or((&text, ""));
    MessageAnswer::Refused {
        code: code.to_string(),
        message: message.to_string(),
    }
}

/// The answer a message already has, if the receiver applied it (or a
/// later one from the same sender's life) before: a repeated delivery.
fn answered_before(
    l: &mut Loaded,
    sender: &str,
    seq: u64,
) -> Result<Option<MessageAnswer>, RuntimeError> {
    let Some(seen) = l.db().inbox_seen(sender)? else {
        return Ok(None);
    };
    if seen.seq < seq {
        return Ok(None);
    }
    if seen.seq == seq {
        return Ok(Some(answer_of(seen)));
    }
    // An older message than the last applied: its sender heard its answer
    // before it sent the next one.
    Ok(Some(MessageAnswer::Refused {
        code: "stale_message".into(),
        message: format!(
            "message {seq} was answered before message {} was applied",
            seen.seq
        ),
    }))
}

/// A message from `from`: applied once. The receiver's `on-message` runs
/// in a savepoint of its own inside the event's, so that when it fails
/// (its answer) the record of having answered still commits; a repeated
/// delivery gets the recorded answer without running it again.
pub(super) fn run_message(
    rt: &Arc<Inner>,
    l: &mut Loaded,
    from: &ActorId,
    life: u64,
    seq: u64,
    body: Vec<u8>,
    initialized: &mut bool,
) -> Result<Outcome, RuntimeError> {
    if l.inbox.is_none() {
        return Err(RuntimeError::NoInbox(format!(
            "{}/{} does not export wasmkeep:actor/inbox: it cannot receive messages",
            l.app.tenant, l.app.name
        )));
    }
    // The name as it is, not its written form: these keys are stored, and
    // keep the form they had before names were written percent-encoded.
    let sender = format!(
        "{}/{}/{}/{}@{life:016x}",
        from.tenant, from.app, from.class, from.name
    );
    let was_initialized = *initialized;
    l.db().event_begin()?;
    let mut handler_open = false;
    let r = (|| {
        ensure_init(rt, l, initialized)?;
        let dedup = !rt.faults.unsafe_inbox_no_dedup();
        if dedup && let Some(answer) = answered_before(l, &sender, seq)? {
            return Ok(answer);
        }
        l.db().event_begin()?;
        handler_open = true;
        enter(l);
        let class = l.store.data().id.class.clone();
        let message = inbox::Message {
            from: Address {
                app: from.app.clone(),
                class: from.class.clone(),
                name: from.name.clone(),
            },
            seq,
            body,
        };
        let exports = l.inbox.as_ref().expect("checked above");
        let r = exports
            .wasmkeep_actor_inbox()
            .call_on_message(&mut l.store, &class, &message);
        let answer = match finish_call(l, r) {
            Ok(bytes) => {
                super::commit_event(l)?;
                MessageAnswer::Reply(bytes)
            }
            Err(e) if e.is_guest_failure() && l.db().in_transaction() => {
                l.db().event_rollback()?;
                // What the failed handler did is gone, replies it
                // completed included.
                l.store.data_mut().replies.completions.clear();
                // The sender hears the handler's own code (a typed call's
                // caller matches on it); it cannot pass for the node's,
                // since the answer says it is the receiver's refusal.
                let (code, message) = match &e {
                    RuntimeError::Guest { code, message } => (code.clone(), message.clone()),
                    e => (e.code(), e.to_string()),
                };
                MessageAnswer::Refused { code, message }
            }
            Err(e) => return Err(e),
        };
        handler_open = false;
        l.db().inbox_record(&sender, &seen_of(seq, &answer))?;
        Ok(answer)
    })();
    match r {
        Ok(answer) => {
            super::commit_event(l)?;
            Ok(Outcome::Answered(answer))
        }
        Err(e) => {
            *initialized = was_initialized;
            if handler_open && l.db().in_transaction() {
                l.db().event_rollback()?;
            }
            if l.db().in_transaction() {
                l.db().event_rollback()?;
            }
            Err(e)
        }
    }
}

fn wit_answer(a: Answer) -> inbox::Answer {
    let err = |code: String, message: String| inbox::Error { code, message };
    match a {
        Answer::Message(MessageAnswer::Reply(b)) => inbox::Answer::Reply(b),
        Answer::Message(MessageAnswer::Refused { code, message }) => {
            inbox::Answer::Refused(err(code, message))
        }
        Answer::Http {
            status,
            headers,
            body,
        } => inbox::Answer::Http(inbox::HttpResponse {
            status,
            headers,
            body,
        }),
        Answer::Failed { code, message } => inbox::Answer::Failed(err(code, message)),
    }
}

/// The answer to row `seq`: the row is taken (deleted) in this event, so a
/// second answer finds nothing and does nothing. If `on-response` fails,
/// the event rolls back with the row, and the dispatcher offers the answer
/// again.
pub(super) fn run_response(
    rt: &Inner,
    l: &mut Loaded,
    life: u64,
    seq: u64,
    answer: Answer,
    attempts: u32,
    discard: bool,
) -> Result<Outcome, RuntimeError> {
    l.db().event_begin()?;
    let r = (|| {
        if l.db().outbox_life_if_any()? != Some(life) {
            // An answer to an earlier life of this actor (deleted since).
            return Ok(());
        }
        let row = if rt.faults.unsafe_response_keeps_row() {
            l.db()
                .outbox_pending(seq.saturating_sub(1), 1)?
                .into_iter()
                .find(|r| r.seq == seq)
        } else {
            l.db().outbox_take(seq)?
        };
        let Some(row) = row else {
            return Ok(());
        };
        if discard || row.context.starts_with(crate::awaits::AWAIT_CONTEXT) {
            // Discarded, or the answer to a wait the actor no longer
            // waits on (its deadline passed): nobody hears it.
            return Ok(());
        }
        if l.inbox.is_none() {
            tracing::warn!(actor = %l.store.data().id, seq, "an answer arrived for an app without wasmkeep:actor/inbox: dropped");
            return Ok(());
        }
        let class = l.store.data().id.class.clone();
        let response = inbox::Response {
            seq,
            context: row.context,
            answer: wit_answer(answer),
            attempts,
        };
        enter(l);
        let exports = l.inbox.as_ref().expect("checked above");
        let r = exports
            .wasmkeep_actor_inbox()
            .call_on_response(&mut l.store, &class, &response);
        finish_call(l, r)
    })();
    end_event(l, r)
}
