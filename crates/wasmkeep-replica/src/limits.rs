//! The replica's bounds and retention, in one place.
//!
//! Everything read from the bucket is untrusted input: another tenant's
//! node, an operator's mistake or an attacker with write access to the
//! bucket may have put anything there. Every object is bounded by
//! [`ReplicaConfig::entry_bytes_max`] before it is downloaded and while
//! it streams in, and every page count or page number in a body by
//! [`ReplicaConfig::database_pages_max`], before anything is allocated
//! from it. A listing of one actor's folder is read key by key and holds at
//! most [`ReplicaConfig::listing_keys_max`] keys, and a restore replays at
//! most [`ReplicaConfig::restore_entries_max`] entries and downloads at
//! most [`ReplicaConfig::restore_bytes_max`] bytes.

use crate::entry::{DIGEST_BYTES, FIXED_HEADER_BYTES};

/// Most bytes one object key may have: S3's limit, which the other stores
/// accept too.
pub const KEY_BYTES_MAX: usize = 1024;

/// Default of [`ReplicaConfig::listing_keys_max`]: at the default
/// retention an honest actor's restore lists at most three snapshots and
/// about `snapshot_every_entries` (1,000) entries; a hundred times that is
/// about 1.6 MiB of seqs and sizes held.
pub const LISTING_KEYS_MAX: u64 = 100_000;

/// Most changed pages a writer tracks between snapshots to build deltas
/// from (ADR 0037), about 2.5 MiB of page numbers and seqs per actor: past
/// it the next snapshot due is a whole one (a delta of more than 256 MiB
/// at 4 KiB pages saves little over one), and tracking starts over from
/// it.
pub const DELTA_PAGES_MAX: usize = 65_536;

/// Default of [`ReplicaConfig::snapshot_part_bytes`].
pub const SNAPSHOT_PART_BYTES: usize = 8 * 1024 * 1024;

/// Smallest part of a multipart upload S3 accepts (but the last).
pub const SNAPSHOT_PART_BYTES_MIN: usize = 5 * 1024 * 1024;

