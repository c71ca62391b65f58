//! Replication to a bucket as the runtime drives it: when a durable request
//! answers, what a failed upload does, and a node with an empty data folder
//! restoring actors. The bucket is in memory behind the replica crate's
//! fault-injecting store (the failed upload also runs on a folder and on
//! moto); `crates/wasmkeep/tests/replication.rs` runs the same paths
//! against moto and a folder, through real processes.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

use std::sync::Arc;
use std::time::Duration;

use wasmkeep_guests::{DEMO, HELLO, TESTBED};
use wasmkeep_replica::testing::{FaultStore, Moto, faulty_bucket, memory_bucket};
use wasmkeep_replica::{ActorRoot, Bucket, ReplicaConfig};
use wasmkeep_testkit::{RuntimeConfig, RuntimeError, StoreValue, TestNode};

const REPLICATED: &[(&str, &str)] = &[("wasmkeep-durability", "replicated")];

fn node_on(bucket: &Bucket) -> TestNode {
    node_with(bucket, |_| {})
}

fn node_with(bucket: &Bucket, f: impl FnOnce(&mut RuntimeConfig)) -> TestNode {
    let bucket = bucket.clone();
    let node = TestNode::with_config(move |c| {
        c.bucket = Some(bucket);
        // Keep the whole chain: these tests read it.
        c.replica = ReplicaConfig {
            snapshot_every_entries: 1_000,
            snapshot_log_ratio_pct: 1_000_000,
            ..ReplicaConfig::default()
        };
        f(c);
    });
    node.deploy("demo/examples", DEMO).unwrap();
    node
}

fn increment(node: &TestNode, name: &str, headers: &[(&str, &str)]) -> Result<i64, RuntimeError> {
    let r = node
        .actor(&format!("demo/examples/counter/{name}"))
        .request_with_headers("POST", "/increment", headers, "")?;
    Ok(r.json()["value"].as_i64().expect("a value"))
}

/// A runtime to ask the bucket with, and counter `a`'s place in it.
fn actor_a_root(bucket: &Bucket, node: &TestNode) -> (tokio::runtime::Runtime, ActorRoot) {
    let exec = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let root = ActorRoot::new(
        node.actor("demo/examples/counter/a").id(),
        bucket.prefix_bytes(),
    )
    .unwrap();
    (exec, root)
}

fn bucket_logs(bucket: &Bucket, node: &TestNode) -> usize {
    let (exec, root) = actor_a_root(bucket, node);
    exec.block_on(bucket.list_seqs(&root.log_dir(), None, u64::MAX))
        .unwrap()
        .len()
}

#[test]
fn a_durable_request_answers_only_once_its_entry_is_in_the_bucket() {
    let (bucket, faults) = memory_bucket();
    let node = node_on(&bucket);
    assert_eq!(increment(&node, "a", REPLICATED).unwrap(), 1);
    assert_eq!(bucket_logs(&bucket, &node), 1);

    // The next entry (seq 1) is held on its way to the bucket.
    let gate = faults.hold("log/00000000000000000001");
    std::thread::scope(|s| {
        let durable = s.spawn(|| increment(&node, "a", REPLICATED));
        let exec = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        exec.block_on(gate.arrived());
        // Committed locally and uploading: the durable caller still waits,
        // while a plain request answers after its local commit.
        std::thread::sleep(Duration::from_millis(200));
        assert!(!durable.is_finished(), "answered before its entry landed");
        assert_eq!(increment(&node, "b", &[]).unwrap(), 1);
        assert!(!durable.is_finished());
        gate.release();
        assert_eq!(durable.join().unwrap().unwrap(), 2);
    });
    assert_eq!(bucket_logs(&bucket, &node), 2);
}

/// A stop whose wait runs out while a `replicated` request still waits on
/// its upload voids the actor's sidecar (ADR 0082): the request gets an
/// error (the node is stopping), so its commit must not be kept as ahead
/// of the head at the next start and applied again under its retry.
#[test]
fn a_stop_that_leaves_a_replicated_request_unanswered_voids_the_sidecar() {
    stop_voids(false);
}

