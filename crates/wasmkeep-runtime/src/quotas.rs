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

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::error::RuntimeError;

/// A tenant's use of this node's disk.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub actors: u64,
    pub bytes: u64,
}

/// The node's quotas and each tenant's use.
#[derive(Debug)]
pub struct Quotas {
    actors_max: u64,
    bytes_max: u64,
    usage: Mutex<HashMap<String, Usage>>,
}

impl Quotas {
    pub fn new(actors_max: u64, bytes_max: u64) -> Quotas {
        Quotas {
            actors_max,
            bytes_max,
            usage: Mutex::new(HashMap::new()),
        }
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
        if used.actors >= self.actors_max {
            return Err(RuntimeError::QuotaExceeded {
                tenant: tenant.to_owned(),
                what: "actors",
                limit_name: "tenant_actors_max",
                limit: self.actors_max,
            });
        }
        if used.bytes >= self.bytes_max {
            return Err(self.bytes_exceeded(tenant));
        }
        Ok(())
    }

    /// The error of a tenant at its bytes.
    pub fn bytes_exceeded(&self, tenant: &str) -> RuntimeError {
        RuntimeError::QuotaExceeded {
            tenant: tenant.to_owned(),
            what: "bytes of databases",
            limit_name: "tenant_disk_bytes_max",
            limit: self.bytes_max,
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

    /// Bytes `tenant`'s databases may still grow by.
    pub fn bytes_left(&self, tenant: &str) -> u64 {
        self.bytes_max.saturating_sub(self.usage(tenant).bytes)
    }

    pub fn bytes_max(&self) -> u64 {
        self.bytes_max
    }
}

/// `tenant_disk_bytes_max` when none is set: `share_pct` of the size of
/// the filesystem the data folder is on (all of `u64` if it cannot be
/// read).
pub fn default_tenant_disk_bytes(data: &std::path::Path, share_pct: u8) -> u64 {
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
        let q = Quotas::new(2, 1000);
        q.counted("evil", true, 100);
        q.may_create("evil").unwrap();
        q.counted("evil", true, 100);
        let e = q.may_create("evil").unwrap_err();
        assert_eq!(e.code(), "quota_exceeded");
        assert!(e.to_string().contains("tenant_actors_max=2"), "{e}");
        q.may_create("good").unwrap();
        q.resized("evil", 100, 900);
        assert_eq!(q.bytes_left("evil"), 0);
        q.counted("evil", false, 900);
        assert_eq!(
            q.usage("evil"),
            Usage {
                actors: 1,
                bytes: 100
            }
        );
    }
}
