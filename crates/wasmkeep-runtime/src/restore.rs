//! An operator's restore of one actor's database, run as the actor's next
//! event: between two turns, so that nothing acknowledged is lost to it
//! (issue 33).
//!
//! `wasmkeep restore` used to write the file into the bucket behind the
//! running node's back: the node's next upload found the chain moved, gave
//! its copy up and reopened from the bucket, and a write acknowledged a
//! moment after the restore (its commit not uploaded yet) vanished with no
//! log line. Through the node instead, in the actor's turn:
//!
//! 1. the file is checked (`PRAGMA quick_check`, whole pages) before
//!    anything changes;
//! 2. with a bucket, every commit of the actor is uploaded first
//!    ([`crate::replication::flush_for_restore`]): what was acknowledged
//!    before the restore stays in the chain's history;
//! 3. the actor is closed, and the file takes the place of its database
//!    (without a bucket the previous one is kept beside it as
//!    `actor.db.replaced-<ms>`);
//! 4. with a bucket, the file is uploaded as the next entry of the chain
//!    (every page), and the actor reopens from the chain at its next turn;
//! 5. the node's state about the actor follows the new database: its alarm
//!    in the timer, its outbox offered again; parked replies and sockets of
//!    the state it replaced are ended.
//!
//! Every request queued behind the restore runs on the restored state, and
//! every write acknowledged after the restore's answer is on top of it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::Serialize;
use wasmkeep_store::paths;

use crate::actor::Actor;
use crate::error::RuntimeError;
use crate::node::Inner;

/// What a restore did.
#[derive(Debug, Clone, Serialize)]
pub struct Restored {
    /// The actor had a database, which the restore replaced.
    pub replaced: bool,
    /// Without a bucket: where the replaced database was kept.
    pub kept: Option<PathBuf>,
    /// With a bucket: the seq of the chain's entry that holds the restored
    /// database (the replaced state is the entry before it).
    pub bucket_seq: Option<u64>,
    /// The restored database's size.
    pub bytes: u64,
}

/// Refuses a file that is not a sound SQLite database of whole pages,
/// before anything of the actor changes.
pub(crate) fn check(file: &Path) -> Result<u64, RuntimeError> {
    let bad = |why: String| {
        RuntimeError::Store(wasmkeep_store::StoreError::InvalidArgument(format!(
            "not a database this node can restore: {why}"
        )))
    };
    let whole = wasmkeep_replica::WholeFile::probe(file).map_err(|e| bad(e.to_string()))?;
    wasmkeep_replica::quick_check(file, "the uploaded file").map_err(|e| bad(e.to_string()))?;
    Ok(whole.bytes())
}

/// Puts `file` in place of the actor's database (the actor is closed).
/// Returns whether there was one, and where it was kept (without a bucket;
/// with one it is in the chain already and is removed here).
pub(crate) fn swap(
    rt: &Inner,
    actor: &Actor,
    file: &Path,
) -> Result<(bool, Option<PathBuf>), RuntimeError> {
    let io = |e: std::io::Error| RuntimeError::Store(e.into());
    let dir = paths::actor_dir(&rt.config.data_dir, &actor.id);
    std::fs::create_dir_all(&dir).map_err(io)?;
    let db = dir.join(paths::DB_FILE);
    // An empty file is no database (ADR 0075).
    let exists = |db: &Path| std::fs::metadata(db).is_ok_and(|m| m.len() > 0);
    let mut replaced = exists(&db);
    let mut kept = None;
    if replaced {
        // Its log first into the file (a close leaves a short one as it
        // is, ADR 0076): the file and its log are then moved (or removed)
        // one after the other, and a crash between the two must not leave
        // the file, without the commits in its log, where the actor finds
        // it.
        let limits = rt
            .app(&actor.id.tenant, &actor.id.app)
            .map(|a| a.store_limits.clone())
            .unwrap_or_default();
        match wasmkeep_store::db::fold_log(&dir, &limits) {
            Ok(()) => {}
            // A database that does not open as one (what a restore is
            // for) is set aside or removed with its log as it is.
            Err(e @ wasmkeep_store::StoreError::Corrupt(_)) => {
                tracing::warn!(actor = %actor.id, error = %e, "the database a restore replaces is corrupt: its log is moved with it as it is");
            }
            // Anything else (busy, a failed checkpoint, the disk): nothing
            // has changed yet, and the operator can try again.
            Err(e) => return Err(e.into()),
        }
        // The open may have set aside a creation a crash cut short.
        replaced = exists(&db);
    }
    if replaced {
        if rt.replication.is_some() {
            // The log before the file: a log left beside no database
            // would be applied by SQLite onto the file the bucket's
            // history puts there next.
            for suffix in ["-wal", "-shm"] {
                let mut p = db.as_os_str().to_owned();
                p.push(suffix);
                let _ = std::fs::remove_file(PathBuf::from(p));
            }
            std::fs::remove_file(&db).map_err(io)?;
        } else {
            // With its log (emptied above unless the database is corrupt),
            // and what the commit log holds of both files under their old
            // paths made durable first (ADR 0074).
            let aside = wasmkeep_replica::set_aside(&db, rt.clock.now_ms())
                .map_err(|e| RuntimeError::Store(wasmkeep_store::StoreError::Io(e.to_string())))?;
            kept = Some(aside);
        }
    }
    for suffix in ["-wal", "-shm"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
    // The sidecar named the replaced file's place in the chain.
    let _ = std::fs::remove_file(wasmkeep_replica::sidecar_path(&db));
    std::fs::rename(file, &db).map_err(io)?;
    // No copy in the folder is of the new database's history (ADR 0062).
    crate::recording::forget_bases(&dir);
    // The restored file's bytes, its name and any folder made for it
    // (a restore into an actor that had no database synced only this
    // folder's entries, not the uploaded file it staged).
    wasmkeep_store::sync::sync_filesystem(&dir).map_err(io)?;
    wasmkeep_store::page_capture::untrack(&dir);
    Ok((replaced, kept))
}

/// The node's state about the actor follows its new database.
pub(crate) fn follow(rt: &Arc<Inner>, actor: &Arc<Actor>) {
    let db = paths::actor_db(&rt.config.data_dir, &actor.id);
    rt.parked.drop_actor(&actor.id);
    rt.sockets.close_all(
        Some(&actor.id),
        crate::sockets::close_code::TRY_AGAIN,
        "the actor was restored: reconnect",
    );
    rt.outbox.forget(&actor.id);
    actor.outbox_offered.store(0, Ordering::Relaxed);
    actor.outbox_durable.store(0, Ordering::Relaxed);
    match wasmkeep_store::db::read_wake(&db) {
        Ok((alarm, outbox)) => {
            rt.timer
                .set_alarm(&actor.id, alarm.map(|a| (a.at_ms, a.retry_count)));
            if outbox {
                rt.resume_outbox(&actor.id);
            }
        }
        Err(e) => {
            rt.timer.set(&actor.id, None);
            tracing::warn!(actor = %actor.id, error = %e, "could not read the restored database's alarm and outbox");
        }
    }
}
