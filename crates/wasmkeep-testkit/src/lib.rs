//! Test your wasmkeep actors against the real runtime, in-process.
//!
//! A [`TestNode`] is a real wasmkeep runtime (wasmtime, your component, real
//! SQLite files in a fresh temporary folder) whose clock stands still until
//! the test moves it. Nothing is faked: requests go through the same queue,
//! transaction and durability code as in production, reads of the database
//! go through a separate SQLite connection and hand back copies, and alarms
//! fire through the same delivery code when [`TestNode::advance`] reaches
//! them.
//!
//! ```ignore
//! use wasmkeep_testkit::TestNode;
//!
//! let node = TestNode::new();
//! node.deploy("acme/shop", &std::fs::read("target/wasm32-wasip2/release/shop.wasm")?)?;
//! let cart = node.actor("acme/shop/cart/alice");
//! assert_eq!(cart.post("/add?item=apple", "").status, 200);
//! node.advance(std::time::Duration::from_secs(60)); // runs alarms due by then
//! ```
//!
//! Each node has its own data folder and runtime, so tests run in parallel
//! and share nothing. What it is not: a mock of the runtime, or a network
//! server (use the `wasmkeep` binary for that).

use std::sync::Arc;
use std::time::Duration;

pub use wasmkeep_build::{WASM_TARGET, build_component, build_component_at};

use tempfile::TempDir;
use wasmkeep_runtime::actor::DbAccess;
use wasmkeep_runtime::{ActorRequest, Clock, ManualClock, Runtime};

/// The runtime's types a test may need to name, so a test crate needs no
/// other wasmkeep dependency.
pub use wasmkeep_runtime::{
    ActorId, AppInfo, Durability, RuntimeConfig, RuntimeError, StoreLimits, StoreValue,
    memory_budget,
};

/// The time a node's clock starts at: 2026-01-01T00:00:00Z.
pub const START_MS: u64 = 1_767_225_600_000;

/// Alarms one [`TestNode::advance`] runs before it decides a handler
/// re-arms itself for ever.
pub const ADVANCE_ALARMS_MAX: usize = wasmkeep_runtime::TEST_CLOCK_ROUNDS_MAX;

/// A response from an actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The WebSocket the request's event accepted, if it did.
    pub socket: Option<u64>,
}

impl TestResponse {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON (panics with the body if it is not JSON).
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).or_panic(|e| format!("not JSON ({e}): {}", self.text()))
    }
}

/// How long [`TestNode::settle_outbox`] waits.
pub const OUTBOX_SETTLE_MS: u64 = 30_000;

/// A wasmkeep node in this process, with a manual clock.
pub struct TestNode {
    rt: Runtime,
    clock: Arc<ManualClock>,
    config: RuntimeConfig,
    dir: TempDir,
    exec: tokio::runtime::Runtime,
}

impl Default for TestNode {
    fn default() -> Self {
        Self::new()
    }
}

impl TestNode {
    /// A node with default settings and a fresh data folder.
    #[track_caller]
    pub fn new() -> TestNode {
        Self::with_config(|_| {})
    }

    /// A node whose runtime settings `f` may change (limits, retries, ...).
    #[track_caller]
    pub fn with_config(f: impl FnOnce(&mut RuntimeConfig)) -> TestNode {
        let dir = tempfile::tempdir().expect("create a data folder");
        let mut config = RuntimeConfig::new(dir.path());
        // Small pools: many test nodes may live in one process at once.
        config.instances_max = 64;
        config.workers = 2;
        config.compile_cache_dir = Some(std::env::temp_dir().join("wasmkeep-testkit-cache"));
        // Every test node shares one key, so that code one compiled and
        // tagged is loaded by the others (a node's own key would make each
        // compile everything again).
        config.compile_cache_key_path =
            Some(std::env::temp_dir().join("wasmkeep-testkit-cache.key"));
        f(&mut config);
        config.data_dir = dir.path().to_owned();
        let clock = Arc::new(ManualClock::new(START_MS));
        let rt = Runtime::start(config.clone(), Arc::clone(&clock) as Arc<dyn Clock>)
            .expect("start the runtime");
        let exec = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime for blocking calls");
        TestNode {
            rt,
            clock,
            config,
            dir,
            exec,
        }
    }

