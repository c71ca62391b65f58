//! Cluster mode's node side: the node's identity, its own lease, and the
//! driver that runs `wasmkeep_cluster`'s step machines against the real
//! bucket with the real clock (ADR 0020).
//!
//! `wasmkeep serve --bucket URL --advertise http://HOST:PORT` starts
//! [`ClusterNode`], which takes the next epoch in the data directory
//! ([`identity`]), then drives a [`NodeLeaseMachine`] in a tokio task: it
//! registers `nodes/<id>/<epoch>/<counter>` with the advertised address,
//! renews every third of `lease_period_ms`, and when the epoch ends
//! (lapsed: renewals failed until the margin; fenced: another node wrote
//! the next counter) the node stops acknowledging at once, takes a new
//! epoch and registers again. At shutdown [`ClusterNode::release`] releases
//! the node's holds, then writes `released` as its lease record.
//!
//! Actors' ownership ([`ownership`]): the actor route asks the table where
//! a request runs; an actor the node does not hold is taken by a
//! `TakeMachine` (held here) or found to be another live node's (forwarded
//! there by [`forward::Forwarder`], one hop). Idle actors are released by a
//! `ReleaseMachine`. [`ClusterNode::attach_runtime`] gates the runtime's
//! alarms by ownership and closes its actors while the node does not act.
//!
//! The hook between the lease and the rest of the node is
//! [`ClusterState::is_acting`]: the time until which the lease lets the node
//! act, by the node's own clock, which the HTTP edge checks before it runs
//! an actor request and again before it acknowledges one (503
//! `node_not_acting` otherwise).
//!
//! | part | what it does |
//! |---|---|
//! | [`bucket`] | performs a machine's `BucketOp` on `wasmkeep_replica::Bucket`, bounded in time and bytes |
//! | [`identity`] | `<data>/node/id` and `<data>/node/epoch` |
//! | `lease_task` | the tokio task that drives `NodeLeaseMachine` |
//! | [`ownership`] | the ownership table: takes, owner cache, releases |
//! | [`forward`] | forwards a request to its actor's owner over kept connections |
//! | [`sweep`] | every node's sweep of the alarm index (ADR 0009): orphaned alarms fire |
//! | [`deploys`] | apps' versions in the bucket: one deploy for the cluster (ADR 0058) |
//! | [`view`] | the live nodes as the bucket shows them (`/admin/v1/cluster`) |
//!
//! The machines decide; this module only performs. The rules it runs are
//! [`RULES`], ADR 0009's safe ones, the only ones a server may pass.

pub mod bucket;
pub mod deploys;
pub mod forward;
pub mod identity;
mod lease_task;
pub mod migrations;
pub mod ownership;
pub mod rebalance;
pub mod sign;
pub mod sweep;
pub mod view;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use wasmkeep_cluster::Rules;
use wasmkeep_cluster::machine::NodeLeaseMachine;
use wasmkeep_runtime::metrics::{self, GaugeU64};
use wasmkeep_runtime::{ActorId, RunGate, Runtime, RuntimeConfig, RuntimeError};

pub use wasmkeep_cluster::ClusterConfig;
use wasmkeep_replica::Bucket;

use self::bucket::BucketDriver;
use self::identity::NodeIdentity;

/// The rules this server runs: ADR 0009's, never an unsafe variant (those
/// exist for the simulator only). Every machine and rule the server calls
/// that takes `Rules` is given this.
pub const RULES: Rules = Rules::SAFE;

/// How a node joins a cluster.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// The address other nodes reach this node at (`http://host:port`),
    /// written into every live lease record.
    pub advertise: String,
    /// The secret nodes share, which keys the signature of every request
    /// between them ([`sign`]); it never travels. `None` until the node
    /// starts: then the one in the bucket ([`sign::cluster_secret`]).
    pub cluster_token: Option<String>,
    /// Lease timings and protocol bounds (ADR 0020's defaults).
    pub protocol: ClusterConfig,
    /// The longest one bucket operation of the cluster protocol may take
    /// before it counts as failed.
    pub bucket_timeout_ms: u64,
    /// The longest a forwarded request may take, from connecting to the
    /// owner to the last byte of its answer (504 `forward_timeout` past it).
    pub forward_timeout_ms: u64,
    /// Largest answer body a forwarding node relays (the owner's
    /// `response_body_bytes_max` plus room for an error body).
    pub forward_response_bytes_max: usize,
    /// How long a node remembers which node owns an actor before it reads
    /// the bucket again, from the lookup or the owner's last answer to a
    /// forward (dropped at once when a forward to it fails).
    pub owner_cache_ttl_ms: u64,
    /// Most actors the ownership table tracks (held, or owners cached).
    pub actors_max: usize,
    /// An actor with no request for this long is released (its hold
    /// written `released`), so another node may take it at once. Longer
    /// than the runtime's `actor_idle_ms`, so that the runtime closed it
    /// first.
    pub release_idle_ms: u64,
    /// How often the node reads the apps' versions in the bucket and
    /// installs the newest of each (`cluster_deploy_sync_ms`, ADR 0058).
    pub deploy_sync_ms: u64,
    /// The node id the operator gives this node (`cluster_node_id`, ADR
    /// 0069): kept when its data directory is lost, so that its actors are
    /// taken at once by its next start instead of after its lease lapses.
    /// `None`: an id drawn at the first start and kept in the data
    /// directory.
    pub node_id: Option<String>,
    /// How many actors a second this node hands to a node that asks for
    /// its fair share, and whether it asks for its own when it starts
    /// serving (`cluster_rebalance_moves_per_s`, ADR 0072; 0: neither).
    pub rebalance_moves_per_s: u32,
}

