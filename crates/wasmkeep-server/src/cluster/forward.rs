//! Forwarding a request to the node that owns its actor: one hop, over
//! plain HTTP/1.1 to the address the owner advertises in its lease.
//!
//! The forwarded request keeps the method, the path and query as the client
//! sent them, the headers (but those that frame the message or the
//! connection, and `host`) and the body, and gains the hop marker
//! ([`FORWARDED_HEADER`]) and the cluster secret ([`CLUSTER_TOKEN_HEADER`]).
//! The owner never forwards it again. Bounded: the whole exchange within
//! `cluster_forward_timeout_ms`, the answer's body within
//! `forward_response_bytes_max`. Connections to owners are kept open and
//! reused ([`Forwarder`]), bounded per owner and in owners.

use std::collections::HashMap;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;

use super::{CLUSTER_TOKEN_HEADER, ClusterSettings, FORWARDED_HEADER};

/// Why a forward failed.
#[derive(Debug)]
pub enum ForwardError {
    /// Nothing reached the owner (no connection): the request did not run
    /// there, and may be retried.
    NotSent(String),
    /// The exchange outlasted `cluster_forward_timeout_ms`; the request may
    /// have run.
    Timeout,
    /// The exchange broke after the request was sent; it may have run.
    Failed(String),
}

/// Headers a node never relays: those of the connection or framing, the
/// host (the owner's is set), and the hop marker and secret (set anew).
fn relayed(name: &http::HeaderName) -> bool {
    use http::header;
    ![
        header::CONNECTION,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::TE,
        header::TRAILER,
        header::HOST,
    ]
    .contains(name)
        && !matches!(
            name.as_str(),
            "keep-alive"
                | "proxy-connection"
                | FORWARDED_HEADER
                | CLUSTER_TOKEN_HEADER
                | super::sign::SIGNATURE_HEADER
        )
}

/// Most idle connections kept open to one owner: about the concurrency a
/// node forwards at; each costs a file descriptor and a few KiB.
pub const IDLE_PER_OWNER_MAX: usize = 64;
/// Most owners idle connections are kept for at once.
pub const OWNERS_MAX: usize = 256;
/// How long an idle connection is kept (shorter than the default
/// `idle_timeout_ms` of the owner's edge, so that the owner seldom closes
/// one first; when it does, the request comes back unwritten and is sent
/// on a fresh connection).
pub const IDLE_KEEP_MS: u64 = 10_000;

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;
type Conn = hyper::client::conn::http1::Connection<TokioIo<tokio::net::TcpStream>, Full<Bytes>>;

/// An open connection to an owner: its sender and the connection's own
/// future, which the forward that uses it drives (no task per connection:
/// a forward then wakes no other task, which on a small machine is most of
/// what a forward costs). Idle, nobody polls it; the next forward that
/// takes it sees a close the owner sent meanwhile ([`Kept::ready`]).
struct Kept {
    sender: Sender,
    /// `None` once it ended: it is then dropped at once, which closes the
    /// sender's channel, so that a request queued on it fails instead of
    /// waiting for a connection nobody will poll again.
    conn: Option<Pin<Box<Conn>>>,
    since: Instant,
}

/// Resolves when the connection ends (never, once it has).
async fn ended(conn: &mut Option<Pin<Box<Conn>>>) -> Result<(), hyper::Error> {
    match conn {
        Some(c) => c.as_mut().await,
        None => std::future::pending().await,
    }
}

/// What one attempt on a connection gave.
enum Attempt {
    Answer(Response<Bytes>),
    /// Given back unwritten (the owner closed the connection first): the
    /// request did not run there.
    Unsent(Request<Full<Bytes>>, String),
    Failed(String),
}

impl Kept {
    /// Waits until the connection can carry a request; false if it closed.
    async fn ready(&mut self) -> bool {
        let Kept { sender, conn, .. } = self;
        // The connection first: a close the owner sent while it was idle is
        // read before the sender is asked.
        tokio::select! {
            biased;
            _ = ended(conn) => false,
            ready = sender.ready() => ready.is_ok(),
        }
    }

