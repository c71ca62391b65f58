//! Which actors this node holds (ADR 0020's holds), driven by
//! `wasmkeep-cluster`'s [`TakeMachine`] and [`ReleaseMachine`] against the
//! real bucket: the ownership table, the owner cache, taking on the first
//! request, and releasing idle actors.
//!
//! One [`Cell`] per actor the node knows about, in one map bounded by
//! `cluster_actors_max`. A cell's async lock is held for the whole of a take
//! or a release, so concurrent first requests for one actor share one take:
//! the second waits for the lock and then finds the actor held (or its owner
//! cached). A cell records either the hold this node has (generation and
//! epoch: a hold of an earlier epoch is dead, the node's lease having ended)
//! or another node that owns the actor, with its address, for
//! `cluster_owner_cache_ttl_ms` from the lookup or from that node's last
//! answer to a forwarded request ([`Ownership::confirm_owner`]).
//!
//! A take's `Restore` notice is answered "restored" without doing anything
//! here: the runtime restores the actor from the bucket when it opens it,
//! comparing the local file's sidecar with the bucket's head (ADR 0007), so
//! a local copy that another owner moved past is set aside, never served.
//! That holds as long as the runtime does not keep the actor open across a
//! change of owner: this node releases an actor only after it has been idle
//! for longer than the runtime's own idle close (`release_idle_ms`) and the
//! runtime no longer has it open (`Runtime::is_open`, the release task's
//! `keep`), and the runtime closes its actors when the node's lease ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use wasmkeep_cluster::machine::{
    KnownLeases, ReleaseEffect, ReleaseMachine, ReleaseOutcome, TakeEffect, TakeMachine,
    TakeOutcome,
};
use wasmkeep_replica::ActorRoot;
use wasmkeep_runtime::{ActorId, metrics};

use super::bucket::BucketDriver;
use super::{ClusterSettings, nonce, now_ms};

/// How often the release task looks for idle actors to release.
pub const RELEASE_SCAN_MS: u64 = 500;

/// How long a route waits, reading the bucket again, for an owner that a
/// forward just failed to reach to give the actor up. A node stopping
/// cleanly closes its listener before it releases its holds (it finishes
/// its requests and uploads first); without this wait every request for
/// its actors in that window fails (issue 18's rolling restart).
pub const UNREACHABLE_OWNER_WAIT_MS: u64 = 1_000;
/// The first pause between two reads of the bucket in that wait (doubled
/// up to [`UNREACHABLE_OWNER_POLL_MAX_MS`]).
const UNREACHABLE_OWNER_POLL_MS: u64 = 25;
const UNREACHABLE_OWNER_POLL_MAX_MS: u64 = 200;
/// Takes tried again after losing the race to create an actor's hold. One
/// is the usual case (the winner is then the owner to forward to); during
/// a rolling restart the winner may be a node that is stopping and lets
/// the actor go at once, and the next take races again (seen once in
/// `cluster_load`'s rolling restart: one request in 2,006 got
/// `take_failed`). From the second on, each waits a poll's pause longer.
const LOST_RACE_RETRIES: u32 = 3;

/// The longest a drain waits, at a time, for an actor's running requests to
/// end and the runtime to close it (its new requests wait meanwhile: well
/// within a forward's timeout); a busier actor is tried again later.
const DRAIN_ACTOR_WAIT_MS: u64 = 5_000;
/// The longest a drain leaves a busy actor alone before it tries again.
const DRAIN_BUSY_BACKOFF_MAX_MS: u64 = 30_000;
/// How often a drain looks again whether an actor is idle.
const DRAIN_POLL_MS: u64 = 5;

/// What routing decided for a request.
#[derive(Debug)]
pub enum Route {
    /// This node holds the actor: run the request here. The guard marks the
    /// actor in use until it is dropped.
    Local(InUse),
    /// `node` owns the actor; reach it at `address`.
    Forward { node: String, address: String },
}

/// Why a request could not be routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    /// The node's lease does not let it act.
    NotActing,
    /// A forwarded request reached a node that does not own the actor.
    NotOwner { owner: Option<String> },
    /// The take failed (the bucket, a lost race, a live holder): retryable.
    TakeFailed(String),
    /// The actor's name makes keys the bucket cannot hold.
    Name(String),
    /// The ownership table is full of actors in use.
    Full { limit: usize },
}

/// Marks an actor in use by a request; dropping it records the time, from
/// which idleness is counted.
#[derive(Debug)]
pub struct InUse {
    cell: Arc<Cell>,
    epoch: u64,
}

impl InUse {
    /// The epoch the actor was routed here in: a request that ran is
    /// acknowledged only if the node still acts in it (a node whose lease
    /// lapsed meanwhile may have lost the actor to another node, even if it
    /// acts again in a new epoch by the time the request ends).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.cell.last_used_ms.store(now_ms(), Ordering::Release);
        self.cell.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug, Default)]
struct Cell {
    slot: tokio::sync::Mutex<Slot>,
    in_flight: AtomicUsize,
    last_used_ms: AtomicU64,
    /// A copy of `slot.held`, readable without the slot's lock (which a
    /// take holds across the bucket's round trips): what an actor's turn
    /// tags its alarm index entries with.
    held_copy: std::sync::Mutex<Option<Held>>,
    /// The actor came here by a hand-over (a drain's or a give's,
    /// [`Ownership::mark_moved_in`]) and has not been released since: a
    /// rebalancing move never picks it (no rebalancing move of an actor
    /// right after another move of it; a drain moves every actor, ADR 0072).
    moved_in: std::sync::atomic::AtomicBool,
    /// A hand-over holds the slot ([`Ownership::hand_over`]): the alarm
    /// gate does not wait on it (the alarm runs where the actor goes).
    handing_over: std::sync::atomic::AtomicBool,
    /// The epoch in which the bucket's hold may name this node while the
    /// cell says it is not held, and since when (this node's clock): a take
    /// under way or one that failed after a write (its answer lost, or the
    /// take dropped midway), a release that failed. Nobody else can take
    /// such an actor, and only this node would learn so, at its next request
    /// here. The sweep counts it as this node's own
    /// ([`Ownership::sweep_own_ids`]), so that its alarm is delivered here,
    /// which takes it again or finds its owner; [`Ownership::settle_marks`]
    /// looks it up once it has waited [`SETTLE_AFTER_MS`]. A hold set, a
    /// take or lookup that finds another owner or none, and a take that
    /// wrote nothing (back to what the cell had before it) clear it.
    maybe_held: std::sync::Mutex<Option<Mark>>,
}

impl Cell {
    /// Sets the hold, and its copy, together. A hold that ends forgets
    /// that the actor was moved in.
    fn set_held(&self, slot: &mut Slot, held: Option<Held>) {
        slot.held = held;
        *self.held_copy.lock().expect("held copy") = held;
        if held.is_none() {
            self.moved_in.store(false, Ordering::Release);
        } else {
            self.set_maybe_held(None);
        }
    }

    /// Marks (in `epoch`, from now) or clears the chance that the bucket's
    /// hold names this node while the cell does not hold the actor.
    fn set_maybe_held(&self, epoch: Option<u64>) {
        self.restore_mark(epoch.map(|epoch| Mark {
            epoch,
            since_ms: now_ms(),
        }));
    }

    fn restore_mark(&self, mark: Option<Mark>) {
        *self.maybe_held.lock().expect("maybe held") = mark;
    }

