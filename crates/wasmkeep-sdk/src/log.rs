//! Lines in the node's log, under the target `guest` with the actor's
//! address. (A guest's stdout and stderr are discarded.)
//!
//! Each line is cut at 4 KiB, and one call into the actor may write at
//! most `event_log_lines_max` lines (1,000 by default) and
//! `event_log_bytes_max` bytes (256 KiB); the node drops the rest and
//! logs how many it dropped. A secret's value in a line is replaced by
//! `[secret]`. Lines are written at once, even for an event that then
//! fails, except in an alarm rehearsal, whose lines are dropped.
//!
//! ```no_run
//! use wasmkeep_sdk::log;
//!
//! log::info("started");
//! log::warn(&format!("retrying {} for the {}th time", "job-7", 3));
//! ```

use crate::wit::log::{Level, log};

/// Logs `message` at level info.
pub fn info(message: &str) {
    log(Level::Info, message)
}

/// Logs `message` at level warn.
pub fn warn(message: &str) {
    log(Level::Warn, message)
}

/// Logs `message` at level error.
pub fn error(message: &str) {
    log(Level::Error, message)
}

/// Logs `message` at level debug (shown only if the node's `WASMKEEP_LOG`
/// lets debug lines of target `guest` through).
pub fn debug(message: &str) {
    log(Level::Debug, message)
}
