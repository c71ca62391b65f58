//! The sandbox around guest SQL (ADR 0032).
//!
//! Guest SQL is untrusted: the tenant wrote it, and the guest binds its
//! parameters. Three layers keep it inside its own database:
//!
//! 1. **Allow-lists, checked by SQLite's authorizer at prepare time**: the
//!    functions ([`GUEST_FUNCTIONS`]), virtual-table modules
//!    ([`GUEST_VTAB_MODULES`]), table-valued functions
//!    ([`GUEST_TABLE_FUNCTIONS`]) and pragmas ([`GUEST_PRAGMAS`]) a guest
//!    may use. Anything else is refused with `forbidden`, and the message
//!    names the function, module or pragma. A new SQLite that brings new
//!    functions brings them refused until someone adds them here.
//! 2. **Connection settings that close SQLite's own escape hatches**
//!    ([`harden`]): `DEFENSIVE` (no writable schema, shadow tables of
//!    full-text and R-tree indexes read-only to SQL), schema not trusted
//!    (a forged database's views, triggers and defaults cannot call
//!    functions marked unsafe), no `fts3_tokenizer` in any arity (it hands
//!    out and accepts native function pointers), no extension loading.
//! 3. **A deadline on every guest statement** ([`Guard`]): SQLite calls a
//!    progress handler every [`PROGRESS_OPS`] virtual-machine steps, which
//!    stops the statement once the event's deadline has passed or the node
//!    is stopping. The wasm deadline cannot interrupt a host call, so
//!    without this one statement holds a worker for ever.
//!
//! Memory is the fourth bound, kept in the allocator hooks
//! (`memory_budget`).

use std::collections::HashSet;
use std::ffi::{c_char, c_int};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use rusqlite::Connection;
use rusqlite::config::DbConfig;
use rusqlite::ffi;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};

/// Prefix of every table the runtime keeps in an actor's database.
pub const INTERNAL_PREFIX: &str = "_wasmkeep_";

/// The runtime's own statements: everything is allowed.
pub(crate) const MODE_RUNTIME: u8 = 0;
/// A guest's statement: [`authorize_guest`]'s rules.
pub(crate) const MODE_GUEST: u8 = 1;
/// An operator's inspection: reads only ([`authorize_inspection`]).
pub(crate) const MODE_INSPECT: u8 = 2;

/// SQL functions a guest may call: SQLite's core scalar, aggregate, window,
/// date and math functions, the JSON functions, and the auxiliary
/// functions of FTS5. What Durable Objects' SQLite offers is the guide.
///
/// Left out on purpose: `load_extension`; `fts3_tokenizer` (native
/// pointers); `fts5` (returns a pointer to FTS5's C API); the
/// `sqlite_compileoption_*` and `sqlite_offset` functions (facts about the
/// node's build and file layout); the debugging functions of FTS and R-tree
/// indexes (`fts5_decode`, `rtreenode`, ...).
#[rustfmt::skip]
pub const GUEST_FUNCTIONS: &[&str] = &[
    // Core scalar functions.
    "abs", "char", "coalesce", "concat", "concat_ws", "format", "glob", "hex", "if", "ifnull",
    "iif", "instr", "last_insert_rowid", "changes", "total_changes", "length", "like",
    "likelihood", "likely", "lower", "ltrim", "max", "min", "nullif", "octet_length", "printf",
    "quote", "random", "randomblob", "replace", "round", "rtrim", "sign", "soundex", "substr",
    "substring", "trim", "typeof", "unhex", "unicode", "unistr", "unistr_quote", "unlikely",
    "upper", "zeroblob", "sqlite_version", "sqlite_source_id",
    // Date and time.
    "date", "time", "datetime", "julianday", "unixepoch", "strftime", "timediff",
    "current_date", "current_time", "current_timestamp",
    // Aggregates.
    "avg", "count", "group_concat", "string_agg", "sum", "total", "median", "percentile",
    "percentile_cont", "percentile_disc",
    // Window functions.
    "row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile", "lag", "lead",
    "first_value", "last_value", "nth_value",
    // Math.
    "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "ceil", "ceiling", "cos", "cosh",
    "degrees", "exp", "floor", "ln", "log", "log10", "log2", "mod", "pi", "pow", "power",
    "radians", "sin", "sinh", "sqrt", "tan", "tanh", "trunc",
    // JSON (the `->` and `->>` operators are functions too).
    "json", "jsonb", "json_array", "jsonb_array", "json_array_length", "json_error_position",
    "json_extract", "jsonb_extract", "json_insert", "jsonb_insert", "json_object",
    "jsonb_object", "json_patch", "jsonb_patch", "json_pretty", "json_quote", "json_remove",
    "jsonb_remove", "json_replace", "jsonb_replace", "json_set", "jsonb_set", "json_type",
    "json_valid", "json_group_array", "jsonb_group_array", "json_group_object",
    "jsonb_group_object", "->", "->>",
    // Functions SQLite's own ALTER TABLE runs while it rewrites the schema
    // (they are internal: SQL cannot call them itself).
    "sqlite_rename_column", "sqlite_rename_table", "sqlite_rename_test", "sqlite_drop_column",
    "sqlite_rename_quotefix", "sqlite_drop_constraint", "sqlite_fail", "sqlite_add_constraint",
    "sqlite_find_constraint",
    // Operators SQLite runs as functions (`MATCH` on full-text and R-tree
    // tables).
    "match",
    // FTS5's auxiliary functions.
    "bm25", "highlight", "snippet",
];

