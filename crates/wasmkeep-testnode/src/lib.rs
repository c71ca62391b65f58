//! A wasmkeep node in a process of its own, for an actor crate's tests.
//!
//! [`TestNode::new`] starts the `wasmkeep` binary in test mode (`serve
//! --test-clock`: loopback only, on a free port, with a temporary data
//! folder, its clock standing still until the test moves it) and talks to
//! it over HTTP. What the test runs is what a node runs: the same binary,
//! transactions, limits and errors.
//!
//! It exists so that an actor crate's first `cargo test` is quick: this
//! crate depends on serde_json alone, where the in-process test kit
//! (`wasmkeep-testkit`) compiles wasmtime, Cranelift and SQLite into every
//! crate that uses it (minutes on a small machine). The price is what only
//! an in-process runtime can do: its fault switches (a lost alarm commit,
//! a crash between commit and reply) and direct access to the runtime.
//! [`TestNode::crash`] (SIGKILL, then a start on the same data) stands in
//! for the crash; ADR 0055 has the comparison.
//!
//! ```no_run
//! use std::time::Duration;
//! use wasmkeep_testnode::{TestNode, build_component};
//!
//! let mut node = TestNode::new();
//! node.deploy("dev/app", &build_component(env!("CARGO_MANIFEST_DIR"))).unwrap();
//! let alice = node.actor("dev/app/counter/alice");
//! assert_eq!(alice.post("/increment", "").json()["value"], 1);
//! node.advance(Duration::from_secs(60)); // alarms due on the way run, in order
//! node.crash();                          // SIGKILL, then start again on the same data
//! assert_eq!(node.actor("dev/app/counter/alice").get("/value").json()["value"], 1);
//! ```
//!
//! The binary is `WASMKEEP_BIN` when set (`wasmkeep new` writes it into
//! the crate's `.cargo/config.toml`: the binary that made the crate), else
//! `wasmkeep` on the `PATH`, else [`Options::binary`].

use std::cell::Cell;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use serde_json::Value as Json;
pub use wasmkeep_build::{WASM_TARGET, build_component, build_component_at};

/// How long a node may take to say it listens (its first compile of a
/// component included, which happens at deploy, not here).
pub const START_TIMEOUT: Duration = Duration::from_secs(180);

/// How long one request to the node may take before the test fails.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The largest answer the kit reads (a body past it fails the test).
pub const RESPONSE_BYTES_MAX: usize = 64 << 20;

/// An answer: status, headers (names in lower case) and body.
#[derive(Debug, Clone)]
pub struct TestResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl TestResponse {
    /// The body as UTF-8 text (invalid bytes replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics, naming the status and the body, if it is
    /// not JSON.
    #[track_caller]
    pub fn json(&self) -> Json {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "the answer is not JSON ({e}): {} {}",
                self.status,
                self.text()
            )
        })
    }

    /// The first header called `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// How to start a node: [`TestNode::options`], then [`Options::start`].
#[derive(Debug, Clone, Default)]
pub struct Options {
    binary: Option<PathBuf>,
    config: Option<String>,
    start_ms: Option<u64>,
    real_clock: bool,
}

impl Options {
    /// The `wasmkeep` binary to run (before `WASMKEEP_BIN` and the `PATH`).
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Options {
        self.binary = Some(path.into());
        self
    }

    /// A node configuration file's text (`node.toml`: the README's
    /// "Configuration"), for example `outbound_private_allowed = true` to
    /// let the outbox call a stub on this machine.
    pub fn config(mut self, toml: &str) -> Options {
        self.config = Some(toml.to_owned());
        self
    }

    /// Where the test clock starts, unix milliseconds (default: now).
    pub fn start_ms(mut self, ms: u64) -> Options {
        self.start_ms = Some(ms);
        self
    }

    /// The real clock, which [`TestNode::advance`] cannot move.
    pub fn real_clock(mut self) -> Options {
        self.real_clock = true;
        self
    }

    /// Starts the node; panics with the reason if it does not listen
    /// within [`START_TIMEOUT`].
    #[track_caller]
    pub fn start(self) -> TestNode {
        let dir = temp_dir();
        let now_ms = (!self.real_clock).then(|| self.start_ms.unwrap_or_else(wall_ms));
        let mut node = TestNode {
            dir,
            options: self,
            child: None,
            addr: String::new(),
            now_ms: Cell::new(now_ms),
        };
        node.start();
        node
    }
}

