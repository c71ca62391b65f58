//! Class migrations in an app's manifest (issue 38, ADR 0060), on one
//! real node: a rename moves each actor's database and alarm to the new
//! class name (kept through a restart, applied once per tag, and a
//! rollback to before it refused); a delete removes the class's data and
//! alarms; a transfer moves a class from another app of the tenant once
//! that app no longer serves it. What cannot apply is refused and moves
//! nothing: a target class with actors, a source app still serving the
//! class, a class the component still exports, an actor with a call not
//! yet delivered. With a bucket, the actors only the bucket holds move
//! too, the bucket keeps each at its new address only, and a start
//! finishes a migration a crash cut short.

#![allow(
    clippy::disallowed_methods,
    reason = "a test of a real process waits in real time"
)]

mod common;

use std::path::Path;

use common::{Node, code, enc};
use serde_json::Value;
use wasmkeep_guests::{DEMO, HELLO, TESTBED};

/// Deploys `wasm` as `acme/{app}` with `manifest`.
fn deploy(node: &Node, app: &str, wasm: &[u8], manifest: &str) -> (u16, Value) {
    node.json(
        "PUT",
        &format!("/admin/v1/apps/acme/{app}?manifest={}", enc(manifest)),
        wasm,
    )
}

/// Rows of an operator's SQL on an actor (`None` for an error answer).
fn rows(node: &Node, actor: &str, sql: &str) -> Option<Value> {
    let (status, v) = node.json(
        "POST",
        &format!("/admin/v1/actors/acme/{actor}/sql"),
        sql.as_bytes(),
    );
    (status == 200).then(|| v["rows"].clone())
}

