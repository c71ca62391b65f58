//! Taking an actor (ADR 0020): the steps a node runs before it may act for an
//! actor, in their order.
//!
//! 1. If the node's lease does not let it act, stop. If it holds the actor
//!    already (restored under a generation it took), it is the owner.
//! 2. List the actor's holds (page by page) for the latest generation.
//! 3. Read that hold; if it names a node, read that node's lease
//!    ([`super::NodeViewReader`]).
//! 4. Decide ([`crate::hold::lease_view`], `plan_take`): forward to a live
//!    owner, or take the next generation, fencing a lapsed holder first.
//! 5. Fence: create the holder's next lease counter as `fenced`. If the key
//!    holds a live renewal, the holder is alive and the take is off.
//! 6. Create the hold, create-only: of two racers exactly one wins.
//! 7. Restore: the driver reads the actor's chain and reports back.
//!
//! Every failure ends the attempt ([`TakeOutcome::Failed`]); the caller gives
//! it up (drops the request or retries later). A hold created before a failed
//! restore is harmless: the next take by this node sees its own hold, not
//! loaded, and takes the next generation.

use std::collections::VecDeque;

use crate::config::ClusterConfig;
use crate::hold::{self, HoldRecord, TakePlan, hold_key, hold_record, lease_view, plan_take};
use crate::lease::{LeaseKey, LeaseRecord, NODES_PREFIX, NodeLeaseView, fence_write};

use super::KnownLeases;
use super::{
    BucketOp, BucketResult, CreateOnce, Created, Failure, NodeViewReader, Pages, decode_body,
};

/// What [`TakeMachine::poll_effect`] asks of its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TakeEffect {
    /// Perform this operation and pass its answer to [`TakeMachine::on_result`].
    Bucket(BucketOp),
    /// Notice: this node fenced `node`'s `epoch` (it learns so at its next
    /// renewal). For metrics and logs.
    Fenced { node: String, epoch: u64 },
    /// The hold is created: restore the actor (its latest snapshot and chain)
    /// and report with [`TakeMachine::on_restored`]. `takeover` says the
    /// previous hold named another node or another epoch of this one.
    Restore { generation: u64, takeover: bool },
    /// The machine's outcome. Emitted once.
    Done(TakeOutcome),
}

/// How a take ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TakeOutcome {
    /// The node held the actor already, restored under `generation`.
    Mine { generation: u64 },
    /// The node took the actor under `generation` and restored it.
    Taken { generation: u64 },
    /// `node` owns the actor: forward the request to it (or drop an alarm
    /// delivery: the owner has the alarm, committed and indexed).
    Forward { node: String },
    /// Only from a lookup ([`TakeMachine::lookup_only`]): no live node owns
    /// the actor, and the lookup wrote nothing (a take would have). A
    /// lookup that finds this node's own hold of its epoch answers
    /// `Forward` with this node's id.
    Free,
    /// The attempt failed; the caller gives it up.
    Failed(Failure),
}

/// Where a take stands, for logs and for drivers that place crash points
/// between steps (the simulator).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakeStep {
    /// Checking the lease and the local claim.
    Start,
    /// Listing the actor's holds.
    ListHolds,
    /// Reading the latest hold.
    ReadHold,
    /// Reading the lease of the node the hold names.
    ReadHolderLease,
    /// Fencing the holder's lapsed lease.
    Fence,
    /// Creating the hold.
    CreateHold,
    /// Waiting for the driver's restore.
    Restore,
    /// Finished.
    Finished,
}

/// What the take decided to create, kept until it is done.
#[derive(Clone, Copy, Debug)]
struct Planned {
    generation: u64,
    takeover: bool,
}

#[derive(Clone, Debug)]
enum Phase {
    Start,
    ListHolds {
        pages: Pages,
        latest: Option<u64>,
    },
    ReadHold {
        generation: u64,
    },
    ReadHolderLease {
        latest: (u64, HoldRecord),
        reader: Box<NodeViewReader>,
    },
    Fence {
        planned: Planned,
        lapsed: LeaseKey,
        create: CreateOnce,
    },
    CreateHold {
        planned: Planned,
        create: CreateOnce,
    },
    Restore {
        planned: Planned,
    },
    Finished(Option<TakeOutcome>),
}

/// Takes one actor for this node. Create one per attempt; drive it until
/// [`TakeEffect::Done`].
#[derive(Clone, Debug)]
pub struct TakeMachine {
    me: String,
    epoch: u64,
    root: String,
    loaded: Option<u64>,
    nonce: u64,
    config: ClusterConfig,
    phase: Phase,
    awaiting: bool,
    notices: VecDeque<TakeEffect>,
    /// The address the holder's live lease record advertises, once read.
    holder_address: Option<String>,
    /// The node's kept lease records, if its driver shares them.
    known: Option<std::sync::Arc<KnownLeases>>,
    /// Find the owner, write nothing ([`TakeMachine::lookup_only`]).
    lookup: bool,
}

