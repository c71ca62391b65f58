//! The spans the edge adds to a traced request (ADR 0064), and the admin
//! routes that show a node's recent traces:
//!
//! - `GET /admin/v1/traces[?limit=N][&actor=PREFIX]`: the latest requests
//!   this node served that were traced (their `request` spans), newest
//!   first, with the exporter's counts;
//! - `GET /admin/v1/traces/{trace_id}[?cluster=true]`: one trace's spans
//!   kept on this node, and with `cluster=true` on a cluster node those of
//!   every live node too (each asked with a signed request, as a forward
//!   is), merged by start.

use std::time::Instant;

use axum::extract::{Query, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use wasmkeep_runtime::trace::{Span, SpanKind, TraceContext};

use super::{AppState, NODE_HEADER, parse_actor_path};
use crate::cluster::ClusterState;
use crate::error::ApiError;
use crate::traces::{TRACERESPONSE_HEADER, Traced, span_json};

/// Requests a listing returns at most (and by default).
pub const TRACES_LIST_MAX: usize = 200;
pub const TRACES_LIST_DEFAULT: usize = 50;

/// This node's name in spans: its cluster id, or `single`.
fn node_name(s: &AppState) -> String {
    s.config
        .cluster
        .as_ref()
        .map_or_else(|| "single".to_owned(), |c| c.node().to_owned())
}

/// Records the `request` span of a traced actor request and names it in
/// the answer's `traceresponse`.
pub(super) fn record_request(
    s: &AppState,
    t: Traced,
    started: Instant,
    (method, uri): (&Method, &Uri),
    resp: &mut Response,
    code: Option<String>,
) {
    let now = wasmkeep_runtime::clock::instant();
    let mut span = Span::new(
        t.server,
        t.parent,
        "request",
        SpanKind::Server,
        (started, now),
    )
    .text("http.request.method", method.as_str())
    .text("url.path", uri.path())
    .int(
        "http.response.status_code",
        i64::from(resp.status().as_u16()),
    )
    .text("wasmkeep.node", &node_name(s));
    if let Ok((id, _)) = parse_actor_path(uri.path()) {
        // The name as it is (not percent-encoded): what a listing by
        // prefix and the console compare with.
        let actor = format!("{}/{}/{}/{}", id.tenant, id.app, id.class, id.name);
        span = span.text("wasmkeep.actor", &actor);
    }
    span.error = code;
    s.rt.traces().record(span);
    if let Ok(v) = HeaderValue::from_str(&t.server.header()) {
        resp.headers_mut().insert(TRACERESPONSE_HEADER, v);
    }
}

/// A forward's span, begun: the request's trace, the forward's context
/// and when it began.
pub(super) struct Forward {
    traced: Traced,
    ctx: TraceContext,
    started: Instant,
}

/// For a traced request that may be forwarded: the `traceparent` the
/// owner gets names a new `forward` span.
pub(super) fn forward_begins(parts: &mut axum::http::request::Parts) -> Option<Forward> {
    let Some(traced) = parts.extensions.get::<Traced>().copied() else {
        // This node decided not to trace (past the cap, say): the owner
        // follows that decision, so a client's sampled context goes on
        // unsampled.
        let declined = parts
            .headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .and_then(TraceContext::parse)
            .filter(|c| c.sampled);
        if let Some(c) = declined {
            let unsampled = TraceContext {
                sampled: false,
                ..c
            };
            if let Ok(v) = HeaderValue::from_str(&unsampled.header()) {
                parts.headers.insert("traceparent", v);
            }
        }
        return None;
    };
    let ctx = traced.server.child();
    let v = HeaderValue::from_str(&ctx.header()).ok()?;
    parts.headers.insert("traceparent", v);
    Some(Forward {
        traced,
        ctx,
        started: wasmkeep_runtime::clock::instant(),
    })
}

/// Records the forward's span if the request went to another node (its
/// answer names that node, or the forward failed).
pub(super) fn forward_ends(
    s: &AppState,
    c: &ClusterState,
    f: Forward,
    out: &Result<Response, ApiError>,
) {
    let (to, error) = match out {
        Ok(r) => {
            let by = r.headers().get(NODE_HEADER).and_then(|v| v.to_str().ok());
            match by {
                Some(n) if n != c.node() => (n.to_owned(), None),
                _ => return,
            }
        }
        Err(e) if e.code == "forward_failed" || e.code == "forward_timeout" => {
            (String::new(), Some(e.code.clone()))
        }
        Err(_) => return,
    };
    let now = wasmkeep_runtime::clock::instant();
    let mut span = Span::new(
        f.ctx,
        Some(f.traced.server.span_id),
        "forward",
        SpanKind::Client,
        (f.started, now),
    )
    .text("wasmkeep.node", &node_name(s))
    .text("wasmkeep.node.to", &to);
    span.error = error;
    s.rt.traces().record(span);
}

#[derive(Deserialize)]
pub(super) struct RecentQuery {
    limit: Option<usize>,
    /// Requests to actors whose address (`tenant/app/class/name`) starts
    /// with this.
    actor: Option<String>,
}

/// `GET /admin/v1/traces`.
pub(super) async fn recent(State(s): State<AppState>, Query(q): Query<RecentQuery>) -> Response {
    let limit = q
        .limit
        .unwrap_or(TRACES_LIST_DEFAULT)
        .clamp(1, TRACES_LIST_MAX);
    let spans = s.rt.traces().recent_requests(limit, q.actor.as_deref());
    let exported = s.exported.as_ref().map(|c| {
        use std::sync::atomic::Ordering::Relaxed;
        json!({
            "exported": c.exported.load(Relaxed),
            "dropped": c.dropped.load(Relaxed),
            "failed_batches": c.failed_batches.load(Relaxed),
        })
    });
    axum::Json(json!({
        "node": node_name(&s),
        "sample_pct": s.config.trace_sample_pct,
        "spans_recorded": s.rt.traces().spans_total(),
        "otlp": exported,
        "requests": spans.iter().map(|sp| span_json(sp)).collect::<Vec<_>>(),
    }))
    .into_response()
}

#[derive(Deserialize)]
pub(super) struct OneQuery {
    #[serde(default)]
    cluster: bool,
}

/// `GET /admin/v1/traces/{trace_id}`.
pub(super) async fn one_trace(
    State(s): State<AppState>,
    axum::extract::Path(trace_id): axum::extract::Path<String>,
    Query(q): Query<OneQuery>,
) -> Result<Response, ApiError> {
    let mut id = [0u8; 16];
    if trace_id.len() != 32 || hex::decode_to_slice(&trace_id, &mut id).is_err() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("a trace id is 32 hex digits: trace_id=`{trace_id}`"),
        ));
    }
    // Each span names the node that kept it (the console's timeline
    // shows it for every span).
    let here = node_name(&s);
    let mut spans: Vec<serde_json::Value> =
        s.rt.traces()
            .of_trace(&id)
            .iter()
            .map(|sp| {
                let mut v = span_json(sp);
                v["node"] = json!(here);
                v
            })
            .collect();
    let mut unreachable = Vec::new();
    if let (Some(c), true) = (&s.config.cluster, q.cluster) {
        let path = format!("{}/traces/{trace_id}", super::ADMIN_PREFIX);
        for (node, theirs) in super::fanout::ask_others(c, &path).await? {
            match theirs.as_ref().and_then(|v| v["spans"].as_array()) {
                Some(a) => spans.extend(a.iter().cloned()),
                None => unreachable.push(node),
            }
        }
    }
    spans.sort_by_key(|sp| sp["start_unix_ns"].as_u64().unwrap_or(0));
    Ok(axum::Json(json!({
        "trace_id": trace_id,
        "node": node_name(&s),
        "spans": spans,
        "nodes_unreachable": unreachable,
    }))
    .into_response())
}
