//! The report: the machine, every run's raw figures and checks, and the
//! median, minimum and maximum of each figure over the runs.

use std::fmt::Write;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;
use serde_json::json;

use crate::BenchArgs;
use crate::node::log_tail;
use crate::workloads::{Check, RunOutput};

/// What the figures were measured on.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub mem_total_mib: u64,
    pub kernel: String,
    /// The file system of the data directories (what fsync costs).
    pub data_fs: String,
}

impl Machine {
    pub(crate) fn probe(data: &Path) -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let meminfo = read("/proc/meminfo");
        Machine {
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
                .unwrap_or_else(|| "unknown".into()),
            mem_total_mib: meminfo
                .lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .map(|kib| kib / 1024)
                .unwrap_or(0),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            data_fs: fs_type(data).unwrap_or_else(|| "unknown".into()),
        }
    }
}

/// The type of the file system holding `path` (longest mount-point match).
fn fs_type(path: &Path) -> Option<String> {
    let path = path.canonicalize().ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (dev, mnt, ty) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(mnt)
                .then(|| (mnt.len(), format!("{ty} ({dev} on {mnt})")))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, t)| t)
}

/// The lines that say how the figures were obtained.
pub(crate) fn preamble(args: &BenchArgs, m: &Machine, server: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "wasmkeep bench {}: the load generator runs on the SAME machine as the node \
         ({} CPUs shared, {} MiB, {}); it is a closed loop (one request outstanding per \
         keep-alive HTTP/1.1 connection) on one thread, so latencies are service times under \
         load, without correction for coordinated omission.",
        env!("CARGO_PKG_VERSION"),
        m.cpus,
        m.mem_total_mib,
        m.cpu_model
    );
    if server {
        let _ = writeln!(
            s,
            "target: {} (durability unknown to the benchmark; w2-restart and w4 not run)",
            args.server.as_deref().unwrap_or("")
        );
    } else {
        let _ = writeln!(
            s,
            "target: a fresh `wasmkeep serve --examples` per run (same binary; w6 and w5-kill: \
             three, a cluster on a folder bucket), data on {}",
            m.data_fs
        );
    }
    let _ = write!(
        s,
        "settings: lang={} runs={} connections={} warmup_s={} measure_s={} actors={} alarms={} \
         alarm_lead_s={} cold_actors={} idle_actors={} open_actors={} seed={} lease_period_ms={} \
         lease_grace_ms={} w6_durability={}",
        args.lang,
        args.runs,
        args.connections,
        args.warmup_s,
        args.measure_s,
        args.actors,
        args.alarms,
        args.alarm_lead_s,
        args.cold_actors,
        args.idle_actors,
        args.open_actors,
        args.seed,
        args.lease_period_ms,
        args.lease_grace_ms,
        args.w6_durability.as_str()
    );
    if let Some(p) = &args.node_config {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let _ = write!(s, "\nnode settings (--node-config): {}", lines.join("; "));
    }
    s
}

/// One run of one workload.
#[derive(Debug, Serialize)]
pub(crate) struct RunRecord {
    pub workload: &'static str,
    pub durability: &'static str,
    pub run: usize,
    #[serde(serialize_with = "figures_as_map")]
    pub figures: Vec<(String, f64)>,
    pub checks: Vec<Check>,
    /// The run could not complete (the node did not start, a request
    /// could not be sent…).
    pub error: Option<String>,
    /// Wall time of the run, node start and stop included.
    pub wall_s: f64,
    /// CPU that processes other than the benchmark and its nodes used
    /// during the run: how disturbed the run was.
    pub interference: Option<Interference>,
    /// Other processes took more than [`DISTURBED_SHARE`] of the machine.
    pub disturbed: bool,
}

fn figures_as_map<S: serde::Serializer>(f: &[(String, f64)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(f.len()))?;
    for (k, v) in f {
        // NaN (a figure that does not exist, e.g. lateness with nothing
        // fired) becomes null.
        m.serialize_entry(k, &v.is_finite().then_some(*v))?;
    }
    m.end()
}

