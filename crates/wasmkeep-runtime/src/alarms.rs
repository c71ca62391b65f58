//! Actors' alarms, as the node's users see them: [`Runtime::alarms`]
//! hands out an [`Alarms`] handle with everything the server, the test kit
//! and a cluster's sweep do with alarms, instead of a dozen methods on
//! `Runtime`.
//!
//! Where the rest of alarms lives (a map, since an alarm crosses every
//! layer):
//!
//! | what | where |
//! |---|---|
//! | the SDK's `set_alarm`, named timers | `wasmkeep-sdk` (`alarm`, `timers`) |
//! | the committed alarm, one row per actor | `wasmkeep-store` (`_wasmkeep_alarm`) |
//! | the node's timer: one time per actor, due order | [`crate::timer`] |
//! | the turn that runs `on-alarm`, its retry and rehearsal | [`crate::actor`] (`run_alarm`, `rehearse_alarm`) |
//! | the backoff after a failed run | `wasmkeep_cluster::retry` (shared with the simulator) |
//! | preparing ahead of the due instant (ADR 0026) | [`crate::warm`], `Inner::prepare_soon` |
//! | the cluster's index: entries, delivery, stale cleanup | [`crate::index`], `wasmkeep_cluster::alarm_index`, `wasmkeep_cluster::delivery` |
//! | the sweep of the index (ADR 0009) | `wasmkeep_cluster::machine::SweepMachine`, driven by `wasmkeep-server`'s `cluster/sweep.rs` |
//! | `/admin/v1/alarms` | `wasmkeep-server`'s `api.rs` |

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use crate::actor::{Event, EventKind, Outcome};
use crate::clock::{Clock, ManualClock};
use crate::error::RuntimeError;
use crate::node::{Inner, RunGate};
use crate::runtime::Runtime;
use wasmkeep_store::ActorId;

/// Most alarm rounds one move of a test clock runs: past it a handler
/// keeps re-arming itself for "now", and the move stops with an error.
pub const TEST_CLOCK_ROUNDS_MAX: usize = 100_000;

impl Runtime {
    /// Actors' alarms on this node.
    pub fn alarms(&self) -> Alarms<'_> {
        Alarms { inner: &self.inner }
    }

    /// Moves a test clock (the node's own, a [`ManualClock`]) forward to
    /// `target_ms`, as time would pass: every alarm that comes due on the
    /// way runs in due order, each at its own time and prepared
    /// `alarm_prepare_ms` ahead as the timer does; parked replies expire
    /// as their deadlines pass and sockets idle by then close. Returns how
    /// many alarm handlers succeeded. The test kits (Rust's `TestNode`,
    /// and `serve --test-clock` for the JavaScript one) both move time
    /// with this.
    pub async fn advance_test_clock(
        &self,
        clock: &ManualClock,
        target_ms: u64,
    ) -> Result<usize, RuntimeError> {
        let prepare_ms = self.inner.config.alarm_prepare_ms;
        let mut ran = 0;
        let mut rounds = 0;
        while let Some(due) = self.alarms().next_due_ms() {
            if due > target_ms {
                break;
            }
            // A wait that ends before this alarm ends first: its actor's
            // gate may hold the alarm (ADR 0056), whose run `run_due`
            // waits for.
            if let Some(ends) = self.next_await_deadline_ms()
                && ends > clock.now_ms()
                && ends <= due
            {
                clock.set_ms(ends);
                self.expire_parked_replies();
                self.expire_await_deadlines();
                continue;
            }
            rounds += 1;
            if rounds > TEST_CLOCK_ROUNDS_MAX {
                return Err(RuntimeError::Internal(format!(
                    "more than {TEST_CLOCK_ROUNDS_MAX} alarm rounds before {target_ms}: does a handler re-arm itself for now?"
                )));
            }
            let early = due.saturating_sub(prepare_ms);
            if early > clock.now_ms() {
                clock.set_ms(early);
            }
            self.alarms().prepare();
            clock.set_ms(due);
            self.expire_parked_replies();
            self.expire_await_deadlines();
            ran += self.alarms().run_due().await;
        }
        clock.set_ms(target_ms);
        self.expire_parked_replies();
        self.expire_await_deadlines();
        self.sockets().close_idle(target_ms);
        Ok(ran)
    }
}

/// Actors' alarms on this node: see [`Runtime::alarms`].
pub struct Alarms<'a> {
    inner: &'a Arc<Inner>,
}

