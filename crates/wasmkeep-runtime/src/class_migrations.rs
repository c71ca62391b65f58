//! Class migrations (issue 38, ADR 0060): an app's manifest renames a
//! class, deletes one with its actors' data, or takes a class over from
//! another app of its tenant, and the deploy that first lists the
//! migration moves the data.
//!
//! ```toml
//! [[migrations]]
//! tag = "v2"                                  # applied once per app
//! renamed_classes = [{ from = "room", to = "chat" }]
//! deleted_classes = ["scratch"]
//! transferred_classes = [{ from_app = "billing", from = "ledger", to = "ledger" }]
//! ```
//!
//! On a node without a bucket, a deploy that lists migrations not yet
//! applied to the app ([`plan`]):
//!
//! 1. checks them against the new component and the disk: a renamed or
//!    deleted class must be gone from the component, a rename's or
//!    transfer's target must be one of its classes and hold no actor yet,
//!    and a transfer's source app must no longer serve the class;
//! 2. closes the classes involved ([`Gate::close`]): new events for them
//!    are refused with `class_migrating` (503, retryable) and the open
//!    actors finish their queued events and close (within
//!    [`MIGRATION_DRAIN_MS`]); an actor of a moved class with messages
//!    not yet delivered refuses the migration, since its receivers drop
//!    repeats by the sender's address, which the move changes;
//! 3. writes the plan into the app's `migrations.toml` (fsynced) before
//!    the new version is recorded, moves each class folder with one
//!    `rename` (a delete moves it to `<data>/trash` first), and records
//!    the tags as applied with the version they came with. A crash
//!    between the plan and the record is finished at the next start
//!    ([`finish_pending`]): every step is idempotent.
//!
//! The actors' alarms follow their data (read with the outbox check, armed
//! under the new address; a deleted class's alarms go with it); their
//! open sockets are closed with 1012 and their parked replies answered
//! `reply_expired`. A refusal moves nothing.
//!
//! A single node with a bucket (`serve --bucket` without `--advertise`)
//! moves each actor through its own events instead of its folder: the
//! actors of a class are those on disk and those only the bucket holds
//! (a node restored on an empty folder opens an actor at its first event);
//! [`Gate::close`] copies each one as its next event would see it, and
//! [`apply`] makes the copy the new address's database (uploaded to the
//! bucket) before deleting the old address (a tombstone there), so the
//! bucket never lacks an actor and never keeps a moved one at its old
//! address. A start finishes a plan it stopped in the same way
//! ([`resume`]).
//!
//! On a cluster node the server drives the migration (ADR 0071,
//! `wasmkeep_server::cluster::migrations`): it closes the classes on every
//! node through a record in the bucket ([`Gates`], keyed by record), takes
//! the holds of the actors to move and moves each one with the same
//! events ([`move_actor`], whose `Between::Settle` lists the alarm of the
//! restored actor in the cluster's index before the old address goes);
//! the runtime's own deploy then only records the tags as applied.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use wasmkeep_store::commit_log::CommitLog;
use wasmkeep_store::{ActorId, paths};

use crate::actor::{Actor, Between, Event, EventKind, Outcome};
use crate::error::RuntimeError;
use crate::node::Inner;

/// Migrations one manifest may list.
pub const MIGRATIONS_MAX: usize = 64;
/// Classes one migration may name, over its three lists.
pub const MIGRATION_CLASSES_MAX: usize = 64;
/// Longest tag, in bytes.
pub const MIGRATION_TAG_BYTES_MAX: usize = 64;
/// How long a migration waits for the open actors of its classes to
/// finish their queued events before it refuses the deploy.
pub const MIGRATION_DRAIN_MS: u64 = 10_000;

/// One `[[migrations]]` entry of an app's manifest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassMigration {
    /// Names the migration: a deploy applies the tags the app has not
    /// applied yet, in the manifest's order.
    pub tag: String,
    #[serde(default)]
    pub renamed_classes: Vec<RenamedClass>,
    #[serde(default)]
    pub deleted_classes: Vec<String>,
    #[serde(default)]
    pub transferred_classes: Vec<TransferredClass>,
}

/// A class whose actors keep their data under a new class name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenamedClass {
    pub from: String,
    pub to: String,
}

/// A class of another app of the tenant whose actors become this app's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferredClass {
    pub from_app: String,
    pub from: String,
    pub to: String,
}

/// Checks a manifest's `[[migrations]]` on their own (names, counts,
/// tags); what they need of the component and the disk is [`plan`]'s.
pub(crate) fn check_manifest(list: &[ClassMigration]) -> Result<(), String> {
    if list.len() > MIGRATIONS_MAX {
        return Err(format!(
            "migrations: {} entries, limit MIGRATIONS_MAX={MIGRATIONS_MAX}",
            list.len()
        ));
    }
    let mut tags = HashSet::new();
    for m in list {
        let tag_ok = !m.tag.is_empty()
            && m.tag.len() <= MIGRATION_TAG_BYTES_MAX
            && m.tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !tag_ok {
            return Err(format!(
                "migrations: tag `{}` must be 1 to {MIGRATION_TAG_BYTES_MAX} letters, digits, `-`, `_` or `.`",
                m.tag.escape_debug()
            ));
        }
        if !tags.insert(m.tag.as_str()) {
            return Err(format!("migrations: tag `{}` is listed twice", m.tag));
        }
        let named = m.renamed_classes.len() + m.deleted_classes.len() + m.transferred_classes.len();
        if named == 0 {
            return Err(format!("migrations: `{}` names no class", m.tag));
        }
        if named > MIGRATION_CLASSES_MAX {
            return Err(format!(
                "migrations: `{}` names {named} classes, limit MIGRATION_CLASSES_MAX={MIGRATION_CLASSES_MAX}",
                m.tag
            ));
        }
        let segment = |field: &'static str, v: &str| {
            wasmkeep_store::id::validate_segment(field, v)
                .map_err(|e| format!("migrations: `{}`: {e}", m.tag))
        };
        for r in &m.renamed_classes {
            segment("renamed_classes.from", &r.from)?;
            segment("renamed_classes.to", &r.to)?;
        }
        for c in &m.deleted_classes {
            segment("deleted_classes", c)?;
        }
        for t in &m.transferred_classes {
            segment("transferred_classes.from_app", &t.from_app)?;
            segment("transferred_classes.from", &t.from)?;
            segment("transferred_classes.to", &t.to)?;
        }
    }
    Ok(())
}

