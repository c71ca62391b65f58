//! Node leases (ADR 0020): how a node says it is alive, how it learns it is
//! not, and how another node fences it.
//!
//! A node's lease is a chain of create-only records,
//! `<prefix><node>/<epoch, 20 digits>/<counter, 20 digits>`. Each start of the
//! node is a new epoch; each renewal creates the next counter. Fencing a node
//! is creating its next counter with a `fenced` record: the node's own renewal
//! and the fence race for the same key and exactly one wins, so a fenced node
//! learns on its next renewal that it lost everything. Only create-only writes
//! are needed, which every store (even a local folder) offers.
//!
//! Clocks decide liveness and routing, never safety: the replication chain and
//! the alarm index rules hold whatever two nodes believe about their leases.
//!
//! This module holds the records and the rules of one record; the loops around
//! them are step machines in [`crate::machine`]: a node's own lease is
//! [`crate::machine::NodeLeaseMachine`] (the holder's state, `NodeLease`, is
//! private to the crate), reading another node's is
//! [`crate::machine::NodeViewReader`], and fencing happens inside
//! [`crate::machine::TakeMachine`].

use crate::config::{ADDRESS_BYTES_MAX, ClusterConfig, NODE_BYTES_MAX};
use crate::error::Error;
use crate::{parse_fixed_digits, parse_fixed_hex};

/// Digits of an epoch or counter in a lease key.
pub const LEASE_DIGITS: usize = 20;
/// Where node leases live in the bucket (protocol.md's layout). The step
/// machines use it; the pure functions take the prefix as a parameter.
pub const NODES_PREFIX: &str = "nodes/";

/// Checks a node id: 1 to 64 lowercase ASCII letters, digits or `-`.
pub fn validate_node(node: &str) -> Result<(), Error> {
    let ok = !node.is_empty()
        && node.len() <= NODE_BYTES_MAX
        && node
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidNode {
            node: node.to_owned(),
        })
    }
}

/// Checks an advertised address (how other nodes reach this one): 1 to
/// [`ADDRESS_BYTES_MAX`] bytes of printable ASCII without spaces, so that it
/// is the last field of a live record and parses back unchanged. Its form
/// (`http://host:port`) is the server's to check; the protocol only carries it.
pub fn validate_address(address: &str) -> Result<(), Error> {
    let bad = |reason| {
        Err(Error::InvalidAddress {
            reason,
            address: address.chars().take(ADDRESS_BYTES_MAX).collect(),
        })
    };
    if address.is_empty() {
        return bad("empty");
    }
    if address.len() > ADDRESS_BYTES_MAX {
        return bad("longer than 300 bytes");
    }
    if !address.bytes().all(|b| b.is_ascii_graphic()) {
        return bad("not printable ascii without spaces");
    }
    Ok(())
}

/// The key of one lease record.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseKey {
    /// The node.
    pub node: String,
    /// The node's start (a new one for every start).
    pub epoch: u64,
    /// The record's place in the epoch's chain; 0 is the registration.
    pub counter: u64,
}

impl LeaseKey {
    /// The key below the lease prefix (`nodes/` in the bucket layout).
    pub fn to_key(&self, prefix: &str) -> String {
        format!(
            "{prefix}{}/{:020}/{:020}",
            self.node, self.epoch, self.counter
        )
    }

    /// Parses a key written by [`LeaseKey::to_key`].
    pub fn parse(prefix: &str, key: &str) -> Result<LeaseKey, Error> {
        let bad = |reason| Error::MalformedKey {
            reason,
            key: key.to_owned(),
        };
        let rel = key
            .strip_prefix(prefix)
            .ok_or_else(|| bad("outside the lease prefix"))?;
        let mut parts = rel.split('/');
        let (Some(node), Some(epoch), Some(counter), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("segment count"));
        };
        validate_node(node).map_err(|_| bad("node id"))?;
        Ok(LeaseKey {
            node: node.to_owned(),
            epoch: parse_fixed_digits(epoch, LEASE_DIGITS).ok_or_else(|| bad("epoch"))?,
            counter: parse_fixed_digits(counter, LEASE_DIGITS).ok_or_else(|| bad("counter"))?,
        })
    }

    /// The folder of a node's lease records (all epochs).
    pub fn node_folder(prefix: &str, node: &str) -> String {
        format!("{prefix}{node}/")
    }

    /// The key after this one in the same epoch.
    pub fn next(&self) -> LeaseKey {
        LeaseKey {
            counter: self.counter + 1,
            ..self.clone()
        }
    }
}

