//! W1-durable-large (issue 23): W1-durable's `replicated` writes sent to
//! actors whose databases are large, then the same writes to actors whose
//! databases are small, on one node with a bucket. What a write costs
//! should not depend on what the actor stores: the figures are each
//! group's latency and PUT bytes per request, their ratios, and the node's
//! memory while the large actors take writes against the same node idle.
//!
//! The actors are the bundled `notes` class. Each large actor is filled
//! with `--large-mb` notes of about 1 MiB (each a `replicated` request, so
//! that the fill itself goes through the bucket like any write), each small
//! one with a single note. The load is `PUT /settings/k` with
//! `wasmkeep-durability=replicated` over `--connections` connections, the
//! large group's first.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Result, bail};
use bytes::Bytes;
use hyper::Method;

use crate::client::{Conn, Endpoint};
use crate::load::{self, LoadOutcome, LoadSpec};
use crate::workloads::{EXAMPLES, Env, RunOutput, bucket_of, finish, scrape};

/// Bytes of one note of the fill: about 1 MiB with the row around it,
/// within the node's default `value_bytes_max` (2 MiB).
const NOTE_BYTES: usize = 1024 * 1024 - 4096;

/// Actors in the small group (as many as the large one has, at most this).
const SMALL_ACTORS_MAX: usize = 16;

/// How often the node's RSS is read while the large actors take writes.
const RSS_SAMPLE_MS: u64 = 50;

/// Least time one round of settling writes: longer than a whole snapshot
/// of one large actor streams, so a round that lands deltas only cannot
/// hide one still streaming.
const SETTLE_ROUND_MIN: Duration = Duration::from_secs(10);

/// Most rounds of settling before the measured load starts anyway.
const SETTLE_ROUNDS_MAX: usize = 6;

/// How long one round of settling writes, at most, waiting for its
/// snapshots and deltas to land.
const SETTLE_WAIT: Duration = Duration::from_secs(120);

pub async fn w1_durable_large(env: &Env<'_>) -> Result<RunOutput> {
    let a = env.args;
    if a.large_actors == 0 || a.large_mb == 0 {
        bail!("--large-actors and --large-mb must be at least 1");
    }
    let mut out = RunOutput::default();
    let node = env.start_on(None, bucket_of(env)?).await?;
    let ep = env.endpoint(&node);
    let prefix = env.prefix("");
    let large: Vec<String> = (0..a.large_actors)
        .map(|i| format!("{prefix}large{i}"))
        .collect();
    let small: Vec<String> = (0..a.large_actors.min(SMALL_ACTORS_MAX))
        .map(|i| format!("{prefix}small{i}"))
        .collect();
    let r = async {
        let started = crate::clock::now();
        fill(&ep, &large, a.large_mb).await?;
        out.fig("fill_s", started.elapsed().as_secs_f64());
        fill(&ep, &small, 1).await?;
        out.fig("large_mb", a.large_mb as f64);
        out.fig("large_actors", large.len() as f64);
        // The fill's log since each large actor's last snapshot calls for
        // a whole one: writes until those have landed and a round of writes
        // makes deltas only (ADR 0037), so the measured load sees the
        // steady state, not the fill's snapshots.
        let started = crate::clock::now();
        let rounds = settle(&ep, &large).await?;
        out.fig("settle_s", started.elapsed().as_secs_f64());
        out.fig("settle_rounds", rounds as f64);
        let idle = match &node {
            Some(n) => Some(n.rss_kib()?),
            None => None,
        };
        let peak = AtomicU64::new(0);
        let done = AtomicBool::new(false);
        let sample = async {
            while let Some(n) = &node
                && !done.load(Ordering::Relaxed)
            {
                if let Ok(kib) = n.rss_kib() {
                    peak.fetch_max(kib, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(RSS_SAMPLE_MS)).await;
            }
        };
        let large_run = async {
            let r = group(env, &ep, &large, "large", &mut out).await;
            done.store(true, Ordering::Relaxed);
            r
        };
        let (large_out, ()) = tokio::join!(large_run, sample);
        let (large_ms, large_kib) = large_out?;
        let (small_ms, small_kib) = group(env, &ep, &small, "small", &mut out).await?;
        out.fig("ratio_p50", large_ms / small_ms.max(0.001));
        out.fig("ratio_put_bytes", large_kib / small_kib.max(0.001));
        if let Some(idle) = idle {
            let peak = peak.load(Ordering::Relaxed).max(idle);
            out.fig("rss_idle_mib", idle as f64 / 1024.0);
            out.fig("rss_over_idle_mib", (peak - idle) as f64 / 1024.0);
        }
        anyhow::Ok(())
    }
    .await;
    finish(node, &mut out).await;
    r.map(|()| out)
}

/// Rounds of `replicated` writes to each actor of `names` (one connection
/// each), each round writing for at least [`SETTLE_ROUND_MIN`] and until
/// twice as many snapshots or deltas as there are actors have landed (a
/// snapshot due streams at the actor's next upload, so the writes go on
/// while it does), until a round lands deltas only (or
/// [`SETTLE_ROUNDS_MAX`]); returns the rounds.
async fn settle(ep: &Endpoint, names: &[String]) -> Result<usize> {
    let landed = |m: &std::collections::HashMap<String, f64>| {
        let g = |k: &str| m.get(k).copied().unwrap_or(0.0);
        (
            g("wasmkeep_replica_snapshots_total"),
            g("wasmkeep_replica_deltas_total"),
        )
    };
    for round in 1..=SETTLE_ROUNDS_MAX {
        let (snaps0, deltas0) = landed(&scrape(ep).await?);
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for name in names {
            let mut conn = Conn::connect(ep).await?;
            let path = format!("{EXAMPLES}/notes/{name}/settings/k?wasmkeep-durability=replicated");
            let stop = Arc::clone(&stop);
            tasks.push(tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let a = conn
                        .send_with_body(&Method::PUT, &path, Bytes::from(i.to_string()))
                        .await?;
                    if a.status >= 300 {
                        bail!("settling: {path}: {}", a.status);
                    }
                }
                anyhow::Ok(())
            }));
        }
        let waited = crate::clock::now();
        let clean = loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let (snaps, deltas) = landed(&scrape(ep).await?);
            if (snaps - snaps0) + (deltas - deltas0) >= 2.0 * names.len() as f64
                && waited.elapsed() >= SETTLE_ROUND_MIN
            {
                break snaps == snaps0;
            }
            if waited.elapsed() > SETTLE_WAIT {
                break false;
            }
        };
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await??;
        }
        if clean {
            return Ok(round);
        }
    }
    Ok(SETTLE_ROUNDS_MAX)
}

