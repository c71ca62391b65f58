//! Many named timers on the actor's one alarm.
//!
//! An actor has a single alarm; an object that needs several deadlines (a
//! ring that times out, a watch that fires every hour, a reminder) would
//! otherwise share it by hand, and one job setting the alarm for its own
//! time can postpone another's (the second seed's bug). These timers live
//! in the actor's database (table `wasmkeep_sdk_timers`, written in the
//! event's own transaction, so a rolled-back event sets or cancels
//! nothing) and the alarm is always kept at the earliest of them: setting a
//! later timer never moves it, an earlier one brings it forward.
//!
//! In the alarm handler, [`take_due`] removes and returns the timers that
//! are due, earliest first. The alarm is re-armed for the next timer once
//! the handler returned `Ok` (timers set or cancelled during the run are
//! counted too); if the handler fails, its rollback puts the timers back
//! and the alarm is left alone, so the runtime's retry (with its backoff)
//! runs them again. The alarm's guarantees carry over: a timer fires at
//! least once, never early. Do not set the alarm with
//! [`alarm::set`] in an actor that uses timers: the two
//! would overwrite each other.
//!
//! Limits: [`TIMERS_MAX`] timers per actor (`too_many_timers`),
//! [`NAME_BYTES_MAX`] and [`PAYLOAD_BYTES_MAX`] (`invalid_timer`), at most
//! [`DUE_PER_RUN_MAX`] taken per run.
//!
//! ```no_run
//! use wasmkeep_sdk::{Actor, AlarmInfo, Request, Response, Result, now_ms, timers};
//!
//! #[derive(Default)]
//! struct Rings;
//!
//! impl Actor for Rings {
//!     fn request(&mut self, req: Request) -> Result<Response> {
//!         match req.route() {
//!             ("POST", "/ring") => {
//!                 timers::set("ring-timeout", now_ms() + 30_000, b"booking-17")?;
//!                 Ok(Response::status(204))
//!             }
//!             ("POST", "/answer") => {
//!                 timers::cancel("ring-timeout")?;
//!                 Ok(Response::status(204))
//!             }
//!             _ => Ok(Response::not_found()),
//!         }
//!     }
//!
//!     fn alarm(&mut self, _info: AlarmInfo) -> Result<()> {
//!         for t in timers::take_due(now_ms())? {
//!             match t.name.as_str() {
//!                 "ring-timeout" => { /* t.payload is b"booking-17" */ }
//!                 _ => {}
//!             }
//!         }
//!         Ok(())
//!     }
//! }
//! ```

use crate::{Error, Result, alarm, sql};

/// Most timers one actor keeps.
pub const TIMERS_MAX: i64 = 10_000;
/// Longest timer name, in bytes.
pub const NAME_BYTES_MAX: usize = 256;
/// Largest payload, in bytes.
pub const PAYLOAD_BYTES_MAX: usize = 64 * 1024;
/// Most timers one [`take_due`] returns; the alarm is re-armed at once
/// (in the past) for the rest.
pub const DUE_PER_RUN_MAX: i64 = 1_000;

/// A pending (or, from [`take_due`], due) timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timer {
    /// Its name, unique in the actor.
    pub name: String,
    /// When it is due, in unix milliseconds.
    pub due_ms: u64,
    /// What [`set`] attached.
    pub payload: Vec<u8>,
}

use std::sync::atomic::{AtomicBool, Ordering};

/// An alarm run is under way: the alarm is re-armed after it, not
/// during it (a run that fails must leave it as it was, so the runtime
/// retries the run with its backoff instead of keeping a later timer's
/// time or none).
static IN_ALARM: AtomicBool = AtomicBool::new(false);
/// This run used the timers: re-arm after it.
static TOUCHED: AtomicBool = AtomicBool::new(false);

/// Runs the class's alarm handler (`app!` calls this), then, if it
/// succeeded and used the timers, sets the alarm to the earliest one.
#[doc(hidden)]
pub fn __alarm_run(run: impl FnOnce() -> Result<()>) -> Result<()> {
    IN_ALARM.store(true, Ordering::Relaxed);
    TOUCHED.store(false, Ordering::Relaxed);
    let r = run();
    IN_ALARM.store(false, Ordering::Relaxed);
    if r.is_ok() && TOUCHED.swap(false, Ordering::Relaxed) {
        rearm()?;
    }
    r
}

