//! The closed-loop load generator.
//!
//! `connections` virtual users each own one keep-alive HTTP/1.1 connection
//! and send their next request only after the previous response arrived.
//! The run has a warm-up period and then a measured period; a request's
//! latency (send to last byte of the response, in microseconds) goes into
//! an HdrHistogram if it started after the warm-up ended and finished
//! before the measured period ended. Every successful response, warm-up
//! included, is counted, because the correctness checks compare the
//! node's state against everything it acknowledged.
//!
//! # Coordinated omission
//!
//! A closed loop measures *service time under load*, not the latency an
//! open stream of users would see. While one response is slow, its virtual
//! user sends nothing, so the requests that a user on a fixed schedule
//! would have sent during the stall are never issued and never recorded as
//! late: the histogram under-reports the tail whenever the node stalls
//! (Gil Tene's "coordinated omission"). Throughput is what the node
//! sustained with `connections` requests outstanding; p99 is the p99 of
//! requests that were actually sent. An open-loop (constant arrival rate)
//! generator would be needed to measure latency at a given offered load.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;
use hyper::Method;

use crate::client::{Answer, Conn, Endpoint};

/// Error messages kept per run (the count is always exact).
const ERROR_SAMPLES_MAX: usize = 8;

/// What the virtual users send.
pub struct LoadSpec {
    pub connections: usize,
    pub warmup: Duration,
    pub measure: Duration,
    pub method: Method,
    /// Request paths; each request picks one uniformly at random.
    pub paths: Arc<Vec<String>>,
    /// Seed of the per-connection random choice of path.
    pub seed: u64,
}

/// What a run measured.
pub struct LoadOutcome {
    /// 2xx responses over the whole run, warm-up included.
    pub ok_total: u64,
    /// Requests that failed (non-2xx or transport error), whole run.
    pub errors_total: u64,
    pub error_samples: Vec<String>,
    /// Latency of measured requests, in microseconds.
    pub latency_us: Histogram<u64>,
    /// Length of the measured period, in seconds.
    pub measured_s: f64,
    /// 2xx responses run by another node than the one expected
    /// ([`Targets::expect`]): in a cluster, the actor's owner changed.
    pub unexpected_node: u64,
    pub unexpected_samples: Vec<String>,
}

impl LoadOutcome {
    pub fn requests_per_s(&self) -> f64 {
        self.latency_us.len() as f64 / self.measured_s
    }

    pub fn quantile_ms(&self, q: f64) -> f64 {
        self.latency_us.value_at_quantile(q) as f64 / 1000.0
    }
}

/// A histogram of microseconds from 1 µs to an hour, 3 significant digits.
pub fn histogram_us() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// SplitMix64: a tiny seeded generator, so a run's choice of actors is
/// reproducible without a dependency.
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Runs the closed loop. All connections are opened before the clock
/// starts, so connection setup is in neither period.
pub async fn closed_loop(endpoint: &Endpoint, spec: &LoadSpec) -> Result<LoadOutcome> {
    assert!(!spec.paths.is_empty(), "a load needs at least one path");
    let targets = Arc::new(Targets {
        paths: spec.paths.to_vec(),
        expect: None,
    });
    let users = (0..spec.connections.max(1))
        .map(|_| User {
            endpoint: endpoint.clone(),
            phases: vec![Arc::clone(&targets)],
        })
        .collect();
    let phased = PhasedSpec {
        users,
        warmup: spec.warmup,
        measure: spec.measure,
        slice: spec.measure.max(Duration::from_millis(1)),
        method: spec.method.clone(),
        seed: spec.seed,
    };
    let mut out = closed_loop_phased(&phased).await?;
    Ok(out.remove(0))
}

/// What one virtual user sends in one phase: paths it picks from uniformly
/// at random, and the node expected to run them (`x-wasmkeep-node`), if
/// one is.
pub struct Targets {
    pub paths: Vec<String>,
    pub expect: Option<String>,
}

/// A virtual user: its connection's node, and its targets per phase.
pub struct User {
    pub endpoint: Endpoint,
    pub phases: Vec<Arc<Targets>>,
}

/// Several loads measured in one run, interleaved in time: the run's
/// clock is cut into slices of `slice`, given to the phases in turn (from
/// the end of the warm-up on, and backwards through it), so that every
/// phase sees the same machine, whatever else runs on it. Each phase is
/// measured for `measure` in all.
pub struct PhasedSpec {
    pub users: Vec<User>,
    pub warmup: Duration,
    /// Measured time per phase.
    pub measure: Duration,
    pub slice: Duration,
    pub method: Method,
    pub seed: u64,
}

