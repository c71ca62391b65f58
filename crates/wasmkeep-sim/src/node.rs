//! A simulated wasmkeep node: the server's cluster loop, written against the
//! simulated bucket, with every decision taken by `wasmkeep-cluster`.
//!
//! The ownership steps (the node's lease, reading another node's lease,
//! taking and releasing an actor) are `wasmkeep_cluster::machine`'s step
//! machines: the functions here that run them (`renew_loop`, `node_view`,
//! `take`, `release`) are thin drivers that perform each effect against the
//! simulated bucket (`perform`), with its faults, latency and crashes, and feed
//! the answer back. They hold no order of their own; the server drives the
//! same machines.
//!
//! What this module adds to the core is the plumbing the server also has:
//! sending requests, keeping claims (restored actors), the timer, the worker
//! that runs one piece of work at a time, and the replication chain
//! (`log/<seq>`, create-only, with ADR 0007's late-commit rule: whoever
//! creates the next seq first wins, and the loser gives the actor up). The
//! sweep's pass is the cluster's `SweepMachine`, the one the server drives: `sweep_once` feeds
//! it the live nodes and every app's index, performs its listings, and
//! hands its jobs to the worker as deliveries (the path the timer uses),
//! reporting each outcome back. The index writes around an upload (an
//! event's, a join's, a fence's) run through the cluster's `UploadRound`,
//! with each claim's `IndexUpkeep` ledger, and a delivery's stale cleanup
//! through `StaleCleanup`: the machines the runtime drives. What a delivery
//! decides for its actor (`deliver`, `stale`) calls the shared pure rules
//! (`plan_delivery`, `next_stale_step`), as the runtime's `index.rs` does.
//!
//! Each actor belongs to one app and lists its alarm in that app's index
//! (its prefix is a parameter of every index function); the sweep machine
//! keeps a cursor per index and reads it page by page.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use wasmkeep_cluster::alarm_index::{
    self, Address, AlarmState, StaleContext, StaleStep, plan_event, plan_first_upload,
};
use wasmkeep_cluster::delivery::{Delivery, Restored, plan_delivery};
use wasmkeep_cluster::lease::{LeaseKey, NODES_PREFIX, NodeLeaseView};
use wasmkeep_cluster::machine::{
    BucketOp, BucketResult, DeliveryReport, EpochEnd, Failure, KnownLeases, LeaseEffect, LiveNodes,
    LiveNodesEffect, NodeLeaseMachine, NodeViewEffect, NodeViewReader, Reached, ReleaseEffect,
    ReleaseMachine, ReleaseOutcome, SweepEffect, SweepJob, SweepMachine, TakeEffect, TakeMachine,
    TakeOutcome, TakeStep,
};
use wasmkeep_cluster::machine::{
    CleanupEffect, CleanupOutcome, GiveUp, IndexUpkeep, Listing, Planned, StaleCleanup,
    UpkeepEffect,
};
use wasmkeep_cluster::{ClusterConfig, Entry, IndexKey};

use crate::sim::SimEv;
use crate::world::{Ev, Never, Op, ReqErr, Resp, Shared, World, next_work, request, sleep};

/// Aimed re-arms sent with each aimed pause, and how long before the stall
/// ends each is sent (lowest, highest): the newer owner's take, handler and
/// upload land just before the stalled owner resumes, while its `on-alarm`
/// run for that past time (up to a handler's time) has not committed yet.
const REARMS: u64 = 3;
/// How long a leaving node releases its actors before it releases its
/// lease whatever it still holds (a node that cannot reach the bucket
/// would never finish; others then take the rest once the lease is
/// released, or lapses).
pub(crate) const LEAVE_RELEASE_MS: u64 = 10_000;
const REARM_BEFORE_MS: (u64, u64) = (500, 6_000);

/// What wrote a chain entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Cause {
    /// The run's setup (the state before the run).
    #[default]
    Setup,
    /// A client request.
    Client,
    /// An `on-alarm` run.
    Alarm,
    /// An event that keeps the alarm, to index it under a tagged key before
    /// stale entries are removed.
    Index,
    /// The `owner_fence` upload.
    Fence,
    /// A joining node's first upload (R4).
    Join,
}

impl Cause {
    fn name(self) -> &'static str {
        match self {
            Cause::Setup => "setup",
            Cause::Client => "client",
            Cause::Alarm => "alarm",
            Cause::Index => "index",
            Cause::Fence => "fence",
            Cause::Join => "join",
        }
    }

    fn parse(name: &str) -> Option<Cause> {
        [
            Cause::Setup,
            Cause::Client,
            Cause::Alarm,
            Cause::Index,
            Cause::Fence,
            Cause::Join,
        ]
        .into_iter()
        .find(|c| c.name() == name)
    }
}

/// One actor's database, as far as the cluster protocol sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ActorState {
    /// The alarm, `alarm_indexed` and the failure count.
    pub alarm: AlarmState,
    /// `on-init` is recorded: the actor was initialised and not deleted since.
    /// A deleted actor's state is a tombstone: no alarm, no `on-init`.
    pub init: bool,
    /// Events committed.
    pub version: u64,
    /// `owner_fence`: the generation of the last owner that fenced.
    pub fence: u64,
    /// What wrote this version.
    pub cause: Cause,
    /// Who wrote this version (node, generation, nonce): every body differs.
    pub writer: String,
}

impl ActorState {
    /// What the delivery rule reads of the state.
    pub fn restored(&self) -> Restored {
        Restored {
            alarm_at_ms: self.alarm.at_ms,
            initialised: self.init,
        }
    }

    /// Whether the actor has state (a committed alarm or `on-init`): not
    /// deleted, not empty.
    pub fn has_state(&self) -> bool {
        self.restored().has_state()
    }

    /// The body of a `log/<seq>` entry.
    pub fn encode(&self) -> String {
        let at = self.alarm.at_ms.map_or("-".to_owned(), |t| t.to_string());
        format!(
            "alarm={at};indexed={};retry={};init={};version={};fence={};cause={};writer={}",
            Entry::to_meta(self.alarm.indexed.as_ref()),
            self.alarm.retry_count,
            u8::from(self.init),
            self.version,
            self.fence,
            self.cause.name(),
            self.writer
        )
    }

    /// Parses [`ActorState::encode`].
    pub fn decode(body: &str) -> Option<ActorState> {
        let mut s = ActorState::default();
        for field in body.split(';') {
            let (k, v) = field.split_once('=')?;
            match k {
                "alarm" => {
                    s.alarm.at_ms = if v == "-" {
                        None
                    } else {
                        Some(v.parse().ok()?)
                    }
                }
                "indexed" => s.alarm.indexed = Entry::parse_meta(v).ok()?,
                "retry" => s.alarm.retry_count = v.parse().ok()?,
                "init" => s.init = v == "1",
                "version" => s.version = v.parse().ok()?,
                "fence" => s.fence = v.parse().ok()?,
                "cause" => s.cause = Cause::parse(v)?,
                "writer" => s.writer = v.to_owned(),
                _ => return None,
            }
        }
        Some(s)
    }
}

/// The key of a chain entry below an actor's folder.
pub fn log_key(seq: u64) -> String {
    format!("log/{seq:020}")
}

/// An actor's data on a node that ran on its own before joining (R4).
#[derive(Clone, Debug)]
pub struct JoinData {
    /// The alarm in its database.
    pub alarm: Option<u64>,
}

/// What a node keeps across crashes.
#[derive(Clone, Debug, Default)]
pub struct Durable {
    /// The last epoch used; each start takes the next.
    pub epoch: u64,
    /// Actors from before joining, not yet in the bucket.
    pub joins: BTreeMap<usize, JoinData>,
    /// The alarm of each actor as the local copy last had it: the startup
    /// scan of the data directory fills the timer from it.
    pub cache: BTreeMap<usize, Option<u64>>,
}

/// An actor the node has restored and may act for.
#[derive(Clone, Debug)]
pub struct Claim {
    /// The hold generation it took the actor under.
    pub generation: u64,
    /// The state it restored or wrote since.
    pub state: ActorState,
    /// The chain position of `state`, if the chain has any entry.
    pub seq: Option<u64>,
    /// Whether its own upload landed since it took the actor.
    pub uploaded: bool,
    /// Whether the bucket had any state for the actor when it took it.
    pub had_state: bool,
    /// When it last handled something for the actor.
    pub last_used: u64,
    /// The index writes planned for its uploads (the runtime keeps the
    /// same ledger on each actor's replication state).
    pub upkeep: IndexUpkeep,
}

