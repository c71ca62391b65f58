//! Traces at the edge (issue 39, ADR 0064): which actor requests are
//! traced, the spans this node adds (the request it served, a forward to
//! the actor's owner), and the export of every span the node records over
//! OTLP/HTTP with OpenTelemetry's own exporter.
//!
//! - A request whose `traceparent` is sampled is traced (the caller
//!   decided); one without a `traceparent` starts a trace with probability
//!   `trace_sample_pct`; one whose `traceparent` is not sampled is not.
//! - Forwarding to an owner sends a `traceparent` naming this node's
//!   `forward` span, so the owner's spans hang under it.
//! - A traced request's answer carries `traceresponse` (W3C Trace Context
//!   Level 2): its trace and this node's span, for the console's lookup.
//! - Spans go to the runtime's ring ([`wasmkeep_runtime::trace::Traces`]),
//!   and from there, with `otlp_endpoint` set, into a queue of at most
//!   [`OTLP_QUEUE_SPANS_MAX`] an exporting task sends in batches of
//!   [`OTLP_BATCH_SPANS_MAX`] at least every [`OTLP_BATCH_MS`]; spans that
//!   find the queue full are counted and dropped, never waited for.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use axum::http::HeaderMap;
use opentelemetry::trace::{SpanContext, SpanId, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use tokio::sync::mpsc;
use wasmkeep_runtime::Runtime;
use wasmkeep_runtime::trace::{AttrValue, Span, SpanKind, TraceContext};

/// Spans waiting for the exporter; past it new spans are dropped (and
/// counted).
pub const OTLP_QUEUE_SPANS_MAX: usize = 8_192;
/// Spans in one export.
pub const OTLP_BATCH_SPANS_MAX: usize = 512;
/// How long a span waits for its batch to fill.
pub const OTLP_BATCH_MS: u64 = 1_000;
/// One export's time limit.
pub const OTLP_TIMEOUT_MS: u64 = 10_000;

/// The W3C header a traced request's answer carries.
pub const TRACERESPONSE_HEADER: &str = "traceresponse";

/// A traced request at this node: its span here, and the caller's span
/// (another node's forward, or the client's) if it named one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Traced {
    pub server: TraceContext,
    pub parent: Option<[u8; 8]>,
}

/// Traces a node follows per second because a client asked (a sampled
/// `traceparent` on a request that no node forwarded); past it such a
/// request is served untraced, so that clients cannot make a node trace
/// everything.
pub const TRACES_FOLLOWED_PER_S_MAX: u64 = 1_000;

/// Who sent a request, as far as tracing cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// A client the tenant's token (or the admin's) let in.
    Client,
    /// Another node of the cluster, forwarding (its signature is checked
    /// before anything runs): it already decided.
    Node,
    /// Anyone else: never traced.
    Refused,
}

/// The count of client-asked traces this second.
#[derive(Debug, Default)]
pub(crate) struct FollowCap {
    second: AtomicU64,
    count: AtomicU64,
}

