//! The sweep (ADR 0009): every node reads the overdue part of the index, takes
//! its share, and hands at most a bounded number of alarms to its timer.

use std::collections::BTreeSet;

use crate::alarm_index::{Address, IndexKey, due_of_key};
use crate::config::ClusterConfig;

/// Entries at or before this time are overdue enough to sweep: a live owner
/// would have delivered them a lease period plus grace ago.
pub(crate) fn sweep_until_ms(now_ms: u64, config: &ClusterConfig) -> u64 {
    now_ms.saturating_sub(config.sweep_margin_ms())
}

/// One listing request of a sweep pass (keys relative to the index prefix).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ListRequest {
    /// List keys after this one; `None` from the start.
    pub start_after: Option<String>,
    /// Keys at most.
    pub limit: usize,
}

/// What one pass read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SweepPass {
    /// Overdue entries, in key order (due time first).
    pub entries: Vec<IndexKey>,
    /// Overdue keys that did not parse; they are stepped over, never acted on.
    pub malformed: usize,
}

/// Where the next pass starts: after the last key of a pass that hit the
/// entry cap, so that entries nobody can act on cannot hold the rest back;
/// from the start after a pass that reached the first entry not yet due.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SweepCursor {
    after: Option<String>,
}

impl SweepCursor {
    /// The listing for the next pass.
    pub(crate) fn request(&self, config: &ClusterConfig) -> ListRequest {
        ListRequest {
            start_after: self.after.clone(),
            limit: config.sweep_entries_max,
        }
    }

    /// Consumes one listing (relative keys in order, as answered to
    /// [`SweepCursor::request`]) and moves the cursor.
    pub(crate) fn on_listed(
        &mut self,
        keys: &[String],
        now_ms: u64,
        config: &ClusterConfig,
    ) -> SweepPass {
        let until = sweep_until_ms(now_ms, config);
        let mut pass = SweepPass::default();
        for key in keys.iter().take(config.sweep_entries_max) {
            // A key without a due time sorts by its bytes like any other; it
            // is overdue as long as later keys may be.
            if due_of_key(key).is_some_and(|due| due > until) {
                self.after = None;
                return pass;
            }
            match IndexKey::parse(key) {
                Ok(k) => pass.entries.push(k),
                Err(_) => pass.malformed += 1,
            }
        }
        self.after = if keys.len() >= config.sweep_entries_max {
            keys.last().cloned()
        } else {
            None
        };
        pass
    }
}

/// FNV-1a, 64 bits: a stable hash every node computes the same way (std's
/// hasher is seeded per process and may change between releases).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The live node whose share an actor's entries are: rendezvous hashing of
/// the address with each node id, so that a node joining or leaving moves only
/// its own share. The sweep asks [`rendezvous_rank`] (this node is rank 0);
/// the tests ask this.
#[cfg(test)]
pub(crate) fn shard_node<'a>(address: &Address, live_nodes: &'a [String]) -> Option<&'a str> {
    rendezvous(&address.path(), live_nodes)
}

/// Where `me` stands in the rendezvous order of `key` over the live nodes:
/// 0 for the node [`rendezvous`] picks, 1 for the next, and so on; the
/// number of live nodes if `me` is not among them.
pub(crate) fn rendezvous_rank(key: &str, me: &str, live_nodes: &[String]) -> usize {
    if !live_nodes.iter().any(|n| n == me) {
        return live_nodes.len();
    }
    let mine = rendezvous_score(me, key);
    live_nodes
        .iter()
        .filter(|n| rendezvous_score(n, key) > mine)
        .count()
}

/// What orders the nodes for `key`: the hash of the node id and the key,
/// then the id.
fn rendezvous_score<'a>(node: &'a str, key: &str) -> (u64, &'a str) {
    let mut bytes = Vec::with_capacity(node.len() + key.len() + 1);
    bytes.extend_from_slice(node.as_bytes());
    bytes.push(b'\n');
    bytes.extend_from_slice(key.as_bytes());
    (fnv1a64(&bytes), node)
}