impl ClusterSettings {
    /// The settings of a cluster node whose runtime runs with `runtime`:
    /// the protocol (lease timings, the sweep, the alarm backoff) is the
    /// runtime's; the idle release follows its `actor_idle_ms` (the runtime
    /// closes an idle actor first, ownership.rs explains why) and the
    /// relayed answer's bound its `response_body_bytes_max`; the rest have
    /// their defaults.
    pub fn new(advertise: &str, cluster_token: Option<String>, runtime: &RuntimeConfig) -> Self {
        ClusterSettings {
            advertise: advertise.to_owned(),
            cluster_token,
            protocol: runtime.protocol.clone(),
            bucket_timeout_ms: BUCKET_TIMEOUT_MS,
            forward_timeout_ms: FORWARD_TIMEOUT_MS,
            forward_response_bytes_max: runtime
                .response_body_bytes_max
                .saturating_add(FORWARD_ERROR_BODY_BYTES_MAX),
            owner_cache_ttl_ms: OWNER_CACHE_TTL_MS,
            actors_max: ACTORS_MAX,
            release_idle_ms: runtime
                .actor_idle_ms
                .saturating_add(RELEASE_AFTER_IDLE_CLOSE_MS),
            deploy_sync_ms: deploys::DEPLOY_SYNC_MS,
            node_id: None,
            rebalance_moves_per_s: rebalance::MOVES_PER_S,
        }
    }
}

pub use wasmkeep_cluster::config::BUCKET_TIMEOUT_MS;
/// Room for an error body beside the largest answer an actor may send, in
/// an answer a forwarding node relays.
pub const FORWARD_ERROR_BODY_BYTES_MAX: usize = 64 * 1024;

/// Longest a request waiting on its answer goes without checking that its
/// node still acts ([`ClusterState::stopped_acting_in`]).
pub const STOPPED_ACTING_CHECK_MS: u64 = 250;

/// Default of `cluster_forward_timeout_ms`.
pub const FORWARD_TIMEOUT_MS: u64 = 30_000;
/// Default of `cluster_owner_cache_ttl_ms`.
pub const OWNER_CACHE_TTL_MS: u64 = 2_000;
/// Default of `cluster_actors_max`.
pub const ACTORS_MAX: usize = 100_000;
/// How much longer than `actor_idle_ms` an actor must be idle before it is
/// released: the runtime's reaper closes idle actors once a second, and a
/// released actor must be closed here before another node may take it.
pub const RELEASE_AFTER_IDLE_CLOSE_MS: u64 = 2_000;

/// The header that marks a request forwarded by another node (one hop: a
/// node never forwards a request that carries it).
pub const FORWARDED_HEADER: &str = "x-wasmkeep-forwarded";
/// The header that carried the cluster secret on forwarded requests
/// before they were signed: never sent any more, and dropped from what a
/// node relays or hands an actor.
pub const CLUSTER_TOKEN_HEADER: &str = "x-wasmkeep-cluster-token";
/// The response header naming the node that ran the request.
pub const NODE_HEADER: &str = "x-wasmkeep-node";

/// Why cluster mode could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("node identity file unusable: {reason}: path=`{}`", path.display())]
    Identity { reason: String, path: PathBuf },
    #[error(
        "invalid advertised address: {reason} (expected http://HOST:PORT): advertise=`{address}`"
    )]
    Advertise { reason: String, address: String },
    #[error("invalid cluster setting: {0}")]
    Protocol(#[from] wasmkeep_cluster::Error),
    #[error("no randomness for the node id or nonces: {0}")]
    Random(std::io::Error),
    #[error("no cluster secret: configure cluster_token, or let the node read the bucket's")]
    NoSecret,
    #[error(
        "invalid cluster_node_id: lowercase letters, digits and `-`, at most 64: cluster_node_id=`{0}`"
    )]
    NodeId(String),
    #[error(
        "could not read the epochs node {node} registered in the bucket (its data directory has no identity, so its next epoch must come after them): {reason}"
    )]
    RegisteredEpochs { node: String, reason: String },
    #[error(
        "another process is renewing node {node}'s lease (epoch {epoch}): one process per cluster_node_id; stop it, or give this node another id"
    )]
    IdInUse { node: String, epoch: u64 },
}

