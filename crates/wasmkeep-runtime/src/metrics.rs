//! The node's counters, gauges and latency histograms, rendered by the
//! Prometheus client library (`prometheus-client`) in the OpenMetrics text
//! format.
//!
//! Counters and gauges are the library's own: an atomic each, so the hot
//! path does one relaxed add. Latency histograms are [`Histogram`]: an
//! atomic per bucket, because the library's histogram takes a lock on every
//! observation, and an event records several. The library encodes them all
//! (names, `_total` suffixes, units, bucket bounds, `+Inf`), from one
//! registry per [`Metrics`].
//!
//! [`Metrics::encode`] writes the series without the closing `# EOF`: the
//! server appends its cluster series to the same exposition and ends it
//! (`wasmkeep-server`'s `/metrics`). This module knows nothing of HTTP.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Metric, Registry, Unit};

/// A gauge that counts things (never negative).
pub type GaugeU64 = Gauge<u64, AtomicU64>;

/// Upper bounds of the latency buckets, in seconds. Observations above the
/// last fall in the `+Inf` bucket only.
pub(crate) const BUCKETS_SECONDS: [f64; 17] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// A latency histogram with the fixed bounds [`BUCKETS_SECONDS`], lock-free:
/// an observation is one relaxed add to its bucket and one to the sum.
/// Clones share their counts (one clone sits in the registry).
#[derive(Debug, Default, Clone)]
pub struct Histogram(Arc<HistogramCells>);

#[derive(Debug, Default)]
struct HistogramCells {
    /// Observations per bucket, not cumulative: one slot per bound of
    /// [`BUCKETS_SECONDS`], then the `+Inf` slot. The count is their sum,
    /// so the `+Inf` bucket and `_count` always agree.
    buckets: [AtomicU64; BUCKETS_SECONDS.len() + 1],
    /// The sum of observations in seconds, as `f64` bits.
    sum_bits: AtomicU64,
}

impl Histogram {
    /// Records a duration in milliseconds.
    pub fn observe_ms(&self, ms: f64) {
        self.observe_seconds(ms / 1000.0);
    }

