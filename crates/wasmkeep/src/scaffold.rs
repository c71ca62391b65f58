//! `wasmkeep new NAME`: a new actor crate that builds on the first try;
//! `wasmkeep new NAME --lang ts`: the same actor as a TypeScript package.
//!
//! The SDK and the test kit are not on a registry yet, so the crate
//! depends on them by path, in the checkout this binary was built from
//! (`--checkout` names another). Its `Cargo.lock` and `rust-toolchain.toml`
//! are copies of that checkout's, so it builds with the versions and the
//! toolchain the checkout was tested with, not whatever is newest. Its
//! tests use the process test kit (`wasmkeep-testnode`, ADR 0055), which
//! runs this very binary (named in the crate's `.cargo/config.toml`), so a
//! first `cargo test` compiles no runtime.
//!
//! A TypeScript package depends on the checkout's `sdk/ts` (a `file:`
//! dependency: its build chain is the checkout's, installed by
//! `scripts/setup.sh`), pins TypeScript exactly, and gets its
//! `package-lock.json` from `npm install`, run here.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The checkout this binary was built from (its workspace root).
pub(crate) fn built_from() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

#[derive(clap::Args)]
pub(crate) struct NewArgs {
    /// The crate's name, and its folder (created; it must not exist).
    /// Lower-case letters, digits, `-` and `_`: it is also the app's name.
    name: String,
    /// Where to create the folder [default: the current directory].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The wasmkeep checkout whose SDK and test kit the crate uses
    /// [default: the one this binary was built from].
    #[arg(long)]
    checkout: Option<PathBuf>,
    /// The language: `rust` (a crate) or `ts` (a TypeScript package).
    #[arg(long, default_value = "rust", value_parser = ["rust", "ts"])]
    lang: String,
}

pub(crate) fn new(args: NewArgs) -> Result<()> {
    let name = &args.name;
    if !is_crate_name(name) {
        bail!(
            "invalid name `{name}`: use lower-case letters, digits, `-` and `_`, starting with a \
             letter, at most 63 bytes (it names the crate and the app)"
        );
    }
    let checkout = args.checkout.unwrap_or_else(built_from);
    let checkout = checkout.canonicalize().with_context(|| {
        format!(
            "the wasmkeep checkout {} is gone; pass --checkout PATH",
            checkout.display()
        )
    })?;
    if args.lang == "ts" {
        return new_ts(name, &checkout, args.dir);
    }
    let sdk = checkout.join("crates/wasmkeep-sdk");
    let testkit = checkout.join("crates/wasmkeep-testnode");
    for (what, dir) in [("SDK", &sdk), ("test kit", &testkit)] {
        if !dir.join("Cargo.toml").is_file() {
            bail!(
                "no wasmkeep {what} at {}: pass --checkout PATH (a checkout of wasmkeep)",
                dir.display()
            );
        }
    }
    let root = fresh_root(name, args.dir)?;
    let binary = std::env::current_exe().context("find this binary's path")?;
    let files = files(name, &sdk, &testkit, &binary);
    std::fs::create_dir_all(root.join("src"))
        .with_context(|| format!("create {}", root.display()))?;
    std::fs::create_dir_all(root.join("tests"))?;
    std::fs::create_dir_all(root.join(".cargo"))?;
    for (path, text) in &files {
        let p = root.join(path);
        std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))?;
    }
    // The checkout's versions and toolchain (the one its scripts installed
    // the wasm32-wasip2 target for), so the crate builds as it does.
    for file in ["Cargo.lock", "rust-toolchain.toml"] {
        let from = checkout.join(file);
        if from.is_file() {
            std::fs::copy(&from, root.join(file))
                .with_context(|| format!("copy the checkout's {file}"))?;
        }
    }
    println!(
        "created {} (SDK and test kit from {})",
        root.display(),
        checkout.display()
    );
    println!();
    println!("  cd {}", root.display());
    println!("  wasmkeep dev                 # run it on a local node; edits redeploy");
    println!("  cargo test                   # its tests, on a real node");
    println!("  cargo build --release --target wasm32-wasip2   # the component alone");
    Ok(())
}

/// `dir/name` (the current directory by default), which must not exist.
fn fresh_root(name: &str, dir: Option<PathBuf>) -> Result<PathBuf> {
    let parent = match dir {
        Some(d) => d,
        None => std::env::current_dir().context("find the current directory")?,
    };
    let root = parent.join(name);
    if root.exists() {
        bail!(
            "{} exists already: pick another name or --dir",
            root.display()
        );
    }
    Ok(root)
}

