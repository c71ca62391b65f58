//! The output gate: responses leave only once their commits are durable.
//!
//! Workers commit a batch with `synchronous=NORMAL` and hand the batch's
//! write-ahead log and its replies to this stage. One thread takes every
//! batch waiting, makes them durable together (one `fdatasync` per file for
//! a few files, one `syncfs` for many: see `wasmkeep_store::sync`), then
//! releases all their replies. While it syncs, the next group gathers: that
//! is the group commit that lets many actors share one flush.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;

use wasmkeep_store::sync;

use crate::metrics::Metrics;

/// One batch's claim on the disk.
pub struct SyncJob {
    /// Files whose data must be on disk (write-ahead logs).
    pub files: Vec<PathBuf>,
    /// Folders whose entries must be on disk (a new actor's).
    pub dirs: Vec<PathBuf>,
    /// Called once the files are durable (`Ok`) or could not be made so.
    pub done: Box<dyn FnOnce(Result<(), String>) + Send>,
}

/// The handle workers submit to.
pub struct DurabilityStage {
    tx: mpsc::Sender<SyncJob>,
}

impl DurabilityStage {
    /// Starts the stage's thread; `root` is any path on the data
    /// directory's filesystem.
    pub fn start(root: PathBuf, metrics: Arc<Metrics>) -> DurabilityStage {
        let (tx, rx) = mpsc::channel::<SyncJob>();
        std::thread::Builder::new()
            .name("wasmkeep-sync".into())
            .spawn(move || run(rx, root, metrics))
            .expect("spawn the durability thread");
        DurabilityStage { tx }
    }

    /// Queues a batch; its `done` runs on the stage's thread.
    pub fn submit(&self, job: SyncJob) {
        if let Err(mpsc::SendError(job)) = self.tx.send(job) {
            (job.done)(Err("the node is shutting down".into()));
        }
    }
}

fn run(rx: mpsc::Receiver<SyncJob>, root: PathBuf, metrics: Arc<Metrics>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while let Ok(more) = rx.try_recv() {
            jobs.push(more);
        }
        let started = crate::clock::instant();
        let mut files: Vec<&PathBuf> = jobs.iter().flat_map(|j| j.files.iter()).collect();
        files.sort();
        files.dedup();
        let mut dirs: Vec<&PathBuf> = jobs.iter().flat_map(|j| j.dirs.iter()).collect();
        dirs.sort();
        dirs.dedup();
        // One syncfs covers every file and folder entry of the filesystem;
        // a lone file is cheaper to sync by itself.
        let result = if files.len() + dirs.len() >= sync::SYNCFS_FILES_MIN {
            Metrics::inc(&metrics.syncfs_total);
            sync::sync_filesystem(&root)
        } else {
            files
                .iter()
                .try_for_each(|f| sync::sync_file(f))
                .and_then(|()| dirs.iter().try_for_each(|d| sync::sync_dir(d)))
        };
        Metrics::inc(&metrics.syncs_total);
        metrics
            .sync_latency
            .observe_ms(started.elapsed().as_secs_f64() * 1000.0);
        let result = result.map_err(|e| format!("could not make the commit durable: {e}"));
        for job in jobs {
            (job.done)(result.clone());
        }
    }
}