/// One class of one app of the plan's tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClassRef {
    pub app: String,
    pub class: String,
}

/// One step of a plan: a class folder moved to another class (of this
/// app or, for a transfer, from another app), or removed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub from: ClassRef,
    /// `None`: the class is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<ClassRef>,
}

/// The migrations one deploy applies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub tenant: String,
    /// The app whose manifest lists them.
    pub app: String,
    pub tags: Vec<String>,
    pub steps: Vec<Step>,
}

impl Plan {
    /// Every class the plan closes: its steps' sources and targets.
    pub fn classes(&self) -> Vec<ClassKey> {
        let mut keys = Vec::new();
        for s in &self.steps {
            keys.push((
                self.tenant.clone(),
                s.from.app.clone(),
                s.from.class.clone(),
            ));
            if let Some(to) = &s.to {
                keys.push((self.tenant.clone(), to.app.clone(), to.class.clone()));
            }
        }
        keys
    }
}

/// A tag an app applied, and the version of the app that applied it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Applied {
    tag: String,
    version: u64,
}

/// `<data>/apps/<tenant>/<app>/migrations.toml`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Record {
    #[serde(default)]
    applied: Vec<Applied>,
    /// A plan written before its steps ran; finished at the next start if
    /// the node stopped before it was recorded as applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pending: Option<Plan>,
}

fn record_path(data: &Path, tenant: &str, app: &str) -> PathBuf {
    crate::app::app_dir(data, tenant, app).join("migrations.toml")
}

