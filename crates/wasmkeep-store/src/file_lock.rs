//! An actor's database file locked through its own open file description
//! (ADR 0077), not through SQLite's process-wide list of open files.
//!
//! For POSIX locks, SQLite's `unix` VFS keeps one list of every database
//! file open in the process (its `inodeList`) and walks it at each open,
//! under a process-wide mutex: once to find a descriptor to reuse, once to
//! find the file's entry. With thousands of actors open, a burst of alarms
//! that opens an actor for each spent about a tenth of its CPU in those
//! walks. The list exists because a POSIX lock belongs to the process:
//! closing any descriptor of a file drops every POSIX lock the process
//! holds on it, so SQLite must know which of its connections share a file.
//!
//! Linux's open file description locks (`F_OFD_SETLK`) belong to the open
//! file instead, and are dropped only when its last descriptor closes. So
//! [`crate::wal_index`]'s VFS opens an actor's database through the `unix`
//! VFS as a file it does not lock (outside the list) and takes one such
//! lock itself, over the bytes SQLite's locks use, at SQLite's first lock
//! of the file; the file's close releases it. Open file description locks
//! and POSIX locks conflict with each other, in this process and across
//! processes: any other connection (SQLite's own VFS, the `sqlite3` shell)
//! still finds the file locked, as before.
//!
//! One hazard of POSIX locks stays: closing this file's descriptor drops
//! the POSIX locks a reader of this process holds on it (the start-up
//! scan, an upload or an inspection of a closed actor, which use SQLite's
//! own VFS). A file whose lock was taken closes with it held, and no POSIX
//! lock can coexist with it. A file whose lock was never taken (its open
//! gave up because a reader held the file past the busy timeout) keeps its
//! descriptor open, "parked", while a lock that may be a POSIX one is on
//! the file ([`may_close`]), and closes it later, at an open or close of
//! an actor's file ([`close_parked`]).
//!
//! The descriptor is read from the `unix` VFS's file object, whose first
//! fields have not changed in SQLite's history. Before the first actor's
//! file in the process, a probe on a scratch file beside the actor's
//! folder (on the data directory's filesystem) checks that reading, and
//! that the kernel and filesystem take these locks; if not, and elsewhere
//! than Linux, SQLite's own locks are used.

use std::ffi::{CStr, c_char, c_int};
use std::os::unix::ffi::OsStrExt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use rusqlite::ffi;

/// Where SQLite's locks on a database file lie: its pending byte (at 1
/// GiB), the reserved byte after it, and the 510 bytes of the shared range.
const PENDING_BYTE: i64 = 0x4000_0000;
const SHARED_FIRST: i64 = PENDING_BYTE + 2;
const SHARED_SIZE: i64 = 510;

/// Most descriptors kept open at once for files whose lock was never
/// taken; past it, once none of them may close, the oldest is closed
/// anyway (with a warning).
pub(crate) const PARKED_DESCRIPTORS_MAX: usize = 256;

/// The start of the `unix` VFS's file object (`struct unixFile`).
#[repr(C)]
struct UnixFileHead {
    methods: *const ffi::sqlite3_io_methods,
    vfs: *mut ffi::sqlite3_vfs,
    inode: *mut std::ffi::c_void,
    fd: c_int,
}

/// What the probe found: not yet, yes, no.
static ANSWER: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const YES: u8 = 1;
const NO: u8 = 2;

/// Probes that could not make their file (no room, no descriptor left, a
/// folder that cannot be written) before the process settles on SQLite's
/// own locks.
const PROBE_ATTEMPTS_MAX: usize = 8;

