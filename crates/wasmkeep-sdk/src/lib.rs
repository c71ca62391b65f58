//! Write wasmkeep actors in Rust.
//!
//! An app is one WebAssembly component with one or more classes. Each class
//! is a type that implements [`Actor`]; each actor is one named instance of
//! a class (`tenant/app/class/name`), with a SQLite database of its own.
//!
//! ```no_run
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
//!
//!     fn request(&mut self, req: Request) -> Result<Response> {
//!         match req.route() {
//!             ("POST", "/increment") => {
//!                 let rows = sql::query("UPDATE c SET n = n + 1 RETURNING n", &[])?;
//!                 Ok(Response::json(200, format!("{{\"value\":{}}}", rows.rows[0].int(0))))
//!             }
//!             _ => Ok(Response::not_found()),
//!         }
//!     }
//! }
//! ```
//!
//! [`app!`] then exports the classes, once per crate:
//!
//! ```ignore
//! wasmkeep_sdk::app!("counter" => Counter);
//! ```
//!
//! Build with `cargo build --release --target wasm32-wasip2` (crate type
//! `cdylib`), then `wasmkeep deploy`.
//!
//! # Events are transactions
//!
//! The node runs one event of an actor at a time (a request, an alarm, a
//! message, an answer, a socket message), and each event is one
//! transaction over the actor's database: everything it did through
//! [`sql`], [`kv`], [`alarm`] and [`timers`] commits when the handler returns
//! `Ok`, and is rolled back when it returns `Err`, panics, traps or exceeds a
//! limit. What it sends ([`outbox`], [`sockets`]) leaves only once the event
//! commits, and never for an event that fails.
//!
//! An instance serves one actor, so `&mut self` is that actor's in-memory
//! state; it survives between events while the actor stays active, but is
//! not rolled back with a failed event and is gone when the actor goes idle
//! or its instance traps: keep what matters in the database.
//!
//! # Built on those
//!
//! Modules over the same imports, in the actor's own tables: [`cron`]
//! (recurring schedules in a time zone, beside the timers on the alarm),
//! [`blobs`] (values larger than a row, in chunks), and with the `json`
//! feature [`calls`] (typed calls between actors, the
//! [`interface!`](crate::interface) macro) and [`workflow`] (durable
//! multi-step work: steps recorded once, retries, sleeps, waits for
//! events). [`bookmarks`] names points of the actor's history and goes
//! back to one. [`schema`] runs the migrations a class lists
//! ([`Actor::migrations`]) once per actor, in the first event that lacks
//! them. The TypeScript SDK has each with the same tables and wire
//! formats.
//!
//! # Errors
//!
//! Host calls fail with an [`Error`] whose `code` is stable
//! (`value_too_large`, `key_too_large`, `sql_error`, `forbidden`,
//! `invalid_argument`, ...; the README's "Error codes" lists them). Pass
//! one on with `?` to fail the event; see [`Actor::request`] for what the
//! HTTP client then gets.
//!
//! # Features
//!
//! - `json` (default): serde JSON helpers: [`Request::json`],
//!   [`Response::json_value`], [`kv::get_json`] and [`kv::put_json`], the
//!   [`calls`] and [`workflow`] modules, and the crates [`serde`] and
//!   [`serde_json`] re-exported.
//!
//! This crate is a thin, safe layer over the bindings generated from
//! `wit/actor.wit`; it has no runtime of its own.

#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The generated bindings and `app!` name this crate by its path, inside it
// too.
extern crate self as wasmkeep_sdk;

/// The bindings generated from `wit/actor.wit` (used by [`app!`]).
#[doc(hidden)]
#[allow(missing_docs)]
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

mod http;
#[cfg(feature = "json")]
mod json;

pub mod alarm;
pub mod awaits;
pub mod blobs;
pub mod bookmarks;
#[cfg(feature = "json")]
pub mod calls;
pub mod config;
pub mod cron;
pub mod kv;
pub mod log;
pub mod outbox;
pub mod replies;
pub mod schema;
pub mod sockets;
pub mod sql;
pub mod timers;
#[cfg(feature = "json")]
pub mod workflow;

