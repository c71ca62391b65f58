//! The node's recent log lines about actors, kept for `wasmkeep logs` and
//! `wasmkeep dev` (issue 22).
//!
//! Three sources write here: the guest's own lines (`log.*`, after the
//! per-event budget of [`crate::log_budget`] and with secrets scrubbed),
//! the runtime's lines about an actor (a failed alarm, a dropped alarm),
//! and the HTTP edge (one access line per request when the access log is
//! on, and every failed request with its code). Each line names its actor,
//! so a reader asks for a scope: a tenant, an app, a class or one actor.
//!
//! The hub is a ring of the latest lines, bounded in lines and in bytes
//! ([`LogHubLimits`]), plus a broadcast channel for followers. A follower
//! that reads too slowly is not waited for: it skips what the channel
//! dropped and is told how many lines it missed. The number of followers is
//! bounded too (`too_many_followers`). Nothing here blocks a worker beyond
//! one short lock per line.
//!
//! The node's own `tracing` output (stderr) is unchanged by this module;
//! the hub is what the admin API can serve.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::broadcast;
use wasmkeep_store::ActorId;

use crate::error::RuntimeError;

/// How severe a line is, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    /// The lower-case name used in the API and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Trace => "trace",
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }

    /// Parses `trace`, `debug`, `info`, `warn` or `error`.
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s {
            "trace" => Level::Trace,
            "debug" => Level::Debug,
            "info" => Level::Info,
            "warn" => Level::Warn,
            "error" => Level::Error,
            _ => return None,
        })
    }
}

/// Who wrote a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The actor itself, through `log.*`.
    Guest,
    /// The runtime, about the actor (an alarm that failed, for example).
    Runtime,
    /// The HTTP edge: a request and its outcome.
    Access,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Guest => "guest",
            Source::Runtime => "runtime",
            Source::Access => "access",
        }
    }
}

/// One line.
#[derive(Debug, Clone)]
pub struct LogLine {
    /// Number of the line in this node's run, from 1; a follower sees gaps
    /// only where it was told it missed lines.
    pub seq: u64,
    /// Node clock, unix milliseconds.
    pub at_ms: u64,
    pub level: Level,
    pub source: Source,
    pub actor: ActorId,
    pub message: String,
    /// Access lines only: method, path, status and duration.
    pub access: Option<Access>,
}

/// What the edge knows of a request it answered.
#[derive(Debug, Clone)]
pub struct Access {
    pub method: String,
    pub path: String,
    pub status: u16,
    pub duration_us: u64,
    /// The error's stable code, for a request the node refused or failed.
    pub code: Option<String>,
    /// The app version that answered (`x-wasmkeep-version`), when an
    /// actor did (ADR 0059).
    pub version: Option<u64>,
}

/// Longest message a line keeps (the rest is cut, marked `…`): a guest's
/// error message can be megabytes.
pub(crate) const LINE_BYTES_MAX: usize = 4096;

/// `s` cut to at most `max` bytes on a character boundary, marked `…`.
pub fn clip(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end]).into()
}

impl LogLine {
    /// A line to [`LogHub::push`] (which numbers it); the message is cut
    /// to [`LINE_BYTES_MAX`].
    pub fn new(at_ms: u64, level: Level, source: Source, actor: ActorId, message: String) -> Self {
        let message = match clip(&message, LINE_BYTES_MAX) {
            std::borrow::Cow::Borrowed(_) => message,
            std::borrow::Cow::Owned(cut) => cut,
        };
        LogLine {
            seq: 0,
            at_ms,
            level,
            source,
            actor,
            message,
            access: None,
        }
    }

    fn bytes(&self) -> usize {
        // Rough, but it bounds what the ring keeps: the texts plus a fixed
        // overhead for the record and the actor's address.
        self.message.len()
            + self.actor.name.len()
            + self
                .access
                .as_ref()
                .map_or(0, |a| a.path.len() + a.method.len())
            + 128
    }
}

