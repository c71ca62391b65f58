//! Write wasmkeep actors in Rust.
//!
//! An app is one WebAssembly component with one or more classes. Each class
//! is a type that implements [`Actor`]; [`app!`] exports them:
//!
//! ```ignore
//! use wasmkeep_sdk::{Actor, Request, Response, Result, sql};
//!
//! #[derive(Default)]
//! struct Counter;
//!
//! impl Actor for Counter {
//!     fn init(&mut self) -> Result<()> {
//!         sql::execute("CREATE TABLE c (n INTEGER NOT NULL)", &[])?;
//!         sql::execute("INSERT INTO c VALUES (0)", &[])?;
//!         Ok(())
//!     }
//!     fn request(&mut self, req: Request) -> Result<Response> {
//!         let rows = sql::query("UPDATE c SET n = n + 1 RETURNING n", &[])?;
//!         Ok(Response::json(200, format!("{{\"value\":{}}}", rows.rows[0].int(0))))
//!     }
//! }
//!
//! wasmkeep_sdk::app!("counter" => Counter);
//! ```
//!
//! Build with `cargo build --release --target wasm32-wasip2` (crate type
//! `cdylib`), then `wasmkeep deploy`. Every event runs as one transaction:
//! return `Err` (or panic) and everything it wrote through [`sql`], [`kv`]
//! and [`alarm`] is rolled back. An instance serves one actor, so `&mut
//! self` is that actor's in-memory state; it survives between events while
//! the actor stays active, but is not rolled back with a failed event and is
//! gone after the actor goes idle: keep what matters in the database.
//!
//! This crate is only a thin, safe layer over the bindings generated from
//! `wit/actor.wit`; it has no runtime of its own.

// The generated bindings and `app!` name this crate by its path, inside it
// too.
extern crate self as wasmkeep_sdk;

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "actor",
        pub_export_macro: true,
        export_macro_name: "__export_actor_world",
        default_bindings_module: "wasmkeep_sdk::bindings",
        runtime_path: "wasmkeep_sdk::__wit_bindgen::rt",
    });
}

#[doc(hidden)]
pub use wit_bindgen as __wit_bindgen;

use bindings::wasmkeep::actor as wit;

pub use wit::types::{AlarmInfo, Error, Value};

/// The result type of every handler and host call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with a stable `code` and a message for people.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Error {
        Error {
            code: code.into(),
            message: message.into(),
        }
    }

    /// The request was at fault: the client gets 400 `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Error {
        Error::new("bad_request", message)
    }

    /// Something the request named does not exist: 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Error {
        Error::new("not_found", message)
    }

    /// The request conflicts with the actor's state: 409 `conflict`.
    pub fn conflict(message: impl Into<String>) -> Error {
        Error::new("conflict", message)
    }
}

// `Display` and `std::error::Error` for `Error` come with the bindings.

/// One class of actors.
///
/// A value of the type is created (with `Default`) for each actor when it
/// becomes active.
pub trait Actor: Default + 'static {
    /// The first event of a new actor; runs in the same transaction as the
    /// event that created the actor. Create tables here.
    fn init(&mut self) -> Result<()> {
        Ok(())
    }

    /// An HTTP request addressed to this actor. Returning `Err` rolls back
    /// what the event wrote; the client gets 500 with the error's code, or
    /// 400/404/409 for [`Error::bad_request`], [`Error::not_found`] and
    /// [`Error::conflict`].
    fn request(&mut self, req: Request) -> Result<Response>;

    /// The actor's alarm fired. Returning `Err` (or panicking) rolls the
    /// handler's writes back and retries it later, backing off from 1 s to
    /// 5 min; `info.retry_count` counts the failures so far.
    fn alarm(&mut self, info: AlarmInfo) -> Result<()> {
        let _ = info;
        Ok(())
    }

    /// A message from another actor ([`outbox::send`]). What this returns
    /// is the sender's answer; `Err` also rolls back what the handler
    /// wrote. A message is handled once: a repeated delivery gets the same
    /// answer without calling this again. By default: `Err(no_handler)`.
    fn message(&mut self, msg: outbox::Message) -> Result<Vec<u8>> {
        let _ = msg;
        Err(Error::new(
            "no_handler",
            "this class does not handle messages",
        ))
    }

    /// The answer to a message or HTTP call this actor sent, once, in an
    /// event of its own. Returning `Err` rolls back what it wrote, and the
    /// node offers the answer again (a few times; then it is dropped).
    fn response(&mut self, r: outbox::Response) -> Result<()> {
        let _ = r;
        Ok(())
    }

    /// A message on one of the actor's WebSockets ([`sockets::accept`]),
    /// as an event of its own; the actor may have been closed since the
    /// last one (hibernated), so keep state in the database or the
    /// socket's attachment, not in `self`.
    fn socket_message(
        &mut self,
        socket: sockets::SocketInfo,
        message: sockets::Message,
    ) -> Result<()> {
        let _ = (socket, message);
        Ok(())
    }

    /// One of the actor's sockets closed (`code` is the WebSocket close
    /// code; see the README for the node's own).
    fn socket_close(
        &mut self,
        socket: sockets::SocketInfo,
        code: u16,
        reason: String,
    ) -> Result<()> {
        let _ = (socket, code, reason);
        Ok(())
    }
}

