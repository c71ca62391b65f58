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
//! - A delivery from a sweep ([`deliver`]) runs the alarm if it is the
//!   committed one and due; otherwise it reports what the sweep may remove
//!   (R2, R3), after indexing the committed alarm and fencing (one upload
//!   of `owner_fence`) when the rules ask for it.
//!
//! Only a node whose [`RunGate`](crate::RunGate) keeps the index (a cluster
//! node) does any of this; a single node has no index.

use std::sync::Arc;

use wasmkeep_cluster::alarm_index::{
    self, Address, AlarmState as IndexAlarm, Indexed, Layout, StaleContext, StaleStep,
};
use wasmkeep_cluster::delivery::{self, Delivery, Restored};
use wasmkeep_cluster::{ClusterConfig, Rules};
use wasmkeep_store::{ActorDb, ActorId};

use crate::actor::Actor;
use crate::error::RuntimeError;
use crate::replication::Replication;
use crate::runtime::Inner;

/// The meta key naming the entry that lists the committed alarm.
pub const ALARM_INDEXED_META: &str = "alarm_indexed";
/// The meta key an owner writes to end an earlier owner's history before it
/// removes entries as stale (R2's fence).
pub const OWNER_FENCE_META: &str = "owner_fence";

/// Index writes queued on an actor's replication state, each with the
/// commit it belongs to.
#[derive(Debug, Default)]
pub struct Pending {
    /// PUT (create-only, empty) before the upload that carries the commit.
    pub puts: Vec<(u64, String)>,
    /// Remove once the upload that carries the commit landed.
    pub deletes: Vec<(u64, String)>,
}

/// What a sweep's delivery of an index entry found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// The entry is the committed alarm and it was due: `on-alarm` ran
    /// (`ok`: without failing; a failure committed its retry).
    Ran { ok: bool },
    /// The committed alarm is at the entry's time but not due by this
    /// node's clock: the timer holds it.
    NotDue,
    /// The entry is stale and the owner indexed its alarm or uploaded its
    /// fence first: deliver again to learn what to remove.
    Fenced,
    /// The entry is stale: remove the actor's entries at that time in that
    /// layout but `named`, none written under a generation above
    /// `generation`.
    Remove {
        named: Option<Indexed>,
        generation: u64,
    },
    /// The actor has no state (deleted since, or never initialised): remove
    /// its entries at that time without running anything, none above
    /// `generation`. Only when the bucket holds the actor's history (a
    /// tombstone after a delete).
    NoState { generation: u64 },
    /// The bucket had nothing for the actor and this node uploaded nothing:
    /// remove nothing, try the entry again at `retry_at_ms` and let the
    /// actor go (R2's empty-bucket clause).
    Leave { retry_at_ms: u64 },
}

/// The address an actor has in its app's index.
pub fn address_of(id: &ActorId) -> Result<Address, RuntimeError> {
    Address::new(id.class.clone(), id.name.clone())
        .map_err(|e| RuntimeError::Internal(format!("the actor's index address: {e}")))
}

