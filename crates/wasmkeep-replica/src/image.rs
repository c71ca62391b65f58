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

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_encode};
use rusqlite::{Connection, MAIN_DB, OpenFlags};
use sha2::{Digest, Sha256};

use crate::entry::{Entry, Kind, Token};
use crate::error::ReplicaError;
use crate::limits::{QUICK_CHECK_DETAIL_BYTES_MAX, QUICK_CHECK_ROWS_MAX};

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
pub(crate) fn header_page_size(bytes: &[u8]) -> Option<u32> {
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
    #[cfg(test)]
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
        PageHashes::new(
            self.page_size,
            self.bytes
                .chunks(self.page_size as usize)
                .map(|p| Sha256::digest(p).into())
                .collect(),
        )
    }

    /// Applies one entry or snapshot: resize to its `db_pages`, then
    /// overwrite its pages. A snapshot replaces everything.
    ///
    /// An entry may grow the database only by pages it carries: every
    /// writer's diff ships each page beyond the state it started from
    /// (those pages have no hash to compare with), so a body that claims
    /// more pages than it holds was not written by the rules. Refusing it
    /// means the image never grows past the bytes actually downloaded,
    /// whatever a header says; memory is reserved fallibly, so a node short
    /// of memory fails this restore rather than aborting.
    ///
    /// A tombstone empties the image (it carries no pages); callers that
    /// tell "deleted" from "empty" look at the entry's kind.
    pub fn apply(&mut self, entry: &Entry) -> Result<(), ReplicaError> {
        if !entry.kind.applies_on_top() || self.bytes.is_empty() {
            self.bytes.clear();
            self.page_size = entry.page_size;
        }
        if entry.page_size != self.page_size {
            return Err(ReplicaError::ChainBroken(format!(
                "entry at seq={} has page_size={} but the database has {}",
                entry.seq, entry.page_size, self.page_size
            )));
        }
        let have = self.db_pages();
        let grows_by = entry.db_pages.saturating_sub(have);
        let carried = entry.pages.iter().filter(|(no, _)| *no > have).count();
        if carried != grows_by as usize {
            return Err(ReplicaError::corrupt(
                entry.key(),
                format!(
                    "grows the database by pages={grows_by} but carries {carried} of them: db_pages={} before={have}",
                    entry.db_pages
                ),
            ));
        }
        let ps = self.page_size as usize;
        let len = (entry.db_pages as usize)
            .checked_mul(ps)
            .ok_or_else(|| ReplicaError::corrupt(entry.key(), "database size overflows"))?;
        let more = len.saturating_sub(self.bytes.len());
        self.bytes
            .try_reserve_exact(more)
            .map_err(|_| ReplicaError::OutOfMemory {
                key: entry.key(),
                bytes: more as u64,
            })?;
        self.bytes.resize(len, 0);
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
                !(same_size && base.and_then(|b| b.leaf(i)) == now.leaf(i))
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

    /// SHA-256 of the whole file, as sidecars recorded it before page
    /// capture (still accepted when one is read).
    pub fn digest_hex(&self) -> String {
        hex::encode(Sha256::digest(&self.bytes))
    }
}

