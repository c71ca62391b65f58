//! The node's dispatcher: delivers committed outbox rows off the workers.
//!
//! Rows come from an actor's own turn ([`Dispatcher::offer`]), read from
//! its database, in sequence order: after a batch that sent, once the
//! commit is durable (and, with a bucket, in the bucket), and when the
//! actor opens (rows an earlier run of the node, or another node, left).
//! The dispatcher never keeps a copy of a row for later: whatever waits
//! (for the bucket, for room) is read again from the database when its
//! time comes, so a row answered meanwhile is not sent again.
//!
//! Messages from one sender's life to one receiver go one at a time, in
//! order (a *lane*), which is what lets the receiver keep only the last
//! one it applied. HTTP calls have no order. Every delivery takes a permit
//! of its actor (`outbox_per_actor_max`; for HTTP the app's
//! `per_actor_max` and `per_app_max`), then one of its tenant
//! (`tenant_share_pct` of the node's) and then one of the node
//! (`outbox_in_flight_max`), so one busy actor, or tenant, cannot hold the
//! node's.
//!
//! A delivery that fails in a way worth retrying waits (doubling from
//! `outbox_retry_first_ms` up to `outbox_retry_max_ms`) without its
//! permits, up to `outbox_attempts_max` attempts; then the sender hears
//! `failed`. The answer goes back to the sender as a `Response` event; if
//! the sender's `on-response` keeps failing, the row is dropped after
//! `outbox_response_attempts_max` offers (logged, counted).
//!
//! Rows held here count their bodies, contexts, answers and a fixed
//! overhead against `outbox_node_bytes_max`; an actor whose rows do not fit
//! is set aside whole (none of its later rows go first), and its rows are
//! read again from its database (an `OutboxResume` event) when there is
//! room.

mod http;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmkeep_store::{ActorId, OutboxKind, OutboxRow};

use crate::error::RuntimeError;
use crate::faults::Faults;
use crate::node::Inner;
use crate::outbox::{
    Answer, Inbound, MessageAnswer, OutboundPolicy, OutboxLimits, Router, decode_target,
};
use http::Attempt;

/// What a row costs in memory besides its bytes (the row, its lane and
/// task), so that many tiny rows are bounded too.
const ROW_OVERHEAD_BYTES: u64 = 512;

/// A lane's key: one sender's life's messages to one receiver.
type Lane = (ActorId, u64, String);

struct ActorOut {
    /// The sender's outbox life these rows belong to; rows of another
    /// life replace the entry (the actor was deleted and began again).
    life: u64,
    /// Rows taken and not yet finished.
    known: BTreeSet<u64>,
    /// Lanes with a task working through them.
    running: HashSet<String>,
    per_actor: Arc<Semaphore>,
    http_per_actor: Arc<Semaphore>,
}

#[derive(Default)]
struct State {
    actors: HashMap<ActorId, ActorOut>,
    lanes: HashMap<Lane, VecDeque<OutboxRow>>,
    /// Rows, answers and overhead held.
    bytes: u64,
    /// Actors whose rows did not fit; read again when there is room.
    deferred: BTreeSet<ActorId>,
    apps: HashMap<(String, String), Arc<Semaphore>>,
    /// Each tenant's deliveries at once (its share of `in_flight_max`).
    tenants: HashMap<String, Arc<Semaphore>>,
    /// Rows' bytes held per tenant (its share of `node_bytes_max`).
    tenant_bytes: HashMap<String, u64>,
}

fn row_bytes(r: &OutboxRow) -> u64 {
    (r.body.len() + r.context.len() + r.target.len()) as u64 + ROW_OVERHEAD_BYTES
}

struct Shared {
    rt: OnceLock<Weak<Inner>>,
    router: OnceLock<Arc<dyn Router>>,
    limits: OutboxLimits,
    client: OnceLock<reqwest::Client>,
    private_allowed: bool,
    state: Mutex<State>,
    in_flight: Arc<Semaphore>,
    /// A tenant's share of `in_flight_max` and `node_bytes_max`, in
    /// percent (`tenant_share_pct`).
    tenant_share_pct: u8,
    handle: tokio::runtime::Handle,
    /// Batches waiting for the bucket before their rows are read.
    waiting: AtomicU64,
    metrics: Arc<crate::metrics::Metrics>,
}