    /// Deploys a component as `tenant/app`.
    #[track_caller]
    pub fn deploy(&self, tenant_app: &str, wasm: &[u8]) -> Result<AppInfo, RuntimeError> {
        self.deploy_with_manifest(tenant_app, wasm, "")
    }

    /// Deploys with a TOML manifest (`[alarms]`, `[limits]`).
    #[track_caller]
    pub fn deploy_with_manifest(
        &self,
        tenant_app: &str,
        wasm: &[u8],
        manifest: &str,
    ) -> Result<AppInfo, RuntimeError> {
        let (tenant, app) = tenant_app
            .split_once('/')
            .unwrap_or_else(|| panic!("expected tenant/app, got `{tenant_app}`"));
        self.rt.deploy(tenant, app, wasm, manifest)
    }

    /// A handle to the actor `tenant/app/class/name` (the name may contain
    /// slashes).
    #[track_caller]
    pub fn actor(&self, address: &str) -> ActorHandle<'_> {
        let parts: Vec<&str> = address.splitn(4, '/').collect();
        assert_eq!(
            parts.len(),
            4,
            "expected tenant/app/class/name, got `{address}`"
        );
        let id = ActorId::new(parts[0], parts[1], parts[2], parts[3]).or_panic(|e| format!("{e}"));
        ActorHandle { node: self, id }
    }

    /// The node's clock, unix milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Moves the clock forward by `by`, running every alarm that comes due
    /// on the way, in due order, each at its own time, expiring parked
    /// replies as their deadlines pass (their callers get `reply_expired`)
    /// and ending the waits of suspended events whose deadlines pass (ADR
    /// 0056: the handler runs again and sees `await_timeout`).
    /// Returns how many alarm handlers succeeded.
    #[track_caller]
    pub fn advance(&self, by: Duration) -> usize {
        self.advance_to(self.now_ms() + by.as_millis() as u64)
    }

    /// Like [`TestNode::advance`], to an absolute time.
    #[track_caller]
    pub fn advance_to(&self, target_ms: u64) -> usize {
        self.exec
            .block_on(self.rt.advance_test_clock(&self.clock, target_ms))
            .or_panic(|e| format!("{e}"))
    }

    /// Runs the alarms due at the current time (a past alarm fires "at
    /// once": this is that moment).
    pub fn run_due_alarms(&self) -> usize {
        self.exec.block_on(self.rt.alarms().run_due())
    }

    /// Stops the node and starts it again on the same data folder, like a
    /// process restart: instances, queues and timers are dropped; the
    /// databases and deployed apps stay, and alarms are read back from disk.
    #[track_caller]
    pub fn restart(&mut self) {
        self.restart_with_config(|_| {});
    }

    /// Like [`TestNode::restart`], with the node down for `down` first:
    /// the clock moves on and nothing runs meanwhile (no alarm, no
    /// delivery), as when a machine is off. Alarms that fell due while it
    /// was down fire at the restart, late (run them with
    /// [`TestNode::run_due_alarms`] or any `advance`).
    #[track_caller]
    pub fn restart_after(&mut self, down: Duration) {
        self.rt.shutdown(Duration::from_secs(10));
        self.clock.advance_ms(down.as_millis() as u64);
        self.restart_with_config(|_| {});
    }

    /// Like [`TestNode::restart`], with settings `f` changes first (an
    /// operator changing the node's configuration between two runs).
    #[track_caller]
    pub fn restart_with_config(&mut self, f: impl FnOnce(&mut RuntimeConfig)) {
        f(&mut self.config);
        self.config.data_dir = self.dir.path().to_owned();
        self.rt.shutdown(Duration::from_secs(10));
        self.rt = Runtime::start(
            self.config.clone(),
            Arc::clone(&self.clock) as Arc<dyn Clock>,
        )
        .expect("restart the runtime");
    }

    /// The next `n` batches that run an alarm fail to commit (the handler's
    /// writes and the alarm's removal are lost; the alarm fires again).
    pub fn fail_next_alarm_commits(&self, n: u32) {
        self.rt
            .faults()
            .fail_alarm_commits
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// The next `n` batches that carry a request (usually: the next `n`
    /// requests) commit, then lose their response as if the process died
    /// before answering. Alarm runs do not use it up. Applies to the whole
    /// node.
    pub fn crash_after_commit(&self, n: u32) {
        self.rt
            .faults()
            .crash_after_commit
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Waits (in real time, up to `OUTBOX_SETTLE_MS`) until every message
    /// and call actors sent was delivered and its answer applied: the
    /// outbox's dispatcher holds nothing and no actor has queued events.
    /// Deliveries run on the node's own threads, whatever the test clock
    /// says. Panics if they do not settle.
    #[track_caller]
    pub fn settle_outbox(&self) {
        let deadline = wasmkeep_runtime::clock::instant() + Duration::from_millis(OUTBOX_SETTLE_MS);
        let mut quiet = 0;
        while quiet < 3 {
            if wasmkeep_runtime::clock::instant() > deadline {
                panic!(
                    "the outbox did not settle within {OUTBOX_SETTLE_MS} ms: {} rows still in delivery",
                    self.rt.outbox().pending()
                );
            }
            if self.rt.outbox().pending() == 0 && !self.rt.busy() {
                quiet += 1;
            } else {
                quiet = 0;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Holds (`true`) or lets go (`false`) every delivery of the outbox:
    /// what actors send meanwhile waits, as if the network were down.
    pub fn hold_outbox(&self, held: bool) {
        self.rt
            .faults()
            .outbox_held
            .store(held, std::sync::atomic::Ordering::SeqCst);
    }

    /// The runtime underneath, for anything this API does not cover.
    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// The node's data folder (deleted with the node).
    pub fn data_dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.rt.shutdown(Duration::from_secs(5));
    }
}

/// One actor of a [`TestNode`].
pub struct ActorHandle<'a> {
    node: &'a TestNode,
    id: ActorId,
}

/// A WebSocket the test holds (see [`ActorHandle::websocket`]).
pub struct TestSocket<'a> {
    node: &'a TestNode,
    actor: ActorId,
    socket: u64,
    conn: wasmkeep_runtime::sockets::Connection,
}

/// What a [`TestSocket`] receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketReceived {
    Text(String),
    Binary(Vec<u8>),
    /// The actor or the node closed it, with this code and reason.
    Closed(u16, String),
}

