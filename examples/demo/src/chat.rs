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
//! - `GET /left`: `{"left":[{"name":N,"code":C,"failed":F,"reason":R},...]}`,
//!   every socket that ended, in order: closed (`socket_close`, `failed`
//!   false) or failed without a close (`socket_error`, code 1006, `failed`
//!   true), Durable Objects' `webSocketClose` and `webSocketError`.
//!
//! The room keeps nothing in memory: between messages it may be closed,
//! and its sockets stay open.

use serde_json::json;
use wasmkeep_sdk::sockets::{self, Message, SocketInfo};
use wasmkeep_sdk::{Actor, Error, Request, Response, Result, params, sql};

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
            ("GET", "/left") => {
                departures()?;
                let rows = sql::query(
                    "SELECT name, code, failed, reason FROM departures ORDER BY seq",
                    &[],
                )?;
                let left: Vec<_> = rows
                    .rows
                    .iter()
                    .map(|r| {
                        json!({ "name": r.text(0), "code": r.int(1), "failed": r.int(2) == 1, "reason": r.text(3) })
                    })
                    .collect();
                Ok(Response::json(200, json!({ "left": left }).to_string()))
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

    fn socket_close(&mut self, socket: SocketInfo, code: u16, reason: String) -> Result<()> {
        depart(&socket, code, false, &reason)
    }

    fn socket_error(&mut self, socket: SocketInfo, reason: String) -> Result<()> {
        depart(&socket, sockets::ABNORMAL_CLOSURE, true, &reason)
    }
}

/// The room's record of sockets that ended (made at first use, so rooms
/// older than it get one too).
fn departures() -> Result<()> {
    sql::execute(
        "CREATE TABLE IF NOT EXISTS departures (seq INTEGER PRIMARY KEY, name TEXT NOT NULL, \
         code INTEGER NOT NULL, failed INTEGER NOT NULL, reason TEXT NOT NULL)",
        &[],
    )?;
    Ok(())
}

fn depart(socket: &SocketInfo, code: u16, failed: bool, reason: &str) -> Result<()> {
    departures()?;
    let name = String::from_utf8_lossy(&socket.attachment).into_owned();
    sql::execute(
        "INSERT INTO departures (name, code, failed, reason) VALUES (?1, ?2, ?3, ?4)",
        params![name, i64::from(code), i64::from(failed), reason],
    )?;
    Ok(())
}
