//! Releasing an actor (ADR 0020): the holder creates the next generation of
//! the actor's hold with a `released` body, so that any node may take it at
//! once instead of after the holder's lease runs out. A node releases an idle
//! actor, an actor it handed over at shutdown, and an actor it found nothing
//! for in the bucket (ADR 0009, R2).
//!
//! Whatever the outcome, the driver drops the actor (its instance and local
//! claim): releasing is the node giving the actor up. The write only decides
//! how soon another node may take it.

use crate::hold::{hold_key, hold_record};

use super::{BucketOp, BucketResult, CreateOnce, Created, Failure};

/// What [`ReleaseMachine::poll_effect`] asks of its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseEffect {
    /// Perform this operation and pass its answer to
    /// [`ReleaseMachine::on_result`].
    Bucket(BucketOp),
    /// The machine's outcome. Emitted once.
    Done(ReleaseOutcome),
}

/// How a release ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The `released` hold is the actor's latest, at `generation`.
    Released { generation: u64 },
    /// Nothing was released: another node may take the actor only once this
    /// node's lease runs out (or it took the actor already: `LostRace`).
    Failed(Failure),
}

#[derive(Clone, Debug)]
enum Phase {
    Writing(CreateOnce),
    Finished(Option<ReleaseOutcome>),
}

/// Releases one actor the node holds.
#[derive(Clone, Debug)]
pub struct ReleaseMachine {
    epoch: u64,
    generation: u64,
    phase: Phase,
    awaiting: bool,
}

impl ReleaseMachine {
    /// `me`, in its start `epoch`, releases the actor whose folder is
    /// `actor_root`, which it holds under `held_generation`. `nonce` goes into
    /// the record.
    pub fn new(
        me: &str,
        epoch: u64,
        actor_root: &str,
        held_generation: u64,
        nonce: u64,
    ) -> ReleaseMachine {
        // Only a held actor is released, by the next generation: a release
        // never writes over a hold nor names generation 0.
        assert!(held_generation >= 1, "a release of an actor never held");
        let generation = held_generation + 1;
        let record = hold_record(me, epoch, nonce, true);
        ReleaseMachine {
            epoch,
            generation,
            phase: Phase::Writing(CreateOnce::new(
                format!("{actor_root}{}", hold_key(generation)),
                record.encode().into_bytes(),
            )),
            awaiting: false,
        }
    }

    /// The next effect, or `None` while the machine waits for a result.
    /// `acting_epoch` as for [`super::TakeMachine::poll_effect`]: a node whose
    /// lease does not let it act writes nothing.
    pub fn poll_effect(&mut self, acting_epoch: Option<u64>) -> Option<ReleaseEffect> {
        if self.awaiting {
            return None;
        }
        match &mut self.phase {
            Phase::Writing(create) => {
                if acting_epoch != Some(self.epoch) {
                    self.phase = Phase::Finished(None);
                    return Some(ReleaseEffect::Done(ReleaseOutcome::Failed(
                        Failure::NotActing,
                    )));
                }
                self.awaiting = true;
                Some(ReleaseEffect::Bucket(create.op()))
            }
            Phase::Finished(outcome) => outcome.take().map(ReleaseEffect::Done),
        }
    }

    /// Takes the answer to the last [`ReleaseEffect::Bucket`].
    pub fn on_result(&mut self, result: BucketResult) {
        if !std::mem::take(&mut self.awaiting) {
            debug_assert!(false, "a result without an operation");
            return;
        }
        let Phase::Writing(create) = &mut self.phase else {
            return;
        };
        let outcome = match create.on_result(result) {
            None => return,
            Some(Created::Mine) => ReleaseOutcome::Released {
                generation: self.generation,
            },
            Some(Created::Theirs(_)) => ReleaseOutcome::Failed(Failure::LostRace),
            Some(Created::Failed) => ReleaseOutcome::Failed(Failure::Bucket),
        };
        self.phase = Phase::Finished(Some(outcome));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::testing::MapBucket;

    const ROOT: &str = "state/t/app/room/6131/";

    fn drive(
        m: &mut ReleaseMachine,
        b: &mut MapBucket,
        acting: Option<u64>,
        mut before: impl FnMut(&mut MapBucket) -> Option<BucketResult>,
    ) -> ReleaseOutcome {
        loop {
            match m.poll_effect(acting).expect("an effect") {
                ReleaseEffect::Bucket(op) => {
                    let res = before(b).unwrap_or_else(|| b.perform(op));
                    m.on_result(res);
                }
                ReleaseEffect::Done(outcome) => return outcome,
            }
        }
    }

    #[test]
    fn releases_under_the_next_generation() {
        let mut b = MapBucket::default();
        let mut m = ReleaseMachine::new("a", 2, ROOT, 4, 9);
        let outcome = drive(&mut m, &mut b, Some(2), |_| None);
        assert_eq!(outcome, ReleaseOutcome::Released { generation: 5 });
        assert_eq!(
            b.body(&format!("{ROOT}{}", hold_key(5))).unwrap(),
            "released a 2 0000000000000009"
        );
        assert_eq!(m.poll_effect(Some(2)), None, "done is handed out once");
    }

    #[test]
    fn a_newer_hold_wins_and_a_node_that_cannot_act_writes_nothing() {
        let mut b = MapBucket::default();
        let mut m = ReleaseMachine::new("a", 2, ROOT, 4, 9);
        let outcome = drive(&mut m, &mut b, Some(2), |b| {
            b.put(
                &format!("{ROOT}{}", hold_key(5)),
                "held b 1 0000000000000001",
            );
            None
        });
        assert_eq!(outcome, ReleaseOutcome::Failed(Failure::LostRace));

        for acting in [None, Some(3)] {
            let mut b = MapBucket::default();
            let mut m = ReleaseMachine::new("a", 2, ROOT, 4, 9);
            let outcome = drive(&mut m, &mut b, acting, |_| None);
            assert_eq!(outcome, ReleaseOutcome::Failed(Failure::NotActing));
            assert!(b.log.is_empty());
        }
    }

    #[test]
    fn a_bucket_error_releases_nothing_but_its_own_retried_write_counts() {
        let mut b = MapBucket::default();
        let mut m = ReleaseMachine::new("a", 2, ROOT, 4, 9);
        let outcome = drive(&mut m, &mut b, Some(2), |_| Some(BucketResult::Failed));
        assert_eq!(outcome, ReleaseOutcome::Failed(Failure::Bucket));

        let mut b = MapBucket::default();
        b.put(
            &format!("{ROOT}{}", hold_key(5)),
            "released a 2 0000000000000009",
        );
        let mut m = ReleaseMachine::new("a", 2, ROOT, 4, 9);
        let outcome = drive(&mut m, &mut b, Some(2), |_| None);
        assert_eq!(outcome, ReleaseOutcome::Released { generation: 5 });
    }

    #[test]
    #[should_panic(expected = "a release of an actor never held")]
    fn releasing_generation_zero_is_a_driver_bug() {
        let _ = ReleaseMachine::new("a", 1, "state/t/app/c/61/", 0, 7);
    }
}
