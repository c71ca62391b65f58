//! Replication of every actor's database to the bucket, as the runtime
//! drives it (ADR 0007; the chain itself is `wasmkeep-replica`'s).
//!
//! Per actor, an [`ActorReplica`] counts the batches that changed the
//! database (`committed`) and those the bucket holds (`uploaded`). At most
//! one upload per actor is in flight; it carries every commit up to the
//! moment its image was read, so a busy actor costs one PUT per upload
//! round trip, not one per event. When it lands, the next one starts if
//! more commits came meanwhile (an [`EventKind::Between(Between::Replicate)`] turn reads the
//! image, since only the actor's own connection may read its file). An
//! upload that no `replicated` request waits for also waits until
//! `replica_upload_interval_ms` has passed since the previous one started
//! (a `Replicate` event scheduled for then), so plain commits cost at most
//! one PUT per interval (ADR 0034); a stopping node uploads at once
//! ([`flush_deferred`]).
//!
//! A request that asked for `replicated` durability waits, after its local
//! commit, until `uploaded` covers its batch. If an upload fails (the chain
//! moved: another writer; or the bucket kept failing past the client's
//! retries), the actor is given up: waiting requests get a retryable
//! error, and its next turn drops the instance and opens the actor afresh
//! from the bucket, setting the local file aside (the late-commit rule:
//! never serve state the bucket does not agree with).
//!
//! Uploads run on a small tokio runtime of their own; opening, restoring
//! and deleting block the worker that runs the actor's turn, as opening a
//! database does.
//!
//! A restore refused because of what the bucket holds (`storage_corrupt`:
//! a forged or damaged object, a chain past its bounds) would fail the same
//! way on every turn, re-listing and re-downloading the chain each time. It
//! is remembered per actor for `restore_refused_retry_ms` (`Refusals`):
//! meanwhile the actor's turns answer the same error without a request to
//! the bucket. At most [`RESTORE_REFUSALS_MAX`] refusals are remembered.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use wasmkeep_cluster::machine::{BucketResult, IndexUpkeep, Listing, UpkeepEffect, UploadRound};
use wasmkeep_replica::{
    Bucket, Image, Landed, Opened, Pages, Replica, ReplicaConfig, ReplicaError, SnapshotJob,
    Uploaded, WholeFile,
};
use wasmkeep_store::page_capture;
use wasmkeep_store::{ActorDb, ActorId, StoreError, paths};

use crate::actor::{Actor, Between, Event, EventKind, Outcome, Reply};
use crate::error::RuntimeError;
use crate::metrics::Metrics;
use crate::node::Inner;

/// Threads that carry uploads (they wait on the network, not the CPU).
const UPLOAD_THREADS: usize = 2;

/// Most bytes of changed pages an upload reads from an actor's file into
/// memory (issue 33: 60 transactions of 10 MB made uploads hold 1.5 GB).
/// An upload with more changes ships the whole file, read a few parts at a
/// time as it uploads; one that would read a larger database whole into
/// memory waits until its file can be read page by page.
pub(crate) const UPLOAD_DIFF_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// Most snapshots a node streams from its files at once (ADR 0036). Each
/// holds a few parts of `replica_snapshot_part_bytes` in memory and reads
/// its whole file; an actor whose snapshot is due while the slots are
/// taken keeps uploading entries and tries again at a later upload.
pub(crate) const SNAPSHOTS_RUNNING_MAX: usize = 1;

/// Most deltas (ADR 0037) a node streams at once, beside the whole
/// snapshot: each holds a few parts in memory like a snapshot, but reads
/// only the pages that changed, so an actor whose delta is due does not
/// wait behind a whole snapshot of another (and fall back to reading its
/// database whole once its snapshot is overdue).
pub(crate) const DELTAS_RUNNING_MAX: usize = 4;

/// Most overdue snapshots (ADR 0037) a node streams at once besides the
/// others: an actor whose snapshot is overdue while these are taken waits
/// for one ([`SLOT_RETRY_MS`]) before it uploads again (ADR 0038; it used
/// to write the snapshot from the whole database in memory).
pub(crate) const OVERDUE_RUNNING_MAX: usize = 16;

/// Most uploads of a whole file larger than one part (ADR 0038: an actor's
/// first upload) a node runs at once. Each holds a few parts in memory and
/// reads its whole file; an actor that finds them taken tries again
/// [`SLOT_RETRY_MS`] later (a node moving many large actors onto a
/// bucket uploads them a few at a time).
pub(crate) const FILE_UPLOADS_RUNNING_MAX: usize = 4;

/// How long an actor waits for a slot of [`FILE_UPLOADS_RUNNING_MAX`] (or
/// of [`OVERDUE_RUNNING_MAX`], for an overdue snapshot) before it tries
/// again.
const SLOT_RETRY_MS: u64 = 200;

/// A slot of [`SNAPSHOTS_RUNNING_MAX`], [`DELTAS_RUNNING_MAX`],
/// [`OVERDUE_RUNNING_MAX`] or [`FILE_UPLOADS_RUNNING_MAX`], given back when
/// dropped.
struct SnapshotSlot(Arc<std::sync::atomic::AtomicUsize>);

impl SnapshotSlot {
    fn take(running: &Arc<std::sync::atomic::AtomicUsize>, max: usize) -> Option<SnapshotSlot> {
        use std::sync::atomic::Ordering::AcqRel;
        running
            .fetch_update(AcqRel, std::sync::atomic::Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| SnapshotSlot(Arc::clone(running)))
    }
}

impl Drop for SnapshotSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// How long deleting an actor waits for its upload in flight to end.
const DELETE_WAIT_MS: u64 = 30_000;

/// Most refused restores a node remembers at once (see `Refusals`); each
/// costs its actor's id and an error message of a few KiB at most.
pub(crate) const RESTORE_REFUSALS_MAX: usize = 1024;

/// Restores refused because of the bucket's contents, remembered per actor
/// so that its turns answer the same error for `retry_ms` without asking
/// the bucket again. Bounded: past `cap` actors, expired refusals go first,
/// then the oldest (whose actor may then try its restore early; nothing
/// worse).
#[derive(Debug)]
pub(crate) struct Refusals {
    entries: HashMap<ActorId, Refusal>,
    cap: usize,
    retry_ms: u64,
}

#[derive(Debug)]
struct Refusal {
    at_ms: u64,
    message: String,
}

impl Refusals {
    pub(crate) fn new(cap: usize, retry_ms: u64) -> Refusals {
        Refusals {
            entries: HashMap::new(),
            cap: cap.max(1),
            retry_ms,
        }
    }

    /// Whether a refusal at `at_ms` still stands at `now_ms`. A clock that
    /// went backwards ends it rather than prolong it.
    fn stands(&self, at_ms: u64, now_ms: u64) -> bool {
        now_ms >= at_ms && now_ms - at_ms < self.retry_ms
    }

    /// The message of `id`'s refusal if it still stands; a passed one is
    /// forgotten.
    pub(crate) fn get(&mut self, id: &ActorId, now_ms: u64) -> Option<String> {
        let r = self.entries.get(id)?;
        if self.stands(r.at_ms, now_ms) {
            return Some(r.message.clone());
        }
        self.entries.remove(id);
        None
    }

    /// Remembers that `id`'s restore was refused at `now_ms` with
    /// `message`, making room if the map is full.
    pub(crate) fn remember(&mut self, id: &ActorId, now_ms: u64, message: String) {
        if self.retry_ms == 0 {
            return;
        }
        if !self.entries.contains_key(id) && self.entries.len() >= self.cap {
            let retry_ms = self.retry_ms;
            self.entries
                .retain(|_, r| now_ms >= r.at_ms && now_ms - r.at_ms < retry_ms);
            if self.entries.len() >= self.cap {
                let oldest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, r)| r.at_ms)
                    .map(|(id, _)| id.clone());
                if let Some(oldest) = oldest {
                    self.entries.remove(&oldest);
                }
            }
        }
        let refusal = Refusal {
            at_ms: now_ms,
            message,
        };
        self.entries.insert(id.clone(), refusal);
    }

    pub(crate) fn forget(&mut self, id: &ActorId) {
        self.entries.remove(id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The node's side of replication: the bucket and where uploads run.
pub struct Replication {
    pub bucket: Bucket,
    pub config: ReplicaConfig,
    /// Stamped into every entry this node writes (its start time), so that
    /// two writers' entries never compare equal.
    pub generation: u64,
    /// Restores refused for the bucket's contents, per actor.
    refusals: Mutex<Refusals>,
    /// `replica_upload_interval_ms`.
    upload_interval: Duration,
    /// Set when the node stops: uploads no longer wait for the interval.
    flushing: std::sync::atomic::AtomicBool,
    /// Snapshots streaming now (at most [`SNAPSHOTS_RUNNING_MAX`]).
    snapshots_running: Arc<std::sync::atomic::AtomicUsize>,
    /// Deltas streaming now (at most [`DELTAS_RUNNING_MAX`]).
    deltas_running: Arc<std::sync::atomic::AtomicUsize>,
    /// Overdue snapshots streaming now (at most [`OVERDUE_RUNNING_MAX`]).
    overdue_running: Arc<std::sync::atomic::AtomicUsize>,
    /// Uploads of a file larger than one part running now (at most
    /// [`FILE_UPLOADS_RUNNING_MAX`]).
    file_uploads_running: Arc<std::sync::atomic::AtomicUsize>,
    /// After a crash (ADR 0082): the actors the start-up scan queued
    /// because their files may hold commits no upload carried, until each
    /// has been checked against the bucket (at most one per local actor).
    /// A stop with any left keeps the crash marker for the next start.
    pub(crate) crash_unchecked: Mutex<HashSet<ActorId>>,
    /// Whether the start-up scan has queued them all.
    pub(crate) crash_scan_done: std::sync::atomic::AtomicBool,
    io: Option<tokio::runtime::Runtime>,
}

impl Replication {
    /// `restore_refused_retry_ms`: how long a restore refused for the
    /// bucket's contents is answered from memory (0: never remembered);
    /// `upload_interval_ms`: least time between two uploads of one actor
    /// that no `replicated` request waits for.
    pub fn start(
        bucket: Bucket,
        config: ReplicaConfig,
        generation: u64,
        restore_refused_retry_ms: u64,
        upload_interval_ms: u64,
    ) -> Result<Replication, RuntimeError> {
        let io = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(UPLOAD_THREADS)
            .thread_name("wasmkeep-upload")
            .enable_all()
            .build()
            .map_err(|e| RuntimeError::Internal(format!("upload threads: {e}")))?;
        Ok(Replication {
            bucket,
            config,
            generation,
            refusals: Mutex::new(Refusals::new(
                RESTORE_REFUSALS_MAX,
                restore_refused_retry_ms,
            )),
            upload_interval: Duration::from_millis(upload_interval_ms),
            flushing: std::sync::atomic::AtomicBool::new(false),
            snapshots_running: Default::default(),
            deltas_running: Default::default(),
            overdue_running: Default::default(),
            file_uploads_running: Default::default(),
            crash_unchecked: Mutex::new(HashSet::new()),
            crash_scan_done: std::sync::atomic::AtomicBool::new(false),
            io: Some(io),
        })
    }

    /// Runs `f` to completion on the upload runtime, blocking this thread
    /// (a worker's, never an async task's).
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.io.as_ref().expect("running").block_on(f)
    }

    fn spawn(&self, f: impl Future<Output = ()> + Send + 'static) {
        self.io.as_ref().expect("running").spawn(f);
    }
}

impl Drop for Replication {
    fn drop(&mut self) {
        // The last owner may be an async task: never block dropping it.
        if let Some(io) = self.io.take() {
            io.shutdown_background();
        }
    }
}

/// A request's result held until the bucket holds its batch.
pub(crate) struct Waiter {
    upto: u64,
    reply: Reply,
    out: Result<Outcome, RuntimeError>,
    started: Option<Instant>,
    upload: Option<UploadSpan>,
}

/// A traced request's wait for the bucket (ADR 0064): recorded as its
/// `upload` span when its answer is released.
pub(crate) struct UploadSpan {
    pub traces: Arc<crate::trace::Traces>,
    /// The request's span.
    pub parent: crate::trace::TraceContext,
    pub since: Instant,
}

/// Where a batch's commit stands in an actor's replication: the
/// generation a durable request waits for, within one opening of the actor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    /// Counts the actor's starts over (give-ups, deletes, an operator's
    /// restores): a mark from before one holds only if the last was a
    /// give-up and an upload of the mark's epoch carried it
    /// ([`ActorReplica::landed`]).
    epoch: u64,
    upto: u64,
}

