//! Evicting actors at `instances_max`: the closer thread closes them, and
//! an evicted actor's next turn waits for that close (ADR 0024).

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use wasmkeep_guests::DEMO;
use wasmkeep_testkit::TestNode;

fn node() -> TestNode {
    let node = TestNode::with_config(|c| c.instances_max = 1);
    node.deploy("demo/examples", DEMO).unwrap();
    node
}

/// The status and body, or 0 and the runtime's error.
fn increment(node: &TestNode, name: &str) -> (u16, String) {
    match node
        .actor(&format!("demo/examples/counter/{name}"))
        .request("POST", "/increment", "")
    {
        Ok(r) => (r.status, r.text()),
        Err(e) => (0, e.to_string()),
    }
}

/// The closer holds an evicted actor's database for 3 s, longer than
/// SQLite's busy timeout (2 s). A request to that actor meanwhile must
/// wait for the close and then reopen it; were the actor's slot free while
/// the old connection still held the file, the reopen would fail on the
/// lock (the `unsafe_close_outside_slot` variant shows it).
fn a_request_during_a_slow_close(unsafe_variant: bool) -> (u16, String) {
    let node = node();
    let faults = node.runtime().faults();
    faults
        .unsafe_close_outside_slot
        .store(unsafe_variant, Ordering::Relaxed);
    assert_eq!(increment(&node, "a").0, 200);
    faults.close_delay_ms.store(3_000, Ordering::Relaxed);
    // `b` needs the only instance: `a` goes to the closer.
    assert_eq!(increment(&node, "b").0, 200);
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let r = increment(&node, "a");
    if r.0 == 200 {
        assert!(
            started.elapsed() >= Duration::from_millis(2_000),
            "the request did not wait for the close"
        );
    }
    faults.close_delay_ms.store(0, Ordering::Relaxed);
    r
}

#[test]
fn an_evicted_actor_waits_for_its_close_before_it_reopens() {
    let (status, body) = a_request_during_a_slow_close(false);
    assert_eq!((status, body.as_str()), (200, r#"{"value":2}"#));
}

#[test]
fn without_the_slot_held_during_the_close_the_reopen_fails() {
    let (status, body) = a_request_during_a_slow_close(true);
    assert_ne!(status, 200, "{body}");
    assert!(body.contains("locked") || body.contains("busy"), "{body}");
}

#[test]
fn many_actors_through_one_instance_keep_every_write() {
    let node = node();
    for round in 1..=3 {
        for i in 0..20 {
            let (s, body) = increment(&node, &format!("c{i}"));
            assert_eq!(s, 200, "{body}");
            assert_eq!(body, format!(r#"{{"value":{round}}}"#));
        }
    }
    // Delete and re-create actors right after their eviction.
    for i in 0..5 {
        let name = format!("c{i}");
        increment(&node, "other");
        assert!(
            node.actor(&format!("demo/examples/counter/{name}"))
                .delete_actor()
        );
        assert_eq!(increment(&node, &name).1, r#"{"value":1}"#);
    }
    for i in 0..20 {
        let want = if i < 5 { 1 } else { 3 };
        let v = node
            .actor(&format!("demo/examples/counter/c{i}"))
            .get("/value")
            .json()["value"]
            .clone();
        assert_eq!(v, want, "c{i}");
    }
}

/// Evicted instances live until the closer has closed them: with a closer
/// far behind, a stream of new actors must still find an instance for
/// each (the pool has room for the whole close queue; past it, workers
/// close evicted actors themselves).
#[test]
fn a_slow_closer_never_runs_the_node_out_of_instances() {
    let node = TestNode::with_config(|c| c.instances_max = 4);
    node.deploy("demo/examples", DEMO).unwrap();
    node.runtime()
        .faults()
        .close_delay_ms
        .store(20, Ordering::Relaxed);
    for i in 0..300 {
        let (s, body) = increment(&node, &format!("n{i}"));
        assert_eq!((s, body.as_str()), (200, r#"{"value":1}"#), "actor n{i}");
    }
    node.runtime()
        .faults()
        .close_delay_ms
        .store(0, Ordering::Relaxed);
}