/// An HTTP request addressed to one actor.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// The path after `/v1/{tenant}/{app}/{class}/{name}`, starting with `/`.
    pub path: String,
    /// The raw query string, without `?`.
    pub query: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The first value of a query parameter, percent-decoded.
    pub fn query_param(&self, name: &str) -> Option<String> {
        self.query.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k) == name).then(|| percent_decode(v))
        })
    }

    /// A query parameter parsed as a number, with a clear error if it is
    /// missing or malformed.
    pub fn query_u64(&self, name: &str) -> Result<Option<u64>> {
        match self.query_param(name) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                Error::bad_request(format!("query parameter `{name}` is not a number: `{v}`"))
            }),
        }
    }

    /// The first value of a header (names compare case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as UTF-8 text.
    pub fn text(&self) -> Result<&str> {
        std::str::from_utf8(&self.body).map_err(|_| Error::bad_request("body is not utf-8"))
    }

    /// `(method, path)`, for matching routes.
    pub fn route(&self) -> (&str, &str) {
        (self.method.as_str(), self.path.as_str())
    }
}

fn percent_decode(s: &str) -> String {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a handler answers.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// A response with a status and no body.
    pub fn status(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// A JSON response; `body` must already be JSON.
    pub fn json(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.into().into_bytes(),
        }
    }

    /// A plain-text response.
    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            headers: vec![("content-type".into(), "text/plain; charset=utf-8".into())],
            body: body.into().into_bytes(),
        }
    }

    /// The conventional 404 for a path the actor does not serve.
    pub fn not_found() -> Response {
        Response::json(
            404,
            r#"{"error":{"code":"route_not_found","message":"no such route"}}"#,
        )
    }
}

/// SQL over the actor's own database.
pub mod sql {
    use super::{Result, Value, wit};

    /// One row of a query's result.
    #[derive(Debug, Clone)]
    pub struct Row(pub Vec<Value>);

    impl Row {
        /// Column `i` as an integer (0 for NULL or another type).
        pub fn int(&self, i: usize) -> i64 {
            match self.0.get(i) {
                Some(Value::Integer(n)) => *n,
                Some(Value::Real(f)) => *f as i64,
                _ => 0,
            }
        }

        /// Column `i` as an optional integer.
        pub fn opt_int(&self, i: usize) -> Option<i64> {
            match self.0.get(i) {
                Some(Value::Integer(n)) => Some(*n),
                _ => None,
            }
        }

        /// Column `i` as a real number.
        pub fn real(&self, i: usize) -> f64 {
            match self.0.get(i) {
                Some(Value::Real(f)) => *f,
                Some(Value::Integer(n)) => *n as f64,
                _ => 0.0,
            }
        }

        /// Column `i` as text ("" for NULL or another type).
        pub fn text(&self, i: usize) -> &str {
            match self.0.get(i) {
                Some(Value::Text(s)) => s,
                _ => "",
            }
        }

        /// Column `i` as bytes (empty for NULL or another type).
        pub fn blob(&self, i: usize) -> &[u8] {
            match self.0.get(i) {
                Some(Value::Blob(b)) => b,
                Some(Value::Text(s)) => s.as_bytes(),
                _ => &[],
            }
        }

        pub fn is_null(&self, i: usize) -> bool {
            matches!(self.0.get(i), None | Some(Value::Null))
        }
    }

    /// The rows a query returned.
    #[derive(Debug, Clone)]
    pub struct Rows {
        pub columns: Vec<String>,
        pub rows: Vec<Row>,
        pub rows_written: u64,
    }

    /// Runs a statement that returns rows (SELECT, or RETURNING).
    pub fn query(statement: &str, params: &[Value]) -> Result<Rows> {
        let r = wit::sql::query(statement, params)?;
        Ok(Rows {
            columns: r.columns,
            rows: r.rows.into_iter().map(Row).collect(),
            rows_written: r.rows_written,
        })
    }

    /// Runs a statement that returns no rows; the number of rows it changed.
    pub fn execute(statement: &str, params: &[Value]) -> Result<u64> {
        Ok(wit::sql::execute(statement, params)?.rows_written)
    }

