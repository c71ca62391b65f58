//! The accept loop: a cap on open connections, a watchdog per connection
//! (request head, idle and stalled-write timeouts) and graceful shutdown,
//! on hyper's HTTP/1 server.
//!
//! axum's own `serve` accepts without bound and sets no timeout: a client
//! that opens sockets and sends nothing, or sends a request head one byte a
//! second (slowloris), holds a file descriptor for ever. Here every
//! connection holds one permit of a semaphore of `connections_max`; a
//! connection past it is answered 503 `node_overloaded` and closed. Request
//! bodies are bounded where they are read (`api::read_body`), since only the
//! handler knows how much it wants.
//!
//! The watchdog replaces hyper's `header_read_timeout` rather than adding to
//! it: hyper starts that timer whenever it waits for a head, so on a
//! kept-alive connection it also bounds the idle time between requests, and
//! the two limits could not be set apart. The watchdog reads what the
//! connection's socket and service report ([`Activity`]) and applies the
//! rule of nginx: a new connection must deliver its first head within
//! `header_read_timeout_ms`; a kept-alive one may wait `idle_timeout_ms` for
//! the next request's first byte, and then has `header_read_timeout_ms` for
//! the rest of the head; a connection whose response makes no progress for
//! `idle_timeout_ms` (a client that does not read) is closed too.
//! This is not the place that knows routes, tokens or JSON errors beyond the
//! one fixed 503 answer.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;

use crate::api::ServerConfig;

/// Connections past `connections_max` that are answered 503 at the same
/// time; past this too, a connection is closed without an answer, so that
/// the answers themselves cannot hold file descriptors without bound.
pub(crate) const REJECTS_MAX: usize = 64;
/// How long an answered 503 waits for the client to finish sending and close,
/// so that closing does not reset the connection and lose the answer.
pub(crate) const REJECT_LINGER_MS: u64 = 1000;
/// The `Retry-After` of the 503 answer, in seconds.
pub(crate) const REJECT_RETRY_AFTER_S: u32 = 1;
/// Pause after an accept error other than a connection's own (out of file
/// descriptors, most likely), so that the loop does not spin on it.
const ACCEPT_ERROR_PAUSE_MS: u64 = 100;
/// How long a connection past `connections_max` waits for the place of the
/// idle connection it made close, before it is answered 503.
pub(crate) const EVICT_WAIT_MS: u64 = 500;
/// How long a connection closed after an answer keeps reading (and
/// dropping) what its client still sends (nginx's lingering close): a
/// client that writes its whole body before it reads, such as Python's
/// `urllib`, then reads a 413 instead of a reset.
pub(crate) const LINGER_MS: u64 = 2_000;
/// Most bytes a lingering close reads and drops.
pub(crate) const LINGER_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// The limits of the edge, read once from [`ServerConfig`].
#[derive(Clone, Copy, Debug)]
struct Limits {
    connections_max: usize,
    header_read: Duration,
    idle: Duration,
    shutdown_drain: Duration,
}

impl Limits {
    fn of(c: &ServerConfig) -> Limits {
        let off = c.unsafe_rules;
        // The unsafe variants: every connection, and a day for any head
        // or idle wait.
        let day = Duration::from_secs(86_400);
        Limits {
            connections_max: if off.no_connection_cap {
                crate::api::CONNECTIONS_MAX_LIMIT
            } else {
                c.connections_max
            },
            header_read: if off.no_head_or_idle_timeouts {
                day
            } else {
                Duration::from_millis(c.header_read_timeout_ms)
            },
            idle: if off.no_head_or_idle_timeouts {
                day
            } else {
                Duration::from_millis(c.idle_timeout_ms)
            },
            shutdown_drain: Duration::from_millis(c.shutdown_drain_ms),
        }
    }
}

/// No head in progress.
const NONE: u64 = u64::MAX;

