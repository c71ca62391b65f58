//! The node's memory budget for what tenants make it allocate: SQLite's
//! heap (every actor's connection) and guests' linear memories and tables.
//!
//! SQLite allocates through this crate's allocator hooks (`sqlite_setup`),
//! which count every allocation here. Two bounds follow from the counts:
//!
//! - **Per guest statement** ([`StatementBudget`]): while a guest's
//!   statement runs on a thread, what SQLite allocates on that thread, less
//!   what it frees there, may not pass the statement's budget
//!   (`statement_memory_bytes_max`). One `SELECT` of many `randomblob`
//!   columns materialises its whole row inside SQLite before the runtime
//!   sees a byte of it: this is what stops it, at the allocation.
//! - **Node-wide** ([`set_node_bytes_max`]): SQLite's heap plus guests'
//!   memories plus the host's buffers held for tenants (request bodies,
//!   socket buffers: the runtime's pools, [`reserve_host`]) may not pass
//!   `node_memory_bytes_max`. The runtime reserves
//!   guests' memory growth here ([`reserve_guest`]); SQLite allocations are
//!   refused past the bound only while a guest statement runs, so the
//!   runtime's own statements (commits, the alarm table) never fail for a
//!   tenant's doing.
//!
//! The same per-statement budget bounds each temporary file a guest
//! statement makes SQLite write (a sort or `DISTINCT` too big for memory
//! spills to one), checked by wasmkeep's VFS before each write
//! ([`may_grow_temp_file`]).
//!
//! A refused allocation makes SQLite fail the statement with `SQLITE_NOMEM`,
//! which it handles like any error: the statement (and the event) fails,
//! the connection stays usable. [`take_refusal`] tells the store which
//! bound it was, so the guest's error names it.
//!
//! Counting is per thread and folded into the shared total every
//! [`FOLD_BYTES`]: one shared counter touched by every allocation of two
//! workers cost measurable throughput (the same lesson as SQLite's own
//! memory statistics, see `sqlite_setup`). The node-wide check is therefore
//! short of the truth by at most that much per thread.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// A thread's uncounted allocations are folded into the total past this.
pub const FOLD_BYTES: i64 = 256 * 1024;

/// SQLite's heap, all threads, as last folded.
static SQLITE_BYTES: AtomicI64 = AtomicI64::new(0);
/// Guests' linear memories and tables, as reserved by the runtime.
static GUEST_BYTES: AtomicI64 = AtomicI64::new(0);
/// What the host holds for tenants outside SQLite and guests (request
/// bodies, socket buffers, ...), as reserved by the runtime's pools.
static HOST_BYTES: AtomicI64 = AtomicI64::new(0);
/// The node-wide bound (`u64::MAX`: none).
static NODE_BYTES_MAX: AtomicU64 = AtomicU64::new(u64::MAX);

/// Which bound refused an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The running statement's own budget.
    Statement,
    /// The node's budget for all tenants together.
    Node,
    /// The statement's bound on one temporary file (sorts and indexes that
    /// spill to disk).
    Temp,
}

thread_local! {
    /// This thread's allocations not yet folded into `SQLITE_BYTES`.
    static UNFOLDED: Cell<i64> = const { Cell::new(0) };
    /// The running guest statement's budget (0: none armed).
    static STATEMENT_MAX: Cell<i64> = const { Cell::new(0) };
    /// What the running guest statement allocated, less what it freed.
    static STATEMENT_USED: Cell<i64> = const { Cell::new(0) };
    /// The running guest statement's bound on one temporary file (0: none).
    static TEMP_FILE_MAX: Cell<u64> = const { Cell::new(0) };
    /// The bound that refused the last allocation on this thread.
    static REFUSED: Cell<Option<Refusal>> = const { Cell::new(None) };
}

/// Sets the node-wide bound on SQLite's heap plus guests' memory.
pub fn set_node_bytes_max(bytes: u64) {
    NODE_BYTES_MAX.store(bytes, Ordering::Relaxed);
}

/// The node-wide bound.
pub fn node_bytes_max() -> u64 {
    NODE_BYTES_MAX.load(Ordering::Relaxed)
}

/// SQLite's heap as counted (short of the truth by at most
/// [`FOLD_BYTES`] per thread).
pub fn sqlite_bytes() -> u64 {
    SQLITE_BYTES.load(Ordering::Relaxed).max(0) as u64
}

/// Guests' memory as reserved.
pub fn guest_bytes() -> u64 {
    GUEST_BYTES.load(Ordering::Relaxed).max(0) as u64
}

/// The host's buffers held for tenants as reserved.
pub fn host_bytes() -> u64 {
    HOST_BYTES.load(Ordering::Relaxed).max(0) as u64
}

fn in_use(extra: i64) -> u64 {
    let sqlite = SQLITE_BYTES.load(Ordering::Relaxed) + UNFOLDED.with(Cell::get);
    let held = GUEST_BYTES.load(Ordering::Relaxed) + HOST_BYTES.load(Ordering::Relaxed);
    (sqlite + held + extra).max(0) as u64
}

/// Reserves `bytes` of the host's buffers for tenants; `false` (nothing
/// reserved) if the node's budget has no room for them.
pub fn reserve_host(bytes: u64) -> bool {
    let bytes = bytes.min(i64::MAX as u64) as i64;
    if in_use(bytes) > node_bytes_max() {
        return false;
    }
    HOST_BYTES.fetch_add(bytes, Ordering::Relaxed);
    true
}

