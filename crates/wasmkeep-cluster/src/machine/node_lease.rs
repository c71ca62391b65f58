//! This node's own lease (ADR 0020) as a machine: register, renew every third
//! of the lease period, learn that the epoch was fenced or has lapsed, and
//! release it at a clean shutdown.
//!
//! The rules of one record (its expiry, the margin, what a conflicting record
//! means) are `NodeLease`'s, in [`crate::lease`]; this machine adds the loop
//! around them: when to write, what to do with each answer, which old records
//! to delete, and when the epoch is over.
//!
//! A driver keeps one machine per start of the node. It performs
//! [`LeaseEffect::Bucket`] and feeds back the answer, performs
//! [`LeaseEffect::Detached`] without waiting, sleeps until
//! [`NodeLeaseMachine::poll_timeout`] and then calls
//! [`NodeLeaseMachine::handle_timeout`]. On [`LeaseEffect::EpochOver`] it drops
//! every actor it holds (without writing anything for them: another node may
//! own them already), persists the next epoch and starts a new machine with
//! it. Owner steps elsewhere ask [`NodeLeaseMachine::is_acting`] (or
//! `acting_epoch`) right before they write.

use std::collections::VecDeque;

use crate::config::ClusterConfig;
use crate::error::Error;
use crate::lease::{LeaseKey, LeaseRecord, LeaseState, LeaseWrite, NODES_PREFIX, NodeLease};

use super::{BucketOp, BucketResult, CreateOnce, Created, decode_body};

/// Why an epoch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochEnd {
    /// The node could not renew in time and stopped acting by its own clock.
    /// Another node may fence it and take its actors.
    Lapsed,
    /// Another node fenced this epoch: it may own this node's actors already.
    Fenced,
    /// The node released its lease (clean shutdown), or tried to.
    Released,
}

/// What [`NodeLeaseMachine::poll_effect`] asks of its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseEffect {
    /// Perform this operation and pass its answer to
    /// [`NodeLeaseMachine::on_result`].
    Bucket(BucketOp),
    /// Perform this operation whenever convenient and report nothing: this
    /// node's lease record two counters back, garbage now. Deleting it never
    /// races a writer, since no counter is written twice.
    Detached(BucketOp),
    /// Notice: a renewal landed; the node may act until `acting_until_ms` by
    /// its own clock. For metrics and logs.
    Renewed { counter: u64, acting_until_ms: u64 },
    /// The epoch is over: stop acknowledging writes, drop every actor, and
    /// start a new machine with a new epoch. Emitted once; the machine does
    /// nothing more.
    EpochOver(EpochEnd),
}

#[derive(Clone, Debug)]
enum Phase {
    /// Waiting for the clock: the next write is due at `next_at_ms`.
    Idle { next_at_ms: u64 },
    /// The registration or a renewal is in flight.
    Renewing {
        write: LeaseWrite,
        create: CreateOnce,
    },
    /// The release record is in flight.
    Releasing { create: CreateOnce },
    /// The epoch ended; `EpochOver` was queued.
    Over,
}

/// This node's lease for one start (epoch).
#[derive(Clone, Debug)]
pub struct NodeLeaseMachine {
    lease: NodeLease,
    config: ClusterConfig,
    phase: Phase,
    awaiting: bool,
    /// A release asked for while a renewal was in flight (its nonce).
    release_asked: Option<u64>,
    notices: VecDeque<LeaseEffect>,
}

impl NodeLeaseMachine {
    /// The lease of `node` in `epoch`, which must exceed every epoch the node
    /// used before (the driver keeps the last one in its data directory).
    /// Its live records carry `address`, where other nodes reach it. The
    /// registration is due at once.
    pub fn new(
        node: &str,
        epoch: u64,
        address: &str,
        config: ClusterConfig,
    ) -> Result<NodeLeaseMachine, Error> {
        Ok(NodeLeaseMachine {
            lease: NodeLease::new(node, epoch, address)?,
            config,
            phase: Phase::Idle { next_at_ms: 0 },
            awaiting: false,
            release_asked: None,
            notices: VecDeque::new(),
        })
    }