/// What an epoch of an actor's replication left when it ended.
#[derive(Debug, Clone, Copy)]
struct Ended {
    epoch: u64,
    /// The epoch's batches the bucket held.
    uploaded: u64,
}

/// One actor's replication state.
#[derive(Default)]
pub struct ActorReplica {
    /// Bumped each time the actor starts over (after a give-up, a delete
    /// or an operator's restore).
    epoch: u64,
    /// The chain's owner side; an upload in flight holds it meanwhile.
    replica: Option<Replica>,
    /// Whether the bucket was consulted since the actor was (re)opened.
    opened: bool,
    in_flight: bool,
    /// Batches that changed the database since `opened`.
    pub(crate) committed: u64,
    /// Of those, how many the bucket holds.
    uploaded: u64,
    /// When the oldest commit no upload carries yet was made.
    pub(crate) pending_since: Option<Instant>,
    /// When the last upload started (the upload interval counts from it).
    last_started: Option<Instant>,
    /// The last commit a `replicated` request waits for: an upload that
    /// carries it starts without waiting for the interval.
    urgent_upto: u64,
    /// The last commit a client's `replicated` request (or a parked reply's
    /// completion) waits for: past `uploaded` at a stop, its answer may be
    /// an error (ADR 0082, `void_unanswered_at_stop`). `urgent_upto` counts
    /// outbox sends too, whose commits no client was told failed.
    replicated_upto: u64,
    /// A `Replicate` event is scheduled for when the interval ends.
    deferred: bool,
    /// Why the actor was given up; its next turn reopens it.
    given_up: Option<String>,
    /// The epoch the last [`ActorReplica::reset_after_give_up`] ended, and
    /// how many of its batches the bucket held by then: a `replicated`
    /// batch of that epoch whose local sync ends after it is answered as
    /// done if its upload landed (`hold_until_uploaded`).
    ended: Option<Ended>,
    /// An operator's restore replaced the file and its upload failed: the
    /// data the batches before it belong to may be gone from the bucket's
    /// head, so no landed batch of this opening or of the one before is
    /// answered as done (as after a successful restore,
    /// [`ActorReplica::reset`]).
    replaced: bool,
    waiters: Vec<Waiter>,
    /// Alarm index writes waiting for an upload (a cluster node only).
    pub(crate) index: IndexUpkeep,
    /// The bucket held the actor's history (a state or a tombstone) when
    /// it was opened.
    pub(crate) had_state: bool,
    /// This opening found no local data and an empty bucket (a new actor):
    /// everything in its file was committed since, and a give-up voids
    /// all of it ([`wasmkeep_replica::Void::NewActor`]). Never set for a
    /// file the bucket has not seen yet but that held data before (a node
    /// that ran without a bucket).
    began_empty: bool,
    /// No batch has planned the alarm index since the actor was opened: the
    /// next commit does (migration, R4), and no upload goes before it.
    pub(crate) needs_plan: bool,
    /// A tombstone above the one restored landed (`fence_deleted`): this
    /// opening ended the deleted actor's history.
    fenced: bool,
    /// The gate's routing epoch when the actor was opened (a cluster node):
    /// a copy from an earlier epoch is opened afresh (`stale_epoch`).
    opened_epoch: u64,
    /// The actor's connection stopped checkpointing (even at its close) so
    /// that a snapshot or a whole-file upload can read its file
    /// (`ActorDb::freeze_file`); its turn thaws it once nothing reads the
    /// file (`thaw_if_done`).
    frozen: bool,
    /// A snapshot is being streamed from the file.
    snapshotting: bool,
    /// The upload in flight reads the actor's file (a whole-file upload,
    /// ADR 0038) or froze it for the snapshot that streams after it: the
    /// file must stay as it is until the upload ends.
    upload_reads_file: bool,
    /// How the last streamed snapshot ended, for the replica to learn at
    /// its next upload.
    /// An error says whether the file was torn (`snapshot_torn`).
    snapshot_done: Option<Result<Landed, (String, bool)>>,
}

impl ActorReplica {
    /// The seq of the chain's head, as this node last wrote or read it
    /// (`None` while an upload holds the replica, or before it opened).
    pub(crate) fn head_seq(&self) -> Option<u64> {
        self.replica.as_ref().and_then(|r| r.head()).map(|p| p.seq)
    }

    /// Starts over after a delete or an operator's restore: marks taken
    /// before are void (the data they name was replaced: a batch of it
    /// whose sync ends later must not release outbox rows, sockets or a
    /// bookmark's restore into the new data).
    fn reset(&mut self) {
        self.start_over(None);
    }

    /// Starts over after a give-up: a mark taken before holds if an upload
    /// carried it ([`ActorReplica::landed`]), since the next opening
    /// restores from the bucket, which has it.
    fn reset_after_give_up(&mut self) {
        let ended = (!self.replaced).then_some(Ended {
            epoch: self.epoch,
            uploaded: self.uploaded,
        });
        self.start_over(ended);
    }

    fn start_over(&mut self, ended: Option<Ended>) {
        *self = ActorReplica {
            epoch: self.epoch + 1,
            ended,
            ..ActorReplica::default()
        };
    }

    /// Whether the bucket holds the batch at `mark`: an upload of its
    /// epoch carried it, before or after a give-up (a landed upload stays
    /// in the actor's history: the next opening restores from it). Only the
    /// last opening's count is kept, and only across a give-up.
    fn landed(&self, mark: Mark) -> bool {
        if self.replaced {
            // A restore's upload failed: the file was replaced, whatever
            // opening the batch belonged to.
            false
        } else if mark.epoch == self.epoch {
            self.uploaded >= mark.upto
        } else {
            self.ended
                .is_some_and(|e| e.epoch == mark.epoch && e.uploaded >= mark.upto)
        }
    }

    /// Whether closing the actor now would lose track of something. A given
    /// up actor is not: its unuploaded commits are void, its next opening
    /// restores it, and nothing it holds will ever be uploaded (shutdown must
    /// not wait for it).
    pub fn busy(&self) -> bool {
        // Local data the bucket lacks and no batch has listed the alarm of
        // (a cluster node): nothing may upload it yet, and closing the
        // actor loses nothing (its next opening finds it again).
        let uploadable = self.committed > self.uploaded && !self.needs_plan;
        self.in_flight
            || self.snapshotting
            || (self.given_up.is_none() && (uploadable || !self.waiters.is_empty()))
    }

    pub fn given_up(&self) -> bool {
        self.given_up.is_some()
    }

    /// Local data the bucket lacks that no batch has listed the alarm of
    /// yet (a cluster node): a `Replicate` turn plans and uploads it.
    pub fn awaits_first_plan(&self) -> bool {
        self.needs_plan && self.committed > self.uploaded
    }

    /// Whether a snapshot is streaming from the actor's file, or the upload
    /// in flight reads it or froze it for a snapshot. A frozen connection
    /// does not checkpoint at its close (ADR 0038), so closing it now tears
    /// nothing, but the eviction waits anyway: the actor's next turn thaws
    /// it, and a closed actor's upload then finds its log empty or short
    /// (a close leaves one of at most 64 KiB, ADR 0076; the upload opens
    /// the actor for it).
    pub fn snapshot_reads_file(&self) -> bool {
        self.snapshotting || (self.upload_reads_file && self.in_flight)
    }

    /// Whether this copy was opened in an earlier routing epoch than
    /// `epoch` (a cluster node whose lease lapsed since: it may have lost
    /// and retaken the actor, so what this copy knows is stale).
    pub fn stale_epoch(&self, epoch: u64) -> bool {
        self.opened && self.opened_epoch != epoch
    }

    /// Whether the bucket held the actor's history when it was opened.
    pub fn had_state(&self) -> bool {
        self.had_state
    }

    /// Whether an upload (or a fence) of this opening has landed.
    pub fn uploaded_any(&self) -> bool {
        self.uploaded > 0 || self.fenced
    }

    /// Whether every commit of this opening is in the bucket.
    pub fn settled(&self) -> bool {
        self.committed <= self.uploaded && !self.in_flight
    }
}

