//! Replaying recorded events against a candidate build before it serves
//! (issue 38, ADR 0062).
//!
//! For each chosen actor of an app that records (`crate::recording`), a
//! replay:
//! 1. reads the actor's records through its own turn, and picks the
//!    oldest generation whose base copy is in the actor's folder;
//! 2. starts two sandboxes: runtimes of their own in a folder under
//!    `<data>/replay/`, on a clock only the replay moves, that record
//!    nothing and hand no outbox row over (`replay_sandbox`). The baseline
//!    runs the version each event was recorded with; the candidate runs
//!    the new build;
//! 3. runs the events before the chosen ones on the baseline only (from
//!    the base), then copies its database into the candidate;
//! 4. runs each chosen event on both with the recorded time and seed, and
//!    compares: the baseline's outcome with the record (if they differ,
//!    production cannot be reproduced and the actor stops there), the
//!    candidate's with the record, and the two databases' rows, table by
//!    table (a table's difference is reported when it changes).
//!
//! Bounds: [`REPLAY_ACTORS_MAX`] actors, [`REPLAY_EVENTS_MAX`] events in
//! one replay, [`REPLAY_DIFFERENCES_MAX`] differences and
//! [`REPLAY_ROWS_SHOWN`] rows per table difference reported per actor.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use wasmkeep_store::ActorId;
use wasmkeep_store::db::recording::{
    Generation, RecordedEvent, Recording, TableRows, base_file_name, compare_tables,
};

use crate::actor::{DbAccess, Event, Outcome};
use crate::clock::{Clock, ManualClock};
use crate::config::{Durability, RuntimeConfig};
use crate::error::RuntimeError;
use crate::guest_tape::EventTape;
use crate::runtime::Runtime;

/// Most actors one replay runs.
pub const REPLAY_ACTORS_MAX: usize = 100;
/// Most events one replay runs, over all its actors (warm-up included).
pub const REPLAY_EVENTS_MAX: usize = 20_000;
/// Most differences reported for one actor (the count goes on).
pub const REPLAY_DIFFERENCES_MAX: usize = 20;
/// Rows shown on each side of one table's difference.
pub const REPLAY_ROWS_SHOWN: usize = 5;
/// How long one replayed event may take to answer (a request that parks
/// its reply is reported as not answered).
pub const REPLAY_EVENT_WAIT_MS: u64 = 10_000;
/// How long one replay may run: actors and events past it are not run.
pub const REPLAY_TIME_MS_MAX: u64 = 120_000;
/// Bytes one side's rows may take (as SQL literals) for a replay to
/// compare an actor's tables; past it only answers are compared.
pub const REPLAY_TABLE_BYTES_MAX: usize = 64 << 20;

/// What to replay.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// Only this class's actors.
    pub class: Option<String>,
    /// Only this actor (with `class`).
    pub name: Option<String>,
    /// The chosen events start at this recorded sequence number.
    pub from_seq: Option<u64>,
    /// The chosen events start at this time (Unix ms).
    pub from_ms: Option<u64>,
    /// The chosen events are each actor's last `n`.
    pub last: Option<usize>,
    /// Actors replayed at most (chosen by a hash of their name).
    pub sample: usize,
    /// The candidate's manifest (default: the app's current one).
    pub manifest: Option<String>,
}

/// An actor's database as the bucket's history held it, staged in a file
/// on this node (see [`bucket_start`]), with the records of the bucket's
/// newest copy of it.
#[derive(Debug)]
pub struct StagedCopy {
    pub id: ActorId,
    /// The staged database, a state that holds the recorded events up to
    /// `after_seq` and none after.
    pub file: PathBuf,
    pub after_seq: u64,
    /// Every record the bucket's newest copy keeps.
    pub events: Vec<RecordedEvent>,
    /// Where the state came from, as a person reads it.
    pub from: String,
}

/// Where the actors' bases come from.
enum Bases {
    /// The base copies in this node's actor folders.
    Local,
    Staged(Vec<StagedCopy>),
}

/// What a replay found.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct ReplayReport {
    pub tenant: String,
    pub app: String,
    /// The candidate's content hash.
    pub candidate: String,
    /// Actors that had records to replay.
    pub actors_replayed: usize,
    /// Chosen events run on both builds.
    pub events_replayed: u64,
    /// Of those, events where the candidate differed.
    pub events_differing: u64,
    /// Actors whose baseline did not do what production recorded.
    pub actors_not_reproduced: usize,
    pub actors: Vec<ActorReplay>,
    /// A cluster's replay: the live nodes that did not answer with their
    /// own (none of their actors was checked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes_not_replayed: Vec<NodeNotReplayed>,
}

/// A node a cluster's replay could not include, and why.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeNotReplayed {
    pub node: String,
    pub why: String,
}

impl ReplayReport {
    /// Whether the candidate did what production did on every event.
    pub fn same(&self) -> bool {
        self.events_differing == 0
    }

