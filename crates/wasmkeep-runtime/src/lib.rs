//! The engine room of a wasmkeep node: it runs actors.
//!
//! A [`Runtime`] holds one wasmtime engine, the deployed apps (components
//! compiled once and cached on disk), and the actors that are active. Every
//! actor has a bounded queue and runs one event at a time on a pool of worker
//! threads; the events an actor has queued run as one SQLite transaction
//! with a savepoint each, and their responses leave only once that
//! transaction is durable (`durability.rs`). Alarms live in each actor's
//! database; an in-memory timer (`timer.rs`) fires them ([`Alarms`]).
//!
//! Actors reach other actors and the world only through their durable
//! [`outbox`], whose dispatcher delivers what committed off the workers.
//!
//! The public surface is what the server, the test kit and the CLI use:
//! the items re-exported here and the modules left public below; the rest
//! of the crate is private (`unreachable_pub` keeps it from growing back).
//!
//! This crate knows nothing about serving HTTP or JSON (the server crate
//! does; the outbox makes outbound calls) and nothing about the bucket's
//! protocol beyond the replica it uploads to. It takes its time from one [`Clock`], so that a
//! test kit can drive it with a virtual clock through the same code paths
//! production uses.

pub mod actor;
mod alarms;
mod app;
pub mod app_config;
mod app_versions;
pub mod awaits;
mod bookmarks;
pub mod class_metrics;
pub mod class_migrations;
pub mod clock;
mod compile_cache;
pub mod compile_process;
mod config;
pub mod cron;
mod dispatch;
mod durability;
mod error;
mod faults;
mod guest_tape;
mod host;
pub mod idempotency;
pub mod index;
mod log_budget;
pub mod logs;
pub mod metrics;
mod node;
pub mod outbox;
mod parked;
pub mod pools;
mod quotas;
pub mod recording;
pub mod replay;
mod replication;
mod replies;
mod reply;
mod response;
pub mod restore;
pub mod runtime;
mod scheduler;
mod secrets;
pub mod sockets;
mod timer;
pub mod trace;
mod warm;

pub use actor::{ActorRequest, ActorResponse};
pub use alarms::{Alarms, TEST_CLOCK_ROUNDS_MAX};
pub use app::{AppInfo, AppManifest};
pub use app_versions::{AppVersion, rollback_target};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::AppLimits;
pub use config::Compile;
pub use config::{Durability, RuntimeConfig};
pub use error::RuntimeError;
pub use faults::Faults;
pub use node::{OPEN_FILES_KEPT, RunGate, open_databases_max_for};
pub use runtime::instance_keep_resident_bytes;
pub use runtime::{ActorInfo, DeployOptions, PreparedApp, Runtime};
pub use secrets::Secrets;
pub use wasmkeep_store::{ActorId, StoreLimits, Value as StoreValue, memory_budget};
