//! [`ActorDb`]: one actor's SQLite database, its internal tables and the
//! sandbox around guest SQL.
//!
//! Transactions belong to the runtime, never to the guest: the runtime opens
//! one transaction for a batch of events ([`ActorDb::begin`]), wraps each
//! event in a savepoint ([`ActorDb::event_begin`]) so that one failing event
//! rolls back alone, and commits once ([`ActorDb::commit`]). The guest's SQL
//! runs under an authorizer that refuses the internal tables, ATTACH,
//! transaction control, temporary objects and pragmas other than a few
//! read-only ones.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use rusqlite::limits::Limit;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, ToSql, params};

use crate::error::StoreError;
use crate::limits::{FUNCTION_ARGS_MAX, LIKE_PATTERN_BYTES_MAX, StoreLimits};
use crate::memory_budget::{self, Refusal, StatementBudget};
use crate::paths::DB_FILE;
use crate::sandbox::{
    Denied, Guard, MODE_GUEST, MODE_INSPECT, MODE_RUNTIME, Stopped, harden, install_authorizer,
    install_guard,
};
pub use crate::sqlite_setup::sqlite_setup;
use crate::wal_index::{VFS_NAME, WalIndex};

mod awaits;
mod controls;
mod creation;
mod idempotency;
mod outbox;
pub mod recording;
pub use awaits::Suspended;
pub use idempotency::IdempotentAnswer;
pub use outbox::{InboxSeen, OutboxKind, OutboxRow, decode_headers, encode_headers};

pub use crate::sandbox::INTERNAL_PREFIX;

/// Guest statements are cached under their text with this prefix, so that a
/// guest can never be handed a statement the runtime prepared (and
/// authorized) for itself by sending the same text.
const GUEST_MARK: &str = "/*guest*/ ";

use controls::{Control, Controls};

// The runtime's own statements that run in every alarm's turn, named once
// so that `warm_alarm_turn` prepares exactly what the turn runs (with the
// transaction's, held in `Controls`).
const SQL_ALARM_GET: &str = "SELECT at_ms, retry_count FROM _wasmkeep_alarm WHERE id = 0";
const SQL_ALARM_CLEAR: &str = "DELETE FROM _wasmkeep_alarm WHERE id = 0";
const SQL_ALARM_SET: &str =
    "INSERT OR REPLACE INTO _wasmkeep_alarm (id, at_ms, retry_count) VALUES (0, ?1, ?2)";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS _wasmkeep_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS _wasmkeep_kv (key BLOB PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS _wasmkeep_alarm (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    at_ms INTEGER NOT NULL,
    retry_count INTEGER NOT NULL DEFAULT 0
);
";

/// How long opening an actor waits for a reader that holds its file (the
/// start-up scan reads one alarm in well under a millisecond).
const BUSY_TIMEOUT_MS: u64 = 2_000;

/// A SQLite value as the runtime passes it between guest and database.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl Value {
    fn from_ref(v: ValueRef<'_>) -> Result<Value, StoreError> {
        Ok(match v {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(i) => Value::Integer(i),
            ValueRef::Real(f) => Value::Real(f),
            ValueRef::Text(t) => Value::Text(
                std::str::from_utf8(t)
                    .map_err(|_| StoreError::Sql("text value is not valid utf-8".into()))?
                    .to_owned(),
            ),
            ValueRef::Blob(b) => Value::Blob(b.to_vec()),
        })
    }

    fn size_bytes(&self) -> usize {
        match self {
            Value::Null | Value::Integer(_) | Value::Real(_) => 8,
            Value::Text(s) => s.len(),
            Value::Blob(b) => b.len(),
        }
    }
}

/// What a value counts toward a result's size, read before it is copied.
/// What one value of a result costs the host once copied out of SQLite:
/// its payload and the [`Value`] that holds it. An empty string is not
/// free: a `SELECT` of 250 empty columns over a generated sequence made
/// the host hold about 2.9 GB before its deadline when only payloads were
/// counted (issue 33).
fn value_ref_bytes(v: ValueRef<'_>) -> usize {
    let payload = match v {
        ValueRef::Null | ValueRef::Integer(_) | ValueRef::Real(_) => 0,
        ValueRef::Text(t) => t.len(),
        ValueRef::Blob(b) => b.len(),
    };
    std::mem::size_of::<Value>() + payload
}

/// What one row of a result costs the host beside its values.
const ROW_HOST_BYTES: usize = std::mem::size_of::<Vec<Value>>();

impl ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Integer(i) => ValueRef::Integer(*i),
            Value::Real(f) => ValueRef::Real(*f),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

/// Rows returned by a guest query.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QueryResult {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
    pub rows_read: u64,
    pub rows_written: u64,
}

/// What a guest statement that returns no rows did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecResult {
    pub rows_written: u64,
    pub last_insert_rowid: i64,
}

/// How a key-value listing is bounded and ordered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvListOptions {
    pub prefix: Option<String>,
    pub start: Option<String>,
    pub end: Option<String>,
    pub limit: Option<u32>,
    pub reverse: bool,
}

/// The committed alarm of an actor: when it is due and how many attempts at
/// it have failed so far (ADR 0009, "Retries are committed").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlarmState {
    pub at_ms: u64,
    pub retry_count: u32,
}

/// Pages of log after which SQLite checkpoints by itself (its default).
const WAL_AUTOCHECKPOINT_PAGES: i64 = 1000;

/// The longest log a close leaves as it is (ADR 0076): up to this many
/// bytes in the log's file, closing the connection neither checkpoints nor
/// syncs, and the next open reads the frames back. A longer file is
/// checkpointed into the database and emptied at the close, as SQLite does
/// by default. Bounds what an idle actor keeps on disk besides its
/// database, and what its next open reads.
pub const LOG_KEPT_AT_CLOSE_BYTES_MAX: u64 = 64 * 1024;

/// Whether [`ActorDb::open`] may create a database that does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Create the folder and the database if missing.
    Create,
    /// Only open an existing database; `None` if there is none.
    Existing,
}

/// One actor's open database.
pub struct ActorDb {
    /// The transaction statements every batch runs, held prepared on
    /// `conn`. Declared before it: fields drop in this order, and SQLite
    /// closes no connection with statements left (rusqlite's drop would
    /// leave it open, its files with it).
    controls: Controls,
    conn: Connection,
    /// Who the statement now being prepared is for (a `MODE_*` value);
    /// the authorizer applies that one's rules.
    mode: Arc<AtomicU8>,
    denied: Arc<Denied>,
    /// The deadline and stop flag guest statements run under.
    guard: Arc<Guard>,
    limits: StoreLimits,
    dir: PathBuf,
    created: bool,
    /// Folders whose entries must reach the disk for the creation to be
    /// durable: each folder this open created, and the parent of the
    /// topmost one.
    new_dirs: Vec<PathBuf>,
    page_size: u64,
    /// `on-init`'s mark was seen committed: it stays so for as long as
    /// this connection is open (only deleting or restoring the actor
    /// removes it, and both replace the connection).
    initialized_committed: std::cell::Cell<bool>,
    /// Calls to `set_alarm` on this connection: the runtime reads the
    /// committed alarm back after a batch only if it moved.
    alarm_writes: std::cell::Cell<u64>,
    /// Commits on this connection: from the [`COMMITS_BEFORE_GIVING_BACK`]th
    /// on, a commit gives back the log index's zero pages (ADR 0028, ADR
    /// 0078).
    commits: std::cell::Cell<u64>,
    /// See [`ActorDb::keep_statements`].
    keep_statements: std::cell::Cell<bool>,
    /// The tenant's quota (its name and value) while it caps this
    /// database below its own limit (`cap_pages`).
    quota: std::cell::Cell<Option<(&'static str, u64)>>,
    /// The write-ahead log's index, when the connection keeps it through
    /// wasmkeep's VFS (ADR 0028).
    wal_index: Option<WalIndex>,
    /// The pages commits write, when the runtime tracks this actor
    /// ([`crate::page_capture`]); after `conn`, so it outlives the
    /// connection that feeds it.
    capture: Option<crate::page_capture::Shared>,
    /// Where this database's log writes are recorded, when the node keeps
    /// a commit log ([`crate::commit_log`]); after `conn`, as `capture`.
    /// Held, not read: the VFS reads it through the pointer `attach_tap`
    /// gave it.
    #[allow(dead_code)]
    tap: Option<Arc<crate::commit_log::Tap>>,
    /// The node keeps a commit log but this connection could not record
    /// into it (opened without wasmkeep's VFS): SQLite syncs every commit.
    sync_each_commit: bool,
    /// Counted in [`open_actor_databases`] while it lives.
    _counted: OpenCounted,
}

/// Actors' databases open in this process (each holds two files: the
/// database and its log). Counted per process, as the open-files limit is.
static OPEN_ACTOR_DATABASES: AtomicUsize = AtomicUsize::new(0);

/// How many actors' databases ([`ActorDb`]) are open in this process.
pub fn open_actor_databases() -> usize {
    OPEN_ACTOR_DATABASES.load(Ordering::Relaxed)
}

/// Unmaps the blocks kept for actors' log indexes (ADR 0078) unless an
/// open took one since the last call; returns how many. The reaper calls
/// it each pass, so that an idle node keeps none.
pub fn trim_kept_index_blocks() -> usize {
    crate::index_blocks::trim_unused()
}

/// The commit of a connection from which its commits give back the log
/// index's zero pages (ADR 0078): an actor this busy on one open stays
/// open, while one opened for a batch or two (an alarm's actor, prepared
/// and fired) returns its index's block whole at its close. Earlier, the
/// runtime's reaper gives them back once the actor was idle a second.
const COMMITS_BEFORE_GIVING_BACK: u64 = 16;

/// One count in [`OPEN_ACTOR_DATABASES`], given back when dropped.
#[derive(Debug)]
struct OpenCounted;

impl OpenCounted {
    fn new() -> Self {
        OPEN_ACTOR_DATABASES.fetch_add(1, Ordering::Relaxed);
        OpenCounted
    }
}

impl Drop for OpenCounted {
    fn drop(&mut self) {
        OPEN_ACTOR_DATABASES.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Sets the connection's mode for as long as it lives, whatever way the
/// call ends, then puts the runtime's back.
struct Mode<'a>(&'a AtomicU8);

impl<'a> Mode<'a> {
    fn enter(flag: &'a AtomicU8, mode: u8) -> Self {
        crate::guest_functions::statement_starts();
        flag.store(mode, Ordering::Relaxed);
        Mode(flag)
    }
}

impl Drop for Mode<'_> {
    fn drop(&mut self) {
        self.0.store(MODE_RUNTIME, Ordering::Relaxed);
    }
}

impl Drop for ActorDb {
    /// Leaves a short log as it is (ADR 0076): SQLite checkpoints at the
    /// close only a log file longer than [`LOG_KEPT_AT_CLOSE_BYTES_MAX`]
    /// (its length bounds the frames in it), and never one whose file is
    /// held ([`ActorDb::hold_file`] turned the checkpoint off already).
    fn drop(&mut self) {
        use rusqlite::config::DbConfig;
        self.sync_untaken_creation();
        let checkpoints = self
            .conn
            .db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE)
            .is_ok_and(|off| !off);
        if checkpoints
            && std::fs::metadata(self.wal_path())
                .is_ok_and(|m| m.len() <= LOG_KEPT_AT_CLOSE_BYTES_MAX)
        {
            // Failing, the close checkpoints as before: slower, not wrong.
            let _ = self.checkpoint_on_close(false);
        }
    }
}

