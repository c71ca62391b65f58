//! The bundled examples' own tests, written with the test kit as a user
//! would write theirs.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

use std::time::Duration;

use wasmkeep_guests::DEMO;
use wasmkeep_testkit::TestNode;

fn node() -> TestNode {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    node
}

#[test]
fn counter_counts_per_actor_and_keeps_its_count_across_a_restart() {
    let mut node = node();
    for _ in 0..3 {
        node.actor("demo/examples/counter/a").post("/increment", "");
    }
    node.actor("demo/examples/counter/b").post("/increment", "");
    node.restart();
    assert_eq!(
        node.actor("demo/examples/counter/a").get("/value").json()["value"],
        3
    );
    assert_eq!(
        node.actor("demo/examples/counter/b").get("/value").json()["value"],
        1
    );
    assert_eq!(
        node.actor("demo/examples/counter/a")
            .sql_i64("SELECT n FROM counter"),
        3
    );
}

#[test]
fn a_response_lost_after_commit_leaves_the_write_committed() {
    let node = node();
    let c = node.actor("demo/examples/counter/a");
    c.post("/increment", "");
    node.crash_after_commit(1);
    // An alarm run does not use the fault up.
    assert_eq!(node.advance(Duration::from_secs(1)), 0);
    let lost = c.request("POST", "/increment", "");
    assert!(lost.is_err(), "the caller must not hear of it");
    // The commit stood: a client retrying would count twice, which is why
    // requests that must not repeat carry their own idempotency key.
    assert_eq!(c.get("/value").json()["value"], 2);
}

#[test]
fn notes_keep_rows_tags_and_settings() {
    let node = node();
    let d = node.actor("demo/examples/notes/doc-1");
    let id = d.post("/notes?title=plan", "ship it").json()["id"]
        .as_i64()
        .unwrap();
    assert_eq!(d.post(&format!("/notes/{id}/tags/urgent"), "").status, 204);
    assert_eq!(
        d.request("PUT", "/settings/lang", "en").unwrap().status,
        204
    );
    let notes = d.get("/notes").json();
    assert_eq!(notes["notes"][0]["title"], "plan");
    assert_eq!(notes["notes"][0]["tags"][0], "urgent");
    assert_eq!(d.kv("setting/lang").as_deref(), Some(&b"en"[..]));
    // Bad input is the client's fault: 400, and nothing is written.
    let err = d.request("GET", "/notes/abc", "").unwrap_err();
    assert_eq!(err.code(), "bad_request");
    assert_eq!(
        d.request("DELETE", &format!("/notes/{id}"), "")
            .unwrap()
            .status,
        204
    );
    assert_eq!(
        d.sql_i64("SELECT count(*) FROM tags"),
        0,
        "tags cascade with their note"
    );
}

