//! The node's dispatcher: delivers committed outbox rows off the workers.
//!
//! Rows arrive from a turn once their commit is durable ([`Dispatcher::offer`])
//! or from an actor's opening (rows an earlier run of the node, or another
//! node, left). Messages from one sender to one receiver go one at a time,
//! in order (a *lane*), which is what lets the receiver keep only the last
//! one it applied. HTTP calls have no order. Every delivery takes a permit
//! of the node (`outbox_in_flight_max`) and of its actor
//! (`outbox_per_actor_max`; for HTTP the app's `per_actor_max`), and an
//! HTTP call one of its app (`per_app_max`).
//!
//! A delivery that fails in a way worth retrying waits (doubling from
//! `outbox_retry_first_ms` up to `outbox_retry_max_ms`) without its
//! permits, up to `outbox_attempts_max` attempts; then the sender hears
//! `failed`. The answer goes back to the sender as a `Response` event; if
//! the sender's `on-response` keeps failing, the row is dropped after
//! `outbox_response_attempts_max` offers (logged, counted).
//!
//! Rows held here count their bodies against `outbox_node_bytes_max`; an
//! actor whose rows do not fit is remembered, and its rows are read again
//! from its database (an `OutboxResume` event) when there is room.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmkeep_store::{ActorId, OutboxKind, OutboxRow};

use super::http::{self, Attempt};
use super::{OutboundPolicy, OutboxLimits, decode_target};
use crate::error::RuntimeError;
use crate::runtime::Inner;

/// What the receiver of a message answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageAnswer {
    /// `on-message` returned `ok` with this body.
    Reply(Vec<u8>),
    /// `on-message` returned `err` (or failed in a way that would fail
    /// again): its event rolled back.
    Refused { code: String, message: String },
}

/// What a sender hears about one of its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Message(MessageAnswer),
    Http {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    Failed {
        code: String,
        message: String,
    },
}

/// An event the dispatcher brings to an actor.
#[derive(Debug, Clone)]
pub enum Inbound {
    /// A message from `from` (its `life` and `seq`: what the receiver keys
    /// repeats by).
    Message {
        from: ActorId,
        life: u64,
        seq: u64,
        body: Vec<u8>,
    },
    /// The answer to the receiver's own row `seq`. With `discard`, the row
    /// is deleted without running `on-response` (it kept failing).
    Response {
        seq: u64,
        answer: Answer,
        attempts: u32,
        discard: bool,
    },
}

/// The future a [`Router`] returns.
pub type Routed = Pin<Box<dyn Future<Output = Result<Option<MessageAnswer>, RuntimeError>> + Send>>;

/// Takes an inbound event to whichever node holds its actor (a cluster).
/// Without one, every actor is this node's.
pub trait Router: Send + Sync {
    /// Delivers `ev` to `to` and returns what its event answered (`Some`
    /// for a message).
    fn deliver(&self, to: ActorId, ev: Inbound) -> Routed;
}

/// A lane's key: one sender's messages to one receiver.
type Lane = (ActorId, String);

#[derive(Default)]
struct ActorOut {
    /// Rows offered and not yet finished.
    known: BTreeSet<u64>,
    /// Lanes with a task working through them.
    running: HashSet<String>,
    per_actor: Option<Arc<Semaphore>>,
    http_per_actor: Option<Arc<Semaphore>>,
}

#[derive(Default)]
struct State {
    actors: HashMap<ActorId, ActorOut>,
    lanes: HashMap<Lane, VecDeque<OutboxRow>>,
    /// Bodies and contexts held.
    bytes: u64,
    /// Actors whose rows did not fit; read again when there is room.
    deferred: BTreeSet<ActorId>,
    apps: HashMap<(String, String), Arc<Semaphore>>,
}

fn row_bytes(r: &OutboxRow) -> u64 {
    (r.body.len() + r.context.len() + r.target.len()) as u64
}

struct Shared {
    rt: OnceLock<Weak<Inner>>,
    router: OnceLock<Arc<dyn Router>>,
    limits: OutboxLimits,
    client: OnceLock<reqwest::Client>,
    private_allowed: bool,
    state: Mutex<State>,
    in_flight: Arc<Semaphore>,
    handle: tokio::runtime::Handle,
    delivered: std::sync::atomic::AtomicU64,
    failed: std::sync::atomic::AtomicU64,
    dropped: std::sync::atomic::AtomicU64,
}

/// The node's outbox dispatcher (see the module's documentation).
pub struct Dispatcher {
    shared: Arc<Shared>,
    io: Mutex<Option<tokio::runtime::Runtime>>,
}

