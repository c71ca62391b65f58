//! `pinger`: actor-to-actor messages through the outbox (ADR 0040), the
//! acceptance contract of issue 20.
//!
//! - `POST /ping?to={other}&n={k}` sends `k` messages to actor
//!   `pinger/{other}` in this event's transaction; answers
//!   `{"queued":k,"seqs":[first,last]}`.
//! - `GET /pongs`: `{"sent":S,"answered":A,"duplicates":D}`, counted in this
//!   actor's database; `D` counts answers applied twice (it must stay 0).
//! - `GET /stats`: `{"received":R,"received_twice":T,"failed":F}`: messages
//!   this actor applied as a receiver, those it applied twice (must stay
//!   0), and sends that failed for good.
//!
//! - `POST /fetch?url={u}&n={k}`: `k` (default 1) outbound `GET`s of `u`
//!   (the app's manifest must allow its host); `GET /calls`:
//!   `{"calls":[{"seq","status","body","code"}]}`, the answers so far
//!   (`status` 0 and `code` set for a final failure).
//! - `GET /latencies`: `{"pings":[[sent_ms,answered_ms]...],"calls":[...]}`
//!   (answered ones; the benchmark's W7 reads them).
//!
//! - `POST /relay?to={other}`: parks this request's reply (ADR 0042),
//!   sends one message to `pinger/{other}`, and answers the client from
//!   the event that applies the answer: `relayed: pong {n}`.
//!   With `fail=1` the event that completes it then fails, so the reply
//!   stays parked; `ms` sets the park's deadline (default 30 s).
//!   `POST /park?ms={t}` parks its reply (the client gets 504
//!   `reply_expired` after `t` ms) unless `POST /complete-parked` completes
//!   it from a later request first.
//! - `GET /config?name=N`: `{"value": V|null}`, the app's variable or
//!   secret `N` (ADR 0041); `POST /config/log?name=N` writes it to the
//!   node's log (where a secret's value shows as `[secret]`).
//!
//! With `fail=1`, `/ping` and `/fetch` send and then fail: nothing leaves.
//! Each message's body is `{sender}:{n}`, unique per message; the receiver
//! answers `pong {n}`.

use serde_json::json;
use wasmkeep_sdk::outbox::{self, Answer};
use wasmkeep_sdk::{Actor, Error, Request, Response, Result, id, now_ms, params, sql};

wasmkeep_sdk::context! {
    /// What a ping remembers until its answer.
    pub enum Ctx {
        Ping { n: u64 },
        Fetch { url: String },
        Relay { ticket: u64, fail: bool },
    }
}

/// Most messages one request may send.
const PINGS_PER_REQUEST_MAX: u64 = 1_000;

#[derive(Default)]
pub struct Pinger;

fn count(sql_text: &str) -> Result<i64> {
    Ok(sql::query(sql_text, &[])?.rows[0].int(0))
}

impl Actor for Pinger {
    fn init(&mut self) -> Result<()> {
        sql::execute(
            "CREATE TABLE pings (seq INTEGER PRIMARY KEY, n INTEGER NOT NULL, answered INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0, sent_ms INTEGER NOT NULL, answered_ms INTEGER)",
            &[],
        )?;
        sql::execute(
            "CREATE TABLE dup_answers (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL)",
            &[],
        )?;
        sql::execute("INSERT INTO dup_answers VALUES (0, 0)", &[])?;
        sql::execute(
            "CREATE TABLE received (body TEXT PRIMARY KEY, times INTEGER NOT NULL)",
            &[],
        )?;
        sql::execute(
            "CREATE TABLE calls (seq INTEGER PRIMARY KEY, status INTEGER, body TEXT, code TEXT, sent_ms INTEGER NOT NULL, answered_ms INTEGER)",
            &[],
        )?;
        Ok(())
    }