/// Virtual-table modules a guest may create: FTS5 full-text indexes and
/// R-trees. FTS3 and FTS4 are left out: their tokenizer registry is the
/// one `fts3_tokenizer` writes native pointers into.
pub const GUEST_VTAB_MODULES: &[&str] = &["fts5", "rtree", "rtree_i32"];

/// Table-valued functions (eponymous virtual tables) a guest may read.
/// The `pragma_*` ones follow [`GUEST_PRAGMAS`].
pub const GUEST_TABLE_FUNCTIONS: &[&str] = &["json_each", "json_tree", "jsonb_each", "jsonb_tree"];

/// Pragmas a guest may run: read-only introspection, and
/// `defer_foreign_keys`, which lasts until the event's transaction ends.
pub const GUEST_PRAGMAS: &[&str] = &[
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "foreign_key_check",
    "integrity_check",
    "quick_check",
    "page_count",
    "page_size",
    "freelist_count",
    "data_version",
    "defer_foreign_keys",
];

/// Pragmas of [`GUEST_PRAGMAS`] that would change a setting when given a
/// value: a guest may only read them. (The others take a table or index
/// name as their value, or, `defer_foreign_keys`, may be set.)
const GUEST_PRAGMAS_READ_ONLY: &[&str] =
    &["page_count", "page_size", "data_version", "freelist_count"];

/// How many virtual-machine steps a statement takes between checks of its
/// deadline: a few tens of microseconds of work.
pub const PROGRESS_OPS: c_int = 1000;

/// Why a guest statement was refused; the authorizer records it so the
/// error that follows carries the reason.
#[derive(Default)]
pub(crate) struct Denied(Mutex<Option<String>>);

impl Denied {
    pub(crate) fn set(&self, s: String) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
    }
    pub(crate) fn take(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The unsafe variant of the allow-list, for the node-level test that
/// shows the hostile suite catches its removal: guest SQL may call any
/// function, pragma and virtual-table module, and `fts3_tokenizer` is
/// SQLite's own again. Process-wide; only a build with the `test-faults`
/// feature can switch it on ([`unsafe_drop_allow_list`]).
#[cfg(feature = "test-faults")]
static UNSAFE_NO_ALLOW_LIST: AtomicBool = AtomicBool::new(false);

/// Switches the allow-list off for every connection opened after this
/// (test-faults builds only: the unsafe variant of ADR 0032's rule).
#[cfg(feature = "test-faults")]
pub fn unsafe_drop_allow_list() {
    UNSAFE_NO_ALLOW_LIST.store(true, Ordering::SeqCst);
}

/// Whether the unsafe variant is on (never, in a build without
/// `test-faults`).
fn allow_list_dropped() -> bool {
    #[cfg(feature = "test-faults")]
    if UNSAFE_NO_ALLOW_LIST.load(Ordering::Relaxed) {
        return true;
    }
    false
}

/// Turns on the settings that close SQLite's escape hatches, on every
/// connection that runs SQL a tenant wrote or a bucket delivered.
pub fn harden(conn: &Connection) -> rusqlite::Result<()> {
    set_depth_limits(conn);
    if allow_list_dropped() {
        // The unsafe variant: none of the hatches is closed.
        return Ok(());
    }
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_FTS3_TOKENIZER, false)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_WRITABLE_SCHEMA, false)?;
    disable_function(conn, c"fts3_tokenizer", 1)?;
    disable_function(conn, c"fts3_tokenizer", 2)?;
    Ok(())
}