/// Which lines a reader wants: an actor's address cut after any part.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    pub tenant: String,
    pub app: Option<String>,
    pub class: Option<String>,
    pub name: Option<String>,
}

impl Scope {
    pub fn contains(&self, id: &ActorId) -> bool {
        id.tenant == self.tenant
            && self.app.as_ref().is_none_or(|a| *a == id.app)
            && self.class.as_ref().is_none_or(|c| *c == id.class)
            && self.name.as_ref().is_none_or(|n| *n == id.name)
    }
}

/// The hub's bounds (`log_buffer_lines`, `log_buffer_bytes`,
/// `log_followers_max` in the configuration).
#[derive(Debug, Clone, Copy)]
pub struct LogHubLimits {
    /// Lines kept for readers that ask for the past.
    pub lines_max: usize,
    /// Bytes kept (approximate: the texts plus 128 per line).
    pub bytes_max: usize,
    /// Readers following at once; one more is refused.
    pub followers_max: usize,
}

impl Default for LogHubLimits {
    fn default() -> Self {
        LogHubLimits {
            lines_max: 10_000,
            bytes_max: 8 << 20,
            followers_max: 32,
        }
    }
}

/// Lines a follower may fall behind before it misses some: the broadcast
/// channel's capacity, shared by all followers (at most this many lines of
/// at most [`LINE_BYTES_MAX`] each are held for them).
pub(crate) const FOLLOW_BACKLOG_LINES: usize = 1_024;

/// Cuts lines of one kind to a rate: at most `per_s` in each second of
/// the node's run; the next line admitted learns how many were left out.
#[derive(Debug, Default)]
pub struct RateCut {
    /// The second (since `start`) the count is for, and the count.
    window: std::sync::atomic::AtomicU64,
    in_window: std::sync::atomic::AtomicU64,
    left_out: std::sync::atomic::AtomicU64,
    start: std::sync::OnceLock<std::time::Instant>,
}

