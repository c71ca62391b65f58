//! A frozen actor file (`ActorDb::freeze_file`, ADRs 0036 and 0038) holds
//! still until it is thawed, even when the connection closes: a snapshot
//! or a first upload reading it never sees a checkpoint land mid-read.

mod common;

use common::{count, open};
use wasmkeep_store::{ActorDb, Value};

/// A fresh actor at `dir` with the table the tests fill.
fn fresh(dir: &std::path::Path) -> ActorDb {
    let mut db = open(dir);
    db.begin().unwrap();
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)", &[])
        .unwrap();
    db.commit().unwrap();
    db
}

fn insert(db: &mut ActorDb, from: i64, n: i64) {
    db.begin().unwrap();
    for i in from..from + n {
        db.execute(
            "INSERT INTO t (id, body) VALUES (?, ?)",
            &[Value::Integer(i), Value::Blob(vec![i as u8; 3000])],
        )
        .unwrap();
    }
    db.commit().unwrap();
}

/// Closes an actor that committed since its file was frozen (`frozen`) or
/// thawed; returns whether the file changed at the close.
fn close_after_commits(frozen: bool) -> bool {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    let mut db = fresh(&dir);
    insert(&mut db, 0, 50);
    db.freeze_file().unwrap();
    let file = dir.join("actor.db");
    let before = std::fs::read(&file).unwrap();
    insert(&mut db, 50, 50);
    assert_eq!(
        std::fs::read(&file).unwrap(),
        before,
        "commits go to the log"
    );
    if !frozen {
        db.thaw().unwrap();
    }
    drop(db);
    let changed = std::fs::read(&file).unwrap() != before;
    // Whatever the close did, nothing committed is lost.
    assert_eq!(count(&dir), 100);
    changed
}

#[test]
fn closing_a_frozen_actor_leaves_its_file_as_it_was() {
    assert!(
        !close_after_commits(true),
        "the close checkpointed into a frozen file"
    );
    // The same close once thawed checkpoints, as SQLite does by default:
    // the rule above is what keeps the frozen file still.
    assert!(close_after_commits(false), "a thawed close checkpoints");
}

/// A connection opened while the file is still read (the frozen one closed
/// under it) holds the file too once told to, without checkpointing the
/// log first; thawed, its close checkpoints everything.
#[test]
fn a_connection_that_holds_the_file_leaves_it_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    let mut db = fresh(&dir);
    db.freeze_file().unwrap();
    let file = dir.join("actor.db");
    let before = std::fs::read(&file).unwrap();
    insert(&mut db, 0, 50);
    drop(db);
    let mut again = open(&dir);
    again.hold_file().unwrap();
    insert(&mut again, 50, 400);
    drop(again);
    assert_eq!(std::fs::read(&file).unwrap(), before, "the file moved");
    let again = open(&dir);
    again.thaw().unwrap();
    drop(again);
    assert_ne!(std::fs::read(&file).unwrap(), before);
    assert_eq!(count(&dir), 450);
}
