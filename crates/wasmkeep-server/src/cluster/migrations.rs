//! Class migrations on a cluster (issue 38, ADR 0071): a deploy whose
//! manifest lists `[[migrations]]` the app has not applied renames,
//! deletes or transfers classes for every node at once.
//!
//! ```text
//! versions/<tenant>/<app>/closing-<N, 20 digits>-<nonce>           the closing record: JSON (node, epoch, N, its record's hash and time, plan)
//! versions/<tenant>/<app>/closing-<N>-<nonce>.acks/<node>/<epoch>   a node's word that the classes are closed there
//! ```
//!
//! The deploying node:
//!
//! 1. plans the migrations against the component and the bucket (a
//!    class's actors are those live in the bucket and those on its disk);
//! 2. creates the closing record for the version number it is about to
//!    claim (one migration of an app at a time: of two, the lower key goes
//!    on, and no version of the app is recorded while one is in flight),
//!    closes the classes here and waits until every live node has acknowledged
//!    ([`CLOSING_WAIT_MS`]): each node, at its next sync, refuses new
//!    events of the classes (`class_migrating`), lets its open actors of
//!    them finish and close, releases their holds and writes its ack;
//! 3. plans again (the same plan, or the deploy is refused), takes the
//!    hold of every actor to move (no node serves them now) and checks it
//!    (`Runtime::migration_check`: no message not yet delivered); then,
//!    still in its epoch and with its record in place, waits for the acks
//!    of every node live now once more;
//! 4. records the version (from here on the deploy happened), installs
//!    it, and moves each actor while holding both addresses: its copy
//!    restored at the new one, its alarm listed there, then the old one
//!    deleted (`Runtime::migrate_actor`);
//! 5. deletes the acks and the closing record: each node opens the
//!    classes at its next sync, once it serves the version.
//!
//! A refusal before step 4 deletes the closing record and moves nothing;
//! every node opens the classes at its next sync (no version N is
//! listed). A closing record whose node's lease is gone, or whose deploy
//! on this node stopped, is finished by any node if its version was
//! recorded (record N read afresh and matched by hash and time; its moves
//! are idempotent, and two nodes finishing one take turns on each actor's
//! hold) and dropped if not, once the node has seen it for longer than a
//! write of the record could still be in flight. A record write whose
//! outcome the deploying node could not learn leaves the decision to that
//! rule.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use wasmkeep_replica::bucket::Created;
use wasmkeep_runtime::class_migrations::{ClassKey, Plan, Step};
use wasmkeep_runtime::{Runtime, RuntimeError};
use wasmkeep_store::ActorId;

use super::ClusterState;
use super::deploys::{DeployError, Deploys, VERSIONS_PREFIX};
use super::ownership::{InUse, Route, RouteError};

/// How long a deploying node waits for every live node to close the
/// migration's classes before it refuses the deploy (`migration_busy`).
pub const CLOSING_WAIT_MS: u64 = 30_000;
/// How long it waits for the hold of one actor to move (a node that died
/// holding it: its lease lapses first).
pub const HOLD_WAIT_MS: u64 = 30_000;
/// Most acks one listing of a closing record's acks reads (one a live
/// node: past it, a cluster's migration waits for acks it cannot see).
pub const ACKS_LISTED_MAX: u64 = 10_000;
/// Pause between two looks at the acks, or two tries of a hold.
const POLL_MS: u64 = 200;

/// A closing record: the migration a deploy runs before it records
/// version `version`, whose record it knows by the component's hash and
/// the deploy's time.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Closing {
    pub node: String,
    pub epoch: u64,
    pub version: u64,
    pub hash: String,
    pub deployed_ms: u64,
    pub plan: Plan,
}

/// A closing record's key: the version it precedes and a nonce of its
/// own, so that a deploy tried again after a refusal never reuses a key
/// some node still keeps classes closed for.
pub(crate) fn closing_key(tenant: &str, app: &str, n: u64, nonce: &str) -> String {
    format!("{VERSIONS_PREFIX}{tenant}/{app}/closing-{n:020}-{nonce}")
}

fn acks_dir(closing: &str) -> String {
    format!("{closing}.acks/")
}

fn ack_key(closing: &str, node: &str, epoch: u64) -> String {
    format!("{}{node}/{epoch}", acks_dir(closing))
}

/// `(tenant, app, N)` of a closing record's key; `None` for anything else.
pub(crate) fn parse_closing_key(key: &str) -> Option<(String, String, u64)> {
    let rest = key.strip_prefix(VERSIONS_PREFIX)?;
    let mut parts = rest.split('/');
    let (t, a, last) = (parts.next()?, parts.next()?, parts.next()?);
    let (n, nonce) = last.strip_prefix("closing-")?.split_once('-')?;
    let digits = |s: &str, len: usize, hex: bool| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (hex && (b'a'..=b'f').contains(&b)))
    };
    if parts.next().is_some() || !digits(n, 20, false) || !digits(nonce, 16, true) {
        return None;
    }
    Some((t.to_owned(), a.to_owned(), n.parse().ok()?))
}

