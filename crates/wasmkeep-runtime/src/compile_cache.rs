//! The compile cache: compiled components on disk, each vouched for by a
//! keyed hash, so that code is loaded only if this node (or a node holding
//! the same key) wrote it.
//!
//! ```text
//! <cache>/<hash>-<engine>.cwasm               compiled code (`Component::serialize`)
//! <cache>/<hash>-<engine>.cwasm.<key id>.mac  HMAC-SHA256 of it, hex
//! <data>/compile-cache.key                    the node's 32-byte secret, mode 0600
//! ```
//!
//! `Component::deserialize` trusts its bytes completely: they are machine
//! code. The cache folder may be shared (`WASMKEEP_COMPILE_CACHE`) and
//! written by others, so an artifact is read into memory, its tag checked
//! over exactly those bytes, and only then deserialized from the same
//! buffer (never from the file again, which could have changed meanwhile).
//! The tag covers the component's hash and the engine's settings too, so an
//! artifact and its tag copied under another component's name do not pass.
//! Anything that does not check out is compiled again.
//!
//! What it is not: a defence against someone who can write the node's data
//! folder (they can replace the key and the deployed components alike).

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Bytes of the node's secret.
const KEY_BYTES: usize = 32;
/// What every tag starts with, so a tag of anything else never matches.
const DOMAIN: &[u8] = b"wasmkeep compiled component v1\0";
/// Largest tag file read (64 hex digits and a newline, with room).
const TAG_FILE_BYTES_MAX: u64 = 256;
/// Largest artifact read, as a multiple of `component_bytes_max`: compiled
/// code is a few times the size of the component. A larger file is not
/// read (it is compiled again), so a planted file cannot make the node
/// allocate without bound.
pub(crate) const ARTIFACT_BYTES_PER_COMPONENT_BYTE_MAX: u64 = 16;

/// The node's secret for tagging compiled code.
pub(crate) struct CacheKey {
    key: [u8; KEY_BYTES],
    /// Names this key's tag files, so that nodes with other keys sharing a
    /// cache folder keep theirs beside it.
    id: String,
}

impl CacheKey {
    /// Reads the key at `path`, creating it first if there is none. A key
    /// file that someone else could have written or read (another owner, a
    /// symbolic link, group or other permissions, the wrong size) is
    /// refused: with it, tags would prove nothing.
    pub(crate) fn load_or_create(path: &Path) -> std::io::Result<CacheKey> {
        if std::fs::symlink_metadata(path).is_err() {
            create(path)?;
        }
        let meta = std::fs::symlink_metadata(path)?;
        let uid = euid();
        let mode = meta.permissions().mode();
        if !meta.file_type().is_file()
            || meta.uid() != uid
            || mode & 0o077 != 0
            || meta.len() != KEY_BYTES as u64
        {
            return Err(std::io::Error::other(format!(
                "refusing the compile cache key {}: it must be a regular {KEY_BYTES}-byte file of uid {uid} with mode 0600 (found uid {} mode {:o}, {} bytes)",
                path.display(),
                meta.uid(),
                mode & 0o7777,
                meta.len()
            )));
        }
        let mut key = [0u8; KEY_BYTES];
        std::fs::File::open(path)?.read_exact(&mut key)?;
        Ok(CacheKey::from_bytes(key))
    }

    fn from_bytes(key: [u8; KEY_BYTES]) -> CacheKey {
        let mut h = Sha256::new();
        h.update(b"wasmkeep compile cache key id\0");
        h.update(key);
        let id = hex::encode(&h.finalize()[..8]);
        CacheKey { key, id }
    }

    /// The tag of a compiled component: HMAC-SHA256 over the component's
    /// hash, the engine's settings and the compiled bytes, each with a
    /// fixed length or a length in front so no two inputs run together.
    fn tag(&self, component_hash: &str, engine: u64, artifact: &[u8]) -> [u8; 32] {
        let hash_len = (component_hash.len() as u64).to_le_bytes();
        let artifact_len = (artifact.len() as u64).to_le_bytes();
        hmac_sha256(
            &self.key,
            &[
                DOMAIN,
                &hash_len,
                component_hash.as_bytes(),
                &engine.to_le_bytes(),
                &artifact_len,
                artifact,
            ],
        )
    }

    /// Where this key's tag of `artifact_path` lives.
    fn tag_path(&self, artifact_path: &Path) -> PathBuf {
        let mut name = artifact_path.as_os_str().to_owned();
        name.push(format!(".{}.mac", self.id));
        PathBuf::from(name)
    }

