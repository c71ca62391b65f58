//! Legitimate SQL through a guest (issue 17): what Durable Objects' SQLite
//! documents as supported keeps working after the guest SQL allow-list
//! (ADR 0032), so hardening removes only what is dangerous.
//!
//! Each case runs its statements in one event on a fresh actor of the
//! `hostile` guest (`POST /sql-batch`) on a real node, and checks the rows
//! of chosen steps exactly, or that a step fails as SQLite should (a
//! foreign key violation, a value a STRICT table refuses). Every case runs;
//! the test fails listing every case that did not hold.

mod common;

use common::Node;
use serde_json::Value as Json;
use wasmkeep_guests::HOSTILE;

/// One case: statements run in order in one event.
struct Case {
    name: &'static str,
    steps: &'static [&'static str],
    /// `(step, rows as JSON)`: what a step must return, exactly (a failing
    /// case's answer carries no rows: its `want` is empty).
    want: &'static [(usize, &'static str)],
    /// `(step, text)`: the step that must fail with `sql_error`, and text
    /// its message must contain. Later steps do not run.
    fails: Option<(usize, &'static str)>,
}

const fn ok(
    name: &'static str,
    steps: &'static [&'static str],
    want: &'static [(usize, &'static str)],
) -> Case {
    Case {
        name,
        steps,
        want,
        fails: None,
    }
}