    /// The node id.
    pub fn node(&self) -> &str {
        self.lease.node()
    }

    /// This start's epoch.
    pub fn epoch(&self) -> u64 {
        self.lease.epoch()
    }

    /// Where the lease stands by the node's clock.
    pub fn state(&mut self, now_ms: u64) -> LeaseState {
        self.lease.state(now_ms)
    }

    /// Whether the node may act as owner now: its lease is valid by its own
    /// clock, with the margin, and it is not releasing it. Every owner step
    /// (a hold, a PUT, an upload, a delete) checks this right before it writes.
    pub fn is_acting(&mut self, now_ms: u64) -> bool {
        let releasing =
            self.release_asked.is_some() || matches!(self.phase, Phase::Releasing { .. });
        // An epoch that is over (a release that landed leaves the lease's
        // own state valid until it would have expired) acts no more.
        !releasing && !matches!(self.phase, Phase::Over) && self.lease.is_acting(now_ms)
    }

    /// The epoch in which the node may act now, if it may: what
    /// [`super::TakeMachine`] and [`super::ReleaseMachine`] check.
    pub fn acting_epoch(&mut self, now_ms: u64) -> Option<u64> {
        let acting = self.is_acting(now_ms).then(|| self.epoch());
        // The negative space: an epoch that is over (lapsed, fenced,
        // released) never acts again, whatever the clock says.
        assert!(
            acting.is_none() || !matches!(self.phase, Phase::Over),
            "acting in an epoch that is over"
        );
        acting
    }

    /// When the driver should call [`NodeLeaseMachine::handle_timeout`]: the
    /// next renewal, or the moment the node stops acting if that comes first
    /// (so that `EpochOver` is prompt). `None` once the epoch is over.
    pub fn poll_timeout(&self) -> Option<u64> {
        let acting_until = self.lease.acting_until_ms();
        match self.phase {
            Phase::Over => None,
            Phase::Idle { next_at_ms } => {
                Some(acting_until.map_or(next_at_ms, |t| t.min(next_at_ms)))
            }
            Phase::Renewing { .. } | Phase::Releasing { .. } => acting_until,
        }
    }

    /// The clock reached a time [`NodeLeaseMachine::poll_timeout`] asked for
    /// (or later). `nonce` goes into the renewal this may start.
    pub fn handle_timeout(&mut self, now_ms: u64, nonce: u64) {
        if self.check_lapse(now_ms) {
            return;
        }
        if let Phase::Idle { next_at_ms } = self.phase
            && now_ms >= next_at_ms
        {
            match self.lease.next_write(now_ms, nonce, &self.config) {
                Some(write) => {
                    // A node writes only its own epoch's records.
                    assert_eq!(write.key.epoch, self.epoch(), "a renewal for another epoch");
                    let create = CreateOnce::new(
                        write.key.to_key(NODES_PREFIX),
                        write.record.encode().into_bytes(),
                    );
                    self.phase = Phase::Renewing { write, create };
                }
                None => self.settle(now_ms),
            }
        }
    }

    /// The next effect, or `None` while the machine waits for a result or for
    /// its timeout.
    pub fn poll_effect(&mut self, now_ms: u64) -> Option<LeaseEffect> {
        self.check_lapse(now_ms);
        if let Some(notice) = self.notices.pop_front() {
            return Some(notice);
        }
        if self.awaiting {
            return None;
        }
        let op = match &self.phase {
            Phase::Renewing { create, .. } | Phase::Releasing { create } => create.op(),
            Phase::Idle { .. } | Phase::Over => return None,
        };
        self.awaiting = true;
        Some(LeaseEffect::Bucket(op))
    }

