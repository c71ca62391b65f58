//! Durable workflows: steps whose results are recorded and never run
//! again once done, with retries, sleeps and waits for events, on the
//! actor's own database, timers and outbox (issue 36).
//!
//! A [`Workflow`] is a fixed list of steps: [`run`] (a function), [`sleep`]
//! (a delay), [`wait`] (an event sent with [`signal`], or a timeout) and
//! [`call`] (a typed call to another actor, its answer awaited durably).
//! [`start`] makes an instance; it then goes step by step, each `run` step
//! in an event of its own:
//!
//! - A `run` step is a message the actor sends itself (the outbox, so it
//!   leaves once the event that scheduled it committed). Its event runs
//!   the function, records its result and moves to the next step in one
//!   transaction: a step that committed is never run again, and one whose
//!   event failed or died left nothing and runs again.
//! - A step that fails (returns `Err`, traps, runs into a limit) rolls its
//!   event back; the answer comes back as a refusal, and the instance
//!   retries it after a backoff ([`Retry`]) or, past its attempts, stops
//!   as `failed` with the error. Other instances, timers and schedules go
//!   on meanwhile.
//! - `sleep` and a `wait`'s timeout keep the instance's wake-up time in its
//!   row; the alarm, shared with the [`timers`] and the
//!   [`cron`](crate::cron) schedules, brings it back.
//!
//! [`pause`], [`resume`], [`cancel`] and [`restart_from`] (a step, whose
//! records and later ones are dropped) control an instance; [`get`] and
//! [`history`] read it (tables `wasmkeep_sdk_workflows` and
//! `wasmkeep_sdk_workflow_steps`, which `wasmkeep inspect` shows too).
//!
//! The actor hands the SDK its three hooks: [`on_message`], [`on_response`]
//! and [`on_alarm`], each given the app's workflows (ADR 0052).
//!
//! **Changing a workflow.** An instance's position is a step index and
//! its records name steps: add steps at the end. Inserting or removing
//! steps moves instances in flight to whatever step now has their index;
//! a step renamed loses its recorded result for [`Ctx::result`].
//!
//! ```no_run
//! use wasmkeep_sdk::workflow::{self, Ctx, Retry, Workflow, run, sleep, wait};
//! use wasmkeep_sdk::{Actor, AlarmInfo, Request, Response, Result, now_ms, outbox};
//!
//! fn charge(ctx: &mut Ctx) -> Result<serde_json::Value> {
//!     let amount: i64 = ctx.input()?;
//!     Ok(serde_json::json!({ "charged": amount }))
//! }
//!
//! fn ship(ctx: &mut Ctx) -> Result<serde_json::Value> {
//!     let approved: Option<String> = ctx.event("approval")?;
//!     Ok(serde_json::json!({ "shipped": approved.is_some() }))
//! }
//!
//! static ORDER: Workflow = Workflow {
//!     name: "order",
//!     steps: &[
//!         run("charge", charge),
//!         sleep("cool-off", 60_000),
//!         wait("approval", "approved", 86_400_000),
//!         run("ship", ship),
//!     ],
//!     retry: Retry::DEFAULT,
//! };
//! const WORKFLOWS: &[&Workflow] = &[&ORDER];
//!
//! #[derive(Default)]
//! struct Shop;
//!
//! impl Actor for Shop {
//!     fn request(&mut self, req: Request) -> Result<Response> {
//!         match req.route() {
//!             ("POST", "/order") => workflow::start(&ORDER, "o-1", &42)?,
//!             ("POST", "/approve") => workflow::signal(WORKFLOWS, "o-1", "approved", &"ok")?,
//!             _ => return Ok(Response::not_found()),
//!         }
//!         Ok(Response::status(204))
//!     }
//!     fn alarm(&mut self, _info: AlarmInfo) -> Result<()> {
//!         workflow::on_alarm(WORKFLOWS, now_ms())
//!     }
//!     fn message(&mut self, msg: outbox::Message) -> Result<Vec<u8>> {
//!         workflow::on_message(WORKFLOWS, &msg).unwrap_or_else(|| Ok(Vec::new()))
//!     }
//!     fn response(&mut self, r: outbox::Response) -> Result<()> {
//!         workflow::on_response(WORKFLOWS, &r).map(|_| ())
//!     }
//! }
//! ```

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value as Json, json};

