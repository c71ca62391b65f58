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
//! This module is the node's table of them, in the actors' layer: it
//! hands a reply over once the completing event is durable (and, for a
//! `replicated` request, in the bucket). What a guest calls (`replies.park`,
//! `replies.complete`) is `crate::replies`, which sees the table only as
//! [`Tickets`].
//!
//! Bounded per node (`parked_replies_max`), per tenant
//! (`parked_per_tenant_max`) and per actor (`parked_per_actor_max`); a park
//! past any fails the guest's call with `too_many_parked`. The bounds are
//! checked when the ticket is taken, so actors of one tenant parking in
//! batches at the same moment may pass the tenant's bound by a few.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use wasmkeep_store::ActorId;

use crate::actor::{ActorResponse, Outcome, Reply};
use crate::config::ParkedLimits;
use crate::error::RuntimeError;
use crate::replies::{Park, Tickets, random_start};

/// A completion that arrived before its reply was attached.
type Early = (ActorResponse, Option<crate::replication::Mark>);

struct Parked {
    actor: ActorId,
    /// `None` between the commit that parked it and the release of that
    /// commit's replies (its durability): the ticket can be completed
    /// meanwhile, and the completion waits here for the reply.
    reply: Option<Reply>,
    deadline: Instant,
    /// The deadline by the node's [`Clock`](crate::clock::Clock): on a
    /// manual clock (the test kit) the reply expires when the clock is
    /// moved past it ([`ParkedReplies::expire_due`]), on the real one at
    /// `deadline` as well, whichever comes first.
    due_ms: u64,
    /// When the request was enqueued (its latency, when it leaves).
    started: Option<Instant>,
    /// It asked to be answered once the bucket holds what answers it.
    replicated: bool,
    early: Option<Early>,
    /// The deadline's timer, stopped when the reply leaves otherwise.
    timer: Option<tokio::task::AbortHandle>,
}

/// The node's parked replies.
pub struct ParkedReplies {
    limits: ParkedLimits,
    map: Mutex<Table>,
    /// Tickets start at a random number, so that one kept in an actor's
    /// database from before a restart does not name a new reply.
    next: AtomicU64,
}

#[derive(Default)]
struct Table {
    parked: HashMap<u64, Parked>,
    per_actor: HashMap<ActorId, usize>,
    per_tenant: HashMap<String, usize>,
    /// `wasmkeep_parked_replies` (a clone shares the node's series).
    gauge: crate::metrics::GaugeU64,
}

impl Table {
    fn remove(&mut self, ticket: u64) -> Option<Parked> {
        let p = self.parked.remove(&ticket)?;
        self.gauge.dec();
        if let Some(n) = self.per_actor.get_mut(&p.actor) {
            *n -= 1;
            if *n == 0 {
                self.per_actor.remove(&p.actor);
            }
        }
        if let Some(n) = self.per_tenant.get_mut(&p.actor.tenant) {
            *n -= 1;
            if *n == 0 {
                self.per_tenant.remove(&p.actor.tenant);
            }
        }
        if let Some(t) = &p.timer {
            t.abort();
        }
        Some(p)
    }
}

impl ParkedReplies {
    pub fn new(limits: ParkedLimits, metrics: Arc<crate::metrics::Metrics>) -> ParkedReplies {
        ParkedReplies {
            limits,
            map: Mutex::new(Table {
                gauge: metrics.parked_replies.clone(),
                ..Table::default()
            }),
            next: AtomicU64::new(random_start() | 1),
        }
    }

    /// Tickets from 1 up instead of a random start: a replay's two
    /// sandboxes (ADR 0062) give the same events the same tickets.
    pub(crate) fn numbered_from_one(self) -> ParkedReplies {
        self.next.store(1, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// Replies parked now.
    pub fn len(&self) -> usize {
        self.map.lock().parked.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Registers a reply its event parked, as soon as that event's batch
    /// committed (before it is durable): later events can complete it at
    /// once. Its deadline starts now.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        actor: &ActorId,
        park: Park,
        replicated: bool,
        now_ms: u64,
        handle: &tokio::runtime::Handle,
    ) {
        let timeout_ms = park.timeout_ms.min(self.limits.reply_ms_max);
        let timeout = Duration::from_millis(timeout_ms);
        let ticket = park.ticket;
        // The deadline first, the entry next, the timer last and for that
        // very deadline: a timer that fired before the entry was in, or a
        // moment before its deadline, would leave it parked for ever (and
        // its places taken).
        let deadline = crate::clock::instant() + timeout;
        {
            let mut map = self.map.lock();
            *map.per_actor.entry(actor.clone()).or_default() += 1;
            *map.per_tenant.entry(actor.tenant.clone()).or_default() += 1;
            map.gauge.inc();
            map.parked.insert(
                ticket,
                Parked {
                    actor: actor.clone(),
                    reply: None,
                    deadline,
                    due_ms: now_ms.saturating_add(timeout_ms),
                    started: None,
                    replicated,
                    early: None,
                    timer: None,
                },
            );
        }
        let me = Arc::downgrade(self);
        let timer = handle.spawn(async move {
            tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)).await;
            if let Some(me) = me.upgrade() {
                me.expire(ticket);
            }
        });
        match self.map.lock().parked.get_mut(&ticket) {
            Some(p) => p.timer = Some(timer.abort_handle()),
            // Completed or taken back meanwhile: no timer is needed.
            None => timer.abort(),
        }
    }

