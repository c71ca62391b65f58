//! The body of a `log/<seq>` entry or a `snap/<seq>` snapshot.
//!
//! Both are the same self-describing, checksummed format: a header, the
//! pages, and a SHA-256 of everything before it. A third kind, the
//! tombstone, marks the deletion of the actor (ADR 0007, "Deleting an
//! actor"): it carries no pages and stands for "no database".
//!
//! ```text
//! magic      4  "WKRP"
//! version    2  FORMAT_VERSION (big-endian, like every integer here)
//! kind       1  1 = log entry, 2 = snapshot, 3 = tombstone
//! reserved   1  0
//! seq        8  the chain position this body stands for
//! time_ms    8  commit time of the newest commit it holds (writer's clock)
//! generation 8  the writer's hold generation
//! nonce     16  random, fresh for every entry: no two bodies are equal
//! page_size  4  bytes per page (512..=65536, a power of two)
//! db_pages   4  database size in pages after this entry
//! actor_len  2  then the actor's root key (`state/t/a/c/<hex>/`)
//! count      4  then `count` times: page number (4) and page bytes
//! sha256    32  of every byte before it
//! ```
//!
//! Applying a log entry sets the database to `db_pages` pages (truncating or
//! growing) and overwrites the listed pages; pages are listed in ascending
//! order, each at most `db_pages`. A snapshot lists every page from 1 to
//! `db_pages`. Its token is the token of the log entry at its seq, so a
//! snapshot names the same chain position as that entry.
//!
//! A tombstone has `db_pages` 0 and no pages. The same bytes go to
//! `log/<seq>` (where they take the seq in the create-only race, like any
//! entry) and `snap/<seq>` (where a restore starts from them), and, with
//! the seq of each, over every entry of the erased life. Applying one
//! leaves no database: the state after it is "deleted" until the next
//! entry, which carries every page.

use sha2::{Digest, Sha256};

use crate::error::ReplicaError;
use crate::limits::{PAGE_NUMBER_BYTES, database_pages_max};

/// The format version this crate writes and reads.
pub const FORMAT_VERSION: u16 = 1;
const MAGIC: &[u8; 4] = b"WKRP";
/// Bytes of the fixed header before the actor's key.
pub const FIXED_HEADER_BYTES: usize = 4 + 2 + 1 + 1 + 8 + 8 + 8 + 16 + 4 + 4 + 2;
/// Bytes of the SHA-256 at the end of a body.
pub(crate) const DIGEST_BYTES: usize = 32;

/// Whether a body is a chain entry, a snapshot or a tombstone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Log = 1,
    Snapshot = 2,
    /// The actor was deleted at this seq: no pages, no database. Found in
    /// `log/` and in `snap/` alike.
    Tombstone = 3,
    /// Every page that changed between a snapshot (the folder it is in,
    /// `delta/<base>/`) and this seq, as of this seq (ADR 0037): a restore
    /// from that snapshot applies it instead of the entries it covers.
    Delta = 4,
    /// A log entry too large for one create-only PUT (ADR 0038): its body
    /// is a `Log` body with every page at `whole/<seq>/<token>`, written
    /// (as a multipart upload) before this pointer was created, with the
    /// same seq and token. Holds no pages; found in `log/` only. A reader
    /// follows it once and reads what it points to as the entry.
    Pointer = 5,
}

impl Kind {
    fn from_u8(k: u8) -> Option<Kind> {
        match k {
            1 => Some(Kind::Log),
            2 => Some(Kind::Snapshot),
            3 => Some(Kind::Tombstone),
            4 => Some(Kind::Delta),
            5 => Some(Kind::Pointer),
            _ => None,
        }
    }

    /// Whether a body of this kind belongs in the folder of `folder`
    /// (`Log` for `log/`, `Snapshot` for `snap/`, `Delta` for `delta/`): a
    /// tombstone belongs in the first two, a pointer in `log/`.
    pub fn fits(self, folder: Kind) -> bool {
        self == folder
            || (self == Kind::Tombstone && folder != Kind::Delta)
            || (self == Kind::Pointer && folder == Kind::Log)
    }

    /// Whether a body of this kind changes the state before it (a log
    /// entry, a delta) rather than starting over (a snapshot, a
    /// tombstone): the one rule of every rebuild, in memory or streamed.
    /// A pointer is never applied: readers apply the body it points to.
    pub fn applies_on_top(self) -> bool {
        matches!(self, Kind::Log | Kind::Delta)
    }
}

