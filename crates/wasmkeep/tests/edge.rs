//! The HTTP edge under hostile clients, against a real node (with the
//! bundled examples deployed) and real sockets: a head sent a byte at a
//! time, sockets opened and left silent, connections whose handlers all
//! wait on bodies, a body that trickles, a kept-alive connection left idle.
//! Each is cut off or refused, and the node answers others again
//! afterwards.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Node, raw_http, raw_status};

/// Starts a node with `settings` as its configuration file.
fn start(tmp: &std::path::Path, settings: &str) -> Node {
    start_without(tmp, settings, "")
}

/// Starts a node with `settings`, and the edge rules named in `rules`
/// switched off (`WASMKEEP_UNSAFE`: the unsafe variants).
fn start_without(tmp: &std::path::Path, settings: &str, rules: &str) -> Node {
    std::fs::create_dir_all(tmp).unwrap();
    let cfg = tmp.join("node.toml");
    std::fs::write(&cfg, settings).unwrap();
    Node::start_env(
        &tmp.join("data"),
        &["--examples", "--config", cfg.to_str().unwrap()],
        &[("WASMKEEP_UNSAFE", rules.to_owned())],
    )
}

/// Whether the node left `s` open for `wait` (it sent nothing and did not
/// close it).
fn still_open_after(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut byte = [0u8; 1];
    matches!(s.read(&mut byte), Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

fn healthz(node: &Node) -> String {
    raw_http(
        node.addr(),
        "GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n",
    )
}

/// Polls `healthz` until it answers 200: a closed socket frees its slot
/// once the node has seen it close, which is not at once.
fn until_healthy(node: &Node) -> String {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let a = healthz(node);
        if raw_status(&a) == 200 || Instant::now() > end {
            return a;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Opens `n` connections whose handlers all run: each sends the head of a
/// request to a counter announcing a body it never sends, so its handler
/// waits on the body (for `body_read_timeout_ms`, 20 s by default). A
/// connection running a handler is never closed for a new one.
fn busy_connections(node: &Node, n: usize) -> Vec<TcpStream> {
    let conns: Vec<TcpStream> = (0..n)
        .map(|i| {
            let mut s = TcpStream::connect(node.addr()).unwrap();
            write!(
                s,
                "POST /v1/demo/examples/counter/busy{i}/increment HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 1000\r\n\r\n"
            )
            .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    conns
}

/// Reads until the node closes the connection (or 60 s pass); what it sent.
fn read_until_closed(s: &mut TcpStream) -> (String, bool) {
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut out = Vec::new();
    let closed = match s.read_to_end(&mut out) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

#[test]
fn a_head_sent_a_byte_at_a_time_is_cut_off_and_frees_its_slot() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(
        tmp.path(),
        "connections_max = 1\nparked_replies_max = 0\nheader_read_timeout_ms = 1500\nidle_timeout_ms = 600000\n",
    );
    let mut slow = TcpStream::connect(node.addr()).unwrap();
    let head =
        b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nx-padding: aaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let mut w = slow.try_clone().unwrap();
        let done = Arc::clone(&done);
        // One byte every 200 ms: the head would take 14 s.
        std::thread::spawn(move || {
            for b in head {
                if w.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    // No other client comes: a new connection would take the slow head's
    // place (it runs no handler), which is not the rule tested here.
    let (answer, closed) = read_until_closed(&mut slow);
    assert!(closed, "the slow head was never cut off");
    assert!(
        !done.load(Ordering::SeqCst),
        "the head was complete before the node closed"
    );
    assert!(answer.is_empty(), "the slow head got an answer: {answer}");
    writer.join().unwrap();
    let a = until_healthy(&node);
    assert_eq!(raw_status(&a), 200, "the cut connection kept its slot: {a}");
}

#[test]
fn past_connections_max_a_connection_gets_503_with_retry_after_and_fds_stay_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(
        tmp.path(),
        "connections_max = 4\nparked_replies_max = 0\ntenant_share_pct = 100\nheader_read_timeout_ms = 600000\nidle_timeout_ms = 600000\n",
    );
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", node.pid()))
            .unwrap()
            .count()
    };
    let before = fds();
    let busy = busy_connections(&node, 4);
    let answer = healthz(&node);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert_eq!(raw_status(head), 503, "{answer}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(common::code(&v), "node_overloaded");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("connections_max=4")
    );

    // A flood of silent sockets past the cap: the node's descriptors stay
    // within the cap plus the answers being sent (64) and some slack.
    let flood: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect(node.addr()).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let during = fds();
    assert!(
        during <= before + 4 + 64 + 8,
        "descriptors grew without bound: {before} -> {during} with {} sockets",
        flood.len()
    );
    drop(flood);
    drop(busy);
    let a = until_healthy(&node);
    assert_eq!(raw_status(&a), 200, "the node did not recover: {a}");
}

#[test]
fn a_body_slower_than_the_floor_gets_408_and_a_steady_one_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(
        tmp.path(),
        "body_read_timeout_ms = 1000\nbody_read_bytes_per_s_min = 1000\n",
    );
    // Sends a head for `len` bytes, then chunks of `chunk` bytes every
    // `pause_ms` until `len` or 100 chunks are sent, while another thread
    // reads the answer as soon as it comes (before a later chunk meets a
    // closed socket and resets the connection).
    let send = |len: usize, chunk: usize, pause_ms: u64| {
        let mut s = TcpStream::connect(node.addr()).unwrap();
        write!(
            s,
            "POST /v1/demo/examples/counter/n/increment HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
        )
        .unwrap();
        let mut r = s.try_clone().unwrap();
        let reader = std::thread::spawn(move || read_until_closed(&mut r));
        let mut sent = 0;
        while sent < len && sent < 100 * chunk && !reader.is_finished() {
            if s.write_all(&vec![b'x'; chunk]).is_err() {
                break;
            }
            sent += chunk;
            std::thread::sleep(Duration::from_millis(pause_ms));
        }
        reader.join().unwrap()
    };
    // 10 bytes every 200 ms (50 B/s) of 100 kB: cut once the grace second
    // and the seconds its bytes earned are spent.
    let (answer, closed) = send(100_000, 10, 200);
    assert!(closed);
    assert_eq!(raw_status(&answer), 408, "{answer}");
    assert!(
        answer.contains("\"body_timeout\"") && answer.contains("body_read_bytes_per_s_min=1000")
    );
    // 4 kB at 2 kB/s outlasts the grace second but keeps above the floor:
    // the counter is incremented.
    let (answer, _) = send(4000, 500, 250);
    assert_eq!(raw_status(&answer), 200, "{answer}");
}

#[test]
fn an_idle_kept_alive_connection_is_closed_and_shutdown_does_not_wait_for_silent_clients() {
    let tmp = tempfile::tempdir().unwrap();
    let mut node = start(
        tmp.path(),
        "idle_timeout_ms = 1000\nheader_read_timeout_ms = 600000\nshutdown_drain_ms = 1000\n",
    );
    let mut s = TcpStream::connect(node.addr()).unwrap();
    // The node's watchdog first waits toward the (ten-minute) head
    // deadline; the request must bring the idle deadline forward.
    std::thread::sleep(Duration::from_millis(200));
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let (answer, closed) = read_until_closed(&mut s);
    assert!(closed, "the idle kept-alive connection stayed open");
    assert_eq!(raw_status(&answer), 200, "{answer}");
    // A client in the middle of a head when the node stops does not hold it
    // up past the drain time (its head timeout is ten minutes here).
    let mut partial = TcpStream::connect(node.addr()).unwrap();
    partial
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: 127")
        .unwrap();
    let mut silent = TcpStream::connect(node.addr()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let stopped = node.stop_within(Duration::from_secs(60));
    assert!(
        stopped.is_some_and(|s| s.success()),
        "the node waited for a client past the drain time: {stopped:?}"
    );
    let (_, closed) = read_until_closed(&mut silent);
    assert!(closed);
}

/// The unsafe variants of the rules above (`WASMKEEP_UNSAFE`), each
/// against the attack of its test: without the head and idle timeouts a
/// slow head and an idle connection hold their slots past twice the
/// timeout; without the cap a connection past `connections_max` is
/// served; without the body pace a trickling body is never cut off.
#[test]
fn without_their_rules_the_edge_attacks_get_through() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start_without(
        &tmp.path().join("timeouts"),
        "connections_max = 1\nparked_replies_max = 0\nheader_read_timeout_ms = 1000\nidle_timeout_ms = 1000\n",
        "no_head_or_idle_timeouts",
    );
    let mut slow = TcpStream::connect(node.addr()).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127")
        .unwrap();
    assert!(
        still_open_after(&mut slow, Duration::from_millis(2500)),
        "the head was cut off without its rule"
    );
    slow.write_all(b".0.0.1\r\n\r\n").unwrap();
    let mut head = [0u8; 12];
    slow.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let mut rest = [0u8; 4096];
    let _ = slow.read(&mut rest);
    assert!(
        still_open_after(&mut slow, Duration::from_millis(2500)),
        "the idle connection was closed without its rule"
    );
    drop(slow);
    drop(node);

    let node = start_without(
        &tmp.path().join("cap"),
        "connections_max = 4\nparked_replies_max = 0\ntenant_share_pct = 100\nheader_read_timeout_ms = 600000\nidle_timeout_ms = 600000\n",
        "no_connection_cap",
    );
    let busy = busy_connections(&node, 8);
    let answer = healthz(&node);
    assert_eq!(raw_status(&answer), 200, "{answer}");
    drop(busy);
    drop(node);

    let node = start_without(
        &tmp.path().join("pace"),
        "body_read_timeout_ms = 1000\nbody_read_bytes_per_s_min = 1000\n",
        "no_body_pace",
    );
    let mut s = TcpStream::connect(node.addr()).unwrap();
    s.write_all(
        b"POST /v1/demo/examples/counter/n/increment HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 100000\r\nconnection: close\r\n\r\n",
    )
    .unwrap();
    // 10 bytes every 200 ms for 3 s: the safe node cuts it after about 1 s.
    for _ in 0..15 {
        s.write_all(&[b'x'; 10]).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        still_open_after(&mut s, Duration::from_millis(100)),
        "the trickling body was cut off without its rule"
    );
}
