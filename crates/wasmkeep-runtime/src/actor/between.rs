//! The events that run on their own between two batches: an inspection
//! (the admin API reads the database), a delete and an operator's restore.
//! Each closes or bypasses the instance; none runs guest code.

use super::*;

/// An event that runs on its own between two batches.
pub enum Between {
    /// Remove the actor's data.
    Delete,
    /// Make the database file at this path the actor's: an operator's
    /// restore (`crate::restore`), or the actor's own return to a bookmark,
    /// whose undo token it records (`crate::bookmarks`).
    Restore(std::path::PathBuf, Option<String>),
    /// Read the actor's database (the admin API): through its own
    /// connection if it is open, which holds the file while it is.
    Inspect(InspectFn),
    /// Upload what is committed and not yet in the bucket (after an upload
    /// ended and more had been committed meanwhile).
    Replicate,
    /// Copy the actor's database to this file, brought in line with the
    /// bucket first: a class migration's copy (ADR 0060), which fails,
    /// unlike an inspection, when the actor could not be brought in line.
    Copy(std::path::PathBuf),
    /// A class migration's last step on an actor restored at its new
    /// address (ADR 0071): on a cluster node its alarm listed in the index
    /// (R4), then every commit in the bucket, before the old address goes.
    Settle,
}

/// Runs one of them: the batch before it has committed, the one after has
/// not begun.
pub(super) fn run_between(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    slot: &mut Option<Loaded>,
    between: Between,
    reply_to: Option<Reply>,
) {
    match between {
        Between::Delete => {
            let r = run_delete(rt, actor, slot);
            // A suspended event goes with the data (ADR 0056).
            actor.queue.lock().awaiting = None;
            reply(reply_to, r);
        }
        Between::Restore(file, undo) => {
            let r = run_restore(rt, actor, slot, &file, undo.as_deref()).map(Outcome::Restored);
            // The restored database says whether an event is suspended,
            // read when the actor opens next.
            actor.queue.lock().awaiting = None;
            *slot = None;
            if let (Err(e), None) = (&r, &reply_to) {
                tracing::warn!(actor = %actor.id, error = %e, "the restore to a bookmark the actor asked for failed; it keeps its state");
            }
            reply(reply_to, r);
        }
        Between::Replicate => {
            if let Some(repl) = &rt.replication {
                replication::upload_pending(
                    rt,
                    repl,
                    actor,
                    slot.as_mut().filter(|l| l.has_db()).map(|l| l.db()),
                );
            }
        }
        Between::Inspect(f) => run_inspect(rt, actor, slot, f),
        Between::Copy(dest) => {
            let r = run_copy(rt, actor, slot, &dest).map(|()| Outcome::Done);
            reply(reply_to, r);
        }
        Between::Settle => {
            let r = run_settle(rt, actor, slot).map(|()| Outcome::Done);
            reply(reply_to, r);
        }
    }
}

/// See [`Between::Settle`].
fn run_settle(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    slot: &mut Option<Loaded>,
) -> Result<(), RuntimeError> {
    let Some(repl) = &rt.replication else {
        return Ok(());
    };
    replication::ensure_open(rt, repl, actor)?;
    if !rt.keeps_index() {
        // No index to list in; the restore's upload left nothing behind.
        return Ok(());
    }
    let mut own: Option<ActorDb>;
    let mut db = slot.as_mut().filter(|l| l.has_db()).map(|l| l.db());
    if db.is_none() {
        let app = rt.app(&actor.id.tenant, &actor.id.app).ok_or_else(|| {
            RuntimeError::AppNotFound(format!("{}/{}", actor.id.tenant, actor.id.app))
        })?;
        let dir = paths::actor_dir(&rt.config.data_dir, &actor.id);
        own = ActorDb::open(&dir, &app.store_limits, OpenMode::Existing)?;
        db = own.as_mut();
    }
    let Some(db) = db else {
        return Err(RuntimeError::ActorNotFound(actor.id.to_string()));
    };
    if actor.repl.lock().needs_plan {
        crate::index::plan_alone(rt, actor, db)?;
    }
    replication::flush_for_restore(rt, repl, actor, Some(db))
}

/// A class migration's copy of the actor's database: every commit it
/// acknowledged, as its next event would see it.
fn run_copy(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    slot: &mut Option<Loaded>,
    dest: &std::path::Path,
) -> Result<(), RuntimeError> {
    if slot.is_none()
        && let Some(repl) = &rt.replication
    {
        replication::ensure_open(rt, repl, actor)?;
    }
    match slot.as_mut().filter(|l| l.has_db()) {
        Some(l) => {
            l.write_held_records(false);
            l.db().copy_to(dest)?;
        }
        None => {
            let path = paths::actor_db(&rt.config.data_dir, &actor.id);
            if !path.exists() {
                return Err(RuntimeError::ActorNotFound(actor.id.to_string()));
            }
            wasmkeep_store::db::copy_at(&path, dest)?;
        }
    }
    Ok(())
}

