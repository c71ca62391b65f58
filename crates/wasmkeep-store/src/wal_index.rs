//! The write-ahead log's index in private memory that gives its zero pages
//! back (ADR 0028).
//!
//! SQLite indexes an actor's write-ahead log in blocks of 32 KiB (one per
//! 4,062 frames), and zeroes a whole block when the log starts over (its
//! first frame, and the first after each checkpoint). A small actor's
//! index then holds a handful of entries in its first 4 KiB page and a few
//! hash slots in its fifth: the other six pages are zeros, resident in
//! every open actor (24 KiB each, 24 MiB over W4's 1,000 actors).
//!
//! This module registers a VFS, [`VFS_NAME`], that is SQLite's `unix` VFS
//! (files, syncs: every call goes to it) except for the index's memory,
//! the main database's lock on Linux ([`crate::file_lock`]), and the log's
//! writes, which it gathers into one per commit ([`crate::log_writes`],
//! ADR 0029), records in the node's commit log, and takes back, on its
//! own, when the failed log refused one after it reached the file
//! (`take_back`, ADR 0074). Its blocks are private anonymous memory,
//! reused from one open actor to the next ([`crate::index_blocks`], ADR
//! 0078);
//! [`WalIndex::release_zero_pages`] hands the pages that hold only zeros
//! back to the kernel (`madvise(MADV_DONTNEED)`), after which they read as
//! zeros again: what SQLite sees does not change. It runs at a
//! connection's commits from the sixteenth on, and for an actor that has
//! been idle for a second (an actor open for a batch or two returns its
//! block whole); it only scans after the log started over or grew a block
//! since the last time.
//!
//! The index is private to the connection, so the VFS's shared-memory locks
//! are no-ops. That is right only because an actor's connection is the
//! only one using its file while it is open: the VFS takes the database's
//! exclusive file lock at SQLite's first lock of it (the first read, before
//! the log is opened and its index built) and keeps it until SQLite lets go
//! of every lock, which in WAL mode is at the close. On Linux that lock is
//! one the VFS takes through the file's own open file description and
//! keeps until the close ([`crate::file_lock`], ADR 0077); elsewhere it is
//! the `unix` VFS's. Any other connection, in this process or another,
//! gets `SQLITE_BUSY` instead of a view of the log this index does not
//! describe. A connection that opens without this
//! VFS (the start-up scan, inspection of a closed actor) uses SQLite's own
//! `-shm` file, as before.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering, fence};

use rusqlite::ffi;

use crate::log_writes::LogWrites;
use crate::page_capture::Capture;
use crate::wal_format::{FRAME_HEADER_BYTES, LOG_HEADER_BYTES, frame_header};
use std::sync::Mutex;

/// The name actors' connections open their database with.
pub(crate) const VFS_NAME: &str = "wasmkeep";
const VFS_NAME_C: &CStr = c"wasmkeep";

/// Where in the index's first block the log's salt is (the WAL-index
/// header of SQLite's file format: `aSalt` at byte 32). A new salt means
/// the log started over and SQLite zeroed the block.
const HEADER_SALT_OFFSET: usize = 32;
/// Where the header keeps the number of valid frames in the log (`mxFrame`).
const HEADER_FRAMES_OFFSET: usize = 16;

/// What the VFS keeps after the `unix` VFS's own file object.
#[repr(C)]
struct Extra {
    /// The `unix` file's methods, which every call but the index's goes to.
    real: *const ffi::sqlite3_io_methods,
    /// The index, once SQLite asked for it (only the main database's file).
    shm: *mut Shm,
    /// Whether this is a main database file (not a log or a journal).
    main_db: bool,
    /// Whether this file holds the exclusive lock `x_lock` takes.
    exclusive: bool,
    /// A main database file locked through its own open file description
    /// (`crate::file_lock`, ADR 0077): its descriptor; -1 where the `unix`
    /// VFS's own locks are used.
    own_lock_fd: c_int,
    /// Whether this is a temporary file a statement spills to (a sort, a
    /// transient index, a temporary database): bounded per guest statement
    /// (`memory_budget::may_grow_temp_file`).
    temp: bool,
    /// A write-ahead log's gathered writes (null for other files).
    log: *mut LogWrites,
    /// A main database file's page capture, when the runtime tracks the
    /// actor (`ActorDb` holds it for longer than the connection lives).
    capture: *const Mutex<Capture>,
    /// A write-ahead log's main database file (whose `capture` its writes
    /// feed), if that file is ours; SQLite closes the log first.
    main_file: *mut ffi::sqlite3_file,
    /// A main database file's tap into the node's commit log (ADR 0074),
    /// when the node keeps one: every write to its log is recorded there.
    tap: *const crate::commit_log::Tap,
    /// A main database file: its log has never held a frame (the database
    /// was just created, its log file is new or a spare's empty one). Its
    /// log takes this at its open.
    new_log: bool,
    /// A log that has never held a frame: no write but its header since
    /// it was opened for a new database (see `x_sync`).
    fresh_log: bool,
    /// A log whose last write was its header (SQLite starting it over).
    header_last: bool,
    /// A main database file: its size in pages as of the last commit frame
    /// its log was given (0: not known). What `PRAGMA page_count` would say
    /// between transactions, without a statement SQLite parses at every
    /// run (it prepares every `PRAGMA page_count` again: pragmas run once).
    committed_pages: u32,
    /// A main database file: its page size, once its connection knows it
    /// (0 until then: no commit frame is read, see `commit_frame_pages`).
    page_bytes: u32,
    /// Tests only: the file's path, for the power-cut recorder.
    #[cfg(test)]
    path: Option<std::path::PathBuf>,
    /// Tests only: lock like the unix VFS (shared for readers), the unsafe
    /// variant the lock test shows losing data.
    #[cfg(test)]
    shared_lock_unsafe: bool,
}

/// One connection's WAL index: blocks SQLite reads and writes directly.
struct Shm {
    regions: Vec<*mut u8>,
    region_bytes: usize,
    /// The salt and block count when zero pages were last given back.
    released_at: Option<(u64, usize)>,
    /// Whether some page of a block was given back to the kernel (such a
    /// block is not kept for reuse, `crate::index_blocks`).
    gave_back: bool,
}

impl Drop for Shm {
    fn drop(&mut self) {
        for &r in &self.regions {
            // SAFETY: each region came from `index_blocks::take` with
            // `region_bytes` in `x_shm_map`, and SQLite is done with it.
            unsafe { crate::index_blocks::give_back(r, self.region_bytes, !self.gave_back) };
        }
    }
}

/// The `unix` VFS's file object size, rounded so `Extra` is aligned.
fn extra_offset(real_vfs: *const ffi::sqlite3_vfs) -> usize {
    // SAFETY: `real_vfs` is the registered `unix` VFS, which lives as long
    // as the process.
    let n = unsafe { (*real_vfs).szOsFile } as usize;
    n.next_multiple_of(std::mem::align_of::<Extra>())
}

fn real_vfs_of(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: our VFS's pAppData is the `unix` VFS (see `register`).
    unsafe { (*vfs).pAppData.cast() }
}

/// The `unix` VFS, set once by `register` before any file is opened.
static REAL_VFS: AtomicPtr<ffi::sqlite3_vfs> = AtomicPtr::new(ptr::null_mut());

