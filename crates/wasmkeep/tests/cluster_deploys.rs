//! One deploy for the cluster (issue 38, ADR 0058), through three real
//! `wasmkeep serve` processes on one folder bucket: an app deployed through
//! any node is served by every node, a node that was down during a deploy
//! serves the new version from its first request, a rollback through any
//! node moves every node, the versions every node lists are the bucket's,
//! deploys racing through two nodes get distinct numbers, only the newest
//! `app_versions_max` stay in the bucket, and a request for an app or
//! class no version has writes nothing to the bucket.
//!
//! No test asserts how long anything takes: the time until every node
//! serves a deploy is printed (run with `--nocapture`) and waits poll with
//! a generous bound.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes wait and measure in real time"
)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Instant;

use common::Node;
use common::load::{Cluster, Member, Store};

/// Waits until `f` holds (a bound of 120 s for a hung cluster).
fn wait_for(what: &str, f: impl FnMut() -> bool) {
    common::cluster::wait_for(what, 120, 20, f)
}

/// `(version, hash, rollback_of)` of each version a node lists.
fn versions(node: &Node, app: &str) -> Vec<(u64, String, Option<u64>)> {
    let (code, v) = node.json("GET", &format!("/admin/v1/apps/{app}/versions"), b"");
    assert_eq!(code, 200, "{v}");
    v["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["version"].as_u64().unwrap(),
                k["hash"].as_str().unwrap().to_owned(),
                k["rollback_of"].as_u64(),
            )
        })
        .collect()
}

/// The version a node serves now, as `GET /admin/v1/apps/…` shows it.
fn serving(node: &Node, app: &str) -> Option<String> {
    let (code, v) = node.json("GET", &format!("/admin/v1/apps/{app}"), b"");
    (code == 200).then(|| v["hash"].as_str().unwrap().to_owned())
}

/// The pinger class is in the demo guest, not in hello.
const PINGER: &str = "/v1/acme/shop/pinger/p/config?name=GREETING";

fn deploy(node: &Node, wasm: &[u8]) -> serde_json::Value {
    let (code, v) = node.deploy("acme/shop", wasm);
    assert_eq!(code, 200, "{v}");
    v
}

/// Keys under `dir` in the folder bucket, relative to it, sorted.
fn keys(bucket: &Path, dir: &str) -> Vec<String> {
    common::cluster::folder_keys(&bucket.join(dir))
}

/// Waits until every node serves `hash` for the app; returns how long
/// that took from `since`.
fn all_serve(nodes: &[&Member], hash: &str, since: Instant) -> std::time::Duration {
    wait_for("every node to serve the deploy", || {
        nodes
            .iter()
            .all(|m| serving(&m.node, "acme/shop").as_deref() == Some(hash))
    });
    since.elapsed()
}

#[test]
fn a_deploy_through_one_node_is_served_by_all_and_a_returning_node_catches_up() {
    let c = Cluster::new(Store::Folder);
    let [a, b, mut down] = c.start_three().try_into().ok().unwrap();

    // Deployed through A: B serves it at once (a request for an app it did
    // not have yet reads the bucket), and every node within a sync.
    let t = Instant::now();
    let v1 = deploy(&a.node, wasmkeep_guests::DEMO);
    assert_eq!(v1["version"], 1);
    let (code, body) = b.node.get(PINGER);
    assert_eq!(code, 200, "B serves what A deployed: {body}");
    let took = all_serve(&[&a, &b, &down], v1["hash"].as_str().unwrap(), t);
    eprintln!("deploy v1 served by all three nodes after {took:?}");

    // C is down while version 2 is deployed through B.
    down.node.stop();
    let v2 = deploy(&b.node, wasmkeep_guests::HELLO);
    assert_eq!(v2["version"], 2);
    let t = Instant::now();
    all_serve(&[&a, &b], v2["hash"].as_str().unwrap(), t);
    eprintln!(
        "deploy v2 served by the two live nodes after {:?}",
        t.elapsed()
    );
    let c2 = c.start_on(&down.data, down.port, None);
    // Its first request runs version 2: no pinger any more.
    let (code, body) = c2.node.get(PINGER);
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("class_not_found"), "{body}");
    assert_eq!(
        c2.node.post("/v1/acme/shop/counter/x/increment", b"").0,
        200
    );
    let listed = versions(&a.node, "acme/shop");
    assert_eq!(listed.len(), 2);
    for m in [&b, &c2] {
        assert_eq!(versions(&m.node, "acme/shop"), listed, "the bucket's list");
    }

    // A rollback through C moves every node back to version 1's component.
    let (code, back) = c2
        .node
        .json("POST", "/admin/v1/apps/acme/shop/rollback", b"");
    assert_eq!(code, 200, "{back}");
    assert_eq!(
        (back["version"].as_u64(), back["rollback_of"].as_u64()),
        (Some(3), Some(1))
    );
    let t = Instant::now();
    all_serve(&[&a, &b, &c2], v1["hash"].as_str().unwrap(), t);
    eprintln!("rollback served by all three nodes after {:?}", t.elapsed());
    assert_eq!(b.node.get(PINGER).0, 200);
    assert_eq!(
        keys(&c.folder(), "versions/acme/shop"),
        [
            "00000000000000000001",
            "00000000000000000002",
            "00000000000000000003"
        ]
    );

    // Names no version has: refused on every node, and nothing written.
    for m in [&a, &b, &c2] {
        for path in [
            "/v1/acme/nope/counter/x/increment",
            "/v1/acme/shop/nosuch/x/increment",
            "/v1/nobody/shop/counter/x/increment",
        ] {
            let (code, body) = m.node.post(path, b"");
            assert_eq!(code, 404, "{path}: {body}");
        }
    }
    let state = keys(&c.folder(), "state");
    assert!(
        state.iter().all(|k| !k.starts_with("acme/nope/")
            && !k.contains("/nosuch/")
            && !k.starts_with("nobody/")),
        "{state:?}"
    );
}

