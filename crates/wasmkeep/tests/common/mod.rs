//! A real `wasmkeep serve` process on a loopback port, for tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub struct Node {
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
    pub fn start(data: &Path, extra: &[&str]) -> Node {
        Self::start_logging(data, extra, None, "warn")
    }

    /// Like [`Node::start`], with the node's log (at `level`) written to
    /// `log` instead of the test's stderr.
    pub fn start_logging(data: &Path, extra: &[&str], log: Option<&Path>, level: &str) -> Node {
        Self::start_full(data, extra, log, level, &[])
    }

    /// Like [`Node::start`], with environment variables (a bucket's AWS_*).
    pub fn start_env(data: &Path, extra: &[&str], env: &[(&str, String)]) -> Node {
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
        let mut child = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
            .arg("serve")
            .arg("--data")
            .arg(data)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
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

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, and wait for the exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        self.signal_and_wait(libc::SIGTERM)
    }

    /// Sends `signal`, and waits for the exit.
    pub fn signal_and_wait(&mut self, signal: i32) -> std::process::ExitStatus {
        unsafe {
            libc::kill(self.pid(), signal);
        }
        self.child.wait().expect("wait for the node")
    }

    pub fn send(&self, method: &str, path: &str, body: &[u8]) -> (u16, String) {
        self.send_with(method, path, body, None)
    }

    /// Sends with an optional bearer token.
    pub fn send_with(
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
    pub fn send_headers(
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

    pub fn get(&self, path: &str) -> (u16, String) {
        self.send("GET", path, b"")
    }

    pub fn post(&self, path: &str, body: &[u8]) -> (u16, String) {
        self.send("POST", path, body)
    }

    pub fn json(&self, method: &str, path: &str, body: &[u8]) -> (u16, serde_json::Value) {
        let (s, t) = self.send(method, path, body);
        let v = serde_json::from_str(&t).unwrap_or(serde_json::Value::String(t));
        (s, v)
    }

    pub fn deploy(&self, tenant_app: &str, wasm: &[u8]) -> (u16, serde_json::Value) {
        self.json("PUT", &format!("/admin/v1/apps/{tenant_app}"), wasm)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The error code of a JSON error body.
pub fn code(v: &serde_json::Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

pub fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}
