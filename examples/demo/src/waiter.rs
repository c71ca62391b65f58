//! `waiter`: waits for answers inside its handlers (`wasmkeep_sdk::awaits`,
//! ADR 0056). Nothing else of a waiter runs while it waits; each note it
//! writes before a wait is written once, however many times the handler
//! ran.
//!
//! - `POST /add?name=N&by=K[&within=MS]`: notes `before add`, waits for
//!   tally `N`'s `add(K)`, notes `after add T`; answers
//!   `{"total":T,"notes":C}` (C: the notes it holds now).
//! - `POST /twice?name=N`: waits for `add(1)`, then `add(2)`; answers
//!   `{"first":A,"second":B}`.
//! - `POST /fetch?url=U[&within=MS]` (or `GET`, for one waiter to call
//!   another): waits for a GET of `U` (the app's
//!   `[outbound] hosts` must allow it): `{"status":S,"body":B}`.
//! - `POST /self`: waits for its own answer (refused: `await_deadlock`).
//! - `POST /behind?name=N`: sends tally `N` an `add(1)` through the outbox,
//!   then waits for another (refused: `await_lane_busy`).
//! - `POST /nondet?name=N`: waits for `add(R)`, R the runs of this route
//!   the instance made: a second run asks for another call
//!   (`await_nondeterministic`), the mistake the rule catches.
//! - `POST /ask?to=N`: waits for waiter `N`'s answer to a message:
//!   `{"answer":A}`; a waiter answers a message with `hello from NAME`.
//! - `POST /arm?name=N&by=K`: sets its alarm for now; `alarm` waits for
//!   tally `N`'s `add(K)` and notes `alarm T`.
//! - `GET /notes`: `{"notes":[{"what":W,"at_ms":T}]}` in order.

use serde_json::json;
use wasmkeep_sdk::{
    Actor, AlarmInfo, Error, Request, Response, Result, alarm, awaits, outbox, params, sql,
};

use crate::calls::tally_api;

#[derive(Default)]
pub struct Waiter {
    /// Runs of `/nondet` this instance made: memory, which a run does
    /// not roll back and the next run does not repeat.
    runs: i64,
}

fn note(what: &str) -> Result<()> {
    sql::execute(
        "INSERT INTO notes (what, at_ms) VALUES (?1, ?2)",
        params![what, wasmkeep_sdk::now_ms() as i64],
    )?;
    Ok(())
}

fn tally(req: &Request) -> Result<tally_api::Client> {
    let name = req
        .query_param("name")
        .ok_or_else(|| Error::bad_request("`name` is required"))?;
    Ok(tally_api::Client::to("tally", &name))
}

fn within(req: &Request) -> Result<u32> {
    Ok(req.query_u64("within")?.unwrap_or(0).min(u64::from(u32::MAX)) as u32)
}

impl Actor for Waiter {
    fn init(&mut self) -> Result<()> {
        sql::execute(
            "CREATE TABLE notes (id INTEGER PRIMARY KEY, what TEXT NOT NULL, at_ms INTEGER NOT NULL)",
            &[],
        )?;
        sql::execute(
            "CREATE TABLE armed (id INTEGER PRIMARY KEY CHECK (id = 0), name TEXT NOT NULL, by INTEGER NOT NULL)",
            &[],
        )?;
        Ok(())
    }

    fn request(&mut self, req: Request) -> Result<Response> {
        match req.route() {
            ("POST", "/add") => {
                let by: i64 = req
                    .query_param("by")
                    .and_then(|b| b.parse().ok())
                    .ok_or_else(|| Error::bad_request("`by` is an integer"))?;
                note("before add")?;
                let total = tally(&req)?.wait().within(within(&req)?).add(by)?;
                note(&format!("after add {total}"))?;
                let notes = sql::query("SELECT count(*) FROM notes", &[])?.rows[0].int(0);
                Ok(Response::json(200, json!({ "total": total, "notes": notes }).to_string()))
            }
            ("POST", "/twice") => {
                let t = tally(&req)?;
                let first = t.wait().add(1)?;
                let second = t.wait().add(2)?;
                Ok(Response::json(200, json!({ "first": first, "second": second }).to_string()))
            }
            ("GET" | "POST", "/fetch") => {
                let url = req
                    .query_param("url")
                    .ok_or_else(|| Error::bad_request("`url` is required"))?;
                note("before fetch")?;
                let h = awaits::fetch_within(outbox::Call::get(&url), within(&req)?)?;
                note(&format!("after fetch {}", h.status))?;
                Ok(Response::json(
                    200,
                    json!({ "status": h.status, "body": String::from_utf8_lossy(&h.body) })
                        .to_string(),
                ))
            }
            ("POST", "/nondet") => {
                self.runs += 1;
                let total = tally(&req)?.wait().add(self.runs)?;
                Ok(Response::json(200, json!({ "total": total }).to_string()))
            }
            ("POST", "/behind") => {
                // A typed call sent the usual way, then a wait for another
                // to the same tally: refused (`await_lane_busy`).
                let t = tally(&req)?;
                t.add(1, &())?;
                let total = t.wait().add(1)?;
                Ok(Response::json(200, json!({ "total": total }).to_string()))
            }
            ("POST", "/self") => {
                let me = wasmkeep_sdk::id();
                awaits::message(&outbox::to(&me.class, &me.name), b"hello")?;
                Ok(Response::status(204))
            }
            ("POST", "/ask") => {
                let to = req
                    .query_param("to")
                    .ok_or_else(|| Error::bad_request("`to` is required"))?;
                let answer = awaits::message(&outbox::to("waiter", &to), b"hi")?;
                Ok(Response::json(
                    200,
                    json!({ "answer": String::from_utf8_lossy(&answer) }).to_string(),
                ))
            }
            ("POST", "/arm") => {
                let name = req
                    .query_param("name")
                    .ok_or_else(|| Error::bad_request("`name` is required"))?;
                let by = req.query_u64("by")?.unwrap_or(1) as i64;
                sql::execute(
                    "INSERT OR REPLACE INTO armed VALUES (0, ?1, ?2)",
                    params![name, by],
                )?;
                alarm::set(wasmkeep_sdk::now_ms())?;
                Ok(Response::status(204))
            }
            ("GET", "/notes") => {
                let rows = sql::query("SELECT what, at_ms FROM notes ORDER BY id", &[])?;
                let notes: Vec<_> = rows
                    .rows
                    .iter()
                    .map(|r| json!({ "what": r.text(0), "at_ms": r.int(1) }))
                    .collect();
                Ok(Response::json(200, json!({ "notes": notes }).to_string()))
            }
            _ => Ok(Response::not_found()),
        }
    }

    fn message(&mut self, _msg: outbox::Message) -> Result<Vec<u8>> {
        Ok(format!("hello from {}", wasmkeep_sdk::id().name).into_bytes())
    }

    fn alarm(&mut self, _info: AlarmInfo) -> Result<()> {
        let rows = sql::query("SELECT name, by FROM armed WHERE id = 0", &[])?;
        let Some(r) = rows.rows.first() else {
            return Ok(());
        };
        let total = tally_api::Client::to("tally", &r.text(0))
            .wait()
            .add(r.int(1))?;
        note(&format!("alarm {total}"))
    }
}
