//! The size an actor's database reports between transactions comes from
//! the last commit frame its log was given (`WalIndex::committed_pages`),
//! not from SQLite: these tests hold it to SQLite's own `PRAGMA
//! page_count` after every kind of change.

use super::*;
use crate::commit_log::tests::{FAIL_RECORD, FailRecord};

/// SQLite's own size of `db`'s database, through its connection.
fn sqlites(db: &ActorDb) -> u64 {
    let pages: i64 = db
        .conn
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .unwrap();
    pages as u64 * db.page_size
}

/// What `size_bytes` answers, held to SQLite's count, and whether it came
/// from the log's commit frames rather than from SQLite.
fn check(db: &ActorDb, after: &str) -> u64 {
    let tracked = db.wal_index.as_ref().and_then(WalIndex::committed_pages);
    let size = db.size_bytes().unwrap();
    assert_eq!(size, sqlites(db), "after {after}");
    assert_eq!(
        tracked.map(|p| u64::from(p) * db.page_size),
        Some(size),
        "after {after}: known without asking SQLite"
    );
    size
}

/// A new actor's database in `dir`, under the default limits.
fn new_actor(dir: &Path) -> ActorDb {
    ActorDb::open(&dir.join("a"), &StoreLimits::default(), OpenMode::Create)
        .unwrap()
        .unwrap()
}

/// `sql` in a transaction of its own.
fn batch(db: &mut ActorDb, sql: &str) {
    db.begin().unwrap();
    db.execute(sql, &[]).unwrap();
    db.commit().unwrap();
}

#[test]
fn the_size_between_transactions_is_sqlites_after_growing_shrinking_and_rolling_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut db = new_actor(dir.path());
    // Known once read (a new database's log has no commit frame yet).
    db.size_bytes().unwrap();
    let new = check(&db, "the open");
    batch(&mut db, "CREATE TABLE t(x)");
    batch(
        &mut db,
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300) \
         INSERT INTO t SELECT zeroblob(3000) FROM n",
    );
    let grown = check(&db, "300 rows of 3,000 bytes");
    assert!(grown > new + 300 * 3000, "{grown} after {new}");
    // A transaction that spills pages into the log and rolls back: its
    // frames carry no commit, the size stays.
    db.conn.execute_batch("PRAGMA cache_size = 4").unwrap();
    let log_before = std::fs::metadata(db.wal_path()).unwrap().len();
    db.begin().unwrap();
    db.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300) \
         INSERT INTO t SELECT zeroblob(3000) FROM n",
        &[],
    )
    .unwrap();
    // Inside the transaction the size is SQLite's, growth included.
    let inside = db.size_bytes().unwrap();
    assert_eq!(inside, sqlites(&db));
    assert!(inside > grown, "{inside} inside, {grown} before");
    assert!(
        std::fs::metadata(db.wal_path()).unwrap().len() > log_before,
        "the transaction spilled frames into the log"
    );
    db.rollback();
    assert_eq!(check(&db, "a rolled back transaction that spilled"), grown);
    batch(&mut db, "DELETE FROM t");
    assert_eq!(check(&db, "deleting every row (pages kept free)"), grown);
    // VACUUM builds the new file in an attached temporary database.
    db.conn.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 1).unwrap();
    db.conn.execute_batch("VACUUM").unwrap();
    let vacuumed = check(&db, "VACUUM");
    assert!(vacuumed < grown, "{vacuumed} after {grown}");
    // The log starts over after a checkpoint that copied all of it.
    db.conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    batch(&mut db, "INSERT INTO t VALUES (zeroblob(20000))");
    assert!(check(&db, "a commit into a log started over") > vacuumed);
}

#[test]
fn a_failed_statement_makes_the_size_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut db = new_actor(dir.path());
    batch(&mut db, "CREATE TABLE t(x)");
    check(&db, "a commit");
    db.begin().unwrap();
    assert!(db.execute("INSERT INTO missing VALUES (1)", &[]).is_err());
    db.rollback();
    assert_eq!(
        db.wal_index.as_ref().and_then(WalIndex::committed_pages),
        None,
        "forgotten after the failure"
    );
    assert_eq!(db.size_bytes().unwrap(), sqlites(&db));
}

/// A commit that fails after its commit frame's header was given to the
/// log (here a failed commit log refuses the write that completes the
/// frame) leaves that header's size with the VFS but not in the database:
/// the size must be SQLite's again. And after the restart the failed log
/// asks for, the commit is not found in the actor's log.
#[test]
fn a_commit_failing_after_its_commit_frame_leaves_sqlites_size() {
    let run = tempfile::tempdir().unwrap();
    let root = run.path();
    let (log, _) = crate::commit_log::CommitLog::start(root).unwrap();
    let mut db = new_actor(&root.join("actors"));
    batch(&mut db, "CREATE TABLE t(x)");
    let before = check(&db, "a commit");
    let fail = &crate::commit_log::tests::FAIL_SYNCFS;
    fail.set(true);
    let cut = log.cut_now();
    fail.set(false);
    assert!(cut.is_err(), "the injected failure fails the log");
    db.begin().unwrap();
    db.execute("INSERT INTO t VALUES (zeroblob(50000))", &[])
        .unwrap();
    assert!(db.commit().is_err(), "the log refuses the commit's records");
    db.rollback();
    assert_eq!(
        db.wal_index.as_ref().and_then(WalIndex::committed_pages),
        None,
        "the failed commit's size is forgotten"
    );
    assert_eq!(db.size_bytes().unwrap(), sqlites(&db));
    assert_eq!(db.size_bytes().unwrap(), before, "nothing was committed");
    // The restart the failed log asks for: replay, then the actor again.
    // The refused commit must not be found in its log by SQLite.
    drop(db);
    drop(log);
    let (_log, _) = crate::commit_log::CommitLog::start(root).unwrap();
    let db = new_actor(&root.join("actors"));
    let rows: i64 = db
        .conn
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        rows, 0,
        "the commit that failed came back after the restart"
    );
}

