//! The commit log's rules, each shown to hold by a power cut after every
//! write of a recorded run, and shown needed by its unsafe variant.
//!
//! The run (`scenario`) writes to three actors through the real VFS and
//! log, with checkpoints, a log that starts over, a cut, a close and a
//! reopen, and a database replaced by a restore. Every write, sync, file
//! creation, deletion and rename it makes to the data directory is
//! recorded (`note`). For each point of the run, `Disk` rebuilds what a
//! power cut there may leave: every synced byte; of the rest, nothing, all,
//! or a seeded choice of writes; and of the folder entries changed since
//! their folder was synced, each combination. The copy is recovered
//! ([`super::recover`]) and every actor's counter read: it must hold at
//! least what was acknowledged and no more than was committed, in a
//! database SQLite finds whole.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::{CommitLog, Identity, UNSAFE_RULES, UnsafeRules, make_durable, recover};
use crate::db::{ActorDb, OpenMode};
use crate::limits::StoreLimits;

/// One thing the run did to the data directory.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    Create(PathBuf),
    Write {
        path: PathBuf,
        offset: u64,
        data: Vec<u8>,
    },
    Truncate {
        path: PathBuf,
        len: u64,
    },
    Sync(PathBuf),
    DirSync(PathBuf),
    SyncAll,
    /// A file's pages written back ahead of a cut's `syncfs`: nothing is
    /// durable for it (no cache flush, no metadata), so a power cut may
    /// still keep any part of what is pending.
    WriteBack(PathBuf),
    Delete(PathBuf),
    Rename {
        from: PathBuf,
        to: PathBuf,
    },
    /// The file at the path is the one with this identity (noted at its
    /// first write, so a copy can stand for it).
    Is(PathBuf, Identity),
    /// The run acknowledged `value` for actor `actor`.
    Ack {
        actor: usize,
        value: u64,
    },
    /// The run committed `value` for actor `actor` (not yet acknowledged).
    Committed {
        actor: usize,
        value: u64,
    },
}

/// Which record [`FAIL_RECORD`] fails.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum FailRecord {
    No,
    /// The next one.
    Next,
    /// The next one whose bytes are all zeros (a commit's last page, a
    /// blob's last overflow page, written apart from its frame's header).
    NextOfZeros,
}

impl FailRecord {
    pub(crate) fn fails(self, data: &[u8]) -> bool {
        match self {
            FailRecord::No => false,
            FailRecord::Next => true,
            FailRecord::NextOfZeros => data.iter().all(|b| *b == 0),
        }
    }
}

thread_local! {
    static RECORDING: RefCell<Option<Vec<Op>>> = const { RefCell::new(None) };
    static SEEN: RefCell<HashMap<PathBuf, Identity>> = RefCell::new(HashMap::new());
    static ALIASES: RefCell<HashMap<Identity, Identity>> = RefCell::new(HashMap::new());
    /// Cuts run on the caller's thread (the recorder is per thread).
    pub(crate) static CUT_INLINE: Cell<bool> = const { Cell::new(false) };
    /// Segments small enough to copy at every power cut. At this size a
    /// run fills none (its cut and its two segments at once are made by
    /// hand, where the unsafe variants need them); the safe run is also
    /// made with segments it fills several of (`FILLED_SEGMENT_BYTES`).
    static CUTS: Cell<u64> = const { Cell::new(0) };
    pub(crate) static SEGMENT_BYTES_FOR_TESTS: Cell<u64> = const { Cell::new(1024 * 1024) };
    /// The next cut's `syncfs` fails, as one does after a write-back
    /// failed (the kernel reports it once).
    pub(crate) static FAIL_SYNCFS: Cell<bool> = const { Cell::new(false) };
    /// A cut's write-back of each log ahead of its `syncfs` fails with
    /// this error number.
    pub(crate) static FAIL_WRITE_BACK: Cell<Option<i32>> = const { Cell::new(None) };
    /// A record to come fails the log, as another thread's failed write
    /// of the segment would between the write's check and its record.
    pub(crate) static FAIL_RECORD: Cell<FailRecord> = const { Cell::new(FailRecord::No) };
    /// The next write-out past the pending bound fails the log once its
    /// records are in the segment's file.
    pub(crate) static FAIL_AFTER_WRITE_OUT: Cell<bool> = const { Cell::new(false) };
    /// For each value committed, the mirror the same commit left (the
    /// value itself, or the last one mirrored before a commit that wrote
    /// the counter alone); and each actor's last mirrored value.
    static MIRRORS: RefCell<(HashMap<u64, u64>, HashMap<usize, u64>)> =
        RefCell::new((HashMap::new(), HashMap::new()));
}

/// Records `op` if this thread records.
pub(crate) fn note(op: Op) {
    RECORDING.with_borrow_mut(|r| {
        let Some(ops) = r else { return };
        match &op {
            Op::Write { path, .. } | Op::Truncate { path, .. } => {
                let m = std::fs::metadata(path);
                if let Ok(m) = m {
                    use std::os::unix::fs::MetadataExt;
                    let id = Identity {
                        dev: m.dev(),
                        ino: m.ino(),
                        born_ns: m
                            .created()
                            .ok()
                            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                            .map_or(0, |d| d.as_nanos() as u64),
                    };
                    let new = SEEN.with_borrow_mut(|s| s.insert(path.clone(), id) != Some(id));
                    if new {
                        ops.push(Op::Is(path.clone(), id));
                    }
                }
            }
            Op::Create(path) | Op::Delete(path) => {
                SEEN.with_borrow_mut(|s| s.remove(path));
            }
            Op::Rename { from, to } => {
                SEEN.with_borrow_mut(|s| {
                    s.remove(from);
                    s.remove(to);
                });
            }
            _ => {}
        }
        ops.push(op);
    });
}

/// The identity a copy's file stands for.
pub(crate) fn alias(id: Identity) -> Identity {
    ALIASES.with_borrow(|a| a.get(&id).copied().unwrap_or(id))
}

#[derive(Clone, Default)]
struct Inode {
    durable: Vec<u8>,
    current: Vec<u8>,
    /// Changes since the last sync, in order.
    pending: Vec<Change>,
    id: Option<Identity>,
}

#[derive(Clone)]
enum Change {
    Write(u64, Vec<u8>),
    Truncate(u64),
}

fn apply(content: &mut Vec<u8>, c: &Change) {
    match c {
        Change::Write(offset, data) => {
            let end = *offset as usize + data.len();
            if content.len() < end {
                content.resize(end, 0);
            }
            content[*offset as usize..end].copy_from_slice(data);
        }
        Change::Truncate(len) => content.resize(*len as usize, 0),
    }
}

/// The data directory as the disk holds it: what is synced, and what is
/// only in the page cache.
#[derive(Clone, Default)]
struct Disk {
    inodes: Vec<Inode>,
    names: BTreeMap<PathBuf, usize>,
    durable_names: BTreeMap<PathBuf, usize>,
}

/// What a power cut keeps of the writes not synced.
#[derive(Clone, Copy, Debug)]
enum Kept {
    Nothing,
    All,
    Seeded(u64),
}

impl Disk {
    fn inode_of(&mut self, path: &Path) -> usize {
        if let Some(i) = self.names.get(path) {
            return *i;
        }
        // A file the run found there (made before the recording).
        self.inodes.push(Inode::default());
        let i = self.inodes.len() - 1;
        self.names.insert(path.to_owned(), i);
        self.durable_names.insert(path.to_owned(), i);
        i
    }

    fn step(&mut self, op: &Op) {
        match op {
            Op::Create(p) => {
                self.inodes.push(Inode::default());
                self.names.insert(p.clone(), self.inodes.len() - 1);
            }
            Op::Write { path, offset, data } => {
                let i = self.inode_of(path);
                let c = Change::Write(*offset, data.clone());
                apply(&mut self.inodes[i].current, &c);
                self.inodes[i].pending.push(c);
            }
            Op::Truncate { path, len } => {
                let i = self.inode_of(path);
                let c = Change::Truncate(*len);
                apply(&mut self.inodes[i].current, &c);
                self.inodes[i].pending.push(c);
            }
            Op::Is(path, id) => {
                let i = self.inode_of(path);
                self.inodes[i].id = Some(*id);
            }
            Op::Sync(p) => {
                let i = self.inode_of(p);
                let n = &mut self.inodes[i];
                n.durable = n.current.clone();
                n.pending.clear();
            }
            Op::DirSync(d) => {
                self.durable_names
                    .retain(|p, _| p.parent() != Some(d.as_path()));
                for (p, i) in &self.names {
                    if p.parent() == Some(d.as_path()) {
                        self.durable_names.insert(p.clone(), *i);
                    }
                }
            }
            Op::SyncAll => {
                for n in &mut self.inodes {
                    n.durable = n.current.clone();
                    n.pending.clear();
                }
                self.durable_names = self.names.clone();
            }
            Op::Delete(p) => {
                self.names.remove(p);
            }
            Op::Rename { from, to } => {
                if let Some(i) = self.names.remove(from) {
                    self.names.insert(to.clone(), i);
                }
            }
            Op::Ack { .. } | Op::Committed { .. } | Op::WriteBack(_) => {}
        }
    }

