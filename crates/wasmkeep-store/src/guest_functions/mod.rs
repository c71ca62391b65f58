//! Stand-ins for SQLite built-ins whose single call could run for minutes
//! (ADR 0032, "One call between two checks").
//!
//! A guest statement's deadline is checked by a progress handler between
//! two steps of SQLite's virtual machine, and a function call is one step.
//! Some built-ins do work that grows with the product of their arguments'
//! sizes; with values near `value_bytes_max`, one call ran for seconds to
//! hours, past any deadline. An actor's connection registers a stand-in for
//! each ([`install`]); a function a connection defines hides the built-in
//! of the same name and number of arguments. Two kinds:
//!
//! - **Linear replacements** (`text`): `instr(X, Y)`, `replace(X, Y, Z)`,
//!   `trim`/`ltrim`/`rtrim(X, Y)` and `unhex(X, Y)` return the built-ins'
//!   results, byte for byte, in time that grows with the sum of the sizes.
//!   (The one-argument `trim` and `unhex` are linear already and stay
//!   SQLite's.)
//! - **Bounded built-ins** (`json`): `json_patch` and `jsonb_patch` refuse
//!   arguments whose merge would take too long, with an error that names
//!   the function and the bound, and otherwise run SQLite's built-in.
//!
//! They keep the built-ins' names, so the allow-list refuses or allows them
//! exactly as before. They are deterministic and innocuous, as the built-ins
//! are: a view, an index on an expression or a generated column may call
//! them although the schema is not trusted. What they allocate is counted
//! in the running statement's memory budget: their results through
//! `sqlite3_malloc64`, their working sets through
//! [`crate::memory_budget::Charge`].
//!
//! Not what this module is: a place for new SQL functions. A guest sees
//! the same SQL as on any SQLite of this version.

use std::cell::RefCell;
use std::ffi::{CStr, c_int, c_void};
use std::ptr::NonNull;

use rusqlite::Connection;
use rusqlite::ffi;

mod fts5;
mod fts5_query;
mod json;
mod text;

/// How every stand-in is registered: the flags of the built-ins.
const FLAGS: c_int = ffi::SQLITE_UTF8 | ffi::SQLITE_DETERMINISTIC | ffi::SQLITE_INNOCUOUS;

type ScalarFn =
    unsafe extern "C" fn(*mut ffi::sqlite3_context, c_int, *mut *mut ffi::sqlite3_value);

/// The stand-ins: name, number of arguments, flags beyond [`FLAGS`], user
/// data, function.
const STAND_INS: &[(&CStr, c_int, c_int, usize, ScalarFn)] = &[
    (c"instr", 2, 0, 0, text::instr),
    (c"replace", 3, 0, 0, text::replace),
    (c"trim", 2, 0, text::TRIM_BOTH, text::trim),
    (c"ltrim", 2, 0, text::TRIM_LEFT, text::trim),
    (c"rtrim", 2, 0, text::TRIM_RIGHT, text::trim),
    (c"unhex", 2, 0, 0, text::unhex),
    // Their text results are JSON to the functions they are passed to.
    (
        c"json_patch",
        2,
        ffi::SQLITE_RESULT_SUBTYPE,
        0,
        json::json_patch,
    ),
    (
        c"jsonb_patch",
        2,
        ffi::SQLITE_RESULT_SUBTYPE,
        0,
        json::jsonb_patch,
    ),
];

/// Registers the stand-ins on `conn`.
pub(crate) fn install(conn: &Connection) -> rusqlite::Result<()> {
    for &(name, n_arg, flags, data, f) in STAND_INS {
        // SAFETY: the handle is this open connection's, used on its own
        // thread; the name is NUL-terminated and static; the callback has
        // SQLite's scalar-function signature; the user data is a small
        // integer that is never dereferenced.
        let rc = unsafe {
            ffi::sqlite3_create_function_v2(
                conn.handle(),
                name.as_ptr(),
                n_arg,
                FLAGS | flags,
                data as *mut c_void,
                Some(f),
                None,
                None,
                None,
            )
        };
        if rc != ffi::SQLITE_OK {
            return Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None));
        }
    }
    // SAFETY: as above; no authorizer is installed yet (see `db.rs`), so
    // `fts5()` may hand out FTS5's API.
    let rc = unsafe { fts5::install(conn.handle()) };
    if rc != ffi::SQLITE_OK {
        return Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None));
    }
    Ok(())
}