use crate::outbox::{Answer, Message, Response};
use crate::{Error, Result, params, sql, timers};

/// Longest instance id, in bytes.
pub const ID_BYTES_MAX: usize = 256;
/// Most instances one actor keeps (finished ones included, until
/// [`forget`]).
pub const INSTANCES_MAX: i64 = 10_000;

/// A step's function: what it returns is recorded as the step's result.
pub type StepFn = fn(&mut Ctx) -> Result<Json>;

/// One step of a [`Workflow`].
#[derive(Debug, Clone, Copy)]
pub struct Step {
    /// Its name, unique in the workflow.
    pub name: &'static str,
    kind: Kind,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Run(StepFn),
    Sleep(u64),
    Wait {
        event: &'static str,
        timeout_ms: u64,
    },
    Call {
        make: CallFn,
        timeout_ms: u64,
    },
}

/// What a `call` step sends: a typed call (the wire format of
/// [`calls`](crate::calls): `"<interface>.<method>"` and named arguments)
/// to another actor of the tenant.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The callee.
    pub to: crate::outbox::Address,
    /// `"<interface>.<method>"`.
    pub call: String,
    /// The named arguments (a JSON object).
    pub args: Json,
}

/// Builds a `call` step's call from what the instance recorded so far.
pub type CallFn = fn(&Ctx) -> Result<Outgoing>;

/// A step that runs `f` in an event of its own.
pub const fn run(name: &'static str, f: StepFn) -> Step {
    Step {
        name,
        kind: Kind::Run(f),
    }
}

/// A step that waits `ms` milliseconds.
pub const fn sleep(name: &'static str, ms: u64) -> Step {
    Step {
        name,
        kind: Kind::Sleep(ms),
    }
}

/// A step that waits for the event `event` ([`signal`]) for at most
/// `timeout_ms`; its result is the event's payload, or null after the
/// timeout (read it with [`Ctx::event`]). An event signalled before the
/// instance reaches the step is kept for it.
pub const fn wait(name: &'static str, event: &'static str, timeout_ms: u64) -> Step {
    Step {
        name,
        kind: Kind::Wait { event, timeout_ms },
    }
}

/// A step that calls another actor and waits, durably, for its answer:
/// the step's result is the answer (read it with [`Ctx::result`]). The
/// call is built by `make` when the instance reaches the step and sent
/// through the outbox; a refusal, a failed delivery or no answer within
/// `timeout_ms` is a failed attempt, retried as a `run` step is (the call
/// sent again; a late answer to an earlier attempt is ignored).
pub const fn call(name: &'static str, make: CallFn, timeout_ms: u64) -> Step {
    Step {
        name,
        kind: Kind::Call { make, timeout_ms },
    }
}

/// How a failing `run` step is retried: after `first_backoff_ms`, doubling
/// up to `backoff_max_ms`, at most `attempts_max` attempts in all.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Attempts in all, the first included.
    pub attempts_max: u32,
    /// Wait before the second attempt.
    pub first_backoff_ms: u64,
    /// Longest wait between attempts.
    pub backoff_max_ms: u64,
}

impl Retry {
    /// 5 attempts, 1 s doubling up to 60 s.
    pub const DEFAULT: Retry = Retry {
        attempts_max: 5,
        first_backoff_ms: 1_000,
        backoff_max_ms: 60_000,
    };

    fn backoff_ms(&self, failures: u32) -> u64 {
        let shift = failures.saturating_sub(1).min(32);
        self.first_backoff_ms
            .saturating_mul(1u64 << shift)
            .min(self.backoff_max_ms)
    }
}

/// A workflow: a name (unique in the app) and its steps, in order.
#[derive(Debug)]
pub struct Workflow {
    /// Its name.
    pub name: &'static str,
    /// Its steps.
    pub steps: &'static [Step],
    /// How its `run` steps are retried.
    pub retry: Retry,
}

