//! What the bucket holds is untrusted input (issue 17, item 7): forged,
//! damaged or oversized objects in an actor's chain make that actor's
//! restore fail with its own error, before memory is spent on them, and
//! lose nothing else: the local file stays exactly as it was (no set-aside,
//! no half-written image), another actor in the same bucket restores, and
//! the chain restores again once the bad object is gone.
//!
//! Every scenario runs on a local folder (`file://`) and on a real S3
//! server (moto); the databases are the real store's.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use bytes::Bytes;
use common::{Backend, Moto, Source, actor, dump};
use sha2::{Digest, Sha256};
use wasmkeep_replica::testing::SizeLies;
use wasmkeep_replica::{
    ActorRoot, At, Entry, Image, Kind, Opened, Replica, ReplicaConfig, ReplicaError, Token,
    delete_all, export, export_to_path,
};
use wasmkeep_store::{ActorDb, ActorId, OpenMode, StoreLimits, Value};

const MIB: u64 = 1024 * 1024;

fn config(entry_bytes_max: u64) -> ReplicaConfig {
    ReplicaConfig {
        entry_bytes_max,
        // Every upload is an entry; no snapshot unless a test writes one.
        snapshot_every_entries: 1_000,
        snapshot_log_ratio_pct: u64::MAX / 1_000_000,
        collect_grace_ms: 0,
        ..ReplicaConfig::default()
    }
}

/// A victim actor with a two-entry chain (seq 0 and 1), a neighbour in
/// the same bucket, and a local file for the victim that does not match
/// the bucket (a restore would set it aside).
struct Scene {
    tmp: tempfile::TempDir,
    victim: ActorId,
    root: ActorRoot,
    /// The victim's writer, still holding the chain at seq 1.
    writer: Replica,
    source: Source,
    neighbour: ActorId,
    /// Where the victim is restored to; holds a local file of its own.
    local: PathBuf,
    page_size: u32,
}

impl Scene {
    async fn new(b: &Backend, name: &str) -> Scene {
        let tmp = tempfile::tempdir().unwrap();
        let victim = actor(&format!("{name} victim"));
        let mut source = Source::new(&tmp.path().join("src"));
        let (mut writer, _) =
            Replica::open(&b.bucket, &victim, &source.path(), 1, config(64 * MIB), 0)
                .await
                .unwrap();
        source.commit(&[("CREATE TABLE big (i INTEGER PRIMARY KEY, s TEXT)", vec![])]);
        upload(&mut writer, &mut source, 1).await; // seq 0, every page
        let rows: Vec<(&str, Vec<Value>)> = (0..400)
            .map(|i| {
                let v = vec![Value::Integer(i), Value::Text(format!("row {i:0>90}"))];
                ("INSERT INTO big VALUES (?, ?)", v)
            })
            .collect();
        source.commit(&rows);
        upload(&mut writer, &mut source, 2).await; // seq 1
        let page_size = source.image().page_size();
        let root = writer.root().clone();

        let neighbour = actor(&format!("{name} neighbour"));
        let mut n = Source::new(&tmp.path().join("neighbour"));
        let (mut nr, _) = Replica::open(&b.bucket, &neighbour, &n.path(), 1, config(64 * MIB), 0)
            .await
            .unwrap();
        n.commit(&[("CREATE TABLE mine (v TEXT, w INTEGER)", vec![])]);
        n.commit(&[("INSERT INTO mine VALUES ('neighbour data', 1)", vec![])]);
        upload(&mut nr, &mut n, 1).await;

        let local_dir = tmp.path().join("local");
        let mut db = ActorDb::open(&local_dir, &StoreLimits::default(), OpenMode::Create)
            .unwrap()
            .unwrap();
        db.begin().unwrap();
        db.execute("CREATE TABLE here (v TEXT, w INTEGER)", &[])
            .unwrap();
        db.execute("INSERT INTO here VALUES ('local only', 1)", &[])
            .unwrap();
        db.commit().unwrap();
        drop(db);
        Scene {
            local: local_dir.join("actor.db"),
            tmp,
            victim,
            root,
            writer,
            source,
            neighbour,
            page_size,
        }
    }