/// Before the actor's database is opened: makes sure the local file is the
/// bucket's latest state (restoring it if not), once per opening. A given
/// up actor starts over here.
pub(crate) fn ensure_open(
    rt: &Inner,
    repl: &Replication,
    actor: &Actor,
) -> Result<(), RuntimeError> {
    let mut st = actor.repl.lock();
    while st.in_flight {
        actor.repl_done.wait(&mut st);
    }
    let epoch = rt.gate_epoch();
    if rt.keeps_index() && st.given_up.is_none() && st.stale_epoch(epoch) {
        // In the actor's own turn, with no upload in flight: no batch of
        // this actor commits meanwhile, so a file the bucket holds whole
        // needs no void (its next opening finds it up to date rather than
        // downloading it).
        let settled = st.committed <= st.uploaded && st.waiters.is_empty();
        give_up_as(
            rt,
            actor,
            &mut st,
            "the node's lease lapsed since this copy was opened".into(),
            !settled,
        );
    }
    if st.given_up.is_some() {
        st.reset_after_give_up();
    }
    if st.opened {
        return Ok(());
    }
    // Only this actor's turn (running this) changes the state meanwhile; the
    // lock is not held across the bucket's round trips, so the durability
    // stage never waits on a restore.
    drop(st);
    let now_ms = rt.clock.now_ms();
    if let Some(message) = repl.refusals.lock().get(&actor.id, now_ms) {
        // Refused a moment ago for what the bucket holds: the same answer,
        // without reading the chain again.
        return Err(RuntimeError::Store(StoreError::Corrupt(message)));
    }
    let path = paths::actor_db(&rt.config.data_dir, &actor.id);
    let opened = repl.block_on(Replica::open(
        &repl.bucket,
        &actor.id,
        &path,
        repl.generation,
        repl.config.clone(),
        now_ms,
    ));
    let (replica, how) = match opened {
        Ok(opened) => opened,
        Err(e) => {
            let e = restore_error(&actor.id, e);
            if let RuntimeError::Store(StoreError::Corrupt(message)) = &e {
                repl.refusals
                    .lock()
                    .remember(&actor.id, now_ms, message.clone());
            }
            return Err(e);
        }
    };
    repl.refusals.lock().forget(&actor.id);
    repl.crash_unchecked.lock().remove(&actor.id);
    // The local file is now the head (or will be uploaded whole): the
    // pages commits write from here on describe the next entries.
    page_capture::track(&paths::actor_dir(&rt.config.data_dir, &actor.id));
    let mut st = actor.repl.lock();
    st.had_state = !matches!(how, Opened::BucketEmpty { .. } | Opened::SetAside { .. });
    st.began_empty = matches!(
        how,
        Opened::BucketEmpty { local: false } | Opened::SetAside { .. }
    );
    st.opened_epoch = rt.gate_epoch();
    st.needs_plan = rt.keeps_index();
    match how {
        Opened::Restored { replaced } => {
            Metrics::inc(&rt.metrics.replica_restores_total);
            tracing::info!(actor = %actor.id, replaced = ?replaced, "restored from the bucket");
            // Same bytes, same alarm: the timer learns the restored one.
            match wasmkeep_store::db::read_alarm(&path) {
                Ok(a) => rt
                    .timer
                    .set_alarm(&actor.id, a.map(|a| (a.at_ms, a.retry_count))),
                Err(_) => rt.rearm_after_failure(&actor.id),
            }
        }
        Opened::BucketEmpty { local: true } => {
            // Local data the bucket has never seen: the next commit ships
            // all of it as the chain's first entry.
            st.committed = 1;
            st.pending_since = Some(crate::clock::instant());
        }
        Opened::Ahead => {
            // Commits the previous process made and never uploaded (it
            // crashed, ADR 0082): kept, and shipped whole above the head
            // by the next upload, asked for or not.
            tracing::info!(actor = %actor.id, "the local file holds commits the bucket lacks; kept, and uploaded next");
            Metrics::inc(&rt.metrics.replica_kept_ahead_total);
            st.committed = 1;
            st.pending_since = Some(crate::clock::instant());
        }
        Opened::Deleted { replaced } => {
            // Deleted (a tombstone heads the chain): the actor starts over
            // with no data, above the tombstone.
            if replaced.is_some() {
                tracing::info!(actor = %actor.id, replaced = ?replaced, "the bucket says the actor was deleted; its local file was set aside");
            }
            rt.timer.set(&actor.id, None);
        }
        Opened::SetAside { replaced } => {
            // A new actor given up before the bucket got anything of it:
            // what its failed batches wrote (an alarm too) is gone with
            // the file set aside.
            tracing::info!(actor = %actor.id, replaced = %replaced.display(), "the actor's first commits were given up before the bucket got them; its local file was set aside and it starts again as new");
            rt.timer.set(&actor.id, None);
        }
        Opened::BucketEmpty { local: false } | Opened::UpToDate => {}
    }
    st.replica = Some(replica);
    st.opened = true;
    Ok(())
}

/// The error a failed restore gives the actor's events. What the bucket
/// holds for the actor failing its checks (a forged or damaged object, one
/// over its bound, an image that fails `quick_check`) fails the same way on
/// every attempt, so it is `storage_corrupt` (not retryable), naming the
/// actor; the object's key is in the message. Anything else (the network,
/// throttling) is worth a retry: `replication_failed`. Either way only this
/// actor fails, and its local file is left as it was.
fn restore_error(id: &ActorId, e: ReplicaError) -> RuntimeError {
    if e.is_bad_bucket_input() {
        RuntimeError::Store(StoreError::Corrupt(format!(
            "the bucket's copy was refused: {e}: actor={id}"
        )))
    } else {
        RuntimeError::ReplicationFailed(format!("opening actor {id} from the bucket: {e}"))
    }
}

/// After a batch committed: counts it if it changed anything, starts an
/// upload if one is due and none is in flight, and returns the mark a
/// durable request of this batch waits for. `urgent`: a `replicated`
/// request of this batch waits for it, so its upload does not wait for the
/// upload interval. `replicated`: a client's request waits for it (one of
/// the reasons for `urgent`).
pub(crate) fn after_commit(
    rt: &Arc<Inner>,
    repl: &Replication,
    actor: &Arc<Actor>,
    db: &mut ActorDb,
    changed: bool,
    (urgent, replicated): (bool, bool),
) -> Mark {
    let mut st = actor.repl.lock();
    thaw_if_done(actor, &mut st, db);
    if changed {
        st.committed += 1;
        st.pending_since.get_or_insert_with(crate::clock::instant);
    }
    if urgent {
        st.urgent_upto = st.committed;
    }
    if replicated {
        st.replicated_upto = st.committed;
    }
    let mark = Mark {
        epoch: st.epoch,
        upto: st.committed,
    };
    maybe_upload(rt, repl, actor, st, ImageFrom::Db(db));
    mark
}

/// Lets the actor's connection checkpoint again once nothing reads its
/// file: no snapshot streams from it, and the upload in flight (if any)
/// neither reads it nor froze it for the snapshot that follows it. (An
/// upload of captured pages does not hold the file frozen: under steady
/// `replicated` writes one is nearly always in flight.)
fn thaw_if_done(actor: &Actor, st: &mut ActorReplica, db: &ActorDb) {
    if st.frozen && !st.snapshotting && !(st.in_flight && st.upload_reads_file) {
        match db.thaw() {
            Ok(()) => st.frozen = false,
            Err(e) => {
                tracing::warn!(actor = %actor.id, error = %e, "could not let the actor's database checkpoint again")
            }
        }
    }
}

/// After the actor's connection was opened: if its file is frozen (a
/// snapshot of an earlier connection streams from it, or an upload reads
/// it), the new connection holds it as it is too, until its turn thaws it
/// (`thaw_if_done`): a checkpoint would tear what is being read.
pub(crate) fn after_open(actor: &Actor, db: &ActorDb) -> Result<(), RuntimeError> {
    if actor.repl.lock().frozen {
        db.hold_file()?;
    }
    Ok(())
}

/// Applies what the last streamed snapshot did to the replica, if the
/// replica is here (not taken by an upload in flight).
fn learn_snapshot(actor: &Actor, st: &mut ActorReplica) {
    let Some(replica) = st.replica.as_mut() else {
        return;
    };
    match st.snapshot_done.take() {
        Some(Ok(landed)) => replica.snapshot_landed(landed),
        Some(Err((e, torn))) => {
            replica.snapshot_failed(torn);
            tracing::warn!(actor = %actor.id, error = %e, "a snapshot streamed from the file failed; tried again later")
        }
        None => {}
    }
}

/// A `Replicate` turn: uploads what is committed and not yet uploaded. For
/// a closed actor that never consulted the bucket (queued by the start-up
/// pass over local data), it first does: local data the bucket lacks then
/// counts as one pending commit.
pub(crate) fn upload_pending(
    rt: &Arc<Inner>,
    repl: &Replication,
    actor: &Arc<Actor>,
    db: Option<&mut ActorDb>,
) {
    let path = paths::actor_db(&rt.config.data_dir, &actor.id);
    let unopened = db.is_none() && !actor.repl.lock().opened;
    if unopened && rt.keeps_index() && rt.hold_generation(&actor.id).is_none() {
        // A cluster node uploads only what it holds (the start-up pass over
        // local data queues every actor): this one is uploaded once the
        // node takes it, by the batch that lists its alarm first (R4).
        return;
    }
    if unopened && let Err(e) = ensure_open(rt, repl, actor) {
        // A closed actor queued for its first upload (the start-up pass):
        // its next opening tries again.
        tracing::warn!(actor = %actor.id, error = %e, "could not check the actor against the bucket");
        return;
    }
    // A cluster node lists the alarm of what it uploads first (R4): with no
    // batch since the actor was opened, a transaction of its own does. A
    // closed actor whose log still holds commits (it closed while its file
    // was frozen, ADR 0038) is opened too, so that its upload finds the
    // file whole instead of reading the database into memory.
    let mut own: Option<ActorDb>;
    let mut db = db;
    let (needs_plan, overdue) = {
        let mut st = actor.repl.lock();
        if db.is_none() && st.snapshot_reads_file() {
            // A closed actor whose file is read: opening it now would make
            // a connection that nothing keeps from checkpointing into it
            // when it closes. Its upload waits for the read to end.
            retry_soon(rt, repl, actor, &mut st);
            return;
        }
        learn_snapshot(actor, &mut st);
        let overdue = st.replica.as_ref().is_some_and(|r| r.snapshot_overdue());
        (st.needs_plan, overdue)
    };
    // An overdue snapshot (or its repair) streams from an open actor's
    // frozen file: a closed one is opened for it too.
    if db.is_none() && (needs_plan || overdue || !log_is_empty(&path)) {
        let Some(app) = rt.app(&actor.id.tenant, &actor.id.app) else {
            return;
        };
        let dir = paths::actor_dir(&rt.config.data_dir, &actor.id);
        match ActorDb::open(&dir, &app.store_limits, wasmkeep_store::OpenMode::Existing) {
            Ok(Some(d)) => own = Some(d),
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(actor = %actor.id, error = %e, "could not open the actor for its upload");
                return;
            }
        }
        db = own.as_mut();
    }
    if needs_plan {
        let Some(d) = db.as_deref_mut() else {
            return;
        };
        if let Err(e) = crate::index::plan_alone(rt, actor, d) {
            tracing::warn!(actor = %actor.id, error = %e, "could not list the actor's alarm in the index: nothing uploaded");
            return;
        }
    }
    if let Some(d) = db.as_deref() {
        thaw_if_done(actor, &mut actor.repl.lock(), d);
    }
    let from = match db {
        Some(db) => ImageFrom::Db(db),
        // Closed meanwhile (evicted): the file is all there is, and this
        // turn keeps anyone from opening it.
        None => ImageFrom::File(&path),
    };
    maybe_upload(rt, repl, actor, actor.repl.lock(), from);
}

