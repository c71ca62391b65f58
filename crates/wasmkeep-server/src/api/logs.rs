//! What the edge says about requests, and the admin route that serves an
//! actor scope's log lines (issue 22).
//!
//! - **Access log.** With `access_log` on, every actor request is one
//!   structured line (`wasmkeep::access`: method, path, actor, status,
//!   duration, and the error code if any) in the node's log, and in the
//!   runtime's [`LogHub`] for `wasmkeep logs`.
//! - **Failed requests** (an error with a code: `bad_request`,
//!   `guest_error`, `actor_overloaded`, …) are logged whether or not the
//!   access log is on: 5xx at WARN, 4xx at INFO (`wasmkeep::request`). A
//!   flood of them is cut to `failed_request_log_per_s` lines a second;
//!   the next line past a cut says how many were left out.
//! - **`GET /admin/v1/logs/{tenant}[/{app}[/{class}[/{name}]]]`** answers
//!   the kept lines of the scope as NDJSON (`?lines=`, `?level=`), and with
//!   `?follow=true` keeps the response open and adds each new line as it
//!   comes, with an empty line every [`HEARTBEAT_MS`] so that a quiet
//!   stream is not taken for a dead one. It ends when the node stops.
//!   With `?cluster=true` (not with `follow`) a cluster node answers the
//!   scope's kept lines of every live node, each line naming its `node`,
//!   merged by time, the last `lines` of them, and a line
//!   `{"node_unreachable": …}` for each node that did not answer within
//!   `CLUSTER_ASK_TIMEOUT_MS` (the console polls this for an actor's
//!   live log: its lines are on whichever node ran it).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use wasmkeep_runtime::ActorId;
use wasmkeep_runtime::logs::{Access, Followed, Level, LogHub, LogLine, Scope, Source, clip};

use super::{AppState, segment};
use crate::error::ApiError;

/// Longest request path an access line keeps (the rest is cut, marked
/// with `…`).
pub(super) const ACCESS_PATH_BYTES_MAX: usize = 512;
/// Lines a logs request returns from the past when it names no `lines`.
pub const LOG_LINES_DEFAULT: usize = 100;
/// How often a follow response writes an empty line when nothing happens.
pub(super) const HEARTBEAT_MS: u64 = 15_000;

/// What the edge records of one actor request once it is answered.
pub(crate) struct Answered<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub started: Instant,
    /// The error's code, for a request the node refused or failed.
    pub code: Option<&'a str>,
    pub message: Option<&'a str>,
    /// The app version that answered, from `x-wasmkeep-version`.
    pub version: Option<u64>,
}

/// Codes of refusals made before anyone was let near the actor: whoever
/// sends them proves nothing, so they never reach a tenant's lines (only
/// the node's own log, rate-cut).
const UNAUTHENTICATED: [&str; 2] = ["unauthorized", "node_signature_invalid"];

/// Longest error message a failure line quotes.
const LINE_MESSAGE_BYTES_MAX: usize = 2048;

/// A failed request in the node's log, on one line.
fn trace_failure(a: &Answered<'_>, path: &str, actor: &str, code: &str, left_out: u64) {
    // One line: a trap's message carries the guest's backtrace.
    let message = clip(a.message.unwrap_or(""), LINE_MESSAGE_BYTES_MAX);
    let message = message.replace('\n', " | ");
    if a.status >= 500 {
        tracing::warn!(target: "wasmkeep::request", method = a.method, path, actor, status = a.status, code, left_out, "request failed: {message}");
    } else {
        tracing::info!(target: "wasmkeep::request", method = a.method, path, actor, status = a.status, code, left_out, "request refused: {message}");
    }
}