    /// Like [`execute`], returning the last inserted rowid.
    pub fn insert(statement: &str, params: &[Value]) -> Result<i64> {
        Ok(wit::sql::execute(statement, params)?.last_insert_rowid)
    }

    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Null, Value::Null) => true,
            (Value::Integer(x), Value::Integer(y)) => x == y,
            (Value::Real(x), Value::Real(y)) => x == y,
            (Value::Text(x), Value::Text(y)) => x == y,
            (Value::Blob(x), Value::Blob(y)) => x == y,
            _ => false,
        }
    }

    /// Applies a decision only if the record it was taken on is unchanged:
    /// `read` (one row, one column: a generation, a version, a state)
    /// must still give `seen`, or `apply` does not run and this returns
    /// `Ok(false)`. A missing row reads as NULL.
    ///
    /// The decision and its inputs may be an event apart: a send recorded
    /// `seen` in its context, and the answer's event applies only if
    /// nothing moved the record meanwhile (the second seed's stale
    /// timeout, which overwrote an answer given while the call was out).
    ///
    /// ```ignore
    /// let applied = sql::apply_if_unchanged(
    ///     "SELECT generation FROM rings WHERE booking = ?1",
    ///     &[booking.into()],
    ///     &Value::Integer(generation),
    ///     || sql::execute("UPDATE rings SET state = 'timeout' WHERE booking = ?1", &[booking.into()]).map(drop),
    /// )?;
    /// ```
    pub fn apply_if_unchanged(
        read: &str,
        params: &[Value],
        seen: &Value,
        apply: impl FnOnce() -> Result<()>,
    ) -> Result<bool> {
        let rows = query(read, params)?;
        let now = rows
            .rows
            .first()
            .and_then(|r| r.0.first().cloned())
            .unwrap_or(Value::Null);
        if !same(&now, seen) {
            return Ok(false);
        }
        apply()?;
        Ok(true)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Integer(v)
    }
}
impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Integer(v as i64)
    }
}
impl From<i32> for Value {
    fn from(v: i32) -> Value {
        Value::Integer(v as i64)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Integer(v as i64)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Real(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}
impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Value {
        Value::Blob(v)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        v.map(Into::into).unwrap_or(Value::Null)
    }
}

/// Builds a parameter list: `params![1, "two", 3.0]`.
#[macro_export]
macro_rules! params {
    ($($v:expr),* $(,)?) => { &[$($crate::Value::from($v)),*] };
}

/// The actor's sorted key-value store (string keys, byte values).
pub mod kv {
    use super::{Result, wit};

    pub use wit::kv::ListOptions;

    pub fn get(key: &str) -> Result<Option<Vec<u8>>> {
        wit::kv::get(key)
    }

    pub fn put(key: &str, value: &[u8]) -> Result<()> {
        wit::kv::put(key, value)
    }

    /// Whether the key existed.
    pub fn delete(key: &str) -> Result<bool> {
        wit::kv::delete(key)
    }

    /// Entries whose key starts with `prefix`, in key order.
    pub fn list_prefix(prefix: &str, limit: Option<u32>) -> Result<Vec<(String, Vec<u8>)>> {
        list(&ListOptions {
            prefix: Some(prefix.to_owned()),
            start: None,
            end: None,
            limit,
            reverse: false,
        })
    }

    pub fn list(options: &ListOptions) -> Result<Vec<(String, Vec<u8>)>> {
        wit::kv::list(options)
    }
}

/// The actor's one alarm.
pub mod alarm {
    use super::{Result, wit};

    /// Sets (or replaces) the alarm, in unix milliseconds.
    pub fn set(at_ms: u64) -> Result<()> {
        wit::alarm::set_alarm(at_ms)
    }

    /// The pending alarm (inside `alarm()`: only one the handler set).
    pub fn get() -> Option<u64> {
        wit::alarm::get_alarm()
    }

    pub fn delete() {
        wit::alarm::delete_alarm()
    }
}

/// Many named timers on the actor's one alarm.
///
/// An actor has a single alarm; an object that needs several deadlines (a
/// ring that times out, a watch that fires every hour, a reminder) would
/// otherwise share it by hand, and one job setting the alarm for its own
/// time can postpone another's (the second seed's bug). These timers live
/// in the actor's database (table `wasmkeep_sdk_timers`, written in the
/// event's own transaction, so a rolled-back event sets or cancels
/// nothing) and the alarm is always kept at the earliest of them: setting a
/// later timer never moves it, an earlier one brings it forward.
///
/// In the alarm handler, [`take_due`] removes and returns the timers that
/// are due, earliest first. The alarm is re-armed for the next timer once
/// the handler returned `Ok` (timers set or cancelled during the run are
/// counted too); if the handler fails, its rollback puts the timers back
/// and the alarm is left alone, so the runtime's retry (with its backoff)
/// runs them again. Do not set the alarm with
/// [`alarm::set`](crate::alarm::set) in an actor that uses timers: the two
/// would overwrite each other.
///
/// ```ignore
/// fn request(&mut self, req: Request) -> Result<Response> {
///     timers::set("ring-timeout", now_ms() + 30_000, b"booking-17")?;
///     Ok(Response::status(204))
/// }
/// fn alarm(&mut self, _info: AlarmInfo) -> Result<()> {
///     for t in timers::take_due(now_ms())? {
///         match t.name.as_str() {
///             "ring-timeout" => { /* t.payload is b"booking-17" */ }
///             _ => {}
///         }
///     }
///     Ok(())
/// }
/// ```
pub mod timers {
    use super::{Error, Result, alarm, sql};

    /// Most timers one actor keeps.
    pub const TIMERS_MAX: i64 = 10_000;
    /// Longest timer name, in bytes.
    pub const NAME_BYTES_MAX: usize = 256;
    /// Largest payload, in bytes.
    pub const PAYLOAD_BYTES_MAX: usize = 64 * 1024;
    /// Most timers one [`take_due`] returns; the alarm is re-armed at once
    /// (in the past) for the rest.
    pub const DUE_PER_RUN_MAX: i64 = 1_000;

    /// A pending (or, from [`take_due`], due) timer.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Timer {
        pub name: String,
        pub due_ms: u64,
        pub payload: Vec<u8>,
    }