/// The TypeScript package: files, then `npm install` for its lock file.
fn new_ts(name: &str, checkout: &Path, dir: Option<PathBuf>) -> Result<()> {
    let sdk = checkout.join("sdk/ts");
    if !sdk.join("package.json").is_file() {
        bail!(
            "no wasmkeep TypeScript SDK at {}: pass --checkout PATH (a checkout of wasmkeep)",
            sdk.display()
        );
    }
    if !sdk.join("node_modules/componentize-qjs").is_dir() {
        bail!(
            "the TypeScript build chain is not installed in {}: run scripts/setup.sh there",
            checkout.display()
        );
    }
    let root = fresh_root(name, dir)?;
    let exe = std::env::current_exe().context("find this wasmkeep binary")?;
    let json_str = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
    let package = TS_PACKAGE_JSON
        .replace("{name}", &json_str(name))
        .replace("{sdk}", &json_str(&format!("file:{}", sdk.display())))
        .replace("{wasmkeep}", &json_str(&exe.display().to_string()));
    let test = TS_TEST.replace("{name}", name);
    for d in ["src", "tests"] {
        std::fs::create_dir_all(root.join(d))
            .with_context(|| format!("create {}", root.display()))?;
    }
    for (path, text) in [
        ("package.json", package.as_str()),
        ("tsconfig.json", TS_CONFIG),
        ("src/index.ts", TS_INDEX),
        ("tests/actor.test.mjs", test.as_str()),
        (".gitignore", "/node_modules\n/.wasmkeep\n/.dev.vars\n"),
    ] {
        let p = root.join(path);
        std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))?;
    }
    // The lock file: exact versions of everything installed.
    let status = std::process::Command::new("npm")
        .args([
            "install",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
        ])
        .current_dir(&root)
        .status()
        .context("run npm (Node.js 20 or later and npm are needed for TypeScript actors)")?;
    if !status.success() {
        bail!(
            "npm install failed in {} (its message is above); the files are written, run it again there",
            root.display()
        );
    }
    println!("created {} (SDK from {})", root.display(), sdk.display());
    println!();
    println!("  cd {}", root.display());
    println!("  wasmkeep dev                 # run it on a local node; edits redeploy");
    println!("  npm test                     # its tests, on a real node");
    println!("  npm run check                # type-check");
    println!("  wasmkeep build               # the component alone (.wasmkeep/app.wasm)");
    Ok(())
}

fn is_crate_name(s: &str) -> bool {
    s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// The crate's files: path within the crate, and text.
fn files(name: &str, sdk: &Path, testkit: &Path, binary: &Path) -> Vec<(&'static str, String)> {
    let toml_path = |p: &Path| {
        p.display()
            .to_string()
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
    };
    let cargo = CARGO_TOML
        .replace("{name}", name)
        .replace("{sdk}", &toml_path(sdk))
        .replace("{testkit}", &toml_path(testkit));
    let test = TEST_RS.replace("{name}", name);
    let config = CARGO_CONFIG.replace("{binary}", &toml_path(binary));
    vec![
        ("Cargo.toml", cargo),
        (".cargo/config.toml", config),
        ("src/lib.rs", LIB_RS.to_owned()),
        ("tests/actor.rs", test),
        (".gitignore", "/target\n/.wasmkeep\n/.dev.vars\n".to_owned()),
    ]
}

const TS_PACKAGE_JSON: &str = r#"{
  "name": {name},
  "version": "0.1.0",
  "private": true,
  "type": "module",
  "scripts": {
    "build": "\"$npm_package_config_wasmkeep\" build",
    "check": "tsc --noEmit -p .",
    "test": "\"$npm_package_config_wasmkeep\" build && node --test tests/"
  },
  "config": {
    "wasmkeep": {wasmkeep}
  },
  "dependencies": {
    "@wasmkeep/sdk": {sdk}
  },
  "devDependencies": {
    "typescript": "5.9.3"
  }
}
"#;

const TS_CONFIG: &str = r#"{
  "compilerOptions": {
    "target": "ES2022",
    "module": "ES2022",
    "moduleResolution": "bundler",
    "lib": ["ES2022"],
    "strict": true,
    "noEmit": true,
    "isolatedModules": true
  },
  "include": ["src"]
}
"#;

const TS_INDEX: &str = r#"// An actor class `counter`: one counter per actor name, kept in the
// actor's own SQLite database, and a reminder that an alarm delivers.
//
// Try it with `wasmkeep dev`, then:
//   curl -X POST http://127.0.0.1:8080/v1/dev/<app>/counter/alice/increment
//   curl http://127.0.0.1:8080/v1/dev/<app>/counter/alice/value
//   curl -X POST 'http://127.0.0.1:8080/v1/dev/<app>/counter/alice/remind?in_ms=2000'

