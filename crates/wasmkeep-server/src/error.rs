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

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> ApiError {
        ApiError {
            status: StatusCode::from_u16(e.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code: e.code(),
            message: e.edge_message(),
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
