//! Hostile guests against a real node (issue 17): each attack of the
//! `hostile` guest (`examples/hostile`, tenant `evil`) gets its error code,
//! while a neighbouring tenant (`good`, the demo app's `counter`) keeps
//! counting correctly, and the node is still running at the end.
//!
//! docs/limits.md's "Threat model" names the test behind each line. No test
//! here asserts a duration: where an attack used to wedge the node, the test
//! shows that a request which could not be served then is served now.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::Node;
use common::hostile::*;

#[test]
fn fts3_tokenizer_is_unreachable_in_every_arity_and_form() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), BASE);
    with_neighbour(&node, "n", || {
        // One argument hands out a native address; two accept one.
        let got = attack(&node, "a", "/sql", b"SELECT fts3_tokenizer('simple')");
        assert_refused(&got, "forbidden", "fts3_tokenizer", "one argument");
        let two = b"SELECT fts3_tokenizer('x', ?1)";
        let got = attack(&node, "a", "/sql-param", two);
        assert_refused(&got, "forbidden", "fts3_tokenizer", "a forged pointer");
        let quoted = b"SELECT \"FTS3_TOKENIZER\"('simple')";
        let got = attack(&node, "a", "/sql", quoted);
        assert_refused(&got, "forbidden", "fts3_tokenizer", "another spelling");
        // The table that would call through the forged pointer.
        let fts4 = b"CREATE VIRTUAL TABLE t USING fts4(tokenize=x)";
        let got = attack(&node, "a", "/sql", fts4);
        assert_refused(&got, "forbidden", "fts4", "an fts4 table");
        let fts3 = b"CREATE VIRTUAL TABLE t3 USING fts3(tokenize=simple)";
        let got = attack(&node, "a", "/sql", fts3);
        assert_refused(&got, "forbidden", "fts3", "an fts3 table");
    });
    assert_alive(&node);
    assert_attacker_serves(&node, "a");
}

#[test]
fn forbidden_functions_stay_forbidden_inside_schema_objects() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), BASE);
    // Each batch hides the call in something SQLite runs later: a view,
    // a trigger, a generated column, a CHECK, an index on an expression.
    let hidden: &[(&str, &[&str])] = &[
        (
            "a view",
            &[
                "CREATE VIEW v AS SELECT fts3_tokenizer('simple') AS p",
                "SELECT * FROM v",
            ],
        ),
        (
            "a trigger",
            &[
                "CREATE TABLE tt (a)",
                "CREATE TRIGGER tr AFTER INSERT ON tt BEGIN SELECT fts3_tokenizer('simple'); END",
                "INSERT INTO tt VALUES (1) RETURNING a",
            ],
        ),
        (
            "a generated column",
            &[
                "CREATE TABLE g (a, b AS (sqlite_compileoption_get(a)))",
                "INSERT INTO g (a) VALUES (0) RETURNING b",
            ],
        ),
        (
            "a check",
            &[
                "CREATE TABLE c (a CHECK (fts3_tokenizer('simple') IS NOT NULL))",
                "INSERT INTO c VALUES (1) RETURNING a",
            ],
        ),
        (
            "an index",
            &[
                "CREATE TABLE i (a)",
                "CREATE INDEX ii ON i (sqlite_compileoption_get(a))",
                "INSERT INTO i VALUES (0) RETURNING a",
            ],
        ),
    ];
    with_neighbour(&node, "n", || {
        for (i, (what, steps)) in hidden.iter().enumerate() {
            let body = serde_json::to_vec(steps).unwrap();
            let (s, v) = attack(&node, &format!("h{i}"), "/sql-batch", &body);
            assert_eq!(s, 422, "{what}: the hidden call ran: {v}");
            let code = attack_code(&v);
            assert!(code == "forbidden" || code == "sql_error", "{what}: {v}");
            assert!(
                !v.to_string().contains("blob"),
                "{what} leaked a pointer: {v}"
            );
        }
    });
    assert_alive(&node);
}

