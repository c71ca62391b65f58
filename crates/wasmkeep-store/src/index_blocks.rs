//! Memory for actors' write-ahead-log indexes: blocks of 32 KiB, kept
//! populated and reused from one open actor to the next (ADR 0078).
//!
//! Mapping a block for each open and unmapping it at each close cost the
//! 20,000-alarm burst about a tenth of the machine: on a multi-core host
//! every `munmap`, every `madvise(MADV_DONTNEED)` and every first write to a
//! page that was read while empty (the kernel's shared zero page, replaced
//! by a page of its own) interrupts every core running the node to flush
//! its address translations. A block taken here was populated when it was
//! mapped (each page written once, before anything reads it), and a block
//! an actor closes is zeroed and kept for the next open, up to
//! [`SPARE_BLOCKS_MAX`]: an actor that opens, runs one event and closes
//! makes no system call and takes no fault for its index.
//!
//! The rule that makes reuse safe: **a block is all zeros when it is handed
//! out**, as a fresh mapping is. SQLite trusts an index whose header checks
//! out, and a header left by another actor's log would make it read this
//! actor's log at that actor's frames (the test
//! `a_reused_block_that_was_not_zeroed_serves_another_actors_index` shows it
//! with the unsafe variant). A block some of whose pages were given back to
//! the kernel ([`crate::wal_index::WalIndex::release_zero_pages`], ADR 0028)
//! is not kept: zeroing it would take the faults this module avoids.

/// The size of a block SQLite asks for (`WALINDEX_PGSZ`); other sizes are
/// mapped and unmapped each time.
pub(crate) const BLOCK_BYTES: usize = 32 * 1024;

/// Blocks kept for reuse at most: 8 MiB. A burst of closes past it unmaps
/// the rest; the reaper unmaps them all once a pass went by without an
/// open taking one ([`trim_unused`]).
pub(crate) const SPARE_BLOCKS_MAX: usize = 256;

#[derive(Default)]
struct Spares {
    /// Addresses of zeroed, populated blocks of [`BLOCK_BYTES`].
    blocks: Vec<usize>,
    /// Whether an open took a block since the last [`trim_unused`].
    taken: bool,
}

impl Drop for Spares {
    fn drop(&mut self) {
        unmap_kept(&self.blocks);
    }
}

/// Unmaps kept blocks, which nothing else refers to.
fn unmap_kept(blocks: &[usize]) {
    for &p in blocks {
        // SAFETY: a kept block of `BLOCK_BYTES`, owned by the spares alone
        // until now.
        unsafe { libc::munmap(p as *mut libc::c_void, BLOCK_BYTES) };
    }
}

#[cfg(not(test))]
static SPARES: std::sync::Mutex<Spares> = std::sync::Mutex::new(Spares {
    blocks: Vec::new(),
    taken: false,
});

/// The spares, process-wide. Tests keep one set per thread, so that the
/// unsafe variant's unzeroed blocks reach no other test.
fn with_spares<R>(f: impl FnOnce(&mut Spares) -> R) -> R {
    #[cfg(not(test))]
    {
        f(&mut SPARES.lock().unwrap_or_else(|p| p.into_inner()))
    }
    #[cfg(test)]
    {
        thread_local! {
            static SPARES: std::cell::RefCell<Spares> = std::cell::RefCell::default();
        }
        SPARES.with(|s| f(&mut s.borrow_mut()))
    }
}

/// A block of `bytes` zeros, private to this process, readable and
/// writable: a kept one if `bytes` is [`BLOCK_BYTES`] and one is kept, else
/// a new mapping. `None` if the system has no memory to map.
pub(crate) fn take(bytes: usize) -> Option<*mut u8> {
    if bytes == BLOCK_BYTES
        && let Some(p) = with_spares(|s| {
            s.taken = true;
            s.blocks.pop()
        })
    {
        return Some(p as *mut u8);
    }
    map(bytes)
}

