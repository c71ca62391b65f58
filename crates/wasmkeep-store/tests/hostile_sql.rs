//! Guest SQL as an attacker writes it, against real SQLite files: the
//! allow-lists, the hardened connection settings, the deadline on every
//! statement and the per-statement memory and temp-file budgets (ADR 0032).
//!
//! Each safety rule is shown twice where that can be done safely: the
//! attack succeeds on a plain SQLite connection (the unsafe variant), and
//! fails on an actor's.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use wasmkeep_store::sandbox::{
    GUEST_FUNCTIONS, GUEST_PRAGMAS, GUEST_TABLE_FUNCTIONS, GUEST_VTAB_MODULES,
};
use wasmkeep_store::{ActorDb, OpenMode, StoreError, StoreLimits, Value};

fn open(limits: StoreLimits) -> (tempfile::TempDir, ActorDb) {
    let dir = tempfile::tempdir().unwrap();
    let db = ActorDb::open(&dir.path().join("a"), &limits, OpenMode::Create)
        .unwrap()
        .unwrap();
    (dir, db)
}

fn forbidden_naming(r: Result<impl std::fmt::Debug, StoreError>, name: &str) {
    match r {
        Err(StoreError::Forbidden(m)) => assert!(m.contains(name), "{m} does not name {name}"),
        other => panic!("expected forbidden naming `{name}`, got {other:?}"),
    }
}

const FOREVER: &str =
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c";

#[test]
fn fts3_tokenizer_leaks_an_address_on_plain_sqlite_and_is_unreachable_for_guests() {
    // The unsafe variant: a plain connection hands out a native address.
    let plain = rusqlite::Connection::open_in_memory().unwrap();
    // (SQLite hands the address out when the name is a bound parameter.)
    let leaked: Vec<u8> = plain
        .query_row("SELECT fts3_tokenizer(?1)", ["simple"], |r| r.get(0))
        .unwrap();
    assert_eq!(leaked.len(), std::mem::size_of::<usize>());

    let (_d, mut db) = open(StoreLimits::default());
    forbidden_naming(
        db.query("SELECT fts3_tokenizer('simple')", &[]),
        "fts3_tokenizer",
    );
    forbidden_naming(
        db.query("SELECT fts3_tokenizer(?1)", &[Value::Text("simple".into())]),
        "fts3_tokenizer",
    );
    let pointer = Value::Blob(0x4141_4141_4141_4141u64.to_le_bytes().to_vec());
    forbidden_naming(
        db.query("SELECT fts3_tokenizer('evil', ?1)", &[pointer]),
        "fts3_tokenizer",
    );
    forbidden_naming(
        db.execute("CREATE VIRTUAL TABLE t USING fts4(tokenize=simple)", &[]),
        "fts4",
    );
    forbidden_naming(
        db.execute("CREATE VIRTUAL TABLE t USING fts3(x)", &[]),
        "fts3",
    );
    // Through a view, the function is refused when the view is used.
    let _ = db.execute("CREATE VIEW v AS SELECT fts3_tokenizer('simple') AS p", &[]);
    assert!(db.query("SELECT p FROM v", &[]).is_err());
}

#[test]
fn hardening_alone_makes_fts3_tokenizer_fail_where_no_authorizer_asks() {
    // A forged database's schema is parsed without the authorizer being
    // asked; the hardened connection has no working fts3_tokenizer at all.
    let c = rusqlite::Connection::open_in_memory().unwrap();
    wasmkeep_store::sandbox::harden(&c).unwrap();
    for sql in [
        "SELECT fts3_tokenizer('simple')",
        "SELECT fts3_tokenizer('x', x'4141414141414141')",
    ] {
        let e = c
            .query_row(sql, [], |r| r.get::<_, Vec<u8>>(0))
            .unwrap_err();
        assert!(e.to_string().contains("not available"), "{sql}: {e}");
    }
}

#[test]
fn shadow_tables_are_read_only_to_guests_but_writable_on_plain_sqlite() {
    let plain = rusqlite::Connection::open_in_memory().unwrap();
    plain
        .execute_batch(
            "CREATE VIRTUAL TABLE t USING fts5(body); INSERT INTO t_data VALUES (99, x'00');",
        )
        .expect("without DEFENSIVE a shadow table takes any write");

    let (_d, mut db) = open(StoreLimits::default());
    db.execute("CREATE VIRTUAL TABLE t USING fts5(body)", &[])
        .unwrap();
    db.execute("INSERT INTO t (body) VALUES ('hello world')", &[])
        .unwrap();
    let e = db
        .execute("INSERT INTO t_data VALUES (99, x'00')", &[])
        .unwrap_err();
    assert_eq!(e.code(), "sql_error", "{e}");
    let hits = db
        .query("SELECT count(*) FROM t WHERE t MATCH 'hello'", &[])
        .unwrap();
    assert_eq!(hits.rows[0][0], Value::Integer(1));
}

