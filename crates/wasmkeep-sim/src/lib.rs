//! A deterministic simulation of wasmkeep's cluster protocol.
//!
//! It runs nodes on leases over a simulated bucket (create-only writes,
//! ordered listings in pages, deletes without preconditions) and a network
//! that delays, loses and fails requests, crashes, cuts off and stalls nodes,
//! and checks ADR 0009's invariants (below). Every decision the nodes take
//! is made by `wasmkeep-cluster`, the code the server runs; the unsafe
//! variants are switched on in that code, not reimplemented here.
//!
//! It uses no threads, no wall clock and no dependency besides
//! `wasmkeep-cluster`: one seed gives one trace (ADR 0023).
//!
//! # What is modelled
//!
//! - **Nodes**: 3 from the start (`--set nodes=N`) and 1 or 2 that join later with actors from
//!   their own data (R4), on node leases and actor holds driven through
//!   `wasmkeep_cluster::machine` (ADR 0020); crashes (also at every step
//!   boundary of the owner's rules), clean leaves (a node releases its
//!   actors, then its lease, and starts again), cut-offs, stalls, clocks
//!   falling behind,
//!   and the aimed faults of `Options` (`p_aim_*`; `p_aim_new_entry` holds an
//!   upload that names a new entry already due, the race `owner_fence`
//!   closes).
//! - **Apps**: two apps of tenant `t1` (`Options::apps`) with the same class
//!   and actor names (`room/a0` to `room/a2`, the backlog's `room/b<i>`),
//!   addressed tenant/app/class/name. Each app's actors live under
//!   `state/t1/<app>/` and its index below the app's root, where
//!   `wasmkeep_cluster::alarm_index::app_index_prefix` puts it (ADR 0022's
//!   layout); the prefix is a parameter of the cluster crate's functions,
//!   and each node sweeps each app's index with a cursor of its own. Six actors from the start, three per app (`Options::actors` counts all apps): per actor,
//!   about the traffic of the five of one app before.
//! - **Actors and deletes**: clients set, clear and re-arm alarms, and delete
//!   actors (`p_delete`); `on-alarm` fails (committed retries), reschedules,
//!   clears, or deletes its own actor (`p_alarm_delete`). A delete replicates
//!   a tombstone (no alarm, no `on-init`) and then removes the entry the
//!   previous state named (R2, as for a cleared alarm); a later client request
//!   creates the actor again. An entry delivered for an actor with no state is
//!   removed without running anything (`wasmkeep_cluster::delivery`).
//! - **Listings**: a LIST answers one page at most (`list_page_keys_max`: S3's
//!   1,000, or 100, or 10 to 40 keys, per seed); every reader continues with
//!   `start_after`. A listing of an alarm index may miss an entry written up
//!   to the seed's listing lag before (none, or 0.1 to 3 s): the sweep and the
//!   stale-entry cleanup read through it.
//! - **Caps**: a quarter of the seeds start with a backlog of 60 to 160
//!   overdue idle actors per app and entries of a class no node serves (a
//!   pass's worth and a few more, ahead of every live entry in key order),
//!   with small caps (`sweep_entries_max` 16 to 48, `sweep_deliveries_max` 4
//!   to 12), so both caps bind and only the sweep's cursor gets past the
//!   entries nobody can act on (a sweep that loses its cursor is caught). `the_default_caps_bind_over_a_large_backlog` binds the defaults
//!   (2,048 and 256) with 2,200 actors in three seeds. The summary counts how
//!   often each cap bound (`entries_cap_bound`, `deliveries_cap_bound`).
//! - **Per seed** ([`Profile`]): the listing lag, the page size, the backlog,
//!   the orphan entries and the caps are drawn from the seed (each can be
//!   fixed with `--set`).
//!
//! # Invariants
//!
//! - `missing-entry`: every 50 ms, a committed alarm's named entry exists in
//!   its app's index (checked for the actors whose chain or index changed).
//! - `early-delivery`: `on-alarm` never runs before its time (true time).
//! - `deleted-actor-ran`, `created-by-alarm`: as each chain entry lands, one
//!   written by an `on-alarm` run follows a state that had state; an alarm of a
//!   deleted actor never runs and no alarm delivery creates an actor.
//! - `cross-app-alarm`, `cross-app-delete`: a sweep offers an entry only to an
//!   actor of the app that wrote it, and a cleanup removes only entries of its
//!   own app (both caught when apps share the tenant-wide prefix,
//!   `Options::shared_index`).
//! - `undelivered`, `entry-left`: once faults stop, every committed alarm is
//!   delivered, and every overdue entry is delivered and, unless named,
//!   removed within the delivery bound (`retry_max` + 45 s + two sweeps +
//!   30 s), however listings are paged, capped or lagging; only an entry for
//!   an actor the bucket has nothing for, or of a class no node serves, may
//!   stay (ADR 0009).
//!
//! # What is not modelled
//!
//! exec-durable's mid-event index update; the tenant-wide index of before
//! ADR 0022 and its migration (entries are written and read in the app's
//! index only); nodes serving only some classes (the orphan entries are of a
//! class no node serves); the immediate retry of a PUT after a lost
//! response; snapshots and chain garbage collection (each chain entry is the
//! whole state, and a deleted actor's chain stays, ending in a tombstone);
//! recording `alarm_indexed` failing after its PUT (the ADR's one known
//! exception); clocks running ahead; clients retrying requests; listing lag
//! for holds, leases and chains (the ownership protocol relies on
//! read-after-write listings, as S3 gives since 2020), deleted keys lingering
//! in listings, and stale GETs. A simulated node runs one event at a time
//! unless the run is sparse or `workers` is set (the server runs actors in
//! parallel), so a backlog of thousands needs short handlers to drain within
//! a run. Below the protocol: SQLite, wasm guests,
//! HTTP, a real store's latency; it does not measure performance.
//!
//! # Scale and cost (issue 41)
//!
//! `--set nodes=N --set actors=M` sizes a run (`actors` over all apps). Above
//! `SPARSE_ACTORS_FROM` (1,000) actors a run is sparse: 2% of the actors
//! start with an alarm spread over the run, clients send one request per
//! node every 500 ms on average, each node its own stream (the load per node stays the same at any
//! size), and each node runs 16 workers (one piece of work per actor at a
//! time; the server runs many actors at once). Nodes crash, are cut off,
//! stall and join as in any run, and one in fifty more join while faults
//! last, and each node leaves cleanly about every `leave_every_ms` while
//! faults last (150 s; it releases its actors, then its lease, and starts
//! again). `wasmkeep-sim --seeds 1 --set nodes=100
//! --set actors=1000000` takes 30 to 55 s and 1.1 GB in a release build on
//! two cores, and says whether every prefix stayed within S3's rates
//! (`nodes/` comes closest, in the second after the faults stop: 1,465
//! reads with `--seeds 1`, which runs seed 0, against S3's 5,500; 4,780
//! before the sweep's helpers were bounded, ADR 0073).
//!
//! Every request a node sends is counted ([`cost`]): per node per second by
//! kind and by family of prefix (`nodes/`, the alarm indexes, the actors'
//! folders), in three windows (while faults last, the two minutes after,
//! then steady), the busiest second of each shared prefix and of any one
//! actor's folder against S3's documented rates, and how late alarms ran,
//! from sweeps (orphaned: nobody held the actor) and from owners' timers.
//! `tests/scale.rs` holds a node's rate flat from 10 to 100 nodes (while
//! faults last, the two minutes after, and steady) and shows the view
//! before ADR 0065 failing that (`view_reads_every_node`,
//! `take_reads_every_lease` keep it runnable), and alarms waiting for the
//! sweep's last resort without a holder's rule (`sweep_ignores_holds`, ADR
//! 0073).
//!
//! # A finding: entries nobody can act on can hold back deliveries
//!
//! The cursor gets a sweep past passes full of entries nobody can act on,
//! but within one pass `plan_sweep` takes a node's own entries in key order,
//! and an entry whose delivery does nothing (a class no node serves) is
//! never busy. When more than a deliveries cap of them fall in one node's
//! share of a pass that also holds live entries (the last pass over them,
//! where the live entries begin), those live entries are reached only
//! through other nodes' share for anyone's entries (an eighth of the cap,
//! from a random rotation; none when the cap is below 8): minutes late, past
//! the ADR's bounds, and again after every crash that empties a timer. With
//! the default caps, 1,600 such entries ahead of 600 overdue actors leave an
//! alarm undelivered past the bound in 5 of 10 seeds (`wasmkeep-sim --seeds
//! 10 --set apps=1 --set backlog=600 --set orphans=1600 --set
//! sweep_entries_max=2048 --set sweep_deliveries_max=256 --set
//! page_keys=1000 --set handler_ms_max=100`); 1,200 of them, or 2,100 (a
//! full pass, then a short one), leave none. The seeds of the test suite put
//! fewer than a deliveries cap of them in the pass where live entries begin.

#![forbid(unsafe_code)]

pub mod cost;
pub mod node;
pub mod rng;
pub mod sim;
pub mod world;

pub use sim::{Batch, Options, Profile, Report, Stats, Violation, run, run_seeds};
