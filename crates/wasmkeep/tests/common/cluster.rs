//! Helpers for the cluster tests (`cluster_*.rs`): free ports, bounded
//! polling, and requests that record which node answered.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Writes `node.toml` in `dir` with the cluster tests' short lease timings
/// (a lease of `period_ms` with `grace_ms` of grace, 300 ms of owner
/// margin, registration retried every 200 ms), `bucket_timeout_ms` for each
/// of the cluster's bucket calls, and the TOML lines `more`; returns its
/// path.
pub(crate) fn node_config(
    dir: &Path,
    period_ms: u64,
    grace_ms: u64,
    bucket_timeout_ms: u64,
    more: &str,
) -> PathBuf {
    let config = dir.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "lease_period_ms = {period_ms}\nlease_grace_ms = {grace_ms}\n\
             owner_margin_ms = 300\nlease_register_retry_ms = 200\n\
             cluster_bucket_timeout_ms = {bucket_timeout_ms}\n{more}"
        ),
    )
    .unwrap();
    config
}

/// The flags of `wasmkeep serve` for a cluster node with the bundled
/// examples on loopback `port` (advertised as itself), with the
/// configuration file `config` and the bucket at `bucket` (a URL).
pub(crate) fn serve_flags(port: u16, config: &Path, bucket: &str) -> Vec<String> {
    let addr = format!("127.0.0.1:{port}");
    [
        "--examples",
        "--listen",
        &addr,
        "--config",
        &config.display().to_string(),
        "--bucket",
        bucket,
        "--advertise",
        &format!("http://{addr}"),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The node's `cluster` object from `GET /admin/v1/node`.
pub(crate) fn status(node: &super::Node) -> serde_json::Value {
    let (code, v) = node.json("GET", "/admin/v1/node", b"");
    assert_eq!(code, 200, "{v}");
    v["cluster"].clone()
}

/// A loopback port nothing listens on now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits (polling every `poll_ms`) until `f` holds; panics with `what`
/// after `limit_s` seconds. The limit is a bound for a hung cluster, not a
/// timing assertion.
pub(crate) fn wait_for(what: &str, limit_s: u64, poll_ms: u64, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(limit_s);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(poll_ms));
    }
}

/// An answer: status (0: no answer, the connection failed: a node being
/// killed), the node that ran the request (`x-wasmkeep-node`), and the body.
pub(crate) struct Answer {
    pub status: u16,
    pub node: Option<String>,
    pub body: serde_json::Value,
    /// The W3C `traceresponse` of a traced request (ADR 0064).
    pub traceresponse: Option<String>,
}

/// One request on a fresh connection (no pooled connection outlives a node
/// restart), with no retry of any kind.
pub(crate) fn send(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    send_within(port, method, path, headers, Duration::from_secs(60))
}

/// [`send`], giving up after `timeout` (status 0, as for no answer).
pub(crate) fn send_within(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Answer {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .new_agent();
    let mut req = ureq::http::Request::builder()
        .method(method)
        .uri(format!("http://127.0.0.1:{port}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Vec::new()).unwrap();
    match agent.run(req) {
        Ok(mut resp) => {
            let node = resp
                .headers()
                .get("x-wasmkeep-node")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let traceresponse = resp
                .headers()
                .get("traceresponse")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let status = resp.status().as_u16();
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            let body = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
            Answer {
                status,
                node,
                body,
                traceresponse,
            }
        }
        Err(e) => Answer {
            status: 0,
            node: None,
            body: serde_json::Value::String(e.to_string()),
            traceresponse: None,
        },
    }
}

/// The headers of a request forwarded by a node of a cluster whose secret
/// is `secret`, to the node on `port`, with an empty body: the hop marker
/// and the signature (`wasmkeep_server::cluster::sign`).
pub(crate) fn node_headers(
    secret: &str,
    method: &str,
    port: u16,
    path: &str,
) -> Vec<(String, String)> {
    use wasmkeep_server::cluster::sign::{SIGNATURE_HEADER, Signed, Signer};
    let to = format!("http://127.0.0.1:{port}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let signed = Signed {
        method,
        to: &to,
        path_and_query: path,
        forwarded: true,
    };
    vec![
        ("x-wasmkeep-forwarded".into(), "1".into()),
        (
            SIGNATURE_HEADER.into(),
            Signer::new(secret).sign(&signed, b"", now),
        ),
    ]
}

/// `headers` as [`send`] takes them.
pub(crate) fn as_pairs(headers: &[(String, String)]) -> Vec<(&str, &str)> {
    headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// Asks for the reply only once the write is in the bucket.
pub(crate) const REPLICATED: (&str, &str) = ("wasmkeep-durability", "replicated");

/// `POST …/counter/{actor}/increment`, answered once replicated.
pub(crate) fn increment(port: u16, actor: &str) -> Answer {
    increment_within(port, actor, Duration::from_secs(60))
}

/// [`increment`], giving up after `timeout`.
pub(crate) fn increment_within(port: u16, actor: &str, timeout: Duration) -> Answer {
    send_within(
        port,
        "POST",
        &format!("/v1/demo/examples/counter/{actor}/increment"),
        &[REPLICATED],
        timeout,
    )
}

/// `GET …/counter/{actor}/value`.
pub(crate) fn value(port: u16, actor: &str) -> Answer {
    send(
        port,
        "GET",
        &format!("/v1/demo/examples/counter/{actor}/value"),
        &[],
    )
}

/// The counter's value in an answer that must be a 200.
pub(crate) fn counter(a: &Answer) -> u64 {
    assert_eq!(a.status, 200, "{}", a.body);
    a.body["value"]
        .as_u64()
        .unwrap_or_else(|| panic!("{}", a.body))
}

/// The keys of a folder bucket under `root` (a folder in it), relative to
/// `root`, sorted.
pub(crate) fn folder_keys(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}