/// The same for a new actor whose first upload is the one held: its mark
/// says that the whole file is void (nothing of it reached the bucket), so
/// that an opening that still finds the bucket empty sets it aside.
#[test]
fn a_stop_that_leaves_a_new_actors_first_write_unanswered_voids_it_whole() {
    stop_voids(true);
}

fn stop_voids(new_actor: bool) {
    let (bucket, faults) = memory_bucket();
    let node = node_on(&bucket);
    let held: u64 = if new_actor { 0 } else { 1 };
    if !new_actor {
        assert_eq!(increment(&node, "a", REPLICATED).unwrap(), 1);
    }
    let void = node
        .data_dir()
        .join(wasmkeep_store_dir(&node, "demo/examples/counter/a"))
        .join("actor.db.replica-void");
    let gate = faults.hold(&format!("log/{held:020}"));
    std::thread::scope(|s| {
        let waiting = s.spawn(|| increment(&node, "a", REPLICATED));
        let exec = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        exec.block_on(gate.arrived());
        assert!(!void.exists());
        node.runtime().shutdown(Duration::from_millis(100));
        let mark = std::fs::read(&void);
        // Here the held upload still lands after the stop and answers the
        // request; a node whose process exits first answers nothing, and
        // its client retries.
        gate.release();
        if let Ok(v) = waiting.join().unwrap() {
            assert_eq!(v, held as i64 + 1);
        }
        let mark = mark.expect("the stop left the sidecar counting");
        let whole: &[u8] = if new_actor { b"new-actor\n" } else { b"" };
        assert_eq!(mark, whole, "the mark's kind");
    });
}

#[test]
fn a_failed_upload_gives_the_actor_up_and_it_comes_back_from_the_bucket() {
    let (bucket, faults) = memory_bucket();
    failed_upload_recovers(&bucket, &faults);
}

#[test]
fn a_failed_upload_recovers_on_a_folder_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let store = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let (bucket, faults) = faulty_bucket(Arc::new(store), "");
    failed_upload_recovers(&bucket, &faults);
}

#[test]
fn a_failed_upload_recovers_on_moto() {
    let moto = Moto::start();
    moto.create_bucket("fail");
    let (bucket, faults) = faulty_bucket(moto.store("fail"), "node");
    failed_upload_recovers(&bucket, &faults);
}

/// The failed upload is a PUT the fault-injecting store refuses; the
/// bucket behind it is real (a folder, moto) or in memory.
fn failed_upload_recovers(bucket: &Bucket, faults: &FaultStore) {
    let node = node_on(bucket);
    assert_eq!(increment(&node, "a", REPLICATED).unwrap(), 1);

    faults.fail_puts(1);
    let err = increment(&node, "a", REPLICATED).unwrap_err();
    assert_eq!(err.code(), "replication_failed", "{err}");
    assert!(err.is_retryable());

    // The next event drops the instance, sets the local file (which holds
    // the commit the bucket never got) aside and restores the bucket's
    // state: the failed increment is gone.
    assert_eq!(increment(&node, "a", REPLICATED).unwrap(), 2);
    let names = set_aside_files(&node, "a");
    assert_eq!(
        names.len(),
        1,
        "the diverged file is kept, set aside: {names:?}"
    );
    assert_eq!(node.runtime().metrics().replica_given_up_total.get(), 1);
}

/// A new actor's first upload failing gives it up like any other: its
/// `replicated` first write was answered `replication_failed`, so the local
/// file that holds it must not be what the actor's next event opens (the
/// bucket has nothing of it; a retry would otherwise count twice).
#[test]
fn a_new_actors_failed_first_upload_does_not_come_back() {
    let (bucket, faults) = memory_bucket();
    let node = node_on(&bucket);
    faults.fail_puts(1);
    let err = increment(&node, "a", REPLICATED).unwrap_err();
    assert_eq!(err.code(), "replication_failed", "{err}");
    assert_eq!(node.runtime().metrics().replica_given_up_total.get(), 1);

    // The retry finds the actor as new: the failed write is not in it.
    assert_eq!(increment(&node, "a", REPLICATED).unwrap(), 1);
    assert_eq!(bucket_logs(&bucket, &node), 1);
    let names = set_aside_files(&node, "a");
    assert_eq!(names.len(), 1, "the given-up file is set aside: {names:?}");
}

