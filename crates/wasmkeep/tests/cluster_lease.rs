//! A node's own lease in cluster mode (ADR 0020), through real processes
//! and a real folder bucket: `wasmkeep serve --bucket file://… --advertise
//! http://127.0.0.1:PORT` registers `nodes/<id>/<epoch>/<counter>` with its
//! address, renews it, releases it on SIGTERM, and takes a new epoch at
//! every start; a node cut off from its bucket stops acknowledging actor
//! requests before its lease could lapse for others, and comes back in a
//! new epoch when the bucket returns.
//!
//! Lease timings are set short through the configuration file; no test
//! asserts how long anything takes.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Node;
use common::cluster::{self, free_port, status};

/// Waits until `f` holds (a bound of 60 s for a hung cluster).
fn wait_for(what: &str, f: impl FnMut() -> bool) {
    cluster::wait_for(what, 60, 20, f)
}

const LEASE_PERIOD_MS: u64 = 1_500;
const LEASE_GRACE_MS: u64 = 2_000;
/// The bucket timeout of the cut-off test: well within a renewal period.
const BUCKET_TIMEOUT_MS: u64 = 400;

struct Cluster {
    _tmp: tempfile::TempDir,
    bucket: PathBuf,
    data: PathBuf,
    config: PathBuf,
    port: u16,
}

impl Cluster {
    /// A cluster of one node with this lease period and bucket timeout.
    fn new(period_ms: u64, bucket_timeout_ms: u64) -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let config =
            cluster::node_config(tmp.path(), period_ms, LEASE_GRACE_MS, bucket_timeout_ms, "");
        Cluster {
            bucket: tmp.path().join("bucket"),
            data: tmp.path().join("data"),
            config,
            port: free_port(),
            _tmp: tmp,
        }
    }

    fn advertise(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn start(&self) -> Node {
        let bucket = format!("file://{}", self.bucket.display());
        let flags = cluster::serve_flags(self.port, &self.config, &bucket);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Node::start(&self.data, &flags)
    }
}

/// The lease records of one epoch in a folder bucket: (counter, body).
fn records(bucket: &Path, node: &str, epoch: u64) -> Vec<(u64, String)> {
    let dir = bucket.join("nodes").join(node).join(format!("{epoch:020}"));
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<(u64, String)> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            let counter = e.file_name().to_str()?.parse().ok()?;
            Some((counter, std::fs::read_to_string(e.path()).ok()?))
        })
        .collect();
    out.sort();
    out
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn increment(node: &Node) -> (u16, String) {
    node.post("/v1/demo/examples/counter/c/increment", b"")
}

