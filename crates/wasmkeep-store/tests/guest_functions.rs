//! The linear-time replacements an actor's connection registers for
//! `instr`, `replace`, `trim`, `ltrim`, `rtrim` and `unhex` (ADR 0032, "One
//! call between two checks") give the built-ins' results: the same SQL runs
//! on a plain SQLite connection (the built-ins) and on an actor's (the
//! replacements) over generated arguments of every type, including text
//! that is not valid UTF-8, and the results must be equal. That the actor's
//! connection really runs the replacements is shown by
//! `hostile_sql.rs::one_call_on_large_values_ends_in_linear_time`, which
//! the built-ins could not pass.

use proptest::prelude::*;
use wasmkeep_store::{ActorDb, OpenMode, StoreError, StoreLimits, Value};

/// A connection with SQLite's built-ins (after the store's process-wide
/// SQLite settings, which must come before any connection).
fn plain() -> rusqlite::Connection {
    wasmkeep_store::sqlite_setup::sqlite_setup();
    rusqlite::Connection::open_in_memory().unwrap()
}

fn open() -> (tempfile::TempDir, ActorDb) {
    open_with(StoreLimits::default())
}

fn open_with(limits: StoreLimits) -> (tempfile::TempDir, ActorDb) {
    let dir = tempfile::tempdir().unwrap();
    let db = ActorDb::open(&dir.path().join("a"), &limits, OpenMode::Create)
        .unwrap()
        .unwrap();
    (dir, db)
}

/// Pieces the generated strings are made of: ASCII, hexadecimal digits,
/// valid multi-byte characters, lone lead and continuation bytes, an
/// overlong and a surrogate sequence, a five-byte sequence, zero bytes.
const PIECES: &[&[u8]] = &[
    b"a",
    b"b",
    b"A",
    b" ",
    b"x",
    b"-",
    b"0",
    b"41",
    b"f",
    b"9",
    b"\x00",
    "é".as_bytes(),
    "€".as_bytes(),
    "😀".as_bytes(),
    "\u{FFFD}".as_bytes(),
    b"\xc3",
    b"\x80",
    b"\xa9",
    b"\xbf",
    b"\xff",
    b"\xc0\x80",
    b"\xed\xa0\x80",
    b"\xf8\x88\x80\x80\x80",
];

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(0..PIECES.len(), 0..10)
        .prop_map(|ix| ix.into_iter().flat_map(|i| PIECES[i].to_vec()).collect())
}

/// One argument: its SQL (bound as `?N`) and its value.
#[derive(Debug, Clone)]
enum Arg {
    Text(Vec<u8>),
    Blob(Vec<u8>),
    Integer(i64),
    Real(f64),
    Null,
}

fn arg() -> impl Strategy<Value = Arg> {
    prop_oneof![
        6 => bytes().prop_map(Arg::Text),
        2 => bytes().prop_map(Arg::Blob),
        1 => prop::sample::select(vec![0i64, 1, -1, 12, 41, 1000]).prop_map(Arg::Integer),
        1 => prop::sample::select(vec![1.5f64, -0.25, 1e100, 41.0]).prop_map(Arg::Real),
        1 => Just(Arg::Null),
    ]
}

impl Arg {
    /// The SQL that passes the argument bound as `?n` (text goes in as a
    /// blob and is cast, so that it may be invalid UTF-8).
    fn sql(&self, n: usize) -> String {
        match self {
            Arg::Text(_) => format!("CAST(?{n} AS TEXT)"),
            _ => format!("?{n}"),
        }
    }

    fn value(&self) -> Value {
        match self {
            Arg::Text(b) | Arg::Blob(b) => Value::Blob(b.clone()),
            Arg::Integer(i) => Value::Integer(*i),
            Arg::Real(f) => Value::Real(*f),
            Arg::Null => Value::Null,
        }
    }
}

