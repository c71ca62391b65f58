//! A cluster under load (issue 18, "Tests with real processes"): three
//! `wasmkeep serve` nodes on one folder bucket (`file://`), each with its
//! own data folder and port, and client threads sending `replicated`
//! increments to the demo app's counters (`POST …/counter/NAME/increment`
//! answers `{"value":N}`, the new value) through every node.
//!
//! - SIGKILL of a node that owns actors: no acknowledged value is lost or
//!   acknowledged twice (a split brain would acknowledge one value on two
//!   nodes), and the dead node's actors answer through the others.
//! - A rolling restart (SIGTERM, start again on the same data folder) of
//!   every node: no request fails.
//! - A node that rejoins with an old data folder serves the newest state of
//!   its former actors, never its stale local copies (ADR 0020, ADR 0009's
//!   R4).
//!
//! The clients stand for a load balancer with health checks: they send only
//! to nodes that are up, and before a planned stop the node is taken out of
//! rotation and its requests in flight finish (connection draining). Lease
//! timings are short (set through the configuration file); no test asserts
//! how long anything takes: waits poll with a generous bound.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::Node;
use common::cluster::{self, counter, free_port, increment, value};

/// Waits until `f` holds (a bound of 60 s for a hung cluster).
fn wait_for(what: &str, f: impl FnMut() -> bool) {
    cluster::wait_for(what, 60, 20, f)
}

const TOKEN: &str = "cluster-secret-for-load-tests";

/// A shared bucket and one configuration for the nodes of a test.
struct Cluster {
    tmp: tempfile::TempDir,
    bucket: PathBuf,
    config: PathBuf,
}

/// A node of the cluster: its process, id, port and data folder.
struct Member {
    node: Node,
    id: String,
    port: u16,
    data: PathBuf,
}

impl Cluster {
    /// Short leases (a dead node's actors move after about three seconds);
    /// idle actors stay held for the whole test.
    fn new() -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let config = tmp.path().join("node.toml");
        std::fs::write(
            &config,
            "lease_period_ms = 1500\nlease_grace_ms = 1500\nowner_margin_ms = 300\n\
             lease_register_retry_ms = 200\ncluster_bucket_timeout_ms = 1000\n\
             cluster_owner_cache_ttl_ms = 500\ncluster_forward_timeout_ms = 20000\n\
             actor_idle_ms = 60000\n",
        )
        .unwrap();
        Cluster {
            bucket: tmp.path().join("bucket"),
            config,
            tmp,
        }
    }

    fn start(&self, name: &str) -> Member {
        let data = self.tmp.path().join(name);
        self.start_on(&data, free_port())
    }

    /// Starts a node on `data` and `port` and waits until it acts.
    fn start_on(&self, data: &Path, port: u16) -> Member {
        let bucket = format!("file://{}", self.bucket.display());
        let listen = format!("127.0.0.1:{port}");
        let advertise = format!("http://127.0.0.1:{port}");
        let config = self.config.display().to_string();
        let node = Node::start(
            data,
            &[
                "--examples",
                "--listen",
                &listen,
                "--config",
                &config,
                "--bucket",
                &bucket,
                "--advertise",
                &advertise,
                "--cluster-token",
                TOKEN,
            ],
        );
        wait_for("the node to act", || {
            node.json("GET", "/admin/v1/node", b"").1["cluster"]["acting"] == true
        });
        let id = node.json("GET", "/admin/v1/node", b"").1["cluster"]["node"]
            .as_str()
            .unwrap()
            .to_owned();
        Member {
            node,
            id,
            port,
            data: data.to_owned(),
        }
    }

    fn start_three(&self) -> Vec<Member> {
        ["a", "b", "c"].iter().map(|n| self.start(n)).collect()
    }
}

fn actor_name(i: usize) -> String {
    format!("load-{i}")
}

/// The load balancer's view of the nodes: which are in rotation, and how
/// many requests each has in flight. Taking a node out waits for those to
/// finish, as connection draining does.
struct Balancer {
    ports: Vec<u16>,
    state: Mutex<Vec<Backend>>,
    idle: Condvar,
}

#[derive(Clone, Copy)]
struct Backend {
    up: bool,
    in_flight: usize,
}

