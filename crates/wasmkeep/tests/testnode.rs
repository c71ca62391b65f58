//! The process test kit (`wasmkeep-testnode`, ADR 0055) against this
//! binary: what an actor crate's tests do with it (deploy, requests, the
//! test clock and alarms, a crash and a restart, read-only SQL, a
//! manifest and a secret) works on a real `wasmkeep serve` process.

mod common;

use std::time::Duration;

use wasmkeep_testnode::{Options, TestNode};

fn options() -> Options {
    TestNode::options().binary(env!("CARGO_BIN_EXE_wasmkeep"))
}

#[test]
fn the_process_kit_keeps_what_was_acknowledged_across_a_crash_and_a_restart() {
    let mut node = options().start();
    node.deploy("kit/demo", wasmkeep_guests::DEMO)
        .expect("deploy");
    let bad = node.deploy("kit/bad", b"not a component").unwrap_err();
    assert!(
        bad.starts_with("422 ") && bad.contains("invalid_component"),
        "{bad}"
    );

    let alice = node.actor("kit/demo/counter/alice");
    assert_eq!(alice.post("/increment", "").json()["value"], 1);
    assert_eq!(alice.post("/increment", "").json()["value"], 2);
    assert_eq!(alice.sql_i64("SELECT n FROM counter"), 2);
    assert_eq!(alice.get("/nothing-here").status, 404);

    node.crash();
    let alice = node.actor("kit/demo/counter/alice");
    assert_eq!(alice.get("/value").json()["value"], 2, "after SIGKILL");
    assert_eq!(alice.post("/increment", "").json()["value"], 3);
    node.restart();
    assert_eq!(
        node.actor("kit/demo/counter/alice").get("/value").json()["value"],
        3,
        "after a clean restart"
    );
    // An actor's name as in its URL.
    let odd = node.actor("kit/demo/counter/a%2Fb%20c");
    assert_eq!(odd.post("/increment", "").json()["value"], 1);
    assert_eq!(odd.inspect()["name"], "a/b c");
}

/// ADR 0074: with the commit log (the default), the actors' write-ahead
/// logs are not synced per group; a power cut that takes what they held
/// in the page cache loses nothing acknowledged, because the node puts it
/// back from the log at its start. The cut here is harsher than a real
/// one (every log emptied, synced bytes too): the log holds every write
/// since the node's last cut, and the node has not cut yet.
fn acknowledged_after_emptied_logs(config: &str) -> Vec<i64> {
    let mut node = options().config(config).start();
    node.deploy("kit/demo", wasmkeep_guests::DEMO)
        .expect("deploy");
    let actors = 6;
    for i in 1..=20 {
        for a in 0..actors {
            let c = node.actor(&format!("kit/demo/counter/c{a}"));
            assert_eq!(c.post("/increment", "").json()["value"], i);
        }
    }
    node.crash_and(|data| {
        assert_eq!(common::empty_actor_logs(data), actors);
    });
    // An actor whose table went with its log answers an error: -1.
    (0..actors)
        .map(|a| {
            let r = node.actor(&format!("kit/demo/counter/c{a}")).get("/value");
            if r.status == 200 {
                r.json()["value"].as_i64().expect("a number")
            } else {
                -1
            }
        })
        .collect()
}

#[test]
fn a_power_cut_that_took_the_actors_logs_loses_nothing_the_commit_log_held() {
    assert_eq!(acknowledged_after_emptied_logs(""), vec![20; 6]);
    // Without the log the same cut takes the acknowledged increments: it
    // is the replay that put them back.
    let without = acknowledged_after_emptied_logs("commit_log = false");
    assert!(without.iter().all(|n| *n < 20), "{without:?}");
}

#[test]
fn the_process_kits_clock_moves_only_when_the_test_says_and_survives_a_restart() {
    let start = 1_800_000_000_000;
    let mut node = options().start_ms(start).start();
    node.deploy("kit/demo", wasmkeep_guests::DEMO)
        .expect("deploy");
    let r = node.actor("kit/demo/reminder/r");
    let due = start + 60_000;
    assert_eq!(r.post(&format!("/set?at_ms={due}"), "").status, 200);
    assert_eq!(r.alarm(), Some(due));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(node.now_ms(), start, "the clock stands still");

    assert_eq!(node.advance(Duration::from_secs(59)), 0, "not yet due");
    node.restart();
    assert_eq!(
        node.now_ms(),
        start + 59_000,
        "a restart keeps the test's time"
    );
    let r = node.actor("kit/demo/reminder/r");
    assert_eq!(r.get("/fired").json()["fired"], serde_json::json!([]));
    assert_eq!(node.advance(Duration::from_secs(1)), 1, "one alarm ran");
    let fired = r.get("/fired").json();
    assert_eq!(fired["fired"][0]["fired_ms"], due, "at its time: {fired}");
    assert_eq!(r.alarm(), None, "delivered once");
    assert_eq!(node.advance(Duration::from_secs(3600)), 0);
}

#[test]
fn the_process_kit_deploys_a_manifest_and_sets_a_secret() {
    let node = options().start();
    node.deploy_with_manifest(
        "kit/demo",
        wasmkeep_guests::DEMO,
        "[vars]\nGREETING = \"hi & bye\"\n",
    )
    .expect("deploy");
    node.set_secret("kit/demo", "TOKEN", "s3cret");
    let p = node.actor("kit/demo/pinger/p");
    assert_eq!(p.get("/config?name=GREETING").json()["value"], "hi & bye");
    assert_eq!(p.get("/config?name=TOKEN").json()["value"], "s3cret");
    let bad = node
        .deploy_with_manifest("kit/other", wasmkeep_guests::DEMO, "[vars\n")
        .unwrap_err();
    assert!(
        bad.starts_with("422 ") && bad.contains("invalid_manifest"),
        "{bad}"
    );
}

#[test]
fn a_missing_binary_is_named_in_the_failure() {
    let failed =
        std::panic::catch_unwind(|| TestNode::options().binary("/nonexistent/wasmkeep").start())
            .expect_err("no binary, no node");
    let message = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("/nonexistent/wasmkeep") && message.contains("WASMKEEP_BIN"),
        "{message}"
    );
}
