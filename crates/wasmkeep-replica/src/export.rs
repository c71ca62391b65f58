//! Point in time: a plain SQLite database as the chain held it at a seq or
//! at a time, within what retention keeps.
//!
//! [`export_to_path`] is the checked way out: the file is rebuilt under a
//! temporary name beside its target, body by body as they stream in (a
//! page at a time in memory, whatever the database's size), passes
//! SQLite's `PRAGMA quick_check` (as a restored image does before it
//! replaces a local file) and only then takes its name. [`export`] gives
//! the bytes unchecked, for callers that check them their own way (and can
//! hold them). The snapshots' listing is bounded like a
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
use crate::image::quick_check;
use crate::keys::ActorRoot;
use crate::limits::ReplicaConfig;
use crate::replica::{Budget, Staged, stage};

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

impl std::fmt::Display for At {
    /// As a person reads it: `the latest state`, `seq 42`, `1764471600000 ms
    /// (unix)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::Latest => f.write_str("the latest state"),
            At::Seq(n) => write!(f, "seq {n}"),
            At::TimeMs(t) => write!(f, "{t} ms (unix)"),
        }
    }
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
/// reads the chain (for a progress bar). The database is rebuilt in a
/// temporary file (under the system's temporary folder) and read back.
pub async fn export_with_progress(
    bucket: &Bucket,
    id: &ActorId,
    at: At,
    config: &ReplicaConfig,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Vec<u8>, ReplicaError> {
    // A fresh random name, claimed before use (never an existing file or
    // a link someone left there).
    let nonce = crate::entry::Token::fresh(0)?.nonce;
    let path = std::env::temp_dir().join(format!("wasmkeep-export-{}", hex::encode(nonce)));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
    let result = rebuild_at(bucket, id, at, config, progress, &path).await;
    let bytes = result.and_then(|_| Ok(std::fs::read(&path)?));
    let _ = std::fs::remove_file(&path);
    bytes
}

/// Writes the database at `at` to `out` as a plain SQLite file, checked,
/// and returns its size; calls `progress` as [`export_with_progress`] does.
///
/// The database is rebuilt in `out` with `.partial` appended, body by
/// body as each streams in, synced, and checked there with `PRAGMA
/// quick_check` (read-only, `immutable`, defensive mode, untrusted
/// schema). A file that fails it is deleted and the export fails with
/// `restored_image_corrupt`, naming the last object applied; one that
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
    let staged = partial_path(out);
    let result = match rebuild_at(bucket, id, at, config, progress, &staged).await {
        Ok((bytes, key)) => link_checked(&staged, &key, out).map(|()| bytes),
        Err(e) => Err(e),
    };
    // Whatever happened, nothing stays under the temporary name.
    let _ = std::fs::remove_file(&staged);
    result
}

/// `out` with `.partial` appended.
fn partial_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