#[test]
fn the_lease_is_registered_renewed_released_and_a_restart_takes_the_next_epoch() {
    // This test counts epochs, so a renewal made late by a loaded machine
    // (another test's sync holding a bucket write up) must not lapse the
    // lease: a longer period and a bucket call allowed a second. The
    // cut-off test below is the one about lapses.
    let c = Cluster::new(3_000, 1_000);
    let mut node = c.start();
    wait_for("the node to act", || status(&node)["acting"] == true);
    let s = status(&node);
    let id = s["node"].as_str().unwrap().to_owned();
    assert_eq!(s["epoch"], 1, "{s}");
    assert_eq!(s["address"], c.advertise());
    let (code, body) = increment(&node);
    assert_eq!(code, 200, "{body}");

    // Registered with the advertised address, then renewed: later counters
    // appear (and records two back are deleted).
    let first = records(&c.bucket, &id, 1);
    assert!(!first.is_empty(), "no lease record under nodes/{id}/1");
    let (_, body) = first.last().unwrap();
    assert!(body.starts_with("live "), "{body}");
    assert!(body.ends_with(&format!(" {}", c.advertise())), "{body}");
    let seen = first.last().unwrap().0;
    wait_for("renewals", || {
        records(&c.bucket, &id, 1)
            .last()
            .is_some_and(|(n, _)| *n >= seen + 3)
    });
    let s = status(&node);
    let renewals = s["renewals_total"].as_u64().unwrap();
    assert!(renewals >= 4 && s["epoch"] == 1, "{s}");
    let (_, metrics) = node.get("/metrics");
    assert!(
        metrics.contains("wasmkeep_cluster_lease_renewals_total ")
            && metrics.contains("wasmkeep_cluster_epochs_total 1"),
        "{metrics}"
    );
    // The bucket's request counters count the cluster protocol's requests
    // too: every renewal is a PUT (one increment's upload adds one more).
    let puts = metrics
        .lines()
        .find_map(|l| l.strip_prefix("wasmkeep_bucket_puts_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("wasmkeep_bucket_puts_total");
    assert!(
        puts >= renewals as f64 + 1.0,
        "{puts} PUTs for {renewals} renewals"
    );

    // SIGTERM releases the lease: the epoch's last record says so.
    assert!(node.stop().success());
    let last = records(&c.bucket, &id, 1);
    let (_, body) = last.last().unwrap();
    assert!(body.starts_with("released "), "{last:?}");

    // A restart keeps the node id and takes the next epoch.
    let node = c.start();
    wait_for("the restarted node to act", || {
        status(&node)["acting"] == true
    });
    let s = status(&node);
    assert_eq!(
        (s["node"].as_str().unwrap(), s["epoch"].as_u64()),
        (id.as_str(), Some(2)),
        "{s}"
    );
    assert!(!records(&c.bucket, &id, 2).is_empty());
    let (code, body) = increment(&node);
    assert_eq!(code, 200, "{body}");
}

/// The bucket goes away (its folder replaced by a file, so every write
/// fails: the test runs as root, for whom `chmod 000` changes nothing).
/// The node must stop acknowledging before its latest landed record, plus
/// grace, lets any other node treat it as lapsed; when the bucket returns
/// it acts again in a new epoch.
#[test]
fn a_node_cut_off_from_its_bucket_stops_acting_then_rejoins_in_a_new_epoch() {
    let c = Cluster::new(LEASE_PERIOD_MS, BUCKET_TIMEOUT_MS);
    let node = c.start();
    wait_for("the node to act", || status(&node)["acting"] == true);
    let id = status(&node)["node"].as_str().unwrap().to_owned();
    let (code, body) = increment(&node);
    assert_eq!(code, 200, "{body}");

    // The epoch the cut falls in (a late renewal before it may already
    // have lapsed epoch 1).
    let cut_epoch = status(&node)["epoch"].as_u64().unwrap();
    let away = c.bucket.with_extension("away");
    std::fs::write(&away, "the bucket is unreachable").unwrap();
    exchange(&away, &c.bucket);

    // Poll actor writes until the node refuses them.
    let give_up = Instant::now() + Duration::from_secs(60);
    let refused_at = loop {
        assert!(Instant::now() < give_up, "the node never stopped acting");
        // Other answers may come meanwhile (the actor's replication fails
        // too, without the bucket); only node_not_acting ends the wait.
        let (code, body) = increment(&node);
        if body.contains("node_not_acting") {
            assert_eq!(code, 503, "{body}");
            break now_ms();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // What other nodes would judge by: the latest record that landed.
    let landed = records(&away, &id, cut_epoch);
    let (_, latest) = landed.last().expect("records landed before the cut");
    let expires: u64 = latest
        .split(' ')
        .nth(1)
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("not a live record: {latest}"));
    assert!(
        refused_at < expires + LEASE_GRACE_MS,
        "the node still acknowledged when others could take over: refused at {refused_at}, \
         lapsed for others at {}",
        expires + LEASE_GRACE_MS
    );
    let s = status(&node);
    assert_eq!(s["acting"], false);
    let (code, _) = increment(&node);
    assert_eq!(code, 503);

    // The bucket returns: a new epoch registers and writes are acknowledged.
    exchange(&away, &c.bucket);
    std::fs::remove_file(&away).unwrap();
    let mut s = serde_json::Value::Null;
    wait_for("the node to act again", || {
        s = status(&node);
        s["acting"] == true
    });
    // At least the cut's lapse, and a new epoch for each (a loaded machine
    // can make a renewal late once more after the bucket returns); but no
    // epoch used up while the bucket was away: each registered, so each
    // has records.
    let (epoch, lapsed) = (
        s["epoch"].as_u64().unwrap(),
        s["lapsed_total"].as_u64().unwrap(),
    );
    assert!(lapsed >= 1 && epoch == lapsed + 1, "{s}");
    for e in cut_epoch + 1..=epoch {
        assert!(!records(&c.bucket, &id, e).is_empty(), "epoch {e}: {s}");
    }
    wait_for("an acknowledged write", || increment(&node).0 == 200);
}

/// A node given `cluster_node_id` loses its disk (killed, its data
/// directory removed) and starts again on an empty one (ADR 0069): it has
/// the same id, in the epoch after its last, and the actor its dead epoch
/// held is taken at once, with its value, while that epoch's last lease
/// record still says live: not after the lease lapsed, as for a node that
/// came back under a new id. (The lease is 60 s long so that the two
/// cannot be confused, however slow the restart.) A start that finds the
/// id's newest epoch live fences it first: the dead epoch's records end
/// with that fence.
#[test]
fn a_configured_node_id_survives_a_lost_disk_and_its_actors_are_taken_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bucket");
    let bucket_url = format!("file://{}", bucket.display());
    let start = |name: &str, port: u16, more: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let config = cluster::node_config(&dir, 60_000, 20_000, 400, more);
        let flags = cluster::serve_flags(port, &config, &bucket_url);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Node::start(&dir.join("data"), &flags)
    };
    let (port_a, port_b) = (free_port(), free_port());
    let mut a = start("a", port_a, "cluster_node_id = \"node-a\"\n");
    let b = start("b", port_b, "");
    for n in [&a, &b] {
        wait_for("the node to act", || status(n)["acting"] == true);
    }
    assert_eq!(
        (status(&a)["node"].as_str(), status(&a)["epoch"].as_u64()),
        (Some("node-a"), Some(1))
    );
    for _ in 0..3 {
        let (code, body) = increment(&a);
        assert_eq!(code, 200, "{body}");
    }

    a.kill();
    let (_, last) = records(&bucket, "node-a", 1)
        .pop()
        .expect("epoch 1's records");
    let expires_at_ms: u64 = last
        .strip_prefix("live ")
        .and_then(|r| r.split(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("epoch 1 ended live, not {last}"));
    std::fs::remove_dir_all(tmp.path().join("a").join("data")).unwrap();
    let a = start("a", port_a, "cluster_node_id = \"node-a\"\n");
    wait_for("the node to act again", || status(&a)["acting"] == true);
    assert_eq!(
        (status(&a)["node"].as_str(), status(&a)["epoch"].as_u64()),
        (Some("node-a"), Some(2))
    );
    // Every answer before the first 200, for the message if the value is
    // off (a refused increment must not have counted).
    let mut answers: Vec<(u16, String)> = Vec::new();
    wait_for("the other node to serve the actor", || {
        answers.push(increment(&b));
        answers.last().unwrap().0 == 200
    });
    let answer = answers.last().unwrap().clone();
    assert!(
        now_ms() < expires_at_ms,
        "taken only after epoch 1's lease ran out ({expires_at_ms})"
    );
    let v: serde_json::Value = serde_json::from_str(&answer.1).unwrap();
    assert_eq!(v["value"], 4, "answers: {answers:?}");
    let (_, ended) = records(&bucket, "node-a", 1).pop().unwrap();
    assert!(ended.starts_with("fenced node-a "), "{ended}");
}

/// Swaps the entries at `a` and `b` in one step (`renameat2` with
/// `RENAME_EXCHANGE`). The node writes to the bucket all the while: between
/// a removal and a rename it found the path missing and made a folder
/// there (a CI run's rename then failed with "Directory not empty").
fn exchange(a: &Path, b: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let (a, b) = (c(a), c(b));
    // SAFETY: two valid NUL-terminated paths; the call only renames.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(rc, 0, "exchange: {}", std::io::Error::last_os_error());
}
