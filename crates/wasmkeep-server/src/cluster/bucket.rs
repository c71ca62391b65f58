//! The bucket driver: performs a step machine's [`BucketOp`] on the node's
//! real bucket (`wasmkeep_replica::Bucket`, object_store underneath) and
//! answers with a [`BucketResult`].
//!
//! Every call is bounded in time (`cluster_bucket_timeout_ms`: past it the
//! answer is `Failed`, and the machine treats the operation as one that may
//! or may not have landed), a body read is bounded in bytes
//! ([`RECORD_BYTES_MAX`]: lease and hold records are a line of text), and a
//! listing page holds at most the `limit` keys the machine asked for.
//!
//! A read of a lease record (a GET under `nodes/`) that is already in
//! flight on this node is not sent again: a later asker waits for the first
//! one's answer (ADR 0065). After a wave of restarts, a node's concurrent
//! takes each read the lease of every holder they met; a record never
//! changes once written, so the shared answer is the one the asker's own
//! read would get. So is the first page of a listing of one node's lease
//! records ([`BucketOp::is_shared_read`], ADR 0070): one started before a
//! record was written may hide it from an asker that must see it (a take
//! that read a hold of the holder's new epoch must see that epoch's
//! record), so the take uses a shared listing only if it shows that epoch,
//! and lists again, unshared, otherwise. Other listings are never shared.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use wasmkeep_cluster::machine::{BucketOp, BucketResult};
use wasmkeep_replica::Bucket;
use wasmkeep_replica::bucket::Created;

/// Largest record body the driver reads: cluster records (lease, hold) are
/// one short line; anything longer is not one of them and is refused
/// unread (`Failed`).
pub const RECORD_BYTES_MAX: u64 = 4096;

/// Performs step machines' bucket operations, each within a timeout.
#[derive(Debug, Clone)]
pub struct BucketDriver {
    bucket: Bucket,
    timeout: Duration,
    /// Lease reads in flight, by operation: their answer once it came.
    lease_reads: Arc<Mutex<HashMap<BucketOp, tokio::sync::watch::Receiver<Option<BucketResult>>>>>,
}