    /// Every file in the local folder and its bytes.
    fn local_files(&self) -> BTreeMap<String, Vec<u8>> {
        let dir = self.local.parent().unwrap();
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let bytes = std::fs::read(e.path()).unwrap();
                (e.file_name().to_string_lossy().into_owned(), bytes)
            })
            .collect()
    }

    /// Restores the victim over its local file under `config`.
    async fn restore(&self, b: &Backend, config: ReplicaConfig) -> Result<Opened, ReplicaError> {
        Replica::open(&b.bucket, &self.victim, &self.local, 7, config, 1_000)
            .await
            .map(|(_, opened)| opened)
    }

    /// A forged entry at the chain's next seq (2) with a valid checksum.
    fn forged(&self, db_pages: u32, pages: Vec<(u32, Vec<u8>)>) -> Entry {
        Entry {
            kind: Kind::Log,
            seq: 2,
            time_ms: 3,
            token: Token {
                generation: 666,
                nonce: [6; 16],
            },
            page_size: self.page_size,
            db_pages,
            actor: self.root.as_str().to_owned(),
            pages,
        }
    }

    /// A refused restore, then proof that nothing else was lost: the local
    /// folder is as it was `before` the restore (no set-aside, no staged
    /// image), the neighbour restores, and with the bad object removed the
    /// victim restores its real state.
    async fn refused(
        &self,
        b: &Backend,
        r: Result<Opened, ReplicaError>,
        bad_key: &str,
        before: BTreeMap<String, Vec<u8>>,
    ) {
        self.refused_all(b, r, &[bad_key.to_owned()], before).await;
    }

    /// [`Scene::refused`] for an attack of several objects.
    async fn refused_all(
        &self,
        b: &Backend,
        r: Result<Opened, ReplicaError>,
        bad_keys: &[String],
        before: BTreeMap<String, Vec<u8>>,
    ) {
        let e = r.expect_err("the restore must fail");
        assert!(e.is_bad_bucket_input(), "{e}");
        assert_eq!(self.local_files(), before, "the local folder changed");
        assert!(dump(&self.local).contains("local only"));
        let other = self.tmp.path().join("neighbour-restored").join("actor.db");
        let (_, opened) = Replica::open(&b.bucket, &self.neighbour, &other, 8, config(MIB), 0)
            .await
            .unwrap();
        assert_eq!(opened, Opened::Restored { replaced: None });
        assert!(dump(&other).contains("neighbour data"));
        for key in bad_keys {
            b.bucket.delete(key).await.unwrap();
        }
        let opened = self.restore(b, config(64 * MIB)).await.unwrap();
        assert!(
            matches!(opened, Opened::Restored { replaced: Some(_) }),
            "{opened:?}"
        );
        assert!(dump(&self.local).contains("row 0000"));
    }
}

async fn upload(rep: &mut Replica, src: &mut Source, time_ms: u64) {
    let image = src.image();
    rep.upload(&image, time_ms).await.unwrap();
}

fn seal(content: &[u8]) -> Bytes {
    let mut v = content.to_vec();
    v.extend_from_slice(&Sha256::digest(content));
    Bytes::from(v)
}

/// The reproduced attack: a forged entry of about a hundred bytes whose
/// header claims 2^32 - 1 pages made the node abort allocating 256 TiB.
/// Now the header is refused, naming the bound.
async fn a_huge_page_count(b: &Backend) {
    let s = Scene::new(b, "huge count").await;
    let body = s.forged(u32::MAX, Vec::new()).encode(u64::MAX).unwrap();
    assert!(body.len() < 160, "{}", body.len());
    let key = s.root.log(2);
    b.bucket.create(&key, Bytes::from(body)).await.unwrap();
    let before = s.local_files();
    let r = s.restore(b, config(64 * MIB)).await;
    let e = r.as_ref().unwrap_err();
    assert_eq!(e.code(), "database_too_large", "{e}");
    assert!(
        e.to_string()
            .contains("db_pages=4294967295 limit database_pages_max="),
        "{e}"
    );
    assert!(e.to_string().contains(&key), "{e}");
    s.refused(b, r, &key, before).await;
}