enum ImageFrom<'a> {
    Db(&'a mut ActorDb),
    File(&'a Path),
}

/// What an upload ships: the pages commits wrote since the last one
/// (captured as SQLite wrote them, ADR 0036), or the whole database.
enum Source {
    Pages(Pages),
    Image(Image),
    /// The whole file, read page by page while it uploads (no base yet,
    /// ADR 0038): it stays frozen until the upload ends.
    File(WholeFile),
}

/// The pages the actor's commits changed since the last upload (taken
/// from the capture, which starts over), if the capture saw them all.
fn captured_pages<'a>(
    rt: &Inner,
    actor: &Actor,
    from: ImageFrom<'a>,
) -> (Option<Pages>, ImageFrom<'a>) {
    let (changes, image) = match from {
        ImageFrom::Db(db) => (db.take_changes(), ImageFrom::Db(db)),
        ImageFrom::File(p) => {
            let dir = paths::actor_dir(&rt.config.data_dir, &actor.id);
            let changes = page_capture::of(&dir).map(|c| page_capture::lock(&c).take());
            (changes, ImageFrom::File(p))
        }
    };
    let pages = changes.and_then(|c| match (c.lost, c.db_pages, c.page_size) {
        (None, Some(db_pages), Some(page_size)) => Some(Pages {
            page_size,
            db_pages,
            low_pages: c.low_pages.unwrap_or(db_pages),
            pages: c.pages,
        }),
        _ => None,
    });
    (pages, image)
}

/// The actor's file to upload whole, read as it uploads, if it can be
/// frozen (an open actor's) or is whole already (a closed one's, its log
/// empty) and reads page by page; `None` sends the caller to SQLite.
fn whole_file(
    rt: &Inner,
    actor: &Actor,
    image: &ImageFrom<'_>,
    file: FileState,
) -> Result<Option<WholeFile>, String> {
    let path = paths::actor_db(&rt.config.data_dir, &actor.id);
    let frozen = match image {
        ImageFrom::Db(db) => db.freeze_file().is_ok(),
        ImageFrom::File(_) => log_is_empty(&path),
    };
    if !frozen {
        return Ok(None);
    }
    match WholeFile::probe(&path) {
        Ok(whole) => {
            Metrics::inc(&rt.metrics.replica_file_reads_total);
            Ok(Some(whole))
        }
        Err(e) => {
            tracing::warn!(actor = %actor.id, error = %e, "could not read the actor's file page by page: reading it through SQLite");
            // Frozen here for this read only (not for a snapshot).
            if let (ImageFrom::Db(db), FileState::Free) = (image, file) {
                db.thaw().map_err(|e| e.to_string())?;
            }
            Ok(None)
        }
    }
}

/// Chooses what the next upload ships, in the actor's turn. The captured
/// pages are taken in every case (a whole image covers them too), and used
/// when the replica can build an entry from them; otherwise (no base yet, a
/// snapshot due, a capture that gave up or saw no commit, a closed actor's
/// file) the whole database is read.
fn upload_source(
    rt: &Inner,
    actor: &Actor,
    replica: &Replica,
    from: ImageFrom<'_>,
    file: FileState,
    hold: &mut crate::pools::Hold,
) -> Result<Source, String> {
    let (pages, image) = captured_pages(rt, actor, from);
    if let (Some(pages), ImageFrom::Db(_)) = (pages, &image)
        && !replica.wants_image()
        && replica.pages_suffice(&pages)
    {
        Metrics::inc(&rt.metrics.replica_page_uploads_total);
        return Ok(Source::Pages(pages));
    }
    // No base (a first upload, or after a tombstone), or a repair (the
    // snapshot's stream found the file torn, or failed twice): every page
    // goes, read from the file as it uploads rather than held in memory. The file must
    // hold the committed state and keep it until the upload ends: an open
    // actor's is frozen here (the caller keeps it so), a closed one's is
    // whole if its log is empty (nobody opens it while the upload is in
    // flight).
    if (!replica.has_base() || replica.needs_repair())
        && file != FileState::Stale
        && let Some(whole) = whole_file(rt, actor, &image, file)?
    {
        return Ok(Source::File(whole));
    }
    Metrics::inc(&rt.metrics.replica_image_reads_total);
    // With a head to compare with, the file is read page by page and only
    // the pages that differ are kept (ADR 0037): never the whole database
    // in memory. Not when the file is frozen at an earlier head (a snapshot
    // streams from it), nor for an overdue snapshot (that upload writes it).
    if file != FileState::Stale && !replica.snapshot_overdue() {
        let path = paths::actor_db(&rt.config.data_dir, &actor.id);
        // What the diff keeps is bounded (and reserved in the pool, twice:
        // the pages and the entry's body); past either, the whole file
        // streams instead, frozen until that upload ends.
        let mut kept = 0u64;
        let mut room = |n: u64| {
            kept += n;
            kept <= UPLOAD_DIFF_BYTES_MAX && hold.grow(2 * n).is_ok()
        };
        let diffed = match &image {
            // A file that cannot be frozen is read through SQLite below.
            ImageFrom::Db(db) if file == FileState::Free => match db.freeze_file() {
                Ok(()) => {
                    let diffed = replica.diff_file_within(&path, &mut room);
                    if !matches!(diffed, Ok(wasmkeep_replica::Diff::Refused)) {
                        db.thaw().map_err(|e| e.to_string())?;
                    }
                    diffed.map(Some)
                }
                Err(_) => Ok(None),
            },
            // A closed actor: its file is whole only if closing
            // checkpointed the log into it (an empty or missing log).
            ImageFrom::File(_) if !log_is_empty(&path) => Ok(None),
            _ => replica.diff_file_within(&path, &mut room).map(Some),
        };
        match diffed.map_err(|e| e.to_string())? {
            Some(wasmkeep_replica::Diff::Pages(pages)) if replica.pages_suffice(&pages) => {
                return Ok(Source::Pages(pages));
            }
            Some(wasmkeep_replica::Diff::Refused) => {
                hold.shrink_to(0);
                let whole = WholeFile::probe(&path).map_err(|e| e.to_string())?;
                Metrics::inc(&rt.metrics.replica_file_reads_total);
                return Ok(Source::File(whole));
            }
            _ => hold.shrink_to(0),
        }
    }
    let image = match image {
        ImageFrom::Db(db) => db
            .committed_image()
            .map_err(|e| e.to_string())
            .and_then(|b| Image::from_bytes(b).map_err(|e| e.to_string())),
        ImageFrom::File(p) => Image::read_path(p).map_err(|e| e.to_string()),
    };
    image.map(Source::Image)
}

/// Whether an upload now would find the actor's file held at an older
/// state (a snapshot streams from it), its capture gone, and its database
/// larger than [`UPLOAD_DIFF_BYTES_MAX`]: then it could only read the
/// whole database into memory.
fn stale_and_large(rt: &Inner, actor: &Actor, st: &ActorReplica, from: &ImageFrom<'_>) -> bool {
    let ImageFrom::Db(db) = from else {
        return false;
    };
    if !(st.snapshotting || st.frozen) {
        return false;
    }
    let dir = paths::actor_dir(&rt.config.data_dir, &actor.id);
    let follows = page_capture::of(&dir).is_some_and(|c| page_capture::lock(&c).follows());
    !follows && db.size_bytes().is_ok_and(|b| b > UPLOAD_DIFF_BYTES_MAX)
}

/// Whether the write-ahead log beside the database at `db_path` holds no
/// frame (missing or empty).
fn log_is_empty(db_path: &std::path::Path) -> bool {
    let mut wal = db_path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(std::path::PathBuf::from(wal)).map_or(true, |m| m.len() == 0)
}

/// What the actor's database file holds when an upload starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileState {
    /// Frozen for this upload's snapshot: exactly the committed state.
    Current,
    /// Frozen at an earlier head, for a snapshot streaming from it.
    Stale,
    /// Not frozen: an open actor's checkpoints may leave commits in the
    /// log (freezing makes it current); a closed actor's file is current
    /// if closing emptied its log (checked before it is read).
    Free,
}

/// Starts an upload if one is due and none is in flight. The state's lock
/// is released before the image is read (a copy of the whole database),
/// so that nobody waiting on this actor's state (the durability stage, an
/// upload ending) waits for the copy.
fn maybe_upload(
    rt: &Arc<Inner>,
    repl: &Replication,
    actor: &Arc<Actor>,
    mut st: MutexGuard<'_, ActorReplica>,
    from: ImageFrom<'_>,
) {
    let Some(file_slot) = upload_due(rt, repl, actor, &mut st, &from) else {
        return;
    };
    let Some(replica) = st.replica.take() else {
        return;
    };
    let Some((mut replica, streaming)) = streaming_slot(rt, repl, actor, &mut st, replica, &from)
    else {
        return;
    };
    let repair = streaming.repair;
    let start = start_upload(repl, actor, &mut st, &mut replica, &from, streaming);
    drop(st);
    let Some((source, hold)) = read_source(rt, actor, &replica, from, start.file) else {
        return;
    };
    let time_ms = rt.clock.now_ms();
    let (rt, actor) = (Arc::clone(rt), Arc::clone(actor));
    let bucket = repl.bucket.clone();
    repl.spawn(ship(Upload {
        rt,
        actor,
        bucket,
        replica,
        source,
        round: start.round,
        time_ms,
        covered: start.covered,
        oldest: start.oldest,
        hold,
        file_slot,
        repair,
        snapshot: start.snapshot,
    }));
}

