//! Routes, handlers and the server loop.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post, put};

use crate::unsafe_rules::UnsafeRules;
use serde::Deserialize;
use serde_json::json;
use wasmkeep_runtime::{ActorId, ActorRequest, Runtime};

use crate::auth::Tokens;

mod console;
mod drain;
mod fanout;
mod history;
mod inbound;
mod logs;
mod rebalance;
mod replay_bucket;
mod shares;
mod sockets;
mod test_clock;
mod trace_routes;
mod ws;
use crate::cluster::{CLUSTER_TOKEN_HEADER, ClusterState, FORWARDED_HEADER, NODE_HEADER};
use crate::error::ApiError;
pub use console::{
    CONSOLE_LOGIN_BYTES_MAX, CONSOLE_LOGIN_FAILURES_NODE_PER_MINUTE,
    CONSOLE_LOGIN_FAILURES_PER_MINUTE, CONSOLE_SESSION_TTL_MS, CONSOLE_SESSIONS_MAX,
};
pub use history::{HISTORY_SAMPLE_MS, HISTORY_SAMPLES_MAX};
pub use logs::LOG_LINES_DEFAULT;
pub use trace_routes::{TRACES_LIST_DEFAULT, TRACES_LIST_MAX};

/// Longest SQL text the inspection route accepts.
pub const INSPECT_SQL_BYTES_MAX: usize = 1024 * 1024;
/// Bytes read from a copied database per chunk of an export's answer.
const EXPORT_CHUNK_BYTES: usize = 64 * 1024;

/// Largest database the restore route takes (held in memory while it is
/// written to the node's staging folder, and forwarded to the owner in a
/// cluster); a larger one is restored with `wasmkeep restore --bucket` on
/// a stopped node.
pub const RESTORE_BYTES_MAX: usize = 256 * 1024 * 1024;
/// Actor names a listing returns when the caller names no limit.
pub const LIST_ACTORS_DEFAULT: usize = 100;
/// Alarms a listing returns when the caller names no limit, and at most.
pub const LIST_ALARMS_DEFAULT: usize = 100;
pub const LIST_ALARMS_MAX: usize = 10_000;

/// Settings of the HTTP edge.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest request body accepted (actors and deploys alike).
    pub request_body_bytes_max: usize,
    /// Token for `/admin`; `None`: open, to loopback peers only.
    pub admin_token: Option<String>,
    /// Tokens per tenant for `/v1/{tenant}`; they need an `admin_token`.
    pub tenant_tokens: BTreeMap<String, String>,
    /// Most actor names one listing returns.
    pub list_actors_max: usize,
    /// Most rows one inspection query returns.
    pub inspect_rows_max: usize,
    /// Connections open at once; past it a connection is answered 503
    /// `node_overloaded` and closed.
    pub connections_max: usize,
    /// Time a request head may take: from the accept for a connection's
    /// first request, from the head's first byte for the next ones.
    pub header_read_timeout_ms: u64,
    /// Time a connection may stay open with no handler running and no byte
    /// read or written (between kept-alive requests, or a client that does
    /// not read its response).
    pub idle_timeout_ms: u64,
    /// Time a request body may take to arrive, plus one second per
    /// `body_read_bytes_per_s_min` bytes received (408 `body_timeout`).
    pub body_read_timeout_ms: u64,
    /// The slowest rate at which a body may arrive after its first
    /// `body_read_timeout_ms`; 0: the whole body within that time.
    pub body_read_bytes_per_s_min: u64,
    /// Time open connections get to finish when the node stops.
    pub shutdown_drain_ms: u64,
    /// Whether a request that names no durability is answered only once
    /// the bucket holds its write (`replicated`), as a cluster node does by
    /// default (ADR 0034); otherwise after the local commit.
    pub replicated_by_default: bool,
    /// Rules a test switched off (none, but in a `test-faults` build).
    pub unsafe_rules: UnsafeRules,
    /// Cluster mode: the node's lease state, checked before an actor request
    /// runs and before it is acknowledged. `None`: a single node, always
    /// acting.
    pub cluster: Option<Arc<ClusterState>>,
    /// One structured line per actor request (`wasmkeep::access`), also
    /// kept for `wasmkeep logs`.
    pub access_log: bool,
    /// Failed requests logged per second at most (the rest are counted
    /// and the next line says how many were left out).
    pub failed_request_log_per_s: u64,
    /// WebSockets one client address may hold on this node
    /// (`too_many_sockets` past it).
    pub sockets_per_client_max: usize,
    /// Test mode (`serve --test-clock`): the node's clock, which only
    /// `POST /admin/v1/test/clock` moves. `None`: the real clock.
    pub test_clock: Option<Arc<wasmkeep_runtime::ManualClock>>,
    /// The share (percent, 0 to 100) of actor requests without a
    /// `traceparent` that start a trace (ADR 0064); a sampled one is
    /// followed (`TRACES_FOLLOWED_PER_S_MAX`), an unsampled one never.
    pub trace_sample_pct: u8,
    /// Where spans are exported over OTLP/HTTP (`http://HOST:PORT`);
    /// `None`: kept in the node's ring only.
    pub otlp_endpoint: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            request_body_bytes_max: 32 * 1024 * 1024,
            admin_token: None,
            tenant_tokens: BTreeMap::new(),
            list_actors_max: 1000,
            inspect_rows_max: 1000,
            connections_max: 1024,
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            body_read_timeout_ms: 20_000,
            body_read_bytes_per_s_min: 16 * 1024,
            shutdown_drain_ms: 10_000,
            replicated_by_default: false,
            unsafe_rules: UnsafeRules::default(),
            cluster: None,
            test_clock: None,
            access_log: false,
            failed_request_log_per_s: 100,
            sockets_per_client_max: 1_000,
            trace_sample_pct: 0,
            otlp_endpoint: None,
        }
    }
}

/// Most connections `connections_max` may allow (a semaphore's permits are
/// counted in `u32` when the node drains them).
pub const CONNECTIONS_MAX_LIMIT: usize = 1_000_000;

/// Why a node cannot serve with a configuration, or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(
        "tenant_tokens are set but admin_token is not: a node shared by tenants needs its admin \
         API locked; set admin_token (--admin-token, WASMKEEP_ADMIN_TOKEN): tenants=`{0}`"
    )]
    TenantTokensWithoutAdminToken(String),
    #[error("invalid setting: `{name}` must be {rule}: value={value}")]
    InvalidSetting {
        name: &'static str,
        rule: &'static str,
        value: u64,
    },
    #[error(
        "invalid setting: `otlp_endpoint` must be an http:// address of an OTLP/HTTP collector \
         (the node speaks no TLS to it; run a local collector or agent): value=`{0}`"
    )]
    InvalidOtlpEndpoint(String),
    #[error("serve: {0}")]
    Io(#[from] std::io::Error),
}

impl ServerError {
    /// A stable code for the error.
    pub fn code(&self) -> &'static str {
        match self {
            ServerError::TenantTokensWithoutAdminToken(_) => "tenant_tokens_without_admin_token",
            ServerError::InvalidSetting { .. } | ServerError::InvalidOtlpEndpoint(_) => {
                "invalid_setting"
            }
            ServerError::Io(_) => "io",
        }
    }
}

impl ServerConfig {
    /// Refuses settings a node must not serve with: tenant tokens without an
    /// admin token, and limits that would refuse everything.
    pub fn check(&self) -> Result<(), ServerError> {
        if self.admin_token.is_none() && !self.tenant_tokens.is_empty() {
            let names: Vec<&str> = self.tenant_tokens.keys().map(String::as_str).collect();
            return Err(ServerError::TenantTokensWithoutAdminToken(names.join(",")));
        }
        let at_least_1 = [
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("shutdown_drain_ms", self.shutdown_drain_ms),
        ];
        for (name, value) in at_least_1 {
            if value == 0 {
                let rule = "at least 1";
                return Err(ServerError::InvalidSetting { name, rule, value });
            }
        }
        if !(1..=CONNECTIONS_MAX_LIMIT).contains(&self.connections_max) {
            return Err(ServerError::InvalidSetting {
                name: "connections_max",
                rule: "from 1 to 1000000",
                value: self.connections_max as u64,
            });
        }
        if self.trace_sample_pct > 100 {
            return Err(ServerError::InvalidSetting {
                name: "trace_sample_pct",
                rule: "from 0 to 100",
                value: u64::from(self.trace_sample_pct),
            });
        }
        if let Some(e) = &self.otlp_endpoint
            && !e.starts_with("http://")
        {
            return Err(ServerError::InvalidOtlpEndpoint(e.clone()));
        }
        Ok(())
    }
}

/// How long a request body may take, from the config.
#[derive(Debug, Clone, Copy)]
struct BodyPace {
    timeout_ms: u64,
    bytes_per_s_min: u64,
}

impl BodyPace {
    /// When a body of which `received` bytes arrived since `start` must be
    /// complete: the grace time, plus one second per `bytes_per_s_min`.
    fn deadline(&self, start: tokio::time::Instant, received: usize) -> tokio::time::Instant {
        let earned_ms = match self.bytes_per_s_min {
            0 => 0,
            rate => (received as u64).saturating_mul(1000) / rate,
        };
        start + std::time::Duration::from_millis(self.timeout_ms.saturating_add(earned_ms))
    }
}

/// What every route shares, behind one pointer: axum clones the state for
/// each request it routes, and a clone of this is one count, not one per
/// field (eleven counts up and down per request, on cache lines the two
/// tokio threads pass between them).
#[derive(Clone)]
struct AppState(Arc<NodeState>);

impl std::ops::Deref for AppState {
    type Target = NodeState;

    fn deref(&self) -> &NodeState {
        &self.0
    }
}

/// The node's runtime, settings and the server's own counters.
struct NodeState {
    rt: Runtime,
    config: Arc<ServerConfig>,
    tokens: Arc<Tokens>,
    /// Cuts failed-request lines in the node's log to
    /// `failed_request_log_per_s`.
    failure_rate: Arc<wasmkeep_runtime::logs::RateCut>,
    /// The same for failures no tenant vouches for (unauthenticated, no
    /// such class, no actor path): they never reach a tenant's lines.
    anon_failure_rate: Arc<wasmkeep_runtime::logs::RateCut>,
    /// Each tenant's requests in flight here (`shares`).
    in_flight: Arc<shares::TenantRequests>,
    /// Each client address's WebSockets here (`ws`).
    client_sockets: Arc<ws::ClientSockets>,
    /// Console sessions (`console`).
    console: Arc<console::Sessions>,
    /// The node's last hour of figures (`history`).
    history: Arc<history::History>,
    /// What the OTLP exporter counted, when spans are exported.
    exported: Option<Arc<crate::traces::ExportCounters>>,
    /// Client-asked traces this second (`traces`).
    trace_cap: Arc<crate::traces::FollowCap>,
}