/// Who wrote an entry: the writer's hold generation and a nonce fresh for
/// every entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    pub generation: u64,
    pub nonce: [u8; 16],
}

impl Token {
    /// A token with a fresh random nonce.
    pub fn fresh(generation: u64) -> std::io::Result<Token> {
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Token { generation, nonce })
    }
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.generation, hex::encode(self.nonce))
    }
}

impl std::str::FromStr for Token {
    type Err = ();
    fn from_str(s: &str) -> Result<Token, ()> {
        let (g, n) = s.split_once('-').ok_or(())?;
        let generation = g.parse().map_err(|_| ())?;
        let bytes = hex::decode(n).map_err(|_| ())?;
        Ok(Token {
            generation,
            nonce: bytes.try_into().map_err(|_| ())?,
        })
    }
}

/// A chain position: a seq and the token of the entry that holds it. Two
/// positions are equal only if they are the same entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Position {
    pub seq: u64,
    pub token: Token,
}

/// A decoded entry or snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub seq: u64,
    pub time_ms: u64,
    pub token: Token,
    pub page_size: u32,
    pub db_pages: u32,
    /// The actor's root key, so that a body copied to the wrong place is
    /// refused.
    pub actor: String,
    /// `(page number, bytes)`, ascending, each `page_size` long.
    pub pages: Vec<(u32, Vec<u8>)>,
}

impl Entry {
    /// A tombstone at `seq`: the actor has no database from here on, until
    /// an entry with every page follows.
    pub fn tombstone(seq: u64, time_ms: u64, token: Token, actor: &str) -> Entry {
        Entry {
            kind: Kind::Tombstone,
            seq,
            time_ms,
            token,
            // Any valid size: there are no pages. The next entry sets its own.
            page_size: 4096,
            db_pages: 0,
            actor: actor.to_owned(),
            pages: Vec::new(),
        }
    }

    /// The chain position this body stands for.
    pub fn position(&self) -> Position {
        Position {
            seq: self.seq,
            token: self.token,
        }
    }

    /// The key this body belongs at, under its actor's root (for a
    /// tombstone, the `log/` one; it is in `snap/` too). A delta's body does
    /// not say which snapshot it starts from: its key here names the
    /// folder `delta/` only, for messages.
    pub fn key(&self) -> String {
        let tail = match self.kind {
            Kind::Log | Kind::Tombstone | Kind::Pointer => crate::keys::log_key(self.seq),
            Kind::Snapshot => crate::keys::snap_key(self.seq),
            Kind::Delta => format!("delta/…/{:0w$}", self.seq, w = crate::keys::SEQ_DIGITS),
        };
        format!("{}{tail}", self.actor)
    }

    /// Bytes [`Entry::encode`] produces.
    pub fn encoded_len(&self) -> u64 {
        (FIXED_HEADER_BYTES + self.actor.len() + 4 + DIGEST_BYTES) as u64
            + self.pages.len() as u64 * (4 + self.page_size as u64)
    }

    /// Encodes the body, refusing one over `entry_bytes_max` or one that
    /// breaks the format's rules (a bug in the caller).
    pub fn encode(&self, entry_bytes_max: u64) -> Result<Vec<u8>, ReplicaError> {
        let size = self.encoded_len();
        if size > entry_bytes_max {
            return Err(ReplicaError::EntryTooLarge {
                size,
                limit: entry_bytes_max,
            });
        }
        if let Err(reason) = self.check() {
            panic!("encoding an invalid entry: {reason}");
        }
        let mut out = Vec::with_capacity(size as usize);
        self.write_header(&mut out, self.pages.len() as u32);
        for (no, bytes) in &self.pages {
            out.extend_from_slice(&no.to_be_bytes());
            out.extend_from_slice(bytes);
        }
        let digest = Sha256::digest(&out);
        out.extend_from_slice(&digest);
        debug_assert_eq!(out.len() as u64, size);
        Ok(out)
    }

