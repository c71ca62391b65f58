//! Messages between actors in a cluster (ADR 0040): the outbox's
//! dispatcher delivers an inbound event (a message, or the answer to one)
//! to whichever node holds its actor, through the same routing and
//! forwarding as a client's request (one hop, re-routed when the owner
//! refused as not its own).
//!
//! On the wire the event is a `POST` to
//! `/internal/inbound/v1/{tenant}/{app}/{class}/{name}`, a JSON body, and
//! the signature of the node that sends it (`cluster::sign`); the owner
//! answers `{"answer": ...}` or an error in the usual shape. A node never
//! serves that route outside cluster mode, nor to anyone but its cluster's
//! nodes.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Value, json};
use wasmkeep_runtime::outbox::{Answer, Inbound, MessageAnswer, Routed, Router};
use wasmkeep_runtime::{ActorId, RuntimeError};

use super::{
    ApiError, AppState, check_body_from_node, check_from_node, clustered_request, parse_actor_path,
    read_body,
};
use crate::cluster::FORWARDED_HEADER;

/// The route's prefix, before an actor's `/v1/...` path.
pub(super) const INBOUND_PREFIX: &str = "/internal/inbound";

fn err_json(code: &str, message: &str) -> Value {
    json!({ "code": code, "message": message })
}

fn answer_json(a: &Answer) -> Value {
    match a {
        Answer::Message(MessageAnswer::Reply(b)) => json!({ "reply": hex::encode(b) }),
        Answer::Message(MessageAnswer::Refused { code, message }) => {
            json!({ "refused": err_json(code, message) })
        }
        Answer::Http {
            status,
            headers,
            body,
        } => json!({ "http": { "status": status, "headers": headers, "body": hex::encode(body) } }),
        Answer::Failed { code, message } => json!({ "failed": err_json(code, message) }),
    }
}

fn text(v: &Value, field: &str) -> Option<String> {
    v.get(field)?.as_str().map(str::to_owned)
}

fn bytes(v: &Value, field: &str) -> Option<Vec<u8>> {
    hex::decode(v.get(field)?.as_str()?).ok()
}

fn error_of(v: &Value) -> Option<(String, String)> {
    Some((text(v, "code")?, text(v, "message")?))
}

fn answer_from(v: &Value) -> Option<Answer> {
    if let Some(b) = v.get("reply").and_then(Value::as_str) {
        return Some(Answer::Message(MessageAnswer::Reply(hex::decode(b).ok()?)));
    }
    if let Some(e) = v.get("refused") {
        let (code, message) = error_of(e)?;
        return Some(Answer::Message(MessageAnswer::Refused { code, message }));
    }
    if let Some(h) = v.get("http") {
        let headers = serde_json::from_value(h.get("headers")?.clone()).ok()?;
        return Some(Answer::Http {
            status: u16::try_from(h.get("status")?.as_u64()?).ok()?,
            headers,
            body: bytes(h, "body")?,
        });
    }
    let (code, message) = error_of(v.get("failed")?)?;
    Some(Answer::Failed { code, message })
}

/// The event as the route's body.
fn encode(ev: &Inbound) -> Vec<u8> {
    let v = match ev {
        Inbound::Message {
            from,
            life,
            seq,
            body,
            trace,
            chain,
        } => json!({
            "message": {
                "from": [from.tenant, from.app, from.class, from.name],
                "life": life.to_string(),
                "seq": seq,
                "body": hex::encode(body),
                "traceparent": trace.map(|t| t.header()),
                "chain": chain,
            }
        }),
        Inbound::Response {
            life,
            seq,
            answer,
            attempts,
            discard,
            trace,
        } => json!({
            "response": {
                "life": life.to_string(),
                "seq": seq,
                "answer": answer_json(answer),
                "attempts": attempts,
                "discard": discard,
                "traceparent": trace.map(|t| t.header()),
            }
        }),
    };
    v.to_string().into_bytes()
}

/// The trace context an event carries (ADR 0064); absent or malformed:
/// none.
fn trace_of(v: &Value) -> Option<wasmkeep_runtime::trace::TraceContext> {
    wasmkeep_runtime::trace::TraceContext::parse(v.get("traceparent")?.as_str()?)
}

