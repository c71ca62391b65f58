//! The deterministic world: a discrete-event scheduler, a bucket, a network
//! with faults, and a tiny executor for the nodes' async code.
//!
//! The bucket answers a LIST with one page at most (`list_page_keys_max` of
//! the run's configuration; the client continues with `start_after`), and a
//! listing of an alarm index may miss an entry written within the run's
//! listing lag (S3's listings were eventually consistent before 2020; other
//! stores' still may be). Holds, leases and chains list consistently: the
//! ownership protocol (ADR 0020) relies on read-after-write listings.
//!
//! Everything happens in one thread, in the order of (time, sequence number)
//! of scheduled events, and every random choice comes from one seeded
//! generator, so a seed names one run. Node code is written as ordinary
//! `async fn`s; a node crash drops its futures wherever they are waiting, which
//! is how "a crash at every step" comes for free, while its requests already on
//! the network still land.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use wasmkeep_cluster::{Address, ClusterConfig, IndexKey, Rules};

use crate::cost::{Cost, Kind};
use crate::node::{Durable, Mem, Work};
use crate::rng::Rng;
use crate::sim::{ActorInfo, AppInfo, Options, Stats, Violation};

/// A node's future.
pub type Task = Pin<Box<dyn Future<Output = ()>>>;

/// A request to the bucket.
#[derive(Clone, Debug)]
pub enum Op {
    /// A PUT; create-only (`If-None-Match: *`) or overwriting. `actor` is
    /// the actor the node writes for (none for ownership records): the
    /// simulator's bookkeeping, not part of the request.
    Put {
        key: String,
        body: String,
        create_only: bool,
        actor: Option<usize>,
    },
    /// A GET.
    Get { key: String },
    /// A listing in key order: keys under `prefix`, after `start_after`, at
    /// most `limit` and at most one page.
    List {
        prefix: String,
        start_after: Option<String>,
        limit: usize,
    },
    /// A DELETE by path, without any precondition (as object_store sends it).
    /// `actor`: the actor the node removes an entry for, as for a PUT.
    Delete { key: String, actor: Option<usize> },
}

impl Op {
    fn describe(&self) -> String {
        match self {
            Op::Put {
                key, create_only, ..
            } => format!("put{} {key}", if *create_only { "-create" } else { "" }),
            Op::Get { key } => format!("get {key}"),
            Op::List {
                prefix,
                start_after,
                ..
            } => format!("list {prefix} after={start_after:?}"),
            Op::Delete { key, .. } => format!("delete {key}"),
        }
    }
}

/// A successful answer.
#[derive(Clone, Debug)]
pub enum Resp {
    /// A write or delete took effect.
    Done,
    /// A GET's body.
    Body(String),
    /// A listing.
    Keys(Vec<String>),
}

/// A failed request, as the client sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReqErr {
    /// A create-only PUT found the key taken.
    AlreadyExists,
    /// A GET found nothing.
    NotFound,
    /// The store answered with an error (nothing was applied), or the node is
    /// cut off from the bucket.
    Unavailable,
    /// No answer before the client's deadline; the request may still land.
    Timeout,
}

/// Scheduled events.
#[derive(Debug)]
pub enum Ev {
    /// Poll a task.
    Wake(u64),
    /// A request reaches the bucket.
    Land(u64),
    /// A response reaches its client.
    Respond(u64, Result<Resp, ReqErr>),
    /// A request's client deadline.
    Deadline(u64),
    /// A simulator event (faults, client requests, checks).
    Sim(crate::sim::SimEv),
}

struct Scheduled {
    time: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.time, self.seq) == (o.time, o.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, o: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap and the earliest event goes first.
        (o.time, o.seq).cmp(&(self.time, self.seq))
    }
}

struct InFlight {
    node: usize,
    op: Op,
    fail: bool,
    lose_response: bool,
}

struct Reply {
    task: u64,
    result: Option<Result<Resp, ReqErr>>,
}

