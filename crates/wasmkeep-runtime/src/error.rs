//! The runtime's errors, each with a stable code.

use thiserror::Error;
use wasmkeep_store::StoreError;
use wasmkeep_store::id::InvalidId;

/// What can make an event, a deploy or an admin call fail.
#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error(transparent)]
    InvalidId(#[from] InvalidId),
    #[error("app not found: {0}")]
    AppNotFound(String),
    /// `version` 0: a rollback to "the one before" of an app with one version.
    #[error("{}", version_missing(app, *version))]
    VersionNotFound { app: String, version: u64 },
    #[error("reply expired: the parked reply was not completed in time (or its actor was deleted)")]
    ReplyExpired,
    #[error("tenant not found: no app of tenant `{0}` is deployed on this node")]
    TenantNotFound(String),
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    #[error("no inbox: {0}")]
    NoInbox(String),
    /// What another node answered for an inbound event it ran (or could
    /// not route), as its code says.
    #[error("{code}: {message}")]
    Relayed {
        code: String,
        message: String,
        retryable: bool,
    },
    #[error("class not found: app {app} has no class `{class}`")]
    ClassNotFound { app: String, class: String },
    #[error("actor not found: {0}")]
    ActorNotFound(String),
    #[error(
        "actor overloaded: {queued} events queued, limit actor_queue_events_max={limit}; retry later"
    )]
    ActorOverloaded { queued: usize, limit: usize },
    #[error(
        "{scope} overloaded: {queued} bytes of requests queued, limit {limit_name}={limit}; retry later"
    )]
    QueueBytesExceeded {
        scope: &'static str,
        limit_name: &'static str,
        queued: u64,
        limit: u64,
    },
    #[error("invalid component: {0}")]
    InvalidComponent(String),
    #[error("component too large: size={size} limit component_bytes_max={limit}")]
    ComponentTooLarge { size: usize, limit: usize },
    #[error("invalid manifest: {0}")]
    InvalidManifest(String),
    #[error(
        "limit above node ceiling (an operator may raise it with `app_limit_ceilings.{field}`): field=limits.{field} value={value} ceiling={ceiling}"
    )]
    LimitAboveCeiling {
        field: &'static str,
        value: u64,
        ceiling: u64,
    },
    #[error(
        "compiling the component took too long; it was abandoned: limit component_compile_ms_max={limit}"
    )]
    CompileTimeout { limit: u64 },
    #[error(
        "compiling the component needed more memory than a compilation may take: limit component_compile_memory_bytes_max={limit}"
    )]
    CompileMemoryExceeded { limit: u64 },
    #[error(
        "too many compilations running (some may be abandoned ones finishing): running={running} limit={limit}; retry later"
    )]
    CompileBusy { running: usize, limit: usize },
    #[error("the actor failed: {code}: {message}")]
    Guest { code: String, message: String },
    #[error("the actor trapped: {0}")]
    Trap(String),
    #[error("event ran too long: limit event_cpu_ms_max={limit}")]
    CpuTimeExceeded { limit: u64 },
    #[error("instance memory exhausted: limit instance_memory_bytes_max={limit}")]
    MemoryExceeded { limit: usize },
    #[error("response too large: size={size} limit response_body_bytes_max={limit}")]
    ResponseTooLarge { size: usize, limit: usize },
    #[error(
        "response headers too large: count={count} bytes={bytes} limit RESPONSE_HEADERS_MAX=256 RESPONSE_HEADER_BYTES_MAX=262144"
    )]
    ResponseHeadersTooLarge { count: usize, bytes: usize },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the node is shutting down")]
    ShuttingDown,
    #[error(
        "transaction aborted: another event of the same batch failed in a way that rolled the whole transaction back; retry"
    )]
    TransactionAborted,
    #[error(
        "replication failed: {0}; the actor was given up and restores from the bucket on its next event; retry"
    )]
    ReplicationFailed(String),
    #[error(
        "this node has no bucket: a request with `wasmkeep-durability: replicated` needs `serve --bucket`"
    )]
    ReplicationUnavailable,
    #[error(
        "too many log followers: limit log_followers_max={max}; stop another `wasmkeep logs --follow` or retry later"
    )]
    TooManyFollowers { max: usize },
    #[error(
        "quota exceeded: tenant `{tenant}` has as many {what} as it may: limit {limit_name}={limit}"
    )]
    QuotaExceeded {
        tenant: String,
        what: &'static str,
        limit_name: &'static str,
        limit: u64,
    },
    #[error("invalid idempotency key: {0}")]
    InvalidIdempotencyKey(String),
    #[error(
        "idempotency key reused: `{key}` was first used with another request (method, path, query or body) within idempotency_retention_ms; use a new key for a new request"
    )]
    IdempotencyKeyReused { key: String },
    #[error(
        "the answer is {size} bytes, over IDEMPOTENCY_RESPONSE_BYTES_MAX={limit}: too large to record for an Idempotency-Key, so the request was rolled back; send it without the key, or ask for less"
    )]
    IdempotentResponseTooLarge { size: usize, limit: usize },
    /// A class migration (ADR 0060) that cannot apply now; nothing moved.
    #[error("class migration: {code}: {message}")]
    ClassMigration { code: &'static str, message: String },
    /// An operation on a whole app that cannot run now (`replay_busy`).
    #[error("{message}")]
    Refused { code: &'static str, message: String },
    #[error("internal error: {0}")]
    Internal(String),
}

impl RuntimeError {
    /// The stable code (see the README's error table).
    pub fn code(&self) -> String {
        match self {
            RuntimeError::InvalidId(_) => "invalid_name".into(),
            RuntimeError::AppNotFound(_) => "app_not_found".into(),
            RuntimeError::VersionNotFound { .. } => "version_not_found".into(),
            RuntimeError::ClassNotFound { .. } => "class_not_found".into(),
            RuntimeError::NoInbox(_) => "no_inbox".into(),
            RuntimeError::InvalidConfig(_) => "invalid_config".into(),
            RuntimeError::TenantNotFound(_) => "tenant_not_found".into(),
            RuntimeError::ReplyExpired => "reply_expired".into(),
            RuntimeError::Relayed { code, .. } => code.clone(),
            RuntimeError::ActorNotFound(_) => "actor_not_found".into(),
            RuntimeError::ActorOverloaded { .. } => "actor_overloaded".into(),
            RuntimeError::QueueBytesExceeded { scope, .. } => format!("{scope}_overloaded"),
            RuntimeError::InvalidComponent(_) => "invalid_component".into(),
            RuntimeError::ComponentTooLarge { .. } => "component_too_large".into(),
            RuntimeError::InvalidManifest(_) => "invalid_manifest".into(),
            RuntimeError::LimitAboveCeiling { .. } => "limit_above_node_ceiling".into(),
            RuntimeError::CompileTimeout { .. } => "compile_timeout".into(),
            RuntimeError::CompileMemoryExceeded { .. } => "compile_memory_exceeded".into(),
            RuntimeError::CompileBusy { .. } => "compile_busy".into(),
            RuntimeError::Guest { code, .. } => {
                // Codes the host itself handed to the guest keep their
                // meaning when the guest passes them on.
                if is_store_code(code) {
                    code.clone()
                } else {
                    "guest_error".into()
                }
            }
            RuntimeError::Trap(_) => "guest_trap".into(),
            RuntimeError::CpuTimeExceeded { .. } => "cpu_time_exceeded".into(),
            RuntimeError::MemoryExceeded { .. } => "memory_exceeded".into(),
            RuntimeError::ResponseTooLarge { .. }
            | RuntimeError::ResponseHeadersTooLarge { .. } => "response_too_large".into(),
            RuntimeError::Store(e) => e.code().into(),
            RuntimeError::ShuttingDown => "shutting_down".into(),
            RuntimeError::TransactionAborted => "transaction_aborted".into(),
            RuntimeError::ReplicationFailed(_) => "replication_failed".into(),
            RuntimeError::ReplicationUnavailable => "replication_unavailable".into(),
            RuntimeError::TooManyFollowers { .. } => "too_many_followers".into(),
            RuntimeError::QuotaExceeded { .. } => "quota_exceeded".into(),
            RuntimeError::InvalidIdempotencyKey(_) => "invalid_idempotency_key".into(),
            RuntimeError::IdempotencyKeyReused { .. } => "idempotency_key_reused".into(),
            RuntimeError::IdempotentResponseTooLarge { .. } => {
                "idempotency_response_too_large".into()
            }
            RuntimeError::ClassMigration { code, .. } => (*code).into(),
            RuntimeError::Refused { code, .. } => (*code).into(),
            RuntimeError::Internal(_) => "internal".into(),
        }
    }

    /// Whether the guest's own code or data failed the event (its error,
    /// a trap, a limit it ran into), which trying again would repeat; as
    /// opposed to the node failing it.
    pub fn is_guest_failure(&self) -> bool {
        match self {
            RuntimeError::Store(s) => s.is_guest_fault() && !matches!(s, StoreError::Busy),
            RuntimeError::Guest { .. }
            | RuntimeError::Trap(_)
            | RuntimeError::CpuTimeExceeded { .. }
            | RuntimeError::MemoryExceeded { .. }
            | RuntimeError::ResponseTooLarge { .. }
            | RuntimeError::ResponseHeadersTooLarge { .. }
            | RuntimeError::IdempotentResponseTooLarge { .. } => true,
            _ => false,
        }
    }

    /// Whether the caller may simply try again later.
    pub fn is_retryable(&self) -> bool {
        if let RuntimeError::Relayed { retryable, .. } = self {
            return *retryable;
        }
        matches!(
            self,
            RuntimeError::ActorOverloaded { .. }
                | RuntimeError::QueueBytesExceeded { .. }
                | RuntimeError::CompileBusy { .. }
                | RuntimeError::Store(StoreError::NodeMemoryExhausted { .. })
                | RuntimeError::ShuttingDown
                | RuntimeError::TransactionAborted
                | RuntimeError::ReplicationFailed(_)
                | RuntimeError::TooManyFollowers { .. }
                | RuntimeError::ClassMigration {
                    code: "class_migrating",
                    ..
                }
        )
    }
}

impl RuntimeError {
    /// A partial deploy (a rollout, ADR 0059) of an app with no version
    /// yet: there is nothing to move actors from. One message for a node's
    /// deploy and a cluster's.
    pub fn rollout_without_whole(tenant: &str, app: &str, percent: u8) -> RuntimeError {
        RuntimeError::InvalidConfig(format!(
            "percent={percent}: a rollout moves actors from a version to another, and \
             {tenant}/{app} has none yet: deploy it whole first"
        ))
    }
}

impl RuntimeError {
    /// The HTTP status this error gets at the edge: the server's answers
    /// and a resumed request's parked reply (ADR 0056) alike.
    pub fn http_status(&self) -> u16 {
        use RuntimeError as E;
        match self {
            E::InvalidId(_) | E::InvalidConfig(_) | E::InvalidIdempotencyKey(_) => 400,
            E::IdempotencyKeyReused { .. } | E::IdempotentResponseTooLarge { .. } => 422,
            E::AppNotFound(_)
            | E::VersionNotFound { .. }
            | E::TenantNotFound(_)
            | E::ClassNotFound { .. }
            | E::ActorNotFound(_) => 404,
            E::ActorOverloaded { .. }
            | E::QueueBytesExceeded { .. }
            | E::CompileBusy { .. }
            | E::ShuttingDown
            | E::TooManyFollowers { .. }
            | E::TransactionAborted
            | E::ReplicationFailed(_) => 503,
            E::ReplicationUnavailable => 400,
            // Messages only: no request carries one to the edge.
            E::NoInbox(_) => 422,
            E::Relayed { .. } => 502,
            E::ClassMigration {
                code: "class_migrating",
                ..
            } => 503,
            E::ClassMigration { .. } | E::Refused { .. } => 409,
            E::ReplyExpired => 504,
            E::InvalidComponent(_)
            | E::InvalidManifest(_)
            | E::LimitAboveCeiling { .. }
            | E::CompileTimeout { .. }
            | E::CompileMemoryExceeded { .. } => 422,
            E::ComponentTooLarge { .. } => 413,
            E::QuotaExceeded { .. } => 507,
            // A guest may fail an event with one of these codes to say the
            // request was at fault; the event is rolled back all the same.
            E::Guest { code, .. } if code == "bad_request" => 400,
            E::Guest { code, .. } if code == "not_found" => 404,
            E::Guest { code, .. } if code == "conflict" => 409,
            // The actor failed the event: its writes were rolled back.
            E::Guest { .. }
            | E::Trap(_)
            | E::CpuTimeExceeded { .. }
            | E::MemoryExceeded { .. }
            | E::ResponseTooLarge { .. }
            | E::ResponseHeadersTooLarge { .. } => 500,
            // Tenants together hold the node's memory: retry later.
            E::Store(s) if s.code() == "node_memory_exhausted" => 503,
            E::Store(s) if s.is_guest_fault() => 400,
            E::Store(_) | E::Internal(_) => 500,
        }
    }

    /// The message the edge answers this error with. An actor's error
    /// whose code is the answer's (one the host gave it, passed on) says
    /// whose it is without repeating the code; any other code of an
    /// actor's stays in the message, the answer's code being
    /// `guest_error`.
    pub fn edge_message(&self) -> String {
        match self {
            RuntimeError::Guest { code, message } if *code == self.code() => {
                format!("the actor failed: {message}")
            }
            e => e.to_string(),
        }
    }
}

fn is_store_code(code: &str) -> bool {
    matches!(
        code,
        "value_too_large"
            | "key_too_large"
            | "statement_too_large"
            | "too_many_parameters"
            | "result_too_large"
            | "database_full"
            | "quota_exceeded"
            | "stack_exhausted"
            | "forbidden"
            | "memory_exceeded"
            | "temp_storage_exceeded"
            | "sql_error"
            | "invalid_argument"
            | "storage_error"
            | "storage_corrupt"
            | "storage_busy"
            // The outbox's refusals (ADR 0040).
            | "outbox_full"
            | "host_not_allowed"
            | "invalid_url"
            | "invalid_name"
            // The parked replies' and sockets' refusals (ADR 0042, 0043).
            | "reply_not_found"
            | "too_many_parked"
            | "not_an_upgrade"
            | "too_many_sockets"
            // The cron import's refusal (issue 36).
            | "invalid_cron"
            // The bookmarks' refusals (issue 36).
            | "no_bucket"
            | "invalid_bookmark"
            | "bookmark_not_found"
            | "too_many_restores"
            | "socket_not_found"
            // The SDKs' schema migrations (issue 38): one failed, the
            // event rolled back, the actor is on its old schema.
            | "migration_failed"
            // Request-shaped failures a guest may choose (see the SDK).
            | "bad_request"
            | "not_found"
            | "conflict"
    )
}

fn version_missing(app: &str, version: u64) -> String {
    let kept = "`wasmkeep versions` lists the kept ones; app_versions_max sets how many";
    if version == 0 {
        format!("{app} keeps no version before its current one ({kept})")
    } else {
        format!("version {version} of {app} is not kept ({kept})")
    }
}
