//! Requests in flight per tenant (issue 33). A connection serves a tenant
//! while one of its requests is being handled, a parked reply's included:
//! with no bound per tenant, 1,030 parked requests of one tenant took
//! every connection of the node, `/healthz` included. Each tenant may have
//! at most `tenant_share_pct` of `connections_max` requests in flight on
//! this node; past it a request gets 503 `tenant_overloaded` and its
//! connection is closed, so that the place goes to someone else. All
//! tenants together may have `connections_max` less an eighth of it (kept
//! for `/healthz`, the admin API and new connections; past it 503
//! `node_overloaded`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::StatusCode;
use parking_lot::Mutex;

use crate::error::ApiError;

/// The requests each tenant has in flight on this node.
#[derive(Debug)]
pub(crate) struct TenantRequests {
    max: usize,
    node_max: usize,
    counts: Mutex<(HashMap<String, usize>, usize)>,
}

/// One request in flight; leaves when dropped.
#[derive(Debug)]
pub(crate) struct InFlight {
    of: Arc<TenantRequests>,
    tenant: String,
}

impl TenantRequests {
    /// `connections_max * share_pct / 100` requests per tenant, at least one.
    pub(crate) fn new(connections_max: usize, share_pct: u8) -> TenantRequests {
        let max = (connections_max.saturating_mul(usize::from(share_pct.min(100))) / 100).max(1);
        let node_max = connections_max - connections_max / 8;
        TenantRequests {
            max,
            node_max,
            counts: Mutex::new((HashMap::new(), 0)),
        }
    }

    /// Counts a request of `tenant`, or refuses it past the tenant's share.
    pub(crate) fn enter(self: &Arc<Self>, tenant: &str) -> Result<InFlight, ApiError> {
        let mut guard = self.counts.lock();
        let (counts, total) = &mut *guard;
        if *total >= self.node_max {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "node_overloaded",
                format!(
                    "the node has too many requests in flight: limit connections_max less an \
                     eighth={}; retry later",
                    self.node_max
                ),
            );
            e.retry_after_s = Some(1);
            return Err(e.closing());
        }
        let n = counts.entry(tenant.to_owned()).or_insert(0);
        if *n >= self.max {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "tenant_overloaded",
                format!(
                    "tenant `{tenant}` has too many requests in flight on this node: limit \
                     tenant_share_pct of connections_max={}; retry later",
                    self.max
                ),
            );
            e.retry_after_s = Some(1);
            return Err(e.closing());
        }
        *n += 1;
        *total += 1;
        Ok(InFlight {
            of: Arc::clone(self),
            tenant: tenant.to_owned(),
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut guard = self.of.counts.lock();
        let (counts, total) = &mut *guard;
        *total -= 1;
        if let Some(n) = counts.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_gets_its_share_and_its_places_come_back() {
        let r = Arc::new(TenantRequests::new(8, 25));
        let a = r.enter("evil").unwrap();
        let b = r.enter("evil").unwrap();
        let e = r.enter("evil").unwrap_err();
        assert_eq!((e.code.as_str(), e.close), ("tenant_overloaded", true));
        assert!(r.enter("good").is_ok());
        drop((a, b));
        assert!(r.counts.lock().0.get("evil").is_none());
        assert!(r.enter("evil").is_ok());
    }

    #[test]
    fn all_tenants_together_leave_an_eighth_of_the_connections() {
        let r = Arc::new(TenantRequests::new(16, 50));
        let held: Vec<_> = (0..14)
            .map(|i| r.enter(&format!("t{i}")).unwrap())
            .collect();
        let e = r.enter("another").unwrap_err();
        assert_eq!(e.code, "node_overloaded");
        drop(held);
        assert!(r.enter("another").is_ok());
    }
}