impl ActorDb {
    /// Opens (or, with [`OpenMode::Create`], creates) the database in `dir`.
    pub fn open(
        dir: &Path,
        limits: &StoreLimits,
        mode: OpenMode,
    ) -> Result<Option<ActorDb>, StoreError> {
        sqlite_setup();
        let path = dir.join(DB_FILE);
        // An empty file is no database yet: what a creation interrupted
        // before the image's bytes reached the disk leaves (SQLite would
        // take it for an empty database of its default page size, and
        // delete a log beside it). Made again in place (`creation`).
        let exists = std::fs::metadata(&path).is_ok_and(|m| m.len() > 0);
        if !exists && mode == OpenMode::Existing {
            return Ok(None);
        }
        let new_dirs = if exists {
            Vec::new()
        } else {
            creation::create(dir, &path, limits.page_bytes)?
        };
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags_and_vfs(&path, flags, VFS_NAME)
            .or_else(|_| Connection::open_with_flags(&path, flags))
            .map_err(open_err)?;
        let wal_index = WalIndex::of(&conn);
        // A new database's log never held a frame, unless a file left in
        // the folder says otherwise (only an empty one is taken as new).
        let log_empty = || match std::fs::metadata(path.with_extension("db-wal")) {
            Ok(m) => m.len() == 0,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        };
        if !exists
            && let Some(w) = &wal_index
            && log_empty()
        {
            w.mark_log_new();
        }
        // Attached before anything is written: the capture must see every
        // commit of this connection.
        let capture = match &wal_index {
            Some(w) => crate::page_capture::of(dir).inspect(|c| w.attach_capture(c)),
            None => {
                // Commits of this connection reach the file unseen: the
                // next upload must read the whole database.
                if let Some(c) = crate::page_capture::of(dir) {
                    crate::page_capture::lock(&c).lose("a connection without wasmkeep's VFS");
                }
                None
            }
        };
        // Attached before anything is written, as the capture: every write
        // to the log must be recorded (ADR 0074).
        let tap = wal_index.as_ref().and_then(|w| {
            let tap = Arc::new(crate::commit_log::tap_for(&path)?);
            w.attach_tap(&tap);
            Some(tap)
        });
        let sync_each_commit = tap.is_none() && crate::commit_log::covers(&path);
        let mut db = ActorDb {
            controls: Controls::default(),
            conn,
            mode: Arc::new(AtomicU8::new(MODE_RUNTIME)),
            denied: Arc::new(Denied::default()),
            guard: Arc::new(Guard::default()),
            limits: limits.clone(),
            dir: dir.to_owned(),
            created: !exists,
            new_dirs,
            page_size: 4096,
            initialized_committed: std::cell::Cell::new(false),
            alarm_writes: std::cell::Cell::new(0),
            commits: std::cell::Cell::new(0),
            keep_statements: std::cell::Cell::new(true),
            quota: std::cell::Cell::new(None),
            wal_index,
            capture,
            tap,
            sync_each_commit,
            _counted: OpenCounted::new(),
        };
        match db.configure() {
            // The index's zero pages stay until the actor is busy or idle
            // ([`COMMITS_BEFORE_GIVING_BACK`], ADR 0078).
            Ok(()) => Ok(Some(db)),
            Err(StoreError::Corrupt(why)) if exists && interrupted_creation(&path) => {
                // A creation that crashed before its first durable batch
                // (see `creation`): nothing in it was ever acknowledged.
                drop(db);
                let aside = path.with_extension(format!("db.incomplete-{}", unix_ms()));
                std::fs::rename(&path, &aside)?;
                let _ = std::fs::remove_file(path.with_extension("db-journal"));
                tracing::warn!(path = %path.display(), aside = %aside.display(), %why,
                    "set aside a database whose creation was interrupted");
                ActorDb::open(dir, limits, mode)
            }
            Err(e) => Err(e),
        }
    }

