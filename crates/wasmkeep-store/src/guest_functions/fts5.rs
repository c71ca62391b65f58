//! FTS5's `highlight()` and `snippet()`, with FTS5's results, in time that
//! grows with the document rather than with its square.
//!
//! FTS5's own build their result by printing the whole result so far again
//! at every piece they add (`sqlite3_mprintf("%z%.*s")`), and `snippet()`
//! scores each match by looking at every match of the row, and finds its
//! sentence by walking back through every sentence start and every space
//! before it. On a 2 MiB document full of matches one call of `highlight()`
//! ran for over a minute and one of `snippet()` for about an hour (ADR
//! 0032). These follow FTS5's code step by step, through the same extension
//! API, with three changes: the result grows in place; a snippet window's
//! score comes from counts kept as the window moves forward over the row's
//! matches, which FTS5 orders by column and offset (where they would not be
//! ordered, FTS5's scan of them all is used); a sentence start is found by
//! a binary search, and the character before a token by a cursor that
//! moves forward with the tokens.
//!
//! An actor's connection registers them with FTS5 under the built-ins'
//! names (a function registered later is found first), so a guest's
//! `highlight(t, ...)` and `snippet(t, ...)` run these.

use std::ffi::{c_char, c_int, c_void};

use rusqlite::ffi;

use super::guarded;
use crate::memory_budget::Charge;

const OK: c_int = ffi::SQLITE_OK;

/// Registers `highlight` and `snippet` with the connection's FTS5, and
/// bounds the terms of its queries (`fts5_query`).
///
/// SAFETY (caller): `db` is an open connection used on this thread, with
/// no authorizer that would refuse `fts5()` yet.
pub(super) unsafe fn install(db: *mut ffi::sqlite3) -> c_int {
    // SAFETY: as the caller promises; `fts5(?1)` writes FTS5's API pointer
    // through the bound pointer, which lives for the statement's run.
    unsafe {
        let mut api: *mut ffi::fts5_api = std::ptr::null_mut();
        let mut stmt = std::ptr::null_mut();
        let rc = ffi::sqlite3_prepare_v2(
            db,
            c"SELECT fts5(?1)".as_ptr(),
            -1,
            &mut stmt,
            std::ptr::null_mut(),
        );
        if rc != OK {
            return rc;
        }
        ffi::sqlite3_bind_pointer(
            stmt,
            1,
            (&raw mut api).cast(),
            c"fts5_api_ptr".as_ptr(),
            None,
        );
        ffi::sqlite3_step(stmt);
        ffi::sqlite3_finalize(stmt);
        let Some(create) = api.as_ref().and_then(|a| a.xCreateFunction) else {
            return ffi::SQLITE_ERROR;
        };
        let rc = create(
            api,
            c"highlight".as_ptr(),
            std::ptr::null_mut(),
            Some(highlight),
            None,
        );
        if rc != OK {
            return rc;
        }
        let rc = create(
            api,
            c"snippet".as_ptr(),
            std::ptr::null_mut(),
            Some(snippet),
            None,
        );
        if rc != OK {
            return rc;
        }
        // The connection has just opened: no FTS5 table has loaded a
        // tokenizer yet.
        super::fts5_query::install(api)
    }
}

/// The extension API FTS5 hands an auxiliary function, for one row.
///
/// Invariant: made only from the pointers FTS5 passes to a running call of
/// `highlight` or `snippet`, and used only during that call; this is what
/// makes its methods' calls into FTS5 sound.
#[derive(Clone, Copy)]
struct Fts {
    api: *const ffi::Fts5ExtensionApi,
    fts: *mut ffi::Fts5Context,
}

/// Calls the API's member `$m`; `SQLITE_ERROR` if this FTS5 lacks it.
macro_rules! call {
    ($f:expr, $m:ident $(, $a:expr)*) => {
        // SAFETY (of every use): `api` is the live API FTS5 passed to the
        // running call, `fts` its context; the arguments are valid for the
        // member's contract.
        match unsafe { (*$f.api).$m } {
            Some(m) => unsafe { m($f.fts $(, $a)*) },
            None => ffi::SQLITE_ERROR,
        }
    };
}

impl Fts {
    fn column_count(self) -> c_int {
        call!(self, xColumnCount)
    }

    fn phrase_count(self) -> c_int {
        call!(self, xPhraseCount)
    }

