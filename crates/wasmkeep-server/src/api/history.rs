//! The node's last hour, for the console's overview charts (issue 39):
//! every [`HISTORY_SAMPLE_MS`] a task reads the node's own metrics
//! exposition and keeps the figures the charts need, at most
//! [`HISTORY_SAMPLES_MAX`] of them (an hour). `GET /admin/v1/node/history`
//! answers, per interval between two samples, requests per second, the
//! error rate, the event duration's p50 and p99, alarm lateness p99,
//! upload lag p99 and (in a cluster) the sweep's lag. With `?cluster=true`
//! a cluster node adds every other live node's own answer (`others`, each
//! asked within `CLUSTER_ASK_TIMEOUT_MS`; one that does not answer is
//! listed with `points: null`).
//!
//! Quantiles come from the histograms' bucket counts gained in the
//! interval, so a figure is the upper bound of the bucket the quantile
//! fell in (what a Prometheus `histogram_quantile` without interpolation
//! would say).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;

/// How often the node samples its metrics for the history.
pub const HISTORY_SAMPLE_MS: u64 = 10_000;
/// Samples kept: an hour at one per [`HISTORY_SAMPLE_MS`].
pub const HISTORY_SAMPLES_MAX: usize = 360;

/// A histogram's cumulative bucket counts, by upper bound (seconds), in
/// ascending order; the last bound is infinity.
type Buckets = Vec<(f64, f64)>;

#[derive(Debug, Clone, Default)]
struct Sample {
    at_ms: u64,
    requests: f64,
    errors: f64,
    event: Buckets,
    lateness: Buckets,
    upload_lag: Buckets,
    sweep_lag_ms: Option<f64>,
    alarms_pending: f64,
    outbox_pending: f64,
    instances_active: f64,
}

/// The kept samples, oldest first.
#[derive(Default)]
pub(crate) struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    fn push(&self, s: Sample) {
        let mut q = self.samples.lock().expect("history");
        if q.len() >= HISTORY_SAMPLES_MAX {
            q.pop_front();
        }
        q.push_back(s);
    }
}

/// Starts the sampling task (when a tokio runtime runs this); it ends
/// when the node's routes are gone or its runtime stops.
pub(super) fn start(s: &AppState) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let history: Weak<History> = Arc::downgrade(&s.history);
    let rt = s.rt.clone();
    let cluster = s.config.cluster.clone();
    handle.spawn(async move {
        loop {
            let Some(h) = history.upgrade() else { return };
            if rt.is_stopping() {
                return;
            }
            if let Ok(text) = super::exposition(rt.metrics(), cluster.as_deref(), false) {
                h.push(sample(&text, crate::cluster::now_ms()));
            }
            drop(h);
            tokio::time::sleep(Duration::from_millis(HISTORY_SAMPLE_MS)).await;
        }
    });
}

/// The figures of one exposition.
fn sample(text: &str, at_ms: u64) -> Sample {
    let mut s = Sample {
        at_ms,
        ..Sample::default()
    };
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        match name {
            "wasmkeep_requests_total" => s.requests += value,
            "wasmkeep_request_errors_total" => s.errors += value,
            "wasmkeep_alarms_pending" => s.alarms_pending += value,
            "wasmkeep_outbox_pending" => s.outbox_pending += value,
            "wasmkeep_instances_active" => s.instances_active += value,
            "wasmkeep_alarm_sweep_lag_ms" => {
                s.sweep_lag_ms = Some(s.sweep_lag_ms.unwrap_or(0.0).max(value));
            }
            "wasmkeep_event_seconds_bucket" => add_bucket(&mut s.event, labels, value),
            "wasmkeep_alarm_lateness_seconds_bucket" => add_bucket(&mut s.lateness, labels, value),
            "wasmkeep_replica_lag_seconds_bucket" => add_bucket(&mut s.upload_lag, labels, value),
            _ => {}
        }
    }
    s
}

/// Adds a bucket line (`le="…"` among `labels`) to `b`, summed over the
/// other labels.
fn add_bucket(b: &mut Buckets, labels: &str, value: f64) {
    let Some(le) = labels
        .split(',')
        .find_map(|l| l.trim().strip_prefix("le=\""))
        .map(|l| l.trim_end_matches('"'))
    else {
        return;
    };
    let le = if le == "+Inf" {
        f64::INFINITY
    } else {
        match le.parse::<f64>() {
            Ok(v) => v,
            Err(_) => return,
        }
    };
    match b.iter_mut().find(|(l, _)| *l == le) {
        Some((_, n)) => *n += value,
        None => {
            b.push((le, value));
            b.sort_by(|x, y| x.0.total_cmp(&y.0));
        }
    }
}

/// The `q` quantile, in ms, of what `after` gained over `before`: the
/// upper bound of the bucket it fell in; `None` without observations (or
/// in the unbounded bucket).
fn quantile_ms(before: &Buckets, after: &Buckets, q: f64) -> Option<f64> {
    let count = |b: &Buckets, le: f64| b.iter().find(|(l, _)| *l == le).map_or(0.0, |(_, n)| *n);
    let total = count(after, f64::INFINITY) - count(before, f64::INFINITY);
    if total <= 0.0 {
        return None;
    }
    after
        .iter()
        .find(|(le, n)| n - count(before, *le) >= q * total)
        .and_then(|(le, _)| le.is_finite().then_some(le * 1000.0))
}

