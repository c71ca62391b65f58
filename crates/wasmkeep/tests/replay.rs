//! Recording and replay (issue 38, ADR 0062), through a real node and the
//! examples' `profiles` class in Rust and in TypeScript. The app records
//! (`[recording]`); a replay of its actors' real events against the same
//! build finds no difference; against a build whose handler changed (the
//! `PROFILE_SCHEMA` variable drops the `email` migration: the same
//! requests now fail with 400 and write a different table) it shows the
//! exact difference; `deploy --replay N` refuses that build unless told the
//! difference is expected, and deploys the unchanged one.

mod common;

use common::Node;
use serde_json::Value;

/// `[recording]` on, `PROFILE_SCHEMA` as given, URL-encoded.
fn manifest(schema: &str) -> String {
    let text =
        format!("[recording]\nevents_per_actor_max = 100\n[vars]\nPROFILE_SCHEMA = \"{schema}\"\n");
    url_encode(&text)
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn replay(node: &Node, app: &str, wasm: &[u8], query: &str) -> Value {
    let (code, v) = node.json(
        "POST",
        &format!("/admin/v1/apps/acme/{app}/replay?{query}"),
        wasm,
    );
    assert_eq!(code, 200, "{v}");
    v
}

fn replay_shows_what_a_changed_handler_does_differently(app: &str, wasm: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("data"), &[]);
    let (code, v) = node.json(
        "PUT",
        &format!("/admin/v1/apps/acme/{app}?manifest={}", manifest("2")),
        wasm,
    );
    assert_eq!(code, 200, "{v}");
    for (actor, query) in [
        ("ann", "name=Ann"),
        ("bob", "name=Bob&email=b%40x"),
        ("ann", "name=Ann&email=a%40x"),
    ] {
        let (code, body) = node.send(
            "PUT",
            &format!("/v1/acme/{app}/profiles/{actor}/?{query}"),
            b"",
        );
        assert_eq!(code, 204, "{body}");
    }
    let (code, _) = node.send("GET", &format!("/v1/acme/{app}/profiles/ann/"), b"");
    assert_eq!(code, 200);

    // The same build and manifest: every event does what it did.
    let same = replay(&node, app, wasm, &format!("manifest={}", manifest("2")));
    assert_eq!(same["actors_replayed"], 2, "{same:#}");
    assert_eq!(same["events_replayed"], 4, "{same:#}");
    assert_eq!(same["events_differing"], 0, "{same:#}");
    assert_eq!(same["actors_not_reproduced"], 0, "{same:#}");

    // The handler without the `email` migration: a PUT with an email is
    // refused (400) and the table's rows differ.
    let changed = replay(&node, app, wasm, &format!("manifest={}", manifest("1")));
    assert!(
        changed["events_differing"].as_u64().unwrap() >= 2,
        "{changed:#}"
    );
    let bob = changed["actors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["actor"] == format!("acme/{app}/profiles/bob"))
        .expect("bob replayed");
    let first = &bob["differences"][0];
    assert_eq!(first["what"], "response", "{bob:#}");
    assert_eq!(first["kind"], "request");
    assert!(
        first["production"]
            .as_str()
            .unwrap()
            .starts_with("response 204"),
        "{first:#}"
    );
    assert_eq!(first["candidate"], "error bad_request", "{first:#}");
    let kinds: Vec<&str> = bob["differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["what"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"table profile"), "{kinds:?}");

    // One actor, its last event only: the GET, after the others ran on
    // the baseline.
    let last = replay(
        &node,
        app,
        wasm,
        &format!("class=profiles&name=ann&last=1&manifest={}", manifest("1")),
    );
    assert_eq!(last["actors"][0]["warm_up_events"], 2, "{last:#}");
    assert_eq!(last["actors"][0]["events"], 1, "{last:#}");

    // A deploy that replays first refuses the changed handler ...
    let (code, v) = node.json(
        "PUT",
        &format!(
            "/admin/v1/apps/acme/{app}?replay=10&manifest={}",
            manifest("1")
        ),
        wasm,
    );
    assert_eq!(code, 409, "{v}");
    assert_eq!(v["error"]["code"], "replay_differs", "{v}");
    let (_, versions) = node.json("GET", &format!("/admin/v1/apps/acme/{app}/versions"), b"");
    assert_eq!(
        versions["versions"].as_array().unwrap().len(),
        1,
        "nothing deployed"
    );
    // ... unless told those differences are expected,
    let (code, v) = node.json(
        "PUT",
        &format!(
            "/admin/v1/apps/acme/{app}?replay=10&expect=response,table:profile,table:wasmkeep_sdk_schema&manifest={}",
            manifest("1")
        ),
        wasm,
    );
    assert_eq!(code, 200, "{v}");
    // and deploys a build that does what production did (every recorded
    // event ran on version 1: the replay compares with that).
    let (code, v) = node.json(
        "PUT",
        &format!(
            "/admin/v1/apps/acme/{app}?replay=10&manifest={}",
            manifest("2")
        ),
        wasm,
    );
    assert_eq!(code, 200, "{v}");
}

#[test]
fn rust_replay_shows_what_a_changed_handler_does_differently() {
    replay_shows_what_a_changed_handler_does_differently("profiles-rs", wasmkeep_guests::DEMO);
}

#[test]
fn typescript_replay_shows_what_a_changed_handler_does_differently() {
    replay_shows_what_a_changed_handler_does_differently(
        "profiles-ts",
        wasmkeep_guests::EXAMPLES_TS,
    );
}

/// The CLI: `wasmkeep replay` prints the differences and exits 1 when the
/// candidate differs; `--help` names its options.
#[test]
fn the_cli_replays_and_fails_on_a_difference() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("data"), &[]);
    let wasm_path = dir.path().join("demo.wasm");
    std::fs::write(&wasm_path, wasmkeep_guests::DEMO).unwrap();
    let (code, v) = node.json(
        "PUT",
        &format!("/admin/v1/apps/acme/p?manifest={}", manifest("2")),
        wasmkeep_guests::DEMO,
    );
    assert_eq!(code, 200, "{v}");
    let (code, out, _) = node.cli(&["replay", "--help"], &[]);
    assert_eq!(code, 0);
    assert!(out.contains("--with") && out.contains("--last"), "{out}");
    // A deploy gated on a replay that has nothing to replay does not pass.
    let w = wasm_path.to_str().unwrap();
    let (code, _, err) = node.cli(&["deploy", "acme/p", w, "--replay", "5"], &[]);
    assert_ne!(code, 0);
    assert!(
        err.contains("replay_differs") && err.contains("nothing_replayed"),
        "{err}"
    );
    let (code, _) = node.send("PUT", "/v1/acme/p/profiles/cy/?name=Cy&email=c%40x", b"");
    assert_eq!(code, 204);
    let man = dir.path().join("v1.toml");
    std::fs::write(&man, "[recording]\n[vars]\nPROFILE_SCHEMA = \"1\"\n").unwrap();
    let (code, out, err) = node.cli(
        &[
            "replay",
            "acme/p",
            "--with",
            w,
            "--manifest",
            man.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("acme/p/profiles/cy: 1 events"), "{out}");
    assert!(out.contains("error bad_request"), "{out}");
    assert!(err.contains("differed on 1 events"), "{err}");
    let same = dir.path().join("v2.toml");
    std::fs::write(&same, "[recording]\n[vars]\nPROFILE_SCHEMA = \"2\"\n").unwrap();
    let (code, out, err) = node.cli(
        &[
            "replay",
            "acme/p/profiles",
            "--with",
            w,
            "--manifest",
            same.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("0 differed"), "{out}");
}
