//! The pages each commit wrote, captured where SQLite writes them, so that
//! an upload carries what changed without reading the whole database
//! (ADR 0036, issue 23).
//!
//! In WAL mode every change SQLite makes to a database goes to the
//! write-ahead log first, as frames: a 24-byte header (the page number,
//! and for the last frame of a commit the database's size in pages), then
//! the page. The `wasmkeep` VFS ([`crate::wal_index`]) shows every write to
//! an actor's log to its [`Capture`], which keeps a copy of each frame's
//! page:
//!
//! - **Only committed frames count.** Frames are held by their offset in
//!   the log until a commit frame is written; then the frames at or before
//!   it become the pages of that commit. A rolled-back transaction that
//!   spilled frames to the log never writes a commit frame: the next
//!   transaction writes from the same offset, replacing them, and whatever
//!   lies beyond the next commit frame is dropped with it. A new log header
//!   (the log starting over after a checkpoint) drops them too.
//! - **The newest committed copy of a page wins,** and pages beyond the
//!   size a commit leaves are dropped (the database shrank).
//! - **Anything the capture cannot follow makes it give up** until the next
//!   [`Capture::take`]: a write to the log that is not laid out as frames,
//!   a page size that changes, or more than [`CAPTURE_BYTES_MAX`] held.
//!   The runtime then reads the whole database for that upload, as before.
//!
//! Captures are kept per actor folder in a process-wide table
//! ([`track`]), so that every connection to the actor's file (the actor's
//! own, or one opened for a moment to upload it) adds to the same capture,
//! and a connection closing loses nothing. Only folders the runtime
//! tracks (a node with a bucket) are captured.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::wal_format::{FRAME_HEADER_BYTES, LOG_HEADER_BYTES, frame_header};

/// Most bytes of pages one actor's capture holds between two uploads
/// (pages of committed and of open transactions). Past it the capture
/// gives up and the next upload reads the whole database.
pub const CAPTURE_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Most bytes of pages all the captures of a process hold together: a
/// capture that would take the total past it gives up instead, so many
/// actors writing at once cannot make the node hold more than this.
pub const CAPTURE_NODE_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Bytes every capture may hold whatever the others hold: a tenant that
/// fills the node's pool with large transactions makes only captures past
/// this give up, never a neighbour's small commits (whose uploads would
/// otherwise fall back to reading their whole databases).
pub const CAPTURE_RESERVED_BYTES: usize = 64 * 1024;

/// Bytes all captures hold now.
static NODE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Bytes of pages every capture holds now (for `/metrics`).
pub fn node_bytes() -> usize {
    NODE_BYTES.load(Ordering::Relaxed)
}

/// One actor's captured pages.
#[derive(Default)]
pub struct Capture {
    /// Frames of transactions not committed yet, by offset in the log:
    /// page number and content.
    pending: BTreeMap<i64, (u32, Vec<u8>)>,
    /// The frame header written last, waiting for its page: offset, page
    /// number, and the database's size if the frame ends a commit.
    header: Option<(i64, u32, u32)>,
    /// Pages committed since the last take: number to newest content.
    committed: BTreeMap<u32, Vec<u8>>,
    /// Bytes of pages held (pending and committed).
    bytes: usize,
    page_size: Option<usize>,
    /// The database's size in pages after the newest commit captured.
    db_pages: Option<u32>,
    /// The smallest size any commit since the last take left.
    low_pages: Option<u32>,
    /// Why the capture gave up since the last take, if it did.
    lost: Option<&'static str>,
    /// The offset of the newest commit frame captured in this log (none
    /// after a new log header). A commit that SQLite abandoned after
    /// writing its frames (an allocation failing while it indexes them) is
    /// written over by the next transaction, which starts at or before
    /// it; and `ActorDb::commit` reports a failed commit ([`Capture::lose`]).
    last_commit_at: Option<i64>,
    /// Tests only: at a commit, keep every held frame, including those
    /// beyond the commit frame (a rolled-back transaction's).
    #[cfg(test)]
    pub(crate) unsafe_keep_rolled_back: bool,
}