impl BucketDriver {
    /// A driver over `bucket` whose every call gives up after `timeout_ms`.
    pub fn new(bucket: Bucket, timeout_ms: u64) -> BucketDriver {
        BucketDriver {
            bucket,
            timeout: Duration::from_millis(timeout_ms.max(1)),
            lease_reads: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The bucket it drives (for what is not a machine's operation: the
    /// cluster's deploys).
    pub fn bucket(&self) -> &Bucket {
        &self.bucket
    }

    /// Performs `op`. Errors and timeouts are `Failed`: the machines decide
    /// what a failure means (a renewal that may have landed, a take given
    /// up). A read of a lease record already in flight on this node is not
    /// sent again: its answer is shared (the module's documentation).
    pub async fn perform(&self, op: BucketOp) -> BucketResult {
        if !op.is_shared_read() {
            return self.perform_once(op).await;
        }
        let mut rx = {
            let mut reads = self.lease_reads.lock().expect("lease reads");
            match reads.get(&op) {
                Some(rx) => rx.clone(),
                None => {
                    let (tx, rx) = tokio::sync::watch::channel(None);
                    reads.insert(op.clone(), rx.clone());
                    // The read runs to its end whoever still waits for it:
                    // an asker that is dropped leaves no entry behind.
                    let (driver, op) = (self.clone(), op.clone());
                    tokio::spawn(async move {
                        let result = driver.perform_once(op.clone()).await;
                        driver.lease_reads.lock().expect("lease reads").remove(&op);
                        let _ = tx.send(Some(result));
                    });
                    rx
                }
            }
        };
        let shared = rx
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|r| r.clone());
        match shared {
            Some(result) => result,
            // The read's task ended without an answer (it panicked).
            None => self.perform_once(op).await,
        }
    }

    async fn perform_once(&self, op: BucketOp) -> BucketResult {
        let key = op.key().to_owned();
        match tokio::time::timeout(self.timeout, self.perform_unbounded(op)).await {
            Ok(result) => result,
            Err(_) => {
                tracing::debug!(key, "cluster bucket operation timed out");
                BucketResult::Failed
            }
        }
    }

    async fn perform_unbounded(&self, op: BucketOp) -> BucketResult {
        let b = &self.bucket;
        let failed = |what: &str, key: &str, e: &dyn std::fmt::Display| {
            tracing::debug!(key, error = %e, "cluster bucket {what} failed");
            BucketResult::Failed
        };
        match op {
            BucketOp::PutCreate { key, body } => match b.create(&key, Bytes::from(body)).await {
                Ok(Created::Created) => BucketResult::Done,
                Ok(Created::AlreadyExists) => BucketResult::AlreadyExists,
                Err(e) => failed("create", &key, &e),
            },
            BucketOp::Get { key } => {
                match b
                    .get_bounded(&key, "cluster_record_bytes_max", RECORD_BYTES_MAX)
                    .await
                {
                    Ok(body) => BucketResult::Body(body.to_vec()),
                    Err(e) if e.is_not_found() => BucketResult::NotFound,
                    Err(e) => failed("get", &key, &e),
                }
            }
            BucketOp::List {
                prefix,
                start_after,
                limit,
            } => match b.list_page(&prefix, start_after.as_deref(), limit).await {
                Ok(keys) => BucketResult::Keys(keys),
                Err(e) => failed("list", &prefix, &e),
            },
            BucketOp::Delete { key } => match b.delete(&key).await {
                Ok(()) => BucketResult::Done,
                Err(e) => failed("delete", &key, &e),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver(dir: &std::path::Path) -> BucketDriver {
        let url = format!("file://{}", dir.display());
        BucketDriver::new(Bucket::from_url(&url).unwrap(), 5_000)
    }

    fn put(key: &str, body: &str) -> BucketOp {
        BucketOp::PutCreate {
            key: key.into(),
            body: body.as_bytes().to_vec(),
        }
    }

    /// Create-only PUT, GET, paged LIST and DELETE on a real folder bucket.
    #[tokio::test]
    async fn maps_each_operation_on_a_folder_bucket() {
        let dir = tempfile::tempdir().unwrap();
        let d = driver(dir.path());
        assert_eq!(d.perform(put("nodes/a/1", "x")).await, BucketResult::Done);
        assert_eq!(
            d.perform(put("nodes/a/1", "y")).await,
            BucketResult::AlreadyExists
        );
        let get = |key: &str| BucketOp::Get { key: key.into() };
        assert_eq!(
            d.perform(get("nodes/a/1")).await,
            BucketResult::Body(b"x".to_vec())
        );
        assert_eq!(d.perform(get("nodes/a/2")).await, BucketResult::NotFound);
        for k in ["nodes/a/3", "nodes/a/2", "nodes/ab/1", "nodes/a/0"] {
            d.perform(put(k, "z")).await;
        }
        // A local folder lists unsorted: pages still come in key order, and
        // a prefix that is not a folder filters ("nodes/a" is not "nodes/ab").
        let list = |after: Option<&str>| BucketOp::List {
            prefix: "nodes/a/".into(),
            start_after: after.map(Into::into),
            limit: 2,
        };
        let keys = |r| match r {
            BucketResult::Keys(k) => k,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            keys(d.perform(list(None)).await),
            ["nodes/a/0", "nodes/a/1"]
        );
        assert_eq!(
            keys(d.perform(list(Some("nodes/a/1"))).await),
            ["nodes/a/2", "nodes/a/3"]
        );
        assert!(keys(d.perform(list(Some("nodes/a/3"))).await).is_empty());
        let partial = BucketOp::List {
            prefix: "nodes/a".into(),
            start_after: None,
            limit: 10,
        };
        assert_eq!(keys(d.perform(partial).await).len(), 5);
        let del = BucketOp::Delete {
            key: "nodes/a/1".into(),
        };
        assert_eq!(d.perform(del.clone()).await, BucketResult::Done);
        // Deleting a missing key is no error.
        assert_eq!(d.perform(del).await, BucketResult::Done);
        assert_eq!(d.perform(get("nodes/a/1")).await, BucketResult::NotFound);
    }

    /// A body longer than a record is refused unread, and an unreachable
    /// bucket (its folder replaced by a file) answers `Failed`.
    #[tokio::test]
    async fn oversized_bodies_and_unreachable_buckets_fail() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("bucket");
        let d = driver(&root);
        let big = "x".repeat(RECORD_BYTES_MAX as usize + 1);
        assert_eq!(d.perform(put("big", &big)).await, BucketResult::Done);
        let get = BucketOp::Get { key: "big".into() };
        assert_eq!(d.perform(get).await, BucketResult::Failed);
        std::fs::rename(&root, dir.path().join("away")).unwrap();
        std::fs::write(&root, "not a folder").unwrap();
        assert_eq!(d.perform(put("nodes/a/9", "x")).await, BucketResult::Failed);
    }
}