#[test]
fn functions_outside_the_allow_list_are_refused_and_inside_it_are_not() {
    let (_d, mut db) = open(StoreLimits::default());
    // Every function the linked SQLite has, with an arity it accepts.
    let plain = rusqlite::Connection::open_in_memory().unwrap();
    let mut stmt = plain
        .prepare("SELECT DISTINCT name, narg FROM pragma_function_list")
        .unwrap();
    let functions: Vec<(String, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(functions.len() > 100, "{}", functions.len());
    let mut refused = 0;
    for (name, narg) in &functions {
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue; // operators such as `->` are only reached as operators
        }
        let args = vec!["NULL"; narg.max(&0).to_owned() as usize].join(", ");
        let r = db.query(&format!("SELECT {name}({args})"), &[]);
        let allowed = GUEST_FUNCTIONS.iter().any(|f| f.eq_ignore_ascii_case(name));
        match (allowed, &r) {
            (false, Err(StoreError::Forbidden(m))) => {
                assert!(m.contains(name.as_str()), "{m}");
                refused += 1;
            }
            (false, other) => panic!("function `{name}` is not allowed but ran: {other:?}"),
            (true, Err(StoreError::Forbidden(m))) => panic!("allowed `{name}` was refused: {m}"),
            (true, _) => {}
        }
    }
    assert!(refused > 10, "{refused}");
    // The math functions Durable Objects offers are built in.
    let r = db
        .query("SELECT sqrt(16), pow(2, 10), floor(ln(exp(2)))", &[])
        .unwrap();
    assert_eq!(
        r.rows[0],
        vec![Value::Real(4.0), Value::Real(1024.0), Value::Real(2.0)]
    );
}

#[test]
fn modules_and_table_valued_functions_outside_the_allow_list_are_refused() {
    let (_d, mut db) = open(StoreLimits::default());
    let plain = rusqlite::Connection::open_in_memory().unwrap();
    let mut stmt = plain
        .prepare("SELECT name FROM pragma_module_list")
        .unwrap();
    let modules: Vec<String> = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(
        !modules.iter().any(|m| m == "dbstat"),
        "dbstat is built out"
    );
    for m in &modules {
        let read = db.query(&format!("SELECT * FROM \"{m}\" LIMIT 1"), &[]);
        let listed = |l: &[&str]| l.iter().any(|x| x.eq_ignore_ascii_case(m));
        let pragma_ok = m
            .strip_prefix("pragma_")
            .is_some_and(|p| GUEST_PRAGMAS.contains(&p));
        if !(listed(GUEST_TABLE_FUNCTIONS) || listed(GUEST_VTAB_MODULES) || pragma_ok) {
            assert!(
                matches!(
                    &read,
                    Err(StoreError::Forbidden(_)) | Err(StoreError::Sql(_))
                ),
                "`{m}` was readable: {read:?}"
            );
            if !listed(GUEST_VTAB_MODULES) {
                let made = db.execute(
                    &format!("CREATE VIRTUAL TABLE v_{} USING \"{m}\"", m.len()),
                    &[],
                );
                assert!(made.is_err(), "module `{m}` made a table");
            }
        }
    }
    forbidden_naming(
        db.query("SELECT * FROM pragma_compile_options", &[]),
        "compile_options",
    );
    let each = db
        .query("SELECT value FROM json_each('[1,2,3]')", &[])
        .unwrap();
    assert_eq!(each.rows.len(), 3);
    db.execute("CREATE TABLE t (x)", &[]).unwrap();
    let info = db
        .query("SELECT name FROM pragma_table_info('t')", &[])
        .unwrap();
    assert_eq!(info.rows, vec![vec![Value::Text("x".into())]]);
}