/// Checks the database file at `path` (a restore's staged image, not yet
/// installed) with SQLite's `PRAGMA quick_check`; `key` names the object
/// the image stands for in the error.
///
/// `quick_check` rather than `integrity_check`: it verifies every b-tree
/// page, cell, overflow chain and the freelist (every page used exactly
/// once), which is what a malformed image could use to crash or mislead
/// the node, in time linear in the database's size; `integrity_check`
/// adds that each index matches its table and UNIQUE holds, in
/// O(N log N). A forged image that is structurally sound but has
/// inconsistent indexes is wrong data, not a danger to the node, and anyone
/// who can write the bucket can already write any valid data.
///
/// The file is opened read-only and `immutable` (no locks, no `-wal` or
/// `-shm` beside it, nothing written), with SQLite's defensive mode on and
/// the schema untrusted, so that functions named in a hostile schema do not
/// run while it is checked.
pub fn quick_check(path: &Path, key: &str) -> Result<(), ReplicaError> {
    use rusqlite::config::DbConfig;
    let corrupt = |detail: String| ReplicaError::ImageCorrupt {
        key: key.to_owned(),
        detail,
    };
    wasmkeep_store::db::sqlite_setup();
    let conn = Connection::open_with_flags(
        file_uri(path, "immutable=1"),
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)?;
    let sql = format!("PRAGMA quick_check({QUICK_CHECK_ROWS_MAX})");
    let rows: Result<Vec<String>, rusqlite::Error> = conn
        .prepare(&sql)
        .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect());
    let rows = match rows {
        Ok(rows) => rows,
        // A file SQLite cannot even read as a database (a bad header, a
        // schema it cannot parse) fails the check too.
        Err(e) => return Err(corrupt(e.to_string())),
    };
    if rows.len() == 1 && rows[0] == "ok" {
        return Ok(());
    }
    let mut detail = rows.join("; ").replace('\n', "; ");
    if detail.len() > QUICK_CHECK_DETAIL_BYTES_MAX {
        let mut end = QUICK_CHECK_DETAIL_BYTES_MAX;
        while !detail.is_char_boundary(end) {
            end -= 1;
        }
        detail.truncate(end);
        detail.push_str(" ...");
    }
    Err(corrupt(detail))
}

/// The bytes [`file_uri`] escapes in a path: all but RFC 3986's unreserved
/// characters (`A-Z a-z 0-9 - . _ ~`) and `/`, which separates the path's
/// folders in a `file:` URI as in the path itself. Every other byte is
/// escaped: a data folder may hold `?`, `#` or `%`, which SQLite would read
/// as the query, a fragment or an escape, and a path's bytes need not be
/// UTF-8 (bytes past ASCII are always escaped).
const URI_PATH: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'/')
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `file:` URI of `path` with `query`, the path percent-encoded
/// ([`URI_PATH`]).
fn file_uri(path: &Path, query: &str) -> String {
    use std::os::unix::ffi::OsStrExt;
    let path = percent_encode(path.as_os_str().as_bytes(), URI_PATH);
    format!("file:{path}?{query}")
}

/// The hash of every page of the state last uploaded, as the leaves of a
/// binary hash tree whose root the sidecar records ([`Self::digest_hex`]).
///
/// An upload of captured pages changes a few leaves: updating them and
/// their ancestors costs O(pages changed × log pages), so keeping the
/// sidecar's digest true costs no read or hash of the whole database. The
/// tree is canonical (its width is the smallest power of two that holds
/// every page, the leaves past the last page are zeros), so a tree kept up
/// to date and one built afresh from the file agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageHashes {
    page_size: u32,
    pages: usize,
    /// Nodes by heap index: the root at 1, node `i`'s children at `2i` and
    /// `2i + 1`, the leaves from `width()` on.
    tree: Vec<[u8; 32]>,
}

/// Two children's hash.
fn node_hash(left: &[u8; 32], right: &[u8; 32]) -> [u8; 32] {
    let mut d = Sha256::new();
    d.update(left);
    d.update(right);
    d.finalize().into()
}

impl PageHashes {
    /// The tree over `leaves` (one hash per page, in order).
    pub(crate) fn from_leaves(page_size: u32, leaves: Vec<[u8; 32]>) -> PageHashes {
        PageHashes::new(page_size, leaves)
    }

    fn new(page_size: u32, leaves: Vec<[u8; 32]>) -> PageHashes {
        let width = leaves.len().max(1).next_power_of_two();
        let mut tree = vec![[0u8; 32]; 2 * width];
        tree[width..width + leaves.len()].copy_from_slice(&leaves);
        for i in (1..width).rev() {
            tree[i] = node_hash(&tree[2 * i], &tree[2 * i + 1]);
        }
        PageHashes {
            page_size,
            pages: leaves.len(),
            tree,
        }
    }

    fn width(&self) -> usize {
        self.tree.len() / 2
    }