impl NodeState {
    fn pace(&self) -> BodyPace {
        if self.config.unsafe_rules.no_body_pace {
            // The unsafe variant: a day for any body, however slow.
            return BodyPace {
                timeout_ms: 86_400_000,
                bytes_per_s_min: 0,
            };
        }
        BodyPace {
            timeout_ms: self.config.body_read_timeout_ms,
            bytes_per_s_min: self.config.body_read_bytes_per_s_min,
        }
    }
}

/// The node's routes.
pub fn router(rt: Runtime, config: ServerConfig) -> Router {
    let tokens = Tokens::new(config.admin_token.as_deref(), &config.tenant_tokens)
        .with_unsafe_rules(config.unsafe_rules);
    let in_flight = Arc::new(shares::TenantRequests::new(
        config.connections_max,
        rt.config().tenant_share_pct,
    ));
    let mut node = NodeState {
        in_flight,
        client_sockets: Arc::new(ws::ClientSockets::new(config.sockets_per_client_max)),
        rt,
        config: Arc::new(config),
        tokens: Arc::new(tokens),
        failure_rate: Arc::default(),
        anon_failure_rate: Arc::default(),
        console: Arc::default(),
        history: Arc::default(),
        exported: None,
        trace_cap: Arc::default(),
    };
    node.exported = start_export(&node);
    let state = AppState(Arc::new(node));
    inbound::install(&state);
    history::start(&state);
    rebalance::start(&state);
    state.rt.set_access_log(state.config.access_log);
    let admin = Router::new()
        .route("/apps", get(list_apps))
        .route("/apps/{tenant}/{app}", put(deploy).get(show_app))
        .route("/apps/{tenant}/{app}/versions", get(list_versions))
        .route("/apps/{tenant}/{app}/rollback", post(rollback))
        .route("/apps/{tenant}/{app}/replay", post(replay))
        .route("/apps/{tenant}/{app}/secrets", get(list_secrets))
        .route(
            "/apps/{tenant}/{app}/secrets/{name}",
            put(put_secret).delete(delete_secret),
        )
        .route("/actors/{tenant}/{app}/{class}", get(list_actors))
        .route(
            "/actors/{tenant}/{app}/{class}/{name}",
            get(show_actor).delete(delete_actor),
        )
        .route(
            "/actors/{tenant}/{app}/{class}/{name}/sql",
            post(inspect_sql),
        )
        .route(
            "/actors/{tenant}/{app}/{class}/{name}/database",
            put(restore_actor).get(export_actor),
        )
        .route(
            "/actors/{tenant}/{app}/{class}/{name}/alarm/run",
            post(run_alarm_now),
        )
        .route("/alarms/{tenant}", get(list_alarms))
        .route("/logs/{tenant}", get(logs::logs_route))
        .route("/logs/{tenant}/{app}", get(logs::logs_route))
        .route("/logs/{tenant}/{app}/{class}", get(logs::logs_route))
        .route("/logs/{tenant}/{app}/{class}/{name}", get(logs::logs_route))
        .route("/node", get(show_node))
        .route("/node/drain", post(drain::start).delete(drain::stop))
        .route("/node/take", post(rebalance::take))
        .route("/node/give", post(rebalance::give))
        .route("/node/history", get(history::history_route))
        .route("/console/logout", post(console::logout))
        .route("/traces", get(trace_routes::recent))
        .route("/traces/{trace_id}", get(trace_routes::one_trace))
        .route("/cluster", get(show_cluster))
        .route(
            "/test/clock",
            get(test_clock::show).post(test_clock::advance),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            admin_auth,
        ));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/v1/{*rest}", any(actor_request))
        .route("/console", get(console::page))
        .route("/console/", get(console::page))
        .route("/console/console.js", get(console::script))
        .route("/console/console.css", get(console::style))
        .route("/console/login", post(console::login))
        .route(
            &format!("{}/{{*rest}}", inbound::INBOUND_PREFIX),
            post(inbound::inbound_route),
        )
        .nest(ADMIN_PREFIX, admin)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// Starts the OTLP export of the node's spans when `otlp_endpoint` is set
/// and a tokio runtime runs the router (ADR 0064).
fn start_export(s: &NodeState) -> Option<Arc<crate::traces::ExportCounters>> {
    let endpoint = s.config.otlp_endpoint.as_deref()?;
    tokio::runtime::Handle::try_current().ok()?;
    let node = s
        .config
        .cluster
        .as_ref()
        .map_or_else(|| "single".to_owned(), |c| c.node().to_owned());
    match crate::traces::start_export(&s.rt, endpoint, &node) {
        Ok(counters) => Some(counters),
        Err(e) => {
            tracing::warn!(error = %e, "spans will not be exported");
            None
        }
    }
}

/// Serves the node's routes on `listener` until `shutdown` resolves, with
/// the connection cap and timeouts of `config` (see [`crate::edge`]).
pub async fn serve(
    rt: Runtime,
    config: ServerConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    config.check()?;
    let hub = Arc::clone(rt.logs());
    let app = router(rt, config.clone());
    let shutdown = logs::close_on(hub, shutdown);
    crate::edge::run(app, &config, listener, shutdown).await;
    Ok(())
}

/// Most routes one request gets in cluster mode (the first and the
/// re-routes after refusals or forwards that reached nobody).
const REROUTES_MAX: u32 = 8;
/// After this long since a request was first routed, its next answer or
/// failure is final.
const REROUTE_BUDGET_MS: u64 = 3_000;
/// The first pause before a re-route after a second refusal (doubling, at
/// most 200 ms).
const REROUTE_PAUSE_MS: u64 = 25;

/// Where the admin routes are nested.
const ADMIN_PREFIX: &str = "/admin/v1";

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "route_not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method",
    )
}

async fn admin_auth(
    State(s): State<AppState>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0);
    // An admin request about one actor that another node forwarded to its
    // owner: the admin token was checked there, so the node's signature
    // decides (over the body too, which is read here and handed on).
    if let Some(c) = &s.config.cluster
        && req.headers().contains_key(FORWARDED_HEADER)
    {
        let (parts, body) = req.into_parts();
        let named = match check_from_node(c, &parts, ADMIN_PREFIX) {
            Ok(named) => named,
            Err(e) => return e.into_response(),
        };
        // Signed by a node: the largest body an admin route takes (a
        // cluster's replay sends the candidate component).
        let limit = INSPECT_SQL_BYTES_MAX
            .max(RESTORE_BYTES_MAX)
            .max(s.rt.config().component_bytes_max + 1);
        let body = match read_body(body, limit, s.pace()).await {
            Ok(b) => b,
            Err(e) => return e.into_response(),
        };
        if let Err(e) = check_body_from_node(&body, &named) {
            return e.into_response();
        }
        return next.run(Request::from_parts(parts, Body::from(body))).await;
    }
    if let Err(e) = s.tokens.admin_gate(peer, req.headers()) {
        return e.into_response();
    }
    if !s.tokens.admin_ok(req.headers()) && !console_admits(&s, req.headers()) {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the admin API needs `Authorization: Bearer <admin token>`",
        )
        .into_response();
    }
    next.run(req).await
}

/// Whether a console page's request may use the admin API: its session's
/// cookie with the session's CSRF value (the cookie alone in the unsafe
/// variant `console_without_csrf`).
fn console_admits(s: &AppState, headers: &HeaderMap) -> bool {
    if s.config.admin_token.is_none() {
        return false;
    }
    if s.config.unsafe_rules.console_without_csrf {
        return s.console.admits_cookie_alone(headers);
    }
    s.console.admits(headers)
}

/// `Content-Type` of `/metrics`: the OpenMetrics text format.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `GET /metrics`: open to any client, like `/healthz`; the series that
/// name tenants (`wasmkeep_class_*`) only for a request the admin API would
/// take (the admin token, or loopback on a node without one).
async fn metrics(State(s): State<AppState>, req: Request) -> Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0);
    let admin =
        s.tokens.admin_gate(peer, req.headers()).is_ok() && s.tokens.admin_ok(req.headers());
    match exposition(s.rt.metrics(), s.config.cluster.as_deref(), admin) {
        Ok(text) => ([("content-type", METRICS_CONTENT_TYPE)], text).into_response(),
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("encoding metrics: {e}"),
        )
        .into_response(),
    }
}

/// The node's one OpenMetrics exposition: the runtime's series, then the
/// cluster's (in cluster mode), then the single `# EOF` that ends it.
pub(crate) fn exposition(
    runtime: &wasmkeep_runtime::metrics::Metrics,
    cluster: Option<&ClusterState>,
    with_classes: bool,
) -> Result<String, std::fmt::Error> {
    let mut text = String::new();
    runtime.encode(&mut text)?;
    if with_classes {
        runtime.encode_classes(&mut text)?;
    }
    if let Some(c) = cluster {
        c.encode_metrics(&mut text)?;
    }
    prometheus_client::encoding::text::encode_eof(&mut text)?;
    Ok(text)
}

/// `GET /admin/v1/node`: this node's cluster state (`cluster: null` for a
/// single node).
async fn show_node(State(s): State<AppState>) -> Response {
    let cluster = s.config.cluster.as_ref().map(|c| {
        let n = c.status();
        json!({
            "node": n.node,
            "address": n.address,
            "epoch": n.epoch,
            "acting": n.acting,
            // Acting, and done closing what an earlier epoch left open:
            // what a load balancer's health check should wait for.
            "serving": c.route_epoch().is_some() && !c.is_draining(),
            "acting_until_ms": n.acting_until_ms,
            "lease_counter": n.lease_counter,
            "renewals_total": n.renewals_total,
            "epochs_total": n.epochs_total,
            "lapsed_total": n.lapsed_total,
            "fenced_total": n.fenced_total,
            "held_actors": c.held_actors(),
            // `wasmkeep drain`: taking no actor, handing its own over.
            "moving_out": c.ownership.is_moving_out(),
        })
    });
    axum::Json(json!({ "cluster": cluster })).into_response()
}

/// This node's cluster state; 404 `not_a_cluster` on a single node.
fn cluster_of(s: &AppState) -> Result<&Arc<crate::cluster::ClusterState>, ApiError> {
    s.config.cluster.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_a_cluster",
            "this node is not in a cluster (start it with --bucket and --advertise)",
        )
    })
}

