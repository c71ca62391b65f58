//! Counters and histograms, rendered in the Prometheus text format.
//!
//! Hand-rolled on atomics: the hot path only does relaxed adds, and the set
//! of series is fixed, so a metrics library would add weight and nothing else.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of latency buckets, in milliseconds.
const BUCKETS_MS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0,
    10000.0, 30000.0,
];

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; 17],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe_ms(&self, ms: f64) {
        let i = BUCKETS_MS
            .iter()
            .position(|b| ms <= *b)
            .unwrap_or(BUCKETS_MS.len() - 1);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add((ms * 1000.0).max(0.0) as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, b) in BUCKETS_MS.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cumulative}", b / 1000.0);
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// Every series a node exports.
#[derive(Debug, Default)]
pub struct Metrics {
    pub requests_total: AtomicU64,
    pub request_errors_total: AtomicU64,
    pub events_total: AtomicU64,
    pub event_failures_total: AtomicU64,
    pub batches_total: AtomicU64,
    pub commits_failed_total: AtomicU64,
    pub overloaded_total: AtomicU64,
    pub instances_active: AtomicU64,
    pub instantiations_total: AtomicU64,
    pub evictions_total: AtomicU64,
    pub syncs_total: AtomicU64,
    pub syncfs_total: AtomicU64,
    pub alarms_fired_total: AtomicU64,
    pub alarms_failed_total: AtomicU64,
    pub alarms_abandoned_total: AtomicU64,
    pub alarm_rehearsals_total: AtomicU64,
    pub alarms_pending: AtomicU64,
    /// Guest log lines dropped past `event_log_lines_max` or
    /// `event_log_bytes_max`.
    pub guest_log_lines_dropped_total: AtomicU64,
    /// Turns a worker panicked in (a bug) and survived.
    pub worker_panics_total: AtomicU64,
    /// Compiled code in the cache that failed its check and was compiled
    /// again.
    pub compile_cache_rejected_total: AtomicU64,
    pub event_latency: Histogram,
    pub sync_latency: Histogram,
    pub alarm_lateness: Histogram,
    /// Where a batch's time goes (see `render` for the series names).
    pub phase_queue: Histogram,
    pub phase_open: Histogram,
    pub phase_instantiate: Histogram,
    pub phase_events: Histogram,
    pub phase_commit: Histogram,
    pub phase_durable: Histogram,
    pub replica_uploads_total: AtomicU64,
    pub replica_entry_bytes_total: AtomicU64,
    pub replica_snapshots_total: AtomicU64,
    pub replica_restores_total: AtomicU64,
    pub replica_given_up_total: AtomicU64,
    pub replica_upload_latency: Histogram,
    pub replica_lag: Histogram,
    /// The bucket's own request counters, when the node has one.
    pub bucket: Option<std::sync::Arc<wasmkeep_replica::Metrics>>,
}