/// What a step's function sees.
#[derive(Debug)]
pub struct Ctx {
    /// The instance's id.
    pub id: String,
    /// This attempt at the step (1 for the first).
    pub attempt: u32,
    input: Json,
}

impl Ctx {
    /// The input [`start`] was given.
    pub fn input<T: DeserializeOwned>(&self) -> Result<T> {
        decode(self.input.clone(), "the input")
    }

    /// The recorded result of the earlier step `name`.
    pub fn result<T: DeserializeOwned>(&self, name: &str) -> Result<T> {
        let rows = sql::query(
            "SELECT result FROM wasmkeep_sdk_workflow_steps WHERE id = ?1 AND name = ?2",
            params![self.id.as_str(), name],
        )?;
        let text = rows
            .rows
            .first()
            .map(|r| r.text(0).to_owned())
            .ok_or_else(|| {
                Error::new("no_such_step", format!("step `{name}` has no result yet"))
            })?;
        decode(parse(&text), &format!("the result of `{name}`"))
    }

    /// The payload of the `wait` step `name`: `None` if it timed out.
    pub fn event<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>> {
        self.result::<Option<T>>(name)
    }
}

fn decode<T: DeserializeOwned>(v: Json, what: &str) -> Result<T> {
    serde_json::from_value(v)
        .map_err(|e| Error::new("bad_workflow_value", format!("{what} does not decode: {e}")))
}

fn parse(text: &str) -> Json {
    serde_json::from_str(text).unwrap_or(Json::Null)
}

/// An instance's state, from [`get`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Its id.
    pub id: String,
    /// Its workflow's name.
    pub workflow: String,
    /// `running`, `sleeping`, `waiting`, `retrying`, `paused`, `done`,
    /// `failed` or `cancelled`.
    pub state: String,
    /// The index of the step it is at (the number of steps when done).
    pub step: u32,
    /// Failed attempts at the current step.
    pub failures: u32,
    /// When it wakes (sleeping, waiting, retrying), unix milliseconds.
    pub wake_ms: Option<u64>,
    /// The last error (`code: message`), if any.
    pub error: Option<String>,
}

/// A recorded step, from [`history`].
#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    /// The step's index and name.
    pub step: u32,
    /// Its name.
    pub name: String,
    /// Its result (JSON).
    pub result: Json,
    /// Attempts it took.
    pub attempts: u32,
    /// When it was recorded.
    pub done_ms: u64,
}

const COLUMNS: &str = "id, workflow, state, step, failures, wake_ms, error, gen, input";

struct Row {
    inst: Instance,
    generation: i64,
    input: Json,
}

fn load(id: &str) -> Result<Option<Row>> {
    timers::ensure_table()?;
    let rows = sql::query(
        &format!("SELECT {COLUMNS} FROM wasmkeep_sdk_workflows WHERE id = ?1"),
        params![id],
    )?;
    Ok(rows.rows.first().map(|r| Row {
        inst: Instance {
            id: r.text(0).to_owned(),
            workflow: r.text(1).to_owned(),
            state: r.text(2).to_owned(),
            step: r.int(3) as u32,
            failures: r.int(4) as u32,
            wake_ms: r.opt_int(5).map(|n| n as u64),
            error: (!r.is_null(6)).then(|| r.text(6).to_owned()),
        },
        generation: r.int(7),
        input: parse(r.text(8)),
    }))
}

fn need(id: &str) -> Result<Row> {
    load(id)?.ok_or_else(|| Error::not_found(format!("no workflow instance `{id}`")))
}

fn find<'a>(all: &[&'a Workflow], name: &str) -> Result<&'a Workflow> {
    all.iter().copied().find(|w| w.name == name).ok_or_else(|| {
        Error::new(
            "unknown_workflow",
            format!("no workflow named `{name}` in this build"),
        )
    })
}

fn set_state(id: &str, state: &str, wake_ms: Option<u64>) -> Result<()> {
    sql::execute(
        "UPDATE wasmkeep_sdk_workflows SET state = ?2, wake_ms = ?3, updated_ms = ?4 WHERE id = ?1",
        params![id, state, wake_ms, crate::now_ms()],
    )?;
    timers::rearm_unless_in_alarm()
}

