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

use crate::client::{Conn, Endpoint};

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
    let mut conns = Vec::with_capacity(spec.connections);
    for _ in 0..spec.connections.max(1) {
        conns.push(Conn::connect(endpoint).await?);
    }
    let start = Instant::now();
    let warm_end = start + spec.warmup;
    let end = warm_end + spec.measure;
    let mut tasks = Vec::with_capacity(conns.len());
    for (i, mut conn) in conns.into_iter().enumerate() {
        let paths = Arc::clone(&spec.paths);
        let method = spec.method.clone();
        let mut rng = SplitMix::new(spec.seed ^ (i as u64).wrapping_mul(0x1000_0000_01B3));
        tasks.push(tokio::spawn(async move {
            let mut hist = histogram_us();
            let (mut ok, mut errors, mut samples) = (0u64, 0u64, Vec::new());
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let path = &paths[rng.below(paths.len())];
                let r = conn.send(&method, path).await;
                let t1 = Instant::now();
                match r {
                    Ok((s, _)) if (200..300).contains(&s) => {
                        ok += 1;
                        if t0 >= warm_end && t1 <= end {
                            let us = (t1 - t0).as_micros().max(1) as u64;
                            hist.saturating_record(us);
                        }
                    }
                    other => {
                        errors += 1;
                        if samples.len() < ERROR_SAMPLES_MAX {
                            samples.push(format!("{path}: {}", crate::client::describe(&other)));
                        }
                        if other.is_err() {
                            // Do not spin on a refused connection.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
            }
            (hist, ok, errors, samples)
        }));
    }
    let mut out = LoadOutcome {
        ok_total: 0,
        errors_total: 0,
        error_samples: Vec::new(),
        latency_us: histogram_us(),
        measured_s: spec.measure.as_secs_f64(),
    };
    for t in tasks {
        let (hist, ok, errors, samples) = t.await?;
        out.latency_us.add(&hist).expect("same bounds");
        out.ok_total += ok;
        out.errors_total += errors;
        for s in samples {
            if out.error_samples.len() < ERROR_SAMPLES_MAX {
                out.error_samples.push(s);
            }
        }
    }
    Ok(out)
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
}
