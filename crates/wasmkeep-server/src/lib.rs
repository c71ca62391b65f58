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
//! Connections are capped and timed out by the accept loop (`edge.rs`).
//! The runtime underneath knows nothing of any of this.

pub mod api;
pub mod auth;
mod edge;
pub mod error;
pub mod unsafe_rules;

pub use api::{ServerConfig, ServerError, router, serve};
pub use error::ApiError;
pub use unsafe_rules::UnsafeRules;
