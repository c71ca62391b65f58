//! Alarm semantics (product.md "Alarms", ADR 0009 "Retries are committed"),
//! on the real runtime with the test kit's clock.

use std::time::Duration;

use wasmkeep_guests::{DEMO, TESTBED};
use wasmkeep_testkit::TestNode;

fn node() -> TestNode {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    node.deploy("t/bed", TESTBED).unwrap();
    node
}

fn fired(r: &wasmkeep_testkit::ActorHandle) -> Vec<serde_json::Value> {
    r.get("/fired").json()["fired"].as_array().unwrap().clone()
}

#[test]
fn an_alarm_fires_once_at_its_time() {
    let node = node();
    let r = node.actor("demo/examples/reminder/a");
    let t = node.now_ms() + 5_000;
    assert_eq!(r.post(&format!("/set?at_ms={t}"), "").status, 200);
    assert_eq!(r.get("/alarm").json()["alarm"], t);
    assert_eq!(node.advance(Duration::from_millis(4_999)), 0);
    assert!(fired(&r).is_empty());
    assert_eq!(node.advance(Duration::from_millis(1)), 1);
    let f = fired(&r);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["due_ms"], t);
    assert_eq!(f[0]["fired_ms"], t);
    assert_eq!(f[0]["retry_count"], 0);
    assert_eq!(f[0]["is_retry"], false);
    // Inside the handler the alarm counts as already started.
    assert_eq!(f[0]["alarm_in_handler"], serde_json::Value::Null);
    assert_eq!(r.get("/alarm").json()["alarm"], serde_json::Value::Null);
    node.advance(Duration::from_secs(600));
    assert_eq!(fired(&r).len(), 1);
}

#[test]
fn a_past_time_fires_at_once() {
    let node = node();
    let r = node.actor("demo/examples/reminder/a");
    let now = node.now_ms();
    r.post(&format!("/set?at_ms={}", now - 60_000), "");
    assert_eq!(node.run_due_alarms(), 1);
    let f = fired(&r);
    assert_eq!(f[0]["fired_ms"], now);
}

#[test]
fn set_replaces_and_delete_clears() {
    let node = node();
    let r = node.actor("demo/examples/reminder/a");
    let t0 = node.now_ms();
    r.post(&format!("/set?at_ms={}", t0 + 1_000), "");
    r.post(&format!("/set?at_ms={}", t0 + 9_000), "");
    assert_eq!(node.advance(Duration::from_secs(5)), 0);
    assert_eq!(node.advance(Duration::from_secs(5)), 1);
    assert_eq!(fired(&r)[0]["due_ms"], t0 + 9_000);
    r.post(&format!("/set?at_ms={}", t0 + 20_000), "");
    assert_eq!(r.request("DELETE", "/alarm", "").unwrap().status, 200);
    assert_eq!(r.alarm(), None);
    assert_eq!(node.advance(Duration::from_secs(60)), 0);
    assert_eq!(fired(&r).len(), 1);
}

#[test]
fn a_write_that_rolls_back_takes_its_alarm_with_it() {
    let node = node();
    let p = node.actor("t/bed/probe/p");
    p.post("/write", "");
    // The alarm is set and then the event fails: the alarm rolls back too.
    let t = node.now_ms() + 1000;
    let bad = p.request("POST", &format!("/alarm?at_ms={t}&mode=ok"), "");
    assert!(bad.is_ok());
    assert_eq!(p.alarm(), Some(t));
    let out_of_range = p
        .request("POST", "/alarm?at_ms=99999999999999999", "")
        .unwrap_err();
    assert_eq!(out_of_range.code(), "invalid_argument", "{out_of_range}");
    assert!(out_of_range.to_string().contains("alarm_at_ms_max"));
    assert_eq!(p.alarm(), Some(t), "a failed event must not move the alarm");
}

