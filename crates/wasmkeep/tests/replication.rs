//! Replication through real processes: `wasmkeep serve --bucket` against a
//! real S3-compatible server (moto, honouring the AWS_* environment as a
//! user would set it) and against a local folder (`file://`), then a fresh
//! node with an empty data folder on the same bucket, and the `export` and
//! `restore` commands. In-process cases (a held or failing upload) are in
//! `crates/wasmkeep-testkit/tests/replication.rs`.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::Node;
use wasmkeep_replica::testing::Moto;

const COUNTERS: usize = 8;

/// Where a node keeps its data and how it reaches the bucket.
struct Target {
    url: String,
    env: Vec<(&'static str, String)>,
}

fn moto_target(moto: &Moto, bucket: &str) -> Target {
    moto.create_bucket(bucket);
    Target {
        url: format!("s3://{bucket}/nodes"),
        env: moto.env(),
    }
}

fn folder_target(dir: &Path) -> Target {
    Target {
        url: format!("file://{}", dir.display()),
        env: Vec::new(),
    }
}

fn start(data: &Path, t: &Target) -> Node {
    Node::start_env(data, &["--examples", "--bucket", &t.url], &t.env)
}

/// A counter of the node's `/metrics`.
fn metric(node: &Node, name: &str) -> f64 {
    let (s, text) = node.get("/metrics");
    assert_eq!(s, 200, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

fn value(v: &str) -> i64 {
    let j: serde_json::Value = serde_json::from_str(v).unwrap_or_else(|_| panic!("not JSON: {v}"));
    j["value"]
        .as_i64()
        .unwrap_or_else(|| panic!("no value: {v}"))
}

/// Durable increments on several counters from several threads until the
/// node is SIGKILLed; then a node with an empty folder on the same bucket
/// must hold every increment that was acknowledged.
fn acknowledged_writes_survive_sigkill(t: &Target) {
    let tmp = tempfile::tempdir().unwrap();
    let mut a = start(&tmp.path().join("a"), t);
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Vec<Arc<std::sync::atomic::AtomicI64>> = (0..COUNTERS)
        .map(|_| Arc::new(std::sync::atomic::AtomicI64::new(0)))
        .collect();
    let base = a.base.clone();
    let workers: Vec<_> = (0..COUNTERS)
        .map(|i| {
            let (stop, acked, base) = (Arc::clone(&stop), Arc::clone(&acked[i]), base.clone());
            std::thread::spawn(move || {
                let agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(10)))
                    .build()
                    .new_agent();
                // Half use the header, half the query flag.
                while !stop.load(Ordering::Relaxed) {
                    let url = format!("{base}/v1/demo/examples/counter/c{i}/increment");
                    let r = if i % 2 == 0 {
                        agent
                            .post(&url)
                            .header("wasmkeep-durability", "replicated")
                            .send(&[][..])
                    } else {
                        agent
                            .post(&format!("{url}?wasmkeep-durability=replicated"))
                            .send(&[][..])
                    };
                    let Ok(mut r) = r else { return };
                    if r.status() != 200 {
                        continue;
                    }
                    let body = r.body_mut().read_to_string().unwrap_or_default();
                    acked.fetch_max(value(&body), Ordering::SeqCst);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(2500));
    // The node was uploading the pages its commits wrote (ADR 0036), so
    // the kill falls between capturing pages and uploading them.
    assert!(metric(&a, "wasmkeep_replica_page_uploads_total") > 0.0);
    a.kill();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let total: i64 = acked.iter().map(|a| a.load(Ordering::SeqCst)).sum();
    assert!(
        total > 0,
        "no durable write was acknowledged before the kill"
    );

    let b = start(&tmp.path().join("b"), t);
    for (i, acked) in acked.iter().enumerate() {
        let (s, body) = b.get(&format!("/v1/demo/examples/counter/c{i}/value"));
        assert_eq!(s, 200, "{body}");
        let acked = acked.load(Ordering::SeqCst);
        // Writes that were not acknowledged may or may not be there; every
        // acknowledged one must be.
        assert!(
            value(&body) >= acked,
            "counter c{i}: the bucket has {} but {acked} was acknowledged",
            value(&body)
        );
    }
}

/// A node stopped cleanly has uploaded everything; a fresh node's restored
/// file is the same bytes as the first node's.
fn restore_is_byte_identical(t: &Target) {
    let tmp = tempfile::tempdir().unwrap();
    let mut a = start(&tmp.path().join("a"), t);
    for i in 0..20 {
        let (s, _) = a.post(
            &format!("/v1/demo/examples/notes/n/notes?title=t{i}"),
            format!("body {i} {}", "x".repeat(i * 300)).as_bytes(),
        );
        assert_eq!(s, 201);
    }
    let (s, _) = a.post("/v1/demo/examples/reminder/r/set?at_ms=9999999999999", b"");
    assert_eq!(s, 200);
    // The uploads after an actor's first shipped captured pages (plain
    // replies: the notes after the first go in one upload at the end of
    // the upload interval, a second from now).
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while metric(&a, "wasmkeep_replica_page_uploads_total") < 1.0 {
        assert!(std::time::Instant::now() < until, "no upload of pages");
        std::thread::sleep(Duration::from_millis(100));
    }
    a.stop();

    let mut b = start(&tmp.path().join("b"), t);
    let (s, notes_b) = b.get("/v1/demo/examples/notes/n/notes");
    assert_eq!(s, 200, "{notes_b}");
    assert!(notes_b.contains("t19"), "{notes_b}");
    // Same alarm.
    let (s, alarm) = b.get("/v1/demo/examples/reminder/r/alarm");
    assert_eq!((s, alarm.as_str()), (200, r#"{"alarm":9999999999999}"#));
    b.stop();

    for name in ["notes/6e", "reminder/72"] {
        let rel = format!("actors/demo/examples/{name}/actor.db");
        // Read through SQLite: a closed actor's file may leave its last
        // commits in a short log beside it (ADR 0076).
        let read = |node: &str| {
            let path = tmp.path().join(node).join(&rel);
            wasmkeep_replica::Image::read_path(&path)
                .unwrap()
                .bytes()
                .to_vec()
        };
        let (fa, fb) = (read("a"), read("b"));
        assert!(
            fa == fb,
            "{rel}: the restored file differs from the original"
        );
    }
}

/// `export --at` gives the state of that point; `restore` puts a file back
/// and a node picks it up.
/// A node with the examples on `t`'s bucket, its data in `data`.
fn start_node(t: &Target, data: &Path, config: &Path) -> Node {
    Node::start_env(
        data,
        &[
            "--examples",
            "--bucket",
            &t.url,
            "--config",
            config.to_str().unwrap(),
        ],
        &t.env,
    )
}

fn export_and_restore(t: &Target, tmp: &Path) {
    // Keep every entry: no snapshot within this test.
    let config = tmp.join("node.toml");
    std::fs::write(
        &config,
        "replica_snapshot_every_entries = 100000\nreplica_snapshot_log_ratio_pct = 100000000\n",
    )
    .unwrap();
    let node = start_node(t, &tmp.join("a"), &config);
    for want in 1..=5 {
        let (s, body) = node.send_headers(
            "POST",
            "/v1/demo/examples/counter/e/increment",
            b"",
            &[("wasmkeep-durability", "replicated".into())],
        );
        assert_eq!((s, value(&body)), (200, want));
    }
    // Each durable increment was one entry: seq 2 holds the third.
    let out = tmp.join("at2.db");
    let run = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
            .args(args)
            .envs(t.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    run(&[
        "export",
        "--bucket",
        &t.url,
        "demo/examples/counter/e",
        "--at",
        "2",
        "-o",
        out.to_str().unwrap(),
    ]);
    let r = wasmkeep_store::db::inspect_query(
        &out,
        "SELECT n FROM counter",
        &wasmkeep_store::InspectBounds::rows(1),
    )
    .unwrap();
    assert_eq!(r.rows, vec![vec![wasmkeep_store::Value::Integer(3)]]);
    // The nodes' configuration file reaches export: with their database
    // bound below this actor's size, the same export is refused and names
    // the bound (so a chain nodes with larger bounds wrote is read with
    // theirs, not the defaults).
    let small = tmp.join("small.toml");
    std::fs::write(&small, "database_bytes_max = 4096\n").unwrap();
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args(["export", "--bucket", &t.url, "demo/examples/counter/e"])
        .args(["--at", "2", "--config", small.to_str().unwrap(), "-o"])
        .arg(tmp.join("small.db"))
        .envs(t.env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "exported past a 4 KiB bound");
    assert!(err.contains("limit entry_bytes_max="), "{err}");
    assert!(!tmp.join("small.db").exists());

    // Put seq 2's state back through the node: between two of the actor's
    // events, so that the write acknowledged right after builds on it
    // (issue 33: written into the bucket behind the node, that write was
    // lost a moment later).
    run(&[
        "restore",
        "--server",
        &node.base,
        "demo/examples/counter/e",
        "-i",
        out.to_str().unwrap(),
    ]);
    let (s, body) = node.post("/v1/demo/examples/counter/e/increment", b"");
    assert_eq!((s, value(&body)), (200, 4));
    let (s, body) = node.send_headers(
        "GET",
        "/v1/demo/examples/counter/e/value",
        b"",
        &[("wasmkeep-durability", "replicated".into())],
    );
    assert_eq!(
        (s, value(&body)),
        (200, 4),
        "the write after the restore was lost"
    );
    // With the node stopped, straight into the bucket: the node finds the
    // chain moved when it starts, and serves the restored state.
    let mut node = node;
    node.stop();
    run(&[
        "restore",
        "--bucket",
        &t.url,
        "demo/examples/counter/e",
        "-i",
        out.to_str().unwrap(),
    ]);
    let node = start_node(t, &tmp.join("a"), &config);
    let (s, body) = node.get("/v1/demo/examples/counter/e/value");
    assert_eq!((s, value(&body)), (200, 3), "{body}");
}

/// `wasmkeep fork`: an actor as the bucket held it at a past point
/// becomes a new actor through the node; the source is untouched, an
/// existing target is refused unless --replace (issue 36, "Undo").
fn fork(t: &Target, tmp: &Path) {
    let config = tmp.join("fork.toml");
    std::fs::write(
        &config,
        "replica_snapshot_every_entries = 100000\nreplica_snapshot_log_ratio_pct = 100000000\n",
    )
    .unwrap();
    let node = start_node(t, &tmp.join("fork-node"), &config);
    for want in 1..=5 {
        let (s, body) = node.send_headers(
            "POST",
            "/v1/demo/examples/counter/f/increment",
            b"",
            &[("wasmkeep-durability", "replicated".into())],
        );
        assert_eq!((s, value(&body)), (200, want));
    }
    let fork = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
            .args(["fork", "--bucket", &t.url, "--server", &node.base])
            .args(args)
            .envs(t.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap()
    };
    let o = fork(&[
        "demo/examples/counter/f",
        "demo/examples/counter/f-at-2",
        "--at",
        "2",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (_, body) = node.get("/v1/demo/examples/counter/f-at-2/value");
    assert_eq!(value(&body), 3, "seq 2 held the third increment");
    let (_, body) = node.get("/v1/demo/examples/counter/f/value");
    assert_eq!(value(&body), 5, "the source is untouched");
    // The copy is an actor of its own from now on.
    let (_, body) = node.post("/v1/demo/examples/counter/f-at-2/increment", b"");
    assert_eq!(value(&body), 4);
    let again = fork(&[
        "demo/examples/counter/f",
        "demo/examples/counter/f-at-2",
        "--at",
        "0",
    ]);
    assert!(!again.status.success(), "an existing target was replaced");
    assert!(String::from_utf8_lossy(&again.stderr).contains("actor_exists"));
    let o = fork(&[
        "demo/examples/counter/f",
        "demo/examples/counter/f-at-2",
        "--at",
        "0",
        "--replace",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (_, body) = node.get("/v1/demo/examples/counter/f-at-2/value");
    assert_eq!(value(&body), 1);
    let same = fork(&["demo/examples/counter/f", "demo/examples/counter/f"]);
    assert!(!same.status.success(), "forked onto itself");
}

/// A node that ran without a bucket moves onto one: `wasmkeep upload`
/// ships its actors, and a fresh node on the bucket has their data. The
/// upload refuses to run beside the node; after the node's crash, with the
/// actors' logs lost as a power cut may lose them, it replays the node's
/// commit log first and ships every acknowledged write.
fn bulk_upload(t: &Target, tmp: &Path) {
    let mut local = Node::start(&tmp.join("local"), &["--examples"]);
    for i in 0..3 {
        for _ in 0..=i {
            let (s, _) = local.post(&format!("/v1/demo/examples/counter/u{i}/increment"), b"");
            assert_eq!(s, 200);
        }
    }
    let upload = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
            .args(["upload", "--bucket", &t.url, "--data"])
            .arg(tmp.join("local"))
            .envs(t.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap()
    };
    let beside = upload();
    let said = String::from_utf8_lossy(&beside.stderr);
    assert!(
        !beside.status.success() && said.contains("in use by process"),
        "{said}"
    );
    local.kill();
    assert_eq!(common::empty_actor_logs(&tmp.join("local")), 3);
    let o = upload();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("3 actors uploaded"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let fresh = start(&tmp.join("fresh"), t);
    for i in 0..3 {
        let (s, body) = fresh.get(&format!("/v1/demo/examples/counter/u{i}/value"));
        assert_eq!((s, value(&body)), (200, i + 1));
    }
}

/// A node that ran without a bucket and restarts with one ships its actors
/// by itself, without a request to any of them. An actor larger than one
/// part of the bucket's uploads goes page by page, in parts, behind a
/// pointer (ADR 0038): nothing reads it into memory, and an export gives
/// back every note. There are more large actors than a node uploads at
/// once (`FILE_UPLOADS_RUNNING_MAX`): those that find no slot come back for
/// one.
fn local_data_moves_onto_the_bucket_at_start(t: &Target, tmp: &Path, bucket_dir: Option<&Path>) {
    const LARGE: usize = 6;
    const NOTES: usize = 6;
    const NOTE_BYTES: usize = 1_000_000;
    let data = tmp.join("grows");
    let mut local = Node::start(&data, &["--examples"]);
    let (s, _) = local.post("/v1/demo/examples/counter/g/increment", b"");
    assert_eq!(s, 200);
    for a in 0..LARGE {
        for i in 0..NOTES {
            let text = vec![b'a' + i as u8; NOTE_BYTES];
            let path = format!("/v1/demo/examples/notes/big{a}/notes?title=n{i}");
            let (s, body) = local.post(&path, &text);
            assert_eq!(s, 201, "{body}");
        }
    }
    local.stop();
    // Parts of 5 MiB: each large actor is two.
    let config = tmp.join("parts.toml");
    std::fs::write(&config, "replica_snapshot_part_bytes = 5242880\n").unwrap();
    let args = [
        "--examples",
        "--bucket",
        &t.url,
        "--config",
        config.to_str().unwrap(),
    ];
    let node = Node::start_env(&data, &args, &t.env);
    let export = |target: &str, out: &Path| {
        for _ in 0..300 {
            let o = std::process::Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
                .args(["export", "--bucket", &t.url, target, "-o"])
                .arg(out)
                .envs(t.env.iter().map(|(k, v)| (*k, v.as_str())))
                .output()
                .unwrap();
            if o.status.success() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("{target} never reached the bucket");
    };
    let out = tmp.join("g.db");
    export("demo/examples/counter/g", &out);
    let r = wasmkeep_store::db::inspect_query(
        &out,
        "SELECT n FROM counter",
        &wasmkeep_store::InspectBounds::rows(1),
    )
    .unwrap();
    assert_eq!(r.rows, vec![vec![wasmkeep_store::Value::Integer(1)]]);
    let n = |v: usize| wasmkeep_store::Value::Integer(v as i64);
    for a in 0..LARGE {
        let out = tmp.join(format!("big{a}.db"));
        export(&format!("demo/examples/notes/big{a}"), &out);
        assert!(std::fs::metadata(&out).unwrap().len() > (NOTES * NOTE_BYTES) as u64);
        let r = wasmkeep_store::db::inspect_query(
            &out,
            "SELECT count(*), sum(length(body)), count(DISTINCT body) FROM notes",
            &wasmkeep_store::InspectBounds::rows(1),
        )
        .unwrap();
        assert_eq!(
            r.rows,
            vec![vec![n(NOTES), n(NOTES * NOTE_BYTES), n(NOTES)]]
        );
        if let Some(dir) = bucket_dir {
            // The first entry is a pointer to its body in parts.
            let id = wasmkeep_store::ActorId::new("demo", "examples", "notes", &format!("big{a}"));
            let root = dir.join(
                wasmkeep_replica::ActorRoot::new(&id.unwrap(), 0)
                    .unwrap()
                    .as_str(),
            );
            let wholes = std::fs::read_dir(root.join("whole")).map_or(0, |d| d.count());
            assert_eq!(wholes, 1, "one body under whole/");
            let pointer = std::fs::metadata(root.join(format!("log/{:020}", 0))).unwrap();
            assert!(pointer.len() < 1024, "log/0 is {} bytes", pointer.len());
        }
    }
    assert_eq!(
        metric(&node, "wasmkeep_replica_file_reads_total"),
        (LARGE + 1) as f64
    );
    assert_eq!(metric(&node, "wasmkeep_replica_image_reads_total"), 0.0);
}

/// Snapshots taken by a running node stream from its file beside the
/// uploads (ADR 0036): with a snapshot due every few entries, the node
/// reads its file whole only for the actor's first upload (page by page,
/// ADR 0038), never into memory, every
/// snapshot lands, the ones after the first whole one are deltas (ADR
/// 0037: a counter's commits change a page or two), and a fresh node
/// restores the last acknowledged value through them.
fn snapshots_stream_from_the_file(t: &Target, tmp: &Path) {
    let config = tmp.join("snapshots.toml");
    std::fs::write(&config, "replica_snapshot_every_entries = 4\n").unwrap();
    let cfg = config.to_str().unwrap();
    let data = tmp.join("snapshots-a");
    let a = Node::start_env(
        &data,
        &["--examples", "--bucket", &t.url, "--config", cfg],
        &t.env,
    );
    let mut last = 0;
    for _ in 0..30 {
        let (s, body) = a.post(
            "/v1/demo/examples/counter/snap/increment?wasmkeep-durability=replicated",
            b"",
        );
        assert_eq!(s, 200, "{body}");
        last = value(&body);
    }
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while metric(&a, "wasmkeep_replica_snapshots_total") < 1.0
        || metric(&a, "wasmkeep_replica_deltas_total") < 2.0
    {
        assert!(
            std::time::Instant::now() < until,
            "too few snapshots and deltas landed"
        );
        a.post(
            "/v1/demo/examples/counter/snap/increment?wasmkeep-durability=replicated",
            b"",
        );
        last += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    // The first upload read the file page by page (ADR 0038); nothing read
    // the database into memory.
    assert_eq!(metric(&a, "wasmkeep_replica_file_reads_total"), 1.0);
    assert_eq!(metric(&a, "wasmkeep_replica_image_reads_total"), 0.0);
    assert_eq!(metric(&a, "wasmkeep_replica_snapshot_failures_total"), 0.0);
    drop(a);
    let b = start(&tmp.join("snapshots-b"), t);
    let (s, body) = b.get("/v1/demo/examples/counter/snap/value");
    assert_eq!(s, 200, "{body}");
    assert!(value(&body) >= last, "{body}: {last} was acknowledged");
}

/// Plain writes on a node with a bucket survive the node's crash before
/// their upload (ADR 0082). One replicated increment lands; two plain ones
/// wait for the upload interval (20 s here) when the node is SIGKILLed.
/// The restarted node, asked nothing, finds the file ahead of the bucket's
/// head at its start (the lock says the last node crashed), keeps it and
/// uploads it; it serves 3, and after it is killed too, a node with an
/// empty folder on the same bucket reads 3. (Before, the restarted node
/// served the bucket's 1 and set the file aside.) With `down`, a node
/// that cannot reach its bucket (`down` names one that does not exist)
/// runs and stops cleanly in between: its stop leaves the crash marker
/// (ADR 0082), since it could check nothing, so the next node still looks.
fn plain_writes_survive_the_nodes_crash(t: &Target, down: Option<&Target>, tmp: &Path) {
    std::fs::create_dir_all(tmp).unwrap();
    let config = tmp.join("slow-uploads.toml");
    std::fs::write(&config, "replica_upload_interval_ms = 20000\n").unwrap();
    let data = tmp.join("crashes");
    let counter = "/v1/demo/examples/counter/plain";
    let mut a = start_node(t, &data, &config);
    let (s, body) = a.post(
        &format!("{counter}/increment?wasmkeep-durability=replicated"),
        b"",
    );
    assert_eq!((s, value(&body)), (200, 1), "{body}");
    for n in 2..=3 {
        let (s, body) = a.post(&format!("{counter}/increment"), b"");
        assert_eq!((s, value(&body)), (200, n), "{body}");
    }
    let uploads = metric(&a, "wasmkeep_replica_uploads_total");
    a.kill();
    assert_eq!(
        uploads, 1.0,
        "the plain writes were uploaded before the kill"
    );
    if let Some(down) = down {
        let mut cut_off = start_node(down, &data, &config);
        assert!(cut_off.stop().success());
    }
    let mut b = start_node(t, &data, &config);
    common::cluster::wait_for(
        "the restarted node to upload the kept file by itself",
        60,
        50,
        || {
            metric(&b, "wasmkeep_replica_kept_ahead_total") >= 1.0
                && metric(&b, "wasmkeep_replica_uploads_total") >= 1.0
        },
    );
    let (s, body) = b.get(&format!("{counter}/value"));
    assert_eq!((s, value(&body)), (200, 3), "{body}");
    b.kill();
    let fresh = start(&tmp.join("crashes-fresh"), t);
    let (s, body) = fresh.get(&format!("{counter}/value"));
    assert_eq!((s, value(&body)), (200, 3), "{body}");
}

#[test]
fn on_moto() {
    let moto = Moto::start();
    acknowledged_writes_survive_sigkill(&moto_target(&moto, "kill"));
    restore_is_byte_identical(&moto_target(&moto, "bytes"));
    let tmp = tempfile::tempdir().unwrap();
    export_and_restore(&moto_target(&moto, "export"), tmp.path());
    fork(&moto_target(&moto, "fork"), tmp.path());
    bulk_upload(&moto_target(&moto, "upload"), tmp.path());
    snapshots_stream_from_the_file(&moto_target(&moto, "snapshots"), tmp.path());
    local_data_moves_onto_the_bucket_at_start(&moto_target(&moto, "start"), tmp.path(), None);
    plain_writes_survive_the_nodes_crash(&moto_target(&moto, "crashes"), None, tmp.path());
    let missing = Target {
        url: "s3://no-such-bucket/nodes".into(),
        env: moto.env(),
    };
    plain_writes_survive_the_nodes_crash(
        &moto_target(&moto, "crashes-twice"),
        Some(&missing),
        &tmp.path().join("twice"),
    );
}

#[test]
fn on_a_local_folder() {
    let dirs = tempfile::tempdir().unwrap();
    for d in ["kill", "bytes", "export", "upload"] {
        std::fs::create_dir_all(dirs.path().join(d)).unwrap();
    }
    acknowledged_writes_survive_sigkill(&folder_target(&dirs.path().join("kill")));
    restore_is_byte_identical(&folder_target(&dirs.path().join("bytes")));
    let tmp = tempfile::tempdir().unwrap();
    export_and_restore(&folder_target(&dirs.path().join("export")), tmp.path());
    fork(&folder_target(&dirs.path().join("fork")), tmp.path());
    bulk_upload(&folder_target(&dirs.path().join("upload")), tmp.path());
    std::fs::create_dir_all(dirs.path().join("snapshots")).unwrap();
    snapshots_stream_from_the_file(&folder_target(&dirs.path().join("snapshots")), tmp.path());
    let start = dirs.path().join("start");
    std::fs::create_dir_all(&start).unwrap();
    local_data_moves_onto_the_bucket_at_start(&folder_target(&start), tmp.path(), Some(&start));
}