/// The node's pending alarms of tenant acme: (app/class/name, at).
fn alarms(node: &Node) -> Vec<(String, u64)> {
    let (status, v) = node.json("GET", "/admin/v1/alarms/acme", b"");
    assert_eq!(status, 200, "{v}");
    v["alarms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                format!(
                    "{}/{}/{}",
                    a["app"].as_str().unwrap(),
                    a["class"].as_str().unwrap(),
                    a["name"].as_str().unwrap()
                ),
                a["alarm_ms"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn class_dir(data: &Path, app: &str, class: &str) -> std::path::PathBuf {
    data.join("actors").join("acme").join(app).join(class)
}

const FAR_MS: u64 = 4_000_000_000_000;

const RENAME: &str = r#"
[[migrations]]
tag = "v1"
renamed_classes = [{ from = "probe", to = "counter" }]
"#;

#[test]
fn a_rename_moves_data_and_alarms_once_and_a_restart_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut node = Node::start(&data, &[]);
    assert_eq!(deploy(&node, "shop", TESTBED, "").0, 200);
    for name in ["p1", "p2"] {
        let (s, b) = node.post(&format!("/v1/acme/shop/probe/{name}/write?v={name}"), b"");
        assert_eq!(s, 204, "{b}");
    }
    let (s, b) = node.post(&format!("/v1/acme/shop/probe/p1/alarm?at_ms={FAR_MS}"), b"");
    assert_eq!(s, 204, "{b}");

    let (s, v) = deploy(&node, "shop", HELLO, RENAME);
    assert_eq!(s, 200, "{v}");
    let migrated = v["version"].as_u64().unwrap();

    // The data and the alarm are the new class's; the old name is gone.
    for name in ["p1", "p2"] {
        assert_eq!(
            rows(
                &node,
                &format!("shop/counter/{name}"),
                "SELECT v FROM writes"
            ),
            Some(serde_json::json!([[name]])),
        );
    }
    assert!(!class_dir(&data, "shop", "probe").exists());
    assert_eq!(alarms(&node), vec![("shop/counter/p1".to_owned(), FAR_MS)]);
    let (s, v) = node.json("POST", "/v1/acme/shop/probe/p1/write", b"");
    assert_eq!((s, code(&v)), (404, "class_not_found"), "{v}");
    // The new class serves new actors as usual.
    let (s, b) = node.post("/v1/acme/shop/counter/c9/increment", b"");
    assert_eq!((s, b.as_str()), (200, "{\"value\":1}"));

    // The same manifest again applies nothing: the tag is applied.
    let (s, v) = deploy(&node, "shop", HELLO, RENAME);
    assert_eq!(s, 200, "{v}");
    assert!(rows(&node, "shop/counter/p1", "SELECT v FROM writes").is_some());

    // Back to the build from before the rename would find no data.
    let (s, v) = node.json("POST", "/admin/v1/apps/acme/shop/rollback?to=1", b"");
    assert_eq!((s, code(&v)), (409, "rollback_past_migration"), "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("version {migrated}")),
        "{message}"
    );

    node.stop();
    let node = Node::start(&data, &[]);
    // The node reads alarms from the databases on a thread of its own.
    common::cluster::wait_for("the alarm scan", 20, 50, || !alarms(&node).is_empty());
    assert_eq!(alarms(&node), vec![("shop/counter/p1".to_owned(), FAR_MS)]);
    assert_eq!(
        rows(&node, "shop/counter/p2", "SELECT v FROM writes"),
        Some(serde_json::json!([["p2"]])),
    );
}

#[test]
fn a_deleted_class_takes_its_data_and_alarms_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let node = Node::start(&data, &[]);
    assert_eq!(deploy(&node, "tmp", TESTBED, "").0, 200);
    assert_eq!(node.post("/v1/acme/tmp/probe/p1/write?v=x", b"").0, 204);
    let at = format!("/v1/acme/tmp/probe/p1/alarm?at_ms={FAR_MS}");
    assert_eq!(node.post(&at, b"").0, 204);
    assert_eq!(alarms(&node).len(), 1);

    // Deleting a class the component still exports is refused.
    let keep = "[[migrations]]\ntag = \"gone\"\ndeleted_classes = [\"probe\"]\n";
    let (s, v) = deploy(&node, "tmp", TESTBED, keep);
    assert_eq!((s, code(&v)), (422, "invalid_manifest"), "{v}");
    assert!(class_dir(&data, "tmp", "probe").exists());

    let (s, v) = deploy(&node, "tmp", HELLO, keep);
    assert_eq!(s, 200, "{v}");
    assert!(!class_dir(&data, "tmp", "probe").exists());
    assert!(alarms(&node).is_empty());
}

#[test]
fn a_transfer_moves_a_class_that_its_app_no_longer_serves() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let node = Node::start(&data, &[]);
    assert_eq!(deploy(&node, "old", HELLO, "").0, 200);
    for _ in 0..3 {
        assert_eq!(node.post("/v1/acme/old/counter/c1/increment", b"").0, 200);
    }
    let transfer = r#"
[[migrations]]
tag = "from-old"
transferred_classes = [{ from_app = "old", from = "counter", to = "counter" }]
"#;
    // `old` still serves its counters: refused, nothing moved.
    let (s, v) = deploy(&node, "new", HELLO, transfer);
    assert_eq!((s, code(&v)), (409, "migration_conflict"), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("still serves")
    );
    assert_eq!(node.get("/v1/acme/old/counter/c1/value").1, "{\"value\":3}");
    let (s, _) = node.get("/v1/acme/new/counter/c1/value");
    assert_eq!(s, 404, "the refused deploy did not install `new`");

    // Once `old` no longer has the class, the transfer applies.
    assert_eq!(deploy(&node, "old", TESTBED, "").0, 200);
    let (s, v) = deploy(&node, "new", HELLO, transfer);
    assert_eq!(s, 200, "{v}");
    assert_eq!(node.get("/v1/acme/new/counter/c1/value").1, "{\"value\":3}");
    assert_eq!(
        node.post("/v1/acme/new/counter/c1/increment", b"").1,
        "{\"value\":4}"
    );
    assert!(!class_dir(&data, "old", "counter").exists());
}

