//! The second seed's two alarm bugs, as test kit tests against the real
//! runtime. Both are in the bundled examples app (`rings`, `watch`).

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmkeep_guests::DEMO;
use wasmkeep_testkit::TestNode;

/// The seed lost a ring because a claim ran while the alarm awaited a slow
/// call, and the alarm then wrote back its stale copy of the whole map. In
/// wasmkeep the claim waits for the alarm's turn to end, so it reads (and
/// keeps) what the alarm wrote; and an answer arriving meanwhile decides on
/// the state as the alarm left it, never the other way round.
#[test]
fn a_request_during_a_slow_alarm_is_never_lost_or_overwritten() {
    let node = Arc::new(TestNode::new());
    node.deploy("demo/examples", DEMO).unwrap();
    let rings = node.actor("demo/examples/rings/env");
    let t0 = node.now_ms();
    // Long enough that the other requests surely arrive during it.
    rings.post("/config?slow_iterations=400000000", "");
    rings.post(&format!("/claim?booking=a&expires_ms={}", t0 + 1_000), "");
    drop(rings);

    let alarm = {
        let node = Arc::clone(&node);
        std::thread::spawn(move || {
            let ran = node.advance(Duration::from_secs(1));
            (ran, Instant::now())
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let sent = Instant::now();
    let rings = node.actor("demo/examples/rings/env");
    let claim = rings.post(&format!("/claim?booking=b&expires_ms={}", t0 + 600_000), "");
    let answer = rings.post("/answer?booking=a", "");
    let (ran, alarm_done) = alarm.join().unwrap();
    assert_eq!(ran, 1);
    assert!(
        sent < alarm_done,
        "the requests must have been sent while the alarm ran, or this test shows nothing"
    );
    assert_eq!(claim.status, 204);
    // The answer came after the alarm had decided: it is refused, not
    // applied over the timeout, and the timeout is not applied over it.
    assert_eq!(answer.status, 409, "{}", answer.text());
    let map = rings.get("/rings").json();
    assert_eq!(map["a"]["outcome"], "timeout");
    assert_eq!(
        map["b"]["outcome"], "pending",
        "the claim made during the alarm was lost: {map}"
    );
    assert_eq!(rings.alarm(), Some(t0 + 600_000));
}

fn drive_watch(node: &TestNode, name: &str, rule: &str, drains_max: usize) -> (bool, i64, i64) {
    let w = node.actor(&format!("demo/examples/watch/{name}"));
    let anchor = node.now_ms() + 3 * 60_000;
    let ttl = 60 * 60_000;
    let step = 5 * 60_000;
    assert_eq!(
        w.post(
            &format!("/arm?due_ms={anchor}&ttl_ms={ttl}&step_ms={step}&rule={rule}"),
            ""
        )
        .status,
        204
    );
    let mut drains = 0;
    let mut longest = 0;
    loop {
        let s = w.get("/state").json();
        longest = longest.max(s["history_len"].as_i64().unwrap());
        if !s["alive"].as_bool().unwrap() || drains >= drains_max {
            return (
                s["alive"].as_bool().unwrap(),
                s["drains"].as_i64().unwrap(),
                longest,
            );
        }
        // Exactly on time, every time: the case the moving deadline gets wrong.
        let due = w.alarm().expect("a live watch has an alarm");
        assert_eq!(due, s["due_ms"].as_u64().unwrap());
        node.advance_to(due);
        drains += 1;
    }
}

/// Measured from its fixed anchor, a watch retires on the run that is
/// first more than the TTL past the anchor: 60 min / 5 min + 2 runs.
#[test]
fn a_watch_measured_from_a_fixed_anchor_retires() {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    let (alive, drains, longest) = drive_watch(&node, "anchored", "anchored", 100);
    assert!(!alive);
    assert_eq!(drains, 60 / 5 + 2);
    assert!(longest < 24);
    assert_eq!(node.actor("demo/examples/watch/anchored").alarm(), None);
}

/// The seed's bug, kept runnable: measured from the boundary it moves at
/// every run, an on-time watch is always zero minutes old and never
/// retires. This test pins that the example really shows the bug.
#[test]
fn a_watch_measured_from_a_moving_deadline_never_retires() {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    let (alive, drains, longest) = drive_watch(&node, "moving", "moving", 100);
    assert!(alive, "the moving rule retired after {drains} runs");
    assert_eq!(drains, 100);
    // The history cap bounds the list, but not the watch's life.
    assert_eq!(longest, 24);
}
