//! Fault injection for tests: an [`ObjectStore`] wrapper that holds a
//! chosen PUT until the test releases it (an upload that lands late) or
//! sends a PUT twice and reports the second answer (a lost response that
//! the client's retry follows), or that understates object sizes in
//! listings and GETs (a bucket whose claims cannot be trusted). Used by
//! this crate's tests and meant for the simulator and the runtime's tests;
//! never for production.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use tokio::sync::Semaphore;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A held PUT: [`Gate::arrived`] waits until the PUT reached the store,
/// [`Gate::release`] lets it through.
#[derive(Debug)]
pub struct Gate {
    arrived: Semaphore,
    release: Semaphore,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            arrived: Semaphore::new(0),
            release: Semaphore::new(0),
        }
    }
}

impl Gate {
    /// Waits until the held PUT has been sent (and is waiting).
    pub async fn arrived(&self) {
        self.arrived.acquire().await.expect("never closed").forget();
    }

    /// Lets the held PUT land.
    pub fn release(&self) {
        self.release.add_permits(1);
    }
}

/// What a [`FaultStore`] says about the sizes of objects, to show that a
/// reader bounds what it downloads by what arrives, not by what the
/// bucket claims.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum SizeLies {
    /// Sizes as the store gives them.
    #[default]
    Truthful,
    /// Listings say every object is one byte long.
    Listing,
    /// Listings, and the length of every GET's body, say one byte; the body
    /// that follows is the whole object.
    ListingAndGet,
}

#[derive(Debug, Default)]
struct Faults {
    holds: Vec<(String, Arc<Gate>)>,
    replays: Vec<String>,
    /// The next this many PUTs fail.
    failing_puts: u32,
    size_lies: SizeLies,
}

/// Wraps a store and injects faults into PUTs whose path ends with a
/// chosen suffix. Each fault applies to the next matching PUT only.
#[derive(Debug)]
pub struct FaultStore {
    inner: Arc<dyn ObjectStore>,
    faults: Mutex<Faults>,
}

impl FaultStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> FaultStore {
        FaultStore {
            inner,
            faults: Mutex::default(),
        }
    }

    /// Holds the next PUT to a path ending in `suffix` until released.
    pub fn hold(&self, suffix: &str) -> Arc<Gate> {
        let gate = Arc::new(Gate::default());
        self.faults
            .lock()
            .unwrap()
            .holds
            .push((suffix.to_owned(), Arc::clone(&gate)));
        gate
    }

    /// Makes the next `n` PUTs (to any path) fail, as a bucket that keeps
    /// failing past the client's retries.
    pub fn fail_puts(&self, n: u32) {
        self.faults.lock().unwrap().failing_puts = n;
    }

    /// From now on, reports object sizes as `lies` says.
    pub fn lie_about_sizes(&self, lies: SizeLies) {
        self.faults.lock().unwrap().size_lies = lies;
    }

    fn size_lies(&self) -> SizeLies {
        self.faults.lock().unwrap().size_lies
    }

    /// A listing whose sizes follow [`SizeLies`].
    fn listed(
        &self,
        stream: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        if self.size_lies() == SizeLies::Truthful {
            return stream;
        }
        stream
            .map_ok(|mut meta| {
                meta.size = meta.size.min(1);
                meta
            })
            .boxed()
    }

    /// Sends the next PUT to a path ending in `suffix` twice and answers
    /// with the second result, as a client retrying after a lost response.
    pub fn replay(&self, suffix: &str) {
        self.faults.lock().unwrap().replays.push(suffix.to_owned());
    }
}

/// A bucket in memory behind a [`FaultStore`], and the switches.
pub fn memory_bucket() -> (crate::Bucket, Arc<FaultStore>) {
    faulty_bucket(Arc::new(object_store::memory::InMemory::new()), "test")
}

/// A bucket on any store (a folder, moto) behind a [`FaultStore`], and the
/// switches.
pub fn faulty_bucket(
    inner: Arc<dyn ObjectStore>,
    prefix: &str,
) -> (crate::Bucket, Arc<FaultStore>) {
    let faults = Arc::new(FaultStore::new(inner));
    let bucket = crate::Bucket::new(Arc::clone(&faults) as Arc<dyn ObjectStore>, prefix);
    (bucket, faults)
}

