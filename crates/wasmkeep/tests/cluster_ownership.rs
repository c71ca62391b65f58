//! Actors' ownership in a cluster (ADR 0020), through real processes on a
//! shared folder bucket: two `wasmkeep serve` nodes, each with its own data
//! folder and port. An actor created through one node is served through
//! the other by forwarding (one hop, the answer names the node that ran
//! it); a forwarded request without the cluster secret is refused; when
//! the owner is killed the other node takes the actor over with every
//! acknowledged write; an idle actor is released and taken by the other
//! node while its first owner lives.
//!
//! Lease timings are short (set through the configuration file); no test
//! asserts how long anything takes: waits poll with a generous bound.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

mod common;

use common::Node;
use common::cluster::{self, REPLICATED, counter, increment, send, value};
use common::load::{Cluster, Store, TOKEN};

/// Waits until `f` holds (a bound of 120 s for a hung cluster).
fn wait_for(what: &str, f: impl FnMut() -> bool) {
    cluster::wait_for(what, 120, 50, f)
}

fn metric(node: &Node, name: &str) -> u64 {
    let (_, text) = node.get("/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// An actor created through A is served through B: B forwards (one hop)
/// and the answer names A, with A's counter; A's own requests run there.
/// A forwarded request with a wrong (or no) cluster secret is refused.
#[test]
fn requests_reach_the_owner_in_one_hop_and_forwards_need_the_secret() {
    let c = Cluster::new(Store::Folder);
    let a = c.start("a");
    let b = c.start("b");
    assert_ne!(a.id, b.id);

    let first = increment(a.port, "fwd");
    assert_eq!(counter(&first), 1);
    assert_eq!(first.node.as_deref(), Some(a.id.as_str()));

    let via_b = increment(b.port, "fwd");
    assert_eq!(counter(&via_b), 2, "B forwards to the owner");
    assert_eq!(via_b.node.as_deref(), Some(a.id.as_str()), "run on A");
    let read = value(b.port, "fwd");
    assert_eq!(counter(&read), 2);
    assert_eq!(read.node.as_deref(), Some(a.id.as_str()));
    assert!(metric(&b.node, "wasmkeep_cluster_forwards_total") >= 2);
    assert_eq!(metric(&a.node, "wasmkeep_cluster_forwards_total"), 0);
    // An actor first asked for through B is B's.
    let other = increment(b.port, "mine-b");
    assert_eq!(other.node.as_deref(), Some(b.id.as_str()));
    let held = |n: &Node| n.json("GET", "/admin/v1/node", b"").1["cluster"]["held_actors"].clone();
    assert_eq!(held(&a.node), 1);
    assert_eq!(held(&b.node), 1);

    // Forwarded requests must carry a node's signature: not the secret
    // itself, not a signature with another secret, not one for another
    // node, not the same one twice.
    let path = "/v1/demo/examples/counter/fwd/increment";
    let wrong = cluster::node_headers("wrong", "POST", a.port, path);
    let for_b = cluster::node_headers(TOKEN, "POST", b.port, path);
    for headers in [
        vec![
            ("x-wasmkeep-forwarded", "1"),
            ("x-wasmkeep-cluster-token", TOKEN),
        ],
        vec![("x-wasmkeep-forwarded", "1")],
        cluster::as_pairs(&wrong),
        cluster::as_pairs(&for_b),
    ] {
        let refused = send(a.port, "POST", path, &headers);
        assert_eq!(refused.status, 403, "{}", refused.body);
        assert_eq!(refused.body["error"]["code"], "node_signature_invalid");
    }
    assert_eq!(counter(&value(a.port, "fwd")), 2, "nothing ran");

    // A signed forwarded request reaching a node that does not own the
    // actor is not forwarded again.
    let to_b = cluster::node_headers(TOKEN, "POST", b.port, path);
    let not_owner = send(b.port, "POST", path, &cluster::as_pairs(&to_b));
    assert_eq!(not_owner.status, 503, "{}", not_owner.body);
    assert_eq!(not_owner.body["error"]["code"], "not_owner");
    let to_a = cluster::node_headers(TOKEN, "POST", a.port, path);
    let at_owner = send(a.port, "POST", path, &cluster::as_pairs(&to_a));
    assert_eq!(counter(&at_owner), 3);
    // The same signature twice is a replay.
    let replayed = send(a.port, "POST", path, &cluster::as_pairs(&to_a));
    assert_eq!(replayed.status, 403, "{}", replayed.body);
    assert_eq!(replayed.body["error"]["code"], "node_signature_invalid");

    // SIGTERM: the owner releases its holds (then its lease).
    let mut a = a;
    assert!(a.node.stop().success());
    let holds = c.folder().join("state/demo/examples/counter/667764/hold");
    let mut records: Vec<(String, String)> = std::fs::read_dir(&holds)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let body = std::fs::read_to_string(e.path()).unwrap();
            (e.file_name().into_string().unwrap(), body)
        })
        .collect();
    records.sort();
    let (_, last) = records.last().unwrap();
    assert!(
        last.starts_with(&format!("released {} ", a.id)),
        "{records:?}"
    );
    let after = increment(b.port, "fwd");
    assert_eq!(counter(&after), 4);
    assert_eq!(after.node.as_deref(), Some(b.id.as_str()));
}

