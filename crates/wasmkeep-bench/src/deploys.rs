//! W12, a deploy under load to an app with `--open-actors` (10,000) open
//! actors (issue 38):
//! how long the deploy and a rollback take to answer while every actor is
//! open and busy, and whether any request fails or any write is lost
//! across them.

use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use bytes::Bytes;
use hyper::Method;

use crate::client::{self, Conn, Endpoint};
use crate::workloads::{Env, RunOutput, Target, counter_load_of, finish, json_of, scrape};

/// The node's settings beside `instances_max`: one linear memory per
/// component (the Rust examples need one) keeps the instance pool's
/// address-space reservation within what the kernel grants at 10,000
/// instances (ADR 0059), and no actor idles out during the run.
const NODE_SETTINGS: &str = "component_memories_max = 1\nactor_idle_ms = 600000\n";
/// Instances beyond the open actors, for the examples' other classes.
const INSTANCES_SPARE: usize = 240;
/// Where the examples are deployed for this workload.
const APP: &str = "/admin/v1/apps/bench/open";
const APP_PATH: &str = "/v1/bench/open";

/// Deploys `wasm` as `bench/open`; the time it took to answer (a build
/// the node has not compiled yet includes its compilation).
async fn deploy(ep: &Endpoint, wasm: &'static [u8], what: &str) -> Result<f64> {
    let mut admin = Conn::connect(ep).await?;
    let t = crate::clock::now();
    let a = admin
        .send_with_body(&Method::PUT, APP, Bytes::from_static(wasm))
        .await?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    if a.status != 200 {
        bail!(
            "deploy {what}: {} {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        );
    }
    Ok(ms)
}

async fn rollback(ep: &Endpoint) -> Result<f64> {
    let mut admin = Conn::connect(ep).await?;
    let t = crate::clock::now();
    let a = admin
        .send(&Method::POST, &format!("{APP}/rollback"))
        .await?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    if a.0 != 200 {
        bail!("rollback: {} {}", a.0, String::from_utf8_lossy(&a.1));
    }
    Ok(ms)
}

/// W12: the Rust examples deployed as `bench/open` on a node with room
/// for `--open-actors` instances and a few more; that many counters
/// opened; then W1's closed-loop load over them, during which another
/// build with the same `counter` (the README's hello app, not compiled
/// yet) is deployed a third of the way into the measured window (every
/// open actor takes it at its next event), and rolled back two thirds of
/// the way.
pub async fn w12(env: &Env<'_>) -> Result<RunOutput> {
    let mut out = RunOutput::default();
    let Target::Own { dir, .. } = env.target else {
        return Err(anyhow!("W12 needs a node started by the benchmark"));
    };
    let open = env.args.open_actors;
    // Up to three descriptors per open database, and the connections
    // besides; the node inherits the limit.
    crate::sockets::raise_fd_limit(3 * open as u64 + 8_192);
    let config = dir.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "instances_max = {}\n{NODE_SETTINGS}",
            open + INSTANCES_SPARE
        ),
    )?;
    let node = env.start_bare(Some(config)).await?;
    let ep = node.endpoint.clone();
    let r = run(env, &ep, &mut out).await;
    finish(Some(node), &mut out).await;
    r.map(|()| out)
}

async fn run(env: &Env<'_>, ep: &Endpoint, out: &mut RunOutput) -> Result<()> {
    deploy(ep, wasmkeep_guests::DEMO, "the examples").await?;
    let open_actors = env.args.open_actors;
    let names: Vec<String> = (0..open_actors).map(|i| format!("o{i}")).collect();
    let t = crate::clock::now();
    let reqs = names
        .iter()
        .map(|n| (Method::POST, format!("{APP_PATH}/counter/{n}/increment")))
        .collect();
    let opened = client::send_all(ep, env.args.connections, reqs).await?;
    let bad = opened.iter().filter(|r| json_of(r).is_none()).count();
    if bad > 0 {
        bail!(
            "{bad} of {open_actors} counters did not open (the node's log says why; open databases are bounded by open_databases_max, derived from the open-files limit, {})",
            crate::sockets::fd_limit()
        );
    }
    out.fig("open_s", t.elapsed().as_secs_f64());
    let open = scrape(ep)
        .await?
        .get("wasmkeep_instances_active")
        .copied()
        .unwrap_or(0.0);
    out.fig("instances_open_before", open);
    out.check(
        "actors_open",
        open >= open_actors as f64,
        format!("{open} instances active after opening {open_actors} counters"),
    );

    let third = Duration::from_secs_f64(env.args.measure_s / 3.0);
    let first = Duration::from_secs_f64(env.args.warmup_s) + third;
    let steps = {
        let ep = ep.clone();
        tokio::spawn(async move {
            tokio::time::sleep(first).await;
            let deployed = deploy(&ep, wasmkeep_guests::HELLO, "hello").await;
            tokio::time::sleep(third).await;
            let rolled = rollback(&ep).await;
            (deployed, rolled)
        })
    };
    counter_load_of(APP_PATH, env, ep, names, "", out).await?;
    let (deployed, rolled) = steps.await?;
    let (deployed, rolled) = (deployed?, rolled?);
    out.fig("deploy_ms", deployed);
    out.fig("rollback_ms", rolled);
    let (status, body) = Conn::connect(ep).await?.send(&Method::GET, APP).await?;
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    out.check(
        "versions",
        status == 200 && v["version"].as_u64() == Some(3),
        format!("the app after the deploy and the rollback: {status} {v}"),
    );
    let metrics = scrape(ep).await?;
    let after = metrics
        .get("wasmkeep_instances_active")
        .copied()
        .unwrap_or(0.0);
    out.fig("instances_open_after", after);
    // Open actors whose databases were closed to stay within the node's
    // open-files limit (ADR 0068), over the whole run.
    out.fig(
        "databases_parked",
        metrics
            .get("wasmkeep_databases_parked_total")
            .copied()
            .unwrap_or(0.0),
    );
    Ok(())
}