fn to_rusqlite(v: &Value) -> rusqlite::types::Value {
    match v {
        Value::Null => rusqlite::types::Value::Null,
        Value::Integer(i) => rusqlite::types::Value::Integer(*i),
        Value::Real(f) => rusqlite::types::Value::Real(*f),
        Value::Text(s) => rusqlite::types::Value::Text(s.clone()),
        Value::Blob(b) => rusqlite::types::Value::Blob(b.clone()),
    }
}

/// What a call returned: its type and its bytes (the result may be text
/// that is not UTF-8), or its error (SQLite's message, or "too big").
type Outcome = Result<(String, Vec<u8>), String>;

/// `function(args)` on both connections.
fn both(
    plain: &rusqlite::Connection,
    guest: &mut ActorDb,
    function: &str,
    args: &[Arg],
) -> (Outcome, Outcome) {
    let list: Vec<String> = args.iter().enumerate().map(|(i, a)| a.sql(i + 1)).collect();
    let sql = format!(
        "SELECT typeof(r), CAST(r AS BLOB) FROM (SELECT {function}({}) AS r)",
        list.join(", ")
    );
    let values: Vec<Value> = args.iter().map(Arg::value).collect();
    let builtin = plain
        .query_row(
            &sql,
            rusqlite::params_from_iter(values.iter().map(to_rusqlite)),
            |r| {
                let bytes = r.get::<_, Option<Vec<u8>>>(1)?.unwrap_or_default();
                Ok((r.get::<_, String>(0)?, bytes))
            },
        )
        .map_err(|e| match e {
            rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::TooBig => {
                "too big".to_owned()
            }
            rusqlite::Error::SqliteFailure(_, Some(m)) => m,
            e => e.to_string(),
        });
    let replacement = match guest.query(&sql, &values) {
        Ok(r) => match (&r.rows[0][0], &r.rows[0][1]) {
            (Value::Text(t), Value::Blob(b)) => Ok((t.clone(), b.clone())),
            (Value::Text(t), Value::Null) => Ok((t.clone(), Vec::new())),
            other => panic!("unexpected row {other:?}"),
        },
        Err(e) if e.code() == "value_too_large" => Err("too big".to_owned()),
        Err(StoreError::Sql(m)) => Err(m),
        Err(e) => Err(e.to_string()),
    };
    (builtin, replacement)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, .. ProptestConfig::default() })]

    #[test]
    fn replacements_return_what_the_built_ins_return(a in arg(), b in arg(), c in arg()) {
        let plain = plain();
        let (_d, mut guest) = open();
        for (function, args) in [
            ("instr", vec![a.clone(), b.clone()]),
            ("replace", vec![a.clone(), b.clone(), c.clone()]),
            ("trim", vec![a.clone(), b.clone()]),
            ("ltrim", vec![a.clone(), b.clone()]),
            ("rtrim", vec![a.clone(), b.clone()]),
            ("unhex", vec![a.clone(), b.clone()]),
        ] {
            let (builtin, replacement) = both(&plain, &mut guest, function, &args);
            prop_assert!(builtin.is_ok(), "the built-in failed: {function}{args:?}: {builtin:?}");
            prop_assert_eq!(builtin, replacement, "{}{:?}", function, args);
        }
    }

    /// Sets and needles drawn from the subject itself, so that they match
    /// (the cases above mostly do not).
    #[test]
    fn replacements_agree_where_their_arguments_overlap(
        s in bytes(),
        cut in (0usize..64, 0usize..64),
        rep in bytes(),
    ) {
        let plain = plain();
        let (_d, mut guest) = open();
        let (i, j) = (cut.0.min(s.len()), cut.1.min(s.len()));
        let part = s[i.min(j)..i.max(j)].to_vec();
        let mut ends = s[..i.min(s.len())].to_vec();
        ends.extend_from_slice(&s[j..]);
        for (function, args) in [
            ("instr", vec![Arg::Text(s.clone()), Arg::Text(part.clone())]),
            ("instr", vec![Arg::Blob(s.clone()), Arg::Blob(part.clone())]),
            ("instr", vec![Arg::Text(s.clone()), Arg::Blob(part.clone())]),
            ("replace", vec![Arg::Text(s.clone()), Arg::Text(part.clone()), Arg::Text(rep.clone())]),
            ("trim", vec![Arg::Text(s.clone()), Arg::Text(ends.clone())]),
            ("ltrim", vec![Arg::Text(s.clone()), Arg::Text(part.clone())]),
            ("rtrim", vec![Arg::Text(s.clone()), Arg::Text(ends.clone())]),
            ("unhex", vec![Arg::Text(s.clone()), Arg::Text(ends.clone())]),
        ] {
            let (builtin, replacement) = both(&plain, &mut guest, function, &args);
            prop_assert!(builtin.is_ok(), "the built-in failed: {function}{args:?}: {builtin:?}");
            prop_assert_eq!(builtin, replacement, "{}{:?}", function, args);
        }
    }
}