    /// The header of this body with `count` pages to follow (those of a
    /// snapshot streamed page by page are not in `pages`).
    pub(crate) fn write_header(&self, out: &mut Vec<u8>, count: u32) {
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
        out.push(self.kind as u8);
        out.push(0);
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.time_ms.to_be_bytes());
        out.extend_from_slice(&self.token.generation.to_be_bytes());
        out.extend_from_slice(&self.token.nonce);
        out.extend_from_slice(&self.page_size.to_be_bytes());
        out.extend_from_slice(&self.db_pages.to_be_bytes());
        out.extend_from_slice(&(self.actor.len() as u16).to_be_bytes());
        out.extend_from_slice(self.actor.as_bytes());
        out.extend_from_slice(&count.to_be_bytes());
    }

    /// The rules every entry follows, whoever built it.
    fn check(&self) -> Result<(), String> {
        if !(512..=65536).contains(&self.page_size) || !self.page_size.is_power_of_two() {
            return Err(format!("bad page size {}", self.page_size));
        }
        if self.actor.len() > u16::MAX as usize {
            return Err("actor key too long".into());
        }
        let mut prev = 0u32;
        for (no, bytes) in &self.pages {
            page_in_order(prev, *no, self.db_pages)?;
            if bytes.len() != self.page_size as usize {
                return Err(format!("page {no} has {} bytes", bytes.len()));
            }
            prev = *no;
        }
        self.count_fits(self.pages.len() as u64)
    }

    /// Whether `count` pages are what a body of this kind and size holds.
    fn count_fits(&self, count: u64) -> Result<(), String> {
        if self.kind == Kind::Snapshot && count != self.db_pages as u64 {
            return Err("a snapshot must hold every page".into());
        }
        if self.kind == Kind::Tombstone && self.db_pages != 0 {
            return Err("a tombstone holds no database".into());
        }
        if self.kind == Kind::Pointer && count != 0 {
            return Err("a pointer holds no page: its body holds them".into());
        }
        if count > self.db_pages as u64 {
            return Err(format!(
                "count={count} pages in a database of db_pages={}",
                self.db_pages
            ));
        }
        Ok(())
    }

    /// Decodes and checks a body read from `key`. Refuses anything over
    /// `entry_bytes_max`, a wrong checksum, an unknown version, a database
    /// larger than `entry_bytes_max` allows (see
    /// [`crate::limits::database_pages_max`]) and any header or page list
    /// that breaks the rules. Every count and size in the body is checked
    /// against the bytes present before anything is allocated from it.
    pub fn decode(key: &str, body: &[u8], entry_bytes_max: u64) -> Result<Entry, ReplicaError> {
        if body.len() as u64 > entry_bytes_max {
            return Err(ReplicaError::EntryTooLarge {
                size: body.len() as u64,
                limit: entry_bytes_max,
            });
        }
        let bad = |reason: &str| ReplicaError::corrupt(key, reason);
        if body.len() < FIXED_HEADER_BYTES + 4 + DIGEST_BYTES {
            return Err(bad("body shorter than a header"));
        }
        let (content, digest) = body.split_at(body.len() - DIGEST_BYTES);
        if Sha256::digest(content).as_slice() != digest {
            return Err(bad("checksum mismatch"));
        }
        let mut r = Reader { key, buf: content };
        let mut entry = read_header(key, &mut r)?;
        let pages_max = database_pages_max(entry_bytes_max, entry.page_size);
        if entry.db_pages > pages_max {
            return Err(ReplicaError::DatabaseTooLarge {
                key: key.to_owned(),
                field: "db_pages",
                value: entry.db_pages as u64,
                limit: pages_max,
            });
        }
        entry.pages = read_pages(key, &mut r, entry.page_size)?;
        entry.check().map_err(|reason| bad(&reason))?;
        Ok(entry)
    }

    /// Reads only the header fields from the first [`FIXED_HEADER_BYTES`]
    /// of a body (point in time needs a snapshot's time without its pages;
    /// open needs the head's token). Unchecked: the full body's checksum is
    /// verified when it is read for use.
    pub fn peek_header(key: &str, prefix: &[u8]) -> Result<Header, ReplicaError> {
        let bad = |reason: &str| ReplicaError::corrupt(key, reason);
        let mut r = Reader { key, buf: prefix };
        if r.take(4).map_err(|_| bad("short header"))? != MAGIC
            || r.u16().map_err(|_| bad("short header"))? != FORMAT_VERSION
        {
            return Err(bad("not a wasmkeep replica body of this version"));
        }
        let short = |_| bad("short header");
        let k = r.u8().map_err(short)?;
        let kind = Kind::from_u8(k).ok_or_else(|| bad(&format!("unknown kind {k}")))?;
        r.u8().map_err(short)?;
        let seq = r.u64().map_err(short)?;
        let time_ms = r.u64().map_err(short)?;
        let generation = r.u64().map_err(short)?;
        let nonce: [u8; 16] = r.take(16).map_err(short)?.try_into().expect("16 bytes");
        Ok(Header {
            kind,
            seq,
            time_ms,
            token: Token { generation, nonce },
        })
    }
}

