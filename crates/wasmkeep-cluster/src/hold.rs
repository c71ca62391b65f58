//! Actor holds (ADR 0020): who owns an actor, under which generation.
//!
//! An actor's holds are create-only records `hold/<generation, 20 digits>`
//! below its folder; the latest one counts. Taking an actor is creating the
//! next generation, so two nodes racing get one winner. A release is a new
//! generation that names no owner. The owner is the node a hold names *while
//! that node's lease is valid* (`LeaseView`); generations order owners, which
//! is what ADR 0009's R3 compares.
//!
//! The record format and key layout are public; the decisions (`lease_view`,
//! `plan_take`) are private to the crate and reached through
//! [`crate::machine::TakeMachine`] and [`crate::machine::ReleaseMachine`],
//! which hold the order of the steps around them.

use crate::error::Error;
use crate::lease::{LeaseKey, NodeLeaseView, validate_node};
use crate::{parse_fixed_digits, parse_fixed_hex};

/// The folder of an actor's holds, relative to the actor's folder.
pub const HOLD_FOLDER: &str = "hold/";
/// Digits of a generation in a hold key.
pub const GENERATION_DIGITS: usize = 20;

/// The key of a hold, relative to the actor's folder.
pub fn hold_key(generation: u64) -> String {
    format!("{HOLD_FOLDER}{generation:020}")
}

/// Parses a key written by [`hold_key`].
pub fn parse_hold_key(key: &str) -> Result<u64, Error> {
    key.strip_prefix(HOLD_FOLDER)
        .and_then(|g| parse_fixed_digits(g, GENERATION_DIGITS))
        .ok_or_else(|| Error::MalformedKey {
            reason: "hold",
            key: key.to_owned(),
        })
}

/// The highest generation among listed hold keys (relative to the actor's
/// folder); malformed keys are ignored.
pub fn latest_generation<'a>(keys: impl IntoIterator<Item = &'a str>) -> Option<u64> {
    keys.into_iter()
        .filter_map(|k| parse_hold_key(k).ok())
        .max()
}

/// The body of a hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HoldRecord {
    /// `node`, in its start `epoch`, took the actor.
    Held {
        node: String,
        epoch: u64,
        nonce: u64,
    },
    /// `node` released the actor: anyone may take it at once.
    Released {
        node: String,
        epoch: u64,
        nonce: u64,
    },
}

impl HoldRecord {
    /// The record as stored.
    pub fn encode(&self) -> String {
        match self {
            HoldRecord::Held { node, epoch, nonce } => format!("held {node} {epoch} {nonce:016x}"),
            HoldRecord::Released { node, epoch, nonce } => {
                format!("released {node} {epoch} {nonce:016x}")
            }
        }
    }

    /// Parses a record written by [`HoldRecord::encode`].
    pub fn decode(body: &str) -> Result<HoldRecord, Error> {
        let bad = |reason| Error::MalformedRecord {
            reason,
            record: body.to_owned(),
        };
        let parts: Vec<&str> = body.split(' ').collect();
        let [kind, node, epoch, nonce] = parts.as_slice() else {
            return Err(bad("field count"));
        };
        validate_node(node).map_err(|_| bad("node id"))?;
        let node = (*node).to_owned();
        let epoch = epoch.parse().map_err(|_| bad("epoch"))?;
        let nonce = parse_fixed_hex(nonce, 16).ok_or_else(|| bad("nonce"))?;
        match *kind {
            "held" => Ok(HoldRecord::Held { node, epoch, nonce }),
            "released" => Ok(HoldRecord::Released { node, epoch, nonce }),
            _ => Err(bad("kind")),
        }
    }
}

/// Who owns an actor now: the hold exists and the node lease is valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LeaseView {
    /// `node` in `epoch` owns the actor under `generation`.
    Owned {
        generation: u64,
        node: String,
        epoch: u64,
    },
    /// Nobody owns it; `latest_generation` is the last hold (0 for none).
    /// When `fence` is set, the last holder's lease only lapsed: it may be
    /// slow rather than dead, so a taker fences it first.
    Free {
        latest_generation: u64,
        fence: Option<LeaseKey>,
    },
}

/// The view from the latest hold and the view of the node it names.
pub(crate) fn lease_view(latest: Option<(u64, &HoldRecord)>, holder: &NodeLeaseView) -> LeaseView {
    let Some((generation, record)) = latest else {
        return LeaseView::Free {
            latest_generation: 0,
            fence: None,
        };
    };
    let free = |fence| LeaseView::Free {
        latest_generation: generation,
        fence,
    };
    match record {
        HoldRecord::Released { .. } => free(None),
        HoldRecord::Held { node, epoch, .. } => match holder {
            NodeLeaseView::Valid { epoch: e } if e == epoch => LeaseView::Owned {
                generation,
                node: node.clone(),
                epoch: *epoch,
            },
            NodeLeaseView::Lapsed { latest } if latest.epoch == *epoch && &latest.node == node => {
                free(Some(latest.clone()))
            }
            // A newer epoch (the node restarted), a fence, a release or no
            // lease at all: the hold is dead.
            _ => free(None),
        },
    }
}

