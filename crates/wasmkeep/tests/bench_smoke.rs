//! `wasmkeep bench` end to end, tiny: W1 and W3 for about a second against
//! nodes the command starts from this (debug) binary. It checks that the
//! command runs, passes its own correctness checks and writes the JSON it
//! promises; it asserts nothing about speed.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn bench_runs_w1_and_w3_and_writes_json() {
    let tmp = tempfile::tempdir().unwrap();
    let (stdout, v) = bench(
        &tmp,
        "--workloads w1,w3 --runs 1 --warmup-s 0 --measure-s 1 \
         --actors 20 --connections 4 --cold-actors 20",
    );
    assert!(stdout.contains("SAME machine"), "{stdout}");
    assert_eq!(v["ok"], true, "{v:#}");
    assert_eq!(v["generator"]["same_machine_as_node"], true);
    let runs = v["runs"].as_array().unwrap();
    let w1 = runs
        .iter()
        .find(|r| r["workload"] == "w1")
        .expect("a w1 run");
    for f in ["requests_per_s", "p50_ms", "p99_ms", "requests_ok"] {
        assert!(w1["figures"][f].as_f64().is_some(), "w1 lacks {f}: {w1:#}");
    }
    assert!(w1["figures"]["requests_ok"].as_f64().unwrap() > 0.0);
    assert_eq!(w1["figures"]["lost_writes"], 0.0);
    assert_eq!(w1["durability"], "fsync");
    let w3 = runs
        .iter()
        .find(|r| r["workload"] == "w3")
        .expect("a w3 run");
    for f in ["p50_ms", "p99_ms"] {
        assert!(w3["figures"][f].as_f64().is_some(), "w3 lacks {f}: {w3:#}");
    }
    every_run_passed(runs);
    let summary = v["summary"].as_array().unwrap();
    assert!(
        summary
            .iter()
            .any(|s| s["workload"] == "w1" && s["figure"] == "requests_per_s"),
        "{v:#}"
    );
}