/// Within the bound, but the header claims pages the body does not carry:
/// the image would grow from a number alone.
async fn growth_without_pages(b: &Backend) {
    let s = Scene::new(b, "uncarried").await;
    let limit = config(64 * MIB).database_pages_max(s.page_size);
    let body = s.forged(limit, Vec::new()).encode(u64::MAX).unwrap();
    let key = s.root.log(2);
    b.bucket.create(&key, Bytes::from(body)).await.unwrap();
    let before = s.local_files();
    let r = s.restore(b, config(64 * MIB)).await;
    let e = r.as_ref().unwrap_err();
    assert_eq!(e.code(), "replica_corrupt", "{e}");
    assert!(e.to_string().contains("but carries 0 of them"), "{e}");
    s.refused(b, r, &key, before).await;
}

/// A real entry cut short, once as it is (the checksum fails) and once
/// sealed again (the page list no longer fills the body).
async fn a_truncated_entry(b: &Backend) {
    for resealed in [false, true] {
        let mut s = Scene::new(b, &format!("truncated {resealed}")).await;
        let before = s.source.image();
        s.source
            .commit(&[("UPDATE big SET s = 'changed' WHERE i < 50", vec![])]);
        let after = s.source.image();
        let token = Token::fresh(9).unwrap();
        let entry = after.diff(Some(&before.hashes()), 2, 3, token, s.root.as_str());
        let body = entry.encode(u64::MAX).unwrap();
        let cut = body.len() - 32 - 100;
        let bytes = if resealed {
            seal(&body[..cut])
        } else {
            Bytes::copy_from_slice(&body[..cut])
        };
        let key = s.root.log(2);
        b.bucket.create(&key, bytes).await.unwrap();
        let before = s.local_files();
        let r = s.restore(b, config(64 * MIB)).await;
        let e = r.as_ref().unwrap_err();
        assert_eq!(e.code(), "replica_corrupt", "{e}");
        let reason = if resealed {
            "page list does not fill the body"
        } else {
            "checksum mismatch"
        };
        assert!(e.to_string().contains(reason), "{e}");
        s.refused(b, r, &key, before).await;
    }
}

/// A page numbered beyond what `entry_bytes_max` allows a database (with
/// its page count to match), under a bound that the real chain fits.
async fn a_page_beyond_the_limit(b: &Backend) {
    let s = Scene::new(b, "page beyond").await;
    let small = config(MIB);
    let limit = small.database_pages_max(s.page_size);
    let page = vec![0u8; s.page_size as usize];
    let body = s
        .forged(limit + 1, vec![(limit + 1, page)])
        .encode(u64::MAX)
        .unwrap();
    assert!((body.len() as u64) < small.entry_bytes_max);
    let key = s.root.log(2);
    b.bucket.create(&key, Bytes::from(body)).await.unwrap();
    let before = s.local_files();
    let r = s.restore(b, small).await;
    let e = r.as_ref().unwrap_err();
    assert_eq!(e.code(), "database_too_large", "{e}");
    let expected = format!("db_pages={} limit database_pages_max={limit}", limit + 1);
    assert!(e.to_string().contains(&expected), "{e}");
    s.refused(b, r, &key, before).await;
}

/// A snapshot with a valid checksum whose SQLite image is corrupt: the
/// restore checks it with `quick_check` before installing it.
async fn a_corrupt_image(b: &Backend) {
    let mut s = Scene::new(b, "corrupt image").await;
    let (key, root_page) = plant_corrupt_snapshot(b, &mut s).await;
    let before = s.local_files();
    let r = s.restore(b, config(64 * MIB)).await;
    let e = r.as_ref().unwrap_err();
    assert_eq!(e.code(), "restored_image_corrupt", "{e}");
    assert!(e.to_string().contains(&key), "{e}");
    assert!(e.to_string().contains(&format!("page {root_page}")), "{e}");
    s.refused(b, r, &key, before).await;
}

/// Plants `snap/2`: the victim's state with the root page of table `big`
/// scribbled over, sealed with a valid checksum. Returns its key and the
/// page.
async fn plant_corrupt_snapshot(b: &Backend, s: &mut Scene) -> (String, u32) {
    let image = s.source.image();
    let root_page = {
        let f = s.tmp.path().join("probe.db");
        std::fs::write(&f, image.bytes()).unwrap();
        let c = rusqlite::Connection::open(&f).unwrap();
        c.query_row(
            "SELECT rootpage FROM sqlite_master WHERE name = 'big'",
            [],
            |r| r.get::<_, u32>(0),
        )
        .unwrap()
    };
    let mut bytes = image.into_bytes();
    // Scribble over the root page's cell pointers, past its header.
    let start = (root_page as usize - 1) * s.page_size as usize + 12;
    bytes[start..start + 48].fill(0xff);
    let bad = Image::from_bytes(bytes).unwrap();
    let token = Token::fresh(9).unwrap();
    let snap = bad.snapshot(2, 3, token, s.root.as_str());
    let key = s.root.snap(2);
    let body = Bytes::from(snap.encode(u64::MAX).unwrap());
    b.bucket.create(&key, body).await.unwrap();
    (key, root_page)
}