#[test]
fn racing_deploys_get_distinct_numbers_and_the_bucket_keeps_the_newest() {
    let c = Cluster::with_settings(Store::Folder, 60_000, "app_versions_max = 2\n");
    let a = c.start("a");
    let b = c.start("b");
    let guests = [
        wasmkeep_guests::DEMO,
        wasmkeep_guests::HELLO,
        wasmkeep_guests::TESTBED,
    ];
    // Two deploys at once through two nodes, three times over; each has a
    // manifest of its own, so that none is the newest version again.
    let tagged = |node: &Node, wasm: &[u8], tag: &str| {
        let manifest = format!("%5Bvars%5D%0ADEPLOY%20%3D%20%22{tag}%22");
        let path = format!("/admin/v1/apps/acme/shop?manifest={manifest}");
        let (code, v) = node.json("PUT", &path, wasm);
        assert_eq!(code, 200, "{v}");
        v
    };
    let mut numbers = Vec::new();
    for round in 0..3 {
        let (x, y) = (guests[round % 3], guests[(round + 1) % 3]);
        let (va, vb) = std::thread::scope(|s| {
            let ha = s.spawn(|| tagged(&a.node, x, &format!("{round}a")));
            let hb = s.spawn(|| tagged(&b.node, y, &format!("{round}b")));
            (ha.join().unwrap(), hb.join().unwrap())
        });
        numbers.push(va["version"].as_u64().unwrap());
        numbers.push(vb["version"].as_u64().unwrap());
    }
    numbers.sort_unstable();
    assert_eq!(numbers, [1, 2, 3, 4, 5, 6], "every deploy its own number");
    // Neither of the last two: a new version; through the other node
    // again, the same one.
    assert_eq!(deploy(&a.node, wasmkeep_guests::HELLO)["version"], 7);
    assert_eq!(
        deploy(&b.node, wasmkeep_guests::HELLO)["version"],
        7,
        "the same component and manifest as the newest is that version"
    );
    // Both nodes serve the newest, and list the same two kept versions.
    let newest = versions(&a.node, "acme/shop");
    assert_eq!(newest.iter().map(|v| v.0).collect::<Vec<_>>(), [6, 7]);
    all_serve(&[&a, &b], &newest[1].1, Instant::now());
    assert_eq!(versions(&b.node, "acme/shop"), newest);
    // Only the kept versions' records and components stay in the bucket.
    assert_eq!(
        keys(&c.folder(), "versions/acme/shop"),
        ["00000000000000000006", "00000000000000000007"]
    );
    let components = keys(&c.folder(), "components/acme/shop");
    assert_eq!(components.len(), 2, "{components:?}");
    for (n, hash, _) in &newest {
        assert!(
            components.contains(&format!("{n:020}-{hash}.wasm")),
            "{components:?}"
        );
    }
}

