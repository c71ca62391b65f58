//! The node's commit log (ADR 0074): a commit is durable once its record is.
//!
//! Actors commit with `synchronous=NORMAL`: SQLite writes the commit to the
//! actor's write-ahead log in the page cache and returns. Before a reply
//! leaves, the commit must survive a power cut. ADR 0004 did that with one
//! `syncfs` over every file a group of commits touched; here every write
//! SQLite makes to an actor's write-ahead log is also appended, as a
//! record (which database, at which offset, which bytes), to one file per
//! node, and a group of commits is made durable by one `fdatasync` of that
//! file. The actors' logs themselves are synced rarely, by a *cut*.
//!
//! The rules that make this as safe as syncing every file:
//!
//! - **Every write to a log is recorded, after it reached the file and
//!   before the commit returns** (the VFS, [`crate::wal_index`], records in
//!   the same call that hands the write to the file). A group's barrier,
//!   which runs after its commits returned, writes and syncs every record
//!   taken so far, so every frame and every log header of an acknowledged
//!   commit is in the synced log.
//! - **Replay puts the bytes back where SQLite wrote them, in the order it
//!   wrote them** ([`recover`], before any actor opens). A log then holds
//!   what SQLite had written into the page cache before the power went,
//!   for every write up to the last synced record: headers included, so a
//!   log that started over after a checkpoint starts over again, and frames
//!   of an older generation left past the new one's end are ignored by
//!   SQLite (their salt differs). A power cut becomes a crash of the
//!   process, which SQLite recovers from by itself. A checkpoint is not
//!   recorded: before it SQLite syncs the log, which is the barrier here
//!   (below), after it the database (`synchronous=NORMAL`), and a log
//!   starts over only after that.
//! - **A record only goes back into the database it was written for.**
//!   Each record names its database file by path and by identity (device,
//!   inode and creation time). A file put in its place since (a restore, an
//!   actor deleted and created again) has another identity, and its
//!   records are skipped: replaying an older database's frames into a new
//!   one would corrupt it. The device number is recorded but not compared:
//!   a reboot may number the data directory's filesystem anew. A rename
//!   keeps a file's identity, so a folder of actors that moves (a class
//!   migration) is followed by a cut ([`move_folder`]): records from before
//!   it would name the databases again after a move back.
//! - **The log forgets a record only after the file it describes is
//!   durable.** The log is a run of numbered segments; when one is full,
//!   appends go to the next, and a *cut* (`syncfs` of the data directory,
//!   after the actors' logs were written back one at a time, ADR 0080;
//!   on a thread of its own) makes every write recorded in the older ones
//!   durable before they are deleted. Replay takes only the newest run of
//!   consecutive segment numbers, so an older segment whose deletion did
//!   not reach the disk is never replayed after a newer one's was lost.
//! - **A new file is made durable by `syncfs`, not by the log.** The first
//!   batch of a new actor names the folders its creation wrote: such a
//!   group is made durable by one `syncfs` ([`make_durable`]), as before
//!   (the log records the log's writes, not a database's creation). A
//!   connection that closes before a batch took its folders makes them
//!   durable at its close; a deleted actor's folder is renamed away
//!   durably before the delete returns ([`crate::sync::delete_folder`]).
//! - **An actor's log is never durable ahead of the log's records of it.**
//!   A lone file is made durable by the barrier too, and SQLite's sync of
//!   an actor's log (before every checkpoint) is the barrier instead of
//!   the file's own `fsync`: replay of a shorter log over a file that went
//!   further would put an older generation back over it.
//! - **A failed `syncfs` is final** (and so is a failed write-back a cut
//!   runs before its `syncfs`, ADR 0080). Every `syncfs` the log relies on (a
//!   cut's, a new actor's group) goes, one at a time, through a descriptor
//!   of the data directory opened when the log started, so a write-back
//!   that failed since is reported to it ([`FsSync`]); the log then fails
//!   every later commit and forgets no segment until a restart replays
//!   them. With no fsync of an
//!   actor's log of its own, a `syncfs` is the only place such a failure
//!   shows. A failed log refuses every write to an actor's log before it
//!   reaches the file ([`Tap::check`]), so that a commit that returned an
//!   error is not found committed in its log after the restart.
//!
//! Each rule has a test that fails without it, its unsafe variant kept
//! runnable ([`UnsafeRules`], tests only): a recorded run's every write is
//! followed by a simulated power cut (`tests::power_cut_at_every_write`).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use crate::sync;

/// The folder of the data directory that holds the log's segments.
pub const DIR: &str = "commit-log";
/// The largest a segment is made: it is written full of zeros before its
/// first record (or is a cut segment used again), so that appending
/// changes no file size and allocates no block, and an `fdatasync` writes
/// the records alone. Once full, appends go to a new segment and the full
/// one is cut (its records forgotten once a `syncfs` made the actors' logs
/// durable). Disk use is about three segments. A cut writes back
/// everything written since the last one; done by one `syncfs`, every
/// barrier behind it waited for all of it (W1's p99 5–7 times its p50
/// under `wrk`), so the cut first writes back the actors' logs one at a
/// time ([`write_back`],
/// ADR 0080). 16 MiB segments shortened the stalls too, but W1-durable-large
/// lost 11–19% of its rate and doubled its p99 (ADR 0074, "eighth part").
pub const SEGMENT_BYTES: u64 = 128 * 1024 * 1024;
/// A node's first segment; each next one is twice the one before, up to
/// [`SEGMENT_BYTES`]: a quiet node (a test's, a dev loop's) writes 8 MiB
/// of zeros at its first start, not the full size.
pub(crate) const FIRST_SEGMENT_BYTES: u64 = 8 * 1024 * 1024;
/// Records held in memory, waiting for the next barrier, before the writer
/// that adds one writes them all to the segment itself (alarms fired by
/// the timer commit without a barrier). Large enough that a burst of
/// alarms (W2's 2,000 write about 24 MB) is written out after it, by the
/// next barrier, not by the workers while it runs.
pub(crate) const PENDING_BYTES_MAX: usize = 64 * 1024 * 1024;
/// The most bytes one record may hold; replay stops at a larger length (a
/// torn or foreign tail). SQLite's writes to a log are at most a page (64
/// KiB) and the VFS gathers at most 64 KiB (ADR 0029).
pub(crate) const RECORD_BYTES_MAX: usize = 1024 * 1024;
/// The most actors' logs a cut writes back one at a time before its
/// `syncfs` ([`write_back`]); the `syncfs` alone writes back the rest.
pub(crate) const WRITE_BACK_FILES_MAX: usize = 65_536;
/// How long a cut writes back logs one at a time before it leaves the
/// rest to its `syncfs`: a node with many actors each written a little
/// would otherwise hold the cut (and the segment growing meanwhile) for
/// a system call per file.
pub(crate) const WRITE_BACK_TIME_MAX: std::time::Duration = std::time::Duration::from_secs(1);

