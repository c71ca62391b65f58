//! Deployed apps: validation, compilation, the on-disk cache, manifests.
//!
//! ```text
//! <data>/apps/<tenant>/<app>/current          the hash of the deployed component
//! <data>/apps/<tenant>/<app>/<hash>.wasm      the component as deployed
//! <data>/apps/<tenant>/<app>/<hash>.toml      its manifest (may be empty)
//! <compile cache>/<hash>-<engine>.cwasm       compiled code (default <data>/cache)
//! ```
//!
//! A deploy is checked completely (a WebAssembly component, of the
//! `wasmkeep:actor` world, whose imports the node provides, with valid class
//! names) before anything is written, so a bad deploy leaves the app that
//! was deployed as it was.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use wasmkeep_store::StoreLimits;
use wasmkeep_store::id::validate_segment;
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store};

use crate::clock::Clock;
use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::host::{ActorPre, HostState};
use crate::warm::ClassStatements;

/// An app's settings, from the optional TOML manifest given at deploy.
///
/// ```toml
/// [alarms]
/// retries_max = 6          # give up after this many failed attempts (default: never)
///
/// [limits]                 # override the node's limits for this app
/// value_bytes_max = 1048576
/// event_cpu_ms_max = 5000
///
/// [storage]
/// sqlite_page_bytes = 1024 # page size of actor databases created from now on
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppManifest {
    #[serde(default)]
    pub alarms: AlarmPolicy,
    #[serde(default)]
    pub limits: AppLimits,
    #[serde(default)]
    pub storage: AppStorage,
}

/// How an app's actor databases are laid out; unset fields keep the
/// node's settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppStorage {
    /// SQLite page size of the app's actor databases created from now on
    /// (existing ones keep theirs). See ADR 0027.
    pub sqlite_page_bytes: Option<u32>,
}

/// How an app's failing alarms are retried.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlarmPolicy {
    /// Retries after a first failed attempt: the alarm is dropped when
    /// attempt `retries_max + 1` fails. `None` (the default) retries for
    /// ever, backing off up to `alarm_retry_max_ms`. Durable Objects gives
    /// up after 6 retries.
    pub retries_max: Option<u32>,
}

/// Per-app overrides of the node's limits; unset fields keep the node's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppLimits {
    pub value_bytes_max: Option<usize>,
    pub sql_bytes_max: Option<usize>,
    pub sql_params_max: Option<usize>,
    pub key_bytes_max: Option<usize>,
    pub database_bytes_max: Option<u64>,
    pub kv_list_entries_max: Option<u32>,
    pub event_cpu_ms_max: Option<u64>,
}

impl AppManifest {
    /// Parses a manifest; an empty text is the default manifest.
    pub fn parse(text: &str) -> Result<AppManifest, RuntimeError> {
        let manifest: AppManifest =
            toml::from_str(text).map_err(|e| RuntimeError::InvalidManifest(e.to_string()))?;
        if let Some(n) = manifest.storage.sqlite_page_bytes {
            wasmkeep_store::limits::check_page_bytes("storage.sqlite_page_bytes", n)
                .map_err(RuntimeError::InvalidManifest)?;
        }
        Ok(manifest)
    }
}

/// A deployed, compiled app.
pub struct App {
    pub tenant: String,
    pub name: String,
    /// SHA-256 of the component, hex.
    pub hash: String,
    pub classes: Vec<String>,
    pub manifest: AppManifest,
    pub pre: ActorPre<HostState>,
    /// Increases with every deploy on this node; instances of an older
    /// version are replaced before their next event.
    pub version: u64,
    pub deployed_ms: u64,
    pub store_limits: StoreLimits,
    pub event_cpu_ms_max: u64,
    pub component_bytes: usize,
    /// What each class's alarm handler ran, prepared ahead of alarms.
    pub alarm_statements: ClassStatements,
}