impl TakeMachine {
    /// An attempt by `me`, in its start `epoch`, to act for the actor whose
    /// folder is `actor_root` (ending in `/`). `loaded` is the generation
    /// under which the node has the actor restored, if it does. `nonce` goes
    /// into the records this attempt may write (a fence and a hold, at
    /// different keys), so that it can tell them from another writer's.
    pub fn new(
        me: &str,
        epoch: u64,
        actor_root: &str,
        loaded: Option<u64>,
        nonce: u64,
        config: ClusterConfig,
    ) -> TakeMachine {
        TakeMachine {
            me: me.to_owned(),
            epoch,
            root: actor_root.to_owned(),
            loaded,
            nonce,
            config,
            phase: Phase::Start,
            awaiting: false,
            notices: VecDeque::new(),
            holder_address: None,
            known: None,
            lookup: false,
        }
    }

    /// Makes this attempt a lookup: it reads what a take reads and ends
    /// where a take would write (a fence or a hold) with
    /// [`TakeOutcome::Free`]. A node that is draining looks up the owner of
    /// an actor it does not hold, to forward a request there or, if no live
    /// node has it, to another node, which takes it.
    pub fn lookup_only(mut self) -> TakeMachine {
        self.lookup = true;
        self
    }

    /// Shares the node's kept lease records: a holder whose record there
    /// shows it live in the hold's epoch is forwarded to without a read,
    /// and a live record this take reads is kept ([`KnownLeases`]).
    pub fn with_known_leases(mut self, known: std::sync::Arc<KnownLeases>) -> TakeMachine {
        self.known = Some(known);
        self
    }

    /// After [`TakeOutcome::Forward`]: the address the owner advertised in
    /// the lease record the take judged it by, where the driver forwards
    /// the request. `None` before the holder's lease was read.
    pub fn forward_address(&self) -> Option<&str> {
        self.holder_address.as_deref()
    }

    /// The step the take is at.
    pub fn step(&self) -> TakeStep {
        match self.phase {
            Phase::Start => TakeStep::Start,
            Phase::ListHolds { .. } => TakeStep::ListHolds,
            Phase::ReadHold { .. } => TakeStep::ReadHold,
            Phase::ReadHolderLease { .. } => TakeStep::ReadHolderLease,
            Phase::Fence { .. } => TakeStep::Fence,
            Phase::CreateHold { .. } => TakeStep::CreateHold,
            Phase::Restore { .. } => TakeStep::Restore,
            Phase::Finished(_) => TakeStep::Finished,
        }
    }

    /// The next effect, or `None` while the machine waits for a result.
    /// `acting_epoch` is the epoch in which the node's lease lets it act now
    /// ([`super::NodeLeaseMachine::acting_epoch`]); writes happen only while it
    /// is this take's epoch.
    pub fn poll_effect(&mut self, acting_epoch: Option<u64>) -> Option<TakeEffect> {
        if let Some(notice) = self.notices.pop_front() {
            return Some(notice);
        }
        if self.awaiting {
            return None;
        }
        let acting = acting_epoch == Some(self.epoch);
        if let Phase::Start = self.phase {
            if !acting {
                return Some(self.finish(TakeOutcome::Failed(Failure::NotActing)));
            }
            if let Some(generation) = self.loaded {
                return Some(self.finish(TakeOutcome::Mine { generation }));
            }
            let pages = Pages::new(
                format!("{}{}", self.root, hold::HOLD_FOLDER),
                self.config.list_page_keys_max,
            );
            self.phase = Phase::ListHolds {
                pages,
                latest: None,
            };
        }
        let effect = match &mut self.phase {
            Phase::Start => unreachable!("left above"),
            Phase::ListHolds { pages, .. } => TakeEffect::Bucket(pages.op()),
            Phase::ReadHold { generation } => TakeEffect::Bucket(BucketOp::Get {
                key: format!("{}{}", self.root, hold_key(*generation)),
            }),
            Phase::ReadHolderLease { reader, .. } => {
                TakeEffect::Bucket(reader.next_op().expect("the reader waits for nothing"))
            }
            Phase::Fence { create, .. } | Phase::CreateHold { create, .. } => {
                if !acting {
                    return Some(self.finish(TakeOutcome::Failed(Failure::NotActing)));
                }
                TakeEffect::Bucket(create.op())
            }
            Phase::Restore { planned } => TakeEffect::Restore {
                generation: planned.generation,
                takeover: planned.takeover,
            },
            Phase::Finished(outcome) => return outcome.take().map(TakeEffect::Done),
        };
        self.awaiting = true;
        Some(effect)
    }

