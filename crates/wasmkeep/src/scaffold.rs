//! `wasmkeep new NAME`: a new actor crate that builds on the first try.
//!
//! The SDK and the test kit are not on a registry yet, so the crate
//! depends on them by path, in the checkout this binary was built from
//! (`--checkout` names another). Its `Cargo.lock` and `rust-toolchain.toml`
//! are copies of that checkout's, so it builds with the versions and the
//! toolchain the checkout was tested with, not whatever is newest.

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
    let sdk = checkout.join("crates/wasmkeep-sdk");
    let testkit = checkout.join("crates/wasmkeep-testkit");
    for (what, dir) in [("SDK", &sdk), ("test kit", &testkit)] {
        if !dir.join("Cargo.toml").is_file() {
            bail!(
                "no wasmkeep {what} at {}: pass --checkout PATH (a checkout of wasmkeep)",
                dir.display()
            );
        }
    }
    let parent = match args.dir {
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
    let files = files(name, &sdk, &testkit);
    std::fs::create_dir_all(root.join("src"))
        .with_context(|| format!("create {}", root.display()))?;
    std::fs::create_dir_all(root.join("tests"))?;
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
    println!("  cargo test                   # its tests, on the real runtime");
    println!("  cargo build --release --target wasm32-wasip2   # the component alone");
    Ok(())
}

fn is_crate_name(s: &str) -> bool {
    s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// The crate's files: path within the crate, and text.
fn files(name: &str, sdk: &Path, testkit: &Path) -> Vec<(&'static str, String)> {
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
    vec![
        ("Cargo.toml", cargo),
        ("src/lib.rs", LIB_RS.to_owned()),
        ("tests/actor.rs", test),
        (".gitignore", "/target\n/.wasmkeep\n".to_owned()),
    ]
}

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
# Runs this crate's component on the real runtime inside `cargo test`.
wasmkeep-testkit = { path = "{testkit}" }

# A crate of its own, even inside another workspace.
[workspace]

[profile.release]
opt-level = "s"
lto = true
codegen-units = 1
strip = true
debug = false

# The test kit's wasmtime and SQLite are very slow unoptimised.
[profile.dev.package."*"]
opt-level = 1
debug = false
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
//! test says so (see the wasmkeep checkout's docs/testing.md).

use std::time::Duration;

use wasmkeep_testkit::{TestNode, build_component};

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
    node.restart();
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
        let files = files("x", Path::new("/a \"q\"/sdk"), Path::new("/t"));
        let cargo = &files[0].1;
        let parsed: toml::Value = toml::from_str(cargo).expect("valid TOML");
        assert_eq!(
            parsed["dependencies"]["wasmkeep-sdk"]["path"].as_str(),
            Some("/a \"q\"/sdk")
        );
    }
}
