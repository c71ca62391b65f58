//! The Rust test kit runs components written in TypeScript (issue 35):
//! the TypeScript examples (`examples/ts`, built with `sdk/ts`) on the
//! real runtime with the test kit's clock, as a Rust crate's tests would
//! run its own component.

use std::time::Duration;

use wasmkeep_guests::{EXAMPLES_TS, HOSTILE_TS};
use wasmkeep_testkit::TestNode;

fn node() -> TestNode {
    let node = TestNode::new();
    node.deploy("demo/examples-ts", EXAMPLES_TS).unwrap();
    node
}

#[test]
fn the_typescript_counter_counts_and_keeps_its_count_across_a_restart() {
    let mut node = node();
    let a = node.actor("demo/examples-ts/counter/a");
    for want in 1..=3 {
        assert_eq!(a.post("/increment", "").json()["value"], want);
    }
    node.restart();
    let a = node.actor("demo/examples-ts/counter/a");
    assert_eq!(a.get("/value").json()["value"], 3);
    assert_eq!(a.sql_i64("SELECT n FROM counter"), 3);
}

#[test]
fn the_typescript_reminder_fires_at_its_time_by_the_test_clock_and_retries_as_asked() {
    let node = node();
    let r = node.actor("demo/examples-ts/reminder/r");
    let due = node.now_ms() + 60_000;
    let set = r.post(&format!("/set?at_ms={due}&fail_times=1"), "");
    assert_eq!(set.status, 200, "{}", set.text());
    assert_eq!(r.alarm(), Some(due));
    node.advance(Duration::from_millis(59_999));
    assert_eq!(
        r.get("/fired").json()["fired"],
        serde_json::json!([]),
        "not before its time"
    );
    // Due: the first attempt fails as asked, the retry (after the
    // runtime's backoff) succeeds.
    node.advance(Duration::from_secs(120));
    let fired = r.get("/fired").json();
    assert_eq!(fired["fired"][0]["retry_count"], 1, "{fired}");
    assert_eq!(fired["fired"][0]["is_retry"], true, "{fired}");
    assert_eq!(r.alarm(), None, "delivered once");
}

#[test]
fn typescript_actors_message_each_other_through_the_outbox() {
    let node = node();
    let a = node.actor("demo/examples-ts/pinger/a");
    let sent = a.post("/ping?to=b&n=3", "");
    assert_eq!(sent.status, 200, "{}", sent.text());
    node.settle_outbox();
    assert_eq!(
        a.get("/pongs").json(),
        serde_json::json!({ "sent": 3, "answered": 3, "duplicates": 0 })
    );
    assert_eq!(
        node.actor("demo/examples-ts/pinger/b").get("/stats").json(),
        serde_json::json!({ "received": 3, "received_twice": 0, "failed": 0 })
    );
}

/// `sql.applyIfUnchanged`, as the Rust SDK's `apply_if_unchanged`: a
/// decision taken on generation 1 applies once; taken again on the same
/// (now stale) generation, it does not.
#[test]
fn a_typescript_decision_on_a_stale_record_is_not_applied() {
    let node = TestNode::new();
    node.deploy("t/bed", HOSTILE_TS).unwrap();
    let a = node.actor("t/bed/attacker/a");
    let first = a.post("/apply-if?seen=1", "").json();
    assert_eq!(
        first,
        serde_json::json!({ "applied": true, "generation": 2 })
    );
    let stale = a.post("/apply-if?seen=1", "").json();
    assert_eq!(
        stale,
        serde_json::json!({ "applied": false, "generation": 2 })
    );
    let fresh = a.post("/apply-if?seen=2", "").json();
    assert_eq!(
        fresh,
        serde_json::json!({ "applied": true, "generation": 3 })
    );
}
