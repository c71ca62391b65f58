//! One process at a time on a data directory.
//!
//! A node replays its commit log at start and then deletes the segments,
//! deletes the spare folders it finds, and holds every actor's database
//! as the only writer (ADR 0074, ADR 0075, ADR 0024). A second node
//! started on the same folder (a service started twice, a restart while
//! the old process is still stopping) would replay and delete the first
//! one's log under it and open the same actors: acknowledged writes lost.
//! So a node holds an exclusive `flock` on `DATA/node.lock` from its start
//! to its stop, and so do the offline commands that change the folder;
//! whoever finds it held refuses to run, naming the holder's process.
//!
//! The holder's number stays in the file until it stops cleanly
//! ([`DataLock::stopped`] empties it): the next holder that finds a number
//! there knows the previous one crashed ([`DataLock::previous_holder_crashed`];
//! a node then looks for commits its crash left unuploaded, ADR 0082).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

/// The lock's file in a data directory.
pub const LOCK_FILE: &str = "node.lock";

/// How often a start waiting for the lock tries again.
const RETRY_MS: u64 = 10;

/// A data directory held by this process until dropped.
#[derive(Debug)]
pub struct DataLock {
    file: File,
    previous_holder_crashed: bool,
}

impl DataLock {
    /// Takes `data`'s lock, waiting up to `wait` for a holder that is
    /// stopping (a runtime of this process shutting down, say). `Err`
    /// names the holder's process if it wrote its number.
    pub fn take(data: &Path, wait: Duration) -> Result<DataLock, String> {
        let path = data.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| format!("could not open {}: {e}", path.display()))?;
        let tries = wait.as_millis() as u64 / RETRY_MS + 1;
        for i in 0..tries {
            // SAFETY: `file` holds a valid descriptor for the call.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                let mut before = String::new();
                let previous_holder_crashed = file
                    .rewind()
                    .and_then(|()| file.read_to_string(&mut before))
                    .map_or(true, |_| !before.trim().is_empty());
                // The holder's number, for the message of whoever comes next.
                let pid = std::process::id().to_string();
                let written = file
                    .set_len(0)
                    .and_then(|()| file.rewind())
                    .and_then(|()| file.write_all(pid.as_bytes()));
                if let Err(e) = written {
                    tracing::warn!(lock = %path.display(), error = %e,
                        "could not write this process's number into the data directory's lock");
                }
                return Ok(DataLock {
                    file,
                    previous_holder_crashed,
                });
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(format!("could not lock {}: {e}", path.display()));
            }
            if i + 1 < tries {
                std::thread::sleep(Duration::from_millis(RETRY_MS));
            }
        }
        let mut holder = String::new();
        let _ = file
            .rewind()
            .and_then(|()| file.read_to_string(&mut holder));
        let holder = match holder.trim() {
            "" => "another process".to_owned(),
            pid => format!("process {pid}"),
        };
        Err(format!(
            "the data directory {} is in use by {holder} (it holds {}): \
             one node at a time may use a data directory; stop it first",
            data.display(),
            path.display()
        ))
    }

    /// Whether the folder's previous holder ended without
    /// [`DataLock::stopped`]: it crashed, was killed, or the machine went
    /// down (its number was still in the file; a file that could not be
    /// read counts as a crash too). A folder never held did not.
    pub fn previous_holder_crashed(&self) -> bool {
        self.previous_holder_crashed
    }

    /// Lets go after a clean stop: the next holder finds the file empty.
    /// (Not synced: a power cut right after may leave the number, and the
    /// next holder then takes the stop for a crash, which only costs it a
    /// look at its actors.)
    pub fn stopped(self) {
        if let Err(e) = self.file.set_len(0) {
            tracing::warn!(error = %e, "could not mark the data directory's lock as stopped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_lets_go() {
        let data = tempfile::tempdir().unwrap();
        let first = DataLock::take(data.path(), Duration::ZERO).unwrap();
        let refused = DataLock::take(data.path(), Duration::from_millis(30)).unwrap_err();
        let pid = std::process::id().to_string();
        assert!(
            refused.contains("in use by process") && refused.contains(&pid),
            "{refused}"
        );
        drop(first);
        DataLock::take(data.path(), Duration::ZERO).expect("free again");
    }

    #[test]
    fn the_next_holder_knows_whether_the_last_one_stopped() {
        let data = tempfile::tempdir().unwrap();
        let first = DataLock::take(data.path(), Duration::ZERO).unwrap();
        assert!(!first.previous_holder_crashed(), "a folder never held");
        // Dropped without `stopped`, as a crash lets go.
        drop(first);
        let second = DataLock::take(data.path(), Duration::ZERO).unwrap();
        assert!(second.previous_holder_crashed());
        second.stopped();
        let third = DataLock::take(data.path(), Duration::ZERO).unwrap();
        assert!(!third.previous_holder_crashed());
    }

    #[test]
    fn a_start_waits_for_a_holder_that_is_stopping() {
        let data = tempfile::tempdir().unwrap();
        let first = DataLock::take(data.path(), Duration::ZERO).unwrap();
        let stopping = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(first);
        });
        DataLock::take(data.path(), Duration::from_secs(10)).expect("taken once let go");
        stopping.join().unwrap();
    }
}
