//! The bundled examples' own tests, written with the test kit as a user
//! would write theirs.

use std::time::Duration;

use wasmkeep_guests::DEMO;
use wasmkeep_testkit::TestNode;

fn node() -> TestNode {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    node
}

#[test]
fn counter_counts_per_actor_and_keeps_its_count_across_a_restart() {
    let mut node = node();
    for _ in 0..3 {
        node.actor("demo/examples/counter/a").post("/increment", "");
    }
    node.actor("demo/examples/counter/b").post("/increment", "");
    node.restart();
    assert_eq!(
        node.actor("demo/examples/counter/a").get("/value").json()["value"],
        3
    );
    assert_eq!(
        node.actor("demo/examples/counter/b").get("/value").json()["value"],
        1
    );
    assert_eq!(
        node.actor("demo/examples/counter/a")
            .sql_i64("SELECT n FROM counter"),
        3
    );
}

#[test]
fn a_response_lost_after_commit_leaves_the_write_committed() {
    let node = node();
    let c = node.actor("demo/examples/counter/a");
    c.post("/increment", "");
    node.crash_after_commit(1);
    // An alarm run does not use the fault up.
    assert_eq!(node.advance(Duration::from_secs(1)), 0);
    let lost = c.request("POST", "/increment", "");
    assert!(lost.is_err(), "the caller must not hear of it");
    // The commit stood: a client retrying would count twice, which is why
    // requests that must not repeat carry their own idempotency key.
    assert_eq!(c.get("/value").json()["value"], 2);
}

#[test]
fn notes_keep_rows_tags_and_settings() {
    let node = node();
    let d = node.actor("demo/examples/notes/doc-1");
    let id = d.post("/notes?title=plan", "ship it").json()["id"]
        .as_i64()
        .unwrap();
    assert_eq!(d.post(&format!("/notes/{id}/tags/urgent"), "").status, 204);
    assert_eq!(
        d.request("PUT", "/settings/lang", "en").unwrap().status,
        204
    );
    let notes = d.get("/notes").json();
    assert_eq!(notes["notes"][0]["title"], "plan");
    assert_eq!(notes["notes"][0]["tags"][0], "urgent");
    assert_eq!(d.kv("setting/lang").as_deref(), Some(&b"en"[..]));
    // Bad input is the client's fault: 400, and nothing is written.
    let err = d.request("GET", "/notes/abc", "").unwrap_err();
    assert_eq!(err.code(), "bad_request");
    assert_eq!(
        d.request("DELETE", &format!("/notes/{id}"), "")
            .unwrap()
            .status,
        204
    );
    assert_eq!(
        d.sql_i64("SELECT count(*) FROM tags"),
        0,
        "tags cascade with their note"
    );
}

#[test]
fn a_reminder_repeats_from_its_anchor_even_when_runs_are_late() {
    let node = node();
    let r = node.actor("demo/examples/reminder/daily");
    let t = node.now_ms() + 1_000;
    r.post(&format!("/set?at_ms={t}&every_ms=60000&count=3"), "");
    // Jump far past all three: each fires at its own time, in order.
    assert_eq!(node.advance(Duration::from_secs(600)), 3);
    let fired = r.get("/fired").json();
    let due: Vec<u64> = fired["fired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["due_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(due, vec![t, t + 60_000, t + 120_000]);
    assert_eq!(r.alarm(), None);
}

#[test]
fn every_test_node_starts_empty() {
    let a = node();
    a.actor("demo/examples/counter/shared")
        .post("/increment", "");
    let b = node();
    assert!(!b.actor("demo/examples/counter/shared").exists());
    assert_ne!(a.data_dir(), b.data_dir());
}
