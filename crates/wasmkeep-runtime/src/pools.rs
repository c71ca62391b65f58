//! Named memory pools for what the host holds on a tenant's behalf outside
//! SQLite's heap and the guests' memories (issue 33): request bodies being
//! read, WebSocket messages being received, ...
//!
//! Each byte is reserved before it is held: in its pool (bounded for the
//! node, and for each tenant at `tenant_share_pct` of that), and in the
//! node's memory budget (`node_memory_bytes_max`, which SQLite's heap and
//! the guests' memories count against too: `wasmkeep_store::memory_budget`).
//! A reservation refused names the pool's bound and whose it was; what was
//! reserved goes back when the [`Hold`] is dropped. Before these pools, 100
//! connections each sending a 32 MiB body and stalling held 3.4 GB, and
//! 400 WebSockets with an unfinished fragmented message 470 MB.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Why bytes could not be reserved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("{what}: the node holds too much of it now: limit {limit_name}={limit}; retry later")]
    Node {
        what: &'static str,
        limit_name: &'static str,
        limit: u64,
    },
    #[error(
        "{what}: tenant `{tenant}` holds its share of it: limit {limit_name}={limit} \
         (tenant_share_pct of it each); retry later"
    )]
    Tenant {
        what: &'static str,
        tenant: String,
        limit_name: &'static str,
        limit: u64,
    },
    #[error(
        "{what}: the node's memory for tenants is exhausted: limit node_memory_bytes_max={limit}; \
         retry later"
    )]
    Memory { what: &'static str, limit: u64 },
}

impl PoolError {
    /// The stable code: `node_overloaded` (the node's pool or memory) or
    /// `tenant_overloaded` (a tenant's share).
    pub fn code(&self) -> &'static str {
        match self {
            PoolError::Tenant { .. } => "tenant_overloaded",
            PoolError::Node { .. } | PoolError::Memory { .. } => "node_overloaded",
        }
    }
}

/// One named pool.
#[derive(Debug)]
pub struct Pool {
    /// What it holds, for errors ("request bodies").
    what: &'static str,
    /// The setting that bounds it.
    limit_name: &'static str,
    node_max: u64,
    tenant_max: u64,
    used: AtomicU64,
    tenants: Mutex<HashMap<Arc<str>, u64>>,
}

impl Pool {
    pub fn new(what: &'static str, limit_name: &'static str, node_max: u64, share_pct: u8) -> Pool {
        Pool {
            what,
            limit_name,
            node_max,
            tenant_max: share_of(node_max, share_pct).max(1),
            used: AtomicU64::new(0),
            tenants: Mutex::new(HashMap::new()),
        }
    }

    /// Bytes held now, all tenants together.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes `tenant` holds now.
    pub fn used_by(&self, tenant: &str) -> u64 {
        self.tenants.lock().get(tenant).copied().unwrap_or(0)
    }

    /// The node's bound and a tenant's.
    pub fn limits(&self) -> (u64, u64) {
        (self.node_max, self.tenant_max)
    }

    /// Reserves `bytes` for `tenant`, or says which bound refused them.
    pub fn reserve(self: &Arc<Self>, tenant: &str, bytes: u64) -> Result<Hold, PoolError> {
        let mut hold = Hold {
            pool: Arc::clone(self),
            tenant: Arc::from(tenant),
            bytes: 0,
        };
        hold.grow(bytes)?;
        Ok(hold)
    }

    fn take(&self, tenant: &Arc<str>, bytes: u64) -> Result<(), PoolError> {
        if bytes == 0 {
            return Ok(());
        }
        let mut tenants = self.tenants.lock();
        let mine = tenants.get(tenant).copied().unwrap_or(0);
        if mine.saturating_add(bytes) > self.tenant_max {
            return Err(PoolError::Tenant {
                what: self.what,
                tenant: tenant.to_string(),
                limit_name: self.limit_name,
                limit: self.tenant_max,
            });
        }
        let used = self.used.load(Ordering::Relaxed);
        if used.saturating_add(bytes) > self.node_max {
            return Err(PoolError::Node {
                what: self.what,
                limit_name: self.limit_name,
                limit: self.node_max,
            });
        }
        if !wasmkeep_store::memory_budget::reserve_host(bytes) {
            return Err(PoolError::Memory {
                what: self.what,
                limit: wasmkeep_store::memory_budget::node_bytes_max(),
            });
        }
        self.used.fetch_add(bytes, Ordering::Relaxed);
        *tenants.entry(Arc::clone(tenant)).or_insert(0) += bytes;
        Ok(())
    }

    fn give(&self, tenant: &Arc<str>, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut tenants = self.tenants.lock();
        if let Some(mine) = tenants.get_mut(tenant) {
            *mine -= bytes;
            if *mine == 0 {
                tenants.remove(tenant);
            }
        }
        self.used.fetch_sub(bytes, Ordering::Relaxed);
        wasmkeep_store::memory_budget::release_host(bytes);
    }
}