/// The fields [`Entry::peek_header`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub seq: u64,
    pub time_ms: u64,
    pub token: Token,
}

/// Reads the header of a body whose checksum held, up to and including
/// the actor's key; the page list is left for [`read_pages`].
fn read_header(key: &str, r: &mut Reader<'_>) -> Result<Entry, ReplicaError> {
    let bad = |reason: &str| ReplicaError::corrupt(key, reason);
    if r.take(4)? != MAGIC {
        return Err(bad("not a wasmkeep replica body"));
    }
    let version = r.u16()?;
    if version != FORMAT_VERSION {
        return Err(bad(&format!("unknown format version {version}")));
    }
    let k = r.u8()?;
    let kind = Kind::from_u8(k).ok_or_else(|| bad(&format!("unknown kind {k}")))?;
    r.u8()?;
    let seq = r.u64()?;
    let time_ms = r.u64()?;
    let generation = r.u64()?;
    let nonce: [u8; 16] = r.take(16)?.try_into().expect("16 bytes");
    let page_size = r.u32()?;
    if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
        return Err(bad(&format!("bad page size {page_size}")));
    }
    let db_pages = r.u32()?;
    let actor_len = r.u16()? as usize;
    let actor = std::str::from_utf8(r.take(actor_len)?)
        .map_err(|_| bad("actor key is not utf-8"))?
        .to_owned();
    Ok(Entry {
        kind,
        seq,
        time_ms,
        token: Token { generation, nonce },
        page_size,
        db_pages,
        actor,
        pages: Vec::new(),
    })
}

/// Reads the page list: a count, then that many `(number, page)` pairs.
/// The count must describe exactly the bytes left: a truncated or padded
/// list is refused before anything is allocated from it.
fn read_pages(
    key: &str,
    r: &mut Reader<'_>,
    page_size: u32,
) -> Result<Vec<(u32, Vec<u8>)>, ReplicaError> {
    let bad = |reason: String| ReplicaError::corrupt(key, reason);
    let count = r.u32()?;
    let per_page = PAGE_NUMBER_BYTES + page_size as u64;
    let left = r.buf.len() as u64;
    if (count as u64).checked_mul(per_page) != Some(left) {
        return Err(bad(format!(
            "page list does not fill the body: count={count} page_size={page_size} bytes={left}"
        )));
    }
    // `count` pages of `per_page` bytes are present in `r`, so this
    // reserves no more than the body already holds. Their numbers are
    // checked with the rest of the entry ([`Entry::check`]).
    let mut pages = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let no = r.u32()?;
        pages.push((no, r.take(page_size as usize)?.to_vec()));
    }
    Ok(pages)
}

/// Page `no` may follow page `prev` in a body of a `db_pages` database.
fn page_in_order(prev: u32, no: u32, db_pages: u32) -> Result<(), String> {
    if no <= prev || no > db_pages {
        return Err(format!(
            "page {no} out of order or beyond db_pages={db_pages}"
        ));
    }
    Ok(())
}

/// Where the pages of a body read piece by piece ([`BodyReader`]) go.
pub(crate) trait PageSink {
    /// The body's header (no pages), checked, before its first page.
    fn header(&mut self, head: &Entry, count: u32) -> Result<(), ReplicaError>;
    /// One page, in ascending order, checked against the header.
    fn page(&mut self, no: u32, page: &[u8]) -> Result<(), ReplicaError>;
}

/// A sink that keeps the pages in memory, as [`Entry::decode`] does.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Collect {
    pub(crate) pages: Vec<(u32, Vec<u8>)>,
}

#[cfg(test)]
impl PageSink for Collect {
    fn header(&mut self, _: &Entry, _announced: u32) -> Result<(), ReplicaError> {
        // Pages announced are not yet received: nothing is reserved from
        // a number alone.
        Ok(())
    }

    fn page(&mut self, no: u32, page: &[u8]) -> Result<(), ReplicaError> {
        self.pages.push((no, page.to_vec()));
        Ok(())
    }
}

