//! The second seed's LivePresence object (the bundled class `presence`)
//! against the real runtime, with the authority it asks on loopback: a
//! small HTTP server whose answers each test scripts (`timeout`,
//! `answered`, `declined`, `inactive`, `pending`, a failure, or a hang
//! released by the test).
//!
//! Both of the seed's shapes run where its input gate was open: between
//! the alarm's authority call and its answer, which in wasmkeep are two
//! events. Each safety rule has a test that fails with the rule removed
//! (`PRESENCE_UNSAFE`), as the seed's authors proved theirs.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasmkeep_guests::DEMO;
use wasmkeep_testkit::TestNode;

const TOKEN: &str = "authority-token-4411";
const RING_MS: u64 = 150_000;
const WATCH_STEP_MS: u64 = 5 * 60 * 1000;
const WATCH_TTL_MS: u64 = 60 * 60 * 1000;
const MAX_EVALUATED: usize = 24;

/// What the authority does with the next `/settle`.
enum Plan {
    Say(&'static str),
    Fail,
    /// Waits for the test to say what to answer.
    Hang(mpsc::Receiver<&'static str>),
}

#[derive(Clone, Default)]
struct Seen {
    settles: Arc<Mutex<Vec<String>>>,
    notifies: Arc<Mutex<Vec<String>>>,
    unauthorized: Arc<Mutex<u32>>,
}

struct Authority {
    port: u16,
    plans: Arc<Mutex<VecDeque<Plan>>>,
    seen: Seen,
}

impl Authority {
    fn start() -> Authority {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let plans: Arc<Mutex<VecDeque<Plan>>> = Arc::default();
        let seen = Seen::default();
        let (p, s) = (Arc::clone(&plans), seen.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (p, s) = (Arc::clone(&p), s.clone());
                std::thread::spawn(move || serve(stream, &p, &s));
            }
        });
        Authority { port, plans, seen }
    }

    fn plan(&self, p: Plan) {
        self.plans.lock().unwrap().push_back(p);
    }

    /// A hang for the next `/settle`, and the sender that ends it.
    fn hang(&self) -> mpsc::Sender<&'static str> {
        let (tx, rx) = mpsc::channel();
        self.plan(Plan::Hang(rx));
        tx
    }

    fn settles(&self) -> usize {
        self.seen.settles.lock().unwrap().len()
    }

    fn notifies(&self) -> Vec<String> {
        self.seen.notifies.lock().unwrap().clone()
    }
}

fn serve(mut stream: std::net::TcpStream, plans: &Mutex<VecDeque<Plan>>, seen: &Seen) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut first = String::new();
    if reader.read_line(&mut first).unwrap_or(0) == 0 {
        return;
    }
    let path = first.split_whitespace().nth(1).unwrap_or("").to_string();
    let (mut length, mut authorized) = (0usize, false);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if line.trim_end() == format!("authorization: Bearer {TOKEN}") {
            authorized = true;
        }
    }
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    let body = String::from_utf8_lossy(&body).into_owned();
    let answer = |status: u16, text: &str| {
        format!(
            "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
            text.len()
        )
    };
    let out = if !authorized {
        *seen.unauthorized.lock().unwrap() += 1;
        answer(401, "no credentials")
    } else if path == "/notify" {
        seen.notifies.lock().unwrap().push(body);
        answer(200, "ok")
    } else {
        seen.settles.lock().unwrap().push(body);
        let plan = plans.lock().unwrap().pop_front();
        match plan {
            None => answer(200, "pending"),
            Some(Plan::Say(w)) => answer(200, w),
            Some(Plan::Fail) => answer(500, "authority failed"),
            Some(Plan::Hang(rx)) => match rx.recv() {
                Ok(w) => answer(200, w),
                Err(_) => return,
            },
        }
    };
    let _ = stream.write_all(out.as_bytes());
}

/// A node with the examples deployed, the authority configured (its URL a
/// variable, its token a secret), and `unsafe_rules` in `PRESENCE_UNSAFE`.
fn node(authority: &Authority, unsafe_rules: &str) -> TestNode {
    let node = TestNode::with_config(|c| {
        c.outbound.private_allowed = true;
        c.outbox.retry_first_ms = 5;
        c.outbox.retry_max_ms = 50;
    });
    let manifest = format!(
        "[vars]\nAUTHORITY_URL = \"http://127.0.0.1:{port}\"\nPRESENCE_UNSAFE = \"{unsafe_rules}\"\n\n[outbound]\nhosts = [\"127.0.0.1:{port}\"]\n",
        port = authority.port
    );
    node.deploy_with_manifest("demo/examples", DEMO, &manifest)
        .unwrap();
    node.runtime()
        .secrets()
        .set("demo", "examples", "AUTHORITY_TOKEN", TOKEN)
        .unwrap();
    node
}

const ENV: &str = "demo/examples/presence/env";

