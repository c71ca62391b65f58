#!/usr/bin/env bash
# The main job: build wasmkeep (release), start one node on 127.0.0.1:8080
# with a local data directory and the bundled examples deployed, and print
# how to call them. Extra arguments go to `wasmkeep serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --locked -p wasmkeep
exec target/release/wasmkeep serve --examples --data "${WASMKEEP_DATA:-./wasmkeep-data}" "$@"