/// Writes the access line and the failure line a request calls for.
pub(crate) fn record(s: &AppState, a: Answered<'_>) {
    let hub = s.rt.logs();
    let access_on = s.config.access_log;
    let failed = a.code.is_some() && a.status >= 400;
    if !access_on && !failed && !hub.followed() {
        return;
    }
    let duration_us = a.started.elapsed().as_micros() as u64;
    let path = clip(a.path, ACCESS_PATH_BYTES_MAX);
    let path: &str = &path;
    // Parsed again only here, when a line is written.
    let id: Option<ActorId> = super::parse_actor_path(a.path).ok().map(|(id, _)| id);
    // The address as text only for the node's own log lines.
    let actor = id
        .as_ref()
        .filter(|_| access_on || failed)
        .map(|id| id.to_string());
    let actor = actor.as_deref().unwrap_or("-");
    let code = a.code.unwrap_or("-");
    let ms = duration_us as f64 / 1000.0;
    if access_on {
        let version = a.version.unwrap_or(0);
        tracing::info!(target: "wasmkeep::access", method = a.method, path, actor, status = a.status, ms, code, version);
    }
    // Lines reach a tenant's log (the ring) only about actors of deployed
    // classes, and never from a request refused as unauthenticated: nobody
    // can fill a tenant's lines with text of their own or names the node
    // does not serve.
    let class = id.as_ref().and_then(|id| s.rt.class_metrics().of(id));
    let trusted = class.is_some() && !UNAUTHENTICATED.contains(&code);
    // A failure is written only while its rate allows: per class for the
    // trusted (one class's flood cannot crowd another's lines out), one
    // node-wide rate for the rest, and the node-wide rate again for the
    // node's own log.
    let per_s = s.config.failed_request_log_per_s;
    let failure_admitted = failed
        && match &class {
            Some(c) if trusted => {
                let admitted = c.failure_lines.admit(per_s);
                if let Some(left_out) = admitted
                    && s.failure_rate.admit(per_s).is_some()
                {
                    trace_failure(&a, path, actor, code, left_out);
                }
                admitted.is_some()
            }
            _ => {
                if let Some(left_out) = s.anon_failure_rate.admit(per_s) {
                    trace_failure(&a, path, actor, code, left_out);
                }
                false
            }
        };
    let Some(id) = id else { return };
    if !trusted || (failed && !failure_admitted) {
        return;
    }
    let level = match a.status {
        500.. => Level::Warn,
        _ => Level::Info,
    };
    let message = match a.message {
        Some(m) if failed => {
            let m = clip(m, LINE_MESSAGE_BYTES_MAX);
            format!("{} {path} {} {code}: {m}", a.method, a.status)
        }
        _ => format!("{} {path} {} {ms:.1} ms", a.method, a.status),
    };
    let mut line = LogLine::new(s.rt.clock().now_ms(), level, Source::Access, id, message);
    line.access = Some(Access {
        method: a.method.to_owned(),
        path: path.to_owned(),
        status: a.status,
        duration_us,
        code: a.code.map(str::to_owned),
        version: a.version,
    });
    hub.push(line);
}

/// `?follow=`, `?level=`, `?lines=` of a logs request.
struct LogsQuery {
    /// Keep the response open and add new lines as they come.
    follow: bool,
    /// The lowest level shown (default info).
    level: Level,
    /// How many of the kept lines to send first (default
    /// [`LOG_LINES_DEFAULT`]).
    lines: usize,
    /// Every live node's lines, merged (not with `follow`).
    cluster: bool,
}

impl LogsQuery {
    fn parse(q: &HashMap<String, String>) -> Result<LogsQuery, ApiError> {
        let bad = |field: &str, v: &str, want: &str| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("{field}: `{}` is not {want}", clip(v, 64)),
            )
        };
        let follow = match q.get("follow").map(String::as_str) {
            None | Some("false") => false,
            Some("true") => true,
            Some(v) => return Err(bad("follow", v, "true or false")),
        };
        let level = match q.get("level") {
            None => Level::Info,
            Some(v) => Level::parse(v)
                .ok_or_else(|| bad("level", v, "one of trace, debug, info, warn, error"))?,
        };
        let lines = match q.get("lines") {
            None => LOG_LINES_DEFAULT,
            Some(v) => v.parse().map_err(|_| bad("lines", v, "a count"))?,
        };
        let cluster = match q.get("cluster").map(String::as_str) {
            None | Some("false") => false,
            Some("true") if follow => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "cluster: `true` cannot be followed; follow one node, or ask again",
                ));
            }
            Some("true") => true,
            Some(v) => return Err(bad("cluster", v, "true or false")),
        };
        Ok(LogsQuery {
            follow,
            level,
            lines,
            cluster,
        })
    }
}

type ScopePath = axum::extract::Path<Vec<(String, String)>>;

