//! A cluster of real `wasmkeep serve` processes under load, for the tests
//! with real processes (`cluster_load.rs`, `cluster_fault.rs`): a shared
//! bucket (a folder, or moto), nodes started on it (on moto, optionally
//! each behind its own fault-injecting proxy), a load balancer, client
//! threads sending `replicated` increments to the demo app's counters
//! (`POST …/counter/NAME/increment` answers `{"value":N}`, the new value),
//! and the checks on what the clients were told.
//!
//! Lease timings are short (set through the configuration file): a dead
//! node's actors move after about three seconds; idle actors stay held for
//! the whole test. Waits poll with a generous bound.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use wasmkeep_replica::testing::Moto;

use super::Node;
pub(crate) use super::cluster::status;
use super::cluster::{self, counter, free_port, increment, increment_within, value};
use super::proxy::Proxy;

/// Waits until `f` holds (a bound of 60 s for a hung cluster).
pub(crate) fn wait_for(what: &str, f: impl FnMut() -> bool) {
    cluster::wait_for(what, 60, 20, f)
}

pub(crate) const TOKEN: &str = "cluster-secret-for-load-tests";
pub(crate) const LEASE_PERIOD_MS: u64 = 1500;
pub(crate) const LEASE_GRACE_MS: u64 = 1500;

/// `t` plus the lease period and grace: how long a node's lease records
/// sent before `t` can keep it live for the other nodes (a record's expiry
/// is its send time plus the period; the others judge it lapsed past
/// expiry plus grace). When nothing the node sends after `t` counts, it
/// must stop acknowledging before then.
pub(crate) fn lapse_bound(t: Instant) -> Instant {
    t + Duration::from_millis(LEASE_PERIOD_MS + LEASE_GRACE_MS)
}

/// Where the cluster's bucket is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Store {
    /// A local folder (`file://`): create-only writes are atomic.
    Folder,
    /// moto (`s3://`, the endpoint in the nodes' AWS_* environment). Its
    /// create-only PUT (`If-None-Match: *`) checks and then writes without
    /// a lock, so two nodes creating one key at the same moment can both
    /// succeed: the clients then route each actor through one node at a
    /// time ([`Routing::OneNodePerActor`]), so that no two nodes race to
    /// take one actor (see `cluster_load.rs`).
    Moto,
}

/// A shared bucket and one configuration for the nodes of a test.
pub(crate) struct Cluster {
    tmp: tempfile::TempDir,
    config: PathBuf,
    url: String,
    moto: Option<Moto>,
    pub store: Store,
}

/// A node of the cluster: its process, id, port and data folder, and the
/// proxy between it and the bucket if it has one.
pub(crate) struct Member {
    pub node: Node,
    pub id: String,
    pub port: u16,
    pub data: PathBuf,
    pub proxy: Option<Proxy>,
}

impl Cluster {
    pub(crate) fn new(store: Store) -> Cluster {
        Self::with_idle(store, 60_000)
    }

    /// `actor_idle_ms`: how soon the nodes close (and so release) an idle
    /// actor.
    pub(crate) fn with_idle(store: Store, actor_idle_ms: u64) -> Cluster {
        Self::with_settings(store, actor_idle_ms, "")
    }

