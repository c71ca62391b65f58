//! `wasmkeep-sim`: runs seeds of the cluster simulation from the command line.
//!
//! It is a thin argument parser over `wasmkeep_sim::run_seeds` and
//! `wasmkeep_sim::run`; it is not a test harness (the tests in `tests/` are).
//!
//! ```text
//! wasmkeep-sim --seeds N [--first-seed S]             safe rules; exit 0 only if every invariant held
//! wasmkeep-sim --variant NAME [--seeds N] [--first-seed S]   hunt: exit 1 at the first seed that catches it
//! wasmkeep-sim --variant NAME --seeds N --all        run all N seeds, count the catching ones
//! wasmkeep-sim --seed S --trace [--variant NAME]      one seed's full trace
//! --set name=value                                    change a fault or workload knob (see Options::set)
//! ```
//!
//! Every summary ends with the counters (`Stats`), among them how often each
//! sweep cap bound: `entries_cap_bound` (passes that read
//! `sweep_entries_max` entries) and `deliveries_cap_bound` (passes where
//! `sweep_deliveries_max` left eligible entries for the next sweep).

use std::process::ExitCode;
use std::time::Instant;

use wasmkeep_cluster::Variant;
use wasmkeep_sim::cost::Cost;
use wasmkeep_sim::{Batch, Options, Violation, run, run_seeds};

const USAGE: &str = "usage: wasmkeep-sim [--seeds N] [--first-seed S] [--variant NAME [--all]] \
                     [--seed S --trace] [--set name=value]";

struct Args {
    seeds: u64,
    first_seed: u64,
    seed: Option<u64>,
    trace: bool,
    all: bool,
    variant: Variant,
    knobs: Vec<(String, String)>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        seeds: 200,
        first_seed: 0,
        seed: None,
        trace: false,
        all: false,
        variant: Variant::Safe,
        knobs: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    let number = |v: Option<String>, flag: &str| -> Result<u64, String> {
        v.ok_or_else(|| format!("missing value: flag={flag}"))?
            .parse()
            .map_err(|_| format!("not a number: flag={flag}"))
    };
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--seeds" => a.seeds = number(it.next(), "--seeds")?,
            "--first-seed" => a.first_seed = number(it.next(), "--first-seed")?,
            "--seed" => a.seed = Some(number(it.next(), "--seed")?),
            "--trace" => a.trace = true,
            "--all" => a.all = true,
            "--set" => {
                let kv = it.next().ok_or("missing value: flag=--set")?;
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| format!("expected name=value: arg={kv}"))?;
                a.knobs.push((k.to_owned(), v.to_owned()));
            }
            "--variant" => {
                let name = it.next().ok_or("missing value: flag=--variant")?;
                a.variant =
                    Variant::parse(&name).ok_or_else(|| format!("unknown variant: name={name}"))?;
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument: arg={other}")),
        }
    }
    Ok(a)
}

/// Prints the argument error (if any), the usage line and the variant names.
fn usage(error: &str) -> ExitCode {
    if !error.is_empty() {
        eprintln!("{error}");
    }
    eprintln!("{USAGE}");
    let names: Vec<&str> = Variant::UNSAFE.iter().map(|v| v.name()).collect();
    eprintln!("variants: {}", names.join(" "));
    ExitCode::from(2)
}

/// The options every seed starts from: the variant and the `--set` knobs.
fn base_options(args: &Args) -> Result<Options, ExitCode> {
    let mut base = Options {
        variant: args.variant,
        ..Options::default()
    };
    for (k, v) in &args.knobs {
        if let Err(e) = base.set(k, v) {
            eprintln!("{e}");
            return Err(ExitCode::from(2));
        }
    }
    Ok(base)
}

/// Prints a seed's bucket cost: requests per node per second by kind, the
/// busiest prefixes and how late alarms ran (`wasmkeep_sim::cost`).
fn print_cost(seed: u64, nodes: usize, actors: usize, cost: &Cost) {
    println!("bucket cost of seed {seed} ({nodes} nodes, {actors} actors):");
    println!("{cost}");
}

/// Prints a violation as the summary's `VIOLATION` line.
fn print_violation(seed: u64, v: &Violation) {
    println!(
        "VIOLATION seed={seed} kind={} at_ms={}: {}",
        v.kind, v.time_ms, v.detail
    );
}