    fn request(&mut self, req: Request) -> Result<Response> {
        match req.route() {
            ("POST", "/ping") => {
                let to = req
                    .query_param("to")
                    .ok_or_else(|| Error::bad_request("`to` is required"))?;
                let n = req.query_u64("n")?.unwrap_or(1);
                if n == 0 || n > PINGS_PER_REQUEST_MAX {
                    return Err(Error::bad_request(format!(
                        "`n` must be 1 to {PINGS_PER_REQUEST_MAX}"
                    )));
                }
                let me = id().name;
                let target = outbox::to("pinger", &to);
                let base = count("SELECT count(*) FROM pings")? as u64;
                let (mut first, mut last) = (0, 0);
                for i in 0..n {
                    let k = base + i + 1;
                    let body = format!("{me}:{k}");
                    let seq = outbox::send(&target, body.as_bytes(), &Ctx::Ping { n: k })?;
                    sql::execute(
                        "INSERT INTO pings (seq, n, sent_ms) VALUES (?1, ?2, ?3)",
                        params![seq as i64, k as i64, now_ms() as i64],
                    )?;
                    if i == 0 {
                        first = seq;
                    }
                    last = seq;
                }
                if req.query_param("fail").as_deref() == Some("1") {
                    return Err(Error::new("asked_to_fail", "failing after the sends, as asked"));
                }
                Ok(Response::json(
                    200,
                    json!({ "queued": n, "seqs": [first, last] }).to_string(),
                ))
            }
            ("POST", "/fetch") => {
                let url = req
                    .query_param("url")
                    .ok_or_else(|| Error::bad_request("`url` is required"))?;
                let n = req.query_u64("n")?.unwrap_or(1);
                if n == 0 || n > PINGS_PER_REQUEST_MAX {
                    return Err(Error::bad_request(format!(
                        "`n` must be 1 to {PINGS_PER_REQUEST_MAX}"
                    )));
                }
                let mut seq = 0;
                for _ in 0..n {
                    let call = outbox::Call::get(&url).header("x-wasmkeep-example", "pinger");
                    seq = outbox::fetch(call, &Ctx::Fetch { url: url.clone() })?;
                    sql::execute(
                        "INSERT INTO calls (seq, sent_ms) VALUES (?1, ?2)",
                        params![seq as i64, now_ms() as i64],
                    )?;
                }
                if req.query_param("fail").as_deref() == Some("1") {
                    return Err(Error::new("asked_to_fail", "failing after the call, as asked"));
                }
                Ok(Response::json(200, json!({ "seq": seq }).to_string()))
            }
            ("POST", "/relay") => {
                let to = req
                    .query_param("to")
                    .ok_or_else(|| Error::bad_request("`to` is required"))?;
                let ms = req.query_u64("ms")?.unwrap_or(30_000);
                let fail = req.query_param("fail").as_deref() == Some("1");
                let ticket = wasmkeep_sdk::replies::park(ms as u32)?;
                let body = format!("{}:relay-{ticket}", id().name);
                outbox::send(&outbox::to("pinger", &to), body.as_bytes(), &Ctx::Relay { ticket, fail })?;
                Ok(Response::status(202))
            }
            ("POST", "/park") => {
                let ms = req.query_u64("ms")?.unwrap_or(100);
                let ticket = wasmkeep_sdk::replies::park(ms as u32)?;
                wasmkeep_sdk::kv::put("parked_ticket", ticket.to_string().as_bytes())?;
                Ok(Response::status(202))
            }
            ("POST", "/complete-parked") => {
                let ticket: u64 = wasmkeep_sdk::kv::get("parked_ticket")?
                    .and_then(|b| String::from_utf8(b).ok()?.parse().ok())
                    .ok_or_else(|| Error::not_found("nothing parked"))?;
                wasmkeep_sdk::replies::complete(ticket, Response::text(200, "completed by a later request"))?;
                Ok(Response::status(204))
            }
            ("GET", "/config") | ("POST", "/config/log") => {
                let name = req
                    .query_param("name")
                    .ok_or_else(|| Error::bad_request("`name` is required"))?;
                let value = wasmkeep_sdk::config::get(&name);
                if req.method == "POST" {
                    wasmkeep_sdk::log::info(&format!(
                        "config {name} = {}",
                        value.as_deref().unwrap_or("(none)")
                    ));
                }
                Ok(Response::json(200, json!({ "value": value }).to_string()))
            }
            ("GET", "/calls") => {
                let rows = sql::query(
                    "SELECT seq, status, body, code FROM calls WHERE answered_ms IS NOT NULL ORDER BY seq",
                    &[],
                )?;
                let calls: Vec<_> = rows
                    .rows
                    .iter()
                    .map(|r| json!({ "seq": r.int(0), "status": r.int(1), "body": r.text(2), "code": r.text(3) }))
                    .collect();
                Ok(Response::json(200, json!({ "calls": calls }).to_string()))
            }
            ("GET", "/pongs") => {
                let sent = count("SELECT count(*) FROM pings")?;
                let answered = count("SELECT count(*) FROM pings WHERE answered > 0")?;
                let duplicates = count("SELECT n FROM dup_answers WHERE id = 0")?;
                Ok(Response::json(
                    200,
                    json!({ "sent": sent, "answered": answered, "duplicates": duplicates })
                        .to_string(),
                ))
            }
            ("GET", "/latencies") => {
                let pairs = |q: &str| -> Result<Vec<[i64; 2]>> {
                    Ok(sql::query(q, &[])?
                        .rows
                        .iter()
                        .map(|r| [r.int(0), r.int(1)])
                        .collect())
                };
                let pings = pairs("SELECT sent_ms, answered_ms FROM pings WHERE answered_ms IS NOT NULL")?;
                let calls = pairs("SELECT sent_ms, answered_ms FROM calls WHERE answered_ms IS NOT NULL AND status = 200")?;
                Ok(Response::json(200, json!({ "pings": pings, "calls": calls }).to_string()))
            }
            ("GET", "/stats") => {
                let received = count("SELECT count(*) FROM received")?;
                let twice = count("SELECT count(*) FROM received WHERE times > 1")?;
                let failed = count("SELECT count(*) FROM pings WHERE failed > 0")?;
                Ok(Response::json(
                    200,
                    json!({ "received": received, "received_twice": twice, "failed": failed })
                        .to_string(),
                ))
            }
            _ => Ok(Response::not_found()),
        }
    }

