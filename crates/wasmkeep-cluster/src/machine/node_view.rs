//! Reading another node's lease: list its folder, read the latest record,
//! judge it by the reader's clock (ADR 0020's `node_lease_view`).
//!
//! Used by [`super::TakeMachine`] to learn whether an actor's holder is alive,
//! and by drivers that need the live nodes (the sweep's sharding, the admin
//! view of the cluster).

use crate::config::ClusterConfig;
use crate::lease::{LeaseKey, LeaseRecord, NODES_PREFIX, NodeLeaseView};
use crate::lease::{latest_lease_key, node_lease_view};

use super::{BucketOp, BucketResult, Failure, Pages, decode_body};

/// What [`NodeViewReader::poll_effect`] asks of its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeViewEffect {
    /// Perform this operation and pass its answer to
    /// [`NodeViewReader::on_result`].
    Bucket(BucketOp),
    /// The node's view, or why none could be read. Emitted once.
    Done(Result<NodeLeaseView, Failure>),
}

#[derive(Clone, Debug)]
enum Phase {
    /// Listing the node's records (all epochs), keeping the latest key.
    List {
        pages: Pages,
        latest: Option<LeaseKey>,
    },
    /// Reading the latest record.
    Read { latest: LeaseKey },
    /// Finished; the result until it is handed out.
    Finished(Option<Result<NodeLeaseView, Failure>>),
}

/// Reads one node's latest lease record and judges it: valid, lapsed (fence
/// it before taking its actors), fenced, released or absent.
#[derive(Clone, Debug)]
pub struct NodeViewReader {
    node: String,
    config: ClusterConfig,
    phase: Phase,
    awaiting: bool,
    /// The address the latest record advertises, once read and live.
    address: Option<String>,
    /// The expiry the latest record states, once read and live.
    expires_at_ms: Option<u64>,
    /// The key of the latest record, once read.
    read_key: Option<LeaseKey>,
    /// The epoch of the hold this read is for ([`NodeViewReader::for_hold`]):
    /// a listing that shows no record of it or a later one may be another
    /// read's, started before that epoch registered, and is not trusted.
    hold_epoch: Option<u64>,
    /// The node's folder was listed again, unshared, after a listing that
    /// did not show the hold's epoch.
    listed_again: bool,
}

impl NodeViewReader {
    /// A reader of `node`'s lease.
    pub fn new(node: &str, config: ClusterConfig) -> NodeViewReader {
        let pages = Pages::new(
            LeaseKey::node_folder(NODES_PREFIX, node),
            config.list_page_keys_max,
        );
        NodeViewReader {
            node: node.to_owned(),
            config,
            phase: Phase::List {
                pages,
                latest: None,
            },
            awaiting: false,
            address: None,
            expires_at_ms: None,
            read_key: None,
            hold_epoch: None,
            listed_again: false,
        }
    }

    /// A reader of `node`'s lease for a take that read a hold of `node` in
    /// `epoch`: its first listing may be one already in flight for another
    /// take ([`BucketOp::is_shared_read`], ADR 0070). Such a listing may
    /// have started before this epoch registered, so if it shows no record
    /// of `epoch` or a later one, the folder is listed again, unshared,
    /// which started after the hold was read and so shows it (otherwise the
    /// hold would be judged dead without a fence).
    pub fn for_hold(node: &str, epoch: u64, config: ClusterConfig) -> NodeViewReader {
        NodeViewReader {
            hold_epoch: Some(epoch),
            ..NodeViewReader::new(node, config)
        }
    }

    /// The address the node advertised in its latest record (how a driver
    /// reaches it to forward a request), once that record was read and is a
    /// live one; `None` before, or for a fenced, released or absent node.
    pub fn address(&self) -> Option<&str> {
        self.address.as_deref()
    }

    /// The expiry (by the writer's clock, ms since the Unix epoch) the
    /// node's latest record states, once that record was read and is a live
    /// one: how an admin view tells how fresh a lease is. `None` as for
    /// [`NodeViewReader::address`].
    pub fn expires_at_ms(&self) -> Option<u64> {
        self.expires_at_ms
    }

    /// The key of the latest record, once read.
    pub fn read_key(&self) -> Option<&LeaseKey> {
        self.read_key.as_ref()
    }

    /// The node being read.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The next effect, or `None` while an operation is outstanding (or after
    /// `Done`).
    pub fn poll_effect(&mut self) -> Option<NodeViewEffect> {
        if let Some(op) = self.next_op() {
            return Some(NodeViewEffect::Bucket(op));
        }
        match &mut self.phase {
            Phase::Finished(result) => result.take().map(NodeViewEffect::Done),
            _ => None,
        }
    }