    /// Paths whose folder entry changed since their folder was synced.
    fn unsettled(&self) -> Vec<PathBuf> {
        let mut all: Vec<PathBuf> = self
            .names
            .keys()
            .chain(self.durable_names.keys())
            .filter(|p| self.names.get(*p) != self.durable_names.get(*p))
            .cloned()
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// Writes what a power cut may leave under `to` (the run's `root`
    /// mapped there): entries in `take_new` as the run left them, the
    /// others as last synced; each file's content as `kept` says.
    fn write_copy(&self, root: &Path, to: &Path, take_new: &[PathBuf], kept: Kept) {
        let mut names = self.durable_names.clone();
        for p in take_new {
            match self.names.get(p) {
                Some(i) => names.insert(p.clone(), *i),
                None => names.remove(p),
            };
        }
        let mut rng = match kept {
            Kept::Seeded(s) => s | 1,
            _ => 1,
        };
        for (p, i) in &names {
            let n = &self.inodes[*i];
            let content = match kept {
                Kept::Nothing => n.durable.clone(),
                Kept::All => n.current.clone(),
                Kept::Seeded(_) => {
                    let mut c = n.durable.clone();
                    for ch in &n.pending {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        if rng % 2 == 0 {
                            apply(&mut c, ch);
                        }
                    }
                    c
                }
            };
            let dest = to.join(p.strip_prefix(root).expect("under the root"));
            std::fs::create_dir_all(dest.parent().expect("a parent")).unwrap();
            let mut content = content;
            if p.parent().and_then(|d| d.file_name()) == Some(std::ffi::OsStr::new(super::DIR)) {
                content.truncate(copied_segment_bytes(p, &content));
            }
            std::fs::write(&dest, content).unwrap();
            if let Some(id) = n.id {
                let copy = Identity::of(&dest).unwrap();
                ALIASES.with_borrow_mut(|a| a.insert(copy, id));
            }
        }
    }
}

/// How much of the file at `path` in the log's folder a copy keeps: not
/// the zeros past a segment's records, which read as its end either way
/// (copying them would make every power cut slow), but every byte of its
/// records. A record may end in zeros itself (a log's header whose
/// checksum does, one time in 256): cutting at the last byte that is not
/// zero would drop that record from the copy, a loss no disk makes (CI
/// found it so: a header lost, and a generation's prefix read).
fn copied_segment_bytes(path: &Path, content: &[u8]) -> usize {
    let not_zero = content.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    let seq = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(super::SEGMENT_SUFFIX))
        .and_then(|n| n.parse::<u64>().ok());
    match seq {
        Some(seq) => not_zero.max(content.len() - super::decode(content, seq).1),
        // The spare, which replay never reads.
        None => not_zero,
    }
}

#[test]
fn a_copy_keeps_a_segments_last_record_that_ends_in_zeros() {
    let seq = 3;
    // A key as a tap makes it: the path's length and bytes, then the
    // file's identity (three numbers).
    let mut key = vec![2, 0, b'a', b'b'];
    key.extend_from_slice(&[1; 24]);
    let mut bytes = Vec::new();
    super::encode(&mut bytes, &key, 0, &[7, 7, 0]);
    super::encode(&mut bytes, &key, 32, &[9, 0, 0, 0]);
    super::seal(&mut bytes, seq);
    let whole = bytes.len();
    bytes.resize(whole + 4096, 0);
    let path = PathBuf::from(format!(
        "/data/{}/{seq:020}{}",
        super::DIR,
        super::SEGMENT_SUFFIX
    ));
    let kept = copied_segment_bytes(&path, &bytes);
    assert_eq!(
        kept, whole,
        "the copy keeps the records and no zeros past them"
    );
    let (records, _) = super::decode(&bytes[..kept], seq);
    assert_eq!(records.len(), 2);
    assert_eq!(records[1].data, &[9, 0, 0, 0]);
}

fn limits() -> StoreLimits {
    StoreLimits::default()
}

fn counter(db: &mut ActorDb) -> u64 {
    db.kv_get("n")
        .unwrap()
        .map(|v| u64::from_le_bytes(v.try_into().unwrap()))
        .unwrap_or(0)
}

fn commit(db: &mut ActorDb, actor: usize, value: u64) {
    commit_as(db, actor, value, true);
}

/// A commit of `value`, mirrored or not. The mirror is the same value in a
/// table of its own, on another page: a database that mixes pages of two
/// commits (a checkpoint carried past what replay puts back, whose pages
/// replay's shorter log does not all cover) shows a mirror that no commit
/// of its counter left.
fn commit_as(db: &mut ActorDb, actor: usize, value: u64, mirrored: bool) {
    // Noted first: the commit's writes come before `commit` returns.
    note(Op::Committed { actor, value });
    MIRRORS.with_borrow_mut(|(of_value, last)| {
        if mirrored {
            last.insert(actor, value);
        }
        let m = last.get(&actor).copied().unwrap_or(0);
        assert_eq!(*of_value.entry(value).or_insert(m), m, "value {value}");
    });
    db.begin().unwrap();
    db.kv_put("n", &value.to_le_bytes()).unwrap();
    if mirrored {
        db.conn_for_tests()
            .execute_batch(&format!(
                "CREATE TABLE IF NOT EXISTS mirror(k INTEGER PRIMARY KEY, v INTEGER);
                 INSERT OR REPLACE INTO mirror(k, v) VALUES (1, {value});"
            ))
            .unwrap();
    }
    db.commit().unwrap();
}

