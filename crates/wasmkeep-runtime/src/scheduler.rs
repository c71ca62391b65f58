//! The run queue: which actor's turn a worker thread runs next, so that
//! no tenant can starve the others (issue 33).
//!
//! A turn cannot be stopped half-way: a guest's statement runs until it
//! ends or its event's CPU limit. With one queue for every tenant and as
//! many threads as cores, two actors with runaway statements held both
//! threads, and a neighbour's increment waited 44 s. Three rules replace
//! that queue:
//!
//! - **Round-robin over tenants.** Actors wait in their tenant's queue
//!   (first in, first out, so a tenant's own actors take turns too);
//!   tenants with waiting actors are served one after the other.
//! - **A tenant's share.** One tenant runs at most `tenant_workers_max`
//!   turns at once (by default as many as there are cores): a runaway
//!   tenant's events take their CPU limit from its own share only.
//! - **Long turns make room.** At most `workers` turns run at once that
//!   have not yet run past `turn_slice_ms`. A turn that has becomes
//!   "long": the thread keeps running it, and one of `workers_spare`
//!   further threads may start another tenant's turn. The kernel then
//!   shares the cores between them; a short turn is not stuck behind long
//!   ones. With no long turn, exactly `workers` turns run, as before.
//!
//! A turn also yields by itself: it starts no new event once it has run
//! for `batch_time_budget_ms` (`actor::run_turn`), and the actor goes to
//! the back of its tenant's queue.
//!
//! A long turn's thread also gives way in the kernel: the first thread
//! that finds a turn long while there is other work lowers that thread's
//! priority to [`LONG_TURN_NICE`], so the kernel runs short turns first
//! and the long one on what is left. A process without `CAP_SYS_NICE`
//! cannot raise a thread's priority again, so once the long turn ends its
//! thread exits and a fresh one takes its place ([`Done::Retire`]).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::actor::Actor;

/// How the workers are shared.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shares {
    /// Turns that may run at once before any has run past `slice`.
    pub workers: usize,
    /// All threads that take turns: `workers` plus the spares.
    pub threads: usize,
    /// Turns of one tenant at once, long ones included.
    pub tenant_turns_max: usize,
    /// A turn running longer than this makes room for another.
    pub slice: Duration,
}

impl Shares {
    /// How the run queue shares the threads, by the node's settings.
    pub(crate) fn of(config: &crate::config::RuntimeConfig) -> Shares {
        let workers = config.worker_threads();
        Shares {
            workers,
            threads: config.turn_threads(),
            tenant_turns_max: config.tenant_workers_max.unwrap_or(workers).max(1),
            slice: Duration::from_millis(config.turn_slice_ms.max(1)),
        }
    }
}

/// The nice value of a thread running a long turn while others wait
/// (the lowest priority short of `SCHED_IDLE`, which would starve a
/// legitimate long event on a busy node until its deadline).
pub(crate) const LONG_TURN_NICE: i32 = 19;

/// A turn being run, on the thread whose slot it is in.
struct Running {
    tenant: Arc<str>,
    since: Instant,
    /// Its thread's priority was lowered ([`LONG_TURN_NICE`]).
    demoted: bool,
}

#[derive(Default)]
struct TenantQueue {
    actors: VecDeque<Arc<Actor>>,
    /// Turns of this tenant running now.
    running: usize,
}

struct State {
    tenants: HashMap<Arc<str>, TenantQueue>,
    /// Tenants with actors waiting, in the order they are served.
    ring: VecDeque<Arc<str>>,
    /// One place per thread.
    running: Vec<Option<Running>>,
    /// Each place's thread (its kernel id; 0 before it registered).
    threads: Vec<i32>,
    /// Threads waiting with work queued for the first running turn to
    /// turn long: while one does, a push that finds every worker's place
    /// taken wakes nobody (a woken thread would only wait again).
    watching: usize,
}

/// What a thread does after [`RunQueue::done`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Done {
    /// Take the next turn.
    Next,
    /// Exit: its priority was lowered for a long turn; a fresh thread
    /// takes its place.
    Retire,
}

/// What [`RunQueue::take`] found.
pub(crate) enum Taken {
    Turn(Arc<Actor>),
    /// The node is stopping.
    Stop,
}

pub(crate) struct RunQueue {
    shares: Shares,
    state: Mutex<State>,
    cv: Condvar,
}

impl RunQueue {
    pub(crate) fn new(shares: Shares) -> RunQueue {
        assert!(shares.workers >= 1 && shares.threads >= shares.workers);
        assert!(shares.tenant_turns_max >= 1);
        RunQueue {
            shares,
            state: Mutex::new(State {
                tenants: HashMap::new(),
                ring: VecDeque::new(),
                running: (0..shares.threads).map(|_| None).collect(),
                threads: vec![0; shares.threads],
                watching: 0,
            }),
            cv: Condvar::new(),
        }
    }

