//! The actor's one alarm: a single time, in unix milliseconds, at which
//! the node runs [`Actor::alarm`](crate::Actor::alarm).
//!
//! - [`set`] replaces the time and [`delete`] clears it; both are part of
//!   the event's transaction (a rolled-back event changes nothing). A time
//!   in the past fires as soon as the event commits.
//! - Delivery is at least once, never before the due time. An alarm never
//!   creates an actor, and deleting an actor deletes its alarm.
//! - Inside the alarm handler, [`get`] returns `None` unless the handler
//!   set a new alarm: the one that fired is used up.
//! - A handler that fails is retried with a backoff (see
//!   [`AlarmInfo`](crate::AlarmInfo)); outside the handler, [`get`] then
//!   returns the next attempt's time. If the failing handler set an alarm
//!   for that retry's time or later, or deleted it, its choice stands; any
//!   other `set` starts a fresh backoff.
//!
//! For several deadlines, use [`timers`](crate::timers), which keep the
//! alarm at the earliest of them; do not call [`set`] in an actor that
//! uses timers.
//!
//! ```no_run
//! use wasmkeep_sdk::{Actor, AlarmInfo, Request, Response, Result, alarm, now_ms, sql};
//!
//! #[derive(Default)]
//! struct Watch;
//!
//! impl Actor for Watch {
//!     fn request(&mut self, _req: Request) -> Result<Response> {
//!         if alarm::get().is_none() {
//!             alarm::set(now_ms() + 3_600_000)?; // in an hour
//!         }
//!         Ok(Response::status(204))
//!     }
//!
//!     fn alarm(&mut self, _info: AlarmInfo) -> Result<()> {
//!         sql::execute("INSERT INTO checks (at) VALUES (?1)", wasmkeep_sdk::params![now_ms()])?;
//!         // The alarm that fired is used up: set the next one.
//!         alarm::set(now_ms() + 3_600_000)
//!     }
//! }
//! ```

use crate::{Result, wit};

/// Sets (or replaces) the alarm, at `at_ms` unix milliseconds.
///
/// Fails with `invalid_argument` for a time after the year 9999
/// (253,402,300,799,999 ms).
pub fn set(at_ms: u64) -> Result<()> {
    wit::alarm::set_alarm(at_ms)
}

/// The pending alarm's time, if any. Inside the alarm handler: only an
/// alarm the handler set.
pub fn get() -> Option<u64> {
    wit::alarm::get_alarm()
}

/// Clears the alarm, if any (in the event's transaction). If the node
/// cannot record it, the event fails.
pub fn delete() {
    wit::alarm::delete_alarm()
}