/// What a connection's socket and service report to its watchdog. Times are
/// milliseconds since the accept.
struct Activity {
    start: Instant,
    /// The last time a byte was read or written, or a handler finished.
    last_io_ms: AtomicU64,
    /// When the first byte of the request head being read arrived; [`NONE`]
    /// while no head is being read.
    head_started_ms: AtomicU64,
    /// Requests whose handler is running.
    handling: AtomicUsize,
    /// Woken when the deadline moved earlier than the one the watchdog
    /// sleeps toward; changes that only push it later do not wake it.
    changed: Notify,
    /// The deadline the watchdog sleeps toward, in ms since the accept
    /// ([`NONE`]: none, it waits for a change). A request that moves the
    /// deadline later costs no wake-up: the watchdog finds the later
    /// deadline when it wakes at the earlier one (W1-hot paid a wake-up of
    /// the connection's task and a new timer twice per request before).
    sleeping_until_ms: AtomicU64,
    /// The limits, for the deadline a change makes.
    limits: Limits,
    /// Asked to close because the node is at `connections_max` and this
    /// connection was the most idle: it closes if no handler runs.
    evict: Notify,
    /// The answer said `Connection: close`: the close lingers (see
    /// [`LINGER_MS`]).
    linger: std::sync::atomic::AtomicBool,
}

