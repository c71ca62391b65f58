//! `/admin/v1/test/clock`: the clock of a node started in test mode
//! (`wasmkeep serve --test-clock START_MS`, loopback only), which stands
//! still until a test moves it, so that a test kit outside the process
//! (the JavaScript one, `@wasmkeep/sdk/testing`) can run an actor's alarms
//! at their times, as Rust's `TestNode::advance` does in-process.
//!
//! - `GET`: `{"now_ms":T}`.
//! - `POST ?advance_ms=N` or `?to_ms=T`: moves the clock forward, running
//!   every alarm that comes due on the way (`Runtime::advance_test_clock`);
//!   `{"now_ms":T,"alarms_ran":K}`.
//!
//! On a node with the real clock both answer 404 `not_test_mode`.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use wasmkeep_runtime::{Clock, ManualClock};

use super::AppState;
use crate::error::ApiError;

/// The farthest one move goes: ten years. A larger `advance_ms` is
/// refused (`bad_request`) rather than overflowing the clock.
pub(super) const ADVANCE_MS_MAX: u64 = 10 * 365 * 86_400_000;

#[derive(Deserialize)]
pub(super) struct Move {
    advance_ms: Option<u64>,
    to_ms: Option<u64>,
}

fn clock(s: &AppState) -> Result<&ManualClock, ApiError> {
    s.config.test_clock.as_deref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_test_mode",
            "this node runs on the real clock: start it with `wasmkeep serve --test-clock START_MS` to move time",
        )
    })
}

pub(super) async fn show(State(s): State<AppState>) -> Result<Response, ApiError> {
    let now = clock(&s)?.now_ms();
    Ok(axum::Json(json!({ "now_ms": now })).into_response())
}

pub(super) async fn advance(
    State(s): State<AppState>,
    Query(q): Query<Move>,
) -> Result<Response, ApiError> {
    let clock = clock(&s)?;
    let now = clock.now_ms();
    let target = match (q.advance_ms, q.to_ms) {
        (Some(ms), None) if ms <= ADVANCE_MS_MAX => now + ms,
        (None, Some(to)) if to >= now && to - now <= ADVANCE_MS_MAX => to,
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!(
                    "give one of `advance_ms` (at most {ADVANCE_MS_MAX}) or `to_ms` (not before now_ms={now}, at most {ADVANCE_MS_MAX} after it): time moves forward only"
                ),
            ));
        }
    };
    let ran = s.rt.advance_test_clock(clock, target).await?;
    Ok(axum::Json(json!({ "now_ms": clock.now_ms(), "alarms_ran": ran })).into_response())
}
