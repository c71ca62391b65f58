//! The actors of a class as the bucket holds them, for listings of a whole
//! cluster (issue 39): each actor is a folder under
//! `state/<tenant>/<app>/<class>/`, named by the hex of its name
//! ([`crate::keys`]), and an actor deleted since is a chain that ends in a
//! tombstone.
//!
//! A page of names costs one listing with a delimiter per 1,000 folders on
//! S3 (`ListObjectsV2` with `Delimiter`, `StartAfter` and `MaxKeys`), plus,
//! for each folder on the page, the listings that find its chain's head
//! (two or three) and, only when the head is small enough to be a
//! tombstone, one GET: see [`class_page`].

use std::collections::BTreeSet;

use wasmkeep_store::ActorId;
use wasmkeep_store::paths::HEX_SEGMENT_CHARS;

use crate::bucket::Bucket;
use crate::entry::{Entry, Kind, Token};
use crate::error::ReplicaError;
use crate::keys::ActorRoot;
use crate::limits::ReplicaConfig;
use crate::replica::list_chain;

/// Most names one page holds.
pub const CLASS_PAGE_NAMES_MAX: usize = 1_000;

/// What the bucket holds at an actor's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketActor {
    /// Nothing.
    Absent,
    /// A chain whose head is a database.
    Live,
    /// A chain that ends in a tombstone: the actor was deleted.
    Deleted,
}

/// One page of the live actors of a class: their names, in byte order,
/// that start with `prefix` and sort after `after`, at most `limit`; and
/// the name to list after for the next page (`None`: no more).
///
/// Names longer than 100 bytes (their folder is split in pieces of 200
/// hex characters, every piece but the last ending in `+`) are found by
/// listing the pieces' folders in turn.
pub async fn class_page(
    bucket: &Bucket,
    config: &ReplicaConfig,
    (tenant, app, class): (&str, &str, &str),
    prefix: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<(Vec<String>, Option<String>), ReplicaError> {
    let limit = limit.clamp(1, CLASS_PAGE_NAMES_MAX);
    let class_dir = format!("state/{tenant}/{app}/{class}/");
    let hex_prefix = hex::encode(prefix.as_bytes());
    let mut names = Vec::new();
    let mut cursor = after.map(|a| hex::encode(a.as_bytes()));
    loop {
        let want = limit - names.len();
        let folders = folders_of(bucket, &class_dir, &hex_prefix, cursor.as_deref(), want).await?;
        let full = folders.len() == want;
        for hex_name in &folders {
            cursor = Some(hex_name.clone());
            let Some(name) = hex::decode(hex_name)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
            else {
                continue;
            };
            let Ok(id) = ActorId::new(tenant, app, class, &name) else {
                continue;
            };
            if actor_state(bucket, config, &id).await? == BucketActor::Live {
                names.push(name);
            }
        }
        if !full || names.len() == limit {
            let next = (full && names.len() == limit)
                .then(|| cursor.and_then(|c| String::from_utf8(hex::decode(c).ok()?).ok()))
                .flatten();
            return Ok((names, next));
        }
    }
}

/// The hex names of actor folders under `class_dir` that start with
/// `hex_prefix` and sort after `after`, at most `limit`, in order. A long
/// name's pieces are joined (its folders ending in `+` are listed in turn).
async fn folders_of(
    bucket: &Bucket,
    class_dir: &str,
    hex_prefix: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>, ReplicaError> {
    let mut out = BTreeSet::new();
    let mut stack = vec![(class_dir.to_owned(), String::new())];
    while let Some((dir, joined)) = stack.pop() {
        // The part of the prefix and cursor this level sees.
        let level = |s: &str| s.get(joined.len()..).unwrap_or("").to_owned();
        let sub_prefix = if hex_prefix.starts_with(&joined) {
            level(hex_prefix)
        } else {
            String::new()
        };
        let sub_prefix = &sub_prefix[..sub_prefix.len().min(HEX_SEGMENT_CHARS)];
        let sub_after = after
            .filter(|a| a.starts_with(&joined))
            .map(level)
            .map(|a| a[..a.len().min(HEX_SEGMENT_CHARS)].to_owned());
        for child in bucket
            .list_folders(&dir, sub_prefix, sub_after.as_deref(), limit)
            .await?
        {
            match child.strip_suffix('+') {
                Some(piece) => stack.push((format!("{dir}{child}/"), format!("{joined}{piece}"))),
                None => {
                    let full = format!("{joined}{child}");
                    if full.starts_with(hex_prefix) && after.is_none_or(|a| full.as_str() > a) {
                        out.insert(full);
                    }
                }
            }
        }
    }
    Ok(out.into_iter().take(limit).collect())
}

/// What the bucket holds for `id`: the head of its chain is found by
/// listing (two or three listings), and read (one GET) only when it is no
/// larger than a tombstone, since a head that holds a page is not one.
pub async fn actor_state(
    bucket: &Bucket,
    config: &ReplicaConfig,
    id: &ActorId,
) -> Result<BucketActor, ReplicaError> {
    let root = ActorRoot::new(id, bucket.prefix_bytes())?;
    let listing = list_chain(bucket, &root, config).await?;
    let (key, size) = match (listing.logs.last(), listing.snaps.last()) {
        (Some(&(seq, size)), _) => (root.log(seq), size),
        (None, Some(&(seq, size))) => (root.snap(seq), size),
        (None, None) => return Ok(BucketActor::Absent),
    };
    let tombstone =
        Entry::tombstone(u64::MAX, u64::MAX, Token::fresh(0)?, root.as_str()).encoded_len();
    if size > tombstone {
        return Ok(BucketActor::Live);
    }
    let body = bucket
        .get_bounded(&key, "entry_bytes_max", config.entry_bytes_max)
        .await?;
    let entry = Entry::decode(&key, &body, config.entry_bytes_max)?;
    Ok(if entry.kind == Kind::Tombstone {
        BucketActor::Deleted
    } else {
        BucketActor::Live
    })
}
