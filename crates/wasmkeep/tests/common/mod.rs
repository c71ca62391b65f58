//! A real `wasmkeep serve` process on a loopback port, for tests.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]
#![allow(dead_code)]
pub(crate) mod cluster;
pub(crate) mod hostile;
pub(crate) mod load;
pub(crate) mod proxy;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub(crate) struct Node {
    child: Child,
    pub base: String,
    pub data: PathBuf,
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .new_agent()
}

impl Node {
    /// Starts a node on `data` with a free port; extra flags follow `serve`.
    pub(crate) fn start(data: &Path, extra: &[&str]) -> Node {
        Self::start_logging(data, extra, None, "warn")
    }

    /// Like [`Node::start`], with the node's log (at `level`) written to
    /// `log` instead of the test's stderr.
    pub(crate) fn start_logging(
        data: &Path,
        extra: &[&str],
        log: Option<&Path>,
        level: &str,
    ) -> Node {
        Self::start_full(data, extra, log, level, &[])
    }

    /// Like [`Node::start`], with environment variables (a bucket's AWS_*).
    pub(crate) fn start_env(data: &Path, extra: &[&str], env: &[(&str, String)]) -> Node {
        Self::start_full(data, extra, None, "warn", env)
    }

    fn start_full(
        data: &Path,
        extra: &[&str],
        log: Option<&Path>,
        level: &str,
        env: &[(&str, String)],
    ) -> Node {
        let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("compile-cache");
        // A free loopback port, unless the test names its own address.
        let listen: &[&str] = if extra.contains(&"--listen") {
            &[]
        } else {
            &["--listen", "127.0.0.1:0"]
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
            .arg("serve")
            .arg("--data")
            .arg(data)
            .args(listen)
            .args(extra)
            // One key for every test node, so they load the code one of
            // them compiled (only code tagged with the node's key loads).
            .env("WASMKEEP_COMPILE_CACHE_KEY", cache.with_extension("key"))
            .env("WASMKEEP_COMPILE_CACHE", cache)
            .env("WASMKEEP_LOG", level)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::piped())
            .stderr(match log {
                Some(p) => Stdio::from(std::fs::File::create(p).expect("log file")),
                None => Stdio::inherit(),
            })
            .spawn()
            .expect("spawn wasmkeep");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if let Some(rest) = line.split("listening on ").nth(1) {
                    let url = rest.split_whitespace().next().unwrap().to_string();
                    let _ = tx.send(url);
                }
            }
        });
        let base = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the node did not start");
        Node {
            child,
            base,
            data: data.to_owned(),
        }
    }

    /// The node's `host:port`, as in `base`.
    pub(crate) fn addr(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGKILL, and wait for the process to be gone.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, and wait for the exit.
    pub(crate) fn stop(&mut self) -> std::process::ExitStatus {
        self.signal_and_wait(libc::SIGTERM)
    }

    /// SIGTERM, and waits at most `limit` for the exit; `None` (after a
    /// SIGKILL) if it did not come.
    pub(crate) fn stop_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        // SAFETY: kill(2) takes two integers and touches no memory of this
        // process; the pid is our child's, not reaped yet (so not reused).
        unsafe {
            libc::kill(self.pid(), libc::SIGTERM);
        }
        let end = std::time::Instant::now() + limit;
        while std::time::Instant::now() < end {
            if let Some(status) = self.child.try_wait().expect("wait for the node") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
        None
    }

    /// Sends `signal`, and waits for the exit.
    pub(crate) fn signal_and_wait(&mut self, signal: i32) -> std::process::ExitStatus {
        unsafe {
            libc::kill(self.pid(), signal);
        }
        self.child.wait().expect("wait for the node")
    }

    /// Runs the CLI against this node (`--server` appended) with extra
    /// environment variables: exit code, stdout, stderr.
    pub(crate) fn cli(&self, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
            .args(args)
            .args(["--server", &self.base])
            .envs(env.iter().copied())
            .output()
            .expect("run the CLI");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub(crate) fn send(&self, method: &str, path: &str, body: &[u8]) -> (u16, String) {
        self.send_with(method, path, body, None)
    }

    /// Sends with an optional bearer token.
    pub(crate) fn send_with(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        token: Option<&str>,
    ) -> (u16, String) {
        let auth = token.map(|t| ("authorization", format!("Bearer {t}")));
        self.send_headers(method, path, body, auth.as_slice())
    }

    /// Sends with extra headers.
    pub(crate) fn send_headers(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        headers: &[(&str, String)],
    ) -> (u16, String) {
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        for (k, v) in headers {
            req = req.header(*k, v.as_str());
        }
        let req = req.body(body.to_vec()).unwrap();
        let mut resp = agent().run(req).expect("http");
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_string()
            .unwrap_or_default();
        (status, text)
    }

    pub(crate) fn get(&self, path: &str) -> (u16, String) {
        self.send("GET", path, b"")
    }

    pub(crate) fn post(&self, path: &str, body: &[u8]) -> (u16, String) {
        self.send("POST", path, body)
    }

    pub(crate) fn json(&self, method: &str, path: &str, body: &[u8]) -> (u16, serde_json::Value) {
        let (s, t) = self.send(method, path, body);
        let v = serde_json::from_str(&t).unwrap_or(serde_json::Value::String(t));
        (s, v)
    }

    pub(crate) fn deploy(&self, tenant_app: &str, wasm: &[u8]) -> (u16, serde_json::Value) {
        self.json("PUT", &format!("/admin/v1/apps/{tenant_app}"), wasm)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `request` (raw HTTP/1.1, which should say `connection: close`) to
/// `addr` and reads the answer until the node closes: for headers a client
/// library would set itself (`Host`) and for exact bytes on the wire.
pub(crate) fn raw_http(addr: &str, request: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(request.as_bytes()).expect("send");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The status of a raw HTTP answer, 0 if there is none.
pub(crate) fn raw_status(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The error code of a JSON error body.
pub(crate) fn code(v: &serde_json::Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

pub(crate) fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Deploys `wasm` as `tenant_app` with `manifest` through the node at
/// `addr` and asserts that no answer comes: the node dies on the way (a
/// crash point a test switched on).
pub(crate) fn deploy_never_answered(
    addr: &str,
    tenant_app: &str,
    wasm: &'static [u8],
    manifest: &str,
) {
    let url = format!(
        "http://{addr}/admin/v1/apps/{tenant_app}?manifest={}",
        enc(manifest)
    );
    let deploying = std::thread::spawn(move || ureq::put(&url).send(wasm));
    assert!(
        deploying.join().unwrap().is_err(),
        "the deploy was answered"
    );
}

/// Empties every actor's write-ahead log under `data` (synced bytes too:
/// harsher than a power cut, which takes only what the page cache held)
/// and returns how many there were.
pub(crate) fn empty_actor_logs(data: &Path) -> usize {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.to_string_lossy().ends_with(".db-wal") {
                out.push(p);
            }
        }
    }
    let mut logs = Vec::new();
    walk(&data.join("actors"), &mut logs);
    for log in &logs {
        std::fs::OpenOptions::new()
            .write(true)
            .open(log)
            .and_then(|f| f.set_len(0))
            .unwrap();
    }
    logs.len()
}