/// What the admin API shows about an app.
#[derive(Debug, Clone, Serialize)]
pub struct AppInfo {
    pub tenant: String,
    pub app: String,
    pub hash: String,
    pub classes: Vec<String>,
    pub deployed_ms: u64,
    pub component_bytes: usize,
    pub manifest: AppManifest,
}

impl App {
    pub fn info(&self) -> AppInfo {
        AppInfo {
            tenant: self.tenant.clone(),
            app: self.name.clone(),
            hash: self.hash.clone(),
            classes: self.classes.clone(),
            deployed_ms: self.deployed_ms,
            component_bytes: self.component_bytes,
            manifest: self.manifest.clone(),
        }
    }
}

pub fn app_dir(data: &Path, tenant: &str, app: &str) -> PathBuf {
    data.join("apps").join(tenant).join(app)
}

fn check_binary(bytes: &[u8]) -> Result<(), RuntimeError> {
    if bytes.len() < 8 || &bytes[0..4] != b"\0asm" {
        return Err(RuntimeError::InvalidComponent(
            "not a WebAssembly binary (no \\0asm header)".into(),
        ));
    }
    // Bytes 6..8 are the layer: 0 for a core module, 1 for a component.
    if bytes[6] == 0 && bytes[7] == 0 {
        return Err(RuntimeError::InvalidComponent(
            "a core WebAssembly module, not a component: build the app for wasm32-wasip2".into(),
        ));
    }
    Ok(())
}

/// Everything needed to compile and check components.
pub struct Compiler<'a> {
    pub engine: &'a Engine,
    pub linker: &'a Linker<HostState>,
    pub config: &'a RuntimeConfig,
    pub clock: Arc<dyn Clock>,
    pub cache_dir: PathBuf,
}

