//! The store's readings of the system's clocks, the only ones in the crate
//! (`clippy.toml` bans `Instant::now` and `SystemTime::now` elsewhere): the
//! instant statement deadlines count from, the wall time that names a
//! database set aside, and the instant a commit log cut's write-back is
//! bounded from.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The instant deadlines are counted from (the first reading).
#[allow(clippy::disallowed_methods, reason = "the store's clock module")]
pub(crate) fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Milliseconds since the Unix epoch.
#[allow(clippy::disallowed_methods, reason = "the store's clock module")]
pub(crate) fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// The current instant (a commit log cut's write-back, ADR 0080).
#[allow(clippy::disallowed_methods, reason = "the store's clock module")]
pub(crate) fn now() -> Instant {
    Instant::now()
}