/// Runs a stand-in's body; a panic (a bug) becomes the call's error
/// instead of unwinding into SQLite, which would abort the node.
fn guarded(ctx: *mut ffi::sqlite3_context, body: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).is_err() {
        // SAFETY: `ctx` is the running call's context (every caller's).
        unsafe { ffi::sqlite3_result_error(ctx, c"internal error in a SQL function".as_ptr(), -1) };
    }
}

thread_local! {
    /// Why a stand-in or a bound refused, for the error the statement ends
    /// with (`take_refusal`).
    static REFUSED: RefCell<Option<Refusal>> = const { RefCell::new(None) };
}

/// Why a stand-in or a bound refused a call.
pub(crate) struct Refusal {
    /// The error's message, which names the bound.
    pub(crate) message: String,
    /// What SQLite reports where the refusal's own message does not reach
    /// the statement (FTS5 passes a tokenizer's code on, not a message).
    reported: Option<&'static str>,
}

impl Refusal {
    /// Whether a statement that failed with `msg` failed for this refusal.
    pub(crate) fn explains(&self, msg: &str) -> bool {
        msg == self.message || self.reported == Some(msg)
    }
}

/// Records a refusal for the statement's error.
fn record_refusal(message: String, reported: Option<&'static str>) {
    REFUSED.set(Some(Refusal { message, reported }));
}

/// Fails the running call with `message`, and records it.
///
/// SAFETY (caller): `ctx` is the running call's context.
unsafe fn refuse(ctx: *mut ffi::sqlite3_context, message: String) {
    // SAFETY: `ctx` is live (caller); SQLite copies the message.
    unsafe {
        ffi::sqlite3_result_error(ctx, message.as_ptr().cast(), message.len() as c_int);
    }
    record_refusal(message, None);
}

/// What was refused since the last call on this thread, if any: the
/// statement that failed then failed for that reason.
pub(crate) fn take_refusal() -> Option<Refusal> {
    REFUSED.take()
}

/// A guest statement starts on this thread: no refusal is its yet, and
/// the count of its FTS5 query terms starts at zero.
pub(crate) fn statement_starts() {
    REFUSED.take();
    fts5_query::restart_count();
}

/// The deadline of a guest statement was just checked (the progress
/// handler): FTS5 query terms are counted from here
/// ([`crate::limits::FTS5_QUERY_TOKENS_MAX`]).
pub(crate) fn deadline_checked() {
    fts5_query::restart_count();
}

// ---- access to arguments and results ----

/// The `i`th argument.
///
/// SAFETY (caller): `argv` holds more than `i` values; SQLite calls each
/// function with the number of arguments it was registered with.
unsafe fn arg(argv: *mut *mut ffi::sqlite3_value, i: usize) -> *mut ffi::sqlite3_value {
    // SAFETY: in bounds, as the caller promises.
    unsafe { *argv.add(i) }
}

/// A value as text, as SQLite's own functions read it (numbers converted,
/// a blob's bytes as they are): `None` for NULL, or when SQLite could not
/// allocate the conversion (it then fails the statement itself).
///
/// SAFETY (caller): `v` is an argument of the running call; the slice is
/// used only during the call, and before `v` is converted again.
unsafe fn text<'a>(v: *mut ffi::sqlite3_value) -> Option<&'a [u8]> {
    // SAFETY: `v` is live (caller); SQLite documents calling `_text`
    // before `_bytes`; the pointer is valid for that many bytes until the
    // value changes.
    unsafe {
        let p = ffi::sqlite3_value_text(v);
        if p.is_null() {
            return None;
        }
        let n = ffi::sqlite3_value_bytes(v).max(0) as usize;
        Some(std::slice::from_raw_parts(p, n))
    }
}

