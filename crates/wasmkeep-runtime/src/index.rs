//! ADR 0009's alarm index as an owner keeps it, in a cluster.
//!
//! The rules are `wasmkeep_cluster::alarm_index`'s pure functions; this
//! module applies them to a running actor:
//!
//! - Before a batch that changed the alarm commits (and in the first batch
//!   after the actor is opened, which migrates an entry from the
//!   tenant-wide index and lists an alarm local data brought along, R4),
//!   [`plan_before_commit`] plans the entry: the new `alarm_indexed` value
//!   is written in the same transaction, the PUT of the fresh entry and the
//!   removal of the replaced one are queued on the actor's replication
//!   state with the commit they belong to.
//! - The upload that carries that commit PUTs the entry first; if the PUT
//!   fails, nothing is uploaded and the actor is given up (no other node
//!   could find an alarm the bucket's state names but the index lacks).
//!   Once the upload landed, the replaced entry is removed (R2).
//! - While the bucket has nothing for the actor and this opening uploaded
//!   nothing, the first batch lists the alarm under a fresh key whatever
//!   the database records (R4): an entry recorded before may never have
//!   been written (its PUT failed, or the node died before it).
//! - A delivery from a sweep ([`deliver`]) runs the alarm if it is the
//!   committed one and due. Otherwise, inside the actor's turn, it removes
//!   the actor's stale entries at that time (R2, R3): only once every
//!   local commit is in the bucket (what the replicated state names is
//!   then what the database names), after indexing the committed alarm
//!   and fencing (an upload of `owner_fence`, or for a deleted actor a
//!   tombstone above the one restored) when this opening uploaded nothing.
//!   An actor with no state is never run.
//!
//! Only a cluster node (`RuntimeConfig::cluster`, with a bucket) does any
//! of this; a single node has no index. The hold generation entries are
//! tagged with comes from the node's [`RunGate`](crate::RunGate).

use std::sync::Arc;

use wasmkeep_cluster::Rules;
use wasmkeep_cluster::alarm_index::{
    self, Address, AlarmState as IndexAlarm, Indexed, Layout, StaleContext, StaleStep,
};
use wasmkeep_cluster::delivery::{self, Delivery, Restored};
use wasmkeep_cluster::machine::{
    BucketOp, BucketResult, CleanupEffect, CleanupOutcome, Listing, Planned, StaleCleanup,
};
use wasmkeep_store::{ActorDb, ActorId};

use crate::actor::Actor;
use crate::error::RuntimeError;
use crate::node::Inner;
use crate::replication::Replication;

/// The meta key naming the entry that lists the committed alarm.
pub(crate) const ALARM_INDEXED_META: &str = "alarm_indexed";
/// The meta key an owner writes to end an earlier owner's history before it
/// removes entries as stale (R2's fence).
pub(crate) const OWNER_FENCE_META: &str = "owner_fence";

/// What a sweep's delivery of an index entry found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// The entry is the committed alarm and it was due: `on-alarm` ran
    /// without failing (a failing handler answers its error, its retry
    /// committed).
    Ran,
    /// The committed alarm is at the entry's time but not due by this
    /// node's clock (the timer holds it), or the actor cannot run it.
    NotDue,
    /// The entry is stale and the owner indexed its alarm, fenced, or
    /// waited for its commits to reach the bucket first: deliver again.
    Fenced,
    /// The entry was stale: this many of the actor's entries at that time
    /// were removed, in the actor's turn (an app's index).
    Cleaned { removed: u64 },
    /// The entry is stale (in the tenant-wide index, which the sweep
    /// cleans across apps): remove the actor's entries at that time but
    /// `named`, none written under a generation above `generation`. Every
    /// local commit was in the bucket when this was answered.
    Remove {
        named: Option<Indexed>,
        generation: u64,
    },
    /// The bucket had nothing for the actor and this node uploaded nothing:
    /// remove nothing, try the entry again at `retry_at_ms` and let the
    /// actor go (R2's empty-bucket clause).
    Leave { retry_at_ms: u64 },
}

/// The address an actor has in its app's index.
pub(crate) fn address_of(id: &ActorId) -> Result<Address, RuntimeError> {
    Address::new(id.class.clone(), id.name.clone())
        .map_err(|e| RuntimeError::Internal(format!("the actor's index address: {e}")))
}

