//! Messages to other actors and HTTP calls to the world (ADR 0040).
//!
//! A send only writes the message in this event's transaction: it leaves
//! after the event commits (durably), and never if the event fails. The
//! node then delivers it, retrying with backoff (up to
//! `outbox_attempts_max`, 10 by default), and the answer, or the final
//! failure, comes back as a call of
//! [`Actor::response`](crate::Actor::response), in an event of its own,
//! with the context the send attached and the number of attempts. Decide
//! there from what the database holds *then*, not from what it held when
//! you sent (see [`sql::apply_if_unchanged`](crate::sql::apply_if_unchanged)):
//! other events may run in between.
//!
//! Guarantees: a message is applied at most once by its receiver (a
//! repeated delivery gets the same answer without running its handler),
//! and an answer at most once by the sender. One sender's messages to one
//! receiver are applied in the order sent, one at a time; nothing is
//! ordered across receivers, and HTTP calls have no order. Messages stay
//! within the sender's tenant.
//!
//! Limits: `outbox_body_bytes_max` (1 MiB) per body and
//! `outbox_context_bytes_max` (64 KiB) per context (`value_too_large`);
//! `outbox_pending_max` (1,000) sends waiting for their answer
//! (`outbox_full`).
//!
//! ```no_run
//! use wasmkeep_sdk::{Actor, Request, Response, Result, outbox};
//! use wasmkeep_sdk::outbox::Answer;
//!
//! wasmkeep_sdk::context! {
//!     pub enum Ctx {
//!         Ping { n: u64 },
//!         Weather { city: String },
//!     }
//! }
//!
//! #[derive(Default)]
//! struct Pinger;
//!
//! impl Actor for Pinger {
//!     fn request(&mut self, _req: Request) -> Result<Response> {
//!         outbox::send(&outbox::to("pinger", "bob"), b"ping", &Ctx::Ping { n: 1 })?;
//!         let call = outbox::Call::get("https://weather.example/today?city=paris")
//!             .header("accept", "application/json")
//!             .timeout_ms(5_000);
//!         outbox::fetch(call, &Ctx::Weather { city: "paris".into() })?;
//!         Ok(Response::status(202))
//!     }
//!
//!     fn message(&mut self, msg: outbox::Message) -> Result<Vec<u8>> {
//!         Ok(if msg.body == b"ping" { b"pong".to_vec() } else { Vec::new() })
//!     }
//!
//!     fn response(&mut self, r: outbox::Response) -> Result<()> {
//!         match (r.context::<Ctx>(), &r.answer) {
//!             (Some(Ctx::Ping { n }), Answer::Reply(body)) => { /* bob answered `body` to ping n */ }
//!             (Some(Ctx::Weather { city }), Answer::Http(h)) if h.status == 200 => { /* h.body */ }
//!             (_, Answer::Failed(e) | Answer::Refused(e)) => {
//!                 wasmkeep_sdk::log::warn(&format!("send {} failed: {}: {}", r.seq, e.code, e.message));
//!             }
//!             _ => {}
//!         }
//!         Ok(())
//!     }
//! }
//! ```

use crate::{Result, wit};

/// What came back for something this actor sent ([`Response::answer`]):
///
/// - `Reply(Vec<u8>)`: the other actor's
///   [`Actor::message`](crate::Actor::message) returned `Ok` with these
///   bytes.
/// - `Refused(Error)`: it returned `Err` (its event rolled back), with
///   the error's own code and message (a trap or a limit gives the node's
///   code: `guest_trap`, `cpu_time_exceeded`, ...); also
///   `no_handler` (the class does not handle messages) and
///   `stale_message`.
/// - `Http(HttpResponse)`: the HTTP call was answered, with any status.
/// - `Failed(Error)`: the message could not be delivered, for good: no
///   such actor or host, a policy refusal (`host_not_allowed`,
///   `address_forbidden`, `no_inbox`), or every attempt failed
///   (`delivery_failed`, naming the last error).
pub use crate::bindings::exports::wasmkeep::actor::inbox::Answer;

/// An HTTP call's answer: `status: u16`, `headers: Vec<(String,
/// String)>` and `body: Vec<u8>` (at most `outbound_response_bytes_max`,
/// 4 MiB by default; a larger one fails the call with
/// `response_too_large`).
pub use crate::bindings::exports::wasmkeep::actor::inbox::HttpResponse;

/// Another actor of this tenant: its `app`, `class` and `name` (all
/// `String`s). [`to`] builds one in this actor's app.
pub use wit::types::Address;

