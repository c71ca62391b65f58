//! An actor that attacks the node running it, for the hostile-guest tests
//! (`crates/wasmkeep/tests/hostile.rs`, issue 17). Not an example to follow.
//!
//! Class `attacker`. Each route is one attack. A route whose host call fails
//! answers the error it got as `{"code","message"}` with status 422 (so the
//! test sees what the host said, not what the guest made of it); a route
//! that succeeds answers what it achieved.
//!
//! SQL:
//! - `POST /sql` (body: one statement): runs it with `sql::query`; answers
//!   `{"columns":[…],"rows":[[…]]}` (a blob as `{"blob":"<hex>"}`).
//! - `POST /sql-param` (body: one statement): the same, with one 8-byte blob
//!   bound as `?1`: a forged native pointer, `0x4141414141414141`
//!   (the `fts3_tokenizer` attack).
//! - `POST /sql-batch` (body: a JSON array of statements): runs them in
//!   order in one event; answers `{"results":[…]}`, or the first error with
//!   its `"step"`.
//! - `POST /deep-sql?frames=N` (body as for `/sql-batch`): recurses N wasm
//!   frames, each holding its values on the native stack, then runs the
//!   statements at the bottom (what is left of the worker's native stack
//!   is all SQLite gets); answers as `/sql-batch`, with `"frames"`.
//! - `POST /forever`: a recursive CTE that never ends.
//! - `POST /catch-forever`: runs it, ignores the error, and runs it again,
//!   for ever.
//! - `POST /wide-row?cols=N&bytes=B`: one row of N columns of
//!   `randomblob(B)` (B defaults to 2,000,000).
//! - `POST /sort-spill?rows=N&how=distinct|order`: a `DISTINCT` (or an
//!   `ORDER BY` with an offset) over N rows of `randomblob(1000)`, which
//!   spills to temporary storage.
//! - `POST /many-params?n=N`: a statement with N parameters.
//! - `POST /big-param?bytes=N`: binds one blob of N bytes.
//!
//! Everything else:
//! - `POST /kv-fill?n=N&bytes=B`, `GET /kv-list`: fill, then list it all.
//! - `POST /log-flood?lines=N&bytes=B`: N log lines of B bytes, one event.
//! - `POST /mem-grow`: grows linear memory until refused; answers
//!   `{"bytes":N}`, the size it reached.
//! - `POST /stack-overflow`: recurses until the wasm stack runs out.
//! - `POST /respond?status=S` (body: header lines, a blank line, the body):
//!   answers with whatever status, headers and body it is told (framing
//!   headers, a forged second response, `101 Switching Protocols`).
//! - `POST /alarm-storm`, `POST /alarm-stop`, `GET /alarm-count`: an alarm
//!   handler that sets its alarm for now, every time it runs.
//! - `GET /ping`: `{"ok":true}`, to show the actor still serves.
//! - `GET /headers`: `{"headers":[[name, value]...]}`, every request header
//!   the actor was given (what a tenant learns of its callers).

use serde_json::{Value as Json, json};
use wasmkeep_sdk::{
    Actor, AlarmInfo, Error, Request, Response, Result, Value, alarm, kv, log, now_ms, sql,
};

/// A statement SQLite never finishes: it counts an endless sequence.
const FOREVER: &str =
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c";

/// The forged pointer the `fts3_tokenizer` attack binds: what a tokenizer
/// module's address would be if SQLite believed it.
const FORGED_POINTER: u64 = 0x4141_4141_4141_4141;

#[derive(Default)]
struct Attacker;

