//! Where an actor's chain lives in the bucket.
//!
//! ```text
//! <prefix>/state/<tenant>/<app>/<class>/<name as hex>/log/<seq, 20 digits>
//! <prefix>/state/<tenant>/<app>/<class>/<name as hex>/snap/<seq, 20 digits>
//! <prefix>/state/<tenant>/<app>/<class>/<name as hex>/delta/<snapshot seq, 20 digits>/<seq, 20 digits>
//! ```
//!
//! The name is hex-encoded and split exactly like the local layout
//! (`wasmkeep_store::paths`): folders of 200 hex characters, every one but
//! the last ending in `+`, so no actor's folder is a folder on the way to
//! another's, and nothing in a key needs escaping. Every folder name is at
//! most 201 bytes, well within the 255 a local folder (`file://`) allows.
//! Seqs are zero-padded so that key order is seq order.
//!
//! Names are at most `name_bytes_max` bytes ([`wasmkeep_store::id::NAME_BYTES_MAX`],
//! the one limit of every layer), checked here again before a key is
//! built; with it an actor's keys stay within S3's 1,024 bytes unless the
//! bucket's prefix is longer than 262 bytes (`key_too_long`).

use wasmkeep_store::ActorId;
use wasmkeep_store::id::{validate_name, validate_segment};
use wasmkeep_store::paths::name_segments;

use crate::entry::Token;
use crate::error::ReplicaError;
use crate::limits::KEY_BYTES_MAX;

/// Digits of a seq in a key.
pub const SEQ_DIGITS: usize = 20;
/// Longest tail under an actor's root: `delta/`, the snapshot's seq, `/`
/// and the delta's seq (a `whole/` key is as long: see [`WHOLE_TAG_BYTES`]).
const TAIL_BYTES_MAX: usize = 6 + SEQ_DIGITS + 1 + SEQ_DIGITS;
/// Bytes of an entry's nonce that name its body in `whole/` (hex, two
/// digits each): 80 random bits keep two writers' bodies apart, and the
/// key is no longer than a delta's. The reader checks the whole token.
const WHOLE_TAG_BYTES: usize = SEQ_DIGITS / 2;

/// One actor's folder in the bucket, relative to the bucket's prefix and
/// ending in `/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ActorRoot(String);

impl ActorRoot {
    /// The folder of `id`, refusing ids whose keys the store could not hold
    /// (`prefix_bytes` is the bucket prefix's length, slash included).
    pub fn new(id: &ActorId, prefix_bytes: usize) -> Result<ActorRoot, ReplicaError> {
        // `ActorId`'s fields are public: the same rules as `ActorId::new`.
        for (field, value) in [
            ("tenant", &id.tenant),
            ("app", &id.app),
            ("class", &id.class),
        ] {
            validate_segment(field, value).map_err(ReplicaError::InvalidName)?;
        }
        validate_name(&id.name).map_err(ReplicaError::InvalidName)?;
        let mut s = format!("state/{}/{}/{}/", id.tenant, id.app, id.class);
        for segment in name_segments(&id.name) {
            s.push_str(&segment);
            s.push('/');
        }
        let size = prefix_bytes + s.len() + TAIL_BYTES_MAX;
        if size > KEY_BYTES_MAX {
            return Err(ReplicaError::KeyTooLong {
                size,
                limit: KEY_BYTES_MAX,
            });
        }
        Ok(ActorRoot(s))
    }

    /// The folder as a string ending in `/`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `log/<seq>` under this root.
    pub fn log(&self, seq: u64) -> String {
        format!("{}{}", self.0, log_key(seq))
    }

    /// `snap/<seq>` under this root.
    pub fn snap(&self, seq: u64) -> String {
        format!("{}{}", self.0, snap_key(seq))
    }

    /// `delta/<base>/<seq>` under this root: the pages that changed
    /// between the snapshot at `base` and `seq` (ADR 0037).
    pub fn delta(&self, base: u64, seq: u64) -> String {
        format!("{}delta/{base:0w$}/{seq:0w$}", self.0, w = SEQ_DIGITS)
    }

    /// `whole/<seq>/<tag>` under this root: the body of the entry at `seq`
    /// that a pointer in `log/<seq>` names (ADR 0038); `tag` is the first
    /// bytes of the entry's nonce, so two writers never share the key.
    pub fn whole(&self, seq: u64, token: &Token) -> String {
        let tag = hex::encode(&token.nonce[..WHOLE_TAG_BYTES]);
        format!("{}whole/{seq:0w$}/{tag}", self.0, w = SEQ_DIGITS)
    }

    /// The `whole/` folder.
    pub fn whole_dir(&self) -> String {
        format!("{}whole/", self.0)
    }

    /// The `delta/` folder (every snapshot's deltas).
    pub fn delta_dir(&self) -> String {
        format!("{}delta/", self.0)
    }

    /// The folder of the deltas from the snapshot at `base`.
    pub fn deltas_of(&self, base: u64) -> String {
        format!("{}delta/{base:0w$}/", self.0, w = SEQ_DIGITS)
    }

    /// The `log/` folder.
    pub fn log_dir(&self) -> String {
        format!("{}log/", self.0)
    }

    /// The `snap/` folder.
    pub fn snap_dir(&self) -> String {
        format!("{}snap/", self.0)
    }
}

