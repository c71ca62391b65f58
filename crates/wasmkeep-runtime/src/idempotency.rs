//! Idempotent requests (issue 36): a client that sends `Idempotency-Key`
//! gets one execution per key and actor, however often it retries.
//!
//! The rules, each one kept where the request runs (`actor/request.rs`):
//! - The answer is recorded in the actor's database, in the request's own
//!   savepoint: it commits with what the handler wrote, or neither does.
//!   A client that lost the answer to a crash between the commit and the
//!   reply gets the recorded answer on its retry; one whose request
//!   rolled back (the handler failed, the node died before the commit)
//!   runs it again, which is safe because nothing of it stayed.
//! - A repeat runs as an event of the actor like any other, so it waits
//!   for a first copy still queued or running ("concurrent duplicates wait
//!   for the first") and its reply waits for the durability of what it
//!   read, as every reply does.
//! - A key reused with another request (method, path, query or body)
//!   within the window is refused (`idempotency_key_reused`), not
//!   answered with the other request's answer.
//! - Records older than `idempotency_retention_ms` no longer answer and
//!   are pruned a few at a time by later records.
//! - Not recorded: a reply the handler parked (it is completed by a later
//!   event) and an accepted WebSocket upgrade; such requests run again.
//! - Only methods that change things are recorded: `GET`, `HEAD` and
//!   `OPTIONS` ignore the key (they are idempotent by HTTP's rules, and a
//!   client must not turn reads into writes of their answers).
//! - An answer larger than [`IDEMPOTENCY_RESPONSE_BYTES_MAX`] cannot be
//!   recorded: the request fails (`idempotency_response_too_large`) and
//!   rolls back, rather than be answered once and run again on a retry.

use sha2::{Digest, Sha256};

use crate::actor::ActorRequest;
use crate::error::RuntimeError;

/// The request header that carries the key (matched in any case).
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// The response header on an answer read back from the record.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The longest key, in bytes (Stripe's and the IETF draft's keys fit).
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 255;

/// The largest answer (body and headers) recorded for a key.
pub const IDEMPOTENCY_RESPONSE_BYTES_MAX: usize = 1024 * 1024;

/// Whether a request of `method` is deduplicated by its key.
pub fn applies(method: &str) -> bool {
    !matches!(method, "GET" | "HEAD" | "OPTIONS")
}

/// The key a request carries, checked: at most one header, 1 to
/// [`IDEMPOTENCY_KEY_BYTES_MAX`] bytes of visible ASCII.
pub fn key_of(headers: &[(String, String)]) -> Result<Option<&str>, RuntimeError> {
    let mut keys = headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(IDEMPOTENCY_KEY_HEADER))
        .map(|(_, v)| v.as_str());
    let Some(key) = keys.next() else {
        return Ok(None);
    };
    if keys.next().is_some() {
        return Err(RuntimeError::InvalidIdempotencyKey(
            "the request carries more than one Idempotency-Key header".into(),
        ));
    }
    if key.is_empty() || key.len() > IDEMPOTENCY_KEY_BYTES_MAX {
        return Err(RuntimeError::InvalidIdempotencyKey(format!(
            "Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_BYTES_MAX} bytes \
             (limit IDEMPOTENCY_KEY_BYTES_MAX), got {}",
            key.len()
        )));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(RuntimeError::InvalidIdempotencyKey(
            "Idempotency-Key must be visible ASCII characters and spaces".into(),
        ));
    }
    Ok(Some(key))
}

/// What identifies the request a key was used with: a hash of its
/// method, path, query and body, each length-prefixed so that no two
/// requests share one by moving bytes between the parts.
pub fn fingerprint(req: &ActorRequest) -> Vec<u8> {
    let mut h = Sha256::new();
    for part in [
        req.method.as_bytes(),
        req.path.as_bytes(),
        req.query.as_bytes(),
        &req.body,
    ] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.finalize().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, body: &[u8]) -> ActorRequest {
        ActorRequest {
            method: "POST".into(),
            path: path.into(),
            query: String::new(),
            headers: Vec::new(),
            body: body.to_vec(),
            replicated: false,
            trace: None,
        }
    }

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_key_is_found_in_any_case_and_bad_keys_are_refused_naming_the_limit() {
        assert_eq!(
            key_of(&h(&[("Idempotency-Key", "abc")])).unwrap(),
            Some("abc")
        );
        assert_eq!(key_of(&h(&[("x", "y")])).unwrap(), None);
        let long = "k".repeat(IDEMPOTENCY_KEY_BYTES_MAX + 1);
        let e = key_of(&h(&[("idempotency-key", &long)])).unwrap_err();
        assert_eq!(e.code(), "invalid_idempotency_key");
        assert!(e.to_string().contains("IDEMPOTENCY_KEY_BYTES_MAX"), "{e}");
        assert!(key_of(&h(&[("idempotency-key", "")])).is_err());
        assert!(key_of(&h(&[("idempotency-key", "a\u{7f}")])).is_err());
        assert!(key_of(&h(&[("idempotency-key", "a"), ("Idempotency-Key", "b")])).is_err());
    }

    #[test]
    fn fingerprints_differ_when_bytes_move_between_parts() {
        assert_ne!(
            fingerprint(&req("/ab", b"c")),
            fingerprint(&req("/a", b"bc"))
        );
        assert_eq!(
            fingerprint(&req("/a", b"bc")),
            fingerprint(&req("/a", b"bc"))
        );
    }
}