    fn mark(&self) -> Option<Mark> {
        *self.maybe_held.lock().expect("maybe held")
    }

    fn maybe_held_in(&self, epoch: u64) -> bool {
        self.mark().is_some_and(|m| m.epoch == epoch)
    }

    fn held_in(&self, epoch: u64) -> bool {
        self.held_copy
            .lock()
            .expect("held copy")
            .is_some_and(|h| h.epoch == epoch)
    }
}

/// A cell's maybe-held mark ([`Cell::maybe_held`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    epoch: u64,
    since_ms: u64,
}

/// How long a maybe-held mark waits before the idle releaser looks it up
/// ([`Ownership::settle_marks`]), and again after a lookup that failed:
/// past a bucket call's timeout (`cluster_bucket_timeout_ms`, 2 s by
/// default; a node configured with one above this waits this long only),
/// so that a hold write still in flight when the take was dropped has
/// landed or never will.
pub const SETTLE_AFTER_MS: u64 = 10_000;
/// Marks one pass of the idle releaser settles at most.
pub const SETTLES_PER_PASS_MAX: usize = 32;

/// Marks a cell's hand-over for as long as it lives (a hand-over's future
/// dropped midway leaves no mark behind).
struct HandingOver(Arc<Cell>);

impl HandingOver {
    fn mark(cell: &Arc<Cell>) -> HandingOver {
        cell.handing_over.store(true, Ordering::Release);
        HandingOver(Arc::clone(cell))
    }
}

impl Drop for HandingOver {
    fn drop(&mut self) {
        self.0.handing_over.store(false, Ordering::Release);
    }
}

/// The peer rendezvous hashing picks for `id` among `peers` (id, address):
/// the node a draining node hands the actor to, and sends its requests to
/// while it is free.
fn pick_peer(id: &ActorId, peers: &[(String, String)]) -> Option<(String, String)> {
    let names: Vec<String> = peers.iter().map(|(n, _)| n.clone()).collect();
    let pick = wasmkeep_cluster::sweep::rendezvous(&id.to_string(), &names)?;
    peers.iter().find(|(n, _)| n == pick).cloned()
}

/// What became of one hand-over ([`Ownership::hand_over`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandOver {
    /// Released here, and the node asked took it.
    Moved,
    /// Released here; the node asked did not take it, or did not answer
    /// within the bound (the actor's next request takes it wherever it
    /// arrives).
    NotTaken,
    /// The release failed (it may still have landed); nobody was asked.
    ReleaseFailed,
    /// Still busy at the bound ([`DRAIN_ACTOR_WAIT_MS`]): still held here.
    /// The alarm gate said no to its due alarm meanwhile (the hand-over
    /// held it), which took it out of the node's timer: the caller puts it
    /// back ([`wasmkeep_runtime::Alarms::look`]).
    Busy,
    /// Not held here, or this node does not act.
    NotHeld,
}

#[derive(Debug, Default)]
struct Slot {
    held: Option<Held>,
    owner: Option<Owner>,
    /// The owner a forward just failed to reach (or that refused the
    /// request as not its own): the next route waits for it to let go.
    unreachable: Option<String>,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    generation: u64,
    epoch: u64,
}

#[derive(Debug, Clone)]
struct Owner {
    node: String,
    address: String,
    until_ms: u64,
}

/// Counters for `/metrics` and `/admin/v1/node`.
#[derive(Debug, Default)]
pub struct OwnershipCounters {
    pub takes_total: Counter,
    pub takeovers_total: Counter,
    pub take_failures_total: Counter,
    pub fences_total: Counter,
    pub releases_total: Counter,
    pub forwards_total: Counter,
    pub forward_failures_total: Counter,
    pub moves_out_total: Counter,
    pub moves_in_total: Counter,
}

impl OwnershipCounters {
    /// Registers the counters in `r` (under names without `_total`, which
    /// the library appends).
    pub fn register(&self, r: &mut Registry) {
        let series: [(&str, &Counter, &str); 9] = [
            (
                "wasmkeep_cluster_takes",
                &self.takes_total,
                "Actors this node took (hold created).",
            ),
            (
                "wasmkeep_cluster_takeovers",
                &self.takeovers_total,
                "Takes whose previous hold named another node or epoch.",
            ),
            (
                "wasmkeep_cluster_take_failures",
                &self.take_failures_total,
                "Takes that failed (bucket, lost race, live holder).",
            ),
            (
                "wasmkeep_cluster_fences",
                &self.fences_total,
                "Lapsed nodes this node fenced to take their actors.",
            ),
            (
                "wasmkeep_cluster_releases",
                &self.releases_total,
                "Holds this node released (idle actors, shutdown).",
            ),
            (
                "wasmkeep_cluster_forwards",
                &self.forwards_total,
                "Requests forwarded to their owner.",
            ),
            (
                "wasmkeep_cluster_forward_failures",
                &self.forward_failures_total,
                "Forwards that failed (owner unreachable, timed out, not the owner).",
            ),
            (
                "wasmkeep_cluster_moves_out",
                &self.moves_out_total,
                "Actors this node handed to another node that took them (drain, rebalancing).",
            ),
            (
                "wasmkeep_cluster_moves_in",
                &self.moves_in_total,
                "Actors another node handed to this one (drain, rebalancing).",
            ),
        ];
        for (name, counter, help) in series {
            metrics::register(r, name, help, None, counter.clone());
        }
    }
}

/// The node's ownership table and the settings that drive it.
#[derive(Debug)]
pub struct Ownership {
    node: String,
    driver: BucketDriver,
    settings: ClusterSettings,
    prefix_bytes: usize,
    cells: Mutex<HashMap<ActorId, Arc<Cell>>>,
    /// Other nodes' live lease records the takes read: a take whose holder
    /// is known live in the hold's epoch forwards without reading its lease
    /// again (one owner lookup is then a listing and a read of the holds).
    known: Arc<KnownLeases>,
    /// While the node drains (`wasmkeep drain`): the other live nodes, by
    /// id, with their addresses. It takes no actor then: a request for one
    /// it does not hold goes to the actor's owner, or, if no live node has
    /// it, to one of these, which takes it.
    moving_out: Mutex<Option<Vec<(String, String)>>>,
    pub counters: OwnershipCounters,
}

impl Ownership {
    /// The lease records and ended epochs this node's takes keep
    /// ([`KnownLeases`]), which the sweep's listing of `nodes/` adds to.
    pub(crate) fn known_leases(&self) -> Arc<KnownLeases> {
        Arc::clone(&self.known)
    }

    pub(super) fn new(
        node: &str,
        driver: BucketDriver,
        settings: ClusterSettings,
        prefix_bytes: usize,
    ) -> Ownership {
        Ownership {
            node: node.to_owned(),
            driver,
            settings,
            prefix_bytes,
            cells: Mutex::new(HashMap::new()),
            known: Arc::new(KnownLeases::new()),
            moving_out: Mutex::new(None),
            counters: OwnershipCounters::default(),
        }
    }

    pub(super) fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    /// Whether the node holds `id` in `epoch`; `touch` counts this as a use
    /// (an alarm about to run), from which idleness is measured. A cell
    /// being taken or released counts as not held.
    pub fn holds(&self, id: &ActorId, epoch: u64, touch: bool) -> bool {
        let Some(cell) = self.cells.lock().expect("cells").get(id).cloned() else {
            return false;
        };
        let held = cell
            .slot
            .try_lock()
            .is_ok_and(|s| s.held.is_some_and(|h| h.epoch == epoch));
        if held && touch {
            cell.last_used_ms.store(now_ms(), Ordering::Release);
        }
        held
    }

