//! Kept versions and rollback on one node (issue 38, "Versions"), through
//! the CLI as an operator runs it: every deploy is a version, `versions`
//! lists the kept ones, `rollback` deploys one again with its own
//! manifest as a new version, actors keep their data, and what no kept
//! version names leaves the disk.

mod common;

use std::path::Path;

use common::Node;

fn cli(node: &Node, args: &[&str]) -> (i32, String, String) {
    node.cli(args, &[("USER", "ops")])
}

#[track_caller]
fn ok(node: &Node, args: &[&str]) -> String {
    let (status, stdout, stderr) = cli(node, args);
    assert_eq!(status, 0, "{args:?}: {stdout}{stderr}");
    stdout
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.to_str().unwrap().to_owned()
}

fn versions(node: &Node) -> Vec<(u64, String, Option<u64>)> {
    let v: serde_json::Value =
        serde_json::from_str(&ok(node, &["versions", "acme/app", "--json"])).unwrap();
    v["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["version"].as_u64().unwrap(),
                k["hash"].as_str().unwrap().to_owned(),
                k["rollback_of"].as_u64(),
            )
        })
        .collect()
}

fn components_on_disk(data: &Path) -> usize {
    std::fs::read_dir(data.join("apps/acme/app"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".wasm")
        })
        .count()
}

#[test]
fn every_deploy_is_a_version_and_rollback_returns_to_a_kept_one_with_its_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = write(d, "node.toml", b"app_versions_max = 3\n");
    let data = d.join("data");
    let mut node = Node::start(&data, &["--config", &config]);
    let hello = write(d, "hello.wasm", wasmkeep_guests::HELLO);
    let demo = write(d, "demo.wasm", wasmkeep_guests::DEMO);
    let testbed = write(d, "testbed.wasm", wasmkeep_guests::TESTBED);
    let manifest = write(d, "app.toml", b"[vars]\nGREETING = \"from version 2\"\n");

    let out = ok(&node, &["deploy", "acme/app", &hello]);
    assert!(out.contains("deployed acme/app version 1 "), "{out}");
    assert_eq!(
        node.post("/v1/acme/app/counter/a/increment", b"").1,
        r#"{"value":1}"#
    );
    let out = ok(
        &node,
        &["deploy", "acme/app", &demo, "--manifest", &manifest],
    );
    assert!(out.contains("version 2 "), "{out}");
    let greeting = "/v1/acme/app/pinger/p/config?name=GREETING";
    assert!(node.get(greeting).1.contains("from version 2"));

    let listed = ok(&node, &["versions", "acme/app"]);
    assert!(listed.contains("acme/app: 2 kept"), "{listed}");
    assert!(
        listed.contains("current") && listed.contains("ops@"),
        "{listed}"
    );

    // Back to the one before: hello's classes again, the actor's data kept.
    let out = ok(&node, &["rollback", "acme/app"]);
    assert!(
        out.contains("back to version 1: deployed again as version 3 "),
        "{out}"
    );
    assert_eq!(node.get(greeting).0, 404, "no pinger in version 1");
    assert_eq!(node.get("/v1/acme/app/counter/a/value").1, r#"{"value":1}"#);
    // To a named one: its manifest comes back with it.
    ok(&node, &["rollback", "acme/app", "--to", "2"]);
    assert!(node.get(greeting).1.contains("from version 2"));
    let kept = versions(&node);
    assert_eq!(
        kept.iter().map(|k| (k.0, k.2)).collect::<Vec<_>>(),
        [(2, None), (3, Some(1)), (4, Some(2))],
        "the newest three"
    );
    assert_eq!(kept[1].1, {
        let v: serde_json::Value =
            serde_json::from_str(&ok(&node, &["deploy", "acme/other", &hello, "--json"])).unwrap();
        v["hash"].as_str().unwrap().to_owned()
    });

    // Version 1 is no longer kept: refused by name, nothing changes.
    let (status, _, err) = cli(&node, &["rollback", "acme/app", "--to", "1"]);
    assert_eq!(status, 1);
    assert!(err.contains("404 version_not_found"), "{err}");
    assert!(node.get(greeting).1.contains("from version 2"));

    // Components no kept version names leave the disk.
    let out = ok(&node, &["deploy", "acme/app", &testbed]); // 5: kept 3, 4, 5
    assert!(out.contains("version 5 "), "{out}");
    assert_eq!(components_on_disk(&data), 3, "hello, demo and testbed");
    // The same component and manifest again is the same version.
    let out = ok(&node, &["deploy", "acme/app", &testbed]);
    assert!(out.contains("version 5 "), "{out}");
    let other = write(d, "other.toml", b"[vars]\nA = \"1\"\n");
    ok(
        &node,
        &["deploy", "acme/app", &testbed, "--manifest", &other],
    ); // 6: kept 4, 5, 6
    assert_eq!(components_on_disk(&data), 2, "demo and testbed");
    ok(&node, &["deploy", "acme/app", &testbed]); // 7: kept 5, 6, 7
    assert_eq!(components_on_disk(&data), 1, "testbed alone");

    // A restart keeps the versions and serves the newest.
    node.stop();
    let node = Node::start(&data, &["--config", &config]);
    assert_eq!(
        versions(&node).iter().map(|k| k.0).collect::<Vec<_>>(),
        [5, 6, 7]
    );
    let (status, _, err) = cli(&node, &["rollback", "nobody/app"]);
    assert_eq!(status, 1);
    assert!(err.contains("404 tenant_not_found"), "{err}");
}
