//! Planned rebalancing's policy and the gives a node has been asked for
//! (issue 41, ADR 0072). The HTTP side (asking, giving, taking) is in
//! `api/rebalance.rs`; this module holds what decides, so that it can be
//! read and tested on its own.
//!
//! The policy, in full:
//!
//! - **Who asks.** A node that starts serving (a start, a restart) asks
//!   for its fair share for [`JOIN_WINDOW_MS`] at most, one round every
//!   [`ROUND_MS`], the first a round after it serves (so that nodes
//!   started together count each other: what the first took by a share of
//!   a smaller cluster could not move again); it stops as soon as it holds its share (within
//!   [`slack`]) or nobody who answered holds more than theirs (a round in
//!   which nobody answered does not count). Nothing else moves
//!   actors: a node whose peers died takes their actors as requests reach
//!   it, as before.
//! - **The fair share** is the actors the serving nodes hold (each node's
//!   own count, asked over HTTP), divided by their number, rounded down.
//!   Draining nodes and nodes that do not answer are left out.
//! - **Who gives, how many.** Each node above the share is asked for its
//!   excess, the most loaded first, until the asking node's deficit is
//!   covered; one ask never exceeds a round of moves at the asking node's
//!   `cluster_rebalance_moves_per_s` (× [`ROUND_MS`]), since the next
//!   round asks again with fresh counts. A new ask from the same node
//!   replaces the giver's earlier one, waiting or being done (no double
//!   count), and a giver stops at the share the ask names (two nodes
//!   joining at once do not both take their share from one giver).
//! - **How fast.** A giver hands actors over one at a time, starting at
//!   most `cluster_rebalance_moves_per_s` a second (default
//!   [`MOVES_PER_S`]); each hand-over waits for the actor's running
//!   requests (at most 5 s, then another actor is tried) while its new
//!   ones wait, so no request fails; it picks no actor running a request
//!   at that moment.
//! - **Which actors.** The most recently used ones it holds (they carry the
//!   load) that run no request at that moment, never one with WebSockets
//!   open, never one of a class a migration closed, and never one that
//!   came to it by a hand-over (a drain's or a give's) and has not been
//!   released since: **no rebalancing move of an actor right after
//!   another move of it** (a drain still moves every actor).

use std::collections::VecDeque;

/// Default of `cluster_rebalance_moves_per_s`.
pub const MOVES_PER_S: u32 = 20;
/// How long after it starts serving a node asks for its share.
pub(crate) const JOIN_WINDOW_MS: u64 = 60_000;
/// How often, within that window, it reads the others' counts and asks.
pub(crate) const ROUND_MS: u64 = 5_000;
/// Most actors one ask may name (400 `invalid_give` past it).
pub(crate) const GIVE_COUNT_MAX: usize = 100_000;
/// Most asks a giver keeps waiting, one per asking node (409
/// `gives_full` past it).
pub(crate) const GIVES_QUEUED_MAX: usize = 64;

/// A node's count, as it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Load {
    pub(crate) node: String,
    pub(crate) address: String,
    pub(crate) held: usize,
}

/// How far under its share a node may stay without asking: a tenth of the
/// share, at least one actor.
pub(crate) fn slack(share: usize) -> usize {
    (share / 10).max(1)
}

/// The fair share of `mine` and `others` (the serving nodes' counts).
pub(crate) fn share(mine: usize, others: &[Load]) -> usize {
    let total = mine + others.iter().map(|l| l.held).sum::<usize>();
    total / (others.len() + 1)
}

/// What a node holding `mine` asks of `others`: (giver, how many), the
/// most loaded first, none when it holds its share within [`slack`];
/// `cap` bounds each ask (a giver's moves in one round).
pub(crate) fn asks(mine: usize, others: &[Load], cap: usize) -> Vec<(Load, usize)> {
    let share = share(mine, others);
    if mine + slack(share) >= share {
        return Vec::new();
    }
    let mut need = share - mine;
    let mut by_load: Vec<&Load> = others.iter().filter(|l| l.held > share).collect();
    by_load.sort_by(|a, b| b.held.cmp(&a.held).then_with(|| a.node.cmp(&b.node)));
    let mut out = Vec::new();
    for l in by_load {
        if need == 0 {
            break;
        }
        let k = (l.held - share).min(need).min(cap.max(1));
        need -= k;
        out.push((l.clone(), k));
    }
    out
}

