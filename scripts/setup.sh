#!/usr/bin/env bash
# Installs what building and testing wasmkeep needs on a fresh machine:
# the wasm32-wasip2 target of the pinned toolchain, the npm packages that
# build actors written in TypeScript (sdk/ts: esbuild, componentize-qjs,
# typescript, exact versions from its lock file), and (with --test) the
# S3-compatible test server (moto) in .venv and what the console's browser
# test drives: Debian's Chromium and playwright-core (exact version from
# crates/wasmkeep/tests/browser's lock file). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# rustup does not add a target listed in rust-toolchain.toml when that
# toolchain is already installed: ask for it explicitly, inside the repo so
# the pinned toolchain is the one that gets it.
rustup toolchain install >/dev/null 2>&1 || true
rustup target add wasm32-wasip2 >/dev/null

# The TypeScript build chain: the examples in TypeScript are built with it
# (crates/wasmkeep-guests), and so is every TypeScript actor. Installed again
# only when the lock file changed. No install script runs (none is needed).
if ! cmp -s sdk/ts/package-lock.json sdk/ts/node_modules/.wasmkeep-installed-lock 2>/dev/null; then
  command -v npm >/dev/null || { echo "setup: npm (Node.js 20 or later) is needed to build TypeScript actors" >&2; exit 1; }
  npm ci --prefix sdk/ts --ignore-scripts --no-audit --no-fund --loglevel=error
  cp sdk/ts/package-lock.json sdk/ts/node_modules/.wasmkeep-installed-lock
fi

if [ "${1:-}" = "--test" ]; then
  # The format and lint checks of the test command.
  rustup component add rustfmt clippy >/dev/null
  if [ ! -x .venv/bin/moto_server ]; then
    python3 -m venv .venv
    .venv/bin/pip install --quiet --upgrade pip
    .venv/bin/pip install --quiet 'moto[server]'
  fi
  # The console's browser test (crates/wasmkeep/tests/console.rs): Debian's
  # Chromium, driven by playwright-core, which downloads no browser of its
  # own.
  if [ ! -x /usr/bin/chromium ]; then
    sudo_if_needed() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
    sudo_if_needed apt-get update -qq
    sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  fi
  browser=crates/wasmkeep/tests/browser
  if ! cmp -s $browser/package-lock.json $browser/node_modules/.wasmkeep-installed-lock 2>/dev/null; then
    npm ci --prefix $browser --ignore-scripts --no-audit --no-fund --loglevel=error
    cp $browser/package-lock.json $browser/node_modules/.wasmkeep-installed-lock
  fi
fi
