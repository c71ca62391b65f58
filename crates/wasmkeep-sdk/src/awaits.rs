//! Waiting for an answer inside a handler, without interleaving (issue 36,
//! ADR 0056).
//!
//! In [`Actor::request`](crate::Actor::request) and
//! [`Actor::alarm`](crate::Actor::alarm), a call's answer can be had where
//! it is needed: `let total = awaits::message(&to, body)?;` or, typed,
//! `counter_api::Client::to("counter", "c1").wait().add(5)?`. Nothing else
//! of this actor runs until the answer is in: no request, alarm, message
//! or socket event interleaves, so what the handler read before the wait
//! still holds after it.
//!
//! How: the first time, the answer is not there. The wait returns the
//! error `suspended`, which the handler returns with `?` (what it does
//! instead does not matter: the node rolls back everything the run did).
//! The node sends the call through the outbox, keeps the event, parks the
//! request's reply, and holds the actor's other events in their queue.
//! When the answer comes, the handler runs again from its start: each wait
//! it passed returns its answer at once, the clock reads the first run's
//! time and random bytes repeat. So **the code before a wait must do the
//! same on every run**: decide from the database, the request, the clock
//! and the SDK's randomness ([`crate::unique_id`]), not from `std`'s clock
//! or anything outside. A wait that asks for another call than the first
//! run did fails the event with `await_nondeterministic`.
//!
//! Bounds and errors:
//! - each wait ends by its deadline (`within_ms`; 30 s by default, at most
//!   300 s): past it the answer is the error `await_timeout` (the call may
//!   still be applied by its receiver);
//! - an actor cannot wait for itself (`await_deadlock`), and a call that
//!   reaches an actor waiting on the caller (a cycle of waits, through
//!   requests) is refused with `await_deadlock` at once;
//! - 64 waits per event (`too_many_awaits`); only `request` and `alarm`
//!   may wait (`await_not_allowed` elsewhere: a message's handler answers
//!   at once, or uses the outbox and `response`).
//!
//! A wait holds the whole actor for the call's round trip: for a call that
//! may take long, fan-out to many actors, or anything that must keep
//! serving meanwhile, send with [`outbox`](crate::outbox) and hear back in
//! [`Actor::response`](crate::Actor::response) instead.
//!
//! ```no_run
//! use wasmkeep_sdk::{Actor, Request, Response, Result, Value, awaits, outbox, sql};
//!
//! #[derive(Default)]
//! struct Booking;
//!
//! impl Actor for Booking {
//!     fn request(&mut self, req: Request) -> Result<Response> {
//!         let seats = req.query_param("seats").unwrap_or_default();
//!         // The inventory actor answers how many it held for us.
//!         let held = awaits::message(&outbox::to("inventory", "main"), seats.as_bytes())?;
//!         sql::execute("INSERT INTO bookings (held) VALUES (?1)", &[Value::Blob(held.clone())])?;
//!         Ok(Response::text(200, format!("held {}", String::from_utf8_lossy(&held))))
//!     }
//! }
//! ```

use crate::outbox::{Address, Call, HttpResponse};
use crate::wit::awaits as wit;
use crate::{Error, Result};

/// The answer of `to`'s [`Actor::message`](crate::Actor::message) to
/// `body`, waiting at most 30 s: its `Ok` bytes, or its error (`Refused`),
/// or why it could not be delivered.
pub fn message(to: &Address, body: &[u8]) -> Result<Vec<u8>> {
    message_within(to, body, 0)
}

/// [`message`], waiting at most `within_ms` (0: the default, 30 s; at
/// most 300,000).
pub fn message_within(to: &Address, body: &[u8], within_ms: u32) -> Result<Vec<u8>> {
    let call = wit::Call::Message((to.clone(), body.to_vec()));
    match wit::wait(&call, within_ms)? {
        wit::Answer::Reply(b) => Ok(b),
        wit::Answer::Refused(e) | wit::Answer::Failed(e) => Err(e),
        wit::Answer::Http(_) => Err(Error::new(
            "internal",
            "a message was answered as an HTTP call",
        )),
    }
}

/// The answer to an HTTP call (any status), waiting at most 30 s; an
/// error if it could not be made (`host_not_allowed`, every attempt
/// failed, ...).
pub fn fetch(call: Call) -> Result<HttpResponse> {
    fetch_within(call, 0)
}

/// [`fetch`], waiting at most `within_ms` (0: the default).
pub fn fetch_within(call: Call, within_ms: u32) -> Result<HttpResponse> {
    let call = wit::Call::Fetch(crate::wit::outbox::HttpCall {
        method: call.method,
        url: call.url,
        headers: call.headers,
        body: call.body,
        timeout_ms: call.timeout_ms,
    });
    match wit::wait(&call, within_ms)? {
        wit::Answer::Http(h) => Ok(HttpResponse {
            status: h.status,
            headers: h.headers,
            body: h.body,
        }),
        wit::Answer::Refused(e) | wit::Answer::Failed(e) => Err(e),
        wit::Answer::Reply(_) => Err(Error::new(
            "internal",
            "an HTTP call was answered as a message",
        )),
    }
}
