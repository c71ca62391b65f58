//! The single-node server over real HTTP: serial turns, transactions,
//! the guest sandbox, crash durability and name encoding.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{Node, code, enc};
use wasmkeep_guests::{DEMO, TESTBED};

fn node_with_apps(tmp: &tempfile::TempDir) -> Node {
    let node = Node::start(tmp.path(), &["--examples"]);
    let (s, v) = node.deploy("t/bed", TESTBED);
    assert_eq!(s, 200, "{v}");
    node
}

#[test]
fn concurrent_increments_across_ten_actors_are_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let node = Arc::new(Node::start(tmp.path(), &["--examples"]));
    let threads: Vec<_> = (0..40)
        .map(|t| {
            let node = Arc::clone(&node);
            std::thread::spawn(move || {
                for i in 0..25 {
                    let actor = (t * 25 + i) % 10;
                    let (s, body) = node.post(
                        &format!("/v1/demo/examples/counter/c{actor}/increment"),
                        b"",
                    );
                    assert_eq!(s, 200, "{body}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut total = 0;
    for a in 0..10 {
        let (s, v) = node.json("GET", &format!("/v1/demo/examples/counter/c{a}/value"), b"");
        assert_eq!(s, 200);
        assert_eq!(v["value"], 100, "actor c{a}");
        total += v["value"].as_i64().unwrap();
    }
    assert_eq!(total, 1000);
}

#[test]
fn a_failed_event_leaves_no_partial_write_and_the_actor_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let node = node_with_apps(&tmp);
    let p = "/v1/t/bed/probe/p1";
    assert_eq!(node.post(&format!("{p}/write"), b"").0, 204);
    for (what, want_code) in [
        ("trap", "guest_trap"),
        ("panic", "guest_trap"),
        ("err", "guest_error"),
    ] {
        let (s, v) = node.json("POST", &format!("{p}/{what}"), b"");
        assert_eq!(s, 500, "{what}: {v}");
        assert_eq!(code(&v), want_code, "{what}: {v}");
        let (_, c) = node.json("GET", &format!("{p}/count"), b"");
        assert_eq!(c["count"], 1, "{what} left a write behind");
    }
    let (_, v) = node.json("POST", &format!("{p}/panic"), b"");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("panicked on purpose"),
        "{v}"
    );
    assert_eq!(node.post(&format!("{p}/write"), b"").0, 204);
    let (_, c) = node.json("GET", &format!("{p}/count"), b"");
    assert_eq!(c["count"], 2);
}

/// Events queued behind a busy actor run as one batch in one transaction,
/// each in a savepoint of its own: the failing ones are undone alone, and
/// the others' writes are kept and acknowledged.
#[test]
fn a_failed_event_in_a_batch_undoes_only_its_own_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("node.toml");
    std::fs::write(&config, "event_cpu_ms_max = 500\n").unwrap();
    let data = tmp.path().join("data");
    let config = config.to_str().unwrap().to_owned();
    let node = Arc::new(Node::start(&data, &["--examples", "--config", &config]));
    let (s, v) = node.deploy("t/bed", TESTBED);
    assert_eq!(s, 200, "{v}");
    let p = "/v1/t/bed/probe/b1";
    assert_eq!(node.post(&format!("{p}/write"), b"").0, 204);
    // The loop holds the actor until it is interrupted; the events sent
    // meanwhile wait for it, and then run together.
    let busy = {
        let node = Arc::clone(&node);
        std::thread::spawn(move || node.json("POST", &format!("{p}/loop"), b""))
    };
    std::thread::sleep(std::time::Duration::from_millis(150));
    let queued: Vec<_> = ["write", "err", "write", "err", "write", "trap", "write"]
        .into_iter()
        .map(|what| {
            let node = Arc::clone(&node);
            std::thread::spawn(move || (what, node.json("POST", &format!("{p}/{what}"), b"")))
        })
        .collect();
    let (s, v) = busy.join().unwrap();
    assert_eq!((s, code(&v)), (500, "cpu_time_exceeded"), "{v}");
    for t in queued {
        let (what, (s, v)) = t.join().unwrap();
        match what {
            "write" => assert_eq!(s, 204, "{what}: {v}"),
            _ => assert_eq!(s, 500, "{what}: {v}"),
        }
    }
    let (_, c) = node.json("GET", &format!("{p}/count"), b"");
    assert_eq!(c["count"], 5, "the first write and the four queued ones");
}

#[test]
fn guest_sql_cannot_reach_internal_tables() {
    let tmp = tempfile::tempdir().unwrap();
    let node = node_with_apps(&tmp);
    let p = "/v1/t/bed/probe/p1";
    for sql in [
        "SELECT * FROM _wasmkeep_kv",
        "DELETE FROM _wasmkeep_alarm",
        "ATTACH DATABASE 'x.db' AS x",
        "PRAGMA synchronous = OFF",
        "COMMIT",
    ] {
        let (s, v) = node.json("POST", &format!("{p}/sql"), sql.as_bytes());
        assert_eq!(s, 422, "{sql}: {v}");
        assert_eq!(v["code"], "forbidden", "{sql}: {v}");
    }
    let (s, v) = node.json("POST", &format!("{p}/sql"), b"SELECT * FROM writes");
    assert_eq!(s, 200, "{v}");
}

#[test]
fn acknowledged_writes_survive_repeated_sigkill() {
    let tmp = tempfile::tempdir().unwrap();
    // Writers run until the process dies; every acknowledged increment must
    // be there after each restart. Killed at a different point each round.
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..4).map(|_| AtomicU64::new(0)).collect());
    let mut seed: u64 = std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15;
    for round in 0..4 {
        let mut node = Node::start(tmp.path(), &["--examples"]);
        let base = node.base.clone();
        let writers: Vec<_> = (0..4)
            .map(|a| {
                let acked = Arc::clone(&acked);
                let base = base.clone();
                std::thread::spawn(move || {
                    let agent = ureq::Agent::config_builder()
                        .http_status_as_error(false)
                        .build()
                        .new_agent();
                    loop {
                        let url = format!("{base}/v1/demo/examples/counter/k{a}/increment");
                        match agent.post(&url).send_empty() {
                            Ok(mut r) if r.status() == 200 => {
                                let v: serde_json::Value =
                                    serde_json::from_str(&r.body_mut().read_to_string().unwrap())
                                        .unwrap();
                                acked[a].fetch_max(v["value"].as_u64().unwrap(), Ordering::SeqCst);
                            }
                            _ => return,
                        }
                    }
                })
            })
            .collect();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = 200 + seed % 1200;
        std::thread::sleep(std::time::Duration::from_millis(delay));
        node.kill();
        for w in writers {
            w.join().unwrap();
        }
        let node = Node::start(tmp.path(), &["--examples"]);
        for a in 0..4 {
            let want = acked[a].load(Ordering::SeqCst);
            assert!(
                want > 0,
                "round {round}: no write was acknowledged for k{a}"
            );
            let (_, v) = node.json("GET", &format!("/v1/demo/examples/counter/k{a}/value"), b"");
            let got = v["value"].as_u64().unwrap();
            // An in-flight increment may have committed without an answer:
            // never fewer than acknowledged, at most one more per writer.
            assert!(
                got >= want && got <= want + 1,
                "round {round} k{a}: acknowledged {want}, found {got}"
            );
            acked[a].fetch_max(got, Ordering::SeqCst);
            let (s, v) = node.json(
                "POST",
                &format!("/admin/v1/actors/demo/examples/counter/k{a}/sql"),
                b"PRAGMA integrity_check",
            );
            assert_eq!(s, 200, "{v}");
            assert_eq!(v["rows"][0][0], "ok");
        }
    }
}

