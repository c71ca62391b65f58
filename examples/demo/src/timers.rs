//! `timers`: many named timers on the actor's one alarm
//! (`wasmkeep_sdk::timers`). Each fired timer is recorded with the time it
//! ran; a timer whose name starts with `fail` makes the alarm's first run
//! fail (the run rolls back, and the alarm's retry fires it again).
//!
//! - `POST /set?name=N&due_ms=T` with the payload as body: 204.
//! - `POST /cancel?name=N`: `{"cancelled":bool}`.
//! - `GET /timers`: `{"alarm_ms":T|null,"timers":[{"name","due_ms","payload"}]}`,
//!   earliest first.
//! - `GET /fired`: `{"fired":[{"name","due_ms","fired_ms","payload"}]}` in
//!   the order they ran.

use serde_json::json;
use wasmkeep_sdk::{Actor, AlarmInfo, Error, Request, Response, Result, alarm, now_ms, params, sql, timers};

#[derive(Default)]
pub struct Timers;

impl Actor for Timers {
    fn init(&mut self) -> Result<()> {
        sql::execute(
            "CREATE TABLE fired (seq INTEGER PRIMARY KEY, name TEXT NOT NULL, due_ms INTEGER NOT NULL, fired_ms INTEGER NOT NULL, payload TEXT NOT NULL)",
            &[],
        )?;
        Ok(())
    }

    fn request(&mut self, req: Request) -> Result<Response> {
        match req.route() {
            ("POST", "/set") => {
                let name = req
                    .query_param("name")
                    .ok_or_else(|| Error::bad_request("`name` is required"))?;
                let due = req
                    .query_u64("due_ms")?
                    .ok_or_else(|| Error::bad_request("`due_ms` is required"))?;
                timers::set(&name, due, &req.body)?;
                Ok(Response::status(204))
            }
            ("POST", "/cancel") => {
                let name = req
                    .query_param("name")
                    .ok_or_else(|| Error::bad_request("`name` is required"))?;
                let cancelled = timers::cancel(&name)?;
                Ok(Response::json(200, json!({ "cancelled": cancelled }).to_string()))
            }
            ("GET", "/timers") => {
                let list: Vec<_> = timers::list()?
                    .into_iter()
                    .map(|t| {
                        json!({
                            "name": t.name,
                            "due_ms": t.due_ms,
                            "payload": String::from_utf8_lossy(&t.payload),
                        })
                    })
                    .collect();
                let body = json!({ "alarm_ms": alarm::get(), "timers": list });
                Ok(Response::json(200, body.to_string()))
            }
            ("GET", "/fired") => {
                let rows = sql::query(
                    "SELECT name, due_ms, fired_ms, payload FROM fired ORDER BY seq",
                    &[],
                )?;
                let fired: Vec<_> = rows
                    .rows
                    .iter()
                    .map(|r| {
                        json!({
                            "name": r.text(0),
                            "due_ms": r.int(1),
                            "fired_ms": r.int(2),
                            "payload": r.text(3),
                        })
                    })
                    .collect();
                Ok(Response::json(200, json!({ "fired": fired }).to_string()))
            }
            _ => Ok(Response::not_found()),
        }
    }

    fn alarm(&mut self, info: AlarmInfo) -> Result<()> {
        let now = now_ms();
        for t in timers::take_due(now)? {
            if t.name.starts_with("fail") && info.retry_count == 0 {
                // Everything this run did rolls back, the taken timers
                // included: the retry finds them due again.
                return Err(Error::new(
                    "timer_failed",
                    format!("`{}` fails the first run", t.name),
                ));
            }
            sql::execute(
                "INSERT INTO fired (name, due_ms, fired_ms, payload) VALUES (?1, ?2, ?3, ?4)",
                params![
                    t.name.as_str(),
                    t.due_ms,
                    now,
                    String::from_utf8_lossy(&t.payload).into_owned()
                ],
            )?;
        }
        Ok(())
    }
}
