//! One actor's replica: restoring it from the bucket, and appending its
//! changes to the chain as their owner.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use wasmkeep_store::ActorId;

use crate::bucket::{Bucket, Created};
use crate::clock::since_boot;
use crate::entry::{BodyReader, Entry, FIXED_HEADER_BYTES, Kind, PageSink, Position, Token};
use crate::error::ReplicaError;
use crate::image::{Image, PageHashes, TreeDigest, quick_check};
use crate::keys::{ActorRoot, parse_delta, parse_whole};
use crate::limits::PAGE_NUMBER_BYTES;
use crate::limits::{DELTA_PAGES_MAX, ReplicaConfig, SNAPSHOT_PART_BYTES_MIN};

/// Most entries a writer remembers since its last snapshot (see
/// `Replica::recent`); past it the oldest are forgotten (a streamed
/// snapshot landing then counts fewer entries after it than there are,
/// which the policy's count rule catches up with at the next entries).
const RECENT_ENTRIES_MAX: usize = 100_000;

/// Streamed snapshots that may fail (the bucket refusing them) before an
/// overdue one is written from the whole database instead (see
/// [`Replica::overdue_may_stream`]).
const STREAM_FAILURES_MAX: u32 = 2;

/// Restarts of a restore whose listed objects vanished under it (a
/// concurrent collection) before it reports the error.
const RESTORE_ATTEMPTS_MAX: usize = 3;

/// What [`Replica::open`] did with the local file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// The local file holds the bucket's latest position: nothing was
    /// downloaded.
    UpToDate,
    /// The bucket's version was written to the local path. A local file
    /// that was there (not matching) was set aside under `replaced`.
    Restored { replaced: Option<PathBuf> },
    /// The bucket has nothing for this actor. The local file (if `local`)
    /// is untouched; the first upload creates `log/0` with every page.
    BucketEmpty { local: bool },
    /// The bucket has nothing for this actor, and the local file held only
    /// commits that were given up (voided as [`Void::NewActor`], with no
    /// sidecar: a new actor whose first upload failed, whose clients were
    /// told so). It was set aside under `replaced`, never deleted; the
    /// actor starts again with no data, and its first upload creates
    /// `log/0`.
    SetAside { replaced: PathBuf },
    /// The local file holds commits past the bucket's head that were never
    /// uploaded: its sidecar names the head, and was written in this boot
    /// of the machine to this very file (a crash of the process that wrote
    /// it loses nothing of the page cache), yet the file no longer hashes
    /// as the head. It is kept; the next upload carries every page of it
    /// above the head (ADR 0082).
    Ahead,
    /// The bucket's latest state is a tombstone: the actor was deleted and
    /// has no data. A local file (from before the deletion, or commits of a
    /// new life never uploaded) was set aside under `replaced`, never
    /// deleted. The next upload continues the chain above the tombstone
    /// with every page.
    Deleted { replaced: Option<PathBuf> },
}

/// The bucket's view of one actor's chain: the snapshots, the newest
/// delta from the latest snapshot, and the entries a restore replays (above
/// the latest snapshot, or from the delta's seq on), each as `(seq, bytes
/// the listing gives)`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Listing {
    pub snaps: Vec<(u64, u64)>,
    /// The delta a restore applies on the latest snapshot, if there is one
    /// whose own entry is listed: `(seq, bytes)`. `logs` then starts at its
    /// seq (that entry is replayed again: it carries the head's token and
    /// writes what the delta wrote).
    pub delta: Option<(u64, u64)>,
    pub logs: Vec<(u64, u64)>,
}

impl Listing {
    pub(crate) fn head(&self) -> Option<u64> {
        self.logs.last().or(self.snaps.last()).map(|(seq, _)| *seq)
    }

    pub(crate) fn snap_seqs(&self) -> Vec<u64> {
        self.snaps.iter().map(|(seq, _)| *seq).collect()
    }
}

/// Lists the chain: every snapshot, and the entries above the latest one
/// (entries at or below it are not listed at all on S3, where the listing
/// starts after a key). Each listing holds at most `listing_keys_max` keys.
pub(crate) async fn list_chain(
    bucket: &Bucket,
    root: &ActorRoot,
    config: &ReplicaConfig,
) -> Result<Listing, ReplicaError> {
    let bound = config.listing_bound();
    let snaps = bucket
        .list_seqs_sized(&root.snap_dir(), None, bound)
        .await?;
    let Some(&(base, _)) = snaps.last() else {
        let logs = bucket.list_seqs_sized(&root.log_dir(), None, bound).await?;
        return Ok(Listing {
            snaps,
            delta: None,
            logs,
        });
    };
    // The newest delta from the latest snapshot, if its entry is there
    // (entries above the latest snapshot are never collected, so it is,
    // unless someone tampered with the folder: then restore without it).
    let deltas = bucket
        .list_seqs_sized(&root.deltas_of(base), None, bound)
        .await?;
    if let Some(&(seq, size)) = deltas.iter().rev().find(|(seq, _)| *seq > base) {
        let logs = bucket
            .list_seqs_sized(&root.log_dir(), Some(&root.log(seq - 1)), bound)
            .await?;
        if logs.first().map(|(s, _)| *s) == Some(seq) {
            return Ok(Listing {
                snaps,
                delta: Some((seq, size)),
                logs,
            });
        }
    }
    let logs = bucket
        .list_seqs_sized(&root.log_dir(), Some(&root.log(base)), bound)
        .await?;
    Ok(Listing {
        snaps,
        delta: None,
        logs,
    })
}

/// Bytes a reader may still download, against the bound it names.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    left: u64,
    limit_name: &'static str,
    limit: u64,
}

impl Budget {
    /// A budget of `limit` bytes, named `limit_name` in errors.
    pub(crate) fn new(limit_name: &'static str, limit: u64) -> Budget {
        Budget {
            left: limit,
            limit_name,
            limit,
        }
    }

    /// No bound besides each object's own.
    pub(crate) fn unbounded() -> Budget {
        Budget::new("unbounded", u64::MAX)
    }

    /// The error for crossing the budget at `key` with `spent` bytes.
    fn crossed(&self, key: &str, spent: u64) -> ReplicaError {
        ReplicaError::RestoreTooLong {
            key: key.to_owned(),
            field: "bytes",
            value: spent,
            limit_name: self.limit_name,
            limit: self.limit,
        }
    }

    fn spent_before(&self) -> u64 {
        self.limit - self.left
    }
}

/// Refuses an object whose listed size is over `entry_bytes_max`, before
/// anything of it is downloaded.
pub(crate) fn check_listed(
    key: &str,
    listed: u64,
    config: &ReplicaConfig,
) -> Result<(), ReplicaError> {
    if listed > config.entry_bytes_max {
        return Err(ReplicaError::ObjectTooLarge {
            key: key.to_owned(),
            size: listed,
            limit_name: "entry_bytes_max",
            limit: config.entry_bytes_max,
        });
    }
    Ok(())
}

/// Downloads one body, handing the pages to `sink` as they stream in (one
/// page in memory), bounded by `entry_bytes_max` before the download
/// (`listed`: the size the listing gave) and during it, and by what is left
/// of `budget` (which it spends). The body is checked as [`Entry::decode`]
/// does, and its kind, seq and actor against its key, before this returns
/// its header (so a sink keeps nothing until then).
///
/// A pointer in `log/` (ADR 0038) is followed once: the body it names is
/// read into `sink` the same way and must be a log entry of the same seq,
/// token and size, which is what this returns. A sink ignores a pointer's
/// header.
async fn fetch_into(
    bucket: &Bucket,
    root: &ActorRoot,
    (kind, key): (Kind, &str),
    at: (u64, u64),
    config: &ReplicaConfig,
    budget: &mut Budget,
    sink: &mut impl PageSink,
) -> Result<Entry, ReplicaError> {
    let e = fetch_one(bucket, root, (kind, key), at, config, budget, sink).await?;
    if e.kind != Kind::Pointer {
        return Ok(e);
    }
    // Its size is not listed: the download itself is bounded (by
    // `entry_bytes_max` and what is left of the budget).
    let target = root.whole(e.seq, &e.token);
    let body = fetch_one(
        bucket,
        root,
        (Kind::Log, &target),
        (e.seq, 0),
        config,
        budget,
        sink,
    )
    .await?;
    if body.kind != Kind::Log || body.token != e.token || body.db_pages != e.db_pages {
        return Err(ReplicaError::corrupt(
            target,
            format!(
                "is not the body its pointer names: kind={:?} token={} db_pages={} (the pointer at `{key}` says token={} db_pages={})",
                body.kind, body.token, body.db_pages, e.token, e.db_pages
            ),
        ));
    }
    Ok(body)
}

/// One body of [`fetch_into`], pointer or not.
async fn fetch_one(
    bucket: &Bucket,
    root: &ActorRoot,
    (kind, key): (Kind, &str),
    (seq, listed): (u64, u64),
    config: &ReplicaConfig,
    budget: &mut Budget,
    sink: &mut impl PageSink,
) -> Result<Entry, ReplicaError> {
    let key = key.to_owned();
    check_listed(&key, listed, config)?;
    if listed > budget.left {
        return Err(budget.crossed(&key, budget.spent_before().saturating_add(listed)));
    }
    let (limit_name, limit) = if budget.left < config.entry_bytes_max {
        (budget.limit_name, budget.left)
    } else {
        ("entry_bytes_max", config.entry_bytes_max)
    };
    let mut reader = BodyReader::new(&key, config.entry_bytes_max);
    let spent = budget.spent_before();
    let received = match bucket
        .get_streamed(&key, limit_name, limit, |chunk| reader.feed(chunk, sink))
        .await
    {
        Err(ReplicaError::ObjectTooLarge { size, .. }) if limit_name == budget.limit_name => {
            return Err(budget.crossed(&key, spent.saturating_add(size)));
        }
        other => other?,
    };
    budget.left -= received;
    let e = reader.finish()?;
    if !e.kind.fits(kind) || e.seq != seq || e.actor != root.as_str() {
        return Err(ReplicaError::corrupt(
            key,
            format!(
                "body says kind={:?} seq={} actor=`{}`",
                e.kind, e.seq, e.actor
            ),
        ));
    }
    Ok(e)
}

/// Refuses, before anything is downloaded, a restore of `listing` that
/// cannot finish within its bounds: an object over `entry_bytes_max`, more
/// entries above the snapshot than `restore_entries_max`, or listed sizes
/// that add up to more than `restore_bytes_max`.
fn check_restore(
    root: &ActorRoot,
    listing: &Listing,
    config: &ReplicaConfig,
) -> Result<(), ReplicaError> {
    let entries = listing.logs.len() as u64;
    if entries > config.restore_entries_max {
        // The first entry past the bound names where it was crossed.
        let at = listing.logs[config.restore_entries_max as usize].0;
        return Err(ReplicaError::RestoreTooLong {
            key: root.log(at),
            field: "entries",
            value: entries,
            limit_name: "restore_entries_max",
            limit: config.restore_entries_max,
        });
    }
    let snap = listing
        .snaps
        .last()
        .map(|&(seq, size)| (root.snap(seq), size));
    let delta = listing.delta.zip(snap.as_ref()).map(|((seq, size), _)| {
        let base = listing.snaps.last().map_or(0, |s| s.0);
        (root.delta(base, seq), size)
    });
    let logs = listing
        .logs
        .iter()
        .map(|&(seq, size)| (root.log(seq), size));
    let mut total: u64 = 0;
    for (key, size) in snap.into_iter().chain(delta).chain(logs) {
        check_listed(&key, size, config)?;
        total = total.saturating_add(size);
        if total > config.restore_bytes_max {
            return Err(ReplicaError::RestoreTooLong {
                key,
                field: "bytes",
                value: total,
                limit_name: "restore_bytes_max",
                limit: config.restore_bytes_max,
            });
        }
    }
    Ok(())
}

/// A database being rebuilt from the bucket in its staging file, body by
/// body, as [`Image::apply`] does in memory: a snapshot (or a body on an
/// empty state) starts it over, a log entry sets its size and overwrites
/// its pages and may grow it only by pages it carries, a tombstone leaves
/// no database. A body that fails its checks fails the whole restore, and
/// the staging file is deleted.
pub(crate) struct Staged {
    file: std::fs::File,
    page_size: u32,
    /// The database's size in pages (0: none yet, or deleted).
    pages: u32,
    deleted: bool,
    /// The body being read: the size before it, the size it sets, and the
    /// pages it carried beyond the old size.
    before: u32,
    target: u32,
    carried: u32,
    actor: String,
}

impl PageSink for Staged {
    fn header(&mut self, head: &Entry, _count: u32) -> Result<(), ReplicaError> {
        if head.kind == Kind::Pointer {
            // The body it names follows, with a header of its own.
            return Ok(());
        }
        if !head.kind.applies_on_top() || self.pages == 0 {
            self.file.set_len(0)?;
            self.pages = 0;
            self.page_size = head.page_size;
        }
        self.deleted = head.kind == Kind::Tombstone;
        if head.page_size != self.page_size {
            return Err(ReplicaError::ChainBroken(format!(
                "entry at seq={} has page_size={} but the database has {}",
                head.seq, head.page_size, self.page_size
            )));
        }
        self.before = self.pages;
        self.target = head.db_pages;
        self.carried = 0;
        Ok(())
    }