    /// Adds what another node's replay of the same app found (a
    /// cluster's replay, ADR 0062): an actor both replayed (one held it
    /// before) counts once, as the replay that reached its later records;
    /// the counts are those of the actors kept.
    pub fn merge(&mut self, other: ReplayReport) {
        // The replay that reached later records; between equals, one that
        // ran over one skipped, and one that found a problem over one
        // that did not (whichever node was asked first).
        let rank = |a: &ActorReplay| {
            let problem = a.error.is_some() || a.cut.is_some() || a.not_reproduced.is_some();
            (a.last_seq, a.skipped.is_none(), problem)
        };
        for theirs in other.actors {
            match self.actors.iter_mut().find(|a| a.actor == theirs.actor) {
                Some(mine) if rank(&theirs) > rank(mine) => *mine = theirs,
                Some(_) => {}
                None => self.actors.push(theirs),
            }
        }
        self.actors.sort_by(|a, b| a.actor.cmp(&b.actor));
        self.nodes_not_replayed.extend(other.nodes_not_replayed);
        self.actors_replayed = self
            .actors
            .iter()
            .filter(|a| a.skipped.is_none() && a.error.is_none())
            .count();
        self.actors_not_reproduced = self
            .actors
            .iter()
            .filter(|a| a.not_reproduced.is_some())
            .count();
        self.events_replayed = self.actors.iter().map(|a| a.events).sum();
        self.events_differing = self.actors.iter().map(|a| a.events_differing).sum();
    }

    /// Actors whose replay did not run to its last chosen event (an
    /// error, a time or event budget, an event that cannot run again) or
    /// whose tables were too large to compare.
    pub fn incomplete(&self) -> usize {
        self.actors
            .iter()
            .filter(|a| a.cut.is_some() || a.error.is_some() || a.tables_not_compared.is_some())
            .count()
    }

    /// The kinds of difference found (`response`, `table <name>`).
    pub fn difference_kinds(&self) -> Vec<String> {
        let kinds: std::collections::BTreeSet<String> = self
            .actors
            .iter()
            .flat_map(|a| a.difference_kinds.iter().cloned())
            .collect();
        kinds.into_iter().collect()
    }
}

/// One actor's replay.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct ActorReplay {
    pub actor: String,
    /// The cluster node that replayed it (set by the server of a cluster;
    /// absent on a single node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Where the replay's starting database came from, when not from a
    /// base copy on the node (the bucket's history).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Recorded events run on the baseline only, to reach the chosen ones.
    pub warm_up_events: u64,
    /// Chosen events run on both.
    pub events: u64,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// Why nothing of it was replayed.
    pub skipped: Option<String>,
    /// Why its replay stopped before the last chosen event (or did not
    /// start: the replay's time or event budget ran out; or, from the
    /// bucket's history, could not begin at the first chosen event).
    pub cut: Option<String>,
    /// The error that stopped its replay.
    pub error: Option<String>,
    /// Why its tables were not compared (only answers were).
    pub tables_not_compared: Option<String>,
    /// Where the baseline did not do what production recorded.
    pub not_reproduced: Option<Difference>,
    /// Events where the candidate differed.
    pub events_differing: u64,
    /// Every kind of difference found (`response`, `table <name>`), also
    /// those past the differences shown.
    #[serde(default)]
    pub difference_kinds: std::collections::BTreeSet<String>,
    pub differences: Vec<Difference>,
}

/// One difference.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Difference {
    pub seq: u64,
    pub at_ms: u64,
    /// The event's kind (`request`, `alarm`, `message`, `response`).
    pub kind: String,
    /// `response` (what the event answered), or `table <name>`.
    pub what: String,
    /// Production's (or the baseline's) side.
    pub production: String,
    /// The candidate's side.
    pub candidate: String,
}

impl Runtime {
    /// Replays recorded events of `tenant/app`'s actors on this node
    /// against `wasm` (blocking: compiles, and runs events in sandboxes).
    pub fn replay(
        &self,
        tenant: &str,
        app: &str,
        wasm: &[u8],
        opts: &ReplayOptions,
    ) -> Result<ReplayReport, RuntimeError> {
        self.replay_from(tenant, app, wasm, opts, Bases::Local)
    }

    /// Replays actors from copies of their databases the bucket held
    /// (a cluster's replay of actors no live node has copies of): each
    /// [`StagedCopy`] is a file on this node, which the replay removes.
    /// `opts` chooses the events as for [`Runtime::replay`]; its sample
    /// and names were applied by whoever staged the copies.
    pub fn replay_staged(
        &self,
        tenant: &str,
        app: &str,
        wasm: &[u8],
        opts: &ReplayOptions,
        copies: Vec<StagedCopy>,
    ) -> Result<ReplayReport, RuntimeError> {
        let staged: Vec<PathBuf> = copies.iter().map(|c| c.file.clone()).collect();
        let r = self.replay_from(tenant, app, wasm, opts, Bases::Staged(copies));
        for file in staged {
            let _ = std::fs::remove_file(file);
        }
        r
    }

    /// A new folder for staging a replay's copies, under
    /// `<data>/replay/` (removed at the node's next start if left).
    pub fn replay_staging_dir(&self) -> Result<PathBuf, RuntimeError> {
        let dir = self
            .inner
            .config
            .data_dir
            .join("replay")
            .join(unique_folder());
        std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        Ok(dir)
    }