    use std::sync::atomic::{AtomicBool, Ordering};

    /// An alarm run is under way: the alarm is re-armed after it, not
    /// during it (a run that fails must leave it as it was, so the runtime
    /// retries the run with its backoff instead of keeping a later timer's
    /// time or none).
    static IN_ALARM: AtomicBool = AtomicBool::new(false);
    /// This run used the timers: re-arm after it.
    static TOUCHED: AtomicBool = AtomicBool::new(false);

    /// Runs the class's alarm handler (`app!` calls this), then, if it
    /// succeeded and used the timers, sets the alarm to the earliest one.
    #[doc(hidden)]
    pub fn __alarm_run(run: impl FnOnce() -> Result<()>) -> Result<()> {
        IN_ALARM.store(true, Ordering::Relaxed);
        TOUCHED.store(false, Ordering::Relaxed);
        let r = run();
        IN_ALARM.store(false, Ordering::Relaxed);
        if r.is_ok() && TOUCHED.swap(false, Ordering::Relaxed) {
            rearm()?;
        }
        r
    }

    fn ensure_table() -> Result<()> {
        TOUCHED.store(true, Ordering::Relaxed);
        sql::execute(
            "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_timers (name TEXT PRIMARY KEY, due_ms INTEGER NOT NULL, payload BLOB NOT NULL) WITHOUT ROWID",
            &[],
        )?;
        sql::execute(
            "CREATE INDEX IF NOT EXISTS wasmkeep_sdk_timers_due ON wasmkeep_sdk_timers (due_ms, name)",
            &[],
        )?;
        Ok(())
    }

    fn timer(row: &sql::Row) -> Timer {
        Timer {
            name: row.text(0).to_owned(),
            due_ms: row.int(1) as u64,
            payload: row.blob(2).to_vec(),
        }
    }

    /// Keeps the alarm at the earliest timer, or none (after the run, in
    /// an alarm run).
    fn rearm_unless_in_alarm() -> Result<()> {
        if IN_ALARM.load(Ordering::Relaxed) {
            return Ok(());
        }
        rearm()
    }

    fn rearm() -> Result<()> {
        let rows = sql::query("SELECT min(due_ms) FROM wasmkeep_sdk_timers", &[])?;
        match rows.rows.first().and_then(|r| r.opt_int(0)) {
            Some(due) if alarm::get() != Some(due as u64) => alarm::set(due as u64),
            Some(_) => Ok(()),
            None => {
                alarm::delete();
                Ok(())
            }
        }
    }

    /// Sets the timer `name` (or moves it, replacing its payload) to fire
    /// at `due_ms` (unix milliseconds). Errors: `invalid_timer` for a name
    /// that is empty or longer than [`NAME_BYTES_MAX`], or a payload over
    /// [`PAYLOAD_BYTES_MAX`]; `too_many_timers` past [`TIMERS_MAX`].
    pub fn set(name: &str, due_ms: u64, payload: &[u8]) -> Result<()> {
        if name.is_empty() || name.len() > NAME_BYTES_MAX {
            return Err(Error::new(
                "invalid_timer",
                format!(
                    "a timer name is 1 to {NAME_BYTES_MAX} bytes (name_bytes_max): got {}",
                    name.len()
                ),
            ));
        }
        if payload.len() > PAYLOAD_BYTES_MAX {
            return Err(Error::new(
                "invalid_timer",
                format!(
                    "timer `{name}`: payload of {} bytes is over payload_bytes_max={PAYLOAD_BYTES_MAX}",
                    payload.len()
                ),
            ));
        }
        ensure_table()?;
        let due = i64::try_from(due_ms).map_err(|_| {
            Error::new(
                "invalid_timer",
                format!("timer `{name}`: due_ms={due_ms} is out of range"),
            )
        })?;
        let exists = !sql::query(
            "SELECT 1 FROM wasmkeep_sdk_timers WHERE name = ?1",
            crate::params![name],
        )?
        .rows
        .is_empty();
        if !exists {
            let n = sql::query("SELECT count(*) FROM wasmkeep_sdk_timers", &[])?;
            if n.rows.first().map_or(0, |r| r.int(0)) >= TIMERS_MAX {
                return Err(Error::new(
                    "too_many_timers",
                    format!(
                        "the actor already has timers_max={TIMERS_MAX} timers: cancel one first"
                    ),
                ));
            }
        }
        sql::execute(
            "INSERT OR REPLACE INTO wasmkeep_sdk_timers (name, due_ms, payload) VALUES (?1, ?2, ?3)",
            crate::params![name, due, payload.to_vec()],
        )?;
        rearm_unless_in_alarm()
    }

    /// Cancels the timer `name`; whether there was one.
    pub fn cancel(name: &str) -> Result<bool> {
        ensure_table()?;
        let n = sql::execute(
            "DELETE FROM wasmkeep_sdk_timers WHERE name = ?1",
            crate::params![name],
        )?;
        rearm()?;
        Ok(n > 0)
    }

    /// The timer `name`, if it is pending.
    pub fn get(name: &str) -> Result<Option<Timer>> {
        ensure_table()?;
        let rows = sql::query(
            "SELECT name, due_ms, payload FROM wasmkeep_sdk_timers WHERE name = ?1",
            crate::params![name],
        )?;
        Ok(rows.rows.first().map(timer))
    }

