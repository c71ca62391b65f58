//! Planned rebalancing between the nodes of a cluster (issue 41, ADR
//! 0072), over the admin routes nodes sign for each other:
//!
//! - `POST /admin/v1/node/take` (`{"tenant","app","class","name"}`): another
//!   node released the actor for this one: take it (as a forwarded request
//!   would) and open it, so that its alarm is timed here from now on. A
//!   drain (`drain.rs`) and a give both end with it.
//! - `POST /admin/v1/node/give` (`{"to","address","count","share"}`): a
//!   node that joined asks this one for `count` of its actors; a task hands
//!   them over one at a time, at most `cluster_rebalance_moves_per_s` a
//!   second, and none once this node holds `share` or fewer.
//! - the task every node runs when it starts serving: it reads the others'
//!   counts and asks those above the fair share (the policy is in
//!   `cluster/rebalance.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::State;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use wasmkeep_runtime::{ActorId, Runtime};

use super::{ADMIN_PREFIX, ApiError, AppState, fanout};
use crate::cluster::ClusterState;
use crate::cluster::ownership::{HandOver, Route, RouteError};
use crate::cluster::rebalance::{
    GIVE_COUNT_MAX, Give, JOIN_WINDOW_MS, Load, ROUND_MS, asks, share,
};

/// How long a node that released an actor waits for the node it asked to
/// take it (the actor's requests wait meanwhile; past it they go wherever
/// the actor is taken first).
pub(super) const TAKE_ASK_TIMEOUT_MS: u64 = 5_000;
/// How long a node waits between two looks whether it serves yet, before
/// it asks for its share.
const SERVING_POLL_MS: u64 = 500;

/// The body of `POST /admin/v1/node/take`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TakeBody {
    tenant: String,
    app: String,
    class: String,
    name: String,
}

/// The body of `POST /admin/v1/node/give`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GiveBody {
    to: String,
    address: String,
    count: usize,
    share: usize,
}

fn bad(code: &str, message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, code, message)
}

fn conflict(code: &str, message: &str) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, code, message)
}

/// Whether the node may take actors now: acting, not stopping, not
/// draining itself (409 `not_taking` otherwise).
fn check_taking(c: &ClusterState) -> Result<(), ApiError> {
    if c.route_epoch().is_none() || c.is_draining() || c.ownership.is_moving_out() {
        return Err(conflict(
            "not_taking",
            "this node takes no actors now (not acting yet, stopping or draining)",
        ));
    }
    Ok(())
}

/// `POST /admin/v1/node/take`: takes the actor another node just released
/// for this one, and opens it (its alarm timed here). 409 `not_taking`
/// while this node does not take actors, 409 `not_taken` when another node
/// holds it (a request took it first).
pub(super) async fn take(
    State(s): State<AppState>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let c = super::cluster_of(&s)?;
    let b: TakeBody = serde_json::from_slice(&body).map_err(|e| {
        bad(
            "invalid_take",
            format!("the body must be {{\"tenant\",\"app\",\"class\",\"name\"}}: {e}"),
        )
    })?;
    let id = ActorId::new(&b.tenant, &b.app, &b.class, &b.name)
        .map_err(|e| bad("invalid_take", e.to_string()))?;
    check_taking(c)?;
    let Some(_in_flight) = c.enter() else {
        return Err(conflict("not_taking", "this node is stopping"));
    };
    if s.rt.check_actor_class(&id).is_err() {
        // An app deployed through another node and not synced here yet.
        c.deploys.refresh(&s.rt, &id.tenant, &id.app).await;
        s.rt.check_actor_class(&id)?;
    }
    c.refuse_if_class_closed(&id)?;
    // As a forwarded request: taken if no live node holds it, never
    // forwarded on.
    let route = c.ownership.route(&id, || c.route_epoch(), true).await;
    match route {
        Ok(Route::Local(in_use)) => {
            // Marked while in use: this node's own gives pick no actor in
            // use, so it is never picked before the mark.
            c.ownership.mark_moved_in(&id);
            let rt = s.rt.clone();
            tokio::spawn(async move {
                // In use until it opened: a drain starting here meanwhile
                // waits for it.
                if let Err(e) = rt.alarms().look(&id).await {
                    tracing::warn!(actor = %id, error = %e, "an actor handed over did not open");
                }
                drop(in_use);
            });
            Ok(axum::Json(json!({ "taken": true })).into_response())
        }
        Ok(Route::Forward { .. }) | Err(RouteError::NotOwner { .. }) => Err(conflict(
            "not_taken",
            "another node holds the actor (a request took it first)",
        )),
        Err(RouteError::Name(why)) => Err(bad("invalid_take", why)),
        Err(e) => Err(super::route_error(e)),
    }
}

