//! The host side of the `wasmkeep:actor` world: what a guest's imports do.
//!
//! One [`HostState`] lives in each instance's wasmtime `Store`, and owns the
//! actor's open database for as long as the instance lives. Every import
//! runs inside the event's savepoint, so whatever it changes commits or rolls
//! back with the event.

use std::sync::Arc;

use wasmkeep_store::{ActorDb, ActorId, AlarmState, StoreError, memory_budget};
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::clock::Clock;
use crate::log_budget::LogBudget;
use crate::warm::AlarmStatements;

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "node",
});

/// The optional `inbox` export (ADR 0040): looked up apart, since apps
/// built before it do not have it.
pub(crate) mod inbox_exports {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "inbox-exports",
        // The same types as the node's bindings, not a copy.
        with: { "wasmkeep:actor/types": crate::host::wasmkeep::actor::types },
    });
    pub(crate) use exports::wasmkeep::actor::inbox;
}

/// The optional `socket-handler` export (ADR 0043).
pub(crate) mod socket_exports {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "socket-exports",
        with: {
            "wasmkeep:actor/types": crate::host::wasmkeep::actor::types,
            "wasmkeep:actor/sockets": crate::host::wasmkeep::actor::sockets,
        },
    });
}

/// What a node binds of an app: every import, and `handler`.
pub(crate) type Actor = Node;
pub(crate) type ActorPre<T> = NodePre<T>;
pub(crate) type ActorIndices = NodeIndices;

pub(crate) use wasmkeep::actor::types::{AlarmInfo, Error as WitError, Request};
use wasmkeep::actor::{alarm, clock, cron, identity, kv, log, sql, types};

/// What the guest did to its alarm in the current event: the retry rule
/// needs it after a failed `on-alarm` run's own changes are rolled back,
/// and a traced event that set an alarm is what the alarm's run links to
/// (ADR 0064).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AlarmOp {
    /// The handler never called set-alarm or delete-alarm.
    #[default]
    Untouched,
    /// The handler's last call set the alarm to this time.
    Set(u64),
    /// The handler's last call cleared it.
    Cleared,
}

/// What the runtime counts a table element as, in bytes (a reference).
pub(crate) const TABLE_ELEMENT_BYTES: usize = 8;

/// Caps what an instance holds in memory: all its linear memories and
/// tables together (a component may have several of each), within the
/// instance's own bound and the node's budget for all tenants
/// (`memory_budget`), and remembers that it tried to grow past either, so
/// the trap that follows is reported as what it is.
pub struct MemoryCap {
    pub bytes_max: usize,
    pub exceeded: bool,
    /// The refusal came from the node's budget, not the instance's bound.
    pub node_refused: bool,
    /// Bytes of all memories and tables, as grown so far; reserved in the
    /// node's budget until the instance is dropped.
    pub held: usize,
}

impl MemoryCap {
    pub fn new(bytes_max: usize) -> MemoryCap {
        MemoryCap {
            bytes_max,
            exceeded: false,
            node_refused: false,
            held: 0,
        }
    }

    fn grow(&mut self, more: usize) -> bool {
        let total = self.held.saturating_add(more);
        if total > self.bytes_max {
            self.exceeded = true;
            return false;
        }
        if !memory_budget::reserve_guest(more as u64) {
            self.exceeded = true;
            self.node_refused = true;
            return false;
        }
        self.held = total;
        true
    }
}

impl Drop for MemoryCap {
    fn drop(&mut self) {
        memory_budget::release_guest(self.held as u64);
    }
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(desired.saturating_sub(current)))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let more = desired.saturating_sub(current);
        Ok(self.grow(more.saturating_mul(TABLE_ELEMENT_BYTES)))
    }
}

/// Why a guest statement was stopped in this event (see `sql_stopped`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlStopped {
    /// The event's deadline passed.
    Deadline,
    /// The node is stopping.
    Stopping,
}

/// The guest's WASI wall clock is the node's clock, so a test kit that
/// controls time controls `std::time::SystemTime` inside guests too.
struct WallClock(Arc<dyn Clock>);