/// The bucket key of an entry in a layout.
pub(crate) fn entry_key(id: &ActorId, layout: Layout, key: &alarm_index::IndexKey) -> String {
    match layout {
        Layout::App => format!(
            "{}{}",
            alarm_index::app_index_prefix(&id.tenant, &id.app),
            key.to_key()
        ),
        Layout::Tenant => format!(
            "{}{}",
            alarm_index::tenant_index_prefix(&id.tenant),
            key.to_key()
        ),
    }
}

/// The database's `alarm_indexed` record.
pub(crate) fn read_record(db: &ActorDb) -> Result<Option<Indexed>, RuntimeError> {
    let meta = db.meta_get(ALARM_INDEXED_META)?.unwrap_or_default();
    Indexed::parse_meta(&meta)
        .map_err(|e| RuntimeError::Internal(format!("the actor's alarm_indexed record: {e}")))
}

/// The hold generation this node writes entries under, or the error that
/// gives the actor up: without a hold the index cannot be kept in line.
pub(crate) fn generation(rt: &Inner, id: &ActorId) -> Result<u64, RuntimeError> {
    rt.hold_generation(id).ok_or_else(|| {
        RuntimeError::ReplicationFailed(format!(
            "this node does not hold actor {id}: its alarm cannot be listed in the index"
        ))
    })
}

/// Inside the batch's transaction, before it commits: brings
/// `alarm_indexed` in line with the committed alarm and queues the index
/// writes on the actor's replication state for commit number `commit`.
/// Returns whether the record changed (the batch then changed the
/// database).
pub fn plan_before_commit(
    rt: &Inner,
    actor: &Arc<Actor>,
    db: &ActorDb,
) -> Result<bool, RuntimeError> {
    let id = &actor.id;
    let alarm = db.alarm()?.map(|a| a.at_ms);
    let before = read_record(db)?;
    let address = address_of(id)?;
    let generation = generation(rt, id)?;
    let first = {
        let st = actor.repl.lock();
        st.needs_plan && !st.had_state && !st.uploaded_any()
    };
    let bad = |e| RuntimeError::Internal(format!("planning the alarm's index entry: {e}"));
    let plan = if first {
        // Nothing of the actor is in the bucket: the entry the database
        // records may never have been written. A fresh one, listed before
        // the first upload (R4); the recorded one goes after it.
        let p = alarm_index::plan_first_upload(
            Rules::SAFE,
            &address,
            alarm,
            generation,
            rt.index_nonce(),
        )
        .map_err(bad)?;
        alarm_index::LayoutPlan {
            put_before_upload: p.put_before_upload,
            record: p.record.map(Indexed::app),
            delete_after_upload: before.map(|b| {
                let key = alarm_index::IndexKey {
                    address: address.clone(),
                    entry: b.entry,
                };
                (b.layout, key)
            }),
        }
    } else {
        alarm_index::plan_event_in_layouts(
            Rules::SAFE,
            &address,
            before.as_ref(),
            alarm,
            generation,
            rt.index_nonce(),
        )
        .map_err(bad)?
    };
    if plan.record == before && plan.put_before_upload.is_none() {
        return Ok(false);
    }
    db.meta_set(ALARM_INDEXED_META, &Indexed::to_meta(plan.record.as_ref()))?;
    let planned = Planned {
        list_before: plan.put_before_upload.map(|put| Listing {
            key: entry_key(id, Layout::App, &put.key),
            create_only: put.create_only,
        }),
        list_after: None,
        remove_after: plan
            .delete_after_upload
            .filter(|(layout, key)| may_remove(rt, id, *layout, key))
            .map(|(layout, key)| entry_key(id, layout, &key)),
    };
    let mut st = actor.repl.lock();
    // The commit this batch becomes (`after_commit` counts it).
    let commit = st.committed + 1;
    st.index.plan(commit, planned);
    Ok(true)
}

