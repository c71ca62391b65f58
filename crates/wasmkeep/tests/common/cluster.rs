//! Helpers for the cluster tests (`cluster_*.rs`): free ports, bounded
//! polling, and requests that record which node answered.

use std::time::{Duration, Instant};

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits (polling every `poll_ms`) until `f` holds; panics with `what`
/// after `limit_s` seconds. The limit is a bound for a hung cluster, not a
/// timing assertion.
pub fn wait_for(what: &str, limit_s: u64, poll_ms: u64, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(limit_s);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(poll_ms));
    }
}

/// An answer: status (0: no answer, the connection failed: a node being
/// killed), the node that ran the request (`x-wasmkeep-node`), and the body.
pub struct Answer {
    pub status: u16,
    pub node: Option<String>,
    pub body: serde_json::Value,
}

/// One request on a fresh connection (no pooled connection outlives a node
/// restart), with no retry of any kind.
pub fn send(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
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
            let status = resp.status().as_u16();
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            let body = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
            Answer { status, node, body }
        }
        Err(e) => Answer {
            status: 0,
            node: None,
            body: serde_json::Value::String(e.to_string()),
        },
    }
}

/// Asks for the reply only once the write is in the bucket.
pub const REPLICATED: (&str, &str) = ("wasmkeep-durability", "replicated");

/// `POST …/counter/{actor}/increment`, answered once replicated.
pub fn increment(port: u16, actor: &str) -> Answer {
    send(
        port,
        "POST",
        &format!("/v1/demo/examples/counter/{actor}/increment"),
        &[REPLICATED],
    )
}

/// `GET …/counter/{actor}/value`.
pub fn value(port: u16, actor: &str) -> Answer {
    send(
        port,
        "GET",
        &format!("/v1/demo/examples/counter/{actor}/value"),
        &[],
    )
}

/// The counter's value in an answer that must be a 200.
pub fn counter(a: &Answer) -> u64 {
    assert_eq!(a.status, 200, "{}", a.body);
    a.body["value"]
        .as_u64()
        .unwrap_or_else(|| panic!("{}", a.body))
}