    fn message(&mut self, msg: outbox::Message) -> Result<Vec<u8>> {
        let body = String::from_utf8_lossy(&msg.body).into_owned();
        sql::execute(
            "INSERT INTO received (body, times) VALUES (?1, 1) ON CONFLICT (body) DO UPDATE SET times = times + 1",
            params![body.clone()],
        )?;
        let n = body.rsplit(':').next().unwrap_or("?");
        Ok(format!("pong {n}").into_bytes())
    }

    fn response(&mut self, r: outbox::Response) -> Result<()> {
        let n = match r.context::<Ctx>() {
            Some(Ctx::Ping { n }) => n,
            Some(Ctx::Relay { ticket, fail }) => {
                let text = match &r.answer {
                    Answer::Reply(b) => format!("relayed: {}", String::from_utf8_lossy(b)),
                    other => format!("relay failed: {other:?}"),
                };
                wasmkeep_sdk::replies::complete(ticket, Response::text(200, text))?;
                if fail {
                    return Err(Error::new("asked_to_fail", "failing after completing, as asked"));
                }
                return Ok(());
            }
            Some(Ctx::Fetch { .. }) => {
                let (status, body, code) = match &r.answer {
                    Answer::Http(h) => (h.status as i64, String::from_utf8_lossy(&h.body).into_owned(), String::new()),
                    Answer::Failed(e) | Answer::Refused(e) => (0, e.message.clone(), e.code.clone()),
                    Answer::Reply(_) => (0, String::new(), "unexpected".into()),
                };
                sql::execute(
                    "UPDATE calls SET status = ?2, body = ?3, code = ?4, answered_ms = ?5 WHERE seq = ?1",
                    params![r.seq as i64, status, body, code, now_ms() as i64],
                )?;
                return Ok(());
            }
            None => return Ok(()),
        };
        let already = sql::query(
            "SELECT answered + failed FROM pings WHERE seq = ?1",
            params![r.seq as i64],
        )?;
        if already.rows.first().is_some_and(|row| row.int(0) > 0) {
            sql::execute("UPDATE dup_answers SET n = n + 1 WHERE id = 0", &[])?;
            return Ok(());
        }
        let column = match &r.answer {
            Answer::Reply(body) if *body == format!("pong {n}").into_bytes() => "answered",
            _ => "failed",
        };
        sql::execute(
            &format!("UPDATE pings SET {column} = 1, answered_ms = ?2 WHERE seq = ?1"),
            params![r.seq as i64, now_ms() as i64],
        )?;
        Ok(())
    }
}