/// Sets SQLite's bounds on recursive paths to the values the native stack
/// is sized for (see [`crate::stack`]), whatever the library's build
/// defaults are. They hold for the unsafe variant of the allow-list too:
/// the stack's sizing is a rule of its own.
pub(crate) fn set_depth_limits(conn: &Connection) {
    use crate::stack::{
        SQL_COMPOUND_SELECT_MAX, SQL_EXPR_DEPTH_MAX, SQL_PARSER_DEPTH_MAX, SQL_TRIGGER_DEPTH_MAX,
    };
    for (limit, value) in [
        (ffi::SQLITE_LIMIT_TRIGGER_DEPTH, SQL_TRIGGER_DEPTH_MAX),
        (ffi::SQLITE_LIMIT_EXPR_DEPTH, SQL_EXPR_DEPTH_MAX),
        (ffi::SQLITE_LIMIT_COMPOUND_SELECT, SQL_COMPOUND_SELECT_MAX),
        (SQLITE_LIMIT_PARSER_DEPTH, SQL_PARSER_DEPTH_MAX),
    ] {
        // SAFETY: the handle is this open connection's, used on its own
        // thread; `sqlite3_limit` takes any limit id and value (values
        // above the library's hard bound are lowered to it).
        unsafe {
            ffi::sqlite3_limit(conn.handle(), limit, value);
        }
    }
}

/// `SQLITE_LIMIT_PARSER_DEPTH` (SQLite 3.50), which the bindings do not
/// name yet.
const SQLITE_LIMIT_PARSER_DEPTH: c_int = 12;

unsafe extern "C" fn refuse_call(
    ctx: *mut ffi::sqlite3_context,
    _argc: c_int,
    _argv: *mut *mut ffi::sqlite3_value,
) {
    const MSG: &str = "this function is not available to actors";
    // SAFETY: `ctx` is the live context SQLite passed to this call; the
    // message is valid for its length, which SQLite copies.
    unsafe { ffi::sqlite3_result_error(ctx, MSG.as_ptr().cast::<c_char>(), MSG.len() as c_int) }
}

/// Replaces a built-in function with one that only fails: a function the
/// connection defines takes precedence over SQLite's own, so the built-in
/// is unreachable even where the authorizer is not asked (a schema parsed
/// while the database opens).
fn disable_function(conn: &Connection, name: &std::ffi::CStr, args: c_int) -> rusqlite::Result<()> {
    // SAFETY: the handle is this open connection's, used on its own
    // thread; the name is NUL-terminated; the callback matches SQLite's
    // scalar-function signature and needs no user data.
    let rc = unsafe {
        ffi::sqlite3_create_function_v2(
            conn.handle(),
            name.as_ptr(),
            args,
            ffi::SQLITE_UTF8 | ffi::SQLITE_DIRECTONLY,
            std::ptr::null_mut(),
            Some(refuse_call),
            None,
            None,
            None,
        )
    };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None))
    }
}

/// Installs the authorizer that applies the rules of the connection's
/// current mode (`mode` holds a `MODE_*` value).
pub(crate) fn install_authorizer(
    conn: &mut Connection,
    mode: Arc<AtomicU8>,
    denied: Arc<Denied>,
) -> rusqlite::Result<()> {
    conn.authorizer(Some(move |ctx: AuthContext<'_>| {
        let verdict = match mode.load(Ordering::Relaxed) {
            MODE_RUNTIME => return Authorization::Allow,
            MODE_GUEST => authorize_guest(&ctx),
            _ => authorize_inspection(&ctx),
        };
        match verdict {
            Ok(()) => Authorization::Allow,
            Err(reason) => {
                denied.set(reason);
                Authorization::Deny
            }
        }
    }))
}

