//! Every node's sweep of the alarm index (ADR 0009), so that an alarm fires
//! when the node that held its actor is gone.
//!
//! Every `alarm_sweep_ms` (10 s, from one pass's start to the next) the
//! task learns the live nodes through the cluster's `LiveNodes` (one
//! listing; a lease record is read only for a node whose newest record
//! stopped changing) and runs one pass of the cluster's `SweepMachine` (the
//! one the simulator drives) over each app deployed here and each of their
//! tenants' tenant-wide (legacy) index. The machine
//! reads the entries overdue by the sweep margin (a lease period plus
//! grace), at most `sweep_entries_max` (2,048) per index and pass, resuming
//! after the last one next time; it picks at most `sweep_deliveries_max`
//! (256) of them for this node: its own shard first, an eighth for entries
//! overdue long enough to be anyone's; it hands them out at most
//! `SWEEP_DELIVERIES_CONCURRENT` (32) at a time, and leaves each delivered
//! entry alone for a while (longer after each failure in a row). A pass
//! whose cap left eligible entries behind and whose deliveries got somewhere
//! is followed by the next one at once, so a dead node's backlog drains as
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
use wasmkeep_cluster::Rules;
use wasmkeep_cluster::alarm_index::{
    self, Address, IndexKey, Indexed, Layout, app_index_prefix, tenant_index_prefix,
};
use wasmkeep_cluster::machine::{
    BucketOp, BucketResult, DeliveryReport, LiveNodes, LiveNodesEffect, Reached, SweepEffect,
    SweepJob, SweepMachine,
};
use wasmkeep_runtime::index::Delivered;
use wasmkeep_runtime::metrics::{self, GaugeU64};
use wasmkeep_runtime::{ActorId, Runtime};

use super::ownership::Route;
use super::{ClusterState, now_ms};

/// Keys one listing of an actor's tagged entries at one time reads.
pub use wasmkeep_cluster::machine::STALE_LISTING_KEYS_MAX;

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

/// Runs the sweep until `stop`.
pub(super) async fn run(
    state: Arc<ClusterState>,
    rt: Runtime,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let config = state.settings().protocol.clone();
    let every = std::time::Duration::from_millis(config.alarm_sweep_ms.max(1));
    let mut machine = SweepMachine::new(state.node(), config.clone());
    let mut view =
        LiveNodes::new(state.node(), config).with_known_leases(state.ownership.known_leases());
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
        let started = wasmkeep_runtime::clock::instant();
        if pass(&state, &rt, &mut machine, &mut view).await {
            // The cap bound and deliveries got somewhere: more is overdue;
            // sweep again at once.
            wait = std::time::Duration::ZERO;
        } else {
            // A sweep period from this pass's start (a pass waits for its
            // deliveries): an orphaned alarm waits at most the sweep margin
            // plus one period, as the simulator measures.
            wait = every.saturating_sub(started.elapsed());
        }
    }
}

/// The live nodes through the cluster's `LiveNodes` (the simulator drives
/// the same): one listing of `nodes/` a pass, and a lease record read only
/// for a node whose newest record stopped changing, so that the view costs
/// a node the same at 3 nodes or 100 (issue 41). `None` if the listing
/// failed.
async fn live_nodes(state: &ClusterState, view: &mut LiveNodes) -> Option<Vec<String>> {
    view.start_pass(now_ms());
    loop {
        match view.poll_effect()? {
            LiveNodesEffect::Bucket(op) => {
                let result = state.driver.perform(op).await;
                view.on_result(result);
            }
            LiveNodesEffect::Detached(op) => {
                // Garbage of this node's earlier epochs: nothing waits on it.
                let driver = state.driver.clone();
                tokio::spawn(async move { driver.perform(op).await });
            }
            LiveNodesEffect::Done(live) => return live,
        }
    }
}

/// One pass over every index, driven through the cluster's `SweepMachine`
/// (the simulator drives the same one); whether to sweep again at once.
async fn pass(
    state: &Arc<ClusterState>,
    rt: &Runtime,
    machine: &mut SweepMachine,
    view: &mut LiveNodes,
) -> bool {
    let counters = &state.sweep;
    counters.passes_total.inc();
    let Some(live) = live_nodes(state, view).await else {
        return false;
    };
    state.set_live(&live);
    let mut indexes: BTreeSet<Index> = BTreeSet::new();
    for a in rt.apps() {
        indexes.insert(Index {
            tenant: a.tenant.clone(),
            app: None,
        });
        indexes.insert(Index {
            tenant: a.tenant,
            app: Some(a.app),
        });
    }
    let indexes: Vec<Index> = indexes.into_iter().collect();
    let held = held_by_index(state, &indexes);
    let now = now_ms();
    machine.start_pass(
        now,
        live,
        indexes.iter().map(Index::prefix).collect(),
        held,
        super::nonce(),
    );
    // Deliveries run a bounded number at a time (the machine hands out at
    // most `SWEEP_DELIVERIES_CONCURRENT` before it waits for one to end).
    let mut running = tokio::task::JoinSet::new();
    // Each running delivery's job, by task: a delivery that panics is
    // reported as failed (it backs off like any failure) and the pass goes on.
    let mut jobs: HashMap<tokio::task::Id, SweepJob> = HashMap::new();
    let summary = loop {
        match machine.poll_effect() {
            Some(SweepEffect::Bucket(op)) => {
                let result = state.driver.perform(op).await;
                machine.on_result(result);
            }
            Some(SweepEffect::Deliver(job)) => {
                let index = indexes[job.index].clone();
                let key = job.key.clone();
                let (state, rt) = (Arc::clone(state), rt.clone());
                let task = running.spawn(async move { deliver(&state, &rt, &index, &key).await });
                jobs.insert(task.id(), job);
            }
            Some(SweepEffect::Done(summary)) => break summary,
            None => {
                let (id, report) = match running.join_next_with_id().await {
                    Some(Ok((id, report))) => (id, report),
                    Some(Err(e)) => {
                        tracing::error!(error = %e, "sweep: a delivery task failed");
                        counters.delivery_failures_total.inc();
                        let mut failed = DeliveryReport::default();
                        failed.add(Reached::Failed);
                        (e.id(), failed)
                    }
                    None => unreachable!("the sweep machine waits on no delivery"),
                };
                let job = jobs.remove(&id).expect("every delivery task has its job");
                machine.on_delivered(&job, &report, now_ms());
            }
        }
    };
    counters.entries_read_total.inc_by(summary.entries_read);
    counters
        .lag_ms
        .set(summary.oldest_due_ms.map_or(0, |o| now.saturating_sub(o)));
    summary.again_now
}

