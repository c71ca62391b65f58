//! The durable outbox (ADR 0040) against the real runtime: the bundled
//! `pinger` class sends messages to other actors and HTTP calls to a
//! server on loopback. Each safety rule has a test that fails when the
//! rule is switched off (the `unsafe_*` faults).

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use wasmkeep_guests::DEMO;
use wasmkeep_testkit::TestNode;

fn node_with(f: impl FnOnce(&mut wasmkeep_runtime::RuntimeConfig)) -> TestNode {
    let node = TestNode::with_config(|c| {
        c.outbox.retry_first_ms = 5;
        c.outbox.retry_max_ms = 50;
        f(c)
    });
    node.deploy("demo/examples", DEMO).unwrap();
    node
}

fn node() -> TestNode {
    node_with(|_| {})
}

fn pongs(node: &TestNode, name: &str) -> serde_json::Value {
    node.actor(&format!("demo/examples/pinger/{name}"))
        .get("/pongs")
        .json()
}

fn stats(node: &TestNode, name: &str) -> serde_json::Value {
    node.actor(&format!("demo/examples/pinger/{name}"))
        .get("/stats")
        .json()
}

fn ping(node: &TestNode, from: &str, to: &str, n: u32) -> u16 {
    node.actor(&format!("demo/examples/pinger/{from}"))
        .post(&format!("/ping?to={to}&n={n}"), "")
        .status
}

#[test]
fn every_message_is_answered_once_and_applied_once() {
    let node = node();
    assert_eq!(ping(&node, "a", "b", 20), 200);
    // A cycle: b pings a while a's messages to b are in flight.
    assert_eq!(ping(&node, "b", "a", 7), 200);
    node.settle_outbox();
    let a = pongs(&node, "a");
    assert_eq!(
        a,
        serde_json::json!({"sent": 20, "answered": 20, "duplicates": 0})
    );
    let b = pongs(&node, "b");
    assert_eq!(
        b,
        serde_json::json!({"sent": 7, "answered": 7, "duplicates": 0})
    );
    assert_eq!(stats(&node, "b")["received"], 20);
    assert_eq!(stats(&node, "a")["received"], 7);
    let m = node.runtime().metrics();
    assert_eq!(m.outbox_taken_total.get(), 27);
    assert_eq!(m.outbox_answers_total.get(), 27);
    assert_eq!(m.outbox_pending.get(), 0, "every row taken was finished");
    // Answered rows are gone from the sender's outbox.
    assert_eq!(
        node.actor("demo/examples/pinger/a")
            .sql_i64("SELECT count(*) FROM _wasmkeep_outbox"),
        0
    );
}

#[test]
fn an_event_that_fails_sends_nothing() {
    let node = node();
    let e = node
        .actor("demo/examples/pinger/a")
        .request("POST", "/ping?to=b&n=3&fail=1", "")
        .unwrap_err();
    assert!(e.to_string().contains("asked_to_fail"), "{e}");
    assert_eq!(ping(&node, "a", "c", 1), 200);
    node.settle_outbox();
    assert_eq!(stats(&node, "c")["received"], 1);
    assert!(
        !node.actor("demo/examples/pinger/b").exists(),
        "the rolled-back sends never reached b"
    );
}

#[test]
fn unsafe_handing_over_before_the_commit_sends_for_a_failed_event() {
    let node = node();
    node.runtime()
        .faults()
        .unsafe_outbox_before_commit
        .store(true, Ordering::SeqCst);
    let e = node
        .actor("demo/examples/pinger/a")
        .request("POST", "/ping?to=b&n=3&fail=1", "")
        .unwrap_err();
    assert!(e.to_string().contains("asked_to_fail"), "{e}");
    node.settle_outbox();
    assert_eq!(
        stats(&node, "b")["received"],
        3,
        "without the rule, messages of an event that rolled back are delivered"
    );
}