/// The body of a lease record. Every body carries a nonce, so a writer that
/// lost a response can tell its own record from someone else's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseRecord {
    /// The node is alive until `expires_at_ms` by its own clock, and other
    /// nodes reach it at `address` (its advertised address).
    Live {
        expires_at_ms: u64,
        nonce: u64,
        address: String,
    },
    /// Another node fenced this epoch: it may not act again.
    Fenced { by: String, nonce: u64 },
    /// The node shut down cleanly and handed over.
    Released { nonce: u64 },
}

impl LeaseRecord {
    /// The record as stored.
    pub fn encode(&self) -> String {
        match self {
            LeaseRecord::Live {
                expires_at_ms,
                nonce,
                address,
            } => format!("live {expires_at_ms} {nonce:016x} {address}"),
            LeaseRecord::Fenced { by, nonce } => format!("fenced {by} {nonce:016x}"),
            LeaseRecord::Released { nonce } => format!("released {nonce:016x}"),
        }
    }

    /// Parses a record written by [`LeaseRecord::encode`].
    pub fn decode(body: &str) -> Result<LeaseRecord, Error> {
        let bad = |reason| Error::MalformedRecord {
            reason,
            record: body.to_owned(),
        };
        let parts: Vec<&str> = body.split(' ').collect();
        let nonce = |s: &str| parse_fixed_hex(s, 16).ok_or_else(|| bad("nonce"));
        match parts.as_slice() {
            ["live", at, n, address] => {
                validate_address(address).map_err(|_| bad("address"))?;
                Ok(LeaseRecord::Live {
                    expires_at_ms: at.parse().map_err(|_| bad("expiry"))?,
                    nonce: nonce(n)?,
                    address: (*address).to_owned(),
                })
            }
            ["fenced", by, n] => {
                validate_node(by).map_err(|_| bad("fencing node"))?;
                Ok(LeaseRecord::Fenced {
                    by: (*by).to_owned(),
                    nonce: nonce(n)?,
                })
            }
            ["released", n] => Ok(LeaseRecord::Released { nonce: nonce(n)? }),
            _ => Err(bad("kind")),
        }
    }
}

/// A lease record to create (create-only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeaseWrite {
    /// Where.
    pub(crate) key: LeaseKey,
    /// What.
    pub(crate) record: LeaseRecord,
}

/// Where a node stands with its own lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// Registering: no record written yet.
    Starting,
    /// The node may act as owner until `acting_until_ms` by its own clock.
    Valid { acting_until_ms: u64 },
    /// The node could not renew in time and stopped acting. It must start a
    /// new epoch: another node may have fenced it and taken its actors.
    Lapsed,
    /// Another node fenced this epoch. The node lost every actor it held.
    Fenced,
    /// The node released its lease (clean shutdown).
    Released,
}

/// The holder's side of a node lease: the rules of its records, which
/// [`crate::machine::NodeLeaseMachine`] (the renewal loop's order) drives with
/// the outcomes of its writes. Private to the crate: drivers use the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NodeLease {
    node: String,
    epoch: u64,
    address: String,
    written: Option<u64>,
    last_sent_ms: Option<u64>,
    state: LeaseState,
    /// The nonces of the records it tried to create at the next counter
    /// (the last [`ATTEMPT_NONCES_MAX`]): a record found there with another
    /// nonce was written by another process with this node's id and epoch.
    attempt_nonces: Vec<u64>,
}

/// Nonces of attempts at one counter a node remembers; an earlier
/// attempt's record found after more is taken for another process's (the
/// node starts a new epoch: safe).
const ATTEMPT_NONCES_MAX: usize = 64;

impl NodeLease {
    /// A node starting with `epoch`, which must exceed every epoch it used
    /// before, reached by other nodes at `address`.
    pub(crate) fn new(node: &str, epoch: u64, address: &str) -> Result<NodeLease, Error> {
        validate_node(node)?;
        validate_address(address)?;
        Ok(NodeLease {
            node: node.to_owned(),
            epoch,
            address: address.to_owned(),
            written: None,
            last_sent_ms: None,
            state: LeaseState::Starting,
            attempt_nonces: Vec::new(),
        })
    }

    /// Notes an attempt's nonce at the next counter.
    fn attempt(&mut self, nonce: u64) {
        if self.attempt_nonces.len() >= ATTEMPT_NONCES_MAX {
            self.attempt_nonces.remove(0);
        }
        self.attempt_nonces.push(nonce);
    }