/// Whether an upload may start now: none when it may not (nothing new, one
/// in flight, the actor given up or its alarm not yet listed) or has to
/// wait (then it is queued again); otherwise the slot an upload with no
/// base takes to read a large file, if it needs one.
fn upload_due(
    rt: &Arc<Inner>,
    repl: &Replication,
    actor: &Arc<Actor>,
    st: &mut ActorReplica,
    from: &ImageFrom<'_>,
) -> Option<Option<SnapshotSlot>> {
    if st.committed <= st.uploaded || st.in_flight || st.given_up.is_some() || st.needs_plan {
        return None;
    }
    let interval = if repl.flushing.load(std::sync::atomic::Ordering::Relaxed) {
        Duration::ZERO
    } else {
        repl.upload_interval
    };
    if let Some(wait) = interval_left(st, interval) {
        // Plain commits only, and an upload started less than an interval
        // ago: one upload at the interval's end carries them all.
        defer(rt, repl, actor, st, wait);
        return None;
    }
    // An upload with no base reads the whole file (ADR 0038): one larger
    // than a part waits for a slot.
    let mut file_slot = None;
    if st.replica.as_ref().is_some_and(|r| !r.has_base())
        && std::fs::metadata(paths::actor_db(&rt.config.data_dir, &actor.id))
            .is_ok_and(|m| m.len() > repl.config.snapshot_part_bytes as u64)
    {
        let running = (&repl.file_uploads_running, FILE_UPLOADS_RUNNING_MAX);
        file_slot = Some(slot_or_retry(rt, repl, actor, st, running)?);
    }
    learn_snapshot(actor, st);
    if stale_and_large(rt, actor, st, from) {
        // The file is held at an older state for a snapshot, and the pages
        // the commits wrote were not all captured: this upload would read
        // the whole database into memory. It waits for the file instead.
        retry_soon(rt, repl, actor, st);
        return None;
    }
    Some(file_slot)
}

/// Whether an upload streams an overdue snapshot or a repair, and the slot
/// it took for that.
struct Streaming {
    overdue: bool,
    repair: bool,
    slot: Option<SnapshotSlot>,
}

/// Takes the slot an overdue snapshot or a repair streams in, when the
/// replica needs one. None when the upload waits: the replica is then back
/// in the state and the upload queued again.
fn streaming_slot(
    rt: &Arc<Inner>,
    repl: &Replication,
    actor: &Arc<Actor>,
    st: &mut ActorReplica,
    replica: Replica,
    from: &ImageFrom<'_>,
) -> Option<(Replica, Streaming)> {
    // An overdue snapshot streams in a slot of its own (below); with none
    // free, the upload waits for one rather than read the whole database
    // into memory, so the chain grows no further meanwhile.
    // A repair (a torn stream, or two failed) streams too: the whole file,
    // then its snapshot (ADR 0038).
    let overdue = replica.snapshot_overdue() && replica.overdue_may_stream();
    let repair = replica.needs_repair();
    let mut overdue_slot = None;
    if overdue || repair {
        if st.snapshotting || st.frozen || !matches!(from, ImageFrom::Db(_)) {
            // Not streamable now (the file is held for another read, or
            // the actor is closed): the upload waits rather than read the
            // whole database into memory.
            st.replica = Some(replica);
            retry_soon(rt, repl, actor, st);
            return None;
        }
        let running = (&repl.overdue_running, OVERDUE_RUNNING_MAX);
        overdue_slot = slot_or_retry(rt, repl, actor, st, running);
        if overdue_slot.is_none() {
            st.replica = Some(replica);
            return None;
        }
    }
    let streaming = Streaming {
        overdue,
        repair,
        slot: overdue_slot,
    };
    Some((replica, streaming))
}

/// What an upload carries, taken from the actor's state as it starts.
struct Started {
    /// The commits it covers.
    covered: u64,
    /// When the oldest commit it carries was made.
    oldest: Option<Instant>,
    /// The index writes around it (ADR 0009).
    round: UploadRound,
    /// The slot of the snapshot streamed after it, and whether that
    /// streams only a delta.
    snapshot: Option<(SnapshotSlot, bool)>,
    /// What the actor's file holds as the upload reads it.
    file: FileState,
}

/// Marks the upload in flight and takes what it carries from the state,
/// with the snapshot it leaves due if a slot is free for it.
fn start_upload(
    repl: &Replication,
    actor: &Actor,
    st: &mut ActorReplica,
    replica: &mut Replica,
    from: &ImageFrom<'_>,
    streaming: Streaming,
) -> Started {
    // In flight from here: the image read below covers every commit so far
    // (only this actor's turn, which is running this, commits).
    st.in_flight = true;
    st.last_started = Some(crate::clock::instant());
    let covered = st.committed;
    let oldest = st.pending_since.take();
    // Every entry this upload's commits name is listed before it, and what
    // they replaced removed after it (ADR 0009).
    let round = st.index.start_upload(covered);
    let snapshot = snapshot_slot(repl, actor, st, replica, from, streaming);
    // A closed actor's file is read only if its log is empty (checked
    // before it is read: a close leaves a short log, ADR 0076), whatever
    // `frozen` still says.
    let file = if snapshot.is_some() {
        FileState::Current
    } else if st.snapshotting || (st.frozen && matches!(from, ImageFrom::Db(_))) {
        FileState::Stale
    } else {
        FileState::Free
    };
    st.upload_reads_file = snapshot.is_some();
    Started {
        covered,
        oldest,
        round,
        snapshot,
        file,
    }
}

/// Takes a slot for the snapshot due and freezes the file for it: the slot
/// and whether it streams only a delta, or none (no snapshot due, no slot
/// free, the file held already or not frozen).
fn snapshot_slot(
    repl: &Replication,
    actor: &Actor,
    st: &mut ActorReplica,
    replica: &mut Replica,
    from: &ImageFrom<'_>,
    streaming: Streaming,
) -> Option<(SnapshotSlot, bool)> {
    let Streaming {
        overdue,
        repair,
        slot: overdue_slot,
    } = streaming;
    // A snapshot is due: the file is made to hold what this upload will
    // make the head, and kept so while the snapshot streams from it. A
    // delta takes a slot of its own kind, and then streams only as a delta.
    // An overdue one streams in a slot of its own: a few parts in memory, where
    // waiting longer would make the upload read the whole database.
    let mut snapshot = None;
    // A delta's slot streams only a delta; an overdue one streams
    // whichever the upload leaves due.
    let delta_only = !overdue && !repair && replica.snapshot_due() && replica.delta_possible();
    let (running, max) = if overdue || repair {
        (&repl.overdue_running, OVERDUE_RUNNING_MAX)
    } else if delta_only {
        (&repl.deltas_running, DELTAS_RUNNING_MAX)
    } else {
        (&repl.snapshots_running, SNAPSHOTS_RUNNING_MAX)
    };
    if replica.snapshot_due()
        && !st.snapshotting
        && !st.frozen
        && let ImageFrom::Db(db) = from
        && let Some(slot) = overdue_slot.or_else(|| SnapshotSlot::take(running, max))
    {
        match db.freeze_file() {
            Ok(()) => {
                st.frozen = true;
                if overdue {
                    replica.snapshot_streams_next();
                }
                snapshot = Some((slot, delta_only));
            }
            Err(e) => {
                tracing::warn!(actor = %actor.id, error = %e, "could not prepare the file for a snapshot")
            }
        }
    }
    snapshot
}

/// Reads what the upload ships, with the hold on the memory that takes.
/// None when it could not be read: the actor is then given up.
fn read_source(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    replica: &Replica,
    from: ImageFrom<'_>,
    file: FileState,
) -> Option<(Source, crate::pools::Hold)> {
    let open = matches!(from, ImageFrom::Db(_));
    let mut hold = match rt.pools.replica_buffers.reserve(&actor.id.tenant, 0) {
        Ok(hold) => hold,
        Err(e) => unreachable!("reserving nothing cannot fail: {e}"),
    };
    let source = upload_source(rt, actor, replica, from, file, &mut hold);
    if matches!(source, Ok(Source::File(_))) {
        let mut st = actor.repl.lock();
        st.upload_reads_file = true;
        // Frozen for the upload: the actor's turn thaws it once no upload
        // or snapshot reads the file (`thaw_if_done`).
        st.frozen |= open;
    }
    let source = match source {
        Ok(i) => i,
        Err(e) => {
            let mut st = actor.repl.lock();
            st.in_flight = false;
            st.upload_reads_file = false;
            give_up(
                rt,
                actor,
                &mut st,
                format!("reading the committed state: {e}"),
            );
            drop(st);
            actor.repl_done.notify_all();
            return None;
        }
    };
    Some((source, hold))
}

/// An upload started in the actor's turn, for the task that ships it.
struct Upload {
    rt: Arc<Inner>,
    actor: Arc<Actor>,
    bucket: Bucket,
    replica: Replica,
    source: Source,
    /// The index writes around the upload (ADR 0009).
    round: UploadRound,
    time_ms: u64,
    /// The commits it covers, and when the oldest of them was made.
    covered: u64,
    oldest: Option<Instant>,
    /// The memory the upload holds.
    hold: crate::pools::Hold,
    /// The slot of an upload with no base that reads a large file.
    file_slot: Option<SnapshotSlot>,
    repair: bool,
    /// The slot of the snapshot streamed after the upload, and whether
    /// that streams only a delta.
    snapshot: Option<(SnapshotSlot, bool)>,
}

/// Ships an upload (on the upload threads), then streams the snapshot it
/// left due if it took a slot for one.
async fn ship(upload: Upload) {
    let Upload {
        rt,
        actor,
        bucket,
        mut replica,
        source,
        round,
        time_ms,
        covered,
        oldest,
        hold,
        file_slot,
        repair,
        snapshot,
    } = upload;
    let started = crate::clock::instant();
    let (result, after) = upload_round(&rt, &bucket, &mut replica, round, source, time_ms).await;
    // What the upload held in memory is gone with it.
    drop(hold);
    drop(file_slot);
    let job_repairs = repair && snapshot.is_some();
    let job = match (&result, &snapshot) {
        (Ok(_), Some((_, true))) => replica.delta_job(),
        (Ok(_), Some((_, false))) => replica.snapshot_job(),
        _ => None,
    };
    let mut epoch = None;
    if job.is_some() {
        // Before the upload is seen to end: nobody closes the actor (or
        // checkpoints its file) while the snapshot streams.
        let mut st = actor.repl.lock();
        st.snapshotting = true;
        epoch = Some(st.epoch);
    }
    finish_upload(&rt, &actor, replica, covered, result, started, oldest);
    if let Some(landed) = after {
        tokio::spawn(after_landing(Arc::clone(&rt), bucket.clone(), landed));
    }
    if let Some(job) = job {
        stream_snapshot(&rt, &actor, job, epoch, job_repairs).await;
    }
    drop(snapshot);
}

