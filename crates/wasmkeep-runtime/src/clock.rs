//! The one source of time for a node.
//!
//! Everything in the runtime that needs "now" (alarms, the guest's clock,
//! lateness metrics) asks the node's [`Clock`]. Production uses
//! [`SystemClock`]; the test kit uses [`ManualClock`] and moves it by hand.
//!
//! Elapsed real time, which no test moves by hand (an event's CPU limit, a
//! turn's slice and time budget, the durations metrics report, waits
//! bounded in real seconds), comes from [`instant`]; the seeds of jitter
//! and of ids from [`wall_nanos`]. This module is the only place in the
//! runtime that reads the system's clocks (`clippy.toml` bans
//! `Instant::now` and `SystemTime::now` elsewhere).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Now, for measuring and bounding real elapsed time; never what an actor
/// or the cluster protocol sees as the time (that is [`Clock::now_ms`]).
#[allow(clippy::disallowed_methods, reason = "the runtime's clock module")]
pub fn instant() -> Instant {
    Instant::now()
}

/// The wall clock's nanoseconds since the Unix epoch: a seed for jitter
/// and for ids that differ between starts, not a time.
#[allow(clippy::disallowed_methods, reason = "the runtime's clock module")]
pub(crate) fn wall_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Unix time in milliseconds, as the node sees it.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
    /// Whether time moves by itself (a timer thread may sleep on it).
    fn is_real(&self) -> bool {
        true
    }
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods, reason = "the runtime's clock module")]
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock that stands still until told to move.
#[derive(Debug)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(start_ms: u64) -> Self {
        ManualClock(AtomicU64::new(start_ms))
    }

    /// Moves the clock forward (never back).
    pub fn advance_ms(&self, ms: u64) -> u64 {
        self.0.fetch_add(ms, Ordering::SeqCst) + ms
    }

    /// Sets the clock to `ms` if that is later than now.
    pub fn set_ms(&self, ms: u64) {
        self.0.fetch_max(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
    fn is_real(&self) -> bool {
        false
    }
}