/// Asks `address` (node `to`) to take `id`, which this node just released:
/// whether it did, within [`TAKE_ASK_TIMEOUT_MS`].
pub(super) async fn ask_take(c: &ClusterState, to: &str, address: &str, id: &ActorId) -> bool {
    let body = json!({
        "tenant": id.tenant, "app": id.app, "class": id.class, "name": id.name,
    });
    let answer = send(c, address, "take", body).await;
    if !answer {
        tracing::info!(actor = %id, to, "the node asked did not take the actor");
    }
    answer
}

/// A signed `POST /admin/v1/node/<what>` to `address`: whether it
/// answered 2xx within [`TAKE_ASK_TIMEOUT_MS`].
async fn send(c: &ClusterState, address: &str, what: &str, body: serde_json::Value) -> bool {
    let path = format!("{ADMIN_PREFIX}/node/{what}");
    let request = (&Method::POST, path.as_str(), body.to_string().into_bytes());
    let bounds = (TAKE_ASK_TIMEOUT_MS, c.settings().forward_response_bytes_max);
    matches!(
        fanout::send_to(c, address, request, bounds).await,
        Ok((status, _)) if status.is_success()
    )
}

/// `POST /admin/v1/node/give`: keeps another node's ask for `count` of
/// this node's actors (replacing its earlier one) and starts the task that
/// hands them over. 400 `invalid_give` for a count of 0 or above
/// [`GIVE_COUNT_MAX`], a `to` that is no node id, a bad address, or this
/// node's own id or address; 409 `not_giving` while this node
/// drains, stops or has rebalancing off; 409 `gives_full` past
/// `GIVES_QUEUED_MAX` asking nodes.
pub(super) async fn give(
    State(s): State<AppState>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let c = super::cluster_of(&s)?;
    let b: GiveBody = serde_json::from_slice(&body).map_err(|e| {
        bad(
            "invalid_give",
            format!("the body must be {{\"to\",\"address\",\"count\",\"share\"}}: {e}"),
        )
    })?;
    if b.count == 0 || b.count > GIVE_COUNT_MAX {
        return Err(bad(
            "invalid_give",
            format!(
                "count must be 1 to {GIVE_COUNT_MAX} (GIVE_COUNT_MAX): count={}",
                b.count
            ),
        ));
    }
    wasmkeep_cluster::lease::validate_node(&b.to)
        .map_err(|e| bad("invalid_give", format!("to: {e}")))?;
    wasmkeep_cluster::lease::validate_address(&b.address)
        .map_err(|e| bad("invalid_give", format!("address: {e}")))?;
    if b.to == c.node() || b.address == c.status().address {
        return Err(bad("invalid_give", "a node does not give to itself".into()));
    }
    if c.settings().rebalance_moves_per_s == 0 || check_taking(c).is_err() {
        return Err(conflict(
            "not_giving",
            "this node gives no actors now (draining, stopping, or cluster_rebalance_moves_per_s = 0)",
        ));
    }
    let (to, count) = (b.to.clone(), b.count);
    if !c.gives.push(Give {
        to: b.to,
        address: b.address,
        count: b.count,
        share: b.share,
    }) {
        return Err(conflict(
            "gives_full",
            "too many nodes' asks wait here (GIVES_QUEUED_MAX)",
        ));
    }
    if !c.gives.running.swap(true, Ordering::AcqRel) {
        tokio::spawn(giving(Arc::clone(c), s.rt.clone()));
    }
    tracing::info!(to, count, "rebalancing: asked to give actors");
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({ "to": to, "count": count })),
    )
        .into_response())
}

