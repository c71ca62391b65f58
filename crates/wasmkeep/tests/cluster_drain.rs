//! `wasmkeep drain NODE` under load (issue 41, "Planned rebalancing"):
//! three `wasmkeep serve` nodes on one bucket (a folder, and moto with its
//! one-node-per-actor routing, as `cluster_load.rs` explains), client threads sending
//! `replicated` increments to the demo app's counters through every node
//! (the machinery of `cluster_load.rs`, in `common/load.rs`), and the node
//! that owns the most actors drained through the CLI while the load runs.
//! No request fails, every acknowledged value is there once, the drained
//! node holds no actor and still answers (it forwards), and `--undo` ends
//! the drain. Waits poll with a generous bound; nothing asserts a time.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

mod common;

use std::time::{Duration, Instant};

use common::cluster::{REPLICATED, send, status, value};
use common::load::{
    Cluster, Member, Sent, Store, actor_name, busiest, check_every_value_acknowledged,
    check_history, failures_by_code, owners, read_finals, spread_load, wait_for,
};

/// Clients wait for an answer as long as the cluster may take.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn a_drain_under_load_moves_every_actor_and_fails_no_request_on_a_folder() {
    drain_under_load(Store::Folder);
}

#[test]
fn a_drain_under_load_moves_every_actor_and_fails_no_request_on_moto() {
    drain_under_load(Store::Moto);
}

fn drain_under_load(store: Store) {
    const ACTORS: usize = 12;
    let c = Cluster::new(store);
    let members = c.start_three();
    let (_balancer, load) = spread_load(&c, &members, ACTORS, 3, CLIENT_TIMEOUT);
    std::thread::sleep(Duration::from_millis(500));
    let (d, owned) = busiest(&members, &owners(&load.snapshot()));
    let drained = &members[d];
    let asked = &members[(d + 1) % members.len()];
    let held_before = status(&drained.node)["held_actors"].as_u64().unwrap();
    assert!(held_before > 0, "the busiest node holds no actor");

    // Through another node, by id, as an operator would.
    let (code, stdout, stderr) = asked.node.cli(&["drain", &drained.id], &[]);
    assert_eq!(code, 0, "wasmkeep drain failed: {stdout}{stderr}");
    assert!(stdout.contains("drained"), "{stdout}");
    let after_drain = Instant::now();
    let s = status(&drained.node);
    assert_eq!(
        (s["held_actors"].as_u64(), s["moving_out"].as_bool()),
        (Some(0), Some(true))
    );
    // The load goes on through all three nodes, the drained one included.
    load.wait_acknowledged(ACTORS, 3, after_drain, "load after the drain");
    let log = load.finish();

    let failed: Vec<&Sent> = log.iter().filter(|s| s.outcome.is_err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during the drain: {:?}; first: {:#?}",
        failed.len(),
        log.len(),
        failures_by_code(&log),
        &failed[..failed.len().min(3)]
    );
    let all: Vec<&Member> = members.iter().collect();
    let finals = read_finals(&all, ACTORS);
    let tally = check_history(&log, &finals);
    eprintln!(
        "drain ({store:?}): {ACTORS} actors, {held_before} held by the drained node, {tally}"
    );
    check_every_value_acknowledged(&log, &finals);
    // The drained node's actors answer from the other nodes now, and it
    // took none back: it still holds nothing.
    let later: Vec<Sent> = log
        .into_iter()
        .filter(|s| s.started > after_drain)
        .collect();
    let moved = owners(&later);
    for a in &owned {
        assert_ne!(
            moved.get(a),
            Some(&drained.id),
            "actor {a} answered from the drained node"
        );
    }
    assert_eq!(status(&drained.node)["held_actors"].as_u64(), Some(0));
    assert_eq!(value(drained.port, &actor_name(owned[0])).status, 200);

    // `--undo`: the node takes actors again.
    let (code, stdout, stderr) = asked.node.cli(&["drain", &drained.id, "--undo"], &[]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(status(&drained.node)["moving_out"].as_bool(), Some(false));
}

/// A drained actor's alarm runs on the node it went to, at its time: the
/// drain asks that node to take the actor, which opens it and times its
/// alarm (ADR 0072). The sweep runs once in ten minutes here, and nothing
/// reads the actor until after its alarm's time: only the hand-over can
/// have run it before that read.
#[test]
fn a_drained_actors_alarm_runs_on_its_new_node_before_anything_reads_it() {
    let c = Cluster::with_settings(Store::Folder, 60_000, "alarm_sweep_ms = 600000\n");
    let members = [c.start("a"), c.start("b")];
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    let path = "/v1/demo/examples/reminder/drained";
    let due_ms = now_ms() + 8_000;
    let set = send(
        members[0].port,
        "POST",
        &format!("{path}/set?at_ms={due_ms}"),
        &[REPLICATED],
    );
    assert_eq!(set.status, 200, "{}", set.body);
    assert_eq!(set.node.as_deref(), Some(members[0].id.as_str()));

    let (code, stdout, stderr) = members[1].node.cli(&["drain", &members[0].id], &[]);
    assert_eq!(code, 0, "wasmkeep drain failed: {stdout}{stderr}");
    assert!(
        now_ms() < due_ms,
        "the drain outlasted the alarm's lead: the test shows nothing"
    );
    assert_eq!(status(&members[0].node)["held_actors"].as_u64(), Some(0));
    // The hand-over's take may still be opening it there.
    wait_for("the other node to hold the actor it was handed", || {
        status(&members[1].node)["held_actors"].as_u64() == Some(1)
    });

    std::thread::sleep(Duration::from_millis(due_ms + 2_000 - now_ms()));
    let read_ms = now_ms();
    let a = send(members[1].port, "GET", &format!("{path}/fired"), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.node.as_deref(), Some(members[1].id.as_str()));
    let runs = a.body["fired"].as_array().cloned().unwrap_or_default();
    assert_eq!(runs.len(), 1, "{}", a.body);
    let fired_ms = runs[0]["fired_ms"].as_u64().unwrap();
    assert!(
        (due_ms..read_ms).contains(&fired_ms),
        "the alarm due at {due_ms} ran at {fired_ms}, not before the read at {read_ms}"
    );
}

#[test]
fn a_drain_with_no_other_node_is_refused() {
    let c = Cluster::new(Store::Folder);
    let one = c.start("alone");
    let (code, stdout, stderr) = one.node.cli(&["drain", &one.id], &[]);
    assert_ne!(code, 0, "{stdout}");
    assert!(stderr.contains("no_other_node"), "{stderr}");
    assert_eq!(status(&one.node)["moving_out"].as_bool(), Some(false));
}