    fn page(&mut self, no: u32, page: &[u8]) -> Result<(), ReplicaError> {
        use std::os::unix::fs::FileExt;
        if no > self.before {
            self.carried += 1;
        }
        self.file
            .write_all_at(page, (no as u64 - 1) * self.page_size as u64)?;
        Ok(())
    }
}

impl Staged {
    /// An empty staging file at `path` (created, or truncated) for the
    /// chain of the actor at `actor` (its root).
    pub(crate) fn create(path: &Path, actor: &str) -> Result<Staged, ReplicaError> {
        Ok(Staged {
            file: std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(path)?,
            page_size: 0,
            pages: 0,
            deleted: false,
            before: 0,
            target: 0,
            carried: 0,
            actor: actor.to_owned(),
        })
    }

    /// Whether the bodies staged so far leave a database (none before the
    /// first, none after a tombstone).
    pub(crate) fn has_database(&self) -> bool {
        !self.deleted && self.pages > 0
    }

    /// The database's size in bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.pages as u64 * self.page_size as u64
    }

    /// Makes what was staged durable.
    pub(crate) fn sync(&self) -> Result<(), ReplicaError> {
        Ok(self.file.sync_all()?)
    }

    /// After a body's checksum held: it may grow the database only by
    /// pages it carries; then the file takes the size it sets.
    fn body_done(&mut self, key: &str) -> Result<(), ReplicaError> {
        let grows_by = self.target.saturating_sub(self.before);
        if self.carried != grows_by {
            return Err(ReplicaError::corrupt(
                key,
                format!(
                    "grows the database by pages={grows_by} but carries {} of them: db_pages={} before={}",
                    self.carried, self.target, self.before
                ),
            ));
        }
        self.file
            .set_len(self.target as u64 * self.page_size as u64)?;
        self.pages = self.target;
        Ok(())
    }

    /// The page hashes of the rebuilt file, read back in order.
    fn hashes(&self) -> Result<PageHashes, ReplicaError> {
        use std::os::unix::fs::FileExt;
        let ps = self.page_size as usize;
        let mut leaves = Vec::new();
        leaves
            .try_reserve_exact(self.pages as usize)
            .map_err(|_| ReplicaError::OutOfMemory {
                key: self.actor.clone(),
                bytes: self.pages as u64 * 32,
            })?;
        let mut chunk = vec![0u8; ps * 256];
        let mut no = 0u64;
        while no < self.pages as u64 {
            let n = (self.pages as u64 - no).min(256) as usize;
            self.file
                .read_exact_at(&mut chunk[..n * ps], no * ps as u64)?;
            leaves.extend(
                chunk[..n * ps]
                    .chunks(ps)
                    .map(|p| -> [u8; 32] { <sha2::Sha256 as sha2::Digest>::digest(p).into() }),
            );
            no += n as u64;
        }
        Ok(PageHashes::from_leaves(self.page_size, leaves))
    }
}

/// Streams the body at `key` into `staged` and checks what it did to the
/// database's size.
pub(crate) async fn stage(
    bucket: &Bucket,
    root: &ActorRoot,
    (kind, key): (Kind, String),
    at: (u64, u64),
    config: &ReplicaConfig,
    budget: &mut Budget,
    staged: &mut Staged,
) -> Result<Entry, ReplicaError> {
    let e = fetch_into(bucket, root, (kind, &key), at, config, budget, staged).await?;
    staged.body_done(&key)?;
    Ok(e)
}

/// [`rebuild`], into the staging file `path` instead of memory: what a
/// restore installs. Returns the page hashes of the rebuilt database
/// (`None` when the head is a tombstone), the head's position and time,
/// and the entries (count, bytes) since the snapshot. The file is synced.
async fn rebuild_staged(
    bucket: &Bucket,
    root: &ActorRoot,
    listing: &Listing,
    config: &ReplicaConfig,
    path: &Path,
) -> Result<(Option<PageHashes>, Position, u64, u64, u64), ReplicaError> {
    check_restore(root, listing, config)?;
    let budget = &mut Budget::new("restore_bytes_max", config.restore_bytes_max);
    make_folders(path.parent().unwrap_or(Path::new(".")))?;
    let mut staged = Staged::create(path, root.as_str())?;
    let (mut next, mut pos, mut time) = match listing.snaps.last() {
        Some(&(s, size)) => {
            let at = (Kind::Snapshot, root.snap(s));
            let e = stage(bucket, root, at, (s, size), config, budget, &mut staged).await?;
            (s + 1, Some(e.position()), e.time_ms)
        }
        None => (0, None, 0),
    };
    if let (Some(&(base, _)), Some((seq, size))) = (listing.snaps.last(), listing.delta) {
        // Every page that changed from the snapshot to `seq`: the entries
        // between are skipped, the one at `seq` is replayed next.
        let at = (Kind::Delta, root.delta(base, seq));
        stage(bucket, root, at, (seq, size), config, budget, &mut staged).await?;
        next = seq;
    }
    let mut bytes = 0;
    for &(seq, size) in &listing.logs {
        if seq != next {
            return Err(ReplicaError::ChainBroken(format!(
                "expected seq={next} next, found seq={seq}: actor=`{}`",
                root.as_str()
            )));
        }
        let before = budget.left;
        let at = (Kind::Log, root.log(seq));
        let e = stage(bucket, root, at, (seq, size), config, budget, &mut staged).await?;
        bytes += before - budget.left;
        pos = Some(e.position());
        time = e.time_ms;
        next += 1;
    }
    let pos = pos.ok_or_else(|| ReplicaError::ChainBroken("empty chain".into()))?;
    if staged.deleted {
        return Ok((None, pos, time, listing.logs.len() as u64, bytes));
    }
    staged.sync()?;
    let hashes = staged.hashes()?;
    Ok((Some(hashes), pos, time, listing.logs.len() as u64, bytes))
}

// ---- the sidecar ----

/// Marks the local database at `db_path` as one whose commits the bucket
/// must not take from it (ADR 0082): its owner gave it up after an upload
/// failed and answered `replicated` requests with an error. From then on
/// its sidecar counts for nothing, whatever an upload still in flight
/// writes into it: the next [`Replica::open`] restores from the bucket and
/// sets the file aside, never keeping it as ahead of the head (or, for
/// [`Void::NewActor`] with nothing in the bucket, sets it aside:
/// [`Opened::SetAside`]). A new actor's mark (with no sidecar beside it)
/// and its folder's entry are synced before this returns: the commits it
/// voids are durable through the node's commit log, and after a power cut
/// only the mark tells. Other marks need no sync: after a reboot a sidecar
/// no longer keeps its file, and a file with neither is kept either way.
/// An actor whose folder is gone (deleted meanwhile) has nothing to void.
/// The restore removes the mark.
pub fn void_sidecar(db_path: &Path, void: Void) -> std::io::Result<()> {
    let mark = match std::fs::File::create(void_path(db_path)) {
        Ok(mark) => mark,
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && db_path.parent().is_some_and(|dir| !dir.exists()) =>
        {
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    if void == Void::Commits {
        return Ok(());
    }
    (&mark).write_all(NEW_ACTOR_MARK)?;
    if sidecar_path(db_path).exists() {
        return Ok(());
    }
    mark.sync_all()?;
    match db_path.parent() {
        Some(dir) => wasmkeep_store::sync::sync_dir(dir),
        None => Ok(()),
    }
}

/// What a give-up voids ([`void_sidecar`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Void {
    /// The commits past the sidecar's position (with no sidecar, nothing:
    /// a file of data the bucket has not seen yet is kept).
    Commits,
    /// Everything in the file: the actor was new in the opening that gave
    /// it up (no local data, nothing in the bucket), so every commit in it
    /// was made since, and none of them reached a bucket.
    NewActor,
}

/// What a [`Void::NewActor`] mark holds; any other mark is
/// [`Void::Commits`].
const NEW_ACTOR_MARK: &[u8] = b"new-actor\n";

/// The kind of void mark beside `db_path`, if any.
fn read_void(db_path: &Path) -> Option<Void> {
    let bytes = std::fs::read(void_path(db_path)).ok()?;
    Some(if bytes == NEW_ACTOR_MARK {
        Void::NewActor
    } else {
        Void::Commits
    })
}

/// The mark [`void_sidecar`] leaves.
fn void_path(db_path: &Path) -> PathBuf {
    with_suffix(db_path, ".replica-void")
}

/// Removes the mark [`void_sidecar`] left, if any.
fn unvoid(db_path: &Path) -> Result<(), ReplicaError> {
    match std::fs::remove_file(void_path(db_path)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// The file next to the local database that records which chain position
/// the local file holds, and the SHA-256 of the file at that position.
pub fn sidecar_path(db_path: &Path) -> PathBuf {
    let mut s = db_path.as_os_str().to_owned();
    s.push(".replica");
    PathBuf::from(s)
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Sidecar {
    position: Position,
    /// [`PageHashes::digest_hex`] of the file at `position` (or, in a
    /// sidecar written before page capture, the SHA-256 of the whole file).
    digest: Digest,
    /// The machine's boot and the database file's identity when the
    /// sidecar was written (`None` in a sidecar from before ADR 0082, or
    /// where the system does not tell them): see [`Sidecar::written_here`].
    written: Option<Written>,
    /// The wall-clock time (ms) by which every commit of the state at
    /// `position` was made: a commit past it was made later (see
    /// [`may_be_ahead`]). `None` in a sidecar from before ADR 0082.
    covers_ms: Option<u64>,
}

/// Where a sidecar was written: in which boot of the machine, to which
/// file (inode and birth time).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Written {
    boot: String,
    file: String,
}

impl Written {
    /// This boot, and the identity of the file at `db_path` now.
    fn now(db_path: &Path) -> Option<Written> {
        Some(Written {
            boot: boot_id()?.to_owned(),
            file: file_identity(db_path)?,
        })
    }
}

impl Sidecar {
    /// A sidecar for `db_path` at `position`, whose state hashes as
    /// `digest` and holds every commit made by `covers_ms`, written now.
    fn new(db_path: &Path, position: Position, digest: Digest, covers_ms: u64) -> Sidecar {
        Sidecar {
            position,
            digest,
            written: Written::now(db_path),
            covers_ms: Some(covers_ms),
        }
    }

    /// Whether this sidecar was written in this boot of the machine to the
    /// file now at `db_path`. Then every commit it covers is in the file:
    /// the process that uploaded them had committed them to this file
    /// first, and a crash of a process keeps what it wrote (the kernel
    /// holds it), so the file holds the head's state or commits past it.
    /// After a reboot (a power cut) the file may have lost commits the
    /// bucket holds (a node without fsync, an upload that landed before its
    /// commit was durable here), and a file put in its place may be
    /// anything: neither says the file is ahead.
    fn written_here(&self, db_path: &Path) -> bool {
        self.written.is_some() && self.written == Written::now(db_path)
    }
}

/// How much earlier than a sidecar's `covers_ms` a file's modification
/// time may read and still count as a commit past it: filesystems stamp
/// times from a coarse clock (a tick behind the one commits read).
const MTIME_SLACK_MS: u64 = 1_000;

/// Whether the local database at `db_path` may hold commits past the
/// bucket's head that no upload carried, as a crash of the process that
/// wrote it leaves them (ADR 0082): its sidecar was written in this boot
/// to this file, and the database or its log was modified after the
/// sidecar's state was taken. A node that did not stop cleanly opens such
/// actors at its start, so that [`Replica::open`] finds them ahead and
/// their next upload ships them without waiting for a request. `false`
/// without a sidecar (the first upload's business) or for one from another
/// boot (the open restores). A file only checkpointed since is a false
/// alarm: its open finds it up to date.
pub fn may_be_ahead(db_path: &Path) -> bool {
    let Some(side) = read_sidecar(db_path) else {
        return false;
    };
    if !side.written_here(db_path) {
        return false;
    }
    let Some(covers_ms) = side.covers_ms else {
        return true;
    };
    let modified_ms = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64)
    };
    let newest = modified_ms(db_path).max(modified_ms(&with_suffix(db_path, "-wal")));
    newest.saturating_add(MTIME_SLACK_MS) >= covers_ms
}

/// This boot of the machine as Linux names it (`None` elsewhere), read
/// once.
fn boot_id() -> Option<&'static str> {
    static BOOT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    BOOT.get_or_init(|| {
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let id = id.trim();
        (!id.is_empty() && !id.contains(char::is_whitespace)).then(|| id.to_owned())
    })
    .as_deref()
}

