//! Compiling hostile components (issue 17, item 8) on a real node: a
//! compilation runs in a child process, whose memory is bounded
//! (`component_compile_memory_bytes_max`) and which is stopped at its
//! deadline (`component_compile_ms_max`), freeing its place. Each test runs
//! the unsafe variant too (`compile_in_child = false`: on a thread of the
//! node), where the same component gets through or the place stays taken.

mod common;

use std::path::Path;

use common::{Node, code};
use wasmkeep_guests::DEMO;
use wasmkeep_guests::forged::{MEMORY_MODULE, instantiating, one_long_function, renamed};

/// A function that takes about 700 MB and a few seconds to compile, under
/// a hash of each test's own (nodes of the tests share a compile cache).
fn long_function(test: &str) -> Vec<u8> {
    renamed(&one_long_function(1_000_000), test)
}

fn start(tmp: &Path, name: &str, config: &str) -> Node {
    let dir = tmp.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("node.toml");
    std::fs::write(&cfg, config).unwrap();
    Node::start(&dir.join("data"), &["--config", cfg.to_str().unwrap()])
}

/// The node's children that are compile workers.
fn compile_workers(node: &Node) -> usize {
    let parent = node.pid().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                return false;
            };
            // pid (comm) state ppid …: comm may hold spaces, so split after ')'.
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(1));
            ppid == Some(parent.as_str())
        })
        .count()
}

#[test]
fn a_compilation_past_its_memory_bound_is_refused_while_a_normal_one_compiles() {
    let tmp = tempfile::tempdir().unwrap();
    let config = "component_compile_memory_bytes_max = 268435456\n";
    let node = start(tmp.path(), "child", config);
    // The examples, under a hash no cache holds, compile within the bound.
    let (s, v) = node.deploy("good/demo", &renamed(DEMO, "compile-memory"));
    assert_eq!(s, 200, "{v}");
    let (s, v) = node.deploy("evil/long", &long_function("memory"));
    assert_eq!(s, 422, "{v}");
    assert_eq!(code(&v), "compile_memory_exceeded", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("component_compile_memory_bytes_max=268435456"),
        "{v}"
    );
    let (s, _) = node.post("/v1/good/demo/counter/a/increment", b"");
    assert_eq!(s, 200);

    // The unsafe variant: on a thread of the node, the same compilation
    // runs to its end (the component is then refused for what it lacks).
    let node = start(
        tmp.path(),
        "thread",
        &format!("{config}compile_in_child = false\n"),
    );
    let (s, v) = node.deploy("evil/long", &long_function("memory"));
    assert_eq!(s, 422, "{v}");
    assert_eq!(code(&v), "invalid_component", "{v}");
    assert!(v.to_string().contains("does not export"), "{v}");
}

/// Three deploys of a component that compiles for seconds, with a
/// deadline far shorter: in a child, each is stopped at its deadline and
/// gives its place back, so every deploy gets `compile_timeout` and no
/// worker is left; on a thread, abandoned compilations keep their places
/// and a deploy finds none (`compile_busy`).
#[test]
fn a_compilation_past_its_deadline_is_stopped_and_gives_its_place_back() {
    let tmp = tempfile::tempdir().unwrap();
    let config = "component_compile_ms_max = 200\n";
    let long = long_function("deadline");

    let node = start(tmp.path(), "child", config);
    for _ in 0..3 {
        let (s, v) = node.deploy("evil/long", &long);
        assert_eq!(s, 422, "{v}");
        assert_eq!(code(&v), "compile_timeout", "{v}");
    }
    assert_eq!(
        compile_workers(&node),
        0,
        "no compile worker outlives its deadline"
    );

    let node = start(
        tmp.path(),
        "thread",
        &format!("{config}compile_in_child = false\n"),
    );
    let codes: Vec<String> = (0..3)
        .map(|_| code(&node.deploy("evil/long", &long).1).to_string())
        .collect();
    assert!(
        codes.iter().any(|c| c == "compile_busy"),
        "abandoned compilations keep their places: {codes:?}"
    );
}

/// The instance pool's limits are checked on code a child compiled, with
/// the message naming the node's setting.
#[test]
fn code_compiled_in_a_child_is_checked_against_the_instance_pool() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), "child", "component_memories_max = 2\n");
    let (s, v) = node.deploy("evil/mem", &instantiating(MEMORY_MODULE, 3));
    assert_eq!(s, 422, "{v}");
    assert_eq!(code(&v), "invalid_component", "{v}");
    assert!(v.to_string().contains("component_memories_max=2"), "{v}");
    let (s, v) = node.deploy("evil/mem", &instantiating(MEMORY_MODULE, 2));
    assert_eq!(s, 422, "{v}");
    assert!(v.to_string().contains("does not export"), "{v}");
}