/// What a send attaches, to find again in the answer
/// ([`Response::context`]). Implemented for `()`, `Vec<u8>`, `String`,
/// `u64`, and by [`context!`](crate::context) for an enum.
///
/// ```
/// use wasmkeep_sdk::outbox::Context;
///
/// let bytes = 42u64.encode();
/// assert_eq!(u64::decode(&bytes), Some(42));
/// assert_eq!(u64::decode(b"short"), None);
/// ```
pub trait Context: Sized {
    /// The bytes the send carries.
    fn encode(&self) -> Vec<u8>;
    /// The context the bytes hold, or `None` if they are not one.
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
    /// Appends the field's bytes to `out`.
    fn put(&self, out: &mut Vec<u8>);
    /// Takes the field's bytes from the front of `input`.
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
///
/// ```no_run
/// let bob = wasmkeep_sdk::outbox::to("pinger", "bob");
/// ```
pub fn to(class: &str, name: &str) -> Address {
    Address {
        app: crate::id().app,
        class: class.into(),
        name: name.into(),
    }
}

/// Sends `body` to actor `to` (of this tenant), with `context` to find in
/// the answer; returns the message's sequence number. The receiver's
/// [`Actor::message`](crate::Actor::message) answers it, and the answer
/// arrives in [`Actor::response`](crate::Actor::response).
///
/// ```no_run
/// use wasmkeep_sdk::outbox;
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// let seq = outbox::send(&outbox::to("ledger", "acct-9"), b"debit 5", &())?;
/// # let _ = seq;
/// # Ok(()) }
/// ```
pub fn send(to: &Address, body: &[u8], context: &impl Context) -> Result<u64> {
    wit::outbox::send(to, body, &context.encode())
}

/// An outbound HTTP call, for [`fetch`]; only hosts the app's manifest
/// lists in `[outbound] hosts` are reached (none by default).
#[derive(Debug, Clone)]
pub struct Call {
    /// `GET`, `HEAD`, `POST`, `PUT`, `PATCH`, `DELETE` or `OPTIONS`.
    pub method: String,
    /// An `http://` or `https://` URL, without credentials.
    pub url: String,
    /// Headers to send (at most 64, 16 KiB together); the node sets
    /// `host`, `content-length`, `idempotency-key` and the like itself and
    /// refuses them here.
    pub headers: Vec<(String, String)>,
    /// The body (at most `outbox_body_bytes_max`).
    pub body: Vec<u8>,
    /// Per attempt; `None` is the app's outbound `timeout_ms`, which is
    /// also the most it may be.
    pub timeout_ms: Option<u32>,
}

impl Call {
    /// A call with `method` (upper-case) to `url`, no headers, no body.
    pub fn new(method: &str, url: &str) -> Call {
        Call {
            method: method.into(),
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout_ms: None,
        }
    }
    /// A `GET` of `url`.
    pub fn get(url: &str) -> Call {
        Call::new("GET", url)
    }
    /// A `POST` of `body` to `url`.
    pub fn post(url: &str, body: impl Into<Vec<u8>>) -> Call {
        Call::new("POST", url).body(body)
    }
    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Call {
        self.headers.push((name.into(), value.into()));
        self
    }
    /// Replaces the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Call {
        self.body = body.into();
        self
    }
    /// Sets the timeout of each attempt, in milliseconds (above 0).
    pub fn timeout_ms(mut self, ms: u32) -> Call {
        self.timeout_ms = Some(ms);
        self
    }
}

/// Makes an HTTP call after this event commits; returns its sequence
/// number. Its answer (any status: 429, 502, 503 and 504 are retried
/// first while attempts remain) arrives in
/// [`Actor::response`](crate::Actor::response). Each attempt carries an
/// `idempotency-key` header naming this actor and the sequence number; the
/// node follows no redirect.
///
/// Refused at once: `host_not_allowed` for a host not in the manifest's
/// `[outbound] hosts`, `invalid_url`, and `invalid_argument` for a method,
/// header or timeout out of bounds.
///
/// ```no_run
/// use wasmkeep_sdk::outbox::{self, Call};
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// let call = Call::post("https://hooks.example/notify", br#"{"event":"booked"}"#.to_vec())
///     .header("content-type", "application/json");
/// outbox::fetch(call, &String::from("notify/booked"))?;
/// # Ok(()) }
/// ```
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

/// A message from another actor of this tenant, for
/// [`Actor::message`](crate::Actor::message).
#[derive(Debug, Clone)]
pub struct Message {
    /// The sender.
    pub from: Address,
    /// The sender's sequence number of this message.
    pub seq: u64,
    /// What the sender sent.
    pub body: Vec<u8>,
}

/// The answer to something this actor sent, for
/// [`Actor::response`](crate::Actor::response).
#[derive(Debug, Clone)]
pub struct Response {
    /// What [`send`] or [`fetch`] returned.
    pub seq: u64,
    /// What came back.
    pub answer: Answer,
    /// How many deliveries were tried (1 when the first one worked).
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

/// The SDK's message from the export's (`app!` calls this).
#[doc(hidden)]
pub fn __message(m: crate::bindings::exports::wasmkeep::actor::inbox::Message) -> Message {
    Message {
        from: m.from,
        seq: m.seq,
        body: m.body,
    }
}

/// The SDK's answer from the export's (`app!` calls this).
#[doc(hidden)]
pub fn __response(r: crate::bindings::exports::wasmkeep::actor::inbox::Response) -> Response {
    Response {
        seq: r.seq,
        answer: r.answer,
        attempts: r.attempts,
        context: r.context,
    }
}