pub use http::{Request, Response};

/// What the node tells [`Actor::alarm`] about the delivery it makes.
///
/// - `retry_count: u32`: how many earlier attempts at this alarm failed (0
///   on a first attempt).
/// - `is_retry: bool`: whether this delivery is a retry (`retry_count > 0`).
/// - `scheduled_ms: u64`: when this attempt was due, in unix milliseconds:
///   the time the alarm was set for or, for a retry, the retry's time. An
///   alarm never runs before it, and may run later (compare with
///   [`now_ms`]).
///
/// When a handler fails (`Err` or a panic), its writes roll back and the
/// node retries it after `alarm_retry_first_ms` (1 s by default), doubling
/// per failure up to `alarm_retry_max_ms` (5 min). The failure count is
/// kept in the database, so the backoff survives restarts. A failing alarm
/// is retried for ever unless the app's manifest sets `retries_max`.
///
/// ```no_run
/// use wasmkeep_sdk::{Actor, AlarmInfo, Request, Response, Result, log};
///
/// #[derive(Default)]
/// struct Job;
///
/// impl Actor for Job {
///     fn request(&mut self, _req: Request) -> Result<Response> {
///         Ok(Response::status(204))
///     }
///
///     fn alarm(&mut self, info: AlarmInfo) -> Result<()> {
///         if info.is_retry {
///             log::warn(&format!("attempt {} of the job due at {}", info.retry_count + 1, info.scheduled_ms));
///         }
///         Ok(())
///     }
/// }
/// ```
pub use wit::types::AlarmInfo;

/// An error: a stable, machine-readable `code` and a `message` for people
/// (both `String` fields).
///
/// The same type crosses the boundary both ways: a host call fails with
/// one (`value_too_large`, `key_too_large`, `sql_error`, `forbidden`,
/// `database_full`, `invalid_argument`, ...; the README's "Error codes"
/// lists every code, and the message names the limit and its value), and
/// a handler returns one to fail its event. It implements `Debug`,
/// `Display` (the same text as `Debug`) and [`std::error::Error`].
///
/// Build one with [`Error::new`], or [`Error::bad_request`],
/// [`Error::not_found`] and [`Error::conflict`] for the codes the node
/// answers with 400, 404 and 409 (see [`Actor::request`]).
///
/// ```no_run
/// use wasmkeep_sdk::{Error, Result, kv};
///
/// fn ticket(key: &str) -> Result<Vec<u8>> {
///     match kv::get(key) {
///         Ok(Some(v)) => Ok(v),
///         Ok(None) => Err(Error::not_found(format!("no ticket `{key}`"))),
///         // A host error keeps its stable code.
///         Err(e) if e.code == "key_too_large" => Err(Error::bad_request(e.message)),
///         Err(e) => Err(e),
///     }
/// }
/// ```
pub use wit::types::Error;

/// A SQLite value: a statement's parameter, or a column of a result row.
///
/// The variants are `Null`, `Integer(i64)`, `Real(f64)`, `Text(String)`
/// and `Blob(Vec<u8>)`. `From` builds one from `i64`, `i32`, `u64` (cast to
/// `i64`: a value above `i64::MAX` wraps to a negative one), `bool` (0 or
/// 1), `f64`, `&str`, `String`, `Vec<u8>` and `Option<T>` of any of these
/// (`None` is `Null`); [`params!`] uses it.
///
/// ```no_run
/// use wasmkeep_sdk::{Value, sql};
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// let title: Option<&str> = None;
/// sql::execute(
///     "INSERT INTO notes (title, size) VALUES (?1, ?2)",
///     &[Value::from(title), Value::Integer(42)],
/// )?;
/// # Ok(()) }
/// ```
pub use wit::types::Value;

/// Who an actor is ([`id`]): its `tenant`, `app`, `class` and `name`, all
/// `String`s. Tenant, app and class are identifiers
/// (`[a-z0-9][a-z0-9_-]*`, at most 63 bytes); a name is any UTF-8 text
/// without control characters, at most 256 bytes.
pub use wit::identity::ActorId;

