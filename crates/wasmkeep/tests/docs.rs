//! Claims of the docs that the code can contradict, held against the code
//! (issue 34): the benchmark page's workload table against the workloads
//! `wasmkeep bench` runs, ARCHITECTURE.md's threads table against the
//! threads the code starts, and the `syncfs` threshold the README and
//! ARCHITECTURE.md give against `SYNCFS_FILES_MIN`. (The configuration
//! table is held by a unit test of `config.rs`.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::ValueEnum;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative))
        .unwrap_or_else(|e| panic!("read {relative}: {e}"))
}

/// The text of `doc` from the heading `heading` to the next heading of
/// the same level.
fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let start = doc
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no heading `{heading}`"));
    let level = heading.split(' ').next().unwrap();
    let body = &doc[start + heading.len() + 2..];
    let end = body.find(&format!("\n{level} ")).unwrap_or(body.len());
    &body[..end]
}

/// The first cells of a Markdown table's rows (the header and the rule
/// left out).
fn first_cells(table: &str) -> Vec<String> {
    table
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| l.split('|').nth(1).unwrap_or("").trim().to_owned())
        .collect()
}

#[test]
fn the_benchmark_page_lists_every_workload_the_bench_runs() {
    let page = read("docs/benchmarks.md");
    let listed: BTreeSet<String> = first_cells(section(&page, "## The workloads"))
        .iter()
        .map(|c| c.to_ascii_lowercase())
        .collect();
    let run: BTreeSet<String> = wasmkeep_bench::Workload::value_variants()
        .iter()
        .map(|w| w.id().to_owned())
        .collect();
    assert_eq!(
        listed, run,
        "docs/benchmarks.md's workload table and `wasmkeep bench --workloads` differ"
    );
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The names the code gives its threads: the `"wasmkeep-…"` literal on a
/// line that names a thread (`.name(` or `.thread_name(`), a `{…}` in it
/// written `N`.
fn thread_names_in_code() -> BTreeSet<String> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(root().join("crates")).unwrap() {
        let src = e.unwrap().path().join("src");
        if src.is_dir() {
            sources(&src, &mut files);
        }
    }
    let mut names = BTreeSet::new();
    for f in files {
        for line in std::fs::read_to_string(&f).unwrap().lines() {
            if !(line.contains(".name(") || line.contains(".thread_name(")) {
                continue;
            }
            let Some(at) = line.find("\"wasmkeep-") else {
                continue;
            };
            let rest = &line[at + 1..];
            let literal = &rest[..rest.find('"').expect("a closed literal")];
            let mut name = String::new();
            let mut in_brace = false;
            for c in literal.chars() {
                match c {
                    '{' => in_brace = true,
                    '}' => {
                        in_brace = false;
                        name.push('N');
                    }
                    _ if in_brace => {}
                    _ => name.push(c),
                }
            }
            names.insert(name);
        }
    }
    names
}

#[test]
fn the_threads_table_names_every_thread_the_code_starts() {
    let arch = read("ARCHITECTURE.md");
    let mut listed = BTreeSet::new();
    for cell in first_cells(section(&arch, "## Threads")) {
        for part in cell.split('`').skip(1).step_by(2) {
            listed.insert(part.to_owned());
        }
    }
    let started = thread_names_in_code();
    assert!(
        started.len() >= 10,
        "too few thread names found: {started:?}"
    );
    let missing: Vec<_> = started.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&started).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "ARCHITECTURE.md's threads table lacks {missing:?} and names {stale:?}, which no code starts"
    );
}

#[test]
fn the_syncfs_threshold_in_the_docs_is_the_codes() {
    let n = wasmkeep_store::sync::SYNCFS_FILES_MIN;
    let readme = read("README.md")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let arch = read("ARCHITECTURE.md")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        readme.contains(&format!("one `syncfs` for {n} files or more")),
        "README.md does not give the syncfs threshold as {n} files"
    );
    assert!(
        arch.contains(&format!("one `syncfs` from {n} files on")),
        "ARCHITECTURE.md does not give the syncfs threshold as {n} files"
    );
}