/// The cluster workloads, tiny: W6 (forwarded requests) and W5-kill
/// (SIGKILL of a node, takeover) on three nodes each, with short leases so
/// that the takeover comes within seconds. It checks that both run, pass
/// their own checks (no lost or doubly acknowledged write, every dead
/// node's actor answered again) and report their figures; it asserts no
/// timing.
#[test]
fn bench_runs_the_cluster_workloads() {
    let tmp = tempfile::tempdir().unwrap();
    let (stdout, v) = bench(
        &tmp,
        "--workloads w6,w5-kill --runs 1 --warmup-s 0.5 --measure-s 1 --actors 12 \
         --connections 6 --lease-period-ms 1500 --lease-grace-ms 1000",
    );
    assert_eq!(v["ok"], true, "{v:#}");
    assert_eq!(v["settings"]["lease_period_ms"], 1500);
    let runs = v["runs"].as_array().unwrap();
    let run = |w: &str| {
        runs.iter()
            .find(|r| r["workload"] == w)
            .unwrap_or_else(|| panic!("a {w} run: {v:#}"))
    };
    let w6 = run("w6");
    for f in [
        "owner_requests_per_s",
        "forwarded_requests_per_s",
        "ratio_requests_per_s",
        "owner_p50_ms",
        "owner_p99_ms",
        "forwarded_p50_ms",
        "forwarded_p99_ms",
        "ratio_p99",
    ] {
        assert!(w6["figures"][f].as_f64().is_some(), "w6 lacks {f}: {w6:#}");
    }
    assert_eq!(w6["figures"]["lost_writes"], 0.0, "{w6:#}");
    assert_eq!(w6["figures"]["owner_moved"], 0.0, "{w6:#}");
    assert!(w6["figures"]["requests_ok"].as_f64().unwrap() > 0.0);
    let kill = run("w5-kill");
    for f in [
        "takeover_p50_ms",
        "takeover_p99_ms",
        "takeover_max_ms",
        "requests_per_s",
    ] {
        assert!(
            kill["figures"][f].as_f64().is_some(),
            "w5-kill lacks {f}: {kill:#}"
        );
    }
    assert!(kill["figures"]["dead_actors"].as_f64().unwrap() > 0.0);
    assert_eq!(kill["figures"]["lost_acknowledged"], 0.0, "{kill:#}");
    assert_eq!(kill["figures"]["acknowledged_twice"], 0.0, "{kill:#}");
    assert_eq!(kill["figures"]["lease_period_ms"], 1500.0);
    let names = |r: &serde_json::Value| -> Vec<String> {
        r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect()
    };
    for c in ["no_lost_writes", "owners_unchanged", "clean_shutdown"] {
        assert!(names(w6).contains(&c.to_owned()), "w6 lacks check {c}");
    }
    for c in [
        "all_answered_again",
        "no_lost_acknowledged_writes",
        "no_split_brain",
        "clean_shutdown",
    ] {
        assert!(
            names(kill).contains(&c.to_owned()),
            "w5-kill lacks check {c}"
        );
    }
    every_run_passed(runs);
    let summary = v["summary"].as_array().unwrap();
    for (w, f) in [
        ("w6", "ratio_requests_per_s"),
        ("w5-kill", "takeover_p99_ms"),
    ] {
        assert!(
            summary
                .iter()
                .any(|s| s["workload"] == w && s["figure"] == f),
            "{v:#}"
        );
    }
    assert!(stdout.contains("ratio_requests_per_s"), "{stdout}");
    // No node outlives the command, and the run's directories are gone.
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("wasmkeep-bench-")
        })
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Runs `wasmkeep bench ARGS` (split at spaces) with its data and JSON in
/// `tmp`; fails the test unless it succeeded. Returns its stdout and its
/// JSON report.
fn bench(tmp: &tempfile::TempDir, args: &str) -> (String, serde_json::Value) {
    let json = tmp.path().join("bench.json");
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("compile-cache");
    let out = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .arg("bench")
        .args(args.split_whitespace())
        .arg("--data-root")
        .arg(tmp.path())
        .arg("--json")
        .arg(&json)
        .env("WASMKEEP_COMPILE_CACHE", cache)
        .output()
        .expect("run wasmkeep bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let v = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    (stdout, v)
}

/// Every run ended without an error and passed all its checks.
fn every_run_passed(runs: &[serde_json::Value]) {
    for r in runs {
        assert!(r["error"].is_null(), "{r:#}");
        let checks = r["checks"].as_array().unwrap();
        assert!(checks.iter().all(|c| c["ok"] == true), "{r:#}");
    }
}

/// W5, tiny: alarms set on one node of three, SIGKILLed before they are
/// due, fired by the others' sweeps. It checks that the run passes its own
/// checks (all fired, none early, none twice, none on the dead node) and
/// reports its figures; it asserts no timing.
#[test]
fn bench_runs_w5_alarm_failover() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("sweep.toml");
    std::fs::write(&config, "alarm_sweep_ms = 300\n").unwrap();
    let (_, v) = bench(
        &tmp,
        &format!(
            "--workloads w5 --runs 1 --alarms 24 --w5-lead-s 8 --connections 4 \
             --lease-period-ms 1500 --lease-grace-ms 1000 --node-config {}",
            config.display()
        ),
    );
    assert_eq!(v["ok"], true, "{v:#}");
    let runs = v["runs"].as_array().unwrap();
    let w5 = &runs[0];
    assert_eq!(w5["workload"], "w5");
    for f in [
        "lateness_p50_ms",
        "lateness_p99_ms",
        "lateness_max_ms",
        "drain_per_live_node_min_per_s",
        "lateness_over_bar",
    ] {
        assert!(w5["figures"][f].as_f64().is_some(), "w5 lacks {f}: {w5:#}");
    }
    assert_eq!(w5["figures"]["fired"], 24.0, "{w5:#}");
    assert_eq!(w5["figures"]["alarm_sweep_ms"], 300.0);
    assert_eq!(w5["figures"]["bar_ms"], 2800.0);
    every_run_passed(runs);
}
