//! Requests between the nodes of a cluster, signed (issue 33).
//!
//! A node forwards a client's request to the actor's owner, relays a
//! WebSocket there, and carries actor messages over
//! `/internal/inbound/...`. The owner must know such a request comes from a
//! node of its cluster: a forwarded request skips the tenant's token check
//! (the first node did it), and an inbound message names its sender, which
//! the receiver records as such. Before this module a cluster without a
//! configured secret trusted anyone on loopback, and with one the secret
//! itself crossed the network in a header, in the clear.
//!
//! Now every such request carries [`SIGNATURE_HEADER`]: an HMAC-SHA256,
//! keyed by the cluster's secret, over the method, the receiving node's
//! address, the path and query, the time, a nonce, the body's SHA-256 and
//! whether it is marked forwarded. The secret never leaves the node. The
//! receiver refuses a signature that does not check out, one whose time is
//! more than [`SIGNATURE_WINDOW_MS`] from its own clock, and a nonce it
//! already accepted within that window (a replay), so a captured request
//! is worth nothing after the window and nothing twice within it. The
//! body's hash travels in the header too, so the signature is checked
//! before the body is read ([`Signer::verify_head`]) and the body against
//! it after ([`body_matches`]): nobody but a node makes a node read a body
//! on a tenant's account.
//!
//! The secret is the configured `cluster_token`, or one the first node
//! created in the bucket ([`cluster_secret`]): every cluster has one.

use std::collections::{HashMap, VecDeque};

use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use wasmkeep_replica::Bucket;
use wasmkeep_replica::bucket::Created;

/// The header that carries a request's signature between nodes.
pub const SIGNATURE_HEADER: &str = "x-wasmkeep-signature";
/// How far a signature's time may be from the receiver's clock, either way
/// (nodes' clocks are expected within a few seconds of each other).
pub const SIGNATURE_WINDOW_MS: u64 = 30_000;
/// Nonces a node remembers within the window; past it, a signed request is
/// refused until older ones age out (a node would need to receive over
/// 8,000 forwarded requests a second for that).
pub const NONCES_MAX: usize = 262_144;
/// Where the bucket holds the secret of a cluster with no configured one.
pub const SECRET_KEY: &str = "cluster/secret";

type HmacSha256 = Hmac<Sha256>;

/// Why a signed request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    #[error("no signature: requests between cluster nodes carry `{SIGNATURE_HEADER}`")]
    Missing,
    #[error("a malformed signature in `{SIGNATURE_HEADER}`")]
    Malformed,
    #[error("the signature does not match this cluster's secret and the request")]
    Mismatch,
    #[error(
        "the signature's time is too far from this node's clock: limit \
         signature_window_ms={SIGNATURE_WINDOW_MS}: skew_ms={0}"
    )]
    Stale(u64),
    #[error("this signature was already used: a replayed request")]
    Replayed,
    #[error(
        "too many signed requests within the window to tell replays apart: limit \
         nonces_max={NONCES_MAX}"
    )]
    Busy,
}

/// What a signature covers, beside the key and the body.
#[derive(Debug, Clone, Copy)]
pub struct Signed<'a> {
    pub method: &'a str,
    /// The receiving node's advertised address: a request signed for one
    /// node is worth nothing at another.
    pub to: &'a str,
    pub path_and_query: &'a str,
    /// Whether it carries the forwarded marker.
    pub forwarded: bool,
}

/// The SHA-256 a signature names for the body.
pub type BodyHash = [u8; 32];

/// Whether `body` is the one the signature named.
pub fn body_matches(body: &[u8], named: &BodyHash) -> bool {
    let hash: BodyHash = Sha256::digest(body).into();
    bool::from(hash.ct_eq(named))
}

/// Signs requests to other nodes and checks those from them.
pub struct Signer {
    key: [u8; 32],
    seen: Mutex<Nonces>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer { .. }")
    }
}

#[derive(Default)]
struct Nonces {
    at: HashMap<[u8; 16], u64>,
    order: VecDeque<([u8; 16], u64)>,
}

impl Signer {
    /// A signer keyed by the cluster's secret.
    pub fn new(secret: &str) -> Signer {
        Signer {
            key: Sha256::digest(secret.as_bytes()).into(),
            seen: Mutex::new(Nonces::default()),
        }
    }