/// The `serde` crate (with `derive`), re-exported for the JSON helpers.
///
/// Depending on `serde` yourself is simplest. To derive through this
/// re-export alone, name it on the type:
///
/// ```no_run
/// use wasmkeep_sdk::serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// #[serde(crate = "wasmkeep_sdk::serde")]
/// struct Note {
///     title: String,
/// }
/// ```
#[cfg(feature = "json")]
#[cfg_attr(docsrs, doc(cfg(feature = "json")))]
pub use serde;

/// The `serde_json` crate, re-exported for the JSON helpers.
#[cfg(feature = "json")]
#[cfg_attr(docsrs, doc(cfg(feature = "json")))]
pub use serde_json;

/// The result type of every handler and host call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with a stable `code` and a message for people.
    ///
    /// Failing a request with a code of your own gets the client a 500
    /// `guest_error` whose message holds your code and message; see
    /// [`Actor::request`].
    ///
    /// ```
    /// let e = wasmkeep_sdk::Error::new("paused", "resets are paused");
    /// assert_eq!(e.code, "paused");
    /// ```
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Error {
        Error {
            code: code.into(),
            message: message.into(),
        }
    }

    /// The request was at fault: returned from [`Actor::request`], the
    /// client gets 400 with code `bad_request` (and the event's writes
    /// roll back, as for any `Err`).
    pub fn bad_request(message: impl Into<String>) -> Error {
        Error::new("bad_request", message)
    }

    /// Something the request named does not exist: from
    /// [`Actor::request`], 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Error {
        Error::new("not_found", message)
    }

    /// The request conflicts with the actor's state: from
    /// [`Actor::request`], 409 `conflict`.
    pub fn conflict(message: impl Into<String>) -> Error {
        Error::new("conflict", message)
    }
}

// `Display` and `std::error::Error` for `Error` come with the bindings.