const MAGIC: u32 = 0x574b_434c;
/// Magic, payload length, CRC-32 of the payload (mixed with the segment's
/// number, so that a used segment's old records do not read as records
/// when it serves again).
const HEADER_BYTES: usize = 12;
const SEGMENT_SUFFIX: &str = ".log";
/// A segment ready to serve next (never read by replay).
const SPARE: &str = "spare";
const SPARE_TMP: &str = "spare.tmp";

/// What a record's checksum is mixed with in segment `seq`.
fn mask(seq: u64) -> u32 {
    (seq as u32).wrapping_mul(0x9e37_79b1) ^ ((seq >> 32) as u32)
}

/// Which rule a test breaks (each runs against the safe default too).
#[cfg(test)]
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct UnsafeRules {
    /// Delete a full segment without the `syncfs` first.
    pub(crate) cut_without_syncfs: bool,
    /// Replay a record into whatever file is at its path now.
    pub(crate) replay_into_any_file: bool,
    /// Do not record a log's header (SQLite writing offset 0).
    pub(crate) skip_log_headers: bool,
    /// Make a new actor's first batch durable through the log alone.
    pub(crate) new_files_through_log: bool,
    /// Replay every segment found, not only the newest consecutive run.
    pub(crate) replay_every_segment: bool,
    /// Sync a lone file by itself (`fdatasync`), ahead of the log.
    pub(crate) lone_file_by_itself: bool,
    /// Sync an actor's log for a checkpoint by itself (`fsync`), without
    /// the barrier first: the log may be durable ahead of its records.
    pub(crate) sync_log_before_records: bool,
    /// Skip the sync SQLite makes after a log's header when the log
    /// starts over, in every log, not only a new one.
    pub(crate) skip_every_header_sync: bool,
    /// A `syncfs` of the log's, or a cut's write-back of a file, that
    /// failed leaves the log working (the next may succeed with the
    /// failed pages lost).
    pub(crate) cut_failure_not_final: bool,
    /// A cut writes back each database file too, not only its log (ADR
    /// 0080): closing the descriptor drops this process's POSIX locks on
    /// the file, a reader's among them.
    pub(crate) write_back_database_files: bool,
    /// A write to an actor's log that the log refused to record after it
    /// reached the file (the log failed meanwhile) stays in the file.
    pub(crate) keep_refused_writes: bool,
    /// A record is taken first and the records past the pending bound
    /// written out after it: a failure of that write-out refuses a record
    /// that a segment may hold, which replay writes back over the write
    /// taken back.
    pub(crate) take_record_before_write_out: bool,
    /// A database created by a connection that closes before any batch
    /// took its new folders (a turn that failed before its first commit)
    /// is left as the page cache holds it: the next open finds it existing
    /// and its commits are acknowledged through the log alone.
    pub(crate) close_unsynced_creation: bool,
    /// An actor's folder deleted without syncing its parent folder after
    /// the rename ([`crate::sync::delete_folder`]).
    pub(crate) delete_without_folder_sync: bool,
    /// Replay compares a file's device number too: after a reboot that
    /// numbered the filesystem's device anew, every record is skipped.
    pub(crate) identity_with_device: bool,
    /// Replay forgets every segment at once, the newest with the others,
    /// under one sync of their folder.
    pub(crate) forget_newest_with_the_rest: bool,
    /// A folder of actors moves without a cut after it: records from
    /// before the move stay, and name the databases again after a move
    /// back.
    pub(crate) move_without_cut: bool,
}

#[cfg(test)]
thread_local! {
    pub(crate) static UNSAFE_RULES: std::cell::Cell<UnsafeRules> =
        std::cell::Cell::new(UnsafeRules::default());
}

#[cfg(test)]
pub(crate) fn rules() -> UnsafeRules {
    UNSAFE_RULES.get()
}

/// A database file as the log names it: its device, inode and creation
/// time, which a file put in its place does not share.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Identity {
    dev: u64,
    ino: u64,
    born_ns: u64,
}

impl Identity {
    /// Whether `self` and `other` name the same file. The device number is
    /// left out: the data directory's filesystem may come back under
    /// another one after a reboot (device-mapper, NVMe and loop devices
    /// are numbered at boot, btrfs at mount), and replay, which follows
    /// that reboot, would skip every record. Records are only replayed
    /// under the log's own data directory, one filesystem.
    fn same_file(&self, other: &Identity) -> bool {
        #[cfg(test)]
        if rules().identity_with_device {
            return self == other;
        }
        self.ino == other.ino && self.born_ns == other.born_ns
    }

    fn of(path: &Path) -> io::Result<Identity> {
        let m = std::fs::metadata(path)?;
        let born_ns = m
            .created()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64);
        let id = Identity {
            dev: m.dev(),
            ino: m.ino(),
            born_ns,
        };
        #[cfg(test)]
        let id = tests::alias(id);
        Ok(id)
    }
}

/// One node's commit log.
pub struct CommitLog {
    root: PathBuf,
    /// Every `syncfs` the log relies on ([`FsSync`]).
    fs: Arc<FsSync>,
    dir: PathBuf,
    /// [`SEGMENT_BYTES`], smaller in tests.
    segment_max: u64,
    /// Held while the spare segment is made or taken.
    spare: Arc<Mutex<()>>,
    /// Records not yet written to the segment, in the order they were taken.
    pending: Mutex<Pending>,
    segment: Mutex<Segment>,
    /// A cut is running (at most one at a time).
    cutting: Arc<AtomicBool>,
    /// Why a write or sync of a segment, or a `syncfs` the log relies on,
    /// failed: records or the pages they stand for may be lost, so no
    /// commit may be called durable through the log again, and no segment
    /// forgotten (until a restart replays what reached the disk).
    failed: Arc<Mutex<Option<String>>>,
    /// Bytes of records written to segments, since the node started.
    pub(crate) bytes_total: AtomicU64,
    /// Cuts completed (segments forgotten after a `syncfs`).
    pub(crate) cuts_total: Arc<AtomicU64>,
    /// [`Touched::epoch`], read without the lock: a tap whose log was
    /// named in it takes no lock.
    epoch: AtomicU64,
    touched: Mutex<Touched>,
}

/// The actors' logs written since the last cut began, for the next cut to
/// write back ahead of its `syncfs` (ADR 0080).
#[derive(Default)]
struct Touched {
    /// Cuts begun; a tap names its log once in each.
    epoch: u64,
    /// At most [`WRITE_BACK_FILES_MAX`].
    logs: Vec<Arc<Path>>,
}

struct Segment {
    file: File,
    seq: u64,
    len: u64,
    /// The bytes made ready for it: past them it is full.
    capacity: u64,
    /// Of the bytes of records ever taken ([`Pending::taken_total`]), how
    /// many were written to a segment, and how many of those are synced.
    written_through: u64,
    synced_through: u64,
    /// Where [`CommitLog::write_out`] gathers records for one write.
    gather: Vec<u8>,
}