impl RunRecord {
    pub(crate) fn new(
        workload: &'static str,
        durability: &'static str,
        run: usize,
        result: Result<RunOutput>,
        dir: &Path,
    ) -> RunRecord {
        let logs = node_logs(dir);
        match result {
            Ok(out) => {
                let mut checks = out.checks;
                if checks.iter().any(|c| !c.ok) {
                    for (name, log) in &logs {
                        checks.push(Check {
                            name: format!("{name}_log_tail"),
                            ok: true,
                            detail: log_tail(log, 30),
                        });
                    }
                }
                RunRecord {
                    workload,
                    durability,
                    run,
                    figures: out.figures,
                    checks,
                    error: None,
                    wall_s: 0.0,
                    interference: None,
                    disturbed: false,
                }
            }
            Err(e) => {
                let tail: String = logs
                    .iter()
                    .map(|(name, log)| format!("\n{name} log (last lines):\n{}", log_tail(log, 30)))
                    .collect();
                RunRecord {
                    workload,
                    durability,
                    run,
                    figures: Vec::new(),
                    checks: Vec::new(),
                    error: Some(format!("{e:#}{tail}")),
                    wall_s: 0.0,
                    interference: None,
                    disturbed: false,
                }
            }
        }
    }

    /// Records what else ran on the machine during the run.
    pub(crate) fn set_interference(&mut self, i: Interference, cpus: usize) {
        self.disturbed = i.other_user_cpu_s > DISTURBED_SHARE * self.wall_s * cpus.max(1) as f64;
        self.interference = Some(i);
    }

    fn failures(&self) -> Vec<String> {
        let head = format!("{} {} run {}", self.workload, self.durability, self.run);
        let mut out: Vec<String> = self
            .checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| format!("{head}: {}: {}", c.name, c.detail))
            .collect();
        if let Some(e) = &self.error {
            out.push(format!("{head}: did not complete: {e}"));
        }
        out
    }

    /// A progress line.
    pub(crate) fn one_line(&self) -> String {
        let figs: Vec<String> = self
            .figures
            .iter()
            .map(|(k, v)| format!("{k}={}", num(*v)))
            .collect();
        let f = self.failures();
        let env = match self.interference {
            Some(i) => format!(
                "[{:.0} s; others: user {:.1} CPU-s, kernel {:.1}, steal {:.1}{}]",
                self.wall_s,
                i.other_user_cpu_s,
                i.other_kernel_cpu_s,
                i.steal_cpu_s,
                if self.disturbed { "; DISTURBED" } else { "" }
            ),
            None => format!("[{:.0} s]", self.wall_s),
        };
        if f.is_empty() {
            format!("ok: {} {env}", figs.join(" "))
        } else {
            format!("FAILED: {} | {} {env}", f.join(" | "), figs.join(" "))
        }
    }
}

/// The node logs of a run's directory (`node.log`, or a cluster's
/// `node0.log`…), named by their stem.
fn node_logs(dir: &Path) -> Vec<(String, std::path::PathBuf)> {
    let mut logs: Vec<(String, std::path::PathBuf)> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.extension().is_some_and(|x| x == "log")
                        && p.file_stem()
                            .and_then(|s| s.to_str())
                            .is_some_and(|s| s.starts_with("node"))
                })
                .map(|p| {
                    let name = p.file_stem().unwrap_or_default().to_string_lossy().into();
                    (name, p)
                })
                .collect()
        })
        .unwrap_or_default();
    logs.sort();
    logs
}

/// A workload that was asked for and not run.
#[derive(Debug, Serialize)]
pub(crate) struct Skipped {
    pub workload: &'static str,
    pub reason: &'static str,
}

#[derive(Debug, Serialize)]
struct SummaryRow {
    workload: &'static str,
    durability: &'static str,
    figure: String,
    median: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
    /// Runs that produced this figure.
    runs: usize,
}

pub(crate) struct Report {
    settings: serde_json::Value,
    preamble: String,
    machine: Machine,
    records: Vec<RunRecord>,
    skipped: Vec<Skipped>,
}