/// The node's outbox dispatcher (see the module's documentation).
pub struct Dispatcher {
    shared: Arc<Shared>,
    io: Mutex<Option<tokio::runtime::Runtime>>,
}

/// How an offer went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    /// The rows are the dispatcher's now.
    Taken,
    /// They stay in the database until the dispatcher has room (the actor
    /// gets an `OutboxResume` event then).
    Deferred,
}

impl Dispatcher {
    pub fn new(
        limits: OutboxLimits,
        private_allowed: bool,
        tenant_share_pct: u8,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Dispatcher {
        let io = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("wasmkeep-outbox")
            .enable_all()
            .build()
            .expect("the outbox's tokio runtime");
        let shared = Arc::new(Shared {
            rt: OnceLock::new(),
            router: OnceLock::new(),
            in_flight: Arc::new(Semaphore::new(limits.in_flight_max.max(1))),
            tenant_share_pct,
            limits,
            client: OnceLock::new(),
            private_allowed,
            state: Mutex::new(State::default()),
            handle: io.handle().clone(),
            waiting: AtomicU64::new(0),
            metrics,
        });
        Dispatcher {
            shared,
            io: Mutex::new(Some(io)),
        }
    }

    /// The dispatcher's tokio runtime (timers of parked replies run there).
    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        &self.shared.handle
    }

    pub(crate) fn attach(&self, rt: Weak<Inner>) {
        let _ = self.shared.rt.set(rt);
    }

    /// Sends messages to actors through `router` (a cluster node); once.
    pub fn set_router(&self, router: Arc<dyn Router>) -> bool {
        self.shared.router.set(router).is_ok()
    }

    /// Rows taken and not yet finished, actors set aside, and batches
    /// waiting for the bucket, on this node.
    pub fn pending(&self) -> usize {
        let st = self.shared.state.lock();
        st.actors.values().map(|a| a.known.len()).sum::<usize>()
            + st.deferred.len()
            + self.shared.waiting.load(Ordering::Relaxed) as usize
    }

    /// Bytes held (rows, answers, overhead).
    pub fn bytes(&self) -> u64 {
        self.shared.state.lock().bytes
    }

    /// Answers delivered to senders, deliveries that failed for good, and
    /// answers dropped after their sender's `on-response` kept failing.
    pub fn counts(&self) -> (u64, u64, u64) {
        let m = &self.shared.metrics;
        (
            m.outbox_answers_total.get(),
            m.outbox_failed_total.get(),
            m.outbox_answers_dropped_total.get(),
        )
    }

    /// Forgets an actor that was deleted: what is in flight for it stops
    /// at its next step and answers nobody.
    pub fn forget(&self, id: &ActorId) {
        let mut st = self.shared.state.lock();
        st.actors.remove(id);
        st.deferred.remove(id);
    }

