//! `wasmkeep export` and `wasmkeep restore`: an actor's database out of and
//! back into the bucket, without a node (ADR 0007).

use std::path::Path;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use wasmkeep_replica::{At, Bucket, Image, ReplicaConfig, Uploaded};
use wasmkeep_store::ActorId;

/// `tenant/app/class/name`, the name percent-decoded (a name may hold `/`).
pub(crate) fn parse_actor(target: &str) -> Result<ActorId> {
    let parts: Vec<&str> = target.splitn(4, '/').collect();
    if parts.len() != 4 || parts.iter().any(|p| p.is_empty()) {
        bail!("expected tenant/app/class/name, got `{target}`");
    }
    let name = wasmkeep_store::id::decode_name(parts[3])
        .map_err(|why| anyhow::anyhow!("invalid_name: the name in `{target}`: {why}"))?;
    Ok(ActorId::new(parts[0], parts[1], parts[2], &name)?)
}

/// `--at`: a sequence number (`42`), a time in unix milliseconds with a
/// unit (`1764471600000ms`), or an RFC 3339 time (`2026-11-30T03:00:00Z`).
pub(crate) fn parse_at(s: Option<&str>) -> Result<At> {
    let Some(s) = s else { return Ok(At::Latest) };
    if let Ok(seq) = s.parse::<u64>() {
        return Ok(At::Seq(seq));
    }
    if let Some(ms) = s.strip_suffix("ms")
        && let Ok(ms) = ms.parse::<u64>()
    {
        return Ok(At::TimeMs(ms));
    }
    let t = humantime::parse_rfc3339_weak(s).map_err(|e| {
        anyhow::anyhow!(
            "--at `{s}`: not a sequence number, `<unix ms>ms` or an RFC 3339 time ({e})"
        )
    })?;
    let ms = t
        .duration_since(std::time::UNIX_EPOCH)
        .context("--at is before 1970")?
        .as_millis() as u64;
    Ok(At::TimeMs(ms))
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({elapsed})")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_owned());
    pb
}

fn io() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// The longest one bucket request of these commands may take.
const BUCKET_TIMEOUT_MS: u64 = 10_000;

/// The settings the bucket commands read and write the bucket with: the
/// nodes' own (`--config`), so that a chain a node with larger bounds wrote
/// is read with those bounds, and a node is judged live by the nodes' lease
/// timings.
pub(crate) struct Settings {
    replica: ReplicaConfig,
    protocol: wasmkeep_server::cluster::ClusterConfig,
}

impl Settings {
    /// From the nodes' configuration file, or the defaults without one.
    pub(crate) fn of(config: Option<&Path>) -> Result<Settings> {
        let node = match config {
            Some(path) => crate::config::NodeConfig::load(path)?,
            None => crate::config::NodeConfig::default(),
        };
        let runtime = node.runtime();
        Ok(Settings {
            replica: runtime.replica,
            protocol: runtime.protocol,
        })
    }
}

/// Writes the actor's database at `at` to `out` as a plain SQLite file.
pub(crate) fn export(
    bucket_url: &str,
    settings: &Settings,
    target: &str,
    at: Option<&str>,
    out: &Path,
) -> Result<()> {
    let id = parse_actor(target)?;
    let at = parse_at(at)?;
    if out.exists() {
        bail!("{} exists: export never overwrites a file", out.display());
    }
    let bucket = Bucket::from_url(bucket_url).with_context(|| format!("bucket {bucket_url}"))?;
    let pb = bar(0, "reading the chain");
    // Written beside the target and checked with `PRAGMA quick_check`
    // before it takes the target's name: never a half-written file, nor
    // one SQLite finds corrupt.
    let written = io()?.block_on(wasmkeep_replica::export_to_path(
        &bucket,
        &id,
        at,
        &settings.replica,
        out,
        &|done, total| {
            pb.set_length(total);
            pb.set_position(done);
        },
    ));
    pb.finish_and_clear();
    let bytes = written.with_context(|| format!("export {id} at {at}"))?;
    let m = bucket.metrics().snapshot();
    println!(
        "exported {id} ({at}) to {}: {bytes} bytes, {} objects read",
        out.display(),
        m.gets
    );
    Ok(())
}