fn busy(message: String) -> DeployError {
    DeployError::Runtime(RuntimeError::ClassMigration {
        code: "migration_busy",
        message,
    })
}

fn in_classes(classes: &[ClassKey], id: &ActorId) -> bool {
    classes
        .iter()
        .any(|(t, a, c)| *t == id.tenant && *a == id.app && *c == id.class)
}

/// A blocking runtime call, off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RuntimeError> + Send + 'static,
) -> Result<T, DeployError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RuntimeError::Internal(format!("migration task: {e}")))?
        .map_err(DeployError::Runtime)
}

/// Closes the record's classes on this node: their events refused, their
/// open actors finished and closed, their holds released. `Err` while an
/// actor of them still runs events or is held (the next sync tries again).
pub(crate) async fn close_here(
    state: &ClusterState,
    rt: &Runtime,
    key: &str,
    closing: &Closing,
) -> Result<(), DeployError> {
    let classes = closing.plan.classes();
    let (r, k, c) = (rt.clone(), key.to_owned(), classes.clone());
    blocking(move || r.close_classes(&k, &c)).await?;
    let epoch = state
        .acting_epoch()
        .ok_or_else(|| busy("this node's lease does not let it act".into()))?;
    for id in state.ownership.held_ids(epoch) {
        if in_classes(&classes, &id) {
            rt.sockets().close_all(
                Some(&id),
                wasmkeep_runtime::sockets::close_code::MOVED,
                "the actor's class is being migrated by a deploy: reconnect",
            );
        }
    }
    state
        .ownership
        .release_idle(
            0,
            || state.acting_epoch(),
            |id| !in_classes(&classes, id) || rt.is_open(id),
        )
        .await;
    let still: Vec<ActorId> = state
        .ownership
        .held_ids(epoch)
        .into_iter()
        .filter(|id| in_classes(&classes, id))
        .collect();
    if let Some(id) = still.first() {
        return Err(busy(format!(
            "{} actors of the migrated classes are still held here ({id} among them)",
            still.len()
        )));
    }
    Ok(())
}