/// Whether an owner may remove an entry it replaced. Entries in the app's
/// index, and tagged ones in the tenant-wide index (a fresh key per PUT,
/// R1), belong to this actor alone. An untagged tenant-wide entry is shared
/// by every app of the tenant with an actor of that class and name and an
/// alarm at that time: removed only when no other app of the tenant has
/// the class (a sweep removes it otherwise, once no app names it).
pub(crate) fn may_remove(
    rt: &Inner,
    id: &ActorId,
    layout: Layout,
    key: &alarm_index::IndexKey,
) -> bool {
    layout == Layout::App
        || key.entry.tag.is_some()
        || rt.apps_with_class(&id.tenant, &id.class) <= 1
}

/// Where an actor's replication stands when a delivery reaches it.
#[derive(Debug, Clone, Copy)]
pub struct Standing {
    /// The bucket held the actor's history (a state or a tombstone) when
    /// it was opened.
    pub had_state: bool,
    /// An upload (or a fence) of this opening landed.
    pub uploaded: bool,
    /// Every local commit is in the bucket.
    pub settled: bool,
}

impl Standing {
    /// The actor's standing now.
    pub fn of(actor: &Actor) -> Standing {
        let st = actor.repl.lock();
        Standing {
            had_state: st.had_state(),
            uploaded: st.uploaded_any(),
            settled: st.settled(),
        }
    }
}

/// A sweep's delivery of an entry at `at_ms`, inside the batch's
/// transaction. `remove_here`: the entry is in the actor's app's index, so
/// stale entries are removed in this turn; otherwise (the tenant-wide
/// index) the sweep removes them once every app answered.
pub fn deliver(
    rt: &Inner,
    db: &ActorDb,
    id: &ActorId,
    at_ms: u64,
    initialized: bool,
    standing: Standing,
    remove_here: bool,
) -> Result<DeliverStep, RuntimeError> {
    let committed = db.alarm()?;
    let generation = generation(rt, id)?;
    let config = &rt.config.protocol;
    let now = rt.clock.now_ms();
    let restored = Restored {
        alarm_at_ms: committed.map(|a| a.at_ms),
        initialised: initialized,
    };
    let record = read_record(db)?;
    let fence = |db: &ActorDb| -> Result<DeliverStep, RuntimeError> {
        // One commit does both: the batch's planning lists the committed
        // alarm, and the fence makes it an upload.
        db.meta_set(
            OWNER_FENCE_META,
            &format!("{generation:020}-{:016x}", rt.index_nonce()),
        )?;
        Ok(DeliverStep::Fence)
    };
    let remove = || -> Result<DeliverStep, RuntimeError> {
        let done = removal(rt, id, at_ms, record, generation, remove_here)?;
        Ok(DeliverStep::Done(done))
    };
    // The same rule the simulator checks, with its no-state clause: an
    // actor with no state is not run (that would create it again), and its
    // entry goes by the stale-entry steps, as the simulator's does.
    match delivery::plan_delivery(Rules::SAFE, at_ms, &restored, now) {
        Delivery::Run => return Ok(DeliverStep::Run),
        Delivery::NotDue { .. } => return Ok(DeliverStep::Done(Delivered::NotDue)),
        Delivery::Stale | Delivery::NoState => {}
    }
    let indexed = match record {
        Some(Indexed {
            layout: Layout::App,
            entry,
        }) => Some(entry),
        _ => None,
    };
    let state = IndexAlarm {
        at_ms: committed.map(|a| a.at_ms),
        indexed,
        retry_count: committed.map_or(0, |a| a.retry_count),
    };
    let ctx = StaleContext {
        delivered_at_ms: at_ms,
        committed: &state,
        bucket_had_state: standing.had_state,
        uploaded_since_take: standing.uploaded,
    };
    match alarm_index::next_stale_step(Rules::SAFE, &ctx, config, now) {
        StaleStep::IndexCommitted | StaleStep::Fence => fence(db),
        // R2 speaks of the replicated state: until every local commit is
        // in the bucket, what the database names is not what a restore
        // would find.
        StaleStep::ListAndDelete if !standing.settled => Ok(DeliverStep::Wait),
        StaleStep::ListAndDelete => remove(),
        StaleStep::LeaveAndRelease { retry_at_ms } => {
            Ok(DeliverStep::Done(Delivered::Leave { retry_at_ms }))
        }
    }
}