/// An object far larger than the bound it is read under is refused before
/// its body is downloaded: from the listing's size; from the GET's length
/// when the listing lies; and after at most about the bound's worth of
/// bytes when the GET's length lies too.
async fn an_object_over_its_bound(b: &Backend) {
    let lies = [
        SizeLies::Truthful,
        SizeLies::Listing,
        SizeLies::ListingAndGet,
    ];
    for lie in lies {
        let s = Scene::new(b, &format!("oversized {lie:?}")).await;
        let listed = b
            .bucket
            .list(&s.root.log_dir(), None, u64::MAX)
            .await
            .unwrap();
        assert_eq!(listed.len(), 2);
        let chain_bytes = chain_bytes(b, &s).await;
        let key = s.root.log(2);
        let junk = Bytes::from(vec![0x5a; 8 * MIB as usize]);
        b.bucket.create(&key, junk).await.unwrap();
        b.faults.lie_about_sizes(lie);
        let files = s.local_files();
        let before = b.bucket.metrics().snapshot();
        let r = s.restore(b, config(MIB)).await;
        let after = b.bucket.metrics().snapshot();
        let e = r.as_ref().unwrap_err();
        // When both the listing and the GET lie, the junk's first bytes
        // already fail as a header (issue 33), or it is cut off at the
        // bound; either way it is refused early.
        let codes: &[&str] = match lie {
            SizeLies::ListingAndGet => &["object_too_large", "replica_corrupt"],
            _ => &["object_too_large"],
        };
        assert!(codes.contains(&e.code()), "{lie:?}: {e}");
        if e.code() == "object_too_large" {
            assert!(
                e.to_string().contains("limit entry_bytes_max=1048576"),
                "{e}"
            );
        }
        assert!(e.to_string().contains(&key), "{e}");
        let (gets, read) = (after.gets - before.gets, after.get_bytes - before.get_bytes);
        match lie {
            SizeLies::Truthful => {
                // Every listed size is checked before the first download.
                assert_eq!((gets, read), (0, 0), "refused from the listing");
            }
            SizeLies::Listing => {
                assert_eq!(
                    (gets, read),
                    (3, chain_bytes),
                    "refused from the GET's length"
                );
            }
            SizeLies::ListingAndGet => {
                let junk_read = read - chain_bytes;
                assert!(
                    junk_read > 0 && junk_read <= 2 * MIB,
                    "cut off after {junk_read}"
                );
            }
        }
        // Export reads entry by entry and checks each listed size as well.
        let before = b.bucket.metrics().snapshot();
        let e = export(&b.bucket, &s.victim, At::Latest, &config(MIB))
            .await
            .unwrap_err();
        let after = b.bucket.metrics().snapshot();
        assert!(codes.contains(&e.code()), "{lie:?}: {e}");
        if lie == SizeLies::Truthful {
            assert_eq!(after.gets - before.gets, 2, "export downloaded the object");
        }
        assert!(after.get_bytes - before.get_bytes <= chain_bytes + 2 * MIB);
        b.faults.lie_about_sizes(SizeLies::Truthful);
        s.refused(b, r, &key, files).await;
    }
}

/// An object of junk within every size bound (a planted file, issue 33: a
/// sparse 6 GiB one cost 85 s a restore) is refused as soon as its header
/// is read: the rest is never downloaded.
async fn a_planted_object_within_the_bound(b: &Backend) {
    let s = Scene::new(b, "planted").await;
    let chain_bytes = chain_bytes(b, &s).await;
    let key = s.root.log(2);
    let junk = Bytes::from(vec![0u8; 16 * MIB as usize]);
    b.bucket.create(&key, junk).await.unwrap();
    let files = s.local_files();
    let before = b.bucket.metrics().snapshot();
    let r = s.restore(b, config(64 * MIB)).await;
    let after = b.bucket.metrics().snapshot();
    let e = r.as_ref().unwrap_err();
    assert_eq!(e.code(), "replica_corrupt", "{e}");
    let junk_read = (after.get_bytes - before.get_bytes).saturating_sub(chain_bytes);
    assert!(
        junk_read <= 4 * MIB,
        "read {junk_read} bytes of a 16 MiB object whose header is junk"
    );
    s.refused(b, r, &key, files).await;
}