/// The message that runs step `step` of generation `generation`.
fn send_step(id: &str, step: u32, generation: i64) -> Result<()> {
    let me = crate::id();
    let body = json!({ "wf": id, "step": step, "gen": generation }).to_string();
    let mut ctx = b"wk-wf:".to_vec();
    ctx.extend_from_slice(body.as_bytes());
    crate::outbox::send(
        &crate::outbox::to(&me.class, &me.name),
        body.as_bytes(),
        &ctx,
    )?;
    Ok(())
}

/// Records step `step`'s result and goes on from the next step.
fn complete(w: &Workflow, row: &Row, step: u32, result: &Json, attempts: u32) -> Result<()> {
    let now = crate::now_ms();
    sql::execute(
        "INSERT OR REPLACE INTO wasmkeep_sdk_workflow_steps (id, step, name, result, attempts, done_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            row.inst.id.as_str(),
            u64::from(step),
            w.steps[step as usize].name,
            result.to_string(),
            u64::from(attempts),
            now
        ],
    )?;
    sql::execute(
        "UPDATE wasmkeep_sdk_workflows SET step = ?2, failures = 0, error = NULL WHERE id = ?1",
        params![row.inst.id.as_str(), u64::from(step + 1)],
    )?;
    enter(w, row, step + 1)
}

/// Puts the instance at step `step` and starts it: a `run` step's message
/// leaves, a sleep or a wait sets the wake-up, past the end it is done.
fn enter(w: &Workflow, row: &Row, step: u32) -> Result<()> {
    let id = row.inst.id.as_str();
    let now = crate::now_ms();
    let Some(s) = w.steps.get(step as usize) else {
        return set_state(id, "done", None);
    };
    match s.kind {
        Kind::Run(_) => {
            set_state(id, "running", None)?;
            send_step(id, step, row.generation)
        }
        Kind::Sleep(ms) => set_state(id, "sleeping", Some(now.saturating_add(ms))),
        Kind::Call { make, timeout_ms } => send_call(row, step, make, timeout_ms),
        Kind::Wait { event, timeout_ms } => {
            let early = sql::query(
                "DELETE FROM wasmkeep_sdk_workflow_events WHERE id = ?1 AND event = ?2 RETURNING payload",
                params![id, event],
            )?;
            match early.rows.first() {
                Some(r) => complete(w, row, step, &parse(r.text(0)), 1),
                None => set_state(id, "waiting", Some(now.saturating_add(timeout_ms))),
            }
        }
    }
}

/// Sends a `call` step's call, tagged with the attempt it belongs to; a
/// call that cannot be built fails the instance.
fn send_call(row: &Row, step: u32, make: CallFn, timeout_ms: u64) -> Result<()> {
    let id = row.inst.id.as_str();
    let attempt = row.inst.failures + 1;
    let ctx = Ctx {
        id: id.to_owned(),
        attempt,
        input: row.input.clone(),
    };
    let out = match make(&ctx) {
        Ok(out) => out,
        Err(e) => {
            sql::execute(
                "UPDATE wasmkeep_sdk_workflows SET error = ?2 WHERE id = ?1",
                params![id, format!("{}: {}", e.code, e.message)],
            )?;
            return set_state(id, "failed", None);
        }
    };
    let tag = json!({ "wf": id, "step": step, "gen": row.generation, "attempt": attempt });
    let mut context = CALL_TAG.to_vec();
    context.extend_from_slice(tag.to_string().as_bytes());
    let body = crate::calls::__encode_call(&out.call, out.args);
    crate::outbox::send(&out.to, &body, &context)?;
    set_state(
        id,
        "calling",
        Some(crate::now_ms().saturating_add(timeout_ms)),
    )
}

/// The context prefix of a `call` step's call.
const CALL_TAG: &[u8] = b"wk-wfcall:";

