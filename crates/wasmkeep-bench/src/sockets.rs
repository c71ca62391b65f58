//! W8, sockets (ADR 0043): 10,000 WebSockets over 100 `chat` rooms on one
//! node, the rooms hibernated between messages.
//!
//! 1. The 100 rooms are touched once and left to close (the node runs with
//!    `actor_idle_ms = 1000`): the node's RSS then is the baseline.
//! 2. `--sockets` (10,000) sockets are opened, spread evenly over the
//!    rooms; once every room has closed again, RSS is read:
//!    `kib_per_idle_socket` is the difference over the sockets.
//! 3. Broadcast fan-out: one socket of each room sends 10 messages, each
//!    delivered to every socket of its room; `deliveries_per_s` from the
//!    first send to the last delivery.
//! 4. Round trip: one socket alone in a room sends 200 messages one after
//!    another and waits for its own echo (`echo_p50_ms`, `echo_p99_ms`:
//!    each wakes the room), then 200 `ping`s the node answers itself
//!    (`auto_p50_ms`, `auto_p99_ms`: the room stays asleep).
//!
//! The benchmark's process raises its open-file limit to the hard limit
//! first (the node it starts inherits it): 10,000 sockets need as many
//! descriptors on each side.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use crate::client::Endpoint;
use crate::workloads::EXAMPLES;
use crate::workloads::{Env, RunOutput, finish, quantile, scrape};

/// Rooms the sockets are spread over.
pub const ROOMS: usize = 100;
/// Messages each room's sender broadcasts.
const BROADCASTS_PER_ROOM: usize = 10;
/// Round trips measured, each way.
const ROUND_TRIPS: usize = 200;
/// Sockets opened at once.
const OPENING_CONCURRENCY: usize = 64;
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Raises this process's open-file limit to what W8 needs (or the hard
/// limit, if this process may not raise that).
pub(crate) fn raise_fd_limit(need: u64) {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
            let want = libc::rlimit {
                rlim_cur: need.max(l.rlim_cur),
                rlim_max: need.max(l.rlim_max),
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) != 0 {
                l.rlim_cur = l.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            }
        }
    }
}

pub(crate) fn fd_limit() -> u64 {
    // SAFETY: as above.
    unsafe {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur
    }
}

async fn open(ep: &Endpoint, room: &str) -> Result<Socket> {
    let url = format!("ws://{}{EXAMPLES}/chat/{room}/ws", ep.addr);
    let (ws, _) = tokio_tungstenite::connect_async(url).await?;
    Ok(ws)
}

async fn instances_active(ep: &Endpoint) -> Result<f64> {
    Ok(scrape(ep)
        .await?
        .get("wasmkeep_instances_active")
        .copied()
        .unwrap_or(-1.0))
}

