//! The durable outbox (ADR 0040): what a guest sends, and how the node
//! delivers it.
//!
//! A guest's `outbox.send` and `outbox.fetch` only write a row in the
//! actor's `_wasmkeep_outbox`, inside the event's savepoint: the row
//! commits with the event or vanishes with it (a failed event, an alarm
//! rehearsal). After the batch commits, and is durable (with a bucket: in
//! the bucket), the turn hands the committed rows to the node's
//! [`Dispatcher`], which delivers them off the workers: a message becomes a
//! `Message` event of its receiver, an HTTP call goes out through the app's
//! policy. The answer, or the final failure, comes back as a `Response`
//! event of the sender, whose transaction deletes the row and runs
//! `on-response`, so an answer is applied once: a second one finds no row.
//!
//! A receiver keeps the last message it applied from each sender, with its
//! answer (`_wasmkeep_inbox`), and answers a repeated delivery from there
//! without running its handler: messages to one receiver go one at a time,
//! in order, so the last one is the only one that can come again.
//!
//! No worker ever waits for the network, and no turn waits for another
//! actor: a cycle (A sends to B, which sends to A) is only more events.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

use wasmkeep_store::{ActorId, OutboxKind, OutboxRow};

pub use crate::config::OutboxLimits;
use crate::error::RuntimeError;
use crate::host::HostState;
use crate::host::WitError;
use crate::host::wasmkeep::actor::outbox;
use crate::host::wasmkeep::actor::types::Address;

/// What one app may reach over HTTP: its manifest's `[outbound]`, within
/// the node's ceilings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OutboundPolicy {
    /// `host` or `host:port`, lower-case; empty: nothing.
    pub hosts: Vec<String>,
    pub timeout_ms: u64,
    pub response_bytes_max: usize,
    pub per_actor_max: usize,
    pub per_app_max: usize,
    /// Loopback, private and link-local addresses may be reached (the
    /// node's `outbound_private_allowed`; tests).
    pub private_allowed: bool,
}

/// HTTP methods a guest may use.
const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];
/// Headers a guest may not set: the node sets them, or they would let a
/// guest smuggle a second request.
const HEADERS_RESERVED: [&str; 8] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "idempotency-key",
];
/// Headers of one call, and their bytes together.
pub(crate) const HTTP_HEADERS_MAX: usize = 64;
pub(crate) const HTTP_HEADER_BYTES_MAX: usize = 16 * 1024;
/// Longest URL.
pub(crate) const URL_BYTES_MAX: usize = 4096;

pub(crate) fn refusal(code: &str, message: impl Into<String>) -> WitError {
    WitError {
        code: code.into(),
        message: message.into(),
    }
}

/// `app/class/name`, as an outbox row's target names a receiver.
pub(crate) fn encode_target(app: &str, class: &str, name: &str) -> String {
    format!("{app}/{class}/{name}")
}

/// The receiver a message row names, in the sender's tenant.
pub(crate) fn decode_target(tenant: &str, target: &str) -> Option<ActorId> {
    let (app, rest) = target.split_once('/')?;
    let (class, name) = rest.split_once('/')?;
    ActorId::new(tenant, app, class, name).ok()
}

/// The host and port of an `http://` or `https://` URL, checked against
/// the policy's hosts. The URL's own syntax is checked here too, so that a
/// row in the outbox always parses.
pub(crate) fn check_url(url: &str, policy: &OutboundPolicy) -> Result<(), WitError> {
    if url.len() > URL_BYTES_MAX {
        return Err(refusal(
            "invalid_argument",
            format!(
                "url too long: size={} limit url_bytes_max={URL_BYTES_MAX}",
                url.len()
            ),
        ));
    }
    let parsed = parse_url(url).map_err(|m| refusal("invalid_url", m))?;
    if !policy.allows(&parsed.host, parsed.port) {
        return Err(refusal(
            "host_not_allowed",
            format!(
                "host {}:{} is not in this app's [outbound] hosts (nothing is allowed by default)",
                parsed.host, parsed.port
            ),
        ));
    }
    Ok(())
}