impl FollowCap {
    fn admit(&self) -> bool {
        let now = crate::cluster::now_ms() / 1000;
        if self.second.swap(now, Ordering::Relaxed) != now {
            self.count.store(0, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed) < TRACES_FOLLOWED_PER_S_MAX
    }
}

/// Whether the request with `headers` from `caller` is traced here, and
/// how: a sampled `traceparent` is followed (a client's within
/// [`TRACES_FOLLOWED_PER_S_MAX`]); a client's request without one starts
/// a trace at `sample_pct`; a forwarded request is never sampled again
/// (the first node decided); several `traceparent` headers are none.
pub(crate) fn decide(
    headers: &HeaderMap,
    sample_pct: u8,
    caller: impl FnOnce() -> Caller,
    cap: &FollowCap,
) -> Option<Traced> {
    // Most requests: nothing to follow and nothing to sample, so the
    // caller is not looked up (its token would be hashed twice).
    if sample_pct == 0 && !headers.contains_key("traceparent") {
        return None;
    }
    let caller = caller();
    if caller == Caller::Refused {
        return None;
    }
    let mut all = headers.get_all("traceparent").iter();
    let incoming = match (all.next(), all.next()) {
        (Some(v), None) => v.to_str().ok().and_then(TraceContext::parse),
        _ => None,
    };
    match incoming {
        Some(c) if c.sampled && (caller == Caller::Node || cap.admit()) => Some(Traced {
            server: c.child(),
            parent: Some(c.span_id),
        }),
        Some(_) => None,
        None if caller == Caller::Client && sampled(sample_pct) => Some(Traced {
            server: TraceContext::new_trace(),
            parent: None,
        }),
        None => None,
    }
}

/// True with probability `pct` percent.
pub(crate) fn sampled(pct: u8) -> bool {
    if pct == 0 {
        return false;
    }
    if pct >= 100 {
        return true;
    }
    let mut b = [0u8; 2];
    getrandom::fill(&mut b).is_ok() && u16::from_le_bytes(b) % 100 < u16::from(pct)
}

/// What the exporter counted, for `/metrics` and the traces route.
#[derive(Debug, Default)]
pub struct ExportCounters {
    pub exported: AtomicU64,
    pub dropped: AtomicU64,
    pub failed_batches: AtomicU64,
}

/// Starts exporting every span the node records to the OTLP/HTTP
/// collector at `endpoint` (`http://HOST:PORT`, with `/v1/traces`
/// appended unless it ends so), as the service `wasmkeep` with the node's
/// name. Needs a tokio runtime.
pub(crate) fn start_export(
    rt: &Runtime,
    endpoint: &str,
    node: &str,
) -> Result<Arc<ExportCounters>, String> {
    let endpoint = if endpoint.trim_end_matches('/').ends_with("/v1/traces") {
        endpoint.to_owned()
    } else {
        format!("{}/v1/traces", endpoint.trim_end_matches('/'))
    };
    let client = opentelemetry_http::hyper::HyperClient::with_default_connector(
        Duration::from_millis(OTLP_TIMEOUT_MS),
        None,
    );
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(endpoint.clone())
        .with_timeout(Duration::from_millis(OTLP_TIMEOUT_MS))
        .build()
        .map_err(|e| format!("otlp_endpoint={endpoint}: {e}"))?;
    exporter.set_resource(
        &Resource::builder_empty()
            .with_service_name("wasmkeep")
            .with_attribute(KeyValue::new("service.instance.id", node.to_owned()))
            .build(),
    );
    let counters = Arc::new(ExportCounters::default());
    let (tx, mut rx) = mpsc::channel::<Arc<Span>>(OTLP_QUEUE_SPANS_MAX);
    let dropped = Arc::clone(&counters);
    let sink_set = rt.traces().set_sink(Box::new(move |span| {
        if tx.try_send(Arc::clone(span)).is_err() {
            dropped.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }));
    if !sink_set {
        return Err("spans already go to an exporter".into());
    }
    let task_counters = Arc::clone(&counters);
    let rt = rt.clone();
    tokio::spawn(async move {
        let mut batch = Vec::with_capacity(OTLP_BATCH_SPANS_MAX);
        loop {
            let wait = tokio::time::sleep(Duration::from_millis(OTLP_BATCH_MS));
            tokio::pin!(wait);
            // Fill a batch until it is full or its time is up.
            loop {
                tokio::select! {
                    span = rx.recv() => match span {
                        Some(s) => {
                            batch.push(span_data(&s));
                            if batch.len() >= OTLP_BATCH_SPANS_MAX {
                                break;
                            }
                        }
                        None => return,
                    },
                    () = &mut wait => break,
                }
            }
            if !batch.is_empty() {
                let n = batch.len() as u64;
                match exporter.export(std::mem::take(&mut batch)).await {
                    Ok(()) => task_counters.exported.fetch_add(n, Ordering::Relaxed),
                    Err(e) => {
                        tracing::debug!(error = %e, spans = n, "an OTLP export failed; its spans are dropped");
                        task_counters.failed_batches.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
            if rt.is_stopping() {
                return;
            }
        }
    });
    Ok(counters)
}

/// A ring span as OpenTelemetry's.
fn span_data(s: &Span) -> SpanData {
    let time = |ns: u64| UNIX_EPOCH + Duration::from_nanos(ns);
    let attributes = s
        .attributes
        .iter()
        .map(|(k, v)| match v {
            AttrValue::Str(v) => KeyValue::new(*k, v.clone()),
            AttrValue::Int(v) => KeyValue::new(*k, *v),
        })
        .collect();
    // The struct cannot be written out (it is non-exhaustive).
    let mut links = SpanLinks::default();
    links.links = s
        .links
        .iter()
        .map(|c| {
            opentelemetry::trace::Link::with_context(SpanContext::new(
                TraceId::from_bytes(c.trace_id),
                SpanId::from_bytes(c.span_id),
                TraceFlags::SAMPLED,
                true,
                TraceState::default(),
            ))
        })
        .collect();
    SpanData {
        span_context: SpanContext::new(
            TraceId::from_bytes(s.trace_id),
            SpanId::from_bytes(s.span_id),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: s.parent_id.map_or(SpanId::INVALID, SpanId::from_bytes),
        parent_span_is_remote: false,
        span_kind: match s.kind {
            SpanKind::Server => opentelemetry::trace::SpanKind::Server,
            SpanKind::Client => opentelemetry::trace::SpanKind::Client,
            SpanKind::Internal => opentelemetry::trace::SpanKind::Internal,
            SpanKind::Consumer => opentelemetry::trace::SpanKind::Consumer,
        },
        name: Cow::Borrowed(s.name),
        start_time: time(s.start_unix_ns),
        end_time: time(s.end_unix_ns),
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links,
        status: match &s.error {
            Some(code) => Status::error(code.clone()),
            None => Status::Unset,
        },
        instrumentation_scope: InstrumentationScope::builder("wasmkeep").build(),
    }
}

/// A span as the admin API shows it.
pub(crate) fn span_json(s: &Span) -> serde_json::Value {
    let mut attrs = serde_json::Map::new();
    for (k, v) in &s.attributes {
        let v = match v {
            AttrValue::Str(v) => serde_json::json!(v),
            AttrValue::Int(v) => serde_json::json!(v),
        };
        attrs.insert((*k).to_owned(), v);
    }
    serde_json::json!({
        "trace_id": hex::encode(s.trace_id),
        "span_id": hex::encode(s.span_id),
        "parent_id": s.parent_id.map(hex::encode),
        "name": s.name,
        "kind": s.kind.as_str(),
        "start_unix_ns": s.start_unix_ns,
        "end_unix_ns": s.end_unix_ns,
        "duration_us": (s.end_unix_ns.saturating_sub(s.start_unix_ns)) / 1000,
        "attributes": attrs,
        "error": s.error,
        "links": s.links.iter().map(|c| serde_json::json!({
            "trace_id": hex::encode(c.trace_id),
            "span_id": hex::encode(c.span_id),
        })).collect::<Vec<_>>(),
    })
}
