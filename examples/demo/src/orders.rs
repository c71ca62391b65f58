//! `orders`: durable workflows (`wasmkeep_sdk::workflow`). Each `run`
//! step counts its effect in `effects`, so a test sees a step that ran
//! twice.
//!
//! Workflow `order`: `reserve` (fails its first `fail` attempts, from the
//! input), `cool-off` (sleeps 60 s), `approval` (waits up to an hour for
//! the event `approved`), `ship` (its result says whether it was approved).
//! Workflow `ten`: ten `run` steps, `s0` .. `s9`.
//! Workflow `tallied`: `add` calls `tally_api.add` on the tally named as
//! the instance (`fail` on it instead when the input has a `code`), its
//! answer awaited durably; `record` counts its effect and returns
//! `{"total": <the answer>}`.
//!
//! - `POST /start?id=I[&fail=K]`, `POST /start-ten?id=I`,
//!   `POST /start-tallied?id=I&by=K[&app=A][&code=C]`: 204.
//! - `POST /signal?id=I&event=E` with the payload (text) as body: 204.
//! - `POST /pause?id=I`, `POST /resume?id=I`, `POST /cancel?id=I`,
//!   `POST /restart?id=I&step=S`: 204.
//! - `GET /status?id=I`: `{"state","step","failures","wake_ms","error",
//!   "history":[{"step","name","result","attempts","done_ms"}]}`.
//! - `GET /effects`: `{"<step>":N,...}`, how often each step's effect
//!   committed.

use serde_json::{Value as Json, json};
use wasmkeep_sdk::workflow::{self, Ctx, Outgoing, Retry, Workflow, call, run, sleep, wait};
use wasmkeep_sdk::{Actor, AlarmInfo, Error, Request, Response, Result, now_ms, outbox, params, sql};

fn effect(name: &str) -> Result<()> {
    sql::execute(
        "INSERT INTO effects (step, n) VALUES (?1, 1) ON CONFLICT (step) DO UPDATE SET n = n + 1",
        params![name],
    )?;
    Ok(())
}

fn reserve(ctx: &mut Ctx) -> Result<Json> {
    let input: Json = ctx.input()?;
    let fail = input["fail"].as_u64().unwrap_or(0);
    effect("reserve")?;
    if u64::from(ctx.attempt) <= fail {
        return Err(Error::new("out_of_stock", format!("attempt {} fails", ctx.attempt)));
    }
    Ok(json!({ "reserved": true, "attempt": ctx.attempt }))
}

fn ship(ctx: &mut Ctx) -> Result<Json> {
    let approved: Option<String> = ctx.event("approval")?;
    effect("ship")?;
    Ok(json!({ "approved": approved }))
}

static ORDER: Workflow = Workflow {
    name: "order",
    steps: &[
        run("reserve", reserve),
        sleep("cool-off", 60_000),
        wait("approval", "approved", 3_600_000),
        run("ship", ship),
    ],
    retry: Retry {
        attempts_max: 3,
        first_backoff_ms: 1_000,
        backoff_max_ms: 10_000,
    },
};

macro_rules! counted_steps {
    ($($name:ident),+) => {
        $(fn $name(_ctx: &mut Ctx) -> Result<Json> {
            effect(stringify!($name))?;
            Ok(Json::Null)
        })+
    };
}
counted_steps!(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9);

static TEN: Workflow = Workflow {
    name: "ten",
    steps: &[
        run("s0", s0),
        run("s1", s1),
        run("s2", s2),
        run("s3", s3),
        run("s4", s4),
        run("s5", s5),
        run("s6", s6),
        run("s7", s7),
        run("s8", s8),
        run("s9", s9),
    ],
    retry: Retry::DEFAULT,
};

fn add_call(ctx: &Ctx) -> Result<Outgoing> {
    let input: Json = ctx.input()?;
    let (call, args) = match input["code"].as_str() {
        Some(code) => ("tally_api.fail", json!({ "code": code })),
        None => ("tally_api.add", json!({ "by": input["by"] })),
    };
    Ok(Outgoing {
        to: outbox::Address {
            app: input["app"].as_str().unwrap_or("examples").to_owned(),
            class: "tally".into(),
            name: ctx.id.clone(),
        },
        call: call.into(),
        args,
    })
}

