//! Series labelled by tenant, app and class (issue 22): which class of
//! which tenant takes the requests, fails them, runs its alarms late or
//! again and again, and holds the disk.
//!
//! Labels come only from deployed classes, never from what a client
//! typed: a request for an unknown class counts in the node's unlabelled
//! series only. The number of label sets is capped
//! (`metrics_classes_max`): a class deployed past the cap, and a class
//! whose app is gone but whose actors still hold disk, counts under the
//! label set `tenant="_other",app="_other",class="_other"`, and
//! `wasmkeep_class_label_sets_folded` says how many classes were folded
//! there. A scrape thus writes at most `metrics_classes_max + 1` label sets
//! per series (times the error codes, a fixed list, for errors).
//!
//! Counting is an atomic add on an `Arc` looked up under a read lock; the
//! disk sizes come from a census of the data folder that a thread of its
//! own runs every `metrics_census_ms`, off the workers.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Unit;
use wasmkeep_store::ActorId;

use crate::metrics::{GaugeU64, Histogram};

/// The label value of the folded set.
pub(crate) const OTHER: &str = "_other";

/// `(tenant, app, class)`.
type ClassKey = (String, String, String);

/// tenant → app → class → series.
type ByClass = HashMap<String, HashMap<String, HashMap<String, Arc<ClassMetrics>>>>;

/// One class's series.
#[derive(Debug, Default)]
pub struct ClassMetrics {
    pub requests: Counter,
    /// Actor messages the class's actors handled (applied or refused).
    pub messages: Counter,
    /// WebSocket messages and closes the class's actors handled.
    pub socket_events: Counter,
    /// Failed requests by error code (codes are a fixed list).
    errors: Mutex<BTreeMap<String, u64>>,
    pub alarm_runs_ok: Counter,
    pub alarm_runs_failed: Counter,
    /// Alarm runs that were retries of a failed run.
    pub alarm_retries: Counter,
    pub alarm_lateness: Histogram,
    /// Bytes of the class's actors' files (database and WAL), at the last
    /// census.
    pub database_bytes: GaugeU64,
    /// The class's actors on this node's disk, at the last census.
    pub actors: GaugeU64,
    /// Cuts the class's failed-request lines to a rate (the edge's
    /// `failed_request_log_per_s`), so that one class's failures cannot
    /// crowd another's out.
    pub failure_lines: crate::logs::RateCut,
}

impl ClassMetrics {
    pub fn error(&self, code: &str) {
        let mut errors = self.errors.lock();
        match errors.get_mut(code) {
            Some(n) => *n += 1,
            None => {
                errors.insert(code.to_owned(), 1);
            }
        }
    }

    /// Failed requests with `code` so far.
    #[cfg(test)]
    fn errors_of(&self, code: &str) -> u64 {
        self.errors.lock().get(code).copied().unwrap_or(0)
    }
}

/// Every class's series, with the cap.
#[derive(Debug)]
pub struct ClassMetricsRegistry {
    max: usize,
    /// tenant → app → class → series; a folded class maps to `other`.
    /// Nested so that a lookup by an actor's `&str`s allocates nothing.
    classes: RwLock<ByClass>,
    other: Arc<ClassMetrics>,
    /// Classes with label sets of their own.
    own: AtomicU64,
    /// Deployed classes counted under [`OTHER`] because of the cap.
    folded_count: AtomicU64,
}

impl ClassMetricsRegistry {
    pub fn new(max: usize) -> ClassMetricsRegistry {
        ClassMetricsRegistry {
            max,
            classes: RwLock::new(HashMap::new()),
            other: Arc::new(ClassMetrics::default()),
            own: AtomicU64::new(0),
            folded_count: AtomicU64::new(0),
        }
    }

    /// Gives a deployed class its own label set while the cap allows; past
    /// it the class counts under [`OTHER`].
    pub fn register(&self, tenant: &str, app: &str, class: &str) {
        if self.lookup(tenant, app, class).is_some() {
            return;
        }
        let mut classes = self.classes.write();
        let slot = classes
            .entry(tenant.to_owned())
            .or_default()
            .entry(app.to_owned())
            .or_default();
        if slot.contains_key(class) {
            return;
        }
        let series = if (self.own.load(Ordering::Relaxed) as usize) < self.max {
            self.own.fetch_add(1, Ordering::Relaxed);
            Arc::new(ClassMetrics::default())
        } else {
            self.folded_count.fetch_add(1, Ordering::Relaxed);
            Arc::clone(&self.other)
        };
        slot.insert(class.to_owned(), series);
    }

    fn lookup(&self, tenant: &str, app: &str, class: &str) -> Option<Arc<ClassMetrics>> {
        self.classes
            .read()
            .get(tenant)?
            .get(app)?
            .get(class)
            .map(Arc::clone)
    }