    /// The generation of this node's hold of `id`, if it holds it in
    /// `epoch`. Never waits for the actor's slot.
    pub fn generation(&self, id: &ActorId, epoch: u64) -> Option<u64> {
        let cell = self.cells.lock().expect("cells").get(id).cloned()?;
        let held = *cell.held_copy.lock().expect("held copy");
        held.filter(|h| h.epoch == epoch).map(|h| h.generation)
    }

    /// The actors this node holds in `epoch`, from each cell's copy of its
    /// hold (never waiting on a slot a route holds).
    pub(crate) fn held_ids(&self, epoch: u64) -> Vec<ActorId> {
        self.all_cells()
            .into_iter()
            .filter(|(_, c)| c.held_in(epoch))
            .map(|(id, _)| id)
            .collect()
    }

    /// The actors whose overdue alarm entries this node's sweep delivers
    /// whatever their shard: those it holds in `epoch`, and those whose
    /// hold in the bucket may name it in `epoch` though it does not hold
    /// them (a take that failed, a release that did not land).
    pub(crate) fn sweep_own_ids(&self, epoch: u64) -> Vec<ActorId> {
        self.all_cells()
            .into_iter()
            .filter(|(_, c)| c.held_in(epoch) || c.maybe_held_in(epoch))
            .map(|(id, _)| id)
            .collect()
    }

    /// Actors this node holds in `epoch`, from each cell's copy of its
    /// hold: an actor a request or a take holds the slot of at this instant
    /// is counted as what it is (a drain waits for this to reach 0, and a
    /// giver stops at the share by it: skipping busy slots made both
    /// undercount).
    pub fn held(&self, epoch: u64) -> usize {
        let cells: Vec<Arc<Cell>> = self
            .cells
            .lock()
            .expect("cells")
            .values()
            .cloned()
            .collect();
        cells.iter().filter(|c| c.held_in(epoch)).count()
    }

    fn root(&self, id: &ActorId) -> Result<String, RouteError> {
        ActorRoot::new(id, self.prefix_bytes)
            .map(|r| r.as_str().to_owned())
            .map_err(|e| RouteError::Name(e.to_string()))
    }

    /// The actor's cell, made if needed; past `cluster_actors_max` cells,
    /// those neither held nor in use are dropped first.
    fn cell(&self, id: &ActorId) -> Result<Arc<Cell>, RouteError> {
        let mut cells = self.cells.lock().expect("cells");
        if let Some(c) = cells.get(id) {
            return Ok(Arc::clone(c));
        }
        let limit = self.settings.actors_max;
        if cells.len() >= limit {
            cells.retain(|_, c| {
                Arc::strong_count(c) > 1
                    || c.maybe_held.lock().expect("maybe held").is_some()
                    || c.slot.try_lock().map_or(true, |s| s.held.is_some())
            });
            if cells.len() >= limit {
                return Err(RouteError::Full { limit });
            }
        }
        let c = Arc::new(Cell::default());
        cells.insert(id.clone(), Arc::clone(&c));
        Ok(c)
    }

    /// Where a request for `id` runs. `acting_epoch` is the epoch whose lease
    /// lets the node act now. A `forwarded` request is never forwarded again:
    /// the node takes the actor if it has no live owner, or refuses.
    pub async fn route(
        &self,
        id: &ActorId,
        acting_epoch: impl Fn() -> Option<u64>,
        forwarded: bool,
    ) -> Result<Route, RouteError> {
        let root = self.root(id)?;
        let cell = self.cell(id)?;
        let mut slot = cell.slot.lock().await;
        let epoch = acting_epoch().ok_or(RouteError::NotActing)?;
        let local = |cell: &Arc<Cell>| {
            cell.in_flight.fetch_add(1, Ordering::AcqRel);
            cell.last_used_ms.store(now_ms(), Ordering::Release);
            Route::Local(InUse {
                cell: Arc::clone(cell),
                epoch,
            })
        };
        if slot.held.is_some_and(|h| h.epoch == epoch) {
            return Ok(local(&cell));
        }
        cell.set_held(&mut slot, None);
        if !forwarded
            && let Some(o) = &slot.owner
            && now_ms() < o.until_ms
        {
            return Ok(Route::Forward {
                node: o.node.clone(),
                address: o.address.clone(),
            });
        }
        slot.owner = None;
        if let Some(peers) = self.moving_out_peers() {
            let away = self.route_away(
                id,
                &cell,
                &root,
                &mut slot,
                peers,
                epoch,
                forwarded,
                &acting_epoch,
            );
            return match away.await? {
                Away::Forward { node, address } => Ok(Route::Forward { node, address }),
                Away::Held(held) => {
                    cell.set_held(&mut slot, Some(held));
                    Ok(local(&cell))
                }
            };
        }
        let unreachable = slot.unreachable.take();
        // Marked before the take: a take dropped midway (an alarm gate's
        // timeout, a client gone) may still land its hold.
        let before = cell.mark();
        cell.set_maybe_held(Some(epoch));
        let taken = self
            .take_waiting(&root, epoch, &acting_epoch, unreachable.as_deref())
            .await;
        taken.settle_mark(&cell, before);
        match taken {
            Taken::Held(held) => {
                cell.set_held(&mut slot, Some(held));
                Ok(local(&cell))
            }
            Taken::Owner { node, address } if forwarded => {
                tracing::debug!(actor = %id, owner = node, address, "forwarded here, owned elsewhere");
                Err(RouteError::NotOwner { owner: Some(node) })
            }
            Taken::Owner { node, address } => {
                let until_ms = now_ms() + self.settings.owner_cache_ttl_ms;
                slot.owner = Some(Owner {
                    node: node.clone(),
                    address: address.clone(),
                    until_ms,
                });
                Ok(Route::Forward { node, address })
            }
            Taken::LostRace => Err(RouteError::TakeFailed("LostRace".into())),
            Taken::Failed { why, .. } => Err(RouteError::TakeFailed(why)),
        }
    }

