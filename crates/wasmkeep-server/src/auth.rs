//! Bearer tokens: one for `/admin`, one per tenant for `/v1/{tenant}`.
//!
//! Tokens are compared through their SHA-256 digests in constant time, so
//! neither their content nor their length leaks through timing. They are
//! never logged.

use std::collections::BTreeMap;

use axum::http::HeaderMap;
use sha2::{Digest, Sha256};

/// The tokens a node accepts. A missing token means "open".
#[derive(Clone, Default)]
pub struct Tokens {
    admin: Option<[u8; 32]>,
    tenants: BTreeMap<String, [u8; 32]>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("admin", &self.admin.map(|_| "<redacted>"))
            .field("tenants", &self.tenants.keys().collect::<Vec<_>>())
            .finish()
    }
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// Equal in time independent of where the inputs differ.
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for i in 0..32 {
        diff |= a[i] ^ b[i];
    }
    std::hint::black_box(diff) == 0
}

impl Tokens {
    pub fn new(admin: Option<&str>, tenants: &BTreeMap<String, String>) -> Tokens {
        Tokens {
            admin: admin.map(digest),
            tenants: tenants
                .iter()
                .map(|(t, k)| (t.clone(), digest(k)))
                .collect(),
        }
    }

    /// Whether any token is configured.
    pub fn any(&self) -> bool {
        self.admin.is_some() || !self.tenants.is_empty()
    }

    fn bearer(headers: &HeaderMap) -> Option<[u8; 32]> {
        let v = headers
            .get(axum::http::header::AUTHORIZATION)?
            .to_str()
            .ok()?;
        let t = v
            .strip_prefix("Bearer ")
            .or_else(|| v.strip_prefix("bearer "))?;
        Some(digest(t.trim()))
    }

    /// Whether the request may use the admin API.
    pub fn admin_ok(&self, headers: &HeaderMap) -> bool {
        match &self.admin {
            None => true,
            Some(want) => Self::bearer(headers).is_some_and(|got| ct_eq(&got, want)),
        }
    }

    /// Whether the request may call actors of `tenant`: with the tenant's
    /// token, or the admin token. A tenant without a token is open only
    /// when no admin token is set either.
    pub fn tenant_ok(&self, tenant: &str, headers: &HeaderMap) -> bool {
        let got = Self::bearer(headers);
        if let (Some(g), Some(a)) = (&got, &self.admin)
            && ct_eq(g, a)
        {
            return true;
        }
        match self.tenants.get(tenant) {
            Some(want) => got.is_some_and(|g| ct_eq(&g, want)),
            None => self.admin.is_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(token: &str) -> HeaderMap {
        let mut m = HeaderMap::new();
        m.insert("authorization", format!("Bearer {token}").parse().unwrap());
        m
    }

    #[test]
    fn tokens_gate_admin_and_tenants() {
        let mut tenants = BTreeMap::new();
        tenants.insert("acme".to_string(), "t-acme".to_string());
        let t = Tokens::new(Some("root"), &tenants);
        assert!(t.admin_ok(&h("root")));
        assert!(!t.admin_ok(&h("roo")));
        assert!(!t.admin_ok(&HeaderMap::new()));
        assert!(t.tenant_ok("acme", &h("t-acme")));
        assert!(t.tenant_ok("acme", &h("root")));
        assert!(!t.tenant_ok("acme", &h("t-other")));
        assert!(!t.tenant_ok("other", &h("t-acme")));
        let open = Tokens::new(None, &BTreeMap::new());
        assert!(open.admin_ok(&HeaderMap::new()) && open.tenant_ok("x", &HeaderMap::new()));
        assert!(!format!("{t:?}").contains("root"));
    }
}