fn rings(node: &TestNode) -> serde_json::Value {
    node.actor(ENV).get("/rings").json()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..2_000 {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("timed out waiting for {what}");
}

/// Claims `snap-booking`, lets it expire, and runs the alarm: the
/// authority call is out (and hangs) when this returns.
fn alarm_asking(node: &TestNode, authority: &Authority) -> mpsc::Sender<&'static str> {
    let release = authority.hang();
    assert_eq!(
        node.actor(ENV)
            .post("/claim?booking=snap-booking", "")
            .status,
        204
    );
    node.advance(Duration::from_millis(RING_MS));
    wait_for("the authority call", || authority.settles() == 1);
    release
}

/// The seed's first shape: a ring claimed for another booking while the
/// alarm waits for the authority survives, and the alarm's decision still
/// lands for the ring it evaluated (with the missed-call notification).
fn claim_during_the_call(unsafe_rules: &str) -> serde_json::Value {
    let authority = Authority::start();
    let node = node(&authority, unsafe_rules);
    let release = alarm_asking(&node, &authority);
    assert_eq!(
        node.actor(ENV)
            .post("/claim?booking=second-booking", "")
            .status,
        204
    );
    release.send("timeout").unwrap();
    node.settle_outbox();
    if unsafe_rules.is_empty() {
        assert_eq!(authority.notifies().len(), 1, "the missed call is notified");
        assert!(authority.notifies()[0].contains("missed-call"));
        assert_eq!(
            *authority.seen.unauthorized.lock().unwrap(),
            0,
            "the secret went along"
        );
    }
    rings(&node)
}

#[test]
fn a_ring_claimed_while_the_authority_call_is_out_survives() {
    let r = claim_during_the_call("");
    assert_eq!(r["second-booking"]["outcome"], "pending", "{r}");
    assert_eq!(r["snap-booking"]["outcome"], "timeout", "{r}");
}

#[test]
fn unsafe_writing_back_the_map_the_alarm_read_loses_the_ring_claimed_meanwhile() {
    let r = claim_during_the_call("stale_map");
    assert!(
        r.get("second-booking").is_none(),
        "the stale map erased it: {r}"
    );
}

/// The seed's second shape: a ring answered while the call is out is not
/// overwritten with the stale timeout (the authority's 'timeout' is the
/// conflict the seed staged on purpose).
fn answer_during_the_call(unsafe_rules: &str) -> serde_json::Value {
    let authority = Authority::start();
    let node = node(&authority, unsafe_rules);
    let release = alarm_asking(&node, &authority);
    assert_eq!(
        node.actor(ENV)
            .post("/answer?booking=snap-booking", "")
            .status,
        204
    );
    release.send("timeout").unwrap();
    node.settle_outbox();
    rings(&node)
}

#[test]
fn a_ring_answered_while_the_authority_call_is_out_keeps_its_answer() {
    let r = answer_during_the_call("");
    assert_eq!(r["snap-booking"]["outcome"], "answered", "{r}");
}

#[test]
fn unsafe_without_the_generation_check_the_stale_timeout_overwrites_the_answer() {
    // The fresh read kept, only the check removed: the seed's
    // "independently load-bearing" test.
    let r = answer_during_the_call("no_generation_check");
    assert_eq!(r["snap-booking"]["outcome"], "timeout", "{r}");
}

#[test]
fn every_authority_answer_is_applied_as_the_seed_says() {
    for (word, expect) in [
        ("timeout", Some("timeout")),
        ("answered", Some("answered")),
        ("declined", Some("declined")),
        ("inactive", None),
        ("pending", Some("pending")),
    ] {
        let authority = Authority::start();
        let node = node(&authority, "");
        authority.plan(Plan::Say(word));
        node.actor(ENV).post("/claim?booking=b", "");
        node.advance(Duration::from_millis(RING_MS));
        node.settle_outbox();
        let r = rings(&node);
        match expect {
            Some(o) => assert_eq!(r["b"]["outcome"], o, "{word}: {r}"),
            None => assert!(r.get("b").is_none(), "{word}: {r}"),
        }
        let notified = authority.notifies().len();
        assert_eq!(notified, usize::from(word == "timeout"), "{word}");
    }
}

#[test]
fn a_failed_or_pending_answer_records_nothing_and_asks_again_five_seconds_on() {
    let authority = Authority::start();
    let node = node(&authority, "");
    authority.plan(Plan::Fail);
    authority.plan(Plan::Fail);
    authority.plan(Plan::Fail);
    authority.plan(Plan::Say("pending"));
    authority.plan(Plan::Say("timeout"));
    node.actor(ENV).post("/claim?booking=b", "");
    node.advance(Duration::from_millis(RING_MS));
    node.settle_outbox();
    // A 500 is an answer the outbox delivers (it retries only 429 and
    // 502 to 504): the first round records nothing and re-arms.
    assert_eq!(rings(&node)["b"]["outcome"], "pending");
    let alarm = node.actor(ENV).get("/alarm").json()["alarm_ms"]
        .as_u64()
        .unwrap();
    assert_eq!(alarm, node.now_ms() + 5_000, "the retry candidate");
    for _ in 0..4 {
        node.advance(Duration::from_millis(5_000));
        node.settle_outbox();
    }
    assert_eq!(rings(&node)["b"]["outcome"], "timeout", "{}", rings(&node));
    assert_eq!(authority.settles(), 5);
}

