//! Alarms on a real node with the real clock: delivery after a SIGKILL and
//! restart, and never before the due time.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::Node;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn alarms_survive_sigkill_and_fire_after_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let mut node = Node::start(tmp.path(), &["--examples"]);
    let due = now_ms() + 3_000;
    for i in 0..50 {
        let (s, v) = node.json(
            "POST",
            &format!("/v1/demo/examples/reminder/r{i}/set?at_ms={due}"),
            b"",
        );
        assert_eq!(s, 200, "{v}");
    }
    node.kill();
    // Down across the due time.
    let wait = due.saturating_sub(now_ms()) + 1_000;
    std::thread::sleep(Duration::from_millis(wait));
    let node = Node::start(tmp.path(), &["--examples"]);
    let deadline = now_ms() + 20_000;
    let mut missing: Vec<usize> = (0..50).collect();
    while !missing.is_empty() && now_ms() < deadline {
        missing.retain(|i| {
            let (_, v) = node.json(
                "GET",
                &format!("/v1/demo/examples/reminder/r{i}/fired"),
                b"",
            );
            v["fired"].as_array().map(|a| a.is_empty()).unwrap_or(true)
        });
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        missing.is_empty(),
        "alarms lost across the restart: {missing:?}"
    );
    for i in 0..50 {
        let (_, v) = node.json(
            "GET",
            &format!("/v1/demo/examples/reminder/r{i}/fired"),
            b"",
        );
        let f = &v["fired"].as_array().unwrap();
        assert_eq!(f.len(), 1, "r{i} fired {} times", f.len());
        assert!(f[0]["fired_ms"].as_u64().unwrap() >= due);
    }
}

#[test]
fn alarms_never_fire_before_they_are_due_and_show_in_the_admin_api() {
    let tmp = tempfile::tempdir().unwrap();
    let node = Node::start(tmp.path(), &["--examples"]);
    // Far enough ahead that none is due before all are set and listed on a
    // loaded machine (CI runs other tests beside this one).
    let base = now_ms() + 6_000;
    for i in 0..20u64 {
        let at = base + i * 50;
        node.post(
            &format!("/v1/demo/examples/reminder/e{i}/set?at_ms={at}"),
            b"",
        );
    }
    let (s, v) = node.json("GET", "/admin/v1/alarms/demo?limit=100", b"");
    assert_eq!(s, 200);
    let listed: Vec<u64> = v["alarms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["alarm_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(listed.len(), 20);
    assert!(
        listed.windows(2).all(|w| w[0] <= w[1]),
        "not in due order: {listed:?}"
    );
    let (_, info) = node.json("GET", "/admin/v1/actors/demo/examples/reminder/e3", b"");
    assert_eq!(info["alarm_ms"], base + 150);
    // Open (it just set its alarm): its connection's memory is shown.
    assert_eq!(info["active"], true, "{info}");
    assert!(
        info["sqlite_memory"]["cache_bytes"].as_u64().unwrap() > 0,
        "{info}"
    );
    let last_due = base + 19 * 50;
    std::thread::sleep(Duration::from_millis(
        last_due.saturating_sub(now_ms()) + 2_500,
    ));
    for i in 0..20u64 {
        let (_, v) = node.json(
            "GET",
            &format!("/v1/demo/examples/reminder/e{i}/fired"),
            b"",
        );
        let f = v["fired"].as_array().unwrap();
        assert_eq!(f.len(), 1, "e{i}");
        assert!(
            f[0]["fired_ms"].as_u64().unwrap() >= base + i * 50,
            "e{i} fired early"
        );
    }
}
