//! `wasmkeep dev [PATH]`: the inner loop for one actor project, a Rust
//! crate or a TypeScript package.
//!
//! It starts a node (its data in the project's `.wasmkeep/dev` folder,
//! kept across runs, unless `--data` names another or `--temp` asks for a
//! throwaway one; the access log on), builds the project as `wasmkeep build` does
//! ([`project::build`]: a crate with the test kit's own build function,
//! so a test and the dev loop build alike; a TypeScript package with the
//! SDK's esbuild and componentize-qjs chain),
//! deploys it as `TENANT/APP` straight into the node's runtime, then looks
//! for saved changes every `--poll-ms` and builds and deploys again. A
//! failed build keeps the last good deploy serving. What the node knows
//! about the app (each request with its status and duration, the actor's
//! own log lines, failed alarms) is printed as it happens, by the same
//! code as `wasmkeep logs --follow`, reading the node's own log stream.
//!
//! Two files of the project configure the app on the dev node, read at
//! every deploy: `wasmkeep.toml`, the app's manifest (as `deploy
//! --manifest` sends it), and `.dev.vars`, its secrets for local runs
//! (`NAME=value` lines; never sent by `deploy`, so a production secret
//! is never deployed from a laptop's file).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use wasmkeep_runtime::Runtime;

use crate::client::{self, Conn};
use crate::config::NodeConfig;
use crate::output::Output;
use crate::project;

/// Files the watcher looks at, at most; past it a warning says the rest
/// are not watched.
pub(crate) const WATCH_FILES_MAX: usize = 10_000;

#[derive(clap::Args)]
pub(crate) struct DevArgs {
    /// The actor project, a crate or a TypeScript package [default: the
    /// current directory].
    path: Option<PathBuf>,
    /// The tenant to deploy as.
    #[arg(long, default_value = "dev")]
    tenant: String,
    /// The app to deploy as [default: the crate's package name].
    #[arg(long)]
    app: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: std::net::SocketAddr,
    /// The node's data folder, kept after dev stops [default: the
    /// project's `.wasmkeep/dev`].
    #[arg(long, conflicts_with = "temp")]
    data: Option<PathBuf>,
    /// Keep the node's data in a temporary folder, removed when dev stops.
    #[arg(long)]
    temp: bool,
    /// A node configuration file, as for `serve --config` [default: none].
    #[arg(long)]
    config: Option<PathBuf>,
    /// How often to look for saved changes, in milliseconds.
    #[arg(long, default_value_t = 300)]
    poll_ms: u64,
    /// The lowest level of the app's log lines printed: trace, debug,
    /// info, warn or error.
    #[arg(long, default_value = "debug")]
    level: String,
}

pub(crate) fn run(args: DevArgs) -> Result<()> {
    let dir = match &args.path {
        Some(p) => p.clone(),
        None => std::env::current_dir().context("find the current directory")?,
    };
    let dir = dir
        .canonicalize()
        .with_context(|| format!("the actor project {}", dir.display()))?;
    let package = project::name(&dir)?;
    let app = args.app.clone().unwrap_or_else(|| package.clone());
    wasmkeep_runtime::ActorId::new(&args.tenant, &app, "class", "name").map_err(|e| {
        anyhow::anyhow!(
            "cannot deploy as {}/{app}: {e}; pass --tenant/--app",
            args.tenant
        )
    })?;
    if wasmkeep_runtime::logs::Level::parse(&args.level).is_none() {
        bail!(
            "--level `{}`: use trace, debug, info, warn or error",
            args.level
        );
    }
    // The node's own log shows only its errors: the app's lines, requests
    // and failed alarms are printed from its log stream instead.
    crate::init_tracing(
        "error,guest=off,wasmkeep::access=off,wasmkeep::request=off,cranelift=off,wasmtime=off",
    );
    let mut cfg = match &args.config {
        Some(p) => NodeConfig::load(p)?,
        None => NodeConfig::default(),
    };
    cfg.listen = args.listen;
    cfg.access_log = true;
    // Actors, secrets and alarms outlive a restart of dev by default, as
    // a local Durable Objects run keeps its state.
    let _temp = match (&args.data, args.temp) {
        (Some(d), _) => {
            cfg.data = d.clone();
            None
        }
        (None, true) => {
            let t = tempfile::Builder::new()
                .prefix("wasmkeep-dev-")
                .tempdir()
                .context("make a temporary data folder")?;
            cfg.data = t.path().to_path_buf();
            Some(t)
        }
        (None, false) => {
            cfg.data = dir.join(".wasmkeep").join("dev");
            None
        }
    };
    // A dev node calls the stubs and services on this machine unless a
    // configuration file says otherwise.
    if args.config.is_none() {
        cfg.outbound_private_allowed = true;
    }
    println!(
        "[dev] data in {}{}",
        cfg.data.display(),
        if args.temp {
            " (removed when dev stops)"
        } else {
            " (kept: `--temp` for a throwaway node)"
        }
    );
    let job = Job {
        data: cfg.data.clone(),
        dev_vars_applied: std::cell::RefCell::new(None),
        dir,
        token: cfg.admin_token.clone(),
        tenant: args.tenant.clone(),
        app,
        poll: Duration::from_millis(args.poll_ms.max(10)),
        level: args.level.clone(),
    };
    crate::run_node(
        cfg,
        false,
        Some(Box::new(move |rt, addr| {
            std::thread::Builder::new()
                .name("wasmkeep-dev".into())
                .spawn(move || job.run(rt, addr))
                .expect("spawn the dev loop");
        })),
        None,
    )
}

