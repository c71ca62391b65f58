//! Point in time: a plain SQLite database as the chain held it at a seq or
//! at a time, within what retention keeps.

use wasmkeep_store::ActorId;

use crate::bucket::Bucket;
use crate::entry::{Entry, FIXED_HEADER_BYTES, Kind};
use crate::error::ReplicaError;
use crate::image::Image;
use crate::keys::ActorRoot;
use crate::limits::ReplicaConfig;
use crate::replica::fetch;

/// Which point of an actor's history to export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// The state right after the entry at this seq.
    Seq(u64),
    /// The state after the longest prefix of the chain whose entries were
    /// committed at or before this time (writers' clocks, milliseconds
    /// since the epoch).
    TimeMs(u64),
    /// The chain's head.
    Latest,
}

/// The database file's bytes at `at`. `NotRetained` when retention has
/// already dropped that point, or it is beyond the chain.
pub async fn export(
    bucket: &Bucket,
    id: &ActorId,
    at: At,
    config: &ReplicaConfig,
) -> Result<Vec<u8>, ReplicaError> {
    export_with_progress(bucket, id, at, config, &|_, _| {}).await
}

/// [`export`], calling `progress(objects_read, objects_to_read)` as it
/// reads the chain (for a progress bar).
pub async fn export_with_progress(
    bucket: &Bucket,
    id: &ActorId,
    at: At,
    config: &ReplicaConfig,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Vec<u8>, ReplicaError> {
    let root = ActorRoot::new(id, bucket.prefix_bytes())?;
    let snaps = bucket.list_seqs_sized(&root.snap_dir(), None).await?;
    // The base: the newest snapshot at or before the point, with the size
    // the listing gave for it.
    let base = match at {
        At::Latest => snaps.last().copied(),
        At::Seq(n) => snaps.iter().rev().find(|(s, _)| *s <= n).copied(),
        At::TimeMs(t) => {
            let mut found = None;
            for &(s, size) in snaps.iter().rev() {
                let key = root.snap(s);
                let head = bucket.get_prefix(&key, FIXED_HEADER_BYTES as u64).await?;
                if Entry::peek_header(&key, &head)?.time_ms <= t {
                    found = Some((s, size));
                    break;
                }
            }
            found
        }
    };
    let base_seq = base.map(|(s, _)| s);
    let (mut image, mut next) = match base {
        Some((s, size)) => {
            let e = fetch(bucket, &root, Kind::Snapshot, (s, size), config).await?;
            if let At::TimeMs(t) = at
                && e.time_ms > t
            {
                return Err(ReplicaError::corrupt(
                    root.snap(s),
                    "header and body differ",
                ));
            }
            let mut img = Image::empty(e.page_size);
            img.apply(&e)?;
            (Some(img), s + 1)
        }
        None => (None, 0),
    };
    let after = base_seq.map(|s| root.log(s));
    let logs = bucket
        .list_seqs_sized(&root.log_dir(), after.as_deref())
        .await?;
    let total = logs.len() as u64 + u64::from(base.is_some());
    let mut done = u64::from(base.is_some());
    progress(done, total);
    for (seq, size) in logs {
        if let At::Seq(n) = at
            && seq > n
        {
            break;
        }
        if seq != next {
            // Below the oldest entry kept (no base) or a gap.
            break;
        }
        let e = fetch(bucket, &root, Kind::Log, (seq, size), config).await?;
        if let At::TimeMs(t) = at
            && e.time_ms > t
        {
            break;
        }
        image
            .get_or_insert_with(|| Image::empty(e.page_size))
            .apply(&e)?;
        next += 1;
        done += 1;
        progress(done, total);
    }
    let reached = next.checked_sub(1);
    let ok = match at {
        At::Seq(n) => reached == Some(n),
        At::TimeMs(_) | At::Latest => image.is_some(),
    };
    match image {
        Some(img) if ok => Ok(img.into_bytes()),
        _ => Err(ReplicaError::NotRetained(format!(
            "{at:?} for actor=`{}` (reached seq {reached:?})",
            root.as_str()
        ))),
    }
}
