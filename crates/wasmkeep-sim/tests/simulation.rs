//! The simulation's acceptance tests: ADR 0009's rules hold over 200 seeds,
//! each unsafe variant is caught within its stated budget, the sweep's caps
//! bind (the defaults too, over a large backlog), apps with the same names
//! keep their alarms apart, and a seed names one trace.

use wasmkeep_cluster::{ClusterConfig, Variant};
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
    // Deletes, by clients and by `on-alarm`, entries delivered for actors
    // with no state afterwards (nothing ran), and deleted actors a client
    // created again.
    assert!(s.deletes > 100 && s.alarm_deletes > 0, "{s}");
    assert!(s.no_state_deliveries > 50 && s.recreated > 0, "{s}");
    // Listings that lag and come in pages, and caps that bind.
    assert!(s.lagged_seeds > 0 && s.listing_missed > 0, "{s}");
    assert!(s.small_page_seeds > 0 && s.continued_listings > 0, "{s}");
    assert!(s.sweep_pages > s.sweep_passes, "{s}");
    assert!(s.small_cap_seeds > 0 && s.backlog_actors > 0, "{s}");
    assert!(s.orphan_entries > 0, "{s}");
    assert!(s.entries_cap_bound > 0, "{s}");
    assert!(s.deliveries_cap_bound > 0, "{s}");
    println!(
        "200 seeds: entries_cap_bound={} deliveries_cap_bound={} sweep_passes={} \
         small_cap_seeds={} deletes={} no_state_deliveries={} listing_missed={}",
        s.entries_cap_bound,
        s.deliveries_cap_bound,
        s.sweep_passes,
        s.small_cap_seeds,
        s.deletes,
        s.no_state_deliveries,
        s.listing_missed
    );
}

#[test]
fn the_default_caps_bind_over_a_large_backlog() {
    // 2,200 overdue idle actors in one app: more than one pass of 2,048
    // entries, and far more than 256 deliveries per node. Handlers are short,
    // since a simulated node runs one event at a time (the server runs
    // actors in parallel).
    let defaults = ClusterConfig::default();
    let base = Options {
        apps: 1,
        backlog: Some(2_200),
        orphans: Some(0),
        page_keys: Some(defaults.list_page_keys_max),
        sweep_entries_max: Some(defaults.sweep_entries_max),
        sweep_deliveries_max: Some(defaults.sweep_deliveries_max),
        handler_ms: (1, 100),
        ..Options::default()
    };
    let batch = run_seeds(&base, 0, 3, false);
    assert!(batch.failures.is_empty(), "{:?}", batch.failures);
    let s = &batch.stats;
    assert_eq!(s.backlog_actors, 3 * 2_200, "{s}");
    assert!(s.alarms > s.backlog_actors, "{s}");
    assert!(s.entries_cap_bound > 0, "{s}");
    assert!(s.deliveries_cap_bound > 0, "{s}");
    println!(
        "default caps, 3 seeds: entries_cap_bound={} deliveries_cap_bound={} sweep_passes={}",
        s.entries_cap_bound, s.deliveries_cap_bound, s.sweep_passes
    );
}

#[test]
fn apps_that_share_the_tenant_wide_index_are_caught() {
    // Two apps with the same class and actor names listing under one
    // prefix (the layout before ADR 0022): one app's sweep finds the other's
    // entries under the same address. The app-isolation invariant must say
    // so, or it could not fail; with an index per app (every other test) it
    // holds.
    let base = Options {
        shared_index: true,
        ..Options::default()
    };
    let batch = run_seeds(&base, 0, 5, false);
    assert_eq!(batch.failures.len(), 5, "{:?}", batch.failures);
    for (seed, v) in &batch.failures {
        assert!(
            ["cross-app-alarm", "cross-app-delete"].contains(&v.kind),
            "seed {seed}: {v:?}"
        );
    }
    // One app alone is fine under the tenant-wide prefix.
    let one = run_seeds(
        &Options {
            apps: 1,
            ..base.clone()
        },
        0,
        5,
        false,
    );
    assert!(one.failures.is_empty(), "{:?}", one.failures);
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
    assert_eq!(a.profile, b.profile);
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

/// Hunts from seed 0 and returns the first seed that breaks an invariant,
/// checking that it is one of `kinds`; fails if none does within `budget`.
fn caught_within(variant: Variant, budget: u64, kinds: &[&str]) -> u64 {
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
    assert!(
        kinds.contains(&v.kind),
        "{} seed {seed}: {v:?}",
        variant.name()
    );
    *seed
}

#[test]
fn untagged_keys_are_caught_within_20_seeds() {
    caught_within(Variant::UntaggedKeys, 20, &["missing-entry"]);
}

/// Nodes that leave cleanly (release what they hold first) leave fewer
/// stale owners behind than crashes: the race is caught in 6.5% of seeds
/// (13 of 0..199, first in seed 7), 10.5% without leaves.
#[test]
fn no_fence_is_caught_within_40_seeds() {
    caught_within(Variant::NoFence, 40, &["missing-entry"]);
}

/// Without leaves (`leave_every_ms = 0` replays the runs from before they
/// were modelled) the budget stays 20 (first in seed 6).
#[test]
fn no_fence_is_caught_within_20_seeds_without_leaves() {
    let found = run_seeds(
        &Options {
            variant: Variant::NoFence,
            leave_every_ms: 0,
            ..Options::default()
        },
        0,
        20,
        true,
    );
    assert!(
        !found.failures.is_empty(),
        "no-fence not caught within 20 seeds without leaves"
    );
}

#[test]
fn no_generation_check_is_caught_within_20_seeds() {
    // The race needs a newer owner to re-arm the very time an older, stalled
    // owner is cleaning: the aimed re-arm (`p_aim_rearm`) sends it
    // (docs/simulation.md).
    caught_within(Variant::NoGenerationCheck, 20, &["missing-entry"]);
}

#[test]
fn upload_before_entry_is_caught_within_2000_seeds() {
    caught_within(Variant::UploadBeforeEntry, 2_000, &["missing-entry"]);
}

#[test]
fn clear_on_empty_bucket_is_caught_within_2000_seeds() {
    caught_within(Variant::ClearOnEmptyBucket, 2_000, &["missing-entry"]);
}

#[test]
fn run_without_state_is_caught_within_20_seeds() {
    // An entry delivered for an actor with no state runs `on-alarm`: an
    // alarm of a deleted actor runs and brings it back (`deleted-actor-ran`),
    // or a delivery creates an actor the bucket never had
    // (`created-by-alarm`: a joining node's entry before its first upload).
    let kinds = ["deleted-actor-ran", "created-by-alarm"];
    caught_within(Variant::RunWithoutState, 20, &kinds);
    // The deleted actor's case itself is reached within the same budget.
    let all = run_seeds(
        &Options {
            variant: Variant::RunWithoutState,
            ..Options::default()
        },
        0,
        20,
        false,
    );
    assert!(
        all.failures
            .iter()
            .any(|(_, v)| v.kind == "deleted-actor-ran"),
        "{:?}",
        all.failures
    );
    // Without deletes no seed breaks it that way: those catches come from
    // the deletes, not from a check that fires on its own.
    let none = run_seeds(
        &Options {
            variant: Variant::RunWithoutState,
            p_delete: 0.0,
            p_alarm_delete: 0.0,
            ..Options::default()
        },
        0,
        20,
        false,
    );
    assert!(
        none.failures
            .iter()
            .all(|(_, v)| v.kind != "deleted-actor-ran"),
        "{:?}",
        none.failures
    );
}
