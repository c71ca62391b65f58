//! `wasmkeep dev [PATH]`: the inner loop for one actor project, a Rust
//! crate or a TypeScript package.
//!
//! It starts a node (a temporary data folder unless `--data` names one,
//! the access log on), builds the project as `wasmkeep build` does
//! ([`project::build`]: a crate with the test kit's own build function,
//! so a test and the dev loop build alike; a TypeScript package with the
//! SDK's esbuild and componentize-qjs chain),
//! deploys it as `TENANT/APP` straight into the node's runtime, then looks
//! for saved changes every `--poll-ms` and builds and deploys again. A
//! failed build keeps the last good deploy serving. What the node knows
//! about the app (each request with its status and duration, the actor's
//! own log lines, failed alarms) is printed as it happens, by the same
//! code as `wasmkeep logs --follow`, reading the node's own log stream.

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
    /// The node's data folder, kept after dev stops [default: a temporary
    /// folder, removed when dev stops].
    #[arg(long)]
    data: Option<PathBuf>,
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
    let _temp = match &args.data {
        Some(d) => {
            cfg.data = d.clone();
            None
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("wasmkeep-dev-")
                .tempdir()
                .context("make a temporary data folder")?;
            cfg.data = t.path().to_path_buf();
            Some(t)
        }
    };
    let job = Job {
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
                println!("[dev] try: curl {base}/v1/{scope}/{}/NAME/", classes[0]);
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
        let manifest_path = self.dir.join("wasmkeep.toml");
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
            if name.starts_with('.') || (at_root && project::unwatched(&name)) {
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
    }
}
