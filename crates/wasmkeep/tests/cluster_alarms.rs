//! Alarms in a cluster (ADR 0009), through real processes on a shared
//! folder bucket: owners list each alarm in the bucket's index before the
//! upload that carries it, and every node sweeps the index, so an alarm
//! fires when the node that set it is gone.
//!
//! Three `wasmkeep serve` nodes with short lease timings and a sweep every
//! 300 ms. The `reminder` example records each run of its alarm with the
//! time it was due and the time it ran (`GET …/fired`). No test asserts how
//! long anything takes: waits poll with a generous bound.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

mod common;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::cluster::{self, REPLICATED, send};
use common::load::{Cluster, Member, Store};

/// The nodes sweep often, so that tests wait seconds, not minutes.
const SETTINGS: &str = "alarm_sweep_ms = 300\n";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn wait_for(what: &str, f: impl FnMut() -> bool) {
    cluster::wait_for(what, 120, 100, f)
}

fn reminder(name: &str) -> String {
    format!("/v1/demo/examples/reminder/{name}")
}

/// Sets `name`'s alarm for `at_ms` through `port`; answered once the
/// bucket holds it. Returns the node that ran the request.
fn set(port: u16, name: &str, at_ms: u64) -> String {
    let a = send(
        port,
        "POST",
        &format!("{}/set?at_ms={at_ms}", reminder(name)),
        &[REPLICATED],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    a.node.expect("the answer names its node")
}

/// Every run of `name`'s alarm, as `(due_ms, fired_ms)`, read through
/// `port`, and the node that answered.
fn fired(port: u16, name: &str) -> (Vec<(u64, u64)>, Option<String>) {
    let a = send(port, "GET", &format!("{}/fired", reminder(name)), &[]);
    if a.status != 200 {
        return (Vec::new(), None);
    }
    let runs = a.body["fired"]
        .as_array()
        .map(|v| {
            v.iter()
                .map(|r| {
                    (
                        r["due_ms"].as_u64().unwrap(),
                        r["fired_ms"].as_u64().unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    (runs, a.node)
}

/// The index entries in the folder bucket (relative to `alarms/` roots).
fn entries(bucket: &Path) -> Vec<String> {
    cluster::folder_keys(&bucket.join("state/demo/examples/_alarms"))
}

fn metric(m: &Member, name: &str) -> u64 {
    let (_, text) = m.node.get("/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Alarms set through one node, which is SIGKILLed before they are due,
/// fire on the others: each exactly once, none early. While they are
/// pending the index lists one entry per alarm; once they ran it is empty.
#[test]
fn alarms_of_a_killed_node_fire_on_the_others_once_and_not_early() {
    const ALARMS: usize = 12;
    let c = Cluster::with_settings(Store::Folder, 60_000, SETTINGS);
    let mut members = c.start_three();
    let due = now_ms() + 3_000;
    for i in 0..ALARMS {
        let ran_on = set(members[0].port, &format!("orphan-{i}"), due);
        assert_eq!(ran_on, members[0].id, "the first request takes the actor");
    }
    let listed = entries(&c.folder());
    assert_eq!(listed.len(), ALARMS, "one entry per alarm: {listed:?}");
    assert!(
        listed.iter().all(|k| k.contains(".t/")),
        "tagged: {listed:?}"
    );
    // Any node shows the bucket's index.
    let (code, shown) = members[1]
        .node
        .json("GET", "/admin/v1/alarms/demo?limit=100", b"");
    assert_eq!(code, 200, "{shown}");
    let index = shown["index"]
        .as_array()
        .expect("a cluster node shows the index");
    assert_eq!(index.len(), ALARMS, "{shown}");
    for e in index {
        assert_eq!(
            (&e["app"], &e["class"]),
            (&"examples".into(), &"reminder".into())
        );
        assert_eq!(e["due_ms"], due);
        assert!(e["generation"].as_u64().is_some_and(|g| g >= 1), "{e}");
        assert!(e["name"].as_str().unwrap().starts_with("orphan-"));
    }
    // The owner's database names its entry (shown through another node).
    let shown = send(
        members[1].port,
        "GET",
        "/admin/v1/actors/demo/examples/reminder/orphan-0",
        &[],
    );
    assert_eq!(shown.status, 200, "{}", shown.body);
    let named = shown.body["alarm_indexed"].as_str().unwrap_or_default();
    assert!(
        named.starts_with(&format!("app:{due:015}/")),
        "{}",
        shown.body
    );
    members[0].node.kill();

    let survivors = [&members[1], &members[2]];
    // Nothing asks for the actors (a request would take one and fire its
    // alarm from the restored database): only the sweep can reach them.
    // Each run's upload removes its entry.
    wait_for("every alarm to run and its entry to go", || {
        entries(&c.folder()).is_empty()
    });
    let swept: u64 = survivors
        .iter()
        .map(|m| metric(m, "wasmkeep_alarm_sweep_alarms_run_total"))
        .sum();
    assert_eq!(swept, ALARMS as u64, "the sweeps ran every orphaned alarm");
    for i in 0..ALARMS {
        let name = format!("orphan-{i}");
        let (runs, node) = fired(survivors[i % 2].port, &name);
        assert_eq!(runs.len(), 1, "{name} ran exactly once: {runs:?}");
        let (due_ms, fired_ms) = runs[0];
        assert_eq!(due_ms, due);
        assert!(fired_ms >= due_ms, "{name} fired early: {runs:?}");
        assert_ne!(node.as_deref(), Some(members[0].id.as_str()));
    }
}

/// A deleted actor's alarm never runs: the delete removes its entry, and an
/// entry left behind for it (as a crash between an entry's PUT and its
/// upload leaves one) is removed by a sweep without running anything or
/// bringing the actor back.
#[test]
fn the_alarm_of_a_deleted_actor_never_runs() {
    let c = Cluster::with_settings(Store::Folder, 60_000, SETTINGS);
    let mut members = c.start_three();
    let due = now_ms() + 2_000;
    set(members[0].port, "gone", due);
    let listed = entries(&c.folder());
    assert_eq!(listed.len(), 1, "{listed:?}");
    // A copy of the entry under another tag: a leftover no state names.
    let key = c
        .folder()
        .join("state/demo/examples/_alarms")
        .join(&listed[0]);
    let leftover = key.with_file_name("00000000000000000001-00000000000000aa");
    std::fs::write(&leftover, b"").unwrap();

    let admin = "/admin/v1/actors/demo/examples/reminder/gone";
    let deleted = send(members[0].port, "DELETE", admin, &[]);
    assert_eq!(deleted.status, 200, "{}", deleted.body);
    assert_eq!(deleted.body["deleted"], true);
    assert!(!key.exists(), "the delete removed the entry it named");
    members[0].node.kill();

    wait_for("the leftover entry to be removed", || !leftover.exists());
    std::thread::sleep(Duration::from_secs(1));
    for m in &members[1..] {
        let shown = send(m.port, "GET", admin, &[]);
        assert_eq!(shown.status, 404, "the actor stays deleted: {}", shown.body);
    }
    let removed: u64 = members[1..]
        .iter()
        .map(|m| metric(m, "wasmkeep_alarm_sweep_stale_removed_total"))
        .sum();
    assert!(removed >= 1);
    let run: u64 = members[1..]
        .iter()
        .map(|m| metric(m, "wasmkeep_alarm_sweep_alarms_run_total"))
        .sum();
    assert_eq!(run, 0, "nothing ran for the deleted actor");
}

/// Every node restarts in turn (a clean stop hands its actors over) while
/// alarms come due: every alarm fires, once.
#[test]
fn a_rolling_restart_loses_no_alarm() {
    const ALARMS: usize = 18;
    let c = Cluster::with_settings(Store::Folder, 60_000, SETTINGS);
    let mut members = c.start_three();
    let start = now_ms();
    // Spread over the three nodes and over the restarts.
    for i in 0..ALARMS {
        let due = start + 2_000 + 500 * i as u64;
        set(members[i % 3].port, &format!("roll-{i}"), due);
    }
    for m in members.iter_mut() {
        assert!(m.node.stop().success());
        let (data, port, id) = (m.data.clone(), m.port, m.id.clone());
        let again = c.start_on(&data, port, None);
        assert_eq!(again.id, id);
        *m = again;
    }
    wait_for("every alarm to run and its entry to go", || {
        entries(&c.folder()).is_empty()
    });
    std::thread::sleep(Duration::from_secs(2));
    for i in 0..ALARMS {
        let name = format!("roll-{i}");
        let (runs, _) = fired(members[0].port, &name);
        assert_eq!(runs.len(), 1, "{name}: {runs:?}");
        assert!(runs[0].1 >= runs[0].0, "{name} fired early: {runs:?}");
    }
}

/// R4: a node that ran on its own joins the cluster with an actor whose
/// alarm is pending. The first time it takes the actor, it lists the alarm
/// before the actor's first upload; killed before the alarm is due, the
/// alarm fires on another node.
#[test]
fn an_alarm_from_single_node_data_is_listed_before_its_first_upload() {
    let c = Cluster::with_settings(Store::Folder, 60_000, SETTINGS);
    let data = c.folder().with_file_name("joining");
    let port = cluster::free_port();
    let due = now_ms() + 8_000;
    {
        let mut alone = common::Node::start(&data, &["--examples"]);
        let (code, body) = alone.post(&format!("{}/set?at_ms={due}", reminder("alone")), b"");
        assert_eq!(code, 200, "{body}");
        assert!(alone.stop().success());
    }
    let joining = c.start_on(&data, port, None);
    let mut others = vec![c.start("b"), c.start("c")];
    assert!(
        entries(&c.folder()).is_empty(),
        "nothing listed before the take"
    );
    // The first request takes the actor here and uploads it, replicated.
    let a = send(
        port,
        "GET",
        &format!("{}/alarm", reminder("alone")),
        &[REPLICATED],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["alarm"], due);
    assert_eq!(entries(&c.folder()).len(), 1, "listed before the upload");
    let mut joining = joining;
    joining.node.kill();
    wait_for("the joined node's alarm to run elsewhere", || {
        entries(&c.folder()).is_empty()
    });
    let (runs, node) = fired(others[0].port, "alone");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].0, due);
    assert_ne!(node.as_deref(), Some(joining.id.as_str()));
    others.clear();
}

/// The alarm a bucket's state names, read through `port` (a request
/// restores the actor from the bucket on a node that did not have it).
fn alarm_of(port: u16, name: &str) -> Option<u64> {
    let a = send(port, "GET", &format!("{}/alarm", reminder(name)), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    a.body["alarm"].as_u64()
}

/// The due times of the index's entries for `name`.
fn listed_dues(bucket: &Path, name: &str) -> Vec<u64> {
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    entries(bucket)
        .iter()
        .filter(|k| k.contains(&format!("/{hex}/")))
        .map(|k| k[..15].parse().unwrap())
        .collect()
}

/// A new actor whose first upload failed because its entry could not be
/// listed is given up with its alarm committed locally; its next opening
/// (the bucket still has nothing for it) sets that file aside (ADR 0082:
/// the client was told the write failed), and the client's retry lists
/// the alarm under a fresh key before the first upload, rather than an
/// entry the failed database recorded, which was never written. Then the
/// node is killed and the alarm runs elsewhere.
#[test]
fn a_first_upload_after_a_failed_listing_lists_the_alarm_afresh() {
    let c = Cluster::with_settings(Store::Folder, 60_000, SETTINGS);
    let mut members = c.start_three();
    // A file where the app's index folder goes: every PUT below it fails.
    let index = c.folder().join("state/demo/examples/_alarms");
    std::fs::create_dir_all(index.parent().unwrap()).unwrap();
    std::fs::write(&index, b"in the way").unwrap();
    let due = now_ms() + 6_000;
    let failed = send(
        members[0].port,
        "POST",
        &format!("{}/set?at_ms={due}", reminder("afresh")),
        &[REPLICATED],
    );
    assert_eq!(failed.status, 503, "{}", failed.body);
    assert_eq!(failed.body["error"]["code"], "replication_failed");
    std::fs::remove_file(&index).unwrap();
    // The next request reopens the actor: the failed write is not in it.
    assert_eq!(alarm_of(members[0].port, "afresh"), None);
    assert!(listed_dues(&c.folder(), "afresh").is_empty());
    set(members[0].port, "afresh", due);
    assert_eq!(listed_dues(&c.folder(), "afresh"), vec![due]);
    members[0].node.kill();
    wait_for("the alarm to run elsewhere", || {
        entries(&c.folder()).is_empty()
    });
    let (runs, _) = fired(members[1].port, "afresh");
    assert_eq!(runs.len(), 1, "{runs:?}");
}

/// A sweep's delivery of an entry whose alarm moved while the move is not
/// in the bucket yet (plain replies upload once a minute here) waits for
/// the upload before it removes the entry: what the bucket's state names
/// is listed whenever the node is killed.
#[test]
fn a_stale_entry_goes_only_once_the_state_that_replaced_it_is_in_the_bucket() {
    let c = Cluster::with_settings(
        Store::Folder,
        60_000,
        &format!("{SETTINGS}replica_upload_interval_ms = 60000\n"),
    );
    let mut members = c.start_three();
    let first = now_ms() + 1_000;
    set(members[0].port, "moved", first);
    assert_eq!(listed_dues(&c.folder(), "moved"), vec![first]);
    // Moved far ahead, answered after the local commit only.
    let later = now_ms() + 3_600_000;
    let moved = send(
        members[0].port,
        "POST",
        &format!("{}/set?at_ms={later}", reminder("moved")),
        &[("wasmkeep-durability", "local")],
    );
    assert_eq!(moved.status, 200, "{}", moved.body);
    // The sweep finds the first entry overdue and delivers it to its owner.
    wait_for("the first entry to go", || {
        !listed_dues(&c.folder(), "moved").contains(&first)
    });
    members[0].node.kill();
    let named = alarm_of(members[1].port, "moved");
    assert_eq!(named, Some(later), "the move reached the bucket first");
    assert_eq!(listed_dues(&c.folder(), "moved"), vec![later]);
}

/// ADR 0009's tenant-wide index (written before the app was part of the
/// address) is still swept: entries there no actor's state names, tagged
/// and untagged, are delivered to the app that has the class and removed
/// without running anything; the actor's own entry stays.
#[test]
fn stale_entries_of_the_tenant_wide_index_are_swept_too() {
    let c = Cluster::with_settings(Store::Folder, 60_000, SETTINGS);
    let members = c.start_three();
    let later = now_ms() + 3_600_000;
    set(members[0].port, "legacy", later);
    // `--examples` deploys the class in TypeScript too (`examples-ts`), so
    // the tenant-wide entries go to both apps. The actor exists in each,
    // with an alarm of its own, so neither names them. (In an app where
    // the actor never existed they would stay: R2's empty-bucket clause
    // keeps every entry of an actor the bucket has nothing for.)
    let ts = send(
        members[0].port,
        "POST",
        &format!("/v1/demo/examples-ts/reminder/legacy/set?at_ms={later}"),
        &[REPLICATED],
    );
    assert_eq!(ts.status, 200, "{}", ts.body);
    let hex: String = "legacy".bytes().map(|b| format!("{b:02x}")).collect();
    let past = now_ms() - 60_000;
    let root = c.folder().join("alarms/demo");
    let tagged = root
        .join(format!("{past:015}/reminder.t/{hex}"))
        .join("00000000000000000001-00000000000000ab");
    let untagged = root.join(format!("{:015}/reminder/{hex}", past + 1));
    for f in [&tagged, &untagged] {
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, b"").unwrap();
    }
    // Any node shows them, as tenant-wide (`app` null).
    let (code, shown) = members[1]
        .node
        .json("GET", "/admin/v1/alarms/demo?limit=100", b"");
    assert_eq!(code, 200, "{shown}");
    let tenant_wide = shown["index"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["app"].is_null())
        .count();
    assert_eq!(tenant_wide, 2, "{shown}");
    wait_for("the tenant-wide entries to be removed", || {
        !tagged.exists() && !untagged.exists()
    });
    assert_eq!(listed_dues(&c.folder(), "legacy"), vec![later]);
    let (runs, _) = fired(members[0].port, "legacy");
    assert!(runs.is_empty(), "nothing ran: {runs:?}");
    let removed: u64 = members
        .iter()
        .map(|m| metric(m, "wasmkeep_alarm_sweep_stale_removed_total"))
        .sum();
    assert!(removed >= 2, "{removed}");
}

/// The bucket's index as a node shows it (`/admin/v1/alarms`): due times
/// of the app's entries.
fn shown_dues(m: &Member) -> Vec<u64> {
    let (code, shown) = m.node.json("GET", "/admin/v1/alarms/demo?limit=1000", b"");
    assert_eq!(code, 200, "{shown}");
    shown["index"]
        .as_array()
        .expect("a cluster node shows the index")
        .iter()
        .filter(|e| e["app"] == "examples")
        .map(|e| e["due_ms"].as_u64().unwrap())
        .collect()
}

/// The same on moto, an S3-compatible server (listing with start-after,
/// DELETE): alarms set through a node SIGKILLed before they are due run on
/// the others, once each and none early, and the index empties. Only one
/// node takes each actor here (the sweep shards them, and no entry stays
/// long enough to be anyone's), so moto's lock-free conditional PUT is not
/// raced.
#[test]
fn alarms_of_a_killed_node_fire_on_the_others_on_moto() {
    const ALARMS: usize = 6;
    let c = Cluster::with_settings(Store::Moto, 60_000, SETTINGS);
    let mut members = c.start_three();
    let due = now_ms() + 3_000;
    for i in 0..ALARMS {
        set(members[0].port, &format!("s3-{i}"), due);
    }
    assert_eq!(shown_dues(&members[1]), vec![due; ALARMS]);
    members[0].node.kill();
    wait_for("every alarm to run and its entry to go", || {
        shown_dues(&members[1]).is_empty()
    });
    for i in 0..ALARMS {
        let (runs, node) = fired(members[1 + i % 2].port, &format!("s3-{i}"));
        assert_eq!(runs.len(), 1, "s3-{i}: {runs:?}");
        assert!(runs[0].1 >= due, "s3-{i} fired early: {runs:?}");
        assert_ne!(node.as_deref(), Some(members[0].id.as_str()));
    }
}
