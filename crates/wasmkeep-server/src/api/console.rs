//! The console (issue 39): pages at `/console`, served from assets embedded
//! in the binary, that call the admin API as an operator's browser.
//!
//! How a browser is let in (ADR 0063):
//!
//! - The console needs the node's admin token: a node without one refuses
//!   to log anyone in (`console_needs_admin_token`), since its origin also
//!   serves every tenant's pages under `/v1`.
//! - `POST /console/login` takes the token once and answers two secrets:
//!   a session in an `HttpOnly; SameSite=Strict` cookie scoped to
//!   `/admin/v1/`, which no script reads and no other site's page sends,
//!   and a CSRF value in the body, which the page keeps in a variable of
//!   its script only (not in any storage another page of the origin could
//!   read, the tab's `sessionStorage` included).
//! - The admin API takes a browser's request when it carries both: the
//!   cookie and the CSRF value in [`CSRF_HEADER`]. A tenant's page on the
//!   same origin can make the browser send the cookie, but the CSRF value
//!   is never sent again after login, so it cannot learn it.
//! - The pages' own answers forbid framing, inline scripts and being
//!   opened by another page of the origin (`Cross-Origin-Opener-Policy`).
//!   Actors never see the session cookie (it is taken out of the requests
//!   they get, see [`strip_from_actor_request`]), and their answers can
//!   neither widen a service worker's scope to the console, nor set or
//!   clear its cookie (see [`strip_from_actor_answer`]).
//!
//! Sessions live in the node's memory: at most [`CONSOLE_SESSIONS_MAX`]
//! (the oldest goes first), each for [`CONSOLE_SESSION_TTL_MS`]; a restart
//! logs everyone out.

use std::collections::HashMap;
use std::net::IpAddr;
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
/// Failed logins a node takes per minute from one client address; past
/// it, that address's logins are refused (`console_login_throttled`) until
/// the minute ends.
pub const CONSOLE_LOGIN_FAILURES_PER_MINUTE: u32 = 20;
/// Failed logins a node takes per minute from all addresses together.
pub const CONSOLE_LOGIN_FAILURES_NODE_PER_MINUTE: u32 = 200;
/// Client addresses whose failures are counted apart in one minute; past
/// it, the others share one count.
const CONSOLE_LOGIN_PEERS_MAX: usize = 1_024;
/// The header a console page sends its CSRF value in.
pub(crate) const CSRF_HEADER: &str = "x-wasmkeep-csrf";
/// The session cookie's name.
pub(crate) const COOKIE_NAME: &str = "wasmkeep_console";
/// Where the browser sends the session cookie: the admin API only (actors'
/// requests under `/v1` never carry it).
const COOKIE_PATH: &str = "/admin/v1/";

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
    /// The minute the failure counts are of.
    failures_minute: u64,
    /// Failed logins this minute: all, and per client address (`None`:
    /// the addresses past `CONSOLE_LOGIN_PEERS_MAX`, and unknown ones).
    failures: u32,
    failures_by_peer: HashMap<Option<IpAddr>, u32>,
}

impl SessionsInner {
    /// The failure counts, reset when a new minute began.
    fn this_minute(&mut self) -> &mut Self {
        let minute = crate::cluster::now_ms() / 60_000;
        if self.failures_minute != minute {
            self.failures_minute = minute;
            self.failures = 0;
            self.failures_by_peer.clear();
        }
        self
    }

    fn peer_key(&self, peer: Option<IpAddr>) -> Option<IpAddr> {
        if self.failures_by_peer.contains_key(&peer)
            || self.failures_by_peer.len() < CONSOLE_LOGIN_PEERS_MAX
        {
            peer
        } else {
            None
        }
    }
}

