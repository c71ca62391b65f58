//! `wasmkeep serve --test-clock` (issue 35): a node whose clock stands
//! still until `POST /admin/v1/test/clock` moves it, for test kits outside
//! the process (the JavaScript one drives it). Alarms run when the clock
//! reaches them, not before and not on their own; the mode listens on
//! loopback only; a node on the real clock has no such route.

mod common;

use std::process::Command;

use common::Node;

const START_MS: u64 = 1_800_000_000_000;

#[test]
fn alarms_run_when_the_test_moves_the_clock_and_not_before() {
    let tmp = tempfile::tempdir().unwrap();
    let start = START_MS.to_string();
    let node = Node::start(tmp.path(), &["--examples", "--test-clock", &start]);
    let (s, v) = node.json("GET", "/admin/v1/test/clock", b"");
    assert_eq!((s, v["now_ms"].as_u64()), (200, Some(START_MS)), "{v}");
    for app in ["examples", "examples-ts"] {
        let base = format!("/v1/demo/{app}/reminder/r");
        let due = START_MS + 60_000;
        let (s, v) = node.json("POST", &format!("{base}/set?at_ms={due}"), b"");
        assert_eq!(s, 200, "{app}: {v}");
    }
    // Real time passes; the node's does not.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (s, v) = node.json("POST", "/admin/v1/test/clock?advance_ms=59999", b"");
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["alarms_ran"], 0, "{v}");
    assert_eq!(v["now_ms"].as_u64(), Some(START_MS + 59_999));
    for app in ["examples", "examples-ts"] {
        let (_, fired) = node.json("GET", &format!("/v1/demo/{app}/reminder/r/fired"), b"");
        assert_eq!(
            fired["fired"].as_array().unwrap().len(),
            0,
            "{app}: early: {fired}"
        );
    }
    let (s, v) = node.json("POST", "/admin/v1/test/clock?advance_ms=1", b"");
    assert_eq!((s, v["alarms_ran"].as_u64()), (200, Some(2)), "{v}");
    for app in ["examples", "examples-ts"] {
        let (_, fired) = node.json("GET", &format!("/v1/demo/{app}/reminder/r/fired"), b"");
        let runs = fired["fired"].as_array().unwrap();
        assert_eq!(runs.len(), 1, "{app}: {fired}");
        assert_eq!(
            runs[0]["fired_ms"].as_u64(),
            Some(START_MS + 60_000),
            "{app}: {fired}"
        );
    }
    // Time moves forward only, and by a bounded step.
    let (s, v) = node.json(
        "POST",
        &format!("/admin/v1/test/clock?to_ms={START_MS}"),
        b"",
    );
    assert_eq!((s, common::code(&v)), (400, "bad_request"), "{v}");
    let (s, v) = node.json(
        "POST",
        "/admin/v1/test/clock?advance_ms=999999999999999",
        b"",
    );
    assert_eq!((s, common::code(&v)), (400, "bad_request"), "{v}");
}

#[test]
fn a_node_on_the_real_clock_has_no_test_clock_and_test_mode_stays_on_loopback() {
    let tmp = tempfile::tempdir().unwrap();
    let node = Node::start(tmp.path(), &[]);
    let (s, v) = node.json("POST", "/admin/v1/test/clock?advance_ms=1", b"");
    assert_eq!((s, common::code(&v)), (404, "not_test_mode"), "{v}");
    let out = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args([
            "serve",
            "--insecure",
            "--listen",
            "0.0.0.0:0",
            "--test-clock",
            "1",
        ])
        .arg("--data")
        .arg(tmp.path().join("other"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--test-clock") && err.contains("loopback"),
        "{err}"
    );
}