    fn inst_count(self) -> (c_int, c_int) {
        let mut n = 0;
        let rc = call!(self, xInstCount, &mut n);
        (rc, n)
    }

    /// (phrase, column, offset) of match `i`.
    fn inst(self, i: c_int) -> Result<(c_int, c_int, c_int), c_int> {
        let (mut p, mut c, mut o) = (0, 0, 0);
        match call!(self, xInst, i, &mut p, &mut c, &mut o) {
            OK => Ok((p, c, o)),
            rc => Err(rc),
        }
    }

    fn phrase_size(self, p: c_int) -> c_int {
        call!(self, xPhraseSize, p)
    }

    /// A column's text: (rc, pointer, length); the pointer may be null.
    fn column_text(self, col: c_int) -> (c_int, *const c_char, c_int) {
        let (mut z, mut n) = (std::ptr::null(), 0);
        let rc = call!(self, xColumnText, col, &mut z, &mut n);
        (rc, z, n)
    }

    fn column_size(self, col: c_int) -> (c_int, c_int) {
        let mut n = 0;
        let rc = call!(self, xColumnSize, col, &mut n);
        (rc, n)
    }

    /// Tokenizes `text` as column `col` is tokenized, calling `cb` with
    /// `ctx` for each token.
    fn tokenize(
        self,
        col: c_int,
        text: (*const c_char, c_int),
        ctx: *mut c_void,
        cb: TokenFn,
    ) -> c_int {
        let (mut loc, mut n_loc) = (std::ptr::null(), 0);
        let rc = call!(self, xColumnLocale, col, &mut loc, &mut n_loc);
        if rc != OK {
            return rc;
        }
        call!(
            self,
            xTokenize_v2,
            text.0,
            text.1,
            loc,
            n_loc,
            ctx,
            Some(cb)
        )
    }
}

type TokenFn =
    unsafe extern "C" fn(*mut c_void, c_int, *const c_char, c_int, c_int, c_int) -> c_int;

/// A column's text as FTS5 gave it: `len` bytes (followed by a zero byte,
/// which FTS5's printing stops at).
#[derive(Clone, Copy)]
struct Doc {
    ptr: *const u8,
    len: usize,
}

impl Doc {
    fn new(z: *const c_char, n: c_int) -> Doc {
        Doc {
            ptr: z.cast(),
            len: n.max(0) as usize,
        }
    }

    fn bytes<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() {
            return &[];
        }
        // SAFETY: FTS5's column text, valid for `len` bytes while the
        // running call runs (the caller's `'a` never outlives it).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// FTS5's `fts5HighlightAppend`: appends `n` bytes of `z` (all of it for a
/// negative `n`), stopping at a zero byte as `%.*s` does; a no-op once
/// `rc` holds an error, or for no text.
fn append(out: &mut Output, rc: &mut c_int, z: Option<&[u8]>, n: c_int) {
    if *rc != OK {
        return;
    }
    let Some(z) = z else { return };
    // Only the bytes wanted are searched for a zero byte: the document's
    // rest may be long, and its pieces are appended one by one.
    let z = if n < 0 {
        z
    } else {
        &z[..z.len().min(n as usize)]
    };
    if !out.push(&z[..memchr::memchr(0, z).unwrap_or(z.len())]) {
        *rc = ffi::SQLITE_NOMEM;
    }
}

/// A result that grows in place, its memory counted in the statement's
/// budget; `None` until something was appended (FTS5's null result).
struct Output {
    bytes: Option<Vec<u8>>,
    charge: Option<Charge>,
}

impl Output {
    fn new() -> Output {
        Output {
            bytes: None,
            charge: Charge::new(0),
        }
    }

    fn push(&mut self, s: &[u8]) -> bool {
        let b = self.bytes.get_or_insert_with(Vec::new);
        let need = b.len() + s.len();
        if need > b.capacity() {
            let cap = need.max(b.capacity() * 2).max(64);
            if !self.charge.as_mut().is_some_and(|c| c.grow_to(cap)) {
                return false;
            }
            b.reserve_exact(cap - b.len());
        }
        b.extend_from_slice(s);
        true
    }

