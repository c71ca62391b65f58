//! Parked replies (ADR 0042): a request's reply that its event left for a
//! later event of the same actor to complete.
//!
//! A request whose `on-request` called `replies.park` commits as usual,
//! but its reply, instead of leaving, waits here under its ticket until an
//! event of the same actor calls `replies.complete` and commits, or its
//! deadline passes (504 `reply_expired`). Nothing of it is in the actor's
//! database: a parked reply is a client waiting on this node's socket, and
//! it is gone with the process (the client's connection closes).
//!
//! Bounded per node (`parked_replies_max`) and per actor
//! (`parked_per_actor_max`); a park past either fails the guest's call
//! with `too_many_parked`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use wasmkeep_store::ActorId;

use crate::actor::{ActorResponse, Outcome, Reply};
use crate::error::RuntimeError;
use crate::host::HostState;
use crate::host::wasmkeep::actor::replies;
use crate::outbox::refusal;

/// The node's bounds on parked replies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedLimits {
    /// Longest a reply may stay parked (and the most `park` may ask).
    pub reply_ms_max: u64,
    /// Replies parked on the node at once.
    pub node_max: usize,
    /// Replies one actor has parked at once.
    pub per_actor_max: usize,
}

impl Default for ParkedLimits {
    fn default() -> Self {
        ParkedLimits {
            reply_ms_max: 300_000,
            node_max: 10_000,
            per_actor_max: 1_000,
        }
    }
}

struct Parked {
    actor: ActorId,
    reply: Reply,
    deadline: Instant,
    /// When the request was enqueued (its latency, when it leaves).
    started: Option<Instant>,
    /// It asked to be answered once the bucket holds what answers it.
    replicated: bool,
}

/// The node's parked replies.
pub struct ParkedReplies {
    limits: ParkedLimits,
    map: Mutex<HashMap<u64, Parked>>,
    /// Tickets start at a random number, so that one kept in an actor's
    /// database from before a restart does not name a new reply.
    next: AtomicU64,
}

/// What a request's event asked for its reply.
#[derive(Debug, Clone, Copy)]
pub struct Park {
    pub ticket: u64,
    pub timeout_ms: u64,
}

impl ParkedReplies {
    pub fn new(limits: ParkedLimits) -> ParkedReplies {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        ParkedReplies {
            limits,
            map: Mutex::new(HashMap::new()),
            next: AtomicU64::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
        }
    }

    pub fn limits(&self) -> &ParkedLimits {
        &self.limits
    }

    /// Replies parked now.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A ticket for a reply `actor` is about to park, if the bounds allow
    /// one more (`already` counts what its running batch parked so far).
    fn ticket(&self, actor: &ActorId, already: usize) -> Result<u64, String> {
        let map = self.map.lock();
        if map.len() + already >= self.limits.node_max {
            return Err(format!(
                "{} replies are parked on this node, limit parked_replies_max={}",
                map.len(),
                self.limits.node_max
            ));
        }
        let mine = map.values().filter(|p| p.actor == *actor).count() + already;
        if mine >= self.limits.per_actor_max {
            return Err(format!(
                "{mine} replies of this actor are parked, limit parked_per_actor_max={}",
                self.limits.per_actor_max
            ));
        }
        Ok(self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// Whether `ticket` is one of `actor`'s parked replies.
    fn holds(&self, actor: &ActorId, ticket: u64) -> bool {
        self.map
            .lock()
            .get(&ticket)
            .is_some_and(|p| p.actor == *actor)
    }

    /// Parks `reply` (its event committed and is durable) until completed
    /// or `park.timeout_ms` passes.
    pub(crate) fn park(
        self: &Arc<Self>,
        actor: &ActorId,
        park: Park,
        reply: Reply,
        started: Option<Instant>,
        replicated: bool,
        handle: &tokio::runtime::Handle,
    ) {
        let timeout = Duration::from_millis(park.timeout_ms.min(self.limits.reply_ms_max));
        self.map.lock().insert(
            park.ticket,
            Parked {
                actor: actor.clone(),
                reply,
                deadline: Instant::now() + timeout,
                started,
                replicated,
            },
        );
        let me = Arc::downgrade(self);
        let ticket = park.ticket;
        handle.spawn(async move {
            tokio::time::sleep(timeout).await;
            if let Some(me) = me.upgrade() {
                me.expire(ticket);
            }
        });
    }

    fn expire(&self, ticket: u64) {
        let gone = {
            let mut map = self.map.lock();
            match map.get(&ticket) {
                Some(p) if p.deadline <= Instant::now() => map.remove(&ticket),
                _ => None,
            }
        };
        if let Some(p) = gone {
            let _ = p.reply.send(Err(RuntimeError::ReplyExpired));
        }
    }

    /// Sends a completed reply (its event committed and is durable; a
    /// `replicated` request's once the bucket holds that event too).
    pub(crate) fn complete(
        &self,
        metrics: &crate::metrics::Metrics,
        actor: &Arc<crate::actor::Actor>,
        ticket: u64,
        resp: ActorResponse,
        mark: Option<crate::replication::Mark>,
    ) {
        let p = {
            let mut map = self.map.lock();
            match map.get(&ticket) {
                Some(p) if p.actor == actor.id => map.remove(&ticket),
                _ => None,
            }
        };
        // Expired meanwhile: its client heard `reply_expired` already.
        let Some(p) = p else { return };
        let out = Ok(Outcome::Response(resp));
        match mark {
            Some(mark) if p.replicated => crate::replication::hold_until_uploaded(
                metrics, actor, mark, p.reply, out, p.started,
            ),
            _ => {
                if let Some(t) = p.started {
                    metrics
                        .event_latency
                        .observe_ms(t.elapsed().as_secs_f64() * 1000.0);
                }
                let _ = p.reply.send(out);
            }
        }
    }

    /// Drops every parked reply of `actor` (deleted): its clients hear
    /// `reply_expired` at once.
    pub fn drop_actor(&self, actor: &ActorId) {
        let gone: Vec<Parked> = {
            let mut map = self.map.lock();
            let tickets: Vec<u64> = map
                .iter()
                .filter(|(_, p)| p.actor == *actor)
                .map(|(t, _)| *t)
                .collect();
            tickets.iter().filter_map(|t| map.remove(t)).collect()
        };
        for p in gone {
            let _ = p.reply.send(Err(RuntimeError::ReplyExpired));
        }
    }
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
            },
        ));
        Ok(())
    }
}