impl Metrics {
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let counters: &[(&str, &AtomicU64, &str, &str)] = &[
            (
                "wasmkeep_requests_total",
                &self.requests_total,
                "counter",
                "Requests handed to actors.",
            ),
            (
                "wasmkeep_request_errors_total",
                &self.request_errors_total,
                "counter",
                "Requests that ended in an error.",
            ),
            (
                "wasmkeep_events_total",
                &self.events_total,
                "counter",
                "Events run (requests, alarms, inits).",
            ),
            (
                "wasmkeep_event_failures_total",
                &self.event_failures_total,
                "counter",
                "Events rolled back.",
            ),
            (
                "wasmkeep_batches_total",
                &self.batches_total,
                "counter",
                "Transactions committed for batches of events.",
            ),
            (
                "wasmkeep_commits_failed_total",
                &self.commits_failed_total,
                "counter",
                "Batch commits that failed.",
            ),
            (
                "wasmkeep_overloaded_total",
                &self.overloaded_total,
                "counter",
                "Requests refused because an actor's queue was full.",
            ),
            (
                "wasmkeep_instances_active",
                &self.instances_active,
                "gauge",
                "Actors with a live instance.",
            ),
            (
                "wasmkeep_instantiations_total",
                &self.instantiations_total,
                "counter",
                "Instances created.",
            ),
            (
                "wasmkeep_evictions_total",
                &self.evictions_total,
                "counter",
                "Actors closed to make room for others.",
            ),
            (
                "wasmkeep_syncs_total",
                &self.syncs_total,
                "counter",
                "Durability barriers (fdatasync or syncfs).",
            ),
            (
                "wasmkeep_syncfs_total",
                &self.syncfs_total,
                "counter",
                "Barriers served by one syncfs for a group.",
            ),
            (
                "wasmkeep_alarms_fired_total",
                &self.alarms_fired_total,
                "counter",
                "Alarm handlers that succeeded.",
            ),
            (
                "wasmkeep_alarms_retried_total",
                &self.alarms_failed_total,
                "counter",
                "Alarm handlers that failed and were rescheduled.",
            ),
            (
                "wasmkeep_alarms_abandoned_total",
                &self.alarms_abandoned_total,
                "counter",
                "Alarms dropped after the app's retries_max.",
            ),
            (
                "wasmkeep_alarm_rehearsals_total",
                &self.alarm_rehearsals_total,
                "counter",
                "Alarm handlers run once and rolled back to learn their statements (ADR 0030).",
            ),
            (
                "wasmkeep_alarms_pending",
                &self.alarms_pending,
                "gauge",
                "Alarms in this node's timer.",
            ),
            (
                "wasmkeep_guest_log_lines_dropped_total",
                &self.guest_log_lines_dropped_total,
                "counter",
                "Guest log lines dropped past a call's log budget.",
            ),
            (
                "wasmkeep_worker_panics_total",
                &self.worker_panics_total,
                "counter",
                "Actor turns a worker panicked in and survived (a bug).",
            ),
            (
                "wasmkeep_compile_cache_rejected_total",
                &self.compile_cache_rejected_total,
                "counter",
                "Compiled components in the cache that failed their check and were compiled again.",
            ),
        ];
        for (name, v, kind, help) in counters {
            write_sample(&mut out, name, kind, help, v.load(Ordering::Relaxed));
        }
        self.event_latency.render(
            &mut out,
            "wasmkeep_event_seconds",
            "Time from enqueue to a request's response being released.",
        );
        self.sync_latency.render(
            &mut out,
            "wasmkeep_sync_seconds",
            "Duration of durability barriers.",
        );
        self.alarm_lateness.render(
            &mut out,
            "wasmkeep_alarm_lateness_seconds",
            "Time from an alarm's due time to its handler starting.",
        );
        self.phase_queue.render(
            &mut out,
            "wasmkeep_phase_queue_seconds",
            "Time a batch's first event waited in its actor's queue and the run queue.",
        );
        self.phase_open.render(
            &mut out,
            "wasmkeep_phase_open_seconds",
            "Time to open an actor's database and instantiate it, when a batch had to.",
        );
        self.phase_instantiate.render(
            &mut out,
            "wasmkeep_phase_instantiate_seconds",
            "Time to instantiate a component for an actor (part of the open phase).",
        );
        self.phase_events.render(
            &mut out,
            "wasmkeep_phase_events_seconds",
            "Time a batch spent running its events (guest code and its SQL).",
        );
        self.phase_commit.render(
            &mut out,
            "wasmkeep_phase_commit_seconds",
            "Time to commit a batch's transaction.",
        );
        self.phase_durable.render(
            &mut out,
            "wasmkeep_phase_durable_seconds",
            "Time from a batch's commit to its replies' release (the durability stage).",
        );
        self.render_replication(&mut out);
        out
    }

    fn render_replication(&self, out: &mut String) {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut counters: Vec<(&str, u64, &str)> = vec![
            (
                "wasmkeep_replica_uploads_total",
                l(&self.replica_uploads_total),
                "Uploads to the bucket that finished (one entry each, or none if nothing changed).",
            ),
            (
                "wasmkeep_replica_entry_bytes_total",
                l(&self.replica_entry_bytes_total),
                "Bytes of chain entries written.",
            ),
            (
                "wasmkeep_replica_snapshots_total",
                l(&self.replica_snapshots_total),
                "Snapshots written after an entry.",
            ),
            (
                "wasmkeep_replica_restores_total",
                l(&self.replica_restores_total),
                "Actors whose local file was restored from the bucket.",
            ),
            (
                "wasmkeep_replica_given_up_total",
                l(&self.replica_given_up_total),
                "Actors given up after their chain moved or an upload failed.",
            ),
        ];
        if let Some(b) = &self.bucket {
            let b = b.snapshot();
            counters.extend([
                (
                    "wasmkeep_bucket_puts_total",
                    b.puts,
                    "PUT requests to the bucket.",
                ),
                (
                    "wasmkeep_bucket_put_bytes_total",
                    b.put_bytes,
                    "Bytes PUT to the bucket.",
                ),
                (
                    "wasmkeep_bucket_gets_total",
                    b.gets,
                    "GET requests to the bucket.",
                ),
                (
                    "wasmkeep_bucket_get_bytes_total",
                    b.get_bytes,
                    "Bytes read from the bucket.",
                ),
                (
                    "wasmkeep_bucket_lists_total",
                    b.lists,
                    "LIST requests to the bucket.",
                ),
                (
                    "wasmkeep_bucket_deletes_total",
                    b.deletes,
                    "DELETE requests to the bucket.",
                ),
            ]);
        }
        for (name, v, help) in counters {
            write_sample(out, name, "counter", help, v);
        }
        self.replica_upload_latency.render(
            out,
            "wasmkeep_replica_upload_seconds",
            "Duration of one upload (the entry's create-only PUT and its check).",
        );
        self.replica_lag.render(
            out,
            "wasmkeep_replica_lag_seconds",
            "Replication lag: from the oldest commit an upload carried to the upload's end.",
        );
    }
}

/// Appends one sample in Prometheus' text format, with its `HELP` and
/// `TYPE` lines: the one place the node writes a counter or gauge (the
/// runtime's and the server's cluster counters alike).
pub fn write_sample(out: &mut String, name: &str, kind: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}