/// Streams the snapshot (or delta) an upload left due and hands how it
/// ended to the actor's state; a repair that did not land gives the actor
/// up.
async fn stream_snapshot(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    job: SnapshotJob,
    epoch: Option<u64>,
    job_repairs: bool,
) {
    let landed = job.run().await.map_err(|e| {
        let torn = matches!(e, ReplicaError::SnapshotTorn { .. });
        (e.to_string(), torn)
    });
    match &landed {
        Ok(l) if l.delta_from.is_some() => Metrics::inc(&rt.metrics.replica_deltas_total),
        Ok(_) => Metrics::inc(&rt.metrics.replica_snapshots_total),
        Err(_) => Metrics::inc(&rt.metrics.replica_snapshot_failures_total),
    }
    let mut st = actor.repl.lock();
    // An actor given up meanwhile starts over with a replica of its
    // own, which learns the chain from the bucket.
    if Some(st.epoch) == epoch {
        st.snapshotting = false;
        match landed {
            // A repair that did not land: the actor starts over
            // from the bucket rather than repair again (each repair
            // appends an entry of every page).
            Err((e, _)) if job_repairs => {
                give_up(rt, actor, &mut st, format!("repairing its snapshot: {e}"))
            }
            landed => st.snapshot_done = Some(landed),
        }
    }
    drop(st);
    actor.repl_done.notify_all();
}

/// A slot of `running` (its counter and bound), or none: then the actor's
/// upload is tried again [`SLOT_RETRY_MS`] later.
fn slot_or_retry(
    rt: &Arc<Inner>,
    repl: &Replication,
    actor: &Arc<Actor>,
    st: &mut ActorReplica,
    (running, max): (&Arc<std::sync::atomic::AtomicUsize>, usize),
) -> Option<SnapshotSlot> {
    let slot = SnapshotSlot::take(running, max);
    if slot.is_none() {
        retry_soon(rt, repl, actor, st);
    }
    slot
}

/// Queues the actor's upload again [`SLOT_RETRY_MS`] from now: what it
/// needs (a slot, its file) is taken.
fn retry_soon(rt: &Arc<Inner>, repl: &Replication, actor: &Arc<Actor>, st: &mut ActorReplica) {
    defer(rt, repl, actor, st, Duration::from_millis(SLOT_RETRY_MS));
}

/// Queues a `Replicate` turn for the actor `wait` from now, unless one is
/// queued already: only the actor's own turn may read its file.
fn defer(
    rt: &Arc<Inner>,
    repl: &Replication,
    actor: &Arc<Actor>,
    st: &mut ActorReplica,
    wait: Duration,
) {
    if st.deferred {
        return;
    }
    st.deferred = true;
    let (rt, actor) = (Arc::clone(rt), Arc::clone(actor));
    repl.spawn(async move {
        tokio::time::sleep(wait).await;
        actor.repl.lock().deferred = false;
        let _ = rt.enqueue(
            &actor.id,
            Event::new(EventKind::Between(Between::Replicate), None),
            false,
        );
    });
}

/// The owner fence for a deleted actor (ADR 0009, R2): a tombstone above
/// the one the opening restored, so that a late upload of an earlier life
/// can no longer land and name an entry about to be removed. Only for an
/// actor opened from a tombstone (no database here); a chain that moved
/// gives the actor up.
pub(crate) fn fence_deleted(
    rt: &Inner,
    repl: &Replication,
    actor: &Actor,
) -> Result<(), RuntimeError> {
    let mut st = actor.repl.lock();
    while st.in_flight {
        actor.repl_done.wait(&mut st);
    }
    let Some(mut replica) = st.replica.take() else {
        return Err(RuntimeError::ReplicationFailed(
            "the actor's replica is not open".into(),
        ));
    };
    st.in_flight = true;
    drop(st);
    let result = repl.block_on(replica.fence_deleted(rt.clock.now_ms()));
    let mut st = actor.repl.lock();
    st.in_flight = false;
    st.replica = Some(replica);
    let out = match result {
        Ok(()) => {
            st.fenced = true;
            Ok(())
        }
        Err(e) => {
            let why = format!("fencing the deleted actor: {e}");
            give_up(rt, actor, &mut st, why.clone());
            Err(RuntimeError::ReplicationFailed(why))
        }
    };
    drop(st);
    actor.repl_done.notify_all();
    out
}

/// When the node stops: what waits for the upload interval is uploaded
/// now (a `Replicate` turn for each such actor), and later commits do not
/// wait for it.
pub(crate) fn flush_deferred(rt: &Inner, repl: &Replication) {
    repl.flushing
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let actors: Vec<Arc<Actor>> = rt.actors.lock().values().cloned().collect();
    for actor in actors {
        let pending = {
            let st = actor.repl.lock();
            st.deferred && !st.in_flight
        };
        if pending {
            let _ = rt.enqueue(
                &actor.id,
                Event::new(EventKind::Between(Between::Replicate), None),
                false,
            );
        }
    }
}

/// How long the next upload must still wait for the upload interval, if
/// it must: not when a `replicated` request waits for a commit it would
/// carry.
fn interval_left(st: &ActorReplica, interval: Duration) -> Option<Duration> {
    if st.urgent_upto > st.uploaded {
        return None;
    }
    let since = st.last_started?.elapsed();
    (since < interval).then(|| interval - since)
}

/// Drives an upload's [`UploadRound`] (the machine the simulator drives
/// too): PUTs the index entries its commits name (create-only, empty),
/// uploads, and hands back what to do once it landed. A listing that fails
/// uploads nothing (the caller gives the actor up).
async fn upload_round(
    rt: &Inner,
    bucket: &Bucket,
    replica: &mut Replica,
    mut round: UploadRound,
    source: Source,
    time_ms: u64,
) -> (Result<Uploaded, String>, Option<AfterLanding>) {
    let mut source = Some(source);
    let mut uploaded = None;
    let mut failed = String::new();
    loop {
        match round.poll_effect() {
            Some(UpkeepEffect::List(listing)) => {
                let result = list_entry(rt, bucket, &listing).await;
                if let Err(e) = &result {
                    failed = format!("listing the alarm in the index ({}): {e}", listing.key);
                }
                round.on_listed(result.unwrap_or(BucketResult::Failed));
            }
            Some(UpkeepEffect::Upload) => {
                let result = match source.take().expect("one upload a round") {
                    Source::Pages(pages) => replica.upload_pages(pages, time_ms).await,
                    Source::Image(image) => replica.upload(&image, time_ms).await,
                    Source::File(file) => replica.upload_file(&file, time_ms).await,
                }
                .map_err(|e| e.to_string());
                round.on_uploaded(result.is_ok());
                match result {
                    Ok(u) => uploaded = Some(u),
                    Err(e) => failed = e,
                }
            }
            Some(UpkeepEffect::Landed { remove, list_late }) => {
                let uploaded = uploaded.take().expect("landed after an upload");
                return (Ok(uploaded), Some(AfterLanding { remove, list_late }));
            }
            Some(UpkeepEffect::GiveUp(_)) | None => return (Err(failed), None),
        }
    }
}

/// PUTs one index entry (empty), create-only where the plan says so.
async fn list_entry(
    rt: &Inner,
    bucket: &Bucket,
    listing: &Listing,
) -> Result<BucketResult, ReplicaError> {
    let body = bytes::Bytes::new();
    let result = if listing.create_only {
        match bucket.create(&listing.key, body).await? {
            wasmkeep_replica::bucket::Created::Created => BucketResult::Done,
            wasmkeep_replica::bucket::Created::AlreadyExists => BucketResult::AlreadyExists,
        }
    } else {
        bucket.overwrite(&listing.key, body).await?;
        BucketResult::Done
    };
    Metrics::inc(&rt.metrics.index_puts_total);
    Ok(result)
}

/// The index writes an upload leaves for after it landed.
struct AfterLanding {
    remove: Vec<String>,
    list_late: Vec<Listing>,
}

/// Removes replaced index entries once the upload that stopped naming them
/// landed (R2), and lists what the (unsafe) late variant lists after it. A
/// failed removal leaves an extra entry, which a sweep delivers once and
/// then removes as stale.
async fn after_landing(rt: Arc<Inner>, bucket: Bucket, landed: AfterLanding) {
    for key in landed.remove {
        match bucket.delete(&key).await {
            Ok(()) => Metrics::inc(&rt.metrics.index_deletes_total),
            Err(e) => {
                tracing::warn!(key, error = %e, "could not remove a replaced alarm index entry; a sweep removes it")
            }
        }
    }
    for listing in landed.list_late {
        if let Err(e) = list_entry(&rt, &bucket, &listing).await {
            tracing::warn!(key = listing.key, error = %e, "could not list an alarm after its upload");
        }
    }
}

fn finish_upload(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    replica: Replica,
    covered: u64,
    result: Result<Uploaded, String>,
    started: Instant,
    oldest: Option<Instant>,
) {
    let m = &rt.metrics;
    let mut st = actor.repl.lock();
    st.in_flight = false;
    st.upload_reads_file = false;
    match result {
        Ok(uploaded) => {
            Metrics::inc(&m.replica_uploads_total);
            m.replica_upload_latency
                .observe_ms(started.elapsed().as_secs_f64() * 1000.0);
            if let Some(t) = oldest {
                m.replica_lag.observe_ms(t.elapsed().as_secs_f64() * 1000.0);
            }
            if let Uploaded::Appended {
                entry_bytes,
                snapshot,
                ..
            } = uploaded
            {
                m.replica_entry_bytes_total.inc_by(entry_bytes);
                if snapshot {
                    Metrics::inc(&m.replica_snapshots_total);
                }
            }
            st.replica = Some(replica);
            st.uploaded = st.uploaded.max(covered);
            let uploaded = st.uploaded;
            let (ready, waiting): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut st.waiters)
                .into_iter()
                .partition(|w| w.upto <= uploaded);
            st.waiters = waiting;
            let more = st.committed > st.uploaded;
            drop(st);
            actor.repl_done.notify_all();
            for w in ready {
                release(m, w.reply, w.out, (w.started, w.upload));
            }
            if more {
                // Only the actor's own turn may read its file.
                let _ = rt.enqueue(
                    &actor.id,
                    Event::new(EventKind::Between(Between::Replicate), None),
                    false,
                );
            }
        }
        Err(e) => {
            give_up(rt, actor, &mut st, e);
            drop(st);
            actor.repl_done.notify_all();
        }
    }
}

/// Marks the actor given up and fails every request waiting on the bucket.
fn give_up(rt: &Inner, actor: &Actor, st: &mut ActorReplica, why: String) {
    give_up_as(rt, actor, st, why, true);
}

