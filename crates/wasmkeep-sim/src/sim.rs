//! One simulated run: the cluster, its workload, its faults, and the checks.

use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;

use wasmkeep_cluster::{Address, ClusterConfig, Entry, IndexKey, Variant};

use crate::node::{self, ActorState, ClientOp, Ctx, Durable, JoinData, Mem, Work, log_key};
use crate::world::{Ev, Executor, Node, World};

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
    /// Actors in the bucket from the start.
    pub actors: usize,
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
    /// Aimed fault: an owner stalls 12 to 40 s between its lease check and
    /// its listing of stale entries.
    pub p_aim_pause: f64,
    /// Aimed workload, with each aimed pause: clients ask other nodes to
    /// re-arm the stalled owner's stale time exactly, timed to commit just
    /// before the owner resumes (a newer owner's entry at that time).
    pub p_aim_rearm: f64,
    /// `on-alarm` fails.
    pub p_handler_fail: f64,
    /// Mean time between crashes of one node.
    pub crash_every_ms: u64,
    /// Mean time between cut-offs of one node.
    pub cut_every_ms: u64,
    /// Mean time between stalls of one node.
    pub stall_every_ms: u64,
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
    /// The alarm index prefix.
    pub index_prefix: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            seed: 0,
            variant: Variant::Safe,
            trace: false,
            nodes: 3,
            actors: 5,
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
            p_aim_pause: 0.4,
            p_aim_rearm: 1.0,
            p_handler_fail: 0.2,
            crash_every_ms: 90_000,
            cut_every_ms: 90_000,
            stall_every_ms: 120_000,
            skew_every_ms: 150_000,
            client_every_ms: 800,
            idle_ms: 20_000,
            slot_ms: 5_000,
            deadline_ms: 20_000,
            handler_ms: (1, 3_000),
            index_prefix: "alarms/t1/".to_owned(),
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
            "actors" => self.actors = u(value)? as usize,
            "fault_ms" => self.fault_ms = u(value)?,
            "quiet_ms" => self.quiet_ms = u(value)?,
            "p_error" => self.p_error = f(value)?,
            "p_lost_response" => self.p_lost_response = f(value)?,
            "p_late" => self.p_late = f(value)?,
            "p_delete_late" => self.p_delete_late = f(value)?,
            "p_step_crash" => self.p_step_crash = f(value)?,
            "p_aim_join" => self.p_aim_join = f(value)?,
            "p_aim_upload" => self.p_aim_upload = f(value)?,
            "p_aim_pause" => self.p_aim_pause = f(value)?,
            "p_aim_rearm" => self.p_aim_rearm = f(value)?,
            "p_handler_fail" => self.p_handler_fail = f(value)?,
            "crash_every_ms" => self.crash_every_ms = u(value)?,
            "cut_every_ms" => self.cut_every_ms = u(value)?,
            "stall_every_ms" => self.stall_every_ms = u(value)?,
            "skew_every_ms" => self.skew_every_ms = u(value)?,
            "client_every_ms" => self.client_every_ms = u(value)?,
            "idle_ms" => self.idle_ms = u(value)?,
            "slot_ms" => self.slot_ms = u(value)?,
            "deadline_ms" => self.deadline_ms = u(value)?,
            "handler_ms_max" => self.handler_ms.1 = u(value)?,
            _ => return Err(format!("unknown knob: knob={name}")),
        }
        Ok(())
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
    pub step_crashes: u64,
    pub cut_offs: u64,
    pub stalls: u64,
    pub aimed_pauses: u64,
    pub aimed_rearms: u64,
    pub aimed_join_faults: u64,
    pub aimed_upload_faults: u64,
    pub joins: u64,
    pub set_aside: u64,
    pub epochs: u64,
    pub checks: u64,
    pub clock_faults: u64,
    pub newer_entries_listed: u64,
    pub late_uploads_landed: u64,
    pub late_deletes_landed: u64,
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
            step_crashes,
            cut_offs,
            stalls,
            aimed_pauses,
            aimed_rearms,
            aimed_join_faults,
            aimed_upload_faults,
            joins,
            set_aside,
            epochs,
            checks,
            clock_faults,
            newer_entries_listed,
            late_uploads_landed,
            late_deletes_landed
        );
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "takeovers={} takes={} alarms={} alarm_runs={} alarm_failures={} client_events={} node_fences={} \
             fenced_nodes={} owner_fences={} releases={} give_ups={} late_commit_conflicts={} stale_deleted={} \
             left_on_empty_bucket={} joins={} set_aside={} crashes={} step_crashes={} cut_offs={} stalls={} \
             aimed_pauses={} aimed_rearms={} aimed_join_faults={} aimed_upload_faults={} clock_faults={} newer_entries_listed={} late_uploads_landed={} late_deletes_landed={} \
             sweeps={} sweep_offers={} requests={} checks={}",
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
            self.step_crashes,
            self.cut_offs,
            self.stalls,
            self.aimed_pauses,
            self.aimed_rearms,
            self.aimed_join_faults,
            self.aimed_upload_faults,
            self.clock_faults,
            self.newer_entries_listed,
            self.late_uploads_landed,
            self.late_deletes_landed,
            self.sweeps,
            self.sweep_offers,
            self.requests,
            self.checks
        )
    }
}