/// One class of actors.
///
/// A value of the type is created (with `Default`) when an actor of the
/// class becomes active; the instance then serves that actor alone. Every
/// method is one event, run in the actor's turn (one at a time per actor)
/// as one transaction: `Ok` commits what it wrote, `Err` or a panic rolls
/// it back (see the [crate docs](crate#events-are-transactions)).
///
/// Only [`request`](Actor::request) is required.
///
/// ```no_run
/// use wasmkeep_sdk::{Actor, AlarmInfo, Error, Request, Response, Result, alarm, now_ms, sql};
///
/// #[derive(Default)]
/// struct Counter;
///
/// impl Actor for Counter {
///     fn init(&mut self) -> Result<()> {
///         sql::execute("CREATE TABLE counter (n INTEGER NOT NULL)", &[])?;
///         sql::execute("INSERT INTO counter VALUES (0)", &[])?;
///         Ok(())
///     }
///
///     fn request(&mut self, req: Request) -> Result<Response> {
///         match req.route() {
///             ("POST", "/increment") => {
///                 sql::execute("UPDATE counter SET n = n + 1", &[])?;
///                 Ok(Response::status(204))
///             }
///             ("POST", "/reset-later") => {
///                 let in_ms = req
///                     .query_u64("in_ms")?
///                     .ok_or_else(|| Error::bad_request("`in_ms` is required"))?;
///                 alarm::set(now_ms() + in_ms)?;
///                 Ok(Response::status(202))
///             }
///             _ => Ok(Response::not_found()),
///         }
///     }
///
///     fn alarm(&mut self, _info: AlarmInfo) -> Result<()> {
///         sql::execute("UPDATE counter SET n = 0", &[])?;
///         Ok(())
///     }
/// }
/// ```
pub trait Actor: Default + 'static {
    /// The class's schema migrations, oldest first: SQL statements the SDK
    /// runs, each once per actor, before any event that finds the
    /// database without them, in that event's transaction (see
    /// [`schema`]). Only ever append to this list. By default: none, and
    /// no cost.
    fn migrations() -> &'static [&'static str] {
        &[]
    }

    /// The first event of a new actor runs this first, in the same
    /// transaction. Create tables here (or in [`Actor::migrations`], which
    /// run before it). If that event fails, the actor does not come into
    /// existence (and its next first event runs `init` again). By
    /// default: nothing.
    fn init(&mut self) -> Result<()> {
        Ok(())
    }

    /// An HTTP request addressed to this actor. The response leaves only
    /// after the event's commit (the README's "Output gate").
    ///
    /// `Ok(response)` commits, whatever the response's status: to answer a
    /// client error and keep the event's writes, return `Ok` with a 4xx
    /// response ([`Response::error`] builds the node's error body).
    /// `Err(e)` rolls back what the event wrote, and the client gets:
    ///
    /// - 400, 404 or 409 for the codes `bad_request`, `not_found` and
    ///   `conflict` ([`Error::bad_request`], [`Error::not_found`],
    ///   [`Error::conflict`]);
    /// - 500 with the same code for an error a host call returned and you
    ///   passed on (`value_too_large`, `sql_error`, ...);
    /// - 500 `guest_error` for any other code, its message holding yours.
    ///
    /// The body is `{"error":{"code":...,"message":...}}`. A panic is a 500
    /// `guest_trap`. Past `response_body_bytes_max`, 256 headers or 256 KiB
    /// of headers the event fails with `response_too_large`. A status that
    /// is not a valid HTTP status, or a 1xx one, is refused by the node
    /// after the event committed: its writes stand, and the client gets 500
    /// `invalid_response`.
    fn request(&mut self, req: Request) -> Result<Response>;

    /// The actor's alarm fired ([`alarm::set`], or [`timers`]).
    ///
    /// Inside it, [`alarm::get`] returns `None` unless the handler set a
    /// new alarm. Returning `Err` (or panicking) rolls the handler's writes
    /// back and retries it later with a backoff (see [`AlarmInfo`]);
    /// `info.retry_count` counts the failures so far. Delivery is at least
    /// once (in a cluster, an alarm whose node died may run twice), and a
    /// node may run the handler once ahead of time as a rehearsal, with
    /// everything it wrote and sent rolled back: do not rely on it running
    /// only when due for anything outside the actor. By default: nothing.
    fn alarm(&mut self, info: AlarmInfo) -> Result<()> {
        let _ = info;
        Ok(())
    }

    /// A message from another actor of the tenant ([`outbox::send`]).
    ///
    /// What this returns is the sender's answer, in its
    /// [`Actor::response`]: `Ok(bytes)` as [`outbox::Answer::Reply`],
    /// `Err(e)` as [`outbox::Answer::Refused`], which also rolls back what
    /// the handler wrote. A message is applied once: a repeated delivery
    /// gets the same answer without calling this again. By default:
    /// `Err(no_handler)`.
    fn message(&mut self, msg: outbox::Message) -> Result<Vec<u8>> {
        let _ = msg;
        Err(Error::new(
            "no_handler",
            "this class does not handle messages",
        ))
    }

    /// The answer to a message or HTTP call this actor sent
    /// ([`outbox::send`], [`outbox::fetch`]), once, in an event of its own.
    /// Returning `Err` rolls back what it wrote, and the node offers the
    /// answer again (up to `outbox_response_attempts_max`, 5 by default;
    /// then it is dropped). Decide from what the database holds now (see
    /// [`sql::apply_if_unchanged`]). By default: nothing.
    fn response(&mut self, r: outbox::Response) -> Result<()> {
        let _ = r;
        Ok(())
    }

    /// A message on one of the actor's WebSockets ([`sockets::accept`]),
    /// as an event of its own. The actor may have been closed since the
    /// last one (hibernated), so keep state in the database or the
    /// socket's attachment, not in `self`. `Err` rolls back what the event
    /// wrote and drops what it sent. By default: nothing.
    fn socket_message(
        &mut self,
        socket: sockets::SocketInfo,
        message: sockets::Message,
    ) -> Result<()> {
        let _ = (socket, message);
        Ok(())
    }

    /// One of the actor's sockets closed, by its client, a limit or the
    /// node; `code` is the WebSocket close code (the node's own: 1001 the
    /// node stops or the socket was idle, 1008 the client fell behind, 1009
    /// a message too large, 1012 another node holds the actor now, 1013
    /// the actor was deleted or its queue is full). A connection that
    /// failed (code 1006) comes to [`Actor::socket_error`] instead, which
    /// by default passes it on here. By default: nothing.
    fn socket_close(
        &mut self,
        socket: sockets::SocketInfo,
        code: u16,
        reason: String,
    ) -> Result<()> {
        let _ = (socket, code, reason);
        Ok(())
    }

    /// One of the actor's sockets failed rather than closed (Durable
    /// Objects' `webSocketError`): the connection ended without a close
    /// frame, broke the protocol, or its upgrade never completed. The node
    /// reports it as the close code [`sockets::ABNORMAL_CLOSURE`] (1006),
    /// and `reason` says what happened. The socket is gone, as after a
    /// close. By default: [`Actor::socket_close`] with code 1006, so a
    /// class that handles closes alone still sees every socket end.
    fn socket_error(&mut self, socket: sockets::SocketInfo, reason: String) -> Result<()> {
        self.socket_close(socket, sockets::ABNORMAL_CLOSURE, reason)
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

/// Builds a parameter list, `&[Value]`, from anything a [`Value`] converts
/// from: `params![1, "two", 3.0]`. Statements number their parameters
/// `?1`, `?2`, ... (or use `?`); at most `sql_params_max` (100) per
/// statement (`too_many_parameters`).
///
/// ```no_run
/// use wasmkeep_sdk::{now_ms, params, sql};
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// let title = String::from("plan");
/// let id = sql::insert(
///     "INSERT INTO notes (title, body, created_ms) VALUES (?1, ?2, ?3)",
///     params![title, "ship it", now_ms()],
/// )?;
/// # let _ = id;
/// # Ok(()) }
/// ```
#[macro_export]
macro_rules! params {
    ($($v:expr),* $(,)?) => { &[$($crate::Value::from($v)),*] };
}

/// This actor's address: tenant, app, class and name.
///
/// ```no_run
/// let me = wasmkeep_sdk::id();
/// wasmkeep_sdk::log::info(&format!("{}/{}/{}/{}", me.tenant, me.app, me.class, me.name));
/// ```
pub fn id() -> ActorId {
    wit::identity::id()
}

/// A new identifier no other call returns, anywhere: 128 bits from the
/// node's operating system's random source as 32 lowercase hex digits
/// (Durable Objects' `newUniqueId`): the name of a new actor, a row's key.
///
/// ```no_run
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// let room = wasmkeep_sdk::unique_id()?; // "3f9c…", 32 characters
/// # let _ = room;
/// # Ok(()) }
/// ```
pub fn unique_id() -> Result<String> {
    wit::identity::unique_id()
}

/// Deletes everything this actor stored, in the event's transaction
/// (Durable Objects' `deleteAll`): every table and view it made (the SDK's
/// own too: timers, cron schedules, workflows, blobs), every key-value
/// pair, and its alarm. The actor goes on existing, empty: a later write
/// in this or another event starts afresh. Tables that others reference
/// with foreign keys are dropped after them.
///
/// ```no_run
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// wasmkeep_sdk::delete_all()?;
/// # Ok(()) }
/// ```
pub fn delete_all() -> Result<()> {
    let schema = |kind: &str| -> Result<Vec<String>> {
        Ok(sql::query(
            "SELECT name FROM sqlite_schema WHERE type = ?1 AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' \
             AND name NOT LIKE '\\_wasmkeep\\_%' ESCAPE '\\'",
            params![kind],
        )?
        .rows
        .iter()
        .map(|r| r.text(0).to_owned())
        .collect())
    };
    for view in schema("view")? {
        sql::execute(&format!("DROP VIEW IF EXISTS {}", quote_name(&view)), &[])?;
    }
    // A table referenced by another's foreign key may refuse to go first:
    // drop what can go, and go again while each round drops something.
    let mut left = schema("table")?;
    while !left.is_empty() {
        let attempted = left.len();
        let mut refused = Vec::new();
        let mut first_error = None;
        for table in std::mem::take(&mut left) {
            match sql::execute(&format!("DROP TABLE IF EXISTS {}", quote_name(&table)), &[]) {
                Ok(_) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                    refused.push(table);
                }
            }
        }
        if let Some(e) = first_error
            && refused.len() == attempted
        {
            return Err(e);
        }
        left = refused;
    }
    kv::delete_prefix("")?;
    alarm::delete();
    Ok(())
}