/// Counts a failed attempt at the current step: retried after the backoff,
/// or the instance fails past its attempts.
fn fail_attempt(w: &Workflow, row: &Row, error: &str) -> Result<()> {
    let id = row.inst.id.as_str();
    let failures = row.inst.failures + 1;
    sql::execute(
        "UPDATE wasmkeep_sdk_workflows SET failures = ?2, error = ?3 WHERE id = ?1",
        params![id, u64::from(failures), error],
    )?;
    if failures >= w.retry.attempts_max {
        set_state(id, "failed", None)
    } else {
        let wake = crate::now_ms().saturating_add(w.retry.backoff_ms(failures));
        set_state(id, "retrying", Some(wake))
    }
}

/// Starts an instance `id` of `w` with `input`. `conflict` if `id` exists.
pub fn start(w: &Workflow, id: &str, input: &impl Serialize) -> Result<()> {
    if id.is_empty() || id.len() > ID_BYTES_MAX {
        return Err(Error::bad_request(format!(
            "a workflow id is 1 to {ID_BYTES_MAX} bytes: got {}",
            id.len()
        )));
    }
    if load(id)?.is_some() {
        return Err(Error::new(
            "conflict",
            format!("workflow instance `{id}` exists"),
        ));
    }
    let n = sql::query("SELECT count(*) FROM wasmkeep_sdk_workflows", &[])?;
    if n.rows.first().map_or(0, |r| r.int(0)) >= INSTANCES_MAX {
        return Err(Error::new(
            "too_many_workflows",
            format!(
                "the actor keeps workflows_max={INSTANCES_MAX} instances: forget finished ones"
            ),
        ));
    }
    let input = serde_json::to_string(input).map_err(|e| Error::bad_request(e.to_string()))?;
    let now = crate::now_ms();
    sql::execute(
        "INSERT INTO wasmkeep_sdk_workflows (id, workflow, state, step, failures, wake_ms, error, gen, input, created_ms, updated_ms) VALUES (?1, ?2, 'running', 0, 0, NULL, NULL, 1, ?3, ?4, ?4)",
        params![id, w.name, input, now],
    )?;
    enter(w, &need(id)?, 0)
}

/// Sends the event `event` to instance `id`: if it waits for that event,
/// the wait completes and the instance goes on in this event; otherwise
/// the event is kept until the instance reaches a `wait` for it (a later
/// signal of the same event replaces it).
pub fn signal(all: &[&Workflow], id: &str, event: &str, payload: &impl Serialize) -> Result<()> {
    let row = need(id)?;
    let payload = serde_json::to_string(payload).map_err(|e| Error::bad_request(e.to_string()))?;
    sql::execute(
        "INSERT OR REPLACE INTO wasmkeep_sdk_workflow_events (id, event, payload) VALUES (?1, ?2, ?3)",
        params![id, event, payload],
    )?;
    let w = find(all, &row.inst.workflow)?;
    let waits_for_it = matches!(
        w.steps.get(row.inst.step as usize).map(|s| s.kind),
        Some(Kind::Wait { event: e, .. }) if e == event
    );
    if row.inst.state == "waiting" && waits_for_it {
        // Entering the step again takes the event it now finds.
        enter(w, &row, row.inst.step)?;
    }
    Ok(())
}

/// Pauses instance `id`: nothing of it runs until [`resume`].
pub fn pause(id: &str) -> Result<()> {
    let row = need(id)?;
    if matches!(row.inst.state.as_str(), "done" | "failed" | "cancelled") {
        return Err(Error::new(
            "conflict",
            format!("`{id}` is {}", row.inst.state),
        ));
    }
    set_state(id, "paused", None)
}

/// Resumes a paused (or failed) instance at the step it stopped at.
pub fn resume(all: &[&Workflow], id: &str) -> Result<()> {
    let row = need(id)?;
    if !matches!(row.inst.state.as_str(), "paused" | "failed") {
        return Err(Error::new(
            "conflict",
            format!("`{id}` is {}", row.inst.state),
        ));
    }
    let w = find(all, &row.inst.workflow)?;
    sql::execute(
        "UPDATE wasmkeep_sdk_workflows SET failures = 0, gen = gen + 1 WHERE id = ?1",
        params![id],
    )?;
    enter(w, &need(id)?, row.inst.step)
}

