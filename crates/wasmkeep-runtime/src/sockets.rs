//! WebSockets (ADR 0043): the node's table of open sockets, apart from the
//! actors' instances.
//!
//! An actor accepts a socket in `on-request` (`sockets.accept`); once that
//! event's batch is durable the socket is registered here with its tags,
//! its attachment and a channel, and the HTTP edge completes the upgrade
//! and takes the channel's receiving end. From then on the socket lives
//! here, not in the instance: the actor may be closed between events
//! (hibernated) and its memory freed; a message on the socket is an event
//! that opens it again. What an event sends (`send`, `broadcast`, `close`)
//! is applied here only once the event's batch is durable, so a client
//! never sees a message whose cause was rolled back.
//!
//! Bounded: sockets per actor, per tenant and per node, tags and attachment sizes, a
//! message's size (the edge refuses larger frames), and each socket's send
//! buffer (a reader that falls behind by more is closed with 1008).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::mpsc;
use wasmkeep_store::ActorId;

pub use crate::config::SocketLimits;
use crate::host::HostState;
use crate::host::wasmkeep::actor::sockets as wit;
use crate::outbox::refusal;

/// A WebSocket message as the node carries it between the edge and an
/// actor. The guest's binding type (`wit::Message`) stays inside the
/// runtime: it is converted where a guest sends or receives one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Text(String),
    Binary(Vec<u8>),
}

impl From<wit::Message> for Message {
    fn from(m: wit::Message) -> Message {
        match m {
            wit::Message::Text(t) => Message::Text(t),
            wit::Message::Binary(b) => Message::Binary(b),
        }
    }
}

impl From<&Message> for wit::Message {
    fn from(m: &Message) -> wit::Message {
        match m {
            Message::Text(t) => wit::Message::Text(t.clone()),
            Message::Binary(b) => wit::Message::Binary(b.clone()),
        }
    }
}

/// What the node knows of one of an actor's sockets (the guest sees it as
/// `wit::SocketInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketInfo {
    pub id: u64,
    pub tags: Vec<String>,
    /// What the actor attached (survives hibernation).
    pub attachment: Vec<u8>,
}

impl From<&SocketInfo> for wit::SocketInfo {
    fn from(s: &SocketInfo) -> wit::SocketInfo {
        wit::SocketInfo {
            id: s.id,
            tags: s.tags.clone(),
            attachment: s.attachment.clone(),
        }
    }
}

/// Tags per socket, and their size.
pub(crate) const TAGS_MAX: usize = 10;
pub(crate) const TAG_BYTES_MAX: usize = 256;
/// A socket's attachment.
pub(crate) const ATTACHMENT_BYTES_MAX: usize = 16 * 1024;

/// Close codes the node uses (RFC 6455 and the IANA registry).
pub mod close_code {
    /// The node stops, or the socket was idle past `socket_idle_ms`.
    pub const GOING_AWAY: u16 = 1001;
    /// The client fell behind by more than `socket_send_buffer_bytes_max`.
    pub const POLICY: u16 = 1008;
    /// A message over `socket_message_bytes_max`.
    pub const TOO_BIG: u16 = 1009;
    /// Cluster mode: this node no longer holds the actor (its lease lapsed,
    /// or the actor moved): reconnect, and reach its owner.
    pub const MOVED: u16 = 1012;
    /// The actor was deleted, or its queue could not take a message:
    /// reconnect later.
    pub const TRY_AGAIN: u16 = 1013;
}

/// What the edge writes to a client. A broadcast's message is shared by
/// every socket it goes to, not copied per socket.
#[derive(Debug, Clone)]
pub enum Outgoing {
    Message(Arc<Message>),
    Close(u16, String),
}

/// Bytes of messages one event may send, broadcasts counted once (ADR
/// 0043): what the node holds for an event until it commits.
pub(crate) const SENDS_PER_EVENT_BYTES_MAX: usize = 8 * 1024 * 1024;
/// A socket registered but never connected by the edge (its upgrade did
/// not happen) is removed after this long.
pub(crate) const UNCONNECTED_MS_MAX: u64 = 30_000;

