//! The smallest useful actor: a counter per name, in SQLite.
use wasmkeep_sdk::{Actor, Request, Response, Result, sql};

#[derive(Default)]
struct Counter;

impl Actor for Counter {
    fn init(&mut self) -> Result<()> {
        sql::execute("CREATE TABLE counter (n INTEGER NOT NULL)", &[])?;
        sql::execute("INSERT INTO counter VALUES (0)", &[])?;
        Ok(())
    }

    fn request(&mut self, req: Request) -> Result<Response> {
        let statement = match req.route() {
            ("POST", "/increment") => "UPDATE counter SET n = n + 1 RETURNING n",
            ("GET", "/value") => "SELECT n FROM counter",
            _ => return Ok(Response::not_found()),
        };
        let n = sql::query(statement, &[])?.rows[0].int(0);
        Ok(Response::json(200, format!("{{\"value\":{n}}}")))
    }
}

wasmkeep_sdk::app!("counter" => Counter);
