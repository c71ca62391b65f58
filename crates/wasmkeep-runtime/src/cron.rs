//! The `cron` import (issue 36): the next run of a cron expression in a
//! time zone, for both SDKs' recurring schedules.
//!
//! The grammar is croner's (five fields, or six with seconds first; lists,
//! ranges, steps, names, `L`, `W`, `#`, `@daily`, ...; day of month and
//! day of week match when either does, as in Vixie cron) and the zones are
//! chrono-tz's copy of the IANA database, compiled into the node: a
//! schedule reads the same on every node of a cluster, whatever the
//! machines have installed.
//!
//! Daylight saving, croner's rules (those of the OCI cron spec): a local
//! time a change skips fires at the first instant after the gap; a local
//! time that occurs twice fires once, at its first occurrence, unless the
//! hour field is a wildcard or a step (`0 * * * *` fires in both hours).
//! One rule is this module's: the answer is always strictly after
//! `after_ms`. croner, asked from inside a repeated hour, can answer the
//! first occurrence of a fixed time, which lies before the question; the
//! search then goes on from that occurrence, so a fixed time never fires
//! twice.

use std::str::FromStr;

use chrono::{DateTime, FixedOffset, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use croner::{Cron, JobType};

/// Longest expression, in bytes.
pub const CRON_EXPRESSION_BYTES_MAX: usize = 256;
/// Longest zone name, in bytes (the IANA's longest is 32).
pub const CRON_ZONE_BYTES_MAX: usize = 64;
/// The latest instant a schedule may name: the year 9999 (chrono's range
/// is wider; a guest's u64 milliseconds are not).
const LATEST_MS: u64 = 253_402_300_799_999;

/// Why an expression or zone was refused (code `invalid_cron`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronRefused(pub String);

/// The first instant strictly after `after_ms` that `expression` matches
/// in `zone`.
pub fn next_after(expression: &str, zone: &str, after_ms: u64) -> Result<u64, CronRefused> {
    if expression.len() > CRON_EXPRESSION_BYTES_MAX {
        return Err(CronRefused(format!(
            "the expression is {} bytes, over CRON_EXPRESSION_BYTES_MAX={CRON_EXPRESSION_BYTES_MAX}",
            expression.len()
        )));
    }
    if zone.len() > CRON_ZONE_BYTES_MAX {
        return Err(CronRefused(format!(
            "the zone name is {} bytes, over CRON_ZONE_BYTES_MAX={CRON_ZONE_BYTES_MAX}",
            zone.len()
        )));
    }
    let tz = Tz::from_str(zone).map_err(|_| {
        CronRefused(format!(
            "unknown time zone `{zone}`: use an IANA name such as `UTC` or `Europe/Berlin`"
        ))
    })?;
    let cron = Cron::from_str(expression)
        .map_err(|e| CronRefused(format!("`{expression}` is not a cron expression: {e}")))?;
    let after = i64::try_from(after_ms.min(LATEST_MS)).unwrap_or(i64::MAX);
    // croner keeps the fraction of a second it starts from: it starts
    // from the whole second (matches are whole seconds, so none is lost).
    let mut from: DateTime<Tz> = Utc
        .timestamp_millis_opt(after - after.rem_euclid(1000))
        .single()
        .ok_or_else(|| CronRefused(format!("after_ms={after_ms} is out of range")))?
        .with_timezone(&tz);
    let interval = cron.determine_job_type() == JobType::IntervalWildcard;
    let no_run =
        |e: croner::errors::CronError| CronRefused(format!("`{expression}` has no next run: {e}"));
    // At most two rounds: the second only after a repeated hour's first
    // occurrence came back (see the module's documentation).
    for _ in 0..3 {
        let next = cron.find_next_occurrence(&from, false).map_err(no_run)?;
        let ms = next.timestamp_millis();
        let found = if ms > after {
            // croner searches local times forward, so from before a
            // fall-back it jumps over the repeated hour's second pass,
            // where a wildcard hour matches again.
            match interval && offset_s(&tz, after) > offset_s(&tz, ms) {
                true => second_pass(&cron, &tz, after, ms)?.unwrap_or(ms),
                false => ms,
            }
        } else {
            // The first occurrence of a repeated local time: a wildcard
            // hour takes its second, a fixed time searches on from it.
            let later = tz.from_local_datetime(&next.naive_local()).latest();
            match later.map(|l| l.timestamp_millis()) {
                Some(l) if interval && l > after => l,
                _ => {
                    from = next;
                    continue;
                }
            }
        };
        return u64::try_from(found)
            .ok()
            .filter(|ms| *ms <= LATEST_MS)
            .ok_or_else(|| CronRefused(format!("`{expression}` has no run before year 10000")));
    }
    Err(CronRefused(format!(
        "`{expression}` has no run after {after_ms} in {zone}"
    )))
}

/// The zone's offset from UTC at instant `ms`, in seconds.
fn offset_s(tz: &Tz, ms: i64) -> i32 {
    match Utc.timestamp_millis_opt(ms).single() {
        Some(t) => tz
            .offset_from_utc_datetime(&t.naive_utc())
            .fix()
            .local_minus_utc(),
        None => 0,
    }
}

/// The first match in the second pass through a repeated hour that lies
/// between `after` (before the fall-back) and `next` (croner's answer,
/// after it), if any: the fall-back instant is found by halving, and the
/// second pass searched at its fixed offset.
fn second_pass(cron: &Cron, tz: &Tz, after: i64, next: i64) -> Result<Option<i64>, CronRefused> {
    let before = offset_s(tz, after);
    let (mut lo, mut hi) = (after, next);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match offset_s(tz, mid) == before {
            true => lo = mid,
            false => hi = mid,
        }
    }
    let Some(fixed) = FixedOffset::east_opt(offset_s(tz, hi)) else {
        return Ok(None);
    };
    let start_ms = (hi - 1) - (hi - 1).rem_euclid(1000);
    let Some(start) = fixed.timestamp_millis_opt(start_ms).single() else {
        return Ok(None);
    };
    let Ok(candidate) = cron.find_next_occurrence(&start, false) else {
        return Ok(None);
    };
    let c = candidate.timestamp_millis();
    Ok((c > after && c < next).then_some(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix milliseconds of a local wall-clock time in `zone` (the first,
    /// if it occurs twice).
    fn local(zone: &str, y: i32, mo: u32, d: u32, h: u32, mi: u32) -> u64 {
        let tz = Tz::from_str(zone).unwrap();
        tz.with_ymd_and_hms(y, mo, d, h, mi, 0)
            .earliest()
            .unwrap()
            .timestamp_millis() as u64
    }

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> u64 {
        local("UTC", y, mo, d, h, mi)
    }

    #[test]
    fn a_daily_time_follows_its_zone_across_both_changes_of_the_year() {
        // 09:00 in Berlin is 08:00 UTC in winter, 07:00 UTC in summer.
        let e = "0 9 * * *";
        let z = "Europe/Berlin";
        assert_eq!(
            next_after(e, z, utc(2026, 3, 28, 12, 0)).unwrap(),
            utc(2026, 3, 29, 7, 0)
        );
        assert_eq!(
            next_after(e, z, utc(2026, 3, 27, 12, 0)).unwrap(),
            utc(2026, 3, 28, 8, 0)
        );
        assert_eq!(
            next_after(e, z, utc(2026, 10, 24, 12, 0)).unwrap(),
            utc(2026, 10, 25, 8, 0)
        );
    }

    #[test]
    fn a_skipped_local_time_fires_right_after_the_gap_and_a_repeated_one_once() {
        let z = "Europe/Berlin";
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist.
        let gap = next_after("30 2 * * *", z, local(z, 2026, 3, 29, 1, 0)).unwrap();
        assert_eq!(gap, local(z, 2026, 3, 29, 3, 0));
        // 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 occurs twice.
        let first = next_after("30 2 * * *", z, local(z, 2026, 10, 25, 1, 0)).unwrap();
        assert_eq!(first, local(z, 2026, 10, 25, 2, 30));
        let second = next_after("30 2 * * *", z, first).unwrap();
        assert_eq!(second, local(z, 2026, 10, 26, 2, 30), "once, not twice");
        // Asked from inside the repeated hour (02:10 CET, after the first
        // 02:30), the answer is still ahead: the next day.
        // (02:30 CEST is 00:30 UTC, 02:10 CET is 01:10 UTC.)
        let in_second_hour = first + 40 * 60_000;
        let n = next_after("30 2 * * *", z, in_second_hour).unwrap();
        assert!(n > in_second_hour);
        assert_eq!(n, local(z, 2026, 10, 26, 2, 30));
        // An hourly job fires in both of the repeated hours.
        let a = next_after("0 * * * *", z, local(z, 2026, 10, 25, 1, 30)).unwrap();
        let b = next_after("0 * * * *", z, a).unwrap();
        let c = next_after("0 * * * *", z, b).unwrap();
        assert_eq!((b - a, c - b), (3_600_000, 3_600_000));
    }

    #[test]
    fn bad_expressions_and_zones_are_refused_naming_what_is_wrong() {
        let now = utc(2026, 1, 1, 0, 0);
        assert!(
            next_after("61 * * * *", "UTC", now)
                .unwrap_err()
                .0
                .contains("not a cron")
        );
        assert!(
            next_after("0 9 * * *", "Mars/Olympus", now)
                .unwrap_err()
                .0
                .contains("Mars/Olympus")
        );
        let long = "* ".repeat(200);
        assert!(
            next_after(&long, "UTC", now)
                .unwrap_err()
                .0
                .contains("CRON_EXPRESSION_BYTES_MAX")
        );
        assert!(
            next_after("0 0 30 2 *", "UTC", now).is_err(),
            "February 30 never comes"
        );
    }

    #[test]
    fn seconds_and_shorthands_are_understood() {
        let now = utc(2026, 1, 1, 0, 0);
        assert_eq!(
            next_after("*/15 * * * * *", "UTC", now).unwrap(),
            now + 15_000
        );
        assert_eq!(next_after("@hourly", "UTC", now).unwrap(), now + 3_600_000);
        // A fraction of a second in the question is not in the answer.
        assert_eq!(
            next_after("@hourly", "UTC", now + 1_234).unwrap(),
            now + 3_600_000
        );
        assert_eq!(
            next_after("0 0 * * MON", "UTC", now).unwrap(),
            utc(2026, 1, 5, 0, 0)
        );
    }
}
