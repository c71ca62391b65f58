//! A node's runtime settings and their defaults, in one place.
//!
//! Every bound is named with its unit last. The README's configuration table
//! documents each field; a test in the CLI crate checks that it does.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use wasmkeep_replica::{Bucket, ReplicaConfig};
use wasmkeep_store::StoreLimits;

/// When a response may leave, relative to the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// After the event's commit is fsynced: an acknowledged write survives
    /// SIGKILL and power loss (Durable Objects' output gate).
    #[default]
    Fsync,
    /// After the commit reached the operating system: an acknowledged write
    /// survives a crash of the process, not of the machine.
    Process,
}

/// Settings of the runtime (the part of a node that runs actors).
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Where actors' databases and deployed apps live.
    pub data_dir: PathBuf,
    pub durability: Durability,
    /// Wall time one event may run before it is interrupted.
    pub event_cpu_ms_max: u64,
    /// Linear memory one instance may grow to.
    pub instance_memory_bytes_max: usize,
    /// Instances alive at once; past it the least recently used idle actor
    /// is closed to make room (a request never fails for it).
    pub instances_max: u32,
    /// An actor with nothing to do for this long is closed.
    pub actor_idle_ms: u64,
    /// Events waiting for one actor; past it requests get `actor_overloaded`.
    pub actor_queue_events_max: usize,
    /// Events of one actor that share one transaction.
    pub batch_events_max: usize,
    /// Worker threads running events (0: one per core, at least 2).
    pub workers: usize,
    /// Largest component a deploy accepts.
    pub component_bytes_max: usize,
    /// Largest response body a guest may return.
    pub response_body_bytes_max: usize,
    /// Longest wait between retries of a failing alarm (ADR 0009).
    pub alarm_retry_max_ms: u64,
    /// First wait before retrying a failing alarm; it doubles each time.
    pub alarm_retry_first_ms: u64,
    /// Actors whose alarm is due within this long are opened ahead of time.
    pub alarm_prepare_ms: u64,
    /// Alarms handed to workers per timer pass.
    pub alarm_fire_batch_max: usize,
    /// Whether the first actor of a class prepared ahead of its alarm, while
    /// nothing is learned of the class's handler, runs the handler once on a
    /// throwaway instance and rolls it back, to learn its statements
    /// (ADR 0030).
    pub alarm_rehearse: bool,
    /// Limits of each actor's database (an app's manifest may override
    /// them: deploying is an operator's act).
    pub store: StoreLimits,
    /// Where compiled components are cached (default: `<data>/cache`).
    /// Entries are named by component hash and engine settings, so nodes
    /// and tests may share one folder.
    pub compile_cache_dir: Option<PathBuf>,
    /// Where every actor's database is replicated (ADR 0007); `None`: the
    /// node is purely local.
    pub bucket: Option<Bucket>,
    /// How each actor's chain in the bucket is snapshotted and kept.
    pub replica: ReplicaConfig,
}

impl RuntimeConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        RuntimeConfig {
            data_dir: data_dir.into(),
            durability: Durability::Fsync,
            event_cpu_ms_max: 30_000,
            instance_memory_bytes_max: 128 * 1024 * 1024,
            instances_max: 2048,
            actor_idle_ms: 60_000,
            actor_queue_events_max: 1000,
            batch_events_max: 256,
            workers: 0,
            component_bytes_max: 64 * 1024 * 1024,
            response_body_bytes_max: 32 * 1024 * 1024,
            alarm_retry_max_ms: 300_000,
            alarm_retry_first_ms: 1_000,
            alarm_prepare_ms: 2_000,
            alarm_fire_batch_max: 4096,
            alarm_rehearse: true,
            store: StoreLimits::default(),
            compile_cache_dir: None,
            bucket: None,
            replica: ReplicaConfig::default(),
        }
    }

    /// Worker threads to start.
    pub fn worker_threads(&self) -> usize {
        if self.workers > 0 {
            self.workers
        } else {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                .max(2)
        }
    }
}