/// Statements outside the allow-list, and the name the refusal must carry.
const OUTSIDE_THE_LIST: &[(&str, &str)] = &[
    ("SELECT load_extension('/tmp/x.so')", "load_extension"),
    (
        "SELECT sqlite_compileoption_get(0)",
        "sqlite_compileoption_get",
    ),
    (
        "SELECT sqlite_compileoption_used('THREADSAFE')",
        "sqlite_compileoption_used",
    ),
    ("SELECT fts5(NULL)", "fts5"),
    ("SELECT * FROM pragma_compile_options", "compile_options"),
    ("SELECT * FROM pragma_function_list", "function_list"),
    ("SELECT * FROM pragma_module_list", "module_list"),
    ("SELECT * FROM pragma_database_list", "database_list"),
    ("PRAGMA writable_schema = ON", "writable_schema"),
    ("PRAGMA trusted_schema = ON", "trusted_schema"),
    ("PRAGMA journal_mode = OFF", "journal_mode"),
    ("PRAGMA synchronous = OFF", "synchronous"),
    ("PRAGMA locking_mode = NORMAL", "locking_mode"),
    ("PRAGMA cache_size = -4000000", "cache_size"),
    ("PRAGMA mmap_size = 1073741824", "mmap_size"),
    ("PRAGMA temp_store = FILE", "temp_store"),
    ("PRAGMA foreign_keys = OFF", "foreign_keys"),
    ("PRAGMA recursive_triggers = ON", "recursive_triggers"),
    ("PRAGMA cell_size_check = OFF", "cell_size_check"),
    ("PRAGMA soft_heap_limit = 0", "soft_heap_limit"),
    ("PRAGMA hard_heap_limit = 0", "hard_heap_limit"),
    ("PRAGMA threads = 8", "threads"),
    ("PRAGMA page_size = 65536", "page_size"),
    ("PRAGMA query_only = OFF", "query_only"),
    ("PRAGMA wal_checkpoint(TRUNCATE)", "wal_checkpoint"),
    ("PRAGMA compile_options", "compile_options"),
    ("ATTACH DATABASE ':memory:' AS m", "attach"),
    ("ATTACH DATABASE '/etc/passwd' AS p", "attach"),
    (
        "CREATE VIRTUAL TABLE v USING fts5vocab(main, f, row)",
        "fts5vocab",
    ),
    ("CREATE TEMP TABLE x (a)", "temporary"),
    ("BEGIN", "transaction"),
    ("SAVEPOINT s", "transaction"),
    ("SELECT * FROM _wasmkeep_kv", "_wasmkeep_kv"),
    ("SELECT rtreenode(2, x'00')", "rtreenode"),
];

#[test]
fn guest_sql_outside_the_allow_list_is_forbidden_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), BASE);
    with_neighbour(&node, "n", || {
        for (statement, names) in OUTSIDE_THE_LIST {
            let got = attack(&node, "a", "/sql", statement.as_bytes());
            assert_refused(&got, "forbidden", names, statement);
        }
    });
    assert_alive(&node);
    assert_attacker_serves(&node, "a");
}

#[test]
fn page_level_tables_and_vacuum_show_nothing_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), BASE);
    let outside = tmp.path().join("vacuumed.db");
    let into = format!("VACUUM INTO '{}'", outside.display());
    for statement in [
        "SELECT * FROM dbstat",
        "SELECT * FROM sqlite_dbpage",
        "SELECT data FROM sqlite_dbpage WHERE pgno = 1",
        "VACUUM",
        into.as_str(),
    ] {
        // Compiled out (`no such table`) or refused: either way no page
        // of the file, the runtime's tables included, reaches the guest.
        let (s, v) = attack(&node, "a", "/sql", statement.as_bytes());
        assert_eq!(s, 422, "{statement}: {v}");
        let code = attack_code(&v);
        assert!(
            code == "forbidden" || code == "sql_error",
            "{statement}: {v}"
        );
    }
    assert!(
        !outside.exists(),
        "VACUUM INTO wrote a file outside the actor"
    );
    assert_alive(&node);
}

