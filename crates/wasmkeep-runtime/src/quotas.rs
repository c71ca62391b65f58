//! Disk quotas per tenant on this node (issue 33): how many actors a
//! tenant may have here (`tenant_actors_max`), and how many bytes their
//! databases may take together (`tenant_disk_bytes_max`).
//!
//! Without them one tenant could create actors without end, each up to
//! `database_bytes_max` (10 GiB), and fill the node's disk for everyone.
//!
//! The counts start from a walk of the data folder when the node starts,
//! and are corrected by every census of it (`metrics_census_ms`); between
//! two, the node counts what it does: an actor created or deleted, a batch
//! that grew or shrank a database. A new actor past the tenant's count is
//! refused before its database exists (`quota_exceeded`, naming the
//! bound); a batch that would take the tenant past its bytes fails as a
//! full database does (the actor's other data is untouched, and it may
//! delete to make room). Two actors of one tenant growing on two workers
//! at once may pass the bound by what one batch of each writes.
//!
//! With a bucket, a tenant's bytes there, all nodes together, are bounded
//! too (`tenant_bucket_bytes_max`), and its actors there by
//! `tenant_actors_max` as well: every `bucket_usage_interval_ms` the
//! tenant's folder is measured ([`wasmkeep_replica::usage`]; in a cluster
//! by one node, chosen by rendezvous hashing among the live ones, which
//! publishes the figures for the others to read) and a tenant past either
//! bound is refused new actors and growth, as on this node's disk. The
//! measurement is as old as the interval: a tenant may pass the bound by
//! what it writes between two.

use std::collections::HashMap;

use parking_lot::Mutex;

use wasmkeep_replica::usage::Measured;

use crate::error::RuntimeError;

/// A tenant's use of this node's disk.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub actors: u64,
    pub bytes: u64,
}

/// The room a tenant's databases have left, and the bound that leaves
/// the least.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Room {
    pub left: u64,
    pub limit_name: &'static str,
    pub limit: u64,
}

/// The node's quotas and each tenant's use.
#[derive(Debug)]
pub struct Quotas {
    actors_max: u64,
    bytes_max: u64,
    bucket_bytes_max: u64,
    usage: Mutex<HashMap<String, Usage>>,
    /// Each tenant's last measurement of the bucket.
    bucket: Mutex<HashMap<String, Measured>>,
}