impl ClusterSettings {
    /// Checks the advertised address (an `http` or `https` URL with a host and
    /// port and nothing after it, within the lease record's bound) and the
    /// timings.
    pub fn check(&self) -> Result<(), ClusterError> {
        let bad = |reason: &str| ClusterError::Advertise {
            reason: reason.to_owned(),
            address: self.advertise.chars().take(400).collect(),
        };
        wasmkeep_cluster::lease::validate_address(&self.advertise)
            .map_err(|e| bad(&e.to_string()))?;
        if let Some(id) = &self.node_id
            && wasmkeep_cluster::lease::validate_node(id).is_err()
        {
            return Err(ClusterError::NodeId(id.chars().take(100).collect()));
        }
        let uri: http::Uri = self.advertise.parse().map_err(|_| bad("not a URL"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(bad("scheme must be http or https"));
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        if authority.host().is_empty() || authority.port_u16().is_none() {
            return Err(bad("host and port required"));
        }
        if authority.as_str().contains('@') {
            return Err(bad("no user information"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(bad("nothing after the port"));
        }
        self.protocol.validate()?;
        let zero = [
            ("cluster_forward_timeout_ms", self.forward_timeout_ms),
            ("cluster_actors_max", self.actors_max as u64),
            ("cluster_deploy_sync_ms", self.deploy_sync_ms),
            (
                "forward_response_bytes_max",
                self.forward_response_bytes_max as u64,
            ),
        ];
        if let Some((name, _)) = zero.iter().find(|(_, v)| *v == 0) {
            return Err(ClusterError::Advertise {
                reason: format!("{name} must be at least 1"),
                address: self.advertise.clone(),
            });
        }
        if self.bucket_timeout_ms == 0 {
            return Err(ClusterError::Advertise {
                reason: "cluster_bucket_timeout_ms must be at least 1".into(),
                address: self.advertise.clone(),
            });
        }
        Ok(())
    }
}

/// What the rest of the node sees of the lease: shared with the HTTP edge.
#[derive(Debug)]
pub struct ClusterState {
    node: String,
    address: String,
    epoch: AtomicU64,
    /// The node acts while the clock is below this (ms since the Unix epoch);
    /// 0 while it may not act (registering, lapsed, fenced, released).
    acting_until_ms: AtomicU64,
    /// The counter of the last record that landed, plus one (0: none yet).
    lease_counter_plus_1: AtomicU64,
    /// The lease's counters, and the registry of the cluster's series.
    metrics: ClusterMetrics,
    /// The epoch in which the runtime has no actor open from an earlier
    /// epoch (the first one, or one after the release task closed them):
    /// actors are routed only in it.
    fresh_epoch: AtomicU64,
    /// Signs requests to other nodes and checks theirs (the cluster's
    /// secret never leaves the node).
    pub signer: Arc<sign::Signer>,
    /// The bucket, for reading other nodes' leases (the admin view).
    driver: BucketDriver,
    /// The actors this node holds, and the owners it knows.
    pub ownership: ownership::Ownership,
    /// Kept connections to the owners requests are forwarded to.
    pub forwarder: forward::Forwarder,
    /// Set when the node starts to stop: new actor requests are refused
    /// (503 `node_not_acting`, which a forwarding node answers by routing
    /// again) while the ones in flight finish and the node hands its actors
    /// over, with its listener still open (see [`ClusterState::in_flight`]).
    draining: std::sync::atomic::AtomicBool,
    /// Whether the task of a drain (`wasmkeep drain`) runs.
    pub(crate) drain_task: std::sync::atomic::AtomicBool,
    /// The other nodes' asks for actors this node has not handed over yet
    /// (planned rebalancing, ADR 0072).
    pub(crate) gives: rebalance::Gives,
    /// Actor requests this node is routing, running or forwarding now.
    in_flight: std::sync::atomic::AtomicUsize,
    /// The alarm sweep's counters.
    pub sweep: Arc<sweep::SweepCounters>,
    /// The live nodes as the sweep's last pass read them: whose tenants'
    /// bucket use this node measures ([`ClusterState::measures_usage`]).
    live: parking_lot::Mutex<Vec<String>>,
    /// The apps' versions in the bucket: deploys, rollbacks and the sync.
    pub deploys: Arc<deploys::Deploys>,
    /// The node's runtime, once attached: whose classes a migration
    /// closed (ADR 0071), which no request, alarm or sweep takes.
    runtime: std::sync::OnceLock<Attached>,
}

/// The unsafe variant of "a closed class's actors are not taken" (ADR
/// 0071), for the test that shows the rule matters.
#[cfg(feature = "test-faults")]
static UNSAFE_TAKE_CLOSED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Switches [`UNSAFE_TAKE_CLOSED`] on for the process (a `test-faults`
/// build's `WASMKEEP_UNSAFE=migration_takes_closed_classes`).
#[cfg(feature = "test-faults")]
pub(crate) fn unsafe_take_closed_classes() {
    UNSAFE_TAKE_CLOSED.store(true, Ordering::Relaxed);
}

/// The runtime a [`ClusterState`] was attached to.
struct Attached(Runtime);

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Runtime")
    }
}

/// One actor request in flight ([`ClusterState::enter`]); leaves on drop.
pub struct InFlight<'a>(&'a ClusterState);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The node's view of its cluster state at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub node: String,
    pub address: String,
    pub epoch: u64,
    pub acting: bool,
    pub acting_until_ms: u64,
    pub lease_counter: Option<u64>,
    pub renewals_total: u64,
    pub epochs_total: u64,
    pub lapsed_total: u64,
    pub fenced_total: u64,
}

impl ClusterState {
    /// The cluster's bucket (for listings of the whole cluster).
    pub(crate) fn bucket(&self) -> &wasmkeep_replica::Bucket {
        self.driver.bucket()
    }

    /// Takes the live nodes a sweep pass read.
    pub(crate) fn set_live(&self, live: &[String]) {
        live.clone_into(&mut self.live.lock());
    }

    /// Whether this node measures `tenant`'s use of the bucket: the live
    /// node that rendezvous hashing picks for it (every node, until a
    /// sweep pass has read the live nodes).
    pub fn measures_usage(&self, tenant: &str) -> bool {
        let live = self.live.lock();
        live.is_empty()
            || wasmkeep_cluster::sweep::rendezvous(&format!("usage/{tenant}"), &live)
                == Some(self.node())
    }

    fn new(
        node: &str,
        first_epoch: u64,
        settings: &ClusterSettings,
        driver: BucketDriver,
        prefix_bytes: usize,
    ) -> ClusterState {
        let ownership =
            ownership::Ownership::new(node, driver.clone(), settings.clone(), prefix_bytes);
        let signer = Arc::new(sign::Signer::new(
            settings
                .cluster_token
                .as_deref()
                .expect("ClusterNode::start checked the secret"),
        ));
        let sweep = Arc::new(sweep::SweepCounters::default());
        let deploys = Arc::new(deploys::Deploys::new(
            driver.bucket().clone(),
            settings.bucket_timeout_ms,
            settings.deploy_sync_ms,
        ));
        ClusterState {
            node: node.to_owned(),
            address: settings.advertise.clone(),
            signer: Arc::clone(&signer),
            driver,
            metrics: ClusterMetrics::new(&ownership.counters, &sweep, &deploys),
            sweep,
            ownership,
            forwarder: forward::Forwarder::new(signer),
            epoch: AtomicU64::new(0),
            fresh_epoch: AtomicU64::new(first_epoch),
            acting_until_ms: AtomicU64::new(0),
            lease_counter_plus_1: AtomicU64::new(0),
            draining: std::sync::atomic::AtomicBool::new(false),
            drain_task: std::sync::atomic::AtomicBool::new(false),
            gives: rebalance::Gives::default(),
            in_flight: std::sync::atomic::AtomicUsize::new(0),
            live: parking_lot::Mutex::new(Vec::new()),
            deploys,
            runtime: std::sync::OnceLock::new(),
        }
    }