    fn configure(&mut self) -> Result<(), StoreError> {
        let c = &self.conn;
        // The actor's connection is the only one that touches its file
        // while it is open (inspection goes through it, see `inspect`), so
        // it holds the file lock from the first read to the close: no lock
        // calls per transaction (ADR 0024). wasmkeep's VFS takes that lock
        // at the first read and keeps the log's index in private memory
        // that gives its zero pages back (ADR 0028). A reader elsewhere
        // (the start-up scan) makes an open wait at most the busy timeout.
        c.busy_timeout(std::time::Duration::from_millis(BUSY_TIMEOUT_MS))
            .map_err(open_err)?;
        if self.wal_index.is_none() {
            // Without the VFS, SQLite keeps the index in its heap only if
            // the locking mode is exclusive when it opens the log.
            c.pragma_update(None, "locking_mode", "EXCLUSIVE")
                .map_err(open_err)?;
        }
        if !self.created
            && let Some(capture) = &self.capture
        {
            let mode: String = c
                .pragma_query_value(None, "journal_mode", |r| r.get(0))
                .map_err(open_err)?;
            if !mode.eq_ignore_ascii_case("wal") {
                // Switching an existing file (one put back by `wasmkeep
                // restore`, say) to WAL rewrites its header outside the log.
                crate::page_capture::lock(capture).lose("a database switched to WAL");
            }
        }
        c.pragma_update(None, "journal_mode", "WAL")
            .map_err(open_err)?;
        keep_log_file(c);
        if self.wal_index.is_some() {
            // The log opens with the VFS's index (SQLite would use its heap
            // had the mode been exclusive already); exclusive from here on,
            // SQLite skips the index's lock calls.
            crate::wal_index::open_log(c).map_err(open_err)?;
            c.pragma_update(None, "locking_mode", "EXCLUSIVE")
                .map_err(open_err)?;
        }
        // The runtime makes commits durable itself, for many actors at once
        // (see the `sync` and `commit_log` modules); SQLite still syncs
        // around checkpoints, which the commit log relies on.
        let synchronous = if self.sync_each_commit {
            "FULL"
        } else {
            "NORMAL"
        };
        c.pragma_update(None, "synchronous", synchronous)
            .map_err(open_err)?;
        c.pragma_update(None, "foreign_keys", true)
            .map_err(open_err)?;
        c.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024)
            .map_err(open_err)?;
        self.page_size = c
            .pragma_query_value(None, "page_size", |r| r.get::<_, i64>(0))
            .map_err(open_err)? as u64;
        if let Some(w) = &self.wal_index {
            w.set_page_bytes(u32::try_from(self.page_size).unwrap_or(0));
        }
        let pages = self.limits.database_bytes_max / self.page_size.max(512);
        c.pragma_update(None, "max_page_count", pages as i64)
            .map_err(open_err)?;
        let clamp = |v: usize| v.min(i32::MAX as usize) as i32;
        c.set_limit(
            Limit::SQLITE_LIMIT_LENGTH,
            clamp(self.limits.value_bytes_max),
        )
        .map_err(open_err)?;
        // Statement length and parameter count are checked before a guest
        // statement reaches SQLite (`check_statement`); SQLite's own limits
        // only keep a floor so the runtime's statements always fit.
        c.set_limit(
            Limit::SQLITE_LIMIT_VARIABLE_NUMBER,
            clamp(self.limits.sql_params_max.max(16)),
        )
        .map_err(open_err)?;
        c.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 0)
            .map_err(open_err)?;
        // Two bounds on how long one call of a built-in function may run,
        // between two checks of the deadline (ADR 0032).
        c.set_limit(
            Limit::SQLITE_LIMIT_LIKE_PATTERN_LENGTH,
            LIKE_PATTERN_BYTES_MAX,
        )
        .map_err(open_err)?;
        c.set_limit(Limit::SQLITE_LIMIT_FUNCTION_ARG, FUNCTION_ARGS_MAX)
            .map_err(open_err)?;
        c.set_prepared_statement_cache_capacity(64);
        if !self.created && !has_runtime_tables(c) {
            // Databases from older versions gain any table added since
            // (asked first: the batch is three statements to parse at
            // every open, a cost that counted when thousands of alarms
            // open their actors at once).
            c.execute_batch(SCHEMA).map_err(open_err)?;
        }
        harden(&self.conn).map_err(open_err)?;
        crate::guest_functions::install(&self.conn).map_err(open_err)?;
        install_authorizer(
            &mut self.conn,
            Arc::clone(&self.mode),
            Arc::clone(&self.denied),
        )
        .map_err(open_err)?;
        install_guard(
            &mut self.conn,
            Arc::clone(&self.mode),
            Arc::clone(&self.guard),
        )
        .map_err(open_err)?;
        Ok(())
    }

    /// Sets when guest statements must stop (the event's CPU deadline, the
    /// same instant the wasm deadline is counted to); `None`: no deadline.
    pub fn set_deadline(&self, deadline: Option<std::time::Instant>) {
        self.guard.set_deadline(deadline);
    }

    /// Shares the node's stop flag: once it is set, a running guest
    /// statement stops within [`crate::sandbox::PROGRESS_OPS`] steps.
    pub fn set_stop_flag(&self, flag: Arc<std::sync::atomic::AtomicBool>) {
        self.guard.set_stop_flag(flag);
    }

    /// Whether this open created the database file.
    pub fn created(&self) -> bool {
        self.created
    }

    /// Takes the folders to sync for this database's creation to be
    /// durable (empty if it existed, or once taken).
    pub fn take_new_dirs(&mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.new_dirs)
    }

    /// Makes a creation durable that no batch took (ADR 0074, rule 5): the
    /// connection closes before its first commit was handed to a sync (the
    /// turn that opened it failed), and the next open finds the database
    /// existing, so nothing else would sync its folders before commits
    /// are acknowledged through the log's barrier alone. Failing, it says
    /// so in the node's log; a failed `syncfs` fails the commit log too.
    fn sync_untaken_creation(&mut self) {
        #[cfg(test)]
        if crate::commit_log::rules().close_unsynced_creation {
            return;
        }
        let dirs = self.take_new_dirs();
        if dirs.is_empty() {
            return;
        }
        let dirs: Vec<&PathBuf> = dirs.iter().collect();
        let files = [self.dir.join(DB_FILE), self.wal_path()];
        let files: Vec<&PathBuf> = files.iter().collect();
        let log = self.tap.as_ref().map(|t| t.log());
        if let Err(e) = crate::commit_log::make_durable(log, &self.dir, &files, &dirs) {
            tracing::warn!(dir = %self.dir.display(), error = %e,
                "could not make a new actor's folder durable at its close");
        }
    }

    /// The actor's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The write-ahead log, which holds commits until a checkpoint.
    pub fn wal_path(&self) -> PathBuf {
        self.dir.join(format!("{DB_FILE}-wal"))
    }

    /// The limits this database enforces.
    pub fn limits(&self) -> &StoreLimits {
        &self.limits
    }

    fn err(&self, e: rusqlite::Error) -> StoreError {
        // A statement that failed may have given the log a commit frame
        // SQLite then did not commit: the size is read again.
        if let Some(w) = &self.wal_index {
            w.set_committed_pages(0);
        }
        let reason = self.denied.take();
        let refusal = memory_budget::take_refusal();
        let stopped = self.guard.take_stopped();
        let bounded = crate::guest_functions::take_refusal();
        if let (
            Some(reason),
            rusqlite::Error::SqliteFailure(..) | rusqlite::Error::SqlInputError { .. },
        ) = (&reason, &e)
        {
            // The authorizer refused something in the statement; SQLite
            // reports some refusals (functions) as plain errors.
            return StoreError::Forbidden(reason.clone());
        }
        if let Some(over) = over_call_bound(&e, bounded) {
            return over;
        }
        match e {
            rusqlite::Error::SqliteFailure(f, _) if f.code == ErrorCode::OperationInterrupted => {
                match stopped {
                    Some(Stopped::Stopping) => StoreError::Stopping,
                    _ => StoreError::DeadlineExceeded,
                }
            }
            rusqlite::Error::SqliteFailure(f, _) if f.code == ErrorCode::OutOfMemory => {
                match refusal {
                    Some(Refusal::Statement) => StoreError::StatementMemoryExceeded {
                        limit: self.limits.statement_memory_bytes_max,
                    },
                    Some(Refusal::Node) => StoreError::NodeMemoryExhausted {
                        limit: memory_budget::node_bytes_max(),
                    },
                    Some(Refusal::Temp) | None => StoreError::Io("sqlite ran out of memory".into()),
                }
            }
            rusqlite::Error::SqliteFailure(f, msg) => match f.code {
                ErrorCode::TooBig => StoreError::RowTooLarge {
                    limit: self.limits.value_bytes_max,
                },
                ErrorCode::DiskFull if refusal == Some(Refusal::Temp) => {
                    StoreError::TempStorageExceeded {
                        limit: self.limits.statement_temp_file_bytes_max,
                    }
                }
                ErrorCode::DiskFull => {
                    if let Some((name, limit)) = self.quota.get() {
                        // The tenant's quota capped this database below
                        // its own limit (`cap_pages`).
                        StoreError::QuotaExceeded { name, limit }
                    } else if disk_has_room(&self.dir) {
                        StoreError::DatabaseFull {
                            limit: self.limits.database_bytes_max,
                        }
                    } else {
                        StoreError::Io("the disk is full".into())
                    }
                }
                ErrorCode::AuthorizationForStatementDenied => StoreError::Forbidden(
                    reason.unwrap_or_else(|| msg.unwrap_or_else(|| "not authorized".into())),
                ),
                ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => {
                    StoreError::Corrupt(msg.unwrap_or_else(|| f.to_string()))
                }
                ErrorCode::SystemIoFailure | ErrorCode::CannotOpen | ErrorCode::ReadOnly => {
                    StoreError::Io(msg.unwrap_or_else(|| f.to_string()))
                }
                _ => StoreError::Sql(msg.unwrap_or_else(|| f.to_string())),
            },
            rusqlite::Error::MultipleStatement => {
                StoreError::Sql("one statement per call: the text holds more than one".into())
            }
            rusqlite::Error::InvalidParameterCount(got, want) => StoreError::Sql(format!(
                "wrong number of parameters: given={got} expected={want}"
            )),
            rusqlite::Error::ExecuteReturnedResults => {
                StoreError::Sql("the statement returns rows: use query".into())
            }
            other => StoreError::Sql(other.to_string()),
        }
    }

    // ---- transactions (the runtime's) ----

    /// Starts the transaction that a batch of events shares.
    pub fn begin(&mut self) -> Result<(), StoreError> {
        self.control(Control::Begin)
    }

    /// Commits the batch's transaction. From the connection's
    /// [`COMMITS_BEFORE_GIVING_BACK`]th commit on, the index's pages that
    /// hold only zeros are given back if the log started over or grew its
    /// index (ADR 0028); before, they stay, so that an actor that closes
    /// after a batch or two (each actor of an alarm burst, prepared and
    /// fired) returns its index's block whole for the next open and makes
    /// no system call for it (ADR 0078).
    pub fn commit(&mut self) -> Result<(), StoreError> {
        if let Err(e) = self.control(Control::Commit) {
            // SQLite may have written the commit's frames before failing
            // (an allocation while indexing them): not a commit.
            if let Some(c) = &self.capture {
                crate::page_capture::lock(c).lose("a commit that failed");
            }
            return Err(e);
        }
        let commits = self.commits.get() + 1;
        self.commits.set(commits);
        if commits >= COMMITS_BEFORE_GIVING_BACK {
            self.give_back_index_pages();
        }
        Ok(())
    }

    /// Gives back the log index's pages that hold only zeros, if the log
    /// started over or grew a block since the last time (ADR 0028); returns
    /// the bytes given back. Commits call it from the
    /// [`COMMITS_BEFORE_GIVING_BACK`]th on; the runtime calls it for an
    /// actor idle for a second. Between transactions only.
    pub fn give_back_index_pages(&self) -> usize {
        self.wal_index
            .as_ref()
            .map_or(0, WalIndex::release_zero_pages)
    }

    /// Runs one of the runtime's transaction statements, held prepared on
    /// the connection (`controls`): they run several times per event, and
    /// neither parsing them nor looking them up in the statement cache
    /// each time is free.
    fn control(&self, which: Control) -> Result<(), StoreError> {
        // SAFETY: `controls` are only ever run on `conn`.
        unsafe { self.controls.run(&self.conn, which) }.map_err(|e| self.err(e))
    }

    /// Abandons the batch's transaction, if one is open.
    pub fn rollback(&mut self) {
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }

    /// Whether the batch's transaction is still open. SQLite rolls a whole
    /// transaction back by itself after some errors (a full database, an
    /// I/O error); the runtime checks this after every event.
    pub fn in_transaction(&self) -> bool {
        !self.conn.is_autocommit()
    }

    /// Marks the start of one event inside the batch.
    pub fn event_begin(&mut self) -> Result<(), StoreError> {
        self.control(Control::EventBegin)
    }

    /// Keeps the event's changes in the batch.
    pub fn event_commit(&mut self) -> Result<(), StoreError> {
        self.control(Control::EventCommit)
    }

    /// Undoes the event's changes, and only its.
    pub fn event_rollback(&mut self) -> Result<(), StoreError> {
        self.conn
            .prepare_cached("ROLLBACK TO wasmkeep_event")
            .and_then(|mut s| s.execute([]))
            .map_err(|e| self.err(e))?;
        self.control(Control::EventCommit)
    }

    /// A mark that moves whenever the database changes (rows written by
    /// anyone, or the schema): equal marks before and after a batch mean it
    /// changed nothing, so there is nothing to replicate.
    pub fn change_mark(&self) -> Result<(u64, i64), StoreError> {
        let schema: i64 = self
            .conn
            .prepare_cached("PRAGMA schema_version")
            .and_then(|mut s| s.query_row([], |r| r.get(0)))
            .map_err(|e| self.err(e))?;
        Ok((self.conn.total_changes(), schema))
    }

    /// The committed database as one SQLite file image (what the replica
    /// diffs against the bucket), read through this connection between
    /// events: while the actor is open, no other connection may read it.
    pub fn committed_image(&mut self) -> Result<Vec<u8>, StoreError> {
        if self.in_transaction() {
            return Err(StoreError::Sql(
                "the committed image is read between events, not inside one".into(),
            ));
        }
        match self.conn.serialize(rusqlite::MAIN_DB) {
            Ok(data) => Ok(data.to_vec()),
            Err(e) => Err(StoreError::Io(format!("reading the committed image: {e}"))),
        }
    }

    /// Bytes of each of the database's pages.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// Makes the database file hold exactly what is committed, and keep
    /// holding it: the log is checkpointed into the file in full and
    /// emptied, and automatic checkpoints stop (commits stay in the log),
    /// so that a snapshot can be streamed from the file while the actor
    /// goes on (ADR 0036). Closing the connection does not checkpoint
    /// either (SQLite's checkpoint on close is off): an actor closed while
    /// its file is read leaves its commits in the log, which the next
    /// opening reads (ADR 0038). [`ActorDb::thaw`] undoes it. Between events.
    pub fn freeze_file(&self) -> Result<(), StoreError> {
        if self.in_transaction() {
            return Err(StoreError::Sql(
                "the file is frozen between events, not inside one".into(),
            ));
        }
        let (busy, log, done): (i64, i64, i64) = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .map_err(|e| self.err(e))?;
        if busy != 0 || log != done {
            return Err(StoreError::Io(format!(
                "the log could not be checkpointed in full: busy={busy} log={log} checkpointed={done}"
            )));
        }
        self.hold_file()
    }

    /// Keeps the database file as it is from now on without checkpointing
    /// first: no automatic checkpoint and none at the close. For a
    /// connection opened while its file is read (the snapshot of an
    /// earlier connection, frozen by [`ActorDb::freeze_file`], still
    /// streams): the file holds an earlier state that must not move.
    /// [`ActorDb::thaw`] undoes it. Between events.
    pub fn hold_file(&self) -> Result<(), StoreError> {
        self.conn
            .pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(|e| self.err(e))?;
        self.checkpoint_on_close(false)
    }

    /// Lets SQLite checkpoint again (its default, every 1,000 pages of log,
    /// and when the connection closes).
    pub fn thaw(&self) -> Result<(), StoreError> {
        self.conn
            .pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)
            .map_err(|e| self.err(e))?;
        self.checkpoint_on_close(true)
    }

    fn checkpoint_on_close(&self, on: bool) -> Result<(), StoreError> {
        use rusqlite::config::DbConfig;
        self.conn
            .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, !on)
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// The connection itself, for tests that drive SQLite directly.
    #[cfg(test)]
    pub(crate) fn conn_for_tests(&self) -> &Connection {
        &self.conn
    }

    /// The pages committed since the last call, captured as SQLite wrote
    /// them ([`crate::page_capture`]), by every connection to this file;
    /// `None` if the runtime does not track the actor or this connection
    /// could not feed the capture (then the whole database is the only
    /// source). Call between events.
    pub fn take_changes(&self) -> Option<crate::page_capture::Changes> {
        if self.in_transaction() {
            return None;
        }
        let capture = self.capture.as_ref()?;
        Some(crate::page_capture::lock(capture).take())
    }

    // ---- inspection ----

    /// Copies the committed database into a new SQLite file at `dest`
    /// (which must not exist), page by page through SQLite's backup API,
    /// so memory stays at a few pages whatever the size; the bytes
    /// written. Between events: what the copy holds is every commit and
    /// nothing else.
    pub fn copy_to(&self, dest: &Path) -> Result<u64, StoreError> {
        if self.in_transaction() {
            return Err(StoreError::Sql(
                "the database is copied between events, not inside one".into(),
            ));
        }
        copy_database(&self.conn, dest)
    }

    /// Runs an operator's read-only statement on this connection, between
    /// events (it sees what is committed). The same rules as
    /// [`inspect_query`]: reads only, internal tables included, within
    /// `bounds`.
    pub fn inspect(&self, sql: &str, bounds: &InspectBounds) -> Result<QueryResult, StoreError> {
        if self.in_transaction() {
            return Err(StoreError::Sql(
                "inspection runs between events, not inside one".into(),
            ));
        }
        let _mode = Mode::enter(&self.mode, MODE_INSPECT);
        self.guard.set_deadline(bounds.deadline);
        let r = run_inspection(&self.conn, &self.denied, &self.guard, sql, bounds);
        self.guard.set_deadline(None);
        r
    }

    // ---- guest SQL ----

    fn check_statement(&self, sql: &str, params: &[Value]) -> Result<(), StoreError> {
        if sql.len() > self.limits.sql_bytes_max {
            return Err(StoreError::StatementTooLarge {
                size: sql.len(),
                limit: self.limits.sql_bytes_max,
            });
        }
        if params.len() > self.limits.sql_params_max {
            return Err(StoreError::TooManyParams {
                count: params.len(),
                limit: self.limits.sql_params_max,
            });
        }
        for p in params {
            if p.size_bytes() > self.limits.value_bytes_max {
                return Err(StoreError::ValueTooLarge {
                    what: "parameter",
                    size: p.size_bytes(),
                    limit: self.limits.value_bytes_max,
                });
            }
        }
        Ok(())
    }

    /// Runs a guest statement and returns its rows.
    ///
    /// The result's size is checked value by value before the value is
    /// copied out of SQLite, so a result over `query_result_bytes_max`
    /// costs at most that much memory here; what SQLite itself holds for
    /// one row is bounded by `statement_memory_bytes_max`.
    pub fn query(&mut self, sql: &str, params: &[Value]) -> Result<QueryResult, StoreError> {
        self.check_statement(sql, params)?;
        let _guest = Mode::enter(&self.mode, MODE_GUEST);
        let _budget = StatementBudget::arm(
            self.limits.statement_memory_bytes_max,
            self.limits.statement_temp_file_bytes_max,
        );
        let before = self.conn.total_changes();
        let text = format!("{GUEST_MARK}{sql}");
        let mut stmt = self.conn.prepare_cached(&text).map_err(|e| self.err(e))?;
        let columns: Vec<String> = stmt.column_names().map(|s| s.to_string()).collect();
        let n = columns.len();
        let limit = self.limits.query_result_bytes_max;
        let mut rows_out = Vec::new();
        let mut total = 0usize;
        let mut rows = stmt
            .query(rusqlite::params_from_iter(params.iter()))
            .map_err(|e| self.err(e))?;
        loop {
            let row = match rows.next() {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => return Err(self.err(e)),
            };
            total = total.saturating_add(ROW_HOST_BYTES);
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                let v = row.get_ref(i).map_err(|e| self.err(e))?;
                total = total.saturating_add(value_ref_bytes(v));
                if total > limit {
                    return Err(StoreError::ResultTooLarge { limit });
                }
                out.push(Value::from_ref(v)?);
            }
            rows_out.push(out);
        }
        drop(rows);
        self.release(stmt);
        let written = self.conn.total_changes().saturating_sub(before);
        Ok(QueryResult {
            columns,
            rows_read: rows_out.len() as u64,
            rows: rows_out,
            rows_written: written,
        })
    }

    /// Runs a guest statement that returns no rows.
    pub fn execute(&mut self, sql: &str, params: &[Value]) -> Result<ExecResult, StoreError> {
        self.check_statement(sql, params)?;
        let _guest = Mode::enter(&self.mode, MODE_GUEST);
        let _budget = StatementBudget::arm(
            self.limits.statement_memory_bytes_max,
            self.limits.statement_temp_file_bytes_max,
        );
        let before = self.conn.total_changes();
        let text = format!("{GUEST_MARK}{sql}");
        let mut stmt = self.conn.prepare_cached(&text).map_err(|e| self.err(e))?;
        stmt.execute(rusqlite::params_from_iter(params.iter()))
            .map_err(|e| self.err(e))?;
        self.release(stmt);
        Ok(ExecResult {
            rows_written: self.conn.total_changes().saturating_sub(before),
            last_insert_rowid: self.conn.last_insert_rowid(),
        })
    }

    /// Whether guest statements stay prepared in the connection's cache
    /// after they ran (the default). The runtime turns this off while the
    /// guest's `on-init` runs: init runs once in an actor's life, and its
    /// statements (table and index creation, first rows) would otherwise
    /// hold memory for as long as the actor is open (W4).
    pub fn keep_statements(&self, keep: bool) {
        self.keep_statements.set(keep);
    }

    /// Returns a guest statement to the cache, or finalizes it when
    /// statements are not kept (see [`ActorDb::keep_statements`]).
    fn release(&self, stmt: rusqlite::CachedStatement<'_>) {
        if self.keep_statements.get() {
            drop(stmt);
        } else {
            stmt.discard();
        }
    }

    /// Prepares a guest statement into this connection's statement cache
    /// without running it, so that its first run here does not parse it
    /// (the runtime does this ahead of an alarm with the statements the
    /// class's handler ran on other actors). Under the guest's rules: a
    /// statement the guest could not prepare fails here too, and so does one
    /// that names a table this database does not have (yet).
    pub fn warm(&mut self, sql: &str) -> Result<(), StoreError> {
        self.check_statement(sql, &[])?;
        let _guest = Mode::enter(&self.mode, MODE_GUEST);
        let text = format!("{GUEST_MARK}{sql}");
        self.conn
            .prepare_cached(&text)
            .map(drop)
            .map_err(|e| self.err(e))
    }

    // ---- key-value ----

    fn check_key(&self, key: &str) -> Result<(), StoreError> {
        if key.len() > self.limits.key_bytes_max {
            return Err(StoreError::KeyTooLarge {
                size: key.len(),
                limit: self.limits.key_bytes_max,
            });
        }
        Ok(())
    }

    /// The value stored under `key`.
    pub fn kv_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.check_key(key)?;
        self.conn
            .prepare_cached("SELECT value FROM _wasmkeep_kv WHERE key = ?1")
            .and_then(|mut s| s.query_row([key.as_bytes()], |r| r.get(0)).optional())
            .map_err(|e| self.err(e))
    }

    /// Stores `value` under `key`, replacing what was there.
    pub fn kv_put(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.check_key(key)?;
        let size = key.len() + value.len();
        if size > self.limits.value_bytes_max {
            return Err(StoreError::ValueTooLarge {
                what: "key-value entry (key plus value)",
                size,
                limit: self.limits.value_bytes_max,
            });
        }
        self.conn
            .prepare_cached("INSERT OR REPLACE INTO _wasmkeep_kv (key, value) VALUES (?1, ?2)")
            .and_then(|mut s| s.execute(params![key.as_bytes(), value]))
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Removes `key`; whether it existed.
    pub fn kv_delete(&mut self, key: &str) -> Result<bool, StoreError> {
        self.check_key(key)?;
        self.conn
            .prepare_cached("DELETE FROM _wasmkeep_kv WHERE key = ?1")
            .and_then(|mut s| s.execute([key.as_bytes()]))
            .map(|n| n > 0)
            .map_err(|e| self.err(e))
    }

    /// Removes every key starting with `prefix` (all of them for `""`);
    /// how many.
    pub fn kv_delete_prefix(&mut self, prefix: &str) -> Result<u64, StoreError> {
        self.check_key(prefix)?;
        let lower = prefix.as_bytes().to_vec();
        let upper = prefix_successor(&lower);
        self.conn
            .prepare_cached("DELETE FROM _wasmkeep_kv WHERE key >= ?1 AND (?2 IS NULL OR key < ?2)")
            .and_then(|mut s| s.execute(params![lower, upper]))
            .map(|n| n as u64)
            .map_err(|e| self.err(e))
    }

    /// Entries in key order (or reverse), bounded by the options and by
    /// `kv_list_entries_max`.
    pub fn kv_list(&mut self, o: &KvListOptions) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut lower: Option<Vec<u8>> = o.start.as_ref().map(|s| s.as_bytes().to_vec());
        let mut upper: Option<Vec<u8>> = o.end.as_ref().map(|s| s.as_bytes().to_vec());
        if let Some(p) = &o.prefix {
            let p = p.as_bytes().to_vec();
            if lower.as_ref().is_none_or(|l| *l < p) {
                lower = Some(p.clone());
            }
            if let Some(succ) = prefix_successor(&p)
                && upper.as_ref().is_none_or(|u| *u > succ)
            {
                upper = Some(succ);
            }
        }
        let limit = o
            .limit
            .unwrap_or(self.limits.kv_list_entries_max)
            .min(self.limits.kv_list_entries_max);
        let sql = format!(
            "SELECT key, value FROM _wasmkeep_kv WHERE (?1 IS NULL OR key >= ?1) AND (?2 IS NULL OR key < ?2) ORDER BY key {} LIMIT ?3",
            if o.reverse { "DESC" } else { "ASC" }
        );
        let mut stmt = self.conn.prepare_cached(&sql).map_err(|e| self.err(e))?;
        let collected = collect_entries(
            &mut stmt,
            params![lower, upper, limit],
            self.limits.query_result_bytes_max,
        );
        drop(stmt);
        match collected {
            Ok(r) => r,
            Err(e) => Err(self.err(e)),
        }
    }

    // ---- runtime metadata ----

    /// Writes `key = value` into the meta table of the database file at
    /// `path`, which no connection holds (a file on its way to becoming
    /// an actor's database).
    pub fn meta_set_in_file(path: &Path, key: &str, value: &str) -> Result<(), StoreError> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| StoreError::Sql(e.to_string()))?;
        conn.execute_batch(SCHEMA)
            .and_then(|_| {
                conn.execute(
                    "INSERT OR REPLACE INTO _wasmkeep_meta (key, value) VALUES (?1, ?2)",
                    params![key, value],
                )
            })
            .map(|_| ())
            .map_err(|e| StoreError::Sql(e.to_string()))
    }

    /// A value the runtime keeps about the actor.
    pub fn meta_get(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .prepare("SELECT value FROM _wasmkeep_meta WHERE key = ?1")
            .and_then(|mut s| s.query_row([key], |r| r.get(0)).optional())
            .map_err(|e| self.err(e))
    }

    /// Records a value the runtime keeps about the actor.
    pub fn meta_set(&self, key: &str, value: &str) -> Result<(), StoreError> {
        // Not cached, nor is `meta_get`: each runs about once in an open
        // actor's life (the init mark), and a cached statement stays in
        // memory as long as the actor is open.
        self.conn
            .prepare("INSERT OR REPLACE INTO _wasmkeep_meta (key, value) VALUES (?1, ?2)")
            .and_then(|mut s| s.execute([key, value]))
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Whether `on-init` has committed for this actor: an actor without it
    /// has no state, and an alarm for it must not create it.
    ///
    /// Once seen committed (read outside a transaction), the answer is
    /// kept: every batch asks, and the mark is never removed while the
    /// connection is open.
    pub fn is_initialized(&self) -> Result<bool, StoreError> {
        if self.initialized_committed.get() {
            return Ok(true);
        }
        let marked = self.meta_get("initialized_ms")?.is_some();
        if marked && !self.in_transaction() {
            self.initialized_committed.set(true);
        }
        Ok(marked)
    }

    /// Tells the connection that `on-init`'s mark is committed: the runtime
    /// saw the batch that wrote it (or read it) commit. `is_initialized`
    /// then answers without reading it, and so does not bring its page back
    /// into the cache.
    pub fn init_mark_committed(&self) {
        self.initialized_committed.set(true);
    }

    /// Records that `on-init` ran, at `now_ms`.
    pub fn mark_initialized(&self, now_ms: u64) -> Result<(), StoreError> {
        self.meta_set("initialized_ms", &now_ms.to_string())
    }

    // ---- the alarm ----

    /// The committed alarm, if any.
    pub fn alarm(&self) -> Result<Option<AlarmState>, StoreError> {
        self.conn
            .prepare_cached(SQL_ALARM_GET)
            .and_then(|mut s| {
                s.query_row([], |r| {
                    Ok(AlarmState {
                        at_ms: r.get::<_, i64>(0)? as u64,
                        retry_count: r.get::<_, i64>(1)? as u32,
                    })
                })
                .optional()
            })
            .map_err(|e| self.err(e))
    }

    /// How many times `set_alarm` ran on this connection (committed or
    /// not): equal counts before and after a batch mean the batch left the
    /// committed alarm as it was.
    pub fn alarm_writes(&self) -> u64 {
        self.alarm_writes.get()
    }

    /// Replaces (or, with `None`, clears) the alarm.
    pub fn set_alarm(&self, alarm: Option<AlarmState>) -> Result<(), StoreError> {
        self.alarm_writes.set(self.alarm_writes.get() + 1);
        let r = match alarm {
            Some(a) => self
                .conn
                .prepare_cached(SQL_ALARM_SET)
                .and_then(|mut s| s.execute(params![a.at_ms as i64, a.retry_count as i64])),
            None => self
                .conn
                .prepare_cached(SQL_ALARM_CLEAR)
                .and_then(|mut s| s.execute([])),
        };
        r.map(|_| ()).map_err(|e| self.err(e))
    }

    /// Prepares the runtime's own statements of an alarm's turn (the
    /// transaction around it, reading, clearing and re-setting the alarm),
    /// so that the due instant does not parse them.
    pub fn warm_alarm_turn(&self) -> Result<(), StoreError> {
        // SAFETY: as in `control`.
        unsafe { self.controls.prepare_all(&self.conn) }.map_err(|e| self.err(e))?;
        for sql in [SQL_ALARM_GET, SQL_ALARM_CLEAR, SQL_ALARM_SET] {
            self.conn
                .prepare_cached(sql)
                .map(drop)
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Fills the write-ahead log's first frames (at most
    /// [`LOG_KEPT_AT_CLOSE_BYTES_MAX`] bytes) with zeros if the file is
    /// shorter, so that the commit of an alarm due later appends into
    /// pages the operating system already holds instead of allocating
    /// and zeroing them at the due instant (W2). Writes only past the
    /// file's end: a log's bytes past its last valid frame are never read
    /// as frames (a zero frame names page 0 and not the log's salt).
    pub fn extend_log_ahead(&self, frames: u64) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        // Never past what a close leaves as it is (ADR 0076): a longer
        // file would be checkpointed at every close.
        let want = (32 + frames * (24 + self.page_size)).min(LOG_KEPT_AT_CLOSE_BYTES_MAX);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.wal_path())?;
        let len = f.metadata()?.len();
        if len < want {
            f.write_all_at(&vec![0; (want - len) as usize], len)?;
        }
        Ok(())
    }

    /// The text of every statement prepared on this connection (between
    /// events: the cached ones), a guest's with its `/*guest*/ ` mark.
    pub fn prepared_statements(&self) -> Vec<String> {
        use rusqlite::ffi;
        let mut out = Vec::new();
        let db = unsafe { self.conn.handle() };
        // SAFETY: the handle is this open connection's, used on its own
        // thread; SQLite owns each statement and its text while it lives,
        // and nothing finalizes one during this loop.
        let mut stmt = unsafe { ffi::sqlite3_next_stmt(db, std::ptr::null_mut()) };
        while !stmt.is_null() {
            let text = unsafe { ffi::sqlite3_sql(stmt) };
            if !text.is_null() {
                let text = unsafe { std::ffi::CStr::from_ptr(text) };
                out.push(text.to_string_lossy().into_owned());
            }
            stmt = unsafe { ffi::sqlite3_next_stmt(db, stmt) };
        }
        out
    }

    // ---- inspection ----

    /// The database's size in bytes (pages in use times page size).
    /// Between transactions, from the last commit frame the log was given
    /// (`WalIndex::committed_pages`): the runtime asks before and after
    /// every batch, and SQLite prepares a `PRAGMA page_count` again at
    /// every run (a fifth of W1's worker time). Inside a transaction, or
    /// when not known, SQLite's own count.
    pub fn size_bytes(&self) -> Result<u64, StoreError> {
        let tracked = self.wal_index.as_ref().filter(|_| !self.in_transaction());
        if let Some(pages) = tracked.and_then(WalIndex::committed_pages) {
            return Ok(u64::from(pages) * self.page_size);
        }
        let pages: i64 = self
            .conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .map_err(|e| StoreError::Sql(e.to_string()))?;
        if let Some(w) = tracked {
            w.set_committed_pages(u32::try_from(pages).unwrap_or(0));
        }
        Ok(pages as u64 * self.page_size)
    }

    /// Caps the database (`now_bytes` now: [`Self::size_bytes`]) at `left`
    /// bytes more, the room its tenant's quota (`quota`: its name and value,
    /// for the error past it) leaves it, when that is below its own
    /// `database_bytes_max`; `None` (or room enough) lifts the cap. For the
    /// batch about to run.
    pub fn cap_pages(
        &self,
        now_bytes: u64,
        left: Option<u64>,
        quota: (&'static str, u64),
    ) -> Result<(), StoreError> {
        let own = self.limits.database_bytes_max / self.page_size.max(512);
        let now = now_bytes / self.page_size.max(512);
        let capped = left
            .map(|l| now + l / self.page_size.max(512))
            .filter(|pages| *pages < own);
        if capped.is_none() && self.quota.get().is_none() {
            return Ok(());
        }
        let pages = capped.unwrap_or(own);
        self.conn
            .pragma_update(None, "max_page_count", pages as i64)
            .map_err(|e| StoreError::Sql(e.to_string()))?;
        self.quota.set(capped.map(|_| quota));
        Ok(())
    }

    /// Stops keeping the alarm's read prepared. The runtime reads the alarm
    /// when an actor opens and after batches that touch it; an actor
    /// without one does not read it again while it stays without (W4).
    pub fn forget_alarm_read(&self) {
        if let Ok(stmt) = self.conn.prepare_cached(SQL_ALARM_GET) {
            stmt.discard();
        }
    }

    /// Frees the pages this connection caches and is not using now; the
    /// next statement that needs one reads it again (from the operating
    /// system's cache, in practice). Done once when a database is created:
    /// creating it writes pages (the internal tables) that most of its
    /// events never read.
    pub fn shrink_cache(&self) {
        // SAFETY: the handle is this open connection's, used on its own
        // thread.
        unsafe {
            rusqlite::ffi::sqlite3_db_release_memory(self.conn.handle());
        }
    }

    /// What this connection holds in memory, from SQLite's own accounting
    /// (`sqlite3_db_status`), which works with global statistics off.
    pub fn memory(&self) -> SqliteMemory {
        use rusqlite::ffi;
        let status = |op: i32| {
            let (mut cur, mut hi) = (0, 0);
            // SAFETY: the handle is this open connection's, used on its
            // own thread; the out pointers are valid.
            let rc =
                unsafe { ffi::sqlite3_db_status(self.conn.handle(), op, &mut cur, &mut hi, 0) };
            if rc == ffi::SQLITE_OK {
                cur.max(0) as u64
            } else {
                0
            }
        };
        SqliteMemory {
            cache_bytes: status(ffi::SQLITE_DBSTATUS_CACHE_USED),
            schema_bytes: status(ffi::SQLITE_DBSTATUS_SCHEMA_USED),
            statement_bytes: status(ffi::SQLITE_DBSTATUS_STMT_USED),
            lookaside_slots: status(ffi::SQLITE_DBSTATUS_LOOKASIDE_USED),
            wal_index_bytes: self.wal_index.as_ref().map_or(0, WalIndex::resident_bytes),
        }
    }
}

/// One connection's memory by SQLite's accounting (see [`ActorDb::memory`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SqliteMemory {
    /// The page cache and the pager's own buffers.
    pub cache_bytes: u64,
    /// The parsed schema.
    pub schema_bytes: u64,
    /// Prepared statements, the runtime's cached ones included.
    pub statement_bytes: u64,
    /// Lookaside slots in use.
    pub lookaside_slots: u64,
    /// The write-ahead log's index, as far as it is resident (0 when
    /// SQLite keeps it in its heap: without wasmkeep's VFS).
    pub wal_index_bytes: u64,
}