    /// The hash of page `i + 1`.
    fn leaf(&self, i: usize) -> Option<&[u8; 32]> {
        (i < self.pages).then(|| &self.tree[self.width() + i])
    }

    /// Pages in the state these hashes describe.
    pub fn pages(&self) -> u32 {
        self.pages as u32
    }

    pub fn page_size(&self) -> u32 {
        self.page_size
    }

    /// The hash of page `no` (1-based) in this state.
    pub fn page_hash(&self, no: u32) -> Option<[u8; 32]> {
        self.leaf((no as usize).wrapping_sub(1)).copied()
    }

    /// Whether page `no` (1-based) holds exactly `page` in this state.
    pub fn holds(&self, no: u32, page: &[u8]) -> bool {
        let hash: [u8; 32] = Sha256::digest(page).into();
        self.leaf((no as usize).wrapping_sub(1)) == Some(&hash)
    }

    /// The hashes of the state that `pages` and a size of `db_pages` take
    /// this one to (pages beyond the old size must all be among `pages`).
    /// A size that needs another width rebuilds the tree (rare: the
    /// database doubled, or shrank below half).
    pub fn update<'a>(&mut self, db_pages: u32, pages: impl IntoIterator<Item = (u32, &'a [u8])>) {
        let n = db_pages as usize;
        if n.max(1).next_power_of_two() != self.width() {
            let mut leaves: Vec<[u8; 32]> = (0..self.pages.min(n))
                .map(|i| self.tree[self.width() + i])
                .collect();
            leaves.resize(n, [0; 32]);
            for (no, page) in pages {
                if let Some(h) = leaves.get_mut((no as usize).wrapping_sub(1)) {
                    *h = Sha256::digest(page).into();
                }
            }
            *self = PageHashes::new(self.page_size, leaves);
            return;
        }
        let width = self.width();
        let mut touched: Vec<usize> = Vec::new();
        // Leaves past the new size read as zeros again.
        for i in n..self.pages {
            self.tree[width + i] = [0; 32];
            touched.push((width + i) / 2);
        }
        self.pages = n;
        for (no, page) in pages {
            let i = (no as usize).wrapping_sub(1);
            if i < n {
                self.tree[width + i] = Sha256::digest(page).into();
                touched.push((width + i) / 2);
            }
        }
        // Up the tree a level at a time, each parent once.
        while !touched.is_empty() && touched[0] >= 1 {
            touched.sort_unstable();
            touched.dedup();
            for &i in &touched {
                self.tree[i] = node_hash(&self.tree[2 * i], &self.tree[2 * i + 1]);
            }
            if touched == [1] {
                break;
            }
            for i in touched.iter_mut() {
                *i /= 2;
            }
        }
    }

    /// What the sidecar records of the state: SHA-256 over the page size,
    /// the page count and the tree's root.
    pub fn digest_hex(&self) -> String {
        tree_digest(self.page_size, self.pages as u64, &self.tree[1])
    }
}

fn tree_digest(page_size: u32, pages: u64, root: &[u8; 32]) -> String {
    let mut d = Sha256::new();
    d.update(b"wasmkeep-page-tree 1");
    d.update(page_size.to_be_bytes());
    d.update(pages.to_be_bytes());
    d.update(root);
    hex::encode(d.finalize())
}

/// [`PageHashes::digest_hex`] of pages given one at a time, in order, in
/// memory proportional to the tree's height: what a snapshot streamed from
/// a file checks the file against.
#[derive(Debug, Default)]
pub struct TreeDigest {
    /// Roots of complete subtrees, by level, the lowest last.
    stack: Vec<(u32, [u8; 32])>,
    leaves: u64,
}

impl TreeDigest {
    pub fn push(&mut self, page: &[u8]) {
        self.push_leaf(Sha256::digest(page).into());
    }

    fn push_leaf(&mut self, leaf: [u8; 32]) {
        let mut node = (0, leaf);
        while let Some(&(level, left)) = self.stack.last()
            && level == node.0
        {
            self.stack.pop();
            node = (level + 1, node_hash(&left, &node.1));
        }
        self.stack.push(node);
        self.leaves += 1;
    }

