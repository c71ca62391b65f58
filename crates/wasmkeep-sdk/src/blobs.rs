//! Values larger than a row, stored in chunks in the actor's database.
//!
//! A single SQL value or KV value is refused past `value_bytes_max`
//! (2 MiB by default): an app that put a whole document in one value
//! would otherwise make its actor unopenable once the document grew
//! (what happened to a tldraw room on Durable Objects). A blob is split
//! into [`CHUNK_BYTES`] rows of `wasmkeep_sdk_blob_chunks` (with its size
//! in `wasmkeep_sdk_blobs`), written in the event's transaction like any
//! data, so it is bounded only by the actor's database (`database_full`
//! past it, with the event rolled back and the actor as it was). No row
//! is ever larger than a chunk, so the actor opens, and every chunk reads,
//! at any size up to its limit.
//!
//! Stream in with [`append`] (across requests, for an upload in parts),
//! stream out with [`chunks`], [`read`] (a range) or
//! [`write_response_body`] (the response's body one chunk at a time, so
//! the guest never holds the whole blob).
//!
//! ```no_run
//! use wasmkeep_sdk::{Request, Response, Result, blobs};
//!
//! fn handle(req: &Request) -> Result<Response> {
//!     match req.route() {
//!         ("POST", "/upload") => {
//!             let size = blobs::append("doc", &req.body)?; // one part of many
//!             Ok(Response::json(200, format!("{{\"size\":{size}}}")))
//!         }
//!         ("GET", "/doc") => {
//!             blobs::write_response_body("doc")?;
//!             Ok(Response::status(200)) // the body is already written
//!         }
//!         _ => Ok(Response::not_found()),
//!     }
//! }
//! ```

use crate::{Error, Result, params, sql};

/// Bytes per stored chunk (well under any `value_bytes_max` a node or
/// manifest sets, and a few pages of the database each).
pub const CHUNK_BYTES: usize = 64 * 1024;
/// Longest blob name, in bytes.
pub const NAME_BYTES_MAX: usize = 256;

const TABLES: [&str; 3] = [
    "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_blobs (name TEXT PRIMARY KEY, size INTEGER NOT NULL, chunks INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_blob_chunks (id INTEGER PRIMARY KEY, name TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL)",
    "CREATE UNIQUE INDEX IF NOT EXISTS wasmkeep_sdk_blob_chunks_at ON wasmkeep_sdk_blob_chunks (name, seq)",
];

fn ensure_tables() -> Result<()> {
    for t in TABLES {
        sql::execute(t, &[])?;
    }
    Ok(())
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(Error::new(
            "invalid_blob",
            format!(
                "a blob name is 1 to {NAME_BYTES_MAX} bytes (name_bytes_max): got {}",
                name.len()
            ),
        ));
    }
    Ok(())
}

/// The blob's size and chunk count, if it exists.
fn meta(name: &str) -> Result<Option<(u64, u64)>> {
    let rows = sql::query(
        "SELECT size, chunks FROM wasmkeep_sdk_blobs WHERE name = ?1",
        params![name],
    )?;
    Ok(rows
        .rows
        .first()
        .map(|r| (r.int(0) as u64, r.int(1) as u64)))
}

fn chunk(name: &str, seq: u64) -> Result<Vec<u8>> {
    let rows = sql::query(
        "SELECT data FROM wasmkeep_sdk_blob_chunks WHERE name = ?1 AND seq = ?2",
        params![name, seq],
    )?;
    rows.rows
        .first()
        .map(|r| r.blob(0).to_vec())
        .ok_or_else(|| {
            Error::new(
                "storage_corrupt",
                format!("blob `{name}`: chunk {seq} is missing"),
            )
        })
}

/// Replaces the blob `name` with `data` (any size the database holds).
pub fn put(name: &str, data: &[u8]) -> Result<()> {
    delete(name)?;
    if data.is_empty() {
        check_name(name)?;
        sql::execute(
            "INSERT INTO wasmkeep_sdk_blobs (name, size, chunks) VALUES (?1, 0, 0)",
            params![name],
        )?;
        return Ok(());
    }
    append(name, data).map(|_| ())
}

