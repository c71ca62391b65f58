//! How much native stack a call into SQLite may need, and the check that
//! refuses one when the calling thread has less left.
//!
//! SQLite's code generator recurses: each level of a chain of triggers (and
//! of foreign-key actions, which are triggers inside SQLite) compiles the
//! next level's program inside its own frames, views and subqueries are
//! expanded recursively, and so on. SQLite bounds each of these paths by a
//! limit ([`SQL_TRIGGER_DEPTH_MAX`], [`SQL_EXPR_DEPTH_MAX`], ...), which the
//! store sets explicitly on every connection, but it cannot know how much
//! stack its caller left it. A guest that recursed deep into its own wasm
//! stack before a host call leaves SQLite that much less of the worker's
//! native stack: with Rust's default 2 MiB thread stack, 500 KiB of wasm
//! frames and a 999-table trigger chain aborted the whole node
//! (issue 33).
//!
//! Two rules close that:
//!
//! - The runtime runs guests on threads whose stack holds the deepest wasm
//!   stack a guest may have, plus [`SQL_STACK_BYTES_MIN`] for SQLite, plus
//!   room for wasmtime's and the host's own frames (the runtime's
//!   `WORKER_STACK_BYTES`).
//! - Every host call of a guest that reaches SQLite (the runtime's
//!   `host.rs`, `guest_db`) first checks the stack left
//!   ([`check`]) and refuses with [`StoreError::StackExhausted`] when it is
//!   below [`SQL_STACK_BYTES_MIN`]: the check holds even if a thread was
//!   started with less, or a guest found a deeper path than the sizes
//!   assumed.
//!
//! [`SQL_STACK_BYTES_MIN`] is four times the most any path used at these
//! limits, measured by painting a thread's stack
//! (`examples/stack_probe.rs`, figures in docs/adr/0045): a 999-table
//! chain of `AFTER INSERT` triggers used 1.6 MiB in a release build
//! (1.9 MiB at the test profile's `-O1`), `ON DELETE CASCADE` over 999
//! tables 1.3 MiB, 990 nested views 0.6 MiB, 995 nested common table
//! expressions 0.4 MiB.

use std::cell::Cell;
#[cfg(feature = "test-faults")]
use std::sync::atomic::{AtomicBool, Ordering};

use crate::StoreError;

/// The native stack a call into SQLite is given at least: calls made with
/// less left are refused.
pub const SQL_STACK_BYTES_MIN: usize = 8 * 1024 * 1024;

/// Deepest nesting of triggers, counting foreign-key actions (SQLite's
/// `SQLITE_LIMIT_TRIGGER_DEPTH`; its compile-time default, set explicitly
/// so that the stack sizes above stay true whatever SQLite's build says).
pub const SQL_TRIGGER_DEPTH_MAX: i32 = 1000;
/// Deepest expression tree, and deepest nesting of views and subqueries
/// (SQLite's `SQLITE_LIMIT_EXPR_DEPTH`, its default).
pub const SQL_EXPR_DEPTH_MAX: i32 = 1000;
/// Most terms of one compound `SELECT` (SQLite's
/// `SQLITE_LIMIT_COMPOUND_SELECT`, its default).
pub const SQL_COMPOUND_SELECT_MAX: i32 = 500;
/// Deepest nesting the parser accepts (SQLite's
/// `SQLITE_LIMIT_PARSER_DEPTH`, its default).
pub const SQL_PARSER_DEPTH_MAX: i32 = 2500;

thread_local! {
    /// The lowest address of this thread's stack that may be used (above
    /// its guard page), found once per thread; 0 until then, `usize::MAX`
    /// if the system could not say.
    static STACK_LOW: Cell<usize> = const { Cell::new(0) };
}

/// The lowest usable address of the calling thread's stack, from the
/// thread's attributes (`None` if the system cannot say).
fn stack_low() -> Option<usize> {
    let known = STACK_LOW.with(Cell::get);
    if known == usize::MAX {
        return None;
    }
    if known != 0 {
        return Some(known);
    }
    let low = thread_stack_low();
    STACK_LOW.with(|c| c.set(low.unwrap_or(usize::MAX)));
    low
}