/// Waits until no actor is open (every room hibernated).
async fn all_asleep(ep: &Endpoint) -> Result<bool> {
    let t = crate::clock::now();
    while t.elapsed() < SETTLE_LIMIT {
        if instances_active(ep).await? == 0.0 {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(false)
}

pub async fn w8(env: &Env<'_>) -> Result<RunOutput> {
    let mut out = RunOutput::default();
    let sockets = env.args.sockets;
    // Each side holds one descriptor a socket, plus the node's files.
    let need = sockets as u64 + 4_096;
    raise_fd_limit(need);
    if fd_limit() < need {
        bail!(
            "W8 needs about {need} open files per process; the limit is {} (ulimit -n)",
            fd_limit()
        );
    }
    let dir = env
        .own_dir()
        .ok_or_else(|| anyhow!("W8 needs a node started by the benchmark"))?;
    let config = dir.join("w8.toml");
    std::fs::write(
        &config,
        // Every socket comes from this one address (the load generator):
        // the per-address bound is raised with the node's.
        format!(
            "actor_idle_ms = 1000\nsocket_idle_ms = 0\nsockets_max = {0}\n\
             sockets_per_client_max = {0}\n",
            sockets * 2
        ),
    )?;
    let node = env.start(Some(config)).await?.expect("own node");
    let ep = node.endpoint.clone();
    let r = run(&node, &ep, sockets, &mut out).await;
    finish(Some(node), &mut out).await;
    r.map(|_| out)
}

/// KiB in a MiB.
const MIB: f64 = 1024.0;

/// Touches every room once, waits for them all to close, and reads the
/// node's RSS (KiB) then: whether they all closed, and the baseline.
async fn rooms_asleep(
    node: &crate::node::Node,
    ep: &Endpoint,
    rooms: &[String],
    out: &mut RunOutput,
) -> Result<(bool, f64)> {
    let reqs = rooms
        .iter()
        .map(|r| (hyper::Method::GET, format!("{EXAMPLES}/chat/{r}/count")))
        .collect();
    crate::client::send_all(ep, 16, reqs).await?;
    let asleep = all_asleep(ep).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = node.rss_kib()? as f64;
    out.fig("rss_rooms_asleep_mib", before / MIB);
    Ok((asleep, before))
}

/// Opens `sockets` sockets spread evenly over the rooms,
/// [`OPENING_CONCURRENCY`] at a time; each with its room's index.
async fn open_sockets(
    ep: &Endpoint,
    rooms: &[String],
    sockets: usize,
) -> Result<Vec<(usize, Socket)>> {
    let mut all: Vec<(usize, Socket)> = Vec::with_capacity(sockets);
    let mut i = 0;
    while i < sockets {
        let batch: Vec<_> = (i..(i + OPENING_CONCURRENCY).min(sockets))
            .map(|k| {
                let room = rooms[k % ROOMS].clone();
                let ep = ep.clone();
                async move { open(&ep, &room).await.map(|s| (k % ROOMS, s)) }
            })
            .collect();
        for r in futures_util::future::join_all(batch).await {
            all.push(r?);
        }
        i += OPENING_CONCURRENCY;
    }
    Ok(all)
}

/// The sockets split for the broadcast: one sender per room, and a reader
/// on every socket counting the messages it receives.
struct Fanout {
    senders: Vec<Option<futures_util::stream::SplitSink<Socket, Message>>>,
    readers: Vec<tokio::task::JoinHandle<()>>,
    received: Arc<AtomicU64>,
}

/// Splits every socket: keeps the first sink of each room as its sender,
/// and spawns a reader on every stream.
fn fan_out(all: Vec<(usize, Socket)>) -> Fanout {
    let received = Arc::new(AtomicU64::new(0));
    let mut senders: Vec<Option<futures_util::stream::SplitSink<Socket, Message>>> =
        (0..ROOMS).map(|_| None).collect();
    let mut readers = Vec::new();
    for (room, ws) in all {
        let (sink, mut stream) = ws.split();
        if senders[room].is_none() {
            senders[room] = Some(sink);
        } else {
            drop(sink);
        }
        let received = Arc::clone(&received);
        readers.push(tokio::spawn(async move {
            while let Some(Ok(m)) = stream.next().await {
                if m.is_text() {
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    Fanout {
        senders,
        readers,
        received,
    }
}

/// Broadcast fan-out: one socket of each room sends
/// [`BROADCASTS_PER_ROOM`] messages, each delivered to every socket of its
/// room; returns the readers, still running.
async fn broadcast(
    all: Vec<(usize, Socket)>,
    sockets: usize,
    out: &mut RunOutput,
) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let Fanout {
        mut senders,
        readers,
        received,
    } = fan_out(all);
    let per_room = sockets / ROOMS;
    let expected = (ROOMS * BROADCASTS_PER_ROOM * per_room) as u64;
    let t = crate::clock::now();
    let sends = senders.iter_mut().enumerate().map(|(room, s)| {
        let sink = s.as_mut().expect("a sender per room");
        async move {
            for k in 0..BROADCASTS_PER_ROOM {
                sink.send(Message::Text(format!("room{room} message {k}").into()))
                    .await?;
            }
            anyhow::Ok(())
        }
    });
    for r in futures_util::future::join_all(sends).await {
        r?;
    }
    while received.load(Ordering::Relaxed) < expected && t.elapsed() < SETTLE_LIMIT {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = t.elapsed().as_secs_f64();
    let got = received.load(Ordering::Relaxed);
    out.fig("deliveries_per_s", got as f64 / elapsed);
    out.fig("broadcast_s", elapsed);
    out.check(
        "every_broadcast_delivered",
        got == expected,
        format!("{got} of {expected} deliveries ({ROOMS} rooms, {BROADCASTS_PER_ROOM} messages, {per_room} sockets a room)"),
    );
    Ok(readers)
}

/// Round trips on one socket alone in its room: echoes (each wakes the
/// room) and `ping`s the node answers itself, in turn.
async fn round_trips(ep: &Endpoint, out: &mut RunOutput) -> Result<()> {
    let mut solo = open(ep, "solo").await?;
    let mut echo = Vec::with_capacity(ROUND_TRIPS);
    let mut auto = Vec::with_capacity(ROUND_TRIPS);
    for k in 0..ROUND_TRIPS * 2 {
        let text = if k % 2 == 0 {
            format!("rt {k}")
        } else {
            "ping".to_string()
        };
        let t = crate::clock::now();
        solo.send(Message::Text(text.clone().into())).await?;
        loop {
            match tokio::time::timeout(Duration::from_secs(10), solo.next()).await {
                Ok(Some(Ok(Message::Text(_)))) => break,
                Ok(Some(Ok(_))) => continue,
                _ => bail!("no answer to `{text}` within 10 s"),
            }
        }
        let us = t.elapsed().as_micros() as u64;
        if k % 2 == 0 {
            echo.push(us)
        } else {
            auto.push(us)
        }
    }
    echo.sort_unstable();
    auto.sort_unstable();
    let ms = |v: Option<u64>| v.unwrap_or(0) as f64 / 1000.0;
    out.fig("echo_p50_ms", ms(quantile(&echo, 0.50)));
    out.fig("echo_p99_ms", ms(quantile(&echo, 0.99)));
    out.fig("auto_p50_ms", ms(quantile(&auto, 0.50)));
    out.fig("auto_p99_ms", ms(quantile(&auto, 0.99)));
    Ok(())
}

/// W8's run on a started node: the rooms' baseline, the idle sockets'
/// memory, the broadcast, the round trips.
async fn run(
    node: &crate::node::Node,
    ep: &Endpoint,
    sockets: usize,
    out: &mut RunOutput,
) -> Result<()> {
    let rooms: Vec<String> = (0..ROOMS).map(|i| format!("room{i}")).collect();
    let (asleep, before) = rooms_asleep(node, ep, &rooms, out).await?;
    let t = crate::clock::now();
    let all = open_sockets(ep, &rooms, sockets).await?;
    out.fig("open_s", t.elapsed().as_secs_f64());
    let asleep_again = all_asleep(ep).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = node.rss_kib()? as f64;
    out.fig("rss_sockets_open_mib", after / MIB);
    out.fig("kib_per_idle_socket", (after - before) / sockets as f64);
    out.check(
        "rooms_hibernated",
        asleep && asleep_again,
        format!("wasmkeep_instances_active reached 0 before ({asleep}) and with the sockets open ({asleep_again})"),
    );
    let readers = broadcast(all, sockets, out).await?;
    round_trips(ep, out).await?;
    out.fig("peak_rss_mib", node.peak_rss_kib()? as f64 / MIB);
    for r in readers {
        r.abort();
    }
    Ok(())
}