/// The live node rendezvous hashing picks for `key`: the one whose id
/// hashed with the key is highest, so that a node joining or leaving moves
/// only the keys it wins or held.
pub fn rendezvous<'a>(key: &str, live_nodes: &'a [String]) -> Option<&'a str> {
    live_nodes
        .iter()
        .max_by_key(|n| rendezvous_score(n, key))
        .map(String::as_str)
}

/// How a swept entry relates to the node that read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Share {
    /// The shard is this node's (or, in [`plan_sweep`], the actor is one
    /// this node holds or may hold, whatever its shard: ADR 0073).
    Own,
    /// Another node's shard, but overdue enough for this node to help: three
    /// margins for the next node in the address's rendezvous order, twice
    /// as many nodes each margin after up to `HELPER_RANKS_MAX`, more again
    /// from the last resort ([`ClusterConfig::helper_ranks`]).
    Anyones,
    /// Another live node's; leave it.
    Others,
}

/// Classifies one overdue entry.
pub(crate) fn share_of(
    entry: &IndexKey,
    me: &str,
    live_nodes: &[String],
    now_ms: u64,
    config: &ClusterConfig,
) -> Share {
    let rank = rendezvous_rank(&entry.address.path(), me, live_nodes);
    if rank == 0 {
        Share::Own
    } else if rank <= config.helper_ranks(now_ms.saturating_sub(entry.entry.at_ms)) {
        Share::Anyones
    } else {
        Share::Others
    }
}

/// The inputs of [`plan_sweep`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct SweepInput<'a> {
    /// What the pass read, in key order.
    pub entries: &'a [IndexKey],
    /// This node.
    pub me: &'a str,
    /// Live nodes by fresh leases, this node included while it acts.
    pub live_nodes: &'a [String],
    /// Actors this node already has in flight or retrying: they are neither
    /// delivered again nor counted against the cap.
    pub busy: &'a BTreeSet<Address>,
    /// Actors of this index this node holds: their entries are its own
    /// whatever their shard, so that an alarm whose live owner lost its
    /// timer (a failed upload, a failed open) is delivered by that owner's
    /// sweep within a sweep margin, not only once it ranks as a helper.
    pub held: &'a BTreeSet<Address>,
    /// A random number: where in anyone's entries this sweep starts, so that
    /// surviving nodes do not all deliver the same ones.
    pub rotation: u64,
    /// The node's clock.
    pub now_ms: u64,
}