/// The identity of the file at `path`: its inode and birth time, which a
/// file put in its place does not share (`None` where the filesystem keeps
/// no birth time).
fn file_identity(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    let born = m
        .created()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    Some(format!("{}:{}", m.ino(), born.as_nanos()))
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Digest {
    Pages(String),
    WholeFile(String),
}

impl Digest {
    /// Whether `image` (whose page hashes are `hashes`) is the file this
    /// digest was taken of.
    fn matches(&self, image: &Image, hashes: &PageHashes) -> bool {
        match self {
            Digest::Pages(d) => *d == hashes.digest_hex(),
            Digest::WholeFile(d) => *d == image.digest_hex(),
        }
    }
}

fn read_sidecar(db_path: &Path) -> Option<Sidecar> {
    if void_path(db_path).exists() {
        return None;
    }
    let text = std::fs::read_to_string(sidecar_path(db_path)).ok()?;
    let mut lines = text.lines();
    if lines.next()? != "wasmkeep-replica-sidecar 1" {
        return None;
    }
    let mut seq = None;
    let mut token = None;
    let mut sha = None;
    let (mut boot, mut file, mut covers_ms) = (None, None, None);
    for l in lines {
        match l.split_once('=') {
            Some(("seq", v)) => seq = v.parse().ok(),
            Some(("token", v)) => token = v.parse().ok(),
            Some(("pages_sha256", v)) => sha = Some(Digest::Pages(v.to_owned())),
            Some(("sha256", v)) if sha.is_none() => sha = Some(Digest::WholeFile(v.to_owned())),
            Some(("boot", v)) => boot = Some(v.to_owned()),
            Some(("file", v)) => file = Some(v.to_owned()),
            Some(("covers_ms", v)) => covers_ms = v.parse().ok(),
            _ => {}
        }
    }
    Some(Sidecar {
        position: Position {
            seq: seq?,
            token: token?,
        },
        digest: sha?,
        written: boot.zip(file).map(|(boot, file)| Written { boot, file }),
        covers_ms,
    })
}

/// Written through a temporary file and a rename, without fsync: a lost or
/// stale sidecar only makes the next open restore from the bucket, and one
/// that survived while the database lost its last commit no longer matches
/// the file's hash.
fn write_sidecar(db_path: &Path, s: &Sidecar) -> Result<(), ReplicaError> {
    let path = sidecar_path(db_path);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let digest = match &s.digest {
        Digest::Pages(d) => format!("pages_sha256={d}"),
        Digest::WholeFile(d) => format!("sha256={d}"),
    };
    let mut text = format!(
        "wasmkeep-replica-sidecar 1\nseq={}\ntoken={}\n{digest}\n",
        s.position.seq, s.position.token
    );
    if let Some(w) = &s.written {
        text.push_str(&format!("boot={}\nfile={}\n", w.boot, w.file));
    }
    if let Some(ms) = s.covers_ms {
        text.push_str(&format!("covers_ms={ms}\n"));
    }
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(())
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Moves the local database (and its WAL, shared memory and sidecar) aside
/// as `actor.db.replaced-<now_ms>` (`-wal`, `-shm`, `.replica` after it, so
/// SQLite opens the set-aside file with its WAL). Never deletes anything.
pub fn set_aside(db_path: &Path, now_ms: u64) -> Result<PathBuf, ReplicaError> {
    // The node's commit log names writes by their database's path (ADR
    // 0074): the file keeps what the log held of it only once it is
    // durable where it is, before it moves.
    if let Some(dir) = db_path.parent() {
        wasmkeep_store::sync::sync_filesystem(dir)?;
    }
    let mut n = 0;
    let target = loop {
        let suffix = if n == 0 {
            format!(".replaced-{now_ms}")
        } else {
            format!(".replaced-{now_ms}.{n}")
        };
        let t = with_suffix(db_path, &suffix);
        if !t.exists() {
            break t;
        }
        n += 1;
    };
    for extra in ["-wal", "-shm"] {
        let from = with_suffix(db_path, extra);
        if from.exists() {
            std::fs::rename(&from, with_suffix(&target, extra))?;
        }
    }
    let side = sidecar_path(db_path);
    if side.exists() {
        std::fs::rename(&side, sidecar_path(&target))?;
    }
    std::fs::rename(db_path, &target)?;
    // The file it voided is gone from here. The renames reach the disk
    // first: a power cut must not keep the mark's removal and lose them,
    // which would bring the voided file back unmarked.
    if void_path(db_path).exists()
        && let Some(dir) = db_path.parent()
    {
        wasmkeep_store::sync::sync_dir(dir)?;
    }
    unvoid(db_path)?;
    Ok(target)
}

/// Renames a staged image to `db_path` and syncs the folder.
/// Makes `dir` and its missing parents, each new folder's entry synced in
/// its parent before the restore installs anything in it: the actor's
/// commits after a restore are acknowledged through the node's commit log
/// alone, and a power cut that took the folder's entry would lose them
/// (replay finds no file to put them back into, and the next open
/// restores from the bucket again).
fn make_folders(dir: &Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut d = Some(dir);
    while let Some(p) = d
        && !p.exists()
    {
        missing.push(p);
        d = p.parent();
    }
    std::fs::create_dir_all(dir)?;
    for made in missing.iter().rev() {
        if let Some(parent) = made.parent() {
            sync_folder(parent)?;
        }
    }
    Ok(())
}

/// Syncs a folder's entries.
fn sync_folder(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()?;
    #[cfg(test)]
    tests::SYNCED.with_borrow_mut(|s| s.push(dir.to_owned()));
    Ok(())
}

fn install_db(staged: &Path, db_path: &Path) -> Result<(), ReplicaError> {
    let dir = db_path.parent().unwrap_or(Path::new("."));
    std::fs::rename(staged, db_path)?;
    sync_folder(dir)?;
    Ok(())
}

// ---- snapshots streamed from the local file ----

/// A snapshot of a replica's head, streamed from the local database file
/// (ADR 0036): pages are read in order into a hash tree of their own
/// ([`TreeDigest`], memory of the tree's height) and sent in parts of
/// `snapshot_part_bytes`, so at most a few parts are in memory whatever the
/// database's size. The last part goes only if the tree's digest is the
/// head's (the sidecar's): a snapshot of one part is then a create-only
/// PUT (read back if the key is taken, like an entry), a larger one a
/// multipart upload completed by that part; otherwise nothing lands.
///
/// A delta (ADR 0037) streams the same way but reads only the pages that
/// changed since the writer's last snapshot, each checked against the
/// head's hash of that page before it is sent.
#[derive(Debug)]
pub struct SnapshotJob {
    bucket: Bucket,
    key: String,
    header: Entry,
    /// The head's [`PageHashes::digest_hex`]: what the file's pages must
    /// hash to.
    digest: String,
    /// For a delta: the snapshot it starts from, and the pages it carries
    /// with the head's hash of each, in page order.
    delta: Option<DeltaPlan>,
    db_path: PathBuf,
    part_bytes: usize,
    verify: bool,
}

/// A delta's snapshot seq, and its pages with the head's hash of each, in
/// page order.
type DeltaPlan = (u64, Vec<(u32, [u8; 32])>);

/// What a [`SnapshotJob`] landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landed {
    /// The seq it stands for.
    pub seq: u64,
    /// For a delta, the snapshot it starts from; `None` for a snapshot.
    pub delta_from: Option<u64>,
}

impl SnapshotJob {
    /// The seq the snapshot stands for.
    pub fn seq(&self) -> u64 {
        self.header.seq
    }

    /// Whether this is a delta rather than a whole snapshot.
    pub fn is_delta(&self) -> bool {
        self.delta.is_some()
    }

    /// Pages the body carries.
    fn count(&self) -> u32 {
        self.delta
            .as_ref()
            .map_or(self.header.db_pages, |(_, pages)| pages.len() as u32)
    }

    /// Streams the snapshot; returns what landed once it is in the bucket.
    /// `SnapshotTorn` if the file is not the head's state (nothing landed).
    pub async fn run(self) -> Result<Landed, ReplicaError> {
        let seq = self.header.seq;
        let landed = Landed {
            seq,
            delta_from: self.delta.as_ref().map(|(base, _)| *base),
        };
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, ReplicaError>>(2);
        let total = self.header.encoded_len()
            + self.count() as u64 * (PAGE_NUMBER_BYTES + self.header.page_size as u64);
        let single = total <= self.part_bytes as u64;
        let (bucket, key) = (self.bucket.clone(), self.key.clone());
        let reader = tokio::task::spawn_blocking(move || self.read_parts(&tx));
        let sent = if single {
            match rx.recv().await {
                Some(Ok(body)) => match bucket.create(&key, body.clone()).await {
                    Ok(Created::Created) => Ok(()),
                    Ok(Created::AlreadyExists) if holds(&bucket, &key, &body).await? => Ok(()),
                    Ok(Created::AlreadyExists) => Err(ReplicaError::ChainMoved { seq }),
                    Err(e) => Err(e),
                },
                Some(Err(e)) => Err(e),
                None => Err(ReplicaError::ChainBroken(
                    "the snapshot's reader ended".into(),
                )),
            }
        } else {
            bucket.put_parts(&key, &mut rx, total).await
        };
        drop(rx);
        let read = reader
            .await
            .map_err(|e| ReplicaError::ChainBroken(format!("the snapshot's reader: {e}")))?;
        sent.and(read).map(|()| landed)
    }

    /// Reads the file's pages into parts (on a blocking thread), checking
    /// each against the head's hashes, and ends with the body's SHA-256.
    fn read_parts(
        self,
        tx: &tokio::sync::mpsc::Sender<Result<Bytes, ReplicaError>>,
    ) -> Result<(), ReplicaError> {
        use std::os::unix::fs::FileExt;
        let mut parts = Parts::new(tx, &self.header, self.count(), self.part_bytes);
        let file = std::fs::File::open(&self.db_path).map_err(|e| parts.fail(e.into()))?;
        let ps = self.header.page_size as usize;
        let mut page = vec![0u8; ps];
        let mut tree = TreeDigest::default();
        let mut torn = false;
        let numbers: Box<dyn Iterator<Item = (u32, Option<&[u8; 32]>)>> = match &self.delta {
            None => Box::new((1..=self.header.db_pages).map(|no| (no, None))),
            Some((_, pages)) => Box::new(pages.iter().map(|(no, hash)| (*no, Some(hash)))),
        };
        for (no, hash) in numbers {
            file.read_exact_at(&mut page, (no as u64 - 1) * ps as u64)
                .map_err(|e| parts.fail(e.into()))?;
            match hash {
                None => tree.push(&page),
                Some(hash) => {
                    torn |= <sha2::Sha256 as sha2::Digest>::digest(&page).as_slice() != hash;
                }
            }
            parts.page(no, &page)?;
        }
        // The last part goes only if every page was the head's: a multipart
        // upload without it is aborted, a single PUT never sent.
        let torn = match self.delta {
            None => tree.finish(self.header.page_size) != self.digest,
            Some(_) => torn,
        };
        if self.verify && torn {
            return Err(parts.fail(ReplicaError::SnapshotTorn {
                key: self.key.clone(),
            }));
        }
        parts.finish()
    }
}

/// A body cut into parts of at least `part_bytes` as its pages come (on a
/// blocking thread): the header first, the SHA-256 of every byte last.
/// Each full part goes to `tx`, where an upload sends it; the last one
/// only at [`Parts::finish`], so a reader that stops early completes
/// nothing.
struct Parts<'a> {
    tx: &'a tokio::sync::mpsc::Sender<Result<Bytes, ReplicaError>>,
    part_bytes: usize,
    page_size: usize,
    part: Vec<u8>,
    hasher: sha2::Sha256,
}

impl<'a> Parts<'a> {
    fn new(
        tx: &'a tokio::sync::mpsc::Sender<Result<Bytes, ReplicaError>>,
        header: &Entry,
        count: u32,
        part_bytes: usize,
    ) -> Parts<'a> {
        let page_size = header.page_size as usize;
        let mut part = Vec::with_capacity(part_bytes + page_size + 4);
        header.write_header(&mut part, count);
        Parts {
            tx,
            part_bytes,
            page_size,
            part,
            hasher: <sha2::Sha256 as sha2::Digest>::new(),
        }
    }

    fn send(&self, part: Vec<u8>) -> Result<(), ReplicaError> {
        self.tx
            .blocking_send(Ok(Bytes::from(part)))
            .map_err(|_| ReplicaError::ChainBroken("the body's upload ended".into()))
    }

    /// Hands `e` to the upload (which then completes nothing) and returns
    /// it for the reader's own result.
    fn fail(&self, e: ReplicaError) -> ReplicaError {
        let why = e.to_string();
        let _ = self.tx.blocking_send(Err(e));
        ReplicaError::ChainBroken(why)
    }

    fn page(&mut self, no: u32, page: &[u8]) -> Result<(), ReplicaError> {
        use sha2::Digest as _;
        self.part.extend_from_slice(&no.to_be_bytes());
        self.part.extend_from_slice(page);
        if self.part.len() >= self.part_bytes {
            self.hasher.update(&self.part);
            let fresh = Vec::with_capacity(self.part_bytes + self.page_size + 4);
            let full = std::mem::replace(&mut self.part, fresh);
            self.send(full)?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<(), ReplicaError> {
        use sha2::Digest as _;
        self.hasher.update(&self.part);
        let digest = std::mem::take(&mut self.hasher).finalize();
        let mut part = std::mem::take(&mut self.part);
        part.extend_from_slice(&digest);
        self.send(part)
    }
}

/// A database file that an upload reads whole, page by page
/// ([`Replica::upload_file`]): its page size and size in pages, as its
/// header and length gave them when it was probed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WholeFile {
    path: PathBuf,
    page_size: u32,
    db_pages: u32,
}