/// Cancels instance `id` for good.
pub fn cancel(id: &str) -> Result<()> {
    need(id)?;
    sql::execute(
        "UPDATE wasmkeep_sdk_workflows SET gen = gen + 1 WHERE id = ?1",
        params![id],
    )?;
    set_state(id, "cancelled", None)
}

/// Runs instance `id` again from its step `step_name`: that step's record
/// and later ones are dropped; earlier results stay.
pub fn restart_from(all: &[&Workflow], id: &str, step_name: &str) -> Result<()> {
    let row = need(id)?;
    let w = find(all, &row.inst.workflow)?;
    let step = w
        .steps
        .iter()
        .position(|s| s.name == step_name)
        .ok_or_else(|| Error::bad_request(format!("`{}` has no step `{step_name}`", w.name)))?
        as u32;
    sql::execute(
        "DELETE FROM wasmkeep_sdk_workflow_steps WHERE id = ?1 AND step >= ?2",
        params![id, u64::from(step)],
    )?;
    sql::execute(
        "UPDATE wasmkeep_sdk_workflows SET step = ?2, failures = 0, error = NULL, gen = gen + 1 WHERE id = ?1",
        params![id, u64::from(step)],
    )?;
    enter(w, &need(id)?, step)
}

/// Instance `id`, if any.
pub fn get(id: &str) -> Result<Option<Instance>> {
    Ok(load(id)?.map(|r| r.inst))
}

/// The recorded steps of instance `id`, in order.
pub fn history(id: &str) -> Result<Vec<Done>> {
    timers::ensure_table()?;
    let rows = sql::query(
        "SELECT step, name, result, attempts, done_ms FROM wasmkeep_sdk_workflow_steps WHERE id = ?1 ORDER BY step",
        params![id],
    )?;
    Ok(rows
        .rows
        .iter()
        .map(|r| Done {
            step: r.int(0) as u32,
            name: r.text(1).to_owned(),
            result: parse(r.text(2)),
            attempts: r.int(3) as u32,
            done_ms: r.int(4) as u64,
        })
        .collect())
}

/// Forgets a finished (done, failed or cancelled) instance and its records.
pub fn forget(id: &str) -> Result<bool> {
    let Some(row) = load(id)? else {
        return Ok(false);
    };
    if !matches!(row.inst.state.as_str(), "done" | "failed" | "cancelled") {
        return Err(Error::new(
            "conflict",
            format!("`{id}` is {}", row.inst.state),
        ));
    }
    for t in [
        "wasmkeep_sdk_workflow_steps",
        "wasmkeep_sdk_workflow_events",
        "wasmkeep_sdk_workflows",
    ] {
        sql::execute(&format!("DELETE FROM {t} WHERE id = ?1"), params![id])?;
    }
    Ok(true)
}

/// The `(id, step, generation)` a step message or its context names.
fn step_of(bytes: &[u8]) -> Option<(String, u32, i64)> {
    let v: Json = serde_json::from_slice(bytes).ok()?;
    Some((
        v.get("wf")?.as_str()?.to_owned(),
        u32::try_from(v.get("step")?.as_u64()?).ok()?,
        v.get("gen")?.as_i64()?,
    ))
}

/// Runs the step a workflow message names (for
/// [`Actor::message`](crate::Actor::message)); `None` if `msg` is not
/// one. A message for a step that is not the instance's current one (a
/// copy, or one overtaken by a pause or restart) is answered and ignored.
pub fn on_message(all: &[&Workflow], msg: &Message) -> Option<Result<Vec<u8>>> {
    let me = crate::id();
    if msg.from.app != me.app || msg.from.class != me.class || msg.from.name != me.name {
        return None;
    }
    let (id, step, generation) = step_of(&msg.body)?;
    Some(run_step(all, &id, step, generation))
}

fn run_step(all: &[&Workflow], id: &str, step: u32, generation: i64) -> Result<Vec<u8>> {
    let Some(row) = load(id)? else {
        return Ok(b"stale".to_vec());
    };
    if row.inst.state != "running" || row.inst.step != step || row.generation != generation {
        return Ok(b"stale".to_vec());
    }
    let w = find(all, &row.inst.workflow)?;
    let Some(Kind::Run(f)) = w.steps.get(step as usize).map(|s| s.kind) else {
        return Ok(b"stale".to_vec());
    };
    let attempt = row.inst.failures + 1;
    let mut ctx = Ctx {
        id: id.to_owned(),
        attempt,
        input: row.input.clone(),
    };
    let result = f(&mut ctx)?;
    complete(w, &row, step, &result, attempt)?;
    Ok(b"done".to_vec())
}

