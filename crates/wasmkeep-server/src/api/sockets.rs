//! The edge's side of WebSockets (ADR 0043): completing an upgrade an
//! actor accepted, and carrying frames between the client and the node's
//! socket table (`wasmkeep_runtime::sockets`).
//!
//! One task per connection reads the client's messages (each becomes an
//! event of the actor, unless it is the actor's auto-response request,
//! which is answered here without waking it), writes what the actor's
//! committed events sent, closes an idle socket after `socket_idle_ms`,
//! and, when the socket ends, takes it out of the table and tells the
//! actor with a close event. WebSocket pings are answered by the protocol
//! layer, never by the actor. Idle sockets are closed by the runtime's
//! reaper (`SocketTable::close_idle`, on the node's clock), through the
//! same channel; a write a client does not take within 10 s cuts the
//! socket off. What a socket reads is counted in the node's
//! `socket_buffers` pool until it is delivered (`ws`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use wasmkeep_runtime::actor::SocketEvent;
use wasmkeep_runtime::sockets::{Message, Outgoing, SocketInfo, close_code};
use wasmkeep_runtime::{ActorId, Runtime};

use super::ws::{ClientSocket, Reads, Socket, Upgrade};
use super::{ApiError, AppState, pool_refused};

/// The read buffer of one socket's connection.
const READ_BUFFER_BYTES: usize = 1024;

/// Completes the upgrade of an accepted socket, or, if the request could
/// not be upgraded after all, takes the socket back.
pub(super) fn upgrade(
    s: &AppState,
    actor: ActorId,
    socket: u64,
    ws: Option<(Upgrade, Option<ClientSocket>)>,
) -> Response {
    let rt = s.rt.clone();
    let Some((ws, client)) = ws else {
        gone(
            &rt,
            &actor,
            socket,
            1006,
            "the request was not a valid upgrade",
        );
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "not_an_upgrade",
            "the actor accepted a WebSocket, but the request is not a valid upgrade",
        )
        .into_response();
    };
    // Taken before answering 101: a socket the table could not register
    // (the node's, tenant's or actor's bound reached meanwhile) is
    // refused here.
    let Some(conn) = rt.sockets().connect(&actor, socket) else {
        let why = "the node's, the tenant's or the actor's sockets are at their bound (sockets_max, sockets_per_tenant_max, sockets_per_actor_max)";
        tell_actor(&rt, &actor, socket, 1013, why);
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "too_many_sockets", why)
            .into_response();
    };
    let reads = match rt.pools().socket_buffers.reserve(&actor.tenant, 0) {
        // The unsafe variant counts nothing.
        _ if s.config.unsafe_rules.no_socket_buffer_pool => None,
        Ok(hold) => Some(std::sync::Arc::new(parking_lot::Mutex::new(hold))),
        Err(e) => {
            gone(&rt, &actor, socket, close_code::TRY_AGAIN, &e.to_string());
            return pool_refused(e).into_response();
        }
    };
    let limit = rt.sockets().limits().message_bytes_max;
    let (rt2, actor2) = (rt.clone(), actor.clone());
    let sample_pct = s.config.trace_sample_pct;
    ws.respond(
        config(limit),
        reads.clone(),
        move |ws| async move {
            bridge(rt, actor, socket, conn, ws, (reads, sample_pct)).await;
            drop(client);
        },
        move || gone(&rt2, &actor2, socket, 1006, "the upgrade failed"),
    )
}

/// A socket's settings. Small buffers: an idle socket holds what its
/// connection needs and little more (the library's defaults, 128 KiB each
/// way, are sized for throughput, not for thousands of hibernated
/// sockets).
fn config(message_bytes_max: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(0)
        .max_message_size(Some(message_bytes_max))
        .max_frame_size(Some(message_bytes_max))
}

/// The socket ends: out of the table, and its actor hears of it.
fn gone(rt: &Runtime, actor: &ActorId, socket: u64, code: u16, reason: &str) {
    if let Some(info) = rt.sockets().remove(actor, socket) {
        closed(rt, actor, info, code, reason);
    }
}

/// The actor hears that a socket it accepted never opened.
fn tell_actor(rt: &Runtime, actor: &ActorId, socket: u64, code: u16, reason: &str) {
    let info = SocketInfo {
        id: socket,
        tags: Vec::new(),
        attachment: Vec::new(),
    };
    closed(rt, actor, info, code, reason);
}

/// A close event for the socket's actor.
fn closed(rt: &Runtime, actor: &ActorId, info: SocketInfo, code: u16, reason: &str) {
    let _ = rt.socket_event(
        actor,
        SocketEvent::Closed {
            info,
            code,
            reason: reason.to_owned(),
        },
    );
}