/// The tables of the timers, the [`cron`](crate::cron) schedules and the
/// [`workflow`](crate::workflow) instances, which share the alarm: all
/// exist once any is used.
const TABLES: [&str; 8] = [
    "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_timers (name TEXT PRIMARY KEY, due_ms INTEGER NOT NULL, payload BLOB NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS wasmkeep_sdk_timers_due ON wasmkeep_sdk_timers (due_ms, name)",
    "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_cron (name TEXT PRIMARY KEY, expression TEXT NOT NULL, zone TEXT NOT NULL, payload BLOB NOT NULL, next_ms INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS wasmkeep_sdk_cron_next ON wasmkeep_sdk_cron (next_ms, name)",
    "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_cron_runs (name TEXT NOT NULL, scheduled_ms INTEGER NOT NULL, ran_ms INTEGER NOT NULL, missed INTEGER NOT NULL, PRIMARY KEY (name, scheduled_ms)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_workflows (id TEXT PRIMARY KEY, workflow TEXT NOT NULL, state TEXT NOT NULL, step INTEGER NOT NULL, failures INTEGER NOT NULL, wake_ms INTEGER, error TEXT, gen INTEGER NOT NULL, input TEXT NOT NULL, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_workflow_steps (id TEXT NOT NULL, step INTEGER NOT NULL, name TEXT NOT NULL, result TEXT NOT NULL, attempts INTEGER NOT NULL, done_ms INTEGER NOT NULL, PRIMARY KEY (id, step)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_workflow_events (id TEXT NOT NULL, event TEXT NOT NULL, payload TEXT NOT NULL, PRIMARY KEY (id, event)) WITHOUT ROWID",
];

pub(crate) fn ensure_table() -> Result<()> {
    TOUCHED.store(true, Ordering::Relaxed);
    for t in TABLES {
        sql::execute(t, &[])?;
    }
    Ok(())
}

fn timer(row: &sql::Row) -> Timer {
    Timer {
        name: row.text(0).to_owned(),
        due_ms: row.int(1) as u64,
        payload: row.blob(2).to_vec(),
    }
}

/// Keeps the alarm at the earliest timer, or none (after the run, in
/// an alarm run).
pub(crate) fn rearm_unless_in_alarm() -> Result<()> {
    if IN_ALARM.load(Ordering::Relaxed) {
        return Ok(());
    }
    rearm()
}

fn rearm() -> Result<()> {
    let rows = sql::query(
        "SELECT min(m) FROM (SELECT min(due_ms) AS m FROM wasmkeep_sdk_timers UNION ALL SELECT min(next_ms) FROM wasmkeep_sdk_cron UNION ALL SELECT min(wake_ms) FROM wasmkeep_sdk_workflows WHERE state IN ('sleeping', 'waiting', 'retrying', 'calling'))",
        &[],
    )?;
    match rows.rows.first().and_then(|r| r.opt_int(0)) {
        Some(due) if alarm::get() != Some(due as u64) => alarm::set(due as u64),
        Some(_) => Ok(()),
        None => {
            alarm::delete();
            Ok(())
        }
    }
}

/// The name and payload limits of timers and cron schedules alike.
pub(crate) fn check_name_and_payload(name: &str, payload: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(Error::new(
            "invalid_timer",
            format!(
                "a timer name is 1 to {NAME_BYTES_MAX} bytes (name_bytes_max): got {}",
                name.len()
            ),
        ));
    }
    if payload.len() > PAYLOAD_BYTES_MAX {
        return Err(Error::new(
            "invalid_timer",
            format!(
                "timer `{name}`: payload of {} bytes is over payload_bytes_max={PAYLOAD_BYTES_MAX}",
                payload.len()
            ),
        ));
    }
    Ok(())
}

