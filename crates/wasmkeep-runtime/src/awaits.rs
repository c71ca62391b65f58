//! Awaiting a call inside a handler, without interleaving (issue 36, ADR
//! 0056): the guest's `awaits.wait`.
//!
//! A handler (`on-request` or `on-alarm`) asks for the answer to a call (a
//! message to another actor, or an HTTP call). The event's journal holds
//! the answers it already had: the `n`th wait of a run gets the `n`th
//! answer at once, if the call is the same as the one recorded (else the
//! event fails with `await_nondeterministic`). A wait past the journal
//! returns the error `suspended`, which the SDKs return from the handler;
//! whatever the handler does with it, the event then fails and rolls back
//! ([`EventAwaits::pending`] makes `finish_call` fail it), and the turn
//! suspends it (`crate::actor::awaiting`): the call goes into the outbox,
//! the event into the actor's database, and the actor runs nothing else
//! until the answer or the deadline comes; then the event runs again from
//! its start with one more answer.
//!
//! What is not checked: code before a wait that reads the wall clock
//! through `std` or draws randomness outside the SDK may decide
//! differently on a later run (the host's clock and random are those of
//! the first run, as a recording's are).

use sha2::Digest as _;
use wasmkeep_store::OutboxRow;

use crate::host::HostState;
use crate::host::WitError;
use crate::host::wasmkeep::actor::awaits;
use crate::outbox::{Answer, MessageAnswer, refusal};
use crate::response::ActorResponse;

/// How long a wait lasts when the handler does not say (ms).
pub const AWAIT_WITHIN_MS_DEFAULT: u64 = 30_000;
/// The longest wait a handler may ask for (ms), and the longest one event
/// waits over all its waits (from its first run): a suspended request's
/// reply is parked as long as the node lets a reply wait
/// (`parked_reply_ms_max`, 300 s by default).
pub const AWAIT_WITHIN_MS_MAX: u64 = 300_000;
/// Bytes of answers one event's journal holds at most (a wait whose
/// answer would pass it gets `await_journal_too_large` instead).
pub const AWAIT_JOURNAL_BYTES_MAX: u64 = 8 << 20;
/// Waits one event may make, over all its runs.
pub const AWAITS_PER_EVENT_MAX: usize = 64;
/// Actors an awaited call's chain names at most (a longer chain is
/// refused with `await_chain_too_long`).
pub const AWAIT_CHAIN_MAX: usize = 16;
/// The context an awaited call's outbox row carries: its answer resumes
/// the suspended event instead of going to `on-response`.
pub(crate) const AWAIT_CONTEXT: &[u8] = b"wk-await\n";
/// The header an awaited call carries: the actors waiting on its answer,
/// comma-separated, the caller last, each as [`chain_name`] (a digest,
/// so no actor's name reaches another host). A suspended actor that
/// receives a call whose chain names itself or the actor it waits on
/// refuses it with `await_deadlock` (a cycle of waits).
pub(crate) const CHAIN_HEADER: &str = "wasmkeep-await-chain";

/// An actor as a chain names it: 16 hex digits of the SHA-256 of its
/// address.
pub(crate) fn chain_name(id: &wasmkeep_store::ActorId) -> String {
    let h = sha2::Sha256::digest(id.to_string().as_bytes());
    hex::encode(&h[..8])
}

/// A digest of a call: what a later run's wait must ask again.
pub(crate) type CallDigest = [u8; 32];

/// The running event's waits (`None` in `HostState` when the running
/// handler may not wait).
#[derive(Default)]
pub(crate) struct EventAwaits {
    /// The answers of earlier runs, in order.
    pub journal: Vec<(CallDigest, Answer)>,
    /// The next wait's index.
    next: usize,
    /// The first wait past the journal: the call the event suspends on.
    pub pending: Option<Pending>,
    /// The actors waiting on this event (its request's chain header).
    pub chain: Vec<String>,
    /// A request's encoded input, kept when it suspends.
    pub input: Option<(&'static str, Vec<u8>)>,
    /// The alarm an `on-alarm` run is for.
    pub alarm: Option<wasmkeep_store::AlarmState>,
    /// A request run again after a wait: its parked reply's ticket.
    pub ticket: Option<u64>,
}

/// The call a suspending event waits on.
pub(crate) struct Pending {
    pub row: OutboxRow,
    pub within_ms: u64,
    pub digest: CallDigest,
    /// The actor a message goes to.
    pub target: Option<String>,
}

impl EventAwaits {
    /// A first run, waited on by `chain`.
    pub(crate) fn first(chain: Vec<String>) -> EventAwaits {
        EventAwaits {
            chain,
            ..Default::default()
        }
    }