/// The run: three actors, groups of commits made durable through the
/// log, and everything that changes a log's file besides appends.
fn scenario(root: &Path) -> Vec<Op> {
    RECORDING.with_borrow_mut(|r| *r = Some(Vec::new()));
    SEEN.with_borrow_mut(|s| s.clear());
    MIRRORS.with_borrow_mut(|(of_value, last)| {
        of_value.clear();
        last.clear();
    });
    CUT_INLINE.set(true);
    let (log, _) = CommitLog::start(root).unwrap();
    let dir = |a: usize| root.join("actors").join(format!("a{a}"));
    let mut dbs: Vec<Option<ActorDb>> = Vec::new();
    let mut value = [0u64; 3];
    let mut unacked: Vec<(usize, u64)> = Vec::new();
    let durable = |dbs: &mut Vec<Option<ActorDb>>, unacked: &mut Vec<(usize, u64)>| {
        let wals: Vec<PathBuf> = dbs.iter().flatten().map(|d| d.wal_path()).collect();
        let mut dirs = Vec::new();
        for d in dbs.iter_mut().flatten() {
            dirs.extend(d.take_new_dirs());
        }
        let files: Vec<&PathBuf> = wals.iter().collect();
        let dirs: Vec<&PathBuf> = dirs.iter().collect();
        make_durable(Some(&log), root, &files, &dirs).unwrap();
        for (actor, value) in unacked.drain(..) {
            note(Op::Ack { actor, value });
        }
    };
    for (a, v) in value.iter_mut().enumerate() {
        let mut db = ActorDb::open(&dir(a), &limits(), OpenMode::Create)
            .unwrap()
            .unwrap();
        *v = 1;
        commit(&mut db, a, 1);
        unacked.push((a, 1));
        dbs.push(Some(db));
        durable(&mut dbs, &mut unacked);
    }
    for round in 2..=24u64 {
        for a in 0..3 {
            let Some(db) = dbs[a].as_mut() else { continue };
            value[a] = if a == 1 && round > 17 {
                1000 + round
            } else {
                round
            };
            commit(db, a, value[a]);
            if round == 16 && a == 1 {
                // Again, before the group's barrier: the log that started
                // over in round 15 reaches past its first frames, over the
                // older generation's, before anything makes it durable.
                commit(db, a, value[a]);
            }
            unacked.push((a, value[a]));
        }
        durable(&mut dbs, &mut unacked);
        match round {
            // A checkpoint that empties the log: its next commit writes a
            // new header at offset 0 of a truncated file.
            5 => {
                let c = dbs[0].as_ref().unwrap().conn_for_tests();
                c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                    .unwrap();
            }
            // One that keeps the file: the next header overwrites the old
            // one and older frames stay past the new generation's end.
            7 => {
                let c = dbs[1].as_ref().unwrap().conn_for_tests();
                c.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
                    .unwrap();
            }
            // A segment full while a cut still runs: the next cut forgets
            // two segments at once.
            9 => log.roll_for_tests(),
            11 => {
                let c = dbs[0].as_ref().unwrap().conn_for_tests();
                c.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
                    .unwrap();
            }
            12 => log.cut_now().unwrap(),
            // Closed (a log past `LOG_KEPT_AT_CLOSE_BYTES_MAX` is
            // checkpointed and emptied, ADR 0076) and opened again.
            14 => {
                long_log(dbs[2].as_ref().unwrap());
                dbs[2] = None;
                dbs[2] = ActorDb::open(&dir(2), &limits(), OpenMode::Existing).unwrap();
            }
            // Actor 1's log starts over after the cut: the live segments
            // hold its header when the restore below replaces it.
            15 => {
                let c = dbs[1].as_ref().unwrap().conn_for_tests();
                c.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
                    .unwrap();
            }
            // A restore puts another database in actor 1's place.
            17 => {
                dbs[1] = None;
                let staged = root.join("staging").join("a1");
                let mut other = ActorDb::open(&staged, &limits(), OpenMode::Create)
                    .unwrap()
                    .unwrap();
                commit(&mut other, 9, 1000);
                // A restore's file is one whole database (an operator's
                // upload): a close would leave this short log beside it
                // (ADR 0076), and only the file moves.
                other
                    .conn_for_tests()
                    .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                    .unwrap();
                drop(other);
                let db_file = dir(1).join(crate::paths::DB_FILE);
                let staged_file = staged.join(crate::paths::DB_FILE);
                note(Op::SyncAll);
                crate::sync::sync_filesystem(root).unwrap();
                let wal = dbs_wal(&db_file);
                std::fs::remove_file(&wal).unwrap();
                note(Op::Delete(wal));
                note(Op::Committed {
                    actor: 1,
                    value: 1000,
                });
                // Renamed over the old file, which the disk then holds or
                // not, never neither.
                std::fs::rename(&staged_file, &db_file).unwrap();
                note(Op::Rename {
                    from: staged_file,
                    to: db_file,
                });
                crate::sync::sync_dir(&dir(1)).unwrap();
                note(Op::DirSync(dir(1)));
                note(Op::Ack {
                    actor: 1,
                    value: 1000,
                });
                dbs[1] = ActorDb::open(&dir(1), &limits(), OpenMode::Existing).unwrap();
            }
            _ => {}
        }
    }
    // One actor alone per group (the barrier for a lone file), and another
    // committing with nobody waiting (as an alarm does) across a
    // checkpoint that starts its log over, made durable only at the end.
    for round in 25..=30u64 {
        let db0 = dbs[0].as_mut().unwrap();
        commit(db0, 0, round);
        let wal = db0.wal_path();
        make_durable(Some(&log), root, &[&wal], &[]).unwrap();
        note(Op::Ack {
            actor: 0,
            value: round,
        });
        let db2 = dbs[2].as_mut().unwrap();
        commit(db2, 2, round);
        if round == 27 {
            db2.conn_for_tests()
                .query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
                .unwrap();
        }
    }
    let wal2 = dbs[2].as_ref().unwrap().wal_path();
    make_durable(Some(&log), root, &[&wal2], &[]).unwrap();
    note(Op::Ack {
        actor: 2,
        value: 30,
    });
    // Actor 0 closed with a short log, which the close leaves as it is
    // (ADR 0076), opened again, and its next commit appended to that log
    // (after actor 2's lone barrier above: this step's barriers would
    // have made actor 2's records durable first).
    let db0 = dbs[0].as_mut().unwrap();
    db0.conn_for_tests()
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    // (Values no other actor's commit uses: the mirrors are told apart by
    // value.)
    for value in [50, 51] {
        if value == 51 {
            short_log(dbs[0].as_ref().unwrap());
            dbs[0] = None;
            dbs[0] = ActorDb::open(&dir(0), &limits(), OpenMode::Existing).unwrap();
        }
        let db0 = dbs[0].as_mut().unwrap();
        commit(db0, 0, value);
        let wal = db0.wal_path();
        make_durable(Some(&log), root, &[&wal], &[]).unwrap();
        note(Op::Ack { actor: 0, value });
    }
    // A checkpoint of a commit nobody waited for, whose pages the log's
    // acknowledged records do not all cover: actor 2 opens with an empty
    // log, 31 (the counter alone) is acknowledged, 32 (counter and mirror)
    // is not, a checkpoint copies both into the database, and commits
    // nobody waits for write the next generation over the first's frames.
    long_log(dbs[2].as_ref().unwrap());
    dbs[2] = None;
    dbs[2] = ActorDb::open(&dir(2), &limits(), OpenMode::Existing).unwrap();
    let db2 = dbs[2].as_mut().unwrap();
    commit_as(db2, 2, 31, false);
    let wal2 = db2.wal_path();
    make_durable(Some(&log), root, &[&wal2], &[]).unwrap();
    note(Op::Ack {
        actor: 2,
        value: 31,
    });
    commit_as(db2, 2, 32, true);
    db2.conn_for_tests()
        .query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
        .unwrap();
    for value in 33..=40 {
        commit_as(db2, 2, value, false);
    }
    drop(dbs);
    CUT_INLINE.set(false);
    // The hand-made cut at round 12 is one; a run that fills segments
    // makes more.
    CUTS.set(log.cuts_total.load(std::sync::atomic::Ordering::Relaxed));
    RECORDING.with_borrow_mut(|r| r.take()).unwrap()
}

/// Checks that closing `db` checkpoints its log (ADR 0076 leaves a short
/// one as it is): the closes of the scenario are checkpoints.
fn long_log(db: &ActorDb) {
    let len = std::fs::metadata(db.wal_path()).unwrap().len();
    assert!(
        len > crate::db::LOG_KEPT_AT_CLOSE_BYTES_MAX,
        "the log ({len} bytes) is short: its close would not checkpoint"
    );
}

/// Checks that closing `db` leaves its log as it is (ADR 0076): a log
/// with frames, short enough.
fn short_log(db: &ActorDb) {
    let len = std::fs::metadata(db.wal_path()).unwrap().len();
    assert!(
        len > 32 && len <= crate::db::LOG_KEPT_AT_CLOSE_BYTES_MAX,
        "the log ({len} bytes) is not one a close keeps"
    );
}

fn dbs_wal(db_file: &Path) -> PathBuf {
    let mut s = db_file.as_os_str().to_owned();
    s.push("-wal");
    PathBuf::from(s)
}

/// Replays `ops` with a power cut after each; the first failure found.
fn power_cut_at_every_write(rules: UnsafeRules) -> Result<usize, String> {
    let run = tempfile::tempdir().unwrap();
    let root = run.path().join("data");
    std::fs::create_dir_all(&root).unwrap();
    UNSAFE_RULES.set(rules);
    let ops = scenario(&root);
    let mut disk = Disk::default();
    let mut acked = [0u64; 3];
    let mut committed = [0u64; 3];
    let mut cuts = 0;
    // Each power cut's seed is the index of the op it follows, not counting
    // a cut's write-backs: they change nothing on the disk, and the run's
    // power cuts are the same with them as without (ADR 0080).
    let mut k = 0usize;
    for (at, op) in ops.iter().enumerate() {
        if at > 0 && !matches!(ops[at - 1], Op::WriteBack(_)) {
            k += 1;
        }
        disk.step(op);
        match op {
            Op::Ack { actor, value } => acked[*actor] = *value,
            Op::Committed { actor, value } if *actor < 3 => {
                committed[*actor] = committed[*actor].max(*value);
            }
            _ => {}
        }
        if !matches!(
            op,
            Op::Write { .. }
                | Op::Truncate { .. }
                | Op::Delete(_)
                | Op::Rename { .. }
                | Op::Create(_)
                | Op::Ack { .. }
        ) {
            continue;
        }
        let unsettled = disk.unsettled();
        let mut choices: Vec<Vec<PathBuf>> = Vec::new();
        if unsettled.len() <= 4 {
            for mask in 0..(1u32 << unsettled.len()) {
                choices.push(
                    unsettled
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| mask & (1 << i) != 0)
                        .map(|(_, p)| p.clone())
                        .collect(),
                );
            }
        } else {
            choices.push(Vec::new());
            choices.push(unsettled.clone());
        }
        for take_new in &choices {
            for kept in [Kept::Nothing, Kept::All, Kept::Seeded(k as u64 * 7919)] {
                cuts += 1;
                let copy = tempfile::tempdir().unwrap();
                disk.write_copy(&root, &copy.path().join("data"), take_new, kept);
                let found = check(copy.path(), &acked, &committed);
                ALIASES.with_borrow_mut(|a| a.clear());
                if let Err(e) = found {
                    UNSAFE_RULES.set(UnsafeRules::default());
                    return Err(format!(
                        "power cut after op {at} ({}), entries {take_new:?}, kept {kept:?}: {e}",
                        describe(op)
                    ));
                }
            }
        }
    }
    UNSAFE_RULES.set(UnsafeRules::default());
    Ok(cuts)
}

