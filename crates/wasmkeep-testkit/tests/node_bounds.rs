//! What a node bounds that is not one event's business (issue 17, item 8):
//! manifest limits under node ceilings, compiling hostile components,
//! compiled code from a cache others may write, guests' log lines, and a
//! worker that panics.

use std::sync::atomic::Ordering;
use std::time::Duration;

use wasmkeep_guests::forged::{EMPTY_MODULE, MEMORY_MODULE, TABLE_MODULE, instantiating};
use wasmkeep_guests::{HELLO, HOSTILE, TESTBED};
use wasmkeep_testkit::{RuntimeConfig, TestNode};

/// A node whose compiled code goes to a folder of its own (in its data
/// folder), so a test can tamper with it without touching other tests'.
fn node_with_own_cache(f: impl FnOnce(&mut RuntimeConfig)) -> TestNode {
    TestNode::with_config(|c| {
        c.compile_cache_dir = None;
        c.compile_cache_key_path = None;
        f(c)
    })
}

fn cache_dir(node: &TestNode) -> std::path::PathBuf {
    node.data_dir().join("cache")
}

/// The compiled code of the component with this hash, and its tag.
fn cached_files(node: &TestNode, hash: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let mut code = None;
    let mut tag = None;
    for e in std::fs::read_dir(cache_dir(node)).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(hash) && name.ends_with(".cwasm") {
            code = Some(e.path());
        }
        if name.starts_with(hash) && name.ends_with(".mac") {
            tag = Some(e.path());
        }
    }
    (code.expect("compiled code"), tag.expect("its tag"))
}

fn rejected(node: &TestNode) -> u64 {
    node.runtime().metrics().compile_cache_rejected_total.get()
}

#[test]
fn a_manifest_above_a_node_ceiling_is_refused_by_name_and_the_app_stays() {
    let node = TestNode::new();
    let before = node.deploy("t/bed", TESTBED).unwrap();
    let e = node
        .deploy_with_manifest("t/bed", HELLO, "[limits]\nevent_cpu_ms_max = 60000\n")
        .unwrap_err();
    assert_eq!(e.code(), "limit_above_node_ceiling");
    let says = e.to_string();
    assert!(
        says.contains("field=limits.event_cpu_ms_max value=60000 ceiling=30000"),
        "{says}"
    );
    assert_eq!(node.runtime().app("t", "bed").unwrap().hash, before.hash);
    // Lower is always fine.
    node.deploy_with_manifest("t/low", TESTBED, "[limits]\nevent_cpu_ms_max = 100\n")
        .unwrap();
    // An operator may let apps go higher than the node's own setting.
    let node = TestNode::with_config(|c| c.app_limit_ceilings.event_cpu_ms_max = Some(60_000));
    node.deploy_with_manifest("t/bed", TESTBED, "[limits]\nevent_cpu_ms_max = 60000\n")
        .unwrap();
}

/// An app deployed under a ceiling that the operator lowered since keeps
/// loading at start-up, with its limit clamped to the ceiling (not
/// refused: see `app::OverCeiling`).
#[test]
fn an_app_above_a_lowered_ceiling_is_clamped_at_restart() {
    let mut node = TestNode::with_config(|c| {
        c.event_cpu_ms_max = 200;
        c.app_limit_ceilings.event_cpu_ms_max = Some(20_000);
    });
    node.deploy_with_manifest("t/bed", TESTBED, "[limits]\nevent_cpu_ms_max = 20000\n")
        .unwrap();
    node.restart_with_config(|c| c.app_limit_ceilings.event_cpu_ms_max = None);
    let e = node
        .actor("t/bed/probe/a")
        .request("POST", "/loop", "")
        .unwrap_err();
    assert_eq!(e.code(), "cpu_time_exceeded");
    assert!(e.to_string().ends_with("event_cpu_ms_max=200"), "{e}");
}

#[test]
fn a_component_with_more_memories_tables_or_instances_than_allowed_is_refused() {
    let node = TestNode::new();
    let c = node.runtime().config().clone();
    let cases = [
        (
            "component_memories_max",
            MEMORY_MODULE,
            c.component_memories_max,
        ),
        ("component_tables_max", TABLE_MODULE, c.component_tables_max),
        (
            "component_core_instances_max",
            EMPTY_MODULE,
            c.component_core_instances_max,
        ),
    ];
    for (setting, module, max) in cases {
        let over = instantiating(module, max as usize + 1);
        let e = node.deploy("t/many", &over).unwrap_err();
        assert_eq!(e.code(), "invalid_component", "{setting}: {e}");
        assert!(e.to_string().contains(setting), "{setting}: {e}");
        // At the bound it compiles, and fails later for what it lacks.
        let at = instantiating(module, max as usize);
        let e = node.deploy("t/many", &at).unwrap_err();
        assert!(e.to_string().contains("does not export"), "{setting}: {e}");
    }
}

/// Compiling cannot be cancelled: past `component_compile_ms_max` the
/// deploy is answered and the node serves on, while the compilation ends
/// by itself in the background.
#[test]
fn a_compilation_past_its_deadline_is_refused_and_the_node_serves_on() {
    let mut node = node_with_own_cache(|_| {});
    node.deploy("t/hello", HELLO).unwrap();
    node.restart_with_config(|c| c.component_compile_ms_max = 1);
    // Compiled and tagged before: loaded, not compiled.
    assert_eq!(
        node.actor("t/hello/counter/a")
            .post("/increment", "")
            .status,
        200
    );
    let e = node.deploy("t/bed", TESTBED).unwrap_err();
    assert_eq!(e.code(), "compile_timeout", "{e}");
    assert!(e.to_string().ends_with("component_compile_ms_max=1"), "{e}");
    assert!(node.runtime().app("t", "bed").is_none());
    assert_eq!(
        node.actor("t/hello/counter/a")
            .post("/increment", "")
            .status,
        200
    );
}

