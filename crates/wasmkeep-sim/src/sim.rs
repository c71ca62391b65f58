//! One simulated run: the cluster, its workload, its faults, and the checks.

use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;

use wasmkeep_cluster::{Address, ClusterConfig, Entry, IndexKey, Variant, alarm_index};

use crate::cost::Cost;
use crate::node::{self, ActorState, Cause, ClientOp, Ctx, Durable, JoinData, Mem, Work, log_key};
use crate::rng::Rng;
use crate::world::{Ev, Executor, Node, World};

/// The tenant every simulated app belongs to.
pub const TENANT: &str = "t1";

/// What a run does. Every field has a default; the seed picks the rest.
#[derive(Clone, Debug)]
pub struct Options {
    /// The seed.
    pub seed: u64,
    /// The rules the nodes follow.
    pub variant: Variant,
    /// Keep every trace line (for `--trace` and the determinism test).
    pub trace: bool,
    /// Nodes in the cluster from the start.
    pub nodes: usize,
    /// Apps of the tenant. Every app has the same class and actor names
    /// (`room/a0`, `room/a1`, ...), each app its own index.
    pub apps: usize,
    /// Actors in the bucket from the start, over all apps (split evenly,
    /// the same names in every app; clients reach these and the joining
    /// nodes' actors, not the backlog). Above [`SPARSE_ACTORS_FROM`] the
    /// run is sparse ([`Options::sparse`]).
    pub actors: usize,
    /// Workers per node: pieces of work a node runs at once (one per actor
    /// at a time). `None`: 1, or [`SPARSE_WORKERS`] in a sparse run.
    pub workers: Option<usize>,
    /// Client requests: each node its own stream, one request every this
    /// many ms on average (the load per node stays the same at any size),
    /// instead of one stream for the whole cluster every `client_every_ms`.
    /// `None`: not so, or [`SPARSE_CLIENT_PER_NODE_MS`] in a sparse run.
    pub client_per_node_ms: Option<u64>,
    /// The sweep reads every node's lease record on every pass, as before
    /// issue 41 (`wasmkeep_cluster::machine::LiveNodes` reads only the
    /// records that stopped changing): kept to show its cost grows with the
    /// cluster.
    pub view_reads_every_node: bool,
    /// Every take of a held actor reads the holder's lease, as before issue
    /// 41 (`wasmkeep_cluster::machine::KnownLeases` keeps the live records
    /// read): kept to show what owner lookups cost without it.
    pub take_reads_every_lease: bool,
    /// A node's sweep leaves the entries of actors it holds to their shard
    /// node and its helpers, as before issue 41's bounded helpers (the
    /// server counts them as the holder's own): kept to show that an alarm
    /// whose live owner lost its claim then waits for the last resort.
    pub sweep_ignores_holds: bool,
    /// All apps list their entries under the tenant-wide prefix
    /// (`alarm_index::tenant_index_prefix`, `alarms/t1/`, the layout before
    /// ADR 0022) instead of their own (`alarm_index::app_index_prefix`,
    /// below the app's root): apps with the same names then share entries. Only for the test that shows the app-isolation invariant
    /// catches it.
    pub shared_index: bool,
    /// Idle actors whose alarm is already overdue at the start, in each app
    /// (a dead node's actors, no hold): what makes the sweep's caps bind.
    /// `None`: the seed picks ([`Profile`]).
    pub backlog: Option<usize>,
    /// Entries nobody can act on, in each app's index: of a class no node
    /// serves (`gone`), due at time 0, so they sort ahead of every live
    /// entry and stay (ADR 0009: sweeps step past them). More than a pass's
    /// worth means only the sweep's cursor gets past them. `None`: the seed
    /// picks.
    pub orphans: Option<usize>,
    /// How long after it landed an index entry may still be missing from
    /// listings. `None`: the seed picks.
    pub list_lag_ms: Option<u64>,
    /// Keys in one page of a listing (`list_page_keys_max`). `None`: the
    /// seed picks.
    pub page_keys: Option<usize>,
    /// `sweep_entries_max`. `None`: the seed picks (the default, 2,048, or a
    /// small cap in seeds with a small backlog).
    pub sweep_entries_max: Option<usize>,
    /// `sweep_deliveries_max`. `None`: the seed picks (the default, 256, or a
    /// small cap).
    pub sweep_deliveries_max: Option<usize>,
    /// Simulated time with faults and client requests.
    pub fault_ms: u64,
    /// Simulated time after faults stop, for every committed alarm to fire.
    pub quiet_ms: u64,
    /// How often the named-entry invariant is checked.
    pub check_every_ms: u64,
    /// A client gives up on a request after this long.
    pub request_deadline_ms: u64,
    /// A request fails without effect.
    pub p_error: f64,
    /// A request takes effect but its response is lost.
    pub p_lost_response: f64,
    /// A request lands late (2 to 40 s).
    pub p_late: f64,
    /// A delete lands late (5 to 60 s), usually after its client timed out.
    pub p_delete_late: f64,
    /// A node crashes at a step boundary.
    pub p_step_crash: f64,
    /// Aimed fault: a joining node's first upload lands 40 to 90 s late and
    /// the node is cut off for 30 to 60 s right after sending it.
    pub p_aim_join: f64,
    /// Aimed fault: an owner's upload lands 20 to 60 s late and the owner is
    /// cut off for 20 to 45 s right after sending it.
    pub p_aim_upload: f64,
    /// Aimed fault: an upload that names a new entry whose time has come
    /// lands 30 to 75 s late and the owner is cut off for 20 to 45 s right
    /// after sending it: the entry comes up in a sweep elsewhere while the
    /// state naming it is still on its way (the race `owner_fence` closes).
    pub p_aim_new_entry: f64,
    /// Aimed fault: an owner stalls 12 to 40 s between its lease check and
    /// its listing of stale entries.
    pub p_aim_pause: f64,
    /// Aimed workload, with each aimed pause: clients ask other nodes to
    /// re-arm the stalled owner's stale time exactly, timed to commit just
    /// before the owner resumes (a newer owner's entry at that time).
    pub p_aim_rearm: f64,
    /// `on-alarm` fails.
    pub p_handler_fail: f64,
    /// A client request deletes the actor (its state becomes a tombstone).
    pub p_delete: f64,
    /// A successful `on-alarm` deletes its actor.
    pub p_alarm_delete: f64,
    /// Mean time between crashes of one node.
    pub crash_every_ms: u64,
    /// Mean time between cut-offs of one node.
    pub cut_every_ms: u64,
    /// Mean time between stalls of one node.
    pub stall_every_ms: u64,
    /// Mean time between clean leaves of one node (0: never): it releases
    /// every actor it holds, then its lease, stops, and starts again a
    /// little later in a new epoch, as `wasmkeep drain` and a stop do.
    pub leave_every_ms: u64,
    /// Mean time between clock faults of one node (its clock falls 6 to 15 s
    /// behind for 20 to 60 s: it keeps acting after others took over).
    pub skew_every_ms: u64,
    /// Mean time between client requests.
    pub client_every_ms: u64,
    /// An actor idle this long is released.
    pub idle_ms: u64,
    /// Alarm times are on this grid, so that owners return to times that old
    /// entries still occupy.
    pub slot_ms: u64,
    /// Fixed deadlines of an actor are this far apart ([`ClientOp::SetDeadline`]).
    pub deadline_ms: u64,
    /// A handler runs this long (lowest, highest).
    pub handler_ms: (u64, u64),
}