fn error_json(e: &Error) -> Response {
    Response::json(
        422,
        json!({ "code": e.code, "message": e.message }).to_string(),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn value_json(v: &Value) -> Json {
    match v {
        Value::Null => Json::Null,
        Value::Integer(n) => json!(n),
        Value::Real(f) => json!(f),
        Value::Text(s) => json!(s),
        Value::Blob(b) => json!({ "blob": hex(b) }),
    }
}

fn rows_json(r: &sql::Rows) -> Json {
    let rows: Vec<Json> = r
        .rows
        .iter()
        .map(|row| Json::Array(row.0.iter().map(value_json).collect()))
        .collect();
    json!({ "columns": r.columns, "rows": rows })
}

/// Runs one statement and answers its rows, or the host's error as 422.
fn run(statement: &str, params: &[Value]) -> Response {
    match sql::query(statement, params) {
        Ok(r) => Response::json(200, rows_json(&r).to_string()),
        Err(e) => error_json(&e),
    }
}

/// Runs statements in order in this one event; stops at the first error.
fn run_batch(body: &[u8]) -> Result<Response> {
    let statements: Vec<String> = serde_json::from_slice(body)
        .map_err(|e| Error::bad_request(format!("body is not a JSON array of strings: {e}")))?;
    let mut results = Vec::with_capacity(statements.len());
    for (step, s) in statements.iter().enumerate() {
        match sql::query(s, &[]) {
            Ok(r) => results.push(rows_json(&r)),
            Err(e) => {
                let body = json!({ "step": step, "code": e.code, "message": e.message });
                return Ok(Response::json(422, body.to_string()));
            }
        }
    }
    Ok(Response::json(
        200,
        json!({ "results": results }).to_string(),
    ))
}

/// Recurses `n` frames whose values stay live across the call (so each
/// frame spills them to the native stack), then runs `body`'s statements.
#[inline(never)]
fn deep(n: u64, a: u64, b: u64, c: u64, d: u64, body: &[u8]) -> Result<Response> {
    if n == 0 {
        return run_batch(body);
    }
    let (e, f, g, h) = (
        std::hint::black_box(a ^ n),
        std::hint::black_box(b.wrapping_add(n)),
        std::hint::black_box(c.rotate_left(3)),
        std::hint::black_box(d.wrapping_mul(31)),
    );
    let r = deep(n - 1, e, f, g, h, body);
    // Uses every value after the call, so none can be dropped before it.
    std::hint::black_box(a ^ b ^ c ^ d ^ e ^ f ^ g ^ h);
    r
}

/// The query parameter `name` as a number, or `default`.
fn num(req: &Request, name: &str, default: u64) -> Result<u64> {
    Ok(req.query_u64(name)?.unwrap_or(default))
}

/// One row of `cols` columns, each a fresh blob of `bytes` bytes: SQLite
/// builds the whole row before the host sees its first value.
fn wide_row(cols: u64, bytes: u64) -> Response {
    let columns: Vec<String> = (0..cols)
        .map(|i| format!("randomblob({bytes}) AS c{i}"))
        .collect();
    run(&format!("SELECT {}", columns.join(", ")), &[])
}

/// A sort too big for memory: SQLite spills it to a temporary file.
fn sort_spill(rows: u64, how: &str) -> Response {
    let source = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < ?1)";
    let statement = match how {
        // An offset as large as the input makes the sorter keep every row.
        "order" => format!(
            "{source} SELECT length(b) FROM (SELECT randomblob(1000) AS b FROM r) \
             ORDER BY b LIMIT 1 OFFSET ?1 - 1"
        ),
        _ => format!("{source} SELECT count(*) FROM (SELECT DISTINCT randomblob(1000) FROM r)"),
    };
    run(&statement, &[Value::Integer(rows as i64)])
}

/// A statement with `n` parameters, all bound.
fn many_params(n: u64) -> Response {
    let marks = vec!["?"; n.max(1) as usize].join(", ");
    let params: Vec<Value> = (0..n.max(1)).map(|i| Value::Integer(i as i64)).collect();
    run(&format!("SELECT coalesce({marks})"), &params)
}

fn kv_fill(n: u64, bytes: u64) -> Result<Response> {
    for i in 0..n {
        if let Err(e) = kv::put(&format!("k{i:08}"), &vec![i as u8; bytes as usize]) {
            return Ok(error_json(&e));
        }
    }
    Ok(Response::json(200, json!({ "n": n }).to_string()))
}

fn kv_list_all() -> Response {
    let everything = kv::ListOptions {
        prefix: None,
        start: None,
        end: None,
        limit: None,
        reverse: false,
    };
    match kv::list(&everything) {
        Ok(entries) => {
            let bytes: usize = entries.iter().map(|(k, v)| k.len() + v.len()).sum();
            let body = json!({ "entries": entries.len(), "bytes": bytes });
            Response::json(200, body.to_string())
        }
        Err(e) => error_json(&e),
    }
}

fn log_flood(lines: u64, bytes: u64) -> Response {
    let line = "x".repeat(bytes as usize);
    for i in 0..lines {
        log::warn(&format!("hostile flood {i} {line}"));
    }
    Response::json(200, json!({ "lines": lines }).to_string())
}

/// Grows memory 0, first by 4 GiB at once, then 1 MiB at a time, until the
/// host refuses; answers the size reached.
#[cfg(target_arch = "wasm32")]
fn mem_grow() -> Response {
    use core::arch::wasm32::{memory_grow, memory_size};
    let _ = memory_grow(0, 65_536);
    while memory_grow(0, 16) != usize::MAX {}
    let bytes = memory_size(0) as u64 * 65_536;
    Response::json(200, json!({ "bytes": bytes }).to_string())
}

#[cfg(not(target_arch = "wasm32"))]
fn mem_grow() -> Response {
    Response::status(501)
}

/// What `/leave` writes and `/find` looks for: each byte of the request's
/// body XOR this, so that the bytes searched for are nowhere in memory
/// but where `/leave` put them (the body itself differs).
const LEAVE_MASK: u8 = 0x5a;

/// Leaves the body (1 to 64 bytes), masked, in the module's static data
/// and in 256 KiB of heap that is never freed (memory grown for it): what
/// a later instance in the same slot must not see (ADR 0078). Answers the
/// memory's size in 64 KiB pages.
#[cfg(target_arch = "wasm32")]
fn leave(body: &[u8]) -> Response {
    // Not zeros, so that it lies in a data segment: a page the module's
    // image fills, which a reset must restore rather than zero.
    static LEFT: std::sync::Mutex<[u8; 64]> = std::sync::Mutex::new([1; 64]);
    if body.is_empty() || body.len() > 64 {
        return Response::status(400);
    }
    let masked: Vec<u8> = body.iter().map(|b| b ^ LEAVE_MASK).collect();
    let mut heap = Vec::with_capacity(256 * 1024);
    while heap.len() + masked.len() <= heap.capacity() {
        heap.extend_from_slice(&masked);
    }
    std::mem::forget(heap);
    LEFT.lock().unwrap()[..masked.len()].copy_from_slice(&masked);
    let pages = core::arch::wasm32::memory_size(0);
    Response::json(200, json!({ "pages": pages }).to_string())
}

#[cfg(not(target_arch = "wasm32"))]
fn leave(_: &[u8]) -> Response {
    Response::status(501)
}

/// Grows the memory to `pages` (what `/leave` answered), then searches
/// the whole of it for the body, masked as `/leave` writes it, without
/// ever holding the masked bytes: how many places hold them.
#[cfg(target_arch = "wasm32")]
fn find(key: &[u8], pages: usize) -> Response {
    use core::arch::wasm32::{memory_grow, memory_size};
    if memory_size(0) < pages {
        let _ = memory_grow(0, pages - memory_size(0));
    }
    let end = memory_size(0) * 65_536;
    let mut found = 0u64;
    // From 1 KiB: below it lies nothing a program writes, and address 0
    // is Rust's null.
    let mut at = 1024;
    while !key.is_empty() && at + key.len() <= end {
        let holds = key.iter().enumerate().all(|(i, k)| {
            // SAFETY: inside the linear memory, which is all readable.
            let b = unsafe { core::ptr::read_volatile((at + i) as *const u8) };
            b == k ^ LEAVE_MASK
        });
        found += u64::from(holds);
        at += 1;
    }
    Response::json(200, json!({ "found": found }).to_string())
}

#[cfg(not(target_arch = "wasm32"))]
fn find(_: &[u8], _: usize) -> Response {
    Response::status(501)
}

/// Recurses with a frame the optimiser cannot remove, until the wasm stack
/// is exhausted.
fn recurse(depth: u64) -> u64 {
    let frame = std::hint::black_box([depth; 32]);
    if depth == u64::MAX {
        return frame[0];
    }
    recurse(depth + 1).wrapping_add(frame[7])
}

/// Answers with the status, headers and body the request dictates: the body
/// is header lines (`name: value`), a blank line, then the response body.
fn respond(status: u64, body: &[u8]) -> Response {
    let text = String::from_utf8_lossy(body);
    let (head, rest) = text.split_once("\n\n").unwrap_or((&text, ""));
    let headers = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Response {
        status: status as u16,
        headers,
        body: rest.as_bytes().to_vec(),
    }
}

fn alarm_storm(on: bool) -> Result<Response> {
    if on {
        kv::put("storm", b"on")?;
        alarm::set(now_ms())?;
    } else {
        kv::delete("storm")?;
        alarm::delete();
    }
    Ok(Response::status(204))
}

impl Actor for Attacker {
    fn init(&mut self) -> Result<()> {
        sql::execute(
            "CREATE TABLE fired (id INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL)",
            &[],
        )?;
        Ok(())
    }

    fn request(&mut self, req: Request) -> Result<Response> {
        match req.route() {
            ("POST", "/sql") => Ok(run(req.text()?, &[])),
            ("POST", "/sql-param") => {
                let forged = FORGED_POINTER.to_le_bytes().to_vec();
                Ok(run(req.text()?, &[Value::Blob(forged)]))
            }
            ("POST", "/sql-batch") => run_batch(&req.body),
            ("POST", "/deep-sql") => deep(num(&req, "frames", 0)?, 1, 2, 3, 4, &req.body),
            ("POST", "/forever") => Ok(run(FOREVER, &[])),
            ("POST", "/catch-forever") => {
                // A guest that swallows the deadline's error and carries on:
                // the event must still fail for the time it took.
                let mut attempts: u64 = 0;
                loop {
                    let _ = std::hint::black_box(sql::query(FOREVER, &[]));
                    attempts = std::hint::black_box(attempts.wrapping_add(1));
                }
            }
            ("POST", "/wide-row") => Ok(wide_row(
                num(&req, "cols", 300)?,
                num(&req, "bytes", 2_000_000)?,
            )),
            ("POST", "/sort-spill") => {
                let how = req.query_param("how").unwrap_or_default();
                Ok(sort_spill(num(&req, "rows", 100_000)?, &how))
            }
            ("POST", "/many-params") => Ok(many_params(num(&req, "n", 100_000)?)),
            ("POST", "/big-param") => {
                let blob = vec![0x41u8; num(&req, "bytes", 4 << 20)? as usize];
                Ok(run("SELECT length(?1)", &[Value::Blob(blob)]))
            }
            ("POST", "/kv-fill") => kv_fill(num(&req, "n", 10)?, num(&req, "bytes", 1 << 20)?),
            ("GET", "/kv-list") => Ok(kv_list_all()),
            ("POST", "/log-flood") => Ok(log_flood(
                num(&req, "lines", 10_000)?,
                num(&req, "bytes", 1000)?,
            )),
            ("POST", "/mem-grow") => Ok(mem_grow()),
            ("POST", "/leave") => Ok(leave(&req.body)),
            ("POST", "/find") => Ok(find(&req.body, num(&req, "pages", 0)? as usize)),
            ("POST", "/stack-overflow") => {
                let n = recurse(0);
                Ok(Response::json(200, json!({ "depth": n }).to_string()))
            }
            ("POST", "/respond") => Ok(respond(num(&req, "status", 200)?, &req.body)),
            ("POST", "/alarm-storm") => alarm_storm(true),
            ("POST", "/alarm-stop") => alarm_storm(false),
            ("GET", "/alarm-count") => Ok(run("SELECT count(*) FROM fired", &[])),
            ("GET", "/ping") => Ok(Response::json(200, r#"{"ok":true}"#)),
            ("GET", "/headers") => Ok(Response::json(200, json!({ "headers": req.headers }).to_string())),
            _ => Ok(Response::not_found()),
        }
    }

    fn alarm(&mut self, _info: AlarmInfo) -> Result<()> {
        if kv::get("storm")?.is_some() {
            let now = now_ms();
            sql::execute(
                "INSERT INTO fired (at_ms) VALUES (?1)",
                &[Value::Integer(now as i64)],
            )?;
            alarm::set(now)?;
        }
        Ok(())
    }
}

wasmkeep_sdk::app!("attacker" => Attacker);