/// What [`recover`] found and put back.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// Segments read (the newest consecutive run).
    pub segments: usize,
    /// Records written back into their logs.
    pub replayed: u64,
    /// Records skipped: their database is gone or was replaced.
    pub skipped: u64,
    /// The number the next segment takes.
    pub next_seq: u64,
}

/// What the VFS holds for one open database: where its log's writes are
/// recorded and the name they are recorded under.
pub struct Tap {
    log: Arc<CommitLog>,
    key: Box<[u8]>,
    /// The database's write-ahead log, for the next cut's write-back.
    wal: Arc<Path>,
    /// The [`Touched::epoch`] this log was last named in.
    named_in: AtomicU64,
}

impl Tap {
    /// The log this tap records into.
    pub(crate) fn log(&self) -> &CommitLog {
        &self.log
    }

    /// Makes every record taken so far durable, in place of SQLite's sync
    /// of this database's log (before every checkpoint): a checkpoint must
    /// never carry the database past what the log can replay.
    pub(crate) fn barrier(&self) -> io::Result<()> {
        self.log.barrier()
    }

    /// The error a failed log holds, if any: no write to the log may reach
    /// the file then (its record would be refused).
    pub(crate) fn check(&self) -> io::Result<()> {
        self.log.check()
    }

    /// Records one write SQLite made to this database's log, which reached
    /// the file. An error means the record was not taken (the log failed):
    /// the caller fails the write, so that its commit fails, and may take
    /// the write back, as no segment will hold it.
    pub(crate) fn record(&self, offset: i64, data: &[u8]) -> io::Result<()> {
        #[cfg(test)]
        if rules().skip_log_headers && offset == 0 {
            return Ok(());
        }
        #[cfg(test)]
        if tests::FAIL_RECORD.get().fails(data) {
            tests::FAIL_RECORD.set(tests::FailRecord::No);
            return Err(self
                .log
                .fail(io::Error::other("injected failure of the log")));
        }
        self.log.check()?;
        if self.named_in.load(Ordering::Relaxed) != self.log.epoch.load(Ordering::Relaxed) {
            self.log.name(&self.wal, &self.named_in);
        }
        // Encoded before the lock: the copy (and any page the allocator
        // faults in for it) runs beside the other workers, not while they
        // wait (ADR 0074).
        let mut record = Vec::new();
        encode(&mut record, &self.key, offset.max(0) as u64, data);
        // The records past the bound are written out before this one is
        // taken: a failure of that write leaves this record in no segment,
        // so that the write it stands for can be taken back (the bound is
        // passed by at most the records taken meanwhile).
        let mut p = self.log.lock_pending();
        #[cfg(test)]
        if rules().take_record_before_write_out {
            p.push(record);
            let full = p.bytes >= PENDING_BYTES_MAX;
            drop(p);
            if full {
                self.log.write_pending()?;
            }
            return Ok(());
        }
        if p.bytes >= PENDING_BYTES_MAX {
            drop(p);
            self.log.write_pending()?;
            p = self.log.lock_pending();
        }
        p.push(record);
        Ok(())
    }
}

/// Every started log, by data directory, for the VFS to find the one an
/// actor's database belongs to (tests run several nodes in one process).
type Started = Vec<(PathBuf, Weak<CommitLog>)>;

fn logs() -> MutexGuard<'static, Started> {
    static LOGS: OnceLock<Mutex<Started>> = OnceLock::new();
    LOGS.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The tap for the database file at `db_path`, if a started log's data
/// directory holds it.
pub(crate) fn tap_for(db_path: &Path) -> Option<Tap> {
    let log = {
        let mut all = logs();
        all.retain(|(_, w)| w.strong_count() > 0);
        all.iter()
            .filter(|(root, _)| db_path.starts_with(root))
            .max_by_key(|(root, _)| root.as_os_str().len())
            .and_then(|(_, w)| w.upgrade())?
    };
    let rel = db_path.strip_prefix(&log.root).ok()?;
    let id = Identity::of(db_path).ok()?;
    let rel = rel.as_os_str().as_encoded_bytes();
    let mut key = Vec::with_capacity(2 + rel.len() + 24);
    key.extend_from_slice(&(rel.len() as u16).to_le_bytes());
    key.extend_from_slice(rel);
    key.extend_from_slice(&id.dev.to_le_bytes());
    key.extend_from_slice(&id.ino.to_le_bytes());
    key.extend_from_slice(&id.born_ns.to_le_bytes());
    Some(Tap {
        log,
        key: key.into_boxed_slice(),
        wal: Arc::from(wal_of(db_path)),
        named_in: AtomicU64::new(u64::MAX),
    })
}

/// Whether a started log's data directory holds `db_path`.
pub(crate) fn covers(db_path: &Path) -> bool {
    logs()
        .iter()
        .any(|(root, w)| w.strong_count() > 0 && db_path.starts_with(root))
}

/// Records waiting for the segment, each encoded by the worker that took
/// it before it took the lock: under the lock every worker takes, a record
/// is only moved into the list. (Copying records into shared 1 MiB chunks
/// under the lock made W2's alarm burst, which commits tens of megabytes
/// with no barrier, fault every chunk's pages in while the other workers
/// waited: about 20 µs a record, a third of it waiting.)
#[derive(Default)]
struct Pending {
    records: Vec<Vec<u8>>,
    bytes: usize,
    /// Bytes of records taken since the log started, never reset: a
    /// barrier whose records a sync already covered returns at once.
    taken_total: u64,
}

/// The most bytes of records [`CommitLog::write_out`] gathers for one
/// write to the segment (a larger record is written by itself).
const WRITE_BYTES_MAX: usize = 1024 * 1024;

impl Pending {
    fn push(&mut self, record: Vec<u8>) {
        self.bytes += record.len();
        self.taken_total += record.len() as u64;
        self.records.push(record);
    }
}

fn encode(out: &mut Vec<u8>, key: &[u8], offset: u64, data: &[u8]) {
    let payload_len = key.len() + 8 + data.len();
    out.reserve(HEADER_BYTES + payload_len);
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&(payload_len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(key);
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(data);
    // The checksum is filled in when the record is written out, by the
    // thread that writes it (`seal`), not by the worker that commits.
}

/// Fills in the checksum of every record in `bytes`, mixed with segment
/// `seq`'s number.
fn seal(bytes: &mut [u8], seq: u64) {
    let m = mask(seq);
    let mut at = 0;
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes")) as usize;
        let crc = crc32fast::hash(&bytes[at + HEADER_BYTES..at + HEADER_BYTES + len]) ^ m;
        bytes[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
        at += HEADER_BYTES + len;
    }
}

/// One record read back from a segment.
struct Record<'a> {
    rel: &'a [u8],
    id: Identity,
    offset: u64,
    data: &'a [u8],
}