#[test]
fn pragmas_outside_the_allow_list_are_refused_by_name() {
    let (_d, mut db) = open(StoreLimits::default());
    for (sql, name) in [
        ("PRAGMA journal_mode = OFF", "journal_mode"),
        ("PRAGMA writable_schema = ON", "writable_schema"),
        ("PRAGMA temp_store = MEMORY", "temp_store"),
        ("PRAGMA cache_size = -1000000", "cache_size"),
        ("PRAGMA mmap_size = 1000000000", "mmap_size"),
        ("PRAGMA trusted_schema = ON", "trusted_schema"),
        ("PRAGMA compile_options", "compile_options"),
        ("PRAGMA page_size = 512", "page_size"),
    ] {
        forbidden_naming(db.execute(sql, &[]), name);
    }
    db.execute("CREATE TABLE p (id INTEGER PRIMARY KEY)", &[])
        .unwrap();
    db.execute("CREATE TABLE c (p INTEGER REFERENCES p(id))", &[])
        .unwrap();
    db.begin().unwrap();
    db.execute("PRAGMA defer_foreign_keys = ON", &[]).unwrap();
    db.execute("INSERT INTO c VALUES (1)", &[]).unwrap();
    db.execute("INSERT INTO p VALUES (1)", &[]).unwrap();
    db.commit().unwrap();
}

#[test]
fn a_statement_stops_at_the_deadline_and_runs_to_its_end_without_one() {
    let (_d, mut db) = open(StoreLimits::default());
    let bounded = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c LIMIT 300000) SELECT count(*) FROM c";
    // The unsafe variant: no deadline, the statement runs to its end.
    db.set_deadline(None);
    assert_eq!(
        db.query(bounded, &[]).unwrap().rows[0][0],
        Value::Integer(300_000)
    );
    // A passed deadline stops it.
    db.set_deadline(Some(Instant::now()));
    let e = db.query(bounded, &[]).unwrap_err();
    assert_eq!(e.code(), "cpu_time_exceeded", "{e}");
    // A statement that never ends stops at a deadline in the future.
    db.set_deadline(Some(Instant::now() + Duration::from_millis(100)));
    let e = db.query(FOREVER, &[]).unwrap_err();
    assert_eq!(e.code(), "cpu_time_exceeded", "{e}");
    // The runtime's own statements are never stopped, and the connection
    // keeps working.
    db.begin().unwrap();
    db.kv_put("k", b"v").unwrap();
    db.commit().unwrap();
    db.set_deadline(None);
    assert_eq!(
        db.query("SELECT 1", &[]).unwrap().rows[0][0],
        Value::Integer(1)
    );
}

#[test]
fn the_node_stopping_stops_a_statement_that_has_no_deadline() {
    let (_d, mut db) = open(StoreLimits::default());
    let stop = Arc::new(AtomicBool::new(false));
    db.set_stop_flag(Arc::clone(&stop));
    let flag = Arc::clone(&stop);
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        flag.store(true, Ordering::SeqCst);
    });
    let e = db.query(FOREVER, &[]).unwrap_err();
    setter.join().unwrap();
    assert_eq!(e.code(), "shutting_down", "{e}");
}

/// Runs `sql` on `db` on a thread of its own and waits for it, at most
/// `HUNG_S` seconds: a bound for a statement that holds its thread for
/// minutes or hours, not a timing assertion.
fn run_bounded(
    mut db: ActorDb,
    sql: &'static str,
    params: Vec<Value>,
) -> Result<wasmkeep_store::QueryResult, StoreError> {
    const HUNG_S: u64 = 60;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(db.query(sql, &params));
    });
    rx.recv_timeout(Duration::from_secs(HUNG_S))
        .unwrap_or_else(|_| panic!("one call held its thread for over {HUNG_S} s: {sql}"))
}

fn text(s: String) -> Value {
    Value::Text(s)
}

#[test]
fn one_call_on_large_values_ends_in_linear_time() {
    // Each call is one step of SQLite's machine: the deadline is checked
    // before and after it, never during. SQLite's own `trim`, `instr`,
    // `replace` and `unhex` take time that grows with the product of these
    // arguments' sizes (near 2 MiB; `trim` and `unhex` alone: minutes); an
    // actor's connection runs linear stand-ins with the same results (ADR
    // 0032), so the row comes back, or the deadline stops the statement
    // after the calls. (The sets have as many characters as SQLite's
    // `trim` takes: 12 bytes of bookkeeping each within value_bytes_max.)
    let n = StoreLimits::default().value_bytes_max;
    let (dir, db) = open(StoreLimits::default());
    db.set_deadline(Some(Instant::now() + Duration::from_millis(50)));
    let params = vec![
        text("a".repeat(n - 1)),
        text("b".repeat(n / 12 - 2) + "a"),
        text("é".repeat(n / 2)),
        text("ü".repeat(n / 12 - 2) + "é"),
        text("a".repeat(n / 2) + "b"),
        text(" ".repeat(n)),
        text("x".repeat(n - 1) + " "),
    ];
    let r = run_bounded(
        db,
        "SELECT length(trim(?1, ?2)), length(rtrim(?3, ?4)), instr(?1, ?5), \
         length(replace(?1, ?5, '')), length(unhex(?6, ?7))",
        params,
    );
    match r {
        Ok(r) => assert_eq!(
            r.rows[0],
            vec![
                Value::Integer(0),
                Value::Integer(0),
                Value::Integer(0),
                Value::Integer(n as i64 - 1),
                Value::Integer(0),
            ]
        ),
        Err(e) => assert_eq!(e.code(), "cpu_time_exceeded", "{e}"),
    }
    drop(dir);
}

