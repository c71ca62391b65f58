//! The actor's sorted key-value store: string keys, byte values, kept in
//! its own database (in a table of the runtime's that guest SQL cannot
//! touch).
//!
//! Keys sort by their UTF-8 bytes, so `"item/10"` comes before `"item/9"`:
//! pad numbers in keys to list them in numeric order
//! (`format!("item/{n:010}")`). Writes are part of the event's
//! transaction: they commit when the handler returns `Ok` and roll back
//! otherwise; a read in the same event sees them.
//!
//! Values are bytes. [`get_as`] and [`put_as`] store typed values
//! ([`KvValue`]: text, numbers as decimal text, `true`/`false`), and with
//! the `json` feature [`get_json`] and [`put_json`] store any serde value
//! as JSON text.
//!
//! Limits, each named in its error: a key is at most `key_bytes_max`
//! (2 KiB by default; `key_too_large`), a key plus its value at most
//! `value_bytes_max` (2 MiB; `value_too_large`); a [`list`] returns at most
//! `kv_list_entries_max` entries (10,000) and `query_result_bytes_max`
//! bytes (32 MiB; `result_too_large`); a full database is `database_full`.
//!
//! ```no_run
//! use wasmkeep_sdk::kv;
//! # fn main() -> wasmkeep_sdk::Result<()> {
//! kv::put("setting/lang", b"en")?;
//! let lang: Option<Vec<u8>> = kv::get("setting/lang")?;
//!
//! let visits = kv::get_as::<u64>("visits")?.unwrap_or(0) + 1;
//! kv::put_as("visits", &visits)?; // stored as the text "1", "2", ...
//!
//! for (key, value) in kv::list_prefix("setting/", None)? {
//!     // in key order
//!     # let _ = (key, value);
//! }
//! let existed = kv::delete("setting/lang")?;
//! # let _ = (lang, existed);
//! # Ok(()) }
//! ```

use crate::{Error, Result, wit};

/// Which entries [`list`] returns, and in which order.
///
/// - `prefix: Option<String>`: only keys that start with it.
/// - `start: Option<String>`: only keys `>= start` (inclusive).
/// - `end: Option<String>`: only keys `< end` (exclusive).
/// - `limit: Option<u32>`: at most this many entries. The node caps it at
///   `kv_list_entries_max` (10,000 by default); `None` is that cap.
/// - `reverse: bool`: descending key order; with a limit, the entries are
///   then the largest keys of the range.
///
/// A key must pass every bound given; keys compare by their UTF-8 bytes.
/// `ListOptions::default()` gives no bound: every entry, ascending, up to
/// the cap.
///
/// ```no_run
/// use wasmkeep_sdk::kv::{self, ListOptions};
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// // The 10 latest events, keys `event/{ms:015}`.
/// let latest = kv::list(&ListOptions {
///     prefix: Some("event/".into()),
///     limit: Some(10),
///     reverse: true,
///     ..Default::default()
/// })?;
///
/// // Every entry under `user/`, a page at a time: `start` is inclusive,
/// // so the next page starts just after the last key seen.
/// let mut options = ListOptions {
///     prefix: Some("user/".into()),
///     limit: Some(100),
///     ..Default::default()
/// };
/// loop {
///     let page = kv::list(&options)?;
///     for (key, value) in &page {
///         // ...
///         # let _ = (key, value);
///     }
///     let Some((last, _)) = page.last() else { break };
///     options.start = Some(format!("{last}\0"));
/// }
/// # let _ = latest;
/// # Ok(()) }
/// ```
pub use wit::kv::ListOptions;

impl Default for ListOptions {
    /// No bound: every entry, in ascending key order, up to the node's cap.
    fn default() -> ListOptions {
        ListOptions {
            prefix: None,
            start: None,
            end: None,
            limit: None,
            reverse: false,
        }
    }
}

/// The value stored under `key`, or `None` if there is none.
///
/// ```no_run
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// let paused = wasmkeep_sdk::kv::get("paused")?.is_some();
/// # let _ = paused;
/// # Ok(()) }
/// ```
pub fn get(key: &str) -> Result<Option<Vec<u8>>> {
    wit::kv::get(key)
}