impl Default for Options {
    fn default() -> Self {
        Options {
            seed: 0,
            variant: Variant::Safe,
            trace: false,
            nodes: 3,
            apps: 2,
            actors: 6,
            workers: None,
            client_per_node_ms: None,
            view_reads_every_node: false,
            take_reads_every_lease: false,
            sweep_ignores_holds: false,
            shared_index: false,
            backlog: None,
            orphans: None,
            list_lag_ms: None,
            page_keys: None,
            sweep_entries_max: None,
            sweep_deliveries_max: None,
            fault_ms: 240_000,
            quiet_ms: 600_000,
            check_every_ms: 50,
            request_deadline_ms: 5_000,
            p_error: 0.01,
            p_lost_response: 0.01,
            p_late: 0.03,
            p_delete_late: 0.15,
            p_step_crash: 0.01,
            p_aim_join: 0.5,
            p_aim_upload: 0.03,
            p_aim_new_entry: 0.1,
            p_aim_pause: 0.4,
            p_aim_rearm: 1.0,
            p_handler_fail: 0.2,
            p_delete: 0.05,
            p_alarm_delete: 0.1,
            crash_every_ms: 90_000,
            cut_every_ms: 90_000,
            stall_every_ms: 120_000,
            leave_every_ms: 150_000,
            skew_every_ms: 150_000,
            client_every_ms: 800,
            idle_ms: 20_000,
            slot_ms: 5_000,
            deadline_ms: 20_000,
            handler_ms: (1, 3_000),
        }
    }
}

impl Options {
    /// Sets one knob by name (`--set name=value` on the command line).
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let bad = || format!("bad value: knob={name} value={value}");
        let f = |v: &str| v.parse::<f64>().map_err(|_| bad());
        let u = |v: &str| v.parse::<u64>().map_err(|_| bad());
        match name {
            "nodes" => self.nodes = u(value)? as usize,
            "apps" => self.apps = (u(value)? as usize).max(1),
            "actors" => self.actors = u(value)? as usize,
            "workers" => self.workers = Some((u(value)? as usize).max(1)),
            "client_per_node_ms" => self.client_per_node_ms = Some(u(value)?.max(1)),
            "view_reads_every_node" => self.view_reads_every_node = u(value)? != 0,
            "take_reads_every_lease" => self.take_reads_every_lease = u(value)? != 0,
            "sweep_ignores_holds" => self.sweep_ignores_holds = u(value)? != 0,
            "shared_index" => self.shared_index = u(value)? != 0,
            "backlog" => self.backlog = Some(u(value)? as usize),
            "orphans" => self.orphans = Some(u(value)? as usize),
            "list_lag_ms" => self.list_lag_ms = Some(u(value)?),
            "page_keys" => self.page_keys = Some((u(value)? as usize).max(1)),
            "sweep_entries_max" => self.sweep_entries_max = Some((u(value)? as usize).max(1)),
            "sweep_deliveries_max" => self.sweep_deliveries_max = Some((u(value)? as usize).max(1)),
            "p_delete" => self.p_delete = f(value)?,
            "p_alarm_delete" => self.p_alarm_delete = f(value)?,
            "handler_ms_min" => self.handler_ms.0 = u(value)?,
            "fault_ms" => self.fault_ms = u(value)?,
            "quiet_ms" => self.quiet_ms = u(value)?,
            "p_error" => self.p_error = f(value)?,
            "p_lost_response" => self.p_lost_response = f(value)?,
            "p_late" => self.p_late = f(value)?,
            "p_delete_late" => self.p_delete_late = f(value)?,
            "p_step_crash" => self.p_step_crash = f(value)?,
            "p_aim_join" => self.p_aim_join = f(value)?,
            "p_aim_upload" => self.p_aim_upload = f(value)?,
            "p_aim_new_entry" => self.p_aim_new_entry = f(value)?,
            "p_aim_pause" => self.p_aim_pause = f(value)?,
            "p_aim_rearm" => self.p_aim_rearm = f(value)?,
            "p_handler_fail" => self.p_handler_fail = f(value)?,
            "crash_every_ms" => self.crash_every_ms = u(value)?,
            "cut_every_ms" => self.cut_every_ms = u(value)?,
            "stall_every_ms" => self.stall_every_ms = u(value)?,
            "leave_every_ms" => self.leave_every_ms = u(value)?,
            "skew_every_ms" => self.skew_every_ms = u(value)?,
            "client_every_ms" => self.client_every_ms = u(value)?,
            "idle_ms" => self.idle_ms = u(value)?,
            "slot_ms" => self.slot_ms = u(value)?,
            "deadline_ms" => self.deadline_ms = u(value)?,
            "handler_ms_max" => self.handler_ms.1 = u(value)?,
            _ => return Err(format!("unknown knob: knob={name}")),
        }
        if self.handler_ms.0 > self.handler_ms.1 {
            return Err(format!("handler_ms_min above handler_ms_max: {value}"));
        }
        Ok(())
    }
}

/// Above this many actors a run is sparse: most actors idle in the bucket,
/// [`SPARSE_ALARM_SHARE`] of them with an alarm spread over the run, clients
/// at a rate per node, and [`SPARSE_WORKERS`] workers per node.
pub const SPARSE_ACTORS_FROM: usize = 1_000;
/// The share of a sparse run's actors with an alarm at the start.
pub const SPARSE_ALARM_SHARE: f64 = 0.02;
/// Workers per node in a sparse run (the server delivers 32 alarms at once
/// and runs as many actors as requests come).
pub const SPARSE_WORKERS: usize = 16;
/// A sparse run's client requests: one per node every this many ms.
pub const SPARSE_CLIENT_PER_NODE_MS: u64 = 500;

impl Options {
    /// Whether the run is sparse (more than [`SPARSE_ACTORS_FROM`] actors).
    pub fn sparse(&self) -> bool {
        self.actors > SPARSE_ACTORS_FROM
    }

    /// Workers per node.
    pub fn workers(&self) -> usize {
        self.workers
            .unwrap_or(if self.sparse() { SPARSE_WORKERS } else { 1 })
    }

    /// The mean time between two client requests to one node, when the
    /// load is per node (sparse runs, or `client_per_node_ms`); `None`: one
    /// stream of requests for the whole cluster every `client_every_ms`.
    pub fn client_per_node(&self) -> Option<u64> {
        self.client_per_node_ms
            .or(self.sparse().then_some(SPARSE_CLIENT_PER_NODE_MS))
    }
}

/// What a seed picks where [`Options`] leaves it open. Drawn from a generator
/// of its own, so that fixing one of these (`--set`) leaves the others and
/// the run's other draws as the seed had them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Profile {
    /// Listing lag: none in a third of the seeds, else 0.1 to 3 s.
    pub list_lag_ms: u64,
    /// Keys per listing page: S3's 1,000 in half the seeds, 100 in a
    /// quarter, 10 to 40 in the rest.
    pub page_keys: usize,
    /// Overdue idle actors per app at the start: 60 to 160 in a quarter of
    /// the seeds (with small caps), else 0 to 8.
    pub backlog: usize,
    /// Entries of a class no node serves, per app: in the seeds with small
    /// caps, a pass's worth and a few more (the seed's `sweep_entries_max`
    /// plus 1 to `sweep_deliveries_max` - 1, so that the pass after them
    /// still has room for live entries), else 0 to 3.
    pub orphans: usize,
    /// `sweep_entries_max`: 16 to 48 in the seeds with a large backlog, else
    /// the default.
    pub sweep_entries_max: usize,
    /// `sweep_deliveries_max`: 4 to 12 in the seeds with a large backlog,
    /// else the default.
    pub sweep_deliveries_max: usize,
}