    /// Counts an actor request in flight, unless the node is draining.
    pub fn enter(&self) -> Option<InFlight<'_>> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let guard = InFlight(self);
        // Checked after counting: a request either sees the drain and
        // leaves, or is counted before the drain waits for the count.
        if self.draining.load(Ordering::Acquire) {
            return None;
        }
        Some(guard)
    }

    /// Refuses new actor requests from now on (a clean stop).
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether the node refuses new actor requests because it is stopping.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Actor requests in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Whether the node's lease lets it act now, by its own clock (the lease
    /// machine's acting deadline: the record's expiry minus the margin).
    pub fn is_acting(&self) -> bool {
        now_ms() < self.acting_until_ms.load(Ordering::Acquire)
    }

    /// Resolves once the node no longer acts in `epoch` (its lease lapsed
    /// or was fenced, or it moved on to another epoch): what a request
    /// routed in `epoch` waits on beside its answer, so that it is
    /// answered `lease_lapsed` then rather than when a bucket call it
    /// waits on times out (issue 41). Checks at the acting deadline, at
    /// most [`STOPPED_ACTING_CHECK_MS`] apart.
    pub async fn stopped_acting_in(&self, epoch: u64) {
        loop {
            if self.acting_epoch() != Some(epoch) {
                return;
            }
            let until = self.acting_until_ms.load(Ordering::Acquire);
            let wait = until
                .saturating_sub(now_ms())
                .clamp(1, STOPPED_ACTING_CHECK_MS);
            tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        }
    }

    /// The epoch in which the node's lease lets it act now, if it does.
    pub fn acting_epoch(&self) -> Option<u64> {
        let epoch = self.epoch.load(Ordering::Acquire);
        self.is_acting().then_some(epoch)
    }

    /// The epoch in which actors may be routed (taken, served) now: the
    /// acting epoch, once the runtime closed the actors it had open in an
    /// earlier one (a copy kept open across a change of owner would be
    /// stale: the runtime consults the bucket once per opening).
    pub fn route_epoch(&self) -> Option<u64> {
        let fresh = self.fresh_epoch.load(Ordering::Acquire);
        self.acting_epoch().filter(|e| *e == fresh)
    }

    /// Checks, before its body is read, that a request carrying the
    /// forwarded marker comes from a node of this cluster ([`sign`]):
    /// `path_and_query` as the sender addressed it. Returns the hash the
    /// body must have ([`sign::body_matches`]).
    pub fn verify_from_node(
        &self,
        method: &str,
        path_and_query: &str,
        headers: &http::HeaderMap,
    ) -> Result<sign::BodyHash, sign::SignError> {
        let header = headers
            .get(sign::SIGNATURE_HEADER)
            .and_then(|v| v.to_str().ok());
        let signed = sign::Signed {
            method,
            to: &self.address,
            path_and_query,
            forwarded: true,
        };
        self.signer.verify_head(header, &signed, now_ms())
    }

    /// The header a request to the node at `to` carries (forwarded).
    pub fn sign_for(&self, method: &str, to: &str, path_and_query: &str, body: &[u8]) -> String {
        let signed = sign::Signed {
            method,
            to,
            path_and_query,
            forwarded: true,
        };
        self.signer.sign(&signed, body, now_ms())
    }

    /// The node's cluster settings (the forwarder's bounds and secret).
    pub(crate) fn settings(&self) -> &ClusterSettings {
        self.ownership.settings()
    }

    /// The node id.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The live nodes as the bucket shows them, for `/admin/v1/cluster`.
    pub async fn view(&self) -> Result<view::ClusterView, view::ViewError> {
        view::read(&self.driver, &self.settings().protocol).await
    }

    /// Whether a class migration closed `id`'s class on this node (ADR
    /// 0071): nothing takes the actor then but the migration itself, so
    /// that its holds are free for the node that moves it.
    pub(crate) fn class_closed(&self, id: &ActorId) -> bool {
        self.refuse_if_class_closed(id).is_err()
    }

    /// `class_migrating` if [`ClusterState::class_closed`] (the runtime's
    /// own refusal).
    pub(crate) fn refuse_if_class_closed(&self, id: &ActorId) -> Result<(), RuntimeError> {
        #[cfg(feature = "test-faults")]
        if UNSAFE_TAKE_CLOSED.load(Ordering::Relaxed) {
            return Ok(());
        }
        match self.runtime.get().and_then(|a| a.0.migration_refusal(id)) {
            Some(refused) => Err(refused),
            None => Ok(()),
        }
    }

    /// Whether `node`'s lease is live in `epoch` (`None`: unreadable now).
    pub(crate) async fn node_live(&self, node: &str, epoch: u64) -> Option<bool> {
        view::live_in(&self.driver, &self.settings().protocol, node, epoch).await
    }

    /// Actors this node holds in its current epoch (0 while it does not act).
    pub fn held_actors(&self) -> usize {
        self.acting_epoch().map_or(0, |e| self.ownership.held(e))
    }

    /// A copy of the state for `/admin/v1/node`.
    pub fn status(&self) -> NodeStatus {
        let l = |a: &AtomicU64| a.load(Ordering::Acquire);
        NodeStatus {
            node: self.node.clone(),
            address: self.address.clone(),
            epoch: l(&self.epoch),
            acting: self.is_acting(),
            acting_until_ms: l(&self.acting_until_ms),
            lease_counter: l(&self.lease_counter_plus_1).checked_sub(1),
            renewals_total: self.metrics.renewals_total.get(),
            epochs_total: self.metrics.epochs_total.get(),
            lapsed_total: self.metrics.lapsed_total.get(),
            fenced_total: self.metrics.fenced_total.get(),
        }
    }