/// A client request's effect on the alarm.
#[derive(Clone, Copy, Debug)]
pub enum ClientOp {
    /// `set-alarm` on the slot grid, `k` slots from now (negative: a past time,
    /// which fires at once).
    SetSlot(i64),
    /// `set-alarm` to one of the actor's fixed deadlines (`deadline_ms`
    /// apart, offset per actor), `k` deadlines from the current one: actors
    /// re-arm the same absolute times (a ring's expiry, a session's start),
    /// and a past one fires at once.
    SetDeadline(i64),
    /// `set-alarm` to exactly this time (the aimed re-arm of a time an
    /// earlier owner is cleaning up).
    SetAt(u64),
    /// `delete-alarm`.
    Clear,
    /// A write that leaves the alarm alone.
    Touch,
    /// Deletes the actor: its state becomes a tombstone (no alarm, no
    /// `on-init`), and the entry it named is removed once that is replicated
    /// (R2, the same as for a cleared alarm). A later request creates the
    /// actor again; an alarm delivery never does.
    Delete,
}

/// Work for a node's workers: one piece at a time per worker, and one at a
/// time per actor (turns are serial).
#[derive(Clone, Debug)]
pub enum Work {
    /// A client request.
    Client {
        actor: usize,
        op: ClientOp,
        hops: u8,
    },
    /// An alarm delivery for the entry at `at`: from the node's timer, or
    /// a job of its sweep (reported back to the sweep's machine).
    Deliver {
        actor: usize,
        at: u64,
        sweep: Option<SweepJob>,
    },
    /// Upload an actor from before joining.
    Join { actor: usize },
    /// Release an idle actor.
    Release { actor: usize },
}

impl Work {
    /// The actor the work is for.
    pub fn actor(&self) -> usize {
        match self {
            Work::Client { actor, .. }
            | Work::Deliver { actor, .. }
            | Work::Join { actor }
            | Work::Release { actor } => *actor,
        }
    }
}

/// What a node keeps in memory; a crash loses it.
pub struct Mem {
    /// The node's own lease, for this start.
    pub lease: NodeLeaseMachine,
    /// Restored actors.
    pub claims: BTreeMap<usize, Claim>,
    /// Actors whose hold in the bucket may name this node though it has no
    /// claim, until it takes them again or finds them owned elsewhere: a
    /// claim given up (a failed upload or index write: the server keeps
    /// such an actor held, its database reopened from the bucket at its
    /// next event), a take that failed after it wrote, a release that
    /// failed (the server marks them `maybe_held`). The sweep counts them
    /// as this node's own, as the server's does.
    pub maybe_held: BTreeSet<usize>,
    /// The in-memory timer: one time per actor.
    pub timer: BTreeMap<usize, u64>,
    /// Work not yet started.
    pub queue: VecDeque<Work>,
    /// The worker tasks waiting for work.
    pub worker_waiting: Vec<u64>,
    /// Actors a worker is busy with: one piece of work per actor at a time
    /// (an actor's turns are serial), whatever the number of workers.
    pub busy: BTreeSet<usize>,
    /// Actors with a delivery queued or running.
    pub in_flight: BTreeSet<usize>,
    /// Actors with a release queued.
    pub releasing: BTreeSet<usize>,
    /// The node leaves cleanly, since this time (its clock): it sweeps no
    /// more, releases every actor it holds as soon as no work of the actor
    /// runs, then its lease ([`LEAVE_RELEASE_MS`] at most after the start).
    pub leaving_since: Option<u64>,
    /// A leaving node asked its lease machine to release.
    pub lease_release_asked: bool,
    /// The sweep: cursors, the entries left alone for a while and the pass in progress.
    pub sweep: SweepMachine,
    /// Sweep jobs the worker finished, for the sweep to report.
    pub sweep_done: Vec<(SweepJob, DeliveryReport)>,
    /// The live nodes as the sweep last saw them, and what it read.
    pub live: LiveNodes,
    /// Other nodes' live lease records its takes read (`KnownLeases`).
    pub known: Arc<KnownLeases>,
    /// Lease reads in flight (`None`) or just answered, by operation; and
    /// when each was answered, oldest first.
    pub lease_reads: HashMap<BucketOp, Option<BucketResult>>,
    pub lease_reads_done: VecDeque<(u64, BucketOp)>,
}

/// The address a simulated node advertises in its lease records (nothing
/// reaches it there: the simulator routes by node index).
fn sim_address(name: &str) -> String {
    format!("sim://{name}")
}

impl Mem {
    /// Fresh memory for a start in `epoch`.
    pub fn new(name: &str, epoch: u64, cfg: &ClusterConfig) -> Mem {
        let known = Arc::new(KnownLeases::new());
        Mem {
            lease: NodeLeaseMachine::new(name, epoch, &sim_address(name), cfg.clone())
                .expect("simulated node ids are valid"),
            claims: BTreeMap::new(),
            maybe_held: BTreeSet::new(),
            timer: BTreeMap::new(),
            queue: VecDeque::new(),
            worker_waiting: Vec::new(),
            busy: BTreeSet::new(),
            in_flight: BTreeSet::new(),
            releasing: BTreeSet::new(),
            leaving_since: None,
            lease_release_asked: false,
            sweep: SweepMachine::new(name, cfg.clone()),
            sweep_done: Vec::new(),
            live: LiveNodes::new(name, cfg.clone()).with_known_leases(Arc::clone(&known)),
            known,
            lease_reads: HashMap::new(),
            lease_reads_done: VecDeque::new(),
        }
    }
}

/// A node's handle, cloned into each of its tasks.
#[derive(Clone)]
pub struct Ctx {
    /// The world.
    pub w: Shared,
    /// The node's index.
    pub n: usize,
}

enum Took {
    Mine,
    Forward(usize),
    Failed,
}

/// What an event does to the actor besides its alarm.
#[derive(Clone, Copy, Debug)]
struct Change {
    /// `on-init` recorded after the event: false for a delete.
    init: bool,
    /// What runs the event.
    cause: Cause,
}

/// A failed request as a step machine takes it.
fn bucket_result(e: ReqErr) -> BucketResult {
    match e {
        ReqErr::AlreadyExists => BucketResult::AlreadyExists,
        ReqErr::NotFound => BucketResult::NotFound,
        ReqErr::Unavailable | ReqErr::Timeout => BucketResult::Failed,
    }
}

/// What an upload round is for: its crash points and aimed faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    /// An event's commit (a client's, an alarm run's, the index's own).
    Event,
    /// The first upload of local data after joining (R4).
    Join,
    /// The owner's fence (R2): no index write.
    Fence,
}

impl Round {
    fn list_step(self) -> &'static str {
        match self {
            Round::Event | Round::Fence => "event: list the new alarm",
            Round::Join => "join: list the alarm",
        }
    }

    fn upload_step(self) -> &'static str {
        match self {
            Round::Event => "event: replicate",
            Round::Join => "join: first upload",
            Round::Fence => "stale: owner_fence",
        }
    }
}

/// What an `on-alarm` run does, drawn from the seed.
#[derive(Clone, Copy, Debug)]
struct AlarmRun {
    /// The handler fails (the retry policy decides the next attempt).
    fail: bool,
    /// The handler deletes its own actor.
    delete: bool,
    /// The alarm the handler leaves set, if any.
    left: Option<u64>,
}

impl Ctx {
    fn with<R>(&self, f: impl FnOnce(&mut World) -> R) -> R {
        f(&mut self.w.borrow_mut())
    }

    /// The node's own clock.
    fn now(&self) -> u64 {
        self.w.borrow().node_now(self.n)
    }

    fn name(&self) -> String {
        self.w.borrow().nodes[self.n].name.clone()
    }

    fn log(&self, line: impl AsRef<str>) {
        let n = self.n;
        self.with(|w| {
            let l = format!("{} {}", w.nodes[n].name, line.as_ref());
            w.log(l)
        });
    }

    fn nonce(&self) -> u64 {
        self.with(|w| w.rng.next_u64())
    }

    /// A fault with the probability `p` picks from the options, while faults
    /// are on.
    fn chance(&self, p: impl FnOnce(&crate::sim::Options) -> f64) -> bool {
        self.with(|w| {
            let p = p(&w.opts);
            w.faults_on && w.rng.chance(p)
        })
    }

    async fn req(&self, op: Op) -> Result<Resp, ReqErr> {
        request(&self.w, self.n, op).await
    }