    /// A run after `journal`'s answers.
    pub(crate) fn resumed(journal: Vec<(CallDigest, Answer)>, chain: Vec<String>) -> EventAwaits {
        EventAwaits {
            journal,
            chain,
            ..Default::default()
        }
    }
}

/// The actors a request says wait on it (its [`CHAIN_HEADER`]), at most
/// [`AWAIT_CHAIN_MAX`].
pub(crate) fn chain_of(headers: &[(String, String)]) -> Vec<String> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(CHAIN_HEADER))
        .map(|(_, v)| {
            // Only what `chain_name` makes: a client's header is no larger.
            v.split(',')
                .map(str::trim)
                .filter(|s| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .take(AWAIT_CHAIN_MAX + 1)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn digest_of(row: &OutboxRow) -> CallDigest {
    let mut h = sha2::Sha256::new();
    for part in [
        row.target.as_bytes(),
        row.method.as_bytes(),
        &row.body,
        &u64::from(row.timeout_ms).to_be_bytes(),
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.finalize().into()
}

fn to_wit(a: Answer) -> awaits::Answer {
    let err = |code: String, message: String| WitError { code, message };
    match a {
        Answer::Message(MessageAnswer::Reply(b)) => awaits::Answer::Reply(b),
        Answer::Message(MessageAnswer::Refused { code, message }) => {
            awaits::Answer::Refused(err(code, message))
        }
        Answer::Http {
            status,
            headers,
            body,
        } => awaits::Answer::Http(awaits::HttpAnswer {
            status,
            headers,
            body,
        }),
        Answer::Failed { code, message } => awaits::Answer::Failed(err(code, message)),
    }
}

/// The answer a wait gets when its deadline passed first.
pub(crate) fn timed_out() -> Answer {
    Answer::Failed {
        code: "await_timeout".into(),
        message: "no answer by the wait's deadline (the call itself may still be applied)".into(),
    }
}

/// What the client of a suspended request hears when its event, run
/// again, failed: the error with the edge's status and body
/// (`{"error":{code,message}}`). Never `retry-after`: at the edge a
/// retryable error means the event did not run, while this one's awaited
/// calls were made and answered, and a retry would make them again.
pub(crate) fn error_response(e: &crate::error::RuntimeError) -> ActorResponse {
    let body = serde_json_lite(&e.code(), &e.edge_message());
    ActorResponse {
        status: e.http_status(),
        headers: vec![("content-type".into(), "application/json".into())],
        body,
        socket: None,
    }
}

/// `{"error":{"code":…,"message":…}}` without a JSON library (the
/// runtime has none).
fn serde_json_lite(code: &str, message: &str) -> Vec<u8> {
    fn quoted(s: &str) -> String {
        let mut out = String::with_capacity(s.len() + 2);
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }
    format!(
        "{{\"error\":{{\"code\":{},\"message\":{}}}}}",
        quoted(code),
        quoted(message)
    )
    .into_bytes()
}

impl awaits::Host for HostState {
    fn wait(&mut self, call: awaits::Call, within_ms: u32) -> Result<awaits::Answer, WitError> {
        if self.awaits.is_none() {
            return Err(refusal(
                "await_not_allowed",
                "only on-request and on-alarm may wait for an answer; here, send with the outbox and hear back in on-response",
            ));
        }
        let within_ms = match u64::from(within_ms) {
            0 => AWAIT_WITHIN_MS_DEFAULT,
            ms if ms > AWAIT_WITHIN_MS_MAX => {
                return Err(refusal(
                    "invalid_argument",
                    format!("within_ms={ms} is above await_within_ms_max={AWAIT_WITHIN_MS_MAX}"),
                ));
            }
            ms => ms,
        };
        let (mut row, target) = self.awaited_row(call)?;
        let digest = digest_of(&row);
        let me = chain_name(&self.id);
        let aw = self.awaits.as_mut().expect("checked above");
        let index = aw.next;
        aw.next += 1;
        if let Some((recorded, answer)) = aw.journal.get(index) {
            if *recorded != digest {
                let e = refusal(
                    "await_nondeterministic",
                    format!(
                        "wait number {} asked for another call than when the event first ran: the code before a wait must do the same on every run (ADR 0056)",
                        index + 1
                    ),
                );
                self.poison = Some(e.clone());
                return Err(e);
            }
            // Kept: a later suspension records the journal again.
            return Ok(to_wit(answer.clone()));
        }
        if index >= AWAITS_PER_EVENT_MAX {
            let e = refusal(
                "too_many_awaits",
                format!(
                    "an event may wait {AWAITS_PER_EVENT_MAX} times at most (awaits_per_event_max)"
                ),
            );
            self.poison = Some(e.clone());
            return Err(e);
        }
        if aw.chain.len() >= AWAIT_CHAIN_MAX {
            return Err(refusal(
                "await_chain_too_long",
                format!(
                    "{} actors already wait on this one (await_chain_max={AWAIT_CHAIN_MAX})",
                    aw.chain.len()
                ),
            ));
        }
        if aw.pending.is_none() && self.lane_busy(&row)? {
            return Err(refusal(
                "await_lane_busy",
                "a message sent earlier to the same actor waits for its answer, which this actor takes only after the wait: wait when it is answered, or send this one with the outbox",
            ));
        }
        let aw = self.awaits.as_mut().expect("checked above");
        if aw.pending.is_none() {
            let mut chain = aw.chain.clone();
            chain.push(me);
            row.headers.push((CHAIN_HEADER.to_owned(), chain.join(",")));
            aw.pending = Some(Pending {
                row,
                within_ms,
                digest,
                target,
            });
        }
        Err(refusal(
            "suspended",
            "the event waits for this answer: return this error from the handler; the event runs again from its start once the answer is in",
        ))
    }
}

impl HostState {
    /// The outbox row of an awaited call, checked as `outbox` checks it,
    /// and the actor a message goes to (as a chain names it).
    fn awaited_row(&self, call: awaits::Call) -> Result<(OutboxRow, Option<String>), WitError> {
        Ok(match call {
            awaits::Call::Message((to, body)) => {
                if to.app == self.id.app && to.class == self.id.class && to.name == self.id.name {
                    return Err(refusal(
                        "await_deadlock",
                        "an actor cannot wait for its own answer: it runs nothing else while it waits",
                    ));
                }
                let target =
                    wasmkeep_store::ActorId::new(&self.id.tenant, &to.app, &to.class, &to.name)
                        .map(|t| chain_name(&t))
                        .ok();
                (self.message_row(to, body, AWAIT_CONTEXT.to_vec())?, target)
            }
            awaits::Call::Fetch(http) => (self.fetch_row(http, AWAIT_CONTEXT.to_vec())?, None),
        })
    }

    /// Whether `row` is a message to an actor this one has an earlier
    /// message to, not answered yet: the receiver takes one sender's
    /// messages in order, each once the sender applied the answer before,
    /// which the wait would hold back.
    fn lane_busy(&self, row: &OutboxRow) -> Result<bool, WitError> {
        if row.kind != wasmkeep_store::OutboxKind::Message {
            return Ok(false);
        }
        Ok(self
            .db
            .as_ref()
            .map(|db| db.outbox_has_message_to(&row.target))
            .transpose()
            .map_err(|e| refusal(e.code(), e.to_string()))?
            .unwrap_or(false))
    }
}

#[cfg(test)]
mod tests {
    use super::error_response;
    use crate::error::RuntimeError;

    /// A resumed request's client hears what the edge would answer: an
    /// overloaded actor 503 (without `retry-after`: its calls were made),
    /// an actor's own `not_found` 404 with the edge's message.
    #[test]
    fn a_resumed_request_fails_as_the_edge_would_answer() {
        let busy = error_response(&RuntimeError::ActorOverloaded {
            queued: 5,
            limit: 4,
        });
        assert_eq!(busy.status, 503);
        assert!(
            !busy.headers.iter().any(|(k, _)| k == "retry-after"),
            "{:?}",
            busy.headers
        );
        let gone = error_response(&RuntimeError::Guest {
            code: "not_found".into(),
            message: "no such room".into(),
        });
        assert_eq!(gone.status, 404);
        let body = String::from_utf8(gone.body).unwrap();
        assert!(body.contains("\"code\":\"not_found\""), "{body}");
        assert!(body.contains("the actor failed: no such room"), "{body}");
    }
}
