//! Tokens and exposure: the admin API and each tenant's actors are gated by
//! bearer tokens, a public address without tokens is refused, and tokens
//! never reach the log.

mod common;

use std::process::Command;

use common::Node;

const ADMIN: &str = "admin-secret-7f3a";
const ACME: &str = "acme-secret-91c2";

#[test]
fn tokens_gate_the_admin_api_and_each_tenant() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("node.toml");
    std::fs::write(
        &cfg,
        format!("admin_token = \"{ADMIN}\"\n[tenant_tokens]\ndemo = \"{ACME}\"\n"),
    )
    .unwrap();
    let log = tmp.path().join("node.log");
    let node = Node::start_logging(
        &tmp.path().join("data"),
        &["--examples", "--config", cfg.to_str().unwrap()],
        Some(&log),
        "debug",
    );
    let inc = "/v1/demo/examples/counter/x/increment";
    assert_eq!(node.send_with("POST", inc, b"", None).0, 401);
    assert_eq!(node.send_with("POST", inc, b"", Some("wrong")).0, 401);
    assert_eq!(node.send_with("POST", inc, b"", Some(ACME)).0, 200);
    assert_eq!(node.send_with("POST", inc, b"", Some(ADMIN)).0, 200);
    let (s, body) = node.send_with("GET", "/admin/v1/apps", b"", None);
    assert_eq!(s, 401);
    assert!(body.contains("\"unauthorized\""));
    assert_eq!(
        node.send_with("GET", "/admin/v1/apps", b"", Some(ACME)).0,
        401
    );
    assert_eq!(
        node.send_with("GET", "/admin/v1/apps", b"", Some(ADMIN)).0,
        200
    );
    // The health check and metrics stay open for probes.
    assert_eq!(node.get("/healthz").0, 200);
    drop(node);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.is_empty());
    assert!(
        !log.contains(ADMIN) && !log.contains(ACME),
        "a token reached the log"
    );
}

#[test]
fn a_public_address_without_tokens_is_refused_unless_insecure() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without an admin token"), "{err}");
    assert!(
        !tmp.path().join("actors").exists(),
        "it started before refusing"
    );
}