#[test]
fn shadow_tables_and_the_schema_are_read_only_to_guests() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), BASE);
    let setup = serde_json::to_vec(&[
        "CREATE VIRTUAL TABLE f USING fts5(body)",
        "INSERT INTO f (body) VALUES ('hello world'), ('goodbye world')",
        "CREATE VIRTUAL TABLE r USING rtree(id, x0, x1)",
        "INSERT INTO r VALUES (1, 0, 10)",
    ])
    .unwrap();
    let (s, v) = attack(&node, "a", "/sql-batch", &setup);
    assert_eq!(s, 200, "{v}");
    for statement in [
        "INSERT INTO f_data VALUES (10, x'00ff00ff00ff')",
        "UPDATE f_data SET block = x'deadbeef'",
        "DELETE FROM f_idx",
        "UPDATE f_content SET c0 = 'forged'",
        "UPDATE r_node SET data = x'00'",
        "DELETE FROM r_rowid",
        "UPDATE sqlite_schema SET sql = 'CREATE TABLE f (x)' WHERE name = 'f'",
        "DELETE FROM sqlite_schema WHERE name = 'r'",
    ] {
        let (s, v) = attack(&node, "a", "/sql", statement.as_bytes());
        assert_eq!(s, 422, "{statement} was allowed: {v}");
        assert_ne!(attack_code(&v), "", "{statement}: {v}");
    }
    // The indexes are intact and still answer.
    let check = b"INSERT INTO f (f) VALUES ('integrity-check')";
    let (s, v) = attack(&node, "a", "/sql", check);
    assert_eq!(s, 200, "fts5 integrity-check: {v}");
    let (s, v) = attack(&node, "a", "/sql", b"SELECT body FROM f('hello')");
    assert_eq!(
        (s, &v["rows"]),
        (200, &serde_json::json!([["hello world"]])),
        "{v}"
    );
    let (s, v) = attack(&node, "a", "/sql", b"SELECT id FROM r WHERE x1 >= 5");
    assert_eq!((s, &v["rows"]), (200, &serde_json::json!([[1]])), "{v}");
    assert_alive(&node);
}

#[test]
fn statements_past_the_deadline_stop_and_free_their_workers() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), BASE);
    let mut neighbour = Neighbour::new(&node, "n");
    neighbour.increment().unwrap();
    // Two statements that never end, on two actors: one for each worker.
    let attacks: Vec<_> = ["f1", "f2"]
        .into_iter()
        .map(|actor| {
            let base = node.base.clone();
            std::thread::spawn(move || http(&base, "POST", &format!("{EVIL}/{actor}/forever"), b""))
        })
        .collect();
    // Not a timing assertion: this only makes it likely that both attacks
    // hold their workers when the neighbour's request arrives, which is
    // the request a wedged node never served.
    std::thread::sleep(Duration::from_millis(500));
    neighbour
        .increment()
        .unwrap_or_else(|e| panic!("the neighbour was not served while two statements ran: {e}"));
    for (actor, a) in ["f1", "f2"].into_iter().zip(attacks) {
        let (s, v) = a.join().unwrap().unwrap();
        assert_eq!(
            (s, attack_code(&v)),
            (500, "cpu_time_exceeded"),
            "{actor}: {v}"
        );
        assert!(attack_message(&v).contains("event_cpu_ms_max"), "{v}");
        assert_attacker_serves(&node, actor);
    }
    neighbour.increment().unwrap();
    assert_alive(&node);
}

#[test]
fn a_guest_that_swallows_the_deadline_error_still_fails_its_event() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), BASE);
    let (s, v) = with_neighbour(&node, "n", || attack(&node, "c", "/catch-forever", b""));
    assert_eq!((s, attack_code(&v)), (500, "cpu_time_exceeded"), "{v}");
    assert_attacker_serves(&node, "c");
    assert_alive(&node);
}

