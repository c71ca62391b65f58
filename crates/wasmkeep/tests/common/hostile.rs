//! What the hostile suites share (`tests/hostile.rs`, `tests/shared_node.rs`):
//! a node with an attacker tenant (`evil`, the `hostile` guest) and a
//! neighbouring tenant (`good`, the demo app's `counter`), and the checks
//! that the neighbour is served and the node lives.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::Node;
use serde_json::Value as Json;
use wasmkeep_guests::{DEMO, HOSTILE};

/// The attacker's actors.
pub(crate) const EVIL: &str = "/v1/evil/x/attacker";
/// The neighbour's actors.
pub(crate) const GOOD: &str = "/v1/good/demo/counter";

/// Limits low enough that the long attacks end quickly; two workers, so
/// two statements that never end would hold every worker.
pub(crate) const BASE: &str = "event_cpu_ms_max = 2000\nworkers = 2\n";

pub(crate) fn start(tmp: &Path, config: &str) -> Node {
    start_with_log(tmp, config, None)
}

pub(crate) fn start_with_log(tmp: &Path, config: &str, log: Option<&Path>) -> Node {
    let cfg = tmp.join("node.toml");
    std::fs::write(&cfg, config).unwrap();
    let node = Node::start_logging(
        &tmp.join("data"),
        &["--config", cfg.to_str().unwrap()],
        log,
        "warn",
    );
    deploy_both(node)
}

/// Like [`start`], with the rules named in `rules` switched off
/// (`WASMKEEP_UNSAFE`, a test-faults build: the unsafe variants).
pub(crate) fn start_without(tmp: &Path, config: &str, rules: &str) -> Node {
    let cfg = tmp.join("node.toml");
    std::fs::write(&cfg, config).unwrap();
    let node = Node::start_env(
        &tmp.join("data"),
        &["--config", cfg.to_str().unwrap()],
        &[("WASMKEEP_UNSAFE", rules.to_owned())],
    );
    deploy_both(node)
}

/// Deploys the attacker (`evil/x`) and the neighbour (`good/demo`).
pub(crate) fn deploy_both(node: Node) -> Node {
    let (s, v) = node.deploy("evil/x", HOSTILE);
    assert_eq!(s, 200, "deploy the attacker: {v}");
    let (s, v) = node.deploy("good/demo", DEMO);
    assert_eq!(s, 200, "deploy the neighbour: {v}");
    node
}

/// The code an attack got: the event's own error (`{"error":{…}}`: the
/// event failed) or the host call's error the guest passed back as 422.
pub(crate) fn attack_code(v: &Json) -> &str {
    v["error"]["code"]
        .as_str()
        .or_else(|| v["code"].as_str())
        .unwrap_or("")
}

pub(crate) fn attack_message(v: &Json) -> String {
    v["error"]["message"]
        .as_str()
        .or_else(|| v["message"].as_str())
        .unwrap_or("")
        .to_owned()
}

/// Sends one attack to the attacker's actor `actor`.
pub(crate) fn attack(node: &Node, actor: &str, route: &str, body: &[u8]) -> (u16, Json) {
    node.json("POST", &format!("{EVIL}/{actor}{route}"), body)
}

/// Asserts that an attack failed with `want`, and that its message names
/// `names` (the function, pragma, module or limit).
pub(crate) fn assert_refused(got: &(u16, Json), want: &str, names: &str, what: &str) {
    let (s, v) = got;
    assert_ne!(*s, 200, "{what}: the attack succeeded: {v}");
    assert_eq!(attack_code(v), want, "{what}: {s} {v}");
    let message = attack_message(v).to_ascii_lowercase();
    assert!(
        message.contains(&names.to_ascii_lowercase()),
        "{what}: the message does not name `{names}`: {v}"
    );
}