    /// Makes the result the call's (text), or NULL if nothing was
    /// appended.
    ///
    /// SAFETY (caller): `ctx` is the running call's context.
    unsafe fn into_result(self, ctx: *mut ffi::sqlite3_context) {
        match self.bytes {
            // SAFETY: `ctx` is live (caller).
            Some(b) => unsafe { super::result_text_copy(ctx, &b) },
            None => unsafe { ffi::sqlite3_result_null(ctx) },
        }
    }
}

/// FTS5's `CInstIter`: the row's matches in one column, overlapping ones
/// merged.
struct CInstIter {
    col: c_int,
    inst: c_int,
    n_inst: c_int,
    start: c_int,
    end: c_int,
}

impl CInstIter {
    fn init(fts: Fts, col: c_int) -> (c_int, CInstIter) {
        let (rc, n_inst) = fts.inst_count();
        let mut it = CInstIter {
            col,
            inst: 0,
            n_inst,
            start: 0,
            end: 0,
        };
        if rc != OK {
            return (rc, it);
        }
        (it.next(fts), it)
    }

    fn next(&mut self, fts: Fts) -> c_int {
        self.start = -1;
        self.end = -1;
        while self.inst < self.n_inst {
            let (ip, ic, io) = match fts.inst(self.inst) {
                Ok(i) => i,
                Err(rc) => return rc,
            };
            if ic == self.col {
                let end = io.wrapping_sub(1).wrapping_add(fts.phrase_size(ip));
                if self.start < 0 {
                    self.start = io;
                    self.end = end;
                } else if io <= self.end {
                    if end > self.end {
                        self.end = end;
                    }
                } else {
                    break;
                }
            }
            self.inst += 1;
        }
        OK
    }
}

/// FTS5's `HighlightContext`.
struct Highlight<'a> {
    fts: Fts,
    range_start: c_int,
    range_end: c_int,
    open: Option<&'a [u8]>,
    close: Option<&'a [u8]>,
    doc: Doc,
    iter: CInstIter,
    pos: c_int,
    off: c_int,
    is_open: bool,
    out: Output,
}

impl<'a> Highlight<'a> {
    /// FTS5's zeroed `HighlightContext`, for column `col`.
    fn new(fts: Fts, col: c_int, open: Option<&'a [u8]>, close: Option<&'a [u8]>) -> Highlight<'a> {
        Highlight {
            fts,
            range_start: 0,
            range_end: -1,
            open,
            close,
            doc: Doc::new(std::ptr::null(), 0),
            iter: CInstIter {
                col,
                inst: 0,
                n_inst: 0,
                start: 0,
                end: 0,
            },
            pos: 0,
            off: 0,
            is_open: false,
            out: Output::new(),
        }
    }

    /// Appends the document from `off`, `n` bytes.
    fn append_doc(&mut self, rc: &mut c_int, off: c_int, n: c_int) {
        let doc = self.doc.bytes();
        let from = doc.get(off.max(0) as usize..).unwrap_or(&[]);
        append(&mut self.out, rc, Some(from), n);
    }

    fn append_open(&mut self, rc: &mut c_int) {
        append(&mut self.out, rc, self.open, -1);
    }

    fn append_close(&mut self, rc: &mut c_int) {
        append(&mut self.out, rc, self.close, -1);
    }

    /// FTS5's `fts5HighlightCb`, for one token.
    fn token(&mut self, tflags: c_int, start_off: c_int, end_off: c_int) -> c_int {
        let mut rc = OK;
        if tflags & ffi::FTS5_TOKEN_COLOCATED != 0 {
            return OK;
        }
        let pos = self.pos;
        self.pos = self.pos.wrapping_add(1);
        if self.range_end >= 0 {
            if pos < self.range_start || pos > self.range_end {
                return OK;
            }
            if self.range_start != 0 && pos == self.range_start {
                self.off = start_off;
            }
        }
        if self.is_open && (pos <= self.iter.start || self.iter.start < 0) && start_off > self.off {
            self.append_close(&mut rc);
            self.is_open = false;
        }
        if pos == self.iter.start && !self.is_open {
            self.append_doc(&mut rc, self.off, start_off.wrapping_sub(self.off));
            self.append_open(&mut rc);
            self.off = start_off;
            self.is_open = true;
        }
        if pos == self.iter.end {
            if !self.is_open {
                self.append_open(&mut rc);
                self.is_open = true;
            }
            self.append_doc(&mut rc, self.off, end_off.wrapping_sub(self.off));
            self.off = end_off;
            if rc == OK {
                rc = self.iter.next(self.fts);
            }
        }
        if pos == self.range_end {
            if self.is_open {
                if self.iter.start >= 0 && pos >= self.iter.start {
                    self.append_doc(&mut rc, self.off, end_off.wrapping_sub(self.off));
                    self.off = end_off;
                }
                self.append_close(&mut rc);
                self.is_open = false;
            }
            self.append_doc(&mut rc, self.off, end_off.wrapping_sub(self.off));
            self.off = end_off;
        }
        rc
    }
}