impl Profile {
    /// The seed's picks, with the options' fixed values in their place.
    pub fn of(opts: &Options) -> Profile {
        let mut r = Rng::new(opts.seed ^ 0x7072_6f66_696c_6573);
        let lag = if r.chance(1.0 / 3.0) {
            0
        } else {
            r.range(100, 3_000)
        };
        let page = match r.range(0, 3) {
            0 | 1 => 1_000,
            2 => 100,
            _ => r.range(10, 40) as usize,
        };
        let defaults = ClusterConfig::default();
        let small = r.chance(0.25);
        let (backlog, entries, deliveries) = if small {
            (
                r.range(60, 160) as usize,
                r.range(16, 48) as usize,
                r.range(4, 12) as usize,
            )
        } else {
            (
                r.range(0, 8) as usize,
                defaults.sweep_entries_max,
                defaults.sweep_deliveries_max,
            )
        };
        let orphans = if small {
            entries + r.range(1, deliveries as u64 - 1) as usize
        } else {
            r.range(0, 3) as usize
        };
        Profile {
            list_lag_ms: opts.list_lag_ms.unwrap_or(lag),
            page_keys: opts.page_keys.unwrap_or(page),
            backlog: opts.backlog.unwrap_or(backlog),
            orphans: opts.orphans.unwrap_or(orphans),
            sweep_entries_max: opts.sweep_entries_max.unwrap_or(entries),
            sweep_deliveries_max: opts.sweep_deliveries_max.unwrap_or(deliveries),
        }
    }

    /// The protocol configuration of a run with this profile.
    pub fn config(&self) -> ClusterConfig {
        ClusterConfig {
            list_page_keys_max: self.page_keys,
            sweep_entries_max: self.sweep_entries_max,
            sweep_deliveries_max: self.sweep_deliveries_max,
            ..ClusterConfig::default()
        }
    }
}

/// Counters of one run (or of many, added up).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub requests: u64,
    pub client_events: u64,
    pub takes: u64,
    pub takeovers: u64,
    pub node_fences: u64,
    pub fenced_nodes: u64,
    pub owner_fences: u64,
    pub releases: u64,
    pub give_ups: u64,
    pub late_commit_conflicts: u64,
    pub alarm_runs: u64,
    pub alarm_failures: u64,
    pub alarms: u64,
    pub stale_deleted: u64,
    pub left_on_empty_bucket: u64,
    pub sweeps: u64,
    pub sweep_offers: u64,
    pub crashes: u64,
    /// Nodes that left cleanly (released their actors and lease).
    pub leaves: u64,
    pub step_crashes: u64,
    pub cut_offs: u64,
    pub stalls: u64,
    pub aimed_pauses: u64,
    pub aimed_rearms: u64,
    pub aimed_join_faults: u64,
    pub aimed_upload_faults: u64,
    /// Aimed faults on uploads that name a new entry already due.
    pub aimed_new_entry_faults: u64,
    pub joins: u64,
    pub set_aside: u64,
    pub epochs: u64,
    pub checks: u64,
    pub clock_faults: u64,
    pub newer_entries_listed: u64,
    pub late_uploads_landed: u64,
    pub late_deletes_landed: u64,
    /// Actors deleted (replicated tombstones), by clients or by `on-alarm`.
    pub deletes: u64,
    /// Of those, by their own `on-alarm`.
    pub alarm_deletes: u64,
    /// Deleted actors a client request created again.
    pub recreated: u64,
    /// Entries delivered for an actor with no state: nothing ran.
    pub no_state_deliveries: u64,
    /// Overdue idle actors at the start.
    pub backlog_actors: u64,
    /// Entries of a class no node serves at the start.
    pub orphan_entries: u64,
    /// Sweep passes (one per app's index per sweep).
    pub sweep_passes: u64,
    /// Listing pages those passes read.
    pub sweep_pages: u64,
    /// Passes that read `sweep_entries_max` entries (the next resumes after).
    pub entries_cap_bound: u64,
    /// Passes where `sweep_deliveries_max` left eligible entries undelivered.
    pub deliveries_cap_bound: u64,
    /// Index entries a listing did not show because of the listing lag.
    pub listing_missed: u64,
    /// Listings of a later page (with `start_after`), of any prefix.
    pub continued_listings: u64,
    /// Seeds with a listing lag.
    pub lagged_seeds: u64,
    /// Seeds with pages smaller than S3's 1,000 keys.
    pub small_page_seeds: u64,
    /// Seeds with caps below the defaults.
    pub small_cap_seeds: u64,
}

impl Stats {
    /// Adds another run's counters.
    pub fn add(&mut self, o: &Stats) {
        macro_rules! add { ($($f:ident),*) => { $( self.$f += o.$f; )* } }
        add!(
            requests,
            client_events,
            takes,
            takeovers,
            node_fences,
            fenced_nodes,
            owner_fences,
            releases,
            give_ups,
            late_commit_conflicts,
            alarm_runs,
            alarm_failures,
            alarms,
            stale_deleted,
            left_on_empty_bucket,
            sweeps,
            sweep_offers,
            crashes,
            leaves,
            step_crashes,
            cut_offs,
            stalls,
            aimed_pauses,
            aimed_rearms,
            aimed_join_faults,
            aimed_upload_faults,
            aimed_new_entry_faults,
            joins,
            set_aside,
            epochs,
            checks,
            clock_faults,
            newer_entries_listed,
            late_uploads_landed,
            late_deletes_landed,
            deletes,
            alarm_deletes,
            recreated,
            no_state_deliveries,
            backlog_actors,
            orphan_entries,
            sweep_passes,
            sweep_pages,
            entries_cap_bound,
            deliveries_cap_bound,
            listing_missed,
            continued_listings,
            lagged_seeds,
            small_page_seeds,
            small_cap_seeds
        );
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "takeovers={} takes={} alarms={} alarm_runs={} alarm_failures={} client_events={} node_fences={} \
             fenced_nodes={} owner_fences={} releases={} give_ups={} late_commit_conflicts={} stale_deleted={} \
             left_on_empty_bucket={} joins={} set_aside={} crashes={} leaves={} step_crashes={} cut_offs={} stalls={} \
             aimed_pauses={} aimed_rearms={} aimed_join_faults={} aimed_upload_faults={} aimed_new_entry_faults={} clock_faults={} newer_entries_listed={} late_uploads_landed={} late_deletes_landed={} \
             sweeps={} sweep_offers={} requests={} checks={} deletes={} alarm_deletes={} recreated={} \
             no_state_deliveries={} backlog_actors={} orphan_entries={} sweep_passes={} sweep_pages={} entries_cap_bound={} \
             deliveries_cap_bound={} listing_missed={} continued_listings={} lagged_seeds={} small_page_seeds={} small_cap_seeds={}",
            self.takeovers,
            self.takes,
            self.alarms,
            self.alarm_runs,
            self.alarm_failures,
            self.client_events,
            self.node_fences,
            self.fenced_nodes,
            self.owner_fences,
            self.releases,
            self.give_ups,
            self.late_commit_conflicts,
            self.stale_deleted,
            self.left_on_empty_bucket,
            self.joins,
            self.set_aside,
            self.crashes,
            self.leaves,
            self.step_crashes,
            self.cut_offs,
            self.stalls,
            self.aimed_pauses,
            self.aimed_rearms,
            self.aimed_join_faults,
            self.aimed_upload_faults,
            self.aimed_new_entry_faults,
            self.clock_faults,
            self.newer_entries_listed,
            self.late_uploads_landed,
            self.late_deletes_landed,
            self.sweeps,
            self.sweep_offers,
            self.requests,
            self.checks,
            self.deletes,
            self.alarm_deletes,
            self.recreated,
            self.no_state_deliveries,
            self.backlog_actors,
            self.orphan_entries,
            self.sweep_passes,
            self.sweep_pages,
            self.entries_cap_bound,
            self.deliveries_cap_bound,
            self.listing_missed,
            self.continued_listings,
            self.lagged_seeds,
            self.small_page_seeds,
            self.small_cap_seeds
        )
    }
}