    /// Appends the cluster's series to `/metrics`, in the OpenMetrics text
    /// format and without the closing `# EOF` (the caller ends the
    /// exposition). The gauges are read from the lease state now.
    pub fn encode_metrics(&self, out: &mut String) -> std::fmt::Result {
        let m = &self.metrics;
        m.acting.set(i64::from(self.is_acting()));
        m.epoch.set(self.epoch.load(Ordering::Acquire));
        prometheus_client::encoding::text::encode_registry(out, &m.registry)
    }
}

/// The lease's counters and gauges, and the registry that holds them with
/// the ownership table's counters.
#[derive(Debug, Default)]
struct ClusterMetrics {
    renewals_total: Counter,
    epochs_total: Counter,
    lapsed_total: Counter,
    fenced_total: Counter,
    /// Set on each scrape ([`ClusterState::encode_metrics`]).
    acting: Gauge,
    epoch: GaugeU64,
    registry: Registry,
}

impl ClusterMetrics {
    fn new(
        ownership: &ownership::OwnershipCounters,
        sweep: &sweep::SweepCounters,
        deploys: &deploys::Deploys,
    ) -> ClusterMetrics {
        let mut m = ClusterMetrics::default();
        let mut r = Registry::default();
        // Counters are registered without `_total`: the library appends it.
        let counters: [(&str, &Counter, &str); 4] = [
            (
                "wasmkeep_cluster_lease_renewals",
                &m.renewals_total,
                "Lease records of this node that landed (registrations and renewals).",
            ),
            (
                "wasmkeep_cluster_epochs",
                &m.epochs_total,
                "Epochs this process started (one at start, one after each lapse or fence).",
            ),
            (
                "wasmkeep_cluster_lease_lapses",
                &m.lapsed_total,
                "Epochs that ended because renewals failed until the margin.",
            ),
            (
                "wasmkeep_cluster_lease_fences",
                &m.fenced_total,
                "Epochs that ended because another node fenced this one.",
            ),
        ];
        for (name, counter, help) in counters {
            metrics::register(&mut r, name, help, None, counter.clone());
        }
        ownership.register(&mut r);
        sweep.register(&mut r);
        metrics::register(
            &mut r,
            "wasmkeep_cluster_versions_synced",
            "Apps' versions this node installed from the bucket (deployed through another node).",
            None,
            deploys.synced_total.clone(),
        );
        metrics::register(
            &mut r,
            "wasmkeep_cluster_acting",
            "1 while the node's lease lets it act.",
            None,
            m.acting.clone(),
        );
        metrics::register(
            &mut r,
            "wasmkeep_cluster_epoch",
            "This node's current epoch.",
            None,
            m.epoch.clone(),
        );
        m.registry = r;
        m
    }
}

/// A node in cluster mode: its identity and the task that keeps its lease.
pub struct ClusterNode {
    state: Arc<ClusterState>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    releaser: Option<tokio::task::JoinHandle<()>>,
    sweeper: Option<tokio::task::JoinHandle<()>>,
    deploy_sync: Option<tokio::task::JoinHandle<()>>,
    release_idle_ms: u64,
    release_budget_ms: u64,
}

/// Every [`ownership::RELEASE_SCAN_MS`] until the node stops: releases
/// idle actors (but those with an alarm pending in this node's timer), and
/// while the node does not act, or when its epoch changed, closes the
/// runtime's idle actors, so that each is taken and restored again before
/// it is served.
async fn release_task(
    state: Arc<ClusterState>,
    rt: Runtime,
    idle_ms: u64,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let every = std::time::Duration::from_millis(ownership::RELEASE_SCAN_MS);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        let epoch = state.acting_epoch();
        let fresh = state.fresh_epoch.load(Ordering::Acquire);
        if epoch.is_none() || epoch.is_some_and(|e| e != fresh) {
            let closer = rt.clone();
            if let Ok(n) = tokio::task::spawn_blocking(move || closer.close_idle_now()).await
                && n > 0
            {
                tracing::info!(closed = n, "lease ended: closed this node's actors");
            }
            // Sockets of actors this node no longer holds go too, with the
            // code that tells their clients to reconnect (ADR 0043).
            let moved = rt.sockets().close_unless(
                |id| rt.may_run_actor(id),
                wasmkeep_runtime::sockets::close_code::MOVED,
                "this node no longer holds the actor: reconnect",
            );
            if moved > 0 {
                tracing::info!(
                    actors = moved,
                    "lease ended: closed the sockets of actors no longer held"
                );
            }
            if let Some(e) = epoch {
                // Closed after the epoch began: idle actors open before it
                // are gone. A busy one (an upload in flight) stays open;
                // its next turn finds its copy from an earlier epoch and
                // opens it afresh (the runtime's `RunGate::epoch`).
                state.fresh_epoch.store(e, Ordering::Release);
            }
        }
        // Kept: actors with an alarm pending here, and actors the runtime
        // still has open (their hold outlives their open copy).
        // An actor with open WebSockets stays held: its sockets are here.
        let keep = |id: &ActorId| {
            rt.alarms().timer_at(id).is_some() || rt.is_open(id) || rt.sockets().has_sockets(id)
        };
        state
            .ownership
            .release_idle(idle_ms, || state.acting_epoch(), keep)
            .await;
        // Holds that may name this node though it does not hold them (ADR
        // 0073): looked up, and released if they do.
        state
            .ownership
            .settle_marks(idle_ms, || state.acting_epoch())
            .await;
    }
}