    /// Takes the answer to the last [`LeaseEffect::Bucket`]; `now_ms` is the
    /// node's clock when the answer arrived.
    pub fn on_result(&mut self, result: BucketResult, now_ms: u64) {
        if matches!(self.phase, Phase::Over) {
            // A late answer for an epoch that already ended: nothing to learn.
            self.awaiting = false;
            return;
        }
        if !std::mem::take(&mut self.awaiting) {
            debug_assert!(false, "a result without an operation");
            return;
        }
        match &mut self.phase {
            Phase::Renewing { write, create } => {
                let write = write.clone();
                match create.on_result(result) {
                    None => return,
                    Some(Created::Mine) => {
                        self.lease.on_written(&write, now_ms, &self.config);
                        self.notice_renewed(now_ms, write.key.counter);
                        if let Some(counter) = write.key.counter.checked_sub(2) {
                            let old = LeaseKey {
                                counter,
                                ..write.key.clone()
                            };
                            self.notices
                                .push_back(LeaseEffect::Detached(BucketOp::Delete {
                                    key: old.to_key(NODES_PREFIX),
                                }));
                        }
                    }
                    Some(Created::Theirs(body)) => {
                        // A fence, or an earlier attempt of this node whose
                        // response was lost (NodeLease::on_conflict tells).
                        if let Some(found) = decode_body(&body, LeaseRecord::decode) {
                            self.lease
                                .on_conflict(&write.key, &found, now_ms, &self.config);
                            self.notice_renewed(now_ms, write.key.counter);
                        }
                    }
                    Some(Created::Failed) => {}
                }
                self.settle(now_ms);
            }
            Phase::Releasing { create } => {
                if create.on_result(result).is_some() {
                    // Landed or not, the node stops: a release that failed
                    // only makes others wait for the lease to run out.
                    self.over(EpochEnd::Released);
                }
            }
            Phase::Idle { .. } | Phase::Over => {}
        }
    }

    /// Begins a clean shutdown's release: the node stops acting at once and
    /// writes `released` as its next record, so that other nodes may take its
    /// actors without waiting for the lease to run out. The driver releases
    /// the actors' holds first. Ends with `EpochOver(Released)`.
    pub fn release(&mut self, now_ms: u64, nonce: u64) {
        match self.phase {
            Phase::Renewing { .. } => self.release_asked = Some(nonce),
            Phase::Idle { .. } => self.start_release(now_ms, nonce),
            Phase::Releasing { .. } | Phase::Over => {}
        }
    }

    fn start_release(&mut self, now_ms: u64, nonce: u64) {
        match self.lease.state(now_ms) {
            LeaseState::Lapsed => self.over(EpochEnd::Lapsed),
            LeaseState::Fenced => self.over(EpochEnd::Fenced),
            LeaseState::Released => self.over(EpochEnd::Released),
            LeaseState::Starting | LeaseState::Valid { .. } => {
                let write = self.lease.release(nonce);
                let create = CreateOnce::new(
                    write.key.to_key(NODES_PREFIX),
                    write.record.encode().into_bytes(),
                );
                self.phase = Phase::Releasing { create };
            }
        }
    }

    /// After a write settled (or could not start): the epoch is over, or the
    /// machine waits for the next renewal.
    fn settle(&mut self, now_ms: u64) {
        if let Some(nonce) = self.release_asked.take() {
            self.phase = Phase::Idle { next_at_ms: now_ms };
            return self.start_release(now_ms, nonce);
        }
        self.phase = match self.lease.state(now_ms) {
            LeaseState::Fenced => return self.over(EpochEnd::Fenced),
            LeaseState::Lapsed => return self.over(EpochEnd::Lapsed),
            LeaseState::Released => return self.over(EpochEnd::Released),
            // The registration failed: try again soon.
            LeaseState::Starting => Phase::Idle {
                next_at_ms: now_ms + self.config.lease_register_retry_ms,
            },
            LeaseState::Valid { .. } => Phase::Idle {
                next_at_ms: self.lease.renew_at_ms(&self.config),
            },
        };
    }

    /// Ends the epoch if the node's clock passed the point where it stops
    /// acting; true if the epoch is over.
    fn check_lapse(&mut self, now_ms: u64) -> bool {
        if matches!(self.phase, Phase::Over) {
            return true;
        }
        if self.lease.state(now_ms) == LeaseState::Lapsed {
            self.over(EpochEnd::Lapsed);
            return true;
        }
        false
    }