/// Sets the timer `name` (or moves it, replacing its payload) to fire
/// at `due_ms` (unix milliseconds). Errors: `invalid_timer` for a name
/// that is empty or longer than [`NAME_BYTES_MAX`], or a payload over
/// [`PAYLOAD_BYTES_MAX`]; `too_many_timers` past [`TIMERS_MAX`].
///
/// ```no_run
/// use wasmkeep_sdk::{now_ms, timers};
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// timers::set("reminder/42", now_ms() + 86_400_000, b"call Ada")?;
/// # Ok(()) }
/// ```
pub fn set(name: &str, due_ms: u64, payload: &[u8]) -> Result<()> {
    check_name_and_payload(name, payload)?;
    ensure_table()?;
    let due = i64::try_from(due_ms).map_err(|_| {
        Error::new(
            "invalid_timer",
            format!("timer `{name}`: due_ms={due_ms} is out of range"),
        )
    })?;
    let exists = !sql::query(
        "SELECT 1 FROM wasmkeep_sdk_timers WHERE name = ?1",
        crate::params![name],
    )?
    .rows
    .is_empty();
    if !exists {
        let n = sql::query("SELECT count(*) FROM wasmkeep_sdk_timers", &[])?;
        if n.rows.first().map_or(0, |r| r.int(0)) >= TIMERS_MAX {
            return Err(Error::new(
                "too_many_timers",
                format!("the actor already has timers_max={TIMERS_MAX} timers: cancel one first"),
            ));
        }
    }
    sql::execute(
        "INSERT OR REPLACE INTO wasmkeep_sdk_timers (name, due_ms, payload) VALUES (?1, ?2, ?3)",
        crate::params![name, due, payload.to_vec()],
    )?;
    rearm_unless_in_alarm()
}

/// Cancels the timer `name`; returns whether there was one.
pub fn cancel(name: &str) -> Result<bool> {
    ensure_table()?;
    let n = sql::execute(
        "DELETE FROM wasmkeep_sdk_timers WHERE name = ?1",
        crate::params![name],
    )?;
    rearm()?;
    Ok(n > 0)
}

/// The timer `name`, if it is pending.
///
/// ```no_run
/// use wasmkeep_sdk::timers;
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// if let Some(t) = timers::get("reminder/42")? {
///     wasmkeep_sdk::log::info(&format!("due at {}", t.due_ms));
/// }
/// # Ok(()) }
/// ```
pub fn get(name: &str) -> Result<Option<Timer>> {
    ensure_table()?;
    let rows = sql::query(
        "SELECT name, due_ms, payload FROM wasmkeep_sdk_timers WHERE name = ?1",
        crate::params![name],
    )?;
    Ok(rows.rows.first().map(timer))
}

/// Every pending timer, earliest first (ties by name).
pub fn list() -> Result<Vec<Timer>> {
    ensure_table()?;
    let rows = sql::query(
        "SELECT name, due_ms, payload FROM wasmkeep_sdk_timers ORDER BY due_ms, name",
        &[],
    )?;
    Ok(rows.rows.iter().map(timer).collect())
}

/// Removes and returns the timers due at `now_ms`, earliest first (at
/// most [`DUE_PER_RUN_MAX`]). Call it from the alarm handler: the alarm
/// is re-armed for the next timer once the handler succeeded, and a
/// handler that fails rolls this back with everything else, so the
/// timers fire again on the runtime's retry.
///
/// ```no_run
/// use wasmkeep_sdk::{now_ms, timers};
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// for t in timers::take_due(now_ms())? {
///     wasmkeep_sdk::log::info(&format!("timer {} was due at {}", t.name, t.due_ms));
/// }
/// # Ok(()) }
/// ```
pub fn take_due(now_ms: u64) -> Result<Vec<Timer>> {
    ensure_table()?;
    let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
    let rows = sql::query(
        "DELETE FROM wasmkeep_sdk_timers WHERE name IN (SELECT name FROM wasmkeep_sdk_timers WHERE due_ms <= ?1 ORDER BY due_ms, name LIMIT ?2) RETURNING name, due_ms, payload",
        crate::params![now, DUE_PER_RUN_MAX],
    )?;
    let mut due: Vec<Timer> = rows.rows.iter().map(timer).collect();
    // RETURNING gives no order: earliest first, as documented.
    due.sort_by(|a, b| (a.due_ms, &a.name).cmp(&(b.due_ms, &b.name)));
    rearm_unless_in_alarm()?;
    Ok(due)
}
