//! Builds the guest workspace in `examples/` for wasm32-wasip2 and copies
//! each component into OUT_DIR, where `src/lib.rs` embeds it.
//!
//! The nested cargo gets a target directory of its own (`target/guests`) so
//! it never waits for the outer build's lock, and a clean environment so the
//! outer build's settings (target, flags) do not leak into it.

use std::path::{Path, PathBuf};
use std::process::Command;

const GUESTS: &[&str] = &["demo", "testbed", "hello", "bad_import", "hostile"];

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let examples = root.join("examples");
    for p in [
        "examples/Cargo.toml",
        "examples/demo",
        "examples/testbed",
        "examples/hello",
        "examples/bad-import",
        "examples/hostile",
        "crates/wasmkeep-sdk/src",
        "crates/wasmkeep-sdk/Cargo.toml",
        "wit",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    let target_dir = std::env::var_os("WASMKEEP_GUEST_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target").join("guests"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let keep = k == "CARGO_HOME" || k == "CARGO_MAKEFLAGS" || k == "CARGO_NET_OFFLINE";
        if (k.starts_with("CARGO_") && !keep)
            || k == "RUSTFLAGS"
            || k == "RUSTC_WRAPPER"
            || k == "RUSTC_WORKSPACE_WRAPPER"
            || k == "RUSTDOCFLAGS"
        {
            cmd.env_remove(&k);
        }
    }
    cmd.current_dir(&examples)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&target_dir);
    let status = cmd.status().expect("run cargo for the guests");
    if !status.success() {
        panic!(
            "building the guest components failed. Is the wasm32-wasip2 target installed? \
             Run `rustup target add wasm32-wasip2` in the repository (the README's commands do)."
        );
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    for g in GUESTS {
        let built = target_dir
            .join("wasm32-wasip2")
            .join("release")
            .join(format!("{g}.wasm"));
        copy(&built, &out.join(format!("{g}.wasm")));
    }
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
}