/// A `wasmkeep serve` process for a test, stopped and its data removed
/// when dropped.
#[derive(Debug)]
pub struct TestNode {
    dir: PathBuf,
    options: Options,
    child: Option<Child>,
    addr: String,
    /// The test clock's time (`None` on the real clock).
    now_ms: Cell<Option<u64>>,
}

impl TestNode {
    /// A node on the test clock, started at the current time.
    #[track_caller]
    pub fn new() -> TestNode {
        TestNode::options().start()
    }

    /// A node with a configuration file's text (see [`Options::config`]).
    #[track_caller]
    pub fn with_config(toml: &str) -> TestNode {
        TestNode::options().config(toml).start()
    }

    /// Options for a node; [`Options::start`] starts it.
    pub fn options() -> Options {
        Options::default()
    }

    /// `127.0.0.1:PORT` of the running node.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The node's data folder (removed when the node is dropped).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Deploys a component as `tenant/app`; the node's answer (its
    /// classes, size and hash), or its error body.
    pub fn deploy(&self, tenant_app: &str, wasm: &[u8]) -> Result<Json, String> {
        self.deploy_at(&format!("/admin/v1/apps/{tenant_app}"), wasm)
    }

    /// Deploys with an app manifest's text (`[vars]`, limits, `[outbound]`:
    /// the README's "App manifest").
    pub fn deploy_with_manifest(
        &self,
        tenant_app: &str,
        wasm: &[u8],
        manifest: &str,
    ) -> Result<Json, String> {
        let path = format!(
            "/admin/v1/apps/{tenant_app}?manifest={}",
            percent_encode(manifest)
        );
        self.deploy_at(&path, wasm)
    }

    fn deploy_at(&self, path: &str, wasm: &[u8]) -> Result<Json, String> {
        let r = self.request("PUT", path, wasm, &[]);
        if r.status == 200 {
            Ok(r.json())
        } else {
            Err(format!("{} {}", r.status, r.text()))
        }
    }

    /// Sets an app's secret, as `wasmkeep secret set` does.
    #[track_caller]
    pub fn set_secret(&self, tenant_app: &str, name: &str, value: &str) {
        let r = self.request(
            "PUT",
            &format!("/admin/v1/apps/{tenant_app}/secrets/{name}"),
            value.as_bytes(),
            &[],
        );
        assert!(
            (200..300).contains(&r.status),
            "set secret {name}: {} {}",
            r.status,
            r.text()
        );
    }

