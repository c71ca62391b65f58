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
        "the runtime knows nothing of HTTP or JSON",
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
    }
    assert_none(
        &d,
        "wasmkeep-replica",
        &["wasmtime", "wasmkeep-runtime", "wasmkeep-server", "axum"],
        "the replica moves database pages; it knows no guests and no HTTP API",
    );
}