/// Does the asks this node was sent, one after another, each actor a
/// hand-over ([`crate::cluster::ownership::Ownership::hand_over`]) started
/// at most `cluster_rebalance_moves_per_s` a second. An ask ends when its
/// count is handed over, the asking node refuses one, or this node has no
/// actor it may give; everything ends when the node drains or stops.
async fn giving(c: Arc<ClusterState>, rt: Runtime) {
    let per_s = u64::from(c.settings().rebalance_moves_per_s.max(1));
    let pace = Duration::from_millis(1_000 / per_s);
    loop {
        while let Some(g) = c.gives.pop() {
            // A newer ask of the same node replaces this one; at the share
            // the ask named, this node gives no more.
            let done = || c.gives.has(&g.to) || c.held_actors() <= g.share;
            let mut moved = 0;
            let mut skipped: std::collections::HashSet<ActorId> = std::collections::HashSet::new();
            'ask: while moved < g.count {
                if check_taking(&c).is_err() {
                    c.gives.clear();
                    break 'ask;
                }
                if done() {
                    break 'ask;
                }
                let Some(epoch) = c.acting_epoch() else {
                    break 'ask;
                };
                let want = g.count - moved;
                let next = c
                    .ownership
                    // Not an actor with WebSockets: a move would close them
                    // (1001) and their clients reconnect; a drain does
                    // that, rebalancing does not.
                    .to_give(epoch, want, |id| {
                        skipped.contains(id) || c.class_closed(id) || rt.sockets().has_sockets(id)
                    });
                if next.is_empty() {
                    break 'ask;
                }
                for id in next {
                    let started = wasmkeep_runtime::clock::instant();
                    let close = |id: ActorId| closed_without_sockets(rt.clone(), id);
                    let asked = || ask_take(&c, &g.to, &g.address, &id);
                    let to = (g.to.as_str(), g.address.as_str());
                    match c
                        .ownership
                        .hand_over(&id, &|| c.acting_epoch(), &close, to, asked)
                        .await
                    {
                        HandOver::Moved => moved += 1,
                        // The asking node did not take it (it drains,
                        // stops, or did not answer in time): its next
                        // round asks again if it still wants actors.
                        HandOver::NotTaken => break 'ask,
                        HandOver::Busy => {
                            look_again(&rt, id.clone());
                            skipped.insert(id);
                        }
                        HandOver::NotHeld | HandOver::ReleaseFailed => {
                            skipped.insert(id);
                        }
                    }
                    if moved >= g.count || done() {
                        break 'ask;
                    }
                    tokio::time::sleep(pace.saturating_sub(started.elapsed())).await;
                }
            }
            tracing::info!(
                to = g.to,
                moved,
                asked = g.count,
                "rebalancing: gave actors"
            );
        }
        c.gives.running.store(false, Ordering::Release);
        // An ask kept between the last pop and the store saw the task
        // running and started none: this one goes on for it.
        if c.gives.is_empty() || c.gives.running.swap(true, Ordering::AcqRel) {
            return;
        }
    }
}

/// Puts the alarm of `id`, which a hand-over left here (busy), back in the
/// node's timer: the alarm gate said no to it while the hand-over held the
/// actor, which took it out. [`wasmkeep_runtime::Alarms::look`]
/// runs it if it is due, and times it otherwise.
pub(super) fn look_again(rt: &Runtime, id: ActorId) {
    let rt = rt.clone();
    tokio::spawn(async move {
        if let Err(e) = rt.alarms().look(&id).await {
            tracing::warn!(actor = %id, error = %e, "an actor's alarm could not be timed again");
        }
    });
}

