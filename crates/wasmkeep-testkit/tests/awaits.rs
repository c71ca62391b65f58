//! The gate of a suspended event (ADR 0056) against the real runtime: the
//! examples' `waiter` waits for a tally's answer while the outbox is held,
//! and a read of the same actor waits behind it. Without the gate (the
//! `unsafe_await_without_gate` fault) the read runs in the middle of the
//! wait and sees none of the request's writes: the interleaving the
//! gate exists to prevent.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real threads wait and measure in real time"
)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use wasmkeep_guests::DEMO;
use wasmkeep_testkit::TestNode;

/// The notes a read of the waiter saw, and whether it ended before the
/// held outbox was let go.
fn read_during_a_wait(without_gate: bool) -> (serde_json::Value, bool) {
    let node = TestNode::with_config(|c| {
        c.outbox.retry_first_ms = 5;
        c.outbox.retry_max_ms = 50;
    });
    node.deploy("demo/examples", DEMO).unwrap();
    node.runtime()
        .faults()
        .unsafe_await_without_gate
        .store(without_gate, Ordering::SeqCst);
    node.hold_outbox(true);
    let waiter = node.actor("demo/examples/waiter/a");
    std::thread::scope(|s| {
        let adding = s.spawn(|| waiter.post("/add?name=t&by=1", ""));
        let metrics = node.runtime().metrics();
        let started = std::time::Instant::now();
        while metrics.awaits_suspended_total.get() == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "never suspended"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let reading = s.spawn(|| waiter.get("/notes").json());
        std::thread::sleep(Duration::from_millis(300));
        let read_first = reading.is_finished();
        node.hold_outbox(false);
        let added = adding.join().unwrap();
        assert_eq!(added.status, 200, "{}", added.text());
        (reading.join().unwrap(), read_first)
    })
}

#[test]
fn a_read_waits_behind_a_suspended_request() {
    let (notes, read_first) = read_during_a_wait(false);
    assert!(!read_first, "the read ran while the actor waited");
    assert_eq!(
        notes["notes"].as_array().unwrap().len(),
        2,
        "it saw the request's writes: {notes}"
    );
}

#[test]
fn unsafe_without_the_gate_a_read_runs_in_the_middle_of_a_wait() {
    let (notes, read_first) = read_during_a_wait(true);
    assert!(read_first, "without the gate the read does not wait");
    assert_eq!(
        notes["notes"].as_array().unwrap().len(),
        0,
        "and sees none of the waiting request's writes: {notes}"
    );
}

/// Two waiters each waiting for the other's answer to a message (both
/// suspended before either message arrives): a cycle of waits. The
/// receiver that waits on the sender refuses the message with
/// `await_deadlock`, so both requests end, none at its deadline.
#[test]
fn two_actors_waiting_on_each_other_end_with_await_deadlock() {
    let node = TestNode::with_config(|c| {
        c.outbox.retry_first_ms = 5;
        c.outbox.retry_max_ms = 50;
    });
    node.deploy("demo/examples", DEMO).unwrap();
    node.hold_outbox(true);
    let a = node.actor("demo/examples/waiter/a");
    let b = node.actor("demo/examples/waiter/b");
    let started = std::time::Instant::now();
    let (ra, rb) = std::thread::scope(|s| {
        let ra = s.spawn(|| a.post("/ask?to=b", ""));
        let rb = s.spawn(|| b.post("/ask?to=a", ""));
        let metrics = node.runtime().metrics();
        while metrics.awaits_suspended_total.get() < 2 {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "never both suspended"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        node.hold_outbox(false);
        (ra.join().unwrap(), rb.join().unwrap())
    });
    let texts = [ra.text(), rb.text()];
    assert!(
        texts.iter().any(|t| t.contains("await_deadlock")),
        "{texts:?}"
    );
    // One refusal breaks the cycle: the other may then be answered.
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "ended by the deadlock, not a deadline"
    );
}