fn median(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// A figure for the table: integers as integers, others with three
/// significant-ish digits after the point.
fn num(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if (v.fract() == 0.0 && v.abs() < 1e15) || v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

impl Report {
    pub(crate) fn new(
        args: &BenchArgs,
        machine: Machine,
        server: bool,
        records: Vec<RunRecord>,
        skipped: Vec<Skipped>,
    ) -> Report {
        let settings = json!({
            "runs": args.runs,
            "connections": args.connections,
            "warmup_s": args.warmup_s,
            "measure_s": args.measure_s,
            "actors": args.actors,
            "alarms": args.alarms,
            "alarm_lead_s": args.alarm_lead_s,
            "cold_actors": args.cold_actors,
            "idle_actors": args.idle_actors,
            "open_actors": args.open_actors,
            "seed": args.seed,
            "lease_period_ms": args.lease_period_ms,
            "lease_grace_ms": args.lease_grace_ms,
            "w6_durability": args.w6_durability.as_str(),
            "server": args.server,
            "durability": format!("{:?}", args.durability).to_lowercase(),
            "node_config": args
                .node_config
                .as_ref()
                .and_then(|p| std::fs::read_to_string(p).ok()),
        });
        Report {
            settings,
            preamble: preamble(args, &machine, server),
            machine,
            records,
            skipped,
        }
    }

    fn summary(&self) -> Vec<SummaryRow> {
        let mut groups: Vec<(&'static str, &'static str)> = Vec::new();
        for r in &self.records {
            if !groups.contains(&(r.workload, r.durability)) {
                groups.push((r.workload, r.durability));
            }
        }
        let mut rows = Vec::new();
        for (w, d) in groups {
            let runs: Vec<&RunRecord> = self
                .records
                .iter()
                .filter(|r| r.workload == w && r.durability == d)
                .collect();
            let mut names: Vec<&str> = Vec::new();
            for r in &runs {
                for (k, _) in &r.figures {
                    if !names.contains(&k.as_str()) {
                        names.push(k);
                    }
                }
            }
            for name in names {
                let mut vals: Vec<f64> = runs
                    .iter()
                    .filter_map(|r| r.figures.iter().find(|(k, _)| k == name).map(|(_, v)| *v))
                    .filter(|v| v.is_finite())
                    .collect();
                vals.sort_by(f64::total_cmp);
                rows.push(SummaryRow {
                    workload: w,
                    durability: d,
                    figure: name.to_string(),
                    median: median(&vals),
                    min: vals.first().copied(),
                    max: vals.last().copied(),
                    runs: vals.len(),
                });
            }
        }
        rows
    }

    /// The human-readable report.
    pub(crate) fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "\n{}\n", self.preamble);
        let _ = writeln!(
            s,
            "{:<11} {:<24} {:>10} {:>10} {:>10}  {:<10} {:>4}",
            "workload", "figure", "median", "min", "max", "durability", "runs"
        );
        let mut last = "";
        for r in self.summary() {
            if !last.is_empty() && last != r.workload {
                s.push('\n');
            }
            last = r.workload;
            let f = |v: Option<f64>| v.map(num).unwrap_or_else(|| "-".into());
            let _ = writeln!(
                s,
                "{:<11} {:<24} {:>10} {:>10} {:>10}  {:<10} {:>4}",
                r.workload,
                r.figure,
                f(r.median),
                f(r.min),
                f(r.max),
                r.durability,
                r.runs
            );
        }
        for k in &self.skipped {
            let _ = writeln!(s, "\n{:<11} {}", k.workload, k.reason);
        }
        let runs: Vec<(Interference, f64)> = self
            .records
            .iter()
            .filter_map(|r| Some((r.interference?, r.wall_s)))
            .collect();
        if !runs.is_empty() {
            let cpus = self.machine.cpus.max(1) as f64;
            let wall: f64 = runs.iter().map(|(_, w)| w).sum();
            let share = |f: fn(&Interference) -> f64| {
                let total: f64 = runs.iter().map(|(i, _)| f(i)).sum();
                let worst = runs
                    .iter()
                    .map(|(i, w)| f(i) / (w * cpus))
                    .fold(0.0, f64::max);
                format!(
                    "{total:.1} CPU-s ({:.1}% of the machine; worst run {:.1}%)",
                    100.0 * total / (wall * cpus),
                    100.0 * worst
                )
            };
            let _ = writeln!(
                s,
                "\nbesides the benchmark, during {wall:.0} s of runs: other processes' user time \
                 {}; kernel time (mostly writeback of the node's own files) {}; steal {}",
                share(|i| i.other_user_cpu_s),
                share(|i| i.other_kernel_cpu_s),
                share(|i| i.steal_cpu_s),
            );
            let disturbed: Vec<String> = self
                .records
                .iter()
                .filter(|r| r.disturbed)
                .map(|r| {
                    let other = r.interference.map(|i| i.other_user_cpu_s).unwrap_or(0.0);
                    format!(
                        "{} {} run {} ({:.0}%)",
                        r.workload,
                        r.durability,
                        r.run,
                        100.0 * other / (r.wall_s * cpus)
                    )
                })
                .collect();
            if !disturbed.is_empty() {
                let _ = writeln!(
                    s,
                    "DISTURBED runs (other processes' user time above {:.0}% of the machine; \
                     their figures are in the table): {}",
                    100.0 * DISTURBED_SHARE,
                    disturbed.join(", ")
                );
            }
        }
        let failures = self.failures();
        let _ = writeln!(
            s,
            "\nchecks: {}",
            if failures.is_empty() {
                format!("all passed ({} runs)", self.records.len())
            } else {
                format!("{} FAILED (see below)", failures.len())
            }
        );
        s
    }

    /// Everything, for `--json`.
    pub(crate) fn json(&self) -> serde_json::Value {
        json!({
            "wasmkeep_version": env!("CARGO_PKG_VERSION"),
            "note": self.preamble,
            "generator": {
                "kind": "closed loop, HTTP/1.1 keep-alive, one request outstanding per connection",
                "same_machine_as_node": true,
                "threads": 1,
                "coordinated_omission_corrected": false,
            },
            "machine": self.machine,
            "settings": self.settings,
            "runs": self.records,
            "summary": self.summary(),
            "not_run": self.skipped,
            "ok": self.failures().is_empty(),
        })
    }

    pub(crate) fn failures(&self) -> Vec<String> {
        self.records.iter().flat_map(|r| r.failures()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&[1.0, 2.0, 9.0]), Some(2.0));
        assert_eq!(median(&[1.0, 3.0]), Some(2.0));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn numbers_print_plainly() {
        assert_eq!(num(8123.4), "8123");
        assert_eq!(num(12.34), "12.3");
        assert_eq!(num(0.8512), "0.851");
        assert_eq!(num(0.0), "0");
        assert_eq!(num(f64::NAN), "-");
    }
}

