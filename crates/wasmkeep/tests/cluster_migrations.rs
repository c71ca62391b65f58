//! Class migrations on a cluster (issue 38, ADR 0071), through three real
//! `wasmkeep serve` processes on one folder bucket: a rename deployed
//! through one node moves the actors every node held (their data, their
//! alarm and its index entry) to the new class, and every node serves
//! them there; a delete takes a class's actors out of the bucket; what
//! cannot apply is refused with nothing moved and no version recorded.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes wait in real time"
)]

mod common;

use std::path::Path;

use common::load::{Cluster, Store};
use common::{Node, code, enc};
use serde_json::{Value, json};
use wasmkeep_guests::{DEMO, HELLO, TESTBED};

const FAR_MS: u64 = 4_000_000_000_000;

const RENAME: &str = r#"
[[migrations]]
tag = "v1"
renamed_classes = [{ from = "probe", to = "counter" }]
"#;

fn wait_for(what: &str, f: impl FnMut() -> bool) {
    common::cluster::wait_for(what, 120, 50, f)
}

fn deploy(node: &Node, app: &str, wasm: &[u8], manifest: &str) -> (u16, Value) {
    node.json(
        "PUT",
        &format!("/admin/v1/apps/acme/{app}?manifest={}", enc(manifest)),
        wasm,
    )
}

/// Rows of an operator's SQL on an actor, through any node (`None` for an
/// error answer).
fn rows(node: &Node, actor: &str, sql: &str) -> Option<Value> {
    let (status, v) = node.json(
        "POST",
        &format!("/admin/v1/actors/acme/{actor}/sql"),
        sql.as_bytes(),
    );
    (status == 200).then(|| v["rows"].clone())
}

fn serving(node: &Node, app: &str) -> Option<u64> {
    let (code, v) = node.json("GET", &format!("/admin/v1/apps/acme/{app}"), b"");
    (code == 200).then(|| v["version"].as_u64().unwrap())
}

/// Whether `wasmkeep export --bucket` finds a database for the actor.
fn in_bucket(bucket: &Path, actor: &str, out: &Path) -> bool {
    let _ = std::fs::remove_file(out);
    std::process::Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args([
            "export",
            "--bucket",
            &format!("file://{}", bucket.display()),
        ])
        .args([actor, "-o"])
        .arg(out)
        .output()
        .unwrap()
        .status
        .success()
}

/// Alarm index entries in the folder bucket whose key names `class`.
fn index_entries(bucket: &Path, class: &str) -> Vec<String> {
    common::cluster::folder_keys(bucket)
        .into_iter()
        .filter(|k| k.contains("alarms/") && k.contains(&format!("/{class}.")))
        .collect()
}

#[test]
fn a_rename_moves_the_actors_every_node_held_and_every_node_serves_them() {
    assert_eq!(
        rename_across_three_nodes(&[]),
        1,
        "p2's alarm at its new address"
    );
}

/// Without `Settle` (`WASMKEEP_UNSAFE=migration_skips_settle`), the moved
/// actor's alarm has no index entry at its new address once its old one
/// is deleted: were its node to die, no other node would fire it.
#[test]
fn without_settle_a_moved_alarm_has_no_index_entry() {
    let unsafe_env = [("WASMKEEP_UNSAFE", "migration_skips_settle".to_owned())];
    assert_eq!(rename_across_three_nodes(&unsafe_env), 0);
}