/// Stores `value` under `key`, replacing what was there.
///
/// ```no_run
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// wasmkeep_sdk::kv::put("paused", b"yes")?;
/// # Ok(()) }
/// ```
pub fn put(key: &str, value: &[u8]) -> Result<()> {
    wit::kv::put(key, value)
}

/// Removes `key`; returns whether it existed.
pub fn delete(key: &str) -> Result<bool> {
    wit::kv::delete(key)
}

/// Removes every key that starts with `prefix`; returns how many there
/// were. In the event's transaction, like every write.
///
/// ```no_run
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// let gone = wasmkeep_sdk::kv::delete_prefix("session/")?;
/// # let _ = gone;
/// # Ok(()) }
/// ```
pub fn delete_prefix(prefix: &str) -> Result<u64> {
    wit::kv::delete_prefix(prefix)
}

/// Removes every key; returns how many there were (tables, the alarm and
/// the rest stay: [`crate::delete_all`] removes everything).
pub fn delete_all() -> Result<u64> {
    wit::kv::delete_prefix("")
}

/// The entries whose key starts with `prefix`, in ascending key order, at
/// most `limit` of them (`None`: up to the node's cap). A shorthand for
/// [`list`].
pub fn list_prefix(prefix: &str, limit: Option<u32>) -> Result<Vec<(String, Vec<u8>)>> {
    list(&ListOptions {
        prefix: Some(prefix.to_owned()),
        start: None,
        end: None,
        limit,
        reverse: false,
    })
}

/// The entries `(key, value)` that `options` selects, in its order (see
/// [`ListOptions`]).
pub fn list(options: &ListOptions) -> Result<Vec<(String, Vec<u8>)>> {
    wit::kv::list(options)
}

/// A value [`get_as`] and [`put_as`] store as bytes.
///
/// The encodings are fixed, and readable wherever the bytes are shown
/// (`wasmkeep inspect`):
///
/// | type | stored as |
/// |---|---|
/// | `Vec<u8>` | the bytes themselves |
/// | `String` | its UTF-8 bytes |
/// | `i32`, `i64`, `u32`, `u64` | decimal ASCII text: `42`, `-7` |
/// | `f64` | Rust's shortest text that reads back exactly: `0.1`, `3.0`, `1e300`, `NaN`, `inf` |
/// | `bool` | `true` or `false` |
///
/// Numbers are text, not fixed-width binary, so that an entry reads the
/// same in the store's listings as in code, and so that what an actor
/// stored with `n.to_string()` reads back with `get_as`; the store never
/// orders values (only keys), so a binary encoding would buy nothing but
/// a few bytes. Integers decode strictly: `get_as::<u64>` of `"12 "`,
/// `"+12"`, `"-1"` or `"1.5"` is an error, not a guess. An `f64` decodes
/// with Rust's own parser, which also takes forms `encode_kv` never
/// writes (`+1`, `1E5`, `infinity`).
///
/// Implement it for a type of your own to store it the same way:
///
/// ```
/// use wasmkeep_sdk::kv::KvValue;
///
/// struct Celsius(i64);
///
/// impl KvValue for Celsius {
///     const TYPE_NAME: &'static str = "temperature in °C";
///     fn encode_kv(&self) -> Vec<u8> {
///         self.0.encode_kv()
///     }
///     fn decode_kv(bytes: &[u8]) -> Option<Self> {
///         i64::decode_kv(bytes).map(Celsius)
///     }
/// }
///
/// assert_eq!(Celsius(-4).encode_kv(), b"-4");
/// assert!(Celsius::decode_kv(b"warm").is_none());
/// ```
pub trait KvValue: Sized {
    /// The type's name as an error gives it: `"u64"`, `"String"`, ...
    const TYPE_NAME: &'static str;

    /// The bytes stored for the value.
    fn encode_kv(&self) -> Vec<u8>;

    /// The value the bytes hold, or `None` if they do not hold one.
    fn decode_kv(bytes: &[u8]) -> Option<Self>;
}

impl KvValue for Vec<u8> {
    const TYPE_NAME: &'static str = "Vec<u8>";
    fn encode_kv(&self) -> Vec<u8> {
        self.clone()
    }
    fn decode_kv(bytes: &[u8]) -> Option<Self> {
        Some(bytes.to_vec())
    }
}