    /// Sends `req` and reads the whole answer (at most `limit` bytes of
    /// body), driving the connection meanwhile. Returns what happened and
    /// whether the connection may carry another request.
    async fn exchange(&mut self, req: Request<Full<Bytes>>, limit: usize) -> (Attempt, bool) {
        let Kept { sender, conn, .. } = self;
        let work = async {
            let resp = match sender.try_send_request(req).await {
                Ok(resp) => resp,
                Err(mut e) => {
                    return match e.take_message() {
                        Some(unsent) => Attempt::Unsent(unsent, e.error().to_string()),
                        None => Attempt::Failed(format!("send: {}", e.error())),
                    };
                }
            };
            let (parts, body) = resp.into_parts();
            match Limited::new(body, limit).collect().await {
                Ok(body) => Attempt::Answer(Response::from_parts(parts, body.to_bytes())),
                Err(e) => Attempt::Failed(format!("answer body (limit {limit}): {e}")),
            }
        };
        tokio::pin!(work);
        loop {
            let end = tokio::select! {
                biased;
                out = &mut work => return (out, conn.is_some()),
                end = ended(conn) => end,
            };
            // Dropped, so that the exchange ends at once (its answer was
            // read already, or is lost).
            *conn = None;
            if let Err(e) = end {
                tracing::debug!(error = %e, "forward connection ended");
            }
        }
    }
}

/// Forwards requests over keep-alive connections to the owners, reused
/// across forwards, so that a forward costs a request on an open
/// connection rather than a TCP handshake. Bounded per owner
/// ([`IDLE_PER_OWNER_MAX`]) and in owners ([`OWNERS_MAX`]); a connection
/// idle past [`IDLE_KEEP_MS`] is dropped when next looked at.
pub struct Forwarder {
    idle: std::sync::Mutex<Idle>,
    /// Signs every forward for the owner ([`super::sign`]).
    signer: std::sync::Arc<super::sign::Signer>,
}

/// The kept connections, by owner, under one lock.
#[derive(Default)]
struct Idle {
    owners: HashMap<String, Vec<Kept>>,
    /// When every owner's list was last pruned of aged connections.
    pruned: Option<Instant>,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("idle_connections", &self.idle_connections())
            .finish()
    }
}

impl Forwarder {
    /// A forwarder whose requests `signer` signs.
    pub fn new(signer: std::sync::Arc<super::sign::Signer>) -> Forwarder {
        Forwarder {
            idle: Default::default(),
            signer,
        }
    }

    /// The kept connections (a panic while holding them loses nothing
    /// that matters: they are only connections).
    fn idle(&self) -> std::sync::MutexGuard<'_, Idle> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently used idle connection to `authority` that is not
    /// too old, if one is kept.
    fn checkout(&self, authority: &str) -> Option<Kept> {
        let mut idle = self.idle();
        let list = idle.owners.get_mut(authority)?;
        let keep = Duration::from_millis(IDLE_KEEP_MS);
        // Aged ones go wherever they are in the list (the newest is taken
        // first, so the oldest would otherwise stay).
        list.retain(|k| k.since.elapsed() < keep);
        list.pop()
    }

    /// Keeps a connection whose exchange ended cleanly for the next forward.
    fn checkin(&self, authority: &str, mut kept: Kept) {
        if kept.sender.is_closed() {
            return;
        }
        kept.since = wasmkeep_runtime::clock::instant();
        let keep = Duration::from_millis(IDLE_KEEP_MS);
        let mut guard = self.idle();
        let idle = &mut *guard;
        let full = |owners: &HashMap<String, Vec<Kept>>| {
            !owners.contains_key(authority) && owners.len() >= OWNERS_MAX
        };
        // Once per keep time, or when the owners are at their bound: aged
        // connections of every owner go, including owners no longer
        // forwarded to (moved, gone).
        if idle.pruned.is_none_or(|t| t.elapsed() >= keep) || full(&idle.owners) {
            idle.pruned = Some(wasmkeep_runtime::clock::instant());
            idle.owners.retain(|_, list| {
                list.retain(|k| k.since.elapsed() < keep);
                !list.is_empty()
            });
        }
        if full(&idle.owners) {
            return;
        }
        let list = idle.owners.entry(authority.to_owned()).or_default();
        if list.len() < IDLE_PER_OWNER_MAX {
            list.push(kept);
        }
    }

    /// Idle connections kept now.
    pub fn idle_connections(&self) -> usize {
        self.idle().owners.values().map(Vec::len).sum()
    }

