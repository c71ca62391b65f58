//! The repository's guest components, built from `examples/` for
//! wasm32-wasip2 by this crate's build script and embedded as bytes.
//!
//! Not a library for users: the CLI embeds [`DEMO`] for `serve --examples`,
//! and tests deploy these to a real runtime. No `.wasm` file is committed.

/// The bundled examples app (`demo/examples`): classes `counter`, `notes`,
/// `reminder`, `watch`.
pub const DEMO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/demo.wasm"));

/// Actors that misbehave on purpose (class `probe`), for tests.
pub const TESTBED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/testbed.wasm"));

/// The README's tour: one `counter` class in one file.
pub const HELLO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hello.wasm"));

/// A component that imports an interface no node provides (deploy tests).
pub const BAD_IMPORT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/bad_import.wasm"));

/// An actor that attacks the node running it (class `attacker`), for the
/// hostile-guest tests (issue 17).
pub const HOSTILE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hostile.wasm"));