fn describe(op: &Op) -> String {
    match op {
        Op::Write { path, offset, data } => {
            format!(
                "write of {} bytes at {offset} to {}",
                data.len(),
                path.display()
            )
        }
        other => format!("{other:?}"),
    }
}

/// Recovers the copy and reads every actor's counter.
fn check(copy: &Path, acked: &[u64; 3], committed: &[u64; 3]) -> Result<(), String> {
    let copy_root = copy.join("data");
    std::fs::create_dir_all(&copy_root).unwrap();
    recover(&copy_root).map_err(|e| format!("recovery failed: {e}"))?;
    for a in 0..3 {
        let dir = copy_root.join("actors").join(format!("a{a}"));
        let db = ActorDb::open(&dir, &limits(), OpenMode::Existing)
            .map_err(|e| format!("actor {a}: {e}"))?;
        let Some(mut db) = db else {
            if acked[a] > 0 {
                return Err(format!(
                    "actor {a}: its database is gone, {} acknowledged",
                    acked[a]
                ));
            }
            continue;
        };
        let ok: String = db
            .conn_for_tests()
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(|e| format!("actor {a}: {e}"))?;
        if ok != "ok" {
            return Err(format!("actor {a}: integrity: {ok}"));
        }
        let v = counter(&mut db);
        // Every actor's first commit is mirrored: past value 0 the table
        // is there, and an error reading it is not a mix of pages.
        let mirrored: Option<i64> = if v == 0 {
            None
        } else {
            Some(
                db.conn_for_tests()
                    .query_row("SELECT v FROM mirror WHERE k = 1", [], |r| r.get(0))
                    .map_err(|e| format!("actor {a}: reading the mirror: {e}"))?,
            )
        };
        let expected = MIRRORS.with_borrow(|(of_value, _)| of_value.get(&v).copied());
        if v > 0 && mirrored.map(|m| m as u64) != expected {
            return Err(format!(
                "actor {a}: pages of two commits, counter {v} and its mirror {mirrored:?}"
            ));
        }
        if v < acked[a] || v > committed[a].max(acked[a]) {
            return Err(format!(
                "actor {a}: counter {v}, acknowledged {}, committed {}",
                acked[a], committed[a]
            ));
        }
    }
    Ok(())
}

/// Segments a run fills several of: full segments are cut by the log
/// itself, and cut segments serve again.
const FILLED_SEGMENT_BYTES: u64 = 96 * 1024;

#[test]
fn power_cut_at_every_write_loses_no_acknowledged_commit() {
    let cuts = power_cut_at_every_write(UnsafeRules::default()).unwrap();
    assert!(cuts > 500, "only {cuts} power cuts were tried");
}

#[test]
fn power_cut_at_every_write_of_a_run_that_fills_segments_loses_nothing() {
    SEGMENT_BYTES_FOR_TESTS.set(FILLED_SEGMENT_BYTES);
    let found = power_cut_at_every_write(UnsafeRules::default());
    SEGMENT_BYTES_FOR_TESTS.set(1024 * 1024);
    let cuts = found.unwrap();
    assert!(cuts > 500, "only {cuts} power cuts were tried");
    assert!(CUTS.get() >= 3, "the run cut {} times", CUTS.get());
}

#[test]
fn a_cut_without_syncfs_loses_acknowledged_commits() {
    let e = power_cut_at_every_write(UnsafeRules {
        cut_without_syncfs: true,
        ..UnsafeRules::default()
    })
    .unwrap_err();
    eprintln!("{e}");
    assert!(e.contains("acknowledged"), "{e}");
}

#[test]
fn replaying_into_a_replaced_database_corrupts_it() {
    let e = power_cut_at_every_write(UnsafeRules {
        replay_into_any_file: true,
        ..UnsafeRules::default()
    })
    .unwrap_err();
    eprintln!("{e}");
    assert!(e.contains("actor 1"), "{e}");
}

#[test]
fn a_lone_file_synced_by_itself_ahead_of_the_log_loses_commits() {
    let e = power_cut_at_every_write(UnsafeRules {
        lone_file_by_itself: true,
        ..UnsafeRules::default()
    })
    .unwrap_err();
    eprintln!("{e}");
}

#[test]
fn a_log_synced_for_a_checkpoint_ahead_of_its_records_mixes_commits() {
    let e = power_cut_at_every_write(UnsafeRules {
        sync_log_before_records: true,
        ..UnsafeRules::default()
    })
    .unwrap_err();
    eprintln!("{e}");
}

/// The sync after a log's header is skipped only in a log that never held
/// a frame (ADR 0075). Skipped whenever a log starts over, new frames can
/// reach the disk over the older generation's while its header stays:
/// recovery then lays a prefix of that generation over the database.
#[test]
fn a_header_sync_skipped_when_a_used_log_starts_over_mixes_commits() {
    let e = power_cut_at_every_write(UnsafeRules {
        skip_every_header_sync: true,
        ..UnsafeRules::default()
    })
    .unwrap_err();
    eprintln!("{e}");
}

#[test]
fn a_log_header_not_recorded_loses_acknowledged_commits() {
    let e = power_cut_at_every_write(UnsafeRules {
        skip_log_headers: true,
        ..UnsafeRules::default()
    })
    .unwrap_err();
    eprintln!("{e}");
}

#[test]
fn a_new_database_made_durable_through_the_log_alone_is_lost() {
    let e = power_cut_at_every_write(UnsafeRules {
        new_files_through_log: true,
        ..UnsafeRules::default()
    })
    .unwrap_err();
    eprintln!("{e}");
    assert!(e.contains("gone") || e.contains("acknowledged"), "{e}");
}

#[test]
fn replaying_a_segment_older_than_a_gap_undoes_commits() {
    let e = power_cut_at_every_write(UnsafeRules {
        replay_every_segment: true,
        ..UnsafeRules::default()
    })
    .unwrap_err();
    eprintln!("{e}");
}

#[test]
fn a_torn_record_ends_replay_and_a_foreign_database_is_skipped() {
    let run = tempfile::tempdir().unwrap();
    let root = run.path();
    let (log, _) = CommitLog::start(root).unwrap();
    let dir = root.join("actors").join("x");
    let mut db = ActorDb::open(&dir, &limits(), OpenMode::Create)
        .unwrap()
        .unwrap();
    for v in 1..=5 {
        commit(&mut db, 0, v);
    }
    log.barrier().unwrap();
    drop(db);
    let seg = super::segment_path(&root.join(super::DIR), 1);
    let whole = std::fs::read(&seg).unwrap();
    let (records, left) = super::decode(&whole, 1);
    assert!(!records.is_empty());
    let used = whole.len() - left;
    assert!(
        whole[used..].iter().all(|b| *b == 0),
        "a new segment is zeros past its records"
    );
    // A tail torn mid-record is not a record.
    let mut torn = whole[..used].to_vec();
    torn.extend_from_slice(&whole[..40]);
    assert_eq!(super::decode(&torn, 1).0.len(), records.len());
    // A flipped byte ends the records there.
    let mut bad = whole.clone();
    bad[super::HEADER_BYTES + 3] ^= 1;
    assert!(super::decode(&bad, 1).0.is_empty());
    // The same bytes in another segment (a used one serving again) are
    // not its records.
    assert!(super::decode(&whole, 2).0.is_empty());
    // The database deleted: its records are skipped, nothing is created.
    drop(log);
    std::fs::remove_dir_all(&dir).unwrap();
    let found = recover(root).unwrap();
    assert_eq!(found.replayed, 0);
    assert!(found.skipped > 0);
    assert!(!dir.exists());
    assert!(super::segments(&root.join(super::DIR)).unwrap().is_empty());
    assert!(
        root.join(super::DIR).join(super::SPARE).exists(),
        "the last segment is kept to serve again"
    );
}

#[test]
fn records_past_the_pending_bound_reach_the_segment_without_a_barrier() {
    let run = tempfile::tempdir().unwrap();
    let root = run.path();
    let (log, _) = CommitLog::start(root).unwrap();
    let dir = root.join("actors").join("big");
    let mut db = ActorDb::open(&dir, &limits(), OpenMode::Create)
        .unwrap()
        .unwrap();
    // About 70 MB of commits, past the 64 MiB bound.
    for i in 0..36 {
        db.begin().unwrap();
        db.kv_put(&format!("k{i}"), &vec![7u8; 1_900_000]).unwrap();
        db.commit().unwrap();
    }
    // No barrier ran (as for an alarm the timer fired): the records past
    // the bound were written to the segments all the same (and, segments
    // filling, cut since).
    let written = log.bytes_total.load(std::sync::atomic::Ordering::Relaxed) as usize;
    assert!(
        written >= super::PENDING_BYTES_MAX,
        "{written} bytes of records written to segments"
    );
}

