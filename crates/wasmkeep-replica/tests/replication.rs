//! The replica against real stores: a local folder (`file://`), the
//! in-memory store, and a real S3 server (moto). Every scenario runs on
//! each; the source databases are the real store's.

mod common;

use std::path::{Path, PathBuf};

use common::{Backend, Moto, Source, actor, dump, dump_bytes};
use wasmkeep_replica::limits::COLLECT_GRACE_MS;
use wasmkeep_replica::{
    At, Bucket, Entry, Kind, Opened, Pages, Replica, ReplicaConfig, ReplicaError, Uploaded, Void,
    delete_all, export,
};
use wasmkeep_store::{ActorDb, ActorId, OpenMode, StoreLimits, Value};

const SCHEMA: &[&str] = &[
    "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL)",
    // No primary key: a logical changeset could not replicate it.
    "CREATE TABLE events (at INTEGER, body BLOB)",
    "CREATE TABLE tags (k TEXT PRIMARY KEY, v TEXT) WITHOUT ROWID",
    "CREATE INDEX events_at ON events (at)",
];

fn cfg(every: u64, keep: usize) -> ReplicaConfig {
    ReplicaConfig {
        snapshot_every_entries: every,
        snapshots_keep: keep,
        // Tests choose when snapshots happen by count alone.
        snapshot_log_ratio_pct: u64::MAX / 1_000_000,
        // Collection at once, and so the re-creation check after every
        // create; the scenarios about the grace set their own.
        collect_grace_ms: 0,
        ..ReplicaConfig::default()
    }
}

fn schema(src: &mut Source) {
    let stmts: Vec<(&str, Vec<Value>)> = SCHEMA.iter().map(|s| (*s, vec![])).collect();
    src.commit(&stmts);
}

/// One commit that touches every table, grows the file and deletes a bit.
fn work(src: &mut Source, i: i64) {
    src.commit(&[
        (
            "INSERT INTO users (id, name) VALUES (?, ?)",
            vec![Value::Integer(i), Value::Text(format!("user {i}"))],
        ),
        (
            "INSERT INTO events (at, body) VALUES (?, ?)",
            vec![
                Value::Integer(i),
                Value::Blob(vec![i as u8; 700 + 97 * i as usize]),
            ],
        ),
        (
            "INSERT OR REPLACE INTO tags (k, v) VALUES (?, ?)",
            vec![
                Value::Text(format!("k{}", i % 5)),
                Value::Text(format!("v{i}")),
            ],
        ),
        (
            "DELETE FROM events WHERE at = ?",
            vec![Value::Integer(i - 7)],
        ),
    ]);
}

async fn upload(
    rep: &mut Replica,
    src: &mut Source,
    time_ms: u64,
) -> Result<Uploaded, ReplicaError> {
    let image = src.image();
    rep.upload(&image, time_ms).await
}

fn appended_seq(u: &Uploaded) -> u64 {
    match u {
        Uploaded::Appended { position, .. } => position.seq,
        Uploaded::Unchanged => panic!("expected an append"),
    }
}

async fn keys(bucket: &Bucket, rep: &Replica, dir: &str) -> Vec<String> {
    let d = format!("{}{dir}/", rep.root().as_str());
    bucket.list(&d, None, u64::MAX).await.unwrap()
}

/// Restores `rep`'s actor into a fresh folder under `tmp` and checks that
/// it is at the same head and is `source`, byte for byte; returns its path.
async fn restored_elsewhere(
    b: &Backend,
    id: &wasmkeep_store::ActorId,
    rep: &Replica,
    tmp: &std::path::Path,
    config: ReplicaConfig,
    source: &[u8],
) -> std::path::PathBuf {
    let dst = tmp.join("dst").join("actor.db");
    let (rep2, opened) = Replica::open(&b.bucket, id, &dst, 2, config, 5000)
        .await
        .unwrap();
    assert_eq!(opened, Opened::Restored { replaced: None });
    assert_eq!(rep2.head(), rep.head());
    assert!(
        std::fs::read(&dst).unwrap() == source,
        "restored file differs"
    );
    dst
}

/// Many commits, uploaded one or two at a time, with snapshots and
/// collection on the way; a restore elsewhere is the same file, byte for
/// byte, and reopening it downloads nothing.
async fn restore_is_byte_identical(b: &Backend, name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    let mut src = Source::new(&tmp.path().join("src"));
    let (mut rep, opened) = Replica::open(&b.bucket, &id, &src.path(), 1, cfg(7, 2), 0)
        .await
        .unwrap();
    assert_eq!(opened, Opened::BucketEmpty { local: true });
    schema(&mut src);
    let first = upload(&mut rep, &mut src, 1000).await.unwrap();
    assert_eq!(appended_seq(&first), 0);
    for i in 1..60i64 {
        work(&mut src, i);
        if i % 3 != 0 {
            let before = b.bucket.metrics().snapshot();
            let up = upload(&mut rep, &mut src, 1000 + i as u64).await.unwrap();
            let after = b.bucket.metrics().snapshot();
            if let Uploaded::Appended {
                snapshot: false, ..
            } = up
            {
                // One create and one listing per entry.
                assert_eq!(after.puts - before.puts, 1);
                assert_eq!(after.lists - before.lists, 1);
            }
        }
    }
    upload(&mut rep, &mut src, 2000).await.unwrap();
    assert_eq!(
        upload(&mut rep, &mut src, 2001).await.unwrap(),
        Uploaded::Unchanged
    );
    let snaps = keys(&b.bucket, &rep, "snap").await;
    assert_eq!(snaps.len(), 2, "{snaps:?}");
    let logs = keys(&b.bucket, &rep, "log").await;
    assert!(
        !logs
            .iter()
            .any(|k| k.ends_with("/log/00000000000000000000")),
        "{logs:?}"
    );
    assert!(!logs.is_empty(), "entries after the latest snapshot stay");

    let source = src.close_and_read();
    let dst = restored_elsewhere(b, &id, &rep, tmp.path(), cfg(7, 2), &source).await;
    assert_eq!(
        export(&b.bucket, &id, At::Latest, &cfg(7, 2))
            .await
            .unwrap(),
        source
    );
    // The sidecar matches: opening again downloads nothing.
    let gets = b.bucket.metrics().snapshot().get_bytes;
    let (_, opened) = Replica::open(&b.bucket, &id, &dst, 3, cfg(7, 2), 6000)
        .await
        .unwrap();
    assert_eq!(opened, Opened::UpToDate);
    assert!(b.bucket.metrics().snapshot().get_bytes - gets < 200);
}

/// What the runtime uploads (ADR 0036): the pages commits wrote, captured
/// as SQLite wrote them, unless the replica wants the whole database (the
/// first upload, a snapshot due). Returns whether pages were shipped.
async fn upload_captured(
    rep: &mut Replica,
    src: &mut Source,
    time_ms: u64,
) -> Result<(Uploaded, bool), ReplicaError> {
    // A snapshot due streams from the file, which holds the head's state
    // from the checkpoint before the upload until the thaw after it.
    let snapshot = rep.snapshot_due();
    if snapshot {
        src.db.as_ref().unwrap().freeze_file().unwrap();
    }
    let ch = src.db.as_ref().unwrap().take_changes().expect("tracked");
    assert!(ch.lost.is_none(), "{:?}", ch.lost);
    let mut shipped = None;
    if let (Some(db_pages), Some(page_size)) = (ch.db_pages, ch.page_size) {
        let pages = Pages {
            page_size,
            db_pages,
            low_pages: ch.low_pages.unwrap_or(db_pages),
            pages: ch.pages,
        };
        if !rep.wants_image() && rep.pages_suffice(&pages) {
            shipped = Some(rep.upload_pages(pages, time_ms).await?);
        }
    }
    let (up, pages) = match shipped {
        Some(up) => (up, true),
        None => (upload(rep, src, time_ms).await?, false),
    };
    // As the runtime does: a job only when the file was frozen for it.
    if snapshot && let Some(job) = rep.snapshot_job() {
        let landed = job.run().await?;
        rep.snapshot_landed(landed);
    }
    if snapshot {
        src.db.as_ref().unwrap().thaw().unwrap();
    }
    Ok((up, pages))
}

/// `rows` commits of one event of `bytes` each: a database of about
/// `rows × bytes`.
fn fill(src: &mut Source, rows: i64, bytes: usize) {
    for i in 0..rows {
        src.commit(&[(
            "INSERT INTO events (at, body) VALUES (?, ?)",
            vec![Value::Integer(i), Value::Blob(vec![i as u8; bytes])],
        )]);
    }
}

/// What the runtime does before a snapshot or delta streams: freeze the
/// file (checkpointed, and kept so), then upload the captured pages.
async fn frozen_upload(rep: &mut Replica, src: &Source, time_ms: u64) {
    src.db.as_ref().unwrap().freeze_file().unwrap();
    captured_upload(rep, src, time_ms).await;
}

/// An upload of the pages captured since the last one.
async fn captured_upload(rep: &mut Replica, src: &Source, time_ms: u64) {
    rep.upload_pages(captured(src), time_ms).await.unwrap();
}

/// The pages the store captured since the last take.
fn captured(src: &Source) -> Pages {
    let ch = src.db.as_ref().unwrap().take_changes().unwrap();
    Pages {
        page_size: ch.page_size.unwrap(),
        db_pages: ch.db_pages.unwrap(),
        low_pages: ch.low_pages.unwrap(),
        pages: ch.pages,
    }
}