#[test]
fn fts5_highlight_and_snippet_on_a_large_document_end_in_linear_time() {
    // FTS5's own `highlight()` prints its whole result again for every
    // match it adds (74 s for this document), and `snippet()` scores every
    // match against every other (about an hour); the actor's connection
    // registers stand-ins with FTS5's results (ADR 0032).
    let n = StoreLimits::default().value_bytes_max;
    let (dir, mut db) = open(StoreLimits::default());
    db.execute("CREATE VIRTUAL TABLE t USING fts5(body)", &[])
        .unwrap();
    db.execute(
        "INSERT INTO t (body) VALUES (?1)",
        &[text("a ".repeat(n / 2 - 512))],
    )
    .unwrap();
    db.set_deadline(Some(Instant::now() + Duration::from_millis(50)));
    let r = run_bounded(
        db,
        "SELECT length(highlight(t, 0, '', '')), snippet(t, 0, '[', ']', '...', 3) \
         FROM t WHERE t MATCH 'a'",
        vec![],
    );
    match r {
        Ok(r) => assert_eq!(
            r.rows[0],
            vec![
                Value::Integer(n as i64 - 1024),
                Value::Text("[a] [a] [a]...".into())
            ]
        ),
        Err(e) => assert_eq!(e.code(), "cpu_time_exceeded", "{e}"),
    }
    drop(dir);
}

#[test]
fn the_built_in_runs_one_call_past_the_deadline_without_the_guard_being_asked() {
    // The unsafe variant: SQLite's own `instr` on a plain connection whose
    // progress handler is the guard's (every PROGRESS_OPS steps, stop once
    // the deadline passed), on values an eighth of the size above.
    wasmkeep_store::sqlite_setup::sqlite_setup();
    let mut plain = rusqlite::Connection::open_in_memory().unwrap();
    let (asked, deadline) = guard_like_progress(&mut plain);
    let n = StoreLimits::default().value_bytes_max / 8;
    let found: i64 = plain
        .query_row(
            "SELECT instr(?1, ?2)",
            ["a".repeat(n), "a".repeat(n / 2) + "b"],
            |r| r.get(0),
        )
        .unwrap();
    // The call ran to its end although the deadline passed while it ran
    // (tens of millions of byte comparisons against a deadline of 1 ms):
    // the guard was never asked.
    assert_eq!(found, 0);
    assert!(Instant::now() > deadline);
    assert_eq!(asked.load(Ordering::Relaxed), 0);
}

/// A full-text query of `n` phrases OR'd.
fn or_query(phrase: &str, n: usize) -> String {
    vec![phrase; n].join(" OR ")
}

