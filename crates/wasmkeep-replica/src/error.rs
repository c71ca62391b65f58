//! The replica's errors, each with a stable code.

use thiserror::Error;

/// Everything that can go wrong while replicating, restoring or exporting.
///
/// [`ReplicaError::code`] is stable and machine-readable; messages are
/// lowercase and end with the values involved.
#[derive(Debug, Error)]
pub enum ReplicaError {
    /// Someone else's entry holds the seq this writer meant to take, or a
    /// snapshot at or above it exists: the chain moved on without this
    /// writer. The caller gives the actor up (drops its instance and claim)
    /// and restores again before serving it.
    #[error("chain moved: another writer holds the chain at or after seq={seq}")]
    ChainMoved { seq: u64 },
    /// A body in the bucket (or a sidecar on disk) failed its checks.
    #[error("replica corrupt: {reason}: key=`{key}`")]
    Corrupt { key: String, reason: String },
    /// An entry or snapshot is larger than the configured bound.
    #[error("entry too large: size={size} limit entry_bytes_max={limit}")]
    EntryTooLarge { size: u64, limit: u64 },
    /// An object in the bucket is larger than the bound it is read under:
    /// refused from the listing's or the GET's size before its body is
    /// read, or as soon as the body streams past the bound. `size` is what
    /// the bucket claimed, or the bytes received when the body ran past it.
    #[error("bucket object too large: size={size} limit {limit_name}={limit} key=`{key}`")]
    ObjectTooLarge {
        key: String,
        size: u64,
        limit_name: &'static str,
        limit: u64,
    },
    /// A listing of one actor's folder holds more keys than a reader holds
    /// (`ReplicaConfig::listing_keys_max`); the listing was dropped as soon
    /// as it ran past the bound.
    #[error(
        "bucket listing too long: more than {limit} keys: limit listing_keys_max={limit} dir=`{dir}`"
    )]
    ListingTooLong { dir: String, limit: u64 },
    /// A restore would replay more entries, or download more bytes, than it
    /// is bounded to (`ReplicaConfig::restore_entries_max`,
    /// `restore_bytes_max`). `value` is what the listing counted, or the
    /// bytes received when a download ran past the budget; `key` is the
    /// object at which the bound was crossed.
    #[error("restore too long: {field}={value} limit {limit_name}={limit} key=`{key}`")]
    RestoreTooLong {
        key: String,
        field: &'static str,
        value: u64,
        limit_name: &'static str,
        limit: u64,
    },
    /// A body in the bucket describes a database larger than this node
    /// could ever have replicated (see `ReplicaConfig::database_pages_max`).
    #[error(
        "database in the bucket too large: {field}={value} limit database_pages_max={limit} key=`{key}`"
    )]
    DatabaseTooLarge {
        key: String,
        field: &'static str,
        value: u64,
        limit: u32,
    },
    /// The image a restore built from the bucket's bodies fails SQLite's
    /// `PRAGMA quick_check`; it was not installed. `key` is the object the
    /// image stands for (the chain's head).
    #[error("restored image corrupt: quick_check says {detail}: key=`{key}`")]
    ImageCorrupt { key: String, detail: String },
    /// Memory for a body or an image could not be reserved: the bounds
    /// allow it, but the node has no room now.
    #[error("out of memory: could not reserve bytes={bytes} for key=`{key}`")]
    OutOfMemory { key: String, bytes: u64 },
    /// The bucket's chain has a gap above the latest snapshot, or entries
    /// that do not follow each other.
    #[error("chain broken: {0}")]
    ChainBroken(String),
    /// An export asked for a point the bucket no longer (or never) holds.
    #[error("point not retained: {0}")]
    NotRetained(String),
    /// An actor's address fails the store's rules (an [`wasmkeep_store::ActorId`]
    /// built by hand, bypassing `ActorId::new`): a name over
    /// `name_bytes_max`, a bad tenant, app or class. Refused before any key
    /// is built.
    #[error("{0}")]
    InvalidName(wasmkeep_store::id::InvalidId),
    /// An actor's bucket key would exceed the object store's key length.
    #[error("key too long: size={size} limit key_bytes_max={limit}")]
    KeyTooLong { size: usize, limit: usize },
    /// `Bucket::from_url` could not make sense of its argument.
    #[error("invalid bucket url: {0}")]
    InvalidUrl(String),
    /// The object store failed (network, permissions, throttling, ...).
    #[error("bucket error: {0}")]
    Bucket(#[from] object_store::Error),
    /// Reading the local database through SQLite failed.
    #[error("sqlite error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A local file could not be read, written or renamed.
    #[error("local i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A snapshot streamed from the local file found a page that is not
    /// the head's (the file changed under it): nothing was completed in
    /// the bucket, and the snapshot is tried again later.
    #[error("snapshot torn: the local file's pages are not the head's: key=`{key}`")]
    SnapshotTorn { key: String },
}

impl ReplicaError {
    /// The stable code for this error.
    pub fn code(&self) -> &'static str {
        match self {
            ReplicaError::ChainMoved { .. } => "chain_moved",
            ReplicaError::Corrupt { .. } => "replica_corrupt",
            ReplicaError::EntryTooLarge { .. } => "entry_too_large",
            ReplicaError::ObjectTooLarge { .. } => "object_too_large",
            ReplicaError::DatabaseTooLarge { .. } => "database_too_large",
            ReplicaError::ListingTooLong { .. } => "listing_too_long",
            ReplicaError::RestoreTooLong { .. } => "restore_too_long",
            ReplicaError::ImageCorrupt { .. } => "restored_image_corrupt",
            ReplicaError::OutOfMemory { .. } => "replica_out_of_memory",
            ReplicaError::ChainBroken(_) => "chain_broken",
            ReplicaError::NotRetained(_) => "not_retained",
            ReplicaError::InvalidName(_) => "invalid_name",
            ReplicaError::KeyTooLong { .. } => "key_too_long",
            ReplicaError::InvalidUrl(_) => "invalid_bucket_url",
            ReplicaError::Bucket(_) => "bucket_error",
            ReplicaError::Sqlite(_) => "replica_sqlite_error",
            ReplicaError::Io(_) => "replica_io_error",
            ReplicaError::SnapshotTorn { .. } => "snapshot_torn",
        }
    }

    /// Whether the bucket said the object is missing (a listed entry that a
    /// concurrent collection removed): a restore that meets it starts over.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            ReplicaError::Bucket(object_store::Error::NotFound { .. })
        )
    }

    /// Whether the bucket holds something for this actor that fails its
    /// checks: every attempt to restore it fails the same way until someone
    /// repairs the chain, so a caller should report it as corruption of
    /// this actor, not as a failure worth retrying.
    pub fn is_bad_bucket_input(&self) -> bool {
        matches!(
            self,
            ReplicaError::Corrupt { .. }
                | ReplicaError::ObjectTooLarge { .. }
                | ReplicaError::DatabaseTooLarge { .. }
                | ReplicaError::ListingTooLong { .. }
                | ReplicaError::RestoreTooLong { .. }
                | ReplicaError::ImageCorrupt { .. }
        )
    }

    pub(crate) fn corrupt(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ReplicaError::Corrupt {
            key: key.into(),
            reason: reason.into(),
        }
    }
}
