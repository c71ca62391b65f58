//! Traces (issue 39, ADR 0064): the W3C trace context a request carries,
//! the spans a traced event records, and the node's ring of recent spans.
//!
//! The runtime knows no exporter and no HTTP: the server decides which
//! requests are traced (their `traceparent`, a sampling share), hands the
//! event an [`EventTrace`], records its own spans (the request, a forward)
//! in the same [`Traces`], and exports what the ring receives (OTLP).
//!
//! A traced request's event records, as children of the request's span:
//! - `queue`: from when it was queued to when its handler began (waiting
//!   for its actor's turn, the database's open and the instance, and the
//!   events before it in its batch);
//! - `guest`: its handler, with a `sql` child per statement it ran (the
//!   first [`TRACE_SQL_SPANS_MAX`]; the rest are counted on `guest`);
//! - `commit`: its batch's commit;
//! - `durable`: from the commit to the reply's release after the fsync;
//! - `upload`: a replicated request's wait for the bucket after that
//!   (recorded by `replication` when its answer is released).
//!
//! An event no request started begins a trace of its own, whose root span
//! (kind `consumer`) covers it from its queueing to its release, with the
//! same children: `alarm` for an alarm's run, linked to the traced event
//! that set the alarm (only such alarms are traced; [`Traces::link_alarm`]),
//! and `socket` for a WebSocket message the server sampled.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use wasmkeep_store::ActorId;

/// Spans a node keeps for the console and the admin API (the oldest go).
pub const TRACE_SPANS_MAX: usize = 20_000;
/// `sql` spans one event records; past it statements are only counted.
pub const TRACE_SQL_SPANS_MAX: usize = 64;
/// Longest text a span keeps in one attribute (a statement, a path).
pub const SPAN_TEXT_BYTES_MAX: usize = 256;
/// Pending alarms a node remembers the traced setter of: past it a new
/// link takes the place of an arbitrary older one (whose alarm then runs
/// untraced).
pub const ALARM_TRACE_LINKS_MAX: usize = 100_000;

/// This node's key in a fetch's `tracestate`: its value is the id of the
/// span the fetch's own span hangs under.
const TRACESTATE_KEY: &str = "wasmkeep";

/// Takes this node's entries out of a `tracestate` header a guest set on
/// its own call: only the host names the parent of a span the dispatcher
/// records ([`call_of`]), so a tenant cannot place spans in any trace it
/// likes. Other vendors' entries stay.
pub(crate) fn scrub_guest_tracestate(headers: &mut Vec<(String, String)>) {
    for (k, v) in headers.iter_mut() {
        if k.eq_ignore_ascii_case("tracestate") {
            *v = v
                .split(',')
                .filter(|e| e.trim().split('=').next() != Some(TRACESTATE_KEY))
                .collect::<Vec<_>>()
                .join(",");
        }
    }
    headers.retain(|(k, v)| !(k.eq_ignore_ascii_case("tracestate") && v.trim().is_empty()));
}

/// The `fetch` or `send` span a row's headers name (see
/// [`EventTrace::call_headers`]): its context and its parent's id; `None`
/// for a call made outside a traced event (or whose headers the guest set
/// itself).
pub(crate) fn call_of(headers: &[(String, String)]) -> Option<(TraceContext, [u8; 8])> {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let ctx = TraceContext::parse(header("traceparent")?)?;
    let parent = header("tracestate")?
        .split(',')
        .filter_map(|entry| entry.trim().split_once('='))
        .find(|(k, _)| *k == TRACESTATE_KEY)
        .and_then(|(_, v)| hex_bytes::<8>(v))?;
    Some((ctx, parent))
}

/// A W3C trace context (`traceparent`): the trace, the span that is the
/// parent of what comes next, and whether the trace is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