/// A source actor in a fresh folder whose commits the store captures, and
/// its replica opened with `config`. The caller untracks `dir` at its end.
async fn tracked(
    b: &Backend,
    name: &str,
    config: ReplicaConfig,
) -> (tempfile::TempDir, ActorId, PathBuf, Source, Replica) {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    let dir = tmp.path().join("src");
    wasmkeep_store::page_capture::track(&dir);
    let src = Source::new(&dir);
    let (rep, _) = Replica::open(&b.bucket, &id, &src.path(), 1, config, 0)
        .await
        .unwrap();
    (tmp, id, dir, src, rep)
}

/// A snapshot that is due but never streams (the node's slot taken, or
/// every attempt torn): once the entries since the last snapshot reach half
/// the policy again, the replica wants the whole database, and that upload
/// writes the snapshot, so the chain stays within the restore bounds.
async fn an_overdue_snapshot_is_written_from_the_image(b: &Backend, name: &str) {
    let (_tmp, _id, dir, mut src, mut rep) = tracked(b, name, cfg(4, 2)).await;
    schema(&mut src);
    upload(&mut rep, &mut src, 1000).await.unwrap();
    src.db.as_ref().unwrap().take_changes().unwrap();
    let mut i = 1;
    while !rep.wants_image() {
        work(&mut src, i);
        captured_upload(&mut rep, &src, 1000 + i as u64).await;
        i += 1;
        assert!(i < 20, "the snapshot never became overdue");
    }
    assert!(rep.snapshot_due());
    assert_eq!(i, 7, "overdue at 1.5 times snapshot_every_entries");
    work(&mut src, i);
    src.db.as_ref().unwrap().take_changes().unwrap();
    match upload(&mut rep, &mut src, 2000).await.unwrap() {
        Uploaded::Appended { snapshot, .. } => assert!(snapshot, "the image upload snapshots"),
        Uploaded::Unchanged => panic!("expected an append"),
    }
    assert!(!rep.snapshot_due() && !rep.wants_image());
    wasmkeep_store::page_capture::untrack(&dir);
}

/// A snapshot handed out as a job and still streaming is not overdue,
/// however many entries follow (the upload path would otherwise read the
/// whole database to write a second one beside it). If the upload path
/// writes a newer snapshot anyway (an upload of the whole image), the
/// older job landing after it does not move the deltas' base back (they
/// would all be whole snapshots from then on). Once a job failed, the
/// snapshot is overdue again, and an overdue one streams like any other
/// when its caller froze the file for it (no whole-database read), unless
/// the job found the file torn.
async fn a_streaming_snapshot_is_not_overdue(b: &Backend, name: &str) {
    let (_tmp, _id, dir, mut src, mut rep) = tracked(b, name, cfg(4, 2)).await;
    schema(&mut src);
    fill(&mut src, 20, 50_000);
    upload(&mut rep, &mut src, 1000).await.unwrap();
    src.db.as_ref().unwrap().take_changes().unwrap();
    let mut i = 1;
    let next = async |rep: &mut Replica, src: &mut Source, i: &mut i64| {
        src.commit(&step("tags", *i));
        captured_upload(rep, src, 1000 + *i as u64).await;
        *i += 1;
    };
    while !rep.snapshot_due() {
        next(&mut rep, &mut src, &mut i).await;
    }
    // As the runtime does: the file frozen at the head the job streams.
    src.commit(&step("tags", i));
    i += 1;
    frozen_upload(&mut rep, &src, 3000).await;
    let whole = rep.snapshot_job().expect("due");
    assert!(!whole.is_delta(), "nothing tracked yet: a whole snapshot");
    for _ in 0..10 {
        next(&mut rep, &mut src, &mut i).await;
        assert!(!rep.wants_image(), "overdue while its snapshot streams");
    }
    // The image path writes a newer snapshot; the older job lands after.
    src.commit(&step("tags", i));
    i += 1;
    src.db.as_ref().unwrap().take_changes().unwrap();
    match upload(&mut rep, &mut src, 5000).await.unwrap() {
        Uploaded::Appended { snapshot, .. } => assert!(snapshot),
        Uploaded::Unchanged => panic!("expected an append"),
    }
    let landed = whole.run().await.unwrap();
    rep.snapshot_landed(landed);
    src.db.as_ref().unwrap().thaw().unwrap();
    while !rep.snapshot_due() {
        next(&mut rep, &mut src, &mut i).await;
    }
    assert!(rep.delta_possible(), "the deltas' base moved back");
    let delta = rep.snapshot_job().expect("due");
    assert!(delta.is_delta());
    for _ in 0..3 {
        next(&mut rep, &mut src, &mut i).await;
    }
    assert!(!rep.wants_image());
    drop(delta);
    rep.snapshot_failed(false);
    assert!(rep.wants_image(), "overdue once the job failed");
    assert!(
        rep.overdue_may_stream(),
        "a stream the bucket failed streams again"
    );
    rep.snapshot_failed(false);
    assert!(
        !rep.overdue_may_stream() && rep.needs_repair(),
        "after a second failure, the snapshot is repaired"
    );
    // The repair, as the runtime does it: the file frozen, every page
    // uploaded from it page by page, then its snapshot streamed from it.
    src.commit(&step("tags", i));
    i += 1;
    src.db.as_ref().unwrap().freeze_file().unwrap();
    src.db.as_ref().unwrap().take_changes().unwrap();
    let file = wasmkeep_replica::WholeFile::probe(&src.path()).unwrap();
    rep.upload_file(&file, 8000).await.unwrap();
    let job = rep.snapshot_job().expect("the repair's snapshot is due");
    rep.snapshot_landed(job.run().await.unwrap());
    assert!(!rep.needs_repair() && rep.overdue_may_stream() && !rep.wants_image());
    src.db.as_ref().unwrap().thaw().unwrap();
    while !rep.snapshot_overdue() {
        next(&mut rep, &mut src, &mut i).await;
    }
    // An overdue snapshot streams too, without waiting for a slot: the
    // caller freezes the file and says so, the upload ships pages, and the
    // job after it lands.
    src.commit(&step("tags", i));
    src.db.as_ref().unwrap().freeze_file().unwrap();
    rep.snapshot_streams_next();
    assert!(!rep.wants_image(), "the upload reads the whole database");
    captured_upload(&mut rep, &src, 9000).await;
    let landed = rep.snapshot_job().expect("due").run().await.unwrap();
    rep.snapshot_landed(landed);
    src.db.as_ref().unwrap().thaw().unwrap();
    assert!(!rep.snapshot_due() && !rep.wants_image());
    assert!(rep.overdue_may_stream());
    rep.snapshot_failed(true);
    assert!(
        !rep.overdue_may_stream(),
        "a torn file is repaired from the whole database at once"
    );
    wasmkeep_store::page_capture::untrack(&dir);
}

/// Commits no capture saw (it gave up, or the node restarted before their
/// upload) are found by reading the file page by page against the head's
/// hashes: the upload carries the pages that differ (and those the
/// database grew by), never the whole database, and a restore elsewhere is
/// the source byte for byte.
async fn a_file_diff_ships_only_what_changed(b: &Backend, name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    let mut src = Source::new(&tmp.path().join("src"));
    let (mut rep, _) = Replica::open(&b.bucket, &id, &src.path(), 1, cfg(100, 2), 0)
        .await
        .unwrap();
    schema(&mut src);
    fill(&mut src, 20, 50_000);
    upload(&mut rep, &mut src, 1000).await.unwrap();
    for i in 1..4 {
        work(&mut src, i);
    }
    let db = src.db.as_ref().unwrap();
    db.freeze_file().unwrap();
    let pages = rep.diff_file(&src.path()).unwrap().expect("a head");
    db.thaw().unwrap();
    assert!(rep.pages_suffice(&pages));
    assert!(
        (pages.pages.len() as u32) * 4 < pages.db_pages,
        "{} of {} pages",
        pages.pages.len(),
        pages.db_pages
    );
    rep.upload_pages(pages, 2000).await.unwrap();
    let source = src.close_and_read();
    restored_elsewhere(b, &id, &rep, tmp.path(), cfg(100, 2), &source).await;
}