    /// [`Cluster::with_idle`], with more TOML lines in the nodes'
    /// configuration.
    pub(crate) fn with_settings(store: Store, actor_idle_ms: u64, more: &str) -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let config = cluster::node_config(
            tmp.path(),
            LEASE_PERIOD_MS,
            LEASE_GRACE_MS,
            1000,
            &format!(
                "cluster_owner_cache_ttl_ms = 500\ncluster_forward_timeout_ms = 20000\n\
                 actor_idle_ms = {actor_idle_ms}\n{more}"
            ),
        );
        let (url, moto) = match store {
            Store::Folder => (
                format!("file://{}", tmp.path().join("bucket").display()),
                None,
            ),
            Store::Moto => {
                let moto = Moto::start();
                moto.create_bucket("cluster");
                ("s3://cluster/wk".to_owned(), Some(moto))
            }
        };
        Cluster {
            tmp,
            config,
            url,
            moto,
            store,
        }
    }

    /// The folder bucket's path.
    pub(crate) fn folder(&self) -> PathBuf {
        assert_eq!(self.store, Store::Folder);
        self.tmp.path().join("bucket")
    }

    /// How the clients route: see [`Store::Moto`].
    pub(crate) fn routing(&self) -> Routing {
        match self.store {
            Store::Folder => Routing::RoundRobin,
            Store::Moto => Routing::OneNodePerActor,
        }
    }

    pub(crate) fn start(&self, name: &str) -> Member {
        self.start_on(&self.tmp.path().join(name), free_port(), None)
    }

    /// On moto: a node that reaches it through a proxy of its own.
    pub(crate) fn start_behind_proxy(&self, name: &str) -> Member {
        let moto = self.moto.as_ref().expect("a proxy stands before moto");
        let proxy = Proxy::start(moto.port);
        self.start_on(&self.tmp.path().join(name), free_port(), Some(proxy))
    }

    pub(crate) fn start_three(&self) -> Vec<Member> {
        ["a", "b", "c"].iter().map(|n| self.start(n)).collect()
    }

    /// Starts a node on `data` and `port` (through `proxy` if given) and
    /// waits until it acts.
    pub(crate) fn start_on(&self, data: &Path, port: u16, proxy: Option<Proxy>) -> Member {
        self.start_on_env(data, port, proxy, &[])
    }

    /// [`Cluster::start`] with more environment for the node (a test's
    /// `WASMKEEP_UNSAFE`).
    #[allow(dead_code, reason = "not every test binary starts such a node")]
    pub(crate) fn start_env(&self, name: &str, extra: &[(&'static str, String)]) -> Member {
        self.start_on_env(&self.tmp.path().join(name), free_port(), None, extra)
    }

    fn start_on_env(
        &self,
        data: &Path,
        port: u16,
        proxy: Option<Proxy>,
        extra: &[(&'static str, String)],
    ) -> Member {
        let mut env = self.moto.as_ref().map(Moto::env).unwrap_or_default();
        env.extend(extra.iter().cloned());
        if let Some(p) = &proxy {
            for (k, v) in &mut env {
                if *k == "AWS_ENDPOINT_URL" {
                    *v = format!("http://127.0.0.1:{}", p.port);
                }
            }
        }
        let mut flags = cluster::serve_flags(port, &self.config, &self.url);
        flags.extend(["--cluster-token".to_owned(), TOKEN.to_owned()]);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let node = Node::start_env(data, &flags, &env);
        wait_for("the node to act", || status(&node)["serving"] == true);
        let id = status(&node)["node"].as_str().unwrap().to_owned();
        Member {
            node,
            id,
            port,
            data: data.to_owned(),
            proxy,
        }
    }
}

pub(crate) fn actor_name(i: usize) -> String {
    format!("load-{i}")
}

/// How the load balancer spreads requests over the nodes in rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Routing {
    /// Every actor through every node in turn.
    RoundRobin,
    /// Each actor through one node at a time: the first node in rotation
    /// after the one [`create_spread`] created it through (so that its
    /// requests are forwarded to its owner), and while a request for it is
    /// in flight at one node none goes to another. Only that node can then
    /// take the actor when its owner dies, stops or lapses.
    OneNodePerActor,
}

/// The load balancer's view of the nodes: which are in rotation, and how
/// many requests each has in flight. Taking a node out waits for those to
/// finish, as connection draining does.
pub(crate) struct Balancer {
    ports: Vec<u16>,
    routing: Routing,
    state: Mutex<Rotation>,
    idle: Condvar,
}

struct Rotation {
    backends: Vec<Backend>,
    /// Per actor: the node its requests in flight went to, and how many.
    actors: HashMap<usize, (usize, usize)>,
}

#[derive(Clone, Copy)]
struct Backend {
    up: bool,
    in_flight: usize,
}

impl Balancer {
    pub(crate) fn new(ports: Vec<u16>, routing: Routing) -> Balancer {
        let n = ports.len();
        Balancer {
            ports,
            routing,
            state: Mutex::new(Rotation {
                backends: vec![
                    Backend {
                        up: true,
                        in_flight: 0
                    };
                    n
                ],
                actors: HashMap::new(),
            }),
            idle: Condvar::new(),
        }
    }

    /// The node for the `turn`-th request, for `actor`, marked as having
    /// one more request in flight; `None` if the actor must wait (its
    /// route moved while requests for it are in flight on the old one).
    pub(crate) fn pick(&self, turn: usize, actor: usize) -> Option<(usize, u16)> {
        let mut s = self.state.lock().unwrap();
        let n = s.backends.len();
        let up: Vec<usize> = (0..n).filter(|i| s.backends[*i].up).collect();
        assert!(!up.is_empty(), "no node in rotation");
        let i = match self.routing {
            Routing::RoundRobin => up[turn % up.len()],
            Routing::OneNodePerActor => {
                let home = (1..=n)
                    .map(|k| (actor + k) % n)
                    .find(|i| s.backends[*i].up)
                    .unwrap();
                if s.actors
                    .get(&actor)
                    .is_some_and(|(i, c)| *i != home && *c > 0)
                {
                    return None;
                }
                home
            }
        };
        s.backends[i].in_flight += 1;
        let entry = s.actors.entry(actor).or_insert((i, 0));
        *entry = (i, entry.1 + 1);
        Some((i, self.ports[i]))
    }

    pub(crate) fn done(&self, i: usize, actor: usize) {
        let mut s = self.state.lock().unwrap();
        s.backends[i].in_flight -= 1;
        if let Some(e) = s.actors.get_mut(&actor) {
            e.1 -= 1;
        }
        self.idle.notify_all();
    }

    /// Out of rotation at once (a failed health check): requests in flight
    /// are not waited for.
    pub(crate) fn remove(&self, i: usize) {
        self.state.lock().unwrap().backends[i].up = false;
    }

    /// Out of rotation, then waits until its requests in flight finished.
    pub(crate) fn drain(&self, i: usize) {
        let mut s = self.state.lock().unwrap();
        s.backends[i].up = false;
        while s.backends[i].in_flight > 0 {
            s = self.idle.wait(s).unwrap();
        }
    }

    pub(crate) fn restore(&self, i: usize) {
        self.state.lock().unwrap().backends[i].up = true;
    }
}

/// One increment a client sent, and what came of it.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub client: usize,
    pub actor: usize,
    pub target: usize,
    pub started: Instant,
    pub finished: Instant,
    /// `Ok((value, node that ran it))` if acknowledged (200 with the new
    /// value), else `Err((status, body))`: the increment may or may not have
    /// run.
    pub outcome: Result<(u64, String), (u16, String)>,
}

impl Sent {
    /// Acknowledged, and run by `node`.
    pub(crate) fn acked_by(&self, node: &str) -> bool {
        matches!(&self.outcome, Ok((_, n)) if n == node)
    }

    /// The error code of a failed request's answer (its body if it has
    /// none).
    pub(crate) fn error_code(&self) -> Option<String> {
        let (_, body) = self.outcome.as_ref().err()?;
        Some(
            serde_json::from_str::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
                .unwrap_or_else(|| body.clone()),
        )
    }
}

/// Client threads sending increments until told to stop, each to a node
/// the balancer picks, with no retry (a client pauses briefly after a
/// failed request).
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Sent>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    /// `clients` threads over `actors` actors, each giving up on a request
    /// after `timeout` (as a load balancer's request timeout: no answer,
    /// status 0).
    pub(crate) fn start(
        balancer: &Arc<Balancer>,
        clients: usize,
        actors: usize,
        timeout: Duration,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..clients)
            .map(|client| {
                let (stop, log, balancer) =
                    (Arc::clone(&stop), Arc::clone(&log), Arc::clone(balancer));
                std::thread::spawn(move || {
                    // Each client walks the actors in its own order and
                    // the nodes in turn, so every actor is reached through
                    // every node (with round robin).
                    let mut turn = client;
                    while !stop.load(Ordering::Relaxed) {
                        let (this, actor) = (turn, (turn * 7 + client * 3) % actors);
                        turn += 1;
                        let Some((target, port)) = balancer.pick(this, actor) else {
                            std::thread::sleep(Duration::from_millis(1));
                            continue;
                        };
                        let started = Instant::now();
                        let a = increment_within(port, &actor_name(actor), timeout);
                        let finished = Instant::now();
                        balancer.done(target, actor);
                        let acked = a.body["value"].as_u64().filter(|_| a.status == 200);
                        let outcome = match (acked, a.node) {
                            (Some(v), Some(node)) => Ok((v, node)),
                            _ => Err((a.status, a.body.to_string())),
                        };
                        let failed = outcome.is_err();
                        log.lock().unwrap().push(Sent {
                            client,
                            actor,
                            target,
                            started,
                            finished,
                            outcome,
                        });
                        if failed {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                })
            })
            .collect();
        Load { stop, log, threads }
    }

    pub(crate) fn snapshot(&self) -> Vec<Sent> {
        self.log.lock().unwrap().clone()
    }

    pub(crate) fn finish(self) -> Vec<Sent> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("a client thread panicked");
        }
        Arc::try_unwrap(self.log).unwrap().into_inner().unwrap()
    }

    /// Waits until every one of `actors` had at least `n` increments
    /// acknowledged that were sent after `since`.
    pub(crate) fn wait_acknowledged(&self, actors: usize, n: usize, since: Instant, what: &str) {
        wait_for(what, || {
            let log = self.snapshot();
            (0..actors).all(|a| {
                log.iter()
                    .filter(|s| s.actor == a && s.started > since && s.outcome.is_ok())
                    .count()
                    >= n
            })
        });
    }
}