impl PhasedSpec {
    fn phases(&self) -> usize {
        self.users.first().map_or(1, |u| u.phases.len()).max(1)
    }

    /// Seconds of the measured window that belong to each phase.
    fn measured_s(&self) -> Vec<f64> {
        let n = self.phases();
        let total = self.measure.as_secs_f64() * n as f64;
        let slice = self.slice.as_secs_f64();
        let mut out = vec![0.0; n];
        let mut t = 0.0;
        let mut i = 0usize;
        while t < total {
            let d = slice.min(total - t);
            out[i % n] += d;
            t += d;
            i += 1;
        }
        out
    }
}

/// Of `n` phases in turn in slices of `slice_s`, the one whose slice holds
/// `since_warm_end_s` (negative during the warm-up).
fn phase_at(n: usize, slice_s: f64, since_warm_end_s: f64) -> usize {
    if n <= 1 {
        return 0;
    }
    ((since_warm_end_s / slice_s).floor() as i64).rem_euclid(n as i64) as usize
}

/// The run's clock: when the warm-up and the run end, and how the phases
/// take turns.
#[derive(Clone, Copy)]
struct Window {
    phases: usize,
    warm_end: Instant,
    end: Instant,
    slice_s: f64,
}

impl Window {
    /// The phase whose slice holds `t`.
    fn phase(&self, t: Instant) -> usize {
        let since = if t >= self.warm_end {
            (t - self.warm_end).as_secs_f64()
        } else {
            -(self.warm_end - t).as_secs_f64()
        };
        phase_at(self.phases, self.slice_s, since)
    }
}

