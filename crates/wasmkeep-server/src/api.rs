//! Routes, handlers and the server loop.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post, put};
use percent_encoding::percent_decode_str;
use serde::Deserialize;
use serde_json::json;
use wasmkeep_runtime::{ActorId, ActorRequest, Runtime};

use crate::auth::Tokens;
use crate::error::ApiError;

/// Longest SQL text the inspection route accepts.
pub const INSPECT_SQL_BYTES_MAX: usize = 1024 * 1024;
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
    /// Token for `/admin`; `None`: open.
    pub admin_token: Option<String>,
    /// Tokens per tenant for `/v1/{tenant}`.
    pub tenant_tokens: BTreeMap<String, String>,
    /// Most actor names one listing returns.
    pub list_actors_max: usize,
    /// Most rows one inspection query returns.
    pub inspect_rows_max: usize,
    /// Largest deploy body (the runtime's `component_bytes_max`).
    pub component_bytes_max: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            request_body_bytes_max: 32 * 1024 * 1024,
            admin_token: None,
            tenant_tokens: BTreeMap::new(),
            list_actors_max: 1000,
            inspect_rows_max: 1000,
            component_bytes_max: 64 * 1024 * 1024,
        }
    }
}

#[derive(Clone)]
struct AppState {
    rt: Runtime,
    config: Arc<ServerConfig>,
    tokens: Arc<Tokens>,
}

/// The node's routes.
pub fn router(rt: Runtime, config: ServerConfig) -> Router {
    let tokens = Tokens::new(config.admin_token.as_deref(), &config.tenant_tokens);
    let state = AppState {
        rt,
        config: Arc::new(config),
        tokens: Arc::new(tokens),
    };
    let admin = Router::new()
        .route("/apps", get(list_apps))
        .route("/apps/{tenant}/{app}", put(deploy).get(show_app))
        .route("/actors/{tenant}/{app}/{class}", get(list_actors))
        .route(
            "/actors/{tenant}/{app}/{class}/{name}",
            get(show_actor).delete(delete_actor),
        )
        .route(
            "/actors/{tenant}/{app}/{class}/{name}/sql",
            post(inspect_sql),
        )
        .route("/alarms/{tenant}", get(list_alarms))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            admin_auth,
        ));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/v1/{*rest}", any(actor_request))
        .nest("/admin/v1", admin)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// Serves `router` on `listener` until `shutdown` resolves.
pub async fn serve(
    rt: Runtime,
    config: ServerConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(rt, config);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

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
    if !s.tokens.admin_ok(req.headers()) {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the admin API needs `Authorization: Bearer <admin token>`",
        )
        .into_response();
    }
    next.run(req).await
}

async fn metrics(State(s): State<AppState>) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4")],
        s.rt.metrics().render(),
    )
        .into_response()
}

async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let too_large = std::error::Error::source(&e)
            .map(|s| s.to_string().contains("length limit"))
            .unwrap_or(false)
            || e.to_string().contains("length limit");
        if too_large {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("request body too large: limit request_body_bytes_max={limit}"),
            )
        } else {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_body",
                format!("could not read the body: {e}"),
            )
        }
    })
}

fn decode_segment(field: &'static str, raw: &str) -> Result<String, ApiError> {
    percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_name",
                format!("invalid {field}: percent-encoding is not utf-8"),
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

/// A request's durability: `replicated` (header or query flag) or the
/// default, `local`. The query flag is taken out of the query the actor
/// sees; the header stays among its headers.
fn durability(headers: &axum::http::HeaderMap, query: &str) -> Result<(String, bool), ApiError> {
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
    let mut replicated = false;
    for v in headers.get_all(DURABILITY_HEADER) {
        replicated |= parse(v.to_str().map_err(|_| bad("(not text)"))?)?;
    }
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((k, v)) if k == DURABILITY_HEADER => replicated |= parse(v)?,
            _ => kept.push(pair),
        }
    }
    Ok((kept.join("&"), replicated))
}

async fn actor_request(State(s): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let (id, path) = parse_actor_path(parts.uri.path())?;
    if !s.tokens.tenant_ok(&id.tenant, &parts.headers) {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            format!(
                "tenant `{}` needs `Authorization: Bearer <tenant token>`",
                id.tenant
            ),
        ));
    }
    let body = read_body(body, s.config.request_body_bytes_max).await?;
    let headers = parts
        .headers
        .iter()
        .filter(|(k, _)| *k != axum::http::header::AUTHORIZATION)
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    let (query, replicated) = durability(&parts.headers, parts.uri.query().unwrap_or(""))?;
    let request = ActorRequest {
        method: parts.method.as_str().to_owned(),
        path,
        query,
        headers,
        body: body.to_vec(),
        replicated,
    };
    let resp = s.rt.request(id.clone(), request).await?;
    let status = StatusCode::from_u16(resp.status).map_err(|_| {
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
            (Ok(k), Ok(v)) => {
                h.append(k, v);
            }
            _ => tracing::warn!(actor = %id, header = %k, "dropped an invalid response header"),
        }
    }
    Ok(out)
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
}

async fn deploy(
    State(s): State<AppState>,
    axum::extract::Path((tenant, app)): axum::extract::Path<(String, String)>,
    Query(q): Query<DeployQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    segment("tenant", &tenant)?;
    segment("app", &app)?;
    // One byte over the limit is read, so that the runtime names the limit.
    let limit = s.config.component_bytes_max;
    let wasm = read_body(body, limit + 1).await.map_err(|e| {
        if e.code == "body_too_large" {
            ApiError::from(wasmkeep_runtime::RuntimeError::ComponentTooLarge {
                size: limit + 1,
                limit,
            })
        } else {
            e
        }
    })?;
    let rt = s.rt.clone();
    let manifest = q.manifest.unwrap_or_default();
    let info = tokio::task::spawn_blocking(move || rt.deploy(&tenant, &app, &wasm, &manifest))
        .await
        .map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })??;
    Ok((StatusCode::OK, axum::Json(info)).into_response())
}