/// A broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// When.
    pub time_ms: u64,
    /// Which invariant: `missing-entry`, `early-delivery` or `undelivered`.
    pub kind: &'static str,
    /// What was seen.
    pub detail: String,
}

/// An actor of the run.
#[derive(Clone, Debug)]
pub struct ActorInfo {
    /// Its address.
    pub address: Address,
    /// Its folder in the bucket, `state/t1/app/<class>/<name hex>/`.
    pub root: String,
    /// Where this actor's fixed deadlines start.
    pub deadline_offset_ms: u64,
    log_lo: String,
    log_hi: String,
}

impl ActorInfo {
    fn new(address: Address, deadline_offset_ms: u64) -> ActorInfo {
        let root = format!("state/t1/app/{}/", address.path());
        // `log/` up to `log0`: '0' is the byte after '/'.
        ActorInfo {
            log_lo: format!("{root}log/"),
            log_hi: format!("{root}log0"),
            address,
            root,
            deadline_offset_ms,
        }
    }
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
    /// Set a node's clock back (or, with 0, right again).
    Skew(usize, u64),
    /// A client request.
    Client,
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
}

/// The latest committed state of an actor: the last entry of its chain.
fn committed(w: &World, a: &ActorInfo) -> Option<ActorState> {
    let (_, body) = w
        .bucket
        .range(a.log_lo.clone()..a.log_hi.clone())
        .next_back()?;
    Some(ActorState::decode(body).expect("chain bodies are the simulator's own"))
}

/// The invariant: a committed alarm's named entry exists in the bucket.
fn check_named_entries(w: &mut World) {
    w.stats.checks += 1;
    for i in 0..w.actors.len() {
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
                let full = format!("{}{}", w.opts.index_prefix, key.to_key());
                (!w.bucket.contains_key(&full)).then(|| format!("entry {full} is missing"))
            }
        };
        if let Some(p) = problem {
            w.violate(
                "missing-entry",
                format!("a{i} committed alarm {at} (writer {}): {p}", state.writer),
            );
            return;
        }
    }
}

