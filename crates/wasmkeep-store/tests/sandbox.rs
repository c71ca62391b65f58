//! The guest SQL sandbox, events as savepoints, and limits, against real
//! SQLite files.

use wasmkeep_store::{ActorDb, KvListOptions, OpenMode, StoreError, StoreLimits, Value};

fn open(limits: StoreLimits) -> (tempfile::TempDir, ActorDb) {
    let dir = tempfile::tempdir().unwrap();
    let db = ActorDb::open(&dir.path().join("a"), &limits, OpenMode::Create)
        .unwrap()
        .unwrap();
    (dir, db)
}

fn code(r: Result<impl std::fmt::Debug, StoreError>) -> &'static str {
    r.expect_err("expected an error").code()
}

#[test]
fn guest_sql_cannot_touch_internal_tables_or_escape() {
    let (_d, mut db) = open(StoreLimits::default());
    db.kv_put("secret", b"x").unwrap();
    for sql in [
        "SELECT * FROM _wasmkeep_kv",
        "SELECT * FROM _WASMKEEP_KV",
        "DELETE FROM _wasmkeep_alarm",
        "INSERT INTO _wasmkeep_meta VALUES ('initialized_ms', '1')",
        "DROP TABLE _wasmkeep_kv",
        "ATTACH DATABASE '/tmp/x.db' AS x",
        "BEGIN",
        "COMMIT",
        "SAVEPOINT s",
        "PRAGMA synchronous = OFF",
        "PRAGMA journal_mode = DELETE",
        "PRAGMA writable_schema = 1",
        "CREATE TEMP TABLE t (x)",
        "SELECT load_extension('x')",
    ] {
        let r = db.execute(sql, &[]);
        assert!(
            matches!(r, Err(StoreError::Forbidden(_)) | Err(StoreError::Sql(_))),
            "{sql} was allowed: {r:?}"
        );
    }
    // A view over an internal table may be created, but never read.
    let _ = db.execute("CREATE VIEW v AS SELECT * FROM _wasmkeep_kv", &[]);
    assert!(db.query("SELECT * FROM v", &[]).is_err());
    // A view created over a guest table cannot be used to reach internal data
    // through a trigger either.
    db.execute("CREATE TABLE t (x)", &[]).unwrap();
    let created = db
        .execute(
            "CREATE TRIGGER tr AFTER INSERT ON t BEGIN DELETE FROM _wasmkeep_kv; END",
            &[],
        )
        .is_ok();
    let r = db.execute("INSERT INTO t VALUES (1)", &[]);
    if created {
        assert_eq!(code(r), "forbidden");
    }
    assert_eq!(db.kv_get("secret").unwrap().as_deref(), Some(&b"x"[..]));
    // Read-only introspection is fine.
    db.query("PRAGMA table_info(t)", &[]).unwrap();
}

#[test]
fn forbidden_errors_say_why() {
    let (_d, mut db) = open(StoreLimits::default());
    let e = db.query("SELECT * FROM _wasmkeep_kv", &[]).unwrap_err();
    assert_eq!(e.code(), "forbidden");
    assert!(e.to_string().contains("_wasmkeep_kv"), "{e}");
}

#[test]
fn a_failed_event_rolls_back_alone() {
    let (_d, mut db) = open(StoreLimits::default());
    db.execute("CREATE TABLE t (x)", &[]).unwrap();
    db.begin().unwrap();
    db.event_begin().unwrap();
    db.execute("INSERT INTO t VALUES (1)", &[]).unwrap();
    db.event_commit().unwrap();
    db.event_begin().unwrap();
    db.execute("INSERT INTO t VALUES (2)", &[]).unwrap();
    db.kv_put("k", b"v").unwrap();
    db.event_rollback().unwrap();
    db.event_begin().unwrap();
    db.execute("INSERT INTO t VALUES (3)", &[]).unwrap();
    db.event_commit().unwrap();
    db.commit().unwrap();
    let r = db.query("SELECT x FROM t ORDER BY x", &[]).unwrap();
    assert_eq!(
        r.rows,
        vec![vec![Value::Integer(1)], vec![Value::Integer(3)]]
    );
    assert_eq!(db.kv_get("k").unwrap(), None);
}