/// A watch due in 60 s, then a ring claimed (expiring in 150 s), then a
/// second arrival pulling the watch to 30 s: the alarm after each step.
fn shared_alarm(unsafe_rules: &str) -> (u64, [Option<u64>; 3], serde_json::Value) {
    let authority = Authority::start();
    let node = node(&authority, unsafe_rules);
    let t0 = node.now_ms();
    node.actor(ENV)
        .post(&format!("/arrive?booking=w&due_ms={}", t0 + 60_000), "");
    let first = node.actor(ENV).alarm();
    node.actor(ENV).post("/claim?booking=r", "");
    let second = node.actor(ENV).alarm();
    node.actor(ENV)
        .post(&format!("/arrive?booking=w&due_ms={}", t0 + 30_000), "");
    let third = node.actor(ENV).alarm();
    let w = node.actor(ENV).get("/watches").json()["w"].clone();
    (t0, [first, second, third], w)
}

#[test]
fn rings_and_watches_share_the_alarm_and_neither_postpones_the_other() {
    let (t0, [first, second, third], w) = shared_alarm("");
    assert_eq!(first, Some(t0 + 60_000));
    assert_eq!(
        second,
        Some(t0 + 60_000),
        "a later ring expiry does not postpone the watch"
    );
    assert_eq!(
        third,
        Some(t0 + 30_000),
        "an earlier boundary pulls the alarm in"
    );
    assert_eq!(
        w["anchor_ms"],
        t0 + 60_000,
        "an earlier boundary buys no life: {w}"
    );
}

#[test]
fn unsafe_each_job_setting_the_alarm_for_itself_postpones_the_other() {
    let (t0, [_, second, _], _) = shared_alarm("own_job_alarm");
    assert_eq!(
        second,
        Some(t0 + RING_MS),
        "without the rule, the claim moved the alarm past the watch's boundary"
    );
}

/// A watch as an earlier version stored it: no anchor, and 5,000
/// boundaries a minute apart ending a minute before its due time.
fn grown_watch(node: &TestNode, due: u64) {
    let history: Vec<u64> = (1..=5_000u64).rev().map(|i| due - i * 60_000).collect();
    let fixture = serde_json::json!({ "old": { "due_ms": due, "evaluated": history } });
    let r = node.actor(ENV).put("/watches", fixture.to_string());
    assert_eq!(r.status, 204, "{}", r.text());
}

fn drain_grown_watch(unsafe_rules: &str) -> serde_json::Value {
    let authority = Authority::start();
    let node = node(&authority, unsafe_rules);
    let due = node.now_ms() + 60_000;
    grown_watch(&node, due);
    node.advance_to(due);
    node.actor(ENV).get("/watches").json()
}

#[test]
fn a_watch_stored_before_anchors_retires_at_its_first_drain() {
    // Its anchor is rebuilt from the untrimmed history: days old.
    let w = drain_grown_watch("");
    assert!(w.get("old").is_none(), "{w}");
}

#[test]
fn unsafe_an_anchor_taken_after_the_cap_keeps_a_grown_watch_alive() {
    let w = drain_grown_watch("anchor_from_tail");
    assert!(
        w.get("old").is_some(),
        "without the rule it looks young: {w}"
    );
    let kept = w["old"]["evaluated"].as_array().unwrap().len();
    assert!(kept <= MAX_EVALUATED, "it still writes small: {kept}");
}

/// Runs the alarm at every boundary, on time, until the watch is gone (or
/// 100 drains): the drains, and the longest history seen.
fn drain_until_gone(unsafe_rules: &str) -> (usize, usize, bool) {
    let authority = Authority::start();
    let node = node(&authority, unsafe_rules);
    let anchor = node.now_ms() + 3 * 60 * 1000;
    node.actor(ENV)
        .post(&format!("/arrive?booking=booking-1&due_ms={anchor}"), "");
    let (mut drains, mut longest) = (0, 0);
    loop {
        let w = node.actor(ENV).get("/watches").json()["booking-1"].clone();
        if w.is_null() || drains >= 100 {
            return (drains, longest, !w.is_null());
        }
        node.advance_to(w["due_ms"].as_u64().unwrap());
        drains += 1;
        let still = &node.actor(ENV).get("/watches").json()["booking-1"];
        if !still.is_null() {
            longest = longest.max(still["evaluated"].as_array().unwrap().len());
        }
    }
}

#[test]
fn a_watch_retires_an_hour_after_the_boundary_it_was_first_armed_for() {
    let (drains, longest, alive) = drain_until_gone("");
    assert!(!alive);
    assert_eq!(drains as u64, WATCH_TTL_MS / WATCH_STEP_MS + 2);
    assert!(
        longest < MAX_EVALUATED,
        "the anchor bounds the list: {longest}"
    );
}

#[test]
fn unsafe_measured_from_the_moving_deadline_a_watch_never_retires() {
    let (drains, longest, alive) = drain_until_gone("moving_deadline");
    assert!(alive, "still there after {drains} on-time drains");
    assert_eq!(longest, MAX_EVALUATED, "only the cap on read bounds it");
}