/// A broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// When.
    pub time_ms: u64,
    /// Which invariant: `missing-entry`, `early-delivery`, `undelivered`,
    /// `entry-left`, `deleted-actor-ran`, `created-by-alarm`,
    /// `cross-app-alarm` or `cross-app-delete`.
    pub kind: &'static str,
    /// What was seen.
    pub detail: String,
}

/// An app of the tenant.
#[derive(Clone, Debug)]
pub struct AppInfo {
    /// Its name.
    pub name: String,
    /// Where its alarm index lives: below the app's root
    /// (`alarm_index::app_index_prefix`, ADR 0022), or the tenant-wide
    /// `alarms/t1/` with [`Options::shared_index`].
    pub index_prefix: String,
}

/// An actor of the run.
#[derive(Clone, Debug)]
pub struct ActorInfo {
    /// Its app (an index into the world's apps).
    pub app: usize,
    /// Its address within the app.
    pub address: Address,
    /// `<app>/<class>/<name>`, for the trace.
    pub label: String,
    /// Its folder in the bucket, `state/t1/<app>/<class>/<name hex>/`.
    pub root: String,
    /// Its app's index prefix.
    pub index_prefix: String,
    /// Where this actor's fixed deadlines start.
    pub deadline_offset_ms: u64,
    /// One of the overdue idle actors of the backlog: no client reaches it.
    pub backlog: bool,
    log_lo: String,
    log_hi: String,
}

impl ActorInfo {
    fn new(app: (usize, &AppInfo), address: Address, deadline_offset_ms: u64) -> ActorInfo {
        let root = format!("state/{TENANT}/{}/{}/", app.1.name, address.path());
        // `log/` up to `log0`: '0' is the byte after '/'.
        ActorInfo {
            app: app.0,
            label: format!("{}/{}/{}", app.1.name, address.class(), address.name()),
            log_lo: format!("{root}log/"),
            log_hi: format!("{root}log0"),
            address,
            root,
            index_prefix: app.1.index_prefix.clone(),
            deadline_offset_ms,
            backlog: false,
        }
    }
}

/// Adds an actor to the world's lists and maps.
fn add_actor(w: &mut World, info: ActorInfo) -> usize {
    let i = w.actors.len();
    w.by_root.insert(info.root.clone(), i);
    w.by_address
        .entry(info.address.clone())
        .or_default()
        .push(i);
    w.dirty.insert(i);
    w.actors.push(info);
    i
}

/// Simulator events.
#[derive(Debug)]
pub enum SimEv {
    /// Check the named-entry invariant.
    Check,
    /// Start (or restart) a node.
    Start(usize),
    /// Crash a node.
    Crash(usize),
    /// Cut a node off from the bucket.
    CutOff(usize),
    /// Stall a node's process.
    Stall(usize),
    /// A node begins to leave cleanly.
    Leave(usize),
    /// A leaving node released its lease: it stops.
    Left(usize),
    /// Set a node's clock back (or, with 0, right again).
    Skew(usize, u64),
    /// A client request, to any node that is up.
    Client,
    /// A client request to one node (the load per node).
    ClientOf(usize),
    /// An aimed client request: set `actor`'s alarm to exactly `at_ms`, on
    /// any up node but `avoid` (the stalled owner).
    Rearm {
        actor: usize,
        at_ms: u64,
        avoid: usize,
    },
    /// Faults and client requests stop.
    FaultsOff,
}

/// The result of one run.
#[derive(Clone, Debug)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// The rules.
    pub variant: Variant,
    /// What the seed picked.
    pub profile: Profile,
    /// The first broken invariant.
    pub violation: Option<Violation>,
    /// Counters.
    pub stats: Stats,
    /// FNV-1a over the whole trace.
    pub trace_hash: u64,
    /// Trace lines (hashed).
    pub trace_count: u64,
    /// The trace, when kept.
    pub trace: Vec<String>,
    /// Nodes from the start (joining nodes come on top).
    pub nodes: usize,
    /// Actors of the run (those in the bucket from the start, the backlog,
    /// the joining nodes').
    pub actors: usize,
    /// What the nodes asked of the bucket, and how late alarms ran.
    pub cost: Cost,
}

/// The latest committed state of an actor: the last entry of its chain.
pub(crate) fn committed(w: &World, a: &ActorInfo) -> Option<ActorState> {
    let (_, body) = w
        .bucket
        .range(a.log_lo.clone()..a.log_hi.clone())
        .next_back()?;
    Some(ActorState::decode(body).expect("chain bodies are the simulator's own"))
}

/// The invariant: a committed alarm's named entry exists in the bucket.
///
/// Only actors whose chain or index entries changed since the last check are
/// looked at: nothing else can change the answer for an actor, so this is the
/// same check as looking at every actor, at a cost that does not grow with a
/// backlog of idle actors.
fn check_named_entries(w: &mut World) {
    w.stats.checks += 1;
    for i in std::mem::take(&mut w.dirty) {
        let Some(state) = committed(w, &w.actors[i]) else {
            continue;
        };
        let Some(at) = state.alarm.at_ms else {
            continue;
        };
        let problem = match state.alarm.indexed {
            None => Some("no entry recorded".to_owned()),
            Some(e) if e.at_ms != at => {
                Some(format!("recorded entry at {} for alarm {at}", e.at_ms))
            }
            Some(e) => {
                let key = IndexKey {
                    address: w.actors[i].address.clone(),
                    entry: e,
                };
                let full = format!("{}{}", w.actors[i].index_prefix, key.to_key());
                (!w.bucket.contains_key(&full)).then(|| format!("entry {full} is missing"))
            }
        };
        if let Some(p) = problem {
            let label = w.actors[i].label.clone();
            w.violate(
                "missing-entry",
                format!(
                    "{label} committed alarm {at} (writer {}): {p}",
                    state.writer
                ),
            );
            return;
        }
    }
}

/// The no-state invariant, checked as each chain entry lands: an alarm of a
/// deleted actor never runs, and no alarm delivery creates an actor. A chain
/// entry written by an `on-alarm` run follows, in the chain, the state the
/// run was based on (the chain is create-only: a writer appends right after
/// what it restored or wrote). That state must have had state: a committed
/// alarm or `on-init`, not a tombstone, and not nothing at all.
pub(crate) fn on_chain_put(w: &mut World, actor: usize, seq: u64, body: &str) {
    let Some(state) = ActorState::decode(body) else {
        return;
    };
    if state.cause != Cause::Alarm {
        return;
    }
    let label = w.actors[actor].label.clone();
    if seq == 0 {
        w.violate(
            "created-by-alarm",
            format!(
                "{label}: an on-alarm run created the actor (writer {})",
                state.writer
            ),
        );
        return;
    }
    let before = format!("{}{}", w.actors[actor].root, log_key(seq - 1));
    let Some(prev) = w.bucket.get(&before).and_then(|b| ActorState::decode(b)) else {
        return;
    };
    if !prev.has_state() {
        w.violate(
            "deleted-actor-ran",
            format!(
                "{label}: an on-alarm run (writer {}) committed on top of seq {} with no state \
                 (written by {}, {:?})",
                state.writer,
                seq - 1,
                prev.writer,
                prev.cause
            ),
        );
    }
}

/// The app-isolation invariant for cleanups: a node removes an index entry
/// only for an actor of the app that wrote it.
pub(crate) fn on_index_delete(w: &mut World, key: &str, actor: Option<usize>) {
    if let Some(by) = actor {
        same_app(w, key, by, "cross-app-delete", "a cleanup for");
    }
}

/// The app-isolation invariant for deliveries: a sweep offers an entry only
/// to an actor of the app that wrote it, so each app's alarms fire for that
/// app only.
pub(crate) fn check_offer(w: &mut World, full_key: &str, actor: usize) {
    same_app(w, full_key, actor, "cross-app-alarm", "a sweep offer to");
}