async fn list_apps(State(s): State<AppState>) -> Response {
    axum::Json(json!({ "apps": s.rt.apps() })).into_response()
}

async fn show_app(
    State(s): State<AppState>,
    axum::extract::Path((tenant, app)): axum::extract::Path<(String, String)>,
) -> Result<Response, ApiError> {
    match s.rt.app(&tenant, &app) {
        Some(info) => Ok(axum::Json(info).into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "app_not_found",
            format!("app not found: {tenant}/{app}"),
        )),
    }
}

#[derive(Deserialize)]
struct ListQuery {
    after: Option<String>,
    limit: Option<usize>,
}

async fn list_actors(
    State(s): State<AppState>,
    axum::extract::Path((tenant, app, class)): axum::extract::Path<(String, String, String)>,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let limit = q
        .limit
        .unwrap_or(LIST_ACTORS_DEFAULT)
        .clamp(1, s.config.list_actors_max);
    let names =
        s.rt.list_actors(&tenant, &app, &class, q.after.as_deref(), limit)?;
    let next = (names.len() == limit)
        .then(|| names.last().cloned())
        .flatten();
    Ok(axum::Json(json!({ "actors": names, "next": next })).into_response())
}

fn actor_id(t: &str, a: &str, c: &str, n: &str) -> Result<ActorId, ApiError> {
    ActorId::new(t, a, c, n)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_name", e.to_string()))
}

type ActorPath = axum::extract::Path<(String, String, String, String)>;

async fn show_actor(
    State(s): State<AppState>,
    axum::extract::Path((t, a, c, n)): ActorPath,
) -> Result<Response, ApiError> {
    let id = actor_id(&t, &a, &c, &n)?;
    let rt = s.rt.clone();
    let info = tokio::task::spawn_blocking(move || rt.actor_info(&id))
        .await
        .map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })??;
    Ok(axum::Json(info).into_response())
}

async fn delete_actor(
    State(s): State<AppState>,
    axum::extract::Path((t, a, c, n)): ActorPath,
) -> Result<Response, ApiError> {
    let id = actor_id(&t, &a, &c, &n)?;
    let deleted = s.rt.delete_actor(id).await?;
    Ok(axum::Json(json!({ "deleted": deleted })).into_response())
}

async fn inspect_sql(
    State(s): State<AppState>,
    axum::extract::Path((t, a, c, n)): ActorPath,
    body: Body,
) -> Result<Response, ApiError> {
    let id = actor_id(&t, &a, &c, &n)?;
    let sql = read_body(body, INSPECT_SQL_BYTES_MAX).await.map_err(|e| {
        if e.code == "body_too_large" {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!(
                    "inspection SQL too large: limit inspect_sql_bytes_max={INSPECT_SQL_BYTES_MAX}"
                ),
            )
        } else {
            e
        }
    })?;
    let sql = String::from_utf8(sql.to_vec())
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, "bad_body", "the SQL is not utf-8"))?;
    let rt = s.rt.clone();
    let rows_max = s.config.inspect_rows_max;
    let r = tokio::task::spawn_blocking(move || rt.inspect_sql(&id, &sql, rows_max))
        .await
        .map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })??;
    let rows: Vec<Vec<serde_json::Value>> = r
        .rows
        .into_iter()
        .map(|row| row.into_iter().map(value_json).collect())
        .collect();
    Ok(axum::Json(json!({ "columns": r.columns, "rows": rows })).into_response())
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
}

async fn list_alarms(
    State(s): State<AppState>,
    axum::extract::Path(tenant): axum::extract::Path<String>,
    Query(q): Query<AlarmsQuery>,
) -> Result<Response, ApiError> {
    segment("tenant", &tenant)?;
    let limit = q.limit.unwrap_or(LIST_ALARMS_DEFAULT).min(LIST_ALARMS_MAX);
    let alarms: Vec<_> = s
        .rt
        .pending_alarms(&tenant, limit)
        .into_iter()
        .map(
            |(id, at)| json!({ "app": id.app, "class": id.class, "name": id.name, "alarm_ms": at }),
        )
        .collect();
    Ok(axum::Json(json!({ "alarms": alarms })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn durability_comes_from_the_header_or_the_query_flag_which_the_actor_does_not_see() {
        let none = axum::http::HeaderMap::new();
        assert_eq!(
            durability(&none, "a=1&b=2").unwrap(),
            ("a=1&b=2".into(), false)
        );
        assert_eq!(
            durability(&none, "a=1&wasmkeep-durability=replicated&b=2").unwrap(),
            ("a=1&b=2".into(), true)
        );
        assert_eq!(
            durability(&none, "wasmkeep-durability=local").unwrap(),
            (String::new(), false)
        );
        let mut h = axum::http::HeaderMap::new();
        h.insert(DURABILITY_HEADER, "replicated".parse().unwrap());
        assert_eq!(durability(&h, "x=1").unwrap(), ("x=1".into(), true));
        h.insert(DURABILITY_HEADER, "fsync".parse().unwrap());
        assert_eq!(durability(&h, "").unwrap_err().code, "bad_durability");
        assert_eq!(
            durability(&none, "wasmkeep-durability=maybe")
                .unwrap_err()
                .code,
            "bad_durability"
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
