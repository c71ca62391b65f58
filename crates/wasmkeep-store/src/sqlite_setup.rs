//! Process-wide SQLite settings, applied once before the first connection.
//!
//! SQLite takes these only before it initialises itself, so every function
//! of this crate that opens a connection calls [`sqlite_setup`] first (and
//! so does the replica crate, which reads databases too).
//!
//! Both settings come from a profile of W2 (2,000 alarms at one instant, see
//! docs/benchmarks.md), where the two workers spent much of the due instant
//! asleep on each other's locks inside SQLite's allocations:
//!
//! - **Memory statistics off.** With them on, every allocation SQLite makes
//!   takes one process-wide mutex. SQLite's own heap limits need them, so
//!   wasmkeep bounds the heap in its allocator hooks instead
//!   ([`crate::memory_budget`], counted per thread without a lock).
//! - **SQLite allocates through mimalloc.** An actor's connection allocates
//!   on whichever worker runs the actor and frees on another; glibc's
//!   arenas then make the workers wait on each other's arena locks.
//!   mimalloc frees across threads without such a lock.
//!
//! Two more keep an open actor small (W4: the heap, not the instances, was
//! most of an active actor's memory, about 210 KiB each):
//!
//! - **A small lookaside buffer**: 32 slots of 256 bytes per connection
//!   instead of SQLite's default (about 50 KiB touched per connection).
//!   Turning it off altogether saved a little more memory but cost W1-hot a
//!   third of its throughput (44,000 to 31,000 requests/s); this size kept
//!   most of it (37,000) at 8 KiB per connection.
//! - **No bulk page-cache allocation.** Each connection's page cache
//!   otherwise allocates 20 pages at once on its first read, although an
//!   actor's database is often only a few pages.
//!
//! Every allocation is counted in [`crate::memory_budget`], which bounds
//! what a guest statement and all tenants together may make SQLite hold.
//!
//! It also registers the VFS actors' connections open with, which keeps
//! the write-ahead log's index in memory that gives its zero pages back
//! (the `wal_index` module, ADR 0028).

use std::ffi::{c_int, c_void};

use libmimalloc_sys as mi;

use crate::memory_budget as budget;

/// Each connection's lookaside buffer: slots for SQLite's small, short-lived
/// allocations.
const LOOKASIDE_SLOT_BYTES: usize = 256;
const LOOKASIDE_SLOTS: usize = 32;
use rusqlite::ffi;

unsafe extern "C" fn x_malloc(n: c_int) -> *mut c_void {
    let n = n.max(0) as usize;
    if !budget::may_allocate(n) {
        return std::ptr::null_mut();
    }
    // SAFETY: mi_malloc accepts any size; a non-null result is a live
    // allocation whose usable size mi_usable_size may read.
    unsafe {
        let p = mi::mi_malloc(n);
        if !p.is_null() {
            budget::note(mi::mi_usable_size(p) as i64);
        }
        p
    }
}

unsafe extern "C" fn x_free(p: *mut c_void) {
    // SAFETY: SQLite frees only what x_malloc or x_realloc gave it, so `p`
    // is a live allocation of ours (or null, which both calls accept).
    unsafe {
        budget::note(-(mi::mi_usable_size(p) as i64));
        mi::mi_free(p)
    }
}

unsafe extern "C" fn x_realloc(p: *mut c_void, n: c_int) -> *mut c_void {
    // SAFETY: `p` came from x_malloc or x_realloc, as SQLite guarantees; on
    // failure mi_realloc leaves it valid and SQLite keeps using it.
    unsafe {
        let old = mi::mi_usable_size(p);
        let n = n.max(0) as usize;
        if n > old && !budget::may_allocate(n - old) {
            return std::ptr::null_mut();
        }
        let q = mi::mi_realloc(p, n);
        if !q.is_null() {
            budget::note(mi::mi_usable_size(q) as i64 - old as i64);
        }
        q
    }
}

unsafe extern "C" fn x_size(p: *mut c_void) -> c_int {
    // SAFETY: `p` is a live allocation of ours (SQLite's contract).
    let n = unsafe { mi::mi_usable_size(p) };
    n.min(c_int::MAX as usize) as c_int
}