impl Compiler<'_> {
    fn cwasm_path(&self, hash: &str) -> PathBuf {
        // The engine's settings are part of the name, so nodes with other
        // settings never load each other's code.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&self.engine.precompile_compatibility_hash(), &mut h);
        let engine = std::hash::Hasher::finish(&h);
        self.cache_dir.join(format!("{hash}-{engine:016x}.cwasm"))
    }

    /// Compiles (or loads compiled code for) a component.
    fn component(&self, bytes: &[u8], hash: &str) -> Result<Component, RuntimeError> {
        let cached = self.cwasm_path(hash);
        if cached.exists() {
            // SAFETY: the file was written by `Component::serialize` of an
            // engine with the same settings, into a folder only this node
            // writes; wasmtime checks the settings again on load.
            match unsafe { Component::deserialize_file(self.engine, &cached) } {
                Ok(c) => return Ok(c),
                Err(e) => tracing::warn!(path = %cached.display(), error = %e, "recompiling"),
            }
        }
        let component = Component::new(self.engine, bytes)
            .map_err(|e| RuntimeError::InvalidComponent(format!("does not compile: {e:#}")))?;
        if let Ok(code) = component.serialize() {
            let _ = std::fs::create_dir_all(&self.cache_dir);
            let tmp = cached.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, code).is_ok() {
                let _ = std::fs::rename(&tmp, &cached);
            }
        }
        // Compiling took megabytes that neither this thread nor the ones
        // wasmtime compiled functions on in parallel (rayon's) need any
        // more; each thread's allocator keeps what that thread freed.
        wasmkeep_store::sqlite_setup::release_free_memory();
        rayon::broadcast(|_| wasmkeep_store::sqlite_setup::release_free_memory());
        Ok(component)
    }

    /// Checks and compiles a component for `tenant/app`, without writing
    /// anything but compiled code to the cache.
    pub fn build(
        &self,
        tenant: &str,
        app: &str,
        bytes: &[u8],
        manifest_text: &str,
        version: u64,
    ) -> Result<App, RuntimeError> {
        validate_segment("tenant", tenant)?;
        validate_segment("app", app)?;
        if bytes.len() > self.config.component_bytes_max {
            return Err(RuntimeError::ComponentTooLarge {
                size: bytes.len(),
                limit: self.config.component_bytes_max,
            });
        }
        check_binary(bytes)?;
        let manifest = AppManifest::parse(manifest_text)?;
        let hash = hex::encode(Sha256::digest(bytes));
        let component = self.component(bytes, &hash)?;
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            RuntimeError::InvalidComponent(format!(
                "it imports something wasmkeep does not provide (only wasmkeep:actor@0.1.0 and WASI 0.2 are available, the latter with nothing granted): {e:#}"
            ))
        })?;
        let pre = ActorPre::new(pre).map_err(|e| {
            RuntimeError::InvalidComponent(format!(
                "it does not export wasmkeep:actor/handler@0.1.0 (is it built against wit/actor.wit with the wasmkeep SDK?): {e:#}"
            ))
        })?;
        let classes = self.ask_classes(&pre, tenant, app)?;
        let limits = &manifest.limits;
        let base = &self.config.store;
        let store_limits = StoreLimits {
            value_bytes_max: limits.value_bytes_max.unwrap_or(base.value_bytes_max),
            sql_bytes_max: limits.sql_bytes_max.unwrap_or(base.sql_bytes_max),
            sql_params_max: limits.sql_params_max.unwrap_or(base.sql_params_max),
            key_bytes_max: limits.key_bytes_max.unwrap_or(base.key_bytes_max),
            database_bytes_max: limits.database_bytes_max.unwrap_or(base.database_bytes_max),
            kv_list_entries_max: limits
                .kv_list_entries_max
                .unwrap_or(base.kv_list_entries_max),
            query_result_bytes_max: base.query_result_bytes_max,
            page_bytes: manifest
                .storage
                .sqlite_page_bytes
                .unwrap_or(base.page_bytes),
        };
        Ok(App {
            tenant: tenant.to_owned(),
            name: app.to_owned(),
            hash,
            alarm_statements: ClassStatements::new(&classes),
            classes,
            event_cpu_ms_max: limits
                .event_cpu_ms_max
                .unwrap_or(self.config.event_cpu_ms_max),
            manifest,
            pre,
            version,
            deployed_ms: self.clock.now_ms(),
            store_limits,
            component_bytes: bytes.len(),
        })
    }

    fn ask_classes(
        &self,
        pre: &ActorPre<HostState>,
        tenant: &str,
        app: &str,
    ) -> Result<Vec<String>, RuntimeError> {
        let id = wasmkeep_store::ActorId {
            tenant: tenant.into(),
            app: app.into(),
            class: "-".into(),
            name: "-".into(),
        };
        let state = HostState::new(
            None,
            id,
            Arc::clone(&self.clock),
            self.config.instance_memory_bytes_max,
        );
        let mut store = Store::new(self.engine, state);
        store.limiter(|s| &mut s.memory);
        store.set_epoch_deadline(crate::runtime::epoch_ticks(self.config.event_cpu_ms_max));
        let bindings = pre.instantiate(&mut store).map_err(|e| {
            RuntimeError::InvalidComponent(format!("it does not instantiate: {e:#}"))
        })?;
        let classes = bindings
            .wasmkeep_actor_handler()
            .call_classes(&mut store)
            .map_err(|e| RuntimeError::InvalidComponent(format!("classes() failed: {e:#}")))?;
        if classes.is_empty() {
            return Err(RuntimeError::InvalidComponent(
                "classes() returned no class".into(),
            ));
        }
        let mut seen = BTreeMap::new();
        for c in &classes {
            validate_segment("class", c)
                .map_err(|e| RuntimeError::InvalidComponent(format!("classes(): {e}")))?;
            if seen.insert(c.clone(), ()).is_some() {
                return Err(RuntimeError::InvalidComponent(format!(
                    "classes() names `{c}` twice"
                )));
            }
        }
        Ok(classes)
    }
}

