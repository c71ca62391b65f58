//! A commit's writes to the write-ahead log, gathered into one (ADR 0029).
//!
//! SQLite appends a commit to the log as two writes per page: the frame's
//! 24-byte header, then the page. On ext4 each write pays a system call, a
//! timestamp update and the page-cache work of every 4 KiB page it touches,
//! and frames (4,120 bytes for 4 KiB pages) straddle page-cache pages, so a
//! three-page commit was six writes over nine page-cache pages. The VFS
//! ([`crate::wal_index`]) gathers a log's consecutive writes here and hands
//! them to the `unix` VFS as one write: a three-page commit becomes one
//! write over four pages.
//!
//! Two rules keep this invisible to SQLite and to the runtime:
//!
//! - **A commit leaves nothing behind.** The write that completes a commit
//!   frame (a frame header whose "database size" field is non-zero, then its
//!   page) empties the buffer before it returns, so when `COMMIT` returns the
//!   whole commit is in the file, where a crash of the process, the
//!   runtime's `fdatasync`/`syncfs` and any other reader find it.
//! - **Nothing reads past the buffer.** Every other call on the log (read,
//!   size, sync, truncate, file control, close) empties it first, so SQLite
//!   reading back the frames of a large transaction that spilled to the log
//!   before its commit reads what it wrote.
//!
//! A write that does not continue the buffered run (SQLite rewriting a
//! frame in place) empties the buffer and then goes to the file as it is.

use std::ffi::c_int;

use crate::wal_format::frame_header;

/// The most a log's gathered writes hold before they go to the file. A
/// larger commit goes in several writes of about this size. The `unix`
/// VFS writes at most 128 KiB − 1 bytes per call (it masks the length), so
/// this stays below that.
pub(crate) const LOG_WRITE_BUFFER_BYTES_MAX: usize = 64 * 1024;

/// The OK result code of SQLite's file methods.
const OK: c_int = 0;

/// The writes gathered for one open log file.
#[derive(Default)]
pub(crate) struct LogWrites {
    /// Bytes not yet handed to the file, which go at `start`.
    buf: Vec<u8>,
    start: i64,
    /// The last write was a commit frame's header: the next one is its
    /// page, after which the commit must be in the file.
    commit_page_next: bool,
    /// Tests only: the unsafe variants the rules' tests run.
    #[cfg(test)]
    pub(crate) unsafe_rules: UnsafeRules,
}

/// Which rule a test breaks (each runs against the safe default too).
#[cfg(test)]
#[derive(Default, Clone, Copy)]
pub(crate) struct UnsafeRules {
    /// Leave a commit in the buffer when `COMMIT` returns.
    pub(crate) hold_commits: bool,
    /// Read from the file without emptying the buffer first.
    pub(crate) read_past_buffer: bool,
}

impl LogWrites {
    /// Takes one of SQLite's writes to the log. `file` writes bytes at an
    /// offset and returns an SQLite result code (the `unix` VFS's `xWrite`).
    pub(crate) fn write(
        &mut self,
        data: &[u8],
        offset: i64,
        mut file: impl FnMut(&[u8], i64) -> c_int,
    ) -> c_int {
        let completes_commit = std::mem::take(&mut self.commit_page_next);
        let commit_header = frame_header(data).is_some_and(|(_, pages)| pages != 0);
        let continues = offset == self.start + self.buf.len() as i64 || self.buf.is_empty();
        if !continues || self.buf.len() + data.len() > LOG_WRITE_BUFFER_BYTES_MAX {
            let rc = self.flush(&mut file);
            if rc != OK {
                return rc;
            }
        }
        if data.len() > LOG_WRITE_BUFFER_BYTES_MAX || !continues {
            // Too large to gather, or a rewrite in place: as it is.
            let rc = file(data, offset);
            self.commit_page_next = rc == OK && commit_header;
            return rc;
        }
        if self.buf.is_empty() {
            self.start = offset;
        }
        self.buf.extend_from_slice(data);
        self.commit_page_next = commit_header;
        #[cfg(test)]
        if self.unsafe_rules.hold_commits {
            return OK;
        }
        if completes_commit {
            return self.flush(&mut file);
        }
        OK
    }

    /// Hands every gathered byte to the file. On an error the bytes are
    /// dropped (SQLite treats the failed write as its own and abandons the
    /// transaction) and the error is returned.
    pub(crate) fn flush(&mut self, mut file: impl FnMut(&[u8], i64) -> c_int) -> c_int {
        if self.buf.is_empty() {
            return OK;
        }
        let rc = file(&self.buf, self.start);
        // An idle log holds no memory: most open actors write rarely.
        self.buf = Vec::new();
        rc
    }