impl TraceContext {
    /// Parses a `traceparent` header: `VERSION-TRACE-PARENT-FLAGS` in
    /// lowercase hex. Version `00` is exactly 55 characters; a later
    /// version may add fields after the flags (read as `00`). An all-zero
    /// trace or parent, version `ff`, or anything malformed is `None`.
    pub fn parse(header: &str) -> Option<TraceContext> {
        let h = header.trim();
        // Slicing below is by byte: anything but ASCII is no traceparent.
        if !h.is_ascii() {
            return None;
        }
        let bytes = h.as_bytes();
        if bytes.len() < 55 || (bytes.len() > 55 && bytes[55] != b'-') {
            return None;
        }
        let version = hex_bytes::<1>(&h[0..2])?;
        if version[0] == 0xff || (version[0] == 0 && bytes.len() != 55) {
            return None;
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let trace_id = hex_bytes::<16>(&h[3..35])?;
        let span_id = hex_bytes::<8>(&h[36..52])?;
        let flags = hex_bytes::<1>(&h[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id,
            sampled: flags[0] & 1 == 1,
        })
    }

    /// The `traceparent` header of this context (version `00`).
    pub fn header(&self) -> String {
        format!(
            "00-{}-{}-{}",
            hex::encode(self.trace_id),
            hex::encode(self.span_id),
            if self.sampled { "01" } else { "00" }
        )
    }

    /// A new sampled trace whose first span is `span_id`.
    pub fn new_trace() -> TraceContext {
        TraceContext {
            trace_id: random_id(),
            span_id: new_span_id(),
            sampled: true,
        }
    }

    /// The same trace with a new span: what a child span is.
    pub fn child(&self) -> TraceContext {
        TraceContext {
            span_id: new_span_id(),
            ..*self
        }
    }
}

/// `N` bytes from `2 * N` lowercase hex digits (uppercase is not W3C's).
fn hex_bytes<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || s.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

fn random_id<const N: usize>() -> [u8; N] {
    use rand::Rng as _;
    let mut out = [0u8; N];
    while out == [0u8; N] {
        rand::rng().fill_bytes(&mut out);
    }
    out
}

/// A new random, non-zero span id.
fn new_span_id() -> [u8; 8] {
    random_id()
}

/// What a span's caller was: OpenTelemetry's span kinds that occur here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// A request this node answered.
    Server,
    /// A request this node sent (a forward to another node).
    Client,
    /// A part of the work inside this node.
    Internal,
    /// An event the node started by itself (an alarm's run, a socket's
    /// message): the root of its own trace.
    Consumer,
}

impl SpanKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SpanKind::Server => "server",
            SpanKind::Client => "client",
            SpanKind::Internal => "internal",
            SpanKind::Consumer => "consumer",
        }
    }
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Str(String),
    Int(i64),
}

/// One finished span.
#[derive(Debug, Clone)]
pub struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_id: Option<[u8; 8]>,
    pub name: &'static str,
    pub kind: SpanKind,
    /// Wall-clock times, nanoseconds since the Unix epoch.
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub attributes: Vec<(&'static str, AttrValue)>,
    /// The error code when what the span covers failed.
    pub error: Option<String>,
    /// Spans this one follows from without being their child (an alarm's
    /// run links to the event that set it).
    pub links: Vec<TraceContext>,
}

impl Span {
    /// A span of `ctx` (its own id) under `parent`, over `start..end`.
    pub fn new(
        ctx: TraceContext,
        parent: Option<[u8; 8]>,
        name: &'static str,
        kind: SpanKind,
        (start, end): (Instant, Instant),
    ) -> Span {
        let (start_unix_ns, end_unix_ns) = unix_ns_of(start, end);
        Span {
            trace_id: ctx.trace_id,
            span_id: ctx.span_id,
            parent_id: parent,
            name,
            kind,
            start_unix_ns,
            end_unix_ns,
            attributes: Vec::new(),
            error: None,
            links: Vec::new(),
        }
    }

    /// Adds a text attribute, cut to [`SPAN_TEXT_BYTES_MAX`].
    pub fn text(mut self, key: &'static str, value: &str) -> Span {
        self.attributes
            .push((key, AttrValue::Str(clip(value).to_owned())));
        self
    }