    /// Where a request for an actor this draining node does not hold goes:
    /// its owner, found by a lookup that writes nothing; if no live node
    /// has it, the peer rendezvous hashing picks among `peers` (but the one
    /// a forward just failed to reach), which takes it. A forwarded request
    /// is refused then (the forwarding node takes the actor). If the
    /// bucket still names this node (a release that failed), it takes the
    /// actor again, for a request from anywhere: the next round of the
    /// drain releases it.
    #[allow(
        clippy::too_many_arguments,
        reason = "the route's own state, passed down"
    )]
    async fn route_away(
        &self,
        id: &ActorId,
        cell: &Cell,
        root: &str,
        slot: &mut Slot,
        peers: Vec<(String, String)>,
        epoch: u64,
        forwarded: bool,
        acting_epoch: &impl Fn() -> Option<u64>,
    ) -> Result<Away, RouteError> {
        let unreachable = slot.unreachable.take();
        let looked = self.look_up(root, epoch).await;
        if matches!(looked, Looked::Owner { .. } | Looked::Free) {
            // The bucket names another node or none: no hold of this one.
            cell.set_maybe_held(None);
        }
        let (node, address) = match looked {
            Looked::Mine => {
                // The bucket names this node: marked whatever the take does.
                cell.set_maybe_held(Some(epoch));
                let taken = self.take_waiting(root, epoch, acting_epoch, None).await;
                taken.settle_mark(cell, cell.mark());
                return match taken {
                    Taken::Held(held) => Ok(Away::Held(held)),
                    Taken::Owner { node, .. } if forwarded => {
                        Err(RouteError::NotOwner { owner: Some(node) })
                    }
                    Taken::Owner { node, address } => Ok(Away::Forward { node, address }),
                    Taken::LostRace => Err(RouteError::TakeFailed("LostRace".into())),
                    Taken::Failed { why, .. } => Err(RouteError::TakeFailed(why)),
                };
            }
            Looked::Owner { node, .. } if forwarded => {
                return Err(RouteError::NotOwner { owner: Some(node) });
            }
            Looked::Free if forwarded => return Err(RouteError::NotOwner { owner: None }),
            Looked::Owner { node, address } => (node, address),
            Looked::Free => {
                let mut peers = peers;
                if peers.len() > 1 {
                    peers.retain(|(n, _)| Some(n) != unreachable.as_ref());
                }
                pick_peer(id, &peers).ok_or(RouteError::NotActing)?
            }
            Looked::Failed(why) => return Err(RouteError::TakeFailed(why)),
        };
        slot.owner = Some(Owner {
            node: node.clone(),
            address: address.clone(),
            until_ms: now_ms() + self.settings.owner_cache_ttl_ms,
        });
        Ok(Away::Forward { node, address })
    }

    /// Drives a lookup-only [`TakeMachine`]: who owns the actor, writing
    /// nothing.
    async fn look_up(&self, root: &str, epoch: u64) -> Looked {
        let mut m = self.take_machine(root, epoch).lookup_only();
        loop {
            match m.poll_effect(Some(epoch)) {
                Some(TakeEffect::Bucket(op)) => {
                    let result = self.driver.perform(op).await;
                    m.on_result(result, now_ms());
                }
                Some(TakeEffect::Done(TakeOutcome::Forward { node })) => {
                    return match m.forward_address() {
                        _ if node == self.node => Looked::Mine,
                        Some(address) => Looked::Owner {
                            address: address.to_owned(),
                            node,
                        },
                        None => Looked::Failed(format!("owner `{node}` has no address")),
                    };
                }
                Some(TakeEffect::Done(TakeOutcome::Free)) => return Looked::Free,
                Some(TakeEffect::Done(outcome)) => {
                    return Looked::Failed(format!("lookup: {outcome:?}"));
                }
                Some(TakeEffect::Fenced { .. } | TakeEffect::Restore { .. }) | None => {
                    debug_assert!(false, "a lookup writes and restores nothing");
                    return Looked::Failed("lookup".into());
                }
            }
        }
    }

    /// The peers a draining node sends actors to, or `None` when it is not
    /// draining.
    fn moving_out_peers(&self) -> Option<Vec<(String, String)>> {
        self.moving_out.lock().expect("moving out").clone()
    }

    /// Starts (with the other live nodes and their addresses) or ends
    /// (`None`) the drain: see [`Ownership::drain_held`].
    pub fn set_moving_out(&self, peers: Option<Vec<(String, String)>>) {
        *self.moving_out.lock().expect("moving out") = peers;
    }

    /// A drain's fresh list of peers, if the node still drains (an end of
    /// the drain that came meanwhile stands).
    pub fn refresh_peers(&self, peers: Vec<(String, String)>) {
        if let Some(p) = self.moving_out.lock().expect("moving out").as_mut() {
            *p = peers;
        }
    }

    /// Whether the node drains.
    pub fn is_moving_out(&self) -> bool {
        self.moving_out.lock().expect("moving out").is_some()
    }

    /// One round of a drain: hands every actor held in the acting epoch
    /// over, one at a time, while the node drains, each to the peer
    /// rendezvous hashing picks for it among the drain's peers (the one a
    /// request for it would go to once it is free): see
    /// [`Ownership::hand_over`], `ask` being the call that asks a peer to
    /// take it; `busy` is told of an actor that stays here (see
    /// [`HandOver::Busy`]). An actor still busy at the bound is left alone for a while
    /// (`later`: one second, doubling after each time in a row, at most
    /// [`DRAIN_BUSY_BACKOFF_MAX_MS`]), so that its requests run meanwhile.
    /// Returns how many were released.
    pub async fn drain_held<F, T>(
        &self,
        acting_epoch: impl Fn() -> Option<u64>,
        close: impl Fn(ActorId) -> F,
        ask: impl Fn(ActorId, String, String) -> T,
        busy: impl Fn(&ActorId),
        later: &mut HashMap<ActorId, (u64, u32)>,
    ) -> usize
    where
        F: std::future::Future<Output = bool>,
        T: std::future::Future<Output = bool>,
    {
        let mut released = 0;
        // Peers that did not take an actor this round (dead, stopping,
        // draining themselves): not asked again until the next round, so
        // that one unreachable peer costs one take's timeout, not one per
        // actor; with none left, the rest wait for the next round.
        let mut refused: Vec<String> = Vec::new();
        for (id, cell) in self.all_cells() {
            let Some(mut peers) = self.moving_out_peers() else {
                break;
            };
            peers.retain(|(n, _)| !refused.contains(n));
            let Some(epoch) = acting_epoch() else {
                break;
            };
            // Not held (the copy, without waiting on a slot a route holds),
            // or left alone for a while.
            if !cell.held_in(epoch) || later.get(&id).is_some_and(|(until, _)| now_ms() < *until) {
                continue;
            }
            let Some((node, address)) = pick_peer(&id, &peers) else {
                break;
            };
            let to = (node.as_str(), address.as_str());
            let asked = || ask(id.clone(), node.clone(), address.clone());
            match self.hand_over(&id, &acting_epoch, &close, to, asked).await {
                HandOver::Busy => {
                    // Still here: its alarm's timer entry, which the gate
                    // dropped while the hand-over held it, is put back.
                    busy(&id);
                    let times = later.get(&id).map_or(0, |(_, n)| *n).saturating_add(1);
                    let wait = wasmkeep_cluster::retry::RetryPolicy {
                        first_ms: 1_000,
                        max_ms: DRAIN_BUSY_BACKOFF_MAX_MS,
                        retries_max: None,
                    }
                    .delay_ms(times);
                    later.insert(id.clone(), (now_ms() + wait, times));
                    tracing::warn!(actor = %id, wait_ms = wait, "drain: the actor stayed busy; tried again later");
                }
                HandOver::Moved => {
                    later.remove(&id);
                    released += 1;
                    tracing::info!(actor = %id, to = node, "drain: handed the actor over");
                }
                HandOver::ReleaseFailed => {
                    tracing::warn!(actor = %id, "drain: the release failed; the idle releaser looks it up again");
                }
                HandOver::NotTaken => {
                    later.remove(&id);
                    released += 1;
                    refused.push(node.clone());
                    tracing::info!(actor = %id, peer = node, "drain: released the actor; the peer did not take it");
                }
                HandOver::NotHeld => {
                    later.remove(&id);
                }
            }
        }
        released
    }

    /// Hands the actor `id` this node holds to the node `to` (its id and
    /// address): its new requests wait on its slot while those running
    /// finish and the runtime closes it (`close`: true once it is closed,
    /// its queued events run, its commits uploaded and its sockets gone),
    /// at most [`DRAIN_ACTOR_WAIT_MS`]; then its hold is released and,
    /// still under the slot, `ask` asks `to` to take it (true: it did).
    /// The requests that waited then go to `to` (cached as the owner), or,
    /// if it did not take the actor, to whichever node takes it first
    /// (this one too). The receiving node opens the actor at once, so that
    /// its alarm is timed there (ADR 0072).
    pub(crate) async fn hand_over<F, T>(
        &self,
        id: &ActorId,
        acting_epoch: &impl Fn() -> Option<u64>,
        close: &impl Fn(ActorId) -> F,
        (to, address): (&str, &str),
        ask: impl FnOnce() -> T,
    ) -> HandOver
    where
        F: std::future::Future<Output = bool>,
        T: std::future::Future<Output = bool>,
    {
        let Some(cell) = self.cells.lock().expect("cells").get(id).cloned() else {
            return HandOver::NotHeld;
        };
        // Marked until this returns (or its future is dropped).
        let _marked = HandingOver::mark(&cell);
        let mut slot = cell.slot.lock().await;
        let Some(epoch) = acting_epoch() else {
            return HandOver::NotHeld;
        };
        let Some(held) = slot.held.filter(|h| h.epoch == epoch) else {
            return HandOver::NotHeld;
        };
        let Ok(root) = self.root(id) else {
            return HandOver::NotHeld;
        };
        let end = now_ms() + DRAIN_ACTOR_WAIT_MS;
        let mut idle = false;
        while now_ms() < end {
            if cell.in_flight.load(Ordering::Acquire) == 0 && close(id.clone()).await {
                idle = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(DRAIN_POLL_MS)).await;
        }
        if !idle {
            return HandOver::Busy;
        }
        cell.set_held(&mut slot, None);
        slot.owner = None;
        if !self.release(&root, held, acting_epoch).await {
            cell.set_maybe_held(Some(held.epoch));
            // It may still have landed: the actor is not held here any
            // more either way. If the bucket still names this node, the
            // next request's take (or a drain's lookup) says so and this
            // node takes it again, and the idle releaser settles the mark
            // (`settle_marks`); nobody else is asked to meanwhile.
            return HandOver::ReleaseFailed;
        }
        if !ask().await {
            return HandOver::NotTaken;
        }
        self.counters.moves_out_total.inc();
        slot.owner = Some(Owner {
            node: to.to_owned(),
            address: address.to_owned(),
            until_ms: now_ms() + self.settings.owner_cache_ttl_ms,
        });
        HandOver::Moved
    }

    /// Whether a hand-over holds `id`'s slot now.
    pub(crate) fn handing_over(&self, id: &ActorId) -> bool {
        self.cells
            .lock()
            .expect("cells")
            .get(id)
            .is_some_and(|c| c.handing_over.load(Ordering::Acquire))
    }

    /// Up to `n` actors held in `epoch` that a rebalancing move may hand
    /// over: not moved here by one (never two moves of one actor in a row),
    /// not running a request now (its requests would wait for the move)
    /// and not `excluded` (the caller's: a closed class's, one with
    /// WebSockets, one already tried), the most recently used first
    /// (those carry the load; an actor long unused is about to be released
    /// anyway).
    pub(crate) fn to_give(
        &self,
        epoch: u64,
        n: usize,
        excluded: impl Fn(&ActorId) -> bool,
    ) -> Vec<ActorId> {
        let mut held: Vec<(u64, ActorId)> = self
            .all_cells()
            .into_iter()
            .filter(|(id, c)| {
                c.held_in(epoch)
                    && !c.moved_in.load(Ordering::Acquire)
                    && c.in_flight.load(Ordering::Acquire) == 0
                    && !excluded(id)
            })
            .map(|(id, c)| (c.last_used_ms.load(Ordering::Acquire), id))
            .collect();
        held.sort_by_key(|h| std::cmp::Reverse(h.0));
        held.into_iter().take(n).map(|(_, id)| id).collect()
    }

    /// Marks `id`, just taken here at another node's request, as moved in
    /// ([`Ownership::to_give`] leaves it until it is released).
    pub(crate) fn mark_moved_in(&self, id: &ActorId) {
        if let Some(cell) = self.cells.lock().expect("cells").get(id) {
            cell.moved_in.store(true, Ordering::Release);
            self.counters.moves_in_total.inc();
        }
    }

    /// Drops the cached owner of `id` if it is `node` (a forward to it
    /// failed, or it answered that it does not own the actor), and
    /// remembers it so that the next route waits a little for it to release
    /// the actor. Another cached owner (one a concurrent request found
    /// since) stays, and so does the mark of an earlier failure.
    pub fn forget_owner(&self, id: &ActorId, node: &str) {
        // Its lease is read again at the next take of any of its actors.
        self.known.forget(node);
        let cell = self.cells.lock().expect("cells").get(id).cloned();
        if let Some(cell) = cell
            && let Ok(mut slot) = cell.slot.try_lock()
            && slot.owner.as_ref().is_some_and(|o| o.node == node)
        {
            slot.owner = None;
            slot.unreachable = Some(node.to_owned());
        }
    }

    /// Keeps the cached owner of `id` for another `cluster_owner_cache_ttl_ms`
    /// if it is `node`: that node just ran a forwarded request for the actor
    /// (its answer carries its node header), which proves it the owner as
    /// well as reading the bucket would. An actor forwarded to without a gap
    /// of a TTL is then never looked up again; a stale entry still goes at
    /// the first refusal or failed forward, and one naming a stopping node
    /// still ends within a TTL of its last answer (the node's linger).
    pub fn confirm_owner(&self, id: &ActorId, node: &str) {
        let cell = self.cells.lock().expect("cells").get(id).cloned();
        if let Some(cell) = cell
            && let Ok(mut slot) = cell.slot.try_lock()
            && let Some(owner) = slot.owner.as_mut()
            && owner.node == node
        {
            owner.until_ms = owner
                .until_ms
                .max(now_ms() + self.settings.owner_cache_ttl_ms);
        }
    }

    /// [`Self::take`], again while the bucket still names `unreachable` as
    /// the owner (for at most [`UNREACHABLE_OWNER_WAIT_MS`]: a node stopping
    /// cleanly is about to release its holds; a dead one's lease lapses
    /// later, and the request fails as before), and up to
    /// [`LOST_RACE_RETRIES`] times after losing the race to create the hold
    /// (two nodes taking an actor another just released: the winner is
    /// then the owner to forward to).
    async fn take_waiting(
        &self,
        root: &str,
        epoch: u64,
        acting: &impl Fn() -> Option<u64>,
        unreachable: Option<&str>,
    ) -> Taken {
        let end = now_ms() + UNREACHABLE_OWNER_WAIT_MS;
        let mut pause = UNREACHABLE_OWNER_POLL_MS;
        let mut lost_races = 0;
        loop {
            let taken = self.take(root, epoch, acting).await;
            match &taken {
                Taken::LostRace if lost_races < LOST_RACE_RETRIES => {
                    if lost_races > 0 {
                        let wait = UNREACHABLE_OWNER_POLL_MS * u64::from(lost_races);
                        tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
                    }
                    lost_races += 1;
                }
                Taken::Owner { node, .. }
                    if unreachable == Some(node.as_str()) && now_ms() + pause < end =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                    pause = (pause * 2).min(UNREACHABLE_OWNER_POLL_MAX_MS);
                }
                _ => return taken,
            }
        }
    }

    /// A take of the actor at `root` by this node in `epoch`, with the
    /// node's kept lease records.
    fn take_machine(&self, root: &str, epoch: u64) -> TakeMachine {
        TakeMachine::new(
            &self.node,
            epoch,
            root,
            None,
            nonce(),
            self.settings.protocol.clone(),
        )
        .with_known_leases(Arc::clone(&self.known))
    }

    /// Drives one [`TakeMachine`] to its end.
    async fn take(&self, root: &str, epoch: u64, acting: &impl Fn() -> Option<u64>) -> Taken {
        let mut m = self.take_machine(root, epoch);
        let mut takeover = false;
        let mut wrote = false;
        let outcome = loop {
            let Some(effect) = m.poll_effect(acting()) else {
                debug_assert!(false, "the take waits for nothing this driver owes it");
                break TakeOutcome::Failed(wasmkeep_cluster::machine::Failure::Bucket);
            };
            match effect {
                TakeEffect::Bucket(op) => {
                    wrote |= op.is_write();
                    let result = self.driver.perform(op).await;
                    m.on_result(result, now_ms());
                }
                TakeEffect::Fenced { node, epoch } => {
                    self.counters.fences_total.inc();
                    tracing::warn!(node, epoch, "fenced a lapsed node to take its actor");
                }
                TakeEffect::Restore {
                    generation,
                    takeover: t,
                } => {
                    // The runtime restores when it opens the actor (see the
                    // module's documentation).
                    tracing::debug!(root, generation, takeover = t, "hold created");
                    takeover = t;
                    m.on_restored(true);
                }
                TakeEffect::Done(outcome) => break outcome,
            }
        };
        match outcome {
            TakeOutcome::Mine { generation } => Taken::Held(Held { generation, epoch }),
            TakeOutcome::Taken { generation } => {
                self.counters.takes_total.inc();
                if takeover {
                    self.counters.takeovers_total.inc();
                }
                tracing::info!(root, generation, takeover, "took actor");
                Taken::Held(Held { generation, epoch })
            }
            TakeOutcome::Forward { node } => match m.forward_address() {
                Some(address) if node != self.node => Taken::Owner {
                    address: address.to_owned(),
                    node,
                },
                _ => {
                    self.counters.take_failures_total.inc();
                    Taken::Failed {
                        why: format!("owner `{node}` has no address to forward to"),
                        wrote,
                    }
                }
            },
            TakeOutcome::Free => {
                debug_assert!(false, "a take is no lookup");
                Taken::Failed {
                    why: "a lookup's outcome".into(),
                    wrote,
                }
            }
            TakeOutcome::Failed(failure) => {
                self.counters.take_failures_total.inc();
                if failure == wasmkeep_cluster::machine::Failure::LostRace {
                    return Taken::LostRace;
                }
                Taken::Failed {
                    why: format!("{failure:?}"),
                    wrote,
                }
            }
        }
    }

    /// Every actor the table knows, with its cell (a copy, so that no
    /// lock on the table is held across an await).
    fn all_cells(&self) -> Vec<(ActorId, Arc<Cell>)> {
        self.cells
            .lock()
            .expect("cells")
            .iter()
            .map(|(id, c)| (id.clone(), Arc::clone(c)))
            .collect()
    }

    /// Releases the actors held in `epoch` that are idle (no request for
    /// `idle_ms`; 0: all that are not in use) unless `keep` says otherwise
    /// (an actor with an alarm pending here stays held, so that its alarm
    /// runs), and forgets holds of other epochs and stale owners. Returns
    /// how many it released.
    pub async fn release_idle(
        &self,
        idle_ms: u64,
        acting_epoch: impl Fn() -> Option<u64>,
        keep: impl Fn(&ActorId) -> bool,
    ) -> usize {
        let cells = self.all_cells();
        let mut released = 0;
        for (id, cell) in cells {
            let Ok(mut slot) = cell.slot.try_lock() else {
                continue;
            };
            let now = now_ms();
            if slot.owner.as_ref().is_some_and(|o| now >= o.until_ms) {
                slot.owner = None;
            }
            let Some(held) = slot.held else {
                continue;
            };
            let Some(epoch) = acting_epoch() else {
                continue;
            };
            if held.epoch != epoch {
                // The lease that held it ended: nothing to write.
                cell.set_held(&mut slot, None);
                continue;
            }
            let idle = now.saturating_sub(cell.last_used_ms.load(Ordering::Acquire));
            if cell.in_flight.load(Ordering::Acquire) > 0 || idle < idle_ms || keep(&id) {
                continue;
            }
            let Ok(root) = self.root(&id) else {
                continue;
            };
            // Whatever the outcome, the node gives the actor up; a release
            // that failed may leave the bucket naming it.
            cell.set_held(&mut slot, None);
            if self.release(&root, held, &acting_epoch).await {
                released += 1;
                tracing::info!(actor = %id, idle_ms = idle, "released idle actor");
            } else {
                cell.set_maybe_held(Some(held.epoch));
            }
        }
        released
    }

    /// Settles the actors this node does not hold but whose hold may name
    /// it ([`Cell::maybe_held`]), at most [`SETTLES_PER_PASS_MAX`] a call,
    /// each once its mark has waited [`SETTLE_AFTER_MS`] and it is idle
    /// for `idle_ms`: a lookup says. Named here: taken and released (a
    /// failed release retried; the take writes a hold of its own first);
    /// named elsewhere or nowhere: the mark goes; the bucket not answering:
    /// the mark waits again. A mark of an earlier epoch goes (its holds are
    /// dead). Called by the idle releaser's pass only (not by a class's
    /// closing or the node's stop, which should not wait on lookups).
    /// Returns how many holds it released.
    pub async fn settle_marks(
        &self,
        idle_ms: u64,
        acting_epoch: impl Fn() -> Option<u64>,
    ) -> usize {
        let mut released = 0;
        let mut settled = 0;
        // Only the marked cells are copied (usually none): the table's lock
        // is held for a scan, not for a copy of every id.
        let marked: Vec<(ActorId, Arc<Cell>)> = self
            .cells
            .lock()
            .expect("cells")
            .iter()
            .filter(|(_, c)| c.mark().is_some())
            .map(|(id, c)| (id.clone(), Arc::clone(c)))
            .collect();
        for (id, cell) in marked {
            if settled >= SETTLES_PER_PASS_MAX {
                break;
            }
            let Some(epoch) = acting_epoch() else {
                return released;
            };
            // Under the slot: a route's take of this actor, which marks it,
            // holds the slot.
            let Ok(mut slot) = cell.slot.try_lock() else {
                continue;
            };
            let Some(mark) = cell.mark() else {
                continue;
            };
            if mark.epoch != epoch {
                cell.restore_mark(None);
                continue;
            }
            let now = now_ms();
            let idle = now.saturating_sub(cell.last_used_ms.load(Ordering::Acquire));
            if slot.held.is_some()
                || now < mark.since_ms + SETTLE_AFTER_MS
                || cell.in_flight.load(Ordering::Acquire) > 0
                || idle < idle_ms
            {
                continue;
            }
            settled += 1;
            match self
                .settle_one(&id, &cell, &mut slot, epoch, &acting_epoch)
                .await
            {
                Some(true) => released += 1,
                Some(false) => {}
                // The bucket did not answer: the others wait for a later
                // pass rather than hold up the releaser a lookup each.
                None => break,
            }
        }
        released
    }

    /// [`Ownership::settle_marks`] for one actor: whether it released a
    /// hold, or `None` if the lookup failed.
    async fn settle_one(
        &self,
        id: &ActorId,
        cell: &Cell,
        slot: &mut Slot,
        epoch: u64,
        acting_epoch: &impl Fn() -> Option<u64>,
    ) -> Option<bool> {
        let Ok(root) = self.root(id) else {
            return Some(false);
        };
        match self.look_up(&root, epoch).await {
            Looked::Owner { .. } | Looked::Free => {
                cell.set_maybe_held(None);
                Some(false)
            }
            // Waits again from now.
            Looked::Failed(_) => {
                cell.set_maybe_held(Some(epoch));
                None
            }
            Looked::Mine => {
                cell.set_maybe_held(Some(epoch));
                let taken = self.take_waiting(&root, epoch, acting_epoch, None).await;
                taken.settle_mark(cell, cell.mark());
                let Taken::Held(held) = taken else {
                    return Some(false);
                };
                // Held for the release's sake only: given up at once.
                cell.set_held(slot, Some(held));
                cell.set_held(slot, None);
                if self.release(&root, held, acting_epoch).await {
                    tracing::info!(actor = %id, "released a hold whose release had failed");
                    Some(true)
                } else {
                    cell.set_maybe_held(Some(epoch));
                    None
                }
            }
        }
    }

    /// Drives one [`ReleaseMachine`]; true if the `released` hold landed.
    async fn release(&self, root: &str, held: Held, acting: &impl Fn() -> Option<u64>) -> bool {
        let mut m = ReleaseMachine::new(&self.node, held.epoch, root, held.generation, nonce());
        loop {
            match m.poll_effect(acting()) {
                Some(ReleaseEffect::Bucket(op)) => {
                    let result = self.driver.perform(op).await;
                    m.on_result(result);
                }
                Some(ReleaseEffect::Done(ReleaseOutcome::Released { .. })) => {
                    self.counters.releases_total.inc();
                    return true;
                }
                Some(ReleaseEffect::Done(ReleaseOutcome::Failed(f))) => {
                    tracing::debug!(
                        root,
                        failure = ?f,
                        "release failed; the hold may name this node until its epoch ends"
                    );
                    return false;
                }
                None => return false,
            }
        }
    }
}