impl Quotas {
    pub fn new(actors_max: u64, bytes_max: u64, bucket_bytes_max: u64) -> Quotas {
        Quotas {
            actors_max,
            bytes_max,
            bucket_bytes_max,
            usage: Mutex::new(HashMap::new()),
            bucket: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a measurement of the tenant's bytes and actors in the bucket.
    pub(crate) fn set_measured(&self, tenant: &str, m: Measured) {
        self.bucket.lock().insert(tenant.to_owned(), m);
    }

    /// The tenant's last measurement of the bucket.
    pub(crate) fn measured(&self, tenant: &str) -> Measured {
        self.bucket.lock().get(tenant).copied().unwrap_or_default()
    }

    /// Replaces every tenant's use with what a walk of the data folder
    /// counted.
    pub fn set_counted(&self, counted: HashMap<String, Usage>) {
        *self.usage.lock() = counted;
    }

    /// A tenant's use now.
    pub fn usage(&self, tenant: &str) -> Usage {
        self.usage.lock().get(tenant).copied().unwrap_or_default()
    }

    /// Whether `tenant` may have one more actor here.
    pub fn may_create(&self, tenant: &str) -> Result<(), RuntimeError> {
        let used = self.usage(tenant);
        let measured = self.measured(tenant);
        let exceeded = |what, limit_name, limit| {
            Err(RuntimeError::QuotaExceeded {
                tenant: tenant.to_owned(),
                what,
                limit_name,
                limit,
            })
        };
        if used.actors >= self.actors_max {
            return exceeded("actors on this node", "tenant_actors_max", self.actors_max);
        }
        if measured.actors >= self.actors_max {
            return exceeded("actors in the bucket", "tenant_actors_max", self.actors_max);
        }
        let room = self.room(tenant);
        if room.left == 0 {
            return exceeded("bytes of databases", room.limit_name, room.limit);
        }
        Ok(())
    }

    /// The room `tenant`'s databases have left: on this node's disk, or
    /// in the bucket as last measured, whichever is less.
    pub(crate) fn room(&self, tenant: &str) -> Room {
        let disk = Room {
            left: self.bytes_max.saturating_sub(self.usage(tenant).bytes),
            limit_name: "tenant_disk_bytes_max",
            limit: self.bytes_max,
        };
        let bucket = Room {
            left: self
                .bucket_bytes_max
                .saturating_sub(self.measured(tenant).bytes),
            limit_name: "tenant_bucket_bytes_max",
            limit: self.bucket_bytes_max,
        };
        if bucket.left < disk.left {
            bucket
        } else {
            disk
        }
    }

    /// `tenant` has one actor more (`true`) or less, of `bytes`.
    pub fn counted(&self, tenant: &str, more: bool, bytes: u64) {
        let mut usage = self.usage.lock();
        let u = usage.entry(tenant.to_owned()).or_default();
        if more {
            u.actors += 1;
            u.bytes = u.bytes.saturating_add(bytes);
        } else {
            u.actors = u.actors.saturating_sub(1);
            u.bytes = u.bytes.saturating_sub(bytes);
        }
    }

    /// A batch changed one of `tenant`'s databases from `before` to `after`
    /// bytes.
    pub fn resized(&self, tenant: &str, before: u64, after: u64) {
        if before == after {
            return;
        }
        let mut usage = self.usage.lock();
        let u = usage.entry(tenant.to_owned()).or_default();
        u.bytes = (u.bytes + after).saturating_sub(before);
    }
}

/// One round of the bucket's measurements: for each of `tenants`, the
/// ones `mine` says this node measures are listed and published, the
/// others' published figures are read; each lands in `quotas`. A tenant
/// whose measurement fails keeps its last one (logged). Returns early when
/// `stop` is set.
pub(crate) fn measure_bucket(
    repl: &crate::replication::Replication,
    quotas: &Quotas,
    tenants: &[String],
    mine: &dyn Fn(&str) -> bool,
    now_ms: u64,
    stop: &std::sync::atomic::AtomicBool,
) {
    use wasmkeep_replica::usage;
    for tenant in tenants {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let got = if mine(tenant) {
            repl.block_on(async {
                let m = usage::measure_tenant(&repl.bucket, tenant, now_ms, stop).await?;
                if let Some(m) = &m {
                    usage::publish(&repl.bucket, tenant, m).await?;
                }
                Ok(m)
            })
        } else {
            repl.block_on(usage::read_published(&repl.bucket, tenant))
        };
        match got {
            Ok(Some(m)) => quotas.set_measured(tenant, m),
            Ok(None) => {}
            Err(e) => {
                let e: wasmkeep_replica::ReplicaError = e;
                tracing::warn!(%tenant, error = %e, "could not measure the tenant's bytes in the bucket");
            }
        }
    }
}

/// `tenant_disk_bytes_max` when none is set: `share_pct` of the size of
/// the filesystem the data folder is on (all of `u64` if it cannot be
/// read).
pub(crate) fn default_tenant_disk_bytes(data: &std::path::Path, share_pct: u8) -> u64 {
    let Ok(c) = std::ffi::CString::new(data.as_os_str().as_encoded_bytes()) else {
        return u64::MAX;
    };
    // SAFETY: `st` is a plain struct `statvfs` fills; the path is a valid
    // C string for the call's duration.
    let total = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return u64::MAX;
        }
        (st.f_blocks as u64).saturating_mul(st.f_frsize as u64)
    };
    crate::pools::share_of(total, share_pct)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_is_held_to_its_actors_and_bytes_and_others_are_not() {
        let q = Quotas::new(2, 1000, 4000);
        q.counted("evil", true, 100);
        q.may_create("evil").unwrap();
        q.counted("evil", true, 100);
        let e = q.may_create("evil").unwrap_err();
        assert_eq!(e.code(), "quota_exceeded");
        assert!(e.to_string().contains("tenant_actors_max=2"), "{e}");
        q.may_create("good").unwrap();
        q.resized("evil", 100, 900);
        assert_eq!(q.room("evil").left, 0);
        q.counted("evil", false, 900);
        assert_eq!(
            q.usage("evil"),
            Usage {
                actors: 1,
                bytes: 100
            }
        );
    }

    #[test]
    fn the_buckets_measurement_bounds_a_tenant_beside_this_nodes_disk() {
        let q = Quotas::new(3, 1000, 4000);
        q.counted("evil", true, 100);
        q.set_measured(
            "evil",
            Measured {
                bytes: 3500,
                actors: 1,
                at_ms: 0,
            },
        );
        let room = q.room("evil");
        assert_eq!(
            (room.left, room.limit_name),
            (500, "tenant_bucket_bytes_max")
        );
        q.set_measured(
            "evil",
            Measured {
                bytes: 100,
                actors: 3,
                at_ms: 1,
            },
        );
        let e = q.may_create("evil").unwrap_err();
        assert!(e.to_string().contains("in the bucket"), "{e}");
        assert_eq!(q.room("evil").limit_name, "tenant_disk_bytes_max");
        q.set_measured(
            "evil",
            Measured {
                bytes: 4000,
                actors: 1,
                at_ms: 2,
            },
        );
        let e = q.may_create("evil").unwrap_err();
        assert!(
            e.to_string().contains("tenant_bucket_bytes_max=4000"),
            "{e}"
        );
        q.may_create("good").unwrap();
    }
}
