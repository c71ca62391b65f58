//! The cluster as the bucket shows it, for `GET /admin/v1/cluster`: every
//! node id under `nodes/`, each node's latest lease record read and judged
//! by `wasmkeep-cluster`'s [`NodeViewReader`] (the same reader a take uses
//! to learn whether a holder lives), and the live ones kept.
//!
//! Bounded: the node ids come from a paged listing that skips each node's
//! remaining records once its id is known, at most [`VIEW_NODES_MAX`] ids;
//! at most [`VIEW_READS_CONCURRENT_MAX`] nodes are read at once; every
//! bucket call has the driver's timeout. Other nodes' held-actor counts are
//! not in the bucket, so the view gives this node's only (each node answers
//! its own in `/admin/v1/node`).

use std::sync::Arc;

use wasmkeep_cluster::ClusterConfig;
use wasmkeep_cluster::lease::{LeaseKey, NODES_PREFIX, NodeLeaseView};
use wasmkeep_cluster::machine::{BucketOp, BucketResult, NodeViewEffect, NodeViewReader};

use super::bucket::BucketDriver;
use super::now_ms;

/// Most node ids one view lists (`truncated` past it).
pub const VIEW_NODES_MAX: usize = 1_000;
/// Most nodes' leases read at once for one view.
pub const VIEW_READS_CONCURRENT_MAX: usize = 8;
/// Sorts after every record key in a node's folder (`<epoch>/<counter>`,
/// digits): listing from `nodes/<id>/` plus this skips the rest of `<id>`.
const AFTER_NODE_RECORDS: &str = "~";

/// One live node, as its latest lease record shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveNode {
    pub node: String,
    pub address: String,
    pub epoch: u64,
    /// The record's expiry by the writer's clock (ms since the Unix epoch).
    pub expires_at_ms: u64,
}

impl LiveNode {
    /// How long ago the latest record was written: now minus (its expiry
    /// minus `lease_period_ms`), the writer's clock against this node's (a
    /// skew shows as a negative or too large age).
    pub fn lease_age_ms(&self, now_ms: u64, config: &ClusterConfig) -> i64 {
        let written = self.expires_at_ms.saturating_sub(config.lease_period_ms);
        now_ms as i64 - written as i64
    }

    /// Time left until the record's expiry, by this node's clock; negative
    /// while the lease is within its grace (still live to others).
    pub fn expires_in_ms(&self, now_ms: u64) -> i64 {
        self.expires_at_ms as i64 - now_ms as i64
    }
}

/// What the bucket showed of the cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// The live nodes, by node id.
    pub live: Vec<LiveNode>,
    /// Node ids listed whose lease is released, fenced, lapsed or absent.
    pub not_live: usize,
    /// Node ids whose lease could not be read (bucket error, malformed).
    pub unreadable: usize,
    /// More than [`VIEW_NODES_MAX`] node ids: the rest were not read.
    pub truncated: bool,
}

/// Why no view could be made.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("the bucket did not answer a listing of `{NODES_PREFIX}`")]
    List,
}

/// Reads the cluster's nodes from the bucket.
pub async fn read(driver: &BucketDriver, config: &ClusterConfig) -> Result<ClusterView, ViewError> {
    let (nodes, truncated) = node_ids(driver, config.list_page_keys_max, VIEW_NODES_MAX).await?;
    let mut view = ClusterView {
        truncated,
        ..ClusterView::default()
    };
    let config = Arc::new(config.clone());
    let mut queue = nodes.into_iter();
    let mut reads = tokio::task::JoinSet::new();
    loop {
        while reads.len() < VIEW_READS_CONCURRENT_MAX {
            let Some(node) = queue.next() else { break };
            let (driver, config) = (driver.clone(), Arc::clone(&config));
            reads.spawn(async move { read_node(&driver, &node, &config).await });
        }
        let Some(done) = reads.join_next().await else {
            break;
        };
        match done {
            Ok(Read::Live(n)) => view.live.push(n),
            Ok(Read::NotLive) => view.not_live += 1,
            Ok(Read::Unreadable) | Err(_) => view.unreadable += 1,
        }
    }
    view.live.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(view)
}

/// The node ids under `nodes/`, in key order, at most `nodes_max` (and
/// whether there were more). Each page asks for `page_keys` keys; after a
/// page the listing resumes past the last node's folder, so a node with
/// many records costs one page, not many.
async fn node_ids(
    driver: &BucketDriver,
    page_keys: usize,
    nodes_max: usize,
) -> Result<(Vec<String>, bool), ViewError> {
    let page_keys = page_keys.max(1);
    let mut nodes: Vec<String> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let op = BucketOp::List {
            prefix: NODES_PREFIX.to_owned(),
            start_after: after.clone(),
            limit: page_keys,
        };
        let BucketResult::Keys(keys) = driver.perform(op).await else {
            return Err(ViewError::List);
        };
        for key in &keys {
            // Keys that are not lease records (anything a human left) are
            // passed over.
            let Ok(k) = LeaseKey::parse(NODES_PREFIX, key) else {
                continue;
            };
            if nodes.last() != Some(&k.node) {
                if nodes.len() == nodes_max {
                    return Ok((nodes, true));
                }
                nodes.push(k.node);
            }
        }
        let Some(last) = keys.last() else {
            return Ok((nodes, false));
        };
        let next = match LeaseKey::parse(NODES_PREFIX, last) {
            Ok(k) => format!(
                "{}{AFTER_NODE_RECORDS}",
                LeaseKey::node_folder(NODES_PREFIX, &k.node)
            ),
            Err(_) => last.clone(),
        };
        // A store that does not move forward ends the listing rather than
        // loop; a short page was the last one.
        if keys.len() < page_keys || after.as_ref().is_some_and(|a| next <= *a) {
            return Ok((nodes, false));
        }
        after = Some(next);
    }
}