/// Bytes of the victim's real chain (its two entries).
async fn chain_bytes(b: &Backend, s: &Scene) -> u64 {
    let before = b.bucket.metrics().snapshot().get_bytes;
    for seq in [0, 1] {
        let k = s.root.log(seq);
        b.bucket.get_bounded(&k, "test", u64::MAX).await.unwrap();
    }
    b.bucket.metrics().snapshot().get_bytes - before
}

/// A writer that finds someone's object at its next seq reads it back to
/// tell a lost response of its own from another writer's entry; a large
/// object there is not downloaded to find out it is not ours.
async fn a_large_object_at_the_next_seq(b: &Backend) {
    let mut s = Scene::new(b, "next seq").await;
    let key = s.root.log(2);
    let junk = Bytes::from(vec![0x5a; 8 * MIB as usize]);
    b.bucket.create(&key, junk).await.unwrap();
    s.source
        .commit(&[("UPDATE big SET s = 'mine' WHERE i = 1", vec![])]);
    let image = s.source.image();
    let before = b.bucket.metrics().snapshot();
    let e = s.writer.upload(&image, 9).await.unwrap_err();
    let after = b.bucket.metrics().snapshot();
    assert!(matches!(e, ReplicaError::ChainMoved { seq: 2 }), "{e}");
    assert_eq!(after.get_bytes - before.get_bytes, 0);
}

/// What SQLite's `PRAGMA quick_check` says of the file at `path`: its first
/// row, or the error that stopped it.
fn sqlite_quick_check(path: &std::path::Path) -> String {
    let c = rusqlite::Connection::open(path).unwrap();
    c.query_row("PRAGMA quick_check", [], |r| r.get::<_, String>(0))
        .unwrap_or_else(|e| e.to_string())
}

/// Bucket input (issue 17): an export rebuilt from a corrupt snapshot is written under a
/// temporary name, fails `quick_check` there and never takes its name.
/// The unchecked bytes (what the export wrote before the rule) are that
/// corrupt file.
async fn a_corrupt_export(b: &Backend) {
    let mut s = Scene::new(b, "corrupt export").await;
    let (key, root_page) = plant_corrupt_snapshot(b, &mut s).await;
    let dir = s.tmp.path().join("exported");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("out.db");
    let none = &|_, _| {};
    let e = export_to_path(
        &b.bucket,
        &s.victim,
        At::Latest,
        &config(64 * MIB),
        &out,
        none,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), "restored_image_corrupt", "{e}");
    assert!(e.to_string().contains(&key), "{e}");
    assert!(e.to_string().contains(&format!("page {root_page}")), "{e}");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");

    // Without the check: the same bytes, written as they are, are a file
    // SQLite finds corrupt.
    let bytes = export(&b.bucket, &s.victim, At::Latest, &config(64 * MIB))
        .await
        .unwrap();
    let unchecked = s.tmp.path().join("unchecked.db");
    std::fs::write(&unchecked, &bytes).unwrap();
    assert_ne!(sqlite_quick_check(&unchecked), "ok");

    // Once the bad snapshot is gone the export is checked and written, and
    // a second export never replaces it.
    b.bucket.delete(&key).await.unwrap();
    let n = export_to_path(
        &b.bucket,
        &s.victim,
        At::Latest,
        &config(64 * MIB),
        &out,
        none,
    )
    .await
    .unwrap();
    assert_eq!(n, std::fs::metadata(&out).unwrap().len());
    assert_eq!(sqlite_quick_check(&out), "ok");
    assert!(dump(&out).contains("row 0000"));
    let written = std::fs::read(&out).unwrap();
    let e = export_to_path(
        &b.bucket,
        &s.victim,
        At::Latest,
        &config(64 * MIB),
        &out,
        none,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), "replica_io_error", "{e}");
    assert_eq!(std::fs::read(&out).unwrap(), written);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
}

