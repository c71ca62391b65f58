//! Other nodes' live lease records, read recently, shared by a node's takes
//! (issue 41's cheap owner lookups).
//!
//! A take whose actor is held reads the holder's lease (a listing of its
//! folder and a read of the latest record) to tell a live owner from a dead
//! one. Every take of an actor another node holds pays those two requests,
//! and they all go to `nodes/`: measured in the simulator at 100 nodes, the
//! takes after a wave of faults read `nodes/` about 20,000 times in one
//! second. A live record names its expiry, so a node that read one knows
//! the answer a new read would give until that expiry plus grace, as long
//! as no newer record replaced it; [`KnownLeases`] keeps such records, and
//! a take whose holder's hold is of the epoch a kept record shows valid
//! forwards to that owner without reading anything.
//!
//! Of a live record, only the decision to forward is taken from memory:
//! forwarding writes nothing, so a record that is stale (the holder was
//! fenced or released since: both need a newer record, which only a read
//! shows) costs a forward that fails, never a second owner. An epoch known
//! over does lead to a take without a read, which is safe because it is a
//! fact no later record can undo (see below). The driver forgets a node
//! whose forward failed ([`KnownLeases::forget`]), so the next take reads
//! its lease. A lapsed record and this node's own holds are always read.
//!
//! It also keeps which epochs of a node a read showed over for good: every
//! epoch below the newest one registered (the node started again), and an
//! epoch fenced or released. An epoch never comes back, so a hold of such
//! an epoch is dead whenever it is met again, and a take of it needs no
//! read: after a wave of restarts, a node took many actors of the same few
//! dead epochs, and read the same records for each of them (the busiest
//! second of `nodes/` at 100 nodes).

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::config::ClusterConfig;
use crate::lease::{LeaseKey, NodeLeaseView};

/// Most nodes whose records are kept; past it, expired ones go first and a
/// new one is not kept if none has.
pub const KNOWN_LEASES_MAX: usize = 1_000;

#[derive(Clone, Debug)]
struct Known {
    epoch: u64,
    counter: u64,
    expires_at_ms: u64,
    address: String,
}

/// Live lease records by node, shared by the takes of one node, and the
/// epochs known over.
#[derive(Debug, Default)]
pub struct KnownLeases {
    by_node: Mutex<BTreeMap<String, Known>>,
    /// By node: every epoch below this one is over for good.
    over_below: Mutex<BTreeMap<String, u64>>,
}

impl KnownLeases {
    /// Knows no record.
    pub fn new() -> KnownLeases {
        KnownLeases::default()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Known>> {
        self.by_node
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The address of `node` if a kept record shows it live in `epoch` at
    /// `now_ms` (before its expiry plus grace, as a read would judge it).
    pub(crate) fn valid(
        &self,
        node: &str,
        epoch: u64,
        now_ms: u64,
        config: &ClusterConfig,
    ) -> Option<String> {
        let map = self.map();
        let k = map.get(node)?;
        (k.epoch == epoch && now_ms < k.expires_at_ms + config.lease_grace_ms)
            .then(|| k.address.clone())
    }

    /// A live record a take read (the newest of its node it has seen).
    pub(crate) fn learn(&self, key: &LeaseKey, expires_at_ms: u64, address: &str, now_ms: u64) {
        let mut map = self.map();
        if let Some(k) = map.get(&key.node)
            && (k.epoch, k.counter) >= (key.epoch, key.counter)
        {
            return;
        }
        if !map.contains_key(&key.node) && map.len() >= KNOWN_LEASES_MAX {
            map.retain(|_, k| k.expires_at_ms > now_ms);
            if map.len() >= KNOWN_LEASES_MAX {
                return;
            }
        }
        map.insert(
            key.node.clone(),
            Known {
                epoch: key.epoch,
                counter: key.counter,
                expires_at_ms,
                address: address.to_owned(),
            },
        );
    }

    /// Whether a read showed `epoch` of `node` over for good (a newer epoch
    /// registered, or this one fenced or released).
    pub(crate) fn is_over(&self, node: &str, epoch: u64) -> bool {
        let map = self
            .over_below
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(node).is_some_and(|below| epoch < *below)
    }

    /// What a read of `node`'s lease showed of its epochs: those below the
    /// newest are over; a fenced or released one is over too. A live or
    /// lapsed newest epoch is not (a lapsed one may only be slow).
    pub(crate) fn learn_view(&self, node: &str, view: &NodeLeaseView) {
        match view {
            NodeLeaseView::Valid { epoch } => self.learn_over_below(node, *epoch),
            NodeLeaseView::Lapsed { latest } => self.learn_over_below(node, latest.epoch),
            NodeLeaseView::Fenced { epoch } | NodeLeaseView::Released { epoch } => {
                self.learn_over_below(node, epoch + 1);
            }
            NodeLeaseView::Absent => {}
        }
    }

    /// Every epoch of `node` below `epoch` is over: a record of `epoch`
    /// exists (a listing or a read showed it), or `epoch - 1` was fenced.
    pub(crate) fn learn_over_below(&self, node: &str, below: u64) {
        let mut map = self
            .over_below
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if below == 0 {
            return;
        }
        match map.get_mut(node) {
            Some(b) => *b = (*b).max(below),
            None => {
                // Full (a folder of many long-gone nodes): one goes, which
                // costs at most a read more for its holds.
                if map.len() >= KNOWN_LEASES_MAX {
                    map.pop_first();
                }
                map.insert(node.to_owned(), below);
            }
        }
    }

    /// Drops what is known of `node`: a forward to it failed or it answered
    /// that it does not own the actor, so its next take reads its lease.
    pub fn forget(&self, node: &str) {
        self.map().remove(node);
    }

    /// Nodes whose record is kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }
}