/// The log is cut however its records reach it: written out with no
/// barrier (before a group's `syncfs`, or past the pending bound), they
/// still fill segments that are then cut (before, a segment grew without
/// end when no barrier ran).
#[test]
fn segments_fill_and_are_cut_when_records_are_written_without_a_barrier() {
    let run = tempfile::tempdir().unwrap();
    let root = run.path();
    SEGMENT_BYTES_FOR_TESTS.set(FILLED_SEGMENT_BYTES);
    CUT_INLINE.set(true);
    let (log, _) = CommitLog::start(root).unwrap();
    let dir = root.join("actors").join("hot");
    let mut db = ActorDb::open(&dir, &limits(), OpenMode::Create)
        .unwrap()
        .unwrap();
    let new_dirs = db.take_new_dirs();
    let wal = db.wal_path();
    let first: Vec<&PathBuf> = new_dirs.iter().collect();
    make_durable(Some(&log), root, &[&wal], &first).unwrap();
    RECORDING.with_borrow_mut(|r| *r = Some(Vec::new()));
    for v in 1..=200 {
        commit(&mut db, 0, v);
        log.write_pending().unwrap();
    }
    let ops = RECORDING.with_borrow_mut(|r| r.take().unwrap());
    CUT_INLINE.set(false);
    SEGMENT_BYTES_FOR_TESTS.set(1024 * 1024);
    let cuts = log.cuts_total.load(std::sync::atomic::Ordering::Relaxed);
    let live = super::segments(&root.join(super::DIR)).unwrap();
    assert!(cuts >= 3, "{cuts} cuts");
    assert!(live.len() <= 2, "segments left: {live:?}");
    // Each full segment's cut wrote the actor's log back before its
    // `syncfs` (ADR 0080).
    let mut written_back = false;
    for op in &ops {
        match op {
            Op::WriteBack(p) if *p == wal => written_back = true,
            Op::SyncAll => {
                assert!(written_back, "a cut's syncfs without the write-back first");
                written_back = false;
            }
            _ => {}
        }
    }
}

#[test]
fn a_segment_larger_than_the_size_never_serves_at_its_size_again() {
    let run = tempfile::tempdir().unwrap();
    let root = run.path();
    let max = SEGMENT_BYTES_FOR_TESTS.get();
    // What a run with larger segments left: its spare.
    let dir = root.join(super::DIR);
    std::fs::create_dir_all(&dir).unwrap();
    super::zero_filled(&dir.join(super::SPARE), 4 * max).unwrap();
    CUT_INLINE.set(true);
    let (log, _) = CommitLog::start(root).unwrap();
    assert!(
        log.lock_segment().capacity <= max,
        "the old spare serves at this run's size"
    );
    let actor = root.join("actors").join("a");
    let mut db = ActorDb::open(&actor, &limits(), OpenMode::Create)
        .unwrap()
        .unwrap();
    let new_dirs = db.take_new_dirs();
    let first: Vec<&PathBuf> = new_dirs.iter().collect();
    make_durable(Some(&log), root, &[&db.wal_path()], &first).unwrap();
    // Transactions of three times the size: each written out at once
    // grows its segment past the size, which is then cut and kept as the
    // spare.
    let mut largest = 0;
    RECORDING.with_borrow_mut(|r| *r = Some(Vec::new()));
    for _ in 0..4 {
        db.begin().unwrap();
        db.execute("CREATE TABLE IF NOT EXISTS big(b)", &[])
            .unwrap();
        for _ in 0..6 {
            let sql = format!("INSERT INTO big VALUES (zeroblob({}))", max / 2);
            db.execute(&sql, &[]).unwrap();
        }
        db.commit().unwrap();
        log.write_pending().unwrap();
        largest = largest.max(log.lock_segment().capacity);
        if let Ok(m) = std::fs::metadata(dir.join(super::SPARE)) {
            assert!(m.len() <= max, "a spare of {} bytes", m.len());
        }
    }
    CUT_INLINE.set(false);
    let ops = RECORDING.with_borrow_mut(|r| r.take()).unwrap();
    let grown = ops
        .iter()
        .filter_map(|op| match op {
            Op::Write { path, offset, data } if path.starts_with(&dir) => {
                Some(offset + data.len() as u64)
            }
            _ => None,
        })
        .max()
        .unwrap_or(0);
    assert!(grown > max, "no segment grew past the size ({grown} bytes)");
    assert!(largest <= max, "a segment served at {largest} bytes");
    assert!(log.cuts_total.load(std::sync::atomic::Ordering::Relaxed) >= 2);
}

/// A started log under `root` and one actor that committed 1 through it.
fn a_log_and_one_actor(root: &Path) -> (std::sync::Arc<CommitLog>, ActorDb) {
    let (log, _) = CommitLog::start(root).unwrap();
    let dir = root.join("actors").join("a");
    let mut db = ActorDb::open(&dir, &limits(), OpenMode::Create)
        .unwrap()
        .unwrap();
    commit(&mut db, 0, 1);
    (log, db)
}

/// The syncs of the log's segments this thread recorded so far.
fn segment_syncs(root: &Path) -> usize {
    RECORDING.with_borrow(|r| {
        r.as_ref()
            .unwrap()
            .iter()
            .filter(|op| matches!(op, Op::Sync(p) if p.starts_with(root.join(super::DIR))))
            .count()
    })
}

#[test]
fn a_barrier_whose_records_an_earlier_sync_covered_syncs_nothing() {
    let run = tempfile::tempdir().unwrap();
    let root = run.path();
    let (log, mut db) = a_log_and_one_actor(root);
    RECORDING.with_borrow_mut(|r| *r = Some(Vec::new()));
    let syncs = || segment_syncs(root);
    log.barrier().unwrap();
    assert_eq!(syncs(), 1, "the first barrier syncs the segment");
    // Nothing taken since (as a close's checkpoint right after the
    // durability stage's barrier): no second sync.
    log.barrier().unwrap();
    assert_eq!(syncs(), 1, "a barrier with nothing new syncs nothing");
    commit(&mut db, 0, 2);
    log.barrier().unwrap();
    assert_eq!(syncs(), 2, "a new record is synced");
    RECORDING.with_borrow_mut(|r| *r = None);
}

/// A new actor's first commit waits for no barrier (its log never held a
/// frame: the sync after its header is skipped, ADR 0075); a log that
/// starts over after a checkpoint still makes its header durable first.
#[test]
fn a_new_actors_first_commit_syncs_nothing_but_a_log_starting_over_does() {
    let run = tempfile::tempdir().unwrap();
    let root = run.path();
    let (_log, _) = CommitLog::start(root).unwrap();
    RECORDING.with_borrow_mut(|r| *r = Some(Vec::new()));
    let syncs = || segment_syncs(root);
    let mut db = ActorDb::open(&root.join("actors").join("a"), &limits(), OpenMode::Create)
        .unwrap()
        .unwrap();
    commit(&mut db, 0, 1);
    assert_eq!(syncs(), 0, "a new actor's first commit syncs nothing");
    // A spare folder's shape (ADR 0075): an empty database file and log.
    let spare = root.join("actors").join("b");
    std::fs::create_dir_all(&spare).unwrap();
    std::fs::write(spare.join(crate::paths::DB_FILE), b"").unwrap();
    std::fs::write(dbs_wal(&spare.join(crate::paths::DB_FILE)), b"").unwrap();
    let mut other = ActorDb::open(&spare, &limits(), OpenMode::Create)
        .unwrap()
        .unwrap();
    commit(&mut other, 1, 1);
    assert_eq!(syncs(), 0, "nor one made in an empty file and log");
    commit(&mut db, 0, 2);
    db.conn_for_tests()
        .query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
        .unwrap();
    let before = syncs();
    assert!(before >= 1, "the checkpoint synced the log's records first");
    commit(&mut db, 0, 3);
    assert_eq!(
        syncs(),
        before + 1,
        "a log starting over over older frames syncs its header's record"
    );
    RECORDING.with_borrow_mut(|r| *r = None);
}

