//! `json_patch` and `jsonb_patch` under a bound on their work, merged by
//! SQLite's own built-ins on a connection that has no replacements.
//!
//! SQLite merges a patch (RFC 7396) member by member, looking each one up
//! among the target's members from the first, and moving the rest of the
//! target at each change: one call with two 2 MiB objects ran for about a
//! minute. A merge of our own would have to render JSON byte for byte as
//! SQLite does, so the replacement bounds the work instead: the patch's
//! members times the bytes of both arguments may not pass
//! [`JSON_PATCH_MEMBER_BYTES_MAX`] (ADR 0032). Within the bound, SQLite's
//! built-in does the merge, on a private connection of the worker thread
//! ([`Builtins`]), so the result is the built-in's.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, c_int};

use rusqlite::ffi;

use super::{arg, guarded, refuse};
use crate::limits::JSON_PATCH_MEMBER_BYTES_MAX;

/// `json_patch(T, P)`.
pub(super) unsafe extern "C" fn json_patch(
    ctx: *mut ffi::sqlite3_context,
    _argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: registered with two arguments; `ctx` is this call's.
    guarded(ctx, || unsafe {
        bounded_patch(ctx, argv, c"json_patch", c"SELECT json_patch(?1, ?2)")
    })
}

/// `jsonb_patch(T, P)`.
pub(super) unsafe extern "C" fn jsonb_patch(
    ctx: *mut ffi::sqlite3_context,
    _argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: as in `json_patch`.
    guarded(ctx, || unsafe {
        bounded_patch(ctx, argv, c"jsonb_patch", c"SELECT jsonb_patch(?1, ?2)")
    })
}

/// Checks the bound, then runs `sql` (the built-in) on the two arguments.
///
/// SAFETY (caller): `argv` holds two arguments of the running call, whose
/// context is `ctx`.
unsafe fn bounded_patch(
    ctx: *mut ffi::sqlite3_context,
    argv: *mut *mut ffi::sqlite3_value,
    name: &CStr,
    sql: &'static CStr,
) {
    // SAFETY: the arguments are this call's (caller); their bytes are read
    // during the call only.
    unsafe {
        let (target, patch) = (arg(argv, 0), arg(argv, 1));
        let members = patch_members(patch);
        let bytes = ffi::sqlite3_value_bytes(target).max(0) as u64
            + ffi::sqlite3_value_bytes(patch).max(0) as u64;
        if members.saturating_mul(bytes) > JSON_PATCH_MEMBER_BYTES_MAX {
            let name = name.to_string_lossy();
            refuse(
                ctx,
                format!(
                    "{name} arguments too large: members={members} bytes={bytes} \
                     limit json_patch_member_bytes_max={JSON_PATCH_MEMBER_BYTES_MAX}"
                ),
            );
            return;
        }
        Builtins::call(ctx, sql, &[target, patch]);
    }
}

/// At least as many as the object members in a patch (of any depth):
/// SQLite looks up each of them among the target's.
///
/// SAFETY (caller): `v` is an argument of the running call.
unsafe fn patch_members(v: *mut ffi::sqlite3_value) -> u64 {
    // SAFETY: `v` is live (caller); the bytes are read before the call
    // returns.
    unsafe {
        match ffi::sqlite3_value_type(v) {
            ffi::SQLITE_BLOB => {
                let p = ffi::sqlite3_value_blob(v).cast::<u8>();
                let n = ffi::sqlite3_value_bytes(v).max(0) as usize;
                if p.is_null() {
                    return 0;
                }
                let b = std::slice::from_raw_parts(p, n);
                // Where the blob is not well-formed JSONB, as many as
                // it could hold: a member is a label and a value, each one
                // byte at least.
                jsonb_members(b).unwrap_or(n as u64 / 2)
            }
            ffi::SQLITE_TEXT => {
                let p = ffi::sqlite3_value_text(v);
                if p.is_null() {
                    return 0;
                }
                let n = ffi::sqlite3_value_bytes(v).max(0) as usize;
                text_members(std::slice::from_raw_parts(p, n))
            }
            // A number or NULL has no members.
            _ => 0,
        }
    }
}

/// Colons outside strings: every member of a JSON (or JSON5) object has
/// one. A colon in a JSON5 comment counts too, which only errs high.
fn text_members(s: &[u8]) -> u64 {
    let (mut n, mut quote, mut escaped) = (0u64, None::<u8>, false);
    for &b in s {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == q {
                    quote = None;
                }
            }
            None if b == b'"' || b == b'\'' => quote = Some(b),
            None if b == b':' => n += 1,
            None => {}
        }
    }
    n
}