    fn replay_from(
        &self,
        tenant: &str,
        app: &str,
        wasm: &[u8],
        opts: &ReplayOptions,
        bases: Bases,
    ) -> Result<ReplayReport, RuntimeError> {
        let current = self
            .app(tenant, app)
            .ok_or_else(|| RuntimeError::AppNotFound(format!("{tenant}/{app}")))?;
        let Some(_one) = self.inner.replaying.try_lock() else {
            return Err(RuntimeError::Refused {
                code: "replay_busy",
                message: "another replay is running on this node (one at a time); try again when it is done".into(),
            });
        };
        let manifest = match &opts.manifest {
            Some(m) => m.clone(),
            None => {
                let version = self.inner.app(tenant, app).map_or(0, |a| a.deploy_version);
                self.version_manifest(tenant, app, version, &current.hash)
            }
        };
        // Checks the candidate as a deploy would, without serving it.
        let candidate_info = self.prepare(tenant, app, wasm, &manifest)?.info();
        let versions = self.versions(tenant, app)?;
        let mut report = ReplayReport {
            tenant: tenant.to_owned(),
            app: app.to_owned(),
            candidate: candidate_info.hash,
            ..Default::default()
        };
        let actors: Vec<(ActorId, Option<StagedCopy>)> = match bases {
            Bases::Local => self
                .replay_actors(tenant, app, &current.classes, opts)?
                .into_iter()
                .map(|id| (id, None))
                .collect(),
            Bases::Staged(copies) => copies
                .into_iter()
                .map(|c| (c.id.clone(), Some(c)))
                .collect(),
        };
        let work = self.inner.config.data_dir.join("replay");
        let mut budget = REPLAY_EVENTS_MAX;
        let deadline = crate::clock::instant() + Duration::from_millis(REPLAY_TIME_MS_MAX);
        for (id, staged) in actors {
            let mut one = ActorReplay {
                actor: id.to_string(),
                ..Default::default()
            };
            if crate::clock::instant() >= deadline {
                one.cut = Some(out_of_time());
                report.actors.push(one);
                continue;
            }
            let dir = work.join(unique_folder());
            let r = self.replay_actor(
                (&id, staged),
                (wasm, &manifest),
                (&versions, opts),
                &dir,
                (&mut budget, deadline),
                &mut one,
            );
            let _ = std::fs::remove_dir_all(&dir);
            if let Err(e) = r {
                one.error = Some(format!("{}: {e}", e.code()));
            }
            if one.skipped.is_none() && one.error.is_none() {
                report.actors_replayed += 1;
            }
            if one.not_reproduced.is_some() {
                report.actors_not_reproduced += 1;
            }
            report.events_replayed += one.events;
            report.events_differing += one.events_differing;
            report.actors.push(one);
        }
        Ok(report)
    }

    /// The manifest `version` was deployed with (one component may have
    /// been deployed with several), else the one stored by its hash.
    fn version_manifest(&self, tenant: &str, app: &str, version: u64, hash: &str) -> String {
        let dir = crate::app::app_dir(&self.inner.config.data_dir, tenant, app);
        std::fs::read_to_string(crate::app_versions::manifest_path(&dir, version))
            .unwrap_or_else(|_| self.stored_manifest(tenant, app, hash))
    }