/// Makes the SQLite file `input` the actor's latest state in the bucket,
/// with no node in between: refused while a cluster node's lease is live
/// (unless `force`), since a node holding the actor would then drop its
/// writes not yet uploaded (restore through it instead: `--server`).
pub(crate) fn restore(
    bucket_url: &str,
    settings: &Settings,
    target: &str,
    input: &Path,
    force: bool,
) -> Result<()> {
    let id = parse_actor(target)?;
    if !input.is_file() {
        bail!("{} is not a file", input.display());
    }
    let bucket = Bucket::from_url(bucket_url).with_context(|| format!("bucket {bucket_url}"))?;
    let live = live_nodes(&bucket, settings)?;
    if !live.is_empty() && !force {
        bail!(
            "refusing to write into a bucket that live cluster nodes use ({}): a node holding \
             {id} would drop its writes not yet in the bucket. Restore through a node instead: \
             `wasmkeep restore --server {} {target} -i {}` (it runs between two events and \
             keeps every acknowledged write), or stop the nodes; --force writes anyway",
            live.join(", "),
            live.first().map(String::as_str).unwrap_or("URL"),
            input.display()
        );
    }
    eprintln!(
        "note: a node running on this bucket without --advertise (single-node replication) \
         is not seen here: stop it first, or restore through it with --server"
    );
    let scratch = tempfile::tempdir().context("a scratch folder")?;
    let now_ms = wasmkeep_runtime::Clock::now_ms(&wasmkeep_runtime::SystemClock);
    let pb = bar(1, "writing to the bucket");
    let r = io()?.block_on(wasmkeep_replica::put_back(
        &bucket,
        &id,
        input,
        now_ms,
        settings.replica.clone(),
        scratch.path(),
        now_ms,
    ));
    pb.finish_and_clear();
    match r.with_context(|| format!("restore {id}"))? {
        Uploaded::Unchanged => println!("{id}: the bucket already holds this state"),
        Uploaded::Appended {
            position,
            entry_bytes,
            ..
        } => println!(
            "restored {} into {id} as seq {} ({entry_bytes} bytes); a node holding the actor gives it up on its next upload and restores this state",
            input.display(),
            position.seq
        ),
    }
    Ok(())
}

/// The advertised addresses of the cluster nodes whose lease in the bucket
/// is live now.
fn live_nodes(bucket: &Bucket, settings: &Settings) -> Result<Vec<String>> {
    use wasmkeep_server::cluster::{bucket::BucketDriver, view};
    let driver = BucketDriver::new(bucket.clone(), BUCKET_TIMEOUT_MS);
    let seen = io()?.block_on(view::read(&driver, &settings.protocol));
    let seen = seen.map_err(|e| anyhow::anyhow!("reading the cluster's leases: {e}"))?;
    Ok(seen.live.into_iter().map(|n| n.address).collect())
}

/// Ships every actor of a node's data folder that the bucket does not hold
/// yet as the first entry of its chain (a node's data, moving onto a
/// bucket). Actors the bucket already has are left alone on both sides; the
/// node must not be running (its lock on the folder is taken). What a crash
/// or power cut left in the node's commit log is replayed first, as a start
/// would: the actors' files then hold every acknowledged commit.
pub(crate) fn upload(bucket_url: &str, settings: &Settings, data: &Path) -> Result<()> {
    let bucket = Bucket::from_url(bucket_url).with_context(|| format!("bucket {bucket_url}"))?;
    let ids = wasmkeep_runtime::runtime::all_actors(data);
    if ids.is_empty() {
        bail!("no actors under {}", data.join("actors").display());
    }
    let held = wasmkeep_store::data_lock::DataLock::take(data, std::time::Duration::ZERO)
        .map_err(anyhow::Error::msg)?;
    wasmkeep_store::commit_log::recover(data)
        .with_context(|| format!("replay the commit log in {}", data.display()))?;
    let now_ms = wasmkeep_runtime::Clock::now_ms(&wasmkeep_runtime::SystemClock);
    let pb = bar(ids.len() as u64, "uploading");
    let (mut shipped, mut present, mut set_aside) = (0u64, 0u64, 0u64);
    let io = io()?;
    for id in &ids {
        let db_path = wasmkeep_store::paths::actor_db(data, id);
        let root = wasmkeep_replica::ActorRoot::new(id, bucket.prefix_bytes())?;
        let keys_max = settings.replica.listing_bound();
        let has_chain = io.block_on(async {
            let snaps = bucket.any_seq(&root.snap_dir(), None, 0, keys_max).await?;
            let logs = bucket.any_seq(&root.log_dir(), None, 0, keys_max).await?;
            anyhow::Ok(snaps || logs)
        })?;
        if has_chain {
            // Opening a replica here would restore over the local file.
            present += 1;
        } else {
            let (mut replica, opened) = io.block_on(wasmkeep_replica::Replica::open(
                &bucket,
                id,
                &db_path,
                now_ms,
                settings.replica.clone(),
                now_ms,
            ))?;
            if let wasmkeep_replica::Opened::SetAside { replaced } = opened {
                // Given up before its first upload landed: nothing of it
                // was kept, nothing to ship.
                pb.println(format!(
                    "{id}: its first commits were given up before any upload landed; set aside as {}",
                    replaced.display()
                ));
                set_aside += 1;
                pb.inc(1);
                continue;
            }
            // Read page by page, whatever its size (ADR 0038); through
            // SQLite if its log still holds commits.
            let uploaded = match wasmkeep_replica::WholeFile::probe(&db_path) {
                Ok(file) => io.block_on(replica.upload_file(&file, now_ms)),
                Err(_) => {
                    let image = Image::read_path(&db_path)
                        .with_context(|| format!("read {}", db_path.display()))?;
                    io.block_on(replica.upload(&image, now_ms))
                }
            };
            uploaded.with_context(|| format!("upload {id}"))?;
            shipped += 1;
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    println!(
        "{shipped} actors uploaded, {present} already in the bucket (left as they are), \
         {set_aside} set aside (given up before their first upload), from {}",
        data.display()
    );
    // A node that crashed before this upload still has to look for the
    // commits its crash left unuploaded in actors the bucket had (ADR
    // 0082): the lock tells its next start so, unless the last one stopped.
    if !held.previous_holder_crashed() {
        held.stopped();
    }
    Ok(())
}