    /// Adds a number attribute.
    pub fn int(mut self, key: &'static str, value: i64) -> Span {
        self.attributes.push((key, AttrValue::Int(value)));
        self
    }
}

/// `s` cut to at most [`SPAN_TEXT_BYTES_MAX`] bytes, on a character
/// boundary.
fn clip(s: &str) -> &str {
    if s.len() <= SPAN_TEXT_BYTES_MAX {
        return s;
    }
    let mut end = SPAN_TEXT_BYTES_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Two instants as wall-clock nanoseconds, against one reading of both
/// clocks taken once per process: spans keep the order and the lengths
/// their instants have, whatever the wall clock does later.
fn unix_ns_of(start: Instant, end: Instant) -> (u64, u64) {
    static ANCHOR: std::sync::OnceLock<(Instant, u64)> = std::sync::OnceLock::new();
    let (at_instant, at_wall) = *ANCHOR.get_or_init(|| {
        let wall = u64::try_from(crate::clock::wall_nanos()).unwrap_or(u64::MAX);
        (crate::clock::instant(), wall)
    });
    let at = |t: Instant| {
        let back =
            u64::try_from(at_instant.saturating_duration_since(t).as_nanos()).unwrap_or(u64::MAX);
        let ahead =
            u64::try_from(t.saturating_duration_since(at_instant).as_nanos()).unwrap_or(u64::MAX);
        at_wall.saturating_sub(back).saturating_add(ahead)
    };
    let (s, e) = (at(start), at(end));
    (s, e.max(s))
}

/// Receives every span recorded on the node (the server's exporter).
pub type SpanSink = Box<dyn Fn(&Arc<Span>) + Send + Sync>;

/// The node's recent spans, and where they go besides.
#[derive(Default)]
pub struct Traces {
    ring: Mutex<VecDeque<Arc<Span>>>,
    sink: std::sync::OnceLock<SpanSink>,
    spans_total: AtomicU64,
    /// The `guest` span of the traced event that set each actor's pending
    /// alarm, and the alarm's due time (a link is used only for the alarm
    /// it was made for). In memory only, as the ring is: after a restart
    /// the alarm runs untraced.
    alarm_links: Mutex<HashMap<ActorId, (u64, TraceContext)>>,
    /// How many links there are: a node that never traced an alarm takes
    /// no lock for them.
    alarm_links_len: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traces")
            .field("spans", &self.ring.lock().len())
            .finish()
    }
}

impl Traces {
    /// Keeps `span` (the oldest goes past [`TRACE_SPANS_MAX`]) and hands
    /// it to the sink.
    pub fn record(&self, span: Span) {
        self.record_all(vec![span]);
    }

    /// [`Traces::record`] for several spans, under one lock.
    fn record_all(&self, spans: Vec<Span>) {
        let spans: Vec<Arc<Span>> = spans.into_iter().map(Arc::new).collect();
        {
            let mut ring = self.ring.lock();
            for span in &spans {
                if ring.len() >= TRACE_SPANS_MAX {
                    ring.pop_front();
                }
                ring.push_back(Arc::clone(span));
            }
        }
        self.spans_total
            .fetch_add(spans.len() as u64, Ordering::Relaxed);
        if let Some(sink) = self.sink.get() {
            for span in &spans {
                sink(span);
            }
        }
    }

    /// Notes what set `id`'s alarm: its due time and the `guest` span of
    /// the traced event, or `None` (an untraced event, a clear, a run
    /// that left no alarm). Past [`ALARM_TRACE_LINKS_MAX`] a new link
    /// takes the place of an arbitrary older one.
    pub(crate) fn link_alarm(&self, id: &ActorId, link: Option<(u64, TraceContext)>) {
        if link.is_none() && self.alarm_links_len.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut links = self.alarm_links.lock();
        match link {
            Some(l) => {
                if links.len() >= ALARM_TRACE_LINKS_MAX
                    && !links.contains_key(id)
                    && let Some(old) = links.keys().next().cloned()
                {
                    links.remove(&old);
                }
                links.insert(id.clone(), l);
            }
            None => {
                links.remove(id);
            }
        }
        self.alarm_links_len.store(links.len(), Ordering::Relaxed);
    }

