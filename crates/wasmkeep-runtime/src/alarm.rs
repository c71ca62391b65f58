//! The committed-retry rule for failing alarms (ADR 0009, "Retries are
//! committed"), as a pure function.
//!
//! When `on-alarm` fails, its changes roll back, and then the alarm is set
//! by this rule in the same transaction: whatever alarm the handler left due
//! before the retry time (the same one, or one it set for sooner) moves to
//! the retry time; one it set later, or a clear, stands. The failure count
//! is stored with the alarm, so the backoff survives restarts.

use wasmkeep_store::AlarmState;

use crate::host::AlarmOp;

/// How long to wait after the `retry_count`-th consecutive failure:
/// `first_ms`, doubling, at most `max_ms`.
pub fn retry_delay_ms(retry_count: u32, first_ms: u64, max_ms: u64) -> u64 {
    let factor = 1u64.checked_shl(retry_count.min(63)).unwrap_or(u64::MAX);
    first_ms.saturating_mul(factor).min(max_ms)
}

/// The retry settings in force for one app.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub first_ms: u64,
    pub max_ms: u64,
    /// Retries after the first failure before the alarm is dropped;
    /// `None`: never.
    pub retries_max: Option<u32>,
}

/// What the alarm becomes after a failed run.
///
/// `original` is the alarm as committed before the run (its `retry_count`
/// failures so far); `op` is what the handler did to the alarm before it
/// failed. Returns the alarm to commit, or `None` to clear it.
pub fn after_failure(
    original: AlarmState,
    op: AlarmOp,
    now_ms: u64,
    policy: RetryPolicy,
) -> Option<AlarmState> {
    let failures = original.retry_count.saturating_add(1);
    let retry_at = now_ms.saturating_add(retry_delay_ms(
        original.retry_count,
        policy.first_ms,
        policy.max_ms,
    ));
    let give_up = policy.retries_max.is_some_and(|m| failures > m);
    match op {
        AlarmOp::Cleared => None,
        AlarmOp::Set(at) if at >= retry_at => Some(AlarmState {
            at_ms: at,
            retry_count: failures,
        }),
        AlarmOp::Untouched | AlarmOp::Set(_) => {
            if give_up {
                None
            } else {
                Some(AlarmState {
                    at_ms: retry_at,
                    retry_count: failures,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: RetryPolicy = RetryPolicy {
        first_ms: 1000,
        max_ms: 300_000,
        retries_max: None,
    };

    fn a(at_ms: u64, retry_count: u32) -> AlarmState {
        AlarmState { at_ms, retry_count }
    }

    #[test]
    fn backoff_doubles_from_one_second_to_the_cap() {
        let d: Vec<u64> = (0..12).map(|n| retry_delay_ms(n, 1000, 300_000)).collect();
        assert_eq!(
            d,
            [
                1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000, 256000, 300000, 300000, 300000
            ]
        );
        assert_eq!(retry_delay_ms(200, 1000, 300_000), 300_000);
    }

    #[test]
    fn an_untouched_alarm_moves_to_the_retry_time() {
        assert_eq!(
            after_failure(a(50, 0), AlarmOp::Untouched, 100, P),
            Some(a(1100, 1))
        );
        assert_eq!(
            after_failure(a(50, 3), AlarmOp::Untouched, 100, P),
            Some(a(8100, 4))
        );
    }

    #[test]
    fn a_handler_that_reschedules_for_now_and_fails_still_backs_off() {
        assert_eq!(
            after_failure(a(50, 2), AlarmOp::Set(100), 100, P),
            Some(a(4100, 3))
        );
    }

    #[test]
    fn a_later_alarm_or_a_clear_stands() {
        assert_eq!(
            after_failure(a(50, 2), AlarmOp::Set(99_000), 100, P),
            Some(a(99_000, 3))
        );
        assert_eq!(after_failure(a(50, 2), AlarmOp::Cleared, 100, P), None);
    }

    #[test]
    fn a_retry_limit_drops_the_alarm_when_the_last_retry_fails() {
        let p = RetryPolicy {
            retries_max: Some(2),
            ..P
        };
        assert!(after_failure(a(0, 0), AlarmOp::Untouched, 0, p).is_some());
        assert!(after_failure(a(0, 1), AlarmOp::Untouched, 0, p).is_some());
        assert_eq!(after_failure(a(0, 2), AlarmOp::Untouched, 0, p), None);
    }
}
