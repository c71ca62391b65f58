//! Listings of a whole cluster (issue 39): `GET /admin/v1/actors/…?all=true`
//! and `wasmkeep actors --all` list and count a class's actors from the
//! bucket, every node's, paged and by name prefix, leaving out deleted
//! ones; without `all` a node lists its own. On a folder bucket and on an
//! S3-compatible server (moto), whose listing pages with a delimiter.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes wait in real time"
)]

mod common;

use common::Node;
use common::load::{Cluster, Store};
use serde_json::Value;

const CLASS: &str = "/admin/v1/actors/demo/examples/counter";

fn names(v: &Value) -> Vec<String> {
    v["actors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect()
}

fn list(node: &Node, query: &str) -> Value {
    let (code, v) = node.json("GET", &format!("{CLASS}?{query}"), b"");
    assert_eq!(code, 200, "{query}: {v}");
    v
}

fn lists_every_nodes_actors(store: Store) {
    let c = Cluster::new(store);
    let a = c.start("a");
    let b = c.start("b");
    // Each node takes the actors first asked through it.
    for i in 0..4 {
        let (code, body) = a
            .node
            .post(&format!("/v1/demo/examples/counter/x{i}/increment"), b"");
        assert_eq!(code, 200, "{body}");
        let (code, body) = b
            .node
            .post(&format!("/v1/demo/examples/counter/y{i}/increment"), b"");
        assert_eq!(code, 200, "{body}");
    }
    // A long name (over 100 bytes: its folder is split in pieces).
    let long = format!("z{}", "l".repeat(150));
    let (code, body) = b
        .node
        .post(&format!("/v1/demo/examples/counter/{long}/increment"), b"");
    assert_eq!(code, 200, "{body}");

    let own = list(&a.node, "limit=100");
    assert_eq!(own["source"], "node");
    assert_eq!(names(&own), ["x0", "x1", "x2", "x3"]);

    let mut every: Vec<String> = (0..4)
        .map(|i| format!("x{i}"))
        .chain((0..4).map(|i| format!("y{i}")))
        .collect();
    every.push(long.clone());
    let all = list(&a.node, "all=true&limit=100");
    assert_eq!(all["source"], "bucket");
    assert_eq!(names(&all), every);
    assert_eq!(all["next"], Value::Null);
    assert_eq!(
        names(&list(&b.node, "all=true&prefix=y")),
        ["y0", "y1", "y2", "y3"]
    );
    assert_eq!(names(&list(&b.node, "all=true&prefix=z")), [long.as_str()]);

    // Paged: three at a time, each page after the last one's `next`.
    let mut paged = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let query = match &after {
            Some(a) => format!("all=true&limit=3&after={}", common::enc(a)),
            None => "all=true&limit=3".to_owned(),
        };
        let v = list(&a.node, &query);
        paged.extend(names(&v));
        match v["next"].as_str() {
            Some(n) => after = Some(n.to_owned()),
            None => break,
        }
    }
    assert_eq!(paged, every);

    // A deleted actor is left out (its chain ends in a tombstone).
    let (code, v) = a.node.json("DELETE", &format!("{CLASS}/y1"), b"");
    assert_eq!(code, 200, "{v}");
    every.retain(|n| n != "y1");
    assert_eq!(names(&list(&a.node, "all=true")), every);
    let count = list(&a.node, "all=true&count=true");
    assert_eq!(
        (count["count"].as_u64(), count["complete"].as_bool()),
        (Some(8), Some(true))
    );

    let (code, out, err) = a.node.cli(
        &["actors", "demo/examples/counter", "--all", "--count"],
        &[],
    );
    assert_eq!((code, out.trim()), (0, "8"), "{err}");
    let (code, out, err) = b.node.cli(
        &["actors", "demo/examples/counter", "--all", "--prefix", "x"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        (0..4)
            .map(|i| format!("demo/examples/counter/x{i}"))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_folder_bucket_lists_every_nodes_actors() {
    lists_every_nodes_actors(Store::Folder);
}

#[test]
fn an_s3_bucket_lists_every_nodes_actors() {
    lists_every_nodes_actors(Store::Moto);
}