/// Data from before the node had a bucket is not a new actor's: on the
/// node restarted with a bucket, the first upload (carrying it) fails and
/// gives the actor up, and its next opening keeps the file and ships it (a
/// review found it set aside whole, every write with it). The failed
/// write stays in it too: with no position in any bucket, nothing tells it
/// from the older data (ADR 0082).
#[test]
fn data_from_before_the_bucket_survives_a_failed_first_upload() {
    let (bucket, faults) = memory_bucket();
    let mut node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    assert_eq!(increment(&node, "a", &[]).unwrap(), 1);
    assert_eq!(increment(&node, "a", &[]).unwrap(), 2);
    // Every PUT fails until the request has its answer (the start-up pass
    // uploads the actor beside it).
    faults.fail_puts(u32::MAX);
    node.restart_with_config(|c| c.bucket = Some(bucket.clone()));
    let err = increment(&node, "a", REPLICATED).unwrap_err();
    assert_eq!(err.code(), "replication_failed", "{err}");
    faults.fail_puts(0);
    assert_eq!(increment(&node, "a", REPLICATED).unwrap(), 4);
    assert!(set_aside_files(&node, "a").is_empty());
    assert_eq!(bucket_logs(&bucket, &node), 1);
}

/// What the admin API reads of a given-up actor is what its next event
/// will serve, the bucket's state, not the open instance's file with the
/// commit its client was told failed.
#[test]
fn a_given_up_actor_is_read_as_the_bucket_has_it() {
    let (bucket, faults) = memory_bucket();
    let node = node_on(&bucket);
    let counter = node.actor("demo/examples/counter/a");
    assert_eq!(increment(&node, "a", REPLICATED).unwrap(), 1);
    faults.fail_puts(1);
    let err = increment(&node, "a", REPLICATED).unwrap_err();
    assert_eq!(err.code(), "replication_failed", "{err}");
    assert_eq!(counter.sql_i64("SELECT n FROM counter"), 1);
    assert_eq!(increment(&node, "a", REPLICATED).unwrap(), 2);
}

/// A class migration's copy of a given-up actor (ADR 0060) is the bucket's
/// state, as the actor's next event would serve it, not the file with the
/// write its client was told failed: the migration closes the actor first,
/// and the copy's opening finds the sidecar voided (ADR 0082).
#[test]
fn a_class_migration_copies_a_given_up_actor_as_the_bucket_has_it() {
    let (bucket, faults) = memory_bucket();
    let node = node_on(&bucket);
    node.deploy("acme/shop", TESTBED).unwrap();
    let probe = node.actor("acme/shop/probe/p1");
    let write =
        |v: &str| probe.request_with_headers("POST", &format!("/write?v={v}"), REPLICATED, "");
    write("kept").unwrap();
    faults.fail_puts(1);
    let err = write("failed").unwrap_err();
    assert_eq!(err.code(), "replication_failed", "{err}");

    let rename = "[[migrations]]\ntag = \"v1\"\nrenamed_classes = [{ from = \"probe\", to = \"counter\" }]\n";
    node.deploy_with_manifest("acme/shop", HELLO, rename)
        .unwrap();
    let rows = node
        .actor("acme/shop/counter/p1")
        .sql("SELECT v FROM writes");
    assert_eq!(rows, vec![vec![StoreValue::Text("kept".into())]]);
}

/// The database files set aside in counter `name`'s folder.
fn set_aside_files(node: &TestNode, name: &str) -> Vec<String> {
    let dir = node.data_dir().join(wasmkeep_store_dir(
        node,
        &format!("demo/examples/counter/{name}"),
    ));
    std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.starts_with("actor.db.replaced-")
                && !n.ends_with("-wal")
                && !n.ends_with("-shm")
                && !n.ends_with(".replica")
        })
        .collect()
}

fn wasmkeep_store_dir(node: &TestNode, address: &str) -> std::path::PathBuf {
    let id = node.actor(address).id().clone();
    wasmkeep_store::paths::actor_dir(std::path::Path::new(""), &id)
}