    async fn list(
        &self,
        prefix: String,
        start_after: Option<String>,
        limit: usize,
    ) -> Option<Vec<String>> {
        match self
            .req(Op::List {
                prefix,
                start_after,
                limit,
            })
            .await
        {
            Ok(Resp::Keys(k)) => Some(k),
            _ => None,
        }
    }

    /// Lists every key under `prefix`, page by page (`list_page_keys_max`
    /// keys a page, continuing after the last key); `None` if a page fails.
    async fn list_all(&self, prefix: String) -> Option<Vec<String>> {
        let page = self.w.borrow().cfg.list_page_keys_max;
        let mut keys: Vec<String> = Vec::new();
        loop {
            let after = keys.last().cloned();
            let got = self.list(prefix.clone(), after, page).await?;
            let done = got.len() < page;
            keys.extend(got);
            if done {
                return Some(keys);
            }
        }
    }

    async fn get(&self, key: String) -> Result<String, ReqErr> {
        match self.req(Op::Get { key }).await {
            Ok(Resp::Body(b)) => Ok(b),
            Ok(_) => Err(ReqErr::Unavailable),
            Err(e) => Err(e),
        }
    }

    async fn put(
        &self,
        actor: usize,
        key: String,
        body: String,
        create_only: bool,
    ) -> Result<(), ReqErr> {
        self.req(Op::Put {
            key,
            body,
            create_only,
            actor: Some(actor),
        })
        .await
        .map(|_| ())
    }

    /// Removes an index entry of `actor`; whatever the answer, nothing waits
    /// on it (a delete that fails leaves an entry: one wake-up more).
    async fn delete(&self, actor: usize, key: String) {
        let _ = self
            .req(Op::Delete {
                key,
                actor: Some(actor),
            })
            .await;
    }

    fn acting(&self) -> bool {
        let n = self.n;
        self.with(|w| {
            let now = w.node_now(n);
            w.nodes[n].mem.lease.is_acting(now)
        })
    }

    /// The owner may take its next step for `actor`: its lease is valid and it
    /// still holds the actor under `generation`.
    fn owner_ok(&self, actor: usize, generation: u64) -> bool {
        self.acting()
            && self.with(|w| {
                w.nodes[self.n]
                    .mem
                    .claims
                    .get(&actor)
                    .is_some_and(|c| c.generation == generation)
            })
    }

    fn claim(&self, actor: usize) -> Option<Claim> {
        self.with(|w| w.nodes[self.n].mem.claims.get(&actor).cloned())
    }

    fn give_up(&self, actor: usize, why: &str) {
        let n = self.n;
        let had = self.with(|w| {
            let mem = &mut w.nodes[n].mem;
            let had = mem.claims.remove(&actor).is_some();
            if had {
                mem.maybe_held.insert(actor);
            }
            had
        });
        if had {
            self.with(|w| w.stats.give_ups += 1);
            let label = self.label(actor);
            self.log(format!("gives up {label}: {why}"));
        }
    }

    fn set_timer(&self, actor: usize, at: Option<u64>) {
        let n = self.n;
        self.with(|w| match at {
            Some(t) => {
                w.nodes[n].mem.timer.insert(actor, t);
            }
            None => {
                w.nodes[n].mem.timer.remove(&actor);
            }
        });
    }

    fn root(&self, actor: usize) -> String {
        self.w.borrow().actors[actor].root.clone()
    }

    fn label(&self, actor: usize) -> String {
        self.w.borrow().actors[actor].label.clone()
    }

    /// The full key of one of `actor`'s entries, in its app's index.
    fn index_key(&self, actor: usize, key: &IndexKey) -> String {
        format!(
            "{}{}",
            self.w.borrow().actors[actor].index_prefix,
            key.to_key()
        )
    }

    /// A crash point between two steps: with a small probability the node
    /// crashes right here, so every step boundary gets crashed at.
    async fn step(&self, what: &str) {
        if self.chance(|o| o.p_step_crash) {
            let n = self.n;
            self.log(format!("CRASH at step: {what}"));
            self.with(|w| {
                w.stats.step_crashes += 1;
                w.crash_after_poll(n)
            });
            Never.await;
        }
    }

    /// The aimed pause: between an owner's lease check and its listing of
    /// stale entries, the process stalls (a GC pause, a swapped-out VM), long
    /// enough for its lease to run out and another node to take over.
    ///
    /// With it, the aimed workload (`p_aim_rearm`): clients ask other nodes to
    /// re-arm the actor to exactly `at`, a few seconds before the stall ends,
    /// so that a newer owner's entry at `at` is likely named when the stalled
    /// owner resumes and lists the folder (the race R3 closes).
    async fn pause_point(&self, actor: usize, at: u64) {
        if self.chance(|o| o.p_aim_pause) {
            let n = self.n;
            let ms = self.with(|w| w.rng.range(20_000, 45_000));
            self.log(format!(
                "FAULT aimed: stalls {ms} ms before listing stale entries"
            ));
            self.with(|w| {
                w.stats.aimed_pauses += 1;
                w.nodes[n].stall_until = w.now + ms;
                let p = w.opts.p_aim_rearm;
                if w.rng.chance(p) {
                    let end = w.now + ms;
                    for _ in 0..REARMS {
                        let before = w.rng.range(REARM_BEFORE_MS.0, REARM_BEFORE_MS.1);
                        w.at(
                            end.saturating_sub(before),
                            Ev::Sim(SimEv::Rearm {
                                actor,
                                at_ms: at,
                                avoid: n,
                            }),
                        );
                    }
                }
            });
            sleep(&self.w, 0).await;
        }
    }

    /// A handler runs for a while (guest code, outbound calls) before its
    /// event commits; meanwhile the committed state still names the old entry.
    async fn handler_time(&self) {
        let ms = self.with(|w| {
            let (lo, hi) = w.opts.handler_ms;
            w.rng.range(lo, hi)
        });
        sleep(&self.w, ms).await;
    }

    fn new_epoch(&self, end: EpochEnd) {
        let n = self.n;
        let epoch = self.with(|w| {
            let cfg = w.cfg.clone();
            let node = &mut w.nodes[n];
            node.durable.epoch += 1;
            let e = node.durable.epoch;
            node.mem.lease = NodeLeaseMachine::new(&node.name, e, &sim_address(&node.name), cfg)
                .expect("valid node id");
            node.mem.claims.clear();
            node.mem.maybe_held.clear();
            w.stats.epochs += 1;
            e
        });
        self.log(format!(
            "lease over ({end:?}): drops every actor, starts epoch {epoch}"
        ));
    }

    /// Performs one bucket operation a step machine asked for, with every
    /// fault the simulated network and bucket have, and translates the answer.
    async fn perform(&self, op: BucketOp) -> BucketResult {
        if !op.is_shared_read() {
            return self.perform_once(op).await;
        }
        // The same lease record read, or first page of one node's lease
        // listing, in flight on this node: its answer, as the server's
        // driver does (ADR 0065, ADR 0070).
        let n = self.n;
        let key = op.clone();
        // Only a read in flight is waited for: an answer that came before
        // this read was asked is not this read's answer.
        if self.with(|w| matches!(w.nodes[n].mem.lease_reads.get(&key), Some(None))) {
            loop {
                match self.with(|w| w.nodes[n].mem.lease_reads.get(&key).cloned()) {
                    Some(Some(result)) => return result,
                    Some(None) => sleep(&self.w, 1).await,
                    None => break,
                }
            }
        }
        self.with(|w| w.nodes[n].mem.lease_reads.insert(key.clone(), None));
        let result = self.perform_once(op).await;
        self.with(|w| {
            let at = w.now;
            let mem = &mut w.nodes[n].mem;
            mem.lease_reads.insert(key.clone(), Some(result.clone()));
            // Kept a moment for the waiters (they look every millisecond).
            mem.lease_reads_done.push_back((at, key));
            while mem
                .lease_reads_done
                .front()
                .is_some_and(|(t, _)| *t + 2 < at)
            {
                let Some((_, old)) = mem.lease_reads_done.pop_front() else {
                    break;
                };
                if mem.lease_reads.get(&old).is_some_and(Option::is_some) {
                    mem.lease_reads.remove(&old);
                }
            }
        });
        result
    }

    async fn perform_once(&self, op: BucketOp) -> BucketResult {
        let op = match op {
            BucketOp::PutCreate { key, body } => Op::Put {
                key,
                body: String::from_utf8(body).expect("protocol records are text"),
                create_only: true,
                actor: None,
            },
            BucketOp::Get { key } => Op::Get { key },
            BucketOp::List {
                prefix,
                start_after,
                limit,
            } => Op::List {
                prefix,
                start_after,
                limit,
            },
            BucketOp::Delete { key } => Op::Delete { key, actor: None },
        };
        match self.req(op).await {
            Ok(Resp::Done) => BucketResult::Done,
            Ok(Resp::Body(b)) => BucketResult::Body(b.into_bytes()),
            Ok(Resp::Keys(k)) => BucketResult::Keys(k),
            Err(e) => bucket_result(e),
        }
    }

