//! A cluster's replay of the actors whose copies only the bucket holds
//! (ADR 0062): no live node has a base copy of them (the node that held
//! them died or left, or the node that took them over has none from
//! before). Their records are in their databases, which the bucket keeps
//! commit by commit, so the node asked reads each such actor's newest
//! copy from the bucket, then an earlier state of it that starts a replay
//! of the records the newest keeps
//! ([`wasmkeep_runtime::replay::bucket_start`]), and replays from it as
//! from a base copy, one actor at a time.
//!
//! What it fills: the replay's sample, less the actors the nodes replayed,
//! with chosen actors no node replayed. Bounds: the bucket's listing of
//! the chosen classes is read up to [`REPLAY_BUCKET_NAMES_MAX`] names (a
//! listing reads each name's chain head); at most
//! [`REPLAY_BUCKET_EXAMINED_MAX`] actors are read from the bucket, each
//! with at most `REPLAY_BUCKET_PROBES_MAX` earlier states; the whole
//! phase stops starting work after `REPLAY_TIME_MS_MAX`, and says so.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use wasmkeep_replica::{At, ReplicaError};
use wasmkeep_runtime::ActorId;
use wasmkeep_runtime::replay::{
    ActorReplay, NodeNotReplayed, REPLAY_TIME_MS_MAX, ReplayOptions, ReplayReport, StagedCopy,
    bucket_probe_times, bucket_start, sample_order,
};
use wasmkeep_store::db::recording::{Recording, recording_at};

use super::{AppState, blocking};
use crate::cluster::ClusterState;

/// Most actor names a replay reads from the bucket's listing, over the
/// chosen classes (the sample is taken from those).
pub(super) const REPLAY_BUCKET_NAMES_MAX: usize = 10_000;
/// Most actors one replay reads from the bucket (an actor that recorded
/// nothing is read and passed over).
pub(super) const REPLAY_BUCKET_EXAMINED_MAX: usize = 100;

/// What the report names as the replayer of what the bucket could not
/// give (its listing failed, a replay was refused, the time ran out).
const BUCKET: &str = "bucket";

/// The phase's folder of staged files, removed however the phase ends
/// (the request's future may be dropped mid-way).
struct Staging(PathBuf);

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Adds to `report` the replay of chosen actors no node replayed, from the
/// bucket's history. What keeps it from checking an actor (the listing,
/// a refused replay, the time) is listed in `nodes_not_replayed` as the
/// `bucket`; an actor whose records no state of the history can start is
/// reported with its `error`: a deploy's gate passes on neither.
pub(super) async fn replay_from_bucket(
    s: &AppState,
    c: &ClusterState,
    (tenant, app): (&str, &str),
    wasm: Vec<u8>,
    opts: ReplayOptions,
    report: &mut ReplayReport,
) {
    let want = opts.sample.saturating_sub(report.actors_replayed);
    if want == 0 {
        return;
    }
    let deadline = wasmkeep_runtime::clock::instant() + Duration::from_millis(REPLAY_TIME_MS_MAX);
    let candidates = match candidates(s, c, (tenant, app), &opts, report, deadline).await {
        Ok(ids) => ids,
        Err(why) => return bucket_failed(report, why),
    };
    if candidates.is_empty() {
        return;
    }
    let rt = s.rt.clone();
    let staging = match blocking(move || rt.replay_staging_dir()).await {
        Ok(dir) => Staging(dir),
        Err(e) => return bucket_failed(report, e.message),
    };
    let mut found = ReplayReport::default();
    let mut replayed = 0;
    let examined_max = candidates.len();
    for (i, id) in candidates.into_iter().enumerate() {
        if replayed >= want {
            break;
        }
        if wasmkeep_runtime::clock::instant() >= deadline {
            let why = format!(
                "the replay's time ran out (replay_time_ms_max={REPLAY_TIME_MS_MAX}) after reading {i} of {examined_max} actors no node replayed from the bucket"
            );
            bucket_failed(&mut found, why);
            break;
        }
        let mut one = ActorReplay {
            actor: id.to_string(),
            node: Some(c.node().to_owned()),
            ..Default::default()
        };
        match stage(s, c, &id, &opts, &staging.0, i).await {
            Staged::Copy(copy) => {
                // One actor at a time: only its records are in memory.
                let (rt, w, o) = (s.rt.clone(), wasm.clone(), opts.clone());
                let (t, a) = (tenant.to_owned(), app.to_owned());
                match blocking(move || rt.replay_staged(&t, &a, &w, &o, vec![copy])).await {
                    Ok(mut r) => {
                        for a in &mut r.actors {
                            a.node = Some(c.node().to_owned());
                        }
                        replayed += r.actors_replayed;
                        found.merge(r);
                    }
                    Err(e) => {
                        bucket_failed(&mut found, format!("{}: {}", e.code, e.message));
                        break;
                    }
                }
            }
            Staged::NothingRecorded => {}
            Staged::Skipped(why) => {
                one.skipped = Some(why);
                found.actors.push(one);
            }
            Staged::Failed(why) => {
                one.error = Some(why);
                found.actors.push(one);
            }
        }
    }
    report.merge(found);
}

/// Lists the bucket as a replayer that could not check what it should.
fn bucket_failed(report: &mut ReplayReport, why: String) {
    report.nodes_not_replayed.push(NodeNotReplayed {
        node: BUCKET.into(),
        why,
    });
}