#[test]
fn retries_back_off_and_the_schedule_survives_a_restart() {
    let mut node = node();
    let t = node.now_ms() + 1_000;
    let r = node.actor("demo/examples/reminder/a");
    r.post(&format!("/set?at_ms={t}&fail_times=3"), "");
    drop(r);
    node.advance_to(t);
    let r = node.actor("demo/examples/reminder/a");
    // Failed once: next attempt one second later, visible from outside.
    assert_eq!(r.alarm(), Some(t + 1_000));
    assert_eq!(r.get("/alarm").json()["alarm"], t + 1_000);
    assert_eq!(r.alarm_retry_count(), 1);
    drop(r);
    node.advance_to(t + 1_000);
    assert_eq!(
        node.actor("demo/examples/reminder/a").alarm(),
        Some(t + 3_000)
    );
    // The backoff is in the database: a restart keeps it.
    node.restart();
    let r = node.actor("demo/examples/reminder/a");
    assert_eq!(r.alarm(), Some(t + 3_000));
    assert_eq!(r.alarm_retry_count(), 2);
    drop(r);
    assert_eq!(node.advance_to(t + 2_999), 0);
    node.advance_to(t + 3_000);
    assert_eq!(
        node.actor("demo/examples/reminder/a").alarm(),
        Some(t + 7_000)
    );
    assert_eq!(node.advance_to(t + 7_000), 1);
    let f = fired(&node.actor("demo/examples/reminder/a"));
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["fired_ms"], t + 7_000);
    assert_eq!(f[0]["retry_count"], 3);
    assert_eq!(f[0]["is_retry"], true);
}

#[test]
fn backoff_doubles_up_to_five_minutes_and_never_gives_up_by_default() {
    let node = node();
    let p = node.actor("t/bed/probe/p");
    let t = node.now_ms();
    p.post(&format!("/alarm?at_ms={t}&mode=fail"), "");
    let mut gaps = Vec::new();
    let mut last = t;
    for _ in 0..12 {
        node.advance_to(last);
        let next = p.alarm().expect("still retrying");
        gaps.push(next - last);
        last = next;
    }
    assert_eq!(
        gaps,
        [
            1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000, 256000, 300000, 300000, 300000
        ]
    );
}

#[test]
fn an_apps_retry_limit_drops_the_alarm_when_the_last_retry_fails() {
    let node = TestNode::new();
    node.deploy_with_manifest("t/bed", TESTBED, "[alarms]\nretries_max = 2\n")
        .unwrap();
    let p = node.actor("t/bed/probe/p");
    p.post(&format!("/alarm?at_ms={}&mode=fail", node.now_ms()), "");
    node.advance(Duration::from_secs(60));
    assert_eq!(p.alarm(), None);
    // Three attempts ran (the first and two retries); each rolled back its row.
    assert_eq!(p.get("/count").json()["count"], 0);
}

#[test]
fn a_handler_that_reschedules_itself_and_fails_still_backs_off() {
    let node = node();
    let p = node.actor("t/bed/probe/p");
    let t = node.now_ms();
    p.post(&format!("/alarm?at_ms={t}&mode=reschedule-and-fail"), "");
    node.advance_to(t);
    assert_eq!(p.alarm(), Some(t + 1_000));
    node.advance_to(t + 1_000);
    assert_eq!(p.alarm(), Some(t + 3_000));
    node.advance_to(t + 3_000);
    assert_eq!(p.alarm(), Some(t + 7_000));
    assert_eq!(p.alarm_retry_count(), 3);
}

#[test]
fn a_later_alarm_or_a_clear_set_by_a_failing_handler_stands() {
    let node = node();
    let p = node.actor("t/bed/probe/later");
    let t = node.now_ms();
    p.post(&format!("/alarm?at_ms={t}&mode=later-and-fail"), "");
    node.advance_to(t);
    assert_eq!(p.alarm(), Some(t + 3_600_000));
    let c = node.actor("t/bed/probe/clear");
    c.post(&format!("/alarm?at_ms={t}&mode=clear-and-fail"), "");
    node.run_due_alarms();
    assert_eq!(c.alarm(), None);
}

#[test]
fn each_new_alarm_starts_a_fresh_backoff() {
    let node = node();
    let r = node.actor("demo/examples/reminder/a");
    let t = node.now_ms() + 1_000;
    // Two runs, 10 s apart from the anchor; each fails twice first.
    r.post(
        &format!("/set?at_ms={t}&fail_times=2&every_ms=10000&count=2"),
        "",
    );
    drop(r);
    node.advance(Duration::from_secs(60));
    let f = fired(&node.actor("demo/examples/reminder/a"));
    assert_eq!(f.len(), 2, "{f:?}");
    assert_eq!(f[0]["fired_ms"], t + 3_000);
    assert_eq!(f[0]["retry_count"], 2);
    // Re-armed from the anchor (t + 10 s), not from when it fired, and
    // its backoff starts again from one second.
    assert_eq!(f[1]["fired_ms"], t + 10_000 + 3_000);
    assert_eq!(f[1]["retry_count"], 2);
}

