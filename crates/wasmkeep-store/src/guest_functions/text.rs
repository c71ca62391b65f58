//! `instr`, `replace`, `trim`/`ltrim`/`rtrim` and `unhex` in linear time,
//! with the built-ins' results.

use std::collections::HashMap;
use std::ffi::c_int;
use std::hash::{BuildHasher, RandomState};

use rusqlite::ffi;

use super::{Out, arg, blob, guarded, is_continuation, length_limit, result_text_copy, text};
use crate::memory_budget::Charge;

/// `trim`'s user data: which ends it trims (SQLite's own encoding).
pub(super) const TRIM_LEFT: usize = 1;
pub(super) const TRIM_RIGHT: usize = 2;
pub(super) const TRIM_BOTH: usize = 3;

// ---- instr ----

/// `instr(X, Y)`: one more than the number of characters (bytes, when both
/// are blobs) in X before the first Y; 0 if there is none; 1 if Y is empty.
pub(super) unsafe extern "C" fn instr(
    ctx: *mut ffi::sqlite3_context,
    _argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: registered with two arguments; every value is used only in
    // this call; `ctx` is this call's.
    unsafe {
        guarded(ctx, || {
            let (x, y) = (arg(argv, 0), arg(argv, 1));
            let (tx, ty) = (ffi::sqlite3_value_type(x), ffi::sqlite3_value_type(y));
            if tx == ffi::SQLITE_NULL || ty == ffi::SQLITE_NULL {
                return;
            }
            // As SQLite does: the sizes (of a number, as text) decide whether
            // the needle is empty before either value is read.
            ffi::sqlite3_value_bytes(x);
            if ffi::sqlite3_value_bytes(y) <= 0 {
                ffi::sqlite3_result_int(ctx, 1);
                return;
            }
            let blobs = tx == ffi::SQLITE_BLOB && ty == ffi::SQLITE_BLOB;
            let mixed = !blobs && (tx == ffi::SQLITE_BLOB || ty == ffi::SQLITE_BLOB);
            let position = if blobs {
                match (blob(x), blob(y)) {
                    (Some(h), Some(n)) => Some(instr_position(h, n, false)),
                    _ => None,
                }
            } else if mixed {
                // SQLite reads copies as text, leaving the blob argument a blob.
                let (cx, cy) = (ffi::sqlite3_value_dup(x), ffi::sqlite3_value_dup(y));
                let p = match (text(cx), text(cy)) {
                    (Some(h), Some(n)) => Some(instr_position(h, n, true)),
                    _ => None,
                };
                ffi::sqlite3_value_free(cx);
                ffi::sqlite3_value_free(cy);
                p
            } else {
                match (text(x), text(y)) {
                    (Some(h), Some(n)) => Some(instr_position(h, n, true)),
                    _ => None,
                }
            };
            match position {
                Some(n) => ffi::sqlite3_result_int64(ctx, n as i64),
                None => ffi::sqlite3_result_error_nomem(ctx),
            }
        });
    }
}

/// Where SQLite's `instr` finds `needle` (not empty) in `hay`: 1-based,
/// counting bytes, or for text the positions SQLite steps through (the
/// first byte, then each byte that is not a UTF-8 continuation byte).
fn instr_position(hay: &[u8], needle: &[u8], is_text: bool) -> usize {
    debug_assert!(!needle.is_empty());
    if !is_text {
        return memchr::memmem::find(hay, needle).map_or(0, |p| p + 1);
    }
    if is_continuation(needle[0]) {
        // SQLite only ever stops on the first byte and on bytes that are
        // not continuation bytes: such a needle can only match at 0.
        return usize::from(hay.starts_with(needle));
    }
    // Every other byte the needle can start at is one SQLite stops on.
    match memchr::memmem::find(hay, needle) {
        None => 0,
        Some(0) => 1,
        Some(p) => 2 + hay[1..p].iter().filter(|&&b| !is_continuation(b)).count(),
    }
}

// ---- replace ----