    /// The epoch this node may act in now, if any (what the take and release
    /// machines check before they write).
    fn acting_epoch(&self) -> Option<u64> {
        let n = self.n;
        self.with(|w| {
            let now = w.node_now(n);
            w.nodes[n].mem.lease.acting_epoch(now)
        })
    }

    /// Reads another node's lease: drives `NodeViewReader`.
    async fn node_view(&self, node: &str) -> Option<NodeLeaseView> {
        let cfg = self.w.borrow().cfg.clone();
        let mut reader = NodeViewReader::new(node, cfg);
        loop {
            match reader.poll_effect()? {
                NodeViewEffect::Bucket(op) => {
                    let result = self.perform(op).await;
                    reader.on_result(result, self.now());
                }
                NodeViewEffect::Done(view) => return view.ok(),
            }
        }
    }

    /// Takes the actor if nobody owns it (ADR 0020): drives `TakeMachine`,
    /// with a crash point before each of its writes and before the restore.
    async fn take(&self, actor: usize) -> Took {
        let n = self.n;
        let mut wrote = false;
        let mut machine = self.with(|w| {
            let node = &w.nodes[n];
            let loaded = node.mem.claims.get(&actor).map(|c| c.generation);
            let m = TakeMachine::new(
                &node.name,
                node.mem.lease.epoch(),
                &w.actors[actor].root,
                loaded,
                w.rng.next_u64(),
                w.cfg.clone(),
            );
            if w.opts.take_reads_every_lease {
                m
            } else {
                m.with_known_leases(Arc::clone(&node.mem.known))
            }
        });
        loop {
            let Some(effect) = machine.poll_effect(self.acting_epoch()) else {
                debug_assert!(false, "the take waits for nothing");
                return Took::Failed;
            };
            let failed = |me: &Self| {
                // What it wrote may have landed: its hold may name this node.
                if wrote {
                    me.with(|w| w.nodes[n].mem.maybe_held.insert(actor));
                }
                Took::Failed
            };
            match effect {
                TakeEffect::Bucket(op) => {
                    wrote |= op.is_write();
                    match machine.step() {
                        TakeStep::Fence if op.is_write() => self.step("take: fence").await,
                        TakeStep::CreateHold if op.is_write() => {
                            self.step("take: create hold").await
                        }
                        _ => {}
                    }
                    let result = self.perform(op).await;
                    machine.on_result(result, self.now());
                }
                TakeEffect::Fenced { node, epoch } => {
                    self.with(|w| w.stats.node_fences += 1);
                    self.log(format!("fences {node} epoch {epoch}"));
                }
                TakeEffect::Restore {
                    generation,
                    takeover,
                } => {
                    self.with(|w| {
                        w.stats.takes += 1;
                        if takeover {
                            w.stats.takeovers += 1;
                        }
                    });
                    self.step("take: restore").await;
                    let restored = self.restore(actor, generation, takeover).await;
                    machine.on_restored(restored);
                }
                TakeEffect::Done(outcome) => {
                    return match outcome {
                        TakeOutcome::Mine { .. } | TakeOutcome::Taken { .. } => Took::Mine,
                        TakeOutcome::Forward { node } => {
                            let idx = self.with(|w| w.nodes.iter().position(|x| x.name == node));
                            // Owned elsewhere: no hold of this node's.
                            self.with(|w| w.nodes[n].mem.maybe_held.remove(&actor));
                            idx.map_or_else(|| failed(self), Took::Forward)
                        }
                        // Another node's hold landed first: none of this
                        // node's did.
                        TakeOutcome::Failed(Failure::LostRace) => {
                            self.with(|w| w.nodes[n].mem.maybe_held.remove(&actor));
                            Took::Failed
                        }
                        // The simulator's takes are never lookups.
                        TakeOutcome::Failed(_) | TakeOutcome::Free => failed(self),
                    };
                }
            }
        }
    }

    /// The restore a take asks for: the latest chain entry becomes the claim
    /// (the simulated chain has no snapshots; each entry is the whole state).
    async fn restore(&self, actor: usize, generation: u64, takeover: bool) -> bool {
        let root = self.root(actor);
        let label = self.label(actor);
        let Some(logs) = self.list_all(format!("{root}log/")).await else {
            self.log(format!("took {label} g{generation} but cannot restore"));
            return false;
        };
        let (state, seq) = match logs.last() {
            None => (ActorState::default(), None),
            Some(k) => {
                let seq: u64 = k[k.len() - 20..].parse().expect("log keys are ours");
                match self
                    .get(k.clone())
                    .await
                    .ok()
                    .and_then(|b| ActorState::decode(&b))
                {
                    Some(s) => (s, Some(seq)),
                    None => return false,
                }
            }
        };
        self.log(format!(
            "takes {label} g{generation}{} at seq {seq:?}: alarm {:?} indexed {}{}",
            if takeover { " (takeover)" } else { "" },
            state.alarm.at_ms,
            Entry::to_meta(state.alarm.indexed.as_ref()),
            if state.has_state() { "" } else { ", no state" }
        ));
        let now = self.now();
        let alarm = state.alarm.at_ms;
        let claim = Claim {
            generation,
            state,
            seq,
            uploaded: false,
            had_state: seq.is_some(),
            last_used: now,
            upkeep: IndexUpkeep::default(),
        };
        let n = self.n;
        self.with(|w| {
            w.nodes[n].mem.claims.insert(actor, claim);
            w.nodes[n].mem.maybe_held.remove(&actor);
            w.nodes[n].durable.cache.insert(actor, alarm);
        });
        // A restored actor's alarm goes into the owner's timer.
        if alarm.is_some() {
            self.set_timer(actor, alarm);
        }
        true
    }

    /// Appends the next chain entry (create-only). Losing the race (an earlier
    /// owner's late upload took the seq) or any failure gives the actor up.
    async fn upload(&self, actor: usize, mut state: ActorState) -> bool {
        let Some(claim) = self.claim(actor) else {
            return false;
        };
        if !self.owner_ok(actor, claim.generation) {
            self.give_up(actor, "lease not valid before upload");
            return false;
        }
        let seq = claim.seq.map_or(0, |s| s + 1);
        state.writer = format!("{}:{}:{:016x}", self.name(), claim.generation, self.nonce());
        let key = format!("{}{}", self.root(actor), log_key(seq));
        match self.put(actor, key, state.encode(), true).await {
            Ok(()) => {
                let n = self.n;
                let alarm = state.alarm.at_ms;
                self.with(|w| {
                    w.nodes[n].durable.cache.insert(actor, alarm);
                    match w.nodes[n].mem.claims.get_mut(&actor) {
                        Some(c) if c.generation == claim.generation => {
                            c.state = state;
                            c.seq = Some(seq);
                            c.uploaded = true;
                            true
                        }
                        _ => false,
                    }
                })
            }
            Err(e) => {
                if e == ReqErr::AlreadyExists {
                    self.with(|w| w.stats.late_commit_conflicts += 1);
                }
                self.give_up(actor, &format!("upload of seq {seq} failed: {e:?}"));
                false
            }
        }
    }

    /// One event: ADR 0009's owner rule around replication. A delete is an
    /// event like any other: its alarm is none, so the entry the state named
    /// is removed once the tombstone is replicated (R2).
    async fn run_event(
        &self,
        actor: usize,
        alarm_after: Option<u64>,
        retry_count: u32,
        change: Change,
    ) -> bool {
        let Some(claim) = self.claim(actor) else {
            return false;
        };
        let (rules, address) = self.with(|w| (w.rules, w.actors[actor].address.clone()));
        let plan = plan_event(
            rules,
            &address,
            claim.state.alarm.indexed.as_ref(),
            alarm_after,
            claim.generation,
            self.nonce(),
        )
        .expect("simulated times fit the key");
        let state = ActorState {
            alarm: AlarmState {
                at_ms: alarm_after,
                indexed: plan.record,
                retry_count,
            },
            init: change.init,
            cause: change.cause,
            version: claim.state.version + 1,
            ..claim.state.clone()
        };
        let planned = Planned {
            list_before: plan.put_before_upload.map(|put| self.listing(actor, &put)),
            list_after: None,
            remove_after: plan
                .delete_after_upload
                .map(|old| self.index_key(actor, &old)),
        };
        if !self
            .upload_round(actor, claim.generation, planned, state, Round::Event)
            .await
        {
            return false;
        }
        self.set_timer(actor, alarm_after);
        true
    }

