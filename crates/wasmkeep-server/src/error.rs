//! Errors at the HTTP edge: a status, a stable code and a message.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use wasmkeep_runtime::RuntimeError;

/// An error as the client sees it.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
    /// Seconds after which the client may retry, for 503s.
    pub retry_after_s: Option<u32>,
    /// The connection closes after this answer (`Connection: close`): a
    /// refusal that frees the connection for someone else, or a 413 whose
    /// body was not read (the edge then drains it, see `edge::TrackedIo`).
    pub close: bool,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code: code.to_owned(),
            message: message.into(),
            retry_after_s: None,
            close: false,
        }
    }

    /// The same error, closing the connection after it.
    pub fn closing(mut self) -> ApiError {
        self.close = true;
        self
    }
}

/// The HTTP status each runtime error code gets.
fn status_of(e: &RuntimeError) -> StatusCode {
    match e {
        RuntimeError::InvalidId(_)
        | RuntimeError::InvalidConfig(_)
        | RuntimeError::InvalidIdempotencyKey(_) => StatusCode::BAD_REQUEST,
        RuntimeError::IdempotencyKeyReused { .. }
        | RuntimeError::IdempotentResponseTooLarge { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        RuntimeError::AppNotFound(_)
        | RuntimeError::VersionNotFound { .. }
        | RuntimeError::TenantNotFound(_)
        | RuntimeError::ClassNotFound { .. }
        | RuntimeError::ActorNotFound(_) => StatusCode::NOT_FOUND,
        RuntimeError::ActorOverloaded { .. }
        | RuntimeError::QueueBytesExceeded { .. }
        | RuntimeError::CompileBusy { .. }
        | RuntimeError::ShuttingDown
        | RuntimeError::TooManyFollowers { .. }
        | RuntimeError::TransactionAborted
        | RuntimeError::ReplicationFailed(_) => StatusCode::SERVICE_UNAVAILABLE,
        RuntimeError::ReplicationUnavailable => StatusCode::BAD_REQUEST,
        // Messages only: no request carries one to the edge.
        RuntimeError::NoInbox(_) => StatusCode::UNPROCESSABLE_ENTITY,
        RuntimeError::Relayed { .. } => StatusCode::BAD_GATEWAY,
        RuntimeError::ClassMigration {
            code: "class_migrating",
            ..
        } => StatusCode::SERVICE_UNAVAILABLE,
        RuntimeError::ClassMigration {
            code: "migration_unsupported",
            ..
        } => StatusCode::NOT_IMPLEMENTED,
        RuntimeError::ClassMigration { .. } | RuntimeError::Refused { .. } => StatusCode::CONFLICT,
        RuntimeError::ReplyExpired => StatusCode::GATEWAY_TIMEOUT,
        RuntimeError::InvalidComponent(_)
        | RuntimeError::InvalidManifest(_)
        | RuntimeError::LimitAboveCeiling { .. }
        | RuntimeError::CompileTimeout { .. }
        | RuntimeError::CompileMemoryExceeded { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        RuntimeError::ComponentTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        RuntimeError::QuotaExceeded { .. } => StatusCode::INSUFFICIENT_STORAGE,
        // A guest may fail an event with one of these codes to say the
        // request was at fault; the event is rolled back all the same.
        RuntimeError::Guest { code, .. } if code == "bad_request" => StatusCode::BAD_REQUEST,
        RuntimeError::Guest { code, .. } if code == "not_found" => StatusCode::NOT_FOUND,
        RuntimeError::Guest { code, .. } if code == "conflict" => StatusCode::CONFLICT,
        // The actor failed the event: its writes were rolled back.
        RuntimeError::Guest { .. }
        | RuntimeError::Trap(_)
        | RuntimeError::CpuTimeExceeded { .. }
        | RuntimeError::MemoryExceeded { .. }
        | RuntimeError::ResponseTooLarge { .. }
        | RuntimeError::ResponseHeadersTooLarge { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        // Tenants together hold the node's memory: retry later.
        RuntimeError::Store(s) if s.code() == "node_memory_exhausted" => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        RuntimeError::Store(s) if s.is_guest_fault() => StatusCode::BAD_REQUEST,
        RuntimeError::Store(_) | RuntimeError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> ApiError {
        // An actor's error whose code is the answer's (one the host gave
        // it, passed on): the message says whose it is without repeating
        // the code. Any other code of an actor's stays in the message, the
        // answer's code being `guest_error`.
        let message = match &e {
            RuntimeError::Guest { code, message } if *code == e.code() => {
                format!("the actor failed: {message}")
            }
            e => e.to_string(),
        };
        ApiError {
            status: status_of(&e),
            code: e.code(),
            message,
            retry_after_s: e.is_retryable().then_some(1),
            close: false,
        }
    }
}

impl From<crate::cluster::deploys::DeployError> for ApiError {
    fn from(e: crate::cluster::deploys::DeployError) -> ApiError {
        use crate::cluster::deploys::DeployError as E;
        match e {
            E::Runtime(e) => e.into(),
            e => {
                let mut a =
                    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, &e.code(), e.to_string());
                a.retry_after_s = Some(1);
                a
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": { "code": self.code, "message": self.message }
        });
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after_s {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.close {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        r
    }
}