/// # Safety
/// `f` is a file opened by `x_open` (its methods are ours).
unsafe fn extra(f: *mut ffi::sqlite3_file) -> *mut Extra {
    let real = REAL_VFS.load(Ordering::Relaxed);
    // SAFETY: the file object is `szOsFile` bytes: the unix file, then
    // `Extra` at `extra_offset`.
    unsafe { f.cast::<u8>().add(extra_offset(real)).cast() }
}

/// # Safety
/// As [`extra`].
unsafe fn real(f: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    // SAFETY: `real` was set by `x_open` from the unix VFS's open.
    unsafe { &*(*extra(f)).real }
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    f: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let real_vfs = real_vfs_of(vfs);
    #[cfg(test)]
    let path = (!name.is_null())
        .then(|| {
            // SAFETY: SQLite passes a NUL-terminated name or null.
            let s = unsafe { CStr::from_ptr(name) };
            std::path::PathBuf::from(s.to_string_lossy().into_owned())
        })
        .filter(|_| flags & (ffi::SQLITE_OPEN_MAIN_DB | ffi::SQLITE_OPEN_WAL) != 0);
    #[cfg(test)]
    if let Some(p) = &path
        && !p.exists()
    {
        crate::commit_log::tests::note(crate::commit_log::tests::Op::Create(p.clone()));
    }
    // SAFETY: SQLite gives a file object of our szOsFile bytes; the unix
    // VFS fills in its own part at the start.
    unsafe {
        let (rc, own_lock_fd) = open_real(real_vfs, name, f, flags, out_flags);
        let methods = (*f).pMethods;
        if methods.is_null() {
            // Failed before there was a file: nothing for SQLite to close.
            return rc;
        }
        let main_file = if flags & ffi::SQLITE_OPEN_WAL != 0 && !name.is_null() {
            // SQLite's own lookup of the log's database file object.
            let m = ffi::sqlite3_database_file_object(name);
            if !m.is_null() && (*m).pMethods == &raw const METHODS {
                m
            } else {
                ptr::null_mut()
            }
        } else {
            ptr::null_mut()
        };
        let log = if flags & ffi::SQLITE_OPEN_WAL != 0 {
            #[allow(unused_mut)]
            let mut log = LogWrites::default();
            #[cfg(test)]
            {
                log.unsafe_rules = tests::UNSAFE_LOG_RULES.get();
            }
            Box::into_raw(Box::new(log))
        } else {
            ptr::null_mut()
        };
        extra(f).write(Extra {
            real: methods,
            shm: ptr::null_mut(),
            main_db: flags & ffi::SQLITE_OPEN_MAIN_DB != 0,
            exclusive: false,
            own_lock_fd,
            temp: flags
                & (ffi::SQLITE_OPEN_TEMP_JOURNAL
                    | ffi::SQLITE_OPEN_TEMP_DB
                    | ffi::SQLITE_OPEN_TRANSIENT_DB)
                != 0,
            log,
            capture: ptr::null(),
            main_file,
            tap: ptr::null(),
            new_log: false,
            fresh_log: !main_file.is_null() && std::mem::take(&mut (*extra(main_file)).new_log),
            header_last: false,
            committed_pages: 0,
            page_bytes: 0,
            #[cfg(test)]
            path,
            #[cfg(test)]
            shared_lock_unsafe: false,
        });
        (*f).pMethods = &METHODS;
        rc
    }
}