fn record(ctx: &mut Ctx) -> Result<Json> {
    let total: i64 = ctx.result("add")?;
    effect("record")?;
    Ok(json!({ "total": total }))
}

static TALLIED: Workflow = Workflow {
    name: "tallied",
    steps: &[call("add", add_call, 30_000), run("record", record)],
    retry: Retry {
        attempts_max: 2,
        first_backoff_ms: 1_000,
        backoff_max_ms: 1_000,
    },
};

const WORKFLOWS: &[&Workflow] = &[&ORDER, &TEN, &TALLIED];

#[derive(Default)]
pub struct Orders;

fn param(req: &Request, name: &str) -> Result<String> {
    req.query_param(name)
        .ok_or_else(|| Error::bad_request(format!("`{name}` is required")))
}

fn status(id: &str) -> Result<Json> {
    let inst = workflow::get(id)?.ok_or_else(|| Error::not_found(format!("no order `{id}`")))?;
    let history: Vec<_> = workflow::history(id)?
        .into_iter()
        .map(|d| json!({"step": d.step, "name": d.name, "result": d.result, "attempts": d.attempts, "done_ms": d.done_ms}))
        .collect();
    Ok(json!({
        "state": inst.state, "step": inst.step, "failures": inst.failures,
        "wake_ms": inst.wake_ms, "error": inst.error, "history": history,
    }))
}

impl Actor for Orders {
    fn init(&mut self) -> Result<()> {
        sql::execute(
            "CREATE TABLE effects (step TEXT PRIMARY KEY, n INTEGER NOT NULL)",
            &[],
        )?;
        Ok(())
    }

    fn request(&mut self, req: Request) -> Result<Response> {
        let id = || param(&req, "id");
        match req.route() {
            ("POST", "/start") => {
                let fail = req.query_u64("fail")?.unwrap_or(0);
                workflow::start(&ORDER, &id()?, &json!({ "fail": fail }))?;
            }
            ("POST", "/start-ten") => workflow::start(&TEN, &id()?, &Json::Null)?,
            ("POST", "/start-tallied") => {
                let by = req.query_u64("by")?.unwrap_or(1);
                let app = req.query_param("app").unwrap_or_else(|| wasmkeep_sdk::id().app);
                let input = match req.query_param("code") {
                    Some(code) => json!({ "by": by, "app": app, "code": code }),
                    None => json!({ "by": by, "app": app }),
                };
                workflow::start(&TALLIED, &id()?, &input)?
            }
            ("POST", "/signal") => {
                let payload = req.text()?.to_owned();
                workflow::signal(WORKFLOWS, &id()?, &param(&req, "event")?, &payload)?;
            }
            ("POST", "/pause") => workflow::pause(&id()?)?,
            ("POST", "/resume") => workflow::resume(WORKFLOWS, &id()?)?,
            ("POST", "/cancel") => workflow::cancel(&id()?)?,
            ("POST", "/restart") => workflow::restart_from(WORKFLOWS, &id()?, &param(&req, "step")?)?,
            ("GET", "/status") => return Ok(Response::json(200, status(&id()?)?.to_string())),
            ("GET", "/effects") => {
                let rows = sql::query("SELECT step, n FROM effects ORDER BY step", &[])?;
                let mut out = serde_json::Map::new();
                for r in &rows.rows {
                    out.insert(r.text(0).to_owned(), json!(r.int(1)));
                }
                return Ok(Response::json(200, Json::Object(out).to_string()));
            }
            _ => return Ok(Response::not_found()),
        }
        Ok(Response::status(204))
    }

    fn alarm(&mut self, _info: AlarmInfo) -> Result<()> {
        workflow::on_alarm(WORKFLOWS, now_ms())
    }

    fn message(&mut self, msg: outbox::Message) -> Result<Vec<u8>> {
        workflow::on_message(WORKFLOWS, &msg)
            .unwrap_or_else(|| Err(Error::new("no_handler", "orders take no other messages")))
    }

    fn response(&mut self, r: outbox::Response) -> Result<()> {
        workflow::on_response(WORKFLOWS, &r).map(|_| ())
    }
}