    /// Every pending timer, earliest first.
    pub fn list() -> Result<Vec<Timer>> {
        ensure_table()?;
        let rows = sql::query(
            "SELECT name, due_ms, payload FROM wasmkeep_sdk_timers ORDER BY due_ms, name",
            &[],
        )?;
        Ok(rows.rows.iter().map(timer).collect())
    }

    /// Removes and returns the timers due at `now_ms`, earliest first (at
    /// most [`DUE_PER_RUN_MAX`]). Call it from the alarm handler: the alarm
    /// is re-armed for the next timer once the handler succeeded, and a
    /// handler that fails rolls this back with everything else, so the
    /// timers fire again on the runtime's retry.
    pub fn take_due(now_ms: u64) -> Result<Vec<Timer>> {
        ensure_table()?;
        let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
        let rows = sql::query(
            "DELETE FROM wasmkeep_sdk_timers WHERE name IN (SELECT name FROM wasmkeep_sdk_timers WHERE due_ms <= ?1 ORDER BY due_ms, name LIMIT ?2) RETURNING name, due_ms, payload",
            crate::params![now, DUE_PER_RUN_MAX],
        )?;
        let mut due: Vec<Timer> = rows.rows.iter().map(timer).collect();
        // RETURNING gives no order: earliest first, as documented.
        due.sort_by(|a, b| (a.due_ms, &a.name).cmp(&(b.due_ms, &b.name)));
        rearm_unless_in_alarm()?;
        Ok(due)
    }
}

/// This actor's address.
pub fn id() -> wit::identity::ActorId {
    wit::identity::id()
}

/// The node's clock, unix milliseconds (a test kit may control it).
pub fn now_ms() -> u64 {
    wit::clock::now_ms()
}

/// Logging to the node's log.
pub mod log {
    use super::wit::log::{Level, log};

    pub fn info(message: &str) {
        log(Level::Info, message)
    }
    pub fn warn(message: &str) {
        log(Level::Warn, message)
    }
    pub fn error(message: &str) {
        log(Level::Error, message)
    }
    pub fn debug(message: &str) {
        log(Level::Debug, message)
    }
}

/// Replies that wait (ADR 0042): park the reply to the request being
/// handled, and complete it from a later event of the same actor (when
/// another actor's answer arrives, say), without holding this actor's
/// turn meanwhile.
///
/// ```ignore
/// // in `request`:
/// let ticket = replies::park(30_000)?;
/// outbox::send(&outbox::to("backend", "b"), b"question", &Ctx::Ask { ticket })?;
/// Ok(Response::status(202)) // ignored: the reply is parked
/// // in `response`, on Ctx::Ask { ticket }:
/// replies::complete(ticket, Response::text(200, "the answer"))?;
/// ```
pub mod replies {
    use super::{Response, Result, wit};

    /// Parks the reply to the request being handled for at most
    /// `timeout_ms` (504 `reply_expired` past it); returns its ticket.
    /// Whatever the handler returns is then ignored.
    pub fn park(timeout_ms: u32) -> Result<u64> {
        wit::replies::park(timeout_ms)
    }

    /// Completes a reply this actor parked; it leaves once this event
    /// commits. `reply_not_found` if it expired or the node restarted.
    pub fn complete(ticket: u64, response: Response) -> Result<()> {
        wit::replies::complete(ticket, response.status, &response.headers, &response.body)
    }
}

/// WebSockets with hibernation (ADR 0043). A request's handler accepts
/// the upgrade; the node holds the connection, and every message on it is
/// an event of the actor ([`Actor::socket_message`]). What an event sends
/// leaves once it commits, never for an event that fails.
///
/// ```ignore
/// // in `request`, for `GET /ws`:
/// sockets::accept(&["lobby"], b"")?;
/// Ok(Response::status(101)) // ignored: the node answers the upgrade
/// // in `socket_message`:
/// sockets::broadcast(Some("lobby"), message)?;
/// ```
pub mod sockets {
    use super::{Result, wit};
    pub use wit::sockets::{Message, SocketInfo};

    /// Accepts the WebSocket upgrade of the request being handled, with
    /// tags to find it by and an attachment that survives hibernation.
    pub fn accept(tags: &[&str], attachment: &[u8]) -> Result<u64> {
        let tags: Vec<String> = tags.iter().map(|t| t.to_string()).collect();
        wit::sockets::accept(&tags, attachment)
    }

    /// Sends to one socket once this event commits.
    pub fn send(id: u64, message: Message) -> Result<()> {
        wit::sockets::send(id, &message)
    }

    /// Sends to every socket with `tag` (all of them with `None`) once
    /// this event commits; how many it goes to.
    pub fn broadcast(tag: Option<&str>, message: Message) -> Result<u32> {
        wit::sockets::broadcast(tag, &message)
    }

    /// Closes a socket once this event commits (code 1000 or 3000-4999).
    pub fn close(id: u64, code: u16, reason: &str) -> Result<()> {
        wit::sockets::close(id, code, reason)
    }

    /// The actor's open sockets, with `tag` only those.
    pub fn list(tag: Option<&str>) -> Vec<SocketInfo> {
        wit::sockets::list(tag)
    }

