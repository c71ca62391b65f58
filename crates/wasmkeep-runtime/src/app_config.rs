//! An app's configuration (ADR 0041): the variables of its manifest's
//! `[vars]`, and secrets an operator sets through the admin API.
//!
//! Variables are part of the manifest, which the admin API shows. Secrets
//! are not: they live in `secrets/{tenant}/{app}` in the data directory
//! (mode 0600; a line `NAME=value-in-hex` each), apart from the app, so they outlive redeploys
//! and may be set before the first deploy; the admin API lists their names
//! only. Guests read both through `config.get` (a secret shadows a variable
//! of the same name). A guest's log line that contains a secret's value
//! has it replaced by `[secret]` before it reaches the node's log.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;
use wasmkeep_store::id::validate_segment;

use crate::error::RuntimeError;
use crate::host::HostState;
use crate::host::wasmkeep::actor::config;

/// Variables or secrets one app may have (each).
pub(crate) const CONFIG_ENTRIES_MAX: usize = 256;
/// Longest variable or secret name.
pub(crate) const CONFIG_NAME_BYTES_MAX: usize = 128;
/// Largest variable or secret value.
pub const CONFIG_VALUE_BYTES_MAX: usize = 16 * 1024;
/// Secret values shorter than this are not scrubbed from log lines (a
/// two-letter secret would blank out every word that holds it).
pub(crate) const SCRUB_BYTES_MIN: usize = 6;

/// A name: a letter or `_`, then letters, digits and `_`.
pub(crate) fn check_name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= CONFIG_NAME_BYTES_MAX
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} name `{}` must be a letter or `_` then letters, digits or `_`, at most config_name_bytes_max={CONFIG_NAME_BYTES_MAX} bytes",
            name.escape_debug()
        ))
    }
}

pub(crate) fn check_value(what: &str, name: &str, value: &str) -> Result<(), String> {
    if value.len() > CONFIG_VALUE_BYTES_MAX {
        return Err(format!(
            "{what} `{name}` too large: size={} limit config_value_bytes_max={CONFIG_VALUE_BYTES_MAX}",
            value.len()
        ));
    }
    Ok(())
}

/// Checks a manifest's `[vars]`.
pub(crate) fn check_vars(vars: &BTreeMap<String, String>) -> Result<(), String> {
    if vars.len() > CONFIG_ENTRIES_MAX {
        return Err(format!(
            "vars: {} entries, limit config_entries_max={CONFIG_ENTRIES_MAX}",
            vars.len()
        ));
    }
    for (k, v) in vars {
        check_name("vars: variable", k)?;
        check_value("vars: variable", k, v)?;
    }
    Ok(())
}

/// The secrets file: `NAME=hex(value)` a line (names hold no `=`).
fn encode(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={}\n", hex::encode(v)))
        .collect()
}

fn decode(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            let v = String::from_utf8(hex::decode(v).ok()?).ok()?;
            Some((k.to_owned(), v))
        })
        .collect()
}

/// One app's secrets, shared by its instances and the admin API.
pub(crate) type Secrets = Arc<RwLock<BTreeMap<String, String>>>;

/// Every app's secrets on this node, kept on disk.
pub struct SecretStore {
    dir: PathBuf,
    apps: RwLock<BTreeMap<(String, String), Secrets>>,
}

impl SecretStore {
    pub fn open(data: &Path) -> SecretStore {
        SecretStore {
            dir: data.join("secrets"),
            apps: RwLock::new(BTreeMap::new()),
        }
    }

    fn file(&self, tenant: &str, app: &str) -> PathBuf {
        self.dir.join(tenant).join(app)
    }

    /// An app's secrets (read from disk the first time).
    pub fn of(&self, tenant: &str, app: &str) -> Secrets {
        let key = (tenant.to_owned(), app.to_owned());
        if let Some(s) = self.apps.read().get(&key) {
            return Arc::clone(s);
        }
        let loaded = std::fs::read_to_string(self.file(tenant, app))
            .map(|text| decode(&text))
            .unwrap_or_default();
        let mut apps = self.apps.write();
        Arc::clone(
            apps.entry(key)
                .or_insert_with(|| Arc::new(RwLock::new(loaded))),
        )
    }

    fn save(&self, tenant: &str, app: &str, map: &BTreeMap<String, String>) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.file(tenant, app);
        let dir = path.parent().expect("a folder");
        std::fs::create_dir_all(dir)?;
        let tmp = path.with_extension("partial");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(encode(map).as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        wasmkeep_store::sync::sync_dir(dir)
    }

    fn check_app(tenant: &str, app: &str) -> Result<(), RuntimeError> {
        validate_segment("tenant", tenant)?;
        validate_segment("app", app)?;
        Ok(())
    }

    /// Sets (or replaces) a secret; durable when this returns.
    pub fn set(
        &self,
        tenant: &str,
        app: &str,
        name: &str,
        value: &str,
    ) -> Result<(), RuntimeError> {
        Self::check_app(tenant, app)?;
        check_name("secret", name).map_err(RuntimeError::InvalidConfig)?;
        check_value("secret", name, value).map_err(RuntimeError::InvalidConfig)?;
        let secrets = self.of(tenant, app);
        let mut map = secrets.write();
        if !map.contains_key(name) && map.len() >= CONFIG_ENTRIES_MAX {
            return Err(RuntimeError::InvalidConfig(format!(
                "too many secrets: limit config_entries_max={CONFIG_ENTRIES_MAX}"
            )));
        }
        let mut next = map.clone();
        next.insert(name.to_owned(), value.to_owned());
        self.save(tenant, app, &next)
            .map_err(|e| RuntimeError::Store(e.into()))?;
        *map = next;
        Ok(())
    }

