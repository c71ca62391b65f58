//! Every timing and size bound of the cluster protocol, in one place.

use crate::error::Error;

/// Longest class name in bytes. Class names are ASCII letters, digits, `-` and
/// `_`, and appear in index keys as they are.
pub const CLASS_BYTES_MAX: usize = 64;
/// Longest actor name in bytes (`name_bytes_max`): the one limit of every
/// layer, defined by `wasmkeep_store::id::NAME_BYTES_MAX` (which explains
/// the value: an actor's chain keys within S3's 1,024 bytes). This crate
/// depends on nothing, so it keeps an equal copy;
/// `wasmkeep-replica/tests/names.rs` checks that the two agree.
pub const NAME_BYTES_MAX: usize = 256;
/// The reason an over-long name is refused with.
pub const NAME_TOO_LONG: &str = "longer than name_bytes_max=256";
/// Longest folder a hex name is split into in a key, as the store's
/// `paths::HEX_SEGMENT_CHARS` splits it: within a local folder's 255-byte
/// names even with the suffix a local store adds to a file while writing
/// it. Checked equal by the same test.
pub const HEX_SEGMENT_CHARS: usize = 200;
/// Longest node id in bytes.
pub const NODE_BYTES_MAX: usize = 64;
/// Longest advertised address in bytes (`http://host:port` as other nodes
/// reach the node; a DNS name is at most 253 bytes).
pub const ADDRESS_BYTES_MAX: usize = 300;
/// Default of a node's `cluster_bucket_timeout_ms`: well within a renewal
/// interval (a third of the default lease period), so that a hung request
/// leaves time for the next renewal before the node stops acting.
pub const BUCKET_TIMEOUT_MS: u64 = 2_000;
/// Most nodes after an entry's shard node that help deliver it before the
/// last resort ([`ClusterConfig::helper_ranks`]): every node trying every
/// entry the faults held up made a node's requests in the minutes after
/// them grow with the cluster (issue 41).
pub const HELPER_RANKS_MAX: usize = 4;
/// Sweep margins after [`ClusterConfig::anyones_after_ms`] at which an entry
/// that the shard node and its helpers have not delivered is offered to
/// more nodes again, until every node may deliver it: the last resort for
/// an entry none of them can act on (its app not deployed on any of them).
/// An actor's holder delivers its entries itself whatever their rank
/// (`sweep::plan_sweep`), so an alarm a live owner keeps does not wait for it.
pub const LAST_RESORT_MARGINS: u64 = 20;

/// The cluster's timing and size bounds. Defaults are ADR 0009's and ADR 0020's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// How long a node lease lasts after the renewal that wrote it was sent.
    pub lease_period_ms: u64,
    /// How long other nodes wait past a lease's expiry before they treat it as
    /// lapsed: it absorbs clock skew and requests in flight.
    pub lease_grace_ms: u64,
    /// A node whose registration (its epoch's first lease record) failed tries
    /// again this soon; renewals of a valid lease keep their own rhythm.
    pub lease_register_retry_ms: u64,
    /// A node stops acting as owner this long before its own lease expires by
    /// its own clock, so that it stops before anyone else may start.
    pub owner_margin_ms: u64,
    /// How often each node sweeps the alarm index.
    pub alarm_sweep_ms: u64,
    /// The first committed retry of a failed `on-alarm` comes this long after it.
    pub retry_first_ms: u64,
    /// The longest backoff between committed retries.
    pub retry_max_ms: u64,
    /// Keys one listing request asks for at most (S3 pages hold 1,000): the
    /// step machines read folders page by page, never a whole listing at once.
    pub list_page_keys_max: usize,
    /// Index entries read by one sweep pass at most.
    pub sweep_entries_max: usize,
    /// Alarms one node delivers from one sweep at most.
    pub sweep_deliveries_max: usize,
    /// One in this many of a sweep's deliveries is kept for anyone's entries.
    pub sweep_anyones_share_divisor: usize,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            lease_period_ms: 10_000,
            lease_grace_ms: 5_000,
            lease_register_retry_ms: 1_000,
            owner_margin_ms: 1_000,
            alarm_sweep_ms: 10_000,
            retry_first_ms: 1_000,
            retry_max_ms: 300_000,
            list_page_keys_max: 1_000,
            sweep_entries_max: 2048,
            sweep_deliveries_max: 256,
            sweep_anyones_share_divisor: 8,
        }
    }
}

impl ClusterConfig {
    /// A node renews its lease every third of the lease period, so that two
    /// renewals can fail before it stops acting.
    pub fn lease_renew_ms(&self) -> u64 {
        (self.lease_period_ms / 3).max(1)
    }

    /// How overdue an index entry must be before a sweep reads it: a lease
    /// period plus grace, by which time a live owner would have delivered it.
    pub fn sweep_margin_ms(&self) -> u64 {
        self.lease_period_ms + self.lease_grace_ms
    }

    /// How overdue an entry must be before any node may deliver it, whatever
    /// the shard says: three sweep margins.
    pub fn anyones_after_ms(&self) -> u64 {
        3 * self.sweep_margin_ms()
    }

    /// How overdue an entry is when more than [`HELPER_RANKS_MAX`] helpers
    /// may deliver it: [`LAST_RESORT_MARGINS`] sweep margins after
    /// [`Self::anyones_after_ms`].
    pub fn last_resort_after_ms(&self) -> u64 {
        self.anyones_after_ms() + LAST_RESORT_MARGINS * self.sweep_margin_ms()
    }

