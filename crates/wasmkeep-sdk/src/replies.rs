//! Replies that wait (ADR 0042): park the reply to the request being
//! handled, and complete it from a later event of the same actor (when
//! another actor's answer arrives, say), without holding this actor's
//! turn meanwhile.
//!
//! A parked reply is not durable: a node that restarts drops its parked
//! replies (their clients' connections close), and completing one then
//! fails with `reply_not_found`. Keep the ticket in the database or in a
//! send's context.
//!
//! ```no_run
//! use wasmkeep_sdk::{Actor, Request, Response, Result, outbox, replies};
//!
//! wasmkeep_sdk::context! {
//!     enum Ctx {
//!         Ask { ticket: u64 },
//!     }
//! }
//!
//! #[derive(Default)]
//! struct Front;
//!
//! impl Actor for Front {
//!     fn request(&mut self, _req: Request) -> Result<Response> {
//!         let ticket = replies::park(30_000)?;
//!         outbox::send(&outbox::to("backend", "b"), b"question", &Ctx::Ask { ticket })?;
//!         Ok(Response::status(202)) // ignored: the reply is parked
//!     }
//!
//!     fn response(&mut self, r: outbox::Response) -> Result<()> {
//!         if let Some(Ctx::Ask { ticket }) = r.context::<Ctx>() {
//!             let text = match r.answer {
//!                 outbox::Answer::Reply(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
//!                 _ => "no answer".to_string(),
//!             };
//!             replies::complete(ticket, Response::text(200, text))?;
//!         }
//!         Ok(())
//!     }
//! }
//! ```

use crate::{Response, Result, wit};

/// Parks the reply to the request being handled: the client waits until
/// a later event completes it ([`complete`]), or `timeout_ms` passes, when
/// it gets 504 `reply_expired`. Returns the ticket to complete it with.
/// The response the handler returns is then ignored.
///
/// Errors: `invalid_argument` for a timeout over the node's
/// `parked_reply_ms_max` (5 min by default); `too_many_parked` past
/// `parked_replies_max`, `parked_per_tenant_max` or `parked_per_actor_max`;
/// `no_request` outside a
/// request's handler.
pub fn park(timeout_ms: u32) -> Result<u64> {
    wit::replies::park(timeout_ms)
}

/// Completes a reply this actor parked with `response`; it leaves once
/// this event commits (as durable as the parked request asked), and if
/// this event fails, the reply stays parked. `reply_not_found` if the
/// ticket is not one of this actor's parked replies (expired, completed,
/// or from before a restart).
pub fn complete(ticket: u64, response: Response) -> Result<()> {
    wit::replies::complete(ticket, response.status, &response.headers, &response.body)
}
