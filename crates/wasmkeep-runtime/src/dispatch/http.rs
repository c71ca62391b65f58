//! One attempt at an outbound HTTP call, within the app's policy.
//!
//! The allow-list is checked twice: when the guest sends (so a refusal is
//! the guest's error at once) and before each attempt. Addresses are
//! checked after the name is resolved, by the client's resolver: unless the
//! node allows private addresses (`outbound_private_allowed`, for tests), a
//! name that resolves to loopback, a private network, link-local (cloud
//! metadata) or the unspecified address is refused, so an allowed name
//! cannot be pointed at the node's own admin API or the bucket.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use wasmkeep_store::OutboxRow;

use crate::outbox::{OutboundPolicy, parse_url};

/// Whether an address is one a tenant must not reach unless the node says
/// so: loopback, private, link-local, unspecified, multicast.
pub(crate) fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => {
            a.is_loopback()
                || a.is_private()
                || a.is_link_local()
                || a.is_unspecified()
                || a.is_multicast()
                || a.is_broadcast()
                || a.octets()[0] == 0 // 0.0.0.0/8, "this network"
                || a.octets()[0] >= 240 // 240.0.0.0/4, reserved
                // 100.64.0.0/10, carrier-grade NAT.
                || (a.octets()[0] == 100 && (a.octets()[1] & 0xc0) == 64)
                // 198.18.0.0/15, benchmarking.
                || (a.octets()[0] == 198 && (a.octets()[1] & 0xfe) == 18)
        }
        IpAddr::V6(a) => {
            let s = a.segments();
            let embedded = |hi: u16, lo: u16| {
                std::net::Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)
            };
            if let Some(v4) = a.to_ipv4_mapped() {
                return is_private(IpAddr::V4(v4));
            }
            // IPv4-compatible (::a.b.c.d), NAT64 (64:ff9b::/96) and 6to4
            // (2002::/16) addresses reach an IPv4 address: judged as it.
            if s[..6] == [0; 6] || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                return is_private(IpAddr::V4(embedded(s[6], s[7])));
            }
            if s[0] == 0x2002 {
                return is_private(IpAddr::V4(embedded(s[1], s[2])));
            }
            a.is_loopback()
                || a.is_unspecified()
                || a.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link-local
        }
    }
}

/// Resolves names and drops the addresses a tenant may not reach.
struct Resolver {
    private_allowed: bool,
}

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let private_allowed = self.private_allowed;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| private_allowed || !is_private(a.ip()))
                .collect();
            if allowed.is_empty() && !found.is_empty() {
                return Err(Box::new(AddressForbidden(host)) as Box<_>);
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[derive(Debug)]
struct AddressForbidden(String);

impl std::fmt::Display for AddressForbidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} resolves only to private addresses (loopback, private, link-local), which this node does not let tenants reach (outbound_private_allowed)",
            self.0
        )
    }
}

impl std::error::Error for AddressForbidden {}

/// The node's client: no redirects followed (a redirect is an answer the
/// guest sees, so the allow-list cannot be walked around), no proxy from
/// the environment, names resolved by [`Resolver`].
pub(crate) fn client(private_allowed: bool) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(std::sync::Arc::new(Resolver { private_allowed }))
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client with rustls")
}

/// What one attempt got.
pub(crate) enum Attempt {
    Answered {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Worth trying again (a connection failure, a timeout).
    Retry(String, String),
    /// Never worth trying again (the policy, an answer over the bound).
    Final(String, String),
}

/// Statuses that are retried while attempts remain; the last attempt's
/// answer is delivered whatever its status.
pub(crate) fn retry_status(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504)
}

pub(crate) async fn attempt(
    client: &reqwest::Client,
    row: &OutboxRow,
    idempotency_key: &str,
    policy: &OutboundPolicy,
) -> Attempt {
    let parsed = match parse_url(&row.target) {
        Ok(p) => p,
        Err(m) => return Attempt::Final("invalid_url".into(), m),
    };
    if !policy.allows(&parsed.host, parsed.port) {
        // The app was redeployed with a narrower list since the send.
        return Attempt::Final(
            "host_not_allowed".into(),
            format!(
                "host {}:{} is not in this app's [outbound] hosts",
                parsed.host, parsed.port
            ),
        );
    }
    if let Some(ip) = parsed.ip
        && !policy.private_allowed
        && is_private(ip)
    {
        return Attempt::Final(
            "address_forbidden".into(),
            format!(
                "{ip} is a private address, which this node does not let tenants reach (outbound_private_allowed)"
            ),
        );
    }
    let method = match reqwest::Method::from_bytes(row.method.as_bytes()) {
        Ok(m) => m,
        Err(_) => return Attempt::Final("invalid_argument".into(), "bad method".into()),
    };
    let timeout = Duration::from_millis(u64::from(row.timeout_ms).min(policy.timeout_ms).max(1));
    let mut req = client
        .request(method, &row.target)
        .timeout(timeout)
        .header("idempotency-key", idempotency_key)
        .body(row.body.clone());
    for (k, v) in &row.headers {
        req = req.header(k, v);
    }
    let mut resp = match req.send().await {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    let limit = policy.response_bytes_max;
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > limit {
                    return Attempt::Final(
                        "response_too_large".into(),
                        format!("the answer's body is over outbound response_bytes_max={limit}"),
                    );
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => return failed(e),
        }
    }
    Attempt::Answered {
        status,
        headers,
        body,
    }
}

fn failed(e: reqwest::Error) -> Attempt {
    use std::error::Error;
    let mut source: Option<&dyn Error> = e.source();
    while let Some(s) = source {
        if let Some(f) = s.downcast_ref::<AddressForbidden>() {
            return Attempt::Final("address_forbidden".into(), f.to_string());
        }
        source = s.source();
    }
    if e.is_timeout() {
        return Attempt::Retry("timeout".into(), format!("the call timed out: {e}"));
    }
    let mut text = e.to_string();
    let mut source: Option<&dyn Error> = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    Attempt::Retry("connect_failed".into(), text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_addresses_are_recognised() {
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "172.16.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "0.1.2.3",
            "198.18.0.1",
            "240.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "::127.0.0.1",
        ] {
            assert!(is_private(a.parse().unwrap()), "{a}");
        }
        for a in [
            "93.184.216.34",
            "2606:2800:220:1::1",
            "100.128.0.1",
            "64:ff9b::5db8:d822",
        ] {
            assert!(!is_private(a.parse().unwrap()), "{a}");
        }
    }
}