/// Checks the rebuilt file `staged` (synced), and links it to `out`.
fn link_checked(staged: &Path, key: &str, out: &Path) -> Result<(), ReplicaError> {
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
            At::TimeMs(t) => time_of(bucket, &root.delta(base, seq)).await? <= t,
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

/// Rebuilds the database at `at` in the file `path` (created or
/// truncated, synced at the end), body by body as each streams in; returns
/// its size and the key of the last object applied to it.
async fn rebuild_at(
    bucket: &Bucket,
    id: &ActorId,
    at: At,
    config: &ReplicaConfig,
    progress: &(dyn Fn(u64, u64) + Sync),
    path: &Path,
) -> Result<(u64, String), ReplicaError> {
    let root = ActorRoot::new(id, bucket.prefix_bytes())?;
    let bound = config.listing_bound();
    let snaps = bucket
        .list_seqs_sized(&root.snap_dir(), None, bound)
        .await?;
    let base = base_at(bucket, &root, &snaps, at).await?;
    let base_seq = base.map(|(s, _)| s);
    let budget = &mut Budget::unbounded();
    let staged = &mut Staged::create(path, root.as_str())?;
    let mut last_key = None;
    let mut next = 0;
    if let Some((s, size)) = base {
        let key = root.snap(s);
        let body = (Kind::Snapshot, key.clone());
        stage_before(bucket, &root, body, (s, size), config, budget, staged, at).await?;
        last_key = Some(key);
        next = s + 1;
    }
    if let Some(s) = base_seq
        && let Some((seq, size)) = delta_at(bucket, &root, s, at, bound).await?
    {
        let at = (Kind::Delta, root.delta(s, seq));
        stage(bucket, &root, at, (seq, size), config, budget, staged).await?;
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
            let key = root.log(seq);
            // Its pages are written as they stream in: the time is read
            // first, from the header alone.
            if let At::TimeMs(t) = at
                && time_of(bucket, &key).await? > t
            {
                break 'pages;
            }
            let body = (Kind::Log, key.clone());
            stage_before(bucket, &root, body, (seq, size), config, budget, staged, at).await?;
            last_key = Some(key);
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
        At::TimeMs(_) | At::Latest => staged.has_database(),
    };
    match last_key {
        Some(key) if ok && staged.has_database() => {
            staged.sync()?;
            Ok((staged.bytes(), key))
        }
        _ => Err(not_retained(id, at, reached)),
    }
}

/// The base of a rebuild at `at`: the newest snapshot at or before the
/// point, with the size the listing gave for it.
async fn base_at(
    bucket: &Bucket,
    root: &ActorRoot,
    snaps: &[(u64, u64)],
    at: At,
) -> Result<Option<(u64, u64)>, ReplicaError> {
    Ok(match at {
        At::Latest => snaps.last().copied(),
        At::Seq(n) => snaps.iter().rev().find(|(s, _)| *s <= n).copied(),
        At::TimeMs(t) => {
            let mut found = None;
            for &(s, size) in snaps.iter().rev() {
                if time_of(bucket, &root.snap(s)).await? <= t {
                    found = Some((s, size));
                    break;
                }
            }
            found
        }
    })
}

/// Why there is no database at `at`: nothing of the actor in the bucket,
/// or a history that does not reach that point (`reached`: the last seq
/// it reached).
fn not_retained(id: &ActorId, at: At, reached: Option<u64>) -> ReplicaError {
    ReplicaError::NotRetained(match reached {
        None => format!(
            "the bucket holds nothing of actor {id} at {at}: it was never uploaded there, \
             was deleted, or retention dropped that point"
        ),
        Some(r) => format!(
            "actor {id} has no database at {at} in the bucket: its history there reaches \
             seq {r}, retention may have dropped older points, and a deleted life leaves \
             none"
        ),
    })
}

/// [`stage`], for a body whose header said it was written no later than
/// `at` (when `at` is a time): the body must say so too.
#[allow(clippy::too_many_arguments)]
async fn stage_before(
    bucket: &Bucket,
    root: &ActorRoot,
    (kind, key): (Kind, String),
    listed: (u64, u64),
    config: &ReplicaConfig,
    budget: &mut Budget,
    staged: &mut Staged,
    at: At,
) -> Result<(), ReplicaError> {
    let e = stage(
        bucket,
        root,
        (kind, key.clone()),
        listed,
        config,
        budget,
        staged,
    )
    .await?;
    match at {
        At::TimeMs(t) if e.time_ms > t => Err(ReplicaError::corrupt(key, "header and body differ")),
        _ => Ok(()),
    }
}

/// The time in the header of the body at `key`, read from its first bytes
/// (unchecked: the whole body is checked when it is applied).
async fn time_of(bucket: &Bucket, key: &str) -> Result<u64, ReplicaError> {
    let head = bucket.get_prefix(key, FIXED_HEADER_BYTES as u64).await?;
    Ok(Entry::peek_header(key, &head)?.time_ms)
}
