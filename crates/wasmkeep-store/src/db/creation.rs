//! A new actor's database written from an image (ADR 0075).
//!
//! Every new database starts alike: the page size the node is configured
//! with, WAL mode, the runtime's tables and nothing else. SQLite making
//! that file (switching it to WAL, parsing and running each `CREATE
//! TABLE`, committing them) was a fifth of a cold start's CPU (W3). The
//! first creation in the process for a page size has SQLite make such a
//! file once, beside the new actor's, reads it and deletes it; every
//! creation then writes those bytes as the new actor's database file
//! before SQLite opens it.
//!
//! The image is SQLite's own output (no byte of it is set by hand), and
//! the file is written where SQLite used to write its first page: outside
//! the write-ahead log, with no sync, made durable with the new actor's
//! folders by its first batch's `syncfs` (ADR 0074, rule 5). A crash
//! before that leaves at most a short or empty file, which `ActorDb::open`
//! already knows how to handle (set aside as an interrupted creation, or
//! made into a database again).

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::{Connection, OpenFlags};

use super::{SCHEMA, open_err};
use crate::error::StoreError;

/// Name of the file the image is made in, inside the first new actor's
/// folder (deleted once read).
const IMAGE_FILE: &str = "new-database-image.db";

/// Most pages a new database holds (page 1 and the runtime's tables' root
/// pages: five today; a test checks the image stays within this).
const NEW_DATABASE_PAGES_MAX: u64 = 8;

/// The most bytes a new database's file holds with `page_bytes` (and never
/// less than 64 KiB, what this bound was before images): a file no longer
/// than this, with an empty log, may be an interrupted creation.
pub(super) fn new_database_bytes_max(page_bytes: u32) -> u64 {
    (NEW_DATABASE_PAGES_MAX * u64::from(page_bytes)).max(65536)
}

/// Most images kept: one per page size (powers of two from 512 to 65,536).
const IMAGES_MAX: usize = 8;

/// Images made so far, by page size.
static IMAGES: Mutex<Vec<(u32, Arc<[u8]>)>> = Mutex::new(Vec::new());

/// Writes a new database at `path` holding what creating one with
/// `page_bytes` leaves: WAL mode, the runtime's tables. The file must not
/// exist, or be a spare folder's empty one (`spare`). `scratch` is a
/// folder the image may be made in the first time.
pub(super) fn write_new_database(
    path: &Path,
    spare: bool,
    scratch: &Path,
    page_bytes: u32,
) -> Result<(), StoreError> {
    let image = image_for(scratch, page_bytes)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(!spare)
        .open(path)?;
    if file.metadata()?.len() != 0 {
        return Err(StoreError::Io(format!(
            "a new database's file {} is not empty",
            path.display()
        )));
    }
    #[cfg(test)]
    crate::commit_log::tests::note(crate::commit_log::tests::Op::Create(path.to_owned()));
    file.write_all(&image)?;
    #[cfg(test)]
    crate::commit_log::tests::note(crate::commit_log::tests::Op::Write {
        path: path.to_owned(),
        offset: 0,
        data: image.to_vec(),
    });
    Ok(())
}

/// The image for `page_bytes`, made in `scratch` if this is the first.
fn image_for(scratch: &Path, page_bytes: u32) -> Result<Arc<[u8]>, StoreError> {
    // Held while an image is made: two first creations at once make it once.
    let mut images = IMAGES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, image)) = images.iter().find(|(p, _)| *p == page_bytes) {
        return Ok(Arc::clone(image));
    }
    let image: Arc<[u8]> = make_image(&scratch.join(IMAGE_FILE), page_bytes)?.into();
    if images.len() < IMAGES_MAX {
        images.push((page_bytes, Arc::clone(&image)));
    }
    Ok(image)
}