/// What a delivery does for an actor with no state (none committed, never
/// initialised) whose database is not here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoStateStep {
    /// The bucket never had the actor and this opening uploaded nothing:
    /// remove nothing, try the entry again then (R2's empty-bucket clause).
    Leave { retry_at_ms: u64 },
    /// Nothing uploaded since the opening: end the history first (R2's
    /// fence), then deliver again.
    Fence,
    /// Local commits are not all in the bucket: wait for them.
    Wait,
    /// Remove the actor's entries at that time (never running anything).
    Remove,
}

/// R2's stale-entry steps (`next_stale_step`, the rule the simulator runs
/// for an actor with no state) with nothing committed to index, and the
/// runtime's one addition: entries go only once every local commit is in
/// the bucket.
pub(crate) fn no_state_step(rt: &Inner, at_ms: u64, standing: Standing) -> NoStateStep {
    let nothing = IndexAlarm {
        at_ms: None,
        indexed: None,
        retry_count: 0,
    };
    let ctx = StaleContext {
        delivered_at_ms: at_ms,
        committed: &nothing,
        bucket_had_state: standing.had_state,
        uploaded_since_take: standing.uploaded,
    };
    let now = rt.clock.now_ms();
    match alarm_index::next_stale_step(Rules::SAFE, &ctx, &rt.config.protocol, now) {
        StaleStep::LeaveAndRelease { retry_at_ms } => NoStateStep::Leave { retry_at_ms },
        StaleStep::Fence => NoStateStep::Fence,
        StaleStep::ListAndDelete if !standing.settled => NoStateStep::Wait,
        StaleStep::ListAndDelete => NoStateStep::Remove,
        StaleStep::IndexCommitted => unreachable!("no committed alarm to index"),
    }
}

/// Removes the actor's stale entries at `at_ms` now (its app's index), or
/// says what the sweep may remove (the tenant-wide index).
pub(crate) fn removal(
    rt: &Inner,
    id: &ActorId,
    at_ms: u64,
    named: Option<Indexed>,
    generation: u64,
    remove_here: bool,
) -> Result<Delivered, RuntimeError> {
    if !remove_here {
        return Ok(Delivered::Remove { named, generation });
    }
    let removed = remove_stale_here(rt, id, at_ms, named, generation)?;
    Ok(Delivered::Cleaned { removed })
}

/// In the actor's turn (so no event of the actor lists a new entry
/// meanwhile): removes the actor's stale entries at `at_ms` in its app's
/// index through `wasmkeep_cluster::machine::StaleCleanup`, the machine the
/// simulator drives too. Returns how many.
pub(crate) fn remove_stale_here(
    rt: &Inner,
    id: &ActorId,
    at_ms: u64,
    named: Option<Indexed>,
    generation: u64,
) -> Result<u64, RuntimeError> {
    let Some(repl) = rt.replication.as_ref() else {
        return Ok(0);
    };
    let prefix = alarm_index::app_index_prefix(&id.tenant, &id.app);
    let named = named.filter(|n| n.layout == Layout::App).map(|n| n.entry);
    // Owners write only tagged entries in an app's index.
    let legacy_entries = false;
    let mut cleanup = StaleCleanup::new(
        Rules::SAFE,
        &prefix,
        address_of(id)?,
        at_ms,
        named,
        generation,
        legacy_entries,
    );
    let mut failed = String::new();
    loop {
        match cleanup.poll_effect() {
            Some(CleanupEffect::Bucket(op)) => {
                let what = op.key().to_owned();
                let result = repl.block_on(perform(&repl.bucket, op));
                if let Err(e) = &result {
                    failed = format!("{what}: {e}");
                }
                cleanup.on_result(result.unwrap_or(BucketResult::Failed));
            }
            Some(CleanupEffect::Done(CleanupOutcome::Cleaned { removed, .. })) => {
                return Ok(removed);
            }
            Some(CleanupEffect::Done(CleanupOutcome::Failed)) | None => {
                return Err(RuntimeError::ReplicationFailed(format!(
                    "removing the actor's stale alarm index entries ({failed})"
                )));
            }
        }
    }
}