/// The members of every object in a JSONB value, or `None` if it is not
/// well-formed JSONB. A node is a header (its type in the low four bits;
/// in the high four, its payload's size or how many bytes after the
/// header hold it) and a payload; an object's payload is its labels and
/// values, one node each; an array's, its elements.
fn jsonb_members(b: &[u8]) -> Option<u64> {
    const ARRAY: u8 = 11;
    const OBJECT: u8 = 12;
    let mut members = 0u64;
    // Ranges of nodes still to walk, and whether they are an object's.
    let mut todo = vec![(0usize, b.len(), false)];
    while let Some((mut i, end, in_object)) = todo.pop() {
        let mut nodes = 0u64;
        while i < end {
            let h = *b.get(i)?;
            let (kind, code) = (h & 0x0f, h >> 4);
            let (header, size) = match code {
                0..=11 => (1, code as usize),
                12 => (2, *b.get(i + 1)? as usize),
                13 => (
                    3,
                    u16::from_be_bytes(b.get(i + 1..i + 3)?.try_into().ok()?) as usize,
                ),
                14 => (
                    5,
                    u32::from_be_bytes(b.get(i + 1..i + 5)?.try_into().ok()?) as usize,
                ),
                _ => {
                    let n = u64::from_be_bytes(b.get(i + 1..i + 9)?.try_into().ok()?);
                    (9, usize::try_from(n).ok()?)
                }
            };
            let start = i + header;
            let stop = start.checked_add(size).filter(|&s| s <= end)?;
            if kind == OBJECT || kind == ARRAY {
                todo.push((start, stop, kind == OBJECT));
            }
            nodes += 1;
            i = stop;
        }
        if in_object {
            members += nodes / 2;
        }
    }
    Some(members)
}

/// A connection of the worker thread's own, in memory, on which the
/// replacements call the built-ins they bound (a function registered on the
/// actor's connection hides the built-in there). Its statements stay
/// prepared; its allocations happen during the guest's statement, on its
/// thread, so they count in that statement's memory budget.
struct Builtins {
    db: *mut ffi::sqlite3,
    statements: HashMap<&'static CStr, *mut ffi::sqlite3_stmt>,
}

thread_local! {
    static BUILTINS: RefCell<Option<Builtins>> = const { RefCell::new(None) };
}

impl Builtins {
    fn open() -> Option<Builtins> {
        let mut db = std::ptr::null_mut();
        let flags = ffi::SQLITE_OPEN_READWRITE
            | ffi::SQLITE_OPEN_CREATE
            | ffi::SQLITE_OPEN_MEMORY
            | ffi::SQLITE_OPEN_NOMUTEX;
        // SAFETY: opens a private in-memory database; `db` receives the
        // handle, which is closed again if opening failed.
        let rc =
            unsafe { ffi::sqlite3_open_v2(c":memory:".as_ptr(), &mut db, flags, std::ptr::null()) };
        if rc != ffi::SQLITE_OK {
            // SAFETY: closing a handle SQLite returned (or null) is allowed.
            unsafe { ffi::sqlite3_close(db) };
            return None;
        }
        Some(Builtins {
            db,
            statements: HashMap::new(),
        })
    }

    fn statement(&mut self, sql: &'static CStr) -> Option<*mut ffi::sqlite3_stmt> {
        if let Some(&s) = self.statements.get(sql) {
            return Some(s);
        }
        let mut stmt = std::ptr::null_mut();
        // SAFETY: `db` is open and this thread's; the text is
        // NUL-terminated (-1).
        let rc = unsafe {
            ffi::sqlite3_prepare_v3(
                self.db,
                sql.as_ptr(),
                -1,
                ffi::SQLITE_PREPARE_PERSISTENT,
                &mut stmt,
                std::ptr::null_mut(),
            )
        };
        if rc != ffi::SQLITE_OK || stmt.is_null() {
            return None;
        }
        self.statements.insert(sql, stmt);
        Some(stmt)
    }