fn decode(body: &[u8]) -> Option<Inbound> {
    let v: Value = serde_json::from_slice(body).ok()?;
    if let Some(m) = v.get("message") {
        let from: Vec<String> = serde_json::from_value(m.get("from")?.clone()).ok()?;
        let [t, a, c, n] = from.as_slice() else {
            return None;
        };
        return Some(Inbound::Message {
            from: ActorId::new(t, a, c, n).ok()?,
            life: text(m, "life")?.parse().ok()?,
            seq: m.get("seq")?.as_u64()?,
            body: bytes(m, "body")?,
            trace: trace_of(m),
            // A chain longer than the bound is cut to it plus one, which
            // the receiver's check refuses as too long a chain of waits.
            chain: m
                .get("chain")
                .and_then(Value::as_array)
                .map(|c| {
                    c.iter()
                        .filter_map(Value::as_str)
                        .take(wasmkeep_runtime::awaits::AWAIT_CHAIN_MAX + 1)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
        });
    }
    let r = v.get("response")?;
    Some(Inbound::Response {
        life: text(r, "life")?.parse().ok()?,
        seq: r.get("seq")?.as_u64()?,
        answer: answer_from(r.get("answer")?)?,
        attempts: u32::try_from(r.get("attempts")?.as_u64()?).ok()?,
        discard: r.get("discard")?.as_bool()?,
        trace: trace_of(r),
    })
}

/// The bytes [`encode_segment`] escapes: all but RFC 3986's unreserved
/// characters (`A-Z a-z 0-9 - . _ ~`), which mean the same escaped or not.
/// Every other byte, `/` and `%` among them, is escaped, so that a name
/// stays one path segment and `wasmkeep_store::id::decode_name` gives it
/// back as it was (the bytes of a non-ASCII character are always escaped).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// An actor name (or any segment) as one URL path segment.
pub(super) fn encode_segment(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

fn inbound_path(id: &ActorId) -> String {
    format!(
        "{INBOUND_PREFIX}/v1/{}/{}/{}/{}",
        id.tenant,
        id.app,
        id.class,
        encode_segment(&id.name)
    )
}

/// Runs the event on this node and answers it.
async fn run_here(
    rt: wasmkeep_runtime::Runtime,
    id: ActorId,
    ev: Inbound,
) -> Result<Response, ApiError> {
    let answer = rt.inbound(id, ev).await?;
    let body = match answer {
        Some(a) => json!({ "answer": answer_json(&Answer::Message(a)) }),
        None => json!({ "answer": null }),
    };
    Ok((StatusCode::OK, axum::Json(body)).into_response())
}

/// `POST /internal/inbound/v1/...`: an inbound event another node (or this
/// one) routes to the actor's owner.
pub(super) async fn inbound_route(
    State(s): State<AppState>,
    req: Request,
) -> Result<Response, ApiError> {
    let Some(c) = s.config.cluster.clone() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "route_not_found",
            "inbound events travel between cluster nodes only",
        ));
    };
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    let (id, _) = parse_actor_path(path.strip_prefix(INBOUND_PREFIX).unwrap_or(path))?;
    // Only nodes send these, always forwarded and signed: a message names
    // its sender, which no client may forge (issue 33).
    let forwarded = parts.headers.contains_key(FORWARDED_HEADER);
    if !forwarded {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "node_signature_invalid",
            "only the nodes of this cluster may send inbound events",
        ));
    }
    let named = check_from_node(&c, &parts, "")?;
    let limit = s.config.request_body_bytes_max.saturating_mul(2) + 64 * 1024;
    let body = read_body(body, limit, s.pace()).await?;
    check_body_from_node(&body, &named)?;
    super::check_acting(&s)?;
    let pq = parts.uri.path().to_string();
    let rt = s.rt.clone();
    clustered_request(
        &c,
        id,
        &pq,
        &parts,
        body,
        forwarded,
        move |id, body| async move {
            let ev = decode(&body).ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "not an inbound event",
                )
            })?;
            run_here(rt, id, ev).await
        },
    )
    .await
}

/// The dispatcher's way to actors on other nodes.
pub(super) struct ClusterRouter {
    pub(super) state: AppState,
    /// The server's runtime, where forwards and their connections live.
    pub(super) handle: tokio::runtime::Handle,
}

impl Router for ClusterRouter {
    fn deliver(&self, to: ActorId, ev: Inbound) -> Routed {
        let s = self.state.clone();
        let handle = self.handle.clone();
        Box::pin(async move {
            let joined = handle.spawn(async move { route(s, to, ev).await }).await;
            joined.unwrap_or_else(|e| Err(RuntimeError::Internal(format!("inbound: {e}"))))
        })
    }
}