/// Creates each actor through node `i % n`, so that owners are spread
/// before the load starts (and no first request races another's take).
pub(crate) fn create_spread(members: &[Member], actors: usize) {
    for i in 0..actors {
        let m = &members[i % members.len()];
        let a = increment(m.port, &actor_name(i));
        assert_eq!(counter(&a), 1, "{}", actor_name(i));
        assert_eq!(a.node.as_deref(), Some(m.id.as_str()));
    }
}

/// Creates `actors` actors spread over `members` ([`create_spread`]), puts
/// the members behind a balancer that routes as the cluster's store needs,
/// and starts `clients` client threads ([`Load::start`]); returns once
/// every actor had three more writes acknowledged.
pub(crate) fn spread_load(
    c: &Cluster,
    members: &[Member],
    actors: usize,
    clients: usize,
    timeout: Duration,
) -> (Arc<Balancer>, Load) {
    create_spread(members, actors);
    let ports = members.iter().map(|m| m.port).collect();
    let balancer = Arc::new(Balancer::new(ports, c.routing()));
    let load = Load::start(&balancer, clients, actors, timeout);
    load.wait_acknowledged(actors, 3, Instant::now(), "load on every actor");
    (balancer, load)
}

/// A counter or gauge of `m`'s `/metrics` (the test fails if it is not
/// there).
#[allow(dead_code, reason = "not every test binary reads metrics")]
pub(crate) fn metric(m: &Member, name: &str) -> u64 {
    let (_, text) = m.node.get("/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// The owners: the node that ran each actor's latest acknowledged write.
pub(crate) fn owners(log: &[Sent]) -> HashMap<usize, String> {
    let mut o = HashMap::new();
    for s in log {
        if let Ok((_, node)) = &s.outcome {
            o.insert(s.actor, node.clone());
        }
    }
    o
}

/// The member that owns the most actors in `owners`, and those actors.
pub(crate) fn busiest(members: &[Member], owners: &HashMap<usize, String>) -> (usize, Vec<usize>) {
    let owned = |i: usize| {
        let mut a: Vec<usize> = owners
            .iter()
            .filter(|(_, n)| **n == members[i].id)
            .map(|(a, _)| *a)
            .collect();
        a.sort();
        a
    };
    let i = (0..members.len()).max_by_key(|i| owned(*i).len()).unwrap();
    let actors = owned(i);
    assert!(!actors.is_empty(), "the busiest node owns no actor");
    (i, actors)
}

/// What the checks found, for the report.
#[derive(Default)]
pub(crate) struct Tally {
    pub sent: usize,
    pub acknowledged: usize,
    pub failed: usize,
    /// Failed requests by status (0: no answer).
    pub failed_by_status: BTreeMap<u16, usize>,
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} requests, {} acknowledged, {} failed (by status, 0 = no answer: {:?})",
            self.sent, self.acknowledged, self.failed, self.failed_by_status
        )
    }
}

