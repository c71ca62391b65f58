//! How much one call into a guest may write to the node's log.
//!
//! A guest's log lines go to the node's log, which every tenant shares; a
//! guest that logs in a loop would otherwise fill the operator's disk and
//! drown everyone else's lines. Each call into a guest (`on-init`,
//! `on-request`, `on-alarm`, `classes`) gets `event_log_lines_max` lines
//! and `event_log_bytes_max` bytes; past either, the call's further lines
//! are dropped, and when the call ends one line says how many were.

use wasmkeep_store::ActorId;

use crate::config::{EVENT_LOG_BYTES_MAX, EVENT_LOG_LINES_MAX};

/// One instance's log budget for the call running now.
#[derive(Debug)]
pub struct LogBudget {
    lines_max: u32,
    bytes_max: usize,
    lines: u32,
    bytes: usize,
    /// Set by the first line dropped: every later line of the call is
    /// dropped too, so the log never shows a call's lines with a gap.
    exhausted: bool,
    dropped_lines: u64,
    dropped_bytes: u64,
}

impl Default for LogBudget {
    fn default() -> Self {
        LogBudget::new(EVENT_LOG_LINES_MAX, EVENT_LOG_BYTES_MAX)
    }
}

impl LogBudget {
    pub fn new(lines_max: u32, bytes_max: usize) -> LogBudget {
        LogBudget {
            lines_max,
            bytes_max,
            lines: 0,
            bytes: 0,
            exhausted: false,
            dropped_lines: 0,
            dropped_bytes: 0,
        }
    }

    /// Counts a line of `len` bytes; whether it may be written.
    pub fn admit(&mut self, len: usize) -> bool {
        let bytes = self.bytes.saturating_add(len);
        if self.exhausted || self.lines >= self.lines_max || bytes > self.bytes_max {
            self.exhausted = true;
            self.dropped_lines += 1;
            self.dropped_bytes += len as u64;
            return false;
        }
        self.lines += 1;
        self.bytes = bytes;
        true
    }

    /// Ends a call: logs one line saying what was dropped, if anything, and
    /// starts the next call's budget. Returns the number of lines dropped.
    pub fn finish_call(&mut self, actor: &ActorId) -> u64 {
        let dropped = self.dropped_lines;
        if dropped > 0 {
            tracing::warn!(
                target: "guest",
                %actor,
                "{}",
                self.dropped_message()
            );
        }
        *self = LogBudget::new(self.lines_max, self.bytes_max);
        dropped
    }

    fn dropped_message(&self) -> String {
        format!(
            "log lines dropped: the call wrote past its budget: dropped_lines={} dropped_bytes={} limit event_log_lines_max={} event_log_bytes_max={}",
            self.dropped_lines, self.dropped_bytes, self.lines_max, self.bytes_max
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> ActorId {
        ActorId::new("t", "a", "c", "n").unwrap()
    }

    #[test]
    fn lines_past_the_line_budget_are_dropped_and_counted() {
        let mut b = LogBudget::new(3, 1000);
        let admitted = (0..10).filter(|_| b.admit(10)).count();
        assert_eq!(admitted, 3);
        assert_eq!(b.dropped_lines, 7);
        assert!(
            b.dropped_message()
                .contains("dropped_lines=7 dropped_bytes=70")
        );
        assert_eq!(b.finish_call(&id()), 7);
        // The next call starts afresh.
        assert!(b.admit(10));
        assert_eq!(b.finish_call(&id()), 0);
    }

    /// Counts the events logged under the guests' target on this thread.
    #[derive(Default, Clone)]
    struct GuestLines(std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl tracing::Subscriber for GuestLines {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            if event.metadata().target() == "guest" {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[test]
    fn lines_past_the_budget_never_reach_the_log_but_a_panic_is_still_reported() {
        use crate::host::HostState;
        use crate::host::wasmkeep::actor::log::{Host, Level};
        let clock = std::sync::Arc::new(crate::clock::ManualClock::new(0));
        let mut state = HostState::new(None, id(), clock, 1 << 20);
        state.log_budget = LogBudget::new(2, 1000);
        let lines = GuestLines::default();
        tracing::subscriber::with_default(lines.clone(), || {
            for _ in 0..5 {
                state.log(Level::Info, "noise".into());
            }
            state.log(Level::Error, "panic: the real reason".into());
            assert_eq!(state.log_budget.finish_call(&id()), 4);
        });
        // Two lines within the budget, and the one that counts the rest.
        assert_eq!(lines.0.load(std::sync::atomic::Ordering::Relaxed), 3);
        assert_eq!(state.panic_message.as_deref(), Some("the real reason"));
    }

    #[test]
    fn once_the_byte_budget_is_spent_even_short_lines_are_dropped() {
        let mut b = LogBudget::new(100, 25);
        assert!(b.admit(10));
        assert!(b.admit(10));
        assert!(!b.admit(10), "30 bytes is past 25");
        assert!(!b.admit(1), "no gap: later lines go too");
        assert_eq!(b.finish_call(&id()), 2);
    }
}
