//! `counter`: the benchmark workload W1.
//!
//! - `POST /increment` answers `{"value":N}` after adding one.
//! - `GET /value` answers `{"value":N}`.

use wasmkeep_sdk::{Actor, Request, Response, Result, sql};

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
            _ => return Ok(Response::not_found()),
        };
        let rows = sql::query(statement, &[])?;
        Ok(Response::json(200, format!("{{\"value\":{}}}", rows.rows[0].int(0))))
    }
}