/// A database several parts large: its snapshot streams from the file in
/// parts (a multipart upload) and a restore elsewhere is the source file,
/// byte for byte. Then a file that changes under a snapshot (a page the
/// head does not have) makes the snapshot fail and leaves no object; with
/// the check switched off (the unsafe variant) the torn file lands as the
/// head's state and a restore from it is not the source.
async fn large_snapshot_streams_in_parts(b: &Backend, name: &str, verify: bool) {
    let config = ReplicaConfig {
        snapshot_part_bytes: wasmkeep_replica::limits::SNAPSHOT_PART_BYTES_MIN,
        unsafe_snapshot_unverified: !verify,
        ..cfg(4, 2)
    };
    let (tmp, id, dir, mut src, mut rep) = tracked(b, name, config.clone()).await;
    schema(&mut src);
    fill(&mut src, 12, 1_000_000);
    upload_captured(&mut rep, &mut src, 1000).await.unwrap();
    let mut i = 100;
    while !rep.snapshot_due() {
        work(&mut src, i);
        upload_captured(&mut rep, &mut src, 1000 + i as u64)
            .await
            .unwrap();
        i += 1;
    }
    // The next upload freezes the file; the snapshot streams after it.
    work(&mut src, i);
    let snaps = keys(&b.bucket, &rep, "snap").await.len();
    frozen_upload(&mut rep, &src, 5000).await;
    let job = rep.snapshot_job().expect("a snapshot is due");
    let seq = job.seq();
    let image = src.image();
    assert!(image.bytes().len() > 2 * wasmkeep_replica::limits::SNAPSHOT_PART_BYTES_MIN);
    if verify {
        // First a torn file: one page that is not the head's.
        let path = src.path();
        let page = std::fs::read(&path).unwrap()[4096..8192].to_vec();
        let mut torn = page.clone();
        torn[100] ^= 0xFF;
        std::fs::write(&path, {
            let mut f = std::fs::read(&path).unwrap();
            f[4096..8192].copy_from_slice(&torn);
            f
        })
        .unwrap();
        let err = rep.snapshot_job().unwrap().run().await.unwrap_err();
        assert_eq!(err.code(), "snapshot_torn", "{err}");
        assert_eq!(
            keys(&b.bucket, &rep, "snap").await.len(),
            snaps,
            "nothing landed"
        );
        let mut f = std::fs::read(&path).unwrap();
        f[4096..8192].copy_from_slice(&page);
        std::fs::write(&path, f).unwrap();
        let landed = job.run().await.unwrap();
        assert_eq!((landed.seq, landed.delta_from), (seq, None));
        rep.snapshot_landed(landed);
        src.db.as_ref().unwrap().thaw().unwrap();
        let source = src.close_and_read();
        assert_eq!(source, image.bytes());
        restored_elsewhere(b, &id, &rep, tmp.path(), config, &source).await;
    } else {
        let path = src.path();
        let mut f = std::fs::read(&path).unwrap();
        f[4096 + 100] ^= 0xFF;
        std::fs::write(&path, f).unwrap();
        assert_eq!(
            job.run().await.unwrap().seq,
            seq,
            "unverified, the torn file lands"
        );
        let dst = tmp.path().join("dst").join("actor.db");
        let restored = Replica::open(&b.bucket, &id, &dst, 2, config, 5000).await;
        assert!(
            restored.is_err() || std::fs::read(&dst).unwrap() != image.bytes(),
            "the torn snapshot restored as the head's state"
        );
    }
    wasmkeep_store::page_capture::untrack(&dir);
}

/// One commit of phase `what` (see below), numbered `i`: `users` also
/// grows the database.
fn step(what: &str, i: i64) -> Vec<(&'static str, Vec<Value>)> {
    match what {
        "users" => vec![
            (
                "UPDATE users SET name = ? WHERE id = 1",
                vec![Value::Text(format!("name {i}"))],
            ),
            (
                "INSERT INTO events (at, body) VALUES (?, ?)",
                vec![Value::Integer(1000 + i), Value::Blob(vec![9; 20_000])],
            ),
        ],
        _ => vec![(
            "INSERT OR REPLACE INTO tags (k, v) VALUES ('k', ?)",
            vec![Value::Text(format!("v{i}"))],
        )],
    }
}

/// Whether a delta above `head` is in the bucket.
async fn delta_since(
    bucket: &Bucket,
    rep: &Replica,
    head: Option<wasmkeep_replica::Position>,
) -> bool {
    let from = head.map_or(0, |p| p.seq);
    keys(bucket, rep, "delta")
        .await
        .iter()
        .any(|k| wasmkeep_replica::keys::parse_delta(k).is_some_and(|(_, seq)| seq > from))
}

/// Deltas (ADR 0037): on a database of a few megabytes whose commits touch
/// a few pages, the snapshots due after the first are deltas carrying every
/// page changed since that snapshot. Phase A changes `users` and grows the
/// database, phase B only `tags`, so the last delta must still carry phase
/// A's pages (and the pages the database grew by). A delta streamed from a
/// file whose pages are not the head's lands nothing. A restore
/// elsewhere reads the snapshot, the newest delta and the entries from its
/// seq on (the entries it covers are deleted here to prove it), and is the
/// source byte for byte; deltas a newer one replaced are collected. In the
/// unsafe variant a delta carries only the pages since the previous delta:
/// the restore misses phase A's pages.
async fn deltas_carry_every_page_since_the_snapshot(b: &Backend, name: &str, forget: bool) {
    let config = ReplicaConfig {
        unsafe_delta_forgets_pages: forget,
        ..cfg(4, 2)
    };
    let (tmp, id, dir, mut src, mut rep) = tracked(b, name, config.clone()).await;
    schema(&mut src);
    fill(&mut src, 40, 100_000);
    src.commit(&[("INSERT INTO users (id, name) VALUES (1, 'first')", vec![])]);
    upload_captured(&mut rep, &mut src, 1000).await.unwrap();
    // Up to the first snapshot (whole: nothing was tracked before it).
    let mut i = 0;
    while keys(&b.bucket, &rep, "snap").await.is_empty() {
        i += 1;
        src.commit(&step("tags", i));
        upload_captured(&mut rep, &mut src, 2000 + i as u64)
            .await
            .unwrap();
        assert!(i < 20, "no snapshot");
    }
    for what in ["users", "tags"] {
        let before = rep.head();
        let mut n = 0;
        while n < 2 || !delta_since(&b.bucket, &rep, before).await {
            i += 1;
            n += 1;
            src.commit(&step(what, i));
            upload_captured(&mut rep, &mut src, 2000 + i as u64)
                .await
                .unwrap();
            assert!(n < 20, "no delta in phase {what}");
        }
    }
    if !forget {
        // A delta whose file changed under it (every page, whichever the
        // delta carries) is torn: nothing lands. The same job then lands.
        i += 1;
        src.commit(&step("tags", i));
        let due = |rep: &Replica| rep.snapshot_due();
        while !due(&rep) {
            upload_captured(&mut rep, &mut src, 2000 + i as u64)
                .await
                .unwrap();
            i += 1;
            src.commit(&step("tags", i));
        }
        frozen_upload(&mut rep, &src, 3000).await;
        let job = rep.snapshot_job().expect("due");
        assert!(job.is_delta(), "a few pages changed: a delta");
        let path = src.path();
        let good = std::fs::read(&path).unwrap();
        let mut torn = good.clone();
        for page in torn.chunks_mut(4096) {
            page[100] ^= 0xFF;
        }
        std::fs::write(&path, &torn).unwrap();
        let before = keys(&b.bucket, &rep, "delta").await;
        let err = rep.snapshot_job().unwrap().run().await.unwrap_err();
        assert_eq!(err.code(), "snapshot_torn", "{err}");
        assert_eq!(
            keys(&b.bucket, &rep, "delta").await,
            before,
            "nothing landed"
        );
        std::fs::write(&path, &good).unwrap();
        let landed = job.run().await.unwrap();
        assert!(landed.delta_from.is_some());
        rep.snapshot_landed(landed);
        src.db.as_ref().unwrap().thaw().unwrap();
    }
    // One more entry above the newest delta, and a collection.
    i += 1;
    src.commit(&step("tags", i));
    upload_captured(&mut rep, &mut src, 2000 + i as u64)
        .await
        .unwrap();
    assert_eq!(
        keys(&b.bucket, &rep, "snap").await.len(),
        1,
        "one whole snapshot"
    );
    let deltas = keys(&b.bucket, &rep, "delta").await;
    assert_eq!(deltas.len(), 1, "replaced deltas are collected: {deltas:?}");
    let (snap, newest) = wasmkeep_replica::keys::parse_delta(&deltas[0]).unwrap();
    assert!(
        b.bucket
            .list(&format!("{}snap/", rep.root().as_str()), None, 10)
            .await
            .unwrap()[0]
            .ends_with(&format!("{snap:020}"))
    );
    // The entries the delta covers are not needed: delete them.
    for s in snap + 1..newest {
        b.bucket.delete(&rep.root().log(s)).await.unwrap();
    }
    let source = src.close_and_read();
    let dst = tmp.path().join("dst").join("actor.db");
    let restored = Replica::open(&b.bucket, &id, &dst, 2, config, 5000).await;
    if forget {
        assert!(
            restored.is_err() || std::fs::read(&dst).unwrap() != source,
            "a delta without phase A's pages restored the source"
        );
    } else {
        let (rep2, opened) = restored.unwrap();
        assert_eq!(opened, Opened::Restored { replaced: None });
        assert_eq!(rep2.head(), rep.head());
        assert!(
            std::fs::read(&dst).unwrap() == source,
            "restored file differs"
        );
        // An export goes through the delta too (the entries it covers are
        // gone).
        assert!(
            export(&b.bucket, &id, At::Latest, &cfg(4, 2))
                .await
                .unwrap()
                == source,
            "the export differs"
        );
        // Deltas hold the actor's data: deleting it deletes them.
        delete_all(&b.bucket, &id, 3, &cfg(4, 2), 9000)
            .await
            .unwrap();
        assert_eq!(keys(&b.bucket, &rep, "delta").await, Vec::<String>::new());
    }
    wasmkeep_store::page_capture::untrack(&dir);
}