/// Reads a body handed to it in pieces (as a download streams in), with
/// the rules of [`Entry::decode`] and the same order of refusals: a body
/// over `entry_bytes_max` at once, then one shorter than a header, then a
/// checksum that does not hold, then the header's fields, a database within
/// `entry_bytes_max`, a page list that fills the body exactly, pages in
/// ascending order within the database and every page in a snapshot. The
/// checksum is only known once the last byte arrived ([`BodyReader::finish`]):
/// pages go to the sink as they come, so a sink must make nothing
/// permanent before `finish` said yes. Holds at most one page (or the
/// header) in memory.
pub(crate) struct BodyReader<'k> {
    key: &'k str,
    entry_bytes_max: u64,
    /// SHA-256 of every byte received but the last 32, which are `tail`.
    hasher: Sha256,
    tail: Vec<u8>,
    received: u64,
    /// Bytes of the part being parsed (the header, or a page with its
    /// number).
    buf: Vec<u8>,
    /// The header, once read, and the pages still to come.
    head: Option<(Entry, u32)>,
    prev: u32,
    /// The first rule the body broke: reported at `finish`, after the
    /// checksum (as `decode` does). Nothing more is parsed after it.
    broken: Option<ReplicaError>,
    /// The page count the header announced.
    count: u32,
}

