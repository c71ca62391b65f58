//! Architecture invariants (ARCHITECTURE.md), checked against the
//! workspace's declared dependencies.

use std::collections::BTreeMap;
use std::process::Command;

fn deps() -> BTreeMap<String, Vec<String>> {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .collect();
            (p["name"].as_str().unwrap().to_owned(), deps)
        })
        .collect()
}

fn assert_none(deps: &BTreeMap<String, Vec<String>>, krate: &str, banned: &[&str], why: &str) {
    let have = &deps[krate];
    for b in banned {
        assert!(
            !have.iter().any(|d| d == b),
            "{krate} depends on {b}: {why}"
        );
    }
}

#[test]
fn dependencies_point_one_way() {
    let d = deps();
    assert!(
        d["wasmkeep-cluster"].is_empty(),
        "the cluster protocol is pure: {:?}",
        d["wasmkeep-cluster"]
    );
    assert_eq!(d["wasmkeep-sim"], vec!["wasmkeep-cluster".to_string()]);
    // One protocol, two drivers: the server links the very crate the
    // simulator proves (and passes it `Rules::SAFE`, checked in
    // wasmkeep-server's `cluster::tests`).
    assert!(
        d["wasmkeep-server"].iter().any(|x| x == "wasmkeep-cluster"),
        "the server drives wasmkeep-cluster's machines"
    );
    assert_none(
        &d,
        "wasmkeep-store",
        &[
            "wasmtime",
            "tokio",
            "axum",
            "hyper",
            "wasmkeep-runtime",
            "serde_json",
        ],
        "the store knows one actor's SQLite file and nothing else",
    );
    assert_none(
        &d,
        "wasmkeep-runtime",
        &["axum", "hyper", "serde_json", "wasmkeep-server", "ureq"],
        "the runtime serves no HTTP and knows no JSON",
    );
    for k in d.keys() {
        if !["wasmkeep-server", "wasmkeep", "wasmkeep-bench"].contains(&k.as_str()) {
            assert_none(&d, k, &["axum"], "only the server speaks HTTP");
        }
        if k != "wasmkeep-replica" {
            assert_none(
                &d,
                k,
                &["object_store"],
                "only the replica talks to object storage",
            );
        }
        // ADR 0047: which HTTP client for which use.
        if k != "wasmkeep" {
            assert_none(&d, k, &["ureq"], "ureq is the CLI's client of a node");
        }
        if k != "wasmkeep-runtime" {
            assert_none(
                &d,
                k,
                &["reqwest"],
                "reqwest makes actors' outbound calls, in the runtime's outbox",
            );
        }
    }
    assert_none(
        &d,
        "wasmkeep-replica",
        &["wasmtime", "wasmkeep-runtime", "wasmkeep-server", "axum"],
        "the replica moves database pages; it knows no guests and no HTTP API",
    );
}

/// The runtime's one HTTP client is the outbox's (ADR 0040): actors' calls
/// go out through the dispatcher (`dispatch.rs`, its client in
/// `dispatch/http.rs`), under the app's policy, and nothing else in the
/// runtime makes a request; `outbox/mod.rs` only parses a guest's URL with
/// reqwest's `Url`.
#[test]
fn only_the_outbox_makes_http_requests_in_the_runtime() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../wasmkeep-runtime/src");
    let mut found = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read_to_string(&p).unwrap().contains("reqwest") {
                found.push(p.strip_prefix(&src).unwrap().display().to_string());
            }
        }
    }
    found.sort();
    assert!(
        !found.is_empty(),
        "the outbox's client is where it is said to be"
    );
    for f in &found {
        assert!(
            ["dispatch.rs", "dispatch/http.rs", "outbox/mod.rs"].contains(&f.as_str()),
            "{f} uses reqwest: only the outbox's dispatcher may"
        );
    }
}

/// The node binary carries no test code (issue 34): built as `cargo build
/// --release -p wasmkeep` builds it (normal and build dependencies, the
/// features they turn on), it links neither the test kit nor any crate with
/// its test feature on: the runtime's fault switches (`test-faults`), the
/// replica's test buckets (`testing`), the server's and store's unsafe
/// rules (`test-faults`). Test crates turn those on through their
/// dev-dependencies only.
#[test]
fn the_release_binary_has_no_test_kit_and_no_fault_switch() {
    let tree = cargo_tree("wasmkeep", "features,normal,build");
    assert!(tree.contains("wasmkeep-runtime"), "{tree}");
    for banned in [
        "wasmkeep-testkit",
        "feature \"test-faults\"",
        "feature \"testing\"",
    ] {
        let hits: Vec<&str> = tree.lines().filter(|l| l.contains(banned)).collect();
        assert!(hits.is_empty(), "the node binary links {banned}: {hits:?}");
    }
}

/// The process test kit (ADR 0055) exists to be quick to build: whatever
/// it links, a new actor crate's first `cargo test` compiles. It must
/// never pull in the runtime, wasmtime, SQLite or an async stack.
#[test]
fn the_process_test_kit_compiles_no_runtime() {
    let tree = cargo_tree("wasmkeep-testnode", "normal,build");
    assert!(tree.contains("serde_json"), "{tree}");
    for banned in [
        "wasmkeep-runtime",
        "wasmkeep-store",
        "wasmkeep-testkit",
        "wasmtime",
        "rusqlite",
        "tokio",
        "hyper",
        "reqwest",
    ] {
        let hits: Vec<&str> = tree.lines().filter(|l| l.contains(banned)).collect();
        assert!(
            hits.is_empty(),
            "the process test kit links {banned}: {hits:?}"
        );
    }
}

/// `cargo tree` of one package, one crate a line, with the edges `edges`.
fn cargo_tree(package: &str, edges: &str) -> String {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-p", package, "--prefix", "none"])
        .args(["-e", edges])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