/// The attack: a writer of a shared cache folder plants valid code of
/// another component under this one's name, tag and all.
fn plant_hello_under_testbed(trust_cache: bool) -> (Vec<String>, u64, TestNode) {
    let node = node_with_own_cache(|_| {});
    let hello = node.deploy("t/hello", HELLO).unwrap();
    let bed = node.deploy("t/bed", TESTBED).unwrap();
    let (hello_code, hello_tag) = cached_files(&node, &hello.hash);
    let (bed_code, bed_tag) = cached_files(&node, &bed.hash);
    std::fs::copy(hello_code, bed_code).unwrap();
    std::fs::copy(hello_tag, bed_tag).unwrap();
    node.runtime()
        .faults()
        .unsafe_trust_compile_cache
        .store(trust_cache, Ordering::SeqCst);
    let again = node.deploy("t/bed2", TESTBED).unwrap();
    (again.classes, rejected(&node), node)
}

#[test]
fn compiled_code_planted_under_another_components_name_is_compiled_again() {
    let (classes, rejected, node) = plant_hello_under_testbed(false);
    assert_eq!(classes, ["probe"]);
    assert_eq!(rejected, 1);
    assert_eq!(node.actor("t/bed2/probe/a").post("/write", "").status, 204);
}

/// The unsafe variant (no tag checked) loads the planted code: the test
/// above would fail without the check.
#[test]
fn without_the_check_planted_code_is_loaded() {
    let (classes, _, _) = plant_hello_under_testbed(true);
    assert_eq!(classes, ["counter"], "the planted component's classes");
}

#[test]
fn tampered_compiled_code_is_compiled_again_at_restart_and_the_app_works() {
    let mut node = node_with_own_cache(|_| {});
    let bed = node.deploy("t/bed", TESTBED).unwrap();
    let (code, _) = cached_files(&node, &bed.hash);
    let mut bytes = std::fs::read(&code).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&code, &bytes).unwrap();
    node.restart();
    assert_eq!(rejected(&node), 1);
    assert_eq!(node.actor("t/bed/probe/a").post("/write", "").status, 204);
    // What the node compiled again was cached with a good tag.
    node.restart();
    assert_eq!(rejected(&node), 0);
    assert_ne!(std::fs::read(&code).unwrap(), bytes);
}

fn dropped_lines(node: &TestNode) -> u64 {
    node.runtime().metrics().guest_log_lines_dropped_total.get()
}

#[test]
fn a_guest_flooding_the_log_has_its_lines_dropped_past_the_budget() {
    let node = TestNode::with_config(|c| {
        c.event_log_lines_max = 100;
        c.event_log_bytes_max = 4000;
    });
    node.deploy("t/hostile", HOSTILE).unwrap();
    let a = node.actor("t/hostile/attacker/a");
    // Line i is `hostile flood {i} ` and `bytes` x's. With none, the first
    // 100 lines take 1,690 bytes: the line budget runs out first.
    assert_eq!(a.post("/log-flood?lines=1000&bytes=0", "").status, 200);
    assert_eq!(dropped_lines(&node), 900);
    // With 100 x's, 10 lines of 116 bytes and 24 of 117 fit in 4,000
    // bytes; the other 16 are dropped.
    assert_eq!(a.post("/log-flood?lines=50&bytes=100", "").status, 200);
    assert_eq!(dropped_lines(&node), 900 + 16);
    // Each call starts with a full budget.
    assert_eq!(a.post("/log-flood?lines=5&bytes=0", "").status, 200);
    assert_eq!(dropped_lines(&node), 916);
}

/// Runs `f` on another thread and waits at most `secs` for it: a worker
/// that died would leave a request waiting for ever.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("no answer: is the worker gone?")
}

#[test]
fn a_panic_in_a_batch_fails_its_events_and_the_worker_serves_on() {
    let node = std::sync::Arc::new(TestNode::with_config(|c| c.workers = 1));
    node.deploy("t/bed", TESTBED).unwrap();
    let a = "t/bed/probe/a";
    assert_eq!(node.actor(a).post("/write?v=kept", "").status, 204);
    node.runtime()
        .faults()
        .panic_in_batch
        .store(1, Ordering::SeqCst);
    let n = std::sync::Arc::clone(&node);
    let e = within(60, move || n.actor(a).request("POST", "/write?v=lost", "")).unwrap_err();
    assert_eq!(e.code(), "internal", "{e}");
    assert!(e.to_string().contains("a worker panicked"), "{e}");
    // The only worker survived; the batch's write was rolled back.
    let n = std::sync::Arc::clone(&node);
    let count = within(60, move || n.actor(a).get("/count").text());
    assert_eq!(count, r#"{"count":1}"#);
    let panics = node.runtime().metrics().worker_panics_total.get();
    assert_eq!(panics, 1);
}

/// Compiled code is cached only for a component that passed every check,
/// so refused deploys cannot fill the cache folder.
#[test]
fn a_refused_component_leaves_no_compiled_code_in_the_cache() {
    let node = node_with_own_cache(|_| {});
    let e = node
        .deploy("t/bad", wasmkeep_guests::BAD_IMPORT)
        .unwrap_err();
    assert_eq!(e.code(), "invalid_component", "{e}");
    let cached = std::fs::read_dir(cache_dir(&node))
        .map(|d| d.flatten().count())
        .unwrap_or(0);
    assert_eq!(cached, 0, "a refused component was cached");
    node.deploy("t/hello", HELLO).unwrap();
    assert!(std::fs::read_dir(cache_dir(&node)).unwrap().count() > 0);
}
