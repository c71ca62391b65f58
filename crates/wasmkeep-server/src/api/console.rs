//! The console (issue 39): pages at `/console`, served from assets embedded
//! in the binary, that call the admin API as an operator's browser.
//!
//! How a browser is let in (ADR 0063):
//!
//! - The console needs the node's admin token: a node without one refuses
//!   to log anyone in (`console_needs_admin_token`), since its origin also
//!   serves every tenant's pages under `/v1`.
//! - `POST /console/login` takes the token once and answers two secrets:
//!   a session in an `HttpOnly; SameSite=Strict` cookie, which no script
//!   reads and no other site's page sends, and a CSRF value in the body,
//!   which the page keeps in its tab's `sessionStorage`.
//! - The admin API takes a browser's request when it carries both: the
//!   cookie and the CSRF value in [`CSRF_HEADER`]. A tenant's page on the
//!   same origin can make the browser send the cookie, but the CSRF value
//!   is never sent again after login, so it cannot learn it.
//! - The pages' own answers forbid framing, inline scripts and being
//!   opened by another page of the origin (`Cross-Origin-Opener-Policy`),
//!   and actors' answers cannot widen a service worker's scope to the
//!   console (see [`strip_from_actor_answer`]).
//!
//! Sessions live in the node's memory: at most [`CONSOLE_SESSIONS_MAX`]
//! (the oldest goes first), each for [`CONSOLE_SESSION_TTL_MS`]; a restart
//! logs everyone out.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{AppState, read_body_named};
use crate::auth::{ct_eq, digest};
use crate::error::ApiError;

/// Sessions a node keeps at once; a login past it ends the oldest.
pub const CONSOLE_SESSIONS_MAX: usize = 64;
/// How long a session lasts after its login.
pub const CONSOLE_SESSION_TTL_MS: u64 = 12 * 3_600_000;
/// Largest login body.
pub const CONSOLE_LOGIN_BYTES_MAX: usize = 4_096;
/// Failed logins a node takes per minute; past it, logins are refused
/// (`console_login_throttled`) until the minute ends.
pub const CONSOLE_LOGIN_FAILURES_PER_MINUTE: u32 = 20;
/// The header a console page sends its CSRF value in.
pub(crate) const CSRF_HEADER: &str = "x-wasmkeep-csrf";
/// The session cookie's name.
pub(crate) const COOKIE_NAME: &str = "wasmkeep_console";

const INDEX_HTML: &str = include_str!("../../console/index.html");
const CONSOLE_JS: &str = include_str!("../../console/console.js");
const CONSOLE_CSS: &str = include_str!("../../console/console.css");

/// Every console answer's policy: its own scripts and styles only, no
/// frame around it, no opener of the origin holding it.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

struct Session {
    csrf: [u8; 32],
    created_ms: u64,
}

/// The node's console sessions, by the digest of their cookie.
#[derive(Default)]
pub(crate) struct Sessions {
    inner: Mutex<SessionsInner>,
}

#[derive(Default)]
struct SessionsInner {
    by_cookie: HashMap<[u8; 32], Session>,
    failures_minute: u64,
    failures: u32,
}

impl Sessions {
    /// Whether `headers` carry a live session's cookie and its CSRF value.
    pub(crate) fn admits(&self, headers: &HeaderMap) -> bool {
        let (Some(cookie), Some(csrf)) = (session_cookie(headers), headers.get(CSRF_HEADER)) else {
            return false;
        };
        let csrf = digest(csrf.to_str().unwrap_or(""));
        let now = crate::cluster::now_ms();
        let mut inner = self.inner.lock().expect("console sessions");
        let key = digest(&cookie);
        match inner.by_cookie.get(&key) {
            Some(s) if now.saturating_sub(s.created_ms) < CONSOLE_SESSION_TTL_MS => {
                ct_eq(&s.csrf, &csrf)
            }
            Some(_) => {
                inner.by_cookie.remove(&key);
                false
            }
            None => false,
        }
    }

    /// The unsafe variant `console_without_csrf`: a live session's cookie
    /// is enough.
    pub(crate) fn admits_cookie_alone(&self, headers: &HeaderMap) -> bool {
        let Some(cookie) = session_cookie(headers) else {
            return false;
        };
        let now = crate::cluster::now_ms();
        let inner = self.inner.lock().expect("console sessions");
        inner
            .by_cookie
            .get(&digest(&cookie))
            .is_some_and(|s| now.saturating_sub(s.created_ms) < CONSOLE_SESSION_TTL_MS)
    }

    /// A new session: its cookie and CSRF value.
    fn open(&self) -> Result<(String, String), ApiError> {
        let cookie = random_hex()?;
        let csrf = random_hex()?;
        let now = crate::cluster::now_ms();
        let mut inner = self.inner.lock().expect("console sessions");
        inner
            .by_cookie
            .retain(|_, s| now.saturating_sub(s.created_ms) < CONSOLE_SESSION_TTL_MS);
        while inner.by_cookie.len() >= CONSOLE_SESSIONS_MAX {
            let oldest = inner
                .by_cookie
                .iter()
                .min_by_key(|(_, s)| s.created_ms)
                .map(|(k, _)| *k)
                .expect("not empty");
            inner.by_cookie.remove(&oldest);
        }
        inner.by_cookie.insert(
            digest(&cookie),
            Session {
                csrf: digest(&csrf),
                created_ms: now,
            },
        );
        Ok((cookie, csrf))
    }

