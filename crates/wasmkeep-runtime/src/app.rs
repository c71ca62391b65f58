//! Deployed apps: validation, compilation, the on-disk cache, manifests.
//!
//! ```text
//! <data>/apps/<tenant>/<app>/current          the hash of the deployed component
//! <data>/apps/<tenant>/<app>/<hash>.wasm      the component as deployed
//! <data>/apps/<tenant>/<app>/<hash>.toml      its manifest (may be empty)
//! <data>/apps/<tenant>/<app>/versions.toml    its kept versions (`app_versions`)
//! <compile cache>/<hash>-<engine>.cwasm       compiled code (default <data>/cache)
//! <compile cache>/<hash>-<engine>.cwasm.<key id>.mac   its tag (`compile_cache`)
//! ```
//!
//! A deploy is checked completely (a WebAssembly component, of the
//! `wasmkeep:actor` world, whose imports the node provides, with valid class
//! names, and a manifest within the node's ceilings) before anything is
//! written, so a bad deploy leaves the app that was deployed as it was.
//!
//! Components are hostile input. What bounds them here: their size
//! (`component_bytes_max`), the wall time and memory of their compilation
//! (`component_compile_ms_max`, `component_compile_memory_bytes_max`, in a
//! child process: see `compile_process`), at most `COMPILES_RUNNING_MAX`
//! compilations at once, each on one thread, and what wasmtime checks when
//! it loads compiled code (the pool's limits on core instances, memories
//! and tables per component, a table's elements, the size of an
//! instance's metadata). Compiled code is cached only once its component
//! passed every check.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::config::AppLimits;
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use wasmkeep_store::StoreLimits;
use wasmkeep_store::id::validate_segment;
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store};

use crate::app_versions::{self, AppVersion};
use crate::clock::Clock;
use crate::compile_cache::{ARTIFACT_BYTES_PER_COMPONENT_BYTE_MAX, CacheKey};
use crate::compile_process::{ChildCompile, Compile, EngineSettings};
use crate::config::RuntimeConfig;
use crate::error::RuntimeError;
use crate::host::{ActorPre, HostState};
use crate::log_budget::LogBudget;
use crate::metrics::Metrics;
use crate::outbox::OutboundPolicy;
use crate::warm::ClassStatements;

/// The optional export messages and answers arrive through.
const INBOX_EXPORT: &str = "wasmkeep:actor/inbox@0.2.0";
/// The optional export socket events arrive through.
const SOCKETS_EXPORT: &str = "wasmkeep:actor/socket-handler@0.2.0";
/// The import a component that may wait has (ADR 0056).
const AWAITS_IMPORT: &str = "wasmkeep:actor/awaits@";

/// Compilations that may run at once, abandoned ones (past their deadline,
/// still running) included. Each runs on one thread, so this bounds the
/// cores that hostile components can keep busy compiling.
pub(crate) const COMPILES_RUNNING_MAX: usize = 2;

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
///
/// [vars]                   # read by actors with config.get (ADR 0041)
/// REGION = "eu"
///
/// [[migrations]]           # class migrations (ADR 0060), applied once by tag
/// tag = "v2"
/// renamed_classes = [{ from = "room", to = "chat" }]
///
/// [outbound]               # outbound HTTP calls (ADR 0040); nothing by default
/// hosts = ["api.example.com", "127.0.0.1:9000"]  # a host (any port) or host:port
/// timeout_ms = 10000       # per attempt; at most the node's outbound_timeout_ms_max
/// response_bytes_max = 1048576
/// per_actor_max = 2        # calls one actor has in flight
/// per_app_max = 64         # calls the app has in flight on a node
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
    #[serde(default)]
    pub outbound: AppOutbound,
    /// Variables the app's actors read with `config.get` (ADR 0041);
    /// shown by the admin API like the rest of the manifest (secrets are
    /// set apart, through the admin API).
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
    /// Class migrations (ADR 0060): renames, deletes and transfers of
    /// classes with their actors' data, applied once each by tag.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrations: Vec<crate::class_migrations::ClassMigration>,
    /// Recording of events for replay (ADR 0062): on when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recording: Option<crate::recording::RecordingSettings>,
}