impl Balancer {
    fn new(ports: Vec<u16>) -> Balancer {
        let n = ports.len();
        Balancer {
            ports,
            state: Mutex::new(vec![
                Backend {
                    up: true,
                    in_flight: 0
                };
                n
            ]),
            idle: Condvar::new(),
        }
    }

    /// The `turn`-th node in rotation (round robin over those up), marked
    /// as having one more request in flight.
    fn pick(&self, turn: usize) -> (usize, u16) {
        let mut s = self.state.lock().unwrap();
        let up: Vec<usize> = (0..s.len()).filter(|i| s[*i].up).collect();
        assert!(!up.is_empty(), "no node in rotation");
        let i = up[turn % up.len()];
        s[i].in_flight += 1;
        (i, self.ports[i])
    }

    fn done(&self, i: usize) {
        let mut s = self.state.lock().unwrap();
        s[i].in_flight -= 1;
        self.idle.notify_all();
    }

    /// Out of rotation at once (a failed health check): requests in flight
    /// are not waited for.
    fn remove(&self, i: usize) {
        self.state.lock().unwrap()[i].up = false;
    }

    /// Out of rotation, then waits until its requests in flight finished.
    fn drain(&self, i: usize) {
        let mut s = self.state.lock().unwrap();
        s[i].up = false;
        while s[i].in_flight > 0 {
            s = self.idle.wait(s).unwrap();
        }
    }

    fn restore(&self, i: usize) {
        self.state.lock().unwrap()[i].up = true;
    }
}

/// One increment a client sent, and what came of it.
#[derive(Debug, Clone)]
struct Sent {
    client: usize,
    actor: usize,
    target: usize,
    started: Instant,
    finished: Instant,
    /// `Ok((value, node that ran it))` if acknowledged (200 with the new
    /// value), else `Err((status, body))`: the increment may or may not have
    /// run.
    outcome: Result<(u64, String), (u16, String)>,
}

/// Client threads sending increments until told to stop, each to a node
/// the balancer picks, with no retry.
struct Load {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Sent>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(balancer: &Arc<Balancer>, clients: usize, actors: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..clients)
            .map(|client| {
                let (stop, log, balancer) =
                    (Arc::clone(&stop), Arc::clone(&log), Arc::clone(balancer));
                std::thread::spawn(move || {
                    // Each client walks the actors in its own order and
                    // the nodes in turn, so every actor is reached through
                    // every node.
                    let mut turn = client;
                    while !stop.load(Ordering::Relaxed) {
                        let actor = (turn * 7 + client * 3) % actors;
                        let (target, port) = balancer.pick(turn);
                        let started = Instant::now();
                        let a = increment(port, &actor_name(actor));
                        let finished = Instant::now();
                        balancer.done(target);
                        let acked = a.body["value"].as_u64().filter(|_| a.status == 200);
                        let outcome = match (acked, a.node) {
                            (Some(v), Some(node)) => Ok((v, node)),
                            _ => Err((a.status, a.body.to_string())),
                        };
                        log.lock().unwrap().push(Sent {
                            client,
                            actor,
                            target,
                            started,
                            finished,
                            outcome,
                        });
                        turn += 1;
                    }
                })
            })
            .collect();
        Load { stop, log, threads }
    }

    fn snapshot(&self) -> Vec<Sent> {
        self.log.lock().unwrap().clone()
    }

    fn finish(self) -> Vec<Sent> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("a client thread panicked");
        }
        Arc::try_unwrap(self.log).unwrap().into_inner().unwrap()
    }
}

/// Creates each actor through node `i % 3`, so that owners are spread
/// before the load starts (and no first request races another's take).
fn create_spread(members: &[Member], actors: usize) {
    for i in 0..actors {
        let m = &members[i % members.len()];
        let a = increment(m.port, &actor_name(i));
        assert_eq!(counter(&a), 1, "{}", actor_name(i));
        assert_eq!(a.node.as_deref(), Some(m.id.as_str()));
    }
}

/// What the checks found, for the report.
#[derive(Default)]
struct Tally {
    sent: usize,
    acknowledged: usize,
    failed: usize,
    /// Failed requests by status (0: no answer).
    failed_by_status: BTreeMap<u16, usize>,
}