impl OutboundPolicy {
    /// Whether `host:port` is on the allow-list: an entry `host` allows
    /// the host on any port, `host:port` that port only.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        let host = host.to_ascii_lowercase();
        let with_port = format!("{host}:{port}");
        self.hosts.iter().any(|h| *h == host || *h == with_port)
    }
}

fn check_headers(headers: &[(String, String)]) -> Result<(), WitError> {
    if headers.len() > HTTP_HEADERS_MAX {
        return Err(refusal(
            "invalid_argument",
            format!(
                "too many headers: count={} limit http_headers_max={HTTP_HEADERS_MAX}",
                headers.len()
            ),
        ));
    }
    let bytes: usize = headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > HTTP_HEADER_BYTES_MAX {
        return Err(refusal(
            "invalid_argument",
            format!(
                "headers too large: size={bytes} limit http_header_bytes_max={HTTP_HEADER_BYTES_MAX}"
            ),
        ));
    }
    for (k, v) in headers {
        let name_ok = !k.is_empty()
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !name_ok || v.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(refusal(
                "invalid_argument",
                format!("invalid header `{}`", k.escape_debug()),
            ));
        }
        if HEADERS_RESERVED.contains(&k.to_ascii_lowercase().as_str()) {
            return Err(refusal(
                "invalid_argument",
                format!("header `{k}` is set by the node"),
            ));
        }
    }
    Ok(())
}

impl HostState {
    fn check_sizes(&self, body: usize, context: usize) -> Result<&OutboxLimits, WitError> {
        let limits = &self.outbox.limits;
        if body > limits.body_bytes_max {
            return Err(refusal(
                "value_too_large",
                format!(
                    "message body too large: size={body} limit outbox_body_bytes_max={}",
                    limits.body_bytes_max
                ),
            ));
        }
        if context > limits.context_bytes_max {
            return Err(refusal(
                "value_too_large",
                format!(
                    "context too large: size={context} limit outbox_context_bytes_max={}",
                    limits.context_bytes_max
                ),
            ));
        }
        Ok(limits)
    }

    pub(crate) fn push(&mut self, row: OutboxRow) -> Result<u64, WitError> {
        let pending_max = self.outbox.limits.pending_max;
        let db = self.db.as_mut().ok_or_else(|| {
            refusal(
                "invalid_argument",
                "no database while the app is being deployed",
            )
        })?;
        let seq = db
            .outbox_push(&row, pending_max)
            .map_err(|e| refusal(e.code(), e.to_string()))?;
        self.outbox_sent = true;
        if let Some(early) = self.sent_before_commit.as_mut() {
            early.push(OutboxRow { seq, ..row });
        }
        Ok(seq)
    }
}

impl outbox::Host for HostState {
    fn send(&mut self, to: Address, body: Vec<u8>, context: Vec<u8>) -> Result<u64, WitError> {
        let row = self.message_row(to, body, context)?;
        self.push(row)
    }

    fn fetch(&mut self, call: outbox::HttpCall, context: Vec<u8>) -> Result<u64, WitError> {
        let row = self.fetch_row(call, context)?;
        self.push(row)
    }
}

impl HostState {
    /// The outbox row of a message to `to`, checked as `outbox.send`
    /// checks it (also for an awaited call, ADR 0056).
    pub(crate) fn message_row(
        &self,
        to: Address,
        body: Vec<u8>,
        context: Vec<u8>,
    ) -> Result<OutboxRow, WitError> {
        self.check_sizes(body.len(), context.len())?;
        ActorId::new(&self.id.tenant, &to.app, &to.class, &to.name)
            .map_err(|e| refusal("invalid_name", e.to_string()))?;
        // A traced event's message carries its trace on (ADR 0064).
        let headers = self
            .trace
            .as_ref()
            .map(|t| t.call_headers().to_vec())
            .unwrap_or_default();
        let row = OutboxRow {
            seq: 0,
            kind: OutboxKind::Message,
            target: encode_target(&to.app, &to.class, &to.name),
            method: String::new(),
            headers,
            body,
            context,
            timeout_ms: 0,
            created_ms: self.clock.now_ms(),
        };
        Ok(row)
    }

