//! Guest SQL, fuzzed (issue 33): random statements from a grammar of
//! SQLite's (tables, views, triggers, indexes, common table expressions,
//! subqueries, the functions of the allow-list and beyond it, pragmas,
//! virtual tables, deep expressions) run through the attacker's actors, at
//! the top of the guest's wasm stack and at the bottom of it, against a
//! real node with default settings. Every statement gets an answer (its
//! rows, or an error with a code), a neighbour is served throughout, and
//! the node lives.
//!
//! It runs for `WASMKEEP_FUZZ_SECONDS` (default 60) from the seed in
//! `WASMKEEP_FUZZ_SEED` (default: from the clock, printed, so that a
//! failure can be run again).

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

mod common;

use std::time::{Duration, Instant};

use common::hostile::*;
use serde_json::Value as Json;

/// xorshift64*: small, deterministic from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len() as u64) as usize]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Functions to call: the allow-list's, and some it refuses.
const FUNCTIONS: &[&str] = &[
    "abs",
    "length",
    "lower",
    "upper",
    "substr",
    "replace",
    "instr",
    "trim",
    "hex",
    "unhex",
    "quote",
    "typeof",
    "coalesce",
    "ifnull",
    "nullif",
    "max",
    "min",
    "round",
    "random",
    "randomblob",
    "zeroblob",
    "printf",
    "format",
    "json",
    "json_array",
    "json_object",
    "json_extract",
    "json_set",
    "json_patch",
    "json_each",
    "json_tree",
    "group_concat",
    "sum",
    "count",
    "avg",
    "total",
    "char",
    "unicode",
    "glob",
    "like",
    "sqrt",
    "pow",
    "ln",
    "exp",
    "date",
    "time",
    "datetime",
    "julianday",
    "strftime",
    "load_extension",
    "fts3_tokenizer",
    "readfile",
    "writefile",
    "sqlite_version",
    "changes",
    "last_insert_rowid",
    "likelihood",
    "iif",
    "concat",
    "concat_ws",
    "octet_length",
    "sign",
    "mod",
    "trunc",
];

const PRAGMAS: &[&str] = &[
    "PRAGMA table_info(t0)",
    "PRAGMA journal_mode = DELETE",
    "PRAGMA writable_schema = ON",
    "PRAGMA foreign_keys = OFF",
    "PRAGMA recursive_triggers = ON",
    "PRAGMA cache_size = -1000000",
    "PRAGMA max_page_count = 1",
    "PRAGMA integrity_check",
    "PRAGMA index_list(t0)",
    "PRAGMA synchronous = OFF",
];

/// The grammar's state: the tables, views and columns made so far.
struct Gen {
    rng: Rng,
    tables: Vec<String>,
    views: Vec<String>,
    n: u64,
}

impl Gen {
    fn name(&mut self, prefix: &str) -> String {
        self.n += 1;
        format!("{prefix}{}", self.n)
    }

    fn source(&mut self) -> String {
        let mut all: Vec<String> = self.tables.clone();
        all.extend(self.views.iter().cloned());
        all.extend([
            "generate_series(1, 10)".to_string(),
            "json_each('[1,2,3]')".into(),
            "sqlite_schema".into(),
            "_wasmkeep_kv".into(),
            "pragma_table_info('t0')".into(),
        ]);
        all[self.rng.below(all.len() as u64) as usize].clone()
    }

    fn literal(&mut self) -> String {
        match self.rng.below(7) {
            0 => "NULL".into(),
            1 => self.rng.below(1000).to_string(),
            2 => format!("'{}'", "x".repeat(self.rng.below(40) as usize)),
            3 => format!("x'{}'", "ab".repeat(self.rng.below(16) as usize)),
            4 => format!("{}.5", self.rng.below(100)),
            5 => "'[1,{\"a\":[2,3]}]'".into(),
            _ => format!("-{}", self.rng.below(1 << 40)),
        }
    }

