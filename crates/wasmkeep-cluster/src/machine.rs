//! Step machines: the *order* of the ownership protocol's steps, sans-IO.
//!
//! The rules in [`crate::lease`] and [`crate::hold`] each decide one thing
//! (is this lease valid, may this hold be taken, must its node be fenced
//! first). A node also needs the order in which it reads, decides and writes,
//! and what it does when a step fails. That order lives here, once, as small
//! state machines that the server drives with tokio and object_store and the
//! simulator (`wasmkeep-sim`) drives with its simulated bucket, clock and
//! faults: one protocol, two drivers, so the simulation proves the loop the
//! server runs.
//!
//! | machine | what it does |
//! |---|---|
//! | [`NodeLeaseMachine`] | registers and renews this node's lease, learns it was fenced or lapsed, releases it |
//! | [`NodeViewReader`] | reads another node's latest lease record and judges it (valid, lapsed, fenced, ...) |
//! | [`TakeMachine`] | takes an actor: list holds, read the hold and its node's lease, plan, fence, create the hold, restore |
//! | [`ReleaseMachine`] | releases an actor the node holds (idle, handover) |
//! | [`SweepMachine`] | one pass of the alarm sweep: list each index's overdue part, pick this node's share, hand out deliveries a bounded number at a time, defer what failed or ran |
//! | [`IndexUpkeep`], [`UploadRound`] | an actor's alarm index around its uploads: list the entries the carried commits name, upload, remove what they replaced; give the actor up if a listing fails |
//! | [`StaleCleanup`] | a delivery's removal of an actor's stale entries at one time (R2, R3) |
//!
//! # The shape every machine has
//!
//! In the manner of quinn-proto, a machine performs nothing. The driver asks
//! it what to do and tells it what happened:
//!
//! - `poll_effect(..) -> Option<Effect>`: the next effect. An effect is
//!   either a bucket operation ([`BucketOp`]) to perform, or a notice the
//!   driver acts on (a lease lost, an actor to restore, the machine's
//!   outcome, a fence written). `None` means the machine waits: for the
//!   result of the operation it handed out, or (the node lease only) for its
//!   timeout. Its arguments are what the machine must know at that moment:
//!   the node's clock for the node lease, `acting_epoch` for the machines
//!   that write as an owner. Drivers call it until it returns `None`.
//! - `on_result(result, now_ms)`: the answer to the last bucket operation, as
//!   a [`BucketResult`], with the node's clock when it arrived (the release
//!   machine judges nothing by the clock and takes no `now_ms`). Every machine
//!   has at most one operation outstanding, so results need no ids; the node
//!   lease's [`LeaseEffect::Detached`] deletes want no answer at all.
//! - `poll_timeout() -> Option<u64>` and `handle_timeout(now_ms, nonce)`: only
//!   for [`NodeLeaseMachine`], the one machine that waits on the clock.
//!
//! Time is passed in (`now_ms`, the node's own clock), and so is everything
//! random: a machine that writes a record is given the record's nonce. Where a
//! step must only happen while the node's lease lets it act, the driver passes
//! `acting_epoch` ([`NodeLeaseMachine::acting_epoch`]) and the machine checks it
//! right before the write. A driver looks like this (here over a map; the
//! server's awaits object_store, the simulator's its simulated bucket):
//!
//! ```
//! use std::collections::BTreeMap;
//! use wasmkeep_cluster::ClusterConfig;
//! use wasmkeep_cluster::machine::{
//!     BucketOp, BucketResult, TakeEffect, TakeMachine, TakeOutcome,
//! };
//!
//! fn perform(bucket: &mut BTreeMap<String, Vec<u8>>, op: BucketOp) -> BucketResult {
//!     match op {
//!         BucketOp::PutCreate { key, body } => {
//!             if bucket.contains_key(&key) {
//!                 return BucketResult::AlreadyExists;
//!             }
//!             bucket.insert(key, body);
//!             BucketResult::Done
//!         }
//!         BucketOp::Get { key } => bucket
//!             .get(&key)
//!             .map_or(BucketResult::NotFound, |b| BucketResult::Body(b.clone())),
//!         BucketOp::List { prefix, start_after, limit } => BucketResult::Keys(
//!             bucket
//!                 .keys()
//!                 .filter(|k| k.starts_with(&prefix))
//!                 .filter(|k| start_after.as_ref().is_none_or(|a| *k > a))
//!                 .take(limit)
//!                 .cloned()
//!                 .collect(),
//!         ),
//!         BucketOp::Delete { key } => {
//!             bucket.remove(&key);
//!             BucketResult::Done
//!         }
//!     }
//! }
//!
//! let mut bucket = BTreeMap::new();
//! let (now_ms, my_epoch, nonce) = (1_000, 1, 42);
//! let mut take = TakeMachine::new(
//!     "node-a", my_epoch, "state/t/app/room/6131/", None, nonce, ClusterConfig::default(),
//! );
//! let outcome = loop {
//!     // A real driver asks its NodeLeaseMachine for `acting_epoch` here.
//!     match take.poll_effect(Some(my_epoch)).expect("one effect at a time") {
//!         TakeEffect::Bucket(op) => {
//!             let result = perform(&mut bucket, op);
//!             take.on_result(result, now_ms);
//!         }
//!         TakeEffect::Fenced { .. } => {} // count it, log it
//!         TakeEffect::Restore { .. } => take.on_restored(true), // the replica restores
//!         TakeEffect::Done(outcome) => break outcome,
//!     }
//! };
//! assert_eq!(outcome, TakeOutcome::Taken { generation: 1 });
//! assert!(bucket.contains_key("state/t/app/room/6131/hold/00000000000000000001"));
//! ```
//!
//! The machines are the only public way to run these steps: the rules they
//! call (`plan_take`, `lease_view`, `fence_write`, the holder's `NodeLease`)
//! are private to this crate, so no driver can run its own copy of the order.
//!
//! ```compile_fail,E0603
//! // The take plan is reached only through `TakeMachine`.
//! use wasmkeep_cluster::hold::plan_take;
//! ```
//!
//! ```compile_fail,E0603
//! // The holder's lease state is reached only through `NodeLeaseMachine`.
//! use wasmkeep_cluster::lease::NodeLease;
//! ```
//!
//! ```compile_fail,E0603
//! // The sweep's pick is reached only through `SweepMachine`.
//! use wasmkeep_cluster::sweep::plan_sweep;
//! ```
//!
//! ```compile_fail,E0603
//! // So is its cursor: no driver pages an index its own way.
//! use wasmkeep_cluster::sweep::SweepCursor;
//! ```
//!
//! What stays with each driver: what a delivery decides for its actor
//! (`plan_delivery`, `next_stale_step` in [`crate::delivery`] and
//! [`crate::alarm_index`], pure rules both drivers call), and the
//! tenant-wide index's cleanup across apps, which only the server has.

