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
//! alarm steps (`deliver`, `stale`, `run_event`, `join`, `sweep_once`) are
//! still sequenced here, calling the pure rules of `alarm_index` and `sweep`;
//! they are the next to move into machines.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use wasmkeep_cluster::alarm_index::{
    self, AlarmState, Delivery, StaleContext, StaleStep, plan_delivery, plan_event,
    plan_first_upload,
};
use wasmkeep_cluster::lease::{LeaseKey, NODES_PREFIX, NodeLeaseView};
use wasmkeep_cluster::machine::{
    BucketOp, BucketResult, EpochEnd, LeaseEffect, NodeLeaseMachine, NodeViewEffect,
    NodeViewReader, ReleaseEffect, ReleaseMachine, ReleaseOutcome, TakeEffect, TakeMachine,
    TakeOutcome, TakeStep,
};
use wasmkeep_cluster::sweep::{SweepInput, TimerMerge, merge_timer, plan_sweep};
use wasmkeep_cluster::{ClusterConfig, Entry, IndexKey};

use crate::sim::SimEv;
use crate::world::{Ev, Never, Op, ReqErr, Resp, Shared, World, next_work, request, sleep};

/// Aimed re-arms sent with each aimed pause, and how long before the stall
/// ends each is sent (lowest, highest): the newer owner's take, handler and
/// upload land just before the stalled owner resumes, while its `on-alarm`
/// run for that past time (up to a handler's time) has not committed yet.
const REARMS: u64 = 3;
const REARM_BEFORE_MS: (u64, u64) = (500, 6_000);

/// One actor's database, as far as the cluster protocol sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ActorState {
    /// The alarm, `alarm_indexed` and the failure count.
    pub alarm: AlarmState,
    /// Events committed.
    pub version: u64,
    /// `owner_fence`: the generation of the last owner that fenced.
    pub fence: u64,
    /// Who wrote this version (node, generation, nonce): every body differs.
    pub writer: String,
}