    fn close(&self, headers: &HeaderMap) {
        if let Some(cookie) = session_cookie(headers) {
            let mut inner = self.inner.lock().expect("console sessions");
            inner.by_cookie.remove(&digest(&cookie));
        }
    }

    /// Counts a failed login; whether logins are throttled this minute.
    fn failed(&self) {
        let minute = crate::cluster::now_ms() / 60_000;
        let mut inner = self.inner.lock().expect("console sessions");
        if inner.failures_minute != minute {
            inner.failures_minute = minute;
            inner.failures = 0;
        }
        inner.failures = inner.failures.saturating_add(1);
    }

    fn throttled(&self) -> bool {
        let minute = crate::cluster::now_ms() / 60_000;
        let inner = self.inner.lock().expect("console sessions");
        inner.failures_minute == minute && inner.failures >= CONSOLE_LOGIN_FAILURES_PER_MINUTE
    }
}

fn random_hex() -> Result<String, ApiError> {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("no randomness for a console session: {e}"),
        )
    })?;
    Ok(hex::encode(buf))
}

/// The value of the session cookie among the request's cookies.
fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.to_owned())
}

/// A console asset with the console's headers.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = Response::new(Body::from(body));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// `GET /console` (and `/console/`): the page.
pub(super) async fn page() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// `GET /console/console.js`.
pub(super) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", CONSOLE_JS)
}

/// `GET /console/console.css`.
pub(super) async fn style() -> Response {
    asset("text/css; charset=utf-8", CONSOLE_CSS)
}

/// `POST /console/login` with `{"token": "…"}`: a session cookie and, in
/// the body, the session's CSRF value.
pub(super) async fn login(State(s): State<AppState>, req: Request) -> Response {
    match try_login(&s, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn try_login(s: &AppState, req: Request) -> Result<Response, ApiError> {
    if s.config.admin_token.is_none() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "console_needs_admin_token",
            "the console needs the node's admin token: start it with admin_token set (a node without one serves tenants' pages on the same origin)",
        ));
    }
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0);
    s.tokens.admin_gate(peer, req.headers())?;
    if s.console.throttled() {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "console_login_throttled",
            format!(
                "too many failed console logins: limit console_login_failures_per_minute={CONSOLE_LOGIN_FAILURES_PER_MINUTE}"
            ),
        );
        e.retry_after_s = Some(60);
        return Err(e);
    }
    let body = read_body_named(req.into_body(), CONSOLE_LOGIN_BYTES_MAX, s.pace(), || {
        format!("console login too large: limit console_login_bytes_max={CONSOLE_LOGIN_BYTES_MAX}")
    })
    .await?;
    let token = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("token").and_then(|t| t.as_str()).map(str::to_owned))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_body",
                "a console login is a JSON object with a string field `token`",
            )
        })?;
    let mut bearer = HeaderMap::new();
    let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_body",
            "the token holds characters no token has",
        )
    })?;
    bearer.insert(header::AUTHORIZATION, value);
    if !s.tokens.admin_ok(&bearer) {
        s.console.failed();
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "that is not the node's admin token",
        ));
    }
    let (cookie, csrf) = s.console.open()?;
    let set = format!(
        "{COOKIE_NAME}={cookie}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        CONSOLE_SESSION_TTL_MS / 1000
    );
    let mut r = axum::Json(json!({ "csrf": csrf })).into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&set).expect("hex and ASCII"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

/// `POST /console/logout`: ends the session (with its CSRF value, so that
/// no other page logs an operator out).
pub(super) async fn logout(State(s): State<AppState>, req: Request) -> Response {
    if !s.console.admits(req.headers()) {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "no console session with that CSRF value",
        )
        .into_response();
    }
    s.console.close(req.headers());
    let mut r = StatusCode::NO_CONTENT.into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("wasmkeep_console=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
    r
}

/// Removes from an actor's answer what would reach the console on the
/// node's origin: a `Service-Worker-Allowed` header (a worker whose scope
/// covers `/console` could read the token as it is typed) and a cookie of
/// the console's name. Not in the unsafe variant `actor_answer_unfiltered`.
pub(crate) fn strip_from_actor_answer(headers: &mut HeaderMap) {
    headers.remove("service-worker-allowed");
    let kept: Vec<HeaderValue> = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter(|v| {
            let name = v
                .to_str()
                .ok()
                .and_then(|v| v.split('=').next())
                .map(str::trim);
            name != Some(COOKIE_NAME)
        })
        .cloned()
        .collect();
    headers.remove(header::SET_COOKIE);
    for v in kept {
        headers.append(header::SET_COOKIE, v);
    }
}
