//! An actor project on disk, in either language: a Rust crate (a
//! `Cargo.toml`) or a TypeScript/JavaScript package (a `package.json` and
//! `src/index.ts` or `src/index.js`). `wasmkeep build` and `wasmkeep dev`
//! build both through [`build`]; everything else about a project (its
//! name, what the watcher ignores) is asked here too, so the two commands
//! cannot disagree.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The language of a project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lang {
    Rust,
    TypeScript,
}

/// What kind of project `dir` holds: a `Cargo.toml` makes it Rust, else a
/// `package.json` makes it TypeScript (or JavaScript).
pub(crate) fn lang(dir: &Path) -> Result<Lang> {
    if dir.join("Cargo.toml").is_file() {
        Ok(Lang::Rust)
    } else if dir.join("package.json").is_file() {
        Ok(Lang::TypeScript)
    } else {
        bail!(
            "{} holds neither a Cargo.toml nor a package.json: is it an actor project? \
             (`wasmkeep new NAME` or `wasmkeep new NAME --lang ts` makes one)",
            dir.display()
        )
    }
}

/// The project's name: the crate's `[package] name` or the package's
/// `name` (without an npm scope). It is the app's name by default.
pub(crate) fn name(dir: &Path) -> Result<String> {
    match lang(dir)? {
        Lang::Rust => {
            let path = dir.join("Cargo.toml");
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("read {}", path.display()))?;
            let v: toml::Value =
                toml::from_str(&text).with_context(|| format!("{}", path.display()))?;
            v.get("package")
                .and_then(|p| p.get("name"))
                .and_then(|n| n.as_str())
                .map(str::to_owned)
                .ok_or_else(|| anyhow::anyhow!("{} has no [package] name", path.display()))
        }
        Lang::TypeScript => {
            let path = dir.join("package.json");
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("read {}", path.display()))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
            let full = v["name"]
                .as_str()
                .ok_or_else(|| anyhow::anyhow!("{} has no \"name\"", path.display()))?;
            Ok(full.rsplit('/').next().unwrap_or(full).to_owned())
        }
    }
}

/// Folders at the project's root the watcher skips: build output and
/// installed packages.
pub(crate) fn unwatched(name: &str) -> bool {
    matches!(name, "target" | "Cargo.lock" | "node_modules")
}

/// Builds the project's component; returns its path. A TypeScript
/// project's is `.wasmkeep/app.wasm`. Errors say what failed in one line;
/// the compiler's or bundler's own messages went to stderr.
pub(crate) fn build(dir: &Path) -> Result<PathBuf> {
    match lang(dir)? {
        Lang::Rust => {
            // Where the crate's tests build it too: one build serves both.
            let target = wasmkeep_build::component_target_dir(dir);
            wasmkeep_build::build_component_at(dir, Some(&target)).map_err(anyhow::Error::msg)
        }
        Lang::TypeScript => build_ts(dir),
    }
}

/// The entry module of a TypeScript project.
fn entry(dir: &Path) -> Result<PathBuf> {
    ["src/index.ts", "src/index.js", "src/index.mts", "src/index.mjs"]
        .iter()
        .map(|p| dir.join(p))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{} has no src/index.ts (or .js): the app's module, whose default export is `app({{...}})`",
                dir.display()
            )
        })
}

fn build_ts(dir: &Path) -> Result<PathBuf> {
    let entry = entry(dir)?;
    let script = dir.join("node_modules/@wasmkeep/sdk/build.mjs");
    if !script.is_file() {
        // The project's packages are not installed yet: install them as
        // its lock file says.
        let ci = dir.join("package-lock.json").is_file();
        eprintln!(
            "[build] installing the project's npm packages (npm {})",
            if ci { "ci" } else { "install" }
        );
        let status = Command::new("npm")
            .arg(if ci { "ci" } else { "install" })
            .args([
                "--ignore-scripts",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
            ])
            .current_dir(dir)
            .status()
            .context("run npm (Node.js 20 or later and npm build TypeScript actors)")?;
        if !status.success() || !script.is_file() {
            bail!(
                "npm could not install the project's packages (its message is above); \
                 package.json must depend on @wasmkeep/sdk"
            );
        }
    }
    let out_dir = dir.join(".wasmkeep");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("create {}", out_dir.display()))?;
    let out = out_dir.join("app.wasm");
    let output = Command::new("node")
        .arg(&script)
        .arg(&entry)
        .arg(&out)
        .current_dir(dir)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("run node (Node.js 20 or later builds TypeScript actors)")?;
    if !output.status.success() {
        bail!(
            "building {} failed (the bundler's or componentizer's message is above)",
            entry.display()
        );
    }
    Ok(out)
}
