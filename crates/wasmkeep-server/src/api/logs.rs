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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use wasmkeep_runtime::ActorId;
use wasmkeep_runtime::logs::{Access, Followed, Level, LogHub, LogLine, Scope, Source};

use super::{AppState, segment};
use crate::error::ApiError;

/// Longest request path an access line keeps (the rest is cut, marked
/// with `…`).
pub const ACCESS_PATH_BYTES_MAX: usize = 512;
/// Lines a logs request returns from the past when it names no `lines`.
pub const LOG_LINES_DEFAULT: usize = 100;
/// How often a follow response writes an empty line when nothing happens.
pub const HEARTBEAT_MS: u64 = 15_000;

/// Cuts failed-request lines to a rate: at most `per_s` in each second.
#[derive(Debug, Default)]
pub struct FailureLogRate {
    /// The second (since `start`) the count is for, and the count.
    window: AtomicU64,
    in_window: AtomicU64,
    /// Lines left out since the last one written.
    left_out: AtomicU64,
    start: std::sync::OnceLock<Instant>,
}

impl FailureLogRate {
    /// Whether a line may be written now; if so, also how many were left
    /// out before it.
    fn admit(&self, per_s: u64) -> Option<u64> {
        let start = *self.start.get_or_init(Instant::now);
        let second = start.elapsed().as_secs();
        if self.window.swap(second, Ordering::Relaxed) != second {
            self.in_window.store(0, Ordering::Relaxed);
        }
        if self.in_window.fetch_add(1, Ordering::Relaxed) < per_s {
            Some(self.left_out.swap(0, Ordering::Relaxed))
        } else {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// What the edge records of one actor request once it is answered.
pub(crate) struct Answered<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub started: Instant,
    /// The error's code, for a request the node refused or failed.
    pub code: Option<&'a str>,
    pub message: Option<&'a str>,
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
    let path = cut(a.path);
    let path: &str = &path;
    // Parsed again only here, when a line is written.
    let id: Option<ActorId> = super::parse_actor_path(a.path).ok().map(|(id, _)| id);
    let actor = id.as_ref().map(|id| id.to_string());
    let actor = actor.as_deref().unwrap_or("-");
    let code = a.code.unwrap_or("-");
    let ms = duration_us as f64 / 1000.0;
    if access_on {
        tracing::info!(target: "wasmkeep::access", method = a.method, path, actor, status = a.status, ms, code);
    }
    if failed {
        let per_s = s.config.failed_request_log_per_s;
        if let Some(left_out) = s.failure_rate.admit(per_s) {
            // One line: a trap's message carries the guest's backtrace.
            let message = a.message.unwrap_or("").replace('\n', " | ");
            if a.status >= 500 {
                tracing::warn!(target: "wasmkeep::request", method = a.method, path, actor, status = a.status, code, left_out, "request failed: {message}");
            } else {
                tracing::info!(target: "wasmkeep::request", method = a.method, path, actor, status = a.status, code, left_out, "request refused: {message}");
            }
        }
    }
    // The hub takes lines about a known actor only (a scope selects them).
    let Some(id) = id else { return };
    if !(access_on || failed || hub.followed()) {
        return;
    }
    let level = match a.status {
        500.. => Level::Warn,
        _ => Level::Info,
    };
    let message = match a.message {
        Some(m) if failed => format!("{} {path} {} {code}: {m}", a.method, a.status),
        _ => format!("{} {path} {} {ms:.1} ms", a.method, a.status),
    };
    let mut line = LogLine::new(s.rt.clock().now_ms(), level, Source::Access, id, message);
    line.access = Some(Access {
        method: a.method.to_owned(),
        path: path.to_owned(),
        status: a.status,
        duration_us,
        code: a.code.map(str::to_owned),
    });
    hub.push(line);
}

fn cut(path: &str) -> std::borrow::Cow<'_, str> {
    if path.len() <= ACCESS_PATH_BYTES_MAX {
        return path.into();
    }
    let mut end = ACCESS_PATH_BYTES_MAX;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &path[..end]).into()
}

#[derive(Deserialize)]
pub(crate) struct LogsQuery {
    /// Keep the response open and add new lines as they come.
    #[serde(default)]
    follow: bool,
    /// The lowest level shown: trace, debug, info (default), warn, error.
    level: Option<String>,
    /// How many of the kept lines to send first (default
    /// [`LOG_LINES_DEFAULT`]; 0 with `follow`: only new ones).
    lines: Option<usize>,
}

type ScopePath = axum::extract::Path<Vec<(String, String)>>;

/// `GET /admin/v1/logs/{tenant}[/{app}[/{class}[/{name}]]]`.
pub(crate) async fn logs_route(
    State(s): State<AppState>,
    axum::extract::Path(parts): ScopePath,
    Query(q): Query<LogsQuery>,
) -> Result<Response, ApiError> {
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
    let level = match q.level.as_deref() {
        None => Level::Info,
        Some(l) => Level::parse(l).ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("level: `{l}` is not one of trace, debug, info, warn, error"),
            )
        })?,
    };
    let hub = Arc::clone(s.rt.logs());
    // Subscribe before reading the past, so that no line falls between.
    let follower = if q.follow { Some(hub.follow()?) } else { None };
    let past = hub.recent(&scope, level, q.lines.unwrap_or(LOG_LINES_DEFAULT));
    let last_past = past.last().map_or(0, |l| l.seq);
    let mut first = String::new();
    for line in &past {
        push_json(&mut first, line);
    }
    let head = futures_util::stream::once(async move { Ok::<_, std::io::Error>(first) });
    let body = match follower {
        None => Body::from_stream(head),
        Some(follower) => {
            let live = futures_util::stream::unfold(
                (follower, scope, hub),
                move |(mut f, scope, hub)| async move {
                    let out = loop {
                        let next =
                            tokio::time::timeout(Duration::from_millis(HEARTBEAT_MS), f.next());
                        match next.await {
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
                    Some((Ok::<_, std::io::Error>(out), (f, scope, hub)))
                },
            );
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

/// One line as JSON, newline-terminated.
fn push_json(out: &mut String, l: &LogLine) {
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
        });
    }
    out.push_str(&v.to_string());
    out.push('\n');
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
    fn failure_lines_are_cut_to_the_rate_and_the_next_one_counts_the_cut() {
        let r = FailureLogRate::default();
        assert_eq!(r.admit(2), Some(0));
        assert_eq!(r.admit(2), Some(0));
        assert_eq!(r.admit(2), None);
        assert_eq!(r.admit(2), None);
        std::thread::sleep(Duration::from_millis(1_050));
        assert_eq!(r.admit(2), Some(2), "the next line says two were left out");
    }

    #[test]
    fn long_paths_are_cut_on_a_character_boundary() {
        let long = "é".repeat(ACCESS_PATH_BYTES_MAX);
        let c = cut(&long);
        assert!(c.len() <= ACCESS_PATH_BYTES_MAX + "…".len());
        assert!(c.ends_with('…'));
        assert_eq!(cut("/v1/a"), "/v1/a");
    }
}
