//! A bound on the terms of a guest's FTS5 queries (ADR 0032, "One call
//! between two checks").
//!
//! FTS5 parses a `MATCH` query and builds its expression tree in one step
//! of SQLite's virtual machine (the table's `xFilter`), in time that grows
//! with the square of the query's phrases: every `OR` (and every implicit
//! `AND`) copies the children gathered so far into a new node. 80,000 OR'd
//! phrases ran 2.8 s past a 20 ms deadline. The query is a value, a literal
//! or a bound parameter or any expression, so no function can be replaced
//! to look at it; what FTS5 does with every term of it is hand it to the
//! table's tokenizer, with `FTS5_TOKENIZE_QUERY`.
//!
//! So an actor's connection makes the built-in tokenizers count: the
//! `xTokenize` of `unicode61`, `ascii` and `trigram` (FTS5's v1 tokenizer
//! modules) is replaced by one that calls the original and counts the terms
//! of queries, a phrase with no tokens counting as one (FTS5 builds a node
//! for it all the same). Past [`FTS5_QUERY_TOKENS_MAX`] terms since the last
//! check of the deadline (or the guest statement's start) the tokenizer
//! fails, FTS5 fails the query, and the statement fails with
//! `invalid_argument` naming `fts5_query_tokens_max`. Documents, and the
//! text `highlight()` and `snippet()` tokenize, are passed through untouched.
//! `porter` wraps another tokenizer by name, and reaches the counting one.
//!
//! Why the module's function pointer is replaced in place rather than a
//! wrapper registered under the built-in's name through `xCreateTokenizer`:
//! a table created without a `tokenize` option uses FTS5's default
//! tokenizer, which is the module registered first (`unicode61`), held by
//! pointer; a later registration under the same name is found by name only.
//! The most common table, `fts5(body)`, would not be bounded. Replacing
//! `xTokenize` alone also keeps `xCreate`, which FTS5 compares with
//! `trigram`'s to decide that a trigram table can answer LIKE and GLOB.

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use rusqlite::ffi;

use crate::limits::FTS5_QUERY_TOKENS_MAX;

const OK: c_int = ffi::SQLITE_OK;

type TokenFn =
    unsafe extern "C" fn(*mut c_void, c_int, *const c_char, c_int, c_int, c_int) -> c_int;

type TokenizeFn = unsafe extern "C" fn(
    *mut ffi::Fts5Tokenizer,
    *mut c_void,
    c_int,
    *const c_char,
    c_int,
    Option<TokenFn>,
) -> c_int;

/// FTS5's v1 built-in tokenizers (`porter` is a v2 one that wraps another
/// by name).
const BUILT_INS: [&CStr; 3] = [c"unicode61", c"ascii", c"trigram"];

/// Each built-in's own `xTokenize`: static functions of the linked SQLite,
/// the same for every connection.
static ORIGINAL: [OnceLock<TokenizeFn>; 3] = [const { OnceLock::new() }; 3];

/// The counting `xTokenize` of each built-in.
const COUNTING: [TokenizeFn; 3] = [tokenize::<0>, tokenize::<1>, tokenize::<2>];

/// The head of FTS5's `Fts5TokenizerModule` (sqlite3.c), up to the fields
/// this module reads or writes. Used only after [`count_queries`] checked
/// that the pointer FTS5 hands out is one (see there).
#[repr(C)]
struct TokenizerModule {
    name: *mut c_char,
    user_data: *mut c_void,
    v2_native: c_int,
    x1: ffi::fts5_tokenizer,
    x2: ffi::fts5_tokenizer_v2,
}

thread_local! {
    /// Query terms tokenized on this thread since the last check of a
    /// guest statement's deadline or the statement's start.
    static TERMS: Cell<u32> = const { Cell::new(0) };
}

/// Starts a new count: the deadline was just checked, or a guest
/// statement starts.
pub(crate) fn restart_count() {
    TERMS.set(0);
}

/// Makes the built-in tokenizers of the connection whose FTS5 API is `api`
/// count the terms of queries.
///
/// SAFETY (caller): `api` is the live `fts5_api` of an open connection used
/// on this thread, before any FTS5 table of it has loaded its tokenizer.
pub(super) unsafe fn install(api: *mut ffi::fts5_api) -> c_int {
    for i in 0..BUILT_INS.len() {
        // SAFETY: as the caller promises.
        let rc = unsafe { count_queries(api, i) };
        if rc != OK {
            return rc;
        }
    }
    OK
}