    /// The actors a replay runs: this node's of the chosen classes (and
    /// name), at most `sample`, chosen by a hash of their address.
    fn replay_actors(
        &self,
        tenant: &str,
        app: &str,
        classes: &[String],
        opts: &ReplayOptions,
    ) -> Result<Vec<ActorId>, RuntimeError> {
        let sample = opts.sample.clamp(1, REPLAY_ACTORS_MAX);
        let mut ids = Vec::new();
        for class in classes {
            if opts.class.as_ref().is_some_and(|c| c != class) {
                continue;
            }
            if let Some(name) = &opts.name {
                ids.push(ActorId::new(tenant, app, class, name)?);
                continue;
            }
            let mut after = None;
            loop {
                let page = self.list_actors(tenant, app, class, after.as_deref(), 1000)?;
                let Some(last) = page.last().cloned() else {
                    break;
                };
                for name in page {
                    if let Ok(id) = ActorId::new(tenant, app, class, &name) {
                        ids.push(id);
                    }
                }
                after = Some(last);
            }
        }
        if let (Some(class), None) = (&opts.class, &opts.name)
            && !classes.contains(class)
        {
            return Err(RuntimeError::ClassNotFound {
                app: format!("{tenant}/{app}"),
                class: class.clone(),
            });
        }
        sample_order(&mut ids);
        // A cluster node replays the actors it holds: opening another's
        // would take it (or run a stale copy). Only actors with a base copy
        // here have anything to replay.
        let data = &self.inner.config.data_dir;
        let has_base = |id: &ActorId| {
            std::fs::read_dir(wasmkeep_store::paths::actor_dir(data, id)).is_ok_and(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("recording."))
            })
        };
        let chosen = ids
            .into_iter()
            .filter(|id| self.may_run_actor(id) && has_base(id))
            .take(sample)
            .collect();
        Ok(chosen)
    }

    /// Copies the actor's oldest kept base into `dir` (as `base.db`) and
    /// reads its records, in the actor's turn so that no generation
    /// starting meanwhile removes the base.
    fn local_base(
        &self,
        id: &ActorId,
        dir: &Path,
    ) -> Result<Option<(PathBuf, Vec<RecordedEvent>)>, RuntimeError> {
        let folder = wasmkeep_store::paths::actor_dir(&self.inner.config.data_dir, id);
        let staged = dir.join("base.db");
        let to = staged.clone();
        let events = self.with_db(id, move |access| {
            let recording = match access {
                DbAccess::Open(db) => db.recording()?,
                DbAccess::Closed(path) if path.exists() => {
                    wasmkeep_store::db::recording::recording_at(path)?
                }
                DbAccess::Closed(_) => Recording::default(),
            };
            let Some((base, events)) = replayable(&folder, recording) else {
                return Ok(None);
            };
            std::fs::copy(&base, &to).map_err(|e| io_err(&base, e))?;
            Ok(Some(events))
        })?;
        Ok(events.map(|e| (staged, e)))
    }

    /// Replays one actor from its local base copy, or from `staged` (a
    /// state the bucket's history held).
    fn replay_actor(
        &self,
        (id, staged): (&ActorId, Option<StagedCopy>),
        (wasm, manifest): (&[u8], &str),
        (versions, opts): (&[crate::app_versions::AppVersion], &ReplayOptions),
        dir: &Path,
        (budget, deadline): (&mut usize, Instant),
        out: &mut ActorReplay,
    ) -> Result<(), RuntimeError> {
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        let (base, events, start) = match staged {
            None => {
                let Some((base, events)) = self.local_base(id, dir)? else {
                    out.skipped = Some("nothing recorded with a base copy on this node".into());
                    return Ok(());
                };
                let start = chosen_start(&events, opts);
                (base, events, start)
            }
            Some(copy) => {
                out.base = Some(copy.from.clone());
                let (events, start, lost) = after_state(copy.events, copy.after_seq, opts);
                if let Some((n, from_seq)) = lost {
                    let lost = format!(
                        "{n} chosen events from seq {from_seq} came before the earliest state the bucket's history could start this replay from (after seq {})",
                        copy.after_seq
                    );
                    // Said in `base` too, which a later cut does not replace.
                    out.base = Some(format!("{}; {lost}", copy.from));
                    out.cut = Some(lost);
                }
                (copy.file, events, start)
            }
        };
        if start >= events.len() {
            out.skipped = Some("no recorded event is chosen".into());
            return Ok(());
        }
        if events.len() > *budget {
            out.cut = Some(format!(
                "{} events would pass the replay's limit replay_events_max={REPLAY_EVENTS_MAX}",
                events.len()
            ));
            return Ok(());
        }
        *budget -= events.len();
        let db_in = |side: &str| wasmkeep_store::paths::actor_db(&dir.join(side), id);
        place(&base, &db_in("baseline"))?;
        let clock = Arc::new(ManualClock::new(1));
        let baseline = Sandbox::start(self, id, &dir.join("baseline"), Arc::clone(&clock))?;
        let mut deployed = None;
        for ev in &events[..start] {
            if crate::clock::instant() >= deadline {
                out.cut = Some(out_of_time());
                return Ok(());
            }
            if let Some(why) = not_runnable(ev) {
                out.cut = Some(why);
                return Ok(());
            }
            baseline.deploy_version(self, id, versions, ev.version, &mut deployed)?;
            let got = baseline.run(id, ev, &clock)?;
            if got.as_bytes() != ev.outcome.as_slice() {
                out.not_reproduced = Some(difference(ev, "response", &ev.outcome, &got));
                return Ok(());
            }
            out.warm_up_events += 1;
        }
        let candidate_db = db_in("candidate");
        if start == 0 {
            place(&base, &candidate_db)?;
        } else {
            let folder = candidate_db.parent().expect("an actor's folder");
            std::fs::create_dir_all(folder).map_err(|e| io_err(folder, e))?;
            let dest = candidate_db.clone();
            baseline.runtime.with_db(id, move |access| match access {
                DbAccess::Open(db) => db.copy_to(&dest).map(|_| ()).map_err(RuntimeError::from),
                DbAccess::Closed(path) => wasmkeep_store::db::copy_at(path, &dest)
                    .map(|_| ())
                    .map_err(RuntimeError::from),
            })?;
        }
        let candidate = Sandbox::start(self, id, &dir.join("candidate"), Arc::clone(&clock))?;
        candidate
            .runtime
            .deploy(&id.tenant, &id.app, wasm, manifest)?;
        compare_events(
            &events[start..],
            versions,
            (self, id, deadline),
            (&baseline, &candidate),
            &clock,
            &mut deployed,
            out,
        )
    }
}

