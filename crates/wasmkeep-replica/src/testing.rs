//! Fault injection for tests: an [`ObjectStore`] wrapper that holds a
//! chosen PUT until the test releases it (an upload that lands late) or
//! sends a PUT twice and reports the second answer (a lost response that
//! the client's retry follows). Used by this crate's tests and meant for
//! the simulator and the runtime's tests; never for production.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use tokio::sync::Semaphore;

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

#[derive(Debug, Default)]
struct Faults {
    holds: Vec<(String, Arc<Gate>)>,
    replays: Vec<String>,
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

    /// Sends the next PUT to a path ending in `suffix` twice and answers
    /// with the second result, as a client retrying after a lost response.
    pub fn replay(&self, suffix: &str) {
        self.faults.lock().unwrap().replays.push(suffix.to_owned());
    }
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
        self.inner.get_opts(location, options).await
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
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
