//! The live nodes for the sweep's sharding, at a cost that does not grow
//! with the cluster (issue 41): one listing of `nodes/` per pass, and a
//! record read only for a node whose newest record stopped changing.
//!
//! Reading every node's latest record on every sweep (a LIST and a GET per
//! node, what [`super::NodeViewReader`] does for one node) costs each node
//! about `2 × nodes` requests per sweep: at 100 nodes that is 20 requests a
//! second per node for the view alone. But a live node writes a new record
//! every third of its lease period (`lease_renew_ms`), so its newest key
//! changes between two sweeps; only a node whose key did not change may have
//! stopped. [`LiveNodes`] therefore keeps, per node, the newest key it listed
//! and the record read for that key, if any:
//!
//! - a key first listed less than two renewal intervals ago
//!   ([`LiveNodes::unchanged_read_after_ms`]): the node wrote a record
//!   lately (or this node just started); it counts as live without a read;
//! - a key listed unchanged for longer, not read yet: a live node would
//!   have written a newer one, so its record is read and judged as
//!   [`super::NodeViewReader`] judges it;
//! - a key already read: the kept record is judged again by this node's
//!   clock (a live record lapses at its expiry plus grace); nothing is read.
//!
//! A live cluster thus costs one listing page per 1,000 records per pass;
//! a stopped node costs one read of its last record, and a node that starts
//! reads no live node's record (at 100 nodes, a start that read them all
//! was most of what the view cost, with nodes restarting every few minutes
//! as the simulator's faults have them). The view only shards
//! the sweep (which node delivers an overdue entry): a delivery still takes
//! its actor through [`super::TakeMachine`], which reads the holder's record
//! itself, so a view that is late costs latency, never safety. It can be
//! late once: a node whose new record is a release or a fence counts as
//! live for two renewal intervals more, until that record, unchanged, is
//! read; so does a dead node's last record when this node has just started.
//! Passes may follow each other closely (a sweep whose cap bound passes
//! again at once): a pass within a renewal interval of the last listing
//! answers from it without a request, and keys are judged by the time they
//! were first listed, not by the number of passes.
//!
//! The listing also shows this node's own records of earlier epochs, which
//! nothing reads once a newer epoch of the node is registered (a hold of an
//! earlier epoch is dead whatever its records say, ADR 0020): a pass hands
//! them out for deletion ([`LiveNodesEffect::Detached`]), at most
//! [`OLD_RECORDS_DELETED_MAX`] a pass, so that `nodes/` keeps a few records
//! per node however often nodes restart, and its listing one page per 1,000
//! of them (a crashed epoch's last records were never deleted before).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::ClusterConfig;
use crate::lease::{LeaseKey, LeaseRecord, NODES_PREFIX, node_lease_view};

use super::{BucketOp, BucketResult, KnownLeases, Pages, decode_body};

/// Most node ids one pass keeps: the listing stops at the first id past
/// them (their nodes are not counted live), so that a `nodes/` folder full
/// of records of nodes long gone costs a bounded number of pages.
pub const LIVE_NODES_MAX: usize = 1_000;

/// This node's records of earlier epochs one pass deletes at most.
pub const OLD_RECORDS_DELETED_MAX: usize = 64;

/// What [`LiveNodes::poll_effect`] asks of its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LiveNodesEffect {
    /// Perform this operation and pass its answer to [`LiveNodes::on_result`].
    Bucket(BucketOp),
    /// Perform this operation whenever convenient and report nothing: one of
    /// this node's lease records of an earlier epoch, garbage now.
    Detached(BucketOp),
    /// The pass is over: the live node ids in order, or `None` when the
    /// listing failed (no view this pass). Emitted once per pass.
    Done(Option<Vec<String>>),
}

/// What this node knows of another one.
#[derive(Clone, Debug)]
struct Known {
    /// Its newest record key at the last pass.
    key: LeaseKey,
    /// That record, once read (a record never changes once written).
    record: Option<LeaseRecord>,
    /// When this node first listed the key (its clock).
    listed_at_ms: u64,
}