/// Whether every table [`SCHEMA`] creates is in the database (SQLite reads
/// the schema for the answer; no statement is parsed).
fn has_runtime_tables(c: &Connection) -> bool {
    RUNTIME_TABLES.iter().all(|table| {
        // SAFETY: the handle is this open connection's; both names are
        // NUL-terminated and live for the call; SQLite accepts null for
        // the column and for each output pointer.
        let rc = unsafe {
            rusqlite::ffi::sqlite3_table_column_metadata(
                c.handle(),
                c"main".as_ptr(),
                table.as_ptr(),
                std::ptr::null(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        rc == rusqlite::ffi::SQLITE_OK
    })
}

/// The tables [`SCHEMA`] creates.
pub(crate) const RUNTIME_TABLES: [&std::ffi::CStr; 3] =
    [c"_wasmkeep_meta", c"_wasmkeep_kv", c"_wasmkeep_alarm"];

/// Makes SQLite keep the write-ahead log's file when the connection
/// closes (emptied if the close checkpoints, ADR 0076), instead of
/// deleting it: closing an actor freed an inode and opening it again made
/// one (ADR 0031).
fn keep_log_file(c: &Connection) {
    let mut on: std::ffi::c_int = 1;
    // SAFETY: SQLITE_FCNTL_PERSIST_WAL reads and writes one int through
    // the pointer, which lives for the call; the handle is this open
    // connection's.
    unsafe {
        rusqlite::ffi::sqlite3_file_control(
            c.handle(),
            c"main".as_ptr(),
            rusqlite::ffi::SQLITE_FCNTL_PERSIST_WAL,
            (&raw mut on).cast(),
        );
    }
}

/// Whether a database that SQLite refuses as corrupt is the remains of an
/// interrupted creation: no committed frames in its write-ahead log, and
/// either no bigger than a first page (64 KiB), or the start of a new
/// database's image with its last pages lost (see `creation`). An
/// acknowledged database never looks like this (its first batch was made
/// durable, file and log alike), so setting it aside loses nothing anyone
/// was told about.
fn interrupted_creation(path: &Path) -> bool {
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    !log_has_frames(path) && (len <= 65536 || creation::a_cut_short_image(path))
}

/// Whether the write-ahead log of the database at `path` holds more than
/// its header (a log of 32 bytes or less holds no frame).
fn log_has_frames(path: &Path) -> bool {
    std::fs::metadata(path.with_extension("db-wal")).is_ok_and(|m| m.len() > 32)
}

use crate::clock::unix_ms;

/// Whether the filesystem holding `dir` has room left (16 MiB or more):
/// if it does, SQLITE_FULL came from the database's own size limit.
fn disk_has_room(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return true;
    };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized,
    // zeroed out-parameter that statvfs fills in.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return true;
        }
        (st.f_bavail as u64).saturating_mul(st.f_frsize as u64) >= 16 * 1024 * 1024
    }
}