impl TestSocket<'_> {
    /// The socket's id in the node's table.
    pub fn id(&self) -> u64 {
        self.socket
    }

    /// Sends a text message: an event of the actor (enqueued; it runs on
    /// the node's workers).
    pub fn send_text(&self, text: &str) -> Result<(), RuntimeError> {
        use wasmkeep_runtime::sockets::Message;
        self.node.rt.socket_event(
            &self.actor,
            wasmkeep_runtime::actor::SocketEvent::Message {
                id: self.socket,
                message: Message::Text(text.to_owned()),
                sent_as: None,
                trace: None,
            },
        )
    }

    /// The next message the actor sent this socket, waiting (in real time)
    /// up to `within`; `None` if nothing came.
    pub fn recv(&mut self, within: Duration) -> Option<SocketReceived> {
        use wasmkeep_runtime::sockets::Message;
        use wasmkeep_runtime::sockets::Outgoing;
        let got = self
            .node
            .exec
            .block_on(async { tokio::time::timeout(within, self.conn.rx.recv()).await })
            .ok()
            .flatten()?;
        Some(match got {
            Outgoing::Message(m) => {
                let (received, n) = match m.as_ref() {
                    Message::Text(t) => (SocketReceived::Text(t.clone()), t.len()),
                    Message::Binary(b) => (SocketReceived::Binary(b.clone()), b.len()),
                };
                self.conn
                    .queued
                    .fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
                received
            }
            Outgoing::Close(code, reason) => SocketReceived::Closed(code, reason),
        })
    }

    /// Closes the socket as its client would: the actor hears a close
    /// event with `code`.
    pub fn close(self, code: u16, reason: &str) {
        self.close_with(code, reason);
    }

    fn close_with(&self, code: u16, reason: &str) {
        if let Some(info) = self.node.rt.sockets().remove(&self.actor, self.socket) {
            let _ = self.node.rt.socket_event(
                &self.actor,
                wasmkeep_runtime::actor::SocketEvent::Closed {
                    info,
                    code,
                    reason: reason.to_owned(),
                },
            );
        }
    }
}