/// One node: its durable data, its memory (lost on a crash) and its faults.
pub struct Node {
    /// The node id.
    pub name: String,
    /// Running (not crashed, and started).
    pub up: bool,
    /// New requests fail until then: the node is cut off from the bucket.
    pub cut_until: u64,
    /// The node's tasks are not polled until then (a process pause).
    pub stall_until: u64,
    /// What survives a crash: its epoch counter and local data.
    pub durable: Durable,
    /// What a crash loses.
    pub mem: Mem,
    /// The node's clock runs this far behind simulated time (a clock fault).
    pub clock_behind: u64,
    /// Aimed fault: the next upload of a first snapshot lands this late and
    /// the node is cut off this long right after sending it.
    pub aim_first_upload: Option<(u64, u64)>,
    /// Aimed fault: the node's next upload lands this late and the node is
    /// cut off this long right after sending it (set for an upload that
    /// names a new entry already due, `p_aim_new_entry`).
    pub aim_upload: Option<(u64, u64)>,
}

/// The trace: every event's line is hashed; lines are kept on request.
#[derive(Default)]
pub struct Trace {
    /// Keep lines.
    pub keep: bool,
    /// The kept lines.
    pub lines: Vec<String>,
    /// FNV-1a over every line.
    pub hash: u64,
    /// Lines hashed.
    pub count: u64,
}

impl Trace {
    fn add(&mut self, line: String) {
        if self.count == 0 {
            self.hash = 0xcbf2_9ce4_8422_2325;
        }
        for b in line.as_bytes().iter().chain(b"\n") {
            self.hash ^= u64::from(*b);
            self.hash = self.hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.count += 1;
        if self.keep {
            self.lines.push(line);
        }
    }
}

/// The shared world.
pub struct World {
    /// Simulated time in milliseconds.
    pub now: u64,
    seq: u64,
    queue: BinaryHeap<Scheduled>,
    /// The run's random numbers.
    pub rng: Rng,
    /// When nodes leave cleanly: a generator of its own, so that a run
    /// before its first leave is the run it was before leaves were modelled.
    pub leave_rng: Rng,
    /// Protocol configuration.
    pub cfg: ClusterConfig,
    /// Run options.
    pub opts: Options,
    /// The rules the nodes follow.
    pub rules: Rules,
    /// The bucket: key to body.
    pub bucket: BTreeMap<String, String>,
    /// The nodes.
    pub nodes: Vec<Node>,
    /// The actors.
    pub actors: Vec<ActorInfo>,
    /// The apps (of tenant `t1`) the actors belong to.
    pub apps: Vec<AppInfo>,
    /// Actors by their root folder (`state/t1/<app>/<class>/<name hex>/`).
    pub by_root: BTreeMap<String, usize>,
    /// Actors by address: one per app at most, since apps share class and
    /// actor names.
    pub by_address: BTreeMap<Address, Vec<usize>>,
    /// Actors whose chain or index entries changed since the last check.
    pub dirty: BTreeSet<usize>,
    /// Actors the bucket has a chain for.
    pub in_bucket: BTreeSet<usize>,
    /// The actor whose node wrote each index entry still in the bucket.
    pub index_writer: BTreeMap<String, usize>,
    /// Index entries a listing does not show yet (the listing lag), with the
    /// time from which it does.
    pub unlisted_until: BTreeMap<String, u64>,
    /// The run's listing lag: an index entry shows in listings at most this
    /// long after it landed.
    pub list_lag_ms: u64,
    in_flight: BTreeMap<u64, InFlight>,
    replies: BTreeMap<u64, Reply>,
    next_req: u64,
    current_task: Option<u64>,
    spawns: Vec<(usize, Task)>,
    crash_now: Option<usize>,
    /// Whether faults are still being injected.
    pub faults_on: bool,
    /// Counters for the report.
    pub stats: Stats,
    /// The trace.
    pub trace: Trace,
    /// The first invariant broken, if any.
    pub violation: Option<Violation>,
    /// What the nodes asked of the bucket.
    pub cost: Cost,
}

/// A handle node code holds on the world.
pub type Shared = Rc<RefCell<World>>;

impl World {
    /// An empty world.
    pub fn new(opts: Options, cfg: ClusterConfig) -> World {
        World {
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            rng: Rng::new(opts.seed),
            leave_rng: Rng::new(opts.seed ^ 0x6c65_6176_6573),
            cfg,
            rules: Rules::with(opts.variant),
            trace: Trace {
                keep: opts.trace,
                ..Trace::default()
            },
            opts,
            bucket: BTreeMap::new(),
            nodes: Vec::new(),
            actors: Vec::new(),
            apps: Vec::new(),
            by_root: BTreeMap::new(),
            by_address: BTreeMap::new(),
            dirty: BTreeSet::new(),
            in_bucket: BTreeSet::new(),
            index_writer: BTreeMap::new(),
            unlisted_until: BTreeMap::new(),
            list_lag_ms: 0,
            in_flight: BTreeMap::new(),
            replies: BTreeMap::new(),
            next_req: 0,
            current_task: None,
            spawns: Vec::new(),
            crash_now: None,
            faults_on: true,
            stats: Stats::default(),
            violation: None,
            cost: Cost::default(),
        }
    }