#[test]
fn a_value_that_outgrows_the_limit_fails_only_its_own_write() {
    // The second seed's outage: one stored value grows each event until a
    // write fails; the event that shrinks it must still succeed.
    let limits = StoreLimits {
        value_bytes_max: 64 * 1024,
        ..StoreLimits::default()
    };
    let (_d, mut db) = open(limits);
    db.execute(
        "CREATE TABLE watches (id INTEGER PRIMARY KEY, history BLOB)",
        &[],
    )
    .unwrap();
    let mut size = 1024;
    let mut failed_at = None;
    for i in 0..200 {
        db.event_begin().unwrap();
        let r = db.execute(
            "INSERT OR REPLACE INTO watches VALUES (1, ?1)",
            &[Value::Blob(vec![7; size])],
        );
        match r {
            Ok(_) => db.event_commit().unwrap(),
            Err(e) => {
                assert_eq!(e.code(), "value_too_large", "{e}");
                assert!(e.to_string().contains("value_bytes_max"), "{e}");
                db.event_rollback().unwrap();
                failed_at = Some(i);
                break;
            }
        }
        size += 1024;
    }
    assert!(failed_at.is_some(), "the value never hit the limit");
    // The shrinking write succeeds, and so does an unrelated one.
    db.execute("UPDATE watches SET history = substr(history, 1, 10)", &[])
        .unwrap();
    db.kv_put("other", b"still writable").unwrap();
    let too_big = vec![0u8; 64 * 1024];
    assert_eq!(code(db.kv_put("k", &too_big)), "value_too_large");
    db.kv_put("k", &too_big[..1000]).unwrap();
}

#[test]
fn limits_name_themselves() {
    let limits = StoreLimits {
        sql_bytes_max: 100,
        sql_params_max: 3,
        key_bytes_max: 8,
        ..StoreLimits::default()
    };
    let (_d, mut db) = open(limits);
    let long = format!("SELECT 1 {}", " ".repeat(200));
    let e = db.query(&long, &[]).unwrap_err();
    assert_eq!(e.code(), "statement_too_large");
    assert!(e.to_string().contains("sql_bytes_max=100"));
    let e = db
        .query("SELECT ?, ?, ?, ?", &vec![Value::Null; 4])
        .unwrap_err();
    assert_eq!(e.code(), "too_many_parameters");
    let e = db.kv_put("123456789", b"").unwrap_err();
    assert_eq!(e.code(), "key_too_large");
    assert!(e.to_string().contains("key_bytes_max=8"));
}

#[test]
fn database_size_limit_is_a_clear_error_and_deleting_still_works() {
    let limits = StoreLimits {
        database_bytes_max: 256 * 1024,
        ..StoreLimits::default()
    };
    let (_d, mut db) = open(limits);
    db.execute("CREATE TABLE t (x BLOB)", &[]).unwrap();
    let mut err = None;
    for _ in 0..100 {
        if let Err(e) = db.execute("INSERT INTO t VALUES (zeroblob(16000))", &[]) {
            err = Some(e);
            break;
        }
    }
    let e = err.expect("the database never filled");
    assert_eq!(e.code(), "database_full", "{e}");
    assert!(e.to_string().contains("database_bytes_max"));
    db.execute("DELETE FROM t", &[]).unwrap();
    db.execute("INSERT INTO t VALUES (zeroblob(16000))", &[])
        .unwrap();
}

#[test]
fn kv_lists_by_prefix_range_limit_and_reverse() {
    let (_d, mut db) = open(StoreLimits::default());
    for k in ["a", "b/1", "b/2", "b/3", "c", "bz"] {
        db.kv_put(k, k.as_bytes()).unwrap();
    }
    let keys = |o: KvListOptions, db: &mut ActorDb| -> Vec<String> {
        db.kv_list(&o)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    };
    let prefix = KvListOptions {
        prefix: Some("b/".into()),
        ..Default::default()
    };
    assert_eq!(keys(prefix.clone(), &mut db), ["b/1", "b/2", "b/3"]);
    let rev = KvListOptions {
        reverse: true,
        limit: Some(2),
        ..prefix.clone()
    };
    assert_eq!(keys(rev, &mut db), ["b/3", "b/2"]);
    let range = KvListOptions {
        start: Some("b/2".into()),
        end: Some("c".into()),
        ..Default::default()
    };
    assert_eq!(keys(range, &mut db), ["b/2", "b/3", "bz"]);
    assert!(db.kv_delete("a").unwrap());
    assert!(!db.kv_delete("a").unwrap());
}

#[test]
fn existing_mode_does_not_create() {
    let dir = tempfile::tempdir().unwrap();
    let r = ActorDb::open(
        &dir.path().join("x"),
        &StoreLimits::default(),
        OpenMode::Existing,
    )
    .unwrap();
    assert!(r.is_none());
    assert!(!dir.path().join("x").exists());
}