    /// The artifact's bytes if its tag checks out; `Err` says why not
    /// (for the log), `Ok(None)` that there is nothing cached.
    pub(crate) fn read_verified(
        &self,
        artifact_path: &Path,
        component_hash: &str,
        engine: u64,
        artifact_bytes_max: u64,
    ) -> Result<Option<Vec<u8>>, String> {
        let tag_path = self.tag_path(artifact_path);
        if !artifact_path.exists() {
            return Ok(None);
        }
        let tag_hex = read_bounded(&tag_path, TAG_FILE_BYTES_MAX)
            .map_err(|e| format!("no readable tag for this node's key ({e})"))?;
        let tag = hex::decode(String::from_utf8_lossy(&tag_hex).trim())
            .map_err(|_| "the tag is not hex".to_owned())?;
        let artifact = read_bounded(artifact_path, artifact_bytes_max)
            .map_err(|e| format!("the artifact cannot be read ({e})"))?;
        let expected = self.tag(component_hash, engine, &artifact);
        if !constant_time_eq(&tag, &expected) {
            return Err("its tag does not match its bytes".into());
        }
        Ok(Some(artifact))
    }

    /// Writes an artifact and then its tag, each through a temporary file
    /// and a rename. A reader that sees one new and one old file finds a
    /// mismatch and compiles again; it never loads unchecked bytes.
    pub(crate) fn write(
        &self,
        artifact_path: &Path,
        component_hash: &str,
        engine: u64,
        artifact: &[u8],
    ) -> std::io::Result<()> {
        let tag = hex::encode(self.tag(component_hash, engine, artifact));
        write_renamed(artifact_path, artifact)?;
        write_renamed(&self.tag_path(artifact_path), tag.as_bytes())
    }
}

/// The effective user id (`geteuid` cannot fail).
fn euid() -> u32 {
    // SAFETY: `geteuid` has no preconditions and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// Creates a new key: written whole to a private temporary file, then
/// linked into place, which fails if another process created the key
/// meanwhile (that key is then used: readers never see a partial key).
fn create(path: &Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut key = [0u8; KEY_BYTES];
    getrandom::fill(&mut key).map_err(|e| std::io::Error::other(e.to_string()))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&key)?;
        f.sync_all()?;
    }
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

fn read_bounded(path: &Path, bytes_max: u64) -> std::io::Result<Vec<u8>> {
    let f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    if len > bytes_max {
        return Err(std::io::Error::other(format!(
            "{len} bytes, more than the {bytes_max} read"
        )));
    }
    let mut out = Vec::with_capacity(len as usize);
    // Read one byte past the bound: a file that grew since its size was
    // taken is refused too.
    f.take(bytes_max + 1).read_to_end(&mut out)?;
    if out.len() as u64 > bytes_max {
        return Err(std::io::Error::other("it grew while being read"));
    }
    Ok(out)
}

fn write_renamed(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// HMAC-SHA256 (RFC 2104) of the concatenation of `parts`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// Compares two tags without an early exit, so the time taken says
/// nothing about where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    bool::from(a.ct_eq(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2 of RFC 4231.
        let tag = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            hex::encode(tag),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    fn key_in(dir: &Path) -> CacheKey {
        CacheKey::load_or_create(&dir.join("compile-cache.key")).unwrap()
    }

    #[test]
    fn the_key_is_created_private_and_read_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let a = key_in(dir.path());
        let meta = std::fs::metadata(dir.path().join("compile-cache.key")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let b = key_in(dir.path());
        assert_eq!(a.key, b.key);
        assert_eq!(a.id, b.id);
    }

    #[test]
    fn a_key_others_may_read_or_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("compile-cache.key");
        key_in(dir.path());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = CacheKey::load_or_create(&path).err().unwrap().to_string();
        assert!(e.contains("mode 0600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link.key");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(CacheKey::load_or_create(&link).is_err());
        std::fs::write(dir.path().join("short.key"), b"short").unwrap();
        let short = dir.path().join("short.key");
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(CacheKey::load_or_create(&short).is_err());
    }

    #[test]
    fn only_the_bytes_tagged_for_that_component_and_engine_verify() {
        let dir = tempfile::tempdir().unwrap();
        let key = key_in(dir.path());
        let path = dir.path().join("a-1.cwasm");
        let max = 1 << 20;
        assert_eq!(key.read_verified(&path, "a", 1, max), Ok(None));
        key.write(&path, "a", 1, b"compiled code").unwrap();
        assert_eq!(
            key.read_verified(&path, "a", 1, max),
            Ok(Some(b"compiled code".to_vec()))
        );
        // Another component's name, another engine, another key: refused.
        assert!(key.read_verified(&path, "b", 1, max).is_err());
        assert!(key.read_verified(&path, "a", 2, max).is_err());
        let other = tempfile::tempdir().unwrap();
        assert!(
            key_in(other.path())
                .read_verified(&path, "a", 1, max)
                .is_err()
        );
        // Changed bytes, or more than the bound: refused.
        std::fs::write(&path, b"compiled codE").unwrap();
        assert!(key.read_verified(&path, "a", 1, max).is_err());
        key.write(&path, "a", 1, b"compiled code").unwrap();
        assert!(key.read_verified(&path, "a", 1, 4).is_err());
    }
}
