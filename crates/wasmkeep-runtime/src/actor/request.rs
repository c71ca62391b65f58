//! A client request (`handler`): one event in the batch's transaction, in
//! a savepoint of its own.

use super::*;

/// The response header naming the app version that ran a request.
pub const VERSION_HEADER: &str = "x-wasmkeep-version";

/// Runs `then` once the bucket holds everything up to `mark` (on the
/// outbox's runtime); never if the actor was given up before an upload
/// carried it, or deleted or restored before the batch's sync ended (one
/// that ends while the delete or the restore still works on the bucket
/// goes by the upload count).
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
        (None, None),
    );
    rt.outbox.when_uploaded(rx, then);
}

/// Runs a request's handler; `awaits` are its waits when its app may wait
/// (ADR 0056): a run that waited for an answer it did not have fails here,
/// and the turn suspends it (`awaiting::after_handler`).
pub(super) fn run_request(
    rt: &Arc<Inner>,
    l: &mut Loaded,
    req: ActorRequest,
    initialized: &mut bool,
    awaits: Option<crate::awaits::EventAwaits>,
) -> Result<Outcome, RuntimeError> {
    let was_initialized = *initialized;
    l.db().event_begin()?;
    // Checked at the edge (`Runtime::request`): a key here is valid.
    let idempotent = match crate::idempotency::key_of(&req.headers) {
        Ok(Some(key)) if crate::idempotency::applies(&req.method) => {
            Some((key.to_owned(), crate::idempotency::fingerprint(&req)))
        }
        _ => None,
    };
    if let Some((key, fingerprint)) = &idempotent {
        match replay(rt, l, key, fingerprint) {
            Ok(None) => {}
            Ok(Some(resp)) => {
                l.db().event_commit()?;
                return Ok(Outcome::Response(resp));
            }
            Err(e) => {
                l.db().event_rollback()?;
                return Err(e);
            }
        }
    }
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
        l.store.data_mut().awaits = awaits;
        let r = bindings
            .wasmkeep_actor_handler()
            .call_on_request(&mut l.store, &class, &request);
        if let Some(aw) = l.store.data_mut().awaits.as_mut()
            && aw.pending.is_some()
        {
            // Kept to run again when the answer comes.
            aw.input = Some((
                "request",
                crate::recording::request_input(
                    &request.method,
                    &request.path,
                    &request.query,
                    &request.headers,
                    &request.body,
                ),
            ));
        }
        let parts = l.store.data_mut().response.finish();
        let status = finish_call(l, r);
        // A limit the guest ran into is the event's error, whatever the
        // guest did with the error it got.
        let (mut headers, body) = parts?;
        // Which of the app's versions answered (a rollout runs two).
        headers.push((VERSION_HEADER.to_owned(), l.app.deploy_version.to_string()));
        let socket = l.store.data().socket_accepted.as_ref().map(|a| a.id);
        Ok(ActorResponse {
            status: status?,
            headers,
            body,
            socket,
        })
    })();
    let r = r.and_then(|resp| {
        if let Some((key, fingerprint)) = idempotent {
            record(rt, l, key, fingerprint, &resp)?;
        }
        Ok(resp)
    });
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

/// The answer recorded for `key` within the retention window, as the
/// client hears it again; refused if the key came with another request.
fn replay(
    rt: &Inner,
    l: &mut Loaded,
    key: &str,
    fingerprint: &[u8],
) -> Result<Option<ActorResponse>, RuntimeError> {
    let since = rt
        .clock
        .now_ms()
        .saturating_sub(rt.config.idempotency_retention_ms);
    let Some(a) = l.db().idempotent_get(key, since)? else {
        return Ok(None);
    };
    if a.fingerprint != fingerprint {
        return Err(RuntimeError::IdempotencyKeyReused {
            key: key.to_owned(),
        });
    }
    let mut headers = a.headers;
    headers.push((
        crate::idempotency::REPLAYED_HEADER.to_owned(),
        "true".to_owned(),
    ));
    Ok(Some(ActorResponse {
        status: a.status,
        headers,
        body: a.body,
        socket: None,
    }))
}

/// Records the answer under `key` in the event's savepoint, unless the
/// handler parked its reply or accepted a socket (see `idempotency`).
fn record(
    rt: &Inner,
    l: &mut Loaded,
    key: String,
    fingerprint: Vec<u8>,
    resp: &ActorResponse,
) -> Result<(), RuntimeError> {
    if resp.socket.is_some() || l.store.data().replies.park.is_some() {
        return Ok(());
    }
    let size = resp.body.len()
        + resp
            .headers
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>();
    let limit = crate::idempotency::IDEMPOTENCY_RESPONSE_BYTES_MAX;
    if size > limit {
        return Err(RuntimeError::IdempotentResponseTooLarge { size, limit });
    }
    let now = rt.clock.now_ms();
    let answer = wasmkeep_store::IdempotentAnswer {
        fingerprint,
        status: resp.status,
        headers: resp.headers.clone(),
        body: resp.body.clone(),
        at_ms: now,
    };
    let expired_before = now.saturating_sub(rt.config.idempotency_retention_ms);
    l.db().idempotent_put(&key, &answer, expired_before)?;
    Ok(())
}