    /// A PUT of one of `actor`'s entries, as the upkeep machine takes it.
    fn listing(&self, actor: usize, put: &alarm_index::Put) -> Listing {
        Listing {
            key: self.index_key(actor, &put.key),
            create_only: put.create_only,
        }
    }

    /// One upload of `state` with the index writes planned for it, through
    /// `wasmkeep_cluster::machine::UploadRound`, the machine the runtime's
    /// replication drives: each listing (a crash point before it, the lease
    /// checked, a failure gives the actor up), the upload, then the removals
    /// of what it replaced (best effort) and the unsafe variant's late
    /// listings. Whether the upload landed.
    async fn upload_round(
        &self,
        actor: usize,
        generation: u64,
        planned: Planned,
        state: ActorState,
        why: Round,
    ) -> bool {
        let n = self.n;
        let commit = state.version;
        let Some(mut round) = self.with(|w| {
            let c = w.nodes[n].mem.claims.get_mut(&actor)?;
            c.upkeep.plan(commit, planned);
            Some(c.upkeep.start_upload(commit))
        }) else {
            return false;
        };
        let mut state = Some(state);
        loop {
            match round.poll_effect() {
                Some(UpkeepEffect::List(listing)) => {
                    self.step(why.list_step()).await;
                    let result = if self.owner_ok(actor, generation) {
                        self.put(
                            actor,
                            listing.key.clone(),
                            String::new(),
                            listing.create_only,
                        )
                        .await
                        .map_or_else(bucket_result, |()| BucketResult::Done)
                    } else {
                        BucketResult::Failed
                    };
                    let listed = matches!(result, BucketResult::Done);
                    round.on_listed(result);
                    if listed && why == Round::Event {
                        self.aim_at_new_entry(actor, &listing);
                    }
                }
                Some(UpkeepEffect::Upload) => {
                    self.step(why.upload_step()).await;
                    if why == Round::Join && self.chance(|o| o.p_aim_join) {
                        let (late, cut) = self
                            .with(|w| (w.rng.range(40_000, 90_000), w.rng.range(30_000, 60_000)));
                        self.with(|w| w.nodes[n].aim_first_upload = Some((late, cut)));
                    }
                    let state = state.take().expect("one upload a round");
                    round.on_uploaded(self.upload(actor, state).await);
                }
                Some(UpkeepEffect::Landed { remove, list_late }) => {
                    self.after_landing(actor, generation, remove, list_late)
                        .await;
                    return true;
                }
                Some(UpkeepEffect::GiveUp(GiveUp::Listing { key })) => {
                    self.give_up(actor, &format!("index put of {key} failed"));
                    return false;
                }
                // The failed upload gave the actor up already.
                Some(UpkeepEffect::GiveUp(GiveUp::Upload)) | None => return false,
            }
        }
    }

    /// What an upload round leaves for after its upload landed: the
    /// replaced entries removed (while the lease lets the node act), the
    /// unsafe variant's late listings; each a crash point, best effort.
    async fn after_landing(
        &self,
        actor: usize,
        generation: u64,
        remove: Vec<String>,
        list_late: Vec<Listing>,
    ) {
        for key in remove {
            self.step("event: remove the replaced entry").await;
            if self.owner_ok(actor, generation) {
                self.delete(actor, key).await;
            }
        }
        for listing in list_late {
            self.step("join: list the alarm after the upload").await;
            let _ = self
                .put(actor, listing.key, String::new(), listing.create_only)
                .await;
        }
    }

    /// The aimed fault at the race `owner_fence` closes: a new entry that
    /// is due was listed, and the upload naming it is held.
    fn aim_at_new_entry(&self, actor: usize, listing: &Listing) {
        let prefix = self.w.borrow().actors[actor].index_prefix.clone();
        let due = IndexKey::parse_full(&prefix, &listing.key)
            .ok()
            .map(|k| k.entry.at_ms);
        if due.is_some_and(|at| at <= self.now()) && self.chance(|o| o.p_aim_new_entry) {
            let n = self.n;
            self.with(|w| {
                let late = w.rng.range(30_000, 75_000);
                let cut = w.rng.range(20_000, 45_000);
                w.nodes[n].aim_upload = Some((late, cut));
            });
        }
    }

    async fn client(&self, actor: usize, op: ClientOp, hops: u8) {
        match self.take(actor).await {
            Took::Mine => {}
            Took::Forward(node) => {
                let up = self.w.borrow().nodes[node].up;
                if !up {
                    // The forward fails: the next take reads its lease.
                    let (n, name) = (self.n, self.w.borrow().nodes[node].name.clone());
                    self.with(|w| w.nodes[n].mem.known.forget(&name));
                }
                if hops < 2 && up {
                    self.with(|w| {
                        w.push_work(
                            node,
                            Work::Client {
                                actor,
                                op,
                                hops: hops + 1,
                            },
                        )
                    });
                }
                return;
            }
            Took::Failed => return,
        }
        let Some(claim) = self.claim(actor) else {
            return;
        };
        let now = self.now();
        let n = self.n;
        self.with(|w| {
            if let Some(c) = w.nodes[n].mem.claims.get_mut(&actor) {
                c.last_used = now;
            }
            w.stats.client_events += 1;
        });
        let before = claim.state.alarm;
        let label = self.label(actor);
        if matches!(op, ClientOp::Delete) && !claim.state.has_state() {
            // Deleting an actor that has no state changes nothing.
            return;
        }
        let slot = self.w.borrow().opts.slot_ms;
        let (after, retry) = match op {
            ClientOp::SetSlot(k) => {
                let base = (now / slot) as i64 + k;
                (Some((base.max(0) as u64) * slot), 0)
            }
            ClientOp::SetDeadline(k) => {
                let (every, offset) =
                    self.with(|w| (w.opts.deadline_ms, w.actors[actor].deadline_offset_ms));
                let current = (now.saturating_sub(offset) / every) as i64 + k;
                (Some(current.max(0) as u64 * every + offset), 0)
            }
            ClientOp::SetAt(at) => (Some(at), 0),
            ClientOp::Clear | ClientOp::Delete => (None, 0),
            ClientOp::Touch => (before.at_ms, before.retry_count),
        };
        // A request to a deleted actor creates it again (`on-init` runs).
        let delete = matches!(op, ClientOp::Delete);
        let recreate = !delete && !claim.state.has_state();
        self.log(format!(
            "event on {label}: {op:?} alarm {:?} -> {after:?}{}",
            before.at_ms,
            if recreate { " (creates it again)" } else { "" }
        ));
        self.handler_time().await;
        let change = Change {
            init: !delete,
            cause: Cause::Client,
        };
        if self.run_event(actor, after, retry, change).await {
            self.with(|w| {
                w.stats.deletes += u64::from(delete);
                w.stats.recreated += u64::from(recreate);
            });
        }
    }

    /// Takes `actor` for a delivery of its entry at `at`: `None` once the
    /// node has it, else how the delivery ends. A failed take is retried by
    /// the node's timer, unless the sweep asked.
    async fn take_for_delivery(&self, actor: usize, at: u64, from_sweep: bool) -> Option<Reached> {
        match self.take(actor).await {
            Took::Mine => None,
            Took::Forward(_) => {
                // The owner has the alarm, committed and indexed.
                let label = self.label(actor);
                self.log(format!("drops delivery of {label}@{at}: owned elsewhere"));
                Some(Reached::NotOwner)
            }
            Took::Failed => {
                if !from_sweep {
                    let retry = self.now() + self.w.borrow().cfg.lease_period_ms;
                    let n = self.n;
                    self.with(|w| {
                        w.nodes[n].mem.timer.entry(actor).or_insert(retry);
                    });
                }
                Some(Reached::Failed)
            }
        }
    }

