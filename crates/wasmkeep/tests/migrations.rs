//! Schema migrations in both SDKs (issue 38), through a real node and the
//! examples' `profiles` class in Rust and in TypeScript: the migrations a
//! deploy adds run in the actor's first event after it, in that event's
//! transaction; a new actor gets every migration; a failing migration
//! fails the event with `migration_failed` and leaves the actor on its old
//! schema (the migrations before it in the same event roll back too); a
//! rollback to an older build leaves a newer schema as it is.

mod common;

use common::Node;
use serde_json::{Value, json};

/// Deploys `wasm` as `app` with `PROFILE_SCHEMA = schema` (a new version
/// of the app each time the schema changes).
fn deploy(node: &Node, app: &str, wasm: &[u8], schema: &str) -> u64 {
    let manifest = format!("%5Bvars%5D%0APROFILE_SCHEMA%20%3D%20%22{schema}%22");
    let (code, v) = node.json(
        "PUT",
        &format!("/admin/v1/apps/acme/{app}?manifest={manifest}"),
        wasm,
    );
    assert_eq!(code, 200, "{v}");
    v["version"].as_u64().unwrap()
}

fn get(node: &Node, app: &str, actor: &str) -> (u16, Value) {
    node.json("GET", &format!("/v1/acme/{app}/profiles/{actor}/"), b"")
}

fn put(node: &Node, app: &str, actor: &str, query: &str) -> u16 {
    node.send(
        "PUT",
        &format!("/v1/acme/{app}/profiles/{actor}/?{query}"),
        b"",
    )
    .0
}

/// The schema version and the `profile` table's columns, read by the
/// operator's SQL (not through the class).
fn stored(node: &Node, app: &str, actor: &str) -> (i64, Vec<String>) {
    let sql = |q: &str| {
        let (code, v) = node.json(
            "POST",
            &format!("/admin/v1/actors/acme/{app}/profiles/{actor}/sql"),
            q.as_bytes(),
        );
        assert_eq!(code, 200, "{q}: {v}");
        v["rows"].as_array().unwrap().clone()
    };
    let version = sql("SELECT version FROM wasmkeep_sdk_schema")[0][0]
        .as_i64()
        .unwrap();
    let columns = sql("SELECT name FROM pragma_table_info('profile')")
        .iter()
        .map(|r| r[0].as_str().unwrap().to_owned())
        .collect();
    (version, columns)
}

fn migrations_run_once_per_deploy_and_a_failing_one_changes_nothing(app: &str, wasm: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("data"), &[]);

    // Version 1 lists one migration: the table without `email`.
    deploy(&node, app, wasm, "1");
    assert_eq!(put(&node, app, "ann", "name=Ann"), 204);
    assert_eq!(put(&node, app, "ann", "name=Ann&email=a%40x"), 400);
    assert_eq!(
        get(&node, app, "ann").1,
        json!({"name": "Ann", "email": null, "schema": 1})
    );
    assert_eq!(
        stored(&node, app, "ann"),
        (1, vec!["id".into(), "name".into()])
    );

    // Version 2 adds one: the actor's next event runs it, once.
    deploy(&node, app, wasm, "2");
    assert_eq!(
        get(&node, app, "ann").1,
        json!({"name": "Ann", "email": null, "schema": 2}),
        "migrated in the first event after the deploy, data kept"
    );
    assert_eq!(put(&node, app, "ann", "name=Ann&email=a%40x"), 204);
    assert_eq!(get(&node, app, "ann").1["email"], "a@x");
    // A new actor gets every migration before its first event.
    assert_eq!(
        get(&node, app, "new").1,
        json!({"name": null, "email": null, "schema": 2})
    );

    // An actor still at schema 1 when a build with a failing third
    // migration comes: its event fails, and the second migration, which
    // ran in the same event, rolls back with it.
    deploy(&node, app, wasm, "1");
    assert_eq!(put(&node, app, "bob", "name=Bob"), 204);
    deploy(&node, app, wasm, "bad");
    for actor in ["ann", "bob"] {
        let (code, v) = get(&node, app, actor);
        assert_eq!(code, 500, "{v}");
        assert_eq!(v["error"]["code"], "migration_failed", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("migration 3 of 3"), "{message}");
        assert!(message.contains("no_such_table"), "{message}");
    }
    assert_eq!(
        stored(&node, app, "bob"),
        (1, vec!["id".into(), "name".into()])
    );
    let (_, ann) = stored(&node, app, "ann");
    assert_eq!(ann.len(), 3, "ann keeps schema 2: {ann:?}");

    // Fixed by a deploy without it: bob migrates to 2 in his next event.
    deploy(&node, app, wasm, "2");
    assert_eq!(
        get(&node, app, "bob").1,
        json!({"name": "Bob", "email": null, "schema": 2})
    );
    // A rollback to the build with one migration leaves schema 2 alone.
    deploy(&node, app, wasm, "1");
    assert_eq!(get(&node, app, "ann").1["schema"], 2);
    assert_eq!(stored(&node, app, "ann").0, 2);
}

#[test]
fn rust_migrations_run_once_per_deploy_and_a_failing_one_changes_nothing() {
    migrations_run_once_per_deploy_and_a_failing_one_changes_nothing(
        "profiles-rs",
        wasmkeep_guests::DEMO,
    );
}

#[test]
fn typescript_migrations_run_once_per_deploy_and_a_failing_one_changes_nothing() {
    migrations_run_once_per_deploy_and_a_failing_one_changes_nothing(
        "profiles-ts",
        wasmkeep_guests::EXAMPLES_TS,
    );
}