/// With the sync far away, a node still serves an app deployed through
/// another one from the first request for it: it reads the bucket for an
/// app or class it does not have before refusing it.
#[test]
fn a_request_for_an_app_this_node_lacks_reads_the_bucket_first() {
    let c = Cluster::with_settings(Store::Folder, 60_000, "cluster_deploy_sync_ms = 600000\n");
    let a = c.start("a");
    let b = c.start("b");
    deploy(&a.node, wasmkeep_guests::HELLO);
    assert_eq!(serving(&b.node, "acme/shop"), None, "B has not synced");
    let (code, body) = b.node.post("/v1/acme/shop/counter/x/increment", b"");
    assert_eq!((code, body.as_str()), (200, r#"{"value":1}"#));
    // A class a newer version adds, the same way.
    deploy(&a.node, wasmkeep_guests::DEMO);
    let (code, body) = b.node.get(PINGER);
    assert_eq!(code, 200, "{body}");
    assert_eq!(versions(&b.node, "acme/shop").len(), 2);
    // A rollout through B, which has not seen A's newest whole version
    // (3): B serves 3 to the actors outside the rollout, as every node does.
    deploy(&a.node, wasmkeep_guests::TESTBED);
    let (code, v) = b.node.json(
        "PUT",
        "/admin/v1/apps/acme/shop?percent=50",
        wasmkeep_guests::HELLO,
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["version"], 4);
    let (_, app) = b.node.json("GET", "/admin/v1/apps/acme/shop", b"");
    assert_eq!(
        (app["version"].as_u64(), app["rollout"]["version"].as_u64()),
        (Some(3), Some(4)),
        "{app}"
    );
}

/// The version that answered a request through `node`.
fn answered_version(node: &Node, path: &str) -> u64 {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let resp = agent
        .post(&format!("http://{}{path}", node.addr()))
        .send_empty()
        .unwrap();
    assert_eq!(resp.status(), 200, "{path}");
    resp.headers()["x-wasmkeep-version"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// A rollout deployed through one node is the cluster's: another node
/// serves its share of actors the new version and the rest the whole one,
/// and a whole deploy through it finishes the rollout everywhere.
#[test]
fn a_rollout_through_one_node_is_served_by_the_others() {
    let c = Cluster::new(Store::Folder);
    let a = c.start("a");
    let b = c.start("b");
    deploy(&a.node, wasmkeep_guests::EXAMPLES_TS);
    let (code, v) = a.node.json(
        "PUT",
        "/admin/v1/apps/acme/shop?percent=50",
        wasmkeep_guests::DEMO,
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        (v["version"].as_u64(), v["percent"].as_u64()),
        (Some(2), Some(50))
    );
    wait_for("B to install the rollout", || {
        let (_, app) = b.node.json("GET", "/admin/v1/apps/acme/shop", b"");
        app["version"] == 1 && app["rollout"]["version"] == 2 && app["rollout"]["percent"] == 50
    });
    // Actors B takes run one version or the other, by their share.
    let versions: BTreeSet<u64> = (0..40)
        .map(|i| answered_version(&b.node, &format!("/v1/acme/shop/counter/b{i}/increment")))
        .collect();
    assert_eq!(versions, BTreeSet::from([1, 2]));
    // Whole, through B: every node, every actor.
    deploy(&b.node, wasmkeep_guests::DEMO);
    wait_for("A to finish the rollout", || {
        let (_, app) = a.node.json("GET", "/admin/v1/apps/acme/shop", b"");
        app["version"] == 3 && app.get("rollout").is_none()
    });
    for i in 0..40 {
        let path = format!("/v1/acme/shop/counter/b{i}/increment");
        assert_eq!(answered_version(&a.node, &path), 3);
    }
}

/// During a rollout, a request for a class only the new version has, to
/// an actor outside the share, is refused before anything is taken: the
/// version that actor runs has no such class, and nothing of it reaches
/// the bucket.
#[test]
fn a_class_only_a_rollout_has_is_refused_outside_its_share_before_a_take() {
    let c = Cluster::with_settings(Store::Folder, 60_000, "");
    let a = c.start("a");
    deploy(&a.node, wasmkeep_guests::HELLO);
    let (code, v) = a.node.json(
        "PUT",
        "/admin/v1/apps/acme/shop?percent=50",
        wasmkeep_guests::DEMO,
    );
    assert_eq!(code, 200, "{v}");
    let (mut inside, mut outside) = (None, None);
    for i in 0..64 {
        let name = format!("n{i}");
        let (code, body) = a.node.get(&format!("/v1/acme/shop/notes/{name}/notes"));
        match code {
            200 => inside = inside.or(Some(name)),
            404 => {
                assert!(body.contains("class_not_found"), "{body}");
                outside = outside.or(Some(name));
            }
            _ => panic!("{code}: {body}"),
        }
        if inside.is_some() && outside.is_some() {
            break;
        }
    }
    let hex = |n: &str| n.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    let state = keys(&c.folder(), "state");
    let held = |name: &str| {
        let folder = format!("/notes/{}/", hex(name));
        state.iter().any(|k| k.contains(&folder))
    };
    assert!(
        held(&inside.expect("an actor inside the share")),
        "{state:?}"
    );
    assert!(!held(&outside.expect("an actor outside it")), "{state:?}");
}