/// What a lookup found.
enum Looked {
    Owner {
        node: String,
        address: String,
    },
    /// The bucket's latest hold is this node's, in this epoch.
    Mine,
    Free,
    Failed(String),
}

/// Where a draining node sends a request for an actor it does not hold.
enum Away {
    Forward {
        node: String,
        address: String,
    },
    /// Taken again here (its hold named this node).
    Held(Held),
}

enum Taken {
    Held(Held),
    Owner {
        node: String,
        address: String,
    },
    /// Another node created its hold first.
    LostRace,
    /// The take failed; `wrote`: after a write (a fence, its hold), which
    /// may have landed though its answer did not come.
    Failed {
        why: String,
        wrote: bool,
    },
}

impl Taken {
    /// Settles the maybe-held mark set before the take: a hold found (set
    /// with the hold, which clears it) or found elsewhere and a race lost
    /// leave no hold naming this node; a take that failed after a write may
    /// have left one and keeps the mark; one that wrote nothing leaves the
    /// cell's mark as it was `before` it (a release that failed earlier, or
    /// a lookup that found this node named, still stands).
    fn settle_mark(&self, cell: &Cell, before: Option<Mark>) {
        match self {
            Taken::Held(_) | Taken::Failed { wrote: true, .. } => {}
            Taken::Owner { .. } | Taken::LostRace => cell.set_maybe_held(None),
            Taken::Failed { wrote: false, .. } => cell.restore_mark(before),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmkeep_replica::Bucket;

    fn table(node: &str, bucket: &std::path::Path) -> Ownership {
        let url = format!("file://{}", bucket.display());
        let bucket = Bucket::from_url(&url).unwrap();
        let prefix = bucket.prefix_bytes();
        let settings = ClusterSettings::new(
            "http://127.0.0.1:1",
            None,
            &wasmkeep_runtime::RuntimeConfig::new("unused"),
        );
        Ownership::new(node, BucketDriver::new(bucket, 5_000), settings, prefix)
    }

    fn holds(bucket: &std::path::Path) -> Vec<String> {
        let dir = bucket.join("state/t/app/c/6e/hold");
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// A lease record of `node` (epoch 1) live for an hour, advertising
    /// `http://{node}.example:{port}`.
    fn live_lease(bucket: &std::path::Path, node: &str, port: u16) {
        let lease = bucket.join(format!("nodes/{node}/00000000000000000001"));
        std::fs::create_dir_all(&lease).unwrap();
        let far = now_ms() + 3_600_000;
        std::fs::write(
            lease.join("00000000000000000000"),
            format!("live {far} 0000000000000001 http://{node}.example:{port}"),
        )
        .unwrap();
    }

    fn id() -> ActorId {
        ActorId::new("t", "app", "c", "n").unwrap()
    }

    /// Concurrent first requests share one take: one hold, one take.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_first_requests_share_one_take() {
        let dir = tempfile::tempdir().unwrap();
        let a = Arc::new(table("a", dir.path()));
        let mut routes = Vec::new();
        for _ in 0..8 {
            let a = Arc::clone(&a);
            routes.push(tokio::spawn(async move {
                matches!(a.route(&id(), || Some(1), false).await, Ok(Route::Local(_)))
            }));
        }
        for r in routes {
            assert!(r.await.unwrap());
        }
        assert_eq!(a.counters.takes_total.get(), 1);
        assert_eq!(holds(dir.path()).len(), 1);
        assert!(a.holds(&id(), 1, false));
        assert!(!a.holds(&id(), 2, false), "a hold of another epoch is dead");
    }

    /// Another node whose lease is live owns the actor: requests are routed
    /// to its advertised address, a forwarded one is refused; once the
    /// owner releases the idle actor, the other node takes it at once.
    #[tokio::test]
    async fn a_live_owner_is_forwarded_to_until_it_releases() {
        let dir = tempfile::tempdir().unwrap();
        let a = table("a", dir.path());
        let b = table("b", dir.path());
        live_lease(dir.path(), "a", 7);
        let local = a.route(&id(), || Some(1), false).await.unwrap();
        assert!(matches!(local, Route::Local(_)));
        match b.route(&id(), || Some(1), false).await.unwrap() {
            Route::Forward { node, address } => {
                assert_eq!(
                    (node.as_str(), address.as_str()),
                    ("a", "http://a.example:7")
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            b.route(&id(), || Some(1), true).await.unwrap_err(),
            RouteError::NotOwner {
                owner: Some("a".into())
            }
        );
        // In use: not released.
        assert_eq!(a.release_idle(0, || Some(1), |_| false).await, 0);
        drop(local);
        // An actor to keep (an alarm pending) is not released.
        assert_eq!(a.release_idle(0, || Some(1), |_| true).await, 0);
        assert_eq!(a.release_idle(0, || Some(1), |_| false).await, 1);
        assert!(
            holds(dir.path())
                .last()
                .unwrap()
                .starts_with("released a 1 ")
        );
        // b's cached owner lapses; then b takes the actor without any fence.
        b.forget_owner(&id(), "a");
        let taken = b.route(&id(), || Some(1), false).await.unwrap();
        assert!(matches!(taken, Route::Local(_)));
        assert_eq!(b.counters.fences_total.get(), 0);
        assert_eq!(holds(dir.path()).len(), 3);
    }

    /// The owner `id` is cached with, and until when.
    fn cached_owner(table: &Ownership, id: &ActorId) -> Option<(String, u64)> {
        let cell = table.cells.lock().unwrap().get(id).cloned()?;
        let slot = cell.slot.try_lock().ok()?;
        slot.owner.as_ref().map(|o| (o.node.clone(), o.until_ms))
    }

    /// An answer from the cached owner keeps it cached for another TTL
    /// (no bucket read while an actor is forwarded to steadily); one naming
    /// another node keeps nothing, and a forget still drops it.
    #[tokio::test]
    async fn an_answer_from_the_owner_keeps_it_cached() {
        let dir = tempfile::tempdir().unwrap();
        let a = table("a", dir.path());
        let b = table("b", dir.path());
        live_lease(dir.path(), "a", 7);
        let _local = a.route(&id(), || Some(1), false).await.unwrap();
        let routed = b.route(&id(), || Some(1), false).await.unwrap();
        assert!(matches!(routed, Route::Forward { .. }));
        let (node, first) = cached_owner(&b, &id()).unwrap();
        assert_eq!(node, "a");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        b.confirm_owner(&id(), "c");
        assert_eq!(cached_owner(&b, &id()).unwrap().1, first);
        let asked = now_ms();
        b.confirm_owner(&id(), "a");
        let (_, kept) = cached_owner(&b, &id()).unwrap();
        assert!(kept > first, "{kept} > {first}");
        assert!(kept >= asked + b.settings.owner_cache_ttl_ms);
        b.forget_owner(&id(), "a");
        assert_eq!(cached_owner(&b, &id()), None);
        b.confirm_owner(&id(), "a");
        assert_eq!(cached_owner(&b, &id()), None, "a confirm never caches anew");
    }

    /// A forward to the owner failed (a node stopping cleanly closes its
    /// listener before it releases its holds): the next route waits for the
    /// release and takes the actor instead of forwarding to it again. An
    /// owner that never lets go is forwarded to after the wait, as before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_route_after_a_failed_forward_waits_for_the_owner_to_release() {
        let dir = tempfile::tempdir().unwrap();
        let a = Arc::new(table("a", dir.path()));
        let b = table("b", dir.path());
        for (node, port) in [("a", 7), ("b", 8)] {
            live_lease(dir.path(), node, port);
        }
        drop(a.route(&id(), || Some(1), false).await.unwrap());
        assert!(matches!(
            b.route(&id(), || Some(1), false).await.unwrap(),
            Route::Forward { .. }
        ));
        // Forgetting another node than the one cached changes nothing.
        b.forget_owner(&id(), "c");
        assert!(matches!(
            b.route(&id(), || Some(1), false).await.unwrap(),
            Route::Forward { .. }
        ));
        b.forget_owner(&id(), "a");
        let releaser = {
            let a = Arc::clone(&a);
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                assert_eq!(a.release_idle(0, || Some(1), |_| false).await, 1);
            })
        };
        let routed = b.route(&id(), || Some(1), false).await.unwrap();
        assert!(matches!(routed, Route::Local(_)), "{routed:?}");
        releaser.await.unwrap();
        drop(routed);

        // Now b owns it and never lets go: a waits, then forwards.
        assert!(matches!(
            a.route(&id(), || Some(1), false).await.unwrap(),
            Route::Forward { .. }
        ));
        a.forget_owner(&id(), "b");
        assert!(matches!(
            a.route(&id(), || Some(1), false).await.unwrap(),
            Route::Forward { .. }
        ));
    }

    /// A closure that answers `Some(1)` for its first `n` calls, then
    /// `None`: the lease lapses midway through a take or a release.
    fn acting_for(n: usize) -> impl Fn() -> Option<u64> {
        let calls = std::sync::atomic::AtomicUsize::new(0);
        move || (calls.fetch_add(1, Ordering::AcqRel) < n).then_some(1)
    }

    /// An actor whose hold may name this node though it does not hold it
    /// (a take that failed after a write, a release that did not land) is
    /// the sweep's own until a take or the idle releaser settles it; a take
    /// that wrote nothing, or found another owner, leaves no mark.
    #[tokio::test]
    async fn a_take_or_release_that_failed_leaves_the_actor_to_this_nodes_sweep() {
        let dir = tempfile::tempdir().unwrap();
        let a = table("a", dir.path());
        let b = table("b", dir.path());
        live_lease(dir.path(), "a", 7);
        // The lease lapses before the take writes anything: no mark.
        assert!(a.route(&id(), acting_for(2), false).await.is_err());
        assert!(holds(dir.path()).is_empty());
        assert!(a.sweep_own_ids(1).is_empty());
        // The hold's write fails (a file where its folder goes): as far as
        // a knows, it may have landed.
        let folder = dir.path().join("state/t/app/c/6e/hold");
        std::fs::create_dir_all(folder.parent().unwrap()).unwrap();
        std::fs::write(&folder, "not a folder").unwrap();
        assert!(a.route(&id(), || Some(1), false).await.is_err());
        std::fs::remove_file(&folder).unwrap();
        assert!(!a.holds(&id(), 1, false));
        assert_eq!(a.sweep_own_ids(1), vec![id()]);
        assert!(
            a.sweep_own_ids(2).is_empty(),
            "only in the epoch it failed in"
        );
        // Taken again: held, no longer merely maybe.
        let local = a.route(&id(), || Some(1), false).await.unwrap();
        assert!(matches!(local, Route::Local(_)));
        drop(local);
        assert_eq!(a.held_ids(1), vec![id()]);
        // A release that does not land leaves it the sweep's.
        assert_eq!(a.release_idle(0, acting_for(1), |_| false).await, 0);
        assert!(!a.holds(&id(), 1, false));
        assert_eq!(a.sweep_own_ids(1), vec![id()]);
        // b finds a the owner: nothing of b's is marked.
        assert!(matches!(
            b.route(&id(), || Some(1), false).await.unwrap(),
            Route::Forward { .. }
        ));
        assert!(b.sweep_own_ids(1).is_empty());
        // The idle releaser settles a's mark once it waited: the bucket
        // names a, so it takes the actor and releases it (the failed
        // release retried).
        assert_eq!(a.settle_marks(0, || Some(1)).await, 0, "not yet");
        assert_eq!(a.sweep_own_ids(1), vec![id()]);
        age_marks(&a);
        assert_eq!(a.settle_marks(0, || Some(1)).await, 1);
        assert!(a.sweep_own_ids(1).is_empty(), "settled");
        assert!(
            holds(dir.path())
                .last()
                .unwrap()
                .starts_with("released a 1 ")
        );
        // A mark of an ended epoch just goes.
        let local = a.route(&id(), || Some(1), false).await.unwrap();
        drop(local);
        assert_eq!(a.release_idle(0, acting_for(1), |_| false).await, 0);
        assert_eq!(a.sweep_own_ids(1), vec![id()]);
        assert_eq!(a.settle_marks(0, || Some(2)).await, 0);
        assert!(a.sweep_own_ids(1).is_empty());
    }

    /// Every mark of `table` as if set long ago.
    fn age_marks(table: &Ownership) {
        for (_, cell) in table.all_cells() {
            if let Some(m) = cell.mark() {
                cell.restore_mark(Some(Mark { since_ms: 0, ..m }));
            }
        }
    }
}