/// One virtual user: sends on `conn` until the run ends, each request
/// after the previous response; its counts per phase.
async fn user_loop(
    mut conn: Conn,
    phases: Vec<Arc<Targets>>,
    method: Method,
    mut rng: SplitMix,
    window: Window,
) -> Vec<PhaseTally> {
    let mut per: Vec<PhaseTally> = (0..window.phases).map(|_| PhaseTally::new()).collect();
    loop {
        let t0 = crate::clock::now();
        if t0 >= window.end {
            break;
        }
        let p = window.phase(t0);
        let targets = &phases[p];
        let path = &targets.paths[rng.below(targets.paths.len())];
        let r = conn.send_full(&method, path).await;
        let t1 = crate::clock::now();
        let tally = &mut per[p];
        match r {
            Ok(a) if (200..300).contains(&a.status) => {
                tally.count_ok(&a, targets, path);
                if t0 >= window.warm_end && t1 <= window.end {
                    let us = (t1 - t0).as_micros().max(1) as u64;
                    tally.hist.saturating_record(us);
                }
            }
            other => {
                let failed_in_transport = other.is_err();
                tally.count_error(path, other);
                if failed_in_transport {
                    // Do not spin on a refused connection.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
    per
}

/// Runs the closed loop of [`PhasedSpec`]; one outcome per phase. A
/// request belongs to the phase of the slice it was sent in.
pub async fn closed_loop_phased(spec: &PhasedSpec) -> Result<Vec<LoadOutcome>> {
    let n = spec.phases();
    assert!(
        spec.users
            .iter()
            .all(|u| u.phases.len() == n && u.phases.iter().all(|t| !t.paths.is_empty())),
        "every user needs paths in every phase"
    );
    let mut conns = Vec::with_capacity(spec.users.len());
    for u in &spec.users {
        conns.push(Conn::connect(&u.endpoint).await?);
    }
    let start = crate::clock::now();
    let warm_end = start + spec.warmup;
    let window = Window {
        phases: n,
        warm_end,
        end: warm_end + spec.measure * n as u32,
        slice_s: spec.slice.as_secs_f64(),
    };
    let mut tasks = Vec::with_capacity(conns.len());
    for (i, (conn, user)) in conns.into_iter().zip(&spec.users).enumerate() {
        let phases = user.phases.clone();
        let method = spec.method.clone();
        let rng = SplitMix::new(spec.seed ^ (i as u64).wrapping_mul(0x1000_0000_01B3));
        tasks.push(tokio::spawn(user_loop(conn, phases, method, rng, window)));
    }
    let mut out: Vec<LoadOutcome> = spec
        .measured_s()
        .iter()
        .map(|&s| LoadOutcome::empty(s))
        .collect();
    for t in tasks {
        for (o, tally) in out.iter_mut().zip(t.await?) {
            o.add(tally);
        }
    }
    Ok(out)
}

impl LoadOutcome {
    /// An outcome with nothing counted yet, for a phase measured `measured_s`.
    fn empty(measured_s: f64) -> Self {
        LoadOutcome {
            ok_total: 0,
            errors_total: 0,
            error_samples: Vec::new(),
            latency_us: histogram_us(),
            measured_s,
            unexpected_node: 0,
            unexpected_samples: Vec::new(),
        }
    }

    /// Adds one user's counts for the phase.
    fn add(&mut self, tally: PhaseTally) {
        self.latency_us.add(&tally.hist).expect("same bounds");
        self.ok_total += tally.ok;
        self.errors_total += tally.errors;
        self.unexpected_node += tally.unexpected_node;
        for s in tally.samples {
            if self.error_samples.len() < ERROR_SAMPLES_MAX {
                self.error_samples.push(s);
            }
        }
        for s in tally.unexpected_samples {
            if self.unexpected_samples.len() < ERROR_SAMPLES_MAX {
                self.unexpected_samples.push(s);
            }
        }
    }
}

/// One user's counts for one phase.
struct PhaseTally {
    hist: Histogram<u64>,
    ok: u64,
    errors: u64,
    samples: Vec<String>,
    unexpected_node: u64,
    unexpected_samples: Vec<String>,
}

impl PhaseTally {
    fn new() -> Self {
        PhaseTally {
            hist: histogram_us(),
            ok: 0,
            errors: 0,
            samples: Vec::new(),
            unexpected_node: 0,
            unexpected_samples: Vec::new(),
        }
    }

    /// Counts a 2xx response `a` to `path`, and whether it ran on another
    /// node than `targets` expects.
    fn count_ok(&mut self, a: &Answer, targets: &Targets, path: &str) {
        self.ok += 1;
        if let Some(want) = &targets.expect
            && a.node.as_deref() != Some(want.as_str())
        {
            self.unexpected_node += 1;
            if self.unexpected_samples.len() < ERROR_SAMPLES_MAX {
                self.unexpected_samples.push(format!(
                    "{path}: ran on {}, expected {want}",
                    a.node.as_deref().unwrap_or("(no x-wasmkeep-node)")
                ));
            }
        }
    }

    /// Counts a failed request to `path` (non-2xx or transport error).
    fn count_error(&mut self, path: &str, r: Result<Answer>) {
        self.errors += 1;
        if self.samples.len() < ERROR_SAMPLES_MAX {
            let r = r.map(|a| (a.status, a.body));
            self.samples
                .push(format!("{path}: {}", crate::client::describe(&r)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_is_reproducible_and_covers_the_range() {
        let mut a = SplitMix::new(7);
        let mut b = SplitMix::new(7);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            let x = a.below(10);
            assert_eq!(x, b.below(10));
            seen[x] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn phases_take_turns_and_share_the_measured_time() {
        assert_eq!(phase_at(1, 1.0, 5.5), 0);
        assert_eq!(phase_at(2, 1.0, 0.0), 0);
        assert_eq!(phase_at(2, 1.0, 1.2), 1);
        assert_eq!(phase_at(2, 1.0, 2.9), 0);
        // The warm-up runs the turns backwards from its end.
        assert_eq!(phase_at(2, 1.0, -0.5), 1);
        assert_eq!(phase_at(2, 1.0, -1.5), 0);
        let endpoint = Endpoint {
            addr: "127.0.0.1:1".parse().unwrap(),
            host: "127.0.0.1:1".into(),
        };
        let t = Arc::new(Targets {
            paths: vec!["/".into()],
            expect: None,
        });
        let spec = |measure_ms, slice_ms| PhasedSpec {
            users: vec![User {
                endpoint: endpoint.clone(),
                phases: vec![Arc::clone(&t), Arc::clone(&t)],
            }],
            warmup: Duration::ZERO,
            measure: Duration::from_millis(measure_ms),
            slice: Duration::from_millis(slice_ms),
            method: Method::GET,
            seed: 1,
        };
        let close = |a: Vec<f64>, b: [f64; 2]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9);
        assert!(close(spec(3000, 1000).measured_s(), [3.0, 3.0]));
        // 2.5 s each: slices 1,1,1,1,1 (phases 0,1,0,1,0) make 3 and 2.
        assert!(close(spec(2500, 1000).measured_s(), [3.0, 2.0]));
    }
}