/// What an app's actors may reach over HTTP; unset limits keep the
/// node's, and no host is allowed unless listed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppOutbound {
    /// `host` (any port) or `host:port`; names are compared lower-case.
    #[serde(default)]
    pub hosts: Vec<String>,
    pub timeout_ms: Option<u64>,
    pub response_bytes_max: Option<usize>,
    pub per_actor_max: Option<usize>,
    pub per_app_max: Option<usize>,
}

/// Hosts one app may list.
pub(crate) const OUTBOUND_HOSTS_MAX: usize = 256;

/// Checks one `[outbound] hosts` entry: a name or address, an optional
/// port, nothing else (no scheme, path or wildcard).
fn check_outbound_host(entry: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("outbound.hosts: `{}` {why}", entry.escape_debug()));
    let (host, port) = match entry.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') || h.ends_with(']') => (h, Some(p)),
        _ => (entry, None),
    };
    if let Some(p) = port
        && p.parse::<u16>().map_or(true, |p| p == 0)
    {
        return bad("has a port that is not 1 to 65535");
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.len() > 253 {
        return bad("is not a host name");
    }
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    let ok = host
        .split('.')
        .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    if !ok {
        return bad(
            "is not a host name (write `host` or `host:port`: no scheme, path or wildcard)",
        );
    }
    Ok(())
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

impl AppManifest {
    /// Parses a manifest; an empty text is the default manifest.
    pub fn parse(text: &str) -> Result<AppManifest, RuntimeError> {
        let manifest: AppManifest =
            toml::from_str(text).map_err(|e| RuntimeError::InvalidManifest(e.to_string()))?;
        crate::app_config::check_vars(&manifest.vars).map_err(RuntimeError::InvalidManifest)?;
        if manifest.outbound.hosts.len() > OUTBOUND_HOSTS_MAX {
            return Err(RuntimeError::InvalidManifest(format!(
                "outbound.hosts: {} entries, limit outbound_hosts_max={OUTBOUND_HOSTS_MAX}",
                manifest.outbound.hosts.len()
            )));
        }
        for h in &manifest.outbound.hosts {
            check_outbound_host(h).map_err(RuntimeError::InvalidManifest)?;
        }
        crate::class_migrations::check_manifest(&manifest.migrations)
            .map_err(RuntimeError::InvalidManifest)?;
        if let Some(r) = &manifest.recording {
            r.limits().map_err(RuntimeError::InvalidManifest)?;
        }
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
    /// Where `handler` is in an instance.
    pub indices: crate::host::ActorIndices,
    /// Where `inbox` is, if the component exports it (ADR 0040).
    pub inbox: Option<crate::host::inbox_exports::InboxExportsIndices>,
    /// Where `socket-handler` is, if the component exports it (ADR 0043).
    pub socket_handler: Option<crate::host::socket_exports::SocketExportsIndices>,
    /// What the app's actors may reach over HTTP.
    pub outbound: Arc<OutboundPolicy>,
    /// The manifest's `[vars]`.
    pub vars: Arc<BTreeMap<String, String>>,
    /// The app's version this is (`app_versions`; 0 until installed).
    pub deploy_version: u64,
    /// Whether an actor open on an older version keeps it until it closes
    /// (a deferred deploy, ADR 0059).
    pub deferred: bool,
    /// The component imports `awaits`: its requests and alarms run with
    /// the time and seed a suspended event runs again with (ADR 0056).
    pub waits: bool,
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
    /// The app's version this is (0 before it is installed).
    pub version: u64,
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
            version: self.deploy_version,
        }
    }
}

pub(crate) fn app_dir(data: &Path, tenant: &str, app: &str) -> PathBuf {
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

/// What a deploy does with a manifest limit above the node's ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OverCeiling {
    /// Refuse the deploy (`limit_above_node_ceiling`): a new deploy.
    Refuse,
    /// Use the ceiling instead, with a warning: an app deployed before the
    /// ceiling was lowered, loaded at start-up. Refusing to load it would
    /// take a working app down for a change of the node's settings; the
    /// operator lowered the ceiling to bound every app, and this does.
    Clamp,
}

