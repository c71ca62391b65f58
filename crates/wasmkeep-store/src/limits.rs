//! The limits one actor's database enforces, in one place.
//!
//! Names end in their unit, as everywhere in wasmkeep. The defaults follow
//! Durable Objects' documented SQLite limits where those exist, so that an
//! app moved from there behaves the same.

/// Bounds on what one actor's guest code may store or run, and the page
/// size a new database is created with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreLimits {
    /// Largest string or blob value, and largest row (SQLite's
    /// `SQLITE_LIMIT_LENGTH`); also a key-value entry's key plus value.
    pub value_bytes_max: usize,
    /// Longest SQL statement text.
    pub sql_bytes_max: usize,
    /// Most bound parameters in one statement.
    pub sql_params_max: usize,
    /// Longest key-value key.
    pub key_bytes_max: usize,
    /// Largest database file (enforced through `max_page_count`).
    pub database_bytes_max: u64,
    /// Most entries one key-value `list` returns.
    pub kv_list_entries_max: u32,
    /// Largest result one query may return, all rows together.
    pub query_result_bytes_max: usize,
    /// Memory SQLite may hold for one guest statement while it runs (its
    /// rows, sorts and temporary results), counted at the allocation: the
    /// bound on what one statement can make the node allocate.
    pub statement_memory_bytes_max: usize,
    /// Largest temporary file one guest statement may make SQLite write
    /// (a sort, `DISTINCT` or materialised subquery that spills to disk).
    pub statement_temp_file_bytes_max: u64,
    /// SQLite page size of a database created from now on; an existing one
    /// keeps the size it was created with. Smaller pages make an open actor
    /// with small rows cheaper in memory and its commits smaller; larger
    /// ones suit values of a few KiB and more (ADR 0027).
    pub page_bytes: u32,
}

/// Longest LIKE or GLOB pattern a guest statement may match, in bytes
/// (SQLite's `SQLITE_LIMIT_LIKE_PATTERN_LENGTH`, 50,000 by default).
/// SQLite matches a pattern in time that grows with the pattern's length
/// times the subject's, within one call the deadline cannot interrupt: with
/// a 2 MiB subject, 50,000 bytes took a minute, 256 takes about half a
/// second (ADR 0032, "One call between two checks"). Not a setting: it
/// bounds how far past the event's deadline a statement may run.
pub const LIKE_PATTERN_BYTES_MAX: i32 = 256;

/// Most arguments one SQL function call may have in a guest statement
/// (SQLite's `SQLITE_LIMIT_FUNCTION_ARG`: 1,000 by default since SQLite
/// 3.48, 127 before). The JSON functions that take many paths
/// (`json_extract`, `json_set`, `json_remove`, ...) look up each path from
/// the document's start, in one call: at 1,000 arguments and a 2 MiB
/// document that took 4 seconds, at 127 about half a second (ADR 0032).
pub const FUNCTION_ARGS_MAX: i32 = 127;

/// Bound on one `json_patch` or `jsonb_patch` call: the patch's object
/// members (of any depth) times the bytes of both arguments. SQLite looks
/// each member up among the target's from the first and moves the target's
/// rest at each change, in one call the deadline cannot interrupt: two
/// 2 MiB objects took about a minute; at this bound a call takes a tenth of
/// a second at most (ADR 0032): a 2 MiB target takes a patch of about 60
/// members, a 100 KiB one of about 1,200. A call over it fails with
/// `invalid_argument`, naming the function and the bound.
pub const JSON_PATCH_MEMBER_BYTES_MAX: u64 = 128_000_000;

/// Most terms (tokens, a phrase without any counting as one) FTS5 may
/// tokenize for a guest statement's full-text queries between two checks
/// of the deadline (every `PROGRESS_OPS` steps, and the statement's start):
/// one query's terms all count, since FTS5 parses a query in one step.
/// FTS5 builds a query's expression tree in time that grows with the
/// square of its phrases, in one step the deadline cannot interrupt:
/// 80,000 OR'd phrases took 2.8 s, a 2 MiB query about a minute (ADR 0032).
/// A query over it fails with `invalid_argument`, naming the bound.
/// Documents are not counted.
pub const FTS5_QUERY_TOKENS_MAX: u32 = 4096;

/// Page sizes SQLite accepts.
pub const PAGE_BYTES_MIN: u32 = 512;
pub const PAGE_BYTES_MAX: u32 = 65536;

/// Checks a page size setting: a power of two within SQLite's range.
/// `field` names the setting in the error.
pub fn check_page_bytes(field: &str, page_bytes: u32) -> Result<(), String> {
    if (PAGE_BYTES_MIN..=PAGE_BYTES_MAX).contains(&page_bytes) && page_bytes.is_power_of_two() {
        Ok(())
    } else {
        Err(format!(
            "`{field}` must be a power of two from {PAGE_BYTES_MIN} to {PAGE_BYTES_MAX}, not {page_bytes}"
        ))
    }
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            value_bytes_max: 2 * 1024 * 1024,
            sql_bytes_max: 100_000,
            sql_params_max: 100,
            key_bytes_max: 2048,
            database_bytes_max: 10 * 1024 * 1024 * 1024,
            kv_list_entries_max: 10_000,
            query_result_bytes_max: 32 * 1024 * 1024,
            statement_memory_bytes_max: 64 * 1024 * 1024,
            statement_temp_file_bytes_max: 256 * 1024 * 1024,
            page_bytes: 4096,
        }
    }
}
