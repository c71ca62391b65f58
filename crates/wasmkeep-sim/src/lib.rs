//! A deterministic simulation of wasmkeep's cluster protocol.
//!
//! It runs nodes on leases over a simulated bucket (create-only writes,
//! ordered listings, deletes without preconditions) and a network that
//! delays, loses and fails requests, crashes, cuts off and stalls nodes, and
//! checks ADR 0009's invariant every 50 ms of simulated time: a committed
//! alarm's named entry exists in the bucket. Every decision the nodes take is
//! made by `wasmkeep-cluster`, the code the server runs; the unsafe variants
//! are switched on in that code, not reimplemented here.
//!
//! What it is not: a model of SQLite, of wasm guests, of HTTP, or of a real
//! object store's latency; it does not measure performance. It uses no
//! threads, no wall clock and no dependency besides `wasmkeep-cluster`: one
//! seed gives one trace (ADR 0023).

#![forbid(unsafe_code)]

pub mod node;
pub mod rng;
pub mod sim;
pub mod world;

pub use sim::{Batch, Options, Report, Stats, Violation, run, run_seeds};