/// CPU time of everything on the machine, and of this process with its
/// reaped children (the nodes it started), to tell how much CPU *other*
/// processes took during a run: on two shared cores, a build running
/// beside the benchmark changes every figure.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuSample {
    machine_user_s: f64,
    machine_system_s: f64,
    steal_s: f64,
    ours_user_s: f64,
    ours_system_s: f64,
}

/// A run is reported as disturbed when other processes' user time was
/// more than this share of the machine's CPU time during the run.
pub(crate) const DISTURBED_SHARE: f64 = 0.05;

/// What a run's machine did besides the run, in CPU seconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Interference {
    /// User time of other processes (a build, another benchmark): the
    /// figure that says whether a run was disturbed.
    pub other_user_cpu_s: f64,
    /// Kernel time outside the benchmark's processes: mostly kernel threads
    /// writing back and journaling the node's own files, plus other
    /// processes' system time.
    pub other_kernel_cpu_s: f64,
    /// Time the hypervisor gave to someone else.
    pub steal_cpu_s: f64,
}

impl CpuSample {
    pub(crate) fn now() -> Option<CpuSample> {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let hz = if hz > 0 { hz as f64 } else { 100.0 };
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        // user nice system idle iowait irq softirq steal
        let cpu: Vec<f64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap_or(0.0))
            .collect();
        let at = |i: usize| cpu.get(i).copied().unwrap_or(0.0);
        let me = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name (which may hold spaces): utime,
        // stime, cutime and cstime are fields 14 to 17 of the line, indexes
        // 11 to 14 after the closing parenthesis (index 0 is the state).
        let after: Vec<&str> = me.rsplit_once(')')?.1.split_whitespace().collect();
        let field = |i: usize| after.get(i).and_then(|v| v.parse::<f64>().ok());
        Some(CpuSample {
            machine_user_s: (at(0) + at(1)) / hz,
            machine_system_s: (at(2) + at(5) + at(6)) / hz,
            steal_s: at(7) / hz,
            ours_user_s: (field(11)? + field(13)?) / hz,
            ours_system_s: (field(12)? + field(14)?) / hz,
        })
    }

    /// What others used since `start`.
    pub(crate) fn since(&self, start: &CpuSample) -> Interference {
        let d = |a: f64, b: f64| (a - b).max(0.0);
        Interference {
            other_user_cpu_s: d(
                self.machine_user_s - start.machine_user_s,
                self.ours_user_s - start.ours_user_s,
            ),
            other_kernel_cpu_s: d(
                self.machine_system_s - start.machine_system_s,
                self.ours_system_s - start.ours_system_s,
            ),
            steal_cpu_s: d(self.steal_s, start.steal_s),
        }
    }
}