/// Has SQLite create a database at `path` as an actor's used to be
/// created, closes it (which folds its write-ahead log into it and deletes
/// the log), reads the file and deletes it.
fn make_image(path: &Path, page_bytes: u32) -> Result<Vec<u8>, StoreError> {
    let remove = |p: &Path| match std::fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    };
    let wal = path.with_extension("db-wal");
    // Left by a crash while an image was made.
    remove(path)?;
    remove(&wal)?;
    let made = (|| {
        let c = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        c.pragma_update(None, "synchronous", "OFF")?;
        // The write-ahead log's index in the heap, no `-shm` file.
        c.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
        // Only a database without pages takes a page size, and only before
        // it is switched to WAL; an invalid one is ignored (settings are
        // checked where they are read).
        c.pragma_update(None, "page_size", page_bytes)?;
        c.pragma_update(None, "journal_mode", "MEMORY")?;
        c.pragma_update(None, "journal_mode", "WAL")?;
        c.execute_batch(&format!("BEGIN;{SCHEMA}COMMIT;"))?;
        c.close().map_err(|(_, e)| e)
    })();
    let read = made
        .map_err(open_err)
        .and_then(|()| Ok(std::fs::read(path)?));
    remove(path)?;
    remove(&wal)?;
    let image = read?;
    // A file SQLite reopens in WAL mode says so in its header (the file
    // format's write and read versions, bytes 18 and 19, are 2).
    if image.len() < 512 || image[18..20] != [2, 2] {
        return Err(StoreError::Corrupt(format!(
            "the new-database image SQLite made is not in WAL mode ({} bytes)",
            image.len()
        )));
    }
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::{ActorDb, OpenMode};
    use crate::limits::StoreLimits;

    #[test]
    fn the_image_is_a_wal_database_sqlite_made_with_the_runtime_tables() {
        for page_bytes in [4096u32, 16384] {
            let scratch = tempfile::tempdir().unwrap();
            let image = image_for(scratch.path(), page_bytes).unwrap();
            assert_eq!(
                std::fs::read_dir(scratch.path()).unwrap().count(),
                0,
                "the image's file and log are deleted once read"
            );
            assert!(image.len() as u64 <= NEW_DATABASE_PAGES_MAX * u64::from(page_bytes));
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("copy.db");
            std::fs::write(&path, &image).unwrap();
            let c = Connection::open(&path).unwrap();
            let mode: String = c
                .pragma_query_value(None, "journal_mode", |r| r.get(0))
                .unwrap();
            assert_eq!(mode, "wal");
            let size: u32 = c
                .pragma_query_value(None, "page_size", |r| r.get(0))
                .unwrap();
            assert_eq!(size, page_bytes);
            let check: String = c
                .pragma_query_value(None, "integrity_check", |r| r.get(0))
                .unwrap();
            assert_eq!(check, "ok");
            let mut tables: Vec<String> = c
                .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            tables.sort();
            assert_eq!(
                tables,
                ["_wasmkeep_alarm", "_wasmkeep_kv", "_wasmkeep_meta"]
            );
        }
    }

    /// A power cut can keep the image's first page and lose the rest (the
    /// file is written without a sync; nothing in it was acknowledged).
    /// With large pages the torn file is longer than 64 KiB, the bound
    /// before images: it must still read as an interrupted creation.
    #[test]
    fn a_new_database_cut_short_is_set_aside_and_made_again() {
        let limits = StoreLimits {
            page_bytes: 65536,
            ..StoreLimits::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let actor = dir.path().join("a");
        let db = ActorDb::open(&actor, &limits, OpenMode::Create)
            .unwrap()
            .expect("created");
        drop(db);
        let file = actor.join(crate::paths::DB_FILE);
        assert!(std::fs::metadata(&file).unwrap().len() > 2 * 65536);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(2 * 65536)
            .unwrap();
        let none = ActorDb::open(&actor, &limits, OpenMode::Existing).unwrap();
        assert!(none.is_none(), "the torn creation is no actor");
        let mut db = ActorDb::open(&actor, &limits, OpenMode::Create)
            .unwrap()
            .expect("created afresh");
        db.kv_put("k", b"v").unwrap();
        let aside = std::fs::read_dir(&actor)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains("incomplete"))
            .count();
        assert_eq!(aside, 1, "the torn file is kept under another name");
    }
}