    /// One actor, `tenant/app/class/name` (the name percent-encoded, as in
    /// its URL).
    pub fn actor(&self, address: &str) -> Actor<'_> {
        Actor {
            node: self,
            address: address.trim_matches('/').to_owned(),
        }
    }

    /// The node's clock, unix milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.now_ms.get().unwrap_or_else(wall_ms)
    }

    /// Moves the node's clock forward by `by`, running every alarm that
    /// comes due on the way, in due order, each at its own time; returns
    /// how many alarm handlers succeeded.
    #[track_caller]
    pub fn advance(&self, by: Duration) -> usize {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.advance_to(self.now_ms().saturating_add(by))
    }

    /// Like [`TestNode::advance`], to an absolute time.
    #[track_caller]
    pub fn advance_to(&self, to_ms: u64) -> usize {
        assert!(
            self.now_ms.get().is_some(),
            "this node runs on the real clock (Options::real_clock)"
        );
        let r = self.request(
            "POST",
            &format!("/admin/v1/test/clock?to_ms={to_ms}"),
            b"",
            &[],
        );
        assert_eq!(r.status, 200, "advance the clock: {}", r.text());
        let v = r.json();
        self.now_ms.set(v["now_ms"].as_u64());
        v["alarms_ran"].as_u64().unwrap_or(0) as usize
    }

    /// Stops the node cleanly (SIGTERM: queued events finish) and starts
    /// it again on the same data, at the same test time.
    #[track_caller]
    pub fn restart(&mut self) {
        self.end(false);
        self.start();
    }

    /// Kills the node (SIGKILL: no clean stop, as a power cut leaves a
    /// process) and starts it again on the same data, at the same test
    /// time.
    #[track_caller]
    pub fn crash(&mut self) {
        self.end(true);
        self.start();
    }

    /// Kills the node as [`TestNode::crash`] does, lets `cut` change its
    /// data directory as a power cut would have (take what only the page
    /// cache held), then starts it again on what is left.
    #[track_caller]
    pub fn crash_and(&mut self, cut: impl FnOnce(&std::path::Path)) {
        self.end(true);
        cut(&self.data_dir());
        self.start();
    }

    /// A request to the node: `path` from the root (`/v1/...`,
    /// `/admin/v1/...`), extra headers as name and value.
    #[track_caller]
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> TestResponse {
        http(&self.addr, method, path, body, headers)
            .unwrap_or_else(|e| panic!("{method} {path} on the test node {}: {e}", self.addr))
    }

    fn binary(&self) -> PathBuf {
        self.options
            .binary
            .clone()
            .or_else(|| std::env::var_os("WASMKEEP_BIN").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("wasmkeep"))
    }

    #[track_caller]
    fn start(&mut self) {
        let data = self.data_dir();
        let mut cmd = Command::new(self.binary());
        cmd.arg("serve")
            .arg("--data")
            .arg(&data)
            .args(["--listen", "127.0.0.1:0"]);
        if let Some(now) = self.now_ms.get() {
            // A restart keeps the time the test moved to.
            cmd.args(["--test-clock", &now.to_string()]);
        }
        if let Some(text) = &self.options.config {
            let path = self.dir.join("node.toml");
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            cmd.arg("--config").arg(path);
        }
        // Components compile once per machine, not once per test.
        let cache = std::env::temp_dir().join("wasmkeep-testnode-cache");
        cmd.env("WASMKEEP_COMPILE_CACHE", &cache)
            .env("WASMKEEP_COMPILE_CACHE_KEY", cache.with_extension("key"))
            .env(
                "WASMKEEP_LOG",
                std::env::var("WASMKEEP_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "start {}: {e} (set WASMKEEP_BIN to the wasmkeep binary)",
                self.binary().display()
            )
        });
        let stdout = child.stdout.take().expect("piped stdout");
        self.child = Some(child);
        self.addr = listening(stdout).unwrap_or_else(|e| {
            self.end(true);
            panic!(
                "the test node ({}) did not start: {e}",
                self.binary().display()
            )
        });
    }

    fn end(&mut self, kill: bool) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if kill {
            let _ = child.kill();
        } else {
            // SIGTERM without a libc dependency: the `kill` command.
            let termed = Command::new("kill")
                .arg(child.id().to_string())
                .status()
                .is_ok_and(|s| s.success());
            if !termed {
                let _ = child.kill();
            }
        }
        let _ = child.wait();
    }
}

impl Default for TestNode {
    fn default() -> TestNode {
        TestNode::new()
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.end(true);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One actor of a [`TestNode`].
#[derive(Debug)]
pub struct Actor<'a> {
    node: &'a TestNode,
    address: String,
}

impl Actor<'_> {
    fn path(&self, path: &str) -> String {
        let path = path.strip_prefix('/').unwrap_or(path);
        format!("/v1/{}/{path}", self.address)
    }

    /// `GET` a path of the actor (`/value`, `/items?limit=5`).
    #[track_caller]
    pub fn get(&self, path: &str) -> TestResponse {
        self.request("GET", path, b"", &[])
    }

    /// `POST` with a body.
    #[track_caller]
    pub fn post(&self, path: &str, body: impl AsRef<[u8]>) -> TestResponse {
        self.request("POST", path, body.as_ref(), &[])
    }

    /// `PUT` with a body.
    #[track_caller]
    pub fn put(&self, path: &str, body: impl AsRef<[u8]>) -> TestResponse {
        self.request("PUT", path, body.as_ref(), &[])
    }

    /// `DELETE` a path of the actor.
    #[track_caller]
    pub fn delete(&self, path: &str) -> TestResponse {
        self.request("DELETE", path, b"", &[])
    }

    /// Any request to the actor, with extra headers.
    #[track_caller]
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> TestResponse {
        self.node.request(method, &self.path(path), body, headers)
    }