impl wasmtime_wasi::HostWallClock for WallClock {
    fn resolution(&self) -> std::time::Duration {
        std::time::Duration::from_millis(1)
    }
    fn now(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.0.now_ms())
    }
}

/// The monotonic clock follows the node's clock too (in nanoseconds).
struct MonotonicClock(Arc<dyn Clock>);

impl wasmtime_wasi::HostMonotonicClock for MonotonicClock {
    fn resolution(&self) -> u64 {
        1_000_000
    }
    fn now(&self) -> u64 {
        self.0.now_ms().saturating_mul(1_000_000)
    }
}

/// Everything an instance's imports reach.
pub struct HostState {
    /// The actor's database; `None` only while the instance is being torn
    /// down and the database handed to a new one.
    pub db: Option<ActorDb>,
    pub id: ActorId,
    /// The guest's clock: the node's, standing still during an event
    /// that records or replays (`tape`).
    pub clock: Arc<dyn Clock>,
    /// What the guest reads time and randomness through (ADR 0062).
    pub(crate) tape: crate::guest_tape::InstanceTape,
    pub wasi: WasiCtx,
    pub table: ResourceTable,
    pub memory: MemoryCap,
    /// The event being run is traced: each statement it runs is noted
    /// (ADR 0064).
    pub trace: Option<Arc<crate::trace::EventTrace>>,
    /// Set while `on-alarm` runs.
    pub in_alarm: bool,
    /// Where the statements `on-alarm` runs are learned for the class.
    pub alarm_statements: Option<Arc<AlarmStatements>>,
    pub alarm_op: AlarmOp,
    /// A failed `on-alarm` run re-armed its alarm: `(from, to)`, the due
    /// time it ran for and its retry's (`None`: dropped). Its trace link
    /// follows when the batch commits (ADR 0064).
    pub alarm_retried: Option<(u64, Option<u64>)>,
    /// The last panic message the guest's SDK reported in this event.
    pub panic_message: Option<String>,
    /// The guest's log lines go to the node's log under this target.
    pub log_enabled: bool,
    /// What the running call may still log (`event_log_lines_max`,
    /// `event_log_bytes_max`); `finish_call` reports what it dropped.
    pub log_budget: LogBudget,
    /// A failure of an import that cannot report errors (delete-alarm):
    /// the event fails with it even if the handler returns `ok`.
    pub poison: Option<WitError>,
    /// A statement's error that made SQLite abandon the whole transaction
    /// (a full database, the tenant's quota, an I/O error): the event
    /// cannot commit, whatever the guest made of the error, and fails
    /// with it.
    pub tx_lost: Option<WitError>,
    /// A guest statement was stopped (deadline, or the node stopping): the
    /// event fails with that even if the guest carries on.
    pub sql_stopped: Option<SqlStopped>,
    /// The response the running `on-request` call builds.
    pub response: crate::response::ResponseParts,
    /// What `outbox` checks sends against (the node's bounds, the app's
    /// outbound policy).
    pub outbox: crate::outbox::OutboxSettings,
    /// A send ran in this batch (committed or not): after the commit the
    /// turn reads the outbox for rows to hand over.
    pub outbox_sent: bool,
    /// Unsafe, for its test only (`Faults::unsafe_outbox_before_commit`):
    /// copies of the rows sent, handed over before the commit.
    pub sent_before_commit: Option<Vec<wasmkeep_store::OutboxRow>>,
    /// The app's variables and secrets (`config.get`).
    pub config: crate::app_config::InstanceConfig,
    /// The node's parked replies (`None` in the instance a deploy makes).
    pub parked: Option<Arc<dyn crate::replies::Tickets>>,
    /// What the running event parked and completed (ADR 0042).
    pub replies: crate::replies::ReplyOps,
    /// The node's `response_body_bytes_max` (a completed reply's body).
    pub response_body_bytes_max: usize,
    /// The node's sockets (`None` in the instance a deploy makes).
    pub sockets: Option<Arc<crate::sockets::SocketTable>>,
    /// What the running event sends and closes, applied once durable.
    pub socket_ops: Vec<crate::sockets::SocketOp>,
    /// The socket the running request accepted.
    pub socket_accepted: Option<crate::sockets::Accepted>,
    /// Sockets accepted by earlier events of the running batch.
    pub sockets_accepted_in_batch: usize,
    /// The running request asks for a WebSocket upgrade.
    pub request_is_upgrade: bool,
    /// The node has a bucket (bookmarks name what it keeps).
    pub bucket: bool,
    /// The restore the running event asked for (`bookmarks`).
    pub restore: Option<crate::bookmarks::PendingRestore>,
    /// Bytes the running event sent to sockets (its budget).
    pub socket_sent_bytes: usize,
    /// Where the guest's lines go besides the node's log, for `wasmkeep
    /// logs` (`None` in the instance a deploy makes).
    pub logs: Option<Arc<crate::logs::LogHub>>,
    /// The running handler's waits (ADR 0056): `None` while a handler
    /// that may not wait runs.
    pub(crate) awaits: Option<crate::awaits::EventAwaits>,
    /// The time and seed the running event's guest sees, when its app
    /// may wait (what a suspended event runs again with).
    pub(crate) await_tape: Option<crate::guest_tape::EventTape>,
}

