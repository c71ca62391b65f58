//! Limits and bad input over real HTTP: every misuse gets a clear error with
//! a stable code, and nothing else is lost (issue 6; docs/limits.md lists
//! each case with the test that shows it).

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{Node, code, enc};
use wasmkeep_guests::{BAD_IMPORT, DEMO, TESTBED};

fn start(tmp: &Path, config: &str) -> Node {
    let cfg = tmp.join("node.toml");
    std::fs::write(&cfg, config).unwrap();
    let node = Node::start(&tmp.join("data"), &["--config", cfg.to_str().unwrap()]);
    let (s, v) = node.deploy("t/bed", TESTBED);
    assert_eq!(s, 200, "{v}");
    node
}

const P: &str = "/v1/t/bed/probe/p";

fn count(node: &Node, actor: &str) -> i64 {
    node.json("GET", &format!("{actor}/count"), b"").1["count"]
        .as_i64()
        .unwrap()
}

#[test]
fn the_seed_outage_a_growing_value_fails_only_its_own_event() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), "value_bytes_max = 65536\n");
    let mut failed = None;
    for i in 0..100 {
        let (s, v) = node.json("POST", &format!("{P}/grow?bytes=4096"), b"");
        if s != 200 {
            failed = Some((i, s, v));
            break;
        }
    }
    let (_, s, v) = failed.expect("the value never reached the limit");
    assert_eq!(s, 500, "{v}");
    assert_eq!(code(&v), "value_too_large", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("value_bytes_max=65536")
    );
    // The event that shrinks it succeeds, and so does every other write.
    assert_eq!(node.post(&format!("{P}/shrink"), b"").0, 204);
    assert_eq!(node.post(&format!("{P}/write"), b"").0, 204);
    let (_, v) = node.json("POST", &format!("{P}/grow?bytes=4096"), b"");
    assert_eq!(v["bytes"], 16 + 4096, "{v}");
}

#[test]
fn a_key_value_entry_over_the_limit_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), "value_bytes_max = 10000\nkey_bytes_max = 16\n");
    let (s, v) = node.json("POST", &format!("{P}/kv?key=k&bytes=20000"), b"");
    assert_eq!((s, code(&v)), (500, "value_too_large"), "{v}");
    let (s, v) = node.json(
        "POST",
        &format!("{P}/kv?key={}&bytes=1", "k".repeat(17)),
        b"",
    );
    assert_eq!((s, code(&v)), (500, "key_too_large"), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("key_bytes_max=16")
    );
    assert_eq!(node.post(&format!("{P}/kv?key=k&bytes=100"), b"").0, 204);
}

#[test]
fn a_full_database_names_its_limit_and_can_still_shrink() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), "database_bytes_max = 262144\n");
    let mut last = (0, serde_json::Value::Null);
    for _ in 0..100 {
        last = node.json("POST", &format!("{P}/grow?bytes=30000"), b"");
        if last.0 != 200 {
            break;
        }
    }
    assert_eq!(code(&last.1), "database_full", "{}", last.1);
    assert!(
        last.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("database_bytes_max")
    );
    assert_eq!(node.post(&format!("{P}/shrink"), b"").0, 204);
    assert_eq!(node.post(&format!("{P}/write"), b"").0, 204);
}

#[test]
fn invalid_sql_and_internal_tables_get_clear_errors_in_the_guest() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), "sql_bytes_max = 1000\n");
    let (_, v) = node.json("POST", &format!("{P}/sql"), b"SELEC nonsense");
    assert_eq!(v["code"], "sql_error", "{v}");
    let long = format!("SELECT 1 -- {}", "x".repeat(2000));
    let (_, v) = node.json("POST", &format!("{P}/sql"), long.as_bytes());
    assert_eq!(v["code"], "statement_too_large", "{v}");
    let (_, v) = node.json("POST", &format!("{P}/sql"), b"SELECT * FROM _wasmkeep_meta");
    assert_eq!(v["code"], "forbidden", "{v}");
}