unsafe extern "C" fn highlight_token(
    ctx: *mut c_void,
    tflags: c_int,
    _token: *const c_char,
    _n: c_int,
    start: c_int,
    end: c_int,
) -> c_int {
    // SAFETY: `ctx` is the `Highlight` the tokenize call was given, alive
    // and not otherwise borrowed while the tokenizer runs.
    let h = unsafe { &mut *ctx.cast::<Highlight<'_>>() };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.token(tflags, start, end)))
        .unwrap_or(ffi::SQLITE_INTERNAL)
}

/// FTS5's `fts5ValueClampedInt`.
///
/// SAFETY (caller): `v` is an argument of the running call.
unsafe fn clamped_int(v: *mut ffi::sqlite3_value) -> c_int {
    // SAFETY: as the caller promises.
    let i = unsafe { ffi::sqlite3_value_int64(v) };
    i.clamp(-1, 0x7FFF_FFFF) as c_int
}

/// A text argument up to its zero byte, or `None` for NULL.
///
/// SAFETY (caller): `v` is an argument of the running call; the slice is
/// used during the call only.
unsafe fn text_arg<'a>(v: *mut ffi::sqlite3_value) -> Option<&'a [u8]> {
    // SAFETY: as the caller promises.
    unsafe { super::text(v) }
}

/// `highlight(t, col, open, close)`.
unsafe extern "C" fn highlight(
    api: *const ffi::Fts5ExtensionApi,
    fts: *mut ffi::Fts5Context,
    ctx: *mut ffi::sqlite3_context,
    n_val: c_int,
    vals: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: FTS5 passes its API, the row's context, the call's context
    // and `n_val` values.
    unsafe {
        guarded(ctx, || {
            if n_val != 3 {
                let msg = c"wrong number of arguments to function highlight()";
                ffi::sqlite3_result_error(ctx, msg.as_ptr(), -1);
                return;
            }
            let fts = Fts { api, fts };
            let col = clamped_int(*vals);
            let mut h = Highlight::new(fts, col, text_arg(*vals.add(1)), text_arg(*vals.add(2)));
            let (mut rc, z, n) = fts.column_text(col);
            h.doc = Doc::new(z, n);
            if rc == ffi::SQLITE_RANGE {
                ffi::sqlite3_result_text(ctx, c"".as_ptr(), -1, None);
                rc = OK;
            } else if !z.is_null() {
                if rc == OK {
                    (rc, h.iter) = CInstIter::init(fts, col);
                }
                if rc == OK {
                    rc = fts.tokenize(col, (z, n), (&raw mut h).cast(), highlight_token);
                }
                if h.is_open {
                    h.append_close(&mut rc);
                }
                h.append_doc(&mut rc, h.off, n.wrapping_sub(h.off));
                if rc == OK {
                    h.out.into_result(ctx);
                }
            }
            if rc != OK {
                ffi::sqlite3_result_error_code(ctx, rc);
            }
        });
    }
}

/// FTS5's `Fts5SFinder`: the first token of each sentence of a column.
struct SentenceFinder {
    pos: c_int,
    first: Vec<c_int>,
    doc: Doc,
    /// The last byte before `scanned` that is not white space, and how far
    /// the document was scanned for it.
    last_word: Option<usize>,
    scanned: usize,
    charge: Option<Charge>,
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

impl SentenceFinder {
    fn new() -> SentenceFinder {
        SentenceFinder {
            pos: 0,
            first: Vec::new(),
            doc: Doc::new(std::ptr::null(), 0),
            last_word: None,
            scanned: 0,
            charge: Charge::new(0),
        }
    }

    /// Starts on a column's document (FTS5 resets its finder so).
    fn start(&mut self, doc: Doc) {
        self.pos = 0;
        self.first.clear();
        self.doc = doc;
        self.last_word = None;
        self.scanned = 0;
    }

    /// The last byte before `at` that is not white space.
    fn last_word_before(&mut self, at: usize) -> Option<usize> {
        let doc = self.doc.bytes();
        let at = at.min(doc.len());
        if at < self.scanned {
            // Tokens that go backwards (no built-in tokenizer's): FTS5's
            // own walk back.
            return doc[..at].iter().rposition(|&c| !is_space(c));
        }
        if let Some(i) = doc[self.scanned..at].iter().rposition(|&c| !is_space(c)) {
            self.last_word = Some(self.scanned + i);
        }
        self.scanned = at;
        self.last_word
    }

    fn add(&mut self, pos: c_int) -> c_int {
        if self.first.len() == self.first.capacity() {
            let cap = (self.first.capacity() * 2).max(64);
            let bytes = cap * size_of::<c_int>();
            if !self.charge.as_mut().is_some_and(|c| c.grow_to(bytes)) {
                return ffi::SQLITE_NOMEM;
            }
            self.first.reserve_exact(cap - self.first.len());
        }
        self.first.push(pos);
        OK
    }

    /// FTS5's `fts5SentenceFinderCb`, for one token.
    fn token(&mut self, tflags: c_int, start_off: c_int) -> c_int {
        let mut rc = OK;
        if tflags & ffi::FTS5_TOKEN_COLOCATED == 0 {
            if self.pos > 0 {
                // A sentence starts after white space that follows a '.'
                // or a ':'.
                let at = start_off.max(0) as usize;
                let word = self.last_word_before(at);
                let after_space = at > 0 && word != Some(at - 1);
                let doc = self.doc.bytes();
                if after_space && word.is_some_and(|w| matches!(doc[w], b'.' | b':')) {
                    rc = self.add(self.pos);
                }
            } else {
                rc = self.add(0);
            }
            self.pos = self.pos.wrapping_add(1);
        }
        rc
    }
}

unsafe extern "C" fn sentence_token(
    ctx: *mut c_void,
    tflags: c_int,
    _token: *const c_char,
    _n: c_int,
    start: c_int,
    _end: c_int,
) -> c_int {
    // SAFETY: `ctx` is the `SentenceFinder` the tokenize call was given,
    // alive and not otherwise borrowed while the tokenizer runs.
    let f = unsafe { &mut *ctx.cast::<SentenceFinder>() };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f.token(tflags, start)))
        .unwrap_or(ffi::SQLITE_INTERNAL)
}

