//! The replica's bounds and retention, in one place.

/// Most bytes one object key may have: S3's limit, which the other stores
/// accept too.
pub const KEY_BYTES_MAX: usize = 1024;

/// How an actor's chain is bounded, snapshotted and kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// Largest entry or snapshot body written or accepted. Must exceed the
    /// largest database (`database_bytes_max`) plus a header: a first upload
    /// and every snapshot carry the whole database.
    pub entry_bytes_max: u64,
    /// A snapshot is written after this many entries since the last one.
    pub snapshot_every_entries: u64,
    /// A snapshot is also written once the entries since the last one add up
    /// to this many times the database's size: restoring from the log would
    /// then read more than restoring from a snapshot. In percent.
    pub snapshot_log_ratio_pct: u64,
    /// ...but never before the entries since the last snapshot reach this
    /// many bytes: for a small database, reading a few megabytes of log is
    /// as quick as reading a snapshot, and writing a snapshot every few
    /// entries would double the PUTs.
    pub snapshot_log_bytes_min: u64,
    /// Snapshots kept (at least 1). Entries at or below the oldest kept
    /// snapshot are deleted; export reaches back to that snapshot.
    pub snapshots_keep: usize,
    /// Test-only mutation switch: skip the check after each create that no
    /// snapshot at or above the new entry exists. Without the check a writer
    /// that stalled past a collection can re-create a deleted key and believe
    /// it appended. Never set outside tests.
    pub unsafe_skip_append_check: bool,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            entry_bytes_max: 11 * 1024 * 1024 * 1024,
            snapshot_every_entries: 1000,
            snapshot_log_ratio_pct: 100,
            snapshot_log_bytes_min: 4 * 1024 * 1024,
            snapshots_keep: 2,
            unsafe_skip_append_check: false,
        }
    }
}
