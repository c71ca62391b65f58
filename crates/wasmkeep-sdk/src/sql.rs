//! SQL over the actor's own SQLite database.
//!
//! Statements take positional parameters (`?1`, `?2`, ... or `?`), built
//! with [`params!`](crate::params) or a slice of [`Value`]s. Everything a
//! statement writes is part of the event's transaction: it commits when
//! the handler returns `Ok` and rolls back otherwise, so never run
//! `BEGIN`/`COMMIT` yourself.
//!
//! The sandbox refuses, with `forbidden` and a reason: the runtime's own
//! tables (`_wasmkeep_*`, in any case), ATTACH, transaction control,
//! temporary objects, pragmas other than read-only introspection, and
//! functions, virtual-table modules or table-valued functions outside its
//! allow-lists (docs/limits.md). SQLite's own refusals (syntax, a
//! constraint, a wrong parameter count, more than one statement) are
//! `sql_error`. Limits, each named in its error: `sql_bytes_max` per
//! statement (`statement_too_large`), `sql_params_max` parameters
//! (`too_many_parameters`), `value_bytes_max` per string, blob or row
//! (`value_too_large`), `query_result_bytes_max` per result
//! (`result_too_large`), `database_bytes_max` (`database_full`; deleting
//! still works), and the event's deadline (`cpu_time_exceeded`).
//!
//! ```no_run
//! use wasmkeep_sdk::{params, sql};
//! # fn main() -> wasmkeep_sdk::Result<()> {
//! sql::execute(
//!     "CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL)",
//!     &[],
//! )?;
//! let id = sql::insert("INSERT INTO notes (title) VALUES (?1)", params!["plan"])?;
//! let rows = sql::query("SELECT id, title FROM notes WHERE id = ?1", params![id])?;
//! for row in &rows.rows {
//!     let (id, title) = (row.int(0), row.text(1));
//!     # let _ = (id, title);
//! }
//! let changed = sql::execute("DELETE FROM notes WHERE id = ?1", params![id])?;
//! # let _ = changed;
//! # Ok(()) }
//! ```

use crate::{Result, Value, wit};

/// One row of a query's result: its columns' values, in the order of
/// [`Rows::columns`]. The getters take a column's index and never fail: a
/// missing column or another type reads as the type's empty value.
#[derive(Debug, Clone)]
pub struct Row(
    /// The columns' values.
    pub Vec<Value>,
);

impl Row {
    /// Column `i` as an integer: a real is truncated, anything else
    /// (NULL, text, blob, no such column) is 0.
    pub fn int(&self, i: usize) -> i64 {
        match self.0.get(i) {
            Some(Value::Integer(n)) => *n,
            Some(Value::Real(f)) => *f as i64,
            _ => 0,
        }
    }

    /// Column `i` if it is an integer, else `None` (NULL included).
    pub fn opt_int(&self, i: usize) -> Option<i64> {
        match self.0.get(i) {
            Some(Value::Integer(n)) => Some(*n),
            _ => None,
        }
    }

    /// Column `i` as a real number: an integer is converted, anything
    /// else is 0.0.
    pub fn real(&self, i: usize) -> f64 {
        match self.0.get(i) {
            Some(Value::Real(f)) => *f,
            Some(Value::Integer(n)) => *n as f64,
            _ => 0.0,
        }
    }

    /// Column `i` as text ("" for NULL or another type).
    pub fn text(&self, i: usize) -> &str {
        match self.0.get(i) {
            Some(Value::Text(s)) => s,
            _ => "",
        }
    }

    /// Column `i` as bytes: a blob, or a text's UTF-8 bytes; empty for
    /// anything else.
    pub fn blob(&self, i: usize) -> &[u8] {
        match self.0.get(i) {
            Some(Value::Blob(b)) => b,
            Some(Value::Text(s)) => s.as_bytes(),
            _ => &[],
        }
    }

    /// Whether column `i` is NULL (or there is no such column).
    pub fn is_null(&self, i: usize) -> bool {
        matches!(self.0.get(i), None | Some(Value::Null))
    }
}

