//! An app's kept versions (issue 38, "Versions"): every deploy is a
//! version, numbered from 1, and the last `app_versions_max` are kept so
//! that `wasmkeep rollback` can return to any of them.
//!
//! ```text
//! <data>/apps/<tenant>/<app>/versions.toml    the kept versions, oldest first
//! <data>/apps/<tenant>/<app>/v<N>.toml         the manifest version N was deployed with
//! <data>/apps/<tenant>/<app>/<hash>.wasm       a component, kept while a kept version names it
//! ```
//!
//! Components are stored once per hash (`app::persist`); a version is its
//! number, the component's hash, its own manifest and who deployed it when.
//! A rollback deploys a kept version's component and manifest again, as a
//! new version that names the one it returned to, as Durable Objects'
//! rollbacks do. Whatever no kept version names is removed at the next
//! deploy, so a dev loop that deploys at every save keeps a bounded folder.
//!
//! A deploy of the newest version's component with its manifest again is
//! that version, not a new one. An app deployed before versions existed
//! has no `versions.toml`: its current component becomes version 1 at its
//! next deploy.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// One kept deploy of an app.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppVersion {
    /// 1 for the app's first deploy, one more for each after.
    pub version: u64,
    /// The component's SHA-256, as `wasmkeep apps` shows it.
    pub hash: String,
    /// When it was deployed, unix ms (for version 1 of an app deployed
    /// before versions existed: when its component was stored).
    pub deployed_ms: u64,
    pub classes: Vec<String>,
    pub component_bytes: usize,
    /// Who deployed it, as the client said (`wasmkeep deploy` sends
    /// `$USER@host`); not authenticated beyond the admin token.
    #[serde(default)]
    pub by: String,
    /// For a rollback: the version it deployed again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_of: Option<u64>,
    /// The share of the app's actors that run it (a gradual rollout,
    /// ADR 0059): 100 for a whole deploy; below, the others run the newest
    /// whole version before it.
    #[serde(default = "whole", skip_serializing_if = "is_whole")]
    pub percent: u8,
    /// Whether an actor that is open when this version comes keeps its
    /// version until it closes (`deferred`), rather than taking this one
    /// at its next event.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deferred: bool,
}

fn whole() -> u8 {
    100
}

fn is_whole(p: &u8) -> bool {
    *p == 100
}

/// The version an app's actors run when no rollout names them: the newest
/// whole one (`None` if every kept version is partial).
pub(crate) fn stable(versions: &[AppVersion]) -> Option<&AppVersion> {
    versions.iter().rev().find(|v| v.percent == 100)
}

/// What `rollback` without a version returns to: during a rollout, the
/// whole version it rolls out from; otherwise the whole version before the
/// newest, passing over the partial steps of the rollout that led to it.
pub fn rollback_target(versions: &[AppVersion]) -> Option<&AppVersion> {
    // Both are the newest whole version before the newest one.
    stable(versions.split_last()?.1)
}

#[derive(Default, Serialize, Deserialize)]
struct VersionsFile {
    versions: Vec<AppVersion>,
}

const FILE: &str = "versions.toml";

