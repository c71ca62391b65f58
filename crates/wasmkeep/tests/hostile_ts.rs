//! Hostile JavaScript against a real node (issue 35): the TypeScript
//! attacker (`examples/ts-hostile`, tenant `evil`) loops forever, recurses
//! without end, builds a 2 GiB string and allocates until memory runs out.
//! Each attack ends with its named error, at the limits a Rust guest has
//! (a 2 GiB string earlier: QuickJS's strings are shorter than that),
//! while the neighbouring tenant (`good`, the Rust demo's `counter`) keeps
//! counting, and the attacker's actor serves again afterwards.

mod common;

use common::Node;
use common::hostile::*;
use wasmkeep_guests::HOSTILE_TS;

/// A node whose attacker tenant runs the TypeScript attacker.
fn start_ts(tmp: &std::path::Path, config: &str) -> Node {
    let node = start(tmp, config);
    let (s, v) = node.deploy("evil/x", HOSTILE_TS);
    assert_eq!(s, 200, "deploy the TypeScript attacker: {v}");
    node
}

#[test]
fn an_infinite_loop_in_javascript_ends_at_the_cpu_deadline() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start_ts(tmp.path(), BASE);
    let (s, v) = with_neighbour(&node, "n", || attack(&node, "spin", "/spin", b""));
    assert_eq!((s, attack_code(&v)), (500, "cpu_time_exceeded"), "{v}");
    assert!(attack_message(&v).contains("event_cpu_ms_max"), "{v}");
    assert_attacker_serves(&node, "spin");
    assert_alive(&node);
}

#[test]
fn unbounded_recursion_traps_as_in_rust_and_a_2_gib_string_ends_with_the_engines_error() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start_ts(tmp.path(), BASE);
    with_neighbour(&node, "n", || {
        // The guest's stack is the node's (max_wasm_stack), as for Rust.
        let (s, v) = attack(&node, "r", "/recurse", b"");
        assert_eq!((s, attack_code(&v)), (500, "guest_trap"), "{v}");
        let (s, v) = attack(&node, "b", "/big-string", b"");
        assert_eq!((s, attack_code(&v)), (500, "guest_error"), "{v}");
        assert!(attack_message(&v).contains("RangeError"), "{v}");
    });
    assert_attacker_serves(&node, "r");
    assert_attacker_serves(&node, "b");
    assert_alive(&node);
}

#[test]
fn a_javascript_memory_bomb_ends_with_memory_exceeded_at_the_instance_cap() {
    let tmp = tempfile::tempdir().unwrap();
    let cap: u64 = 64 << 20;
    let node = start_ts(
        tmp.path(),
        &format!("{BASE}instance_memory_bytes_max = {cap}\n"),
    );
    let (s, v) = with_neighbour(&node, "n", || attack(&node, "m", "/memory-bomb", b""));
    // The engine catches the refused growth and throws its own "out of
    // memory"; the node names its own limit, whatever the guest made of it.
    assert_eq!((s, attack_code(&v)), (500, "memory_exceeded"), "{v}");
    assert!(attack_message(&v).contains(&cap.to_string()), "{v}");
    assert_attacker_serves(&node, "m");
    assert_alive(&node);
}

#[test]
fn a_handler_that_would_wait_on_the_network_gets_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start_ts(tmp.path(), BASE);
    let (s, v) = attack(&node, "a", "/async", b"");
    assert_eq!(s, 500, "{v}");
    let m = attack_message(&v);
    assert!(m.contains("async_handler") && m.contains("outbox"), "{v}");
    let (s, v) = attack(&node, "f", "/fetch", b"");
    assert_eq!(s, 500, "{v}");
    let m = attack_message(&v);
    assert!(
        m.contains("fetch_unsupported") && m.contains("outbox.fetch"),
        "{v}"
    );
    assert_attacker_serves(&node, "a");
    assert_alive(&node);
}