/// Reports `invariant` if the entry `key` was written by an actor of
/// another app than `actor`'s (what `doing` touched it).
fn same_app(w: &mut World, key: &str, actor: usize, invariant: &'static str, doing: &str) {
    let Some(&writer) = w.index_writer.get(key) else {
        return;
    };
    if w.actors[writer].app != w.actors[actor].app {
        let detail = format!(
            "{doing} {} touches {key}, an entry of {}",
            w.actors[actor].label, w.actors[writer].label
        );
        w.violate(invariant, detail);
    }
}

/// The longest an alarm may wait past its time once faults stop.
fn delivery_bound(c: &ClusterConfig, nodes: usize) -> u64 {
    c.retry_max_ms + c.everyones_after_ms(nodes) + 2 * c.alarm_sweep_ms + 30_000
}

/// Once faults stop, every committed alarm is delivered: at the end, no
/// committed alarm is older than the longest delivery delay the ADR allows.
fn check_delivered(w: &mut World) {
    let bound = delivery_bound(&w.cfg, w.nodes.len());
    for i in 0..w.actors.len() {
        let Some(state) = committed(w, &w.actors[i]) else {
            continue;
        };
        if let Some(at) = state.alarm.at_ms
            && at + bound < w.now
        {
            let label = w.actors[i].label.clone();
            w.violate(
                "undelivered",
                format!("{label} committed alarm {at} still pending at {}", w.now),
            );
            return;
        }
    }
}

/// Once faults stop, every overdue entry is delivered, and one the state does
/// not name is then removed, however listings are paged, capped or lagging:
/// at the end no index entry is older than the delivery bound, except where
/// the ADR keeps it (an entry for an actor the bucket has nothing for, R4).
fn check_index_drained(w: &mut World) {
    let bound = delivery_bound(&w.cfg, w.nodes.len());
    let mut left = None;
    for (key, _) in w.bucket.iter() {
        let Some(app) = (0..w.apps.len()).find(|a| key.starts_with(&w.apps[*a].index_prefix))
        else {
            continue;
        };
        let Ok(k) = IndexKey::parse_full(&w.apps[app].index_prefix, key) else {
            continue;
        };
        if k.entry.at_ms + bound >= w.now {
            continue;
        }
        let prefix = &w.apps[app].index_prefix;
        let actors = w.by_address.get(&k.address).cloned().unwrap_or_default();
        if actors
            .iter()
            .any(|a| &w.actors[*a].index_prefix == prefix && w.in_bucket.contains(a))
        {
            left = Some(key.clone());
            break;
        }
    }
    if let Some(key) = left {
        let now = w.now;
        w.violate("entry-left", format!("{key} still in the index at {now}"));
    }
}

fn start_node(ex: &mut Executor, n: usize) {
    let w = ex.w.clone();
    let mut wm = w.borrow_mut();
    if wm.nodes[n].up {
        return;
    }
    let cfg = wm.cfg.clone();
    let node = &mut wm.nodes[n];
    node.durable.epoch += 1;
    node.mem = Mem::new(&node.name, node.durable.epoch, &cfg);
    node.up = true;
    // The startup scan of the data directory fills the timer.
    let cached: Vec<(usize, u64)> = node
        .durable
        .cache
        .iter()
        .filter_map(|(a, t)| t.map(|t| (*a, t)))
        .collect();
    node.mem.timer.extend(cached);
    let joins: Vec<usize> = node.durable.joins.keys().copied().collect();
    let epoch = node.durable.epoch;
    wm.stats.epochs += 1;
    let name = wm.nodes[n].name.clone();
    wm.log(format!("{name} starts, epoch {epoch}"));
    for actor in joins {
        wm.push_work(n, Work::Join { actor });
    }
    let ctx = Ctx { w: w.clone(), n };
    wm.spawn(n, Box::pin(node::renew_loop(ctx.clone())));
    wm.spawn(n, Box::pin(node::sweep_loop(ctx.clone())));
    wm.spawn(n, Box::pin(node::timer_loop(ctx.clone())));
    for _ in 0..wm.opts.workers() {
        wm.spawn(n, Box::pin(node::worker(ctx.clone())));
    }
}

/// Crashes a node: its tasks and memory are gone; its requests in flight
/// still land; it restarts a little later with a new epoch.
pub fn crash_node(ex: &mut Executor, n: usize) {
    stop_node(ex, n, "CRASH");
}

/// Stops a node's process (`why` goes to the trace) and plans its next
/// start; true if it was up.
fn stop_node(ex: &mut Executor, n: usize, why: &str) -> bool {
    ex.kill_node_tasks(n);
    let mut w = ex.w.borrow_mut();
    if !w.nodes[n].up {
        return false;
    }
    w.nodes[n].up = false;
    w.nodes[n].mem.worker_waiting.clear();
    if why == "CRASH" {
        w.stats.crashes += 1;
    }
    let name = w.nodes[n].name.clone();
    w.log(format!("{name} {why}"));
    let back = if w.faults_on {
        w.rng.range(1_000, 20_000)
    } else {
        1
    };
    let t = w.now + back;
    w.at(t, Ev::Sim(SimEv::Start(n)));
    true
}

/// While faults are on, node `n` (if up and not leaving already) begins to
/// leave cleanly (`node::leaving`), and its next leave is planned.
fn on_leave(ex: &mut Executor, n: usize) {
    let mut w = ex.w.borrow_mut();
    if !w.faults_on {
        return;
    }
    if w.nodes[n].up && w.nodes[n].mem.leaving_since.is_none() {
        let now = w.node_now(n);
        w.nodes[n].mem.leaving_since = Some(now);
        w.stats.leaves += 1;
        let name = w.nodes[n].name.clone();
        w.log(format!(
            "{name} LEAVES: releases its actors, then its lease"
        ));
    }
    let mean = w.opts.leave_every_ms;
    let t = w.now + w.leave_rng.range(mean / 2, mean * 3 / 2);
    w.at(t, Ev::Sim(SimEv::Leave(n)));
}

/// A leaving node's lease is over: its process stops (and starts again a
/// little later, a new epoch).
fn on_left(ex: &mut Executor, n: usize) {
    let leaving = ex.w.borrow().nodes[n].mem.leaving_since.is_some();
    if leaving {
        stop_node(ex, n, "LEFT");
    }
}

fn every(w: &mut World, mean: u64) -> u64 {
    w.rng.range(mean / 2, mean * 3 / 2)
}

/// Checks the named-entries invariant and plans the next check.
fn on_check(w: &mut World) {
    check_named_entries(w);
    let up = w.nodes.iter().filter(|n| n.up).count();
    let every = w.opts.check_every_ms;
    let now = w.now;
    w.cost.sample(now, up, every);
    let t = w.now + w.opts.check_every_ms;
    w.at(t, Ev::Sim(SimEv::Check));
}

/// While faults are on, crashes node `n` (if it is up) and plans its next
/// crash.
fn on_crash(ex: &mut Executor, n: usize) {
    let (on, up) = {
        let w = ex.w.borrow();
        (w.faults_on, w.nodes[n].up)
    };
    if !on {
        return;
    }
    if up {
        crash_node(ex, n);
    }
    let mut w = ex.w.borrow_mut();
    let mean = w.opts.crash_every_ms;
    let t = w.now + every(&mut w, mean);
    w.at(t, Ev::Sim(SimEv::Crash(n)));
}

/// While faults are on, cuts node `n` off from the bucket for a while and
/// plans the next cut.
fn on_cut_off(w: &mut World, n: usize) {
    if !w.faults_on {
        return;
    }
    let ms = w.rng.range(5_000, 40_000);
    w.nodes[n].cut_until = w.nodes[n].cut_until.max(w.now + ms);
    w.stats.cut_offs += 1;
    let name = w.nodes[n].name.clone();
    w.log(format!("{name} FAULT cut off from the bucket for {ms} ms"));
    let mean = w.opts.cut_every_ms;
    let t = w.now + every(w, mean);
    w.at(t, Ev::Sim(SimEv::CutOff(n)));
}

