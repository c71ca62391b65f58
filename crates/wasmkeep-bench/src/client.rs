//! A minimal HTTP/1.1 client: one keep-alive connection, one request at a
//! time, which is exactly what a closed-loop virtual user needs.
//!
//! It is built on `hyper::client::conn::http1` over a plain
//! `tokio::net::TcpStream` rather than a pooled client, so that each virtual
//! user owns one connection and nothing (a pool, a resolver, a retry policy)
//! sits between the generator and the socket.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;

/// Longest wait for one response before the request counts as failed.
pub const REQUEST_TIMEOUT_MS: u64 = 60_000;

/// Where a node listens: the socket address and the `Host` header value.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub host: String,
}

impl Endpoint {
    /// Parses `http://HOST:PORT[/]` (no TLS, no path) and resolves it.
    pub async fn parse(url: &str) -> Result<Endpoint> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow!("only http:// URLs are supported: `{url}`"))?;
        let host = rest.trim_end_matches('/');
        if host.contains('/') {
            bail!("the URL must have no path: `{url}`");
        }
        let with_port = if host
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            host.to_string()
        } else {
            format!("{host}:80")
        };
        let addr = tokio::net::lookup_host(&with_port)
            .await
            .with_context(|| format!("resolve `{with_port}`"))?
            .next()
            .ok_or_else(|| anyhow!("`{with_port}` resolves to no address"))?;
        Ok(Endpoint {
            addr,
            host: host.to_string(),
        })
    }
}

/// The response header naming the cluster node that ran a request.
pub const NODE_HEADER: &str = "x-wasmkeep-node";

/// A response: status, the node that ran it (`x-wasmkeep-node`, cluster
/// mode only) and the whole body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub node: Option<String>,
    pub body: Bytes,
}

/// One keep-alive connection.
pub struct Conn {
    endpoint: Endpoint,
    sender: SendRequest<Full<Bytes>>,
}

impl Conn {
    pub async fn connect(endpoint: &Endpoint) -> Result<Conn> {
        let stream = tokio::net::TcpStream::connect(endpoint.addr)
            .await
            .with_context(|| format!("connect to {}", endpoint.addr))?;
        // Requests are tiny; Nagle would hold them back waiting for an ACK.
        stream.set_nodelay(true)?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            // The connection ends when the sender is dropped or the peer
            // closes; the next `send` reports that.
            let _ = conn.await;
        });
        Ok(Conn {
            endpoint: endpoint.clone(),
            sender,
        })
    }

    /// Sends one request with an empty body and reads the whole response.
    /// A dead connection is replaced once before giving up.
    pub async fn send(&mut self, method: &Method, path: &str) -> Result<(u16, Bytes)> {
        self.send_full(method, path)
            .await
            .map(|a| (a.status, a.body))
    }

    /// [`Conn::send`], with the node that ran the request (cluster mode).
    pub async fn send_full(&mut self, method: &Method, path: &str) -> Result<Answer> {
        self.send_with_body(method, path, Bytes::new()).await
    }

    /// [`Conn::send_full`] with `body` as the request's body.
    pub async fn send_with_body(
        &mut self,
        method: &Method,
        path: &str,
        body: Bytes,
    ) -> Result<Answer> {
        if self.sender.is_closed() {
            *self = Conn::connect(&self.endpoint).await?;
        }
        let fut = async {
            self.sender.ready().await?;
            let req = Request::builder()
                .method(method.clone())
                .uri(path)
                .header(hyper::header::HOST, &self.endpoint.host)
                .body(Full::new(body))?;
            let resp = self.sender.send_request(req).await?;
            let status = resp.status().as_u16();
            let node = resp
                .headers()
                .get(NODE_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = resp.into_body().collect().await?.to_bytes();
            anyhow::Ok(Answer { status, node, body })
        };
        match tokio::time::timeout(Duration::from_millis(REQUEST_TIMEOUT_MS), fut).await {
            Ok(r) => r.with_context(|| format!("{method} {path}")),
            Err(_) => {
                // The connection may still deliver the late response; it
                // cannot be reused for the next request.
                *self = Conn::connect(&self.endpoint).await?;
                bail!("{method} {path}: no response within {REQUEST_TIMEOUT_MS} ms")
            }
        }
    }
}

/// Sends every request of `reqs` over `connections` connections (each sends
/// its next request after the previous response) and returns the outcomes
/// in the order of `reqs`.
pub async fn send_all(
    endpoint: &Endpoint,
    connections: usize,
    reqs: Vec<(Method, String)>,
) -> Result<Vec<Result<(u16, Bytes)>>> {
    Ok(send_all_full(endpoint, connections, reqs)
        .await?
        .into_iter()
        .map(|r| r.map(|a| (a.status, a.body)))
        .collect())
}

/// [`send_all`], with the node that ran each request.
pub async fn send_all_full(
    endpoint: &Endpoint,
    connections: usize,
    reqs: Vec<(Method, String)>,
) -> Result<Vec<Result<Answer>>> {
    let reqs = Arc::new(reqs);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..connections.clamp(1, reqs.len().max(1)) {
        let mut conn = Conn::connect(endpoint).await?;
        let reqs = Arc::clone(&reqs);
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((m, p)) = reqs.get(i) else { break };
                out.push((i, conn.send_full(m, p).await));
            }
            out
        }));
    }
    let mut slots: Vec<Option<Result<Answer>>> = (0..reqs.len()).map(|_| None).collect();
    for t in tasks {
        for (i, r) in t.await? {
            slots[i] = Some(r);
        }
    }
    Ok(slots
        .into_iter()
        .map(|s| s.unwrap_or_else(|| Err(anyhow!("not sent"))))
        .collect())
}

/// A status and body as one line, for error messages.
pub fn describe(r: &Result<(u16, Bytes)>) -> String {
    match r {
        Ok((s, b)) => format!("{s} {}", String::from_utf8_lossy(&b[..b.len().min(300)])),
        Err(e) => format!("{e:#}"),
    }
}
