//! A database as bytes, page by page: reading it from SQLite, finding the
//! pages that changed since the last upload, and applying entries.
//!
//! Change capture compares page hashes (ADR 0007): the writer keeps the
//! SHA-256 of every page of the state it last uploaded ([`PageHashes`]);
//! after commits it reads the database image through `sqlite3_serialize`
//! (which reads through SQLite's pager, so the WAL's committed frames are
//! included and the image is one consistent read transaction) and ships
//! the pages whose hash differs. This is exact whatever checkpoints did to
//! the WAL in between, and it ships each changed page once however many
//! commits touched it. It costs one read and hash of the whole database per
//! upload.

use std::path::Path;

use rusqlite::{Connection, MAIN_DB, OpenFlags};
use sha2::{Digest, Sha256};

use crate::entry::{Entry, Kind, Token};
use crate::error::ReplicaError;

/// A database file's bytes: `db_pages()` pages of `page_size` bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Image {
    page_size: u32,
    bytes: Vec<u8>,
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Image {{ page_size: {}, db_pages: {} }}",
            self.page_size,
            self.db_pages()
        )
    }
}

/// The page size a database header records (offset 16, big-endian; 1 means
/// 65536).
fn header_page_size(bytes: &[u8]) -> Option<u32> {
    let raw = u16::from_be_bytes([*bytes.get(16)?, *bytes.get(17)?]) as u32;
    let size = if raw == 1 { 65536 } else { raw };
    ((512..=65536).contains(&size) && size.is_power_of_two()).then_some(size)
}

impl Image {
    /// An image from a database file's bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Image, ReplicaError> {
        let page_size = header_page_size(&bytes)
            .ok_or_else(|| ReplicaError::corrupt("local", "not a sqlite database header"))?;
        if !bytes.len().is_multiple_of(page_size as usize) {
            return Err(ReplicaError::corrupt(
                "local",
                "database size is not a whole number of pages",
            ));
        }
        Ok(Image { page_size, bytes })
    }

    /// The committed state of the database `conn` has open, read in one
    /// transaction.
    pub fn read(conn: &mut Connection) -> Result<Image, ReplicaError> {
        let data = conn.serialize(MAIN_DB)?;
        Image::from_bytes(data.to_vec())
    }

    /// The committed state of the database file at `path` (with its WAL),
    /// read through a read-only connection of its own.
    pub fn read_path(path: &Path) -> Result<Image, ReplicaError> {
        wasmkeep_store::db::sqlite_setup();
        let mut conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        Image::read(&mut conn)
    }

    /// An empty database: what applying a chain starts from.
    pub(crate) fn empty(page_size: u32) -> Image {
        Image {
            page_size,
            bytes: Vec::new(),
        }
    }

    pub fn page_size(&self) -> u32 {
        self.page_size
    }

    pub fn db_pages(&self) -> u32 {
        (self.bytes.len() / self.page_size as usize) as u32
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Page `no` (1-based).
    pub fn page(&self, no: u32) -> &[u8] {
        let ps = self.page_size as usize;
        let start = (no as usize - 1) * ps;
        &self.bytes[start..start + ps]
    }

    /// SHA-256 of every page.
    pub fn hashes(&self) -> PageHashes {
        PageHashes {
            page_size: self.page_size,
            hashes: self
                .bytes
                .chunks(self.page_size as usize)
                .map(|p| Sha256::digest(p).into())
                .collect(),
        }
    }

    /// Applies one entry or snapshot: resize to its `db_pages`, then
    /// overwrite its pages. A snapshot replaces everything.
    pub fn apply(&mut self, entry: &Entry) -> Result<(), ReplicaError> {
        if entry.kind == Kind::Snapshot || self.bytes.is_empty() {
            self.page_size = entry.page_size;
        }
        if entry.page_size != self.page_size {
            return Err(ReplicaError::ChainBroken(format!(
                "entry at seq={} has page_size={} but the database has {}",
                entry.seq, entry.page_size, self.page_size
            )));
        }
        let ps = self.page_size as usize;
        self.bytes.resize(entry.db_pages as usize * ps, 0);
        for (no, bytes) in &entry.pages {
            let start = (*no as usize - 1) * ps;
            self.bytes[start..start + ps].copy_from_slice(bytes);
        }
        Ok(())
    }

    /// The entry that takes a database whose page hashes are `base` (none:
    /// an empty database) to this image.
    pub fn diff(
        &self,
        base: Option<&PageHashes>,
        seq: u64,
        time_ms: u64,
        token: Token,
        actor: &str,
    ) -> Entry {
        let now = self.hashes();
        let same_size = base.is_some_and(|b| b.page_size == self.page_size);
        let pages = (1..=self.db_pages())
            .filter(|no| {
                let i = *no as usize - 1;
                !(same_size && base.and_then(|b| b.hashes.get(i)) == Some(&now.hashes[i]))
            })
            .map(|no| (no, self.page(no).to_vec()))
            .collect();
        Entry {
            kind: Kind::Log,
            seq,
            time_ms,
            token,
            page_size: self.page_size,
            db_pages: self.db_pages(),
            actor: actor.to_owned(),
            pages,
        }
    }

    /// This image as a snapshot at `seq` (token and time of the entry there).
    pub fn snapshot(&self, seq: u64, time_ms: u64, token: Token, actor: &str) -> Entry {
        Entry {
            kind: Kind::Snapshot,
            seq,
            time_ms,
            token,
            page_size: self.page_size,
            db_pages: self.db_pages(),
            actor: actor.to_owned(),
            pages: (1..=self.db_pages())
                .map(|no| (no, self.page(no).to_vec()))
                .collect(),
        }
    }

    /// SHA-256 of the whole file, as the sidecar records it.
    pub fn digest_hex(&self) -> String {
        hex::encode(Sha256::digest(&self.bytes))
    }
}

