//! The cluster protocol of wasmkeep, sans-IO.
//!
//! This crate is pure functions and small state machines that take the current
//! time, random numbers and what a node read from the bucket, and return
//! decisions: which lease record to write, whether an actor's hold may be taken
//! and whether a node must be fenced first, which alarm index entry to list
//! before replicating an event and which to remove after it (ADR 0009's rules
//! R1 to R4 and the owner fence), and which overdue entries a sweep delivers.
//!
//! The order of the ownership steps (registering and renewing a node's lease,
//! reading another node's, taking and releasing an actor) lives here too, as
//! step machines in [`machine`]: time and nonces passed in, bucket operations
//! and notices pulled out, answers fed back (quinn-proto's shape; the module
//! documents it and shows a driver).
//!
//! What it is not: it does no I/O, reads no clock, draws no random numbers and
//! spawns nothing. It knows no object store, no tokio, no SQLite. The server
//! drives it with tokio and object_store; `wasmkeep-sim` drives the very same
//! functions and machines with a simulated clock, bucket and faults. The unsafe
//! variants in [`rules`] exist only so that the simulator can show each rule is
//! needed; the server always passes [`Rules::SAFE`].
//!
//! Bucket layout the functions format and parse (prefixes are parameters):
//!
//! ```text
//! nodes/<node-id>/<epoch, 20 digits>/<counter, 20 digits>     node lease (lease)
//! state/<tenant>/<app>/<class>/<name hex>/hold/<generation>    actor hold (hold)
//! <index prefix><due ms, 15 digits>/<class>.t/<name hex>/<generation, 20 digits>-<nonce, 16 hex>
//! <index prefix><due ms, 15 digits>/<class>/<name hex>          legacy entry (alarm_index)
//! ```

#![forbid(unsafe_code)]

pub mod alarm_index;
pub mod config;
pub mod delivery;
mod error;
pub mod hold;
pub mod lease;
pub mod machine;
pub mod retry;
pub mod rules;
pub mod sweep;

pub use alarm_index::{Address, Entry, IndexKey, Indexed, Layout, Tag};
pub use config::ClusterConfig;
pub use error::Error;
pub use rules::{Rules, Variant};

/// Formats bytes as lowercase hex, the only escaping the bucket layout uses.
pub fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0x0f) as usize] as char);
    }
    out
}

/// Parses lowercase hex; uppercase digits, odd lengths and other characters are
/// rejected so that every byte string has exactly one spelling in a key.
pub fn hex_decode(text: &str) -> Option<Vec<u8>> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// Parses exactly `digits` ASCII digits into a u64 (no sign, no overflow).
pub(crate) fn parse_fixed_digits(text: &str, digits: usize) -> Option<u64> {
    if text.len() != digits || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u64>().ok()
}

/// Parses exactly `digits` lowercase hex digits into a u64.
pub(crate) fn parse_fixed_hex(text: &str, digits: usize) -> Option<u64> {
    if text.len() != digits
        || !text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u64::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_other_spellings() {
        let bytes: Vec<u8> = (0..=255).collect();
        let hex = hex_encode(&bytes);
        assert_eq!(hex_decode(&hex).as_deref(), Some(&bytes[..]));
        assert_eq!(hex_decode("0A"), None);
        assert_eq!(hex_decode("abc"), None);
        assert_eq!(hex_decode("zz"), None);
        assert_eq!(hex_decode(""), Some(vec![]));
    }

    #[test]
    fn fixed_digits_reject_wrong_lengths_and_overflow() {
        assert_eq!(parse_fixed_digits("007", 3), Some(7));
        assert_eq!(parse_fixed_digits("07", 3), None);
        assert_eq!(parse_fixed_digits("+07", 3), None);
        assert_eq!(parse_fixed_digits("99999999999999999999", 20), None);
        assert_eq!(parse_fixed_hex("00000000000000ff", 16), Some(255));
        assert_eq!(parse_fixed_hex("00000000000000FF", 16), None);
    }
}

#[cfg(test)]
mod architecture {
    /// Architecture invariant: the protocol crate depends on nothing, so it
    /// cannot do I/O, read a clock or draw random numbers behind the caller's
    /// back.
    #[test]
    fn the_crate_has_no_dependencies() {
        let manifest = include_str!("../Cargo.toml");
        let deps = manifest
            .split("[dependencies]")
            .nth(1)
            .expect("a [dependencies] table");
        let until_next_table = deps.split("\n[").next().unwrap_or("");
        let entries: Vec<&str> = until_next_table
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        assert!(entries.is_empty(), "{entries:?}");
    }
}
