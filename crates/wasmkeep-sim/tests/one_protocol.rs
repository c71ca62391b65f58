//! One protocol, two drivers (issue 18): the simulator runs the ownership
//! steps (its lease, reading another node's lease, taking and releasing an
//! actor) through `wasmkeep_cluster::machine`, the step machines the server
//! drives too, and holds no order of its own.
//!
//! The decisions a copy of that order would need (`plan_take`, `lease_view`,
//! `fence_write`, the holder's `NodeLease`) are private to `wasmkeep-cluster`,
//! so a copy does not compile (the crate's `compile_fail` doc tests show it).
//! What stays public is the record formats; this test makes sure the
//! simulator does not use them to write ownership records behind the
//! machines' back, and that it does drive the machines.

const SOURCES: [(&str, &str); 4] = [
    ("node.rs", include_str!("../src/node.rs")),
    ("sim.rs", include_str!("../src/sim.rs")),
    ("world.rs", include_str!("../src/world.rs")),
    ("lib.rs", include_str!("../src/lib.rs")),
];

#[test]
fn the_simulator_writes_no_ownership_record_of_its_own() {
    let banned = [
        "HoldRecord",
        "LeaseRecord",
        "hold_key",
        "hold_record",
        "fence_write",
        "plan_take",
        "lease_view",
        "NodeLease::",
        "hold/",
    ];
    for (file, text) in SOURCES {
        for needle in banned {
            assert!(
                !text.contains(needle),
                "src/{file} mentions `{needle}`: ownership steps belong in wasmkeep_cluster::machine"
            );
        }
    }
}

#[test]
fn the_simulated_node_drives_the_step_machines() {
    let node = SOURCES[0].1;
    for machine in [
        "NodeLeaseMachine",
        "NodeViewReader",
        "TakeMachine",
        "ReleaseMachine",
    ] {
        assert!(
            node.contains(machine),
            "src/node.rs no longer drives {machine}"
        );
    }
}

/// One retry rule (issue 19): the runtime commits the alarm a failed
/// `on-alarm` leaves through `wasmkeep_cluster::retry`, the rule the
/// simulator checks, and keeps no rule of its own beside it.
#[test]
fn the_runtime_and_the_simulator_share_the_retry_rule() {
    let actor = concat!(
        include_str!("../../wasmkeep-runtime/src/actor.rs"),
        include_str!("../../wasmkeep-runtime/src/actor/alarm.rs"),
    );
    assert!(actor.contains("use wasmkeep_cluster::retry::{RetryPolicy, after_alarm_run};"));
    assert!(actor.contains("after_alarm_run(&policy"));
    assert!(
        SOURCES[0]
            .1
            .contains("wasmkeep_cluster::retry::after_alarm_run")
    );
    let runtime_lib = include_str!("../../wasmkeep-runtime/src/lib.rs");
    assert!(
        !runtime_lib.contains("mod alarm;"),
        "a second retry rule in the runtime"
    );
    for (file, text) in SOURCES.iter().copied().chain([("actor.rs", actor)]) {
        for copy in ["fn retry_delay", "fn after_failure", "checked_shl"] {
            assert!(
                !text.contains(copy),
                "{file} has a retry rule of its own (`{copy}`)"
            );
        }
    }
}

/// One delivery rule: the server's owner side (`wasmkeep-runtime`'s
/// `index.rs`) decides what a sweep's delivery does with
/// `wasmkeep_cluster::delivery::plan_delivery` under `Rules::SAFE`, the
/// rule whose no-state clause the simulator checks (`run-without-state`).
#[test]
fn the_runtime_and_the_simulator_share_the_delivery_rule() {
    let index = include_str!("../../wasmkeep-runtime/src/index.rs");
    assert!(index.contains("delivery::plan_delivery(Rules::SAFE,"));
    // Twice: for a stale entry and for an actor with no state (as the
    // simulator's `stale` does for both), never a no-state rule of its own.
    assert_eq!(
        index
            .matches("alarm_index::next_stale_step(Rules::SAFE,")
            .count(),
        2,
        "index.rs decides a delivery's stale and no-state steps by next_stale_step"
    );
    assert!(index.contains("alarm_index::plan_event_in_layouts("));
    let node = include_str!("../src/node.rs");
    assert!(node.contains("plan_delivery(rules, at,"));
}

/// One sweep (issue 34): the server's pass and the simulator's both run
/// through `wasmkeep_cluster::machine::SweepMachine`: the listing, the
/// cursor, the pick, the deferrals and "sweep again at once" are the
/// machine's, and neither driver keeps a copy (the pick and the cursor are
/// private to `wasmkeep-cluster`, so a copy does not compile). The
/// simulator hands the machine's jobs to its node's delivery path, the one
/// its timer uses, not to a timer merge with no production caller.
#[test]
fn the_server_and_the_simulator_drive_one_sweep_machine() {
    let server = include_str!("../../wasmkeep-server/src/cluster/sweep.rs");
    let node = SOURCES[0].1;
    for (file, text) in [("server sweep.rs", server), ("sim node.rs", node)] {
        for needed in [
            "SweepMachine::new(",
            ".start_pass(",
            "SweepEffect::Deliver(",
            ".on_delivered(",
        ] {
            assert!(
                text.contains(needed),
                "{file} no longer drives the sweep machine ({needed})"
            );
        }
        for copy in [
            "merge_timer",
            "SweepCursor",
            "plan_sweep(",
            "sweep_until_ms",
            "deferred",
            "delay_ms(",
        ] {
            assert!(
                !text.contains(copy),
                "{file} sequences the sweep itself (`{copy}`)"
            );
        }
    }
    let cluster_sweep = include_str!("../../wasmkeep-cluster/src/sweep.rs");
    assert!(
        !cluster_sweep.contains("fn merge_timer"),
        "a timer merge with no production caller"
    );
    assert!(
        node.contains("sweep: Some(job)"),
        "sweep jobs go to the node's delivery path"
    );
}

/// One upkeep of the index (issue 34): the runtime's replication and the
/// simulator's node list the entries an upload's commits name, upload,
/// remove what they replaced and give the actor up in the order of
/// `wasmkeep_cluster::machine::UploadRound`, and a delivery removes stale
/// entries through `StaleCleanup`; neither driver keeps its own order of
/// those writes nor calls the rule that picks the stale entries.
#[test]
fn the_runtime_and_the_simulator_drive_one_index_upkeep() {
    let replication = include_str!("../../wasmkeep-runtime/src/replication.rs");
    let index = include_str!("../../wasmkeep-runtime/src/index.rs");
    let node = SOURCES[0].1;
    let runtime = format!("{replication}{index}");
    for (who, text) in [("the runtime", runtime.as_str()), ("sim node.rs", node)] {
        for needed in [
            ".start_upload(",
            "UpkeepEffect::List(",
            "UpkeepEffect::Upload",
            "UpkeepEffect::Landed {",
            "StaleCleanup::new(",
            "CleanupEffect::Bucket(",
        ] {
            assert!(
                text.contains(needed),
                "{who} no longer drives the index upkeep machines ({needed})"
            );
        }
        for copy in [
            "stale_entries_to_delete",
            "tagged_folder",
            "put_before_upload {",
        ] {
            assert!(
                !text.contains(copy),
                "{who} sequences the index writes itself (`{copy}`)"
            );
        }
    }
    assert!(
        !index.contains("pub struct Pending"),
        "a second ledger of index writes in the runtime"
    );
}