    /// The node id.
    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// This start's epoch.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Until when the node acts, as last computed (the clock not applied).
    pub(crate) fn acting_until_ms(&self) -> Option<u64> {
        match self.state {
            LeaseState::Valid { acting_until_ms } => Some(acting_until_ms),
            _ => None,
        }
    }

    /// The current state, after applying the clock.
    pub(crate) fn state(&mut self, now_ms: u64) -> LeaseState {
        if let LeaseState::Valid { acting_until_ms } = self.state
            && now_ms >= acting_until_ms
        {
            self.state = LeaseState::Lapsed;
        }
        self.state
    }

    /// Whether the node may act as owner now. Every step an owner takes
    /// (a PUT, an upload, a delete) checks this first.
    pub(crate) fn is_acting(&mut self, now_ms: u64) -> bool {
        matches!(self.state(now_ms), LeaseState::Valid { .. })
    }

    /// When the next renewal is due.
    pub(crate) fn renew_at_ms(&self, config: &ClusterConfig) -> u64 {
        self.last_sent_ms.map_or(0, |t| t + config.lease_renew_ms())
    }

    /// The next record to create, or `None` once the epoch is over (lapsed,
    /// fenced or released: the node must start a new epoch).
    pub(crate) fn next_write(
        &mut self,
        now_ms: u64,
        nonce: u64,
        config: &ClusterConfig,
    ) -> Option<LeaseWrite> {
        match self.state(now_ms) {
            LeaseState::Starting | LeaseState::Valid { .. } => {}
            _ => return None,
        }
        self.last_sent_ms = Some(now_ms);
        self.attempt(nonce);
        let counter = self.written.map_or(0, |c| c + 1);
        Some(LeaseWrite {
            key: LeaseKey {
                node: self.node.clone(),
                epoch: self.epoch,
                counter,
            },
            record: LeaseRecord::Live {
                expires_at_ms: now_ms + config.lease_period_ms,
                nonce,
                address: self.address.clone(),
            },
        })
    }

    /// The write landed (or, after a lost response, the node read back its own
    /// record). The node acts until the record's expiry minus the margin.
    pub(crate) fn on_written(&mut self, write: &LeaseWrite, now_ms: u64, config: &ClusterConfig) {
        if self.written.is_some_and(|c| c >= write.key.counter) {
            return;
        }
        self.written = Some(write.key.counter);
        self.attempt_nonces.clear();
        let acting_until_ms = match write.record {
            LeaseRecord::Live { expires_at_ms, .. } => {
                expires_at_ms.saturating_sub(config.owner_margin_ms)
            }
            _ => 0,
        };
        match (self.state(now_ms), &write.record) {
            (LeaseState::Starting | LeaseState::Valid { .. }, LeaseRecord::Live { .. }) => {
                self.state = LeaseState::Valid { acting_until_ms };
                // A renewal that landed too late to matter leaves the node lapsed.
                self.state(now_ms);
            }
            (_, LeaseRecord::Released { .. }) => self.state = LeaseState::Released,
            _ => {}
        }
    }

    /// The create found `key` taken by `found`. A live (or released) record
    /// with the nonce of one of its attempts is its own: an earlier attempt
    /// whose response was lost, which counts as written (its expiry, not
    /// this attempt's, bounds acting). A fenced record means another node
    /// fenced this epoch; a live or released one with another nonce, that
    /// another process writes records with this node's id and epoch (two
    /// processes given one `cluster_node_id`, ADR 0069): either way the
    /// epoch is over for this process.
    pub(crate) fn on_conflict(
        &mut self,
        key: &LeaseKey,
        found: &LeaseRecord,
        now_ms: u64,
        config: &ClusterConfig,
    ) {
        let own = match found {
            LeaseRecord::Live { nonce, .. } | LeaseRecord::Released { nonce } => {
                self.attempt_nonces.contains(nonce)
            }
            LeaseRecord::Fenced { .. } => false,
        };
        if own {
            let write = LeaseWrite {
                key: key.clone(),
                record: found.clone(),
            };
            self.on_written(&write, now_ms, config);
        } else {
            self.state = LeaseState::Fenced;
        }
    }

    /// The record a clean shutdown writes: the node's actors may be taken at once.
    pub(crate) fn release(&mut self, nonce: u64) -> LeaseWrite {
        self.attempt(nonce);
        let counter = self.written.map_or(0, |c| c + 1);
        LeaseWrite {
            key: LeaseKey {
                node: self.node.clone(),
                epoch: self.epoch,
                counter,
            },
            record: LeaseRecord::Released { nonce },
        }
    }
}