#[test]
fn a_reminder_repeats_from_its_anchor_even_when_runs_are_late() {
    let node = node();
    let r = node.actor("demo/examples/reminder/daily");
    let t = node.now_ms() + 1_000;
    r.post(&format!("/set?at_ms={t}&every_ms=60000&count=3"), "");
    // Jump far past all three: each fires at its own time, in order.
    assert_eq!(node.advance(Duration::from_secs(600)), 3);
    let fired = r.get("/fired").json();
    let due: Vec<u64> = fired["fired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["due_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(due, vec![t, t + 60_000, t + 120_000]);
    assert_eq!(r.alarm(), None);
}

#[test]
fn every_test_node_starts_empty() {
    let a = node();
    a.actor("demo/examples/counter/shared")
        .post("/increment", "");
    let b = node();
    assert!(!b.actor("demo/examples/counter/shared").exists());
    assert_ne!(a.data_dir(), b.data_dir());
}

/// Many named timers on the one alarm (issue 20, `wasmkeep_sdk::timers`):
/// the alarm is always the earliest timer, so a later one never postpones
/// an earlier one; each fires once, at its time, with its payload; a
/// cancelled one never fires.
#[test]
fn timers_share_the_alarm_and_a_later_one_never_postpones_an_earlier_one() {
    let node = node();
    let a = node.actor("demo/examples/timers/t1");
    let t0 = node.now_ms();
    let set = |name: &str, after_ms: u64, payload: &str| {
        let r = a.post(
            &format!("/set?name={name}&due_ms={}", t0 + after_ms),
            payload,
        );
        assert_eq!(r.status, 204, "{}", r.text());
    };
    set("watch", 60_000, "w");
    set("ring", 10_000, "booking-17");
    assert_eq!(a.alarm(), Some(t0 + 10_000));
    set("late", 120_000, "l");
    assert_eq!(
        a.alarm(),
        Some(t0 + 10_000),
        "a later timer moved the alarm"
    );
    // Moving a timer earlier brings the alarm forward.
    set("watch", 5_000, "w2");
    assert_eq!(a.alarm(), Some(t0 + 5_000));

    node.advance(Duration::from_secs(10));
    let fired = a.get("/fired").json()["fired"].clone();
    let names: Vec<&str> = fired
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["watch", "ring"], "earliest first, each once");
    assert_eq!(fired[0]["fired_ms"], t0 + 5_000);
    assert_eq!(fired[0]["payload"], "w2");
    assert_eq!(fired[1]["fired_ms"], t0 + 10_000);
    assert_eq!(fired[1]["payload"], "booking-17");
    assert_eq!(a.alarm(), Some(t0 + 120_000));

    set("never", 30_000, "n");
    assert_eq!(a.alarm(), Some(t0 + 30_000));
    assert_eq!(a.post("/cancel?name=never", "").json()["cancelled"], true);
    assert_eq!(a.post("/cancel?name=never", "").json()["cancelled"], false);
    assert_eq!(a.alarm(), Some(t0 + 120_000), "the alarm follows a cancel");
    node.advance(Duration::from_secs(200));
    let fired = a.get("/fired").json()["fired"].clone();
    assert_eq!(fired.as_array().unwrap().len(), 3);
    assert_eq!(fired[2]["name"], "late");
    let listed = a.get("/timers").json();
    assert_eq!(listed["timers"].as_array().unwrap().len(), 0);
    assert_eq!(listed["alarm_ms"], serde_json::Value::Null);
    assert_eq!(a.alarm(), None);
}

/// A timer run that fails rolls back with the timers it took: the alarm's
/// retry fires every one of them, none twice.
#[test]
fn a_failed_timer_run_fires_its_timers_again_and_none_twice() {
    let node = node();
    let a = node.actor("demo/examples/timers/t2");
    let t0 = node.now_ms();
    for name in ["fail-1", "ok"] {
        let r = a.post(&format!("/set?name={name}&due_ms={}", t0 + 5_000), "p");
        assert_eq!(r.status, 204);
    }
    node.advance(Duration::from_secs(5));
    assert_eq!(a.get("/fired").json()["fired"].as_array().unwrap().len(), 0);
    assert_eq!(a.alarm_retry_count(), 1);
    assert_eq!(
        a.get("/timers").json()["timers"].as_array().unwrap().len(),
        2
    );
    node.advance(Duration::from_secs(60));
    let fired = a.get("/fired").json()["fired"].clone();
    let mut names: Vec<&str> = fired
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["fail-1", "ok"]);
    assert_eq!(a.alarm(), None);
}

/// A timer name or payload over its limit is refused with `invalid_timer`,
/// naming the limit, and sets nothing.
#[test]
fn a_timer_over_its_limits_is_refused_by_name() {
    let node = node();
    let a = node.actor("demo/examples/timers/t3");
    let long = "n".repeat(257);
    let err = a
        .request("POST", &format!("/set?name={long}&due_ms=1"), "")
        .unwrap_err();
    assert!(err.to_string().contains("invalid_timer"), "{err}");
    assert!(err.to_string().contains("name_bytes_max"), "{err}");
    let err = a
        .request("POST", "/set?name=big&due_ms=1", vec![0u8; 64 * 1024 + 1])
        .unwrap_err();
    assert!(err.to_string().contains("payload_bytes_max"), "{err}");
    assert_eq!(
        a.get("/timers").json()["timers"].as_array().unwrap().len(),
        0
    );
    assert_eq!(a.alarm(), None);
}