#[test]
fn sigterm_stops_the_node_while_a_statement_runs_forever() {
    let tmp = tempfile::tempdir().unwrap();
    // A deadline far away: only the node's stop flag can end the statement.
    // Stopping gives connections and running events `shutdown_drain_ms`
    // together before it stops statements.
    let config = "event_cpu_ms_max = 3600000\nworkers = 2\nshutdown_drain_ms = 1000\n";
    let node = start(tmp.path(), config);
    let base = node.base.clone();
    let forever =
        std::thread::spawn(move || http(&base, "POST", &format!("{EVIL}/s/forever"), b""));
    // Makes it likely the statement runs when the signal comes; the test
    // holds either way.
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(exit_of(&node), None, "the node died during the attack");
    // SAFETY: sends a signal to the node process this test started.
    unsafe {
        libc::kill(node.pid(), libc::SIGTERM);
    }
    // A bound for a hung node, not a timing assertion: a node that ignores
    // its stop flag never exits.
    let how = exit_within(&node, Duration::from_secs(20))
        .expect("SIGTERM did not stop the node while a statement ran (waited 20 s)");
    assert!(
        how.starts_with("exited"),
        "the node did not stop cleanly: {how}"
    );
    // The attack's request ends one way or another; its outcome is not
    // the point (the node was stopping).
    let _ = forever.join();
}

#[test]
fn a_wide_row_is_stopped_at_the_allocation() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(
        tmp.path(),
        &format!("{BASE}query_result_bytes_max = 8388608\n"),
    );
    let before = peak_rss_bytes(&node);
    with_neighbour(&node, "n", || {
        // Within the statement's memory, over the result's bound.
        let got = attack(&node, "w", "/wide-row?cols=8&bytes=2000000", b"");
        assert_refused(
            &got,
            "result_too_large",
            "query_result_bytes_max",
            "8 columns",
        );
        // 300 columns of 2 MB: 600 MB inside SQLite before the first value
        // could be checked.
        let got = attack(&node, "w", "/wide-row?cols=300&bytes=2000000", b"");
        assert_refused(
            &got,
            "memory_exceeded",
            "statement_memory_bytes_max",
            "300 columns",
        );
    });
    let grew = peak_rss_bytes(&node).saturating_sub(before);
    eprintln!(
        "peak memory grew by {} MiB during the wide-row attacks",
        grew >> 20
    );
    assert!(
        grew < 512 << 20,
        "the node's peak memory grew by {} MiB during the attack",
        grew >> 20
    );
    assert_attacker_serves(&node, "w");
    assert_alive(&node);
}

/// The node process's peak resident memory (`VmHWM`).
#[test]
fn a_sort_that_spills_to_disk_is_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let config = format!("{BASE}statement_temp_file_bytes_max = 4194304\n");
    let node = start(tmp.path(), &config);
    with_neighbour(&node, "n", || {
        for how in ["distinct", "order"] {
            let got = attack(
                &node,
                "s",
                &format!("/sort-spill?rows=50000&how={how}"),
                b"",
            );
            assert_refused(
                &got,
                "temp_storage_exceeded",
                "statement_temp_file_bytes_max",
                how,
            );
        }
    });
    // A sort that fits is still fine.
    let (s, v) = attack(&node, "s", "/sort-spill?rows=100&how=distinct", b"");
    assert_eq!((s, &v["rows"]), (200, &serde_json::json!([[100]])), "{v}");
    assert_alive(&node);
}

#[test]
fn listing_a_large_key_value_store_fails_before_gathering_it() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(
        tmp.path(),
        &format!("{BASE}query_result_bytes_max = 4194304\n"),
    );
    with_neighbour(&node, "n", || {
        let (s, v) = attack(&node, "k", "/kv-fill?n=8&bytes=1048576", b"");
        assert_eq!((s, &v["n"]), (200, &serde_json::json!(8)), "{v}");
        let got = node.json("GET", &format!("{EVIL}/k/kv-list"), b"");
        assert_refused(
            &got,
            "result_too_large",
            "query_result_bytes_max",
            "kv list",
        );
    });
    assert_attacker_serves(&node, "k");
    assert_alive(&node);
}

