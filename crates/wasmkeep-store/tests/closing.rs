//! Closing and opening an actor's database (ADR 0076): a short log is left
//! as it is (no checkpoint, no sync at the close), a log file past
//! `LOG_KEPT_AT_CLOSE_BYTES_MAX` is checkpointed into the database and
//! emptied; either way the next open finds every commit. An open runs the
//! runtime's schema only for a database that lacks one of its tables.

mod common;

use std::path::Path;

use common::{count as rows, open};
use wasmkeep_store::db::LOG_KEPT_AT_CLOSE_BYTES_MAX;
use wasmkeep_store::{ActorDb, OpenMode, StoreLimits, Value};

/// One commit of `rows` rows of `bytes` bytes each.
fn insert(db: &mut ActorDb, rows: usize, bytes: usize) {
    db.begin().unwrap();
    db.execute(
        "CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body BLOB)",
        &[],
    )
    .unwrap();
    for _ in 0..rows {
        db.execute(
            "INSERT INTO t (body) VALUES (?)",
            &[Value::Blob(vec![7; bytes])],
        )
        .unwrap();
    }
    db.commit().unwrap();
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

#[test]
fn a_close_leaves_a_short_log_and_the_next_open_reads_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    let mut db = open(&dir);
    for _ in 0..3 {
        insert(&mut db, 1, 100);
    }
    let (file, log) = (dir.join("actor.db"), db.wal_path());
    let before = std::fs::read(&file).unwrap();
    drop(db);
    let kept = len(&log);
    assert!(
        kept > 0 && kept <= LOG_KEPT_AT_CLOSE_BYTES_MAX,
        "the close emptied a short log: {kept} bytes left"
    );
    assert_eq!(
        std::fs::read(&file).unwrap(),
        before,
        "the close checkpointed a short log into the database"
    );
    assert_eq!(rows(&dir), 3);
    // Reopened, the next commits append to the kept log.
    let mut db = open(&dir);
    insert(&mut db, 1, 100);
    drop(db);
    assert!(len(&log) > kept, "the log did not grow from where it was");
    assert_eq!(rows(&dir), 4);
}

#[test]
fn a_close_checkpoints_a_log_past_the_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    let mut db = open(&dir);
    let bytes = 3000;
    let n = (LOG_KEPT_AT_CLOSE_BYTES_MAX as usize / bytes) + 4;
    insert(&mut db, n, bytes);
    let log = db.wal_path();
    assert!(len(&log) > LOG_KEPT_AT_CLOSE_BYTES_MAX);
    drop(db);
    assert_eq!(len(&log), 0, "a long log was left at the close");
    assert_eq!(rows(&dir), n as i64);
}

#[test]
fn an_open_adds_a_runtime_table_the_database_lacks() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    drop(open(&dir));
    // A database from before the alarm's table (made here by dropping it).
    let c = rusqlite::Connection::open(dir.join("actor.db")).unwrap();
    c.execute_batch("DROP TABLE _wasmkeep_alarm").unwrap();
    drop(c);
    let mut db = ActorDb::open(&dir, &StoreLimits::default(), OpenMode::Existing)
        .unwrap()
        .unwrap();
    let alarm = wasmkeep_store::db::AlarmState {
        at_ms: 42,
        retry_count: 0,
    };
    db.begin().unwrap();
    db.set_alarm(Some(alarm)).unwrap();
    db.commit().unwrap();
    assert_eq!(db.alarm().unwrap(), Some(alarm));
}

#[test]
fn a_folded_log_leaves_every_commit_in_the_file_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    let mut db = open(&dir);
    for _ in 0..3 {
        insert(&mut db, 1, 100);
    }
    let log = db.wal_path();
    drop(db);
    assert!(len(&log) > 0);
    wasmkeep_store::db::fold_log(&dir, &StoreLimits::default()).unwrap();
    assert_eq!(len(&log), 0, "the log was not emptied");
    // The file alone, where no log lies beside it, holds every commit.
    let alone = tmp.path().join("b");
    std::fs::create_dir_all(&alone).unwrap();
    std::fs::copy(dir.join("actor.db"), alone.join("actor.db")).unwrap();
    assert_eq!(rows(&alone), 3);
}
