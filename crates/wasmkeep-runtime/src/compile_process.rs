//! Compiling a component in a child process, so that its memory is bounded
//! and a compilation past its deadline is stopped, not abandoned.
//!
//! wasmtime can neither cancel a compilation nor bound what it allocates,
//! and components are hostile input. A node that compiles in a child
//! ([`Compile::Process`], what `wasmkeep serve` does) runs its own binary
//! with the worker's arguments; the child caps its data segment
//! (`RLIMIT_DATA`: heap and private writable mappings, which is where the
//! compiler's memory goes) at `component_compile_memory_bytes_max`, reads
//! the component from stdin, compiles it with an engine built from the same
//! [`EngineSettings`] as the node's, and writes the serialized code to
//! stdout. The node kills the child at the deadline, reads at most the
//! bytes compiled code may take, and loads the code with
//! `Component::deserialize`, which checks the engine settings and the
//! instance pool's limits again.
//!
//! [`Compile::Thread`] compiles on a thread of the node's own process: no
//! memory bound, and a compilation past its deadline runs on to its end.
//! It is for a test kit running a developer's own components, and it is
//! the unsafe variant of the child's bounds in their tests.
//!
//! ```text
//! node                                   child: <program> <args> <settings>
//!  spawn, write component to stdin  ──▶  setrlimit(RLIMIT_DATA), read stdin
//!  poll for exit until the deadline      compile, write code to stdout
//!  read stdout (capped), stderr (capped) exit 0 | 1 (does not compile)
//!  kill at the deadline                  (abort when an allocation fails)
//! ```

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::error::RuntimeError;

/// The deepest guest recursion a worker's stack takes (see
/// `config::WASM_STACK_BYTES_MAX`).
use crate::config::WASM_STACK_BYTES_MAX;

pub use crate::config::Compile;

/// Everything that decides what compiled code an engine makes and accepts;
/// the node's engine and a compile worker's are built from the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngineSettings {
    /// Component instances the pool holds.
    pub instances: u32,
    /// Core instances, linear memories and tables one component may hold.
    pub cores: u32,
    pub memories: u32,
    pub tables: u32,
    /// Largest linear memory.
    pub memory_bytes_max: usize,
}

impl EngineSettings {
    /// What the node's engine and a compile worker's share: everything
    /// that decides the compiled code (wasmtime checks it again when it
    /// loads code, `Engine::check_compatible`).
    fn base(&self) -> wasmtime::Config {
        let mut c = wasmtime::Config::new();
        c.wasm_component_model(true);
        c.epoch_interruption(true);
        // Guest recursion traps at this depth, well inside a worker's stack.
        c.max_wasm_stack(WASM_STACK_BYTES_MAX);
        // A compilation runs on one thread, so it keeps at most one core
        // busy, not every core of the shared pool.
        c.parallel_compilation(false);
        c
    }

    /// The node's engine; a freed instance slot keeps up to
    /// `keep_resident` bytes of each memory and table resident
    /// (`instance_keep_resident_bytes`).
    pub(crate) fn engine(&self, keep_resident: usize) -> Result<Engine, RuntimeError> {
        let mut c = self.base();
        // The pooling allocator keeps instance memory slots ready, which
        // makes instantiation a few microseconds (W3, cold start). Each
        // slot reserves address space only; untouched pages cost nothing.
        let n = self.instances;
        let mut pool = PoolingAllocationConfig::default();
        // Each component may hold at most this many core instances,
        // memories and tables (checked when compiled code is loaded), so a
        // pool of n times each always has room for n instances.
        pool.total_component_instances(n)
            .max_core_instances_per_component(self.cores)
            .max_memories_per_component(self.memories)
            .max_tables_per_component(self.tables)
            .total_core_instances(n.saturating_mul(self.cores))
            .total_memories(n.saturating_mul(self.memories))
            .total_tables(n.saturating_mul(self.tables))
            .max_memory_size(self.memory_bytes_max);
        if keep_resident > 0 {
            // A freed slot's pages that the instance wrote are reset by
            // writing them (the kernel's page-map scan finds them), up to
            // `keep_resident`, instead of an `madvise` that interrupts
            // every core, and the next instance takes no fault on them
            // (ADR 0078). Without the scan wasmtime would write the whole
            // first `keep_resident` bytes of every slot: the caller passes
            // 0 there (`runtime::instance_keep_resident_bytes`).
            pool.linear_memory_keep_resident(keep_resident)
                .table_keep_resident(keep_resident)
                .pagemap_scan(wasmtime::Enabled::Yes);
        }
        c.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        Engine::new(&c).map_err(|e| RuntimeError::Internal(format!("engine: {e:#}")))
    }