/// How long one write to a client may take: a client that stops reading
/// (its receive window full) is cut off rather than waited for.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Writes `frame` within [`WRITE_TIMEOUT`]. Most writes complete when
/// first polled, and take no timer; only one that has to wait does.
async fn send_within(
    ws: &mut Socket,
    frame: WsMessage,
) -> Result<Result<(), tokio_tungstenite::tungstenite::Error>, tokio::time::error::Elapsed> {
    use std::future::Future;
    use std::task::Poll;
    let mut fut = std::pin::pin!(ws.send(frame));
    if let Poll::Ready(r) = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
        return Ok(r);
    }
    tokio::time::timeout(WRITE_TIMEOUT, fut).await
}

fn close(code: u16, reason: &str) -> WsMessage {
    WsMessage::Close(Some(CloseFrame {
        code: code.into(),
        reason: reason.into(),
    }))
}

async fn bridge(
    rt: Runtime,
    actor: ActorId,
    socket: u64,
    mut conn: wasmkeep_runtime::sockets::Connection,
    mut ws: Socket,
    (reads, sample_pct): (Reads, u8),
) {
    let (code, reason): (u16, String) = loop {
        tokio::select! {
            incoming = ws.next() => {
                if matches!(incoming, Some(Ok(_))) {
                    // Out of the protocol layer: what it read is the
                    // event's (or gone) now.
                    super::ws::delivered(&reads);
                }
                let message = match incoming {
                    Some(Ok(WsMessage::Text(t))) => Message::Text(t.to_string()),
                    Some(Ok(WsMessage::Binary(b))) => Message::Binary(b.to_vec()),
                    Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_))) => {
                        // Answered by the protocol layer; it keeps the
                        // socket from being idle.
                        conn.last_ms.store(rt.clock().now_ms(), Ordering::Relaxed);
                        continue;
                    }
                    Some(Ok(WsMessage::Close(frame))) => {
                        break frame.map_or((1005, String::new()), |f| (u16::from(f.code), f.reason.to_string()));
                    }
                    Some(Err(e)) if super::ws::pool_refused(&e).is_some() => {
                        let reason = super::ws::pool_refused(&e).unwrap_or_default();
                        let _ = send_within(&mut ws, close(close_code::TRY_AGAIN, &reason.chars().take(120).collect::<String>())).await;
                        break (close_code::TRY_AGAIN, reason);
                    }
                    Some(Err(e)) => {
                        let text = e.to_string();
                        let (code, reason) = if text.contains("too long") || text.contains("too big") || text.contains("Space limit") {
                            (close_code::TOO_BIG, format!("{text} (socket_message_bytes_max={})", rt.sockets().limits().message_bytes_max))
                        } else {
                            (1006, text)
                        };
                        let _ = ws.send(close(code, &reason.chars().take(120).collect::<String>())).await;
                        break (code, reason);
                    }
                    None => break (1006, "the connection ended".into()),
                };
                if let (Message::Text(t), Some((ask, answer))) = (&message, rt.sockets().auto_response(&actor))
                    && *t == ask
                {
                    // Answered here: the actor stays asleep.
                    let _ = ws.send(WsMessage::Text(answer.into())).await;
                    continue;
                }
                if !rt.may_run_actor(&actor) {
                    // A cluster node that lost its lease or the actor: the
                    // actor's events run on its owner now.
                    let reason = "the actor moved: reconnect".to_string();
                    let _ = ws.send(close(close_code::MOVED, &reason)).await;
                    break (close_code::MOVED, reason);
                }
                // Each message sampled on its own, at the node's share: a
                // socket carries no `traceparent` after its upgrade.
                let trace = crate::traces::sampled(sample_pct)
                    .then(|| wasmkeep_runtime::trace::EventTrace::root("socket", None));
                if let Err(e) = rt.socket_event(&actor, SocketEvent::Message { id: socket, message, sent_as: None, trace }) {
                    let reason = format!("the actor cannot take messages now: {}", e.code());
                    let _ = ws.send(close(close_code::TRY_AGAIN, &reason)).await;
                    break (close_code::TRY_AGAIN, reason);
                }
            }
            out = conn.rx.recv() => {
                conn.last_ms.store(rt.clock().now_ms(), Ordering::Relaxed);
                match out {
                    Some(Outgoing::Message(m)) => {
                        let (frame, n) = match m.as_ref() {
                            Message::Text(t) => (WsMessage::Text(t.clone().into()), t.len()),
                            Message::Binary(b) => (WsMessage::Binary(b.clone().into()), b.len()),
                        };
                        let sent = send_within(&mut ws, frame).await;
                        conn.queued.fetch_sub(n, Ordering::Relaxed);
                        match sent {
                            Ok(Ok(())) => {}
                            Ok(Err(_)) => break (1006, "the connection ended".into()),
                            Err(_) => break (
                                close_code::POLICY,
                                "the client stopped reading (a write took longer than 10 s)".into(),
                            ),
                        }
                    }
                    Some(Outgoing::Close(code, reason)) => {
                        let _ = send_within(&mut ws, close(code, &reason)).await;
                        break (code, reason);
                    }
                    None => {
                        let _ = send_within(&mut ws, close(close_code::GOING_AWAY, "gone")).await;
                        break (close_code::GOING_AWAY, "gone".into());
                    }
                }
            }
        }
    };
    gone(&rt, &actor, socket, code, &reason);
}

