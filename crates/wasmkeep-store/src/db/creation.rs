//! A new actor's database written from an image (ADR 0075).
//!
//! Every new database starts alike: the page size the node is configured
//! with, WAL mode, the runtime's tables and nothing else. SQLite making
//! that file (switching it to WAL, parsing and running each `CREATE
//! TABLE`, committing them) was a fifth of a cold start's CPU (W3). The
//! first creation in the process for a page size has SQLite make such a
//! file once, in the new actor's parent folder, reads it and deletes it;
//! every creation then writes those bytes as the new actor's database file
//! before SQLite opens it.
//!
//! The image is SQLite's own output (no byte of it is set by hand), and
//! the file is written where SQLite used to write its first page: outside
//! the write-ahead log, with no sync, made durable with the new actor's
//! folders by its first batch's `syncfs` (ADR 0074, rule 5). A crash
//! before that leaves an empty file, which `ActorDb::open` takes for no
//! database and writes again, or a short one, which SQLite refuses (its
//! header names more pages) and `ActorDb::open` sets aside.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::{Connection, OpenFlags};

use super::{SCHEMA, open_err};
use crate::error::StoreError;

/// Name of the file the image is made in, inside the first new actor's
/// parent folder (deleted once read; never an actor's name, which is hex).
const IMAGE_FILE: &str = "new-database-image.db";

/// Most images kept: one per page size (powers of two from 512 to 65,536).
const IMAGES_MAX: usize = 8;

/// Images made so far, by page size.
static IMAGES: Mutex<Vec<(u32, Arc<[u8]>)>> = Mutex::new(Vec::new());

/// Creates the database file `path` in the actor's folder `dir` (and the
/// folders missing on the way); returns the folders whose entries changed,
/// which the first batch's `syncfs` must cover.
pub(super) fn create(dir: &Path, path: &Path, page_bytes: u32) -> Result<Vec<PathBuf>, StoreError> {
    let mut missing = Vec::new();
    let mut d = Some(dir);
    while let Some(p) = d {
        if p.exists() {
            break;
        }
        missing.push(p.to_owned());
        d = p.parent();
    }
    // The image first (the first one for a page size is made in the
    // parent folder): nothing is put at the actor's path unless it can be
    // written. Then a spare folder renamed into place, or one made here.
    let parent = dir.parent().unwrap_or(dir);
    std::fs::create_dir_all(parent)?;
    let image = image_for(parent, page_bytes)?;
    if !crate::spare_actors::take(dir)? {
        std::fs::create_dir_all(dir)?;
    }
    // A log beside an empty file (a creation cut short after its first
    // commit reached the page cache but before the image's length reached
    // the disk) holds nothing anyone was told about: the first batch's
    // `syncfs` makes the image durable before its answer. SQLite would
    // delete it at the open; it is kept, under another name.
    let log = path.with_extension("db-wal");
    if std::fs::metadata(&log).is_ok_and(|m| m.len() > 0) {
        let aside = path.with_extension(format!("db-wal.incomplete-{}", crate::clock::unix_ms()));
        std::fs::rename(&log, &aside)?;
        tracing::warn!(log = %log.display(), aside = %aside.display(),
            "set aside the log of a database whose creation was interrupted");
    }
    write_new_database(path, &image)?;
    // The actor's own folder gets the new database file's entry.
    let mut new_dirs = vec![dir.to_owned()];
    for m in &missing {
        if let Some(parent) = m.parent() {
            new_dirs.push(parent.to_owned());
        }
    }
    new_dirs.dedup();
    Ok(new_dirs)
}

/// Writes `image` as a new database at `path`, which must not exist or be
/// empty (a spare folder's file, or a creation interrupted before it was
/// written).
fn write_new_database(path: &Path, image: &[u8]) -> Result<(), StoreError> {
    #[cfg(test)]
    let existed = path.exists();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    if file.metadata()?.len() != 0 {
        return Err(StoreError::Io(format!(
            "a new database's file {} is not empty",
            path.display()
        )));
    }
    #[cfg(test)]
    if !existed {
        crate::commit_log::tests::note(crate::commit_log::tests::Op::Create(path.to_owned()));
    }
    file.write_all(image)?;
    #[cfg(test)]
    crate::commit_log::tests::note(crate::commit_log::tests::Op::Write {
        path: path.to_owned(),
        offset: 0,
        data: image.to_vec(),
    });
    Ok(())
}

