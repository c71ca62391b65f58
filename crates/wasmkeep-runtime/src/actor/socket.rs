//! A socket's message or close (ADR 0043) and the socket operations an
//! event leaves, applied once its commit is durable.

use super::*;

/// A socket's message or close, as an event of its actor (ADR 0043): its
/// handler runs in a savepoint like a request's; an app without
/// `socket-handler` ignores it.
pub(super) fn run_socket(
    rt: &Inner,
    l: &mut Loaded,
    ev: SocketEvent,
) -> Result<Outcome, RuntimeError> {
    if l.socket_handler.is_none() {
        return Ok(Outcome::Done);
    }
    if !rt.holds_actor(&l.store.data().id) {
        // A cluster node that no longer holds the actor: its events run on
        // its owner now, and its clients reconnect there.
        rt.sockets.close_all(
            Some(&l.store.data().id),
            crate::sockets::close_code::MOVED,
            "this node no longer holds the actor: reconnect",
        );
        return Ok(Outcome::Done);
    }
    let table = l.store.data().sockets.clone();
    l.db().event_begin()?;
    enter(l);
    let class = l.store.data().id.class.clone();
    let id = l.store.data().id.clone();
    let exports = l.socket_handler.as_ref().expect("checked above");
    let r = match ev {
        SocketEvent::Message {
            id: socket,
            message,
            sent_as,
            ..
        } => {
            let Some(info) = table.and_then(|t| t.info(&id, socket)).or(sent_as) else {
                commit_event(l)?;
                return Ok(Outcome::Done);
            };
            let (info, message) = (
                crate::host::wasmkeep::actor::sockets::SocketInfo::from(&info),
                crate::host::wasmkeep::actor::sockets::Message::from(&message),
            );
            let r = exports
                .wasmkeep_actor_socket_handler()
                .call_on_socket_message(&mut l.store, &class, &info, &message);
            finish_call(l, r)
        }
        SocketEvent::Closed { info, code, reason } => {
            let info = crate::host::wasmkeep::actor::sockets::SocketInfo::from(&info);
            let r = exports
                .wasmkeep_actor_socket_handler()
                .call_on_socket_close(&mut l.store, &class, &info, code, &reason);
            finish_call(l, r)
        }
    };
    end_event(l, r)
}

/// Applies what a batch sent to sockets once it is durable: at once
/// without a bucket, once the bucket holds it with one (a client must not
/// see what a restore would not have).
pub(super) fn apply_socket_ops(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    ops: Vec<crate::sockets::SocketOp>,
    mark: Option<replication::Mark>,
) {
    let Some(mark) = mark else {
        rt.sockets.apply(&actor.id, ops);
        return;
    };
    let id = actor.id.clone();
    when_uploaded(rt, actor, mark, move |rt| rt.sockets.apply(&id, ops));
}