#[test]
fn a_lost_answer_is_delivered_again_and_the_receiver_applies_it_once() {
    let node = node();
    node.runtime()
        .faults()
        .outbox_lose_answers
        .store(3, Ordering::SeqCst);
    assert_eq!(ping(&node, "a", "b", 5), 200);
    node.settle_outbox();
    assert_eq!(
        pongs(&node, "a"),
        serde_json::json!({"sent": 5, "answered": 5, "duplicates": 0})
    );
    assert_eq!(stats(&node, "b")["received"], 5);
    assert_eq!(stats(&node, "b")["received_twice"], 0);
}

#[test]
fn unsafe_without_the_inbox_check_a_repeated_delivery_is_applied_twice() {
    let node = node();
    let faults = node.runtime().faults();
    faults.unsafe_inbox_no_dedup.store(true, Ordering::SeqCst);
    faults.outbox_lose_answers.store(1, Ordering::SeqCst);
    assert_eq!(ping(&node, "a", "b", 2), 200);
    node.settle_outbox();
    assert_eq!(
        stats(&node, "b")["received_twice"],
        1,
        "without the rule, the redelivered message runs the handler again"
    );
}

#[test]
fn a_repeated_answer_is_applied_once() {
    let node = node();
    node.runtime()
        .faults()
        .outbox_repeat_responses
        .store(2, Ordering::SeqCst);
    assert_eq!(ping(&node, "a", "b", 3), 200);
    node.settle_outbox();
    assert_eq!(pongs(&node, "a")["duplicates"], 0);
    assert_eq!(pongs(&node, "a")["answered"], 3);
}

#[test]
fn unsafe_an_answer_that_keeps_its_row_is_applied_twice() {
    let node = node();
    let faults = node.runtime().faults();
    faults
        .unsafe_response_keeps_row
        .store(true, Ordering::SeqCst);
    faults.outbox_repeat_responses.store(1, Ordering::SeqCst);
    assert_eq!(ping(&node, "a", "b", 1), 200);
    node.settle_outbox();
    assert_eq!(
        pongs(&node, "a")["duplicates"],
        1,
        "without the rule, the repeated answer is applied again"
    );
}

#[test]
fn unsent_messages_survive_a_restart() {
    let mut node = node();
    node.hold_outbox(true);
    assert_eq!(ping(&node, "a", "b", 4), 200);
    // Held: nothing left before the restart. (After it the new runtime
    // delivers at once, so the rows are counted here, not after it: a
    // count after the restart raced with the first deliveries.)
    assert_eq!(
        node.actor("demo/examples/pinger/a")
            .sql_i64("SELECT count(*) FROM _wasmkeep_outbox"),
        4,
        "the rows are in the database"
    );
    assert_eq!(stats(&node, "b")["received"], 0, "nothing left while held");
    node.restart();
    node.settle_outbox();
    assert_eq!(
        pongs(&node, "a"),
        serde_json::json!({"sent": 4, "answered": 4, "duplicates": 0})
    );
    assert_eq!(stats(&node, "b")["received"], 4);
}

