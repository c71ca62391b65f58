//! The store's errors, each with a stable code.

use thiserror::Error;

/// Everything that can go wrong in one actor's database.
///
/// [`StoreError::code`] is the stable, machine-readable code the HTTP edge
/// and guests see; the message names the limit or field involved.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("value too large: {what} size={size} limit value_bytes_max={limit}")]
    ValueTooLarge {
        what: &'static str,
        size: usize,
        limit: usize,
    },
    #[error("value too large: a string, blob or row exceeds value_bytes_max={limit}")]
    RowTooLarge { limit: usize },
    #[error("key too large: size={size} limit key_bytes_max={limit}")]
    KeyTooLarge { size: usize, limit: usize },
    #[error("statement too large: size={size} limit sql_bytes_max={limit}")]
    StatementTooLarge { size: usize, limit: usize },
    #[error("too many parameters: count={count} limit sql_params_max={limit}")]
    TooManyParams { count: usize, limit: usize },
    #[error("result too large: limit query_result_bytes_max={limit}")]
    ResultTooLarge { limit: usize },
    #[error("database full: limit database_bytes_max={limit}")]
    DatabaseFull { limit: u64 },
    #[error("quota exceeded: the tenant's databases take all they may: limit {name}={limit}")]
    QuotaExceeded { name: &'static str, limit: u64 },
    #[error(
        "statement ran past the event's deadline: limit event_cpu_ms_max (the same deadline as the guest's code)"
    )]
    DeadlineExceeded,
    #[error("statement stopped: the node is shutting down")]
    Stopping,
    #[error("statement needed too much memory: limit statement_memory_bytes_max={limit}")]
    StatementMemoryExceeded { limit: usize },
    #[error(
        "the node's memory for tenants is exhausted: limit node_memory_bytes_max={limit}; retry later"
    )]
    NodeMemoryExhausted { limit: u64 },
    #[error("statement spilled too much to disk: limit statement_temp_file_bytes_max={limit}")]
    TempStorageExceeded { limit: u64 },
    #[error(
        "not enough native stack left for SQLite: left={left} bytes, limit sql_stack_bytes_min={needed}; the guest's own call stack is too deep"
    )]
    StackExhausted { left: usize, needed: usize },
    #[error("forbidden: {0}")]
    Forbidden(String),
    #[error("sql error: {0}")]
    Sql(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("actor database is corrupt or unreadable: {0}")]
    Corrupt(String),
    #[error("the actor's database is held by its open connection")]
    Busy,
    #[error(
        "outbox full: {pending} messages wait for their answer, limit outbox_pending_max={limit}"
    )]
    OutboxFull { pending: u64, limit: u64 },
    #[error("storage i/o error: {0}")]
    Io(String),
}

impl StoreError {
    /// The stable code for this error (see the README's error table).
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::ValueTooLarge { .. } | StoreError::RowTooLarge { .. } => "value_too_large",
            StoreError::KeyTooLarge { .. } => "key_too_large",
            StoreError::StatementTooLarge { .. } => "statement_too_large",
            StoreError::TooManyParams { .. } => "too_many_parameters",
            StoreError::ResultTooLarge { .. } => "result_too_large",
            StoreError::DatabaseFull { .. } => "database_full",
            StoreError::QuotaExceeded { .. } => "quota_exceeded",
            StoreError::DeadlineExceeded => "cpu_time_exceeded",
            StoreError::Stopping => "shutting_down",
            StoreError::StatementMemoryExceeded { .. } => "memory_exceeded",
            StoreError::NodeMemoryExhausted { .. } => "node_memory_exhausted",
            StoreError::TempStorageExceeded { .. } => "temp_storage_exceeded",
            StoreError::StackExhausted { .. } => "stack_exhausted",
            StoreError::Forbidden(_) => "forbidden",
            StoreError::Sql(_) => "sql_error",
            StoreError::InvalidArgument(_) => "invalid_argument",
            StoreError::Corrupt(_) => "storage_corrupt",
            StoreError::Io(_) => "storage_error",
            StoreError::Busy => "storage_busy",
            StoreError::OutboxFull { .. } => "outbox_full",
        }
    }

    /// Whether the error is the guest's doing (bad SQL, a limit), as opposed
    /// to the node's storage failing.
    pub fn is_guest_fault(&self) -> bool {
        !matches!(
            self,
            StoreError::Corrupt(_)
                | StoreError::Io(_)
                | StoreError::Stopping
                | StoreError::NodeMemoryExhausted { .. }
        )
    }
}

impl From<std::io::Error> for StoreError {
    fn from(e: std::io::Error) -> Self {
        StoreError::Io(e.to_string())
    }
}