/// The phrases a score has seen: FTS5's `aSeen`, cleared by forgetting
/// only what was set.
struct Seen {
    seen: Vec<bool>,
    set: Vec<usize>,
}

impl Seen {
    fn mark(&mut self, p: c_int) -> bool {
        let Some(s) = self.seen.get_mut(p.max(0) as usize) else {
            return true;
        };
        let was = *s;
        if !was {
            *s = true;
            self.set.push(p as usize);
        }
        was
    }

    fn clear(&mut self) {
        for p in self.set.drain(..) {
            self.seen[p] = false;
        }
    }
}

/// Where the row's matches are ordered by (column, offset), which lets a
/// window's matches be found by a binary search.
struct Insts {
    n: c_int,
    ordered: bool,
}

impl Insts {
    fn new(fts: Fts, n: c_int) -> Result<Insts, c_int> {
        let mut ordered = true;
        let mut prev = (c_int::MIN, c_int::MIN);
        for i in 0..n {
            let (_, c, o) = fts.inst(i)?;
            ordered &= prev <= (c, o);
            prev = (c, o);
        }
        Ok(Insts { n, ordered })
    }

    /// The first match at or after (col, off), or 0 if unordered.
    fn lower_bound(&self, fts: Fts, col: c_int, off: c_int) -> Result<c_int, c_int> {
        if !self.ordered {
            return Ok(0);
        }
        let (mut lo, mut hi) = (0, self.n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let (_, c, o) = fts.inst(mid)?;
            if (c, o) < (col, off) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }
}

/// FTS5's `fts5SnippetScore`: the score of the `n_token` tokens of column
/// `col` from `pos`, and where a snippet around them would start.
#[allow(clippy::too_many_arguments)] // FTS5's own parameters
fn snippet_score(
    fts: Fts,
    insts: &Insts,
    n_docsize: c_int,
    seen: &mut Seen,
    col: c_int,
    pos: c_int,
    n_token: c_int,
) -> Result<(c_int, c_int), c_int> {
    let (rc, n_inst) = fts.inst_count();
    if rc != OK {
        return Err(rc);
    }
    let end = pos as i64 + n_token as i64;
    let (mut first, mut last, mut score) = (-1 as c_int, 0 as c_int, 0 as c_int);
    let mut i = insts.lower_bound(fts, col, pos)?;
    while i < n_inst {
        let (ip, ic, io) = fts.inst(i)?;
        let inside = ic == col && io >= pos && (io as i64) < end;
        if inside {
            score = score.wrapping_add(if seen.mark(ip) { 1 } else { 1000 });
            if first < 0 {
                first = io;
            }
            last = io.wrapping_add(fts.phrase_size(ip));
        } else if insts.ordered && (ic > col || (ic == col && io as i64 >= end)) {
            break;
        }
        i += 1;
    }
    Ok((score, snippet_start(first, last, n_docsize, n_token)))
}

/// Where a snippet around the matches from `first` to `last` would start
/// (the tail of FTS5's `fts5SnippetScore`).
fn snippet_start(first: c_int, last: c_int, n_docsize: c_int, n_token: c_int) -> c_int {
    let adj = first.wrapping_sub(n_token.wrapping_sub(last.wrapping_sub(first)) / 2) as i64;
    let adj = if adj + n_token as i64 > n_docsize as i64 {
        n_docsize as i64 - n_token as i64
    } else {
        adj
    };
    adj.max(0) as c_int
}

/// [`snippet_score`] for windows that only move forward, over matches
/// ordered by (column, offset): the matches in the window are a range of
/// indexes, and its score (1,000 for each phrase's first match, 1 for each
/// further one) follows from counts kept as the range moves. Each match
/// enters and leaves once, where the full scan looked at all of them for
/// every window.
struct Window {
    col: c_int,
    lo: c_int,
    hi: c_int,
    started: bool,
    counts: Vec<u32>,
    distinct: c_int,
}

impl Window {
    fn new(n_phrase: c_int) -> Window {
        Window {
            col: 0,
            lo: 0,
            hi: 0,
            started: false,
            counts: vec![0; n_phrase.max(0) as usize],
            distinct: 0,
        }
    }