#[test]
fn a_trapping_alarm_handler_is_retried_like_a_failing_one() {
    let node = node();
    let p = node.actor("t/bed/probe/p");
    let t = node.now_ms();
    p.post(&format!("/alarm?at_ms={t}&mode=trap"), "");
    node.advance_to(t);
    assert_eq!(p.alarm(), Some(t + 1_000));
    // The actor still serves requests after its instance trapped.
    assert_eq!(p.post("/write", "").status, 204);
}

#[test]
fn an_alarm_whose_commit_is_lost_fires_again() {
    let node = node();
    let r = node.actor("demo/examples/reminder/a");
    let t = node.now_ms() + 1_000;
    r.post(&format!("/set?at_ms={t}"), "");
    node.fail_next_alarm_commits(1);
    node.advance_to(t);
    // The handler ran, but its commit failed: nothing of it stands, and the
    // alarm is still pending (at-least-once) and fires on the next advance,
    // with no other event in between.
    node.advance(Duration::from_secs(5));
    let f = fired(&r);
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(f[0]["fired_ms"].as_u64().unwrap() >= t + 1_000);
}

#[test]
fn an_alarm_for_an_actor_without_state_does_not_create_it() {
    let node = node();
    let ghost = node.actor("demo/examples/reminder/never-seen");
    assert!(!ghost.run_alarm());
    assert!(!ghost.exists());
    let dir = node.data_dir().join("actors/demo/examples/reminder");
    assert!(!dir.exists() || std::fs::read_dir(&dir).unwrap().next().is_none());
}

#[test]
fn deleting_an_actor_deletes_its_alarm() {
    let node = node();
    let r = node.actor("demo/examples/reminder/gone");
    let t = node.now_ms() + 1_000;
    r.post(&format!("/set?at_ms={t}"), "");
    assert!(node.runtime().alarms().pending("demo", 10).len() == 1);
    assert!(r.delete_actor());
    assert!(node.runtime().alarms().pending("demo", 10).is_empty());
    assert_eq!(node.advance(Duration::from_secs(10)), 0);
    assert!(!r.exists());
}

#[test]
fn ten_thousand_alarms_due_at_one_instant_all_fire() {
    // Durability is not what this test is about: skip the fsyncs.
    let node = TestNode::with_config(|c| {
        c.instances_max = 256;
        c.durability = wasmkeep_runtime::Durability::Process;
    });
    node.deploy("demo/examples", DEMO).unwrap();
    let t = node.now_ms() + 5_000;
    for i in 0..10_000 {
        let r = node.actor(&format!("demo/examples/reminder/r{i}"));
        assert_eq!(r.post(&format!("/set?at_ms={t}"), "").status, 200);
    }
    assert_eq!(
        node.runtime().alarms().pending("demo", 20_000).len(),
        10_000
    );
    assert_eq!(node.advance(Duration::from_secs(5)), 10_000);
    assert!(node.runtime().alarms().pending("demo", 10).is_empty());
    for i in (0..10_000).step_by(997) {
        let f = fired(&node.actor(&format!("demo/examples/reminder/r{i}")));
        assert_eq!(f.len(), 1);
    }
}