/// The rows a query returned.
#[derive(Debug, Clone)]
pub struct Rows {
    /// The result's column names, in order.
    pub columns: Vec<String>,
    /// The rows, in the order the statement gave them.
    pub rows: Vec<Row>,
    /// Rows the statement changed (for `... RETURNING`).
    pub rows_written: u64,
}

/// Runs a statement that returns rows: a `SELECT`, or any statement with
/// `RETURNING`.
///
/// ```no_run
/// use wasmkeep_sdk::sql;
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// let n = sql::query("UPDATE counter SET n = n + 1 RETURNING n", &[])?.rows[0].int(0);
/// # let _ = n;
/// # Ok(()) }
/// ```
pub fn query(statement: &str, params: &[Value]) -> Result<Rows> {
    let r = wit::sql::query(statement, params)?;
    Ok(Rows {
        columns: r.columns,
        rows: r.rows.into_iter().map(Row).collect(),
        rows_written: r.rows_written,
    })
}

/// Runs a statement that returns no rows; returns the number of rows it
/// changed.
///
/// ```no_run
/// use wasmkeep_sdk::{params, sql};
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// let deleted = sql::execute("DELETE FROM notes WHERE created_ms < ?1", params![1_000i64])?;
/// # let _ = deleted;
/// # Ok(()) }
/// ```
pub fn execute(statement: &str, params: &[Value]) -> Result<u64> {
    Ok(wit::sql::execute(statement, params)?.rows_written)
}

/// The database's size in bytes (pages in use times the page size): what
/// counts against the node's `database_bytes_max`, SQL tables, key-value
/// pairs and the SDK's own tables alike.
///
/// ```no_run
/// let bytes = wasmkeep_sdk::sql::database_size();
/// # let _ = bytes;
/// ```
pub fn database_size() -> u64 {
    wit::sql::database_size()
}

/// Like [`execute`], for an `INSERT`: returns the rowid of the row it
/// inserted (SQLite's `last_insert_rowid()` after the statement).
///
/// ```no_run
/// use wasmkeep_sdk::{params, sql};
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// let id = sql::insert("INSERT INTO notes (title) VALUES (?1)", params!["plan"])?;
/// # let _ = id;
/// # Ok(()) }
/// ```
pub fn insert(statement: &str, params: &[Value]) -> Result<i64> {
    Ok(wit::sql::execute(statement, params)?.last_insert_rowid)
}

fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::Integer(x), Value::Integer(y)) => x == y,
        (Value::Real(x), Value::Real(y)) => x == y,
        (Value::Text(x), Value::Text(y)) => x == y,
        (Value::Blob(x), Value::Blob(y)) => x == y,
        _ => false,
    }
}

/// Applies a decision only if the record it was taken on is unchanged:
/// `read` (one row, one column: a generation, a version, a state) must
/// still give `seen`, or `apply` does not run and this returns
/// `Ok(false)`. A missing row reads as NULL; values compare by type and
/// value (the integer 1 is not the real 1.0).
///
/// The decision and its inputs may be an event apart: a send recorded
/// `seen` in its context, and the answer's event applies only if nothing
/// moved the record meanwhile (the second seed's stale timeout, which
/// overwrote an answer given while the call was out).
///
/// ```no_run
/// use wasmkeep_sdk::{Value, params, sql};
/// # fn main() -> wasmkeep_sdk::Result<()> {
/// # let (booking, generation) = ("b-17", 3i64);
/// let applied = sql::apply_if_unchanged(
///     "SELECT generation FROM rings WHERE booking = ?1",
///     params![booking],
///     &Value::Integer(generation),
///     || {
///         sql::execute(
///             "UPDATE rings SET state = 'timeout' WHERE booking = ?1",
///             params![booking],
///         )
///         .map(drop)
///     },
/// )?;
/// # let _ = applied;
/// # Ok(()) }
/// ```
pub fn apply_if_unchanged(
    read: &str,
    params: &[Value],
    seen: &Value,
    apply: impl FnOnce() -> Result<()>,
) -> Result<bool> {
    let rows = query(read, params)?;
    let now = rows
        .rows
        .first()
        .and_then(|r| r.0.first().cloned())
        .unwrap_or(Value::Null);
    if !same(&now, seen) {
        return Ok(false);
    }
    apply()?;
    Ok(true)
}
