#!/usr/bin/env bash
# Every test: installs what the tests need (wasm32-wasip2, rustfmt, clippy,
# moto), checks the format and the lints (clippy.toml: function length, no
# clock outside the clock modules), then runs the whole workspace's tests,
# including the guest components built from examples/ and the simulator's
# seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
export PATH="$PWD/.venv/bin:$PATH"
# A clean clone (CI) gains nothing from incremental builds, which would
# double target/ on disk (a CI run once failed with the disk full).
if [[ -n "${CI:-}" ]]; then
  export CARGO_INCREMENTAL=0
fi
cargo fmt --all -- --check
# The TypeScript SDK and the examples written with it type-check (strict),
# and so does every TypeScript example in the docs.
sdk/ts/node_modules/.bin/tsc -p sdk/ts
node sdk/ts/check-docs.mjs
cargo clippy --workspace --all-targets --locked -- -D warnings
# Function length for the code that ships (tests may be longer): the
# threshold is clippy.toml's.
cargo clippy --workspace --lib --bins --examples --locked -- -D warnings -W clippy::too_many_lines
# The node binary as the release build makes it: `-p wasmkeep` alone, so no
# test crate turns on the runtime's fault switches or the replica's test
# buckets (a workspace build unifies those features in): that variant of
# the code compiles and is linted too.
cargo clippy -p wasmkeep --bins --locked -- -D warnings -W clippy::too_many_lines
cargo test --workspace --locked --no-fail-fast "$@"
