//! The answer to one event, which answers by itself when a panic unwinds
//! past it.
//!
//! A worker that panics in the middle of an actor's batch (a bug: guests
//! trap, they do not panic the host) drops the batch's events while it
//! unwinds. Without this, their callers would only see their answer
//! channel close, which means "the node is shutting down" everywhere else;
//! with it, each hears an internal error that says what happened. The
//! worker survives the panic (see `runtime::worker`).

use tokio::sync::oneshot;

use crate::actor::Outcome;
use crate::error::RuntimeError;

/// What a caller hears about an event dropped unanswered while its worker
/// unwound from a panic.
pub(crate) const WORKER_PANICKED: &str = "a worker panicked while running this actor's batch (a bug; the node's log has the panic): the batch's writes were rolled back unless it had committed, and the actor's instance was dropped";

/// Where one event's outcome goes.
#[derive(Debug)]
pub struct Reply(Option<oneshot::Sender<Result<Outcome, RuntimeError>>>);

impl Reply {
    pub fn new(tx: oneshot::Sender<Result<Outcome, RuntimeError>>) -> Reply {
        Reply(Some(tx))
    }

    /// Sends the outcome; gives it back if nobody waits any more.
    pub fn send(
        mut self,
        out: Result<Outcome, RuntimeError>,
    ) -> Result<(), Result<Outcome, RuntimeError>> {
        match self.0.take() {
            Some(tx) => tx.send(out),
            None => Err(out),
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        // Dropped unanswered outside a panic (the node stopping): the
        // caller sees the channel close, as before.
        if let Some(tx) = self.0.take()
            && std::thread::panicking()
        {
            let _ = tx.send(Err(RuntimeError::Internal(WORKER_PANICKED.into())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_dropped_by_a_panic_answers_with_an_internal_error() {
        let (tx, mut rx) = oneshot::channel();
        let reply = Reply::new(tx);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _held = reply;
            panic!("a bug");
        }));
        assert!(r.is_err());
        match rx.try_recv() {
            Ok(Err(RuntimeError::Internal(m))) => assert_eq!(m, WORKER_PANICKED),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_reply_dropped_otherwise_just_closes() {
        let (tx, mut rx) = oneshot::channel();
        drop(Reply::new(tx));
        assert!(matches!(
            rx.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
    }
}