/// An SQL identifier in double quotes, any `"` in it doubled.
fn quote_name(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The node's clock, in unix milliseconds (the test kit controls it, so
/// use this rather than the system time). WASI's clocks are the node's
/// clock too.
///
/// ```no_run
/// use wasmkeep_sdk::{alarm, now_ms};
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// alarm::set(now_ms() + 60_000)?; // in a minute
/// # Ok(()) }
/// ```
pub fn now_ms() -> u64 {
    wit::clock::now_ms()
}

/// Declares an enum usable as an outbox [`outbox::Context`], to send with
/// a message and match on in its answer: every field is a `u64`, `i64`,
/// `bool`, `String` or `Vec<u8>`. The enum derives `Debug`, `Clone` and
/// `PartialEq`; it holds at most 256 variants, and its encoding depends on
/// their order, so add new variants at the end (a context written by an
/// older build then still decodes).
///
/// ```
/// use wasmkeep_sdk::outbox::Context;
///
/// wasmkeep_sdk::context! {
///     pub enum Ctx {
///         Ping { n: u64 },
///         Settle { booking: String, generation: i64 },
///     }
/// }
///
/// let bytes = Ctx::Settle { booking: "b-17".into(), generation: 3 }.encode();
/// assert_eq!(
///     Ctx::decode(&bytes),
///     Some(Ctx::Settle { booking: "b-17".into(), generation: 3 })
/// );
/// assert_eq!(Ctx::decode(b"not a context"), None);
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

/// Sends panic messages to the node's log (`app!` calls this).
#[doc(hidden)]
pub fn __install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            wit::log::log(wit::log::Level::Error, &format!("panic: {info}"));
        }));
    });
}