    /// The series an event of `id` counts in: its class's, [`OTHER`]'s if
    /// the class was folded, none if the class was never deployed here.
    pub fn of(&self, id: &ActorId) -> Option<Arc<ClassMetrics>> {
        self.lookup(&id.tenant, &id.app, &id.class)
    }

    /// Sets the disk gauges from a census: bytes and actors per class.
    /// Classes that have no label set of their own count under [`OTHER`].
    pub fn set_census(&self, census: &HashMap<ClassKey, (u64, u64)>) {
        let own: HashMap<ClassKey, Arc<ClassMetrics>> = self.snapshot_own().into_iter().collect();
        let mut other = (0, 0);
        for (key, m) in &own {
            let (bytes, actors) = census.get(key).copied().unwrap_or_default();
            m.database_bytes.set(bytes);
            m.actors.set(actors);
        }
        for (key, (bytes, actors)) in census {
            if !own.contains_key(key) {
                other.0 += bytes;
                other.1 += actors;
            }
        }
        self.other.database_bytes.set(other.0);
        self.other.actors.set(other.1);
    }

    /// The label sets in use (not counting [`OTHER`]).
    fn label_sets(&self) -> usize {
        self.own.load(Ordering::Relaxed) as usize
    }

    /// The classes with label sets of their own, in label order.
    fn snapshot_own(&self) -> Vec<(ClassKey, Arc<ClassMetrics>)> {
        let mut all = Vec::new();
        for (t, apps) in self.classes.read().iter() {
            for (a, classes) in apps {
                for (c, m) in classes {
                    if !Arc::ptr_eq(m, &self.other) {
                        all.push(((t.clone(), a.clone(), c.clone()), Arc::clone(m)));
                    }
                }
            }
        }
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    fn snapshot(&self) -> Vec<(ClassKey, Arc<ClassMetrics>)> {
        let mut all = self.snapshot_own();
        all.push((
            (OTHER.into(), OTHER.into(), OTHER.into()),
            Arc::clone(&self.other),
        ));
        all
    }
}

/// The registry as a Prometheus collector (read at each scrape).
#[derive(Debug)]
pub(crate) struct ClassCollector(pub Arc<ClassMetricsRegistry>);

impl Collector for ClassCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let all = self.0.snapshot();
        encode_counters(&mut encoder, &all)?;
        encode_errors(&mut encoder, &all)?;
        encode_lateness(&mut encoder, &all)?;
        encode_gauges(&mut encoder, &all)?;
        self.encode_label_sets(&mut encoder)
    }
}

impl ClassCollector {
    /// Writes how many classes have label sets of their own and how many
    /// were folded under [`OTHER`].
    fn encode_label_sets(&self, encoder: &mut DescriptorEncoder) -> fmt::Result {
        for (name, help, value) in [
            (
                "wasmkeep_class_label_sets",
                "Classes with label sets of their own (at most metrics_classes_max).",
                self.0.label_sets() as u64,
            ),
            (
                "wasmkeep_class_label_sets_folded",
                "Deployed classes counted under class=\"_other\" because metrics_classes_max was reached.",
                self.0.folded_count.load(Ordering::Relaxed),
            ),
        ] {
            encoder
                .encode_descriptor(name, help, None, MetricType::Gauge)?
                .encode_gauge(&value)?;
        }
        Ok(())
    }
}

/// The labels of a class's series: tenant, app and class.
fn class_labels(k: &ClassKey) -> Vec<(&'static str, String)> {
    vec![
        ("tenant", k.0.clone()),
        ("app", k.1.clone()),
        ("class", k.2.clone()),
    ]
}

/// Writes the counters every class has one of: requests and alarm runs.
fn encode_counters(
    encoder: &mut DescriptorEncoder,
    all: &[(ClassKey, Arc<ClassMetrics>)],
) -> fmt::Result {
    type Counted = fn(&ClassMetrics) -> u64;
    let counters: [(&str, &str, Counted); 6] = [
        (
            "wasmkeep_class_requests",
            "Requests that reached a deployed class.",
            |m| m.requests.get(),
        ),
        (
            "wasmkeep_class_messages",
            "Actor messages the class's actors handled (applied or refused).",
            |m| m.messages.get(),
        ),
        (
            "wasmkeep_class_socket_events",
            "WebSocket messages and closes the class's actors handled.",
            |m| m.socket_events.get(),
        ),
        (
            "wasmkeep_class_alarm_runs",
            "Alarm handler runs that committed.",
            |m| m.alarm_runs_ok.get(),
        ),
        (
            "wasmkeep_class_alarm_failures",
            "Alarm handler runs that failed (and were rescheduled or dropped).",
            |m| m.alarm_runs_failed.get(),
        ),
        (
            "wasmkeep_class_alarm_retries",
            "Alarm handler runs that retried a failed run.",
            |m| m.alarm_retries.get(),
        ),
    ];
    for (name, help, get) in counters {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (k, m) in all {
            let set = class_labels(k);
            family
                .encode_family(&set)?
                .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&get(m), None)?;
        }
    }
    Ok(())
}