/// A blocking HTTP call for threads, with a bound so that a wedged node
/// fails the test instead of hanging it.
pub(crate) fn http(
    base: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(u16, Json), String> {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .new_agent();
    let req = ureq::http::Request::builder()
        .method(method)
        .uri(format!("{base}{path}"))
        .body(body.to_vec())
        .map_err(|e| e.to_string())?;
    let mut resp = agent
        .run(req)
        .map_err(|e| format!("{method} {path}: {e}"))?;
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    let v = serde_json::from_str(&text).unwrap_or(Json::String(text));
    Ok((status, v))
}

/// The neighbouring tenant: one counter, which must count by one on every
/// request, whatever the attacker does.
pub(crate) struct Neighbour {
    pub base: String,
    pub path: String,
    pub value: i64,
}

impl Neighbour {
    pub(crate) fn new(node: &Node, name: &str) -> Neighbour {
        let path = format!("{GOOD}/{name}");
        let (s, v) = node.json("GET", &format!("{path}/value"), b"");
        let value = if s == 200 {
            v["value"].as_i64().unwrap()
        } else {
            0
        };
        Neighbour {
            base: node.base.clone(),
            path,
            value,
        }
    }

    pub(crate) fn increment(&mut self) -> Result<(), String> {
        let (s, v) = http(&self.base, "POST", &format!("{}/increment", self.path), b"")?;
        if s != 200 || v["value"].as_i64() != Some(self.value + 1) {
            return Err(format!(
                "after {} the neighbour answered {s} {v}",
                self.value
            ));
        }
        self.value += 1;
        Ok(())
    }
}

/// Runs `attack` while a neighbour sends requests from another thread, one
/// after the other, and asserts that every one of them was served
/// correctly (at least one is always sent).
pub(crate) fn with_neighbour<T>(node: &Node, name: &str, attack: impl FnOnce() -> T) -> T {
    let stop = Arc::new(AtomicBool::new(false));
    let mut neighbour = Neighbour::new(node, name);
    let handle: JoinHandle<Result<u64, String>> = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut served = 0;
            loop {
                neighbour.increment()?;
                served += 1;
                if stop.load(Ordering::Relaxed) {
                    return Ok(served);
                }
                // Leaves the two cores to the attack and the node.
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let out = attack();
    stop.store(true, Ordering::Relaxed);
    let served = handle.join().expect("the neighbour thread");
    let served = served.unwrap_or_else(|e| panic!("the neighbour failed during the attack: {e}"));
    assert!(served > 0);
    out
}

/// How a child process ended, without reaping it (the `Node` still owns
/// it); `None` while it runs.
pub(crate) fn exit_of(node: &Node) -> Option<String> {
    // SAFETY: `info` is a plain C struct that waitid fills; WNOWAIT leaves
    // the child waitable, so `Node`'s own wait still reaps it.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        let rc = libc::waitid(libc::P_PID, node.pid() as libc::id_t, &mut info, flags);
        assert_eq!(rc, 0, "waitid: {}", std::io::Error::last_os_error());
        if info.si_pid() == 0 {
            return None;
        }
        Some(match info.si_code {
            libc::CLD_EXITED => format!("exited with status {}", info.si_status()),
            _ => format!("killed by signal {}", info.si_status()),
        })
    }
}

/// How the node ended once it did, waiting at most `bound` (a bound for a
/// hung node, not a timing assertion); `None` if it still runs.
pub(crate) fn exit_within(node: &Node, bound: Duration) -> Option<String> {
    let until = std::time::Instant::now() + bound;
    loop {
        let how = exit_of(node);
        if how.is_some() || std::time::Instant::now() >= until {
            return how;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The node process still runs (no SIGSEGV, no abort) and answers.
pub(crate) fn assert_alive(node: &Node) {
    if let Some(how) = exit_of(node) {
        panic!("the node is gone: {how}");
    }
    assert_eq!(node.get("/healthz").0, 200);
}

/// The attacker's actor serves an ordinary request after its attack.
pub(crate) fn assert_attacker_serves(node: &Node, actor: &str) {
    let (s, v) = node.json("GET", &format!("{EVIL}/{actor}/ping"), b"");
    assert_eq!(
        (s, &v["ok"]),
        (200, &Json::Bool(true)),
        "{actor} after its attack: {v}"
    );
}

/// The node's peak resident memory (`VmHWM`).
pub(crate) fn peak_rss_bytes(node: &Node) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.pid())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    kib * 1024
}