/// A blob's bytes; `None` if SQLite could not allocate them (a zeroblob
/// it had to expand).
///
/// SAFETY (caller): as for [`text`].
unsafe fn blob<'a>(v: *mut ffi::sqlite3_value) -> Option<&'a [u8]> {
    // SAFETY: as in `text`; an empty blob is a null pointer with no bytes.
    unsafe {
        let p = ffi::sqlite3_value_blob(v).cast::<u8>();
        let n = ffi::sqlite3_value_bytes(v).max(0) as usize;
        match (p.is_null(), n) {
            (true, 0) => Some(&[]),
            (true, _) => None,
            (false, _) => Some(std::slice::from_raw_parts(p, n)),
        }
    }
}

/// Makes `bytes` (copied) the call's text result.
///
/// SAFETY (caller): `ctx` is the running call's context.
unsafe fn result_text_copy(ctx: *mut ffi::sqlite3_context, bytes: &[u8]) {
    // SAFETY: `ctx` is live (caller); SQLite copies the bytes (TRANSIENT)
    // before returning.
    unsafe {
        ffi::sqlite3_result_text64(
            ctx,
            bytes.as_ptr().cast(),
            bytes.len() as u64,
            ffi::SQLITE_TRANSIENT(),
            ffi::SQLITE_UTF8 as u8,
        );
    }
}

/// A result buffer SQLite allocated (so it counts in the statement's
/// budget), handed to SQLite without a copy.
struct Out {
    ptr: NonNull<u8>,
    cap: usize,
}

impl Out {
    /// Room for `cap` bytes (and a terminating zero); `None` if SQLite
    /// refused the allocation.
    fn new(cap: usize) -> Option<Out> {
        // SAFETY: a plain allocation; the size is at least one byte.
        let p = unsafe { ffi::sqlite3_malloc64(cap as u64 + 1) }.cast::<u8>();
        let ptr = NonNull::new(p)?;
        // SAFETY: `ptr` holds `cap + 1` writable bytes; zeroing them makes
        // the slice of `bytes` initialised memory.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, cap + 1) };
        Some(Out { ptr, cap })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `cap + 1` initialised bytes that only `self` refers to.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap + 1) }
    }

    /// Hands the first `len` bytes to SQLite as the call's text result.
    ///
    /// SAFETY (caller): `ctx` is the running call's context; `len <= cap`.
    unsafe fn into_text(self, ctx: *mut ffi::sqlite3_context, len: usize) {
        debug_assert!(len <= self.cap);
        let p = self.ptr.as_ptr();
        std::mem::forget(self);
        // SAFETY: SQLite owns the buffer from here on and frees it with
        // `sqlite3_free`, which matches `sqlite3_malloc64` (also when the
        // length is over its limit and it fails the call).
        unsafe {
            ffi::sqlite3_result_text64(
                ctx,
                p.cast(),
                len as u64,
                Some(ffi::sqlite3_free),
                ffi::SQLITE_UTF8 as u8,
            );
        }
    }

    /// Hands the first `len` bytes to SQLite as the call's blob result.
    ///
    /// SAFETY (caller): as for [`Out::into_text`].
    unsafe fn into_blob(self, ctx: *mut ffi::sqlite3_context, len: usize) {
        debug_assert!(len <= self.cap);
        let p = self.ptr.as_ptr();
        std::mem::forget(self);
        // SAFETY: as in `into_text`.
        unsafe { ffi::sqlite3_result_blob64(ctx, p.cast(), len as u64, Some(ffi::sqlite3_free)) };
    }
}

impl Drop for Out {
    fn drop(&mut self) {
        // SAFETY: allocated by `sqlite3_malloc64` and not handed over.
        unsafe { ffi::sqlite3_free(self.ptr.as_ptr().cast()) }
    }
}

/// The connection's bound on a string or blob (`SQLITE_LIMIT_LENGTH`).
///
/// SAFETY (caller): `ctx` is the running call's context.
unsafe fn length_limit(ctx: *mut ffi::sqlite3_context) -> usize {
    // SAFETY: the handle of the connection running the call; -1 only reads.
    unsafe {
        let db = ffi::sqlite3_context_db_handle(ctx);
        ffi::sqlite3_limit(db, ffi::SQLITE_LIMIT_LENGTH, -1).max(0) as usize
    }
}

fn is_continuation(b: u8) -> bool {
    b & 0xc0 == 0x80
}
