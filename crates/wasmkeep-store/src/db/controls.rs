//! The runtime's transaction statements, held prepared on the connection.
//!
//! Every batch runs four of them (`BEGIN IMMEDIATE`, a savepoint around
//! each event and its release, `COMMIT`). Through rusqlite's statement
//! cache each was a lookup by text: hashing the text, comparing it, and
//! moving the entry to the front of the cache's list, all of it memory of
//! one connection of the many a node holds, so cold under W1 (1,000
//! actors): 2.5% of the node's CPU went to those four lookups a request
//! (a profile of W1, docs/benchmarks.md, issue 40's fourteenth part).
//! Here each is prepared once per connection, at its first use, and
//! stepped directly.
//!
//! The statements belong to the connection: dropping [`Controls`]
//! finalizes them, and `ActorDb` declares its `Controls` before its
//! connection, so they go first (SQLite closes no connection with
//! statements left). Rarely run statements (a rollback) stay in the
//! cache.

use std::cell::Cell;
use std::ffi::{CStr, c_int};

use rusqlite::{Connection, ffi};

/// One of the held statements.
#[derive(Clone, Copy, Debug)]
pub(super) enum Control {
    Begin,
    Commit,
    EventBegin,
    EventCommit,
}

impl Control {
    const ALL: [Control; 4] = [
        Control::Begin,
        Control::Commit,
        Control::EventBegin,
        Control::EventCommit,
    ];

    /// The statement's text, NUL-terminated for SQLite.
    fn sql(self) -> &'static CStr {
        match self {
            Control::Begin => c"BEGIN IMMEDIATE",
            Control::Commit => c"COMMIT",
            Control::EventBegin => c"SAVEPOINT wasmkeep_event",
            Control::EventCommit => c"RELEASE wasmkeep_event",
        }
    }
}

/// A connection's prepared [`Control`] statements (null until first used).
#[derive(Default)]
pub(super) struct Controls {
    stmts: [Cell<Option<std::ptr::NonNull<ffi::sqlite3_stmt>>>; Control::ALL.len()],
}

// SAFETY: the statements belong to the connection in the same `ActorDb`,
// which moves between threads with them and is used by one thread at a
// time (rusqlite's `Connection` is `Send`, and SQLite's connections are
// opened without their own mutex, for use by one thread at a time, which
// covers their statements too). `Cell` keeps `Controls` from being `Sync`.
unsafe impl Send for Controls {}

impl Controls {
    /// Runs `which` on `conn`, preparing it first if this is its first use.
    ///
    /// # Safety
    /// `conn` is the connection every statement held here was prepared on
    /// (the one `ActorDb` holds beside these).
    pub(super) unsafe fn run(&self, conn: &Connection, which: Control) -> rusqlite::Result<()> {
        // SAFETY: `handle` is the live connection; a held statement was
        // prepared on it (the caller's contract) and is finalized only by
        // `finalize`, before the connection closes.
        unsafe {
            let db = conn.handle();
            let stmt = self.stmt(db, which)?;
            let rc = ffi::sqlite3_step(stmt.as_ptr());
            // The error (if any) is read before the reset, which would
            // report it again but may change the connection's message.
            let failed = (rc != ffi::SQLITE_DONE).then(|| error(db, rc));
            ffi::sqlite3_reset(stmt.as_ptr());
            match failed {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }
    }

    /// Prepares every statement not yet prepared (the runtime warms an
    /// alarm's turn ahead of its due time).
    ///
    /// # Safety
    /// As [`Controls::run`].
    pub(super) unsafe fn prepare_all(&self, conn: &Connection) -> rusqlite::Result<()> {
        for which in Control::ALL {
            // SAFETY: as in `run`.
            unsafe { self.stmt(conn.handle(), which)? };
        }
        Ok(())
    }

    /// The held statement `which`, prepared on `db` if it was not yet.
    ///
    /// # Safety
    /// `db` is the live connection every statement held here was prepared
    /// on.
    unsafe fn stmt(
        &self,
        db: *mut ffi::sqlite3,
        which: Control,
    ) -> rusqlite::Result<std::ptr::NonNull<ffi::sqlite3_stmt>> {
        let slot = &self.stmts[which as usize];
        if let Some(s) = slot.get() {
            return Ok(s);
        }
        // SAFETY: the caller's contract.
        let s = unsafe { prepare(db, which)? };
        slot.set(Some(s));
        Ok(s)
    }

    /// Finalizes every held statement; the connection may close after.
    fn finalize(&self) {
        for slot in &self.stmts {
            if let Some(s) = slot.take() {
                // SAFETY: prepared on the connection, still open here
                // (`ActorDb` drops its `Controls` first), and finalized
                // once (taken out of its slot).
                unsafe {
                    ffi::sqlite3_finalize(s.as_ptr());
                }
            }
        }
    }

    /// How many statements are held (tests).
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.stmts.iter().filter(|s| s.get().is_some()).count()
    }
}

