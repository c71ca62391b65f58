//! Cluster mode's node side: the node's identity, its own lease, and the
//! driver that runs `wasmkeep_cluster`'s step machines against the real
//! bucket with the real clock (ADR 0020).
//!
//! What runs today is the node's **own lease** only: `wasmkeep serve
//! --bucket URL --advertise http://HOST:PORT` starts [`ClusterNode`], which
//! takes the next epoch in the data directory ([`identity`]), then drives a
//! [`NodeLeaseMachine`] in a tokio task: it registers
//! `nodes/<id>/<epoch>/<counter>` with the advertised address, renews every
//! third of `lease_period_ms`, and when the epoch ends (lapsed: renewals
//! failed until the margin; fenced: another node wrote the next counter)
//! the node stops acknowledging at once, takes a new epoch and registers
//! again. At shutdown [`ClusterNode::release`] writes `released`.
//!
//! The hook between the lease and the rest of the node is
//! [`ClusterState::is_acting`]: the time until which the lease lets the node
//! act, by the node's own clock, which the HTTP edge checks before it runs
//! an actor request and again before it acknowledges one (503
//! `node_not_acting` otherwise). Taking actors (holds), forwarding and
//! failover are not here yet; neither is telling the runtime to drop its
//! actors or stop its alarms while the node does not act.
//!
//! | part | what it does |
//! |---|---|
//! | [`bucket`] | performs a machine's `BucketOp` on `wasmkeep_replica::Bucket`, bounded in time and bytes |
//! | [`identity`] | `<data>/node/id` and `<data>/node/epoch` |
//! | `lease_task` | the tokio task that drives `NodeLeaseMachine` |
//!
//! The machines decide; this module only performs. The rules it runs are
//! [`RULES`], ADR 0009's safe ones, the only ones a server may pass.

pub mod bucket;
pub mod identity;
mod lease_task;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use wasmkeep_cluster::Rules;
use wasmkeep_cluster::machine::NodeLeaseMachine;

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
    /// The secret nodes share for internal and forwarded calls. Carried for
    /// the forwarding work; no internal route exists yet.
    pub cluster_token: Option<String>,
    /// Lease timings and protocol bounds (ADR 0020's defaults).
    pub protocol: ClusterConfig,
    /// The longest one bucket operation of the cluster protocol may take
    /// before it counts as failed.
    pub bucket_timeout_ms: u64,
}

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
    renewals_total: AtomicU64,
    epochs_total: AtomicU64,
    lapsed_total: AtomicU64,
    fenced_total: AtomicU64,
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
    fn new(node: &str, address: &str) -> ClusterState {
        ClusterState {
            node: node.to_owned(),
            address: address.to_owned(),
            epoch: AtomicU64::new(0),
            acting_until_ms: AtomicU64::new(0),
            lease_counter_plus_1: AtomicU64::new(0),
            renewals_total: AtomicU64::new(0),
            epochs_total: AtomicU64::new(0),
            lapsed_total: AtomicU64::new(0),
            fenced_total: AtomicU64::new(0),
        }
    }

    /// Whether the node's lease lets it act now, by its own clock (the lease
    /// machine's acting deadline: the record's expiry minus the margin).
    pub fn is_acting(&self) -> bool {
        now_ms() < self.acting_until_ms.load(Ordering::Acquire)
    }

    /// The node id.
    pub fn node(&self) -> &str {
        &self.node
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
            renewals_total: l(&self.renewals_total),
            epochs_total: l(&self.epochs_total),
            lapsed_total: l(&self.lapsed_total),
            fenced_total: l(&self.fenced_total),
        }
    }

    /// Prometheus text for the cluster's counters (appended to `/metrics`).
    pub fn render_metrics(&self) -> String {
        let s = self.status();
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            ));
        };
        metric(
            "wasmkeep_cluster_lease_renewals_total",
            "counter",
            "Lease records of this node that landed (registrations and renewals).",
            s.renewals_total,
        );
        metric(
            "wasmkeep_cluster_epochs_total",
            "counter",
            "Epochs this process started (one at start, one after each lapse or fence).",
            s.epochs_total,
        );
        metric(
            "wasmkeep_cluster_lease_lapses_total",
            "counter",
            "Epochs that ended because renewals failed until the margin.",
            s.lapsed_total,
        );
        metric(
            "wasmkeep_cluster_lease_fences_total",
            "counter",
            "Epochs that ended because another node fenced this one.",
            s.fenced_total,
        );
        metric(
            "wasmkeep_cluster_acting",
            "gauge",
            "1 while the node's lease lets it act.",
            u64::from(s.acting),
        );
        metric(
            "wasmkeep_cluster_epoch",
            "gauge",
            "This node's current epoch.",
            s.epoch,
        );
        out
    }
}

/// A node in cluster mode: its identity and the task that keeps its lease.
pub struct ClusterNode {
    state: Arc<ClusterState>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    release_budget_ms: u64,
}

impl ClusterNode {
    /// Takes the next epoch (durably, before anything else) and starts the
    /// lease task on the current tokio runtime. The node does not act until
    /// its registration lands.
    pub fn start(
        settings: ClusterSettings,
        bucket: Bucket,
        data: &Path,
    ) -> Result<ClusterNode, ClusterError> {
        settings.check()?;
        let identity = NodeIdentity::start(data)?;
        // Checks the id and address once here; every later epoch reuses them.
        NodeLeaseMachine::new(
            identity.node(),
            identity.epoch(),
            &settings.advertise,
            settings.protocol.clone(),
        )?;
        let state = Arc::new(ClusterState::new(identity.node(), &settings.advertise));
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let driver = BucketDriver::new(bucket, settings.bucket_timeout_ms);
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
            release_budget_ms,
        })
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
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `bytes` random bytes as lowercase hex, from the operating system.
pub(crate) fn random_hex(bytes: usize) -> Result<String, ClusterError> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(ClusterError::Random)?;
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
        ClusterSettings {
            advertise: advertise.into(),
            cluster_token: None,
            protocol: ClusterConfig::default(),
            bucket_timeout_ms: 1000,
        }
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
}
