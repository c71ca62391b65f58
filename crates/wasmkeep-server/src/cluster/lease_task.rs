//! The task that keeps this node's lease: a driver of
//! [`NodeLeaseMachine`], in the shape the machine module documents (poll
//! effects, perform them, feed the answers back, sleep until the machine's
//! timeout), with the real bucket and the wall clock.
//!
//! One machine per epoch. While a bucket operation is in flight the task
//! still wakes at the machine's timeout, so that a renewal that hangs ends
//! the epoch at the acting deadline, not when the bucket answers.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use wasmkeep_cluster::machine::{BucketResult, EpochEnd, LeaseEffect, NodeLeaseMachine};

use super::bucket::BucketDriver;
use super::identity::NodeIdentity;
use super::{ClusterSettings, ClusterState, nonce, now_ms};

type InFlight = Pin<Box<dyn Future<Output = BucketResult> + Send>>;

/// Runs epochs until the node releases its lease.
pub(super) async fn run(
    mut identity: NodeIdentity,
    settings: ClusterSettings,
    driver: BucketDriver,
    state: Arc<ClusterState>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let epoch = identity.epoch();
        state.epoch.store(epoch, Ordering::Release);
        state.lease_counter_plus_1.store(0, Ordering::Release);
        state.metrics.epochs_total.inc();
        let machine = NodeLeaseMachine::new(
            identity.node(),
            epoch,
            &settings.advertise,
            settings.protocol.clone(),
        );
        let Ok(mut machine) = machine else {
            // Checked by ClusterNode::start; only a bug gets here.
            debug_assert!(false, "a lease machine for a checked identity");
            return;
        };
        let end = drive_epoch(&mut machine, &driver, &state, &mut stop).await;
        state.acting_until_ms.store(0, Ordering::Release);
        match end {
            EpochEnd::Released => {
                tracing::info!(epoch, "released this node's lease");
                return;
            }
            EpochEnd::Lapsed => {
                state.metrics.lapsed_total.inc();
                tracing::warn!(epoch, "lease lapsed: stopped acting; starting a new epoch");
            }
            EpochEnd::Fenced => {
                state.metrics.fenced_total.inc();
                tracing::warn!(
                    epoch,
                    "lease fenced by another node: stopped acting; starting a new epoch"
                );
            }
        }
        if !next_epoch(&mut identity, &settings, &mut stop).await {
            return;
        }
    }
}

/// Persists the next epoch, retrying while the data directory fails; false
/// if the node stops meanwhile.
async fn next_epoch(
    identity: &mut NodeIdentity,
    settings: &ClusterSettings,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> bool {
    loop {
        if *stop.borrow() {
            return false;
        }
        // A few small writes and fsyncs, off the async threads; the node
        // does not act meanwhile.
        let mut id = std::mem::replace(identity, NodeIdentity::placeholder());
        let (id, result) = match tokio::task::spawn_blocking(move || {
            let r = id.next_epoch();
            (id, r)
        })
        .await
        {
            Ok(done) => done,
            Err(e) => {
                tracing::error!(error = %e, "the epoch writer panicked; the lease stops");
                return false;
            }
        };
        *identity = id;
        match result {
            Ok(_) => return true,
            Err(e) => tracing::error!(error = %e, "could not take a new epoch; retrying"),
        }
        let retry = Duration::from_millis(settings.protocol.lease_register_retry_ms);
        tokio::select! {
            _ = tokio::time::sleep(retry) => {}
            _ = stop.changed() => return false,
        }
    }
}

/// Drives one epoch's machine until its epoch ends.
async fn drive_epoch(
    m: &mut NodeLeaseMachine,
    driver: &BucketDriver,
    state: &ClusterState,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> EpochEnd {
    let mut in_flight: Option<InFlight> = None;
    let mut releasing = false;
    // The stop channel closed without a stop (the node handle dropped):
    // release as for a stop, rather than wake on it forever.
    let mut stop_closed = false;
    loop {
        while let Some(effect) = m.poll_effect(now_ms()) {
            match effect {
                LeaseEffect::Bucket(op) => {
                    let driver = driver.clone();
                    in_flight = Some(Box::pin(async move { driver.perform(op).await }));
                }
                LeaseEffect::Detached(op) => {
                    // An old record two counters back: garbage, deleted
                    // whenever; each delete is bounded by the driver's timeout.
                    let driver = driver.clone();
                    tokio::spawn(async move { driver.perform(op).await });
                }
                LeaseEffect::Renewed {
                    counter,
                    acting_until_ms,
                } => {
                    state.metrics.renewals_total.inc();
                    state
                        .lease_counter_plus_1
                        .store(counter + 1, Ordering::Release);
                    if !releasing && m.is_acting(now_ms()) {
                        state
                            .acting_until_ms
                            .store(acting_until_ms, Ordering::Release);
                    }
                    tracing::debug!(counter, acting_until_ms, "lease renewed");
                }
                LeaseEffect::EpochOver(end) => {
                    state.acting_until_ms.store(0, Ordering::Release);
                    return end;
                }
            }
        }
        if !releasing && (stop_closed || *stop.borrow()) {
            releasing = true;
            state.acting_until_ms.store(0, Ordering::Release);
            m.release(now_ms(), nonce());
            continue;
        }
        let wake = m.poll_timeout().map(|at| {
            let wait = Duration::from_millis(at.saturating_sub(now_ms()));
            tokio::time::Instant::now() + wait
        });
        if in_flight.is_none() && wake.is_none() && releasing {
            // Nothing left to wait for; the machine is over or idle.
            return EpochEnd::Released;
        }
        tokio::select! {
            result = async { in_flight.as_mut().expect("guarded").await }, if in_flight.is_some() => {
                in_flight = None;
                m.on_result(result, now_ms());
            }
            _ = tokio::time::sleep_until(wake.unwrap_or_else(far_future)), if wake.is_some() => {
                m.handle_timeout(now_ms(), nonce());
            }
            changed = stop.changed(), if !releasing => stop_closed = changed.is_err(),
        }
    }
}

fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400)
}