/// Uploads of captured pages (with rolled-back batches between the
/// commits, and snapshots when due) rebuild the database byte for byte:
/// a restore elsewhere is the source file, and reopening the source's copy
/// downloads nothing (the sidecar's digest, kept up to date from the pages
/// alone, matches the file).
async fn captured_pages_restore_byte_identical(b: &Backend, name: &str) {
    let (tmp, id, dir, mut src, mut rep) = tracked(b, name, cfg(9, 2)).await;
    schema(&mut src);
    let (_, pages) = upload_captured(&mut rep, &mut src, 1000).await.unwrap();
    assert!(!pages, "the first upload reads the whole database");
    let mut shipped = 0;
    for i in 1..40i64 {
        work(&mut src, i);
        if i % 4 == 1 {
            // A batch that fails: nothing of it may reach the bucket.
            let db = src.db.as_mut().unwrap();
            db.begin().unwrap();
            db.execute(
                "INSERT INTO events (at, body) VALUES (?, ?)",
                &[Value::Integer(-i), Value::Blob(vec![0xEE; 30_000])],
            )
            .unwrap();
            db.rollback();
        }
        if i % 3 != 0 {
            let (_, pages) = upload_captured(&mut rep, &mut src, 1000 + i as u64)
                .await
                .unwrap();
            shipped += pages as u32;
        }
    }
    upload_captured(&mut rep, &mut src, 2000).await.unwrap();
    assert!(shipped >= 20, "{shipped} uploads of pages");
    assert!(!keys(&b.bucket, &rep, "snap").await.is_empty());
    let source = src.close_and_read();
    let dst = restored_elsewhere(b, &id, &rep, tmp.path(), cfg(9, 2), &source).await;
    assert!(
        !dump(&dst).contains("Integer(-"),
        "a rolled-back row reached the bucket"
    );
    let (_, opened) = Replica::open(&b.bucket, &id, &src.path(), 3, cfg(9, 2), 6000)
        .await
        .unwrap();
    assert_eq!(
        opened,
        Opened::UpToDate,
        "the sidecar's digest matches the file"
    );
    wasmkeep_store::page_capture::untrack(&dir);
}

/// A create whose response was lost and retried finds its own entry; an
/// entry another writer put at the next seq moves the chain.
async fn lost_response_is_mine_and_foreign_entry_moves_the_chain(b: &Backend, name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    let mut a = Source::new(&tmp.path().join("a"));
    let (mut ra, _) = Replica::open(&b.bucket, &id, &a.path(), 1, cfg(100, 2), 0)
        .await
        .unwrap();
    schema(&mut a);
    for i in 0..3 {
        work(&mut a, i);
        upload(&mut ra, &mut a, i as u64).await.unwrap();
    }
    b.faults.replay("log/00000000000000000003");
    work(&mut a, 3);
    let up = upload(&mut ra, &mut a, 3).await.unwrap();
    assert_eq!(appended_seq(&up), 3);

    let bdir = tmp.path().join("b");
    let (mut rb, opened) = Replica::open(&b.bucket, &id, &bdir.join("actor.db"), 2, cfg(100, 2), 0)
        .await
        .unwrap();
    assert!(matches!(opened, Opened::Restored { .. }));
    let mut bsrc = Source::new(&bdir);
    work(&mut bsrc, 100);
    assert_eq!(
        appended_seq(&upload(&mut rb, &mut bsrc, 10).await.unwrap()),
        4
    );

    work(&mut a, 4);
    let err = upload(&mut ra, &mut a, 4).await.unwrap_err();
    assert!(matches!(err, ReplicaError::ChainMoved { seq: 4 }), "{err}");
    assert_eq!(err.code(), "chain_moved");
    assert!(
        upload(&mut ra, &mut a, 5).await.is_err(),
        "a replica that failed stays given up"
    );
}

/// ADR 0007's late commit, both orders: an earlier owner's upload held in
/// flight while a new owner restores.
async fn late_commit(b: &Backend, name: &str, lands_first: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    let mut a = Source::new(&tmp.path().join("a"));
    let (mut ra, _) = Replica::open(&b.bucket, &id, &a.path(), 1, cfg(100, 2), 0)
        .await
        .unwrap();
    schema(&mut a);
    upload(&mut ra, &mut a, 1).await.unwrap(); // seq 0
    work(&mut a, 1);
    upload(&mut ra, &mut a, 2).await.unwrap(); // seq 1

    // A's next upload (seq 2) is held on the way to the bucket.
    a.commit(&[("INSERT INTO tags VALUES ('late', 'from a')", vec![])]);
    let gate = b.faults.hold("log/00000000000000000002");
    let image = a.image();
    let task = tokio::spawn(async move {
        let r = ra.upload(&image, 3).await;
        (ra, r)
    });
    gate.arrived().await;

    // B takes over and restores the head A left: seq 1.
    let bdir = tmp.path().join("b");
    let bpath = bdir.join("actor.db");
    let (mut rb, _) = Replica::open(&b.bucket, &id, &bpath, 2, cfg(100, 2), 0)
        .await
        .unwrap();
    assert_eq!(rb.next_seq(), 2);
    let mut bsrc = Source::new(&bdir);
    bsrc.commit(&[("INSERT INTO tags VALUES ('new', 'from b')", vec![])]);

    if lands_first {
        gate.release();
        let (_, r) = task.await.unwrap();
        assert_eq!(
            appended_seq(&r.unwrap()),
            2,
            "the late upload is on the chain"
        );
        let err = upload(&mut rb, &mut bsrc, 4).await.unwrap_err();
        assert!(matches!(err, ReplicaError::ChainMoved { seq: 2 }), "{err}");
        // B gives the actor up and restores: A's late commit is the state,
        // and B's own file is set aside, not deleted.
        bsrc.db = None;
        let aside =
            reopen_restored(b, &id, &bpath, (3, 77), "B's upload met the chain moved").await;
        let now = dump(&bpath);
        assert!(now.contains("from a") && !now.contains("from b"), "{now}");
        assert!(dump(&aside).contains("from b"));
    } else {
        assert_eq!(
            appended_seq(&upload(&mut rb, &mut bsrc, 4).await.unwrap()),
            2
        );
        gate.release();
        let (_, r) = task.await.unwrap();
        let err = r.unwrap_err();
        assert!(matches!(err, ReplicaError::ChainMoved { seq: 2 }), "{err}");
        let latest = dump_bytes(
            &export(&b.bucket, &id, At::Latest, &cfg(100, 2))
                .await
                .unwrap(),
        );
        assert!(
            latest.contains("from b") && !latest.contains("from a"),
            "{latest}"
        );
    }
}

/// How [`stalled_writer`] stalls, and which rule is switched off.
struct Stall {
    grace_ms: u64,
    /// How long the new writer waits before its last uploads (their
    /// snapshot's collection then finds the earlier snapshots aged).
    pause_ms: u64,
    skip_check: bool,
    collect_without_grace: bool,
}

/// A writer's create of seq 2 is held while another writer restores,
/// appends past it, snapshots and collects; then the held create lands and
/// its result is returned. Whatever happened, the stalled writer must not
/// believe it appended: either collection waited out the grace (then the
/// stalled writer's create came later than half of it after its previous
/// one, and the check after it finds the snapshot), or the key was still
/// there (then the create finds another writer's entry).
async fn stalled_writer(b: &Backend, name: &str, stall: Stall) -> Result<Uploaded, ReplicaError> {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    let mut config = cfg(2, 1);
    config.collect_grace_ms = stall.grace_ms;
    config.unsafe_skip_append_check = stall.skip_check;
    config.unsafe_collect_without_grace = stall.collect_without_grace;
    let mut a = Source::new(&tmp.path().join("a"));
    let (mut ra, _) = Replica::open(&b.bucket, &id, &a.path(), 1, config.clone(), 0)
        .await
        .unwrap();
    schema(&mut a);
    upload(&mut ra, &mut a, 1).await.unwrap(); // seq 0, every page
    work(&mut a, 1);
    upload(&mut ra, &mut a, 2).await.unwrap(); // seq 1
    work(&mut a, 2);
    let gate = b.faults.hold("log/00000000000000000002");
    let image = a.image();
    let task = tokio::spawn(async move { ra.upload(&image, 3).await });
    gate.arrived().await;

    let bdir = tmp.path().join("b");
    let (mut rb, _) = Replica::open(&b.bucket, &id, &bdir.join("actor.db"), 2, config.clone(), 0)
        .await
        .unwrap();
    let mut bsrc = Source::new(&bdir);
    for i in 10..16 {
        work(&mut bsrc, i);
        upload(&mut rb, &mut bsrc, i as u64).await.unwrap(); // seq 2..=7
    }
    tokio::time::sleep(std::time::Duration::from_millis(stall.pause_ms)).await;
    for i in 16..18 {
        work(&mut bsrc, i);
        upload(&mut rb, &mut bsrc, i as u64).await.unwrap(); // seq 8, 9
    }
    let logs = keys(&b.bucket, &rb, "log").await;
    let collected = !logs.iter().any(|k| k.ends_with("log/00000000000000000002"));
    let may_collect = stall.collect_without_grace || stall.pause_ms >= stall.grace_ms;
    assert_eq!(collected, may_collect, "seq 2 collected? {logs:?}");
    gate.release();
    task.await.unwrap()
}