#[test]
fn a_migration_that_cannot_apply_moves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // An HTTP server that accepts and never answers: a call to it stays
    // in its sender's outbox.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let cfg = dir.path().join("node.toml");
    std::fs::write(&cfg, "outbound_private_allowed = true\n").unwrap();
    let node = Node::start(&data, &["--config", cfg.to_str().unwrap()]);
    let outbound = format!("[outbound]\nhosts = [\"127.0.0.1:{port}\"]\n");
    assert_eq!(deploy(&node, "mix", DEMO, &outbound).0, 200);
    assert_eq!(node.post("/v1/acme/mix/counter/c1/increment", b"").0, 200);
    assert_eq!(
        node.post("/v1/acme/mix/notes/n1/notes?text=kept", b"").0 / 100,
        2
    );

    // Into a class that has actors: refused.
    let into_full = format!(
        "{outbound}[[migrations]]\ntag = \"m1\"\nrenamed_classes = [{{ from = \"notes\", to = \"counter\" }}]\n"
    );
    let (s, v) = deploy(&node, "mix", HELLO, &into_full);
    assert_eq!((s, code(&v)), (409, "migration_conflict"), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already has actors")
    );

    // From a class whose actor has a call not yet delivered: refused.
    let (s, b) = node.post(
        &format!(
            "/v1/acme/mix/pinger/p1/fetch?url={}",
            enc(&format!("http://127.0.0.1:{port}/"))
        ),
        b"",
    );
    assert_eq!(s, 200, "{b}");
    let busy = format!(
        "{outbound}[[migrations]]\ntag = \"m2\"\nrenamed_classes = [{{ from = \"pinger\", to = \"probe\" }}]\n"
    );
    let (s, v) = deploy(&node, "mix", TESTBED, &busy);
    assert_eq!((s, code(&v)), (409, "migration_conflict"), "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("not yet delivered"), "{message}");

    // Nothing moved, and the app still runs its old build.
    for class in ["counter", "notes", "pinger"] {
        assert!(class_dir(&data, "mix", class).exists(), "{class}");
    }
    assert!(!class_dir(&data, "mix", "probe").exists());
    assert_eq!(node.get("/v1/acme/mix/counter/c1/value").1, "{\"value\":1}");
    let (_, v) = node.json("GET", "/admin/v1/apps/acme/mix", b"");
    assert!(v.to_string().contains("pinger"), "{v}");
    drop(silent);
}

/// While a migration waits for its classes' open actors to finish their
/// events, new events for those classes are refused with
/// `class_migrating` (retryable) rather than run on data about to move.
#[test]
fn events_of_a_class_being_migrated_wait_outside_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let node = Node::start(&data, &[]);
    // Hello compiled once here: the deploy below reaches its gate at once.
    assert_eq!(deploy(&node, "warm", HELLO, "").0, 200);
    let limits = "[limits]\nevent_cpu_ms_max = 3000\n";
    assert_eq!(deploy(&node, "busy", TESTBED, limits).0, 200);
    assert_eq!(node.post("/v1/acme/busy/probe/p1/write?v=a", b"").0, 204);

    let manifest = format!("{limits}{RENAME}");
    // Scoped: a failed assertion still waits for both, then stops the node.
    std::thread::scope(|scope| {
        // An event that runs until its CPU limit stops it.
        let looping = scope.spawn(|| node.json("POST", "/v1/acme/busy/probe/p1/loop", b""));
        std::thread::sleep(std::time::Duration::from_millis(300));
        let deploying = scope.spawn(|| deploy(&node, "busy", HELLO, &manifest));
        // Writes to other actors of the class until one is refused (or the
        // deploy is done, which fails the test).
        let mut refused = None;
        for k in 0.. {
            let (s, v) = node.json("POST", &format!("/v1/acme/busy/probe/w{k}/write?v=b"), b"");
            if s == 503 {
                refused = Some(v);
                break;
            }
            assert_eq!(s, 204, "{v}");
            if deploying.is_finished() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let refused = refused.expect("no write was refused while the class was closed");
        assert_eq!(code(&refused), "class_migrating", "{refused}");

        let (s, v) = looping.join().unwrap();
        assert_eq!((s, code(&v)), (500, "cpu_time_exceeded"), "{v}");
        let (s, v) = deploying.join().unwrap();
        assert_eq!(s, 200, "{v}");
    });
    assert_eq!(
        rows(&node, "busy/counter/p1", "SELECT v FROM writes"),
        Some(serde_json::json!([["a"]])),
        "the looping event rolled back; the write before it moved"
    );
    assert!(!class_dir(&data, "busy", "probe").exists());
}