import { Actor, AlarmInfo, Request, Response, alarm, app, log, nowMs, sql } from "@wasmkeep/sdk";

class Counter implements Actor {
  /** Runs once, in the same transaction as the actor's first event. */
  init(): void {
    sql.run("CREATE TABLE counter (n INTEGER NOT NULL)");
    sql.run("INSERT INTO counter VALUES (0)");
  }

  request(req: Request): Response {
    switch (req.route) {
      case "POST /increment": {
        const { n } = sql.one<{ n: number }>("UPDATE counter SET n = n + 1 RETURNING n");
        log.info(`counted ${n}`);
        return Response.json({ value: n });
      }
      case "GET /value":
        return Response.json({ value: sql.one<{ n: number }>("SELECT n FROM counter").n });
      case "POST /remind": {
        const inMs = req.queryInt("in_ms") ?? 1_000;
        alarm.set(nowMs() + inMs);
        return Response.json({ due_in_ms: inMs }, 202);
      }
      default:
        return Response.notFound();
    }
  }

  /** The reminder: runs at (never before) the time `alarm.set` gave. */
  alarm(info: AlarmInfo): void {
    sql.run("UPDATE counter SET n = n + 100");
    log.info(`reminded (retry ${info.retryCount})`);
  }
}

export default app({ counter: Counter });
"#;

const TS_TEST: &str = r#"// The actor on a real node (`@wasmkeep/sdk/testing`), whose clock moves
// only when a test says so: `npm test` builds the component first, then
// runs this with `node --test`.

import { test } from "node:test";
import assert from "node:assert/strict";
import { startNode } from "@wasmkeep/sdk/testing";

test("the counter counts and keeps its value across a crash", async () => {
  const node = await startNode();
  try {
    await node.deploy("dev/{name}", ".wasmkeep/app.wasm");
    const alice = node.actor("dev/{name}/counter/alice");
    assert.deepEqual((await alice.post("/increment")).json(), { value: 1 });
    assert.deepEqual((await alice.post("/increment")).json(), { value: 2 });
    await node.crash();
    assert.deepEqual((await alice.get("/value")).json(), { value: 2 });
    const bob = node.actor("dev/{name}/counter/bob");
    assert.deepEqual((await bob.get("/value")).json(), { value: 0 });
  } finally {
    await node.stop();
  }
});

test("the reminder fires at its time and not before", async () => {
  const node = await startNode();
  try {
    await node.deploy("dev/{name}", ".wasmkeep/app.wasm");
    const alice = node.actor("dev/{name}/counter/alice");
    assert.equal((await alice.post("/remind?in_ms=60000")).status, 202);
    // The node's clock moves only when the test says so.
    await node.advance(59_000);
    assert.deepEqual((await alice.get("/value")).json(), { value: 0 }, "not yet due");
    assert.equal(await node.advance(1_000), 1, "one alarm ran");
    assert.deepEqual((await alice.get("/value")).json(), { value: 100 });
    assert.equal(await node.advance(3_600_000), 0, "delivered once");
  } finally {
    await node.stop();
  }
});
"#;

const CARGO_TOML: &str = r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

# An actor crate is a WebAssembly component:
#   cargo build --release --target wasm32-wasip2
[lib]
crate-type = ["cdylib"]

[dependencies]
# Not on crates.io yet: the SDK of a wasmkeep checkout, by path.
wasmkeep-sdk = { path = "{sdk}" }

[dev-dependencies]
# Runs this crate's component on a real node (the `wasmkeep` binary of
# .cargo/config.toml) inside `cargo test`.
wasmkeep-testnode = { path = "{testkit}" }

# A crate of its own, even inside another workspace.
[workspace]

[profile.release]
opt-level = "s"
lto = true
codegen-units = 1
strip = true
debug = false
"#;

const CARGO_CONFIG: &str = r#"# The node this crate's tests start (wasmkeep-testnode): the binary that
# made the crate. An environment variable WASMKEEP_BIN set by hand wins.
[env]
WASMKEEP_BIN = { value = "{binary}", force = false }
"#;

const LIB_RS: &str = r#"//! An actor class `counter`: one counter per actor name, kept in the
//! actor's own SQLite database, and a reminder that an alarm delivers.
//!
//! Try it with `wasmkeep dev`, then:
//!   curl -X POST http://127.0.0.1:8080/v1/dev/<app>/counter/alice/increment
//!   curl http://127.0.0.1:8080/v1/dev/<app>/counter/alice/value
//!   curl -X POST 'http://127.0.0.1:8080/v1/dev/<app>/counter/alice/remind?in_ms=2000'