#[test]
fn a_log_flood_does_not_flood_the_node_log() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("node.log");
    let node = start_with_log(tmp.path(), BASE, Some(&log));
    let lines = 20_000;
    let (s, v) = with_neighbour(&node, "n", || {
        attack(
            &node,
            "l",
            &format!("/log-flood?lines={lines}&bytes=200"),
            b"",
        )
    });
    assert_eq!(s, 200, "{v}");
    let text = std::fs::read_to_string(&log).unwrap();
    let kept = text.lines().filter(|l| l.contains("hostile flood")).count();
    // Some lines do reach the log: the test reads the right place.
    assert!(kept > 0, "no guest log line reached the node's log");
    assert!(
        kept < lines / 2,
        "{kept} of {lines} guest log lines reached the node's log in one event"
    );
    assert_alive(&node);
}

#[test]
fn memory_and_stack_are_bounded_per_instance() {
    let tmp = tempfile::tempdir().unwrap();
    let cap: u64 = 32 << 20;
    let node = start(
        tmp.path(),
        &format!("{BASE}instance_memory_bytes_max = {cap}\n"),
    );
    with_neighbour(&node, "n", || {
        // Growth is refused at the cap: the guest sees `memory.grow` fail
        // (and may go on), or the event fails if it aborts.
        let (s, v) = attack(&node, "m", "/mem-grow", b"");
        match s {
            200 => {
                let reached = v["bytes"].as_u64().unwrap();
                assert!(
                    reached <= cap,
                    "memory grew to {reached} bytes past the cap {cap}"
                );
                assert!(
                    reached > cap / 2,
                    "memory stopped at {reached} bytes, far below the cap"
                );
            }
            _ => assert_eq!(attack_code(&v), "memory_exceeded", "{s} {v}"),
        }
        let (s, v) = attack(&node, "o", "/stack-overflow", b"");
        assert_eq!((s, attack_code(&v)), (500, "guest_trap"), "{v}");
    });
    assert_attacker_serves(&node, "m");
    assert_attacker_serves(&node, "o");
    assert_alive(&node);
}

#[test]
fn a_tenant_that_fills_the_node_memory_budget_does_not_starve_the_neighbour() {
    let tmp = tempfile::tempdir().unwrap();
    // Room for about four instances at their cap.
    let cap: u64 = 64 << 20;
    let config = format!(
        "{BASE}instance_memory_bytes_max = {cap}\nnode_memory_bytes_max = {}\n",
        256u64 << 20
    );
    let node = start(tmp.path(), &config);
    // Six actors grow to their cap and stay active, idle between events.
    // Past the budget the attacker gets a clear error naming it; what it
    // got is checked after the neighbour's turn.
    let unclear: Vec<String> = (0..6)
        .filter_map(|i| {
            let (s, v) = attack(&node, &format!("m{i}"), "/mem-grow", b"");
            let code = attack_code(&v);
            let clear = s == 200 || code == "memory_exceeded" || code == "node_memory_exhausted";
            (!clear).then(|| format!("m{i}: {s} {v}"))
        })
        .collect();
    // The neighbour's new actor needs an instance of its own: idle
    // instances of the attacker must make room, not the neighbour wait.
    let mut neighbour = Neighbour::new(&node, "n");
    for _ in 0..3 {
        neighbour
            .increment()
            .unwrap_or_else(|e| panic!("the neighbour was starved of memory: {e}"));
    }
    assert_alive(&node);
    assert!(
        unclear.is_empty(),
        "unclear errors at the budget: {unclear:?}"
    );
}