/// The history checks, against `finals` (each actor's value read back
/// after the load; 1 from `create_spread` is counted as acknowledged):
/// per actor no value is acknowledged twice; each client's acknowledged
/// values rise; every acknowledged value is at most the final one; and the
/// final value is no more than the increments that may have run (those
/// acknowledged plus those whose outcome is unknown), so nothing
/// unacknowledged was invented and nothing acknowledged went missing.
pub(crate) fn check_history(log: &[Sent], finals: &[u64]) -> Tally {
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

/// Failures came only after `fault` (the moment a node was killed or cut
/// off), and each was a 5xx answer or no answer (a request in flight at a
/// killed node); never a 4xx.
pub(crate) fn check_failures(log: &[Sent], fault: Instant) {
    let before: Vec<&Sent> = log
        .iter()
        .filter(|s| s.outcome.is_err() && s.finished < fault)
        .collect();
    assert!(before.is_empty(), "failed before the fault: {before:?}");
    let bad: Vec<&Sent> = log
        .iter()
        .filter(|s| matches!(&s.outcome, Err((st, _)) if (1..500).contains(st)))
        .collect();
    assert!(bad.is_empty(), "neither 5xx nor a lost connection: {bad:?}");
}

/// Failed requests grouped by status and error code.
pub(crate) fn failures_by_code(log: &[Sent]) -> BTreeMap<(u16, String), usize> {
    let mut why = BTreeMap::new();
    for s in log {
        if let (Err((status, _)), Some(code)) = (&s.outcome, s.error_code()) {
            *why.entry((*status, code)).or_default() += 1;
        }
    }
    why
}

/// With no request failed, every increment was acknowledged: each actor's
/// acknowledged values (and the 1 its creation set) are exactly
/// `1..=final`, none missing, none twice.
pub(crate) fn check_every_value_acknowledged(log: &[Sent], finals: &[u64]) {
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
}

/// Reads every actor's value through every member; all must agree.
pub(crate) fn read_finals(members: &[&Member], actors: usize) -> Vec<u64> {
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