struct Job {
    dir: PathBuf,
    /// The node's data folder (where the names `.dev.vars` set are kept).
    data: PathBuf,
    /// The text of `.dev.vars` the last build applied.
    dev_vars_applied: std::cell::RefCell<Option<String>>,
    /// The node's admin token, if its configuration sets one.
    token: Option<String>,
    tenant: String,
    app: String,
    poll: Duration,
    level: String,
}

impl Job {
    fn run(self, rt: Runtime, addr: std::net::SocketAddr) {
        let base = crate::local_base(addr);
        println!(
            "[dev] {} as {}/{} on {base}; watching for changes (Ctrl-C stops)",
            self.dir.display(),
            self.tenant,
            self.app
        );
        let mut seen = fingerprint(&self.dir);
        let mut following = false;
        loop {
            if let Some(classes) = self.build_and_deploy(&rt)
                && !following
            {
                following = true;
                let scope = format!("{}/{}", self.tenant, self.app);
                println!(
                    "[dev] actors answer at {base}/v1/{scope}/{}/NAME/PATH (NAME: any actor; \
                     PATH: a route of the class)",
                    classes[0]
                );
                let conn = Conn::local(base.clone(), self.token.clone());
                let level = self.level.clone();
                std::thread::spawn(move || {
                    let out = Output { json: false };
                    // From the kept lines on (this node's ring holds only
                    // this app's), so a request made before the stream is
                    // open is not missed.
                    let kept = wasmkeep_server::LOG_LINES_DEFAULT;
                    if let Err(e) = client::logs(&conn, out, &scope, true, &level, kept) {
                        eprintln!("[dev] the log stream ended: {e:#}");
                    }
                });
            }
            // Wait for a change, then for the files to settle (an editor
            // may write in several steps).
            loop {
                std::thread::sleep(self.poll);
                let now = fingerprint(&self.dir);
                if now != seen {
                    std::thread::sleep(Duration::from_millis(100));
                    seen = fingerprint(&self.dir);
                    break;
                }
            }
            println!("[dev] change seen; building");
        }
    }

    /// Builds and deploys; the classes deployed, or `None` after saying
    /// why not (the previous deploy keeps serving).
    fn build_and_deploy(&self, rt: &Runtime) -> Option<Vec<String>> {
        let started = wasmkeep_runtime::clock::instant();
        let wasm = match project::build(&self.dir) {
            Ok(path) => match std::fs::read(&path) {
                Ok(w) => w,
                Err(e) => {
                    eprintln!("[dev] read {}: {e}", path.display());
                    return None;
                }
            },
            Err(e) => {
                println!("[dev] build failed: {e}");
                return None;
            }
        };
        let built = started.elapsed();
        if let Err(e) = self.apply_dev_vars(rt) {
            println!("[dev] {e:#}; not deployed");
            return None;
        }
        let manifest_path = self.dir.join(MANIFEST_FILE);
        let manifest = match std::fs::read_to_string(&manifest_path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                eprintln!("[dev] read {}: {e}", manifest_path.display());
                return None;
            }
        };
        match rt.deploy(&self.tenant, &self.app, &wasm, &manifest) {
            Ok(info) => {
                println!(
                    "[dev] deployed {}/{} (classes: {}) built in {:.1} s, deployed in {:.1} s",
                    self.tenant,
                    self.app,
                    info.classes.join(", "),
                    built.as_secs_f64(),
                    (started.elapsed() - built).as_secs_f64()
                );
                Some(info.classes)
            }
            Err(e) => {
                println!("[dev] deploy refused: {} ({})", e, e.code());
                None
            }
        }
    }
}

