//! An app's variables and secrets (ADR 0041) through a real node: set at
//! deploy (`[vars]`) and through the admin API (secrets), read by the
//! guest, never in the node's log, its inspect output or its metrics.

mod common;

use common::Node;

const SECRET: &str = "s3cr3t-Val-7781";

fn value(node: &Node, name: &str) -> serde_json::Value {
    let (status, v) = node.json(
        "GET",
        &format!("/v1/demo/examples/pinger/x/config?name={name}"),
        b"",
    );
    assert_eq!(status, 200, "{v}");
    v["value"].clone()
}

#[test]
fn guests_read_vars_and_secrets_and_no_output_shows_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("node.log");
    let node = Node::start_logging(&dir.path().join("data"), &[], Some(&log), "info");
    let manifest = "[vars]\nREGION = \"eu-west\"\nAPI_KEY = \"not-the-secret\"\n";
    let (status, v) = node.json(
        "PUT",
        &format!(
            "/admin/v1/apps/demo/examples?manifest={}",
            common::enc(manifest)
        ),
        wasmkeep_guests::DEMO,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(value(&node, "REGION"), "eu-west");
    assert_eq!(value(&node, "API_KEY"), "not-the-secret");
    assert_eq!(value(&node, "MISSING"), serde_json::Value::Null);

    let (status, body) = node.send(
        "PUT",
        "/admin/v1/apps/demo/examples/secrets/API_KEY",
        SECRET.as_bytes(),
    );
    assert_eq!(status, 204, "{body}");
    assert_eq!(
        value(&node, "API_KEY"),
        SECRET,
        "a secret shadows the variable, at once"
    );
    let (_, names) = node.json("GET", "/admin/v1/apps/demo/examples/secrets", b"");
    assert_eq!(names["names"], serde_json::json!(["API_KEY"]));

    // A bad name is refused naming the rule.
    let (status, body) = node.send("PUT", "/admin/v1/apps/demo/examples/secrets/bad-name", b"v");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid_config"), "{body}");

    // The guest logs it: the node's log has it replaced.
    let (status, _) = node.send(
        "POST",
        "/v1/demo/examples/pinger/x/config/log?name=API_KEY",
        b"",
    );
    assert_eq!(status, 200);
    let (_, app) = node.get("/admin/v1/apps/demo/examples");
    let (_, metrics) = node.get("/metrics");
    let (_, apps) = node.get("/admin/v1/apps");
    for (what, text) in [
        ("app", &app),
        ("metrics", &metrics),
        ("apps", &apps),
        ("names", &names.to_string()),
    ] {
        assert!(!text.contains(SECRET), "{what} shows the secret");
    }
    // Logs are written as they happen; give the line a moment.
    let mut logged = String::new();
    for _ in 0..100 {
        logged = std::fs::read_to_string(&log).unwrap_or_default();
        if logged.contains("config API_KEY") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(logged.contains("config API_KEY = [secret]"), "{logged}");
    assert!(!logged.contains(SECRET), "the log shows the secret");

    // Deleting it brings the variable back.
    let (status, v) = node.json(
        "DELETE",
        "/admin/v1/apps/demo/examples/secrets/API_KEY",
        b"",
    );
    assert_eq!((status, &v["deleted"]), (200, &serde_json::json!(true)));
    assert_eq!(value(&node, "API_KEY"), "not-the-secret");
}
