//! The object store an actor's chain lives in, with request counters.
//!
//! Listings are untrusted input like bodies: they are read key by key as
//! the store pages them, never collected whole. A reader that needs every
//! key holds at most a bound of them ([`Bucket::list_seqs`]); a deleter
//! takes the lowest keys in batches (`Bucket::lowest_seqs`).

use std::collections::BinaryHeap;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, Checksum};
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    GetOptions, GetRange, GetResult, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
};

use crate::error::ReplicaError;

/// The error for an object at `key` over `limit` (named `limit_name`).
fn too_large<'k>(
    key: &'k str,
    limit_name: &'static str,
    limit: u64,
) -> impl Fn(u64) -> ReplicaError + 'k {
    move |size| ReplicaError::ObjectTooLarge {
        key: key.to_owned(),
        size,
        limit_name,
        limit,
    }
}

/// Requests and bytes sent to the bucket, for metrics and the benchmark's
/// "PUTs per event".
#[derive(Debug, Default)]
pub struct Metrics {
    pub puts: AtomicU64,
    pub put_bytes: AtomicU64,
    pub gets: AtomicU64,
    pub get_bytes: AtomicU64,
    pub heads: AtomicU64,
    pub lists: AtomicU64,
    /// Keys received from listings (every key the store sent, whether
    /// kept or not): what listings cost the node.
    pub listed_keys: AtomicU64,
    pub deletes: AtomicU64,
}

/// A copy of [`Metrics`] at one instant.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MetricsSnapshot {
    pub puts: u64,
    pub put_bytes: u64,
    pub gets: u64,
    pub get_bytes: u64,
    pub heads: u64,
    pub lists: u64,
    pub listed_keys: u64,
    pub deletes: u64,
}

impl Metrics {
    pub fn snapshot(&self) -> MetricsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            puts: l(&self.puts),
            put_bytes: l(&self.put_bytes),
            gets: l(&self.gets),
            get_bytes: l(&self.get_bytes),
            heads: l(&self.heads),
            lists: l(&self.lists),
            listed_keys: l(&self.listed_keys),
            deletes: l(&self.deletes),
        }
    }
}

fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

/// Whether a listing's reader wants the next key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    More,
    Stop,
}

/// Counts the keys a listing has given against its bound.
struct Counted<'a> {
    dir: &'a str,
    seen: u64,
    limit: u64,
}

impl<'a> Counted<'a> {
    fn new(dir: &'a str, limit: u64) -> Self {
        Counted {
            dir,
            seen: 0,
            limit,
        }
    }

    /// One more key; `listing_too_long` once there are more than the bound.
    fn one(&mut self) -> Result<(), ReplicaError> {
        self.seen += 1;
        if self.seen > self.limit {
            return Err(ReplicaError::ListingTooLong {
                dir: self.dir.to_owned(),
                limit: self.limit,
            });
        }
        Ok(())
    }
}

/// The seq of `key` if it is a seq directly in `dir` (not in a folder
/// below it, where it could pose as one of the chain's keys).
fn seq_in(dir: &str, key: &str) -> Option<u64> {
    let rest = key.strip_prefix(dir)?;
    if rest.contains('/') {
        return None;
    }
    crate::keys::parse_seq(rest)
}

/// What a create-only write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// This call created the object.
    Created,
    /// An object was already there (someone else's, or this writer's own
    /// earlier attempt whose response was lost).
    AlreadyExists,
}

/// An object store and a prefix inside it. Cheap to clone; clones share
/// the counters.
#[derive(Debug, Clone)]
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    /// Without leading or trailing slashes; empty for the store's root.
    prefix: String,
    metrics: Arc<Metrics>,
    /// Whether the store lists keys in key order (S3 does; a local folder
    /// does not), so that a page may stop reading once it is full.
    listing_sorted: bool,
    /// The store's paged listing with a delimiter and a start key (S3),
    /// for [`Bucket::list_folders`]; `None`: the folder is listed whole.
    paged: Option<Arc<object_store::aws::AmazonS3>>,
}

impl Bucket {
    /// A bucket over any store (tests wrap stores to inject faults).
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Bucket {
        Bucket {
            store,
            prefix: prefix.trim_matches('/').to_owned(),
            metrics: Arc::new(Metrics::default()),
            listing_sorted: false,
            paged: None,
        }
    }