    fn expr(&mut self, depth: u32) -> String {
        if depth == 0 || self.rng.chance(25) {
            return match self.rng.below(3) {
                0 => "x".into(),
                _ => self.literal(),
            };
        }
        let d = depth - 1;
        match self.rng.below(9) {
            0 => format!(
                "({} {} {})",
                self.expr(d),
                self.rng.pick(&[
                    "+", "-", "*", "/", "%", "||", "AND", "OR", "=", "<", "LIKE", "GLOB", "IS",
                    "->", "->>"
                ]),
                self.expr(d)
            ),
            1 => {
                let f = self.rng.pick(FUNCTIONS);
                let args: Vec<String> = (0..self.rng.below(4)).map(|_| self.expr(d)).collect();
                format!("{f}({})", args.join(", "))
            }
            2 => format!(
                "CASE WHEN {} THEN {} ELSE {} END",
                self.expr(d),
                self.expr(d),
                self.expr(d)
            ),
            3 => format!("({})", self.select(d)),
            4 => format!(
                "CAST({} AS {})",
                self.expr(d),
                self.rng.pick(&["INTEGER", "TEXT", "BLOB", "REAL"])
            ),
            5 => format!("{} IN ({})", self.expr(d), self.select(d)),
            6 => format!("EXISTS ({})", self.select(d)),
            7 => {
                // A deep chain of one operator: the parser's and the code
                // generator's depth.
                let n = self.rng.below(1200) as usize;
                format!("{}1{}", "(".repeat(n), ")".repeat(n))
            }
            _ => format!("NOT {}", self.expr(d)),
        }
    }

    fn select(&mut self, depth: u32) -> String {
        let from = self.source();
        let mut s = format!(
            "SELECT {} AS x FROM {from}",
            self.expr(depth.saturating_sub(1))
        );
        if self.rng.chance(30) {
            s.push_str(&format!(" WHERE {}", self.expr(depth.saturating_sub(1))));
        }
        if self.rng.chance(15) {
            let other = self.source();
            s = format!("SELECT * FROM ({s}) JOIN {other}");
        }
        if self.rng.chance(15) {
            s.push_str(&format!(
                " UNION ALL {}",
                self.select(depth.saturating_sub(1))
            ));
        }
        if self.rng.chance(20) {
            s.push_str(&format!(" ORDER BY 1 LIMIT {}", self.rng.below(100)));
        }
        s
    }