/// Runs each chosen event on the baseline and the candidate and notes
/// where they differ (see the module's documentation).
fn compare_events(
    chosen: &[RecordedEvent],
    versions: &[crate::app_versions::AppVersion],
    (node, id, deadline): (&Runtime, &ActorId, Instant),
    (baseline, candidate): (&Sandbox, &Sandbox),
    clock: &ManualClock,
    deployed: &mut Option<u64>,
    out: &mut ActorReplay,
) -> Result<(), RuntimeError> {
    let mut shown: BTreeMap<String, (Vec<String>, Vec<String>)> = BTreeMap::new();
    for ev in chosen {
        if crate::clock::instant() >= deadline {
            out.cut = Some(out_of_time());
            break;
        }
        if let Some(why) = not_runnable(ev) {
            out.cut = Some(why);
            break;
        }
        baseline.deploy_version(node, id, versions, ev.version, deployed)?;
        let base_out = baseline.run(id, ev, clock)?;
        if base_out.as_bytes() != ev.outcome.as_slice() {
            out.not_reproduced = Some(difference(ev, "response", &ev.outcome, &base_out));
            break;
        }
        let cand_out = candidate.run(id, ev, clock)?;
        out.events += 1;
        out.first_seq.get_or_insert(ev.seq);
        out.last_seq = Some(ev.seq);
        let mut found = Vec::new();
        if cand_out != base_out {
            found.push(difference(ev, "response", base_out.as_bytes(), &cand_out));
        }
        let rows = match out.tables_not_compared {
            Some(_) => None,
            None => Some((baseline.rows(id)?, candidate.rows(id)?)),
        };
        let tables = match rows {
            None => BTreeMap::new(),
            Some((Some(b), Some(c))) => compare_tables(&b, &c),
            Some(_) => {
                out.tables_not_compared = Some(format!(
                    "the rows take more than replay_table_bytes_max={REPLAY_TABLE_BYTES_MAX} bytes"
                ));
                BTreeMap::new()
            }
        };
        for (table, (only_base, only_cand)) in &tables {
            if shown.get(table) == Some(&(only_base.clone(), only_cand.clone())) {
                continue;
            }
            found.push(Difference {
                seq: ev.seq,
                at_ms: ev.at_ms,
                kind: ev.kind.clone(),
                what: format!("table {table}"),
                production: rows_text(only_base),
                candidate: rows_text(only_cand),
            });
        }
        for gone in shown.keys().filter(|t| !tables.contains_key(*t)) {
            found.push(Difference {
                seq: ev.seq,
                at_ms: ev.at_ms,
                kind: ev.kind.clone(),
                what: format!("table {gone}"),
                production: "(the tables agree again)".into(),
                candidate: "(the tables agree again)".into(),
            });
        }
        shown = tables;
        if !found.is_empty() {
            out.events_differing += 1;
            out.difference_kinds
                .extend(found.iter().map(|d| d.what.clone()));
            let room = REPLAY_DIFFERENCES_MAX.saturating_sub(out.differences.len());
            out.differences.extend(found.into_iter().take(room));
        }
    }
    Ok(())
}

/// The base copy and events a replay of this recording starts from: the
/// oldest kept generation whose base is in `folder`, and the events from
/// it on.
fn replayable(folder: &Path, recording: Recording) -> Option<(PathBuf, Vec<RecordedEvent>)> {
    let current = recording.generation?;
    let previous = Generation {
        number: current.number.saturating_sub(1),
        tag: current.tag.clone(),
    };
    let from = [previous, current]
        .into_iter()
        .filter(|g| g.number > 0)
        .find(|g| folder.join(base_file_name(g)).exists())?;
    let base = folder.join(base_file_name(&from));
    let events: Vec<RecordedEvent> = recording
        .events
        .into_iter()
        .filter(|e| e.generation >= from.number)
        .collect();
    Some((base, events))
}

/// A replay from a state that holds the records up to `after_seq`: the
/// events after it, the index of the first chosen one among them, and
/// how many chosen events (from which seq) the state already holds, which
/// cannot be replayed from it.
fn after_state(
    events: Vec<RecordedEvent>,
    after_seq: u64,
    opts: &ReplayOptions,
) -> (Vec<RecordedEvent>, usize, Option<(usize, u64)>) {
    let start = chosen_start(&events, opts);
    let held = events.iter().take_while(|e| e.seq <= after_seq).count();
    let lost = (held > start).then(|| (held - start, events[start].seq));
    let events: Vec<RecordedEvent> = events.into_iter().skip(held).collect();
    (events, start.saturating_sub(held), lost)
}

/// Whether an earlier state of an actor's database (`state`, read from
/// the bucket's history) can start a replay of the records its newest
/// copy keeps (`head`), and from which seq on: `state` must belong to the
/// same run of generations (its tag) and its last record must be one
/// `head` keeps, the same in every field. Then nothing was committed
/// between that record's batch and the next recorded one without being
/// recorded (such a batch ends the run, and a new run has a new tag), and
/// the events after it are exactly what `head` holds after it. Returns
/// that record's seq, or why `state` cannot start the replay.
pub fn bucket_start(head: &Recording, state: &Recording) -> Result<u64, String> {
    let (Some(h), Some(s)) = (&head.generation, &state.generation) else {
        return Err("it holds no records of the run the newest copy keeps".into());
    };
    if h.tag != s.tag {
        return Err("its records are of another run than the newest copy's".into());
    }
    let Some(last) = state.events.last() else {
        return Err("it holds no records of the run the newest copy keeps".into());
    };
    match head.events.iter().find(|e| e.seq == last.seq) {
        Some(e) if same_record(e, last) => {
            if head.events.last().is_some_and(|l| l.seq > last.seq) {
                Ok(last.seq)
            } else {
                Err(format!("it holds every kept record (to seq {})", last.seq))
            }
        }
        Some(_) => Err(format!(
            "its record {} differs from the newest copy's",
            last.seq
        )),
        None => Err(format!(
            "its last record ({}) is older than those the newest copy keeps",
            last.seq
        )),
    }
}

