//! Points in the actor's own history, and going back to one (issue 36),
//! as Durable Objects' `getBookmarkForTime` and
//! `onNextSessionRestoreBookmark`.
//!
//! A bookmark names a state the bucket keeps, so bookmarks need a node
//! with a bucket (`no_bucket` otherwise) and reach back as far as the
//! bucket's retention. [`restore_on_next_start`] returns an undo bookmark
//! at once; the restore itself runs once this event has committed and the
//! bucket holds it, as the actor's next event (events already queued run
//! first, on the current state). Keep a bookmark in the database or a
//! response: it is plain text.
//!
//! ```no_run
//! use wasmkeep_sdk::{Response, Result, bookmarks, now_ms};
//!
//! fn undo_last_hour() -> Result<Response> {
//!     let before = bookmarks::for_time(now_ms() - 3_600_000)?;
//!     let undo = bookmarks::restore_on_next_start(&before)?;
//!     // `undo` brings back the state this restore replaces.
//!     Ok(Response::json(202, format!("{{\"undo\":\"{undo}\"}}")))
//! }
//! ```

use crate::{Result, wit};

/// A bookmark for the state as of now (to the millisecond).
pub fn current() -> Result<String> {
    wit::bookmarks::current()
}

/// A bookmark for the state at `at_ms` (unix milliseconds, not in the
/// future).
pub fn for_time(at_ms: u64) -> Result<String> {
    wit::bookmarks::for_time(at_ms)
}

/// Once this event commits, the actor goes back to `bookmark`; returns the
/// bookmark that undoes it. Errors: `invalid_bookmark`,
/// `bookmark_not_found`, `no_bucket`.
pub fn restore_on_next_start(bookmark: &str) -> Result<String> {
    wit::bookmarks::restore_on_next_start(bookmark)
}
