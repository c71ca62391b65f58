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
//!
//! Cron schedules (`wasmkeep_sdk::cron`) share the alarm:
//! - `POST /cron?name=N&expr=E&zone=Z`: `{"next_ms":T}`.
//! - `POST /cron/cancel?name=N`: `{"cancelled":bool}`.
//! - `GET /cron`: `{"schedules":[{"name","expression","zone","next_ms"}]}`.
//! - `GET /cron/runs`: `{"runs":[{"name","scheduled_ms","ran_ms","missed"}]}`
//!   in the order they ran; `GET /cron/history?name=N`: the SDK's history
//!   of N, newest first.

use serde_json::json;
use wasmkeep_sdk::{
    Actor, AlarmInfo, Error, Request, Response, Result, alarm, cron, now_ms, params, sql, timers,
};

#[derive(Default)]
pub struct Timers;

impl Actor for Timers {
    fn init(&mut self) -> Result<()> {
        sql::execute(
            "CREATE TABLE fired (seq INTEGER PRIMARY KEY, name TEXT NOT NULL, due_ms INTEGER NOT NULL, fired_ms INTEGER NOT NULL, payload TEXT NOT NULL)",
            &[],
        )?;
        sql::execute(
            "CREATE TABLE cron_runs (seq INTEGER PRIMARY KEY, name TEXT NOT NULL, scheduled_ms INTEGER NOT NULL, ran_ms INTEGER NOT NULL, missed INTEGER NOT NULL)",
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
            (_, path) if path.starts_with("/cron") => cron_request(&req),
            _ => Ok(Response::not_found()),
        }
    }

    fn alarm(&mut self, info: AlarmInfo) -> Result<()> {
        let now = now_ms();
        for run in cron::take_due(now)? {
            sql::execute(
                "INSERT INTO cron_runs (name, scheduled_ms, ran_ms, missed) VALUES (?1, ?2, ?3, ?4)",
                params![run.name.as_str(), run.scheduled_ms, now, u64::from(run.missed)],
            )?;
        }
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

fn name_of(req: &Request) -> Result<String> {
    req.query_param("name")
        .ok_or_else(|| Error::bad_request("`name` is required"))
}

fn cron_request(req: &Request) -> Result<Response> {
    let body = match req.route() {
        ("POST", "/cron") => {
            let expr = req
                .query_param("expr")
                .ok_or_else(|| Error::bad_request("`expr` is required"))?;
            let zone = req.query_param("zone").unwrap_or_else(|| "UTC".into());
            let next = cron::schedule(&name_of(req)?, &expr, &zone, &req.body)?;
            json!({ "next_ms": next })
        }
        ("POST", "/cron/cancel") => json!({ "cancelled": cron::cancel(&name_of(req)?)? }),
        ("GET", "/cron") => {
            let list: Vec<_> = cron::list()?
                .into_iter()
                .map(|s| json!({"name": s.name, "expression": s.expression, "zone": s.zone, "next_ms": s.next_ms}))
                .collect();
            json!({ "schedules": list })
        }
        ("GET", "/cron/runs") => {
            let rows = sql::query(
                "SELECT name, scheduled_ms, ran_ms, missed FROM cron_runs ORDER BY seq",
                &[],
            )?;
            let runs: Vec<_> = rows
                .rows
                .iter()
                .map(|r| json!({"name": r.text(0), "scheduled_ms": r.int(1), "ran_ms": r.int(2), "missed": r.int(3)}))
                .collect();
            json!({ "runs": runs })
        }
        ("GET", "/cron/history") => {
            let runs: Vec<_> = cron::history(&name_of(req)?)?
                .into_iter()
                .map(|r| json!({"scheduled_ms": r.scheduled_ms, "ran_ms": r.ran_ms, "missed": r.missed}))
                .collect();
            json!({ "history": runs })
        }
        _ => return Ok(Response::not_found()),
    };
    Ok(Response::json(200, body.to_string()))
}