fn read_record(path: &Path) -> Result<Record, RuntimeError> {
    match std::fs::read_to_string(path) {
        Ok(text) => toml::from_str(&text)
            .map_err(|e| RuntimeError::Internal(format!("{} does not parse: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Record::default()),
        Err(e) => Err(RuntimeError::Store(e.into())),
    }
}

fn write_record(path: &Path, record: &Record) -> Result<(), RuntimeError> {
    let text = toml::to_string(record)
        .map_err(|e| RuntimeError::Internal(format!("migrations record: {e}")))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| RuntimeError::Store(e.into()))?;
    }
    crate::app::write_atomic(path, text.as_bytes()).map_err(|e| RuntimeError::Store(e.into()))
}

fn conflict(message: String) -> RuntimeError {
    RuntimeError::ClassMigration {
        code: "migration_conflict",
        message,
    }
}

/// What a deploy of `app` with `migrations` (its manifest's) and a
/// component exporting `classes` must move first; `None` when every tag is
/// applied already. Refuses what cannot apply, before anything moves.
pub(crate) fn plan(
    rt: &Inner,
    tenant: &str,
    app: &str,
    migrations: &[ClassMigration],
    classes: &[String],
    percent: u8,
) -> Result<Option<Plan>, RuntimeError> {
    let data = &rt.config.data_dir;
    let record = read_record(&record_path(data, tenant, app))?;
    let applied: HashSet<&str> = record.applied.iter().map(|a| a.tag.as_str()).collect();
    let new: Vec<&ClassMigration> = migrations
        .iter()
        .filter(|m| !applied.contains(m.tag.as_str()))
        .collect();
    if new.is_empty() {
        return Ok(None);
    }
    let tags: Vec<String> = new.iter().map(|m| m.tag.clone()).collect();
    if percent < 100 {
        return Err(RuntimeError::InvalidConfig(format!(
            "percent={percent}: migrations {tags:?} move classes' data for every actor at once; deploy them whole"
        )));
    }
    let steps = steps_of(rt, tenant, app, &new, classes)?;
    Ok(Some(Plan {
        tenant: tenant.to_owned(),
        app: app.to_owned(),
        tags,
        steps,
    }))
}

/// Every step the migrations `new` name, in order, with its tag.
fn listed_steps<'m>(
    app: &str,
    new: &[&'m ClassMigration],
) -> Result<Vec<(&'m str, Step)>, RuntimeError> {
    let here = |class: &str| ClassRef {
        app: app.to_owned(),
        class: class.to_owned(),
    };
    let mut listed: Vec<(&'m str, Step)> = Vec::new();
    for m in new {
        for r in &m.renamed_classes {
            let to = Some(here(&r.to));
            listed.push((
                &m.tag,
                Step {
                    from: here(&r.from),
                    to,
                },
            ));
        }
        for c in &m.deleted_classes {
            listed.push((
                &m.tag,
                Step {
                    from: here(c),
                    to: None,
                },
            ));
        }
        for t in &m.transferred_classes {
            if t.from_app == app {
                return Err(RuntimeError::InvalidManifest(format!(
                    "migrations: `{}`: transfers `{}` from this app itself (write a rename)",
                    m.tag, t.from
                )));
            }
            let from = ClassRef {
                app: t.from_app.clone(),
                class: t.from.clone(),
            };
            listed.push((
                &m.tag,
                Step {
                    from,
                    to: Some(here(&t.to)),
                },
            ));
        }
    }
    Ok(listed)
}

/// The steps the migrations `new` take for a component exporting
/// `classes`, on this node's data: a step whose class holds no actor (on
/// disk, or moved into it by an earlier step) is nothing to do and is
/// left out, so a manifest's whole history deploys on a fresh node or app
/// (`a` to `b`, then `b` to `c`, moves `a` to `c` where `a` has actors).
/// A step that moves actors is checked: its class gone from the
/// component (or, for a transfer, from its app), its target one of the
/// component's classes (or the source of a later step) and without
/// actors.
fn steps_of(
    rt: &Inner,
    tenant: &str,
    app: &str,
    new: &[&ClassMigration],
    classes: &[String],
) -> Result<Vec<Step>, RuntimeError> {
    let listed = listed_steps(app, new)?;
    let serves = |c: &ClassRef| c.app == app && classes.contains(&c.class);
    // Whether a class holds actors, as the steps so far leave it.
    let mut holds: HashMap<ClassRef, bool> = HashMap::new();
    let holds_now = |c: &ClassRef, holds: &mut HashMap<ClassRef, bool>| {
        if let Some(h) = holds.get(c) {
            return Ok::<bool, RuntimeError>(*h);
        }
        let h = first_actor(rt, tenant, c)?.is_some();
        holds.insert(c.clone(), h);
        Ok(h)
    };
    let mut steps = Vec::new();
    for (i, (tag, step)) in listed.iter().enumerate() {
        if !holds_now(&step.from, &mut holds)? {
            continue;
        }
        let bad = |what: String| {
            Err(RuntimeError::InvalidManifest(format!(
                "migrations: `{tag}`: {what}"
            )))
        };
        let from = &step.from;
        if serves(from) {
            return bad(format!(
                "moves or deletes class `{}`, which the component still exports",
                from.class
            ));
        }
        if from.app != app {
            let source_serves = rt
                .app(tenant, &from.app)
                .is_some_and(|a| a.classes.contains(&from.class))
                || rt
                    .candidate(tenant, &from.app)
                    .is_some_and(|(a, _)| a.classes.contains(&from.class));
            if source_serves {
                return Err(conflict(format!(
                    "{tenant}/{} still serves class `{}`: deploy it without that class first, then transfer it",
                    from.app, from.class
                )));
            }
        }
        if let Some(to) = &step.to {
            let moved_on = listed[i + 1..].iter().any(|(_, later)| later.from == *to);
            if !serves(to) && !moved_on {
                return bad(format!(
                    "moves `{}/{}` to `{}`, which the component does not export",
                    from.app, from.class, to.class
                ));
            }
            if holds_now(to, &mut holds)? {
                let example = first_actor(rt, tenant, to)?.unwrap_or_default();
                return Err(conflict(format!(
                    "class `{}` of {tenant}/{} already has actors (`{}` among them): a rename or transfer moves a class into an empty one",
                    to.class,
                    to.app,
                    example.escape_debug()
                )));
            }
            holds.insert(to.clone(), true);
        }
        holds.insert(from.clone(), false);
        steps.push(step.clone());
    }
    Ok(steps)
}

fn store_error(e: std::io::Error) -> RuntimeError {
    RuntimeError::Store(e.into())
}

fn listing_error(c: &ClassRef, e: wasmkeep_replica::ReplicaError) -> RuntimeError {
    RuntimeError::ReplicationFailed(format!(
        "listing class `{}` of app `{}` in the bucket for a migration: {e}; nothing moved",
        c.class, c.app
    ))
}

/// The name of one actor of a class, if it holds any: on this node's disk
/// or, with a bucket, live in the bucket.
fn first_actor(rt: &Inner, tenant: &str, c: &ClassRef) -> Result<Option<String>, RuntimeError> {
    let dir = paths::class_dir(&rt.config.data_dir, tenant, &c.app, &c.class);
    if let Some(name) = paths::list_names(&dir, None, 1)
        .map_err(store_error)?
        .into_iter()
        .next()
    {
        return Ok(Some(name));
    }
    let mut found = None;
    bucket_names(rt, tenant, c, |name| {
        found = Some(name);
        false
    })?;
    Ok(found)
}

/// Every actor of a class: those on this node's disk and, with a bucket,
/// those live there (a node whose folder was restored empty has not
/// opened them yet), in name order.
fn actors_of(rt: &Inner, tenant: &str, c: &ClassRef) -> Result<Vec<String>, RuntimeError> {
    let dir = paths::class_dir(&rt.config.data_dir, tenant, &c.app, &c.class);
    let mut names: std::collections::BTreeSet<String> = paths::list_names(&dir, None, usize::MAX)
        .map_err(store_error)?
        .into_iter()
        .collect();
    bucket_names(rt, tenant, c, |name| {
        names.insert(name);
        true
    })?;
    Ok(names.into_iter().collect())
}

/// The unsafe variant of "a class's actors are those on disk and those in
/// the bucket", for the test that shows the rule matters: the bucket is
/// not listed, as on a node without one.
#[cfg(feature = "test-faults")]
static UNSAFE_FORGETS_BUCKET: AtomicBool = AtomicBool::new(false);

/// Switches the unsafe variant on for the whole process (a `test-faults`
/// build's `WASMKEEP_UNSAFE=migration_forgets_bucket_actors`).
#[cfg(feature = "test-faults")]
pub fn unsafe_forget_bucket_actors() {
    UNSAFE_FORGETS_BUCKET.store(true, Ordering::Relaxed);
}

/// A crash point for the test of a stop in the middle of a migration with
/// a bucket: the process aborts once the first actor is restored at its
/// new address, before it is deleted at its old one.
#[cfg(feature = "test-faults")]
static CRASH_AFTER_FIRST_RESTORE: AtomicBool = AtomicBool::new(false);

/// Arms [`CRASH_AFTER_FIRST_RESTORE`] for the whole process (a
/// `test-faults` build's `WASMKEEP_UNSAFE=migration_crashes_mid_way`).
#[cfg(feature = "test-faults")]
pub fn crash_after_first_restore() {
    CRASH_AFTER_FIRST_RESTORE.store(true, Ordering::Relaxed);
}

fn crash_point() {
    #[cfg(feature = "test-faults")]
    if CRASH_AFTER_FIRST_RESTORE.load(Ordering::Relaxed) {
        tracing::error!(
            "migration_crashes_mid_way: aborting between an actor's restore and its delete"
        );
        std::process::abort();
    }
}

/// The unsafe variant of "a moved actor's alarm is listed at its new
/// address before its old one is deleted" (ADR 0071).
#[cfg(feature = "test-faults")]
static UNSAFE_SKIP_SETTLE: AtomicBool = AtomicBool::new(false);

/// Switches [`UNSAFE_SKIP_SETTLE`] on for the process (a `test-faults`
/// build's `WASMKEEP_UNSAFE=migration_skips_settle`).
#[cfg(feature = "test-faults")]
pub fn unsafe_skip_settle() {
    UNSAFE_SKIP_SETTLE.store(true, Ordering::Relaxed);
}

fn skips_settle() -> bool {
    #[cfg(feature = "test-faults")]
    if UNSAFE_SKIP_SETTLE.load(Ordering::Relaxed) {
        return true;
    }
    false
}

fn forgets_bucket_actors() -> bool {
    #[cfg(feature = "test-faults")]
    if UNSAFE_FORGETS_BUCKET.load(Ordering::Relaxed) {
        return true;
    }
    false
}

/// [`actors_of`] for a class named by its parts.
pub(crate) fn class_actors(
    rt: &Inner,
    tenant: &str,
    app: &str,
    class: &str,
) -> Result<Vec<String>, RuntimeError> {
    let c = ClassRef {
        app: app.to_owned(),
        class: class.to_owned(),
    };
    actors_of(rt, tenant, &c)
}

/// Calls `each` with the names of the class's live actors in the bucket
/// (none without one), page by page, while it returns `true`.
fn bucket_names(
    rt: &Inner,
    tenant: &str,
    c: &ClassRef,
    mut each: impl FnMut(String) -> bool,
) -> Result<(), RuntimeError> {
    let Some(repl) = &rt.replication else {
        return Ok(());
    };
    if forgets_bucket_actors() {
        return Ok(());
    }
    let mut after: Option<String> = None;
    loop {
        let page = repl
            .block_on(wasmkeep_replica::listing::class_page(
                &repl.bucket,
                &repl.config,
                (tenant, &c.app, &c.class),
                "",
                after.as_deref(),
                wasmkeep_replica::listing::CLASS_PAGE_NAMES_MAX,
            ))
            .map_err(|e| listing_error(c, e))?;
        for name in page.names {
            if !each(name) {
                return Ok(());
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(()),
        }
    }
}

/// Runs one of a migration's own events on an actor of a closed class
/// and waits for it (from a thread that may block).
fn run_on(rt: &Inner, id: &ActorId, between: Between) -> Result<Outcome, RuntimeError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    rt.enqueue_migrating(id, Event::new(EventKind::Between(between), Some(tx)))?;
    rx.blocking_recv()
        .unwrap_or(Err(RuntimeError::ShuttingDown))
}

/// An actor's database copied by an event of its own (`Between::Copy`)
/// into `<data>/staging` (emptied at start), removed when dropped unless
/// a restore moved it into place.
struct StagedCopy {
    path: PathBuf,
}

impl StagedCopy {
    fn of(rt: &Inner, id: &ActorId) -> Result<StagedCopy, RuntimeError> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = rt.config.data_dir.join("staging");
        std::fs::create_dir_all(&dir).map_err(store_error)?;
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let copy = StagedCopy {
            path: dir.join(format!("migration-{}-{n}.db", std::process::id())),
        };
        run_on(rt, id, Between::Copy(copy.path.clone()))?;
        Ok(copy)
    }
}

impl Drop for StagedCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The classes being migrated on a node: their events are refused until
/// the migration is done (`Inner::enqueue` asks [`Gates::refuses`]).
#[derive(Default)]
pub struct Gates {
    /// Whether any class is closed: the only thing an event's enqueue
    /// reads while none is.
    any: AtomicBool,
    /// Each closed class, with how many closings hold it (a deploy's
    /// [`Gate`], a cluster's closing record).
    closed: RwLock<HashMap<ClassKey, usize>>,
    /// The classes a cluster's closing records keep closed, by record
    /// (`Runtime::close_classes`).
    by_record: parking_lot::Mutex<HashMap<String, Vec<ClassKey>>>,
}

/// A class of one app of one tenant: `(tenant, app, class)`.
pub type ClassKey = (String, String, String);

impl Gates {
    fn shut(&self, keys: &[ClassKey]) {
        let mut closed = self.closed.write();
        for k in keys {
            *closed.entry(k.clone()).or_insert(0) += 1;
        }
        self.any.store(true, Ordering::Release);
    }

    fn open(&self, keys: &[ClassKey]) {
        let mut closed = self.closed.write();
        for k in keys {
            if let Some(n) = closed.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    closed.remove(k);
                }
            }
        }
        self.any.store(!closed.is_empty(), Ordering::Release);
    }

    /// `class_migrating` for an event of a class being migrated.
    pub(crate) fn refuses(&self, id: &ActorId) -> Option<RuntimeError> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let key = (id.tenant.clone(), id.app.clone(), id.class.clone());
        self.closed
            .read()
            .contains_key(&key)
            .then(|| RuntimeError::ClassMigration {
                code: "class_migrating",
                message: format!(
                    "class `{}` of {}/{} is being migrated by a deploy; retry in a moment",
                    id.class, id.tenant, id.app
                ),
            })
    }
}