    /// A node's own clock: what every decision of that node is based on.
    pub fn node_now(&self, node: usize) -> u64 {
        self.now.saturating_sub(self.nodes[node].clock_behind)
    }

    /// Schedules an event.
    pub fn at(&mut self, time: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Scheduled {
            time: time.max(self.now),
            seq: self.seq,
            ev,
        });
    }

    /// Adds a trace line stamped with the time.
    pub fn log(&mut self, line: impl AsRef<str>) {
        let line = format!("{:>9} {}", self.now, line.as_ref());
        self.trace.add(line);
    }

    /// Records the first violation and stops the run.
    pub fn violate(&mut self, kind: &'static str, detail: String) {
        if self.violation.is_none() {
            self.log(format!("VIOLATION {kind}: {detail}"));
            self.violation = Some(Violation {
                time_ms: self.now,
                kind,
                detail,
            });
        }
    }

    /// Queues a task for the executor.
    pub fn spawn(&mut self, node: usize, task: Task) {
        self.spawns.push((node, task));
    }

    /// Crashes `node` as soon as the current poll returns.
    pub fn crash_after_poll(&mut self, node: usize) {
        self.crash_now = Some(node);
    }

    /// Puts work on a node's queue and wakes its worker.
    pub fn push_work(&mut self, node: usize, work: Work) {
        self.nodes[node].mem.queue.push_back(work);
        self.wake_workers(node);
    }

    /// A worker of `node` finished its work for `actor`: work queued for
    /// that actor may start.
    pub fn work_done(&mut self, node: usize, actor: usize) {
        let mem = &mut self.nodes[node].mem;
        mem.busy.remove(&actor);
        if !mem.queue.is_empty() {
            self.wake_workers(node);
        }
    }

    /// Wakes the node's waiting workers (each looks for work it may start).
    fn wake_workers(&mut self, node: usize) {
        for t in std::mem::take(&mut self.nodes[node].mem.worker_waiting) {
            self.at(self.now, Ev::Wake(t));
        }
    }