/// Whether `id` is closed here, for a rebalancing move: as a drain closes
/// it, but an actor with WebSockets open (one opened since it was picked)
/// stays busy rather than have them closed.
async fn closed_without_sockets(rt: Runtime, id: ActorId) -> bool {
    if rt.sockets().has_sockets(&id) {
        return false;
    }
    super::drain::closed(rt, id).await
}

/// The other serving nodes that take actors (not draining, not stopping),
/// with their addresses and counts, each asked its `/admin/v1/node`; one
/// that does not answer is left out. 503 `bucket_unavailable` when the
/// live nodes cannot be read.
pub(super) async fn loads(c: &ClusterState) -> Result<Vec<Load>, ApiError> {
    let view = fanout::live(c).await?;
    let answers = fanout::ask(c, &view, &format!("{ADMIN_PREFIX}/node")).await;
    let mut out = Vec::new();
    for (node, body) in answers {
        let Some(v) = fanout::json_of(body) else {
            continue;
        };
        let n = &v["cluster"];
        let Some(live) = view.live.iter().find(|l| l.node == node) else {
            continue;
        };
        if node == c.node() || n["serving"] != true || n["moving_out"] == true {
            continue;
        }
        out.push(Load {
            node,
            address: live.address.clone(),
            held: n["held_actors"].as_u64().unwrap_or(0) as usize,
        });
    }
    out.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(out)
}

/// Starts the task that asks for this node's fair share once it serves
/// (nothing with `cluster_rebalance_moves_per_s = 0`, or on a single node).
pub(super) fn start(s: &AppState) {
    let Some(c) = s.config.cluster.clone() else {
        return;
    };
    if c.settings().rebalance_moves_per_s == 0 {
        return;
    }
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let rt = s.rt.clone();
    handle.spawn(async move { joining(c, rt).await });
}

/// From the moment the node serves, for [`JOIN_WINDOW_MS`] at most: every
/// [`ROUND_MS`], the first one round after it serves, the others' counts,
/// and asks of those above the share ([`asks`]); done once this node holds
/// its share or nobody is above it. Waiting a round first lets nodes
/// started together count each other: asking at once, the first to serve
/// took the share of a cluster without the others, and what it took cannot
/// move again in a row.
async fn joining(c: Arc<ClusterState>, rt: Runtime) {
    while check_taking(&c).is_err() {
        if rt.is_stopping() || c.is_draining() || c.ownership.is_moving_out() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(SERVING_POLL_MS)).await;
    }
    let started = wasmkeep_runtime::clock::instant();
    let cap = c.settings().rebalance_moves_per_s as usize * (ROUND_MS / 1_000) as usize;
    while started.elapsed() < Duration::from_millis(JOIN_WINDOW_MS) {
        tokio::time::sleep(Duration::from_millis(ROUND_MS)).await;
        if rt.is_stopping() || c.is_draining() || c.ownership.is_moving_out() {
            return;
        }
        // A round in which this node does not take actors (a lease blip)
        // or no other node answered decides nothing.
        if check_taking(&c).is_ok()
            && let Ok(others) = loads(&c).await
            && !others.is_empty()
        {
            let mine = c.held_actors();
            let share = share(mine, &others);
            let asked = asks(mine, &others, cap);
            if asked.is_empty() {
                tracing::info!(held = mine, share, "rebalancing: this node holds its share");
                return;
            }
            for (giver, count) in asked {
                let body = json!({
                    "to": c.node(),
                    "address": c.status().address,
                    "count": count,
                    "share": share,
                });
                let sent = send(&c, &giver.address, "give", body).await;
                tracing::info!(
                    from = giver.node,
                    count,
                    sent,
                    "rebalancing: asked for actors"
                );
            }
        }
    }
}
