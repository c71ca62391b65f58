//! One actor's SQLite database, and nothing else.
//!
//! This crate owns the on-disk shape of an actor: where its file lives under a
//! node's data directory ([`paths`]), the runtime's internal tables
//! (`_wasmkeep_*`: key-value, meta, alarm, outbox and inbox), the sandbox that keeps guest SQL
//! inside its database ([`sandbox`]: allow-lists, hardened settings, a
//! deadline per statement), the memory guest SQL may hold
//! ([`memory_budget`]), and the limits that turn
//! SQLite's low-level failures into errors that name the limit ([`limits`]).
//!
//! It knows nothing of WebAssembly, HTTP, the network or the bucket: the
//! runtime decides *when* to open, begin, commit and sync; this crate decides
//! *how*. Every method is blocking and meant to run on a worker thread.

mod clock;
pub mod commit_log;
pub mod data_lock;
pub mod db;
pub mod error;
mod file_lock;
mod guest_functions;
pub mod id;
mod index_blocks;
pub mod limits;
mod log_writes;
pub mod memory_budget;
pub mod page_capture;
pub mod paths;
pub mod sandbox;
pub mod spare_actors;
pub mod sqlite_setup;
pub mod stack;
pub mod sync;
mod wal_format;
mod wal_index;

pub use wal_index::os_page_bytes;

pub use db::{
    ActorDb, AlarmState, ExecResult, IdempotentAnswer, InboxSeen, InspectBounds, KvListOptions,
    OpenMode, OutboxKind, OutboxRow, QueryResult, SqliteMemory, Value,
};
pub use error::StoreError;
pub use id::ActorId;
pub use limits::StoreLimits;