    /// Puts an actor in its tenant's queue (it is not queued or running:
    /// its queue's `scheduled` flag says so).
    pub(crate) fn push(&self, actor: Arc<Actor>) {
        let mut st = self.state.lock();
        let tenant = Arc::clone(&actor.tenant);
        let q = st.tenants.entry(Arc::clone(&tenant)).or_default();
        q.actors.push_back(actor);
        if q.actors.len() == 1 {
            st.ring.push_back(tenant);
        }
        let (short, _) = self.short_turns(&st, crate::clock::instant());
        let wake = short < self.shares.workers || st.watching == 0;
        drop(st);
        if wake {
            self.cv.notify_one();
        }
    }

    /// The thread in place `slot` starts taking turns.
    pub(crate) fn register(&self, slot: usize) {
        self.state.lock().threads[slot] = current_thread_id();
    }

    /// The next turn for the thread in place `slot`, waiting for one. After
    /// a wait of `idle` with nothing to run, calls `on_idle` (without the
    /// lock) and waits on.
    pub(crate) fn take(
        &self,
        slot: usize,
        stopping: &AtomicBool,
        idle: Duration,
        mut on_idle: impl FnMut(),
    ) -> Taken {
        let mut st = self.state.lock();
        debug_assert!(st.running[slot].is_none(), "a thread took two turns");
        loop {
            if stopping.load(Ordering::Relaxed) {
                return Taken::Stop;
            }
            let now = crate::clock::instant();
            if !st.ring.is_empty() {
                demote_long_turns(&mut st, now, self.shares.slice);
            }
            let (short, next_long) = self.short_turns(&st, now);
            if short < self.shares.workers
                && let Some(actor) = self.pick(&mut st, slot, now)
            {
                return Taken::Turn(actor);
            }
            // Nothing to run now. Wake when a short turn turns long (its
            // place frees up), when a turn ends or an actor is pushed, or
            // after `idle`.
            let has_work = !st.ring.is_empty();
            let wake = match next_long {
                Some(at) if has_work => at,
                _ => now + idle,
            };
            let watch = has_work && next_long.is_some();
            st.watching += usize::from(watch);
            let timed_out = self.cv.wait_until(&mut st, wake).timed_out();
            st.watching -= usize::from(watch);
            if timed_out && !has_work {
                parking_lot::MutexGuard::unlocked(&mut st, &mut on_idle);
            }
        }
    }

    /// Turns running that have not run past the slice, and when the first
    /// of them will have.
    fn short_turns(&self, st: &State, now: Instant) -> (usize, Option<Instant>) {
        let mut short = 0;
        let mut next: Option<Instant> = None;
        for r in st.running.iter().flatten() {
            let long_at = r.since + self.shares.slice;
            if long_at > now {
                short += 1;
                next = Some(next.map_or(long_at, |n| n.min(long_at)));
            }
        }
        (short, next)
    }

    /// Takes the first actor of the first tenant in the ring below its
    /// share, and moves that tenant to the ring's back.
    fn pick(&self, st: &mut State, slot: usize, now: Instant) -> Option<Arc<Actor>> {
        for _ in 0..st.ring.len() {
            let tenant = st.ring.pop_front()?;
            let q = st
                .tenants
                .get_mut(&tenant)
                .expect("a ringed tenant has a queue");
            if q.running >= self.shares.tenant_turns_max {
                st.ring.push_back(tenant);
                continue;
            }
            let actor = q.actors.pop_front().expect("a ringed tenant has actors");
            q.running += 1;
            if !q.actors.is_empty() {
                st.ring.push_back(Arc::clone(&tenant));
            }
            st.running[slot] = Some(Running {
                tenant,
                since: now,
                demoted: false,
            });
            return Some(actor);
        }
        None
    }

    /// The thread in place `slot` finished its turn.
    pub(crate) fn done(&self, slot: usize) -> Done {
        let mut st = self.state.lock();
        let r = st.running[slot].take().expect("done without a turn");
        let retire = r.demoted;
        if retire {
            // Its thread exits; the one that replaces it registers.
            st.threads[slot] = 0;
        }
        if let Some(q) = st.tenants.get_mut(&r.tenant) {
            q.running -= 1;
            if q.running == 0 && q.actors.is_empty() {
                st.tenants.remove(&r.tenant);
            }
        }
        drop(st);
        // No thread is woken: this one takes the next turn itself (or the
        // one replacing it does), and threads watching for long turns keep
        // their deadlines.
        if retire { Done::Retire } else { Done::Next }
    }

    /// Wakes every waiting thread (the node stops).
    pub(crate) fn wake_all(&self) {
        self.cv.notify_all();
    }
}