/// `GET /admin/v1/cluster`: the live nodes as the bucket shows them (see
/// `cluster::view`); 404 `not_a_cluster` on a single node, 503
/// `bucket_unavailable` when the bucket cannot be listed. `held_actors`:
/// how many actors each node holds, as each answers in `/admin/v1/node`
/// (the other nodes asked at once, each within `CLUSTER_ASK_TIMEOUT_MS`;
/// `null` for one that did not answer: holds are not counted in the
/// bucket).
async fn show_cluster(State(s): State<AppState>) -> Result<Response, ApiError> {
    let c = cluster_of(&s)?;
    let view = fanout::live(c).await?;
    let held: std::collections::HashMap<String, u64> =
        fanout::ask(c, &view, &format!("{ADMIN_PREFIX}/node"))
            .await
            .into_iter()
            .filter_map(|(node, body)| {
                let v = fanout::json_of(body)?;
                Some((node, v["cluster"]["held_actors"].as_u64()?))
            })
            .collect();
    let now = crate::cluster::now_ms();
    let protocol = &c.settings().protocol;
    let nodes: Vec<serde_json::Value> = view
        .live
        .iter()
        .map(|n| {
            let me = n.node == c.node();
            let count = match me {
                true => Some(c.held_actors() as u64),
                false => held.get(&n.node).copied(),
            };
            json!({
                "node": n.node,
                "address": n.address,
                "epoch": n.epoch,
                "lease_age_ms": n.lease_age_ms(now, protocol),
                "expires_in_ms": n.expires_in_ms(now),
                "held_actors": count,
                "self": me,
            })
        })
        .collect();
    Ok(axum::Json(json!({
        "node": c.node(),
        "nodes": nodes,
        "not_live": view.not_live,
        "unreadable": view.unreadable,
        "truncated": view.truncated,
    }))
    .into_response())
}

/// 503 `node_not_acting` unless the node's lease lets it act (always, for a
/// single node).
fn check_acting(s: &AppState) -> Result<(), ApiError> {
    match &s.config.cluster {
        Some(c) if !c.is_acting() => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "node_not_acting",
            "this node's cluster lease does not let it act now (registering, lapsed or \
             fenced); try again or another node",
        )),
        _ => Ok(()),
    }
}

/// Reads a request body of at most `limit` bytes, growing the buffer only
/// as bytes arrive (a `Content-Length` over the limit is refused before any
/// is read), and cut off with 408 `body_timeout` when it arrives slower
/// than `pace` allows.
async fn read_body(body: Body, limit: usize, pace: BodyPace) -> Result<Vec<u8>, ApiError> {
    read_body_within(body, limit, pace, None).await
}

/// [`read_body`] where a body over `limit` is 413 `body_too_large` with
/// `message`, which names the limit.
async fn read_body_named(
    body: Body,
    limit: usize,
    pace: BodyPace,
    message: impl FnOnce() -> String,
) -> Result<Vec<u8>, ApiError> {
    read_body(body, limit, pace).await.map_err(|e| {
        if e.code == "body_too_large" {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", message())
        } else {
            e
        }
    })
}

/// [`read_body`], each byte reserved in `hold` (a tenant's share of the
/// request bodies' pool) before the buffer grows to hold it: a body the
/// pool has no room for is refused (503, with its code), not read.
async fn read_body_within(
    body: Body,
    limit: usize,
    pace: BodyPace,
    mut hold: Option<&mut wasmkeep_runtime::pools::Hold>,
) -> Result<Vec<u8>, ApiError> {
    use axum::body::HttpBody;
    // The body is not read to its end: the connection closes after the
    // answer (and lingers, so that the client reads it: `edge`).
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("request body too large: limit request_body_bytes_max={limit}"),
        )
        .closing()
    };
    let mut body = body;
    let announced = body.size_hint().lower();
    if announced > limit as u64 {
        return Err(too_large());
    }
    // A body whose length is announced gets its whole buffer at once.
    let mut buf = Vec::new();
    if let Some(h) = hold.as_deref_mut()
        && announced > 0
    {
        h.grow(announced).map_err(pool_refused)?;
        buf.reserve_exact(announced as usize);
    }
    let start = tokio::time::Instant::now();
    loop {
        let deadline = pace.deadline(start, buf.len());
        let next = std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx));
        let frame = match tokio::time::timeout_at(deadline, next).await {
            Err(_) => return Err(body_timeout(pace, buf.len()).closing()),
            Ok(None) => return Ok(buf),
            Ok(Some(Err(e))) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_body",
                    format!("could not read the body: {e}"),
                )
                .closing());
            }
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if data.len() > limit - buf.len() {
                return Err(too_large());
            }
            if let Some(h) = hold.as_deref_mut() {
                // What the buffer will take, at its growth: counted before.
                let need = buf.len() + data.len();
                if need > buf.capacity() {
                    let capacity = need.max(buf.capacity() * 2).min(limit) as u64;
                    h.grow(capacity.saturating_sub(h.bytes()))
                        .map_err(pool_refused)?;
                    buf.reserve_exact(capacity as usize - buf.len());
                }
            }
            buf.extend_from_slice(&data);
        }
    }
}

/// A pool's refusal at the edge: 503 with its code and `Retry-After`; the
/// body is not read, so the connection closes after the answer.
fn pool_refused(e: wasmkeep_runtime::pools::PoolError) -> ApiError {
    let mut err = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.code(), e.to_string());
    err.retry_after_s = Some(1);
    err.closing()
}

fn body_timeout(pace: BodyPace, received: usize) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "body_timeout",
        format!(
            "request body too slow: limit body_read_timeout_ms={} plus 1 s per \
             body_read_bytes_per_s_min={} bytes: received={received}",
            pace.timeout_ms, pace.bytes_per_s_min
        ),
    )
}

/// Decodes one path segment strictly ([`wasmkeep_store::id::decode_name`]).
fn decode_segment(field: &'static str, raw: &str) -> Result<String, ApiError> {
    wasmkeep_store::id::decode_name(raw).map_err(|why| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_name",
            format!("invalid {field}: {why}"),
        )
    })
}

/// Splits `/v1/{tenant}/{app}/{class}/{name}/{rest}` of the raw path.
fn parse_actor_path(path: &str) -> Result<(ActorId, String), ApiError> {
    let rest = path.strip_prefix("/v1/").unwrap_or(path);
    let mut parts = rest.splitn(5, '/');
    let mut next = |field: &'static str| -> Result<String, ApiError> {
        match parts.next() {
            Some(p) if !p.is_empty() => decode_segment(field, p),
            _ => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "route_not_found",
                "actor routes are /v1/{tenant}/{app}/{class}/{name}/{path...}",
            )),
        }
    };
    let (tenant, app, class, name) = (next("tenant")?, next("app")?, next("class")?, next("name")?);
    let sub = format!("/{}", parts.next().unwrap_or(""));
    let id = ActorId::new(&tenant, &app, &class, &name)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_name", e.to_string()))?;
    Ok((id, sub))
}

/// The header (and query flag) by which a request asks to be answered only
/// once the bucket holds its commit.
pub const DURABILITY_HEADER: &str = "wasmkeep-durability";

/// A request's durability: `replicated` if a header or query flag says so,
/// `local` if one says that (and none `replicated`), otherwise the node's
/// default (`replicated_by_default`). The query flag is taken out of the
/// query the actor sees; the header stays among its headers.
fn durability(
    headers: &axum::http::HeaderMap,
    query: &str,
    replicated_by_default: bool,
) -> Result<(String, bool), ApiError> {
    let bad = |v: &str| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_durability",
            format!("{DURABILITY_HEADER} must be `local` or `replicated`, not `{v}`"),
        )
    };
    let parse = |v: &str| match v {
        "replicated" => Ok(true),
        "local" => Ok(false),
        other => Err(bad(other)),
    };
    let mut asked: Option<bool> = None;
    for v in headers.get_all(DURABILITY_HEADER) {
        let replicated = parse(v.to_str().map_err(|_| bad("(not text)"))?)?;
        asked = Some(asked.unwrap_or(false) | replicated);
    }
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((k, v)) if k == DURABILITY_HEADER => {
                asked = Some(asked.unwrap_or(false) | parse(v)?);
            }
            _ => kept.push(pair),
        }
    }
    Ok((kept.join("&"), asked.unwrap_or(replicated_by_default)))
}

/// An actor request, and the access and failure lines it calls for.
async fn actor_request(State(s): State<AppState>, mut req: Request) -> Response {
    let started = wasmkeep_runtime::clock::instant();
    let (method, uri) = (req.method().clone(), req.uri().clone());
    let traced = crate::traces::decide(
        req.headers(),
        s.config.trace_sample_pct,
        || trace_caller(&s, &req),
        &s.trace_cap,
    );
    if let Some(t) = traced {
        req.extensions_mut().insert(t);
    }
    let (mut resp, code, message) = match answer_actor_request(s.clone(), req).await {
        Ok(r) => (r, None, None),
        Err(e) => {
            let (code, message) = (e.code.clone(), e.message.clone());
            (e.into_response(), Some(code), Some(message))
        }
    };
    logs::record(
        &s,
        logs::Answered {
            method: method.as_str(),
            path: uri.path(),
            status: resp.status().as_u16(),
            version: resp
                .headers()
                .get(wasmkeep_runtime::actor::VERSION_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok()),
            started,
            code: code.as_deref(),
            message: message.as_deref(),
        },
    );
    // A request that only claimed to be a node's forward was refused
    // before anything ran: it leaves no span.
    if let Some(t) = traced
        && code.as_deref() != Some("node_signature_invalid")
    {
        trace_routes::record_request(&s, t, started, (&method, &uri), &mut resp, code);
    }
    resp
}

/// Who sent an actor request, for tracing: a client with the tenant's
/// token, a node forwarding (its signature is checked before the request
/// runs; a forged one is refused and traces nothing of the actor), or
/// someone refused.
fn trace_caller(s: &AppState, req: &Request) -> crate::traces::Caller {
    use crate::traces::Caller;
    if s.config.cluster.is_some() && req.headers().contains_key(FORWARDED_HEADER) {
        return Caller::Node;
    }
    match parse_actor_path(req.uri().path()) {
        Ok((id, _)) if s.tokens.tenant_ok(&id.tenant, req.headers()) => Caller::Client,
        _ => Caller::Refused,
    }
}