impl WholeFile {
    /// The database file at `path`, if it is one this way can read: no
    /// commit left in its write-ahead log, no rollback journal beside it, a
    /// header with a valid page size,
    /// whole pages, and the size in pages the header records (when it
    /// records one). The caller keeps the file
    /// unchanged from here until the upload ends (checkpointed, and no
    /// checkpoint meanwhile).
    pub fn probe(path: &Path) -> Result<WholeFile, ReplicaError> {
        use std::os::unix::fs::FileExt;
        let bad = |why: String| ReplicaError::corrupt(path.display().to_string(), why);
        // Beside the file: what SQLite would apply on top of it.
        for (suffix, what) in [
            ("-wal", "its write-ahead log holds commits the file lacks"),
            (
                "-journal",
                "a rollback journal beside it may hold a transaction to undo",
            ),
        ] {
            let mut side = path.as_os_str().to_owned();
            side.push(suffix);
            if let Ok(m) = std::fs::metadata(PathBuf::from(side))
                && m.len() > 0
            {
                return Err(bad(format!("{what}: bytes={}", m.len())));
            }
        }
        let file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        let mut head = [0u8; 100];
        file.read_exact_at(&mut head, 0)
            .map_err(|_| bad(format!("shorter than a database header: bytes={len}")))?;
        let page_size = crate::image::header_page_size(&head)
            .ok_or_else(|| bad("not a sqlite database header".into()))?;
        let db_pages = len / page_size as u64;
        if len % page_size as u64 != 0 || db_pages > u32::MAX as u64 {
            return Err(bad(format!(
                "not a whole number of pages of {page_size} bytes: bytes={len}"
            )));
        }
        // SQLite's own count, valid when the change counter matches the
        // "version valid for" number (offsets 28, 24 and 92).
        let word = |at: usize| u32::from_be_bytes(head[at..at + 4].try_into().expect("4 bytes"));
        let recorded = word(28);
        if word(24) == word(92) && recorded != 0 && recorded as u64 != db_pages {
            return Err(bad(format!(
                "the header records pages={recorded} but the file holds {db_pages}"
            )));
        }
        Ok(WholeFile {
            path: path.to_owned(),
            page_size,
            db_pages: db_pages as u32,
        })
    }

    /// The database's size in bytes.
    pub fn bytes(&self) -> u64 {
        self.db_pages as u64 * self.page_size as u64
    }

    /// Reads every page into `header`'s body, in parts (on a blocking
    /// thread), and returns the hash of each page. Fails if the file's
    /// size changed since it was probed.
    fn read_parts(
        &self,
        header: &Entry,
        part_bytes: usize,
        tx: &tokio::sync::mpsc::Sender<Result<Bytes, ReplicaError>>,
    ) -> Result<Vec<[u8; 32]>, ReplicaError> {
        use std::os::unix::fs::FileExt;
        let mut parts = Parts::new(tx, header, self.db_pages, part_bytes);
        let file = std::fs::File::open(&self.path).map_err(|e| parts.fail(e.into()))?;
        let len = file.metadata().map_err(|e| parts.fail(e.into()))?.len();
        if len != self.bytes() {
            return Err(parts.fail(ReplicaError::ChainBroken(format!(
                "`{}` changed while it was uploaded: bytes={len}, probed at {}",
                self.path.display(),
                self.bytes()
            ))));
        }
        let mut leaves = Vec::new();
        leaves
            .try_reserve_exact(self.db_pages as usize)
            .map_err(|_| {
                parts.fail(ReplicaError::OutOfMemory {
                    key: header.actor.clone(),
                    bytes: self.db_pages as u64 * 32,
                })
            })?;
        let ps = self.page_size as usize;
        let mut page = vec![0u8; ps];
        for no in 1..=self.db_pages {
            file.read_exact_at(&mut page, (no as u64 - 1) * ps as u64)
                .map_err(|e| parts.fail(e.into()))?;
            leaves.push(<sha2::Sha256 as sha2::Digest>::digest(&page).into());
            parts.page(no, &page)?;
        }
        parts.finish()?;
        Ok(leaves)
    }
}

// ---- the replica ----

/// The pages commits wrote since the last upload, as the runtime captured
/// them (`wasmkeep_store::page_capture`): what [`Replica::upload_pages`]
/// ships.
#[derive(Debug, Clone, Default)]
pub struct Pages {
    pub page_size: u32,
    /// The database's size in pages after the newest commit.
    pub db_pages: u32,
    /// The smallest size a commit since the last upload left: every page
    /// above it up to `db_pages` must be in `pages`.
    pub low_pages: u32,
    /// Page number to its newest committed content.
    pub pages: BTreeMap<u32, Vec<u8>>,
}

/// What [`Replica::diff_file_within`] found.
#[derive(Debug)]
pub enum Diff {
    /// The pages that differ from the head.
    Pages(Pages),
    /// No head to compare with, or a file that is not whole pages.
    NoBase,
    /// The caller's bound refused a page: the diff holds too much.
    Refused,
}

/// What one [`Replica::upload`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Uploaded {
    /// Nothing changed since the last upload: the head already holds it.
    Unchanged,
    /// A new entry is on the chain at `position`; `snapshot` says whether a
    /// snapshot was written after it.
    Appended {
        position: Position,
        entry_bytes: u64,
        snapshot: bool,
    },
}

/// One actor's replica, held by its owner.
///
/// Created by [`Replica::open`] (which restores the local file or leaves it
/// as it is); every [`Replica::upload`] appends the pages that changed since
/// the previous one as the next `log/<seq>` with a create-only write. Any
/// error leaves the replica given up: the owner drops the actor and opens it
/// again.
#[derive(Debug)]
pub struct Replica {
    bucket: Bucket,
    root: ActorRoot,
    db_path: PathBuf,
    generation: u64,
    config: ReplicaConfig,
    head: Option<Position>,
    head_time_ms: u64,
    /// Page hashes of the state at `head`; `None` makes the next entry
    /// carry every page (first upload, or a local file we could not read).
    base: Option<PageHashes>,
    entries_since_snapshot: u64,
    bytes_since_snapshot: u64,
    /// The snapshot policy asked for a snapshot after an upload of pages:
    /// the caller streams one from the local file ([`Replica::snapshot_job`])
    /// or, if its next upload reads the whole database, that upload writes it.
    snapshot_due: bool,
    /// A streamed snapshot landed: the next upload collects.
    collect_due: bool,
    /// Seq and bytes of the entries this writer appended since the last
    /// snapshot it knows of (at most [`RECENT_ENTRIES_MAX`]): when a
    /// streamed snapshot of an earlier head lands, those above it still
    /// count towards the next.
    recent: std::collections::VecDeque<(u64, u64)>,
    given_up: bool,
    /// When (boot clock) the request that last confirmed `head` was sent:
    /// the listing of `open`, or the create of the head entry. See
    /// [`Replica::append`].
    anchor: Option<Duration>,
    /// Every snapshot this writer has seen, with when it first saw it
    /// (boot clock, after the request that showed it returned).
    snaps_seen: BTreeMap<u64, Duration>,
    /// The latest snapshot this writer wrote: where its deltas start.
    delta_base: Option<u64>,
    /// A [`SnapshotJob`] of this replica is streaming (handed out, neither
    /// landed nor failed): the snapshot is not overdue meanwhile, so the
    /// upload path does not read the whole database to write another one.
    streaming: bool,
    /// A streamed job found the file torn, or [`STREAM_FAILURES_MAX`] of
    /// them failed, since the last snapshot landed (see
    /// [`Replica::overdue_may_stream`]).
    stream_failed: bool,
    /// Streamed jobs that failed since the last snapshot landed.
    stream_failures: u32,
    /// The pages this writer's entries changed (see [`Tracking`]); `None`
    /// when it does not know them all (after opening, or past
    /// [`DELTA_PAGES_MAX`]): the next snapshot due is then a whole one.
    tracking: Option<Tracking>,
    /// Bytes of the entries since `delta_base`: once they outweigh the
    /// database (`snapshot_log_ratio_pct`), the next snapshot is whole, so
    /// the log the bucket keeps stays within the database's size.
    bytes_since_base: u64,
    /// Every delta this writer has seen, `(base, seq)`, with when it first
    /// saw it (as `snaps_seen`): a delta a newer one replaces is deleted
    /// once that one is a grace old.
    deltas_seen: BTreeMap<(u64, u64), Duration>,
}

/// The pages a writer's entries changed since seq `from`: page number to
/// the seq of the newest entry that wrote it. A delta from a snapshot at
/// or above `from` carries those of them that the database still has.
#[derive(Debug, Default)]
struct Tracking {
    from: u64,
    pages: BTreeMap<u32, u64>,
}

impl Replica {
    /// Brings the local file at `db_path` in line with the bucket and
    /// returns the replica positioned at the bucket's head.
    ///
    /// The local file is kept if its sidecar names the bucket's latest
    /// position and its bytes still hash as recorded, or, after a crash of
    /// the process that wrote it, if that sidecar was written in this boot
    /// to this file ([`Opened::Ahead`], ADR 0082); otherwise (or if the
    /// sidecar was voided, [`void_sidecar`]) it is set aside (see
    /// [`set_aside`]) and the bucket's version written in its place. If the
    /// bucket has nothing for the actor, nothing local is touched, unless
    /// it was given up as a new actor ([`Void::NewActor`], then
    /// [`Opened::SetAside`]). The caller must
    /// not have the database open.
    pub async fn open(
        bucket: &Bucket,
        id: &ActorId,
        db_path: &Path,
        generation: u64,
        config: ReplicaConfig,
        now_ms: u64,
    ) -> Result<(Replica, Opened), ReplicaError> {
        assert!(
            config.snapshots_keep >= 1,
            "snapshots_keep must be at least 1"
        );
        let root = ActorRoot::new(id, bucket.prefix_bytes())?;
        let mut replica = Replica {
            bucket: bucket.clone(),
            root,
            db_path: db_path.to_owned(),
            generation,
            config,
            head: None,
            head_time_ms: 0,
            base: None,
            entries_since_snapshot: 0,
            bytes_since_snapshot: 0,
            snapshot_due: false,
            collect_due: false,
            recent: Default::default(),
            given_up: false,
            anchor: None,
            snaps_seen: BTreeMap::new(),
            delta_base: None,
            streaming: false,
            stream_failed: false,
            stream_failures: 0,
            tracking: None,
            bytes_since_base: 0,
            deltas_seen: BTreeMap::new(),
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            match replica.open_once(now_ms).await {
                Err(e) if e.is_not_found() && attempt < RESTORE_ATTEMPTS_MAX => continue,
                Err(e) => return Err(e),
                Ok(opened) => return Ok((replica, opened)),
            }
        }
    }

    async fn open_once(&mut self, now_ms: u64) -> Result<Opened, ReplicaError> {
        let sent = since_boot();
        let listing = list_chain(&self.bucket, &self.root, &self.config).await?;
        self.anchor = Some(sent);
        self.saw_snapshots(&listing.snap_seqs());
        let local = self.db_path.exists();
        let Some(head_seq) = listing.head() else {
            // The first upload ships every page; reading the file here
            // would only tell us what that upload reads anyway.
            self.base = None;
            if local
                && read_void(&self.db_path) == Some(Void::NewActor)
                && !sidecar_path(&self.db_path).exists()
            {
                // A new actor given up before its first upload landed (or
                // left by a stop with a `replicated` commit unshipped):
                // clients were told its commits failed, everything in the
                // file was committed since it was created, and no bucket
                // ever held a position of it (no sidecar). The file is set
                // aside like any given-up actor's, and the actor starts
                // again as new. Any other file the bucket has never seen
                // (data from before the node had a bucket, a node moved to
                // an empty bucket) is kept and shipped, mark or not.
                let replaced = set_aside(&self.db_path, now_ms)?;
                return Ok(Opened::SetAside { replaced });
            }
            unvoid(&self.db_path)?;
            return Ok(Opened::BucketEmpty { local });
        };
        if local && let Some(side) = read_sidecar(&self.db_path) {
            let head = self.head_position(&listing, head_seq).await?;
            if side.position == head.0
                && let Ok(image) = Image::read_path(&self.db_path)
            {
                let hashes = image.hashes();
                let opened = if side.digest.matches(&image, &hashes) {
                    self.base = Some(hashes);
                    Opened::UpToDate
                } else if side.written_here(&self.db_path)
                    || self.config.unsafe_keep_ahead_unchecked
                {
                    // Commits past the head (ADR 0082): nothing describes
                    // the head's pages here, so the next upload carries
                    // every page.
                    self.base = None;
                    Opened::Ahead
                } else {
                    return self.restore(&listing, head_seq, local, now_ms).await;
                };
                self.head = Some(head.0);
                self.head_time_ms = head.1;
                self.entries_since_snapshot = listing.logs.len() as u64;
                // What a restore of this chain downloads besides the
                // snapshot, so that the snapshot policy (and with it the
                // restore bounds) holds across reopenings.
                self.bytes_since_snapshot = self.restore_bytes(&listing.logs).await?;
                return Ok(opened);
            }
        }
        self.restore(&listing, head_seq, local, now_ms).await
    }

