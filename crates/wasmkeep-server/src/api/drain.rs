//! `POST /admin/v1/node/drain` (`wasmkeep drain NODE`): the node hands its
//! actors to the other live nodes while it keeps serving (issue 41's planned
//! rebalancing); `DELETE` ends the drain.
//!
//! While a node drains it takes no actor: a request for one it does not
//! hold is forwarded to the actor's owner (found by a lookup that writes
//! nothing), or, if no live node has it, to the other node rendezvous
//! hashing picks among the live ones that do not drain (read again every
//! [`DRAIN_PEERS_REFRESH_MS`]), which takes it; a request another node
//! forwarded to it for an actor it does not hold is refused as not its
//! own, and the forwarding node takes the actor. A task hands the actors
//! it holds over, one at a time
//! ([`crate::cluster::ownership::Ownership::drain_held`]): each actor's new
//! requests wait while its running ones finish and the runtime closes it
//! (its queued events run, its commits reach the bucket, its WebSockets
//! are gone), then its hold is released, the peer rendezvous hashing picks
//! for it is asked to take it (`rebalance.rs`: it opens the actor, so its
//! alarm is timed there at once, ADR 0072), and the waiting requests go to
//! that peer. Nothing waits for the actor to be idle: a request waits for
//! one actor's hand-over at most.
//!
//! The drained node keeps serving by forwarding until it is stopped (at
//! once: it holds nothing) or the drain is ended. What it does not hand
//! over: its share of the alarm index's overdue entries, which other nodes
//! deliver as helpers once three sweep margins overdue (ADR 0065).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use wasmkeep_runtime::ActorId;

use super::{ApiError, AppState};
use crate::cluster::ClusterState;

/// How long the drain task waits between two rounds while actors are left.
const DRAIN_ROUND_PAUSE_MS: u64 = 100;
/// How often the drain reads the other nodes again while it holds actors
/// (the live ones that serve and do not drain: a node that stopped or began
/// to drain gets no more actors); a view of the cluster and a question to
/// each node, so not more often.
const DRAIN_PEERS_REFRESH_MS: u64 = 3_000;
/// How long it waits between rounds once the node holds nothing (a request
/// racing the start of the drain may still have taken one).
const DRAINED_PAUSE_MS: u64 = 1_000;

/// `POST /admin/v1/node/drain`: starts the drain (again, with a fresh view
/// of the other nodes, if it runs); 409 `no_other_node` when no other node
/// is live to take the actors.
pub(super) async fn start(State(s): State<AppState>) -> Result<Response, ApiError> {
    let c = super::cluster_of(&s)?;
    let peers = peers(c).await?;
    if peers.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "no_other_node",
            "no other live node to hand the actors to: start one first",
        ));
    }
    let to = peers.len();
    c.ownership.set_moving_out(Some(peers));
    if !c.drain_task.swap(true, Ordering::AcqRel) {
        tokio::spawn(run(Arc::clone(c), s.rt.clone()));
    }
    tracing::info!(peers = to, held = c.held_actors(), "drain started");
    Ok(axum::Json(json!({
        "moving_out": true,
        "held_actors": c.held_actors(),
        "peers": to,
    }))
    .into_response())
}

/// The other live nodes that serve and do not drain, with their addresses
/// (each asked its `/admin/v1/node`; one that does not answer, or is
/// stopping, is left out).
async fn peers(c: &ClusterState) -> Result<Vec<(String, String)>, ApiError> {
    Ok(super::rebalance::loads(c)
        .await?
        .into_iter()
        .map(|l| (l.node, l.address))
        .collect())
}

/// `DELETE /admin/v1/node/drain`: ends the drain; the node takes actors
/// again.
pub(super) async fn stop(State(s): State<AppState>) -> Result<Response, ApiError> {
    let c = super::cluster_of(&s)?;
    c.ownership.set_moving_out(None);
    tracing::info!("drain ended");
    Ok(axum::Json(json!({ "moving_out": false, "held_actors": c.held_actors() })).into_response())
}

/// Releases the node's actors round after round while it drains. A task
/// that ends as a new drain starts hands over to it rather than leave it
/// without one.
async fn run(c: Arc<ClusterState>, rt: wasmkeep_runtime::Runtime) {
    let mut later = HashMap::new();
    let mut peers_read = wasmkeep_runtime::clock::instant();
    loop {
        while c.ownership.is_moving_out() {
            if c.held_actors() == 0 {
                // Drained: nothing to hand over until a request races one in.
                tokio::time::sleep(Duration::from_millis(DRAINED_PAUSE_MS)).await;
                continue;
            }
            if peers_read.elapsed() >= Duration::from_millis(DRAIN_PEERS_REFRESH_MS) {
                peers_read = wasmkeep_runtime::clock::instant();
                if let Ok(p) = peers(&c).await
                    && !p.is_empty()
                {
                    c.ownership.refresh_peers(p);
                }
            }
            let close = |id: ActorId| closed(rt.clone(), id);
            let ask = |id: ActorId, node: String, address: String| {
                let c = Arc::clone(&c);
                async move { super::rebalance::ask_take(&c, &node, &address, &id).await }
            };
            let busy = |id: &ActorId| super::rebalance::look_again(&rt, id.clone());
            c.ownership
                .drain_held(|| c.acting_epoch(), close, ask, busy, &mut later)
                .await;
            tokio::time::sleep(Duration::from_millis(DRAIN_ROUND_PAUSE_MS)).await;
        }
        c.drain_task.store(false, Ordering::Release);
        // A drain started between the loop's last look and the store saw
        // the task running and started none: this one goes on for it.
        if !c.ownership.is_moving_out() || c.drain_task.swap(true, Ordering::AcqRel) {
            return;
        }
    }
}

/// Whether `id` is closed here: its WebSockets are told to reconnect (1001)
/// and must be gone first (a socket's close would open it again), then the
/// runtime closes it if nothing of it is queued or running and its uploads
/// are done (off the async threads: a close may checkpoint the database).
pub(super) async fn closed(rt: wasmkeep_runtime::Runtime, id: ActorId) -> bool {
    if rt.sockets().has_sockets(&id) {
        rt.sockets().close_all(
            Some(&id),
            wasmkeep_runtime::sockets::close_code::GOING_AWAY,
            "the node hands this actor over: reconnect",
        );
        return false;
    }
    tokio::task::spawn_blocking(move || rt.close_if_idle(&id))
        .await
        .unwrap_or(false)
}