    /// Delivers the entry at `at` to `actor`: takes it, then runs the alarm
    /// or cleans up as `plan_delivery` says. A failed take is retried by the
    /// node's timer, unless the sweep asked (its machine defers the entry).
    async fn deliver(&self, actor: usize, at: u64, from_sweep: bool) -> Reached {
        if let Some(reached) = self.take_for_delivery(actor, at, from_sweep).await {
            return reached;
        }
        let Some(claim) = self.claim(actor) else {
            return Reached::Failed;
        };
        let now = self.now();
        let n = self.n;
        self.with(|w| {
            if let Some(c) = w.nodes[n].mem.claims.get_mut(&actor) {
                c.last_used = now;
            }
        });
        let label = self.label(actor);
        let rules = self.w.borrow().rules;
        match plan_delivery(rules, at, &claim.state.restored(), now) {
            Delivery::Run => {
                let started = self.w.borrow().now;
                let reached = self.run_alarm(actor, at, &claim, now, &label).await;
                if reached == Reached::Ran {
                    self.with(|w| w.cost.alarm_ran(at, started, from_sweep));
                }
                reached
            }
            Delivery::NotDue { at_ms } => {
                self.set_timer(actor, Some(at_ms));
                Reached::NotDue
            }
            Delivery::Stale => self.stale(actor, at).await,
            Delivery::NoState => {
                // Deleted since, or never initialised: the actor is not
                // started (that would create it); the entry goes by the
                // stale-entry steps, which keep it while the bucket had
                // nothing for the actor.
                self.log(format!(
                    "{label}@{at}: no state, removes the entry, runs nothing"
                ));
                self.with(|w| w.stats.no_state_deliveries += 1);
                self.stale(actor, at).await
            }
        }
    }

    /// Whether the alarm due `at` may run now; reports an early delivery if
    /// not. Checked against simulated time, not the node's clock: a clock
    /// that runs behind may deliver late, never early.
    fn due_in_true_time(&self, at: u64, label: &str) -> bool {
        let true_now = self.w.borrow().now;
        if at > true_now {
            let name = self.name();
            self.with(|w| {
                w.violate(
                    "early-delivery",
                    format!("{name} ran {label}'s alarm due {at} at {true_now}"),
                )
            });
            return false;
        }
        true
    }

    /// What an `on-alarm` run at `now` does, drawn from the seed.
    fn draw_alarm_run(&self, at: u64, now: u64) -> AlarmRun {
        let fail = self.chance(|o| o.p_handler_fail);
        let delete = !fail && self.chance(|o| o.p_alarm_delete);
        let slot = self.w.borrow().opts.slot_ms;
        let left = self.with(|w| {
            let r = w.rng.range(0, 9);
            let later = (now / slot + w.rng.range(1, 6)) * slot;
            match (fail, r) {
                (true, 0) => None,
                (true, 1) => Some(later + 60_000),
                (true, _) => Some(at),
                (false, 0..=5) => None,
                (false, _) => Some(later),
            }
        });
        AlarmRun { fail, delete, left }
    }

    /// Runs `actor`'s `on-alarm` for the entry at `at` and commits what it
    /// leaves: the alarm the retry policy gives, or nothing if it deleted
    /// the actor.
    async fn run_alarm(
        &self,
        actor: usize,
        at: u64,
        claim: &Claim,
        now: u64,
        label: &str,
    ) -> Reached {
        if !self.due_in_true_time(at, label) {
            return Reached::Failed;
        }
        if !claim.state.has_state() {
            // Only under the unsafe variant: the actor is started,
            // which runs `on-init` and creates it again.
            self.log(format!("runs {label}@{at} with no state (creates it)"));
        }
        let AlarmRun { fail, delete, left } = self.draw_alarm_run(at, now);
        self.handler_time().await;
        let cfg = self.w.borrow().cfg.clone();
        let out = wasmkeep_cluster::retry::after_alarm_run(
            &wasmkeep_cluster::retry::RetryPolicy::from_config(&cfg),
            !fail,
            left,
            claim.state.alarm.retry_count,
            now,
        );
        // `on-alarm` may delete its own actor: then nothing is left,
        // not even the alarm it set.
        let (alarm_after, retry_after) = if delete {
            (None, 0)
        } else {
            (out.at_ms, out.retry_count)
        };
        self.log(format!(
            "runs on-alarm {label}@{at} ({}) -> alarm {alarm_after:?} retry {retry_after}",
            match (fail, delete) {
                (true, _) => "fails",
                (false, true) => "ok, deletes the actor",
                (false, false) => "ok",
            },
        ));
        self.with(|w| {
            w.stats.alarm_runs += 1;
            if fail {
                w.stats.alarm_failures += 1;
            }
        });
        let change = Change {
            init: !delete,
            cause: Cause::Alarm,
        };
        if !self
            .run_event(actor, alarm_after, retry_after, change)
            .await
        {
            return Reached::Failed;
        }
        self.with(|w| {
            w.stats.alarms += 1;
            w.stats.alarm_deletes += u64::from(delete);
            w.stats.deletes += u64::from(delete);
        });
        Reached::Ran
    }

    /// Removes the actor's entries at a time the committed alarm no longer has.
    async fn stale(&self, actor: usize, at: u64) -> Reached {
        loop {
            let Some(claim) = self.claim(actor) else {
                return Reached::Failed;
            };
            let (rules, cfg) = self.with(|w| (w.rules, w.cfg.clone()));
            let now = self.now();
            let ctx = StaleContext {
                delivered_at_ms: at,
                committed: &claim.state.alarm,
                bucket_had_state: claim.had_state,
                uploaded_since_take: claim.uploaded,
            };
            let step = alarm_index::next_stale_step(rules, &ctx, &cfg, now);
            let label = self.label(actor);
            self.log(format!("stale {label}@{at}: {step:?}"));
            match step {
                StaleStep::IndexCommitted => {
                    let a = claim.state.alarm;
                    let change = Change {
                        init: claim.state.init,
                        cause: Cause::Index,
                    };
                    if !self.run_event(actor, a.at_ms, a.retry_count, change).await {
                        return Reached::Failed;
                    }
                }
                StaleStep::Fence => {
                    let state = ActorState {
                        fence: claim.generation,
                        version: claim.state.version + 1,
                        cause: Cause::Fence,
                        ..claim.state
                    };
                    let nothing = Planned::default();
                    if !self
                        .upload_round(actor, claim.generation, nothing, state, Round::Fence)
                        .await
                    {
                        return Reached::Failed;
                    }
                    self.with(|w| w.stats.owner_fences += 1);
                }
                StaleStep::ListAndDelete => {
                    if !self.owner_ok(actor, claim.generation) {
                        return Reached::Failed;
                    }
                    self.pause_point(actor, at).await;
                    return self.clean(actor, at, &claim).await;
                }
                StaleStep::LeaveAndRelease { retry_at_ms } => {
                    self.with(|w| w.stats.left_on_empty_bucket += 1);
                    self.set_timer(actor, Some(retry_at_ms));
                    self.release(actor).await;
                    return Reached::Leave { retry_at_ms };
                }
            }
        }
    }

    /// Removes `actor`'s stale entries at `at` through
    /// `wasmkeep_cluster::machine::StaleCleanup`, the machine the runtime
    /// drives in the actor's turn.
    async fn clean(&self, actor: usize, at: u64, claim: &Claim) -> Reached {
        let (rules, prefix, address) = self.with(|w| {
            let a = &w.actors[actor];
            (w.rules, a.index_prefix.clone(), a.address.clone())
        });
        // The simulator's app indexes hold legacy entries from before tags.
        let legacy_entries = true;
        let mut cleanup = StaleCleanup::new(
            rules,
            &prefix,
            address,
            at,
            claim.state.alarm.indexed,
            claim.generation,
            legacy_entries,
        );
        loop {
            match cleanup.poll_effect() {
                Some(CleanupEffect::Bucket(op)) => {
                    if let BucketOp::Delete { key } = &op
                        && self.w.borrow().bucket.contains_key(key)
                    {
                        self.with(|w| w.stats.stale_deleted += 1);
                    }
                    let result = self.perform_for(actor, op).await;
                    cleanup.on_result(result);
                }
                Some(CleanupEffect::Done(CleanupOutcome::Cleaned {
                    removed,
                    newer_listed,
                })) => {
                    if newer_listed > 0 {
                        let label = self.label(actor);
                        self.log(format!(
                            "stale {label}@{at}: lists {newer_listed} entries of a newer owner"
                        ));
                        self.with(|w| w.stats.newer_entries_listed += newer_listed);
                    }
                    return Reached::Cleaned { removed };
                }
                Some(CleanupEffect::Done(CleanupOutcome::Failed)) | None => return Reached::Failed,
            }
        }
    }

    /// A machine's operation, performed for `actor`: its deletes are the
    /// actor's own (the oracle checks each against the actor's state).
    async fn perform_for(&self, actor: usize, op: BucketOp) -> BucketResult {
        match op {
            BucketOp::Delete { key } => {
                let actor = Some(actor);
                match self.req(Op::Delete { key, actor }).await {
                    Ok(_) => BucketResult::Done,
                    Err(e) => bucket_result(e),
                }
            }
            op => self.perform(op).await,
        }
    }