impl Activity {
    fn new(limits: Limits) -> Activity {
        Activity {
            start: Instant::now(),
            last_io_ms: AtomicU64::new(0),
            // The first head's time runs from the accept: a connection that
            // sends nothing is a slow head too.
            head_started_ms: AtomicU64::new(0),
            handling: AtomicUsize::new(0),
            changed: Notify::new(),
            sleeping_until_ms: AtomicU64::new(NONE),
            limits,
            evict: Notify::new(),
            linger: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether no handler runs: between requests, or before the first.
    fn is_idle(&self) -> bool {
        self.handling.load(Ordering::SeqCst) == 0
    }

    /// Wakes the watchdog if the deadline is now earlier than the one it
    /// sleeps toward. The state changes before this call and the
    /// watchdog's store of its target are sequentially consistent, so
    /// either this sees the watchdog's target or the watchdog, reading the
    /// state after storing it, sees this change.
    fn nudge(&self) {
        let target = self.sleeping_until_ms.load(Ordering::SeqCst);
        if self.deadline_ms(&self.limits).is_some_and(|d| d < target) {
            self.changed.notify_one();
        }
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn on_read(&self) {
        let now = self.now_ms();
        self.last_io_ms.store(now, Ordering::Relaxed);
        // A byte that arrives while no handler runs starts the next head (a
        // body is read by its handler).
        if self.handling.load(Ordering::SeqCst) == 0
            && self
                .head_started_ms
                .compare_exchange(NONE, now, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
        {
            self.nudge();
        }
    }

    fn on_write(&self) {
        self.last_io_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// When the connection must be closed if nothing changes; `None` while a
    /// handler runs (it bounds its own body read; the runtime bounds the
    /// event).
    #[cfg(test)]
    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        self.deadline_ms(limits)
            .map(|ms| self.start + Duration::from_millis(ms))
    }

    /// [`Activity::deadline`] in ms since the accept.
    fn deadline_ms(&self, limits: &Limits) -> Option<u64> {
        if self.handling.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let ms = |d: Duration| d.as_millis() as u64;
        let head = self.head_started_ms.load(Ordering::SeqCst);
        if head != NONE {
            return Some(head.saturating_add(ms(limits.header_read)));
        }
        let last = self.last_io_ms.load(Ordering::SeqCst);
        Some(last.saturating_add(ms(limits.idle)))
    }
}

/// Marks a handler as running for as long as it lives.
struct Handling(Arc<Activity>);

impl Handling {
    fn enter(a: Arc<Activity>) -> Handling {
        // No deadline while a handler runs: later than any, so the
        // watchdog is not woken for it.
        a.handling.fetch_add(1, Ordering::SeqCst);
        a.head_started_ms.store(NONE, Ordering::SeqCst);
        Handling(a)
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        // The idle time starts when the response is ready, not at the last
        // byte of the request, which may be long before.
        self.0.last_io_ms.store(self.0.now_ms(), Ordering::SeqCst);
        self.0.handling.fetch_sub(1, Ordering::SeqCst);
        self.0.nudge();
    }
}

/// Resolves when the connection has been quiet past its deadline. It
/// sleeps until the deadline it computed, and computes it again when that
/// passes (bytes may have pushed it later) or when [`Activity::changed`]
/// says it may have moved earlier (a stored wake-up is never lost:
/// `notify_one` keeps one for the next wait).
async fn watchdog(a: &Activity, limits: &Limits) {
    loop {
        let target = a.deadline_ms(limits);
        a.sleeping_until_ms
            .store(target.unwrap_or(NONE), Ordering::SeqCst);
        // A change between computing the target and storing it that made
        // the deadline earlier was not seen by its `nudge` (which read the
        // previous target): look again.
        if a.deadline_ms(limits).unwrap_or(NONE) < target.unwrap_or(NONE) {
            continue;
        }
        match target.map(|ms| a.start + Duration::from_millis(ms)) {
            // A handler runs: nothing to time until it ends.
            None => a.changed.notified().await,
            Some(d) if Instant::now() >= d => return,
            Some(d) => {
                tokio::select! {
                    () = tokio::time::sleep_until(d) => {}
                    () = a.changed.notified() => {}
                }
            }
        }
    }
}

/// A socket that reports its reads and writes to an [`Activity`], and
/// lingers on close when its last answer said `Connection: close`.
struct TrackedIo {
    inner: TcpStream,
    activity: Arc<Activity>,
    linger: Option<Linger>,
}

/// A lingering close in progress: the write side is shut, what the client
/// sends is read and dropped until it closes, [`LINGER_MS`] pass or
/// [`LINGER_BYTES_MAX`] were read.
struct Linger {
    until: Pin<Box<tokio::time::Sleep>>,
    read: u64,
}

impl AsyncRead for TrackedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.on_read();
        }
        r
    }
}

impl AsyncWrite for TrackedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.on_write();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.on_write();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.activity.linger.load(Ordering::Relaxed) {
            return Pin::new(&mut this.inner).poll_shutdown(cx);
        }
        if this.linger.is_none() {
            // The answer is written: the FIN goes now, the reads go on.
            std::task::ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
            this.linger = Some(Linger {
                until: Box::pin(tokio::time::sleep(Duration::from_millis(LINGER_MS))),
                read: 0,
            });
        }
        let linger = this.linger.as_mut().expect("set above");
        let mut sink = [0u8; 16 * 1024];
        loop {
            if linger.until.as_mut().poll(cx).is_ready() || linger.read >= LINGER_BYTES_MAX {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut sink);
            match Pin::new(&mut this.inner).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => linger.read += buf.filled().len() as u64,
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// The router, told the peer's address and watched by the connection's
/// [`Activity`].
#[derive(Clone)]
struct EdgeService {
    router: TowerToHyperService<Router>,
    peer: SocketAddr,
    activity: Arc<Activity>,
}

impl hyper::service::Service<Request<Incoming>> for EdgeService {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        // The admin API's loopback rule reads the peer from here.
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let handling = Handling::enter(Arc::clone(&self.activity));
        let activity = Arc::clone(&self.activity);
        let fut = self.router.call(req);
        Box::pin(async move {
            let r = fut.await;
            if let Ok(resp) = &r
                && resp
                    .headers()
                    .get(axum::http::header::CONNECTION)
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"))
            {
                // Refused before its body was read, maybe: the client may
                // still be sending it.
                activity.linger.store(true, Ordering::Relaxed);
            }
            drop(handling);
            r
        })
    }
}

/// The open connections' activities, so that a connection past
/// `connections_max` can make the most idle one close.
#[derive(Default)]
struct Open {
    next: AtomicU64,
    conns: parking_lot::Mutex<std::collections::HashMap<u64, Arc<Activity>>>,
}

impl Open {
    fn add(&self, a: &Arc<Activity>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.conns.lock().insert(id, Arc::clone(a));
        id
    }

    fn remove(&self, id: u64) {
        self.conns.lock().remove(&id);
    }