    fn send(&mut self, node: usize, op: Op) -> u64 {
        let id = self.next_req;
        self.next_req += 1;
        let task = self.current_task.expect("requests are sent from tasks");
        self.replies.insert(id, Reply { task, result: None });
        self.stats.requests += 1;
        let (kind, key) = match &op {
            Op::Put { key, .. } => (Kind::Put, key),
            Op::Get { key } => (Kind::Get, key),
            Op::List { prefix, .. } => (Kind::List, prefix),
            Op::Delete { key, .. } => (Kind::Delete, key),
        };
        self.cost.count(self.now, kind, key);
        let deadline = self.opts.request_deadline_ms;
        self.at(self.now + deadline, Ev::Deadline(id));
        if self.nodes[node].cut_until > self.now {
            self.at(self.now + 1, Ev::Respond(id, Err(ReqErr::Unavailable)));
            return id;
        }
        let faults = self.faults_on;
        let o = &self.opts;
        let (p_err, p_lost, p_late, p_del_late) =
            (o.p_error, o.p_lost_response, o.p_late, o.p_delete_late);
        let fail = faults && self.rng.chance(p_err);
        let lose_response = faults && !fail && self.rng.chance(p_lost);
        let mut delay = self.rng.range(1, 10);
        if faults && self.rng.chance(p_late) {
            delay = self.rng.range(2_000, 40_000);
        }
        if faults && matches!(op, Op::Delete { .. }) && self.rng.chance(p_del_late) {
            delay = self.rng.range(5_000, 60_000);
        }
        let upload = matches!(&op, Op::Put { key, .. } if key.contains("/log/"));
        let first_upload =
            matches!(&op, Op::Put { key, .. } if key.contains("/log/00000000000000000000"));
        let aimed = if upload {
            self.nodes[node].aim_upload.take()
        } else {
            None
        };
        if let Some((late, cut)) = aimed {
            delay = late;
            self.nodes[node].cut_until = self.now + cut;
            self.stats.aimed_new_entry_faults += 1;
            self.log(format!(
                "{} FAULT aimed: upload naming a new entry lands in {late} ms, cut off {cut} ms",
                self.nodes[node].name
            ));
        } else if first_upload {
            if let Some((late, cut)) = self.nodes[node].aim_first_upload.take() {
                delay = late;
                self.nodes[node].cut_until = self.now + cut;
                self.stats.aimed_join_faults += 1;
                self.log(format!(
                    "{} FAULT aimed: first upload lands in {late} ms, cut off {cut} ms",
                    self.nodes[node].name
                ));
            }
        } else if upload && faults && self.rng.chance(self.opts.p_aim_upload) {
            // A partition right after an upload left: the node loses the
            // bucket (and so its lease), and the upload is delivered late.
            let late = self.rng.range(20_000, 60_000);
            let cut = self.rng.range(20_000, 45_000);
            delay = late;
            self.nodes[node].cut_until = self.now + cut;
            self.stats.aimed_upload_faults += 1;
            self.log(format!(
                "{} FAULT aimed: upload lands in {late} ms, cut off {cut} ms",
                self.nodes[node].name
            ));
        }
        if delay > 1_000 {
            self.log(format!(
                "{} late request ({delay} ms): {}",
                self.nodes[node].name,
                op.describe()
            ));
        }
        self.in_flight.insert(
            id,
            InFlight {
                node,
                op,
                fail,
                lose_response,
            },
        );
        self.at(self.now + delay, Ev::Land(id));
        id
    }

    fn land(&mut self, id: u64) {
        let Some(f) = self.in_flight.remove(&id) else {
            return;
        };
        let back = self.rng.range(1, 10);
        if f.fail {
            self.at(self.now + back, Ev::Respond(id, Err(ReqErr::Unavailable)));
            return;
        }
        let result = self.apply(f.node, &f.op);
        let client_gave_up = self.replies.get(&id).is_none_or(|r| r.result.is_some());
        if client_gave_up && result.is_ok() {
            match &f.op {
                Op::Put { key, .. } if key.contains("/log/") => self.stats.late_uploads_landed += 1,
                Op::Delete { .. } => self.stats.late_deletes_landed += 1,
                _ => {}
            }
        }
        if !f.lose_response {
            self.at(self.now + back, Ev::Respond(id, result));
        }
    }

    /// The apps whose index prefix `key` is under (one, or every app when
    /// they share the tenant-wide prefix).
    fn index_apps(&self, key: &str) -> Vec<usize> {
        (0..self.apps.len())
            .filter(|a| key.starts_with(&self.apps[*a].index_prefix))
            .collect()
    }

    /// The actors an index key may be an entry of.
    fn index_actors(&self, key: &str) -> Vec<usize> {
        let mut out = Vec::new();
        for app in self.index_apps(key) {
            let Ok(k) = IndexKey::parse_full(&self.apps[app].index_prefix, key) else {
                continue;
            };
            if let Some(actors) = self.by_address.get(&k.address) {
                out.extend(actors.iter().filter(|a| self.actors[**a].app == app));
            }
        }
        out
    }

    /// The actor a chain key (`<root>log/<seq>`) belongs to, and the seq.
    fn chain_actor(&self, key: &str) -> Option<(usize, u64)> {
        let at = key.rfind("/log/")?;
        let actor = *self.by_root.get(&key[..=at])?;
        let seq = key[at + 5..].parse().ok()?;
        Some((actor, seq))
    }