/// The classes of a plan, closed while it applies; dropping it opens
/// them again, unless [`Gate::keep_closed`] was called.
pub(crate) struct Gate<'a> {
    rt: &'a Inner,
    keys: Vec<(String, String, String)>,
    /// The committed alarms of the actors to move, read with their outbox
    /// by [`Gate::close`] (nothing runs on them after): [`apply`] arms
    /// them under their new address without reading each database again.
    alarms: HashMap<(ClassRef, String), u64>,
}

impl Drop for Gate<'_> {
    fn drop(&mut self) {
        self.rt.migrating.open(&self.keys);
    }
}

impl<'a> Gate<'a> {
    /// Closes the plan's classes (sources and targets), waits for their
    /// open actors to finish what they have queued and closes them, and
    /// refuses the plan if an actor of a moved class has messages not yet
    /// delivered. On `Err` the classes are open again and nothing moved.
    pub(crate) fn close(rt: &'a Inner, plan: &Plan) -> Result<Gate<'a>, RuntimeError> {
        let keys = plan.classes();
        rt.migrating.shut(&keys);
        let mut gate = Gate {
            rt,
            keys,
            alarms: HashMap::new(),
        };
        close_actors(rt, &gate.keys)?;
        for s in plan.steps.iter().filter(|s| s.to.is_some()) {
            for name in actors_of(rt, &plan.tenant, &s.from)? {
                let id = ActorId::new(&plan.tenant, &s.from.app, &s.from.class, &name)?;
                // With a bucket, a copy as the actor's next event would
                // see it (one at a time: [`apply`] copies again, so the
                // staging folder never holds a whole class).
                let copy = match &rt.replication {
                    Some(_) => match StagedCopy::of(rt, &id) {
                        Ok(copy) => Some(copy),
                        // Deleted at its old address by a move a stop cut
                        // short just after: moved already.
                        Err(RuntimeError::ActorNotFound(_)) => continue,
                        Err(e) => {
                            return Err(conflict(format!(
                                "actor {id} could not be brought in line with the bucket to be checked ({e}); nothing moved"
                            )));
                        }
                    },
                    None => None,
                };
                let file = match &copy {
                    Some(c) => c.path.clone(),
                    None => paths::actor_db(&rt.config.data_dir, &id),
                };
                if let Some(at) = checked_alarm(&id, &file)? {
                    gate.alarms.insert((s.from.clone(), name.clone()), at);
                }
                // Records from before the move name the old class and,
                // for a transfer, the other app's versions: a replay must
                // not start from them (ADR 0062).
                crate::recording::forget_bases(&paths::actor_dir(&rt.config.data_dir, &id));
            }
        }
        Ok(gate)
    }

    /// Leaves the classes closed until the node restarts: a migration
    /// that failed half-way is finished by the next start, and nothing may
    /// open an actor of those classes meanwhile.
    pub(crate) fn keep_closed(mut self) {
        self.keys.clear();
    }
}

/// Waits until no actor of the classes `keys` (closed already, so no
/// event joins them meanwhile: `Inner::enqueue` checks under the actors'
/// lock) has an event queued or running, then takes them off the node and
/// closes their databases.
fn close_actors(rt: &Inner, keys: &[ClassKey]) -> Result<(), RuntimeError> {
    let holds = |id: &ActorId| {
        keys.iter()
            .any(|(t, a, c)| *t == id.tenant && *a == id.app && *c == id.class)
    };
    {
        let deadline = crate::clock::instant() + Duration::from_millis(MIGRATION_DRAIN_MS);
        let closing: Vec<Arc<Actor>> = loop {
            {
                let mut actors = rt.actors.lock();
                let mine: Vec<Arc<Actor>> =
                    actors.values().filter(|a| holds(&a.id)).cloned().collect();
                // Each queue's guard is held from the look to the
                // retirement: an event cannot slip in between.
                let mut idle = Vec::with_capacity(mine.len());
                for a in &mine {
                    // With a bucket, also once the bucket holds every
                    // commit: a closed actor's next opening keeps the
                    // local file only if it is the bucket's head.
                    match a.queue.try_lock() {
                        Some(q)
                            if !q.scheduled
                                && q.events.is_empty()
                                && a.repl.try_lock().is_some_and(|r| !r.busy()) =>
                        {
                            idle.push(q)
                        }
                        _ => break,
                    }
                }
                if idle.len() == mine.len() {
                    for mut q in idle {
                        q.retired = true;
                    }
                    for a in &mine {
                        actors.remove(&a.id);
                    }
                    break mine;
                }
            }
            if crate::clock::instant() >= deadline {
                return Err(RuntimeError::ClassMigration {
                    code: "migration_busy",
                    message: format!(
                        "the actors of the migrated classes still had events running after MIGRATION_DRAIN_MS={MIGRATION_DRAIN_MS}; nothing moved, deploy again once they are quieter"
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        for a in closing {
            // Under the slot's lock: the closer thread may be closing it.
            *a.slot.lock() = None;
        }
        // An actor the reaper took off the node just before is closed by
        // the time its pass ends.
        drop(rt.reaping.lock());
        Ok(())
    }
}

/// What a deploy does before it writes its version: plans the migrations
/// it lists, closes their classes ([`Gate::close`]), plans again (an
/// actor may have been created in a target class, or a source app
/// deployed, before the classes closed: the plan must still be the same)
/// and records the plan as pending. `None`: nothing to migrate.
pub(crate) fn start<'a>(
    rt: &'a Inner,
    tenant: &str,
    app: &str,
    migrations: &[ClassMigration],
    classes: &[String],
    percent: u8,
) -> Result<Option<(Plan, Gate<'a>)>, RuntimeError> {
    let Some(planned) = plan(rt, tenant, app, migrations, classes, percent)? else {
        return Ok(None);
    };
    let gate = Gate::close(rt, &planned)?;
    if plan(rt, tenant, app, migrations, classes, percent)?.as_ref() != Some(&planned) {
        return Err(conflict(format!(
            "the classes of {tenant}/{app}'s migrations changed while their actors finished their events; nothing moved, deploy again"
        )));
    }
    begin(&rt.config.data_dir, &planned)?;
    Ok(Some((planned, gate)))
}

/// Records `plan` as pending in its app's record, before the deploy's
/// version is written: from here on, a start finishes it if that version
/// was written.
fn begin(data: &Path, plan: &Plan) -> Result<(), RuntimeError> {
    let path = record_path(data, &plan.tenant, &plan.app);
    let mut record = read_record(&path)?;
    record.pending = Some(plan.clone());
    write_record(&path, &record)
}

/// Forgets a pending plan whose deploy failed before its version was
/// written (nothing had moved).
pub(crate) fn abandon(data: &Path, plan: &Plan) {
    let path = record_path(data, &plan.tenant, &plan.app);
    if let Ok(mut record) = read_record(&path) {
        record.pending = None;
        if let Err(e) = write_record(&path, &record) {
            tracing::warn!(error = %e, "could not clear an abandoned migration plan; the next start applies it");
        }
    }
}

/// Runs the plan's steps (each idempotent) and records its tags as
/// applied by `version`. The classes are closed by `gate`, which read the
/// moved actors' alarms.
pub(crate) fn apply(
    rt: &Inner,
    plan: &Plan,
    gate: &Gate<'_>,
    version: u64,
) -> Result<(), RuntimeError> {
    let data = &rt.config.data_dir;
    if rt.replication.is_some() {
        for s in &plan.steps {
            let moved = move_through_bucket(rt, &plan.tenant, s)?;
            tracing::info!(tenant = %plan.tenant, from = ?s.from, to = ?s.to, actors = moved, "class migrated, in the bucket too");
        }
        rt.metrics.alarms_pending.set(rt.timer.len() as u64);
        return finish(data, plan, version);
    }
    // Each moved actor's alarm, keyed by where it is as the steps go.
    let mut alarms = gate.alarms.clone();
    for s in &plan.steps {
        let dir = paths::class_dir(data, &plan.tenant, &s.from.app, &s.from.class);
        let moved = paths::list_names(&dir, None, usize::MAX).unwrap_or_default();
        for name in &moved {
            let old = ActorId::new(&plan.tenant, &s.from.app, &s.from.class, name)?;
            rt.timer.set(&old, None);
            rt.sockets.close_all(
                Some(&old),
                crate::sockets::close_code::MOVED,
                "the actor's class was migrated by a deploy: reconnect",
            );
            rt.parked.drop_actor(&old);
            wasmkeep_store::page_capture::untrack(&paths::actor_dir(data, &old));
            if s.to.is_none() {
                // Deleted: what it sent goes with it, and the tenant no
                // longer has it.
                rt.outbox.forget(&old);
                let size = wasmkeep_store::db::size_bytes_at(&paths::actor_db(data, &old));
                rt.quotas.counted(&plan.tenant, false, size.unwrap_or(0));
            }
        }
        run_step(data, rt.commit_log.as_deref(), &plan.tenant, s)?;
        if let Some(to) = &s.to {
            for name in &moved {
                let id = ActorId::new(&plan.tenant, &to.app, &to.class, name)?;
                let at = alarms.remove(&(s.from.clone(), name.clone()));
                rt.timer.set(&id, at);
                if let Some(at) = at {
                    alarms.insert((to.clone(), name.clone()), at);
                }
            }
        }
        tracing::info!(tenant = %plan.tenant, from = ?s.from, to = ?s.to, actors = moved.len(), "class migrated");
    }
    rt.metrics.alarms_pending.set(rt.timer.len() as u64);
    finish(data, plan, version)
}

/// One step on a node with a bucket: each actor of the class becomes the
/// actor of the same name in the target class (its copy restored there:
/// in place and uploaded, its alarm armed), and only then is deleted at
/// its old address (a tombstone in the bucket, its alarm and local data
/// gone). Each actor's move is idempotent: one a crash cut short is
/// copied and restored again (nothing ran on either address meanwhile,
/// the classes are closed). Returns how many actors it moved or deleted.
fn move_through_bucket(rt: &Inner, tenant: &str, s: &Step) -> Result<usize, RuntimeError> {
    let names = actors_of(rt, tenant, &s.from)?;
    for name in &names {
        let old = ActorId::new(tenant, &s.from.app, &s.from.class, name)?;
        let new = match &s.to {
            Some(to) => Some(ActorId::new(tenant, &to.app, &to.class, name)?),
            None => None,
        };
        move_actor(rt, &old, new.as_ref())?;
    }
    Ok(names.len())
}

/// Moves one actor of a closed class to `new` (`None`: deletes it): its
/// copy restored at the new address (uploaded, with a bucket), then its
/// old address deleted. `Ok(false)`: it had no data (moved already).
pub(crate) fn move_actor(
    rt: &Inner,
    old: &ActorId,
    new: Option<&ActorId>,
) -> Result<bool, RuntimeError> {
    rt.sockets.close_all(
        Some(old),
        crate::sockets::close_code::MOVED,
        "the actor's class was migrated by a deploy: reconnect",
    );
    if let Some(new) = new {
        // The restore moves the file into place.
        let copy = match StagedCopy::of(rt, old) {
            Ok(copy) => copy,
            Err(RuntimeError::ActorNotFound(_)) => return Ok(false),
            Err(e) => return Err(e),
        };
        // The entry its database names is the old address's, which the
        // delete below removes: at the new address its alarm is listed
        // afresh (a cluster node's `Settle`).
        wasmkeep_store::ActorDb::meta_set_in_file(
            &copy.path,
            crate::index::ALARM_INDEXED_META,
            "",
        )?;
        run_on(rt, new, Between::Restore(copy.path.clone(), None))?;
        if !skips_settle() {
            run_on(rt, new, Between::Settle)?;
        }
        crash_point();
    }
    run_on(rt, old, Between::Delete)?;
    Ok(true)
}

/// A cluster migration's check of one actor of a closed class, which this
/// node holds: its database, brought in line with the bucket, must have
/// no message or call not yet delivered (its receivers know it by its
/// address). `Ok(false)`: it has no data.
pub(crate) fn check_actor(rt: &Inner, id: &ActorId) -> Result<bool, RuntimeError> {
    let copy = match StagedCopy::of(rt, id) {
        Ok(copy) => copy,
        Err(RuntimeError::ActorNotFound(_)) => return Ok(false),
        Err(e) => return Err(e),
    };
    checked_alarm(id, &copy.path)?;
    Ok(true)
}

/// The committed alarm of the database at `file`, of actor `id` about to
/// move; `migration_conflict` if it has messages or calls not yet
/// delivered (its receivers know it by the address the move changes).
fn checked_alarm(id: &ActorId, file: &Path) -> Result<Option<u64>, RuntimeError> {
    let (alarm, outbox) = wasmkeep_store::db::read_wake(file).map_err(|e| {
        conflict(format!(
            "actor {id} could not be read to check its outbox ({e}); nothing moved"
        ))
    })?;
    if outbox {
        return Err(conflict(format!(
            "actor {id} has messages or calls not yet delivered: its receivers know it by its address, which the migration would change; retry the deploy once its outbox is empty"
        )));
    }
    Ok(alarm.map(|a| a.at_ms))
}

/// Closes `classes` for a cluster's closing record `record` (ADR 0071):
/// their events are refused from now on, until [`open_for_record`], and
/// their open actors finish what they queued and close. `Err` while some
/// still run events after [`MIGRATION_DRAIN_MS`] (the classes stay closed;
/// call again).
pub(crate) fn close_for_record(
    rt: &Inner,
    record: &str,
    classes: &[ClassKey],
) -> Result<(), RuntimeError> {
    {
        let mut by = rt.migrating.by_record.lock();
        if !by.contains_key(record) {
            rt.migrating.shut(classes);
            by.insert(record.to_owned(), classes.to_vec());
        }
    }
    close_actors(rt, classes)
}

/// Opens what [`close_for_record`] closed for `record`.
pub(crate) fn open_for_record(rt: &Inner, record: &str) {
    if let Some(keys) = rt.migrating.by_record.lock().remove(record) {
        rt.migrating.open(&keys);
    }
}

/// The closing records this node keeps classes closed for.
pub(crate) fn closed_records(rt: &Inner) -> Vec<String> {
    rt.migrating.by_record.lock().keys().cloned().collect()
}

/// Records every tag of `migrations` as applied by `version` of the app,
/// without moving anything: a cluster node installing a version whose
/// migrations the cluster's deploy applied (ADR 0071).
pub(crate) fn record_applied(
    data: &Path,
    tenant: &str,
    app: &str,
    migrations: &[ClassMigration],
    version: u64,
) -> Result<(), RuntimeError> {
    let plan = Plan {
        tenant: tenant.to_owned(),
        app: app.to_owned(),
        tags: migrations.iter().map(|m| m.tag.clone()).collect(),
        steps: Vec::new(),
    };
    finish(data, &plan, version)
}

/// Moves or removes one class folder; a step already done does nothing.
/// A class folder is only ever removed by moving it into `<data>/trash`
/// (emptied once the step is done, and at start): a target that holds an
/// actor is never replaced.
fn run_step(
    data: &Path,
    log: Option<&CommitLog>,
    tenant: &str,
    s: &Step,
) -> Result<(), RuntimeError> {
    let store = |e: std::io::Error| RuntimeError::Store(e.into());
    let from = paths::class_dir(data, tenant, &s.from.app, &s.from.class);
    if !from.exists() {
        return Ok(());
    }
    match &s.to {
        Some(to) => {
            let dest = paths::class_dir(data, tenant, &to.app, &to.class);
            if dest.exists() {
                if !paths::list_names(&dest, None, 1).map_err(store)?.is_empty() {
                    return Err(conflict(format!(
                        "class `{}` of {tenant}/{} has actors, so `{}` cannot move into it; neither was touched",
                        to.class, to.app, s.from.class
                    )));
                }
                // A folder without actors (all deleted, or none yet).
                to_trash(data, &dest)?;
            }
            std::fs::create_dir_all(dest.parent().expect("a class folder has a parent"))
                .map_err(store)?;
            // The commit log names each write by its database's path (ADR
            // 0074): what it holds of these actors is made durable in
            // their files before they move, and none of it is left to
            // replay after.
            wasmkeep_store::commit_log::move_folder(log, data, &from, &dest).map_err(store)?;
            sync_parent(&dest)?;
        }
        None => to_trash(data, &from)?,
    }
    sync_parent(&from)?;
    empty_trash(data);
    Ok(())
}

/// Names of folders set aside in `<data>/trash` by this process.
static TRASHED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Moves a folder into `<data>/trash` (one rename: it is gone from its
/// place at once, whatever happens to its removal).
fn to_trash(data: &Path, dir: &Path) -> Result<(), RuntimeError> {
    let store = |e: std::io::Error| RuntimeError::Store(e.into());
    let trash = data.join("trash");
    std::fs::create_dir_all(&trash).map_err(store)?;
    let n = TRASHED.fetch_add(1, Ordering::Relaxed);
    let gone = trash.join(format!("{}-{n}", std::process::id()));
    std::fs::rename(dir, &gone).map_err(store)?;
    sync_parent(dir)
}

/// Removes what `to_trash` set aside (best effort: a start tries again).
fn empty_trash(data: &Path) {
    let trash = data.join("trash");
    if trash.exists()
        && let Err(e) = std::fs::remove_dir_all(&trash)
    {
        tracing::warn!(path = %trash.display(), error = %e, "could not remove deleted classes' data; the next start tries again");
    }
}

fn sync_parent(path: &Path) -> Result<(), RuntimeError> {
    match path.parent() {
        Some(p) if p.exists() => {
            wasmkeep_store::sync::sync_dir(p).map_err(|e| RuntimeError::Store(e.into()))
        }
        _ => Ok(()),
    }
}

fn finish(data: &Path, plan: &Plan, version: u64) -> Result<(), RuntimeError> {
    let path = record_path(data, &plan.tenant, &plan.app);
    let mut record = read_record(&path)?;
    for tag in &plan.tags {
        if !record.applied.iter().any(|a| a.tag == *tag) {
            record.applied.push(Applied {
                tag: tag.clone(),
                version,
            });
        }
    }
    record.pending = None;
    write_record(&path, &record)
}

/// At start, before any actor is read: finishes the plans a node stopped
/// in the middle of (their version was written, or is about to be found
/// missing: either way the data follows the newest manifest). With a
/// bucket (`with_bucket`), a plan whose version was written moves actors
/// through their events, which need the node running: it is returned,
/// with its version, for [`resume`].
pub(crate) fn finish_pending(
    data: &Path,
    with_bucket: bool,
) -> Result<Vec<(Plan, u64)>, RuntimeError> {
    let mut later = Vec::new();
    empty_trash(data);
    let root = data.join("apps");
    let Ok(tenants) = std::fs::read_dir(&root) else {
        return Ok(later);
    };
    for t in tenants.flatten() {
        let Ok(apps) = std::fs::read_dir(t.path()) else {
            continue;
        };
        for a in apps.flatten() {
            let path = a.path().join("migrations.toml");
            if !path.exists() {
                continue;
            }
            let mut record = read_record(&path)?;
            let Some(plan) = record.pending.take() else {
                continue;
            };
            let Some(version) = recorded_with(&a.path(), &plan) else {
                // The node stopped before the deploy's version was
                // written: the deploy did not happen, nor does the plan.
                tracing::warn!(tenant = %plan.tenant, app = %plan.app, tags = ?plan.tags, "dropped a class migration whose deploy was not recorded");
                write_record(&path, &record)?;
                continue;
            };
            if with_bucket {
                later.push((plan, version));
                continue;
            }
            // Before any actor opens, after the log's replay forgot every
            // record: none names these folders.
            for s in &plan.steps {
                run_step(data, None, &plan.tenant, s)?;
            }
            tracing::info!(tenant = %plan.tenant, app = %plan.app, tags = ?plan.tags, "finished a class migration the node stopped in");
            finish(data, &plan, version)?;
        }
    }
    Ok(later)
}

/// At start on a node with a bucket, once its workers run and before it
/// serves: finishes a plan [`finish_pending`] returned. Its classes are
/// closed while it runs; the actors still at their old address are copied
/// and moved as the deploy would have (those it moved are found at their
/// new address only). A start that cannot finish it fails, rather than
/// serve a class half-moved.
pub(crate) fn resume(rt: &Inner, plan: &Plan, version: u64) -> Result<(), RuntimeError> {
    let gate = Gate::close(rt, plan)?;
    apply(rt, plan, &gate, version)?;
    tracing::info!(tenant = %plan.tenant, app = %plan.app, tags = ?plan.tags, "finished a class migration the node stopped in");
    Ok(())
}

/// The number of the app's newest version if its manifest lists every tag
/// of `plan` (the deploy that planned it was recorded).
fn recorded_with(dir: &Path, plan: &Plan) -> Option<u64> {
    let newest = crate::app_versions::read(dir).ok()?.pop()?;
    let text =
        std::fs::read_to_string(crate::app_versions::manifest_path(dir, newest.version)).ok()?;
    let manifest = crate::app::AppManifest::parse(&text).ok()?;
    plan.tags
        .iter()
        .all(|t| manifest.migrations.iter().any(|m| m.tag == *t))
        .then_some(newest.version)
}

/// The newest version of `app` that applied a class migration: a
/// rollback to a version before it would serve classes whose data moved.
pub(crate) fn newest_migrating_version(
    data: &Path,
    tenant: &str,
    app: &str,
) -> Result<Option<u64>, RuntimeError> {
    Ok(read_record(&record_path(data, tenant, app))?
        .applied
        .iter()
        .map(|a| a.version)
        .max())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<ClassMigration>, String> {
        #[derive(Deserialize)]
        struct M {
            migrations: Vec<ClassMigration>,
        }
        let m: M = toml::from_str(text).map_err(|e| e.to_string())?;
        check_manifest(&m.migrations)?;
        Ok(m.migrations)
    }

    #[test]
    fn a_manifest_names_its_migrations_by_tag() {
        let list = parse(
            r#"
            [[migrations]]
            tag = "v2"
            renamed_classes = [{ from = "room", to = "chat" }]
            deleted_classes = ["scratch"]
            transferred_classes = [{ from_app = "billing", from = "ledger", to = "ledger" }]
            "#,
        )
        .unwrap();
        assert_eq!(list[0].renamed_classes[0].to, "chat");
        assert_eq!(list[0].transferred_classes[0].from_app, "billing");
    }

    #[test]
    fn bad_migrations_are_named() {
        let e = parse("[[migrations]]\ntag = \"v1\"\n").unwrap_err();
        assert!(e.contains("names no class"), "{e}");
        let e = parse(
            "[[migrations]]\ntag = \"v1\"\ndeleted_classes = [\"a\"]\n[[migrations]]\ntag = \"v1\"\ndeleted_classes = [\"b\"]\n",
        )
        .unwrap_err();
        assert!(e.contains("listed twice"), "{e}");
        let e = parse("[[migrations]]\ntag = \"a b\"\ndeleted_classes = [\"a\"]\n").unwrap_err();
        assert!(e.contains("tag `a b`"), "{e}");
        let e = parse("[[migrations]]\ntag = \"v1\"\ndeleted_classes = [\"../x\"]\n").unwrap_err();
        assert!(e.contains("deleted_classes"), "{e}");
        let e = parse("[[migrations]]\ntag = \"v1\"\nrenamed = []\n").unwrap_err();
        assert!(e.contains("unknown field"), "{e}");
    }

    /// acme/shop: `room` renamed to `chat`, `scratch` deleted.
    fn room_to_chat_and_no_scratch() -> Plan {
        let class = |c: &str| ClassRef {
            app: "shop".into(),
            class: c.into(),
        };
        Plan {
            tenant: "acme".into(),
            app: "shop".into(),
            tags: vec!["v2".into()],
            steps: vec![
                Step {
                    from: class("room"),
                    to: Some(class("chat")),
                },
                Step {
                    from: class("scratch"),
                    to: None,
                },
            ],
        }
    }

    #[test]
    fn a_record_keeps_its_pending_plan_through_toml() {
        let plan = room_to_chat_and_no_scratch();
        let record = Record {
            applied: vec![Applied {
                tag: "v1".into(),
                version: 3,
            }],
            pending: Some(plan.clone()),
        };
        let back: Record = toml::from_str(&toml::to_string(&record).unwrap()).unwrap();
        assert_eq!(back.pending, Some(plan));
        assert_eq!(back.applied, record.applied);
    }

    /// Records a version of acme/shop with `manifest`, as a deploy does.
    fn record_version(data: &Path, manifest: &str) {
        let dir = crate::app::app_dir(data, "acme", "shop");
        std::fs::create_dir_all(&dir).unwrap();
        let new = crate::app_versions::NewVersion {
            hash: "h",
            deployed_ms: 1,
            classes: &[],
            component_bytes: 1,
            manifest,
            by: "",
            rollback_of: None,
            percent: 100,
            deferred: false,
            number: None,
        };
        crate::app_versions::append(&dir, &new, None, 10, |p, b| std::fs::write(p, b)).unwrap();
    }

    /// acme/shop/room/r1 (a database) and acme/shop/scratch/s1.
    fn two_actors(data: &Path) -> (ActorId, ActorId) {
        let id = ActorId::new("acme", "shop", "room", "r1").unwrap();
        std::fs::create_dir_all(paths::actor_dir(data, &id)).unwrap();
        std::fs::write(paths::actor_db(data, &id), b"data").unwrap();
        let gone = ActorId::new("acme", "shop", "scratch", "s1").unwrap();
        std::fs::create_dir_all(paths::actor_dir(data, &gone)).unwrap();
        (id, gone)
    }

    #[test]
    fn steps_are_idempotent_and_a_start_finishes_a_recorded_plan() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path();
        let (id, gone) = two_actors(data);
        let plan = room_to_chat_and_no_scratch();
        begin(data, &plan).unwrap();
        record_version(
            data,
            "[[migrations]]\ntag = \"v2\"\ndeleted_classes = [\"x\"]\n",
        );
        // The node stopped after the first step.
        run_step(data, None, "acme", &plan.steps[0]).unwrap();
        finish_pending(data, false).unwrap();
        let moved = ActorId::new("acme", "shop", "chat", "r1").unwrap();
        assert_eq!(
            std::fs::read(paths::actor_db(data, &moved)).unwrap(),
            b"data"
        );
        assert!(!paths::actor_dir(data, &id).exists());
        assert!(!paths::actor_dir(data, &gone).exists());
        assert!(!data.join("trash").exists());
        let record = read_record(&record_path(data, "acme", "shop")).unwrap();
        assert!(record.pending.is_none());
        assert_eq!(
            record.applied,
            vec![Applied {
                tag: "v2".into(),
                version: 1
            }]
        );
        // Again: nothing left to do.
        finish_pending(data, false).unwrap();
        assert_eq!(
            std::fs::read(paths::actor_db(data, &moved)).unwrap(),
            b"data"
        );
    }

    #[test]
    fn a_plan_whose_deploy_was_not_recorded_is_dropped_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path();
        let (id, gone) = two_actors(data);
        record_version(data, "");
        begin(data, &room_to_chat_and_no_scratch()).unwrap();
        finish_pending(data, false).unwrap();
        assert!(paths::actor_db(data, &id).exists(), "nothing moved");
        assert!(paths::actor_dir(data, &gone).exists(), "nothing deleted");
        let record = read_record(&record_path(data, "acme", "shop")).unwrap();
        assert!(record.pending.is_none() && record.applied.is_empty());
    }

    #[test]
    fn a_target_with_actors_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path();
        let (id, _) = two_actors(data);
        let there = ActorId::new("acme", "shop", "chat", "c1").unwrap();
        std::fs::create_dir_all(paths::actor_dir(data, &there)).unwrap();
        std::fs::write(paths::actor_db(data, &there), b"other").unwrap();
        let plan = room_to_chat_and_no_scratch();
        let e = run_step(data, None, "acme", &plan.steps[0]).unwrap_err();
        assert_eq!(e.code(), "migration_conflict", "{e}");
        assert_eq!(
            std::fs::read(paths::actor_db(data, &there)).unwrap(),
            b"other"
        );
        assert_eq!(std::fs::read(paths::actor_db(data, &id)).unwrap(), b"data");
    }
}