    /// Asks the connection idle the longest (no handler running) to
    /// close; whether there was one.
    fn evict_most_idle(&self) -> bool {
        let conns = self.conns.lock();
        let victim = conns
            .values()
            .filter(|a| a.is_idle())
            .min_by_key(|a| a.start + Duration::from_millis(a.last_io_ms.load(Ordering::Relaxed)));
        match victim {
            Some(a) => {
                a.evict.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets open
/// connections finish for at most `shutdown_drain_ms`. At
/// `connections_max`, a new connection makes the most idle one close and
/// takes its place (a kept-alive connection with no request, or one that
/// has not sent its head): only connections whose requests are being
/// handled hold places for sure, and those are bounded per tenant
/// (`api::shares`).
pub(crate) async fn run(
    router: Router,
    config: &ServerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let limits = Limits::of(config);
    let conns = Arc::new(Semaphore::new(limits.connections_max));
    let rejects = Arc::new(Semaphore::new(REJECTS_MAX));
    let open = Arc::new(Open::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let router = TowerToHyperService::new(router);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_error(e).await;
                    continue;
                }
            },
        };
        let ctx = Ctx {
            router: router.clone(),
            limits,
            stop: stop_rx.clone(),
            open: Arc::clone(&open),
        };
        match Arc::clone(&conns).try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(connection(stream, peer, ctx, permit));
            }
            Err(_) => make_room(stream, peer, ctx, &conns, &rejects),
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drain(&conns, &limits).await;
}

/// What serving one connection needs.
#[derive(Clone)]
struct Ctx {
    router: TowerToHyperService<Router>,
    limits: Limits,
    stop: watch::Receiver<bool>,
    open: Arc<Open>,
}

/// A connection past `connections_max`: the most idle connection is asked
/// to close and this one waits (at most [`EVICT_WAIT_MS`], in a task of
/// its own bounded by [`REJECTS_MAX`]) for its place; without one it is
/// answered 503.
fn make_room(
    stream: TcpStream,
    peer: SocketAddr,
    ctx: Ctx,
    conns: &Arc<Semaphore>,
    rejects: &Arc<Semaphore>,
) {
    let max = ctx.limits.connections_max;
    if !ctx.open.evict_most_idle() {
        return reject(stream, peer, rejects, max);
    }
    let Ok(waiting) = Arc::clone(rejects).try_acquire_owned() else {
        tracing::debug!(%peer, "connection dropped: connections_max reached and too many waiting");
        return;
    };
    let conns = Arc::clone(conns);
    let rejects = Arc::clone(rejects);
    tokio::spawn(async move {
        let wait = Duration::from_millis(EVICT_WAIT_MS);
        let permit = tokio::time::timeout(wait, conns.acquire_owned()).await;
        drop(waiting);
        match permit {
            Ok(Ok(permit)) => connection(stream, peer, ctx, permit).await,
            _ => reject(stream, peer, &rejects, max),
        }
    });
}

/// Waits until every connection has closed, or the drain time is over.
async fn drain(conns: &Semaphore, limits: &Limits) {
    // Every permit back means every connection task has ended.
    let all = u32::try_from(limits.connections_max).unwrap_or(u32::MAX);
    let drained = tokio::time::timeout(limits.shutdown_drain, conns.acquire_many(all)).await;
    if drained.is_err() {
        tracing::warn!(
            open = limits.connections_max - conns.available_permits(),
            shutdown_drain_ms = limits.shutdown_drain.as_millis() as u64,
            "connections still open after the drain time are cut"
        );
    }
}

async fn accept_error(e: io::Error) {
    // A connection reset before it was accepted concerns that connection
    // only; anything else (EMFILE, ENFILE, ENOBUFS) concerns the node.
    let own = matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    );
    if !own {
        tracing::warn!(error = %e, "accept failed");
        tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await;
    }
}

/// Serves one connection until it ends, times out, is evicted for a new
/// one (see [`Open`]), or the node stops.
async fn connection(stream: TcpStream, peer: SocketAddr, ctx: Ctx, _permit: OwnedSemaphorePermit) {
    let Ctx {
        router,
        limits,
        mut stop,
        open,
    } = ctx;
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(Activity::new(limits));
    let registered = Registered(&open, open.add(&activity));
    let io = TokioIo::new(TrackedIo {
        inner: stream,
        activity: Arc::clone(&activity),
        linger: None,
    });
    let service = EdgeService {
        router,
        peer,
        activity: Arc::clone(&activity),
    };
    // The watchdog owns the head timeout (see the module's doc), so hyper's
    // own is off; it would otherwise also cut idle kept-alive connections.
    // With upgrades: a WebSocket an actor accepted (ADR 0043) leaves this
    // loop once upgraded, and lives on in its own task under the socket
    // limits, not `connections_max`.
    let conn = hyper::server::conn::http1::Builder::new()
        .header_read_timeout(None)
        .serve_connection(io, service)
        .with_upgrades();
    tokio::pin!(conn);
    let mut draining = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                break;
            }
            () = watchdog(&activity, &limits) => {
                tracing::debug!(%peer, "connection closed: head, idle or write timeout");
                break;
            }
            () = activity.evict.notified() => {
                // A handler may have started since it was picked.
                if activity.is_idle() {
                    tracing::debug!(%peer, "idle connection closed for a new one at connections_max");
                    break;
                }
            }
            r = stop.changed(), if !draining => {
                // A closed channel means the accept loop is gone: drain too.
                let _ = r;
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
    drop(registered);
}

/// A connection's place in [`Open`], given back when dropped.
struct Registered<'a>(&'a Open, u64);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.remove(self.1);
    }
}