/// Default of [`ReplicaConfig::restore_entries_max`]: ten times the
/// default `snapshot_every_entries`.
pub const RESTORE_ENTRIES_MAX: u64 = 10_000;

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
    /// A snapshot or a delta (ADR 0037) is written after this many entries
    /// since the last of either.
    pub snapshot_every_entries: u64,
    /// A due snapshot is written as a delta (the pages changed since the
    /// last snapshot) while the delta's body stays within this share of the
    /// database's size, in percent; a larger one is written whole. 0
    /// writes no deltas.
    pub snapshot_delta_ratio_pct: u64,
    /// A snapshot is also written once the entries since the last one add up
    /// to this many times the database's size: restoring from the log would
    /// then read more than restoring from a snapshot. In percent. The same
    /// share of the entries since the last delta makes a delta (or a
    /// snapshot) due; the whole snapshot is what bounds the log the bucket
    /// keeps (entries go only once a whole snapshot covers them).
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
    /// Most keys one listing of an actor's `snap/` or `log/` folder may
    /// hold. Listings are read key by key as the store pages them; a
    /// listing that needs every key (restore, export, a writer's
    /// collection of `snap/`) fails past it with `listing_too_long`, for
    /// that actor only. Deleting (collection of `log/`, [`crate::delete_all`])
    /// works in batches of at most this many keys instead. At least
    /// [`LISTING_KEYS_MAX`] on a node, and raised by
    /// [`ReplicaConfig::raise_bounds_to_retention`] to what the retention
    /// can honestly leave.
    pub listing_keys_max: u64,
    /// Most entries above the latest snapshot one restore replays; a
    /// longer chain fails the restore with `restore_too_long` before
    /// anything is downloaded. A writer snapshots after
    /// `snapshot_every_entries`, so an honest chain has at most about that
    /// many.
    pub restore_entries_max: u64,
    /// Most bytes one restore downloads: the latest snapshot and every
    /// entry above it. Checked against the listed sizes before the first
    /// download, and each download is cut off where the remaining budget
    /// ends (the listing may lie). A writer snapshots once the log since
    /// the last snapshot outweighs the database (`snapshot_log_ratio_pct`),
    /// so an honest chain stays within a few times `entry_bytes_max`.
    pub restore_bytes_max: u64,
    /// Bytes of each part of a snapshot streamed from the local file
    /// (ADR 0036): the most a snapshot holds in memory at once is about
    /// three parts. A snapshot no larger is one create-only PUT; a larger
    /// one a multipart upload. At least [`SNAPSHOT_PART_BYTES_MIN`].
    pub snapshot_part_bytes: usize,
    /// Test-only mutation switch: a snapshot streamed from the local file
    /// does not check its pages against the head's hashes, so a file that
    /// changed under it is uploaded as the head's state. Never set
    /// outside tests.
    pub unsafe_snapshot_unverified: bool,
    /// Test-only mutation switch: deleting an actor does not wait for a
    /// snapshot streaming from its file, which may then land below the
    /// tombstone with the deleted life's data. Never set outside tests.
    pub unsafe_delete_ignores_snapshots: bool,
    /// Test-only mutation switch: read listings whole, whatever their
    /// length (the rule `listing_keys_max` enforces). A bucket with
    /// millions of keys under one actor then makes a node hold them all.
    /// Never set outside tests.
    pub unsafe_unbounded_listings: bool,
    /// Test-only mutation switch: never run the re-creation check after a
    /// create (the listing of `snap/`). Without it a writer that stalled
    /// past the grace and a collection re-creates a deleted key and believes
    /// it appended. Never set outside tests.
    pub unsafe_skip_append_check: bool,
    /// Test-only mutation switch: collect without waiting for the grace.
    /// Then a writer that skipped the check because its create was quick
    /// can re-create a key collected meanwhile. Never set outside tests.
    pub unsafe_collect_without_grace: bool,
    /// Test-only mutation switch: [`crate::delete_all`] erases the chain
    /// (deletes every key) instead of leaving a tombstone above it and
    /// erasing the old life's entries in place. The next life then starts
    /// again at seq 0, and a stale owner's late entry of the old life lands
    /// in it (ADR 0007, "Deleting an actor"). Never set outside tests.
    pub unsafe_delete_erases_chain: bool,
    /// Test-only mutation switch: a delta carries only the pages of the
    /// entries since the previous delta, not every page changed since its
    /// snapshot, so a restore through it misses pages. Never set outside
    /// tests.
    pub unsafe_delta_forgets_pages: bool,
    /// Test-only mutation switch: an upload of a whole file larger than
    /// one part creates its pointer in `log/` before its body is uploaded,
    /// so a body that fails part-way leaves the chain naming nothing.
    /// Never set outside tests.
    pub unsafe_pointer_before_body: bool,
    /// Test-only mutation switch: a local file whose sidecar names the
    /// head but which no longer hashes as it is kept as ahead of the head
    /// (`Opened::Ahead`) whatever boot of the machine wrote the sidecar,
    /// to whichever file: after a power cut that lost a commit the bucket
    /// holds, the next upload puts the older state over it. Never set
    /// outside tests.
    pub unsafe_keep_ahead_unchecked: bool,
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

    /// The bound a listing is read under: `listing_keys_max`, or none
    /// under the test-only `unsafe_unbounded_listings`.
    pub fn listing_bound(&self) -> u64 {
        if self.unsafe_unbounded_listings {
            u64::MAX
        } else {
            self.listing_keys_max.max(1)
        }
    }

    /// Raises the listing and restore bounds to at least what an honest
    /// chain can need under this configuration's snapshot policy and
    /// `entry_bytes_max` (a node sets those from its settings, then calls
    /// this). Saturates rather than overflows.
    ///
    /// - Entries above the latest snapshot: a snapshot follows at the
    ///   latest `snapshot_every_entries` entries after the last one (one
    ///   more while a failed snapshot is retried), so twice that.
    /// - Bytes of a restore: the snapshot and the database's worth of
    ///   log that makes the next one due are each at most
    ///   `entry_bytes_max`; the log runs to `snapshot_log_ratio_pct` of the
    ///   database or `snapshot_log_bytes_min`, whichever is larger, plus
    ///   the entry that crossed it. Twice that sum.
    /// - Keys in a listing a restore or an export needs whole: the
    ///   snapshots kept and the entries above the oldest of them, twice.
    pub fn raise_bounds_to_retention(&mut self) {
        let every = self.snapshot_every_entries.max(1);
        self.restore_entries_max = self
            .restore_entries_max
            .max(every.saturating_mul(2).saturating_add(2));
        let log = (self.entry_bytes_max / 100)
            .saturating_mul(self.snapshot_log_ratio_pct)
            .max(self.snapshot_log_bytes_min);
        let honest = self.entry_bytes_max.saturating_mul(2).saturating_add(log);
        self.restore_bytes_max = self.restore_bytes_max.max(honest.saturating_mul(2));
        let kept = (self.snapshots_keep as u64).saturating_add(1);
        let keys = kept
            .saturating_mul(every)
            .saturating_add(kept)
            .saturating_mul(2);
        self.listing_keys_max = self
            .listing_keys_max
            .max(keys)
            .max(self.restore_entries_max);
    }
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        let mut c = ReplicaConfig {
            entry_bytes_max: ReplicaConfig::entry_bytes_max_for(
                wasmkeep_store::StoreLimits::default().database_bytes_max,
            ),
            snapshot_every_entries: 1000,
            snapshot_delta_ratio_pct: 50,
            snapshot_log_ratio_pct: 100,
            snapshot_log_bytes_min: 4 * 1024 * 1024,
            snapshots_keep: 2,
            collect_grace_ms: COLLECT_GRACE_MS,
            listing_keys_max: LISTING_KEYS_MAX,
            restore_entries_max: RESTORE_ENTRIES_MAX,
            restore_bytes_max: 0,
            snapshot_part_bytes: SNAPSHOT_PART_BYTES,
            unsafe_snapshot_unverified: false,
            unsafe_delete_ignores_snapshots: false,
            unsafe_unbounded_listings: false,
            unsafe_skip_append_check: false,
            unsafe_collect_without_grace: false,
            unsafe_delete_erases_chain: false,
            unsafe_delta_forgets_pages: false,
            unsafe_pointer_before_body: false,
            unsafe_keep_ahead_unchecked: false,
        };
        c.raise_bounds_to_retention();
        c
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

    #[test]
    fn restore_bounds_follow_the_snapshot_policy_and_saturate() {
        let d = ReplicaConfig::default();
        assert_eq!(d.listing_keys_max, LISTING_KEYS_MAX);
        assert_eq!(d.restore_entries_max, RESTORE_ENTRIES_MAX);
        assert!(d.restore_bytes_max >= 3 * d.entry_bytes_max);
        assert!(d.listing_keys_max >= d.restore_entries_max);
        let mut rare = ReplicaConfig {
            snapshot_every_entries: 100_000,
            snapshots_keep: 5,
            snapshot_log_ratio_pct: 1_000,
            ..ReplicaConfig::default()
        };
        rare.raise_bounds_to_retention();
        assert!(rare.restore_entries_max > 100_000);
        assert!(rare.listing_keys_max > 6 * 100_000);
        assert!(rare.restore_bytes_max > 10 * rare.entry_bytes_max);
        let mut huge = ReplicaConfig {
            snapshot_every_entries: u64::MAX,
            snapshots_keep: usize::MAX,
            entry_bytes_max: u64::MAX,
            snapshot_log_ratio_pct: u64::MAX,
            ..ReplicaConfig::default()
        };
        huge.raise_bounds_to_retention();
        assert_eq!(huge.restore_entries_max, u64::MAX);
        assert_eq!(huge.restore_bytes_max, u64::MAX);
        assert_eq!(huge.listing_keys_max, u64::MAX);
        let unbounded = ReplicaConfig {
            unsafe_unbounded_listings: true,
            ..ReplicaConfig::default()
        };
        assert_eq!(unbounded.listing_bound(), u64::MAX);
    }
}