impl Job {
    /// Makes `.dev.vars` the app's secrets on this node: each line's secret
    /// set, and each one an earlier `.dev.vars` set that it no longer
    /// names removed (those names are kept in the data folder, so a
    /// secret set with `wasmkeep secret set` is left alone).
    fn apply_dev_vars(&self, rt: &Runtime) -> Result<()> {
        let path = self.dir.join(DEV_VARS_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
        };
        let vars = parse_dev_vars(&text).with_context(|| path.display().to_string())?;
        let names_path = self.data.join(DEV_VARS_NAMES_FILE);
        let before = std::fs::read_to_string(&names_path).unwrap_or_default();
        // Each set is a durable write: none while the file is as it was at
        // the last build.
        if self.dev_vars_applied.borrow().as_deref() == Some(text.as_str()) {
            return Ok(());
        }
        let secrets = rt.secrets();
        for (name, value) in &vars {
            secrets
                .set(&self.tenant, &self.app, name, value)
                .map_err(|e| anyhow::anyhow!("{}: {name}: {e}", path.display()))?;
        }
        for gone in before.lines().filter(|n| !vars.iter().any(|(v, _)| v == n)) {
            secrets
                .delete(&self.tenant, &self.app, gone)
                .map_err(|e| anyhow::anyhow!("remove the secret {gone}: {e}"))?;
        }
        let names: String = vars.iter().map(|(n, _)| format!("{n}\n")).collect();
        if names != before {
            std::fs::create_dir_all(&self.data)?;
            std::fs::write(&names_path, names)
                .with_context(|| format!("write {}", names_path.display()))?;
            if !vars.is_empty() {
                println!(
                    "[dev] secrets from {DEV_VARS_FILE}: {}",
                    vars.iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        *self.dev_vars_applied.borrow_mut() = Some(text);
        Ok(())
    }
}

/// The app's manifest in a project, deployed with every build.
pub(crate) const MANIFEST_FILE: &str = "wasmkeep.toml";
/// The app's secrets for local runs in a project (never deployed).
pub(crate) const DEV_VARS_FILE: &str = ".dev.vars";
/// In the dev node's data folder: the names `.dev.vars` set last.
const DEV_VARS_NAMES_FILE: &str = "dev-vars.names";

/// `.dev.vars`: `NAME=value` per line; blank lines and lines starting
/// with `#` are skipped; spaces around the name and the value are
/// trimmed, and a value wholly in double or single quotes loses them (no
/// escapes: a value is one line). A later line for a name replaces an
/// earlier one.
fn parse_dev_vars(text: &str) -> Result<Vec<(String, String)>> {
    let mut vars: Vec<(String, String)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            bail!("line {}: expected NAME=value", i + 1);
        };
        let name = name.trim().trim_start_matches("export ").trim();
        let value = value.trim();
        let value = [('"', '"'), ('\'', '\'')]
            .iter()
            .find_map(|&(a, b)| {
                (value.len() >= 2 && value.starts_with(a) && value.ends_with(b))
                    .then(|| &value[1..value.len() - 1])
            })
            .unwrap_or(value);
        vars.retain(|(n, _)| n != name);
        vars.push((name.to_owned(), value.to_owned()));
    }
    Ok(vars)
}

/// What the watcher compares: every watched file's path, size and time of
/// last change. Build output and installed packages at the root
/// ([`project::unwatched`]) and hidden files and folders are not watched.
fn fingerprint(dir: &Path) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut stack = vec![dir.to_path_buf()];
    let mut files = 0usize;
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        let mut entries: Vec<_> = rd.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name();
            let name = name.to_string_lossy();
            // Cargo writes Cargo.lock itself during a build.
            let at_root = d == dir;
            let hidden = name.starts_with('.') && !(at_root && name == DEV_VARS_FILE);
            if hidden || (at_root && project::unwatched(&name)) {
                continue;
            }
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(e.path());
                continue;
            }
            files += 1;
            if files > WATCH_FILES_MAX {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    println!(
                        "[dev] more than {WATCH_FILES_MAX} files under {}: the rest are not watched",
                        dir.display()
                    )
                });
                return h.finish();
            }
            e.path().hash(&mut h);
            meta.len().hash(&mut h);
            meta.modified()
                .unwrap_or(SystemTime::UNIX_EPOCH)
                .hash(&mut h);
        }
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_file_changes_the_fingerprint_and_target_does_not() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("src")).unwrap();
        std::fs::create_dir_all(d.path().join("target/x")).unwrap();
        std::fs::write(d.path().join("src/lib.rs"), "a").unwrap();
        let first = fingerprint(d.path());
        std::fs::write(d.path().join("target/x/out"), "built").unwrap();
        std::fs::write(d.path().join(".hidden"), "x").unwrap();
        std::fs::create_dir_all(d.path().join("node_modules/esbuild")).unwrap();
        std::fs::write(d.path().join("node_modules/esbuild/x.js"), "1").unwrap();
        assert_eq!(
            fingerprint(d.path()),
            first,
            "target/, node_modules/ and hidden files are not watched"
        );
        std::fs::write(d.path().join("src/lib.rs"), "ab").unwrap();
        assert_ne!(fingerprint(d.path()), first);
        let second = fingerprint(d.path());
        std::fs::write(d.path().join(DEV_VARS_FILE), "A=1").unwrap();
        assert_ne!(fingerprint(d.path()), second, ".dev.vars is watched");
    }

    #[test]
    fn dev_vars_are_name_value_lines() {
        let vars = parse_dev_vars(
            "# local only\n\nAPI_KEY = abc=def\nexport TOKEN=\"x y\"\nQ='1'\nAPI_KEY=second\n",
        )
        .unwrap();
        assert_eq!(
            vars,
            [
                ("TOKEN".to_owned(), "x y".to_owned()),
                ("Q".to_owned(), "1".to_owned()),
                ("API_KEY".to_owned(), "second".to_owned()),
            ]
        );
        let e = parse_dev_vars("A=1\njust a line\n").unwrap_err();
        assert_eq!(e.to_string(), "line 2: expected NAME=value");
    }
}