fn size(m: &Message) -> usize {
    match m {
        Message::Text(t) => t.len(),
        Message::Binary(b) => b.len(),
    }
}

/// The edge's end of one socket.
pub struct Connection {
    pub rx: mpsc::UnboundedReceiver<Outgoing>,
    /// Bytes queued and not yet written; the edge subtracts what it wrote.
    pub queued: Arc<AtomicUsize>,
    /// When a message last went either way (the node's clock, ms); the
    /// edge sets it when it writes, the runtime when a message arrives.
    pub last_ms: Arc<AtomicU64>,
}

struct Entry {
    tags: Vec<String>,
    attachment: Vec<u8>,
    tx: mpsc::UnboundedSender<Outgoing>,
    queued: Arc<AtomicUsize>,
    last_ms: Arc<AtomicU64>,
    registered_ms: u64,
    /// Until the edge takes it.
    rx: Option<mpsc::UnboundedReceiver<Outgoing>>,
    closing: bool,
}

#[derive(Default)]
struct ActorSockets {
    sockets: BTreeMap<u64, Entry>,
    auto: Option<(String, String)>,
}

#[derive(Default)]
struct Tables {
    actors: HashMap<ActorId, ActorSockets>,
    total: usize,
    /// Open sockets per tenant (no entry: none).
    per_tenant: HashMap<String, usize>,
    next: u64,
}

impl Tables {
    fn of_tenant(&self, actor: &ActorId) -> usize {
        self.per_tenant.get(&actor.tenant).copied().unwrap_or(0)
    }
}

/// The node's sockets.
pub struct SocketTable {
    limits: SocketLimits,
    t: Mutex<Tables>,
}

/// What an event asked of sockets, applied once its batch is durable.
#[derive(Debug, Clone)]
pub enum SocketOp {
    Send(u64, Message),
    Broadcast(Option<String>, Message),
    Close(u64, u16, String),
}

/// A socket a request's event accepted.
#[derive(Debug, Clone)]
pub struct Accepted {
    pub id: u64,
    pub tags: Vec<String>,
    pub attachment: Vec<u8>,
}

impl SocketTable {
    pub fn new(limits: SocketLimits) -> SocketTable {
        SocketTable {
            limits,
            t: Mutex::new(Tables {
                next: crate::replies::random_start(),
                ..Tables::default()
            }),
        }
    }

    pub fn limits(&self) -> &SocketLimits {
        &self.limits
    }