/// Two nodes with data of their own and nothing in the bucket: the first
/// upload is `log/0` with every page, and only one wins it.
async fn first_upload_race(b: &Backend, name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    let mut a = Source::new(&tmp.path().join("a"));
    let mut bs = Source::new(&tmp.path().join("b"));
    schema(&mut a);
    schema(&mut bs);
    let (mut ra, oa) = Replica::open(&b.bucket, &id, &a.path(), 1, cfg(100, 2), 0)
        .await
        .unwrap();
    let (mut rb, ob) = Replica::open(&b.bucket, &id, &bs.path(), 1, cfg(100, 2), 0)
        .await
        .unwrap();
    assert_eq!(oa, Opened::BucketEmpty { local: true });
    assert_eq!(ob, Opened::BucketEmpty { local: true });
    let image = a.image();
    let Uploaded::Appended { entry_bytes, .. } = ra.upload(&image, 1).await.unwrap() else {
        panic!()
    };
    assert!(
        entry_bytes >= image.bytes().len() as u64,
        "the first upload holds every page"
    );
    let err = upload(&mut rb, &mut bs, 1).await.unwrap_err();
    assert!(matches!(err, ReplicaError::ChainMoved { seq: 0 }), "{err}");
}

/// A first upload of a database larger than one part streams from the
/// frozen file: its body goes to `whole/` in parts and a pointer takes
/// `log/0`; restores and exports follow the pointer to the same bytes; a
/// writer that loses the race for the seq deletes its body; a pointer
/// whose body is not the one it names is refused; collection removes the
/// body with its pointer. With `unsafe_pointer_before_body`, a body that
/// fails part-way leaves a pointer to nothing, which this catches.
async fn a_large_first_upload_streams_through_a_pointer(b: &Backend, name: &str, safe: bool) {
    use wasmkeep_replica::WholeFile;
    let part = wasmkeep_replica::limits::SNAPSHOT_PART_BYTES_MIN;
    let config = ReplicaConfig {
        snapshot_part_bytes: part,
        unsafe_pointer_before_body: !safe,
        ..cfg(100, 1)
    };
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    let mut src = Source::new(&tmp.path().join("src"));
    schema(&mut src);
    fill(&mut src, 12, 1_000_000);
    let open = |path: PathBuf| {
        let (bucket, id, config) = (b.bucket.clone(), id.clone(), config.clone());
        async move {
            Replica::open(&bucket, &id, &path, 1, config, 0)
                .await
                .unwrap()
        }
    };
    let (mut rep, opened) = open(src.path()).await;
    assert_eq!(opened, Opened::BucketEmpty { local: true });
    assert!(!rep.has_base());
    src.db.as_ref().unwrap().freeze_file().unwrap();
    let first = std::fs::read(src.path()).unwrap();
    assert!(first.len() > 2 * part, "{} bytes", first.len());

    // A file that changes under the upload (one page more) lands nothing
    // safely; with the pointer first, the chain names a body never written.
    let file = WholeFile::probe(&src.path()).unwrap();
    let grown = tmp.path().join("grown.db");
    std::fs::write(&grown, &first).unwrap();
    let probed = WholeFile::probe(&grown).unwrap();
    std::fs::write(&grown, [first.as_slice(), &first[..4096]].concat()).unwrap();
    let (mut torn, _) = open(grown.clone()).await;
    let err = torn.upload_file(&probed, 500).await.unwrap_err();
    assert!(
        err.to_string().contains("changed while it was uploaded"),
        "{err}"
    );
    let dst = tmp.path().join("dst0").join("actor.db");
    let restored = Replica::open(&b.bucket, &id, &dst, 2, config.clone(), 0).await;
    if !safe {
        assert!(
            restored.is_err(),
            "a pointer to a body never written is on the chain"
        );
        return;
    }
    assert_eq!(restored.unwrap().1, Opened::BucketEmpty { local: false });

    // Another writer that will race for seq 0.
    let (mut late, _) = open(src.path()).await;
    let puts = b.bucket.metrics().snapshot();
    let Uploaded::Appended {
        position,
        entry_bytes,
        ..
    } = rep.upload_file(&file, 1000).await.unwrap()
    else {
        panic!("expected an append")
    };
    assert_eq!(position.seq, 0);
    assert!(entry_bytes > first.len() as u64, "{entry_bytes}");
    let sent = b.bucket.metrics().snapshot();
    assert!(
        sent.puts - puts.puts >= 4,
        "parts, completion, pointer: {sent:?}"
    );
    assert_eq!(keys(&b.bucket, &rep, "log").await.len(), 1);
    let pointer = b
        .bucket
        .get_bounded(&rep.root().log(0), "pointer", 1024)
        .await;
    assert!(
        pointer.is_ok(),
        "log/0 is a pointer, not the body: {pointer:?}"
    );
    assert_eq!(keys(&b.bucket, &rep, "whole").await.len(), 1);
    // The head's hashes came from the file: the next upload is a diff.
    assert!(rep.has_base());

    // The other writer loses the race and leaves no body.
    let err = late.upload_file(&file, 1001).await.unwrap_err();
    assert!(matches!(err, ReplicaError::ChainMoved { seq: 0 }), "{err}");
    assert_eq!(keys(&b.bucket, &rep, "whole").await.len(), 1);

    src.db.as_ref().unwrap().thaw().unwrap();
    for i in 0..3 {
        work(&mut src, i);
        upload(&mut rep, &mut src, 2000 + i as u64).await.unwrap();
    }
    let source = src.close_and_read();
    restored_elsewhere(b, &id, &rep, tmp.path(), config.clone(), &source).await;
    assert_eq!(
        export(&b.bucket, &id, At::Latest, &config).await.unwrap(),
        source
    );
    assert_eq!(
        export(&b.bucket, &id, At::Seq(0), &config).await.unwrap(),
        first
    );

    // A pointer whose token differs from its body's (the same key: only
    // the nonce's last bytes differ) is refused, not followed.
    let key = rep.root().log(0);
    let honest = b.bucket.get_bounded(&key, "test", u64::MAX).await.unwrap();
    let mut forged = Entry::decode(&key, &honest, u64::MAX).unwrap();
    assert_eq!(forged.kind, Kind::Pointer);
    forged.token.nonce[15] ^= 1;
    let forged = forged.encode(u64::MAX).unwrap();
    b.bucket.overwrite(&key, forged.into()).await.unwrap();
    let dst = tmp.path().join("dst1").join("actor.db");
    let err = Replica::open(&b.bucket, &id, &dst, 2, config.clone(), 0)
        .await
        .unwrap_err();
    assert!(err.is_bad_bucket_input(), "{err}");
    assert!(
        err.to_string()
            .contains("is not the body its pointer names"),
        "{err}"
    );
    b.bucket.overwrite(&key, honest).await.unwrap();

    // A snapshot covers the pointer: collection removes it and its body.
    let mut src = Source::new(&tmp.path().join("src"));
    let image = src.image();
    let before = b.bucket.metrics().snapshot().puts;
    rep.snapshot(&image).await.unwrap();
    let puts = b.bucket.metrics().snapshot().puts - before;
    assert!(
        puts >= 4,
        "a snapshot over a part goes in parts: {puts} PUTs"
    );
    assert_eq!(keys(&b.bucket, &rep, "whole").await, Vec::<String>::new());
    assert!(keys(&b.bucket, &rep, "log").await.is_empty());
    src.close_and_read();
    restored_elsewhere(
        b,
        &id,
        &rep,
        tmp.path().join("after").as_path(),
        config.clone(),
        &source,
    )
    .await;

    // Deleted, then a new life from the same large file: its first entry
    // above the tombstone goes behind a pointer too, and deletion erased
    // the old body.
    delete_all(&b.bucket, &id, 3, &config, 9000).await.unwrap();
    let path = tmp.path().join("life2").join("actor.db");
    let (mut life2, opened) = Replica::open(&b.bucket, &id, &path, 4, config.clone(), 9000)
        .await
        .unwrap();
    assert_eq!(opened, Opened::Deleted { replaced: None });
    assert!(!life2.has_base());
    std::fs::write(&path, &source).unwrap();
    let file = WholeFile::probe(&path).unwrap();
    let seq = appended_seq(&life2.upload_file(&file, 9500).await.unwrap());
    assert!(seq > 0);
    assert_eq!(keys(&b.bucket, &life2, "whole").await.len(), 1);
    restored_elsewhere(
        b,
        &id,
        &life2,
        tmp.path().join("life2-restored").as_path(),
        config,
        &source,
    )
    .await;
}