/// The bucket key of an entry in a layout.
pub fn entry_key(id: &ActorId, layout: Layout, key: &alarm_index::IndexKey) -> String {
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
pub fn read_record(db: &ActorDb) -> Result<Option<Indexed>, RuntimeError> {
    let meta = db.meta_get(ALARM_INDEXED_META)?.unwrap_or_default();
    Indexed::parse_meta(&meta)
        .map_err(|e| RuntimeError::Internal(format!("the actor's alarm_indexed record: {e}")))
}

/// The hold generation this node writes entries under, or the error that
/// gives the actor up: without a hold the index cannot be kept in line.
fn generation(rt: &Inner, id: &ActorId) -> Result<u64, RuntimeError> {
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
    let plan = alarm_index::plan_event_in_layouts(
        Rules::SAFE,
        &address,
        before.as_ref(),
        alarm,
        generation,
        rt.index_nonce(),
    )
    .map_err(|e| RuntimeError::Internal(format!("planning the alarm's index entry: {e}")))?;
    if plan.record == before && plan.put_before_upload.is_none() {
        return Ok(false);
    }
    db.meta_set(ALARM_INDEXED_META, &Indexed::to_meta(plan.record.as_ref()))?;
    let mut st = actor.repl.lock();
    // The commit this batch becomes (`after_commit` counts it).
    let commit = st.committed + 1;
    if let Some(put) = plan.put_before_upload {
        st.index
            .puts
            .push((commit, entry_key(id, Layout::App, &put.key)));
    }
    if let Some((layout, key)) = plan.delete_after_upload
        && may_remove(rt, id, layout, &key)
    {
        st.index.deletes.push((commit, entry_key(id, layout, &key)));
    }
    Ok(true)
}

/// Whether an owner may remove an entry it replaced. Entries in the app's
/// index, and tagged ones in the tenant-wide index (a fresh key per PUT,
/// R1), belong to this actor alone. An untagged tenant-wide entry is shared
/// by every app of the tenant with an actor of that class and name and an
/// alarm at that time: removed only when no other app of the tenant has
/// the class (a sweep removes it otherwise, once no app names it).
pub fn may_remove(rt: &Inner, id: &ActorId, layout: Layout, key: &alarm_index::IndexKey) -> bool {
    layout == Layout::App
        || key.entry.tag.is_some()
        || rt.apps_with_class(&id.tenant, &id.class) <= 1
}

/// A sweep's delivery of an entry at `at_ms`, inside the batch's
/// transaction. `had_state`: the bucket held the actor's history when it
/// was opened; `uploaded`: this node uploaded the actor since.
pub fn deliver(
    rt: &Inner,
    db: &ActorDb,
    id: &ActorId,
    at_ms: u64,
    initialized: bool,
    had_state: bool,
    uploaded: bool,
) -> Result<DeliverStep, RuntimeError> {
    let committed = db.alarm()?;
    let generation = generation(rt, id)?;
    let config = ClusterConfig::default();
    let now = rt.clock.now_ms();
    let restored = Restored {
        alarm_at_ms: committed.map(|a| a.at_ms),
        initialised: initialized,
    };
    // The same rule the simulator checks, with its no-state clause: an
    // actor with no state is not run (that would create it again).
    match delivery::plan_delivery(Rules::SAFE, at_ms, &restored, now) {
        Delivery::NoState => {
            return Ok(DeliverStep::Done(no_state(
                had_state, uploaded, generation, now, &config,
            )));
        }
        Delivery::Run => return Ok(DeliverStep::Run),
        Delivery::NotDue { .. } => return Ok(DeliverStep::Done(Delivered::NotDue)),
        Delivery::Stale => {}
    }
    let record = read_record(db)?;
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
        bucket_had_state: had_state,
        uploaded_since_take: uploaded,
    };
    Ok(
        match alarm_index::next_stale_step(Rules::SAFE, &ctx, &config, now) {
            StaleStep::IndexCommitted | StaleStep::Fence => {
                // One commit does both: the batch's planning lists the
                // committed alarm, and the fence makes it an upload.
                db.meta_set(
                    OWNER_FENCE_META,
                    &format!("{generation:020}-{:016x}", rt.index_nonce()),
                )?;
                DeliverStep::Fence
            }
            StaleStep::ListAndDelete => DeliverStep::Done(Delivered::Remove {
                named: record,
                generation,
            }),
            StaleStep::LeaveAndRelease { retry_at_ms } => {
                DeliverStep::Done(Delivered::Leave { retry_at_ms })
            }
        },
    )
}

/// An entry delivered for an actor with no state: removed when the bucket
/// holds the actor's history (deleted since); left, as R2 says, when the
/// bucket never had the actor and this node uploaded nothing of it.
pub fn no_state(
    had_state: bool,
    uploaded: bool,
    generation: u64,
    now_ms: u64,
    config: &ClusterConfig,
) -> Delivered {
    if had_state || uploaded {
        Delivered::NoState { generation }
    } else {
        Delivered::Leave {
            retry_at_ms: now_ms + config.retry_max_ms,
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
    /// Nothing to run.
    Done(Delivered),
}

/// Drops the index writes planned for a commit that did not happen (the
/// batch rolled back after planning): removing the entry it replaced would
/// unlist an alarm the database still names.
pub fn forget_planned(actor: &Actor) {
    let mut st = actor.repl.lock();
    let next = st.committed + 1;
    st.index.puts.retain(|(c, _)| *c < next);
    st.index.deletes.retain(|(c, _)| *c < next);
}

/// The `alarm_indexed` record of a closed actor's database file, if it
/// has one that parses.
pub fn read_record_at(db_path: &std::path::Path) -> Option<Indexed> {
    if !db_path.exists() {
        return None;
    }
    let sql = format!("SELECT value FROM _wasmkeep_meta WHERE key = '{ALARM_INDEXED_META}'");
    let r = wasmkeep_store::db::inspect_query(db_path, &sql, 1).ok()?;
    match r.rows.first()?.first()? {
        wasmkeep_store::Value::Text(t) => Indexed::parse_meta(t).ok().flatten(),
        _ => None,
    }
}

/// After a delete's tombstone landed: removes the entry the deleted
/// database named. Best effort: an entry left is delivered once, finds no
/// state, and is removed then.
pub fn remove_named(rt: &Inner, repl: &Replication, id: &ActorId, named: &Indexed) {
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
pub fn plan_alone(rt: &Inner, actor: &Arc<Actor>, db: &mut ActorDb) -> Result<(), RuntimeError> {
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
        st.pending_since.get_or_insert_with(std::time::Instant::now);
    }
    Ok(())
}
