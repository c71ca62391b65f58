//! A `wasmkeep serve` process started by the benchmark: the same binary,
//! a data directory of its own, a free loopback port.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::client::Endpoint;

/// Longest wait for a node to print its listening line.
const NODE_START_MS_MAX: u64 = 120_000;
/// Longest wait for a clean exit after SIGTERM. Generous: a node closes
/// every live actor on the way out, and how long that takes is a figure
/// (`shutdown_ms`), not a failure.
const NODE_STOP_MS_MAX: u64 = 180_000;

/// How to start a node.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub exe: PathBuf,
    pub data: PathBuf,
    /// `fsync` or `process`.
    pub durability: &'static str,
    pub config: Option<PathBuf>,
    /// Shared by every node of a bench run, so the bundled examples are
    /// compiled once rather than once per node.
    pub compile_cache: PathBuf,
    /// The node's stderr goes here (appended, so a restart keeps the log).
    pub log: PathBuf,
    /// `serve --bucket`.
    pub bucket: Option<String>,
    /// Cluster mode: listen on this loopback port and advertise it
    /// (`--advertise http://127.0.0.1:PORT`; needs `bucket`). None: any
    /// free port, no cluster.
    pub cluster_port: Option<u16>,
    /// `serve --examples`: the bundled examples deployed at start.
    pub examples: bool,
}

pub struct Node {
    child: Child,
    pub endpoint: Endpoint,
    pub pid: u32,
    pub log: PathBuf,
    /// From spawn to the listening line.
    pub start_ms: f64,
}

impl Node {
    pub async fn start(spec: &NodeSpec) -> Result<Node> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)
            .with_context(|| format!("open {}", spec.log.display()))?;
        let mut cmd = Command::new(&spec.exe);
        let listen = format!("127.0.0.1:{}", spec.cluster_port.unwrap_or(0));
        cmd.arg("serve")
            .arg("--data")
            .arg(&spec.data)
            .args(["--listen", &listen])
            .args(["--durability", spec.durability]);
        if spec.examples {
            cmd.arg("--examples");
        }
        if let Some(port) = spec.cluster_port {
            cmd.arg("--advertise")
                .arg(format!("http://127.0.0.1:{port}"));
        }
        if let Some(c) = &spec.config {
            cmd.arg("--config").arg(c);
        }
        if let Some(b) = &spec.bucket {
            cmd.arg("--bucket").arg(b);
        }
        // Nodes load only compiled code tagged with their key: every node
        // of the invocation shares one, beside the shared cache (unless the
        // environment names one), so that none compiles at start-up.
        let key = std::env::var_os("WASMKEEP_COMPILE_CACHE_KEY")
            .map(PathBuf::from)
            .unwrap_or_else(|| spec.compile_cache.with_extension("key"));
        cmd.env("WASMKEEP_COMPILE_CACHE", &spec.compile_cache)
            .env("WASMKEEP_COMPILE_CACHE_KEY", key)
            .env("WASMKEEP_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        // If the benchmark itself dies (SIGKILL, a panic that aborts), the
        // kernel kills its nodes: no node outlives the command.
        #[cfg(target_os = "linux")]
        // SAFETY: the closure runs in the child between fork and exec and
        // calls only `prctl` and `getppid`, both async-signal-safe.
        unsafe {
            let parent = libc::getpid();
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died before the prctl took effect.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let t0 = crate::clock::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawn {}", spec.exe.display()))?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow!("the node exited at once"))?;
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        let url = tokio::time::timeout(Duration::from_millis(NODE_START_MS_MAX), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.split("listening on ").nth(1) {
                    return anyhow::Ok(rest.split_whitespace().next().unwrap_or("").to_string());
                }
            }
            bail!("the node closed its stdout before listening")
        })
        .await
        .map_err(|_| anyhow!("the node did not listen within {NODE_START_MS_MAX} ms"))?
        .with_context(|| format!("start a node (log: {})", spec.log.display()))?;
        let start_ms = t0.elapsed().as_secs_f64() * 1000.0;
        // Keep draining stdout so the node never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let endpoint = Endpoint::parse(&url).await?;
        Ok(Node {
            child,
            endpoint,
            pid,
            log: spec.log.clone(),
            start_ms,
        })
    }

    /// Resident set size, in KiB (VmRSS of /proc/PID/status).
    pub fn rss_kib(&self) -> Result<u64> {
        proc_status_kib(self.pid, "VmRSS:")
    }

    /// Peak resident set size, in KiB (VmHWM).
    pub fn peak_rss_kib(&self) -> Result<u64> {
        proc_status_kib(self.pid, "VmHWM:")
    }

    /// Proportional set size, in KiB (Pss of /proc/PID/smaps_rollup):
    /// RSS with each page shared by several mappings counted once in all,
    /// such as the guest image every instance maps.
    pub fn pss_kib(&self) -> Result<u64> {
        proc_kib(self.pid, "smaps_rollup", "Pss:")
    }

    /// SIGKILL, and wait until the process is gone.
    pub async fn kill(&mut self) -> Result<()> {
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }

    /// SIGTERM, and wait for the exit status; returns the milliseconds
    /// until exit. An error if the node does not exit cleanly in time (it
    /// is then killed).
    pub async fn stop(&mut self) -> Result<f64> {
        let t0 = crate::clock::now();
        // SAFETY: `kill` has no memory-safety preconditions; the pid is our
        // child's, which has not been reaped yet (we hold `self.child`).
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGTERM);
        }
        match tokio::time::timeout(Duration::from_millis(NODE_STOP_MS_MAX), self.child.wait()).await
        {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    bail!(
                        "the node exited with {status} after SIGTERM (log: {})",
                        self.log.display()
                    );
                }
                Ok(t0.elapsed().as_secs_f64() * 1000.0)
            }
            Err(_) => {
                self.kill().await?;
                bail!(
                    "the node did not exit within {NODE_STOP_MS_MAX} ms of SIGTERM (log: {})",
                    self.log.display()
                )
            }
        }
    }
}

fn proc_status_kib(pid: u32, field: &str) -> Result<u64> {
    proc_kib(pid, "status", field)
}

/// A `field: N kB` line of `/proc/PID/<file>`.
fn proc_kib(pid: u32, file: &str, field: &str) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .with_context(|| format!("read /proc/{pid}/{file}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| anyhow!("no {field} in /proc/{pid}/{file}"))
}

/// A loopback port nothing listens on now (a node told to listen on it
/// may still find it taken: [`Node::start`]'s caller retries).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The last `n` lines of a node's log, for failure reports.
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