/// What another node concludes from a node's latest lease record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeLeaseView {
    /// Alive: the record is live and not past its expiry plus grace.
    Valid { epoch: u64 },
    /// The record is live but past its expiry plus grace. Taking the node's
    /// actors requires fencing it first (creating `latest.next()`), since it
    /// may only be slow.
    Lapsed { latest: LeaseKey },
    /// The epoch was fenced.
    Fenced { epoch: u64 },
    /// The epoch was released.
    Released { epoch: u64 },
    /// The node has no lease record.
    Absent,
}

impl NodeLeaseView {
    /// Whether the node counts as live for sharding the sweep.
    pub fn is_live(&self) -> bool {
        matches!(self, NodeLeaseView::Valid { .. })
    }
}

/// The latest lease record key of one node among listed keys (highest epoch,
/// then highest counter); keys that do not parse are ignored.
pub(crate) fn latest_lease_key<'a>(
    prefix: &str,
    node: &str,
    keys: impl IntoIterator<Item = &'a str>,
) -> Option<LeaseKey> {
    keys.into_iter()
        .filter_map(|k| LeaseKey::parse(prefix, k).ok())
        .filter(|k| k.node == node)
        .max_by_key(|k| (k.epoch, k.counter))
}

/// The view of a node from its latest record, by the observer's clock
/// ([`crate::machine::NodeViewReader`] reads the record and asks this).
pub(crate) fn node_lease_view(
    latest: Option<(&LeaseKey, &LeaseRecord)>,
    now_ms: u64,
    config: &ClusterConfig,
) -> NodeLeaseView {
    match latest {
        None => NodeLeaseView::Absent,
        Some((key, LeaseRecord::Live { expires_at_ms, .. })) => {
            if now_ms < expires_at_ms + config.lease_grace_ms {
                NodeLeaseView::Valid { epoch: key.epoch }
            } else {
                NodeLeaseView::Lapsed {
                    latest: key.clone(),
                }
            }
        }
        Some((key, LeaseRecord::Fenced { .. })) => NodeLeaseView::Fenced { epoch: key.epoch },
        Some((key, LeaseRecord::Released { .. })) => NodeLeaseView::Released { epoch: key.epoch },
    }
}