    /// Takes the answer to the last operation; `now_ms` is the reader's clock.
    pub fn on_result(&mut self, result: BucketResult, now_ms: u64) {
        if !std::mem::take(&mut self.awaiting) {
            debug_assert!(false, "a result without an operation");
            return;
        }
        let next = match (&mut self.phase, result) {
            (Phase::List { pages, latest }, BucketResult::Keys(keys)) => {
                let page_latest =
                    latest_lease_key(NODES_PREFIX, &self.node, keys.iter().map(String::as_str));
                if page_latest > *latest {
                    *latest = page_latest;
                }
                if !pages.on_page(&keys) {
                    return;
                }
                let behind = self
                    .hold_epoch
                    .is_some_and(|e| latest.as_ref().is_none_or(|l| l.epoch < e));
                if behind && !self.listed_again {
                    self.listed_again = true;
                    *pages = Pages::unshared(
                        LeaseKey::node_folder(NODES_PREFIX, &self.node),
                        self.config.list_page_keys_max,
                    );
                    *latest = None;
                    return;
                }
                match latest.take() {
                    None => Phase::Finished(Some(Ok(NodeLeaseView::Absent))),
                    Some(latest) => Phase::Read { latest },
                }
            }
            (Phase::Read { latest }, BucketResult::Body(body)) => {
                self.read_key = Some(latest.clone());
                let record = decode_body(&body, LeaseRecord::decode);
                if let Some(LeaseRecord::Live {
                    address,
                    expires_at_ms,
                    ..
                }) = &record
                {
                    self.address = Some(address.clone());
                    self.expires_at_ms = Some(*expires_at_ms);
                }
                let view = record
                    .map(|record| node_lease_view(Some((latest, &record)), now_ms, &self.config))
                    .ok_or(Failure::Malformed);
                Phase::Finished(Some(view))
            }
            // An error, or the latest record vanished (its holder deletes
            // records two counters back): nothing can be concluded.
            (Phase::List { .. } | Phase::Read { .. }, _) => {
                Phase::Finished(Some(Err(Failure::Bucket)))
            }
            (Phase::Finished(_), _) => return,
        };
        self.phase = next;
    }

    /// The operation to perform now, for this reader's own driver or for a
    /// machine that embeds it.
    pub(crate) fn next_op(&mut self) -> Option<BucketOp> {
        if self.awaiting {
            return None;
        }
        let op = match &self.phase {
            Phase::List { pages, .. } => pages.op(),
            Phase::Read { latest } => BucketOp::Get {
                key: latest.to_key(NODES_PREFIX),
            },
            Phase::Finished(_) => return None,
        };
        self.awaiting = true;
        Some(op)
    }