fn same_record(a: &RecordedEvent, b: &RecordedEvent) -> bool {
    (
        a.generation,
        a.at_ms,
        &a.seed,
        a.version,
        &a.kind,
        &a.input,
        &a.outcome,
    ) == (
        b.generation,
        b.at_ms,
        &b.seed,
        b.version,
        &b.kind,
        &b.input,
        &b.outcome,
    )
}

/// Most states of its history a replay reads from the bucket per actor
/// to find one that starts it ([`bucket_probe_times`]).
pub const REPLAY_BUCKET_PROBES_MAX: usize = 4;

/// The times (Unix ms, earliest first) at which to read an actor's state
/// from the bucket's history to start a replay of `head`'s chosen events:
/// just before the first chosen one, then before later ones (an earlier
/// state may predate the run of records, which cannot be checked); at
/// most [`REPLAY_BUCKET_PROBES_MAX`].
pub fn bucket_probe_times(head: &Recording, opts: &ReplayOptions) -> Vec<u64> {
    let events = &head.events;
    let start = chosen_start(events, opts);
    if start >= events.len() {
        return Vec::new();
    }
    let last = events.len() - 1;
    let mut times: Vec<u64> = [start, start + 1, start + (last - start) / 2, last]
        .into_iter()
        .filter(|&i| i <= last)
        .map(|i| events[i].at_ms.saturating_sub(1))
        .collect();
    times.sort_unstable();
    times.dedup();
    times.truncate(REPLAY_BUCKET_PROBES_MAX);
    times
}

/// The order a replay samples actors in: by a hash of the address, so
/// that every node (and the bucket's listing) picks the same ones.
pub fn sample_order(ids: &mut [ActorId]) {
    ids.sort_by_cached_key(|id| {
        use sha2::Digest as _;
        let h = sha2::Sha256::digest(id.to_string().as_bytes());
        (
            u64::from_be_bytes(h[..8].try_into().expect("8 bytes")),
            id.to_string(),
        )
    });
}

/// The index of the first chosen event.
fn chosen_start(events: &[RecordedEvent], opts: &ReplayOptions) -> usize {
    let mut start = 0;
    if let Some(seq) = opts.from_seq {
        start = events
            .iter()
            .position(|e| e.seq >= seq)
            .unwrap_or(events.len());
    }
    if let Some(ms) = opts.from_ms {
        start = start.max(
            events
                .iter()
                .position(|e| e.at_ms >= ms)
                .unwrap_or(events.len()),
        );
    }
    if let Some(n) = opts.last {
        start = start.max(events.len().saturating_sub(n));
    }
    start
}

fn difference(ev: &RecordedEvent, what: &str, production: &[u8], candidate: &str) -> Difference {
    Difference {
        seq: ev.seq,
        at_ms: ev.at_ms,
        kind: ev.kind.clone(),
        what: what.to_owned(),
        production: String::from_utf8_lossy(production).into_owned(),
        candidate: candidate.to_owned(),
    }
}

fn rows_text(rows: &[String]) -> String {
    let mut s: Vec<String> = rows.iter().take(REPLAY_ROWS_SHOWN).cloned().collect();
    if rows.len() > REPLAY_ROWS_SHOWN {
        s.push(format!(
            "… and {} rows more",
            rows.len() - REPLAY_ROWS_SHOWN
        ));
    }
    if s.is_empty() {
        return "(no row the other side lacks)".into();
    }
    s.join("\n")
}

/// Why a recorded event cannot run again, if it cannot: a socket's event
/// (its socket is gone, and what it wrote would be missing from every
/// later event's database), or an input that no longer decodes.
fn not_runnable(ev: &RecordedEvent) -> Option<String> {
    if crate::recording::event_of(&ev.kind, &ev.input).is_some() {
        return None;
    }
    Some(format!(
        "event #{} ({}) cannot run again (a socket's event: its socket is gone); the replay of this actor stops before it",
        ev.seq, ev.kind
    ))
}

fn out_of_time() -> String {
    format!("the replay's time ran out (replay_time_ms_max={REPLAY_TIME_MS_MAX})")
}

fn io_err(path: &Path, e: std::io::Error) -> RuntimeError {
    RuntimeError::Internal(format!("replay: {}: {e}", path.display()))
}

/// Copies a base into a sandbox's actor folder.
fn place(base: &Path, db: &Path) -> Result<(), RuntimeError> {
    let folder = db.parent().expect("an actor's folder");
    std::fs::create_dir_all(folder).map_err(|e| io_err(folder, e))?;
    std::fs::copy(base, db).map_err(|e| io_err(db, e))?;
    Ok(())
}

fn unique_folder() -> String {
    let mut raw = [0u8; 8];
    let _ = getrandom::fill(&mut raw);
    hex::encode(raw)
}

/// A runtime of its own for one side of one actor's replay.
struct Sandbox {
    runtime: Runtime,
}

