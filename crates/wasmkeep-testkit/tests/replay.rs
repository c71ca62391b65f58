//! Recording and replay (ADR 0062) in-process: what makes a recorded event
//! run again the same way, and what the generations of a recording keep.

#![allow(
    clippy::disallowed_methods,
    reason = "a parked request waits on a real thread"
)]

use std::time::Duration;

use wasmkeep_guests::{DEMO, EXAMPLES_TS};
use wasmkeep_runtime::replay::{ReplayOptions, ReplayReport};
use wasmkeep_testkit::TestNode;

fn replay(node: &TestNode, app: &str, wasm: &[u8], class: &str) -> ReplayReport {
    let opts = ReplayOptions {
        class: Some(class.into()),
        sample: 10,
        ..Default::default()
    };
    node.runtime()
        .replay("demo", app, wasm, &opts)
        .expect("replay")
}

/// `files` answers `POST /id` with `identity.unique-id`: random bytes.
/// The sandbox draws them from the recorded seed, so production's answers
/// come out again; without the tape (the unsafe variant) they do not.
#[test]
fn random_ids_come_out_again_from_the_recorded_seed() {
    for (app, wasm) in [("rs", DEMO), ("ts", EXAMPLES_TS)] {
        let node = TestNode::new();
        node.deploy_with_manifest(&format!("demo/{app}"), wasm, "[recording]\n")
            .unwrap();
        let files = node.actor(&format!("demo/{app}/files/f"));
        let a = files.post("/id", "").json()["id"].clone();
        node.advance(Duration::from_secs(1));
        let b = files.post("/id", "").json()["id"].clone();
        assert_ne!(a, b);

        let r = replay(&node, app, wasm, "files");
        assert_eq!(r.events_replayed, 2, "{r:#?}");
        assert_eq!(r.actors_not_reproduced, 0, "{r:#?}");
        assert!(r.same(), "{r:#?}");

        node.runtime()
            .faults()
            .unsafe_replay_without_tape
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let r = replay(&node, app, wasm, "files");
        assert_eq!(r.actors_not_reproduced, 1, "without the tape: {r:#?}");
        let n = r.actors[0].not_reproduced.as_ref().unwrap();
        assert!(n.production.contains(a.as_str().unwrap()), "{n:#?}");
    }
}

/// With `events_per_actor_max = 100`, a generation holds fifty events;
/// after 130, the recording keeps the last generation or two, each
/// replayable from its base, and no more than two bases lie in the
/// actor's folder.
#[test]
fn generations_rotate_and_what_is_kept_still_replays() {
    for (app, wasm) in [("rs", DEMO), ("ts", EXAMPLES_TS)] {
        let node = TestNode::new();
        node.deploy_with_manifest(
            &format!("demo/{app}"),
            wasm,
            "[recording]\nevents_per_actor_max = 100\n",
        )
        .unwrap();
        let counter = node.actor(&format!("demo/{app}/counter/c"));
        for i in 1..=130 {
            assert_eq!(counter.post("/increment", "").json()["value"], i);
        }
        let r = replay(&node, app, wasm, "counter");
        assert!(
            (50..=100).contains(&r.events_replayed),
            "one or two generations of fifty: {r:#?}"
        );
        assert_eq!(r.actors_not_reproduced, 0, "{r:#?}");
        assert!(r.same(), "{r:#?}");
        let dir = node
            .data_dir()
            .join("actors")
            .join("demo")
            .join(app)
            .join("counter")
            .join("63"); // "c" in hex
        let bases = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("recording."))
            .count();
        assert!(
            (1..=2).contains(&bases),
            "{bases} bases in {}",
            dir.display()
        );
    }
}

/// An app that does not record writes nothing and has nothing to replay.
#[test]
fn an_app_without_recording_has_nothing_to_replay() {
    let node = TestNode::new();
    node.deploy("demo/rs", DEMO).unwrap();
    let counter = node.actor("demo/rs/counter/c");
    assert_eq!(counter.post("/increment", "").status, 200);
    let tables =
        counter.sql_i64("SELECT count(*) FROM sqlite_schema WHERE name = '_wasmkeep_recorded'");
    assert_eq!(tables, 0);
    let r = replay(&node, "rs", DEMO, "counter");
    assert_eq!(r.events_replayed, 0);
    assert!(r.actors.is_empty(), "no actor has a base copy: {r:#?}");
}