/// What [`Capture::take`] hands the runtime: the pages committed since the
/// previous take.
#[derive(Debug, Default)]
pub struct Changes {
    /// Page number to its newest committed content, every page at most the
    /// database's size (`db_pages`).
    pub pages: BTreeMap<u32, Vec<u8>>,
    /// The database's size in pages after the newest commit, if any commit
    /// was captured.
    pub db_pages: Option<u32>,
    /// The smallest size a commit left the database at: pages above it
    /// that the database has now were all written since.
    pub low_pages: Option<u32>,
    /// Bytes of each page.
    pub page_size: Option<u32>,
    /// Why the capture cannot be trusted for this interval (the whole
    /// database must be read instead).
    pub lost: Option<&'static str>,
}

impl Capture {
    /// One write SQLite made to the log, after it succeeded.
    pub(crate) fn written(&mut self, data: &[u8], offset: i64) {
        if self.lost.is_some() {
            return;
        }
        if offset == 0 && data.len() == LOG_HEADER_BYTES {
            // The log starts over (after a checkpoint that copied every
            // frame into the database): no transaction is open.
            self.drop_pending();
            self.header = None;
            self.last_commit_at = None;
            return;
        }
        if offset >= LOG_HEADER_BYTES as i64
            && let Some((pgno, size)) = frame_header(data)
        {
            // A new frame's header, or SQLite rewriting an earlier header
            // of this transaction (its checksums): the page follows only
            // in the first case.
            if self.last_commit_at.is_some_and(|c| offset <= c) {
                return self.give_up("a commit that the log did not keep");
            }
            self.header = Some((offset, pgno, size));
            return;
        }
        match self.header.take() {
            Some((at, pgno, size)) if offset == at + FRAME_HEADER_BYTES as i64 && pgno > 0 => {
                if self.page_size.is_some_and(|ps| ps != data.len()) {
                    return self.give_up("the page size changed");
                }
                self.page_size = Some(data.len());
                if let Err(why) = room(self.bytes, node_bytes(), data.len()) {
                    return self.give_up(why);
                }
                self.grow(data.len());
                if let Some((_, old)) = self.pending.insert(at, (pgno, data.to_vec())) {
                    self.shrink(old.len());
                }
                if size != 0 {
                    self.commit(at, size);
                }
            }
            _ => {
                // SQLite writing a page of this transaction again, in the
                // frame it already has (the page alone).
                let at = offset - FRAME_HEADER_BYTES as i64;
                match self.pending.get_mut(&at) {
                    Some((_, page)) if page.len() == data.len() => page.copy_from_slice(data),
                    _ => self.give_up("a write to the log not laid out as frames"),
                }
            }
        }
    }

    /// The commit whose last frame is at `at` leaves the database at
    /// `size` pages.
    fn commit(&mut self, at: i64, size: u32) {
        #[cfg(test)]
        let keep_all = self.unsafe_keep_rolled_back;
        #[cfg(not(test))]
        let keep_all = false;
        if !keep_all {
            // Beyond the commit frame: a rolled-back transaction's frames
            // that this one did not write over.
            let beyond = self.pending.split_off(&(at + 1));
            self.shrink(beyond.values().map(|(_, p)| p.len()).sum());
        }
        for (_, (pgno, page)) in std::mem::take(&mut self.pending) {
            if let Some(old) = self.committed.insert(pgno, page) {
                self.shrink(old.len());
            }
        }
        let gone = self.committed.split_off(&(size + 1));
        self.shrink(gone.values().map(Vec::len).sum());
        self.db_pages = Some(size);
        self.low_pages = Some(self.low_pages.map_or(size, |low| low.min(size)));
        self.last_commit_at = Some(at);
    }

    fn grow(&mut self, n: usize) {
        self.bytes += n;
        NODE_BYTES.fetch_add(n, Ordering::Relaxed);
    }

    fn shrink(&mut self, n: usize) {
        self.bytes -= n;
        NODE_BYTES.fetch_sub(n, Ordering::Relaxed);
    }

    fn drop_pending(&mut self) {
        self.shrink(self.pending.values().map(|(_, p)| p.len()).sum());
        self.pending.clear();
    }

    /// Gives up until the next take: something wrote the database where
    /// the capture cannot see it.
    pub(crate) fn lose(&mut self, why: &'static str) {
        self.give_up(why);
    }

    fn give_up(&mut self, why: &'static str) {
        self.lost = Some(why);
        self.pending.clear();
        self.committed.clear();
        self.header = None;
        self.shrink(self.bytes);
    }