/// `pct` percent (1 to 100) of `n`, rounded down.
pub fn share_of(n: u64, pct: u8) -> u64 {
    (u128::from(n) * u128::from(pct.clamp(1, 100)) / 100) as u64
}

/// Bytes reserved in a pool for one tenant, given back when dropped.
#[derive(Debug)]
pub struct Hold {
    pool: Arc<Pool>,
    tenant: Arc<str>,
    bytes: u64,
}

impl Hold {
    /// Reserves `more` bytes besides those held.
    pub fn grow(&mut self, more: u64) -> Result<(), PoolError> {
        self.pool.take(&self.tenant, more)?;
        self.bytes += more;
        Ok(())
    }

    /// Gives back all but `keep` bytes (no more than held).
    pub fn shrink_to(&mut self, keep: u64) {
        if keep < self.bytes {
            self.pool.give(&self.tenant, self.bytes - keep);
            self.bytes = keep;
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.pool.give(&self.tenant, self.bytes);
    }
}

/// The node's pools.
#[derive(Debug)]
pub struct Pools {
    /// Request bodies while they are read, until the request's event took
    /// them (`request_bodies_bytes_max`).
    pub request_bodies: Arc<Pool>,
    /// WebSocket messages being received, from their first byte to the
    /// event that delivers them (`socket_buffers_bytes_max`).
    pub socket_buffers: Arc<Pool>,
    /// The changed pages an upload holds in memory, and the entry made of
    /// them, until the upload ends (`replica_buffers_bytes_max`).
    pub replica_buffers: Arc<Pool>,
}

impl Pools {
    pub fn new(limits: &PoolLimits) -> Pools {
        let share = limits.tenant_share_pct;
        Pools {
            request_bodies: Arc::new(Pool::new(
                "request bodies",
                "request_bodies_bytes_max",
                limits.request_bodies_bytes_max,
                share,
            )),
            socket_buffers: Arc::new(Pool::new(
                "WebSocket messages being received",
                "socket_buffers_bytes_max",
                limits.socket_buffers_bytes_max,
                share,
            )),
            replica_buffers: Arc::new(Pool::new(
                "changed pages on their way to the bucket",
                "replica_buffers_bytes_max",
                limits.replica_buffers_bytes_max,
                share,
            )),
        }
    }
}

/// The pools' bounds (see the README's configuration table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolLimits {
    pub request_bodies_bytes_max: u64,
    pub socket_buffers_bytes_max: u64,
    pub replica_buffers_bytes_max: u64,
    /// The share of each pool one tenant may hold, in percent.
    pub tenant_share_pct: u8,
}

/// The share of each pool one tenant may hold by default, in percent.
pub(crate) const TENANT_SHARE_PCT: u8 = 25;

/// The node's memory budget when none is set: half of what the machine has,
/// or of the cgroup's limit if that is lower (the rest is for the node's
/// own code and caches, the page cache of the databases, and the system).
pub(crate) fn default_node_memory_bytes() -> u64 {
    let machine = meminfo_total_bytes().unwrap_or(8 << 30);
    let limit = cgroup_memory_max_bytes().map_or(machine, |c| c.min(machine));
    limit / 2
}

/// `MemTotal` of `/proc/meminfo`.
fn meminfo_total_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The memory limit of this process's cgroup (v2 `memory.max`, else v1
/// `memory.limit_in_bytes`), if it has one.
fn cgroup_memory_max_bytes() -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let v2 = read("/proc/self/cgroup")
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        })
        .and_then(|path| {
            read(&format!(
                "/sys/fs/cgroup{}/memory.max",
                path.trim_end_matches('/')
            ))
        })
        .or_else(|| read("/sys/fs/cgroup/memory.max"));
    let text = v2.or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))?;
    // `max` (v2) or a huge number (v1) means no limit.
    text.trim().parse::<u64>().ok().filter(|b| *b < 1 << 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_holds_its_share_and_another_still_gets_room() {
        let pool = Arc::new(Pool::new("things", "things_bytes_max", 1000, 25));
        let a = pool.reserve("evil", 250).unwrap();
        let refused = pool.reserve("evil", 1).unwrap_err();
        assert_eq!(refused.code(), "tenant_overloaded");
        assert!(
            refused.to_string().contains("things_bytes_max=250"),
            "{refused}"
        );
        let mut b = pool.reserve("good", 100).unwrap();
        assert_eq!(pool.used(), 350);
        b.grow(100).unwrap();
        assert_eq!(pool.used_by("good"), 200);
        drop(a);
        assert_eq!(pool.used_by("evil"), 0);
        b.shrink_to(50);
        assert_eq!(pool.used(), 50);
        drop(b);
        assert_eq!(pool.used(), 0);
    }

    #[test]
    fn the_node_bound_holds_whatever_the_shares() {
        let pool = Arc::new(Pool::new("things", "things_bytes_max", 100, 60));
        let _a = pool.reserve("a", 60).unwrap();
        let e = pool.reserve("b", 41).unwrap_err();
        assert_eq!(e.code(), "node_overloaded");
        assert!(pool.reserve("b", 40).is_ok());
    }
}
