//! Point in time: a plain SQLite database as the chain held it at a seq or
//! at a time, within what retention keeps.
//!
//! [`export_to_path`] is the checked way out: the file is written under a
//! temporary name beside its target, passes SQLite's `PRAGMA quick_check`
//! (as a restored image does before it replaces a local file) and only
//! then takes its name. [`export`] gives the bytes unchecked, for callers
//! that check them their own way. The snapshots' listing is bounded like a
//! restore's (`listing_keys_max`) and each object by `entry_bytes_max`; the
//! entries are listed a page of `listing_keys_max` at a time, and their
//! number is not bounded, since an export may start from an older snapshot
//! than a restore and is run deliberately, for one actor, by an operator.
//! Between whole snapshots the log may hold a database's worth of entries
//! (ADR 0037): an export starts from the newest delta at or before its
//! point when the snapshot it starts from has one.

use std::path::{Path, PathBuf};

use wasmkeep_store::ActorId;

use crate::bucket::Bucket;
use crate::entry::{Entry, FIXED_HEADER_BYTES, Kind};
use crate::error::ReplicaError;
use crate::image::{Image, quick_check};
use crate::keys::ActorRoot;
use crate::limits::ReplicaConfig;
use crate::replica::{Budget, apply_to, fetch, fetch_delta};

/// Which point of an actor's history to export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// The state right after the entry at this seq.
    Seq(u64),
    /// The state after the longest prefix of the chain whose entries were
    /// committed at or before this time (writers' clocks, milliseconds
    /// since the epoch).
    TimeMs(u64),
    /// The chain's head.
    Latest,
}

/// The database file's bytes at `at`, unchecked (see [`export_to_path`]).
/// `NotRetained` when retention has already dropped that point, or it is
/// beyond the chain, or the actor had no database then (its state at that
/// point is a tombstone: it was deleted, and the entries of its deleted
/// life were erased with it).
pub async fn export(
    bucket: &Bucket,
    id: &ActorId,
    at: At,
    config: &ReplicaConfig,
) -> Result<Vec<u8>, ReplicaError> {
    export_with_progress(bucket, id, at, config, &|_, _| {}).await
}