#[test]
fn statement_text_parameters_and_nesting_are_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), BASE);
    with_neighbour(&node, "n", || {
        let got = attack(&node, "p", "/many-params?n=1000", b"");
        assert_refused(
            &got,
            "too_many_parameters",
            "sql_params_max",
            "1,000 parameters",
        );
        let got = attack(&node, "p", "/big-param?bytes=4194304", b"");
        assert_refused(
            &got,
            "value_too_large",
            "value_bytes_max",
            "a 4 MiB parameter",
        );
        let huge = format!("SELECT 1 -- {}", "x".repeat(1 << 20));
        let got = attack(&node, "p", "/sql", huge.as_bytes());
        assert_refused(
            &got,
            "statement_too_large",
            "sql_bytes_max",
            "a 1 MiB statement",
        );
        for (what, statement) in deep_statements() {
            let (s, v) = attack(&node, "p", "/sql", statement.as_bytes());
            assert_eq!((s, attack_code(&v)), (422, "sql_error"), "{what}: {v}");
        }
        for (what, statement) in [
            ("printf", "SELECT printf('%.*c', 2000000000, 'x')"),
            ("zeroblob", "SELECT zeroblob(2000000000)"),
            ("randomblob", "SELECT randomblob(2000000000)"),
            (
                "replace",
                "SELECT replace(hex(zeroblob(1000000)), '0', hex(zeroblob(1000)))",
            ),
        ] {
            let got = attack(&node, "p", "/sql", statement.as_bytes());
            assert_refused(&got, "value_too_large", "value_bytes_max", what);
        }
    });
    assert_attacker_serves(&node, "p");
    assert_alive(&node);
}

/// Statements within `sql_bytes_max` whose parse tree is deep enough to
/// exhaust a native stack if SQLite did not bound it.
fn deep_statements() -> Vec<(&'static str, String)> {
    let n = 30_000;
    vec![
        (
            "nested parentheses",
            format!("SELECT {}1{}", "(".repeat(n), ")".repeat(n)),
        ),
        ("a long sum", format!("SELECT 1{}", "+1".repeat(n))),
        (
            "nested subqueries",
            format!("SELECT {}1{}", "(SELECT ".repeat(5_000), ")".repeat(5_000)),
        ),
        (
            "a long compound",
            format!("SELECT 1{}", " UNION ALL SELECT 1".repeat(4_000)),
        ),
        (
            "deep json",
            format!("SELECT json('{}{}')", "[".repeat(n), "]".repeat(n)),
        ),
        (
            "nested case",
            format!(
                "SELECT {}1{}",
                "CASE WHEN 1 THEN ".repeat(4_000),
                " END".repeat(4_000)
            ),
        ),
    ]
}

#[test]
fn an_alarm_storm_does_not_starve_the_neighbour() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), &format!("{BASE}durability = \"process\"\n"));
    let (s, v) = attack(&node, "storm", "/alarm-storm", b"");
    assert_eq!(s, 204, "{v}");
    let mut neighbour = Neighbour::new(&node, "n");
    for _ in 0..50 {
        neighbour.increment().unwrap();
    }
    let (s, v) = attack(&node, "storm", "/alarm-stop", b"");
    assert_eq!(s, 204, "{v}");
    let (s, v) = node.json("GET", &format!("{EVIL}/storm/alarm-count"), b"");
    assert_eq!(s, 200, "{v}");
    assert!(
        v["rows"][0][0].as_i64().unwrap() > 0,
        "the storm never fired: {v}"
    );
    assert_alive(&node);
}

#[test]
fn a_guest_cannot_frame_the_http_response() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), BASE);
    // Invalid statuses are refused by the edge.
    for status in [0, 1000] {
        let (s, v) = attack(&node, "r", &format!("/respond?status={status}"), b"");
        assert_eq!(
            (s, attack_code(&v)),
            (500, "invalid_response"),
            "{status}: {v}"
        );
    }
    // Every framing attack runs; the test lists each one that got through.
    let mut problems: Vec<String> = [
        "content-length: 0",
        "content-length: 5",
        "transfer-encoding: identity",
    ]
    .into_iter()
    .filter_map(|header| framing_attack(&node, header).err())
    .collect();
    problems.extend(upgrade_attack(&node).err());
    assert_alive(&node);
    assert_eq!(node.json("GET", &format!("{GOOD}/n/value"), b"").0, 200);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A response's headers and body are measured in the guest's memory and