    /// Open sockets on the node.
    pub fn len(&self) -> usize {
        self.t.lock().total
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An id for a socket `actor` accepts now, if the bounds allow one
    /// more (`pending`: accepted in its running batch, not yet registered).
    fn next_id(&self, actor: &ActorId, pending: usize) -> Result<u64, String> {
        let mut t = self.t.lock();
        if t.total + pending >= self.limits.node_max {
            return Err(format!(
                "{} sockets are open on this node, limit sockets_max={}",
                t.total, self.limits.node_max
            ));
        }
        let mine = t.actors.get(actor).map_or(0, |a| a.sockets.len()) + pending;
        if mine >= self.limits.per_actor_max {
            return Err(format!(
                "{mine} sockets of this actor are open, limit sockets_per_actor_max={}",
                self.limits.per_actor_max
            ));
        }
        let tenants = t.of_tenant(actor) + pending;
        if tenants >= self.limits.per_tenant_max {
            return Err(format!(
                "{tenants} sockets of tenant `{}` are open on this node, limit sockets_per_tenant_max={}",
                actor.tenant, self.limits.per_tenant_max
            ));
        }
        t.next += 1;
        Ok(t.next)
    }

    /// Registers an accepted socket (its event is durable); the edge takes
    /// its connection next. `false` if the node is full meanwhile.
    pub(crate) fn register(&self, actor: &ActorId, a: Accepted, now_ms: u64) -> bool {
        let mut t = self.t.lock();
        let mine = t.actors.get(actor).map_or(0, |a| a.sockets.len());
        if t.total >= self.limits.node_max
            || mine >= self.limits.per_actor_max
            || t.of_tenant(actor) >= self.limits.per_tenant_max
        {
            return false;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        t.total += 1;
        *t.per_tenant.entry(actor.tenant.clone()).or_default() += 1;
        t.actors.entry(actor.clone()).or_default().sockets.insert(
            a.id,
            Entry {
                tags: a.tags,
                attachment: a.attachment,
                tx,
                queued: Arc::default(),
                last_ms: Arc::new(AtomicU64::new(now_ms)),
                registered_ms: now_ms,
                rx: Some(rx),
                closing: false,
            },
        );
        true
    }

    /// The edge's end of a registered socket (once).
    pub fn connect(&self, actor: &ActorId, id: u64) -> Option<Connection> {
        let mut t = self.t.lock();
        let e = t.actors.get_mut(actor)?.sockets.get_mut(&id)?;
        Some(Connection {
            rx: e.rx.take()?,
            queued: Arc::clone(&e.queued),
            last_ms: Arc::clone(&e.last_ms),
        })
    }

    /// The socket is gone (closed by either side, or never upgraded):
    /// what the actor's close event carries.
    pub fn remove(&self, actor: &ActorId, id: u64) -> Option<SocketInfo> {
        let mut t = self.t.lock();
        let a = t.actors.get_mut(actor)?;
        let e = a.sockets.remove(&id)?;
        if a.sockets.is_empty() && a.auto.is_none() {
            t.actors.remove(actor);
        }
        t.total -= 1;
        if let Some(n) = t.per_tenant.get_mut(&actor.tenant) {
            *n -= 1;
            if *n == 0 {
                t.per_tenant.remove(&actor.tenant);
            }
        }
        Some(SocketInfo {
            id,
            tags: e.tags,
            attachment: e.attachment,
        })
    }

    /// What the socket is now (for an event about it).
    pub fn info(&self, actor: &ActorId, id: u64) -> Option<SocketInfo> {
        let t = self.t.lock();
        let e = t.actors.get(actor)?.sockets.get(&id)?;
        Some(SocketInfo {
            id,
            tags: e.tags.clone(),
            attachment: e.attachment.clone(),
        })
    }

    fn push(&self, e: &mut Entry, out: Outgoing) {
        if e.closing {
            return;
        }
        if let Outgoing::Message(m) = &out {
            let n = size(m.as_ref());
            let queued = e.queued.fetch_add(n, Ordering::Relaxed) + n;
            if queued > self.limits.send_buffer_bytes_max {
                e.closing = true;
                let _ = e.tx.send(Outgoing::Close(
                    close_code::POLICY,
                    format!(
                        "the client fell behind: socket_send_buffer_bytes_max={}",
                        self.limits.send_buffer_bytes_max
                    ),
                ));
                return;
            }
        } else {
            e.closing = true;
        }
        let _ = e.tx.send(out);
    }

    /// Applies an event's sends and closes (its batch is durable).
    pub(crate) fn apply(&self, actor: &ActorId, ops: Vec<SocketOp>) {
        let mut t = self.t.lock();
        let Some(a) = t.actors.get_mut(actor) else {
            return;
        };
        for op in ops {
            match op {
                SocketOp::Send(id, m) => {
                    if let Some(e) = a.sockets.get_mut(&id) {
                        self.push(e, Outgoing::Message(Arc::new(m)));
                    }
                }
                SocketOp::Broadcast(tag, m) => {
                    let m = Arc::new(m);
                    for e in a.sockets.values_mut() {
                        if tag.as_ref().is_none_or(|t| e.tags.contains(t)) {
                            self.push(e, Outgoing::Message(Arc::clone(&m)));
                        }
                    }
                }
                SocketOp::Close(id, code, reason) => {
                    if let Some(e) = a.sockets.get_mut(&id) {
                        self.push(e, Outgoing::Close(code, reason));
                    }
                }
            }
        }
    }

    /// Closes every socket of `actor` (deleted) or, with `None`, of the
    /// node (stopping).
    pub fn close_all(&self, actor: Option<&ActorId>, code: u16, reason: &str) {
        let mut t = self.t.lock();
        // A deleted actor's auto-response goes with it.
        if let Some(a) = actor.and_then(|id| t.actors.get_mut(id)) {
            a.auto = None;
        }
        for (id, a) in t.actors.iter_mut() {
            if actor.is_some_and(|x| x != id) {
                continue;
            }
            for e in a.sockets.values_mut() {
                self.push(e, Outgoing::Close(code, reason.to_owned()));
            }
        }
    }

    /// A message arrived on the socket now.
    pub(crate) fn touch(&self, actor: &ActorId, id: u64, now_ms: u64) {
        let t = self.t.lock();
        if let Some(e) = t.actors.get(actor).and_then(|a| a.sockets.get(&id)) {
            e.last_ms.store(now_ms, Ordering::Relaxed);
        }
    }

    /// Closes (1001) every socket with no message either way for
    /// `socket_idle_ms` by the node's clock (the reaper calls this; the
    /// test kit too, when it moves its clock); how many.
    pub fn close_idle(&self, now_ms: u64) -> usize {
        let idle = self.limits.idle_ms;
        let mut t = self.t.lock();
        let mut n = 0;
        // Registered, never connected (the upgrade did not happen): gone.
        let Tables {
            actors,
            total,
            per_tenant,
            ..
        } = &mut *t;
        for (id, a) in actors.iter_mut() {
            let before = a.sockets.len();
            a.sockets.retain(|_, e| {
                e.rx.is_none() || now_ms.saturating_sub(e.registered_ms) < UNCONNECTED_MS_MAX
            });
            let gone = before - a.sockets.len();
            if gone > 0 {
                *total -= gone;
                if let Some(count) = per_tenant.get_mut(&id.tenant) {
                    debug_assert!(*count >= gone, "a tenant's count below its sockets");
                    *count -= gone;
                    if *count == 0 {
                        per_tenant.remove(&id.tenant);
                    }
                }
            }
        }
        for a in t.actors.values_mut() {
            for e in a.sockets.values_mut() {
                let last = e.last_ms.load(Ordering::Relaxed);
                if idle > 0 && !e.closing && now_ms.saturating_sub(last) >= idle {
                    n += 1;
                    self.push(
                        e,
                        Outgoing::Close(
                            close_code::GOING_AWAY,
                            format!("idle past socket_idle_ms={idle}"),
                        ),
                    );
                }
            }
        }
        n
    }

    /// Whether `actor` has open sockets on this node (a cluster node keeps
    /// holding such an actor rather than release it while they are open).
    pub fn has_sockets(&self, actor: &ActorId) -> bool {
        self.t
            .lock()
            .actors
            .get(actor)
            .is_some_and(|a| !a.sockets.is_empty())
    }

    /// How many sockets `actor` has open on this node.
    pub fn socket_count(&self, actor: &ActorId) -> usize {
        self.t
            .lock()
            .actors
            .get(actor)
            .map_or(0, |a| a.sockets.len())
    }

    /// Closes the sockets of every actor `keep` says no to (a cluster node
    /// that no longer holds them); how many actors lost theirs.
    pub fn close_unless(&self, keep: impl Fn(&ActorId) -> bool, code: u16, reason: &str) -> usize {
        let mut t = self.t.lock();
        let mut n = 0;
        for (id, a) in t.actors.iter_mut() {
            if a.sockets.is_empty() || keep(id) {
                continue;
            }
            n += 1;
            for e in a.sockets.values_mut() {
                self.push(e, Outgoing::Close(code, reason.to_owned()));
            }
        }
        n
    }

    /// The actor's text auto-response pair, if any.
    pub fn auto_response(&self, actor: &ActorId) -> Option<(String, String)> {
        self.t.lock().actors.get(actor)?.auto.clone()
    }

    fn sockets_of(&self, actor: &ActorId, tag: Option<&str>) -> Vec<SocketInfo> {
        let t = self.t.lock();
        let Some(a) = t.actors.get(actor) else {
            return Vec::new();
        };
        a.sockets
            .iter()
            .filter(|(_, e)| !e.closing && tag.is_none_or(|t| e.tags.iter().any(|x| x == t)))
            .map(|(id, e)| SocketInfo {
                id: *id,
                tags: e.tags.clone(),
                attachment: e.attachment.clone(),
            })
            .collect()
    }

    fn has(&self, actor: &ActorId, id: u64) -> bool {
        self.t
            .lock()
            .actors
            .get(actor)
            .is_some_and(|a| a.sockets.contains_key(&id))
    }
}

fn check_attachment(attachment: &[u8]) -> Result<(), crate::host::WitError> {
    if attachment.len() > ATTACHMENT_BYTES_MAX {
        return Err(refusal(
            "value_too_large",
            format!(
                "attachment too large: size={} limit socket_attachment_bytes_max={ATTACHMENT_BYTES_MAX}",
                attachment.len()
            ),
        ));
    }
    Ok(())
}

fn check_message(m: &Message, limit: usize) -> Result<(), crate::host::WitError> {
    if size(m) > limit {
        return Err(refusal(
            "value_too_large",
            format!(
                "message too large: size={} limit socket_message_bytes_max={limit}",
                size(m)
            ),
        ));
    }
    Ok(())
}

impl HostState {
    fn table(&self) -> Result<Arc<SocketTable>, crate::host::WitError> {
        self.sockets
            .clone()
            .ok_or_else(|| refusal("no_request", "no sockets here"))
    }

    /// Counts `m` against the event's budget of sends.
    fn spend(&mut self, m: &Message) -> Result<(), crate::host::WitError> {
        let total = self.socket_sent_bytes + size(m);
        if total > SENDS_PER_EVENT_BYTES_MAX {
            return Err(refusal(
                "value_too_large",
                format!(
                    "this event sent {total} bytes to sockets, limit socket_sends_per_event_bytes_max={SENDS_PER_EVENT_BYTES_MAX}"
                ),
            ));
        }
        self.socket_sent_bytes = total;
        Ok(())
    }

    fn socket_known(&self, table: &SocketTable, id: u64) -> bool {
        table.has(&self.id, id) || self.socket_accepted.as_ref().is_some_and(|a| a.id == id)
    }
}

impl wit::Host for HostState {
    fn accept(
        &mut self,
        tags: Vec<String>,
        attachment: Vec<u8>,
    ) -> Result<u64, crate::host::WitError> {
        if !self.response.is_open() {
            return Err(refusal(
                "no_request",
                "sockets.accept is only for the request being handled",
            ));
        }
        if !self.request_is_upgrade {
            return Err(refusal(
                "not_an_upgrade",
                "the request does not ask for a WebSocket upgrade",
            ));
        }
        if let Some(a) = &self.socket_accepted {
            return Ok(a.id);
        }
        if tags.len() > TAGS_MAX || tags.iter().any(|t| t.len() > TAG_BYTES_MAX) {
            return Err(refusal(
                "invalid_argument",
                format!("at most {TAGS_MAX} tags of at most {TAG_BYTES_MAX} bytes each"),
            ));
        }
        check_attachment(&attachment)?;
        let table = self.table()?;
        let id = table
            .next_id(&self.id, self.sockets_accepted_in_batch)
            .map_err(|m| refusal("too_many_sockets", m))?;
        self.socket_accepted = Some(Accepted {
            id,
            tags,
            attachment,
        });
        Ok(id)
    }

    fn send(&mut self, id: u64, message: wit::Message) -> Result<(), crate::host::WitError> {
        let message = Message::from(message);
        let table = self.table()?;
        check_message(&message, table.limits().message_bytes_max)?;
        if !self.socket_known(&table, id) {
            return Err(refusal(
                "socket_not_found",
                format!("no open socket {id} on this actor"),
            ));
        }
        self.spend(&message)?;
        self.socket_ops.push(SocketOp::Send(id, message));
        Ok(())
    }

    fn broadcast(
        &mut self,
        tag: Option<String>,
        message: wit::Message,
    ) -> Result<u32, crate::host::WitError> {
        let message = Message::from(message);
        let table = self.table()?;
        check_message(&message, table.limits().message_bytes_max)?;
        let mut n = table.sockets_of(&self.id, tag.as_deref()).len();
        if let Some(a) = &self.socket_accepted
            && tag.as_ref().is_none_or(|t| a.tags.contains(t))
        {
            n += 1;
        }
        self.spend(&message)?;
        self.socket_ops.push(SocketOp::Broadcast(tag, message));
        Ok(n as u32)
    }

    fn close(&mut self, id: u64, code: u16, reason: String) -> Result<(), crate::host::WitError> {
        let table = self.table()?;
        if !(code == 1000 || (3000..=4999).contains(&code)) || reason.len() > 123 {
            return Err(refusal(
                "invalid_argument",
                "a close code is 1000 or 3000 to 4999, its reason at most 123 bytes",
            ));
        }
        if !self.socket_known(&table, id) {
            return Err(refusal(
                "socket_not_found",
                format!("no open socket {id} on this actor"),
            ));
        }
        self.socket_ops.push(SocketOp::Close(id, code, reason));
        Ok(())
    }

    fn list(&mut self, tag: Option<String>) -> Vec<wit::SocketInfo> {
        match &self.sockets {
            Some(t) => t
                .sockets_of(&self.id, tag.as_deref())
                .iter()
                .map(wit::SocketInfo::from)
                .collect(),
            None => Vec::new(),
        }
    }

    fn set_attachment(
        &mut self,
        id: u64,
        attachment: Vec<u8>,
    ) -> Result<(), crate::host::WitError> {
        check_attachment(&attachment)?;
        if let Some(a) = self.socket_accepted.as_mut()
            && a.id == id
        {
            a.attachment = attachment;
            return Ok(());
        }
        let table = self.table()?;
        let mut t = table.t.lock();
        match t
            .actors
            .get_mut(&self.id)
            .and_then(|a| a.sockets.get_mut(&id))
        {
            Some(e) => {
                e.attachment = attachment;
                Ok(())
            }
            None => Err(refusal(
                "socket_not_found",
                format!("no open socket {id} on this actor"),
            )),
        }
    }

    fn set_auto_response(
        &mut self,
        pair: Option<(String, String)>,
    ) -> Result<(), crate::host::WitError> {
        if pair
            .as_ref()
            .is_some_and(|(a, b)| a.len() + b.len() > TAG_BYTES_MAX * 4)
        {
            return Err(refusal(
                "invalid_argument",
                "an auto-response pair is at most 1 KiB",
            ));
        }
        let table = self.table()?;
        let mut t = table.t.lock();
        t.actors.entry(self.id.clone()).or_default().auto = pair;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(tenant: &str, name: &str) -> ActorId {
        ActorId::new(tenant, "app", "room", name).unwrap()
    }

    fn accept(t: &SocketTable, actor: &ActorId, now_ms: u64) -> Result<u64, String> {
        let id = t.next_id(actor, 0)?;
        let a = Accepted {
            id,
            tags: Vec::new(),
            attachment: Vec::new(),
        };
        assert!(t.register(actor, a, now_ms));
        Ok(id)
    }

    /// A tenant's bound counts its sockets on the node, and every way a
    /// socket goes (closed, or never connected and swept) gives its place
    /// back.
    #[test]
    fn a_tenants_places_come_back_however_its_sockets_go() {
        let t = SocketTable::new(SocketLimits {
            per_tenant_max: 2,
            ..SocketLimits::default()
        });
        let first = accept(&t, &id("a", "one"), 0).unwrap();
        accept(&t, &id("a", "two"), 0).unwrap();
        let e = accept(&t, &id("a", "three"), 0).unwrap_err();
        assert!(e.contains("sockets_per_tenant_max=2"), "{e}");
        accept(&t, &id("b", "one"), 0).expect("another tenant");
        // Closed: its place is free.
        t.remove(&id("a", "one"), first).unwrap();
        let third = accept(&t, &id("a", "three"), 0).unwrap();
        assert!(third > first);
        // Never connected, swept: their places are free too.
        t.close_idle(UNCONNECTED_MS_MAX);
        assert_eq!(t.len(), 0);
        accept(&t, &id("a", "four"), UNCONNECTED_MS_MAX).unwrap();
        accept(&t, &id("a", "five"), UNCONNECTED_MS_MAX).unwrap();
    }
}