/// The answer of a connection past `connections_max`.
fn overloaded_answer(connections_max: usize) -> Vec<u8> {
    let body = serde_json::json!({
        "error": {
            "code": "node_overloaded",
            "message": format!(
                "the node has too many open connections: limit connections_max={connections_max}"
            ),
        }
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: {REJECT_RETRY_AFTER_S}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Answers a connection past the cap with a 503 and closes it, in a task
/// of its own bounded in number and time.
fn reject(stream: TcpStream, peer: SocketAddr, rejects: &Arc<Semaphore>, connections_max: usize) {
    tracing::debug!(%peer, connections_max, "connection refused: connections_max reached");
    let Ok(permit) = Arc::clone(rejects).try_acquire_owned() else {
        // Dropping the stream closes it at once.
        return;
    };
    tokio::spawn(async move {
        let _permit = permit;
        let mut stream = stream;
        let answer = overloaded_answer(connections_max);
        let linger = Duration::from_millis(REJECT_LINGER_MS);
        let _ = tokio::time::timeout(linger, async {
            stream.write_all(&answer).await?;
            stream.shutdown().await?;
            // Read what the client sent until it closes: closing a socket
            // with unread input resets the connection, and a reset may
            // discard the answer before the client reads it.
            let mut sink = [0u8; 4096];
            while stream.read(&mut sink).await? > 0 {}
            io::Result::Ok(())
        })
        .await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            connections_max: 1,
            header_read: Duration::from_millis(100),
            idle: Duration::from_millis(1000),
            shutdown_drain: Duration::from_millis(10),
        }
    }

    #[test]
    fn a_new_connection_has_the_head_timeout_then_idle_then_head_again() {
        let l = limits();
        let a = Arc::new(Activity::new(l));
        let d0 = a.deadline(&l).unwrap();
        assert_eq!(
            d0,
            a.start + l.header_read,
            "a silent new connection is a slow head"
        );
        let h = Handling::enter(Arc::clone(&a));
        assert!(a.deadline(&l).is_none(), "no timeout while a handler runs");
        a.on_read();
        drop(h);
        let idle = a.deadline(&l).unwrap();
        assert!(
            idle >= a.start + l.idle,
            "between requests the idle timeout applies"
        );
        a.on_read();
        let head = a.deadline(&l).unwrap();
        assert!(
            head < idle,
            "a byte of the next head starts the head timeout"
        );
    }

    #[tokio::test]
    async fn the_watchdog_wakes_when_its_deadline_moves_earlier() {
        let l = Limits {
            header_read: Duration::from_secs(600),
            idle: Duration::from_millis(50),
            ..limits()
        };
        let a = Arc::new(Activity::new(l));
        let dog = tokio::spawn({
            let a = Arc::clone(&a);
            async move { watchdog(&a, &l).await }
        });
        // The watchdog now sleeps toward the head deadline, ten minutes
        // away; a request comes and goes, and the idle deadline is 50 ms.
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(Handling::enter(Arc::clone(&a)));
        tokio::time::timeout(Duration::from_secs(60), dog)
            .await
            .expect("the watchdog slept past the idle deadline")
            .unwrap();
    }

    #[test]
    fn the_overloaded_answer_is_a_complete_response_naming_the_limit() {
        let a = String::from_utf8(overloaded_answer(7)).unwrap();
        let (head, body) = a.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains("retry-after: 1\r\n") && head.contains("connection: close"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "node_overloaded");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("connections_max=7")
        );
    }
}
