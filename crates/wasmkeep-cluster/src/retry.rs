//! The committed-retry rule for failing alarms (ADR 0009, "Retries are
//! committed"): the one rule a node's runtime commits and the simulator
//! checks.
//!
//! When `on-alarm` fails, its changes roll back and the alarm is set by this
//! rule in the same transaction: whatever alarm the handler left due before
//! the retry time (the same one, or one it set for sooner) moves to the
//! retry time; one it set later, or a clear, stands. The failure count is
//! committed with the alarm, so the backoff survives restarts and moves
//! with the actor to another node. Past the app's `retries_max`, an alarm
//! that would move to its retry time is dropped instead.

use crate::ClusterConfig;

/// The retry settings in force for one app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The backoff after the first failure.
    pub first_ms: u64,
    /// The longest backoff.
    pub max_ms: u64,
    /// Retries after the first failure before the alarm is dropped;
    /// `None`: never dropped.
    pub retries_max: Option<u32>,
}

impl RetryPolicy {
    /// The cluster protocol's backoff, with no retry limit.
    pub fn from_config(config: &ClusterConfig) -> RetryPolicy {
        RetryPolicy {
            first_ms: config.retry_first_ms,
            max_ms: config.retry_max_ms,
            retries_max: None,
        }
    }

    /// The backoff after the `failures`-th consecutive failure (1 for the
    /// first): `first_ms`, doubling, at most `max_ms`, without overflow.
    pub fn delay_ms(&self, failures: u32) -> u64 {
        let shift = failures.saturating_sub(1).min(63);
        let factor = 1u64.checked_shl(shift).unwrap_or(u64::MAX);
        self.first_ms.saturating_mul(factor).min(self.max_ms)
    }
}

/// The alarm an `on-alarm` run commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlarmOutcome {
    /// The alarm to commit (`None`: none).
    pub at_ms: Option<u64>,
    /// The failure count committed with it.
    pub retry_count: u32,
    /// The alarm was dropped because its retries ran out (`retries_max`).
    pub dropped: bool,
}

/// What a run of `on-alarm` commits. `left_at_ms` is the alarm the handler
/// left (the one that ran if it did not touch it, `None` if it cleared it);
/// `retry_count_before` the failures committed with the alarm that ran. On
/// success the handler's alarm stands and the count resets.
pub fn after_alarm_run(
    policy: &RetryPolicy,
    succeeded: bool,
    left_at_ms: Option<u64>,
    retry_count_before: u32,
    now_ms: u64,
) -> AlarmOutcome {
    if succeeded {
        return AlarmOutcome {
            at_ms: left_at_ms,
            retry_count: 0,
            dropped: false,
        };
    }
    let failures = retry_count_before.saturating_add(1);
    let retry_at = now_ms.saturating_add(policy.delay_ms(failures));
    match left_at_ms {
        Some(at) if at < retry_at => {
            let dropped = policy.retries_max.is_some_and(|m| failures > m);
            AlarmOutcome {
                at_ms: (!dropped).then_some(retry_at),
                retry_count: failures,
                dropped,
            }
        }
        other => AlarmOutcome {
            at_ms: other,
            retry_count: failures,
            dropped: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: RetryPolicy = RetryPolicy {
        first_ms: 1_000,
        max_ms: 300_000,
        retries_max: None,
    };

    fn failed(left: Option<u64>, before: u32, now: u64, p: &RetryPolicy) -> (Option<u64>, u32) {
        let out = after_alarm_run(p, false, left, before, now);
        (out.at_ms, out.retry_count)
    }

    #[test]
    fn backoff_doubles_from_one_second_to_the_cap() {
        let d: Vec<u64> = (1..=12).map(|n| P.delay_ms(n)).collect();
        assert_eq!(
            d,
            [
                1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000, 256000, 300000, 300000, 300000
            ]
        );
        assert_eq!(P.delay_ms(u32::MAX), 300_000);
        assert_eq!(P.delay_ms(0), 1_000, "0 counts as the first");
        let huge = RetryPolicy {
            first_ms: u64::MAX / 2,
            max_ms: u64::MAX,
            retries_max: None,
        };
        assert_eq!(huge.delay_ms(200), u64::MAX, "saturates, never wraps");
    }

    #[test]
    fn the_alarm_left_due_moves_to_the_retry_time() {
        assert_eq!(failed(Some(50), 0, 100, &P), (Some(1_100), 1));
        assert_eq!(failed(Some(50), 3, 100, &P), (Some(8_100), 4));
        // One the handler set for now moves too.
        assert_eq!(failed(Some(100), 2, 100, &P), (Some(4_100), 3));
        assert_eq!(failed(Some(u64::MAX), 0, u64::MAX, &P).0, Some(u64::MAX));
    }

    #[test]
    fn a_later_alarm_or_a_clear_stands() {
        assert_eq!(failed(Some(99_000), 2, 100, &P), (Some(99_000), 3));
        assert_eq!(failed(None, 2, 100, &P), (None, 3));
    }

    #[test]
    fn success_keeps_the_handlers_alarm_and_resets_the_count() {
        let out = after_alarm_run(&P, true, Some(5), 4, 100);
        assert_eq!(
            (out.at_ms, out.retry_count, out.dropped),
            (Some(5), 0, false)
        );
    }

    #[test]
    fn a_retry_limit_drops_the_alarm_when_the_last_retry_fails() {
        let p = RetryPolicy {
            retries_max: Some(2),
            ..P
        };
        assert_eq!(failed(Some(0), 0, 0, &p).0, Some(1_000));
        assert_eq!(failed(Some(0), 1, 0, &p).0, Some(2_000));
        let out = after_alarm_run(&p, false, Some(0), 2, 0);
        assert_eq!((out.at_ms, out.dropped), (None, true));
        // A later alarm the handler set stands past the limit.
        assert_eq!(failed(Some(90_000), 2, 0, &p).0, Some(90_000));
    }
}