    /// Takes the answer to the last [`TakeEffect::Bucket`]; `now_ms` is the
    /// node's clock, by which a holder's lease is judged.
    pub fn on_result(&mut self, result: BucketResult, now_ms: u64) {
        if matches!(self.phase, Phase::Restore { .. }) || !std::mem::take(&mut self.awaiting) {
            debug_assert!(false, "a result without an operation");
            return;
        }
        match &mut self.phase {
            Phase::ListHolds { pages, latest } => {
                let BucketResult::Keys(keys) = result else {
                    return self.fail(Failure::Bucket);
                };
                let root = &self.root;
                let page_latest =
                    hold::latest_generation(keys.iter().filter_map(|k| k.strip_prefix(root)));
                *latest = (*latest).max(page_latest);
                if pages.on_page(&keys) {
                    match *latest {
                        Some(generation) => self.phase = Phase::ReadHold { generation },
                        None => self.plan(None, &NodeLeaseView::Absent),
                    }
                }
            }
            Phase::ReadHold { generation } => {
                let generation = *generation;
                self.on_hold(generation, result, now_ms);
            }
            Phase::ReadHolderLease { latest, reader } => {
                reader.on_result(result, now_ms);
                self.holder_address = reader.address().map(str::to_owned);
                if let (Some(known), Some(key), Some(address), Some(expires)) = (
                    &self.known,
                    reader.read_key(),
                    reader.address(),
                    reader.expires_at_ms(),
                ) {
                    known.learn(key, expires, address, now_ms);
                }
                match reader.take_result() {
                    None => {}
                    Some(Ok(view)) => {
                        if let (Some(known), (_, HoldRecord::Held { node, .. })) =
                            (&self.known, &*latest)
                        {
                            known.learn_view(node, &view);
                        }
                        let latest = latest.clone();
                        self.plan(Some(latest), &view);
                    }
                    Some(Err(failure)) => self.fail(failure),
                }
            }
            Phase::Fence {
                planned,
                lapsed,
                create,
            } => match create.on_result(result) {
                None => {}
                Some(Created::Mine) => {
                    if let Some(known) = &self.known {
                        known.learn_over_below(&lapsed.node, lapsed.epoch + 1);
                    }
                    self.notices.push_back(TakeEffect::Fenced {
                        node: lapsed.node.clone(),
                        epoch: lapsed.epoch,
                    });
                    let planned = *planned;
                    self.create_hold(planned);
                }
                Some(Created::Theirs(body)) => {
                    // Someone else fenced the epoch first, or its holder
                    // released it: the epoch is over all the same. A live
                    // record is the holder's renewal: it lives.
                    match decode_body(&body, LeaseRecord::decode) {
                        Some(LeaseRecord::Fenced { .. } | LeaseRecord::Released { .. }) => {
                            let planned = *planned;
                            self.create_hold(planned);
                        }
                        _ => self.fail(Failure::HolderAlive),
                    }
                }
                Some(Created::Failed) => self.fail(Failure::Bucket),
            },
            Phase::CreateHold { planned, create } => match create.on_result(result) {
                None => {}
                Some(Created::Mine) => {
                    self.phase = Phase::Restore { planned: *planned };
                }
                Some(Created::Theirs(_)) => self.fail(Failure::LostRace),
                Some(Created::Failed) => self.fail(Failure::Bucket),
            },
            Phase::Start | Phase::Restore { .. } | Phase::Finished(_) => {}
        }
    }

    /// Step 3: the latest hold, read. A live holder's lease is read next,
    /// unless a kept record already shows it live in the hold's epoch, or
    /// an earlier read showed that epoch over for good.
    fn on_hold(&mut self, generation: u64, result: BucketResult, now_ms: u64) {
        let BucketResult::Body(body) = result else {
            return self.fail(Failure::Bucket);
        };
        let Some(record) = decode_body(&body, HoldRecord::decode) else {
            return self.fail(Failure::Malformed);
        };
        match &record {
            HoldRecord::Held { node, epoch, .. } => {
                let known = self.known.as_ref().filter(|_| *node != self.me);
                if known.is_some_and(|k| k.is_over(node, *epoch)) {
                    // Whatever a read would show now, it is not this epoch
                    // live: the hold is dead, as with no lease at all.
                    return self.plan(Some((generation, record)), &NodeLeaseView::Absent);
                }
                if let Some(address) =
                    known.and_then(|k| k.valid(node, *epoch, now_ms, &self.config))
                {
                    self.holder_address = Some(address);
                    let view = NodeLeaseView::Valid { epoch: *epoch };
                    return self.plan(Some((generation, record)), &view);
                }
                let reader = NodeViewReader::for_hold(node, *epoch, self.config.clone());
                self.phase = Phase::ReadHolderLease {
                    latest: (generation, record),
                    reader: Box::new(reader),
                };
            }
            // A released hold names no owner; whose lease is moot.
            HoldRecord::Released { .. } => {
                self.plan(Some((generation, record)), &NodeLeaseView::Absent)
            }
        }
    }