/// Writes a deployed app's files, the `current` pointer last, so that a
/// crash mid-way leaves the previous deploy in force.
pub fn persist(data: &Path, app: &App, bytes: &[u8], manifest_text: &str) -> std::io::Result<()> {
    let dir = app_dir(data, &app.tenant, &app.name);
    std::fs::create_dir_all(&dir)?;
    write_atomic(&dir.join(format!("{}.wasm", app.hash)), bytes)?;
    write_atomic(
        &dir.join(format!("{}.toml", app.hash)),
        manifest_text.as_bytes(),
    )?;
    write_atomic(&dir.join("current"), app.hash.as_bytes())?;
    wasmkeep_store::sync::sync_dir(&dir)
}

/// One deployed app as `persist` stored it.
pub struct StoredApp {
    pub tenant: String,
    pub app: String,
    pub wasm: Vec<u8>,
    pub manifest: String,
}

/// Reads what `persist` wrote, for every app with a `current` pointer.
pub fn load_all(data: &Path) -> std::io::Result<Vec<StoredApp>> {
    let mut out = Vec::new();
    let root = data.join("apps");
    let Ok(tenants) = std::fs::read_dir(&root) else {
        return Ok(out);
    };
    for t in tenants.flatten() {
        let Ok(apps) = std::fs::read_dir(t.path()) else {
            continue;
        };
        for a in apps.flatten() {
            let dir = a.path();
            let Ok(hash) = std::fs::read_to_string(dir.join("current")) else {
                continue;
            };
            let hash = hash.trim();
            let wasm = std::fs::read(dir.join(format!("{hash}.wasm")))?;
            let manifest =
                std::fs::read_to_string(dir.join(format!("{hash}.toml"))).unwrap_or_default();
            out.push(StoredApp {
                tenant: t.file_name().to_string_lossy().into_owned(),
                app: a.file_name().to_string_lossy().into_owned(),
                wasm,
                manifest,
            });
        }
    }
    Ok(out)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binaries_that_are_not_components_are_named() {
        let e = check_binary(b"hello world").unwrap_err();
        assert!(e.to_string().contains("not a WebAssembly binary"));
        let core = b"\0asm\x01\0\0\0";
        let e = check_binary(core).unwrap_err();
        assert!(e.to_string().contains("core WebAssembly module"), "{e}");
        assert!(check_binary(b"\0asm\x0d\0\x01\0").is_ok());
    }

    #[test]
    fn manifests_parse_and_refuse_unknown_fields() {
        let m = AppManifest::parse("[alarms]\nretries_max = 6\n").unwrap();
        assert_eq!(m.alarms.retries_max, Some(6));
        assert_eq!(AppManifest::parse("").unwrap(), AppManifest::default());
        let e = AppManifest::parse("[alarms]\nretries = 6\n").unwrap_err();
        assert_eq!(e.code(), "invalid_manifest");
    }
}

#[cfg(test)]
mod fuzz {
    //! Manifests are outside input: anything parses or is refused cleanly.
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn any_manifest_text_parses_or_is_refused(
            text in "(\\[(alarms|limits|x)\\]\n)?([a-z_]{1,20} = ([0-9]{1,25}|\"[a-z]*\"|true)\n){0,4}",
            raw in any::<String>(),
        ) {
            for t in [text, raw] {
                match AppManifest::parse(&t) {
                    Ok(_) => {}
                    Err(e) => prop_assert_eq!(e.code(), "invalid_manifest"),
                }
            }
        }

        #[test]
        fn any_bytes_deployed_are_refused_before_compiling_unless_wasm(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            // The header check runs before anything is compiled.
            let r = check_binary(&bytes);
            if bytes.len() < 8 || &bytes[0..4] != b"\0asm" {
                prop_assert!(r.is_err());
            }
        }
    }
}