/// Sends `mb` notes of about 1 MiB to each actor of `names`, one connection
/// per actor, each note `replicated`; fails at the first refusal.
async fn fill(ep: &Endpoint, names: &[String], mb: usize) -> Result<()> {
    let note = Bytes::from(vec![b'x'; NOTE_BYTES]);
    let mut tasks = Vec::new();
    for name in names {
        let mut conn = Conn::connect(ep).await?;
        let (note, name) = (note.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..mb {
                let path = format!(
                    "{EXAMPLES}/notes/{name}/notes?title=n{i}&wasmkeep-durability=replicated"
                );
                let a = conn
                    .send_with_body(&Method::POST, &path, note.clone())
                    .await?;
                if a.status != 201 {
                    bail!(
                        "filling {name}: note {i}: {} {}",
                        a.status,
                        String::from_utf8_lossy(&a.body[..a.body.len().min(300)])
                    );
                }
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// The load on one group: figures under `label`, and its median latency
/// and PUT KiB per request.
async fn group(
    env: &Env<'_>,
    ep: &Endpoint,
    names: &[String],
    label: &str,
    out: &mut RunOutput,
) -> Result<(f64, f64)> {
    let a = env.args;
    let paths: Vec<String> = names
        .iter()
        .map(|n| format!("{EXAMPLES}/notes/{n}/settings/k?wasmkeep-durability=replicated"))
        .collect();
    let before = scrape(ep).await?;
    let r: LoadOutcome = load::closed_loop(
        ep,
        &LoadSpec {
            connections: a.connections,
            warmup: Duration::from_secs_f64(a.warmup_s),
            measure: Duration::from_secs_f64(a.measure_s),
            method: Method::PUT,
            paths: Arc::new(paths),
            seed: a.seed,
        },
    )
    .await?;
    let after = scrape(ep).await?;
    let d = |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
    let sent = (r.ok_total + r.errors_total).max(1) as f64;
    let p50 = r.quantile_ms(0.50);
    let kib = d("wasmkeep_bucket_put_bytes_total") / sent / 1024.0;
    out.fig(&format!("{label}_requests_per_s"), r.requests_per_s());
    out.fig(&format!("{label}_p50_ms"), p50);
    out.fig(&format!("{label}_p99_ms"), r.quantile_ms(0.99));
    out.fig(&format!("{label}_put_kib_per_request"), kib);
    out.fig(
        &format!("{label}_snapshots"),
        d("wasmkeep_replica_snapshots_total"),
    );
    out.fig(
        &format!("{label}_deltas"),
        d("wasmkeep_replica_deltas_total"),
    );
    out.fig(
        &format!("{label}_image_reads"),
        d("wasmkeep_replica_image_reads_total"),
    );
    out.fig(
        &format!("{label}_file_reads"),
        d("wasmkeep_replica_file_reads_total"),
    );
    out.check(
        &format!("{label}_no_errors"),
        r.errors_total == 0,
        format!(
            "{} of {} requests failed; first: {}",
            r.errors_total,
            sent,
            r.error_samples.join(" | ")
        ),
    );
    let given_up = d("wasmkeep_replica_given_up_total");
    out.check(
        &format!("{label}_no_actor_given_up"),
        given_up == 0.0,
        format!("{given_up} actors given up"),
    );
    Ok((p50, kib))
}