#[derive(Clone, Debug)]
enum Phase {
    Idle,
    /// Listing `nodes/`, keeping each node's newest key.
    List {
        pages: Pages,
        newest: BTreeMap<String, LeaseKey>,
    },
    /// Reading the records of the nodes in `to_read`, one at a time.
    Read {
        to_read: Vec<String>,
    },
    /// The pass ended; its result until it is handed out.
    Finished(Option<Option<Vec<String>>>),
}

/// The live nodes, pass after pass (one per sweep), with what earlier passes
/// read kept between them.
#[derive(Clone, Debug)]
pub struct LiveNodes {
    me: String,
    config: ClusterConfig,
    known: BTreeMap<String, Known>,
    phase: Phase,
    awaiting: bool,
    now_ms: u64,
    reads: u64,
    /// When the last pass that listed ended, and what it found live.
    listed: Option<(u64, Vec<String>)>,
    /// This node's records listed in the pass, and those of earlier epochs
    /// left to delete.
    mine: Vec<LeaseKey>,
    garbage: Vec<LeaseKey>,
    /// The takes' kept records, told which epochs each listing shows over.
    takes_known: Option<Arc<KnownLeases>>,
}

impl LiveNodes {
    /// Knows no node yet; `me` is this node's id.
    pub fn new(me: &str, config: ClusterConfig) -> LiveNodes {
        LiveNodes {
            me: me.to_owned(),
            config,
            known: BTreeMap::new(),
            phase: Phase::Idle,
            awaiting: false,
            now_ms: 0,
            reads: 0,
            listed: None,
            mine: Vec::new(),
            garbage: Vec::new(),
            takes_known: None,
        }
    }

    /// Tells the node's takes ([`KnownLeases`]) what each listing shows for
    /// free: a node's newest epoch listed means its earlier epochs are over,
    /// so a take of an actor held in one of them reads no lease.
    pub fn with_known_leases(mut self, known: Arc<KnownLeases>) -> LiveNodes {
        self.takes_known = Some(known);
        self
    }

    /// Starts a pass at `now_ms` (this node's clock); a pass in progress is
    /// dropped.
    pub fn start_pass(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        self.awaiting = false;
        if let Some((at, live)) = &self.listed
            && now_ms >= *at
            && now_ms < at + self.config.lease_renew_ms()
        {
            self.phase = Phase::Finished(Some(Some(live.clone())));
            return;
        }
        self.mine.clear();
        self.phase = Phase::List {
            pages: Pages::new(NODES_PREFIX.to_owned(), self.config.list_page_keys_max),
            newest: BTreeMap::new(),
        };
    }

    /// Records read over every pass (for tests and counters).
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// The next effect, or `None` while an operation is outstanding (or when
    /// no pass runs).
    pub fn poll_effect(&mut self) -> Option<LiveNodesEffect> {
        if self.awaiting {
            return None;
        }
        if let Some(old) = self.garbage.pop() {
            return Some(LiveNodesEffect::Detached(BucketOp::Delete {
                key: old.to_key(NODES_PREFIX),
            }));
        }
        let op = match &mut self.phase {
            Phase::Idle => return None,
            Phase::List { pages, .. } => pages.op(),
            Phase::Read { to_read } => {
                let node = to_read.last()?;
                let key = self.known.get(node)?.key.to_key(NODES_PREFIX);
                BucketOp::Get { key }
            }
            Phase::Finished(result) => {
                let done = result.take()?;
                self.phase = Phase::Idle;
                return Some(LiveNodesEffect::Done(done));
            }
        };
        self.awaiting = true;
        Some(LiveNodesEffect::Bucket(op))
    }