mod known_leases;
mod live_nodes;
mod node_lease;
mod node_view;
mod release;
mod sweep;
mod take;
mod upkeep;

pub use known_leases::{KNOWN_LEASES_MAX, KnownLeases};
pub use live_nodes::{LIVE_NODES_MAX, LiveNodes, LiveNodesEffect, OLD_RECORDS_DELETED_MAX};
pub use node_lease::{EpochEnd, LeaseEffect, NodeLeaseMachine};
pub use node_view::{NodeViewEffect, NodeViewReader};
pub use release::{ReleaseEffect, ReleaseMachine, ReleaseOutcome};
pub use sweep::{
    AFTER_RUN_MS, DeliveryReport, PassSummary, Reached, SWEEP_DEFERRED_MAX,
    SWEEP_DELIVERIES_CONCURRENT, SweepEffect, SweepJob, SweepMachine,
};
pub use take::{TakeEffect, TakeMachine, TakeOutcome, TakeStep};
pub use upkeep::{
    CleanupEffect, CleanupOutcome, GiveUp, IndexUpkeep, Listing, Planned,
    STALE_DELETES_PER_DELIVERY, STALE_LISTING_KEYS_MAX, StaleCleanup, UpkeepEffect, UploadRound,
};

/// One operation on the bucket, as a machine asks for it. ADR 0020 needs only
/// create-only writes; an overwriting or `If-Match` PUT joins this list when a
/// machine needs one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BucketOp {
    /// Create `key` only if no object has it (S3 `If-None-Match: *`,
    /// object_store's `PutMode::Create`).
    PutCreate { key: String, body: Vec<u8> },
    /// Read `key`.
    Get { key: String },
    /// Keys that start with `prefix`, in key order, after `start_after`, at
    /// most `limit` of them (one page).
    List {
        prefix: String,
        start_after: Option<String>,
        limit: usize,
    },
    /// Delete `key`, without any precondition (a missing key is no error).
    Delete { key: String },
}

impl BucketOp {
    /// The key (or listing prefix) the operation is about, for logs.
    pub fn key(&self) -> &str {
        match self {
            BucketOp::PutCreate { key, .. } | BucketOp::Get { key } | BucketOp::Delete { key } => {
                key
            }
            BucketOp::List { prefix, .. } => prefix,
        }
    }

    /// Whether the operation changes the bucket.
    pub fn is_write(&self) -> bool {
        matches!(self, BucketOp::PutCreate { .. } | BucketOp::Delete { .. })
    }