/// A `replicated` write whose upload landed while its local sync was
/// still pending is answered as done although a later write's failed
/// upload gives the actor up in between: the bucket holds it, and the
/// actor reopens from the bucket. Answered `replication_failed`, its
/// client's retry would count it twice.
#[test]
fn a_landed_write_is_done_though_the_actor_is_given_up_before_its_sync() {
    let (first, total) = landed_then_given_up(false);
    assert_eq!(first.unwrap(), 2);
    assert_eq!(total, 3, "each write counted once");
}

/// The unsafe variant of the rule above: the landed write is answered
/// `replication_failed`, and the retries count it twice.
#[test]
fn unsafe_failing_a_landed_write_after_a_give_up_counts_it_twice() {
    let (first, total) = landed_then_given_up(true);
    assert_eq!(first.unwrap_err().code(), "replication_failed");
    assert_eq!(total, 4, "the landed write counted twice");
}

/// Counter `a` at 1; a `replicated` increment whose replies the
/// durability stage holds until its upload has landed and a second
/// increment's failed upload has given the actor up. Returns the first
/// increment's answer, and the counter after the client retried each
/// increment that failed.
fn landed_then_given_up(unsafe_variant: bool) -> (Result<i64, RuntimeError>, i64) {
    use std::sync::atomic::Ordering::SeqCst;
    let (bucket, faults) = memory_bucket();
    let node = node_on(&bucket);
    let switches = node.runtime().faults();
    switches
        .unsafe_fail_landed_after_give_up
        .store(unsafe_variant, SeqCst);
    assert_eq!(increment(&node, "a", REPLICATED).unwrap(), 1);
    switches.hold_durability.store(true, SeqCst);
    let first = std::thread::scope(|s| {
        let first = s.spawn(|| increment(&node, "a", REPLICATED));
        wait_for_logs(&bucket, &node, 2);
        faults.fail_puts(1);
        let second = s.spawn(|| increment(&node, "a", REPLICATED));
        let given_up = &node.runtime().metrics().replica_given_up_total;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while given_up.get() == 0 {
            assert!(std::time::Instant::now() < deadline, "never given up");
            std::thread::sleep(Duration::from_millis(10));
        }
        // The give-up came while the first write's sync was held (the hold
        // ends by itself after 10 s).
        assert!(!first.is_finished(), "answered before the give-up");
        switches.hold_durability.store(false, SeqCst);
        let second = second.join().unwrap().unwrap_err();
        assert_eq!(second.code(), "replication_failed", "{second}");
        first.join().unwrap()
    });
    if first.is_err() {
        increment(&node, "a", REPLICATED).unwrap();
    }
    let total = increment(&node, "a", REPLICATED).unwrap();
    (first, total)
}