/// Events that ran while the app did not record (a deploy without
/// `[recording]`) end the actor's run of generations: the replay after
/// recording is turned on again starts from a copy taken then, and
/// reproduces production. Keeping the old run (the unsafe variant) makes
/// the replay start from a copy that lacks those events' writes: the
/// baseline's counter answers an older value than production's.
#[test]
fn events_not_recorded_end_the_run_of_generations() {
    for keep_run in [false, true] {
        let node = TestNode::new();
        node.runtime()
            .faults()
            .unsafe_recording_keeps_run
            .store(keep_run, std::sync::atomic::Ordering::Relaxed);
        let counter = node.actor("demo/rs/counter/c");
        node.deploy_with_manifest("demo/rs", DEMO, "[recording]\n")
            .unwrap();
        for i in 1..=3 {
            assert_eq!(counter.post("/increment", "").json()["value"], i);
        }
        node.deploy("demo/rs", DEMO).unwrap();
        for i in 4..=5 {
            assert_eq!(counter.post("/increment", "").json()["value"], i);
        }
        node.deploy_with_manifest("demo/rs", DEMO, "[recording]\n")
            .unwrap();
        for i in 6..=7 {
            assert_eq!(counter.post("/increment", "").json()["value"], i);
        }
        let r = replay(&node, "rs", DEMO, "counter");
        if keep_run {
            assert_eq!(r.actors_not_reproduced, 1, "unsafe variant: {r:#?}");
        } else {
            assert_eq!(r.actors_not_reproduced, 0, "{r:#?}");
            assert_eq!(r.events_replayed, 2, "the two recorded since: {r:#?}");
            assert!(r.same(), "{r:#?}");
        }
    }
}

/// An event that traps leaves the next one a fresh instance: the actor's
/// recording goes on with it (the writes after the trap are recorded, so
/// the replay of the count after them reproduces production). Traps and
/// writes sent together put a write after a trap in one batch.
#[test]
fn a_trap_does_not_lose_the_recording() {
    let node = TestNode::new();
    node.deploy_with_manifest("demo/tb", wasmkeep_guests::TESTBED, "[recording]\n")
        .unwrap();
    let probe = node.actor("demo/tb/probe/p");
    assert_eq!(probe.post("/write?v=a", "").status, 204);
    assert!(probe.request("POST", "/trap?v=x", "").is_err());
    assert_eq!(probe.post("/write?v=b", "").status, 204);
    assert_eq!(probe.post("/write?v=c", "").status, 204);
    assert_eq!(probe.get("/count").json()["count"], 3);
    // Traps and writes sent at once share batches: a write after a trap
    // in the same batch runs on the fresh instance.
    std::thread::scope(|s| {
        for i in 0..16 {
            let probe = &probe;
            s.spawn(move || {
                let route = if i % 2 == 0 { "trap" } else { "write" };
                let _ = probe.request("POST", &format!("/{route}?v=t{i}"), "");
            });
        }
    });
    assert_eq!(probe.get("/count").json()["count"], 3 + 8);
    let r = replay(&node, "tb", wasmkeep_guests::TESTBED, "probe");
    assert_eq!(r.actors_not_reproduced, 0, "{r:#?}");
    assert_eq!(
        r.events_replayed,
        6 + 16,
        "every event, the traps' too: {r:#?}"
    );
    assert!(r.same(), "{r:#?}");
}