/// `replace(X, Y, Z)`: X as text with every occurrence of Y (leftmost
/// first, not overlapping) replaced by Z; X unchanged if Y is empty or
/// starts with a zero byte.
pub(super) unsafe extern "C" fn replace(
    ctx: *mut ffi::sqlite3_context,
    _argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: registered with three arguments; values and `ctx` are this
    // call's.
    unsafe {
        guarded(ctx, || {
            let Some(s) = text(arg(argv, 0)) else { return };
            let Some(pattern) = text(arg(argv, 1)) else {
                return;
            };
            if pattern.first().is_none_or(|&b| b == 0) {
                result_text_copy(ctx, s);
                return;
            }
            let Some(rep) = text(arg(argv, 2)) else {
                return;
            };
            let limit = length_limit(ctx);
            // SQLite allocates the text's length and a terminating zero first,
            // which is too big for a text of exactly the limit's length.
            if s.len() + 1 > limit {
                ffi::sqlite3_result_error_toobig(ctx);
                return;
            }
            let finder = memchr::memmem::Finder::new(pattern);
            let count = finder.find_iter(s).count();
            let len = s.len() - count * pattern.len() + count * rep.len();
            if rep.len() > pattern.len() && len > limit {
                ffi::sqlite3_result_error_toobig(ctx);
                return;
            }
            let Some(mut out) = Out::new(len) else {
                ffi::sqlite3_result_error_nomem(ctx);
                return;
            };
            let buf = out.bytes();
            let (mut from, mut to) = (0, 0);
            for at in finder.find_iter(s) {
                buf[to..to + at - from].copy_from_slice(&s[from..at]);
                to += at - from;
                buf[to..to + rep.len()].copy_from_slice(rep);
                to += rep.len();
                from = at + pattern.len();
            }
            buf[to..to + s.len() - from].copy_from_slice(&s[from..]);
            to += s.len() - from;
            debug_assert_eq!(to, len);
            out.into_text(ctx, len);
        });
    }
}

// ---- trim, ltrim, rtrim ----

/// `trim(X, Y)` and its one-sided forms: X as text without the characters
/// of Y at its ends.
pub(super) unsafe extern "C" fn trim(
    ctx: *mut ffi::sqlite3_context,
    _argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: registered with two arguments; values and `ctx` are this
    // call's; the user data is one of the TRIM_* integers.
    unsafe {
        guarded(ctx, || {
            let x = arg(argv, 0);
            if ffi::sqlite3_value_type(x) == ffi::SQLITE_NULL {
                return;
            }
            let Some(s) = text(x) else { return };
            let Some(set) = text(arg(argv, 1)) else {
                return;
            };
            // SQLite reads the set as a C string: up to its first zero byte.
            let set = &set[..memchr::memchr(0, set).unwrap_or(set.len())];
            let flags = ffi::sqlite3_user_data(ctx) as usize;
            // SQLite allocates a pointer and a length for each character of
            // the set, and fails as too big where those pass the length limit.
            let chars = split_set(set).count();
            if chars * (size_of::<*const u8>() + size_of::<u32>()) > length_limit(ctx) {
                ffi::sqlite3_result_error_toobig(ctx);
                return;
            }
            let (start, end) = if set.is_empty() {
                (0, s.len())
            } else {
                let Some(set) = TrimSet::new(set) else {
                    ffi::sqlite3_result_error_nomem(ctx);
                    return;
                };
                let start = if flags & TRIM_LEFT != 0 {
                    set.trim_left(s)
                } else {
                    0
                };
                let end = if flags & TRIM_RIGHT != 0 {
                    set.trim_right(s, start)
                } else {
                    s.len()
                };
                (start, end)
            };
            result_text_copy(ctx, &s[start..end]);
        });
    }
}

/// A Mersenne prime: polynomial hashes of byte strings are taken modulo it.
const HASH_MOD: u64 = (1 << 61) - 1;

fn mul_mod(a: u64, b: u64) -> u64 {
    ((a as u128 * b as u128) % HASH_MOD as u128) as u64
}

fn pow_mod(mut a: u64, mut e: u64) -> u64 {
    let mut r = 1;
    while e > 0 {
        if e & 1 == 1 {
            r = mul_mod(r, a);
        }
        a = mul_mod(a, a);
        e >>= 1;
    }
    r
}

/// No character of the set: the position of a character that is present.
const ABSENT: u32 = u32::MAX;