/// What a node does to act for an actor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TakePlan {
    /// It holds the actor already and has it loaded.
    Mine { generation: u64 },
    /// Another node owns it: forward the request (or drop an alarm delivery:
    /// the owner has the alarm, committed and indexed).
    Forward { node: String },
    /// Create `hold_key(generation)`; first fence the lapsed lease, if any
    /// (create [`crate::lease::fence_write`] of it; if that key turns out to
    /// hold a live renewal, the holder is alive and the take is off).
    Take {
        generation: u64,
        fence: Option<LeaseKey>,
    },
}

/// Decides how `me` (in `my_epoch`) gets to act for an actor. `loaded` is the
/// generation under which it has the actor restored, if it does: a node that
/// gave an actor up takes it again under a new generation, so that everything
/// it does after restoring is ordered after everything before.
///
/// Private to the crate: [`crate::machine::TakeMachine`] is the one place
/// that reads what this needs, in order, and acts on it.
pub(crate) fn plan_take(
    me: &str,
    my_epoch: u64,
    loaded: Option<u64>,
    view: &LeaseView,
) -> TakePlan {
    match view {
        LeaseView::Owned {
            generation,
            node,
            epoch,
        } if node == me && *epoch == my_epoch => {
            if loaded == Some(*generation) {
                TakePlan::Mine {
                    generation: *generation,
                }
            } else {
                TakePlan::Take {
                    generation: generation + 1,
                    fence: None,
                }
            }
        }
        LeaseView::Owned { node, .. } => TakePlan::Forward { node: node.clone() },
        LeaseView::Free {
            latest_generation,
            fence,
        } => TakePlan::Take {
            generation: latest_generation + 1,
            fence: fence.clone(),
        },
    }
}

/// The record a node writes to take (or, with `released`, to release) an actor.
pub(crate) fn hold_record(node: &str, epoch: u64, nonce: u64, released: bool) -> HoldRecord {
    let node = node.to_owned();
    if released {
        HoldRecord::Released { node, epoch, nonce }
    } else {
        HoldRecord::Held { node, epoch, nonce }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_records_round_trip() {
        assert_eq!(hold_key(7), "hold/00000000000000000007");
        assert_eq!(parse_hold_key(&hold_key(7)), Ok(7));
        assert!(parse_hold_key("hold/7").is_err());
        assert_eq!(
            latest_generation([
                "hold/00000000000000000002",
                "hold/00000000000000000010",
                "hold/x"
            ]),
            Some(10)
        );
        for r in [hold_record("a", 2, 3, false), hold_record("b", 1, 0, true)] {
            assert_eq!(HoldRecord::decode(&r.encode()), Ok(r));
        }
        assert!(HoldRecord::decode("held A 1 0000000000000000").is_err());
    }

    #[test]
    fn lease_view_needs_the_hold_and_a_valid_lease_of_the_same_epoch() {
        let held = hold_record("a", 2, 0, false);
        let owned = lease_view(Some((5, &held)), &NodeLeaseView::Valid { epoch: 2 });
        assert_eq!(
            owned,
            LeaseView::Owned {
                generation: 5,
                node: "a".into(),
                epoch: 2
            }
        );
        // The node restarted: its old hold is dead, no fence needed.
        let restarted = lease_view(Some((5, &held)), &NodeLeaseView::Valid { epoch: 3 });
        assert_eq!(
            restarted,
            LeaseView::Free {
                latest_generation: 5,
                fence: None
            }
        );
        // The lease lapsed: a taker fences it first.
        let k = LeaseKey {
            node: "a".into(),
            epoch: 2,
            counter: 9,
        };
        let lapsed = lease_view(
            Some((5, &held)),
            &NodeLeaseView::Lapsed { latest: k.clone() },
        );
        assert_eq!(
            lapsed,
            LeaseView::Free {
                latest_generation: 5,
                fence: Some(k)
            }
        );
        let released = lease_view(
            Some((6, &hold_record("a", 2, 0, true))),
            &NodeLeaseView::Valid { epoch: 2 },
        );
        assert_eq!(
            released,
            LeaseView::Free {
                latest_generation: 6,
                fence: None
            }
        );
        assert_eq!(
            lease_view(None, &NodeLeaseView::Absent),
            LeaseView::Free {
                latest_generation: 0,
                fence: None
            }
        );
    }

    #[test]
    fn take_plans() {
        let owned_by_a = LeaseView::Owned {
            generation: 4,
            node: "a".into(),
            epoch: 1,
        };
        assert_eq!(
            plan_take("a", 1, Some(4), &owned_by_a),
            TakePlan::Mine { generation: 4 }
        );
        assert_eq!(
            plan_take("a", 1, None, &owned_by_a),
            TakePlan::Take {
                generation: 5,
                fence: None
            }
        );
        assert_eq!(
            plan_take("b", 1, None, &owned_by_a),
            TakePlan::Forward { node: "a".into() }
        );
        let k = LeaseKey {
            node: "a".into(),
            epoch: 1,
            counter: 3,
        };
        let free = LeaseView::Free {
            latest_generation: 4,
            fence: Some(k.clone()),
        };
        assert_eq!(
            plan_take("b", 1, None, &free),
            TakePlan::Take {
                generation: 5,
                fence: Some(k)
            }
        );
    }
}