/// A length limit small enough for generated arguments to reach it.
const SMALL_LIMIT: usize = 48;

fn short_arg() -> impl Strategy<Value = Arg> {
    let short = prop::collection::vec(0..PIECES.len(), 0..16).prop_map(|ix| {
        let mut b: Vec<u8> = ix.into_iter().flat_map(|i| PIECES[i].to_vec()).collect();
        b.truncate(SMALL_LIMIT);
        b
    });
    prop_oneof![
        4 => short.clone().prop_map(Arg::Text),
        1 => short.prop_map(Arg::Blob),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, .. ProptestConfig::default() })]

    /// Where the built-ins fail as too big (a result over the length
    /// limit; `replace` on a text of exactly the limit's length; `trim`
    /// with a set of more characters than the limit allows), so do the
    /// replacements.
    #[test]
    fn replacements_fail_where_the_built_ins_fail(a in short_arg(), b in short_arg(), c in short_arg()) {
        let plain = plain();
        plain
            .set_limit(rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH, SMALL_LIMIT as i32)
            .unwrap();
        let (_d, mut guest) = open_with(StoreLimits {
            value_bytes_max: SMALL_LIMIT,
            ..StoreLimits::default()
        });
        // A text of exactly the limit's length.
        let mut full = match &a { Arg::Text(t) | Arg::Blob(t) => t.clone(), _ => Vec::new() };
        full.resize(SMALL_LIMIT, b'x');
        let full = Arg::Text(full);
        for (function, args) in [
            ("instr", vec![a.clone(), b.clone()]),
            ("replace", vec![a.clone(), b.clone(), c.clone()]),
            ("replace", vec![a.clone(), b.clone(), Arg::Text(vec![b'x'; SMALL_LIMIT])]),
            ("replace", vec![full.clone(), b.clone(), c.clone()]),
            ("trim", vec![full.clone(), b.clone()]),
            ("trim", vec![a.clone(), b.clone()]),
            ("ltrim", vec![a.clone(), b.clone()]),
            ("rtrim", vec![a.clone(), b.clone()]),
            ("unhex", vec![a.clone(), b.clone()]),
        ] {
            let (builtin, replacement) = both(&plain, &mut guest, function, &args);
            prop_assert_eq!(builtin, replacement, "{}{:?}", function, args);
        }
    }
}