impl Drop for TestSocket<'_> {
    /// A socket the test drops goes away as a client's that disconnects
    /// (1006), rather than stay in the node's table.
    fn drop(&mut self) {
        self.close_with(1006, "the test dropped the socket");
    }
}

/// A row of a read-only query, as plain values.
pub type Row = Vec<StoreValue>;

impl<'a> ActorHandle<'a> {
    /// Sends a request, exactly as the HTTP edge would (path after the
    /// actor, with an optional `?query`).
    pub fn request(
        &self,
        method: &str,
        path_and_query: &str,
        body: impl Into<Vec<u8>>,
    ) -> Result<TestResponse, RuntimeError> {
        self.request_with_headers(method, path_and_query, &[], body)
    }

    /// Sends a request with headers.
    pub fn request_with_headers(
        &self,
        method: &str,
        path_and_query: &str,
        headers: &[(&str, &str)],
        body: impl Into<Vec<u8>>,
    ) -> Result<TestResponse, RuntimeError> {
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        let req = ActorRequest {
            method: method.to_uppercase(),
            path: if path.starts_with('/') {
                path.to_owned()
            } else {
                format!("/{path}")
            },
            query: query.to_owned(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
                .collect(),
            body: body.into(),
            replicated: headers
                .iter()
                .any(|(k, v)| k.eq_ignore_ascii_case("wasmkeep-durability") && *v == "replicated"),
            trace: None,
        };
        let r = self
            .node
            .exec
            .block_on(self.node.rt.request(self.id.clone(), req))?;
        Ok(TestResponse {
            status: r.status,
            headers: r.headers,
            body: r.body,
            socket: r.socket,
        })
    }

    /// `GET`, panicking on a runtime error (the actor failed the event).
    #[track_caller]
    pub fn get(&self, path: &str) -> TestResponse {
        self.request("GET", path, Vec::new())
            .or_panic(|e| format!("GET {path} on {}: {e}", self.id))
    }

    /// `POST`, panicking on a runtime error.
    #[track_caller]
    pub fn post(&self, path: &str, body: impl Into<Vec<u8>>) -> TestResponse {
        self.request("POST", path, body)
            .or_panic(|e| format!("POST {path} on {}: {e}", self.id))
    }

    /// `PUT`, panicking on a runtime error.
    #[track_caller]
    pub fn put(&self, path: &str, body: impl Into<Vec<u8>>) -> TestResponse {
        self.request("PUT", path, body)
            .or_panic(|e| format!("PUT {path} on {}: {e}", self.id))
    }

    /// Deletes the actor's data and alarm, as the admin API does; whether
    /// there was any.
    #[track_caller]
    pub fn delete_actor(&self) -> bool {
        self.node
            .exec
            .block_on(self.node.rt.delete_actor(self.id.clone()))
            .or_panic(|e| format!("delete {}: {e}", self.id))
    }

    /// Read-only SQL over the actor's committed database (internal tables
    /// included). Rows are copies.
    #[track_caller]
    pub fn sql(&self, statement: &str) -> Vec<Row> {
        self.node
            .rt
            .inspect_sql(&self.id, statement, usize::MAX)
            .or_panic(|e| format!("sql on {}: {e}", self.id))
            .rows
    }

    /// One integer from a read-only query (first row, first column).
    #[track_caller]
    pub fn sql_i64(&self, statement: &str) -> i64 {
        match self.sql(statement).first().and_then(|r| r.first()) {
            Some(StoreValue::Integer(i)) => *i,
            other => panic!("`{statement}` gave {other:?}, not an integer"),
        }
    }

    /// A key-value entry, as committed.
    #[track_caller]
    pub fn kv(&self, key: &str) -> Option<Vec<u8>> {
        let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
        let rows = self.sql(&format!(
            "SELECT value FROM _wasmkeep_kv WHERE key = x'{hex}'"
        ));
        rows.into_iter().next().map(|mut r| match r.remove(0) {
            StoreValue::Blob(b) => b,
            other => panic!("kv value is {other:?}"),
        })
    }

    /// The committed alarm (during retries: the next attempt).
    #[track_caller]
    pub fn alarm(&self) -> Option<u64> {
        match self.node.rt.actor_info(&self.id) {
            Ok(info) => info.alarm_ms,
            Err(RuntimeError::ActorNotFound(_)) => None,
            Err(e) => panic!("alarm of {}: {e}", self.id),
        }
    }

    /// How many attempts at the current alarm failed so far.
    pub fn alarm_retry_count(&self) -> u32 {
        self.node
            .rt
            .actor_info(&self.id)
            .map(|i| i.alarm_retry_count)
            .unwrap_or(0)
    }

    /// Runs the actor's pending alarm now, due or not; whether there was one.
    #[track_caller]
    pub fn run_alarm(&self) -> bool {
        self.node
            .exec
            .block_on(self.node.rt.alarms().run_now(&self.id))
            .or_panic(|e| format!("run_alarm on {}: {e}", self.id))
    }

    /// The statements prepared on the actor's open connection (a guest's
    /// with a `/*guest*/ ` mark in front); empty if the actor is not open.
    #[track_caller]
    pub fn prepared_statements(&self) -> Vec<String> {
        self.node
            .rt
            .with_db(&self.id, |db| match db {
                DbAccess::Open(db) => Ok(db.prepared_statements()),
                DbAccess::Closed(_) => Ok(Vec::new()),
            })
            .or_panic(|e| format!("prepared statements of {}: {e}", self.id))
    }

    /// Opens a WebSocket to the actor (ADR 0043): a `GET` of `path` asking
    /// for an upgrade, which the actor's handler accepts or not. The
    /// returned socket is the node's own (its table, its events), reached
    /// in process instead of over TCP; messages go to the actor as events,
    /// and what the actor's committed events send arrives in [`TestSocket::recv`].
    pub fn websocket(&self, path: &str) -> Result<TestSocket<'a>, RuntimeError> {
        let r = self.request_with_headers(
            "GET",
            path,
            &[("upgrade", "websocket"), ("connection", "upgrade")],
            "",
        )?;
        let Some(socket) = r.socket else {
            return Err(RuntimeError::Internal(format!(
                "the actor answered {} without accepting the WebSocket",
                r.status
            )));
        };
        let conn = self
            .node
            .rt
            .sockets()
            .connect(&self.id, socket)
            .ok_or_else(|| RuntimeError::Internal("the socket is gone".into()))?;
        Ok(TestSocket {
            node: self.node,
            actor: self.id.clone(),
            socket,
            conn,
        })
    }

    /// Whether the actor has any state on disk.
    pub fn exists(&self) -> bool {
        self.node.rt.actor_info(&self.id).is_ok()
    }

    /// The actor's address.
    pub fn id(&self) -> &ActorId {
        &self.id
    }
}

/// `Result::unwrap_or_else` with a panic that names the caller's line (the
/// test's, through `#[track_caller]` methods), not the test kit's.
trait OrPanic<T, E> {
    fn or_panic(self, message: impl FnOnce(E) -> String) -> T;
}

impl<T, E> OrPanic<T, E> for Result<T, E> {
    #[track_caller]
    fn or_panic(self, message: impl FnOnce(E) -> String) -> T {
        match self {
            Ok(v) => v,
            Err(e) => panic!("{}", message(e)),
        }
    }
}