#[test]
fn an_interrupted_creation_is_set_aside_but_real_data_never_is() {
    let dir = tempfile::tempdir().unwrap();
    let actor = dir.path().join("a");
    std::fs::create_dir_all(&actor).unwrap();
    // A torn first page and no log: what a crash mid-creation can leave.
    std::fs::write(actor.join("actor.db"), vec![0xA5u8; 4096]).unwrap();
    // There is no actor: an alarm-only open finds none...
    let none = ActorDb::open(&actor, &StoreLimits::default(), OpenMode::Existing).unwrap();
    assert!(none.is_none());
    // ...and a request creates it afresh.
    let mut db = ActorDb::open(&actor, &StoreLimits::default(), OpenMode::Create)
        .unwrap()
        .expect("created afresh");
    db.kv_put("k", b"v").unwrap();
    let aside: Vec<_> = std::fs::read_dir(&actor)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("incomplete"))
        .collect();
    assert_eq!(aside.len(), 1, "the torn file is kept, under another name");

    // The same torn page with committed frames in the log is real data
    // gone bad: refused, never replaced.
    let other = dir.path().join("b");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("actor.db"), vec![0xA5u8; 4096]).unwrap();
    std::fs::write(other.join("actor.db-wal"), vec![1u8; 8192]).unwrap();
    let r = ActorDb::open(&other, &StoreLimits::default(), OpenMode::Existing);
    assert!(
        r.is_err(),
        "a damaged database with a log must not be replaced"
    );
    assert!(other.join("actor.db").exists());
}

/// An open actor holds its file (locking_mode=EXCLUSIVE): inspection goes
/// through its own connection, which must read everything, internal tables
/// included, and change nothing, not even the connection's transaction
/// state or settings.
#[test]
fn inspection_through_the_open_connection_reads_and_changes_nothing() {
    let (d, mut db) = open(StoreLimits::default());
    db.begin().unwrap();
    db.execute("CREATE TABLE t (x)", &[]).unwrap();
    db.execute("INSERT INTO t VALUES (1)", &[]).unwrap();
    db.set_alarm(Some(wasmkeep_store::AlarmState {
        at_ms: 42,
        retry_count: 0,
    }))
    .unwrap();
    db.commit().unwrap();

    let r = db
        .inspect(
            "SELECT at_ms FROM _wasmkeep_alarm",
            &wasmkeep_store::InspectBounds::rows(10),
        )
        .unwrap();
    assert_eq!(r.rows, vec![vec![Value::Integer(42)]]);
    assert_eq!(
        db.inspect(
            "PRAGMA table_info(t)",
            &wasmkeep_store::InspectBounds::rows(10)
        )
        .unwrap()
        .rows
        .len(),
        1
    );
    for sql in [
        "BEGIN",
        "SAVEPOINT s",
        "INSERT INTO t VALUES (2)",
        "DELETE FROM _wasmkeep_alarm",
        "PRAGMA journal_mode = DELETE",
        "PRAGMA locking_mode = NORMAL",
        "PRAGMA wal_checkpoint",
        "PRAGMA user_version = 3",
        "SELECT load_extension('x')",
    ] {
        let r = db.inspect(sql, &wasmkeep_store::InspectBounds::rows(10));
        assert_eq!(
            r.as_ref().map(|_| ()).map_err(|e| e.code()),
            Err("forbidden"),
            "`{sql}` should be refused: {r:?}"
        );
        assert!(!db.in_transaction(), "`{sql}` left a transaction open");
    }
    // The guest's own statements are unaffected by the inspection mode.
    db.begin().unwrap();
    db.execute("INSERT INTO t VALUES (3)", &[]).unwrap();
    db.commit().unwrap();
    assert_eq!(
        db.inspect(
            "SELECT count(*) FROM t",
            &wasmkeep_store::InspectBounds::rows(1)
        )
        .unwrap()
        .rows,
        vec![vec![Value::Integer(2)]]
    );

    // Meanwhile nobody else can read the file; once it is closed, they can.
    let path = d.path().join("a").join("actor.db");
    assert!(matches!(
        wasmkeep_store::db::read_alarm(&path),
        Err(StoreError::Busy)
    ));
    drop(db);
    assert_eq!(
        wasmkeep_store::db::read_alarm(&path)
            .unwrap()
            .map(|a| a.at_ms),
        Some(42)
    );
    let closed = wasmkeep_store::db::inspect_query(
        &path,
        "INSERT INTO t VALUES (9)",
        &wasmkeep_store::InspectBounds::rows(1),
    );
    assert_eq!(closed.map(|_| ()).map_err(|e| e.code()), Err("forbidden"));
}