    fn reset(&mut self, col: c_int) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        (self.col, self.lo, self.hi, self.started, self.distinct) = (col, 0, 0, false, 0);
    }

    fn count(&mut self, p: c_int, add: bool) {
        let Some(c) = self.counts.get_mut(p.max(0) as usize) else {
            return;
        };
        if add {
            *c += 1;
            if *c == 1 {
                self.distinct += 1;
            }
        } else {
            *c -= 1;
            if *c == 0 {
                self.distinct -= 1;
            }
        }
    }

    /// The score of the `n_token` tokens from `pos` (not before the last
    /// call's), and where a snippet around them would start.
    fn score(
        &mut self,
        fts: Fts,
        insts: &Insts,
        n_docsize: c_int,
        pos: c_int,
        n_token: c_int,
    ) -> Result<(c_int, c_int), c_int> {
        if !self.started {
            self.lo = insts.lower_bound(fts, self.col, pos)?;
            self.hi = self.lo;
            self.started = true;
        }
        let end = pos as i64 + n_token as i64;
        while self.hi < insts.n {
            let (ip, ic, io) = fts.inst(self.hi)?;
            if ic != self.col || io as i64 >= end {
                break;
            }
            self.count(ip, true);
            self.hi += 1;
        }
        while self.lo < self.hi {
            let (ip, _, io) = fts.inst(self.lo)?;
            if io >= pos {
                break;
            }
            self.count(ip, false);
            self.lo += 1;
        }
        let n = self.hi - self.lo;
        if n == 0 {
            return Ok((0, snippet_start(-1, 0, n_docsize, n_token)));
        }
        let (_, _, first) = fts.inst(self.lo)?;
        let (lp, _, lo) = fts.inst(self.hi - 1)?;
        let last = lo.wrapping_add(fts.phrase_size(lp));
        let score = self
            .distinct
            .wrapping_mul(1000)
            .wrapping_add(n.wrapping_sub(self.distinct));
        Ok((score, snippet_start(first, last, n_docsize, n_token)))
    }
}