/// While faults are on, stalls node `n` for a while and plans the next stall.
fn on_stall(w: &mut World, n: usize) {
    if !w.faults_on {
        return;
    }
    let ms = w.rng.range(5_000, 30_000);
    w.nodes[n].stall_until = w.nodes[n].stall_until.max(w.now + ms);
    w.stats.stalls += 1;
    let name = w.nodes[n].name.clone();
    w.log(format!("{name} FAULT stalls for {ms} ms"));
    let mean = w.opts.stall_every_ms;
    let t = w.now + every(w, mean);
    w.at(t, Ev::Sim(SimEv::Stall(n)));
}

/// While faults are on, sets node `n`'s clock `behind` ms behind: a skew is
/// undone a little later, and once undone the next skew is planned.
fn on_skew(w: &mut World, n: usize, behind: u64) {
    if !w.faults_on {
        return;
    }
    w.nodes[n].clock_behind = behind;
    let name = w.nodes[n].name.clone();
    w.log(format!("{name} FAULT clock {behind} ms behind"));
    if behind > 0 {
        w.stats.clock_faults += 1;
        let back = w.rng.range(20_000, 60_000);
        let t = w.now + back;
        w.at(t, Ev::Sim(SimEv::Skew(n, 0)));
    } else {
        let mean = w.opts.skew_every_ms;
        let next = every(w, mean);
        let behind = w.rng.range(6_000, 15_000);
        let t = w.now + next;
        w.at(t, Ev::Sim(SimEv::Skew(n, behind)));
    }
}

/// The operation of a client request, drawn from the seed.
fn client_op(w: &mut World) -> ClientOp {
    let p_delete = w.opts.p_delete;
    if w.rng.chance(p_delete) {
        ClientOp::Delete
    } else {
        match w.rng.range(0, 19) {
            0..=4 => ClientOp::SetSlot(w.rng.range(0, 12) as i64 - 8),
            5..=9 => ClientOp::SetDeadline(w.rng.range(0, 2) as i64 - 1),
            10..=12 => ClientOp::Clear,
            _ => ClientOp::Touch,
        }
    }
}

/// The actor a client request is for: one the bucket has, not of the
/// backlog. A sparse run draws among all actors (most are in the bucket)
/// rather than list a million each time.
fn client_actor(w: &mut World) -> Option<usize> {
    if w.opts.sparse() {
        for _ in 0..8 {
            let i = w.rng.index(w.actors.len());
            if w.in_bucket.contains(&i) && !w.actors[i].backlog {
                return Some(i);
            }
        }
        return None;
    }
    let existing: Vec<usize> = w
        .in_bucket
        .iter()
        .copied()
        .filter(|i| !w.actors[*i].backlog)
        .collect();
    (!existing.is_empty()).then(|| existing[w.rng.index(existing.len())])
}

/// While faults are on, sends a client request for an actor in the bucket to
/// a node that is up, and plans the next request.
fn on_client(w: &mut World) {
    if !w.faults_on {
        return;
    }
    // Clients only reach actors the bucket has: a request for an actor
    // still only on a joining node would create it empty elsewhere (the
    // ADR's "start the node with the data first"). A deleted actor is
    // in the bucket (a tombstone): a request creates it again. The
    // backlog's idle actors get no requests.
    let up: Vec<usize> = (0..w.nodes.len()).filter(|i| serves(w, *i)).collect();
    if let Some(actor) = client_actor(w)
        && !up.is_empty()
    {
        let node = up[w.rng.index(up.len())];
        let op = client_op(w);
        w.push_work(node, Work::Client { actor, op, hops: 0 });
    }
    let mean = w.opts.client_every_ms;
    let t = w.now + every(w, mean);
    w.at(t, Ev::Sim(SimEv::Client));
}

/// Whether node `n` takes client requests: it is up and not leaving (the
/// clients' balancer sends a leaving node's share to the others, as one in
/// front of a drained node would).
fn serves(w: &World, n: usize) -> bool {
    w.nodes[n].up && w.nodes[n].mem.leaving_since.is_none()
}

/// While faults are on, a client request to node `n` if it is up (another
/// node if `n` leaves), and the next one to it (the load per node: each
/// node its own stream).
fn on_client_of(w: &mut World, n: usize) {
    let Some(mean) = w.opts.client_per_node() else {
        return;
    };
    if !w.faults_on {
        return;
    }
    let to = if w.nodes[n].up && w.nodes[n].mem.leaving_since.is_some() {
        let others: Vec<usize> = (0..w.nodes.len()).filter(|i| serves(w, *i)).collect();
        (!others.is_empty()).then(|| others[w.leave_rng.index(others.len())])
    } else {
        w.nodes[n].up.then_some(n)
    };
    if let Some(to) = to
        && let Some(actor) = client_actor(w)
    {
        let op = client_op(w);
        w.push_work(to, Work::Client { actor, op, hops: 0 });
    }
    let t = w.now + every(w, mean);
    w.at(t, Ev::Sim(SimEv::ClientOf(n)));
}

/// While faults are on, an aimed fault: a client re-arms `actor`'s alarm at
/// `at_ms` through a node that is up, other than `avoid`.
fn on_rearm(w: &mut World, actor: usize, at_ms: u64, avoid: usize) {
    if !w.faults_on {
        return;
    }
    let up: Vec<usize> = (0..w.nodes.len())
        .filter(|i| *i != avoid && serves(w, *i))
        .collect();
    if up.is_empty() {
        return;
    }
    let node = up[w.rng.index(up.len())];
    w.stats.aimed_rearms += 1;
    let name = w.nodes[node].name.clone();
    let label = w.actors[actor].label.clone();
    w.log(format!(
        "{name} FAULT aimed: client re-arms {label}@{at_ms}"
    ));
    w.push_work(
        node,
        Work::Client {
            actor,
            op: ClientOp::SetAt(at_ms),
            hops: 0,
        },
    );
}

/// Faults and client requests stop: every fault is undone and every node
/// that is down starts again.
fn on_faults_off(ex: &mut Executor) {
    let down: Vec<usize> = {
        let mut w = ex.w.borrow_mut();
        w.faults_on = false;
        let now = w.now;
        w.cost.quiet_from(now);
        w.log("faults and client requests stop");
        let now = w.now;
        for node in &mut w.nodes {
            node.cut_until = node.cut_until.min(now);
            node.stall_until = node.stall_until.min(now);
            node.aim_first_upload = None;
            node.aim_upload = None;
            node.clock_behind = 0;
        }
        (0..w.nodes.len()).filter(|i| !w.nodes[*i].up).collect()
    };
    for n in down {
        let mut w = ex.w.borrow_mut();
        let t = w.now + 1;
        w.at(t, Ev::Sim(SimEv::Start(n)));
    }
}

/// Handles one of the simulation's own events (faults, clients, checks).
fn on_sim(ex: &mut Executor, ev: SimEv) {
    match ev {
        SimEv::Check => on_check(&mut ex.w.borrow_mut()),
        SimEv::Start(n) => start_node(ex, n),
        SimEv::Crash(n) => on_crash(ex, n),
        SimEv::CutOff(n) => on_cut_off(&mut ex.w.borrow_mut(), n),
        SimEv::Stall(n) => on_stall(&mut ex.w.borrow_mut(), n),
        SimEv::Leave(n) => on_leave(ex, n),
        SimEv::Left(n) => on_left(ex, n),
        SimEv::Skew(n, behind) => on_skew(&mut ex.w.borrow_mut(), n, behind),
        SimEv::Client => on_client(&mut ex.w.borrow_mut()),
        SimEv::ClientOf(n) => on_client_of(&mut ex.w.borrow_mut(), n),
        SimEv::Rearm {
            actor,
            at_ms,
            avoid,
        } => on_rearm(&mut ex.w.borrow_mut(), actor, at_ms, avoid),
        SimEv::FaultsOff => on_faults_off(ex),
    }
}