/// Gives back what [`reserve_host`] reserved.
pub fn release_host(bytes: u64) {
    HOST_BYTES.fetch_sub(bytes.min(i64::MAX as u64) as i64, Ordering::Relaxed);
}

/// Reserves `bytes` more of guest memory; `false` (nothing reserved) if the
/// node's budget has no room for them.
pub fn reserve_guest(bytes: u64) -> bool {
    let bytes = bytes.min(i64::MAX as u64) as i64;
    if in_use(bytes) > node_bytes_max() {
        return false;
    }
    GUEST_BYTES.fetch_add(bytes, Ordering::Relaxed);
    true
}

/// Gives back guest memory reserved with [`reserve_guest`].
pub fn release_guest(bytes: u64) {
    GUEST_BYTES.fetch_sub(bytes.min(i64::MAX as u64) as i64, Ordering::Relaxed);
}

/// Whether SQLite may allocate `bytes` more on this thread now. Records
/// the refusal if not. Called by the allocator hooks before allocating.
pub(crate) fn may_allocate(bytes: usize) -> bool {
    let max = STATEMENT_MAX.with(Cell::get);
    if max == 0 {
        // Not a guest statement: counted, never refused.
        return true;
    }
    let bytes = bytes as i64;
    if STATEMENT_USED.with(Cell::get) + bytes > max {
        REFUSED.with(|r| r.set(Some(Refusal::Statement)));
        return false;
    }
    if in_use(bytes) > node_bytes_max() {
        REFUSED.with(|r| r.set(Some(Refusal::Node)));
        return false;
    }
    true
}

/// Counts `delta` bytes allocated (or, negative, freed) by SQLite on this
/// thread. Called by the allocator hooks; must not allocate.
pub(crate) fn note(delta: i64) {
    if STATEMENT_MAX.with(Cell::get) != 0 {
        STATEMENT_USED.with(|u| u.set(u.get() + delta));
    }
    UNFOLDED.with(|u| {
        let v = u.get() + delta;
        if v.abs() >= FOLD_BYTES {
            SQLITE_BYTES.fetch_add(v, Ordering::Relaxed);
            u.set(0);
        } else {
            u.set(v);
        }
    });
}

/// Folds this thread's uncounted allocations into the shared total: a
/// thread that is about to exit calls it, so that what it allocated and
/// others free is not miscounted.
pub fn fold_thread() {
    UNFOLDED.with(|u| {
        SQLITE_BYTES.fetch_add(u.get(), Ordering::Relaxed);
        u.set(0);
    });
}

/// The bound that refused an allocation since the last call, if any.
pub(crate) fn take_refusal() -> Option<Refusal> {
    REFUSED.with(Cell::take)
}

/// Memory the store's own SQL functions hold for a call (their working
/// sets, see `guest_functions`), counted like SQLite's allocations for as
/// long as the value lives, so that a guest statement's budget bounds it
/// too.
pub(crate) struct Charge(i64);

impl Charge {
    /// Counts `bytes`; `None` (and the refusal recorded) if the running
    /// statement's budget or the node's has no room for them.
    pub(crate) fn new(bytes: usize) -> Option<Charge> {
        let mut c = Charge(0);
        c.grow_to(bytes).then_some(c)
    }

    /// Counts `bytes` in all (more than before only); `false` if refused,
    /// which leaves the count as it was.
    pub(crate) fn grow_to(&mut self, bytes: usize) -> bool {
        let bytes = bytes.min(i64::MAX as usize) as i64;
        if bytes <= self.0 {
            return true;
        }
        if !may_allocate((bytes - self.0) as usize) {
            return false;
        }
        note(bytes - self.0);
        self.0 = bytes;
        true
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        note(-self.0);
    }
}

/// A guest statement's memory budget, armed on this thread for as long as
/// the value lives.
pub(crate) struct StatementBudget(());

/// Whether a temporary file may grow to `end` bytes; records the refusal
/// if not. Called by wasmkeep's VFS before each write to such a file.
pub(crate) fn may_grow_temp_file(end: u64) -> bool {
    let max = TEMP_FILE_MAX.with(Cell::get);
    if max != 0 && end > max {
        REFUSED.with(|r| r.set(Some(Refusal::Temp)));
        return false;
    }
    true
}

impl StatementBudget {
    /// Arms `bytes_max` of memory and `temp_file_bytes_max` per temporary
    /// file for the guest statement about to run on this thread.
    pub(crate) fn arm(bytes_max: usize, temp_file_bytes_max: u64) -> StatementBudget {
        TEMP_FILE_MAX.with(|m| m.set(temp_file_bytes_max.max(1)));
        STATEMENT_MAX.with(|m| m.set(bytes_max.clamp(1, i64::MAX as usize) as i64));
        STATEMENT_USED.with(|u| u.set(0));
        REFUSED.with(|r| r.set(None));
        StatementBudget(())
    }
}

impl Drop for StatementBudget {
    fn drop(&mut self) {
        TEMP_FILE_MAX.with(|m| m.set(0));
        STATEMENT_MAX.with(|m| m.set(0));
        STATEMENT_USED.with(|u| u.set(0));
    }
}