/// Whether the actor's file at `db_name` uses these locks: on Linux, once
/// a probe found the descriptor where [`descriptor`] reads it and the
/// kernel and filesystem taking these locks ([`probe`]). The first
/// definite answer stands for the process; a probe that could not make its
/// file leaves this file to SQLite's own locks and the next open probes
/// again, [`PROBE_ATTEMPTS_MAX`] times at most.
///
/// # Safety
/// `db_name` is null or a NUL-terminated path (SQLite's name of the file).
pub(crate) unsafe fn wanted(real_vfs: *mut ffi::sqlite3_vfs, db_name: *const c_char) -> bool {
    static PROBING: Mutex<()> = Mutex::new(());
    static FAILED: AtomicUsize = AtomicUsize::new(0);
    if !cfg!(target_os = "linux") || db_name.is_null() {
        return false;
    }
    match ANSWER.load(Ordering::Acquire) {
        YES => return true,
        NO => return false,
        _ => {}
    }
    let _one = PROBING.lock().unwrap_or_else(|p| p.into_inner());
    match ANSWER.load(Ordering::Acquire) {
        YES => return true,
        NO => return false,
        _ => {}
    }
    // SAFETY: SQLite passes a NUL-terminated name.
    let db = std::path::Path::new(std::ffi::OsStr::from_bytes(
        unsafe { CStr::from_ptr(db_name) }.to_bytes(),
    ));
    // Beside the actor's folder, as the database image is (ADR 0075): a
    // file, not a folder, so no listing of actors reads it.
    let dir = db.parent().map(|d| d.parent().unwrap_or(d));
    let answer = match dir.and_then(|d| probe(real_vfs, d)) {
        Some(answer) => answer,
        None if FAILED.fetch_add(1, Ordering::Relaxed) + 1 < PROBE_ATTEMPTS_MAX => return false,
        None => {
            tracing::warn!(
                attempts = PROBE_ATTEMPTS_MAX,
                "could not make a file to probe open file description locks: actors' files use SQLite's own locks"
            );
            false
        }
    };
    ANSWER.store(if answer { YES } else { NO }, Ordering::Release);
    answer
}

/// The open flags that make the `unix` VFS open a main database file
/// without locking it, and so outside its list: any type but the main
/// database's. A temporary database's type changes nothing else in its
/// open of a named file (same open mode, no directory sync, not deleted).
pub(crate) fn unlisted(flags: c_int) -> c_int {
    (flags & !ffi::SQLITE_OPEN_MAIN_DB) | ffi::SQLITE_OPEN_TEMP_DB
}

/// The descriptor of `f`, opened by the `unix` VFS.
///
/// # Safety
/// `f` was filled in by the `unix` VFS's `xOpen`, and [`wanted`] said yes.
pub(crate) unsafe fn descriptor(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: the unix VFS's file object starts with these fields (checked
    // by `probe`).
    unsafe { (*f.cast::<UnixFileHead>()).fd }
}