/// [`export`], calling `progress(objects_read, objects_to_read)` as it
/// reads the chain (for a progress bar).
pub async fn export_with_progress(
    bucket: &Bucket,
    id: &ActorId,
    at: At,
    config: &ReplicaConfig,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Vec<u8>, ReplicaError> {
    Ok(rebuild_at(bucket, id, at, config, progress)
        .await?
        .0
        .into_bytes())
}

/// Writes the database at `at` to `out` as a plain SQLite file, checked,
/// and returns its size; calls `progress` as [`export_with_progress`] does.
///
/// The bytes go to `out` with `.partial` appended, synced, and are checked
/// there with `PRAGMA quick_check` (read-only, `immutable`, defensive mode,
/// untrusted schema). A file that fails it is deleted and the export fails
/// with `restored_image_corrupt`, naming the last object applied; one that
/// passes is linked to `out`, which is never overwritten (an existing `out`
/// fails the export with `replica_io_error`, and nothing is left behind).
pub async fn export_to_path(
    bucket: &Bucket,
    id: &ActorId,
    at: At,
    config: &ReplicaConfig,
    out: &Path,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<u64, ReplicaError> {
    let (image, key) = rebuild_at(bucket, id, at, config, progress).await?;
    let staged = partial_path(out);
    let result = write_checked(image.bytes(), &staged, &key, out);
    // Whatever happened, nothing stays under the temporary name.
    let _ = std::fs::remove_file(&staged);
    result.map(|()| image.bytes().len() as u64)
}

/// `out` with `.partial` appended.
fn partial_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

/// Writes `bytes` to `staged` (synced), checks it, and links it to `out`.
fn write_checked(bytes: &[u8], staged: &Path, key: &str, out: &Path) -> Result<(), ReplicaError> {
    use std::io::Write;
    let mut f = std::fs::File::create(staged)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    quick_check(staged, key)?;
    // A link, unlike a rename, fails rather than replace an existing file.
    match std::fs::hard_link(staged, out) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(e.into()),
        // A filesystem without links: a rename, once the name is free.
        Err(_) if !out.exists() => std::fs::rename(staged, out)?,
        Err(e) => return Err(e.into()),
    }
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The newest delta from the snapshot at `base` that stands at or before
/// `at`, whose own entry is still listed: `(seq, listed size)`.
async fn delta_at(
    bucket: &Bucket,
    root: &ActorRoot,
    base: u64,
    at: At,
    bound: u64,
) -> Result<Option<(u64, u64)>, ReplicaError> {
    let deltas = bucket
        .list_seqs_sized(&root.deltas_of(base), None, bound)
        .await?;
    for &(seq, size) in deltas.iter().rev().filter(|(seq, _)| *seq > base) {
        let fits = match at {
            At::Latest => true,
            At::Seq(n) => seq <= n,
            At::TimeMs(t) => {
                let key = root.delta(base, seq);
                let head = bucket.get_prefix(&key, FIXED_HEADER_BYTES as u64).await?;
                Entry::peek_header(&key, &head)?.time_ms <= t
            }
        };
        if fits {
            let (entry, _) = bucket
                .lowest_seqs_sized(&root.log_dir(), seq..=seq, 1)
                .await?;
            return Ok((!entry.is_empty()).then_some((seq, size)));
        }
    }
    Ok(None)
}

/// The image at `at`, and the key of the last object applied to it.
async fn rebuild_at(
    bucket: &Bucket,
    id: &ActorId,
    at: At,
    config: &ReplicaConfig,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<(Image, String), ReplicaError> {
    let root = ActorRoot::new(id, bucket.prefix_bytes())?;
    let bound = config.listing_bound();
    let snaps = bucket
        .list_seqs_sized(&root.snap_dir(), None, bound)
        .await?;
    // The base: the newest snapshot at or before the point, with the size
    // the listing gave for it.
    let base = match at {
        At::Latest => snaps.last().copied(),
        At::Seq(n) => snaps.iter().rev().find(|(s, _)| *s <= n).copied(),
        At::TimeMs(t) => {
            let mut found = None;
            for &(s, size) in snaps.iter().rev() {
                let key = root.snap(s);
                let head = bucket.get_prefix(&key, FIXED_HEADER_BYTES as u64).await?;
                if Entry::peek_header(&key, &head)?.time_ms <= t {
                    found = Some((s, size));
                    break;
                }
            }
            found
        }
    };
    let base_seq = base.map(|(s, _)| s);
    let budget = &mut Budget::unbounded();
    let mut last_key = None;
    let (mut image, mut next) = match base {
        Some((s, size)) => {
            let e = fetch(bucket, &root, Kind::Snapshot, (s, size), config, budget).await?;
            if let At::TimeMs(t) = at
                && e.time_ms > t
            {
                return Err(ReplicaError::corrupt(
                    root.snap(s),
                    "header and body differ",
                ));
            }
            let mut img = None;
            apply_to(&mut img, &e)?;
            last_key = Some(root.snap(s));
            (img, s + 1)
        }
        None => (None, 0),
    };
    if let Some(s) = base_seq
        && let Some((seq, size)) = delta_at(bucket, &root, s, at, bound).await?
    {
        let e = fetch_delta(bucket, &root, (s, seq, size), config, budget).await?;
        apply_to(&mut image, &e)?;
        // The entry at the delta's seq is applied next, like a restore does.
        next = seq;
    }
    let head = bucket.highest_seq(&root.log_dir()).await?;
    let total = head.map_or(0, |h| (h + 1).saturating_sub(next)) + u64::from(base.is_some());
    let mut done = u64::from(base.is_some());
    progress(done, total);
    'pages: loop {
        let (logs, more) = bucket
            .lowest_seqs_sized(&root.log_dir(), next..=u64::MAX, bound)
            .await?;
        for &(seq, size) in &logs {
            if let At::Seq(n) = at
                && seq > n
            {
                break 'pages;
            }
            if seq != next {
                // Below the oldest entry kept (no base) or a gap.
                break 'pages;
            }
            let e = fetch(bucket, &root, Kind::Log, (seq, size), config, budget).await?;
            if let At::TimeMs(t) = at
                && e.time_ms > t
            {
                break 'pages;
            }
            apply_to(&mut image, &e)?;
            last_key = Some(root.log(seq));
            next += 1;
            done += 1;
            progress(done, total);
        }
        if !more || logs.is_empty() {
            break;
        }
    }
    let reached = next.checked_sub(1);
    let ok = match at {
        At::Seq(n) => reached == Some(n),
        At::TimeMs(_) | At::Latest => image.is_some(),
    };
    match (image, last_key) {
        (Some(img), Some(key)) if ok => Ok((img, key)),
        _ => Err(ReplicaError::NotRetained(format!(
            "{at:?} for actor=`{}` (reached seq {reached:?})",
            root.as_str()
        ))),
    }
}
