//! Every node's sweep of the alarm index (ADR 0009), so that an alarm fires
//! when the node that held its actor is gone.
//!
//! Every `alarm_sweep_ms` (10 s) the task reads, for each app deployed here
//! and for each of their tenants' tenant-wide (legacy) index, the entries
//! overdue by the sweep margin (a lease period plus grace), at most
//! `sweep_entries_max` (2,048) per index and pass, resuming after the last
//! one next time ([`SweepCursor`]). `plan_sweep` picks at most
//! `sweep_deliveries_max` (256) of them for this node: its own shard first,
//! an eighth for entries overdue long enough to be anyone's, none for an
//! actor with a delivery in flight. A pass that delivered its cap is
//! followed by the next one at once, so a dead node's backlog drains as
//! fast as deliveries run, in bounded steps.
//!
//! A delivery routes the actor as a request would: held or taken here, the
//! runtime delivers the entry (`Runtime::deliver`: the alarm runs if it is
//! the committed one and due); owned by another live node, the entry is that
//! node's and is dropped here; when the bucket cannot be reached, it is
//! tried again after a lease period. A stale entry is removed as R2 and R3
//! say: the actor's tagged entries at that time but the one its database
//! names and those of a newer generation. An entry in the tenant-wide index
//! is delivered to every app of the tenant with the class, and removed only
//! when none of them names it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use wasmkeep_cluster::alarm_index::{
    self, Address, IndexKey, Indexed, Layout, app_index_prefix, tenant_index_prefix,
};
use wasmkeep_cluster::machine::{BucketOp, BucketResult};
use wasmkeep_cluster::sweep::{SweepCursor, SweepInput, plan_sweep};
use wasmkeep_cluster::{ClusterConfig, Rules};
use wasmkeep_runtime::index::Delivered;
use wasmkeep_runtime::metrics::{self, GaugeU64};
use wasmkeep_runtime::{ActorId, Runtime};

use super::ownership::Route;
use super::{ClusterState, now_ms};

/// Deliveries of one pass that run at once.
pub const SWEEP_DELIVERIES_CONCURRENT: usize = 32;
/// Entries remembered as tried recently (a delivery that failed, an entry
/// left for later): past this, the oldest are forgotten and may be tried
/// again early.
pub const SWEEP_DEFERRED_MAX: usize = 16_384;
/// Keys one listing of an actor's tagged entries at one time reads.
pub use wasmkeep_runtime::index::STALE_LISTING_KEYS_MAX;
/// After a delivery ran the alarm or found it not due, the entry is left
/// alone this long: the run's upload removes it.
const AFTER_RUN_MS: u64 = 10_000;

/// The sweep's counters, in `/metrics`.
#[derive(Debug, Default)]
pub struct SweepCounters {
    pub passes_total: Counter,
    pub entries_read_total: Counter,
    pub deliveries_total: Counter,
    pub alarms_run_total: Counter,
    pub takeovers_total: Counter,
    pub not_owner_total: Counter,
    pub stale_removed_total: Counter,
    pub delivery_failures_total: Counter,
    /// How overdue the oldest entry the last pass read was (ms).
    pub lag_ms: GaugeU64,
}

impl SweepCounters {
    /// Registers the series in `r`.
    pub fn register(&self, r: &mut Registry) {
        let series: [(&str, &Counter, &str); 8] = [
            (
                "wasmkeep_alarm_sweep_passes",
                &self.passes_total,
                "Passes of this node's sweep over the alarm index.",
            ),
            (
                "wasmkeep_alarm_sweep_entries_read",
                &self.entries_read_total,
                "Overdue index entries the sweep read.",
            ),
            (
                "wasmkeep_alarm_sweep_deliveries",
                &self.deliveries_total,
                "Index entries this node delivered to their actor.",
            ),
            (
                "wasmkeep_alarm_sweep_alarms_run",
                &self.alarms_run_total,
                "Alarms a sweep's delivery ran (their node did not).",
            ),
            (
                "wasmkeep_alarm_sweep_takeovers",
                &self.takeovers_total,
                "Actors a sweep's delivery took (held by no live node).",
            ),
            (
                "wasmkeep_alarm_sweep_not_owner",
                &self.not_owner_total,
                "Entries dropped because another live node owns the actor.",
            ),
            (
                "wasmkeep_alarm_sweep_stale_removed",
                &self.stale_removed_total,
                "Stale index entries removed (R2, R3, no state).",
            ),
            (
                "wasmkeep_alarm_sweep_delivery_failures",
                &self.delivery_failures_total,
                "Deliveries that failed (the bucket, the actor); tried again later.",
            ),
        ];
        for (name, c, help) in series {
            metrics::register(r, name, help, None, c.clone());
        }
        metrics::register(
            r,
            "wasmkeep_alarm_sweep_lag_ms",
            "How long past its due time the oldest entry the last sweep pass read was.",
            None,
            self.lag_ms.clone(),
        );
    }
}

