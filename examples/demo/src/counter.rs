//! `counter`: the benchmark workload W1.
//!
//! - `POST /increment` answers `{"value":N}` after adding one.
//! - `GET /value` answers `{"value":N}`.
//! - `GET /bookmark[?at_ms=T]` answers `{"bookmark":B}` (now, or at T);
//!   `POST /restore?bookmark=B` answers `{"undo":U}` and goes back to B
//!   once committed (`wasmkeep_sdk::bookmarks`; a node with a bucket).

use wasmkeep_sdk::{Actor, Error, Request, Response, Result, bookmarks, sql};

#[derive(Default)]
pub struct Counter;

impl Actor for Counter {
    fn init(&mut self) -> Result<()> {
        sql::execute(
            "CREATE TABLE counter (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL)",
            &[],
        )?;
        sql::execute("INSERT INTO counter VALUES (0, 0)", &[])?;
        Ok(())
    }

    fn request(&mut self, req: Request) -> Result<Response> {
        let statement = match req.route() {
            ("POST", "/increment") => "UPDATE counter SET n = n + 1 WHERE id = 0 RETURNING n",
            ("GET", "/value") => "SELECT n FROM counter WHERE id = 0",
            ("GET", "/bookmark") => {
                let b = match req.query_u64("at_ms")? {
                    Some(t) => bookmarks::for_time(t)?,
                    None => bookmarks::current()?,
                };
                return Ok(Response::json(200, format!("{{\"bookmark\":\"{b}\"}}")));
            }
            ("POST", "/restore") => {
                let b = req
                    .query_param("bookmark")
                    .ok_or_else(|| Error::bad_request("`bookmark` is required"))?;
                let undo = bookmarks::restore_on_next_start(&b)?;
                return Ok(Response::json(200, format!("{{\"undo\":\"{undo}\"}}")));
            }
            _ => return Ok(Response::not_found()),
        };
        let rows = sql::query(statement, &[])?;
        Ok(Response::json(200, format!("{{\"value\":{}}}", rows.rows[0].int(0))))
    }
}