#[test]
fn fts5_queries_over_the_term_bound_are_refused_by_name() {
    // FTS5 builds a query's tree in one step, in time that grows with the
    // square of its phrases: 80,000 OR'd phrases ran 2.8 s past a 20 ms
    // deadline, a 2 MiB query about a minute (ADR 0032). An actor's
    // tokenizers count a query's terms and refuse past the bound, whatever
    // the tokenizer and however the query reaches FTS5.
    let max = wasmkeep_store::limits::FTS5_QUERY_TOKENS_MAX as usize;
    let (_d, mut db) = open(StoreLimits::default());
    let tables = [
        ("t0", "fts5(body)"),
        (
            "t1",
            "fts5(body, tokenize = 'porter unicode61 remove_diacritics 1')",
        ),
        ("t2", "fts5(body, tokenize = 'ascii')"),
        ("t3", "fts5(body, tokenize = 'trigram case_sensitive 1')"),
        ("t4", "fts5(body, tokenize = unicode61)"),
    ];
    // A document of more tokens than the bound is stored and found.
    let doc = "word ".repeat(2 * max);
    for (name, module) in tables {
        db.execute(&format!("CREATE VIRTUAL TABLE {name} USING {module}"), &[])
            .unwrap();
        for body in [doc.clone(), "abc".into()] {
            db.execute(
                &format!("INSERT INTO {name} (body) VALUES (?1)"),
                &[text(body)],
            )
            .unwrap();
        }
    }
    let refused = |r: Result<wasmkeep_store::QueryResult, StoreError>, what: &str| match r {
        Err(e) => {
            assert_eq!(e.code(), "invalid_argument", "{what}: {e}");
            assert!(
                e.to_string().contains("fts5_query_tokens_max"),
                "{what}: {e}"
            );
        }
        Ok(r) => panic!("{what}: not refused: {:?}", r.rows),
    };
    for (name, _) in tables {
        let sql = format!("SELECT count(*) FROM {name} WHERE {name} MATCH ?1");
        // 80,000 phrases, bound as a parameter.
        refused(
            db.query(&sql, &[text(or_query("abc", 80_000))]),
            &format!("{name}: 80,000 phrases"),
        );
        // One phrase of many tokens; phrases without tokens.
        refused(
            db.query(&sql, &[text(format!("\"{}\"", "abc ".repeat(max + 1)))]),
            &format!("{name}: one long phrase"),
        );
        refused(
            db.query(&sql, &[text(or_query("\"\"", max + 1))]),
            &format!("{name}: empty phrases"),
        );
        // At the bound, the query runs.
        let r = db.query(&sql, &[text(or_query("abc", max))]).unwrap();
        assert_eq!(r.rows[0][0], Value::Integer(1), "{name}");
        let r = db.query(&sql, &[text("word".into())]).unwrap();
        assert_eq!(r.rows[0][0], Value::Integer(1), "{name}");
    }
    // A query computed in SQL, and the table-valued form.
    refused(
        db.query(
            "SELECT count(*) FROM t0(trim(replace(printf('%.*c', ?1, 'x'), 'x', 'abc ')))",
            &[Value::Integer(max as i64 + 1)],
        ),
        "computed query",
    );
    // The connection keeps working, and its counts start again.
    let r = db
        .query("SELECT count(*) FROM t0 WHERE t0 MATCH 'abc OR xyz'", &[])
        .unwrap();
    assert_eq!(r.rows[0][0], Value::Integer(1));
    let r = db
        .query("SELECT count(*) FROM t3 WHERE body LIKE '%abc%'", &[])
        .unwrap();
    assert_eq!(r.rows[0][0], Value::Integer(1));
}

