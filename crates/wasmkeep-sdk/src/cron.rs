//! Recurring schedules from cron expressions, in a time zone, on the
//! actor's one alarm beside the [`timers`].
//!
//! A schedule is a row of the actor's database (table `wasmkeep_sdk_cron`,
//! written in the event's own transaction) holding its expression, its
//! IANA zone, a payload and its next run. The alarm is kept at the
//! earliest of every timer and every schedule's next run. In the alarm
//! handler, [`take_due`] returns the schedules whose run is due and moves
//! each to its following run; a handler that fails rolls that back, so the
//! runtime's retry returns the same runs: each run commits once, with the
//! handler's work.
//!
//! The node evaluates the expressions (the `cron` import: croner's
//! grammar, the IANA rules compiled into the node, the same for the
//! TypeScript SDK). Five fields, `minute hour day-of-month month
//! day-of-week`, or six with seconds first; `@hourly`, `@daily`, ...
//! Across daylight-saving changes: a local time that is skipped runs at
//! the first instant after the gap; one that occurs twice runs once (a
//! wildcard or step hour, `0 * * * *`, runs in both passes).
//!
//! **Missed runs.** When runs fall due while the actor cannot run (the
//! node was down, the alarm kept failing), they are not run one by one:
//! the next [`take_due`] returns one run per schedule, with `scheduled_ms`
//! the earliest missed time and `missed` the number of later times that
//! passed too, and the schedule moves to its first time after now. A
//! handler that must do each missed period's work has the count.
//!
//! **History.** The last [`HISTORY_MAX`] runs of each schedule that
//! committed are kept (`wasmkeep_sdk_cron_runs`), newest first from
//! [`history`].
//!
//! ```no_run
//! use wasmkeep_sdk::{Actor, AlarmInfo, Request, Response, Result, cron, now_ms};
//!
//! #[derive(Default)]
//! struct Reports;
//!
//! impl Actor for Reports {
//!     fn request(&mut self, _req: Request) -> Result<Response> {
//!         // Every weekday at 09:00 in Berlin, summer and winter.
//!         cron::schedule("daily-report", "0 9 * * MON-FRI", "Europe/Berlin", b"")?;
//!         Ok(Response::status(204))
//!     }
//!
//!     fn alarm(&mut self, _info: AlarmInfo) -> Result<()> {
//!         for run in cron::take_due(now_ms())? {
//!             wasmkeep_sdk::log::info(&format!(
//!                 "{} due at {} ({} missed)",
//!                 run.name, run.scheduled_ms, run.missed
//!             ));
//!         }
//!         Ok(())
//!     }
//! }
//! ```

use crate::timers::{self, DUE_PER_RUN_MAX};
use crate::{Error, Result, sql, wit};

/// Most schedules one actor keeps.
pub const SCHEDULES_MAX: i64 = 1_000;
/// Runs kept per schedule in its history.
pub const HISTORY_MAX: i64 = 20;
/// Missed times counted at most per run (a larger count reads as this).
pub const MISSED_COUNT_MAX: u32 = 1_000;

/// A recurring schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// Its name, unique among the actor's schedules.
    pub name: String,
    /// The cron expression.
    pub expression: String,
    /// The IANA time zone it is read in.
    pub zone: String,
    /// What [`schedule`] attached.
    pub payload: Vec<u8>,
    /// Its next run, unix milliseconds.
    pub next_ms: u64,
}

/// One run of a schedule, from [`take_due`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronRun {
    /// The schedule's name.
    pub name: String,
    /// The time this run was due (the earliest, if runs were missed).
    pub scheduled_ms: u64,
    /// How many later times of the schedule passed before this run
    /// (0 when on time; at most [`MISSED_COUNT_MAX`]).
    pub missed: u32,
    /// The schedule's payload.
    pub payload: Vec<u8>,
}

/// A committed run, from [`history`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PastRun {
    /// The time the run was due.
    pub scheduled_ms: u64,
    /// When it was taken (the node's clock in the handler).
    pub ran_ms: u64,
    /// Later times it stood for.
    pub missed: u32,
}

fn next_after(expression: &str, zone: &str, after_ms: u64) -> Result<u64> {
    wit::cron::next_after(expression, zone, after_ms)
}

fn schedule_of(row: &sql::Row) -> Schedule {
    Schedule {
        name: row.text(0).to_owned(),
        expression: row.text(1).to_owned(),
        zone: row.text(2).to_owned(),
        payload: row.blob(3).to_vec(),
        next_ms: row.int(4) as u64,
    }
}

const COLUMNS: &str = "name, expression, zone, payload, next_ms";

