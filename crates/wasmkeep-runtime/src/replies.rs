//! The guest's `replies` interface (ADR 0042): `replies.park` takes a
//! ticket for the running request's reply, `replies.complete` answers a
//! reply the actor parked earlier. Both only record what the event asked
//! ([`ReplyOps`]); the turn applies it to the node's table
//! (`crate::parked`) after the batch commits. The table is seen here only
//! through [`Tickets`], so the guest's side needs nothing of actors' turns.

use wasmkeep_store::ActorId;

use crate::config::ParkedLimits;
use crate::host::HostState;
use crate::host::wasmkeep::actor::replies;
use crate::outbox::refusal;
use crate::response::ActorResponse;

/// What the guest's calls ask of the node's table of parked replies.
pub trait Tickets: Send + Sync {
    /// The bounds the table keeps.
    fn limits(&self) -> &ParkedLimits;

    /// A ticket for a reply `actor` is about to park, if the bounds allow
    /// one more (`already` counts what its running batch parked so far);
    /// the error names the bound.
    fn ticket(&self, actor: &ActorId, already: usize) -> Result<u64, String>;

    /// Whether `ticket` is one of `actor`'s parked replies, not completed.
    fn holds(&self, actor: &ActorId, ticket: u64) -> bool;
}

/// A number to start a node's ids at, different at every start (the
/// clock's nanoseconds, spread), so that an id kept from before a restart
/// names nothing new. Below 2^52, so that counting up from it stays
/// below 2^53 for ages: a guest in JavaScript holds an id (a `u64`) as a
/// number, exact only that far (ADR 0048).
pub(crate) fn random_start() -> u64 {
    let seed = (crate::clock::wall_nanos() as u64).max(1);
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 12
}

/// What a request's event asked for its reply.
#[derive(Debug, Clone, Copy)]
pub struct Park {
    pub ticket: u64,
    pub timeout_ms: u64,
}

/// What the running event asked about parked replies, applied after its
/// batch commits.
#[derive(Default)]
pub struct ReplyOps {
    /// The running request parks its reply.
    pub park: Option<Park>,
    /// Replies completed by the running event.
    pub completions: Vec<(u64, ActorResponse)>,
    /// Replies parked by earlier events of the running batch (not in the
    /// table yet).
    pub parked_in_batch: Vec<u64>,
}

impl replies::Host for HostState {
    fn park(&mut self, timeout_ms: u32) -> Result<u64, crate::host::WitError> {
        if !self.response.is_open() {
            return Err(refusal(
                "no_request",
                "replies.park is only for the request being handled",
            ));
        }
        let Some(table) = self.parked.clone() else {
            return Err(refusal("no_request", "no parked replies here"));
        };
        if timeout_ms == 0 || u64::from(timeout_ms) > table.limits().reply_ms_max {
            return Err(refusal(
                "invalid_argument",
                format!(
                    "timeout_ms={timeout_ms} must be 1 to parked_reply_ms_max={}",
                    table.limits().reply_ms_max
                ),
            ));
        }
        if let Some(p) = self.replies.park {
            return Ok(p.ticket);
        }
        if let Some(ticket) = self.awaits.as_ref().and_then(|a| a.ticket) {
            // A request run again after a wait: its reply is parked
            // already, under this ticket; the handler that parks it
            // completes it later, as it would have.
            self.replies.park = Some(Park {
                ticket,
                timeout_ms: u64::from(timeout_ms),
            });
            return Ok(ticket);
        }
        let already = self.replies.parked_in_batch.len();
        let ticket = table
            .ticket(&self.id, already)
            .map_err(|m| refusal("too_many_parked", m))?;
        self.replies.park = Some(Park {
            ticket,
            timeout_ms: u64::from(timeout_ms),
        });
        Ok(ticket)
    }

    fn complete(
        &mut self,
        ticket: u64,
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    ) -> Result<(), crate::host::WitError> {
        let Some(table) = self.parked.clone() else {
            return Err(refusal("reply_not_found", "no parked replies here"));
        };
        let mine = table.holds(&self.id, ticket)
            || self.replies.parked_in_batch.contains(&ticket)
            || self.replies.park.is_some_and(|p| p.ticket == ticket);
        if !mine || self.replies.completions.iter().any(|(t, _)| *t == ticket) {
            return Err(refusal(
                "reply_not_found",
                format!(
                    "ticket {ticket} is not a reply this actor has parked (expired, completed, or from before a restart)"
                ),
            ));
        }
        if !(200..=599).contains(&status) {
            return Err(refusal(
                "invalid_argument",
                format!("status {status} is not 200 to 599"),
            ));
        }
        let limit = self.response_body_bytes_max;
        if body.len() > limit {
            return Err(refusal(
                "response_too_large",
                format!(
                    "body size={} limit response_body_bytes_max={limit}",
                    body.len()
                ),
            ));
        }
        crate::response::check_headers(&headers)?;
        self.replies.completions.push((
            ticket,
            ActorResponse {
                status,
                headers,
                body,
                socket: None,
            },
        ));
        Ok(())
    }
}
