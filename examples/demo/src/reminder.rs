//! `reminder`: alarms, used by tests, the acceptance checks and the W2
//! benchmark.
//!
//! - `POST /set?at_ms=T[&fail_times=K][&every_ms=P&count=N]`: set the alarm
//!   for T (unix ms). `on-alarm` fails while its retry count is below K.
//!   With `every_ms`, a successful run re-arms at the previous due time plus
//!   P, measured from the fixed anchor T (never from "now"), until N runs
//!   have succeeded.
//! - `GET /alarm`: `{"alarm":T}` or `{"alarm":null}` (during retries: the
//!   next attempt). `DELETE /alarm` clears it.
//! - `GET /fired`: every successful run,
//!   `{"fired":[{"due_ms","fired_ms","retry_count","is_retry","alarm_in_handler"}]}`;
//!   `alarm_in_handler` is what get-alarm returned at the start of the
//!   handler (null, unless something is wrong).

use serde_json::json;
use wasmkeep_sdk::{Actor, AlarmInfo, Error, Request, Response, Result, alarm, now_ms, params, sql};

#[derive(Default)]
pub struct Reminder;

impl Actor for Reminder {
    fn init(&mut self) -> Result<()> {
        sql::execute(
            "CREATE TABLE plan (id INTEGER PRIMARY KEY CHECK (id = 0), anchor_ms INTEGER NOT NULL, fail_times INTEGER NOT NULL, every_ms INTEGER NOT NULL, count INTEGER NOT NULL, runs_ok INTEGER NOT NULL)",
            &[],
        )?;
        sql::execute(
            "CREATE TABLE fired (seq INTEGER PRIMARY KEY, due_ms INTEGER NOT NULL, fired_ms INTEGER NOT NULL, retry_count INTEGER NOT NULL, is_retry INTEGER NOT NULL, alarm_in_handler INTEGER)",
            &[],
        )?;
        Ok(())
    }

    fn request(&mut self, req: Request) -> Result<Response> {
        match req.route() {
            ("POST", "/set") => {
                let at = req
                    .query_u64("at_ms")?
                    .ok_or_else(|| Error::bad_request("query parameter `at_ms` is required"))?;
                let fail_times = req.query_u64("fail_times")?.unwrap_or(0);
                let every_ms = req.query_u64("every_ms")?.unwrap_or(0);
                let count = req.query_u64("count")?.unwrap_or(1).max(1);
                sql::execute(
                    "INSERT OR REPLACE INTO plan VALUES (0, ?1, ?2, ?3, ?4, 0)",
                    params![at, fail_times, every_ms, count],
                )?;
                alarm::set(at)?;
                Ok(Response::json(200, json!({ "alarm": at }).to_string()))
            }
            ("GET", "/alarm") => Ok(Response::json(200, json!({ "alarm": alarm::get() }).to_string())),
            ("DELETE", "/alarm") => {
                alarm::delete();
                Ok(Response::json(200, json!({ "alarm": null }).to_string()))
            }
            ("GET", "/fired") => {
                let rows = sql::query(
                    "SELECT due_ms, fired_ms, retry_count, is_retry, alarm_in_handler FROM fired ORDER BY seq",
                    &[],
                )?;
                let fired: Vec<_> = rows
                    .rows
                    .iter()
                    .map(|r| {
                        json!({
                            "due_ms": r.int(0),
                            "fired_ms": r.int(1),
                            "retry_count": r.int(2),
                            "is_retry": r.int(3) != 0,
                            "alarm_in_handler": r.opt_int(4),
                        })
                    })
                    .collect();
                Ok(Response::json(200, json!({ "fired": fired }).to_string()))
            }
            _ => Ok(Response::not_found()),
        }
    }

    fn alarm(&mut self, info: AlarmInfo) -> Result<()> {
        let in_handler = alarm::get();
        let plan = sql::query(
            "SELECT anchor_ms, fail_times, every_ms, count, runs_ok FROM plan WHERE id = 0",
            &[],
        )?;
        let (anchor, fail_times, every, count, runs_ok) = match plan.rows.first() {
            Some(r) => (r.int(0), r.int(1), r.int(2), r.int(3), r.int(4)),
            None => (info.scheduled_ms as i64, 0, 0, 1, 0),
        };
        if (info.retry_count as i64) < fail_times {
            return Err(Error::new(
                "planned_failure",
                format!("failing as asked: retry {} of {fail_times}", info.retry_count),
            ));
        }
        sql::execute(
            "INSERT INTO fired (due_ms, fired_ms, retry_count, is_retry, alarm_in_handler) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![info.scheduled_ms, now_ms(), info.retry_count as i64, info.is_retry, in_handler],
        )?;
        let runs_ok = runs_ok + 1;
        sql::execute("UPDATE plan SET runs_ok = ?1 WHERE id = 0", params![runs_ok])?;
        if every > 0 && runs_ok < count {
            // From the fixed anchor: a late run does not push the schedule.
            alarm::set((anchor + runs_ok * every) as u64)?;
        }
        Ok(())
    }
}