impl Alarms<'_> {
    /// A tenant's pending alarms in due order, each with how many of its
    /// runs failed so far (0 unless it is being retried).
    pub fn pending(&self, tenant: &str, limit: usize) -> Vec<(ActorId, u64, u32)> {
        self.inner.timer.pending(tenant, limit)
    }

    /// The alarm this node's timer holds for an actor.
    pub fn timer_at(&self, id: &ActorId) -> Option<u64> {
        self.inner.timer.get(id)
    }

    /// The earliest alarm in the timer.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.inner.timer.next_due()
    }

    /// Delivers every alarm due by the clock's now and waits until they ran.
    /// Returns how many handlers ran. (The timer thread does this by itself
    /// on a real clock; the test kit calls it.) An actor whose event is
    /// suspended (ADR 0056) gets its alarm without a wait: its gate holds
    /// the alarm until the wait ends, which may need the clock to move on.
    pub async fn run_due(&self) -> usize {
        let now = self.inner.clock.now_ms();
        let due = self.inner.timer.pop_due(now, usize::MAX);
        let mut waits = Vec::with_capacity(due.len());
        for (id, _) in due {
            if !self.inner.may_run(&id) {
                continue;
            }
            let actor = self.inner.actors.lock().get(&id).cloned();
            if actor.is_some_and(|a| a.queue.lock().awaiting.is_some()) {
                let held = Event::new(EventKind::Alarm { force: false }, None);
                let _ = self.inner.enqueue(&id, held, false);
                continue;
            }
            let (tx, rx) = oneshot::channel();
            if self
                .inner
                .enqueue(
                    &id,
                    Event::new(EventKind::Alarm { force: false }, Some(tx)),
                    false,
                )
                .is_ok()
            {
                waits.push(rx);
            }
        }
        let mut ran = 0;
        for w in waits {
            if let Ok(Ok(Outcome::Alarm(true))) = w.await {
                ran += 1;
            }
        }
        ran
    }

    /// Opens the actors whose alarm is due within `alarm_prepare_ms` of
    /// the clock's now and prepares what their alarm's turn will run, as
    /// the timer thread does on a real clock (the test kit calls it).
    /// Returns at once: each actor's preparation runs before its next event.
    pub fn prepare(&self) {
        self.inner.prepare_soon(self.inner.clock.now_ms());
    }

    /// Delivers the alarm index entry at `at_ms` to its actor (a sweep of
    /// a cluster node; see `index`) and waits for what it found.
    /// `remove_here`: the entry is in the actor's app's index (its stale
    /// entries are removed in the actor's turn).
    pub async fn deliver(
        &self,
        id: &ActorId,
        at_ms: u64,
        remove_here: bool,
    ) -> Result<crate::index::Delivered, RuntimeError> {
        let (tx, rx) = oneshot::channel();
        self.inner.enqueue(
            id,
            Event::new(EventKind::Deliver { at_ms, remove_here }, Some(tx)),
            false,
        )?;
        match rx.await {
            Ok(Ok(Outcome::Delivered(d))) => Ok(d),
            Ok(Ok(_)) => Err(RuntimeError::Internal("unexpected outcome".into())),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(RuntimeError::ShuttingDown),
        }
    }

    /// Opens the actor and looks at its committed alarm as the timer does
    /// when one comes due: runs it if it is due, and otherwise puts it in
    /// this node's timer. A cluster node that was handed an actor calls it
    /// (ADR 0072): the actor's alarm is then timed here from the hand-over
    /// on, instead of waiting for a request or a sweep to reach it.
    /// Returns whether an alarm ran.
    pub async fn look(&self, id: &ActorId) -> Result<bool, RuntimeError> {
        let (tx, rx) = oneshot::channel();
        self.inner.enqueue(
            id,
            Event::new(EventKind::Alarm { force: false }, Some(tx)),
            false,
        )?;
        match rx.await {
            Ok(Ok(Outcome::Alarm(ran))) => Ok(ran),
            Ok(Ok(_)) => Ok(false),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(RuntimeError::ShuttingDown),
        }
    }

    /// Runs an actor's pending alarm now, due or not; whether there was
    /// one. Its handler sees the time it was set for in `scheduled-ms`.
    pub async fn run_now(&self, id: &ActorId) -> Result<bool, RuntimeError> {
        Ok(self.run_now_reporting(id).await?.is_some())
    }

    /// [`Alarms::run_now`], saying how the run went: `None` when the actor
    /// had no alarm, `Some(Err(e))` when its handler ran and failed (the
    /// alarm then backs off as any failed run does).
    pub async fn run_now_reporting(
        &self,
        id: &ActorId,
    ) -> Result<Option<Result<(), RuntimeError>>, RuntimeError> {
        let (tx, rx) = oneshot::channel();
        self.inner.enqueue(
            id,
            Event::new(EventKind::Alarm { force: true }, Some(tx)),
            false,
        )?;
        match rx.await {
            Ok(Ok(Outcome::Alarm(true))) => Ok(Some(Ok(()))),
            Ok(Ok(_)) => Ok(None),
            // The handler ran and failed: there was an alarm.
            Ok(Err(e)) => Ok(Some(Err(e))),
            Err(_) => Err(RuntimeError::ShuttingDown),
        }
    }

    /// Sets who may run actors' alarms on this node (once; a cluster node
    /// sets it before it acts). Returns `false` if a gate was set already.
    pub fn set_gate(&self, gate: Arc<dyn RunGate>) -> bool {
        self.inner.gate.set(gate).is_ok()
    }

    /// Due alarms the gate kept from running on this node.
    pub fn gated_total(&self) -> u64 {
        self.inner.alarms_gated_total.load(Ordering::Relaxed)
    }
}