/// A request that parks its reply is recorded as parked, and its replay
/// answers "parked" at once in the sandbox, where no later event
/// completes it: production is reproduced (it would otherwise read as "no
/// answer" after REPLAY_EVENT_WAIT_MS, never what production recorded).
#[test]
fn a_parked_reply_replays_as_parked() {
    let node = TestNode::new();
    node.deploy_with_manifest("demo/rs", DEMO, "[recording]\n")
        .unwrap();
    let pinger = node.actor("demo/rs/pinger/p");
    std::thread::scope(|s| {
        let waiting = s.spawn(|| {
            pinger
                .request("POST", "/park?ms=60000", "")
                .map(|r| r.status)
        });
        let mut polls = 0;
        while node.runtime().parked_replies() == 0 {
            polls += 1;
            assert!(polls < 3_000, "the request never parked its reply");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(pinger.post("/complete-parked", "").status, 204);
        assert!(waiting.join().unwrap().is_ok());
    });
    let r = replay(&node, "rs", DEMO, "pinger");
    assert_eq!(r.actors_not_reproduced, 0, "{r:#?}");
    assert_eq!(r.events_replayed, 2, "{r:#?}");
    assert!(r.same(), "{r:#?}");
}

/// A generation the app's `bytes_per_app_max` refuses is not tried again
/// at every batch (each try would copy the database) but once per
/// RECORDING_RETRY_MS; meanwhile the actor records nothing.
#[test]
fn a_refused_generation_is_tried_again_a_minute_later() {
    let node = TestNode::new();
    node.deploy_with_manifest("demo/rs", DEMO, "[recording]\nbytes_per_app_max = 1\n")
        .unwrap();
    let refused = || node.runtime().metrics().recording_refused_total.get();
    let counter = node.actor("demo/rs/counter/c");
    for _ in 0..5 {
        assert_eq!(counter.post("/increment", "").status, 200);
    }
    assert_eq!(refused(), 1, "one try, not one per batch");
    node.advance(Duration::from_millis(
        wasmkeep_runtime::recording::RECORDING_RETRY_MS,
    ));
    assert_eq!(counter.post("/increment", "").status, 200);
    assert_eq!(refused(), 2);
    assert_eq!(replay(&node, "rs", DEMO, "counter").events_replayed, 0);
}

/// A node without a bucket holds the records of up to
/// RECORDING_HELD_EVENTS_MAX committed events in memory (ADR 0067). A
/// clean restart writes them as the actors close: the run goes on across
/// it. A crash loses them, and leaves the database's mark that some were
/// held: the actor's next recorded batch starts a new run from a copy
/// taken then, and the replay reproduces production. Going on with the
/// old run (the unsafe variant) replays from a base that lacks the lost
/// events' writes: the baseline's counter answers an older value.
#[test]
fn records_held_when_the_node_died_start_a_new_run() {
    use std::sync::atomic::Ordering::Relaxed;
    for ignore_gap in [false, true] {
        let mut node = TestNode::new();
        node.deploy_with_manifest("demo/rs", DEMO, "[recording]\n")
            .unwrap();
        let increment = |node: &TestNode, expect: i64| {
            let counter = node.actor("demo/rs/counter/c");
            assert_eq!(counter.post("/increment", "").json()["value"], expect);
        };
        increment(&node, 1);
        increment(&node, 2);
        node.restart();
        node.runtime()
            .faults()
            .unsafe_recording_ignores_unflushed
            .store(ignore_gap, Relaxed);
        increment(&node, 3);
        let r = replay(&node, "rs", DEMO, "counter");
        assert_eq!(r.events_replayed, 3, "written at the close: {r:#?}");
        assert!(r.same(), "{r:#?}");

        increment(&node, 4);
        node.crash_after_commit(1);
        let counter = node.actor("demo/rs/counter/c");
        assert!(counter.request("POST", "/increment", "").is_err());
        assert_eq!(
            counter.get("/value").json()["value"],
            5,
            "the crashed one committed"
        );
        increment(&node, 6);
        increment(&node, 7);
        let r = replay(&node, "rs", DEMO, "counter");
        if ignore_gap {
            assert_eq!(r.actors_not_reproduced, 1, "unsafe variant: {r:#?}");
        } else {
            assert_eq!(r.actors_not_reproduced, 0, "{r:#?}");
            assert_eq!(
                r.events_replayed, 3,
                "the get and two increments since: {r:#?}"
            );
            assert!(r.same(), "{r:#?}");
        }
    }
}