/// The records of segment `seq`'s bytes, up to the first that is not one
/// of its whole records; the second value is how many bytes were left after
/// the last (zeros, an older use's records, or a torn write).
fn decode(bytes: &[u8], seq: u64) -> (Vec<Record<'_>>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    let u32_at = |b: &[u8], i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    while bytes.len() - at >= HEADER_BYTES {
        let len = u32_at(bytes, at + 4) as usize;
        if u32_at(bytes, at) != MAGIC
            || len > RECORD_BYTES_MAX
            || bytes.len() - at - HEADER_BYTES < len
        {
            break;
        }
        let p = &bytes[at + HEADER_BYTES..at + HEADER_BYTES + len];
        if crc32fast::hash(p) ^ mask(seq) != u32_at(bytes, at + 8) || p.len() < 2 {
            break;
        }
        let rel_len = u16::from_le_bytes([p[0], p[1]]) as usize;
        if p.len() < 2 + rel_len + 32 {
            break;
        }
        let r = 2 + rel_len;
        out.push(Record {
            rel: &p[2..r],
            id: Identity {
                dev: u64_at(p, r),
                ino: u64_at(p, r + 8),
                born_ns: u64_at(p, r + 16),
            },
            offset: u64_at(p, r + 24),
            data: &p[r + 32..],
        });
        at += HEADER_BYTES + len;
    }
    (out, bytes.len() - at)
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}{SEGMENT_SUFFIX}"))
}

/// The segments in `dir`, oldest first.
fn segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut seqs = Vec::new();
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for e in entries {
                let name = e?.file_name();
                let name = name.to_string_lossy();
                if let Some(n) = name.strip_suffix(SEGMENT_SUFFIX)
                    && let Ok(seq) = n.parse::<u64>()
                {
                    seqs.push(seq);
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    seqs.sort_unstable();
    Ok(seqs)
}

/// Puts every record of the data directory `root`'s log back into its
/// database's write-ahead log, makes that durable, and deletes the
/// segments. Run before any actor's database opens (a node's start); a
/// directory without a log returns at once.
pub fn recover(root: &Path) -> io::Result<Recovered> {
    let dir = root.join(DIR);
    let all = segments(&dir)?;
    // Open before the records are written back: a write-back of them that
    // fails is reported to the `syncfs` below (`sync::sync_filesystem_of`).
    let root_fd = File::open(root);
    let mut found = Recovered {
        next_seq: all.last().map_or(1, |s| s + 1),
        ..Recovered::default()
    };
    if all.is_empty() {
        return Ok(found);
    }
    // The newest run of consecutive numbers: an older segment left by a
    // deletion the disk lost is older than everything its successor's
    // cut made durable.
    let mut first = all.len() - 1;
    while first > 0 && all[first - 1] + 1 == all[first] {
        first -= 1;
    }
    #[cfg(test)]
    if rules().replay_every_segment {
        first = 0;
    }
    for seq in &all[first..] {
        let bytes = std::fs::read(segment_path(&dir, *seq))?;
        // A segment's records end at the first bytes that are not one:
        // before a segment follows it, each was synced whole.
        let (records, _) = decode(&bytes, *seq);
        found.segments += 1;
        // Only the order of one file's writes matters: each file is opened
        // once a segment and closed after its records (thousands of
        // actors would exceed the open-files limit).
        let mut by_file: HashMap<(&[u8], Identity), Vec<&Record<'_>>> = HashMap::new();
        for r in &records {
            by_file.entry((r.rel, r.id)).or_default().push(r);
        }
        for ((rel, id), writes) in by_file {
            match open_log_of(root, rel, id)? {
                Some(f) => {
                    for r in &writes {
                        f.write_all_at(r.data, r.offset)?;
                    }
                    found.replayed += writes.len() as u64;
                }
                None => found.skipped += writes.len() as u64,
            }
        }
    }
    // The logs written back (and any created) reach the disk before the
    // segments that held them go.
    sync::sync_filesystem_of(&root_fd?)?;
    // The older segments first, their deletions synced, then the newest:
    // a power cut in between must not leave older segments without the
    // newest, whose writes this replay made durable (the next start would
    // take the older ones for the newest run and put older writes back
    // over them). A gap before the newest is harmless (rule 4).
    #[cfg(test)]
    let newest_apart = !rules().forget_newest_with_the_rest;
    #[cfg(not(test))]
    let newest_apart = true;
    let (older, newest) = all.split_at(if newest_apart { all.len() - 1 } else { 0 });
    if !older.is_empty() {
        forget(&dir, older, u64::MAX, segment_max(), &Mutex::new(()))?;
    }
    forget(&dir, newest, 0, segment_max(), &Mutex::new(()))?;
    if found.replayed + found.skipped > 0 {
        tracing::info!(
            segments = found.segments,
            replayed = found.replayed,
            skipped = found.skipped,
            "replayed the commit log"
        );
    }
    Ok(found)
}

/// Whether the filesystem of the data directory `root` can hold a commit
/// log: it must give files birth times, without which a database deleted
/// and created again could take the old one's inode and its records.
pub fn supported(root: &Path) -> bool {
    std::fs::metadata(root).is_ok_and(|m| m.created().is_ok())
}

/// Moves a folder of actors' databases from `from` to `to` (a class
/// migration's step on a node without a bucket). A record names its
/// database by path and identity, and a rename keeps the identity: after
/// a move away and back, records from before the first move would name
/// the database again, and a replay would put that older generation of
/// its log back over the commits made since (those made at the other
/// path are skipped). So what the log holds is made durable in the files
/// before the move (as before any file moves under the log) and the log
/// is cut after it: no record from before the move is left to replay.
pub fn move_folder(log: Option<&CommitLog>, data: &Path, from: &Path, to: &Path) -> io::Result<()> {
    match log {
        Some(log) => {
            log.write_pending()?;
            log.sync_filesystem()?;
        }
        None => sync::sync_filesystem(data)?,
    }
    std::fs::rename(from, to)?;
    #[cfg(test)]
    let cut = !rules().move_without_cut;
    #[cfg(not(test))]
    let cut = true;
    if cut && let Some(log) = log {
        log.cut_now()?;
    }
    Ok(())
}

/// Checks that the actors' folder `data/actors` is on the data
/// directory's filesystem: every `syncfs` the node relies on (a cut's
/// before it forgets segments, a new actor's, a group's without the log)
/// syncs the data directory's filesystem, and would leave the actors'
/// files on another one unsynced. The same device number or the same
/// mount (`statx`'s mount id, where the kernel gives it) passes: a bind
/// mount of the same filesystem has its device, a btrfs subvolume its
/// mount. `Err` says why, for the start to refuse.
pub fn actors_on_the_data_filesystem(data: &Path) -> Result<(), String> {
    let actors = data.join("actors");
    let (a, d) = (mount_of(&actors)?, mount_of(data)?);
    if a.1 == d.1 || a.0.is_some_and(|m| Some(m) == d.0) {
        Ok(())
    } else {
        Err(format!(
            "the actors' folder {} is mounted apart from the data directory {} \
             (another filesystem, or another mount): the node makes commits durable \
             by syncing the data directory's filesystem (ADR 0074); put the whole \
             data directory on the volume instead",
            actors.display(),
            data.display()
        ))
    }
}

/// The mount `p` is on (following links), where the kernel says (Linux
/// 5.8 and later, and no filter refusing `statx`), and its device number.
fn mount_of(p: &Path) -> Result<(Option<u64>, u64), String> {
    use std::os::unix::ffi::OsStrExt;
    let why = |e: io::Error| format!("could not read {}: {e}", p.display());
    let dev = std::fs::metadata(p).map_err(why)?.dev();
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|e| why(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
    // SAFETY: a zeroed `statx` is a valid buffer for the call to fill.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `sx` a writable `statx`,
    // both alive for the call.
    let rc = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_MNT_ID, &mut sx) };
    let mount = (rc == 0 && sx.stx_mask & libc::STATX_MNT_ID != 0).then_some(sx.stx_mnt_id);
    Ok((mount, dev))
}

