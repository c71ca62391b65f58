//! Folders for new actors made ahead, off the request's path (ADR 0075).
//!
//! A new actor costs the filesystem three inodes: its folder, its database
//! file and its write-ahead log. On ext4 each is a search of the inode
//! bitmap, which skips inodes freed in the last minutes one by one, reading
//! their inode tables: in W3 (one new actor per request) that search was
//! a third to half of the worker's time, more after many deletions.
//!
//! A node keeps [`SPARES_READY`] spare folders under `DATA/spare-actors/`,
//! each holding an empty `actor.db` and `actor.db-wal`, made by a thread of
//! their own (`wasmkeep-spares`). Creating an actor renames one into
//! place ([`take`]): a change of two folders' entries, no inode made. The
//! database's first bytes are then written into the empty file
//! (`db::creation`), as into a file just created.
//!
//! Durability is unchanged: nothing in a new actor is acknowledged before
//! its first batch's `syncfs` (ADR 0074, rule 5), which covers the rename
//! and the files as it covered their creation. A crash before it leaves a
//! spare folder in place with an empty or short database, which
//! `ActorDb::open` already treats as a creation to finish or to set aside.
//! Spares left by a stop or a crash are deleted at the next start.
//!
//! With no spare ready (a burst of new actors faster than the thread), or
//! if the rename fails (a folder with anything in it already at the
//! actor's path; the actors' folder on another filesystem, after which no
//! spare is used), creation makes the folder itself, as before.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use crate::paths::DB_FILE;

/// Spare folders kept ready per node: a burst of this many new actors
/// makes none of its folders on the request's path.
pub(crate) const SPARES_READY: usize = 64;

/// The folder, under a node's data directory, that holds its spares.
pub(crate) const SPARES_DIR: &str = "spare-actors";

