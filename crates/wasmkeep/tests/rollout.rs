//! Gradual rollout on a node (issue 38, ADR 0059), through the CLI as an
//! operator runs it: `deploy --percent P` moves a stable share of the
//! app's actors (by a hash of each address) to the new version, raising
//! P only moves actors forward, each actor answers from one version
//! (named in `x-wasmkeep-version`, `inspect` and its access lines), a
//! restart keeps the rollout, and a whole deploy finishes it. A deferred
//! deploy leaves an open actor on its version until it closes.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::Node;

const ACTORS: usize = 100;

fn cli_ok(node: &Node, args: &[&str]) -> String {
    let (status, stdout, stderr) = node.cli(args, &[("USER", "ops")]);
    assert_eq!(status, 0, "{args:?}: {stdout}{stderr}");
    stdout
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.to_str().unwrap().to_owned()
}

/// `POST …/counter/{name}/increment`: the counter and the version that
/// answered.
fn increment(node: &Node, name: &str) -> (u64, u64) {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let url = format!(
        "http://{}/v1/acme/app/counter/{name}/increment",
        node.addr()
    );
    let mut resp = agent.post(&url).send_empty().unwrap();
    assert_eq!(resp.status(), 200);
    let version = resp
        .headers()
        .get("x-wasmkeep-version")
        .expect("the version that answered")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let text = resp.body_mut().read_to_string().unwrap();
    let body: serde_json::Value = serde_json::from_str(&text).unwrap();
    (body["value"].as_u64().unwrap(), version)
}

/// Increments every actor once; returns the names that ran `version`,
/// checking each counter went up by one from `round`.
fn round(node: &Node, round: u64, version: u64) -> BTreeSet<String> {
    let mut on = BTreeSet::new();
    for i in 0..ACTORS {
        let name = format!("a{i}");
        let (value, v) = increment(node, &name);
        assert_eq!(value, round, "{name} kept its data");
        if v == version {
            on.insert(name);
        }
    }
    on
}

fn inspect_version(node: &Node, name: &str) -> u64 {
    let (code, v) = node.json(
        "GET",
        &format!("/admin/v1/actors/acme/app/counter/{name}"),
        b"",
    );
    assert_eq!(code, 200, "{v}");
    v["version"].as_u64().unwrap()
}

#[test]
fn a_rollout_moves_a_stable_share_forward_and_a_whole_deploy_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = write(d, "node.toml", b"access_log = true\n");
    let data = d.join("data");
    let mut node = Node::start(&data, &["--config", &config]);
    let ts = write(d, "ts.wasm", wasmkeep_guests::EXAMPLES_TS);
    let demo = write(d, "demo.wasm", wasmkeep_guests::DEMO);

    // A rollout needs a version to move actors from.
    let (status, _, err) = node.cli(&["deploy", "acme/app", &demo, "--percent", "10"], &[]);
    assert_eq!(status, 1);
    assert!(err.contains("deploy it whole first"), "{err}");

    cli_ok(&node, &["deploy", "acme/app", &ts]); // 1
    assert!(round(&node, 1, 1).len() == ACTORS);

    let out = cli_ok(&node, &["deploy", "acme/app", &demo, "--percent", "30"]);
    assert!(out.contains("version 2 to 30% of the actors"), "{out}");
    let at_30 = round(&node, 2, 2);
    assert!(!at_30.is_empty() && at_30.len() < ACTORS, "{}", at_30.len());
    assert_eq!(round(&node, 3, 2), at_30, "each actor stays on its version");
    for name in ["a0", "a1", "a2"] {
        let expected = if at_30.contains(name) { 2 } else { 1 };
        assert_eq!(inspect_version(&node, name), expected, "{name}");
    }
    // The notes class is in the new version only (the Rust examples; the
    // first is the TypeScript one): the notes actors within the rollout
    // have it, the others get 404, the same each time.
    let notes = |n: usize| node.get(&format!("/v1/acme/app/notes/n{n}/notes")).0;
    let found: Vec<u16> = (0..ACTORS).map(notes).collect();
    assert!(found.contains(&200) && found.contains(&404), "{found:?}");
    assert!(found.iter().all(|c| *c == 200 || *c == 404), "{found:?}");
    assert_eq!((0..ACTORS).map(notes).collect::<Vec<_>>(), found);

    // Raising the share only moves actors forward.
    let out = cli_ok(&node, &["deploy", "acme/app", &demo, "--percent", "70"]);
    assert!(out.contains("version 3 to 70%"), "{out}");
    let at_70 = round(&node, 4, 3);
    assert!(at_30.is_subset(&at_70) && at_70.len() > at_30.len());
    assert!(at_70.len() < ACTORS);
    let (_, app) = node.json("GET", "/admin/v1/apps/acme/app", b"");
    assert_eq!(
        (app["version"].as_u64(), app["rollout"]["percent"].as_u64()),
        (Some(1), Some(70))
    );

    // Each access line names the version that answered.
    let (code, logs) = node.send("GET", "/admin/v1/logs/acme/app/counter/a0?lines=1", b"");
    assert_eq!(code, 200);
    let expected = if at_70.contains("a0") { 3 } else { 1 };
    assert!(logs.contains(&format!("\"version\":{expected}")), "{logs}");

    // A restart keeps the rollout.
    node.stop();
    let node = Node::start(&data, &["--config", &config]);
    assert_eq!(round(&node, 5, 3), at_70);

    // A whole deploy finishes it: every actor, nothing rolled out.
    let out = cli_ok(&node, &["deploy", "acme/app", &demo]);
    assert!(out.contains("version 4 ("), "{out}");
    assert_eq!(round(&node, 6, 4).len(), ACTORS);
    let (_, app) = node.json("GET", "/admin/v1/apps/acme/app", b"");
    assert_eq!(app["version"], 4);
    assert!(app.get("rollout").is_none(), "{app}");
    let listed = cli_ok(&node, &["versions", "acme/app"]);
    assert!(
        listed.contains("rollout to 30%") && listed.contains("rollout to 70%"),
        "{listed}"
    );
    // A rollback returns past the rollout's steps, to the version before.
    let out = cli_ok(&node, &["rollback", "acme/app"]);
    assert!(out.contains("back to version 1"), "{out}");
    assert_eq!(round(&node, 7, 5).len(), ACTORS);
    let (_, app) = node.json("GET", "/admin/v1/apps/acme/app", b"");
    assert!(
        !app["classes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "notes"),
        "{app}"
    );
}

