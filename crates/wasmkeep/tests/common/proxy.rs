//! A TCP proxy between one node and the bucket server (moto), with switches
//! for network faults, so that one node of a cluster loses its bucket, or
//! sees it slow, while it keeps running and serving HTTP (issue 18, "a node
//! cut off from the bucket").
//!
//! - [`Proxy::cut`]: a blackhole. From then on nothing crosses, in either
//!   direction: bytes on open connections are dropped, and new connections
//!   are accepted and what they send is dropped too, so requests in flight
//!   and new ones hang until their client gives up, as behind a dead link.
//!   Whatever reaches the server was sent before the cut.
//! - [`Proxy::slow`]: every chunk, in either direction, is passed on
//!   `delay` after it arrived, in order (latency, not a lower rate); a
//!   request whose client gave up meanwhile still reaches the server.
//! - [`Proxy::restore`]: passes again, at once (chunks a slow link held go
//!   on now); the connections that lost bytes to a cut are closed, so the
//!   client opens new ones. In two steps: [`Proxy::pass_new`] passes again
//!   but for the connections a cut broke, which stay silent (as TCP
//!   connections whose packets were lost, after the network came back)
//!   until [`Proxy::close_broken`].

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pass,
    Cut,
    Slow(Duration),
}

/// One proxied connection: the node's side and the server's.
struct Conn {
    client: TcpStream,
    server: TcpStream,
    /// Bytes of it were dropped by a cut: closed at [`Proxy::restore`].
    cut: AtomicBool,
}

impl Conn {
    fn close(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
    }
}

struct Shared {
    mode: Mutex<Mode>,
    conns: Mutex<Vec<Arc<Conn>>>,
    stop: AtomicBool,
}

impl Shared {
    fn passes(&self) -> bool {
        *self.mode.lock().unwrap() == Mode::Pass
    }

    /// The delay for a chunk of `conn` now, or `None` if it is dropped: a
    /// cut drops it and marks `conn` (under the lock [`Proxy::pass_new`]
    /// takes, so a connection that lost a chunk is marked before the proxy
    /// passes again), and a marked connection passes nothing more.
    fn admit(&self, conn: &Conn) -> Option<Duration> {
        let mode = self.mode.lock().unwrap();
        if conn.cut.load(Ordering::Acquire) {
            return None;
        }
        match *mode {
            Mode::Cut => {
                conn.cut.store(true, Ordering::Release);
                None
            }
            Mode::Pass => Some(Duration::ZERO),
            Mode::Slow(delay) => Some(delay),
        }
    }
}

/// A proxy on a free loopback port to `127.0.0.1:upstream`; closes every
/// connection on drop.
pub(crate) struct Proxy {
    pub port: u16,
    shared: Arc<Shared>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    pub(crate) fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy port");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::Pass),
            conns: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        let acceptor = std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.stop.load(Ordering::Acquire) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let conn = Arc::new(Conn {
                    client,
                    server,
                    cut: AtomicBool::new(false),
                });
                {
                    let mut conns = s.conns.lock().unwrap();
                    // Connections whose pumps all ended are only here.
                    conns.retain(|c| Arc::strong_count(c) > 1);
                    conns.push(Arc::clone(&conn));
                }
                let (c, sv) = (&conn.client, &conn.server);
                for (from, to) in [(c, sv), (sv, c)] {
                    match (from.try_clone(), to.try_clone()) {
                        (Ok(from), Ok(to)) => pump(&s, &conn, from, to),
                        _ => conn.close(),
                    }
                }
            }
        });
        Proxy {
            port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// Drops everything from now on (see the module's documentation).
    pub(crate) fn cut(&self) {
        *self.shared.mode.lock().unwrap() = Mode::Cut;
    }

    /// Holds every chunk `delay` before passing it on.
    pub(crate) fn slow(&self, delay: Duration) {
        *self.shared.mode.lock().unwrap() = Mode::Slow(delay);
    }

    /// Passes again, and closes the connections a cut broke.
    pub(crate) fn restore(&self) {
        self.pass_new();
        self.close_broken();
    }

    /// Passes again, but for the connections a cut broke: they stay silent.
    pub(crate) fn pass_new(&self) {
        *self.shared.mode.lock().unwrap() = Mode::Pass;
    }

    /// Closes the connections a cut broke.
    pub(crate) fn close_broken(&self) {
        for c in self.shared.conns.lock().unwrap().iter() {
            if c.cut.load(Ordering::Acquire) {
                c.close();
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for c in self.shared.conns.lock().unwrap().drain(..) {
            c.close();
        }
        // Wakes the acceptor, which then sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

/// Copies `from` to `to` through two threads: a reader that stamps each
/// chunk with the time it may leave (or drops it during a cut), and a
/// writer that passes chunks on in order at their time (or at once once
/// the proxy passes again). The end of `from`
/// ends `to`'s writing side; a failed write closes the connection.
fn pump(shared: &Arc<Shared>, conn: &Arc<Conn>, mut from: TcpStream, mut to: TcpStream) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let (s, c) = (Arc::clone(shared), Arc::clone(conn));
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            let Some(delay) = s.admit(&c) else { continue };
            if tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
    });
    let (s, c) = (Arc::clone(shared), Arc::clone(conn));
    std::thread::spawn(move || {
        for (due, chunk) in rx {
            while Instant::now() < due && !s.passes() {
                std::thread::sleep(Duration::from_millis(5));
            }
            if s.admit(&c).is_none() {
                continue;
            }
            if to.write_all(&chunk).is_err() {
                c.close();
                return;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