    /// Takes the answer to the last operation.
    pub fn on_result(&mut self, result: BucketResult) {
        if !std::mem::take(&mut self.awaiting) {
            debug_assert!(false, "a result without an operation");
            return;
        }
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::List {
                mut pages,
                mut newest,
            } => {
                let BucketResult::Keys(keys) = result else {
                    self.phase = Phase::Finished(Some(None));
                    return;
                };
                let mut full = false;
                for key in &keys {
                    // Keys that are not lease records are passed over.
                    let Ok(k) = LeaseKey::parse(NODES_PREFIX, key) else {
                        continue;
                    };
                    if !newest.contains_key(&k.node) && newest.len() == LIVE_NODES_MAX {
                        full = true;
                        break;
                    }
                    if k.node == self.me && self.mine.len() < 4 * OLD_RECORDS_DELETED_MAX {
                        self.mine.push(k.clone());
                    }
                    let slot = newest.entry(k.node.clone()).or_insert_with(|| k.clone());
                    if k > *slot {
                        *slot = k;
                    }
                }
                self.phase = if full || pages.on_page(&keys) {
                    self.after_listing(newest)
                } else {
                    Phase::List { pages, newest }
                };
            }
            Phase::Read { mut to_read } => {
                let node = to_read.pop().unwrap_or_default();
                self.reads += 1;
                let now = self.now_ms;
                if let Some(k) = self.known.get_mut(&node) {
                    match result {
                        BucketResult::Body(body) => {
                            k.record = decode_body(&body, LeaseRecord::decode);
                        }
                        // Deleted by its writer two renewals on: the node is
                        // alive, judged by its new key next pass.
                        BucketResult::NotFound => k.listed_at_ms = now,
                        // Not read: not live this pass (as in the admin
                        // view), read again next pass.
                        _ => k.listed_at_ms = 0,
                    }
                }
                self.phase = if to_read.is_empty() {
                    self.finish()
                } else {
                    Phase::Read { to_read }
                };
            }
            other => {
                debug_assert!(false, "a result in {other:?}");
                self.phase = other;
            }
        }
    }

    /// Compares the listing with what earlier passes knew, and plans the
    /// reads.
    fn after_listing(&mut self, newest: BTreeMap<String, LeaseKey>) -> Phase {
        if let Some(current) = newest.get(&self.me).map(|k| k.epoch) {
            let old = self.mine.drain(..).filter(|k| k.epoch < current);
            self.garbage = old.take(OLD_RECORDS_DELETED_MAX).collect();
        }
        let mut known = BTreeMap::new();
        let mut to_read = Vec::new();
        let stale_after = self.unchanged_read_after_ms();
        if let Some(takes) = &self.takes_known {
            for (node, key) in newest.iter().filter(|(n, _)| **n != self.me) {
                takes.learn_over_below(node, key.epoch);
            }
        }
        for (node, key) in newest {
            let entry = match self.known.remove(&node) {
                Some(k) if k.key == key => k,
                _ => Known {
                    key,
                    record: None,
                    listed_at_ms: self.now_ms,
                },
            };
            if entry.record.is_none() && self.now_ms >= entry.listed_at_ms + stale_after {
                to_read.push(node.clone());
            }
            known.insert(node, entry);
        }
        self.known = known;
        if to_read.is_empty() {
            self.finish()
        } else {
            Phase::Read { to_read }
        }
    }

    /// Ends a pass that listed: its live nodes, kept for passes soon after.
    fn finish(&mut self) -> Phase {
        let live = self.live();
        self.listed = Some((self.now_ms, live.clone()));
        Phase::Finished(Some(Some(live)))
    }

    /// How long a node's newest key may stay the same before its record is
    /// read: two renewal intervals (a live node writes a record every
    /// `lease_renew_ms`; one renewal may fail and be retried).
    pub(crate) fn unchanged_read_after_ms(&self) -> u64 {
        2 * self.config.lease_renew_ms()
    }

    /// The live node ids, in order, as of the pass's time.
    fn live(&self) -> Vec<String> {
        let stale_after = self.unchanged_read_after_ms();
        self.known
            .iter()
            .filter(|(_, k)| match &k.record {
                Some(record) => {
                    node_lease_view(Some((&k.key, record)), self.now_ms, &self.config).is_live()
                }
                None => self.now_ms < k.listed_at_ms + stale_after,
            })
            .map(|(node, _)| node.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::testing::MapBucket;

    fn record(bucket: &mut MapBucket, node: &str, epoch: u64, counter: u64, r: &LeaseRecord) {
        let key = LeaseKey {
            node: node.into(),
            epoch,
            counter,
        };
        bucket.put(&key.to_key(NODES_PREFIX), &r.encode());
    }

    fn live(expires_at_ms: u64) -> LeaseRecord {
        LeaseRecord::Live {
            expires_at_ms,
            nonce: 1,
            address: "http://x:1".into(),
        }
    }

    /// One pass against `bucket`; the live nodes and the requests it made.
    fn pass(v: &mut LiveNodes, bucket: &mut MapBucket, now: u64) -> (Vec<String>, usize) {
        v.start_pass(now);
        let mut requests = 0;
        loop {
            match v.poll_effect().expect("an effect") {
                LiveNodesEffect::Bucket(op) => {
                    requests += 1;
                    let r = bucket.perform(op);
                    v.on_result(r);
                }
                LiveNodesEffect::Detached(op) => {
                    requests += 1;
                    bucket.perform(op);
                }
                LiveNodesEffect::Done(live) => return (live.expect("listed"), requests),
            }
        }
    }

    #[test]
    fn live_nodes_are_read_once_and_then_known_by_their_new_keys() {
        let c = ClusterConfig::default();
        let mut b = MapBucket::default();
        for n in ["a", "b", "c"] {
            record(&mut b, n, 1, 0, &live(10_000));
        }
        let mut v = LiveNodes::new("me", c);
        // First pass: one listing; every key is new.
        assert_eq!(
            pass(&mut v, &mut b, 1_000),
            (vec!["a".into(), "b".into(), "c".into()], 1)
        );
        // Every node renews: one listing, no read.
        for n in ["a", "b", "c"] {
            record(&mut b, n, 1, 1, &live(20_000));
        }
        assert_eq!(pass(&mut v, &mut b, 11_000).1, 1);
        // `c` stops renewing: its record is read once, then judged by the
        // clock: live until its expiry plus grace, then not.
        for n in ["a", "b"] {
            record(&mut b, n, 1, 2, &live(30_000));
        }
        let (l, r) = pass(&mut v, &mut b, 21_000);
        assert_eq!((l.len(), r), (3, 2));
        for n in ["a", "b"] {
            record(&mut b, n, 1, 3, &live(40_000));
        }
        let (l, r) = pass(&mut v, &mut b, 31_000);
        assert_eq!((l, r), (vec!["a".to_string(), "b".to_string()], 1));
        assert_eq!(v.reads(), 1);
    }

    /// A listing tells the takes which epochs are over for free: those
    /// below each node's newest, never the newest, never this node's own.
    #[test]
    fn a_listing_tells_the_takes_which_epochs_are_over() {
        let mut b = MapBucket::default();
        record(&mut b, "a", 2, 0, &live(10_000));
        record(&mut b, "a", 3, 0, &live(10_000));
        record(&mut b, "me", 5, 0, &live(10_000));
        let known = Arc::new(KnownLeases::new());
        let mut v =
            LiveNodes::new("me", ClusterConfig::default()).with_known_leases(Arc::clone(&known));
        pass(&mut v, &mut b, 1_000);
        assert!(known.is_over("a", 2));
        assert!(!known.is_over("a", 3), "the newest epoch may be live");
        assert!(
            !known.is_over("me", 4),
            "a node's own holds are always read"
        );
    }

    #[test]
    fn a_released_node_is_dropped_once_its_last_record_is_read() {
        let c = ClusterConfig::default();
        let mut b = MapBucket::default();
        record(&mut b, "a", 1, 0, &live(10_000));
        let mut v = LiveNodes::new("me", c.clone());
        assert_eq!(pass(&mut v, &mut b, 1_000).0, vec!["a".to_string()]);
        record(&mut b, "a", 1, 1, &LeaseRecord::Released { nonce: 2 });
        // New key: live, unread, for two renewal intervals ...
        assert_eq!(pass(&mut v, &mut b, 5_000).0, vec!["a".to_string()]);
        assert_eq!(pass(&mut v, &mut b, 10_000), (vec!["a".to_string()], 1));
        // ... then read, and not live.
        assert_eq!(pass(&mut v, &mut b, 14_000), (vec![], 2));
        // A node that starts counts it live as long, then reads it.
        let mut started = LiveNodes::new("me", c);
        assert_eq!(
            pass(&mut started, &mut b, 15_000),
            (vec!["a".to_string()], 1)
        );
        assert_eq!(pass(&mut started, &mut b, 22_000), (vec![], 2));
    }

    #[test]
    fn passes_in_quick_succession_read_nothing() {
        let mut b = MapBucket::default();
        for n in ["a", "b"] {
            record(&mut b, n, 1, 0, &live(10_000));
        }
        let mut v = LiveNodes::new("me", ClusterConfig::default());
        assert_eq!(
            pass(&mut v, &mut b, 1_000),
            (vec!["a".into(), "b".into()], 1)
        );
        // Within a renewal interval: the last listing's answer, no request.
        for t in 1..100 {
            assert_eq!(
                pass(&mut v, &mut b, 1_000 + t * 30),
                (vec!["a".into(), "b".into()], 0)
            );
        }
        // Then one listing, and no read (the keys are not two renewal
        // intervals old).
        assert_eq!(
            pass(&mut v, &mut b, 4_400),
            (vec!["a".into(), "b".into()], 1)
        );
        assert_eq!(v.reads(), 0);
    }

    #[test]
    fn this_nodes_records_of_earlier_epochs_are_deleted() {
        let c = ClusterConfig::default();
        let mut b = MapBucket::default();
        // Two crashed epochs' last records, a fence, and the current one.
        record(&mut b, "me", 1, 7, &live(1_000));
        record(&mut b, "me", 1, 8, &live(2_000));
        record(
            &mut b,
            "me",
            2,
            3,
            &LeaseRecord::Fenced {
                by: "b".into(),
                nonce: 1,
            },
        );
        record(&mut b, "me", 3, 0, &live(20_000));
        record(&mut b, "b", 1, 5, &live(20_000));
        record(&mut b, "b", 2, 0, &live(20_000));
        let mut v = LiveNodes::new("me", c);
        let (live, requests) = pass(&mut v, &mut b, 10_000);
        assert_eq!((live.len(), requests), (2, 4));
        let left: Vec<&String> = b.objects.keys().collect();
        assert_eq!(
            left,
            [
                &LeaseKey {
                    node: "b".into(),
                    epoch: 1,
                    counter: 5
                }
                .to_key(NODES_PREFIX),
                &LeaseKey {
                    node: "b".into(),
                    epoch: 2,
                    counter: 0
                }
                .to_key(NODES_PREFIX),
                &LeaseKey {
                    node: "me".into(),
                    epoch: 3,
                    counter: 0
                }
                .to_key(NODES_PREFIX),
            ],
            "only this node's earlier epochs go"
        );
    }

    #[test]
    fn a_failed_listing_gives_no_view() {
        let mut v = LiveNodes::new("me", ClusterConfig::default());
        v.start_pass(0);
        assert!(matches!(v.poll_effect(), Some(LiveNodesEffect::Bucket(_))));
        v.on_result(BucketResult::Failed);
        assert_eq!(v.poll_effect(), Some(LiveNodesEffect::Done(None)));
        assert_eq!(v.poll_effect(), None);
    }
}