    /// Whether a driver may answer it with the answer to the same
    /// operation already in flight on this node (ADR 0065, ADR 0070):
    /// - a read of one lease record (a GET under `nodes/`): a record never
    ///   changes once written;
    /// - the first page of a listing of one node's lease records
    ///   (`nodes/<id>/`, no `start_after`): one already in flight may have
    ///   started before a record the asker must see was written, so its
    ///   asker ([`NodeViewReader::for_hold`]) uses it only if it shows the
    ///   epoch it needs, and otherwise lists again with
    ///   [`Pages::unshared`], which is never shared.
    pub fn is_shared_read(&self) -> bool {
        use crate::lease::NODES_PREFIX;
        match self {
            BucketOp::Get { key } => key.starts_with(NODES_PREFIX),
            BucketOp::List {
                prefix,
                start_after: None,
                ..
            } => prefix
                .strip_prefix(NODES_PREFIX)
                .and_then(|node| node.strip_suffix('/'))
                .is_some_and(|node| !node.is_empty() && !node.contains('/')),
            _ => false,
        }
    }
}

/// What the bucket answered to a [`BucketOp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BucketResult {
    /// A PUT or DELETE took effect.
    Done,
    /// A GET's body.
    Body(Vec<u8>),
    /// A listing's page: full keys, in key order.
    Keys(Vec<String>),
    /// A create-only PUT found the key taken (S3 412, `AlreadyExists`). A
    /// create retried by the client after a lost response can answer this for
    /// its own write; the machines read such a key back before they conclude.
    AlreadyExists,
    /// A GET found no object.
    NotFound,
    /// Anything else: an error, a timeout, no route to the bucket. The
    /// operation may or may not have taken effect.
    Failed,
}

/// Why a machine stopped short of its goal. None of these is a bug: each is
/// something the world does, and the caller's answer is to give the attempt
/// up (and perhaps try again later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The node's lease does not let it act (lapsed, fenced, released, or a
    /// newer epoch started).
    NotActing,
    /// A bucket operation failed or timed out, or an object vanished between
    /// a listing and a read.
    Bucket,
    /// A record in the bucket does not parse; it is never acted on.
    Malformed,
    /// Another node created the record first.
    LostRace,
    /// The node to be fenced renewed its lease first: it is alive, so its
    /// actors stay its own.
    HolderAlive,
    /// The driver could not restore the actor after taking it.
    Restore,
}

/// A create-only write that tells its own object from someone else's: when
/// the key is taken, it reads it back and compares the bytes (protocol.md: a
/// create retried after a lost response answers "already exists" for its own
/// write; every body carries a nonce, so equal bytes mean this attempt).
#[derive(Clone, Debug)]
pub(crate) struct CreateOnce {
    key: String,
    body: Vec<u8>,
    reading_back: bool,
}

/// How a [`CreateOnce`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Created {
    /// The object holds this write's bytes.
    Mine,
    /// The key holds another writer's object: these bytes.
    Theirs(Vec<u8>),
    /// The bucket failed; the write may or may not have landed.
    Failed,
}

impl CreateOnce {
    pub(crate) fn new(key: String, body: Vec<u8>) -> CreateOnce {
        CreateOnce {
            key,
            body,
            reading_back: false,
        }
    }

    /// The operation to perform now: the create, or the read-back after it.
    pub(crate) fn op(&self) -> BucketOp {
        if self.reading_back {
            BucketOp::Get {
                key: self.key.clone(),
            }
        } else {
            BucketOp::PutCreate {
                key: self.key.clone(),
                body: self.body.clone(),
            }
        }
    }

    /// Takes the answer to [`CreateOnce::op`]; `None` means one more
    /// operation (the read-back) is needed.
    pub(crate) fn on_result(&mut self, result: BucketResult) -> Option<Created> {
        if self.reading_back {
            return Some(match result {
                BucketResult::Body(b) if b == self.body => Created::Mine,
                BucketResult::Body(b) => Created::Theirs(b),
                // Taken, then gone: nothing can be concluded.
                _ => Created::Failed,
            });
        }
        match result {
            BucketResult::Done => Some(Created::Mine),
            BucketResult::AlreadyExists => {
                self.reading_back = true;
                None
            }
            _ => Some(Created::Failed),
        }
    }
}

/// A folder read page by page (never a whole listing in memory): the machine
/// folds each page into what it keeps, here the latest key.
#[derive(Clone, Debug)]
pub(crate) struct Pages {
    prefix: String,
    after: Option<String>,
    limit: usize,
}

impl Pages {
    pub(crate) fn new(prefix: String, limit: usize) -> Pages {
        Pages {
            prefix,
            after: None,
            limit: limit.max(1),
        }
    }

    /// Like [`Pages::new`], for a listing no driver answers with another
    /// already in flight ([`BucketOp::is_shared_read`]): its first page
    /// starts after the prefix itself, which every key below it follows, so
    /// it lists the same keys.
    pub(crate) fn unshared(prefix: String, limit: usize) -> Pages {
        Pages {
            after: Some(prefix.clone()),
            ..Pages::new(prefix, limit)
        }
    }