/// One index the sweep reads: an app's, or a tenant's tenant-wide one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Index {
    tenant: String,
    /// `None`: the tenant-wide index.
    app: Option<String>,
}

impl Index {
    fn prefix(&self) -> String {
        match &self.app {
            Some(app) => app_index_prefix(&self.tenant, app),
            None => tenant_index_prefix(&self.tenant),
        }
    }

    fn layout(&self) -> Layout {
        match self.app {
            Some(_) => Layout::App,
            None => Layout::Tenant,
        }
    }
}

/// An entry left alone until a time.
#[derive(Debug, Clone, Copy)]
struct Deferred {
    until_ms: u64,
    failures: u32,
}

/// What one entry's delivery came to.
struct Delivery {
    /// Leave the entry alone until then.
    until_ms: u64,
    /// Whether it failed (the bucket, the route, the actor).
    failed: bool,
    /// Whether it ran an alarm or removed an entry.
    progress: bool,
}

/// The sweep's memory across passes.
#[derive(Default)]
struct Sweeper {
    cursors: HashMap<Index, SweepCursor>,
    /// Full keys not to deliver before a time (ms), with how many
    /// deliveries of each failed in a row (each doubles the wait).
    deferred: HashMap<String, Deferred>,
    rotation: u64,
}

/// Runs the sweep until `stop`.
pub(super) async fn run(
    state: Arc<ClusterState>,
    rt: Runtime,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let config = state.settings().protocol.clone();
    let every = std::time::Duration::from_millis(config.alarm_sweep_ms.max(1));
    let mut sweeper = Sweeper {
        rotation: super::nonce(),
        ..Sweeper::default()
    };
    let mut wait = every;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        wait = every;
        if state.route_epoch().is_none() {
            continue;
        }
        let full = pass(&state, &rt, &config, &mut sweeper).await;
        if full {
            // The cap bound: more is overdue; sweep again at once.
            wait = std::time::Duration::ZERO;
        }
    }
}