    fn apply(&mut self, node: usize, op: &Op) -> Result<Resp, ReqErr> {
        match op {
            Op::Put {
                key,
                body,
                create_only,
                actor,
            } => {
                if *create_only && self.bucket.contains_key(key) {
                    return Err(ReqErr::AlreadyExists);
                }
                let index = !self.index_apps(key).is_empty();
                if self.trace.keep || key.contains("/log/") || index {
                    let name = self.nodes[node].name.clone();
                    self.log(format!("bucket: {name} put {key}"));
                }
                self.bucket.insert(key.clone(), body.clone());
                if index {
                    if let Some(a) = actor {
                        self.index_writer.insert(key.clone(), *a);
                    }
                    if self.list_lag_ms > 0 {
                        let lag = self.rng.range(0, self.list_lag_ms);
                        self.unlisted_until.insert(key.clone(), self.now + lag);
                    }
                    let touched = self.index_actors(key);
                    self.dirty.extend(touched);
                } else if let Some((a, seq)) = self.chain_actor(key) {
                    self.dirty.insert(a);
                    self.in_bucket.insert(a);
                    crate::sim::on_chain_put(self, a, seq, body);
                }
                Ok(Resp::Done)
            }
            Op::Get { key } => self
                .bucket
                .get(key)
                .cloned()
                .map(Resp::Body)
                .ok_or(ReqErr::NotFound),
            Op::List {
                prefix,
                start_after,
                limit,
            } => {
                let start = match start_after {
                    Some(s) if s.as_str() >= prefix.as_str() => s.clone(),
                    _ => prefix.clone(),
                };
                // One page at most, as a store answers.
                let limit = (*limit).min(self.cfg.list_page_keys_max);
                let now = self.now;
                let mut missed = 0;
                let keys: Vec<String> = self
                    .bucket
                    .range(start.clone()..)
                    .map(|(k, _)| k)
                    .filter(|k| Some(*k) != start_after.as_ref())
                    .take_while(|k| k.starts_with(prefix.as_str()))
                    .filter(|k| {
                        let hidden = self.unlisted_until.get(*k).is_some_and(|t| *t > now);
                        missed += u64::from(hidden);
                        !hidden
                    })
                    .take(limit)
                    .cloned()
                    .collect();
                self.stats.listing_missed += missed;
                self.stats.continued_listings += u64::from(start_after.is_some());
                Ok(Resp::Keys(keys))
            }
            Op::Delete { key, actor } => {
                let index = !self.index_apps(key).is_empty();
                if index {
                    crate::sim::on_index_delete(self, key, *actor);
                }
                if self.bucket.remove(key).is_some() {
                    let name = self.nodes[node].name.clone();
                    self.log(format!("bucket: {name} delete {key}"));
                    if index {
                        self.index_writer.remove(key);
                        self.unlisted_until.remove(key);
                        let touched = self.index_actors(key);
                        self.dirty.extend(touched);
                    }
                }
                Ok(Resp::Done)
            }
        }
    }

    fn respond(&mut self, id: u64, result: Result<Resp, ReqErr>) {
        if let Some(r) = self.replies.get_mut(&id)
            && r.result.is_none()
        {
            r.result = Some(result);
            let t = r.task;
            self.at(self.now, Ev::Wake(t));
        }
    }
}

/// A request in flight, as a future.
pub struct Request {
    w: Shared,
    node: usize,
    op: Option<Op>,
    id: Option<u64>,
}

impl Future for Request {
    type Output = Result<Resp, ReqErr>;
    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut w = this.w.borrow_mut();
        let id = match this.id {
            Some(id) => id,
            None => {
                let id = w.send(
                    this.node,
                    this.op.take().expect("polled once before sending"),
                );
                this.id = Some(id);
                id
            }
        };
        let done = w.replies.get(&id).is_some_and(|r| r.result.is_some());
        if done {
            let r = w
                .replies
                .remove(&id)
                .and_then(|r| r.result)
                .expect("checked above");
            Poll::Ready(r)
        } else {
            Poll::Pending
        }
    }
}

/// Sends `op` for `node` and waits for the answer or the deadline.
pub fn request(w: &Shared, node: usize, op: Op) -> Request {
    Request {
        w: w.clone(),
        node,
        op: Some(op),
        id: None,
    }
}

/// Waits until simulated time `until`.
pub struct Sleep {
    w: Shared,
    until: u64,
    armed: bool,
}

impl Future for Sleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let mut w = this.w.borrow_mut();
        if w.now >= this.until && this.armed {
            return Poll::Ready(());
        }
        if !this.armed {
            this.armed = true;
            let t = w.current_task.expect("sleeps happen in tasks");
            let until = this.until;
            w.at(until, Ev::Wake(t));
        }
        Poll::Pending
    }
}