    /// The bucket's version of the actor written to the local path, a local
    /// file there set aside first.
    async fn restore(
        &mut self,
        listing: &Listing,
        head_seq: u64,
        local: bool,
        now_ms: u64,
    ) -> Result<Opened, ReplicaError> {
        // Rebuilt where it will be installed from, streamed (a bounded
        // buffer, whatever the database's size), and checked there before
        // the local file is touched: a bad one replaces nothing.
        let staged = with_suffix(&self.db_path, ".restoring");
        let rebuilt =
            rebuild_staged(&self.bucket, &self.root, listing, &self.config, &staged).await;
        let (hashes, pos, time, n, bytes) = match rebuilt {
            Ok(r) => r,
            Err(e) => {
                let _ = std::fs::remove_file(&staged);
                return Err(e);
            }
        };
        self.head = Some(pos);
        self.head_time_ms = time;
        self.entries_since_snapshot = n;
        self.bytes_since_snapshot = bytes;
        let Some(hashes) = hashes else {
            let _ = std::fs::remove_file(&staged);
            // Deleted: no database, and the next upload carries every page
            // above the tombstone. A local file is from before the deletion
            // (or a new life's commits the bucket never got): set aside,
            // like any local file that does not match the bucket.
            self.base = None;
            let replaced = if local {
                Some(set_aside(&self.db_path, now_ms)?)
            } else {
                unvoid(&self.db_path)?;
                None
            };
            return Ok(Opened::Deleted { replaced });
        };
        let head_key = self.head_key(listing, head_seq);
        if let Err(e) = quick_check(&staged, &head_key) {
            let _ = std::fs::remove_file(&staged);
            return Err(e);
        }
        let replaced = if local {
            Some(set_aside(&self.db_path, now_ms)?)
        } else {
            None
        };
        install_db(&staged, &self.db_path)?;
        write_sidecar(
            &self.db_path,
            &Sidecar::new(
                &self.db_path,
                pos,
                Digest::Pages(hashes.digest_hex()),
                now_ms,
            ),
        )?;
        unvoid(&self.db_path)?;
        self.base = Some(hashes);
        Ok(Opened::Restored { replaced })
    }

    /// Bytes a restore downloads for the entries `logs` (`(seq, listed
    /// size)`): their listed sizes, but for a pointer (ADR 0038), whose
    /// listing shows only a header, the size of the body it names. Only
    /// entries as short as a header are read to tell.
    async fn restore_bytes(&self, logs: &[(u64, u64)]) -> Result<u64, ReplicaError> {
        let header_only =
            Entry::tombstone(0, 0, Token::fresh(0)?, self.root.as_str()).encoded_len();
        let mut total = 0u64;
        for &(seq, size) in logs {
            let mut bytes = size;
            if size == header_only {
                let key = self.root.log(seq);
                let body = self.bucket.get_bounded(&key, "pointer_bytes", size).await?;
                let e = Entry::decode(&key, &body, self.config.entry_bytes_max)?;
                if e.kind == Kind::Pointer {
                    bytes = e.encoded_len()
                        + e.db_pages as u64 * (PAGE_NUMBER_BYTES + e.page_size as u64);
                }
            }
            total = total.saturating_add(bytes);
        }
        Ok(total)
    }

    /// The key of the head: the entry at `head_seq` if the listing has
    /// one, otherwise the snapshot.
    fn head_key(&self, listing: &Listing, head_seq: u64) -> String {
        if listing.logs.last().map(|(seq, _)| *seq) == Some(head_seq) {
            self.root.log(head_seq)
        } else {
            self.root.snap(head_seq)
        }
    }

    /// The position (and time) of the head, from its header alone.
    async fn head_position(
        &self,
        listing: &Listing,
        head_seq: u64,
    ) -> Result<(Position, u64), ReplicaError> {
        let key = self.head_key(listing, head_seq);
        let head = self
            .bucket
            .get_prefix(&key, FIXED_HEADER_BYTES as u64)
            .await?;
        let h = Entry::peek_header(&key, &head)?;
        if h.seq != head_seq {
            return Err(ReplicaError::corrupt(key, "header seq differs from key"));
        }
        Ok((
            Position {
                seq: head_seq,
                token: h.token,
            },
            h.time_ms,
        ))
    }

    /// Ends the history with a tombstone at the next seq (create-only, like
    /// any entry), when the actor's latest state is a tombstone already:
    /// a writer of an earlier life whose upload is still on its way then
    /// finds its seq taken, so what the chain says (deleted) can no longer
    /// change behind this replica. The alarm index's owner fence for an
    /// actor with no state (ADR 0009, R2). `ChainMoved`: someone appended
    /// first (the actor may have state again).
    pub async fn fence_deleted(&mut self, time_ms: u64) -> Result<(), ReplicaError> {
        self.refuse_if_given_up()?;
        if self.head.is_none() || self.base.is_some() {
            // Only a chain whose latest state is a tombstone: there is no
            // image behind this replica.
            return Err(ReplicaError::ChainBroken(format!(
                "a tombstone fence is for a deleted actor only: actor=`{}`",
                self.root.as_str()
            )));
        }
        let seq = self.next_seq();
        let t = Entry::tombstone(
            seq,
            time_ms,
            Token::fresh(self.generation)?,
            self.root.as_str(),
        );
        let body = Bytes::from(t.encode(self.config.entry_bytes_max)?);
        if let Err(e) = self.append(seq, body.clone()).await {
            self.given_up = true;
            return Err(e);
        }
        self.head = Some(t.position());
        self.head_time_ms = time_ms;
        self.base = None;
        // The same bytes as a snapshot, as a delete writes it: restores
        // start there, and collection may drop what is below.
        if let Err(e) = create_or_mine(&self.bucket, &self.root.snap(seq), seq, &body).await {
            self.given_up = true;
            return Err(e);
        }
        self.entries_since_snapshot = 0;
        self.bytes_since_snapshot = 0;
        Ok(())
    }

    /// The seq the next upload takes.
    pub fn next_seq(&self) -> u64 {
        self.head.map_or(0, |p| p.seq + 1)
    }

    /// The latest position this replica knows the chain at.
    pub fn head(&self) -> Option<Position> {
        self.head
    }

    /// The actor's folder in the bucket.
    pub fn root(&self) -> &ActorRoot {
        &self.root
    }

    /// Appends what changed in `image` (the committed state, read after the
    /// commits to ship) since the last upload, as the next entry stamped
    /// `time_ms` (the newest commit's time). Several commits may go in one
    /// upload. Writes a snapshot afterwards when the policy says so, and
    /// collects what retention allows.
    ///
    /// `ChainMoved`: another writer holds the next seq (or collected past
    /// it); the caller gives the actor up. Any other error also gives the
    /// replica up: whether the entry landed is unknown.
    pub async fn upload(&mut self, image: &Image, time_ms: u64) -> Result<Uploaded, ReplicaError> {
        self.refuse_if_given_up()?;
        let result = self.upload_inner(image, time_ms).await;
        self.given_up |= result.is_err();
        result
    }

    fn refuse_if_given_up(&self) -> Result<(), ReplicaError> {
        if self.given_up {
            return Err(ReplicaError::ChainBroken(
                "this replica gave up after an earlier failure: open the actor again".into(),
            ));
        }
        Ok(())
    }

    /// After an append: `position` is the head, whose state has page hashes
    /// `hashes`; the sidecar says so.
    fn settle_head(
        &mut self,
        position: Position,
        time_ms: u64,
        hashes: PageHashes,
    ) -> Result<(), ReplicaError> {
        self.head = Some(position);
        self.head_time_ms = time_ms;
        write_sidecar(
            &self.db_path,
            &Sidecar::new(
                &self.db_path,
                position,
                Digest::Pages(hashes.digest_hex()),
                time_ms,
            ),
        )?;
        self.base = Some(hashes);
        Ok(())
    }

    /// Whether the next upload needs the whole database: there is no base
    /// to describe changes against (the first upload, or after the bucket's
    /// copy was deleted: [`Self::upload_file`] reads it page by page), or a
    /// snapshot is overdue ([`Self::upload`] writes it from memory).
    pub fn wants_image(&self) -> bool {
        self.base.is_none() || self.snapshot_overdue()
    }

    /// A snapshot due has not landed for half the policy again (streamed
    /// ones torn, or the node's snapshot slot taken): the next upload
    /// reads the whole database and writes one, so the chain stays within
    /// the restore bounds (`raise_bounds_to_retention` allows twice the
    /// policy).
    pub fn snapshot_overdue(&self) -> bool {
        self.snapshot_due
            && !self.streaming
            && self.entries_since_snapshot
                >= self.config.snapshot_every_entries.saturating_mul(3) / 2
    }

    /// Whether the snapshot policy asks for a snapshot (see
    /// [`Replica::snapshot_job`]).
    pub fn snapshot_due(&self) -> bool {
        self.snapshot_due
    }

    /// A snapshot of the head streamed from the local file, if one is due.
    /// The caller makes sure the file holds exactly the head's state while
    /// the job runs (it checkpointed the log into it before the upload that
    /// made the head, and no checkpoint writes it meanwhile); the job checks
    /// the file's pages against the head's digest and completes nothing if one
    /// differs.
    ///
    /// It is a delta (ADR 0037) when this writer knows every page that
    /// changed since its last snapshot, they make a body within
    /// `snapshot_delta_ratio_pct` of the database, and the log since that
    /// snapshot does not outweigh the database yet; otherwise a whole
    /// snapshot. A whole one starts the tracking of changed pages when none
    /// runs.
    pub fn snapshot_job(&mut self) -> Option<SnapshotJob> {
        let (true, Some(head), Some(base)) = (self.snapshot_due, self.head, &self.base) else {
            self.streaming = false;
            return None;
        };
        let delta = self.delta_plan(head.seq, base);
        let (kind, key) = match &delta {
            Some((from, _)) => (Kind::Delta, self.root.delta(*from, head.seq)),
            None => (Kind::Snapshot, self.root.snap(head.seq)),
        };
        if delta.is_none() && self.tracking.is_none() {
            self.tracking = Some(Tracking {
                from: head.seq,
                pages: BTreeMap::new(),
            });
        }
        let base = self.base.as_ref().expect("checked above");
        self.streaming = true;
        Some(SnapshotJob {
            bucket: self.bucket.clone(),
            key,
            delta,
            header: Entry {
                kind,
                seq: head.seq,
                time_ms: self.head_time_ms,
                token: head.token,
                page_size: base.page_size(),
                db_pages: base.pages(),
                actor: self.root.as_str().to_owned(),
                pages: Vec::new(),
            },
            digest: base.digest_hex(),
            db_path: self.db_path.clone(),
            part_bytes: self.config.snapshot_part_bytes.max(SNAPSHOT_PART_BYTES_MIN),
            verify: !self.config.unsafe_snapshot_unverified,
        })
    }

    /// Whether the snapshot due would be a delta if it streamed now (the
    /// upload before it may still change that: see [`Replica::delta_job`]).
    pub fn delta_possible(&self) -> bool {
        match (self.head, &self.base) {
            (Some(head), Some(base)) => self.delta_plan(head.seq, base).is_some(),
            _ => false,
        }
    }

    /// [`Replica::snapshot_job`], but only if it is a delta: a caller that
    /// took a delta's slot ([`Replica::delta_possible`]) gets nothing when
    /// the upload since made it a whole snapshot, and tries again later.
    pub fn delta_job(&mut self) -> Option<SnapshotJob> {
        if !self.delta_possible() {
            self.streaming = false;
            return None;
        }
        self.snapshot_job()
    }

    /// The caller froze the actor's file for the snapshot due, which is
    /// overdue, without waiting for a slot: the job it takes after the next
    /// upload streams it. Until then the snapshot is not overdue, so that
    /// upload ships the captured pages instead of the whole database
    /// (ADR 0037, "Overdue snapshots stream too").
    pub fn snapshot_streams_next(&mut self) {
        self.streaming = true;
    }

    /// The delta the snapshot due at `head` can be, if any: the snapshot it
    /// starts from, and the pages it carries with their hashes in `base`
    /// (the head's state).
    fn delta_plan(&self, head: u64, base: &PageHashes) -> Option<DeltaPlan> {
        let (Some(from), Some(tracking)) = (self.delta_base, &self.tracking) else {
            return None;
        };
        let db_bytes = base.pages() as u64 * base.page_size() as u64;
        if self.config.snapshot_delta_ratio_pct == 0
            || tracking.from > from
            || head <= from
            || self.log_outweighs(self.bytes_since_base, db_bytes)
        {
            return None;
        }
        let pages: Vec<(u32, [u8; 32])> = tracking
            .pages
            .keys()
            .filter_map(|no| Some((*no, base.page_hash(*no)?)))
            .collect();
        let body = pages.len() as u64 * (PAGE_NUMBER_BYTES + base.page_size() as u64);
        (body.saturating_mul(100)
            <= self
                .config
                .snapshot_delta_ratio_pct
                .saturating_mul(db_bytes))
        .then_some((from, pages))
    }

    /// The job [`Replica::snapshot_job`] handed out did not land (torn, or
    /// the bucket failed): the policy may ask again, and the snapshot may
    /// become overdue.
    pub fn snapshot_failed(&mut self, torn: bool) {
        self.streaming = false;
        self.stream_failures += 1;
        self.stream_failed |= torn || self.stream_failures >= STREAM_FAILURES_MAX;
    }

    /// Whether an overdue snapshot may stream ([`Replica::snapshot_streams_next`]):
    /// not once a streamed one found the file torn (its pages are not the
    /// head's, `snapshot_torn`) since the last landed, nor after
    /// [`STREAM_FAILURES_MAX`] failures of any kind. A torn file disagrees
    /// with what this writer believes the head holds (a bug: the file is
    /// frozen while it is read), so the repair is a snapshot of the whole
    /// database as it is, which resets the head's
    /// hashes from it; a bucket that keeps failing streams gets the same,
    /// rather than a chain growing past the restore bounds meanwhile
    /// ([`Self::needs_repair`]).
    pub fn overdue_may_stream(&self) -> bool {
        !self.stream_failed
    }