    fn notice_renewed(&mut self, now_ms: u64, counter: u64) {
        if let LeaseState::Valid { acting_until_ms } = self.lease.state(now_ms) {
            self.notices.push_back(LeaseEffect::Renewed {
                counter,
                acting_until_ms,
            });
        }
    }

    fn over(&mut self, end: EpochEnd) {
        if matches!(self.phase, Phase::Over) {
            return;
        }
        self.phase = Phase::Over;
        self.awaiting = false;
        self.release_asked = None;
        self.notices.push_back(LeaseEffect::EpochOver(end));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::testing::MapBucket;

    fn key(counter: u64) -> String {
        LeaseKey {
            node: "a".into(),
            epoch: 1,
            counter,
        }
        .to_key(NODES_PREFIX)
    }

    /// Runs every effect the machine has at `now` against the bucket; returns
    /// the effects that were not bucket operations.
    fn run(m: &mut NodeLeaseMachine, b: &mut MapBucket, now: u64) -> Vec<LeaseEffect> {
        let mut notices = Vec::new();
        while let Some(effect) = m.poll_effect(now) {
            match effect {
                LeaseEffect::Bucket(op) => {
                    let res = b.perform(op);
                    m.on_result(res, now);
                }
                LeaseEffect::Detached(op) => {
                    b.perform(op.clone());
                    notices.push(LeaseEffect::Detached(op));
                }
                other => notices.push(other),
            }
        }
        notices
    }

    fn machine() -> NodeLeaseMachine {
        NodeLeaseMachine::new("a", 1, "http://n:1", ClusterConfig::default()).unwrap()
    }

    #[test]
    fn registers_renews_and_deletes_records_two_back() {
        let mut b = MapBucket::default();
        let mut m = machine();
        assert_eq!(m.poll_timeout(), Some(0));
        assert!(!m.is_acting(0));
        m.handle_timeout(0, 1);
        let notices = run(&mut m, &mut b, 0);
        assert_eq!(
            notices,
            vec![LeaseEffect::Renewed {
                counter: 0,
                acting_until_ms: 9_000
            }]
        );
        assert_eq!(m.acting_epoch(8_999), Some(1));
        assert_eq!(
            b.body(&key(0)).unwrap(),
            "live 10000 0000000000000001 http://n:1"
        );
        assert_eq!(m.poll_timeout(), Some(3_333));
        m.handle_timeout(3_333, 2);
        run(&mut m, &mut b, 3_333);
        m.handle_timeout(6_666, 3);
        let notices = run(&mut m, &mut b, 6_666);
        assert!(notices.contains(&LeaseEffect::Detached(BucketOp::Delete { key: key(0) })));
        assert!(b.body(&key(0)).is_none() && b.body(&key(2)).is_some());
        assert_eq!(m.acting_epoch(15_665), Some(1));
        assert_eq!(m.acting_epoch(15_666), None);
    }

    #[test]
    fn a_fence_that_wins_the_race_ends_the_epoch() {
        let mut b = MapBucket::default();
        let mut m = machine();
        m.handle_timeout(0, 1);
        run(&mut m, &mut b, 0);
        // Another node fenced counter 1 first (it saw the node lapsed).
        b.put(&key(1), "fenced b 0000000000000009");
        m.handle_timeout(3_333, 2);
        let notices = run(&mut m, &mut b, 3_333);
        assert_eq!(notices, vec![LeaseEffect::EpochOver(EpochEnd::Fenced)]);
        assert!(!m.is_acting(3_333));
        assert_eq!(m.poll_timeout(), None);
        m.handle_timeout(6_666, 3);
        assert_eq!(m.poll_effect(6_666), None, "the machine does nothing more");
    }

    #[test]
    fn its_own_record_found_after_a_lost_response_counts_as_written() {
        let mut b = MapBucket::default();
        let mut m = machine();
        m.handle_timeout(0, 1);
        // The registration lands, its response is lost.
        let Some(LeaseEffect::Bucket(op)) = m.poll_effect(0) else {
            panic!()
        };
        b.perform(op);
        m.on_result(BucketResult::Failed, 5);
        assert!(!m.is_acting(5));
        // Still starting: the registration is retried soon, at the same key.
        assert_eq!(m.poll_timeout(), Some(1_005));
        m.handle_timeout(1_005, 2);
        let notices = run(&mut m, &mut b, 1_005);
        // The earlier attempt's expiry (sent at 0) bounds acting, not this one's.
        assert_eq!(
            notices,
            vec![LeaseEffect::Renewed {
                counter: 0,
                acting_until_ms: 9_000
            }]
        );
    }

    #[test]
    fn failed_renewals_lapse_the_lease_at_its_margin() {
        let mut b = MapBucket::default();
        let mut m = machine();
        m.handle_timeout(0, 1);
        run(&mut m, &mut b, 0);
        for (t, nonce) in [(3_333, 2), (6_666, 3)] {
            assert_eq!(m.poll_timeout(), Some(t));
            m.handle_timeout(t, nonce);
            assert!(matches!(m.poll_effect(t), Some(LeaseEffect::Bucket(_))));
            m.on_result(BucketResult::Failed, t);
            assert!(m.is_acting(t));
        }
        // The next renewal would be at 9,999; the node stops acting at 9,000
        // and the timeout says so.
        assert_eq!(m.poll_timeout(), Some(9_000));
        m.handle_timeout(9_000, 4);
        assert_eq!(
            m.poll_effect(9_000),
            Some(LeaseEffect::EpochOver(EpochEnd::Lapsed))
        );
        assert_eq!(m.poll_effect(9_000), None);
    }

    #[test]
    fn a_lapse_during_a_renewal_in_flight_ends_the_epoch_and_ignores_the_answer() {
        let mut b = MapBucket::default();
        let mut m = machine();
        m.handle_timeout(0, 1);
        run(&mut m, &mut b, 0);
        m.handle_timeout(3_333, 2);
        assert!(matches!(m.poll_effect(3_333), Some(LeaseEffect::Bucket(_))));
        // The answer takes until after the margin.
        assert_eq!(
            m.poll_effect(9_000),
            Some(LeaseEffect::EpochOver(EpochEnd::Lapsed))
        );
        m.on_result(BucketResult::Done, 9_100);
        assert!(!m.is_acting(9_100));
        assert_eq!(m.poll_effect(9_100), None);
    }

    #[test]
    fn a_release_stops_acting_at_once_and_writes_released() {
        let mut b = MapBucket::default();
        let mut m = machine();
        m.handle_timeout(0, 1);
        run(&mut m, &mut b, 0);
        m.release(100, 5);
        assert!(!m.is_acting(100));
        let notices = run(&mut m, &mut b, 100);
        assert_eq!(notices, vec![LeaseEffect::EpochOver(EpochEnd::Released)]);
        assert_eq!(b.body(&key(1)).unwrap(), "released 0000000000000005");
        // Released, it never acts again, though its last renewal would
        // still be valid by the clock.
        assert_eq!(m.acting_epoch(101), None);
        // Asked during a renewal, it follows the renewal.
        let mut b = MapBucket::default();
        let mut m = machine();
        m.handle_timeout(0, 1);
        let Some(LeaseEffect::Bucket(op)) = m.poll_effect(0) else {
            panic!()
        };
        m.release(0, 5);
        assert!(!m.is_acting(0));
        let res = b.perform(op);
        m.on_result(res, 0);
        let notices = run(&mut m, &mut b, 0);
        assert_eq!(
            notices.last(),
            Some(&LeaseEffect::EpochOver(EpochEnd::Released))
        );
        assert_eq!(b.body(&key(1)).unwrap(), "released 0000000000000005");
    }

    #[test]
    fn a_bucket_error_on_a_release_still_ends_the_epoch() {
        let mut m = machine();
        let mut b = MapBucket::default();
        m.handle_timeout(0, 1);
        run(&mut m, &mut b, 0);
        m.release(10, 5);
        assert!(matches!(m.poll_effect(10), Some(LeaseEffect::Bucket(_))));
        m.on_result(BucketResult::Failed, 10);
        assert_eq!(
            m.poll_effect(10),
            Some(LeaseEffect::EpochOver(EpochEnd::Released))
        );
    }
}