/// Export at past seqs and times gives those points' data, back to the
/// oldest kept snapshot, and refuses points before it.
async fn point_in_time(b: &Backend, name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    let config = cfg(4, 2);
    let mut src = Source::new(&tmp.path().join("src"));
    let (mut rep, _) = Replica::open(&b.bucket, &id, &src.path(), 1, config.clone(), 0)
        .await
        .unwrap();
    schema(&mut src);
    let mut points = Vec::new();
    for i in 0..20i64 {
        if i > 0 {
            work(&mut src, i);
        }
        let t = 10_000 + 100 * i as u64;
        let seq = appended_seq(&upload(&mut rep, &mut src, t).await.unwrap());
        points.push((seq, t, dump_bytes(src.image().bytes())));
    }
    let snaps = keys(&b.bucket, &rep, "snap").await;
    let oldest: u64 = snaps[0].rsplit('/').next().unwrap().parse().unwrap();
    assert!(oldest > 0);
    let mut checked = 0;
    for (seq, t, expected) in &points {
        let by_seq = export(&b.bucket, &id, At::Seq(*seq), &config).await;
        let by_time = export(&b.bucket, &id, At::TimeMs(t + 50), &config).await;
        if *seq >= oldest {
            assert_eq!(&dump_bytes(&by_seq.unwrap()), expected, "seq {seq}");
            assert_eq!(&dump_bytes(&by_time.unwrap()), expected, "time {t}");
            checked += 1;
        } else {
            assert_eq!(by_seq.unwrap_err().code(), "not_retained", "seq {seq}");
            assert_eq!(by_time.unwrap_err().code(), "not_retained", "time {t}");
        }
    }
    assert!(checked >= 5, "checked {checked}");
    let beyond = export(&b.bucket, &id, At::Seq(1000), &config).await;
    assert_eq!(beyond.unwrap_err().code(), "not_retained");
}

/// A local file that does not match the bucket is set aside, never
/// deleted, and each set-aside gets its own name.
async fn set_aside_never_deletes(b: &Backend, name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    let mut src = Source::new(&tmp.path().join("src"));
    let (mut rep, _) = Replica::open(&b.bucket, &id, &src.path(), 1, cfg(100, 2), 0)
        .await
        .unwrap();
    schema(&mut src);
    upload(&mut rep, &mut src, 1).await.unwrap();

    let other = tmp.path().join("other");
    let path = other.join("actor.db");
    let mut asides = Vec::new();
    for round in 0..2 {
        {
            if path.exists() {
                std::fs::remove_file(&path).unwrap();
            }
            let mut db = ActorDb::open(&other, &StoreLimits::default(), OpenMode::Create)
                .unwrap()
                .unwrap();
            db.begin().unwrap();
            db.execute("CREATE TABLE mine (a, b)", &[]).unwrap();
            db.execute(&format!("INSERT INTO mine VALUES ({round}, 'local')"), &[])
                .unwrap();
            db.commit().unwrap();
        }
        let aside = reopen_restored(b, &id, &path, (2, 42), "a file of another life").await;
        assert!(dump(&aside).contains(&format!("Integer({round}) Text(\"local\")")));
        assert!(!dump(&path).contains("local"));
        asides.push(aside);
    }
    assert_ne!(asides[0], asides[1]);
    for a in &asides {
        assert!(a.exists(), "{a:?} was deleted");
    }
}

/// Opens `id`'s replica at `path` (generation `generation`, at `now_ms`),
/// which must restore the bucket's head and set the local file aside;
/// returns where it was set aside. `what` says why a restore was due.
async fn reopen_restored(
    b: &Backend,
    id: &ActorId,
    path: &Path,
    (generation, now_ms): (u64, u64),
    what: &str,
) -> PathBuf {
    let (_, opened) = Replica::open(&b.bucket, id, path, generation, cfg(100, 2), now_ms)
        .await
        .unwrap();
    let Opened::Restored {
        replaced: Some(aside),
    } = opened
    else {
        panic!("{what}: expected a restore with the local file set aside: {opened:?}")
    };
    aside
}

/// A writer that uploaded up to seq 1 and then committed twice more
/// without uploading (`src` is open with them): returns its replica and
/// the file's bytes at the head.
async fn a_writer_ahead_of_its_head(
    b: &Backend,
    id: &ActorId,
    src: &mut Source,
    config: &ReplicaConfig,
) -> (Replica, Vec<u8>) {
    let (mut rep, _) = Replica::open(&b.bucket, id, &src.path(), 1, config.clone(), 0)
        .await
        .unwrap();
    schema(src);
    for i in 0..2 {
        work(src, i);
        upload(&mut rep, src, i as u64).await.unwrap();
    }
    let at_head = src.close_and_read();
    *src = Source::new(&src.dir);
    work(src, 2);
    work(src, 3);
    (rep, at_head)
}

/// The writer's process dies after two commits it never uploaded (a plain
/// write's upload waits for the interval, ADR 0034): the sidecar names the
/// head and was written in this boot to this file, so the file is ahead of
/// the head. The next open keeps it (ADR 0082) and the next upload ships
/// every page of it above the head: a restore elsewhere is that file.
async fn a_file_ahead_of_the_head_is_kept_after_a_crash(b: &Backend, name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    let mut src = Source::new(&tmp.path().join("src"));
    let (rep, _) = a_writer_ahead_of_its_head(b, &id, &mut src, &cfg(100, 2)).await;
    let head = rep.head();
    // The crash: nothing of the writer runs again. (Its connection closes
    // here; a crashed one leaves the same commits for SQLite's recovery.)
    drop(rep);
    let ahead = src.close_and_read();
    let (mut rep, opened) = Replica::open(&b.bucket, &id, &src.path(), 2, cfg(100, 2), 10)
        .await
        .unwrap();
    assert_eq!(
        opened,
        Opened::Ahead,
        "the file with two more commits is kept"
    );
    assert_eq!(rep.head(), head);
    assert!(rep.wants_image(), "no page hashes describe the head here");
    assert_eq!(std::fs::read(src.path()).unwrap(), ahead);
    src = Source::new(&src.dir);
    let up = upload(&mut rep, &mut src, 20).await.unwrap();
    assert_eq!(appended_seq(&up), head.unwrap().seq + 1);
    let source = src.close_and_read();
    assert!(dump_bytes(&source).contains("user 3"));
    restored_elsewhere(b, &id, &rep, tmp.path(), cfg(100, 2), &source).await;
}

/// How the file at the head came back in place of a file the sidecar
/// named.
#[derive(Clone, Copy, Debug)]
enum Back {
    /// After a reboot (a power cut), in the same file: the sidecar's boot
    /// is another.
    AfterReboot,
    /// Put in place by someone, in this boot: another file.
    AnotherFile,
}

