//! Waiting for an answer inside a handler, without interleaving (issue 36,
//! ADR 0056), through a real node and the examples' `waiter` class (Rust,
//! and TypeScript for the first and the alarm's):
//! a request that waits for another actor's typed answer runs to its end
//! with each write before the wait made once; the actor's other events
//! wait meanwhile; a wait ends at its deadline; a cycle of waits ends with
//! `await_deadlock`; a suspended request finishes after the node is
//! killed and started again; an alarm waits too.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Node, cluster, enc};
use serde_json::Value;

/// A node with `outbound_private_allowed`, the examples deployed as
/// `acme/w` allowing calls to `hosts`.
fn node_with(tmp: &std::path::Path, hosts: &[String]) -> Node {
    let cfg = tmp.join("node.toml");
    std::fs::write(&cfg, "outbound_private_allowed = true\n").unwrap();
    let node = Node::start(&tmp.join("data"), &["--config", cfg.to_str().unwrap()]);
    deploy(&node, hosts);
    node
}

fn deploy(node: &Node, hosts: &[String]) {
    let list: Vec<String> = hosts.iter().map(|h| format!("\"{h}\"")).collect();
    let manifest = format!("[outbound]\nhosts = [{}]\n", list.join(", "));
    let (s, v) = node.json(
        "PUT",
        &format!("/admin/v1/apps/acme/w?manifest={}", enc(&manifest)),
        wasmkeep_guests::DEMO,
    );
    assert_eq!(s, 200, "{v}");
}

fn notes(node: &Node, waiter: &str) -> Vec<String> {
    let (s, v) = node.json("GET", &format!("/v1/acme/w/waiter/{waiter}/notes"), b"");
    assert_eq!(s, 200, "{v}");
    v["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["what"].as_str().unwrap().to_owned())
        .collect()
}

/// A server that answers each GET with `ok N` (N counting from 1) after
/// `delay`; `hang` holds every connection open without answering.
fn slow_server(delay: Duration, hang: bool) -> (u16, Arc<AtomicUsize>) {
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&seen);
    std::thread::spawn(move || {
        for conn in server.incoming() {
            let Ok(conn) = conn else { continue };
            let count = Arc::clone(&count);
            std::thread::spawn(move || {
                let mut out = conn.try_clone().unwrap();
                let mut r = BufReader::new(conn);
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).unwrap_or(0) == 0 || h.trim_end().is_empty() {
                        break;
                    }
                }
                let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                if hang {
                    std::thread::sleep(Duration::from_secs(600));
                    return;
                }
                std::thread::sleep(delay);
                let body = format!("ok {n}");
                let _ = out.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            });
        }
    });
    (port, seen)
}

fn waits_for_a_typed_answer_and_writes_before_it_once(wasm: &[u8]) {
    let tmp = tempfile::tempdir().unwrap();
    let node = node_with(tmp.path(), &[]);
    let (s, v) = node.json("PUT", "/admin/v1/apps/acme/w", wasm);
    assert_eq!(s, 200, "{v}");
    let (s, b) = node.post("/v1/acme/w/waiter/a/add?name=t&by=5", b"");
    assert_eq!(s, 200, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["total"], 5, "{v}");
    // The first run's note was rolled back with it: one before, one after.
    assert_eq!(v["notes"], 2, "{v}");
    let (s, b) = node.post("/v1/acme/w/waiter/a/add?name=t&by=2", b"");
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        notes(&node, "a"),
        ["before add", "after add 5", "before add", "after add 7"]
    );
    // Two waits in one handler: the second run passes the first at once.
    let (s, b) = node.post("/v1/acme/w/waiter/a/twice?name=t", b"");
    assert_eq!(s, 200, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(
        (v["first"].as_i64(), v["second"].as_i64()),
        (Some(8), Some(10))
    );
    let (_, tally) = node.json("GET", "/v1/acme/w/tally/t/value", b"");
    assert_eq!(tally["value"], 10, "each call applied once: {tally}");
    // A run that asks for another call than the first run did fails.
    let (s, b) = node.post("/v1/acme/w/waiter/a/nondet?name=t", b"");
    assert_eq!(s, 500, "{b}");
    assert!(b.contains("await_nondeterministic"), "{b}");
    // An actor cannot wait for itself.
    let (s, b) = node.post("/v1/acme/w/waiter/a/self", b"");
    assert_eq!(s, 500, "{b}");
    assert!(b.contains("await_deadlock"), "{b}");
    if wasm == wasmkeep_guests::DEMO {
        // A wait behind an unanswered message to the same actor.
        let (s, b) = node.post("/v1/acme/w/waiter/b/behind?name=t", b"");
        assert_eq!(s, 500, "{b}");
        assert!(b.contains("await_lane_busy"), "{b}");
    }
    let (s, b) = node.post("/v1/acme/w/waiter/a/self", b"");
    assert_eq!(s, 500, "{b}");
    assert!(b.contains("await_deadlock"), "{b}");
    let (_, metrics) = node.send("GET", "/metrics", b"");
    let suspended: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("wasmkeep_awaits_suspended_total "))
        .expect("the metric")
        .parse()
        .unwrap();
    assert!(suspended >= 4.0, "{suspended}");
}