    /// Releases an actor the node holds: drives `ReleaseMachine`, then drops
    /// the claim whatever the outcome (one that did not release it is
    /// `maybe_held`).
    async fn release(&self, actor: usize) {
        let Some(claim) = self.claim(actor) else {
            return;
        };
        let n = self.n;
        let mut machine = self.with(|w| {
            let node = &w.nodes[n];
            ReleaseMachine::new(
                &node.name,
                node.mem.lease.epoch(),
                &w.actors[actor].root,
                claim.generation,
                w.rng.next_u64(),
            )
        });
        let mut released = false;
        while let Some(effect) = machine.poll_effect(self.acting_epoch()) {
            match effect {
                ReleaseEffect::Bucket(op) => {
                    let result = self.perform(op).await;
                    machine.on_result(result);
                }
                ReleaseEffect::Done(outcome) => {
                    if let ReleaseOutcome::Released { generation } = outcome {
                        released = true;
                        self.with(|w| w.stats.releases += 1);
                        let label = self.label(actor);
                        self.log(format!("releases {label} (g{generation})"));
                    }
                    break;
                }
            }
        }
        self.with(|w| {
            let mem = &mut w.nodes[n].mem;
            mem.claims.remove(&actor);
            if !released {
                mem.maybe_held.insert(actor);
            }
        });
    }

    fn retry_join_later(&self, actor: usize) {
        let me = self.clone();
        let n = self.n;
        self.with(|w| {
            w.spawn(
                n,
                Box::pin(async move {
                    sleep(&me.w, 5_000).await;
                    me.with(|w| w.push_work(me.n, Work::Join { actor }));
                }),
            )
        });
    }

    /// R4: upload an actor the node ran before joining, listing its alarm first.
    async fn join(&self, actor: usize) {
        let Some(local) = self.with(|w| w.nodes[self.n].durable.joins.get(&actor).cloned()) else {
            return;
        };
        match self.take(actor).await {
            Took::Mine => {}
            _ => return self.retry_join_later(actor),
        }
        let Some(claim) = self.claim(actor) else {
            return self.retry_join_later(actor);
        };
        let n = self.n;
        if claim.had_state {
            // The bucket has the actor (perhaps this node's own first upload,
            // landed late): the local copy is set aside, never uploaded over it.
            self.with(|w| {
                w.nodes[n].durable.joins.remove(&actor);
                w.stats.set_aside += 1;
            });
            let label = self.label(actor);
            self.log(format!(
                "sets its own copy of {label} aside: the bucket has it"
            ));
            return;
        }
        let (rules, address) = self.with(|w| (w.rules, w.actors[actor].address.clone()));
        let plan = plan_first_upload(rules, &address, local.alarm, claim.generation, self.nonce())
            .expect("simulated times fit the key");
        let state = ActorState {
            alarm: AlarmState {
                at_ms: local.alarm,
                indexed: plan.record,
                retry_count: 0,
            },
            init: true,
            cause: Cause::Join,
            version: 1,
            ..ActorState::default()
        };
        let label = self.label(actor);
        self.log(format!(
            "joins with {label}: alarm {:?} indexed {}",
            local.alarm,
            Entry::to_meta(plan.record.as_ref())
        ));
        let planned = Planned {
            list_before: plan.put_before_upload.map(|put| self.listing(actor, &put)),
            list_after: plan.put_after_upload.map(|put| self.listing(actor, &put)),
            remove_after: None,
        };
        if !self
            .upload_round(actor, claim.generation, planned, state, Round::Join)
            .await
        {
            return self.retry_join_later(actor);
        }
        self.with(|w| {
            w.nodes[n].durable.joins.remove(&actor);
            w.stats.joins += 1;
        });
        self.set_timer(actor, local.alarm);
    }
}

/// The lease loop: drives the node's `NodeLeaseMachine` (register, renew
/// every third of the period) and starts a new epoch when the machine says the
/// last one is over (lapsed, fenced).
pub async fn renew_loop(ctx: Ctx) {
    let n = ctx.n;
    loop {
        ask_release_when_left(&ctx);
        while let Some(effect) = ctx.with(|w| {
            let now = w.node_now(n);
            w.nodes[n].mem.lease.poll_effect(now)
        }) {
            match effect {
                LeaseEffect::Bucket(op) => {
                    let result = ctx.perform(op).await;
                    let now = ctx.now();
                    ctx.with(|w| w.nodes[n].mem.lease.on_result(result, now));
                }
                LeaseEffect::Detached(op) => {
                    let me = ctx.clone();
                    ctx.with(|w| {
                        w.spawn(
                            n,
                            Box::pin(async move {
                                let _ = me.perform(op).await;
                            }),
                        )
                    });
                }
                LeaseEffect::Renewed { .. } => {}
                LeaseEffect::EpochOver(end) => {
                    if end == EpochEnd::Fenced {
                        ctx.with(|w| w.stats.fenced_nodes += 1);
                    }
                    if ctx.with(|w| w.nodes[n].mem.leaving_since.is_some()) {
                        // A leaving node stops here, whatever ended its
                        // epoch (released, or lapsed meanwhile).
                        ctx.log(format!("lease over ({end:?}): the node has left"));
                        ctx.with(|w| {
                            let t = w.now + 1;
                            w.at(t, Ev::Sim(SimEv::Left(n)));
                        });
                        return;
                    }
                    ctx.new_epoch(end);
                }
            }
        }
        let (now, at, leaving) = ctx.with(|w| {
            let mem = &w.nodes[n].mem;
            (
                w.node_now(n),
                mem.lease.poll_timeout(),
                mem.leaving_since.is_some(),
            )
        });
        let at = at.expect("a running epoch always waits for a time");
        // At least one scheduling round, so that a timeout already due cannot
        // spin without time passing. A leaving node looks often whether it
        // may release its lease.
        let wait = at.saturating_sub(now);
        sleep(&ctx.w, if leaving { wait.min(100) } else { wait }).await;
        let (now, nonce) = ctx.with(|w| (w.node_now(n), w.rng.next_u64()));
        ctx.with(|w| w.nodes[n].mem.lease.handle_timeout(now, nonce));
    }
}

/// A leaving node whose actors are released (or that spent
/// [`LEAVE_RELEASE_MS`] on them) asks its lease machine to release the
/// lease: it stops acting at once and writes `released` next, so that
/// others take what it still holds without waiting for the lease to run
/// out. Called between the lease's own steps, never while one is in flight.
fn ask_release_when_left(ctx: &Ctx) {
    let n = ctx.n;
    let asked = ctx.with(|w| {
        let now = w.node_now(n);
        let mem = &w.nodes[n].mem;
        let ready = mem
            .leaving_since
            .is_some_and(|since| mem.claims.is_empty() || now >= since + LEAVE_RELEASE_MS);
        if !ready || mem.lease_release_asked {
            return None;
        }
        let held = mem.claims.len();
        let nonce = w.rng.next_u64();
        let mem = &mut w.nodes[n].mem;
        mem.lease_release_asked = true;
        mem.lease.release(now, nonce);
        Some(held)
    });
    if let Some(held) = asked {
        ctx.log(format!("releases its lease, {held} actors still held"));
    }
}

/// The sweep loop: every `alarm_sweep_ms`, read the overdue index and hand
/// this node's share to its timer.
pub async fn sweep_loop(ctx: Ctx) {
    let (first, every) = ctx.with(|w| (w.rng.range(0, w.cfg.alarm_sweep_ms), w.cfg.alarm_sweep_ms));
    sleep(&ctx.w, first).await;
    loop {
        let started = ctx.w.borrow().now;
        let leaving = ctx.with(|w| w.nodes[ctx.n].mem.leaving_since.is_some());
        let again_now = ctx.acting() && !leaving && sweep_once(&ctx).await;
        // Again at once (one scheduling round) when the cap bound and
        // deliveries got somewhere, else a sweep period after this pass
        // started (a pass waits for its deliveries), as the server does.
        let spent = ctx.w.borrow().now - started;
        let wait = if again_now {
            1
        } else {
            every.saturating_sub(spent).max(1)
        };
        sleep(&ctx.w, wait).await;
    }
}