    fn mac(&self, r: &Signed<'_>, at_ms: u64, nonce: &[u8; 16], body: &BodyHash) -> [u8; 32] {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length");
        let text = format!(
            "wasmkeep-node-request-v1\n{}\n{}\n{}\n{at_ms}\n{}\n{}\n{}\n",
            r.method,
            r.to,
            r.path_and_query,
            hex::encode(nonce),
            hex::encode(body),
            u8::from(r.forwarded),
        );
        mac.update(text.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// The header value for `r` with `body`, sent at `now_ms`.
    pub fn sign(&self, r: &Signed<'_>, body: &[u8], now_ms: u64) -> String {
        let mut nonce = [0u8; 16];
        if getrandom::fill(&mut nonce).is_err() {
            // Without the system's randomness, a value that still never
            // repeats in this process: the time and a counter.
            use std::sync::atomic::{AtomicU64, Ordering};
            static COUNTER: AtomicU64 = AtomicU64::new(0);
            nonce[..8].copy_from_slice(&now_ms.to_le_bytes());
            nonce[8..].copy_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        }
        let hash: BodyHash = Sha256::digest(body).into();
        let mac = self.mac(r, now_ms, &nonce, &hash);
        format!(
            "v1 t={now_ms} n={} h={} s={}",
            hex::encode(nonce),
            hex::encode(hash),
            hex::encode(mac)
        )
    }

    /// Checks the signature `header` carries for `r`, received at `now_ms`,
    /// and remembers its nonce; returns the body's hash it names, which
    /// the body must match ([`body_matches`]) once read.
    pub fn verify_head(
        &self,
        header: Option<&str>,
        r: &Signed<'_>,
        now_ms: u64,
    ) -> Result<BodyHash, SignError> {
        let header = header.ok_or(SignError::Missing)?;
        let (at_ms, nonce, hash, mac) = parse(header).ok_or(SignError::Malformed)?;
        let want = self.mac(r, at_ms, &nonce, &hash);
        if !bool::from(want.ct_eq(&mac)) {
            return Err(SignError::Mismatch);
        }
        let skew = now_ms.abs_diff(at_ms);
        if skew > SIGNATURE_WINDOW_MS {
            return Err(SignError::Stale(skew));
        }
        self.seen.lock().admit(nonce, at_ms, now_ms)?;
        Ok(hash)
    }

    /// [`Signer::verify_head`] and [`body_matches`] at once.
    pub fn verify(
        &self,
        header: Option<&str>,
        r: &Signed<'_>,
        body: &[u8],
        now_ms: u64,
    ) -> Result<(), SignError> {
        let hash = self.verify_head(header, r, now_ms)?;
        if body_matches(body, &hash) {
            Ok(())
        } else {
            Err(SignError::Mismatch)
        }
    }
}

impl Nonces {
    /// Remembers `nonce` (signed at `at_ms`), unless it was seen within the
    /// window; forgets those that aged out.
    fn admit(&mut self, nonce: [u8; 16], at_ms: u64, now_ms: u64) -> Result<(), SignError> {
        let oldest = now_ms.saturating_sub(SIGNATURE_WINDOW_MS);
        while let Some((n, t)) = self.order.front().copied() {
            if t >= oldest {
                break;
            }
            self.order.pop_front();
            if self.at.get(&n) == Some(&t) {
                self.at.remove(&n);
            }
        }
        if self.at.contains_key(&nonce) {
            return Err(SignError::Replayed);
        }
        if self.at.len() >= NONCES_MAX {
            return Err(SignError::Busy);
        }
        // Kept until the signature's own time leaves the window: ordered by
        // arrival, an entry is dropped once the window passed the later of
        // its signing and its arrival.
        let keep_from = at_ms.max(now_ms);
        self.at.insert(nonce, keep_from);
        self.order.push_back((nonce, keep_from));
        Ok(())
    }
}

/// `v1 t=<ms> n=<32 hex> h=<64 hex> s=<64 hex>`.
fn parse(h: &str) -> Option<(u64, [u8; 16], BodyHash, [u8; 32])> {
    let mut parts = h.split(' ');
    if parts.next()? != "v1" {
        return None;
    }
    let at = parts.next()?.strip_prefix("t=")?.parse().ok()?;
    let nonce = hex::decode(parts.next()?.strip_prefix("n=")?)
        .ok()?
        .try_into()
        .ok()?;
    let hash = hex::decode(parts.next()?.strip_prefix("h=")?)
        .ok()?
        .try_into()
        .ok()?;
    let mac = hex::decode(parts.next()?.strip_prefix("s=")?)
        .ok()?
        .try_into()
        .ok()?;
    parts.next().is_none().then_some((at, nonce, hash, mac))
}

/// The cluster's secret: `configured`, or the one in the bucket at
/// [`SECRET_KEY`], which the first node to look creates (a create-only
/// write: two nodes starting at once agree on the one that landed).
pub async fn cluster_secret(
    configured: Option<&str>,
    bucket: &Bucket,
) -> Result<String, wasmkeep_replica::ReplicaError> {
    if let Some(s) = configured {
        return Ok(s.to_owned());
    }
    for _ in 0..3 {
        match bucket
            .get_bounded(SECRET_KEY, "cluster_secret_bytes_max", 1024)
            .await
        {
            Ok(b) => {
                let text = String::from_utf8_lossy(&b).trim().to_owned();
                if text.len() >= 32 {
                    return Ok(text);
                }
                return Err(wasmkeep_replica::ReplicaError::Corrupt {
                    key: SECRET_KEY.into(),
                    reason: "the cluster secret is shorter than 32 characters".into(),
                });
            }
            Err(e) if e.is_not_found() => {
                let mut key = [0u8; 32];
                getrandom::fill(&mut key).map_err(|e| {
                    wasmkeep_replica::ReplicaError::Io(std::io::Error::other(e.to_string()))
                })?;
                let secret = hex::encode(key);
                match bucket.create(SECRET_KEY, secret.clone().into()).await? {
                    Created::Created => return Ok(secret),
                    // Another node made it first: read theirs.
                    Created::AlreadyExists => continue,
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(wasmkeep_replica::ReplicaError::ChainBroken(format!(
        "could not read or create `{SECRET_KEY}`"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> Signed<'static> {
        Signed {
            method: "POST",
            to: "http://127.0.0.1:9001",
            path_and_query: "/internal/inbound/v1/t/a/c/n",
            forwarded: true,
        }
    }

    #[test]
    fn a_signature_checks_once_and_only_for_what_it_signed() {
        let (a, b) = (Signer::new("secret"), Signer::new("secret"));
        let now = 1_000_000;
        let h = a.sign(&req(), b"hello", now);
        assert_eq!(b.verify(Some(&h), &req(), b"hello", now + 10), Ok(()));
        assert_eq!(
            b.verify(Some(&h), &req(), b"hello", now + 20),
            Err(SignError::Replayed)
        );
        let mut other = req();
        other.to = "http://127.0.0.1:9002";
        let fresh = || a.sign(&req(), b"hello", now);
        assert_eq!(
            b.verify(Some(&fresh()), &other, b"hello", now),
            Err(SignError::Mismatch)
        );
        assert_eq!(
            b.verify(Some(&fresh()), &req(), b"hellp", now),
            Err(SignError::Mismatch)
        );
        let mut unmarked = req();
        unmarked.forwarded = false;
        assert_eq!(
            b.verify(Some(&fresh()), &unmarked, b"hello", now),
            Err(SignError::Mismatch)
        );
        assert_eq!(
            Signer::new("other").verify(Some(&fresh()), &req(), b"hello", now),
            Err(SignError::Mismatch)
        );
        assert_eq!(
            b.verify(None, &req(), b"hello", now),
            Err(SignError::Missing)
        );
        assert_eq!(
            b.verify(Some("v1 t=1"), &req(), b"hello", now),
            Err(SignError::Malformed)
        );
        // Another body's hash put in the header breaks the signature.
        let h = fresh();
        let hash = |b: &[u8]| hex::encode(Sha256::digest(b));
        let forged = h.replace(&hash(b"hello"), &hash(b"other"));
        assert_ne!(forged, h);
        assert_eq!(
            b.verify(Some(&forged), &req(), b"other", now),
            Err(SignError::Mismatch)
        );
    }

    #[test]
    fn a_signature_from_outside_the_window_is_refused() {
        let s = Signer::new("secret");
        let h = s.sign(&req(), b"", 1_000_000);
        let late = 1_000_000 + SIGNATURE_WINDOW_MS + 1;
        assert!(matches!(
            s.verify(Some(&h), &req(), b"", late),
            Err(SignError::Stale(_))
        ));
    }

    #[test]
    fn nonces_age_out_with_the_window() {
        let mut n = Nonces::default();
        assert_eq!(n.admit([1; 16], 1000, 1000), Ok(()));
        assert_eq!(n.admit([1; 16], 1000, 2000), Err(SignError::Replayed));
        // Past the window, the record is gone (and the signature would be
        // stale anyway).
        assert_eq!(n.admit([2; 16], 100_000, 100_000), Ok(()));
        assert!(!n.at.contains_key(&[1; 16]));
    }
}
