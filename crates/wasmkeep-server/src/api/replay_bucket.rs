//! A cluster's replay of the actors whose copies only the bucket holds
//! (ADR 0062): no live node has their files (the node that held them died
//! or left), or the node that holds them has no base copy (it took them
//! over since they recorded). Their records are in their databases, which
//! the bucket keeps commit by commit, so the node asked reads each such
//! actor's newest copy from the bucket, then an earlier state of it that
//! starts a replay of the records the newest keeps
//! ([`wasmkeep_runtime::replay::bucket_start`]), and replays from it as
//! from a base copy.
//!
//! Bounds: the bucket's listing of the chosen classes is read up to
//! [`REPLAY_BUCKET_NAMES_MAX`] names; at most
//! [`REPLAY_BUCKET_EXAMINED_MAX`] actors are read from the bucket per
//! replay, each with at most `REPLAY_BUCKET_PROBES_MAX` earlier states;
//! the replay's sample (less the actors the nodes replayed) caps how many
//! run.

use std::path::Path;

use wasmkeep_replica::At;
use wasmkeep_runtime::ActorId;
use wasmkeep_runtime::replay::{
    ActorReplay, NodeNotReplayed, ReplayOptions, ReplayReport, StagedCopy, bucket_probe_times,
    bucket_start, sample_order,
};
use wasmkeep_store::db::recording::{Recording, recording_at};

use super::{AppState, blocking};
use crate::cluster::ClusterState;

/// Most actor names a replay reads from the bucket's listing, over the
/// chosen classes (the sample is taken from those).
pub(super) const REPLAY_BUCKET_NAMES_MAX: usize = 100_000;
/// Most actors one replay reads from the bucket (an actor that recorded
/// nothing is read and passed over).
pub(super) const REPLAY_BUCKET_EXAMINED_MAX: usize = 100;

/// What the report names as the replayer of what the bucket could not
/// give (its listing failed, or the staged replay did).
const BUCKET: &str = "bucket";

/// Adds to `report` the replay of the chosen actors that no node replayed
/// from a base copy of its own, from the bucket's history. What fails
/// (the listing, the staged replay) is listed in `nodes_not_replayed` as
/// the `bucket`, so that a deploy's gate does not pass on it.
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
    let candidates = match candidates(s, c, (tenant, app), &opts, report).await {
        Ok(ids) => ids,
        Err(why) => {
            report.nodes_not_replayed.push(NodeNotReplayed {
                node: BUCKET.into(),
                why,
            });
            return;
        }
    };
    if candidates.is_empty() {
        return;
    }
    let rt = s.rt.clone();
    let dir = match blocking(move || rt.replay_staging_dir()).await {
        Ok(dir) => dir,
        Err(e) => {
            report.nodes_not_replayed.push(NodeNotReplayed {
                node: BUCKET.into(),
                why: e.message,
            });
            return;
        }
    };
    let mut copies = Vec::new();
    let mut passed = ReplayReport::default();
    for (i, id) in candidates.into_iter().enumerate() {
        if copies.len() >= want {
            break;
        }
        match stage(s, c, &id, &opts, &dir, i).await {
            Staged::Copy(copy) => copies.push(copy),
            Staged::NothingRecorded => {}
            Staged::No(why) => passed.actors.push(ActorReplay {
                actor: id.to_string(),
                node: Some(c.node().to_owned()),
                skipped: Some(why),
                ..Default::default()
            }),
        }
    }
    if !copies.is_empty() {
        let rt = s.rt.clone();
        let (t, a) = (tenant.to_owned(), app.to_owned());
        match blocking(move || rt.replay_staged(&t, &a, &wasm, &opts, copies)).await {
            Ok(mut r) => {
                for a in &mut r.actors {
                    a.node = Some(c.node().to_owned());
                }
                report.merge(r);
            }
            Err(e) => report.nodes_not_replayed.push(NodeNotReplayed {
                node: BUCKET.into(),
                why: format!("{}: {}", e.code, e.message),
            }),
        }
    }
    report.merge(passed);
    let _ = tokio::fs::remove_dir_all(&dir).await;
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
) -> Result<Vec<ActorId>, String> {
    let classes = s.rt.app(tenant, app).map(|a| a.classes).unwrap_or_default();
    let mut ids = Vec::new();
    for class in classes {
        if opts.class.as_ref().is_some_and(|c| *c != class) {
            continue;
        }
        if let Some(name) = &opts.name {
            ids.extend(ActorId::new(tenant, app, &class, name).ok());
            continue;
        }
        let mut after: Option<String> = None;
        loop {
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
            after = page.next;
            if after.is_none() || ids.len() >= REPLAY_BUCKET_NAMES_MAX {
                break;
            }
        }
        if ids.len() >= REPLAY_BUCKET_NAMES_MAX {
            ids.truncate(REPLAY_BUCKET_NAMES_MAX);
            break;
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
    /// The bucket's copy holds no record (or no actor is there).
    NothingRecorded,
    /// Why no state of the bucket's history can start its replay.
    No(String),
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
    let head = match read_at(c, id, At::Latest, config, &head_file).await {
        Ok(r) => r,
        Err(_) => return Staged::NothingRecorded,
    };
    let _ = tokio::fs::remove_file(&head_file).await;
    if head.events.is_empty() {
        return Staged::NothingRecorded;
    }
    let mut why = String::from("no recorded event is chosen");
    for (n, t) in bucket_probe_times(&head, opts).into_iter().enumerate() {
        let file = dir.join(format!("{i}.{n}.db"));
        let state = match read_at(c, id, At::TimeMs(t), config, &file).await {
            Ok(state) => state,
            Err(e) => {
                why = format!("at {t} ms: {e}");
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
                why = format!("at {t} ms: {e}");
                let _ = tokio::fs::remove_file(&file).await;
            }
        }
    }
    Staged::No(format!(
        "no base copy on a live node, and no state of the bucket's history starts a replay of its records ({why})"
    ))
}

/// Exports `id`'s database at `at` from the bucket into `file` and reads
/// its records.
async fn read_at(
    c: &ClusterState,
    id: &ActorId,
    at: At,
    config: &wasmkeep_replica::ReplicaConfig,
    file: &Path,
) -> Result<Recording, String> {
    wasmkeep_replica::export_to_path(c.bucket(), id, at, config, file, &|_, _| {})
        .await
        .map_err(|e| e.to_string())?;
    let path = file.to_owned();
    tokio::task::spawn_blocking(move || recording_at(&path))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}
