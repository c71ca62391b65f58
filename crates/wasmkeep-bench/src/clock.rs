//! The benchmark's readings of the system's clocks, the only ones in the
//! crate (`clippy.toml` bans `Instant::now` and `SystemTime::now`
//! elsewhere). A benchmark measures real time: nothing here is simulated.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Now, for latencies, durations and deadlines of the load.
#[allow(clippy::disallowed_methods, reason = "the benchmark's clock module")]
pub(crate) fn now() -> Instant {
    Instant::now()
}

/// The wall clock in milliseconds since the Unix epoch (alarm due times,
/// which the node compares with its own wall clock).
#[allow(clippy::disallowed_methods, reason = "the benchmark's clock module")]
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}
