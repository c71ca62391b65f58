//! One name limit for every layer (`name_bytes_max`, issue 18): the store
//! defines it, the replica checks it again before it builds a key, and the
//! cluster crate (which depends on nothing) keeps an equal copy, checked
//! here. The longest allowed name, with the longest tenant, app and class,
//! round-trips through a local folder (`file://`, whose folder names hold
//! 255 bytes) and a real S3 server (moto): its chain (upload, restore,
//! delete) and its alarm index keys (ADR 0009). One byte more is refused
//! at every edge, by an error that names the limit.

mod common;

use common::{Backend, Moto, Source};
use wasmkeep_cluster::alarm_index::{Address, Entry as IndexEntry, IndexKey};
use wasmkeep_replica::{At, Bucket, Opened, Replica, ReplicaConfig, delete_all, export};
use wasmkeep_store::id::{NAME_BYTES_MAX, NAME_TOO_LONG, SEGMENT_BYTES_MAX};
use wasmkeep_store::{ActorId, Value};

#[test]
fn the_layers_share_one_limit_and_one_split() {
    assert_eq!(wasmkeep_cluster::config::NAME_BYTES_MAX, NAME_BYTES_MAX);
    assert_eq!(wasmkeep_cluster::config::NAME_TOO_LONG, NAME_TOO_LONG);
    assert_eq!(
        wasmkeep_cluster::config::HEX_SEGMENT_CHARS,
        wasmkeep_store::paths::HEX_SEGMENT_CHARS
    );
    assert!(NAME_TOO_LONG.ends_with(&format!("name_bytes_max={NAME_BYTES_MAX}")));
}

/// The longest name (two-byte characters, so bytes and characters differ)
/// in the longest tenant, app and class.
fn longest() -> ActorId {
    let seg = "s".repeat(SEGMENT_BYTES_MAX);
    let name = "é".repeat(NAME_BYTES_MAX / 2);
    assert_eq!(name.len(), NAME_BYTES_MAX);
    ActorId::new(&seg, &seg, &seg, &name).unwrap()
}

/// The same, one byte longer, built by hand past `ActorId::new`.
fn one_byte_more() -> ActorId {
    let mut id = longest();
    id.name.push('x');
    id
}

async fn chain_round_trip(b: &Backend) {
    let tmp = tempfile::tempdir().unwrap();
    let id = longest();
    let config = ReplicaConfig {
        collect_grace_ms: 0,
        ..ReplicaConfig::default()
    };
    let mut src = Source::new(&tmp.path().join("src"));
    let (mut rep, opened) = Replica::open(&b.bucket, &id, &src.path(), 1, config.clone(), 0)
        .await
        .unwrap();
    assert_eq!(opened, Opened::BucketEmpty { local: true });
    src.commit(&[
        ("CREATE TABLE t (v TEXT, w INTEGER)", vec![]),
        (
            "INSERT INTO t VALUES (?, 1)",
            vec![Value::Text("long named".into())],
        ),
    ]);
    rep.upload(&src.image(), 1).await.unwrap();
    rep.snapshot(&src.image()).await.unwrap();
    assert!(
        rep.root()
            .as_str()
            .split('/')
            .all(|folder| folder.len() <= 201),
        "{}",
        rep.root().as_str()
    );

    let dst = tmp.path().join("dst").join("actor.db");
    let (_, opened) = Replica::open(&b.bucket, &id, &dst, 2, config.clone(), 5)
        .await
        .unwrap();
    assert_eq!(opened, Opened::Restored { replaced: None });
    assert!(common::dump(&dst).contains("long named"));
    let bytes = export(&b.bucket, &id, At::Latest, &config).await.unwrap();
    assert!(common::dump_bytes(&bytes).contains("long named"));

    assert!(delete_all(&b.bucket, &id, 3, &config, 9).await.unwrap() > 0);
    let again = tmp.path().join("again").join("actor.db");
    let (_, opened) = Replica::open(&b.bucket, &id, &again, 4, config.clone(), 10)
        .await
        .unwrap();
    assert_eq!(opened, Opened::Deleted { replaced: None });

    // One byte more: refused before any request, naming the limit.
    let over = one_byte_more();
    let before = b.bucket.metrics().snapshot();
    let e = Replica::open(&b.bucket, &over, &again, 5, config.clone(), 11)
        .await
        .expect_err("refused");
    assert_eq!(e.code(), "invalid_name");
    assert!(e.to_string().contains("name_bytes_max=256"), "{e}");
    let e = delete_all(&b.bucket, &over, 5, &config, 11)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "invalid_name");
    let e = export(&b.bucket, &over, At::Latest, &config)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "invalid_name");
    assert_eq!(b.bucket.metrics().snapshot(), before, "no request was sent");
    let e = ActorId::new(&over.tenant, &over.app, &over.class, &over.name).unwrap_err();
    assert!(e.to_string().contains("name_bytes_max=256"), "{e}");
}

/// The alarm index's keys (tagged and legacy) of the longest name are
/// written, listed and parsed back; one byte more is refused by the
/// cluster crate, naming the limit.
async fn index_keys_round_trip(bucket: &Bucket) {
    let id = longest();
    let prefix = format!("alarms/{}/", id.tenant);
    let address = Address::new(id.class.clone(), id.name.clone()).unwrap();
    let keys = [
        IndexKey::new(address.clone(), IndexEntry::legacy(1_000)).unwrap(),
        IndexKey::new(address.clone(), IndexEntry::tagged(2_000, 3, 4)).unwrap(),
    ];
    for k in &keys {
        let full = format!("{prefix}{}", k.to_key());
        bucket
            .create(&full, bytes::Bytes::new())
            .await
            .unwrap_or_else(|e| panic!("{full}: {e}"));
    }
    for k in &keys {
        let folder = format!("{prefix}{}", k.to_key());
        let dir = &folder[..=folder.rfind('/').unwrap()];
        let listed = bucket.list(dir, None, 10).await.unwrap();
        assert_eq!(listed, vec![folder.clone()]);
        assert_eq!(&IndexKey::parse_full(&prefix, &listed[0]).unwrap(), k);
    }
    let e = Address::new(id.class.clone(), format!("{}x", id.name)).unwrap_err();
    assert!(e.to_string().contains("name_bytes_max=256"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_name_on_a_local_folder() {
    chain_round_trip(&Backend::file()).await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("bucket").display());
    index_keys_round_trip(&Bucket::from_url(&url).unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_name_on_moto() {
    let moto = Moto::start();
    moto.create_bucket("names");
    chain_round_trip(&Backend::moto(&moto, "names")).await;
    let bucket = Bucket::from_url_with_options("s3://names/index", moto.options()).unwrap();
    index_keys_round_trip(&bucket).await;
}
