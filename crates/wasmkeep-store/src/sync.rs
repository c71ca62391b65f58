//! Making committed writes durable, for many actors at once.
//!
//! Actors commit with `synchronous=NORMAL` (the WAL is written, not synced),
//! and the runtime then asks this module to make a group of commits durable
//! before their responses leave. Measured on this project's machine (medians
//! of 30, 4 KiB appended per file): one file, `fdatasync` 0.19 ms and
//! `syncfs` 0.23 ms; two files, 0.40 ms against 0.26 ms; 64 files, 14 ms
//! against 1.8 ms (see docs/adr/0004-durability-and-group-commit.md). So a
//! lone file is synced by itself, and any larger group by one `syncfs`.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// From how many distinct files on one filesystem a group is cheaper to make
/// durable with one `syncfs` than with one `fdatasync` each.
pub const SYNCFS_FILES_MIN: usize = 2;

/// Flushes one file's data to stable storage.
pub fn sync_file(path: &Path) -> io::Result<()> {
    match File::open(path) {
        Ok(f) => f.sync_data(),
        // The file is gone: its actor was deleted, or its log set aside
        // by a restore after a `syncfs` (a close keeps the file, ADR 0031).
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes back the file's dirty pages and waits for them, without its
/// metadata and without flushing the device's cache: it makes nothing
/// durable, it only moves the write-back a later sync would do to now
/// (`sync_file_range` with `WAIT_BEFORE | WRITE | WAIT_AFTER`).
pub(crate) fn write_back(file: &File) -> io::Result<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: `file` holds a valid open descriptor for the duration of the
    // call; offset 0 and length 0 mean the whole file.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Flushes a directory, making the files created in it durable.
pub fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// Deletes an actor's folder `dir` for good before returning: renamed to
/// `grave` (a sibling, so that a crash mid-removal never leaves a
/// half-deleted database where the actor would find it), the parent
/// folder synced, then the grave removed. Without the sync, a power cut
/// could bring the folder back under its name after the delete was
/// acknowledged, and the commit log's replay would put the actor's last
/// commits back into it (ADR 0074).
pub fn delete_folder(dir: &Path, grave: &Path) -> io::Result<()> {
    std::fs::rename(dir, grave)?;
    #[cfg(test)]
    let synced = !crate::commit_log::rules().delete_without_folder_sync;
    #[cfg(not(test))]
    let synced = true;
    if synced && let Some(parent) = grave.parent() {
        sync_dir(parent)?;
        #[cfg(test)]
        crate::commit_log::tests::note(crate::commit_log::tests::Op::DirSync(parent.to_owned()));
    }
    std::fs::remove_dir_all(grave)
}

/// Flushes every dirty file of the filesystem that holds `path`.
pub fn sync_filesystem(path: &Path) -> io::Result<()> {
    sync_filesystem_of(&File::open(path)?)
}

/// Flushes every dirty file of the filesystem `dir` is open on. Linux
/// (5.8 and later) reports a failed write-back to `syncfs` once per open
/// file description, to the first call through it after the failure; a
/// description opened after a failure that another already saw does not
/// see it. A caller that must not miss one keeps its description from
/// before the writes it makes durable, lets one call through it run at a
/// time, and treats an error as final (the next call may succeed with the
/// pages lost).
pub(crate) fn sync_filesystem_of(dir: &File) -> io::Result<()> {
    // SAFETY: syncfs takes a valid open descriptor, which `dir` holds for the
    // duration of the call.
    let rc = unsafe { libc::syncfs(dir.as_raw_fd()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