impl RateCut {
    /// `Some(left out before this one)` if a line may be written now.
    pub fn admit(&self, per_s: u64) -> Option<u64> {
        let start = *self.start.get_or_init(crate::clock::instant);
        let second = start.elapsed().as_secs();
        if self.window.swap(second, Ordering::Relaxed) != second {
            self.in_window.store(0, Ordering::Relaxed);
        }
        if self.in_window.fetch_add(1, Ordering::Relaxed) < per_s {
            Some(self.left_out.swap(0, Ordering::Relaxed))
        } else {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// The node's recent lines and its followers.
pub struct LogHub {
    limits: LogHubLimits,
    ring: Mutex<Ring>,
    followers: Arc<AtomicUsize>,
}

struct Ring {
    lines: VecDeque<Arc<LogLine>>,
    bytes: usize,
    next_seq: u64,
    /// `None` once the hub is closed (the node stops): followers end.
    live: Option<broadcast::Sender<Arc<LogLine>>>,
}

impl LogHub {
    pub fn new(limits: LogHubLimits) -> LogHub {
        let (live, _) = broadcast::channel(FOLLOW_BACKLOG_LINES);
        LogHub {
            limits,
            ring: Mutex::new(Ring {
                lines: VecDeque::new(),
                bytes: 0,
                next_seq: 1,
                live: Some(live),
            }),
            followers: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Whether anyone follows: the edge writes access lines to the hub only
    /// then, or when its access log is on.
    pub fn followed(&self) -> bool {
        self.followers.load(Ordering::Relaxed) > 0
    }

    /// Ends every follower once it has read what was sent: the node
    /// stops, and an endless response must not hold its connections open.
    pub fn close(&self) {
        self.ring.lock().live = None;
    }

    /// Adds a line (its `seq` is set here).
    pub fn push(&self, mut line: LogLine) {
        let mut ring = self.ring.lock();
        line.seq = ring.next_seq;
        ring.next_seq += 1;
        let line = Arc::new(line);
        ring.bytes += line.bytes();
        ring.lines.push_back(Arc::clone(&line));
        while ring.lines.len() > self.limits.lines_max
            || (ring.bytes > self.limits.bytes_max && ring.lines.len() > 1)
        {
            if let Some(old) = ring.lines.pop_front() {
                ring.bytes -= old.bytes();
            }
        }
        // No receiver is not an error: nobody follows. Sent under the
        // lock, so followers see lines in `seq` order.
        if let Some(live) = &ring.live {
            let _ = live.send(line);
        }
    }

    /// The kept lines in `scope` at `level` or above, oldest first, at most
    /// `limit` of the latest.
    pub fn recent(&self, scope: &Scope, level: Level, limit: usize) -> Vec<Arc<LogLine>> {
        let ring = self.ring.lock();
        let mut out: Vec<Arc<LogLine>> = ring
            .lines
            .iter()
            .rev()
            .filter(|l| l.level >= level && scope.contains(&l.actor))
            .take(limit)
            .cloned()
            .collect();
        out.reverse();
        out
    }

    /// Starts following: lines pushed from now on. Refused with
    /// `too_many_followers` past `followers_max`.
    pub fn follow(&self) -> Result<Follower, RuntimeError> {
        let max = self.limits.followers_max;
        self.followers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| RuntimeError::TooManyFollowers { max })?;
        // From here the count is the follower's to give back (on drop).
        let count = Arc::clone(&self.followers);
        let rx = match &self.ring.lock().live {
            Some(live) => live.subscribe(),
            None => {
                count.fetch_sub(1, Ordering::AcqRel);
                return Err(RuntimeError::ShuttingDown);
            }
        };
        Ok(Follower { rx, count })
    }
}

/// One reader following the hub; dropping it frees its place.
pub struct Follower {
    rx: broadcast::Receiver<Arc<LogLine>>,
    count: Arc<AtomicUsize>,
}

/// What a follower gets next.
pub enum Followed {
    Line(Arc<LogLine>),
    /// The follower fell behind and this many lines went by unseen.
    Missed(u64),
    /// The hub is gone (the node stops).
    Closed,
}

impl Follower {
    pub async fn next(&mut self) -> Followed {
        match self.rx.recv().await {
            Ok(line) => Followed::Line(line),
            Err(broadcast::error::RecvError::Lagged(n)) => Followed::Missed(n),
            Err(broadcast::error::RecvError::Closed) => Followed::Closed,
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(actor: &str, level: Level, message: &str) -> LogLine {
        let p: Vec<&str> = actor.split('/').collect();
        LogLine {
            seq: 0,
            at_ms: 1,
            level,
            source: Source::Guest,
            actor: ActorId::new(p[0], p[1], p[2], p[3]).unwrap(),
            message: message.into(),
            access: None,
        }
    }

    fn scope(s: &str) -> Scope {
        let mut p = s.split('/').map(str::to_owned);
        Scope {
            tenant: p.next().unwrap(),
            app: p.next(),
            class: p.next(),
            name: p.next(),
        }
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let long = "é".repeat(LINE_BYTES_MAX);
        let l = LogLine::new(
            1,
            Level::Info,
            Source::Guest,
            line("t/a/c/n", Level::Info, "").actor,
            long,
        );
        assert!(l.message.len() <= LINE_BYTES_MAX + "…".len());
        assert!(l.message.ends_with('…'));
        assert_eq!(clip("short", 10), "short");
    }

    #[test]
    fn a_rate_cut_admits_per_second_and_counts_what_it_left_out() {
        let r = RateCut::default();
        assert_eq!(r.admit(2), Some(0));
        assert_eq!(r.admit(2), Some(0));
        assert_eq!(r.admit(2), None);
        assert_eq!(r.admit(2), None);
        std::thread::sleep(std::time::Duration::from_millis(1_050));
        assert_eq!(r.admit(2), Some(2), "the next line says two were left out");
    }

    #[test]
    fn a_scope_selects_by_any_prefix_of_the_address_and_level() {
        let hub = LogHub::new(LogHubLimits::default());
        hub.push(line("acme/shop/cart/a", Level::Info, "one"));
        hub.push(line("acme/shop/cart/b", Level::Debug, "two"));
        hub.push(line("acme/shop/user/a", Level::Warn, "three"));
        hub.push(line("other/shop/cart/a", Level::Error, "four"));
        let msgs = |s: &str, l: Level| -> Vec<String> {
            hub.recent(&scope(s), l, 100)
                .iter()
                .map(|l| l.message.clone())
                .collect()
        };
        assert_eq!(msgs("acme", Level::Trace), ["one", "two", "three"]);
        assert_eq!(msgs("acme/shop/cart", Level::Trace), ["one", "two"]);
        assert_eq!(msgs("acme/shop/cart/b", Level::Trace), ["two"]);
        assert_eq!(msgs("acme", Level::Info), ["one", "three"]);
        assert_eq!(msgs("acme/shop/cartx", Level::Trace), Vec::<String>::new());
        let seqs: Vec<u64> = hub
            .recent(&scope("acme"), Level::Trace, 2)
            .iter()
            .map(|l| l.seq)
            .collect();
        assert_eq!(seqs, [2, 3], "the latest lines, oldest first");
    }

    #[test]
    fn the_ring_keeps_the_latest_lines_within_its_line_and_byte_bounds() {
        let hub = LogHub::new(LogHubLimits {
            lines_max: 3,
            bytes_max: 1 << 20,
            followers_max: 1,
        });
        for i in 0..10 {
            hub.push(line("t/a/c/n", Level::Info, &i.to_string()));
        }
        let kept: Vec<String> = hub
            .recent(&scope("t"), Level::Trace, 100)
            .iter()
            .map(|l| l.message.clone())
            .collect();
        assert_eq!(kept, ["7", "8", "9"]);

        let hub = LogHub::new(LogHubLimits {
            lines_max: 1000,
            bytes_max: 3_000,
            followers_max: 1,
        });
        for _ in 0..10 {
            hub.push(line("t/a/c/n", Level::Info, &"x".repeat(1_000)));
        }
        let kept = hub.recent(&scope("t"), Level::Trace, 100);
        assert!(kept.len() <= 3, "kept {} lines of 1 KB in 3 KB", kept.len());
        assert!(!kept.is_empty());
    }

    #[test]
    fn followers_are_bounded_and_a_slow_one_is_told_what_it_missed() {
        let hub = LogHub::new(LogHubLimits {
            followers_max: 1,
            ..LogHubLimits::default()
        });
        let mut f = hub.follow().unwrap();
        assert!(matches!(
            hub.follow(),
            Err(RuntimeError::TooManyFollowers { max: 1 })
        ));
        for i in 0..FOLLOW_BACKLOG_LINES + 10 {
            hub.push(line("t/a/c/n", Level::Info, &i.to_string()));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            assert!(matches!(f.next().await, Followed::Missed(10)));
            match f.next().await {
                Followed::Line(l) => assert_eq!(l.message, "10"),
                _ => panic!("expected a line"),
            }
        });
        drop(f);
        let mut f = hub.follow().expect("a dropped follower frees its place");
        hub.push(line("t/a/c/n", Level::Info, "last"));
        hub.close();
        rt.block_on(async {
            assert!(matches!(f.next().await, Followed::Line(_)));
            assert!(
                matches!(f.next().await, Followed::Closed),
                "closing ends followers"
            );
        });
        drop(f);
        assert!(matches!(hub.follow(), Err(RuntimeError::ShuttingDown)));
    }
}