async fn answer_actor_request(s: AppState, req: Request) -> Result<Response, ApiError> {
    let (mut parts, body) = req.into_parts();
    if !s.config.unsafe_rules.actor_answer_unfiltered {
        console::strip_from_actor_request(&mut parts.headers);
    }
    // A WebSocket upgrade (ADR 0043): kept aside; the actor accepts it or
    // not, and the upgrade completes only once its event is durable.
    let ws = ws::Upgrade::from_parts(&mut parts);
    let (id, path) = parse_actor_path(parts.uri.path())?;
    let cluster = s.config.cluster.clone();
    // In cluster mode a request another node forwarded carries the hop
    // marker and the node's signature over it, body included; the tenant's
    // token was checked there, so the signature decides.
    let forwarded = cluster.is_some() && parts.headers.contains_key(FORWARDED_HEADER);
    let signed_body = match &cluster {
        Some(c) if forwarded => Some(check_from_node(c, &parts, "")?),
        _ if !s.tokens.tenant_ok(&id.tenant, &parts.headers) => {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                format!(
                    "tenant `{}` needs `Authorization: Bearer <tenant token>`",
                    id.tenant
                ),
            ));
        }
        _ => None,
    };
    // Nothing is read, counted or taken for a class this node cannot run.
    // In a cluster, one deployed through another node since this node's
    // last sync is looked up first (ADR 0058).
    if let Err(e) = s.rt.check_actor_class(&id) {
        let found = match &cluster {
            Some(c) => c.deploys.refresh(&s.rt, &id.tenant, &id.app).await,
            None => false,
        };
        if !found {
            return Err(e.into());
        }
        s.rt.check_actor_class(&id)?;
    }
    let _in_flight = s.in_flight.enter(&id.tenant)?;
    check_acting(&s)?;
    // A client's sockets count against its address (not a forwarding
    // node's: the first node counted them).
    let ws = match ws {
        Some(upgrade) if !forwarded => {
            let peer = parts
                .extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip());
            let client = peer.map(|ip| s.client_sockets.enter(ip)).transpose()?;
            Some((upgrade, client))
        }
        Some(upgrade) => Some((upgrade, None)),
        None => None,
    };
    if let (Some(c), Some(_)) = (&cluster, &ws) {
        // A WebSocket for an actor another node holds is relayed there:
        // this node opens one to the owner (one hop, with the cluster
        // secret), then upgrades the client and carries frames both ways
        // (ADR 0043).
        use crate::cluster::ownership::Route;
        if let Route::Forward { address, .. } = c
            .ownership
            .route(&id, || c.route_epoch(), forwarded)
            .await
            .map_err(route_error)?
        {
            let pq = path_and_query(&parts.uri, "");
            let upgrade = ws.expect("checked above");
            return sockets::relay(&s, c, &address, &pq, &parts.headers, upgrade, &id.tenant).await;
        }
    }
    // The body is read into the tenant's share of the node's pool, and
    // held there until the request's event is done with it.
    let mut hold =
        s.rt.pools()
            .request_bodies
            .reserve(&id.tenant, 0)
            .map_err(pool_refused)?;
    let limit = s.config.request_body_bytes_max;
    // The unsafe variant reads bodies outside the pool.
    let pooled = (!s.config.unsafe_rules.no_request_body_pool).then_some(&mut hold);
    let body = read_body_within(body, limit, s.pace(), pooled).await?;
    if let Some(named) = signed_body {
        check_body_from_node(&body, &named)?;
    }
    match cluster {
        Some(c) => {
            let pq = path_and_query(&parts.uri, "");
            // A forward to the owner names this node's `forward` span as
            // the owner's parent (ADR 0064).
            let forward = trace_routes::forward_begins(&mut parts);
            let run = |id, body| run_here(&s, id, path, &parts, body, ws);
            let out = clustered_request(&c, id, &pq, &parts, body, forwarded, run).await;
            if let Some(f) = forward {
                trace_routes::forward_ends(&s, &c, f, &out);
            }
            out
        }
        None => run_here(&s, id, path, &parts, body, ws).await,
    }
}

/// Refuses, before its body is read, a request that carries the forwarded
/// marker unless a node of this cluster signed it, for this very request
/// (`prefix` is where the router nested the route: the sender signed the
/// full path); returns the hash its body must have.
fn check_from_node(
    c: &ClusterState,
    parts: &axum::http::request::Parts,
    prefix: &str,
) -> Result<crate::cluster::sign::BodyHash, ApiError> {
    let pq = path_and_query(&parts.uri, prefix);
    c.verify_from_node(parts.method.as_str(), &pq, &parts.headers)
        .map_err(node_signature_invalid)
}

/// Refuses a signed request whose body is not the one its signature named.
fn check_body_from_node(
    body: &[u8],
    named: &crate::cluster::sign::BodyHash,
) -> Result<(), ApiError> {
    if crate::cluster::sign::body_matches(body, named) {
        Ok(())
    } else {
        Err(node_signature_invalid(
            crate::cluster::sign::SignError::Mismatch,
        ))
    }
}

fn node_signature_invalid(e: crate::cluster::sign::SignError) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "node_signature_invalid",
        format!("only the nodes of this cluster may send this: {e}"),
    )
}

/// Cluster mode: runs the request here (`run`) if this node holds the actor
/// (taking it if it has no live owner), or forwards it to the owner (one
/// hop); a forward that did not reach the owner, or that the owner refused
/// as not its own, drops the cached owner and routes again, within
/// [`REROUTES_MAX`] and [`REROUTE_BUDGET_MS`]. Actor requests and the admin
/// routes about one actor both go this way.
async fn clustered_request<F, Fut>(
    c: &Arc<ClusterState>,
    id: ActorId,
    path_and_query: &str,
    parts: &axum::http::request::Parts,
    body: Vec<u8>,
    forwarded: bool,
    run: F,
) -> Result<Response, ApiError>
where
    F: FnOnce(ActorId, Vec<u8>) -> Fut,
    Fut: std::future::Future<Output = Result<Response, ApiError>>,
{
    use crate::cluster::forward::ForwardError;
    use crate::cluster::ownership::Route;
    let Some(_in_flight) = c.enter() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "node_not_acting",
            "this node is stopping and hands its actors over; try again or another node",
        ));
    };
    // Not taken: the node moving it for a class migration needs its hold.
    c.refuse_if_class_closed(&id)?;
    let counters = &c.ownership.counters;
    // A refusal (the owner is stopping or no longer owns the actor) or a
    // forward that reached nobody did not run the request: it is routed
    // again, after a pause that doubles, within a bound in attempts and
    // time (a stopping owner releases its actors within about a second).
    let started = wasmkeep_runtime::clock::instant();
    let mut pause = std::time::Duration::from_millis(REROUTE_PAUSE_MS);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let last = attempt >= REROUTES_MAX
            || started.elapsed() >= std::time::Duration::from_millis(REROUTE_BUDGET_MS);
        let route = c
            .ownership
            .route(&id, || c.route_epoch(), forwarded)
            .await
            .map_err(route_error)?;
        let (node, address) = match route {
            Route::Local(in_use) => {
                // A node that stops acting answers at once what it would
                // answer after the run: a request waiting on a bucket that
                // no longer answers is not held until that call times out.
                let mut out = tokio::select! {
                    out = run(id, body) => out?,
                    () = c.stopped_acting_in(in_use.epoch()) => return Err(lease_lapsed()),
                };
                if c.acting_epoch() != Some(in_use.epoch()) {
                    // The lease lapsed while the request ran (and maybe
                    // another node took the actor): not acknowledged, even
                    // if the node acts again in a new epoch now.
                    return Err(lease_lapsed());
                }
                if let Ok(v) = HeaderValue::from_str(c.node()) {
                    out.headers_mut().insert(NODE_HEADER, v);
                }
                return Ok(out);
            }
            Route::Forward { node, address } => (node, address),
        };
        counters.forwards_total.inc();
        let sent = c
            .forwarder
            .forward(
                &address,
                &parts.method,
                path_and_query,
                &parts.headers,
                body.clone(),
                c.settings(),
            )
            .await;
        let failed = |code: &'static str, status: StatusCode, why: String| {
            counters.forward_failures_total.inc();
            c.ownership.forget_owner(&id, &node);
            ApiError::new(
                status,
                code,
                format!(
                    "forwarding to the actor's owner failed: {why}: owner={node} address={address}"
                ),
            )
        };
        match sent {
            Ok(resp) if !last && refused_as_not_owner(&resp) => {
                failed(
                    "forward_failed",
                    StatusCode::BAD_GATEWAY,
                    "not the owner".into(),
                );
                // Not at once: the owner that refused is handing over.
                if attempt > 1 {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_millis(200));
                }
            }
            Ok(resp) => {
                // Only the owner's own answer names it (a refusal does not).
                if resp.headers().get(NODE_HEADER).map(|v| v.as_bytes()) == Some(node.as_bytes()) {
                    c.ownership.confirm_owner(&id, &node);
                }
                return Ok(relay(resp));
            }
            Err(ForwardError::NotSent(why)) if !last => {
                tracing::debug!(actor = %id, node, why, "forward did not reach the owner; routing again");
                failed("forward_failed", StatusCode::BAD_GATEWAY, why);
            }
            Err(ForwardError::NotSent(why) | ForwardError::Failed(why)) => {
                return Err(failed("forward_failed", StatusCode::BAD_GATEWAY, why));
            }
            Err(ForwardError::Timeout) => {
                let why = format!(
                    "no answer within cluster_forward_timeout_ms={}",
                    c.settings().forward_timeout_ms
                );
                return Err(failed("forward_timeout", StatusCode::GATEWAY_TIMEOUT, why));
            }
        }
    }
}

/// The answer to a request that ran while the node's lease lapsed: not
/// acknowledged, and not a refusal either (its effects may stand), so a
/// forwarding node relays it rather than route the request again.
fn lease_lapsed() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "lease_lapsed",
        "this node's cluster lease lapsed while the request ran: it is not acknowledged, and \
         its effects may stand, as after a lost response",
    )
}

/// Whether an owner's answer says the request did not run there because it
/// is not (or no longer) the owner, or does not act: worth routing again.
/// Only the node's own refusals count: whatever an actor answered carries
/// the node header (set over any the actor set), a refusal does not.
fn refused_as_not_owner(resp: &axum::http::Response<bytes::Bytes>) -> bool {
    if resp.status() != StatusCode::SERVICE_UNAVAILABLE || resp.headers().contains_key(NODE_HEADER)
    {
        return false;
    }
    let code = serde_json::from_slice::<serde_json::Value>(resp.body())
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
    matches!(code.as_deref(), Some("not_owner" | "node_not_acting"))
}

/// The owner's answer, as this node's: status, headers (but those that
/// frame the message, which this node sets) and body.
fn relay(resp: axum::http::Response<bytes::Bytes>) -> Response {
    let (parts, body) = resp.into_parts();
    let mut out = Response::new(Body::from(body));
    *out.status_mut() = parts.status;
    let h = out.headers_mut();
    for (k, v) in parts.headers.iter() {
        if !is_framing_header(k) {
            h.append(k.clone(), v.clone());
        }
    }
    out
}

fn route_error(e: crate::cluster::ownership::RouteError) -> ApiError {
    use crate::cluster::ownership::RouteError as E;
    let unavailable = StatusCode::SERVICE_UNAVAILABLE;
    match e {
        E::NotActing => ApiError::new(
            unavailable,
            "node_not_acting",
            "this node's cluster lease does not let it act now; try again or another node",
        ),
        E::NotOwner { owner } => ApiError::new(
            unavailable,
            "not_owner",
            format!(
                "a forwarded request reached a node that does not own the actor (owner: {}); \
                 a forwarded request is never forwarded again",
                owner.as_deref().unwrap_or("unknown")
            ),
        ),
        E::TakeFailed(why) => ApiError::new(
            unavailable,
            "take_failed",
            format!("could not take the actor for this node; try again: {why}"),
        ),
        E::Name(why) => ApiError::new(StatusCode::BAD_REQUEST, "invalid_name", why),
        E::Full { limit } => ApiError::new(
            unavailable,
            "cluster_actors_full",
            format!("this node tracks too many actors in use: limit cluster_actors_max={limit}"),
        ),
    }
}