/// Makes a scratch file in `dir` through the `unix` VFS as actors' files
/// are opened, and checks that the descriptor [`descriptor`] reads is that
/// file's (same device and inode) and that it takes an open file
/// description lock. `Some(false)` (with a warning) for another layout, or
/// a kernel or filesystem without these locks; `None` if the file could not
/// be made. Never run on an actor's file: a failed check there would close
/// its descriptor without the parking rule.
fn probe(real_vfs: *mut ffi::sqlite3_vfs, dir: &std::path::Path) -> Option<bool> {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let path = dir.join(format!(
        "lock-probe-{}-{}.tmp",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let name = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // A file a crash left under this name (a restarted process may have
    // the same identifier): the unix VFS would open it read-only.
    let _ = std::fs::remove_file(&path);
    let mut out_flags: c_int = 0;
    // SAFETY: a zeroed, 8-byte aligned file object of the unix VFS's size,
    // and a NUL-terminated name that outlives it (no URI flag: SQLite reads
    // nothing past the name); the file is closed before both go.
    let answer = unsafe {
        let size = (*real_vfs).szOsFile as usize;
        let mut object = vec![0u64; size.div_ceil(8)];
        let f = object.as_mut_ptr().cast::<ffi::sqlite3_file>();
        let flags = unlisted(
            ffi::SQLITE_OPEN_READWRITE
                | ffi::SQLITE_OPEN_CREATE
                | ffi::SQLITE_OPEN_EXCLUSIVE
                | ffi::SQLITE_OPEN_MAIN_DB,
        );
        let open = (*real_vfs).xOpen.expect("unix xOpen");
        let rc = open(real_vfs, name.as_ptr(), f, flags, &mut out_flags);
        if (*f).pMethods.is_null() {
            return None;
        }
        let fd = descriptor(f);
        let answer = if rc != ffi::SQLITE_OK || out_flags & ffi::SQLITE_OPEN_READONLY != 0 {
            // Not made by this probe: opened read-only in its place.
            None
        } else if fd < 0 || !same_file(fd, &name) {
            Some(false)
        } else {
            match try_lock(fd, false) {
                ffi::SQLITE_OK => Some(true),
                ffi::SQLITE_BUSY => None,
                _ => Some(false),
            }
        };
        ((*(*f).pMethods).xClose.expect("xClose"))(f);
        answer
    };
    let _ = std::fs::remove_file(&path);
    if answer == Some(false) {
        tracing::warn!(
            probe = %path.display(),
            "open file description locks are not usable here: actors' files use SQLite's own locks"
        );
    }
    answer
}

fn same_file(fd: c_int, path: &CStr) -> bool {
    // SAFETY: plain stat calls into zeroed buffers.
    unsafe {
        let mut a: libc::stat = std::mem::zeroed();
        let mut b: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut a) == 0
            && libc::stat(path.as_ptr(), &mut b) == 0
            && a.st_dev == b.st_dev
            && a.st_ino == b.st_ino
    }
}

/// Takes the file's lock: a write lock over every byte SQLite locks, or
/// with `shared` (the tests' unsafe variant) a read lock on the shared
/// range only, as a reader of SQLite's own VFS holds. `SQLITE_BUSY` if
/// another connection holds a lock there.
pub(crate) fn try_lock(fd: c_int, shared: bool) -> c_int {
    let (kind, start, len) = if shared {
        (libc::F_RDLCK, SHARED_FIRST, SHARED_SIZE)
    } else {
        (
            libc::F_WRLCK,
            PENDING_BYTE,
            SHARED_FIRST + SHARED_SIZE - PENDING_BYTE,
        )
    };
    match ofd_fcntl(fd, OFD_SETLK, kind, start, len) {
        Ok(_) => ffi::SQLITE_OK,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => ffi::SQLITE_BUSY,
        Err(_) => ffi::SQLITE_IOERR_LOCK,
    }
}

/// Whether closing the descriptor `fd` can drop no POSIX lock of this
/// process: no lock lies on the bytes SQLite locks in its file, or the one
/// there is an open file description's write lock over all of them (an
/// actor's connection opened since), which no POSIX lock can share them
/// with. An error counts as a lock.
fn may_close(fd: c_int) -> bool {
    let end = SHARED_FIRST + SHARED_SIZE;
    ofd_fcntl(
        fd,
        OFD_GETLK,
        libc::F_WRLCK,
        PENDING_BYTE,
        end - PENDING_BYTE,
    )
    .is_ok_and(|l| {
        l.l_type == libc::F_UNLCK as i16
            || (l.l_pid == -1
                && l.l_type == libc::F_WRLCK as i16
                && l.l_start <= PENDING_BYTE
                && (l.l_len == 0 || l.l_start + l.l_len >= end))
    })
}

#[cfg(target_os = "linux")]
const OFD_SETLK: c_int = libc::F_OFD_SETLK;
#[cfg(target_os = "linux")]
const OFD_GETLK: c_int = libc::F_OFD_GETLK;
// Never called elsewhere (`wanted` is false there).
#[cfg(not(target_os = "linux"))]
const OFD_SETLK: c_int = -1;
#[cfg(not(target_os = "linux"))]
const OFD_GETLK: c_int = -1;

/// One `fcntl` with an open file description lock request; the request as
/// the kernel wrote it back (what `F_OFD_GETLK` found).
fn ofd_fcntl(
    fd: c_int,
    cmd: c_int,
    kind: c_int,
    start: i64,
    len: i64,
) -> std::io::Result<libc::flock> {
    // SAFETY: a zeroed `flock` (l_pid 0, as these requests require) filled
    // in below, valid for the call.
    unsafe {
        let mut l: libc::flock = std::mem::zeroed();
        l.l_type = kind as i16;
        l.l_whence = libc::SEEK_SET as i16;
        l.l_start = start;
        l.l_len = len;
        if libc::fcntl(fd, cmd, &mut l) == -1 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(l)
    }
}

/// Descriptors kept open for files whose lock was never taken.
static PARKED: Mutex<Vec<c_int>> = Mutex::new(Vec::new());
/// How many there are (read without the mutex at every open and close).
static PARKED_COUNT: AtomicUsize = AtomicUsize::new(0);

/// At the close of a file whose lock was never taken: unless
/// [`may_close`] allows its descriptor to close, keeps it open (taking it
/// from `f`, so the `unix` VFS's close does not close it). Returns whether
/// it did.
///
/// # Safety
/// `f` is a file `descriptor` returned `fd` for, not closed yet.
pub(crate) unsafe fn park_if_locked(f: *mut ffi::sqlite3_file, fd: c_int) -> bool {
    #[cfg(test)]
    if tests::CLOSE_AT_ONCE_UNSAFE.get() {
        return false;
    }
    if may_close(fd) {
        return false;
    }
    // SAFETY: the caller's; -1 is what the unix VFS's close skips.
    unsafe { (*f.cast::<UnixFileHead>()).fd = -1 };
    let mut parked = PARKED.lock().unwrap_or_else(|p| p.into_inner());
    if parked.len() >= PARKED_DESCRIPTORS_MAX {
        sweep(&mut parked);
    }
    if parked.len() >= PARKED_DESCRIPTORS_MAX {
        let oldest = parked.remove(0);
        tracing::warn!(
            limit = PARKED_DESCRIPTORS_MAX,
            "too many actors' files wait for a reader to let go: closing the oldest anyway"
        );
        // SAFETY: a descriptor this module owns.
        unsafe { libc::close(oldest) };
    }
    parked.push(fd);
    PARKED_COUNT.store(parked.len(), Ordering::Relaxed);
    true
}

/// Closes the parked descriptors [`may_close`] allows to close now.
pub(crate) fn close_parked() {
    if PARKED_COUNT.load(Ordering::Relaxed) == 0 {
        return;
    }
    let mut parked = PARKED.lock().unwrap_or_else(|p| p.into_inner());
    sweep(&mut parked);
    PARKED_COUNT.store(parked.len(), Ordering::Relaxed);
}

/// Closes, and takes out of `parked`, the descriptors [`may_close`] allows.
fn sweep(parked: &mut Vec<c_int>) {
    parked.retain(|&fd| {
        if !may_close(fd) {
            return true;
        }
        // SAFETY: a descriptor this module owns.
        unsafe { libc::close(fd) };
        false
    });
}

#[cfg(test)]
pub(crate) mod tests {
    thread_local! {
        /// The unsafe variant: a file whose lock was never taken closes its
        /// descriptor at once, dropping a reader's POSIX locks.
        pub(crate) static CLOSE_AT_ONCE_UNSAFE: std::cell::Cell<bool> =
            const { std::cell::Cell::new(false) };
    }

    /// Descriptors parked now.
    #[cfg(target_os = "linux")]
    pub(crate) fn parked() -> usize {
        super::PARKED_COUNT.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the probe found these locks usable.
    #[cfg(target_os = "linux")]
    pub(crate) fn in_use() -> bool {
        super::ANSWER.load(std::sync::atomic::Ordering::Acquire) == super::YES
    }

    /// Whether a descriptor of the file at `path` that never locked it may
    /// close now (see `may_close`). The descriptor stays open: closing it
    /// would drop this process's POSIX locks on the file.
    #[cfg(target_os = "linux")]
    pub(crate) fn may_close(file: &std::fs::File) -> bool {
        use std::os::fd::AsRawFd;
        super::may_close(file.as_raw_fd())
    }
}