#[test]
fn replacements_agree_on_hand_picked_edges() {
    let plain = plain();
    let (_d, mut guest) = open();
    let t = |s: &[u8]| Arg::Text(s.to_vec());
    let cases: Vec<(&str, Vec<Arg>)> = vec![
        ("instr", vec![t(b""), t(b"")]),
        ("instr", vec![t(b"abc"), t(b"")]),
        ("instr", vec![Arg::Blob(vec![]), Arg::Blob(b"a".to_vec())]),
        ("instr", vec![Arg::Integer(12345), Arg::Integer(34)]),
        ("instr", vec![Arg::Real(1.5), t(b".")]),
        ("instr", vec![t("aé€😀b".as_bytes()), t(b"b")]),
        ("instr", vec![t(b"\x80\x80a"), t(b"a")]),
        ("replace", vec![t(b"aaaa"), t(b"aa"), t(b"b")]),
        ("replace", vec![t(b"abc"), t(b"\x00b"), t(b"x")]),
        ("replace", vec![t(b"abc"), t(b""), t(b"x")]),
        ("replace", vec![t(b"abc"), t(b"b"), Arg::Null]),
        (
            "replace",
            vec![Arg::Integer(1001), Arg::Integer(0), Arg::Real(2.5)],
        ),
        ("trim", vec![t(b"  x  "), t(b" ")]),
        ("trim", vec![t(b"xx"), t(b"")]),
        ("trim", vec![t(b"\x00x\x00"), t(b"\x00")]),
        ("trim", vec![t(b"x\x00ab"), t(b"ab\x00x")]),
        ("ltrim", vec![t("ééx".as_bytes()), t(b"\xc3\xa9\xc3")]),
        ("rtrim", vec![t(b"x\xc3\x80\x80"), t(b"\x80\xc3\x80\x80")]),
        ("rtrim", vec![t(b"\x80\x80"), t(b"\x80")]),
        ("unhex", vec![t(b"41 42"), t(b" ")]),
        ("unhex", vec![t(b"4 1"), t(b" ")]),
        ("unhex", vec![t(b"41\x0042"), t(b"")]),
        ("unhex", vec![t("41é42".as_bytes()), t("é".as_bytes())]),
        ("unhex", vec![t(b"41\xff42"), t(b"\xff")]),
        ("unhex", vec![t(b"41\xc0\x8042"), t("\u{FFFD}".as_bytes())]),
        ("unhex", vec![t(b""), t(b"")]),
        ("unhex", vec![Arg::Integer(4142), t(b"")]),
    ];
    for (function, args) in cases {
        let (builtin, replacement) = both(&plain, &mut guest, function, &args);
        assert!(
            builtin.is_ok(),
            "the built-in failed: {function}{args:?}: {builtin:?}"
        );
        assert_eq!(builtin, replacement, "{function}{args:?}");
    }
}