/// A small HTTP server on loopback: answers every request with `status`
/// and the request's `idempotency-key` as the body, after counting it.
struct Authority {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

fn authority(statuses: Vec<u16>) -> Authority {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        let mut statuses = statuses.into_iter();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut key = String::new();
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("idempotency-key:") {
                    key = v.trim().to_string();
                }
                if let Some(v) = lower.strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            log.lock().unwrap().push(key.clone());
            let status = statuses.next().unwrap_or(200);
            let answer = format!(
                "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{key}",
                key.len()
            );
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    Authority { port, seen }
}

fn http_node(manifest: &str, private_allowed: bool) -> TestNode {
    let node = TestNode::with_config(|c| {
        c.outbox.retry_first_ms = 5;
        c.outbox.retry_max_ms = 50;
        c.outbound.private_allowed = private_allowed;
    });
    node.deploy_with_manifest("demo/examples", DEMO, manifest)
        .unwrap();
    node
}

fn calls(node: &TestNode) -> Vec<serde_json::Value> {
    node.actor("demo/examples/pinger/a").get("/calls").json()["calls"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn an_allowed_call_is_answered_with_an_idempotency_key_and_retried_on_503() {
    let server = authority(vec![503, 200]);
    let node = http_node(
        &format!("[outbound]\nhosts = [\"127.0.0.1:{}\"]\n", server.port),
        true,
    );
    let r = node.actor("demo/examples/pinger/a").post(
        &format!("/fetch?url=http://127.0.0.1:{}/x", server.port),
        "",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    node.settle_outbox();
    let c = calls(&node);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0]["status"], 200);
    let key = c[0]["body"].as_str().unwrap().to_string();
    assert!(
        key.starts_with("demo/examples/pinger/a/") && key.ends_with("/1"),
        "sender, its outbox's life, and the row: {key}"
    );
    let seen = server.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![key.clone(), key],
        "the 503 was retried with the same key"
    );
}

#[test]
fn hosts_outside_the_allow_list_are_refused_at_send() {
    let server = authority(vec![]);
    let node = http_node("", true);
    let e = node
        .actor("demo/examples/pinger/a")
        .request(
            "POST",
            &format!("/fetch?url=http://127.0.0.1:{}/x", server.port),
            "",
        )
        .unwrap_err();
    assert_eq!(e.code(), "host_not_allowed", "{e}");
    node.settle_outbox();
    assert!(server.seen.lock().unwrap().is_empty());
}

#[test]
fn private_addresses_are_refused_unless_the_node_allows_them() {
    let server = authority(vec![]);
    let node = http_node(
        "[outbound]\nhosts = [\"127.0.0.1\", \"localhost\"]\n",
        false,
    );
    for url in [
        format!("http://127.0.0.1:{}/x", server.port),
        format!("http://localhost:{}/x", server.port),
    ] {
        let r = node
            .actor("demo/examples/pinger/a")
            .post(&format!("/fetch?url={url}"), "");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    node.settle_outbox();
    let c = calls(&node);
    assert_eq!(c.len(), 2);
    for call in &c {
        assert_eq!(call["code"], "address_forbidden", "{call}");
    }
    assert!(
        server.seen.lock().unwrap().is_empty(),
        "nothing reached loopback"
    );
}

#[test]
fn an_unreachable_host_fails_for_good_after_its_attempts() {
    // A port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let node = TestNode::with_config(|c| {
        c.outbox.retry_first_ms = 1;
        c.outbox.retry_max_ms = 2;
        c.outbox.attempts_max = 3;
        c.outbound.private_allowed = true;
    });
    node.deploy_with_manifest(
        "demo/examples",
        DEMO,
        &format!("[outbound]\nhosts = [\"127.0.0.1:{port}\"]\n"),
    )
    .unwrap();
    let r = node
        .actor("demo/examples/pinger/a")
        .post(&format!("/fetch?url=http://127.0.0.1:{port}/"), "");
    assert_eq!(r.status, 200);
    node.settle_outbox();
    let c = calls(&node);
    assert_eq!(c[0]["code"], "delivery_failed", "{c:?}");
    assert!(
        c[0]["body"].as_str().unwrap().contains("3 attempts"),
        "{c:?}"
    );
}

#[test]
fn messages_to_one_receiver_are_applied_in_the_order_they_were_sent() {
    let node = node();
    node.hold_outbox(true);
    assert_eq!(ping(&node, "a", "b", 30), 200);
    node.hold_outbox(false);
    node.settle_outbox();
    assert_eq!(stats(&node, "a")["failed"], 0);
    assert_eq!(pongs(&node, "a")["answered"], 30);
}

#[test]
fn unsafe_without_lanes_in_order_later_messages_make_earlier_ones_stale() {
    let node = node();
    node.runtime()
        .faults()
        .unsafe_lanes_reversed
        .store(true, Ordering::SeqCst);
    node.hold_outbox(true);
    assert_eq!(ping(&node, "a", "b", 5), 200);
    node.hold_outbox(false);
    node.settle_outbox();
    assert!(
        stats(&node, "a")["failed"].as_i64().unwrap() > 0,
        "without the order, the receiver refuses what arrives after a later message: {}",
        stats(&node, "a")
    );
}