impl HostState {
    pub fn new(
        db: Option<ActorDb>,
        id: ActorId,
        clock: Arc<dyn Clock>,
        memory_bytes_max: usize,
    ) -> Self {
        // No preopened directories, no environment, no arguments, no
        // sockets: a guest reaches the world only through wasmkeep's imports.
        let tape = crate::guest_tape::InstanceTape::new(clock);
        let clock: Arc<dyn Clock> = tape.clock.clone();
        let wasi = WasiCtx::builder()
            .wall_clock(WallClock(Arc::clone(&clock)))
            .monotonic_clock(MonotonicClock(Arc::clone(&clock)))
            .secure_random(tape.random.clone())
            .insecure_random(tape.random.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        HostState {
            db,
            id,
            clock,
            tape,
            wasi,
            table: ResourceTable::new(),
            memory: MemoryCap::new(memory_bytes_max),
            in_alarm: false,
            trace: None,
            alarm_statements: None,
            alarm_op: AlarmOp::Untouched,
            alarm_retried: None,
            panic_message: None,
            log_enabled: true,
            log_budget: LogBudget::default(),
            poison: None,
            tx_lost: None,
            sql_stopped: None,
            response: Default::default(),
            outbox: Default::default(),
            outbox_sent: false,
            sent_before_commit: None,
            config: Default::default(),
            parked: None,
            replies: Default::default(),
            response_body_bytes_max: 0,
            sockets: None,
            socket_ops: Vec::new(),
            socket_accepted: None,
            sockets_accepted_in_batch: 0,
            request_is_upgrade: false,
            bucket: false,
            restore: None,
            socket_sent_bytes: 0,
            logs: None,
            awaits: None,
            await_tape: None,
        }
    }

    /// Records a statement that ran, if it ran in `on-alarm`.
    fn learn(&self, sql: &str) {
        if self.in_alarm
            && let Some(s) = &self.alarm_statements
        {
            s.note(sql);
        }
    }

    /// Turns a store error into the guest's, remembering a stopped
    /// statement for the event's outcome.
    fn store_err(&mut self, e: StoreError) -> WitError {
        match e {
            StoreError::DeadlineExceeded => self.sql_stopped = Some(SqlStopped::Deadline),
            StoreError::Stopping => self.sql_stopped = Some(SqlStopped::Stopping),
            _ => {}
        }
        let lost = matches!(
            e,
            StoreError::DatabaseFull { .. } | StoreError::QuotaExceeded { .. } | StoreError::Io(_)
        ) && !self.db.as_ref().is_some_and(ActorDb::in_transaction);
        let err = wit_err(e);
        if lost {
            self.tx_lost.get_or_insert_with(|| err.clone());
        }
        err
    }

    /// The database for a host call, or an error: for the one instance
    /// that has none (the one a deploy creates to ask the component for
    /// its classes), and for a call made with less native stack left than
    /// SQLite is guaranteed ([`guest_db`]).
    pub(crate) fn db(&mut self) -> Result<&mut ActorDb, WitError> {
        guest_db(&mut self.db)
    }
}

/// `db` for a guest's host call: every call that reaches SQLite comes
/// through here, and is refused (`stack_exhausted`) when the guest's own
/// frames left less native stack than `wasmkeep_store::stack` guarantees
/// SQLite. Workers are sized so that no wasm stack can get there
/// (`WORKER_STACK_BYTES`); the check holds whatever thread runs the guest.
fn guest_db(db: &mut Option<ActorDb>) -> Result<&mut ActorDb, WitError> {
    wasmkeep_store::stack::check().map_err(wit_err)?;
    db.as_mut().ok_or_else(|| WitError {
        code: "invalid_argument".into(),
        message: "no database while the app is being deployed".into(),
    })
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

fn wit_err(e: StoreError) -> WitError {
    WitError {
        code: e.code().to_owned(),
        message: e.to_string(),
    }
}

fn to_store_value(v: types::Value) -> wasmkeep_store::Value {
    match v {
        types::Value::Null => wasmkeep_store::Value::Null,
        types::Value::Integer(i) => wasmkeep_store::Value::Integer(i),
        types::Value::Real(f) => wasmkeep_store::Value::Real(f),
        types::Value::Text(s) => wasmkeep_store::Value::Text(s),
        types::Value::Blob(b) => wasmkeep_store::Value::Blob(b),
    }
}

fn to_wit_value(v: wasmkeep_store::Value) -> types::Value {
    match v {
        wasmkeep_store::Value::Null => types::Value::Null,
        wasmkeep_store::Value::Integer(i) => types::Value::Integer(i),
        wasmkeep_store::Value::Real(f) => types::Value::Real(f),
        wasmkeep_store::Value::Text(s) => types::Value::Text(s),
        wasmkeep_store::Value::Blob(b) => types::Value::Blob(b),
    }
}

/// Links the world's imports: the generated bindings' interfaces, and
/// `response` by hand (`crate::response`).
pub(crate) fn add_to_linker(
    linker: &mut wasmtime::component::Linker<HostState>,
) -> wasmtime::Result<()> {
    use wasmtime::component::HasSelf;
    types::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    sql::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    kv::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    alarm::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    identity::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    clock::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    cron::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    wasmkeep::actor::bookmarks::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    log::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    wasmkeep::actor::outbox::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    wasmkeep::actor::config::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    wasmkeep::actor::replies::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    wasmkeep::actor::sockets::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    wasmkeep::actor::awaits::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    crate::response::add_to_linker(linker)
}

impl types::Host for HostState {}

impl sql::Host for HostState {
    fn database_size(&mut self) -> u64 {
        // Between statements of the guest's own event: its connection is
        // there; a failure to read reads as 0, never as a trap.
        self.db()
            .ok()
            .and_then(|db| db.size_bytes().ok())
            .unwrap_or(0)
    }

    fn query(
        &mut self,
        statement: String,
        params: Vec<types::Value>,
    ) -> Result<sql::QueryResult, WitError> {
        let params: Vec<_> = params.into_iter().map(to_store_value).collect();
        let started = self.trace.is_some().then(crate::clock::instant);
        let r = self.db()?.query(&statement, &params);
        if let (Some(t), Some(s)) = (&self.trace, started) {
            t.sql(&statement, s, crate::clock::instant());
        }
        let r = r.map_err(|e| self.store_err(e))?;
        self.learn(&statement);
        Ok(sql::QueryResult {
            columns: r.columns,
            rows: r
                .rows
                .into_iter()
                .map(|row| row.into_iter().map(to_wit_value).collect())
                .collect(),
            rows_read: r.rows_read,
            rows_written: r.rows_written,
        })
    }

    fn execute(
        &mut self,
        statement: String,
        params: Vec<types::Value>,
    ) -> Result<sql::ExecResult, WitError> {
        let params: Vec<_> = params.into_iter().map(to_store_value).collect();
        let started = self.trace.is_some().then(crate::clock::instant);
        let r = self.db()?.execute(&statement, &params);
        if let (Some(t), Some(s)) = (&self.trace, started) {
            t.sql(&statement, s, crate::clock::instant());
        }
        let r = r.map_err(|e| self.store_err(e))?;
        self.learn(&statement);
        Ok(sql::ExecResult {
            rows_written: r.rows_written,
            last_insert_rowid: r.last_insert_rowid,
        })
    }
}

impl kv::Host for HostState {
    fn get(&mut self, key: String) -> Result<Option<Vec<u8>>, WitError> {
        self.db()?.kv_get(&key).map_err(wit_err)
    }

    fn put(&mut self, key: String, value: Vec<u8>) -> Result<(), WitError> {
        self.db()?.kv_put(&key, &value).map_err(wit_err)
    }

    fn delete(&mut self, key: String) -> Result<bool, WitError> {
        self.db()?.kv_delete(&key).map_err(wit_err)
    }

    fn list(&mut self, o: kv::ListOptions) -> Result<Vec<(String, Vec<u8>)>, WitError> {
        let o = wasmkeep_store::KvListOptions {
            prefix: o.prefix,
            start: o.start,
            end: o.end,
            limit: o.limit,
            reverse: o.reverse,
        };
        self.db()?.kv_list(&o).map_err(wit_err)
    }

    fn delete_prefix(&mut self, prefix: String) -> Result<u64, WitError> {
        self.db()?.kv_delete_prefix(&prefix).map_err(wit_err)
    }
}

/// Latest alarm time a guest may set: year 9999, so that every key format
/// and timer that holds it stays in range (15 digits of milliseconds).
pub(crate) const ALARM_AT_MS_MAX: u64 = 253_402_300_799_999;

impl alarm::Host for HostState {
    fn set_alarm(&mut self, at_ms: u64) -> Result<(), WitError> {
        if at_ms > ALARM_AT_MS_MAX {
            return Err(WitError {
                code: "invalid_argument".into(),
                message: format!(
                    "alarm time out of range: at_ms={at_ms} limit alarm_at_ms_max={ALARM_AT_MS_MAX}"
                ),
            });
        }
        self.alarm_op = AlarmOp::Set(at_ms);
        // A new time set by the app starts a fresh backoff.
        self.db()?
            .set_alarm(Some(AlarmState {
                at_ms,
                retry_count: 0,
            }))
            .map_err(wit_err)
    }

    fn get_alarm(&mut self) -> Option<u64> {
        if self.in_alarm {
            return match self.alarm_op {
                AlarmOp::Set(at) => Some(at),
                AlarmOp::Untouched | AlarmOp::Cleared => None,
            };
        }
        let db = self.db().ok()?;
        db.alarm().ok().flatten().map(|a| a.at_ms)
    }

    fn delete_alarm(&mut self) {
        self.alarm_op = AlarmOp::Cleared;
        let r = self.db().and_then(|db| db.set_alarm(None).map_err(wit_err));
        if let Err(e) = r {
            self.poison = Some(e);
        }
    }
}

impl identity::Host for HostState {
    fn id(&mut self) -> identity::ActorId {
        identity::ActorId {
            tenant: self.id.tenant.clone(),
            app: self.id.app.clone(),
            class: self.id.class.clone(),
            name: self.id.name.clone(),
        }
    }

    fn unique_id(&mut self) -> Result<String, WitError> {
        let mut raw = [0u8; 16];
        // The thread's generator (seeded by the OS), or the event's when
        // it records or replays (ADR 0062).
        self.tape.random.fill(&mut raw);
        Ok(hex::encode(raw))
    }
}

impl clock::Host for HostState {
    fn now_ms(&mut self) -> u64 {
        self.clock.now_ms()
    }
}

impl cron::Host for HostState {
    fn next_after(
        &mut self,
        expression: String,
        zone: String,
        after_ms: u64,
    ) -> Result<u64, WitError> {
        crate::cron::next_after(&expression, &zone, after_ms).map_err(|e| WitError {
            code: "invalid_cron".into(),
            message: e.0,
        })
    }
}

impl log::Host for HostState {
    fn log(&mut self, level: log::Level, message: String) {
        // A secret's value never reaches the node's log.
        // Cut to the longest line kept (`logs::LINE_BYTES_MAX`), marked.
        let message = self.config.scrub(message);
        let message = match crate::logs::clip(&message, crate::logs::LINE_BYTES_MAX) {
            std::borrow::Cow::Borrowed(_) => message,
            std::borrow::Cow::Owned(cut) => cut,
        };
        if let Some(panic) = message.strip_prefix("panic: ") {
            self.panic_message = Some(panic.to_owned());
        }
        if !self.log_enabled {
            return;
        }
        // After the panic message is kept: a guest that spent its budget
        // still has its panic reported.
        if !self.log_budget.admit(message.len()) {
            return;
        }
        let actor = &self.id;
        match level {
            log::Level::Trace => tracing::trace!(target: "guest", %actor, "{message}"),
            log::Level::Debug => tracing::debug!(target: "guest", %actor, "{message}"),
            log::Level::Info => tracing::info!(target: "guest", %actor, "{message}"),
            log::Level::Warn => tracing::warn!(target: "guest", %actor, "{message}"),
            log::Level::Error => tracing::error!(target: "guest", %actor, "{message}"),
        }
        if let Some(hub) = &self.logs {
            use crate::logs::Level;
            let level = match level {
                log::Level::Trace => Level::Trace,
                log::Level::Debug => Level::Debug,
                log::Level::Info => Level::Info,
                log::Level::Warn => Level::Warn,
                log::Level::Error => Level::Error,
            };
            let at_ms = self.clock.now_ms();
            let source = crate::logs::Source::Guest;
            hub.push(crate::logs::LogLine::new(
                at_ms,
                level,
                source,
                self.id.clone(),
                message,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1024 * 1024;

    #[test]
    fn the_instance_bound_covers_all_its_memories_and_tables_together() {
        let mut cap = MemoryCap::new(128 * MIB);
        // Two memories of 60 MiB fit; a third of 10 MiB does not, although
        // each alone is far under the bound (a per-memory cap let a
        // component with many memories hold many times the bound).
        assert!(cap.memory_growing(0, 60 * MIB, None).unwrap());
        assert!(cap.memory_growing(0, 60 * MIB, None).unwrap());
        assert!(!cap.memory_growing(0, 10 * MIB, None).unwrap());
        assert!(cap.exceeded && !cap.node_refused);
        // Tables count too, at TABLE_ELEMENT_BYTES an element.
        let mut cap = MemoryCap::new(MIB);
        assert!(cap.table_growing(0, 1000, None).unwrap());
        assert!(
            !cap.table_growing(1000, MIB / TABLE_ELEMENT_BYTES + 1, None)
                .unwrap()
        );
    }

    #[test]
    fn a_host_call_with_less_stack_left_than_sqlite_is_guaranteed_is_refused() {
        use wasmkeep_store::stack::SQL_STACK_BYTES_MIN;
        let call = |stack: usize| {
            std::thread::Builder::new()
                .stack_size(stack)
                .spawn(|| {
                    let dir = tempfile::tempdir().unwrap();
                    let limits = wasmkeep_store::StoreLimits::default();
                    let mut db =
                        ActorDb::open(dir.path(), &limits, wasmkeep_store::OpenMode::Create)
                            .unwrap();
                    guest_db(&mut db).map(|_| ()).map_err(|e| e.code)
                })
                .unwrap()
                .join()
                .unwrap()
        };
        assert_eq!(
            call(SQL_STACK_BYTES_MIN / 2),
            Err("stack_exhausted".to_string())
        );
        assert_eq!(call(crate::runtime::WORKER_STACK_BYTES), Ok(()));
    }

    #[test]
    fn what_an_instance_reserved_is_given_back_when_it_is_dropped() {
        let before = memory_budget::guest_bytes();
        let mut cap = MemoryCap::new(usize::MAX);
        assert!(cap.memory_growing(0, 300 * MIB, None).unwrap());
        assert!(memory_budget::guest_bytes() >= before + 300 * MIB as u64);
        drop(cap);
        // Other tests' instances come and go meanwhile: what this one held
        // is gone, whatever they hold.
        assert!(memory_budget::guest_bytes() < before + 300 * MIB as u64);
    }
}
