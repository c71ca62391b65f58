//! Replication of actor databases to an S3-compatible bucket: the only
//! crate that talks to object storage.
//!
//! What it is: the bucket layout of an actor's chain ([`keys`]), the
//! self-describing, checksummed entry format ([`entry`]), page-level change
//! capture and applying entries ([`image`]), the owner's side of the chain
//! (create-only appends, telling a lost response from a moved chain,
//! snapshots and collection: [`Replica`]), deleting an actor with a
//! tombstone so that its next life continues the chain ([`delete_all`]),
//! restoring a local file with its
//! sidecar and setting a mismatching one aside, and point-in-time export
//! ([`export`]). Every request goes through [`Bucket`], which counts them.
//! What the bucket holds is untrusted input: every object is bounded before
//! it is downloaded and while it streams in, every count in a body is
//! checked against the bytes present and the bounds of [`limits`] before
//! anything is sized from it, listings are read key by key and held only
//! up to a bound, a restore replays a bounded number of entries and bytes,
//! and a restored image passes SQLite's `PRAGMA quick_check` before it
//! replaces a local file (an exported one before it takes its name).
//! ADR 0007 (`docs/adr/0007-replication.md`) explains the decisions.
//!
//! What it is not: it decides nothing about ownership (leases and holds are
//! `wasmkeep-cluster`'s), does not open, write or commit an actor's
//! database through the store (it reads committed state and writes whole
//! restored files while the actor is closed), and never reads the time of
//! day: commit times are passed in. The one clock it reads is the boot
//! clock, for the elapsed times of ADR 0007's collection grace. Its calls
//! are async (tokio, `object_store`); reading an [`Image`] is blocking and
//! belongs on a worker thread.

pub mod bucket;
mod clock;
pub mod entry;
pub mod error;
pub mod export;
pub mod image;
pub mod keys;
pub mod limits;
pub mod listing;
pub mod replica;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod usage;

pub use bucket::{Bucket, Metrics, MetricsSnapshot};
pub use entry::{Entry, Kind, Position, Token};
pub use error::ReplicaError;
pub use export::{At, export, export_to_path, export_with_progress};
pub use image::{Image, quick_check};
pub use keys::ActorRoot;
pub use limits::ReplicaConfig;
pub use replica::{
    Diff, Landed, Opened, Pages, Replica, SnapshotJob, Uploaded, Void, WholeFile, delete_all,
    may_be_ahead, put_back, set_aside, sidecar_path, void_sidecar,
};