#[test]
fn a_deleted_and_recreated_sender_is_not_taken_for_its_earlier_life() {
    let node = node();
    assert_eq!(ping(&node, "a", "b", 5), 200);
    node.settle_outbox();
    assert!(node.actor("demo/examples/pinger/a").delete_actor());
    // The new life numbers its messages from 1 again; b remembers 5 from
    // the earlier one.
    assert_eq!(ping(&node, "a", "b", 2), 200);
    node.settle_outbox();
    assert_eq!(
        pongs(&node, "a"),
        serde_json::json!({"sent": 2, "answered": 2, "duplicates": 0})
    );
    assert_eq!(stats(&node, "a")["failed"], 0);
}

#[test]
fn rows_that_do_not_fit_in_the_dispatcher_wait_in_their_database() {
    let node = node_with(|c| c.outbox.node_bytes_max = 3 * 1024);
    node.hold_outbox(true);
    for from in ["a", "c", "d", "e"] {
        assert_eq!(ping(&node, from, "b", 4), 200);
    }
    node.hold_outbox(false);
    node.settle_outbox();
    for from in ["a", "c", "d", "e"] {
        assert_eq!(
            pongs(&node, from),
            serde_json::json!({"sent": 4, "answered": 4, "duplicates": 0}),
            "{from}"
        );
    }
    assert_eq!(stats(&node, "b")["received"], 16);
    assert_eq!(node.runtime().outbox().bytes(), 0, "every byte given back");
}

/// A node with an in-memory bucket behind the fault-injecting store.
fn bucket_node(
    f: impl FnOnce(&mut wasmkeep_runtime::RuntimeConfig),
) -> (TestNode, Arc<wasmkeep_replica::testing::FaultStore>) {
    let (bucket, faults) = wasmkeep_replica::testing::memory_bucket();
    let node = node_with(move |c| {
        c.bucket = Some(bucket);
        f(c);
    });
    (node, faults)
}

/// Holds the next upload, sends, and reports what the receiver got while
/// the sender's commit was not in the bucket, then after it landed.
fn received_while_upload_held(
    node: &TestNode,
    faults: &wasmkeep_replica::testing::FaultStore,
) -> (i64, i64) {
    // Both actors exist and are in the bucket first.
    assert_eq!(ping(node, "a", "b", 1), 200);
    node.settle_outbox();
    let gate = faults.hold("");
    assert_eq!(ping(node, "a", "b", 3), 200);
    let io = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    io.block_on(gate.arrived());
    // The upload carrying the sends is held: give deliveries every chance.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let during = stats(node, "b")["received"].as_i64().unwrap();
    gate.release();
    node.settle_outbox();
    let after = stats(node, "b")["received"].as_i64().unwrap();
    (during, after)
}

#[test]
fn with_a_bucket_messages_leave_only_once_the_bucket_holds_their_commit() {
    let (node, faults) = bucket_node(|_| {});
    let (during, after) = received_while_upload_held(&node, &faults);
    assert_eq!(during, 1, "nothing left while the upload was held");
    assert_eq!(after, 4);
    assert_eq!(
        pongs(&node, "a"),
        serde_json::json!({"sent": 4, "answered": 4, "duplicates": 0})
    );
}

#[test]
fn unsafe_without_waiting_for_the_bucket_messages_leave_before_their_commit_is_in_it() {
    let (node, faults) = bucket_node(|_| {});
    node.runtime()
        .faults()
        .unsafe_outbox_before_upload
        .store(true, Ordering::SeqCst);
    let (during, _) = received_while_upload_held(&node, &faults);
    // At least the first of the three arrives (the next ones wait in their
    // lane for its answer, which b's own upload holds up).
    assert!(
        during > 1,
        "without the rule, a message left before the upload landed"
    );
}