async fn route(
    s: AppState,
    to: ActorId,
    ev: Inbound,
) -> Result<Option<MessageAnswer>, RuntimeError> {
    let Some(c) = s.config.cluster.clone() else {
        return s.rt.inbound(to, ev).await;
    };
    let pq = inbound_path(&to);
    let req = axum::http::Request::builder()
        .method("POST")
        .uri(&pq)
        .header("content-type", "application/json")
        .body(())
        .map_err(|e| RuntimeError::Internal(format!("inbound request: {e}")))?;
    let (parts, ()) = req.into_parts();
    let rt = s.rt.clone();
    let local = ev.clone();
    let r = clustered_request(
        &c,
        to,
        &pq,
        &parts,
        encode(&ev),
        false,
        move |id, _| async move { run_here(rt, id, local).await },
    )
    .await;
    let resp = match r {
        Ok(resp) => resp,
        Err(e) => return Err(relayed(e.status, e.code, e.message)),
    };
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), 64 * 1024 * 1024)
        .await
        .map_err(|e| RuntimeError::Internal(format!("inbound answer: {e}")))?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| RuntimeError::Internal(format!("inbound answer is not JSON: {e}")))?;
    if !status.is_success() {
        let code = v["error"]["code"]
            .as_str()
            .unwrap_or("internal")
            .to_string();
        let message = v["error"]["message"].as_str().unwrap_or("").to_string();
        return Err(relayed(status, code, message));
    }
    match v.get("answer") {
        Some(Value::Null) | None => Ok(None),
        Some(a) => match answer_from(a) {
            Some(Answer::Message(m)) => Ok(Some(m)),
            _ => Err(RuntimeError::Internal(
                "inbound answer of the wrong kind".into(),
            )),
        },
    }
}

/// An error the owner (or the routing) answered, as the dispatcher
/// classifies it: what the node could not do now is retried, what the
/// actor or its app refused is final.
fn relayed(status: StatusCode, code: String, message: String) -> RuntimeError {
    let retryable = status == StatusCode::SERVICE_UNAVAILABLE
        || status == StatusCode::BAD_GATEWAY
        || status == StatusCode::GATEWAY_TIMEOUT
        || code == "internal";
    RuntimeError::Relayed {
        code,
        message,
        retryable,
    }
}

/// Installs the router when the node is in a cluster.
pub(super) fn install(state: &AppState) {
    if state.config.cluster.is_none() {
        return;
    }
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            "no tokio runtime while building the routes: messages between actors stay on this node"
        );
        return;
    };
    let router = ClusterRouter {
        state: state.clone(),
        handle,
    };
    state.rt.outbox().set_router(Arc::new(router));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_and_answers_round_trip_through_json() {
        let from = ActorId::new("t", "a", "c", "n/with slash").unwrap();
        let ctx = wasmkeep_runtime::trace::TraceContext::new_trace();
        let m = Inbound::Message {
            from: from.clone(),
            life: u64::MAX,
            seq: 7,
            body: vec![0, 255, 3],
            trace: Some(ctx),
            chain: vec!["t/a/c/waiting".into()],
        };
        match decode(&encode(&m)).unwrap() {
            Inbound::Message {
                from: f,
                life,
                seq,
                body,
                trace,
                chain,
            } => {
                assert_eq!((f, life, seq, body), (from, u64::MAX, 7, vec![0, 255, 3]));
                assert_eq!(trace, Some(ctx));
                assert_eq!(chain, ["t/a/c/waiting"]);
            }
            other => panic!("{other:?}"),
        }
        for answer in [
            Answer::Message(MessageAnswer::Reply(b"pong".to_vec())),
            Answer::Message(MessageAnswer::Refused {
                code: "x".into(),
                message: "y".into(),
            }),
            Answer::Http {
                status: 503,
                headers: vec![("a".into(), "b".into())],
                body: b"z".to_vec(),
            },
            Answer::Failed {
                code: "delivery_failed".into(),
                message: "m".into(),
            },
        ] {
            let r = Inbound::Response {
                life: 3,
                seq: 1,
                answer: answer.clone(),
                attempts: 2,
                discard: false,
                trace: None,
            };
            match decode(&encode(&r)).unwrap() {
                Inbound::Response { answer: a, .. } => assert_eq!(a, answer),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(encode_segment("a b/ü"), "a%20b%2F%C3%BC");
        assert_eq!(encode_segment("100%"), "100%25");
        assert_eq!(encode_segment("Az09-._~"), "Az09-._~");
        assert_eq!(encode_segment("a+b?c#d"), "a%2Bb%3Fc%23d");
    }
}