/// ADR 0026: an actor opened ahead of its alarm has the statements its
/// class's handler ran elsewhere prepared before the due instant, so that
/// thousands of alarms due together do not each parse them then.
#[test]
fn an_actor_is_prepared_with_the_statements_its_class_ran_in_alarms() {
    // Learning from alarms that ran, without the rehearsal (ADR 0030) that
    // would teach the class before its first alarm.
    let node = TestNode::with_config(|c| c.alarm_rehearse = false);
    node.deploy("demo/examples", DEMO).unwrap();
    let insert = "INSERT INTO fired";
    let has = has_guest_statement;
    let a = node.actor("demo/examples/reminder/a");
    let b = node.actor("demo/examples/reminder/b");
    let t = node.now_ms() + 10_000;
    a.post(&format!("/set?at_ms={t}"), "");
    b.post(&format!("/set?at_ms={}", t + 5_000), "");
    // Nothing learned yet: a's alarm is the class's first.
    node.advance_to(t - 1_000);
    assert!(!has(&a, insert), "{:?}", a.prepared_statements());
    assert_eq!(node.advance_to(t), 1);
    // b is open, and only its request's statements are prepared.
    node.advance_to(t + 3_500);
    assert!(!has(&b, insert), "{:?}", b.prepared_statements());
    // Within `alarm_prepare_ms` of b's alarm the timer prepares it: what
    // a's handler ran is now ready on b's connection, before b's alarm.
    node.runtime().alarms().prepare();
    let ready = b.prepared_statements();
    assert!(has(&b, insert), "{ready:?}");
    assert!(has(&b, "SELECT anchor_ms"), "{ready:?}");
    assert!(
        ready
            .iter()
            .any(|s| s == "DELETE FROM _wasmkeep_alarm WHERE id = 0"),
        "{ready:?}"
    );
    assert!(fired(&b).is_empty());
    assert_eq!(node.advance_to(t + 5_000), 1);
    assert_eq!(fired(&b).len(), 1);
}

fn has_guest_statement(r: &wasmkeep_testkit::ActorHandle, what: &str) -> bool {
    r.prepared_statements()
        .iter()
        .any(|s| s.starts_with("/*guest*/ ") && s.contains(what))
}

fn rehearsals(node: &TestNode) -> u64 {
    node.runtime().metrics().alarm_rehearsals_total.get()
}

/// ADR 0030: on a node where no alarm of the class ran yet, the first actor
/// prepared ahead of its alarm runs its handler once, rolled back, so that
/// every actor of the class prepared after it has the handler's statements
/// ready before the due instant; nothing the rehearsal did remains.
#[test]
fn the_first_prepared_actor_rehearses_its_class_alarm_and_leaves_no_trace() {
    let node = node();
    let t = node.now_ms() + 10_000;
    let actors: Vec<_> = (0..3)
        .map(|i| node.actor(&format!("demo/examples/reminder/r{i}")))
        .collect();
    let set = format!("/set?at_ms={t}&every_ms=1000&count=2");
    actors[0].post(&set, "");
    // Within `alarm_prepare_ms` of r0's alarm the timer prepares it, and
    // r0 rehearses the class.
    node.advance_to(t - 1_500);
    node.runtime().alarms().prepare();
    assert!(fired(&actors[0]).is_empty());
    assert_eq!(rehearsals(&node), 1);
    // Actors prepared after it have the handler's statements ready.
    for r in &actors[1..] {
        r.post(&set, "");
    }
    node.runtime().alarms().prepare();
    for r in &actors {
        let ready = r.prepared_statements();
        assert!(has_guest_statement(r, "INSERT INTO fired"), "{ready:?}");
        assert!(has_guest_statement(r, "UPDATE plan"), "{ready:?}");
        // What the handler wrote (its row, its run count, its next alarm)
        // was rolled back.
        assert!(fired(r).is_empty());
        assert_eq!(r.sql_i64("SELECT runs_ok FROM plan"), 0);
        assert_eq!(r.alarm(), Some(t));
    }
    assert_eq!(rehearsals(&node), 1);
    assert_eq!(node.advance_to(t), 3);
    for r in &actors {
        let f = fired(r);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0]["fired_ms"], t);
        assert_eq!(r.alarm(), Some(t + 1_000));
    }
    // Learned once: later alarms of the class need no rehearsal.
    assert_eq!(node.advance_to(t + 1_000), 3);
    assert_eq!(rehearsals(&node), 1);
    assert!(actors.iter().all(|r| fired(r).len() == 2));
}

/// The unsafe variant: a rehearsal that keeps what the handler wrote runs
/// the alarm before its time, and the alarm is gone when it is due.
#[test]
fn a_rehearsal_that_is_not_rolled_back_fires_the_alarm_early() {
    let node = node();
    node.runtime()
        .faults()
        .unsafe_rehearsal_commits
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let r = node.actor("demo/examples/reminder/a");
    let t = node.now_ms() + 10_000;
    r.post(&format!("/set?at_ms={t}"), "");
    node.advance_to(t - 1_000);
    node.runtime().alarms().prepare();
    let f = fired(&r);
    assert_eq!(rehearsals(&node), 1);
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(f[0]["fired_ms"].as_u64().unwrap() < t);
    assert_eq!(r.alarm(), None);
}