/// Runs an inspection between two events: through the actor's own
/// connection if it is open, on its file otherwise. A given-up actor's
/// instance is dropped first: it reads what its next event will serve.
fn run_inspect(rt: &Arc<Inner>, actor: &Arc<Actor>, slot: &mut Option<Loaded>, f: InspectFn) {
    drop_if_disowned(rt, actor, slot);
    if slot.is_none()
        && let Some(repl) = &rt.replication
        && let Err(e) = replication::ensure_open(rt, repl, actor)
    {
        // Inspection reads what is local; say why it may be missing or
        // stale.
        tracing::warn!(actor = %actor.id, error = %e, "could not bring the actor in line with the bucket before inspecting it");
    }
    if rt.keeps_index() && actor.repl.lock().awaits_first_plan() {
        // Opened (and held) for an inspection with local data the bucket
        // lacks: uploaded now, its alarm listed first, rather than left for
        // a close to forget.
        let _ = rt.enqueue(
            &actor.id,
            Event::new(EventKind::Between(Between::Replicate), None),
            false,
        );
    }
    // An open actor whose database was closed (ADR 0068) is read on its
    // file, as a closed one.
    match slot.as_mut().filter(|l| l.has_db()) {
        Some(l) => {
            // What is read includes every committed event's record.
            l.write_held_records(false);
            f(DbAccess::Open(l.db()))
        }
        None => f(DbAccess::Closed(&paths::actor_db(
            &rt.config.data_dir,
            &actor.id,
        ))),
    }
}

fn run_delete(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    slot: &mut Option<Loaded>,
) -> Result<Outcome, RuntimeError> {
    // The entry the database names goes once the tombstone landed (R2).
    let named = if rt.keeps_index() {
        match slot.as_mut().filter(|l| l.has_db()) {
            Some(l) => crate::index::read_record(l.db()).ok().flatten(),
            None => crate::index::read_record_at(&paths::actor_db(&rt.config.data_dir, &actor.id)),
        }
    } else {
        None
    };
    let path = paths::actor_db(&rt.config.data_dir, &actor.id);
    let size = match slot.as_mut().filter(|l| l.has_db()) {
        Some(l) => l.db().size_bytes().ok(),
        None => wasmkeep_store::db::size_bytes_at(&path).ok(),
    };
    *slot = None;
    if let Some(repl) = &rt.replication
        && let Err(e) = replication::delete(rt, repl, actor)
    {
        return Err(e);
    }
    if let (Some(named), Some(repl)) = (named, &rt.replication) {
        crate::index::remove_named(rt, repl, &actor.id, &named);
    }
    rt.timer.set(&actor.id, None);
    rt.outbox.forget(&actor.id);
    rt.parked.drop_actor(&actor.id);
    rt.sockets.close_all(
        Some(&actor.id),
        crate::sockets::close_code::TRY_AGAIN,
        "the actor was deleted",
    );
    actor.outbox_offered.store(0, Ordering::Relaxed);
    actor.outbox_durable.store(0, Ordering::Relaxed);
    let dir = paths::actor_dir(&rt.config.data_dir, &actor.id);
    wasmkeep_store::page_capture::untrack(&dir);
    let existed = dir.join(paths::DB_FILE).exists();
    if existed {
        rt.quotas
            .counted(&actor.id.tenant, false, size.unwrap_or(0));
    }
    if existed {
        // Gone for good before the reply: renamed, the class folder
        // synced, then removed.
        let grave = dir.with_extension(format!("deleted-{}", rt.elapsed_ms()));
        wasmkeep_store::sync::delete_folder(&dir, &grave)
            .map(|()| Outcome::Deleted(true))
            .map_err(|e| RuntimeError::Store(e.into()))
    } else {
        Ok(Outcome::Deleted(false))
    }
}