/// A barrier's result after a cut whose `syncfs` (or, with `write_back`,
/// whose write-back of a log before it failed with this error number)
/// failed, under `rules`.
fn barrier_after_a_failed_cut(rules: UnsafeRules, write_back: Option<i32>) -> std::io::Result<()> {
    let run = tempfile::tempdir().unwrap();
    let root = run.path();
    let (log, mut db) = a_log_and_one_actor(root);
    log.barrier().unwrap();
    UNSAFE_RULES.set(rules);
    let segments = || super::segments(&root.join(super::DIR)).unwrap();
    let before = segments();
    FAIL_WRITE_BACK.set(write_back);
    FAIL_SYNCFS.set(write_back.is_none());
    let cut = log.cut_now_writing_back();
    FAIL_WRITE_BACK.set(None);
    FAIL_SYNCFS.set(false);
    assert!(cut.is_err(), "the injected failure reaches the cut");
    let after = segments();
    assert!(
        before.iter().all(|s| after.contains(s)),
        "a failed cut forgets no segment: {before:?} then {after:?}"
    );
    // The next `syncfs` would succeed with the pages that failed lost: a
    // new actor's group (made durable by one) must fail, and so must a
    // commit (its records refused) or its barrier.
    let (wal, dir) = (db.wal_path(), db.dir().to_owned());
    let group = make_durable(Some(&log), root, &[&wal], &[&dir]);
    db.begin().unwrap();
    db.kv_put("n", &2u64.to_le_bytes()).unwrap();
    let after = match db.commit() {
        Ok(()) => log.barrier(),
        Err(e) => Err(std::io::Error::other(format!("the commit failed: {e}"))),
    };
    UNSAFE_RULES.set(UnsafeRules::default());
    group.and(after)
}

#[test]
fn a_cut_whose_syncfs_failed_fails_every_later_commit() {
    let e = barrier_after_a_failed_cut(UnsafeRules::default(), None).unwrap_err();
    // The group's own `syncfs` succeeded; the failure before it counts.
    assert!(e.to_string().contains("failed earlier"), "{e}");
}

#[test]
fn a_failed_cut_not_kept_as_final_lets_commits_through() {
    let unsafe_rules = UnsafeRules {
        cut_failure_not_final: true,
        ..UnsafeRules::default()
    };
    barrier_after_a_failed_cut(unsafe_rules, None).unwrap();
    barrier_after_a_failed_cut(unsafe_rules, Some(libc::EIO)).unwrap();
}

#[test]
fn a_cut_whose_write_back_failed_fails_every_later_commit() {
    for errno in [libc::EIO, libc::ENOSPC, libc::EROFS] {
        let e = barrier_after_a_failed_cut(UnsafeRules::default(), Some(errno)).unwrap_err();
        assert!(e.to_string().contains("failed earlier"), "{errno}: {e}");
    }
}

/// A write-back the filesystem does not take (`EINVAL`, as for a file
/// `sync_file_range` cannot write back) loses no page: the cut leaves the
/// rest to its `syncfs` and succeeds, and commits go on.
#[test]
fn a_write_back_the_filesystem_does_not_take_leaves_the_cut_to_its_syncfs() {
    let run = tempfile::tempdir().unwrap();
    let root = run.path();
    let (log, mut db) = a_log_and_one_actor(root);
    log.barrier().unwrap();
    FAIL_WRITE_BACK.set(Some(libc::EINVAL));
    RECORDING.with_borrow_mut(|r| *r = Some(Vec::new()));
    let cut = log.cut_now_writing_back();
    let ops = RECORDING.with_borrow_mut(|r| r.take().unwrap());
    FAIL_WRITE_BACK.set(None);
    cut.unwrap();
    assert!(
        ops.iter().any(|op| matches!(op, Op::SyncAll)),
        "the cut's syncfs ran"
    );
    commit(&mut db, 0, 2);
    log.barrier().unwrap();
}

/// The files a recorded cut wrote back, in order, and whether each came
/// before the cut's `syncfs`.
fn written_back(ops: &[Op]) -> Vec<(PathBuf, bool)> {
    let sync_at = ops.iter().position(|op| matches!(op, Op::SyncAll));
    ops.iter()
        .enumerate()
        .filter_map(|(i, op)| match op {
            Op::WriteBack(p) => Some((p.clone(), sync_at.is_some_and(|s| i < s))),
            _ => None,
        })
        .collect()
}

/// A cut writes back, ahead of its `syncfs`, the log of each database
/// written since the last cut began, once, and no other file; the stop's
/// cut writes back nothing.
#[test]
fn a_cut_writes_back_the_logs_written_since_the_last_cut_first() {
    let run = tempfile::tempdir().unwrap();
    let root = run.path();
    let (log, mut a) = a_log_and_one_actor(root);
    let b_dir = root.join("actors").join("b");
    let mut b = ActorDb::open(&b_dir, &limits(), OpenMode::Create)
        .unwrap()
        .unwrap();
    commit(&mut b, 1, 1);
    // Closed and opened again: its log is named by two taps.
    drop(b);
    let mut b = ActorDb::open(&b_dir, &limits(), OpenMode::Existing)
        .unwrap()
        .unwrap();
    commit(&mut b, 1, 2);
    log.barrier().unwrap();
    let cut = |log: &CommitLog, writing_back: bool| {
        RECORDING.with_borrow_mut(|r| *r = Some(Vec::new()));
        if writing_back {
            log.cut_now_writing_back().unwrap();
        } else {
            log.cut_now().unwrap();
        }
        RECORDING.with_borrow_mut(|r| written_back(&r.take().unwrap()))
    };
    assert_eq!(
        cut(&log, true),
        vec![(a.wal_path(), true), (b.wal_path(), true)],
        "both logs, each once, before the syncfs"
    );
    assert_eq!(
        cut(&log, true),
        vec![],
        "nothing written since the last cut"
    );
    commit(&mut a, 0, 2);
    log.barrier().unwrap();
    assert_eq!(
        cut(&log, true),
        vec![(a.wal_path(), true)],
        "the one log written since"
    );
    commit(&mut a, 0, 3);
    log.barrier().unwrap();
    assert_eq!(cut(&log, false), vec![], "the stop's cut");
}

/// Whether a reader of a closed actor's database (SQLite's own VFS, as an
/// inspection or an upload reads one) still holds its lock after a cut
/// wrote back that actor's log, under `rules`.
#[cfg(target_os = "linux")]
fn readers_lock_after_a_cut(rules: UnsafeRules) -> bool {
    let run = tempfile::tempdir().unwrap();
    let root = run.path();
    let (log, db) = a_log_and_one_actor(root);
    let wal = db.wal_path();
    let file = PathBuf::from(wal.to_str().unwrap().strip_suffix("-wal").unwrap());
    log.barrier().unwrap();
    drop(db);
    let reader = rusqlite::Connection::open(&file).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .unwrap();
    UNSAFE_RULES.set(rules);
    RECORDING.with_borrow_mut(|r| *r = Some(Vec::new()));
    log.cut_now_writing_back().unwrap();
    let backs = RECORDING.with_borrow_mut(|r| written_back(&r.take().unwrap()));
    UNSAFE_RULES.set(UnsafeRules::default());
    assert!(
        backs.iter().any(|(p, _)| *p == wal),
        "the cut wrote back the actor's log: {backs:?}"
    );
    let probe = std::fs::File::open(&file).unwrap();
    let locked = !crate::file_lock::tests::may_close(&probe);
    drop(reader);
    locked
}

#[test]
#[cfg(target_os = "linux")]
fn a_cut_leaves_a_readers_lock_on_a_database_in_place() {
    assert!(readers_lock_after_a_cut(UnsafeRules::default()));
}

#[test]
#[cfg(target_os = "linux")]
fn a_cut_writing_back_database_files_drops_a_readers_lock() {
    // The unsafe variant: the database file, opened and closed for its
    // write-back, took this process's POSIX locks on it along.
    assert!(!readers_lock_after_a_cut(UnsafeRules {
        write_back_database_files: true,
        ..UnsafeRules::default()
    }));
}

/// Records taken past what one write-out write holds reach the segment
/// whole, in the order taken, each once: the barrier's gathering flushes
/// a full buffer mid-way and writes a record larger than the buffer by
/// itself.
#[test]
fn a_barrier_writes_many_megabytes_of_records_in_order_each_once() {
    let run = tempfile::tempdir().unwrap();
    let root = run.path();
    // One segment holds them all: no roll, no cut removes it meanwhile.
    SEGMENT_BYTES_FOR_TESTS.set(16 * 1024 * 1024);
    let (log, recovered) = CommitLog::start(root).unwrap();
    SEGMENT_BYTES_FOR_TESTS.set(1024 * 1024);
    let file = root.join("actors").join("a").join("actor.db-wal");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, b"").unwrap();
    let tap = super::tap_for(&file).unwrap();
    // About 3 MiB in 10 KiB records, then one record larger than a
    // write-out write, then a few more.
    let mut taken: Vec<(u64, Vec<u8>)> = (0..300u64)
        .map(|i| (i * 10_240, vec![(i % 251) as u8; 10_240]))
        .collect();
    taken.push((7_000_000, vec![0xAB; 1_000_000]));
    taken.extend((0..5u64).map(|i| (8_000_000 + i, vec![i as u8 + 1; 3_000])));
    RECORDING.with_borrow_mut(|r| *r = Some(Vec::new()));
    for (offset, data) in &taken {
        tap.record(*offset as i64, data).unwrap();
    }
    log.barrier().unwrap();
    let writes = RECORDING.with_borrow_mut(|r| {
        r.take()
            .unwrap()
            .iter()
            .filter(|op| matches!(op, Op::Write { path, .. } if path.starts_with(root.join(super::DIR))))
            .count()
    });
    assert!(writes >= 4, "{writes} writes to the segment");

    let seq = recovered.next_seq;
    let bytes = std::fs::read(super::segment_path(&root.join(super::DIR), seq)).unwrap();
    let (records, _) = super::decode(&bytes, seq);
    let read: Vec<(u64, Vec<u8>)> = records
        .iter()
        .map(|r| (r.offset, r.data.to_vec()))
        .collect();
    assert_eq!(read.len(), taken.len());
    assert!(read == taken, "records out of order, lost or twice");
    let written = log.bytes_total.load(std::sync::atomic::Ordering::Relaxed);
    let taken_total = log.lock_pending().taken_total;
    assert_eq!(written, taken_total);
}

