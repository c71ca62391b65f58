//! Where an actor's files live under a node's data directory.
//!
//! ```text
//! <data>/actors/<tenant>/<app>/<class>/<name as hex>/actor.db (+ -wal, -shm)
//! ```
//!
//! Tenant, app and class are validated identifiers. The name is hex-encoded
//! (lowercase), so slashes, dots, `..` and unicode in names never reach the
//! filesystem as such. A hex name longer than [`HEX_SEGMENT_CHARS`] is split
//! into folders of that many characters; every folder but the last ends in
//! `+`, a character hex never contains, so no actor's folder is ever also a
//! folder on the way to another actor's (a 200-character name and a longer
//! name that starts with it stay apart). Hex order is byte order, so a sorted
//! listing of hex names is a listing of names in byte order.

use std::io;
use std::path::{Path, PathBuf};

use crate::id::ActorId;

/// The file name of an actor's database inside its folder.
pub const DB_FILE: &str = "actor.db";
/// Longest folder name a hex name is split into (well under the 255 bytes
/// most filesystems allow).
pub const HEX_SEGMENT_CHARS: usize = 200;

/// The folder holding every actor of one class.
pub fn class_dir(data: &Path, tenant: &str, app: &str, class: &str) -> PathBuf {
    data.join("actors").join(tenant).join(app).join(class)
}

/// The path segments that stand for an actor's name: its hex in pieces of
/// at most [`HEX_SEGMENT_CHARS`], every piece but the last ending in `+`.
/// The data directory and the bucket (wasmkeep-replica) both use them.
pub fn name_segments(name: &str) -> Vec<String> {
    let hex = hex::encode(name.as_bytes());
    let chunks: Vec<&[u8]> = hex.as_bytes().chunks(HEX_SEGMENT_CHARS).collect();
    let last = chunks.len().saturating_sub(1);
    chunks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let c = std::str::from_utf8(c).expect("hex is ascii");
            if i < last {
                format!("{c}+")
            } else {
                c.to_owned()
            }
        })
        .collect()
}

/// The folder of one actor.
pub fn actor_dir(data: &Path, id: &ActorId) -> PathBuf {
    let mut dir = class_dir(data, &id.tenant, &id.app, &id.class);
    dir.extend(name_segments(&id.name));
    dir
}

/// The database file of one actor.
pub fn actor_db(data: &Path, id: &ActorId) -> PathBuf {
    actor_dir(data, id).join(DB_FILE)
}

/// Names (decoded) of the actors of a class that have a database, in byte
/// order, starting after `after` and at most `limit` of them.
///
/// Folders that do not decode (anything a human put there) are skipped.
pub fn list_names(class_dir: &Path, after: Option<&str>, limit: usize) -> io::Result<Vec<String>> {
    list_names_with_prefix(class_dir, "", after, limit)
}

/// [`list_names`] of the names that start with `prefix`, in one read of
/// the class's folder.
pub fn list_names_with_prefix(
    class_dir: &Path,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
) -> io::Result<Vec<String>> {
    let mut hex_names = Vec::new();
    collect(class_dir, String::new(), &mut hex_names)?;
    hex_names.sort_unstable();
    let after_hex = after.map(|a| hex::encode(a.as_bytes()));
    let prefix_hex = hex::encode(prefix.as_bytes());
    Ok(hex_names
        .into_iter()
        .filter(|h| h.starts_with(&prefix_hex))
        .filter(|h| after_hex.as_ref().is_none_or(|a| h > a))
        .filter_map(|h| String::from_utf8(hex::decode(&h).ok()?).ok())
        .take(limit)
        .collect())
}

fn collect(dir: &Path, prefix: String, out: &mut Vec<String>) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let is_dir = match entry.file_type() {
            Ok(t) => t.is_dir(),
            // Gone since the listing read it (a scratch file, ADR 0077).
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if !is_dir {
            continue;
        }
        if let Some(part) = name.strip_suffix('+') {
            if is_hex(part) {
                collect(&entry.path(), format!("{prefix}{part}"), out)?;
            }
        } else if is_hex(&name) && entry.path().join(DB_FILE).exists() {
            out.push(format!("{prefix}{name}"));
        }
    }
    Ok(())
}

fn is_hex(s: &str) -> bool {
    !s.is_empty()
        && s.len().is_multiple_of(2)
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> ActorId {
        ActorId::new("t", "a", "c", name).unwrap()
    }

    #[test]
    fn hostile_names_stay_in_their_class_folder() {
        let data = Path::new("/data");
        let class = class_dir(data, "t", "a", "c");
        for name in ["..", "../../etc", "a/b", "/", ".", "ü"] {
            let dir = actor_dir(data, &id(name));
            assert!(dir.starts_with(&class), "{name:?} -> {dir:?}");
            let rest = dir.strip_prefix(&class).unwrap();
            assert_eq!(rest.components().count(), 1, "{name:?} -> {dir:?}");
        }
    }

    #[test]
    fn long_names_split_without_folder_and_actor_colliding() {
        let data = Path::new("/data");
        let short = "x".repeat(HEX_SEGMENT_CHARS / 2);
        let long = "x".repeat(HEX_SEGMENT_CHARS / 2 + 3);
        let a = actor_dir(data, &id(&short));
        let b = actor_dir(data, &id(&long));
        assert!(!b.starts_with(&a), "{a:?} is a folder on the way to {b:?}");
        for c in b.components() {
            assert!(c.as_os_str().len() <= HEX_SEGMENT_CHARS + 1);
        }
    }

    #[test]
    fn listing_decodes_sorts_and_pages() {
        let tmp = tempfile::tempdir().unwrap();
        let names = [
            "b",
            "a",
            "../x",
            &"y".repeat(crate::id::NAME_BYTES_MAX),
            "ü",
        ];
        for n in names {
            let p = actor_db(tmp.path(), &id(n));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"").unwrap();
        }
        let class = class_dir(tmp.path(), "t", "a", "c");
        let all = list_names(&class, None, 100).unwrap();
        let mut expected: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        expected.sort();
        assert_eq!(all, expected);
        let page = list_names(&class, Some("a"), 2).unwrap();
        assert_eq!(page, expected[2..4].to_vec());
    }
}

#[cfg(test)]
mod fuzz {
    //! Any name either is refused or lands in exactly one folder of its own
    //! under its class folder, and lists back as itself.
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn any_name_stays_in_its_class_folder(name in any::<String>()) {
            let data = Path::new("/data");
            if let Ok(id) = ActorId::new("t", "a", "c", &name) {
                let class = class_dir(data, "t", "a", "c");
                let dir = actor_dir(data, &id);
                prop_assert!(dir.starts_with(&class));
                let rest = dir.strip_prefix(&class).unwrap();
                let parts: Vec<String> = rest
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                for (i, p) in parts.iter().enumerate() {
                    prop_assert!(p.len() <= HEX_SEGMENT_CHARS + 1);
                    prop_assert_eq!(p.ends_with('+'), i + 1 < parts.len());
                }
                let hex: String = parts.iter().map(|p| p.trim_end_matches('+')).collect();
                prop_assert_eq!(hex::decode(hex).unwrap(), name.as_bytes().to_vec());
            }
        }

        #[test]
        fn identifiers_are_validated_without_panicking(s in any::<String>()) {
            let ok = crate::id::validate_segment("app", &s).is_ok();
            prop_assert_eq!(
                ok,
                !s.is_empty()
                    && s.len() <= 63
                    && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
                    && !s.starts_with('-')
                    && !s.starts_with('_')
            );
        }
    }
}