    /// The driver's restore after [`TakeEffect::Restore`]: `restored` says
    /// whether the node now has the actor's state.
    pub fn on_restored(&mut self, restored: bool) {
        let Phase::Restore { planned } = self.phase else {
            debug_assert!(false, "a restore that was not asked for");
            return;
        };
        self.awaiting = false;
        assert!(planned.generation >= 1, "a hold of generation 0");
        self.phase = Phase::Finished(Some(if restored {
            TakeOutcome::Taken {
                generation: planned.generation,
            }
        } else {
            TakeOutcome::Failed(Failure::Restore)
        }));
    }

    /// Step 4: the decision, from the latest hold and its node's lease.
    fn plan(&mut self, latest: Option<(u64, HoldRecord)>, holder: &NodeLeaseView) {
        let view = lease_view(latest.as_ref().map(|(g, r)| (*g, r)), holder);
        let latest_generation = latest.as_ref().map_or(0, |(g, _)| *g);
        let (generation, fence) = match plan_take(&self.me, self.epoch, self.loaded, &view) {
            TakePlan::Mine { generation } => {
                // Mine only as the latest hold, written by this node in
                // this epoch, of the very generation it has loaded.
                assert_eq!(Some(generation), self.loaded, "mine but not loaded");
                assert_eq!(
                    generation, latest_generation,
                    "mine but not the latest hold"
                );
                self.phase = Phase::Finished(Some(TakeOutcome::Mine { generation }));
                return;
            }
            TakePlan::Forward { node } => {
                self.phase = Phase::Finished(Some(TakeOutcome::Forward { node }));
                return;
            }
            TakePlan::Take { .. } if self.lookup => {
                // A hold of this node in this epoch that it has not loaded
                // (a release that failed) is its own: a take would write
                // the next generation over it without a fence.
                let mine = matches!(
                    &latest,
                    Some((_, HoldRecord::Held { node, epoch, .. }))
                        if *node == self.me && *epoch == self.epoch
                );
                let outcome = if mine {
                    TakeOutcome::Forward {
                        node: self.me.clone(),
                    }
                } else {
                    TakeOutcome::Free
                };
                self.phase = Phase::Finished(Some(outcome));
                return;
            }
            TakePlan::Take { generation, fence } => (generation, fence),
        };
        // A take writes exactly the next generation: it never skips one
        // (a reader would see a gap) nor writes over one (create-only).
        assert_eq!(
            generation,
            latest_generation + 1,
            "a take that is not the next hold"
        );

        let takeover = matches!(
            &latest,
            Some((_, HoldRecord::Held { node, epoch, .. }))
                if *node != self.me || *epoch != self.epoch
        );
        let planned = Planned {
            generation,
            takeover,
        };
        match fence {
            Some(lapsed) => {
                let write = fence_write(&lapsed, &self.me, self.nonce);
                let create = CreateOnce::new(
                    write.key.to_key(NODES_PREFIX),
                    write.record.encode().into_bytes(),
                );
                self.phase = Phase::Fence {
                    planned,
                    lapsed,
                    create,
                };
            }
            None => self.create_hold(planned),
        }
    }

    fn create_hold(&mut self, planned: Planned) {
        let record = hold_record(&self.me, self.epoch, self.nonce, false);
        let create = CreateOnce::new(
            format!("{}{}", self.root, hold_key(planned.generation)),
            record.encode().into_bytes(),
        );
        self.phase = Phase::CreateHold { planned, create };
    }

    fn fail(&mut self, failure: Failure) {
        self.phase = Phase::Finished(Some(TakeOutcome::Failed(failure)));
    }

