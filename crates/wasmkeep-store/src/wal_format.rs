//! The parts of SQLite's write-ahead log format that wasmkeep's VFS reads
//! in the writes SQLite makes to an actor's log: the page capture
//! ([`crate::page_capture`]), the gathering of a commit's writes
//! ([`crate::log_writes`]) and the size read from commit frames
//! ([`crate::wal_index`], ADR 0079).
//!
//! A log is a 32-byte header, then frames, each a 24-byte header and one
//! page. SQLite writes a frame's header and its page in two calls. A frame
//! header starts with the page's number and the database's size in pages
//! after the commit, both big-endian: the size is not zero only in a
//! transaction's last frame, its commit frame.

/// Bytes of the log's own header.
pub(crate) const LOG_HEADER_BYTES: usize = 32;
/// Bytes of a frame's header.
pub(crate) const FRAME_HEADER_BYTES: usize = 24;

/// A frame header, read from a write of exactly a frame header's length:
/// the page number and the database's size in pages after the commit (0
/// in a frame that commits nothing). Whether the write is at a frame's
/// start is the caller's to check; any other write gives `None`.
pub(crate) fn frame_header(data: &[u8]) -> Option<(u32, u32)> {
    if data.len() != FRAME_HEADER_BYTES {
        return None;
    }
    let pgno = u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
    let pages = u32::from_be_bytes([data[4], data[5], data[6], data[7]]);
    Some((pgno, pages))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_headers_page_and_size_are_read_big_endian_from_its_own_length_only() {
        let mut h = [0u8; FRAME_HEADER_BYTES];
        h[..4].copy_from_slice(&7u32.to_be_bytes());
        h[4..8].copy_from_slice(&0x0102_0304u32.to_be_bytes());
        assert_eq!(frame_header(&h), Some((7, 0x0102_0304)));
        assert_eq!(frame_header(&h[..23]), None);
        assert_eq!(frame_header(&[0u8; 25]), None);
    }
}
