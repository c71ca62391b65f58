//! Class migrations on a cluster (issue 38, ADR 0071): a deploy whose
//! manifest lists `[[migrations]]` the app has not applied renames,
//! deletes or transfers classes for every node at once.
//!
//! ```text
//! versions/<tenant>/<app>/closing-<N, 20 digits>              the closing record: JSON (node, epoch, N, plan)
//! versions/<tenant>/<app>/closing-<N>.acks/<node>/<epoch>     a node's word that the classes are closed there
//! ```
//!
//! The deploying node:
//!
//! 1. plans the migrations against the component and the bucket (a
//!    class's actors are those live in the bucket and those on its disk);
//! 2. creates the closing record for the version number it is about to
//!    claim, create-only (one migration of an app at a time), closes the
//!    classes here and waits until every live node has acknowledged
//!    ([`CLOSING_WAIT_MS`]): each node, at its next sync, refuses new
//!    events of the classes (`class_migrating`), lets its open actors of
//!    them finish and close, releases their holds and writes its ack;
//! 3. plans again (the same plan, or the deploy is refused), takes the
//!    hold of every actor to move (no node serves them now) and checks it
//!    (`Runtime::migration_check`: no message not yet delivered);
//! 4. records the version (from here on the deploy happened), installs
//!    it, and moves each actor while holding both addresses: its copy
//!    restored at the new one, its alarm listed there, then the old one
//!    deleted (`Runtime::migrate_actor`);
//! 5. deletes the acks and the closing record: each node opens the
//!    classes at its next sync, once it serves the version.
//!
//! A refusal before step 4 deletes the closing record and moves nothing.
//! A closing record whose node's lease is gone is dropped by any node if
//! its version was never recorded, and finished by any node (its moves are
//! idempotent, and two nodes finishing one take turns on each actor's
//! hold) if it was.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use wasmkeep_replica::bucket::Created;
use wasmkeep_runtime::class_migrations::{ClassKey, Plan};
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
/// Pause between two looks at the acks, or two tries of a hold.
const POLL_MS: u64 = 200;

/// A closing record: the migration a deploy runs before it records
/// version `version`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Closing {
    pub node: String,
    pub epoch: u64,
    pub version: u64,
    pub plan: Plan,
}

pub(crate) fn closing_key(tenant: &str, app: &str, n: u64) -> String {
    format!("{VERSIONS_PREFIX}{tenant}/{app}/closing-{n:020}")
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
    let n = last.strip_prefix("closing-")?;
    if parts.next().is_some() || n.len() != 20 || !n.bytes().all(|b| b.is_ascii_digit()) {
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

/// The actors of the plan's step sources: `(old, new)` addresses, `new`
/// `None` for a deleted class.
async fn moves(rt: &Runtime, plan: &Plan) -> Result<Vec<(ActorId, Option<ActorId>)>, DeployError> {
    let mut out = Vec::new();
    for s in &plan.steps {
        let (r, t, a, c) = (
            rt.clone(),
            plan.tenant.clone(),
            s.from.app.clone(),
            s.from.class.clone(),
        );
        for name in blocking(move || r.class_actors(&t, &a, &c)).await? {
            let id = |app: &str, class: &str| {
                ActorId::new(&plan.tenant, app, class, &name)
                    .map_err(|e| DeployError::Runtime(RuntimeError::Internal(e.to_string())))
            };
            let old = id(&s.from.app, &s.from.class)?;
            let new = match &s.to {
                Some(to) => Some(id(&to.app, &to.class)?),
                None => None,
            };
            out.push((old, new));
        }
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
    for (old, new) in moves(rt, &closing.plan).await? {
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
                    self.bucket.list(&acks_dir(key), None, 10_000),
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
                self.bucket.list(&acks_dir(key), None, 10_000),
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

    async fn read_closing(&self, key: &str) -> Result<Closing, DeployError> {
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
        for (old, new) in moves(rt, &closing.plan).await? {
            if new.is_none() {
                continue;
            }
            let _held = hold(state, &old).await?;
            let (r, o) = (rt.clone(), old.clone());
            blocking(move || r.migration_check(&o)).await?;
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

    /// Ends a migration of this node: its closing record gone, its classes
    /// open here.
    pub(crate) async fn finish_closing(&self, rt: &Runtime, key: &str) {
        if let Err(e) = self.end_closing(key).await {
            tracing::warn!(key, error = %e, "could not delete a closing record; the next sync tries again");
            return;
        }
        rt.open_classes(key);
    }

    /// The sync's part, on every node, with the pass's listing of
    /// `versions/`: closes the classes of each closing record here and
    /// acknowledges it, opens the classes of records gone (once this node
    /// serves their version), and ends the records whose node's lease is
    /// gone: dropped if their version was never recorded, finished if it
    /// was.
    pub(crate) async fn sync_closings(&self, state: &ClusterState, rt: &Runtime, keys: &[String]) {
        let listed: HashSet<&String> = keys.iter().collect();
        let records: Vec<(String, String, String, u64)> = keys
            .iter()
            .filter_map(|k| parse_closing_key(k).map(|(t, a, n)| (k.clone(), t, a, n)))
            .collect();
        for key in rt.closing_records() {
            let gone = !records.iter().any(|r| r.0 == key);
            let served =
                parse_closing_key(&key).is_some_and(|(t, a, n)| self.installed_at_least(&t, &a, n));
            if gone && served {
                rt.open_classes(&key);
                tracing::info!(key, "opened the classes of a finished migration");
            }
        }
        for (key, tenant, app, n) in records {
            if self.running_here(&key) {
                continue;
            }
            let closing = match self.read_closing(&key).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(key, error = %e, "could not read a closing record");
                    continue;
                }
            };
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
            // This node's own migration, whose deploy stopped half-way
            // (no task of this node runs it), is finished here too.
            if live && !mine {
                continue;
            }
            let recorded = listed.contains(&super::deploys::record_key(&tenant, &app, n));
            if !recorded {
                tracing::warn!(key, node = %closing.node, "dropped a migration whose node stopped before it recorded its version");
                self.finish_closing(rt, &key).await;
                continue;
            }
            let _running = self.run_here(&key);
            match run_moves(state, rt, &closing).await {
                Ok(moved) => {
                    tracing::info!(key, moved, node = %closing.node, "finished a migration whose node stopped");
                    self.finish_closing(rt, &key).await;
                }
                Err(e) => {
                    tracing::warn!(key, error = %e, "could not finish a migration whose node stopped; trying again at the next sync");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closing_keys_parse_back_and_acks_and_records_do_not() {
        let k = closing_key("t", "a", 7);
        assert_eq!(k, "versions/t/a/closing-00000000000000000007");
        assert_eq!(parse_closing_key(&k), Some(("t".into(), "a".into(), 7)));
        for bad in [
            ack_key(&k, "n1", 3),
            "versions/t/a/00000000000000000007".to_owned(),
            "versions/t/a/closing-7".to_owned(),
            "versions/t/closing-00000000000000000007".to_owned(),
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