/// Three nodes each hold one actor of `probe` (p2 with an alarm); a rename
/// to `counter` through A. Returns how many index entries name `counter`
/// right after the deploy.
fn rename_across_three_nodes(env: &[(&'static str, String)]) -> usize {
    let c = Cluster::with_settings(Store::Folder, 60_000, "");
    let [a, b, cc] = ["a", "b", "c"].map(|n| c.start_env(n, env));
    assert_eq!(deploy(&a.node, "shop", TESTBED, "").0, 200);
    wait_for("every node to serve version 1", || {
        [&a, &b, &cc]
            .iter()
            .all(|m| serving(&m.node, "shop") == Some(1))
    });
    // Each node takes the actor it is asked for first.
    for (m, name) in [(&a, "p1"), (&b, "p2"), (&cc, "p3")] {
        let (s, body) = m
            .node
            .post(&format!("/v1/acme/shop/probe/{name}/write?v={name}"), b"");
        assert_eq!(s, 204, "{body}");
    }
    let at = format!("/v1/acme/shop/probe/p2/alarm?at_ms={FAR_MS}");
    assert_eq!(b.node.post(&at, b"").0, 204);
    let bucket = c.folder();
    wait_for("p2's alarm in the index", || {
        !index_entries(&bucket, "probe").is_empty()
    });

    let (s, v) = deploy(&a.node, "shop", HELLO, RENAME);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["version"], 2, "{v}");

    // Every node serves the actors under their new name (once its next
    // sync opened the class there), and none under the old one.
    for m in [&a, &b, &cc] {
        wait_for("the class to open", || {
            m.node.post("/v1/acme/shop/counter/fresh/increment", b"").0 == 200
        });
        for name in ["p1", "p2", "p3"] {
            assert_eq!(
                rows(
                    &m.node,
                    &format!("shop/counter/{name}"),
                    "SELECT v FROM writes"
                ),
                Some(json!([[name]])),
                "{name} through {}",
                m.id
            );
        }
        wait_for("the node to serve version 2", || {
            serving(&m.node, "shop") == Some(2)
        });
        let (s, v) = m.node.json("POST", "/v1/acme/shop/probe/p1/write", b"");
        assert_eq!((s, code(&v)), (404, "class_not_found"), "{v}");
    }
    // The bucket: each actor at its new address only, its alarm's entry
    // moved with it, and no closing record left.
    let out = c.folder().parent().unwrap().join("out.db");
    for name in ["p1", "p2", "p3"] {
        assert!(in_bucket(
            &bucket,
            &format!("acme/shop/counter/{name}"),
            &out
        ));
        assert!(!in_bucket(
            &bucket,
            &format!("acme/shop/probe/{name}"),
            &out
        ));
    }
    assert!(index_entries(&bucket, "probe").is_empty());
    let entries = index_entries(&bucket, "counter").len();
    // Back to the build from before the rename would find no data.
    let (s, v) = b
        .node
        .json("POST", "/admin/v1/apps/acme/shop/rollback?to=1", b"");
    assert_eq!((s, code(&v)), (409, "rollback_past_migration"), "{v}");
    let left: Vec<String> = common::cluster::folder_keys(&bucket.join("versions"))
        .into_iter()
        .filter(|k| k.contains("closing"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    entries
}

#[test]
fn a_deleted_class_leaves_the_bucket_and_what_cannot_apply_moves_nothing() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let c = Cluster::with_settings(Store::Folder, 60_000, "outbound_private_allowed = true\n");
    let [a, b, _cc] = c.start_three().try_into().ok().unwrap();
    let outbound = format!("[outbound]\nhosts = [\"127.0.0.1:{port}\"]\n");
    assert_eq!(deploy(&a.node, "mix", DEMO, &outbound).0, 200);
    assert_eq!(b.node.post("/v1/acme/mix/counter/c1/increment", b"").0, 200);
    assert_eq!(
        b.node.post("/v1/acme/mix/notes/n1/notes?text=kept", b"").0 / 100,
        2
    );
    let bucket = c.folder();
    let versions_before = common::cluster::folder_keys(&bucket.join("versions"));

    // Into a class that has actors: refused before anything closes.
    let into_full = format!(
        "{outbound}[[migrations]]\ntag = \"m1\"\nrenamed_classes = [{{ from = \"notes\", to = \"counter\" }}]\n"
    );
    let (s, v) = deploy(&a.node, "mix", HELLO, &into_full);
    assert_eq!((s, code(&v)), (409, "migration_conflict"), "{v}");

    // From a class whose actor (held by B) has a call not yet delivered:
    // refused once the cluster closed the class and A checked the actor.
    let (s, body) = b.node.post(
        &format!(
            "/v1/acme/mix/pinger/p1/fetch?url={}",
            enc(&format!("http://127.0.0.1:{port}/"))
        ),
        b"",
    );
    assert_eq!(s, 200, "{body}");
    let busy = format!(
        "{outbound}[[migrations]]\ntag = \"m2\"\nrenamed_classes = [{{ from = \"pinger\", to = \"probe\" }}]\n"
    );
    let (s, v) = deploy(&a.node, "mix", TESTBED, &busy);
    assert_eq!((s, code(&v)), (409, "migration_conflict"), "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("not yet delivered"), "{message}");
    // No version, no closing record; the classes open again everywhere.
    assert_eq!(
        common::cluster::folder_keys(&bucket.join("versions")),
        versions_before
    );
    for m in [&a, &b] {
        wait_for("the refused migration's class to open again", || {
            m.node.get("/v1/acme/mix/pinger/p2/config?name=GREETING").0 == 200
        });
    }
    drop(silent);

    // A delete of the notes class: its actor leaves the bucket.
    let out = c.folder().parent().unwrap().join("out.db");
    assert!(in_bucket(&bucket, "acme/mix/notes/n1", &out));
    let delete = "[[migrations]]\ntag = \"gone\"\ndeleted_classes = [\"notes\", \"pinger\"]\n";
    let (s, v) = deploy(&a.node, "mix", HELLO, delete);
    assert_eq!(s, 200, "{v}");
    assert!(!in_bucket(&bucket, "acme/mix/notes/n1", &out));
    assert!(in_bucket(&bucket, "acme/mix/counter/c1", &out));
    // B opens the class at its next sync: the class is gone there too.
    wait_for("B to serve the version without notes", || {
        let (s, v) = b.node.json("GET", "/v1/acme/mix/notes/n1/notes", b"");
        (s, code(&v)) == (404, "class_not_found")
    });
}

/// The deploying node dies in the middle of the moves (after its first
/// actor reached the new address, before the old one was deleted): the
/// version is recorded, so another node finds its closing record with no
/// live node behind it and finishes the moves; every actor ends at its
/// new address only and the class opens everywhere.
#[test]
fn another_node_finishes_a_migration_whose_node_died_half_way() {
    let c = Cluster::with_settings(Store::Folder, 60_000, "");
    let crashing = [("WASMKEEP_UNSAFE", "migration_crashes_mid_way".to_owned())];
    let mut a = c.start_env("a", &crashing);
    let b = c.start("b");
    assert_eq!(deploy(&b.node, "shop", TESTBED, "").0, 200);
    for name in ["p1", "p2", "p3"] {
        let (s, body) = b
            .node
            .post(&format!("/v1/acme/shop/probe/{name}/write?v={name}"), b"");
        assert_eq!(s, 204, "{body}");
    }
    // A's deploy is never answered: A aborts half-way.
    common::deploy_never_answered(a.node.addr(), "acme/shop", HELLO, RENAME);
    a.node.kill();

    // B sees A's lease lapse and finishes the moves.
    let bucket = c.folder();
    let out = c.folder().parent().unwrap().join("out.db");
    wait_for("B to finish the migration", || {
        common::cluster::folder_keys(&bucket.join("versions"))
            .iter()
            .all(|k| !k.contains("closing"))
    });
    for name in ["p1", "p2", "p3"] {
        assert_eq!(
            rows(
                &b.node,
                &format!("shop/counter/{name}"),
                "SELECT v FROM writes"
            ),
            Some(json!([[name]])),
            "{name}"
        );
        assert!(!in_bucket(
            &bucket,
            &format!("acme/shop/probe/{name}"),
            &out
        ));
    }
    wait_for("the class to open on B", || {
        b.node.post("/v1/acme/shop/counter/fresh/increment", b"").0 == 200
    });
}

/// While the cluster closes a migration's classes, a node that closed
/// them refuses their requests before it takes anything: the node that
/// moves their actors needs their holds. Here B's actor runs a long event,
/// so the deploy waits for B's ack while C has closed the class already.
#[test]
fn a_closed_class_is_refused_before_its_actor_is_taken() {
    let taken = refused_during_a_closing(&[]);
    assert!(taken.is_empty(), "C took the refused actor: {taken:?}");
}

/// Without the rule (`WASMKEEP_UNSAFE=migration_takes_closed_classes` on
/// C), C takes the actor before its runtime refuses the event: a hold the
/// migration would have to wait out.
#[test]
fn without_the_rule_a_closed_class_s_actor_is_taken() {
    let unsafe_env = [(
        "WASMKEEP_UNSAFE",
        "migration_takes_closed_classes".to_owned(),
    )];
    assert!(!refused_during_a_closing(&unsafe_env).is_empty());
}

/// B's actor runs a long event while A deploys a rename, and C (started
/// with `env`) is asked for other actors of the class until it refuses
/// one: what the bucket then holds of that actor.
fn refused_during_a_closing(env: &[(&'static str, String)]) -> Vec<String> {
    let c = Cluster::with_settings(Store::Folder, 60_000, "");
    let (a, b) = (c.start("a"), c.start("b"));
    let cc = c.start_env("c", env);
    // Hello compiled once on A: the deploy below reaches its closing at once.
    assert_eq!(deploy(&a.node, "warm", HELLO, "").0, 200);
    let limits = "[limits]\nevent_cpu_ms_max = 3000\n";
    assert_eq!(deploy(&a.node, "busy", TESTBED, limits).0, 200);
    assert_eq!(b.node.post("/v1/acme/busy/probe/p1/write?v=a", b"").0, 204);
    wait_for("C to serve the app", || {
        serving(&cc.node, "busy") == Some(1)
    });
    let manifest = format!("{limits}{RENAME}");
    let bucket = c.folder();
    std::thread::scope(|scope| {
        let looping = scope.spawn(|| b.node.json("POST", "/v1/acme/busy/probe/p1/loop", b""));
        std::thread::sleep(std::time::Duration::from_millis(300));
        let deploying = scope.spawn(|| deploy(&a.node, "busy", HELLO, &manifest));
        let mut refused = None;
        for k in 0.. {
            let name = format!("w{k}");
            let (s, v) = cc.node.json(
                "POST",
                &format!("/v1/acme/busy/probe/{name}/write?v=b"),
                b"",
            );
            if s == 503 && code(&v) == "class_migrating" {
                refused = Some(name);
                break;
            }
            assert_eq!(s, 204, "{v}");
            assert!(!deploying.is_finished(), "C never refused the class");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let name = refused.unwrap();
        let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
        let taken = common::cluster::folder_keys(&bucket.join("state/acme/busy/probe").join(&hex));
        let (s, v) = looping.join().unwrap();
        assert_eq!((s, code(&v)), (500, "cpu_time_exceeded"), "{v}");
        let (s, v) = deploying.join().unwrap();
        assert_eq!(s, 200, "{v}");
        assert_eq!(
            rows(&a.node, "busy/counter/p1", "SELECT v FROM writes"),
            Some(json!([["a"]])),
        );
        taken
    })
}

/// A transfer: once app `old` no longer serves its counters, app `new`
/// takes them over, each with its data, served by every node.
#[test]
fn a_transfer_moves_a_class_between_apps_on_a_cluster() {
    let c = Cluster::with_settings(Store::Folder, 60_000, "");
    let [a, b, cc] = c.start_three().try_into().ok().unwrap();
    assert_eq!(deploy(&a.node, "old", HELLO, "").0, 200);
    for _ in 0..3 {
        assert_eq!(b.node.post("/v1/acme/old/counter/c1/increment", b"").0, 200);
    }
    let transfer = r#"
[[migrations]]
tag = "from-old"
transferred_classes = [{ from_app = "old", from = "counter", to = "counter" }]
"#;
    // `old` still serves its counters: refused, nothing recorded.
    let (s, v) = deploy(&a.node, "new", HELLO, transfer);
    assert_eq!((s, code(&v)), (409, "migration_conflict"), "{v}");
    assert_eq!(serving(&a.node, "new"), None);

    assert_eq!(deploy(&a.node, "old", TESTBED, "").0, 200);
    let (s, v) = deploy(&a.node, "new", HELLO, transfer);
    assert_eq!(s, 200, "{v}");
    for m in [&a, &b, &cc] {
        wait_for("the node to open the class", || {
            m.node.get("/v1/acme/new/counter/c1/value").0 == 200
        });
        assert_eq!(
            m.node.get("/v1/acme/new/counter/c1/value").1,
            "{\"value\":3}"
        );
    }
    let out = c.folder().parent().unwrap().join("out.db");
    assert!(!in_bucket(&c.folder(), "acme/old/counter/c1", &out));
    assert!(in_bucket(&c.folder(), "acme/new/counter/c1", &out));
}
