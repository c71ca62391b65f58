//! The replica's bounds and retention, in one place.

/// Most bytes one object key may have: S3's limit, which the other stores
/// accept too.
pub const KEY_BYTES_MAX: usize = 1024;

/// The collection grace of ADR 0007: entries a snapshot covers are
/// deleted only once the snapshot is ten minutes old (as its collector
/// saw it).
pub const COLLECT_GRACE_MS: u64 = 10 * 60 * 1000;

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
    /// How long a snapshot must have been known to this writer before the
    /// entries it covers are deleted, in milliseconds. A writer whose
    /// create was answered within half of this since its previous chain
    /// operation was sent skips the re-creation check (ADR 0007, "The
    /// collection grace"). Every node on one bucket must use the same
    /// value: it is a protocol constant that tests shorten, not a setting
    /// of `wasmkeep serve`.
    pub collect_grace_ms: u64,
    /// Test-only mutation switch: never run the re-creation check after a
    /// create (the listing of `snap/`). Without it a writer that stalled
    /// past the grace and a collection re-creates a deleted key and believes
    /// it appended. Never set outside tests.
    pub unsafe_skip_append_check: bool,
    /// Test-only mutation switch: collect without waiting for the grace.
    /// Then a writer that skipped the check because its create was quick
    /// can re-create a key collected meanwhile. Never set outside tests.
    pub unsafe_collect_without_grace: bool,
}

impl ReplicaConfig {
    /// A create answered sooner than this after the writer's previous
    /// chain operation was sent cannot have re-created a collected key.
    pub fn append_check_after_ms(&self) -> u64 {
        self.collect_grace_ms / 2
    }
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            entry_bytes_max: 11 * 1024 * 1024 * 1024,
            snapshot_every_entries: 1000,
            snapshot_log_ratio_pct: 100,
            snapshot_log_bytes_min: 4 * 1024 * 1024,
            snapshots_keep: 2,
            collect_grace_ms: COLLECT_GRACE_MS,
            unsafe_skip_append_check: false,
            unsafe_collect_without_grace: false,
        }
    }
}
