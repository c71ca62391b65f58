//! The replica's bounds and retention, in one place.
//!
//! Everything read from the bucket is untrusted input: another tenant's
//! node, an operator's mistake or an attacker with write access to the
//! bucket may have put anything there. Every object is bounded by
//! [`ReplicaConfig::entry_bytes_max`] before it is downloaded and while
//! it streams in, and every page count or page number in a body by
//! [`ReplicaConfig::database_pages_max`], before anything is allocated
//! from it.

use crate::entry::{DIGEST_BYTES, FIXED_HEADER_BYTES};

/// Most bytes one object key may have: S3's limit, which the other stores
/// accept too.
pub const KEY_BYTES_MAX: usize = 1024;

/// Most bytes a body spends besides its pages: the fixed header, the
/// actor's key (shorter than a whole object key), the page count and the
/// digest.
pub const BODY_OVERHEAD_BYTES_MAX: u64 =
    (FIXED_HEADER_BYTES + KEY_BYTES_MAX + 4 + DIGEST_BYTES) as u64;

/// Bytes a body spends on each page besides its contents: its number.
pub const PAGE_NUMBER_BYTES: u64 = 4;

/// Smallest page size SQLite (and the entry format) accepts: the page
/// size at which a database of a given size takes the largest body.
pub const PAGE_BYTES_MIN: u32 = 512;

/// Largest page count SQLite can address (`max_page_count`'s ceiling).
pub const SQLITE_PAGES_MAX: u64 = 4_294_967_294;

/// Most problems `PRAGMA quick_check` reports for one restored image.
pub const QUICK_CHECK_ROWS_MAX: u32 = 8;

/// Longest report of `PRAGMA quick_check` kept in an error message.
pub const QUICK_CHECK_DETAIL_BYTES_MAX: usize = 1000;

/// The collection grace of ADR 0007: entries a snapshot covers are
/// deleted only once the snapshot is ten minutes old (as its collector
/// saw it).
pub const COLLECT_GRACE_MS: u64 = 10 * 60 * 1000;

/// Most pages of `page_bytes` one body within `entry_bytes_max` carries
/// (see [`ReplicaConfig::database_pages_max`]).
pub fn database_pages_max(entry_bytes_max: u64, page_bytes: u32) -> u32 {
    let room = entry_bytes_max.saturating_sub(BODY_OVERHEAD_BYTES_MAX);
    let pages = room / (page_bytes as u64 + PAGE_NUMBER_BYTES);
    // At most SQLITE_PAGES_MAX, which is below u32::MAX.
    pages.min(SQLITE_PAGES_MAX) as u32
}

/// How an actor's chain is bounded, snapshotted and kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// Largest entry or snapshot body written, downloaded or accepted, in
    /// bytes. A first upload and every snapshot carry the whole database,
    /// so a node sets it from its `database_bytes_max` with
    /// [`ReplicaConfig::entry_bytes_max_for`]. Objects in the bucket are
    /// checked against it before they are downloaded (the listing's size,
    /// then the GET's length) and while their bodies stream in, and it
    /// bounds the databases a restore builds
    /// ([`ReplicaConfig::database_pages_max`]).
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
    /// The `entry_bytes_max` that carries every page of a database of
    /// `database_bytes_max` bytes, whatever its page size: the body of a
    /// snapshot at the smallest page size, whose page numbers cost the
    /// most. Saturates rather than overflows.
    pub fn entry_bytes_max_for(database_bytes_max: u64) -> u64 {
        let pages = database_bytes_max.div_ceil(PAGE_BYTES_MIN as u64);
        pages
            .saturating_mul(PAGE_BYTES_MIN as u64 + PAGE_NUMBER_BYTES)
            .saturating_add(BODY_OVERHEAD_BYTES_MAX)
    }

    /// Most pages a database of `page_bytes` pages may have on this chain:
    /// as many as one snapshot within `entry_bytes_max` can carry. A chain
    /// whose database is larger could never have been snapshotted or
    /// uploaded whole under this configuration, so no writer that follows
    /// the rules made it. Page counts and page numbers decoded from a body
    /// are checked against it before the image is sized from them.
    pub fn database_pages_max(&self, page_bytes: u32) -> u32 {
        database_pages_max(self.entry_bytes_max, page_bytes)
    }

    /// A create answered sooner than this after the writer's previous
    /// chain operation was sent cannot have re-created a collected key.
    pub fn append_check_after_ms(&self) -> u64 {
        self.collect_grace_ms / 2
    }
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            entry_bytes_max: ReplicaConfig::entry_bytes_max_for(
                wasmkeep_store::StoreLimits::default().database_bytes_max,
            ),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_carries_the_default_database_at_any_page_size() {
        let c = ReplicaConfig::default();
        let database_bytes_max = wasmkeep_store::StoreLimits::default().database_bytes_max;
        for shift in 9..=16 {
            let page_bytes = 1u32 << shift;
            let pages = c.database_pages_max(page_bytes) as u64;
            assert!(
                pages * page_bytes as u64 >= database_bytes_max,
                "{page_bytes}"
            );
        }
    }

    #[test]
    fn page_bounds_follow_the_entry_bound_and_saturate() {
        let small = ReplicaConfig {
            entry_bytes_max: 1024 * 1024,
            ..ReplicaConfig::default()
        };
        let pages = small.database_pages_max(4096) as u64;
        assert!(pages * (4096 + PAGE_NUMBER_BYTES) + BODY_OVERHEAD_BYTES_MAX <= 1024 * 1024);
        assert!((pages + 1) * (4096 + PAGE_NUMBER_BYTES) + BODY_OVERHEAD_BYTES_MAX > 1024 * 1024);
        let tiny = ReplicaConfig {
            entry_bytes_max: 10,
            ..ReplicaConfig::default()
        };
        assert_eq!(tiny.database_pages_max(512), 0);
        let huge = ReplicaConfig {
            entry_bytes_max: u64::MAX,
            ..ReplicaConfig::default()
        };
        assert_eq!(huge.database_pages_max(512) as u64, SQLITE_PAGES_MAX);
        assert_eq!(ReplicaConfig::entry_bytes_max_for(u64::MAX), u64::MAX);
    }
}