/// The file lost the writer's last uploaded commit (a power cut on a node
/// without fsync, or before the commit's local barrier; the sidecar,
/// written after the upload, survived), or another file was put in its
/// place: the bucket's head is restored and the file set aside. With
/// `unsafe_keep_ahead_unchecked` the older file is kept as ahead, and its
/// next upload would put it over the head.
async fn a_file_behind_the_head_is_restored(
    b: &Backend,
    name: &str,
    back: Back,
    unsafe_variant: bool,
) {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    let mut src = Source::new(&tmp.path().join("src"));
    let (mut rep, older) = a_writer_ahead_of_its_head(b, &id, &mut src, &cfg(100, 2)).await;
    upload(&mut rep, &mut src, 30).await.unwrap();
    let at_head = src.close_and_read();
    drop(rep);
    match back {
        Back::AfterReboot => {
            // Same inode: the file itself holds the older state.
            std::fs::write(src.path(), &older).unwrap();
            let side = wasmkeep_replica::sidecar_path(&src.path());
            let text = std::fs::read_to_string(&side).unwrap();
            assert!(text.contains("\nboot="), "{text}");
            let rebooted: String = text
                .lines()
                .map(|l| {
                    if l.starts_with("boot=") {
                        "boot=another-boot\n".to_owned()
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect();
            std::fs::write(&side, rebooted).unwrap();
        }
        Back::AnotherFile => {
            let put = src.dir.join("put");
            std::fs::write(&put, &older).unwrap();
            std::fs::rename(&put, src.path()).unwrap();
        }
    }
    let config = ReplicaConfig {
        unsafe_keep_ahead_unchecked: unsafe_variant,
        ..cfg(100, 2)
    };
    let (_, opened) = Replica::open(&b.bucket, &id, &src.path(), 2, config, 40)
        .await
        .unwrap();
    if unsafe_variant {
        assert_eq!(
            opened,
            Opened::Ahead,
            "{back:?}: the unsafe variant keeps the older file"
        );
        return;
    }
    let Opened::Restored {
        replaced: Some(aside),
    } = opened
    else {
        panic!("{back:?}: {opened:?}")
    };
    assert_eq!(dump(&src.path()), dump_bytes(&at_head), "{back:?}");
    assert_eq!(dump(&aside), dump_bytes(&older), "{back:?}");
}

/// The writer gives the actor up and voids its sidecar (an upload failed
/// and `replicated` requests were answered with an error); an upload
/// still in flight then lands and writes the sidecar again, naming the new
/// head in this boot for this file; the failed request's commit is in the
/// file past it. The next open restores the head and sets the file aside:
/// a voided sidecar keeps nothing (ADR 0082), and the restore lifts the
/// mark.
async fn a_voided_sidecar_keeps_nothing(b: &Backend, name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    let mut src = Source::new(&tmp.path().join("src"));
    let (mut rep, _) = a_writer_ahead_of_its_head(b, &id, &mut src, &cfg(100, 2)).await;
    wasmkeep_replica::void_sidecar(&src.path(), Void::Commits).unwrap();
    upload(&mut rep, &mut src, 30).await.unwrap();
    let at_head = src.close_and_read();
    src = Source::new(&src.dir);
    work(&mut src, 4);
    let failed = src.close_and_read();
    drop(rep);
    let aside = reopen_restored(b, &id, &src.path(), (2, 40), "a voided sidecar").await;
    assert_eq!(dump(&src.path()), dump_bytes(&at_head));
    assert_eq!(dump(&aside), dump_bytes(&failed));
    let (_, opened) = Replica::open(&b.bucket, &id, &src.path(), 3, cfg(100, 2), 50)
        .await
        .unwrap();
    assert_eq!(opened, Opened::UpToDate, "the restore lifted the mark");
}

/// A new actor given up before its first upload landed (voided as new,
/// no sidecar written): the bucket has nothing, and the next open sets the
/// local file aside rather than keep commits its clients were told
/// failed. Without a mark (as after a crash), with a mark of commits only
/// (data from before the node had a bucket), or with another bucket's
/// sidecar, the file is kept.
async fn a_voided_new_actor_is_set_aside(b: &Backend, name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    let mut src = Source::new(&tmp.path().join("src"));
    schema(&mut src);
    work(&mut src, 3);
    let failed = src.close_and_read();
    let opened = opening(b, &id, &src.path(), 1, 10).await;
    assert_eq!(opened, Opened::BucketEmpty { local: true }, "no mark: kept");
    // Data from before the node had a bucket, given up at its first
    // upload: not a new actor's, kept (a review found it set aside whole).
    wasmkeep_replica::void_sidecar(&src.path(), Void::Commits).unwrap();
    let opened = opening(b, &id, &src.path(), 1, 15).await;
    assert_eq!(
        opened,
        Opened::BucketEmpty { local: true },
        "older data: kept"
    );
    let mark = src.dir.join("actor.db.replica-void");
    assert!(
        !mark.exists(),
        "the opening that kept the file lifted the mark"
    );
    wasmkeep_replica::void_sidecar(&src.path(), Void::NewActor).unwrap();
    let opened = opening(b, &id, &src.path(), 2, 20).await;
    let Opened::SetAside { replaced } = opened else {
        panic!("a voided new actor's file was kept: {opened:?}")
    };
    assert!(!src.path().exists(), "nothing left at the actor's path");
    assert_eq!(dump(&replaced), dump_bytes(&failed));
    let opened = opening(b, &id, &src.path(), 3, 30).await;
    assert_eq!(
        opened,
        Opened::BucketEmpty { local: false },
        "the mark went with the file"
    );

    // A file that held a position of another bucket (its sidecar says so),
    // given up there, is not a new actor's: a node moved to an empty
    // bucket keeps it and ships it, as any local data.
    let mut src = Source::new(&tmp.path().join("moved"));
    schema(&mut src);
    let other = Backend::memory();
    let (mut rep, _) = Replica::open(&other.bucket, &id, &src.path(), 4, cfg(100, 2), 40)
        .await
        .unwrap();
    upload(&mut rep, &mut src, 50).await.unwrap();
    work(&mut src, 5);
    drop(rep);
    src.close_and_read();
    wasmkeep_replica::void_sidecar(&src.path(), Void::NewActor).unwrap();
    let opened = opening(b, &id, &src.path(), 5, 60).await;
    assert_eq!(
        opened,
        Opened::BucketEmpty { local: true },
        "another bucket's file"
    );
}

/// What opening actor `id` from `path` finds in `b`'s bucket (`generation`
/// and `now_ms` as `Replica::open` takes them).
async fn opening(b: &Backend, id: &ActorId, path: &Path, generation: u64, now_ms: u64) -> Opened {
    let (_, opened) = Replica::open(&b.bucket, id, path, generation, cfg(100, 2), now_ms)
        .await
        .unwrap();
    opened
}

/// Voiding an actor whose folder is gone (deleted while it was given up)
/// has nothing to do and is no error; a folder that is there gets the mark.
#[test]
fn voiding_a_deleted_actor_is_no_error() {
    let tmp = tempfile::tempdir().unwrap();
    let gone = tmp.path().join("gone").join("actor.db");
    wasmkeep_replica::void_sidecar(&gone, Void::NewActor).unwrap();
    assert!(!tmp.path().join("gone").exists());
    let here = tmp.path().join("actor.db");
    wasmkeep_replica::void_sidecar(&here, Void::NewActor).unwrap();
    assert!(tmp.path().join("actor.db.replica-void").exists());
}

async fn stalled_writers(make: &impl Fn() -> Backend) {
    let stalls = [
        // Stalled past the grace and a collection: the check catches it.
        ("past grace", 300, 400, false, false, false),
        // Mutation: without the check the stalled writer is fooled.
        ("past grace, no check", 300, 400, true, false, true),
        // Stalled briefly: collection waits, the create finds B's entry.
        ("brief", 60_000, 0, false, false, false),
        // Mutation: collecting without the grace fools a quick writer,
        // which skips the check.
        ("brief, no grace", 60_000, 0, false, true, true),
    ];
    for (name, grace_ms, pause_ms, skip_check, collect_without_grace, fooled) in stalls {
        let stall = Stall {
            grace_ms,
            pause_ms,
            skip_check,
            collect_without_grace,
        };
        let r = stalled_writer(&make(), name, stall).await;
        if fooled {
            assert!(r.is_ok(), "{name}: {r:?}");
        } else {
            assert!(
                matches!(r, Err(ReplicaError::ChainMoved { seq: 2 })),
                "{name}: {r:?}"
            );
        }
    }
}

/// With the default grace, an actor uploading steadily pays one create per
/// entry and no listing; entries a fresh snapshot covers stay until that
/// snapshot is older than the grace.
async fn quick_appends_skip_the_check(b: &Backend, name: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    let config = ReplicaConfig {
        collect_grace_ms: wasmkeep_replica::limits::COLLECT_GRACE_MS,
        ..cfg(3, 1)
    };
    let mut src = Source::new(&tmp.path().join("src"));
    let (mut rep, _) = Replica::open(&b.bucket, &id, &src.path(), 1, config, 0)
        .await
        .unwrap();
    schema(&mut src);
    upload(&mut rep, &mut src, 1).await.unwrap();
    for i in 1..8 {
        work(&mut src, i);
        let before = b.bucket.metrics().snapshot();
        let up = upload(&mut rep, &mut src, 1 + i as u64).await.unwrap();
        let after = b.bucket.metrics().snapshot();
        let Uploaded::Appended { snapshot, .. } = up else {
            panic!("expected an append")
        };
        if !snapshot {
            assert_eq!(after.puts - before.puts, 1, "entry {i}");
            assert_eq!(after.lists - before.lists, 0, "entry {i}");
        }
    }
    let logs = keys(&b.bucket, &rep, "log").await;
    assert_eq!(
        logs.len(),
        8,
        "nothing collected within the grace: {logs:?}"
    );
    assert_eq!(keys(&b.bucket, &rep, "snap").await.len(), 1);
}

/// ADR 0007, "Deleting an actor": a delete leaves a tombstone above the
/// chain and erases the entries below it in place, so the old life's keys
/// stay taken. Two writers of the old life are stale when it happens: A
/// still at seq 0 (B took over after it) and B at the head (seq 2). After
/// the delete a new life starts on another node (C). A's late upload (seq
/// 1, erased in place) and B's (seq 3, the tombstone's own) fail as creates
/// and never appear in the new life, whose uploads continue above the
/// tombstone. With the test-only `unsafe_delete_erases_chain` the chain is
/// erased, the new life starts again at seq 0 and A's late entry lands in
/// it: a restore of the new life shows the old life's write.
async fn delete_then_late_writers(b: &Backend, name: &str, unsafe_variant: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor(name);
    // The default grace: the stale writers' creates are quick and skip the
    // re-creation check, so only keys that stay taken can stop them.
    let config = ReplicaConfig {
        collect_grace_ms: COLLECT_GRACE_MS,
        unsafe_delete_erases_chain: unsafe_variant,
        ..cfg(100, 2)
    };
    let mut a = Source::new(&tmp.path().join("a"));
    let (mut ra, _) = Replica::open(&b.bucket, &id, &a.path(), 1, config.clone(), 0)
        .await
        .unwrap();
    schema(&mut a);
    assert_eq!(appended_seq(&upload(&mut ra, &mut a, 1).await.unwrap()), 0);
    let bdir = tmp.path().join("b");
    let (mut rb, _) = Replica::open(&b.bucket, &id, &bdir.join("actor.db"), 2, config.clone(), 0)
        .await
        .unwrap();
    let mut bsrc = Source::new(&bdir);
    for i in 1..3 {
        work(&mut bsrc, i);
        upload(&mut rb, &mut bsrc, 1 + i as u64).await.unwrap(); // seq 1, 2
    }
    a.commit(&[(
        "INSERT INTO tags VALUES ('late', 'from the old life')",
        vec![],
    )]);
    bsrc.commit(&[(
        "INSERT INTO tags VALUES ('later', 'from the old life')",
        vec![],
    )]);

    let n = delete_all(&b.bucket, &id, 3, &config, 100).await.unwrap();
    let root = ra.root().clone();
    let logs = keys(&b.bucket, &ra, "log").await;
    let snaps = keys(&b.bucket, &ra, "snap").await;
    if unsafe_variant {
        assert_eq!(n, 3);
        assert!(logs.is_empty() && snaps.is_empty(), "{logs:?} {snaps:?}");
    } else {
        assert_eq!(n, 3, "three entries erased in place, no snapshot");
        assert_eq!(snaps, vec![root.snap(3)]);
        assert_eq!(logs, (0..=3).map(|s| root.log(s)).collect::<Vec<_>>());
        for key in logs.iter().chain(&snaps) {
            let body = b.bucket.get_bounded(key, "test", u64::MAX).await.unwrap();
            let e = Entry::decode(key, &body, u64::MAX).unwrap();
            assert_eq!((e.kind, e.db_pages, e.pages.len()), (Kind::Tombstone, 0, 0));
        }
        for at in [At::Latest, At::Seq(2), At::Seq(3)] {
            let e = export(&b.bucket, &id, at, &config).await.unwrap_err();
            assert_eq!(e.code(), "not_retained", "{at:?}");
        }
        // Deleting again finds the tombstone at the head and changes nothing.
        assert_eq!(
            delete_all(&b.bucket, &id, 3, &config, 101).await.unwrap(),
            0
        );
        assert_eq!(keys(&b.bucket, &ra, "log").await, logs);
    }

    // The next life, on another node.
    let cdir = tmp.path().join("c");
    let (mut rc, opened) = Replica::open(
        &b.bucket,
        &id,
        &cdir.join("actor.db"),
        4,
        config.clone(),
        200,
    )
    .await
    .unwrap();
    let expected = if unsafe_variant {
        Opened::BucketEmpty { local: false }
    } else {
        Opened::Deleted { replaced: None }
    };
    assert_eq!(opened, expected);
    let mut csrc = Source::new(&cdir);
    schema(&mut csrc);
    let first = appended_seq(&upload(&mut rc, &mut csrc, 201).await.unwrap());
    assert_eq!(first, if unsafe_variant { 0 } else { 4 });

    // A's late upload takes its next seq, 1.
    let late = upload(&mut ra, &mut a, 5).await;
    if unsafe_variant {
        assert_eq!(appended_seq(&late.unwrap()), 1, "A believes it appended");
    } else {
        assert!(
            matches!(late, Err(ReplicaError::ChainMoved { seq: 1 })),
            "{late:?}"
        );
        // B's takes its next seq, 3: the tombstone's.
        let later = upload(&mut rb, &mut bsrc, 6).await;
        assert!(
            matches!(later, Err(ReplicaError::ChainMoved { seq: 3 })),
            "{later:?}"
        );
    }

    // A restore of the new life, within a bound that only a restore
    // starting at the tombstone's snapshot meets.
    let restoring = ReplicaConfig {
        restore_entries_max: if unsafe_variant { 2 } else { 1 },
        ..config.clone()
    };
    let ddir = tmp.path().join("d").join("actor.db");
    let (_, opened) = Replica::open(&b.bucket, &id, &ddir, 5, restoring, 300)
        .await
        .unwrap();
    assert_eq!(opened, Opened::Restored { replaced: None });
    let state = dump(&ddir);
    assert!(!state.contains("user 1"), "{state}");
    if unsafe_variant {
        assert!(
            state.contains("from the old life"),
            "the late entry landed: {state}"
        );
        // And the new life's own next upload finds its chain taken.
        csrc.commit(&[("INSERT INTO tags VALUES ('new', 'life')", vec![])]);
        let e = upload(&mut rc, &mut csrc, 202).await.unwrap_err();
        assert!(matches!(e, ReplicaError::ChainMoved { seq: 1 }), "{e}");
        return;
    }
    assert!(!state.contains("from the old life"), "{state}");
    csrc.commit(&[("INSERT INTO tags VALUES ('new', 'life')", vec![])]);
    assert_eq!(
        appended_seq(&upload(&mut rc, &mut csrc, 202).await.unwrap()),
        5
    );
    let latest = dump_bytes(&export(&b.bucket, &id, At::Latest, &config).await.unwrap());
    assert!(
        latest.contains("life") && !latest.contains("old life"),
        "{latest}"
    );

    // The second life is deleted in turn: a tombstone at 6; the first
    // tombstone's snapshot goes, entries 4 and 5 are erased in place, and
    // the first life's tombstones (no pages) are left as they are.
    let n = delete_all(&b.bucket, &id, 6, &config, 400).await.unwrap();
    assert_eq!(n, 3);
    assert_eq!(keys(&b.bucket, &ra, "snap").await, vec![root.snap(6)]);
    let (_, opened) = Replica::open(&b.bucket, &id, &ddir, 7, config.clone(), 500)
        .await
        .unwrap();
    let Opened::Deleted {
        replaced: Some(aside),
    } = opened
    else {
        panic!("expected the restored file set aside: {opened:?}")
    };
    // D's file, the new life's schema as restored before the delete.
    assert!(dump(&aside).contains("[tags]"));
    assert!(!ddir.exists());
}

async fn all_scenarios(make: impl Fn() -> Backend) {
    restore_is_byte_identical(&make(), "byte identical").await;
    captured_pages_restore_byte_identical(&make(), "captured pages").await;
    large_snapshot_streams_in_parts(&make(), "large snapshot", true).await;
    an_overdue_snapshot_is_written_from_the_image(&make(), "overdue snapshot").await;
    a_streaming_snapshot_is_not_overdue(&make(), "streaming snapshot").await;
    a_file_diff_ships_only_what_changed(&make(), "file diff").await;
    deltas_carry_every_page_since_the_snapshot(&make(), "deltas", false).await;
    deltas_carry_every_page_since_the_snapshot(&make(), "deltas unsafe", true).await;
    large_snapshot_streams_in_parts(&make(), "large snapshot unsafe", false).await;
    lost_response_is_mine_and_foreign_entry_moves_the_chain(&make(), "lost response").await;
    late_commit(&make(), "late first", true).await;
    late_commit(&make(), "late after", false).await;
    stalled_writers(&make).await;
    quick_appends_skip_the_check(&make(), "quick").await;
    first_upload_race(&make(), "first upload").await;
    a_large_first_upload_streams_through_a_pointer(&make(), "pointer", true).await;
    a_large_first_upload_streams_through_a_pointer(&make(), "pointer unsafe", false).await;
    point_in_time(&make(), "pitr").await;
    set_aside_never_deletes(&make(), "aside").await;
    a_file_ahead_of_the_head_is_kept_after_a_crash(&make(), "ahead").await;
    a_voided_sidecar_keeps_nothing(&make(), "voided").await;
    a_voided_new_actor_is_set_aside(&make(), "voided new").await;
    for (back, name) in [(Back::AfterReboot, "rebooted"), (Back::AnotherFile, "put")] {
        a_file_behind_the_head_is_restored(&make(), name, back, false).await;
        a_file_behind_the_head_is_restored(&make(), &format!("{name} unsafe"), back, true).await;
    }
    delete_then_late_writers(&make(), "deleted", false).await;
    delete_then_late_writers(&make(), "deleted unsafe", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_local_folder() {
    all_scenarios(Backend::file).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory() {
    all_scenarios(Backend::memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_moto() {
    let moto = Moto::start();
    moto.create_bucket("wasmkeep-test");
    all_scenarios(|| Backend::moto(&moto, "wasmkeep-test")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_url_reaches_moto_and_a_folder() {
    let moto = Moto::start();
    moto.create_bucket("urls");
    let bucket = Bucket::from_url_with_options("s3://urls/some/prefix", moto.options()).unwrap();
    bucket
        .create("x/y", bytes::Bytes::from_static(b"1"))
        .await
        .unwrap();
    assert_eq!(
        bucket
            .create("x/y", bytes::Bytes::from_static(b"2"))
            .await
            .unwrap(),
        wasmkeep_replica::bucket::Created::AlreadyExists
    );
    assert_eq!(
        bucket.list("x/", None, u64::MAX).await.unwrap(),
        vec!["x/y".to_owned()]
    );
    // Every PUT, and every part of a multipart upload, carries its SHA-256,
    // which the store checks and keeps with the object. moto keeps it for a
    // multipart upload (not for a single PUT unless boto's own header comes
    // with it) and refuses no wrong one, as S3 does: what this shows is
    // that the node sends it, against a bucket over a store configured
    // without it.
    async fn parts_to(bucket: &Bucket, key: &str) {
        let (tx, mut rx) = tokio::sync::mpsc::channel(2);
        for p in [vec![7u8; 5 * 1024 * 1024], vec![8u8; 100]] {
            tx.send(Ok(bytes::Bytes::from(p))).await.unwrap();
        }
        drop(tx);
        bucket
            .put_parts(key, &mut rx, 5 * 1024 * 1024 + 100)
            .await
            .unwrap();
    }
    parts_to(&bucket, "x/parts").await;
    let unchecked = Bucket::new(moto.store("urls"), "some/prefix");
    parts_to(&unchecked, "x/bare").await;
    assert_eq!(moto.checksum_sha256("urls", "some/prefix/x/bare"), None);
    assert!(
        moto.checksum_sha256("urls", "some/prefix/x/parts")
            .is_some(),
        "a multipart upload carries its parts' SHA-256"
    );
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("b").display());
    let local = Bucket::from_url(&url).unwrap();
    local
        .create("k", bytes::Bytes::from_static(b"1"))
        .await
        .unwrap();
    assert!(Path::new(&dir.path().join("b/k")).exists());
    for bad in ["http://x", "s3://", "file://relative"] {
        assert_eq!(
            Bucket::from_url(bad).unwrap_err().code(),
            "invalid_bucket_url"
        );
    }
}