/// SIGKILL the owner: requests through the other node succeed once its
/// lease has lapsed (fenced, taken over), and the counter continues from
/// its last acknowledged (replicated) value.
#[test]
fn a_killed_owners_actor_is_taken_over_with_every_acknowledged_write() {
    let c = Cluster::new(Store::Folder);
    let mut a = c.start("a");
    let b = c.start("b");
    let mut acknowledged = 0;
    for _ in 0..5 {
        acknowledged = counter(&increment(a.port, "dies"));
    }
    assert_eq!(counter(&value(b.port, "dies")), acknowledged);

    a.node.kill();
    let mut taken = None;
    wait_for("B to take the dead node's actor", || {
        let r = increment(b.port, "dies");
        if r.status == 200 {
            taken = Some(r);
            return true;
        }
        false
    });
    let taken = taken.unwrap();
    assert_eq!(taken.node.as_deref(), Some(b.id.as_str()));
    assert_eq!(
        counter(&taken),
        acknowledged + 1,
        "no acknowledged write lost"
    );
    assert!(metric(&b.node, "wasmkeep_cluster_takeovers_total") >= 1);
    assert!(metric(&b.node, "wasmkeep_cluster_fences_total") >= 1);

    // A restarts (a new epoch, its old local copy behind the bucket): its
    // requests for the actor go to B and see B's state.
    let a2 = c.start_on(&a.data, a.port, None);
    let seen = value(a2.port, "dies");
    assert_eq!(counter(&seen), acknowledged + 1);
    assert_eq!(seen.node.as_deref(), Some(b.id.as_str()));
}

/// An idle actor is released by its owner (alive), and the other node takes
/// it at once, long before the owner's lease could lapse.
#[test]
fn an_idle_actor_is_released_and_taken_by_another_live_node() {
    let c = Cluster::with_idle(Store::Folder, 500);
    let a = c.start("a");
    let b = c.start("b");
    let mut last = 0;
    for _ in 0..3 {
        last = counter(&increment(a.port, "idle"));
    }
    wait_for("A to release the idle actor", || {
        metric(&a.node, "wasmkeep_cluster_releases_total") >= 1
    });
    let r = increment(b.port, "idle");
    assert_eq!(counter(&r), last + 1);
    assert_eq!(r.node.as_deref(), Some(b.id.as_str()), "B took it");
    assert_eq!(metric(&b.node, "wasmkeep_cluster_fences_total"), 0);
    assert_eq!(
        a.node.json("GET", "/admin/v1/node", b"").1["cluster"]["acting"],
        true,
        "A is alive and acting"
    );
    // A's next request goes to B.
    let via_a = value(a.port, "idle");
    assert_eq!(counter(&via_a), last + 1);
    assert_eq!(via_a.node.as_deref(), Some(b.id.as_str()));
}

/// An alarm outlives a restart of its node: SIGTERM releases the actor's
/// hold, and after the restart the alarm (in the node's timer from its data
/// folder) makes the node take the actor again and run it, with no request
/// for the actor meanwhile; the other node, which never held it, runs
/// nothing.
#[test]
fn a_due_alarm_makes_its_node_take_the_actor_after_a_restart() {
    let c = Cluster::new(Store::Folder);
    let mut a = c.start("a");
    let b = c.start("b");
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 4_000;
    let set = send(
        a.port,
        "POST",
        &format!("/v1/demo/examples/reminder/r/set?at_ms={at}"),
        &[REPLICATED],
    );
    assert_eq!(set.status, 200, "{}", set.body);
    assert!(a.node.stop().success());
    let a2 = c.start_on(&a.data, a.port, None);
    wait_for("the restarted node to run the alarm", || {
        metric(&a2.node, "wasmkeep_alarms_fired_total") >= 1
    });
    assert!(metric(&a2.node, "wasmkeep_cluster_takes_total") >= 1);
    assert_eq!(metric(&b.node, "wasmkeep_alarms_fired_total"), 0);
    let fired = send(a2.port, "GET", "/v1/demo/examples/reminder/r/fired", &[]);
    assert_eq!(fired.status, 200, "{}", fired.body);
    assert_eq!(fired.node.as_deref(), Some(a2.id.as_str()));
    assert!(
        fired.body.to_string().contains(&at.to_string()),
        "{}",
        fired.body
    );
}

/// The admin routes about one actor (show, SQL inspection, delete) run on
/// the actor's owner, as its requests do: asked through a node that does
/// not hold it, they are forwarded, so they read and change the one open
/// copy rather than a node's stale or missing local file.
#[test]
fn admin_routes_about_an_actor_run_on_its_owner() {
    let c = Cluster::new(Store::Folder);
    let a = c.start("a");
    let b = c.start("b");
    for n in 1..=2 {
        assert_eq!(counter(&increment(a.port, "adm")), n);
    }
    let admin = "/admin/v1/actors/demo/examples/counter/adm";

    let shown = send(b.port, "GET", admin, &[]);
    assert_eq!(shown.status, 200, "{}", shown.body);
    assert_eq!(
        shown.node.as_deref(),
        Some(a.id.as_str()),
        "shown by the owner"
    );

    let (status, rows) = b
        .node
        .json("POST", &format!("{admin}/sql"), b"SELECT n FROM counter");
    assert_eq!(status, 200, "{rows}");
    assert_eq!(rows["rows"], serde_json::json!([[2]]), "the owner's copy");

    let deleted = send(b.port, "DELETE", admin, &[]);
    assert_eq!(deleted.status, 200, "{}", deleted.body);
    assert_eq!(deleted.node.as_deref(), Some(a.id.as_str()));
    assert_eq!(deleted.body["deleted"], true, "{}", deleted.body);
    let again = increment(b.port, "adm");
    assert_eq!(counter(&again), 1, "the owner's copy was deleted");
    assert_eq!(again.node.as_deref(), Some(a.id.as_str()));

    // Forwarded admin requests need a node's signature too.
    let wrong = cluster::node_headers("wrong", "GET", a.port, admin);
    let refused = send(a.port, "GET", admin, &cluster::as_pairs(&wrong));
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(refused.body["error"]["code"], "node_signature_invalid");
}