/// The kept versions of the app stored in `dir`, oldest first (empty if
/// it never was deployed with versions).
pub(crate) fn read(dir: &Path) -> std::io::Result<Vec<AppVersion>> {
    match std::fs::read_to_string(dir.join(FILE)) {
        Ok(text) => toml::from_str::<VersionsFile>(&text)
            .map(|f| f.versions)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", dir.join(FILE).display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The manifest file of version `n`.
pub(crate) fn manifest_path(dir: &Path, n: u64) -> std::path::PathBuf {
    dir.join(format!("v{n}.toml"))
}

/// What a deploy adds to the list (the version number is given here).
pub(crate) struct NewVersion<'a> {
    pub hash: &'a str,
    pub deployed_ms: u64,
    pub classes: &'a [String],
    pub component_bytes: usize,
    pub manifest: &'a str,
    pub by: &'a str,
    pub rollback_of: Option<u64>,
    pub percent: u8,
    pub deferred: bool,
    /// The number the cluster's bucket gave this version (a cluster deploy,
    /// ADR 0058); `None`: the next one here. A recorded number replaces
    /// whatever this node listed at that number and after it, so that the
    /// node's list follows the bucket's.
    pub number: Option<u64>,
}

/// The component an app had before versions existed, listed as version 1
/// (by [`crate::Runtime::versions`] until its next deploy, then recorded).
pub(crate) fn legacy_version(
    hash: &str,
    classes: &[String],
    component_bytes: usize,
    deployed_ms: u64,
) -> AppVersion {
    AppVersion {
        version: 1,
        hash: hash.to_owned(),
        deployed_ms,
        classes: classes.to_vec(),
        component_bytes,
        by: String::new(),
        rollback_of: None,
        percent: 100,
        deferred: false,
    }
}

/// Appends a version to the app stored in `dir` (after its component and
/// manifest were written by hash), keeps the newest `keep`, and removes
/// the manifests and components no kept version names. Returns the new
/// version.
pub(crate) fn append(
    dir: &Path,
    new: &NewVersion<'_>,
    legacy: Option<AppVersion>,
    keep: usize,
    write: impl Fn(&Path, &[u8]) -> std::io::Result<()>,
) -> std::io::Result<AppVersion> {
    let mut versions = read(dir)?;
    if let Some(n) = new.number {
        if let Some(same) = versions
            .iter()
            .find(|v| v.version == n && v.hash == new.hash)
        {
            // Already installed here (a sync after this node's own deploy).
            return Ok(same.clone());
        }
        versions.retain(|v| v.version < n);
    } else if versions.is_empty()
        && let Some(old) = legacy
        && old.hash != new.hash
    {
        let text = std::fs::read(dir.join(format!("{}.toml", old.hash))).unwrap_or_default();
        write(&manifest_path(dir, old.version), &text)?;
        versions.push(old);
    }
    // The same component with the same manifest again (a node started with
    // `--examples` again, a script that deploys at every run) is the newest
    // version still, not a new one.
    if let Some(last) = versions.last()
        && new.number.is_none()
        && new.rollback_of.is_none()
        && last.hash == new.hash
        && last.percent == new.percent
        && last.deferred == new.deferred
        && std::fs::read(manifest_path(dir, last.version))
            .is_ok_and(|m| m == new.manifest.as_bytes())
    {
        return Ok(last.clone());
    }
    let n = new
        .number
        .unwrap_or_else(|| versions.last().map_or(1, |v| v.version + 1));
    write(&manifest_path(dir, n), new.manifest.as_bytes())?;
    let added = AppVersion {
        version: n,
        hash: new.hash.to_owned(),
        deployed_ms: new.deployed_ms,
        classes: new.classes.to_vec(),
        component_bytes: new.component_bytes,
        by: new.by.to_owned(),
        rollback_of: new.rollback_of,
        percent: new.percent,
        deferred: new.deferred,
    };
    versions.push(added.clone());
    let dropped = versions.len().saturating_sub(keep.max(1));
    let stable_number = stable(&versions).map(|v| v.version);
    let mut kept = versions.split_off(dropped);
    // The version the actors outside a rollout run is kept, however many
    // partial versions came after it.
    if let Some(n) = stable_number
        && !kept.iter().any(|v| v.version == n)
        && let Some(s) = versions.iter().find(|v| v.version == n)
    {
        kept.insert(0, s.clone());
    }
    let body = toml::to_string(&VersionsFile {
        versions: kept.clone(),
    })
    .map_err(std::io::Error::other)?;
    write(&dir.join(FILE), body.as_bytes())?;
    prune(dir, &kept)?;
    Ok(added)
}

/// Removes every `v<N>.toml`, `<hash>.wasm` and `<hash>.toml` that no kept
/// version names (the newest version's files are always kept).
fn prune(dir: &Path, kept: &[AppVersion]) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((stem, ext)) = name.rsplit_once('.') else {
            continue;
        };
        let named = match ext {
            "toml" if stem.starts_with('v') && stem[1..].bytes().all(|b| b.is_ascii_digit()) => {
                kept.iter().any(|v| format!("v{}", v.version) == stem)
            }
            "wasm" | "toml" if stem.len() == 64 && stem.bytes().all(|b| b.is_ascii_hexdigit()) => {
                kept.iter().any(|v| v.hash == stem)
            }
            _ => true,
        };
        if !named {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(c: char) -> String {
        std::iter::repeat_n(c, 64).collect()
    }

    fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        std::fs::write(path, bytes)
    }

    fn deploy(dir: &Path, h: &str, keep: usize) -> AppVersion {
        std::fs::write(dir.join(format!("{h}.wasm")), b"w").unwrap();
        std::fs::write(dir.join(format!("{h}.toml")), b"").unwrap();
        let new = NewVersion {
            hash: h,
            deployed_ms: 7,
            classes: &["c".to_owned()],
            component_bytes: 1,
            manifest: &format!("# {h}"),
            by: "me@here",
            rollback_of: None,
            percent: 100,
            deferred: false,
            number: None,
        };
        append(dir, &new, None, keep, write).unwrap()
    }

    #[test]
    fn versions_count_up_and_only_the_kept_ones_keep_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(deploy(d, &hash('a'), 2).version, 1);
        assert_eq!(deploy(d, &hash('a'), 2).version, 1, "the same again");
        assert_eq!(deploy(d, &hash('b'), 2).version, 2);
        assert_eq!(deploy(d, &hash('a'), 2).version, 3);
        let v = read(d).unwrap();
        assert_eq!(v.iter().map(|v| v.version).collect::<Vec<_>>(), [2, 3]);
        assert!(!manifest_path(d, 1).exists(), "version 1's manifest went");
        assert!(d.join(format!("{}.wasm", hash('a'))).exists(), "3 names a");
        deploy(d, &hash('c'), 2);
        assert!(
            !d.join(format!("{}.wasm", hash('b'))).exists(),
            "b is named by none"
        );
        assert_eq!(
            std::fs::read_to_string(manifest_path(d, 4)).unwrap(),
            format!("# {}", hash('c'))
        );
        // Files that are not an app's own are left alone.
        std::fs::write(d.join("current"), b"x").unwrap();
        deploy(d, &hash('d'), 2);
        assert!(d.join("current").exists());
    }

    #[test]
    fn a_number_from_the_bucket_replaces_what_this_node_listed_from_it_on() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for c in ['a', 'b', 'c'] {
            deploy(d, &hash(c), 10);
        }
        let recorded = |h: &str, n: u64| {
            std::fs::write(d.join(format!("{h}.wasm")), b"w").unwrap();
            let new = NewVersion {
                hash: h,
                deployed_ms: 8,
                classes: &[],
                component_bytes: 1,
                manifest: "",
                by: "elsewhere",
                rollback_of: None,
                percent: 100,
                deferred: false,
                number: Some(n),
            };
            append(d, &new, None, 10, write).unwrap()
        };
        let numbers = || {
            read(d)
                .unwrap()
                .iter()
                .map(|v| (v.version, v.hash.clone()))
                .collect::<Vec<_>>()
        };
        // Another node's version 2 wins over this node's own 2 and 3.
        assert_eq!(recorded(&hash('x'), 2).version, 2);
        assert_eq!(numbers(), [(1, hash('a')), (2, hash('x'))]);
        assert!(!d.join(format!("{}.wasm", hash('c'))).exists(), "3 is gone");
        // Installed again: nothing changes.
        assert_eq!(recorded(&hash('x'), 2).by, "elsewhere");
        assert_eq!(numbers().len(), 2);
        // Versions this node missed are left out, not invented.
        recorded(&hash('y'), 5);
        assert_eq!(numbers().iter().map(|v| v.0).collect::<Vec<_>>(), [1, 2, 5]);
    }

    #[test]
    fn a_rollback_returns_past_a_rollouts_steps() {
        let v = |n: u64, h: char, percent: u8| AppVersion {
            percent,
            ..legacy_version(&hash(h), &[], 1, n)
        };
        let numbered = |mut x: AppVersion, n: u64| {
            x.version = n;
            x
        };
        let list = |specs: &[(char, u8)]| -> Vec<AppVersion> {
            specs
                .iter()
                .enumerate()
                .map(|(i, (h, p))| numbered(v(i as u64, *h, *p), i as u64 + 1))
                .collect()
        };
        let target = |l: &[AppVersion]| rollback_target(l).map(|t| t.version);
        // Whole versions only: the one before.
        assert_eq!(target(&list(&[('a', 100), ('b', 100)])), Some(1));
        // During a rollout: the whole version it rolls out from.
        assert_eq!(target(&list(&[('a', 100), ('b', 10), ('b', 50)])), Some(1));
        // After it finished: past its partial steps.
        assert_eq!(
            target(&list(&[('a', 100), ('b', 10), ('b', 50), ('b', 100)])),
            Some(1)
        );
        assert_eq!(target(&list(&[('a', 100)])), None);
    }

    #[test]
    fn an_app_deployed_before_versions_becomes_version_one() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join(format!("{}.wasm", hash('a'))), b"w").unwrap();
        std::fs::write(
            d.join(format!("{}.toml", hash('a'))),
            b"[vars]\nA = \"1\"\n",
        )
        .unwrap();
        std::fs::write(d.join(format!("{}.wasm", hash('b'))), b"w").unwrap();
        let legacy = legacy_version(&hash('a'), &["c".into()], 1, 3);
        let new = NewVersion {
            hash: &hash('b'),
            deployed_ms: 9,
            classes: &[],
            component_bytes: 1,
            manifest: "",
            by: "",
            rollback_of: None,
            percent: 100,
            deferred: false,
            number: None,
        };
        assert_eq!(append(d, &new, Some(legacy), 10, write).unwrap().version, 2);
        let v = read(d).unwrap();
        assert_eq!((v[0].version, v[0].hash.as_str()), (1, hash('a').as_str()));
        assert_eq!(
            std::fs::read_to_string(manifest_path(d, 1)).unwrap(),
            "[vars]\nA = \"1\"\n"
        );
    }
}