/// Bucket input (issue 17): a folder filled with keys (40 under `log/` here, standing for
/// millions). A restore reads the listing key by key and gives up as soon
/// as it holds more than `listing_keys_max`, having downloaded nothing.
/// Without the rule (`unsafe_unbounded_listings`) the restore holds every
/// key the bucket lists, however many: the attack.
async fn a_long_listing(b: &Backend) {
    let s = Scene::new(b, "long listing").await;
    let junk: Vec<String> = (0..40)
        .map(|i| format!("{}junk-{i:03}", s.root.log_dir()))
        .collect();
    for k in &junk {
        b.bucket.create(k, Bytes::from_static(b"x")).await.unwrap();
    }
    let bounded = ReplicaConfig {
        listing_keys_max: 16,
        ..config(64 * MIB)
    };
    let files = s.local_files();
    let before = b.bucket.metrics().snapshot();
    let r = s.restore(b, bounded.clone()).await;
    let after = b.bucket.metrics().snapshot();
    let e = r.as_ref().unwrap_err();
    assert_eq!(e.code(), "listing_too_long", "{e}");
    assert!(
        e.to_string()
            .contains("more than 16 keys: limit listing_keys_max=16"),
        "{e}"
    );
    assert!(e.to_string().contains(&s.root.log_dir()), "{e}");
    assert_eq!(after.gets - before.gets, 0, "nothing is downloaded");
    // `snap/` is empty; `log/` is dropped at its 17th key.
    assert_eq!(after.listed_keys - before.listed_keys, 17);

    let unbounded = ReplicaConfig {
        unsafe_unbounded_listings: true,
        ..bounded
    };
    let elsewhere = s.tmp.path().join("unbounded").join("actor.db");
    let before = b.bucket.metrics().snapshot();
    let (_, opened) = Replica::open(&b.bucket, &s.victim, &elsewhere, 7, unbounded, 0)
        .await
        .unwrap();
    let after = b.bucket.metrics().snapshot();
    assert_eq!(opened, Opened::Restored { replaced: None });
    assert_eq!(after.listed_keys - before.listed_keys, 42, "every key held");
    s.refused_all(b, r, &junk, files).await;
}

/// Gap 1, deleting: `delete_all` works through folders of any length in
/// passes of at most `listing_keys_max` seqs, the lowest first, rather
/// than refusing; keys that are not a seq stay. It leaves a tombstone
/// above the highest seq (whatever that key holds), deletes the snapshots
/// below it and erases the entries that hold pages in place (ADR 0007,
/// "Deleting an actor"). Without the rule it holds every key at once (one
/// listing a folder, besides the two that find the head).
async fn deleting_a_filled_folder(b: &Backend) {
    let s = Scene::new(b, "filled delete").await;
    let stray = format!("{}notes.txt", s.root.log_dir());
    let plant = || async {
        for seq in 0..42 {
            let k = s.root.log(seq);
            if seq >= 2 {
                b.bucket.create(&k, Bytes::from_static(b"x")).await.unwrap();
            }
        }
        for seq in 0..20 {
            let k = s.root.snap(seq);
            b.bucket.create(&k, Bytes::from_static(b"x")).await.unwrap();
        }
        b.bucket
            .create(&stray, Bytes::from_static(b"x"))
            .await
            .unwrap();
    };
    plant().await;
    let bounded = ReplicaConfig {
        listing_keys_max: 8,
        ..config(64 * MIB)
    };
    let before = b.bucket.metrics().snapshot();
    let n = delete_all(&b.bucket, &s.victim, 9, &bounded, 50)
        .await
        .unwrap();
    let after = b.bucket.metrics().snapshot();
    // 20 snapshots deleted; the two real entries erased in place (the
    // planted one-byte objects hold no page and are left).
    assert_eq!(n, 22);
    // Two listings find the head; `snap/`: 8, 8 and 4 seqs; `delta/` and
    // `whole/`: one page each (empty); `log/`: five passes of 8 and one of 2.
    assert_eq!(after.lists - before.lists, 13);
    let left = b.bucket.list(s.root.as_str(), None, u64::MAX).await;
    let mut expected: Vec<String> = (0..=42).map(|seq| s.root.log(seq)).collect();
    expected.push(stray.clone());
    expected.push(s.root.snap(42));
    expected.sort();
    assert_eq!(left.unwrap(), expected);
    for key in [
        s.root.log(0),
        s.root.log(1),
        s.root.log(42),
        s.root.snap(42),
    ] {
        let body = b.bucket.get_bounded(&key, "test", u64::MAX).await.unwrap();
        let e = Entry::decode(&key, &body, u64::MAX).unwrap();
        assert_eq!((e.kind, e.pages.len()), (Kind::Tombstone, 0), "{key}");
    }
    let gone = s.restore(b, config(64 * MIB)).await.unwrap();
    assert!(
        matches!(gone, Opened::Deleted { replaced: Some(_) }),
        "{gone:?}"
    );
    // The neighbour's chain is untouched.
    let other = s.tmp.path().join("neighbour-after").join("actor.db");
    let (_, opened) = Replica::open(&b.bucket, &s.neighbour, &other, 8, config(MIB), 0)
        .await
        .unwrap();
    assert_eq!(opened, Opened::Restored { replaced: None });

    // The snapshots planted again (the entries' keys are still taken).
    // Deleting again reuses the tombstone at the head.
    plant().await;
    let unbounded = ReplicaConfig {
        unsafe_unbounded_listings: true,
        ..bounded
    };
    let before = b.bucket.metrics().snapshot();
    let n = delete_all(&b.bucket, &s.victim, 9, &unbounded, 60)
        .await
        .unwrap();
    let after = b.bucket.metrics().snapshot();
    assert_eq!(n, 20);
    assert_eq!(
        after.lists - before.lists,
        6,
        "one listing held each folder (`snap/`, `delta/`, `whole/`, `log/`), besides the two that find the head"
    );
    let snaps = b.bucket.list_seqs(&s.root.snap_dir(), None, u64::MAX).await;
    assert_eq!(snaps.unwrap(), vec![42]);
}