/// Performs a listing or a delete a cleanup asks for on the node's bucket.
async fn perform(
    bucket: &wasmkeep_replica::Bucket,
    op: BucketOp,
) -> Result<BucketResult, wasmkeep_replica::ReplicaError> {
    match op {
        BucketOp::List {
            prefix,
            start_after,
            limit,
        } => {
            let keys = bucket
                .list_page(&prefix, start_after.as_deref(), limit)
                .await?;
            Ok(BucketResult::Keys(keys))
        }
        BucketOp::Delete { key } => bucket.delete(&key).await.map(|()| BucketResult::Done),
        BucketOp::Get { .. } | BucketOp::PutCreate { .. } => {
            unreachable!("a stale cleanup lists and deletes only")
        }
    }
}

/// What [`deliver`] leaves to the batch.
#[derive(Debug)]
pub enum DeliverStep {
    /// Run the committed alarm (it is the delivered one and due).
    Run,
    /// The fence is written: the batch must plan the index and wait for
    /// the upload before it answers [`Delivered::Fenced`].
    Fence,
    /// Local commits are not all in the bucket yet: the batch waits for
    /// them before it answers [`Delivered::Fenced`].
    Wait,
    /// Nothing to run.
    Done(Delivered),
}

/// Drops the index writes planned for a commit that did not happen (the
/// batch rolled back after planning): removing the entry it replaced would
/// unlist an alarm the database still names.
pub(crate) fn forget_planned(actor: &Actor) {
    let mut st = actor.repl.lock();
    let next = st.committed + 1;
    st.index.forget_from(next);
}

/// The `alarm_indexed` record of a closed actor's database file, if it
/// has one that parses.
pub(crate) fn read_record_at(db_path: &std::path::Path) -> Option<Indexed> {
    let meta = read_meta_at(db_path, ALARM_INDEXED_META)?;
    Indexed::parse_meta(&meta).ok().flatten()
}

/// One `_wasmkeep_meta` value of a closed actor's database file (`key` is
/// one of this module's constants).
pub(crate) fn read_meta_at(db_path: &std::path::Path, key: &str) -> Option<String> {
    if !db_path.exists() {
        return None;
    }
    let sql = format!("SELECT value FROM _wasmkeep_meta WHERE key = '{key}'");
    let r =
        wasmkeep_store::db::inspect_query(db_path, &sql, &wasmkeep_store::InspectBounds::rows(1))
            .ok()?;
    match r.rows.first()?.first()? {
        wasmkeep_store::Value::Text(t) => Some(t.clone()),
        _ => None,
    }
}

/// After a delete's tombstone landed: removes the entry the deleted
/// database named. Best effort: an entry left is delivered once, finds no
/// state, and is removed then.
pub(crate) fn remove_named(rt: &Inner, repl: &Replication, id: &ActorId, named: &Indexed) {
    let key = alarm_index::IndexKey {
        address: match address_of(id) {
            Ok(a) => a,
            Err(_) => return,
        },
        entry: named.entry,
    };
    if !may_remove(rt, id, named.layout, &key) {
        return;
    }
    let key = entry_key(id, named.layout, &key);
    match repl.block_on(repl.bucket.delete(&key)) {
        Ok(()) => crate::metrics::Metrics::inc(&rt.metrics.index_deletes_total),
        Err(e) => {
            tracing::warn!(actor = %id, key, error = %e, "could not remove a deleted actor's alarm index entry; a sweep removes it");
        }
    }
}

/// Plans the index in a transaction of its own, for an upload no batch
/// planned (local data the bucket lacks, uploaded by the start-up pass:
/// R4 lists its alarm first). Counts a commit if the record changed.
pub(crate) fn plan_alone(
    rt: &Inner,
    actor: &Arc<Actor>,
    db: &mut ActorDb,
) -> Result<(), RuntimeError> {
    db.begin()?;
    let changed = match plan_before_commit(rt, actor, db) {
        Ok(changed) => changed,
        Err(e) => {
            db.rollback();
            return Err(e);
        }
    };
    if let Err(e) = db.commit() {
        db.rollback();
        forget_planned(actor);
        return Err(e.into());
    }
    let mut st = actor.repl.lock();
    st.needs_plan = false;
    if changed {
        st.committed += 1;
        st.pending_since.get_or_insert_with(crate::clock::instant);
    }
    Ok(())
}