/// Bytes a slot of [`TrimSet::multi`]'s capacity is charged at (an entry
/// is 24 bytes and a control byte, with an eighth of the slots kept free).
const TRIM_SLOT_BYTES: usize = 32;

/// The characters of trim's set as SQLite splits them: a byte below 0xc0
/// alone, or a byte from 0xc0 up with all the continuation bytes that
/// follow it. SQLite tries the characters in the set's order and removes
/// the first that matches; where several match at one place (only possible
/// in text that is not valid UTF-8), which comes first decides, so each
/// character keeps the position of its first appearance.
///
/// Multi-byte characters are found by a polynomial hash of their bytes with
/// a random base (secret to guests, so they cannot make hashes collide),
/// which lets a run of continuation bytes in the input be tried at every
/// length in one pass. No two characters of the set share a hash (the base
/// is drawn again until that holds), so a hash that matches names the only
/// character that can match, and one comparison confirms it.
struct TrimSet<'a> {
    set: &'a [u8],
    /// Position in the set of each single-byte character, or [`ABSENT`].
    single: [u32; 0xc0],
    /// (length, hash) of each multi-byte character: its position in the
    /// set and its offset in `set`.
    multi: HashMap<(u32, u64), (u32, u32)>,
    /// The longest multi-byte character.
    multi_len_max: usize,
    base: u64,
    /// The inverse of `base` modulo [`HASH_MOD`].
    base_inv: u64,
    /// `multi`'s memory, in the statement's budget.
    charge: Charge,
}