use wasmkeep_sdk::serde_json::json;
use wasmkeep_sdk::{Actor, AlarmInfo, Request, Response, Result, alarm, log, now_ms, sql};

#[derive(Default)]
struct Counter;

impl Actor for Counter {
    /// Runs once, in the same transaction as the actor's first event.
    fn init(&mut self) -> Result<()> {
        sql::execute("CREATE TABLE counter (n INTEGER NOT NULL)", &[])?;
        sql::execute("INSERT INTO counter VALUES (0)", &[])?;
        Ok(())
    }

    fn request(&mut self, req: Request) -> Result<Response> {
        match req.route() {
            ("POST", "/increment") => {
                let n = sql::query("UPDATE counter SET n = n + 1 RETURNING n", &[])?.rows[0].int(0);
                log::info(&format!("counted {n}"));
                Response::json_value(200, &json!({ "value": n }))
            }
            ("GET", "/value") => {
                let n = sql::query("SELECT n FROM counter", &[])?.rows[0].int(0);
                Response::json_value(200, &json!({ "value": n }))
            }
            ("POST", "/remind") => {
                let in_ms = req.query_u64("in_ms")?.unwrap_or(1_000);
                alarm::set(now_ms() + in_ms)?;
                Response::json_value(202, &json!({ "due_in_ms": in_ms }))
            }
            _ => Ok(Response::not_found()),
        }
    }

    /// The reminder: runs at (never before) the time `alarm::set` gave.
    fn alarm(&mut self, info: AlarmInfo) -> Result<()> {
        sql::execute("UPDATE counter SET n = n + 100", &[])?;
        log::info(&format!("reminded (retry {})", info.retry_count));
        Ok(())
    }
}

wasmkeep_sdk::app!("counter" => Counter);
"#;

const TEST_RS: &str = r#"//! The actor on the real runtime, with a clock that moves only when the
//! test says so (see the wasmkeep checkout's docs/testing.md). The node is
//! the `wasmkeep` binary, in a process of its own.

use std::time::Duration;

use wasmkeep_testnode::{TestNode, build_component};

fn node() -> TestNode {
    let node = TestNode::new();
    node.deploy("dev/{name}", &build_component(env!("CARGO_MANIFEST_DIR")))
        .expect("deploy");
    node
}

#[test]
fn the_counter_counts_and_keeps_its_value() {
    let mut node = node();
    let alice = node.actor("dev/{name}/counter/alice");
    assert_eq!(alice.post("/increment", "").json()["value"], 1);
    assert_eq!(alice.post("/increment", "").json()["value"], 2);
    // Killed (no clean stop) and started again on the same data.
    node.crash();
    let alice = node.actor("dev/{name}/counter/alice");
    assert_eq!(alice.get("/value").json()["value"], 2);
    assert_eq!(node.actor("dev/{name}/counter/bob").get("/value").json()["value"], 0);
}

#[test]
fn the_reminder_fires_at_its_time_and_not_before() {
    let node = node();
    let alice = node.actor("dev/{name}/counter/alice");
    assert_eq!(alice.post("/remind?in_ms=60000", "").status, 202);
    node.advance(Duration::from_secs(59));
    assert_eq!(alice.get("/value").json()["value"], 0, "not yet due");
    node.advance(Duration::from_secs(1));
    assert_eq!(alice.get("/value").json()["value"], 100);
    assert_eq!(alice.alarm(), None, "delivered once");
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_paths_quoted_for_toml() {
        assert!(is_crate_name("my-app_2"));
        for bad in ["", "My", "1app", "a b", "a/b", &"a".repeat(64)] {
            assert!(!is_crate_name(bad), "{bad:?}");
        }
        let files = files(
            "x",
            Path::new("/a \"q\"/sdk"),
            Path::new("/t"),
            Path::new("/b\\in/wasmkeep"),
        );
        let cargo = &files[0].1;
        let parsed: toml::Value = toml::from_str(cargo).expect("valid TOML");
        assert_eq!(
            parsed["dependencies"]["wasmkeep-sdk"]["path"].as_str(),
            Some("/a \"q\"/sdk")
        );
        assert_eq!(files[1].0, ".cargo/config.toml");
        let config: toml::Value = toml::from_str(&files[1].1).expect("valid TOML");
        assert_eq!(
            config["env"]["WASMKEEP_BIN"]["value"].as_str(),
            Some("/b\\in/wasmkeep")
        );
    }
}