/// The chat room (issue 21's contract) through the test kit's sockets.
#[test]
fn chat_delivers_every_text_to_every_socket_of_the_room_and_nothing_of_a_failed_event() {
    use wasmkeep_testkit::SocketReceived;
    let node = node();
    let room = node.actor("demo/examples/chat/lobby");
    let mut a = room.websocket("/ws").unwrap();
    let mut b = room.websocket("/ws").unwrap();
    let mut elsewhere = node
        .actor("demo/examples/chat/other")
        .websocket("/ws")
        .unwrap();
    assert_eq!(room.get("/count").json()["sockets"], 2);
    a.send_text("hello").unwrap();
    let within = Duration::from_secs(10);
    assert_eq!(a.recv(within), Some(SocketReceived::Text("hello".into())));
    assert_eq!(b.recv(within), Some(SocketReceived::Text("hello".into())));
    assert_eq!(elsewhere.recv(Duration::from_millis(200)), None);
    // The broadcast of a failed event never leaves.
    b.send_text("!fail").unwrap();
    b.send_text("after").unwrap();
    assert_eq!(a.recv(within), Some(SocketReceived::Text("after".into())));
    // A plain GET is not an upgrade.
    let e = room.request("GET", "/ws", "").unwrap_err();
    assert_eq!(e.code(), "not_an_upgrade");
    b.close(1000, "bye");
    for _ in 0..200 {
        if room.get("/count").json()["sockets"] == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(room.get("/count").json()["sockets"], 1);
    // Deleting the room closes its sockets with 1013.
    assert!(room.delete_actor());
    assert!(matches!(
        a.recv(within),
        Some(SocketReceived::Closed(1013, _))
    ));
}

#[test]
fn sockets_past_the_actors_bound_are_refused_naming_it() {
    let node = TestNode::with_config(|c| c.sockets.per_actor_max = 2);
    node.deploy("demo/examples", DEMO).unwrap();
    let room = node.actor("demo/examples/chat/small");
    let _a = room.websocket("/ws").unwrap();
    let _b = room.websocket("/ws").unwrap();
    let e = room.websocket("/ws").err().expect("a third is refused");
    assert_eq!(e.code(), "too_many_sockets", "{e}");
    assert!(e.to_string().contains("sockets_per_actor_max"), "{e}");
}

#[test]
fn a_socket_that_does_not_read_is_closed_with_1008_not_buffered() {
    use wasmkeep_testkit::SocketReceived;
    let node = TestNode::with_config(|c| c.sockets.send_buffer_bytes_max = 64);
    node.deploy("demo/examples", DEMO).unwrap();
    let room = node.actor("demo/examples/chat/slow");
    let writer = room.websocket("/ws").unwrap();
    let mut reader = room.websocket("/ws").unwrap();
    for k in 0..10 {
        writer.send_text(&format!("message number {k:02}")).unwrap();
    }
    // Every broadcast ran (and was applied) before the reader reads any.
    node.settle_outbox();
    // 64 bytes hold three of these 17-byte texts; the fourth closes it.
    let within = Duration::from_secs(10);
    let mut got = Vec::new();
    while let Some(m) = reader.recv(within) {
        let closed = matches!(m, SocketReceived::Closed(..));
        got.push(m);
        if closed {
            break;
        }
    }
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(
        matches!(&got[3], SocketReceived::Closed(1008, why) if why.contains("socket_send_buffer_bytes_max")),
        "{got:?}"
    );
}

#[test]
fn an_idle_socket_is_closed_by_the_test_clock() {
    use wasmkeep_testkit::SocketReceived;
    let node = TestNode::with_config(|c| c.sockets.idle_ms = 60_000);
    node.deploy("demo/examples", DEMO).unwrap();
    let room = node.actor("demo/examples/chat/quiet");
    let mut a = room.websocket("/ws").unwrap();
    node.advance(Duration::from_secs(30));
    a.send_text("still talking").unwrap();
    assert_eq!(
        a.recv(Duration::from_secs(10)),
        Some(SocketReceived::Text("still talking".into()))
    );
    // A minute without a message either way.
    node.advance(Duration::from_secs(59));
    assert_eq!(a.recv(Duration::from_millis(100)), None, "not yet");
    node.advance(Duration::from_secs(2));
    assert!(
        matches!(a.recv(Duration::from_secs(10)), Some(SocketReceived::Closed(1001, why)) if why.contains("socket_idle_ms")),
    );
}

#[test]
fn a_sockets_attachment_outlives_its_rooms_hibernation() {
    let node = node();
    let room = node.actor("demo/examples/chat/names");
    let _a = room.websocket("/ws?name=ada").unwrap();
    let _b = room.websocket("/ws?name=bob").unwrap();
    // Every open actor closed, as the reaper does to idle ones. The room
    // may still be finishing the turn that accepted the second socket (a
    // busy actor is not closed), or the reaper may have closed it first:
    // ask until it is closed.
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while node.runtime().is_open(room.id()) {
        node.runtime().close_idle_now();
        assert!(std::time::Instant::now() < end, "the room never closed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!node.runtime().is_open(room.id()), "the room hibernated");
    assert_eq!(
        room.get("/who").json()["names"],
        serde_json::json!(["ada", "bob"])
    );
}

/// A node that no longer holds an actor (its cluster lease ended, the
/// actor moved) runs no event for it and closes its sockets with 1012.
#[test]
fn sockets_of_an_actor_the_node_no_longer_holds_are_closed_with_1012() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use wasmkeep_runtime::{ActorId, RunGate};
    use wasmkeep_testkit::SocketReceived;
    struct Gate(AtomicBool);
    impl RunGate for Gate {
        fn may_run(&self, _: &ActorId) -> bool {
            self.0.load(Ordering::SeqCst)
        }
        fn hold_generation(&self, _: &ActorId) -> Option<u64> {
            self.0.load(Ordering::SeqCst).then_some(1)
        }
    }
    let node = node();
    let gate = Arc::new(Gate(AtomicBool::new(true)));
    assert!(
        node.runtime()
            .alarms()
            .set_gate(Arc::clone(&gate) as Arc<dyn RunGate>)
    );
    let room = node.actor("demo/examples/chat/moving");
    let mut a = room.websocket("/ws").unwrap();
    gate.0.store(false, Ordering::SeqCst);
    a.send_text("anyone?").unwrap();
    assert!(
        matches!(
            a.recv(Duration::from_secs(10)),
            Some(SocketReceived::Closed(1012, _))
        ),
        "the client is told to reconnect, and nothing was broadcast"
    );
}

/// A cluster node opens an actor for an outbox resume (the start-up
/// scan's, for an actor with unsent rows) only once its gate let it take
/// the actor (ADR 0020): opened while another node held it, the copy
/// stayed open and was served, stale, once the node took the actor again.
/// Here the gate refuses `x` (another node holds it, whose opening sends
/// the rows). The unsafe variant `unsafe_resume_unheld` opens it.
#[test]
fn an_outbox_resume_opens_no_actor_the_node_does_not_hold() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use wasmkeep_runtime::{ActorId, RunGate};
    /// Holds every actor but `x` while set.
    struct LostX(AtomicBool);
    impl RunGate for LostX {
        fn may_run(&self, id: &ActorId) -> bool {
            self.hold_generation(id).is_some()
        }
        fn hold_generation(&self, id: &ActorId) -> Option<u64> {
            (id.name != "x" || !self.0.load(Ordering::SeqCst)).then_some(1)
        }
        fn epoch(&self) -> Option<u64> {
            Some(1)
        }
    }
    for unsafe_variant in [false, true] {
        // One worker: the runtime's turns run in the order queued.
        let node = TestNode::with_config(|c| c.workers = 1);
        node.deploy("demo/examples", DEMO).unwrap();
        let gate = Arc::new(LostX(AtomicBool::new(false)));
        let rt = node.runtime();
        assert!(rt.alarms().set_gate(Arc::clone(&gate) as Arc<dyn RunGate>));
        let (x, y) = (
            node.actor("demo/examples/counter/x"),
            node.actor("demo/examples/counter/y"),
        );
        assert_eq!(x.post("/increment", "").status, 200);
        assert_eq!(y.post("/increment", "").status, 200);
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while rt.is_open(x.id()) {
            rt.close_idle_now();
            assert!(std::time::Instant::now() < end, "x never closed");
            std::thread::sleep(Duration::from_millis(20));
            // y stays open: asked again as x closes.
            assert_eq!(y.get("/value").status, 200);
        }
        gate.0.store(true, Ordering::SeqCst);
        rt.faults()
            .unsafe_resume_unheld
            .store(unsafe_variant, Ordering::SeqCst);
        let opens = rt.metrics().phase_open.count();
        rt.resume_outbox(x.id());
        // y is open already: its request opens nothing, and runs after the
        // resume's turn.
        assert_eq!(y.get("/value").status, 200);
        let opened = rt.metrics().phase_open.count() - opens;
        assert_eq!(
            opened,
            u64::from(unsafe_variant),
            "unsafe variant: {unsafe_variant}"
        );
    }
}

/// A node lets go of its data directory at the end of its first shutdown
/// (ADR 0081); a second one (a cluster node's, after it released its
/// holds) changes nothing there, the folder being another node's to use
/// by then. Before, it cut the commit log again: a segment made and one
/// forgotten under the next node's log.
#[test]
fn a_second_shutdown_leaves_the_data_directory_alone() {
    let node = node();
    let x = node.actor("demo/examples/counter/x");
    assert_eq!(x.post("/increment", "").status, 200);
    let rt = node.runtime();
    let log = rt.config().data_dir.join("commit-log");
    let names = || {
        let mut n: Vec<String> = std::fs::read_dir(&log)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    };
    rt.shutdown(Duration::from_secs(1));
    let after_first = names();
    assert!(!after_first.is_empty(), "the node keeps a commit log");
    rt.shutdown(Duration::from_secs(1));
    assert_eq!(names(), after_first);
}

/// One tenant cannot take every socket of the node: past its own bound it
/// is refused, and another tenant still connects.
#[test]
fn sockets_past_a_tenants_bound_are_refused_and_another_tenant_still_connects() {
    let node = TestNode::with_config(|c| {
        c.sockets.per_tenant_max = 2;
        c.sockets.node_max = 10;
    });
    node.deploy("demo/examples", DEMO).unwrap();
    node.deploy("other/examples", DEMO).unwrap();
    let _a = chat_socket(&node, "demo/examples/chat/one").unwrap();
    let b = chat_socket(&node, "demo/examples/chat/two").unwrap();
    refused_naming(&node, "demo/examples/chat/three", "sockets_per_tenant_max");
    let _c = chat_socket(&node, "other/examples/chat/one").expect("another tenant still connects");
    // A closed socket frees its tenant's place.
    b.close(1000, "done");
    let _d = chat_socket(&node, "demo/examples/chat/three").expect("the place was freed");
}

/// A chat socket on `address`.
fn chat_socket<'a>(
    node: &'a TestNode,
    address: &str,
) -> Result<wasmkeep_testkit::TestSocket<'a>, wasmkeep_testkit::RuntimeError> {
    node.actor(address).websocket("/ws")
}

/// A chat socket on `address` is refused with `too_many_sockets`, naming
/// `limit`.
fn refused_naming(node: &TestNode, address: &str, limit: &str) {
    let e = chat_socket(node, address)
        .err()
        .expect("refused past the bound");
    assert_eq!(e.code(), "too_many_sockets", "{e}");
    assert!(e.to_string().contains(limit), "{e}");
}

#[test]
fn sockets_past_the_nodes_bound_are_refused_naming_it() {
    let node = TestNode::with_config(|c| c.sockets.node_max = 2);
    node.deploy("demo/examples", DEMO).unwrap();
    let _a = chat_socket(&node, "demo/examples/chat/one").unwrap();
    let _b = chat_socket(&node, "demo/examples/chat/two").unwrap();
    refused_naming(&node, "demo/examples/chat/three", "sockets_max");
}