impl<'a> TrimSet<'a> {
    /// `None` if the statement's memory budget refused the working set.
    fn new(set: &'a [u8]) -> Option<TrimSet<'a>> {
        let mut single = [ABSENT; 0xc0];
        let mut has_multi = false;
        for (i, (off, _)) in split_set(set).enumerate() {
            let b = set[off];
            if b < 0xc0 {
                let s = &mut single[b as usize];
                *s = (*s).min(i as u32);
            } else {
                has_multi = true;
            }
        }
        let mut t = TrimSet {
            set,
            single,
            multi: HashMap::new(),
            multi_len_max: 0,
            base: 0,
            base_inv: 0,
            charge: Charge::new(0)?,
        };
        if !has_multi {
            return Some(t);
        }
        let seeds = RandomState::new();
        for attempt in 0u64.. {
            t.base = 256 + seeds.hash_one(attempt) % (HASH_MOD - 512);
            t.base_inv = pow_mod(t.base, HASH_MOD - 2);
            if t.index_multi()? {
                break;
            }
        }
        Some(t)
    }

    /// Fills `multi` for the current base: `Some(false)` if two different
    /// characters of the set share a hash, `None` if the statement's
    /// memory budget refused the map's growth.
    fn index_multi(&mut self) -> Option<bool> {
        self.multi.clear();
        self.multi_len_max = 0;
        for (i, (off, len)) in split_set(self.set).enumerate() {
            if self.set[off] < 0xc0 {
                continue;
            }
            let key = (len as u32, self.hash(&self.set[off..off + len]));
            let full = self.multi.len() == self.multi.capacity();
            let grown = self.multi.capacity().max(4) * 2 * TRIM_SLOT_BYTES;
            match self.multi.entry(key) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    // Counted before the map doubles.
                    if full && !self.charge.grow_to(grown) {
                        return None;
                    }
                    v.insert((i as u32, off as u32));
                }
                std::collections::hash_map::Entry::Occupied(o) => {
                    let (_, other) = *o.get();
                    let other = other as usize;
                    if self.set[other..other + len] != self.set[off..off + len] {
                        return Some(false);
                    }
                }
            }
            self.multi_len_max = self.multi_len_max.max(len);
        }
        Some(true)
    }

    fn step(&self, h: u64, b: u8) -> u64 {
        (mul_mod(h, self.base) + b as u64 + 1) % HASH_MOD
    }

    /// The hash of `bytes` less its last byte `last`, from the hash of
    /// `bytes`.
    fn unstep(&self, h: u64, last: u8) -> u64 {
        mul_mod((h + HASH_MOD - (last as u64 + 1)) % HASH_MOD, self.base_inv)
    }

    fn hash(&self, bytes: &[u8]) -> u64 {
        bytes.iter().fold(0, |h, &b| self.step(h, b))
    }

    /// The multi-byte character `bytes` is, if it is one of the set's: its
    /// position in the set.
    fn multi_position(&self, bytes: &[u8], h: u64) -> Option<u32> {
        let &(i, off) = self.multi.get(&(bytes.len() as u32, h))?;
        let off = off as usize;
        (self.set[off..off + bytes.len()] == *bytes).then_some(i)
    }

    /// How many bytes trimming the start of `s` removes.
    fn trim_left(&self, s: &[u8]) -> usize {
        let mut p = 0;
        while p < s.len() {
            let b = s[p];
            let len = if b < 0xc0 {
                (self.single[b as usize] != ABSENT).then_some(1)
            } else {
                self.first_multi_prefix(&s[p..])
            };
            match len {
                Some(len) => p += len,
                None => break,
            }
        }
        p
    }

    /// Of the set's multi-byte characters that `s` starts with, the length
    /// of the one that comes first in the set.
    fn first_multi_prefix(&self, s: &[u8]) -> Option<usize> {
        // Candidates: the lead byte and 0 or more continuation bytes.
        let mut best: Option<(u32, usize, usize)> = None;
        let mut h = 0;
        for len in 1..=s.len().min(self.multi_len_max) {
            let b = s[len - 1];
            if len > 1 && !is_continuation(b) {
                break;
            }
            h = self.step(h, b);
            if let Some(&(i, off)) = self.multi.get(&(len as u32, h))
                && best.is_none_or(|(j, _, _)| i < j)
            {
                best = Some((i, len, off as usize));
            }
        }
        let (_, len, off) = best?;
        if self.set[off..off + len] == s[..len] {
            return Some(len);
        }
        // The hash of a prefix of `s` met a different character's: unheard
        // of with a secret base, and still answered exactly, by checking
        // every length.
        let mut best: Option<(u32, usize)> = None;
        let mut h = 0;
        for len in 1..=s.len().min(self.multi_len_max) {
            if len > 1 && !is_continuation(s[len - 1]) {
                break;
            }
            h = self.step(h, s[len - 1]);
            if let Some(i) = self.multi_position(&s[..len], h)
                && best.is_none_or(|(j, _)| i < j)
            {
                best = Some((i, len));
            }
        }
        best.map(|(_, len)| len)
    }

    /// Where the text ends once its end is trimmed, not before `start`.
    ///
    /// From the end, the candidates are the last byte alone (if below
    /// 0xc0) and the multi-byte character that ends there: the last byte
    /// that is not a continuation byte, if it is 0xc0 or above, with what
    /// follows it. The loop takes the ends run by run (a run: such a byte
    /// and the continuation bytes after it), finding each run's start once
    /// and updating the hash of the run's remaining bytes as bytes leave
    /// its end.
    fn trim_right(&self, s: &[u8], start: usize) -> usize {
        let mut e = s.len();
        while e > start {
            let run = (start..e).rev().find(|&i| !is_continuation(s[i]));
            let lead = run.filter(|&q| s[q] >= 0xc0);
            let floor = run.unwrap_or(start);
            // The hash of s[lead..e], once that is short enough to be one
            // of the set's characters.
            let mut h: Option<u64> = None;
            while e > floor {
                let b = s[e - 1];
                let single = if b < 0xc0 {
                    self.single[b as usize]
                } else {
                    ABSENT
                };
                if let Some(q) = lead {
                    let len = e - q;
                    if h.is_none() && len <= self.multi_len_max {
                        h = Some(self.hash(&s[q..e]));
                    }
                    if let Some(h) = h
                        && let Some(i) = self.multi_position_if_before(&s[q..e], h, single)
                    {
                        debug_assert!(i < single);
                        e = q;
                        break;
                    }
                }
                if single == ABSENT {
                    return e;
                }
                if let Some(hv) = h {
                    h = Some(self.unstep(hv, b));
                }
                e -= 1;
            }
        }
        e
    }

    /// [`TrimSet::multi_position`], compared only if it could come before
    /// position `before` (no comparison is made otherwise: the map's entry
    /// for this hash is the only character that could match).
    fn multi_position_if_before(&self, bytes: &[u8], h: u64, before: u32) -> Option<u32> {
        let &(i, _) = self.multi.get(&(bytes.len() as u32, h))?;
        if i >= before {
            return None;
        }
        self.multi_position(bytes, h)
    }
}