#[test]
fn fts5_parses_a_large_query_in_one_step_without_the_guard_being_asked() {
    // The unsafe variant: a plain connection, whose tokenizers do not
    // count, with the guard's progress handler (every PROGRESS_OPS steps,
    // stop once the deadline passed). A query of 20,000 phrases, a quarter
    // of the one above, is parsed to its end although the deadline passed
    // while FTS5 parsed it: the guard was never asked.
    wasmkeep_store::sqlite_setup::sqlite_setup();
    let mut plain = rusqlite::Connection::open_in_memory().unwrap();
    // (An empty table: FTS5 then has no index to read, and the statement
    // takes a few steps besides the parse.)
    plain
        .execute_batch("CREATE VIRTUAL TABLE t USING fts5(body)")
        .unwrap();
    let (asked, deadline) = guard_like_progress(&mut plain);
    let found: i64 = plain
        .query_row(
            "SELECT count(*) FROM t WHERE t MATCH ?1",
            [or_query("abc", 20_000)],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(found, 0);
    assert!(Instant::now() > deadline);
    assert_eq!(asked.load(Ordering::Relaxed), 0);
}

#[test]
fn json_patch_refuses_arguments_over_its_bound_and_merges_those_under_it() {
    // SQLite merges a patch in time that grows with the patch's members
    // times the target's size: two 2 MiB objects took about a minute.
    let (_d, mut db) = open(StoreLimits::default());
    let object = |prefix: &str, n: usize| {
        let members: Vec<String> = (0..n).map(|i| format!("\"{prefix}{i}\":0")).collect();
        format!("{{{}}}", members.join(","))
    };
    let (big_target, big_patch) = (object("a", 100_000), object("b", 100_000));
    for f in ["json_patch", "jsonb_patch"] {
        let e = db
            .query(
                &format!("SELECT length({f}(?1, ?2))"),
                &[text(big_target.clone()), text(big_patch.clone())],
            )
            .unwrap_err();
        assert_eq!(e.code(), "invalid_argument", "{e}");
        assert!(e.to_string().contains(f), "{e}");
        assert!(e.to_string().contains("json_patch_member_bytes_max"), "{e}");
    }
    // A large target with a patch of fifty members is merged.
    let r = db
        .query(
            "SELECT json_patch(?1, '{\"a1\":null,\"z\":1}') ->> '$.z', \
             json_patch(?1, ?2) ->> '$.b49'",
            &[text(big_target.clone()), text(object("b", 50))],
        )
        .unwrap();
    assert_eq!(r.rows[0], vec![Value::Integer(1), Value::Integer(0)]);
}

#[test]
fn like_patterns_and_function_arguments_are_bounded_by_name() {
    // SQLite matches a LIKE or GLOB pattern in time that grows with the
    // pattern's length times the subject's; a guest's patterns are
    // shorter than SQLite's default bound (50,000 bytes), which a plain
    // connection keeps.
    let max = wasmkeep_store::limits::LIKE_PATTERN_BYTES_MAX as usize;
    let (_d, mut db) = open(StoreLimits::default());
    for (op, wild) in [("LIKE", "%"), ("GLOB", "*")] {
        let sql = format!("SELECT 'abc' {op} ?1");
        let at_max = format!("{wild}{}", "a".repeat(max - 1));
        assert_eq!(
            db.query(&sql, &[text(at_max)]).unwrap().rows[0][0],
            Value::Integer(0)
        );
        let over = format!("{wild}{}", "a".repeat(max));
        let e = db.query(&sql, &[text(over.clone())]).unwrap_err();
        assert_eq!(e.code(), "invalid_argument", "{e}");
        assert!(e.to_string().contains("like_pattern_bytes_max"), "{e}");
        wasmkeep_store::sqlite_setup::sqlite_setup();
        let plain = rusqlite::Connection::open_in_memory().unwrap();
        let v: i64 = plain.query_row(&sql, [&over], |r| r.get(0)).unwrap();
        assert_eq!(v, 0);
    }
    // The JSON functions that take many paths look each one up from the
    // document's start: their number is bounded too.
    let max = wasmkeep_store::limits::FUNCTION_ARGS_MAX as usize;
    let paths = |n: usize| vec!["'$[0]'"; n].join(", ");
    let r = db
        .query(
            &format!("SELECT json_extract('[1]', {})", paths(max - 1)),
            &[],
        )
        .unwrap();
    assert!(matches!(&r.rows[0][0], Value::Text(t) if t.starts_with("[1,1,")));
    let e = db
        .query(&format!("SELECT json_extract('[1]', {})", paths(max)), &[])
        .unwrap_err();
    assert_eq!(e.code(), "sql_error", "{e}");
    assert!(e.to_string().contains("json_extract"), "{e}");
    assert!(e.to_string().contains("function_args_max"), "{e}");
}

#[test]
fn a_wide_row_stops_at_the_statement_budget_before_sqlite_holds_it() {
    let cols = vec!["randomblob(2000000)"; 64].join(", ");
    let sql = format!("SELECT {cols}");
    let (_d, mut db) = open(StoreLimits::default());
    let e = db.query(&sql, &[]).unwrap_err();
    assert_eq!(e.code(), "memory_exceeded", "{e}");
    assert!(e.to_string().contains("statement_memory_bytes_max"), "{e}");
    // With a budget large enough, the same row reaches the result check,
    // which stops before copying past query_result_bytes_max.
    let (_d2, mut roomy) = open(StoreLimits {
        statement_memory_bytes_max: 512 * 1024 * 1024,
        ..StoreLimits::default()
    });
    let e = roomy.query(&sql, &[]).unwrap_err();
    assert_eq!(e.code(), "result_too_large", "{e}");
    // Both connections keep working.
    assert!(db.query("SELECT 1", &[]).is_ok());
    assert!(roomy.query("SELECT 1", &[]).is_ok());
}

#[test]
fn a_sort_that_spills_stops_at_the_temp_file_bound() {
    let sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c LIMIT 20000) \
               SELECT count(*) FROM (SELECT DISTINCT randomblob(1000) FROM c)";
    let (_d, mut db) = open(StoreLimits {
        statement_temp_file_bytes_max: 1024 * 1024,
        ..StoreLimits::default()
    });
    let e = db.query(sql, &[]).unwrap_err();
    assert_eq!(e.code(), "temp_storage_exceeded", "{e}");
    // The unsafe variant: with a bound that is large enough it completes.
    let (_d2, mut roomy) = open(StoreLimits::default());
    assert_eq!(
        roomy.query(sql, &[]).unwrap().rows[0][0],
        Value::Integer(20_000)
    );
}