/// Runs the request on this node's runtime.
async fn run_here(
    s: &AppState,
    id: ActorId,
    path: String,
    parts: &axum::http::request::Parts,
    body: Vec<u8>,
    ws: Option<(ws::Upgrade, Option<ws::ClientSocket>)>,
) -> Result<Response, ApiError> {
    let clustered = s.config.cluster.is_some();
    let traced = parts.extensions.get::<crate::traces::Traced>().copied();
    let mut headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .filter(|(k, _)| *k != axum::http::header::AUTHORIZATION)
        // A traced request's actor sees its own request span as the parent
        // of what it calls; an untraced one's, what the caller sent.
        .filter(|(k, _)| traced.is_none() || k.as_str() != "traceparent")
        .filter(|(k, _)| {
            !clustered
                || (*k != CLUSTER_TOKEN_HEADER && *k != crate::cluster::sign::SIGNATURE_HEADER)
        })
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    if let Some(t) = traced {
        headers.push(("traceparent".to_owned(), t.server.header()));
    }
    let (query, replicated) = durability(
        &parts.headers,
        parts.uri.query().unwrap_or(""),
        s.config.replicated_by_default,
    )?;
    let request = ActorRequest {
        method: parts.method.as_str().to_owned(),
        path,
        query,
        headers,
        body,
        replicated,
        trace: traced.map(|t| wasmkeep_runtime::trace::EventTrace::new(t.server)),
    };
    let resp = s.rt.request(id.clone(), request).await?;
    if let Some(socket) = resp.socket {
        return Ok(sockets::upgrade(s, id, socket, ws));
    }
    // The lease may have ended while the request ran: then it is not
    // acknowledged (its effects may stand, as after a lost response).
    if let Some(c) = &s.config.cluster
        && !c.is_acting()
    {
        return Err(lease_lapsed());
    }
    let status = StatusCode::from_u16(resp.status)
        .ok()
        .filter(|s| !s.is_informational())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "invalid_response",
                format!("the actor answered an invalid status: {}", resp.status),
            )
        })?;
    let mut out = Response::new(Body::from(resp.body));
    *out.status_mut() = status;
    let h = out.headers_mut();
    for (k, v) in resp.headers {
        match (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(&v),
        ) {
            (Ok(k), _) if is_framing_header(&k) && !s.config.unsafe_rules.keep_framing_headers => {
                tracing::debug!(actor = %id, header = %k, "dropped a framing header an actor set");
            }
            (Ok(k), Ok(v)) => {
                h.append(k, v);
            }
            _ => tracing::warn!(actor = %id, header = %k, "dropped an invalid response header"),
        }
    }
    if !s.config.unsafe_rules.actor_answer_unfiltered {
        console::strip_from_actor_answer(h);
    }
    Ok(out)
}

/// Headers that frame the HTTP message or the connection: the node sets
/// them, never an actor. A guest's own `content-length` would otherwise
/// let it end its response early and write what the client reads as the
/// answer to its next request on the connection (which, behind a proxy
/// that reuses connections, may be another tenant's).
fn is_framing_header(name: &HeaderName) -> bool {
    use axum::http::header;
    [
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
        header::UPGRADE,
        header::TE,
        header::TRAILER,
    ]
    .contains(name)
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

fn segment(field: &'static str, v: &str) -> Result<(), ApiError> {
    wasmkeep_runtime::ActorId::new(
        if field == "tenant" { v } else { "t" },
        if field == "app" { v } else { "a" },
        if field == "class" { v } else { "c" },
        "n",
    )
    .map(|_| ())
    .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_name", e.to_string()))
}

#[derive(Deserialize)]
struct DeployQuery {
    manifest: Option<String>,
    /// The share of actors that run the new version (ADR 0059).
    percent: Option<String>,
    /// `immediate` (the default) or `deferred`.
    mode: Option<String>,
    /// Replay each sampled actor's last N recorded events against the
    /// candidate first, and refuse it if it differs (ADR 0062).
    replay: Option<usize>,
    /// Actors the replay samples (default [`DEPLOY_REPLAY_SAMPLE`]).
    sample: Option<usize>,
    /// Differences that do not refuse the deploy: `response`,
    /// `table:NAME`, `tables`, `not_reproduced`, `nothing_replayed`,
    /// `incomplete`, comma-separated.
    expect: Option<String>,
}

/// Actors a deploy's replay samples unless told.
const DEPLOY_REPLAY_SAMPLE: usize = 10;

impl DeployQuery {
    /// `(percent, deferred)`, or a clear refusal naming the field.
    fn rollout(&self) -> Result<(u8, bool), ApiError> {
        let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", m);
        let percent = match self.percent.as_deref() {
            None => 100,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| (1..=100).contains(p))
                .ok_or_else(|| {
                    bad(format!(
                        "percent: `{p}` is not a whole number from 1 to 100"
                    ))
                })?,
        };
        let deferred = match self.mode.as_deref() {
            None | Some("immediate") => false,
            Some("deferred") => true,
            Some(m) => return Err(bad(format!("mode: `{m}` is not `immediate` or `deferred`"))),
        };
        Ok((percent, deferred))
    }
}

async fn deploy(
    State(s): State<AppState>,
    axum::extract::Path((tenant, app)): axum::extract::Path<(String, String)>,
    Query(q): Query<DeployQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    segment("tenant", &tenant)?;
    segment("app", &app)?;
    // One byte over the limit is read, so that the runtime names the limit.
    let limit = s.rt.config().component_bytes_max;
    let wasm = read_body(body, limit + 1, s.pace()).await.map_err(|e| {
        if e.code == "body_too_large" {
            ApiError::from(wasmkeep_runtime::RuntimeError::ComponentTooLarge {
                size: limit + 1,
                limit,
            })
        } else {
            e
        }
    })?;
    let (percent, deferred) = q.rollout()?;
    let rt = s.rt.clone();
    let manifest = q.manifest.unwrap_or_default();
    let by = deployed_by(&headers);
    if let Some(n) = q.replay {
        let sample = q.sample.unwrap_or(DEPLOY_REPLAY_SAMPLE);
        if sample == 0 || sample > wasmkeep_runtime::replay::REPLAY_ACTORS_MAX {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!(
                    "sample: {sample} actors, must be 1 to replay_actors_max={}",
                    wasmkeep_runtime::replay::REPLAY_ACTORS_MAX
                ),
            ));
        }
        let opts = wasmkeep_runtime::replay::ReplayOptions {
            last: Some(n.max(1)),
            sample,
            manifest: Some(manifest.clone()),
            ..Default::default()
        };
        // In a cluster every live node replays the actors it has.
        let query = format!(
            "last={}&sample={}&manifest={}",
            n.max(1),
            opts.sample,
            percent_encoding::utf8_percent_encode(&manifest, percent_encoding::NON_ALPHANUMERIC)
        );
        let report = replay_everywhere(&s, (&tenant, &app), wasm.clone(), opts, &query).await?;
        check_replay(&report, q.expect.as_deref().unwrap_or(""))?;
    }
    // In a cluster the version is recorded in the bucket, for every node
    // (ADR 0058); on a single node, in the data folder.
    if let Some(c) = &s.config.cluster {
        let d = crate::cluster::deploys::NewDeploy {
            tenant,
            app,
            wasm: wasm.to_vec(),
            manifest,
            by,
            rollback_of: None,
            percent,
            deferred,
        };
        let deployed = c.deploys.deploy(&rt, d).await?;
        return Ok(deployed_answer(deployed));
    }
    let deployed = blocking(move || {
        let prepared = rt.prepare(&tenant, &app, &wasm, &manifest)?;
        let options = wasmkeep_runtime::DeployOptions {
            percent,
            deferred,
            ..wasmkeep_runtime::DeployOptions::whole(&by)
        };
        rt.install(prepared, &options)
    })
    .await?;
    Ok(deployed_answer(deployed))
}

/// Refuses a deploy whose replay found a difference not expected:
/// `replay_differs` (409), naming the kinds and how to see them.
fn check_replay(
    report: &wasmkeep_runtime::replay::ReplayReport,
    expect: &str,
) -> Result<(), ApiError> {
    let expected: Vec<&str> = expect
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    let allowed = |kind: &str| {
        expected.iter().any(|e| {
            *e == kind
                || (*e == "tables" && kind.starts_with("table "))
                || e.strip_prefix("table:")
                    .is_some_and(|t| kind == format!("table {t}"))
        })
    };
    let mut unexpected: Vec<String> = report
        .difference_kinds()
        .into_iter()
        .filter(|k| !allowed(k))
        .collect();
    if report.actors_not_reproduced > 0 && !allowed("not_reproduced") {
        unexpected.push("not_reproduced".into());
    }
    // A gate that checked nothing, or not everything, does not pass.
    if report.events_replayed == 0 && !allowed("nothing_replayed") {
        unexpected.push("nothing_replayed".into());
    }
    if report.incomplete() > 0 && !allowed("incomplete") {
        unexpected.push("incomplete".into());
    }
    // A cluster node that gave no replay: none of its actors was checked.
    if !report.nodes_not_replayed.is_empty() && !allowed("nodes_not_replayed") {
        unexpected.push("nodes_not_replayed".into());
    }
    if unexpected.is_empty() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "replay_differs",
        format!(
            "the candidate differed from production on {} of {} replayed events ({} actors not reproduced, {} not replayed to the end); unexpected: {}. See them with `wasmkeep replay {}/{} --with FILE`, or deploy with --expect {}",
            report.events_differing,
            report.events_replayed,
            report.actors_not_reproduced,
            report.incomplete(),
            unexpected.join(", "),
            report.tenant,
            report.app,
            unexpected
                .iter()
                .map(|k| k.replace("table ", "table:"))
                .collect::<Vec<_>>()
                .join(",")
        ),
    ))
}

#[derive(Deserialize)]
struct ReplayQuery {
    class: Option<String>,
    name: Option<String>,
    /// A recorded sequence number, or a time (Unix ms, or RFC 3339).
    from: Option<String>,
    last: Option<usize>,
    sample: Option<usize>,
    manifest: Option<String>,
    /// This node's actors only (what a cluster's replay asks each node).
    #[serde(default)]
    node_only: bool,
}

/// How long a cluster's replay waits for each other node: a replay's own
/// bound, and a minute for the candidate's compile and the transfers.
const REPLAY_ASK_TIMEOUT_MS: u64 = wasmkeep_runtime::replay::REPLAY_TIME_MS_MAX + 60_000;
/// Largest replay report a cluster's replay takes from another node (a
/// difference quotes both answers and rows in full).
const REPLAY_REPORT_BYTES_MAX: usize = 256 << 20;

/// The query a cluster's replay sends the other nodes: the client's
/// (its `node_only`, under any spelling, left out) with `node_only=true`.
fn node_only_query(raw: &str) -> String {
    let mut kept: Vec<&str> = raw
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| {
            let key = p.split('=').next().unwrap_or("");
            percent_encoding::percent_decode_str(&key.replace('+', " ")).decode_utf8_lossy()
                != "node_only"
        })
        .collect();
    kept.push("node_only=true");
    kept.join("&")
}