    /// `s3://bucket/prefix` or `file:///path`.
    ///
    /// For S3 the builder reads `AWS_*` from the environment
    /// (`AWS_ENDPOINT_URL` or `AWS_ENDPOINT`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ALLOW_HTTP`, ...). Every
    /// PUT, and every part of a multipart upload, carries its SHA-256
    /// (`x-amz-checksum-sha256`), which the store checks before it accepts
    /// the bytes and keeps with the object (ADR 0036, "Checksums"). A local
    /// folder is created if missing.
    pub fn from_url(url: &str) -> Result<Bucket, ReplicaError> {
        Bucket::from_url_with_options(url, std::iter::empty::<(String, String)>())
    }

    /// Like [`Bucket::from_url`], with S3 settings (`aws_endpoint`,
    /// `aws_allow_http`, ... as `object_store` names them) applied after the
    /// environment's, so tests need not change the process environment.
    pub fn from_url_with_options<K: AsRef<str>, V: Into<String>>(
        url: &str,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Bucket, ReplicaError> {
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(ReplicaError::InvalidUrl(format!("no bucket name: `{url}`")));
            }
            let mut builder = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_checksum_algorithm(Checksum::SHA256);
            for (k, v) in options {
                let key = k.as_ref().to_ascii_lowercase().parse().map_err(|_| {
                    ReplicaError::InvalidUrl(format!("unknown s3 option `{}`", k.as_ref()))
                })?;
                builder = builder.with_config(key, v);
            }
            let s3 = Arc::new(builder.build()?);
            let mut b = Bucket::new(Arc::clone(&s3) as Arc<dyn ObjectStore>, prefix);
            b.listing_sorted = true;
            b.paged = Some(s3);
            Ok(b)
        } else if let Some(path) = url.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(ReplicaError::InvalidUrl(format!(
                    "file urls need an absolute path: `{url}`"
                )));
            }
            std::fs::create_dir_all(path)?;
            Ok(Bucket::new(
                Arc::new(LocalFileSystem::new_with_prefix(path)?),
                "",
            ))
        } else {
            Err(ReplicaError::InvalidUrl(format!(
                "expected s3:// or file://: `{url}`"
            )))
        }
    }

    /// The prefix's length in a key, slash included (for key limits).
    pub fn prefix_bytes(&self) -> usize {
        if self.prefix.is_empty() {
            0
        } else {
            self.prefix.len() + 1
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    fn path(&self, key: &str) -> Result<Path, ReplicaError> {
        let full = if self.prefix.is_empty() {
            key.trim_end_matches('/').to_owned()
        } else {
            format!("{}/{}", self.prefix, key.trim_end_matches('/'))
        };
        Path::parse(&full).map_err(|e| ReplicaError::InvalidUrl(format!("bad key `{full}`: {e}")))
    }

    fn key_of(&self, path: &Path) -> String {
        let s = path.as_ref();
        if self.prefix.is_empty() {
            s.to_owned()
        } else {
            s.strip_prefix(&self.prefix)
                .and_then(|r| r.strip_prefix('/'))
                .unwrap_or(s)
                .to_owned()
        }
    }

    /// A create-only write (`If-None-Match: *` on S3).
    pub async fn create(&self, key: &str, body: Bytes) -> Result<Created, ReplicaError> {
        let path = self.path(key)?;
        add(&self.metrics.puts, 1);
        add(&self.metrics.put_bytes, body.len() as u64);
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&path, PutPayload::from_bytes(body), opts)
            .await
        {
            Ok(_) => Ok(Created::Created),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Created::AlreadyExists),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes `key` from parts received on `parts` as one multipart upload
    /// (an unconditional write: object stores do not offer a create-only
    /// multipart upload), completed only if parts of exactly `bytes` bytes
    /// arrived and none was an error; otherwise aborted, so nothing appears
    /// at `key` (a sender that ends early, even by a panic, completes
    /// nothing). Used for snapshots larger than one part (ADR 0036).
    pub async fn put_parts(
        &self,
        key: &str,
        parts: &mut tokio::sync::mpsc::Receiver<Result<Bytes, ReplicaError>>,
        bytes: u64,
    ) -> Result<(), ReplicaError> {
        let path = self.path(key)?;
        let mut upload = self.store.put_multipart(&path).await?;
        let mut sent = async {
            let mut total = 0u64;
            while let Some(part) = parts.recv().await {
                let part = part?;
                total += part.len() as u64;
                add(&self.metrics.puts, 1);
                add(&self.metrics.put_bytes, part.len() as u64);
                upload.put_part(PutPayload::from_bytes(part)).await?;
            }
            if total != bytes {
                return Err(ReplicaError::ChainBroken(format!(
                    "the parts of `{key}` ended at bytes={total} of {bytes}"
                )));
            }
            Ok::<(), ReplicaError>(())
        }
        .await;
        if sent.is_ok() {
            add(&self.metrics.puts, 1);
            sent = upload.complete().await.map(|_| ()).map_err(Into::into);
            if sent.is_ok() {
                return Ok(());
            }
        }
        let _ = upload.abort().await;
        sent
    }

    /// An unconditional write that replaces whatever is at `key`. Used for
    /// one thing only: erasing the entries of a deleted actor's life in
    /// place (ADR 0007, "Deleting an actor"), which keeps their keys taken
    /// so that a stale writer's create of one of them still fails.
    pub async fn overwrite(&self, key: &str, body: Bytes) -> Result<(), ReplicaError> {
        let path = self.path(key)?;
        add(&self.metrics.puts, 1);
        add(&self.metrics.put_bytes, body.len() as u64);
        let opts = PutOptions {
            mode: PutMode::Overwrite,
            ..Default::default()
        };
        self.store
            .put_opts(&path, PutPayload::from_bytes(body), opts)
            .await?;
        Ok(())
    }

    /// The whole object, read as untrusted input: refused unread when the
    /// GET's length is over `limit`, and cut off as soon as its body runs
    /// past `limit` (the length is the bucket's claim). Callers that listed
    /// the object check the listed size first. `limit_name` names the bound
    /// in the error.
    pub async fn get_bounded(
        &self,
        key: &str,
        limit_name: &'static str,
        limit: u64,
    ) -> Result<Bytes, ReplicaError> {
        let path = self.path(key)?;
        add(&self.metrics.gets, 1);
        let result = self.store.get_opts(&path, GetOptions::default()).await?;
        self.read_capped(key, result, limit, too_large(key, limit_name, limit))
            .await
    }

    /// The first `n` bytes of an object (fewer if it is shorter).
    pub async fn get_prefix(&self, key: &str, n: u64) -> Result<Bytes, ReplicaError> {
        let path = self.path(key)?;
        add(&self.metrics.heads, 1);
        let size = self.store.head(&path).await?.size;
        add(&self.metrics.gets, 1);
        let options = GetOptions {
            range: Some(GetRange::Bounded(0..n.min(size))),
            ..GetOptions::default()
        };
        let result = self.store.get_opts(&path, options).await?;
        let too_large = too_large(key, "requested_prefix_bytes", n);
        self.read_capped(key, result, n, too_large).await
    }

    /// Reads a GET's body, refusing it before reading if its length says it
    /// is over `limit` and as soon as the bytes received pass `limit`.
    /// Memory grows with the bytes received, never with a length the
    /// bucket claimed, and is reserved fallibly: a node short of memory
    /// fails this read, it does not abort.
    async fn read_capped(
        &self,
        key: &str,
        result: GetResult,
        limit: u64,
        too_large: impl Fn(u64) -> ReplicaError,
    ) -> Result<Bytes, ReplicaError> {
        let mut buf: Vec<u8> = Vec::new();
        self.stream_capped(result, limit, &too_large, |chunk, total| {
            if buf.capacity() - buf.len() < chunk.len() {
                // Doubling, but never past the limit (which `total` is
                // within), so a body at the limit costs no more than it.
                let want = (buf.capacity() as u64 * 2).clamp(total, limit) as usize;
                buf.try_reserve_exact(want - buf.len())
                    .map_err(|_| ReplicaError::OutOfMemory {
                        key: key.to_owned(),
                        bytes: want as u64,
                    })?;
            }
            buf.extend_from_slice(chunk);
            Ok(())
        })
        .await?;
        Ok(Bytes::from(buf))
    }

    /// Hands a GET's body to `each` chunk by chunk (with the bytes so far),
    /// refused unread when the GET's length is over `limit` and cut off as
    /// soon as the body runs past it.
    async fn stream_capped(
        &self,
        result: GetResult,
        limit: u64,
        too_large: &impl Fn(u64) -> ReplicaError,
        mut each: impl FnMut(&[u8], u64) -> Result<(), ReplicaError>,
    ) -> Result<(), ReplicaError> {
        let claimed = result.range.end.saturating_sub(result.range.start);
        if claimed > limit {
            return Err(too_large(claimed));
        }
        let mut stream = result.into_stream();
        let mut total = 0u64;
        while let Some(chunk) = stream.try_next().await? {
            add(&self.metrics.get_bytes, chunk.len() as u64);
            total = total.saturating_add(chunk.len() as u64);
            if total > limit {
                return Err(too_large(total));
            }
            each(&chunk, total)?;
        }
        Ok(())
    }

    /// [`Bucket::get_bounded`] without holding the body: `each` gets it
    /// chunk by chunk as it streams in. Returns the bytes received.
    pub async fn get_streamed(
        &self,
        key: &str,
        limit_name: &'static str,
        limit: u64,
        mut each: impl FnMut(&[u8]) -> Result<(), ReplicaError>,
    ) -> Result<u64, ReplicaError> {
        let path = self.path(key)?;
        add(&self.metrics.gets, 1);
        let result = self.store.get_opts(&path, GetOptions::default()).await?;
        let mut received = 0;
        let too_large = too_large(key, limit_name, limit);
        self.stream_capped(result, limit, &too_large, |chunk, total| {
            received = total;
            each(chunk)
        })
        .await?;
        Ok(received)
    }

    /// Streams the keys (relative to the prefix) in the folder `dir`
    /// (ending in `/`) that sort after `after`, with the size the listing
    /// gives for each, to `visit`, one at a time as the store pages them
    /// (S3 sends a thousand keys a page), in the store's order: some stores
    /// list unsorted. Nothing is collected here. The listing is dropped,
    /// and no further page requested, as soon as `visit` says stop or fails.
    async fn scan(
        &self,
        dir: &str,
        after: Option<&str>,
        mut visit: impl FnMut(&str, u64) -> Result<Next, ReplicaError>,
    ) -> Result<(), ReplicaError> {
        let prefix = self.path(dir)?;
        add(&self.metrics.lists, 1);
        let mut stream = match after {
            Some(a) => self.store.list_with_offset(Some(&prefix), &self.path(a)?),
            None => self.store.list(Some(&prefix)),
        };
        while let Some(meta) = stream.try_next().await? {
            add(&self.metrics.listed_keys, 1);
            let key = self.key_of(&meta.location);
            if after.is_some_and(|a| key.as_str() <= a) {
                continue;
            }
            if visit(&key, meta.size)? == Next::Stop {
                break;
            }
        }
        Ok(())
    }

    /// The names of the folders directly in `dir` (ending in `/`) that
    /// start with `prefix` and sort after `after`, in order, at most
    /// `limit`. On S3 each listing returns up to 1,000 of them and starts
    /// after `after`; elsewhere `dir` is listed whole (a local folder: one
    /// directory read) and the page cut from it.
    pub async fn list_folders(
        &self,
        dir: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, ReplicaError> {
        let base = self.path(dir)?;
        let child = |p: &Path| {
            let key = self.key_of(p);
            key.strip_prefix(dir.trim_end_matches('/'))
                .map(|k| k.trim_matches('/').to_owned())
        };
        let keep = |name: &str| name.starts_with(prefix) && after.is_none_or(|a| name > a);
        let mut out = Vec::new();
        let Some(paged) = &self.paged else {
            add(&self.metrics.lists, 1);
            let listed = self.store.list_with_delimiter(Some(&base)).await?;
            let mut names: Vec<String> = listed
                .common_prefixes
                .iter()
                .filter_map(child)
                .filter(|n| keep(n))
                .collect();
            names.sort_unstable();
            names.truncate(limit);
            return Ok(names);
        };
        let mut token = None;
        loop {
            let opts = PaginatedListOptions {
                offset: after.map(|a| format!("{base}/{a}")),
                delimiter: Some("/".into()),
                max_keys: Some((limit - out.len() + 1).min(1_000)),
                page_token: token,
                ..Default::default()
            };
            add(&self.metrics.lists, 1);
            let page = paged
                .list_paginated(Some(&format!("{base}/{prefix}")), opts)
                .await?;
            for p in &page.result.common_prefixes {
                if let Some(name) = child(p)
                    && keep(&name)
                    && out.len() < limit
                {
                    out.push(name);
                }
            }
            token = page.page_token;
            if token.is_none() || out.len() >= limit {
                out.sort_unstable();
                return Ok(out);
            }
        }
    }

    /// Visits every object under the folder `dir` (ending in `/`, its
    /// subfolders included) with its key and size, as the store lists
    /// them, until `visit` returns `false`. Holds nothing of the listing.
    pub async fn sum_under(
        &self,
        dir: &str,
        mut visit: impl FnMut(&str, u64) -> bool,
    ) -> Result<(), ReplicaError> {
        self.scan(dir, None, |key, size| {
            Ok(if visit(key, size) {
                Next::More
            } else {
                Next::Stop
            })
        })
        .await
    }

    /// Keys (relative to the prefix) in the folder `dir` (ending in `/`)
    /// that sort after `after`, sorted. Holds at most `keys_max` keys: a
    /// longer listing fails with `listing_too_long` as soon as it runs past.
    pub async fn list(
        &self,
        dir: &str,
        after: Option<&str>,
        keys_max: u64,
    ) -> Result<Vec<String>, ReplicaError> {
        let mut keys = Vec::new();
        let mut seen = Counted::new(dir, keys_max);
        self.scan(dir, after, |key, _| {
            seen.one()?;
            keys.push(key.to_owned());
            Ok(Next::More)
        })
        .await?;
        keys.sort_unstable();
        Ok(keys)
    }

    /// One page of a paged listing: the first `limit` keys (relative to the
    /// prefix) that start with `prefix` and sort after `start_after`, in key
    /// order. `prefix` need not end at a folder: the folder it is in is
    /// listed and its keys filtered. At most `limit` keys are held, whatever
    /// the folder's length; a store that lists unsorted (a local folder) is
    /// read to the end of the folder for each page, a sorted one (S3) only
    /// until the page is full.
    pub async fn list_page(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, ReplicaError> {
        let limit = limit.max(1);
        let dir = match prefix.rfind('/') {
            Some(i) => &prefix[..=i],
            None => "",
        };
        let sorted = self.listing_sorted;
        let mut lowest: BinaryHeap<String> = BinaryHeap::new();
        self.scan(dir, start_after, |key, _| {
            if !key.starts_with(prefix) {
                return Ok(Next::More);
            }
            if lowest.len() < limit {
                lowest.push(key.to_owned());
            } else if lowest.peek().is_some_and(|top| key < top.as_str()) {
                lowest.pop();
                lowest.push(key.to_owned());
            }
            Ok(if sorted && lowest.len() == limit {
                Next::Stop
            } else {
                Next::More
            })
        })
        .await?;
        Ok(lowest.into_sorted_vec())
    }

    /// The sequence numbers of the entries (or snapshots) in `dir` after
    /// `after`, ascending: keys are zero-padded, so key order is seq order.
    /// Keys that are not a seq directly in `dir` (anything a human left
    /// there, a deeper folder) are skipped, but count towards `keys_max`
    /// like every key the listing holds.
    pub async fn list_seqs(
        &self,
        dir: &str,
        after: Option<&str>,
        keys_max: u64,
    ) -> Result<Vec<u64>, ReplicaError> {
        Ok(self
            .list_seqs_sized(dir, after, keys_max)
            .await?
            .into_iter()
            .map(|(seq, _)| seq)
            .collect())
    }

    /// [`Bucket::list_seqs`] with the size the listing gives for each
    /// object, which reading it checks before downloading it.
    pub(crate) async fn list_seqs_sized(
        &self,
        dir: &str,
        after: Option<&str>,
        keys_max: u64,
    ) -> Result<Vec<(u64, u64)>, ReplicaError> {
        let mut seqs = Vec::new();
        let mut seen = Counted::new(dir, keys_max);
        self.scan(dir, after, |key, size| {
            seen.one()?;
            if let Some(seq) = seq_in(dir, key) {
                seqs.push((seq, size));
            }
            Ok(Next::More)
        })
        .await?;
        seqs.sort_unstable();
        Ok(seqs)
    }

    /// Whether `dir` holds a seq at or above `from` (after `after`),
    /// reading the listing only until it finds one, and at most `keys_max`
    /// keys (`listing_too_long` past them).
    pub async fn any_seq(
        &self,
        dir: &str,
        after: Option<&str>,
        from: u64,
        keys_max: u64,
    ) -> Result<bool, ReplicaError> {
        let mut found = false;
        let mut seen = Counted::new(dir, keys_max);
        self.scan(dir, after, |key, _| {
            seen.one()?;
            found = seq_in(dir, key).is_some_and(|s| s >= from);
            Ok(if found { Next::Stop } else { Next::More })
        })
        .await?;
        Ok(found)
    }

    /// The highest seq directly in `dir`, if any. Reads the whole listing
    /// key by key and holds one seq: a deleter must find the head of a
    /// folder of any length.
    pub(crate) async fn highest_seq(&self, dir: &str) -> Result<Option<u64>, ReplicaError> {
        let mut highest = None;
        self.scan(dir, None, |key, _| {
            if let Some(seq) = seq_in(dir, key) {
                highest = highest.max(Some(seq));
            }
            Ok(Next::More)
        })
        .await?;
        Ok(highest)
    }

    /// The `n` lowest seqs in `dir` within `range`, ascending, and whether
    /// the listing held more of them: one batch for a deleter that works
    /// through a folder of any length in passes. A store that lists
    /// unsorted (a local folder) is read whole, key by key, holding `n` seqs
    /// at most, so that it still gives the lowest ones (deleting from the
    /// oldest up never leaves a chain whose beginning is kept but whose end
    /// is gone); a sorted one (S3) is read from the range's start until the
    /// batch is full or the range ends.
    pub(crate) async fn lowest_seqs(
        &self,
        dir: &str,
        range: RangeInclusive<u64>,
        n: u64,
    ) -> Result<(Vec<u64>, bool), ReplicaError> {
        let (sized, more) = self.lowest_seqs_sized(dir, range, n).await?;
        Ok((sized.into_iter().map(|(seq, _)| seq).collect(), more))
    }

    /// [`Bucket::lowest_seqs`] with the size the listing gives for each.
    pub(crate) async fn lowest_seqs_sized(
        &self,
        dir: &str,
        range: RangeInclusive<u64>,
        n: u64,
    ) -> Result<(Vec<(u64, u64)>, bool), ReplicaError> {
        let n = n.max(1);
        let mut lowest = BinaryHeap::new();
        let mut more = false;
        // A store that lists in key order (S3) starts at the range and
        // stops past it or once the batch is full: a log of hundreds of
        // thousands of entries between whole snapshots (ADR 0037) costs a
        // collection a LIST or two, not one per thousand keys.
        let sorted = self.listing_sorted;
        let after = range
            .start()
            .checked_sub(1)
            .filter(|_| sorted)
            .map(|s| format!("{dir}{s:0w$}", w = crate::keys::SEQ_DIGITS));
        self.scan(dir, after.as_deref(), |key, size| {
            let Some(seq) = seq_in(dir, key) else {
                return Ok(Next::More);
            };
            if !range.contains(&seq) {
                return Ok(if sorted && seq > *range.end() {
                    Next::Stop
                } else {
                    Next::More
                });
            }
            if (lowest.len() as u64) < n {
                lowest.push((seq, size));
            } else {
                more = true;
                if sorted {
                    return Ok(Next::Stop);
                }
                if lowest.peek().is_some_and(|(top, _)| seq < *top) {
                    lowest.pop();
                    lowest.push((seq, size));
                }
            }
            Ok(Next::More)
        })
        .await?;
        Ok((lowest.into_sorted_vec(), more))
    }

    /// Deletes an object; a missing one is fine (a local folder reports it).
    pub async fn delete(&self, key: &str) -> Result<(), ReplicaError> {
        let path = self.path(key)?;
        add(&self.metrics.deletes, 1);
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Moto;

    /// A batch of the lowest seqs in a range: on S3 (sorted listings) the
    /// listing starts at the range and stops once the batch is full, so a
    /// collection below a long log reads a few keys; a local folder reads
    /// every key. Both give the same seqs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sorted_listing_reads_only_the_range() {
        let moto = Moto::start();
        moto.create_bucket("sorted");
        let s3 = Bucket::from_url_with_options("s3://sorted/p", moto.options()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let local = Bucket::from_url(&format!("file://{}", dir.path().display())).unwrap();
        for b in [&s3, &local] {
            for seq in 0..60u64 {
                let key = format!("a/log/{seq:020}");
                b.create(&key, Bytes::from_static(b"x")).await.unwrap();
            }
        }
        for (b, sorted) in [(&s3, true), (&local, false)] {
            let before = b.metrics().snapshot().listed_keys;
            let (seqs, more) = b.lowest_seqs("a/log/", 10..=40, 5).await.unwrap();
            assert_eq!((seqs, more), ((10..15).collect::<Vec<_>>(), true));
            let read = b.metrics().snapshot().listed_keys - before;
            if sorted {
                assert!(read <= 6, "read {read} keys");
            } else {
                assert_eq!(read, 60);
            }
            let (seqs, more) = b.lowest_seqs("a/log/", 55..=u64::MAX, 100).await.unwrap();
            assert_eq!((seqs, more), ((55..60).collect::<Vec<_>>(), false));
        }
    }
}