#[test]
fn hostile_names_stay_in_their_folder_and_list_back() {
    let tmp = tempfile::tempdir().unwrap();
    let node = Node::start(tmp.path(), &["--examples"]);
    let names = ["a/b", "..", "../../etc", "ü😀", ".", "x.y", "with space"];
    for n in names {
        let (s, v) = node.json(
            "POST",
            &format!("/v1/demo/examples/counter/{}/increment", enc(n)),
            b"",
        );
        assert_eq!(s, 200, "{n}: {v}");
    }
    let class_dir = tmp.path().join("actors/demo/examples/counter");
    for entry in walk(tmp.path()) {
        let rel = entry.strip_prefix(tmp.path()).unwrap();
        let top = rel.components().next().unwrap().as_os_str().to_owned();
        if top == "actors" && entry.extension().is_some_and(|e| e == "db") {
            assert!(entry.starts_with(&class_dir), "{entry:?} escaped");
        }
    }
    let (s, v) = node.json(
        "GET",
        "/admin/v1/actors/demo/examples/counter?limit=100",
        b"",
    );
    assert_eq!(s, 200);
    let mut want: Vec<&str> = names.to_vec();
    want.sort();
    let got: Vec<&str> = v["actors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(got, want);
    let (s, v) = node.json("POST", "/v1/demo/examples/counter/a%0Ab/increment", b"");
    assert_eq!((s, code(&v)), (400, "invalid_name"));
    // One byte over `name_bytes_max` (256, the one limit of every layer).
    let long = "n".repeat(257);
    let (s, v) = node.json(
        "POST",
        &format!("/v1/demo/examples/counter/{long}/increment"),
        b"",
    );
    assert_eq!((s, code(&v)), (400, "invalid_name"));
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("name_bytes_max=256"), "{v}");
}