/// Writes the failed requests of every class, by error code.
fn encode_errors(
    encoder: &mut DescriptorEncoder,
    all: &[(ClassKey, Arc<ClassMetrics>)],
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(
        "wasmkeep_class_request_errors",
        "Requests a deployed class failed or the node refused for it, by error code.",
        None,
        MetricType::Counter,
    )?;
    for (k, m) in all {
        let errors = m.errors.lock().clone();
        for (code, n) in errors {
            let mut set = class_labels(k);
            set.push(("code", code));
            family
                .encode_family(&set)?
                .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&n, None)?;
        }
    }
    Ok(())
}

/// Writes every class's histogram of alarm lateness.
fn encode_lateness(
    encoder: &mut DescriptorEncoder,
    all: &[(ClassKey, Arc<ClassMetrics>)],
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(
        "wasmkeep_class_alarm_lateness",
        "How late alarm runs started after their due time.",
        Some(&Unit::Seconds),
        MetricType::Histogram,
    )?;
    for (k, m) in all {
        let set = class_labels(k);
        m.alarm_lateness.encode(family.encode_family(&set)?)?;
    }
    Ok(())
}

/// Writes the census gauges of every class: database bytes and actors.
fn encode_gauges(
    encoder: &mut DescriptorEncoder,
    all: &[(ClassKey, Arc<ClassMetrics>)],
) -> fmt::Result {
    type Gauged = fn(&ClassMetrics) -> u64;
    let gauges: [(&str, &str, Option<Unit>, Gauged); 2] = [
        (
            "wasmkeep_class_database",
            "Bytes of the class's actors' database files on this node, at the last census (metrics_census_ms).",
            Some(Unit::Bytes),
            |m| m.database_bytes.get(),
        ),
        (
            "wasmkeep_class_actors",
            "The class's actors on this node's disk, at the last census.",
            None,
            |m| m.actors.get(),
        ),
    ];
    for (name, help, unit, get) in gauges {
        let mut family = encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
        for (k, m) in all {
            let set = class_labels(k);
            family.encode_family(&set)?.encode_gauge(&get(m))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(t: &str, a: &str, c: &str) -> ActorId {
        ActorId::new(t, a, c, "n").unwrap()
    }

    #[test]
    fn classes_past_the_cap_count_under_other_and_unknown_classes_nowhere() {
        let r = ClassMetricsRegistry::new(2);
        r.register("t", "a", "one");
        r.register("t", "a", "two");
        r.register("t", "a", "three");
        r.register("t", "a", "three");
        r.of(&id("t", "a", "one")).unwrap().requests.inc();
        r.of(&id("t", "a", "three")).unwrap().requests.inc();
        r.of(&id("t", "a", "three")).unwrap().error("guest_error");
        assert!(r.of(&id("t", "a", "typo")).is_none());
        assert_eq!(r.label_sets(), 2);
        assert_eq!(r.folded_count.load(Ordering::Relaxed), 1);
        assert_eq!(r.other.requests.get(), 1);
        assert_eq!(r.other.errors_of("guest_error"), 1);

        let mut text = String::new();
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register_collector(Box::new(ClassCollector(Arc::new(r))));
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        let requests: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("wasmkeep_class_requests_total{"))
            .collect();
        assert_eq!(requests.len(), 3, "two classes and _other:\n{text}");
        assert!(text.contains(
            "wasmkeep_class_requests_total{tenant=\"_other\",app=\"_other\",class=\"_other\"} 1"
        ));
        assert!(text.contains("wasmkeep_class_request_errors_total{tenant=\"_other\",app=\"_other\",class=\"_other\",code=\"guest_error\"} 1"));
        assert!(text.contains("wasmkeep_class_label_sets_folded 1"));
    }

    #[test]
    fn a_census_of_an_undeployed_class_counts_under_other() {
        let r = ClassMetricsRegistry::new(10);
        r.register("t", "a", "c");
        let mut census = HashMap::new();
        census.insert(("t".into(), "a".into(), "c".into()), (4096, 2));
        census.insert(("t".into(), "gone".into(), "c".into()), (100, 1));
        r.set_census(&census);
        let c = r.of(&id("t", "a", "c")).unwrap();
        assert_eq!((c.database_bytes.get(), c.actors.get()), (4096, 2));
        assert_eq!(
            (r.other.database_bytes.get(), r.other.actors.get()),
            (100, 1)
        );
    }
}