/// The runtime's gate for alarms in cluster mode: an actor's alarm runs on
/// this node only while its lease lets it act and it holds the actor. For an
/// actor it does not hold, the node tries to take it first (its lease may
/// have ended, or it restarted): taken, the alarm runs here (the alarm event
/// re-reads the committed alarm after the restore, so a stale local copy
/// runs nothing); owned by another live node, it is that node's alarm and
/// leaves this node's timer. A draining node (`wasmkeep drain`) takes
/// none: the alarm runs where the actor goes. The take blocks the runtime's timer thread, for
/// at most [`ALARM_TAKE_WAIT_MS`]; never an async thread (there it answers
/// from the table alone).
#[derive(Debug)]
struct AlarmGate {
    state: Arc<ClusterState>,
    tokio: tokio::runtime::Handle,
}

/// The longest the alarm gate waits for a take of an actor whose alarm is
/// due (or soon due) on this node.
pub const ALARM_TAKE_WAIT_MS: u64 = 5_000;

impl RunGate for AlarmGate {
    fn may_run(&self, id: &ActorId) -> bool {
        let state = &self.state;
        let Some(epoch) = state.route_epoch() else {
            return false;
        };
        if state.class_closed(id) {
            // The migration moving it takes it, not an alarm.
            return false;
        }
        if state.ownership.holds(id, epoch, true) {
            return true;
        }
        // A draining node takes no actor for an alarm, and does not wait on
        // one its drain is handing over (the drain holds its slot): the
        // alarm runs where the actor goes.
        // Nor on one a rebalancing move hands over.
        if tokio::runtime::Handle::try_current().is_ok()
            || state.ownership.is_moving_out()
            || state.ownership.handing_over(id)
        {
            return false;
        }
        let wait = std::time::Duration::from_millis(ALARM_TAKE_WAIT_MS);
        let take = state.ownership.route(id, || state.route_epoch(), false);
        // The timeout is made inside the runtime: a timer needs its reactor.
        let routed = self
            .tokio
            .block_on(async { tokio::time::timeout(wait, take).await });
        matches!(routed, Ok(Ok(ownership::Route::Local(_))))
    }

    fn hold_generation(&self, id: &ActorId) -> Option<u64> {
        let epoch = self.state.route_epoch()?;
        self.state.ownership.generation(id, epoch)
    }

    fn nonce(&self) -> u64 {
        nonce()
    }

    fn epoch(&self) -> Option<u64> {
        self.state.route_epoch()
    }

    fn measures_usage(&self, tenant: &str) -> bool {
        self.state.measures_usage(tenant)
    }
}

/// For a start of a configured `node` whose data directory has no
/// identity (ADR 0069): the newest epoch the bucket has a lease record of
/// for it (0: none), which the start goes past so that no epoch is used
/// twice; and if that epoch's latest record is live, a fence of it
/// (create-only at the next counter, as a take fences a lapsed lease), so
/// that a process still renewing it learns at its next renewal that its
/// epoch is over. If the fence finds a live renewal there, another process
/// has this id now and the start is refused. An error too if the bucket
/// cannot be listed or read: guessing could reuse an epoch.
pub async fn take_up_identity(
    bucket: &Bucket,
    node: &str,
    timeout_ms: u64,
) -> Result<u64, ClusterError> {
    use wasmkeep_cluster::lease::{LeaseRecord, NODES_PREFIX};
    use wasmkeep_cluster::machine::{BucketOp, BucketResult, NodeViewEffect, NodeViewReader};
    let fail = |reason: &str| ClusterError::RegisteredEpochs {
        node: node.to_owned(),
        reason: reason.to_owned(),
    };
    let driver = BucketDriver::new(bucket.clone(), timeout_ms);
    // The node's folder listed and its latest record read, as a take reads
    // a holder's lease.
    let mut reader = NodeViewReader::new(node, wasmkeep_cluster::ClusterConfig::default());
    loop {
        match reader.poll_effect() {
            Some(NodeViewEffect::Bucket(op)) => {
                let result = driver.perform(op).await;
                reader.on_result(result, now_ms());
            }
            Some(NodeViewEffect::Done(Ok(_))) => break,
            Some(NodeViewEffect::Done(Err(_))) | None => {
                return Err(fail("its lease records could not be listed and read"));
            }
        }
    }
    let Some(latest) = reader.read_key().cloned() else {
        return Ok(0);
    };
    if reader.address().is_none() {
        // Fenced or released: the epoch is over already.
        return Ok(latest.epoch);
    }
    // Created only if nothing holds the next counter, as a take fences a
    // lapsed lease.
    let key = latest.next().to_key(NODES_PREFIX);
    let body = LeaseRecord::Fenced {
        by: node.to_owned(),
        nonce: nonce(),
    }
    .encode()
    .into_bytes();
    match driver
        .perform(BucketOp::PutCreate {
            key: key.clone(),
            body,
        })
        .await
    {
        BucketResult::Done => Ok(latest.epoch),
        BucketResult::AlreadyExists => match driver.perform(BucketOp::Get { key }).await {
            BucketResult::Body(b) => {
                match String::from_utf8(b).ok().map(|t| LeaseRecord::decode(&t)) {
                    Some(Ok(LeaseRecord::Live { .. })) => Err(ClusterError::IdInUse {
                        node: node.to_owned(),
                        epoch: latest.epoch,
                    }),
                    // Fenced (by this very write, its response lost, or another
                    // node's take) or released: the epoch is over.
                    Some(Ok(_)) => Ok(latest.epoch),
                    _ => Err(fail("the record after its latest is not a lease record")),
                }
            }
            _ => Err(fail("the record after its latest could not be read")),
        },
        _ => Err(fail("its latest epoch could not be fenced")),
    }
}