/// One manifest limit within its node ceiling. `ceiling` unset, or below
/// the node's own setting, is the node's setting.
fn within_ceiling(
    field: &'static str,
    value: Option<u64>,
    node: u64,
    ceiling: Option<u64>,
    over: OverCeiling,
    app: &str,
) -> Result<u64, RuntimeError> {
    let ceiling = ceiling.unwrap_or(node).max(node);
    let Some(value) = value else {
        return Ok(node);
    };
    if value <= ceiling {
        return Ok(value);
    }
    match over {
        OverCeiling::Refuse => Err(RuntimeError::LimitAboveCeiling {
            field,
            value,
            ceiling,
        }),
        OverCeiling::Clamp => {
            tracing::warn!(%app, field, value, ceiling, "the app's manifest sets a limit above this node's ceiling (lowered since the deploy): the app gets the ceiling");
            Ok(ceiling)
        }
    }
}

/// An app's store limits and CPU limit: its manifest's, each within the
/// node's ceiling, or the node's own. Every field of `AppLimits` is
/// checked here; the page size has no ceiling (SQLite's range bounds it,
/// and SQLite's cache is sized in bytes, not pages), nor does
/// `[alarms] retries_max` (it only ever lowers the node's default, which
/// retries for ever).
fn app_limits(
    manifest: &AppManifest,
    config: &RuntimeConfig,
    over: OverCeiling,
    app: &str,
) -> Result<(StoreLimits, u64), RuntimeError> {
    let (m, c, base) = (&manifest.limits, &config.app_limit_ceilings, &config.store);
    let wide = |v: usize| v as u64;
    let narrow = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    let pick = |field, value, node, ceiling| within_ceiling(field, value, node, ceiling, over, app);
    let store = StoreLimits {
        value_bytes_max: narrow(pick(
            "value_bytes_max",
            m.value_bytes_max.map(wide),
            wide(base.value_bytes_max),
            c.value_bytes_max.map(wide),
        )?),
        sql_bytes_max: narrow(pick(
            "sql_bytes_max",
            m.sql_bytes_max.map(wide),
            wide(base.sql_bytes_max),
            c.sql_bytes_max.map(wide),
        )?),
        sql_params_max: narrow(pick(
            "sql_params_max",
            m.sql_params_max.map(wide),
            wide(base.sql_params_max),
            c.sql_params_max.map(wide),
        )?),
        key_bytes_max: narrow(pick(
            "key_bytes_max",
            m.key_bytes_max.map(wide),
            wide(base.key_bytes_max),
            c.key_bytes_max.map(wide),
        )?),
        database_bytes_max: pick(
            "database_bytes_max",
            m.database_bytes_max,
            base.database_bytes_max,
            c.database_bytes_max,
        )?,
        kv_list_entries_max: u32::try_from(pick(
            "kv_list_entries_max",
            m.kv_list_entries_max.map(u64::from),
            u64::from(base.kv_list_entries_max),
            c.kv_list_entries_max.map(u64::from),
        )?)
        .unwrap_or(u32::MAX),
        page_bytes: manifest
            .storage
            .sqlite_page_bytes
            .unwrap_or(base.page_bytes),
        // What no manifest may set stays the node's.
        ..base.clone()
    };
    let event_cpu_ms_max = pick(
        "event_cpu_ms_max",
        m.event_cpu_ms_max,
        config.event_cpu_ms_max,
        c.event_cpu_ms_max,
    )?;
    Ok((store, event_cpu_ms_max))
}

/// An app's outbound HTTP policy: its manifest's `[outbound]`, each limit
/// within the node's ceiling.
fn outbound_policy(
    manifest: &AppManifest,
    config: &RuntimeConfig,
    over: OverCeiling,
    app: &str,
) -> Result<OutboundPolicy, RuntimeError> {
    let (m, c) = (&manifest.outbound, &config.outbound);
    let pick = |field, value: Option<u64>, node: u64| {
        within_ceiling(field, value, node, Some(node), over, app)
    };
    let narrow = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    Ok(OutboundPolicy {
        hosts: m.hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
        timeout_ms: pick("outbound.timeout_ms", m.timeout_ms, c.timeout_ms_max)?,
        response_bytes_max: narrow(pick(
            "outbound.response_bytes_max",
            m.response_bytes_max.map(|v| v as u64),
            c.response_bytes_max as u64,
        )?),
        per_actor_max: narrow(pick(
            "outbound.per_actor_max",
            m.per_actor_max.map(|v| v as u64),
            c.per_actor_max as u64,
        )?),
        per_app_max: narrow(pick(
            "outbound.per_app_max",
            m.per_app_max.map(|v| v as u64),
            c.per_app_max as u64,
        )?),
        private_allowed: c.private_allowed,
    })
}