/// One pass over every index; whether the delivery cap bound.
#[allow(
    clippy::too_many_lines,
    reason = "longer than clippy.toml allows; to be split (issue 34)"
)]
async fn pass(
    state: &Arc<ClusterState>,
    rt: &Runtime,
    config: &ClusterConfig,
    sweeper: &mut Sweeper,
) -> bool {
    let counters = &state.sweep;
    counters.passes_total.inc();
    let Ok(view) = state.view().await else {
        return false;
    };
    let live: Vec<String> = view.live.iter().map(|n| n.node.clone()).collect();
    state.set_live(&live);
    if !live.iter().any(|n| n == state.node()) {
        // This node's own lease is not readable as live: no share is its.
        return false;
    }
    let apps = rt.apps();
    let mut indexes: BTreeSet<Index> = BTreeSet::new();
    for a in &apps {
        indexes.insert(Index {
            tenant: a.tenant.clone(),
            app: Some(a.app.clone()),
        });
        indexes.insert(Index {
            tenant: a.tenant.clone(),
            app: None,
        });
    }
    let now = now_ms();
    // Expired entries are kept while they count failures: the next failure
    // waits longer.
    sweeper
        .deferred
        .retain(|_, d| d.until_ms > now || d.failures > 0);
    let mut budget = config.sweep_deliveries_max;
    let mut oldest: Option<u64> = None;
    let mut jobs: Vec<Job> = Vec::new();
    for index in indexes {
        let cursor = sweeper.cursors.entry(index.clone()).or_default();
        let entries = match read_overdue(state, config, &index, cursor, now).await {
            Some(e) => e,
            None => continue,
        };
        counters.entries_read_total.inc_by(entries.len() as u64);
        if let Some(first) = entries.first() {
            oldest = Some(oldest.map_or(first.entry.at_ms, |o| o.min(first.entry.at_ms)));
        }
        let prefix = index.prefix();
        let waiting: Vec<IndexKey> = entries
            .into_iter()
            .filter(|k| {
                sweeper
                    .deferred
                    .get(&format!("{prefix}{}", k.to_key()))
                    .is_none_or(|d| d.until_ms <= now)
            })
            .collect();
        // Actors with a delivery planned in this pass already count as busy.
        let busy: BTreeSet<Address> = jobs
            .iter()
            .filter(|j| j.index == index)
            .map(|j| j.key.address.clone())
            .collect();
        let cfg = ClusterConfig {
            sweep_deliveries_max: budget,
            ..config.clone()
        };
        sweeper.rotation = sweeper.rotation.wrapping_add(1);
        let input = SweepInput {
            entries: &waiting,
            me: state.node(),
            live_nodes: &live,
            busy: &busy,
            rotation: sweeper.rotation,
            now_ms: now,
        };
        let picked = if budget == 0 {
            Vec::new()
        } else {
            plan_sweep(&input, &cfg)
        };
        budget -= picked.len().min(budget);
        jobs.extend(picked.into_iter().map(|key| Job {
            index: index.clone(),
            key,
        }));
    }
    counters
        .lag_ms
        .set(oldest.map_or(0, |o| now.saturating_sub(o)));
    let capped = budget == 0;
    let mut progress = false;
    // Deliveries run a bounded number at a time.
    let mut running = tokio::task::JoinSet::new();
    let mut queue = jobs.into_iter();
    loop {
        while running.len() < SWEEP_DELIVERIES_CONCURRENT {
            let Some(job) = queue.next() else { break };
            let (state, rt, config) = (Arc::clone(state), rt.clone(), config.clone());
            running.spawn(async move {
                let full_key = format!("{}{}", job.index.prefix(), job.key.to_key());
                let later = deliver(&state, &rt, &config, &job).await;
                (full_key, later)
            });
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        let Ok((key, d)) = done else { continue };
        progress |= d.progress;
        let failures = match (d.failed, sweeper.deferred.get(&key)) {
            (true, Some(before)) => before.failures.saturating_add(1),
            (true, None) => 1,
            (false, _) => 0,
        };
        // A failing entry waits a lease period, doubled for each failure
        // in a row, up to the longest backoff.
        let until_ms = if d.failed {
            let wait = wasmkeep_cluster::retry::RetryPolicy {
                first_ms: config.lease_period_ms,
                max_ms: config.retry_max_ms,
                retries_max: None,
            }
            .delay_ms(failures);
            now_ms() + wait
        } else {
            d.until_ms
        };
        if !sweeper.deferred.contains_key(&key)
            && sweeper.deferred.len() >= SWEEP_DEFERRED_MAX
            && let Some(first) = sweeper
                .deferred
                .iter()
                .min_by_key(|(_, d)| d.until_ms)
                .map(|(k, _)| k.clone())
        {
            sweeper.deferred.remove(&first);
        }
        sweeper
            .deferred
            .insert(key, Deferred { until_ms, failures });
    }
    // Again at once only when the cap bound and deliveries got somewhere:
    // entries that fail or reach nobody never make passes run back to back.
    capped && progress
}

/// One entry to deliver, in its index.
struct Job {
    index: Index,
    key: IndexKey,
}

/// Reads one page of overdue entries of an index (at most
/// `sweep_entries_max`, paged by `list_page_keys_max`), moving its cursor.
/// `None` if the bucket did not answer.
async fn read_overdue(
    state: &ClusterState,
    config: &ClusterConfig,
    index: &Index,
    cursor: &mut SweepCursor,
    now: u64,
) -> Option<Vec<IndexKey>> {
    let prefix = index.prefix();
    let request = cursor.request(config);
    let mut keys: Vec<String> = Vec::new();
    let mut after = request.start_after.map(|a| format!("{prefix}{a}"));
    let until = wasmkeep_cluster::sweep::sweep_until_ms(now, config);
    while keys.len() < request.limit {
        let limit = config
            .list_page_keys_max
            .min(request.limit - keys.len())
            .max(1);
        let op = BucketOp::List {
            prefix: prefix.clone(),
            start_after: after.clone(),
            limit,
        };
        let BucketResult::Keys(page) = state.driver.perform(op).await else {
            return None;
        };
        let short = page.len() < limit;
        let mut past_due = false;
        for k in &page {
            let rel = k.strip_prefix(&prefix).unwrap_or(k).to_owned();
            past_due |= alarm_index::due_of_key(&rel).is_some_and(|d| d > until);
            keys.push(rel);
        }
        after = page.last().cloned();
        if short || past_due || after.is_none() {
            break;
        }
    }
    Some(cursor.on_listed(&keys, now, config).entries)
}

/// Delivers one entry; returns until when it is left alone, if it is.
async fn deliver(
    state: &Arc<ClusterState>,
    rt: &Runtime,
    config: &ClusterConfig,
    job: &Job,
) -> Delivery {
    let counters = &state.sweep;
    let apps: Vec<String> = match &job.index.app {
        Some(app) => vec![app.clone()],
        None => rt
            .apps()
            .into_iter()
            .filter(|a| {
                a.tenant == job.index.tenant
                    && a.classes.iter().any(|c| c == job.key.address.class())
            })
            .map(|a| a.app)
            .collect(),
    };
    let mut failed = false;
    let mut progress = false;
    let mut removable: Vec<(Option<Indexed>, u64)> = Vec::new();
    let mut all_removable = !apps.is_empty();
    // Every delivered entry is left alone a while: what ran removes it
    // once its upload landed, and what reaches no actor here (a class no
    // app deployed here has, a name no actor can have) waits the longest
    // backoff, so that neither takes a pass's deliveries again and again.
    let mut left_until = if apps.is_empty() {
        now_ms() + config.retry_max_ms
    } else {
        now_ms() + AFTER_RUN_MS
    };
    for app in apps {
        let Ok(id) = ActorId::new(
            &job.index.tenant,
            &app,
            job.key.address.class(),
            job.key.address.name(),
        ) else {
            all_removable = false;
            left_until = left_until.max(now_ms() + config.retry_max_ms);
            continue;
        };
        counters.deliveries_total.inc();
        let remove_here = job.index.layout() == Layout::App;
        match deliver_to(state, rt, &id, job.key.entry.at_ms, remove_here).await {
            Outcome::Found(Delivered::Remove { named, generation }) => {
                removable.push((named, generation));
            }
            Outcome::Found(Delivered::Cleaned { removed }) => {
                counters.stale_removed_total.inc_by(removed);
                progress |= removed > 0;
                all_removable = false;
            }
            Outcome::Found(Delivered::Ran) => {
                counters.alarms_run_total.inc();
                progress = true;
                all_removable = false;
            }
            Outcome::Found(Delivered::NotDue | Delivered::Fenced) => all_removable = false,
            Outcome::Found(Delivered::Leave { retry_at_ms }) => {
                all_removable = false;
                left_until = left_until.max(retry_at_ms);
            }
            Outcome::NotOwner => {
                counters.not_owner_total.inc();
                all_removable = false;
            }
            Outcome::Failed => {
                counters.delivery_failures_total.inc();
                all_removable = false;
                failed = true;
            }
        }
    }
    if all_removable && !removable.is_empty() {
        progress |= remove_stale(state, job, &removable).await > 0;
    }
    Delivery {
        until_ms: left_until,
        failed,
        progress,
    }
}

enum Outcome {
    Found(Delivered),
    /// Another live node owns the actor: the entry is its.
    NotOwner,
    /// The bucket, the lease or the actor failed: try again later.
    Failed,
}

/// Routes `id` here (taking it if no live node has it) and delivers the
/// entry at `at_ms`; after a fence, delivers it once more to learn what to
/// remove.
async fn deliver_to(
    state: &Arc<ClusterState>,
    rt: &Runtime,
    id: &ActorId,
    at_ms: u64,
    remove_here: bool,
) -> Outcome {
    let held_before = state
        .route_epoch()
        .is_some_and(|e| state.ownership.holds(id, e, false));
    let routed = state
        .ownership
        .route(id, || state.route_epoch(), false)
        .await;
    let in_use = match routed {
        Ok(Route::Local(in_use)) => in_use,
        Ok(Route::Forward { .. }) => return Outcome::NotOwner,
        Err(e) => {
            tracing::debug!(actor = %id, error = ?e, "sweep: could not route the actor");
            return Outcome::Failed;
        }
    };
    if !held_before {
        state.sweep.takeovers_total.inc();
    }
    let mut found = rt.deliver(id, at_ms, remove_here).await;
    if matches!(found, Ok(Delivered::Fenced)) {
        found = rt.deliver(id, at_ms, remove_here).await;
    }
    // Acknowledged only in the epoch it was routed in (a lapse meanwhile
    // may have handed the actor to another node).
    let same_epoch = state.acting_epoch() == Some(in_use.epoch());
    drop(in_use);
    match found {
        Ok(d) if same_epoch => Outcome::Found(d),
        Ok(_) => Outcome::Failed,
        Err(e) => {
            tracing::debug!(actor = %id, error = %e, "sweep: delivery failed");
            Outcome::Failed
        }
    }
}

/// Removes an entry's stale siblings: the actor's tagged entries at that
/// time in that index but those any app's database names and those of a
/// newer generation than the deliverer's hold (R2, R3); in the tenant-wide
/// index also the untagged entry, if no app names it.
async fn remove_stale(
    state: &ClusterState,
    job: &Job,
    removable: &[(Option<Indexed>, u64)],
) -> u64 {
    let layout = job.index.layout();
    let prefix = job.index.prefix();
    let at = job.key.entry.at_ms;
    let folder = format!(
        "{prefix}{}",
        alarm_index::tagged_folder(at, &job.key.address)
    );
    let op = BucketOp::List {
        prefix: folder,
        start_after: None,
        limit: STALE_LISTING_KEYS_MAX,
    };
    let BucketResult::Keys(listed) = state.driver.perform(op).await else {
        return 0;
    };
    let listed: Vec<String> = listed
        .iter()
        .map(|k| k.strip_prefix(&prefix).unwrap_or(k).to_owned())
        .collect();
    let mut doomed: Option<BTreeSet<IndexKey>> = None;
    for (named, generation) in removable {
        let named = named.filter(|n| n.layout == layout).map(|n| n.entry);
        let mine: BTreeSet<IndexKey> = alarm_index::stale_entries_to_delete(
            Rules::SAFE,
            &job.key.address,
            at,
            &listed,
            named.as_ref(),
            *generation,
        )
        .into_iter()
        // Owners write only tagged entries in an app's index.
        .filter(|k| layout == Layout::Tenant || k.entry.tag.is_some())
        .collect();
        doomed = Some(match doomed {
            None => mine,
            Some(d) => d.intersection(&mine).cloned().collect(),
        });
    }
    let mut removed = 0;
    for key in doomed.unwrap_or_default() {
        let op = BucketOp::Delete {
            key: format!("{prefix}{}", key.to_key()),
        };
        if matches!(state.driver.perform(op).await, BucketResult::Done) {
            state.sweep.stale_removed_total.inc();
            removed += 1;
        }
    }
    removed
}

/// One entry of the bucket's index, as `/admin/v1/alarms` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShownEntry {
    /// The app; `null` for an entry in the tenant-wide index (before the
    /// app was part of the address).
    pub app: Option<String>,
    pub class: String,
    pub name: String,
    pub due_ms: u64,
    /// The generation of the hold its writer owned the actor under (the
    /// owner's fence against older owners, R3); `null` for an untagged
    /// entry.
    pub generation: Option<u64>,
    /// The writer's nonce, as hex (R1).
    pub nonce: Option<String>,
}

