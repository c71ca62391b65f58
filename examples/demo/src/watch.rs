//! `watch`: the second seed's "moving deadline", both ways.
//!
//! A watch is armed for a first boundary and re-armed every `step_ms`; it
//! must retire once it is older than `ttl_ms`. With `rule=anchored` its age
//! is measured from the first boundary, which never moves, so it retires.
//! With `rule=moving` (the bug the seed describes, kept runnable so a test
//! can show it) age is measured from the boundary being processed, which
//! moves at every run: on-time runs always see an age of zero and the watch
//! never retires.
//!
//! - `POST /arm?due_ms=T&ttl_ms=X&step_ms=S&rule=anchored|moving`
//! - `GET /state`: `{"alive","drains","history_len","anchor_ms","due_ms"}`

use serde_json::json;
use wasmkeep_sdk::{Actor, AlarmInfo, Error, Request, Response, Result, alarm, now_ms, params, sql};

/// Boundaries a watch remembers; older ones are dropped (the seed's cap).
const HISTORY_MAX: i64 = 24;

#[derive(Default)]
pub struct Watch;

impl Actor for Watch {
    fn init(&mut self) -> Result<()> {
        sql::execute(
            "CREATE TABLE watch (id INTEGER PRIMARY KEY CHECK (id = 0), anchor_ms INTEGER NOT NULL, due_ms INTEGER NOT NULL, ttl_ms INTEGER NOT NULL, step_ms INTEGER NOT NULL, moving INTEGER NOT NULL, alive INTEGER NOT NULL, drains INTEGER NOT NULL, history_len INTEGER NOT NULL)",
            &[],
        )?;
        Ok(())
    }

    fn request(&mut self, req: Request) -> Result<Response> {
        match req.route() {
            ("POST", "/arm") => {
                let need = |name: &str| -> Result<u64> {
                    req.query_u64(name)?
                        .ok_or_else(|| Error::bad_request(format!("`{name}` is required")))
                };
                let due = need("due_ms")?;
                let moving = match req.query_param("rule").as_deref() {
                    None | Some("anchored") => false,
                    Some("moving") => true,
                    Some(other) => return Err(Error::bad_request(format!("unknown rule `{other}`"))),
                };
                sql::execute(
                    "INSERT OR REPLACE INTO watch VALUES (0, ?1, ?1, ?2, ?3, ?4, 1, 0, 0)",
                    params![due, need("ttl_ms")?, need("step_ms")?, moving],
                )?;
                alarm::set(due)?;
                Ok(Response::status(204))
            }
            ("GET", "/state") => {
                let rows = sql::query(
                    "SELECT alive, drains, history_len, anchor_ms, due_ms FROM watch WHERE id = 0",
                    &[],
                )?;
                let Some(r) = rows.rows.first() else {
                    return Ok(Response::not_found());
                };
                Ok(Response::json(
                    200,
                    json!({
                        "alive": r.int(0) != 0,
                        "drains": r.int(1),
                        "history_len": r.int(2),
                        "anchor_ms": r.int(3),
                        "due_ms": r.int(4),
                    })
                    .to_string(),
                ))
            }
            _ => Ok(Response::not_found()),
        }
    }

    fn alarm(&mut self, _info: AlarmInfo) -> Result<()> {
        let rows = sql::query(
            "SELECT anchor_ms, due_ms, ttl_ms, step_ms, moving, history_len FROM watch WHERE id = 0 AND alive = 1",
            &[],
        )?;
        let Some(r) = rows.rows.first() else {
            return Ok(());
        };
        let (anchor, due, ttl, step, moving, history) =
            (r.int(0), r.int(1), r.int(2), r.int(3), r.int(4) != 0, r.int(5));
        let now = now_ms() as i64;
        let age = if moving { now - due } else { now - anchor };
        let history = (history + 1).min(HISTORY_MAX);
        if age > ttl {
            sql::execute(
                "UPDATE watch SET alive = 0, drains = drains + 1, history_len = ?1 WHERE id = 0",
                params![history],
            )?;
            return Ok(());
        }
        let next = due + step;
        sql::execute(
            "UPDATE watch SET due_ms = ?1, drains = drains + 1, history_len = ?2 WHERE id = 0",
            params![next, history],
        )?;
        alarm::set(next as u64)
    }
}