#[test]
fn a_parked_reply_is_completed_by_the_event_that_applies_another_actors_answer() {
    let node = node();
    // client -> a -> b -> a answers the client, without holding a's turn:
    // a serves other requests meanwhile.
    let r = node.actor("demo/examples/pinger/a").post("/relay?to=b", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().starts_with("relayed: pong relay-"), "{}", r.text());
    assert_eq!(stats(&node, "b")["received"], 1);
    assert_eq!(node.runtime().parked_replies(), 0);
    assert_eq!(node.runtime().metrics().parked_replies.get(), 0);
}

#[test]
fn a_parked_reply_nobody_completes_expires_with_a_clear_error() {
    let node = node();
    let e = node
        .actor("demo/examples/pinger/a")
        .request("POST", "/park?ms=50", "")
        .unwrap_err();
    assert_eq!(e.code(), "reply_expired", "{e}");
    assert_eq!(node.runtime().parked_replies(), 0);
}

#[test]
fn parking_past_its_bound_is_refused_naming_it() {
    let node = node_with(|c| c.parked.reply_ms_max = 1_000);
    let e = node
        .actor("demo/examples/pinger/a")
        .request("POST", "/park?ms=5000", "")
        .unwrap_err();
    assert!(e.to_string().contains("parked_reply_ms_max"), "{e}");
}

/// One tenant cannot take every place for parked replies: past its own
/// bound a park is refused, while another tenant still parks.
#[test]
fn parking_past_a_tenants_bound_is_refused_and_another_tenant_still_parks() {
    let node = Arc::new(node_with(|c| {
        c.parked.per_tenant_max = 1;
        c.parked.node_max = 10;
    }));
    node.deploy("other/examples", DEMO).unwrap();
    let parked = park_on_a_thread(&node, "demo/examples/pinger/a");
    let e = node
        .actor("demo/examples/pinger/b")
        .request("POST", "/park?ms=20000", "")
        .unwrap_err();
    assert_eq!(e.code(), "too_many_parked", "{e}");
    assert!(e.to_string().contains("parked_per_tenant_max"), "{e}");
    // Another tenant parks (and, nobody completing it, hears it expired).
    let e = node
        .actor("other/examples/pinger/a")
        .request("POST", "/park?ms=100", "")
        .unwrap_err();
    assert_eq!(e.code(), "reply_expired", "parked, then expired: {e}");
    let r = node
        .actor("demo/examples/pinger/a")
        .post("/complete-parked", "");
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(parked.join().unwrap().unwrap().status, 200);
    // The completed reply gave its tenant's place back.
    let e = node
        .actor("demo/examples/pinger/b")
        .request("POST", "/park?ms=100", "")
        .unwrap_err();
    assert_eq!(e.code(), "reply_expired", "parked again, then expired: {e}");
}

#[test]
fn a_later_request_completes_a_parked_reply() {
    let node = Arc::new(node());
    let parked = park_on_a_thread(&node, "demo/examples/pinger/a");
    let r = node
        .actor("demo/examples/pinger/a")
        .post("/complete-parked", "");
    assert_eq!(r.status, 204, "{}", r.text());
    let answer = parked.join().unwrap().unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.text(), "completed by a later request");
}

/// A request to `address` that parks its reply for 20 s, on a thread of
/// its own; returns once the node holds one more parked reply.
fn park_on_a_thread(
    node: &Arc<TestNode>,
    address: &str,
) -> std::thread::JoinHandle<Result<wasmkeep_testkit::TestResponse, wasmkeep_testkit::RuntimeError>>
{
    let before = node.runtime().parked_replies();
    let parked = {
        let (node, address) = (Arc::clone(node), address.to_owned());
        std::thread::spawn(move || node.actor(&address).request("POST", "/park?ms=20000", ""))
    };
    wait_until(|| node.runtime().parked_replies() == before + 1);
    parked
}

