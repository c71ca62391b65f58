//! `wasmkeep bench` end to end, tiny: W1 and W3 for about a second against
//! nodes the command starts from this (debug) binary. It checks that the
//! command runs, passes its own correctness checks and writes the JSON it
//! promises; it asserts nothing about speed.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn bench_runs_w1_and_w3_and_writes_json() {
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("bench.json");
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("compile-cache");
    let out = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args(["bench", "--workloads", "w1,w3", "--runs", "1"])
        .args(["--warmup-s", "0", "--measure-s", "1"])
        .args([
            "--actors",
            "20",
            "--connections",
            "4",
            "--cold-actors",
            "20",
        ])
        .arg("--data-root")
        .arg(tmp.path())
        .arg("--json")
        .arg(&json)
        .env("WASMKEEP_COMPILE_CACHE", cache)
        .output()
        .expect("run wasmkeep bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(stdout.contains("SAME machine"), "{stdout}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
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
    for r in runs {
        assert!(r["error"].is_null(), "{r:#}");
        assert!(
            r["checks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["ok"] == true),
            "{r:#}"
        );
    }
    let summary = v["summary"].as_array().unwrap();
    assert!(
        summary
            .iter()
            .any(|s| s["workload"] == "w1" && s["figure"] == "requests_per_s"),
        "{v:#}"
    );
}