/// Sleeps `ms` of simulated time (at least one scheduling round).
pub fn sleep(w: &Shared, ms: u64) -> Sleep {
    let until = w.borrow().now + ms;
    Sleep {
        w: w.clone(),
        until,
        armed: false,
    }
}

/// Waits for work on a node's queue.
pub struct NextWork {
    w: Shared,
    node: usize,
}

impl Future for NextWork {
    type Output = Work;
    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Work> {
        let this = self.get_mut();
        let mut w = this.w.borrow_mut();
        let t = w.current_task.expect("in a task");
        let mem = &mut w.nodes[this.node].mem;
        // The first work whose actor no other worker is busy with.
        let next = mem
            .queue
            .iter()
            .position(|work| !mem.busy.contains(&work.actor()));
        match next.and_then(|i| mem.queue.remove(i)) {
            Some(work) => {
                mem.busy.insert(work.actor());
                Poll::Ready(work)
            }
            None => {
                if !mem.worker_waiting.contains(&t) {
                    mem.worker_waiting.push(t);
                }
                Poll::Pending
            }
        }
    }
}

/// The next piece of work for a node's worker.
pub fn next_work(w: &Shared, node: usize) -> NextWork {
    NextWork { w: w.clone(), node }
}

/// Never completes: what a task awaits after it crashed its node.
pub struct Never;

impl Future for Never {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        Poll::Pending
    }
}

/// The executor: runs events in order and polls tasks.
pub struct Executor {
    /// The world.
    pub w: Shared,
    tasks: BTreeMap<u64, (usize, Task)>,
    next_task: u64,
}

impl Executor {
    /// An executor over `w`.
    pub fn new(w: Shared) -> Executor {
        Executor {
            w,
            tasks: BTreeMap::new(),
            next_task: 0,
        }
    }

    fn adopt_spawns(&mut self) {
        let spawns = std::mem::take(&mut self.w.borrow_mut().spawns);
        for (node, task) in spawns {
            let id = self.next_task;
            self.next_task += 1;
            self.tasks.insert(id, (node, task));
            let mut w = self.w.borrow_mut();
            let now = w.now;
            w.at(now, Ev::Wake(id));
        }
    }

    /// Drops every task of `node`: its process is gone. Requests it sent stay
    /// on the network and land.
    pub fn kill_node_tasks(&mut self, node: usize) {
        self.tasks.retain(|_, (n, _)| *n != node);
    }

    fn poll_task(&mut self, id: u64) {
        let Some((node, task)) = self.tasks.get_mut(&id) else {
            return;
        };
        let node = *node;
        {
            let mut w = self.w.borrow_mut();
            let stall = w.nodes[node].stall_until;
            if stall > w.now {
                w.at(stall, Ev::Wake(id));
                return;
            }
            w.current_task = Some(id);
        }
        let mut cx = Context::from_waker(Waker::noop());
        let done = task.as_mut().poll(&mut cx).is_ready();
        let crash = {
            let mut w = self.w.borrow_mut();
            w.current_task = None;
            w.crash_now.take()
        };
        if done {
            self.tasks.remove(&id);
        }
        if let Some(n) = crash {
            crate::sim::crash_node(self, n);
        }
    }

    /// Runs events until `end_ms` or a violation; `on_sim` handles simulator events.
    pub fn run(&mut self, end_ms: u64, mut on_sim: impl FnMut(&mut Executor, crate::sim::SimEv)) {
        loop {
            self.adopt_spawns();
            let ev = {
                let mut w = self.w.borrow_mut();
                if w.violation.is_some() {
                    return;
                }
                match w.queue.peek() {
                    Some(s) if s.time <= end_ms => {}
                    _ => {
                        w.now = end_ms;
                        return;
                    }
                }
                let s = w.queue.pop().expect("peeked");
                w.now = s.time;
                s.ev
            };
            match ev {
                Ev::Wake(id) => self.poll_task(id),
                Ev::Land(id) => self.w.borrow_mut().land(id),
                Ev::Respond(id, r) => self.w.borrow_mut().respond(id, r),
                Ev::Deadline(id) => self.w.borrow_mut().respond(id, Err(ReqErr::Timeout)),
                Ev::Sim(e) => on_sim(self, e),
            }
        }
    }
}

/// A small queue type re-exported for node memory.
pub type Queue<T> = VecDeque<T>;