/// Runs `f` on the instance's value of class `A` (`app!` calls this for
/// every event), after the class's migrations the database lacks.
#[doc(hidden)]
pub fn __with<A: Actor, T>(f: impl FnOnce(&mut A) -> Result<T>) -> Result<T> {
    __install_panic_hook();
    let migrations = A::migrations();
    if !migrations.is_empty() {
        schema::__migrate(migrations)?;
    }
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

/// The SDK's request from the export's (`app!` calls this).
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

/// The error for a class the app does not have (`app!` calls this).
#[doc(hidden)]
pub fn __unknown_class(class: &str) -> Error {
    Error::new(
        "class_not_found",
        format!("this app has no class `{class}`"),
    )
}

/// Exports an app: its classes, each a name and an [`Actor`] type.
///
/// Use it once per crate (a `cdylib` built for `wasm32-wasip2`). Class
/// names are identifiers (`[a-z0-9][a-z0-9_-]*`, at most 63 bytes) and
/// must differ; the node refuses a deploy otherwise
/// (`invalid_component`). The app exports the handler, the inbox
/// ([`Actor::message`], [`Actor::response`]) and the socket handler
/// ([`Actor::socket_message`], [`Actor::socket_close`]); a panic's message
/// goes to the node's log.
///
/// ```ignore
/// wasmkeep_sdk::app!("counter" => Counter, "room" => Room);
/// ```
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
                    $($class => $crate::__with::<$ty, _>(|a| {
                        if code == $crate::sockets::ABNORMAL_CLOSURE {
                            $crate::Actor::socket_error(a, socket, reason)
                        } else {
                            $crate::Actor::socket_close(a, socket, code, reason)
                        }
                    }),)+
                    other => Err($crate::__unknown_class(other)),
                }
            }
        }

        $crate::bindings::__export_actor_world!(__WasmkeepApp);
    };
}