/// The characters of trim's set as SQLite's `SQLITE_SKIP_UTF8` steps
/// through them: (offset, length).
fn split_set(set: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut p = 0;
    std::iter::from_fn(move || {
        if p >= set.len() {
            return None;
        }
        let start = p;
        p += 1;
        if set[start] >= 0xc0 {
            while p < set.len() && is_continuation(set[p]) {
                p += 1;
            }
        }
        Some((start, p - start))
    })
}

// ---- unhex ----

/// `unhex(X, Y)`: the blob X's hexadecimal digits spell, where characters
/// of Y may stand between (not inside) pairs of digits; NULL if anything
/// else stands in X. X is read up to its first zero byte.
pub(super) unsafe extern "C" fn unhex(
    ctx: *mut ffi::sqlite3_context,
    _argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: registered with two arguments; values and `ctx` are this
    // call's.
    unsafe {
        guarded(ctx, || {
            let hex = text(arg(argv, 0));
            let pass = text(arg(argv, 1));
            let (Some(hex), Some(pass)) = (hex, pass) else {
                return;
            };
            let Some(pass) = CharSet::new(pass) else {
                ffi::sqlite3_result_error_nomem(ctx);
                return;
            };
            let Some(mut out) = Out::new(hex.len() / 2) else {
                ffi::sqlite3_result_error_nomem(ctx);
                return;
            };
            match unhex_into(hex, &pass, out.bytes()) {
                Some(len) => out.into_blob(ctx, len),
                None => ffi::sqlite3_result_null(ctx),
            }
        });
    }
}

/// Decodes `hex` into `out` as SQLite's `unhex` does; the length written,
/// or `None` where SQLite returns NULL.
fn unhex_into(hex: &[u8], pass: &CharSet, out: &mut [u8]) -> Option<usize> {
    // The text as SQLite reads it: a zero byte ends it (and follows it).
    let at = |i: usize| hex.get(i).copied().unwrap_or(0);
    let (mut i, mut n) = (0, 0);
    loop {
        let mut c = at(i);
        if c == 0 {
            return Some(n);
        }
        while !c.is_ascii_hexdigit() {
            let ch = utf8_read(hex, &mut i);
            if !pass.contains(ch) {
                return None;
            }
            c = at(i);
            if c == 0 {
                return Some(n);
            }
        }
        let d = at(i + 1);
        i += 2;
        if !d.is_ascii_hexdigit() {
            return None;
        }
        out[n] = (hex_value(c) << 4) | hex_value(d);
        n += 1;
    }
}

fn hex_value(h: u8) -> u8 {
    // SQLite's sqlite3HexToInt.
    (h + 9 * (1 & (h >> 6))) & 0xf
}

/// SQLite's `sqlite3Utf8Trans1`: the payload bits of a lead byte.
const UTF8_TRANS1: [u8; 64] = [
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f,
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x00, 0x01, 0x02, 0x03, 0x00, 0x01, 0x00, 0x00,
];

/// One character of `s` from `*i`, as SQLite's `sqlite3Utf8Read` reads it
/// (a zero byte follows the end); advances `*i`. Invalid sequences read
/// as SQLite reads them, which is what makes the sets agree.
fn utf8_read(s: &[u8], i: &mut usize) -> u32 {
    let at = |k: usize| s.get(k).copied().unwrap_or(0);
    let first = at(*i);
    *i += 1;
    if first < 0xc0 {
        return first as u32;
    }
    let mut c = UTF8_TRANS1[(first - 0xc0) as usize] as u32;
    while is_continuation(at(*i)) {
        c = (c << 6) | (at(*i) & 0x3f) as u32;
        *i += 1;
    }
    if c < 0x80 || (c & 0xFFFF_F800) == 0xD800 {
        c = 0xFFFD;
    }
    c
}

