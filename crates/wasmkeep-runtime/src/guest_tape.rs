//! What a guest reads time and randomness through (ADR 0062).
//!
//! Normally an instance's guest reads the node's clock and the thread's
//! random generator. During an event that is recorded (an app with
//! `[recording]`, `crate::recording`) or replayed (`crate::replay`), its
//! clock stands still at the event's time and its random bytes come from
//! a generator seeded by the event: the two things a record must hold for
//! the event to run again the same way.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use rand::SeedableRng as _;
use rand::rngs::StdRng;

use crate::clock::Clock;

/// The clock an instance's guest reads: the node's, or, during an event
/// that records or replays, the event's time standing still.
pub(crate) struct GuestClock {
    node: Arc<dyn Clock>,
    /// 0: not frozen.
    frozen: AtomicU64,
}

impl GuestClock {
    pub(crate) fn new(node: Arc<dyn Clock>) -> GuestClock {
        GuestClock {
            node,
            frozen: AtomicU64::new(0),
        }
    }
}

impl Clock for GuestClock {
    fn now_ms(&self) -> u64 {
        match self.frozen.load(Ordering::Relaxed) {
            0 => self.node.now_ms(),
            t => t,
        }
    }
    fn is_real(&self) -> bool {
        self.node.is_real()
    }
}

/// The random source an instance's guest reads: the thread's generator,
/// or, during an event that records or replays, one seeded by the event.
#[derive(Clone, Default)]
pub(crate) struct GuestRandom(Arc<Mutex<Option<StdRng>>>);

impl GuestRandom {
    pub(crate) fn fill(&self, dst: &mut [u8]) {
        use rand::Rng as _;
        match self.0.lock().as_mut() {
            Some(seeded) => seeded.fill_bytes(dst),
            None => rand::rng().fill_bytes(dst),
        }
    }
}

impl rand::TryRng for GuestRandom {
    type Error = std::convert::Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        let mut b = [0; 4];
        self.fill(&mut b);
        Ok(u32::from_le_bytes(b))
    }
    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let mut b = [0; 8];
        self.fill(&mut b);
        Ok(u64::from_le_bytes(b))
    }
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        self.fill(dst);
        Ok(())
    }
}

impl rand::TryCryptoRng for GuestRandom {}

/// What an instance's guest reads time and randomness through.
#[derive(Clone)]
pub(crate) struct InstanceTape {
    pub clock: Arc<GuestClock>,
    pub random: GuestRandom,
}

/// The time and seed one event runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EventTape {
    pub at_ms: u64,
    pub seed: [u8; 32],
}

impl InstanceTape {
    pub(crate) fn new(node: Arc<dyn Clock>) -> InstanceTape {
        InstanceTape {
            clock: Arc::new(GuestClock::new(node)),
            random: GuestRandom::default(),
        }
    }

    pub(crate) fn play(&self, t: &EventTape) {
        self.clock.frozen.store(t.at_ms.max(1), Ordering::Relaxed);
        *self.random.0.lock() = Some(StdRng::from_seed(t.seed));
    }

    pub(crate) fn stop(&self) {
        self.clock.frozen.store(0, Ordering::Relaxed);
        *self.random.0.lock() = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_event_draws_the_same_bytes_again() {
        let tape = InstanceTape::new(Arc::new(crate::clock::ManualClock::new(5)));
        let t = EventTape {
            at_ms: 77,
            seed: [7; 32],
        };
        let mut a = [0u8; 16];
        let mut b = [0u8; 16];
        tape.play(&t);
        tape.random.fill(&mut a);
        assert_eq!(tape.clock.now_ms(), 77);
        tape.stop();
        assert_eq!(tape.clock.now_ms(), 5);
        tape.play(&t);
        tape.random.fill(&mut b);
        assert_eq!(a, b);
    }
}