/// The history checks, against `finals` (each actor's value read back
/// after the load; 1 from `create_spread` is counted as acknowledged):
/// per actor no value is acknowledged twice; each client's acknowledged
/// values rise; every acknowledged value is at most the final one; and the
/// final value is no more than the increments that may have run (those
/// acknowledged plus those whose outcome is unknown), so nothing
/// unacknowledged was invented and nothing acknowledged went missing.
impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} requests, {} acknowledged, {} failed (by status, 0 = no answer: {:?})",
            self.sent, self.acknowledged, self.failed, self.failed_by_status
        )
    }
}

fn check_history(log: &[Sent], finals: &[u64]) -> Tally {
    let mut tally = Tally {
        sent: log.len(),
        ..Tally::default()
    };
    let mut acked: HashMap<usize, Vec<(u64, &Sent)>> = HashMap::new();
    let mut unknown: HashMap<usize, u64> = HashMap::new();
    let mut last_by_client: HashMap<(usize, usize), u64> = HashMap::new();
    let mut in_order: Vec<&Sent> = log.iter().collect();
    in_order.sort_by_key(|s| s.finished);
    for s in in_order {
        match &s.outcome {
            Ok((v, _)) => {
                tally.acknowledged += 1;
                acked.entry(s.actor).or_default().push((*v, s));
                let last = last_by_client.entry((s.client, s.actor)).or_insert(0);
                assert!(
                    *v > *last,
                    "actor {}: client {} had {} acknowledged, then {v}: {s:?}",
                    s.actor,
                    s.client,
                    *last
                );
                *last = *v;
            }
            Err((status, _)) => {
                tally.failed += 1;
                *tally.failed_by_status.entry(*status).or_default() += 1;
                *unknown.entry(s.actor).or_default() += 1;
            }
        }
    }
    for (actor, &fin) in finals.iter().enumerate() {
        let mut values = acked.remove(&actor).unwrap_or_default();
        values.sort_by_key(|(v, _)| *v);
        for pair in values.windows(2) {
            assert_ne!(
                pair[0].0, pair[1].0,
                "actor {actor}: value {} acknowledged twice (split brain): {:?} and {:?}",
                pair[0].0, pair[0].1, pair[1].1
            );
        }
        // 1 came from `create_spread`, before the load.
        if let Some((v, s)) = values.first() {
            assert!(*v > 1, "actor {actor}: value 1 acknowledged twice: {s:?}");
        }
        let max = values.last().map_or(1, |(v, _)| *v);
        assert!(
            max <= fin,
            "actor {actor}: {max} was acknowledged but the final value is {fin} (an \
             acknowledged write was lost)"
        );
        let may_have_run = 1 + values.len() as u64 + unknown.get(&actor).copied().unwrap_or(0);
        assert!(
            fin <= may_have_run,
            "actor {actor}: final value {fin}, but only {may_have_run} increments may have run"
        );
    }
    tally
}

/// Reads every actor's value through every member; all must agree.
fn read_finals(members: &[&Member], actors: usize) -> Vec<u64> {
    (0..actors)
        .map(|i| {
            let seen: Vec<u64> = members
                .iter()
                .map(|m| counter(&value(m.port, &actor_name(i))))
                .collect();
            assert!(
                seen.windows(2).all(|w| w[0] == w[1]),
                "actor {i}: the nodes disagree: {seen:?}"
            );
            seen[0]
        })
        .collect()
}