#[test]
fn rust_a_request_waits_for_a_typed_answer_and_writes_before_it_once() {
    waits_for_a_typed_answer_and_writes_before_it_once(wasmkeep_guests::DEMO);
}

#[test]
fn typescript_a_request_waits_for_a_typed_answer_and_writes_before_it_once() {
    waits_for_a_typed_answer_and_writes_before_it_once(wasmkeep_guests::EXAMPLES_TS);
}

fn an_actor_that_waits_runs_nothing_else_until_its_answer(wasm: &[u8]) {
    let (port, _) = slow_server(Duration::from_millis(1500), false);
    let tmp = tempfile::tempdir().unwrap();
    let node = Arc::new(node_with(tmp.path(), &[format!("127.0.0.1:{port}")]));
    let manifest = format!("[outbound]\nhosts = [\"127.0.0.1:{port}\"]\n");
    let (s, v) = node.json(
        "PUT",
        &format!("/admin/v1/apps/acme/w?manifest={}", enc(&manifest)),
        wasm,
    );
    assert_eq!(s, 200, "{v}");
    let url = enc(&format!("http://127.0.0.1:{port}/x"));
    let waiting = {
        let node = Arc::clone(&node);
        std::thread::spawn(move || node.post(&format!("/v1/acme/w/waiter/q/fetch?url={url}"), b""))
    };
    // While it waits, a read of the same actor is held behind it: it sees
    // the note written after the answer.
    std::thread::sleep(Duration::from_millis(400));
    let started = Instant::now();
    let seen = notes(&node, "q");
    assert_eq!(seen, ["before fetch", "after fetch 200"], "{seen:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "the read ran while the actor waited"
    );
    let (s, b) = waiting.join().unwrap();
    assert_eq!(s, 200, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["body"], "ok 1", "{v}");
}

#[test]
fn rust_an_actor_that_waits_runs_nothing_else_until_its_answer() {
    an_actor_that_waits_runs_nothing_else_until_its_answer(wasmkeep_guests::DEMO);
}

/// The same through the TypeScript SDK's `awaits.fetch`.
#[test]
fn typescript_an_actor_that_waits_runs_nothing_else_until_its_answer() {
    an_actor_that_waits_runs_nothing_else_until_its_answer(wasmkeep_guests::EXAMPLES_TS);
}

#[test]
fn a_wait_ends_at_its_deadline() {
    let (port, seen) = slow_server(Duration::ZERO, true);
    let tmp = tempfile::tempdir().unwrap();
    let node = node_with(tmp.path(), &[format!("127.0.0.1:{port}")]);
    let url = enc(&format!("http://127.0.0.1:{port}/never"));
    let started = Instant::now();
    let (s, b) = node.post(
        &format!("/v1/acme/w/waiter/d/fetch?url={url}&within=700"),
        b"",
    );
    assert_eq!(s, 500, "{b}");
    assert!(b.contains("await_timeout"), "{b}");
    assert!(seen.load(Ordering::SeqCst) >= 1, "the call was made");
    assert!(started.elapsed() < Duration::from_secs(20));
    // The actor serves again, and kept nothing of the run that timed out.
    assert_eq!(notes(&node, "d"), Vec::<String>::new());
}