    /// What the node knows of the actor (`wasmkeep inspect`): its size,
    /// alarm, retry count. Panics if it does not exist.
    #[track_caller]
    pub fn inspect(&self) -> Json {
        let r = self.node.request(
            "GET",
            &format!("/admin/v1/actors/{}", self.address),
            b"",
            &[],
        );
        assert_eq!(r.status, 200, "inspect {}: {}", self.address, r.text());
        r.json()
    }

    /// The actor's pending alarm, unix milliseconds.
    #[track_caller]
    pub fn alarm(&self) -> Option<u64> {
        self.inspect()["alarm_ms"].as_u64()
    }

    /// Rows of a read-only statement over the actor's committed database
    /// (`wasmkeep inspect --sql`), each a list of JSON values.
    #[track_caller]
    pub fn sql(&self, statement: &str) -> Vec<Vec<Json>> {
        let r = self.node.request(
            "POST",
            &format!("/admin/v1/actors/{}/sql", self.address),
            statement.as_bytes(),
            &[],
        );
        assert_eq!(r.status, 200, "{statement}: {}", r.text());
        let v = r.json();
        v["rows"]
            .as_array()
            .map(|rows| {
                rows.iter()
                    .map(|row| row.as_array().cloned().unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The one integer a statement reads (`SELECT count(*) FROM items`).
    #[track_caller]
    pub fn sql_i64(&self, statement: &str) -> i64 {
        let rows = self.sql(statement);
        rows.first()
            .and_then(|r| r.first())
            .and_then(Json::as_i64)
            .unwrap_or_else(|| panic!("{statement} read no integer: {rows:?}"))
    }
}

/// Reads the node's stdout until it says where it listens; the rest of
/// its stdout is drained by a thread of its own.
fn listening(stdout: std::process::ChildStdout) -> Result<String, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut told = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if !told && let Some(rest) = line.split("listening on http://").nth(1) {
                let addr: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
                told = tx.send(Ok(addr)).is_ok();
            }
        }
        let _ = tx.send(Err(
            "it exited before it listened (its errors are above)".to_owned()
        ));
    });
    rx.recv_timeout(START_TIMEOUT)
        .map_err(|_| format!("it did not listen within {START_TIMEOUT:?}"))?
}

/// One HTTP/1.1 exchange on a new connection (`Connection: close`).
fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> Result<TestResponse, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(REQUEST_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())
        .and_then(|()| s.write_all(body))
        .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    s.take(RESPONSE_BYTES_MAX as u64 + 64 * 1024)
        .read_to_end(&mut raw)
        .map_err(|e| format!("read the answer: {e}"))?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Result<TestResponse, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the answer has no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or("the answer has no status line")?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    if body.len() > RESPONSE_BYTES_MAX {
        return Err(format!(
            "the answer is over RESPONSE_BYTES_MAX ({RESPONSE_BYTES_MAX} bytes)"
        ));
    }
    Ok(TestResponse {
        status,
        headers,
        body,
    })
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunk has no size line")?;
        let size = std::str::from_utf8(&rest[..eol])
            .ok()
            .and_then(|l| usize::from_str_radix(l.split(';').next()?.trim(), 16).ok())
            .ok_or("a chunk's size is not hex")?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(body);
        }
        let chunk = rest.get(..size).ok_or("the answer ended inside a chunk")?;
        body.extend_from_slice(chunk);
        rest = rest
            .get(size + 2..)
            .ok_or("the answer ended after a chunk")?;
    }
}

/// A fresh folder of this process under the system's temporary folder.
fn temp_dir() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "wasmkeep-testnode-{}-{}-{}",
        std::process::id(),
        wall_ms(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

#[allow(
    clippy::disallowed_methods,
    reason = "the test clock starts at the machine's time, as the node's real clock would"
)]
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_whole_and_chunked() {
        let plain = parse_response(
            b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n\r\n{\"a\":1}",
        )
        .unwrap();
        assert_eq!(plain.status, 201);
        assert_eq!(plain.header("content-type"), Some("application/json"));
        assert_eq!(plain.json()["a"], 1);
        let chunked = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(chunked.text(), "abcde");
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab")
                .is_err()
        );
        assert!(parse_response(b"garbage").is_err());
    }

    #[test]
    fn manifests_are_percent_encoded_whole() {
        assert_eq!(
            percent_encode("[vars]\nA = \"b c\""),
            "%5Bvars%5D%0AA%20%3D%20%22b%20c%22"
        );
    }
}