/// Gap 1, collecting: one collection deletes at most `listing_keys_max`
/// entries, the oldest first; the next goes on from there.
async fn collecting_in_batches(b: &Backend) {
    let tmp = tempfile::tempdir().unwrap();
    let id = actor("batched collect");
    let mut src = Source::new(&tmp.path().join("src"));
    let cfg = ReplicaConfig {
        listing_keys_max: 8,
        snapshots_keep: 1,
        ..config(64 * MIB)
    };
    let (mut rep, _) = Replica::open(&b.bucket, &id, &src.path(), 1, cfg, 0)
        .await
        .unwrap();
    src.commit(&[("CREATE TABLE t (i INTEGER)", vec![])]);
    upload(&mut rep, &mut src, 1).await;
    for i in 1..20 {
        src.commit(&[("INSERT INTO t VALUES (?)", vec![Value::Integer(i)])]);
        upload(&mut rep, &mut src, 1 + i as u64).await;
    }
    let dir = rep.root().log_dir();
    let logs = |b: &Backend| {
        let (bucket, dir) = (b.bucket.clone(), dir.clone());
        async move { bucket.list_seqs(&dir, None, u64::MAX).await.unwrap() }
    };
    assert_eq!(logs(b).await, (0..20).collect::<Vec<u64>>());
    let image = src.image();
    rep.snapshot(&image).await.unwrap(); // snap/19, then a collection
    assert_eq!(logs(b).await, (8..20).collect::<Vec<u64>>());
    rep.collect().await.unwrap();
    assert_eq!(logs(b).await, (16..20).collect::<Vec<u64>>());
    rep.collect().await.unwrap();
    assert_eq!(logs(b).await, Vec::<u64>::new());
}