#[test]
fn runaway_guests_are_stopped_and_the_actor_serves_the_next_request() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(
        tmp.path(),
        "event_cpu_ms_max = 300\ninstance_memory_bytes_max = 33554432\nresponse_body_bytes_max = 100000\n",
    );
    let other = "/v1/t/bed/probe/other";
    assert_eq!(node.post(&format!("{other}/write"), b"").0, 204);
    for (path, want) in [
        ("loop", "cpu_time_exceeded"),
        ("membomb", "memory_exceeded"),
        ("trap", "guest_trap"),
    ] {
        let actor = format!("/v1/t/bed/probe/{path}");
        assert_eq!(node.post(&format!("{actor}/write"), b"").0, 204);
        let (s, v) = node.json("POST", &format!("{actor}/{path}"), b"");
        assert_eq!((s, code(&v)), (500, want), "{path}: {v}");
        assert_eq!(count(&node, &actor), 1, "{path} left a write");
        let (s, body) = node.post(&format!("{actor}/write"), b"");
        assert_eq!(s, 204, "after {path}: {body}");
        assert_eq!(count(&node, &actor), 2);
    }
    let (s, v) = node.json("GET", &format!("{P}/big?bytes=200000"), b"");
    assert_eq!((s, code(&v)), (500, "response_too_large"), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("response_body_bytes_max=100000")
    );
    // Other actors never noticed.
    assert_eq!(count(&node, other), 1);
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let tmp = tempfile::tempdir().unwrap();
    let node = Arc::new(start(
        tmp.path(),
        "event_cpu_ms_max = 1500\nactor_queue_events_max = 2\n",
    ));
    let busy = {
        let node = Arc::clone(&node);
        std::thread::spawn(move || node.json("POST", &format!("{P}/loop"), b""))
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let results: Vec<_> = (0..6)
        .map(|_| {
            let node = Arc::clone(&node);
            std::thread::spawn(move || {
                let req = ureq::http::Request::builder()
                    .method("POST")
                    .uri(format!("{}{P}/write", node.base))
                    .body(Vec::new())
                    .unwrap();
                let agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .build()
                    .new_agent();
                let mut r = agent.run(req).unwrap();
                let retry = r
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_owned());
                let body = r.body_mut().read_to_string().unwrap();
                (r.status().as_u16(), retry, body)
            })
        })
        .collect();
    let results: Vec<_> = results.into_iter().map(|t| t.join().unwrap()).collect();
    let _ = busy.join();
    let refused: Vec<_> = results.iter().filter(|r| r.0 == 503).collect();
    assert!(!refused.is_empty(), "nothing was refused: {results:?}");
    for (_, retry, body) in &refused {
        assert_eq!(retry.as_deref(), Some("1"));
        assert!(body.contains("actor_overloaded") && body.contains("actor_queue_events_max=2"));
    }
    let accepted = results.iter().filter(|r| r.0 == 204).count() as i64;
    assert_eq!(
        count(&node, P),
        accepted,
        "refused requests must write nothing"
    );
}

#[test]
fn more_actors_than_instances_are_served_by_evicting_the_least_recent() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), "instances_max = 4\n");
    for round in 0..3 {
        for a in 0..12 {
            let (s, v) = node.json("POST", &format!("/v1/t/bed/probe/a{a}/write"), b"");
            assert_eq!(s, 204, "round {round} actor {a}: {v}");
        }
    }
    for a in 0..12 {
        assert_eq!(count(&node, &format!("/v1/t/bed/probe/a{a}")), 3);
    }
    assert!(metric(&node, "wasmkeep_evictions_total") > 0);
}

/// Actors' database files the node process holds open (`actor.db`).
fn open_databases(node: &Node) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", node.pid()))
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.file_name().is_some_and(|n| n == "actor.db"))
        })
        .count()
}

fn metric(node: &Node, name: &str) -> u64 {
    let (_, metrics) = node.get("/metrics");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
        .parse()
        .unwrap()
}

/// More open actors than `open_databases_max` (ADR 0068): every actor
/// keeps its instance (none is evicted), the least recently used close
/// their databases (two files each) and open them again at their next
/// event, nothing written is lost, and once the closer is done the
/// process holds no more databases open than the bound.
#[test]
fn open_actors_past_open_databases_max_keep_their_instances_and_close_their_files() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), "instances_max = 64\nopen_databases_max = 8\n");
    for round in 0..3 {
        for a in 0..40 {
            let (s, v) = node.json("POST", &format!("/v1/t/bed/probe/a{a}/write"), b"");
            assert_eq!(s, 204, "round {round} actor {a}: {v}");
        }
    }
    for a in 0..40 {
        assert_eq!(count(&node, &format!("/v1/t/bed/probe/a{a}")), 3);
    }
    assert_eq!(metric(&node, "wasmkeep_instances_active"), 40);
    assert_eq!(metric(&node, "wasmkeep_evictions_total"), 0);
    assert!(metric(&node, "wasmkeep_databases_parked_total") >= 32);
    // The closer thread closes them in the background: up to 10 s.
    let mut polls = 0;
    while open_databases(&node) > 8 {
        polls += 1;
        assert!(
            polls < 200,
            "{} databases open, the bound is 8",
            open_databases(&node)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        open_databases(&node) >= 1,
        "the count sees the node's files"
    );
}

