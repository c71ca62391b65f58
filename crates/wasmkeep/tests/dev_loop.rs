//! `wasmkeep new` then `wasmkeep dev` as a new user runs them (issue 22):
//! the scaffold builds on the first try, `dev` serves it with an access
//! line per request and the actor's log lines inline, a saved change is
//! served within a bound, and a change that does not build leaves the last
//! good deploy serving. Its data and the secrets of `.dev.vars` outlive a
//! restart of dev, kept in the crate's `.wasmkeep/dev` (issue 37). Then
//! the crate's own tests pass with `cargo test`, on the process test kit
//! (ADR 0055), with the component dev built.
//!
//! The scaffold's component builds into `target/dev-loop-test` of this
//! workspace (through `CARGO_TARGET_DIR`), kept between runs, so only the
//! first run pays for compiling the SDK.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a rebuild and redeploy of the scaffold may take before the
/// test says the watch loop failed (a cold first build takes longer and is
/// waited for apart).
const RELOAD_BOUND: Duration = Duration::from_secs(240);
const FIRST_BUILD_BOUND: Duration = Duration::from_secs(900);

fn target_dir() -> PathBuf {
    // tests/ → crates/wasmkeep → crates → the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/dev-loop-test")
        .to_path_buf()
}

struct Dev {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Dev {
    fn wait_for(&mut self, what: &str, bound: Duration, pred: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + bound;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if pred(&l) {
                        return l;
                    }
                }
                Err(_) => break,
            }
        }
        panic!(
            "dev printed no line {what} within {bound:?}; it printed:\n{}",
            self.seen.join("\n")
        );
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        // SIGTERM: the node stops cleanly and its temporary folder goes.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

fn call(base: &str, method: &str, path: &str) -> (u16, String) {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .new_agent();
    let req = ureq::http::Request::builder()
        .method(method)
        .uri(format!("{base}{path}"))
        .body(Vec::new())
        .unwrap();
    let mut resp = agent.run(req).expect("call the dev node");
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_string().unwrap_or_default())
}