    /// Hands over the reply of a reserved ticket once its commit is
    /// durable: it waits for its completion, or leaves now if that came
    /// first; a ticket that expired or whose actor was deleted meanwhile
    /// answers `reply_expired` at once.
    pub(crate) fn attach(
        &self,
        metrics: &crate::metrics::Metrics,
        actor: &Arc<crate::actor::Actor>,
        ticket: u64,
        reply: Reply,
        started: Option<Instant>,
    ) {
        let ready = {
            let mut map = self.map.lock();
            match map.parked.get_mut(&ticket) {
                Some(p) if p.early.is_some() => {
                    let early = p.early.take();
                    let p = map.remove(ticket).expect("present");
                    Some((p, early))
                }
                Some(p) => {
                    p.reply = Some(reply);
                    p.started = started;
                    return;
                }
                None => {
                    drop(map);
                    let _ = reply.send(Err(RuntimeError::ReplyExpired));
                    return;
                }
            }
        };
        if let Some((p, Some((resp, mark)))) = ready {
            send(metrics, actor, reply, started, p.replicated, resp, mark);
        }
    }

    /// Takes back a reserved ticket whose commit did not become durable:
    /// its request is answered with the error instead.
    pub(crate) fn cancel(&self, ticket: u64) {
        self.map.lock().remove(ticket);
    }

    /// Expires every reply whose deadline by the node's clock is `now_ms`
    /// or earlier (the test kit calls it as it moves its clock); returns
    /// how many.
    pub(crate) fn expire_due(&self, now_ms: u64) -> usize {
        let gone: Vec<Parked> = {
            let mut map = self.map.lock();
            let due: Vec<u64> = map
                .parked
                .iter()
                .filter(|(_, p)| p.due_ms <= now_ms)
                .map(|(t, _)| *t)
                .collect();
            due.into_iter().filter_map(|t| map.remove(t)).collect()
        };
        let n = gone.len();
        for p in gone {
            if let Some(r) = p.reply {
                let _ = r.send(Err(RuntimeError::ReplyExpired));
            }
        }
        n
    }

    fn expire(&self, ticket: u64) {
        let gone = {
            let mut map = self.map.lock();
            match map.parked.get(&ticket) {
                Some(p) if p.deadline <= crate::clock::instant() => map.remove(ticket),
                _ => None,
            }
        };
        if let Some(Parked { reply: Some(r), .. }) = gone {
            let _ = r.send(Err(RuntimeError::ReplyExpired));
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
            match map.parked.get_mut(&ticket) {
                Some(p) if p.actor == actor.id && p.reply.is_none() => {
                    // Completed before its own commit was durable: the
                    // reply leaves when it is attached.
                    p.early = Some((resp, mark));
                    return;
                }
                Some(p) if p.actor == actor.id => map.remove(ticket),
                _ => None,
            }
        };
        // Expired meanwhile: its client heard `reply_expired` already.
        let Some(Parked {
            reply: Some(reply),
            started,
            replicated,
            ..
        }) = p
        else {
            return;
        };
        send(metrics, actor, reply, started, replicated, resp, mark);
    }

    /// Drops every parked reply of `actor` (deleted): its clients hear
    /// `reply_expired` at once.
    pub fn drop_actor(&self, actor: &ActorId) {
        let gone: Vec<Parked> = {
            let mut map = self.map.lock();
            let tickets: Vec<u64> = map
                .parked
                .iter()
                .filter(|(_, p)| p.actor == *actor)
                .map(|(t, _)| *t)
                .collect();
            tickets.into_iter().filter_map(|t| map.remove(t)).collect()
        };
        for p in gone {
            if let Some(r) = p.reply {
                let _ = r.send(Err(RuntimeError::ReplyExpired));
            }
        }
    }
}

fn send(
    metrics: &crate::metrics::Metrics,
    actor: &Arc<crate::actor::Actor>,
    reply: Reply,
    started: Option<Instant>,
    replicated: bool,
    resp: ActorResponse,
    mark: Option<crate::replication::Mark>,
) {
    let out = Ok(Outcome::Response(resp));
    match mark {
        Some(mark) if replicated => crate::replication::hold_until_uploaded(
            metrics,
            actor,
            mark,
            reply,
            out,
            (started, None),
        ),
        _ => {
            if let Some(t) = started {
                metrics
                    .event_latency
                    .observe_ms(t.elapsed().as_secs_f64() * 1000.0);
            }
            let _ = reply.send(out);
        }
    }
}

impl Tickets for ParkedReplies {
    fn limits(&self) -> &ParkedLimits {
        &self.limits
    }

    /// A ticket for a reply `actor` is about to park, if the bounds allow
    /// one more (`already` counts what its running batch parked so far).
    fn ticket(&self, actor: &ActorId, already: usize) -> Result<u64, String> {
        let map = self.map.lock();
        if map.parked.len() + already >= self.limits.node_max {
            return Err(format!(
                "{} replies are parked on this node, limit parked_replies_max={}",
                map.parked.len(),
                self.limits.node_max
            ));
        }
        let mine = map.per_actor.get(actor).copied().unwrap_or(0) + already;
        if mine >= self.limits.per_actor_max {
            return Err(format!(
                "{mine} replies of this actor are parked, limit parked_per_actor_max={}",
                self.limits.per_actor_max
            ));
        }
        let tenants = map.per_tenant.get(&actor.tenant).copied().unwrap_or(0) + already;
        if tenants >= self.limits.per_tenant_max {
            return Err(format!(
                "{tenants} replies of tenant `{}` are parked on this node, limit parked_per_tenant_max={}",
                actor.tenant, self.limits.per_tenant_max
            ));
        }
        Ok(self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// Whether `ticket` is one of `actor`'s parked replies, not completed.
    fn holds(&self, actor: &ActorId, ticket: u64) -> bool {
        self.map
            .lock()
            .parked
            .get(&ticket)
            .is_some_and(|p| p.actor == *actor && p.early.is_none())
    }
}