/// Replays on this node and, on a cluster node, on every other live node
/// at once (each sent the candidate and `query` with `node_only=true`),
/// merging what they found (ADR 0062): each actor names the node that
/// replayed it, and a node without an answer is listed as not replayed.
/// Then the chosen actors no node had a base copy of are replayed here
/// from the bucket's history (`replay_bucket`).
async fn replay_everywhere(
    s: &AppState,
    (tenant, app): (&str, &str),
    wasm: Vec<u8>,
    opts: wasmkeep_runtime::replay::ReplayOptions,
    query: &str,
) -> Result<wasmkeep_runtime::replay::ReplayReport, ApiError> {
    use wasmkeep_runtime::replay::{NodeNotReplayed, ReplayReport};
    let rt = s.rt.clone();
    let (t, a, w, o) = (
        tenant.to_owned(),
        app.to_owned(),
        wasm.clone(),
        opts.clone(),
    );
    let mine = blocking(move || rt.replay(&t, &a, &w, &o));
    let Some(c) = &s.config.cluster else {
        return mine.await;
    };
    let view = fanout::live(c).await?;
    let path = format!(
        "{ADMIN_PREFIX}/apps/{tenant}/{app}/replay?{}",
        node_only_query(query)
    );
    let request = (&axum::http::Method::POST, path.as_str(), wasm.clone());
    let bounds = (REPLAY_ASK_TIMEOUT_MS, REPLAY_REPORT_BYTES_MAX);
    let theirs = fanout::ask_with(c, &view, request, bounds);
    tokio::pin!(mine, theirs);
    // A replay that fails here (busy, a bad candidate) stops asking the
    // others.
    let (mut report, theirs) = tokio::select! {
        m = &mut mine => (m?, theirs.await),
        t = &mut theirs => (mine.await?, t),
    };
    for a in &mut report.actors {
        a.node = Some(c.node().to_owned());
    }
    for (node, answer) in theirs {
        let parsed = match answer {
            Ok((status, body)) if status.is_success() => {
                serde_json::from_slice::<ReplayReport>(&body).map_err(|e| e.to_string())
            }
            Ok((status, body)) => {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                Err(format!(
                    "{} {}",
                    status.as_u16(),
                    v["error"]["code"].as_str().unwrap_or("(no error code)")
                ))
            }
            Err(why) => Err(why),
        };
        match parsed {
            Ok(mut r) => {
                for a in &mut r.actors {
                    a.node = Some(node.clone());
                }
                report.merge(r);
            }
            Err(why) => report
                .nodes_not_replayed
                .push(NodeNotReplayed { node, why }),
        }
    }
    // Then what no node has a base copy of, from the bucket's history.
    replay_bucket::replay_from_bucket(s, c, (tenant, app), wasm, opts, &mut report).await;
    Ok(report)
}

/// `POST /admin/v1/apps/{tenant}/{app}/replay` with a component as the
/// body: replays recorded events of the app's actors against it (ADR
/// 0062), on every live node of a cluster (unless `node_only=true`), and
/// answers what differed.
async fn replay(
    State(s): State<AppState>,
    axum::extract::Path((tenant, app)): axum::extract::Path<(String, String)>,
    Query(q): Query<ReplayQuery>,
    axum::extract::RawQuery(raw): axum::extract::RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    segment("tenant", &tenant)?;
    segment("app", &app)?;
    let limit = s.rt.config().component_bytes_max;
    let wasm = read_body(body, limit + 1, s.pace()).await?;
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, "bad_request", m);
    if q.name.is_some() && q.class.is_none() {
        return Err(bad("name: an actor's name needs its class".into()));
    }
    let (mut from_seq, mut from_ms) = (None, None);
    if let Some(f) = q.from.as_deref() {
        if let Ok(seq) = f.parse::<u64>() {
            // Sequence numbers are small; times in ms are past 2001.
            if seq < 1_000_000_000_000 {
                from_seq = Some(seq);
            } else {
                from_ms = Some(seq);
            }
        } else {
            let t = chrono::DateTime::parse_from_rfc3339(f).map_err(|_| {
                bad(format!(
                    "from: `{f}` is not a sequence number, Unix ms or an RFC 3339 time"
                ))
            })?;
            from_ms = Some(t.timestamp_millis().max(0) as u64);
        }
    }
    let sample = q
        .sample
        .unwrap_or(wasmkeep_runtime::replay::REPLAY_ACTORS_MAX);
    if sample == 0 || sample > wasmkeep_runtime::replay::REPLAY_ACTORS_MAX {
        return Err(bad(format!(
            "sample: {sample} actors, must be 1 to replay_actors_max={}",
            wasmkeep_runtime::replay::REPLAY_ACTORS_MAX
        )));
    }
    let opts = wasmkeep_runtime::replay::ReplayOptions {
        class: q.class,
        name: q.name,
        from_seq,
        from_ms,
        last: q.last,
        sample,
        manifest: q.manifest,
    };
    // Another node's request (a cluster's replay) never fans out again.
    if q.node_only || headers.contains_key(FORWARDED_HEADER) {
        let rt = s.rt.clone();
        let report = blocking(move || rt.replay(&tenant, &app, &wasm, &opts)).await?;
        return Ok(axum::Json(report).into_response());
    }
    let query = raw.unwrap_or_default();
    let report = replay_everywhere(&s, (&tenant, &app), wasm, opts, &query).await?;
    Ok(axum::Json(report).into_response())
}

/// Longest `wasmkeep-deployed-by` kept with a version.
const DEPLOYED_BY_BYTES_MAX: usize = 128;

/// Who the client says deployed (`wasmkeep-deployed-by`, which `wasmkeep
/// deploy` sets to `$USER@host`): printable ASCII, at most
/// [`DEPLOYED_BY_BYTES_MAX`] bytes, else left out.
fn deployed_by(headers: &HeaderMap) -> String {
    headers
        .get("wasmkeep-deployed-by")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            v.len() <= DEPLOYED_BY_BYTES_MAX && v.bytes().all(|b| (b' '..=b'~').contains(&b))
        })
        .unwrap_or_default()
        .to_owned()
}

/// A deploy's or rollback's answer: the app as deployed, with its version.
fn deployed_answer(
    (info, version): (wasmkeep_runtime::AppInfo, wasmkeep_runtime::AppVersion),
) -> Response {
    let mut v = serde_json::to_value(&info).unwrap_or_default();
    v["version"] = json!(version.version);
    if let Some(of) = version.rollback_of {
        v["rollback_of"] = json!(of);
    }
    v["percent"] = json!(version.percent);
    if version.deferred {
        v["mode"] = json!("deferred");
    }
    (StatusCode::OK, axum::Json(v)).into_response()
}

/// `GET /admin/v1/apps/{tenant}/{app}/versions`: the kept versions, oldest
/// first.
async fn list_versions(
    State(s): State<AppState>,
    axum::extract::Path((tenant, app)): axum::extract::Path<(String, String)>,
) -> Result<Response, ApiError> {
    let versions = match &s.config.cluster {
        Some(c) => c.deploys.versions(&tenant, &app).await?,
        None => s.rt.versions(&tenant, &app)?,
    };
    Ok(axum::Json(json!({ "versions": versions })).into_response())
}

#[derive(Deserialize)]
struct RollbackQuery {
    to: Option<u64>,
}

/// `POST /admin/v1/apps/{tenant}/{app}/rollback[?to=N]`: deploys a kept
/// version again (the one before the current without `to`).
async fn rollback(
    State(s): State<AppState>,
    axum::extract::Path((tenant, app)): axum::extract::Path<(String, String)>,
    Query(q): Query<RollbackQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let rt = s.rt.clone();
    let by = deployed_by(&headers);
    if let Some(c) = &s.config.cluster {
        let deployed = c.deploys.rollback(&rt, &tenant, &app, q.to, by).await?;
        return Ok(deployed_answer(deployed));
    }
    let deployed = blocking(move || rt.rollback(&tenant, &app, q.to, &by)).await?;
    Ok(deployed_answer(deployed))
}

async fn list_apps(State(s): State<AppState>) -> Response {
    axum::Json(json!({ "apps": s.rt.apps() })).into_response()
}

async fn show_app(
    State(s): State<AppState>,
    axum::extract::Path((tenant, app)): axum::extract::Path<(String, String)>,
) -> Result<Response, ApiError> {
    match s.rt.app(&tenant, &app) {
        Some(info) => {
            let mut v = serde_json::to_value(&info).unwrap_or_default();
            if let Some((candidate, percent)) = s.rt.rollout(&tenant, &app) {
                v["rollout"] = json!({
                    "version": candidate.version,
                    "hash": candidate.hash,
                    "percent": percent,
                });
            }
            Ok(axum::Json(v).into_response())
        }
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "app_not_found",
            format!("app not found: {tenant}/{app}"),
        )),
    }
}

/// `GET /admin/v1/apps/{tenant}/{app}/secrets`: the names of an app's
/// secrets on this node, never their values (ADR 0041).
async fn list_secrets(
    State(s): State<AppState>,
    axum::extract::Path((tenant, app)): axum::extract::Path<(String, String)>,
) -> Result<Response, ApiError> {
    let names = s.rt.secrets().names(&tenant, &app)?;
    Ok(axum::Json(json!({ "tenant": tenant, "app": app, "names": names })).into_response())
}

/// `PUT /admin/v1/apps/{tenant}/{app}/secrets/{name}` with the value as
/// the body (UTF-8): sets the secret on this node.
async fn put_secret(
    State(s): State<AppState>,
    axum::extract::Path((tenant, app, name)): axum::extract::Path<(String, String, String)>,
    body: Body,
) -> Result<Response, ApiError> {
    let limit = wasmkeep_runtime::app_config::CONFIG_VALUE_BYTES_MAX + 1;
    let value = read_body(body, limit, s.pace()).await?;
    let value = String::from_utf8(value).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_config",
            "a secret's value must be UTF-8",
        )
    })?;
    let rt = s.rt.clone();
    blocking(move || rt.secrets().set(&tenant, &app, &name, &value)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `DELETE /admin/v1/apps/{tenant}/{app}/secrets/{name}`.
async fn delete_secret(
    State(s): State<AppState>,
    axum::extract::Path((tenant, app, name)): axum::extract::Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let rt = s.rt.clone();
    let existed = blocking(move || rt.secrets().delete(&tenant, &app, &name)).await?;
    Ok(axum::Json(json!({ "deleted": existed })).into_response())
}

#[derive(Deserialize)]
struct ListQuery {
    after: Option<String>,
    limit: Option<usize>,
    /// Names that start with this.
    prefix: Option<String>,
    /// The whole cluster's actors, from the bucket (issue 39), rather than
    /// this node's.
    #[serde(default)]
    all: bool,
    /// The number of actors (with `all`, at most `COUNT_ACTORS_MAX`) instead
    /// of a page of them.
    #[serde(default)]
    count: bool,
}

/// Most actors `?count=true&all=true` counts: each costs the bucket two or
/// three listings (see `wasmkeep_replica::listing`).
pub const COUNT_ACTORS_MAX: usize = 10_000;
/// Most pages of 1,000 a count reads (each looks at up to 4,000 folders,
/// deleted actors' included).
pub const COUNT_PAGES_MAX: usize = 40;

/// A name (or part of one) a listing is given, within `NAME_BYTES_MAX`.
fn name_within_bound(field: &str, value: &str) -> Result<(), ApiError> {
    let max = wasmkeep_store::id::NAME_BYTES_MAX;
    if value.len() > max {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_name",
            format!("{field}: longer than NAME_BYTES_MAX={max}"),
        ));
    }
    Ok(())
}