/// `--seed S`: runs one seed and prints its trace (with `--trace`), its
/// profile, its counters and whether every invariant held.
fn run_one(base: Options, seed: u64, trace: bool) -> ExitCode {
    let r = run(Options {
        seed,
        trace,
        ..base
    });
    for line in &r.trace {
        println!("{line}");
    }
    println!(
        "variant={} seed={seed} trace_lines={} trace_hash={:016x}",
        r.variant.name(),
        r.trace_count,
        r.trace_hash
    );
    println!("{:?}", r.profile);
    println!("{}", r.stats);
    print_cost(seed, r.nodes, r.actors, &r.cost);
    match r.violation {
        Some(v) => {
            print_violation(seed, &v);
            ExitCode::from(1)
        }
        None => {
            println!("every invariant held: seed={seed}");
            ExitCode::SUCCESS
        }
    }
}

/// Exit 0 if no seed broke an invariant (or caught the variant), else 1.
fn exit_for(batch: &Batch) -> ExitCode {
    if batch.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `--variant NAME --all`: the seeds that caught the variant.
fn report_all(args: &Args, batch: &Batch, secs: f64) -> ExitCode {
    let seeds: Vec<String> = batch.failures.iter().map(|(s, _)| s.to_string()).collect();
    println!(
        "variant={} seeds={} first_seed={} caught_by={} ({secs:.1} s): {}",
        args.variant.name(),
        batch.seeds,
        args.first_seed,
        batch.failures.len(),
        seeds.join(",")
    );
    exit_for(batch)
}

/// `--variant NAME`: whether (and at which seed) the hunt caught the variant.
fn report_hunt(args: &Args, batch: &Batch, secs: f64) -> ExitCode {
    match batch.failures.first() {
        Some((seed, v)) => {
            println!(
                "caught variant={} seed={seed} kind={} after {} seeds ({secs:.1} s)",
                args.variant.name(),
                v.kind,
                batch.seeds
            );
            ExitCode::from(1)
        }
        None => {
            println!(
                "not caught variant={} seeds={} ({secs:.1} s)",
                args.variant.name(),
                batch.seeds
            );
            ExitCode::SUCCESS
        }
    }
}

/// The safe rules: the summary line with the counters worth a glance.
fn report_safe(args: &Args, batch: &Batch, secs: f64) -> ExitCode {
    let s = &batch.stats;
    println!(
        "seeds={} first_seed={} failed={} takeovers={} alarms={} deletes={} no_state_deliveries={} \
         entries_cap_bound={} deliveries_cap_bound={} listing_missed={} ({secs:.1} s)",
        batch.seeds,
        args.first_seed,
        batch.failures.len(),
        s.takeovers,
        s.alarms,
        s.deletes,
        s.no_state_deliveries,
        s.entries_cap_bound,
        s.deliveries_cap_bound,
        s.listing_missed
    );
    exit_for(batch)
}

/// `--seeds N`: runs the seeds, prints every violation and the counters,
/// then the summary of the hunt or of the safe run.
fn run_batch(args: &Args, base: &Options) -> ExitCode {
    // The run's real duration, for the report: the simulated world has a
    // clock of its own and never reads this one.
    #[allow(
        clippy::disallowed_methods,
        reason = "the wall time of the run, reported"
    )]
    let started = Instant::now();
    let hunting = args.variant != Variant::Safe;
    let batch = run_seeds(base, args.first_seed, args.seeds, hunting && !args.all);
    let secs = started.elapsed().as_secs_f64();
    for (seed, v) in &batch.failures {
        print_violation(*seed, v);
    }
    println!("{}", batch.stats);
    for (seed, nodes, actors, cost) in &batch.costs {
        print_cost(*seed, *nodes, *actors, cost);
    }
    if hunting && args.all {
        report_all(args, &batch, secs)
    } else if hunting {
        report_hunt(args, &batch, secs)
    } else {
        report_safe(args, &batch, secs)
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => return usage(&e),
    };
    let base = match base_options(&args) {
        Ok(b) => b,
        Err(code) => return code,
    };
    match args.seed {
        Some(seed) => run_one(base, seed, args.trace),
        None => run_batch(&args, &base),
    }
}