    /// Empties the buffer before SQLite reads the file (see the module's
    /// rules).
    pub(crate) fn flush_before_read(&mut self, file: impl FnMut(&[u8], i64) -> c_int) -> c_int {
        #[cfg(test)]
        if self.unsafe_rules.read_past_buffer {
            return OK;
        }
        self.flush(file)
    }

    /// Bytes waiting for the file.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal_format::FRAME_HEADER_BYTES;

    /// A file in memory that records each write it receives.
    #[derive(Default)]
    struct File {
        bytes: Vec<u8>,
        writes: usize,
    }

    impl File {
        fn write(&mut self, data: &[u8], offset: i64) -> c_int {
            assert!(
                data.len() <= 0x1ffff,
                "more than the unix VFS writes at once"
            );
            let o = offset as usize;
            if self.bytes.len() < o + data.len() {
                self.bytes.resize(o + data.len(), 0);
            }
            self.bytes[o..o + data.len()].copy_from_slice(data);
            self.writes += 1;
            OK
        }
    }

    fn header(db_pages: u32) -> Vec<u8> {
        let mut h = vec![0u8; FRAME_HEADER_BYTES];
        h[0..4].copy_from_slice(&7u32.to_be_bytes());
        h[4..8].copy_from_slice(&db_pages.to_be_bytes());
        h
    }

    /// Appends frames as SQLite does (header, then page) from `offset`;
    /// the last has a non-zero database size when `commit`.
    fn frames(w: &mut LogWrites, f: &mut File, offset: i64, n: usize, commit: bool) -> i64 {
        let mut o = offset;
        for i in 0..n {
            let last = i + 1 == n;
            let h = header(if commit && last { 3 } else { 0 });
            assert_eq!(w.write(&h, o, |d, o| f.write(d, o)), OK);
            o += h.len() as i64;
            let page = vec![i as u8 + 1; 4096];
            assert_eq!(w.write(&page, o, |d, o| f.write(d, o)), OK);
            o += page.len() as i64;
        }
        o
    }

    #[test]
    fn a_commit_is_one_write_and_nothing_is_left_behind() {
        let (mut w, mut f) = (LogWrites::default(), File::default());
        let hdr = [9u8; 32];
        assert_eq!(w.write(&hdr, 0, |d, o| f.write(d, o)), OK);
        let end = frames(&mut w, &mut f, 32, 3, true);
        assert_eq!(w.pending(), 0);
        assert_eq!(f.writes, 1);
        assert_eq!(f.bytes.len() as i64, end);
        assert_eq!(&f.bytes[..32], &hdr);
        assert_eq!(f.bytes[32 + 24 + 4096 + 24], 2, "the second page in place");
    }

    #[test]
    fn frames_before_the_commit_wait_until_a_read() {
        let (mut w, mut f) = (LogWrites::default(), File::default());
        let end = frames(&mut w, &mut f, 32, 2, false);
        assert_eq!(f.writes, 0);
        assert_eq!(w.pending() as i64, end - 32);
        assert_eq!(w.flush_before_read(|d, o| f.write(d, o)), OK);
        assert_eq!((f.writes, w.pending()), (1, 0));
    }

    #[test]
    fn a_rewrite_in_place_goes_after_what_was_gathered() {
        let (mut w, mut f) = (LogWrites::default(), File::default());
        frames(&mut w, &mut f, 32, 2, false);
        // SQLite rewrites the first frame's page (same transaction).
        let again = vec![0xAA; 4096];
        assert_eq!(w.write(&again, 56, |d, o| f.write(d, o)), OK);
        assert_eq!((f.writes, w.pending()), (2, 0));
        assert_eq!(f.bytes[56], 0xAA);
    }

    #[test]
    fn a_large_transaction_goes_in_writes_of_at_most_the_limit() {
        let (mut w, mut f) = (LogWrites::default(), File::default());
        let n = 3 * LOG_WRITE_BUFFER_BYTES_MAX / 4120;
        let end = frames(&mut w, &mut f, 32, n, true);
        assert_eq!(w.pending(), 0);
        assert_eq!(f.bytes.len() as i64, end);
        assert!((3..=4).contains(&f.writes), "{} writes", f.writes);
    }

    #[test]
    fn a_failed_write_is_reported_and_drops_the_bytes() {
        let mut w = LogWrites::default();
        assert_eq!(w.write(&header(0), 32, |_, _| OK), OK);
        assert_eq!(w.write(&header(3), 56, |_, _| OK), OK);
        let full = 13; // SQLITE_FULL
        assert_eq!(w.write(&[1u8; 4096], 80, |_, _| full), full);
        assert_eq!(w.pending(), 0);
    }
}