/// Applies the answer to a step message (for
/// [`Actor::response`](crate::Actor::response)); `Ok(false)` if `r` is
/// not one. A refused step (its event failed) is retried after its
/// backoff, or the instance fails past its attempts.
pub fn on_response(all: &[&Workflow], r: &Response) -> Result<bool> {
    if let Some(tag) = r.context_bytes().strip_prefix(CALL_TAG) {
        return call_answered(all, tag, r).map(|_| true);
    }
    let Some(ctx) = r.context_bytes().strip_prefix(b"wk-wf:") else {
        return Ok(false);
    };
    let Some((id, step, generation)) = step_of(ctx) else {
        return Ok(false);
    };
    let error = match &r.answer {
        Answer::Refused(e) | Answer::Failed(e) => e,
        _ => return Ok(true),
    };
    let Some(row) = load(&id)? else {
        return Ok(true);
    };
    if row.inst.state != "running" || row.inst.step != step || row.generation != generation {
        return Ok(true);
    }
    let w = find(all, &row.inst.workflow)?;
    fail_attempt(w, &row, &format!("{}: {}", error.code, error.message))?;
    Ok(true)
}

/// The answer to a `call` step's call: its result, or a failed attempt.
/// An answer to another attempt, generation or step is ignored.
fn call_answered(all: &[&Workflow], tag: &[u8], r: &Response) -> Result<()> {
    let Some((id, step, generation)) = step_of(tag) else {
        return Ok(());
    };
    let attempt = serde_json::from_slice::<Json>(tag)
        .ok()
        .and_then(|v| v["attempt"].as_u64());
    let Some(row) = load(&id)? else {
        return Ok(());
    };
    let current = row.inst.state == "calling"
        && row.inst.step == step
        && row.generation == generation
        && attempt == Some(u64::from(row.inst.failures) + 1);
    if !current {
        return Ok(());
    }
    let w = find(all, &row.inst.workflow)?;
    match &r.answer {
        Answer::Reply(body) => {
            let answer = serde_json::from_slice(body).unwrap_or(Json::Null);
            complete(w, &row, step, &answer, row.inst.failures + 1)
        }
        Answer::Refused(e) | Answer::Failed(e) => {
            fail_attempt(w, &row, &format!("{}: {}", e.code, e.message))
        }
        Answer::Http(_) => Ok(()),
    }
}

/// Wakes the instances due at `now_ms` (for
/// [`Actor::alarm`](crate::Actor::alarm), beside the timers and cron
/// schedules): a sleep ends, a wait takes its event or times out, a
/// failed step is tried again.
pub fn on_alarm(all: &[&Workflow], now_ms: u64) -> Result<()> {
    timers::ensure_table()?;
    let due = sql::query(
        "SELECT id FROM wasmkeep_sdk_workflows WHERE wake_ms <= ?1 AND state IN ('sleeping', 'waiting', 'retrying', 'calling') ORDER BY wake_ms, id LIMIT ?2",
        params![now_ms, timers::DUE_PER_RUN_MAX],
    )?;
    for id in due.rows.iter().map(|r| r.text(0).to_owned()) {
        let row = need(&id)?;
        let w = find(all, &row.inst.workflow)?;
        let step = row.inst.step;
        match row.inst.state.as_str() {
            "sleeping" => complete(w, &row, step, &Json::Null, 1)?,
            // Its event would have completed it (`signal`): timed out,
            // the step's result is null.
            "waiting" => complete(w, &row, step, &Json::Null, 1)?,
            "calling" => fail_attempt(w, &row, "timeout: no answer to the call in time")?,
            // Retrying: the step again (a `run` step's message, or a
            // `call` step's call).
            _ => enter(w, &row, step)?,
        }
    }
    Ok(())
}