#[cfg(target_os = "linux")]
fn thread_stack_low() -> Option<usize> {
    // SAFETY: `attr` is initialised by `pthread_getattr_np` before it is
    // read, and destroyed once; `addr` and `size` are plain out-parameters.
    // The calls have no other precondition.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let mut guard: libc::size_t = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0
            && libc::pthread_attr_getguardsize(&attr, &mut guard) == 0;
        libc::pthread_attr_destroy(&mut attr);
        // For the main thread the reported area starts below the guard;
        // for others the guard is inside it. Skipping it in both cases
        // only makes the figure smaller, never larger.
        ok.then(|| addr as usize + guard)
    }
}

#[cfg(not(target_os = "linux"))]
fn thread_stack_low() -> Option<usize> {
    None
}

/// The calling thread's native stack left below this frame, in bytes
/// (`None` if the system cannot say).
#[inline(never)]
pub fn remaining() -> Option<usize> {
    let here = 0u8;
    let sp = std::hint::black_box(&here) as *const u8 as usize;
    stack_low().map(|low| sp.saturating_sub(low))
}

/// Refuses a call into SQLite when less than [`SQL_STACK_BYTES_MIN`] of
/// native stack is left. A thread whose stack cannot be measured is let
/// through (the runtime's threads can always be).
pub fn check() -> Result<(), StoreError> {
    if rule_dropped() {
        return Ok(());
    }
    check_against(SQL_STACK_BYTES_MIN)
}

/// The unsafe variant, for the test that shows the attack aborts a node
/// without the rule: no check, and (the runtime asks [`rule_dropped`])
/// workers on Rust's default 2 MiB stacks. Only a `test-faults` build has
/// it.
#[cfg(feature = "test-faults")]
static UNSAFE_NO_STACK_RULE: AtomicBool = AtomicBool::new(false);

/// Drops the stack rule for the whole process (the unsafe variant).
#[cfg(feature = "test-faults")]
pub fn unsafe_drop_stack_rule() {
    UNSAFE_NO_STACK_RULE.store(true, Ordering::Relaxed);
}

/// Whether the unsafe variant is on (never, but in a `test-faults` build
/// that asked for it).
pub fn rule_dropped() -> bool {
    #[cfg(feature = "test-faults")]
    if UNSAFE_NO_STACK_RULE.load(Ordering::Relaxed) {
        return true;
    }
    false
}

/// [`check`] with another minimum (tests).
pub fn check_against(min: usize) -> Result<(), StoreError> {
    match remaining() {
        Some(left) if left < min => Err(StoreError::StackExhausted { left, needed: min }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Uses about `kib` KiB of stack, then reports what was left there.
    #[inline(never)]
    fn deep(kib: usize) -> usize {
        let frame = std::hint::black_box([0u8; 1024]);
        if kib == 0 {
            return remaining().unwrap() + frame[0] as usize;
        }
        deep(kib - 1) + frame[1] as usize
    }

    #[test]
    fn the_stack_left_shrinks_as_frames_are_added_and_the_check_refuses_below_the_minimum() {
        std::thread::Builder::new()
            .stack_size(4 << 20)
            .spawn(|| {
                let top = remaining().expect("linux threads report their stack");
                assert!(top > 3 << 20 && top <= 4 << 20, "{top}");
                let lower = deep(512);
                assert!(
                    top - lower >= 512 * 1024,
                    "512 frames of 1 KiB used {}",
                    top - lower
                );
                assert!(check_against(1 << 20).is_ok());
                match check_against(8 << 20) {
                    Err(StoreError::StackExhausted { left, needed }) => {
                        assert_eq!(needed, 8 << 20);
                        assert!(left < 4 << 20);
                    }
                    other => panic!("a 4 MiB thread passed an 8 MiB check: {other:?}"),
                }
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
