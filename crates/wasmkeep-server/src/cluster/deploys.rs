//! One deploy for the whole cluster (issue 38, ADR 0058): an app's
//! versions live in the bucket, and every node serves the newest one.
//!
//! ```text
//! versions/<tenant>/<app>/<N, 20 digits>                  version N: JSON, its manifest inside
//! components/<tenant>/<app>/<N, 20 digits>-<sha256>.wasm  the component version N runs
//! ```
//!
//! A deploy through any node compiles the component there first (nothing
//! is recorded that the node cannot run), uploads it under the number it
//! claims, then creates that number's record, create-only: of two deploys
//! racing for one number one wins, the other reads again and claims the
//! next (at most [`DEPLOY_ATTEMPTS_MAX`] times). The same component with
//! the same manifest as the newest version is that version again. Only then
//! does the node install it; the others find it at their next sync, every
//! `cluster_deploy_sync_ms` (2 s): one LIST of `versions/` per node and
//! pass (a page per thousand kept versions in the cluster), plus, for an
//! app whose newest number moved, one GET of its record and one of its
//! component (unless the node stored that component already). A node
//! starting syncs before it serves, so a node that was down during a
//! deploy serves the new version from its first request.
//!
//! A request for an app or class this node does not have reads the bucket
//! for that app before it is refused (a name found in vain is not looked
//! up again within the sync period, and a node makes at most
//! [`REFRESHES_PER_S_MAX`] such lookups a second): a node never takes an
//! actor it cannot run, and a mistyped name costs at most one LIST,
//! never a write.
//!
//! Each deploy keeps the newest `app_versions_max` versions: the one that
//! created a version deletes the records and components numbered below
//! them. A component's key carries its version's number, so no two
//! versions share an object and deleting an old one can never take a
//! component a deploy in flight elsewhere is about to name.
//!
//! An app a node had before its cluster kept versions (deployed on that
//! node alone, or the bundled examples of `--examples`) is recorded as
//! the app's version 1 if the bucket has no version of it yet, and
//! otherwise replaced by the bucket's: the bucket decides.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use wasmkeep_replica::Bucket;
use wasmkeep_replica::bucket::Created;
use wasmkeep_runtime::class_migrations::Plan;
use wasmkeep_runtime::{AppInfo, AppVersion, Runtime, RuntimeError};

use super::now_ms;

/// Where the versions' records are.
pub const VERSIONS_PREFIX: &str = "versions/";
/// Where the components are.
pub const COMPONENTS_PREFIX: &str = "components/";
/// How often a deploy reads the newest number again after another node
/// claimed the one it tried.
pub const DEPLOY_ATTEMPTS_MAX: usize = 8;
/// Most keys one sync's listing of `versions/` holds (kept versions of
/// every app of the cluster, and the few not yet pruned).
pub const VERSIONS_LISTED_MAX: u64 = 200_000;
/// Largest version record read back (its manifest is most of it).
pub const RECORD_BYTES_MAX: u64 = 1024 * 1024;
/// Most app names a node remembers having looked up in vain for a request
/// ([`Deploys::refresh`]); past it, unknown names are refused unread.
pub const REFRESH_NAMES_MAX: usize = 4096;
/// Most lookups of the bucket for requests naming an app or class a node
/// lacks, per second and node: what made-up names can cost.
pub const REFRESHES_PER_S_MAX: u32 = 10;
/// How long a version that failed to install on a node (a compile
/// refused by this node's ceilings, a component it could not read) waits
/// before the node tries it again.
pub const INSTALL_RETRY_MS: u64 = 60_000;
/// Default of `cluster_deploy_sync_ms`.
pub const DEPLOY_SYNC_MS: u64 = 2_000;

/// A version as the bucket keeps it: the listing's fields and the
/// manifest it was deployed with.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    #[serde(flatten)]
    version: AppVersion,
    manifest: String,
}

/// One deploy to the cluster: what, and who asked.
pub struct NewDeploy {
    pub tenant: String,
    pub app: String,
    pub wasm: Vec<u8>,
    pub manifest: String,
    /// Who the client says it is (`wasmkeep-deployed-by`).
    pub by: String,
    /// For a rollback: the version deployed again.
    pub rollback_of: Option<u64>,
    /// The share of actors that run it (1 to 100) and whether open actors
    /// keep their version until they close (ADR 0059).
    pub percent: u8,
    pub deferred: bool,
}

/// Why a cluster deploy, rollback or listing failed.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("the bucket could not be read or written: {0}")]
    Bucket(String),
    #[error(
        "other deploys of `{app}` claimed {DEPLOY_ATTEMPTS_MAX} version numbers in a row; try again"
    )]
    Contended { app: String },
}

impl DeployError {
    /// The error's stable code.
    pub fn code(&self) -> String {
        match self {
            DeployError::Runtime(e) => e.code(),
            DeployError::Bucket(_) => "bucket_unavailable".into(),
            DeployError::Contended { .. } => "deploy_contended".into(),
        }
    }
}