/// One pass: who is live (through `NodeViewReader`), then the cluster's
/// `SweepMachine` over every app's index, the machine the server drives;
/// whether to sweep again at once.
async fn sweep_once(ctx: &Ctx) -> bool {
    let Some(mut live) = live_nodes(ctx).await else {
        return false;
    };
    if !ctx.acting() {
        return false;
    }
    let me = ctx.name();
    if !live.contains(&me) {
        live.push(me);
    }
    let n = ctx.n;
    ctx.with(|w| {
        w.stats.sweeps += 1;
        let now = w.node_now(n);
        let prefixes = w.apps.iter().map(|a| a.index_prefix.clone()).collect();
        let held = held_by_app(w, n);
        let rotation = w.rng.next_u64();
        w.nodes[n]
            .mem
            .sweep
            .start_pass(now, live, prefixes, held, rotation);
    });
    loop {
        match ctx.with(|w| w.nodes[n].mem.sweep.poll_effect()) {
            Some(SweepEffect::Bucket(op)) => {
                ctx.with(|w| w.stats.sweep_pages += 1);
                let result = ctx.perform(op).await;
                ctx.with(|w| w.nodes[n].mem.sweep.on_result(result));
            }
            Some(SweepEffect::Deliver(job)) => ctx.with(|w| offer(w, n, job)),
            Some(SweepEffect::Done(s)) => {
                ctx.with(|w| {
                    w.stats.sweep_passes += s.indexes_read as u64;
                    w.stats.entries_cap_bound += s.indexes_resumed as u64;
                    w.stats.deliveries_cap_bound += u64::from(s.deliveries_capped);
                });
                return s.again_now;
            }
            None => {
                let done = ctx.with(|w| std::mem::take(&mut w.nodes[n].mem.sweep_done));
                if done.is_empty() {
                    sleep(&ctx.w, 50).await;
                }
                let now = ctx.now();
                ctx.with(|w| {
                    for (job, report) in done {
                        w.nodes[n].mem.sweep.on_delivered(&job, &report, now);
                    }
                });
            }
        }
    }
}

/// The actors node `n` holds or may hold (its claims and `maybe_held`), by
/// app: the sweep counts their entries as its own whatever their shard, as
/// the server's does. With the tenant-wide index (`Options::shared_index`)
/// every app's prefix is that index, which the server gives every held
/// actor of the tenant.
fn held_by_app(w: &World, n: usize) -> Vec<BTreeSet<Address>> {
    let mut held = vec![BTreeSet::new(); w.apps.len()];
    if w.opts.sweep_ignores_holds {
        return held;
    }
    let mem = &w.nodes[n].mem;
    for &a in mem.claims.keys().chain(mem.maybe_held.iter()) {
        let actor = &w.actors[a];
        for (app, set) in held.iter_mut().enumerate() {
            if app == actor.app || w.opts.shared_index {
                set.insert(actor.address.clone());
            }
        }
    }
    held
}

/// The live nodes for the sweep's sharding: the cluster's `LiveNodes`, the
/// reader the server's sweep drives (one listing, a record read only for a
/// node whose newest record stopped changing), or, with
/// `Options::view_reads_every_node`, every node's record read on every pass
/// (the view before issue 41, kept to show what it costs).
async fn live_nodes(ctx: &Ctx) -> Option<Vec<String>> {
    let n = ctx.n;
    if ctx.w.borrow().opts.view_reads_every_node {
        return live_nodes_by_reading_each(ctx).await;
    }
    let now = ctx.now();
    ctx.with(|w| w.nodes[n].mem.live.start_pass(now));
    loop {
        match ctx.with(|w| w.nodes[n].mem.live.poll_effect())? {
            LiveNodesEffect::Bucket(op) => {
                let result = ctx.perform(op).await;
                ctx.with(|w| w.nodes[n].mem.live.on_result(result));
            }
            LiveNodesEffect::Detached(op) => {
                // Garbage of this node's earlier epochs: nothing waits on it.
                let _ = ctx.perform(op).await;
            }
            LiveNodesEffect::Done(live) => return live,
        }
    }
}

/// Every node's latest record read, one node after another.
async fn live_nodes_by_reading_each(ctx: &Ctx) -> Option<Vec<String>> {
    let keys = ctx.list_all(NODES_PREFIX.to_owned()).await?;
    let names: BTreeSet<String> = keys
        .iter()
        .filter_map(|k| LeaseKey::parse(NODES_PREFIX, k).ok())
        .map(|k| k.node)
        .collect();
    let me = ctx.name();
    let mut live = Vec::new();
    for name in names {
        if name != me
            && let Some(v) = ctx.node_view(&name).await
            && v.is_live()
        {
            live.push(name);
        }
    }
    Some(live)
}

/// Hands a sweep job to the worker, as a delivery to the actor of the job's
/// app with the entry's address (apps share class and actor names); a job
/// no actor has is reported at once.
fn offer(w: &mut World, n: usize, job: SweepJob) {
    let app = job.index;
    let Some(actor) = w
        .by_address
        .get(&job.key.address)
        .and_then(|v| v.iter().copied().find(|a| w.actors[*a].app == app))
    else {
        let mut report = DeliveryReport::default();
        report.add(Reached::Unaddressable);
        w.nodes[n].mem.sweep_done.push((job, report));
        return;
    };
    crate::sim::check_offer(w, &job.full_key, actor);
    w.stats.sweep_offers += 1;
    let name = w.nodes[n].name.clone();
    let label = w.actors[actor].label.clone();
    let at = job.key.entry.at_ms;
    w.log(format!("{name} sweep delivers {label}@{at}"));
    w.nodes[n].mem.in_flight.insert(actor);
    w.push_work(
        n,
        Work::Deliver {
            actor,
            at,
            sweep: Some(job),
        },
    );
}

/// The timer: hands due alarms to the worker, and idle actors to release.
pub async fn timer_loop(ctx: Ctx) {
    loop {
        sleep(&ctx.w, 100).await;
        let n = ctx.n;
        ctx.with(|w| {
            let now = w.node_now(n);
            let idle = w.opts.idle_ms;
            let mem = &mut w.nodes[n].mem;
            let due: Vec<(usize, u64)> = mem
                .timer
                .iter()
                .filter(|(_, at)| **at <= now)
                .map(|(a, t)| (*a, *t))
                .collect();
            let mut work = Vec::new();
            // A leaving node runs no more alarms: it releases the actors,
            // and their index entries bring the alarms to other nodes.
            let due = if mem.leaving_since.is_some() {
                Vec::new()
            } else {
                due
            };
            for (actor, at) in due {
                if mem.in_flight.insert(actor) {
                    mem.timer.remove(&actor);
                    work.push(Work::Deliver {
                        actor,
                        at,
                        sweep: None,
                    });
                }
            }
            // A leaving node releases every actor it holds, idle or not.
            let leaving = mem.leaving_since.is_some();
            let idle_actors: Vec<usize> = mem
                .claims
                .iter()
                .filter(|(a, c)| {
                    (leaving || c.last_used + idle <= now) && !mem.in_flight.contains(a)
                })
                .map(|(a, _)| *a)
                .collect();
            for actor in idle_actors {
                if mem.releasing.insert(actor) {
                    work.push(Work::Release { actor });
                }
            }
            for item in work {
                w.push_work(n, item);
            }
        });
    }
}

/// A worker: one piece of work at a time (a node runs
/// `Options::workers` of them, as the server runs many actors at once).
pub async fn worker(ctx: Ctx) {
    loop {
        let work = next_work(&ctx.w, ctx.n).await;
        let n = ctx.n;
        let actor = work.actor();
        match work {
            Work::Client { actor, op, hops } => ctx.client(actor, op, hops).await,
            Work::Deliver { actor, at, sweep } => {
                let reached = ctx.deliver(actor, at, sweep.is_some()).await;
                ctx.with(|w| {
                    let mem = &mut w.nodes[n].mem;
                    mem.in_flight.remove(&actor);
                    if let Some(job) = sweep {
                        let mut report = DeliveryReport::default();
                        report.add(reached);
                        mem.sweep_done.push((job, report));
                    }
                });
            }
            Work::Join { actor } => ctx.join(actor).await,
            Work::Release { actor } => {
                let (idle, now) = (ctx.w.borrow().opts.idle_ms, ctx.now());
                let leaving = ctx.with(|w| w.nodes[n].mem.leaving_since.is_some());
                if ctx
                    .claim(actor)
                    .is_some_and(|c| leaving || c.last_used + idle <= now)
                {
                    ctx.release(actor).await;
                }
                ctx.with(|w| w.nodes[n].mem.releasing.remove(&actor));
            }
        }
        ctx.with(|w| w.work_done(n, actor));
    }
}