impl fmt::Display for FaultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let (gate, replay) = {
            let mut f = self.faults.lock().unwrap();
            if f.failing_puts > 0 {
                f.failing_puts -= 1;
                return Err(object_store::Error::Generic {
                    store: "FaultStore",
                    source: format!("injected PUT failure for {location}").into(),
                });
            }
            let loc = location.as_ref();
            let gate = f
                .holds
                .iter()
                .position(|(s, _)| loc.ends_with(s.as_str()))
                .map(|i| f.holds.remove(i).1);
            let replay = f
                .replays
                .iter()
                .position(|s| loc.ends_with(s.as_str()))
                .map(|i| f.replays.remove(i))
                .is_some();
            (gate, replay)
        };
        if let Some(g) = gate {
            g.arrived.add_permits(1);
            g.release.acquire().await.expect("never closed").forget();
        }
        if replay {
            let _lost = self
                .inner
                .put_opts(location, payload.clone(), opts.clone())
                .await;
        }
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let head = options.head;
        let mut result = self.inner.get_opts(location, options).await?;
        if head || self.size_lies() != SizeLies::ListingAndGet {
            return Ok(result);
        }
        // The whole body follows, as a stream (a local file's payload would
        // otherwise be read only as far as the claimed range).
        let meta = ObjectMeta {
            size: result.meta.size.min(1),
            ..result.meta.clone()
        };
        let start = result.range.start;
        let range = start..(start + 1).min(result.range.end);
        let attributes = result.attributes.clone();
        let extensions = std::mem::take(&mut result.extensions);
        Ok(GetResult {
            payload: GetResultPayload::Stream(result.into_stream()),
            meta,
            range,
            attributes,
            extensions,
        })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.listed(self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.listed(self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A moto server on a free loopback port, killed on drop.
pub struct Moto {
    child: Child,
    pub port: u16,
}

fn moto_binary() -> PathBuf {
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let p = dir.join("moto_server");
            if p.is_file() {
                return p;
            }
        }
    }
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/moto_server");
    if venv.is_file() {
        return venv;
    }
    panic!(
        "moto_server not found on PATH nor in .venv/bin: run `scripts/setup.sh --test` \
         (these tests need a real S3-compatible server and do not skip)"
    );
}

fn http(port: u16, request: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(request.as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

impl Moto {
    pub fn start() -> Moto {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(moto_binary())
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting moto_server");
        let moto = Moto { child, port };
        let deadline = crate::clock::since_boot() + Duration::from_secs(30);
        loop {
            let get =
                format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
            if let Ok(r) = http(port, &get)
                && r.starts_with("HTTP/1.1 200")
            {
                break;
            }
            assert!(
                crate::clock::since_boot() < deadline,
                "moto_server did not answer within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        moto
    }

    /// Creates a bucket (object_store cannot) with a plain HTTP PUT.
    pub fn create_bucket(&self, name: &str) {
        let put = format!(
            "PUT /{name} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        );
        let r = http(self.port, &put).expect("create bucket");
        assert!(r.starts_with("HTTP/1.1 200"), "create bucket: {r}");
    }

    /// The SHA-256 (base64) the server keeps with `key` in `bucket`, as a
    /// signed HEAD with checksum mode enabled answers it (boto3, from the
    /// Python environment moto runs in); `None` if the object was written
    /// without one.
    pub fn checksum_sha256(&self, bucket: &str, key: &str) -> Option<String> {
        const HEAD: &str = "import sys, boto3\n\
            s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1',\n\
                aws_access_key_id='test', aws_secret_access_key='test')\n\
            h = s3.head_object(Bucket=sys.argv[2], Key=sys.argv[3], ChecksumMode='ENABLED')\n\
            print(h.get('ChecksumSHA256') or '')\n";
        let python = moto_binary().with_file_name("python3");
        let out = Command::new(&python)
            .args([
                "-c",
                HEAD,
                &format!("http://127.0.0.1:{}", self.port),
                bucket,
                key,
            ])
            .output()
            .expect("running the Python beside moto_server");
        assert!(
            out.status.success(),
            "head {key}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let sum = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        (!sum.is_empty()).then_some(sum)
    }

    pub fn options(&self) -> Vec<(String, String)> {
        [
            ("aws_endpoint", format!("http://127.0.0.1:{}", self.port)),
            ("aws_allow_http", "true".into()),
            ("aws_access_key_id", "test".into()),
            ("aws_secret_access_key", "test".into()),
            ("aws_region", "us-east-1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    pub fn store(&self, bucket: &str) -> Arc<dyn ObjectStore> {
        let mut b = AmazonS3Builder::new().with_bucket_name(bucket);
        for (k, v) in self.options() {
            b = b.with_config(k.parse().unwrap(), v);
        }
        Arc::new(b.build().unwrap())
    }

    /// The AWS environment a `wasmkeep serve --bucket s3://...` process
    /// reads to reach this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.port),
            ),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