/// Places for compilations (`COMPILES_RUNNING_MAX`), shared by a node's
/// deploys and start-up.
#[derive(Default)]
pub(crate) struct CompileSlots {
    running: Mutex<usize>,
    freed: Condvar,
}

/// One place, given back when the compilation ends (not when its deploy
/// stops waiting for it).
struct CompileSlot(Arc<CompileSlots>);

impl CompileSlots {
    /// Waits for a place until `deadline`.
    fn acquire(self: &Arc<Self>, deadline: Instant) -> Result<CompileSlot, RuntimeError> {
        let mut running = self.running.lock();
        while *running >= COMPILES_RUNNING_MAX {
            if self.freed.wait_until(&mut running, deadline).timed_out()
                && *running >= COMPILES_RUNNING_MAX
            {
                return Err(RuntimeError::CompileBusy {
                    running: *running,
                    limit: COMPILES_RUNNING_MAX,
                });
            }
        }
        *running += 1;
        Ok(CompileSlot(Arc::clone(self)))
    }
}

impl Drop for CompileSlot {
    fn drop(&mut self) {
        *self.0.running.lock() -= 1;
        self.0.freed.notify_one();
    }
}

/// Compiled code waiting for its component to pass its checks.
struct ToCache {
    path: PathBuf,
    /// The engine settings' hash the name and tag carry.
    engine: u64,
    /// The serialized code, when a child compiled it.
    code: Option<Vec<u8>>,
}

/// Everything needed to compile and check components.
pub(crate) struct Compiler<'a> {
    pub engine: &'a Engine,
    pub linker: &'a Linker<HostState>,
    pub config: &'a RuntimeConfig,
    pub clock: Arc<dyn Clock>,
    pub cache_dir: PathBuf,
    /// `None` when the node has no usable key: nothing is loaded from the
    /// cache or written to it.
    pub cache_key: Option<&'a CacheKey>,
    pub compiles: &'a Arc<CompileSlots>,
    /// What `engine` was built from (a compile worker builds its own).
    pub settings: EngineSettings,
    pub metrics: &'a Metrics,
    /// Unsafe, for its test only: cached code is loaded unchecked.
    pub unsafe_trust_cache: bool,
}

