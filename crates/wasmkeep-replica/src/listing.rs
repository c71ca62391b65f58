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

use futures::StreamExt;

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
/// Most actor folders one page looks at, as a multiple of the names it
/// asks for: deleted actors are skipped, and a class of many deleted
/// actors must not make one page read without bound. Past it the page
/// ends with fewer names and a cursor to go on from.
pub const CLASS_PAGE_EXAMINED_PER_NAME: usize = 4;
/// Actors whose chain one page reads at once.
const STATE_READS_AT_ONCE: usize = 8;

/// One page of a class's actors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassPage {
    /// Live actors' names, in byte order.
    pub names: Vec<String>,
    /// The name to list after for the next page; `None`: no more.
    pub next: Option<String>,
    /// Actors on the page whose chain head could not be read (listed
    /// among `names` as live: the listing does not judge a chain it
    /// cannot read; a restore of that actor would say why).
    pub unreadable: usize,
}

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
/// the name to list after for the next page (`None`: no more). A page
/// looks at no more than `CLASS_PAGE_EXAMINED_PER_NAME` times `limit`
/// folders; it may then hold fewer names than `limit` and still have a
/// next cursor (the last folder it looked at, deleted or not).
///
/// Names longer than 100 bytes (their folder is split in pieces of 200
/// hex characters, every piece but the last ending in `+`) are found by
/// listing the pieces' folders in name order.
pub async fn class_page(
    bucket: &Bucket,
    config: &ReplicaConfig,
    (tenant, app, class): (&str, &str, &str),
    prefix: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<ClassPage, ReplicaError> {
    let limit = limit.clamp(1, CLASS_PAGE_NAMES_MAX);
    let mut walk = Walk {
        bucket,
        hex_prefix: hex::encode(prefix.as_bytes()),
        after: after.map(|a| hex::encode(a.as_bytes())),
        limit: limit * CLASS_PAGE_EXAMINED_PER_NAME,
        out: Vec::new(),
        full: false,
    };
    walk.level(format!("state/{tenant}/{app}/{class}/"), String::new())
        .await?;
    let decoded: Vec<String> = walk
        .out
        .iter()
        .filter_map(|h| String::from_utf8(hex::decode(h).ok()?).ok())
        .collect();
    // `None`: the chain head could not be read.
    let states: Vec<Option<BucketActor>> =
        futures::stream::iter(decoded.clone().into_iter().map(|name| async move {
            let Ok(id) = ActorId::new(tenant, app, class, &name) else {
                return Some(BucketActor::Absent);
            };
            actor_state(bucket, config, &id).await.ok()
        }))
        .buffered(STATE_READS_AT_ONCE)
        .collect()
        .await;
    let mut page = ClassPage::default();
    let mut last = None;
    for (name, state) in decoded.into_iter().zip(states) {
        if page.names.len() == limit {
            break;
        }
        last = Some(name.clone());
        match state {
            Some(BucketActor::Live) => page.names.push(name),
            None => {
                page.unreadable += 1;
                page.names.push(name);
            }
            Some(_) => {}
        }
    }
    let more = walk.full || page.names.len() == limit;
    page.next = last.filter(|_| more);
    Ok(page)
}

/// An in-order walk over a class's actor folders, from a cursor.
struct Walk<'a> {
    bucket: &'a Bucket,
    hex_prefix: String,
    /// The hex name to go on after.
    after: Option<String>,
    /// Hex names to collect.
    limit: usize,
    out: Vec<String>,
    /// Stopped because `out` is full (more may follow).
    full: bool,
}

/// A folder's place among its siblings in name order: its hex piece, and
/// whether it is the first piece of longer names (ends in `+`). A name
/// comes before every longer name it starts.
type Piece = (String, bool);

fn piece(folder: &str) -> Piece {
    match folder.strip_suffix('+') {
        Some(p) => (p.to_owned(), true),
        None => (folder.to_owned(), false),
    }
}

impl Walk<'_> {
    /// Collects the names under `dir`, whose names start with the hex
    /// `joined`, in name order.
    fn level(
        &mut self,
        dir: String,
        joined: String,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ReplicaError>> + Send + '_>>
    {
        Box::pin(async move {
            // Where the cursor is at this level.
            let mut cursor: Option<Piece> = self
                .after
                .as_deref()
                .and_then(|a| a.strip_prefix(joined.as_str()))
                .filter(|r| !r.is_empty())
                .map(|r| {
                    let cut = r.len().min(HEX_SEGMENT_CHARS);
                    (r[..cut].to_owned(), r.len() > HEX_SEGMENT_CHARS)
                });
            // A cursor inside a `+` folder (a long name) resumes in it:
            // that folder is listed again, once.
            let mut resume_inside = cursor.as_ref().is_some_and(|c| c.1);
            let sub_prefix = match self.hex_prefix.strip_prefix(joined.as_str()) {
                Some(r) => r[..r.len().min(HEX_SEGMENT_CHARS)].to_owned(),
                None => String::new(),
            };
            loop {
                let want = self.limit - self.out.len();
                // Room for a cut between a piece `P+` and the name `P`
                // (key order puts `P+/` first), and for the cursor's own.
                let batch = (want + 3).clamp(4, 1_000);
                let raw = self
                    .bucket
                    .list_folders(
                        &dir,
                        &sub_prefix,
                        cursor.as_ref().map(|c| c.0.as_str()),
                        batch,
                    )
                    .await?;
                let cut = raw.len() == batch;
                let mut kids: Vec<Piece> = raw
                    .iter()
                    .map(|f| piece(f))
                    .filter(|k| {
                        cursor
                            .as_ref()
                            .is_none_or(|c| k > c || (resume_inside && k == c))
                    })
                    .collect();
                if cut && let Some(last) = raw.last().map(|f| piece(f).0) {
                    // Its sibling may lie past the cut: the next batch.
                    kids.retain(|k| k.0 != last);
                }
                kids.sort();
                for k in kids {
                    if self.out.len() == self.limit {
                        self.full = true;
                        return Ok(());
                    }
                    let full = format!("{joined}{}", k.0);
                    if k.1 {
                        self.level(format!("{dir}{}+/", k.0), full).await?;
                        if self.full {
                            return Ok(());
                        }
                    } else if full.starts_with(&self.hex_prefix) {
                        self.out.push(full);
                    }
                    cursor = Some(k);
                    resume_inside = false;
                }
                if !cut {
                    return Ok(());
                }
            }
        })
    }
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