/// The write-ahead log of the database at `db` (SQLite's name for it).
fn wal_of(db: &Path) -> PathBuf {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// The write-ahead log of the database `rel` (under `root`), opened for
/// writing (created if missing), if that database is still the file the
/// record was written for.
fn open_log_of(root: &Path, rel: &[u8], id: Identity) -> io::Result<Option<File>> {
    // SAFETY: `rel` came from `as_encoded_bytes` of a path on this platform
    // (the log is never read on another one), or is rejected below.
    let rel = unsafe { std::ffi::OsStr::from_encoded_bytes_unchecked(rel) };
    let rel = Path::new(rel);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Ok(None);
    }
    let db = root.join(rel);
    // A database gone (its actor deleted) takes its records with it; any
    // other failure to look is an error: skipping would lose them.
    let now = match Identity::of(&db) {
        Ok(now) => now,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    #[cfg(test)]
    let now = if rules().replay_into_any_file {
        id
    } else {
        now
    };
    if !now.same_file(&id) {
        return Ok(None);
    }
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(wal_of(&db))
        .map(Some)
}

impl CommitLog {
    /// Replays what a previous run left ([`recover`]), then starts a new
    /// segment and makes the log available to the databases under `root`.
    pub fn start(root: &Path) -> io::Result<(Arc<CommitLog>, Recovered)> {
        let recovered = recover(root)?;
        let fs = Arc::new(FsSync {
            fd: File::open(root)?,
            turn: Mutex::new(()),
        });
        if !supported(root) {
            // Without birth times a database deleted and created again
            // could take the old one's inode and its records (rule 2).
            return Err(io::Error::other(
                "the data directory's filesystem gives no file birth times, which the commit log needs",
            ));
        }
        let dir = root.join(DIR);
        std::fs::create_dir_all(&dir)?;
        // The folder's own entry is durable before a record in it counts.
        sync::sync_dir(root)?;
        let segment_max = segment_max();
        // A spare an earlier run left (of another size, or grown) serves
        // at this run's size. No other thread touches the folder yet (the
        // `spare` lock is made below).
        let ready = dir.join(SPARE);
        if ready.exists() {
            at_most(&ready, segment_max)?;
        }
        let spare = Arc::new(Mutex::new(()));
        let first = FIRST_SEGMENT_BYTES.min(segment_max);
        let (file, capacity) = new_segment(&dir, recovered.next_seq, first, &spare)?;
        let next_bytes = (capacity * 2).min(segment_max);
        let log = Arc::new(CommitLog {
            root: root.to_owned(),
            fs,
            dir,
            segment_max,
            spare,
            pending: Mutex::new(Pending::default()),
            segment: Mutex::new(Segment {
                file,
                seq: recovered.next_seq,
                len: 0,
                capacity,
                written_through: 0,
                synced_through: 0,
                gather: Vec::new(),
            }),
            cutting: Arc::new(AtomicBool::new(false)),
            failed: Arc::new(Mutex::new(None)),
            bytes_total: AtomicU64::new(0),
            cuts_total: Arc::new(AtomicU64::new(0)),
            epoch: AtomicU64::new(0),
            touched: Mutex::new(Touched::default()),
        });
        logs().push((root.to_owned(), Arc::downgrade(&log)));
        // The next segment is ready before this one is full.
        let (dir, spare) = (log.dir.clone(), Arc::clone(&log.spare));
        let ready = move || {
            if let Err(e) = make_spare(&dir, next_bytes, &spare) {
                tracing::warn!(error = %e, "could not prepare the next commit log segment");
            }
        };
        #[cfg(test)]
        if tests::CUT_INLINE.get() {
            ready();
            return Ok((log, recovered));
        }
        std::thread::Builder::new()
            .name("wasmkeep-cut".into())
            .spawn(ready)?;
        Ok((log, recovered))
    }

    fn lock_pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Names `wal` for the next cut's write-back, unless it was named
    /// since the last cut began (`named_in`). A log first written just as
    /// a cut takes the list (its tap read the epoch before) may be named
    /// only at its next write: its pages are then the `syncfs`'s to write.
    fn name(&self, wal: &Arc<Path>, named_in: &AtomicU64) {
        let mut touched = self.lock_touched();
        let epoch = touched.epoch;
        if named_in.swap(epoch, Ordering::Relaxed) != epoch
            && touched.logs.len() < WRITE_BACK_FILES_MAX
        {
            touched.logs.push(Arc::clone(wal));
        }
    }

    /// The logs written since the last cut began, each once; the next
    /// epoch begins (each tap names its log again at its next write).
    fn take_touched(&self) -> Vec<Arc<Path>> {
        let mut logs = {
            let mut touched = self.lock_touched();
            touched.epoch += 1;
            self.epoch.store(touched.epoch, Ordering::Relaxed);
            std::mem::take(&mut touched.logs)
        };
        // A database closed and opened again names its log again.
        logs.sort_unstable();
        logs.dedup();
        logs
    }

    fn lock_touched(&self) -> MutexGuard<'_, Touched> {
        self.touched.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_segment(&self) -> MutexGuard<'_, Segment> {
        self.segment.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The error a failed segment write or sync left, if any.
    fn check(&self) -> io::Result<()> {
        check_failed(&self.failed)
    }

    /// Remembers that records may be lost, and returns the error.
    fn fail(&self, e: io::Error) -> io::Error {
        fail_in(&self.failed, e)
    }

    /// One `syncfs` of the data directory's filesystem ([`FsSync::sync`]).
    fn sync_filesystem(&self) -> io::Result<()> {
        self.fs.sync(&self.failed)
    }

    /// Writes every record taken so far to the segment (not synced). Under
    /// the segment's lock, so records reach the file in the order taken.
    fn write_out(&self, seg: &mut Segment) -> io::Result<()> {
        self.check()?;
        let (records, through) = {
            let mut p = self.lock_pending();
            p.bytes = 0;
            (std::mem::take(&mut p.records), p.taken_total)
        };
        // Gathered into the segment's own buffer, whose pages stay in
        // memory from one write-out to the next: a write per megabyte.
        let mut gather = std::mem::take(&mut seg.gather);
        gather.clear();
        for mut record in records {
            seal(&mut record, seg.seq);
            if !gather.is_empty() && gather.len() + record.len() > WRITE_BYTES_MAX {
                self.append(seg, &gather)?;
                gather.clear();
            }
            gather.extend_from_slice(&record);
        }
        if !gather.is_empty() {
            self.append(seg, &gather)?;
        }
        seg.gather = gather;
        seg.written_through = through;
        Ok(())
    }

    /// Writes `bytes` (whole records) at the segment's end.
    fn append(&self, seg: &mut Segment, bytes: &[u8]) -> io::Result<()> {
        seg.file
            .write_all_at(bytes, seg.len)
            .map_err(|e| self.fail(e))?;
        #[cfg(test)]
        tests::note(tests::Op::Write {
            path: segment_path(&self.dir, seg.seq),
            offset: seg.len,
            data: bytes.to_vec(),
        });
        seg.len += bytes.len() as u64;
        self.bytes_total
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Writes every record taken so far to the segment, not synced.
    pub(crate) fn write_pending(&self) -> io::Result<()> {
        let mut seg = self.lock_segment();
        self.write_out(&mut seg)?;
        #[cfg(test)]
        if tests::FAIL_AFTER_WRITE_OUT.replace(false) {
            // As another thread's `fdatasync` failing right after.
            return Err(self.fail(io::Error::other("injected failure after a write-out")));
        }
        self.roll_if_full(&mut seg, false);
        Ok(())
    }

    /// Makes every record taken so far durable: one write and one
    /// `fdatasync` of the segment. Every commit that returned before this
    /// call is durable when it returns `Ok`. Barriers that wait for one
    /// another share a sync: one that finds its records synced by the
    /// barrier it waited for returns (closes checkpointing at once, with
    /// the durability stage beside them).
    pub(crate) fn barrier(&self) -> io::Result<()> {
        let wanted = self.lock_pending().taken_total;
        let mut seg = self.lock_segment();
        if seg.synced_through >= wanted {
            return self.check();
        }
        self.write_out(&mut seg)?;
        self.sync_segment(&mut seg)?;
        self.roll_if_full(&mut seg, true);
        Ok(())
    }

    /// Past its capacity, the segment is followed by the next and cut (one
    /// cut at a time: while one runs, the segment grows). A segment is
    /// followed only once it is synced whole (`synced`, or synced here),
    /// so that replay may take each segment's records up to its first bad
    /// bytes and go on to the next.
    fn roll_if_full(&self, seg: &mut Segment, synced: bool) {
        if seg.len < seg.capacity || self.cutting.swap(true, Ordering::AcqRel) {
            return;
        }
        let rolled = if synced {
            Ok(())
        } else {
            self.sync_segment(seg)
        }
        .and_then(|()| self.roll(seg));
        if let Err(e) = rolled {
            self.cutting.store(false, Ordering::Release);
            tracing::warn!(error = %e, "could not start a new commit log segment; \
                the current one grows");
        }
    }

    fn sync_segment(&self, seg: &mut Segment) -> io::Result<()> {
        // A failed fdatasync may have dropped the pages it could not write:
        // a later one succeeding says nothing of them.
        seg.file.sync_data().map_err(|e| self.fail(e))?;
        seg.synced_through = seg.written_through;
        #[cfg(test)]
        tests::note(tests::Op::Sync(segment_path(&self.dir, seg.seq)));
        Ok(())
    }

    /// Makes `seg` the next segment; returns its number.
    fn next_segment(&self, seg: &mut Segment) -> io::Result<u64> {
        let next = seg.seq + 1;
        let bytes = self.grown(seg.capacity);
        (seg.file, seg.capacity) = new_segment(&self.dir, next, bytes, &self.spare)?;
        seg.seq = next;
        seg.len = 0;
        Ok(next)
    }

    /// The size of the segment after one of `capacity` bytes.
    fn grown(&self, capacity: u64) -> u64 {
        capacity
            .saturating_mul(2)
            .clamp(FIRST_SEGMENT_BYTES.min(self.segment_max), self.segment_max)
    }

    /// Tests only: a segment ends while a cut still runs (no cut of its own).
    #[cfg(test)]
    pub(crate) fn roll_for_tests(&self) {
        let mut seg = self.lock_segment();
        self.write_out(&mut seg).unwrap();
        self.sync_segment(&mut seg).unwrap();
        self.next_segment(&mut seg).unwrap();
    }

    /// Starts the next segment and cuts the ones before it.
    fn roll(&self, seg: &mut Segment) -> io::Result<()> {
        let next = self.next_segment(seg)?;
        let (fs, dir) = (Arc::clone(&self.fs), self.dir.clone());
        let (cutting, cuts) = (Arc::clone(&self.cutting), Arc::clone(&self.cuts_total));
        let (bytes, spare) = (self.grown(seg.capacity), Arc::clone(&self.spare));
        let max = self.segment_max;
        let failed = Arc::clone(&self.failed);
        let touched = self.take_touched();
        let cut = move || {
            match cut(&fs, &failed, &dir, &touched, next, bytes, max, &spare)
                .and_then(|()| make_spare(&dir, bytes, &spare))
            {
                Ok(()) => {
                    cuts.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => tracing::warn!(error = %e, "a commit log cut failed; \
                    its segments stay until the next"),
            }
            cutting.store(false, Ordering::Release);
        };
        #[cfg(test)]
        if tests::CUT_INLINE.get() {
            cut();
            return Ok(());
        }
        std::thread::Builder::new()
            .name("wasmkeep-cut".into())
            .spawn(cut)?;
        Ok(())
    }

    /// Makes the log's records older than the current segment durable where
    /// they belong and forgets them (the cut a full segment starts), now:
    /// at a stop, where no barrier waits behind the `syncfs`, so nothing is
    /// written back ahead of it.
    pub fn cut_now(&self) -> io::Result<()> {
        self.cut_here(false)
    }

    /// Tests only: [`CommitLog::cut_now`] with the write-back a full
    /// segment's cut makes.
    #[cfg(test)]
    pub(crate) fn cut_now_writing_back(&self) -> io::Result<()> {
        self.cut_here(true)
    }

    fn cut_here(&self, writing_back: bool) -> io::Result<()> {
        let (next, bytes) = {
            let mut seg = self.lock_segment();
            self.write_out(&mut seg)?;
            self.sync_segment(&mut seg)?;
            (self.next_segment(&mut seg)?, self.grown(seg.capacity))
        };
        let touched = self.take_touched();
        cut(
            &self.fs,
            &self.failed,
            &self.dir,
            if writing_back { &touched } else { &[] },
            next,
            bytes,
            self.segment_max,
            &self.spare,
        )?;
        self.cuts_total.fetch_add(1, Ordering::Relaxed);
        // The cut is done; without a spare the next segment is made when
        // needed (a class migration's move must not fail for it).
        if let Err(e) = make_spare(&self.dir, bytes, &self.spare) {
            tracing::warn!(error = %e, "could not prepare the next commit log segment");
        }
        Ok(())
    }
}

impl Drop for CommitLog {
    fn drop(&mut self) {
        let me: *const CommitLog = self;
        logs().retain(|(_, w)| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), me));
    }
}

/// Segment `seq`: the spare if one is ready, else a new file written full
/// of zeros (`bytes` of them); and the bytes it holds.
fn new_segment(dir: &Path, seq: u64, bytes: u64, spare: &Mutex<()>) -> io::Result<(File, u64)> {
    let path = segment_path(dir, seq);
    {
        let _held = spare.lock().unwrap_or_else(|p| p.into_inner());
        let ready = dir.join(SPARE);
        if ready.exists() {
            std::fs::rename(&ready, &path)?;
            #[cfg(test)]
            tests::note(tests::Op::Rename {
                from: ready,
                to: path.clone(),
            });
        } else {
            zero_filled(&path, bytes)?;
        }
    }
    // The segment's entry must be on disk before a record in it counts.
    sync::sync_dir(dir)?;
    #[cfg(test)]
    tests::note(tests::Op::DirSync(dir.to_owned()));
    let file = OpenOptions::new().write(true).open(&path)?;
    let capacity = file.metadata()?.len();
    Ok((file, capacity))
}

/// The largest a segment is made: [`SEGMENT_BYTES`], smaller in tests.
fn segment_max() -> u64 {
    #[cfg(not(test))]
    return SEGMENT_BYTES;
    #[cfg(test)]
    return tests::SEGMENT_BYTES_FOR_TESTS.get();
}

/// Creates `path` (replacing a file there) holding `bytes` zeros, synced.
fn zero_filled(path: &Path, bytes: u64) -> io::Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    #[cfg(test)]
    tests::note(tests::Op::Create(path.to_owned()));
    let chunk = vec![0u8; 1024 * 1024];
    let mut at = 0;
    while at < bytes {
        let n = (bytes - at).min(chunk.len() as u64) as usize;
        file.write_all_at(&chunk[..n], at)?;
        #[cfg(test)]
        tests::note(tests::Op::Write {
            path: path.to_owned(),
            offset: at,
            data: chunk[..n].to_vec(),
        });
        at += n as u64;
    }
    file.sync_data()?;
    #[cfg(test)]
    tests::note(tests::Op::Sync(path.to_owned()));
    Ok(())
}