/// `snippet(t, col, open, close, ellipsis, tokens)`.
unsafe extern "C" fn snippet(
    api: *const ffi::Fts5ExtensionApi,
    fts: *mut ffi::Fts5Context,
    ctx: *mut ffi::sqlite3_context,
    n_val: c_int,
    vals: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: FTS5 passes its API, the row's context, the call's context
    // and `n_val` values.
    unsafe {
        guarded(ctx, || {
            if n_val != 5 {
                let msg = c"wrong number of arguments to function snippet()";
                ffi::sqlite3_result_error(ctx, msg.as_ptr(), -1);
                return;
            }
            let fts = Fts { api, fts };
            let arg = |i: usize| *vals.add(i);
            let n_col = fts.column_count();
            let col = clamped_int(arg(0));
            let marks = Marks {
                open: text_arg(arg(1)).unwrap_or(b""),
                close: text_arg(arg(2)).unwrap_or(b""),
                ellipsis: text_arg(arg(3)).unwrap_or(b""),
            };
            let n_token = ffi::sqlite3_value_int64(arg(4)).clamp(0, 64) as c_int;
            let n_phrase = fts.phrase_count();
            let (rc, best) = snippet_choose(fts, col, n_col, n_phrase, n_token);
            match snippet_render(fts, rc, best, &marks, n_token) {
                (OK, out) => out.into_result(ctx),
                (rc, _) => ffi::sqlite3_result_error_code(ctx, rc),
            }
        });
    }
}

/// `snippet`'s text arguments.
struct Marks<'a> {
    open: &'a [u8],
    close: &'a [u8],
    ellipsis: &'a [u8],
}

/// The best snippet so far: FTS5's `nBestScore`, `iBestCol`,
/// `iBestStart`, `nColSize`.
struct Best {
    score: c_int,
    col: c_int,
    start: c_int,
    col_size: c_int,
}

/// The second half of FTS5's `fts5SnippetFunction`: the best snippet's
/// tokens, highlighted, between ellipses where the column goes on. `rc` is
/// the first half's error code, which the steps here go on from.
fn snippet_render(
    fts: Fts,
    mut rc: c_int,
    best: Best,
    marks: &Marks,
    n_token: c_int,
) -> (c_int, Output) {
    let mut h = Highlight::new(fts, best.col, Some(marks.open), Some(marks.close));
    let ellipsis = Some(marks.ellipsis);
    let (mut z, mut n, mut col_size) = (std::ptr::null(), 0, best.col_size);
    if rc == OK {
        (rc, z, n) = fts.column_text(best.col);
        h.doc = Doc::new(z, n);
    }
    if rc == OK && col_size == 0 {
        (rc, col_size) = fts.column_size(best.col);
    }
    if z.is_null() {
        return (rc, h.out);
    }
    if rc == OK {
        (rc, h.iter) = CInstIter::init(fts, best.col);
    }
    h.range_start = best.start;
    h.range_end = best.start.wrapping_add(n_token).wrapping_sub(1);
    if best.start > 0 {
        append(&mut h.out, &mut rc, ellipsis, -1);
    }
    while h.iter.start >= 0 && h.iter.start < best.start && rc == OK {
        rc = h.iter.next(fts);
    }
    if rc == OK {
        rc = fts.tokenize(best.col, (z, n), (&raw mut h).cast(), highlight_token);
    }
    if h.is_open {
        h.append_close(&mut rc);
    }
    if h.range_end >= col_size.wrapping_sub(1) {
        h.append_doc(&mut rc, h.off, n.wrapping_sub(h.off));
    } else {
        append(&mut h.out, &mut rc, ellipsis, -1);
    }
    (rc, h.out)
}

/// How snippet windows are scored: from counts kept as windows move over
/// matches ordered by (column, offset) (one window for the matches' own,
/// one for their sentences'), or where the matches are not ordered, by
/// FTS5's scan of them all.
struct Scorer {
    insts: Insts,
    seen: Seen,
    at_match: Window,
    at_sentence: Window,
}

impl Scorer {
    fn reset(&mut self, col: c_int) {
        self.at_match.reset(col);
        self.at_sentence.reset(col);
    }

    #[allow(clippy::too_many_arguments)] // FTS5's own parameters, and which window
    fn score(
        &mut self,
        fts: Fts,
        sentence: bool,
        n_docsize: c_int,
        col: c_int,
        pos: c_int,
        n_token: c_int,
    ) -> Result<(c_int, c_int), c_int> {
        if self.insts.ordered {
            let w = if sentence {
                &mut self.at_sentence
            } else {
                &mut self.at_match
            };
            return w.score(fts, &self.insts, n_docsize, pos, n_token);
        }
        self.seen.clear();
        snippet_score(
            fts,
            &self.insts,
            n_docsize,
            &mut self.seen,
            col,
            pos,
            n_token,
        )
    }
}