/// One ask a giver keeps: hand `count` actors to `to` at `address`, and
/// none once it holds `share` or fewer (two nodes that join at once each
/// ask the most loaded node for their share: it gives down to the share,
/// not twice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Give {
    pub(crate) to: String,
    pub(crate) address: String,
    pub(crate) count: usize,
    pub(crate) share: usize,
}

/// The asks a giver has been sent and not yet done, one per asking node.
#[derive(Debug, Default)]
pub(crate) struct Gives {
    queue: parking_lot::Mutex<VecDeque<Give>>,
    /// Whether the task that does them runs.
    pub(crate) running: std::sync::atomic::AtomicBool,
}

impl Gives {
    /// Keeps `give`, replacing an earlier ask of the same node; `false`
    /// when [`GIVES_QUEUED_MAX`] asks of other nodes wait already.
    pub(crate) fn push(&self, give: Give) -> bool {
        let mut q = self.queue.lock();
        if let Some(g) = q.iter_mut().find(|g| g.to == give.to) {
            *g = give;
            return true;
        }
        if q.len() >= GIVES_QUEUED_MAX {
            return false;
        }
        q.push_back(give);
        true
    }

    /// The next ask to do.
    pub(crate) fn pop(&self) -> Option<Give> {
        self.queue.lock().pop_front()
    }

    /// Whether an ask of `to` waits: a newer one than the ask being done
    /// for it, which it replaces (counted afresh by the asking node).
    pub(crate) fn has(&self, to: &str) -> bool {
        self.queue.lock().iter().any(|g| g.to == to)
    }

    /// Whether no ask waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.lock().is_empty()
    }

    /// Drops every ask (the node began to drain or stop).
    pub(crate) fn clear(&self) {
        self.queue.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(node: &str, held: usize) -> Load {
        Load {
            node: node.into(),
            address: format!("http://{node}:1"),
            held,
        }
    }

    #[test]
    fn a_new_node_asks_the_loaded_ones_for_their_excess_up_to_its_share() {
        // 60 actors over three nodes: a share of 20.
        let others = [load("a", 35), load("b", 25)];
        let asked: Vec<(String, usize)> = asks(0, &others, 1_000)
            .into_iter()
            .map(|(l, k)| (l.node, k))
            .collect();
        assert_eq!(asked, vec![("a".into(), 15), ("b".into(), 5)]);
    }

    #[test]
    fn a_node_within_its_slack_or_with_nobody_above_the_share_asks_nothing() {
        // Share 20, slack 2: 18 or 19 held is fair, 17 is not.
        assert!(asks(19, &[load("a", 21), load("b", 20)], 100).is_empty());
        assert!(asks(18, &[load("a", 22), load("b", 20)], 100).is_empty());
        assert_eq!(asks(17, &[load("a", 23), load("b", 20)], 100).len(), 1);
        // Nobody holds more than the share: nothing to ask for.
        assert!(asks(0, &[load("a", 1), load("b", 0)], 100).is_empty());
        assert!(asks(0, &[], 100).is_empty());
    }

    #[test]
    fn one_ask_is_bounded_by_a_round_of_the_givers_moves() {
        let asked = asks(0, &[load("a", 1_000)], 100);
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].1, 100);
    }

    #[test]
    fn a_nodes_new_ask_replaces_its_earlier_one_and_the_queue_is_bounded() {
        let g = Gives::default();
        let give = |to: &str, count| Give {
            to: to.into(),
            address: String::new(),
            count,
            share: 0,
        };
        assert!(g.push(give("x", 5)));
        assert!(g.push(give("x", 3)));
        assert!(g.has("x") && !g.has("y"));
        assert_eq!(g.pop(), Some(give("x", 3)));
        assert_eq!(g.pop(), None);
        for i in 0..GIVES_QUEUED_MAX {
            assert!(g.push(give(&format!("n{i}"), 1)));
        }
        assert!(!g.push(give("late", 1)));
        assert!(g.push(give("n0", 2)), "a known node's ask still replaces");
    }
}