/// The characters of `unhex`'s second argument, decoded as SQLite decodes
/// them, for lookups in constant time.
struct CharSet {
    ascii: u128,
    /// Characters below 0x110000, one bit each (allocated only if the
    /// argument has any that is not ASCII).
    bits: Vec<u64>,
    /// The others (only invalid UTF-8 decodes to them), sorted.
    other: Vec<u32>,
    _charge: Option<Charge>,
}

const CHARSET_BITS: usize = 0x110000;

impl CharSet {
    /// `None` if the statement's memory budget refused the working set.
    fn new(s: &[u8]) -> Option<CharSet> {
        let mut set = CharSet {
            ascii: 0,
            bits: Vec::new(),
            other: Vec::new(),
            _charge: None,
        };
        // SQLite walks all of the argument's bytes, past zero bytes too.
        let mut i = 0;
        while i < s.len() {
            let c = utf8_read(s, &mut i);
            if c < 0x80 {
                set.ascii |= 1 << c;
                continue;
            }
            if set._charge.is_none() {
                // The bit set, and at most one u32 per byte left.
                set._charge = Some(Charge::new(CHARSET_BITS / 8 + 4 * (s.len() - i))?);
                set.bits = vec![0; CHARSET_BITS / 64];
            }
            if (c as usize) < CHARSET_BITS {
                set.bits[c as usize / 64] |= 1 << (c % 64);
            } else {
                set.other.push(c);
            }
        }
        set.other.sort_unstable();
        Some(set)
    }

    fn contains(&self, c: u32) -> bool {
        if c < 0x80 {
            self.ascii & (1 << c) != 0
        } else if (c as usize) < CHARSET_BITS {
            self.bits
                .get(c as usize / 64)
                .is_some_and(|w| w & (1 << (c % 64)) != 0)
        } else {
            self.other.binary_search(&c).is_ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trim_both(s: &[u8], set: &[u8]) -> (usize, usize) {
        let t = TrimSet::new(set).unwrap();
        let start = t.trim_left(s);
        (start, t.trim_right(s, start))
    }

    #[test]
    fn instr_counts_characters_in_text_and_bytes_in_blobs() {
        assert_eq!(instr_position("héllo".as_bytes(), b"l", true), 3);
        assert_eq!(instr_position("héllo".as_bytes(), b"l", false), 4);
        assert_eq!(instr_position(b"abc", b"abcd", true), 0);
        assert_eq!(instr_position(b"\x80abc", b"\x80a", true), 1);
        assert_eq!(instr_position(b"a\x80abc", b"\x80a", true), 0);
    }

    #[test]
    fn trim_takes_the_first_character_of_the_set_that_matches() {
        // Valid UTF-8.
        assert_eq!(trim_both("ééaé".as_bytes(), "é".as_bytes()), (4, 5));
        // Invalid: both "\xc3" followed by one continuation byte and "\xc3"
        // followed by two are characters; the earlier one in the set wins.
        let s = b"\xc3\x80\x80x";
        assert_eq!(trim_both(s, b"\xc3\x80a\xc3\x80\x80").0, 2);
        assert_eq!(trim_both(s, b"\xc3\x80\x80a\xc3\x80").0, 3);
        // From the end: the lone continuation byte first, then the rest.
        let s = b"x\xc3\x80\x80";
        assert_eq!(trim_both(s, b"a\x80\xc3").1, 1);
        assert_eq!(trim_both(s, b"\xc3\x80\x80a\x80").1, 1);
        assert_eq!(trim_both(s, b"a\x80").1, 2);
    }

    #[test]
    fn unhex_reads_until_a_zero_byte_and_passes_only_listed_characters() {
        let set = CharSet::new("- é".as_bytes()).unwrap();
        let mut out = [0u8; 16];
        assert_eq!(unhex_into(b"41-42 43", &set, &mut out), Some(3));
        assert_eq!(&out[..3], b"ABC");
        assert_eq!(unhex_into("41é42\0zz".as_bytes(), &set, &mut out), Some(2));
        assert_eq!(unhex_into(b"4-1", &set, &mut out), None);
        assert_eq!(unhex_into(b"41+", &set, &mut out), None);
    }
}