    /// The snapshot is overdue and may not stream as it is
    /// ([`Self::overdue_may_stream`]): the repair is an upload of the
    /// whole file ([`Self::upload_file`], which resets the head's hashes
    /// from it, page by page) followed by a snapshot streamed from the same
    /// frozen file (ADR 0038).
    pub fn needs_repair(&self) -> bool {
        self.snapshot_overdue() && !self.overdue_may_stream()
    }

    /// Notes the pages an entry at `seq` wrote, for the deltas.
    fn track(&mut self, seq: u64, pages: impl Iterator<Item = u32>) {
        let Some(t) = &mut self.tracking else {
            return;
        };
        for no in pages {
            t.pages.insert(no, seq);
            if t.pages.len() > DELTA_PAGES_MAX {
                self.tracking = None;
                return;
            }
        }
    }

    /// A snapshot or delta streamed by a [`SnapshotJob`] landed: entries
    /// after it count towards the next one, and the next collection may
    /// delete what it replaces.
    pub fn snapshot_landed(&mut self, landed: Landed) {
        let seq = landed.seq;
        self.streaming = false;
        self.stream_failed = false;
        self.stream_failures = 0;
        match landed.delta_from {
            // A snapshot older than the one deltas start from (a job that
            // streamed while the upload path wrote a newer one) changes
            // nothing for the deltas.
            None if self.delta_base.is_some_and(|b| b > seq) => {
                self.snaps_seen.entry(seq).or_insert_with(since_boot);
            }
            None => {
                self.snaps_seen.entry(seq).or_insert_with(since_boot);
                self.delta_base = Some(seq);
                if let Some(t) = &mut self.tracking
                    && t.from <= seq
                {
                    t.from = seq;
                    t.pages.retain(|_, changed| *changed > seq);
                }
                self.bytes_since_base = self
                    .recent
                    .iter()
                    .filter(|(s, _)| *s > seq)
                    .map(|(_, b)| b)
                    .sum();
            }
            Some(from) => {
                self.deltas_seen
                    .entry((from, seq))
                    .or_insert_with(since_boot);
                if self.config.unsafe_delta_forgets_pages
                    && let Some(t) = &mut self.tracking
                {
                    t.pages.retain(|_, changed| *changed > seq);
                }
            }
        }
        self.recent.retain(|(s, _)| *s > seq);
        self.entries_since_snapshot = self.recent.len() as u64;
        self.bytes_since_snapshot = self.recent.iter().map(|(_, b)| b).sum();
        let db_bytes = self
            .base
            .as_ref()
            .map_or(0, |b| b.pages() as u64 * b.page_size() as u64);
        self.snapshot_due = self.snapshot_policy_due(db_bytes);
        self.collect_due = true;
    }

    /// Notes an entry this writer appended (see `recent`).
    fn appended(&mut self, seq: u64, bytes: u64) {
        if self.recent.len() >= RECENT_ENTRIES_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back((seq, bytes));
    }

    /// The pages of the database file at `path` that differ from the head
    /// (and those beyond its size), read page by page and compared with the
    /// head's page hashes: what an upload carries when no capture has them
    /// (it gave up, or the node restarted with commits the bucket lacks),
    /// holding only the pages that differ, never the whole database. The
    /// caller makes sure the file holds the committed state (checkpointed,
    /// and no checkpoint meanwhile). `None` without a head to compare with,
    /// or for a file that is not whole pages of the head's page size.
    pub fn diff_file(&self, path: &Path) -> Result<Option<Pages>, ReplicaError> {
        match self.diff_file_within(path, &mut |_| true)? {
            Diff::Pages(p) => Ok(Some(p)),
            Diff::NoBase | Diff::Refused => Ok(None),
        }
    }

    /// [`Self::diff_file`], asking `room` before it keeps each changed page
    /// (with the page's size): it stops with [`Diff::Refused`] as soon as
    /// `room` says no, so a caller bounds what the diff holds (a write
    /// burst's diff can be most of the database, issue 33).
    pub fn diff_file_within(
        &self,
        path: &Path,
        room: &mut dyn FnMut(u64) -> bool,
    ) -> Result<Diff, ReplicaError> {
        use std::os::unix::fs::FileExt;
        let Some(base) = &self.base else {
            return Ok(Diff::NoBase);
        };
        let ps = base.page_size() as u64;
        let file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        if len % ps != 0 || len / ps > u32::MAX as u64 {
            return Ok(Diff::NoBase);
        }
        let db_pages = (len / ps) as u32;
        let mut pages = BTreeMap::new();
        let mut page = vec![0u8; ps as usize];
        for no in 1..=db_pages {
            file.read_exact_at(&mut page, (no as u64 - 1) * ps)?;
            if !base.holds(no, &page) {
                if !room(ps) {
                    return Ok(Diff::Refused);
                }
                pages.insert(no, page.clone());
            }
        }
        Ok(Diff::Pages(Pages {
            page_size: base.page_size(),
            db_pages,
            low_pages: db_pages.min(base.pages()),
            pages,
        }))
    }

    /// Whether `pages` (captured as SQLite wrote them, ADR 0036) describe
    /// the step from the head to a database of `db_pages` pages: the same
    /// page size, and every page the database has beyond the smallest size
    /// a commit left (`low_pages`) among them. If not, the caller uploads
    /// the whole database instead.
    pub fn pages_suffice(&self, pages: &Pages) -> bool {
        let Some(base) = &self.base else {
            return false;
        };
        if base.page_size() != pages.page_size {
            return false;
        }
        let low = pages.low_pages.min(base.pages());
        (low + 1..=pages.db_pages).all(|no| pages.pages.contains_key(&no))
            && pages.pages.iter().all(|(no, p)| {
                (1..=pages.db_pages).contains(no) && p.len() == pages.page_size as usize
            })
    }

    /// Appends the pages that commits wrote since the last upload (captured
    /// where SQLite wrote them: no read of the whole database) as the next
    /// entry; pages whose content the head already holds are left out.
    /// Like [`Self::upload`] otherwise, but a snapshot the policy asks for
    /// waits for the next upload ([`Self::wants_image`]). The caller checks
    /// [`Self::pages_suffice`] first; pages that do not are refused without
    /// touching the bucket (`ChainBroken`).
    pub async fn upload_pages(
        &mut self,
        pages: Pages,
        time_ms: u64,
    ) -> Result<Uploaded, ReplicaError> {
        self.refuse_if_given_up()?;
        if !self.pages_suffice(&pages) || self.snapshot_overdue() {
            return Err(ReplicaError::ChainBroken(
                "the captured pages do not describe the step from the head".into(),
            ));
        }
        let result = self.upload_pages_inner(pages, time_ms).await;
        self.given_up |= result.is_err();
        result
    }

    async fn upload_pages_inner(
        &mut self,
        pages: Pages,
        time_ms: u64,
    ) -> Result<Uploaded, ReplicaError> {
        let base = self.base.as_ref().expect("checked by pages_suffice");
        // Moved, not copied: a write burst's pages are held once, then once
        // more as the entry's body.
        let changed: Vec<(u32, Vec<u8>)> = pages
            .pages
            .into_iter()
            .filter(|(no, p)| !base.holds(*no, p))
            .collect();
        if changed.is_empty() && self.head.is_some() && pages.db_pages == base.pages() {
            return Ok(Uploaded::Unchanged);
        }
        let seq = self.next_seq();
        let entry = Entry {
            kind: Kind::Log,
            seq,
            time_ms,
            token: Token::fresh(self.generation)?,
            page_size: pages.page_size,
            db_pages: pages.db_pages,
            actor: self.root.as_str().to_owned(),
            pages: changed,
        };
        let body = Bytes::from(entry.encode(self.config.entry_bytes_max)?);
        let entry_bytes = body.len() as u64;
        self.append(seq, body).await?;
        let position = entry.position();
        let mut hashes = self.base.take().expect("checked by pages_suffice");
        hashes.update(
            entry.db_pages,
            entry.pages.iter().map(|(no, p)| (*no, p.as_slice())),
        );
        self.settle_head(position, time_ms, hashes)?;
        self.entries_since_snapshot += 1;
        self.bytes_since_snapshot += entry_bytes;
        self.bytes_since_base += entry_bytes;
        self.appended(seq, entry_bytes);
        self.track(seq, entry.pages.iter().map(|(no, _)| *no));
        let db_bytes = entry.db_pages as u64 * entry.page_size as u64;
        self.snapshot_due = self.snapshot_policy_due(db_bytes);
        if self.collect_due {
            // Best effort: the entry is on the chain whatever happens here,
            // and the next upload tries again.
            if self.collect().await.is_ok() {
                self.collect_due = false;
            }
        }
        Ok(Uploaded::Appended {
            position,
            entry_bytes,
            snapshot: false,
        })
    }

    /// Whether the log since the last snapshot calls for one: by entries,
    /// or by bytes against the database's size (`db_bytes`).
    fn snapshot_policy_due(&self, db_bytes: u64) -> bool {
        let due = self.entries_since_snapshot >= self.config.snapshot_every_entries
            || self.log_outweighs(self.bytes_since_snapshot, db_bytes);
        due && self.entries_since_snapshot > 0
    }

    /// Whether `log_bytes` of entries outweigh a database of `db_bytes`
    /// (`snapshot_log_ratio_pct`, and at least `snapshot_log_bytes_min`).
    fn log_outweighs(&self, log_bytes: u64, db_bytes: u64) -> bool {
        log_bytes.saturating_mul(100) >= self.config.snapshot_log_ratio_pct.saturating_mul(db_bytes)
            && log_bytes >= self.config.snapshot_log_bytes_min
    }

    async fn upload_inner(
        &mut self,
        image: &Image,
        time_ms: u64,
    ) -> Result<Uploaded, ReplicaError> {
        let seq = self.next_seq();
        let token = Token::fresh(self.generation)?;
        let entry = image.diff(self.base.as_ref(), seq, time_ms, token, self.root.as_str());
        let full = entry.pages.len() == image.db_pages() as usize;
        if entry.pages.is_empty()
            && self.head.is_some()
            && self.base.is_some()
            && entry.db_pages == self.base_pages()
        {
            return Ok(Uploaded::Unchanged);
        }
        let body = Bytes::from(entry.encode(self.config.entry_bytes_max)?);
        let entry_bytes = body.len() as u64;
        self.append(seq, body).await?;
        let position = entry.position();
        self.settle_head(position, time_ms, image.hashes())?;
        self.count_entry(seq, full, entry_bytes);
        self.track(seq, entry.pages.iter().map(|(no, _)| *no));
        let snapshot = self.snapshot_policy_due(image.bytes().len() as u64)
            || (self.snapshot_due && self.entries_since_snapshot > 0);
        if snapshot {
            self.snapshot(image).await?;
        }
        Ok(Uploaded::Appended {
            position,
            entry_bytes,
            snapshot,
        })
    }

    /// Counts the entry this writer appended at `seq` (`entry_bytes`
    /// long; `every_page`: it carries the whole database) towards the
    /// snapshot policy.
    fn count_entry(&mut self, seq: u64, every_page: bool, entry_bytes: u64) {
        if every_page && seq == 0 {
            // The chain's first entry carries every page and has nothing
            // behind it: restoring it is as quick as restoring a snapshot.
            // A later entry with every page does not reset the counts: a
            // restore still replays the log behind it (it starts from the
            // latest snapshot), and the counts are what bound that replay
            // (`restore_entries_max`, `restore_bytes_max`).
            self.entries_since_snapshot = 0;
            self.bytes_since_snapshot = 0;
        } else {
            self.entries_since_snapshot += 1;
            self.bytes_since_snapshot += entry_bytes;
            self.appended(seq, entry_bytes);
        }
        self.bytes_since_base += entry_bytes;
    }

    /// Appends the whole database file `file` (every page, read page by
    /// page: a few parts in memory and the hash of each page, whatever
    /// its size) as the next entry stamped `time_ms`: what an upload
    /// without a base ([`Self::has_base`]) ships instead of reading the
    /// database into memory (ADR 0038).
    ///
    /// A body of one part is created at `log/<seq>` like any entry. A
    /// larger one is uploaded in parts to `whole/<seq>/<tag>`, a key no
    /// other writer uses, and only then is a pointer to it created at
    /// `log/<seq>`: the create-only race for the seq is the pointer's, and
    /// the chain never names a body that is not all there. A writer that
    /// loses the race deletes its body.
    ///
    /// A snapshot the policy asks for waits for the next upload, as with
    /// [`Self::upload_pages`]. Errors give the replica up, as for
    /// [`Self::upload`].
    pub async fn upload_file(
        &mut self,
        file: &WholeFile,
        time_ms: u64,
    ) -> Result<Uploaded, ReplicaError> {
        self.refuse_if_given_up()?;
        let result = self.upload_file_inner(file, time_ms).await;
        self.given_up |= result.is_err();
        result
    }

