//! The `bookmarks` import (issue 36): a guest names points of its own
//! history and asks to go back to one, as Durable Objects'
//! `getBookmarkForTime` and `onNextSessionRestoreBookmark` do.
//!
//! A bookmark is text: `t:<unix ms>` (the state the bucket's chain held
//! at that time: its entries committed at or before it, `At::TimeMs`) or
//! `u:<token>` (an undo bookmark). `restore-on-next-start` only records
//! the wish in the event; once the event commits and the bucket holds it,
//! the node reads the state at the bookmark from the bucket and restores
//! it as the actor's next event, through the operator's restore
//! (`crate::restore`: flush, swap, upload as the next entry). That
//! restore event also writes `bookmark_undo:<token>` = the chain's head
//! before it into the restored image, so the undo bookmark handed to the
//! guest names exactly the state the restore replaced.

use std::sync::atomic::{AtomicUsize, Ordering};

use wasmkeep_replica::At;

use crate::host::HostState;
use crate::host::WitError;
use crate::host::wasmkeep::actor::bookmarks;

/// Restores to a bookmark the node reads from the bucket at once, at most
/// (each a thread reading an actor's chain): past it, asking is refused
/// with `too_many_restores`, retryable.
pub(crate) const BOOKMARK_RESTORES_MAX: usize = 4;

/// Restores to a bookmark being read now.
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Takes one of the [`BOOKMARK_RESTORES_MAX`] places; `false` if none is
/// left.
pub(crate) fn begin_restore() -> bool {
    RUNNING
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < BOOKMARK_RESTORES_MAX).then_some(n + 1)
        })
        .is_ok()
}

/// Gives a place back.
pub(crate) fn end_restore() {
    RUNNING.fetch_sub(1, Ordering::SeqCst);
}

/// A restore an event asked for, applied after its commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRestore {
    /// The state to go back to.
    pub at: At,
    /// The undo bookmark's token, recorded by the restore.
    pub undo_token: String,
}

/// The meta key that maps an undo token to the chain's seq it names.
pub(crate) fn undo_key(token: &str) -> String {
    format!("bookmark_undo:{token}")
}

fn err(code: &str, message: impl Into<String>) -> WitError {
    WitError {
        code: code.into(),
        message: message.into(),
    }
}

impl HostState {
    fn needs_bucket(&self) -> Result<(), WitError> {
        if self.bucket {
            Ok(())
        } else {
            Err(err(
                "no_bucket",
                "bookmarks name states the bucket keeps: this node runs without one (`serve --bucket`)",
            ))
        }
    }

    /// The point a bookmark names in this actor's history.
    fn resolve(&mut self, bookmark: &str) -> Result<At, WitError> {
        if let Some(ms) = bookmark.strip_prefix("t:") {
            return ms.parse::<u64>().map(At::TimeMs).map_err(|_| {
                err(
                    "invalid_bookmark",
                    format!("`{bookmark}` is not a bookmark"),
                )
            });
        }
        let Some(token) = bookmark.strip_prefix("u:") else {
            return Err(err(
                "invalid_bookmark",
                format!("`{bookmark}` is not a bookmark (`t:<ms>` or `u:<token>`)"),
            ));
        };
        if token.is_empty() || token.len() > 64 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(err(
                "invalid_bookmark",
                format!("`{bookmark}` is not a bookmark"),
            ));
        }
        let found = self
            .db()?
            .meta_get(&undo_key(token))
            .map_err(|e| err(e.code(), e.to_string()))?;
        match found.and_then(|v| v.parse::<u64>().ok()) {
            Some(seq) => Ok(At::Seq(seq)),
            None => Err(err(
                "bookmark_not_found",
                format!(
                    "`{bookmark}` is not known to this database: its restore has not run yet, or it belongs to another point of the history"
                ),
            )),
        }
    }
}

impl bookmarks::Host for HostState {
    fn current(&mut self) -> Result<String, WitError> {
        self.needs_bucket()?;
        Ok(format!("t:{}", self.clock.now_ms()))
    }

    fn for_time(&mut self, at_ms: u64) -> Result<String, WitError> {
        self.needs_bucket()?;
        let now = self.clock.now_ms();
        if at_ms > now {
            return Err(err(
                "invalid_bookmark",
                format!("{at_ms} is in the future (now {now})"),
            ));
        }
        Ok(format!("t:{at_ms}"))
    }

    fn restore_on_next_start(&mut self, bookmark: String) -> Result<String, WitError> {
        self.needs_bucket()?;
        if RUNNING.load(Ordering::SeqCst) >= BOOKMARK_RESTORES_MAX {
            return Err(err(
                "too_many_restores",
                format!(
                    "the node is reading {BOOKMARK_RESTORES_MAX} bookmarks' states already (limit BOOKMARK_RESTORES_MAX); retry later"
                ),
            ));
        }
        let at = self.resolve(&bookmark)?;
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(|e| err("internal", e.to_string()))?;
        let token = hex::encode(raw);
        self.restore = Some(PendingRestore {
            at,
            undo_token: token.clone(),
        });
        Ok(format!("u:{token}"))
    }
}
