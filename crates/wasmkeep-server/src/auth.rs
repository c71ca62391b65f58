//! Bearer tokens: one for `/admin`, one per tenant for `/v1/{tenant}`; and
//! the admin API's gate, which refuses what a browser page or the network
//! must not reach before any token is looked at.
//!
//! Tokens are compared through their SHA-256 digests in constant time, so
//! neither their content nor their length leaks through timing. They are
//! never logged.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use axum::http::{HeaderMap, StatusCode, header};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::unsafe_rules::UnsafeRules;

/// The tokens a node accepts. A missing token means "open".
#[derive(Clone, Default)]
pub struct Tokens {
    admin: Option<[u8; 32]>,
    tenants: BTreeMap<String, [u8; 32]>,
    /// Rules a test switched off (none, but in a `test-faults` build).
    unsafe_rules: UnsafeRules,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("admin", &self.admin.map(|_| "<redacted>"))
            .field("tenants", &self.tenants.keys().collect::<Vec<_>>())
            .finish()
    }
}

pub(crate) fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// Equal in time independent of where the inputs differ.
pub(crate) fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    bool::from(subtle::ConstantTimeEq::ct_eq(&a[..], &b[..]))
}

impl Tokens {
    pub fn new(admin: Option<&str>, tenants: &BTreeMap<String, String>) -> Tokens {
        Tokens {
            unsafe_rules: UnsafeRules::default(),
            admin: admin.map(digest),
            tenants: tenants
                .iter()
                .map(|(t, k)| (t.clone(), digest(k)))
                .collect(),
        }
    }

