//! Actor identity and the validation of its parts.

use std::fmt;

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

/// Longest tenant, app or class name.
pub const SEGMENT_BYTES_MAX: usize = 63;
/// Longest actor name, in bytes of UTF-8 (`name_bytes_max`): the one limit
/// every layer enforces (the HTTP edge and the runtime through [`ActorId`],
/// the replica before it builds a key, and `wasmkeep-cluster`, which
/// depends on nothing and keeps an equal copy that
/// `wasmkeep-replica/tests/names.rs` checks against this one).
///
/// Why 256: a name is hex in keys (twice as long), split into folders of
/// [`crate::paths::HEX_SEGMENT_CHARS`]. An actor's longest bucket key,
/// `state/<tenant>/<app>/<class>/<name hex>/delta/<seq>/<seq>`, is then 245
/// bytes plus 517 for the name: 762 of S3's 1,024, which leaves 262 for the
/// bucket's prefix; the alarm index's keys (ADR 0009) are shorter. A name
/// of 512 bytes (this limit before) could never be replicated.
pub const NAME_BYTES_MAX: usize = 256;
/// The reason [`validate_name`] gives for a name over [`NAME_BYTES_MAX`].
pub const NAME_TOO_LONG: &str = "longer than name_bytes_max=256";

/// `tenant/app/class/name`: one actor.
///
/// Written as text (its `Display`, every command's input and output, log
/// lines and error messages), the name is percent-encoded as in the
/// actor's URL ([`encode_name`]): `demo/examples/counter/a%2Fb%20c` is the
/// actor named `a/b c`, the one `/v1/demo/examples/counter/a%2Fb%20c/…`
/// reaches. One form everywhere, so any address printed can be pasted
/// into any command.
///
/// Tenant, app and class are identifiers (`[a-z0-9][a-z0-9_-]*`, at most
/// [`SEGMENT_BYTES_MAX`] bytes) so they can appear in paths and bucket keys
/// as they are. The name is any UTF-8 without control characters, at most
/// [`NAME_BYTES_MAX`] bytes; it is hex-encoded wherever it becomes part of a
/// path, so no name can escape its folder.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActorId {
    pub tenant: String,
    pub app: String,
    pub class: String,
    pub name: String,
}

/// Why a part of an actor's address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}: `{value}`")]
pub struct InvalidId {
    pub field: &'static str,
    pub reason: &'static str,
    pub value: String,
}

/// Decodes a percent-encoded actor name (one path segment) strictly: every
/// `%` must start two hex digits, and the bytes must be UTF-8. A lenient
/// decoder keeps `a%ZZ` as the name `a%ZZ`, so a typo would reach an actor
/// of its own; this refuses it. The error says what is wrong, for the
/// caller's `invalid_name`.
pub fn decode_name(raw: &str) -> Result<String, String> {
    // The crate's decoder is the lenient one (it keeps a `%` that starts no
    // escape), so every `%` is checked first. A `%` is not a hex digit, so
    // none lies inside another's escape: each must start one of its own.
    let escape = |i: usize| {
        let digits = raw.as_bytes().get(i + 1..i + 3);
        digits.is_some_and(|d| d.iter().all(u8::is_ascii_hexdigit))
    };
    if let Some((i, _)) = raw.match_indices('%').find(|&(i, _)| !escape(i)) {
        return Err(format!(
            "`%` at byte {i} is not followed by two hex digits (percent-encoding)"
        ));
    }
    percent_decode_str(raw)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| "percent-encoding is not utf-8".to_owned())
}

/// Checks a tenant, app or class name.
pub fn validate_segment(field: &'static str, value: &str) -> Result<(), InvalidId> {
    let bad = |reason| {
        Err(InvalidId {
            field,
            reason,
            value: value.chars().take(80).collect(),
        })
    };
    if value.is_empty() {
        return bad("empty");
    }
    if value.len() > SEGMENT_BYTES_MAX {
        return bad("longer than 63 bytes");
    }
    let mut bytes = value.bytes();
    let first = bytes.next().unwrap_or(b'-');
    if !(first.is_ascii_lowercase() || first.is_ascii_digit()) {
        return bad("must start with a-z or 0-9");
    }
    if !bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_') {
        return bad("only a-z, 0-9, '-' and '_' are allowed");
    }
    Ok(())
}