#[test]
fn a_reopened_actor_reads_its_size_again_and_then_follows_its_commits() {
    let dir = tempfile::tempdir().unwrap();
    let mut db = new_actor(dir.path());
    batch(&mut db, "CREATE TABLE t(x)");
    batch(&mut db, "INSERT INTO t VALUES (zeroblob(50000))");
    let before = check(&db, "a commit");
    drop(db);
    let mut db = new_actor(dir.path());
    assert_eq!(
        db.wal_index.as_ref().and_then(WalIndex::committed_pages),
        None,
        "a new connection knows nothing yet"
    );
    assert_eq!(db.size_bytes().unwrap(), before);
    batch(&mut db, "INSERT INTO t VALUES (zeroblob(50000))");
    assert!(check(&db, "a commit after the reopen") > before);
}

/// The rows found after the restart that follows a commit of `sql` whose
/// write to the actor's log reached the file and was then refused by the
/// commit log (failed meanwhile, by another thread) as `fail` says, under
/// `rules`; `None` if no write of the commit was refused.
fn rows_after_a_record_refused_past_the_file(
    rules: crate::commit_log::UnsafeRules,
    fail: FailRecord,
    sql: &str,
) -> Option<i64> {
    let run = tempfile::tempdir().unwrap();
    let root = run.path();
    let (log, _) = crate::commit_log::CommitLog::start(root).unwrap();
    let mut db = new_actor(&root.join("actors"));
    batch(&mut db, "CREATE TABLE t(x)");
    crate::commit_log::UNSAFE_RULES.set(rules);
    FAIL_RECORD.set(fail);
    db.begin().unwrap();
    db.execute(sql, &[]).unwrap();
    let committed = db.commit();
    let refused = FAIL_RECORD.replace(FailRecord::No) == FailRecord::No;
    crate::commit_log::UNSAFE_RULES.set(crate::commit_log::UnsafeRules::default());
    if !refused {
        assert!(committed.is_ok());
        return None;
    }
    assert!(committed.is_err(), "the refused record fails the commit");
    db.rollback();
    // The restart the failed log asks for: replay, then the actor again.
    drop(db);
    drop(log);
    let (_log, _) = crate::commit_log::CommitLog::start(root).unwrap();
    let db = new_actor(&root.join("actors"));
    Some(
        db.conn
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap(),
    )
}

/// The first of the commits of a growing blob whose last page is written
/// apart from its frame's header (the log's writes are gathered up to 64
/// KiB, so a commit of 16 frames of 4 KiB pages ends with a write of the
/// last page alone), refused when that write is all zeros; the rows after
/// the restart.
fn rows_after_a_refused_page_of_zeros(rules: crate::commit_log::UnsafeRules) -> i64 {
    for bytes in (20_000..=200_000).step_by(1_000) {
        let sql = format!("INSERT INTO t VALUES (zeroblob({bytes}))");
        if let Some(rows) =
            rows_after_a_record_refused_past_the_file(rules, FailRecord::NextOfZeros, &sql)
        {
            return rows;
        }
    }
    panic!("no commit ended with a write of zeros alone");
}

/// A write the log refused after it reached the actor's log is taken back
/// (its bits flipped, synced): the commit that returned an error is not
/// found after the restart.
#[test]
fn a_write_refused_after_it_reached_the_file_is_taken_back() {
    let sql = "INSERT INTO t VALUES (1)";
    let rows = rows_after_a_record_refused_past_the_file(Default::default(), FailRecord::Next, sql);
    assert_eq!(
        rows,
        Some(0),
        "the commit that failed came back after the restart"
    );
    // A refused write of zeros (taken back as zeros, it would stay as it was).
    assert_eq!(rows_after_a_refused_page_of_zeros(Default::default()), 0);
}

#[test]
fn a_refused_write_left_in_the_file_brings_its_failed_commit_back() {
    let rules = crate::commit_log::UnsafeRules {
        keep_refused_writes: true,
        ..Default::default()
    };
    let sql = "INSERT INTO t VALUES (1)";
    assert_eq!(
        rows_after_a_record_refused_past_the_file(rules, FailRecord::Next, sql),
        Some(1)
    );
    assert_eq!(rows_after_a_refused_page_of_zeros(rules), 1);
}