#[test]
fn replacements_work_where_a_schema_that_is_not_trusted_calls_them() {
    // Views, generated columns and indexes on expressions may only call
    // functions marked innocuous: the replacements are, like the built-ins.
    let (_d, mut db) = open();
    for sql in [
        "CREATE TABLE t (a TEXT, i AS (instr(a, 'b')), r AS (replace(a, 'b', 'c')))",
        "CREATE INDEX t_trim ON t (trim(a, 'x'), ltrim(a, 'x'), rtrim(a, 'x'))",
        "CREATE VIEW v AS SELECT unhex(trim(a, 'x'), '-') AS h FROM t",
        "INSERT INTO t (a) VALUES ('xab-cdx')",
    ] {
        db.execute(sql, &[])
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let r = db
        .query(
            "SELECT i, r, trim(a, 'x'), (SELECT h FROM v) FROM t WHERE trim(a, 'x') = 'ab-cd'",
            &[],
        )
        .unwrap();
    assert_eq!(
        r.rows,
        vec![vec![
            Value::Integer(3),
            Value::Text("xac-cdx".into()),
            Value::Text("ab-cd".into()),
            Value::Blob(vec![0xab, 0xcd]),
        ]]
    );
}

/// JSON (and JSON5) texts: objects whose members the patches share, nested
/// objects, nulls that delete, arrays, numbers in JSON5 forms, duplicate
/// keys, and now and then text that is not JSON at all.
fn json() -> impl Strategy<Value = String> {
    let leaf = prop::sample::select(vec![
        "null",
        "1",
        "-2.5",
        "0x1F",
        "'s'",
        "\"t\"",
        "\"\\u0041\"",
        "true",
        "[]",
        "[1,null]",
        "{}",
    ])
    .prop_map(str::to_owned);
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop::collection::vec(
            (
                prop::sample::select(vec!["a", "b", "\"c\"", "'d'", "\"a\""]),
                inner,
            ),
            0..5,
        )
        .prop_map(|members| {
            let m: Vec<String> = members.iter().map(|(k, v)| format!("{k}:{v}")).collect();
            format!("{{{}}}", m.join(","))
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, .. ProptestConfig::default() })]

    /// The bounded `json_patch` runs SQLite's own: same results, same
    /// errors, and JSON that stays JSON to the function it is passed to.
    #[test]
    fn bounded_json_patch_returns_what_the_built_in_returns(
        target in json(),
        patch in json(),
        broken in prop::bool::weighted(0.1),
    ) {
        let plain = plain();
        let (_d, mut guest) = open();
        let patch = if broken { format!("{patch}}}") } else { patch };
        for sql in [
            "SELECT typeof(r), ifnull(hex(r), '') FROM (SELECT json_patch(?1, ?2) AS r)",
            "SELECT typeof(r), ifnull(hex(r), '') FROM (SELECT jsonb_patch(?1, ?2) AS r)",
            "SELECT typeof(r), ifnull(hex(r), '') FROM (SELECT json_patch(jsonb(?1), ?2) AS r)",
            "SELECT typeof(r), ifnull(hex(r), '') FROM (SELECT json_array(json_patch(?1, ?2), jsonb_patch(?1, ?2)) AS r)",
            "SELECT typeof(r), ifnull(hex(r), '') FROM (SELECT json_patch(?1, json_patch(?2, ?2)) AS r)",
        ] {
            let builtin = plain.query_row(sql, [&target, &patch], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            });
            let params = [Value::Text(target.clone()), Value::Text(patch.clone())];
            let bounded = guest.query(sql, &params);
            match (builtin, bounded) {
                (Ok(b), Ok(r)) => prop_assert_eq!(
                    vec![Value::Text(b.0), Value::Text(b.1)],
                    r.rows[0].clone(),
                    "{} {} {}", sql, target, patch
                ),
                (Err(b), Err(r)) => {
                    let b = b.to_string();
                    prop_assert!(r.to_string().contains(&b), "{} vs {}", b, r);
                }
                (b, r) => prop_assert!(false, "{sql} {target} {patch}: {b:?} vs {r:?}"),
            }
        }
    }
}

/// Words and separators FTS5 documents are made of: terms the queries
/// look for, sentence ends, runs of white space, a multi-byte letter, a
/// zero byte.
const WORDS: &[&str] = &[
    "a", "b", "c", "ab", "abc", "x", " ", " ", "  ", "\t", "\n", ". ", ": ", ".", "é", "\0",
];

fn document() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        8 => prop::collection::vec(prop::sample::select(WORDS), 0..40).prop_map(|w| Some(w.concat())),
        1 => Just(None),
    ]
}

/// A table, its rows, a query, and how `highlight` and `snippet` are
/// called.
#[derive(Debug, Clone)]
struct FtsCase {
    table: &'static str,
    rows: Vec<(Option<String>, Option<String>)>,
    query: &'static str,
    calls: Vec<String>,
}