#[test]
fn new_then_dev_serves_logs_and_reloads_a_saved_change() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args(["new", "tally"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let krate = dir.path().join("tally");
    for f in [
        "Cargo.toml",
        "Cargo.lock",
        "src/lib.rs",
        "tests/actor.rs",
        ".gitignore",
    ] {
        assert!(krate.join(f).is_file(), "new wrote {f}");
    }
    // A second `new` with the same name refuses, touching nothing.
    let again = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args(["new", "tally"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists already"));

    // A local secret, never deployed: the file is in the scaffold's
    // .gitignore.
    std::fs::write(
        krate.join(".dev.vars"),
        "# local\nGREETING=\"hello there\"\n",
    )
    .unwrap();
    let ignored = std::fs::read_to_string(krate.join(".gitignore")).unwrap();
    assert!(ignored.lines().any(|l| l == "/.dev.vars"), "{ignored}");
    let (mut dev, base) = spawn_dev(&krate, Some(&target_dir()));
    dev.wait_for("saying it deployed", FIRST_BUILD_BOUND, |l| {
        l.starts_with("[dev] deployed dev/tally (classes: counter)")
    });
    assert!(
        dev.seen
            .iter()
            .any(|l| l == "[dev] secrets from .dev.vars: GREETING"),
        "{}",
        dev.seen.join("\n")
    );

    let (status, body) = call(&base, "POST", "/v1/dev/tally/counter/alice/increment");
    assert_eq!((status, body.as_str()), (200, r#"{"value":1}"#));
    dev.wait_for("with the actor's log line", Duration::from_secs(30), |l| {
        l.contains("INFO  dev/tally/counter/alice  counted 1")
    });
    dev.wait_for("with the access line", Duration::from_secs(30), |l| {
        l.contains("dev/tally/counter/alice  POST /v1/dev/tally/counter/alice/increment 200")
            && l.ends_with(" ms")
    });

    // A saved change is served within the bound.
    let lib = krate.join("src/lib.rs");
    let source = std::fs::read_to_string(&lib).unwrap();
    let changed = source.replace(r#"format!("counted {n}")"#, r#"format!("tallied {n}")"#);
    let changed = changed.replace(
        r#"("GET", "/value") => {"#,
        r#"("GET", "/version") => Ok(Response::text(200, "2")),
            ("GET", "/greeting") => Ok(Response::text(
                200,
                &wasmkeep_sdk::config::get("GREETING").unwrap_or_default(),
            )),
            ("GET", "/value") => {"#,
    );
    assert_ne!(
        changed, source,
        "the scaffold's text changed: update this test"
    );
    save_and_wait_served(&mut dev, &base, &lib, &changed);
    // The actor's data survived the redeploy, and the new code runs.
    let (_, body) = call(&base, "POST", "/v1/dev/tally/counter/alice/increment");
    assert_eq!(body, r#"{"value":2}"#);
    dev.wait_for("with the new log line", Duration::from_secs(30), |l| {
        l.contains("tallied 2")
    });

    // A change that does not build: the last good deploy keeps serving.
    std::fs::write(&lib, format!("{changed}\nthis does not compile")).unwrap();
    dev.wait_for("about the failed build", RELOAD_BOUND, |l| {
        l.starts_with("[dev] build failed")
    });
    let (status, body) = call(&base, "GET", "/v1/dev/tally/counter/alice/version");
    assert_eq!(
        (status, body.as_str()),
        (200, "2"),
        "the last good deploy serves"
    );
    let (_, body) = call(&base, "GET", "/v1/dev/tally/counter/alice/greeting");
    assert_eq!(body, "hello there");

    // Dev stops and starts again: the actor's data and the secret are
    // still there, kept in the crate's folder.
    std::fs::write(&lib, &changed).unwrap();
    drop(dev);
    assert!(krate.join(".wasmkeep/dev").is_dir());
    let (mut dev, base) = spawn_dev(&krate, Some(&target_dir()));
    dev.wait_for("saying it deployed again", RELOAD_BOUND, |l| {
        l.starts_with("[dev] deployed dev/tally")
    });
    let (_, body) = call(&base, "POST", "/v1/dev/tally/counter/alice/increment");
    assert_eq!(body, r#"{"value":3}"#, "{}", dev.seen.join("\n"));
    let (_, body) = call(&base, "GET", "/v1/dev/tally/counter/alice/greeting");
    assert_eq!(body, "hello there");
    // A name taken out of .dev.vars is taken off the node at the next
    // deploy.
    std::fs::write(krate.join(".dev.vars"), "").unwrap();
    let emptied = Instant::now();
    loop {
        let (_, body) = call(&base, "GET", "/v1/dev/tally/counter/alice/greeting");
        if body.is_empty() {
            break;
        }
        assert!(
            emptied.elapsed() < RELOAD_BOUND,
            "the secret was not removed:\n{}",
            dev.seen.join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(dev);

    // The crate's own tests pass with `cargo test`: the process test kit
    // starts the binary that made the crate (its .cargo/config.toml), and
    // the component comes from the folder dev built it in.
    let component = target_dir().join("wasmkeep-component/wasm32-wasip2/release/tally.wasm");
    let built = std::fs::metadata(&component)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("dev built no {}: {e}", component.display()));
    let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["test", "--offline"])
        .env("CARGO_TARGET_DIR", target_dir())
        .env_remove("WASMKEEP_BIN")
        .current_dir(&krate)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("test result: ok. 2 passed"), "{text}");
    assert_eq!(
        std::fs::metadata(&component)
            .and_then(|m| m.modified())
            .unwrap(),
        built,
        "the component was built again, not taken from dev's build: {text}"
    );
}

/// Saves `changed` to `file` and waits until dev serves it: the change
/// adds `GET /version`, answered `2`, to the scaffold's counter.
fn save_and_wait_served(dev: &mut Dev, base: &str, file: &Path, changed: &str) {
    let saved = Instant::now();
    std::fs::write(file, changed).unwrap();
    loop {
        let (status, body) = call(base, "GET", "/v1/dev/tally/counter/alice/version");
        if status == 200 && body == "2" {
            break;
        }
        assert!(
            saved.elapsed() < RELOAD_BOUND,
            "the change was not served within {RELOAD_BOUND:?}:\n{}",
            dev.seen.join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "a saved change to {} was served after {:?}",
        file.display(),
        saved.elapsed()
    );
}

/// Starts `wasmkeep dev` in `dir` with its output read line by line.
/// `cargo_target`: where a crate's component builds.
fn spawn_dev(dir: &Path, cargo_target: Option<&Path>) -> (Dev, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wasmkeep"));
    if let Some(t) = cargo_target {
        cmd.env("CARGO_TARGET_DIR", t);
    }
    let mut child = cmd
        .args(["dev", "--listen", "127.0.0.1:0", "--poll-ms", "100"])
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut dev = Dev {
        child,
        lines: rx,
        seen: Vec::new(),
    };
    let listening = dev.wait_for("saying where it listens", Duration::from_secs(120), |l| {
        l.contains("listening on ")
    });
    let base = listening
        .split("listening on ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    (dev, base)
}

/// The same first hour in TypeScript (issue 35): `new --lang ts` writes a
/// package with its lock file, its own tests pass with `npm test` (the
/// JavaScript test kit drives a real node), and `dev` serves it, with the
/// same access and log lines, and serves a saved `.ts` change.
#[test]
fn new_ts_then_npm_test_and_dev_serve_and_reload_a_typescript_actor() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args(["new", "tally", "--lang", "ts"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let pkg = dir.path().join("tally");
    for f in [
        "package.json",
        "package-lock.json",
        "tsconfig.json",
        "src/index.ts",
        "tests/actor.test.mjs",
        ".gitignore",
    ] {
        assert!(pkg.join(f).is_file(), "new --lang ts wrote {f}");
    }
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(pkg.join("package.json")).unwrap()).unwrap();
    assert_eq!(manifest["name"], "tally");
    assert_eq!(
        manifest["devDependencies"]["typescript"], "5.9.3",
        "an exact version"
    );
    // Its own tests: `wasmkeep build`, then `node --test` on a real node.
    let test = Command::new("npm")
        .args(["test"])
        .current_dir(&pkg)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
    assert!(test.status.success(), "npm test failed:\n{said}");
    assert!(
        said.contains("# pass 2") && said.contains("# fail 0"),
        "{said}"
    );

    let (mut dev, base) = spawn_dev(&pkg, None);
    dev.wait_for("saying it deployed", FIRST_BUILD_BOUND, |l| {
        l.starts_with("[dev] deployed dev/tally (classes: counter)")
    });
    let (status, body) = call(&base, "POST", "/v1/dev/tally/counter/alice/increment");
    assert_eq!((status, body.as_str()), (200, r#"{"value":1}"#));
    dev.wait_for("with the actor's log line", Duration::from_secs(30), |l| {
        l.contains("INFO  dev/tally/counter/alice  counted 1")
    });
    dev.wait_for("with the access line", Duration::from_secs(30), |l| {
        l.contains("dev/tally/counter/alice  POST /v1/dev/tally/counter/alice/increment 200")
    });
    let index = pkg.join("src/index.ts");
    let source = std::fs::read_to_string(&index).unwrap();
    let changed = source.replace(
        r#"case "GET /value":"#,
        r#"case "GET /version":
        return Response.text("2");
      case "GET /value":"#,
    );
    assert_ne!(
        changed, source,
        "the scaffold's text changed: update this test"
    );
    save_and_wait_served(&mut dev, &base, &index, &changed);
    let (_, body) = call(&base, "POST", "/v1/dev/tally/counter/alice/increment");
    assert_eq!(
        body, r#"{"value":2}"#,
        "the actor's data survived the redeploy"
    );
}