/// Fills the pending records to just short of the bound, then commits one
/// value at a time into a table until a commit fails (the write-out past
/// the bound failing the log once its records are in the segment, as a
/// failed `fdatasync` on another thread would); whether that value is
/// found after the restart, under `rules`.
fn a_failed_write_out_past_the_bound_then_a_restart(rules: UnsafeRules) -> bool {
    UNSAFE_RULES.set(rules);
    let run = tempfile::tempdir().unwrap();
    let root = run.path();
    let (log, _) = CommitLog::start(root).unwrap();
    let dir = root.join("actors").join("full");
    let mut db = ActorDb::open(&dir, &limits(), OpenMode::Create)
        .unwrap()
        .unwrap();
    // No checkpoint, whose sync would be a barrier writing everything out.
    db.conn_for_tests()
        .execute_batch("PRAGMA wal_autocheckpoint = 0; CREATE TABLE t(x)")
        .unwrap();
    let pending = || log.lock_pending().bytes;
    let mut i = 0;
    while pending() + 2_000_000 < super::PENDING_BYTES_MAX {
        db.begin().unwrap();
        db.kv_put(&format!("big{i}"), &vec![7u8; 1_900_000])
            .unwrap();
        db.commit().unwrap();
        i += 1;
    }
    while pending() + 10_000 < super::PENDING_BYTES_MAX {
        db.begin().unwrap();
        db.kv_put(&format!("small{i}"), &[7u8; 4_000]).unwrap();
        db.commit().unwrap();
        i += 1;
    }
    FAIL_AFTER_WRITE_OUT.set(true);
    let mut refused = None;
    for v in 0..20 {
        db.begin().unwrap();
        db.execute(&format!("INSERT INTO t VALUES ({v})"), &[])
            .unwrap();
        if db.commit().is_err() {
            db.rollback();
            refused = Some(v);
            break;
        }
    }
    FAIL_AFTER_WRITE_OUT.set(false);
    UNSAFE_RULES.set(UnsafeRules::default());
    let v = refused.expect("a commit past the bound failed");
    drop(db);
    drop(log);
    let (_log, _) = CommitLog::start(root).unwrap();
    let db = ActorDb::open(&dir, &limits(), OpenMode::Existing)
        .unwrap()
        .unwrap();
    let found: i64 = db
        .conn_for_tests()
        .query_row("SELECT count(*) FROM t WHERE x = ?1", [v], |r| r.get(0))
        .unwrap();
    found > 0
}

/// A record is refused only before it is taken: the records past the
/// pending bound are written out first, so a failure there leaves the
/// refused record in no segment, and its write, taken back, stays so.
#[test]
fn a_commit_refused_at_the_pending_bound_is_not_found_after_the_restart() {
    assert!(!a_failed_write_out_past_the_bound_then_a_restart(
        UnsafeRules::default()
    ));
}

#[test]
fn a_record_taken_before_a_failed_write_out_brings_its_commit_back() {
    let rules = UnsafeRules {
        take_record_before_write_out: true,
        ..UnsafeRules::default()
    };
    assert!(a_failed_write_out_past_the_bound_then_a_restart(rules));
}

/// A new actor's connection that closes before any batch took its
/// folders (the turn that created it failed before its first commit)
/// makes them durable at its close (`ActorDb::sync_untaken_creation`,
/// rule 5): the next open finds the database existing, and its commits
/// are acknowledged through the barrier alone. With the unsafe variant
/// `close_unsynced_creation`, a power cut that keeps no unsynced folder
/// entry loses the actor and its acknowledged commit.
#[test]
fn a_creation_no_batch_took_is_made_durable_at_its_close() {
    assert_eq!(a_creation_closed_unused_then_used(false), Ok(()));
    let lost = a_creation_closed_unused_then_used(true);
    assert!(lost.as_ref().is_err_and(|e| e.contains("gone")), "{lost:?}");
}

/// Creates actor 0 and closes it unused, opens it again, acknowledges one
/// commit through the barrier, then checks what a power cut right after
/// keeps of what was synced (no unsynced entry, no unsynced page).
fn a_creation_closed_unused_then_used(unsafe_variant: bool) -> Result<(), String> {
    let run = tempfile::tempdir().unwrap();
    let root = run.path().join("data");
    std::fs::create_dir_all(&root).unwrap();
    UNSAFE_RULES.set(UnsafeRules {
        close_unsynced_creation: unsafe_variant,
        ..UnsafeRules::default()
    });
    let (log, _) = CommitLog::start(&root).unwrap();
    let dir = root.join("actors").join("a0");
    RECORDING.with_borrow_mut(|r| *r = Some(Vec::new()));
    drop(ActorDb::open(&dir, &limits(), OpenMode::Create).unwrap());
    let mut db = ActorDb::open(&dir, &limits(), OpenMode::Existing)
        .unwrap()
        .expect("the database the first open made");
    assert!(db.take_new_dirs().is_empty(), "opened as an existing actor");
    commit(&mut db, 0, 1);
    make_durable(Some(&log), &root, &[&db.wal_path()], &[]).unwrap();
    note(Op::Ack { actor: 0, value: 1 });
    let ops = RECORDING.with_borrow_mut(|r| r.take()).unwrap();
    UNSAFE_RULES.set(UnsafeRules::default());
    let mut disk = Disk::default();
    for op in &ops {
        disk.step(op);
    }
    let copy = tempfile::tempdir().unwrap();
    disk.write_copy(&root, &copy.path().join("data"), &[], Kept::Nothing);
    let found = check(copy.path(), &[1, 0, 0], &[1, 0, 0]);
    ALIASES.with_borrow_mut(|a| a.clear());
    drop(db);
    found
}

/// A deleted actor's folder is gone for good before the delete returns:
/// the rename away from its name is synced in the parent folder before
/// the grave is removed (`sync::delete_folder`), so a power cut cannot
/// bring the folder back, nor replay put the actor's last commits back
/// into it. The disk model here has no folders: the test checks the sync
/// of the parent, which the unsafe variant `delete_without_folder_sync`
/// leaves out.
#[test]
fn a_deleted_actors_folder_is_synced_away_before_the_delete_returns() {
    for unsafe_variant in [false, true] {
        UNSAFE_RULES.set(UnsafeRules {
            delete_without_folder_sync: unsafe_variant,
            ..UnsafeRules::default()
        });
        let run = tempfile::tempdir().unwrap();
        let class = run.path().join("actors").join("class");
        let dir = class.join("a");
        let mut db = ActorDb::open(&dir, &limits(), OpenMode::Create)
            .unwrap()
            .unwrap();
        db.kv_put("k", b"v").unwrap();
        drop(db);
        let grave = class.join("a.deleted-1");
        RECORDING.with_borrow_mut(|r| *r = Some(Vec::new()));
        crate::sync::delete_folder(&dir, &grave).unwrap();
        let ops = RECORDING.with_borrow_mut(|r| r.take()).unwrap();
        UNSAFE_RULES.set(UnsafeRules::default());
        assert!(!dir.exists() && !grave.exists());
        let synced = ops
            .iter()
            .any(|op| matches!(op, Op::DirSync(d) if *d == class));
        assert_eq!(synced, !unsafe_variant, "unsafe variant: {unsafe_variant}");
    }
}

/// Replay finds an actor's file by inode and creation time, not by the
/// device number, which a reboot may change (device-mapper, NVMe, loop
/// devices, btrfs): a power cut that lost the actor's log pages, then a
/// start on a filesystem numbered anew, still puts the acknowledged commit
/// back. With the unsafe variant `identity_with_device`, every record is
/// skipped and the commit is lost.
#[test]
fn replay_after_a_reboot_that_renumbered_the_device_puts_commits_back() {
    assert_eq!(a_commit_replayed_on_a_renumbered_device(false), Ok(()));
    let lost = a_commit_replayed_on_a_renumbered_device(true);
    assert!(
        lost.as_ref().is_err_and(|e| e.contains("acknowledged")),
        "{lost:?}"
    );
}