    /// Replaces a socket's attachment (at once, not rolled back).
    pub fn set_attachment(id: u64, attachment: &[u8]) -> Result<()> {
        wit::sockets::set_attachment(id, attachment)
    }

    /// A text message the node answers itself without waking the actor
    /// (`None` turns it off): `set_auto_response(Some(("ping", "pong")))`.
    pub fn set_auto_response(pair: Option<(&str, &str)>) -> Result<()> {
        let pair = pair.map(|(a, b)| (a.to_string(), b.to_string()));
        wit::sockets::set_auto_response(pair.as_ref().map(|(a, b)| (a.as_str(), b.as_str())))
    }
}

/// The app's configuration (ADR 0041): its manifest's `[vars]` and the
/// secrets an operator set (`wasmkeep secret set`).
pub mod config {
    use super::wit;

    /// The secret named `name`, else the variable, else `None`. Read it
    /// where you use it: a secret set while the actor is active is seen by
    /// its next call.
    pub fn get(name: &str) -> Option<String> {
        wit::config::get(name)
    }
}

/// Messages to other actors and HTTP calls to the world (ADR 0040).
///
/// A send only writes the message in this event's transaction: it leaves
/// after the event commits, and never if the event fails. The answer (or
/// the final failure) comes back later as a call of [`Actor::response`],
/// in an event of its own, with the context the send attached: decide
/// there, from what the database holds *then*, not from what it held when
/// you sent (see [`sql::apply_if_unchanged`]).
///
/// ```ignore
/// wasmkeep_sdk::context! {
///     pub enum Ctx {
///         Ping { n: u64 },
///     }
/// }
/// outbox::send(&outbox::to("pinger", "bob"), b"ping", &Ctx::Ping { n: 1 })?;
/// // later, in `response`:
/// match r.context::<Ctx>() {
///     Some(Ctx::Ping { n }) => { /* r.answer */ }
///     None => {}
/// }
/// ```
pub mod outbox {
    use super::{Result, wit};
    pub use crate::bindings::exports::wasmkeep::actor::inbox::{Answer, HttpResponse};
    pub use wit::types::Address;

    /// What a send attaches, to find again in the answer. Implemented for
    /// `()`, `Vec<u8>`, `String`, `u64`, and by [`context!`](crate::context)
    /// for an enum.
    pub trait Context: Sized {
        fn encode(&self) -> Vec<u8>;
        fn decode(bytes: &[u8]) -> Option<Self>;
    }

    impl Context for () {
        fn encode(&self) -> Vec<u8> {
            Vec::new()
        }
        fn decode(_: &[u8]) -> Option<Self> {
            Some(())
        }
    }

    impl Context for Vec<u8> {
        fn encode(&self) -> Vec<u8> {
            self.clone()
        }
        fn decode(bytes: &[u8]) -> Option<Self> {
            Some(bytes.to_vec())
        }
    }

    impl Context for String {
        fn encode(&self) -> Vec<u8> {
            self.as_bytes().to_vec()
        }
        fn decode(bytes: &[u8]) -> Option<Self> {
            String::from_utf8(bytes.to_vec()).ok()
        }
    }

    impl Context for u64 {
        fn encode(&self) -> Vec<u8> {
            self.to_le_bytes().to_vec()
        }
        fn decode(bytes: &[u8]) -> Option<Self> {
            Some(u64::from_le_bytes(bytes.try_into().ok()?))
        }
    }

    /// One field of a [`context!`](crate::context) enum.
    #[doc(hidden)]
    pub trait Field: Sized {
        fn put(&self, out: &mut Vec<u8>);
        fn take(input: &mut &[u8]) -> Option<Self>;
    }