impl KvValue for String {
    const TYPE_NAME: &'static str = "String (UTF-8 text)";
    fn encode_kv(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
    fn decode_kv(bytes: &[u8]) -> Option<Self> {
        String::from_utf8(bytes.to_vec()).ok()
    }
}

macro_rules! decimal_kv_value {
    ($($t:ty),*) => {
        $(
            impl KvValue for $t {
                const TYPE_NAME: &'static str = concat!(stringify!($t), " (decimal text)");
                fn encode_kv(&self) -> Vec<u8> {
                    self.to_string().into_bytes()
                }
                fn decode_kv(bytes: &[u8]) -> Option<Self> {
                    // Only what `encode_kv` writes: no `+` sign.
                    let text = std::str::from_utf8(bytes).ok()?;
                    if text.starts_with('+') {
                        return None;
                    }
                    text.parse().ok()
                }
            }
        )*
    };
}

decimal_kv_value!(i32, i64, u32, u64);

impl KvValue for f64 {
    const TYPE_NAME: &'static str = "f64 (decimal text)";
    fn encode_kv(&self) -> Vec<u8> {
        // `Debug` is the shortest text that reads back to the same value,
        // with an exponent for very large or small numbers.
        format!("{self:?}").into_bytes()
    }
    fn decode_kv(bytes: &[u8]) -> Option<Self> {
        std::str::from_utf8(bytes).ok()?.parse().ok()
    }
}

impl KvValue for bool {
    const TYPE_NAME: &'static str = "bool (`true` or `false`)";
    fn encode_kv(&self) -> Vec<u8> {
        let text: &[u8] = if *self { b"true" } else { b"false" };
        text.to_vec()
    }
    fn decode_kv(bytes: &[u8]) -> Option<Self> {
        match bytes {
            b"true" => Some(true),
            b"false" => Some(false),
            _ => None,
        }
    }
}

/// The value stored under `key` decoded as a `T` ([`KvValue`]), or `None`
/// if there is none.
///
/// Bytes that are not a `T` fail with code `invalid_value`, whose message
/// names the key and the type expected (not the bytes, which may be
/// private); passed on from a request's handler that is a 500
/// `guest_error`.
///
/// ```no_run
/// use wasmkeep_sdk::kv;
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// let limit: u64 = kv::get_as("limit")?.unwrap_or(100);
/// let name: Option<String> = kv::get_as("name")?;
/// # let _ = (limit, name);
/// # Ok(()) }
/// ```
pub fn get_as<T: KvValue>(key: &str) -> Result<Option<T>> {
    match get(key)? {
        None => Ok(None),
        Some(bytes) => decode_as(key, &bytes).map(Some),
    }
}

/// Stores `value` under `key` in its [`KvValue`] encoding, replacing what
/// was there.
///
/// ```no_run
/// use wasmkeep_sdk::kv;
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// kv::put_as("limit", &250u64)?; // the text "250"
/// kv::put_as("name", &String::from("Ada"))?;
/// kv::put_as("enabled", &true)?; // the text "true"
/// # Ok(()) }
/// ```
pub fn put_as<T: KvValue>(key: &str, value: &T) -> Result<()> {
    put(key, &value.encode_kv())
}

/// Decodes the bytes of entry `key` as a `T`, or the `invalid_value` error
/// [`get_as`] documents.
fn decode_as<T: KvValue>(key: &str, bytes: &[u8]) -> Result<T> {
    T::decode_kv(bytes).ok_or_else(|| {
        Error::new(
            "invalid_value",
            format!(
                "key-value entry `{}`: its {} bytes are not a {}",
                key.escape_debug(),
                bytes.len(),
                T::TYPE_NAME
            ),
        )
    })
}

/// The value stored under `key` parsed as JSON into a `T`, or `None` if
/// there is none.
///
/// A value that is not a JSON `T` fails with code `invalid_value`, whose
/// message names the key and gives serde_json's reason, with its line and
/// column (which may quote a small part of the value).
///
/// ```no_run
/// use serde::{Deserialize, Serialize};
/// use wasmkeep_sdk::kv;
///
/// #[derive(Serialize, Deserialize, Default)]
/// struct Settings {
///     lang: String,
///     volume: u8,
/// }
///
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// let mut s: Settings = kv::get_json("settings")?.unwrap_or_default();
/// s.volume = 7;
/// kv::put_json("settings", &s)?; // {"lang":"","volume":7}
/// # Ok(()) }
/// ```
#[cfg(feature = "json")]
#[cfg_attr(docsrs, doc(cfg(feature = "json")))]
pub fn get_json<T: serde::de::DeserializeOwned>(key: &str) -> Result<Option<T>> {
    match get(key)? {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Error::new(
                "invalid_value",
                format!(
                    "key-value entry `{}` is not the expected JSON: {e}",
                    key.escape_debug()
                ),
            )
        }),
    }
}

