//! Builds the guest workspace in `examples/` for wasm32-wasip2 and copies
//! each component into OUT_DIR, where `src/lib.rs` embeds it; then builds
//! the TypeScript guests (`examples/ts`, `examples/ts-hostile`) with the
//! SDK's build chain (`node sdk/ts/build.mjs`, which needs `npm ci` in
//! `sdk/ts`: `scripts/setup.sh` does it).
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
        "examples/ts",
        "examples/ts-hostile",
        "sdk/ts/src",
        "sdk/ts/build.mjs",
        "sdk/ts/package-lock.json",
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
    for (dir, name) in TS_GUESTS {
        build_ts(&root, &target_dir, dir, name, &out);
    }
}

/// The TypeScript guests: the folder under `examples/` and the file name.
const TS_GUESTS: &[(&str, &str)] = &[("ts", "examples_ts"), ("ts-hostile", "hostile_ts")];

/// Builds one TypeScript guest, unless its inputs (its sources, the SDK,
/// the WIT, the lock file) are those of the last build: componentize-qjs
/// does not give the same bytes twice, and a new component costs every
/// test's node a compile.
fn build_ts(root: &Path, target_dir: &Path, dir: &str, name: &str, out: &Path) {
    let inputs = [
        root.join("examples").join(dir).join("src"),
        root.join("sdk/ts/src"),
        root.join("sdk/ts/build.mjs"),
        root.join("sdk/ts/package-lock.json"),
        root.join("wit"),
    ];
    let stamp = format!("{:016x}", fingerprint(&inputs));
    let cached = target_dir.join("ts").join(format!("{name}.wasm"));
    let cached_stamp = cached.with_extension("inputs");
    if std::fs::read_to_string(&cached_stamp).ok().as_deref() != Some(stamp.as_str()) {
        std::fs::create_dir_all(cached.parent().unwrap()).unwrap();
        if !root.join("sdk/ts/node_modules/componentize-qjs").exists() {
            panic!(
                "the TypeScript build chain is not installed: run `scripts/setup.sh` \
                 (it runs `npm ci` in sdk/ts; the README's commands do)"
            );
        }
        let status = Command::new("node")
            .arg(root.join("sdk/ts/build.mjs"))
            .arg(root.join("examples").join(dir).join("src/index.ts"))
            .arg(&cached)
            .status()
            .expect("run node (Node.js 20 or later builds the TypeScript guests)");
        if !status.success() {
            panic!("building the TypeScript guest examples/{dir} failed (its error is above)");
        }
        std::fs::write(&cached_stamp, &stamp).unwrap();
    }
    copy(&cached, &out.join(format!("{name}.wasm")));
}

/// FNV-1a over the names and bytes of every file under `paths`, in order.
fn fingerprint(paths: &[PathBuf]) -> u64 {
    let mut files = Vec::new();
    for p in paths {
        collect(p, &mut files);
    }
    files.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for f in files {
        eat(f.to_string_lossy().as_bytes());
        eat(&std::fs::read(&f).unwrap_or_else(|e| panic!("read {}: {e}", f.display())));
    }
    h
}

fn collect(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        for e in std::fs::read_dir(p).unwrap() {
            collect(&e.unwrap().path(), out);
        }
    } else if p.is_file() {
        out.push(p.to_path_buf());
    }
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
}
