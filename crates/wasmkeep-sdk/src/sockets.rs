//! WebSockets with hibernation (ADR 0043).
//!
//! A request's handler accepts the upgrade ([`accept`]); the node, not the
//! actor, then holds the connection. Between events the actor may be
//! closed like any idle actor (hibernated) while its sockets stay open;
//! each message on one is an event of the actor
//! ([`Actor::socket_message`](crate::Actor::socket_message)), serial like
//! every event, and a close is one too
//! ([`Actor::socket_close`](crate::Actor::socket_close)), or, for a
//! connection that failed without a close, an error
//! ([`Actor::socket_error`](crate::Actor::socket_error)).
//!
//! What an event sends, broadcasts or closes leaves only once the event's
//! commit is durable, and never for an event that fails; one event sends
//! at most 8 MiB (`value_too_large`), and one message is at most
//! `socket_message_bytes_max` (1 MiB by default). A socket's tags and
//! attachment survive hibernation, not the node. Protocol pings are
//! answered by the node, and so is the text pair of
//! [`set_auto_response`], without waking the actor. Sends work from any
//! event (a request, an alarm, a message, an answer, a socket message).
//!
//! ```no_run
//! use wasmkeep_sdk::{Actor, Request, Response, Result, sockets};
//! use wasmkeep_sdk::sockets::{Message, SocketInfo};
//!
//! #[derive(Default)]
//! struct Room;
//!
//! impl Actor for Room {
//!     fn request(&mut self, req: Request) -> Result<Response> {
//!         match req.route() {
//!             ("GET", "/ws") => {
//!                 let name = req.query_param("name").unwrap_or_default();
//!                 sockets::accept(&["lobby"], name.as_bytes())?;
//!                 Ok(Response::status(101)) // ignored: the node answers the upgrade
//!             }
//!             _ => Ok(Response::not_found()),
//!         }
//!     }
//!
//!     fn socket_message(&mut self, socket: SocketInfo, message: Message) -> Result<()> {
//!         if let Message::Text(text) = message {
//!             let who = String::from_utf8_lossy(&socket.attachment).into_owned();
//!             sockets::broadcast(Some("lobby"), Message::Text(format!("{who}: {text}")))?;
//!         }
//!         Ok(())
//!     }
//! }
//! ```

use crate::{Result, wit};

/// A message on a socket: `Text(String)` or `Binary(Vec<u8>)`.
pub use wit::sockets::Message;

/// One of the actor's open sockets: its `id: u64`, its `tags:
/// Vec<String>` (from [`accept`]) and its `attachment: Vec<u8>` (from
/// [`accept`] or [`set_attachment`]; it survives hibernation).
pub use wit::sockets::SocketInfo;

/// The close code of a connection that failed rather than closed (RFC
/// 6455's "abnormal closure": no close frame, a protocol error, an upgrade
/// that never completed). Never sent in a close frame; the SDK hands such
/// an end to [`Actor::socket_error`](crate::Actor::socket_error).
pub const ABNORMAL_CLOSURE: u16 = 1006;

/// Accepts the WebSocket upgrade of the request being handled, with
/// `tags` to find the socket by ([`broadcast`], [`list`]) and an
/// attachment; returns the socket's id. The node answers 101 once the
/// event commits, whatever status the handler returns, and refuses the
/// upgrade if the event fails.
///
/// Errors: `not_an_upgrade` if the request does not ask for one;
/// `invalid_argument` for more than 10 tags or a tag over 256 bytes;
/// `value_too_large` for an attachment over 16 KiB; `too_many_sockets`
/// past `sockets_per_actor_max`, `sockets_per_tenant_max` or `sockets_max`;
/// `no_request` outside a
/// request's handler.
pub fn accept(tags: &[&str], attachment: &[u8]) -> Result<u64> {
    let tags: Vec<String> = tags.iter().map(|t| t.to_string()).collect();
    wit::sockets::accept(&tags, attachment)
}

/// Sends `message` to socket `id` once this event commits.
/// `socket_not_found` if the actor has no such open socket.
///
/// ```no_run
/// use wasmkeep_sdk::sockets::{self, Message};
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// # let id = 7;
/// sockets::send(id, Message::Text("welcome".into()))?;
/// # Ok(()) }
/// ```
pub fn send(id: u64, message: Message) -> Result<()> {
    wit::sockets::send(id, &message)
}

/// Sends `message` to every socket with `tag` (to all of them with
/// `None`) once this event commits; returns how many it goes to. The
/// message counts once against the event's 8 MiB, however many sockets
/// get it.
pub fn broadcast(tag: Option<&str>, message: Message) -> Result<u32> {
    wit::sockets::broadcast(tag, &message)
}

/// Closes socket `id` once this event commits, with `code` (1000 or 3000
/// to 4999) and a `reason` of at most 123 bytes (`invalid_argument`
/// otherwise); `socket_not_found` if there is no such open socket.
pub fn close(id: u64, code: u16, reason: &str) -> Result<()> {
    wit::sockets::close(id, code, reason)
}

/// The actor's open sockets (with `tag`: only those that have it).
///
/// ```no_run
/// # fn main() {
/// let online = wasmkeep_sdk::sockets::list(Some("lobby")).len();
/// # let _ = online; }
/// ```
pub fn list(tag: Option<&str>) -> Vec<SocketInfo> {
    wit::sockets::list(tag)
}

/// Replaces socket `id`'s attachment (at most 16 KiB). It applies at once
/// and is not rolled back with a failed event.
pub fn set_attachment(id: u64, attachment: &[u8]) -> Result<()> {
    wit::sockets::set_attachment(id, attachment)
}

/// A text message the node answers itself, for every socket of the actor,
/// without waking it (`None` turns it off): a keep-alive that never costs
/// an event. The pair is at most 1 KiB (`invalid_argument`).
///
/// ```no_run
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// wasmkeep_sdk::sockets::set_auto_response(Some(("ping", "pong")))?;
/// # Ok(()) }
/// ```
pub fn set_auto_response(pair: Option<(&str, &str)>) -> Result<()> {
    let pair = pair.map(|(a, b)| (a.to_string(), b.to_string()));
    wit::sockets::set_auto_response(pair.as_ref().map(|(a, b)| (a.as_str(), b.as_str())))
}