    /// The pages committed since the last take; the capture starts over
    /// (frames of a transaction still open stay). Call between
    /// transactions.
    /// Whether the capture still follows every change (it did not give
    /// up since the last take).
    pub fn follows(&self) -> bool {
        self.lost.is_none()
    }

    pub fn take(&mut self) -> Changes {
        self.shrink(self.committed.values().map(Vec::len).sum());
        Changes {
            pages: std::mem::take(&mut self.committed),
            db_pages: self.db_pages.take(),
            low_pages: self.low_pages.take(),
            page_size: self.page_size.map(|ps| ps as u32),
            lost: self.lost.take(),
        }
    }

    /// Forgets everything captured (the file was replaced: a restore, or a
    /// fresh start of the actor's replica).
    pub fn clear(&mut self) {
        self.shrink(self.bytes);
        self.pending.clear();
        self.committed.clear();
        self.header = None;
        self.page_size = None;
        self.db_pages = None;
        self.low_pages = None;
        self.lost = None;
        self.last_commit_at = None;
    }
}

/// Whether a capture holding `mine` bytes, on a node whose captures hold
/// `node`, may keep `n` more.
fn room(mine: usize, node: usize, n: usize) -> Result<(), &'static str> {
    if mine + n > CAPTURE_BYTES_MAX {
        return Err("more changed pages than CAPTURE_BYTES_MAX");
    }
    if mine + n > CAPTURE_RESERVED_BYTES && node + n > CAPTURE_NODE_BYTES_MAX {
        return Err("the node's captures hold CAPTURE_NODE_BYTES_MAX");
    }
    Ok(())
}

impl Drop for Capture {
    fn drop(&mut self) {
        NODE_BYTES.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// A capture shared by the connections to one actor's file.
pub type Shared = Arc<Mutex<Capture>>;

fn table() -> MutexGuard<'static, HashMap<PathBuf, Shared>> {
    static TABLE: OnceLock<Mutex<HashMap<PathBuf, Shared>>> = OnceLock::new();
    TABLE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Starts (or starts over) capturing the pages written to the database in
/// actor folder `dir`: from now on, connections opened there add to it.
/// Call when the file is what the bucket's head holds (or will be read
/// whole), with no connection open on it.
pub fn track(dir: &Path) -> Shared {
    let shared = Arc::clone(table().entry(dir.to_owned()).or_default());
    lock(&shared).clear();
    shared
}

/// Stops capturing for `dir` (the actor is gone from this node).
pub fn untrack(dir: &Path) {
    table().remove(dir);
}

/// The capture of `dir`, if the runtime tracks it.
pub fn of(dir: &Path) -> Option<Shared> {
    table().get(dir).cloned()
}

/// [`lock`] on the capture behind a shared one (what the VFS holds).
pub(crate) fn lock_raw(capture: &Mutex<Capture>) -> MutexGuard<'_, Capture> {
    capture.lock().unwrap_or_else(|p| {
        let mut c = p.into_inner();
        c.give_up("a panic while capturing");
        capture.clear_poison();
        c
    })
}

/// Locks a capture (a panic while holding it loses only the capture, and
/// the next take reports it lost).
pub fn lock(shared: &Shared) -> MutexGuard<'_, Capture> {
    lock_raw(shared)
}

#[cfg(test)]
mod tests {
    use rusqlite::params;

    use super::*;
    use crate::db::{ActorDb, OpenMode};
    use crate::limits::StoreLimits;

    /// The bucket's view of the database, rebuilt from the changes alone.
    struct Replayed {
        bytes: Vec<u8>,
        page_size: usize,
    }

    impl Replayed {
        /// Applies one take, checking what an entry must carry: every page
        /// the database gained since the smallest size a commit left.
        fn apply(&mut self, ch: Changes) -> Result<(), String> {
            if let Some(why) = ch.lost {
                return Err(format!("capture lost: {why}"));
            }
            let Some(n) = ch.db_pages else {
                return if ch.pages.is_empty() {
                    Ok(())
                } else {
                    Err("pages without a commit".into())
                };
            };
            let ps = self.page_size;
            let had = (self.bytes.len() / ps) as u32;
            let low = ch.low_pages.unwrap_or(n).min(had);
            for p in low + 1..=n {
                if !ch.pages.contains_key(&p) {
                    return Err(format!("page {p} of the grown database was not captured"));
                }
            }
            self.bytes.resize(n as usize * ps, 0);
            for (p, page) in ch.pages {
                if p == 0 || p > n || page.len() != ps {
                    return Err(format!("page {p} out of place"));
                }
                let at = (p as usize - 1) * ps;
                self.bytes[at..at + ps].copy_from_slice(&page);
            }
            Ok(())
        }
    }

