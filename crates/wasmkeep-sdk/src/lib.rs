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
                    $($class => $crate::__with::<$ty, _>(|a| $crate::Actor::alarm(a, info)),)+
                    other => Err($crate::__unknown_class(other)),
                }
            }
        }

        $crate::bindings::__export_actor_world!(__WasmkeepApp);
    };
}