    /// The outbox row of an HTTP call, checked as `outbox.fetch` checks it.
    pub(crate) fn fetch_row(
        &self,
        call: outbox::HttpCall,
        context: Vec<u8>,
    ) -> Result<OutboxRow, WitError> {
        self.check_sizes(call.body.len(), context.len())?;
        let policy = Arc::clone(&self.outbox.policy);
        if !METHODS.contains(&call.method.as_str()) {
            return Err(refusal(
                "invalid_argument",
                format!(
                    "method `{}` is not one of {METHODS:?}",
                    call.method.escape_debug()
                ),
            ));
        }
        check_url(&call.url, &policy)?;
        check_headers(&call.headers)?;
        let timeout_ms = match call.timeout_ms {
            Some(t) if u64::from(t) > policy.timeout_ms => {
                return Err(refusal(
                    "invalid_argument",
                    format!(
                        "timeout too long: timeout_ms={t} limit outbound timeout_ms={}",
                        policy.timeout_ms
                    ),
                ));
            }
            Some(0) => return Err(refusal("invalid_argument", "timeout_ms must be above 0")),
            Some(t) => t,
            None => policy.timeout_ms as u32,
        };
        let mut headers = call.headers;
        // Only the host names the parent of the span recorded for a call.
        crate::trace::scrub_guest_tracestate(&mut headers);
        // A traced event's call carries its trace on (ADR 0064), unless the
        // guest named one itself.
        if let Some(t) = &self.trace
            && !headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("traceparent"))
        {
            headers.extend(t.call_headers());
        }
        let row = OutboxRow {
            seq: 0,
            kind: OutboxKind::Http,
            target: call.url,
            method: call.method,
            headers,
            body: call.body,
            context,
            timeout_ms,
            created_ms: self.clock.now_ms(),
        };
        Ok(row)
    }
}

/// What an instance's `outbox` imports check against.
#[derive(Debug, Clone, Default)]
pub struct OutboxSettings {
    pub limits: OutboxLimits,
    pub policy: Arc<OutboundPolicy>,
}

/// A URL's parts the policy looks at.
#[derive(Debug)]
pub(crate) struct ParsedUrl {
    pub host: String,
    pub port: u16,
    pub ip: Option<IpAddr>,
}

/// Parses an `http://` or `https://` URL a guest gave (no credentials, a
/// host), for the policy's check here and the dispatcher's before each
/// attempt.
pub(crate) fn parse_url(url: &str) -> Result<ParsedUrl, String> {
    let u = reqwest::Url::parse(url).map_err(|e| format!("invalid url: {e}"))?;
    if u.scheme() != "http" && u.scheme() != "https" {
        return Err(format!(
            "invalid url: scheme `{}` (only http and https)",
            u.scheme()
        ));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err("invalid url: credentials in the URL are refused (use a header)".into());
    }
    let Some(host) = u.host_str().filter(|h| !h.is_empty()) else {
        return Err("invalid url: no host".into());
    };
    let host = host
        .to_ascii_lowercase()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let ip = host.parse::<IpAddr>().ok();
    Ok(ParsedUrl {
        host,
        port: u.port_or_known_default().unwrap_or(80),
        ip,
    })
}

/// What the receiver of a message answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageAnswer {
    /// `on-message` returned `ok` with this body.
    Reply(Vec<u8>),
    /// `on-message` returned `err` (or failed in a way that would fail
    /// again): its event rolled back.
    Refused { code: String, message: String },
}

/// What a sender hears about one of its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Message(MessageAnswer),
    Http {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    Failed {
        code: String,
        message: String,
    },
}