/// `plan_sweep`: what one index's pass hands out for delivery, and how many
/// entries were eligible (the cap bound when more were than it picked). At
/// most `sweep_deliveries_max`; own entries first; anyone's entries keep an
/// eighth, taken from a random rotation, and take whatever own entries leave.
pub(crate) fn plan_sweep(input: &SweepInput<'_>, config: &ClusterConfig) -> (Vec<IndexKey>, usize) {
    let mut own = Vec::new();
    let mut anyones = Vec::new();
    let mut seen = BTreeSet::new();
    for e in input.entries {
        if input.busy.contains(&e.address) || !seen.insert((e.address.clone(), e.entry.at_ms)) {
            continue;
        }
        let share = if input.held.contains(&e.address) {
            Share::Own
        } else {
            share_of(e, input.me, input.live_nodes, input.now_ms, config)
        };
        match share {
            Share::Own => own.push(e.clone()),
            Share::Anyones => anyones.push(e.clone()),
            Share::Others => {}
        }
    }
    let eligible = own.len() + anyones.len();
    let cap = config.sweep_deliveries_max;
    let reserved = config.sweep_anyones_reserved().min(anyones.len());
    let own_take = own.len().min(cap - reserved.min(cap));
    let anyones_take = anyones.len().min(cap - own_take);
    let mut out: Vec<IndexKey> = own.into_iter().take(own_take).collect();
    if !anyones.is_empty() {
        let start = (input.rotation % anyones.len() as u64) as usize;
        anyones.rotate_left(start);
        out.extend(anyones.into_iter().take(anyones_take));
    }
    // Postconditions: within the cap, and no entry twice.
    assert!(out.len() <= cap);
    debug_assert_eq!(
        out.iter()
            .map(|e| (&e.address, e.entry.at_ms))
            .collect::<BTreeSet<_>>()
            .len(),
        out.len()
    );
    (out, eligible)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alarm_index::Entry;
    use crate::config::HELPER_RANKS_MAX;

    fn key(at: u64, name: &str) -> IndexKey {
        IndexKey::new(Address::new("c", name).unwrap(), Entry::tagged(at, 1, 1)).unwrap()
    }

    #[test]
    fn a_pass_reads_only_overdue_entries_and_resumes_after_a_full_one() {
        let cfg = ClusterConfig {
            sweep_entries_max: 3,
            ..ClusterConfig::default()
        };
        let now = 100_000;
        let keys: Vec<String> = [1_000, 2_000, 3_000, 4_000, 99_000]
            .iter()
            .map(|t| key(*t, "a").to_key())
            .collect();
        let mut cur = SweepCursor::default();
        assert_eq!(cur.request(&cfg).start_after, None);
        let p = cur.on_listed(&keys[..3], now, &cfg);
        assert_eq!(p.entries.len(), 3);
        assert_eq!(
            cur.request(&cfg).start_after.as_deref(),
            Some(keys[2].as_str())
        );
        // The next pass reaches an entry not yet due and starts over next time.
        let p = cur.on_listed(&keys[3..], now, &cfg);
        assert_eq!(p.entries.len(), 1);
        assert_eq!(cur.request(&cfg).start_after, None);
        // Malformed overdue keys are stepped over, not acted on.
        let p = cur.on_listed(
            &["000000000000001/x".to_owned(), "zzz".to_owned()],
            now,
            &cfg,
        );
        assert_eq!((p.entries.len(), p.malformed), (0, 2));
    }

    #[test]
    fn shards_are_stable_and_spread() {
        let nodes: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let mut counts = [0usize; 3];
        for i in 0..3_000 {
            let a = Address::new("c", format!("n{i}")).unwrap();
            let n = shard_node(&a, &nodes).unwrap();
            counts[nodes.iter().position(|x| x == n).unwrap()] += 1;
            // Removing another node does not move this actor.
            let others: Vec<String> = nodes
                .iter()
                .filter(|x| *x == n || **x != "b")
                .cloned()
                .collect();
            if n != "b" {
                assert_eq!(shard_node(&a, &others), Some(n));
            }
        }
        assert!(counts.iter().all(|c| *c > 800), "{counts:?}");
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn plan_sweep_caps_puts_own_first_and_keeps_an_eighth_for_anyones() {
        let cfg = ClusterConfig::default();
        let now = 1_000_000;
        let live = vec!["me".to_string(), "other".to_string()];
        let mut entries = Vec::new();
        for i in 0..2_000 {
            entries.push(key(now - 50_000, &format!("n{i}")));
        }
        let busy = BTreeSet::new();
        let input = SweepInput {
            entries: &entries,
            me: "me",
            live_nodes: &live,
            busy: &busy,
            held: &BTreeSet::new(),
            rotation: 5,
            now_ms: now,
        };
        let out = plan_sweep(&input, &cfg).0;
        assert_eq!(out.len(), 256);
        let own = out
            .iter()
            .filter(|e| shard_node(&e.address, &live) == Some("me"))
            .count();
        assert_eq!(own, 256 - 32);
        // Own entries come first.
        assert!(
            out[..own]
                .iter()
                .all(|e| shard_node(&e.address, &live) == Some("me"))
        );
        // Another rotation gives other anyone's entries.
        let out2 = plan_sweep(
            &SweepInput {
                rotation: 77,
                ..input
            },
            &cfg,
        )
        .0;
        assert_ne!(out[own..], out2[own..]);
        // Without own entries anyone's take the whole cap.
        let only_others: Vec<IndexKey> = entries
            .iter()
            .filter(|e| shard_node(&e.address, &live) == Some("other"))
            .cloned()
            .collect();
        let out3 = plan_sweep(
            &SweepInput {
                entries: &only_others,
                ..input
            },
            &cfg,
        )
        .0;
        assert_eq!(out3.len(), 256);
        // Entries not three margins overdue stay with their shard.
        let recent: Vec<IndexKey> = (0..50)
            .map(|i| key(now - 20_000, &format!("n{i}")))
            .collect();
        let out4 = plan_sweep(
            &SweepInput {
                entries: &recent,
                ..input
            },
            &cfg,
        )
        .0;
        assert!(
            out4.iter()
                .all(|e| shard_node(&e.address, &live) == Some("me"))
        );
    }

    #[test]
    fn helpers_join_in_rendezvous_order_not_all_at_once() {
        let cfg = ClusterConfig::default();
        let live: Vec<String> = (0..100).map(|i| format!("n{i}")).collect();
        let now = 1_000_000;
        for i in 0..50 {
            let share = |overdue: u64, me: &str| {
                share_of(&key(now - overdue, &format!("a{i}")), me, &live, now, &cfg)
            };
            let count =
                |overdue, s: Share| live.iter().filter(|me| share(overdue, me) == s).count();
            // One shard node; nobody helps before three margins, one node
            // then, two a margin later, four at most from 75 s until the
            // last resort (345 s), and every node from 405 s.
            assert_eq!(count(10_000, Share::Own), 1);
            assert_eq!(count(44_000, Share::Anyones), 0);
            assert_eq!(count(50_000, Share::Anyones), 1);
            assert_eq!(count(65_000, Share::Anyones), 2);
            assert_eq!(count(75_000, Share::Anyones), HELPER_RANKS_MAX);
            assert_eq!(count(344_000, Share::Anyones), HELPER_RANKS_MAX);
            assert_eq!(count(350_000, Share::Anyones), 8);
            assert_eq!(count(405_000, Share::Anyones), 99);
        }
        // A node that is not live ranks last.
        assert_eq!(rendezvous_rank("x", "gone", &live), 100);
    }

    #[test]
    fn busy_entries_are_neither_delivered_nor_counted() {
        let cfg = ClusterConfig {
            sweep_deliveries_max: 2,
            ..ClusterConfig::default()
        };
        let live = vec!["me".to_string()];
        let entries: Vec<IndexKey> = (0..4).map(|i| key(1_000, &format!("n{i}"))).collect();
        let busy: BTreeSet<Address> = entries[..2].iter().map(|e| e.address.clone()).collect();
        let input = SweepInput {
            entries: &entries,
            me: "me",
            live_nodes: &live,
            busy: &busy,
            held: &BTreeSet::new(),
            rotation: 0,
            now_ms: 100_000,
        };
        let out = plan_sweep(&input, &cfg).0;
        assert_eq!(out, entries[2..].to_vec());
    }

    #[test]
    fn a_holder_delivers_its_actors_entries_whatever_their_shard() {
        let cfg = ClusterConfig::default();
        let live: Vec<String> = (0..100).map(|i| format!("n{i}")).collect();
        let now = 1_000_000;
        // Overdue past the sweep margin, long before anyone helps.
        let entries: Vec<IndexKey> = (0..200)
            .map(|i| key(now - 20_000, &format!("a{i}")))
            .collect();
        let me = "n7";
        let others: Vec<IndexKey> = entries
            .iter()
            .filter(|e| share_of(e, me, &live, now, &cfg) == Share::Others)
            .cloned()
            .collect();
        assert!(others.len() > 150, "{}", others.len());
        let held: BTreeSet<Address> = others[..3].iter().map(|e| e.address.clone()).collect();
        let plan = |held: &BTreeSet<Address>| {
            let input = SweepInput {
                entries: &others,
                me,
                live_nodes: &live,
                busy: &BTreeSet::new(),
                held,
                rotation: 0,
                now_ms: now,
            };
            plan_sweep(&input, &cfg).0
        };
        assert_eq!(plan(&held), others[..3].to_vec());
        assert!(plan(&BTreeSet::new()).is_empty());
    }
}