    /// `id`'s alarm link: the due time of the alarm it was made for, and
    /// the `guest` span of the traced event that set it.
    pub(crate) fn alarm_link(&self, id: &ActorId) -> Option<(u64, TraceContext)> {
        if self.alarm_links_len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.alarm_links.lock().get(id).copied()
    }

    /// Sets where every recorded span goes too (once); `false` if set.
    pub fn set_sink(&self, sink: SpanSink) -> bool {
        self.sink.set(sink).is_ok()
    }

    /// Spans recorded since start.
    pub fn spans_total(&self) -> u64 {
        self.spans_total.load(Ordering::Relaxed)
    }

    /// The kept spans of one trace, by start.
    pub fn of_trace(&self, trace_id: &[u8; 16]) -> Vec<Arc<Span>> {
        let mut out: Vec<_> = self
            .ring
            .lock()
            .iter()
            .filter(|s| &s.trace_id == trace_id)
            .cloned()
            .collect();
        out.sort_by_key(|s| s.start_unix_ns);
        out
    }

    /// The latest `limit` spans this node served or started (`Server`
    /// and `Consumer` kinds: requests, alarms' runs, sockets' messages),
    /// newest first, optionally only those whose `wasmkeep.actor` attribute starts
    /// with `actor_prefix`.
    pub fn recent_requests(&self, limit: usize, actor_prefix: Option<&str>) -> Vec<Arc<Span>> {
        self.ring
            .lock()
            .iter()
            .rev()
            .filter(|s| matches!(s.kind, SpanKind::Server | SpanKind::Consumer))
            .filter(|s| {
                actor_prefix.is_none_or(|p| {
                    s.attributes.iter().any(|(k, v)| {
                        *k == "wasmkeep.actor" && matches!(v, AttrValue::Str(a) if a.starts_with(p))
                    })
                })
            })
            .take(limit)
            .cloned()
            .collect()
    }
}

/// What a traced event went through, noted by the batch as it runs and
/// turned into spans when its reply is released ([`EventTrace::finish`]).
#[derive(Debug)]
pub struct EventTrace {
    /// The request's span: the parent of the event's spans.
    parent: TraceContext,
    /// An event no request started: `parent` is its own root span, of
    /// this name, recorded with the others, linked to the span that
    /// caused the event.
    root: Option<(&'static str, Option<TraceContext>)>,
    /// The `guest` span's id, known before the span ends: a fetch the
    /// handler makes names it as its parent.
    guest_id: [u8; 8],
    marks: Mutex<Marks>,
}

#[derive(Debug, Default)]
struct Marks {
    guest: Option<(Instant, Instant)>,
    commit: Option<(Instant, Instant)>,
    sql: Vec<(String, Instant, Instant)>,
    sql_statements: u32,
    /// The actor that ran it (`tenant/app/class/name`).
    actor: String,
    error: Option<String>,
    rolled_back: bool,
}

impl EventTrace {
    /// The trace of an event whose spans go under `parent` (the request's
    /// span).
    pub fn new(parent: TraceContext) -> Arc<EventTrace> {
        Arc::new(EventTrace {
            parent,
            root: None,
            guest_id: new_span_id(),
            marks: Mutex::new(Marks::default()),
        })
    }

    /// The headers an outbox row the handler writes carries (ADR 0064): a
    /// `traceparent` naming the `fetch` or `send` span the dispatcher
    /// records when the call is answered, and a `tracestate` entry naming
    /// its parent (the `guest` span), which is how the dispatcher knows it.
    pub(crate) fn call_headers(&self) -> [(String, String); 2] {
        let call = self.parent.child();
        [
            ("traceparent".to_owned(), call.header()),
            (
                "tracestate".to_owned(),
                format!("{TRACESTATE_KEY}={}", hex::encode(self.guest_id)),
            ),
        ]
    }