    fn take_n<'a>(input: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if input.len() < n {
            return None;
        }
        let (head, rest) = input.split_at(n);
        *input = rest;
        Some(head)
    }

    impl Field for u64 {
        fn put(&self, out: &mut Vec<u8>) {
            out.extend_from_slice(&self.to_le_bytes());
        }
        fn take(input: &mut &[u8]) -> Option<Self> {
            Some(u64::from_le_bytes(take_n(input, 8)?.try_into().ok()?))
        }
    }

    impl Field for i64 {
        fn put(&self, out: &mut Vec<u8>) {
            out.extend_from_slice(&self.to_le_bytes());
        }
        fn take(input: &mut &[u8]) -> Option<Self> {
            Some(i64::from_le_bytes(take_n(input, 8)?.try_into().ok()?))
        }
    }

    impl Field for bool {
        fn put(&self, out: &mut Vec<u8>) {
            out.push(u8::from(*self));
        }
        fn take(input: &mut &[u8]) -> Option<Self> {
            Some(take_n(input, 1)?[0] != 0)
        }
    }

    impl Field for Vec<u8> {
        fn put(&self, out: &mut Vec<u8>) {
            (self.len() as u64).put(out);
            out.extend_from_slice(self);
        }
        fn take(input: &mut &[u8]) -> Option<Self> {
            let n = usize::try_from(u64::take(input)?).ok()?;
            Some(take_n(input, n)?.to_vec())
        }
    }

    impl Field for String {
        fn put(&self, out: &mut Vec<u8>) {
            self.as_bytes().to_vec().put(out);
        }
        fn take(input: &mut &[u8]) -> Option<Self> {
            String::from_utf8(Vec::<u8>::take(input)?).ok()
        }
    }

    /// Actor `class/name` of this actor's own app.
    pub fn to(class: &str, name: &str) -> Address {
        Address {
            app: crate::id().app,
            class: class.into(),
            name: name.into(),
        }
    }

    /// Sends `body` to actor `to` (of this tenant); returns the message's
    /// sequence number. Its answer arrives in [`crate::Actor::response`].
    pub fn send(to: &Address, body: &[u8], context: &impl Context) -> Result<u64> {
        wit::outbox::send(to, body, &context.encode())
    }

    /// An outbound HTTP call; only hosts the app's manifest lists in
    /// `[outbound] hosts` are reached.
    #[derive(Debug, Clone)]
    pub struct Call {
        pub method: String,
        pub url: String,
        pub headers: Vec<(String, String)>,
        pub body: Vec<u8>,
        pub timeout_ms: Option<u32>,
    }

    impl Call {
        pub fn new(method: &str, url: &str) -> Call {
            Call {
                method: method.into(),
                url: url.into(),
                headers: Vec::new(),
                body: Vec::new(),
                timeout_ms: None,
            }
        }
        pub fn get(url: &str) -> Call {
            Call::new("GET", url)
        }
        pub fn post(url: &str, body: impl Into<Vec<u8>>) -> Call {
            Call::new("POST", url).body(body)
        }
        pub fn header(mut self, name: &str, value: &str) -> Call {
            self.headers.push((name.into(), value.into()));
            self
        }
        pub fn body(mut self, body: impl Into<Vec<u8>>) -> Call {
            self.body = body.into();
            self
        }
        pub fn timeout_ms(mut self, ms: u32) -> Call {
            self.timeout_ms = Some(ms);
            self
        }
    }

    /// Makes an HTTP call after this event commits; returns its sequence
    /// number. Its answer arrives in [`crate::Actor::response`].
    pub fn fetch(call: Call, context: &impl Context) -> Result<u64> {
        let call = wit::outbox::HttpCall {
            method: call.method,
            url: call.url,
            headers: call.headers,
            body: call.body,
            timeout_ms: call.timeout_ms,
        };
        wit::outbox::fetch(&call, &context.encode())
    }

    /// A message from another actor of this tenant.
    #[derive(Debug, Clone)]
    pub struct Message {
        pub from: Address,
        /// The sender's sequence number of this message.
        pub seq: u64,
        pub body: Vec<u8>,
    }

    /// The answer to something this actor sent.
    #[derive(Debug, Clone)]
    pub struct Response {
        /// What `send` or `fetch` returned.
        pub seq: u64,
        pub answer: Answer,
        /// Deliveries tried.
        pub attempts: u32,
        context: Vec<u8>,
    }

    impl Response {
        /// The context the send attached, decoded as `C`; `None` if it is
        /// not a `C`.
        pub fn context<C: Context>(&self) -> Option<C> {
            C::decode(&self.context)
        }

        /// The context's bytes.
        pub fn context_bytes(&self) -> &[u8] {
            &self.context
        }
    }

    #[doc(hidden)]
    pub fn __message(m: crate::bindings::exports::wasmkeep::actor::inbox::Message) -> Message {
        Message {
            from: m.from,
            seq: m.seq,
            body: m.body,
        }
    }

    #[doc(hidden)]
    pub fn __response(r: crate::bindings::exports::wasmkeep::actor::inbox::Response) -> Response {
        Response {
            seq: r.seq,
            answer: r.answer,
            attempts: r.attempts,
            context: r.context,
        }
    }
}

/// Declares an enum usable as an outbox [`outbox::Context`]: every field
/// is a `u64`, `i64`, `bool`, `String` or `Vec<u8>`.
///
/// ```ignore
/// wasmkeep_sdk::context! {
///     pub enum Ctx {
///         Ping { n: u64 },
///         Settle { booking: String, generation: i64 },
///     }
/// }
/// ```
#[macro_export]
macro_rules! context {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident { $($field:ident : $ty:ty),* $(,)? }),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        $vis enum $name {
            $($(#[$vmeta])* $variant { $($field: $ty),* }),+
        }

        impl $crate::outbox::Context for $name {
            fn encode(&self) -> ::std::vec::Vec<u8> {
                let mut out = ::std::vec::Vec::new();
                let names: &[&str] = &[$(stringify!($variant)),+];
                match self {
                    $($name::$variant { $($field),* } => {
                        let tag = names.iter().position(|n| *n == stringify!($variant)).unwrap_or(0);
                        out.push(tag as u8);
                        $($crate::outbox::Field::put($field, &mut out);)*
                    })+
                }
                out
            }

            fn decode(bytes: &[u8]) -> ::std::option::Option<Self> {
                let names: &[&str] = &[$(stringify!($variant)),+];
                let (&tag, mut input) = bytes.split_first()?;
                let name = *names.get(tag as usize)?;
                $(
                    if name == stringify!($variant) {
                        let v = $name::$variant {
                            $($field: <$ty as $crate::outbox::Field>::take(&mut input)?),*
                        };
                        return input.is_empty().then_some(v);
                    }
                )+
                None
            }
        }
    };
}

