//! The object store an actor's chain lives in, with request counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    GetOptions, GetRange, GetResult, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
};

use crate::error::ReplicaError;

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
            deletes: l(&self.deletes),
        }
    }
}

fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
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
}

impl Bucket {
    /// A bucket over any store (tests wrap stores to inject faults).
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Bucket {
        Bucket {
            store,
            prefix: prefix.trim_matches('/').to_owned(),
            metrics: Arc::new(Metrics::default()),
        }
    }

    /// `s3://bucket/prefix` or `file:///path`.
    ///
    /// For S3 the builder reads `AWS_*` from the environment
    /// (`AWS_ENDPOINT_URL` or `AWS_ENDPOINT`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ALLOW_HTTP`, ...). A local
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
            let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
            for (k, v) in options {
                let key = k.as_ref().to_ascii_lowercase().parse().map_err(|_| {
                    ReplicaError::InvalidUrl(format!("unknown s3 option `{}`", k.as_ref()))
                })?;
                builder = builder.with_config(key, v);
            }
            Ok(Bucket::new(Arc::new(builder.build()?), prefix))
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
        let too_large = |size: u64| ReplicaError::ObjectTooLarge {
            key: key.to_owned(),
            size,
            limit_name,
            limit,
        };
        let path = self.path(key)?;
        add(&self.metrics.gets, 1);
        let result = self.store.get_opts(&path, GetOptions::default()).await?;
        self.read_capped(key, result, limit, too_large).await
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
        let too_large = |size: u64| ReplicaError::ObjectTooLarge {
            key: key.to_owned(),
            size,
            limit_name: "requested_prefix_bytes",
            limit: n,
        };
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
        let claimed = result.range.end.saturating_sub(result.range.start);
        if claimed > limit {
            return Err(too_large(claimed));
        }
        let mut stream = result.into_stream();
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = stream.try_next().await? {
            add(&self.metrics.get_bytes, chunk.len() as u64);
            let total = (buf.len() as u64).saturating_add(chunk.len() as u64);
            if total > limit {
                return Err(too_large(total));
            }
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
            buf.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(buf))
    }

    /// Keys (relative to the prefix) in the folder `dir` (ending in `/`)
    /// that sort after `after`, sorted: some stores list unsorted.
    pub async fn list(&self, dir: &str, after: Option<&str>) -> Result<Vec<String>, ReplicaError> {
        Ok(self
            .list_sized(dir, after)
            .await?
            .into_iter()
            .map(|(key, _)| key)
            .collect())
    }

    /// [`Bucket::list`] with the size the listing gives for each key.
    async fn list_sized(
        &self,
        dir: &str,
        after: Option<&str>,
    ) -> Result<Vec<(String, u64)>, ReplicaError> {
        let prefix = self.path(dir)?;
        add(&self.metrics.lists, 1);
        let stream = match after {
            Some(a) => self.store.list_with_offset(Some(&prefix), &self.path(a)?),
            None => self.store.list(Some(&prefix)),
        };
        let metas: Vec<_> = stream.try_collect().await?;
        let mut keys: Vec<(String, u64)> = metas
            .iter()
            .map(|m| (self.key_of(&m.location), m.size))
            .collect();
        if let Some(a) = after {
            keys.retain(|(k, _)| k.as_str() > a);
        }
        keys.sort_unstable();
        Ok(keys)
    }

    /// The sequence numbers of the entries (or snapshots) in `dir` after
    /// `after`, ascending: keys are zero-padded, so key order is seq order.
    /// Keys that are not a seq (anything a human left there) are skipped.
    pub async fn list_seqs(
        &self,
        dir: &str,
        after: Option<&str>,
    ) -> Result<Vec<u64>, ReplicaError> {
        Ok(self
            .list(dir, after)
            .await?
            .iter()
            .filter_map(|k| crate::keys::parse_seq(k))
            .collect())
    }

    /// [`Bucket::list_seqs`] with the size the listing gives for each
    /// object, which reading it checks before downloading it.
    pub(crate) async fn list_seqs_sized(
        &self,
        dir: &str,
        after: Option<&str>,
    ) -> Result<Vec<(u64, u64)>, ReplicaError> {
        Ok(self
            .list_sized(dir, after)
            .await?
            .iter()
            .filter_map(|(k, size)| Some((crate::keys::parse_seq(k)?, *size)))
            .collect())
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