    /// The trace of an event no request started (an alarm's run, a
    /// socket's message): a new trace whose root span `name` covers the
    /// event, linked to `link`.
    pub fn root(name: &'static str, link: Option<TraceContext>) -> Arc<EventTrace> {
        Arc::new(EventTrace {
            parent: TraceContext::new_trace(),
            root: Some((name, link)),
            guest_id: new_span_id(),
            marks: Mutex::new(Marks::default()),
        })
    }

    /// The request span's context.
    pub fn parent(&self) -> TraceContext {
        self.parent
    }

    /// The `guest` span's context: what an alarm this event sets links to.
    pub(crate) fn guest_context(&self) -> TraceContext {
        TraceContext {
            span_id: self.guest_id,
            ..self.parent
        }
    }

    pub(crate) fn guest(
        &self,
        (started, ended): (Instant, Instant),
        actor: String,
        error: Option<String>,
    ) {
        let mut m = self.marks.lock();
        m.guest = Some((started, ended));
        m.actor = actor;
        m.error = error;
    }

    pub(crate) fn commit(&self, started: Instant, ended: Instant) {
        let mut m = self.marks.lock();
        if !m.rolled_back {
            m.commit = Some((started, ended));
        }
    }

    /// The event's transaction was dropped after its handler ran: it
    /// failed with `code`, and a later commit is not its own.
    pub(crate) fn rolled_back(&self, code: &str) {
        let mut m = self.marks.lock();
        m.rolled_back = true;
        m.commit = None;
        m.error.get_or_insert_with(|| code.to_owned());
    }

    /// One statement the handler ran.
    pub(crate) fn sql(&self, text: &str, started: Instant, ended: Instant) {
        let mut m = self.marks.lock();
        m.sql_statements = m.sql_statements.saturating_add(1);
        if m.sql.len() < TRACE_SQL_SPANS_MAX {
            m.sql.push((clip(text).to_owned(), started, ended));
        }
    }