/// [`give_up`]; `void`: whether the sidecar is voided (always, but where
/// the caller knows no commit of the actor can be answered with an error:
/// see `ensure_open`).
fn give_up_as(rt: &Inner, actor: &Actor, st: &mut ActorReplica, why: String, void: bool) {
    Metrics::inc(&rt.metrics.replica_given_up_total);
    let unshipped = st.committed.saturating_sub(st.uploaded);
    // New in this opening, and nothing of it in the bucket: every commit
    // in its file is void (ADR 0082).
    let new_actor = st.began_empty && !st.uploaded_any();
    if unshipped > 0 {
        // Said loudly: batches committed (and maybe acknowledged, without
        // `replicated`) that the bucket never got. Their database is set
        // aside as `actor.db.replaced-<ms>` when the actor opens again,
        // unless it holds data the bucket never saw from before.
        let what = if new_actor || st.had_state || st.uploaded_any() {
            "the actor reopens from the bucket and its local database, with them, is set aside \
             beside it (actor.db.replaced-<ms>)"
        } else {
            "the local database holds data the bucket has never seen and is kept (the failed \
             commits with it) and uploaded at the actor's next opening"
        };
        tracing::error!(
            actor = %actor.id,
            error = %why,
            batches = unshipped,
            "replication failed with commits the bucket lacks: {what}; an operator's restore \
             goes through the node (`wasmkeep restore --server`) to avoid this"
        );
    } else {
        tracing::warn!(actor = %actor.id, error = %why, "replication failed: giving the actor up");
    }
    // `replicated` requests are answered with a retryable error (those
    // waiting, below; those whose batch commits or becomes durable later,
    // by `hold_until_uploaded`): their commits must not come back under
    // their retries. The sidecar is voided first, so that the next opening
    // restores from the bucket and sets the file aside even after a crash
    // right after these answers, and even if an upload still in flight
    // lands and writes the sidecar again (ADR 0082 keeps a file ahead of
    // the head only by a sidecar that counts).
    if void {
        void_sidecar(rt, &actor.id, new_actor);
    }
    for w in std::mem::take(&mut st.waiters) {
        release(
            &rt.metrics,
            w.reply,
            Err(RuntimeError::ReplicationFailed(why.clone())),
            (w.started, w.upload),
        );
    }
    st.given_up = Some(why);
    // What was captured describes a file the next opening replaces; its
    // memory goes when the last connection holding it closes.
    page_capture::untrack(&paths::actor_dir(&rt.config.data_dir, &actor.id));
}

/// Voids the actor's sidecar ([`wasmkeep_replica::void_sidecar`]) before
/// `replicated` requests are answered with an error (or not at all): its
/// next opening restores from the bucket rather than keep the file as
/// ahead of the head with their commits (ADR 0082).
/// `new_actor`: the actor was new in this opening and nothing of it
/// reached the bucket, so every commit in its file is void
/// ([`wasmkeep_replica::Void::NewActor`]).
fn void_sidecar(rt: &Inner, id: &ActorId, new_actor: bool) {
    let db = paths::actor_db(&rt.config.data_dir, id);
    let void = if new_actor {
        wasmkeep_replica::Void::NewActor
    } else {
        wasmkeep_replica::Void::Commits
    };
    if let Err(e) = wasmkeep_replica::void_sidecar(&db, void) {
        tracing::error!(actor = %id, error = %e, "could not void the actor's sidecar: a failed replicated write may come back at its next opening");
    }
}

/// At a stop, once every turn has ended: an actor with commits of
/// clients' `replicated` requests the bucket does not hold yet has its
/// sidecar voided. The process may end before their uploads land, and
/// their clients then get an error (or nothing) and retry: those commits
/// must not come back at the next start as a file ahead of the head
/// (ADR 0082).
pub(crate) fn void_unanswered_at_stop(rt: &Inner, actors: &[Arc<Actor>]) {
    for a in actors {
        let (unanswered, new_actor) = {
            let st = a.repl.lock();
            (
                st.given_up.is_none() && st.replicated_upto > st.uploaded,
                st.began_empty && !st.uploaded_any(),
            )
        };
        if unanswered {
            void_sidecar(rt, &a.id, new_actor);
        }
    }
}

fn release(
    m: &Metrics,
    reply: Reply,
    out: Result<Outcome, RuntimeError>,
    (started, upload): (Option<Instant>, Option<UploadSpan>),
) {
    if let Some(t) = started {
        m.event_latency
            .observe_ms(t.elapsed().as_secs_f64() * 1000.0);
    }
    if let Some(u) = upload {
        let mut span = crate::trace::Span::new(
            u.parent.child(),
            Some(u.parent.span_id),
            "upload",
            crate::trace::SpanKind::Internal,
            (u.since, crate::clock::instant()),
        );
        span.error = out.as_ref().err().map(RuntimeError::code);
        u.traces.record(span);
    }
    let _ = reply.send(out);
}

/// Where the actor's replication stands now: a waiter at this mark is
/// released once everything committed so far is in the bucket.
pub(crate) fn current_mark(actor: &Actor) -> Mark {
    let st = actor.repl.lock();
    Mark {
        epoch: st.epoch,
        upto: st.committed,
    }
}

/// For a request that asked for replicated durability, once its batch is
/// locally durable: answers now if the bucket holds its batch, otherwise
/// holds the answer until it does (or the actor is given up).
pub(crate) fn hold_until_uploaded(
    m: &Metrics,
    actor: &Actor,
    mark: Mark,
    reply: Reply,
    out: Result<Outcome, RuntimeError>,
    spans: (Option<Instant>, Option<UploadSpan>),
) {
    hold(m, actor, (mark, true), reply, out, spans);
}

/// Unsafe, for the test of the rule in [`hold_until_uploaded`] only (the
/// fault switch `unsafe_fail_landed_after_give_up`): a give-up fails the
/// request even if the bucket holds its batch.
pub(crate) fn hold_ignoring_landed(
    m: &Metrics,
    actor: &Actor,
    mark: Mark,
    reply: Reply,
    out: Result<Outcome, RuntimeError>,
    spans: (Option<Instant>, Option<UploadSpan>),
) {
    hold(m, actor, (mark, false), reply, out, spans);
}

fn hold(
    m: &Metrics,
    actor: &Actor,
    (mark, landed_counts): (Mark, bool),
    reply: Reply,
    out: Result<Outcome, RuntimeError>,
    (started, upload): (Option<Instant>, Option<UploadSpan>),
) {
    let mut st = actor.repl.lock();
    // The upload carrying the batch may land before the batch's local sync
    // ends, and a give-up (a later upload failing, a stale lease) come in
    // between: the bucket holds the batch all the same, and the actor's
    // next opening restores it from there. Answered as done: an error would
    // have its retry apply it twice. (Not after a delete or a restore: the
    // data the batch belongs to was replaced.)
    let landed = landed_counts && st.landed(mark);
    let failed = match &st.given_up {
        _ if landed => None,
        Some(why) => Some(why.clone()),
        // Given up and started over since the commit: the bucket's state,
        // which the actor now serves, does not have it.
        None if st.epoch != mark.epoch => {
            Some("the actor was given up after this request's commit".to_string())
        }
        None => None,
    };
    if let Some(why) = failed {
        drop(st);
        return release(
            m,
            reply,
            Err(RuntimeError::ReplicationFailed(why)),
            (started, upload),
        );
    }
    if landed || st.uploaded >= mark.upto {
        drop(st);
        return release(m, reply, out, (started, upload));
    }
    st.waiters.push(Waiter {
        upto: mark.upto,
        reply,
        out,
        started,
        upload,
    });
}

/// Deletes the actor from the bucket (its data was deleted): waits for an
/// upload in flight, then leaves a tombstone above the chain and erases
/// what is below it (ADR 0007, "Deleting an actor"), and forgets the
/// replica. The next life continues the chain above the tombstone.
/// Before an operator's restore (`crate::restore`), in the actor's turn:
/// every commit of the actor is in the bucket, so that what was
/// acknowledged before the restore stays in its history (`wasmkeep export
/// --at` finds it), and no upload is in flight or due. Waits at most
/// [`DELETE_WAIT_MS`].
pub(crate) fn flush_for_restore(
    rt: &Arc<Inner>,
    repl: &Replication,
    actor: &Arc<Actor>,
    mut db: Option<&mut ActorDb>,
) -> Result<(), RuntimeError> {
    ensure_open(rt, repl, actor)?;
    let deadline = crate::clock::instant() + Duration::from_millis(DELETE_WAIT_MS);
    loop {
        let mut st = actor.repl.lock();
        if let Some(why) = &st.given_up {
            return Err(RuntimeError::ReplicationFailed(format!(
                "the actor's replication failed before the restore: {why}"
            )));
        }
        if st.uploaded >= st.committed && !st.in_flight && !st.snapshotting {
            return Ok(());
        }
        if !st.in_flight && st.uploaded < st.committed {
            // Now, not at the upload interval's end.
            st.urgent_upto = st.committed;
            st.last_started = None;
            drop(st);
            upload_pending(rt, repl, actor, db.as_deref_mut());
            continue;
        }
        if actor.repl_done.wait_until(&mut st, deadline).timed_out() {
            return Err(RuntimeError::ReplicationFailed(
                "an upload or snapshot of this actor is still in flight; retry the restore".into(),
            ));
        }
    }
}

/// An operator's restore put `path` in place of the actor's database (the
/// actor is closed): it goes to the bucket as the next entry of the chain,
/// every page of it, and the actor reopens from the chain at its next turn.
/// Returns the entry's seq.
pub(crate) fn upload_restored(
    rt: &Inner,
    repl: &Replication,
    actor: &Actor,
    path: &Path,
) -> Result<u64, RuntimeError> {
    let mut st = actor.repl.lock();
    let Some(mut replica) = st.replica.take() else {
        return Err(RuntimeError::ReplicationFailed(
            "the actor's replica is not open".into(),
        ));
    };
    drop(st);
    let file = WholeFile::probe(path).map_err(|e| RuntimeError::Internal(e.to_string()))?;
    let landed = repl.block_on(replica.upload_file(&file, rt.clock.now_ms()));
    let mut st = actor.repl.lock();
    match landed {
        Ok(Uploaded::Appended { position, .. }) => {
            // The next turn opens the actor afresh: its sidecar names the
            // head this upload made.
            st.reset();
            Ok(position.seq)
        }
        Ok(Uploaded::Unchanged) => {
            st.reset();
            Ok(0)
        }
        Err(e) => {
            let why = format!("uploading the restored database: {e}");
            st.replaced = true;
            give_up(rt, actor, &mut st, why.clone());
            Err(RuntimeError::ReplicationFailed(why))
        }
    }
}