/// Appends `data` to the blob `name` (made if missing); returns its new
/// size. The last chunk is filled before a new one starts.
pub fn append(name: &str, data: &[u8]) -> Result<u64> {
    check_name(name)?;
    ensure_tables()?;
    let (mut size, mut chunks) = meta(name)?.unwrap_or((0, 0));
    let mut rest = data;
    let tail = (size % CHUNK_BYTES as u64) as usize;
    if tail > 0 && !rest.is_empty() {
        // Fill the last chunk.
        let mut last = chunk(name, chunks - 1)?;
        let take = (CHUNK_BYTES - tail).min(rest.len());
        last.extend_from_slice(&rest[..take]);
        sql::execute(
            "UPDATE wasmkeep_sdk_blob_chunks SET data = ?3 WHERE name = ?1 AND seq = ?2",
            params![name, chunks - 1, last],
        )?;
        size += take as u64;
        rest = &rest[take..];
    }
    for part in rest.chunks(CHUNK_BYTES) {
        sql::execute(
            "INSERT INTO wasmkeep_sdk_blob_chunks (name, seq, data) VALUES (?1, ?2, ?3)",
            params![name, chunks, part.to_vec()],
        )?;
        chunks += 1;
        size += part.len() as u64;
    }
    sql::execute(
        "INSERT OR REPLACE INTO wasmkeep_sdk_blobs (name, size, chunks) VALUES (?1, ?2, ?3)",
        params![name, size, chunks],
    )?;
    Ok(size)
}

/// The blob's size in bytes, if it exists.
pub fn size(name: &str) -> Result<Option<u64>> {
    ensure_tables()?;
    Ok(meta(name)?.map(|(size, _)| size))
}

/// The whole blob, if it exists. It is held in the guest's memory: for a
/// large one use [`chunks`], [`read`] or [`write_response_body`].
pub fn get(name: &str) -> Result<Option<Vec<u8>>> {
    ensure_tables()?;
    let Some((size, _)) = meta(name)? else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(size as usize);
    for c in chunks(name)? {
        out.extend_from_slice(&c?);
    }
    Ok(Some(out))
}

/// Up to `len` bytes of the blob from `offset` (fewer at its end; empty
/// past it). `not_found` if there is no such blob.
pub fn read(name: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
    ensure_tables()?;
    let (size, _) =
        meta(name)?.ok_or_else(|| Error::not_found(format!("no blob named `{name}`")))?;
    let end = size.min(offset.saturating_add(len as u64));
    let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
    let mut at = offset;
    while at < end {
        let seq = at / CHUNK_BYTES as u64;
        let c = chunk(name, seq)?;
        let from = (at % CHUNK_BYTES as u64) as usize;
        let to = c.len().min(from + (end - at) as usize);
        out.extend_from_slice(&c[from..to]);
        at += (to - from) as u64;
    }
    Ok(out)
}

/// The blob's chunks in order, each read when the iterator reaches it
/// (one chunk in memory at a time). Empty if there is no such blob.
pub fn chunks(name: &str) -> Result<impl Iterator<Item = Result<Vec<u8>>>> {
    ensure_tables()?;
    let n = meta(name)?.map_or(0, |(_, chunks)| chunks);
    let name = name.to_owned();
    Ok((0..n).map(move |seq| chunk(&name, seq)))
}

/// Writes the blob as the body of the response being built, one chunk at
/// a time (return a [`Response`](crate::Response) without a body after
/// it; headers may still be added). Returns the bytes written; `not_found`
/// if there is no such blob. The node's `response_body_bytes_max` bounds
/// what one response carries; serve larger blobs in ranges ([`read`]).
pub fn write_response_body(name: &str) -> Result<u64> {
    ensure_tables()?;
    let (size, _) =
        meta(name)?.ok_or_else(|| Error::not_found(format!("no blob named `{name}`")))?;
    for c in chunks(name)? {
        crate::bindings::wasmkeep::actor::response::write_body(&c?)?;
    }
    Ok(size)
}

/// Deletes the blob `name`; returns whether there was one.
pub fn delete(name: &str) -> Result<bool> {
    ensure_tables()?;
    sql::execute(
        "DELETE FROM wasmkeep_sdk_blob_chunks WHERE name = ?1",
        params![name],
    )?;
    let n = sql::execute(
        "DELETE FROM wasmkeep_sdk_blobs WHERE name = ?1",
        params![name],
    )?;
    Ok(n > 0)
}

/// The blobs whose name starts with `prefix`, by name, with their sizes.
pub fn list(prefix: &str) -> Result<Vec<(String, u64)>> {
    ensure_tables()?;
    let rows = sql::query(
        "SELECT name, size FROM wasmkeep_sdk_blobs WHERE substr(name, 1, length(?1)) = ?1 ORDER BY name",
        params![prefix],
    )?;
    Ok(rows
        .rows
        .iter()
        .map(|r| (r.text(0).to_owned(), r.int(1) as u64))
        .collect())
}
