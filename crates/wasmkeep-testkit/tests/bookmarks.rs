//! Bookmarks (issue 36): an actor names a past point of its history and
//! goes back to it, then undoes that, in both SDKs (the examples'
//! counters), on a node with a bucket.

#![allow(
    clippy::disallowed_methods,
    reason = "the restore runs on the node's own thread: waited for in real time"
)]

use std::time::Duration;

use wasmkeep_guests::{DEMO, EXAMPLES_TS};
use wasmkeep_replica::ReplicaConfig;
use wasmkeep_replica::testing::memory_bucket;
use wasmkeep_testkit::{ActorHandle, TestNode};

const COUNTERS: [&str; 2] = ["demo/examples/counter", "demo/examples-ts/counter"];
const REPLICATED: &[(&str, &str)] = &[("wasmkeep-durability", "replicated")];

fn node() -> TestNode {
    let (bucket, _) = memory_bucket();
    let node = TestNode::with_config(move |c| {
        c.bucket = Some(bucket);
        c.replica = ReplicaConfig {
            snapshot_every_entries: 1_000,
            snapshot_log_ratio_pct: 1_000_000,
            ..ReplicaConfig::default()
        };
    });
    node.deploy("demo/examples", DEMO).unwrap();
    node.deploy("demo/examples-ts", EXAMPLES_TS).unwrap();
    node
}

fn increment(a: &ActorHandle<'_>) -> i64 {
    a.request_with_headers("POST", "/increment", REPLICATED, "")
        .unwrap()
        .json()["value"]
        .as_i64()
        .unwrap()
}

/// Waits (real time, bounded) until the counter reads `want`.
fn until_value(a: &ActorHandle<'_>, want: i64) -> i64 {
    let mut got = 0;
    for _ in 0..500 {
        got = a.get("/value").json()["value"].as_i64().unwrap();
        if got == want {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    got
}

#[test]
fn an_actor_goes_back_to_a_bookmark_and_undoes_it() {
    let node = node();
    for class in COUNTERS {
        let a = node.actor(&format!("{class}/undo"));
        increment(&a);
        increment(&a);
        node.advance(Duration::from_secs(1));
        let mid = node.now_ms();
        node.advance(Duration::from_secs(1));
        for _ in 0..3 {
            increment(&a);
        }
        let b = a.get(&format!("/bookmark?at_ms={mid}")).json()["bookmark"].clone();
        assert_eq!(b, format!("t:{mid}"), "{class}");
        let undo = a
            .post(&format!("/restore?bookmark={}", b.as_str().unwrap()), "")
            .json()["undo"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(undo.starts_with("u:"), "{class}: {undo}");
        assert_eq!(until_value(&a, 2), 2, "{class}: back to the bookmark");
        // Undo brings back the state the restore replaced.
        let again = a.post(&format!("/restore?bookmark={undo}"), "");
        assert_eq!(again.status, 200, "{class}: {}", again.text());
        assert_eq!(until_value(&a, 5), 5, "{class}: undone");
        assert_eq!(increment(&a), 6, "{class}: writes build on it");
    }
}

#[test]
fn bad_bookmarks_and_a_node_without_a_bucket_are_refused_with_their_codes() {
    let node = node();
    for class in COUNTERS {
        let a = node.actor(&format!("{class}/bad"));
        increment(&a);
        for (b, code) in [
            ("junk", "invalid_bookmark"),
            ("u:zz", "invalid_bookmark"),
            ("u:00112233", "bookmark_not_found"),
        ] {
            let e = a
                .request("POST", &format!("/restore?bookmark={b}"), "")
                .unwrap_err();
            assert_eq!(e.code(), code, "{class} {b}: {e}");
        }
        let future = node.now_ms() + 60_000;
        let e = a
            .request("GET", &format!("/bookmark?at_ms={future}"), "")
            .unwrap_err();
        assert_eq!(e.code(), "invalid_bookmark", "{class}");
    }
    let local = TestNode::new();
    local.deploy("demo/examples", DEMO).unwrap();
    local.deploy("demo/examples-ts", EXAMPLES_TS).unwrap();
    for class in COUNTERS {
        let e = local
            .actor(&format!("{class}/local"))
            .request("GET", "/bookmark", "")
            .unwrap_err();
        assert_eq!(e.code(), "no_bucket", "{class}: {e}");
    }
}