impl ActorState {
    /// The body of a `log/<seq>` entry.
    pub fn encode(&self) -> String {
        let at = self.alarm.at_ms.map_or("-".to_owned(), |t| t.to_string());
        format!(
            "alarm={at};indexed={};retry={};version={};fence={};writer={}",
            Entry::to_meta(self.alarm.indexed.as_ref()),
            self.alarm.retry_count,
            self.version,
            self.fence,
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
                "version" => s.version = v.parse().ok()?,
                "fence" => s.fence = v.parse().ok()?,
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
}

/// Work for a node's worker, one at a time (turns are serial).
#[derive(Clone, Debug)]
pub enum Work {
    /// A client request.
    Client {
        actor: usize,
        op: ClientOp,
        hops: u8,
    },
    /// An alarm delivery for the entry at `at`.
    Deliver { actor: usize, at: u64 },
    /// Upload an actor from before joining.
    Join { actor: usize },
    /// Release an idle actor.
    Release { actor: usize },
}

/// What a node keeps in memory; a crash loses it.
pub struct Mem {
    /// The node's own lease, for this start.
    pub lease: NodeLeaseMachine,
    /// Restored actors.
    pub claims: BTreeMap<usize, Claim>,
    /// The in-memory timer: one time per actor.
    pub timer: BTreeMap<usize, u64>,
    /// Work not yet started.
    pub queue: VecDeque<Work>,
    /// The worker task, when it waits for work.
    pub worker_waiting: Option<u64>,
    /// Actors with a delivery queued or running.
    pub in_flight: BTreeSet<usize>,
    /// Actors with a release queued.
    pub releasing: BTreeSet<usize>,
    /// The sweep's cursor.
    pub cursor: wasmkeep_cluster::sweep::SweepCursor,
}

/// The address a simulated node advertises in its lease records (nothing
/// reaches it there: the simulator routes by node index).
fn sim_address(name: &str) -> String {
    format!("sim://{name}")
}

impl Mem {
    /// Fresh memory for a start in `epoch`.
    pub fn new(name: &str, epoch: u64, cfg: &ClusterConfig) -> Mem {
        Mem {
            lease: NodeLeaseMachine::new(name, epoch, &sim_address(name), cfg.clone())
                .expect("simulated node ids are valid"),
            claims: BTreeMap::new(),
            timer: BTreeMap::new(),
            queue: VecDeque::new(),
            worker_waiting: None,
            in_flight: BTreeSet::new(),
            releasing: BTreeSet::new(),
            cursor: Default::default(),
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

    async fn get(&self, key: String) -> Result<String, ReqErr> {
        match self.req(Op::Get { key }).await {
            Ok(Resp::Body(b)) => Ok(b),
            Ok(_) => Err(ReqErr::Unavailable),
            Err(e) => Err(e),
        }
    }

    async fn put(&self, key: String, body: String, create_only: bool) -> Result<(), ReqErr> {
        self.req(Op::Put {
            key,
            body,
            create_only,
        })
        .await
        .map(|_| ())
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
        let had = self.with(|w| w.nodes[n].mem.claims.remove(&actor).is_some());
        if had {
            self.with(|w| w.stats.give_ups += 1);
            self.log(format!("gives up a{actor}: {why}"));
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

    fn index_key(&self, key: &IndexKey) -> String {
        format!("{}{}", self.w.borrow().opts.index_prefix, key.to_key())
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
        let op = match op {
            BucketOp::PutCreate { key, body } => Op::Put {
                key,
                body: String::from_utf8(body).expect("protocol records are text"),
                create_only: true,
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
            BucketOp::Delete { key } => Op::Delete { key },
        };
        match self.req(op).await {
            Ok(Resp::Done) => BucketResult::Done,
            Ok(Resp::Body(b)) => BucketResult::Body(b.into_bytes()),
            Ok(Resp::Keys(k)) => BucketResult::Keys(k),
            Err(ReqErr::AlreadyExists) => BucketResult::AlreadyExists,
            Err(ReqErr::NotFound) => BucketResult::NotFound,
            Err(ReqErr::Unavailable | ReqErr::Timeout) => BucketResult::Failed,
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
        let mut machine = self.with(|w| {
            let node = &w.nodes[n];
            let loaded = node.mem.claims.get(&actor).map(|c| c.generation);
            TakeMachine::new(
                &node.name,
                node.mem.lease.epoch(),
                &w.actors[actor].root,
                loaded,
                w.rng.next_u64(),
                w.cfg.clone(),
            )
        });
        loop {
            let Some(effect) = machine.poll_effect(self.acting_epoch()) else {
                debug_assert!(false, "the take waits for nothing");
                return Took::Failed;
            };
            match effect {
                TakeEffect::Bucket(op) => {
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
                            idx.map_or(Took::Failed, Took::Forward)
                        }
                        TakeOutcome::Failed(_) => Took::Failed,
                    };
                }
            }
        }
    }

    /// The restore a take asks for: the latest chain entry becomes the claim
    /// (the simulated chain has no snapshots; each entry is the whole state).
    async fn restore(&self, actor: usize, generation: u64, takeover: bool) -> bool {
        let root = self.root(actor);
        let Some(logs) = self.list(format!("{root}log/"), None, usize::MAX).await else {
            self.log(format!("took a{actor} g{generation} but cannot restore"));
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
            "takes a{actor} g{generation}{} at seq {seq:?}: alarm {:?} indexed {}",
            if takeover { " (takeover)" } else { "" },
            state.alarm.at_ms,
            Entry::to_meta(state.alarm.indexed.as_ref())
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
        };
        let n = self.n;
        self.with(|w| {
            w.nodes[n].mem.claims.insert(actor, claim);
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
        match self.put(key, state.encode(), true).await {
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

    /// One event: ADR 0009's owner rule around replication.
    async fn run_event(&self, actor: usize, alarm_after: Option<u64>, retry_count: u32) -> bool {
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
        if let Some(put) = &plan.put_before_upload {
            self.step("event: list the new alarm").await;
            if !self.owner_ok(actor, claim.generation) {
                self.give_up(actor, "lease not valid before the index put");
                return false;
            }
            if let Err(e) = self
                .put(self.index_key(&put.key), String::new(), put.create_only)
                .await
            {
                self.give_up(actor, &format!("index put failed: {e:?}"));
                return false;
            }
        }
        self.step("event: replicate").await;
        let state = ActorState {
            alarm: AlarmState {
                at_ms: alarm_after,
                indexed: plan.record,
                retry_count,
            },
            version: claim.state.version + 1,
            ..claim.state.clone()
        };
        if !self.upload(actor, state).await {
            return false;
        }
        self.set_timer(actor, alarm_after);
        if let Some(old) = &plan.delete_after_upload {
            self.step("event: remove the replaced entry").await;
            if self.owner_ok(actor, claim.generation) {
                let _ = self
                    .req(Op::Delete {
                        key: self.index_key(old),
                    })
                    .await;
            }
        }
        true
    }

    async fn client(&self, actor: usize, op: ClientOp, hops: u8) {
        match self.take(actor).await {
            Took::Mine => {}
            Took::Forward(node) => {
                let up = self.w.borrow().nodes[node].up;
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
            ClientOp::Clear => (None, 0),
            ClientOp::Touch => (before.at_ms, before.retry_count),
        };
        self.log(format!(
            "event on a{actor}: {op:?} alarm {:?} -> {after:?}",
            before.at_ms
        ));
        self.handler_time().await;
        self.run_event(actor, after, retry).await;
    }

    async fn deliver(&self, actor: usize, at: u64) {
        match self.take(actor).await {
            Took::Mine => {}
            Took::Forward(_) => {
                // The owner has the alarm, committed and indexed.
                self.log(format!("drops delivery of a{actor}@{at}: owned elsewhere"));
                return;
            }
            Took::Failed => {
                let retry = self.now() + self.w.borrow().cfg.lease_period_ms;
                let n = self.n;
                self.with(|w| {
                    w.nodes[n].mem.timer.entry(actor).or_insert(retry);
                });
                return;
            }
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
        });
        match plan_delivery(at, claim.state.alarm.at_ms, now) {
            Delivery::Run => {
                // Checked against simulated time, not the node's clock: a clock
                // that runs behind may deliver late, never early.
                let true_now = self.w.borrow().now;
                if at > true_now {
                    let name = self.name();
                    self.with(|w| {
                        w.violate(
                            "early-delivery",
                            format!("{name} ran a{actor}'s alarm due {at} at {true_now}"),
                        )
                    });
                    return;
                }
                let fail = self.chance(|o| o.p_handler_fail);
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
                self.handler_time().await;
                let cfg = self.w.borrow().cfg.clone();
                let out = wasmkeep_cluster::retry::after_alarm_run(
                    &wasmkeep_cluster::retry::RetryPolicy::from_config(&cfg),
                    !fail,
                    left,
                    claim.state.alarm.retry_count,
                    now,
                );
                self.log(format!(
                    "runs on-alarm a{actor}@{at} ({}) -> alarm {:?} retry {}",
                    if fail { "fails" } else { "ok" },
                    out.at_ms,
                    out.retry_count
                ));
                self.with(|w| {
                    w.stats.alarm_runs += 1;
                    if fail {
                        w.stats.alarm_failures += 1;
                    }
                });
                if self.run_event(actor, out.at_ms, out.retry_count).await {
                    self.with(|w| w.stats.alarms += 1);
                }
            }
            Delivery::NotDue { at_ms } => self.set_timer(actor, Some(at_ms)),
            Delivery::Stale => self.stale(actor, at).await,
        }
    }

    /// Removes the actor's entries at a time the committed alarm no longer has.
    async fn stale(&self, actor: usize, at: u64) {
        loop {
            let Some(claim) = self.claim(actor) else {
                return;
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
            self.log(format!("stale a{actor}@{at}: {step:?}"));
            match step {
                StaleStep::IndexCommitted => {
                    let a = claim.state.alarm;
                    if !self.run_event(actor, a.at_ms, a.retry_count).await {
                        return;
                    }
                }
                StaleStep::Fence => {
                    self.step("stale: owner_fence").await;
                    let state = ActorState {
                        fence: claim.generation,
                        version: claim.state.version + 1,
                        ..claim.state
                    };
                    if !self.upload(actor, state).await {
                        return;
                    }
                    self.with(|w| w.stats.owner_fences += 1);
                }
                StaleStep::ListAndDelete => {
                    if !self.owner_ok(actor, claim.generation) {
                        return;
                    }
                    self.pause_point(actor, at).await;
                    let (prefix, address) = self
                        .with(|w| (w.opts.index_prefix.clone(), w.actors[actor].address.clone()));
                    let folder = format!("{prefix}{}", alarm_index::tagged_folder(at, &address));
                    let Some(keys) = self.list(folder, None, usize::MAX).await else {
                        return;
                    };
                    let rel: Vec<String> =
                        keys.iter().map(|k| k[prefix.len()..].to_owned()).collect();
                    let newer = rel
                        .iter()
                        .filter_map(|k| IndexKey::parse(k).ok())
                        .filter(|k| k.entry.generation() > claim.generation)
                        .count() as u64;
                    if newer > 0 {
                        self.log(format!(
                            "stale a{actor}@{at}: lists {newer} entries of a newer owner"
                        ));
                        self.with(|w| w.stats.newer_entries_listed += newer);
                    }
                    let doomed = alarm_index::stale_entries_to_delete(
                        rules,
                        &address,
                        at,
                        &rel,
                        claim.state.alarm.indexed.as_ref(),
                        claim.generation,
                    );
                    for k in doomed {
                        let key = self.index_key(&k);
                        if self.w.borrow().bucket.contains_key(&key) {
                            self.with(|w| w.stats.stale_deleted += 1);
                        }
                        let _ = self.req(Op::Delete { key }).await;
                    }
                    return;
                }
                StaleStep::LeaveAndRelease { retry_at_ms } => {
                    self.with(|w| w.stats.left_on_empty_bucket += 1);
                    self.set_timer(actor, Some(retry_at_ms));
                    self.release(actor).await;
                    return;
                }
            }
        }
    }

    /// Releases an actor the node holds: drives `ReleaseMachine`, then drops
    /// the claim whatever the outcome.
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
        while let Some(effect) = machine.poll_effect(self.acting_epoch()) {
            match effect {
                ReleaseEffect::Bucket(op) => {
                    let result = self.perform(op).await;
                    machine.on_result(result);
                }
                ReleaseEffect::Done(outcome) => {
                    if let ReleaseOutcome::Released { generation } = outcome {
                        self.with(|w| w.stats.releases += 1);
                        self.log(format!("releases a{actor} (g{generation})"));
                    }
                    break;
                }
            }
        }
        self.with(|w| w.nodes[n].mem.claims.remove(&actor));
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
            self.log(format!(
                "sets its own copy of a{actor} aside: the bucket has it"
            ));
            return;
        }
        let (rules, address) = self.with(|w| (w.rules, w.actors[actor].address.clone()));
        let plan = plan_first_upload(rules, &address, local.alarm, claim.generation, self.nonce())
            .expect("simulated times fit the key");
        if let Some(put) = &plan.put_before_upload {
            self.step("join: list the alarm").await;
            if !self.owner_ok(actor, claim.generation)
                || self
                    .put(self.index_key(&put.key), String::new(), put.create_only)
                    .await
                    .is_err()
            {
                self.give_up(actor, "join: index put failed");
                return self.retry_join_later(actor);
            }
        }
        self.step("join: first upload").await;
        if self.chance(|o| o.p_aim_join) {
            let (late, cut) =
                self.with(|w| (w.rng.range(40_000, 90_000), w.rng.range(30_000, 60_000)));
            self.with(|w| w.nodes[n].aim_first_upload = Some((late, cut)));
        }
        let state = ActorState {
            alarm: AlarmState {
                at_ms: local.alarm,
                indexed: plan.record,
                retry_count: 0,
            },
            version: 1,
            ..ActorState::default()
        };
        self.log(format!(
            "joins with a{actor}: alarm {:?} indexed {}",
            local.alarm,
            Entry::to_meta(plan.record.as_ref())
        ));
        if !self.upload(actor, state).await {
            return self.retry_join_later(actor);
        }
        if let Some(put) = &plan.put_after_upload {
            self.step("join: list the alarm after the upload").await;
            let _ = self
                .put(self.index_key(&put.key), String::new(), put.create_only)
                .await;
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
                    ctx.new_epoch(end);
                }
            }
        }
        let (now, at) = ctx.with(|w| (w.node_now(n), w.nodes[n].mem.lease.poll_timeout()));
        let at = at.expect("a running epoch always waits for a time");
        // At least one scheduling round, so that a timeout already due cannot
        // spin without time passing.
        sleep(&ctx.w, at.saturating_sub(now)).await;
        let (now, nonce) = ctx.with(|w| (w.node_now(n), w.rng.next_u64()));
        ctx.with(|w| w.nodes[n].mem.lease.handle_timeout(now, nonce));
    }
}

/// The sweep loop: every `alarm_sweep_ms`, read the overdue index and hand
/// this node's share to its timer.
pub async fn sweep_loop(ctx: Ctx) {
    let (first, every) = ctx.with(|w| (w.rng.range(0, w.cfg.alarm_sweep_ms), w.cfg.alarm_sweep_ms));
    sleep(&ctx.w, first).await;
    loop {
        if ctx.acting() {
            sweep_once(&ctx).await;
        }
        sleep(&ctx.w, every).await;
    }
}

async fn sweep_once(ctx: &Ctx) {
    let Some(keys) = ctx.list(NODES_PREFIX.to_owned(), None, usize::MAX).await else {
        return;
    };
    let names: BTreeSet<String> = keys
        .iter()
        .filter_map(|k| LeaseKey::parse(NODES_PREFIX, k).ok())
        .map(|k| k.node)
        .collect();
    let me = ctx.name();
    let mut live = Vec::new();
    for name in names {
        if name == me {
            continue;
        }
        if let Some(v) = ctx.node_view(&name).await
            && v.is_live()
        {
            live.push(name);
        }
    }
    if !ctx.acting() {
        return;
    }
    live.push(me.clone());
    live.sort();
    let n = ctx.n;
    let (request, prefix, cfg) = ctx.with(|w| {
        (
            w.nodes[n].mem.cursor.request(&w.cfg),
            w.opts.index_prefix.clone(),
            w.cfg.clone(),
        )
    });
    let start_after = request.start_after.map(|s| format!("{prefix}{s}"));
    let Some(keys) = ctx.list(prefix.clone(), start_after, request.limit).await else {
        return;
    };
    let rel: Vec<String> = keys.iter().map(|k| k[prefix.len()..].to_owned()).collect();
    ctx.with(|w| {
        let now = w.node_now(n);
        let pass = w.nodes[n].mem.cursor.on_listed(&rel, now, &cfg);
        let busy: BTreeSet<wasmkeep_cluster::Address> = w.nodes[n]
            .mem
            .in_flight
            .iter()
            .map(|a| w.actors[*a].address.clone())
            .collect();
        let rotation = w.rng.next_u64();
        let input = SweepInput {
            entries: &pass.entries,
            me: &me,
            live_nodes: &live,
            busy: &busy,
            rotation,
            now_ms: now,
        };
        let plan = plan_sweep(&input, &cfg);
        w.stats.sweeps += 1;
        for e in plan {
            let Some(actor) = w.actors.iter().position(|a| a.address == e.address) else {
                continue;
            };
            let held = w.nodes[n].mem.timer.get(&actor).copied();
            if merge_timer(held, e.entry.at_ms, now, &cfg) == TimerMerge::TakeOffered {
                w.nodes[n].mem.timer.insert(actor, e.entry.at_ms);
                w.stats.sweep_offers += 1;
                let name = w.nodes[n].name.clone();
                w.log(format!("{name} sweep offers a{actor}@{}", e.entry.at_ms));
            }
        }
    });
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
            for (actor, at) in due {
                if mem.in_flight.insert(actor) {
                    mem.timer.remove(&actor);
                    work.push(Work::Deliver { actor, at });
                }
            }
            let idle_actors: Vec<usize> = mem
                .claims
                .iter()
                .filter(|(a, c)| c.last_used + idle <= now && !mem.in_flight.contains(a))
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

/// The worker: one piece of work at a time.
pub async fn worker(ctx: Ctx) {
    loop {
        let work = next_work(&ctx.w, ctx.n).await;
        let n = ctx.n;
        match work {
            Work::Client { actor, op, hops } => ctx.client(actor, op, hops).await,
            Work::Deliver { actor, at } => {
                ctx.deliver(actor, at).await;
                ctx.with(|w| w.nodes[n].mem.in_flight.remove(&actor));
            }
            Work::Join { actor } => ctx.join(actor).await,
            Work::Release { actor } => {
                let (idle, now) = (ctx.w.borrow().opts.idle_ms, ctx.now());
                if ctx.claim(actor).is_some_and(|c| c.last_used + idle <= now) {
                    ctx.release(actor).await;
                }
                ctx.with(|w| w.nodes[n].mem.releasing.remove(&actor));
            }
        }
    }
}