/// A function call over one of the bounds on what one call may do (ADR
/// 0032): a stand-in's refusal (`refused`, the statement's error if its
/// message is the refusal's: one left by a statement whose error took
/// another way, an inspection's, is not this one's), or SQLite's for a
/// limit the actor's connection lowers. The messages name the limit.
fn over_call_bound(
    e: &rusqlite::Error,
    refused: Option<crate::guest_functions::Refusal>,
) -> Option<StoreError> {
    let msg = match e {
        rusqlite::Error::SqliteFailure(_, Some(m))
        | rusqlite::Error::SqlInputError { msg: m, .. } => m.as_str(),
        _ => return None,
    };
    if let Some(r) = refused
        && r.explains(msg)
    {
        return Some(StoreError::InvalidArgument(r.message));
    }
    if msg == "LIKE or GLOB pattern too complex" {
        return Some(StoreError::InvalidArgument(format!(
            "LIKE or GLOB pattern too long: limit like_pattern_bytes_max={LIKE_PATTERN_BYTES_MAX}"
        )));
    }
    if msg.starts_with("too many arguments on function ") {
        return Some(StoreError::Sql(format!(
            "{msg}: limit function_args_max={FUNCTION_ARGS_MAX}"
        )));
    }
    None
}

/// Key-value entries as a listing returns them.
type Entries = Vec<(String, Vec<u8>)>;