/// `GET /admin/v1/actors/{tenant}/{app}/{class}[?after=&limit=&prefix=&all=&count=]`:
/// a page of the class's actors (or their number) on this node, or with
/// `all=true` in a cluster, in the bucket: every node's.
async fn list_actors(
    State(s): State<AppState>,
    axum::extract::Path((tenant, app, class)): axum::extract::Path<(String, String, String)>,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let limit = q
        .limit
        .unwrap_or(LIST_ACTORS_DEFAULT)
        .clamp(1, s.config.list_actors_max);
    s.rt.check_class(&tenant, &app, &class)?;
    let prefix = q.prefix.unwrap_or_default();
    name_within_bound("prefix", &prefix)?;
    name_within_bound("after", q.after.as_deref().unwrap_or(""))?;
    let cluster = s.config.cluster.clone().filter(|_| q.all);
    let source = if cluster.is_some() { "bucket" } else { "node" };
    let page = |after: Option<String>, limit: usize| {
        let (rt, cluster, prefix) = (s.rt.clone(), cluster.clone(), prefix.clone());
        let (tenant, app, class) = (tenant.clone(), app.clone(), class.clone());
        async move {
            match cluster {
                Some(c) => wasmkeep_replica::listing::class_page(
                    c.bucket(),
                    &rt.config().replica,
                    (&tenant, &app, &class),
                    &prefix,
                    after.as_deref(),
                    limit,
                )
                .await
                .map_err(|e| {
                    let mut e = ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "bucket_unavailable",
                        e.to_string(),
                    );
                    e.retry_after_s = Some(1);
                    e
                }),
                None => blocking(move || {
                    rt.list_actors_with_prefix(
                        &tenant,
                        &app,
                        &class,
                        &prefix,
                        after.as_deref(),
                        limit,
                    )
                })
                .await
                .map(|names| {
                    let next = (names.len() == limit)
                        .then(|| names.last().cloned())
                        .flatten();
                    wasmkeep_replica::listing::ClassPage {
                        names,
                        next,
                        unreadable: 0,
                    }
                }),
            }
        }
    };
    if q.count {
        let (mut n, mut unreadable, mut pages) = (0, 0, 0);
        let mut after = q.after;
        loop {
            let p = page(after, 1_000).await?;
            n += p.names.len();
            unreadable += p.unreadable;
            pages += 1;
            after = p.next;
            if after.is_none() || n >= COUNT_ACTORS_MAX || pages >= COUNT_PAGES_MAX {
                let complete = after.is_none();
                return Ok(axum::Json(json!({
                    "count": n,
                    "complete": complete,
                    "unreadable": unreadable,
                    "source": source,
                    "limit": COUNT_ACTORS_MAX,
                }))
                .into_response());
            }
        }
    }
    let wasmkeep_replica::listing::ClassPage {
        names,
        next,
        unreadable,
    } = page(q.after, limit).await?;
    Ok(axum::Json(
        json!({ "actors": names, "next": next, "source": source, "unreadable": unreadable }),
    )
    .into_response())
}

fn actor_id(t: &str, a: &str, c: &str, n: &str) -> Result<ActorId, ApiError> {
    ActorId::new(t, a, c, n)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_name", e.to_string()))
}

type ActorPath = axum::extract::Path<(String, String, String, String)>;

/// The path and query a request is forwarded with: `prefix` (that of the
/// router the handler is nested in) and the URI as the handler sees it.
fn path_and_query(uri: &axum::http::Uri, prefix: &str) -> String {
    let pq = uri.path_and_query().map_or("/", |p| p.as_str());
    format!("{prefix}{pq}")
}

/// An admin route about one actor runs where the actor's requests run: in
/// cluster mode on its owner (forwarded there, or here once this node took
/// it), so that it reads and changes the one open copy.
async fn on_owner<F, Fut>(
    s: &AppState,
    id: ActorId,
    parts: &axum::http::request::Parts,
    body: Vec<u8>,
    run: F,
) -> Result<Response, ApiError>
where
    F: FnOnce(ActorId, Vec<u8>) -> Fut,
    Fut: std::future::Future<Output = Result<Response, ApiError>>,
{
    match &s.config.cluster {
        Some(c) => {
            check_acting(s)?;
            let forwarded = parts.headers.contains_key(FORWARDED_HEADER);
            // The admin router is nested: its handlers see the path
            // without the prefix.
            let pq = path_and_query(&parts.uri, ADMIN_PREFIX);
            clustered_request(c, id, &pq, parts, body, forwarded, run).await
        }
        None => run(id, body).await,
    }
}

/// A blocking runtime call, off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, wasmkeep_runtime::RuntimeError> + Send + 'static,
) -> Result<T, ApiError> {
    Ok(tokio::task::spawn_blocking(f).await.map_err(|e| {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
    })??)
}

async fn show_actor(
    State(s): State<AppState>,
    axum::extract::Path((t, a, c, n)): ActorPath,
    req: Request,
) -> Result<Response, ApiError> {
    let id = actor_id(&t, &a, &c, &n)?;
    let (parts, _) = req.into_parts();
    let rt = s.rt.clone();
    let node = s.config.cluster.as_ref().map(|c| c.status().node);
    on_owner(&s, id, &parts, Vec::new(), |id, _| async move {
        let sockets = rt.sockets().socket_count(&id);
        let info = blocking(move || rt.actor_info(&id)).await?;
        // What the owner adds: who it is (`null` on a single node) and the
        // actor's open WebSockets there.
        let mut v = serde_json::to_value(info).map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })?;
        v["owner_node"] = json!(node);
        v["open_sockets"] = json!(sockets);
        Ok(axum::Json(v).into_response())
    })
    .await
}

async fn delete_actor(
    State(s): State<AppState>,
    axum::extract::Path((t, a, c, n)): ActorPath,
    req: Request,
) -> Result<Response, ApiError> {
    let id = actor_id(&t, &a, &c, &n)?;
    let (parts, _) = req.into_parts();
    let rt = s.rt.clone();
    on_owner(&s, id, &parts, Vec::new(), |id, _| async move {
        let deleted = rt.delete_actor(id).await?;
        Ok(axum::Json(json!({ "deleted": deleted })).into_response())
    })
    .await
}

/// `POST /admin/v1/actors/{t}/{a}/{c}/{n}/alarm/run`: runs the actor's
/// pending alarm now, due or not (`{"ran": false}` when it has none; with
/// `"failed": {"code", "message"}` when its handler failed).
async fn run_alarm_now(
    State(s): State<AppState>,
    axum::extract::Path((t, a, c, n)): ActorPath,
    req: Request,
) -> Result<Response, ApiError> {
    let id = actor_id(&t, &a, &c, &n)?;
    s.rt.check_class(&id.tenant, &id.app, &id.class)?;
    let (parts, _) = req.into_parts();
    let rt = s.rt.clone();
    on_owner(&s, id, &parts, Vec::new(), |id, _| async move {
        let answer = match rt.alarms().run_now_reporting(&id).await? {
            None => json!({ "ran": false }),
            Some(Ok(())) => json!({ "ran": true }),
            Some(Err(e)) => {
                let e = ApiError::from(e);
                json!({ "ran": true, "failed": { "code": e.code, "message": e.message } })
            }
        };
        Ok(axum::Json(answer).into_response())
    })
    .await
}

async fn inspect_sql(
    State(s): State<AppState>,
    axum::extract::Path((t, a, c, n)): ActorPath,
    req: Request,
) -> Result<Response, ApiError> {
    let id = actor_id(&t, &a, &c, &n)?;
    let (parts, body) = req.into_parts();
    let sql = read_body_named(body, INSPECT_SQL_BYTES_MAX, s.pace(), || {
        format!("inspection SQL too large: limit inspect_sql_bytes_max={INSPECT_SQL_BYTES_MAX}")
    })
    .await?;
    let rt = s.rt.clone();
    let rows_max = s.config.inspect_rows_max;
    on_owner(&s, id, &parts, sql, |id, sql| async move {
        let sql = String::from_utf8(sql).map_err(|_| {
            ApiError::new(StatusCode::BAD_REQUEST, "bad_body", "the SQL is not utf-8")
        })?;
        let r = blocking(move || rt.inspect_sql(&id, &sql, rows_max)).await?;
        let rows: Vec<Vec<serde_json::Value>> = r
            .rows
            .into_iter()
            .map(|row| row.into_iter().map(value_json).collect())
            .collect();
        Ok(axum::Json(json!({ "columns": r.columns, "rows": rows })).into_response())
    })
    .await
}

/// `PUT /admin/v1/actors/{t}/{a}/{c}/{n}/database`: makes the SQLite file
/// in the body the actor's database, as its next event, on its owner
/// (`wasmkeep_runtime::restore`): nothing acknowledged before is lost (with
/// a bucket it is in the chain's history), everything after builds on it.
async fn restore_actor(
    State(s): State<AppState>,
    axum::extract::Path((t, a, c, n)): ActorPath,
    req: Request,
) -> Result<Response, ApiError> {
    let id = actor_id(&t, &a, &c, &n)?;
    s.rt.check_class(&id.tenant, &id.app, &id.class)?;
    let (parts, body) = req.into_parts();
    let file = read_body(body, RESTORE_BYTES_MAX, s.pace())
        .await
        .map_err(|e| {
            if e.code == "body_too_large" {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!(
                        "a database restored through the node is at most \
                         restore_bytes_max={RESTORE_BYTES_MAX}; restore a larger one with \
                         `wasmkeep restore --bucket` while the node is stopped"
                    ),
                )
                .closing()
            } else {
                e
            }
        })?;
    let rt = s.rt.clone();
    on_owner(&s, id, &parts, file, |id, file| async move {
        let path = rt.staging_path()?;
        let staged = path.clone();
        blocking(move || {
            std::fs::write(&staged, &file)
                .map_err(|e| wasmkeep_runtime::RuntimeError::Store(e.into()))
        })
        .await?;
        let restored = rt.restore_actor(id, path).await?;
        Ok(axum::Json(restored).into_response())
    })
    .await
}

