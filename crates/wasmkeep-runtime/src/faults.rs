//! Fault switches: what tests turn on to make the runtime fail at a chosen
//! point (a commit that fails, a process that dies after a commit, an
//! answer the network loses) or to run a safety rule's unsafe variant, so
//! that the test showing the rule matters can fail without it.
//!
//! They exist only in builds with the `test-faults` feature (the test kit
//! turns it on, and this crate's own unit tests have it). A node built
//! without it, as `wasmkeep` is for release, has a [`Faults`] with no
//! fields, whose every check is a constant `false` (or 0) the compiler
//! folds away: no switch can be flipped in production, by a bug or
//! otherwise. `cargo tree -e features -p wasmkeep` shows the feature off.
//!
//! Each switch is declared once, in the table below; a test sets it through
//! its public atomic (`runtime.faults().crash_after_commit.store(1, ..)`),
//! the runtime reads it through the method of the same name.

/// Declares the switches: counters (the next this many times), flags, and
/// one duration.
macro_rules! fault_switches {
    (
        counters { $($(#[$cdoc:meta])* $counter:ident,)* }
        flags { $($(#[$fdoc:meta])* $flag:ident,)* }
        millis { $($(#[$mdoc:meta])* $millis:ident,)* }
    ) => {
        /// The fault switches (see the module's documentation).
        #[cfg(any(test, feature = "test-faults"))]
        #[derive(Debug, Default)]
        pub struct Faults {
            $($(#[$cdoc])* pub $counter: std::sync::atomic::AtomicU32,)*
            $($(#[$fdoc])* pub $flag: std::sync::atomic::AtomicBool,)*
            $($(#[$mdoc])* pub $millis: std::sync::atomic::AtomicU64,)*
        }

        #[cfg(any(test, feature = "test-faults"))]
        impl Faults {
            /// Whether this build has fault switches at all.
            pub(crate) const COMPILED_IN: bool = true;
            $(
                /// Takes one unit of this counter, if any is left.
                pub(crate) fn $counter(&self) -> bool {
                    self.$counter
                        .fetch_update(
                            std::sync::atomic::Ordering::SeqCst,
                            std::sync::atomic::Ordering::SeqCst,
                            |n| n.checked_sub(1),
                        )
                        .is_ok()
                }
            )*
            $(
                /// Whether this flag is set.
                pub(crate) fn $flag(&self) -> bool {
                    self.$flag.load(std::sync::atomic::Ordering::Relaxed)
                }
            )*
            $(
                /// This duration, in milliseconds.
                pub(crate) fn $millis(&self) -> u64 {
                    self.$millis.load(std::sync::atomic::Ordering::Relaxed)
                }
            )*
        }

        /// The fault switches of a build without them: none is ever set.
        #[cfg(not(any(test, feature = "test-faults")))]
        #[derive(Debug, Default)]
        pub struct Faults {
            _none: (),
        }

        #[cfg(not(any(test, feature = "test-faults")))]
        impl Faults {
            /// Whether this build has fault switches at all.
            pub(crate) const COMPILED_IN: bool = false;
            $(
                #[inline(always)]
                pub(crate) fn $counter(&self) -> bool {
                    false
                }
            )*
            $(
                #[inline(always)]
                pub(crate) fn $flag(&self) -> bool {
                    false
                }
            )*
            $(
                #[inline(always)]
                pub(crate) fn $millis(&self) -> u64 {
                    0
                }
            )*
        }
    };
}

fault_switches! {
    counters {
        /// The next this many batches that run an alarm fail their commit.
        fail_alarm_commits,
        /// The next this many runs again of a suspended event fail before
        /// its handler runs, as a full outbox or a database error would
        /// (ADR 0056).
        fail_resumes,
        /// The next this many batches that carry a request commit, then lose
        /// their replies and their instance, as if the process died between
        /// the commit and the response.
        crash_after_commit,
        /// The next this many batches panic after their first event ran, as
        /// a bug in the runtime would (the worker survives it: `worker`).
        panic_in_batch,
        /// The next this many answers of receivers are lost on their way
        /// back, as a network would lose them: the message is delivered
        /// again.
        outbox_lose_answers,
        /// The next this many answers reach their sender twice.
        outbox_repeat_responses,
    }
    flags {
        /// Unsafe, for that test only: the closer frees the actor's slot
        /// before the old connection is closed.
        unsafe_close_outside_slot,
        /// Unsafe, for that test only: an alarm rehearsal commits what the
        /// handler wrote instead of rolling it back (ADR 0030).
        unsafe_rehearsal_commits,
        /// Unsafe, for that test only: deploys load compiled code from the
        /// cache without checking its tag (`compile_cache`).
        unsafe_trust_compile_cache,
        /// The outbox's dispatcher starts no delivery while set (rows wait).
        outbox_held,
        /// Unsafe, for that test only: rows go to the dispatcher as soon as
        /// an event wrote them, before the batch commits (ADR 0040's first
        /// rule).
        unsafe_outbox_before_commit,
        /// Unsafe, for that test only: a lane delivers its messages newest
        /// first, as if messages to one receiver had no order.
        unsafe_lanes_reversed,
        /// Unsafe, for that test only: a batch's rows go out once it is
        /// durable locally, without waiting for the bucket to hold it.
        unsafe_outbox_before_upload,
        /// Unsafe, for that test only: replies completed by an event that
        /// failed are sent all the same (ADR 0042).
        unsafe_completions_from_failed_events,
        /// Unsafe, for that test only: a replay's sandbox runs events on
        /// the live clock and the OS's random source instead of the
        /// recorded time and seed (ADR 0062).
        unsafe_replay_without_tape,
        /// Unsafe, for that test only: a batch that is not recorded leaves
        /// the actor's run of recording generations as it is (ADR 0062).
        unsafe_recording_keeps_run,
        /// Unsafe, for that test only: an actor whose last open ended with
        /// records still in memory goes on with its run of generations, as
        /// if none were lost (ADR 0067).
        unsafe_recording_ignores_unflushed,
        /// Unsafe, for that test only: a receiver runs `on-message` for a
        /// repeated delivery too (no `_wasmkeep_inbox` check).
        unsafe_inbox_no_dedup,
        /// Unsafe, for that test only: an answer's event reads its row
        /// without deleting it, so a second answer is applied too.
        unsafe_response_keeps_row,
        /// Unsafe, for that test only: an actor with a suspended event
        /// keeps taking its other events (no gate, ADR 0056), so they
        /// interleave with the wait.
        unsafe_await_without_gate,
        /// Unsafe, for that test only: an outbox resume opens an actor a
        /// cluster node does not hold (ADR 0020).
        unsafe_resume_unheld,
        /// While set, each batch's replies are held after its sync, as a
        /// slow disk would hold them (at most
        /// [`DURABILITY_HELD_MS_MAX`]): a give-up can then come between a
        /// batch's upload landing and its local sync.
        hold_durability,
        /// Unsafe, for that test only: a `replicated` request whose actor
        /// was given up before its batch was durable locally is answered
        /// `replication_failed` even if the bucket holds its batch.
        unsafe_fail_landed_after_give_up,
    }
    millis {
        /// The closer thread holds each evicted actor this long before
        /// closing it, to show that the actor's next turn waits for the
        /// close.
        close_delay_ms,
    }
}

/// The longest [`Faults::wait_while_durability_held`] holds a batch.
const DURABILITY_HELD_MS_MAX: u64 = 10_000;

impl Faults {
    /// Holds the caller (releasing a batch's replies: the durability
    /// stage's thread, or the worker when nothing waited for a sync) while
    /// `hold_durability` is set. Nothing in a build without fault switches.
    pub(crate) fn wait_while_durability_held(&self) {
        if !Self::COMPILED_IN || !self.hold_durability() {
            return;
        }
        let since = crate::clock::instant();
        while self.hold_durability()
            && since.elapsed() < std::time::Duration::from_millis(DURABILITY_HELD_MS_MAX)
        {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::Faults;

    #[test]
    fn a_counter_is_used_up_and_a_flag_reads_as_set() {
        let f = Faults::default();
        assert!(!f.crash_after_commit());
        f.crash_after_commit.store(2, Ordering::SeqCst);
        assert!(f.crash_after_commit() && f.crash_after_commit());
        assert!(!f.crash_after_commit());
        f.outbox_held.store(true, Ordering::SeqCst);
        assert!(f.outbox_held() && !f.unsafe_lanes_reversed());
    }
}