/// Reads a key-value listing's rows, checking the total size before each
/// entry is copied, so a listing over `limit` costs at most that much.
/// The outer error is SQLite's; the inner one the listing's own.
fn collect_entries(
    stmt: &mut rusqlite::CachedStatement<'_>,
    params: impl rusqlite::Params,
    limit: usize,
) -> rusqlite::Result<Result<Entries, StoreError>> {
    let mut rows = stmt.query(params)?;
    let mut out = Vec::new();
    let mut total = 0usize;
    while let Some(row) = rows.next()? {
        let (k, v) = (row.get_ref(0)?, row.get_ref(1)?);
        total = total.saturating_add(value_ref_bytes(k) + value_ref_bytes(v));
        if total > limit {
            return Ok(Err(StoreError::ResultTooLarge { limit }));
        }
        let k = match String::from_utf8(k.as_bytes()?.to_vec()) {
            Ok(k) => k,
            Err(_) => {
                return Ok(Err(StoreError::Corrupt(
                    "a key-value key is not utf-8".into(),
                )));
            }
        };
        out.push((k, v.as_blob()?.to_vec()));
    }
    Ok(Ok(out))
}

/// The smallest byte string greater than every string starting with `p`,
/// or `None` if there is none (`p` is all `0xff`).
fn prefix_successor(p: &[u8]) -> Option<Vec<u8>> {
    let mut s = p.to_vec();
    while let Some(last) = s.pop() {
        if last < 0xff {
            s.push(last + 1);
            return Some(s);
        }
    }
    None
}