unsafe extern "C" fn x_roundup(n: c_int) -> c_int {
    // mimalloc's smallest alignment; SQLite uses this only to size requests.
    (n.max(0).saturating_add(7)) & !7
}

unsafe extern "C" fn x_init(_: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_shutdown(_: *mut c_void) {}

/// Applies the settings, once per process. If SQLite was initialised
/// before (by code outside this crate), it keeps its defaults and a warning
/// says so: slower, never wrong.
pub fn sqlite_setup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let methods = ffi::sqlite3_mem_methods {
            xMalloc: Some(x_malloc),
            xFree: Some(x_free),
            xRealloc: Some(x_realloc),
            xSize: Some(x_size),
            xRoundup: Some(x_roundup),
            xInit: Some(x_init),
            xShutdown: Some(x_shutdown),
            pAppData: std::ptr::null_mut(),
        };
        // SAFETY: both calls pass what their option takes (an int; a
        // pointer to a complete sqlite3_mem_methods, which SQLite copies
        // during the call)
        // and run before any connection of this crate exists. After SQLite
        // initialised, sqlite3_config returns SQLITE_MISUSE and changes
        // nothing.
        let (stats, malloc, lookaside) = unsafe {
            (
                ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, 0 as c_int),
                ffi::sqlite3_config(
                    ffi::SQLITE_CONFIG_MALLOC,
                    &methods as *const ffi::sqlite3_mem_methods,
                ),
                ffi::sqlite3_config(
                    ffi::SQLITE_CONFIG_LOOKASIDE,
                    LOOKASIDE_SLOT_BYTES as c_int,
                    LOOKASIDE_SLOTS as c_int,
                ),
            )
        };
        // SAFETY: SQLITE_CONFIG_PAGECACHE takes a pointer (null: no static
        // buffer), a size and a count; a count of 0 also stops the page
        // cache from allocating 20 pages in bulk per connection.
        let pagecache = unsafe {
            ffi::sqlite3_config(
                ffi::SQLITE_CONFIG_PAGECACHE,
                std::ptr::null_mut::<c_void>(),
                0 as c_int,
                0 as c_int,
            )
        };
        if [stats, malloc, lookaside, pagecache]
            .iter()
            .any(|rc| *rc != ffi::SQLITE_OK)
        {
            tracing::warn!(
                stats,
                malloc,
                lookaside,
                pagecache,
                "SQLite was initialised before wasmkeep's settings; it keeps its default allocator"
            );
        }
        if !crate::wal_index::register() {
            tracing::warn!(
                "no unix VFS to build on: actors' WAL indexes stay in SQLite's heap memory"
            );
        }
    });
}

/// Gives memory this thread's allocator holds but no longer uses back to
/// the operating system (`mi_collect(true)`): pages emptied by closed
/// actors, including frees other threads made into this thread's pages.
///
/// mimalloc returns such memory on its own only while the thread that owns
/// it keeps allocating; a worker that went quiet after a burst, or the
/// reaper after closing actors, would hold it until its next burst. The
/// runtime calls this when a worker has waited for work for a while and
/// after the reaper closed actors. It takes microseconds when there is
/// nothing to return.
pub fn release_free_memory() {
    // SAFETY: mi_collect may be called on any thread at any time.
    unsafe { mi::mi_collect(true) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_runs_on_the_configured_allocator() {
        sqlite_setup();
        let c = rusqlite::Connection::open_in_memory().unwrap();
        c.execute_batch("CREATE TABLE t (v BLOB); INSERT INTO t VALUES (zeroblob(100000));")
            .unwrap();
        let n: i64 = c
            .query_row("SELECT length(v) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 100_000);
        // With memory statistics off, SQLite reports no memory in use:
        // wasmkeep's own count (memory_budget) is the one that is kept.
        // SAFETY: a plain query of a global counter.
        assert_eq!(unsafe { ffi::sqlite3_memory_used() }, 0);
    }
}