/// Makes a spare segment of at least `bytes` ready if there is none (a
/// full file of zeros, renamed into place once whole).
fn make_spare(dir: &Path, bytes: u64, spare: &Mutex<()>) -> io::Result<()> {
    let _held = spare.lock().unwrap_or_else(|p| p.into_inner());
    let ready = dir.join(SPARE);
    if std::fs::metadata(&ready).is_ok_and(|m| m.len() >= bytes) {
        // The start and `forget` cut a spare back to the size when they
        // make one (one whose cut-back failed serves once at its length
        // and is cut back when forgotten).
        return Ok(());
    }
    let tmp = dir.join(SPARE_TMP);
    zero_filled(&tmp, bytes)?;
    std::fs::rename(&tmp, &ready)?;
    #[cfg(test)]
    tests::note(tests::Op::Rename {
        from: tmp,
        to: ready,
    });
    Ok(())
}

/// Cuts the segment file at `path` to `max` bytes if it is longer: a
/// segment that grew past its size (records written while a cut ran, a
/// write-out larger than the room left) or one of an older, larger size must not
/// serve again at that size, or every other cut would cover that much.
/// Whatever the cut leaves are records a used segment's number masks.
fn at_most(path: &Path, max: u64) -> io::Result<()> {
    let file = OpenOptions::new().write(true).open(path)?;
    if file.metadata()?.len() <= max {
        return Ok(());
    }
    file.set_len(max)?;
    #[cfg(test)]
    tests::note(tests::Op::Truncate {
        path: path.to_owned(),
        len: max,
    });
    // Its next use's first `fdatasync` then writes no size.
    file.sync_all()?;
    #[cfg(test)]
    tests::note(tests::Op::Sync(path.to_owned()));
    Ok(())
}