/// Closing and opening an actor again frees and makes no inode (ADR 0031):
/// its log file stays when it closes, as it was if short (ADR 0076),
/// emptied if long.
#[test]
fn closing_an_actor_keeps_its_log_file() {
    use std::os::unix::fs::MetadataExt;
    let (d, mut db) = open(StoreLimits::default());
    let dir = d.path().join("a");
    let names = || {
        let mut n: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(), ["actor.db", "actor.db-wal"]);
    db.begin().unwrap();
    db.kv_put("k", b"v").unwrap();
    db.commit().unwrap();
    let wal = dir.join("actor.db-wal");
    let inode = std::fs::metadata(&wal).unwrap().ino();
    drop(db);
    // A short log is left as it is (ADR 0076).
    let after = std::fs::metadata(&wal).unwrap();
    assert_eq!(after.ino(), inode);
    assert!(after.len() > 0);
    let mut db = ActorDb::open(&dir, &StoreLimits::default(), OpenMode::Existing)
        .unwrap()
        .unwrap();
    assert_eq!(db.kv_get("k").unwrap().as_deref(), Some(&b"v"[..]));
    assert_eq!(std::fs::metadata(&wal).unwrap().ino(), inode);
    // A long one is checkpointed and the file emptied, not deleted.
    db.begin().unwrap();
    db.kv_put(
        "big",
        &vec![7u8; wasmkeep_store::db::LOG_KEPT_AT_CLOSE_BYTES_MAX as usize + 4096],
    )
    .unwrap();
    db.commit().unwrap();
    drop(db);
    let after = std::fs::metadata(&wal).unwrap();
    assert_eq!((after.ino(), after.len()), (inode, 0));
    assert_eq!(names(), ["actor.db", "actor.db-wal"]);
}

/// Zeros written past the log's end ahead of an alarm (W2) are never read
/// as frames: a copy of the files taken while the actor is open (what a
/// crash leaves) holds exactly the committed rows, before and after a
/// commit that appends over the zeros.
#[test]
fn a_log_extended_with_zeros_recovers_exactly_what_was_committed() {
    let (d, mut db) = open(StoreLimits::default());
    db.execute("CREATE TABLE t (x)", &[]).unwrap();
    let dir = d.path().join("a");
    let crash_copy = |name: &str| {
        let to = d.path().join(name);
        std::fs::create_dir_all(&to).unwrap();
        for f in ["actor.db", "actor.db-wal"] {
            std::fs::copy(dir.join(f), to.join(f)).unwrap();
        }
        let copy = ActorDb::open(&to, &StoreLimits::default(), OpenMode::Existing)
            .unwrap()
            .unwrap();
        let rows = copy
            .inspect(
                "SELECT count(*) FROM t",
                &wasmkeep_store::InspectBounds::rows(10),
            )
            .unwrap()
            .rows;
        let ok = copy
            .inspect(
                "PRAGMA integrity_check",
                &wasmkeep_store::InspectBounds::rows(10),
            )
            .unwrap()
            .rows;
        (rows, ok)
    };
    let want = 32 + 4 * (24 + 4096);
    let wal_len = |db: &ActorDb| std::fs::metadata(db.wal_path()).unwrap().len();
    let reopen = |db: ActorDb| {
        // Closed with its log checkpointed and emptied (a close alone
        // leaves a short log as it is, ADR 0076).
        db.freeze_file().unwrap();
        drop(db);
        ActorDb::open(&dir, &StoreLimits::default(), OpenMode::Existing)
            .unwrap()
            .unwrap()
    };
    let insert = |db: &mut ActorDb, x: i64| {
        db.begin().unwrap();
        db.execute("INSERT INTO t VALUES (?1)", &[Value::Integer(x)])
            .unwrap();
        db.commit().unwrap();
    };
    let ok = vec![vec![Value::Text("ok".into())]];
    // An actor opened ahead of its alarm: an empty log.
    db = reopen(db);
    assert!(wal_len(&db) < want);
    db.extend_log_ahead(4).unwrap();
    assert_eq!(wal_len(&db), want);
    assert_eq!(
        crash_copy("empty"),
        (vec![vec![Value::Integer(0)]], ok.clone())
    );
    insert(&mut db, 1);
    assert_eq!(
        crash_copy("empty-then-commit"),
        (vec![vec![Value::Integer(1)]], ok.clone())
    );
    // An actor still open since its last commits: the zeros go after them.
    db = reopen(db);
    insert(&mut db, 2);
    let before = wal_len(&db);
    assert!(before > 0 && before < want, "{before}");
    db.extend_log_ahead(4).unwrap();
    assert_eq!(wal_len(&db), want);
    assert_eq!(
        crash_copy("frames"),
        (vec![vec![Value::Integer(2)]], ok.clone())
    );
    insert(&mut db, 3);
    assert_eq!(
        crash_copy("frames-then-commit"),
        (vec![vec![Value::Integer(3)]], ok)
    );
}