    /// A compile worker's engine: the node's, without the instance pool
    /// (it instantiates nothing, and the pool's writable reservations
    /// would count against the worker's data limit). The allocation
    /// strategy is not part of what compiled code depends on; the node
    /// checks the pool's limits when it loads the code.
    pub(crate) fn compile_engine(&self) -> Result<Engine, RuntimeError> {
        let mut c = self.base();
        c.allocation_strategy(InstanceAllocationStrategy::OnDemand);
        Engine::new(&c).map_err(|e| RuntimeError::Internal(format!("engine: {e:#}")))
    }

    /// The settings as one command-line argument.
    fn to_arg(self) -> String {
        format!(
            "instances={},cores={},memories={},tables={},memory_bytes_max={}",
            self.instances, self.cores, self.memories, self.tables, self.memory_bytes_max
        )
    }

    fn from_arg(arg: &str) -> Result<EngineSettings, String> {
        let mut s = EngineSettings {
            instances: 0,
            cores: 0,
            memories: 0,
            tables: 0,
            memory_bytes_max: 0,
        };
        let mut seen = 0;
        for part in arg.split(',') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("settings: `{part}` is not key=value"))?;
            let bad = |_| format!("settings: {k}={v} is not a number");
            match k {
                "instances" => s.instances = v.parse().map_err(bad)?,
                "cores" => s.cores = v.parse().map_err(bad)?,
                "memories" => s.memories = v.parse().map_err(bad)?,
                "tables" => s.tables = v.parse().map_err(bad)?,
                "memory_bytes_max" => s.memory_bytes_max = v.parse().map_err(bad)?,
                _ => return Err(format!("settings: unknown key `{k}`")),
            }
            seen += 1;
        }
        if seen != 5 {
            return Err(format!("settings: expected 5 keys, got `{arg}`"));
        }
        Ok(s)
    }
}

/// Exit code of a worker whose component does not compile (its stderr says
/// why).
const EXIT_DOES_NOT_COMPILE: i32 = 1;
/// Exit code of a worker started wrongly.
const EXIT_USAGE: i32 = 2;

/// Most of a worker's stderr the node keeps (the reason a component does
/// not compile).
const STDERR_BYTES_MAX: u64 = 16 * 1024;

/// How often the node looks whether the child has ended.
const POLL: Duration = Duration::from_millis(2);

/// The compile worker: `args` are what follows the program's own
/// arguments: `<memory bytes max> <settings>`. Reads a component from
/// stdin, writes its compiled code to stdout. Returns the exit code.
pub fn worker_main(args: &[String]) -> i32 {
    let [memory, settings] = args else {
        eprintln!("usage: <memory bytes max> <engine settings>");
        return EXIT_USAGE;
    };
    let Ok(memory) = memory.parse::<u64>() else {
        eprintln!("memory bytes max `{memory}` is not a number");
        return EXIT_USAGE;
    };
    let settings = match EngineSettings::from_arg(settings) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return EXIT_USAGE;
        }
    };
    if let Err(e) = limit_data(memory) {
        eprintln!("could not bound this process's memory: {e}");
        return EXIT_USAGE;
    }
    let engine = match settings.compile_engine() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("{e}");
            return EXIT_USAGE;
        }
    };
    let mut component = Vec::new();
    if let Err(e) = std::io::stdin().lock().read_to_end(&mut component) {
        eprintln!("reading the component: {e}");
        return EXIT_USAGE;
    }
    match engine.precompile_component(&component) {
        Ok(code) => {
            drop(component);
            let mut out = std::io::stdout().lock();
            match out.write_all(&code).and_then(|()| out.flush()) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("writing the compiled code: {e}");
                    EXIT_USAGE
                }
            }
        }
        Err(e) => {
            eprint!("{e:#}");
            EXIT_DOES_NOT_COMPILE
        }
    }
}

/// Caps this process's data segment at `bytes`.
fn limit_data(bytes: u64) -> std::io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: setrlimit reads the struct it is given and nothing else.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_DATA, &limit) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// What the node asks of one compilation in a child.
pub(crate) struct ChildCompile<'a> {
    pub program: &'a PathBuf,
    pub args: &'a [OsString],
    pub env: &'a [(OsString, OsString)],
    pub settings: EngineSettings,
    pub memory_bytes_max: u64,
    pub code_bytes_max: u64,
    pub deadline: Instant,
    pub deadline_ms: u64,
}

