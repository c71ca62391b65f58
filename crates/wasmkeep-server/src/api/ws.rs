//! WebSocket upgrades, done here rather than by axum's extractor so that
//! what a socket reads is counted as it arrives (issue 33).
//!
//! A WebSocket message may come in fragments, which the protocol layer
//! keeps until the last one: 400 sockets each holding an unfinished 1 MiB
//! message took 470 MB outside every budget. Here a socket's connection is
//! read through [`BudgetIo`], which reserves each read in the node's
//! `socket_buffers` pool (for the socket's tenant) before it is made; the
//! socket's bridge gives the reservation back each time a whole message
//! (or a ping or pong) came out of the protocol layer. A read the pool has
//! no room for fails, and the socket is closed with 1013 naming the bound.
//! What is counted is what was read and not yet delivered: at most one
//! read buffer more than the protocol layer holds.
//!
//! The sockets of one client address are bounded too
//! (`sockets_per_client_max`, [`ClientSockets`]).

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header, request::Parts};
use axum::response::Response;
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use wasmkeep_runtime::pools::Hold;

use super::shares::{Place, Places};
use crate::error::ApiError;

/// A client's socket, its reads counted in the pool.
pub(crate) type Socket = WebSocketStream<BudgetIo<TokioIo<Upgraded>>>;

/// What a socket's reads hold in the pool: grown by [`BudgetIo`], given
/// back by the bridge when a message was delivered. `None`: not counted
/// (the unsafe variant, `no_socket_buffer_pool`).
pub(crate) type Reads = Option<Arc<Mutex<Hold>>>;

/// Gives back what a socket's reads held (a message came out whole).
pub(crate) fn delivered(reads: &Reads) {
    if let Some(r) = reads {
        r.lock().shrink_to(0);
    }
}

/// A valid upgrade request, not answered yet.
pub(crate) struct Upgrade {
    on_upgrade: OnUpgrade,
    key: HeaderValue,
}

impl Upgrade {
    /// The upgrade `parts` asks for, if it is a valid one: `GET`, HTTP/1.1,
    /// `Connection: upgrade`, `Upgrade: websocket`, version 13 and a key.
    pub(crate) fn from_parts(parts: &mut Parts) -> Option<Upgrade> {
        let has = |name: header::HeaderName, token: &str| {
            parts.headers.get_all(name).iter().any(|v| {
                v.to_str()
                    .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
            })
        };
        let valid = parts.method == axum::http::Method::GET
            && parts.version == axum::http::Version::HTTP_11
            && has(header::CONNECTION, "upgrade")
            && has(header::UPGRADE, "websocket")
            && parts
                .headers
                .get(header::SEC_WEBSOCKET_VERSION)
                .is_some_and(|v| v == "13");
        let key = parts.headers.get(header::SEC_WEBSOCKET_KEY)?.clone();
        if !valid {
            return None;
        }
        let on_upgrade = parts.extensions.remove::<OnUpgrade>()?;
        Some(Upgrade { on_upgrade, key })
    }

    /// Answers 101 and, once the connection is upgraded, runs `f` on the
    /// socket (reads counted in `reads`); `failed` runs instead if the
    /// upgrade does not complete.
    pub(crate) fn respond<F, Fut>(
        self,
        config: WebSocketConfig,
        reads: Reads,
        f: F,
        failed: impl FnOnce() + Send + 'static,
    ) -> Response
    where
        F: FnOnce(Socket) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let accept = derive_accept_key(self.key.as_bytes());
        let on_upgrade = self.on_upgrade;
        tokio::spawn(async move {
            let Ok(upgraded) = on_upgrade.await else {
                return failed();
            };
            let io = BudgetIo {
                inner: TokioIo::new(upgraded),
                reads,
            };
            let socket = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
            f(socket).await;
        });
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = r.headers_mut();
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        if let Ok(v) = HeaderValue::from_str(&accept) {
            h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
        }
        r
    }
}

/// A connection whose reads are reserved in the pool before they are made.
pub(crate) struct BudgetIo<T> {
    inner: T,
    reads: Reads,
}

impl<T: AsyncRead + Unpin> AsyncRead for BudgetIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let Some(reads) = &this.reads else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        let want = buf.remaining() as u64;
        let held = {
            let mut hold = reads.lock();
            let held = hold.bytes();
            if let Err(e) = hold.grow(want) {
                return Poll::Ready(Err(io::Error::other(e)));
            }
            held
        };
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        let got = (buf.filled().len() - before) as u64;
        // Only what was read stays reserved.
        reads.lock().shrink_to(held + got);
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for BudgetIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Whether a socket's read failed because the pool had no room (its
/// message then names the bound).
pub(crate) fn pool_refused(e: &tokio_tungstenite::tungstenite::Error) -> Option<String> {
    match e {
        tokio_tungstenite::tungstenite::Error::Io(io) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<wasmkeep_runtime::pools::PoolError>())
            .map(|p| p.to_string()),
        _ => None,
    }
}

/// The sockets each client address holds on this node.
#[derive(Debug)]
pub(crate) struct ClientSockets(Arc<Places<IpAddr>>);

/// One client's socket; leaves when dropped.
pub(crate) type ClientSocket = Place<IpAddr>;

impl ClientSockets {
    pub(crate) fn new(max: usize) -> ClientSockets {
        ClientSockets(Arc::new(Places::new(max, usize::MAX)))
    }

    /// Counts a socket of `addr`, or refuses it past the bound.
    pub(crate) fn enter(&self, addr: IpAddr) -> Result<ClientSocket, ApiError> {
        self.0.take(&addr).map_err(|_| {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_sockets",
                format!(
                    "this client address holds too many WebSockets on this node: limit \
                     sockets_per_client_max={}",
                    self.0.per_key_max()
                ),
            );
            e.retry_after_s = Some(1);
            e
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_address_holds_at_most_its_sockets() {
        let c = ClientSockets::new(2);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let (a, _b) = (c.enter(ip).unwrap(), c.enter(ip).unwrap());
        let e = c.enter(ip).unwrap_err();
        assert!(
            e.message.contains("sockets_per_client_max=2"),
            "{}",
            e.message
        );
        assert!(c.enter("10.0.0.2".parse().unwrap()).is_ok());
        drop(a);
        assert!(c.enter(ip).is_ok());
    }
}