fn listed(list: &[&str], name: &str) -> bool {
    list.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// [`GUEST_FUNCTIONS`] as a set: the authorizer asks for every function
/// of every statement a guest prepares (a cold actor prepares all of its
/// statements once).
fn guest_functions() -> &'static HashSet<&'static str> {
    static SET: OnceLock<HashSet<&'static str>> = OnceLock::new();
    SET.get_or_init(|| GUEST_FUNCTIONS.iter().copied().collect())
}

fn function_allowed(name: &str) -> Result<(), String> {
    // SQLite names its built-in functions in lowercase; a guest's spelling
    // does not reach here (SQLite passes the function's own name).
    let allowed = if name.bytes().any(|b| b.is_ascii_uppercase()) {
        guest_functions().contains(name.to_ascii_lowercase().as_str())
    } else {
        guest_functions().contains(name)
    };
    if allowed {
        Ok(())
    } else {
        Err(format!(
            "function `{name}` is not allowed (see docs/limits.md)"
        ))
    }
}

/// Whether a pragma may run: listed, and given no value if it is a
/// setting a guest may only read.
fn pragma_allowed(name: &str, value: Option<&str>) -> bool {
    listed(GUEST_PRAGMAS, name) && (value.is_none() || !listed(GUEST_PRAGMAS_READ_ONLY, name))
}

/// Every virtual-table module the linked SQLite registers on a
/// connection, lowercase: the names a table-valued function may have.
fn module_names() -> &'static [String] {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let Ok(c) = Connection::open_in_memory() else {
            return Vec::new();
        };
        let names = c
            .prepare("SELECT name FROM pragma_module_list")
            .and_then(|mut s| {
                s.query_map([], |r| r.get::<_, String>(0))?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .unwrap_or_default();
        names.into_iter().map(|n| n.to_ascii_lowercase()).collect()
    })
}

/// A read of `table`: refused if it is internal, or a table-valued
/// function that is not allowed (a guest's own table of the same name as a
/// module is refused too: the message says why).
fn read_allowed(table: &str) -> Result<(), String> {
    internal(table)?;
    if !module_names().iter().any(|m| m.eq_ignore_ascii_case(table))
        || listed(GUEST_TABLE_FUNCTIONS, table)
        || listed(GUEST_VTAB_MODULES, table)
    {
        return Ok(());
    }
    let lower = table.to_ascii_lowercase();
    if let Some(pragma) = lower.strip_prefix("pragma_")
        && pragma_allowed(pragma, None)
    {
        return Ok(());
    }
    Err(format!(
        "table-valued function `{table}` is not allowed (see docs/limits.md)"
    ))
}

fn internal(table: &str) -> Result<(), String> {
    let n = INTERNAL_PREFIX.len();
    if table.len() >= n && table.as_bytes()[..n].eq_ignore_ascii_case(INTERNAL_PREFIX.as_bytes()) {
        Err(format!("table `{table}` is internal to the runtime"))
    } else {
        Ok(())
    }
}

/// An inspection reads, internal tables included, and changes nothing: not
/// the data, not the connection's transaction, not its settings. It calls
/// the functions a guest may call.
fn authorize_inspection(ctx: &AuthContext<'_>) -> Result<(), String> {
    match ctx.action {
        AuthAction::Read { .. } | AuthAction::Select | AuthAction::Recursive => Ok(()),
        AuthAction::Function { function_name } => function_allowed(function_name),
        AuthAction::Pragma {
            pragma_name,
            pragma_value,
        } if pragma_allowed(pragma_name, pragma_value)
            && !pragma_name.eq_ignore_ascii_case("defer_foreign_keys") =>
        {
            Ok(())
        }
        _ => Err("inspection runs read-only statements only".into()),
    }
}