fn a_commit_replayed_on_a_renumbered_device(unsafe_variant: bool) -> Result<(), String> {
    let run = tempfile::tempdir().unwrap();
    let root = run.path().join("data");
    std::fs::create_dir_all(&root).unwrap();
    let (log, _) = CommitLog::start(&root).unwrap();
    let dir = root.join("actors").join("a0");
    RECORDING.with_borrow_mut(|r| *r = Some(Vec::new()));
    let mut db = ActorDb::open(&dir, &limits(), OpenMode::Create)
        .unwrap()
        .unwrap();
    let new_dirs = db.take_new_dirs();
    let first: Vec<&PathBuf> = new_dirs.iter().collect();
    make_durable(Some(&log), &root, &[&db.wal_path()], &first).unwrap();
    commit(&mut db, 0, 1);
    make_durable(Some(&log), &root, &[&db.wal_path()], &[]).unwrap();
    note(Op::Ack { actor: 0, value: 1 });
    let ops = RECORDING.with_borrow_mut(|r| r.take()).unwrap();
    let mut disk = Disk::default();
    for op in &ops {
        disk.step(op);
    }
    // The power cut keeps nothing unsynced: the commit's frames are only
    // in the log's synced segment.
    let copy = tempfile::tempdir().unwrap();
    disk.write_copy(&root, &copy.path().join("data"), &[], Kept::Nothing);
    // The filesystem comes back under another device number.
    ALIASES.with_borrow_mut(|a| {
        for id in a.values_mut() {
            id.dev += 1;
        }
    });
    UNSAFE_RULES.set(UnsafeRules {
        identity_with_device: unsafe_variant,
        ..UnsafeRules::default()
    });
    let found = check(copy.path(), &[1, 0, 0], &[1, 0, 0]);
    UNSAFE_RULES.set(UnsafeRules::default());
    ALIASES.with_borrow_mut(|a| a.clear());
    drop(db);
    found
}

/// The actors' folder on another filesystem than the data directory (here
/// a link to a folder on `/dev/shm`) is refused: no `syncfs` the node
/// runs would cover it, and a cut would forget records of files never
/// synced.
#[test]
fn actors_on_another_filesystem_are_refused() {
    use std::os::unix::fs::MetadataExt;
    let data = tempfile::tempdir().unwrap();
    std::fs::create_dir(data.path().join("actors")).unwrap();
    assert_eq!(super::actors_on_the_data_filesystem(data.path()), Ok(()));
    let other = tempfile::tempdir_in("/dev/shm").expect("/dev/shm, a tmpfs on this machine");
    let dev = |p: &Path| std::fs::metadata(p).unwrap().dev();
    assert_ne!(
        dev(other.path()),
        dev(data.path()),
        "/dev/shm is another filesystem here"
    );
    std::fs::remove_dir(data.path().join("actors")).unwrap();
    std::os::unix::fs::symlink(other.path(), data.path().join("actors")).unwrap();
    let refused = super::actors_on_the_data_filesystem(data.path());
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("mounted apart")),
        "{refused:?}"
    );
}

/// Replay forgets the older segments first, syncs their folder, then the
/// newest: a power cut at any point of it leaves the newest segment or
/// none, never older ones without it (which the next start would replay
/// over the writes the newest's replay made durable). With the unsafe
/// variant `forget_newest_with_the_rest`, a power cut that keeps the
/// newest's removal but not the others' leaves older segments alone.
#[test]
fn replay_never_leaves_older_segments_without_the_newest() {
    assert_eq!(segments_a_power_cut_in_replay_may_leave(false), Ok(()));
    let left = segments_a_power_cut_in_replay_may_leave(true);
    assert!(
        left.as_ref()
            .is_err_and(|e| e.contains("without the newest")),
        "{left:?}"
    );
}

/// Replays three segments left by hand and checks every set of segment
/// names a power cut after each of its deletions may leave.
fn segments_a_power_cut_in_replay_may_leave(unsafe_variant: bool) -> Result<(), String> {
    let run = tempfile::tempdir().unwrap();
    let root = run.path();
    let dir = root.join(super::DIR);
    std::fs::create_dir_all(&dir).unwrap();
    for seq in 5..=7 {
        std::fs::write(super::segment_path(&dir, seq), b"").unwrap();
    }
    UNSAFE_RULES.set(UnsafeRules {
        forget_newest_with_the_rest: unsafe_variant,
        ..UnsafeRules::default()
    });
    RECORDING.with_borrow_mut(|r| *r = Some(Vec::new()));
    let recovered = recover(root);
    let ops = RECORDING.with_borrow_mut(|r| r.take()).unwrap();
    UNSAFE_RULES.set(UnsafeRules::default());
    recovered.unwrap();
    let newest = super::segment_path(&dir, 7);
    let mut disk = Disk::default();
    for seq in 5..=7 {
        disk.inode_of(&super::segment_path(&dir, seq));
    }
    for op in &ops {
        disk.step(op);
        let unsettled = disk.unsettled();
        for mask in 0..(1u32 << unsettled.len()) {
            let mut names = disk.durable_names.clone();
            for (i, p) in unsettled.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    match disk.names.get(p) {
                        Some(n) => names.insert(p.clone(), *n),
                        None => names.remove(p),
                    };
                }
            }
            let left: Vec<&PathBuf> = names
                .keys()
                .filter(|p| {
                    p.parent() == Some(dir.as_path()) && p.extension().is_some_and(|e| e == "log")
                })
                .collect();
            if !left.is_empty() && !left.contains(&&newest) {
                return Err(format!(
                    "after {}: segments {left:?} left without the newest",
                    describe(op)
                ));
            }
        }
    }
    Ok(())
}

/// A class moved away and back (two migrations of a node without a
/// bucket), then the process dies before a cut: the log's records from
/// before the first move name the database again, and replay must not put
/// that older generation of its log back over the commits made since.
/// `move_folder` cuts the log after each move; with the unsafe variant
/// `move_without_cut`, replay lays the first generation's header and
/// frames over the newer ones and the commits after the first move are
/// lost.
#[test]
fn a_class_moved_away_and_back_keeps_its_commits_through_a_replay() {
    assert_eq!(a_class_moved_away_and_back(false), Ok(3));
    // Without the cut the counter comes back as it was before the first
    // move: the commits since are lost.
    assert_eq!(a_class_moved_away_and_back(true), Ok(1));
}

/// The counter actor 0 shows after the moves, a crash and a replay.
fn a_class_moved_away_and_back(unsafe_variant: bool) -> Result<u64, String> {
    let run = tempfile::tempdir().unwrap();
    let root = run.path().join("data");
    std::fs::create_dir_all(root.join("actors")).unwrap();
    let (log, _) = CommitLog::start(&root).unwrap();
    let room = root.join("actors").join("room");
    let chat = root.join("actors").join("chat");
    let barrier = |db: &ActorDb| make_durable(Some(&log), &root, &[&db.wal_path()], &[]).unwrap();
    let mut db = ActorDb::open(&room.join("a0"), &limits(), OpenMode::Create)
        .unwrap()
        .unwrap();
    let new_dirs = db.take_new_dirs();
    let first: Vec<&PathBuf> = new_dirs.iter().collect();
    make_durable(Some(&log), &root, &[&db.wal_path()], &first).unwrap();
    // A log longer than a close keeps: the close checkpoints it.
    db.begin().unwrap();
    db.kv_put("big", &vec![7u8; 200_000]).unwrap();
    db.commit().unwrap();
    commit(&mut db, 0, 1);
    barrier(&db);
    long_log(&db);
    drop(db);
    UNSAFE_RULES.set(UnsafeRules {
        move_without_cut: unsafe_variant,
        ..UnsafeRules::default()
    });
    super::move_folder(Some(&log), &root, &room, &chat).unwrap();
    let mut db = ActorDb::open(&chat.join("a0"), &limits(), OpenMode::Existing)
        .unwrap()
        .unwrap();
    commit(&mut db, 0, 2);
    barrier(&db);
    short_log(&db);
    drop(db);
    super::move_folder(Some(&log), &root, &chat, &room).unwrap();
    UNSAFE_RULES.set(UnsafeRules::default());
    let mut db = ActorDb::open(&room.join("a0"), &limits(), OpenMode::Existing)
        .unwrap()
        .unwrap();
    commit(&mut db, 0, 3);
    barrier(&db);
    drop(db);
    // The process dies: no cut; the next start replays.
    drop(log);
    recover(&root).map_err(|e| format!("replay: {e}"))?;
    let mut db = ActorDb::open(&room.join("a0"), &limits(), OpenMode::Existing)
        .map_err(|e| format!("open: {e}"))?
        .ok_or("gone")?;
    Ok(counter(&mut db))
}