#[test]
fn bad_deploys_are_refused_and_the_deployed_app_stays() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), "component_bytes_max = 1000000\n");
    let (_, before) = node.json("GET", "/admin/v1/apps/t/bed", b"");
    let empty_component: &[u8] = b"\0asm\x0d\0\x01\0";
    let core_module: &[u8] = b"\0asm\x01\0\0\0";
    let big = vec![0u8; 1_000_001];
    let cases: Vec<(&str, &[u8], &str, &str)> = vec![
        (
            "not wasm",
            b"hello, world",
            "invalid_component",
            "not a WebAssembly binary",
        ),
        (
            "core module",
            core_module,
            "invalid_component",
            "core WebAssembly module",
        ),
        (
            "no exports",
            empty_component,
            "invalid_component",
            "does not export",
        ),
        (
            "unknown import",
            BAD_IMPORT,
            "invalid_component",
            "acme:nope",
        ),
        (
            "too large",
            &big,
            "component_too_large",
            "component_bytes_max=1000000",
        ),
        (
            "truncated",
            &TESTBED[..TESTBED.len() / 2],
            "invalid_component",
            "does not compile",
        ),
    ];
    for (what, bytes, want, says) in cases {
        let (s, v) = node.deploy("t/bed", bytes);
        assert_eq!(code(&v), want, "{what}: {s} {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(says),
            "{what}: {v}"
        );
        let (_, after) = node.json("GET", "/admin/v1/apps/t/bed", b"");
        assert_eq!(after["hash"], before["hash"], "{what} replaced the app");
    }
    let (s, v) = node.json(
        "PUT",
        "/admin/v1/apps/t/bed?manifest=%5Balarms%5D%0Anope%3D1",
        TESTBED,
    );
    assert_eq!((s, code(&v)), (422, "invalid_manifest"), "{v}");
    // A page size SQLite cannot take is refused, naming the setting.
    let (s, v) = node.json(
        "PUT",
        "/admin/v1/apps/t/bed?manifest=%5Bstorage%5D%0Asqlite_page_bytes%3D1000",
        TESTBED,
    );
    assert_eq!((s, code(&v)), (422, "invalid_manifest"), "{v}");
    let says = v["error"]["message"].as_str().unwrap();
    assert!(
        says.contains("storage.sqlite_page_bytes") && says.contains("1000"),
        "{v}"
    );
    assert_eq!(node.post(&format!("{P}/write"), b"").0, 204);
    // The name is checked before the body is read: send a small one (a
    // client still sending a large body when the 400 comes would see the
    // connection close, which is ordinary HTTP but not what this tests).
    let (s, v) = node.deploy("Bad/x", &DEMO[..8]);
    assert_eq!((s, code(&v)), (400, "invalid_name"), "{v}");
}

#[test]
fn malformed_http_gets_4xx_with_a_code() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), "request_body_bytes_max = 1000\n");
    for (method, path, body, status, want) in [
        ("GET", "/nope", &b""[..], 404, "route_not_found"),
        ("GET", "/v1/t/bed/probe", b"", 404, "route_not_found"),
        ("GET", "/v1/t/bed/Probe/p/count", b"", 400, "invalid_name"),
        (
            "GET",
            "/v1/t/bed/probe/a%00b/count",
            b"",
            400,
            "invalid_name",
        ),
        (
            "GET",
            "/v1/t/bed/probe/%C3%28/count",
            b"",
            400,
            "invalid_name",
        ),
        ("GET", "/v1/t/bed/nope/p/count", b"", 404, "class_not_found"),
        ("GET", "/v1/t/none/probe/p/count", b"", 404, "app_not_found"),
        (
            "POST",
            "/v1/t/bed/probe/p/write",
            &[0u8; 2000][..],
            413,
            "body_too_large",
        ),
        ("DELETE", "/admin/v1/apps", b"", 405, "method_not_allowed"),
        (
            "GET",
            "/admin/v1/actors/t/bed/probe/never",
            b"",
            404,
            "actor_not_found",
        ),
    ] {
        let (s, v) = node.json(method, path, body);
        assert_eq!((s, code(&v)), (status, want), "{method} {path}: {v}");
    }
    let long = enc(&"n".repeat(600));
    let (s, v) = node.json("GET", &format!("/v1/t/bed/probe/{long}/count"), b"");
    assert_eq!((s, code(&v)), (400, "invalid_name"), "{v}");
    // None of that created an actor.
    let (_, v) = node.json("GET", "/admin/v1/actors/t/bed/probe", b"");
    assert_eq!(v["actors"], serde_json::json!([]));
}

#[test]
fn guests_see_no_files_environment_or_network() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), "");
    let (s, v) = node.json("GET", &format!("{P}/env"), b"");
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["files"], false);
    assert_eq!(v["env_vars"], 0);
    assert_eq!(v["network"], false);
}