/// The image of a new database with `page_bytes`, made in the folder
/// `scratch` if this is the first.
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
    // format's write and read versions, bytes 18 and 19, are 2); a torn
    // copy of it must be told apart by its length (`shorter`), so the
    // header's page count must be valid and match the image.
    let counted = image.len() >= 100 && shorter(&image, image.len() as u64 - 1);
    if image.len() < 100
        || image[18..20] != [2, 2]
        || !counted
        || shorter(&image, image.len() as u64)
    {
        return Err(StoreError::Corrupt(format!(
            "the new-database image SQLite made is not in WAL mode with its pages counted in its header ({} bytes)",
            image.len()
        )));
    }
    Ok(image)
}

/// Whether the database file at `path` is a new database's image with its
/// last pages lost: shorter than the image (for the page size its header
/// names; the image is made in the actor's parent folder if this process
/// has none yet, which a crash can leave there as `IMAGE_FILE`) and every
/// byte it holds the image's. An acknowledged database differs (its
/// commits changed a page it holds); a file from another SQLite version
/// is not recognized. Reads at most the image's length.
pub(super) fn a_cut_short_image(path: &Path) -> bool {
    use std::io::Read;
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    let Ok(len) = file.metadata().map(|m| m.len()) else {
        return false;
    };
    let mut header = [0u8; 100];
    if file.read_exact(&mut header).is_err() {
        return false;
    }
    let page_bytes = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65536,
        n => u32::from(n),
    };
    if !page_bytes.is_power_of_two() || page_bytes < 512 {
        return false;
    }
    let Some(scratch) = path.parent().and_then(Path::parent) else {
        return false;
    };
    let Ok(image) = image_for(scratch, page_bytes) else {
        return false;
    };
    if len >= image.len() as u64 {
        return false;
    }
    let mut rest = Vec::with_capacity(len as usize);
    if file.read_to_end(&mut rest).is_err() || 100 + rest.len() as u64 != len {
        return false;
    }
    image[..100] == header && image[100..len as usize] == rest[..]
}