    /// Takes rows of `from` (read from its database, in sequence order)
    /// for delivery; rows already taken are skipped. `policy` is the
    /// sender's app's.
    pub fn offer(
        &self,
        from: &ActorId,
        life: u64,
        rows: Vec<OutboxRow>,
        policy: Arc<OutboundPolicy>,
    ) -> Offered {
        let sh = &self.shared;
        let mut guard = sh.state.lock();
        let st = &mut *guard;
        if st.deferred.contains(from) {
            return Offered::Deferred;
        }
        if st.actors.get(from).is_some_and(|a| a.life != life) {
            // A new life of a deleted actor: the old one's tasks stop.
            st.actors.remove(from);
        }
        let fresh: Vec<OutboxRow> = match st.actors.get(from) {
            Some(a) => rows
                .into_iter()
                .filter(|r| !a.known.contains(&r.seq))
                .collect(),
            None => rows,
        };
        if fresh.is_empty() {
            return Offered::Taken;
        }
        let bytes: u64 = fresh.iter().map(row_bytes).sum();
        let tenant_held = st.tenant_bytes.get(&from.tenant).copied().unwrap_or(0);
        let tenant_max = sh.share(sh.limits.node_bytes_max);
        if (st.bytes + bytes > sh.limits.node_bytes_max && st.bytes > 0)
            || (tenant_held + bytes > tenant_max && tenant_held > 0)
        {
            tracing::debug!(actor = %from, "outbox rows wait in the database: outbox_node_bytes_max (or the tenant's share)");
            st.deferred.insert(from.clone());
            return Offered::Deferred;
        }
        st.bytes += bytes;
        *st.tenant_bytes.entry(from.tenant.clone()).or_insert(0) += bytes;
        sh.metrics.outbox_taken_total.inc_by(fresh.len() as u64);
        sh.metrics.outbox_pending.inc_by(fresh.len() as u64);
        let limits = &sh.limits;
        let a = st.actors.entry(from.clone()).or_insert_with(|| ActorOut {
            life,
            known: BTreeSet::new(),
            running: HashSet::new(),
            per_actor: Arc::new(Semaphore::new(limits.per_actor_max.max(1))),
            http_per_actor: Arc::new(Semaphore::new(policy.per_actor_max.max(1))),
        });
        let mut start_lanes = Vec::new();
        let mut calls = Vec::new();
        for row in fresh {
            a.known.insert(row.seq);
            match row.kind {
                OutboxKind::Message => {
                    let lane = (from.clone(), life, row.target.clone());
                    if a.running.insert(row.target.clone()) {
                        start_lanes.push(lane.clone());
                    }
                    st.lanes.entry(lane).or_default().push_back(row);
                }
                OutboxKind::Http => calls.push(row),
            }
        }
        let app_sem = Arc::clone(
            st.apps
                .entry((from.tenant.clone(), from.app.clone()))
                .or_insert_with(|| Arc::new(Semaphore::new(policy.per_app_max.max(1)))),
        );
        let share = sh.share(limits.in_flight_max as u64).max(1) as usize;
        st.tenants
            .entry(from.tenant.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(share)));
        drop(guard);
        for lane in start_lanes {
            let sh = Arc::clone(sh);
            sh.handle.clone().spawn(run_lane(sh, lane));
        }
        for row in calls {
            let sh = Arc::clone(sh);
            let policy = Arc::clone(&policy);
            let app_sem = Arc::clone(&app_sem);
            let from = from.clone();
            sh.handle
                .clone()
                .spawn(async move { run_call(sh, from, life, row, policy, app_sem).await });
        }
        Offered::Taken
    }

    /// Runs `then` once `ready` says a batch's commit is in the bucket (it
    /// reads the batch's rows again from the database, in the actor's
    /// turn); not at all if the actor was given up before an upload
    /// carried the batch (the bucket's state, which it serves from now on,
    /// lacks them), or deleted or restored before the batch's sync ended
    /// (see `when_uploaded` in `actor/request.rs`).
    pub(crate) fn when_uploaded(
        &self,
        ready: tokio::sync::oneshot::Receiver<Result<crate::actor::Outcome, RuntimeError>>,
        then: impl FnOnce(&Arc<Inner>) + Send + 'static,
    ) {
        let sh = Arc::clone(&self.shared);
        sh.waiting.fetch_add(1, Ordering::Relaxed);
        let weak = sh.rt.get().cloned();
        self.shared.handle.spawn(async move {
            let ok = matches!(ready.await, Ok(Ok(_)));
            if ok && let Some(rt) = weak.as_ref().and_then(Weak::upgrade) {
                then(&rt);
                // Dropped on a thread of its own if it was the last one:
                // never inside this runtime (see `Drop for Dispatcher`).
                drop_elsewhere(rt);
            }
            sh.waiting.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// Stops delivering: tasks in flight are dropped (their rows stay in
    /// their databases and are delivered after the next start).
    pub fn shutdown(&self) {
        if let Some(io) = self.io.lock().take() {
            io.shutdown_background();
        }
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        // The node may go away while one of the runtime's own tasks holds
        // it last; a tokio runtime cannot be dropped inside itself.
        if let Some(io) = self.io.lock().take() {
            let _ = std::thread::Builder::new()
                .name("wasmkeep-outbox-stop".into())
                .spawn(move || io.shutdown_background());
        }
    }
}

/// Drops a strong reference to the node off the current thread when it
/// may be the last one.
pub(crate) fn drop_elsewhere(rt: Arc<Inner>) {
    if Arc::strong_count(&rt) <= 1 {
        let _ = std::thread::Builder::new()
            .name("wasmkeep-outbox-drop".into())
            .spawn(move || drop(rt));
    }
}

impl Shared {
    fn runtime(&self) -> Option<Arc<Inner>> {
        self.rt.get().and_then(Weak::upgrade)
    }

    fn client(&self) -> &reqwest::Client {
        self.client
            .get_or_init(|| http::client(self.private_allowed))
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let first = self.limits.retry_first_ms.max(1);
        let ms = wasmkeep_cluster::retry::RetryPolicy {
            first_ms: first,
            max_ms: self.limits.retry_max_ms.max(first),
            retries_max: None,
        }
        .delay_ms(attempt);
        // Up to a fifth less, so that many retries do not move in step.
        let nanos = (crate::clock::wall_nanos() % 1_000_000_000) as u64;
        Duration::from_millis(ms - (ms / 5) * (nanos % 1000) / 1000)
    }

    /// `text` without the sender's app's secret values (an error of a call
    /// may quote its URL, which a guest may have built with one).
    fn scrub(&self, from: &ActorId, text: &str) -> String {
        match self.runtime() {
            Some(rt) => {
                let out = rt.secrets.scrub(&from.tenant, &from.app, text);
                drop_elsewhere(rt);
                out
            }
            None => text.to_owned(),
        }
    }

    /// Whether a test fault is set (false once the node is gone).
    fn fault(&self, f: impl Fn(&Faults) -> bool) -> bool {
        if !Faults::COMPILED_IN {
            return false;
        }
        match self.runtime() {
            Some(rt) => {
                let set = f(&rt.faults);
                drop_elsewhere(rt);
                set
            }
            None => false,
        }
    }

    /// A test holds deliveries (`Faults::outbox_held`).
    async fn wait_while_held(&self) {
        while self.fault(|f| f.outbox_held()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// `tenant_share_pct` of `n`.
    fn share(&self, n: u64) -> u64 {
        crate::pools::share_of(n, self.tenant_share_pct)
    }

    /// The actor's permit (and the app's, for HTTP), then its tenant's,
    /// then the node's: no tenant holds more than its share of the node's
    /// deliveries (issue 33).
    async fn permits(
        &self,
        actor: &ActorId,
        life: u64,
        app: Option<&Arc<Semaphore>>,
    ) -> Option<Vec<OwnedSemaphorePermit>> {
        let (own, tenant) = {
            let st = self.state.lock();
            let a = st.actors.get(actor).filter(|a| a.life == life)?;
            let own = if app.is_some() {
                Arc::clone(&a.http_per_actor)
            } else {
                Arc::clone(&a.per_actor)
            };
            (own, st.tenants.get(&actor.tenant).cloned()?)
        };
        let mut held = vec![own.acquire_owned().await.ok()?];
        if let Some(app) = app {
            held.push(Arc::clone(app).acquire_owned().await.ok()?);
        }
        held.push(tenant.acquire_owned().await.ok()?);
        held.push(Arc::clone(&self.in_flight).acquire_owned().await.ok()?);
        Some(held)
    }

    /// Whether `seq` of `actor`'s `life` is still wanted (not forgotten by
    /// a delete, not of a life that ended).
    fn still_known(&self, actor: &ActorId, life: u64, seq: u64) -> bool {
        self.state
            .lock()
            .actors
            .get(actor)
            .is_some_and(|a| a.life == life && a.known.contains(&seq))
    }

    fn hold_bytes(&self, n: u64) {
        self.state.lock().bytes += n;
    }

    /// `seq` is done (answered, dropped, or forgotten): its bytes (and
    /// `extra`, an answer's) are given back, and actors set aside are read
    /// again when there is room. Called on every way out of a delivery.
    fn finish(&self, actor: &ActorId, life: u64, row: &OutboxRow, extra: u64) {
        let resume: Vec<ActorId> = {
            let mut st = self.state.lock();
            st.bytes = st.bytes.saturating_sub(row_bytes(row) + extra);
            if let Some(t) = st.tenant_bytes.get_mut(&actor.tenant) {
                *t = t.saturating_sub(row_bytes(row));
                if *t == 0 {
                    st.tenant_bytes.remove(&actor.tenant);
                }
            }
            if let Some(a) = st.actors.get_mut(actor)
                && a.life == life
                && a.known.remove(&row.seq)
                && a.known.is_empty()
                && a.running.is_empty()
            {
                st.actors.remove(actor);
            }
            // Every row taken ends here once, whatever became of it.
            self.metrics.outbox_pending.dec();
            if st.deferred.is_empty() || st.bytes > self.limits.node_bytes_max / 2 {
                Vec::new()
            } else {
                std::mem::take(&mut st.deferred).into_iter().collect()
            }
        };
        if !resume.is_empty()
            && let Some(rt) = self.runtime()
        {
            for id in resume {
                rt.resume_outbox(&id);
            }
            drop_elsewhere(rt);
        }
    }

    /// Delivers an inbound event to `to`: through the router when there is
    /// one, otherwise on this node.
    async fn deliver(
        &self,
        to: ActorId,
        ev: Inbound,
    ) -> Result<Option<MessageAnswer>, RuntimeError> {
        if let Some(router) = self.router.get() {
            return router.deliver(to, ev).await;
        }
        let rt = self.runtime().ok_or(RuntimeError::ShuttingDown)?;
        let r = crate::node::deliver_inbound(&rt, to, ev).await;
        drop_elsewhere(rt);
        r
    }

    /// Brings `answer` to the sender; offers it again while its
    /// `on-response` fails (the guest's failures count toward
    /// `outbox_response_attempts_max`; the node's do not), then drops the
    /// row.
    async fn respond(
        &self,
        from: &ActorId,
        life: u64,
        row: &OutboxRow,
        answer: Answer,
        attempts: u32,
    ) {
        let mut failures = 0;
        let mut tries = 0;
        loop {
            if !self.still_known(from, life, row.seq) {
                return;
            }
            tries += 1;
            let ev = Inbound::Response {
                life,
                seq: row.seq,
                answer: answer.clone(),
                attempts,
                discard: false,
                trace: crate::trace::call_of(&row.headers).map(|(c, _)| c),
            };
            match self.deliver(from.clone(), ev.clone()).await {
                Ok(_) => {
                    if self.fault(|f| f.outbox_repeat_responses()) {
                        let _ = self.deliver(from.clone(), ev).await;
                    }
                    self.metrics.outbox_answers_total.inc();
                    return;
                }
                Err(e) if e.is_guest_failure() => {
                    failures += 1;
                    if failures >= self.limits.response_attempts_max.max(1) {
                        tracing::warn!(actor = %from, seq = row.seq, error = %self.scrub(from, &e.to_string()), "on-response kept failing: the answer is dropped (outbox_response_attempts_max)");
                        self.metrics.outbox_answers_dropped_total.inc();
                        let ev = Inbound::Response {
                            life,
                            seq: row.seq,
                            answer: answer.clone(),
                            attempts,
                            discard: true,
                            trace: None,
                        };
                        let _ = self.deliver(from.clone(), ev).await;
                        return;
                    }
                    tokio::time::sleep(self.backoff(failures)).await;
                }
                Err(e) if final_failure(&e) => {
                    // The sender's app or class is gone: nobody to tell.
                    // The row stays in its database for a later deploy.
                    tracing::warn!(actor = %from, seq = row.seq, error = %self.scrub(from, &e.to_string()), "an answer cannot reach its sender: kept in its outbox");
                    return;
                }
                Err(e) => {
                    tracing::debug!(actor = %from, seq = row.seq, error = %self.scrub(from, &e.to_string()), "answer not applied yet");
                    tokio::time::sleep(self.backoff(tries)).await;
                }
            }
        }
    }
}

/// Failures of a message's delivery that trying again cannot mend.
fn final_failure(e: &RuntimeError) -> bool {
    match e {
        RuntimeError::AppNotFound(_)
        | RuntimeError::ClassNotFound { .. }
        | RuntimeError::NoInbox(_)
        | RuntimeError::InvalidId(_) => true,
        RuntimeError::Relayed { retryable, .. } => !retryable,
        _ => false,
    }
}

/// Works through one lane: each message in order, with its retries, then
/// its answer.
async fn run_lane(sh: Arc<Shared>, lane: Lane) {
    let (from, life, target) = lane.clone();
    loop {
        let newest_first = sh.fault(|f| f.unsafe_lanes_reversed());
        let row = {
            let mut st = sh.state.lock();
            let queue = st.lanes.get_mut(&lane);
            let next = if newest_first {
                queue.and_then(VecDeque::pop_back)
            } else {
                queue.and_then(VecDeque::pop_front)
            };
            match next {
                Some(r) => r,
                None => {
                    st.lanes.remove(&lane);
                    if let Some(a) = st.actors.get_mut(&from)
                        && a.life == life
                    {
                        a.running.remove(&target);
                        if a.known.is_empty() && a.running.is_empty() {
                            st.actors.remove(&from);
                        }
                    }
                    return;
                }
            }
        };
        if !sh.still_known(&from, life, row.seq) {
            sh.finish(&from, life, &row, 0);
            continue;
        }
        // The next message leaves only once the sender applied this one's
        // answer: the receiver keeps only the last answer it gave, so a
        // sender that restarts before applying an earlier one must find it
        // there when it asks again.
        let started = crate::clock::instant();
        match send_message(&sh, &from, life, &row).await {
            Some((answer, attempts)) => {
                record_call(&sh, "send", (&row, started), &answer, attempts);
                let extra = answer.bytes();
                sh.hold_bytes(extra);
                sh.respond(&from, life, &row, answer, attempts).await;
                sh.finish(&from, life, &row, extra);
            }
            None => sh.finish(&from, life, &row, 0),
        }
    }
}

/// One message's deliveries; `None` if the sender was forgotten meanwhile.
async fn send_message(
    sh: &Shared,
    from: &ActorId,
    life: u64,
    row: &OutboxRow,
) -> Option<(Answer, u32)> {
    let Some(to) = decode_target(&from.tenant, &row.target) else {
        return Some((
            Answer::Failed {
                code: "invalid_name".into(),
                message: format!("cannot address `{}`", row.target),
            },
            0,
        ));
    };
    let mut attempts = 0;
    loop {
        attempts += 1;
        let permits = sh.permits(from, life, None).await?;
        sh.wait_while_held().await;
        let ev = Inbound::Message {
            from: from.clone(),
            life,
            seq: row.seq,
            body: row.body.clone(),
            trace: crate::trace::call_of(&row.headers).map(|(c, _)| c),
            chain: crate::awaits::chain_of(&row.headers),
        };
        let mut r = sh.deliver(to.clone(), ev).await;
        drop(permits);
        if r.is_ok() && sh.fault(|f| f.outbox_lose_answers()) {
            r = Err(RuntimeError::Internal(
                "injected: the answer was lost on its way back".into(),
            ));
        }
        let e = match r {
            Ok(Some(answer)) => return Some((Answer::Message(answer), attempts)),
            Ok(None) => RuntimeError::Internal("a message got no answer".into()),
            Err(e) => e,
        };
        if final_failure(&e) {
            sh.metrics.outbox_failed_total.inc();
            return Some((
                Answer::Failed {
                    code: e.code(),
                    message: sh.scrub(from, &e.to_string()),
                },
                attempts,
            ));
        }
        if attempts >= sh.limits.attempts_max.max(1) {
            sh.metrics.outbox_failed_total.inc();
            return Some((
                Answer::Failed {
                    code: "delivery_failed".into(),
                    message: format!(
                        "not delivered after {attempts} attempts (outbox_attempts_max): {}: {e}",
                        e.code()
                    ),
                },
                attempts,
            ));
        }
        tracing::debug!(actor = %from, to = %to, seq = row.seq, error = %sh.scrub(from, &e.to_string()), "message not delivered yet");
        tokio::time::sleep(sh.backoff(attempts)).await;
    }
}

/// The idempotency key of a row's attempts: the sender (its written form,
/// the name percent-encoded, so the key is a valid header value whatever
/// the name), its outbox's life, and the row's sequence number.
pub(crate) fn idempotency_key(from: &ActorId, life: u64, seq: u64) -> String {
    format!("{from}/{life:016x}/{seq}")
}

async fn run_call(
    sh: Arc<Shared>,
    from: ActorId,
    life: u64,
    row: OutboxRow,
    policy: Arc<OutboundPolicy>,
    app_sem: Arc<Semaphore>,
) {
    let key = idempotency_key(&from, life, row.seq);
    let started = crate::clock::instant();
    let mut attempts = 0;
    let answer = loop {
        attempts += 1;
        let Some(permits) = sh.permits(&from, life, Some(&app_sem)).await else {
            sh.finish(&from, life, &row, 0);
            return;
        };
        sh.wait_while_held().await;
        let r = http::attempt(sh.client(), &row, &key, &policy).await;
        drop(permits);
        let last = attempts >= sh.limits.attempts_max.max(1);
        match r {
            Attempt::Answered {
                status,
                headers,
                body,
            } => {
                if !last && http::retry_status(status) {
                    tokio::time::sleep(sh.backoff(attempts)).await;
                    continue;
                }
                break Answer::Http {
                    status,
                    headers,
                    body,
                };
            }
            Attempt::Final(code, message) => {
                sh.metrics.outbox_failed_total.inc();
                break Answer::Failed {
                    code,
                    message: sh.scrub(&from, &message),
                };
            }
            Attempt::Retry(code, message) => {
                if last {
                    sh.metrics.outbox_failed_total.inc();
                    break Answer::Failed {
                        code: "delivery_failed".into(),
                        message: sh.scrub(
                            &from,
                            &format!(
                                "no answer after {attempts} attempts (outbox_attempts_max): {code}: {message}"
                            ),
                        ),
                    };
                }
                tracing::debug!(actor = %from, seq = row.seq, %code, message = %sh.scrub(&from, &message), "call not answered yet");
                tokio::time::sleep(sh.backoff(attempts)).await;
            }
        }
    };
    record_call(&sh, "fetch", (&row, started), &answer, attempts);
    let extra = answer.bytes();
    sh.hold_bytes(extra);
    sh.respond(&from, life, &row, answer, attempts).await;
    sh.finish(&from, life, &row, extra);
}

/// The `fetch` or `send` span of a call a traced event made (ADR 0064):
/// from its first attempt to its answer, under the event's `guest` span.
fn record_call(
    sh: &Shared,
    name: &'static str,
    (row, started): (&OutboxRow, std::time::Instant),
    answer: &Answer,
    attempts: u32,
) {
    let Some((ctx, parent)) = crate::trace::call_of(&row.headers) else {
        return;
    };
    let Some(rt) = sh.rt.get().and_then(Weak::upgrade) else {
        return;
    };
    let mut span = crate::trace::Span::new(
        ctx,
        Some(parent),
        name,
        crate::trace::SpanKind::Client,
        (started, crate::clock::instant()),
    )
    .int("wasmkeep.attempts", i64::from(attempts));
    span = match row.kind {
        // The URL without its query (which may carry a tenant's secrets).
        OutboxKind::Http => span.text("http.request.method", &row.method).text(
            "url.full",
            row.target.split(['?', '#']).next().unwrap_or(""),
        ),
        OutboxKind::Message => span.text("wasmkeep.to", &row.target),
    };
    match answer {
        Answer::Http { status, .. } => {
            span = span.int("http.response.status_code", i64::from(*status));
        }
        Answer::Failed { code, .. }
        | Answer::Message(crate::outbox::MessageAnswer::Refused { code, .. }) => {
            span.error = Some(code.clone());
        }
        Answer::Message(_) => {}
    }
    rt.traces.record(span);
}