#[test]
fn a_key_value_listing_stops_before_copying_past_the_result_bound() {
    let (_d, mut db) = open(StoreLimits {
        query_result_bytes_max: 1024 * 1024,
        ..StoreLimits::default()
    });
    let value = vec![1u8; 256 * 1024];
    for i in 0..8 {
        db.kv_put(&format!("k{i}"), &value).unwrap();
    }
    let e = db.kv_list(&Default::default()).unwrap_err();
    assert_eq!(e.code(), "result_too_large", "{e}");
    let few = wasmkeep_store::KvListOptions {
        limit: Some(3),
        ..Default::default()
    };
    assert_eq!(db.kv_list(&few).unwrap().len(), 3);
}

/// A piece of guest SQL and the functions its evaluation would call.
#[derive(Debug, Clone)]
struct Expr {
    sql: String,
    calls: Vec<&'static str>,
}

/// Functions the generator draws from: allowed ones and ones that are not.
const POOL: &[(&str, usize)] = &[
    ("abs", 1),
    ("lower", 1),
    ("json_extract", 2),
    ("hex", 1),
    ("sqrt", 1),
    ("fts3_tokenizer", 1),
    ("load_extension", 1),
    ("sqlite_compileoption_get", 1),
    ("sqlite_offset", 1),
    ("rtreenode", 2),
    ("fts5", 1),
    ("readfile", 1),
];

fn expr() -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![
        Just(Expr {
            sql: "1".into(),
            calls: vec![]
        }),
        Just(Expr {
            sql: "'simple'".into(),
            calls: vec![]
        }),
        Just(Expr {
            sql: "x'41'".into(),
            calls: vec![]
        }),
    ];
    leaf.prop_recursive(3, 12, 2, |inner| {
        (0..POOL.len(), prop::collection::vec(inner, 2)).prop_map(|(i, args)| {
            let (name, n) = POOL[i];
            let mut calls = vec![name];
            let sql_args: Vec<String> = args[..n]
                .iter()
                .map(|a| {
                    calls.extend(a.calls.iter().copied());
                    a.sql.clone()
                })
                .collect();
            Expr {
                sql: format!("{name}({})", sql_args.join(", ")),
                calls,
            }
        })
    })
}

