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

/// Every name, page by page, `limit` at a time, following `next`.
fn paged(node: &Node, query: &str, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut q = format!("all=true&limit={limit}&{query}");
        if let Some(a) = &after {
            q.push_str(&format!("&after={}", common::enc(a)));
        }
        let v = list(node, &q);
        out.extend(names(&v));
        match v["next"].as_str() {
            Some(n) => after = Some(n.to_owned()),
            None => return out,
        }
    }
}

fn lists_every_nodes_actors(store: Store) {
    let c = Cluster::new(store);
    let a = c.start("a");
    let b = c.start("b");
    let increment = |node: &Node, name: &str| {
        let (code, body) = node.post(
            &format!("/v1/demo/examples/counter/{}/increment", common::enc(name)),
            b"",
        );
        assert_eq!(code, 200, "{name}: {body}");
    };
    // Each node takes the actors first asked through it.
    for i in 0..4 {
        increment(&a.node, &format!("x{i}"));
        increment(&b.node, &format!("y{i}"));
    }
    // Names of 100 bytes and more: a 100-byte name is one folder of 200
    // hex characters, and a longer one starting with it is under that
    // folder's `+` sibling, which S3 lists first; in name order the
    // 100-byte name comes first. Another name sorts after them all.
    let m100 = "m".repeat(100);
    let m150 = "m".repeat(150);
    let m100n = format!("{m100}n");
    for name in [&m100n, &m150, &m100, &"zz".to_owned()] {
        increment(&b.node, name);
    }

    // A cursor or prefix past the longest name is refused.
    for field in ["after", "prefix"] {
        let long = "a".repeat(wasmkeep_store::id::NAME_BYTES_MAX + 1);
        let (code, v) = a
            .node
            .json("GET", &format!("{CLASS}?all=true&{field}={long}"), b"");
        assert_eq!((code, common::code(&v)), (400, "invalid_name"), "{field}");
    }

    let own = list(&a.node, "limit=100");
    assert_eq!(own["source"], "node");
    assert_eq!(names(&own), ["x0", "x1", "x2", "x3"]);
    assert_eq!(names(&list(&b.node, "prefix=y")), ["y0", "y1", "y2", "y3"]);

    let mut every: Vec<String> = vec![m100.clone(), m150.clone(), m100n.clone()];
    every.extend((0..4).map(|i| format!("x{i}")));
    every.extend((0..4).map(|i| format!("y{i}")));
    every.push("zz".to_owned());
    let all = list(&a.node, "all=true&limit=100");
    assert_eq!(all["source"], "bucket");
    assert_eq!(names(&all), every);
    assert_eq!(all["next"], Value::Null);
    assert_eq!(
        names(&list(&b.node, "all=true&prefix=y")),
        ["y0", "y1", "y2", "y3"]
    );
    assert_eq!(
        names(&list(
            &b.node,
            &format!("all=true&prefix={}", "m".repeat(101))
        )),
        [m150.as_str()]
    );
    for limit in [1, 2, 3] {
        assert_eq!(paged(&a.node, "", limit), every, "{limit} a page");
    }

    // A deleted actor is left out (its chain ends in a tombstone), also
    // by pages of one, where its page holds no name.
    let (code, v) = a.node.json("DELETE", &format!("{CLASS}/y1"), b"");
    assert_eq!(code, 200, "{v}");
    every.retain(|n| n != "y1");
    assert_eq!(names(&list(&a.node, "all=true")), every);
    assert_eq!(paged(&b.node, "", 1), every);
    let count = list(&a.node, "all=true&count=true");
    assert_eq!(
        (count["count"].as_u64(), count["complete"].as_bool()),
        (Some(every.len() as u64), Some(true))
    );

    let (code, out, err) = a.node.cli(
        &["actors", "demo/examples/counter", "--all", "--count"],
        &[],
    );
    assert_eq!(
        (code, out.trim()),
        (0, every.len().to_string().as_str()),
        "{err}"
    );
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