pub(crate) fn delete(rt: &Inner, repl: &Replication, actor: &Actor) -> Result<u64, RuntimeError> {
    let mut st = actor.repl.lock();
    let deadline = crate::clock::instant() + Duration::from_millis(DELETE_WAIT_MS);
    // A snapshot streaming would land below the tombstone, after the
    // delete removed the snapshots there: it is waited for too.
    let snapshots = !repl.config.unsafe_delete_ignores_snapshots;
    while st.in_flight || (snapshots && st.snapshotting) {
        if actor.repl_done.wait_until(&mut st, deadline).timed_out() {
            return Err(RuntimeError::ReplicationFailed(
                "an upload or snapshot of this actor is still in flight; retry the delete".into(),
            ));
        }
    }
    // No upload can start meanwhile: this is the actor's turn.
    drop(st);
    let n = repl
        .block_on(wasmkeep_replica::delete_all(
            &repl.bucket,
            &actor.id,
            repl.generation,
            &repl.config,
            rt.clock.now_ms(),
        ))
        .map_err(|e| RuntimeError::ReplicationFailed(format!("deleting from the bucket: {e}")))?;
    // Nothing of the refused chain is readable any more: the actor starts
    // over.
    repl.refusals.lock().forget(&actor.id);
    let mut st = actor.repl.lock();
    for w in std::mem::take(&mut st.waiters) {
        release(
            &rt.metrics,
            w.reply,
            Err(RuntimeError::ReplicationFailed(
                "the actor was deleted".into(),
            )),
            (w.started, w.upload),
        );
    }
    st.reset();
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A durable request whose batch committed before the actor was given
    /// up, and that no upload carried, must fail even if its reply is
    /// released only after the actor started over (its write is not in the
    /// state the actor now serves).
    #[test]
    fn an_unuploaded_mark_from_before_a_give_up_never_succeeds() {
        let actor = Actor::new(ActorId::new("t", "a", "c", "n").unwrap());
        let m = Metrics::default();
        let mark = {
            let mut st = actor.repl.lock();
            st.committed = 1;
            Mark {
                epoch: st.epoch,
                upto: 1,
            }
        };
        // The upload failed and the next turn started over, before the
        // batch's local sync released its reply.
        actor.repl.lock().reset_after_give_up();
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        hold_until_uploaded(
            &m,
            &actor,
            mark,
            Reply::new(tx),
            Ok(Outcome::Done),
            (None, None),
        );
        match rx.try_recv() {
            Ok(Err(RuntimeError::ReplicationFailed(_))) => {}
            other => panic!("expected replication_failed at once, got {other:?}"),
        }

        // A mark of the current epoch waits for its upload.
        let mark = Mark {
            epoch: actor.repl.lock().epoch,
            upto: 1,
        };
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        hold_until_uploaded(
            &m,
            &actor,
            mark,
            Reply::new(tx),
            Ok(Outcome::Done),
            (None, None),
        );
        assert!(rx.try_recv().is_err(), "answered before its upload");
    }

    /// What `hold_until_uploaded` answers for `mark` now.
    fn answer_now(actor: &Actor, mark: Mark) -> Option<Result<Outcome, RuntimeError>> {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let m = Metrics::default();
        hold_until_uploaded(
            &m,
            actor,
            mark,
            Reply::new(tx),
            Ok(Outcome::Done),
            (None, None),
        );
        rx.try_recv().ok()
    }

    fn failed(answer: Option<Result<Outcome, RuntimeError>>) -> bool {
        matches!(answer, Some(Err(RuntimeError::ReplicationFailed(_))))
    }

    /// A batch whose upload landed before the actor was given up (or
    /// started over) is in the bucket, which the actor reopens from: its
    /// request is answered as done when its local sync ends after the
    /// give-up, not `replication_failed`, which a retry would apply twice.
    /// Batches past what landed still fail.
    #[test]
    fn a_batch_the_bucket_holds_succeeds_after_a_give_up() {
        let actor = Actor::new(ActorId::new("t", "a", "c", "n").unwrap());
        let (first, second) = {
            let mut st = actor.repl.lock();
            st.committed = 2;
            st.uploaded = 1;
            st.given_up = Some("a later upload failed".into());
            let e = st.epoch;
            (Mark { epoch: e, upto: 1 }, Mark { epoch: e, upto: 2 })
        };
        assert!(matches!(answer_now(&actor, first), Some(Ok(Outcome::Done))));
        assert!(failed(answer_now(&actor, second)));
        // The next turn started over: what the ended epoch uploaded counts.
        actor.repl.lock().reset_after_give_up();
        // Its own uploads do not count for the epoch before: were the
        // epoch not checked, `second` would pass here, and `first` after
        // the next start over.
        actor.repl.lock().uploaded = 2;
        assert!(matches!(answer_now(&actor, first), Some(Ok(Outcome::Done))));
        assert!(failed(answer_now(&actor, second)));
        // Two starts over on, the first epoch is not known any more: it
        // fails (its sync would have had to outlast both).
        actor.repl.lock().reset_after_give_up();
        assert!(failed(answer_now(&actor, first)));
    }

    /// After a delete or an operator's restore the data a mark names was
    /// replaced: a landed mark from before fails, so that nothing waiting
    /// on it (outbox rows, sockets, a bookmark's restore) reaches the new
    /// data.
    #[test]
    fn a_landed_mark_from_before_a_delete_fails() {
        let (actor, mark) = one_landed_batch(|_| {});
        actor.repl.lock().reset();
        assert!(failed(answer_now(&actor, mark)));
    }

    /// The same after an operator's restore whose upload failed (a give-up
    /// of a replaced file): before the start over and after it.
    #[test]
    fn a_landed_mark_from_before_a_failed_restore_fails() {
        let (actor, mark) = one_landed_batch(|st| {
            st.replaced = true;
            st.given_up = Some("uploading the restored database: refused".into());
        });
        assert!(failed(answer_now(&actor, mark)));
        actor.repl.lock().reset_after_give_up();
        assert!(failed(answer_now(&actor, mark)));

        // A mark of the opening before the restore's: given up (a later
        // upload failed), started over, then the restore's upload failed.
        let (actor, mark) = one_landed_batch(|st| {
            st.given_up = Some("a later upload failed".into());
        });
        actor.repl.lock().reset_after_give_up();
        assert!(matches!(answer_now(&actor, mark), Some(Ok(Outcome::Done))));
        actor.repl.lock().replaced = true;
        assert!(failed(answer_now(&actor, mark)));
    }

    /// An actor with one batch, which the bucket holds, then `f` applied to
    /// its state; and that batch's mark.
    fn one_landed_batch(f: impl FnOnce(&mut ActorReplica)) -> (Actor, Mark) {
        let actor = Actor::new(ActorId::new("t", "a", "c", "n").unwrap());
        let mark = {
            let mut st = actor.repl.lock();
            st.committed = 1;
            st.uploaded = 1;
            f(&mut st);
            Mark {
                epoch: st.epoch,
                upto: 1,
            }
        };
        (actor, mark)
    }

    /// Bad bucket input fails the actor as `storage_corrupt`, not as a
    /// retryable `replication_failed`, and names the actor and the object;
    /// a failing bucket stays retryable.
    #[test]
    fn a_refused_restore_is_storage_corrupt_naming_the_actor() {
        let id = ActorId::new("t", "a", "c", "n").unwrap();
        let bad = ReplicaError::ImageCorrupt {
            key: "state/t/a/c/6e/snap/00000000000000000007".into(),
            detail: "Page 2 is never used".into(),
        };
        let e = restore_error(&id, bad);
        assert_eq!(e.code(), "storage_corrupt");
        assert!(!e.is_retryable());
        let msg = e.to_string();
        assert!(msg.contains("snap/00000000000000000007"), "{msg}");
        assert!(msg.ends_with(&format!("actor={id}")), "{msg}");

        let network = ReplicaError::InvalidUrl("unreachable".into());
        let e = restore_error(&id, network);
        assert_eq!(e.code(), "replication_failed");
        assert!(e.is_retryable());
    }

    /// A refusal stands for its back-off and is then forgotten; a clock
    /// that went backwards ends it; a back-off of 0 remembers nothing.
    #[test]
    fn a_refusal_stands_for_its_back_off() {
        let id = ActorId::new("t", "a", "c", "n").unwrap();
        let mut r = Refusals::new(8, 1_000);
        assert_eq!(r.get(&id, 5_000), None);
        r.remember(&id, 5_000, "refused".into());
        assert_eq!(r.get(&id, 5_000).as_deref(), Some("refused"));
        assert_eq!(r.get(&id, 5_999).as_deref(), Some("refused"));
        assert_eq!(r.get(&id, 6_000), None);
        assert_eq!(r.len(), 0, "a passed refusal is forgotten");
        r.remember(&id, 5_000, "refused".into());
        assert_eq!(r.get(&id, 4_000), None);
        r.remember(&id, 5_000, "refused".into());
        r.forget(&id);
        assert_eq!(r.get(&id, 5_000), None);
        let mut off = Refusals::new(8, 0);
        off.remember(&id, 5_000, "refused".into());
        assert_eq!(off.get(&id, 5_000), None);
    }

    /// However many actors are refused, the map holds at most its cap:
    /// expired refusals go first, then the oldest.
    #[test]
    fn refusals_are_capped() {
        let id = |i: u32| ActorId::new("t", "a", "c", &format!("n{i}")).unwrap();
        let mut r = Refusals::new(4, 1_000);
        for i in 0..4 {
            r.remember(&id(i), 100 + i as u64, format!("refused {i}"));
        }
        // Full, nothing expired: the oldest (0) makes room.
        r.remember(&id(4), 200, "refused 4".into());
        assert_eq!(r.len(), 4);
        assert_eq!(r.get(&id(0), 200), None);
        assert!(r.get(&id(1), 200).is_some());
        // Many more, later: never past the cap, and the newest stand.
        for i in 5..10_000 {
            r.remember(&id(i), 2_000 + i as u64, format!("refused {i}"));
            assert!(r.len() <= 4);
        }
        assert!(r.get(&id(9_999), 12_000).is_some());
        // Remembering an actor again replaces its refusal in place.
        r.remember(&id(9_999), 12_001, "again".into());
        assert_eq!(r.len(), 4);
    }

    /// A given-up actor holds nothing worth waiting for: shutdown and the
    /// idle reaper must not wait on it.
    #[test]
    fn a_given_up_actor_is_not_busy() {
        let mut st = ActorReplica {
            committed: 3,
            uploaded: 1,
            ..ActorReplica::default()
        };
        assert!(st.busy());
        st.given_up = Some("chain moved".into());
        assert!(!st.busy());
        st.in_flight = true;
        assert!(st.busy());
    }
}
