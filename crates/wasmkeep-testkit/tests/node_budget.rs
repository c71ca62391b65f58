//! The node-wide memory budget that guests and SQLite share (issue 17).
//! A test binary of its own with one node: the budget is process-wide, and
//! every node started in the process sets it.

use wasmkeep_guests::{DEMO, TESTBED};
use wasmkeep_testkit::TestNode;

#[test]
fn a_guest_growing_past_the_node_budget_fails_alone_and_gives_it_back() {
    let node = TestNode::with_config(|c| {
        c.node_memory_bytes_max = 96 * 1024 * 1024;
        c.instance_memory_bytes_max = 512 * 1024 * 1024;
    });
    node.deploy("t/bed", TESTBED).unwrap();
    node.deploy("demo/examples", DEMO).unwrap();
    let bomb = node.actor("t/bed/probe/bomb");
    let e = bomb.request("POST", "/membomb", "").unwrap_err();
    assert_eq!(e.code(), "node_memory_exhausted", "{e}");
    assert!(e.to_string().contains("node_memory_bytes_max"), "{e}");
    // The neighbour keeps working, and so does the bomb's actor once its
    // trapped instance (and what it reserved) is gone.
    let counter = node.actor("demo/examples/counter/n");
    assert_eq!(counter.post("/increment", "").json()["value"], 1);
    assert_eq!(bomb.post("/write", "").status, 204);
    assert!(
        wasmkeep_store_guest_bytes() < 96 * 1024 * 1024,
        "the trapped instance's memory was not given back"
    );
}

fn wasmkeep_store_guest_bytes() -> u64 {
    wasmkeep_testkit::memory_budget::guest_bytes()
}
