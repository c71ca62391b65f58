//! ADR 0009's delivery of an index entry, with the sweep's no-state rule: an
//! entry delivered for an actor with no state is removed without running the
//! actor.
//!
//! A delivery (an entry the sweep handed to the timer, or a time the timer
//! already held) takes the actor, restores it from the bucket, and then asks
//! [`plan_delivery`] what to do, before it starts the instance: starting an
//! actor with no state would run `on-init` and create it again. "No state"
//! means no committed alarm and no `on-init` recorded: the actor was deleted
//! since its entry was listed, or it was never initialised (the bucket has
//! nothing for it, as for an entry a joining node listed before its first
//! upload, R4).
//!
//! The entry of an actor with no state is then removed by the stale-entry
//! steps ([`crate::alarm_index::next_stale_step`]), as any entry the
//! replicated state does not name: with the owner fence first, and not at
//! all while the bucket had nothing for the actor and the owner uploaded
//! nothing (R2's empty-bucket clause, which keeps an entry whose first
//! snapshot may still land). Either way nothing runs.
//!
//! The server calls [`plan_delivery`]; so does the simulator (`wasmkeep-sim`),
//! which checks that an alarm of a deleted actor never runs. The unsafe
//! [`crate::Variant::RunWithoutState`] switches the rule off here.

use crate::alarm_index;
use crate::rules::Rules;

/// What the restored database says about the actor, as far as a delivery
/// needs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// The committed alarm (the retry time while retrying), if any.
    pub alarm_at_ms: Option<u64>,
    /// Whether `on-init` is recorded: the actor was initialised and has not
    /// been deleted since.
    pub initialised: bool,
}

impl Restored {
    /// Whether the actor has state: a committed alarm or a recorded
    /// `on-init`.
    pub fn has_state(&self) -> bool {
        self.initialised || self.alarm_at_ms.is_some()
    }
}

/// What a delivered entry means for the actor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// The committed alarm is at the entry's time and due: run `on-alarm`.
    Run,
    /// The committed alarm is at the entry's time but not due by this node's
    /// clock: keep it in the timer until then.
    NotDue {
        /// When to deliver it again.
        at_ms: u64,
    },
    /// The actor has state, but the entry does not match its committed
    /// alarm: a stale entry, removed by
    /// [`crate::alarm_index::next_stale_step`]'s steps.
    Stale,
    /// The actor has no state (deleted since, or never initialised): do not
    /// start it and run nothing; remove the entry by the stale-entry steps.
    NoState,
}

/// Decides what a delivery of the entry at `delivered_at_ms` does, given the
/// restored state and the node's clock.
pub fn plan_delivery(
    rules: Rules,
    delivered_at_ms: u64,
    restored: &Restored,
    now_ms: u64,
) -> Delivery {
    if !restored.has_state() {
        if rules.skip_without_state() {
            return Delivery::NoState;
        }
        // The unsafe variant: the entry's time is taken for the alarm, and
        // running it creates the actor again.
        return if delivered_at_ms <= now_ms {
            Delivery::Run
        } else {
            Delivery::NotDue {
                at_ms: delivered_at_ms,
            }
        };
    }
    match alarm_index::plan_delivery(delivered_at_ms, restored.alarm_at_ms, now_ms) {
        alarm_index::Delivery::Run => Delivery::Run,
        alarm_index::Delivery::NotDue { at_ms } => Delivery::NotDue { at_ms },
        alarm_index::Delivery::Stale => Delivery::Stale,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Variant;

    fn state(alarm_at_ms: Option<u64>, initialised: bool) -> Restored {
        Restored {
            alarm_at_ms,
            initialised,
        }
    }

    #[test]
    fn an_actor_with_state_runs_only_its_due_matching_alarm() {
        let live = state(Some(1_000), true);
        assert_eq!(
            plan_delivery(Rules::SAFE, 1_000, &live, 1_000),
            Delivery::Run
        );
        assert_eq!(
            plan_delivery(Rules::SAFE, 1_000, &live, 999),
            Delivery::NotDue { at_ms: 1_000 }
        );
        assert_eq!(
            plan_delivery(Rules::SAFE, 900, &live, 5_000),
            Delivery::Stale
        );
        // Initialised without an alarm: the entry is stale, the actor exists.
        let idle = state(None, true);
        assert_eq!(
            plan_delivery(Rules::SAFE, 900, &idle, 5_000),
            Delivery::Stale
        );
        // A committed alarm is state even without `on-init` recorded.
        let alarm_only = state(Some(900), false);
        assert!(alarm_only.has_state());
        assert_eq!(
            plan_delivery(Rules::SAFE, 900, &alarm_only, 5_000),
            Delivery::Run
        );
    }

    #[test]
    fn an_actor_with_no_state_is_never_run() {
        // Deleted since, or never initialised: no alarm, no `on-init`.
        let none = Restored::default();
        assert!(!none.has_state());
        for now in [0, 900, 5_000] {
            assert_eq!(
                plan_delivery(Rules::SAFE, 900, &none, now),
                Delivery::NoState
            );
        }
        // Every variant but the one that breaks this rule keeps it.
        for v in Variant::UNSAFE {
            let d = plan_delivery(Rules::with(v), 900, &none, 5_000);
            assert_eq!(
                d == Delivery::NoState,
                v != Variant::RunWithoutState,
                "{v:?}"
            );
        }
    }

    #[test]
    fn the_unsafe_variant_runs_an_actor_with_no_state() {
        let rules = Rules::with(Variant::RunWithoutState);
        let none = Restored::default();
        assert_eq!(plan_delivery(rules, 900, &none, 5_000), Delivery::Run);
        assert_eq!(
            plan_delivery(rules, 900, &none, 100),
            Delivery::NotDue { at_ms: 900 }
        );
        // With state it follows the rules like the safe variant.
        let live = state(Some(1_000), true);
        assert_eq!(plan_delivery(rules, 900, &live, 5_000), Delivery::Stale);
    }
}