impl ClusterNode {
    /// Takes the next epoch (durably, before anything else) and starts the
    /// lease task on the current tokio runtime. The node does not act until
    /// its registration lands.
    /// `registered`: with a configured `node_id`, the newest epoch the
    /// bucket holds a lease record of for it ([`take_up_identity`]); 0
    /// otherwise.
    pub fn start(
        settings: ClusterSettings,
        bucket: Bucket,
        data: &Path,
        registered: u64,
    ) -> Result<ClusterNode, ClusterError> {
        settings.check()?;
        if settings.cluster_token.is_none() {
            return Err(ClusterError::NoSecret);
        }
        let identity = NodeIdentity::start(data, settings.node_id.as_deref(), registered)?;
        // Checks the id and address once here; every later epoch reuses them.
        NodeLeaseMachine::new(
            identity.node(),
            identity.epoch(),
            &settings.advertise,
            settings.protocol.clone(),
        )?;
        let prefix_bytes = bucket.prefix_bytes();
        let driver = BucketDriver::new(bucket, settings.bucket_timeout_ms);
        let state = Arc::new(ClusterState::new(
            identity.node(),
            identity.epoch(),
            &settings,
            driver.clone(),
            prefix_bytes,
        ));
        // Class migrations (ADR 0071) need the node's leases and holds.
        state.deploys.attach(Arc::downgrade(&state));
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let release_idle_ms = settings.release_idle_ms;
        // A release waits for a renewal in flight, then writes its record.
        let release_budget_ms = settings.bucket_timeout_ms.saturating_mul(3);
        tracing::info!(
            node = identity.node(),
            epoch = identity.epoch(),
            advertise = %settings.advertise,
            "cluster mode: registering this node's lease"
        );
        let task = tokio::spawn(lease_task::run(
            identity,
            settings,
            driver,
            Arc::clone(&state),
            stop_rx,
        ));
        Ok(ClusterNode {
            state,
            stop,
            task,
            releaser: None,
            sweeper: None,
            deploy_sync: None,
            release_idle_ms,
            release_budget_ms,
        })
    }

    /// Ties the node's runtime to its ownership: the runtime runs an
    /// actor's alarms only while this node holds it (`AlarmGate`), closes
    /// its actors when the lease ends, and idle actors are released. Call
    /// once, before the node serves.
    pub fn attach_runtime(&mut self, rt: &Runtime) {
        let _ = self.state.runtime.set(Attached(rt.clone()));
        let gate = AlarmGate {
            state: Arc::clone(&self.state),
            tokio: tokio::runtime::Handle::current(),
        };
        if !rt.alarms().set_gate(Arc::new(gate)) {
            tracing::warn!("the runtime had a gate already; alarms are not gated by ownership");
        }
        let task = release_task(
            Arc::clone(&self.state),
            rt.clone(),
            self.release_idle_ms,
            self.stop.subscribe(),
        );
        self.releaser = Some(tokio::spawn(task));
        let sweep = sweep::run(Arc::clone(&self.state), rt.clone(), self.stop.subscribe());
        self.sweeper = Some(tokio::spawn(sweep));
        let sync = deploys::run(
            Arc::clone(&self.state.deploys),
            rt.clone(),
            self.stop.subscribe(),
        );
        self.deploy_sync = Some(tokio::spawn(sync));
    }

    /// Before the node serves: installs the cluster's versions of its
    /// apps, and records the apps only this node has (ADR 0058). Tries
    /// for `limit` while the bucket fails, then lets the node serve what
    /// it has (the sync task keeps trying; the node cannot take actors
    /// without the bucket anyway).
    pub async fn sync_deploys(&self, rt: &Runtime, limit: std::time::Duration) {
        let started = wasmkeep_runtime::clock::instant();
        loop {
            match self.state.deploys.start(rt).await {
                Ok(()) => return,
                Err(e) if started.elapsed() < limit => {
                    tracing::warn!(error = %e, "could not read the cluster's versions yet; trying again");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "serving this node's own apps until the cluster's versions can be read");
                    return;
                }
            }
        }
    }

    /// The state the HTTP edge checks.
    pub fn state(&self) -> Arc<ClusterState> {
        Arc::clone(&self.state)
    }

    /// Clean shutdown: the node stops acting at once and writes `released`
    /// as its next lease record, so that others need not wait for the lease
    /// to run out. Bounded: a bucket that does not answer only makes others
    /// wait.
    pub async fn release(self) {
        // Holds first, while the lease still lets the node write them: the
        // connections have drained, so every held actor is idle.
        if let Some(releaser) = &self.releaser {
            releaser.abort();
        }
        if let Some(sweeper) = &self.sweeper {
            sweeper.abort();
        }
        if let Some(sync) = &self.deploy_sync {
            sync.abort();
        }
        let budget = std::time::Duration::from_millis(self.release_budget_ms);
        let state = Arc::clone(&self.state);
        let holds = state
            .ownership
            .release_idle(0, || state.acting_epoch(), |_| false);
        match tokio::time::timeout(budget, holds).await {
            Ok(n) => tracing::info!(released = n, "released this node's actors"),
            Err(_) => tracing::warn!("actors not all released in time; they lapse with the lease"),
        }
        let _ = self.stop.send(true);
        let budget = std::time::Duration::from_millis(self.release_budget_ms);
        if tokio::time::timeout(budget, self.task).await.is_err() {
            tracing::warn!("the lease was not released in time; others wait for it to lapse");
        }
    }
}

/// The node's clock for the lease: milliseconds since the Unix epoch. Lease
/// expiries are compared across nodes by their own clocks (ADR 0020's
/// grace absorbs the skew), so this is the wall clock.
pub(crate) fn now_ms() -> u64 {
    use wasmkeep_runtime::Clock;
    wasmkeep_runtime::SystemClock.now_ms()
}

/// `bytes` random bytes as lowercase hex, from the operating system.
pub(crate) fn random_hex(bytes: usize) -> Result<String, ClusterError> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf)
        .map_err(|e| ClusterError::Random(std::io::Error::other(e.to_string())))?;
    Ok(hex::encode(buf))
}