/// Lowers the priority of the threads whose turns have run past `slice`
/// (once each).
fn demote_long_turns(st: &mut State, now: Instant, slice: Duration) {
    for (slot, r) in st.running.iter_mut().enumerate() {
        if let Some(r) = r
            && !r.demoted
            && r.since + slice <= now
        {
            r.demoted = true;
            lower_priority(st.threads[slot]);
        }
    }
}

/// The calling thread's kernel id.
fn current_thread_id() -> i32 {
    // SAFETY: `gettid` has no preconditions.
    unsafe { libc::gettid() }
}

/// Sets thread `tid`'s nice value to [`LONG_TURN_NICE`]; a failure only
/// means the kernel shares the cores evenly, as without it.
fn lower_priority(tid: i32) {
    if tid == 0 {
        return;
    }
    // SAFETY: plain system call on a thread id of this process; it changes
    // that thread's scheduling weight and nothing else.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, LONG_TURN_NICE) };
    if rc != 0 {
        tracing::debug!(tid, error = %std::io::Error::last_os_error(), "could not lower a long turn's priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmkeep_store::ActorId;

    fn actor(tenant: &str, name: &str) -> Arc<Actor> {
        Arc::new(Actor::new(ActorId::new(tenant, "a", "c", name).unwrap()))
    }

    fn shares(workers: usize, threads: usize, tenant: usize, slice_ms: u64) -> Shares {
        Shares {
            workers,
            threads,
            tenant_turns_max: tenant,
            slice: Duration::from_millis(slice_ms),
        }
    }

    /// What the thread in `slot` takes within 50 ms (`None`: nothing).
    fn take_now(q: &Arc<RunQueue>, slot: usize) -> Option<String> {
        let stop = Arc::new(AtomicBool::new(false));
        let timer = {
            let (q, stop) = (Arc::clone(q), Arc::clone(&stop));
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                stop.store(true, Ordering::Relaxed);
                q.wake_all();
            })
        };
        let taken = q.take(slot, &stop, Duration::from_secs(60), || {});
        timer.join().unwrap();
        match taken {
            Taken::Turn(a) => Some(a.id.name.clone()),
            Taken::Stop => None,
        }
    }

    #[test]
    fn tenants_are_served_in_turn_whatever_their_queues_hold() {
        let q = Arc::new(RunQueue::new(shares(1, 1, 1, 60_000)));
        for i in 0..3 {
            q.push(actor("evil", &format!("e{i}")));
        }
        q.push(actor("good", "g0"));
        let mut order = Vec::new();
        for _ in 0..4 {
            let name = take_now(&q, 0).unwrap();
            q.done(0);
            order.push(name);
        }
        assert_eq!(order, ["e0", "g0", "e1", "e2"]);
    }

    #[test]
    fn a_tenant_runs_no_more_turns_than_its_share() {
        let q = Arc::new(RunQueue::new(shares(4, 4, 2, 60_000)));
        for i in 0..4 {
            q.push(actor("evil", &format!("e{i}")));
        }
        assert!(take_now(&q, 0).is_some());
        assert!(take_now(&q, 1).is_some());
        // Two running: the third waits though two threads are free.
        assert_eq!(take_now(&q, 2), None);
        q.push(actor("good", "g"));
        assert_eq!(take_now(&q, 2).as_deref(), Some("g"));
        q.done(0);
        assert!(take_now(&q, 0).unwrap().starts_with('e'));
    }

    #[test]
    fn a_long_turn_lets_a_spare_thread_run_another_tenant() {
        let q = Arc::new(RunQueue::new(shares(1, 2, 1, 300)));
        q.push(actor("evil", "e"));
        q.push(actor("good", "g"));
        let first = crate::clock::instant();
        assert_eq!(take_now(&q, 0).as_deref(), Some("e"));
        // Spare thread 1: nothing may start while the first turn is short;
        // once it has run past the slice, the other tenant's turn starts.
        let stop = AtomicBool::new(false);
        match q.take(1, &stop, Duration::from_secs(10), || {}) {
            Taken::Turn(a) => assert_eq!(a.id.name, "g"),
            Taken::Stop => panic!("stopped"),
        }
        assert!(
            first.elapsed() >= Duration::from_millis(300),
            "a spare started a turn beside a short one"
        );
    }

    #[test]
    fn without_long_turns_no_more_than_the_workers_run() {
        let q = Arc::new(RunQueue::new(shares(1, 3, 3, 60_000)));
        q.push(actor("a", "x"));
        q.push(actor("b", "y"));
        assert!(take_now(&q, 0).is_some());
        assert_eq!(
            take_now(&q, 1),
            None,
            "a spare ran a turn beside a short one"
        );
        q.done(0);
        assert!(take_now(&q, 1).is_some());
    }
}
