//! Idempotent requests (issue 36): a request carrying `Idempotency-Key`
//! runs once per key and actor; repeats get the recorded answer, with the
//! Rust and the TypeScript counter alike.

#![allow(
    clippy::disallowed_methods,
    reason = "the concurrent duplicates are real threads"
)]

use std::time::Duration;

use wasmkeep_guests::{DEMO, EXAMPLES_TS, TESTBED};
use wasmkeep_testkit::{TestNode, TestResponse};

fn node() -> TestNode {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    node.deploy("demo/examples-ts", EXAMPLES_TS).unwrap();
    node
}

fn increment(node: &TestNode, actor: &str, key: &str) -> TestResponse {
    node.actor(actor)
        .request_with_headers("POST", "/increment", &[("Idempotency-Key", key)], "")
        .expect("increment")
}

fn replayed(r: &TestResponse) -> bool {
    r.headers
        .iter()
        .any(|(k, v)| k == "idempotent-replayed" && v == "true")
}

#[test]
fn a_repeated_key_gets_the_recorded_answer_and_the_handler_runs_once() {
    let node = node();
    for actor in ["demo/examples/counter/a", "demo/examples-ts/counter/a"] {
        let first = increment(&node, actor, "k-1");
        assert_eq!(first.json()["value"], 1, "{actor}");
        assert!(!replayed(&first));
        for _ in 0..2 {
            let again = increment(&node, actor, "k-1");
            assert_eq!(
                (again.status, again.json()["value"].clone()),
                (first.status, 1.into())
            );
            assert_eq!(again.body, first.body, "{actor}: the same bytes");
            assert!(replayed(&again), "{actor}: says it is a replay");
        }
        // Another key, or none, is another request.
        assert_eq!(increment(&node, actor, "k-2").json()["value"], 2);
        assert_eq!(node.actor(actor).post("/increment", "").json()["value"], 3);
        assert_eq!(node.actor(actor).get("/value").json()["value"], 3);
        // Keys are per actor.
        let other = actor.replace("/a", "/b");
        assert_eq!(increment(&node, &other, "k-1").json()["value"], 1);
    }
}

#[test]
fn an_answer_lost_between_commit_and_reply_is_given_to_the_retry() {
    let mut node = node();
    let c = "demo/examples/counter/lost";
    node.crash_after_commit(1);
    let lost = node.actor(c).request_with_headers(
        "POST",
        "/increment",
        &[("Idempotency-Key", "once")],
        "",
    );
    assert!(lost.is_err(), "the caller must not hear of it");
    // The commit stood, the record with it: the retry is answered from it.
    let retry = increment(&node, c, "once");
    assert_eq!(retry.json()["value"], 1);
    assert!(replayed(&retry));
    // And after a restart, from the database.
    node.restart();
    let after = increment(&node, c, "once");
    assert_eq!(after.json()["value"], 1);
    assert_eq!(node.actor(c).get("/value").json()["value"], 1);
}

#[test]
fn a_key_reused_with_another_request_is_refused_and_runs_nothing() {
    let node = node();
    let c = "demo/examples/counter/reuse";
    assert_eq!(increment(&node, c, "k").json()["value"], 1);
    let other = node
        .actor(c)
        .request_with_headers("POST", "/increment", &[("Idempotency-Key", "k")], "x")
        .unwrap_err();
    assert_eq!(other.code(), "idempotency_key_reused");
    assert!(
        other.to_string().contains("idempotency_retention_ms"),
        "{other}"
    );
    let other_path = node
        .actor(c)
        .request_with_headers("POST", "/other", &[("Idempotency-Key", "k")], "")
        .unwrap_err();
    assert_eq!(other_path.code(), "idempotency_key_reused");
    assert_eq!(node.actor(c).get("/value").json()["value"], 1);
}

#[test]
fn a_record_answers_within_the_retention_window_and_not_after() {
    let node = TestNode::with_config(|c| c.idempotency_retention_ms = 60_000);
    node.deploy("demo/examples", DEMO).unwrap();
    let c = "demo/examples/counter/window";
    assert_eq!(increment(&node, c, "k").json()["value"], 1);
    node.advance(Duration::from_secs(59));
    assert_eq!(increment(&node, c, "k").json()["value"], 1);
    node.advance(Duration::from_secs(2));
    // Expired: the same key is a new request now.
    assert_eq!(increment(&node, c, "k").json()["value"], 2);
    assert_eq!(increment(&node, c, "k").json()["value"], 2);
}

#[test]
fn concurrent_duplicates_wait_for_the_first_and_all_hear_its_answer() {
    let node = node();
    let c = "demo/examples/counter/race";
    let answers: Vec<TestResponse> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| increment(&node, c, "same")))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for a in &answers {
        assert_eq!(a.json()["value"], 1);
    }
    assert_eq!(
        answers.iter().filter(|a| !replayed(a)).count(),
        1,
        "one ran"
    );
    assert_eq!(node.actor(c).get("/value").json()["value"], 1);
}

#[test]
fn bad_keys_are_refused_before_the_actor_is_touched() {
    let node = node();
    let c = "demo/examples/counter/bad";
    let long = "k".repeat(256);
    for key in [long.as_str(), "", "tab\tinside"] {
        let e = node
            .actor(c)
            .request_with_headers("POST", "/increment", &[("Idempotency-Key", key)], "")
            .unwrap_err();
        assert_eq!(e.code(), "invalid_idempotency_key", "{key:?}");
    }
    assert!(!node.actor(c).exists(), "nothing was created");
}

#[test]
fn reads_ignore_the_key_so_a_client_cannot_make_them_write() {
    let node = node();
    let c = node.actor("demo/examples/counter/reads");
    let read = || {
        c.request_with_headers("GET", "/value", &[("Idempotency-Key", "g")], "")
            .unwrap()
    };
    assert_eq!(read().json()["value"], 0);
    c.post("/increment", "");
    let again = read();
    assert_eq!(again.json()["value"], 1, "answered afresh, not replayed");
    assert!(!replayed(&again));
}

#[test]
fn an_answer_too_large_to_record_fails_the_request_and_rolls_it_back() {
    let node = node();
    node.deploy("t/bed", TESTBED).unwrap();
    let p = node.actor("t/bed/probe/big");
    let big = p
        .request_with_headers(
            "POST",
            "/big?bytes=2000000&v=a",
            &[("Idempotency-Key", "k")],
            "",
        )
        .unwrap_err();
    assert_eq!(big.code(), "idempotency_response_too_large");
    assert!(
        big.to_string()
            .contains("IDEMPOTENCY_RESPONSE_BYTES_MAX=1048576"),
        "{big}"
    );
    // What the handler wrote rolled back with it; without the key it runs.
    p.post("/write?v=seed", "");
    assert_eq!(p.get("/count").json()["count"], 1);
    let small = || {
        p.request_with_headers(
            "POST",
            "/big?bytes=1000&v=b",
            &[("Idempotency-Key", "s")],
            "",
        )
        .unwrap()
    };
    assert_eq!(small().body.len(), 1000);
    assert!(replayed(&small()));
    assert_eq!(p.get("/count").json()["count"], 2, "the small one ran once");
}