/// The hash of every page of the state last uploaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageHashes {
    page_size: u32,
    hashes: Vec<[u8; 32]>,
}

impl PageHashes {
    /// Pages in the state these hashes describe.
    pub fn pages(&self) -> u32 {
        self.hashes.len() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(
            "PRAGMA page_size=1024; CREATE TABLE t(x); INSERT INTO t VALUES (zeroblob(5000));",
        )
        .unwrap();
        c
    }

    #[test]
    fn a_diff_applied_to_the_base_gives_the_image() {
        let mut c = db();
        let base = Image::read(&mut c).unwrap();
        c.execute_batch("INSERT INTO t VALUES ('hello'); CREATE TABLE u(y);")
            .unwrap();
        let now = Image::read(&mut c).unwrap();
        let t = Token {
            generation: 1,
            nonce: [0; 16],
        };
        let e = now.diff(Some(&base.hashes()), 1, 0, t, "a/");
        assert!(!e.pages.is_empty() && e.pages.len() < now.db_pages() as usize);
        let mut rebuilt = base.clone();
        rebuilt.apply(&e).unwrap();
        assert_eq!(rebuilt, now);
        // From nothing, the diff holds every page.
        let full = now.diff(None, 0, 0, t, "a/");
        assert_eq!(full.pages.len(), now.db_pages() as usize);
        let mut from_empty = Image::empty(1024);
        from_empty.apply(&full).unwrap();
        assert_eq!(from_empty, now);
    }

    #[test]
    fn shrinking_truncates() {
        let mut c = db();
        let big = Image::read(&mut c).unwrap();
        c.execute_batch("DELETE FROM t; VACUUM;").unwrap();
        let small = Image::read(&mut c).unwrap();
        assert!(small.db_pages() < big.db_pages());
        let t = Token {
            generation: 1,
            nonce: [0; 16],
        };
        let mut img = big.clone();
        img.apply(&small.diff(Some(&big.hashes()), 1, 0, t, "a/"))
            .unwrap();
        assert_eq!(img, small);
    }
}
