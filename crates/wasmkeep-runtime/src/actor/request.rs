//! A client request (`handler`): one event in the batch's transaction, in
//! a savepoint of its own.

use super::*;

/// Runs `then` once the bucket holds everything up to `mark` (on the
/// outbox's runtime); never if the actor was given up meanwhile.
pub(super) fn when_uploaded(
    rt: &Arc<Inner>,
    actor: &Arc<Actor>,
    mark: replication::Mark,
    then: impl FnOnce(&Arc<Inner>) + Send + 'static,
) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    replication::hold_until_uploaded(
        &rt.metrics,
        actor,
        mark,
        Reply::new(tx),
        Ok(Outcome::Done),
        None,
    );
    rt.outbox.when_uploaded(rx, then);
}

pub(super) fn run_request(
    rt: &Arc<Inner>,
    l: &mut Loaded,
    req: ActorRequest,
    initialized: &mut bool,
) -> Result<Outcome, RuntimeError> {
    let was_initialized = *initialized;
    l.db().event_begin()?;
    let r = (|| {
        ensure_init(rt, l, initialized)?;
        enter(l);
        let class = l.store.data().id.class.clone();
        l.store.data_mut().request_is_upgrade = req
            .headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("upgrade") && v.eq_ignore_ascii_case("websocket"));
        let request = host::Request {
            method: req.method,
            path: req.path,
            query: req.query,
            headers: req.headers,
            body: req.body,
        };
        let bindings = l.bindings.as_ref().expect("instance is live");
        // Headers and body arrive through the `response` imports, checked
        // before they are copied (`crate::response`); the status is the
        // result.
        l.store
            .data_mut()
            .response
            .start(rt.config.response_body_bytes_max);
        let r = bindings
            .wasmkeep_actor_handler()
            .call_on_request(&mut l.store, &class, &request);
        let parts = l.store.data_mut().response.finish();
        let status = finish_call(l, r);
        // A limit the guest ran into is the event's error, whatever the
        // guest did with the error it got.
        let (headers, body) = parts?;
        let socket = l.store.data().socket_accepted.as_ref().map(|a| a.id);
        Ok(ActorResponse {
            status: status?,
            headers,
            body,
            socket,
        })
    })();
    match r {
        Ok(resp) => {
            commit_event(l)?;
            Ok(Outcome::Response(resp))
        }
        Err(e) => {
            *initialized = was_initialized;
            if l.db().in_transaction() {
                l.db().event_rollback()?;
            }
            Err(e)
        }
    }
}