/// A manifest keeps its migrations' history: on an app with no data every
/// step is nothing to do; where data is, `probe` to `tmp` then `tmp` to
/// `counter` moves it to `counter` (`tmp` is no class of the build).
#[test]
fn a_manifest_with_its_history_deploys_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let node = Node::start(&data, &[]);
    let history = r#"
[[migrations]]
tag = "v1"
renamed_classes = [{ from = "probe", to = "tmp" }]
[[migrations]]
tag = "v2"
renamed_classes = [{ from = "tmp", to = "counter" }]
deleted_classes = ["old"]
"#;
    let (s, v) = deploy(&node, "fresh", HELLO, history);
    assert_eq!(s, 200, "a fresh app: {v}");
    assert_eq!(deploy(&node, "chain", TESTBED, "").0, 200);
    assert_eq!(node.post("/v1/acme/chain/probe/p1/write?v=z", b"").0, 204);
    let (s, v) = deploy(&node, "chain", HELLO, history);
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        rows(&node, "chain/counter/p1", "SELECT v FROM writes"),
        Some(serde_json::json!([["z"]])),
    );
    for class in ["probe", "tmp"] {
        assert!(!class_dir(&data, "chain", class).exists(), "{class}");
    }
    assert!(!data.join("trash").exists());
}

/// A transferred class's alarms follow its actors to the other app.
#[test]
fn a_transferred_class_keeps_its_alarms() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let node = Node::start(&data, &[]);
    assert_eq!(deploy(&node, "old", TESTBED, "").0, 200);
    let at = format!("/v1/acme/old/probe/p1/alarm?at_ms={FAR_MS}");
    assert_eq!(node.post(&at, b"").0, 204);
    assert_eq!(deploy(&node, "old", HELLO, "").0, 200);
    let transfer = r#"
[[migrations]]
tag = "probes"
transferred_classes = [{ from_app = "old", from = "probe", to = "probe" }]
"#;
    let (s, v) = deploy(&node, "new", TESTBED, transfer);
    assert_eq!(s, 200, "{v}");
    assert_eq!(alarms(&node), vec![("new/probe/p1".to_owned(), FAR_MS)]);
}

/// A `file://` bucket in a folder `bucket` under `dir`: its URL.
fn folder_bucket(dir: &Path) -> String {
    let bucket = dir.join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    format!("file://{}", bucket.display())
}

/// `wasmkeep export --bucket` of one actor: the exported file's `writes`
/// rows, or the command's error output when it fails.
fn exported(url: &str, actor: &str, out: &Path) -> Result<Vec<Vec<wasmkeep_store::Value>>, String> {
    let _ = std::fs::remove_file(out);
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args(["export", "--bucket", url, actor, "-o"])
        .arg(out)
        .output()
        .unwrap();
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    let r = wasmkeep_store::db::inspect_query(
        out,
        "SELECT v FROM writes",
        &wasmkeep_store::InspectBounds::rows(10),
    )
    .unwrap();
    Ok(r.rows)
}

