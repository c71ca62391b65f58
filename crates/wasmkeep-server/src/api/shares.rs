//! Places counted per key at the edge (issue 33): requests in flight per
//! tenant ([`TenantRequests`]) and WebSockets per client address (`ws`).
//!
//! A connection serves a tenant while one of its requests is being
//! handled, a parked reply's included: with no bound per tenant, 1,030
//! parked requests of one tenant took every connection of the node,
//! `/healthz` included. Each tenant may have at most `tenant_share_pct` of
//! `connections_max` requests in flight on this node; past it a request
//! gets 503 `tenant_overloaded` and its connection is closed, so that the
//! place goes to someone else. All tenants together may have
//! `connections_max` less an eighth of it (kept for `/healthz`, the admin
//! API and new connections; past it 503 `node_overloaded`).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use axum::http::StatusCode;
use parking_lot::Mutex;

use crate::error::ApiError;

/// Places taken per key, at most `per_key_max` each and `total_max` in all.
#[derive(Debug)]
pub(crate) struct Places<K: Hash + Eq + Clone> {
    per_key_max: usize,
    total_max: usize,
    taken: Mutex<(HashMap<K, usize>, usize)>,
}

/// Which bound refused a place.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Full {
    Key,
    Total,
}

/// One place taken; given back when dropped.
#[derive(Debug)]
pub(crate) struct Place<K: Hash + Eq + Clone> {
    of: Arc<Places<K>>,
    key: K,
}

impl<K: Hash + Eq + Clone> Places<K> {
    pub(crate) fn new(per_key_max: usize, total_max: usize) -> Places<K> {
        Places {
            per_key_max,
            total_max,
            taken: Mutex::new((HashMap::new(), 0)),
        }
    }

    /// Takes a place for `key`, or says which bound is reached.
    pub(crate) fn take(self: &Arc<Self>, key: &K) -> Result<Place<K>, Full> {
        let mut guard = self.taken.lock();
        let (counts, total) = &mut *guard;
        if *total >= self.total_max {
            return Err(Full::Total);
        }
        let n = counts.entry(key.clone()).or_insert(0);
        if *n >= self.per_key_max {
            return Err(Full::Key);
        }
        *n += 1;
        *total += 1;
        Ok(Place {
            of: Arc::clone(self),
            key: key.clone(),
        })
    }

    pub(crate) fn per_key_max(&self) -> usize {
        self.per_key_max
    }

    #[cfg(test)]
    fn taken_by(&self, key: &K) -> usize {
        self.taken.lock().0.get(key).copied().unwrap_or(0)
    }
}

impl<K: Hash + Eq + Clone> Drop for Place<K> {
    fn drop(&mut self) {
        let mut guard = self.of.taken.lock();
        let (counts, total) = &mut *guard;
        *total -= 1;
        if let Some(n) = counts.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

/// The requests each tenant has in flight on this node.
#[derive(Debug)]
pub(crate) struct TenantRequests(Arc<Places<String>>);

/// One request in flight; leaves when dropped.
pub(crate) type InFlight = Place<String>;

impl TenantRequests {
    /// `connections_max * share_pct / 100` requests per tenant (at least
    /// one), `connections_max` less an eighth in all.
    pub(crate) fn new(connections_max: usize, share_pct: u8) -> TenantRequests {
        let per_tenant =
            (connections_max.saturating_mul(usize::from(share_pct.min(100))) / 100).max(1);
        let total = (connections_max - connections_max / 8).max(1);
        TenantRequests(Arc::new(Places::new(per_tenant, total)))
    }

    /// Counts a request of `tenant`, or refuses it past the tenant's share
    /// or the node's bound (closing its connection).
    pub(crate) fn enter(&self, tenant: &str) -> Result<InFlight, ApiError> {
        let (code, message) = match self.0.take(&tenant.to_owned()) {
            Ok(place) => return Ok(place),
            Err(Full::Total) => (
                "node_overloaded",
                format!(
                    "the node has too many requests in flight: limit connections_max less an \
                     eighth={}; retry later",
                    self.0.total_max
                ),
            ),
            Err(Full::Key) => (
                "tenant_overloaded",
                format!(
                    "tenant `{tenant}` has too many requests in flight on this node: limit \
                     tenant_share_pct of connections_max={}; retry later",
                    self.0.per_key_max
                ),
            ),
        };
        let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message);
        e.retry_after_s = Some(1);
        Err(e.closing())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_gets_its_share_and_its_places_come_back() {
        let r = TenantRequests::new(8, 25);
        let a = r.enter("evil").unwrap();
        let b = r.enter("evil").unwrap();
        let e = r.enter("evil").unwrap_err();
        assert_eq!((e.code.as_str(), e.close), ("tenant_overloaded", true));
        assert!(r.enter("good").is_ok());
        drop((a, b));
        assert_eq!(r.0.taken_by(&"evil".to_owned()), 0);
        assert!(r.enter("evil").is_ok());
    }

    #[test]
    fn all_tenants_together_leave_an_eighth_of_the_connections() {
        let r = TenantRequests::new(16, 50);
        let held: Vec<_> = (0..14)
            .map(|i| r.enter(&format!("t{i}")).unwrap())
            .collect();
        let e = r.enter("another").unwrap_err();
        assert_eq!(e.code, "node_overloaded");
        drop(held);
        assert!(r.enter("another").is_ok());
    }
}