/// An operator's restore, between two turns (`crate::restore`).
fn run_restore(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    slot: &mut Option<Loaded>,
    file: &std::path::Path,
    undo: Option<&str>,
) -> Result<crate::restore::Restored, RuntimeError> {
    let bytes = crate::restore::check(file)?;
    if let Some(repl) = &rt.replication {
        replication::flush_for_restore(
            rt,
            repl,
            actor,
            slot.as_mut().filter(|l| l.has_db()).map(|l| l.db()),
        )?;
    }
    if let Some(token) = undo {
        // The chain's head now is the state this restore replaces: the
        // undo bookmark names it, from the restored database itself.
        let seq = actor.repl.lock().head_seq().ok_or_else(|| {
            RuntimeError::Internal("the actor's chain has no head to undo to".into())
        })?;
        wasmkeep_store::ActorDb::meta_set_in_file(
            file,
            &crate::bookmarks::undo_key(token),
            &seq.to_string(),
        )?;
    }
    // Closed before its file is replaced.
    *slot = None;
    let before =
        wasmkeep_store::db::size_bytes_at(&paths::actor_db(&rt.config.data_dir, &actor.id)).ok();
    let (replaced, kept) = crate::restore::swap(rt, actor, file)?;
    if replaced {
        rt.quotas
            .counted(&actor.id.tenant, false, before.unwrap_or(0));
    }
    rt.quotas.counted(&actor.id.tenant, true, bytes);
    let bucket_seq = match &rt.replication {
        Some(repl) => {
            let db = paths::actor_db(&rt.config.data_dir, &actor.id);
            Some(replication::upload_restored(rt, repl, actor, &db)?)
        }
        None => None,
    };
    crate::restore::follow(rt, actor);
    tracing::info!(actor = %actor.id, bytes, replaced, ?kept, ?bucket_seq, "restored the actor's database from an operator's file");
    // In the tenant's own log too (`wasmkeep logs`, `wasmkeep dev`): a
    // state that changed under a developer's eyes says why.
    let replaced_what = match (&kept, bucket_seq) {
        (_, Some(seq)) => {
            format!("the state it replaced stays in the bucket's history before seq {seq}")
        }
        (Some(path), None) => format!("the state it replaced is kept at {}", path.display()),
        (None, None) => "it had no state before".to_owned(),
    };
    use crate::logs::{Level, LogLine, Source};
    rt.logs.push(LogLine::new(
        rt.clock.now_ms(),
        Level::Warn,
        Source::Runtime,
        actor.id.clone(),
        format!("database restored from an operator's file ({bytes} bytes), between two events; {replaced_what}"),
    ));
    Ok(crate::restore::Restored {
        replaced,
        kept,
        bucket_seq,
        bytes,
    })
}

/// Once the bucket holds the commit at `mark`, reads the actor's state at
/// the bookmark from the bucket and makes it the actor's database as its
/// next event (`crate::bookmarks`). Off the workers: a thread of its own
/// waits for the upload and reads the chain.
pub(super) fn restore_to_bookmark(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    mark: replication::Mark,
    restore: crate::bookmarks::PendingRestore,
) {
    let id = actor.id.clone();
    super::request::when_uploaded(rt, actor, mark, move |rt| {
        if !crate::bookmarks::begin_restore() {
            tracing::warn!(actor = %id, "too many restores to bookmarks at once (limit BOOKMARK_RESTORES_MAX): this one is dropped; the actor keeps its state");
            return;
        }
        let rt = Arc::clone(rt);
        let spawned = std::thread::Builder::new()
            .name("wasmkeep-bookmark".into())
            .spawn(move || {
                read_and_queue(&rt, &id, restore);
                crate::bookmarks::end_restore();
            });
        if let Err(e) = spawned {
            crate::bookmarks::end_restore();
            tracing::warn!(error = %e, "could not start the bookmark's restore");
        }
    });
}

/// Reads the bookmark's state from the bucket and queues its restore.
fn read_and_queue(rt: &Arc<Inner>, id: &ActorId, restore: crate::bookmarks::PendingRestore) {
    let Some(repl) = &rt.replication else { return };
    let image = repl.block_on(wasmkeep_replica::export(
        &repl.bucket,
        id,
        restore.at,
        &repl.config,
    ));
    let staged = rt.config.data_dir.join("staging");
    let file = staged.join(format!("bookmark-{}.db", restore.undo_token));
    let written = image.map_err(|e| e.to_string()).and_then(|bytes| {
        std::fs::create_dir_all(&staged).map_err(|e| e.to_string())?;
        std::fs::write(&file, bytes).map_err(|e| e.to_string())
    });
    if let Err(e) = written {
        tracing::warn!(actor = %id, at = %restore.at, error = %e, "could not read the bookmark's state from the bucket; the actor keeps its state");
        return;
    }
    let event = Event::new(
        EventKind::Between(Between::Restore(file.clone(), Some(restore.undo_token))),
        None,
    );
    if let Err(e) = rt.enqueue(id, event, false) {
        let _ = std::fs::remove_file(&file);
        tracing::warn!(actor = %id, error = %e, "could not queue the restore to a bookmark");
    }
}