/// A node's spare folders; dropping it stops their thread (the spares on
/// disk are deleted at the next start).
pub struct Spares {
    pool: Arc<Pool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Pool {
    /// `DATA/spare-actors`.
    dir: PathBuf,
    /// `DATA/actors`: the folders whose new actors take from this pool.
    actors: PathBuf,
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    ready: Vec<PathBuf>,
    /// Name of the next spare made.
    next: u64,
    stop: bool,
    /// Why the thread stopped making spares, if it did.
    failed: Option<String>,
}

impl Pool {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Started pools, by the actors' folder they serve.
fn pools() -> MutexGuard<'static, Vec<Weak<Pool>>> {
    static POOLS: OnceLock<Mutex<Vec<Weak<Pool>>>> = OnceLock::new();
    POOLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

impl Spares {
    /// Deletes the spares a previous run left in `data` and starts making
    /// new ones. New actors under `data/actors` take from them.
    pub fn start(data: &Path) -> io::Result<Spares> {
        let dir = data.join(SPARES_DIR);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::fs::create_dir_all(&dir)?;
        let pool = Arc::new(Pool {
            dir,
            actors: data.join("actors"),
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        {
            let mut all = pools();
            all.retain(|w| w.strong_count() > 0);
            all.push(Arc::downgrade(&pool));
        }
        let for_thread = Arc::clone(&pool);
        let thread = std::thread::Builder::new()
            .name("wasmkeep-spares".into())
            .spawn(move || make_spares(&for_thread))?;
        Ok(Spares {
            pool,
            thread: Some(thread),
        })
    }

    /// Spares ready now.
    #[cfg(test)]
    pub(crate) fn ready(&self) -> usize {
        self.pool.state().ready.len()
    }

    /// Why spares are no longer made, if they are not (creation then makes
    /// each actor's folder itself).
    #[cfg(test)]
    pub(crate) fn failed(&self) -> Option<String> {
        self.pool.state().failed.clone()
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        self.pool.state().stop = true;
        self.pool.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread's loop: tops the spares up to [`SPARES_READY`], then waits
/// for one to be taken. A failure to make one stops it (said once, in
/// the log and by [`Spares::failed`]); creation goes on without spares.
fn make_spares(pool: &Pool) {
    let mut state = pool.state();
    loop {
        if state.stop {
            return;
        }
        if state.ready.len() >= SPARES_READY {
            state = pool
                .wake
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            continue;
        }
        let path = pool.dir.join(state.next.to_string());
        state.next += 1;
        drop(state);
        let made = make_one(&path);
        state = pool.state();
        match made {
            Ok(()) => state.ready.push(path),
            Err(e) => {
                tracing::warn!(dir = %pool.dir.display(), error = %e,
                    "could not make a spare folder for new actors; new actors make their own");
                state.failed = Some(e.to_string());
                return;
            }
        }
    }
}

fn make_one(path: &Path) -> io::Result<()> {
    std::fs::create_dir(path)?;
    std::fs::File::create(path.join(DB_FILE))?;
    std::fs::File::create(path.join(format!("{DB_FILE}-wal")))?;
    Ok(())
}

/// Puts a spare folder at `dir` (which must not exist, or be an empty
/// folder, which the rename replaces; its parent must exist), if a started
/// pool serves `dir` and has one ready. `false`: the caller makes the
/// folder itself.
pub(crate) fn take(dir: &Path) -> io::Result<bool> {
    let pool = {
        let all = pools();
        all.iter()
            .filter_map(Weak::upgrade)
            .find(|p| dir.starts_with(&p.actors))
    };
    let Some(pool) = pool else {
        return Ok(false);
    };
    if std::fs::symlink_metadata(dir).is_ok() {
        // A folder there already (one that holds a file set aside, say):
        // the rename would fail, or replace an empty one; it is used.
        return Ok(false);
    }
    let spare = {
        let mut state = pool.state();
        if state.stop {
            return Ok(false);
        }
        let Some(spare) = state.ready.pop() else {
            return Ok(false);
        };
        spare
    };
    pool.wake.notify_one();
    match std::fs::rename(&spare, dir) {
        Ok(()) => Ok(true),
        Err(e) => {
            // Not lost: deleted here, or at the next start.
            let _ = std::fs::remove_dir_all(&spare);
            if e.kind() == io::ErrorKind::CrossesDevices {
                // Every rename would fail alike: no more spares.
                tracing::warn!(dir = %dir.display(), error = %e,
                    "the actors' folder is on another filesystem than the spares; new actors make their own folders");
                let mut state = pool.state();
                state.failed = Some(e.to_string());
                state.stop = true;
                drop(state);
                pool.wake.notify_all();
            }
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::{ActorDb, OpenMode};
    use crate::limits::StoreLimits;
    use std::os::unix::fs::MetadataExt;
    use std::time::Duration;

    /// Waits up to about 20 s (4,000 naps of 5 ms) for `done`.
    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        for _ in 0..4_000 {
            if done() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("waited about 20 s for {what}");
    }

    fn inodes(dir: &Path) -> Vec<u64> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.metadata().unwrap().ino())
            .collect()
    }

    #[test]
    fn a_new_actor_takes_a_spare_folder_and_the_pool_tops_up() {
        let data = tempfile::tempdir().unwrap();
        let spares = Spares::start(data.path()).unwrap();
        wait_for("the spares", || spares.ready() == SPARES_READY);
        let made = inodes(&data.path().join(SPARES_DIR));
        assert_eq!(made.len(), SPARES_READY);
        let dir = data.path().join("actors/t/app/class/6e");
        let mut db = ActorDb::open(&dir, &StoreLimits::default(), OpenMode::Create)
            .unwrap()
            .expect("created");
        db.kv_put("k", b"v").unwrap();
        let ino = std::fs::metadata(&dir).unwrap().ino();
        assert!(made.contains(&ino), "the actor's folder is a spare renamed");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(files, [DB_FILE.to_owned(), format!("{DB_FILE}-wal")]);
        wait_for("the pool to top up", || spares.ready() == SPARES_READY);
        assert!(spares.failed().is_none());
        drop(db);
        drop(spares);
        // Reopened without a pool: the database the spare became.
        let mut db = ActorDb::open(&dir, &StoreLimits::default(), OpenMode::Existing)
            .unwrap()
            .expect("there");
        assert_eq!(db.kv_get("k").unwrap().as_deref(), Some(&b"v"[..]));
    }

    #[test]
    fn spares_a_run_left_are_deleted_at_the_next_start() {
        let data = tempfile::tempdir().unwrap();
        let old = data.path().join(SPARES_DIR).join("left");
        std::fs::create_dir_all(&old).unwrap();
        std::fs::write(old.join(DB_FILE), b"").unwrap();
        let spares = Spares::start(data.path()).unwrap();
        assert!(!old.exists());
        wait_for("the spares", || spares.ready() == SPARES_READY);
    }

    /// A folder already at the actor's path (holding a file set aside,
    /// say) is never replaced: the rename fails and creation makes the
    /// database in it.
    #[test]
    fn a_folder_already_there_is_kept_and_used() {
        let data = tempfile::tempdir().unwrap();
        let spares = Spares::start(data.path()).unwrap();
        wait_for("the spares", || spares.ready() == SPARES_READY);
        let dir = data.path().join("actors/t/app/class/6f");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("kept"), b"x").unwrap();
        let mut db = ActorDb::open(&dir, &StoreLimits::default(), OpenMode::Create)
            .unwrap()
            .expect("created");
        db.kv_put("k", b"v").unwrap();
        assert_eq!(std::fs::read(dir.join("kept")).unwrap(), b"x");
    }
}