/// The actors this node holds or may hold (`Ownership::sweep_own_ids`), by
/// index (an app's, and its tenant's tenant-wide one, whose entries are
/// delivered to every app of the tenant with the class): their entries are this node's whatever their shard, so
/// that an alarm whose timer this node lost (a failed upload, a failed
/// open, an alarm gate's failed take) or whose hold it does not know it
/// has (a take whose answer was lost, a release that failed) is delivered
/// by its own sweep: the bounded helpers (ADR 0073) would reach it only
/// at the last resort.
fn held_by_index(state: &ClusterState, indexes: &[Index]) -> Vec<BTreeSet<Address>> {
    let mut held = vec![BTreeSet::new(); indexes.len()];
    let Some(epoch) = state.route_epoch() else {
        return held;
    };
    let position: HashMap<(&str, Option<&str>), usize> = indexes
        .iter()
        .enumerate()
        .map(|(i, x)| ((x.tenant.as_str(), x.app.as_deref()), i))
        .collect();
    for id in state.ownership.sweep_own_ids(epoch) {
        let Ok(address) = Address::new(id.class.as_str(), id.name.as_str()) else {
            continue;
        };
        for app in [Some(id.app.as_str()), None] {
            if let Some(&i) = position.get(&(id.tenant.as_str(), app)) {
                held[i].insert(address.clone());
            }
        }
    }
    held
}

/// Delivers one entry to each actor it may be for and reports what came of it.
async fn deliver(
    state: &Arc<ClusterState>,
    rt: &Runtime,
    index: &Index,
    key: &IndexKey,
) -> DeliveryReport {
    let counters = &state.sweep;
    let apps: Vec<String> = match &index.app {
        Some(app) => vec![app.clone()],
        None => rt
            .apps()
            .into_iter()
            .filter(|a| {
                a.tenant == index.tenant && a.classes.iter().any(|c| c == key.address.class())
            })
            .map(|a| a.app)
            .collect(),
    };
    let mut report = DeliveryReport::default();
    let mut removable: Vec<(Option<Indexed>, u64)> = Vec::new();
    for app in apps {
        let Ok(id) = ActorId::new(&index.tenant, &app, key.address.class(), key.address.name())
        else {
            report.add(Reached::Unaddressable);
            continue;
        };
        counters.deliveries_total.inc();
        let remove_here = index.layout() == Layout::App;
        let reached = match deliver_to(state, rt, &id, key.entry.at_ms, remove_here).await {
            Outcome::Found(Delivered::Remove { named, generation }) => {
                removable.push((named, generation));
                Reached::Removable
            }
            Outcome::Found(Delivered::Cleaned { removed }) => {
                counters.stale_removed_total.inc_by(removed);
                Reached::Cleaned { removed }
            }
            Outcome::Found(Delivered::Ran) => {
                counters.alarms_run_total.inc();
                Reached::Ran
            }
            Outcome::Found(Delivered::NotDue) => Reached::NotDue,
            Outcome::Found(Delivered::Fenced) => Reached::Fenced,
            Outcome::Found(Delivered::Leave { retry_at_ms }) => Reached::Leave { retry_at_ms },
            Outcome::NotOwner => {
                counters.not_owner_total.inc();
                Reached::NotOwner
            }
            Outcome::Failed => {
                counters.delivery_failures_total.inc();
                Reached::Failed
            }
        };
        report.add(reached);
    }
    if report.all_removable() {
        report.add_removed(remove_stale(state, index, key, &removable).await);
    }
    report
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
    if state.class_closed(id) {
        // A class migration moves it (ADR 0071): its entry is delivered
        // at the new address once the migration is done.
        return Outcome::Failed;
    }
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
    let mut found = rt.alarms().deliver(id, at_ms, remove_here).await;
    if matches!(found, Ok(Delivered::Fenced)) {
        found = rt.alarms().deliver(id, at_ms, remove_here).await;
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
    index: &Index,
    key: &IndexKey,
    removable: &[(Option<Indexed>, u64)],
) -> u64 {
    let layout = index.layout();
    let prefix = index.prefix();
    let at = key.entry.at_ms;
    let folder = format!("{prefix}{}", alarm_index::tagged_folder(at, &key.address));
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
            &key.address,
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