#[test]
fn a_cycle_of_waits_ends_with_await_deadlock() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("node.toml");
    std::fs::write(&cfg, "outbound_private_allowed = true\n").unwrap();
    let node = Node::start(
        &tmp.path().join("data"),
        &["--config", cfg.to_str().unwrap()],
    );
    deploy(&node, &[node.addr().to_owned()]);
    // A waits for B's /fetch, which waits for A's /notes: A holds B's
    // call, B holds A's, a cycle; A refuses B's at once.
    let a_notes = format!("{}/v1/acme/w/waiter/a/notes", node.base);
    let b_fetch = format!(
        "{}/v1/acme/w/waiter/b/fetch?url={}",
        node.base,
        enc(&a_notes)
    );
    let started = Instant::now();
    let (s, b) = node.post(
        &format!("/v1/acme/w/waiter/a/fetch?url={}", enc(&b_fetch)),
        b"",
    );
    assert_eq!(s, 200, "{b}");
    assert!(b.contains("await_deadlock"), "{b}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "ended by the deadlock, not a deadline"
    );
}

#[test]
fn a_suspended_request_finishes_after_the_node_is_killed() {
    let (port, seen) = slow_server(Duration::from_millis(2500), false);
    let tmp = tempfile::tempdir().unwrap();
    let mut node = node_with(tmp.path(), &[format!("127.0.0.1:{port}")]);
    let url = enc(&format!("http://127.0.0.1:{port}/slow"));
    let path = format!("/v1/acme/w/waiter/k/fetch?url={url}");
    let base = node.base.clone();
    // The client of the first run loses its connection with the node.
    std::thread::spawn(move || {
        let _ = ureq::post(&format!("{base}{path}")).send(&[] as &[u8]);
    });
    cluster::wait_for("the call made", 60, 20, || seen.load(Ordering::SeqCst) >= 1);
    node.kill();
    let node = Node::start(
        &tmp.path().join("data"),
        &["--config", tmp.path().join("node.toml").to_str().unwrap()],
    );
    // The outbox makes the call again; its answer runs the request again.
    cluster::wait_for("the request's end", 120, 100, || {
        notes(&node, "k").len() == 2
    });
    assert_eq!(notes(&node, "k"), ["before fetch", "after fetch 200"]);
}

fn an_alarm_waits_for_an_answer(wasm: &[u8]) {
    let tmp = tempfile::tempdir().unwrap();
    let node = node_with(tmp.path(), &[]);
    let (s, v) = node.json("PUT", "/admin/v1/apps/acme/w", wasm);
    assert_eq!(s, 200, "{v}");
    let (s, b) = node.post("/v1/acme/w/waiter/r/arm?name=t3&by=3", b"");
    assert_eq!(s, 204, "{b}");
    cluster::wait_for("the alarm's note", 60, 50, || {
        notes(&node, "r") == ["alarm 3"]
    });
    let (_, tally) = node.json("GET", "/v1/acme/w/tally/t3/value", b"");
    assert_eq!(tally["value"], 3, "{tally}");
}

#[test]
fn rust_an_alarm_waits_for_an_answer() {
    an_alarm_waits_for_an_answer(wasmkeep_guests::DEMO);
}

#[test]
fn typescript_an_alarm_waits_for_an_answer() {
    an_alarm_waits_for_an_answer(wasmkeep_guests::EXAMPLES_TS);
}

