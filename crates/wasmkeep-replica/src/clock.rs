//! The one clock the replica reads: elapsed time for the collection grace
//! of ADR 0007, never the time of day.

use std::time::Duration;

/// Time since the machine booted, suspend included (`CLOCK_BOOTTIME`).
///
/// Only differences of two readings mean anything. A suspended or paused
/// process can only make a difference larger than the real one, which is
/// the safe direction for both uses: a writer that measures a longer
/// silence checks more, and a collector that measures a longer age
/// deletes later.
#[cfg(target_os = "linux")]
pub(crate) fn since_boot() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on
    // every Linux since 2.6.39.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Elsewhere (the node itself is Linux-only, ADR 0004; this keeps the
/// crate building for tools): a monotonic clock from the first reading,
/// which may not count time the machine spent suspended.
#[cfg(not(target_os = "linux"))]
#[allow(clippy::disallowed_methods, reason = "the replica's clock module")]
pub(crate) fn since_boot() -> Duration {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}