fn fts_case() -> impl Strategy<Value = FtsCase> {
    let table = prop::sample::select(vec![
        "fts5(b1, b2)",
        "fts5(b1, b2, tokenize = 'trigram')",
        "fts5(b1, b2, tokenize = 'porter ascii')",
        "fts5(b1, b2, detail = column)",
        "fts5(b1, b2, detail = none)",
        "fts5(b1, b2, columnsize = 0)",
    ]);
    let query = prop::sample::select(vec![
        "a",
        "a OR b",
        "\"a b\"",
        "a AND c",
        "NEAR(a c, 3)",
        "a*",
        "b2 : a",
        "abc",
        "ab OR x",
        "b",
    ]);
    let text = prop::sample::select(vec!["'['", "']'", "''", "NULL", "'<b>'", "'...'"]);
    let col = prop::sample::select(vec!["-1", "0", "1", "2", "9"]);
    let n = prop::sample::select(vec!["-1", "0", "1", "3", "10", "64", "100"]);
    let call = prop_oneof![
        (col.clone(), text.clone(), text.clone())
            .prop_map(|(c, o, e)| format!("highlight(t, {c}, {o}, {e})")),
        (col, text.clone(), text.clone(), text, n)
            .prop_map(|(c, o, e, x, n)| format!("snippet(t, {c}, {o}, {e}, {x}, {n})")),
        Just("highlight(t, 0)".to_owned()),
        Just("snippet(t, 0, '[', ']', '...')".to_owned()),
    ];
    (
        table,
        prop::collection::vec((document(), document()), 1..6),
        query,
        prop::collection::vec(call, 1..4),
    )
        .prop_map(|(table, rows, query, calls)| FtsCase {
            table,
            rows,
            query,
            calls,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, .. ProptestConfig::default() })]

    /// The stand-ins for FTS5's `highlight` and `snippet` return what
    /// FTS5's own return, errors included, for every tokenizer and detail
    /// level, with and without a full-text query.
    #[test]
    fn fts5_highlight_and_snippet_return_what_fts5_returns(case in fts_case()) {
        let plain = plain();
        let (_d, mut guest) = open();
        let create = format!("CREATE VIRTUAL TABLE t USING {}", case.table);
        plain.execute(&create, []).unwrap();
        guest.execute(&create, &[]).unwrap();
        for (b1, b2) in &case.rows {
            let insert = "INSERT INTO t (b1, b2) VALUES (?1, ?2)";
            plain.execute(insert, [b1, b2]).unwrap();
            let v = |s: &Option<String>| s.clone().map_or(Value::Null, Value::Text);
            guest.execute(insert, &[v(b1), v(b2)]).unwrap();
        }
        for call in &case.calls {
            for filter in ["WHERE t MATCH ?1", "WHERE ?1 IS NOT NULL"] {
                let sql = format!("SELECT rowid, {call} FROM t {filter} ORDER BY rowid");
                let builtin: Result<Vec<(i64, Option<String>)>, String> = plain
                    .prepare(&sql)
                    .and_then(|mut s| {
                        s.query_map([case.query], |r| Ok((r.get(0)?, r.get(1)?)))?
                            .collect()
                    })
                    .map_err(|e| match e {
                        rusqlite::Error::SqliteFailure(f, m) => m.unwrap_or_else(|| f.to_string()),
                        e => e.to_string(),
                    });
                let ours = guest
                    .query(&sql, &[Value::Text(case.query.to_owned())])
                    .map(|r| {
                        r.rows
                            .into_iter()
                            .map(|row| match (&row[0], &row[1]) {
                                (Value::Integer(i), Value::Text(t)) => (*i, Some(t.clone())),
                                (Value::Integer(i), Value::Null) => (*i, None),
                                other => panic!("unexpected row {other:?}"),
                            })
                            .collect::<Vec<_>>()
                    })
                    .map_err(|e| match e {
                        StoreError::Sql(m) => m,
                        // FTS5's `snippet` fails so without phrases.
                        StoreError::Io(m) if m.contains("out of memory") => "out of memory".into(),
                        e => e.to_string(),
                    });
                prop_assert_eq!(builtin, ours, "{} {:?}", sql, case);
            }
        }
    }
}

/// Tables of every built-in tokenizer, with options, that the term bound
/// of an actor's FTS5 queries (`limits::FTS5_QUERY_TOKENS_MAX`) wraps.
const TOKENIZED_TABLES: &[&str] = &[
    "fts5(b1, b2)",
    "fts5(b1, b2, tokenize = unicode61)",
    "fts5(b1, b2, tokenize = 'unicode61 remove_diacritics 0')",
    "fts5(b1, b2, tokenize = 'unicode61 tokenchars ''.'' separators ''b''')",
    "fts5(b1, b2, tokenize = 'ascii')",
    "fts5(b1, b2, tokenize = 'porter')",
    "fts5(b1, b2, tokenize = 'porter unicode61 remove_diacritics 1')",
    "fts5(b1, b2, tokenize = 'porter ascii')",
    "fts5(b1, b2, tokenize = 'trigram')",
    "fts5(b1, b2, tokenize = 'trigram case_sensitive 1')",
    "fts5(b1, b2, tokenize = 'trigram remove_diacritics 1')",
    "fts5(b1, b2, detail = column)",
    "fts5(b1, b2, tokenize = 'porter', detail = none)",
];

