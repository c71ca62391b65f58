//! Making committed writes durable, for many actors at once.
//!
//! Actors commit with `synchronous=NORMAL` (the WAL is written, not synced),
//! and the runtime then asks this module to make a group of commits durable
//! before their responses leave. One `fdatasync` per database costs about
//! 0.25 ms on the machine we measured; one `syncfs` that covers 64 dirty
//! databases cost about 1.8 ms, against 14 ms for the 64 `fdatasync`s in a
//! row (see docs/adr/0004-durability-and-group-commit.md). So a group with a
//! few files syncs each; a larger group syncs the filesystem once.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// From how many distinct files on one filesystem a group is cheaper to make
/// durable with one `syncfs` than with one `fdatasync` each.
pub const SYNCFS_FILES_MIN: usize = 4;

/// Flushes one file's data to stable storage.
pub fn sync_file(path: &Path) -> io::Result<()> {
    match File::open(path) {
        Ok(f) => f.sync_data(),
        // The file was checkpointed and removed (its actor closed): closing
        // checkpoints with a sync, so the data is already durable.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Flushes a directory, making the files created in it durable.
pub fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// Flushes every dirty file of the filesystem that holds `path`.
pub fn sync_filesystem(path: &Path) -> io::Result<()> {
    let dir = File::open(path)?;
    // SAFETY: syncfs takes a valid open descriptor, which `dir` holds for the
    // duration of the call.
    let rc = unsafe { libc::syncfs(dir.as_raw_fd()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