/// The cluster's deploys as this node sees them.
pub struct Deploys {
    pub(crate) bucket: Bucket,
    timeout: Duration,
    sync_ms: u64,
    /// One deploy, rollback or sync of this node at a time.
    writing: tokio::sync::Mutex<()>,
    /// Per app: the newest number this node installed or found it had.
    installed: parking_lot::Mutex<HashMap<(String, String), u64>>,
    /// Per app name a request looked up and did not find: when (ms).
    refreshed: parking_lot::Mutex<HashMap<(String, String), u64>>,
    /// Lookups for requests in the current second: `(second, count)`.
    refresh_budget: parking_lot::Mutex<(u64, u32)>,
    /// Per app: a version that failed to install here, and until when it
    /// is not tried again.
    failed: parking_lot::Mutex<HashMap<(String, String), (u64, u64)>>,
    /// Versions this node installed from the bucket (other nodes' deploys).
    pub synced_total: prometheus_client::metrics::counter::Counter,
    /// The node whose deploys these are, for class migrations (ADR 0071),
    /// which take holds and read leases.
    cluster: std::sync::OnceLock<std::sync::Weak<super::ClusterState>>,
    /// Closing records a task of this node is running the migration of.
    running: Arc<parking_lot::Mutex<std::collections::HashSet<String>>>,
    /// When this node first saw each closing record listed.
    seen: parking_lot::Mutex<HashMap<String, std::time::Instant>>,
}

/// Marks a closing record's migration as running on this node until
/// dropped.
pub(crate) struct Running {
    key: String,
    set: Arc<parking_lot::Mutex<std::collections::HashSet<String>>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.set.lock().remove(&self.key);
    }
}

impl std::fmt::Debug for Deploys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deploys")
            .field("sync_ms", &self.sync_ms)
            .finish_non_exhaustive()
    }
}

fn versions_dir(tenant: &str, app: &str) -> String {
    format!("{VERSIONS_PREFIX}{tenant}/{app}/")
}

pub(crate) fn record_key(tenant: &str, app: &str, n: u64) -> String {
    format!("{}{n:020}", versions_dir(tenant, app))
}

fn component_key(tenant: &str, app: &str, n: u64, hash: &str) -> String {
    format!("{COMPONENTS_PREFIX}{tenant}/{app}/{n:020}-{hash}.wasm")
}

/// The numbers of an app's versions among `keys`, ascending.
fn numbers_in(keys: &[String], tenant: &str, app: &str) -> Vec<u64> {
    let mut ns: Vec<u64> = keys
        .iter()
        .filter_map(|k| parse_record_key(k))
        .filter(|(t, a, _)| t == tenant && a == app)
        .map(|(_, _, n)| n)
        .collect();
    ns.sort_unstable();
    ns
}

/// The closing records among `keys` (ADR 0071).
fn closings_in(keys: &[String]) -> Vec<String> {
    keys.iter()
        .filter(|k| super::migrations::parse_closing_key(k).is_some())
        .cloned()
        .collect()
}

/// `(tenant, app, N)` of a record's key; `None` for anything else.
pub(crate) fn parse_record_key(key: &str) -> Option<(String, String, u64)> {
    let rest = key.strip_prefix(VERSIONS_PREFIX)?;
    let mut parts = rest.split('/');
    let (t, a, n) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || n.len() != 20 || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((t.to_owned(), a.to_owned(), n.parse().ok()?))
}

impl Deploys {
    pub fn new(bucket: Bucket, timeout_ms: u64, sync_ms: u64) -> Deploys {
        Deploys {
            bucket,
            timeout: Duration::from_millis(timeout_ms.max(1)),
            sync_ms,
            writing: tokio::sync::Mutex::new(()),
            installed: parking_lot::Mutex::new(HashMap::new()),
            refreshed: parking_lot::Mutex::new(HashMap::new()),
            refresh_budget: parking_lot::Mutex::new((0, 0)),
            failed: parking_lot::Mutex::new(HashMap::new()),
            synced_total: Default::default(),
            cluster: std::sync::OnceLock::new(),
            running: Default::default(),
            seen: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// Ties the deploys to their node (once).
    pub(crate) fn attach(&self, state: std::sync::Weak<super::ClusterState>) {
        let _ = self.cluster.set(state);
    }

    fn cluster(&self) -> Option<Arc<super::ClusterState>> {
        self.cluster.get().and_then(std::sync::Weak::upgrade)
    }

    /// Marks the migration of `key` as running here; `None` if a task of
    /// this node runs it already.
    pub(crate) fn try_run_here(&self, key: &str) -> Option<Running> {
        self.running.lock().insert(key.to_owned()).then(|| Running {
            key: key.to_owned(),
            set: Arc::clone(&self.running),
        })
    }

    /// Whether this node installed version `n` of the app, or a later one.
    pub(crate) fn installed_at_least(&self, tenant: &str, app: &str, n: u64) -> bool {
        self.installed
            .lock()
            .get(&(tenant.to_owned(), app.to_owned()))
            .is_some_and(|m| *m >= n)
    }

    /// How often the sync task reads the bucket.
    pub fn sync_ms(&self) -> u64 {
        self.sync_ms
    }

    pub(crate) async fn bounded<T>(
        &self,
        what: &str,
        f: impl Future<Output = Result<T, wasmkeep_replica::ReplicaError>>,
    ) -> Result<T, DeployError> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(DeployError::Bucket(format!("{what}: {e}"))),
            Err(_) => Err(DeployError::Bucket(format!(
                "{what}: no answer within cluster_bucket_timeout_ms"
            ))),
        }
    }