    /// Records a duration in seconds; a negative (or NaN) one counts as 0.
    pub fn observe_seconds(&self, seconds: f64) {
        let seconds = seconds.max(0.0);
        // The first bound not below the value: `le` is inclusive. Past the
        // last bound this is the `+Inf` slot.
        let i = BUCKETS_SECONDS.partition_point(|b| *b < seconds);
        self.0.buckets[i].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .0
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + seconds).to_bits())
            });
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.0
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .sum()
    }

    /// The sum of the observations, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        f64::from_bits(self.0.sum_bits.load(Ordering::Relaxed))
    }
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        let mut buckets = [(f64::INFINITY, 0u64); BUCKETS_SECONDS.len() + 1];
        for (i, slot) in buckets.iter_mut().enumerate() {
            if let Some(bound) = BUCKETS_SECONDS.get(i) {
                slot.0 = *bound;
            }
            slot.1 = self.0.buckets[i].load(Ordering::Relaxed);
        }
        let count = buckets.iter().map(|b| b.1).sum();
        encoder.encode_histogram::<NoLabelSet>(self.sum_seconds(), count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Every series a node's runtime exports. Counters are named here by what
/// they count; [`Metrics::encode`] shows each under its series name.
#[derive(Debug, Default)]
pub struct Metrics {
    pub requests_total: Counter,
    pub request_errors_total: Counter,
    pub events_total: Counter,
    pub event_failures_total: Counter,
    pub batches_total: Counter,
    /// Turns that stopped at `batch_time_budget_ms` with events left.
    pub turns_yielded_total: Counter,
    pub commits_failed_total: Counter,
    /// Events recorded, held or written (ADR 0062, ADR 0067).
    pub events_recorded_total: Counter,
    /// Events suspended on a wait for an answer (ADR 0056).
    pub awaits_suspended_total: Counter,
    /// Generations of recording not started: the app's bytes limit.
    pub recording_refused_total: Counter,
    pub overloaded_total: Counter,
    pub instances_active: GaugeU64,
    /// Memory freed instance slots keep for their next instance (ADR
    /// 0078), as the reaper last read it.
    pub instance_slots_resident_bytes: GaugeU64,
    pub instantiations_total: Counter,
    pub evictions_total: Counter,
    /// Open actors whose database was closed (their instance kept) to stay
    /// within `open_databases_max` (ADR 0068).
    pub databases_parked_total: Counter,
    pub syncs_total: Counter,
    pub syncfs_total: Counter,
    /// Barriers served by one `fdatasync` of the commit log (ADR 0074).
    pub commit_log_barriers_total: Counter,
    pub alarms_fired_total: Counter,
    /// `wasmkeep_alarms_retried_total`.
    pub alarms_failed_total: Counter,
    pub alarms_abandoned_total: Counter,
    pub alarm_rehearsals_total: Counter,
    pub alarms_pending: GaugeU64,
    /// Guest log lines dropped past `event_log_lines_max` or
    /// `event_log_bytes_max`.
    pub guest_log_lines_dropped_total: Counter,
    /// Turns a worker panicked in (a bug) and survived.
    pub worker_panics_total: Counter,
    /// Compiled code in the cache that failed its check and was compiled
    /// again.
    pub compile_cache_rejected_total: Counter,
    /// Outbox rows the dispatcher took for delivery (ADR 0040).
    pub outbox_taken_total: Counter,
    /// Answers (or final failures) applied by their senders.
    pub outbox_answers_total: Counter,
    /// Deliveries that failed for good (their senders heard `failed`).
    pub outbox_failed_total: Counter,
    /// Answers dropped after their sender's `on-response` kept failing.
    pub outbox_answers_dropped_total: Counter,
    /// Rows the dispatcher holds now (taken, not yet finished).
    pub outbox_pending: GaugeU64,
    /// Replies parked now (ADR 0042).
    pub parked_replies: GaugeU64,
    pub event_latency: Histogram,
    pub sync_latency: Histogram,
    pub alarm_lateness: Histogram,
    /// Where a batch's time goes (see `register_phases` for the series
    /// names).
    pub phase_queue: Histogram,
    pub phase_open: Histogram,
    pub phase_instantiate: Histogram,
    pub phase_events: Histogram,
    pub phase_commit: Histogram,
    pub phase_durable: Histogram,
    pub replica_uploads_total: Counter,
    pub replica_entry_bytes_total: Counter,
    pub replica_snapshots_total: Counter,
    pub replica_restores_total: Counter,
    /// Actors whose local file held commits past the bucket's head that no
    /// upload carried, kept and uploaded (ADR 0082).
    pub replica_kept_ahead_total: Counter,
    pub replica_given_up_total: Counter,
    /// Uploads built from the pages commits wrote (ADR 0036), and those
    /// that read the whole database instead.
    pub replica_page_uploads_total: Counter,
    /// Snapshots streamed from an actor's file that did not land (torn,
    /// or the bucket failed); tried again later.
    pub replica_snapshot_failures_total: Counter,
    /// Deltas (the pages changed since the last snapshot, ADR 0037)
    /// streamed in place of a whole snapshot.
    pub replica_deltas_total: Counter,
    pub replica_image_reads_total: Counter,
    /// Uploads that read the actor's file whole, page by page, without
    /// holding it in memory (an upload with no base: ADR 0038).
    pub replica_file_reads_total: Counter,
    /// Alarm index entries listed and removed by this node as an owner
    /// (ADR 0009; a cluster node only).
    pub index_puts_total: Counter,
    pub index_deletes_total: Counter,
    pub replica_upload_latency: Histogram,
    pub replica_lag: Histogram,
    /// The bucket's own request counters, when the node has one. Set before
    /// the first [`Metrics::encode`]: the registry is built then, once.
    pub bucket: Option<Arc<wasmkeep_replica::Metrics>>,
    /// The series labelled by tenant, app and class, when the node keeps
    /// them ([`crate::class_metrics`]).
    pub classes: Option<Arc<crate::class_metrics::ClassMetricsRegistry>>,
    /// Clones of the series above under their names, built on the first
    /// encode (after `bucket` is set).
    registry: OnceLock<Registry>,
    /// The same for `classes` ([`Metrics::encode_classes`]).
    class_registry: OnceLock<Registry>,
}

impl Metrics {
    /// The series of a node with a bucket: the bucket's request counters
    /// too.
    pub fn with_bucket(bucket: Arc<wasmkeep_replica::Metrics>) -> Metrics {
        Metrics {
            bucket: Some(bucket),
            ..Metrics::default()
        }
    }

    pub fn inc(c: &Counter) {
        c.inc();
    }

    /// Appends every series in the OpenMetrics text format, without the
    /// closing `# EOF` (the caller ends the exposition, after anything it
    /// appends: see `prometheus_client::encoding::text::encode_eof`).
    pub fn encode(&self, out: &mut String) -> fmt::Result {
        let registry = self.registry.get_or_init(|| self.build_registry());
        prometheus_client::encoding::text::encode_registry(out, registry)
    }

    /// Appends the series labelled by tenant, app and class (none when the
    /// node keeps none). Apart from [`Metrics::encode`]: they name tenants,
    /// so the server shows them only to whoever may use the admin API.
    pub fn encode_classes(&self, out: &mut String) -> fmt::Result {
        let Some(classes) = &self.classes else {
            return Ok(());
        };
        let registry = self.class_registry.get_or_init(|| {
            let mut r = Registry::default();
            let collector = crate::class_metrics::ClassCollector(Arc::clone(classes));
            r.register_collector(Box::new(collector));
            r
        });
        prometheus_client::encoding::text::encode_registry(out, registry)
    }

    fn build_registry(&self) -> Registry {
        let mut r = Registry::default();
        self.register_node(&mut r);
        self.register_phases(&mut r);
        self.register_replication(&mut r);
        if let Some(b) = &self.bucket {
            r.register_collector(Box::new(BucketCollector(Arc::clone(b))));
        }
        r
    }

    fn register_node(&self, r: &mut Registry) {
        // Counters are registered without `_total`: the library appends it.
        self.register_events(r);
        self.register_instances_and_alarms(r);
        self.register_faults(r);
        self.register_outbox(r);
    }

    /// The first counters of the exposition (three of replication's, then
    /// requests, events and batches) and the live instances.
    fn register_events(&self, r: &mut Registry) {
        let series: [(&str, &Counter, &str); 14] = [
            (
                "wasmkeep_replica_file_reads",
                &self.replica_file_reads_total,
                "Uploads that read the actor's file whole, page by page, without holding it in memory (a first upload).",
            ),
            (
                "wasmkeep_replica_snapshot_failures",
                &self.replica_snapshot_failures_total,
                "Snapshots streamed from an actor's file that did not land (tried again later).",
            ),
            (
                "wasmkeep_replica_deltas",
                &self.replica_deltas_total,
                "Deltas (the pages changed since the actor's last snapshot) written in place of a whole snapshot.",
            ),
            (
                "wasmkeep_requests",
                &self.requests_total,
                "Requests handed to actors.",
            ),
            (
                "wasmkeep_request_errors",
                &self.request_errors_total,
                "Requests that ended in an error.",
            ),
            (
                "wasmkeep_events",
                &self.events_total,
                "Events run (requests, alarms, inits).",
            ),
            (
                "wasmkeep_event_failures",
                &self.event_failures_total,
                "Events rolled back.",
            ),
            (
                "wasmkeep_batches",
                &self.batches_total,
                "Transactions committed for batches of events.",
            ),
            (
                "wasmkeep_turns_yielded",
                &self.turns_yielded_total,
                "Turns that stopped at batch_time_budget_ms with events left for the actor's next turn.",
            ),
            (
                "wasmkeep_commits_failed",
                &self.commits_failed_total,
                "Batch commits that failed.",
            ),
            (
                "wasmkeep_events_recorded",
                &self.events_recorded_total,
                "Events recorded for replay (written to their actor's recording, or held to be written with the next ones, ADR 0067).",
            ),
            (
                "wasmkeep_awaits_suspended",
                &self.awaits_suspended_total,
                "Events suspended on a wait for an answer (each run that waited).",
            ),
            (
                "wasmkeep_recording_refused",
                &self.recording_refused_total,
                "Recording generations not started because the app's recording_bytes_per_app_max was reached.",
            ),
            (
                "wasmkeep_overloaded",
                &self.overloaded_total,
                "Requests refused because an actor's queue was full.",
            ),
        ];
        for (name, c, help) in series {
            register(r, name, help, None, c.clone());
        }
        register(
            r,
            "wasmkeep_instances_active",
            "Actors with a live instance.",
            None,
            self.instances_active.clone(),
        );
        register(
            r,
            "wasmkeep_instance_slots_resident_bytes",
            "Bytes of memories and tables that freed instance slots keep resident for their next instance (instance_keep_resident_bytes), read each second.",
            None,
            self.instance_slots_resident_bytes.clone(),
        );
    }

    /// The series of instances, barriers and alarms.
    fn register_instances_and_alarms(&self, r: &mut Registry) {
        let series: [(&str, &Counter, &str); 10] = [
            (
                "wasmkeep_instantiations",
                &self.instantiations_total,
                "Instances created.",
            ),
            (
                "wasmkeep_evictions",
                &self.evictions_total,
                "Actors closed to make room for others.",
            ),
            (
                "wasmkeep_databases_parked",
                &self.databases_parked_total,
                "Open actors whose database was closed, their instance kept, to stay within open_databases_max.",
            ),
            (
                "wasmkeep_syncs",
                &self.syncs_total,
                "Durability barriers (fdatasync or syncfs).",
            ),
            (
                "wasmkeep_syncfs",
                &self.syncfs_total,
                "Barriers served by one syncfs for a group.",
            ),
            (
                "wasmkeep_commit_log_barriers",
                &self.commit_log_barriers_total,
                "Barriers served by one fdatasync of the node's commit log.",
            ),
            (
                "wasmkeep_alarms_fired",
                &self.alarms_fired_total,
                "Alarm handlers that succeeded.",
            ),
            (
                "wasmkeep_alarms_retried",
                &self.alarms_failed_total,
                "Alarm handlers that failed and were rescheduled.",
            ),
            (
                "wasmkeep_alarms_abandoned",
                &self.alarms_abandoned_total,
                "Alarms dropped after the app's retries_max.",
            ),
            (
                "wasmkeep_alarm_rehearsals",
                &self.alarm_rehearsals_total,
                "Alarm handlers run once and rolled back to learn their statements (ADR 0030).",
            ),
        ];
        for (name, c, help) in series {
            register(r, name, help, None, c.clone());
        }
        register(
            r,
            "wasmkeep_alarms_pending",
            "Alarms in this node's timer.",
            None,
            self.alarms_pending.clone(),
        );
    }

    /// The series of what went wrong without failing an event: dropped log
    /// lines, worker panics, rejected compiled code.
    fn register_faults(&self, r: &mut Registry) {
        let series: [(&str, &Counter, &str); 3] = [
            (
                "wasmkeep_guest_log_lines_dropped",
                &self.guest_log_lines_dropped_total,
                "Guest log lines dropped past a call's log budget.",
            ),
            (
                "wasmkeep_worker_panics",
                &self.worker_panics_total,
                "Actor turns a worker panicked in and survived (a bug).",
            ),
            (
                "wasmkeep_compile_cache_rejected",
                &self.compile_cache_rejected_total,
                "Compiled components in the cache that failed their check and were compiled again.",
            ),
        ];
        for (name, c, help) in series {
            register(r, name, help, None, c.clone());
        }
    }

    /// The series of the outbox's deliveries (ADR 0040) and of parked
    /// replies (ADR 0042).
    fn register_outbox(&self, r: &mut Registry) {
        let series: [(&str, &Counter, &str); 4] = [
            (
                "wasmkeep_outbox_taken",
                &self.outbox_taken_total,
                "Messages and calls actors sent that the dispatcher took for delivery (ADR 0040).",
            ),
            (
                "wasmkeep_outbox_answers",
                &self.outbox_answers_total,
                "Answers (or final failures) applied by the actors that sent.",
            ),
            (
                "wasmkeep_outbox_failed",
                &self.outbox_failed_total,
                "Deliveries that failed for good (the sender heard failed).",
            ),
            (
                "wasmkeep_outbox_answers_dropped",
                &self.outbox_answers_dropped_total,
                "Answers dropped after the sender's on-response kept failing.",
            ),
        ];
        for (name, c, help) in series {
            register(r, name, help, None, c.clone());
        }
        register(
            r,
            "wasmkeep_outbox_pending",
            "Messages and calls the dispatcher holds (taken, not finished).",
            None,
            self.outbox_pending.clone(),
        );
        register(
            r,
            "wasmkeep_parked_replies",
            "Replies parked until a later event completes them (ADR 0042).",
            None,
            self.parked_replies.clone(),
        );
    }

    fn register_phases(&self, r: &mut Registry) {
        // Histograms are registered without `_seconds`: the unit appends it.
        let series: [(&str, &Histogram, &str); 9] = [
            (
                "wasmkeep_event",
                &self.event_latency,
                "Time from enqueue to a request's response being released.",
            ),
            (
                "wasmkeep_sync",
                &self.sync_latency,
                "Duration of durability barriers.",
            ),
            (
                "wasmkeep_alarm_lateness",
                &self.alarm_lateness,
                "Time from an alarm's due time to its handler starting.",
            ),
            (
                "wasmkeep_phase_queue",
                &self.phase_queue,
                "Time a batch's first event waited in its actor's queue and the run queue.",
            ),
            (
                "wasmkeep_phase_open",
                &self.phase_open,
                "Time to open an actor's database and instantiate it, when a batch had to.",
            ),
            (
                "wasmkeep_phase_instantiate",
                &self.phase_instantiate,
                "Time to instantiate a component for an actor (part of the open phase).",
            ),
            (
                "wasmkeep_phase_events",
                &self.phase_events,
                "Time a batch spent running its events (guest code and its SQL).",
            ),
            (
                "wasmkeep_phase_commit",
                &self.phase_commit,
                "Time to commit a batch's transaction.",
            ),
            (
                "wasmkeep_phase_durable",
                &self.phase_durable,
                "Time from a batch's commit to its replies' release (the durability stage).",
            ),
        ];
        for (name, h, help) in series {
            register(r, name, help, Some(Unit::Seconds), h.clone());
        }
    }

    fn register_replication(&self, r: &mut Registry) {
        register(
            r,
            "wasmkeep_replica_uploads",
            "Uploads to the bucket that finished (one entry each, or none if nothing changed).",
            None,
            self.replica_uploads_total.clone(),
        );
        register(
            r,
            "wasmkeep_replica_entry",
            "Bytes of chain entries written.",
            Some(Unit::Bytes),
            self.replica_entry_bytes_total.clone(),
        );
        let series: [(&str, &Counter, &str); 8] = [
            (
                "wasmkeep_replica_page_uploads",
                &self.replica_page_uploads_total,
                "Uploads that shipped the pages commits wrote, captured as SQLite wrote them.",
            ),
            (
                "wasmkeep_replica_image_reads",
                &self.replica_image_reads_total,
                "Uploads that could not use captured pages and read the whole database: page by page against the head's hashes, or into memory (a snapshot overdue after a failed stream, a file that could not be read page by page).",
            ),
            (
                "wasmkeep_replica_snapshots",
                &self.replica_snapshots_total,
                "Whole snapshots written after an entry.",
            ),
            (
                "wasmkeep_replica_restores",
                &self.replica_restores_total,
                "Actors whose local file was restored from the bucket.",
            ),
            (
                "wasmkeep_replica_kept_ahead",
                &self.replica_kept_ahead_total,
                "Actors whose local file held commits past the bucket's head that no upload carried (the node crashed, or stopped with uploads failing): kept, and uploaded whole above the head.",
            ),
            (
                "wasmkeep_replica_given_up",
                &self.replica_given_up_total,
                "Actors given up after their chain moved or an upload failed.",
            ),
            (
                "wasmkeep_alarm_index_puts",
                &self.index_puts_total,
                "Alarm index entries this node listed before an upload (cluster).",
            ),
            (
                "wasmkeep_alarm_index_deletes",
                &self.index_deletes_total,
                "Replaced alarm index entries this node removed after an upload (cluster).",
            ),
        ];
        for (name, c, help) in series {
            register(r, name, help, None, c.clone());
        }
        register(
            r,
            "wasmkeep_replica_upload",
            "Duration of one upload (the entry's create-only PUT and its check).",
            Some(Unit::Seconds),
            self.replica_upload_latency.clone(),
        );
        register(
            r,
            "wasmkeep_replica_lag",
            "Replication lag: from the oldest commit an upload carried to the upload's end.",
            Some(Unit::Seconds),
            self.replica_lag.clone(),
        );
    }
}

/// Registers one series: the one place the node names a series (the
/// runtime's and the server's cluster series alike). `help` is a sentence;
/// the library adds the full stop itself, so it is taken off here.
pub fn register(r: &mut Registry, name: &str, help: &str, unit: Option<Unit>, metric: impl Metric) {
    let help = help.strip_suffix('.').unwrap_or(help);
    match unit {
        Some(unit) => r.register_with_unit(name, help, unit, metric),
        None => r.register(name, help, metric),
    }
}

/// The bucket's request counters, which `wasmkeep-replica` keeps on its own
/// atomics: read once per scrape.
#[derive(Debug)]
struct BucketCollector(Arc<wasmkeep_replica::Metrics>);

impl Collector for BucketCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let b = self.0.snapshot();
        let series: [(&str, Option<Unit>, u64, &str); 6] = [
            (
                "wasmkeep_bucket_puts",
                None,
                b.puts,
                "PUT requests to the bucket.",
            ),
            (
                "wasmkeep_bucket_put",
                Some(Unit::Bytes),
                b.put_bytes,
                "Bytes PUT to the bucket.",
            ),
            (
                "wasmkeep_bucket_gets",
                None,
                b.gets,
                "GET requests to the bucket.",
            ),
            (
                "wasmkeep_bucket_get",
                Some(Unit::Bytes),
                b.get_bytes,
                "Bytes read from the bucket.",
            ),
            (
                "wasmkeep_bucket_lists",
                None,
                b.lists,
                "LIST requests to the bucket.",
            ),
            (
                "wasmkeep_bucket_deletes",
                None,
                b.deletes,
                "DELETE requests to the bucket.",
            ),
        ];
        for (name, unit, value, help) in series {
            let counter = ConstCounter::new(value);
            let metric =
                encoder.encode_descriptor(name, help, unit.as_ref(), counter.metric_type())?;
            counter.encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn exposition(m: &Metrics) -> String {
        let mut out = String::new();
        m.encode(&mut out).unwrap();
        prometheus_client::encoding::text::encode_eof(&mut out).unwrap();
        out
    }

    /// The value of one sample line (`name{labels} value`).
    fn sample(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no `{series}` in:\n{text}"))
            .parse()
            .unwrap()
    }

    /// An observation past the largest bound is counted by `+Inf` only; the
    /// old renderer clamped it into `le="30"`.
    #[test]
    fn an_observation_above_the_largest_bound_lands_only_in_inf() {
        let m = Metrics::default();
        m.event_latency.observe_ms(45_000.0);
        m.event_latency.observe_ms(30_000.0);
        m.event_latency.observe_ms(2.0);
        let text = exposition(&m);
        let bucket = |le: &str| {
            sample(
                &text,
                &format!("wasmkeep_event_seconds_bucket{{le=\"{le}\"}}"),
            )
        };
        assert_eq!(bucket("0.001"), 0.0);
        assert_eq!(bucket("0.0025"), 1.0);
        assert_eq!(bucket("10.0"), 1.0);
        // `le` is inclusive: 30 s is in the last bound, 45 s past it.
        assert_eq!(bucket("30.0"), 2.0);
        assert_eq!(bucket("+Inf"), 3.0);
        assert_eq!(sample(&text, "wasmkeep_event_seconds_count"), 3.0);
        let sum = sample(&text, "wasmkeep_event_seconds_sum");
        assert!((sum - 75.002).abs() < 1e-9, "{sum}");
    }

    /// Every bound of `BUCKETS_SECONDS` appears as its own `le`, in order,
    /// cumulative, followed by `+Inf`.
    #[test]
    fn buckets_are_cumulative_with_the_same_bounds() {
        let h = Histogram::default();
        for b in BUCKETS_SECONDS {
            h.observe_seconds(b);
        }
        h.observe_seconds(-1.0);
        let m = Metrics {
            sync_latency: h,
            ..Metrics::default()
        };
        let text = exposition(&m);
        let les: Vec<(f64, f64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("wasmkeep_sync_seconds_bucket{le=\""))
            .map(|l| {
                let (le, v) = l.split_once("\"} ").unwrap();
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                (le, v.parse().unwrap())
            })
            .collect();
        let mut bounds: Vec<f64> = BUCKETS_SECONDS.to_vec();
        bounds.push(f64::INFINITY);
        assert_eq!(les.iter().map(|l| l.0).collect::<Vec<_>>(), bounds);
        // The negative one counts as 0, in the first bucket.
        let counts: Vec<f64> = les.iter().map(|l| l.1).collect();
        let expected: Vec<f64> = (2..=18).map(f64::from).chain([18.0]).collect();
        assert_eq!(counts, expected);
    }

    /// The exposition parses: every family has one `TYPE` and one `HELP`,
    /// before its samples, each sample belongs to the family above it, and
    /// no name appears twice. Counters keep their `_total` names.
    #[test]
    fn the_exposition_has_one_type_per_family_and_unique_samples() {
        let m = Metrics::with_bucket(Arc::new(wasmkeep_replica::Metrics::default()));
        Metrics::inc(&m.requests_total);
        m.replica_entry_bytes_total.inc_by(10);
        m.instances_active.inc();
        let text = exposition(&m);
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(text.matches("# EOF").count(), 1);

        let mut types: BTreeMap<String, String> = BTreeMap::new();
        let mut helps = BTreeSet::new();
        let mut samples = BTreeSet::new();
        let mut family = String::new();
        for line in text.lines().filter(|l| *l != "# EOF") {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(
                    types.insert(name.into(), kind.into()).is_none(),
                    "{name} twice"
                );
                family = name.into();
            } else if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap();
                assert!(helps.insert(name.to_string()), "HELP {name} twice");
                assert!(help.ends_with('.') && !help.ends_with(".."), "{line}");
            } else if line.starts_with("# UNIT ") {
            } else {
                let (series, value) = line.rsplit_once(' ').unwrap();
                let _: f64 = value.parse().unwrap();
                assert!(samples.insert(series.to_string()), "{series} twice");
                let name = series.split('{').next().unwrap();
                let suffixes: &[&str] = match types[&family].as_str() {
                    "counter" => &["_total"],
                    "histogram" => &["_bucket", "_sum", "_count"],
                    _ => &[""],
                };
                assert!(
                    suffixes.iter().any(|s| name == format!("{family}{s}")),
                    "{name} under {family}"
                );
            }
        }
        assert_eq!(
            types.keys().collect::<Vec<_>>(),
            helps.iter().collect::<Vec<_>>()
        );
        assert_eq!(sample(&text, "wasmkeep_requests_total"), 1.0);
        assert_eq!(sample(&text, "wasmkeep_replica_entry_bytes_total"), 10.0);
        assert_eq!(sample(&text, "wasmkeep_instances_active"), 1.0);
        assert_eq!(sample(&text, "wasmkeep_bucket_put_bytes_total"), 0.0);
        assert_eq!(types["wasmkeep_event_seconds"], "histogram");
        assert_eq!(types["wasmkeep_alarms_pending"], "gauge");
        // 25 node series, 6 of the outbox and parked replies, 9 phase
        // histograms, 12 of replication, 2 of recording, 1 of waits, 2 of
        // the alarm index, 6 bucket counters.
        assert_eq!(types.len(), 63);
        assert_eq!(types["wasmkeep_outbox_pending"], "gauge");
        assert_eq!(types["wasmkeep_outbox_answers"], "counter");
    }
}