/// The chosen actors the bucket lists that no node replayed (skipped
/// ones included: they had records but no base copy there), in the
/// sample's order, at most [`REPLAY_BUCKET_EXAMINED_MAX`].
async fn candidates(
    s: &AppState,
    c: &ClusterState,
    (tenant, app): (&str, &str),
    opts: &ReplayOptions,
    report: &ReplayReport,
    deadline: Instant,
) -> Result<Vec<ActorId>, String> {
    let classes = s.rt.app(tenant, app).map(|a| a.classes).unwrap_or_default();
    let mut ids = Vec::new();
    'classes: for class in classes {
        if opts.class.as_ref().is_some_and(|c| *c != class) {
            continue;
        }
        if let Some(name) = &opts.name {
            ids.extend(ActorId::new(tenant, app, &class, name).ok());
            continue;
        }
        let mut after: Option<String> = None;
        loop {
            if wasmkeep_runtime::clock::instant() >= deadline {
                return Err(format!(
                    "the replay's time ran out (replay_time_ms_max={REPLAY_TIME_MS_MAX}) while listing {tenant}/{app}/{class} in the bucket"
                ));
            }
            let page = wasmkeep_replica::listing::class_page(
                c.bucket(),
                &s.rt.config().replica,
                (tenant, app, &class),
                "",
                after.as_deref(),
                1_000,
            )
            .await
            .map_err(|e| format!("listing {tenant}/{app}/{class} in the bucket: {e}"))?;
            ids.extend(
                page.names
                    .iter()
                    .filter_map(|n| ActorId::new(tenant, app, &class, n).ok()),
            );
            if ids.len() >= REPLAY_BUCKET_NAMES_MAX {
                ids.truncate(REPLAY_BUCKET_NAMES_MAX);
                break 'classes;
            }
            after = page.next;
            if after.is_none() {
                break;
            }
        }
    }
    let replayed = |id: &ActorId| {
        let id = id.to_string();
        report
            .actors
            .iter()
            .any(|a| a.actor == id && a.skipped.is_none())
    };
    ids.retain(|id| !replayed(id));
    sample_order(&mut ids);
    ids.truncate(REPLAY_BUCKET_EXAMINED_MAX);
    Ok(ids)
}

enum Staged {
    Copy(StagedCopy),
    /// The bucket holds no database of it now (deleted), or one without
    /// records.
    NothingRecorded,
    /// It recorded, and none of its events is chosen.
    Skipped(String),
    /// It recorded, and it cannot be replayed from the bucket.
    Failed(String),
}

/// Reads `id`'s newest copy from the bucket and, if it holds records, the
/// earliest of its probed states that starts a replay of them, staged in
/// `dir` (the `i`th actor's files).
async fn stage(
    s: &AppState,
    c: &ClusterState,
    id: &ActorId,
    opts: &ReplayOptions,
    dir: &Path,
    i: usize,
) -> Staged {
    let config = &s.rt.config().replica;
    let head_file = dir.join(format!("{i}.head.db"));
    let head = read_at(c, id, At::Latest, config, &head_file).await;
    let _ = tokio::fs::remove_file(&head_file).await;
    let head = match head {
        Ok(r) => r,
        Err(ReadError::NotThere) => return Staged::NothingRecorded,
        Err(ReadError::Failed(e)) => {
            return Staged::Failed(format!("reading its newest copy from the bucket: {e}"));
        }
    };
    if head.events.is_empty() {
        return Staged::NothingRecorded;
    }
    let times = bucket_probe_times(&head, opts);
    if times.is_empty() {
        return Staged::Skipped("no recorded event is chosen".into());
    }
    let mut why = Vec::new();
    for (n, t) in times.into_iter().enumerate() {
        let file = dir.join(format!("{i}.{n}.db"));
        let state = match read_at(c, id, At::TimeMs(t), config, &file).await {
            Ok(state) => state,
            Err(ReadError::NotThere) => {
                why.push(format!("at {t} ms: no database then"));
                continue;
            }
            Err(ReadError::Failed(e)) => {
                why.push(format!("at {t} ms: {e}"));
                continue;
            }
        };
        match bucket_start(&head, &state) {
            Ok(after_seq) => {
                return Staged::Copy(StagedCopy {
                    id: id.clone(),
                    file,
                    after_seq,
                    events: head.events,
                    from: format!(
                        "the bucket's history at {t} ms (after recorded seq {after_seq})"
                    ),
                });
            }
            Err(e) => {
                why.push(format!("at {t} ms: {e}"));
                let _ = tokio::fs::remove_file(&file).await;
            }
        }
    }
    Staged::Failed(format!(
        "no base copy on a live node, and no state of the bucket's history starts a replay of its records ({})",
        why.join("; ")
    ))
}

enum ReadError {
    /// The bucket holds no database of the actor at that point.
    NotThere,
    Failed(String),
}

/// Exports `id`'s database at `at` from the bucket into `file` and reads
/// its records.
async fn read_at(
    c: &ClusterState,
    id: &ActorId,
    at: At,
    config: &wasmkeep_replica::ReplicaConfig,
    file: &Path,
) -> Result<Recording, ReadError> {
    match wasmkeep_replica::export_to_path(c.bucket(), id, at, config, file, &|_, _| {}).await {
        Ok(_) => {}
        Err(ReplicaError::NotRetained(_)) => return Err(ReadError::NotThere),
        Err(e) => return Err(ReadError::Failed(e.to_string())),
    }
    let path = file.to_owned();
    tokio::task::spawn_blocking(move || recording_at(&path))
        .await
        .map_err(|e| ReadError::Failed(e.to_string()))?
        .map_err(|e| ReadError::Failed(e.to_string()))
}