    /// The digest of the pages pushed, with `page_size` bytes each.
    pub fn finish(mut self, page_size: u32) -> String {
        let pages = self.leaves;
        // The canonical tree's padding: zero leaves up to its width.
        let width = pages.max(1).next_power_of_two();
        while self.leaves < width {
            self.push_leaf([0; 32]);
        }
        tree_digest(page_size, pages, &self.stack[0].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_uri_escapes_all_but_unreserved_characters_and_slashes() {
        use std::os::unix::ffi::OsStrExt;
        let uri = |p: &[u8]| file_uri(Path::new(std::ffi::OsStr::from_bytes(p)), "immutable=1");
        assert_eq!(uri(b"/data/db-1_a.~"), "file:/data/db-1_a.~?immutable=1");
        assert_eq!(
            uri("/a b/100%/é?#".as_bytes()),
            "file:/a%20b/100%25/%C3%A9%3F%23?immutable=1"
        );
        assert_eq!(uri(b"/x\xff+"), "file:/x%FF%2B?immutable=1");
    }

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

    /// An entry may grow the database only by pages it carries, so the
    /// image never outgrows the bytes downloaded, whatever a header says.
    #[test]
    fn growth_must_be_carried() {
        let mut c = db();
        let base = Image::read(&mut c).unwrap();
        let t = Token {
            generation: 1,
            nonce: [0; 16],
        };
        let mut e = base.diff(Some(&base.hashes()), 1, 0, t, "a/");
        assert!(e.pages.is_empty());
        e.db_pages = base.db_pages() + 1000;
        let mut img = base.clone();
        let err = img.apply(&e).unwrap_err();
        assert_eq!(err.code(), "replica_corrupt", "{err}");
        assert!(err.to_string().contains("carries 0"), "{err}");
        assert_eq!(img, base, "a refused entry changes nothing");
        // One page carried of two added is not enough either.
        let n = base.db_pages();
        e.db_pages = n + 2;
        e.pages = vec![(n + 2, vec![0; 1024])];
        assert!(img.apply(&e).is_err());
        // Both carried: fine.
        e.pages = vec![(n + 1, vec![0; 1024]), (n + 2, vec![0; 1024])];
        img.apply(&e).unwrap();
        assert_eq!(img.db_pages(), n + 2);
    }

    /// A tree kept up to date page by page (growing, shrinking, across
    /// widths) always equals the tree built afresh from the same pages, so
    /// the sidecar's digest does not depend on the history.
    #[test]
    fn an_updated_tree_is_the_tree_of_its_pages() {
        let mut seed = 7u64;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let mut pages: Vec<Vec<u8>> = vec![vec![1; 16]];
        let mut kept = PageHashes::new(16, vec![Sha256::digest(&pages[0]).into()]);
        for round in 0..400 {
            let n = match next(10) {
                0 => 1 + next(3) as usize,
                1 => pages.len() * 2 + next(5) as usize,
                _ => (pages.len() as i64 + next(7) as i64 - 3).max(1) as usize,
            };
            let old = pages.len();
            pages.resize(n, vec![0; 16]);
            let mut changed: Vec<u32> = (old + 1..=n).map(|p| p as u32).collect();
            for _ in 0..next(6) {
                changed.push(1 + next(n as u64) as u32);
            }
            for &p in &changed {
                pages[p as usize - 1] = vec![(round % 256) as u8, p as u8, next(256) as u8];
            }
            kept.update(
                n as u32,
                changed
                    .iter()
                    .map(|&p| (p, pages[p as usize - 1].as_slice())),
            );
            let fresh =
                PageHashes::new(16, pages.iter().map(|p| Sha256::digest(p).into()).collect());
            assert_eq!(kept, fresh, "round {round}: n={n}");
            assert_eq!(kept.digest_hex(), fresh.digest_hex());
            let mut streamed = TreeDigest::default();
            for p in &pages {
                streamed.push(p);
            }
            assert_eq!(streamed.finish(16), fresh.digest_hex(), "streamed, n={n}");
        }
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