    async fn upload_file_inner(
        &mut self,
        file: &WholeFile,
        time_ms: u64,
    ) -> Result<Uploaded, ReplicaError> {
        let seq = self.next_seq();
        let header = Entry {
            kind: Kind::Log,
            seq,
            time_ms,
            token: Token::fresh(self.generation)?,
            page_size: file.page_size,
            db_pages: file.db_pages,
            actor: self.root.as_str().to_owned(),
            pages: Vec::new(),
        };
        let total = header.encoded_len()
            + file.db_pages as u64 * (PAGE_NUMBER_BYTES + file.page_size as u64);
        if total > self.config.entry_bytes_max {
            return Err(ReplicaError::EntryTooLarge {
                size: total,
                limit: self.config.entry_bytes_max,
            });
        }
        let part_bytes = self.config.snapshot_part_bytes.max(SNAPSHOT_PART_BYTES_MIN);
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, ReplicaError>>(2);
        let reader = {
            let (file, header) = (file.clone(), header.clone());
            tokio::task::spawn_blocking(move || file.read_parts(&header, part_bytes, &tx))
        };
        let joined = |r: Result<_, tokio::task::JoinError>| {
            r.map_err(|e| ReplicaError::ChainBroken(format!("the file's reader: {e}")))
        };
        let leaves = if total <= part_bytes as u64 {
            let body = rx.recv().await;
            let leaves = joined(reader.await)??;
            match body {
                Some(Ok(body)) => self.append(seq, body).await?,
                Some(Err(e)) => return Err(e),
                None => return Err(ReplicaError::ChainBroken("the file's reader ended".into())),
            }
            leaves
        } else {
            let key = self.root.whole(seq, &header.token);
            let mut pointer = header.clone();
            pointer.kind = Kind::Pointer;
            let pointer = Bytes::from(pointer.encode(self.config.entry_bytes_max)?);
            if self.config.unsafe_pointer_before_body {
                self.append(seq, pointer.clone()).await?;
            }
            let sent = self.bucket.put_parts(&key, &mut rx, total).await;
            drop(rx);
            let leaves = joined(reader.await)?;
            let leaves = sent.and(leaves)?;
            if self.config.unsafe_pointer_before_body {
                // Already on the chain (the mutation under test).
            } else if let Err(e) = self.append(seq, pointer).await {
                if matches!(e, ReplicaError::ChainMoved { .. }) {
                    // Nobody will ever point at it. (Anything else: whether
                    // the pointer landed is unknown, so the body stays;
                    // collection removes it if it is not on the chain.)
                    let _ = self.bucket.delete(&key).await;
                }
                return Err(e);
            }
            leaves
        };
        let position = header.position();
        self.settle_head(
            position,
            time_ms,
            PageHashes::from_leaves(file.page_size, leaves),
        )?;
        self.count_entry(seq, true, total);
        self.track(seq, 1..=file.db_pages);
        // A repair (`needs_repair`) keeps its snapshot due: the job that
        // streams the file it just read lands it.
        self.snapshot_due |= self.snapshot_policy_due(file.bytes());
        if self.collect_due && self.collect().await.is_ok() {
            self.collect_due = false;
        }
        Ok(Uploaded::Appended {
            position,
            entry_bytes: total,
            snapshot: false,
        })
    }

