//! `tally` and `caller`: typed calls between actors
//! (`wasmkeep_sdk::interface!`), in the wire format the TypeScript SDK
//! shares, so a Rust caller calls a TypeScript tally and back.
//!
//! `tally` answers `tally_api` to other actors, and `GET /value` with
//! `{"value":N}`:
//! - `add(by) -> total`; `get() -> total`; `fail(code) -> never`: fails
//!   with that code (its event rolls back).
//!
//! `caller` sends them (each answer is recorded with its note):
//! - `POST /add?name=N&by=K[&note=X][&app=A][&n=C]`, `POST /get?name=N[&note=X][&app=A]`,
//!   `POST /fail?name=N&code=C[&note=X][&app=A]`: `{"seq":S}` (the tally is
//!   `A/tally/N`, `A` this app by default; the note is the caller's clock
//!   when none is given; `n` sends C calls, the benchmark's W7).
//! - `GET /replies`: `{"replies":[{"method","ok","value","code","note","answered_ms"}]}`
//!   in the order they came.

use serde_json::json;
use wasmkeep_sdk::{Actor, Error, Request, Response, Result, outbox, params, sql};

wasmkeep_sdk::interface! {
    /// What a tally answers to other actors.
    pub mod tally_api {
        fn add(by: i64) -> i64;
        fn get() -> i64;
        fn fail(code: String) -> i64;
    }
}

#[derive(Default)]
pub struct Tally;

impl tally_api::Api for Tally {
    fn add(&mut self, by: i64) -> Result<i64> {
        let r = sql::query(
            "UPDATE tally SET n = n + ?1 WHERE id = 0 RETURNING n",
            params![by],
        )?;
        Ok(r.rows[0].int(0))
    }

    fn get(&mut self) -> Result<i64> {
        Ok(sql::query("SELECT n FROM tally WHERE id = 0", &[])?.rows[0].int(0))
    }

    fn fail(&mut self, code: String) -> Result<i64> {
        // Written, then rolled back with the event.
        sql::execute("UPDATE tally SET n = n + 1000 WHERE id = 0", &[])?;
        Err(Error::new(code, "asked to fail"))
    }
}

impl Actor for Tally {
    fn init(&mut self) -> Result<()> {
        sql::execute(
            "CREATE TABLE tally (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL)",
            &[],
        )?;
        sql::execute("INSERT INTO tally VALUES (0, 0)", &[])?;
        Ok(())
    }

    fn request(&mut self, req: Request) -> Result<Response> {
        match req.route() {
            ("GET", "/value") => {
                let n = tally_api::Api::get(self)?;
                Ok(Response::json(200, json!({ "value": n }).to_string()))
            }
            _ => Ok(Response::not_found()),
        }
    }

    fn message(&mut self, msg: outbox::Message) -> Result<Vec<u8>> {
        tally_api::serve(self, &msg)
    }
}

#[derive(Default)]
pub struct Caller;

fn param(req: &Request, name: &str) -> Result<String> {
    req.query_param(name)
        .ok_or_else(|| Error::bad_request(format!("`{name}` is required")))
}

impl Actor for Caller {
    fn init(&mut self) -> Result<()> {
        sql::execute(
            "CREATE TABLE replies (seq INTEGER PRIMARY KEY, method TEXT NOT NULL, ok INTEGER NOT NULL, value INTEGER, code TEXT, note TEXT NOT NULL, answered_ms INTEGER NOT NULL)",
            &[],
        )?;
        Ok(())
    }

    fn request(&mut self, req: Request) -> Result<Response> {
        if req.route() == ("GET", "/replies") {
            let rows = sql::query(
                "SELECT method, ok, value, code, note, answered_ms FROM replies ORDER BY seq",
                &[],
            )?;
            let replies: Vec<_> = rows
                .rows
                .iter()
                .map(|r| {
                    json!({"method": r.text(0), "ok": r.int(1) != 0, "value": r.opt_int(2), "code": (!r.is_null(3)).then(|| r.text(3)), "note": r.text(4), "answered_ms": r.int(5)})
                })
                .collect();
            return Ok(Response::json(200, json!({ "replies": replies }).to_string()));
        }
        let app = req
            .query_param("app")
            .unwrap_or_else(|| wasmkeep_sdk::id().app);
        let tally = tally_api::Client(outbox::Address {
            app,
            class: "tally".into(),
            name: param(&req, "name")?,
        });
        let note = req
            .query_param("note")
            .unwrap_or_else(|| wasmkeep_sdk::now_ms().to_string());
        let seq = match req.route() {
            ("POST", "/add") => {
                let by: i64 = param(&req, "by")?
                    .parse()
                    .map_err(|_| Error::bad_request("`by` is an integer"))?;
                let n = req.query_u64("n")?.unwrap_or(1).clamp(1, 100);
                let mut seq = 0;
                for _ in 0..n {
                    seq = tally.add(by, &note)?;
                }
                seq
            }
            ("POST", "/get") => tally.get(&note)?,
            ("POST", "/fail") => tally.fail(param(&req, "code")?, &note)?,
            _ => return Ok(Response::not_found()),
        };
        Ok(Response::json(200, json!({ "seq": seq }).to_string()))
    }

    fn response(&mut self, r: outbox::Response) -> Result<()> {
        use tally_api::Reply;
        let Some((reply, note)) = Reply::of::<String>(&r) else {
            return Ok(());
        };
        let (method, outcome) = match reply {
            Reply::add(o) => ("add", o),
            Reply::get(o) => ("get", o),
            Reply::fail(o) => ("fail", o),
        };
        let (ok, value, code) = match outcome {
            Ok(v) => (1, Some(v), None),
            Err(e) => (0, None, Some(e.code)),
        };
        sql::execute(
            "INSERT INTO replies (method, ok, value, code, note, answered_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![method, ok as i64, value, code, note, wasmkeep_sdk::now_ms()],
        )?;
        Ok(())
    }
}