/// The record that fences a lapsed node: its next counter, marked fenced
/// (written by [`crate::machine::TakeMachine`]).
pub(crate) fn fence_write(lapsed: &LeaseKey, by: &str, nonce: u64) -> LeaseWrite {
    LeaseWrite {
        key: lapsed.next(),
        record: LeaseRecord::Fenced {
            by: by.to_owned(),
            nonce,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_records_round_trip() {
        let k = LeaseKey {
            node: "node-1".into(),
            epoch: 3,
            counter: 7,
        };
        let text = k.to_key("nodes/");
        assert_eq!(
            text,
            "nodes/node-1/00000000000000000003/00000000000000000007"
        );
        assert_eq!(LeaseKey::parse("nodes/", &text), Ok(k));
        for bad in [
            "nodes/N/00000000000000000003/00000000000000000007",
            "nodes/a/3/7",
            "nodes/a/00000000000000000003",
        ] {
            assert!(LeaseKey::parse("nodes/", bad).is_err(), "{bad}");
        }
        for r in [
            LeaseRecord::Live {
                expires_at_ms: 5,
                nonce: 9,
                address: "http://10.0.0.1:8080".into(),
            },
            LeaseRecord::Fenced {
                by: "b".into(),
                nonce: 1,
            },
            LeaseRecord::Released { nonce: 2 },
        ] {
            assert_eq!(LeaseRecord::decode(&r.encode()), Ok(r));
        }
        assert!(LeaseRecord::decode("live x 0000000000000001 http://a:1").is_err());
        // The address is required, bounded and one printable word.
        assert!(LeaseRecord::decode("live 5 0000000000000001").is_err());
        assert!(LeaseRecord::decode("live 5 0000000000000001 http://a:1 x").is_err());
        let long = format!("live 5 0000000000000001 http://{}", "a".repeat(300));
        assert!(LeaseRecord::decode(&long).is_err());
        assert!(validate_address(&"a".repeat(300)).is_ok());
        assert!(validate_address(&"a".repeat(301)).is_err());
        for bad in ["", "http://a b", "http://\u{e9}", "http://a\n"] {
            assert!(validate_address(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn acquire_renew_lapse() {
        let c = ClusterConfig::default();
        let mut l = NodeLease::new("a", 1, "http://a:1").unwrap();
        assert!(!l.is_acting(0));
        let w = l.next_write(0, 1, &c).unwrap();
        assert_eq!(w.key.counter, 0);
        l.on_written(&w, 5, &c);
        assert!(l.is_acting(8_999));
        assert_eq!(l.renew_at_ms(&c), 3_333);
        let w2 = l.next_write(3_333, 2, &c).unwrap();
        assert_eq!(w2.key.counter, 1);
        // No renewal lands: the node stops a margin before its expiry.
        assert!(l.is_acting(8_998));
        assert!(!l.is_acting(9_000));
        assert_eq!(l.state(9_000), LeaseState::Lapsed);
        assert!(l.next_write(9_001, 3, &c).is_none());
        // A renewal that lands after the lapse does not revive the epoch.
        l.on_written(&w2, 9_100, &c);
        assert_eq!(l.state(9_100), LeaseState::Lapsed);
    }

    #[test]
    fn fence_wins_the_race_for_the_next_counter() {
        let c = ClusterConfig::default();
        let mut l = NodeLease::new("a", 1, "http://a:1").unwrap();
        let w = l.next_write(0, 1, &c).unwrap();
        l.on_written(&w, 0, &c);
        let seen = node_lease_view(Some((&w.key, &w.record)), 15_000, &c);
        let NodeLeaseView::Lapsed { latest } = seen else {
            panic!("{seen:?}")
        };
        let fence = fence_write(&latest, "b", 7);
        let mine = l.next_write(3_333, 2, &c).unwrap();
        assert_eq!(mine.key, fence.key);
        l.on_conflict(&mine.key, &fence.record, 3_400, &c);
        assert_eq!(l.state(3_400), LeaseState::Fenced);
        assert!(!l.is_acting(3_400));
        // Its own record read back after a lost response counts as written.
        let mut l2 = NodeLease::new("a", 2, "http://a:1").unwrap();
        let lost = l2.next_write(0, 5, &c).unwrap();
        let retry = l2.next_write(2_000, 6, &c).unwrap();
        assert_eq!(lost.key, retry.key);
        l2.on_conflict(&retry.key, &lost.record, 2_010, &c);
        // The record that landed is the first attempt's: it bounds acting.
        assert!(l2.is_acting(8_999));
        assert!(!l2.is_acting(9_000));
        // A live record at its key with a nonce it never sent is another
        // process's with the same id and epoch (ADR 0069): not its own,
        // the epoch is over for it. Adopting it (the rule before) would
        // leave two processes acting in one epoch.
        let mut l3 = NodeLease::new("a", 3, "http://a:1").unwrap();
        let mine = l3.next_write(0, 8, &c).unwrap();
        let other = LeaseWrite {
            key: mine.key.clone(),
            record: LeaseRecord::Live {
                expires_at_ms: 10_000,
                nonce: 9,
                address: "http://elsewhere:1".into(),
            },
        };
        l3.on_conflict(&mine.key, &other.record, 10, &c);
        assert_eq!(l3.state(10), LeaseState::Fenced);
    }

    #[test]
    fn observers_see_valid_lapsed_fenced_released() {
        let c = ClusterConfig::default();
        let k = LeaseKey {
            node: "a".into(),
            epoch: 2,
            counter: 4,
        };
        let live = LeaseRecord::Live {
            expires_at_ms: 10_000,
            nonce: 0,
            address: "http://a:1".into(),
        };
        assert_eq!(
            node_lease_view(Some((&k, &live)), 14_999, &c),
            NodeLeaseView::Valid { epoch: 2 }
        );
        assert_eq!(
            node_lease_view(Some((&k, &live)), 15_000, &c),
            NodeLeaseView::Lapsed { latest: k.clone() }
        );
        let f = LeaseRecord::Fenced {
            by: "b".into(),
            nonce: 0,
        };
        assert_eq!(
            node_lease_view(Some((&k, &f)), 0, &c),
            NodeLeaseView::Fenced { epoch: 2 }
        );
        assert_eq!(node_lease_view(None, 0, &c), NodeLeaseView::Absent);
        let keys = [
            "nodes/a/00000000000000000001/00000000000000000009",
            "nodes/a/00000000000000000002/00000000000000000004",
            "nodes/a/00000000000000000002/00000000000000000003",
            "nodes/ab/00000000000000000009/00000000000000000000",
            "nodes/a/junk",
        ];
        assert_eq!(latest_lease_key("nodes/", "a", keys), Some(k));
        let mut l = NodeLease::new("a", 3, "http://a:1").unwrap();
        let r = l.release(1);
        l.on_written(&r, 0, &c);
        assert_eq!(l.state(0), LeaseState::Released);
    }
}