/// `log/<seq, 20 digits>`.
pub fn log_key(seq: u64) -> String {
    format!("log/{seq:0width$}", width = SEQ_DIGITS)
}

/// `snap/<seq, 20 digits>`.
pub fn snap_key(seq: u64) -> String {
    format!("snap/{seq:0width$}", width = SEQ_DIGITS)
}

/// The seq at the end of a key (`.../log/000...7` gives 7); `None` for
/// anything else, such as a file a human left there.
pub fn parse_seq(key: &str) -> Option<u64> {
    let last = key.rsplit('/').next()?;
    if last.len() != SEQ_DIGITS || !last.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    last.parse().ok()
}

/// The snapshot's seq and the delta's seq at the end of a delta's key
/// (`…/delta/<base>/<seq>`); `None` for anything else.
pub fn parse_delta(key: &str) -> Option<(u64, u64)> {
    let mut tail = key.rsplit('/');
    let seq = parse_seq(tail.next()?)?;
    let base = parse_seq(tail.next()?)?;
    (tail.next()? == "delta").then_some((base, seq))
}

/// The seq of a body in `whole/` (`…/whole/<seq>/<tag>`); `None` for
/// anything else.
pub fn parse_whole(key: &str) -> Option<u64> {
    let mut tail = key.rsplit('/');
    let tag = tail.next()?;
    let seq = parse_seq(tail.next()?)?;
    let tagged = tag.len() == 2 * WHOLE_TAG_BYTES && tag.bytes().all(|b| b.is_ascii_hexdigit());
    (tagged && tail.next()? == "whole").then_some(seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> ActorId {
        ActorId::new("t", "a", "c", name).unwrap()
    }

    #[test]
    fn keys_are_zero_padded_and_parse_back() {
        assert_eq!(log_key(7), "log/00000000000000000007");
        assert_eq!(snap_key(u64::MAX), "snap/18446744073709551615");
        let root = ActorRoot::new(&id("a/b"), 0).unwrap();
        assert_eq!(root.as_str(), "state/t/a/c/612f62/");
        assert_eq!(root.log(3), "state/t/a/c/612f62/log/00000000000000000003");
        assert_eq!(parse_seq(&root.log(3)), Some(3));
        assert_eq!(parse_seq(&root.snap(u64::MAX)), Some(u64::MAX));
        assert_eq!(
            root.delta(2, 9),
            "state/t/a/c/612f62/delta/00000000000000000002/00000000000000000009"
        );
        assert_eq!(parse_delta(&root.delta(2, 9)), Some((2, 9)));
        assert!(root.delta(2, 9).starts_with(&root.deltas_of(2)));
        assert_eq!(parse_delta(&root.log(9)), None);
        let token = Token {
            generation: u64::MAX,
            nonce: [0xab; 16],
        };
        let whole = root.whole(9, &token);
        assert_eq!(
            whole,
            "state/t/a/c/612f62/whole/00000000000000000009/abababababababababab"
        );
        assert!(whole.starts_with(&root.whole_dir()));
        // No longer than a delta's key: the bound on names holds for it.
        assert_eq!(whole.len(), root.delta(2, 9).len());
        assert_eq!(parse_whole(&whole), Some(9));
        assert_eq!(parse_whole(&root.delta(2, 9)), None);
        assert_eq!(parse_whole(&format!("{whole}x")), None);
        for bad in ["log/7", "log/0000000000000000000x", "", "log/"] {
            assert_eq!(parse_seq(bad), None, "{bad}");
        }
    }

    #[test]
    fn key_order_is_seq_order() {
        let mut seqs = vec![10u64, 9, 100, 0, 1 << 40, 11];
        let mut keys: Vec<String> = seqs.iter().map(|s| log_key(*s)).collect();
        keys.sort();
        seqs.sort();
        let parsed: Vec<u64> = keys.iter().map(|k| parse_seq(k).unwrap()).collect();
        assert_eq!(parsed, seqs);
    }

    #[test]
    fn long_names_split_like_the_local_layout_and_are_bounded() {
        let short = ActorRoot::new(&id(&"x".repeat(100)), 0).unwrap();
        let long = ActorRoot::new(&id(&"x".repeat(103)), 0).unwrap();
        assert!(!long.as_str().starts_with(short.as_str()));
        assert!(long.as_str().contains("+/"));
        // The longest name, with the longest tenant, app and class, fits
        // with a prefix of 262 bytes and no more.
        let max = wasmkeep_store::id::NAME_BYTES_MAX;
        let seg = "s".repeat(wasmkeep_store::id::SEGMENT_BYTES_MAX);
        let longest = ActorId::new(&seg, &seg, &seg, &"x".repeat(max)).unwrap();
        assert!(ActorRoot::new(&longest, 262).is_ok());
        let err = ActorRoot::new(&longest, 263).unwrap_err();
        assert_eq!(err.code(), "key_too_long");
        // Every folder fits a local folder's 255-byte names.
        let root = ActorRoot::new(&longest, 0).unwrap();
        assert!(root.as_str().split('/').all(|f| f.len() <= 201), "{root:?}");
        // A name one byte longer is refused by name, even in an id built by
        // hand.
        let mut over = id("x");
        over.name = "x".repeat(max + 1);
        let err = ActorRoot::new(&over, 0).unwrap_err();
        assert_eq!(err.code(), "invalid_name");
        assert!(err.to_string().contains("name_bytes_max=256"), "{err}");
    }
}
