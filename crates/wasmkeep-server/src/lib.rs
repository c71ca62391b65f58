//! The HTTP edge of a wasmkeep node, and the only crate that speaks HTTP or
//! JSON.
//!
//! - `ANY /v1/{tenant}/{app}/{class}/{name}/{path...}` runs the actor's
//!   request handler ([`api`]).
//! - `/admin/v1/...` deploys apps and lists, inspects and deletes actors.
//! - `/healthz` and `/metrics` (Prometheus text).
//!
//! Every error leaves as `{"error":{"code":"…","message":"…"}}` with a
//! stable code ([`error`]). Tokens are checked in constant time ([`auth`]).
//! The runtime underneath knows nothing of any of this.

pub mod api;
pub mod auth;
pub mod error;

pub use api::{ServerConfig, router, serve};
pub use error::ApiError;