#[test]
fn the_demo_app_matches_its_contract() {
    let tmp = tempfile::tempdir().unwrap();
    let node = Node::start(tmp.path(), &["--examples"]);
    let (s, v) = node.json("POST", "/v1/demo/examples/counter/x/increment", b"");
    assert_eq!((s, v["value"].clone()), (200, serde_json::json!(1)));
    let (s, v) = node.json("GET", "/v1/demo/examples/counter/x/value", b"");
    assert_eq!((s, v["value"].clone()), (200, serde_json::json!(1)));
    let (s, v) = node.json("POST", "/v1/demo/examples/notes/d/notes?title=hi", b"body");
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_i64().unwrap();
    assert_eq!(
        node.post(
            &format!("/v1/demo/examples/notes/d/notes/{id}/tags/red"),
            b""
        )
        .0,
        204
    );
    assert_eq!(
        node.send("PUT", "/v1/demo/examples/notes/d/settings/theme", b"dark")
            .0,
        204
    );
    let (_, v) = node.json("GET", "/v1/demo/examples/notes/d/notes", b"");
    assert_eq!(v["notes"][0]["tags"][0], "red");
    let (_, v) = node.json("GET", "/v1/demo/examples/notes/d/settings", b"");
    assert_eq!(v["theme"], "dark");
    // Redeploying the same bytes changes nothing for the actors.
    let (s, _) = node.deploy("demo/examples", DEMO);
    assert_eq!(s, 200);
    let (_, v) = node.json("GET", "/v1/demo/examples/counter/x/value", b"");
    assert_eq!(v["value"], 1);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A node stopped the moment it prints that it listens (a supervisor, the
/// benchmark's first node) shuts down cleanly: its signal handlers are in
/// place before that line. (Without that, the signal raced the handlers'
/// installation; several rounds make losing the race likely.)
#[test]
fn a_node_signalled_right_after_it_listens_exits_cleanly() {
    for round in 0..5 {
        for signal in [libc::SIGTERM, libc::SIGINT] {
            let tmp = tempfile::tempdir().unwrap();
            let mut node = Node::start(tmp.path(), &["--examples"]);
            let status = node.signal_and_wait(signal);
            assert!(status.success(), "round {round}, signal {signal}: {status}");
        }
    }
}

/// Issue 36's contract: the same `Idempotency-Key` three times, the node
/// SIGKILLed and started again between the second and the third, answers
/// `{"value":1}` each time and leaves the counter at 1; the TypeScript
/// counter too.
#[test]
fn an_idempotency_key_is_answered_once_across_a_sigkill() {
    let tmp = tempfile::tempdir().unwrap();
    let key = [("idempotency-key", "order-7".to_string())];
    let paths = [
        "/v1/demo/examples/counter/idem",
        "/v1/demo/examples-ts/counter/idem",
    ];
    let mut node = Node::start(tmp.path(), &["--examples"]);
    for p in paths {
        for _ in 0..2 {
            let (s, body) = node.send_headers("POST", &format!("{p}/increment"), b"", &key);
            assert_eq!(s, 200, "{p}: {body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v, serde_json::json!({"value": 1}), "{p}");
        }
    }
    node.kill();
    let node = Node::start(tmp.path(), &["--examples"]);
    for p in paths {
        let (s, body) = node.send_headers("POST", &format!("{p}/increment"), b"", &key);
        assert_eq!(s, 200, "{p}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v, serde_json::json!({"value": 1}), "{p}");
        let (_, v) = node.json("GET", &format!("{p}/value"), b"");
        assert_eq!(v["value"], 1, "{p}");
    }
    // A key beyond its limit is the client's error, with its code.
    let long = [("idempotency-key", "k".repeat(256))];
    let (s, body) = node.send_headers("POST", &format!("{}/increment", paths[0]), b"", &long);
    assert_eq!(s, 400, "{body}");
    assert!(body.contains("invalid_idempotency_key"), "{body}");
    // The same key with another body is refused, not answered.
    let (s, body) = node.send_headers("POST", &format!("{}/increment", paths[0]), b"x", &key);
    assert_eq!(s, 422, "{body}");
    assert!(body.contains("idempotency_key_reused"), "{body}");
}

/// Workflows (issue 36) under SIGKILL: a hundred `ten`-step workflows in
/// each language run while the node is killed at a different moment each
/// round and started again; each finishes, with every step's effect
/// committed exactly once.
#[test]
fn workflows_survive_repeated_sigkill_with_each_step_run_once() {
    const N: usize = 100;
    let tmp = tempfile::tempdir().unwrap();
    let apps = ["examples", "examples-ts"];
    let mut node = Node::start(tmp.path(), &["--examples"]);
    let mut seed: u64 = std::process::id() as u64 ^ 0x2545_f491_4f6c_dd1d;
    for round in 0..4 {
        if round == 0 {
            for i in 0..N {
                for app in apps {
                    let (s, body) =
                        node.post(&format!("/v1/demo/{app}/orders/w{i}/start-ten?id=t"), b"");
                    assert_eq!(s, 204, "{body}");
                }
            }
            // Work is left when the node dies: the last ones started are
            // not done (each step is an fsync'd event and its answer).
            let unfinished = apps
                .iter()
                .flat_map(|app| (N - 5..N).map(move |i| (app, i)))
                .filter(|(app, i)| {
                    let path = format!("/v1/demo/{app}/orders/w{i}/status?id=t");
                    node.json("GET", &path, b"").1["state"] != "done"
                })
                .count();
            assert!(unfinished > 0, "every workflow finished before the kill");
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(std::time::Duration::from_millis(seed % 40));
        node.kill();
        node = Node::start(tmp.path(), &["--examples"]);
    }
    for app in apps {
        for i in 0..N {
            let status = format!("/v1/demo/{app}/orders/w{i}/status?id=t");
            let mut state = serde_json::Value::Null;
            for _ in 0..1_000 {
                state = node.json("GET", &status, b"").1;
                if state["state"] == "done" {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            assert_eq!(state["state"], "done", "{app} w{i}: {state}");
            let (_, e) = node.json("GET", &format!("/v1/demo/{app}/orders/w{i}/effects"), b"");
            for s in 0..10 {
                assert_eq!(e[format!("s{s}")], 1, "{app} w{i}: {e}");
            }
        }
    }
}

/// Two nodes on one data directory would replay and delete each other's
/// commit log and write the same actors: a second `serve` on a folder a
/// running node holds refuses to start, naming the holder, and the first
/// node goes on unharmed; once it stopped, the folder serves again.
#[test]
fn a_second_node_on_a_data_directory_in_use_refuses_to_start() {
    let tmp = tempfile::tempdir().unwrap();
    let mut first = Node::start(tmp.path(), &["--examples"]);
    let (s, _) = first.post("/v1/demo/examples/counter/one/increment", b"");
    assert_eq!(s, 200);
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args(["serve", "--examples", "--listen", "127.0.0.1:0", "--data"])
        .arg(tmp.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{said}");
    assert!(
        said.contains(&format!("in use by process {}", first.pid())),
        "{said}"
    );
    let (s, body) = first.post("/v1/demo/examples/counter/one/increment", b"");
    assert_eq!((s, body.as_str()), (200, r#"{"value":2}"#));
    assert!(first.stop().success());
    let again = Node::start(tmp.path(), &["--examples"]);
    let (s, body) = again.get("/v1/demo/examples/counter/one/value");
    assert_eq!((s, body.as_str()), (200, r#"{"value":2}"#));
}