const CASES: &[Case] = &[
    ok(
        "json functions and operators",
        &[
            r#"SELECT json_extract('{"a":{"b":[1,2,3]}}', '$.a.b[1]'), '{"a":5}' -> '$.a', '{"a":"x"}' ->> '$.a', json_array_length('[1,2,3]'), json_object('k', 1), json_set('{}', '$.x', 2), json_valid('{'), json_type('[1]'), json(jsonb('{"a":1}'))"#,
        ],
        &[(
            0,
            r#"[[2, "5", "x", 3, "{\"k\":1}", "{\"x\":2}", 0, "array", "{\"a\":1}"]]"#,
        )],
    ),
    ok(
        "json_each, json_tree and the json aggregates",
        &[
            "SELECT json_group_array(value * 10) FROM json_each('[1,2,3]')",
            r#"SELECT key, value FROM json_each('{"a":1,"b":"two"}') ORDER BY key"#,
            r#"SELECT count(*) FROM json_tree('{"a":[1,2]}')"#,
            "SELECT json_group_object('k' || key, value) FROM json_each('[7,8]')",
        ],
        &[
            (0, r#"[["[10,20,30]"]]"#),
            (1, r#"[["a", 1], ["b", "two"]]"#),
            (2, "[[4]]"),
            (3, r#"[["{\"k0\":7,\"k1\":8}"]]"#),
        ],
    ),
    ok(
        "fts5: create, insert, MATCH, bm25, highlight, snippet, prefix",
        &[
            "CREATE VIRTUAL TABLE docs USING fts5(title, body)",
            "INSERT INTO docs (title, body) VALUES ('sqlite', 'full text search in sqlite'), ('rust', 'memory safety without garbage collection'), ('wasm', 'portable code that runs sqlite too')",
            "SELECT title FROM docs WHERE docs MATCH 'sqlite' ORDER BY bm25(docs)",
            "SELECT highlight(docs, 1, '[', ']') FROM docs WHERE docs MATCH 'memory'",
            "SELECT instr(snippet(docs, 1, '<', '>', '...', 3), '<portable>') > 0 FROM docs WHERE docs MATCH 'portable'",
            "SELECT title FROM docs WHERE docs MATCH 'saf*'",
            "SELECT count(*) FROM docs WHERE docs MATCH 'title:rust OR body:code'",
            "SELECT title FROM docs WHERE docs MATCH 'sqlite' ORDER BY rank LIMIT 1",
        ],
        &[
            (2, r#"[["sqlite"], ["wasm"]]"#),
            (3, r#"[["[memory] safety without garbage collection"]]"#),
            (4, "[[1]]"),
            (5, r#"[["rust"]]"#),
            (6, "[[2]]"),
            (7, r#"[["sqlite"]]"#),
        ],
    ),
    ok(
        "math functions",
        &[
            "SELECT sqrt(16), pow(2, 10), ln(1), floor(2.7), ceil(2.1), round(pi(), 2), round(log10(1000), 9), exp(0), mod(7, 3), abs(-3), sign(-2)",
        ],
        &[(
            0,
            "[[4.0, 1024.0, 0.0, 2.0, 3.0, 3.14, 3.0, 1.0, 1.0, 3, -1]]",
        )],
    ),
    ok(
        "window functions",
        &[
            "CREATE TABLE sales (region TEXT, month INTEGER, amount INTEGER)",
            "INSERT INTO sales VALUES ('n', 1, 10), ('n', 2, 20), ('n', 3, 30), ('s', 1, 5), ('s', 2, 15)",
            "SELECT region, month, row_number() OVER w, lag(amount) OVER w, sum(amount) OVER w FROM sales WINDOW w AS (PARTITION BY region ORDER BY month) ORDER BY region, month",
            "SELECT region, rank() OVER (ORDER BY amount DESC), dense_rank() OVER (ORDER BY region) FROM sales WHERE month = 1 ORDER BY region",
        ],
        &[
            (
                2,
                r#"[["n", 1, 1, null, 10], ["n", 2, 2, 10, 30], ["n", 3, 3, 20, 60], ["s", 1, 1, null, 5], ["s", 2, 2, 5, 20]]"#,
            ),
            (3, r#"[["n", 1, 1], ["s", 2, 2]]"#),
        ],
    ),
    ok(
        "common table expressions, recursive with a bound",
        &[
            "WITH RECURSIVE fib(n, a, b) AS (SELECT 1, 0, 1 UNION ALL SELECT n + 1, b, a + b FROM fib WHERE n < 10) SELECT group_concat(a, ',') FROM fib",
            "WITH t(x) AS (VALUES (1), (2), (3)) SELECT sum(x) FROM t",
        ],
        &[(0, r#"[["0,1,1,2,3,5,8,13,21,34"]]"#), (1, "[[6]]")],
    ),
    ok(
        "upsert",
        &[
            "CREATE TABLE kv (k TEXT PRIMARY KEY, n INTEGER NOT NULL)",
            "INSERT INTO kv VALUES ('a', 1) ON CONFLICT (k) DO UPDATE SET n = n + excluded.n",
            "INSERT INTO kv VALUES ('a', 1) ON CONFLICT (k) DO UPDATE SET n = n + excluded.n",
            "INSERT INTO kv VALUES ('a', 5) ON CONFLICT DO NOTHING",
            "SELECT k, n FROM kv",
        ],
        &[(4, r#"[["a", 2]]"#)],
    ),
    ok(
        "returning",
        &[
            "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)",
            "INSERT INTO t (v) VALUES ('x'), ('y') RETURNING id, v",
            "UPDATE t SET v = upper(v) WHERE id = 2 RETURNING v",
            "DELETE FROM t WHERE id = 1 RETURNING v",
        ],
        &[
            (1, r#"[[1, "x"], [2, "y"]]"#),
            (2, r#"[["Y"]]"#),
            (3, r#"[["x"]]"#),
        ],
    ),
    ok(
        "strict tables",
        &[
            "CREATE TABLE s (id INTEGER PRIMARY KEY, n INTEGER NOT NULL, t TEXT) STRICT",
            "INSERT INTO s (n, t) VALUES ('7', 'x')",
            "SELECT typeof(n), n FROM s",
        ],
        &[(2, r#"[["integer", 7]]"#)],
    ),
    Case {
        name: "strict tables refuse a value of the wrong type",
        steps: &[
            "CREATE TABLE s (id INTEGER PRIMARY KEY, n INTEGER NOT NULL) STRICT",
            "INSERT INTO s (n) VALUES ('not a number')",
        ],
        want: &[],
        fails: Some((1, "cannot store TEXT value in INTEGER column")),
    },
    ok(
        "generated columns",
        &[
            "CREATE TABLE g (a INTEGER, b INTEGER, total INTEGER GENERATED ALWAYS AS (a + b) STORED, label TEXT AS ('#' || a) VIRTUAL)",
            "INSERT INTO g (a, b) VALUES (2, 3)",
            "SELECT total, label FROM g",
        ],
        &[(2, r##"[[5, "#2"]]"##)],
    ),
    Case {
        name: "foreign keys: a violation fails",
        steps: &[
            "CREATE TABLE parent (id INTEGER PRIMARY KEY)",
            "CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER NOT NULL REFERENCES parent (id))",
            "INSERT INTO parent VALUES (1)",
            "INSERT INTO child VALUES (1, 1)",
            "INSERT INTO child VALUES (2, 99)",
        ],
        want: &[],
        fails: Some((4, "FOREIGN KEY constraint failed")),
    },
    ok(
        "defer_foreign_keys = ON lets an event insert the child first",
        &[
            "CREATE TABLE b (id INTEGER PRIMARY KEY)",
            "CREATE TABLE a (id INTEGER PRIMARY KEY, b_id INTEGER REFERENCES b (id))",
            "PRAGMA defer_foreign_keys = ON",
            "PRAGMA defer_foreign_keys",
            "INSERT INTO a VALUES (1, 7)",
            "INSERT INTO b VALUES (7)",
            "SELECT count(*) FROM a JOIN b ON a.b_id = b.id",
        ],
        &[(3, "[[1]]"), (6, "[[1]]")],
    ),
    ok(
        "introspection pragmas",
        &[
            "CREATE TABLE p (id INTEGER PRIMARY KEY, name TEXT NOT NULL DEFAULT 'x')",
            "CREATE INDEX p_name ON p (name)",
            "CREATE TABLE q (id INTEGER PRIMARY KEY, p_id INTEGER REFERENCES p (id))",
            "PRAGMA table_info(p)",
            "SELECT name FROM pragma_table_info('p') ORDER BY cid",
            "PRAGMA index_list(p)",
            "PRAGMA index_info(p_name)",
            "PRAGMA foreign_key_list(q)",
            "SELECT name, type, ncol FROM pragma_table_list WHERE name IN ('p', 'q') ORDER BY name",
            "PRAGMA quick_check",
            "PRAGMA integrity_check",
            "PRAGMA foreign_key_check",
        ],
        &[
            (
                3,
                r#"[[0, "id", "INTEGER", 0, null, 1], [1, "name", "TEXT", 1, "'x'", 0]]"#,
            ),
            (4, r#"[["id"], ["name"]]"#),
            (5, r#"[[0, "p_name", 0, "c", 0]]"#),
            (6, r#"[[0, 1, "name"]]"#),
            (
                7,
                r#"[[0, 0, "p", "p_id", "id", "NO ACTION", "NO ACTION", "NONE"]]"#,
            ),
            (8, r#"[["p", "table", 2], ["q", "table", 2]]"#),
            (9, r#"[["ok"]]"#),
            (10, r#"[["ok"]]"#),
            (11, "[]"),
        ],
    ),
    ok(
        "date and time functions",
        &[
            "SELECT date('2024-02-28', '+1 day'), datetime(0, 'unixepoch'), strftime('%Y-%m', '2024-12-25'), julianday('2000-01-01'), unixepoch('1970-01-02'), time('12:34:56', '+1 hour'), date('2024-01-31', 'start of month')",
        ],
        &[(
            0,
            r#"[["2024-02-29", "1970-01-01 00:00:00", "2024-12", 2451544.5, 86400, "13:34:56", "2024-01-01"]]"#,
        )],
    ),
    ok(
        "alter table: rename a table",
        &[
            "CREATE TABLE old (a INTEGER)",
            "INSERT INTO old VALUES (1)",
            "ALTER TABLE old RENAME TO new",
            "SELECT a FROM new",
        ],
        &[(3, "[[1]]")],
    ),
    ok(
        "alter table: add a column",
        &[
            "CREATE TABLE t (a INTEGER)",
            "INSERT INTO t VALUES (1)",
            "ALTER TABLE t ADD COLUMN b TEXT NOT NULL DEFAULT 'x'",
            "SELECT a, b FROM t",
        ],
        &[(3, r#"[[1, "x"]]"#)],
    ),
    ok(
        "alter table: rename a column",
        &[
            "CREATE TABLE t (a INTEGER)",
            "INSERT INTO t VALUES (1)",
            "ALTER TABLE t RENAME COLUMN a TO c",
            "SELECT c FROM t",
        ],
        &[(3, "[[1]]")],
    ),
    ok(
        "alter table: drop a column",
        &[
            "CREATE TABLE t (a INTEGER, b TEXT)",
            "INSERT INTO t VALUES (1, 'x')",
            "ALTER TABLE t DROP COLUMN b",
            "SELECT * FROM t",
        ],
        &[(3, "[[1]]")],
    ),
    ok(
        "triggers",
        &[
            "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)",
            "CREATE TABLE audit (item_id INTEGER, action TEXT)",
            "CREATE TRIGGER items_ins AFTER INSERT ON items BEGIN INSERT INTO audit VALUES (new.id, 'insert'); END",
            "CREATE TRIGGER items_del BEFORE DELETE ON items BEGIN INSERT INTO audit VALUES (old.id, 'delete'); END",
            "INSERT INTO items (name) VALUES ('a'), ('b')",
            "DELETE FROM items WHERE id = 1",
            "SELECT item_id, action FROM audit ORDER BY rowid",
            "DROP TRIGGER items_del",
        ],
        &[(6, r#"[[1, "insert"], [2, "insert"], [1, "delete"]]"#)],
    ),
    ok(
        "views",
        &[
            "CREATE TABLE nums (n INTEGER)",
            "INSERT INTO nums VALUES (1), (2), (3), (4)",
            "CREATE VIEW evens AS SELECT n, n * n AS sq FROM nums WHERE n % 2 = 0",
            "SELECT group_concat(n), sum(sq) FROM evens",
            "DROP VIEW evens",
        ],
        &[(3, r#"[["2,4", 20]]"#)],
    ),
    ok(
        "r-tree",
        &[
            "CREATE VIRTUAL TABLE places USING rtree(id, min_x, max_x, min_y, max_y)",
            "INSERT INTO places VALUES (1, 0, 10, 0, 10), (2, 20, 30, 20, 30), (3, 5, 6, 5, 6)",
            "SELECT id FROM places WHERE min_x <= 7 AND max_x >= 5 AND min_y <= 7 AND max_y >= 5 ORDER BY id",
        ],
        &[(2, "[[1], [3]]")],
    ),
    ok(
        "core scalar functions and operators",
        &[
            "SELECT 'Abc' LIKE 'a%', 'abc' GLOB 'a*', iif(1, 'y', 'n'), printf('%05d', 42), upper('a') || lower('B'), length('héllo'), substr('hello', 2, 3), instr('hello', 'l'), replace('aaa', 'a', 'b'), trim('  x '), coalesce(NULL, 7), nullif(1, 1), typeof(1.5), hex('A'), quote('it''s'), unicode('A'), char(65), CAST('12' AS INTEGER) + 1, 'a' = 'A' COLLATE NOCASE, 5 BETWEEN 1 AND 9, 3 IN (1, 2, 3), CASE WHEN 1 > 2 THEN 'x' ELSE 'z' END",
        ],
        &[(
            0,
            r#"[[1, 1, "y", "00042", "Ab", 5, "ell", 3, "bbb", "x", 7, null, "real", "41", "'it''s'", 65, "A", 13, 1, 1, 1, "z"]]"#,
        )],
    ),
    ok(
        "aggregates",
        &[
            "SELECT count(*) FILTER (WHERE n > 1), total(n), avg(n), max(n), min(n), group_concat(n, '-'), sum(n) FROM (SELECT 1 AS n UNION ALL SELECT 2 UNION ALL SELECT 3)",
        ],
        &[(0, r#"[[2, 6.0, 2.0, 3, 1, "1-2-3", 6]]"#)],
    ),
    ok(
        "indexes: without rowid, partial, on an expression; joins and subqueries",
        &[
            "CREATE TABLE w (k TEXT PRIMARY KEY, v INTEGER) WITHOUT ROWID",
            "CREATE INDEX w_v ON w (v) WHERE v > 0",
            "CREATE INDEX w_lower ON w (lower(k))",
            "INSERT INTO w VALUES ('A', 1), ('B', 2), ('C', -1)",
            "SELECT k FROM w WHERE lower(k) = 'b'",
            "SELECT k FROM w WHERE v > 0 AND k IN (SELECT k FROM w WHERE v < 2)",
            "SELECT x.k, y.k FROM w AS x LEFT JOIN w AS y ON y.v = x.v + 1 ORDER BY x.k",
        ],
        &[
            (4, r#"[["B"]]"#),
            (5, r#"[["A"]]"#),
            (6, r#"[["A", "B"], ["B", null], ["C", null]]"#),
        ],
    ),
    ok(
        "blobs and randomness within the limits",
        &[
            "SELECT length(randomblob(16)), length(zeroblob(1000)), typeof(random()), hex(x'00ff'), unhex('00ff') = x'00ff'",
        ],
        &[(0, r#"[[16, 1000, "integer", "00FF", 1]]"#)],
    ),
];

/// Runs one case on actor `actor`; `Err` says how it went wrong.
fn run_case(node: &Node, actor: &str, case: &Case) -> Result<(), String> {
    let body = serde_json::to_vec(case.steps).unwrap();
    let path = format!("/v1/t/sql/attacker/{actor}/sql-batch");
    let (status, v) = node.json("POST", &path, &body);
    match (case.fails, status) {
        (None, 200) => check_rows(case, &v),
        (Some((step, text)), 422) => {
            let (got_step, code) = (v["step"].as_u64(), v["code"].as_str());
            let message = v["message"].as_str().unwrap_or("");
            if got_step != Some(step as u64) || code != Some("sql_error") || !message.contains(text)
            {
                return Err(format!("wanted step {step} to fail with `{text}`, got {v}"));
            }
            Ok(())
        }
        (None, _) => Err(format!("{status} {v}")),
        (Some((step, _)), _) => Err(format!("wanted step {step} to fail, got {status} {v}")),
    }
}

/// Compares the rows of each step the case names with what it wants.
fn check_rows(case: &Case, v: &Json) -> Result<(), String> {
    for (step, want) in case.want {
        let want: Json = serde_json::from_str(want).expect("a case's rows are JSON");
        let got = &v["results"][step]["rows"];
        if *got != want {
            return Err(format!(
                "step {step} `{}`: got {got}, wanted {want}",
                case.steps[*step]
            ));
        }
    }
    Ok(())
}

#[test]
fn what_durable_objects_sqlite_supports_keeps_working_through_a_guest() {
    let tmp = tempfile::tempdir().unwrap();
    let node = Node::start(&tmp.path().join("data"), &[]);
    let (s, v) = node.deploy("t/sql", HOSTILE);
    assert_eq!(s, 200, "{v}");
    let failures: Vec<String> = CASES
        .iter()
        .enumerate()
        .filter_map(|(i, case)| {
            run_case(&node, &format!("case{i}"), case)
                .err()
                .map(|e| format!("- {}: {e}", case.name))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );
}

#[test]
fn table_list_shows_the_guests_tables() {
    let tmp = tempfile::tempdir().unwrap();
    let node = Node::start(&tmp.path().join("data"), &[]);
    let (s, v) = node.deploy("t/sql", HOSTILE);
    assert_eq!(s, 200, "{v}");
    let body = serde_json::to_vec(&["CREATE TABLE listed (a, b)", "PRAGMA table_list"]).unwrap();
    let (s, v) = node.json("POST", "/v1/t/sql/attacker/tl/sql-batch", &body);
    assert_eq!(s, 200, "{v}");
    let rows = v["results"][1]["rows"].as_array().unwrap();
    // Columns: schema, name, type, ncol, wr, strict.
    let listed = rows.iter().find(|r| r[1] == "listed");
    assert_eq!(
        listed,
        Some(&serde_json::json!(["main", "listed", "table", 2, 0, 0])),
        "{v}"
    );
}
