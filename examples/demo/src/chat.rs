//! `chat`: a chat room over WebSockets with hibernation (ADR 0043), the
//! acceptance contract of issue 21.
//!
//! - `GET /ws` upgrades to a WebSocket in room `{name}` (the actor).
//! - Every text message a socket sends is delivered to every socket of the
//!   room, the sender's included, as the same text; a text starting with
//!   `!fail` is broadcast and then the event fails, so nobody receives it
//!   (a send leaves only with its event's commit).
//! - `ping` is answered `pong` by the node itself, without waking the room.
//! - `GET /count`: `{"sockets":N}`; `GET /who`: `{"names":[...]}`, the
//!   `name` each socket gave in `/ws?name=N` (kept as its attachment, which
//!   outlives the room's hibernation).
//!
//! The room keeps nothing in memory: between messages it may be closed,
//! and its sockets stay open.

use serde_json::json;
use wasmkeep_sdk::sockets::{self, Message, SocketInfo};
use wasmkeep_sdk::{Actor, Error, Request, Response, Result};

#[derive(Default)]
pub struct Chat;

impl Actor for Chat {
    fn request(&mut self, req: Request) -> Result<Response> {
        match req.route() {
            ("GET", "/ws") => {
                let name = req.query_param("name").unwrap_or_default();
                sockets::accept(&["room"], name.as_bytes())?;
                sockets::set_auto_response(Some(("ping", "pong")))?;
                Ok(Response::status(101))
            }
            ("GET", "/count") => Ok(Response::json(
                200,
                json!({ "sockets": sockets::list(None).len() }).to_string(),
            )),
            ("GET", "/who") => {
                let mut names: Vec<String> = sockets::list(None)
                    .into_iter()
                    .map(|s| String::from_utf8_lossy(&s.attachment).into_owned())
                    .collect();
                names.sort();
                Ok(Response::json(200, json!({ "names": names }).to_string()))
            }
            _ => Ok(Response::not_found()),
        }
    }

    fn socket_message(&mut self, _socket: SocketInfo, message: Message) -> Result<()> {
        if let Message::Text(text) = message {
            let fail = text.starts_with("!fail");
            sockets::broadcast(Some("room"), Message::Text(text))?;
            if fail {
                return Err(Error::new("asked_to_fail", "failing after the broadcast, as asked"));
            }
        }
        Ok(())
    }
}
