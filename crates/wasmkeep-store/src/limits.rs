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