impl Drop for Controls {
    fn drop(&mut self) {
        self.finalize();
    }
}

/// Prepares `which` on `db` for repeated use.
///
/// # Safety
/// `db` is a live connection.
unsafe fn prepare(
    db: *mut ffi::sqlite3,
    which: Control,
) -> rusqlite::Result<std::ptr::NonNull<ffi::sqlite3_stmt>> {
    let sql = which.sql();
    let mut stmt = std::ptr::null_mut();
    // SAFETY: `sql` is NUL-terminated (length -1: up to the NUL); `db` is
    // live (the caller's contract).
    let rc = unsafe {
        ffi::sqlite3_prepare_v3(
            db,
            sql.as_ptr(),
            -1,
            ffi::SQLITE_PREPARE_PERSISTENT as _,
            &mut stmt,
            std::ptr::null_mut(),
        )
    };
    if rc != ffi::SQLITE_OK {
        // SAFETY: as above.
        return Err(unsafe { error(db, rc) });
    }
    std::ptr::NonNull::new(stmt).ok_or_else(|| {
        rusqlite::Error::SqliteFailure(
            ffi::Error::new(ffi::SQLITE_MISUSE),
            Some(format!("{sql:?} prepared to no statement")),
        )
    })
}

/// The connection's error for the result code `rc`, as rusqlite reports
/// one: the connection's message if its last error is `rc`, SQLite's text
/// for the code otherwise (a misuse, say, leaves no message of its own).
///
/// # Safety
/// `db` is a live connection.
unsafe fn error(db: *mut ffi::sqlite3, rc: c_int) -> rusqlite::Error {
    // SAFETY: `db` is live; SQLite's messages are NUL-terminated and valid
    // until the connection's next call (`errstr`'s for ever), and copied
    // here.
    let message = unsafe {
        let m = if ffi::sqlite3_errcode(db) == rc {
            ffi::sqlite3_errmsg(db)
        } else {
            ffi::sqlite3_errstr(rc)
        };
        (!m.is_null()).then(|| CStr::from_ptr(m).to_string_lossy().into_owned())
    };
    rusqlite::Error::SqliteFailure(ffi::Error::new(rc), message)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::db::{ActorDb, OpenMode, Value};
    use crate::limits::StoreLimits;

    /// The files under `dir` this process holds open.
    fn open_files_under(dir: &Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.starts_with(dir))
            .count()
    }

    /// Actor `a`'s database under `dir`.
    fn open(dir: &Path, mode: OpenMode) -> ActorDb {
        ActorDb::open(&dir.join("a"), &StoreLimits::default(), mode)
            .unwrap()
            .unwrap()
    }

    fn batch(db: &mut ActorDb, sql: &str) {
        db.begin().unwrap();
        db.event_begin().unwrap();
        db.execute(sql, &[]).unwrap();
        db.event_commit().unwrap();
        db.commit().unwrap();
    }

    /// SQLite refuses to close a connection with statements left
    /// (rusqlite's drop ignores the refusal): were the statements not
    /// finalized first (`ActorDb` declaring its connection before its
    /// `Controls`), the actor's files would stay open after its database
    /// is dropped.
    #[test]
    fn a_closed_database_leaves_no_file_open_though_its_statements_were_held() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().canonicalize().unwrap();
        let mut db = open(&path, OpenMode::Create);
        batch(&mut db, "CREATE TABLE t(x)");
        batch(&mut db, "INSERT INTO t VALUES (1)");
        assert_eq!(db.controls.held(), 4, "every batch statement held");
        assert!(open_files_under(&path) >= 2, "the database and its log");
        drop(db);
        assert_eq!(open_files_under(&path), 0, "the connection closed");
        let mut db = open(&path, OpenMode::Existing);
        batch(&mut db, "INSERT INTO t VALUES (2)");
        let n = db.query("SELECT count(*) FROM t", &[]).unwrap();
        assert!(
            matches!(n.rows.as_slice(), [row] if matches!(row.as_slice(), [Value::Integer(2)]))
        );
    }

    /// A held statement that fails reports SQLite's own error, which the
    /// runtime's errors carry to the operator.
    #[test]
    fn a_failed_control_reports_sqlites_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = open(dir.path(), OpenMode::Create);
        let e = db.commit().unwrap_err().to_string();
        assert!(e.contains("no transaction is active"), "{e}");
        db.begin().unwrap();
        let e = db.begin().unwrap_err().to_string();
        assert!(e.contains("within a transaction"), "{e}");
        db.commit().unwrap();
        batch(&mut db, "CREATE TABLE t(x)");
    }
}