fn wait_until(mut f: impl FnMut() -> bool) {
    for _ in 0..4_000 {
        if f() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("timed out");
}

/// The completing event fails: its completion goes with its writes.
fn relay_whose_completion_fails(node: &TestNode) -> Result<String, String> {
    node.actor("demo/examples/pinger/a")
        .request("POST", "/relay?to=b&fail=1&ms=500", "")
        .map(|r| r.text())
        .map_err(|e| e.code())
}

#[test]
fn a_completion_from_an_event_that_fails_is_not_sent() {
    let node = node();
    assert_eq!(
        relay_whose_completion_fails(&node),
        Err("reply_expired".into())
    );
}

#[test]
fn unsafe_a_completion_kept_from_a_failed_event_answers_the_client() {
    let node = node();
    node.runtime()
        .faults()
        .unsafe_completions_from_failed_events
        .store(true, Ordering::SeqCst);
    let r = relay_whose_completion_fails(&node);
    assert!(
        r.as_deref().is_ok_and(|t| t.starts_with("relayed: ")),
        "without the rule, the rolled-back event answered: {r:?}"
    );
}

#[test]
fn unsent_messages_move_with_the_actor_restored_on_another_node() {
    let (bucket, _faults) = wasmkeep_replica::testing::memory_bucket();
    let first = {
        let bucket = bucket.clone();
        node_with(move |c| c.bucket = Some(bucket))
    };
    first.hold_outbox(true);
    // `replicated`: answered once the bucket holds the sends.
    let r = first
        .actor("demo/examples/pinger/a")
        .request_with_headers(
            "POST",
            "/ping?to=b&n=3",
            &[("wasmkeep-durability", "replicated")],
            "",
        )
        .unwrap();
    assert_eq!(r.status, 200);
    // The node is gone before it delivered anything.
    first.runtime().shutdown(std::time::Duration::from_secs(5));
    assert_eq!(
        first.runtime().outbox().counts().0,
        0,
        "nothing was answered"
    );

    // Another node, empty, on the same bucket: the actor's first event
    // restores it, and its outbox goes out from there.
    let second = node_with(move |c| c.bucket = Some(bucket));
    assert_eq!(pongs(&second, "a")["sent"], 3);
    second.settle_outbox();
    assert_eq!(
        pongs(&second, "a"),
        serde_json::json!({"sent": 3, "answered": 3, "duplicates": 0})
    );
    assert_eq!(stats(&second, "b")["received"], 3);
}

/// A server on loopback that accepts connections and never answers.
fn silent_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    port
}

/// Eight actors of tenant `evil` call a server that never answers; then
/// `good` calls one that does. Returns whether good's call was answered
/// within 10 s (a bound for the test, not a timing).
fn good_call_answered_beside_eight_stuck_ones(tenant_share_pct: u8) -> bool {
    let (silent, fast) = (silent_server(), authority(vec![]));
    let node = TestNode::with_config(|c| {
        c.outbox.in_flight_max = 8;
        c.outbound.private_allowed = true;
        c.outbound.timeout_ms_max = 120_000;
        c.tenant_share_pct = tenant_share_pct;
    });
    for (tenant, port) in [("evil", silent), ("good", fast.port)] {
        let manifest = format!("[outbound]\nhosts = [\"127.0.0.1:{port}\"]\ntimeout_ms = 120000\n");
        node.deploy_with_manifest(&format!("{tenant}/examples"), DEMO, &manifest)
            .unwrap();
    }
    for i in 0..8 {
        let r = node
            .actor(&format!("evil/examples/pinger/e{i}"))
            .post(&format!("/fetch?url=http://127.0.0.1:{silent}/x"), "");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let good = node.actor("good/examples/pinger/g");
    let r = good.post(&format!("/fetch?url=http://127.0.0.1:{}/y", fast.port), "");
    assert_eq!(r.status, 200, "{}", r.text());
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < until {
        let calls = good.get("/calls").json();
        if calls["calls"].as_array().is_some_and(|c| !c.is_empty()) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

#[test]
fn a_tenant_holds_at_most_its_share_of_the_nodes_deliveries() {
    assert!(
        good_call_answered_beside_eight_stuck_ones(25),
        "another tenant's stuck calls held every delivery of the node"
    );
}

#[test]
fn unsafe_without_a_tenants_share_its_stuck_calls_hold_every_delivery() {
    assert!(
        !good_call_answered_beside_eight_stuck_ones(100),
        "served without the share: the test above could not fail"
    );
}