// ---- the export glue used by `app!` ----

use std::any::Any;
use std::cell::RefCell;

thread_local! {
    static STATE: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

#[doc(hidden)]
pub fn __install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            wit::log::log(wit::log::Level::Error, &format!("panic: {info}"));
        }));
    });
}

#[doc(hidden)]
pub fn __with<A: Actor, R>(f: impl FnOnce(&mut A) -> R) -> R {
    __install_panic_hook();
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        if s.as_ref().is_none_or(|b| !b.is::<A>()) {
            *s = Some(Box::new(A::default()));
        }
        let a = s
            .as_mut()
            .and_then(|b| b.downcast_mut::<A>())
            .expect("state of this class");
        f(a)
    })
}

#[doc(hidden)]
pub fn __request(r: bindings::exports::wasmkeep::actor::handler::Request) -> Request {
    Request {
        method: r.method,
        path: r.path,
        query: r.query,
        headers: r.headers,
        body: r.body,
    }
}

/// Hands a response to the node: its headers and body through the
/// `response` interface (the node checks their sizes before it copies
/// them), its status as `on-request`'s result.
#[doc(hidden)]
pub fn __response(r: Response) -> Result<u16> {
    use bindings::wasmkeep::actor::response;
    for (name, value) in &r.headers {
        response::add_header(name, value)?;
    }
    if !r.body.is_empty() {
        response::write_body(&r.body)?;
    }
    Ok(r.status)
}

#[doc(hidden)]
pub fn __unknown_class(class: &str) -> Error {
    Error::new(
        "class_not_found",
        format!("this app has no class `{class}`"),
    )
}

/// Exports an app: `app!("counter" => Counter, "room" => Room)`.
#[macro_export]
macro_rules! app {
    ($($class:literal => $ty:ty),+ $(,)?) => {
        struct __WasmkeepApp;

        impl $crate::bindings::exports::wasmkeep::actor::handler::Guest for __WasmkeepApp {
            fn classes() -> ::std::vec::Vec<::std::string::String> {
                ::std::vec![$($class.to_string()),+]
            }

            fn on_init(class: ::std::string::String) -> $crate::Result<()> {
                match class.as_str() {
                    $($class => $crate::__with::<$ty, _>(|a| $crate::Actor::init(a)),)+
                    other => Err($crate::__unknown_class(other)),
                }
            }

            fn on_request(
                class: ::std::string::String,
                request: $crate::bindings::exports::wasmkeep::actor::handler::Request,
            ) -> $crate::Result<u16> {
                let request = $crate::__request(request);
                match class.as_str() {
                    $($class => $crate::__with::<$ty, _>(|a| $crate::Actor::request(a, request)).and_then($crate::__response),)+
                    other => Err($crate::__unknown_class(other)),
                }
            }

            fn on_alarm(class: ::std::string::String, info: $crate::AlarmInfo) -> $crate::Result<()> {
                match class.as_str() {
                    $($class => $crate::timers::__alarm_run(|| $crate::__with::<$ty, _>(|a| $crate::Actor::alarm(a, info))),)+
                    other => Err($crate::__unknown_class(other)),
                }
            }
        }

        impl $crate::bindings::exports::wasmkeep::actor::inbox::Guest for __WasmkeepApp {
            fn on_message(
                class: ::std::string::String,
                message: $crate::bindings::exports::wasmkeep::actor::inbox::Message,
            ) -> $crate::Result<::std::vec::Vec<u8>> {
                let message = $crate::outbox::__message(message);
                match class.as_str() {
                    $($class => $crate::__with::<$ty, _>(|a| $crate::Actor::message(a, message)),)+
                    other => Err($crate::__unknown_class(other)),
                }
            }

            fn on_response(
                class: ::std::string::String,
                response: $crate::bindings::exports::wasmkeep::actor::inbox::Response,
            ) -> $crate::Result<()> {
                let response = $crate::outbox::__response(response);
                match class.as_str() {
                    $($class => $crate::__with::<$ty, _>(|a| $crate::Actor::response(a, response)),)+
                    other => Err($crate::__unknown_class(other)),
                }
            }
        }

        impl $crate::bindings::exports::wasmkeep::actor::socket_handler::Guest for __WasmkeepApp {
            fn on_socket_message(
                class: ::std::string::String,
                socket: $crate::sockets::SocketInfo,
                message: $crate::sockets::Message,
            ) -> $crate::Result<()> {
                match class.as_str() {
                    $($class => $crate::__with::<$ty, _>(|a| $crate::Actor::socket_message(a, socket, message)),)+
                    other => Err($crate::__unknown_class(other)),
                }
            }

            fn on_socket_close(
                class: ::std::string::String,
                socket: $crate::sockets::SocketInfo,
                code: u16,
                reason: ::std::string::String,
            ) -> $crate::Result<()> {
                match class.as_str() {
                    $($class => $crate::__with::<$ty, _>(|a| $crate::Actor::socket_close(a, socket, code, reason)),)+
                    other => Err($crate::__unknown_class(other)),
                }
            }
        }

        $crate::bindings::__export_actor_world!(__WasmkeepApp);
    };
}