/// The guest sandbox: `Err(reason)` refuses the action.
fn authorize_guest(ctx: &AuthContext<'_>) -> Result<(), String> {
    if allow_list_dropped()
        && matches!(
            ctx.action,
            AuthAction::Function { .. }
                | AuthAction::Pragma { .. }
                | AuthAction::CreateVtable { .. }
                | AuthAction::DropVtable { .. }
        )
    {
        return Ok(());
    }
    match ctx.action {
        AuthAction::Read { table_name, .. } => read_allowed(table_name),
        AuthAction::Insert { table_name }
        | AuthAction::Update { table_name, .. }
        | AuthAction::Delete { table_name }
        | AuthAction::CreateTable { table_name }
        | AuthAction::DropTable { table_name }
        | AuthAction::AlterTable { table_name, .. }
        | AuthAction::Analyze { table_name }
        | AuthAction::CreateIndex { table_name, .. }
        | AuthAction::DropIndex { table_name, .. }
        | AuthAction::CreateTrigger { table_name, .. }
        | AuthAction::DropTrigger { table_name, .. } => internal(table_name),
        AuthAction::CreateView { view_name } | AuthAction::DropView { view_name } => {
            internal(view_name)
        }
        AuthAction::CreateVtable {
            table_name,
            module_name,
        }
        | AuthAction::DropVtable {
            table_name,
            module_name,
        } => {
            internal(table_name)?;
            if listed(GUEST_VTAB_MODULES, module_name) {
                Ok(())
            } else {
                Err(format!(
                    "virtual table module `{module_name}` is not allowed (see docs/limits.md)"
                ))
            }
        }
        AuthAction::CreateTempIndex { .. }
        | AuthAction::CreateTempTable { .. }
        | AuthAction::CreateTempTrigger { .. }
        | AuthAction::CreateTempView { .. }
        | AuthAction::DropTempIndex { .. }
        | AuthAction::DropTempTable { .. }
        | AuthAction::DropTempTrigger { .. }
        | AuthAction::DropTempView { .. } => Err(
            "temporary tables, views and triggers are not allowed: they would outlive the event"
                .into(),
        ),
        AuthAction::Attach { .. } | AuthAction::Detach { .. } => {
            Err("ATTACH and DETACH are not allowed: an actor has exactly one database".into())
        }
        AuthAction::Transaction { .. } | AuthAction::Savepoint { .. } => {
            Err("transaction control belongs to the runtime: every event is one transaction".into())
        }
        AuthAction::Pragma {
            pragma_name,
            pragma_value,
        } => {
            if pragma_allowed(pragma_name, pragma_value) {
                Ok(())
            } else {
                Err(format!(
                    "pragma `{pragma_name}` is not allowed (see docs/limits.md)"
                ))
            }
        }
        AuthAction::Function { function_name } => function_allowed(function_name),
        AuthAction::Select | AuthAction::Recursive | AuthAction::Reindex { .. } => Ok(()),
        _ => Err("this kind of statement is not allowed".into()),
    }
}

/// Why the guard stopped a statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// The event's deadline passed.
    Deadline,
    /// The node is stopping.
    Stopping,
}

/// One connection's deadline and stop flag, read by its progress handler.
#[derive(Default)]
pub(crate) struct Guard {
    /// Nanoseconds after [`epoch`] when guest statements must stop; 0: no
    /// deadline.
    deadline_ns: AtomicU64,
    /// Set by the node when it stops; shared by all its connections. Given
    /// once, when the connection opens, and read without a lock by the
    /// progress handler.
    stop: OnceLock<Arc<AtomicBool>>,
    /// What stopped the last statement (`0` none, `1` deadline,
    /// `2` stopping).
    stopped: AtomicU8,
}

use crate::clock::epoch;

impl Guard {
    pub(crate) fn set_deadline(&self, deadline: Option<Instant>) {
        let ns = deadline.map_or(0, |d| {
            (d.saturating_duration_since(epoch()).as_nanos() as u64).max(1)
        });
        self.deadline_ns.store(ns, Ordering::Relaxed);
    }

    /// Shares the node's stop flag; a connection keeps the first it is
    /// given (a node gives each connection its own flag, once).
    pub(crate) fn set_stop_flag(&self, flag: Arc<AtomicBool>) {
        let _ = self.stop.set(flag);
    }

    /// Whether a guest statement must stop now; records why.
    pub(crate) fn must_stop(&self) -> bool {
        let stopping = self.stop.get().is_some_and(|f| f.load(Ordering::Relaxed));
        if stopping {
            self.stopped.store(2, Ordering::Relaxed);
            return true;
        }
        let deadline = self.deadline_ns.load(Ordering::Relaxed);
        if deadline != 0 && epoch().elapsed().as_nanos() as u64 >= deadline {
            self.stopped.store(1, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// What stopped the last statement, once.
    pub(crate) fn take_stopped(&self) -> Option<Stopped> {
        match self.stopped.swap(0, Ordering::Relaxed) {
            1 => Some(Stopped::Deadline),
            2 => Some(Stopped::Stopping),
            _ => None,
        }
    }
}

/// Installs the progress handler that stops guest and inspection
/// statements when `guard` says so. The runtime's own statements (commits
/// above all) are never interrupted: only a guest's, and an operator's
/// inspection (which reads what a guest wrote: its views and triggers).
pub(crate) fn install_guard(
    conn: &mut Connection,
    mode: Arc<AtomicU8>,
    guard: Arc<Guard>,
) -> rusqlite::Result<()> {
    conn.progress_handler(
        PROGRESS_OPS,
        Some(move || {
            // FTS5 counts the terms of queries from one check to the next
            // (`limits::FTS5_QUERY_TOKENS_MAX`).
            crate::guest_functions::deadline_checked();
            let m = mode.load(Ordering::Relaxed);
            (m == MODE_GUEST || m == MODE_INSPECT) && guard.must_stop()
        }),
    )
}
