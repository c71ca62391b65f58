//! What a Durable Objects user looks for in the guest API and found
//! missing (issue 37), in both SDKs, through the `files` class of the Rust
//! and the TypeScript examples: deleting keys by prefix and all at once,
//! deleting everything the actor stored, the database's size, and unique
//! identifiers.

use std::collections::HashSet;

use serde_json::json;
use wasmkeep_guests::{DEMO, EXAMPLES_TS};
use wasmkeep_testkit::{ActorHandle, TestNode};

const CLASSES: [&str; 2] = ["demo/examples/files", "demo/examples-ts/files"];

fn node() -> TestNode {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    node.deploy("demo/examples-ts", EXAMPLES_TS).unwrap();
    node
}

fn keys(a: &ActorHandle<'_>) -> serde_json::Value {
    a.get("/kv?prefix=").json()["keys"].clone()
}

fn size(a: &ActorHandle<'_>) -> u64 {
    a.get("/size").json()["bytes"].as_u64().unwrap()
}

#[test]
fn keys_are_deleted_by_prefix_and_all_at_once() {
    let node = node();
    for class in CLASSES {
        let a = node.actor(&format!("{class}/k"));
        for key in ["session/1", "session/2", "sessions", "user/1"] {
            assert_eq!(a.put(&format!("/kv?key={key}"), "v").status, 200);
        }
        let r = a.request("DELETE", "/kv?prefix=session/", "").unwrap();
        assert_eq!(r.json(), json!({ "deleted": 2 }), "{class}");
        assert_eq!(keys(&a), json!(["sessions", "user/1"]), "{class}");
        let r = a.request("DELETE", "/kv?prefix=zzz", "").unwrap();
        assert_eq!(r.json(), json!({ "deleted": 0 }), "{class}");
        let r = a.request("DELETE", "/kv/all", "").unwrap();
        assert_eq!(r.json(), json!({ "deleted": 2 }), "{class}");
        assert_eq!(keys(&a), json!([]), "{class}");
    }
}

#[test]
fn delete_all_leaves_an_empty_actor_that_goes_on() {
    let mut node = node();
    for class in CLASSES {
        let a = node.actor(&format!("{class}/w"));
        assert_eq!(a.post("/tables", "").status, 200);
        assert_eq!(a.put("/kv?key=k", "v").status, 200);
        let before = size(&a);
        // A blob of 1 MiB: the database's size counts it.
        assert_eq!(a.put("/blob?name=doc", vec![7u8; 1 << 20]).status, 200);
        assert!(size(&a) >= before + (1 << 20), "{class}: {}", size(&a));
        let due = node.now_ms() + 60_000;
        assert_eq!(a.post(&format!("/alarm?at={due}"), "").status, 200);
        let tables = a.get("/tables").json();
        assert_eq!(tables["views"], json!(["children"]), "{class}");
        for t in ["child", "parent", "wasmkeep_sdk_blobs"] {
            assert!(
                tables["tables"].as_array().unwrap().contains(&json!(t)),
                "{class}: {tables}"
            );
        }

        let wiped = a.post("/wipe", "");
        assert_eq!(wiped.status, 200, "{class}: {}", wiped.text());
        assert_eq!(
            a.get("/tables").json(),
            json!({ "tables": [], "views": [] }),
            "{class}"
        );
        assert_eq!(keys(&a), json!([]), "{class}");
        assert_eq!(a.get("/alarm").json(), json!({ "at": null }), "{class}");
        assert_eq!(a.alarm(), None, "{class}: no alarm left at the node");
        // The actor goes on: the SDK makes its tables again when used, the
        // actor its own.
        assert_eq!(a.get("/blob/size?name=doc").json()["size"], json!(null));
        assert_eq!(a.post("/tables", "").status, 200);
        let tables = a.get("/tables").json()["tables"].clone();
        assert!(
            tables.as_array().unwrap().contains(&json!("parent")),
            "{class}: {tables}"
        );
    }
    // Committed like any write: a restart finds the new state.
    node.restart();
    for class in CLASSES {
        let a = node.actor(&format!("{class}/w"));
        assert_eq!(a.get("/tables").json()["views"], json!(["children"]));
        assert_eq!(keys(&a), json!([]), "{class}");
    }
}

#[test]
fn unique_ids_are_32_hex_digits_and_never_repeat() {
    let node = node();
    let mut seen = HashSet::new();
    for class in CLASSES {
        // Several actors, so several instances draw them.
        for n in 0..4 {
            let a = node.actor(&format!("{class}/id{n}"));
            for _ in 0..50 {
                let id = a.post("/id", "").json()["id"].as_str().unwrap().to_owned();
                assert_eq!(id.len(), 32, "{class}: {id}");
                assert!(
                    id.chars()
                        .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
                    "{class}: {id}"
                );
                assert!(seen.insert(id.clone()), "{class}: {id} came twice");
            }
        }
    }
}