    /// The keys under an app's folder of `versions/`: its records, and
    /// the closing records of its migrations in flight (ADR 0071).
    async fn app_keys(&self, tenant: &str, app: &str) -> Result<Vec<String>, DeployError> {
        self.bounded(
            "list the app's versions",
            self.bucket
                .list(&versions_dir(tenant, app), None, VERSIONS_LISTED_MAX),
        )
        .await
    }

    /// The numbers of an app's versions in the bucket, ascending.
    async fn numbers(&self, tenant: &str, app: &str) -> Result<Vec<u64>, DeployError> {
        Ok(numbers_in(&self.app_keys(tenant, app).await?, tenant, app))
    }

    async fn record(&self, tenant: &str, app: &str, n: u64) -> Result<Record, DeployError> {
        let key = record_key(tenant, app, n);
        let bytes = self
            .bounded(
                "read a version",
                self.bucket
                    .get_bounded(&key, "RECORD_BYTES_MAX", RECORD_BYTES_MAX),
            )
            .await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| DeployError::Bucket(format!("version record `{key}` unreadable: {e}")))
    }

    /// The component of a recorded version: this node's copy if it has
    /// one, else the bucket's.
    async fn component(
        &self,
        rt: &Runtime,
        tenant: &str,
        app: &str,
        v: &AppVersion,
    ) -> Result<Vec<u8>, DeployError> {
        if let Some(stored) = rt.stored_component(tenant, app, &v.hash) {
            return Ok(stored);
        }
        let limit = rt.config().component_bytes_max as u64;
        let bytes = self
            .bounded(
                "read a component",
                self.bucket.get_bounded(
                    &component_key(tenant, app, v.version, &v.hash),
                    "component_bytes_max",
                    limit,
                ),
            )
            .await?;
        Ok(bytes.to_vec())
    }

    /// Deploys an app to the cluster: compiled here, recorded in the
    /// bucket as its next version (or found to be its newest already),
    /// then served here; the other nodes follow at their next sync.
    pub async fn deploy(
        &self,
        rt: &Runtime,
        d: NewDeploy,
    ) -> Result<(AppInfo, AppVersion), DeployError> {
        let _one = self.writing.lock().await;
        self.deploy_locked(rt, d, false).await?.ok_or_else(|| {
            DeployError::Runtime(RuntimeError::Internal("deploy not recorded".into()))
        })
    }

    /// The deploy itself, under `writing`. `only_first`: record it only as
    /// the app's version 1 (adopting an app the bucket lacks), `None` when
    /// the bucket has a version of it already.
    async fn deploy_locked(
        &self,
        rt: &Runtime,
        d: NewDeploy,
        only_first: bool,
    ) -> Result<Option<(AppInfo, AppVersion)>, DeployError> {
        let NewDeploy {
            tenant,
            app,
            wasm,
            manifest,
            by,
            rollback_of,
            percent,
            deferred,
        } = d;
        let (tenant, app) = (tenant.as_str(), app.as_str());
        let prepared = {
            let (rt, t, a) = (rt.clone(), tenant.to_owned(), app.to_owned());
            let m = manifest.clone();
            tokio::task::spawn_blocking(move || rt.prepare(&t, &a, &wasm, &m))
                .await
                .map_err(|e| RuntimeError::Internal(format!("compile task: {e}")))??
        };
        let info = prepared.info();
        // Class migrations the app has not applied (ADR 0071), planned
        // against the component and the bucket.
        let (prepared, migration) = self.plan_of(rt, prepared, percent).await?;
        for _ in 0..DEPLOY_ATTEMPTS_MAX {
            // No version of an app is recorded while a migration of it is
            // in flight (ADR 0071): its number and its prune are the
            // migration's.
            let keys = self.app_keys(tenant, app).await?;
            if !only_first && let Some(other) = closings_in(&keys).first() {
                return Err(RuntimeError::ClassMigration {
                    code: "migration_busy",
                    message: format!(
                        "a migration of {tenant}/{app} is in flight (closing record `{other}`); deploy again once it is done"
                    ),
                }
                .into());
            }
            let newest = numbers_in(&keys, tenant, app).last().copied();
            if only_first && newest.is_some() {
                return Ok(None);
            }
            // Serve the bucket's newest (and the whole version under a
            // rollout) before adding to it: a partial version rolls out
            // from the cluster's whole version, not from a stale one here.
            if let Some(n) = newest
                && let Err(e) = self.sync_app(rt, tenant, app, n).await
            {
                tracing::warn!(%tenant, %app, version = n, error = %e, "deploying over a version this node could not install");
            }
            if let Some(n) = newest
                && rollback_of.is_none()
            {
                let last = self.record(tenant, app, n).await?;
                let v = &last.version;
                if v.hash == info.hash
                    && last.manifest == manifest
                    && v.percent == percent
                    && v.deferred == deferred
                {
                    return self.install(rt, prepared, &last.version).await.map(Some);
                }
            }
            if percent < 100 && newest.is_none() {
                return Err(RuntimeError::rollout_without_whole(tenant, app, percent).into());
            }
            let n = newest.map_or(1, |n| n + 1);
            let version = AppVersion {
                version: n,
                hash: info.hash.clone(),
                deployed_ms: now_ms(),
                classes: info.classes.clone(),
                component_bytes: info.component_bytes,
                by: by.clone(),
                rollback_of,
                percent,
                deferred,
            };
            if let Some(plan) = migration {
                if only_first {
                    return Ok(None);
                }
                return self
                    .deploy_migrating(rt, prepared, plan, version, manifest)
                    .await
                    .map(Some);
            }
            if !self.record_version(&prepared, &version, &manifest).await? {
                // Another node's deploy took this number (its component,
                // if it differs, has its own key; ours is pruned later).
                continue;
            }
            tracing::info!(%tenant, %app, version = n, hash = %info.hash, "recorded a version in the bucket");
            let installed = self.install(rt, prepared, &version).await?;
            self.prune(rt, tenant, app, n).await;
            return Ok(Some(installed));
        }
        Err(DeployError::Contended {
            app: format!("{tenant}/{app}"),
        })
    }

    /// The class migrations a deploy of `prepared` applies, if any; a
    /// node without its cluster attached refuses them.
    async fn plan_of(
        &self,
        rt: &Runtime,
        prepared: wasmkeep_runtime::PreparedApp,
        percent: u8,
    ) -> Result<(wasmkeep_runtime::PreparedApp, Option<Plan>), DeployError> {
        let r = rt.clone();
        let (prepared, plan) = tokio::task::spawn_blocking(move || {
            let plan = r.migration_plan(&prepared, percent);
            (prepared, plan)
        })
        .await
        .map_err(|e| RuntimeError::Internal(format!("migration plan task: {e}")))?;
        let plan = plan?;
        if plan.is_some() && self.cluster().is_none() {
            return Err(RuntimeError::Internal(
                "class migrations need the node's cluster state, which this node has not attached"
                    .into(),
            )
            .into());
        }
        Ok((prepared, plan))
    }

    /// A deploy whose manifest lists class migrations (ADR 0071,
    /// `super::migrations`): the classes closed on every node and every
    /// actor to move checked before version `version` is recorded; then
    /// the moves, then the classes open again.
    async fn deploy_migrating(
        &self,
        rt: &Runtime,
        prepared: wasmkeep_runtime::PreparedApp,
        plan: Plan,
        version: AppVersion,
        manifest: String,
    ) -> Result<(AppInfo, AppVersion), DeployError> {
        use super::migrations::{Closing, closing_key, run_moves};
        let state = self.cluster().ok_or_else(|| {
            RuntimeError::Internal("class migrations need the node's cluster state".into())
        })?;
        let epoch = state.acting_epoch().ok_or(RuntimeError::ShuttingDown)?;
        let (tenant, app, n) = (plan.tenant.clone(), plan.app.clone(), version.version);
        let nonce = super::random_hex(8)
            .map_err(|e| RuntimeError::Internal(format!("closing record nonce: {e}")))?;
        let key = closing_key(&tenant, &app, n, &nonce);
        let closing = Closing {
            node: state.node().to_owned(),
            epoch,
            version: n,
            hash: version.hash.clone(),
            deployed_ms: version.deployed_ms,
            plan,
        };
        let in_flight = |other: &str| {
            DeployError::Runtime(RuntimeError::ClassMigration {
                code: "migration_busy",
                message: format!(
                    "another migration of {tenant}/{app} is in flight (closing record `{other}`); deploy again once it is done"
                ),
            })
        };
        let _running = self.try_run_here(&key);
        if !self.open_closing(&key, &closing).await? {
            return Err(in_flight(&key));
        }
        // One migration of an app at a time: of two created together, the
        // lower key goes on.
        if let Some(other) = closings_in(&self.app_keys(&tenant, &app).await?)
            .into_iter()
            .find(|k| *k < key)
        {
            self.finish_closing(rt, &key, &closing, false).await;
            return Err(in_flight(&other));
        }
        let mut unknown = false;
        let checked = async {
            self.close_everywhere(&state, rt, &key, &closing).await?;
            let (prepared, again) = self.plan_of(rt, prepared, 100).await?;
            if again.as_ref() != Some(&closing.plan) {
                return Err(DeployError::Runtime(RuntimeError::ClassMigration {
                    code: "migration_conflict",
                    message: format!(
                        "the actors of {tenant}/{app}'s migrated classes changed while the cluster closed them; nothing moved, deploy again"
                    ),
                }));
            }
            self.check_actors(&state, rt, &closing).await?;
            // Before the version: still this node's epoch and its record (a
            // node that saw this one's lease lapse drops it), and every
            // node live now has closed the classes (one may have joined).
            if state.acting_epoch() != Some(epoch) || self.read_closing(&key).await.is_err() {
                return Err(in_flight(&key));
            }
            self.await_acks(&state, &key).await?;
            match self.record_version(&prepared, &version, &manifest).await {
                Ok(true) => Ok(prepared),
                Ok(false) => Err(DeployError::Contended {
                    app: format!("{tenant}/{app}"),
                }),
                Err(e) => {
                    // The record may have landed: read once a write of it
                    // can no longer be in flight.
                    tokio::time::sleep(self.timeout).await;
                    match self.recorded(&closing).await {
                        Some(true) => Ok(prepared),
                        Some(false) => Err(e),
                        None => {
                            unknown = true;
                            Err(e)
                        }
                    }
                }
            }
        }
        .await;
        let prepared = match checked {
            Ok(p) => p,
            Err(e) => {
                // Nothing moved and no version names the migration (or,
                // unknown, this node's next sync decides from the bucket).
                if !unknown {
                    self.finish_closing(rt, &key, &closing, false).await;
                }
                return Err(e);
            }
        };
        tracing::info!(%tenant, %app, version = n, "recorded a version that migrates classes; moving their actors");
        let installed = self.install(rt, prepared, &version).await;
        match run_moves(&state, rt, &closing).await {
            Ok(moved) => {
                tracing::info!(%tenant, %app, version = n, moved, "class migration done");
                self.finish_closing(rt, &key, &closing, true).await;
            }
            Err(e) => {
                // The version is recorded: the classes stay closed on every
                // node until a sync of this node (or of any node, if this
                // one stops) finishes the moves.
                tracing::error!(%tenant, %app, version = n, error = %e, "a class migration stopped half-way; a sync finishes it");
                return Err(e);
            }
        }
        self.prune(rt, &tenant, &app, n).await;
        installed
    }

    /// Whether the version a closing record precedes was recorded, read
    /// afresh: `Some(true)` if record N is the one it planned (same
    /// component, same deploy time), `Some(false)` if there is none or
    /// another deploy's, `None` if the bucket did not say.
    pub(crate) async fn recorded(&self, closing: &super::migrations::Closing) -> Option<bool> {
        let p = &closing.plan;
        let key = record_key(&p.tenant, &p.app, closing.version);
        let read = self
            .bucket
            .get_bounded(&key, "RECORD_BYTES_MAX", RECORD_BYTES_MAX);
        match tokio::time::timeout(self.timeout, read).await {
            Ok(Ok(bytes)) => {
                let r: Record = serde_json::from_slice(&bytes).ok()?;
                Some(r.version.hash == closing.hash && r.version.deployed_ms == closing.deployed_ms)
            }
            Ok(Err(e)) if e.is_not_found() => Some(false),
            _ => None,
        }
    }

    /// How long a record must have been seen before a node drops it as
    /// never recorded: twice the bucket's timeout, past which no write of
    /// its version's record is still in flight.
    pub(crate) fn settle_ms(&self) -> u64 {
        (self.timeout.as_millis() as u64).saturating_mul(2)
    }

    /// How long this node has seen the closing record `key` (0 the first
    /// time).
    pub(crate) fn seen_ms(&self, key: &str) -> u64 {
        let now = wasmkeep_runtime::clock::instant();
        let first = *self.seen.lock().entry(key.to_owned()).or_insert(now);
        now.saturating_duration_since(first).as_millis() as u64
    }

    /// Forgets the closing records no longer listed.
    pub(crate) fn forget_unseen(&self, listed: &[String]) {
        self.seen.lock().retain(|k, _| listed.contains(k));
    }

    /// Uploads the component of `version` and creates its record,
    /// create-only: `false` if another deploy took the number.
    async fn record_version(
        &self,
        prepared: &wasmkeep_runtime::PreparedApp,
        version: &AppVersion,
        manifest: &str,
    ) -> Result<bool, DeployError> {
        let info = prepared.info();
        let (tenant, app, n) = (info.tenant.as_str(), info.app.as_str(), version.version);
        // The component first, under the number: a record never names a
        // component that is not there.
        let body = Bytes::copy_from_slice(prepared.wasm());
        self.bounded(
            "upload the component",
            self.bucket
                .create(&component_key(tenant, app, n, &info.hash), body),
        )
        .await?;
        let record = Record {
            version: version.clone(),
            manifest: manifest.to_owned(),
        };
        let json = serde_json::to_vec(&record)
            .map_err(|e| RuntimeError::Internal(format!("version record: {e}")))?;
        let created = self
            .bounded(
                "record the version",
                self.bucket
                    .create(&record_key(tenant, app, n), Bytes::from(json)),
            )
            .await?;
        Ok(created != Created::AlreadyExists)
    }

    /// Step 2 of a migration here: the classes closed on this node and
    /// acknowledged, then every live node's ack awaited.
    async fn close_everywhere(
        &self,
        state: &super::ClusterState,
        rt: &Runtime,
        key: &str,
        closing: &super::migrations::Closing,
    ) -> Result<(), DeployError> {
        super::migrations::close_here(state, rt, key, closing).await?;
        self.ack(state, key).await?;
        self.await_acks(state, key).await
    }

    async fn install(
        &self,
        rt: &Runtime,
        prepared: wasmkeep_runtime::PreparedApp,
        version: &AppVersion,
    ) -> Result<(AppInfo, AppVersion), DeployError> {
        let info = prepared.info();
        let (rt2, v) = (rt.clone(), version.clone());
        let done = tokio::task::spawn_blocking(move || rt2.install_recorded(prepared, &v))
            .await
            .map_err(|e| RuntimeError::Internal(format!("install task: {e}")))??;
        self.installed
            .lock()
            .insert((info.tenant.clone(), info.app.clone()), version.version);
        Ok(done)
    }

    /// Deletes what falls out of the newest `app_versions_max` after
    /// version `newest` was recorded. Best effort: what a failure leaves is
    /// deleted by the next deploy.
    async fn prune(&self, rt: &Runtime, tenant: &str, app: &str, newest: u64) {
        let keep = rt.config().app_versions_max.max(1) as u64;
        let Some(below) = newest.checked_sub(keep - 1) else {
            return;
        };
        let dir = format!("{COMPONENTS_PREFIX}{tenant}/{app}/");
        let components = self
            .bounded(
                "list components",
                self.bucket.list(&dir, None, VERSIONS_LISTED_MAX),
            )
            .await;
        // The whole version a rollout moves actors from stays.
        let keep_too = match self.stable_before(tenant, app, newest + 1).await {
            Ok(s) => s.map(|r| r.version.version),
            Err(_) => return,
        };
        let doomed_number = |n: u64| n < below && Some(n) != keep_too;
        let mut doomed: Vec<String> = Vec::new();
        if let Ok(numbers) = self.numbers(tenant, app).await {
            doomed.extend(
                numbers
                    .iter()
                    .filter(|n| doomed_number(**n))
                    .map(|n| record_key(tenant, app, *n)),
            );
        }
        if let Ok(keys) = components {
            doomed.extend(keys.into_iter().filter(|k| {
                k.strip_prefix(&dir)
                    .and_then(|r| r.get(..20))
                    .and_then(|n| n.parse::<u64>().ok())
                    .is_some_and(doomed_number)
            }));
        }
        for key in doomed {
            if let Err(e) = self.bounded("prune", self.bucket.delete(&key)).await {
                tracing::warn!(%key, error = %e, "an old version stays in the bucket until the next deploy");
                return;
            }
        }
    }

    /// The app's versions in the bucket, oldest first.
    pub async fn versions(&self, tenant: &str, app: &str) -> Result<Vec<AppVersion>, DeployError> {
        let numbers = self.numbers(tenant, app).await?;
        if numbers.is_empty() {
            return Err(RuntimeError::AppNotFound(format!("{tenant}/{app}")).into());
        }
        let mut out = Vec::with_capacity(numbers.len());
        for n in numbers {
            match self.record(tenant, app, n).await {
                Ok(r) => out.push(r.version),
                // Pruned between the listing and the read.
                Err(_) if out.is_empty() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Deploys a kept version again to the cluster, as a new version that
    /// names it (`to: None`: the one before the newest).
    pub async fn rollback(
        &self,
        rt: &Runtime,
        tenant: &str,
        app: &str,
        to: Option<u64>,
        by: String,
    ) -> Result<(AppInfo, AppVersion), DeployError> {
        let kept = self.versions(tenant, app).await?;
        let missing = |version| RuntimeError::VersionNotFound {
            app: format!("{tenant}/{app}"),
            version,
        };
        let n = match to {
            Some(n) if kept.iter().any(|v| v.version == n) => n,
            Some(n) => return Err(missing(n).into()),
            None => {
                wasmkeep_runtime::rollback_target(&kept)
                    .ok_or(missing(0))?
                    .version
            }
        };
        let target = self.record(tenant, app, n).await?;
        // A version from before a class migration would serve classes
        // whose data moved (ADR 0060): a kept version after it that lists
        // a migration it lacks refuses the rollback, as on one node.
        let tags = |manifest: &str| -> std::collections::HashSet<String> {
            wasmkeep_runtime::AppManifest::parse(manifest)
                .map(|m| m.migrations.into_iter().map(|x| x.tag).collect())
                .unwrap_or_default()
        };
        let before = tags(&target.manifest);
        for later in kept.iter().filter(|v| v.version > n) {
            let r = self.record(tenant, app, later.version).await?;
            if tags(&r.manifest).iter().any(|t| !before.contains(t)) {
                return Err(RuntimeError::ClassMigration {
                    code: "rollback_past_migration",
                    message: format!(
                        "version {} of {tenant}/{app} migrated classes' data; version {n} is from before, and its classes would find none: roll back to version {} or later, or deploy a build for the migrated classes",
                        later.version, later.version
                    ),
                }
                .into());
            }
        }
        let wasm = self.component(rt, tenant, app, &target.version).await?;
        let d = NewDeploy {
            tenant: tenant.to_owned(),
            app: app.to_owned(),
            wasm,
            manifest: target.manifest,
            by,
            rollback_of: Some(n),
            percent: 100,
            deferred: false,
        };
        self.deploy(rt, d).await
    }

    /// One pass: installs the newest version of every app whose newest
    /// number in the bucket is not the one this node has. Returns how
    /// many it installed. An app that fails is left for the next pass.
    pub async fn sync(&self, rt: &Runtime) -> Result<usize, DeployError> {
        let one = self.writing.lock().await;
        self.sync_with(rt, Some(one)).await
    }

    /// [`Deploys::sync`] for the periodic task: while a deploy of this
    /// node holds `writing` (a migration's moves may take minutes), the
    /// installs wait for the next pass but the closing records of other
    /// nodes' migrations are still acknowledged.
    async fn sync_periodic(&self, rt: &Runtime) -> Result<usize, DeployError> {
        let one = self.writing.try_lock().ok();
        self.sync_with(rt, one).await
    }

    async fn sync_with(
        &self,
        rt: &Runtime,
        one: Option<tokio::sync::MutexGuard<'_, ()>>,
    ) -> Result<usize, DeployError> {
        let mut installed = 0;
        let mut listed = None;
        if let Some(one) = one {
            let (n, keys) = self.install_newest(rt).await?;
            installed = n;
            listed = Some(keys);
            drop(one);
        }
        if let Some(state) = self.cluster() {
            // Listed afresh, after the installs, while migrations are about
            // (the reopening of a class waits for this node to serve the
            // version that migrated it); else the installs' listing serves.
            let keys = match listed {
                Some(keys) if closings_in(&keys).is_empty() && rt.closing_records().is_empty() => {
                    keys
                }
                _ => {
                    self.bounded(
                        "list versions",
                        self.bucket.list(VERSIONS_PREFIX, None, VERSIONS_LISTED_MAX),
                    )
                    .await?
                }
            };
            self.sync_closings(&state, rt, &keys).await;
        }
        Ok(installed)
    }

    /// The installs of a sync, under `writing`: how many, and the listing
    /// of `versions/` they read.
    async fn install_newest(&self, rt: &Runtime) -> Result<(usize, Vec<String>), DeployError> {
        let keys = self
            .bounded(
                "list versions",
                self.bucket.list(VERSIONS_PREFIX, None, VERSIONS_LISTED_MAX),
            )
            .await?;
        let mut newest: BTreeMap<(String, String), u64> = BTreeMap::new();
        for (t, a, n) in keys.iter().filter_map(|k| parse_record_key(k)) {
            let e = newest.entry((t, a)).or_insert(n);
            *e = (*e).max(n);
        }
        let mut installed = 0;
        for ((tenant, app), n) in &newest {
            match self.sync_app(rt, tenant, app, *n).await {
                Ok(true) => installed += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(%tenant, %app, version = n, error = %e, "could not install the cluster's version; trying again at the next sync");
                }
            }
        }
        Ok((installed, keys))
    }

    /// Installs version `n` of an app unless this node has it. Under
    /// `writing`.
    async fn sync_app(
        &self,
        rt: &Runtime,
        tenant: &str,
        app: &str,
        n: u64,
    ) -> Result<bool, DeployError> {
        let key = (tenant.to_owned(), app.to_owned());
        // A listing read before `writing` was taken may be older than what
        // this node installed since (its own deploy): never go back.
        if self.installed.lock().get(&key).is_some_and(|m| *m >= n) {
            return Ok(false);
        }
        // A version that failed to install here is tried again only after
        // a pause, not fetched and compiled at every sync.
        let now = now_ms();
        if self
            .failed
            .lock()
            .get(&key)
            .is_some_and(|(m, until)| *m == n && now < *until)
        {
            return Ok(false);
        }
        let installed = self.sync_record(rt, tenant, app, n).await;
        if installed.is_err() {
            let until = now.saturating_add(INSTALL_RETRY_MS);
            self.failed.lock().insert(key, (n, until));
        }
        installed
    }

    /// [`Deploys::sync_app`]'s work: version `n`, and for a partial one the
    /// whole version it rolls out from, unless this node has them.
    async fn sync_record(
        &self,
        rt: &Runtime,
        tenant: &str,
        app: &str,
        n: u64,
    ) -> Result<bool, DeployError> {
        let key = (tenant.to_owned(), app.to_owned());
        let record = self.record(tenant, app, n).await?;
        let here = rt
            .versions(tenant, app)
            .ok()
            .and_then(|v| v.last().cloned());
        if here.is_some_and(|h| h.version == n && h.hash == record.version.hash) {
            self.installed.lock().insert(key, n);
            return Ok(false);
        }
        // A partial version rolls out from the newest whole one before it:
        // the node serves that one to the other actors.
        if record.version.percent < 100
            && let Some(whole) = self.stable_before(tenant, app, n).await?
            && rt.app(tenant, app).map(|a| a.version) != Some(whole.version.version)
        {
            self.install_record(rt, tenant, app, whole).await?;
        }
        self.install_record(rt, tenant, app, record).await?;
        self.synced_total.inc();
        tracing::info!(%tenant, %app, version = n, "installed the cluster's version");
        Ok(true)
    }

    /// The newest whole version numbered below `n`, if the bucket keeps one.
    async fn stable_before(
        &self,
        tenant: &str,
        app: &str,
        n: u64,
    ) -> Result<Option<Record>, DeployError> {
        let numbers = self.numbers(tenant, app).await?;
        for m in numbers.into_iter().rev().filter(|m| *m < n) {
            let r = self.record(tenant, app, m).await?;
            if r.version.percent == 100 {
                return Ok(Some(r));
            }
        }
        Ok(None)
    }

    /// Fetches, compiles and installs one recorded version.
    async fn install_record(
        &self,
        rt: &Runtime,
        tenant: &str,
        app: &str,
        record: Record,
    ) -> Result<(), DeployError> {
        let key = (tenant.to_owned(), app.to_owned());
        let wasm = self.component(rt, tenant, app, &record.version).await?;
        let prepared = {
            let (rt, t, a, m) = (rt.clone(), key.0.clone(), key.1.clone(), record.manifest);
            tokio::task::spawn_blocking(move || rt.prepare(&t, &a, &wasm, &m))
                .await
                .map_err(|e| RuntimeError::Internal(format!("compile task: {e}")))??
        };
        self.install(rt, prepared, &record.version).await?;
        Ok(())
    }

    /// For a request naming an app or class this node does not have: reads
    /// the bucket for that app (once per app and sync period) and installs
    /// its newest version if there is one this node lacks. Returns whether
    /// it installed one.
    pub async fn refresh(&self, rt: &Runtime, tenant: &str, app: &str) -> bool {
        let key = (tenant.to_owned(), app.to_owned());
        if !self.may_refresh(&key) {
            return false;
        }
        let found = match self.numbers(tenant, app).await {
            Ok(numbers) => match numbers.last() {
                Some(n) => {
                    let _one = self.writing.lock().await;
                    self.sync_app(rt, tenant, app, *n).await.unwrap_or(false)
                }
                None => false,
            },
            Err(_) => false,
        };
        if !found {
            // Not again for this name until the next sync period.
            let mut missed = self.refreshed.lock();
            if missed.len() >= REFRESH_NAMES_MAX {
                let now = now_ms();
                missed.retain(|_, at| now.saturating_sub(*at) < self.sync_ms);
            }
            if missed.len() < REFRESH_NAMES_MAX {
                missed.insert(key, now_ms());
            }
        }
        found
    }

    /// Whether a request may look `key` up in the bucket now: not if the
    /// name missed within the sync period, nor past
    /// [`REFRESHES_PER_S_MAX`] lookups this second, nor while
    /// [`REFRESH_NAMES_MAX`] names missed lately.
    fn may_refresh(&self, key: &(String, String)) -> bool {
        let now = now_ms();
        {
            let missed = self.refreshed.lock();
            if missed
                .get(key)
                .is_some_and(|at| now.saturating_sub(*at) < self.sync_ms)
            {
                return false;
            }
        }
        let mut budget = self.refresh_budget.lock();
        if now / 1000 != budget.0 {
            *budget = (now / 1000, 0);
        }
        if budget.1 >= REFRESHES_PER_S_MAX {
            return false;
        }
        budget.1 += 1;
        true
    }

    /// At start, before the node serves: installs the cluster's versions,
    /// then records as version 1 each app this node has that the bucket
    /// has no version of (an app deployed before its cluster kept
    /// versions, the examples of `--examples`).
    pub async fn start(&self, rt: &Runtime) -> Result<(), DeployError> {
        self.sync(rt).await?;
        let _one = self.writing.lock().await;
        for a in rt.apps() {
            if self
                .installed
                .lock()
                .contains_key(&(a.tenant.clone(), a.app.clone()))
            {
                continue;
            }
            let Some(wasm) = rt.stored_component(&a.tenant, &a.app, &a.hash) else {
                continue;
            };
            let manifest = rt.stored_manifest(&a.tenant, &a.app, &a.hash);
            let by = rt
                .versions(&a.tenant, &a.app)
                .ok()
                .and_then(|v| v.last().map(|v| v.by.clone()))
                .unwrap_or_default();
            let d = NewDeploy {
                tenant: a.tenant.clone(),
                app: a.app.clone(),
                wasm,
                manifest,
                by,
                rollback_of: None,
                percent: 100,
                deferred: false,
            };
            // One app that cannot be recorded or installed does not keep
            // the others from it.
            match self.deploy_locked(rt, d, true).await {
                Ok(Some((_, v))) => {
                    tracing::info!(tenant = %a.tenant, app = %a.app, version = v.version, "recorded this node's app as the cluster's first version");
                }
                Ok(None) => {
                    // Another node recorded it meanwhile: take the bucket's.
                    if let Some(n) = self.numbers(&a.tenant, &a.app).await?.last()
                        && let Err(e) = self.sync_app(rt, &a.tenant, &a.app, *n).await
                    {
                        tracing::warn!(tenant = %a.tenant, app = %a.app, error = %e, "could not install the cluster's version; trying again at the next sync");
                    }
                }
                Err(DeployError::Bucket(e)) => return Err(DeployError::Bucket(e)),
                Err(e) => {
                    tracing::warn!(tenant = %a.tenant, app = %a.app, error = %e, "could not record this node's app in the bucket");
                }
            }
        }
        Ok(())
    }
}

/// Every `cluster_deploy_sync_ms` until the node stops: one sync pass.
pub(crate) async fn run(
    deploys: Arc<Deploys>,
    rt: Runtime,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let every = Duration::from_millis(deploys.sync_ms().max(1));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        if let Err(e) = deploys.sync_periodic(&rt).await {
            tracing::warn!(error = %e, "could not read the cluster's versions; trying again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_keys_parse_back_and_nothing_else_does() {
        let k = record_key("t", "a", 42);
        assert_eq!(k, "versions/t/a/00000000000000000042");
        assert_eq!(parse_record_key(&k), Some(("t".into(), "a".into(), 42)));
        for bad in [
            "versions/t/a/42",
            "versions/t/00000000000000000042",
            "versions/t/a/00000000000000000042/x",
            "components/t/a/00000000000000000042",
            "versions/t/a/0000000000000000004x",
        ] {
            assert_eq!(parse_record_key(bad), None, "{bad}");
        }
        assert_eq!(
            component_key("t", "a", 3, "ab"),
            "components/t/a/00000000000000000003-ab.wasm"
        );
    }
}