    /// Whether `file` holds exactly the head's state, compared page by page
    /// with the head's hashes (a page in memory). False without a head.
    pub fn file_is_head(&self, file: &WholeFile) -> Result<bool, ReplicaError> {
        use std::os::unix::fs::FileExt;
        let Some(base) = &self.base else {
            return Ok(false);
        };
        if base.page_size() != file.page_size || base.pages() != file.db_pages {
            return Ok(false);
        }
        let f = std::fs::File::open(&file.path)?;
        let ps = file.page_size as u64;
        let mut page = vec![0u8; ps as usize];
        for no in 1..=file.db_pages {
            f.read_exact_at(&mut page, (no as u64 - 1) * ps)?;
            if !base.holds(no, &page) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether the replica knows the head's page hashes: without them the
    /// next upload carries every page ([`Self::upload_file`] or
    /// [`Self::upload`]).
    pub fn has_base(&self) -> bool {
        self.base.is_some()
    }

    fn base_pages(&self) -> u32 {
        // Only called when `base` is set.
        self.base.as_ref().map_or(0, |b| b.pages())
    }

    /// Records snapshots listed just now; the first sighting counts.
    fn saw_snapshots(&mut self, snaps: &[u64]) {
        let now = since_boot();
        self.snaps_seen
            .retain(|s, _| snaps.binary_search(s).is_ok());
        for s in snaps {
            self.snaps_seen.entry(*s).or_insert(now);
        }
    }

    /// Creates `log/<seq>` and makes sure it is on the chain.
    ///
    /// A create also succeeds on a key that collection deleted, so a
    /// writer that stalled long enough could "append" below a snapshot
    /// nobody reads past. Collection deletes an entry only once a snapshot
    /// at or above it has been known to its collector for the grace
    /// (`collect_grace_ms`), and that snapshot was written after the entry,
    /// which was written after the request that confirmed our head was sent
    /// (the anchor). So a create answered within the grace of the anchor
    /// landed before any deletion of its key: it either took a free key or
    /// found another writer's entry. Only a create answered later needs the
    /// check: list `snap/` and refuse if a snapshot at or above `seq`
    /// exists. Half the grace is used to leave room for clocks running at
    /// different rates.
    async fn append(&mut self, seq: u64, body: Bytes) -> Result<(), ReplicaError> {
        let key = self.root.log(seq);
        let sent = since_boot();
        match self.bucket.create(&key, body.clone()).await? {
            Created::Created => {}
            Created::AlreadyExists => {
                // Our own earlier attempt whose response was lost (the
                // store's retry then finds it), or someone else's entry:
                // only the bytes tell. Every body holds a fresh nonce.
                if !self.holds(&key, &body).await? {
                    return Err(ReplicaError::ChainMoved { seq });
                }
            }
        }
        let quick = self.anchor.is_some_and(|anchor| {
            since_boot().saturating_sub(anchor)
                < Duration::from_millis(self.config.append_check_after_ms())
        });
        if !quick && !self.config.unsafe_skip_append_check {
            // Deleted only after a snapshot at or above `seq` was written
            // (snapshots precede the deletes, and the newest snapshot is
            // never deleted), so one listing tells whether this entry is on
            // the chain or below a snapshot nobody reads past.
            let after = if seq == 0 {
                None
            } else {
                Some(self.root.snap(seq - 1))
            };
            let later = self
                .bucket
                .any_seq(
                    &self.root.snap_dir(),
                    after.as_deref(),
                    seq,
                    self.config.listing_bound(),
                )
                .await?;
            if later {
                return Err(ReplicaError::ChainMoved { seq });
            }
        }
        self.anchor = Some(sent);
        Ok(())
    }

    /// Whether the object at `key` is exactly `body` (read back after a
    /// create found the key taken). It is read under the body's own length:
    /// an object that runs past it is someone else's, and is not downloaded
    /// to find that out.
    async fn holds(&self, key: &str, body: &Bytes) -> Result<bool, ReplicaError> {
        holds(&self.bucket, key, body).await
    }

    /// Writes `snap/<head>` from `image` (the state at the head), then
    /// collects: entries at or below the oldest kept snapshot, then
    /// snapshots older than it.
    pub async fn snapshot(&mut self, image: &Image) -> Result<(), ReplicaError> {
        let head = self
            .head
            .ok_or_else(|| ReplicaError::ChainBroken("nothing to snapshot".into()))?;
        let snap = image.snapshot(head.seq, self.head_time_ms, head.token, self.root.as_str());
        let body = Bytes::from(snap.encode(self.config.entry_bytes_max)?);
        let key = self.root.snap(head.seq);
        let part_bytes = self.config.snapshot_part_bytes.max(SNAPSHOT_PART_BYTES_MIN);
        if body.len() > part_bytes {
            // In parts, as a streamed snapshot is (S3 refuses one PUT over
            // 5 GB): only the writer of `head` writes `snap/<head>`.
            let (tx, mut rx) = tokio::sync::mpsc::channel(body.len().div_ceil(part_bytes));
            for part in body.chunks(part_bytes) {
                tx.try_send(Ok(body.slice_ref(part)))
                    .expect("the channel holds every part");
            }
            drop(tx);
            self.bucket
                .put_parts(&key, &mut rx, body.len() as u64)
                .await?;
        } else if self.bucket.create(&key, body.clone()).await? == Created::AlreadyExists {
            // Only the writer of `head` snapshots it, and a snapshot's bytes
            // follow from the entry's state: anything else is not ours.
            if !self.holds(&key, &body).await? {
                return Err(ReplicaError::ChainMoved { seq: head.seq });
            }
        }
        self.snaps_seen.entry(head.seq).or_insert_with(since_boot);
        self.entries_since_snapshot = 0;
        self.bytes_since_snapshot = 0;
        self.snapshot_due = false;
        self.recent.clear();
        self.delta_base = Some(head.seq);
        self.bytes_since_base = 0;
        self.stream_failed = false;
        self.stream_failures = 0;
        self.tracking = Some(Tracking {
            from: head.seq,
            pages: BTreeMap::new(),
        });
        self.collect().await
    }

    /// Deletes what retention no longer needs. Never deletes the newest
    /// snapshot; deletes entries only at or below a kept snapshot that this
    /// writer has known for the grace (`collect_grace_ms`, see
    /// [`Replica::append`] for why), so entries a fresh snapshot covers
    /// stay until a later collection.
    ///
    /// Bounded like every listing: `snap/` is listed whole (at most
    /// `listing_keys_max` keys, or `listing_too_long`), and one collection
    /// deletes at most `listing_keys_max` entries, the oldest first; the
    /// next collection (after the next snapshot) goes on from there. An
    /// honest chain has far fewer entries to collect than that, so this
    /// only slows down the cleaning of a folder someone filled.
    pub async fn collect(&mut self) -> Result<(), ReplicaError> {
        let bound = self.config.listing_bound();
        let snaps = self
            .bucket
            .list_seqs(&self.root.snap_dir(), None, bound)
            .await?;
        self.saw_snapshots(&snaps);
        if snaps.is_empty() {
            return Ok(());
        }
        let keep_from = snaps.len().saturating_sub(self.config.snapshots_keep);
        let now = since_boot();
        let grace = Duration::from_millis(self.config.collect_grace_ms);
        let aged = |s: &u64| {
            self.config.unsafe_collect_without_grace
                || self
                    .snaps_seen
                    .get(s)
                    .is_some_and(|seen| now.saturating_sub(*seen) >= grace)
        };
        let cover = snaps[..=keep_from].iter().rev().find(|s| aged(s)).copied();
        let logs: Vec<u64> = match cover {
            None => Vec::new(),
            Some(cover) => {
                self.bucket
                    .lowest_seqs(&self.root.log_dir(), 0..=cover, bound)
                    .await?
                    .0
            }
        };
        for s in logs {
            self.bucket.delete(&self.root.log(s)).await?;
        }
        if let Some(cover) = cover {
            // The bodies pointers at or below it named (ADR 0038), and any
            // a writer left there without a pointer.
            let wholes = self
                .bucket
                .list(&self.root.whole_dir(), None, bound)
                .await?;
            for key in wholes {
                if parse_whole(&key).is_some_and(|s| s <= cover) {
                    self.bucket.delete(&key).await?;
                }
            }
        }
        for s in &snaps[..keep_from] {
            self.bucket.delete(&self.root.snap(*s)).await?;
        }
        let newest_aged = snaps.iter().rev().find(|s| aged(s)).copied();
        self.collect_deltas(newest_aged, bound).await
    }

    /// Deletes the deltas no restore will read: those from a snapshot below
    /// the newest one known for the grace, and those a newer delta from
    /// the same snapshot replaces once that one is known for the grace (a
    /// restore that listed the older one a moment ago still finds it).
    async fn collect_deltas(
        &mut self,
        newest_aged_snapshot: Option<u64>,
        bound: u64,
    ) -> Result<(), ReplicaError> {
        let keys = self
            .bucket
            .list(&self.root.delta_dir(), None, bound)
            .await?;
        let deltas: std::collections::BTreeSet<(u64, u64)> =
            keys.iter().filter_map(|k| parse_delta(k)).collect();
        let now = since_boot();
        self.deltas_seen.retain(|d, _| deltas.contains(d));
        for d in &deltas {
            self.deltas_seen.entry(*d).or_insert(now);
        }
        let grace = Duration::from_millis(self.config.collect_grace_ms);
        let aged = |d: &(u64, u64)| {
            self.config.unsafe_collect_without_grace
                || self
                    .deltas_seen
                    .get(d)
                    .is_some_and(|seen| now.saturating_sub(*seen) >= grace)
        };
        // Per snapshot, the newest delta known for the grace: one pass over
        // the listing (sorted by snapshot, then seq).
        let mut newest_aged: BTreeMap<u64, u64> = BTreeMap::new();
        for d in deltas.iter().filter(|d| aged(d)) {
            newest_aged.insert(d.0, d.1);
        }
        let gone: Vec<(u64, u64)> = deltas
            .iter()
            .filter(|(base, seq)| {
                newest_aged_snapshot.is_some_and(|s| *base < s)
                    || newest_aged.get(base).is_some_and(|newest| newest > seq)
            })
            .copied()
            .collect();
        for (base, seq) in gone {
            self.bucket.delete(&self.root.delta(base, seq)).await?;
            self.deltas_seen.remove(&(base, seq));
        }
        Ok(())
    }
}

/// Whether the object at `key` is exactly `body` (read back after a
/// create found the key taken). It is read under the body's own length:
/// an object that runs past it is someone else's, and is not downloaded
/// to find that out.
async fn holds(bucket: &Bucket, key: &str, body: &Bytes) -> Result<bool, ReplicaError> {
    let limit = body.len() as u64;
    match bucket.get_bounded(key, "own_body_bytes", limit).await {
        Ok(there) => Ok(there == *body),
        Err(ReplicaError::ObjectTooLarge { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Creates `body` at `key`, accepting only our own earlier attempt when the
/// key is taken (`ChainMoved` for anyone else's object).
async fn create_or_mine(
    bucket: &Bucket,
    key: &str,
    seq: u64,
    body: &Bytes,
) -> Result<(), ReplicaError> {
    if bucket.create(key, body.clone()).await? == Created::AlreadyExists
        && !holds(bucket, key, body).await?
    {
        return Err(ReplicaError::ChainMoved { seq });
    }
    Ok(())
}

/// Deletes an actor from the bucket (ADR 0007, "Deleting an actor"); how
/// many objects it deleted or erased. The owner must have stopped
/// uploading (no upload in flight); `generation` and `now_ms` stamp the
/// tombstone like an entry.
///
/// 1. The tombstone: `log/<head + 1>` with create-only, the same race every
///    entry runs, so the deletion has its place in the chain and any
///    writer of the old life that tries that seq fails. Then the same
///    bytes at `snap/<head + 1>`, where restores start from. If the head
///    already is a tombstone (a delete run again after a crash part-way,
///    or of a deleted actor), it is reused. A bucket with nothing for the
///    actor gets nothing.
/// 2. Snapshots below the tombstone are deleted (they hold the data; no
///    writer of the old life creates one without first appending).
/// 3. Entries below the tombstone are overwritten in place with a
///    tombstone of their own seq, oldest first: their data is gone, but
///    their keys stay taken, so a stalled writer's create of any of them
///    fails as a create (no timing involved). Objects no longer than such a
///    tombstone hold no page and are left as they are. Collection removes
///    them later, under the grace, like any entry a snapshot covers.
///
/// A folder of any length is handled in passes that each hold at most
/// `listing_keys_max` seqs (the lowest ones left); finding the head reads
/// the listings once more, holding one seq. Keys that are not a seq
/// directly in `snap/` or `log/` are left alone, as ever.
///
/// With the test-only `unsafe_delete_erases_chain`, every key is deleted
/// instead and the next life starts again at seq 0.
pub async fn delete_all(
    bucket: &Bucket,
    id: &ActorId,
    generation: u64,
    config: &ReplicaConfig,
    now_ms: u64,
) -> Result<u64, ReplicaError> {
    let root = ActorRoot::new(id, bucket.prefix_bytes())?;
    if config.unsafe_delete_erases_chain {
        let snaps = erase(bucket, &root, Kind::Snapshot, 0..=u64::MAX, None, config).await?;
        let logs = erase(bucket, &root, Kind::Log, 0..=u64::MAX, None, config).await?;
        let deltas = erase_deltas(bucket, &root).await?;
        let wholes = erase_wholes(bucket, &root).await?;
        return Ok(snaps + logs + deltas + wholes);
    }
    let mut attempt = 0;
    let tombstone = loop {
        attempt += 1;
        match place_tombstone(bucket, &root, generation, config, now_ms).await {
            // Someone appended between the listing and the create: the
            // deletion goes above their entry.
            Err(ReplicaError::ChainMoved { .. }) if attempt < RESTORE_ATTEMPTS_MAX => continue,
            other => break other?,
        }
    };
    let Some(tombstone) = tombstone else {
        return Ok(0);
    };
    let Some(below) = tombstone.seq.checked_sub(1) else {
        return Ok(0);
    };
    let snaps = erase(bucket, &root, Kind::Snapshot, 0..=below, None, config).await?;
    let deltas = erase_deltas(bucket, &root).await?;
    let wholes = erase_wholes(bucket, &root).await?;
    let logs = erase(
        bucket,
        &root,
        Kind::Log,
        0..=below,
        Some(&tombstone),
        config,
    )
    .await?;
    Ok(snaps + deltas + wholes + logs)
}

/// Deletes every delta of the actor (they hold its data, like snapshots).
async fn erase_deltas(bucket: &Bucket, root: &ActorRoot) -> Result<u64, ReplicaError> {
    erase_folder(bucket, &root.delta_dir(), |k| parse_delta(k).is_some()).await
}

/// Deletes every body in `whole/` (ADR 0038): the pointers to them are
/// erased in place like any entry, and a pointer holds no page itself.
async fn erase_wholes(bucket: &Bucket, root: &ActorRoot) -> Result<u64, ReplicaError> {
    erase_folder(bucket, &root.whole_dir(), |k| parse_whole(k).is_some()).await
}

/// Deletes the keys under `dir` that `ours` accepts, a page of keys at a
/// time; how many.
async fn erase_folder(
    bucket: &Bucket,
    dir: &str,
    ours: impl Fn(&str) -> bool,
) -> Result<u64, ReplicaError> {
    /// Keys one page of the listing holds.
    const PAGE: usize = 1000;
    let mut after: Option<String> = None;
    let mut n = 0;
    loop {
        let page = bucket.list_page(dir, after.as_deref(), PAGE).await?;
        for key in &page {
            if ours(key) {
                bucket.delete(key).await?;
                n += 1;
            }
        }
        if page.len() < PAGE {
            return Ok(n);
        }
        after = page.last().cloned();
    }
}

/// Step 1 of [`delete_all`]: the tombstone in `log/` and `snap/` at the
/// seq above the head (or the head, if it is one already); `None` when
/// the bucket has nothing for the actor.
async fn place_tombstone(
    bucket: &Bucket,
    root: &ActorRoot,
    generation: u64,
    config: &ReplicaConfig,
    now_ms: u64,
) -> Result<Option<Entry>, ReplicaError> {
    let snap_head = bucket.highest_seq(&root.snap_dir()).await?;
    let log_head = bucket.highest_seq(&root.log_dir()).await?;
    let Some(head) = snap_head.max(log_head) else {
        return Ok(None);
    };
    let head_key = if log_head == Some(head) {
        root.log(head)
    } else {
        root.snap(head)
    };
    let (tombstone, body) = match read_tombstone(bucket, root, &head_key, head, config).await? {
        Some(found) => found,
        None => {
            let seq = head.checked_add(1).ok_or_else(|| {
                ReplicaError::ChainBroken(format!("no seq above {head}: actor=`{}`", root.as_str()))
            })?;
            let t = Entry::tombstone(seq, now_ms, Token::fresh(generation)?, root.as_str());
            let body = Bytes::from(t.encode(config.entry_bytes_max)?);
            create_or_mine(bucket, &root.log(seq), seq, &body).await?;
            (t, body)
        }
    };
    // The same bytes as a snapshot, where restores start from; only the
    // writer of `log/<seq>` writes `snap/<seq>`, so anything else there is
    // not ours.
    create_or_mine(bucket, &root.snap(tombstone.seq), tombstone.seq, &body).await?;
    Ok(Some(tombstone))
}

/// The tombstone at `key` (the head, at `seq`) and its bytes, if the
/// object there is one. Anything else (an entry, a snapshot, an object
/// that fails its checks, one collected meanwhile) is not.
async fn read_tombstone(
    bucket: &Bucket,
    root: &ActorRoot,
    key: &str,
    seq: u64,
    config: &ReplicaConfig,
) -> Result<Option<(Entry, Bytes)>, ReplicaError> {
    let t = Entry::tombstone(seq, 0, Token::fresh(0)?, root.as_str());
    let limit = t.encoded_len();
    let body = match bucket.get_bounded(key, "tombstone_bytes", limit).await {
        Ok(body) => body,
        Err(e) if e.is_not_found() || e.is_bad_bucket_input() => return Ok(None),
        Err(e) => return Err(e),
    };
    match Entry::decode(key, &body, config.entry_bytes_max) {
        Ok(e) if e.kind == Kind::Tombstone && e.seq == seq && e.actor == root.as_str() => {
            Ok(Some((e, body)))
        }
        _ => Ok(None),
    }
}

/// Deletes the seqs of `range` in the folder of `kind`, or, given a
/// tombstone, overwrites each that holds pages with a tombstone of its
/// own seq (the tombstone's token and time). In passes of at most
/// `listing_keys_max` seqs, the lowest first; how many objects it changed.
async fn erase(
    bucket: &Bucket,
    root: &ActorRoot,
    kind: Kind,
    range: RangeInclusive<u64>,
    tombstone: Option<&Entry>,
    config: &ReplicaConfig,
) -> Result<u64, ReplicaError> {
    let (dir, key): (String, fn(&ActorRoot, u64) -> String) = match kind {
        Kind::Snapshot => (root.snap_dir(), ActorRoot::snap),
        Kind::Log | Kind::Tombstone | Kind::Pointer => (root.log_dir(), ActorRoot::log),
        Kind::Delta => unreachable!("deltas are erased by erase_deltas"),
    };
    let (mut from, end) = range.into_inner();
    let mut n = 0;
    // Each pass starts above the last seq handled, so the passes end even
    // if a store kept listing what it deleted (or an overwrite leaves).
    while from <= end {
        let (batch, more) = bucket
            .lowest_seqs_sized(&dir, from..=end, config.listing_bound())
            .await?;
        for &(s, size) in &batch {
            let k = key(root, s);
            match tombstone {
                None => bucket.delete(&k).await?,
                Some(t) => {
                    let marker = Entry::tombstone(s, t.time_ms, t.token, root.as_str());
                    if size <= marker.encoded_len() {
                        // No page in it: nothing to erase.
                        continue;
                    }
                    let body = Bytes::from(marker.encode(config.entry_bytes_max)?);
                    bucket.overwrite(&k, body).await?;
                }
            }
            n += 1;
        }
        match batch.last().and_then(|(s, _)| s.checked_add(1)) {
            Some(next) if more => from = next,
            _ => break,
        }
    }
    Ok(n)
}

/// Makes the database file `input` the actor's latest state in the
/// bucket, as the next entry of its chain (what `wasmkeep restore` does).
/// `scratch` is an empty folder for the current state. A node that holds
/// the actor meanwhile finds its chain moved on its next upload, gives the
/// actor up and restores this state.
///
/// The input must pass `PRAGMA quick_check`. It is copied into `scratch`
/// (through SQLite if its write-ahead log still holds commits: a plain
/// file then) and uploaded whole, read page by page
/// ([`Replica::upload_file`]), whatever its size; a snapshot of it follows
/// when the policy asks for one, so that restores never pile entries of
/// every page on the chain. `Unchanged` if the bucket's head already is
/// this state.
pub async fn put_back(
    bucket: &Bucket,
    id: &ActorId,
    input: &Path,
    generation: u64,
    config: ReplicaConfig,
    scratch: &Path,
    now_ms: u64,
) -> Result<Uploaded, ReplicaError> {
    let copy = scratch.join("input.db");
    match WholeFile::probe(input) {
        Ok(_) => {
            std::fs::copy(input, &copy)?;
        }
        // Commits in its log (or a journal): SQLite reads them.
        Err(_) => std::fs::write(&copy, Image::read_path(input)?.bytes())?,
    }
    quick_check(&copy, &input.display().to_string())?;
    let db_path = scratch.join("actor.db");
    let (mut replica, _) = Replica::open(bucket, id, &db_path, generation, config, now_ms).await?;
    // The replica streams its snapshot from its own path: the input is it.
    std::fs::rename(&copy, &db_path)?;
    let file = WholeFile::probe(&db_path)?;
    if replica.file_is_head(&file)? {
        return Ok(Uploaded::Unchanged);
    }
    let uploaded = replica.upload_file(&file, now_ms).await?;
    if let Some(job) = replica.snapshot_job() {
        let landed = job.run().await?;
        replica.snapshot_landed(landed);
        replica.collect().await?;
    }
    Ok(uploaded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        /// Folders [`sync_folder`] synced on this thread.
        pub(super) static SYNCED: RefCell<Vec<PathBuf>> = const { RefCell::new(Vec::new()) };
    }

    /// A restore into a folder that does not exist yet (an actor new to
    /// this node) makes every missing folder with its entry synced in its
    /// parent, the class folder's entry for the actor's folder included.
    #[test]
    fn a_restores_new_folders_are_each_synced_in_their_parent() {
        let root = tempfile::tempdir().unwrap();
        let actors = root.path().join("actors");
        std::fs::create_dir(&actors).unwrap();
        let class = actors.join("t").join("app").join("class");
        let dir = class.join("61");
        make_folders(&dir).unwrap();
        assert!(dir.is_dir());
        let synced = SYNCED.with_borrow_mut(std::mem::take);
        let app = class.parent().unwrap().to_owned();
        let tenant = app.parent().unwrap().to_owned();
        assert_eq!(synced, [actors, tenant, app, class]);
        // A folder already there is not synced again.
        make_folders(&dir).unwrap();
        assert!(SYNCED.with_borrow(Vec::is_empty));
    }
}