/// SIGKILL the node that owns the most actors while clients send
/// replicated increments through all three: afterwards every actor answers
/// through the two others, no value was acknowledged twice, none was lost.
/// Requests may fail only while the dead node's actors wait for its lease
/// to lapse: a 5xx answer or no answer (a request in flight at the dead
/// node); never a 4xx, and none before the kill.
#[test]
fn sigkill_under_load_loses_no_acknowledged_write_and_never_splits() {
    const ACTORS: usize = 20;
    let c = Cluster::new();
    let mut members = c.start_three();
    create_spread(&members, ACTORS);
    let balancer = Arc::new(Balancer::new(members.iter().map(|m| m.port).collect()));
    let load = Load::start(&balancer, 4, ACTORS);

    // Every actor acknowledged a few more times through the load.
    wait_for("load on every actor", || {
        let log = load.snapshot();
        (0..ACTORS).all(|a| {
            log.iter()
                .filter(|s| s.actor == a && s.outcome.is_ok())
                .count()
                >= 3
        })
    });
    // The owners: the node that ran each actor's latest acknowledged write.
    let owners = |log: &[Sent]| -> HashMap<usize, String> {
        let mut o = HashMap::new();
        for s in log {
            if let Ok((_, node)) = &s.outcome {
                o.insert(s.actor, node.clone());
            }
        }
        o
    };
    let before = owners(&load.snapshot());
    let victim = (0..3)
        .max_by_key(|i| before.values().filter(|n| **n == members[*i].id).count())
        .unwrap();
    let victim_id = members[victim].id.clone();
    let victims: Vec<usize> = (0..ACTORS).filter(|a| before[a] == victim_id).collect();
    assert!(!victims.is_empty(), "the victim owns no actor");

    let killed_at = Instant::now();
    members[victim].node.kill();
    balancer.remove(victim);

    // Keep going until every actor has acknowledged a write sent after the
    // kill.
    wait_for("every actor to answer after the kill", || {
        let log = load.snapshot();
        (0..ACTORS).all(|a| {
            log.iter()
                .any(|s| s.actor == a && s.started > killed_at && s.outcome.is_ok())
        })
    });
    let recovered_at = Instant::now();
    let log = load.finish();

    let live: Vec<&Member> = (0..3)
        .filter(|i| *i != victim)
        .map(|i| &members[i])
        .collect();
    let finals = read_finals(&live, ACTORS);
    for &a in &victims {
        let read = value(live[0].port, &actor_name(a));
        assert_eq!(counter(&read), finals[a]);
        assert!(
            read.node.as_deref().is_some_and(|n| n != victim_id),
            "actor {a} answered by {:?}",
            read.node
        );
    }
    let before_kill: Vec<&Sent> = log
        .iter()
        .filter(|s| s.outcome.is_err() && s.finished < killed_at)
        .collect();
    assert!(
        before_kill.is_empty(),
        "failed before the kill: {before_kill:?}"
    );
    let bad: Vec<&Sent> = log
        .iter()
        .filter(|s| matches!(&s.outcome, Err((st, _)) if (1..500).contains(st)))
        .collect();
    assert!(bad.is_empty(), "neither 5xx nor a lost connection: {bad:?}");
    let tally = check_history(&log, &finals);
    let direct = log
        .iter()
        .filter(|s| s.outcome.is_err() && s.target == victim)
        .count();
    eprintln!(
        "sigkill: {} actors ({} owned by the killed node), {tally}, of the failures {direct} \
         sent to the killed node itself; every actor answered again {:?} after the kill",
        ACTORS,
        victims.len(),
        recovered_at - killed_at
    );
}