/// `GET /admin/v1/logs/{tenant}[/{app}[/{class}[/{name}]]]`.
pub(crate) async fn logs_route(
    State(s): State<AppState>,
    axum::extract::Path(parts): ScopePath,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let q = LogsQuery::parse(&q)?;
    let get = |key: &str| parts.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    let scope = Scope {
        tenant: get("tenant").unwrap_or_default(),
        app: get("app"),
        class: get("class"),
        name: get("name"),
    };
    segment("tenant", &scope.tenant)?;
    match (&scope.app, &scope.class) {
        (Some(app), Some(class)) => {
            segment("app", app)?;
            segment("class", class)?;
            s.rt.check_class(&scope.tenant, app, class)?;
        }
        (Some(app), None) => {
            segment("app", app)?;
            s.rt.check_app(&scope.tenant, app)?;
        }
        _ => s.rt.check_tenant(&scope.tenant)?,
    }
    let level = q.level;
    let hub = Arc::clone(s.rt.logs());
    // Subscribe before reading the past, so that no line falls between.
    let follower = if q.follow { Some(hub.follow()?) } else { None };
    let past = hub.recent(&scope, level, q.lines);
    let last_past = past.last().map_or(0, |l| l.seq);
    let mut first = String::new();
    match (&s.config.cluster, q.cluster) {
        (Some(c), true) => first = cluster_lines(c, &scope, &q, &past).await?,
        _ => {
            for line in &past {
                push_json(&mut first, line);
            }
        }
    }
    let head = futures_util::stream::once(async move { Ok::<_, std::io::Error>(first) });
    let body = match follower {
        None => Body::from_stream(head),
        Some(follower) => {
            // Something is written at least every `heartbeat` (an empty
            // line if nothing else), counted from the last write, so that
            // the edge's idle timeout never cuts a quiet follower and a
            // client that went away is noticed.
            let heartbeat =
                Duration::from_millis(HEARTBEAT_MS.min(s.config.idle_timeout_ms / 2).max(1));
            let live =
                futures_util::stream::unfold((follower, scope), move |(mut f, scope)| async move {
                    let deadline = tokio::time::Instant::now() + heartbeat;
                    let out = loop {
                        match tokio::time::timeout_at(deadline, f.next()).await {
                            Err(_) => break "\n".to_owned(),
                            Ok(Followed::Closed) => return None,
                            Ok(Followed::Missed(n)) => {
                                break format!("{}\n", json!({ "missed": n }));
                            }
                            Ok(Followed::Line(line)) => {
                                if line.seq > last_past
                                    && line.level >= level
                                    && scope.contains(&line.actor)
                                {
                                    let mut out = String::new();
                                    push_json(&mut out, &line);
                                    break out;
                                }
                            }
                        }
                    };
                    Some((Ok::<_, std::io::Error>(out), (f, scope)))
                });
            use futures_util::StreamExt;
            Body::from_stream(head.chain(live))
        }
    };
    let mut resp = (StatusCode::OK, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(resp)
}

/// The scope's kept lines on every live node, merged by time (the last
/// `q.lines`), each naming its node, then a line per node that did not
/// answer.
async fn cluster_lines(
    c: &crate::cluster::ClusterState,
    scope: &Scope,
    q: &LogsQuery,
    past: &[Arc<LogLine>],
) -> Result<String, ApiError> {
    use super::inbound::encode_segment;
    let mut path = format!(
        "{}/logs/{}",
        super::ADMIN_PREFIX,
        encode_segment(&scope.tenant)
    );
    for part in [&scope.app, &scope.class, &scope.name]
        .into_iter()
        .flatten()
    {
        path.push('/');
        path.push_str(&encode_segment(part));
    }
    path.push_str(&format!("?lines={}&level={}", q.lines, q.level.as_str()));
    let mut lines: Vec<serde_json::Value> = past
        .iter()
        .map(|l| {
            let mut v = line_json(l);
            v["node"] = json!(c.node());
            v
        })
        .collect();
    let mut unreachable = Vec::new();
    for (node, body) in super::fanout::ask_others_raw(c, &path).await? {
        let Some(body) = body else {
            unreachable.push(node);
            continue;
        };
        for raw in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            // Only objects: a node answers lines, and anything else from
            // it is left out rather than trusted.
            if let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(raw)
                && let Some(o) = v.as_object_mut()
            {
                o.insert("node".to_owned(), json!(node));
                lines.push(v);
            }
        }
    }
    lines.sort_by_key(|v| v["at_ms"].as_u64().unwrap_or(0));
    let skip = lines.len().saturating_sub(q.lines);
    let mut out = String::new();
    for v in lines.into_iter().skip(skip) {
        out.push_str(&v.to_string());
        out.push('\n');
    }
    for node in unreachable {
        out.push_str(&json!({ "node_unreachable": node }).to_string());
        out.push('\n');
    }
    Ok(out)
}

/// One line as JSON, newline-terminated.
fn push_json(out: &mut String, l: &LogLine) {
    out.push_str(&line_json(l).to_string());
    out.push('\n');
}

/// One line as the logs route shows it.
fn line_json(l: &LogLine) -> serde_json::Value {
    let mut v = json!({
        "seq": l.seq,
        "at_ms": l.at_ms,
        "level": l.level.as_str(),
        "source": l.source.as_str(),
        "actor": {
            "tenant": l.actor.tenant,
            "app": l.actor.app,
            "class": l.actor.class,
            "name": l.actor.name,
        },
        "message": l.message,
    });
    if let Some(a) = &l.access {
        v["access"] = json!({
            "method": a.method,
            "path": a.path,
            "status": a.status,
            "duration_us": a.duration_us,
            "code": a.code,
            "version": a.version,
        });
    }
    v
}

/// Ends followers when the node stops, so that the connection drain does
/// not wait for them.
pub(crate) async fn close_on(hub: Arc<LogHub>, shutdown: impl std::future::Future<Output = ()>) {
    shutdown.await;
    hub.close();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_query_values_are_refused_with_the_field_named() {
        let q = |pairs: &[(&str, &str)]| {
            let m: HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            LogsQuery::parse(&m)
        };
        let ok = q(&[]).unwrap();
        assert!(!ok.follow && ok.level == Level::Info && ok.lines == LOG_LINES_DEFAULT);
        for (pairs, field) in [
            (vec![("lines", "abc")], "lines"),
            (vec![("level", "loud")], "level"),
            (vec![("follow", "yes")], "follow"),
        ] {
            let e = q(&pairs).err().expect("refused");
            assert_eq!(e.code, "bad_request");
            assert!(e.message.starts_with(field), "{}", e.message);
        }
    }
}