/// Checks an actor name.
pub fn validate_name(value: &str) -> Result<(), InvalidId> {
    let bad = |reason| {
        Err(InvalidId {
            field: "name",
            reason,
            value: value.chars().filter(|c| !c.is_control()).take(80).collect(),
        })
    };
    if value.is_empty() {
        return bad("empty");
    }
    if value.len() > NAME_BYTES_MAX {
        return bad(NAME_TOO_LONG);
    }
    if value.chars().any(char::is_control) {
        return bad("contains a control character");
    }
    Ok(())
}

impl ActorId {
    /// Builds an id, validating every part.
    pub fn new(tenant: &str, app: &str, class: &str, name: &str) -> Result<ActorId, InvalidId> {
        validate_segment("tenant", tenant)?;
        validate_segment("app", app)?;
        validate_segment("class", class)?;
        validate_name(name)?;
        Ok(ActorId {
            tenant: tenant.to_owned(),
            app: app.to_owned(),
            class: class.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.tenant,
            self.app,
            self.class,
            encode_name(&self.name)
        )
    }
}

/// What a name's written form percent-encodes: what cannot stand in a URL
/// path segment as it is (controls, space, `"#%/<>?[\]^`{|}`), and every
/// byte of a non-ASCII character. Anything else (letters, digits,
/// `-._~:@!$&'()*+,;=`) stays, so an ordinary name reads as itself.
const NAME_ENCODED: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// An actor name's written form, the inverse of [`decode_name`]: the
/// path segment of its URL.
pub fn encode_name(name: &str) -> std::borrow::Cow<'_, str> {
    utf8_percent_encode(name, NAME_ENCODED).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_actor_is_written_with_its_name_as_in_its_url_and_read_back() {
        let names = [
            "alice",
            "a/b c",
            "50%",
            "room:1@x",
            "é?#",
            "a-b.c_d~e",
            "x\\y",
        ];
        for name in names {
            let id = ActorId::new("t", "a", "c", name).unwrap();
            let text = id.to_string();
            let written = text.splitn(4, '/').nth(3).unwrap();
            assert!(!written.contains(['/', ' ', '?', '#']), "{text}");
            assert_eq!(decode_name(written).unwrap(), name, "{text}");
        }
        let id = ActorId::new("t", "a", "c", "a/b c").unwrap();
        assert_eq!(id.to_string(), "t/a/c/a%2Fb%20c");
        let plain = ActorId::new("t", "a", "c", "room:1@x").unwrap();
        assert_eq!(plain.to_string(), "t/a/c/room:1@x");
    }

    #[test]
    fn names_decode_strictly() {
        assert_eq!(decode_name("a%2Fb%20c").unwrap(), "a/b c");
        assert_eq!(decode_name("caf%C3%A9").unwrap(), "café");
        assert_eq!(decode_name("plain").unwrap(), "plain");
        for bad in ["a%ZZ", "a%", "a%2", "%g0", "100%"] {
            let why = decode_name(bad).unwrap_err();
            assert!(why.contains("two hex digits"), "{bad}: {why}");
        }
        assert!(decode_name("%ff").unwrap_err().contains("utf-8"));
        assert_eq!(decode_name("100%25").unwrap(), "100%");
        assert_eq!(decode_name("a+b%2b").unwrap(), "a+b+");
        assert!(decode_name("%2%41").unwrap_err().contains("at byte 0"));
    }

    #[test]
    fn segments_are_identifiers() {
        assert!(validate_segment("app", "chat-2_b").is_ok());
        for bad in ["", "-a", "A", "a/b", "a.b", "..", "a b", &"x".repeat(64)] {
            assert!(validate_segment("app", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn names_are_any_text_without_control_characters() {
        for good in ["a", "../..", "a/b/c", "ünï😀", ".", " spaced "] {
            assert!(validate_name(good).is_ok(), "{good:?} refused");
        }
        for bad in ["", "a\nb", "\u{0}", &"x".repeat(NAME_BYTES_MAX + 1)] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
        assert!(validate_name(&"é".repeat(NAME_BYTES_MAX / 2)).is_ok());
        assert!(validate_name(&"x".repeat(NAME_BYTES_MAX)).is_ok());
    }

    #[test]
    fn a_long_name_is_refused_naming_the_limit() {
        assert!(NAME_TOO_LONG.ends_with(&format!("name_bytes_max={NAME_BYTES_MAX}")));
        let e = validate_name(&"é".repeat(NAME_BYTES_MAX / 2 + 1)).unwrap_err();
        assert_eq!(e.reason, NAME_TOO_LONG);
        assert!(e.to_string().contains("name_bytes_max=256"), "{e}");
    }
}
