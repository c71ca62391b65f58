#!/usr/bin/env bash
# Every test: installs what the tests need (wasm32-wasip2, moto), then runs
# the whole workspace's tests, including the guest components built from
# examples/ and the simulator's seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
export PATH="$PWD/.venv/bin:$PATH"
cargo test --workspace --locked --no-fail-fast "$@"
