//! Building an actor crate into its component, for tests and for
//! `wasmkeep dev`: one way to do it, so that what a test runs is what the
//! dev loop deploys.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The target every component is built for.
pub const WASM_TARGET: &str = "wasm32-wasip2";

/// Builds the crate at `crate_dir` with `cargo build --release --target
/// wasm32-wasip2` and returns the path of its component (the `.wasm` of
/// its `cdylib`). Cargo's diagnostics go to this process's stderr as cargo
/// renders them. `target_dir` overrides cargo's (`None`: the crate's own,
/// as `cargo build` would pick). An error says what failed, in one line.
pub fn build_component_at(crate_dir: &Path, target_dir: Option<&Path>) -> Result<PathBuf, String> {
    let manifest = crate_dir.join("Cargo.toml");
    if !manifest.is_file() {
        return Err(format!("no Cargo.toml in {}", crate_dir.display()));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(crate_dir)
        .args(["build", "--release", "--target", WASM_TARGET])
        .arg("--message-format=json-render-diagnostics")
        .arg("--manifest-path")
        .arg(&manifest)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(t) = target_dir {
        cmd.arg("--target-dir").arg(t);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("run cargo (is it on the PATH?): {e}"))?;
    let manifest = manifest
        .canonicalize()
        .map_err(|e| format!("{}: {e}", manifest.display()))?;
    let mut found = None;
    // rustc's "can't find crate for `std`" (E0463) is what a missing
    // target looks like; only then is the target worth a hint.
    let mut no_std = false;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] == "compiler-message"
            && v["message"]["code"]["code"] == "E0463"
            && v["message"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("`std`") || m.contains("`core`"))
        {
            no_std = true;
        }
        if v["reason"] != "compiler-artifact" {
            continue;
        }
        let ours = v["manifest_path"]
            .as_str()
            .and_then(|p| Path::new(p).canonicalize().ok())
            .is_some_and(|p| p == manifest);
        let cdylib = v["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "cdylib"));
        if ours && cdylib {
            found = v["filenames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f.as_str())
                .find(|f| f.ends_with(".wasm"))
                .map(PathBuf::from);
        }
    }
    if !out.status.success() {
        let hint = if no_std {
            format!(
                "; the {WASM_TARGET} target is not installed for this toolchain: \
                 `rustup target add {WASM_TARGET}` in {}",
                crate_dir.display()
            )
        } else {
            String::new()
        };
        return Err(format!(
            "cargo build --release --target {WASM_TARGET} failed in {} (its errors are above){hint}",
            crate_dir.display()
        ));
    }
    found.ok_or_else(|| {
        format!(
            "{} built no component: its Cargo.toml needs `[lib] crate-type = [\"cdylib\"]`",
            crate_dir.display()
        )
    })
}

/// Builds the actor crate at `crate_dir` (usually
/// `env!("CARGO_MANIFEST_DIR")`, the crate the test belongs to) and
/// returns its component, ready for [`crate::TestNode::deploy`]:
///
/// ```ignore
/// let wasm = wasmkeep_testkit::build_component(env!("CARGO_MANIFEST_DIR"));
/// node.deploy("acme/shop", &wasm)?;
/// ```
///
/// It builds into [`component_target_dir`], as `wasmkeep dev` does, so a
/// test after a dev session (or the other way round) rebuilds nothing.
/// Each call runs cargo, which rebuilds only what changed. Panics with the
/// reason if the build fails, which fails the test.
pub fn build_component(crate_dir: impl AsRef<Path>) -> Vec<u8> {
    let dir = crate_dir.as_ref();
    let target = component_target_dir(dir);
    let path = build_component_at(dir, Some(&target)).unwrap_or_else(|e| panic!("{e}"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Where components are built, for tests and for `wasmkeep dev` alike:
/// `wasmkeep-component` in the crate's cargo target folder
/// (`$CARGO_TARGET_DIR` when set, else `target/` under the crate). A
/// folder of its own, because a running `cargo test` holds its profile's
/// folder of `target/` locked (with `cargo test --release`, the very
/// folder a release build of the component would need), while nothing
/// but these builds ever locks this one.
pub fn component_target_dir(crate_dir: &Path) -> PathBuf {
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) if !t.is_empty() => crate_dir.join(t),
        _ => crate_dir.join("target"),
    };
    target.join("wasmkeep-component")
}
