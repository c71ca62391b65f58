//! The output gate: responses leave only once their commits are durable.
//!
//! Workers commit a batch with `synchronous=NORMAL` and hand the batch's
//! write-ahead log and its replies to this stage. One thread takes every
//! batch waiting, makes them durable together, then releases all their
//! replies. While it syncs, the next group gathers: that is the group
//! commit that lets many actors share one flush. With the node's commit
//! log (ADR 0074) a group is one write and one `fdatasync` of the log;
//! without it, or for a new actor's first batch, one `fdatasync` for a
//! lone file and one `syncfs` for more (ADR 0004). See
//! `wasmkeep_store::commit_log::make_durable`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;

use wasmkeep_store::commit_log::{self, CommitLog};

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
    /// Starts the stage's thread; `root` is the data directory, `log` the
    /// node's commit log if it keeps one.
    pub fn start(
        root: PathBuf,
        log: Option<Arc<CommitLog>>,
        metrics: Arc<Metrics>,
    ) -> DurabilityStage {
        let (tx, rx) = mpsc::channel::<SyncJob>();
        std::thread::Builder::new()
            .name("wasmkeep-sync".into())
            .spawn(move || run(rx, root, log, metrics))
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

fn run(
    rx: mpsc::Receiver<SyncJob>,
    root: PathBuf,
    log: Option<Arc<CommitLog>>,
    metrics: Arc<Metrics>,
) {
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
        let result = commit_log::make_durable(log.as_deref(), &root, &files, &dirs);
        match &result {
            Ok(commit_log::Durable::Log) => Metrics::inc(&metrics.commit_log_barriers_total),
            Ok(commit_log::Durable::Syncfs) => Metrics::inc(&metrics.syncfs_total),
            _ => {}
        }
        Metrics::inc(&metrics.syncs_total);
        metrics
            .sync_latency
            .observe_ms(started.elapsed().as_secs_f64() * 1000.0);
        let result = result
            .map(|_| ())
            .map_err(|e| format!("could not make the commit durable: {e}"));
        for job in jobs {
            (job.done)(result.clone());
        }
    }
}