/// Takes the hold of `id` for the migration, waiting while another node
/// holds it (at most [`HOLD_WAIT_MS`]).
async fn hold(state: &ClusterState, id: &ActorId) -> Result<InUse, DeployError> {
    let deadline = wasmkeep_runtime::clock::instant() + Duration::from_millis(HOLD_WAIT_MS);
    loop {
        // `forwarded`: never sent elsewhere; taken if no live node holds it.
        let why = match state
            .ownership
            .route(id, || state.route_epoch(), true)
            .await
        {
            Ok(Route::Local(held)) => return Ok(held),
            Ok(Route::Forward { node, .. }) | Err(RouteError::NotOwner { owner: Some(node) }) => {
                format!("node {node} holds it")
            }
            Err(e) => format!("{e:?}"),
        };
        if wasmkeep_runtime::clock::instant() >= deadline {
            return Err(busy(format!(
                "the migration could not take actor {id} within HOLD_WAIT_MS={HOLD_WAIT_MS} ({why})"
            )));
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// The actors of one step's source class now: `(old, new)` addresses,
/// `new` `None` for a deleted class. Listed step by step, as each runs: a
/// chain (`a` to `b`, then `b` to `c`) finds `a`'s actors in `b`.
async fn step_moves(
    rt: &Runtime,
    tenant: &str,
    s: &Step,
) -> Result<Vec<(ActorId, Option<ActorId>)>, DeployError> {
    let (r, t, a, c) = (
        rt.clone(),
        tenant.to_owned(),
        s.from.app.clone(),
        s.from.class.clone(),
    );
    let mut out = Vec::new();
    for name in blocking(move || r.class_actors(&t, &a, &c)).await? {
        let id = |app: &str, class: &str| {
            ActorId::new(tenant, app, class, &name)
                .map_err(|e| DeployError::Runtime(RuntimeError::Internal(e.to_string())))
        };
        let old = id(&s.from.app, &s.from.class)?;
        let new = match &s.to {
            Some(to) => Some(id(&to.app, &to.class)?),
            None => None,
        };
        out.push((old, new));
    }
    Ok(out)
}

/// Step 4: moves every actor the plan names, holding both addresses.
pub(crate) async fn run_moves(
    state: &ClusterState,
    rt: &Runtime,
    closing: &Closing,
) -> Result<usize, DeployError> {
    let mut moved = 0;
    for s in &closing.plan.steps {
        for (old, new) in step_moves(rt, &closing.plan.tenant, s).await? {
            let _old = hold(state, &old).await?;
            let _new = match &new {
                Some(n) => Some(hold(state, n).await?),
                None => None,
            };
            let r = rt.clone();
            let (o, n) = (old.clone(), new.clone());
            if blocking(move || r.migrate_actor(&o, n.as_ref())).await? {
                moved += 1;
            }
        }
    }
    Ok(moved)
}

impl Deploys {
    /// Step 2's wait: until every live node acknowledged the closing.
    pub(crate) async fn await_acks(
        &self,
        state: &ClusterState,
        key: &str,
    ) -> Result<(), DeployError> {
        let deadline = wasmkeep_runtime::clock::instant() + Duration::from_millis(CLOSING_WAIT_MS);
        loop {
            let view = state
                .view()
                .await
                .map_err(|e| DeployError::Bucket(e.to_string()))?;
            let acks: HashSet<String> = self
                .bounded(
                    "list the acks",
                    self.bucket.list(&acks_dir(key), None, ACKS_LISTED_MAX),
                )
                .await?
                .into_iter()
                .collect();
            let missing: Vec<String> = view
                .live
                .iter()
                .filter(|n| !acks.contains(&ack_key(key, &n.node, n.epoch)))
                .map(|n| n.node.clone())
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if wasmkeep_runtime::clock::instant() >= deadline {
                return Err(busy(format!(
                    "nodes {missing:?} did not close the migrated classes within CLOSING_WAIT_MS={CLOSING_WAIT_MS}; nothing moved, deploy again"
                )));
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
    }

    /// Writes this node's ack of a closing record.
    pub(crate) async fn ack(&self, state: &ClusterState, key: &str) -> Result<(), DeployError> {
        let epoch = state
            .acting_epoch()
            .ok_or_else(|| busy("this node's lease does not let it act".into()))?;
        let k = ack_key(key, state.node(), epoch);
        self.bounded("write an ack", self.bucket.create(&k, Bytes::new()))
            .await?;
        Ok(())
    }

    /// Deletes a closing record's acks, then the record: the nodes open
    /// its classes at their next sync.
    async fn end_closing(&self, key: &str) -> Result<(), DeployError> {
        let acks = self
            .bounded(
                "list the acks",
                self.bucket.list(&acks_dir(key), None, ACKS_LISTED_MAX),
            )
            .await?;
        for a in acks {
            self.bounded("delete an ack", self.bucket.delete(&a))
                .await?;
        }
        self.bounded("delete the closing record", self.bucket.delete(key))
            .await?;
        Ok(())
    }

    pub(crate) async fn read_closing(&self, key: &str) -> Result<Closing, DeployError> {
        let bytes = self
            .bounded(
                "read a closing record",
                self.bucket
                    .get_bounded(key, "RECORD_BYTES_MAX", super::deploys::RECORD_BYTES_MAX),
            )
            .await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| DeployError::Bucket(format!("closing record `{key}` unreadable: {e}")))
    }

    /// Step 3: takes the hold of every actor to move and checks it.
    pub(crate) async fn check_actors(
        &self,
        state: &ClusterState,
        rt: &Runtime,
        closing: &Closing,
    ) -> Result<(), DeployError> {
        for s in closing.plan.steps.iter().filter(|s| s.to.is_some()) {
            for (old, _) in step_moves(rt, &closing.plan.tenant, s).await? {
                let _held = hold(state, &old).await?;
                let (r, o) = (rt.clone(), old.clone());
                blocking(move || r.migration_check(&o)).await?;
            }
        }
        Ok(())
    }

    /// Creates a closing record, create-only: `false` if one is there (a
    /// migration of the app in flight).
    pub(crate) async fn open_closing(
        &self,
        key: &str,
        closing: &Closing,
    ) -> Result<bool, DeployError> {
        let json = serde_json::to_vec(closing)
            .map_err(|e| RuntimeError::Internal(format!("closing record: {e}")))?;
        let created = self
            .bounded(
                "create the closing record",
                self.bucket.create(key, Bytes::from(json)),
            )
            .await?;
        Ok(created != Created::AlreadyExists)
    }

    /// Ends a closing record: the acks and the record deleted, its classes
    /// open here if its version was never recorded (`recorded` false) or
    /// once this node serves it (else its next sync opens them).
    pub(crate) async fn finish_closing(
        &self,
        rt: &Runtime,
        key: &str,
        closing: &Closing,
        recorded: bool,
    ) {
        if let Err(e) = self.end_closing(key).await {
            tracing::warn!(key, error = %e, "could not delete a closing record; the next sync tries again");
            return;
        }
        let p = &closing.plan;
        if !recorded || self.installed_at_least(&p.tenant, &p.app, closing.version) {
            rt.open_classes(key);
        }
    }

    /// The sync's part, on every node, with a fresh listing of
    /// `versions/`: closes the classes of each closing record here and
    /// acknowledges it; opens the classes of records gone (at once if
    /// their version was never recorded, else once this node serves it);
    /// and ends the records whose node's lease is gone, or whose deploy
    /// on this node stopped: finished if their version was recorded (read
    /// afresh), dropped if not once this node has seen the record for
    /// longer than a write to the bucket can take.
    pub(crate) async fn sync_closings(&self, state: &ClusterState, rt: &Runtime, keys: &[String]) {
        let listed: HashSet<&String> = keys.iter().collect();
        let records: Vec<String> = keys
            .iter()
            .filter(|k| parse_closing_key(k).is_some())
            .cloned()
            .collect();
        for key in rt.closing_records() {
            if records.contains(&key) {
                continue;
            }
            let open = parse_closing_key(&key).is_none_or(|(t, a, n)| {
                !listed.contains(&super::deploys::record_key(&t, &a, n))
                    || self.installed_at_least(&t, &a, n)
            });
            if open {
                rt.open_classes(&key);
                tracing::info!(key, "opened the classes of an ended migration");
            }
        }
        self.forget_unseen(&records);
        for key in records {
            let Some(_running) = self.try_run_here(&key) else {
                continue;
            };
            // Read afresh: a record deleted since the listing is not acted on.
            let Ok(closing) = self.read_closing(&key).await else {
                continue;
            };
            let seen_ms = self.seen_ms(&key);
            let Some(epoch) = state.acting_epoch() else {
                // Not acting yet (a node starting): the classes are closed
                // before it serves; releases and the ack wait for its lease.
                let (r, k, c) = (rt.clone(), key.clone(), closing.plan.classes());
                let _ = tokio::task::spawn_blocking(move || r.close_classes(&k, &c)).await;
                continue;
            };
            if !listed.contains(&ack_key(&key, state.node(), epoch)) {
                match close_here(state, rt, &key, &closing).await {
                    Ok(()) => {
                        if let Err(e) = self.ack(state, &key).await {
                            tracing::warn!(key, error = %e, "could not acknowledge a closing record");
                        }
                    }
                    Err(e) => {
                        tracing::info!(key, error = %e, "closing a migration's classes here; trying again at the next sync");
                    }
                }
            }
            let mine = closing.node == state.node() && closing.epoch == epoch;
            // One node's lease read, not the cluster's: every node asks at
            // every sync while the record exists.
            let Some(live) = state.node_live(&closing.node, closing.epoch).await else {
                continue;
            };
            // This node's own migration, whose deploy stopped (no task of
            // this node runs it), is ended here too.
            if live && !mine {
                continue;
            }
            match self.recorded(&closing).await {
                Some(true) => match run_moves(state, rt, &closing).await {
                    Ok(moved) => {
                        tracing::info!(key, moved, node = %closing.node, "finished a migration whose deploy stopped");
                        self.finish_closing(rt, &key, &closing, true).await;
                    }
                    Err(e) => {
                        tracing::warn!(key, error = %e, "could not finish a migration whose deploy stopped; trying again at the next sync");
                    }
                },
                Some(false) if seen_ms >= self.settle_ms() => {
                    tracing::warn!(key, node = %closing.node, "dropped a migration whose deploy stopped before it recorded its version");
                    self.finish_closing(rt, &key, &closing, false).await;
                }
                // Not readable now, or a record of it may still land.
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closing_keys_parse_back_and_acks_and_records_do_not() {
        let k = closing_key("t", "a", 7, "00ff00ff00ff00ff");
        assert_eq!(
            k,
            "versions/t/a/closing-00000000000000000007-00ff00ff00ff00ff"
        );
        assert_eq!(parse_closing_key(&k), Some(("t".into(), "a".into(), 7)));
        for bad in [
            ack_key(&k, "n1", 3),
            "versions/t/a/00000000000000000007".to_owned(),
            "versions/t/a/closing-00000000000000000007".to_owned(),
            "versions/t/a/closing-7-00ff00ff00ff00ff".to_owned(),
            "versions/t/a/closing-00000000000000000007-00FF".to_owned(),
            "versions/t/closing-00000000000000000007-00ff00ff00ff00ff".to_owned(),
        ] {
            assert_eq!(parse_closing_key(&bad), None, "{bad}");
        }
        // A record's key parser never takes a closing record or an ack.
        assert_eq!(super::super::deploys::parse_record_key(&k), None);
        assert_eq!(
            super::super::deploys::parse_record_key(&ack_key(&k, "n", 1)),
            None
        );
    }
}
