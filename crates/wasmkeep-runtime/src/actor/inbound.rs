//! The outbox's part of a turn (ADR 0040): messages and answers arriving,
//! and committed rows leaving for the dispatcher.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use wasmkeep_store::{ActorId, InboxSeen, OutboxRow};

use super::{Actor, Loaded, Outcome, ensure_init, enter, finish_call};
use crate::error::RuntimeError;
use crate::host::inbox_exports::inbox;
use crate::host::wasmkeep::actor::types::Address;
use crate::outbox::{Answer, MessageAnswer, OutboundPolicy};
use crate::replication;
use crate::runtime::Inner;

/// Rows one batch committed, for the dispatcher.
pub(super) struct OutboxBatch {
    life: u64,
    rows: Vec<OutboxRow>,
    policy: Arc<OutboundPolicy>,
}

/// The committed rows above what was handed over already.
pub(super) fn read_outbox(rt: &Inner, actor: &Actor, l: &mut Loaded) -> Option<OutboxBatch> {
    let after = actor.outbox_offered.load(Ordering::Relaxed);
    let limit = rt.config.outbox.pending_max as usize;
    let rows = match l.db().outbox_pending(after, limit) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(actor = %actor.id, error = %e, "could not read the outbox: its rows go out when the actor opens again");
            return None;
        }
    };
    let last = rows.last()?.seq;
    let life = match l.db().outbox_life() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(actor = %actor.id, error = %e, "could not read the outbox's life");
            return None;
        }
    };
    actor.outbox_offered.store(last, Ordering::Relaxed);
    Some(OutboxBatch {
        life,
        rows,
        policy: Arc::clone(&l.app.outbound),
    })
}

/// Hands what the actor's database holds to the dispatcher now: at
/// opening, the rows are committed and durable already.
pub(super) fn offer_outbox(rt: &Inner, actor: &Actor, l: &mut Loaded) {
    if let Some(b) = read_outbox(rt, actor, l) {
        rt.outbox.offer(&actor.id, b.life, b.rows, b.policy);
    }
}

/// Hands a batch's rows to the dispatcher once its commit is durable: at
/// once without a bucket, once the bucket holds the commit with one (a
/// message must not leave for a commit that a restore from the bucket
/// would not have).
pub(super) fn hand_over(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    batch: OutboxBatch,
    mark: Option<replication::Mark>,
) {
    let Some(mark) = mark else {
        rt.outbox
            .offer(&actor.id, batch.life, batch.rows, batch.policy);
        return;
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    replication::hold_until_uploaded(
        &rt.metrics,
        actor,
        mark,
        crate::reply::Reply::new(tx),
        Ok(Outcome::Done),
        None,
    );
    let id = actor.id.clone();
    rt.outbox
        .offer_when(rx, id, batch.life, batch.rows, batch.policy);
}

/// Whether a failure of `on-message` is the receiver's answer (its own
/// doing, which a retry would repeat) rather than the node's (worth
/// delivering again).
fn is_answer(e: &RuntimeError) -> bool {
    match e {
        RuntimeError::Store(s) => s.is_guest_fault(),
        RuntimeError::Guest { .. }
        | RuntimeError::Trap(_)
        | RuntimeError::CpuTimeExceeded { .. }
        | RuntimeError::MemoryExceeded { .. }
        | RuntimeError::ResponseTooLarge { .. }
        | RuntimeError::ResponseHeadersTooLarge { .. } => true,
        _ => false,
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
    let sender = format!("{from}@{life:016x}");
    let was_initialized = *initialized;
    l.db().event_begin()?;
    let mut handler_open = false;
    let r = (|| {
        ensure_init(rt, l, initialized)?;
        let dedup = !rt.faults.unsafe_inbox_no_dedup.load(Ordering::Relaxed);
        if dedup
            && let Some(seen) = l.db().inbox_seen(&sender)?
            && seen.seq >= seq
        {
            if seen.seq == seq {
                return Ok(answer_of(seen));
            }
            // An older message than the last applied: its sender heard
            // its answer before it sent the next one.
            return Ok(MessageAnswer::Refused {
                code: "stale_message".into(),
                message: format!(
                    "message {seq} was answered before message {} was applied",
                    seen.seq
                ),
            });
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
                l.db().event_commit()?;
                MessageAnswer::Reply(bytes)
            }
            Err(e) if is_answer(&e) && l.db().in_transaction() => {
                l.db().event_rollback()?;
                MessageAnswer::Refused {
                    code: e.code(),
                    message: e.to_string(),
                }
            }
            Err(e) => return Err(e),
        };
        handler_open = false;
        l.db().inbox_record(&sender, &seen_of(seq, &answer))?;
        Ok(answer)
    })();
    match r {
        Ok(answer) => {
            l.db().event_commit()?;
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
    seq: u64,
    answer: Answer,
    attempts: u32,
    discard: bool,
) -> Result<Outcome, RuntimeError> {
    l.db().event_begin()?;
    let r = (|| {
        let row = if rt.faults.unsafe_response_keeps_row.load(Ordering::Relaxed) {
            l.db()
                .outbox_pending(seq - 1, 1)?
                .into_iter()
                .find(|r| r.seq == seq)
        } else {
            l.db().outbox_take(seq)?
        };
        let Some(row) = row else {
            return Ok(());
        };
        if discard {
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
    match r {
        Ok(()) => {
            l.db().event_commit()?;
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