    /// Removes a secret; whether it existed.
    pub fn delete(&self, tenant: &str, app: &str, name: &str) -> Result<bool, RuntimeError> {
        Self::check_app(tenant, app)?;
        if !self.peek(tenant, app).contains_key(name) {
            return Ok(false);
        }
        let secrets = self.of(tenant, app);
        let mut map = secrets.write();
        if !map.contains_key(name) {
            return Ok(false);
        }
        let mut next = map.clone();
        next.remove(name);
        self.save(tenant, app, &next)
            .map_err(|e| RuntimeError::Store(e.into()))?;
        *map = next;
        Ok(true)
    }

    /// The names of an app's secrets, never their values.
    pub fn names(&self, tenant: &str, app: &str) -> Result<Vec<String>, RuntimeError> {
        Self::check_app(tenant, app)?;
        Ok(self.peek(tenant, app).keys().cloned().collect())
    }

    /// An app's secrets as they stand, without keeping a shared entry for
    /// an app that has none (an admin listing must not grow the table).
    fn peek(&self, tenant: &str, app: &str) -> BTreeMap<String, String> {
        if let Some(s) = self.apps.read().get(&(tenant.to_owned(), app.to_owned())) {
            return s.read().clone();
        }
        std::fs::read_to_string(self.file(tenant, app))
            .map(|text| decode(&text))
            .unwrap_or_default()
    }

    /// `text` with the app's secret values replaced (see [`scrub`]).
    pub fn scrub(&self, tenant: &str, app: &str, text: &str) -> String {
        match self.apps.read().get(&(tenant.to_owned(), app.to_owned())) {
            Some(s) => scrub(&s.read(), text.to_owned()),
            None => text.to_owned(),
        }
    }
}

/// `line` with every secret value (of at least [`SCRUB_BYTES_MIN`] bytes)
/// replaced by `[secret]`, longest first, so that a secret that begins
/// another does not leave the longer one's tail.
pub(crate) fn scrub(secrets: &BTreeMap<String, String>, line: String) -> String {
    if secrets.is_empty() {
        return line;
    }
    let mut values: Vec<&String> = secrets
        .values()
        .filter(|v| v.len() >= SCRUB_BYTES_MIN)
        .collect();
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    let mut line = line;
    for v in values {
        if line.contains(v.as_str()) {
            line = line.replace(v.as_str(), "[secret]");
        }
    }
    line
}

/// What an instance's `config.get` reads.
#[derive(Clone, Default)]
pub struct InstanceConfig {
    pub vars: Arc<BTreeMap<String, String>>,
    pub secrets: Secrets,
}

impl InstanceConfig {
    /// `line` with every secret value (of at least [`SCRUB_BYTES_MIN`]
    /// bytes) replaced by `[secret]`.
    pub fn scrub(&self, line: String) -> String {
        scrub(&self.secrets.read(), line)
    }
}

impl config::Host for HostState {
    fn get(&mut self, name: String) -> Option<String> {
        if let Some(v) = self.config.secrets.read().get(&name) {
            return Some(v.clone());
        }
        self.config.vars.get(&name).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_persist_with_owner_only_permissions_and_list_by_name() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let store = SecretStore::open(dir.path());
        store.set("t", "a", "API_KEY", "s3cr3t-value").unwrap();
        let file = dir.path().join("secrets/t/a");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = SecretStore::open(dir.path());
        assert_eq!(again.names("t", "a").unwrap(), vec!["API_KEY".to_string()]);
        assert_eq!(again.of("t", "a").read()["API_KEY"], "s3cr3t-value");
        assert!(again.delete("t", "a", "API_KEY").unwrap());
        assert!(!again.delete("t", "a", "API_KEY").unwrap());
        assert!(
            SecretStore::open(dir.path())
                .names("t", "a")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn bad_names_and_values_are_refused_naming_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let store = SecretStore::open(dir.path());
        for name in ["", "1A", "a-b", &"x".repeat(CONFIG_NAME_BYTES_MAX + 1)] {
            let e = store.set("t", "a", name, "v").unwrap_err();
            assert_eq!(e.code(), "invalid_config", "{name}");
        }
        let e = store
            .set("t", "a", "BIG", &"v".repeat(CONFIG_VALUE_BYTES_MAX + 1))
            .unwrap_err();
        assert!(e.to_string().contains("config_value_bytes_max"), "{e}");
    }

    #[test]
    fn log_lines_lose_the_secret_values_they_hold() {
        let c = InstanceConfig::default();
        c.secrets.write().insert("K".into(), "hunter22".into());
        c.secrets.write().insert("SHORT".into(), "ab".into());
        c.secrets.write().insert("A_PREFIX".into(), "hunter".into());
        assert_eq!(
            c.scrub("token=hunter22 and ab".into()),
            "token=[secret] and ab",
            "the longer secret first, so the shorter one that begins it leaves no tail"
        );
    }
}