    /// Records the event's spans in `traces`: it was queued at `queued`
    /// and its reply is released now.
    pub(crate) fn finish(&self, traces: &Traces, queued: Instant) {
        let now = crate::clock::instant();
        let m = std::mem::take(&mut *self.marks.lock());
        if let Some((name, link)) = self.root {
            let mut root = Span::new(self.parent, None, name, SpanKind::Consumer, (queued, now))
                .text("wasmkeep.actor", &m.actor);
            root.error.clone_from(&m.error);
            root.links.extend(link);
            traces.record(root);
        }
        let parent = Some(self.parent.span_id);
        let span =
            |name, range| Span::new(self.parent.child(), parent, name, SpanKind::Internal, range);
        let Some((guest_start, guest_end)) = m.guest else {
            // The event never ran its handler (refused, or its batch
            // failed before it): only its time in the queue is known.
            traces.record(span("queue", (queued, now)));
            return;
        };
        let mut spans = Vec::with_capacity(4 + m.sql.len());
        spans.push(span("queue", (queued, guest_start)));
        let mut guest = Span::new(
            self.guest_context(),
            parent,
            "guest",
            SpanKind::Internal,
            (guest_start, guest_end),
        )
        .int("wasmkeep.sql.statements", i64::from(m.sql_statements))
        .text("wasmkeep.actor", &m.actor);
        guest.error = m.error;
        spans.push(guest);
        for (text, s, e) in m.sql {
            spans.push(
                Span::new(
                    self.parent.child(),
                    Some(self.guest_id),
                    "sql",
                    SpanKind::Internal,
                    (s, e),
                )
                .text("db.query.text", &text),
            );
        }
        if let Some((s, e)) = m.commit {
            spans.push(span("commit", (s, e)));
            spans.push(span("durable", (e, now)));
        }
        traces.record_all(spans);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_refuses_what_w3c_refuses() {
        let h = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = TraceContext::parse(h).unwrap();
        assert!(c.sampled);
        assert_eq!(c.header(), h);
        let unsampled =
            TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
        assert!(!unsampled.unwrap().sampled);
        // A later version with more fields is read as version 00.
        assert!(TraceContext::parse(&format!("01-{}-extra", &h[3..])).is_some());
        // Not ASCII: refused, never sliced inside a character.
        assert_eq!(TraceContext::parse(&format!("0é{}", "0".repeat(52))), None);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_guest_cannot_name_the_parent_of_a_span_the_node_records() {
        let ctx = TraceContext::new_trace();
        let mut headers = vec![
            ("traceparent".to_owned(), ctx.header()),
            (
                "tracestate".to_owned(),
                "wasmkeep=00f067aa0ba902b7,other=1".to_owned(),
            ),
        ];
        assert!(
            call_of(&headers).is_some(),
            "the forged pair would be believed"
        );
        scrub_guest_tracestate(&mut headers);
        assert_eq!(call_of(&headers), None);
        assert_eq!(headers[1].1, "other=1");
        let mut only_ours = vec![(
            "TraceState".to_owned(),
            "wasmkeep=00f067aa0ba902b7".to_owned(),
        )];
        scrub_guest_tracestate(&mut only_ours);
        assert!(only_ours.is_empty());
    }

    #[test]
    fn alarm_links_are_kept_within_their_bound() {
        let t = Traces::default();
        let a = ActorId::new("t", "a", "c", "x").unwrap();
        let by = TraceContext::new_trace();
        // No link: nothing to look up, and no lock taken for a clear.
        t.link_alarm(&a, None);
        assert_eq!(t.alarm_link(&a), None);
        t.link_alarm(&a, Some((100, by)));
        assert_eq!(t.alarm_link(&a), Some((100, by)));
        t.link_alarm(&a, None);
        assert_eq!(t.alarm_link(&a), None);
        // Past the bound a new link replaces an older one.
        for i in 0..ALARM_TRACE_LINKS_MAX + 10 {
            let id = ActorId::new("t", "a", "c", &format!("n{i}")).unwrap();
            t.link_alarm(&id, Some((1, by)));
        }
        assert_eq!(t.alarm_links.lock().len(), ALARM_TRACE_LINKS_MAX);
        let last = ActorId::new("t", "a", "c", &format!("n{}", ALARM_TRACE_LINKS_MAX + 9)).unwrap();
        assert_eq!(t.alarm_link(&last), Some((1, by)));
    }

    #[test]
    fn the_ring_keeps_the_newest_spans() {
        let t = Traces::default();
        let now = crate::clock::instant();
        let ctx = TraceContext::new_trace();
        for _ in 0..TRACE_SPANS_MAX + 3 {
            t.record(Span::new(
                ctx.child(),
                None,
                "request",
                SpanKind::Server,
                (now, now),
            ));
        }
        assert_eq!(t.of_trace(&ctx.trace_id).len(), TRACE_SPANS_MAX);
        assert_eq!(t.spans_total(), TRACE_SPANS_MAX as u64 + 3);
        assert_eq!(t.recent_requests(5, None).len(), 5);
    }

    #[test]
    fn an_event_trace_makes_its_spans_under_the_request() {
        let t = Traces::default();
        let req = TraceContext::new_trace();
        let e = EventTrace::new(req);
        let t0 = crate::clock::instant();
        let t1 = t0 + std::time::Duration::from_millis(2);
        let t2 = t1 + std::time::Duration::from_millis(3);
        e.sql("SELECT 1", t1, t1);
        e.guest((t1, t2), "t/a/c/n".into(), None);
        e.commit(t2, t2);
        e.finish(&t, t0);
        let spans = t.of_trace(&req.trace_id);
        let names: Vec<_> = spans.iter().map(|s| s.name).collect();
        for n in ["queue", "guest", "sql", "commit", "durable"] {
            assert!(names.contains(&n), "{names:?}");
        }
        let guest = spans.iter().find(|s| s.name == "guest").unwrap();
        let sql = spans.iter().find(|s| s.name == "sql").unwrap();
        assert_eq!(sql.parent_id, Some(guest.span_id));
        assert_eq!(guest.parent_id, Some(req.span_id));
        assert_eq!(guest.end_unix_ns - guest.start_unix_ns, 3_000_000);
    }
}