impl Dispatcher {
    pub fn new(limits: OutboxLimits, private_allowed: bool) -> Dispatcher {
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
            limits,
            client: OnceLock::new(),
            private_allowed,
            state: Mutex::new(State::default()),
            handle: io.handle().clone(),
            delivered: Default::default(),
            failed: Default::default(),
            dropped: Default::default(),
        });
        Dispatcher {
            shared,
            io: Mutex::new(Some(io)),
        }
    }

    pub(crate) fn attach(&self, rt: Weak<Inner>) {
        let _ = self.shared.rt.set(rt);
    }

    /// Sends messages to actors through `router` (a cluster node); once.
    pub fn set_router(&self, router: Arc<dyn Router>) -> bool {
        self.shared.router.set(router).is_ok()
    }

    /// Rows offered and not yet finished, on this node.
    pub fn pending(&self) -> usize {
        let st = self.shared.state.lock();
        st.actors.values().map(|a| a.known.len()).sum::<usize>() + st.deferred.len()
    }

    /// Answers delivered to senders, deliveries that failed for good, and
    /// answers dropped after their sender's `on-response` kept failing.
    pub fn counts(&self) -> (u64, u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.shared.delivered.load(Relaxed),
            self.shared.failed.load(Relaxed),
            self.shared.dropped.load(Relaxed),
        )
    }

    /// Forgets an actor that was deleted: what is in flight for it will
    /// not answer its next life.
    pub fn forget(&self, id: &ActorId) {
        let mut st = self.shared.state.lock();
        st.actors.remove(id);
        st.deferred.remove(id);
    }

    /// Takes committed rows of `from` for delivery; rows already known are
    /// skipped. `policy` is the sender's app's.
    pub fn offer(
        &self,
        from: &ActorId,
        life: u64,
        rows: Vec<OutboxRow>,
        policy: Arc<OutboundPolicy>,
    ) {
        let sh = &self.shared;
        let mut guard = sh.state.lock();
        let st = &mut *guard;
        let fresh: Vec<OutboxRow> = match st.actors.get(from) {
            Some(a) => rows
                .into_iter()
                .filter(|r| !a.known.contains(&r.seq))
                .collect(),
            None => rows,
        };
        if fresh.is_empty() {
            return;
        }
        let bytes: u64 = fresh.iter().map(row_bytes).sum();
        if st.bytes + bytes > sh.limits.node_bytes_max && st.bytes > 0 {
            tracing::debug!(actor = %from, "outbox rows wait in the database: outbox_node_bytes_max");
            st.deferred.insert(from.clone());
            return;
        }
        st.bytes += bytes;
        let per_actor_max = sh.limits.per_actor_max.max(1);
        let a = st.actors.entry(from.clone()).or_default();
        a.per_actor
            .get_or_insert_with(|| Arc::new(Semaphore::new(per_actor_max)));
        a.http_per_actor
            .get_or_insert_with(|| Arc::new(Semaphore::new(policy.per_actor_max.max(1))));
        let mut start_lanes = Vec::new();
        let mut calls = Vec::new();
        for row in fresh {
            a.known.insert(row.seq);
            match row.kind {
                OutboxKind::Message => {
                    let lane = (from.clone(), row.target.clone());
                    if a.running.insert(row.target.clone()) {
                        start_lanes.push(lane.clone());
                    }
                    st.lanes.entry(lane).or_default().push_back(row);
                }
                OutboxKind::Http => calls.push(row),
            }
        }
        drop(guard);
        for lane in start_lanes {
            let sh = Arc::clone(sh);
            sh.handle.clone().spawn(run_lane(sh, lane, life));
        }
        let app_sem = self.app_semaphore(from, &policy);
        for row in calls {
            let sh = Arc::clone(sh);
            let policy = Arc::clone(&policy);
            let app_sem = Arc::clone(&app_sem);
            let from = from.clone();
            sh.handle
                .clone()
                .spawn(async move { run_call(sh, from, life, row, policy, app_sem).await });
        }
    }

    /// Offers `rows` once `ready` says their commit is in the bucket; if
    /// it says the actor was given up instead, they are not sent (the
    /// bucket's state, which the actor serves from now on, lacks them).
    pub(crate) fn offer_when(
        &self,
        ready: tokio::sync::oneshot::Receiver<Result<crate::actor::Outcome, RuntimeError>>,
        from: ActorId,
        life: u64,
        rows: Vec<OutboxRow>,
        policy: Arc<OutboundPolicy>,
    ) {
        let Some(rt) = self.shared.runtime() else {
            return;
        };
        self.shared.handle.spawn(async move {
            if let Ok(Ok(_)) = ready.await {
                rt.outbox.offer(&from, life, rows, policy);
            }
        });
    }

    fn app_semaphore(&self, from: &ActorId, policy: &OutboundPolicy) -> Arc<Semaphore> {
        let mut st = self.shared.state.lock();
        Arc::clone(
            st.apps
                .entry((from.tenant.clone(), from.app.clone()))
                .or_insert_with(|| Arc::new(Semaphore::new(policy.per_app_max.max(1)))),
        )
    }

    /// Stops delivering: tasks in flight are dropped (their rows stay in
    /// their databases and are delivered after the next start).
    pub fn shutdown(&self) {
        if let Some(io) = self.io.lock().take() {
            io.shutdown_background();
        }
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
        let ms = first
            .saturating_mul(1u64 << attempt.saturating_sub(1).min(20))
            .min(self.limits.retry_max_ms.max(first));
        // Up to a fifth less, so that many retries do not move in step.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64)
            .unwrap_or(0);
        Duration::from_millis(ms - (ms / 5) * (nanos % 1000) / 1000)
    }

    async fn permits(
        &self,
        actor: &ActorId,
        http: bool,
    ) -> Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)> {
        let sem = {
            let st = self.state.lock();
            let a = st.actors.get(actor)?;
            if http {
                a.http_per_actor.clone()?
            } else {
                a.per_actor.clone()?
            }
        };
        let node = Arc::clone(&self.in_flight).acquire_owned().await.ok()?;
        let own = sem.acquire_owned().await.ok()?;
        Some((node, own))
    }

    /// Whether a test fault is set (false once the node is gone).
    fn fault(&self, f: impl Fn(&crate::runtime::Faults) -> bool) -> bool {
        self.runtime().is_some_and(|rt| f(&rt.faults))
    }

    /// A test holds deliveries (`Faults::outbox_held`).
    async fn wait_while_held(&self) {
        while self.fault(|f| f.outbox_held.load(std::sync::atomic::Ordering::Relaxed)) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Whether `seq` of `actor` is still wanted (not forgotten by a delete).
    fn still_known(&self, actor: &ActorId, seq: u64) -> bool {
        self.state
            .lock()
            .actors
            .get(actor)
            .is_some_and(|a| a.known.contains(&seq))
    }

    /// `seq` of `actor` is done: its bytes are given back, and actors that
    /// waited for room are read again.
    fn finish(&self, actor: &ActorId, row: &OutboxRow) {
        let resume: Vec<ActorId> = {
            let mut st = self.state.lock();
            st.bytes = st.bytes.saturating_sub(row_bytes(row));
            if let Some(a) = st.actors.get_mut(actor) {
                a.known.remove(&row.seq);
                if a.known.is_empty() && a.running.is_empty() {
                    st.actors.remove(actor);
                }
            }
            if st.deferred.is_empty() || st.bytes > self.limits.node_bytes_max / 2 {
                Vec::new()
            } else {
                std::mem::take(&mut st.deferred).into_iter().collect()
            }
        };
        if let Some(rt) = self.runtime() {
            for id in resume {
                rt.resume_outbox(&id);
            }
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
        crate::runtime::deliver_inbound(&rt, to, ev).await
    }

    /// Brings `answer` to the sender; offers it again while its
    /// `on-response` fails, then drops the row.
    async fn respond(&self, from: &ActorId, row: &OutboxRow, answer: Answer, attempts: u32) {
        let mut offers = 0;
        loop {
            if !self.still_known(from, row.seq) {
                return;
            }
            offers += 1;
            let ev = Inbound::Response {
                seq: row.seq,
                answer: answer.clone(),
                attempts,
                discard: false,
            };
            match self.deliver(from.clone(), ev.clone()).await {
                Ok(_) => {
                    if self.fault(|f| crate::runtime::Faults::take(&f.outbox_repeat_responses)) {
                        let _ = self.deliver(from.clone(), ev).await;
                    }
                    self.delivered
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return;
                }
                Err(e)
                    if offers >= self.limits.response_attempts_max.max(1) && !e.is_retryable() =>
                {
                    tracing::warn!(actor = %from, seq = row.seq, error = %e, "on-response kept failing: the answer is dropped (outbox_response_attempts_max)");
                    self.dropped
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let ev = Inbound::Response {
                        seq: row.seq,
                        answer: answer.clone(),
                        attempts,
                        discard: true,
                    };
                    let _ = self.deliver(from.clone(), ev).await;
                    return;
                }
                Err(e) => {
                    tracing::debug!(actor = %from, seq = row.seq, error = %e, "answer not applied yet");
                    tokio::time::sleep(self.backoff(offers)).await;
                }
            }
        }
    }
}

/// Works through one lane: each message in order, with its retries, then
/// its answer.
async fn run_lane(sh: Arc<Shared>, lane: Lane, life: u64) {
    let (from, target) = lane.clone();
    loop {
        let row = {
            let mut st = sh.state.lock();
            match st.lanes.get_mut(&lane).and_then(VecDeque::pop_front) {
                Some(r) => r,
                None => {
                    st.lanes.remove(&lane);
                    if let Some(a) = st.actors.get_mut(&from) {
                        a.running.remove(&target);
                        if a.known.is_empty() && a.running.is_empty() {
                            st.actors.remove(&from);
                        }
                    }
                    return;
                }
            }
        };
        if !sh.still_known(&from, row.seq) {
            continue;
        }
        let (answer, attempts) = send_message(&sh, &from, life, &row).await;
        sh.respond(&from, &row, answer, attempts).await;
        sh.finish(&from, &row);
    }
}

async fn send_message(sh: &Shared, from: &ActorId, life: u64, row: &OutboxRow) -> (Answer, u32) {
    let Some(to) = decode_target(&from.tenant, &row.target) else {
        return (
            Answer::Failed {
                code: "invalid_name".into(),
                message: format!("cannot address `{}`", row.target),
            },
            0,
        );
    };
    let mut attempts = 0;
    loop {
        attempts += 1;
        let Some(permits) = sh.permits(from, false).await else {
            // Forgotten (the sender was deleted): nobody to answer.
            return (
                Answer::Failed {
                    code: "shutting_down".into(),
                    message: String::new(),
                },
                attempts,
            );
        };
        let ev = Inbound::Message {
            from: from.clone(),
            life,
            seq: row.seq,
            body: row.body.clone(),
        };
        sh.wait_while_held().await;
        let mut r = sh.deliver(to.clone(), ev).await;
        drop(permits);
        if r.is_ok() && sh.fault(|f| crate::runtime::Faults::take(&f.outbox_lose_answers)) {
            r = Err(RuntimeError::Internal(
                "injected: the answer was lost on its way back".into(),
            ));
        }
        let e = match r {
            Ok(Some(answer)) => return (Answer::Message(answer), attempts),
            Ok(None) => RuntimeError::Internal("a message got no answer".into()),
            Err(e) => e,
        };
        if !e.is_retryable() && !matches!(e, RuntimeError::Internal(_)) {
            sh.failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return (
                Answer::Failed {
                    code: e.code(),
                    message: e.to_string(),
                },
                attempts,
            );
        }
        if attempts >= sh.limits.attempts_max.max(1) {
            sh.failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return (
                Answer::Failed {
                    code: "delivery_failed".into(),
                    message: format!(
                        "not delivered after {attempts} attempts (outbox_attempts_max): {}: {e}",
                        e.code()
                    ),
                },
                attempts,
            );
        }
        tracing::debug!(actor = %from, to = %to, seq = row.seq, error = %e, "message not delivered yet");
        tokio::time::sleep(sh.backoff(attempts)).await;
    }
}

async fn run_call(
    sh: Arc<Shared>,
    from: ActorId,
    life: u64,
    row: OutboxRow,
    policy: Arc<OutboundPolicy>,
    app_sem: Arc<Semaphore>,
) {
    let _ = life;
    let key = format!("{from}/{}", row.seq);
    let mut attempts = 0;
    let answer = loop {
        attempts += 1;
        let Some(permits) = sh.permits(&from, true).await else {
            return;
        };
        let Ok(app_permit) = Arc::clone(&app_sem).acquire_owned().await else {
            return;
        };
        sh.wait_while_held().await;
        let r = http::attempt(sh.client(), &row, &key, &policy).await;
        drop((permits, app_permit));
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
                sh.failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                break Answer::Failed { code, message };
            }
            Attempt::Retry(code, message) => {
                if last {
                    sh.failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    break Answer::Failed {
                        code: "delivery_failed".into(),
                        message: format!(
                            "no answer after {attempts} attempts (outbox_attempts_max): {code}: {message}"
                        ),
                    };
                }
                tracing::debug!(actor = %from, seq = row.seq, %code, %message, "call not answered yet");
                tokio::time::sleep(sh.backoff(attempts)).await;
            }
        }
    };
    sh.respond(&from, &row, answer, attempts).await;
    sh.finish(&from, &row);
}