/// refused there (ADR 0033): 300 headers, a 300 kB header, a body over
/// `response_body_bytes_max`. Within the bounds they arrive as set.
#[test]
fn response_headers_and_body_are_refused_before_they_are_copied() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(
        tmp.path(),
        &format!("{BASE}response_body_bytes_max = 100000\n"),
    );
    with_neighbour(&node, "n", || {
        let many: String = (0..300).map(|i| format!("x-h{i}: v\n")).collect();
        let got = attack(&node, "h", "/respond", format!("{many}\nbody").as_bytes());
        assert_refused(
            &got,
            "response_too_large",
            "RESPONSE_HEADERS_MAX=256",
            "300 headers",
        );
        let big = format!("x-big: {}\n\nbody", "v".repeat(300_000));
        let got = attack(&node, "h", "/respond", big.as_bytes());
        assert_refused(
            &got,
            "response_too_large",
            "RESPONSE_HEADER_BYTES_MAX=262144",
            "a 300 kB header",
        );
        let body = format!("x-a: 1\n\n{}", "b".repeat(200_000));
        let got = attack(&node, "h", "/respond", body.as_bytes());
        assert_refused(
            &got,
            "response_too_large",
            "response_body_bytes_max=100000",
            "a 200 kB body",
        );
        let fine: String = (0..200).map(|i| format!("x-h{i}: v{i}\n")).collect();
        let body = format!("{fine}\nok");
        let answer = common::raw_http(
            node.addr(),
            &format!(
                "POST {EVIL}/h/respond HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            ),
        );
        assert_eq!(common::raw_status(&answer), 200, "{answer}");
        assert!(
            answer.contains("x-h199: v199") && answer.ends_with("ok"),
            "{answer}"
        );
    });
    assert_attacker_serves(&node, "h");
}

/// The unsafe variant (`WASMKEEP_UNSAFE=keep_framing_headers`): the
/// guest's framing headers reach hyper, and the attack of
/// `a_guest_cannot_frame_the_http_response` gets through.
#[test]
fn without_the_rule_a_guest_frames_the_next_response() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start_without(tmp.path(), BASE, "keep_framing_headers");
    let outcomes: Vec<Result<(), String>> = [
        "content-length: 0",
        "content-length: 5",
        "transfer-encoding: identity",
    ]
    .into_iter()
    .map(|header| framing_attack(&node, header))
    .collect();
    // What gets through depends on the build: hyper's debug assertions
    // kill the connection on a length that is not the body's (no answer to
    // the attack); a release build sends the forged response. Either fails
    // `a_guest_cannot_frame_the_http_response`.
    assert!(
        outcomes.iter().any(Result::is_err),
        "no framing attack got through without the rule: {outcomes:?}"
    );
}

/// A framing header that hides a forged second response in the body: the
/// next response on the same connection (a proxy's pooled connection may
/// carry another tenant's request next) must be the neighbour's own.
fn framing_attack(node: &Node, header: &str) -> Result<(), String> {
    let forged_body = "{\"forged\":true}";
    let forged = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{forged_body}",
        forged_body.len()
    );
    let body = format!("{header}\n\n{forged}");
    let mut conn = Raw::connect(node);
    let first = conn
        .exchange(
            "POST",
            &format!("{EVIL}/r/respond?status=200"),
            body.as_bytes(),
        )
        .map_err(|e| format!("{header}: no response to the attack: {e}"))?;
    match conn.exchange("GET", &format!("{GOOD}/n/value"), b"") {
        Ok((status, body)) if body.contains("forged") => Err(format!(
            "{header}: the guest forged the next response on the connection: {status} {body} (first: {first:?})"
        )),
        // A closed connection is fine: nothing forged was read.
        _ => Ok(()),
    }
}