/// Builds the cluster for `opts` and runs it to the end or the first
/// violation.
pub fn run(opts: Options) -> Report {
    let profile = Profile::of(&opts);
    let cfg = profile.config();
    cfg.validate()
        .expect("the simulator's configuration is valid");
    let mut world = World::new(opts.clone(), cfg);
    world.list_lag_ms = profile.list_lag_ms;
    setup(&mut world, &profile);
    let end = opts.fault_ms + opts.quiet_ms;
    let w = Rc::new(RefCell::new(world));
    let mut ex = Executor::new(w.clone());
    ex.run(end, on_sim);
    let mut wm = w.borrow_mut();
    if wm.violation.is_none() {
        check_delivered(&mut wm);
    }
    if wm.violation.is_none() {
        check_index_drained(&mut wm);
    }
    wm.cost.finish();
    Report {
        seed: opts.seed,
        variant: opts.variant,
        profile,
        violation: wm.violation.clone(),
        stats: wm.stats.clone(),
        trace_hash: wm.trace.hash,
        trace_count: wm.trace.count,
        trace: std::mem::take(&mut wm.trace.lines),
        nodes: opts.nodes,
        actors: wm.actors.len(),
        cost: std::mem::take(&mut wm.cost),
    }
}

/// Puts an actor's first chain entry in the bucket, and the index entry its
/// state names.
fn seed_bucket(w: &mut World, actor: usize, state: &ActorState) {
    if let Some(entry) = state.alarm.indexed {
        let a = &w.actors[actor];
        let key = IndexKey {
            address: a.address.clone(),
            entry,
        };
        let full = format!("{}{}", a.index_prefix, key.to_key());
        w.bucket.insert(full.clone(), String::new());
        w.index_writer.insert(full, actor);
    }
    let root = w.actors[actor].root.clone();
    w.bucket
        .insert(format!("{root}{}", log_key(0)), state.encode());
    w.in_bucket.insert(actor);
}

/// Counts what the seed's profile picked among the seeds that lag listings
/// or use small pages or caps.
fn count_profile(w: &mut World, profile: &Profile) {
    let defaults = ClusterConfig::default();
    w.stats.lagged_seeds = u64::from(profile.list_lag_ms > 0);
    w.stats.small_page_seeds = u64::from(profile.page_keys < defaults.list_page_keys_max);
    w.stats.small_cap_seeds = u64::from(
        profile.sweep_entries_max < defaults.sweep_entries_max
            || profile.sweep_deliveries_max < defaults.sweep_deliveries_max,
    );
}

/// Adds the nodes (down until started): `o.nodes` from the start, then the
/// `joiners` that join later.
fn add_nodes(w: &mut World, o: &Options, joiners: usize) {
    for i in 0..o.nodes + joiners {
        let name = if i < o.nodes {
            format!("n{i}")
        } else {
            format!("j{}", i - o.nodes)
        };
        w.nodes.push(Node {
            mem: Mem::new(&name, 0, &w.cfg),
            name,
            up: false,
            cut_until: 0,
            stall_until: 0,
            durable: Durable::default(),
            aim_first_upload: None,
            aim_upload: None,
            clock_behind: 0,
        });
    }
}

/// Adds the tenant's apps, each with its index prefix (the tenant's one when
/// the index is shared).
fn add_apps(w: &mut World, o: &Options) {
    for a in 0..o.apps.max(1) {
        let name = format!("app{}", a + 1);
        let index_prefix = if o.shared_index {
            alarm_index::tenant_index_prefix(TENANT)
        } else {
            alarm_index::app_index_prefix(TENANT, &name)
        };
        w.apps.push(AppInfo { name, index_prefix });
    }
}

/// Actors already in the bucket, the same names in every app, some with an
/// alarm listed under a legacy key (from before tags), some under a tagged
/// one.
fn seed_actors(w: &mut World, o: &Options) {
    let apps = w.apps.len();
    // A sparse run spreads a small share of alarms over the run, until
    // half the quiet time.
    let (share, slots) = if o.sparse() {
        (
            SPARSE_ALARM_SHARE,
            (o.fault_ms + o.quiet_ms / 2) / o.slot_ms.max(1),
        )
    } else {
        (0.7, 30)
    };
    for app in 0..apps {
        let in_app = o.actors / apps + usize::from(app < o.actors % apps);
        for i in 0..in_app {
            let address = Address::new("room", format!("a{i}")).expect("valid");
            let offset = w.rng.range(0, o.deadline_ms - 1);
            let info = ActorInfo::new((app, &w.apps[app]), address, offset);
            let actor = add_actor(w, info);
            let mut state = ActorState {
                version: 1,
                init: true,
                writer: format!("setup:{actor}"),
                ..ActorState::default()
            };
            if w.rng.chance(share) {
                let at = w.rng.range(0, slots) * o.slot_ms;
                let entry = if w.rng.chance(0.3) {
                    Entry::legacy(at)
                } else {
                    Entry::tagged(at, 0, w.rng.next_u64())
                };
                state.alarm.at_ms = Some(at);
                state.alarm.indexed = Some(entry);
            }
            seed_bucket(w, actor, &state);
        }
    }
}

/// The backlog: idle actors, again with the same names in every app, whose
/// owner is gone (no hold) and whose alarm is due within the first 20 s,
/// so that sweeps find them all overdue at once.
fn seed_backlog(w: &mut World, o: &Options, profile: &Profile) {
    for app in 0..w.apps.len() {
        for i in 0..profile.backlog {
            let address = Address::new("room", format!("b{i}")).expect("valid");
            let offset = w.rng.range(0, o.deadline_ms - 1);
            let mut info = ActorInfo::new((app, &w.apps[app]), address, offset);
            info.backlog = true;
            let actor = add_actor(w, info);
            let at = w.rng.range(0, 20_000);
            let mut state = ActorState {
                version: 1,
                init: true,
                writer: format!("setup:{actor}"),
                ..ActorState::default()
            };
            state.alarm.at_ms = Some(at);
            state.alarm.indexed = Some(Entry::tagged(at, 0, w.rng.next_u64()));
            seed_bucket(w, actor, &state);
            w.stats.backlog_actors += 1;
        }
    }
}

/// Entries nobody can act on: a class no node serves, due first (`gone`
/// sorts before `room`).
fn seed_orphans(w: &mut World, profile: &Profile) {
    for app in 0..w.apps.len() {
        for i in 0..profile.orphans {
            let address = Address::new("gone", format!("o{i}")).expect("valid");
            let at = 0;
            let key = IndexKey {
                address,
                entry: Entry::tagged(at, 0, w.rng.next_u64()),
            };
            let full = format!("{}{}", w.apps[app].index_prefix, key.to_key());
            w.bucket.insert(full, String::new());
            w.stats.orphan_entries += 1;
        }
    }
}

/// Nodes that ran on their own join later, with alarms in their own data (R4).
fn plan_joiners(w: &mut World, o: &Options, joiners: usize) {
    for j in 0..joiners {
        let n = o.nodes + j;
        let join_at = w.rng.range(20_000, o.fault_ms / 2);
        for k in 0..w.rng.range(1, 2) {
            let app = w.rng.index(w.apps.len());
            let address = Address::new("room", format!("j{j}-{k}")).expect("valid");
            let offset = w.rng.range(0, o.deadline_ms - 1);
            let actor = add_actor(w, ActorInfo::new((app, &w.apps[app]), address, offset));
            let at = (join_at + w.rng.range(0, 40_000)).saturating_sub(30_000);
            w.nodes[n]
                .durable
                .joins
                .insert(actor, JoinData { alarm: Some(at) });
        }
        w.at(join_at, Ev::Sim(SimEv::Start(n)));
    }
}