impl Answer {
    pub(crate) fn bytes(&self) -> u64 {
        match self {
            Answer::Message(MessageAnswer::Reply(b)) => b.len() as u64,
            Answer::Http { headers, body, .. } => {
                (body.len()
                    + headers
                        .iter()
                        .map(|(k, v)| k.len() + v.len())
                        .sum::<usize>()) as u64
            }
            Answer::Message(MessageAnswer::Refused { message, .. })
            | Answer::Failed { message, .. } => message.len() as u64,
        }
    }
}

/// An event the dispatcher brings to an actor.
#[derive(Debug, Clone)]
pub enum Inbound {
    /// A message from `from` (its `life` and `seq`: what the receiver keys
    /// repeats by).
    Message {
        from: ActorId,
        life: u64,
        seq: u64,
        body: Vec<u8>,
        /// The sender's `send` span when the event that sent it was
        /// traced (ADR 0064): the receiver's spans go under it.
        trace: Option<crate::trace::TraceContext>,
        /// The actors waiting on this message's answer, when its sender
        /// waits for it (ADR 0056): what finds a cycle of waits.
        chain: Vec<String>,
    },
    /// The answer to the receiver's own row `seq` of its outbox's `life`.
    /// With `discard`, the row is deleted without running `on-response`
    /// (it kept failing).
    Response {
        life: u64,
        seq: u64,
        answer: Answer,
        attempts: u32,
        discard: bool,
        /// The call's `send` or `fetch` span when the event that made it
        /// was traced: the answer's spans go under it.
        trace: Option<crate::trace::TraceContext>,
    },
}

/// The future a [`Router`] returns.
pub type Routed = Pin<Box<dyn Future<Output = Result<Option<MessageAnswer>, RuntimeError>> + Send>>;

/// Takes an inbound event to whichever node holds its actor (a cluster).
/// Without one, every actor is this node's.
pub trait Router: Send + Sync {
    /// Delivers `ev` to `to` and returns what its event answered (`Some`
    /// for a message).
    fn deliver(&self, to: ActorId, ev: Inbound) -> Routed;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(hosts: &[&str]) -> OutboundPolicy {
        OutboundPolicy {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            timeout_ms: 1000,
            ..Default::default()
        }
    }

    #[test]
    fn only_listed_hosts_are_allowed_and_a_port_narrows_an_entry() {
        let p = policy(&["api.example.com", "127.0.0.1:8080"]);
        assert!(check_url("https://api.example.com/x", &p).is_ok());
        assert!(check_url("http://API.example.com:9/x", &p).is_ok());
        assert!(check_url("http://127.0.0.1:8080/", &p).is_ok());
        let e = check_url("http://127.0.0.1:8081/", &p).unwrap_err();
        assert_eq!(e.code, "host_not_allowed");
        assert_eq!(
            check_url("http://evil.example.com/", &p).unwrap_err().code,
            "host_not_allowed"
        );
        assert_eq!(
            check_url("http://x/", &policy(&[])).unwrap_err().code,
            "host_not_allowed",
            "nothing by default"
        );
        assert_eq!(check_url("ftp://x/", &p).unwrap_err().code, "invalid_url");
        assert_eq!(
            check_url("http://user@api.example.com/", &p)
                .unwrap_err()
                .code,
            "invalid_url"
        );
    }

    #[test]
    fn reserved_and_malformed_headers_are_refused() {
        assert!(check_headers(&[("x-a".into(), "1".into())]).is_ok());
        for (k, v) in [
            ("host", "a"),
            ("Idempotency-Key", "x"),
            ("x", "a\r\nb"),
            ("a b", "c"),
        ] {
            assert_eq!(
                check_headers(&[(k.into(), v.into())]).unwrap_err().code,
                "invalid_argument",
                "{k}"
            );
        }
    }

    #[test]
    fn targets_round_trip_and_names_keep_their_slashes() {
        let t = encode_target("app", "class", "a/b c");
        let id = decode_target("t", &t).unwrap();
        assert_eq!(
            (id.app.as_str(), id.class.as_str(), id.name.as_str()),
            ("app", "class", "a/b c")
        );
        assert!(decode_target("t", "nope").is_none());
    }
}