/// Opens `name` with the `unix` VFS: a main database file, where this
/// system allows, as a file that VFS does not lock (`crate::file_lock`),
/// with its descriptor; otherwise as asked, with -1.
///
/// # Safety
/// As `x_open`'s call of the `unix` VFS.
unsafe fn open_real(
    real_vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    f: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> (c_int, c_int) {
    // SAFETY: the caller's.
    unsafe {
        let open = (*real_vfs).xOpen.expect("unix xOpen");
        if flags & ffi::SQLITE_OPEN_MAIN_DB == 0 {
            return (open(real_vfs, name, f, flags, out_flags), -1);
        }
        crate::file_lock::close_parked();
        if !crate::file_lock::wanted(real_vfs, name) {
            return (open(real_vfs, name, f, flags, out_flags), -1);
        }
        let rc = open(
            real_vfs,
            name,
            f,
            crate::file_lock::unlisted(flags),
            out_flags,
        );
        if rc != ffi::SQLITE_OK || (*f).pMethods.is_null() {
            return (rc, -1);
        }
        if !out_flags.is_null() {
            // What SQLite asked for, as the unix VFS would report it.
            *out_flags = (*out_flags & !ffi::SQLITE_OPEN_TEMP_DB) | ffi::SQLITE_OPEN_MAIN_DB;
        }
        (rc, crate::file_lock::descriptor(f))
    }
}

unsafe extern "C" fn x_close(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: `f` is ours (SQLite calls our methods only on our files);
    // `log` is null or came from `Box::into_raw` in `x_open`.
    unsafe {
        let e = extra(f);
        free_shm(e);
        let flushed = flush_log(f);

        if !(*e).log.is_null() {
            drop(Box::from_raw((*e).log));
            (*e).log = ptr::null_mut();
        }
        let (own_lock_fd, main_db) = ((*e).own_lock_fd, (*e).main_db);
        if own_lock_fd >= 0 && !(*e).exclusive {
            // Never locked: closing the descriptor could drop a reader's
            // POSIX locks (see `crate::file_lock`).
            crate::file_lock::park_if_locked(f, own_lock_fd);
        }
        let rc = (real(f).xClose.expect("xClose"))(f);
        if main_db {
            crate::file_lock::close_parked();
        }
        if flushed != ffi::SQLITE_OK {
            flushed
        } else {
            rc
        }
    }
}

/// Writes `data` at `offset` with the unix VFS.
///
/// # Safety
/// `f` is ours and open.
unsafe fn write_through(f: *mut ffi::sqlite3_file, data: &[u8], offset: i64) -> c_int {
    // SAFETY: `data` is valid for its length, which SQLite's writes (at
    // most a page, or the buffer's limit) keep within `c_int`; `main_file`
    // outlives its log, and its `tap` the main file (`attach_tap`).
    unsafe {
        let e = extra(f);
        let main = (*e).main_file;
        // A failed commit log refuses every record: the write is refused
        // before it reaches the file, where the frames of a commit that
        // returned an error would be found committed by SQLite's recovery
        // of the log after the restart.
        if !main.is_null()
            && let Some(tap) = (*extra(main)).tap.as_ref()
            && tap.check().is_err()
        {
            return ffi::SQLITE_IOERR_WRITE;
        }
        (*e).header_last = offset == 0 && data.len() == LOG_HEADER_BYTES;
        if !(*e).header_last {
            (*e).fresh_log = false;
        }
        let rc =
            (real(f).xWrite.expect("xWrite"))(f, data.as_ptr().cast(), data.len() as c_int, offset);
        #[cfg(test)]
        note_write(f, data, offset, rc);
        if rc == ffi::SQLITE_OK
            && !main.is_null()
            && let Some(tap) = (*extra(main)).tap.as_ref()
            && tap.record(offset, data).is_err()
        {
            // The commit must not return as if it could be made durable.
            // The log failed between the check above and the record: the
            // bytes reached the file, and SQLite's recovery of the log
            // after the restart would find this commit, which returns an
            // error, committed. They are taken back first.
            take_back(f, data, offset);
            return ffi::SQLITE_IOERR_WRITE;
        }
        rc
    }
}

/// Writes over `data`, a write to the log at `offset` that the commit log
/// refused to record after it reached the file, every bit of it flipped,
/// and syncs the file: a frame whose header or page differs from what was
/// written fails its checksum, which ends SQLite's recovery of the log
/// there, so neither a restart nor a power cut finds the refused commit.
/// (Zeros would not do: a commit's last page, written apart from its
/// frame's header, can be all zeros.) No record of it is needed: the
/// record refused was never taken, so replay never writes it back here
/// (only, maybe, an earlier write of the same transaction to the same
/// bytes, which holds no valid commit frame, ADR 0074), and a sync of the
/// log outside the barrier can make nothing durable ahead of the log's
/// records that a commit or checkpoint relies on, since every later
/// barrier of the failed log fails. A failure is logged; the node's commit
/// log has failed already, and nothing more can be done for this write.
///
/// # Safety
/// `f` is ours and open.
unsafe fn take_back(f: *mut ffi::sqlite3_file, data: &[u8], offset: i64) {
    #[cfg(test)]
    if crate::commit_log::rules().keep_refused_writes {
        return;
    }
    let len = data.len();
    let flipped: Vec<u8> = data.iter().map(|b| !b).collect();
    // SAFETY: the caller's; `flipped` is valid for `len` bytes, which fit
    // in `c_int` as the refused write's did.
    let rc = unsafe {
        let rc =
            (real(f).xWrite.expect("xWrite"))(f, flipped.as_ptr().cast(), len as c_int, offset);
        #[cfg(test)]
        note_write(f, &flipped, offset, rc);
        if rc == ffi::SQLITE_OK {
            let rc = (real(f).xSync.expect("xSync"))(f, ffi::SQLITE_SYNC_NORMAL);
            #[cfg(test)]
            note_call(f, rc, crate::commit_log::tests::Op::Sync);
            rc
        } else {
            rc
        }
    };
    if rc != ffi::SQLITE_OK {
        tracing::error!(
            offset,
            len,
            rc,
            "could not take back a write the failed commit log refused; its commit may be found after the restart"
        );
    }
}

/// Tests only: tells the power-cut recorder of a write that reached a
/// database or log file.
#[cfg(test)]
unsafe fn note_write(f: *mut ffi::sqlite3_file, data: &[u8], offset: i64, rc: c_int) {
    // SAFETY: the caller's.
    unsafe {
        note_call(f, rc, |path| crate::commit_log::tests::Op::Write {
            path,
            offset: offset as u64,
            data: data.to_vec(),
        });
    }
}

/// Tests only: tells the power-cut recorder of a call on a database or
/// log file that succeeded.
///
/// # Safety
/// `f` is ours and open.
#[cfg(test)]
unsafe fn note_call(
    f: *mut ffi::sqlite3_file,
    rc: c_int,
    op: impl FnOnce(std::path::PathBuf) -> crate::commit_log::tests::Op,
) {
    // SAFETY: the caller's.
    if let Some(path) = unsafe { &(*extra(f)).path }
        && rc == ffi::SQLITE_OK
    {
        crate::commit_log::tests::note(op(path.clone()));
    }
}

/// Hands a log's gathered writes to the file (nothing for other files).
///
/// # Safety
/// `f` is ours and open.
unsafe fn flush_log(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: `log` is null or owned by this open file; SQLite uses a file
    // from one thread at a time.
    unsafe {
        match (*extra(f)).log.as_mut() {
            Some(log) => log.flush(|d, o| write_through(f, d, o)),
            None => ffi::SQLITE_OK,
        }
    }
}

/// Unmaps the index's blocks, if any. Called when SQLite is done with them
/// (`xShmUnmap`) and when the file closes.
///
/// # Safety
/// `e` is a live file's `Extra`; SQLite no longer uses the blocks.
unsafe fn free_shm(e: *mut Extra) {
    // SAFETY: `shm` is null or came from `Box::into_raw` in `x_shm_map`.
    unsafe {
        if !(*e).shm.is_null() {
            drop(Box::from_raw((*e).shm));
            (*e).shm = ptr::null_mut();
        }
    }
}

unsafe extern "C" fn x_shm_map(
    f: *mut ffi::sqlite3_file,
    region: c_int,
    region_bytes: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: `f` is ours; `out` is valid for a write (SQLite's contract).
    unsafe {
        let e = extra(f);
        if (*e).shm.is_null() {
            (*e).shm = Box::into_raw(Box::new(Shm {
                regions: Vec::new(),
                region_bytes: region_bytes as usize,
                released_at: None,
                gave_back: false,
            }));
        }
        let shm = &mut *(*e).shm;
        debug_assert_eq!(shm.region_bytes, region_bytes as usize);
        let i = region as usize;
        if i >= shm.regions.len() {
            if extend == 0 {
                // Like a shared-memory file that is not that long yet.
                *out = ptr::null_mut();
                return ffi::SQLITE_OK;
            }
            while shm.regions.len() <= i {
                // Zeros, as a new shared-memory file reads: a kept block
                // (zeroed when kept) or a new one (ADR 0078).
                let Some(p) = crate::index_blocks::take(shm.region_bytes) else {
                    *out = ptr::null_mut();
                    return ffi::SQLITE_IOERR_SHMMAP;
                };
                shm.regions.push(p);
            }
        }
        *out = shm.regions[i].cast();
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn x_shm_lock(_: *mut ffi::sqlite3_file, _: c_int, _: c_int, _: c_int) -> c_int {
    // The index is this connection's alone (see the module's docs).
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_shm_barrier(_: *mut ffi::sqlite3_file) {
    fence(Ordering::SeqCst);
}

unsafe extern "C" fn x_shm_unmap(f: *mut ffi::sqlite3_file, _delete: c_int) -> c_int {
    // SAFETY: `f` is ours; SQLite no longer uses the index's memory.
    unsafe { free_shm(extra(f)) };
    ffi::SQLITE_OK
}

// Everything else goes to the unix VFS's file; a log's gathered writes
// (`log_writes`) go first, so every call sees the file SQLite wrote.

unsafe extern "C" fn x_read(f: *mut ffi::sqlite3_file, b: *mut c_void, n: c_int, o: i64) -> c_int {
    // SAFETY: `f` is ours; the arguments are SQLite's, passed on; `log` as
    // in `flush_log`.
    unsafe {
        if let Some(log) = (*extra(f)).log.as_mut() {
            let rc = log.flush_before_read(|d, o| write_through(f, d, o));
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        (real(f).xRead.expect("xRead"))(f, b, n, o)
    }
}
unsafe extern "C" fn x_write(
    f: *mut ffi::sqlite3_file,
    b: *const c_void,
    n: c_int,
    o: i64,
) -> c_int {
    // SAFETY: as `x_read`; `b` holds `n` bytes (SQLite's contract).
    unsafe {
        let end = (o.max(0) as u64).saturating_add(n.max(0) as u64);
        if (*extra(f)).temp && !crate::memory_budget::may_grow_temp_file(end) {
            return ffi::SQLITE_FULL;
        }
        match (*extra(f)).log.as_mut() {
            Some(log) => {
                let data = std::slice::from_raw_parts(b.cast::<u8>(), n.max(0) as usize);
                let rc = log.write(data, o, |d, o| write_through(f, d, o));
                let main = (*extra(f)).main_file;
                if rc == ffi::SQLITE_OK
                    && !main.is_null()
                    && let Some(pages) = commit_frame_pages(data, o, (*extra(main)).page_bytes)
                {
                    (*extra(main)).committed_pages = pages;
                }
                if rc == ffi::SQLITE_OK && !main.is_null() {
                    // The main file outlives its log; `capture` outlives
                    // the main file (see `WalIndex::attach_capture`).
                    if let Some(capture) = (*extra(main)).capture.as_ref() {
                        crate::page_capture::lock_raw(capture).written(data, o);
                    }
                }
                rc
            }
            None => {
                let rc = (real(f).xWrite.expect("xWrite"))(f, b, n, o);
                #[cfg(test)]
                note_write(
                    f,
                    std::slice::from_raw_parts(b.cast::<u8>(), n.max(0) as usize),
                    o,
                    rc,
                );
                rc
            }
        }
    }
}
/// The database's size in pages a write to its log gives, if the write is
/// the header of a commit frame of a database of `page_bytes` pages (0:
/// not known, nothing is taken): a frame header ([`frame_header`]) with a
/// size, written at a frame's start (past the log's header, at a multiple
/// of a frame header and a page). (A commit padded to a sector boundary, with
/// `synchronous = FULL` where the file does not promise power-safe
/// overwrites, may be written in pieces, one of them 24 bytes of a page.)
fn commit_frame_pages(data: &[u8], offset: i64, page_bytes: u32) -> Option<u32> {
    let (header, frame) = (LOG_HEADER_BYTES as i64, FRAME_HEADER_BYTES as i64);
    if page_bytes == 0
        || offset < header
        || (offset - header) % (frame + i64::from(page_bytes)) != 0
    {
        return None;
    }
    let (_, pages) = frame_header(data)?;
    (pages != 0).then_some(pages)
}

/// Sends a log's gathered writes, then makes the call (or returns the
/// send's error).
///
/// # Safety
/// As [`flush_log`].
unsafe fn after_flush(f: *mut ffi::sqlite3_file, call: impl FnOnce() -> c_int) -> c_int {
    // SAFETY: the caller's.
    match unsafe { flush_log(f) } {
        ffi::SQLITE_OK => call(),
        rc => rc,
    }
}
unsafe extern "C" fn x_truncate(f: *mut ffi::sqlite3_file, n: i64) -> c_int {
    // SAFETY: as `x_read`.
    unsafe {
        after_flush(f, || {
            (*extra(f)).fresh_log = false;
            (*extra(f)).header_last = false;
            let rc = (real(f).xTruncate.expect("xTruncate"))(f, n);
            #[cfg(test)]
            note_call(f, rc, |path| crate::commit_log::tests::Op::Truncate {
                path,
                len: n as u64,
            });
            rc
        })
    }
}
unsafe extern "C" fn x_sync(f: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: as `x_read`.
    unsafe {
        after_flush(f, || {
            // SQLite syncs a log after writing its header when the log
            // starts over, so that the new header is on the disk before
            // any frame of the new generation: frames landing over an older
            // generation's under the old header would cut that generation
            // short, and recovery would lay a prefix of it, older pages,
            // over a database that holds its newest. A log that never held
            // a frame (a new actor's) has no older generation: its header
            // goes to the commit log (or the disk) with the first batch,
            // like the frames after it. Since new databases are written
            // from an image (ADR 0075), that sync would be a barrier inside
            // every new actor's first commit (SQLite made it with its syncs
            // off while it created the file).
            let header_last = std::mem::take(&mut (*extra(f)).header_last);
            let skip = header_last && (*extra(f)).fresh_log;
            #[cfg(test)]
            let skip = skip || (header_last && crate::commit_log::rules().skip_every_header_sync);
            if skip {
                return ffi::SQLITE_OK;
            }
            // SQLite syncs a log before each checkpoint copies it into the
            // database. A recorded log's sync is the commit log's barrier
            // instead: once its records are durable, replay puts the log
            // back as it is now, and the segments holding them stay until
            // a cut has synced the log's file (ADR 0074). A checkpoint
            // never carries the database past what replay can put back,
            // and a close's checkpoint costs a barrier (shared with any
            // other waiting) and the database's fsync, not a barrier and
            // two fsyncs.
            // `main_file` outlives its log, its `tap` the main file.
            let main = (*extra(f)).main_file;
            if !(*extra(f)).log.is_null()
                && !main.is_null()
                && let Some(tap) = (*extra(main)).tap.as_ref()
            {
                #[cfg(test)]
                if crate::commit_log::rules().sync_log_before_records {
                    let rc = (real(f).xSync.expect("xSync"))(f, flags);
                    note_call(f, rc, crate::commit_log::tests::Op::Sync);
                    return rc;
                }
                return match tap.barrier() {
                    Ok(()) => ffi::SQLITE_OK,
                    Err(_) => ffi::SQLITE_IOERR_FSYNC,
                };
            }
            let rc = (real(f).xSync.expect("xSync"))(f, flags);
            #[cfg(test)]
            note_call(f, rc, crate::commit_log::tests::Op::Sync);
            rc
        })
    }
}
unsafe extern "C" fn x_file_size(f: *mut ffi::sqlite3_file, out: *mut i64) -> c_int {
    // SAFETY: as `x_read`.
    unsafe { after_flush(f, || (real(f).xFileSize.expect("xFileSize"))(f, out)) }
}
// The main database is locked exclusively whenever SQLite locks it at all:
// from before the log is first read (and its index built) until SQLite lets
// go of every lock, no other connection reads or writes it, which is what
// makes a private index right. SQLite believes it holds the lesser lock it
// asked for and upgrades later at no cost. On Linux the lock is this VFS's
// own (`crate::file_lock`), kept from the first lock to the close; else
// the unix VFS's, kept until SQLite lets go of every lock.

unsafe extern "C" fn x_lock(f: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: `f` is ours; the unix VFS's lock calls are made in the order
    // it allows (shared, then exclusive; from shared it goes straight to
    // exclusive, so a stream of readers elsewhere can hold an opening off
    // until the busy timeout, as SQLite's own exclusive mode could).
    unsafe {
        let e = extra(f);
        let lock = real(f).xLock.expect("xLock");
        if (*e).own_lock_fd >= 0 {
            // Locked through its own open file description: from the first
            // lock to the close (`crate::file_lock`).
            #[cfg(test)]
            if (*e).shared_lock_unsafe {
                return crate::file_lock::try_lock((*e).own_lock_fd, true);
            }
            if !(*e).exclusive {
                let rc = crate::file_lock::try_lock((*e).own_lock_fd, false);
                if rc != ffi::SQLITE_OK {
                    return rc;
                }
                (*e).exclusive = true;
            }
            return ffi::SQLITE_OK;
        }
        #[cfg(test)]
        if (*e).shared_lock_unsafe {
            return lock(f, level);
        }
        if !(*e).main_db || (*e).exclusive {
            return lock(f, level);
        }
        let rc = lock(f, ffi::SQLITE_LOCK_SHARED);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        let rc = lock(f, ffi::SQLITE_LOCK_EXCLUSIVE);
        if rc != ffi::SQLITE_OK {
            // Someone else reads it: hold nothing, and let SQLite's busy
            // handler try again.
            (real(f).xUnlock.expect("xUnlock"))(f, ffi::SQLITE_LOCK_NONE);
            return rc;
        }
        (*e).exclusive = true;
        ffi::SQLITE_OK
    }
}
unsafe extern "C" fn x_unlock(f: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: as `x_lock`.
    unsafe {
        let e = extra(f);
        if (*e).own_lock_fd >= 0 {
            // Kept until the close releases it.
            return ffi::SQLITE_OK;
        }
        if (*e).main_db && (*e).exclusive {
            if level > ffi::SQLITE_LOCK_NONE {
                // Keep the exclusive lock until SQLite lets go of all.
                return ffi::SQLITE_OK;
            }
            (*e).exclusive = false;
        }
        (real(f).xUnlock.expect("xUnlock"))(f, level)
    }
}
unsafe extern "C" fn x_check_reserved_lock(f: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    // SAFETY: as `x_lock`; `out` is valid for a write.
    unsafe {
        if (*extra(f)).exclusive {
            // SQLite asks whether another connection is writing (say, to
            // decide whether a rollback journal is hot). None can be: this
            // one holds the exclusive lock, which the unix VFS would report
            // as "reserved".
            *out = 0;
            return ffi::SQLITE_OK;
        }
        (real(f).xCheckReservedLock.expect("xCheckReservedLock"))(f, out)
    }
}
unsafe extern "C" fn x_file_control(
    f: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: as `x_read`.
    unsafe {
        after_flush(f, || {
            (real(f).xFileControl.expect("xFileControl"))(f, op, arg)
        })
    }
}
unsafe extern "C" fn x_sector_size(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as `x_read`.
    unsafe { (real(f).xSectorSize.expect("xSectorSize"))(f) }
}
unsafe extern "C" fn x_device_characteristics(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as `x_read`.
    unsafe {
        (real(f)
            .xDeviceCharacteristics
            .expect("xDeviceCharacteristics"))(f)
    }
}
unsafe extern "C" fn x_fetch(
    f: *mut ffi::sqlite3_file,
    o: i64,
    n: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: as `x_read`; a unix file without memory-mapped reads says
    // "no mapping", which SQLite handles by reading.
    unsafe {
        let r = real(f);
        match r.xFetch {
            Some(x) if r.iVersion >= 3 => x(f, o, n, out),
            _ => {
                *out = ptr::null_mut();
                ffi::SQLITE_OK
            }
        }
    }
}
unsafe extern "C" fn x_unfetch(f: *mut ffi::sqlite3_file, o: i64, p: *mut c_void) -> c_int {
    // SAFETY: as `x_fetch`.
    unsafe {
        let r = real(f);
        match r.xUnfetch {
            Some(x) if r.iVersion >= 3 => x(f, o, p),
            _ => ffi::SQLITE_OK,
        }
    }
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: Some(x_fetch),
    xUnfetch: Some(x_unfetch),
};

/// Registers the VFS (not as the default). Called once, from
/// `sqlite_setup`. Returns false, with SQLite's own VFS left in use, if
/// there is no `unix` VFS to build on.
pub(crate) fn register() -> bool {
    // SAFETY: looks up a VFS by name; SQLite returns null if none.
    let real = unsafe { ffi::sqlite3_vfs_find(c"unix".as_ptr()) };
    if real.is_null() {
        return false;
    }
    REAL_VFS.store(real, Ordering::Relaxed);
    // SAFETY: `real` is a complete VFS object that lives as long as the
    // process; ours is a copy with its own name, file size and open, and is
    // leaked because SQLite keeps a pointer to it.
    unsafe {
        let mut vfs: ffi::sqlite3_vfs = ptr::read(real);
        vfs.zName = VFS_NAME_C.as_ptr();
        vfs.szOsFile = (extra_offset(real) + std::mem::size_of::<Extra>()) as c_int;
        vfs.pAppData = real.cast();
        vfs.pNext = ptr::null_mut();
        vfs.xOpen = Some(x_open);
        let vfs = Box::leak(Box::new(vfs));
        ffi::sqlite3_vfs_register(vfs, 0) == ffi::SQLITE_OK
    }
}

/// Makes SQLite open the write-ahead log (and ask this VFS for its index)
/// now: a read does, once the database is in WAL mode. Call before
/// `locking_mode=EXCLUSIVE`, with which SQLite would keep the index in its
/// heap instead.
pub(crate) fn open_log(c: &rusqlite::Connection) -> rusqlite::Result<()> {
    c.query_row("PRAGMA schema_version", [], |_| Ok(()))
}

/// One open connection's WAL index, as this VFS keeps it.
pub(crate) struct WalIndex {
    extra: *mut Extra,
}

// SAFETY: the pointer is into the connection's own file object, and is used
// only through the `ActorDb` that owns that connection (which moves between
// threads, one at a time).
unsafe impl Send for WalIndex {}

impl WalIndex {
    /// The index of `conn`'s main database, if it was opened with this VFS.
    /// The handle is valid only while `conn` is open: `ActorDb` keeps the
    /// two together and drops the connection first.
    pub(crate) fn of(conn: &rusqlite::Connection) -> Option<WalIndex> {
        let mut file: *mut ffi::sqlite3_file = ptr::null_mut();
        // SAFETY: SQLITE_FCNTL_FILE_POINTER writes the main database's
        // file object (which lives as long as the connection) to `file`.
        let rc = unsafe {
            ffi::sqlite3_file_control(
                conn.handle(),
                c"main".as_ptr(),
                ffi::SQLITE_FCNTL_FILE_POINTER,
                (&raw mut file).cast(),
            )
        };
        // SAFETY: a non-null file object has a valid pMethods field.
        if rc != ffi::SQLITE_OK
            || file.is_null()
            || unsafe { (*file).pMethods } != &raw const METHODS
        {
            return None;
        }
        // SAFETY: the file's methods are ours, so it has our layout.
        Some(WalIndex {
            extra: unsafe { extra(file) },
        })
    }

    /// Makes the writes to this database's log feed `capture` (before the
    /// log is opened). The caller keeps `capture` alive for longer than the
    /// connection: `ActorDb` holds it and drops the connection first.
    pub(crate) fn attach_capture(&self, capture: &crate::page_capture::Shared) {
        // SAFETY: `extra` is valid while the connection is open (see `of`);
        // only the connection's thread touches it.
        unsafe { (*self.extra).capture = std::sync::Arc::as_ptr(capture) };
    }

    /// Makes every write to this database's log recorded by `tap` (before
    /// the log is opened). The caller keeps `tap` alive for longer than the
    /// connection, as it does the capture.
    pub(crate) fn attach_tap(&self, tap: &std::sync::Arc<crate::commit_log::Tap>) {
        // SAFETY: as `attach_capture`.
        unsafe { (*self.extra).tap = std::sync::Arc::as_ptr(tap) };
    }

    /// The database's size in pages as of the last commit its log was given
    /// through this connection, or as last set; `None` if not known.
    pub(crate) fn committed_pages(&self) -> Option<u32> {
        // SAFETY: as `attach_capture`.
        let pages = unsafe { (*self.extra).committed_pages };
        (pages != 0).then_some(pages)
    }

    /// Tells the VFS the database's page size, which places its log's
    /// frames (it does not change while the log is in use).
    pub(crate) fn set_page_bytes(&self, page_bytes: u32) {
        // SAFETY: as `attach_capture`.
        unsafe { (*self.extra).page_bytes = page_bytes };
    }

    /// Sets what [`Self::committed_pages`] answers (`0`: not known), for a
    /// size read through SQLite, or forgotten after a statement failed (it
    /// may have written a commit frame SQLite did not commit).
    pub(crate) fn set_committed_pages(&self, pages: u32) {
        // SAFETY: as `attach_capture`.
        unsafe { (*self.extra).committed_pages = pages };
    }

    /// Says that this database's log has never held a frame (it was just
    /// created), before the log is opened: the sync SQLite makes after its
    /// first header is skipped (see `x_sync`).
    pub(crate) fn mark_log_new(&self) {
        // SAFETY: as `attach_capture`.
        unsafe { (*self.extra).new_log = true };
    }

    /// The index's blocks, once SQLite asked for them.
    fn shm(&self) -> *mut Shm {
        // SAFETY: `extra` is valid while the connection is open (see
        // `of`); the index is touched only by whoever holds the connection
        // (its `ActorDb`, which the runtime reaches only under the actor's
        // slot lock), between its statements.
        unsafe { (*self.extra).shm }
    }

    /// Gives back the index's pages that hold only zeros, if the log
    /// started over or grew a block since the last time. Call between
    /// transactions, by whoever holds the connection. Returns the bytes
    /// given back.
    pub(crate) fn release_zero_pages(&self) -> usize {
        self.release(false)
    }

    fn release(&self, unsafe_any_page: bool) -> usize {
        // SAFETY: see `shm`; no other reference to the index exists while
        // this one does.
        let Some(shm) = (unsafe { self.shm().as_mut() }) else {
            return 0;
        };
        let Some(&first) = shm.regions.first() else {
            return 0;
        };
        // SAFETY: the header is in the first block, which is mapped.
        let (frames, salt) = unsafe {
            (
                ptr::read_volatile(first.add(HEADER_FRAMES_OFFSET).cast::<u32>()),
                ptr::read_volatile(first.add(HEADER_SALT_OFFSET).cast::<u64>()),
            )
        };
        if frames == 0 {
            // No frame yet: SQLite zeroes the block at the first one, and
            // until then only the header was written.
            return 0;
        }
        let mark = (salt, shm.regions.len());
        if shm.released_at == Some(mark) {
            return 0;
        }
        shm.released_at = Some(mark);
        let page = os_page_bytes();
        let mut released = 0;
        for &r in &shm.regions {
            // Runs of pages to give back, one call each.
            let mut run: Option<usize> = None;
            let mut off = page; // the block's first page holds the header or entries
            while off <= shm.region_bytes {
                let goes = off < shm.region_bytes && {
                    // SAFETY: [r + off, + page) is inside the mapped block.
                    let bytes = unsafe { std::slice::from_raw_parts(r.add(off), page) };
                    unsafe_any_page || bytes.iter().all(|&b| b == 0)
                };
                match (goes, run) {
                    (true, None) => run = Some(off),
                    (false, Some(from)) => {
                        // SAFETY: whole pages of our private mapping; after
                        // this they read as zeros, which they held.
                        let rc = unsafe {
                            libc::madvise(r.add(from).cast(), off - from, libc::MADV_DONTNEED)
                        };
                        if rc == 0 {
                            released += off - from;
                            shm.gave_back = true;
                        }
                        run = None;
                    }
                    _ => {}
                }
                off += page;
            }
        }
        released
    }

    /// The unsafe variant, kept for the test that shows why only zero
    /// pages may go: gives back every page but each block's first, whatever
    /// it holds.
    #[cfg(test)]
    fn release_any_pages_unsafe(&self) -> usize {
        self.release(true)
    }

    /// The unsafe variant of the lock, for the test that shows why the
    /// database is locked exclusively from the first read: call before it.
    #[cfg(test)]
    fn lock_shared_unsafe(&self) {
        // SAFETY: as `shm`.
        unsafe { (*self.extra).shared_lock_unsafe = true }
    }

    /// How many bytes of the index are resident now (`mincore`).
    pub(crate) fn resident_bytes(&self) -> u64 {
        // SAFETY: as in `release`.
        let Some(shm) = (unsafe { self.shm().as_ref() }) else {
            return 0;
        };
        let page = os_page_bytes();
        let mut vec = vec![0u8; shm.region_bytes.div_ceil(page)];
        let mut total = 0;
        for &r in &shm.regions {
            // SAFETY: `r` is a page-aligned mapping of `region_bytes`;
            // `vec` has a byte per page.
            if unsafe { libc::mincore(r.cast(), shm.region_bytes, vec.as_mut_ptr()) } == 0 {
                total += vec.iter().filter(|&&b| b & 1 == 1).count() as u64 * page as u64;
            }
        }
        total
    }
}

/// The host's memory page size (4096 if the system does not say).
pub fn os_page_bytes() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as usize } else { 4096 }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rusqlite::{Connection, OpenFlags, params};

    use super::*;

    #[test]
    fn only_a_commit_frames_header_at_a_frames_start_gives_the_size() {
        let mut header = [0u8; 24];
        header[4..8].copy_from_slice(&7u32.to_be_bytes());
        let frame = 4096 + 24;
        assert_eq!(commit_frame_pages(&header, 32, 4096), Some(7));
        assert_eq!(commit_frame_pages(&header, 32 + 2 * frame, 4096), Some(7));
        // 24 bytes of a page, written in pieces (a commit padded to a sector).
        assert_eq!(commit_frame_pages(&header, 32 + 24 + 1000, 4096), None);
        assert_eq!(commit_frame_pages(&header, 32 + frame, 8192), None);
        assert_eq!(
            commit_frame_pages(&header, 32, 0),
            None,
            "page size unknown"
        );
        assert_eq!(
            commit_frame_pages(&header, 8, 4096),
            None,
            "the log's header"
        );
        assert_eq!(commit_frame_pages(&header[..23], 32, 4096), None);
        header[4..8].fill(0);
        assert_eq!(commit_frame_pages(&header, 32, 4096), None, "not a commit");
    }
    use crate::log_writes::UnsafeRules;
    use crate::sqlite_setup::sqlite_setup;

    thread_local! {
        /// The log-write rules a test breaks for the files this thread
        /// opens next (`x_open` reads it).
        pub(crate) static UNSAFE_LOG_RULES: std::cell::Cell<UnsafeRules> =
            std::cell::Cell::new(UnsafeRules::default());
    }

    /// A connection set up as an actor's is (WAL, then exclusive mode).
    fn open(
        path: &std::path::Path,
        before_first_read: impl FnOnce(&WalIndex),
    ) -> (Connection, WalIndex) {
        sqlite_setup();
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
        let c = Connection::open_with_flags_and_vfs(path, flags, VFS_NAME).unwrap();
        let w = WalIndex::of(&c).expect("opened with the VFS");
        before_first_read(&w);
        c.busy_timeout(std::time::Duration::ZERO).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        open_log(&c).unwrap();
        c.pragma_update(None, "locking_mode", "EXCLUSIVE").unwrap();
        c.pragma_update(None, "synchronous", "OFF").unwrap();
        (c, w)
    }

    /// SQLite's check of the whole database: `Err` with what it found.
    fn integrity(c: &Connection) -> Result<(), String> {
        let ok: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(|e| e.to_string())?;
        if ok != "ok" {
            return Err(ok);
        }
        Ok(())
    }

    /// Rows of 1,000 bytes, rewritten in rounds: enough pages that the
    /// index's hash slots spread over all of its hash pages. After every
    /// commit `release` runs; every read must see what was written.
    fn rounds(release: fn(&WalIndex) -> usize) -> Result<(), String> {
        let dir = tempfile::tempdir().unwrap();
        let (c, w) = open(&dir.path().join("a.db"), |_| ());
        c.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
            .unwrap();
        let mut expect = BTreeMap::new();
        let mut released = 0;
        for round in 0..40u32 {
            c.execute_batch("BEGIN").unwrap();
            for k in 0..200u32 {
                if (k + round) % 3 == 0 {
                    let v = vec![(k ^ round) as u8; 1000];
                    c.execute(
                        "INSERT OR REPLACE INTO t (k, v) VALUES (?1, ?2)",
                        params![k, v],
                    )
                    .map_err(|e| e.to_string())?;
                    expect.insert(k, v);
                }
            }
            c.execute_batch("COMMIT").map_err(|e| e.to_string())?;
            released += release(&w);
            if round % 10 == 9 {
                // Start the log over: the next commit zeroes the block again.
                c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                    .map_err(|e| e.to_string())?;
            }
            // Reads go through the index only for pages not cached.
            c.execute_batch("PRAGMA shrink_memory").unwrap();
            let mut s = c.prepare_cached("SELECT k, v FROM t ORDER BY k").unwrap();
            let got: BTreeMap<u32, Vec<u8>> = s
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .and_then(|rows| rows.collect())
                .map_err(|e| e.to_string())?;
            if got != expect {
                return Err(format!("round {round}: the table is not what was written"));
            }
        }
        assert!(released > 0, "no page was given back");
        integrity(&c)
    }

    #[test]
    fn giving_back_only_zero_pages_changes_nothing_sqlite_reads() {
        rounds(WalIndex::release_zero_pages).unwrap();
    }

    #[test]
    fn giving_back_pages_that_hold_entries_loses_writes() {
        // The unsafe variant: without the "only zeros" rule, the index
        // forgets frames and reads go to stale pages.
        // (SQLite then reads a stale first page: "no such table: t".)
        assert!(rounds(WalIndex::release_any_pages_unsafe).is_err());
    }

    #[test]
    fn a_small_database_keeps_two_of_its_index_pages() {
        let dir = tempfile::tempdir().unwrap();
        let (c, w) = open(&dir.path().join("a.db"), |_| ());
        c.execute_batch("CREATE TABLE t (n INTEGER); INSERT INTO t VALUES (1);")
            .unwrap();
        // SQLite zeroed the whole 32 KiB block at the log's first frame.
        assert_eq!(w.resident_bytes(), 32 * 1024);
        assert!(w.release_zero_pages() >= 24 * 1024);
        for i in 0..20 {
            c.execute("UPDATE t SET n = ?1", [i]).unwrap();
            w.release_zero_pages();
        }
        // The header with the frames' page numbers, and the hash page
        // holding the slots of pages 1 and 2.
        assert_eq!(w.resident_bytes(), 2 * 4096);
        let n: i64 = c.query_row("SELECT n FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 19);
    }

    /// Actor `a` writes five commits and closes without a checkpoint, as an
    /// actor does (ADR 0076: its index's header then counts frames not yet
    /// in the database), and its index's block is kept for reuse; then
    /// actor `b`, a new database, opens and writes a row. Returns what `b`
    /// reads back.
    fn second_database_after_the_first_closed(keep_contents: bool) -> Result<Vec<i64>, String> {
        let dir = tempfile::tempdir().unwrap();
        crate::index_blocks::tests::KEEP_CONTENTS_UNSAFE.set(keep_contents);
        {
            let (c, _) = open(&dir.path().join("a.db"), |_| ());
            c.set_db_config(
                rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
                true,
            )
            .unwrap();
            c.execute_batch("CREATE TABLE t (n INTEGER)").unwrap();
            for n in 1..=5 {
                c.execute("INSERT INTO t VALUES (?1)", [n]).unwrap();
            }
        }
        crate::index_blocks::tests::KEEP_CONTENTS_UNSAFE.set(false);
        assert!(crate::index_blocks::kept() >= 1, "a's block was not kept");
        let e = |e: rusqlite::Error| e.to_string();
        sqlite_setup();
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
        let c = Connection::open_with_flags_and_vfs(dir.path().join("b.db"), flags, VFS_NAME)
            .map_err(e)?;
        c.pragma_update(None, "journal_mode", "WAL").map_err(e)?;
        open_log(&c).map_err(e)?;
        c.execute_batch("CREATE TABLE u (n INTEGER); INSERT INTO u VALUES (100);")
            .map_err(e)?;
        let mut s = c.prepare("SELECT n FROM u").map_err(e)?;
        let rows = s.query_map([], |r| r.get(0)).map_err(e)?;
        rows.collect::<Result<Vec<i64>, _>>().map_err(e)
    }

    #[test]
    fn a_reused_block_serves_a_new_index() {
        assert_eq!(second_database_after_the_first_closed(false), Ok(vec![100]));
    }

    #[test]
    fn a_reused_block_that_was_not_zeroed_serves_another_actors_index() {
        // The unsafe variant: the block keeps `a`'s header, whose checksum
        // holds, and SQLite reads `b`'s log at `a`'s frames.
        let got = second_database_after_the_first_closed(true);
        assert_ne!(got, Ok(vec![100]), "b read its own row through a's index");
    }

    /// Another connection (SQLite's own VFS, its own `-shm` index) writes
    /// between this one's first read and its first write.
    fn foreign_write_after_first_read(unsafe_lock: bool) -> Result<i64, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        {
            let (c, _) = open(&path, |_| ());
            c.execute_batch("CREATE TABLE t (n INTEGER); INSERT INTO t VALUES (1);")
                .unwrap();
        }
        let (c, _w) = open(&path, |w| {
            if unsafe_lock {
                w.lock_shared_unsafe()
            }
        });
        let n: i64 = c.query_row("SELECT n FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
        {
            let other = Connection::open(&path).map_err(|e| e.to_string())?;
            other.busy_timeout(std::time::Duration::ZERO).unwrap();
            other
                .execute("UPDATE t SET n = n + 10", [])
                .map_err(|e| e.to_string())?;
        }
        c.execute("UPDATE t SET n = n + 100", []).unwrap();
        drop(c);
        let check = Connection::open(&path).unwrap();
        Ok(check
            .query_row("SELECT n FROM t", [], |r| r.get(0))
            .unwrap())
    }

    #[test]
    fn no_other_connection_reaches_the_database_after_the_first_read() {
        let e = foreign_write_after_first_read(false).unwrap_err();
        assert!(e.contains("locked"), "{e}");
    }

    #[test]
    fn with_a_shared_lock_another_connections_write_is_lost() {
        // The unsafe variant: the other connection's write lands in the log
        // where this connection's private index does not see it, and its
        // own write goes over it.
        assert_eq!(foreign_write_after_first_read(true).unwrap(), 101);
    }

    /// A reader of this process (SQLite's own VFS, a read transaction
    /// open) holds the file while an actor's connection gives up its first
    /// read and closes; then another actor's connection tries to write.
    /// Returns that write's outcome, and how many descriptors were parked
    /// after the first close and once the reader let go and another
    /// actor's connection locked the file (process-wide counts: no other
    /// test parks one).
    #[cfg(target_os = "linux")]
    fn write_after_an_open_gave_up(close_at_once: bool) -> (Result<usize, String>, usize, usize) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        {
            let (c, _) = open(&path, |_| ());
            c.execute_batch("CREATE TABLE t (n INTEGER); INSERT INTO t VALUES (1);")
                .unwrap();
        }
        assert!(
            crate::file_lock::tests::in_use(),
            "open file description locks are not in use here"
        );
        // Kept open to the end: its close would drop the reader's lock.
        let probe = std::fs::File::open(&path).unwrap();
        let reader = Connection::open(&path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let n: i64 = reader
            .query_row("SELECT n FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
        assert!(
            close_at_once || !crate::file_lock::tests::may_close(&probe),
            "a descriptor may close under a reader's POSIX lock"
        );
        crate::file_lock::tests::CLOSE_AT_ONCE_UNSAFE.set(close_at_once);
        {
            let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
            let c = Connection::open_with_flags_and_vfs(&path, flags, VFS_NAME).unwrap();
            c.busy_timeout(std::time::Duration::ZERO).unwrap();
            let e = c
                .pragma_update(None, "journal_mode", "WAL")
                .expect_err("the reader holds the file");
            assert!(e.to_string().contains("locked"), "{e}");
        }
        crate::file_lock::tests::CLOSE_AT_ONCE_UNSAFE.set(false);
        let parked = crate::file_lock::tests::parked();
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE;
        let other = Connection::open_with_flags_and_vfs(&path, flags, VFS_NAME).unwrap();
        other.busy_timeout(std::time::Duration::ZERO).unwrap();
        let wrote = other
            .execute("UPDATE t SET n = 2", [])
            .map_err(|e| e.to_string());
        drop(other);
        // An actor's connection opened before the reader lets go (its
        // open keeps what is parked) and locking the file after: what is
        // parked may close under that lock, which no POSIX lock can share.
        let holder = Connection::open_with_flags_and_vfs(&path, flags, VFS_NAME).unwrap();
        reader.execute_batch("COMMIT").unwrap();
        drop(reader);
        holder.query_row("SELECT n FROM t", [], |_| Ok(())).unwrap();
        assert!(
            crate::file_lock::tests::may_close(&probe),
            "a descriptor may not close under an actor connection's own lock"
        );
        crate::file_lock::close_parked();
        let left = crate::file_lock::tests::parked();
        drop(holder);
        drop(probe);
        (wrote, parked, left)
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn an_open_that_gave_up_keeps_the_readers_lock() {
        let (wrote, parked, left) = write_after_an_open_gave_up(false);
        let e = wrote.expect_err("the reader still held the file");
        assert!(e.contains("locked"), "{e}");
        assert!(parked >= 1, "the descriptor was not kept");
        assert_eq!(left, 0, "a descriptor stayed under the actor's own lock");
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn an_open_that_gave_up_and_closed_at_once_drops_the_readers_lock() {
        // The unsafe variant: closing the descriptor dropped the reader's
        // POSIX lock, and another connection wrote under its transaction.
        assert_eq!(write_after_an_open_gave_up(true).0, Ok(1));
    }

    /// Commits a row, copies the database and its log while the connection
    /// is still open (what a crash of the process leaves), and counts the
    /// rows the copy holds.
    fn rows_in_a_copy_after_commit(rules: UnsafeRules) -> Result<i64, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        UNSAFE_LOG_RULES.set(rules);
        let (c, _w) = open(&path, |_| ());
        UNSAFE_LOG_RULES.set(UnsafeRules::default());
        c.execute_batch("BEGIN; CREATE TABLE t (n INTEGER); INSERT INTO t VALUES (1); COMMIT;")
            .unwrap();
        let copy = dir.path().join("copy");
        std::fs::create_dir(&copy).unwrap();
        for name in ["a.db", "a.db-wal"] {
            std::fs::copy(dir.path().join(name), copy.join(name)).unwrap();
        }
        let check = Connection::open(copy.join("a.db")).unwrap();
        check
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_commit_is_in_the_log_file_when_commit_returns() {
        assert_eq!(rows_in_a_copy_after_commit(UnsafeRules::default()), Ok(1));
    }

    #[test]
    fn a_commit_held_in_the_buffer_is_lost_in_a_crash() {
        // The unsafe variant: the commit's frames wait for the next call
        // on the log, and a crash before it loses an acknowledged commit.
        let e = rows_in_a_copy_after_commit(UnsafeRules {
            hold_commits: true,
            ..UnsafeRules::default()
        })
        .unwrap_err();
        assert!(e.contains("no such table"), "{e}");
    }

    /// One transaction larger than SQLite's page cache (its pages spill to
    /// the log before the commit and are read back from there), then every
    /// row read and the database checked.
    fn a_transaction_that_spills(rules: UnsafeRules) -> Result<(), String> {
        let dir = tempfile::tempdir().unwrap();
        UNSAFE_LOG_RULES.set(rules);
        let (c, _w) = open(&dir.path().join("a.db"), |_| ());
        UNSAFE_LOG_RULES.set(UnsafeRules::default());
        c.pragma_update(None, "cache_size", 8).unwrap();
        let run = || -> rusqlite::Result<()> {
            c.execute_batch("BEGIN; CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL);")?;
            for k in 0..600i64 {
                c.execute(
                    "INSERT INTO t VALUES (?1, ?2)",
                    params![k, vec![k as u8; 900]],
                )?;
            }
            let sum: i64 = c.query_row("SELECT sum(length(v) + k) FROM t", [], |r| r.get(0))?;
            assert_eq!(
                sum,
                600 * 900 + 599 * 600 / 2,
                "read inside the transaction"
            );
            c.execute_batch("COMMIT")
        };
        run().map_err(|e| e.to_string())?;
        integrity(&c)
    }

    #[test]
    fn frames_spilled_before_a_commit_are_read_back_as_written() {
        a_transaction_that_spills(UnsafeRules::default()).unwrap();
    }

    #[test]
    fn reading_past_the_gathered_writes_corrupts_the_transaction() {
        // The unsafe variant: SQLite reads a spilled page from the file
        // while its frame is still in the buffer.
        let result = std::panic::catch_unwind(|| {
            a_transaction_that_spills(UnsafeRules {
                read_past_buffer: true,
                ..UnsafeRules::default()
            })
        });
        assert!(
            !matches!(result, Ok(Ok(()))),
            "the spill was read back intact"
        );
    }
}