/// With a bucket (`serve --bucket`, one node): a migration moves the
/// actors only the bucket holds (a node restored on an empty folder has
/// not opened them) as well as those on disk, and afterwards the bucket
/// has them at their new address only: a node restored from it serves
/// them renamed, and a deleted class's actors are gone from it too.
#[test]
fn with_a_bucket_the_actors_only_the_bucket_holds_move_too() {
    let dir = tempfile::tempdir().unwrap();
    let url = folder_bucket(dir.path());
    let with_bucket = ["--bucket", url.as_str()];
    let write = |node: &Node, actor: &str, v: &str| {
        let path = format!("/v1/acme/{actor}/write?v={v}&wasmkeep-durability=replicated");
        let (s, b) = node.post(&path, b"");
        assert_eq!(s, 204, "{actor}: {b}");
    };

    // Node A writes p1 (with an alarm), p2 and t1, and stops: the bucket
    // holds them.
    let mut a = Node::start(&dir.path().join("a"), &with_bucket);
    assert_eq!(deploy(&a, "shop", TESTBED, "").0, 200);
    assert_eq!(deploy(&a, "tmp", TESTBED, "").0, 200);
    write(&a, "shop/probe/p1", "p1");
    write(&a, "shop/probe/p2", "p2");
    write(&a, "tmp/probe/t1", "t1");
    let at = format!("/v1/acme/shop/probe/p1/alarm?at_ms={FAR_MS}&wasmkeep-durability=replicated");
    assert_eq!(a.post(&at, b"").0, 204);
    assert!(a.stop().success());

    // Node B starts on an empty folder: p1, p2 and t1 are only in the
    // bucket; p3 it writes itself.
    let b_data = dir.path().join("b");
    let mut b = Node::start(&b_data, &with_bucket);
    assert_eq!(deploy(&b, "shop", TESTBED, "").0, 200);
    assert_eq!(deploy(&b, "tmp", TESTBED, "").0, 200);
    write(&b, "shop/probe/p3", "p3");
    assert!(!class_dir(&b_data, "shop", "probe").join("p1").exists());

    let (s, v) = deploy(&b, "shop", HELLO, RENAME);
    assert_eq!(s, 200, "{v}");
    for name in ["p1", "p2", "p3"] {
        assert_eq!(
            rows(&b, &format!("shop/counter/{name}"), "SELECT v FROM writes"),
            Some(serde_json::json!([[name]])),
            "{name}"
        );
    }
    assert_eq!(alarms(&b), vec![("shop/counter/p1".to_owned(), FAR_MS)]);
    let (s, v) = b.json("POST", "/v1/acme/shop/probe/p1/write", b"");
    assert_eq!((s, code(&v)), (404, "class_not_found"), "{v}");

    let delete = "[[migrations]]\ntag = \"gone\"\ndeleted_classes = [\"probe\"]\n";
    let (s, v) = deploy(&b, "tmp", HELLO, delete);
    assert_eq!(s, 200, "{v}");
    assert!(b.stop().success());

    // The bucket has each moved actor at its new address only, and none
    // of the deleted class.
    let out = dir.path().join("out.db");
    for name in ["p1", "p2", "p3"] {
        let moved = exported(&url, &format!("acme/shop/counter/{name}"), &out);
        let text = wasmkeep_store::Value::Text(name.to_owned());
        assert_eq!(moved, Ok(vec![vec![text]]), "{name}");
        let old = exported(&url, &format!("acme/shop/probe/{name}"), &out);
        assert!(old.is_err(), "{name} is still at its old address: {old:?}");
    }
    let gone = exported(&url, "acme/tmp/probe/t1", &out);
    assert!(
        gone.is_err(),
        "a deleted class's actor is in the bucket: {gone:?}"
    );

    // A node restored from the bucket on an empty folder serves them
    // renamed; the manifest's history finds nothing left to move.
    let c = Node::start(&dir.path().join("c"), &with_bucket);
    let (s, v) = deploy(&c, "shop", HELLO, RENAME);
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        rows(&c, "shop/counter/p2", "SELECT v FROM writes"),
        Some(serde_json::json!([["p2"]])),
    );
}