/// Plans the first events: the nodes' starts, each node's first faults, the
/// first client request, the first check and the end of faults.
fn plan_first_events(w: &mut World, o: &Options) {
    for n in 0..o.nodes {
        w.at(0, Ev::Sim(SimEv::Start(n)));
    }
    for n in 0..w.nodes.len() {
        let t = every(w, o.crash_every_ms);
        w.at(t, Ev::Sim(SimEv::Crash(n)));
        let t = every(w, o.cut_every_ms);
        w.at(t, Ev::Sim(SimEv::CutOff(n)));
        let t = every(w, o.stall_every_ms);
        w.at(t, Ev::Sim(SimEv::Stall(n)));
        if o.leave_every_ms > 0 {
            let mean = o.leave_every_ms;
            let t = w.leave_rng.range(mean / 2, mean * 3 / 2);
            w.at(t, Ev::Sim(SimEv::Leave(n)));
        }
        let t = every(w, o.skew_every_ms);
        let behind = w.rng.range(6_000, 15_000);
        w.at(t, Ev::Sim(SimEv::Skew(n, behind)));
    }
    match o.client_per_node() {
        Some(mean) => {
            for n in 0..w.nodes.len() {
                let t = 1_000 + w.rng.range(0, mean);
                w.at(t, Ev::Sim(SimEv::ClientOf(n)));
            }
        }
        None => w.at(1_000, Ev::Sim(SimEv::Client)),
    }
    w.at(o.check_every_ms, Ev::Sim(SimEv::Check));
    w.at(o.fault_ms, Ev::Sim(SimEv::FaultsOff));
}

/// Builds the seed's world: nodes, apps, the bucket's actors, backlog and
/// orphan entries, the joining nodes, and the first events.
fn setup(w: &mut World, profile: &Profile) {
    let o = w.opts.clone();
    w.log(format!("profile: {profile:?}"));
    count_profile(w, profile);
    // One or two nodes join later, and in a sparse run one in fifty more
    // (churn grows with the cluster).
    let joiners = w.rng.range(1, 2) as usize + if o.sparse() { o.nodes / 50 } else { 0 };
    add_nodes(w, &o, joiners);
    add_apps(w, &o);
    seed_actors(w, &o);
    seed_backlog(w, &o, profile);
    seed_orphans(w, profile);
    plan_joiners(w, &o, joiners);
    plan_first_events(w, &o);
}

/// The outcome of many seeds.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// Seeds run.
    pub seeds: u64,
    /// Counters added up.
    pub stats: Stats,
    /// Seeds that broke an invariant, with what they broke.
    pub failures: Vec<(u64, Violation)>,
    /// The bucket cost of the first [`BATCH_COSTS_KEPT`] seeds, with their
    /// size (nodes from the start, actors).
    pub costs: Vec<(u64, usize, usize, Cost)>,
}

/// Seeds of a batch whose bucket cost is kept for the report.
pub const BATCH_COSTS_KEPT: usize = 3;

/// Runs `count` seeds from `first`; with `stop_at_first`, stops at the first
/// violation (how a variant hunt ends).
pub fn run_seeds(base: &Options, first: u64, count: u64, stop_at_first: bool) -> Batch {
    let mut batch = Batch::default();
    for seed in first..first + count {
        let r = run(Options {
            seed,
            trace: false,
            ..base.clone()
        });
        batch.seeds += 1;
        batch.stats.add(&r.stats);
        if batch.costs.len() < BATCH_COSTS_KEPT {
            batch.costs.push((seed, r.nodes, r.actors, r.cost));
        }
        if let Some(v) = r.violation {
            batch.failures.push((seed, v));
            if stop_at_first {
                break;
            }
        }
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A world with two apps and an actor `room/a0` in each, its entries
    /// recorded as written by app1's actor.
    fn two_apps() -> (World, String) {
        let mut w = World::new(Options::default(), ClusterConfig::default());
        for name in ["app1", "app2"] {
            let index_prefix = alarm_index::app_index_prefix(TENANT, name);
            w.apps.push(AppInfo {
                name: name.to_owned(),
                index_prefix,
            });
        }
        for app in 0..2 {
            let address = Address::new("room", "a0").expect("valid");
            let info = ActorInfo::new((app, &w.apps[app]), address, 0);
            add_actor(&mut w, info);
        }
        let key = IndexKey {
            address: w.actors[0].address.clone(),
            entry: Entry::tagged(5_000, 1, 7),
        };
        let full = format!("{}{}", w.actors[0].index_prefix, key.to_key());
        w.index_writer.insert(full.clone(), 0);
        (w, full)
    }

    #[test]
    fn the_app_isolation_checks_fire_across_apps_only() {
        let (mut w, full) = two_apps();
        on_index_delete(&mut w, &full, Some(0));
        check_offer(&mut w, &full, 0);
        on_index_delete(&mut w, &full, None);
        assert_eq!(w.violation, None);
        on_index_delete(&mut w, &full, Some(1));
        assert_eq!(
            w.violation.as_ref().map(|v| v.kind),
            Some("cross-app-delete")
        );
        let (mut w, full) = two_apps();
        check_offer(&mut w, &full, 1);
        assert_eq!(
            w.violation.as_ref().map(|v| v.kind),
            Some("cross-app-alarm")
        );
    }

    #[test]
    fn an_alarm_run_on_no_state_is_caught_as_its_chain_entry_lands() {
        let (mut w, _) = two_apps();
        let root = w.actors[0].root.clone();
        let live = ActorState {
            init: true,
            ..ActorState::default()
        };
        let tombstone = ActorState {
            cause: Cause::Client,
            ..ActorState::default()
        };
        let ran = ActorState {
            init: true,
            cause: Cause::Alarm,
            ..ActorState::default()
        };
        // On top of a live state: fine; so is a client creating it again.
        w.bucket
            .insert(format!("{root}{}", log_key(0)), live.encode());
        on_chain_put(&mut w, 0, 1, &ran.encode());
        w.bucket
            .insert(format!("{root}{}", log_key(1)), tombstone.encode());
        let client = ActorState {
            cause: Cause::Client,
            ..ran.clone()
        };
        on_chain_put(&mut w, 0, 2, &client.encode());
        assert_eq!(w.violation, None);
        // On top of the tombstone: a deleted actor's alarm ran.
        on_chain_put(&mut w, 0, 2, &ran.encode());
        assert_eq!(
            w.violation.as_ref().map(|v| v.kind),
            Some("deleted-actor-ran")
        );
        // Creating the actor from nothing.
        let (mut w, _) = two_apps();
        on_chain_put(&mut w, 1, 0, &ran.encode());
        assert_eq!(
            w.violation.as_ref().map(|v| v.kind),
            Some("created-by-alarm")
        );
    }

    #[test]
    fn the_profile_keeps_fixed_options_and_varies_the_rest() {
        let fixed = Options {
            list_lag_ms: Some(0),
            page_keys: Some(7),
            ..Options::default()
        };
        let mut lags = 0;
        let mut small = 0;
        for seed in 0..200 {
            let p = Profile::of(&Options {
                seed,
                ..Options::default()
            });
            p.config().validate().expect("valid");
            lags += u64::from(p.list_lag_ms > 0);
            small += u64::from(p.sweep_deliveries_max < 256);
            let q = Profile::of(&Options {
                seed,
                ..fixed.clone()
            });
            assert_eq!((q.list_lag_ms, q.page_keys), (0, 7));
            assert_eq!(q.backlog, p.backlog);
        }
        assert!((100..170).contains(&lags), "{lags}");
        assert!((25..80).contains(&small), "{small}");
    }
}