/// Cluster mode: opens the client's WebSocket on the actor's owner at
/// `address`, then upgrades the client and carries frames both ways until
/// either side closes. The owner's refusal (not the owner any more, a
/// failed accept) is the client's answer, before any 101.
pub(super) async fn relay(
    s: &AppState,
    c: &crate::cluster::ClusterState,
    address: &str,
    path_and_query: &str,
    headers: &axum::http::HeaderMap,
    (ws, client): (Upgrade, Option<ClientSocket>),
    tenant: &str,
) -> Result<Response, ApiError> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!(
        "ws://{}{path_and_query}",
        address.trim_start_matches("http://").trim_end_matches('/')
    );
    let mut req = url.as_str().into_client_request().map_err(|e| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "forward_failed",
            format!("the owner's address: {e}"),
        )
    })?;
    let h = req.headers_mut();
    for (k, v) in headers {
        // What frames the upgrade is the client library's own to set.
        let own = k.as_str().starts_with("sec-websocket")
            || [
                axum::http::header::HOST,
                axum::http::header::UPGRADE,
                axum::http::header::CONNECTION,
            ]
            .contains(k);
        if !own {
            h.append(k.clone(), v.clone());
        }
    }
    h.insert(
        crate::cluster::FORWARDED_HEADER,
        axum::http::HeaderValue::from_static("1"),
    );
    let signature = c.sign_for("GET", address, path_and_query, b"");
    if let Ok(v) = axum::http::HeaderValue::from_str(&signature) {
        h.insert(crate::cluster::sign::SIGNATURE_HEADER, v);
    }
    let timeout = Duration::from_millis(c.settings().forward_timeout_ms);
    let upstream = match tokio::time::timeout(timeout, tokio_tungstenite::connect_async(req)).await
    {
        Ok(Ok((upstream, _))) => upstream,
        Ok(Err(tokio_tungstenite::tungstenite::Error::Http(resp))) => {
            let status =
                StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            let body = resp.body().clone().unwrap_or_default();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            return Err(ApiError::new(
                status,
                v["error"]["code"].as_str().unwrap_or("forward_failed"),
                v["error"]["message"]
                    .as_str()
                    .unwrap_or("the owner refused the WebSocket")
                    .to_owned(),
            ));
        }
        Ok(Err(e)) => {
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "forward_failed",
                format!("opening the WebSocket on the actor's owner failed: {e}"),
            ));
        }
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "forward_timeout",
                "the actor's owner did not answer the WebSocket upgrade in time",
            ));
        }
    };
    let limit = c.settings().forward_response_bytes_max;
    let hold =
        s.rt.pools()
            .socket_buffers
            .reserve(tenant, 0)
            .map_err(pool_refused)?;
    let reads = Some(std::sync::Arc::new(parking_lot::Mutex::new(hold)));
    Ok(ws.respond(
        config(limit),
        reads.clone(),
        move |ws| async move {
            pipe(ws, upstream, reads).await;
            drop(client);
        },
        || {},
    ))
}

/// Carries frames between the client and the owner's socket.
async fn pipe(
    mut client: Socket,
    upstream: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    reads: Reads,
) {
    use tokio_tungstenite::tungstenite::Message as Up;
    let (mut up_tx, mut up_rx) = upstream.split();
    loop {
        tokio::select! {
            from_client = client.next() => {
                if matches!(from_client, Some(Ok(_))) {
                    super::ws::delivered(&reads);
                }
                let out = match from_client {
                    Some(Ok(WsMessage::Text(t))) => Up::Text(t),
                    Some(Ok(WsMessage::Binary(b))) => Up::Binary(b),
                    Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_))) => continue,
                    Some(Ok(WsMessage::Close(f))) => {
                        let _ = up_tx.send(Up::Close(f)).await;
                        return;
                    }
                    _ => {
                        let _ = up_tx.send(Up::Close(None)).await;
                        return;
                    }
                };
                if up_tx.send(out).await.is_err() {
                    let _ = send_within(&mut client, close(close_code::MOVED, "the owner is gone: reconnect")).await;
                    return;
                }
            }
            from_owner = up_rx.next() => {
                let out = match from_owner {
                    Some(Ok(Up::Text(t))) => WsMessage::Text(t),
                    Some(Ok(Up::Binary(b))) => WsMessage::Binary(b),
                    Some(Ok(Up::Ping(_) | Up::Pong(_) | Up::Frame(_))) => continue,
                    Some(Ok(Up::Close(f))) => {
                        let (code, reason) = f.map_or((1000, String::new()), |f| (u16::from(f.code), f.reason.to_string()));
                        let _ = send_within(&mut client, close(code, &reason)).await;
                        return;
                    }
                    _ => {
                        let _ = send_within(&mut client, close(close_code::MOVED, "the owner is gone: reconnect")).await;
                        return;
                    }
                };
                if !matches!(send_within(&mut client, out).await, Ok(Ok(()))) {
                    let _ = up_tx.send(Up::Close(None)).await;
                    return;
                }
            }
        }
    }
}