/// Returns a block [`take`] gave. `whole` says that none of its pages
/// was given back to the kernel since: only then is it zeroed and kept
/// (while there is room); else it is unmapped.
///
/// # Safety
/// `p` came from [`take`] with the same `bytes`, and nothing uses it after
/// this call.
pub(crate) unsafe fn give_back(p: *mut u8, bytes: usize, whole: bool) {
    if whole && bytes == BLOCK_BYTES && with_spares(|s| s.blocks.len() < SPARE_BLOCKS_MAX) {
        #[cfg(test)]
        let zero = !tests::KEEP_CONTENTS_UNSAFE.get();
        #[cfg(not(test))]
        let zero = true;
        if zero {
            // SAFETY: the caller's block of `bytes`, every page of it
            // present and writable: no fault, no flush.
            unsafe { std::ptr::write_bytes(p, 0, bytes) };
        }
        let kept = with_spares(|s| {
            let room = s.blocks.len() < SPARE_BLOCKS_MAX;
            if room {
                s.blocks.push(p as usize);
            }
            room
        });
        if kept {
            return;
        }
    }
    // SAFETY: the caller's mapping of `bytes`, used by nothing else.
    unsafe { libc::munmap(p.cast(), bytes) };
}

/// Unmaps the kept blocks if no open took one since the last call: the
/// reaper calls this each pass, so that an idle node holds none (with
/// several nodes in one process, each node's reaper calls it).
pub(crate) fn trim_unused() -> usize {
    let blocks = with_spares(|s| {
        let taken = std::mem::replace(&mut s.taken, false);
        if taken {
            Vec::new()
        } else {
            std::mem::take(&mut s.blocks)
        }
    });
    unmap_kept(&blocks);
    blocks.len()
}

/// How many blocks are kept now.
#[cfg(test)]
pub(crate) fn kept() -> usize {
    with_spares(|s| s.blocks.len())
}

/// A new private mapping of `bytes` zeros with every page present and
/// writable.
fn map(bytes: usize) -> Option<*mut u8> {
    // SAFETY: a new anonymous mapping; nothing else refers to it.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return None;
        }
        // Neighbouring blocks merge into one mapping, which transparent
        // huge pages (where on for all memory) could back with 2 MiB pages.
        libc::madvise(p, bytes, libc::MADV_NOHUGEPAGE);
        // A write first: a read would map the shared zero page, and the
        // write after it would replace it, interrupting every core.
        let page = crate::wal_index::os_page_bytes();
        let p = p.cast::<u8>();
        let mut off = 0;
        while off < bytes {
            std::ptr::write_volatile(p.add(off), 0);
            off += page;
        }
        Some(p)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    thread_local! {
        /// The unsafe variant: blocks are kept with what the last actor
        /// wrote in them.
        pub(crate) static KEEP_CONTENTS_UNSAFE: std::cell::Cell<bool> =
            const { std::cell::Cell::new(false) };
    }

    #[test]
    fn a_kept_block_is_handed_out_again_zeroed() {
        let p = take(BLOCK_BYTES).unwrap();
        // SAFETY: a block of BLOCK_BYTES from `take`.
        unsafe {
            std::ptr::write_bytes(p, 7, BLOCK_BYTES);
            give_back(p, BLOCK_BYTES, true);
        }
        assert_eq!(kept(), 1);
        let q = take(BLOCK_BYTES).unwrap();
        assert_eq!(q, p, "the kept block is reused");
        // SAFETY: as above.
        let bytes = unsafe { std::slice::from_raw_parts(q, BLOCK_BYTES) };
        assert!(bytes.iter().all(|&b| b == 0));
        // SAFETY: as above.
        unsafe { give_back(q, BLOCK_BYTES, true) };
    }

    #[test]
    fn a_block_with_pages_given_back_and_blocks_past_the_bound_are_unmapped() {
        let p = take(BLOCK_BYTES).unwrap();
        // SAFETY: a block of BLOCK_BYTES from `take`.
        unsafe { give_back(p, BLOCK_BYTES, false) };
        assert_eq!(kept(), 0);
        let blocks: Vec<_> = (0..SPARE_BLOCKS_MAX + 3)
            .map(|_| take(BLOCK_BYTES).unwrap())
            .collect();
        for p in blocks {
            // SAFETY: as above.
            unsafe { give_back(p, BLOCK_BYTES, true) };
        }
        assert_eq!(kept(), SPARE_BLOCKS_MAX);
        // A pass in which an open took one keeps them; the next does not.
        assert_eq!(trim_unused(), 0);
        assert_eq!(trim_unused(), SPARE_BLOCKS_MAX);
        assert_eq!(kept(), 0);
    }
}