/// Bucket input (issue 17): more entries above the latest snapshot than a restore replays
/// are refused from the listing, before anything is downloaded; at the
/// bound the same chain restores.
async fn too_many_entries(b: &Backend) {
    let mut s = Scene::new(b, "many entries").await;
    for i in 0..6 {
        let sql = format!("UPDATE big SET s = 'v{i}' WHERE i = {i}");
        s.source.commit(&[(sql.as_str(), vec![])]);
        upload(&mut s.writer, &mut s.source, 10 + i).await; // seq 2..=7
    }
    let files = s.local_files();
    let before = b.bucket.metrics().snapshot();
    let bounded = ReplicaConfig {
        restore_entries_max: 5,
        ..config(64 * MIB)
    };
    let r = s.restore(b, bounded).await;
    let after = b.bucket.metrics().snapshot();
    let e = r.as_ref().unwrap_err();
    assert_eq!(e.code(), "restore_too_long", "{e}");
    assert!(e.is_bad_bucket_input());
    assert!(
        e.to_string()
            .contains("entries=8 limit restore_entries_max=5"),
        "{e}"
    );
    assert!(e.to_string().contains(&s.root.log(5)), "{e}");
    assert_eq!(after.gets - before.gets, 0, "nothing is downloaded");
    assert_eq!(s.local_files(), files, "the local folder changed");
    let at_the_bound = ReplicaConfig {
        restore_entries_max: 8,
        ..config(64 * MIB)
    };
    let opened = s.restore(b, at_the_bound).await.unwrap();
    assert!(matches!(opened, Opened::Restored { replaced: Some(_) }));
    assert!(dump(&s.local).contains("Text(\"v5\")"));
}

/// Gap 2, bytes: a chain whose objects add up to more than
/// `restore_bytes_max` is refused from the listing's sizes before anything
/// is downloaded; when the listing lies, each download is cut off where
/// the budget ends (refused unread from the GET's length, or as its body
/// runs past).
async fn too_many_bytes(b: &Backend) {
    let lies = [
        SizeLies::Truthful,
        SizeLies::Listing,
        SizeLies::ListingAndGet,
    ];
    for lie in lies {
        let s = Scene::new(b, &format!("many bytes {lie:?}")).await;
        let first = b
            .bucket
            .get_bounded(&s.root.log(0), "test", u64::MAX)
            .await
            .unwrap()
            .len() as u64;
        let chain = chain_bytes(b, &s).await;
        let limit = first + (chain - first) / 2;
        let bounded = ReplicaConfig {
            restore_bytes_max: limit,
            ..config(64 * MIB)
        };
        let files = s.local_files();
        b.faults.lie_about_sizes(lie);
        let before = b.bucket.metrics().snapshot();
        let r = s.restore(b, bounded).await;
        let after = b.bucket.metrics().snapshot();
        b.faults.lie_about_sizes(SizeLies::Truthful);
        let e = r.as_ref().unwrap_err();
        assert_eq!(e.code(), "restore_too_long", "{lie:?}: {e}");
        let named = format!("limit restore_bytes_max={limit}");
        assert!(e.to_string().contains(&named), "{e}");
        assert!(e.to_string().contains(&s.root.log(1)), "{e}");
        let (gets, read) = (after.gets - before.gets, after.get_bytes - before.get_bytes);
        match lie {
            SizeLies::Truthful => {
                assert!(e.to_string().contains(&format!("bytes={chain}")), "{e}");
                assert_eq!((gets, read), (0, 0), "refused from the listing");
            }
            SizeLies::Listing => {
                assert_eq!((gets, read), (2, first), "refused from the GET's length");
            }
            SizeLies::ListingAndGet => {
                assert_eq!(gets, 2);
                assert!(read > first && read <= chain, "read {read}");
            }
        }
        assert_eq!(s.local_files(), files, "the local folder changed");
        let enough = ReplicaConfig {
            restore_bytes_max: chain,
            ..config(64 * MIB)
        };
        let opened = s.restore(b, enough).await.unwrap();
        assert!(matches!(opened, Opened::Restored { replaced: Some(_) }));
    }
}

async fn all_scenarios(make: impl Fn() -> Backend) {
    a_huge_page_count(&make()).await;
    growth_without_pages(&make()).await;
    a_truncated_entry(&make()).await;
    a_page_beyond_the_limit(&make()).await;
    a_corrupt_image(&make()).await;
    an_object_over_its_bound(&make()).await;
    a_planted_object_within_the_bound(&make()).await;
    a_large_object_at_the_next_seq(&make()).await;
    a_corrupt_export(&make()).await;
    a_long_listing(&make()).await;
    deleting_a_filled_folder(&make()).await;
    collecting_in_batches(&make()).await;
    too_many_entries(&make()).await;
    too_many_bytes(&make()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_local_folder() {
    all_scenarios(Backend::file).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_moto() {
    let moto = Moto::start();
    moto.create_bucket("bucket-input");
    all_scenarios(|| Backend::moto(&moto, "bucket-input")).await;
}
