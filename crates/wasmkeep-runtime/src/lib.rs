//! The engine room of a wasmkeep node: it runs actors.
//!
//! A [`Runtime`] holds one wasmtime engine, the deployed apps (components
//! compiled once and cached on disk), and the actors that are active. Every
//! actor has a bounded queue and runs one event at a time on a pool of worker
//! threads; the events an actor has queued run as one SQLite transaction
//! with a savepoint each, and their responses leave only once that
//! transaction is durable ([`durability`]). Alarms live in each actor's
//! database; an in-memory [`timer`] fires them.
//!
//! Actors reach other actors and the world only through their durable
//! [`outbox`], whose dispatcher delivers what committed off the workers.
//!
//! This crate knows nothing about serving HTTP or JSON (the server crate
//! does; the outbox makes outbound calls) and nothing about the bucket's
//! protocol beyond the replica it uploads to. It takes its time from one [`Clock`], so that a
//! test kit can drive it with a virtual clock through the same code paths
//! production uses.

pub mod actor;
pub mod app;
pub mod app_config;
pub mod class_metrics;
pub mod clock;
mod compile_cache;
pub mod compile_process;
pub mod config;
pub mod durability;
pub mod error;
pub(crate) mod host;
pub mod index;
mod log_budget;
pub mod logs;
pub mod metrics;
pub mod outbox;
pub mod parked;
pub mod pools;
pub mod quotas;
pub mod replication;
mod reply;
mod response;
pub mod restore;
pub mod runtime;
mod scheduler;
pub mod sockets;
pub mod timer;
pub mod warm;

pub use actor::{ActorRequest, ActorResponse};
pub use app::{AppInfo, AppLimits, AppManifest};
pub use clock::{Clock, ManualClock, SystemClock};
pub use compile_process::Compile;
pub use config::{Durability, RuntimeConfig};
pub use error::RuntimeError;
pub use runtime::{ActorInfo, RunGate, Runtime};
pub use wasmkeep_store::{ActorId, StoreLimits, Value as StoreValue, memory_budget};