/// `101 Switching Protocols` would hand the client's connection to a
/// protocol the node does not speak.
fn upgrade_attack(node: &Node) -> Result<(), String> {
    let body = "upgrade: websocket\nconnection: upgrade\n\nhello";
    let mut conn = Raw::connect(node);
    conn.send(
        "POST",
        &format!("{EVIL}/r/respond?status=101"),
        body.as_bytes(),
    )
    .and_then(|()| conn.read_status())
    .map_err(|e| format!("101: no response: {e}"))
    .and_then(|status| match status {
        100..200 => Err(format!("the guest's {status} reached the client")),
        _ => Ok(()),
    })
}

/// One raw HTTP/1.1 connection, to see the bytes a client would see.
struct Raw {
    reader: BufReader<TcpStream>,
    host: String,
}

impl Raw {
    fn connect(node: &Node) -> Raw {
        let host = node.base.trim_start_matches("http://").to_owned();
        let stream = TcpStream::connect(&host).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Raw {
            reader: BufReader::new(stream),
            host,
        }
    }

    /// Sends one request and reads one response by its framing:
    /// `(status, body)`.
    fn exchange(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> std::io::Result<(u16, String)> {
        self.send(method, path, body)?;
        self.read_response()
    }

    fn send(&mut self, method: &str, path: &str, body: &[u8]) -> std::io::Result<()> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)
    }

    /// Reads a response's status line only.
    fn read_status(&mut self) -> std::io::Result<u16> {
        let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(bad("the connection closed before a response".into()));
        }
        line.split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(format!("not a status line: {line:?}")))
    }

    fn read_response(&mut self) -> std::io::Result<(u16, String)> {
        let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
        let status = self.read_status()?;
        let mut line = String::new();
        let (mut length, mut chunked) = (0usize, false);
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let l = line.trim_end().to_ascii_lowercase();
            if l.is_empty() {
                break;
            }
            if let Some(v) = l.strip_prefix("content-length:") {
                length = v
                    .trim()
                    .parse()
                    .map_err(|_| bad(format!("bad length: {l}")))?;
            }
            chunked |= l.starts_with("transfer-encoding:") && l.contains("chunked");
        }
        let body = if chunked {
            self.read_chunks()?
        } else {
            self.read_exact_vec(length)?
        };
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    fn read_exact_vec(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0u8; n];
        self.reader.read_exact(&mut buf)?;
        Ok(buf)
    }

    fn read_chunks(&mut self) -> std::io::Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim(), 16)
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, line.clone()))?;
            let chunk = self.read_exact_vec(size + 2)?;
            if size == 0 {
                return Ok(body);
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
}

/// The unsafe variant of the allow-list (`WASMKEEP_UNSAFE=no_sql_allow_list`,
/// test-faults builds only): the attack of
/// `fts3_tokenizer_is_unreachable_in_every_arity_and_form` gets a native
/// address back, and a pragma the allow-list refuses runs, so the suite
/// above fails without the rule. (The two-argument form, which would call
/// through a forged pointer, is not sent: it would crash the node.)
#[test]
fn without_the_allow_list_a_guest_reads_a_native_address() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start_without(tmp.path(), BASE, "no_sql_allow_list");
    let (s, v) = attack(&node, "a", "/sql", b"SELECT fts3_tokenizer('simple')");
    assert_eq!(s, 200, "the leak was refused without the allow-list: {v}");
    assert!(!v.to_string().contains("forbidden"), "{v}");
    let (s, v) = attack(&node, "a", "/sql", b"PRAGMA cell_size_check = 1");
    assert_eq!(s, 200, "the pragma was refused without the allow-list: {v}");
    assert_alive(&node);
}