/// A suspended request on a cluster node that dies finishes on the node
/// that takes its actor over: the suspension reached the bucket before
/// its call left, the new owner opens the actor waiting (a read through it
/// waits too), makes the call again and runs the request to its end.
#[test]
fn a_suspended_request_moves_with_its_actor() {
    let (port, seen) = slow_server(Duration::from_millis(2500), false);
    let tmp = tempfile::tempdir().unwrap();
    let bucket = format!("file://{}", tmp.path().join("bucket").display());
    let start = |name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let port = cluster::free_port();
        let config =
            cluster::node_config(&dir, 1500, 500, 2000, "outbound_private_allowed = true\n");
        let flags = cluster::serve_flags(port, &config, &bucket);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        (Node::start(&dir.join("data"), &flags), port)
    };
    let (a, a_port) = start("a");
    let (mut b, b_port) = start("b");
    let b_id = cluster::status(&b)["node"].as_str().unwrap().to_owned();
    cluster::wait_for("both nodes in the view", 120, 100, || {
        let (s, v) = a.json("GET", "/admin/v1/cluster", b"");
        s == 200 && v["nodes"].as_array().is_some_and(|n| n.len() == 2)
    });
    deploy(&a, &[format!("127.0.0.1:{port}")]);
    // The waiter on B (created there by a read through B).
    cluster::wait_for("the waiter on B", 120, 100, || {
        let r = cluster::send(b_port, "GET", "/v1/acme/w/waiter/m/notes", &[]);
        r.status == 200 && r.node.as_deref() == Some(b_id.as_str())
    });
    let url = enc(&format!("http://127.0.0.1:{port}/slow"));
    let path = format!("/v1/acme/w/waiter/m/fetch?url={url}");
    std::thread::spawn(move || {
        let _ = cluster::send(b_port, "POST", &path, &[]);
    });
    cluster::wait_for("the call made from B", 60, 20, || {
        seen.load(Ordering::SeqCst) >= 1
    });
    b.kill();
    // Through A, once B's lease is past: A takes the waiter, waiting.
    let mut last = String::new();
    cluster::wait_for("the request's end on A", 120, 200, || {
        let r = cluster::send(a_port, "GET", "/v1/acme/w/waiter/m/notes", &[]);
        last = format!("{} {:?}", r.status, r.node);
        r.status == 200 && notes(&a, "m").len() == 2
    });
    assert_eq!(
        notes(&a, "m"),
        ["before fetch", "after fetch 200"],
        "{last}"
    );
    assert!(seen.load(Ordering::SeqCst) >= 2, "A made the call again");
}

/// Deleting an actor while an event of it waits ends the wait with the
/// data: its client hears at once, and the actor serves again.
#[test]
fn deleting_a_waiting_actor_ends_its_wait() {
    let (port, seen) = slow_server(Duration::ZERO, true);
    let tmp = tempfile::tempdir().unwrap();
    let node = Arc::new(node_with(tmp.path(), &[format!("127.0.0.1:{port}")]));
    let url = enc(&format!("http://127.0.0.1:{port}/never"));
    let waiting = {
        let node = Arc::clone(&node);
        std::thread::spawn(move || node.post(&format!("/v1/acme/w/waiter/x/fetch?url={url}"), b""))
    };
    cluster::wait_for("the call made", 60, 20, || seen.load(Ordering::SeqCst) >= 1);
    let (s, v) = node.json("DELETE", "/admin/v1/actors/acme/w/waiter/x", b"");
    assert_eq!(s, 200, "{v}");
    let (s, b) = waiting.join().unwrap();
    assert_ne!(s, 200, "{b}");
    let started = Instant::now();
    assert_eq!(notes(&node, "x"), Vec::<String>::new());
    assert!(started.elapsed() < Duration::from_secs(10), "not held");
}

/// A wait's deadline holds across a restart: the node that opens the
/// suspended actor arms it again, and the actor serves once it passed.
#[test]
fn a_deadline_holds_across_a_restart() {
    let (port, _) = slow_server(Duration::ZERO, true);
    let tmp = tempfile::tempdir().unwrap();
    let mut node = node_with(tmp.path(), &[format!("127.0.0.1:{port}")]);
    let url = enc(&format!("http://127.0.0.1:{port}/never"));
    let path = format!("/v1/acme/w/waiter/y/fetch?url={url}&within=4000");
    let base = node.base.clone();
    std::thread::spawn(move || {
        let _ = ureq::post(&format!("{base}{path}")).send(&[] as &[u8]);
    });
    cluster::wait_for("suspended", 60, 20, || {
        let (_, m) = node.send("GET", "/metrics", b"");
        m.lines()
            .any(|l| l.starts_with("wasmkeep_awaits_suspended_total ") && !l.ends_with(" 0"))
    });
    node.kill();
    let node = Node::start(
        &tmp.path().join("data"),
        &["--config", tmp.path().join("node.toml").to_str().unwrap()],
    );
    // Held until the deadline, then the actor (which kept nothing of the
    // run that timed out) answers.
    let started = Instant::now();
    assert_eq!(notes(&node, "y"), Vec::<String>::new());
    let held = started.elapsed();
    assert!(
        held >= Duration::from_millis(800) && held < Duration::from_secs(30),
        "held {held:?}: the gate holds after the restart until the deadline"
    );
}