    /// Random commits, rollbacks of transactions that spilled to the log,
    /// checkpoints that start the log over and a VACUUM that shrinks the
    /// file, with takes in between: what the takes rebuild must be the
    /// committed database, byte for byte, every time.
    fn replay_matches(keep_rolled_back: bool) -> Result<(), String> {
        let dir = tempfile::tempdir().unwrap();
        let shared = track(dir.path());
        lock(&shared).unsafe_keep_rolled_back = keep_rolled_back;
        let mut db = ActorDb::open(dir.path(), &StoreLimits::default(), OpenMode::Create)
            .unwrap()
            .unwrap();
        let c = db.conn_for_tests();
        c.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
            .unwrap();
        // What was there before the capture is the base (the first upload
        // reads it whole).
        db.take_changes().unwrap();
        let image = db.committed_image().unwrap();
        let mut replayed = Replayed {
            page_size: db.page_size() as usize,
            bytes: image,
        };
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..120u32 {
            let c = db.conn_for_tests();
            match next(10) {
                0 | 1 => {
                    // A transaction larger than the cache, rolled back: its
                    // frames spill to the log and are never committed.
                    c.pragma_update(None, "cache_size", 4).unwrap();
                    c.execute_batch("BEGIN").unwrap();
                    for i in 0..(20 + next(200)) {
                        c.execute(
                            "INSERT OR REPLACE INTO t VALUES (?1, ?2)",
                            params![((i * 7 + round as u64) % 400) as i64, vec![0xEEu8; 700]],
                        )
                        .unwrap();
                    }
                    c.execute_batch("ROLLBACK").unwrap();
                    c.pragma_update(None, "cache_size", -2000).unwrap();
                }
                2 => {
                    c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                        .unwrap();
                }
                3 if round % 30 == 3 => {
                    c.execute("DELETE FROM t WHERE k % 3 = 0", []).unwrap();
                    c.execute_batch("VACUUM").unwrap();
                }
                _ => {
                    c.execute_batch("BEGIN").unwrap();
                    for _ in 0..(1 + next(30)) {
                        let k = next(400);
                        let len = [10, 300, 3000, 9000][next(4) as usize];
                        c.execute(
                            "INSERT OR REPLACE INTO t VALUES (?1, ?2)",
                            params![k as i64, vec![(round % 251) as u8; len]],
                        )
                        .unwrap();
                    }
                    c.execute_batch("COMMIT").unwrap();
                }
            }
            if next(3) == 0 {
                replayed.apply(db.take_changes().unwrap())?;
                if replayed.bytes != db.committed_image().unwrap() {
                    return Err(format!("round {round}: the replayed database differs"));
                }
            }
        }
        replayed.apply(db.take_changes().unwrap())?;
        if replayed.bytes != db.committed_image().unwrap() {
            return Err("at the end: the replayed database differs".into());
        }
        drop(db);
        untrack(dir.path());
        Ok(())
    }

    #[test]
    fn the_pages_taken_rebuild_the_committed_database() {
        replay_matches(false).unwrap();
    }

    #[test]
    fn keeping_a_rolled_back_transactions_frames_ships_pages_never_committed() {
        // The unsafe variant: at a commit, frames beyond the commit frame
        // (left by a transaction that spilled, then rolled back) are kept.
        let e = replay_matches(true).unwrap_err();
        assert!(e.contains("differs") || e.contains("out of place"), "{e}");
    }

