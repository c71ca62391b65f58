//! The simulation's acceptance tests: ADR 0009's rules hold over 200 seeds,
//! each unsafe variant is caught within its stated budget, and a seed names
//! one trace.

use wasmkeep_cluster::Variant;
use wasmkeep_sim::{Options, run, run_seeds};

#[test]
fn the_rules_hold_over_200_seeds() {
    let batch = run_seeds(&Options::default(), 0, 200, false);
    assert!(batch.failures.is_empty(), "{:?}", batch.failures);
    let s = &batch.stats;
    // The faults the rules are meant to survive happen, or this test could
    // not fail: takeovers, fences of both kinds, late uploads and deletes,
    // owners that found nothing, committed retries, joins.
    assert!(s.takeovers > 1_000, "{s}");
    assert!(s.alarms > 1_000, "{s}");
    assert!(s.node_fences > 0 && s.fenced_nodes > 0, "{s}");
    assert!(s.owner_fences > 0, "{s}");
    assert!(
        s.late_uploads_landed > 0 && s.late_deletes_landed > 0,
        "{s}"
    );
    assert!(s.left_on_empty_bucket > 0 && s.aimed_join_faults > 0, "{s}");
    assert!(
        s.alarm_failures > 0 && s.joins > 0 && s.stale_deleted > 0,
        "{s}"
    );
    assert!(s.checks > 200 * 10_000, "{s}");
}

#[test]
fn the_same_seed_gives_the_same_trace() {
    let a = run(Options {
        seed: 7,
        trace: true,
        ..Options::default()
    });
    let b = run(Options {
        seed: 7,
        trace: true,
        ..Options::default()
    });
    assert!(a.trace.len() > 100);
    assert_eq!(a.trace, b.trace);
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.stats, b.stats);
    let c = run(Options {
        seed: 8,
        trace: true,
        ..Options::default()
    });
    assert_ne!(a.trace_hash, c.trace_hash);
}

#[test]
fn the_rules_keep_every_entry_under_the_fault_aimed_at_first_uploads() {
    // Every joining node's first upload is delayed at the bucket and the node
    // cut off: the case where clearing on an empty bucket loses an entry.
    let base = Options {
        p_aim_join: 1.0,
        ..Options::default()
    };
    let batch = run_seeds(&base, 1_000, 60, false);
    assert!(batch.failures.is_empty(), "{:?}", batch.failures);
    assert!(batch.stats.left_on_empty_bucket > 0, "{}", batch.stats);
}

/// Hunts from seed 0 and returns the first seed that breaks the named-entry
/// invariant; fails if none does within `budget`.
fn caught_within(variant: Variant, budget: u64) -> u64 {
    let batch = run_seeds(
        &Options {
            variant,
            ..Options::default()
        },
        0,
        budget,
        true,
    );
    let Some((seed, v)) = batch.failures.first() else {
        panic!("{} not caught within {budget} seeds", variant.name());
    };
    assert_eq!(
        v.kind,
        "missing-entry",
        "{} seed {seed}: {v:?}",
        variant.name()
    );
    *seed
}

#[test]
fn untagged_keys_are_caught_within_20_seeds() {
    caught_within(Variant::UntaggedKeys, 20);
}

#[test]
fn no_fence_is_caught_within_20_seeds() {
    caught_within(Variant::NoFence, 20);
}

#[test]
fn no_generation_check_is_caught_within_20_seeds() {
    // The race needs a newer owner to re-arm the very time an older, stalled
    // owner is cleaning: the aimed re-arm (`p_aim_rearm`) sends it
    // (docs/simulation.md).
    caught_within(Variant::NoGenerationCheck, 20);
}

#[test]
fn upload_before_entry_is_caught_within_2000_seeds() {
    caught_within(Variant::UploadBeforeEntry, 2_000);
}

#[test]
fn clear_on_empty_bucket_is_caught_within_2000_seeds() {
    caught_within(Variant::ClearOnEmptyBucket, 2_000);
}