    /// Sends the request to `address` (`http://host:port`) and returns the
    /// owner's answer.
    pub async fn forward(
        &self,
        address: &str,
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Vec<u8>,
        settings: &ClusterSettings,
    ) -> Result<Response<Bytes>, ForwardError> {
        let budget = Duration::from_millis(settings.forward_timeout_ms);
        let deadline = tokio::time::Instant::now() + budget;
        let base: Uri = address
            .parse()
            .map_err(|_| ForwardError::NotSent(format!("bad owner address `{address}`")))?;
        if base.scheme_str() != Some("http") {
            return Err(ForwardError::NotSent(format!(
                "only http:// owners can be forwarded to: address=`{address}`"
            )));
        }
        let authority = base
            .authority()
            .ok_or_else(|| ForwardError::NotSent(format!("no host in `{address}`")))?
            .as_str()
            .to_owned();
        let signature = self.signer.sign(
            &super::sign::Signed {
                method: method.as_str(),
                to: address,
                path_and_query,
                forwarded: true,
            },
            &body,
            super::now_ms(),
        );
        let mut req = Request::builder()
            .method(method.clone())
            .uri(path_and_query)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| ForwardError::NotSent(format!("request: {e}")))?;
        let h = req.headers_mut();
        for (k, v) in headers.iter().filter(|(k, _)| relayed(k)) {
            h.append(k.clone(), v.clone());
        }
        if let Ok(host) = HeaderValue::from_str(&authority) {
            h.insert(http::header::HOST, host);
        }
        h.insert(FORWARDED_HEADER, HeaderValue::from_static("1"));
        if let Ok(v) = HeaderValue::from_str(&signature) {
            h.insert(super::sign::SIGNATURE_HEADER, v);
        }
        let limit = settings.forward_response_bytes_max;
        // Until a request is handed to a connection, a timeout means it
        // never reached the owner.
        let handed = std::sync::atomic::AtomicBool::new(false);
        let exchange = async {
            let mut req = req;
            // A kept connection is tried once; a fresh one ends the loop.
            loop {
                let (mut kept, fresh) = match self.checkout(&authority) {
                    Some(kept) => (kept, false),
                    None => (connect(&authority).await?, true),
                };
                if !kept.ready().await {
                    if fresh {
                        return Err(ForwardError::NotSent("connection closed at once".into()));
                    }
                    continue;
                }
                handed.store(true, std::sync::atomic::Ordering::Relaxed);
                let (attempt, reusable) = kept.exchange(req, limit).await;
                match attempt {
                    Attempt::Answer(resp) => {
                        if reusable {
                            self.checkin(&authority, kept);
                        }
                        return Ok(resp);
                    }
                    Attempt::Unsent(unsent, _) if !fresh => req = unsent,
                    Attempt::Unsent(_, why) => {
                        return Err(ForwardError::NotSent(format!(
                            "connection closed before sending: {why}"
                        )));
                    }
                    Attempt::Failed(why) => return Err(ForwardError::Failed(why)),
                }
            }
        };
        match tokio::time::timeout_at(deadline, exchange).await {
            Err(_) if !handed.load(std::sync::atomic::Ordering::Relaxed) => {
                Err(ForwardError::NotSent("connect timed out".into()))
            }
            Err(_) => Err(ForwardError::Timeout),
            Ok(r) => r,
        }
    }
}