/// The rule above matters: with it switched off (the bucket not listed,
/// `WASMKEEP_UNSAFE=migration_forgets_bucket_actors`), an actor only the
/// bucket held stays at its old address, which the new version no longer
/// serves: its data is out of every node's reach.
#[test]
fn without_listing_the_bucket_a_migration_strands_its_actors() {
    let dir = tempfile::tempdir().unwrap();
    let url = folder_bucket(dir.path());
    let with_bucket = ["--bucket", url.as_str()];
    let mut a = Node::start(&dir.path().join("a"), &with_bucket);
    assert_eq!(deploy(&a, "shop", TESTBED, "").0, 200);
    let path = "/v1/acme/shop/probe/p1/write?v=p1&wasmkeep-durability=replicated";
    assert_eq!(a.post(path, b"").0, 204);
    assert!(a.stop().success());

    let unsafe_env = [(
        "WASMKEEP_UNSAFE",
        "migration_forgets_bucket_actors".to_owned(),
    )];
    let b = Node::start_env(&dir.path().join("b"), &with_bucket, &unsafe_env);
    assert_eq!(deploy(&b, "shop", TESTBED, "").0, 200);
    let (s, v) = deploy(&b, "shop", HELLO, RENAME);
    assert_eq!(s, 200, "{v}");
    let moved = rows(&b, "shop/counter/p1", "SELECT v FROM writes");
    assert_ne!(moved, Some(serde_json::json!([["p1"]])));
    let out = dir.path().join("out.db");
    let stranded = exported(&url, "acme/shop/probe/p1", &out);
    let text = wasmkeep_store::Value::Text("p1".to_owned());
    assert_eq!(stranded, Ok(vec![vec![text]]));
}

/// A node with a bucket that stops in the middle of a migration (the
/// first actor restored at its new address, not yet deleted at its old
/// one) finishes it at its next start, before it serves: every actor
/// ends at its new address only, none twice, none lost.
#[test]
fn a_start_finishes_a_migration_the_node_stopped_in_with_a_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let url = folder_bucket(dir.path());
    let with_bucket = ["--bucket", url.as_str()];
    let data = dir.path().join("data");
    let crashing = [("WASMKEEP_UNSAFE", "migration_crashes_mid_way".to_owned())];
    let mut node = Node::start_env(&data, &with_bucket, &crashing);
    assert_eq!(deploy(&node, "shop", TESTBED, "").0, 200);
    for name in ["p1", "p2", "p3"] {
        let path =
            format!("/v1/acme/shop/probe/{name}/write?v={name}&wasmkeep-durability=replicated");
        assert_eq!(node.post(&path, b"").0, 204);
    }
    // The deploy's answer never comes: the node aborts mid-way.
    common::deploy_never_answered(node.addr(), "acme/shop", HELLO, RENAME);
    node.kill();
    let out = dir.path().join("out.db");
    let copies = ["p1", "p2", "p3"]
        .iter()
        .filter(|n| exported(&url, &format!("acme/shop/counter/{n}"), &out).is_ok())
        .count()
        + ["p1", "p2", "p3"]
            .iter()
            .filter(|n| exported(&url, &format!("acme/shop/probe/{n}"), &out).is_ok())
            .count();
    assert_eq!(
        copies, 4,
        "one actor was at both addresses when the node stopped"
    );

    let node = Node::start(&data, &with_bucket);
    for name in ["p1", "p2", "p3"] {
        assert_eq!(
            rows(
                &node,
                &format!("shop/counter/{name}"),
                "SELECT v FROM writes"
            ),
            Some(serde_json::json!([[name]])),
            "{name}"
        );
        let old = exported(&url, &format!("acme/shop/probe/{name}"), &out);
        assert!(old.is_err(), "{name} is still at its old address: {old:?}");
    }
    let (s, v) = node.json("POST", "/v1/acme/shop/probe/p1/write", b"");
    assert_eq!((s, code(&v)), (404, "class_not_found"), "{v}");
}