#[test]
fn a_deferred_deploy_waits_for_an_open_actor_to_close() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = d.join("data");
    let mut node = Node::start(&data, &[]);
    let ts = write(d, "ts.wasm", wasmkeep_guests::EXAMPLES_TS);
    let demo = write(d, "demo.wasm", wasmkeep_guests::DEMO);
    cli_ok(&node, &["deploy", "acme/app", &ts]); // 1
    assert_eq!(increment(&node, "open"), (1, 1));

    let out = cli_ok(&node, &["deploy", "acme/app", &demo, "--mode", "deferred"]);
    assert!(out.contains("deferred"), "{out}");
    // The open actor keeps version 1; a new one starts on version 2.
    assert_eq!(increment(&node, "open"), (2, 1));
    assert_eq!(inspect_version(&node, "open"), 1);
    assert_eq!(increment(&node, "new"), (1, 2));
    // Closed (here by a restart), it opens on version 2.
    node.stop();
    let node = Node::start(&data, &[]);
    assert_eq!(increment(&node, "open"), (3, 2));

    // An immediate deploy moves open actors at their next event.
    cli_ok(&node, &["deploy", "acme/app", &ts]); // 3
    assert_eq!(increment(&node, "open"), (4, 3));
}

/// Under steady load on 100 actors, a rollout at 10%, 50% and 100% and a
/// rollback fail no request and lose no write: every actor's counter
/// ends at the number of increments acknowledged to it.
#[test]
#[allow(
    clippy::disallowed_methods,
    reason = "a load test waits in real time between deploys"
)]
fn a_rollout_and_a_rollback_under_load_fail_no_request() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("data"), &[]);
    let deploy = |query: &str, wasm: &[u8]| {
        let (code, v) = node.json("PUT", &format!("/admin/v1/apps/acme/app{query}"), wasm);
        assert_eq!(code, 200, "{v}");
    };
    deploy("", wasmkeep_guests::EXAMPLES_TS);
    let stop = AtomicBool::new(false);
    let (acked, failures) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let (node, stop) = (&node, &stop);
                s.spawn(move || {
                    let mut acked = vec![0u64; 25];
                    let mut failures = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        for (i, n) in acked.iter_mut().enumerate() {
                            let path = format!("/v1/acme/app/counter/w{w}-{i}/increment");
                            match node.post(&path, b"") {
                                (200, _) => *n += 1,
                                other => failures.push(other),
                            }
                        }
                    }
                    (w, acked, failures)
                })
            })
            .collect();
        let pause = || std::thread::sleep(std::time::Duration::from_millis(400));
        pause();
        deploy("?percent=10", wasmkeep_guests::DEMO);
        pause();
        deploy("?percent=50", wasmkeep_guests::DEMO);
        pause();
        deploy("", wasmkeep_guests::DEMO);
        pause();
        let (code, v) = node.json("POST", "/admin/v1/apps/acme/app/rollback?to=1", b"");
        assert_eq!(code, 200, "{v}");
        pause();
        stop.store(true, Ordering::Relaxed);
        let mut acked = Vec::new();
        let mut failures = Vec::new();
        for h in workers {
            let (w, a, f) = h.join().unwrap();
            acked.push((w, a));
            failures.extend(f);
        }
        (acked, failures)
    });
    assert!(failures.is_empty(), "{failures:?}");
    let mut total = 0;
    for (w, counts) in acked {
        for (i, n) in counts.into_iter().enumerate() {
            let (code, body) = node.get(&format!("/v1/acme/app/counter/w{w}-{i}/value"));
            assert_eq!(code, 200);
            assert_eq!(body, format!("{{\"value\":{n}}}"), "w{w}-{i}");
            total += n;
        }
    }
    assert!(total > 100, "the load ran: {total} increments");
    eprintln!("{total} increments across the deploys, none failed");
}

/// A reply parked by one event and completed by another (here the answer
/// to a message) names the version that completed it too.
#[test]
fn a_parked_reply_names_the_version_that_completed_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("data"), &[]);
    let (code, v) = node.deploy("acme/park", wasmkeep_guests::DEMO);
    assert_eq!(code, 200, "{v}");
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let url = format!("http://{}/v1/acme/park/pinger/p/relay?to=q", node.addr());
    let resp = agent.post(&url).send_empty().unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()
            .get("x-wasmkeep-version")
            .map(|v| v.to_str().unwrap().to_owned()),
        Some(v["version"].to_string())
    );
}