/// Whether a database file of `len` bytes starting with `header` (at least
/// its first 100 bytes) is shorter than its header says: the header's page
/// count is valid (its change counter matches the version it was written
/// for, as SQLite checks) and more pages than the file holds, which SQLite
/// refuses as corrupt at the open.
fn shorter(header: &[u8], len: u64) -> bool {
    let be32 = |at: usize| u32::from_be_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    let page_bytes = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65536,
        n => u64::from(n),
    };
    let pages = u64::from(be32(28));
    pages != 0 && be32(24) == be32(92) && len < pages * page_bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::{ActorDb, OpenMode};
    use crate::limits::StoreLimits;

    /// Cuts `file` to `len` bytes, as a power cut can leave it.
    fn cut_to(file: &Path, len: u64) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(file)
            .unwrap()
            .set_len(len)
            .unwrap();
    }

    /// Page sizes no other test of this process uses: each image here is
    /// made by this test, not found made.
    #[test]
    fn the_image_is_a_wal_database_sqlite_made_with_the_runtime_tables() {
        for page_bytes in [8192u32, 32768] {
            let scratch = tempfile::tempdir().unwrap();
            let image = image_for(scratch.path(), page_bytes).unwrap();
            assert_eq!(
                std::fs::read_dir(scratch.path()).unwrap().count(),
                0,
                "the image's file and log are deleted once read"
            );
            assert!(!shorter(&image, image.len() as u64));
            assert!(
                shorter(&image, image.len() as u64 - 1),
                "a torn copy is told apart"
            );
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
            // What an open asks for before it skips the schema: every
            // table the schema makes, no fewer.
            let mut asked: Vec<String> = crate::db::RUNTIME_TABLES
                .iter()
                .map(|t| t.to_string_lossy().into_owned())
                .collect();
            asked.sort();
            assert_eq!(asked, tables);
        }
    }

    /// A power cut can keep the image's first page and lose the rest (the
    /// file is written without a sync; nothing in it was acknowledged).
    /// With large pages the torn file is longer than 64 KiB, the bound on
    /// a torn first page: it must still read as an interrupted creation.
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
        cut_to(&file, 2 * 65536);
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

    /// A crash after the file was made and before the image was written
    /// leaves it empty, which SQLite would open as an empty database of
    /// its default page size: it is no actor, and a creation writes the
    /// image into it.
    #[test]
    fn an_empty_database_file_is_made_again_in_place() {
        let dir = tempfile::tempdir().unwrap();
        empty_file_made_again(&dir.path().join("a"), None);
    }

    /// An empty `actor.db` (and `log` beside it, if any) in `actor`: no
    /// actor is found there, and a creation makes one of the app's page
    /// size, not SQLite's default.
    fn empty_file_made_again(actor: &std::path::Path, log: Option<&[u8]>) {
        let limits = StoreLimits {
            page_bytes: 16384,
            ..StoreLimits::default()
        };
        std::fs::create_dir_all(actor).unwrap();
        std::fs::write(actor.join(crate::paths::DB_FILE), b"").unwrap();
        if let Some(log) = log {
            std::fs::write(actor.join("actor.db-wal"), log).unwrap();
        }
        let none = ActorDb::open(actor, &limits, OpenMode::Existing).unwrap();
        assert!(none.is_none(), "an empty file is no actor");
        let mut db = ActorDb::open(actor, &limits, OpenMode::Create)
            .unwrap()
            .expect("created");
        assert!(db.created(), "counted as a creation");
        db.kv_put("k", b"v").unwrap();
        let size: u32 = db
            .conn_for_tests()
            .pragma_query_value(None, "page_size", |r| r.get(0))
            .unwrap();
        assert_eq!(size, 16384, "the app's page size, not SQLite's default");
    }

    /// Only a new database's image cut short is set aside: an acknowledged
    /// database cut short the same way (its first page changed by its
    /// commits) is refused, never replaced by an empty one.
    #[test]
    fn a_used_database_cut_short_is_refused_not_replaced() {
        let limits = StoreLimits {
            page_bytes: 65536,
            ..StoreLimits::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let actor = dir.path().join("a");
        let mut db = ActorDb::open(&actor, &limits, OpenMode::Create)
            .unwrap()
            .expect("created");
        db.begin().unwrap();
        db.conn_for_tests()
            .execute_batch("CREATE TABLE t (v); INSERT INTO t VALUES (zeroblob(200000));")
            .unwrap();
        db.commit().unwrap();
        drop(db);
        let file = actor.join(crate::paths::DB_FILE);
        assert!(std::fs::metadata(&file).unwrap().len() > 3 * 65536);
        cut_to(&file, 2 * 65536);
        assert!(ActorDb::open(&actor, &limits, OpenMode::Existing).is_err());
        assert_eq!(
            std::fs::metadata(&file).unwrap().len(),
            2 * 65536,
            "left as it is"
        );
    }

    /// A log beside an empty database file (a creation cut short after its
    /// first commit reached the page cache) holds nothing acknowledged:
    /// SQLite would delete it at the open and make an empty database of its
    /// default page size. The creation is made again and the log kept
    /// under another name.
    #[test]
    fn an_empty_database_file_with_a_log_is_made_again_and_the_log_kept() {
        let dir = tempfile::tempdir().unwrap();
        let actor = dir.path().join("a");
        empty_file_made_again(&actor, Some(&[7u8; 4096]));
        let kept: Vec<Vec<u8>> = std::fs::read_dir(&actor)
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .contains("db-wal.incomplete")
            })
            .map(|e| std::fs::read(e.path()).unwrap())
            .collect();
        assert_eq!(kept, [vec![7u8; 4096]], "the log, kept as it was");
    }
}