#[derive(serde::Deserialize)]
pub(super) struct HistoryQuery {
    #[serde(default)]
    cluster: bool,
}

/// `GET /admin/v1/node/history[?cluster=true]`.
pub(super) async fn history_route(
    State(s): State<AppState>,
    Query(q): Query<HistoryQuery>,
) -> Result<Response, crate::error::ApiError> {
    let mut answer = own_history(&s);
    if let (Some(c), true) = (&s.config.cluster, q.cluster) {
        answer["node"] = json!(c.node());
        let path = format!("{}/node/history", super::ADMIN_PREFIX);
        let others: Vec<_> = super::fanout::ask_others(c, &path)
            .await?
            .into_iter()
            .map(|(node, theirs)| match theirs {
                Some(v) => json!({ "node": node, "points": v["points"], "now": v["now"] }),
                None => json!({ "node": node, "points": null, "now": null }),
            })
            .collect();
        answer["others"] = json!(others);
    }
    Ok(axum::Json(answer).into_response())
}

/// This node's history, as `history_route` answers it.
fn own_history(s: &AppState) -> serde_json::Value {
    let samples: Vec<Sample> = s
        .history
        .samples
        .lock()
        .expect("history")
        .iter()
        .cloned()
        .collect();
    let points: Vec<_> = samples
        .windows(2)
        .map(|w| {
            let (a, b) = (&w[0], &w[1]);
            let secs = (b.at_ms.saturating_sub(a.at_ms) as f64 / 1000.0).max(0.001);
            let requests = (b.requests - a.requests).max(0.0);
            let errors = (b.errors - a.errors).max(0.0);
            json!({
                "at_ms": b.at_ms,
                "requests_per_s": requests / secs,
                "error_rate": if requests > 0.0 { errors / requests } else { 0.0 },
                "event_p50_ms": quantile_ms(&a.event, &b.event, 0.5),
                "event_p99_ms": quantile_ms(&a.event, &b.event, 0.99),
                "alarm_lateness_p99_ms": quantile_ms(&a.lateness, &b.lateness, 0.99),
                "upload_lag_p99_ms": quantile_ms(&a.upload_lag, &b.upload_lag, 0.99),
                "sweep_lag_ms": b.sweep_lag_ms,
            })
        })
        .collect();
    let now = samples.last().map(|l| {
        json!({
            "at_ms": l.at_ms,
            "alarms_pending": l.alarms_pending,
            "outbox_pending": l.outbox_pending,
            "instances_active": l.instances_active,
        })
    });
    json!({
        "sample_ms": HISTORY_SAMPLE_MS,
        "samples_max": HISTORY_SAMPLES_MAX,
        "points": points,
        "now": now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "# TYPE wasmkeep_event_seconds histogram\n\
wasmkeep_event_seconds_bucket{le=\"0.001\"} 0\n\
wasmkeep_event_seconds_bucket{le=\"0.01\"} 0\n\
wasmkeep_event_seconds_bucket{le=\"+Inf\"} 0\n\
wasmkeep_requests_total 10\n\
wasmkeep_request_errors_total{code=\"x\"} 1\n";

    const AFTER: &str = "wasmkeep_event_seconds_bucket{le=\"0.001\"} 90\n\
wasmkeep_event_seconds_bucket{le=\"0.01\"} 99\n\
wasmkeep_event_seconds_bucket{le=\"+Inf\"} 100\n\
wasmkeep_requests_total 110\n\
wasmkeep_request_errors_total{code=\"x\"} 3\n\
wasmkeep_request_errors_total{code=\"y\"} 3\n";

    #[test]
    fn quantiles_come_from_what_the_buckets_gained() {
        let a = sample(BEFORE, 0);
        let b = sample(AFTER, 10_000);
        assert_eq!(b.requests - a.requests, 100.0);
        assert_eq!(b.errors - a.errors, 5.0);
        assert_eq!(quantile_ms(&a.event, &b.event, 0.5), Some(1.0));
        assert_eq!(quantile_ms(&a.event, &b.event, 0.99), Some(10.0));
        // The last observation is in the unbounded bucket: no figure.
        assert_eq!(quantile_ms(&a.event, &b.event, 1.0), None);
        assert_eq!(quantile_ms(&b.event, &b.event, 0.5), None);
    }

    #[test]
    fn the_history_keeps_an_hour() {
        let h = History::default();
        for i in 0..(HISTORY_SAMPLES_MAX as u64 + 5) {
            h.push(Sample {
                at_ms: i,
                ..Sample::default()
            });
        }
        let q = h.samples.lock().unwrap();
        assert_eq!(q.len(), HISTORY_SAMPLES_MAX);
        assert_eq!(q.front().unwrap().at_ms, 5);
    }
}