/// A suspended alarm whose run again fails before its handler runs (the
/// `fail_resumes` fault, as a full outbox or a database error would) is
/// not lost: the suspension ends and the alarm takes its retry rule, so it
/// runs again, waits again and ends with its note. (It used to end there,
/// with no retry and no alarm left.)
#[test]
fn an_alarm_whose_run_again_fails_is_retried() {
    let node = TestNode::with_config(|c| {
        c.outbox.retry_first_ms = 5;
        c.outbox.retry_max_ms = 50;
    });
    node.deploy("demo/examples", DEMO).unwrap();
    node.hold_outbox(true);
    let waiter = node.actor("demo/examples/waiter/w");
    let armed = waiter.post("/arm?name=t&by=1", "");
    assert_eq!(armed.status, 204, "{}", armed.text());
    let metrics = node.runtime().metrics();
    let started = std::time::Instant::now();
    while metrics.awaits_suspended_total.get() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the alarm never suspended"
        );
        node.run_due_alarms();
        std::thread::sleep(Duration::from_millis(5));
    }
    let faults = node.runtime().faults();
    faults.fail_resumes.store(1, Ordering::SeqCst);
    node.hold_outbox(false);
    while faults.fail_resumes.load(Ordering::SeqCst) > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the answer never came back"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let noted = |node: &TestNode| {
        let notes = node.actor("demo/examples/waiter/w").get("/notes").json();
        notes["notes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|n| n["what"].as_str().map(str::to_owned))
            .filter(|w| w.starts_with("alarm "))
            .collect::<Vec<_>>()
    };
    loop {
        // The retry comes due on the node's clock.
        node.advance(Duration::from_millis(250));
        let notes = noted(&node);
        if !notes.is_empty() {
            // The failed run's call was answered (the tally counted it);
            // the retry's call counts again.
            assert_eq!(notes, ["alarm 2"]);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the alarm was not run again after its failed resume"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metrics.alarms_failed_total.get(), 1, "one failure, retried");
}

/// Waits, in real time (30 s at most from `started`), until the node has
/// suspended an event.
fn until_suspended(node: &TestNode, started: std::time::Instant) {
    let metrics = node.runtime().metrics();
    while metrics.awaits_suspended_total.get() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never suspended"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The test kit's clock ends waits as it runs alarms: a request that waits
/// up to two minutes for an answer the held outbox never delivers ends
/// with `await_timeout` once `advance` passes its deadline, without two
/// minutes of real time, and the actor kept nothing of the run.
#[test]
fn advancing_the_clock_ends_a_wait_at_its_deadline() {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    node.hold_outbox(true);
    let waiter = node.actor("demo/examples/waiter/d");
    let started = std::time::Instant::now();
    let answer = std::thread::scope(|s| {
        let adding = s.spawn(|| waiter.post("/add?name=t&by=1&within=120000", ""));
        until_suspended(&node, started);
        node.advance(Duration::from_secs(119));
        std::thread::sleep(Duration::from_millis(300));
        assert!(!adding.is_finished(), "it ended before its deadline");
        node.advance(Duration::from_secs(2));
        adding.join().unwrap()
    });
    assert_eq!(answer.status, 500, "{}", answer.text());
    assert!(answer.text().contains("await_timeout"), "{}", answer.text());
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "ended by the test clock, not by real time"
    );
    let notes = waiter.get("/notes").json();
    assert_eq!(notes["notes"], serde_json::json!([]), "{notes}");
}

/// An alarm that comes due while its actor waits is held by the gate until
/// the wait ends: `advance` past both does not block on the held alarm
/// (it ends the wait at its deadline, then the alarm runs).
#[test]
fn advancing_past_an_alarm_held_by_a_wait_does_not_block() {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    node.hold_outbox(true);
    let waiter = node.actor("demo/examples/waiter/h");
    let armed = waiter.post("/arm?name=t&by=1", "");
    assert_eq!(armed.status, 204, "{}", armed.text());
    let started = std::time::Instant::now();
    let answer = std::thread::scope(|s| {
        let adding = s.spawn(|| waiter.post("/add?name=t&by=1&within=120000", ""));
        until_suspended(&node, started);
        node.advance(Duration::from_secs(121));
        adding.join().unwrap()
    });
    assert!(answer.text().contains("await_timeout"), "{}", answer.text());
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "advance waited for the held alarm in real time"
    );
}