    /// Every connection to the file feeds one capture: a commit made by a
    /// connection that closed is still taken by the next one.
    #[test]
    fn a_closed_connections_commits_stay_captured() {
        let dir = tempfile::tempdir().unwrap();
        track(dir.path());
        let limits = StoreLimits::default();
        let db = ActorDb::open(dir.path(), &limits, OpenMode::Create)
            .unwrap()
            .unwrap();
        db.take_changes().unwrap();
        db.conn_for_tests()
            .execute_batch("CREATE TABLE t (v); INSERT INTO t VALUES (zeroblob(20000));")
            .unwrap();
        drop(db);
        let again = ActorDb::open(dir.path(), &limits, OpenMode::Existing)
            .unwrap()
            .unwrap();
        let ch = again.take_changes().unwrap();
        assert!(ch.lost.is_none());
        assert!(ch.pages.len() >= 5, "{} pages", ch.pages.len());
        // Untracked folders capture nothing.
        drop(again);
        untrack(dir.path());
        let plain = ActorDb::open(dir.path(), &limits, OpenMode::Existing)
            .unwrap()
            .unwrap();
        assert!(plain.take_changes().is_none());
    }

    /// A transaction written over a captured commit (SQLite abandoned the
    /// commit after writing its frames) makes the capture give up; a new
    /// log header (the log starting over) does not.
    #[test]
    fn a_commit_written_over_is_not_trusted() {
        let page = vec![3u8; 1024];
        let frame = |c: &mut Capture, at: i64, pgno: u32, commit: u32| {
            let mut h = [0u8; 24];
            h[0..4].copy_from_slice(&pgno.to_be_bytes());
            h[4..8].copy_from_slice(&commit.to_be_bytes());
            c.written(&h, at);
            c.written(&page, at + 24);
        };
        let mut c = Capture::default();
        frame(&mut c, 32, 1, 0);
        frame(&mut c, 32 + 1048, 2, 2);
        // The log starts over: frames from the start are a new generation.
        c.written(&[0u8; 32], 0);
        frame(&mut c, 32, 2, 2);
        assert!(c.take().lost.is_none());
        frame(&mut c, 32 + 1048, 1, 2);
        // The next transaction starts at the commit just captured.
        frame(&mut c, 32 + 1048, 1, 2);
        assert_eq!(c.take().lost, Some("a commit that the log did not keep"));
    }

    /// Opening a database that is not in WAL mode rewrites its header
    /// outside the log: the capture gives up for that upload.
    #[test]
    fn a_database_switched_to_wal_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let c = rusqlite::Connection::open(dir.path().join(crate::paths::DB_FILE)).unwrap();
        c.execute_batch("PRAGMA journal_mode=DELETE; CREATE TABLE t (v);")
            .unwrap();
        drop(c);
        track(dir.path());
        let db = ActorDb::open(dir.path(), &StoreLimits::default(), OpenMode::Existing);
        // The file lacks the runtime's tables: whether it opens does not
        // matter here, only what the capture says.
        drop(db);
        let ch = lock(&of(dir.path()).unwrap()).take();
        assert_eq!(ch.lost, Some("a database switched to WAL"));
        untrack(dir.path());
    }

    /// Past its bound the capture gives up (the next upload reads the
    /// whole database) rather than hold more.
    #[test]
    fn a_capture_over_its_bound_gives_up() {
        let mut c = Capture::default();
        let page = vec![1u8; 4096];
        let frame = |c: &mut Capture, i: i64, commit: u32| {
            let at = 32 + i * (24 + 4096);
            let mut h = [0u8; 24];
            h[0..4].copy_from_slice(&(i as u32 + 1).to_be_bytes());
            h[4..8].copy_from_slice(&commit.to_be_bytes());
            c.written(&h, at);
            c.written(&page, at + 24);
        };
        let n = (CAPTURE_BYTES_MAX / 4096) as i64;
        for i in 0..n {
            frame(&mut c, i, 0);
        }
        assert!(c.lost.is_none());
        frame(&mut c, n, n as u32 + 1);
        let ch = c.take();
        assert!(ch.lost.is_some() && ch.pages.is_empty());
        assert_eq!(c.bytes, 0);
        // The node's bound holds past each capture's reserve; within it a
        // capture keeps its pages however full the node's pool is.
        let big = CAPTURE_RESERVED_BYTES;
        assert!(room(big, CAPTURE_NODE_BYTES_MAX - 4096, 4096).is_ok());
        assert!(room(big, CAPTURE_NODE_BYTES_MAX - 4095, 4096).is_err());
        assert!(room(0, CAPTURE_NODE_BYTES_MAX, 4096).is_ok());
        assert!(room(big - 4096, CAPTURE_NODE_BYTES_MAX, 4096).is_ok());
        assert!(room(CAPTURE_BYTES_MAX - 4095, 0, 4096).is_err());
    }
}
