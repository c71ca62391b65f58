//! The CLI's mistakes (issue 22): a typo in a tenant, app or class is an
//! error with the right code, never an empty answer, and it is one line
//! on stderr with exit code 1, without a backtrace whatever
//! `RUST_BACKTRACE` says.

mod common;

use std::process::Command;

use common::Node;

fn cli(node: &Node, args: &[&str]) -> (i32, String, String) {
    node.cli(args, &[("RUST_BACKTRACE", "1")])
}

#[test]
fn typos_are_errors_with_their_code_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--examples"]);
    for (args, code) in [
        (vec!["actors", "demo/exampels/counter"], "app_not_found"),
        (vec!["actors", "demo/examples/countr"], "class_not_found"),
        (vec!["alarms", "nobody"], "tenant_not_found"),
        (
            vec!["inspect", "demo/exampels/counter/alice"],
            "app_not_found",
        ),
    ] {
        let (status, stdout, stderr) = cli(&node, &args);
        assert_eq!(status, 1, "{args:?}: {stdout} {stderr}");
        assert!(stderr.contains(code), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "one line, no backtrace: {stderr}"
        );
        assert!(stderr.starts_with("error: "), "{stderr}");
    }
    // A hint, on the same line.
    let (_, _, stderr) = cli(&node, &["actors", "demo/exampels/counter"]);
    assert!(stderr.contains("(hint: `wasmkeep apps` lists"), "{stderr}");
    // No node there: one line that says so, with a hint.
    let out = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args(["apps", "--server", "http://127.0.0.1:9"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("is a node running there?"), "{stderr}");
    // The right spellings still answer.
    let (status, _, stderr) = cli(&node, &["actors", "demo/examples/counter"]);
    assert_eq!(status, 0, "{stderr}");
}