/// Removes segments `seqs` (oldest first) whose records are durable where
/// they belong; the newest becomes the spare (cut to `max` bytes) if none
/// is ready and it holds at least `bytes`.
fn forget(dir: &Path, seqs: &[u64], bytes: u64, max: u64, spare: &Mutex<()>) -> io::Result<()> {
    let _held = spare.lock().unwrap_or_else(|p| p.into_inner());
    let ready = dir.join(SPARE);
    for (i, seq) in seqs.iter().enumerate() {
        let path = segment_path(dir, *seq);
        if i + 1 == seqs.len()
            && !ready.exists()
            && std::fs::metadata(&path).is_ok_and(|m| m.len() >= bytes)
        {
            std::fs::rename(&path, &ready)?;
            #[cfg(test)]
            tests::note(tests::Op::Rename {
                from: path,
                to: ready.clone(),
            });
            at_most(&ready, max)?;
        } else {
            // Another cut (the stop's, beside one a full segment started)
            // may have forgotten it already.
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != io::ErrorKind::NotFound
            {
                return Err(e);
            }
            #[cfg(test)]
            tests::note(tests::Op::Delete(path));
        }
    }
    sync::sync_dir(dir)?;
    #[cfg(test)]
    tests::note(tests::Op::DirSync(dir.to_owned()));
    Ok(())
}

/// Remembers in `failed` that records may be lost, and returns the error.
fn fail_in(failed: &Mutex<Option<String>>, e: io::Error) -> io::Error {
    let mut f = failed.lock().unwrap_or_else(|p| p.into_inner());
    f.get_or_insert_with(|| e.to_string());
    e
}

/// The error `failed` holds, if any.
fn check_failed(failed: &Mutex<Option<String>>) -> io::Result<()> {
    match &*failed.lock().unwrap_or_else(|p| p.into_inner()) {
        Some(why) => Err(io::Error::other(format!(
            "the commit log failed earlier ({why}); restart the node"
        ))),
        None => Ok(()),
    }
}

/// The data directory, open since the log started, through which every
/// `syncfs` the log relies on goes (a cut's, a new actor's group). Linux
/// reports a failed write-back to `syncfs` once per open file description:
/// to the first call through it after the failure (one opened before the
/// failure sees it even if another description saw it first). Other
/// callers on the node (a restore, a migration) or other processes may
/// see a failure first; this description, opened before any record, still
/// does. Two calls through it at once could split one failure into an
/// error and a success, so calls take turns (`turn`), and one that
/// succeeds after another failed fails too.
struct FsSync {
    fd: File,
    turn: Mutex<()>,
}