/// Replaces built-in `i`'s `xTokenize` with the counting one.
///
/// SAFETY (caller): as for [`install`].
unsafe fn count_queries(api: *mut ffi::fts5_api, i: usize) -> c_int {
    let name = BUILT_INS[i];
    // SAFETY: `api` is live (caller). The two lookups are FTS5's public
    // API. For a v1 module, `xFindTokenizer_v2` hands out the module itself
    // as the user data and a pointer to its `x2` field; `xFindTokenizer`
    // copies its `x1` field and its user data. The write below goes through
    // the module pointer only after three observations agree with the
    // layout of `TokenizerModule`: the `x2` pointer lies at `x2`'s offset
    // from the module, and the user data, the v2 flag and all three `x1`
    // functions read there are what the v1 lookup returned. A SQLite whose
    // layout differs fails the check and the connection does not open
    // (tests/hostile_sql.rs would show it), rather than being written
    // blindly. The connection is used on this thread only, and no table has
    // copied `x1` yet (caller), so every tokenizer made from the module from
    // now on counts.
    unsafe {
        let a = &*api;
        let (Some(find_v1), Some(find_v2)) = (a.xFindTokenizer, a.xFindTokenizer_v2) else {
            return ffi::SQLITE_ERROR;
        };
        let mut v1_data = std::ptr::null_mut();
        let mut v1: ffi::fts5_tokenizer = std::mem::zeroed();
        let rc = find_v1(api, name.as_ptr(), &mut v1_data, &mut v1);
        if rc != OK {
            return rc;
        }
        let mut module = std::ptr::null_mut();
        let mut x2 = std::ptr::null_mut();
        let rc = find_v2(api, name.as_ptr(), &mut module, &mut x2);
        if rc != OK {
            return rc;
        }
        let module = module.cast::<TokenizerModule>();
        let x2_at = module
            .cast::<u8>()
            .wrapping_add(std::mem::offset_of!(TokenizerModule, x2));
        let Some(original) = v1.xTokenize else {
            return ffi::SQLITE_ERROR;
        };
        if module.is_null() || x2.cast::<u8>() != x2_at {
            return ffi::SQLITE_ERROR;
        }
        let m = &mut *module;
        let addr = |f: Option<TokenizeFn>| f.map(|f| f as usize);
        let same = m.user_data == v1_data
            && m.v2_native == 0
            && m.x1.xCreate.map(|f| f as usize) == v1.xCreate.map(|f| f as usize)
            && m.x1.xDelete.map(|f| f as usize) == v1.xDelete.map(|f| f as usize)
            && addr(m.x1.xTokenize) == Some(original as usize)
            && *ORIGINAL[i].get_or_init(|| original) as usize == original as usize;
        if !same {
            return ffi::SQLITE_ERROR;
        }
        m.x1.xTokenize = Some(COUNTING[i]);
    }
    OK
}

/// What a counting tokenizer passes to the original in place of FTS5's
/// callback and its context.
struct Counting {
    ctx: *mut c_void,
    token: TokenFn,
    /// Whether the phrase has had a token yet (its first is counted with
    /// the phrase).
    started: bool,
}

/// The counting `xTokenize` of built-in `K`.
///
/// SAFETY (caller, FTS5): the arguments are those of an `xTokenize` call of
/// a tokenizer that built-in `K`'s `xCreate` made.
unsafe extern "C" fn tokenize<const K: usize>(
    tok: *mut ffi::Fts5Tokenizer,
    ctx: *mut c_void,
    flags: c_int,
    text: *const c_char,
    n: c_int,
    token: Option<TokenFn>,
) -> c_int {
    let Some(original) = ORIGINAL[K].get().copied() else {
        return ffi::SQLITE_ERROR;
    };
    if flags & ffi::FTS5_TOKENIZE_QUERY == 0 {
        // SAFETY: FTS5's own call, passed on to the function it would
        // have called.
        return unsafe { original(tok, ctx, flags, text, n, token) };
    }
    let Some(token) = token else {
        return ffi::SQLITE_ERROR;
    };
    // The phrase is a node of the query even if it has no tokens.
    if !count_term() {
        return refuse();
    }
    let mut counting = Counting {
        ctx,
        token,
        started: false,
    };
    // SAFETY: FTS5's call with its callback and context wrapped; `counting`
    // outlives the call, which is the only one to use it.
    unsafe {
        original(
            tok,
            (&raw mut counting).cast(),
            flags,
            text,
            n,
            Some(counted_token),
        )
    }
}

/// The callback a counting tokenizer gives the original: counts the token
/// and passes it on to FTS5's.
///
/// SAFETY (caller): `ctx` is the `Counting` of the running `tokenize`.
unsafe extern "C" fn counted_token(
    ctx: *mut c_void,
    flags: c_int,
    token: *const c_char,
    n: c_int,
    start: c_int,
    end: c_int,
) -> c_int {
    // SAFETY: as the caller promises; nothing else refers to it meanwhile.
    let c = unsafe { &mut *ctx.cast::<Counting>() };
    if c.started && !count_term() {
        return refuse();
    }
    c.started = true;
    // SAFETY: FTS5's callback with its own context and the original
    // tokenizer's arguments.
    unsafe { (c.token)(c.ctx, flags, token, n, start, end) }
}

/// Counts one term; false past the bound. (Never panics into SQLite: a
/// thread-local `Cell` of a type without a destructor is always there.)
fn count_term() -> bool {
    std::panic::catch_unwind(|| {
        let n = TERMS.get().saturating_add(1);
        TERMS.set(n);
        n <= FTS5_QUERY_TOKENS_MAX
    })
    .unwrap_or(false)
}

/// Fails the query: FTS5 passes the code on, and the statement fails with
/// SQLite's message for it; the refusal recorded says why.
fn refuse() -> c_int {
    let _ = std::panic::catch_unwind(|| {
        super::record_refusal(
            format!(
                "full-text query has too many terms: \
                 limit fts5_query_tokens_max={FTS5_QUERY_TOKENS_MAX}"
            ),
            Some(QUERY_REFUSED_REPORTED),
        );
    });
    ffi::SQLITE_ERROR
}

/// SQLite's message for `SQLITE_ERROR` without a message of FTS5's: what a
/// statement whose query was refused fails with.
const QUERY_REFUSED_REPORTED: &str = "SQL logic error";