/// Once faults stop, every committed alarm is delivered: at the end, no
/// committed alarm is older than the longest delivery delay the ADR allows.
fn check_delivered(w: &mut World) {
    let c = &w.cfg;
    let bound = c.retry_max_ms + c.anyones_after_ms() + 2 * c.alarm_sweep_ms + 30_000;
    for i in 0..w.actors.len() {
        let Some(state) = committed(w, &w.actors[i]) else {
            continue;
        };
        if let Some(at) = state.alarm.at_ms
            && at + bound < w.now
        {
            w.violate(
                "undelivered",
                format!("a{i} committed alarm {at} still pending at {}", w.now),
            );
            return;
        }
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
    wm.spawn(n, Box::pin(node::worker(ctx)));
}

/// Crashes a node: its tasks and memory are gone; its requests in flight
/// still land; it restarts a little later with a new epoch.
pub fn crash_node(ex: &mut Executor, n: usize) {
    ex.kill_node_tasks(n);
    let mut w = ex.w.borrow_mut();
    if !w.nodes[n].up {
        return;
    }
    w.nodes[n].up = false;
    w.nodes[n].mem.worker_waiting = None;
    w.stats.crashes += 1;
    let name = w.nodes[n].name.clone();
    w.log(format!("{name} CRASH"));
    let back = if w.faults_on {
        w.rng.range(1_000, 20_000)
    } else {
        1
    };
    let t = w.now + back;
    w.at(t, Ev::Sim(SimEv::Start(n)));
}

fn every(w: &mut World, mean: u64) -> u64 {
    w.rng.range(mean / 2, mean * 3 / 2)
}

fn on_sim(ex: &mut Executor, ev: SimEv) {
    match ev {
        SimEv::Check => {
            let mut w = ex.w.borrow_mut();
            check_named_entries(&mut w);
            let t = w.now + w.opts.check_every_ms;
            w.at(t, Ev::Sim(SimEv::Check));
        }
        SimEv::Start(n) => start_node(ex, n),
        SimEv::Crash(n) => {
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
        SimEv::CutOff(n) => {
            let mut w = ex.w.borrow_mut();
            if !w.faults_on {
                return;
            }
            let ms = w.rng.range(5_000, 40_000);
            w.nodes[n].cut_until = w.nodes[n].cut_until.max(w.now + ms);
            w.stats.cut_offs += 1;
            let name = w.nodes[n].name.clone();
            w.log(format!("{name} FAULT cut off from the bucket for {ms} ms"));
            let mean = w.opts.cut_every_ms;
            let t = w.now + every(&mut w, mean);
            w.at(t, Ev::Sim(SimEv::CutOff(n)));
        }
        SimEv::Stall(n) => {
            let mut w = ex.w.borrow_mut();
            if !w.faults_on {
                return;
            }
            let ms = w.rng.range(5_000, 30_000);
            w.nodes[n].stall_until = w.nodes[n].stall_until.max(w.now + ms);
            w.stats.stalls += 1;
            let name = w.nodes[n].name.clone();
            w.log(format!("{name} FAULT stalls for {ms} ms"));
            let mean = w.opts.stall_every_ms;
            let t = w.now + every(&mut w, mean);
            w.at(t, Ev::Sim(SimEv::Stall(n)));
        }
        SimEv::Skew(n, behind) => {
            let mut w = ex.w.borrow_mut();
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
                let next = every(&mut w, mean);
                let behind = w.rng.range(6_000, 15_000);
                let t = w.now + next;
                w.at(t, Ev::Sim(SimEv::Skew(n, behind)));
            }
        }
        SimEv::Client => {
            let mut w = ex.w.borrow_mut();
            if !w.faults_on {
                return;
            }
            // Clients only reach actors the bucket has: a request for an actor
            // still only on a joining node would create it empty elsewhere (the
            // ADR's "start the node with the data first").
            let existing: Vec<usize> = (0..w.actors.len())
                .filter(|i| committed(&w, &w.actors[*i]).is_some())
                .collect();
            let up: Vec<usize> = (0..w.nodes.len()).filter(|i| w.nodes[*i].up).collect();
            if !existing.is_empty() && !up.is_empty() {
                let actor = existing[w.rng.index(existing.len())];
                let node = up[w.rng.index(up.len())];
                let op = match w.rng.range(0, 19) {
                    0..=4 => ClientOp::SetSlot(w.rng.range(0, 12) as i64 - 8),
                    5..=9 => ClientOp::SetDeadline(w.rng.range(0, 2) as i64 - 1),
                    10..=12 => ClientOp::Clear,
                    _ => ClientOp::Touch,
                };
                w.push_work(node, Work::Client { actor, op, hops: 0 });
            }
            let mean = w.opts.client_every_ms;
            let t = w.now + every(&mut w, mean);
            w.at(t, Ev::Sim(SimEv::Client));
        }
        SimEv::Rearm {
            actor,
            at_ms,
            avoid,
        } => {
            let mut w = ex.w.borrow_mut();
            if !w.faults_on {
                return;
            }
            let up: Vec<usize> = (0..w.nodes.len())
                .filter(|i| *i != avoid && w.nodes[*i].up)
                .collect();
            if up.is_empty() {
                return;
            }
            let node = up[w.rng.index(up.len())];
            w.stats.aimed_rearms += 1;
            let name = w.nodes[node].name.clone();
            w.log(format!(
                "{name} FAULT aimed: client re-arms a{actor}@{at_ms}"
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
        SimEv::FaultsOff => {
            let down: Vec<usize> = {
                let mut w = ex.w.borrow_mut();
                w.faults_on = false;
                w.log("faults and client requests stop");
                let now = w.now;
                for node in &mut w.nodes {
                    node.cut_until = node.cut_until.min(now);
                    node.stall_until = node.stall_until.min(now);
                    node.aim_first_upload = None;
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
    }
}

/// Builds the cluster for `opts` and runs it to the end or the first
/// violation.
pub fn run(opts: Options) -> Report {
    let cfg = ClusterConfig::default();
    let mut world = World::new(opts.clone(), cfg);
    setup(&mut world);
    let end = opts.fault_ms + opts.quiet_ms;
    let w = Rc::new(RefCell::new(world));
    let mut ex = Executor::new(w.clone());
    ex.run(end, on_sim);
    let mut wm = w.borrow_mut();
    if wm.violation.is_none() {
        check_delivered(&mut wm);
    }
    Report {
        seed: opts.seed,
        variant: opts.variant,
        violation: wm.violation.clone(),
        stats: wm.stats.clone(),
        trace_hash: wm.trace.hash,
        trace_count: wm.trace.count,
        trace: std::mem::take(&mut wm.trace.lines),
    }
}

fn setup(w: &mut World) {
    let o = w.opts.clone();
    let joiners = w.rng.range(1, 2) as usize;
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
            clock_behind: 0,
        });
    }
    // Actors already in the bucket, some with an alarm listed under a legacy
    // key (from before tags), some under a tagged one.
    for i in 0..o.actors {
        let address = Address::new("room", format!("a{i}")).expect("valid");
        let offset = w.rng.range(0, o.deadline_ms - 1);
        let info = ActorInfo::new(address.clone(), offset);
        let mut state = ActorState {
            version: 1,
            writer: format!("setup:{i}"),
            ..ActorState::default()
        };
        if w.rng.chance(0.7) {
            let at = w.rng.range(0, 30) * o.slot_ms;
            let entry = if w.rng.chance(0.3) {
                Entry::legacy(at)
            } else {
                Entry::tagged(at, 0, w.rng.next_u64())
            };
            state.alarm.at_ms = Some(at);
            state.alarm.indexed = Some(entry);
            let key = IndexKey { address, entry };
            w.bucket
                .insert(format!("{}{}", o.index_prefix, key.to_key()), String::new());
        }
        w.bucket
            .insert(format!("{}{}", info.root, log_key(0)), state.encode());
        w.actors.push(info);
    }
    // Nodes that ran on their own join later, with alarms in their own data (R4).
    for j in 0..joiners {
        let n = o.nodes + j;
        let join_at = w.rng.range(20_000, o.fault_ms / 2);
        for k in 0..w.rng.range(1, 2) {
            let actor = w.actors.len();
            let address = Address::new("room", format!("j{j}-{k}")).expect("valid");
            let offset = w.rng.range(0, o.deadline_ms - 1);
            w.actors.push(ActorInfo::new(address, offset));
            let at = (join_at + w.rng.range(0, 40_000)).saturating_sub(30_000);
            w.nodes[n]
                .durable
                .joins
                .insert(actor, JoinData { alarm: Some(at) });
        }
        w.at(join_at, Ev::Sim(SimEv::Start(n)));
    }
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
        let t = every(w, o.skew_every_ms);
        let behind = w.rng.range(6_000, 15_000);
        w.at(t, Ev::Sim(SimEv::Skew(n, behind)));
    }
    w.at(1_000, Ev::Sim(SimEv::Client));
    w.at(o.check_every_ms, Ev::Sim(SimEv::Check));
    w.at(o.fault_ms, Ev::Sim(SimEv::FaultsOff));
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
}

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
        if let Some(v) = r.violation {
            batch.failures.push((seed, v));
            if stop_at_first {
                break;
            }
        }
    }
    batch
}