    /// The result, once finished (for a machine that embeds the reader).
    pub(crate) fn take_result(&mut self) -> Option<Result<NodeLeaseView, Failure>> {
        match &mut self.phase {
            Phase::Finished(result) => result.take(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::testing::MapBucket;

    fn read(bucket: &mut MapBucket, node: &str, now: u64, config: ClusterConfig) -> NodeViewEffect {
        let mut r = NodeViewReader::new(node, config);
        loop {
            match r.poll_effect().expect("an effect") {
                NodeViewEffect::Bucket(op) => {
                    let res = bucket.perform(op);
                    r.on_result(res, now);
                }
                done => return done,
            }
        }
    }

    fn key(epoch: u64, counter: u64) -> String {
        LeaseKey {
            node: "a".into(),
            epoch,
            counter,
        }
        .to_key(NODES_PREFIX)
    }

    #[test]
    fn reads_the_latest_record_across_pages_and_judges_it() {
        let mut b = MapBucket::default();
        b.put(&key(1, 9), "live 100 0000000000000001 http://n:1");
        b.put(&key(2, 3), "live 100 0000000000000002 http://n:1");
        b.put(&key(2, 4), "live 10000 0000000000000003 http://n:1");
        // Another node's folder shares the prefix's start: never read.
        b.put("nodes/ab/00000000000000000009/00000000000000000000", "junk");
        let c = ClusterConfig {
            list_page_keys_max: 2,
            ..ClusterConfig::default()
        };
        let valid = read(&mut b, "a", 14_999, c.clone());
        assert_eq!(
            valid,
            NodeViewEffect::Done(Ok(NodeLeaseView::Valid { epoch: 2 }))
        );
        let lists = b
            .log
            .iter()
            .filter(|op| matches!(op, BucketOp::List { .. }))
            .count();
        assert_eq!(lists, 2, "{:?}", b.log);
        let mut r = NodeViewReader::new("a", c.clone());
        while let Some(NodeViewEffect::Bucket(op)) = r.poll_effect() {
            let res = b.perform(op);
            r.on_result(res, 14_999);
        }
        assert_eq!(r.address(), Some("http://n:1"), "the live record's address");
        assert_eq!(r.expires_at_ms(), Some(10_000), "the live record's expiry");
        assert_eq!(NodeViewReader::new("z", c.clone()).address(), None);
        let lapsed = read(&mut b, "a", 15_000, c.clone());
        let NodeViewEffect::Done(Ok(NodeLeaseView::Lapsed { latest })) = lapsed else {
            panic!("{lapsed:?}")
        };
        assert_eq!((latest.epoch, latest.counter), (2, 4));
        assert_eq!(
            read(&mut b, "z", 0, c),
            NodeViewEffect::Done(Ok(NodeLeaseView::Absent))
        );
    }

    #[test]
    fn a_bucket_error_or_a_malformed_record_concludes_nothing() {
        let mut r = NodeViewReader::new("a", ClusterConfig::default());
        assert!(matches!(r.poll_effect(), Some(NodeViewEffect::Bucket(_))));
        assert_eq!(r.poll_effect(), None, "one operation at a time");
        r.on_result(BucketResult::Failed, 0);
        assert_eq!(
            r.poll_effect(),
            Some(NodeViewEffect::Done(Err(Failure::Bucket)))
        );
        assert_eq!(r.poll_effect(), None, "done is handed out once");

        let mut b = MapBucket::default();
        b.put(&key(1, 0), "live soon 0000000000000001");
        assert_eq!(
            read(&mut b, "a", 0, ClusterConfig::default()),
            NodeViewEffect::Done(Err(Failure::Malformed))
        );
    }

    /// A reader for a hold of epoch 2 answered with a listing (possibly
    /// another take's, in flight since before epoch 2 registered) that
    /// shows only epoch 1: it lists again, with a listing no driver shares,
    /// and judges what that shows. Trusting the first (the unsafe variant
    /// ADR 0070 rules out) would find epoch 1 lapsed and the hold dead,
    /// with no fence of epoch 2, which is live.
    #[test]
    fn a_listing_behind_the_holds_epoch_is_not_trusted() {
        let mut b = MapBucket::default();
        b.put(&key(1, 3), "live 100 0000000000000001 http://n:1");
        let stale = b.perform(BucketOp::List {
            prefix: "nodes/a/".into(),
            start_after: None,
            limit: 1_000,
        });
        b.put(&key(2, 0), "live 90000 0000000000000002 http://n:1");
        let mut r = NodeViewReader::for_hold("a", 2, ClusterConfig::default());
        let Some(NodeViewEffect::Bucket(first)) = r.poll_effect() else {
            panic!("a listing first")
        };
        assert!(first.is_shared_read(), "{first:?}");
        r.on_result(stale, 1_000);
        let Some(NodeViewEffect::Bucket(again)) = r.poll_effect() else {
            panic!("the stale listing was trusted")
        };
        assert!(
            matches!(&again, BucketOp::List { start_after: Some(a), .. } if a == "nodes/a/"),
            "{again:?}"
        );
        assert!(!again.is_shared_read());
        let res = b.perform(again);
        r.on_result(res, 1_000);
        loop {
            match r.poll_effect().expect("an effect") {
                NodeViewEffect::Bucket(op) => {
                    let res = b.perform(op);
                    r.on_result(res, 1_000);
                }
                done => {
                    assert_eq!(
                        done,
                        NodeViewEffect::Done(Ok(NodeLeaseView::Valid { epoch: 2 }))
                    );
                    break;
                }
            }
        }
        // A reader not for a hold (the admin view) trusts what it lists.
        let mut plain = NodeViewReader::new("a", ClusterConfig::default());
        let Some(NodeViewEffect::Bucket(op)) = plain.poll_effect() else {
            panic!()
        };
        let res = b.perform(op);
        plain.on_result(res, 1_000);
        assert!(matches!(
            plain.poll_effect(),
            Some(NodeViewEffect::Bucket(BucketOp::Get { .. }))
        ));
    }

    #[test]
    fn only_lease_reads_and_first_pages_of_one_nodes_folder_are_shared() {
        let list = |prefix: &str, after: Option<&str>| BucketOp::List {
            prefix: prefix.into(),
            start_after: after.map(Into::into),
            limit: 1_000,
        };
        assert!(list("nodes/a/", None).is_shared_read());
        assert!(!list("nodes/a/", Some("nodes/a/")).is_shared_read());
        assert!(!list("nodes/", None).is_shared_read(), "the live-node view");
        assert!(!list("nodes/a/00000000000000000001/", None).is_shared_read());
        assert!(!list("state/t/a/", None).is_shared_read());
        assert!(BucketOp::Get { key: key(1, 0) }.is_shared_read());
        assert!(
            !BucketOp::Get {
                key: "state/x".into()
            }
            .is_shared_read()
        );
    }
}