/// Words of documents and queries for the tokenizers: stems, case,
/// diacritics, punctuation, the separator and token characters above.
const TOKEN_WORDS: &[&str] = &[
    "running", "runs", "run", "Abc", "abc", "ABCD", "é", "e", "École", "ecole", "a.b", "xby", " ",
    ", ", ". ", "\t", "-",
];

/// Queries as a guest writes them: terms, prefixes, phrases, NEAR, column
/// filters, boolean operators, and LIKE and GLOB (which a trigram table
/// answers from its index).
const TOKEN_QUERIES: &[&str] = &[
    "WHERE t MATCH 'run'",
    "WHERE t MATCH 'runs OR ecole'",
    "WHERE t MATCH 'abc*'",
    "WHERE t MATCH '\"abc abcd\"'",
    "WHERE t MATCH 'NEAR(run abc, 2)'",
    "WHERE t MATCH 'b2 : école'",
    "WHERE t MATCH 'abc NOT e'",
    "WHERE t MATCH 'a.b'",
    "WHERE t MATCH 'xby'",
    "WHERE t MATCH 'bcd'",
    "WHERE t = 'Abc'",
    "WHERE b1 LIKE '%abc%'",
    "WHERE b1 GLOB '*bcd*'",
    "WHERE b2 LIKE '%éc%'",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 100, .. ProptestConfig::default() })]

    /// An actor's tokenizers count query terms and otherwise are FTS5's
    /// own: the same tables and queries give the same rows, ranks and
    /// errors as on a plain connection.
    #[test]
    fn counting_tokenizers_return_what_fts5_returns(
        table in prop::sample::select(TOKENIZED_TABLES),
        rows in prop::collection::vec(
            (
                prop::collection::vec(prop::sample::select(TOKEN_WORDS), 0..12),
                prop::collection::vec(prop::sample::select(TOKEN_WORDS), 0..12),
            ),
            1..8,
        ),
    ) {
        let plain = plain();
        let (_d, mut guest) = open();
        let create = format!("CREATE VIRTUAL TABLE t USING {table}");
        plain.execute(&create, []).unwrap();
        guest.execute(&create, &[]).unwrap();
        for (b1, b2) in &rows {
            let (b1, b2) = (b1.concat(), b2.concat());
            let insert = "INSERT INTO t (b1, b2) VALUES (?1, ?2)";
            plain.execute(insert, [&b1, &b2]).unwrap();
            guest.execute(insert, &[Value::Text(b1), Value::Text(b2)]).unwrap();
        }
        for filter in TOKEN_QUERIES {
            let sql = format!(
                "SELECT rowid, quote(bm25(t)), highlight(t, 0, '[', ']') FROM t {filter} ORDER BY rowid"
            );
            let builtin: Result<Vec<Vec<Value>>, String> = plain
                .prepare(&sql)
                .and_then(|mut s| {
                    s.query_map([], |r| {
                        Ok(vec![
                            Value::Integer(r.get(0)?),
                            Value::Text(r.get(1)?),
                            r.get::<_, Option<String>>(2)?.map_or(Value::Null, Value::Text),
                        ])
                    })?
                    .collect()
                })
                .map_err(|e| match e {
                    rusqlite::Error::SqliteFailure(f, m) => m.unwrap_or_else(|| f.to_string()),
                    e => e.to_string(),
                });
            let ours = guest.query(&sql, &[]).map(|r| r.rows).map_err(|e| match e {
                StoreError::Sql(m) => m,
                e => e.to_string(),
            });
            prop_assert_eq!(builtin, ours, "{} {}", table, sql);
        }
    }
}