impl FsSync {
    /// One `syncfs`; a failure is final (`failed`): the next call may
    /// succeed with the pages that failed lost, and their records must not
    /// be let go.
    fn sync(&self, failed: &Mutex<Option<String>>) -> io::Result<()> {
        let _turn = self.turn.lock().unwrap_or_else(|p| p.into_inner());
        #[cfg(test)]
        let synced = if tests::FAIL_SYNCFS.get() {
            Err(io::Error::other("a write-back failed (injected)"))
        } else {
            sync::sync_filesystem_of(&self.fd)
        };
        #[cfg(not(test))]
        let synced = sync::sync_filesystem_of(&self.fd);
        if let Err(e) = synced {
            #[cfg(test)]
            if rules().cut_failure_not_final {
                return Err(e);
            }
            return Err(fail_in(failed, e));
        }
        check_failed(failed)
    }
}

/// Makes every write recorded in segments before `keep` durable in its own
/// file (the logs `wals` written back first, [`write_back`], then one
/// `syncfs`, [`FsSync::sync`]), then forgets those segments.
#[allow(clippy::too_many_arguments)]
fn cut(
    fs: &FsSync,
    failed: &Mutex<Option<String>>,
    dir: &Path,
    wals: &[Arc<Path>],
    keep: u64,
    bytes: u64,
    max: u64,
    spare: &Mutex<()>,
) -> io::Result<()> {
    #[cfg(test)]
    let skip = rules().cut_without_syncfs;
    #[cfg(not(test))]
    let skip = false;
    // A failed log keeps its segments for the next start.
    check_failed(failed)?;
    if !skip {
        write_back(wals, failed)?;
        fs.sync(failed)?;
        #[cfg(test)]
        tests::note(tests::Op::SyncAll);
    }
    let dead: Vec<u64> = segments(dir)?.into_iter().filter(|s| *s < keep).collect();
    forget(dir, &dead, bytes, max, spare)
}

/// Writes back the actors' logs `wals`, one at a time, ahead of a cut's
/// `syncfs`, which then finds little left to write (ADR 0080). One
/// `syncfs` writing back everything since the last cut (120–142 ms under
/// W1) filled the device's queue, and every barrier's cache flush behind
/// it waited for all of it; one log's write-back at a time keeps a
/// barrier's wait to about one log's. Only logs: an actor's database file
/// is written by checkpoints, which SQLite syncs, and closing a
/// descriptor of it would drop the POSIX locks a reader in this process
/// holds on it (ADR 0077). At most [`WRITE_BACK_TIME_MAX`]; a log gone or
/// not opened is left to the `syncfs`, and so is the rest when the call
/// is not taken ([`write_back_not_taken`]: nothing was written back, no
/// page lost). Any other error is what the filesystem recorded for a
/// failed write-back (`EIO`, `ENOSPC`, `EROFS`, ...): final, as a failed
/// `syncfs` is, for no record of those pages may be forgotten.
fn write_back(wals: &[Arc<Path>], failed: &Mutex<Option<String>>) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let started = crate::clock::now();
    for wal in wals {
        if crate::clock::now().duration_since(started) >= WRITE_BACK_TIME_MAX {
            break;
        }
        let opened = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(wal);
        let Ok(file) = opened else {
            continue;
        };
        #[cfg(test)]
        let done = if let Some(errno) = tests::FAIL_WRITE_BACK.get() {
            Err(io::Error::from_raw_os_error(errno))
        } else {
            sync::write_back(&file)
        };
        #[cfg(not(test))]
        let done = sync::write_back(&file);
        match done {
            Ok(()) => {}
            Err(e) if write_back_not_taken(&e) => break,
            Err(e) => {
                let e = io::Error::new(e.kind(), format!("writing back {}: {e}", wal.display()));
                #[cfg(test)]
                if rules().cut_failure_not_final {
                    return Err(e);
                }
                return Err(fail_in(failed, e));
            }
        }
        #[cfg(test)]
        tests::note(tests::Op::WriteBack(wal.to_path_buf()));
        #[cfg(test)]
        if rules().write_back_database_files {
            let db = wal.to_str().and_then(|w| w.strip_suffix("-wal"));
            if let Some(Ok(file)) = db.map(File::open) {
                sync::write_back(&file)?;
            }
        }
    }
    Ok(())
}

/// Whether `sync_file_range` refused the call itself (a filesystem or a
/// file it does not apply to), so that no page was written back or lost.
fn write_back_not_taken(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::ESPIPE | libc::EOPNOTSUPP | libc::ENOSYS)
    )
}

/// How [`make_durable`] made a group durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durable {
    /// One barrier of the commit log.
    Log,
    /// One `syncfs` of the data directory's filesystem.
    Syncfs,
    /// One `fdatasync` (or a folder's `fsync`) per path: a lone path.
    EachFile,
}

/// Makes a group of commits durable: their write-ahead logs `files` and,
/// for a new actor's first batch, the folders `dirs` its creation wrote.
/// With a log and no new folder, one barrier of the log, whatever the
/// number of files: an actor's own file must never be durable ahead of
/// the log's records of it (replaying a shorter log over it would put an
/// older generation back). Otherwise one `fdatasync` for a lone path and
/// one `syncfs` for more (ADR 0004); with a log, its records are written
/// out first, so that the `syncfs` makes them durable with the files.
pub fn make_durable(
    log: Option<&CommitLog>,
    root: &Path,
    files: &[&PathBuf],
    dirs: &[&PathBuf],
) -> io::Result<Durable> {
    #[cfg(test)]
    let (new_through_log, lone_by_itself) = (
        rules().new_files_through_log,
        rules().lone_file_by_itself && files.len() + dirs.len() == 1,
    );
    #[cfg(not(test))]
    let (new_through_log, lone_by_itself) = (false, false);
    if let Some(log) = log
        && !lone_by_itself
    {
        if dirs.is_empty() || new_through_log {
            log.barrier()?;
            return Ok(Durable::Log);
        }
        log.write_pending()?;
        log.sync_filesystem()?;
        #[cfg(test)]
        tests::note(tests::Op::SyncAll);
        return Ok(Durable::Syncfs);
    }
    if let Some(log) = log {
        log.write_pending()?;
    }
    if files.len() + dirs.len() >= sync::SYNCFS_FILES_MIN {
        sync::sync_filesystem(root)?;
        #[cfg(test)]
        tests::note(tests::Op::SyncAll);
        return Ok(Durable::Syncfs);
    } else {
        for f in files {
            sync::sync_file(f)?;
            #[cfg(test)]
            tests::note(tests::Op::Sync(f.to_path_buf()));
        }
        for d in dirs {
            sync::sync_dir(d)?;
            #[cfg(test)]
            tests::note(tests::Op::DirSync(d.to_path_buf()));
        }
    }
    Ok(Durable::EachFile)
}

#[cfg(test)]
#[path = "commit_log_tests.rs"]
pub(crate) mod tests;