/// A rolling restart: each node in turn is taken out of the balancer's
/// rotation (its requests in flight finish), stopped with SIGTERM (it
/// drains, uploads, releases its holds and lease), started again on its
/// data folder and port, and put back once it acts. Clients send
/// replicated increments throughout and no request fails; each actor's
/// acknowledged values are exactly 1..=final.
#[test]
fn a_rolling_restart_under_load_fails_no_request() {
    const ACTORS: usize = 12;
    let c = Cluster::new();
    let mut members = c.start_three();
    create_spread(&members, ACTORS);
    let balancer = Arc::new(Balancer::new(members.iter().map(|m| m.port).collect()));
    let load = Load::start(&balancer, 3, ACTORS);
    let pause = || std::thread::sleep(Duration::from_millis(500));
    // Each restart: the port, when SIGTERM was sent, when the process
    // exited.
    let mut restarts: Vec<(u16, Instant, Instant)> = Vec::new();
    for (i, m) in members.iter_mut().enumerate() {
        pause();
        balancer.drain(i);
        let term = Instant::now();
        assert!(m.node.stop().success(), "node {i} did not stop cleanly");
        restarts.push((m.port, term, Instant::now()));
        let (data, port, id) = (m.data.clone(), m.port, m.id.clone());
        let again = c.start_on(&data, port);
        assert_eq!(again.id, id, "a restart keeps the node id");
        *m = again;
        balancer.restore(i);
    }
    pause();
    let log = load.finish();

    let failed: Vec<&Sent> = log.iter().filter(|s| s.outcome.is_err()).collect();
    let all: Vec<&Member> = members.iter().collect();
    let finals = read_finals(&all, ACTORS);
    let tally = check_history(&log, &finals);
    eprintln!("rolling restart: {ACTORS} actors, {tally}");
    // Grouped by what went wrong: status and error code.
    let mut why: BTreeMap<(u16, String), usize> = BTreeMap::new();
    for s in &failed {
        if let Err((status, body)) = &s.outcome {
            let code = serde_json::from_str::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
                .unwrap_or_else(|| body.clone());
            *why.entry((*status, code)).or_default() += 1;
        }
    }
    // When each failure came, relative to the SIGTERM before it.
    let when: Vec<String> = failed
        .iter()
        .map(|s| {
            let last = restarts.iter().rev().find(|r| r.1 <= s.finished);
            match last {
                Some((port, term, exited)) => format!(
                    "sent {:?} and answered {:?} after SIGTERM to :{port} (exited {:?} after)",
                    s.started.saturating_duration_since(*term),
                    s.finished - *term,
                    *exited - *term
                ),
                None => "before any restart".into(),
            }
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during the rolling restart: {why:?}; when: {when:#?}; \
         first: {:#?}",
        failed.len(),
        log.len(),
        &failed[..failed.len().min(3)]
    );
    // No request failed, so every increment was acknowledged: the
    // acknowledged values are exactly 1..=final.
    for (a, &fin) in finals.iter().enumerate() {
        let mut values: Vec<u64> = log
            .iter()
            .filter(|s| s.actor == a)
            .filter_map(|s| s.outcome.as_ref().ok().map(|(v, _)| *v))
            .collect();
        values.push(1);
        values.sort();
        assert_eq!(values, (1..=fin).collect::<Vec<_>>(), "actor {a}");
    }
    // Each restarted node served actors again (through forwarding or its
    // own holds): a read through it answers.
    for m in &members {
        assert_eq!(value(m.port, &actor_name(0)).status, 200);
    }
}

/// A node rejoins with the data folder it had when it died: its local
/// copies of actors that moved on (written by others since) are stale.
/// Through it, reads answer the newest values, whether another node owns
/// the actor now (forwarded) or nobody does (it takes the actor again and
/// must restore it from the bucket, not serve its file).
#[test]
fn a_node_rejoining_with_an_old_data_folder_serves_no_stale_copy() {
    const ACTORS: usize = 6;
    let c = Cluster::new();
    let mut members = c.start_three();
    // A owns every actor, at 3.
    for i in 0..ACTORS {
        for want in 1..=3 {
            let r = increment(members[0].port, &actor_name(i));
            assert_eq!(counter(&r), want);
            assert_eq!(r.node.as_deref(), Some(members[0].id.as_str()));
        }
    }
    // A dies without releasing anything; its data folder keeps copies at 3.
    members[0].node.kill();
    let (a_data, a_port, a_id) = (
        members[0].data.clone(),
        members[0].port,
        members[0].id.clone(),
    );
    // Half the actors move to B, half to C (after A's lease lapses), and
    // are written there to 5.
    let mover = |i: usize| if i < ACTORS / 2 { 1 } else { 2 };
    for i in 0..ACTORS {
        let m = &members[mover(i)];
        wait_for("the dead node's actor to move", || {
            increment(m.port, &actor_name(i)).status == 200
        });
        let r = increment(m.port, &actor_name(i));
        assert_eq!(counter(&r), 5, "{}", actor_name(i));
        assert_eq!(r.node.as_deref(), Some(m.id.as_str()));
    }
    // B stops cleanly: its actors are nobody's now. C stays their owner.
    assert!(members[1].node.stop().success());

    let a = c.start_on(&a_data, a_port);
    assert_eq!(a.id, a_id);
    for i in 0..ACTORS {
        let read = value(a.port, &actor_name(i));
        assert_eq!(
            counter(&read),
            5,
            "{} read through the rejoined node",
            actor_name(i)
        );
        let ran = if mover(i) == 1 { &a.id } else { &members[2].id };
        assert_eq!(
            read.node.as_deref(),
            Some(ran.as_str()),
            "{}",
            actor_name(i)
        );
        let next = increment(a.port, &actor_name(i));
        assert_eq!(counter(&next), 6, "{}", actor_name(i));
    }
    // C sees the same.
    for i in 0..ACTORS {
        assert_eq!(counter(&value(members[2].port, &actor_name(i))), 6);
    }
}
