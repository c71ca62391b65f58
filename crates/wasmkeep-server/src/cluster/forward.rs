//! Forwarding a request to the node that owns its actor: one hop, over
//! plain HTTP/1.1 to the address the owner advertises in its lease.
//!
//! The forwarded request keeps the method, the path and query as the client
//! sent them, the headers (but those that frame the message or the
//! connection, and `host`) and the body, and gains the hop marker
//! ([`FORWARDED_HEADER`]) and the cluster secret ([`CLUSTER_TOKEN_HEADER`]).
//! The owner never forwards it again. Bounded: the whole exchange within
//! `cluster_forward_timeout_ms`, the answer's body within
//! `forward_response_bytes_max`. One connection per forward (no pool yet).

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
            "keep-alive" | "proxy-connection" | FORWARDED_HEADER | CLUSTER_TOKEN_HEADER
        )
}

/// Sends the request to `address` (`http://host:port`) and returns the
/// owner's answer.
pub async fn forward(
    address: &str,
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: Vec<u8>,
    settings: &ClusterSettings,
) -> Result<Response<Bytes>, ForwardError> {
    let budget = std::time::Duration::from_millis(settings.forward_timeout_ms);
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
        .clone();
    let connect = tokio::net::TcpStream::connect(authority.as_str());
    let stream = match tokio::time::timeout_at(deadline, connect).await {
        Err(_) => return Err(ForwardError::NotSent("connect timed out".into())),
        Ok(Err(e)) => return Err(ForwardError::NotSent(format!("connect: {e}"))),
        Ok(Ok(s)) => s,
    };
    let _ = stream.set_nodelay(true);
    let handshake = hyper::client::conn::http1::handshake(TokioIo::new(stream));
    let (mut sender, conn) = match tokio::time::timeout_at(deadline, handshake).await {
        Err(_) => return Err(ForwardError::NotSent("handshake timed out".into())),
        Ok(Err(e)) => return Err(ForwardError::NotSent(format!("handshake: {e}"))),
        Ok(Ok(pair)) => pair,
    };
    let conn = tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method.clone())
        .uri(path_and_query)
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| ForwardError::NotSent(format!("request: {e}")))?;
    let h = req.headers_mut();
    for (k, v) in headers.iter().filter(|(k, _)| relayed(k)) {
        h.append(k.clone(), v.clone());
    }
    if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
        h.insert(http::header::HOST, host);
    }
    h.insert(FORWARDED_HEADER, HeaderValue::from_static("1"));
    if let Some(token) = &settings.cluster_token
        && let Ok(v) = HeaderValue::from_str(token)
    {
        h.insert(CLUSTER_TOKEN_HEADER, v);
    }
    let limit = settings.forward_response_bytes_max;
    let exchange = async {
        // A request hyper gives back was never written (the owner closed
        // the connection first: a node that is stopping): it did not run.
        let resp = sender.try_send_request(req).await.map_err(|e| {
            if e.message().is_some() {
                ForwardError::NotSent(format!("connection closed before sending: {}", e.error()))
            } else {
                ForwardError::Failed(format!("send: {}", e.error()))
            }
        })?;
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, limit)
            .collect()
            .await
            .map_err(|e| ForwardError::Failed(format!("answer body (limit {limit}): {e}")))?
            .to_bytes();
        Ok(Response::from_parts(parts, body))
    };
    let out = match tokio::time::timeout_at(deadline, exchange).await {
        Err(_) => Err(ForwardError::Timeout),
        Ok(r) => r,
    };
    conn.abort();
    out
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
}