impl ChildCompile<'_> {
    /// Compiles `component` in a child; its serialized code, read from the
    /// child only after it exited with success.
    pub(crate) fn run(&self, component: &[u8]) -> Result<Vec<u8>, RuntimeError> {
        let spawn_failed = |e: std::io::Error| {
            RuntimeError::Internal(format!(
                "could not start the compile worker {}: {e}",
                self.program.display()
            ))
        };
        let mut child = Command::new(self.program)
            .args(self.args)
            .arg(self.memory_bytes_max.to_string())
            .arg(self.settings.to_arg())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE")
            .spawn()
            .map_err(spawn_failed)?;
        let mut stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        // Writing and reading run beside the wait, so neither a child that
        // never reads nor one that writes without end can hold the node
        // past the deadline; both threads end when the child's pipes close.
        let bytes = component.to_vec();
        let writer = std::thread::Builder::new()
            .name("wasmkeep-compile-in".into())
            .spawn(move || {
                // A child that dies early closes the pipe: its exit says why.
                let _ = stdin.write_all(&bytes);
            })
            .map_err(|e| RuntimeError::Internal(format!("could not start a compilation: {e}")))?;
        let cap = self.code_bytes_max;
        let out = read_capped_in_thread(stdout, cap.saturating_add(1))?;
        let err = read_capped_in_thread(stderr, STDERR_BYTES_MAX)?;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if crate::clock::instant() >= self.deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let _ = writer.join();
                    tracing::warn!(
                        limit_ms = self.deadline_ms,
                        "a compilation ran past component_compile_ms_max: its worker was stopped"
                    );
                    return Err(RuntimeError::CompileTimeout {
                        limit: self.deadline_ms,
                    });
                }
                Ok(None) => std::thread::sleep(POLL),
                Err(e) => {
                    let _ = child.kill();
                    return Err(RuntimeError::Internal(format!(
                        "waiting for the compile worker: {e}"
                    )));
                }
            }
        };
        let _ = writer.join();
        let out = out.join().unwrap_or_default();
        let err = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
        self.outcome(status, out, err)
    }

    fn outcome(
        &self,
        status: ExitStatus,
        out: Vec<u8>,
        err: String,
    ) -> Result<Vec<u8>, RuntimeError> {
        use std::os::unix::process::ExitStatusExt;
        match status.code() {
            Some(0) if out.len() as u64 > self.code_bytes_max => {
                Err(RuntimeError::InvalidComponent(format!(
                    "its compiled code is larger than this node keeps for a component of its size: limit {} bytes",
                    self.code_bytes_max
                )))
            }
            Some(0) => Ok(out),
            Some(EXIT_DOES_NOT_COMPILE) => Err(RuntimeError::InvalidComponent(format!(
                "does not compile: {}",
                err.trim()
            ))),
            _ if err.contains("memory allocation of") || err.contains("out of memory") => {
                Err(RuntimeError::CompileMemoryExceeded {
                    limit: self.memory_bytes_max,
                })
            }
            code => Err(RuntimeError::Internal(format!(
                "the compile worker failed ({}): {}",
                match (code, status.signal()) {
                    (Some(c), _) => format!("exit code {c}"),
                    (None, Some(s)) => format!("signal {s}"),
                    (None, None) => "no status".into(),
                },
                err.trim()
            ))),
        }
    }
}

/// Reads at most `cap` bytes of `from` on a thread of its own, then drains
/// the rest unread so the writer never blocks.
fn read_capped_in_thread(
    from: impl Read + Send + 'static,
    cap: u64,
) -> Result<std::thread::JoinHandle<Vec<u8>>, RuntimeError> {
    std::thread::Builder::new()
        .name("wasmkeep-compile-out".into())
        .spawn(move || {
            let mut from = from;
            let mut buf = Vec::new();
            let _ = (&mut from).take(cap).read_to_end(&mut buf);
            let _ = std::io::copy(&mut from, &mut std::io::sink());
            buf
        })
        .map_err(|e| RuntimeError::Internal(format!("could not start a compilation: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_through_their_argument() {
        let s = EngineSettings {
            instances: 2200,
            cores: 8,
            memories: 4,
            tables: 4,
            memory_bytes_max: 128 << 20,
        };
        assert_eq!(EngineSettings::from_arg(&s.to_arg()), Ok(s));
        assert!(EngineSettings::from_arg("instances=1").is_err());
        assert!(
            EngineSettings::from_arg("instances=x,cores=1,memories=1,tables=1,memory_bytes_max=1")
                .is_err()
        );
    }
}