    /// Runs `sql` with `args` bound and makes its value (or its error)
    /// the running call's.
    ///
    /// SAFETY (caller): `ctx` is the running call's context and `args` its
    /// arguments.
    unsafe fn call(
        ctx: *mut ffi::sqlite3_context,
        sql: &'static CStr,
        args: &[*mut ffi::sqlite3_value],
    ) {
        BUILTINS.with_borrow_mut(|b| {
            if b.is_none() {
                *b = Builtins::open();
            }
            let Some(b) = b.as_mut() else {
                // SAFETY: `ctx` is live (caller).
                unsafe { ffi::sqlite3_result_error_nomem(ctx) };
                return;
            };
            let Some(stmt) = b.statement(sql) else {
                // SAFETY: as above.
                unsafe { ffi::sqlite3_result_error_nomem(ctx) };
                return;
            };
            // SAFETY: `stmt` is prepared on `b.db`, both this thread's;
            // binding copies the arguments; the column's value is copied
            // into the result before the statement is reset; `ctx` is live.
            unsafe {
                let caller = ffi::sqlite3_context_db_handle(ctx);
                let length = ffi::sqlite3_limit(caller, ffi::SQLITE_LIMIT_LENGTH, -1);
                ffi::sqlite3_limit(b.db, ffi::SQLITE_LIMIT_LENGTH, length);
                let mut rc = ffi::SQLITE_OK;
                for (i, &a) in args.iter().enumerate() {
                    if rc == ffi::SQLITE_OK {
                        rc = ffi::sqlite3_bind_value(stmt, i as c_int + 1, a);
                    }
                }
                if rc == ffi::SQLITE_OK {
                    rc = ffi::sqlite3_step(stmt);
                }
                if rc == ffi::SQLITE_ROW {
                    let v = ffi::sqlite3_column_value(stmt, 0);
                    ffi::sqlite3_result_value(ctx, v);
                    // The copy keeps the JSON subtype already; said
                    // explicitly, as the result must keep it.
                    let subtype = ffi::sqlite3_value_subtype(v);
                    if subtype != 0 {
                        ffi::sqlite3_result_subtype(ctx, subtype);
                    }
                } else {
                    pass_error(ctx, b.db, rc);
                }
                ffi::sqlite3_reset(stmt);
                ffi::sqlite3_clear_bindings(stmt);
            }
        });
    }
}

/// Makes the private connection's error the running call's.
///
/// SAFETY (caller): `ctx` is the running call's context; `db` is open.
unsafe fn pass_error(ctx: *mut ffi::sqlite3_context, db: *mut ffi::sqlite3, rc: c_int) {
    // SAFETY: as the caller promises; SQLite copies the message.
    unsafe {
        match rc & 0xff {
            ffi::SQLITE_NOMEM => ffi::sqlite3_result_error_nomem(ctx),
            ffi::SQLITE_TOOBIG => ffi::sqlite3_result_error_toobig(ctx),
            _ => {
                ffi::sqlite3_result_error(ctx, ffi::sqlite3_errmsg(db), -1);
                ffi::sqlite3_result_error_code(ctx, ffi::sqlite3_errcode(db));
            }
        }
    }
}

impl Drop for Builtins {
    fn drop(&mut self) {
        // SAFETY: the statements and the connection are this value's, and
        // nothing uses them after it.
        unsafe {
            for &s in self.statements.values() {
                ffi::sqlite3_finalize(s);
            }
            ffi::sqlite3_close(self.db);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonb_members_are_counted_in_every_object() {
        // SQLite's process-wide settings come before its first connection.
        crate::sqlite_setup::sqlite_setup();
        let c = rusqlite::Connection::open_in_memory().unwrap();
        let jsonb =
            |j: &str| -> Vec<u8> { c.query_row("SELECT jsonb(?1)", [j], |r| r.get(0)).unwrap() };
        assert_eq!(
            jsonb_members(&jsonb(r#"{"a":1,"b":{"c":[{"d":2}]}}"#)),
            Some(4)
        );
        assert_eq!(jsonb_members(&jsonb(r#"[1,{"a":"x"},"y"]"#)), Some(1));
        assert_eq!(
            jsonb_members(&jsonb(&format!(r#"{{"a":"{}"}}"#, "x".repeat(70_000)))),
            Some(1)
        );
        assert_eq!(jsonb_members(&[0x1c, 0x17]), None);
    }

    #[test]
    fn members_are_counted_outside_strings() {
        assert_eq!(text_members(br#"{"a":1,"b":{"c":2}}"#), 3);
        assert_eq!(text_members(br#"{"a:b":"c:d\":e"}"#), 1);
        assert_eq!(text_members(b"{a:'x:y',b:2}"), 2);
        assert_eq!(text_members(b"[1,2,3]"), 0);
    }
}