    /// The listing request for the next page.
    pub(crate) fn op(&self) -> BucketOp {
        BucketOp::List {
            prefix: self.prefix.clone(),
            start_after: self.after.clone(),
            limit: self.limit,
        }
    }

    /// Takes a page; true when the listing is complete. A store that answers
    /// with keys that do not move forward ends the listing rather than loop.
    pub(crate) fn on_page(&mut self, keys: &[String]) -> bool {
        let Some(last) = keys.last() else {
            return true;
        };
        if keys.len() < self.limit || self.after.as_ref().is_some_and(|a| last <= a) {
            return true;
        }
        self.after = Some(last.clone());
        false
    }
}

/// Parses a record body: UTF-8, then the record's own decoder.
pub(crate) fn decode_body<T>(
    body: &[u8],
    decode: impl FnOnce(&str) -> Result<T, crate::Error>,
) -> Option<T> {
    std::str::from_utf8(body).ok().and_then(|s| decode(s).ok())
}

#[cfg(test)]
pub(crate) mod testing {
    //! A bucket for the machines' unit tests: a map, with hooks to make one
    //! operation fail or to change the bucket just before an operation lands.

    use std::collections::BTreeMap;

    use super::{BucketOp, BucketResult};

    #[derive(Default)]
    pub(crate) struct MapBucket {
        pub(crate) objects: BTreeMap<String, Vec<u8>>,
        /// Operations performed, in order.
        pub(crate) log: Vec<BucketOp>,
    }

    impl MapBucket {
        pub(crate) fn put(&mut self, key: &str, body: &str) {
            self.objects
                .insert(key.to_owned(), body.as_bytes().to_vec());
        }

        pub(crate) fn body(&self, key: &str) -> Option<String> {
            self.objects
                .get(key)
                .map(|b| String::from_utf8(b.clone()).unwrap())
        }

        pub(crate) fn perform(&mut self, op: BucketOp) -> BucketResult {
            self.log.push(op.clone());
            match op {
                BucketOp::PutCreate { key, body } => {
                    if self.objects.contains_key(&key) {
                        return BucketResult::AlreadyExists;
                    }
                    self.objects.insert(key, body);
                    BucketResult::Done
                }
                BucketOp::Get { key } => self
                    .objects
                    .get(&key)
                    .map_or(BucketResult::NotFound, |b| BucketResult::Body(b.clone())),
                BucketOp::List {
                    prefix,
                    start_after,
                    limit,
                } => BucketResult::Keys(
                    self.objects
                        .keys()
                        .filter(|k| k.starts_with(&prefix))
                        .filter(|k| start_after.as_ref().is_none_or(|a| *k > a))
                        .take(limit)
                        .cloned()
                        .collect(),
                ),
                BucketOp::Delete { key } => {
                    self.objects.remove(&key);
                    BucketResult::Done
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_once_tells_its_own_object_from_another() {
        let mut c = CreateOnce::new("k".into(), b"mine".to_vec());
        assert_eq!(c.on_result(BucketResult::Done), Some(Created::Mine));

        let mut c = CreateOnce::new("k".into(), b"mine".to_vec());
        assert_eq!(c.on_result(BucketResult::AlreadyExists), None);
        assert_eq!(c.op(), BucketOp::Get { key: "k".into() });
        assert_eq!(
            c.on_result(BucketResult::Body(b"mine".to_vec())),
            Some(Created::Mine)
        );

        let mut c = CreateOnce::new("k".into(), b"mine".to_vec());
        c.on_result(BucketResult::AlreadyExists);
        assert_eq!(
            c.on_result(BucketResult::Body(b"theirs".to_vec())),
            Some(Created::Theirs(b"theirs".to_vec()))
        );

        let mut c = CreateOnce::new("k".into(), b"mine".to_vec());
        assert_eq!(c.on_result(BucketResult::Failed), Some(Created::Failed));
    }

    #[test]
    fn pages_continue_after_a_full_page_and_stop_on_a_short_or_stuck_one() {
        let mut p = Pages::new("f/".into(), 2);
        let page = |ks: &[&str]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        assert!(!p.on_page(&page(&["f/1", "f/2"])));
        assert_eq!(
            p.op(),
            BucketOp::List {
                prefix: "f/".into(),
                start_after: Some("f/2".into()),
                limit: 2
            }
        );
        assert!(p.on_page(&page(&["f/3"])));
        let mut p = Pages::new("f/".into(), 2);
        assert!(!p.on_page(&page(&["f/1", "f/2"])));
        // A store that repeats itself ends the listing.
        assert!(p.on_page(&page(&["f/1", "f/2"])));
        assert!(Pages::new("f/".into(), 2).on_page(&[]));
    }
}