/// A record's nonce: random, so that a writer tells its own record from
/// any other's (protocol.md).
pub(crate) fn nonce() -> u64 {
    random_hex(8)
        .ok()
        .and_then(|h| u64::from_str_radix(&h, 16).ok())
        // Without randomness, the clock still makes retries' bodies differ.
        .unwrap_or_else(|| now_ms().rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(advertise: &str) -> ClusterSettings {
        ClusterSettings::new(
            advertise,
            Some("test secret".into()),
            &wasmkeep_runtime::RuntimeConfig::new("unused"),
        )
    }

    /// The server links the rules the simulator proves: `RULES` is
    /// `Rules::SAFE`, and no source file of this crate names an unsafe
    /// variant or builds rules any other way.
    #[test]
    fn the_server_runs_the_safe_rules_only() {
        assert_eq!(RULES, Rules::SAFE);
        assert_eq!(RULES.variant, wasmkeep_cluster::Variant::Safe);
        let sources = [
            ("api.rs", include_str!("api.rs")),
            ("cluster.rs", include_str!("cluster.rs")),
            ("cluster/bucket.rs", include_str!("cluster/bucket.rs")),
            ("cluster/identity.rs", include_str!("cluster/identity.rs")),
            (
                "cluster/lease_task.rs",
                include_str!("cluster/lease_task.rs"),
            ),
            ("cluster/ownership.rs", include_str!("cluster/ownership.rs")),
            ("cluster/forward.rs", include_str!("cluster/forward.rs")),
            ("cluster/view.rs", include_str!("cluster/view.rs")),
        ];
        let forbidden = [
            ["Rules", "::with("].concat(),
            ["Variant", "::parse("].concat(),
        ];
        let mut unsafe_names: Vec<String> = wasmkeep_cluster::Variant::UNSAFE
            .iter()
            .map(|v| format!("{v:?}"))
            .collect();
        unsafe_names.extend(forbidden);
        for (file, text) in sources {
            for name in &unsafe_names {
                assert!(!text.contains(name.as_str()), "{file} names `{name}`");
            }
        }
    }

    #[test]
    fn advertised_addresses_are_checked() {
        for ok in [
            "http://127.0.0.1:8080",
            "https://node-1.example:443/",
            "http://[::1]:9",
        ] {
            settings(ok).check().unwrap();
        }
        for bad in [
            "",
            "127.0.0.1:8080",
            "ftp://a:1",
            "http://a",
            "http://a:1/x",
            "http://u@a:1",
            "http://a:1?q",
            "http://a b:1",
        ] {
            let e = settings(bad).check().unwrap_err().to_string();
            assert!(e.contains("advertise"), "{bad}: {e}");
        }
        let long = format!("http://{}:1", "a".repeat(300));
        assert!(settings(&long).check().is_err());
    }

    /// A cluster node's `/metrics` is one OpenMetrics exposition: the
    /// runtime's families and the cluster's, each with one `TYPE`, no name
    /// twice, one `# EOF` at the end; and its series are exactly the ones
    /// the README's "Health and metrics" section lists.
    #[test]
    fn metrics_are_one_exposition_with_the_series_the_readme_lists() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let bucket = Bucket::from_url(&url).unwrap();
        let prefix_bytes = bucket.prefix_bytes();
        let driver = BucketDriver::new(bucket, 5_000);
        let state = ClusterState::new(
            "n1",
            1,
            &settings("http://127.0.0.1:1"),
            driver,
            prefix_bytes,
        );
        state.metrics.renewals_total.inc();
        state.ownership.counters.forwards_total.inc();
        state.epoch.store(7, Ordering::Release);
        let mut runtime =
            metrics::Metrics::with_bucket(Arc::new(wasmkeep_replica::Metrics::default()));
        // The labelled series, with one class of its own (and `_other`).
        let classes = Arc::new(wasmkeep_runtime::class_metrics::ClassMetricsRegistry::new(
            10,
        ));
        classes.register("t", "a", "c");
        let id = wasmkeep_runtime::ActorId::new("t", "a", "c", "n").unwrap();
        classes.of(&id).unwrap().error("guest_error");
        runtime.classes = Some(classes);
        runtime.requests_total.inc();

        let text = crate::api::exposition(&runtime, Some(&state), true).unwrap();
        assert!(text.ends_with("\n# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1);
        let mut families = std::collections::BTreeSet::new();
        let mut samples = std::collections::BTreeSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap();
                assert!(families.insert(name.to_owned()), "TYPE {name} twice");
            } else if !line.starts_with('#') {
                let (series, value) = line.rsplit_once(' ').unwrap();
                assert!(value.parse::<f64>().is_ok(), "{line}");
                assert!(samples.insert(series.to_owned()), "{series} twice");
            }
        }
        let sample = |s: &str| text.lines().find_map(|l| l.strip_prefix(&format!("{s} ")));
        assert_eq!(sample("wasmkeep_requests_total"), Some("1"));
        assert_eq!(sample("wasmkeep_cluster_lease_renewals_total"), Some("1"));
        assert_eq!(sample("wasmkeep_cluster_forwards_total"), Some("1"));
        assert_eq!(sample("wasmkeep_cluster_epoch"), Some("7"));
        assert_eq!(sample("wasmkeep_cluster_acting"), Some("0"));

        // What a dashboard selects: counters' and gauges' samples, and
        // histograms by their family name.
        let exported: std::collections::BTreeSet<String> = samples
            .iter()
            .map(|s| s.split('{').next().unwrap())
            .filter_map(|n| {
                let h = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|x| n.strip_suffix(x));
                match h {
                    Some(family) if families.contains(family) => None,
                    _ => Some(n.to_owned()),
                }
            })
            .chain(families.iter().filter(|f| f.ends_with("_seconds")).cloned())
            .collect();
        let readme = include_str!("../../../README.md");
        let section = readme
            .split("### Health and metrics")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("the README's metrics section");
        let listed: std::collections::BTreeSet<String> = section
            .split('`')
            .filter(|w| {
                w.starts_with("wasmkeep_")
                    && !w.ends_with('*')
                    && w.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            })
            .map(str::to_owned)
            .collect();
        assert_eq!(exported, listed);
    }
}