/// A tenant's entries in the bucket's index, earliest first: those of its
/// apps deployed on this node and its tenant-wide ones, at most `limit`
/// (each index read up to `limit` keys). Keys that do not parse are
/// skipped.
pub async fn show_index(
    state: &ClusterState,
    rt: &Runtime,
    tenant: &str,
    limit: usize,
) -> Result<Vec<ShownEntry>, String> {
    let mut indexes: Vec<Index> = rt
        .apps()
        .into_iter()
        .filter(|a| a.tenant == tenant)
        .map(|a| Index {
            tenant: tenant.to_owned(),
            app: Some(a.app),
        })
        .collect();
    indexes.push(Index {
        tenant: tenant.to_owned(),
        app: None,
    });
    let page = state.settings().protocol.list_page_keys_max.max(1);
    let mut shown = Vec::new();
    for index in indexes {
        let prefix = index.prefix();
        let mut after: Option<String> = None;
        let mut read = 0;
        while read < limit {
            let want = page.min(limit - read);
            let op = BucketOp::List {
                prefix: prefix.clone(),
                start_after: after.clone(),
                limit: want,
            };
            let BucketResult::Keys(keys) = state.driver.perform(op).await else {
                return Err(format!("the bucket did not answer a listing of `{prefix}`"));
            };
            read += keys.len();
            for k in &keys {
                let Ok(key) = IndexKey::parse_full(&prefix, k) else {
                    continue;
                };
                shown.push(ShownEntry {
                    app: index.app.clone(),
                    class: key.address.class().to_owned(),
                    name: key.address.name().to_owned(),
                    due_ms: key.entry.at_ms,
                    generation: key.entry.tag.map(|t| t.generation),
                    nonce: key.entry.tag.map(|t| format!("{:016x}", t.nonce)),
                });
            }
            if keys.len() < want {
                break;
            }
            after = keys.last().cloned();
        }
    }
    shown.sort_by_key(|e| e.due_ms);
    shown.truncate(limit);
    Ok(shown)
}