/// Opens a connection to `authority` (its future is driven by the
/// forwards that use it, see [`Kept`]).
async fn connect(authority: &str) -> Result<Kept, ForwardError> {
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| ForwardError::NotSent(format!("connect: {e}")))?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ForwardError::NotSent(format!("handshake: {e}")))?;
    Ok(Kept {
        sender,
        conn: Some(Box::pin(conn)),
        since: wasmkeep_runtime::clock::instant(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_host_and_cluster_headers_are_never_relayed() {
        for never in [
            "connection",
            "content-length",
            "transfer-encoding",
            "host",
            "keep-alive",
            FORWARDED_HEADER,
            CLUSTER_TOKEN_HEADER,
        ] {
            assert!(!relayed(&http::HeaderName::from_static(never)), "{never}");
        }
        for kept in ["authorization", "content-type", "wasmkeep-durability"] {
            assert!(relayed(&http::HeaderName::from_static(kept)), "{kept}");
        }
    }

    /// A loopback owner that answers `200 n` (the request's number on its
    /// connection) and closes each connection after `per_connection`
    /// answers without saying so; returns its address and its count of
    /// connections accepted.
    fn owner(per_connection: usize) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        owner_lingering(per_connection, Duration::ZERO)
    }

    /// [`owner`], closing each connection `linger` after its last answer.
    fn owner_lingering(
        per_connection: usize,
        linger: Duration,
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut out = stream;
                for n in 0..per_connection {
                    let mut line = String::new();
                    // The head ends with an empty line; the tests send no body.
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            break;
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let body = n.to_string();
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if out.write_all(answer.as_bytes()).is_err() {
                        break;
                    }
                }
                std::thread::sleep(linger);
            }
        });
        (address, accepted)
    }

    fn forwarder() -> Forwarder {
        Forwarder::new(std::sync::Arc::new(crate::cluster::sign::Signer::new(
            "test",
        )))
    }

    async fn get(f: &Forwarder, address: &str) -> Result<Response<Bytes>, ForwardError> {
        let settings = ClusterSettings::new(
            address,
            None,
            &wasmkeep_runtime::RuntimeConfig::new("unused"),
        );
        get_with(f, address, &settings).await
    }

    /// `GET /x` forwarded to `address` with `settings`.
    async fn get_with(
        f: &Forwarder,
        address: &str,
        settings: &ClusterSettings,
    ) -> Result<Response<Bytes>, ForwardError> {
        let headers = HeaderMap::new();
        f.forward(address, &Method::GET, "/x", &headers, Vec::new(), settings)
            .await
    }

    #[tokio::test]
    async fn forwards_reuse_a_kept_connection() {
        let (address, accepted) = owner(usize::MAX);
        let f = forwarder();
        for n in 0..5 {
            let resp = get(&f, &address).await.unwrap();
            assert_eq!(resp.body().as_ref(), n.to_string().as_bytes());
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(f.idle_connections(), 1);
    }

    #[tokio::test]
    async fn a_kept_connection_the_owner_closed_is_replaced_without_an_error() {
        let (address, accepted) = owner(1);
        let f = forwarder();
        for _ in 0..3 {
            let resp = get(&f, &address).await.unwrap();
            assert_eq!(resp.body().as_ref(), b"0");
            // Let the client task see the owner's close.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    /// An owner that closes each connection right after its answer: the
    /// next forward finds the kept connection closed (or closing) and
    /// either reconnects or fails at once; it never waits for its timeout
    /// on a connection nobody polls any more.
    #[tokio::test]
    async fn a_connection_that_closes_after_its_answer_never_stalls_a_forward() {
        let (address, _) = owner(1);
        never_stalls(&address, Duration::ZERO).await;
        // Closed while idle, after the connection was ready for the next
        // request: the close must be read before a request is queued on
        // it (a request queued on a connection that then ends waited for
        // the forward timeout).
        let (address, accepted) = owner_lingering(1, Duration::from_millis(50));
        never_stalls(&address, Duration::from_millis(150)).await;
        assert!(accepted.load(std::sync::atomic::Ordering::SeqCst) > 1);
    }

    async fn never_stalls(address: &str, pause: Duration) {
        let f = forwarder();
        let mut settings = ClusterSettings::new(
            address,
            None,
            &wasmkeep_runtime::RuntimeConfig::new("unused"),
        );
        settings.forward_timeout_ms = 2_000;
        let mut answered = 0;
        for _ in 0..10 {
            tokio::time::sleep(pause).await;
            let r = get_with(&f, address, &settings).await;
            match r {
                Ok(_) => answered += 1,
                Err(ForwardError::Timeout) => panic!("a forward waited for its timeout"),
                Err(_) => {}
            }
        }
        assert!(answered > 0);
    }

    /// An answer larger than `forward_response_bytes_max` is not relayed:
    /// the forward fails, naming the limit.
    #[tokio::test]
    async fn an_answer_over_its_bound_is_not_relayed() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut head = [0u8; 1024];
            let _ = stream.read(&mut head);
            let body = "x".repeat(100);
            let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{body}");
            let _ = stream.write_all(answer.as_bytes());
        });
        let mut settings = ClusterSettings::new(
            &address,
            None,
            &wasmkeep_runtime::RuntimeConfig::new("unused"),
        );
        settings.forward_response_bytes_max = 10;
        let f = forwarder();
        let r = get_with(&f, &address, &settings).await;
        match r {
            Err(ForwardError::Failed(why)) => assert!(why.contains("limit 10"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    /// An owner that takes the request and never answers: the forward
    /// ends at `cluster_forward_timeout_ms` as a timeout (it may have run),
    /// not as a request that never left.
    #[tokio::test]
    async fn an_owner_that_never_answers_times_out() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_secs(5));
            drop(stream);
        });
        let mut settings = ClusterSettings::new(
            &address,
            None,
            &wasmkeep_runtime::RuntimeConfig::new("unused"),
        );
        settings.forward_timeout_ms = 300;
        let f = forwarder();
        let r = get_with(&f, &address, &settings).await;
        assert!(matches!(r, Err(ForwardError::Timeout)), "{r:?}");
    }
}