    /// How many nodes after an entry's shard node, in the rendezvous order
    /// of its actor's address, may deliver it when it is `overdue_ms`
    /// overdue: none before three sweep margins ([`Self::anyones_after_ms`]),
    /// then one, then twice as many each further margin up to
    /// [`HELPER_RANKS_MAX`]; from [`Self::last_resort_after_ms`], twice as
    /// many again each margin until every node may. An entry a helper can
    /// deliver is thus tried by a few nodes, not by every node (at 100
    /// nodes, every node trying every entry the faults held up made a
    /// node's bucket requests grow with the cluster: issue 41), and one that
    /// none of them can act on reaches every node within `log2(nodes)`
    /// margins of the last resort ([`Self::everyones_after_ms`]).
    pub(crate) fn helper_ranks(&self, overdue_ms: u64) -> usize {
        let Some(past) = overdue_ms.checked_sub(self.anyones_after_ms()) else {
            return 0;
        };
        let margin = self.sweep_margin_ms().max(1);
        // `from` doubled `times` times, saturating.
        let doubled = |times: u64, from: usize| {
            if times >= u64::from(from.leading_zeros()) {
                usize::MAX
            } else {
                from << times
            }
        };
        match overdue_ms.checked_sub(self.last_resort_after_ms()) {
            None => doubled(past / margin, 1).min(HELPER_RANKS_MAX),
            Some(last) => doubled(last / margin + 1, HELPER_RANKS_MAX),
        }
    }

    /// How overdue an entry is when every one of `nodes` live nodes may
    /// deliver it ([`Self::helper_ranks`]).
    pub fn everyones_after_ms(&self, nodes: usize) -> u64 {
        let helpers = nodes.saturating_sub(1);
        let margin = self.sweep_margin_ms();
        let mut doublings = 0;
        if helpers <= HELPER_RANKS_MAX {
            while (1usize << doublings) < helpers {
                doublings += 1;
            }
            return self.anyones_after_ms() + doublings * margin;
        }
        while (HELPER_RANKS_MAX << (doublings + 1)) < helpers {
            doublings += 1;
        }
        self.last_resort_after_ms() + doublings * margin
    }

    /// Deliveries a sweep keeps for anyone's entries (an eighth by default).
    pub fn sweep_anyones_reserved(&self) -> usize {
        self.sweep_deliveries_max / self.sweep_anyones_share_divisor.max(1)
    }

    /// Checks the relations the protocol relies on.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |field, value: u64| Err(Error::InvalidConfig { field, value });
        if self.lease_period_ms < 3 {
            return bad("lease_period_ms", self.lease_period_ms);
        }
        if self.owner_margin_ms >= self.lease_period_ms - self.lease_renew_ms() {
            // A node must still be acting when its next renewal is due.
            return bad("owner_margin_ms", self.owner_margin_ms);
        }
        if self.lease_register_retry_ms == 0 {
            return bad("lease_register_retry_ms", 0);
        }
        if self.list_page_keys_max == 0 {
            return bad("list_page_keys_max", 0);
        }
        if self.alarm_sweep_ms == 0 {
            return bad("alarm_sweep_ms", 0);
        }
        if self.retry_first_ms == 0 || self.retry_first_ms > self.retry_max_ms {
            return bad("retry_first_ms", self.retry_first_ms);
        }
        if self.sweep_entries_max == 0 {
            return bad("sweep_entries_max", 0);
        }
        if self.sweep_deliveries_max == 0 {
            return bad("sweep_deliveries_max", 0);
        }
        if self.sweep_anyones_share_divisor == 0 {
            return bad("sweep_anyones_share_divisor", 0);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_adrs() {
        let c = ClusterConfig::default();
        c.validate().unwrap();
        assert_eq!(c.alarm_sweep_ms, 10_000);
        assert_eq!(c.retry_max_ms, 300_000);
        assert_eq!(c.sweep_margin_ms(), 15_000);
        assert_eq!(c.anyones_after_ms(), 45_000);
        assert_eq!(c.last_resort_after_ms(), 345_000);
        assert_eq!(HELPER_RANKS_MAX, 4);
        assert_eq!(
            [0, 44_999, 45_000, 59_999, 60_000, 75_000, 90_000, 344_999].map(|o| c.helper_ranks(o)),
            [0, 0, 1, 1, 2, 4, 4, 4]
        );
        assert_eq!(
            [345_000, 360_000, 375_000, 390_000, 405_000, u64::MAX].map(|o| c.helper_ranks(o)),
            [8, 16, 32, 64, 128, usize::MAX]
        );
        // 99 helpers at 100 nodes: 128 ranks from 405 s; 9 at 10 nodes: 16
        // from 360 s; 4 helpers (5 nodes) or fewer before the last resort.
        assert_eq!(c.everyones_after_ms(100), 405_000);
        assert_eq!(c.everyones_after_ms(10), 360_000);
        assert_eq!(c.everyones_after_ms(9), 345_000);
        assert_eq!(c.everyones_after_ms(5), 75_000);
        assert_eq!(c.everyones_after_ms(2), 45_000);
        assert_eq!(c.lease_renew_ms(), 3_333);
        assert_eq!(c.sweep_anyones_reserved(), 32);
    }

    #[test]
    fn validate_rejects_a_margin_that_outlasts_renewal() {
        let c = ClusterConfig {
            owner_margin_ms: 7_000,
            ..ClusterConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(Error::InvalidConfig {
                field: "owner_margin_ms",
                ..
            })
        ));
        let c = ClusterConfig {
            retry_first_ms: 0,
            ..ClusterConfig::default()
        };
        assert!(c.validate().is_err());
    }
}