impl Sessions {
    /// Whether `headers` carry a live session's cookie and its CSRF value.
    /// Every cookie of the session's name is tried: a page of the origin
    /// can plant one of the same name on a longer path, which the browser
    /// then sends first.
    pub(crate) fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(csrf) = headers.get(CSRF_HEADER) else {
            return false;
        };
        let csrf = digest(csrf.to_str().unwrap_or(""));
        let now = crate::cluster::now_ms();
        let inner = self.inner.lock().expect("console sessions");
        session_cookies(headers).any(|cookie| {
            inner.by_cookie.get(&digest(cookie)).is_some_and(|s| {
                now.saturating_sub(s.created_ms) < CONSOLE_SESSION_TTL_MS && ct_eq(&s.csrf, &csrf)
            })
        })
    }

    /// The unsafe variant `console_without_csrf`: a live session's cookie
    /// is enough.
    pub(crate) fn admits_cookie_alone(&self, headers: &HeaderMap) -> bool {
        let now = crate::cluster::now_ms();
        let inner = self.inner.lock().expect("console sessions");
        session_cookies(headers).any(|cookie| {
            inner
                .by_cookie
                .get(&digest(cookie))
                .is_some_and(|s| now.saturating_sub(s.created_ms) < CONSOLE_SESSION_TTL_MS)
        })
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

    /// Ends the sessions whose cookies `headers` carry.
    fn close(&self, headers: &HeaderMap) {
        let mut inner = self.inner.lock().expect("console sessions");
        for cookie in session_cookies(headers) {
            inner.by_cookie.remove(&digest(cookie));
        }
    }

    /// Counts a failed login from `peer`.
    fn failed(&self, peer: Option<IpAddr>) {
        let mut guard = self.inner.lock().expect("console sessions");
        let inner = guard.this_minute();
        inner.failures = inner.failures.saturating_add(1);
        let key = inner.peer_key(peer);
        let n = inner.failures_by_peer.entry(key).or_default();
        *n = n.saturating_add(1);
    }

    /// Whether logins from `peer` are refused for the rest of the minute,
    /// and by which limit: it failed `CONSOLE_LOGIN_FAILURES_PER_MINUTE`
    /// times, or all clients together
    /// `CONSOLE_LOGIN_FAILURES_NODE_PER_MINUTE` times.
    fn throttled(&self, peer: Option<IpAddr>) -> Option<(&'static str, u32)> {
        let mut guard = self.inner.lock().expect("console sessions");
        let inner = guard.this_minute();
        let key = inner.peer_key(peer);
        let mine = inner.failures_by_peer.get(&key).copied().unwrap_or(0);
        if mine >= CONSOLE_LOGIN_FAILURES_PER_MINUTE {
            Some((
                "console_login_failures_per_minute",
                CONSOLE_LOGIN_FAILURES_PER_MINUTE,
            ))
        } else if inner.failures >= CONSOLE_LOGIN_FAILURES_NODE_PER_MINUTE {
            Some((
                "console_login_failures_node_per_minute",
                CONSOLE_LOGIN_FAILURES_NODE_PER_MINUTE,
            ))
        } else {
            None
        }
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

/// The values of every session cookie among the request's cookies.
fn session_cookies(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value)
}

/// Takes the console's cookie out of a request an actor will get (or that
/// is forwarded to the actor's owner): tenants never see an operator's
/// session. The request's other cookies stay, in their order.
pub(crate) fn strip_from_actor_request(headers: &mut HeaderMap) {
    if !headers.contains_key(header::COOKIE) {
        return;
    }
    let kept: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .map(str::trim)
                .filter(|pair| pair.split('=').next().map(str::trim) != Some(COOKIE_NAME))
                .collect::<Vec<_>>()
                .join("; ")
        })
        .filter(|v| !v.is_empty())
        .collect();
    headers.remove(header::COOKIE);
    for v in kept {
        if let Ok(v) = HeaderValue::from_str(&v) {
            headers.append(header::COOKIE, v);
        }
    }
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
    let ip = peer.map(|p| p.ip());
    let forwarded_https = req
        .headers()
        .get("x-forwarded-proto")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
    if let Some((limit, n)) = s.console.throttled(ip) {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "console_login_throttled",
            format!("too many failed console logins this minute: limit {limit}={n}"),
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
        s.console.failed(ip);
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "that is not the node's admin token",
        ));
    }
    let (cookie, csrf) = s.console.open()?;
    // Behind a proxy that ends TLS the cookie is sent over TLS only.
    let secure = if forwarded_https { "; Secure" } else { "" };
    let set = format!(
        "{COOKIE_NAME}={cookie}; HttpOnly; SameSite=Strict; Path={COOKIE_PATH}; Max-Age={}{secure}",
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

/// `POST /admin/v1/console/logout`: ends the session. An admin route, so
/// the session's CSRF value is needed: no other page logs an operator out.
pub(super) async fn logout(State(s): State<AppState>, req: Request) -> Response {
    s.console.close(req.headers());
    let mut r = StatusCode::NO_CONTENT.into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&format!(
            "{COOKIE_NAME}=; HttpOnly; SameSite=Strict; Path={COOKIE_PATH}; Max-Age=0"
        ))
        .expect("ASCII"),
    );
    r
}

/// Removes from an actor's answer what would reach the console on the
/// node's origin: a `Service-Worker-Allowed` header (a worker whose scope
/// covers `/console` could read the token as it is typed), a
/// `Clear-Site-Data` header (it would log the operator out) and a cookie of
/// the console's name. Not in the unsafe variant `actor_answer_unfiltered`.
pub(crate) fn strip_from_actor_answer(headers: &mut HeaderMap) {
    headers.remove("service-worker-allowed");
    headers.remove("clear-site-data");
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