fn open_err(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(f, msg)
            if matches!(f.code, ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) =>
        {
            StoreError::Corrupt(msg.unwrap_or_else(|| f.to_string()))
        }
        other => StoreError::Io(other.to_string()),
    }
}

/// Bounds on one operator's inspection statement (the admin API's
/// read-only SQL): an actor's tenant wrote the schema it reads, views over
/// never-ending queries and wide rows included, so it gets a guest
/// statement's bounds (issue 33).
#[derive(Debug, Clone)]
pub struct InspectBounds {
    /// Rows returned at most (the rest are not read).
    pub rows_max: usize,
    /// The result's size, each value at its cost in the host
    /// (`query_result_bytes_max`).
    pub result_bytes_max: usize,
    /// What SQLite may allocate for the statement
    /// (`statement_memory_bytes_max`), and its temporary files.
    pub memory_bytes_max: usize,
    pub temp_file_bytes_max: u64,
    /// When it must stop (`None`: no deadline).
    pub deadline: Option<std::time::Instant>,
    /// The node's stop flag: it stops the statement too.
    pub stop: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl InspectBounds {
    /// An actor's limits for a guest statement, `rows_max` rows, no
    /// deadline and no stop flag.
    pub fn new(limits: &StoreLimits, rows_max: usize) -> InspectBounds {
        InspectBounds {
            rows_max,
            result_bytes_max: limits.query_result_bytes_max,
            memory_bytes_max: limits.statement_memory_bytes_max,
            temp_file_bytes_max: limits.statement_temp_file_bytes_max,
            deadline: None,
            stop: None,
        }
    }

    /// The default limits and `rows_max` rows (tests, tools).
    pub fn rows(rows_max: usize) -> InspectBounds {
        InspectBounds::new(&StoreLimits::default(), rows_max)
    }
}

/// Runs read-only SQL against the database of an actor that is not open,
/// for an operator: a read-only connection of its own that sees internal
/// tables too, within `bounds`. (An open actor is inspected through its own
/// connection: [`ActorDb::inspect`].)
pub fn inspect_query(
    db_path: &Path,
    sql: &str,
    bounds: &InspectBounds,
) -> Result<QueryResult, StoreError> {
    let (conn, denied, guard) = open_inspection(db_path)?;
    if let Some(stop) = &bounds.stop {
        guard.set_stop_flag(Arc::clone(stop));
    }
    guard.set_deadline(bounds.deadline);
    run_inspection(&conn, &denied, &guard, sql, bounds)
}

/// A read-only connection under the inspection authorizer and a guard
/// that stops its statements.
fn open_inspection(db_path: &Path) -> Result<(Connection, Arc<Denied>, Arc<Guard>), StoreError> {
    sqlite_setup();
    let mut conn = Connection::open_with_flags(
        db_path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(open_err)?;
    conn.pragma_update(None, "query_only", true)
        .map_err(open_err)?;
    harden(&conn).map_err(open_err)?;
    let denied = Arc::new(Denied::default());
    let mode = Arc::new(AtomicU8::new(MODE_INSPECT));
    install_authorizer(&mut conn, Arc::clone(&mode), Arc::clone(&denied)).map_err(open_err)?;
    let guard = Arc::new(Guard::default());
    install_guard(&mut conn, mode, Arc::clone(&guard)).map_err(open_err)?;
    Ok((conn, denied, guard))
}

/// One inspection statement on `conn`, whose authorizer is in inspection
/// mode and whose `guard` has the statement's deadline, within `bounds`.
fn run_inspection(
    conn: &Connection,
    denied: &Denied,
    guard: &Guard,
    sql: &str,
    bounds: &InspectBounds,
) -> Result<QueryResult, StoreError> {
    let _budget = StatementBudget::arm(bounds.memory_bytes_max, bounds.temp_file_bytes_max);
    let sql_err = |e: rusqlite::Error| inspection_error(e, denied, guard, bounds);
    let mut stmt = conn.prepare(sql).map_err(sql_err)?;
    if !stmt.readonly() {
        return Err(StoreError::Forbidden(
            "inspection runs read-only statements only".into(),
        ));
    }
    let columns: Vec<String> = stmt.column_names().map(|s| s.to_string()).collect();
    let n = columns.len();
    let mut rows = stmt.query([]).map_err(sql_err)?;
    let mut out = Vec::new();
    let mut total = 0usize;
    while let Some(row) = rows.next().map_err(sql_err)? {
        if out.len() >= bounds.rows_max {
            break;
        }
        total = total.saturating_add(ROW_HOST_BYTES);
        let mut r = Vec::with_capacity(n);
        for i in 0..n {
            let v = row.get_ref(i).map_err(sql_err)?;
            total = total.saturating_add(value_ref_bytes(v));
            if total > bounds.result_bytes_max {
                return Err(StoreError::ResultTooLarge {
                    limit: bounds.result_bytes_max,
                });
            }
            r.push(Value::from_ref(v)?);
        }
        out.push(r);
    }
    Ok(QueryResult {
        columns,
        rows_read: out.len() as u64,
        rows: out,
        rows_written: 0,
    })
}

/// What an inspection statement's failure is: refused by the authorizer,
/// stopped by its deadline or the node's stop, over a memory bound, or
/// SQLite's own error.
fn inspection_error(
    e: rusqlite::Error,
    denied: &Denied,
    guard: &Guard,
    bounds: &InspectBounds,
) -> StoreError {
    let refusal = memory_budget::take_refusal();
    let stopped = guard.take_stopped();
    if let Some(reason) = denied.take() {
        return StoreError::Forbidden(reason);
    }
    let rusqlite::Error::SqliteFailure(f, _) = &e else {
        return StoreError::Sql(e.to_string());
    };
    match (f.code, stopped, refusal) {
        (ErrorCode::DatabaseBusy, ..) => StoreError::Busy,
        (ErrorCode::OperationInterrupted, Some(Stopped::Stopping), _) => StoreError::Stopping,
        (ErrorCode::OperationInterrupted, ..) => StoreError::DeadlineExceeded,
        (ErrorCode::OutOfMemory, _, Some(Refusal::Node)) => StoreError::NodeMemoryExhausted {
            limit: memory_budget::node_bytes_max(),
        },
        (ErrorCode::OutOfMemory, ..) => StoreError::StatementMemoryExceeded {
            limit: bounds.memory_bytes_max,
        },
        (ErrorCode::DiskFull, _, Some(Refusal::Temp)) => StoreError::TempStorageExceeded {
            limit: bounds.temp_file_bytes_max,
        },
        _ => StoreError::Sql(e.to_string()),
    }
}

/// The size in bytes (pages in use times its own page size) of the
/// database at `db_path` of a closed actor, read through one read-only
/// connection (an open actor's own connection answers `size_bytes`).
pub fn size_bytes_at(db_path: &Path) -> Result<u64, StoreError> {
    sqlite_setup();
    let conn = Connection::open_with_flags(
        db_path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(open_err)?;
    let pragma = |name: &str| -> Result<u64, StoreError> {
        conn.pragma_query_value(None, name, |r| r.get::<_, i64>(0))
            .map(|n| n.max(0) as u64)
            .map_err(open_err)
    };
    Ok(pragma("page_count")? * pragma("page_size")?)
}

/// Copies the database at `db_path` of a closed actor into a new file at
/// `dest`, as [`ActorDb::copy_to`] does for an open one.
pub fn copy_at(db_path: &Path, dest: &Path) -> Result<u64, StoreError> {
    sqlite_setup();
    let conn = Connection::open_with_flags(
        db_path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(open_err)?;
    copy_database(&conn, dest)
}

/// The copy both [`ActorDb::copy_to`] and [`copy_at`] make: 256 pages a
/// step, the destination in rollback-journal mode (a plain file, as
/// `export` from the bucket writes).
fn copy_database(conn: &Connection, dest: &Path) -> Result<u64, StoreError> {
    if dest.exists() {
        return Err(StoreError::Io(format!(
            "{} exists: a copy never overwrites a file",
            dest.display()
        )));
    }
    let io = |e: rusqlite::Error| StoreError::Io(format!("copying the database: {e}"));
    let mut out = Connection::open(dest).map_err(io)?;
    {
        let backup = rusqlite::backup::Backup::new(conn, &mut out).map_err(io)?;
        backup
            .run_to_completion(256, std::time::Duration::from_millis(5), None)
            .map_err(io)?;
    }
    out.pragma_update(None, "journal_mode", "DELETE")
        .map_err(io)?;
    drop(out);
    std::fs::metadata(dest)
        .map(|m| m.len())
        .map_err(|e| StoreError::Io(format!("{}: {e}", dest.display())))
}

/// The committed alarm of the database at `db_path`, read through a
/// read-only connection. [`StoreError::Busy`] if the actor is open (its
/// connection holds the file; ask it instead).
pub fn read_alarm(db_path: &Path) -> Result<Option<AlarmState>, StoreError> {
    if !db_path.exists() {
        return Ok(None);
    }
    let (conn, denied, guard) = open_inspection(db_path)?;
    alarm_of(&conn, &denied, &guard)
}

/// Folds a closed actor's log into its database and empties it, for a
/// caller about to move, replace or remove the file alone: a close leaves
/// a short log as it is (ADR 0076), and the file without it lacks the
/// commits in it. Opens the database as the actor's own connection would
/// (the log's sync before the checkpoint is the commit log's barrier);
/// nothing if there is no database or its log is empty. The caller keeps
/// the actor closed.
pub fn fold_log(dir: &Path, limits: &StoreLimits) -> Result<(), StoreError> {
    let log = dir.join(format!("{DB_FILE}-wal"));
    if std::fs::metadata(&log).map_or(true, |m| m.len() == 0) {
        return Ok(());
    }
    match ActorDb::open(dir, limits, OpenMode::Existing)? {
        // Checkpointed in full and emptied, then held: the close after it
        // has nothing to do.
        Some(db) => db.freeze_file(),
        None => Ok(()),
    }
}

/// What the node's start-up scan needs of an actor it has not opened: its
/// committed alarm, and whether its outbox holds messages waiting for an
/// answer (ADR 0040), read through one read-only connection.
/// [`StoreError::Busy`] if the actor is open.
pub fn read_wake(db_path: &Path) -> Result<(Option<AlarmState>, bool), StoreError> {
    if !db_path.exists() {
        return Ok((None, false));
    }
    let (conn, denied, guard) = open_inspection(db_path)?;
    let alarm = alarm_of(&conn, &denied, &guard)?;
    let outbox = outbox::has_rows(&conn, &denied, &guard)?;
    Ok((alarm, outbox))
}

fn alarm_of(
    conn: &Connection,
    denied: &Denied,
    guard: &Guard,
) -> Result<Option<AlarmState>, StoreError> {
    let r = run_inspection(conn, denied, guard, SQL_ALARM_GET, &InspectBounds::rows(1));
    let r = match r {
        Ok(r) => r,
        // A database created before its schema (a crash mid-creation).
        Err(StoreError::Sql(m)) if m.contains("no such table") => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(r.rows.first().and_then(|row| match (&row[0], &row[1]) {
        (Value::Integer(at), Value::Integer(n)) => Some(AlarmState {
            at_ms: *at as u64,
            retry_count: *n as u32,
        }),
        _ => None,
    }))
}

#[cfg(test)]
mod size_tests;
