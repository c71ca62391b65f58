//! The HTTP edge of a wasmkeep node, and the only crate that serves HTTP
//! (the runtime's outbox is a client for actors' outbound calls).
//!
//! - `ANY /v1/{tenant}/{app}/{class}/{name}/{path...}` runs the actor's
//!   request handler ([`api`]).
//! - `/admin/v1/...` deploys apps and lists, inspects and deletes actors.
//! - `/healthz` and `/metrics` (one OpenMetrics text exposition: the
//!   runtime's series, then the cluster's).
//!
//! Every error leaves as `{"error":{"code":"…","message":"…"}}` with a
//! stable code ([`error`]). Tokens are checked in constant time ([`auth`]).
//! Connections are capped and timed out by the accept loop (`edge.rs`).
//! In cluster mode ([`cluster`]) the node keeps its own lease and its actors'
//! holds in the bucket by driving `wasmkeep-cluster`'s step machines,
//! forwards requests for actors another node holds (one hop), and refuses
//! actor requests (503 `node_not_acting`) while the lease does not let it
//! act.
//! The runtime underneath knows nothing of any of this.

pub mod api;
pub mod auth;
pub mod cluster;
mod edge;
pub mod error;
pub mod traces;
pub mod unsafe_rules;

pub use api::{LOG_LINES_DEFAULT, ServerConfig, ServerError, router, serve};
pub use error::ApiError;
pub use unsafe_rules::UnsafeRules;
