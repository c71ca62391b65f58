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

/// A cluster's replay: two nodes on one folder bucket, each holding one
/// recording actor. A replay through A reports both actors, each naming
/// the node that replayed it (B's actor's differences found on B), and
/// with `node_only=true` only A's; `deploy --replay` through A, told that
/// tables may differ, refuses the changed build for the answer only B's
/// actor gives differently.
/// A cluster node `name` with its folder in `root` and the bucket
/// `root/bucket`, and its port.
fn cluster_node(root: &std::path::Path, name: &str) -> (Node, u16) {
    use common::cluster;
    let bucket = format!("file://{}", root.join("bucket").display());
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let port = cluster::free_port();
    let config = cluster::node_config(&dir, 1500, 500, 2000, "");
    let flags = cluster::serve_flags(port, &config, &bucket);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    (Node::start(&dir.join("data"), &flags), port)
}

#[test]
fn a_clusters_replay_covers_every_live_nodes_actors() {
    use common::cluster;
    let app = "profiles-rs";
    let tmp = tempfile::tempdir().unwrap();
    let start = |name: &str| cluster_node(tmp.path(), name);
    let (a, a_port) = start("a");
    let (b, b_port) = start("b");
    let id = |n: &Node| cluster::status(n)["node"].as_str().unwrap().to_owned();
    let (a_id, b_id) = (id(&a), id(&b));
    cluster::wait_for("both nodes in the view", 120, 100, || {
        let (s, v) = a.json("GET", "/admin/v1/cluster", b"");
        s == 200 && v["nodes"].as_array().is_some_and(|n| n.len() == 2)
    });
    let (code, v) = a.json(
        "PUT",
        &format!("/admin/v1/apps/acme/{app}?manifest={}", manifest("2")),
        wasmkeep_guests::DEMO,
    );
    assert_eq!(code, 200, "{v}");
    // Ann on A without an email (the changed build does the same); Bob on
    // B with one (the changed build refuses it).
    let put = |port: u16, actor: &str, query: &str, node: &str| {
        let path = format!("/v1/acme/{app}/profiles/{actor}/?{query}");
        cluster::wait_for(&format!("{actor} on {node}"), 120, 100, || {
            let r = cluster::send(port, "PUT", &path, &[]);
            r.status == 204 && r.node.as_deref() == Some(node)
        });
    };
    put(a_port, "ann", "name=Ann", &a_id);
    put(b_port, "bob", "name=Bob&email=b%40x", &b_id);

    let changed = replay(
        &a,
        app,
        wasmkeep_guests::DEMO,
        &format!("manifest={}", manifest("1")),
    );
    let actors = changed["actors"].as_array().unwrap();
    let of = |name: &str| {
        actors
            .iter()
            .find(|x| x["actor"] == format!("acme/{app}/profiles/{name}"))
            .unwrap_or_else(|| panic!("{name} replayed: {changed:#}"))
    };
    assert_eq!(of("ann")["node"], a_id.as_str(), "{changed:#}");
    assert_eq!(of("bob")["node"], b_id.as_str(), "{changed:#}");
    // Both write a different table; only Bob's answer differs (his email).
    let kinds = |name: &str| of(name)["difference_kinds"].to_string();
    assert!(!kinds("ann").contains("response"), "{changed:#}");
    assert!(kinds("bob").contains("response"), "{changed:#}");
    assert_eq!(changed["actors_replayed"], 2, "{changed:#}");
    assert!(changed.get("nodes_not_replayed").is_none(), "{changed:#}");

    let mine = replay(
        &a,
        app,
        wasmkeep_guests::DEMO,
        &format!("node_only=true&manifest={}", manifest("1")),
    );
    let names: Vec<&str> = mine["actors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["actor"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec![format!("acme/{app}/profiles/ann")], "{mine:#}");
    assert!(
        !mine["actors"][0]["difference_kinds"]
            .to_string()
            .contains("response")
    );

    // Only B's actor answers differently, and the gate through A sees it.
    let (code, v) = a.json(
        "PUT",
        &format!(
            "/admin/v1/apps/acme/{app}?replay=10&expect=tables&manifest={}",
            manifest("1")
        ),
        wasmkeep_guests::DEMO,
    );
    assert_eq!(code, 409, "{v}");
    assert_eq!(v["error"]["code"], "replay_differs", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unexpected: response"),
        "{v}"
    );

    // The CLI through A names the node of each actor.
    let wasm_path = tmp.path().join("demo.wasm");
    std::fs::write(&wasm_path, wasmkeep_guests::DEMO).unwrap();
    let man = tmp.path().join("v1.toml");
    std::fs::write(&man, "[recording]\n[vars]\nPROFILE_SCHEMA = \"1\"\n").unwrap();
    let what = format!("acme/{app}");
    let args = [
        "replay",
        what.as_str(),
        "--with",
        wasm_path.to_str().unwrap(),
        "--manifest",
        man.to_str().unwrap(),
    ];
    let (code, out, err) = a.cli(&args, &[]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        out.contains(&format!("acme/{app}/profiles/bob (on {b_id})")),
        "{out}"
    );
    assert!(
        out.contains(&format!("acme/{app}/profiles/ann (on {a_id})")),
        "{out}"
    );
    drop(b);
}

/// An actor whose node is gone has its copies only in the bucket: a
/// cluster's replay reads its newest copy and an earlier state of it from
/// the bucket's history and replays from there, and the deploy gate sees
/// what it finds.
#[test]
fn a_clusters_replay_reads_actors_only_the_bucket_holds() {
    use common::cluster;
    let app = "profiles-rs";
    let tmp = tempfile::tempdir().unwrap();
    let start = |name: &str| cluster_node(tmp.path(), name);
    let (a, _) = start("a");
    let (b, b_port) = start("b");
    let b_id = cluster::status(&b)["node"].as_str().unwrap().to_owned();
    let nodes = || {
        let (s, v) = a.json("GET", "/admin/v1/cluster", b"");
        if s == 200 {
            v["nodes"].as_array().map_or(0, Vec::len)
        } else {
            0
        }
    };
    cluster::wait_for("both nodes in the view", 120, 100, || nodes() == 2);
    let (code, v) = a.json(
        "PUT",
        &format!("/admin/v1/apps/acme/{app}?manifest={}", manifest("2")),
        wasmkeep_guests::DEMO,
    );
    assert_eq!(code, 200, "{v}");
    // Bob on B: two writes, a read (whose answer depends on the state the
    // replay starts from: from a wrong one, production is not reproduced)
    // and a third write, each answered once the bucket holds it, so that
    // each is a state of the bucket's history. The changed build ("bad")
    // adds a migration that fails, so every event after the version
    // changes answers an error.
    let profile = format!("/v1/acme/{app}/profiles/bob/");
    let durable = [("wasmkeep-durability", "replicated")];
    for (i, (method, query, status)) in [
        ("PUT", "name=Bob0&email=b%40x", 204),
        ("PUT", "name=Bob1&email=b%40x", 204),
        ("GET", "", 200),
        ("PUT", "name=Bob2&email=b%40x", 204),
    ]
    .into_iter()
    .enumerate()
    {
        let path = format!("{profile}?{query}");
        cluster::wait_for(&format!("bob's event {i} on B"), 120, 100, || {
            let r = cluster::send(b_port, method, &path, &durable);
            r.status == status && r.node.as_deref() == Some(b_id.as_str())
        });
        std::thread::sleep(std::time::Duration::from_millis(30));
    }
    // B is gone with its disk: Bob's copies are only in the bucket.
    drop(b);
    std::fs::remove_dir_all(tmp.path().join("b")).unwrap();
    cluster::wait_for("B out of the view", 120, 100, || nodes() == 1);

    let changed = replay(
        &a,
        app,
        wasmkeep_guests::DEMO,
        &format!("last=2&manifest={}", manifest("bad")),
    );
    let bob = changed["actors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["actor"] == format!("acme/{app}/profiles/bob"))
        .unwrap_or_else(|| panic!("bob replayed: {changed:#}"))
        .clone();
    assert!(
        bob["base"].as_str().unwrap().contains("bucket's history"),
        "{changed:#}"
    );
    assert!(
        bob["skipped"].is_null() && bob["cut"].is_null(),
        "{changed:#}"
    );
    assert!(bob["not_reproduced"].is_null(), "{changed:#}");
    assert_eq!(bob["events"], 2, "{changed:#}");
    assert_eq!(bob["last_seq"], 4, "{changed:#}");
    assert!(
        bob["difference_kinds"].to_string().contains("response"),
        "{changed:#}"
    );
    assert!(changed.get("nodes_not_replayed").is_none(), "{changed:#}");

    // The same build replays Bob without a difference.
    let same = replay(
        &a,
        app,
        wasmkeep_guests::DEMO,
        &format!("last=2&manifest={}", manifest("2")),
    );
    assert_eq!(same["events_differing"], 0, "{same:#}");
    assert!(same["events_replayed"].as_u64().unwrap() >= 2, "{same:#}");

    // All three chosen: the first predates every state that can be
    // checked to start the replay, and the replay says so.
    let all = replay(
        &a,
        app,
        wasmkeep_guests::DEMO,
        &format!("name=bob&class=profiles&manifest={}", manifest("2")),
    );
    let bob = &all["actors"][0];
    assert_eq!(bob["events"], 3, "{all:#}");
    assert!(bob["not_reproduced"].is_null(), "{all:#}");
    assert!(
        bob["cut"]
            .as_str()
            .unwrap()
            .contains("1 chosen events from seq 1"),
        "{all:#}"
    );

    // The gate through A refuses the changed build for Bob's answer.
    let (code, v) = a.json(
        "PUT",
        &format!(
            "/admin/v1/apps/acme/{app}?replay=2&expect=tables&manifest={}",
            manifest("bad")
        ),
        wasmkeep_guests::DEMO,
    );
    assert_eq!(code, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unexpected: response"),
        "{v}"
    );
}
