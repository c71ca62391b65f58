//! The cluster as an operator sees it (issue 18's contract), through real
//! processes: three `wasmkeep serve` nodes started with exactly
//! `--data DIR --listen 127.0.0.1:PORT --bucket file:///PATH --advertise
//! http://127.0.0.1:PORT --examples` (default timings, no cluster secret:
//! loopback) form a cluster; `GET /admin/v1/cluster` on each names the three;
//! the counter example works through any node and every node agrees on its
//! value; after one node's SIGTERM the view shows two; `wasmkeep cluster`
//! prints the live nodes' addresses. A single node answers 404
//! `not_a_cluster`, and the CLI exits non-zero saying so.
//!
//! No test asserts how long anything takes: waits poll with a generous bound.

mod common;

use std::collections::BTreeSet;

use common::Node;
use common::cluster::{self, free_port};

/// Waits until `f` holds (a bound of 180 s for a hung cluster).
fn wait_for(what: &str, f: impl FnMut() -> bool) {
    cluster::wait_for(what, 180, 100, f)
}

/// Starts a node with exactly the contract's flags (the harness adds only
/// `--data` and the compile cache's environment).
fn start(tmp: &std::path::Path, name: &str, bucket: &str) -> (Node, String) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let advertise = format!("http://127.0.0.1:{port}");
    let node = Node::start(
        &tmp.join(name),
        &[
            "--listen",
            &listen,
            "--bucket",
            bucket,
            "--advertise",
            &advertise,
            "--examples",
        ],
    );
    (node, advertise)
}

/// The addresses of the live nodes `node`'s view shows, or `None` if it
/// does not answer 200.
fn view(node: &Node) -> Option<(BTreeSet<String>, serde_json::Value)> {
    let (status, v) = node.json("GET", "/admin/v1/cluster", b"");
    if status != 200 {
        return None;
    }
    let addresses = v["nodes"]
        .as_array()?
        .iter()
        .filter_map(|n| n["address"].as_str().map(str::to_owned))
        .collect();
    Some((addresses, v))
}

/// A counter request through `node`, retried while the cluster answers a
/// retryable 5xx (a node registering, an owner being taken over).
fn counter(node: &Node, method: &str, actor: &str, path: &str) -> u64 {
    let path = format!("/v1/demo/examples/counter/{actor}/{path}");
    let mut last = (0, serde_json::Value::Null);
    wait_for(&format!("{method} {path} on {}", node.base), || {
        last = node.json(method, &path, b"");
        !matches!(last.0, 502..=504)
    });
    assert_eq!(last.0, 200, "{method} {path}: {}", last.1);
    last.1["value"]
        .as_u64()
        .unwrap_or_else(|| panic!("{}", last.1))
}

fn cli_cluster(server: &str) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args(["cluster", "--server", server])
        .env_remove("WASMKEEP_TOKEN")
        .output()
        .expect("run wasmkeep cluster")
}

#[test]
fn three_nodes_form_a_cluster_that_every_node_shows() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = format!("file://{}", tmp.path().join("bucket").display());
    let mut nodes: Vec<(Node, String)> = ["a", "b", "c"]
        .iter()
        .map(|name| start(tmp.path(), name, &bucket))
        .collect();
    let all: BTreeSet<String> = nodes.iter().map(|(_, a)| a.clone()).collect();

    // Every node's view names the three, itself marked.
    for (node, address) in &nodes {
        wait_for(&format!("{address} to see three nodes"), || {
            view(node).is_some_and(|(seen, _)| seen == all)
        });
        let (_, v) = view(node).unwrap();
        let me: Vec<&serde_json::Value> = v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["self"] == true)
            .collect();
        assert_eq!(me.len(), 1, "{v}");
        assert_eq!(me[0]["address"], address.as_str(), "{v}");
        assert!(me[0]["held_actors"].is_u64(), "{v}");
        for n in v["nodes"].as_array().unwrap() {
            assert!(n["node"].is_string() && n["epoch"].is_u64(), "{v}");
            assert!(
                n["lease_age_ms"].is_i64() && n["expires_in_ms"].is_i64(),
                "{v}"
            );
        }
    }

    // The counter through any node: each increment counts once, and every
    // node reads the same value.
    let actor = "shared";
    for (i, (node, _)) in nodes.iter().chain(nodes.iter()).enumerate() {
        assert_eq!(counter(node, "POST", actor, "increment"), i as u64 + 1);
    }
    for (node, _) in &nodes {
        assert_eq!(counter(node, "GET", actor, "value"), 6);
    }

    // The CLI prints a table with the three addresses.
    let out = cli_cluster(&nodes[1].0.base);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for address in &all {
        assert!(
            text.contains(address.as_str()),
            "{address} missing:\n{text}"
        );
    }
    assert!(
        text.contains("ADDRESS") && text.contains("3 live"),
        "{text}"
    );

    // SIGTERM one node: it releases its lease, and the others' views drop it.
    let (mut gone, gone_address) = nodes.remove(0);
    assert!(gone.stop().success());
    let left: BTreeSet<String> = nodes.iter().map(|(_, a)| a.clone()).collect();
    assert!(!left.contains(&gone_address));
    for (node, address) in &nodes {
        wait_for(&format!("{address} to see two nodes"), || {
            view(node).is_some_and(|(seen, _)| seen == left)
        });
    }
    // The counter goes on through the survivors with nothing lost.
    assert_eq!(counter(&nodes[0].0, "POST", actor, "increment"), 7);
    assert_eq!(counter(&nodes[1].0, "GET", actor, "value"), 7);
    let out = cli_cluster(&nodes[0].0.base);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains(gone_address.as_str()), "{text}");
    assert!(text.contains("2 live"), "{text}");
}

#[test]
fn a_single_node_is_not_a_cluster() {
    let tmp = tempfile::tempdir().unwrap();
    let node = Node::start(&tmp.path().join("solo"), &[]);
    let (status, v) = node.json("GET", "/admin/v1/cluster", b"");
    assert_eq!(status, 404, "{v}");
    assert_eq!(common::code(&v), "not_a_cluster", "{v}");
    let out = cli_cluster(&node.base);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not_a_cluster"), "{err}");
}