    fn finish(&mut self, outcome: TakeOutcome) -> TakeEffect {
        self.phase = Phase::Finished(None);
        TakeEffect::Done(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::LeaseKey;
    use crate::machine::testing::MapBucket;

    const ROOT: &str = "state/t/app/room/6131/";

    fn hold_at(g: u64) -> String {
        format!("{ROOT}{}", hold_key(g))
    }

    fn lease_at(node: &str, epoch: u64, counter: u64) -> String {
        LeaseKey {
            node: node.into(),
            epoch,
            counter,
        }
        .to_key(NODES_PREFIX)
    }

    /// Drives a take to its end; `before` may change the bucket just before
    /// each operation lands (a racer), `restored` is the restore's result.
    fn drive(
        m: &mut TakeMachine,
        b: &mut MapBucket,
        now: u64,
        mut before: impl FnMut(&BucketOp, &mut MapBucket) -> Option<BucketResult>,
    ) -> (TakeOutcome, Vec<TakeEffect>) {
        let mut notices = Vec::new();
        loop {
            match m.poll_effect(Some(m.epoch)).expect("an effect") {
                TakeEffect::Bucket(op) => {
                    let res = before(&op, b).unwrap_or_else(|| b.perform(op));
                    m.on_result(res, now);
                }
                TakeEffect::Done(outcome) => return (outcome, notices),
                restore @ TakeEffect::Restore { .. } => {
                    notices.push(restore);
                    m.on_restored(true);
                }
                notice => notices.push(notice),
            }
        }
    }

    /// The requests made of `nodes/` so far (lease listings and reads).
    fn reads_of_nodes(b: &MapBucket) -> usize {
        b.log
            .iter()
            .filter(|op| match op {
                BucketOp::List { prefix, .. } => prefix.starts_with(NODES_PREFIX),
                BucketOp::Get { key } => key.starts_with(NODES_PREFIX),
                _ => false,
            })
            .count()
    }

    fn machine(me: &str, epoch: u64, loaded: Option<u64>) -> TakeMachine {
        TakeMachine::new(me, epoch, ROOT, loaded, 7, ClusterConfig::default())
    }

    #[test]
    fn takes_a_free_actor_and_asks_for_a_restore() {
        let mut b = MapBucket::default();
        let mut m = machine("a", 1, None);
        assert_eq!(m.step(), TakeStep::Start);
        let first = m.poll_effect(Some(1));
        assert!(matches!(
            first,
            Some(TakeEffect::Bucket(BucketOp::List { .. }))
        ));
        assert_eq!(m.poll_effect(Some(1)), None, "one operation at a time");
        m.on_result(BucketResult::Keys(vec![]), 0);
        assert_eq!(m.step(), TakeStep::CreateHold);
        let Some(TakeEffect::Bucket(op)) = m.poll_effect(Some(1)) else {
            panic!()
        };
        assert_eq!(op.key(), hold_at(1));
        let res = b.perform(op);
        m.on_result(res, 0);
        assert_eq!(
            m.poll_effect(Some(1)),
            Some(TakeEffect::Restore {
                generation: 1,
                takeover: false
            })
        );
        assert_eq!(m.poll_effect(Some(1)), None, "waits for the restore");
        m.on_restored(true);
        assert_eq!(
            m.poll_effect(Some(1)),
            Some(TakeEffect::Done(TakeOutcome::Taken { generation: 1 }))
        );
        assert_eq!(m.poll_effect(Some(1)), None);
        assert_eq!(b.body(&hold_at(1)).unwrap(), "held a 1 0000000000000007");
    }

    #[test]
    fn a_loaded_actor_is_mine_without_reading_the_bucket() {
        let mut m = machine("a", 1, Some(4));
        assert_eq!(
            m.poll_effect(Some(1)),
            Some(TakeEffect::Done(TakeOutcome::Mine { generation: 4 }))
        );
    }

    #[test]
    fn a_node_that_cannot_act_takes_nothing() {
        for acting in [None, Some(2)] {
            let mut m = machine("a", 1, None);
            assert_eq!(
                m.poll_effect(acting),
                Some(TakeEffect::Done(TakeOutcome::Failed(Failure::NotActing)))
            );
        }
        // The lease lapses between the plan and the hold: no hold is written.
        let mut m = machine("a", 1, None);
        m.poll_effect(Some(1));
        m.on_result(BucketResult::Keys(vec![]), 0);
        assert_eq!(
            m.poll_effect(None),
            Some(TakeEffect::Done(TakeOutcome::Failed(Failure::NotActing)))
        );
    }

    #[test]
    fn a_live_owner_is_forwarded_to() {
        let mut b = MapBucket::default();
        b.put(&hold_at(3), "held b 2 0000000000000001");
        b.put(
            &lease_at("b", 2, 5),
            "live 10000 0000000000000001 http://n:1",
        );
        let mut m = machine("a", 1, None);
        let (outcome, _) = drive(&mut m, &mut b, 5_000, |_, _| None);
        assert_eq!(outcome, TakeOutcome::Forward { node: "b".into() });
        assert_eq!(m.forward_address(), Some("http://n:1"));
    }

    #[test]
    fn a_kept_live_record_forwards_without_reading_the_lease_again() {
        let mut b = MapBucket::default();
        b.put(&hold_at(3), "held b 2 0000000000000001");
        b.put(
            &lease_at("b", 2, 5),
            "live 10000 0000000000000001 http://n:1",
        );
        let known = std::sync::Arc::new(KnownLeases::new());
        let mut m = machine("a", 1, None).with_known_leases(known.clone());
        let (outcome, _) = drive(&mut m, &mut b, 5_000, |_, _| None);
        assert_eq!(outcome, TakeOutcome::Forward { node: "b".into() });
        assert_eq!((reads_of_nodes(&b), known.len()), (2, 1));
        // The next take of an actor `b` holds reads only the hold.
        let mut m = machine("a", 1, None).with_known_leases(known.clone());
        let (outcome, _) = drive(&mut m, &mut b, 6_000, |_, _| None);
        assert_eq!(outcome, TakeOutcome::Forward { node: "b".into() });
        assert_eq!(m.forward_address(), Some("http://n:1"));
        assert_eq!(reads_of_nodes(&b), 2);
        // Past the record's expiry plus grace the lease is read again, and
        // the lapsed holder is fenced: what is kept never takes an actor.
        let mut m = machine("a", 1, None).with_known_leases(known.clone());
        let (outcome, _) = drive(&mut m, &mut b, 15_000, |_, _| None);
        assert_eq!(outcome, TakeOutcome::Taken { generation: 4 });
        assert_eq!(reads_of_nodes(&b), 4);
    }

    /// An epoch a read showed over (its node started again) or that a take
    /// fenced is over whenever a hold of it is met again: the take reads no
    /// lease. A lapsed epoch is not over (its node may only be slow): it is
    /// read each time until it is fenced.
    #[test]
    fn an_epoch_read_over_is_not_read_again_but_a_lapsed_one_is() {
        let mut b = MapBucket::default();
        let known = std::sync::Arc::new(KnownLeases::new());
        let take_at = |b: &mut MapBucket, now| {
            let mut m = machine("a", 1, None).with_known_leases(known.clone());
            drive(&mut m, b, now, |_, _| None).0
        };
        // `b` started again: its epoch 3 is live, its epoch 2 over.
        b.put(&hold_at(3), "held b 2 0000000000000001");
        b.put(
            &lease_at("b", 3, 0),
            "live 100000 0000000000000001 http://n:2",
        );
        assert_eq!(take_at(&mut b, 5_000), TakeOutcome::Taken { generation: 4 });
        assert_eq!(reads_of_nodes(&b), 2);
        b.put(&hold_at(5), "held b 2 0000000000000002");
        assert_eq!(take_at(&mut b, 5_000), TakeOutcome::Taken { generation: 6 });
        assert_eq!(reads_of_nodes(&b), 2, "epoch 2 of b is known over");
        // `c`'s epoch 1 lapsed: a lookup reads it (and fences nothing),
        // each time.
        b.put(&hold_at(7), "held c 1 0000000000000001");
        b.put(
            &lease_at("c", 1, 0),
            "live 1000 0000000000000001 http://n:3",
        );
        for reads in [4, 6] {
            let mut m = machine("a", 1, None)
                .with_known_leases(known.clone())
                .lookup_only();
            assert_eq!(
                drive(&mut m, &mut b, 20_000, |_, _| None).0,
                TakeOutcome::Free
            );
            assert_eq!(
                reads_of_nodes(&b),
                reads,
                "a lapsed epoch is read each time"
            );
        }
        // A take reads it and fences it: over from then on.
        assert_eq!(
            take_at(&mut b, 20_000),
            TakeOutcome::Taken { generation: 8 }
        );
        assert_eq!(reads_of_nodes(&b), 8);
        b.put(&hold_at(9), "held c 1 0000000000000002");
        assert_eq!(
            take_at(&mut b, 20_000),
            TakeOutcome::Taken { generation: 10 }
        );
        assert_eq!(reads_of_nodes(&b), 8, "a fenced epoch is known over");
    }

    #[test]
    fn a_hold_of_another_epoch_or_a_forgotten_node_is_read() {
        let mut b = MapBucket::default();
        b.put(&hold_at(3), "held b 3 0000000000000001");
        b.put(
            &lease_at("b", 3, 0),
            "live 10000 0000000000000001 http://n:2",
        );
        let known = std::sync::Arc::new(KnownLeases::new());
        // Kept: `b`'s epoch 2. The hold is of epoch 3: read.
        known.learn(
            &LeaseKey {
                node: "b".into(),
                epoch: 2,
                counter: 9,
            },
            10_000,
            "http://n:1",
            0,
        );
        let mut m = machine("a", 1, None).with_known_leases(known.clone());
        drive(&mut m, &mut b, 5_000, |_, _| None);
        assert_eq!(m.forward_address(), Some("http://n:2"));
        let lease_reads = b.log.len();
        known.forget("b");
        let mut m = machine("a", 1, None).with_known_leases(known.clone());
        drive(&mut m, &mut b, 5_000, |_, _| None);
        assert_eq!(
            b.log.len(),
            lease_reads + 4,
            "a forgotten node's lease is read"
        );
    }

    #[test]
    fn a_lookup_finds_the_owner_or_writes_nothing() {
        let mut b = MapBucket::default();
        b.put(&hold_at(3), "held b 2 0000000000000001");
        b.put(
            &lease_at("b", 2, 5),
            "live 10000 0000000000000001 http://n:1",
        );
        let mut m = machine("a", 1, None).lookup_only();
        let (outcome, _) = drive(&mut m, &mut b, 5_000, |_, _| None);
        assert_eq!(outcome, TakeOutcome::Forward { node: "b".into() });
        // Lapsed: a take would fence it and write a hold; a lookup writes
        // neither.
        let before = b.objects.len();
        let mut m = machine("a", 1, None).lookup_only();
        let (outcome, notices) = drive(&mut m, &mut b, 15_000, |_, _| None);
        assert_eq!((outcome, notices), (TakeOutcome::Free, vec![]));
        assert_eq!(b.objects.len(), before);
        assert!(b.log.iter().all(|op| !op.is_write()));
        // This node's own hold of its epoch, not loaded (a release that
        // failed): the lookup names this node.
        let mut b = MapBucket::default();
        b.put(&hold_at(3), "held a 1 0000000000000001");
        b.put(
            &lease_at("a", 1, 5),
            "live 10000 0000000000000001 http://me:1",
        );
        let mut m = machine("a", 1, None).lookup_only();
        let (outcome, _) = drive(&mut m, &mut b, 5_000, |_, _| None);
        assert_eq!(outcome, TakeOutcome::Forward { node: "a".into() });
        assert!(b.log.iter().all(|op| !op.is_write()));
    }

    #[test]
    fn a_lapsed_owner_is_fenced_then_taken_over() {
        let mut b = MapBucket::default();
        b.put(&hold_at(3), "held b 2 0000000000000001");
        b.put(
            &lease_at("b", 2, 5),
            "live 10000 0000000000000001 http://n:1",
        );
        let mut m = machine("a", 1, None);
        let (outcome, notices) = drive(&mut m, &mut b, 15_000, |_, _| None);
        assert_eq!(outcome, TakeOutcome::Taken { generation: 4 });
        assert_eq!(
            notices[0],
            TakeEffect::Fenced {
                node: "b".into(),
                epoch: 2
            }
        );
        assert_eq!(
            b.body(&lease_at("b", 2, 6)).unwrap(),
            "fenced a 0000000000000007"
        );
        assert!(b.body(&hold_at(4)).unwrap().starts_with("held a 1 "));
    }

    #[test]
    fn a_holder_that_renews_first_keeps_its_actor() {
        let mut b = MapBucket::default();
        b.put(&hold_at(3), "held b 2 0000000000000001");
        b.put(
            &lease_at("b", 2, 5),
            "live 10000 0000000000000001 http://n:1",
        );
        // b's renewal lands just before the fence.
        let (outcome, _) = drive(&mut machine("a", 1, None), &mut b, 15_000, |op, b| {
            if matches!(op, BucketOp::PutCreate { key, .. } if *key == lease_at("b", 2, 6)) {
                b.put(
                    &lease_at("b", 2, 6),
                    "live 25000 0000000000000002 http://n:1",
                );
            }
            None
        });
        assert_eq!(outcome, TakeOutcome::Failed(Failure::HolderAlive));
        assert!(b.body(&hold_at(4)).is_none());
        // Someone else's fence counts as a fence.
        let mut b2 = MapBucket::default();
        b2.put(&hold_at(3), "held b 2 0000000000000001");
        b2.put(
            &lease_at("b", 2, 5),
            "live 10000 0000000000000001 http://n:1",
        );
        b2.put(&lease_at("b", 2, 6), "fenced c 0000000000000003");
        // The reader sees counter 6 (fenced): the hold is dead, no fence needed.
        let (outcome, notices) = drive(&mut machine("a", 1, None), &mut b2, 15_000, |_, _| None);
        assert_eq!(outcome, TakeOutcome::Taken { generation: 4 });
        assert!(
            !notices
                .iter()
                .any(|n| matches!(n, TakeEffect::Fenced { .. }))
        );
    }

    #[test]
    fn a_lost_race_for_the_hold_gives_up_but_its_own_retried_write_wins() {
        let mut b = MapBucket::default();
        let (outcome, _) = drive(&mut machine("a", 1, None), &mut b, 0, |op, b| {
            if op.is_write() {
                b.put(&hold_at(1), "held c 9 0000000000000009");
            }
            None
        });
        assert_eq!(outcome, TakeOutcome::Failed(Failure::LostRace));
        assert_eq!(b.body(&hold_at(1)).unwrap(), "held c 9 0000000000000009");
        // A create retried after a lost response finds its own bytes: taken.
        let mut b = MapBucket::default();
        let (outcome, _) = drive(&mut machine("a", 1, None), &mut b, 0, |op, b| {
            if let BucketOp::PutCreate { key, body } = op {
                b.objects.insert(key.clone(), body.clone());
                return Some(BucketResult::AlreadyExists);
            }
            None
        });
        assert_eq!(outcome, TakeOutcome::Taken { generation: 1 });
    }

    #[test]
    fn bucket_errors_and_malformed_holds_fail_the_attempt() {
        for failing in 0..3 {
            let mut b = MapBucket::default();
            b.put(&hold_at(3), "held b 2 0000000000000001");
            b.put(
                &lease_at("b", 2, 5),
                "live 10000 0000000000000001 http://n:1",
            );
            let mut n = 0;
            let (outcome, _) = drive(&mut machine("a", 1, None), &mut b, 15_000, |_, _| {
                n += 1;
                (n == failing + 1).then_some(BucketResult::Failed)
            });
            assert_eq!(outcome, TakeOutcome::Failed(Failure::Bucket), "{failing}");
        }
        let mut b = MapBucket::default();
        b.put(&hold_at(3), "held B 2 0000000000000001");
        let (outcome, _) = drive(&mut machine("a", 1, None), &mut b, 0, |_, _| None);
        assert_eq!(outcome, TakeOutcome::Failed(Failure::Malformed));
        // A failed restore fails the take; the hold stays, harmlessly.
        let mut m = machine("a", 1, None);
        m.poll_effect(Some(1));
        m.on_result(BucketResult::Keys(vec![]), 0);
        m.poll_effect(Some(1));
        m.on_result(BucketResult::Done, 0);
        assert!(matches!(
            m.poll_effect(Some(1)),
            Some(TakeEffect::Restore { .. })
        ));
        m.on_restored(false);
        assert_eq!(
            m.poll_effect(Some(1)),
            Some(TakeEffect::Done(TakeOutcome::Failed(Failure::Restore)))
        );
    }

    #[test]
    fn released_and_dead_holds_are_taken_at_once_and_own_holds_again() {
        let mut b = MapBucket::default();
        b.put(&hold_at(2), "released b 2 0000000000000001");
        let (outcome, _) = drive(&mut machine("a", 1, None), &mut b, 0, |_, _| None);
        assert_eq!(outcome, TakeOutcome::Taken { generation: 3 });
        // A hold of this node's previous epoch is dead: taken, as a takeover.
        let mut b = MapBucket::default();
        b.put(&hold_at(5), "held a 1 0000000000000001");
        b.put(
            &lease_at("a", 2, 0),
            "live 10000 0000000000000001 http://n:1",
        );
        let (outcome, notices) = drive(&mut machine("a", 2, None), &mut b, 0, |_, _| None);
        assert_eq!(outcome, TakeOutcome::Taken { generation: 6 });
        assert_eq!(
            notices,
            vec![TakeEffect::Restore {
                generation: 6,
                takeover: true
            }]
        );
        // Its own live hold, not loaded (given up): the next generation.
        let mut b = MapBucket::default();
        b.put(&hold_at(5), "held a 2 0000000000000001");
        b.put(
            &lease_at("a", 2, 0),
            "live 10000 0000000000000001 http://n:1",
        );
        let (outcome, _) = drive(&mut machine("a", 2, None), &mut b, 0, |_, _| None);
        assert_eq!(outcome, TakeOutcome::Taken { generation: 6 });
    }

    #[test]
    fn holds_are_read_page_by_page() {
        let mut b = MapBucket::default();
        for g in 1..=5 {
            b.put(&hold_at(g), "released b 2 0000000000000001");
        }
        let config = ClusterConfig {
            list_page_keys_max: 2,
            ..ClusterConfig::default()
        };
        let mut m = TakeMachine::new("a", 1, ROOT, None, 7, config);
        let (outcome, _) = drive(&mut m, &mut b, 0, |_, _| None);
        assert_eq!(outcome, TakeOutcome::Taken { generation: 6 });
        let lists = b
            .log
            .iter()
            .filter(|op| matches!(op, BucketOp::List { .. }))
            .count();
        assert_eq!(lists, 3);
    }
}