impl Compiler<'_> {
    /// Where a component's compiled code is cached, and the engine
    /// settings' hash that its name and tag carry.
    fn cwasm_path(&self, hash: &str) -> (PathBuf, u64) {
        // The engine's settings are part of the name, so nodes with other
        // settings never load each other's code.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&self.engine.precompile_compatibility_hash(), &mut h);
        let engine = std::hash::Hasher::finish(&h);
        (
            self.cache_dir.join(format!("{hash}-{engine:016x}.cwasm")),
            engine,
        )
    }

    /// Compiles (or loads verified compiled code for) a component; with
    /// what to write to the cache once the component has passed every
    /// check (`None` when it came from the cache), so that a component a
    /// deploy refuses never leaves compiled code behind.
    fn component(
        &self,
        bytes: &[u8],
        hash: &str,
    ) -> Result<(Component, Option<ToCache>), RuntimeError> {
        let (path, engine) = self.cwasm_path(hash);
        if let Some(c) = self.load_cached(&path, hash, engine) {
            return Ok((c, None));
        }
        let (component, code) = self.compile(bytes)?;
        let to_cache = ToCache { path, engine, code };
        Ok((component, Some(to_cache)))
    }

    /// Writes compiled code to the cache, tagged with this node's key.
    fn cache(&self, hash: &str, component: &Component, to_cache: ToCache) {
        let Some(key) = self.cache_key else {
            return;
        };
        let Some(code) = to_cache.code.or_else(|| component.serialize().ok()) else {
            return;
        };
        let written = std::fs::create_dir_all(&self.cache_dir)
            .and_then(|()| key.write(&to_cache.path, hash, to_cache.engine, &code));
        if let Err(e) = written {
            tracing::warn!(path = %to_cache.path.display(), error = %e, "could not cache compiled code");
        }
    }

    /// Compiled code from the cache, if its tag says this node's key wrote
    /// it for this component and engine.
    fn load_cached(&self, path: &Path, hash: &str, engine: u64) -> Option<Component> {
        let key = self.cache_key?;
        let bytes_max = self.code_bytes_max();
        let checked = if self.unsafe_trust_cache {
            // The mutation the cache's test kills: no tag is checked.
            Ok(std::fs::read(path).ok())
        } else {
            key.read_verified(path, hash, engine, bytes_max)
        };
        let code = match checked {
            Ok(Some(code)) => code,
            Ok(None) => return None,
            Err(why) => {
                Metrics::inc(&self.metrics.compile_cache_rejected_total);
                tracing::warn!(path = %path.display(), %why, "compiled code in the cache failed its check: compiling again");
                return None;
            }
        };
        // SAFETY: `deserialize` runs these bytes as machine code, so they
        // must be what `Component::serialize` wrote for this component on
        // an engine with these settings. They are: the tag over exactly
        // this buffer (not the file, which may have changed since) was
        // made with this node's secret key over the component's hash, the
        // engine settings' hash and the bytes, and only `component` makes
        // tags, right after serializing what it compiled. wasmtime checks
        // the engine settings again.
        match unsafe { Component::deserialize(self.engine, &code) } {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "compiled code in the cache does not load: compiling again");
                None
            }
        }
    }

    /// Compiles where `config.compile` says, waiting at most
    /// `component_compile_ms_max` (the wait for a free place included);
    /// the serialized code too when a child compiled it.
    fn compile(&self, bytes: &[u8]) -> Result<(Component, Option<Vec<u8>>), RuntimeError> {
        let limit = self.config.component_compile_ms_max;
        let deadline = crate::clock::instant() + Duration::from_millis(limit);
        let slot = self.compiles.acquire(deadline)?;
        match &self.config.compile {
            Compile::Thread => self.compile_on_thread(bytes, slot, deadline),
            Compile::Process { program, args, env } => {
                let code = ChildCompile {
                    program,
                    args,
                    env,
                    settings: self.settings,
                    memory_bytes_max: self.config.component_compile_memory_bytes_max,
                    code_bytes_max: self.code_bytes_max(),
                    deadline,
                    deadline_ms: limit,
                }
                .run(bytes)?;
                drop(slot);
                // SAFETY: `deserialize` runs these bytes as machine code.
                // They are what `Engine::precompile_component` wrote in a
                // child running this node's own program, given the
                // component on a pipe only this process holds, and read
                // from the child's stdout after it exited with success.
                // wasmtime checks the engine settings and the instance
                // pool's limits when it loads them.
                let component = unsafe { Component::deserialize(self.engine, &code) }
                    .map_err(|e| self.compile_error(format!("{e:#}")))?;
                Ok((component, Some(code)))
            }
        }
    }

    /// Compiles on a thread of its own. wasmtime cannot cancel a
    /// compilation: past the deadline the deploy is answered
    /// (`compile_timeout`) and the node goes on serving, while the
    /// compilation runs to its end on its thread, holding its place, and
    /// its result is dropped. Nothing late is cached, so deploying the same
    /// component again is refused again.
    fn compile_on_thread(
        &self,
        bytes: &[u8],
        slot: CompileSlot,
        deadline: Instant,
    ) -> Result<(Component, Option<Vec<u8>>), RuntimeError> {
        let limit = self.config.component_compile_ms_max;
        let (tx, rx) = mpsc::sync_channel(1);
        let engine = self.engine.clone();
        let bytes = bytes.to_vec();
        std::thread::Builder::new()
            .name("wasmkeep-compile".into())
            .spawn(move || {
                let _slot = slot;
                let compiled = Component::new(&engine, &bytes).map_err(|e| format!("{e:#}"));
                let _ = tx.send(compiled);
                // Compiling took megabytes that this thread's allocator
                // would otherwise keep.
                wasmkeep_store::sqlite_setup::release_free_memory();
            })
            .map_err(|e| RuntimeError::Internal(format!("could not start a compilation: {e}")))?;
        match rx.recv_timeout(deadline.saturating_duration_since(crate::clock::instant())) {
            Ok(Ok(component)) => Ok((component, None)),
            Ok(Err(e)) => Err(self.compile_error(e)),
            Err(RecvTimeoutError::Timeout) => {
                tracing::warn!(
                    limit_ms = limit,
                    "a compilation ran past component_compile_ms_max: deploy refused, the compilation runs on to its end"
                );
                Err(RuntimeError::CompileTimeout { limit })
            }
            Err(RecvTimeoutError::Disconnected) => Err(RuntimeError::InvalidComponent(
                "the compiler failed on it (it panicked; the node's log has the panic)".into(),
            )),
        }
    }

    /// The most bytes compiled code for a component may take.
    fn code_bytes_max(&self) -> u64 {
        (self.config.component_bytes_max as u64)
            .saturating_mul(ARTIFACT_BYTES_PER_COMPONENT_BYTE_MAX)
    }

    /// Names the node's settings when the component needs more than the
    /// instance pool gives one component.
    fn compile_error(&self, e: String) -> RuntimeError {
        let c = self.config;
        if e.contains("pooling allocator") {
            RuntimeError::InvalidComponent(format!(
                "it needs more than this node gives one component (component_core_instances_max={}, component_memories_max={}, component_tables_max={}, one memory and one table per core module): {e}",
                c.component_core_instances_max, c.component_memories_max, c.component_tables_max
            ))
        } else {
            RuntimeError::InvalidComponent(format!("does not compile: {e}"))
        }
    }

    /// Checks and compiles a component for `tenant/app`, without writing
    /// anything but compiled code to the cache. `over` says what a
    /// manifest limit above the node's ceiling does.
    pub(crate) fn build(
        &self,
        tenant: &str,
        app: &str,
        bytes: &[u8],
        manifest_text: &str,
        version: u64,
        over: OverCeiling,
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
        // Before compiling: a refused manifest costs no compilation.
        let (store_limits, event_cpu_ms_max) =
            app_limits(&manifest, self.config, over, &format!("{tenant}/{app}"))?;
        let outbound = outbound_policy(&manifest, self.config, over, &format!("{tenant}/{app}"))?;
        let hash = hex::encode(Sha256::digest(bytes));
        let (component, to_cache) = self.component(bytes, &hash)?;
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            RuntimeError::InvalidComponent(format!(
                "it imports something wasmkeep does not provide (only wasmkeep:actor@0.2.0 and WASI 0.2 are available, the latter with nothing granted): {e:#}"
            ))
        })?;
        let pre = ActorPre::new(pre).map_err(|e| {
            RuntimeError::InvalidComponent(format!(
                "it does not export wasmkeep:actor/handler@0.2.0 (is it built against wit/actor.wit with the wasmkeep SDK?): {e:#}"
            ))
        })?;
        let indices = crate::host::ActorIndices::new(pre.instance_pre())
            .map_err(|e| RuntimeError::InvalidComponent(format!("its handler export: {e:#}")))?;
        let inbox = match crate::host::inbox_exports::InboxExportsIndices::new(pre.instance_pre()) {
            Ok(i) => Some(i),
            Err(e) => {
                if component.get_export_index(None, INBOX_EXPORT).is_some() {
                    return Err(RuntimeError::InvalidComponent(format!(
                        "it exports {INBOX_EXPORT} with other types than wit/actor.wit's: {e:#}"
                    )));
                }
                None
            }
        };
        let socket_handler = match crate::host::socket_exports::SocketExportsIndices::new(
            pre.instance_pre(),
        ) {
            Ok(i) => Some(i),
            Err(e) => {
                if component.get_export_index(None, SOCKETS_EXPORT).is_some() {
                    return Err(RuntimeError::InvalidComponent(format!(
                        "it exports {SOCKETS_EXPORT} with other types than wit/actor.wit's: {e:#}"
                    )));
                }
                None
            }
        };
        let classes = self.ask_classes(&pre, tenant, app)?;
        let waits = component
            .component_type()
            .imports(self.engine)
            .any(|(name, _)| name.starts_with(AWAITS_IMPORT));
        let vars = Arc::new(manifest.vars.clone());
        if let Some(to_cache) = to_cache {
            self.cache(&hash, &component, to_cache);
        }
        Ok(App {
            tenant: tenant.to_owned(),
            name: app.to_owned(),
            hash,
            alarm_statements: ClassStatements::new(&classes),
            classes,
            event_cpu_ms_max,
            manifest,
            pre,
            version,
            deployed_ms: self.clock.now_ms(),
            store_limits,
            component_bytes: bytes.len(),
            indices,
            inbox,
            socket_handler,
            outbound: Arc::new(outbound),
            vars,
            deploy_version: 0,
            deferred: false,
            waits,
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
        let mut state = HostState::new(
            None,
            id,
            Arc::clone(&self.clock),
            self.config.instance_memory_bytes_max,
        );
        state.log_budget = LogBudget::new(
            self.config.event_log_lines_max,
            self.config.event_log_bytes_max,
        );
        let mut store = Store::new(self.engine, state);
        store.limiter(|s| &mut s.memory);
        store.set_epoch_deadline(crate::config::epoch_ticks(self.config.event_cpu_ms_max));
        let bindings = pre.instantiate(&mut store).map_err(|e| {
            RuntimeError::InvalidComponent(format!("it does not instantiate: {e:#}"))
        })?;
        let classes = bindings.wasmkeep_actor_handler().call_classes(&mut store);
        let s = store.data_mut();
        s.log_budget.finish_call(&s.id);
        let classes = classes
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
/// Who made a deploy and why, for its version (`app_versions`).
pub(crate) struct DeployOrigin<'a> {
    pub by: &'a str,
    pub rollback_of: Option<u64>,
    /// The version as the cluster's bucket recorded it (ADR 0058): its
    /// number and time are kept; `None` on a single node.
    pub recorded: Option<&'a AppVersion>,
    /// The share of actors that run it (100: all) and whether open actors
    /// keep their version until they close (ADR 0059).
    pub percent: u8,
    pub deferred: bool,
}

/// Stores a deployed app: its component and manifest by hash, the
/// `current` pointer, then its version (`app_versions::append`, which
/// removes what no kept version names; the pointer is moved first, so a
/// crash never leaves it naming a removed component). `previous` is the
/// app it replaces, listed as version 1 if it was deployed before
/// versions existed.
pub(crate) fn persist(
    data: &Path,
    app: &App,
    bytes: &[u8],
    manifest_text: &str,
    origin: &DeployOrigin<'_>,
    previous: Option<&App>,
    keep: usize,
) -> std::io::Result<AppVersion> {
    let dir = app_dir(data, &app.tenant, &app.name);
    std::fs::create_dir_all(&dir)?;
    write_atomic(&dir.join(format!("{}.wasm", app.hash)), bytes)?;
    write_atomic(
        &dir.join(format!("{}.toml", app.hash)),
        manifest_text.as_bytes(),
    )?;
    // `current` names the whole version; a partial one (a rollout) is
    // found through the versions' list.
    if origin.percent == 100 {
        write_atomic(&dir.join("current"), app.hash.as_bytes())?;
    }
    let legacy = previous.map(|p| {
        app_versions::legacy_version(&p.hash, &p.classes, p.component_bytes, p.deployed_ms)
    });
    let new = app_versions::NewVersion {
        hash: &app.hash,
        deployed_ms: origin.recorded.map_or(app.deployed_ms, |r| r.deployed_ms),
        classes: &app.classes,
        component_bytes: app.component_bytes,
        manifest: manifest_text,
        by: origin.by,
        rollback_of: origin.rollback_of,
        percent: origin.percent,
        deferred: origin.deferred,
        number: origin.recorded.map(|r| r.version),
    };
    let version = app_versions::append(&dir, &new, legacy, keep, write_atomic)?;
    wasmkeep_store::sync::sync_dir(&dir)?;
    Ok(version)
}

/// One deployed app as `persist` stored it.
pub(crate) struct StoredApp {
    pub tenant: String,
    pub app: String,
    /// The version its actors run (`None`: deployed before versions).
    pub stable: StoredVersion,
    /// A partial version being rolled out after it (ADR 0059).
    pub candidate: Option<StoredVersion>,
}

/// One stored version's component and manifest.
pub(crate) struct StoredVersion {
    pub wasm: Vec<u8>,
    pub manifest: String,
    pub version: Option<AppVersion>,
}

/// Reads what `persist` wrote, for every app with a `current` pointer:
/// its newest whole version, and a newer partial one if there is one.
pub(crate) fn load_all(data: &Path) -> std::io::Result<Vec<StoredApp>> {
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
            // An unreadable list loads the `current` component alone: one
            // app's damaged folder does not keep the node from starting.
            let versions = app_versions::read(&dir).unwrap_or_else(|e| {
                tracing::error!(dir = %dir.display(), error = %e, "the app's versions are unreadable; loading its current component");
                Vec::new()
            });
            let stored = |v: &AppVersion| -> std::io::Result<StoredVersion> {
                Ok(StoredVersion {
                    wasm: std::fs::read(dir.join(format!("{}.wasm", v.hash)))?,
                    manifest: std::fs::read_to_string(app_versions::manifest_path(&dir, v.version))
                        .unwrap_or_default(),
                    version: Some(v.clone()),
                })
            };
            let stable = match app_versions::stable(&versions) {
                Some(v) => stored(v)?,
                None => {
                    let hash = hash.trim();
                    StoredVersion {
                        wasm: std::fs::read(dir.join(format!("{hash}.wasm")))?,
                        manifest: std::fs::read_to_string(dir.join(format!("{hash}.toml")))
                            .unwrap_or_default(),
                        version: None,
                    }
                }
            };
            // A rollout whose component is gone is dropped, not fatal.
            let candidate = match versions.last() {
                Some(v) if v.percent < 100 => stored(v)
                    .inspect_err(|e| {
                        tracing::error!(dir = %dir.display(), version = v.version, error = %e, "the version being rolled out does not load; serving the whole one");
                    })
                    .ok(),
                _ => None,
            };
            out.push(StoredApp {
                tenant: t.file_name().to_string_lossy().into_owned(),
                app: a.file_name().to_string_lossy().into_owned(),
                stable,
                candidate,
            });
        }
    }
    Ok(out)
}

pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
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
    fn every_manifest_limit_above_its_node_ceiling_is_refused_by_name() {
        let node = RuntimeConfig::new("/nonexistent");
        let s = &node.store;
        // Exhaustive on purpose: a new field of `AppLimits` does not compile
        // here until it has a ceiling in `app_limits` and a value below.
        let one_above = AppLimits {
            value_bytes_max: Some(s.value_bytes_max + 1),
            sql_bytes_max: Some(s.sql_bytes_max + 1),
            sql_params_max: Some(s.sql_params_max + 1),
            key_bytes_max: Some(s.key_bytes_max + 1),
            database_bytes_max: Some(s.database_bytes_max + 1),
            kv_list_entries_max: Some(s.kv_list_entries_max + 1),
            event_cpu_ms_max: Some(node.event_cpu_ms_max + 1),
        };
        let text = toml::to_string(&one_above).unwrap();
        assert_eq!(text.lines().count(), 7, "{text}");
        for line in text.lines() {
            let field = line.split(" = ").next().unwrap();
            let manifest = AppManifest::parse(&format!("[limits]\n{line}\n")).unwrap();
            match app_limits(&manifest, &node, OverCeiling::Refuse, "t/a") {
                Err(e @ RuntimeError::LimitAboveCeiling { .. }) => {
                    assert_eq!(e.code(), "limit_above_node_ceiling");
                    let says = e.to_string();
                    assert!(says.contains(&format!("field=limits.{field} ")), "{says}");
                    assert!(
                        says.contains(&format!("app_limit_ceilings.{field}")),
                        "{says}"
                    );
                }
                other => panic!("{line}: {other:?}"),
            }
            // An app deployed before the ceiling came down gets the ceiling.
            let clamped = app_limits(&manifest, &node, OverCeiling::Clamp, "t/a").unwrap();
            assert_eq!(clamped, (s.clone(), node.event_cpu_ms_max), "{line}");
        }
    }

    #[test]
    fn manifests_may_lower_limits_and_raise_them_up_to_a_ceiling() {
        let mut node = RuntimeConfig::new("/nonexistent");
        let m = AppManifest::parse("[limits]\nevent_cpu_ms_max = 60000\nvalue_bytes_max = 1024\n")
            .unwrap();
        let e = app_limits(&m, &node, OverCeiling::Refuse, "t/a").unwrap_err();
        assert!(
            e.to_string()
                .ends_with("field=limits.event_cpu_ms_max value=60000 ceiling=30000"),
            "{e}"
        );
        node.app_limit_ceilings.event_cpu_ms_max = Some(120_000);
        let (store, cpu) = app_limits(&m, &node, OverCeiling::Refuse, "t/a").unwrap();
        assert_eq!((store.value_bytes_max, cpu), (1024, 60_000));
        // A ceiling below the node's own setting counts as the setting.
        node.app_limit_ceilings.event_cpu_ms_max = Some(10);
        let m = AppManifest::parse("[limits]\nevent_cpu_ms_max = 30000\n").unwrap();
        assert!(app_limits(&m, &node, OverCeiling::Refuse, "t/a").is_ok());
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