impl Sandbox {
    fn start(
        node: &Runtime,
        id: &ActorId,
        dir: &Path,
        clock: Arc<ManualClock>,
    ) -> Result<Sandbox, RuntimeError> {
        // The app's secrets, which its actors read as in production.
        let secrets = |data: &Path| data.join("secrets").join(&id.tenant).join(&id.app);
        let from = secrets(&node.inner.config.data_dir);
        if from.exists() {
            let to = secrets(dir);
            std::fs::create_dir_all(to.parent().expect("a tenant's folder"))
                .map_err(|e| io_err(&to, e))?;
            std::fs::copy(&from, &to).map_err(|e| io_err(&to, e))?;
        }
        let prod = &node.inner.config;
        let mut config = RuntimeConfig::new(dir);
        config.replay_sandbox = true;
        config.durability = Durability::Process;
        config.instances_max = 4;
        config.workers = 1;
        config.event_cpu_ms_max = prod.event_cpu_ms_max;
        config.instance_memory_bytes_max = prod.instance_memory_bytes_max;
        config.store = prod.store.clone();
        config.app_limit_ceilings = prod.app_limit_ceilings.clone();
        config.outbox = prod.outbox.clone();
        config.outbound = prod.outbound.clone();
        config.compile = prod.compile.clone();
        config.component_core_instances_max = prod.component_core_instances_max;
        config.component_memories_max = prod.component_memories_max;
        config.component_tables_max = prod.component_tables_max;
        config.response_body_bytes_max = prod.response_body_bytes_max;
        config.idempotency_retention_ms = prod.idempotency_retention_ms;
        // Process-wide: a sandbox keeps the node's.
        config.node_memory_bytes_max = prod.node_memory_bytes_max;
        config.compile_cache_dir = Some(node.inner.cache_dir.clone());
        config.compile_cache_key_path = Some(crate::runtime::cache_key_path(prod));
        let clock: Arc<dyn Clock> = clock;
        let runtime = Runtime::start(config, clock)?;
        #[cfg(any(test, feature = "test-faults"))]
        runtime.faults().unsafe_replay_without_tape.store(
            node.faults().unsafe_replay_without_tape(),
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(Sandbox { runtime })
    }

    /// Serves the version an event was recorded with, if it is not yet.
    fn deploy_version(
        &self,
        node: &Runtime,
        id: &ActorId,
        versions: &[crate::app_versions::AppVersion],
        version: u64,
        deployed: &mut Option<u64>,
    ) -> Result<(), RuntimeError> {
        if *deployed == Some(version) {
            return Ok(());
        }
        let v = versions
            .iter()
            .find(|v| v.version == version)
            .ok_or_else(|| RuntimeError::VersionNotFound {
                app: format!("{}/{}", id.tenant, id.app),
                version,
            })?;
        let wasm = node
            .stored_component(&id.tenant, &id.app, &v.hash)
            .ok_or_else(|| {
                RuntimeError::Internal(format!("the component of version {version} is missing"))
            })?;
        let manifest = node.version_manifest(&id.tenant, &id.app, version, &v.hash);
        self.runtime.deploy(&id.tenant, &id.app, &wasm, &manifest)?;
        *deployed = Some(version);
        Ok(())
    }

    /// Runs one recorded event with its time and seed; what it answered.
    fn run(
        &self,
        id: &ActorId,
        ev: &RecordedEvent,
        clock: &ManualClock,
    ) -> Result<String, RuntimeError> {
        let Some(kind) = crate::recording::event_of(&ev.kind, &ev.input) else {
            return Err(RuntimeError::Internal(format!(
                "event #{} cannot run again",
                ev.seq
            )));
        };
        clock.set_ms(ev.at_ms);
        let mut seed = [0u8; 32];
        let n = ev.seed.len().min(32);
        seed[..n].copy_from_slice(&ev.seed[..n]);
        *self.runtime.inner.sandbox_tape.lock() = Some(EventTape {
            at_ms: ev.at_ms,
            seed,
        });
        let (tx, mut rx) = oneshot::channel::<Result<Outcome, RuntimeError>>();
        self.runtime
            .inner
            .enqueue(id, Event::new(kind, Some(tx)), true)?;
        let deadline = crate::clock::instant() + Duration::from_millis(REPLAY_EVENT_WAIT_MS);
        loop {
            match rx.try_recv() {
                Ok(r) => return Ok(crate::recording::describe_outcome(&r)),
                Err(oneshot::error::TryRecvError::Closed) => {
                    return Err(RuntimeError::ShuttingDown);
                }
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            if crate::clock::instant() >= deadline {
                return Ok("no answer (the reply was parked, or the event did not end)".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn rows(&self, id: &ActorId) -> Result<Option<TableRows>, RuntimeError> {
        self.runtime.with_db(id, |access| match access {
            DbAccess::Open(db) => db
                .table_rows(REPLAY_TABLE_BYTES_MAX)
                .map_err(RuntimeError::from),
            DbAccess::Closed(path) => {
                wasmkeep_store::db::recording::table_rows_at(path, REPLAY_TABLE_BYTES_MAX)
                    .map_err(RuntimeError::from)
            }
        })
    }
}

impl Drop for Sandbox {
    /// Every way out of an actor's replay stops its sandboxes (events left
    /// in them get a second to end; their folder is removed after).
    fn drop(&mut self) {
        self.runtime.shutdown(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64, at_ms: u64) -> RecordedEvent {
        RecordedEvent {
            seq,
            generation: 1,
            at_ms,
            seed: vec![seq as u8; 4],
            version: 1,
            kind: "request".into(),
            input: vec![],
            outcome: format!("answer {seq}").into_bytes(),
        }
    }

    fn recording(tag: &str, seqs: std::ops::RangeInclusive<u64>) -> Recording {
        Recording {
            generation: Some(Generation {
                number: 1,
                tag: tag.into(),
            }),
            events: seqs.map(|n| record(n, 1000 + 10 * n)).collect(),
        }
    }

    #[test]
    fn only_a_state_of_the_same_run_starts_a_replay_from_the_bucket() {
        let head = recording("aaaa", 3..=9);
        assert_eq!(bucket_start(&head, &recording("aaaa", 1..=4)), Ok(4));
        // Another run (a restore, or a batch that was not recorded).
        let other = bucket_start(&head, &recording("bbbb", 1..=4)).unwrap_err();
        assert!(other.contains("another run"), "{other}");
        // Older than what the newest copy keeps: events would be missing.
        let old = bucket_start(&head, &recording("aaaa", 1..=2)).unwrap_err();
        assert!(old.contains("older"), "{old}");
        // The same seq with another event (a restored past reused it).
        let mut forked = recording("aaaa", 1..=5);
        forked.events[4].seed = vec![9; 4];
        let forked = bucket_start(&head, &forked).unwrap_err();
        assert!(forked.contains("differs"), "{forked}");
        // Before the run began, nothing can be checked.
        let before = Recording::default();
        assert!(bucket_start(&head, &before).is_err());
        // Nothing left to replay after it.
        assert!(bucket_start(&head, &recording("aaaa", 1..=9)).is_err());
    }

    #[test]
    fn a_state_that_holds_chosen_events_says_how_many_it_cannot_replay() {
        let events = recording("aaaa", 1..=5).events;
        let all = ReplayOptions::default();
        let (run, start, lost) = after_state(events.clone(), 2, &all);
        assert_eq!(run.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4, 5]);
        assert_eq!((start, lost), (0, Some((2, 1))));
        let last_two = ReplayOptions {
            last: Some(2),
            ..Default::default()
        };
        let (run, start, lost) = after_state(events, 2, &last_two);
        assert_eq!(run.len(), 3);
        // Seq 3 runs on the baseline only; 4 and 5 are compared.
        assert_eq!((start, lost), (1, None));
    }

    #[test]
    fn probes_start_just_before_the_first_chosen_event() {
        let head = recording("aaaa", 1..=9);
        let last_three = ReplayOptions {
            last: Some(3),
            ..Default::default()
        };
        // Events 7, 8 and 9 at 1070, 1080, 1090 ms.
        assert_eq!(bucket_probe_times(&head, &last_three), [1069, 1079, 1089]);
        let all = bucket_probe_times(&head, &ReplayOptions::default());
        assert_eq!(all, [1009, 1019, 1049, 1089]);
        assert!(all.len() <= REPLAY_BUCKET_PROBES_MAX);
    }

    fn actor(name: &str, last_seq: u64, differing: u64) -> ActorReplay {
        ActorReplay {
            actor: name.into(),
            events: last_seq,
            last_seq: Some(last_seq),
            events_differing: differing,
            ..Default::default()
        }
    }

    #[test]
    fn a_merged_report_counts_each_actor_once_as_its_latest_replay() {
        let mut mine = ReplayReport {
            actors: vec![actor("t/a/c/x", 3, 1), actor("t/a/c/y", 5, 0)],
            ..Default::default()
        };
        // Another node replayed x from later records (it holds x now),
        // y from earlier ones, and z, which only it has.
        let theirs = ReplayReport {
            actors: vec![
                actor("t/a/c/x", 7, 0),
                actor("t/a/c/y", 2, 2),
                actor("t/a/c/z", 1, 1),
            ],
            nodes_not_replayed: vec![NodeNotReplayed {
                node: "n3".into(),
                why: "no answer".into(),
            }],
            ..Default::default()
        };
        mine.merge(theirs);
        let kept: Vec<(&str, Option<u64>)> = mine
            .actors
            .iter()
            .map(|a| (a.actor.as_str(), a.last_seq))
            .collect();
        assert_eq!(
            kept,
            vec![
                ("t/a/c/x", Some(7)),
                ("t/a/c/y", Some(5)),
                ("t/a/c/z", Some(1))
            ]
        );
        assert_eq!(mine.actors_replayed, 3);
        assert_eq!(mine.events_replayed, 7 + 5 + 1);
        assert_eq!(mine.events_differing, 1);
        assert_eq!(
            mine.nodes_not_replayed.len(),
            1,
            "the node without a replay"
        );
        // Equal records: a replay that ran wins over a skipped one.
        let mut a = ReplayReport {
            actors: vec![ActorReplay {
                actor: "t/a/c/s".into(),
                skipped: Some("no copy".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        a.merge(ReplayReport {
            actors: vec![ActorReplay {
                actor: "t/a/c/s".into(),
                not_reproduced: Some(Difference {
                    seq: 1,
                    at_ms: 0,
                    kind: "request".into(),
                    what: "response".into(),
                    production: "a".into(),
                    candidate: "b".into(),
                }),
                ..Default::default()
            }],
            ..Default::default()
        });
        assert_eq!(a.actors_not_reproduced, 1);
    }
}