/// Stores `value` under `key` as compact JSON text, replacing what was
/// there; read it back with [`get_json`].
///
/// Fails with code `invalid_value` only if `value` cannot be written as
/// JSON (a map whose keys are not strings, or a `Serialize` impl that
/// fails); otherwise as [`put`] does.
#[cfg(feature = "json")]
#[cfg_attr(docsrs, doc(cfg(feature = "json")))]
pub fn put_json<T: serde::Serialize + ?Sized>(key: &str, value: &T) -> Result<()> {
    let bytes = serde_json::to_vec(value).map_err(|e| {
        Error::new(
            "invalid_value",
            format!(
                "the value of key-value entry `{}` could not be written as JSON: {e}",
                key.escape_debug()
            ),
        )
    })?;
    put(key, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: KvValue + PartialEq + std::fmt::Debug>(v: T, text: &[u8]) {
        assert_eq!(v.encode_kv(), text);
        assert_eq!(T::decode_kv(text), Some(v));
    }

    #[test]
    fn every_encoding_is_readable_text_and_reads_back() {
        round_trip(b"\x00\xff".to_vec(), b"\x00\xff");
        round_trip(String::from("café"), "café".as_bytes());
        round_trip(42u64, b"42");
        round_trip(u64::MAX, b"18446744073709551615");
        round_trip(-7i64, b"-7");
        round_trip(i64::MIN, b"-9223372036854775808");
        round_trip(-3i32, b"-3");
        round_trip(3u32, b"3");
        round_trip(0.1f64, b"0.1");
        round_trip(3.0f64, b"3.0");
        round_trip(1e300f64, b"1e300");
        round_trip(f64::INFINITY, b"inf");
        round_trip(true, b"true");
        round_trip(false, b"false");
        assert!(f64::decode_kv(b"NaN").unwrap().is_nan());
        assert_eq!(f64::NAN.encode_kv(), b"NaN");
    }

    #[test]
    fn decoding_is_strict() {
        assert_eq!(u64::decode_kv(b"12 "), None);
        assert_eq!(u64::decode_kv(b"+12"), None);
        assert_eq!(i64::decode_kv(b"+12"), None);
        assert_eq!(u64::decode_kv(b"-1"), None);
        assert_eq!(u64::decode_kv(b"1.5"), None);
        assert_eq!(u64::decode_kv(b""), None);
        assert_eq!(i64::decode_kv(&7i64.to_le_bytes()), None);
        assert_eq!(u32::decode_kv(b"4294967296"), None);
        assert_eq!(bool::decode_kv(b"yes"), None);
        assert_eq!(bool::decode_kv(b"True"), None);
        assert_eq!(String::decode_kv(b"\xff"), None);
    }

    #[test]
    fn a_value_that_does_not_decode_names_the_key_and_the_type() {
        let e = decode_as::<u64>("visits", b"lots").unwrap_err();
        assert_eq!(e.code, "invalid_value");
        assert!(e.message.contains("`visits`"), "{}", e.message);
        assert!(e.message.contains("u64"), "{}", e.message);
        assert!(!e.message.contains("lots"), "{}", e.message);
        assert_eq!(decode_as::<u64>("visits", b"3").unwrap(), 3);
    }

    #[test]
    fn default_list_options_have_no_bound() {
        let o = ListOptions::default();
        assert!(o.prefix.is_none() && o.start.is_none() && o.end.is_none());
        assert!(o.limit.is_none() && !o.reverse);
    }
}