    fn statement(&mut self) -> String {
        match self.rng.below(14) {
            0 => {
                let t = self.name("t");
                let cols = (0..=self.rng.below(4))
                    .map(|i| format!("c{i}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                self.tables.push(t.clone());
                format!("CREATE TABLE {t}(x, {cols})")
            }
            1 if !self.tables.is_empty() => {
                let v = self.name("v");
                let s = self.select(3);
                self.views.push(v.clone());
                format!("CREATE VIEW {v} AS {s}")
            }
            2 if !self.tables.is_empty() => {
                let t = self.tables[self.rng.below(self.tables.len() as u64) as usize].clone();
                let target = self.tables[self.rng.below(self.tables.len() as u64) as usize].clone();
                let g = self.name("g");
                let when = self.rng.pick(&[
                    "AFTER INSERT",
                    "BEFORE INSERT",
                    "AFTER UPDATE",
                    "AFTER DELETE",
                ]);
                format!(
                    "CREATE TRIGGER {g} {when} ON {t} BEGIN INSERT INTO {target}(x) VALUES ({}); END",
                    self.expr(2)
                )
            }
            3 if !self.tables.is_empty() => {
                let t = self.tables[self.rng.below(self.tables.len() as u64) as usize].clone();
                let i = self.name("i");
                format!("CREATE INDEX {i} ON {t}({})", self.expr(2))
            }
            4 if !self.tables.is_empty() => {
                let t = self.tables[self.rng.below(self.tables.len() as u64) as usize].clone();
                let s = self.select(3);
                format!("INSERT INTO {t}(x) {s}")
            }
            5 if !self.tables.is_empty() => {
                let t = self.tables[self.rng.below(self.tables.len() as u64) as usize].clone();
                format!("UPDATE {t} SET x = {} WHERE {}", self.expr(3), self.expr(2))
            }
            6 if !self.tables.is_empty() => {
                let t = self.tables[self.rng.below(self.tables.len() as u64) as usize].clone();
                format!("DELETE FROM {t} WHERE {}", self.expr(2))
            }
            7 => {
                let bounded = self.rng.chance(70);
                let stop = if bounded {
                    format!(" WHERE n < {}", self.rng.below(5000))
                } else {
                    String::new()
                };
                format!(
                    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r{stop}) SELECT {} FROM r",
                    self.rng.pick(&[
                        "count(*)",
                        "max(n)",
                        "group_concat(n)",
                        "sum(length(randomblob(n)))"
                    ])
                )
            }
            8 => self.rng.pick(PRAGMAS).to_string(),
            9 => {
                let v = self.name("f");
                format!(
                    "CREATE VIRTUAL TABLE {v} USING {}",
                    self.rng.pick(&[
                        "fts5(body)",
                        "rtree(id, a, b)",
                        "fts3(body)",
                        "csv(data='x')",
                        "dbstat"
                    ])
                )
            }
            10 => self
                .rng
                .pick(&[
                    "ATTACH 'x.db' AS x",
                    "VACUUM",
                    "VACUUM INTO '/tmp/x.db'",
                    "ANALYZE",
                    "REINDEX",
                    "DETACH x",
                    "SAVEPOINT s",
                    "ROLLBACK",
                    "COMMIT",
                    "BEGIN",
                ])
                .to_string(),
            11 => {
                // One of SQLite's recursive paths, at or past its limit.
                let n = 900 + self.rng.below(300) as usize;
                match self.rng.below(3) {
                    0 => format!(
                        "SELECT {}1{}",
                        "(SELECT ".repeat(n.min(1000)),
                        ")".repeat(n.min(1000))
                    ),
                    1 => format!("SELECT json('{}{}')", "[".repeat(n), "]".repeat(n)),
                    _ => format!("SELECT 1{}", " UNION ALL SELECT 1".repeat(n / 2)),
                }
            }
            _ => self.select(4),
        }
    }
}

/// Whether an answer is one: the statements' results, or an error with a
/// code.
fn answered(status: u16, v: &Json) -> bool {
    match status {
        200 => v["results"].is_array(),
        _ => !attack_code(v).is_empty(),
    }
}

#[test]
fn random_guest_sql_on_deep_and_shallow_stacks_always_gets_an_answer() {
    let seconds: u64 = std::env::var("WASMKEEP_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let seed: u64 = std::env::var("WASMKEEP_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("fuzzing guest SQL for {seconds} s from WASMKEEP_FUZZ_SEED={seed}");
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), "workers = 2\nevent_cpu_ms_max = 2000\n");
    let mut neighbour = Neighbour::new(&node, "n");
    let mut g = Gen {
        rng: Rng(seed),
        tables: Vec::new(),
        views: Vec::new(),
        n: 0,
    };
    let until = Instant::now() + Duration::from_secs(seconds);
    let (mut batches, mut statements, mut errors) = (0u64, 0u64, 0u64);
    while Instant::now() < until {
        let batch: Vec<String> = (0..=g.rng.below(6)).map(|_| g.statement()).collect();
        // A fresh actor now and then: the first statement on an actor
        // compiles what it needs (triggers above all).
        let actor = format!("fz{}", batches / 20);
        let deep = g.rng.chance(50);
        let route = if deep {
            format!("/deep-sql?frames={}", 2000 + g.rng.below(1200))
        } else {
            "/sql-batch".to_string()
        };
        let body = serde_json::to_vec(&batch).unwrap();
        let got = http(&node.base, "POST", &format!("{EVIL}/{actor}{route}"), &body);
        let (s, v) = got.unwrap_or_else(|e| {
            panic!(
                "no answer (seed {seed}) to {batch:?} on a {} stack: {e}",
                if deep { "deep" } else { "shallow" }
            )
        });
        // The guest's own stack running out is an answer too (a trap).
        assert!(
            answered(s, &v) || attack_code(&v) == "guest_trap",
            "seed {seed}: {s} {v} for {batch:?}"
        );
        batches += 1;
        statements += batch.len() as u64;
        errors += u64::from(s != 200);
        if batches % 25 == 0 {
            neighbour
                .increment()
                .unwrap_or_else(|e| panic!("seed {seed}: the neighbour was not served: {e}"));
            assert_alive(&node);
        }
    }
    eprintln!("{batches} batches, {statements} statements, {errors} refused; the node lives");
    assert_alive(&node);
    neighbour.increment().unwrap();
    drop(node);
}