/// Ways to make SQLite evaluate an expression: directly, in a subquery, a
/// CTE, a view, a trigger, a CHECK constraint, a generated column, a
/// default. Each is a list of statements; the last one evaluates.
fn contexts(e: &str) -> Vec<Vec<String>> {
    vec![
        vec![format!("SELECT {e}")],
        vec![format!("SELECT (SELECT {e})")],
        vec![format!("WITH w(v) AS (SELECT {e}) SELECT v FROM w")],
        vec![
            format!("CREATE VIEW gv AS SELECT {e} AS v"),
            "SELECT v FROM gv".into(),
        ],
        vec![
            "CREATE TABLE gt (v)".into(),
            format!("CREATE TRIGGER gtr AFTER INSERT ON gt BEGIN SELECT {e}; END"),
            "INSERT INTO gt VALUES (1)".into(),
        ],
        vec![
            format!("CREATE TABLE gc (v, CHECK ({e} IS NOT 42))"),
            "INSERT INTO gc VALUES (1)".into(),
        ],
        vec![
            format!("CREATE TABLE gg (v, w AS ({e}))"),
            "INSERT INTO gg (v) VALUES (1)".into(),
            "SELECT w FROM gg".into(),
        ],
        vec![
            format!("CREATE TABLE gd (v, w DEFAULT ({e}))"),
            "INSERT INTO gd (v) VALUES (1)".into(),
        ],
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// No statement sequence that evaluates a function outside the
    /// allow-list gets through all its statements, in any context.
    #[test]
    fn nothing_outside_the_allow_list_is_ever_evaluated(e in expr()) {
        let denied: Vec<&str> = e
            .calls
            .iter()
            .copied()
            .filter(|c| !GUEST_FUNCTIONS.contains(c))
            .collect();
        for statements in contexts(&e.sql) {
            let (_d, mut db) = open(StoreLimits::default());
            let all_ran = statements.iter().all(|s| db.query(s, &[]).is_ok());
            prop_assert!(
                denied.is_empty() || !all_ran,
                "{:?} evaluated {:?}", statements, denied
            );
        }
    }
}

#[test]
fn every_context_of_the_property_evaluates_an_allowed_function() {
    // Otherwise the property above would hold only because its statements
    // fail for some other reason.
    for statements in contexts("abs(1)") {
        let (_d, mut db) = open(StoreLimits::default());
        for s in &statements {
            db.query(s, &[]).unwrap_or_else(|e| panic!("{s}: {e}"));
        }
    }
}

/// Pragmas the generator draws from, with whether a guest may run them.
const PRAGMA_POOL: &[(&str, bool)] = &[
    ("table_info(t)", true),
    ("quick_check", true),
    ("defer_foreign_keys = ON", true),
    ("page_count", true),
    ("page_count = 1", false),
    ("journal_mode = OFF", false),
    ("writable_schema = ON", false),
    ("trusted_schema = ON", false),
    ("temp_store = MEMORY", false),
    ("mmap_size = 1", false),
    ("cache_size = -100000", false),
    ("compile_options", false),
    ("module_list", false),
    ("function_list", false),
    ("database_list", false),
    ("hard_heap_limit = 1", false),
    ("schema_version = 1", false),
];

/// Virtual-table modules the generator draws from, with whether a guest
/// may create tables with them.
const MODULE_POOL: &[(&str, bool)] = &[
    ("fts5(body)", true),
    ("rtree(id, x0, x1)", true),
    ("fts4(body)", false),
    ("fts3(body)", false),
    ("fts3tokenize(simple)", false),
    ("fts4aux(t)", false),
    ("fts5vocab(t, row)", false),
    ("json_each", false),
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Any sequence of pragmas and virtual-table creations, in the three
    /// ways SQLite reaches a pragma (the statement, its table-valued
    /// function, a view over that function): what the allow-lists leave
    /// out never runs, and what they allow does.
    #[test]
    fn pragmas_and_modules_outside_the_allow_lists_never_run(
        picks in prop::collection::vec((0..PRAGMA_POOL.len(), 0..MODULE_POOL.len(), 0..3u8), 1..6)
    ) {
        let (_d, mut db) = open(StoreLimits::default());
        db.execute("CREATE TABLE t (x)", &[]).unwrap();
        for (i, (p, m, form)) in picks.into_iter().enumerate() {
            let (pragma, allowed) = PRAGMA_POOL[p];
            let name = pragma.split([' ', '(']).next().unwrap();
            let sql = match (form, pragma.contains('=')) {
                (0, _) | (_, true) => format!("PRAGMA {pragma}"),
                (1, false) => format!("SELECT * FROM pragma_{name}"),
                _ => format!("CREATE VIEW pv{i} AS SELECT * FROM pragma_{name}"),
            };
            let r = db.query(&sql, &[]);
            let r = match (form, &r, pragma.contains('=')) {
                (2, Ok(_), false) => db.query(&format!("SELECT * FROM pv{i}"), &[]),
                _ => r,
            };
            if allowed {
                prop_assert!(r.is_ok() || !sql.starts_with("PRAGMA"), "{sql}: {r:?}");
            } else {
                prop_assert!(r.is_err(), "{sql} ran: {r:?}");
            }
            let (module, allowed) = MODULE_POOL[m];
            let r = db.execute(&format!("CREATE VIRTUAL TABLE v{i} USING {module}"), &[]);
            prop_assert_eq!(r.is_ok(), allowed, "{}: {:?}", module, r);
        }
    }
}

/// The unsafe variants' stand-in for the guard: a progress handler on a
/// plain connection that stops a statement, every `PROGRESS_OPS` steps,
/// once a 1 ms deadline passed. Returns how often it was asked, and the
/// deadline.
fn guard_like_progress(
    plain: &mut rusqlite::Connection,
) -> (Arc<std::sync::atomic::AtomicU64>, Instant) {
    let asked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = Arc::clone(&asked);
    let deadline = Instant::now() + Duration::from_millis(1);
    plain
        .progress_handler(
            wasmkeep_store::sandbox::PROGRESS_OPS,
            Some(move || {
                counter.fetch_add(1, Ordering::Relaxed);
                Instant::now() > deadline
            }),
        )
        .unwrap();
    (asked, deadline)
}

#[test]
fn empty_values_count_at_what_they_cost_the_host() {
    // 250 empty strings a row over 10,000 rows: no payload at all, yet
    // 2.5 million values the host would hold (about 80 MB here; 2.9 GB
    // before the deadline over an endless sequence, issue 33).
    let limits = StoreLimits {
        query_result_bytes_max: 1024 * 1024,
        ..StoreLimits::default()
    };
    let (_d, mut db) = open(limits);
    let cols: Vec<String> = (0..250).map(|i| format!("'' AS c{i}")).collect();
    let sql = format!(
        "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 10000) \
         SELECT {} FROM r",
        cols.join(", ")
    );
    match db.query(&sql, &[]) {
        Err(e @ StoreError::ResultTooLarge { .. }) => {
            assert!(e.to_string().contains("query_result_bytes_max"), "{e}")
        }
        Ok(r) => panic!(
            "{} rows of empty values passed a 1 MiB result bound",
            r.rows.len()
        ),
        Err(e) => panic!("{e}"),
    }
}