/// `GET /admin/v1/actors/{t}/{a}/{c}/{n}/database`: the actor's committed
/// database as a SQLite file, copied between two of its events on its
/// owner (`wasmkeep export --server`). The copy is staged in the data
/// folder, unlinked once open and streamed, so memory stays at one chunk
/// whatever the database's size. Through a cluster node the answer is
/// forwarded and so bounded by `forward_response_bytes_max`; `export
/// --bucket` reads any size, and past points, from the bucket.
async fn export_actor(
    State(s): State<AppState>,
    axum::extract::Path((t, a, c, n)): ActorPath,
    req: Request,
) -> Result<Response, ApiError> {
    let id = actor_id(&t, &a, &c, &n)?;
    s.rt.check_class(&id.tenant, &id.app, &id.class)?;
    let (parts, _) = req.into_parts();
    let rt = s.rt.clone();
    on_owner(&s, id, &parts, Vec::new(), |id, _| async move {
        let path = rt.staging_path()?;
        let staged = path.clone();
        let copied = blocking(move || rt.export_actor(&id, staged)).await;
        let opened = match copied {
            Ok(bytes) => tokio::fs::File::open(&path).await.map(|f| (f, bytes)),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        // Open, the file needs no name: nothing is left behind if the
        // client goes away mid-download.
        let _ = std::fs::remove_file(&path);
        let (file, bytes) = opened.map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("reading the copied database: {e}"),
            )
        })?;
        let chunks = futures_util::stream::try_unfold(file, |mut file| async move {
            use tokio::io::AsyncReadExt;
            let mut buf = vec![0u8; EXPORT_CHUNK_BYTES];
            let n = file.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(None);
            }
            buf.truncate(n);
            Ok(Some((bytes::Bytes::from(buf), file)))
        });
        let mut resp = Response::new(Body::from_stream(chunks));
        let h = resp.headers_mut();
        h.insert(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/vnd.sqlite3"),
        );
        h.insert(axum::http::header::CONTENT_LENGTH, HeaderValue::from(bytes));
        Ok(resp)
    })
    .await
}

fn value_json(v: wasmkeep_runtime::StoreValue) -> serde_json::Value {
    use wasmkeep_runtime::StoreValue as V;
    match v {
        V::Null => serde_json::Value::Null,
        V::Integer(i) => json!(i),
        V::Real(f) => json!(f),
        V::Text(s) => json!(s),
        V::Blob(b) => json!({ "blob_hex": hex::encode(b) }),
    }
}

#[derive(Deserialize)]
struct AlarmsQuery {
    limit: Option<usize>,
    /// Every live node's pending alarms, each naming its node.
    #[serde(default)]
    cluster: bool,
    /// Whether a cluster node adds the bucket's index (default true).
    index: Option<bool>,
}

/// `GET /admin/v1/alarms/{tenant}[?limit=N][&cluster=true][&index=false]`:
/// the tenant's pending alarms in the node's timer (each with its
/// `retry_count`, the failed runs so far), and on a cluster node the
/// bucket's index; with `cluster=true` every other live node's pending
/// alarms too (each names its node; `nodes_unreachable` those that did not
/// answer within `CLUSTER_ASK_TIMEOUT_MS`).
async fn list_alarms(
    State(s): State<AppState>,
    axum::extract::Path(tenant): axum::extract::Path<String>,
    Query(q): Query<AlarmsQuery>,
) -> Result<Response, ApiError> {
    segment("tenant", &tenant)?;
    s.rt.check_tenant(&tenant)?;
    let limit = q.limit.unwrap_or(LIST_ALARMS_DEFAULT).min(LIST_ALARMS_MAX);
    let here = s.config.cluster.as_ref().map(|c| c.node().to_owned());
    let mut alarms: Vec<_> =
        s.rt.alarms()
            .pending(&tenant, limit)
            .into_iter()
            .map(|(id, at, retries)| {
                // A cluster node's timer keeps the alarms on its disk, of
                // actors it holds or will take when due, and of actors
                // that moved away (until due, when another node has them).
                json!({
                    "app": id.app, "class": id.class, "name": id.name,
                    "alarm_ms": at, "retry_count": retries, "node": here,
                    "held": s.rt.may_run_actor(&id),
                })
            })
            .collect();
    let mut unreachable = Vec::new();
    if let (Some(c), true) = (&s.config.cluster, q.cluster) {
        let path = format!("{ADMIN_PREFIX}/alarms/{tenant}?limit={limit}&index=false");
        for (node, theirs) in fanout::ask_others(c, &path).await? {
            match theirs.as_ref().and_then(|v| v["alarms"].as_array()) {
                Some(a) => alarms.extend(a.iter().cloned()),
                None => unreachable.push(node),
            }
        }
        // An actor in two nodes' timers is shown once: as the node that
        // holds it has it, else as the first.
        alarms.sort_by_key(|a| a["held"] != true);
        let mut seen = std::collections::HashSet::new();
        alarms.retain(|a| seen.insert(format!("{}/{}/{}", a["app"], a["class"], a["name"])));
        alarms.sort_by_key(|a| a["alarm_ms"].as_u64().unwrap_or(0));
        alarms.truncate(limit);
    }
    // A cluster node also shows the bucket's index (ADR 0009): what any
    // node's sweep would find.
    let index = match &s.config.cluster {
        Some(c) if q.index.unwrap_or(true) => {
            let shown = crate::cluster::sweep::show_index(c, &s.rt, &tenant, limit)
                .await
                .map_err(|e| {
                    let mut e =
                        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "bucket_unavailable", e);
                    e.retry_after_s = Some(1);
                    e
                })?;
            Some(shown)
        }
        _ => None,
    };
    Ok(axum::Json(json!({
        "alarms": alarms,
        "index": index,
        "nodes_unreachable": unreachable,
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clusters_replay_asks_the_others_for_their_own_actors_only() {
        assert_eq!(node_only_query(""), "node_only=true");
        assert_eq!(
            node_only_query("last=3&node_only=false&manifest=a%26b"),
            "last=3&manifest=a%26b&node_only=true"
        );
        // Any spelling of the key a client sends is left out.
        assert_eq!(
            node_only_query("node%5Fonly=0&class=c"),
            "class=c&node_only=true"
        );
    }

    #[test]
    fn actor_paths_decode_names_and_keep_the_rest() {
        let (id, sub) = parse_actor_path("/v1/t/a/c/a%2Fb%20c/x/y").unwrap();
        assert_eq!(id.name, "a/b c");
        assert_eq!(sub, "/x/y");
        let (_, sub) = parse_actor_path("/v1/t/a/c/n").unwrap();
        assert_eq!(sub, "/");
        assert_eq!(
            parse_actor_path("/v1/t/a/c").unwrap_err().status,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            parse_actor_path("/v1/T/a/c/n").unwrap_err().code,
            "invalid_name"
        );
        assert_eq!(
            parse_actor_path("/v1/t/a/c/%0a").unwrap_err().code,
            "invalid_name"
        );
        assert_eq!(
            parse_actor_path("/v1/t/a/c/%ff").unwrap_err().code,
            "invalid_name"
        );
        for bad in ["a%ZZ", "a%", "a%2", "%g0", "100%"] {
            let e = parse_actor_path(&format!("/v1/t/a/c/{bad}")).unwrap_err();
            assert_eq!(e.code, "invalid_name", "{bad}");
        }
        let (id, _) = parse_actor_path("/v1/t/a/c/a%2Fb%20c").unwrap();
        assert_eq!(id.name, "a/b c");
    }

    #[test]
    fn durability_comes_from_the_header_or_the_query_flag_which_the_actor_does_not_see() {
        let none = axum::http::HeaderMap::new();
        assert_eq!(
            durability(&none, "a=1&b=2", false).unwrap(),
            ("a=1&b=2".into(), false)
        );
        assert_eq!(
            durability(&none, "a=1&wasmkeep-durability=replicated&b=2", false).unwrap(),
            ("a=1&b=2".into(), true)
        );
        assert_eq!(
            durability(&none, "wasmkeep-durability=local", false).unwrap(),
            (String::new(), false)
        );
        let mut h = axum::http::HeaderMap::new();
        h.insert(DURABILITY_HEADER, "replicated".parse().unwrap());
        assert_eq!(durability(&h, "x=1", false).unwrap(), ("x=1".into(), true));
        h.insert(DURABILITY_HEADER, "fsync".parse().unwrap());
        assert_eq!(
            durability(&h, "", false).unwrap_err().code,
            "bad_durability"
        );
        assert_eq!(
            durability(&none, "wasmkeep-durability=maybe", false)
                .unwrap_err()
                .code,
            "bad_durability"
        );
    }

    /// Only the node's own refusals are routed again: not an answer an
    /// actor gave (it carries the node header), whatever its body says,
    /// and not `lease_lapsed` (the request ran; its effects may stand).
    #[test]
    fn only_the_nodes_own_refusals_are_routed_again() {
        let answer = |code: &str, node: bool| {
            let body = format!("{{\"error\":{{\"code\":\"{code}\",\"message\":\"x\"}}}}");
            let mut r = axum::http::Response::new(bytes::Bytes::from(body));
            *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            if node {
                r.headers_mut()
                    .insert(NODE_HEADER, HeaderValue::from_static("0123abcd"));
            }
            r
        };
        assert!(refused_as_not_owner(&answer("not_owner", false)));
        assert!(refused_as_not_owner(&answer("node_not_acting", false)));
        assert!(
            !refused_as_not_owner(&answer("not_owner", true)),
            "an actor's answer"
        );
        assert!(!refused_as_not_owner(&answer("lease_lapsed", false)));
        let lapsed =
            serde_json::to_vec(&serde_json::json!({"error": {"code": lease_lapsed().code}}))
                .unwrap();
        let mut r = axum::http::Response::new(bytes::Bytes::from(lapsed));
        *r.status_mut() = lease_lapsed().status;
        assert!(!refused_as_not_owner(&r));
    }

    /// A node that replicates by default (a cluster node's default) does
    /// so for a request that names no durability; `local` opts out, and
    /// `replicated` anywhere wins over `local`.
    #[test]
    fn the_default_durability_applies_only_when_none_is_named() {
        let none = axum::http::HeaderMap::new();
        assert_eq!(
            durability(&none, "a=1", true).unwrap(),
            ("a=1".into(), true)
        );
        assert_eq!(
            durability(&none, "wasmkeep-durability=local", true).unwrap(),
            (String::new(), false)
        );
        let mut h = axum::http::HeaderMap::new();
        h.insert(DURABILITY_HEADER, "local".parse().unwrap());
        assert_eq!(durability(&h, "", true).unwrap(), (String::new(), false));
        assert_eq!(
            durability(&h, "wasmkeep-durability=replicated", true).unwrap(),
            (String::new(), true)
        );
    }
}

#[cfg(test)]
mod fuzz {
    //! The actor path parser takes anything a client sends.
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5000))]

        #[test]
        fn any_path_parses_or_gets_a_4xx(path in "/v1/[a-z0-9%/._ -]{0,80}", raw in proptest::arbitrary::any::<String>()) {
            for p in [path, format!("/v1/{raw}")] {
                match parse_actor_path(&p) {
                    Ok((id, sub)) => {
                        prop_assert!(sub.starts_with('/'));
                        prop_assert!(ActorId::new(&id.tenant, &id.app, &id.class, &id.name).is_ok());
                    }
                    Err(e) => prop_assert!(e.status.is_client_error(), "{:?}", e),
                }
            }
        }
    }
}