/// Waits (up to 20 s) until the bucket holds `n` of actor `a`'s entries.
fn wait_for_logs(bucket: &Bucket, node: &TestNode, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while bucket_logs(bucket, node) < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{n} entries never landed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Plain commits of a busy actor are uploaded at most once per
/// `replica_upload_interval_ms` (what a busy actor costs the bucket), and a
/// `replicated` request does not wait for the interval: its upload starts
/// at once and carries the plain commits before it.
#[test]
fn plain_commits_wait_for_the_upload_interval_and_replicated_ones_do_not() {
    let (bucket, _faults) = memory_bucket();
    let node = node_with(&bucket, |c| c.replica_upload_interval_ms = 3_600_000);
    // The actor's first upload is due at once.
    assert_eq!(increment(&node, "a", &[]).unwrap(), 1);
    wait_for_logs(&bucket, &node, 1);
    for n in 2..=6 {
        assert_eq!(increment(&node, "a", &[]).unwrap(), n);
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        bucket_logs(&bucket, &node),
        1,
        "a plain commit was uploaded within the interval"
    );

    // Answered within the test's bound, not after the hour.
    assert_eq!(increment(&node, "a", REPLICATED).unwrap(), 7);
    assert_eq!(
        bucket_logs(&bucket, &node),
        2,
        "one entry carries the six commits"
    );

    // A graceful stop uploads what waits for the interval.
    assert_eq!(increment(&node, "a", &[]).unwrap(), 8);
    node.runtime().shutdown(Duration::from_secs(10));
    assert_eq!(bucket_logs(&bucket, &node), 3);
    let second = node_on(&bucket);
    assert_eq!(increment(&second, "a", &[]).unwrap(), 9);
}

#[test]
fn a_node_with_an_empty_folder_restores_each_actor_on_first_use() {
    let (bucket, _faults) = memory_bucket();
    let first = node_on(&bucket);
    for _ in 0..3 {
        increment(&first, "a", &[]).unwrap();
    }
    increment(&first, "b", REPLICATED).unwrap();
    first
        .actor("demo/examples/reminder/r")
        .post("/set?at_ms=9999999999999", "");
    // A graceful stop sends what plain requests committed.
    first.runtime().shutdown(Duration::from_secs(10));

    let second = node_on(&bucket);
    assert_eq!(increment(&second, "a", &[]).unwrap(), 4);
    assert_eq!(increment(&second, "b", &[]).unwrap(), 2);
    // The alarm came back with the data.
    assert_eq!(
        second.actor("demo/examples/reminder/r").alarm(),
        Some(9_999_999_999_999)
    );
    // An actor the bucket never had does not appear.
    assert!(!second.actor("demo/examples/counter/never").exists());
}

/// Deleting an actor leaves a tombstone above its chain and erases the
/// entries below it in place (ADR 0007, "Deleting an actor"): nothing of
/// its data is left, and its next life continues the chain above the
/// tombstone instead of starting again at seq 0.
#[test]
fn deleting_an_actor_deletes_its_chain() {
    let (bucket, _faults) = memory_bucket();
    let node = node_on(&bucket);
    increment(&node, "a", REPLICATED).unwrap();
    assert_eq!(bucket_logs(&bucket, &node), 1);
    assert!(node.actor("demo/examples/counter/a").delete_actor());
    // log/0 erased in place, log/1 the tombstone: no pages anywhere.
    assert_eq!(bucket_logs(&bucket, &node), 2);
    assert_eq!(bucket_pages(&bucket, &node), vec![(0, 0), (1, 0)]);
    // Starts over, rather than coming back from the bucket, above the
    // tombstone.
    assert_eq!(increment(&node, "a", REPLICATED).unwrap(), 1);
    let pages = bucket_pages(&bucket, &node);
    assert_eq!(pages.len(), 3);
    assert_eq!(pages[2].0, 2);
    assert!(
        pages[2].1 > 0,
        "the new life's first entry carries its pages"
    );
}

/// A snapshot streaming from the actor's file when it is deleted: the
/// delete waits for it, so it cannot land below the tombstone after the
/// delete removed the snapshots there (bringing the old life's data back).
#[test]
fn a_delete_waits_for_a_snapshot_streaming() {
    delete_during_a_snapshot(false).unwrap();
}

#[test]
fn a_delete_that_does_not_wait_lets_the_deleted_life_back() {
    // The unsafe variant: the snapshot lands below the tombstone.
    let e = delete_during_a_snapshot(true).unwrap_err();
    assert!(e.contains("landed below the tombstone"), "{e}");
}

fn delete_during_a_snapshot(unsafe_no_wait: bool) -> Result<(), String> {
    let (bucket, faults) = memory_bucket();
    let node = node_with(&bucket, |c| {
        c.replica.snapshot_every_entries = 3;
        c.replica.unsafe_delete_ignores_snapshots = unsafe_no_wait;
    });
    // log/0, then three entries make a snapshot due: the next upload
    // (seq 4) freezes the file and its snapshot streams after it.
    let gate = faults.hold("snap/00000000000000000004");
    for _ in 0..5 {
        increment(&node, "a", REPLICATED).unwrap();
    }
    let exec = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    exec.block_on(gate.arrived());
    std::thread::scope(|s| {
        let deleting = s.spawn(|| node.actor("demo/examples/counter/a").delete_actor());
        std::thread::sleep(Duration::from_millis(300));
        gate.release();
        assert!(deleting.join().unwrap());
    });
    // Whatever was in flight has landed by now.
    std::thread::sleep(Duration::from_millis(300));
    let (exec, root) = actor_a_root(&bucket, &node);
    let logs = exec
        .block_on(bucket.list_seqs(&root.log_dir(), None, u64::MAX))
        .unwrap();
    let tombstone = *logs.last().unwrap();
    let snaps = exec
        .block_on(bucket.list_seqs(&root.snap_dir(), None, u64::MAX))
        .unwrap();
    if snaps.iter().any(|seq| *seq < tombstone) {
        return Err(format!(
            "a snapshot of the deleted life landed below the tombstone at {tombstone}: {snaps:?}"
        ));
    }
    Ok(())
}

/// Each entry of actor `a`'s `log/` as (seq, pages it carries).
fn bucket_pages(bucket: &Bucket, node: &TestNode) -> Vec<(u64, usize)> {
    let (exec, root) = actor_a_root(bucket, node);
    exec.block_on(async {
        let mut out = Vec::new();
        for seq in bucket
            .list_seqs(&root.log_dir(), None, u64::MAX)
            .await
            .unwrap()
        {
            let key = root.log(seq);
            let body = bucket.get_bounded(&key, "test", u64::MAX).await.unwrap();
            let e = wasmkeep_replica::Entry::decode(&key, &body, u64::MAX).unwrap();
            out.push((seq, e.pages.len()));
        }
        out
    })
}

#[test]
fn a_durable_request_on_a_node_without_a_bucket_is_refused() {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    let err = increment(&node, "a", REPLICATED).unwrap_err();
    assert_eq!(err.code(), "replication_unavailable");
    assert!(!node.actor("demo/examples/counter/a").exists());
}

/// A restore refused for what the bucket holds (a forged entry on a
/// folder bucket) is remembered for `restore_refused_retry_ms`: the actor's
/// next events get the same `storage_corrupt` without a request to the
/// bucket, and once the back-off has passed (the node's clock moved) the
/// next event reads the chain again, restoring it once it is repaired.
/// With a back-off of 0 (the rule off) every event reads the chain again.
#[test]
fn a_refused_restore_is_remembered_for_its_back_off() {
    for retry_ms in [60_000, 0] {
        refused_restore(retry_ms);
    }
}

fn refused_restore(retry_ms: u64) {
    let dir = tempfile::tempdir().unwrap();
    let store = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let (bucket, _faults) = faulty_bucket(Arc::new(store), "");
    let first = node_on(&bucket);
    assert_eq!(increment(&first, "a", REPLICATED).unwrap(), 1);
    let (_, root) = actor_a_root(&bucket, &first);
    first.runtime().shutdown(Duration::from_secs(10));
    drop(first);
    // A forged object where the chain's next entry would be.
    let bad = dir.path().join(root.log(1));
    std::fs::write(&bad, b"forged").unwrap();

    // A node with an empty data folder restores the actor on first use.
    let node = node_with(&bucket, |c| c.restore_refused_retry_ms = retry_ms);
    let refused = increment(&node, "a", &[]).unwrap_err();
    assert_eq!(refused.code(), "storage_corrupt", "{refused}");
    assert!(refused.to_string().contains(&root.log(1)), "{refused}");
    let before = bucket.metrics().snapshot();
    let again = increment(&node, "a", &[]).unwrap_err();
    let after = bucket.metrics().snapshot();
    assert_eq!(again.code(), "storage_corrupt");
    assert_eq!(again.to_string(), refused.to_string());
    if retry_ms > 0 {
        assert_eq!(
            after, before,
            "the bucket was read again within the back-off"
        );
    } else {
        assert!(after.lists > before.lists && after.gets > before.gets);
    }

    // Repaired: the node notices once the back-off has passed.
    std::fs::remove_file(&bad).unwrap();
    if retry_ms > 0 {
        let still = increment(&node, "a", &[]).unwrap_err();
        assert_eq!(still.code(), "storage_corrupt");
        node.advance(Duration::from_millis(retry_ms));
    }
    assert_eq!(increment(&node, "a", &[]).unwrap(), 2);
}