/// The first half of FTS5's `fts5SnippetFunction`: the best snippet's
/// column, first token and column size, and the error code as FTS5's code
/// leaves it (later steps overwrite earlier errors there, and so here).
fn snippet_choose(
    fts: Fts,
    col: c_int,
    n_col: c_int,
    n_phrase: c_int,
    n_token: c_int,
) -> (c_int, Best) {
    let mut rc = OK;
    let mut best = Best {
        score: 0,
        col: if col >= 0 { col } else { 0 },
        start: 0,
        col_size: 0,
    };
    // FTS5 allocates one flag a phrase, and fails for no phrases.
    // (Here: a flag, a place in the list of flags set, and two counts.)
    let phrases = n_phrase.max(0) as usize;
    let charge = Charge::new(phrases * (1 + size_of::<usize>() + 8));
    if n_phrase <= 0 || charge.is_none() {
        rc = ffi::SQLITE_NOMEM;
    }
    let mut n_inst = 0;
    if rc == OK {
        (rc, n_inst) = fts.inst_count();
    }
    let mut scorer = Scorer {
        // Where reading the matches fails here, the full scan meets the
        // failure where FTS5's own does.
        insts: Insts::new(fts, n_inst).unwrap_or(Insts {
            n: n_inst,
            ordered: false,
        }),
        seen: Seen {
            seen: vec![false; phrases],
            set: Vec::new(),
        },
        at_match: Window::new(n_phrase),
        at_sentence: Window::new(n_phrase),
    };
    let mut finder = SentenceFinder::new();
    for i in (0..n_col).filter(|&i| col < 0 || col == i) {
        let (r, z, n) = fts.column_text(i);
        rc = r;
        if rc != OK {
            break;
        }
        finder.start(Doc::new(z, n));
        rc = fts.tokenize(i, (z, n), (&raw mut finder).cast(), sentence_token);
        if rc != OK {
            break;
        }
        let n_docsize;
        (rc, n_docsize) = fts.column_size(i);
        if rc != OK {
            break;
        }
        scorer.reset(i);
        let column = Column {
            col: i,
            n_inst,
            n_docsize,
            n_token,
            sentences: &finder.first,
        };
        rc = snippet_column(fts, &column, &mut scorer, &mut best);
    }
    (rc, best)
}

/// One column of the row, as FTS5's snippet loop sees it.
struct Column<'a> {
    col: c_int,
    n_inst: c_int,
    n_docsize: c_int,
    n_token: c_int,
    /// The first token of each sentence.
    sentences: &'a [c_int],
}

/// FTS5's loop over the row's matches in one column: the window from each
/// match, and from the start of its sentence, against the best so far.
/// Returns the error code as the loop leaves it.
fn snippet_column(fts: Fts, c: &Column, scorer: &mut Scorer, best: &mut Best) -> c_int {
    let mut rc = OK;
    let mut ii = 0;
    while rc == OK && ii < c.n_inst {
        let (ic, io) = match fts.inst(ii) {
            Ok((_, ic, io)) => (ic, io),
            Err(e) => {
                rc = e;
                (-1, 0)
            }
        };
        ii += 1;
        if ic != c.col {
            continue;
        }
        if io > c.n_docsize {
            rc = ffi::SQLITE_CORRUPT_VTAB;
        }
        if rc != OK {
            continue;
        }
        match scorer.score(fts, false, c.n_docsize, c.col, io, c.n_token) {
            Ok((score, adj)) if score > best.score => {
                *best = Best {
                    score,
                    col: c.col,
                    start: adj,
                    col_size: c.n_docsize,
                };
            }
            Ok(_) => {}
            Err(e) => rc = e,
        }
        let first = c.sentences;
        if rc != OK || first.is_empty() || c.n_docsize <= c.n_token {
            continue;
        }
        // The last sentence start not after `io` (FTS5 walks to it).
        let start = first[first[1..].partition_point(|&f| f <= io)];
        if start >= io {
            continue;
        }
        match scorer.score(fts, true, c.n_docsize, c.col, start, c.n_token) {
            Ok((score, _)) => {
                let score = score.wrapping_add(if start == 0 { 120 } else { 100 });
                if score > best.score {
                    *best = Best {
                        score,
                        col: c.col,
                        start,
                        col_size: c.n_docsize,
                    };
                }
            }
            Err(e) => rc = e,
        }
    }
    rc
}
