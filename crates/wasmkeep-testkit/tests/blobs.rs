//! Values larger than a row (issue 36), in both SDKs: the `files` class
//! of the Rust and the TypeScript examples stores blobs in chunks; a blob
//! grows past `value_bytes_max` and up to the actor's database limit, and
//! the actor opens and serves it at every size.

use wasmkeep_guests::{DEMO, EXAMPLES_TS};
use wasmkeep_testkit::{ActorHandle, TestNode};

const CLASSES: [&str; 2] = ["demo/examples/files", "demo/examples-ts/files"];
const MIB: usize = 1024 * 1024;
/// The actor's database limit in these tests.
const DATABASE_BYTES_MAX: u64 = 8 * MIB as u64;

fn node() -> TestNode {
    let node = TestNode::with_config(|c| c.store.database_bytes_max = DATABASE_BYTES_MAX);
    node.deploy("demo/examples", DEMO).unwrap();
    node.deploy("demo/examples-ts", EXAMPLES_TS).unwrap();
    node
}

/// Bytes that differ at every offset (so a chunk out of place shows).
fn pattern(from: usize, len: usize) -> Vec<u8> {
    (from..from + len)
        .map(|i| (i % 251) as u8 ^ (i / 251 % 256) as u8)
        .collect()
}

fn size(a: &ActorHandle<'_>) -> Option<u64> {
    a.get("/blob/size?name=doc").json()["size"].as_u64()
}

#[test]
fn a_blob_grows_in_parts_past_the_row_limit_and_reads_back_whole_and_in_ranges() {
    let node = node();
    for class in CLASSES {
        let a = node.actor(&format!("{class}/a"));
        // Parts that do not end on a chunk boundary: the last chunk fills.
        let part = 700 * 1024 + 3;
        let mut total = 0;
        for _ in 0..5 {
            let r = a.post("/blob/append?name=doc", pattern(total, part));
            total += part;
            assert_eq!(r.json()["size"], total as u64, "{class}");
        }
        assert!(total > 2 * MIB, "past value_bytes_max");
        let whole = a.get("/blob?name=doc");
        assert_eq!(whole.status, 200);
        assert_eq!(whole.body.len(), total, "{class}");
        assert!(whole.body == pattern(0, total), "{class}: the same bytes");
        // A range across a chunk boundary, and one past the end.
        let r = a.get("/blob?name=doc&offset=65000&len=2000");
        assert!(r.body == pattern(65_000, 2_000), "{class}");
        let end = a.get(&format!("/blob?name=doc&offset={}&len=100", total - 10));
        assert_eq!(end.body.len(), 10, "{class}");
        // Replace, list, delete.
        assert_eq!(a.put("/blob?name=note", "hi").json()["size"], 2);
        let list = a.get("/blobs?prefix=").json()["blobs"].clone();
        assert_eq!(list[0]["name"], "doc", "{class}: {list}");
        assert_eq!(list[1]["size"], 2);
        assert_eq!(
            a.request("DELETE", "/blob?name=doc", "").unwrap().json()["deleted"],
            true
        );
        assert_eq!(size(&a), None, "{class}");
        let e = a.request("GET", "/blob?name=doc", "").unwrap_err();
        assert_eq!(e.code(), "not_found", "{class}");
    }
}

#[test]
fn at_the_database_limit_the_write_is_refused_and_the_actor_still_opens_and_serves() {
    let mut node = node();
    let part = 512 * 1024;
    let mut acked = [0usize; 2];
    for (i, class) in CLASSES.iter().enumerate() {
        let a = node.actor(&format!("{class}/full"));
        let refusal = loop {
            match a.request("POST", "/blob/append?name=doc", pattern(acked[i], part)) {
                Ok(r) => {
                    acked[i] += part;
                    assert_eq!(r.json()["size"], acked[i] as u64);
                    assert!(
                        acked[i] < DATABASE_BYTES_MAX as usize,
                        "{class}: never refused"
                    );
                }
                Err(e) => break e,
            }
        };
        assert_eq!(refusal.code(), "database_full", "{class}: {refusal}");
        assert!(acked[i] > 6 * MIB, "{class}: filled to {} bytes", acked[i]);
        // The refused part rolled back whole.
        assert_eq!(size(&a), Some(acked[i] as u64), "{class}");
    }
    node.restart();
    for (i, class) in CLASSES.iter().enumerate() {
        let a = node.actor(&format!("{class}/full"));
        assert_eq!(
            size(&a),
            Some(acked[i] as u64),
            "{class}: opens after a restart"
        );
        let whole = a.get("/blob?name=doc");
        assert!(
            whole.body == pattern(0, acked[i]),
            "{class}: every acknowledged byte"
        );
        // Deleting makes room again.
        assert_eq!(
            a.request("DELETE", "/blob?name=doc", "").unwrap().json()["deleted"],
            true
        );
        assert_eq!(
            a.post("/blob/append?name=doc", pattern(0, part)).json()["size"],
            part as u64
        );
    }
}