    /// These tokens with the rules a test switched off.
    pub fn with_unsafe_rules(mut self, rules: UnsafeRules) -> Tokens {
        self.unsafe_rules = rules;
        self
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

    /// Refuses an admin request, before its token is checked, when:
    ///
    /// - no admin token is set and the peer is not on loopback
    ///   (`admin_loopback_only`): nothing but a token opens the admin API
    ///   to the network, `--insecure` included; a peer that is unknown
    ///   counts as remote;
    /// - no admin token is set and `Host` does not name a loopback address
    ///   (`host_not_loopback`): a page whose name an attacker re-pointed at
    ///   127.0.0.1 (DNS rebinding) sends its own name;
    /// - a browser page sent it (`cross_origin`): with an admin token, a
    ///   page of another origin (`Origin` not this node's own, or
    ///   `Sec-Fetch-Site` other than `same-origin` or `none`); without one,
    ///   any page at all, since the node's own origin also serves every
    ///   tenant's pages under `/v1`.
    pub fn admin_gate(
        &self,
        peer: Option<SocketAddr>,
        headers: &HeaderMap,
    ) -> Result<(), ApiError> {
        let host = headers.get(header::HOST).map(|v| v.to_str().unwrap_or(""));
        if self.admin.is_none() && !self.unsafe_rules.admin_open_to_network {
            loopback_only(peer, host)?;
        }
        if self.unsafe_rules.admin_takes_any_page {
            return Ok(());
        }
        no_foreign_page(self.admin.is_some(), host, headers)
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

fn forbidden(code: &str, message: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, code, message)
}

/// The admin API without a token: a loopback peer, and a `Host` that names
/// a loopback address.
fn loopback_only(peer: Option<SocketAddr>, host: Option<&str>) -> Result<(), ApiError> {
    if !peer.is_some_and(|p| is_loopback(p.ip())) {
        let who = peer.map_or("unknown".to_owned(), |p| p.ip().to_string());
        return Err(forbidden(
            "admin_loopback_only",
            format!(
                "without an admin_token the admin API answers only to loopback peers: peer={who}"
            ),
        ));
    }
    if !host.is_some_and(host_is_loopback) {
        return Err(forbidden(
            "host_not_loopback",
            format!(
                "without an admin_token the admin API needs a Host that names a loopback address: host={}",
                host.unwrap_or("(none)")
            ),
        ));
    }
    Ok(())
}

/// Refuses a request a browser page sent, unless `same_origin_allowed` and
/// the page is of the node's own origin. Browsers send `Origin` with every
/// cross-origin request but a plain GET, and `Sec-Fetch-Site` (where they
/// send it) with every request; a client such as the CLI sends neither.
fn no_foreign_page(
    same_origin_allowed: bool,
    host: Option<&str>,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    let site = headers.get("sec-fetch-site").map(|v| v.as_bytes());
    let origin = headers
        .get(header::ORIGIN)
        .map(|v| v.to_str().unwrap_or(""));
    let site_ok = match site {
        // `none`: the user typed the address or opened a bookmark.
        None | Some(b"none") => true,
        Some(b"same-origin") => same_origin_allowed,
        Some(_) => false,
    };
    let origin_ok = match origin {
        None => true,
        Some(o) => same_origin_allowed && host.is_some_and(|h| same_origin(o, h)),
    };
    if site_ok && origin_ok {
        return Ok(());
    }
    let pages = if same_origin_allowed {
        "of other origins"
    } else {
        "without an admin_token"
    };
    Err(forbidden(
        "cross_origin",
        format!(
            "the admin API refuses requests from browser pages {pages}: origin={} sec-fetch-site={}",
            origin.unwrap_or("(none)"),
            site.map_or("(none)".into(), String::from_utf8_lossy),
        ),
    ))
}

/// Whether `ip` is a loopback address, an IPv4 one mapped into IPv6
/// included.
fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// Whether a `Host` value names a loopback address: `localhost` or a
/// loopback IP literal, with or without a port. Other names, even ones
/// that resolve to 127.0.0.1 today, are what DNS rebinding sends.
fn host_is_loopback(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok_and(is_loopback)
}

/// Whether `origin` is the origin of a page served from `host`: the
/// node's own origin, over plain HTTP or behind a proxy that ends TLS.
fn same_origin(origin: &str, host: &str) -> bool {
    ["http://", "https://"].iter().any(|scheme| {
        origin
            .strip_prefix(scheme)
            .is_some_and(|rest| rest.eq_ignore_ascii_case(host))
    })
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

    fn req(host: Option<&str>, origin: Option<&str>, site: Option<&str>) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in [("host", host), ("origin", origin), ("sec-fetch-site", site)] {
            if let Some(v) = v {
                m.insert(k, v.parse().unwrap());
            }
        }
        m
    }

    fn gate(t: &Tokens, peer: &str, h: HeaderMap) -> Result<(), String> {
        t.admin_gate(Some(peer.parse().unwrap()), &h).map_err(|e| {
            assert_eq!(e.status, StatusCode::FORBIDDEN);
            e.code
        })
    }

    const LO: &str = "127.0.0.1:5000";
    const NET: &str = "192.0.2.7:5000";

    #[test]
    fn without_an_admin_token_the_admin_api_answers_loopback_peers_only() {
        let open = Tokens::new(None, &BTreeMap::new());
        let cli = || req(Some("127.0.0.1:8080"), None, None);
        assert_eq!(gate(&open, LO, cli()), Ok(()));
        assert_eq!(gate(&open, "[::1]:5000", cli()), Ok(()));
        assert_eq!(gate(&open, "[::ffff:127.0.0.1]:5000", cli()), Ok(()));
        assert_eq!(gate(&open, NET, cli()), Err("admin_loopback_only".into()));
        assert_eq!(
            gate(&open, "[::ffff:192.0.2.7]:5000", cli()),
            Err("admin_loopback_only".into())
        );
        let unknown = open.admin_gate(None, &cli()).unwrap_err();
        assert_eq!(unknown.code, "admin_loopback_only");
        // With an admin token the network may reach it (the token decides).
        let locked = Tokens::new(Some("root"), &BTreeMap::new());
        assert_eq!(
            gate(&locked, NET, req(Some("node.example:8080"), None, None)),
            Ok(())
        );
    }

    #[test]
    fn without_an_admin_token_a_rebound_host_is_refused() {
        let open = Tokens::new(None, &BTreeMap::new());
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1",
            "127.1.2.3:80",
            "[::1]:8080",
        ] {
            assert_eq!(gate(&open, LO, req(Some(ok), None, None)), Ok(()), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "0.0.0.0:8080",
            "192.0.2.2:8080",
            "",
        ] {
            assert_eq!(
                gate(&open, LO, req(Some(bad), None, None)),
                Err("host_not_loopback".into()),
                "{bad}"
            );
        }
        assert_eq!(
            gate(&open, LO, req(None, None, None)),
            Err("host_not_loopback".into())
        );
    }

    #[test]
    fn browser_pages_of_other_origins_are_refused() {
        let locked = Tokens::new(Some("root"), &BTreeMap::new());
        let h = Some("node.example:8080");
        let cross = Err("cross_origin".to_string());
        assert_eq!(
            gate(&locked, NET, req(h, Some("http://node.example:8080"), None)),
            Ok(())
        );
        assert_eq!(
            gate(
                &locked,
                NET,
                req(h, Some("https://node.example:8080"), Some("same-origin"))
            ),
            Ok(())
        );
        assert_eq!(gate(&locked, NET, req(h, None, Some("none"))), Ok(()));
        assert_eq!(
            gate(&locked, NET, req(h, Some("http://evil.example"), None)),
            cross
        );
        assert_eq!(
            gate(&locked, NET, req(h, Some("http://node.example:9999"), None)),
            cross
        );
        assert_eq!(gate(&locked, NET, req(h, Some("null"), None)), cross);
        assert_eq!(
            gate(
                &locked,
                NET,
                req(None, Some("http://node.example:8080"), None)
            ),
            cross
        );
        assert_eq!(gate(&locked, NET, req(h, None, Some("cross-site"))), cross);
        assert_eq!(gate(&locked, NET, req(h, None, Some("same-site"))), cross);
        // Without a token even the node's own origin is refused: tenants'
        // pages are served from it.
        let open = Tokens::new(None, &BTreeMap::new());
        let lh = Some("127.0.0.1:8080");
        assert_eq!(
            gate(&open, LO, req(lh, Some("http://127.0.0.1:8080"), None)),
            cross
        );
        assert_eq!(gate(&open, LO, req(lh, None, Some("same-origin"))), cross);
        assert_eq!(gate(&open, LO, req(lh, None, Some("none"))), Ok(()));
    }
}
