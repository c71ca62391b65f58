//! One admin question asked of every other live node of the cluster at
//! once, for the views that show the whole cluster (the console's overview,
//! cluster page and an actor's log, a trace's spans): each node is asked
//! with a signed request, as a forward is, and within
//! [`CLUSTER_ASK_TIMEOUT_MS`]; a node that does not answer in time, or
//! answers with an error, is named, not waited for.

use axum::http::{HeaderMap, Method, StatusCode};

use crate::cluster::ClusterState;
use crate::cluster::view::ClusterView;
use crate::error::ApiError;

/// How long a cluster-wide view waits for each other node.
pub(crate) const CLUSTER_ASK_TIMEOUT_MS: u64 = 2_000;

/// What one node answered: its name, and its JSON answer (`None`: it did
/// not answer in time, failed, or answered what is not JSON).
pub(super) type Answer = (String, Option<serde_json::Value>);

/// Asks every live node but this one `GET path` (an admin path with its
/// query) at once. 503 `bucket_unavailable` when the live nodes cannot be
/// read from the bucket.
pub(super) async fn ask_others(c: &ClusterState, path: &str) -> Result<Vec<Answer>, ApiError> {
    Ok(ask_others_raw(c, path)
        .await?
        .into_iter()
        .map(|(node, body)| (node, json_of(body)))
        .collect())
}

/// [`ask_others`] for answers that are not one JSON document (the logs'
/// NDJSON): each node's body as it came.
pub(super) async fn ask_others_raw(
    c: &ClusterState,
    path: &str,
) -> Result<Vec<(String, Option<Vec<u8>>)>, ApiError> {
    Ok(ask(c, &live(c).await?, path).await)
}

/// The live nodes as the bucket shows them; 503 `bucket_unavailable`
/// (with `Retry-After: 1`) when they cannot be read.
pub(super) async fn live(c: &ClusterState) -> Result<ClusterView, ApiError> {
    c.view().await.map_err(|e| {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "bucket_unavailable",
            e.to_string(),
        );
        e.retry_after_s = Some(1);
        e
    })
}

/// Asks every node of `view` but this one `GET path` at once: each node's
/// body, `None` for one that did not answer in time or failed.
pub(super) async fn ask(
    c: &ClusterState,
    view: &ClusterView,
    path: &str,
) -> Vec<(String, Option<Vec<u8>>)> {
    let bounds = (
        CLUSTER_ASK_TIMEOUT_MS,
        c.settings().forward_response_bytes_max,
    );
    ask_with(c, view, (&Method::GET, path, Vec::new()), bounds)
        .await
        .into_iter()
        .map(|(node, answer)| {
            let ok = answer
                .ok()
                .filter(|(status, _)| status.is_success())
                .map(|(_, body)| body);
            (node, ok)
        })
        .collect()
}

/// Sends every node of `view` but this one the request `(method, path,
/// body)` at once, each within `timeout_ms`, taking answers of at most
/// `bytes_max`: each node's status and body, or why there is none.
pub(super) async fn ask_with(
    c: &ClusterState,
    view: &ClusterView,
    (method, path, body): (&Method, &str, Vec<u8>),
    bounds: (u64, usize),
) -> Vec<(String, Result<(StatusCode, Vec<u8>), String>)> {
    let asks = view.live.iter().filter(|n| n.node != c.node()).map(|n| {
        let body = body.clone();
        async move {
            let answer = send_to(c, &n.address, (method, path, body), bounds).await;
            (n.node.clone(), answer)
        }
    });
    futures_util::future::join_all(asks).await
}

/// Sends the node at `address` the signed request `(method, path, body)`,
/// within `timeout_ms`, taking an answer of at most `bytes_max`: its
/// status and body, or why there is none.
pub(super) async fn send_to(
    c: &ClusterState,
    address: &str,
    (method, path, body): (&Method, &str, Vec<u8>),
    (timeout_ms, bytes_max): (u64, usize),
) -> Result<(StatusCode, Vec<u8>), String> {
    // The forward's own bounds are these (the call's own wait is the
    // timeout).
    let mut settings = c.settings().clone();
    settings.forward_timeout_ms = timeout_ms;
    settings.forward_response_bytes_max = bytes_max;
    let sent = tokio::time::timeout(
        std::time::Duration::from_millis(timeout_ms),
        c.forwarder
            .forward(address, method, path, &HeaderMap::new(), body, &settings),
    )
    .await;
    match sent {
        Err(_) => Err(format!("no answer within {timeout_ms} ms")),
        Ok(Err(e)) => Err(format!("{e:?}")),
        Ok(Ok(r)) => Ok((r.status(), r.body().to_vec())),
    }
}

/// A node's answer as JSON (`None` if it gave none, or not JSON).
pub(super) fn json_of(body: Option<Vec<u8>>) -> Option<serde_json::Value> {
    body.and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
}