/// Schedules `name` (or replaces its expression, zone and payload) to run
/// at every time `expression` matches in `zone`; returns its first run.
/// Errors: `invalid_cron` (from the node: a bad expression or zone, or
/// one that never matches), `invalid_timer` for a name or payload past
/// the [timers'](crate::timers) limits, `too_many_schedules` past
/// [`SCHEDULES_MAX`].
pub fn schedule(name: &str, expression: &str, zone: &str, payload: &[u8]) -> Result<u64> {
    timers::check_name_and_payload(name, payload)?;
    let now = crate::now_ms();
    let next = next_after(expression, zone, now)?;
    timers::ensure_table()?;
    let exists = !sql::query(
        "SELECT 1 FROM wasmkeep_sdk_cron WHERE name = ?1",
        crate::params![name],
    )?
    .rows
    .is_empty();
    if !exists {
        let n = sql::query("SELECT count(*) FROM wasmkeep_sdk_cron", &[])?;
        if n.rows.first().map_or(0, |r| r.int(0)) >= SCHEDULES_MAX {
            return Err(Error::new(
                "too_many_schedules",
                format!(
                    "the actor already has schedules_max={SCHEDULES_MAX} schedules: cancel one first"
                ),
            ));
        }
    }
    sql::execute(
        "INSERT OR REPLACE INTO wasmkeep_sdk_cron (name, expression, zone, payload, next_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
        crate::params![name, expression, zone, payload.to_vec(), next as i64],
    )?;
    timers::rearm_unless_in_alarm()?;
    Ok(next)
}

/// Cancels the schedule `name` and forgets its history; returns whether
/// there was one.
pub fn cancel(name: &str) -> Result<bool> {
    timers::ensure_table()?;
    let n = sql::execute(
        "DELETE FROM wasmkeep_sdk_cron WHERE name = ?1",
        crate::params![name],
    )?;
    sql::execute(
        "DELETE FROM wasmkeep_sdk_cron_runs WHERE name = ?1",
        crate::params![name],
    )?;
    timers::rearm_unless_in_alarm()?;
    Ok(n > 0)
}

/// The schedule `name`, if any.
pub fn get(name: &str) -> Result<Option<Schedule>> {
    timers::ensure_table()?;
    let rows = sql::query(
        &format!("SELECT {COLUMNS} FROM wasmkeep_sdk_cron WHERE name = ?1"),
        crate::params![name],
    )?;
    Ok(rows.rows.first().map(schedule_of))
}

/// Every schedule, next run first (ties by name).
pub fn list() -> Result<Vec<Schedule>> {
    timers::ensure_table()?;
    let rows = sql::query(
        &format!("SELECT {COLUMNS} FROM wasmkeep_sdk_cron ORDER BY next_ms, name"),
        &[],
    )?;
    Ok(rows.rows.iter().map(schedule_of).collect())
}

/// The last committed runs of `name`, newest first.
pub fn history(name: &str) -> Result<Vec<PastRun>> {
    timers::ensure_table()?;
    let rows = sql::query(
        "SELECT scheduled_ms, ran_ms, missed FROM wasmkeep_sdk_cron_runs WHERE name = ?1 ORDER BY scheduled_ms DESC",
        crate::params![name],
    )?;
    Ok(rows
        .rows
        .iter()
        .map(|r| PastRun {
            scheduled_ms: r.int(0) as u64,
            ran_ms: r.int(1) as u64,
            missed: r.int(2) as u32,
        })
        .collect())
}

/// The runs due at `now_ms`, earliest first (at most
/// [`timers::DUE_PER_RUN_MAX`]); each schedule
/// moves to its first time after `now_ms` and the run enters its history.
/// Call it from the alarm handler: a handler that fails rolls this back.
pub fn take_due(now_ms: u64) -> Result<Vec<CronRun>> {
    timers::ensure_table()?;
    let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
    let rows = sql::query(
        &format!(
            "SELECT {COLUMNS} FROM wasmkeep_sdk_cron WHERE next_ms <= ?1 ORDER BY next_ms, name LIMIT ?2"
        ),
        crate::params![now, DUE_PER_RUN_MAX],
    )?;
    let mut runs = Vec::with_capacity(rows.rows.len());
    for s in rows.rows.iter().map(schedule_of) {
        let (missed, next) = skip_past(&s, now_ms)?;
        sql::execute(
            "UPDATE wasmkeep_sdk_cron SET next_ms = ?2 WHERE name = ?1",
            crate::params![s.name.as_str(), next as i64],
        )?;
        sql::execute(
            "INSERT OR REPLACE INTO wasmkeep_sdk_cron_runs (name, scheduled_ms, ran_ms, missed) VALUES (?1, ?2, ?3, ?4)",
            crate::params![s.name.as_str(), s.next_ms as i64, now, i64::from(missed)],
        )?;
        sql::execute(
            "DELETE FROM wasmkeep_sdk_cron_runs WHERE name = ?1 AND scheduled_ms NOT IN (SELECT scheduled_ms FROM wasmkeep_sdk_cron_runs WHERE name = ?1 ORDER BY scheduled_ms DESC LIMIT ?2)",
            crate::params![s.name.as_str(), HISTORY_MAX],
        )?;
        runs.push(CronRun {
            name: s.name,
            scheduled_ms: s.next_ms,
            missed,
            payload: s.payload,
        });
    }
    timers::rearm_unless_in_alarm()?;
    Ok(runs)
}

/// How many later times of `s` passed by `now_ms` (counted up to
/// [`MISSED_COUNT_MAX`]), and its first time after `now_ms`.
fn skip_past(s: &Schedule, now_ms: u64) -> Result<(u32, u64)> {
    let mut missed = 0;
    let mut t = next_after(&s.expression, &s.zone, s.next_ms)?;
    while t <= now_ms {
        if missed == MISSED_COUNT_MAX {
            return Ok((missed, next_after(&s.expression, &s.zone, now_ms)?));
        }
        missed += 1;
        t = next_after(&s.expression, &s.zone, t)?;
    }
    Ok((missed, t))
}