/// With `alarm_rehearse = false` nothing runs before the due instant, and
/// the class's first alarms parse their statements then.
#[test]
fn without_rehearsal_the_first_alarm_of_a_class_is_not_prepared() {
    let node = TestNode::with_config(|c| c.alarm_rehearse = false);
    node.deploy("demo/examples", DEMO).unwrap();
    let r = node.actor("demo/examples/reminder/a");
    let t = node.now_ms() + 10_000;
    r.post(&format!("/set?at_ms={t}"), "");
    node.advance_to(t - 1_000);
    node.runtime().alarms().prepare();
    assert!(fired(&r).is_empty());
    assert_eq!(rehearsals(&node), 0);
    assert!(!has_guest_statement(&r, "INSERT INTO fired"));
    assert_eq!(node.advance_to(t), 1);
    assert_eq!(fired(&r).len(), 1);
}

/// The runtime reads the committed alarm back only after batches that may
/// have moved it; a request that moves an open actor's alarm earlier is
/// one, and the alarm fires at its new time, not the old one.
#[test]
fn an_alarm_moved_earlier_by_a_later_request_fires_at_its_new_time() {
    let node = node();
    let r = node.actor("demo/examples/reminder/a");
    let t = node.now_ms();
    r.post(&format!("/set?at_ms={}", t + 9_000), "");
    // Another request in between that leaves the alarm alone.
    r.get("/fired");
    r.post(&format!("/set?at_ms={}", t + 1_000), "");
    assert_eq!(node.advance_to(t + 1_000), 1);
    let f = fired(&r);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["due_ms"], t + 1_000);
    assert_eq!(f[0]["fired_ms"], t + 1_000);
}

/// A cluster node runs an actor's alarm only while its gate says it holds
/// the actor (`Runtime::set_gate`): a due alarm of an actor another node
/// holds is not run here, and the database still has it for whoever
/// restores the actor. Without a gate (a single node) every alarm runs.
#[test]
fn a_gate_keeps_alarms_of_actors_this_node_does_not_hold() {
    struct HoldsOnly(&'static str);
    impl wasmkeep_runtime::RunGate for HoldsOnly {
        fn may_run(&self, id: &wasmkeep_runtime::ActorId) -> bool {
            id.name == self.0
        }
    }
    let node = node();
    let held = node.actor("demo/examples/reminder/held");
    let other = node.actor("demo/examples/reminder/other");
    let t = node.now_ms() + 1_000;
    for r in [&held, &other] {
        assert_eq!(r.post(&format!("/set?at_ms={t}"), "").status, 200);
    }
    assert!(
        node.runtime()
            .alarms()
            .set_gate(std::sync::Arc::new(HoldsOnly("held")))
    );
    assert_eq!(node.advance(Duration::from_millis(1_000)), 1);
    assert_eq!(fired(&held).len(), 1);
    assert!(fired(&other).is_empty());
    // Not run, not lost: the actor's database keeps the alarm.
    assert_eq!(other.get("/alarm").json()["alarm"], t);
    assert_eq!(node.runtime().alarms().gated_total(), 1);
    // The lease ended: every idle actor closes at once.
    let held_id = wasmkeep_runtime::ActorId::new("demo", "examples", "reminder", "held").unwrap();
    assert!(node.runtime().is_open(&held_id));
    // A reply can reach the caller a moment before its actor's turn ends
    // (the actor is then still scheduled, and not idle): asked again
    // until both closed (seen failing in a full run when asked once).
    let mut closed = 0;
    for _ in 0..400 {
        closed += node.runtime().close_idle_now();
        if closed >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(closed >= 2, "{closed} actors closed");
    assert_eq!(node.runtime().active_actors(), 0);
    assert!(!node.runtime().is_open(&held_id));
}

/// An alarm run early by the test kit (`run_alarm`) whose handler fails
/// backs off from now, as a due one does: it does not stay at its later
/// time with one more failure counted.
#[test]
fn a_failing_alarm_run_early_backs_off_from_now() {
    let node = node();
    let p = node.actor("t/bed/probe/early");
    let t = node.now_ms() + 3_600_000;
    p.post(&format!("/alarm?at_ms={t}&mode=fail"), "");
    assert!(p.run_alarm());
    assert_eq!(p.alarm(), Some(node.now_ms() + 1_000));
    assert_eq!(p.alarm_retry_count(), 1);
}