impl<'k> BodyReader<'k> {
    pub(crate) fn new(key: &'k str, entry_bytes_max: u64) -> BodyReader<'k> {
        BodyReader {
            key,
            entry_bytes_max,
            hasher: Sha256::new(),
            tail: Vec::with_capacity(2 * DIGEST_BYTES),
            received: 0,
            buf: Vec::new(),
            head: None,
            prev: 0,
            broken: None,
            count: 0,
        }
    }

    /// Takes the next bytes of the body. Errors only for a body over
    /// `entry_bytes_max` and for what the sink refuses.
    pub(crate) fn feed(
        &mut self,
        bytes: &[u8],
        sink: &mut impl PageSink,
    ) -> Result<(), ReplicaError> {
        self.received += bytes.len() as u64;
        if self.received > self.entry_bytes_max {
            return Err(ReplicaError::EntryTooLarge {
                size: self.received,
                limit: self.entry_bytes_max,
            });
        }
        // Every byte but the last 32 is hashed.
        self.tail.extend_from_slice(bytes);
        if self.tail.len() > DIGEST_BYTES {
            let n = self.tail.len() - DIGEST_BYTES;
            self.hasher.update(&self.tail[..n]);
            self.tail.drain(..n);
        }
        let mut bytes = bytes;
        while !bytes.is_empty() && self.broken.is_none() {
            let Some(want) = self.want() else {
                // Past the page list: only the digest may follow.
                let list = self.list_bytes();
                if list > 0 {
                    self.broken = Some(self.list_mismatch());
                }
                break;
            };
            let n = (want - self.buf.len()).min(bytes.len());
            self.buf.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.buf.len() == want
                && let Err(e) = self.parsed(sink)
            {
                // What the sink could not write stops the read, and so does
                // a header that cannot be read: nothing after it can be
                // parsed, and the rest may be gigabytes (issue 33: a planted
                // 6 GiB object was read whole before it was refused); a
                // rule the body broke later is reported at `finish`, after
                // the checksum.
                if matches!(e, ReplicaError::Io(_)) || self.head.is_none() {
                    return Err(e);
                }
                self.broken = Some(e);
            }
        }
        Ok(())
    }

    /// Bytes the part being parsed takes; `None` once the page list ended.
    fn want(&self) -> Option<usize> {
        match &self.head {
            None if self.buf.len() < FIXED_HEADER_BYTES => Some(FIXED_HEADER_BYTES),
            None => {
                let n = u16::from_be_bytes([
                    self.buf[FIXED_HEADER_BYTES - 2],
                    self.buf[FIXED_HEADER_BYTES - 1],
                ]) as usize;
                Some(FIXED_HEADER_BYTES + n + 4)
            }
            Some((head, left)) if *left > 0 => Some(4 + head.page_size as usize),
            Some(_) => None,
        }
    }

    /// Bytes received past the page list the header announced (the digest
    /// is 32 of them).
    fn list_bytes(&self) -> u64 {
        let Some((head, _)) = &self.head else {
            return 0;
        };
        let header = (FIXED_HEADER_BYTES + head.actor.len() + 4) as u64;
        let per_page = PAGE_NUMBER_BYTES + head.page_size as u64;
        let announced = header + self.count as u64 * per_page + DIGEST_BYTES as u64;
        self.received.saturating_sub(announced)
    }

    fn list_mismatch(&self) -> ReplicaError {
        let (page_size, header) = match &self.head {
            Some((h, _)) => (h.page_size, (FIXED_HEADER_BYTES + h.actor.len() + 4) as u64),
            None => (0, 0),
        };
        let left = self
            .received
            .saturating_sub(header)
            .saturating_sub(DIGEST_BYTES as u64);
        ReplicaError::corrupt(
            self.key,
            format!(
                "page list does not fill the body: count={} page_size={page_size} bytes={left}",
                self.count
            ),
        )
    }

    /// A part was read whole: the header, or one page.
    fn parsed(&mut self, sink: &mut impl PageSink) -> Result<(), ReplicaError> {
        let bad = |reason: String| ReplicaError::corrupt(self.key, reason);
        match &mut self.head {
            // The fixed part: `want` now covers the actor's key and the
            // count, which follow.
            None if self.buf.len() == FIXED_HEADER_BYTES => Ok(()),
            None => {
                let mut r = Reader {
                    key: self.key,
                    buf: &self.buf,
                };
                let head = read_header(self.key, &mut r)?;
                let count = r.u32()?;
                let pages_max = database_pages_max(self.entry_bytes_max, head.page_size);
                if head.db_pages > pages_max {
                    return Err(ReplicaError::DatabaseTooLarge {
                        key: self.key.to_owned(),
                        field: "db_pages",
                        value: head.db_pages as u64,
                        limit: pages_max,
                    });
                }
                self.count = count;
                head.count_fits(count as u64).map_err(bad)?;
                sink.header(&head, count)?;
                self.head = Some((head, count));
                self.buf.clear();
                Ok(())
            }
            Some((head, left)) => {
                let no = u32::from_be_bytes(self.buf[..4].try_into().expect("4 bytes"));
                page_in_order(self.prev, no, head.db_pages).map_err(bad)?;
                sink.page(no, &self.buf[4..])?;
                self.prev = no;
                *left -= 1;
                self.buf.clear();
                Ok(())
            }
        }
    }

    /// After the last byte: the body was whole, its checksum holds and it
    /// broke no rule. Returns its header.
    pub(crate) fn finish(mut self) -> Result<Entry, ReplicaError> {
        let bad = |reason: &str| ReplicaError::corrupt(self.key, reason);
        if self.received < (FIXED_HEADER_BYTES + 4 + DIGEST_BYTES) as u64 {
            return Err(bad("body shorter than a header"));
        }
        if std::mem::take(&mut self.hasher).finalize().as_slice() != self.tail.as_slice() {
            return Err(bad("checksum mismatch"));
        }
        if let Some(e) = self.broken.take() {
            return Err(e);
        }
        let extra = self.list_bytes();
        match self.head.take() {
            Some((head, 0)) if extra == 0 => Ok(head),
            Some(_) => Err(self.list_mismatch()),
            None => Err(bad("body ends early")),
        }
    }
}

/// Reads big-endian fields from the front of a body; reading past its end
/// is an error that names the body's key.
struct Reader<'a> {
    key: &'a str,
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ReplicaError> {
        if self.buf.len() < n {
            return Err(ReplicaError::corrupt(self.key, "body ends early"));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, ReplicaError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, ReplicaError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, ReplicaError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, ReplicaError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn sample() -> Entry {
        Entry {
            kind: Kind::Log,
            seq: 42,
            time_ms: 1_700_000_000_000,
            token: Token {
                generation: 3,
                nonce: [7; 16],
            },
            page_size: 512,
            db_pages: 5,
            actor: "state/t/a/c/6869/".into(),
            pages: vec![(1, vec![1; 512]), (4, vec![4; 512])],
        }
    }

    #[test]
    fn round_trips() {
        let e = sample();
        let body = e.encode(u64::MAX).unwrap();
        assert_eq!(body.len() as u64, e.encoded_len());
        assert_eq!(Entry::decode("k", &body, u64::MAX).unwrap(), e);
        let h = Entry::peek_header("k", &body[..FIXED_HEADER_BYTES]).unwrap();
        assert_eq!(
            (h.kind, h.seq, h.time_ms, h.token),
            (Kind::Log, 42, 1_700_000_000_000, e.token)
        );
    }

    #[test]
    fn refuses_corruption_truncation_and_size() {
        let body = sample().encode(u64::MAX).unwrap();
        let mut flipped = body.clone();
        flipped[FIXED_HEADER_BYTES + 40] ^= 1;
        let e = Entry::decode("k", &flipped, u64::MAX).unwrap_err();
        assert_eq!(e.code(), "replica_corrupt");
        assert!(e.to_string().contains("checksum"), "{e}");
        assert!(Entry::decode("k", &body[..body.len() - 1], u64::MAX).is_err());
        let e = Entry::decode("k", &body, 100).unwrap_err();
        assert_eq!(e.code(), "entry_too_large");
        let e = sample().encode(100).unwrap_err();
        assert_eq!(e.code(), "entry_too_large");
    }

    /// Builds a body with a valid checksum around any content, so that the
    /// checks behind the checksum are exercised too.
    fn seal(content: &[u8]) -> Vec<u8> {
        let mut v = content.to_vec();
        v.extend_from_slice(&Sha256::digest(content));
        v
    }

    #[test]
    fn refuses_well_sealed_bodies_that_break_the_rules() {
        let good = sample().encode(u64::MAX).unwrap();
        let content = &good[..good.len() - 32];
        // Pages out of order: swap the two page numbers.
        let mut c = content.to_vec();
        let first = FIXED_HEADER_BYTES + "state/t/a/c/6869/".len() + 4;
        let second = first + 4 + 512;
        c[first + 3] = 4;
        c[second + 3] = 1;
        assert!(Entry::decode("k", &seal(&c), u64::MAX).is_err());
        // A page beyond db_pages.
        let mut c = content.to_vec();
        c[second + 3] = 9;
        assert!(Entry::decode("k", &seal(&c), u64::MAX).is_err());
        // Unknown version and kind.
        let mut c = content.to_vec();
        c[5] = 2;
        assert!(Entry::decode("k", &seal(&c), u64::MAX).is_err());
        let mut c = content.to_vec();
        c[6] = 9;
        assert!(Entry::decode("k", &seal(&c), u64::MAX).is_err());
        // A snapshot that misses pages.
        let mut c = content.to_vec();
        c[6] = Kind::Snapshot as u8;
        assert!(Entry::decode("k", &seal(&c), u64::MAX).is_err());
    }

    /// The reproduced attack: a body of about a hundred bytes, checksum
    /// valid, whose header claims 2^32 - 1 pages. It is refused from its
    /// header, naming the bound, before anything is sized from it.
    #[test]
    fn a_huge_page_count_is_refused_from_the_header() {
        let forged = Entry {
            db_pages: u32::MAX,
            pages: Vec::new(),
            page_size: 65536,
            ..sample()
        };
        let body = forged.encode(u64::MAX).unwrap();
        assert!(body.len() < 128, "{}", body.len());
        for limit in [u64::MAX, 11 << 30, 1 << 20] {
            let e = Entry::decode("k", &body, limit).unwrap_err();
            assert_eq!(e.code(), "database_too_large", "{e}");
            assert!(e.to_string().contains("db_pages=4294967295"), "{e}");
            assert!(e.to_string().contains("database_pages_max="), "{e}");
        }
    }

    /// The page list must fill the body exactly: a list cut short or padded
    /// after sealing is refused before its count sizes anything.
    #[test]
    fn a_page_count_that_does_not_match_the_bytes_is_refused() {
        let good = sample().encode(u64::MAX).unwrap();
        let content = &good[..good.len() - 32];
        for cut in [1, 512, 516, 600] {
            let e =
                Entry::decode("k", &seal(&content[..content.len() - cut]), u64::MAX).unwrap_err();
            assert!(
                e.to_string().contains("does not fill the body"),
                "{cut}: {e}"
            );
        }
        let mut padded = content.to_vec();
        padded.extend_from_slice(&[0; 516]);
        let e = Entry::decode("k", &seal(&padded), u64::MAX).unwrap_err();
        assert!(e.to_string().contains("does not fill the body"), "{e}");
        // A count far beyond the bytes (the field just before the list).
        let mut c = content.to_vec();
        let at = FIXED_HEADER_BYTES + "state/t/a/c/6869/".len();
        c[at..at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        let e = Entry::decode("k", &seal(&c), u64::MAX).unwrap_err();
        assert!(e.to_string().contains("does not fill the body"), "{e}");
    }

    #[test]
    fn tombstones_round_trip_hold_no_pages_and_fit_both_folders() {
        let t = Entry::tombstone(9, 5, sample().token, "state/t/a/c/6869/");
        let body = t.encode(u64::MAX).unwrap();
        assert_eq!(body.len() as u64, t.encoded_len());
        assert_eq!(Entry::decode("k", &body, u64::MAX).unwrap(), t);
        let h = Entry::peek_header("k", &body[..FIXED_HEADER_BYTES]).unwrap();
        assert_eq!((h.kind, h.seq), (Kind::Tombstone, 9));
        assert_eq!(t.key(), "state/t/a/c/6869/log/00000000000000000009");
        assert!(Kind::Tombstone.fits(Kind::Log) && Kind::Tombstone.fits(Kind::Snapshot));
        assert!(!Kind::Log.fits(Kind::Snapshot) && !Kind::Snapshot.fits(Kind::Log));
        // A tombstone that claims a database is refused.
        let content = &body[..body.len() - 32];
        let mut c = content.to_vec();
        let at = 4 + 2 + 1 + 1 + 8 + 8 + 8 + 16 + 4;
        c[at..at + 4].copy_from_slice(&1u32.to_be_bytes());
        let e = Entry::decode("k", &seal(&c), u64::MAX).unwrap_err();
        assert!(
            e.to_string().contains("a tombstone holds no database"),
            "{e}"
        );
    }

    #[test]
    fn tokens_print_and_parse() {
        let t = sample().token;
        assert_eq!(t.to_string().parse::<Token>(), Ok(t));
        assert!("x-00".parse::<Token>().is_err());
        assert_ne!(Token::fresh(1).unwrap(), Token::fresh(1).unwrap());
    }
}

#[cfg(test)]
mod fuzz {
    //! Whatever bytes arrive, decoding either refuses them or returns an
    //! entry that encodes back to exactly those bytes; and any single flipped
    //! bit or truncation of a valid body is refused.
    use super::*;
    use proptest::prelude::*;

    fn arb_entry() -> impl Strategy<Value = Entry> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<[u8; 16]>(),
            proptest::collection::btree_set(1u32..40, 0..6),
            any::<bool>(),
            any::<u8>(),
        )
            .prop_map(|(seq, time_ms, generation, nonce, set, snap, fill)| {
                let db_pages = if snap {
                    set.len() as u32
                } else {
                    set.iter().max().copied().unwrap_or(0) + 1
                };
                let numbers: Vec<u32> = if snap {
                    (1..=db_pages).collect()
                } else {
                    set.into_iter().collect()
                };
                Entry {
                    kind: if snap { Kind::Snapshot } else { Kind::Log },
                    seq,
                    time_ms,
                    token: Token { generation, nonce },
                    page_size: 512,
                    db_pages,
                    actor: "state/t/a/c/00/".into(),
                    pages: numbers
                        .into_iter()
                        .map(|n| (n, vec![fill.wrapping_add(n as u8); 512]))
                        .collect(),
                }
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..2000)) {
            if let Ok(e) = Entry::decode("k", &body, u64::MAX) {
                prop_assert_eq!(e.encode(u64::MAX).unwrap(), body);
            }
        }

        #[test]
        fn any_damage_is_refused(e in arb_entry(), at in any::<prop::sample::Index>(), bit in 0u8..8, cut in any::<bool>()) {
            let body = e.encode(u64::MAX).unwrap();
            prop_assert_eq!(&Entry::decode("k", &body, u64::MAX).unwrap(), &e);
            let mut damaged = body.clone();
            if cut {
                damaged.truncate(at.index(body.len()));
            } else {
                let i = at.index(body.len());
                damaged[i] ^= 1 << bit;
            }
            prop_assert!(Entry::decode("k", &damaged, u64::MAX).is_err());
        }

        /// The streaming reader (what a restore uses) and `decode` agree on
        /// every body, whole or damaged, however it is cut into pieces:
        /// the same bodies refused with the same code, the same pages read.
        #[test]
        fn the_streaming_reader_agrees_with_decode(
            e in arb_entry(),
            at in any::<prop::sample::Index>(),
            bit in 0u8..8,
            damage in 0u8..3,
            chunk in 1usize..700,
        ) {
            let mut body = e.encode(u64::MAX).unwrap();
            let i = at.index(body.len());
            match damage {
                0 => {}
                1 => body[i] ^= 1 << bit,
                _ => body.truncate(i),
            }
            let decoded = Entry::decode("k", &body, u64::MAX);
            let mut got = Collect::default();
            let mut r = BodyReader::new("k", u64::MAX);
            let mut fed = Ok(());
            for piece in body.chunks(chunk) {
                fed = r.feed(piece, &mut got);
                if fed.is_err() { break; }
            }
            let streamed = fed.and_then(|()| r.finish()).map(|mut head| {
                head.pages = std::mem::take(&mut got.pages);
                head
            });
            match (&decoded, &streamed) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
                (Err(a), Err(b)) => prop_assert_eq!(a.code(), b.code(), "{} / {}", a, b),
                _ => prop_assert!(false, "decode {:?} but streamed {:?}", decoded.as_ref().err(), streamed.as_ref().err()),
            }
        }
    }
}