enum Read {
    Live(LiveNode),
    NotLive,
    Unreadable,
}

/// Drives one [`NodeViewReader`] against the bucket.
/// Whether `node`'s latest lease record is live in `epoch`: `None` when
/// it could not be read. One listing of the node's folder and one read,
/// whatever the cluster's size.
pub(crate) async fn live_in(
    driver: &BucketDriver,
    config: &ClusterConfig,
    node: &str,
    epoch: u64,
) -> Option<bool> {
    match read_node(driver, node, config).await {
        Read::Live(n) => Some(n.epoch == epoch),
        Read::NotLive => Some(false),
        Read::Unreadable => None,
    }
}

async fn read_node(driver: &BucketDriver, node: &str, config: &ClusterConfig) -> Read {
    let mut reader = NodeViewReader::new(node, config.clone());
    loop {
        match reader.poll_effect() {
            Some(NodeViewEffect::Bucket(op)) => {
                let result = driver.perform(op).await;
                reader.on_result(result, now_ms());
            }
            Some(NodeViewEffect::Done(Ok(NodeLeaseView::Valid { epoch }))) => {
                let (Some(address), Some(expires_at_ms)) =
                    (reader.address(), reader.expires_at_ms())
                else {
                    debug_assert!(false, "a valid lease is a live record");
                    return Read::Unreadable;
                };
                return Read::Live(LiveNode {
                    node: node.to_owned(),
                    address: address.to_owned(),
                    epoch,
                    expires_at_ms,
                });
            }
            Some(NodeViewEffect::Done(Ok(_))) => return Read::NotLive,
            Some(NodeViewEffect::Done(Err(_))) | None => return Read::Unreadable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmkeep_cluster::lease::LeaseRecord;
    use wasmkeep_replica::Bucket;

    fn put(dir: &std::path::Path, node: &str, epoch: u64, counter: u64, record: LeaseRecord) {
        let key = LeaseKey {
            node: node.into(),
            epoch,
            counter,
        }
        .to_key(NODES_PREFIX);
        let path = dir.join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, record.encode()).unwrap();
    }

    fn live(expires_at_ms: u64, address: &str) -> LeaseRecord {
        LeaseRecord::Live {
            expires_at_ms,
            nonce: 7,
            address: address.into(),
        }
    }

    /// On a real folder bucket: node ids are listed page by page (one page
    /// per node, whatever its records), each node's latest record decides,
    /// and only live nodes are kept, with their address and epoch.
    #[tokio::test]
    async fn lists_nodes_and_keeps_the_live_ones() {
        let dir = tempfile::tempdir().unwrap();
        let now = now_ms();
        let far = now + 60_000;
        // `a-b` sorts before `a` ('-' < '/'), and `a0` after it.
        put(dir.path(), "a", 1, 0, live(far, "http://a:1"));
        put(dir.path(), "a", 2, 0, live(far, "http://a:2"));
        for c in 1..5 {
            put(dir.path(), "a", 2, c, live(far, "http://a:2"));
        }
        put(dir.path(), "a-b", 1, 0, live(far, "http://ab:1"));
        put(dir.path(), "a0", 3, 0, live(far, "http://a0:1"));
        put(dir.path(), "a0", 3, 1, LeaseRecord::Released { nonce: 1 });
        put(
            dir.path(),
            "dead",
            1,
            0,
            live(now.saturating_sub(600_000), "http://d:1"),
        );
        std::fs::write(dir.path().join("nodes/junk"), "x").unwrap();
        let url = format!("file://{}", dir.path().display());
        let driver = BucketDriver::new(Bucket::from_url(&url).unwrap(), 5_000);

        let (ids, truncated) = node_ids(&driver, 2, 100).await.unwrap();
        assert_eq!(ids, ["a-b", "a", "a0", "dead"]);
        assert!(!truncated);
        let (ids, truncated) = node_ids(&driver, 2, 2).await.unwrap();
        assert_eq!((ids.len(), truncated), (2, true));

        let config = ClusterConfig {
            list_page_keys_max: 2,
            ..ClusterConfig::default()
        };
        let view = read(&driver, &config).await.unwrap();
        let live: Vec<(&str, &str, u64)> = view
            .live
            .iter()
            .map(|n| (n.node.as_str(), n.address.as_str(), n.epoch))
            .collect();
        assert_eq!(live, [("a", "http://a:2", 2), ("a-b", "http://ab:1", 1)]);
        assert_eq!((view.not_live, view.unreadable), (2, 0));
        let a = &view.live[0];
        assert_eq!(a.expires_in_ms(now), 60_000);
        assert_eq!(a.lease_age_ms(now, &config), 10_000 - 60_000);
    }

    /// A bucket that cannot be listed gives no view (not an empty one).
    #[tokio::test]
    async fn an_unreadable_bucket_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("bucket");
        put(&root, "a", 1, 0, live(now_ms() + 60_000, "http://a:1"));
        let url = format!("file://{}", root.display());
        let driver = BucketDriver::new(Bucket::from_url(&url).unwrap(), 5_000);
        assert_eq!(
            read(&driver, &ClusterConfig::default())
                .await
                .unwrap()
                .live
                .len(),
            1
        );
        std::fs::rename(&root, dir.path().join("away")).unwrap();
        std::fs::write(&root, "not a folder").unwrap();
        assert!(read(&driver, &ClusterConfig::default()).await.is_err());
    }
}
