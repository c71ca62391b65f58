//! The CLI's client side: small HTTP calls to a node's API.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::output::{self, Output};

/// Where the node is and how to authenticate.
#[derive(clap::Args)]
pub(crate) struct Conn {
    /// The node's base URL.
    #[arg(long, env = "WASMKEEP_SERVER", default_value = "http://127.0.0.1:8080")]
    server: String,
    /// Bearer token (admin, or the tenant's for `call`) [default: none].
    #[arg(long, env = "WASMKEEP_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print the node's JSON (pretty-printed; NDJSON for `logs`) instead of
    /// tables and readable sizes and times, for scripts.
    #[arg(long)]
    pub json: bool,
}

impl Conn {
    /// A node at `server` (`wasmkeep dev`'s own).
    pub(crate) fn local(server: String, token: Option<String>) -> Conn {
        Conn {
            server,
            token,
            json: false,
        }
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent()
}

impl Conn {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.trim_end_matches('/'))
    }

    /// Sends a request with the token; the response with its body unread.
    fn open(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        self.open_with(method, path, body, &[])
    }

    /// [`Conn::open`] with extra headers.
    fn open_with(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, String)],
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let url = self.url(path);
        let mut req = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        for (name, value) in headers {
            req = req.header(*name, value);
        }
        let req = req.body(body.unwrap_or_default())?;
        agent().run(req).with_context(|| {
            format!(
                "{method} {url} (hint: is a node running there? `wasmkeep serve` or `wasmkeep dev` \
                 starts one; --server or WASMKEEP_SERVER names another)"
            )
        })
    }

    fn send(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<(u16, Vec<u8>)> {
        self.send_with(method, path, body, &[])
    }

    fn send_with(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, String)],
    ) -> Result<(u16, Vec<u8>)> {
        let mut resp = self.open_with(method, path, body, headers)?;
        let status = resp.status().as_u16();
        let bytes = resp.body_mut().with_config().limit(1 << 30).read_to_vec()?;
        Ok((status, bytes))
    }

    fn json(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<Value> {
        self.json_with(method, path, body, &[])
    }

    fn json_with(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, String)],
    ) -> Result<Value> {
        let (status, bytes) = self.send_with(method, path, body, headers)?;
        let v: Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("the node answered {status} with a body that is not JSON"))?;
        if !(200..300).contains(&status) {
            return Err(api_error(status, &bytes));
        }
        Ok(v)
    }
}

/// The node's error answer as one line: `404 app_not_found: …`.
fn api_error(status: u16, body: &[u8]) -> anyhow::Error {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let code = v["error"]["code"].as_str().unwrap_or("?");
    let msg = v["error"]["message"].as_str().unwrap_or("");
    // The message can quote a tenant's text (an SQL error naming its table).
    let msg = output::printable(msg);
    match hint(code) {
        Some(h) => anyhow::anyhow!("{status} {code}: {msg} (hint: {h})"),
        None => anyhow::anyhow!("{status} {code}: {msg}"),
    }
}

/// Whether an answer's body is the node's error shape (`{"error": {"code",
/// "message"}}`) rather than an actor's own answer.
fn is_node_error(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body).is_ok_and(|v| {
        v["error"]["code"].is_string() && v.as_object().is_some_and(|o| o.len() == 1)
    })
}

/// What to try next after the errors a person most often makes.
fn hint(code: &str) -> Option<&'static str> {
    Some(match code {
        "tenant_not_found" | "app_not_found" | "class_not_found" => {
            "`wasmkeep apps` lists the deployed apps and their classes"
        }
        "actor_not_found" => "`wasmkeep actors TENANT/APP/CLASS` lists the actors",
        "unauthorized" => "pass --token or set WASMKEEP_TOKEN",
        "invalid_name" => {
            "tenant, app and class are [a-z0-9][a-z0-9_-]*; percent-encode a name's `/` as %2F"
        }
        _ => return None,
    })
}

/// An actor's name as every command writes it and reads it: as in its URL
/// (`a%2Fb%20c` for `a/b c`), which also keeps a terminal's control
/// characters out.
fn written_name(name: &str) -> String {
    wasmkeep_store::id::encode_name(name).into_owned()
}

fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn split<const N: usize>(target: &str, what: &str) -> Result<[String; N]> {
    let parts: Vec<&str> = target.splitn(N, '/').collect();
    if parts.len() != N || parts.iter().any(|p| p.is_empty()) {
        bail!("expected {what}, got `{target}`");
    }
    Ok(std::array::from_fn(|i| parts[i].to_owned()))
}

/// What `wasmkeep deploy` deploys, and to which actors.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct DeployArgs {
    /// `tenant/app`
    pub target: String,
    /// The component (built for wasm32-wasip2).
    pub component: PathBuf,
    /// The app's TOML manifest (default: none; every limit at the
    /// node's default).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    #[command(flatten)]
    pub rollout: Rollout,
}

/// How a deploy reaches the app's actors (ADR 0059).
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct Rollout {
    /// Roll the new version out to this share of the app's actors (1 to
    /// 100, by a hash of each actor's address); the others keep running
    /// the newest whole version. Deploy the same component again with a
    /// higher share to move more actors forward; 100 (the default)
    /// finishes the rollout.
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub percent: Option<u8>,
    /// `immediate` (the default): an actor takes the new version at its
    /// next event. `deferred`: an actor open now keeps its version until
    /// it closes (idles out, or the node restarts).
    #[arg(long, value_parser = ["immediate", "deferred"])]
    pub mode: Option<String>,
    /// Before it serves, replay each sampled actor's last N recorded
    /// events against the new build (the app must record, ADR 0062) and
    /// refuse the deploy if it differs [default: no replay].
    #[arg(long, value_name = "N")]
    pub replay: Option<usize>,
    /// Actors the replay samples [default: 10].
    #[arg(long, value_name = "N", requires = "replay")]
    pub sample: Option<usize>,
    /// A difference the replay may find without refusing the deploy:
    /// `response`, `table:NAME`, `tables`, `not_reproduced`,
    /// `nothing_replayed` (no recorded event here), `incomplete` (an
    /// actor's replay stopped early) or `nodes_not_replayed` (a cluster
    /// node gave no replay); repeat it for several [default: none].
    #[arg(long, value_name = "KIND", requires = "replay")]
    pub expect: Vec<String>,
}

/// What `wasmkeep replay` runs.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ReplayArgs {
    /// `tenant/app`, `tenant/app/class` or `tenant/app/class/name`.
    pub target: String,
    /// The candidate component to replay recorded events against.
    #[arg(long = "with", value_name = "NEW.wasm")]
    pub with: PathBuf,
    /// The candidate's manifest [default: the app's current manifest].
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Replay from this recorded sequence number, Unix time in ms, or RFC
    /// 3339 time [default: each actor's oldest recorded event].
    #[arg(long)]
    pub from: Option<String>,
    /// Replay each actor's last N recorded events [default: all kept].
    #[arg(long, value_name = "N")]
    pub last: Option<usize>,
    /// Replay at most N actors, chosen by a hash of their address
    /// [default: 100, the most one replay runs].
    #[arg(long, value_name = "N")]
    pub sample: Option<usize>,
}

/// `wasmkeep replay`: what the candidate did differently, per actor; an
/// error (exit 1) when it differed, so CI can gate on it.
pub(crate) fn replay(conn: &Conn, out: Output, what: &ReplayArgs) -> Result<()> {
    let parts: Vec<&str> = what.target.split('/').collect();
    if !(2..=4).contains(&parts.len()) || parts.iter().any(|p| p.is_empty()) {
        bail!("`{}`: expected tenant/app[/class[/name]]", what.target);
    }
    let wasm =
        std::fs::read(&what.with).with_context(|| format!("read {}", what.with.display()))?;
    let mut query = Vec::new();
    if let Some(class) = parts.get(2) {
        query.push(format!("class={}", enc(class)));
    }
    if let Some(name) = parts.get(3) {
        query.push(format!("name={}", enc(name)));
    }
    if let Some(m) = &what.manifest {
        let text = std::fs::read_to_string(m).with_context(|| format!("read {}", m.display()))?;
        query.push(format!("manifest={}", enc(&text)));
    }
    if let Some(f) = &what.from {
        query.push(format!("from={}", enc(f)));
    }
    if let Some(n) = what.last {
        query.push(format!("last={n}"));
    }
    if let Some(n) = what.sample {
        query.push(format!("sample={n}"));
    }
    let mut path = format!("/admin/v1/apps/{}/{}/replay", enc(parts[0]), enc(parts[1]));
    if !query.is_empty() {
        path.push('?');
        path.push_str(&query.join("&"));
    }
    let v = conn.json("POST", &path, Some(wasm))?;
    out.print(&v, print_replay);
    let differing = v["events_differing"].as_u64().unwrap_or(0);
    let not_reproduced = v["actors_not_reproduced"].as_u64().unwrap_or(0);
    if differing > 0 || not_reproduced > 0 {
        bail!(
            "the candidate differed on {differing} events; {not_reproduced} actors could not be reproduced"
        );
    }
    let missing = v["nodes_not_replayed"].as_array().map_or(0, Vec::len);
    if missing > 0 {
        bail!(
            "{missing} cluster nodes (or the bucket's history) gave no replay: their actors were not checked"
        );
    }
    Ok(())
}

fn print_replay(v: &Value) {
    println!(
        "replayed {} events of {} actors of {}/{} against sha256 {}: {} differed",
        v["events_replayed"],
        v["actors_replayed"],
        v["tenant"].as_str().unwrap_or("?"),
        v["app"].as_str().unwrap_or("?"),
        v["candidate"]
            .as_str()
            .unwrap_or("?")
            .get(..12)
            .unwrap_or("?"),
        v["events_differing"],
    );
    for n in v["nodes_not_replayed"].as_array().into_iter().flatten() {
        println!(
            "  node {}: no replay: {}",
            n["node"].as_str().unwrap_or("?"),
            n["why"].as_str().unwrap_or("?")
        );
    }
    for a in v["actors"].as_array().into_iter().flatten() {
        // A cluster's replay names the node that replayed each actor.
        let actor = match a["node"].as_str() {
            Some(node) => format!("{} (on {node})", a["actor"].as_str().unwrap_or("?")),
            None => a["actor"].as_str().unwrap_or("?").to_owned(),
        };
        if let Some(why) = a["skipped"].as_str() {
            println!("  {actor}: skipped: {why}");
            continue;
        }
        println!(
            "  {actor}: {} events (#{}..#{}), {} differed{}",
            a["events"],
            a["first_seq"],
            a["last_seq"],
            a["events_differing"],
            if a["warm_up_events"].as_u64().unwrap_or(0) > 0 {
                format!(
                    ", after {} earlier events on the baseline",
                    a["warm_up_events"]
                )
            } else {
                String::new()
            }
        );
        if let Some(base) = a["base"].as_str() {
            println!("    started from {base}");
        }
        for (field, what) in [
            ("cut", "stopped early"),
            ("error", "failed"),
            ("tables_not_compared", "tables not compared"),
        ] {
            if let Some(why) = a[field].as_str() {
                println!("    {what}: {why}");
            }
        }
        if let Some(n) = a["not_reproduced"].as_object() {
            println!(
                "    not reproduced at #{}: production answered
{}
    the same build now answers
{}",
                n["seq"],
                indent(n["production"].as_str().unwrap_or("")),
                indent(n["candidate"].as_str().unwrap_or(""))
            );
        }
        for d in a["differences"].as_array().into_iter().flatten() {
            println!(
                "    #{} {} ({}):
      production:
{}
      candidate:
{}",
                d["seq"],
                d["what"].as_str().unwrap_or("?"),
                d["kind"].as_str().unwrap_or("?"),
                indent(d["production"].as_str().unwrap_or("")),
                indent(d["candidate"].as_str().unwrap_or(""))
            );
        }
    }
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("        {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) fn deploy(conn: &Conn, out: Output, what: &DeployArgs) -> Result<()> {
    let (component, manifest, rollout) = (&what.component, what.manifest.as_deref(), &what.rollout);
    let [tenant, app] = split::<2>(&what.target, "tenant/app")?;
    let wasm = std::fs::read(component).with_context(|| format!("read {}", component.display()))?;
    let mut query = Vec::new();
    if let Some(m) = manifest {
        let text = std::fs::read_to_string(m).with_context(|| format!("read {}", m.display()))?;
        query.push(format!("manifest={}", enc(&text)));
    }
    if let Some(p) = rollout.percent {
        query.push(format!("percent={p}"));
    }
    if let Some(m) = &rollout.mode {
        query.push(format!("mode={m}"));
    }
    if let Some(n) = rollout.replay {
        query.push(format!("replay={n}"));
    }
    if let Some(n) = rollout.sample {
        query.push(format!("sample={n}"));
    }
    if !rollout.expect.is_empty() {
        query.push(format!("expect={}", enc(&rollout.expect.join(","))));
    }
    let mut path = format!("/admin/v1/apps/{}/{}", enc(&tenant), enc(&app));
    if !query.is_empty() {
        path.push('?');
        path.push_str(&query.join("&"));
    }
    let v = conn.json_with("PUT", &path, Some(wasm), &[deployed_by()])?;
    out.print(&v, |v| {
        println!("deployed {tenant}/{app} {}", deployed_line(v))
    });
    Ok(())
}

/// Who deploys, as the node keeps it with the version: `$USER@host`.
fn deployed_by() -> (&'static str, String) {
    let user = std::env::var("USER").unwrap_or_else(|_| "?".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "?".into());
    ("wasmkeep-deployed-by", format!("{user}@{host}"))
}

/// `version N (size, sha256 …), classes: …` of a deploy's answer, and
/// the share of actors it reaches when it is a rollout.
fn deployed_line(v: &Value) -> String {
    let share = match v["percent"].as_u64() {
        Some(p) if p < 100 => format!(" to {p}% of the actors"),
        _ => String::new(),
    };
    let mode = if v["mode"] == "deferred" {
        ", deferred: open actors keep their version until they close"
    } else {
        ""
    };
    format!(
        "version {}{share} ({}, sha256 {}), classes: {}{mode}",
        v["version"].as_u64().map_or("?".into(), |n| n.to_string()),
        output::bytes(v["component_bytes"].as_u64().unwrap_or(0)),
        v["hash"].as_str().unwrap_or("?"),
        strings(&v["classes"]).join(", ")
    )
}

/// `wasmkeep versions TENANT/APP`: the kept versions, newest first.
pub(crate) fn versions(conn: &Conn, out: Output, target: &str) -> Result<()> {
    let [tenant, app] = split::<2>(target, "tenant/app")?;
    let path = format!("/admin/v1/apps/{}/{}/versions", enc(&tenant), enc(&app));
    let v = conn.json("GET", &path, None)?;
    let current = format!("{tenant}/{app}");
    out.print(&v, |v| {
        let mut rows = vec![vec![
            "VERSION".to_owned(),
            "DEPLOYED".to_owned(),
            "BY".to_owned(),
            "SIZE".to_owned(),
            "SHA256".to_owned(),
            "CLASSES".to_owned(),
            "NOTE".to_owned(),
        ]];
        let kept = v["versions"].as_array().cloned().unwrap_or_default();
        let last = kept.last().and_then(|k| k["version"].as_u64());
        for k in kept.iter().rev() {
            let n = k["version"].as_u64();
            let mut note = Vec::new();
            // Every deploy and rollback appends: the newest is deployed.
            if n == last {
                note.push("current".to_owned());
            }
            if let Some(of) = k["rollback_of"].as_u64() {
                note.push(format!("rollback to {of}"));
            }
            if let Some(p) = k["percent"].as_u64() {
                note.push(format!("rollout to {p}%"));
            }
            if k["deferred"] == true {
                note.push("deferred".to_owned());
            }
            rows.push(vec![
                n.map_or("?".into(), |n| n.to_string()),
                k["deployed_ms"].as_u64().map_or("?".into(), output::time),
                output::printable(k["by"].as_str().unwrap_or("")),
                output::bytes(k["component_bytes"].as_u64().unwrap_or(0)),
                k["hash"].as_str().unwrap_or("?").chars().take(12).collect(),
                strings(&k["classes"]).join(", "),
                note.join("; "),
            ]);
        }
        println!("{current}: {} kept", kept.len());
        output::table(&rows);
    });
    Ok(())
}

/// `wasmkeep rollback TENANT/APP [--to N]`: deploys a kept version again.
pub(crate) fn rollback(conn: &Conn, out: Output, target: &str, to: Option<u64>) -> Result<()> {
    let [tenant, app] = split::<2>(target, "tenant/app")?;
    let mut path = format!("/admin/v1/apps/{}/{}/rollback", enc(&tenant), enc(&app));
    if let Some(n) = to {
        path.push_str(&format!("?to={n}"));
    }
    let v = conn.json_with("POST", &path, None, &[deployed_by()])?;
    out.print(&v, |v| {
        println!(
            "rolled {tenant}/{app} back to version {}: deployed again as {}",
            v["rollback_of"]
                .as_u64()
                .map_or("?".into(), |n| n.to_string()),
            deployed_line(v)
        )
    });
    Ok(())
}

/// The admin API's path of an actor, every part percent-encoded.
fn admin_actor_path(id: &wasmkeep_runtime::ActorId) -> String {
    format!(
        "/admin/v1/actors/{}/{}/{}/{}",
        enc(&id.tenant),
        enc(&id.app),
        enc(&id.class),
        enc(&id.name)
    )
}

/// Largest database `export --server` downloads (the node's own
/// `database_bytes_max` is far below it).
const EXPORT_BYTES_MAX: u64 = 64 << 30;

/// `wasmkeep export TARGET -o FILE` through the node: the actor's
/// committed database, copied between two of its events on its owner.
/// Written beside `output` and checked with `PRAGMA quick_check` before it
/// takes that name, as the bucket's export is: never a half-written file.
pub(crate) fn export(conn: &Conn, target: &str, at: Option<&str>, output: &Path) -> Result<()> {
    if let Some(at) = at {
        bail!(
            "--at {at}: a node keeps only an actor's latest state; past points are read \
             from the bucket (hint: add --bucket URL, the bucket the nodes replicate to)"
        );
    }
    let id = crate::bucket::parse_actor(target)?;
    if output.exists() {
        bail!(
            "{} exists: export never overwrites a file",
            output.display()
        );
    }
    let mut resp = conn.open("GET", &format!("{}/database", admin_actor_path(&id)), None)?;
    let status = resp.status().as_u16();
    if !(200..300).contains(&status) {
        let body = resp.body_mut().with_config().limit(1 << 20).read_to_vec()?;
        return Err(api_error(status, &body));
    }
    let dir = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut part = tempfile::Builder::new()
        .prefix(".wasmkeep-export-")
        .tempfile_in(dir)
        .with_context(|| format!("make a file in {}", dir.display()))?;
    let mut body = resp
        .body_mut()
        .with_config()
        .limit(EXPORT_BYTES_MAX)
        .reader();
    let bytes = std::io::copy(&mut body, part.as_file_mut())
        .with_context(|| format!("download {id}'s database"))?;
    part.as_file().sync_all()?;
    wasmkeep_replica::quick_check(
        part.path(),
        &format!("{id}'s database from {}", conn.server),
    )
    .with_context(|| format!("the database of {id} the node sent"))?;
    part.persist_noclobber(output)
        .map_err(|e| anyhow::anyhow!("write {}: {}", output.display(), e.error))?;
    println!(
        "exported {id} from {} to {}: {}, every write it acknowledged",
        conn.server,
        output.display(),
        output::bytes(bytes)
    );
    Ok(())
}

/// The database at `input` as one file: its bytes, or, if a write-ahead
/// log with commits lies beside it (an `actor.db` copied with its
/// `actor.db-wal`: a node leaves a short log beside a closed actor's file,
/// ADR 0076), the committed database read through SQLite, which applies
/// the log. The file alone would lack those commits.
fn database_bytes(input: &Path) -> Result<Vec<u8>> {
    let mut log = input.as_os_str().to_owned();
    log.push("-wal");
    if std::fs::metadata(PathBuf::from(log)).is_ok_and(|m| m.len() > 0) {
        let image = wasmkeep_replica::Image::read_path(input)
            .with_context(|| format!("read {} with its log", input.display()))?;
        return Ok(image.into_bytes());
    }
    std::fs::read(input).with_context(|| format!("read {}", input.display()))
}

/// `wasmkeep restore TARGET -i FILE` through the node: the actor's next
/// event makes the file its database.
pub(crate) fn restore(conn: &Conn, out: Output, target: &str, input: &Path) -> Result<()> {
    let id = crate::bucket::parse_actor(target)?;
    let file = database_bytes(input)?;
    let path = format!("{}/database", admin_actor_path(&id));
    let v = conn.json("PUT", &path, Some(file))?;
    out.print(&v, |v| {
        let what = if v["replaced"] == true {
            "replaced its database"
        } else {
            "created it"
        };
        let kept = match (&v["bucket_seq"], v["kept"].as_str()) {
            (Value::Number(seq), _) => format!(
                "; the state it replaced stays in the bucket's history before seq {seq} \
                 (`wasmkeep export --at`)"
            ),
            (_, Some(p)) => format!("; the state it replaced is kept at {p}"),
            _ => String::new(),
        };
        println!(
            "restored {target} from {} ({}): {what} between two of its events{kept}",
            input.display(),
            output::bytes(v["bytes"].as_u64().unwrap_or(0))
        )
    });
    Ok(())
}

/// What `wasmkeep fork` copies, from where to where.
pub(crate) struct Fork<'a> {
    pub bucket: &'a str,
    pub settings: &'a crate::bucket::Settings,
    pub source: &'a str,
    pub target: &'a str,
    pub at: Option<&'a str>,
    pub replace: bool,
}

/// `wasmkeep fork SOURCE TARGET [--at T]`: the source's database at `at`,
/// from the bucket (`export`), made the target's through the node
/// (`restore`); the source is only read.
pub(crate) fn fork(conn: &Conn, out: Output, f: &Fork<'_>) -> Result<()> {
    let src = crate::bucket::parse_actor(f.source)?;
    let dst = crate::bucket::parse_actor(f.target)?;
    if src == dst {
        anyhow::bail!(
            "fork: the target is the source; `wasmkeep restore` puts an actor back to a point"
        );
    }
    let path = format!(
        "/admin/v1/actors/{}/{}/{}/{}",
        enc(&dst.tenant),
        enc(&dst.app),
        enc(&dst.class),
        enc(&dst.name)
    );
    let (status, body) = conn.send("GET", &path, None)?;
    match status {
        200 if !f.replace => anyhow::bail!(
            "fork: {} exists (actor_exists); pick another name, or pass --replace",
            f.target
        ),
        200 | 404 => {}
        _ => return Err(api_error(status, &body)),
    }
    let dir = tempfile::tempdir().context("a temporary folder for the copy")?;
    let file = dir.path().join("fork.db");
    crate::bucket::export(f.bucket, f.settings, f.source, f.at, &file)?;
    restore(conn, out, f.target, &file)
}

/// The strings of a JSON array (none if it is not one).
fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// `wasmkeep secret set|delete|list TENANT/APP [NAME]`; `set` reads the
/// value from standard input (a trailing newline is dropped), so that it
/// never appears in a shell's history or the process list.
pub(crate) fn secret(
    conn: &Conn,
    out: Output,
    action: &str,
    target: &str,
    name: Option<&str>,
) -> Result<()> {
    let [tenant, app] = split::<2>(target, "tenant/app")?;
    let base = format!("/admin/v1/apps/{}/{}/secrets", enc(&tenant), enc(&app));
    let named = || {
        name.map(|n| format!("{base}/{}", enc(n)))
            .ok_or_else(|| anyhow::anyhow!("`secret {action}` needs the secret's name"))
    };
    match action {
        "set" => {
            let mut value = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut value)
                .context("read the secret's value from stdin")?;
            let value = value.strip_suffix('\n').unwrap_or(&value);
            let value = value.strip_suffix('\r').unwrap_or(value);
            let (status, body) = conn.send("PUT", &named()?, Some(value.as_bytes().to_vec()))?;
            if status != 204 {
                return Err(api_error(status, &body));
            }
            println!("set {tenant}/{app} secret {}", name.unwrap_or_default());
        }
        "delete" => {
            let v = conn.json("DELETE", &named()?, None)?;
            out.print(&v, |v| {
                let what = if v["deleted"] == true {
                    "deleted"
                } else {
                    "had no"
                };
                println!("{what} {tenant}/{app} secret {}", name.unwrap_or_default())
            });
        }
        "list" => {
            let v = conn.json("GET", &base, None)?;
            out.print(&v, |v| {
                let names = strings(&v["names"]);
                if names.is_empty() {
                    println!("(no secrets)");
                }
                for n in names {
                    println!("{n}");
                }
            });
        }
        other => anyhow::bail!("unknown action `{other}`: set, delete or list"),
    }
    Ok(())
}

pub(crate) fn call(conn: &Conn, target: &str, method: &str, data: Option<String>) -> Result<()> {
    let path = format!("/v1/{}", target.trim_start_matches('/'));
    let (status, body) = conn.send(&method.to_uppercase(), &path, data.map(String::into_bytes))?;
    let failed = !(200..300).contains(&status);
    // An error in the node's shape (an unknown app, a bad name, an actor's
    // error code) is one line on stderr, as every command's; any other
    // answer is printed as the actor sent it.
    if failed && is_node_error(&body) {
        return Err(api_error(status, &body));
    }
    use std::io::Write;
    std::io::stdout().write_all(&body)?;
    if !body.ends_with(b"\n") && !body.is_empty() {
        println!();
    }
    if failed {
        eprintln!("HTTP {status}");
        std::process::exit(1);
    }
    Ok(())
}

/// What `wasmkeep actors` asks for.
#[derive(clap::Args, Debug)]
pub(crate) struct ActorsQuery {
    /// Start after this name (the `--after` a truncated listing printed;
    /// default: from the first).
    #[arg(long)]
    pub after: Option<String>,
    /// At most this many names.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    /// Only names that start with this [default: every name].
    #[arg(long)]
    pub prefix: Option<String>,
    /// In a cluster, every node's actors, read from the bucket (about two
    /// or three bucket listings an actor; README "Running a cluster"),
    /// rather than this node's.
    #[arg(long)]
    pub all: bool,
    /// Print how many there are (with `--all`, at most 10,000 counted)
    /// instead of their names.
    #[arg(long)]
    pub count: bool,
}

pub(crate) fn actors(conn: &Conn, out: Output, target: &str, q: ActorsQuery) -> Result<()> {
    let [t, a, c] = split::<3>(target, "tenant/app/class")?;
    let mut path = format!(
        "/admin/v1/actors/{}/{}/{}?limit={}&all={}&count={}",
        enc(&t),
        enc(&a),
        enc(&c),
        q.limit,
        q.all,
        q.count
    );
    for (flag, value) in [("after", q.after), ("prefix", q.prefix)] {
        if let Some(v) = value {
            let v = wasmkeep_store::id::decode_name(&v)
                .map_err(|why| anyhow::anyhow!("--{flag} `{v}`: {why}"))?;
            path.push_str(&format!("&{flag}={}", enc(&v)));
        }
    }
    let v = conn.json("GET", &path, None)?;
    if q.count {
        out.print(&v, |v| {
            let n = v["count"].as_u64().unwrap_or(0);
            match v["complete"].as_bool() {
                Some(false) => println!("at least {n} (counting stops there)"),
                _ => println!("{n}"),
            }
        });
        return Ok(());
    }
    out.print(&v, |v| {
        for name in strings(&v["actors"]) {
            println!("{t}/{a}/{c}/{}", written_name(name));
        }
        if let Some(next) = v["next"].as_str() {
            eprintln!("(more: --after {})", written_name(next));
        }
    });
    Ok(())
}

/// What `inspect` shows besides the actor's summary.
pub(crate) enum InspectWhat {
    Summary,
    Sql(String),
    Tables,
    /// The SDKs' workflow instances, with their recorded steps.
    Workflows,
    /// The actor's key-value pairs (`kv.*`), keys from `prefix`, at most
    /// `limit`.
    Kv {
        prefix: String,
        limit: usize,
    },
}

pub(crate) fn inspect(conn: &Conn, out: Output, target: &str, what: InspectWhat) -> Result<()> {
    let base = admin_actor_path(&crate::bucket::parse_actor(target)?);
    let kv = matches!(what, InspectWhat::Kv { .. });
    let sql = match what {
        InspectWhat::Summary => {
            let v = conn.json("GET", &base, None)?;
            out.print(&v, print_actor);
            return Ok(());
        }
        InspectWhat::Sql(sql) => sql,
        InspectWhat::Tables => "SELECT type, name, sql FROM sqlite_schema ORDER BY name".into(),
        InspectWhat::Workflows => {
            let has = "SELECT 1 FROM sqlite_schema WHERE name = 'wasmkeep_sdk_workflows'";
            let v = conn.json(
                "POST",
                &format!("{base}/sql"),
                Some(has.as_bytes().to_vec()),
            )?;
            let columns = "id, workflow, state, step, failures, wake_ms, error, steps";
            if v["rows"].as_array().is_none_or(|r| r.is_empty()) {
                // The actor never started one: the same columns, no rows.
                format!(
                    "SELECT {} WHERE 0",
                    columns
                        .split(", ")
                        .map(|c| format!("NULL AS {c}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                "SELECT w.id, w.workflow, w.state, w.step, w.failures, w.wake_ms, w.error, \
             (SELECT group_concat(s.name || ':' || s.attempts, ' ') FROM \
             (SELECT name, attempts FROM wasmkeep_sdk_workflow_steps WHERE id = w.id ORDER BY step) s) AS steps \
             FROM wasmkeep_sdk_workflows w ORDER BY w.updated_ms DESC"
                    .into()
            }
        }
        // Keys are stored as the UTF-8 bytes of the SDK's string keys;
        // the prefix is matched on those bytes.
        InspectWhat::Kv { prefix, limit } => format!(
            "SELECT key, value FROM _wasmkeep_kv WHERE substr(key, 1, {}) = x'{}' \
             ORDER BY key LIMIT {limit}",
            prefix.len(),
            hex::encode(prefix.as_bytes())
        ),
    };
    let mut v = conn.json("POST", &format!("{base}/sql"), Some(sql.into_bytes()))?;
    if kv {
        decode_kv(&mut v);
    }
    out.print(&v, |v| {
        let mut rows = vec![
            strings(&v["columns"])
                .iter()
                .map(|c| output::printable(&c.to_uppercase()))
                .collect(),
        ];
        for row in v["rows"].as_array().into_iter().flatten() {
            rows.push(
                row.as_array()
                    .into_iter()
                    .flatten()
                    .map(output::cell)
                    .collect(),
            );
        }
        output::table(&rows);
        if rows.len() == 1 {
            println!("(no rows)");
        }
    });
    Ok(())
}

/// Key-value pairs as the SDKs wrote them: keys and values that are UTF-8
/// become JSON strings (in `--json` too, as the table shows them); others
/// stay `{"blob_hex": …}`.
fn decode_kv(v: &mut Value) {
    for cell in v["rows"]
        .as_array_mut()
        .into_iter()
        .flatten()
        .flat_map(|r| r.as_array_mut().into_iter().flatten())
    {
        let text = cell["blob_hex"]
            .as_str()
            .and_then(|h| hex::decode(h).ok())
            .and_then(|b| String::from_utf8(b).ok());
        if let Some(text) = text {
            *cell = Value::String(text);
        }
    }
}

/// An actor's summary, one field a line.
fn print_actor(v: &Value) {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut row = |k: &str, val: String| rows.push(vec![k.to_owned(), val]);
    row(
        "actor",
        format!(
            "{}/{}/{}/{}",
            v["tenant"].as_str().unwrap_or("?"),
            v["app"].as_str().unwrap_or("?"),
            v["class"].as_str().unwrap_or("?"),
            written_name(v["name"].as_str().unwrap_or("?"))
        ),
    );
    let active = if v["active"] == true {
        "yes (in memory)"
    } else {
        "no (on disk only)"
    };
    row("active", active.into());
    if let Some(n) = v["version"].as_u64() {
        row("app version", n.to_string());
    }
    row(
        "database",
        output::bytes(v["database_bytes"].as_u64().unwrap_or(0)),
    );
    let written = v["last_write_ms"]
        .as_u64()
        .map_or("never".into(), output::time);
    row("last write", written);
    let alarm = match v["alarm_ms"].as_u64() {
        None => "none".into(),
        Some(at) => match v["alarm_retry_count"].as_u64().unwrap_or(0) {
            0 => output::time(at),
            r => format!("{} (retry {r} after failures)", output::time(at)),
        },
    };
    row("alarm", alarm);
    if let Some(m) = v["sqlite_memory"].as_object() {
        let part = |k: &str| output::bytes(m.get(k).and_then(Value::as_u64).unwrap_or(0));
        row(
            "sqlite memory",
            format!(
                "cache {}, schema {}, statements {}, WAL index {}",
                part("cache_bytes"),
                part("schema_bytes"),
                part("statement_bytes"),
                part("wal_index_bytes")
            ),
        );
    }
    for (key, label) in [
        ("alarm_indexed", "alarm index"),
        ("owner_fence", "owner fence"),
    ] {
        if let Some(s) = v[key].as_str() {
            row(label, s.to_owned());
        }
    }
    output::table(&rows);
}

pub(crate) fn alarms(conn: &Conn, out: Output, tenant: &str, limit: usize) -> Result<()> {
    let v = conn.json(
        "GET",
        &format!("/admin/v1/alarms/{}?limit={limit}", enc(tenant)),
        None,
    )?;
    out.print(&v, |v| {
        let alarms = v["alarms"].as_array().cloned().unwrap_or_default();
        if alarms.is_empty() {
            println!("(no pending alarms)");
        } else {
            let mut rows = vec![vec!["DUE".to_owned(), "ACTOR".to_owned()]];
            for a in &alarms {
                rows.push(vec![
                    a["alarm_ms"].as_u64().map_or("?".into(), output::time),
                    address(a, ""),
                ]);
            }
            output::table(&rows);
        }
        // A cluster node: the bucket's index, which every node's sweep reads.
        if let Some(index) = v["index"].as_array() {
            println!();
            println!("the bucket's alarm index:");
            let mut rows = vec![vec![
                "DUE".to_owned(),
                "ACTOR".to_owned(),
                "GENERATION".to_owned(),
                "NONCE".to_owned(),
            ]];
            for e in index {
                rows.push(vec![
                    e["due_ms"].as_u64().map_or("?".into(), output::time),
                    address(e, "(tenant-wide)"),
                    e["generation"].to_string(),
                    e["nonce"].as_str().unwrap_or("-").to_owned(),
                ]);
            }
            output::table(&rows);
        }
    });
    Ok(())
}

/// `app/class/name` of a listed alarm (`no_app` when it names none), the
/// name escaped for the terminal.
fn address(v: &Value, no_app: &str) -> String {
    format!(
        "{}/{}/{}",
        v["app"].as_str().unwrap_or(no_app),
        v["class"].as_str().unwrap_or(""),
        written_name(v["name"].as_str().unwrap_or(""))
    )
}

pub(crate) fn apps(conn: &Conn, out: Output) -> Result<()> {
    let v = conn.json("GET", "/admin/v1/apps", None)?;
    out.print(&v, |v| {
        let apps = v["apps"].as_array().cloned().unwrap_or_default();
        if apps.is_empty() {
            println!("(no apps deployed)");
            return;
        }
        let mut rows = vec![vec![
            "APP".to_owned(),
            "CLASSES".to_owned(),
            "SIZE".to_owned(),
            "DEPLOYED".to_owned(),
            "SHA256".to_owned(),
        ]];
        for a in &apps {
            rows.push(vec![
                format!(
                    "{}/{}",
                    a["tenant"].as_str().unwrap_or("?"),
                    a["app"].as_str().unwrap_or("?")
                ),
                strings(&a["classes"]).join(", "),
                output::bytes(a["component_bytes"].as_u64().unwrap_or(0)),
                a["deployed_ms"].as_u64().map_or("?".into(), output::time),
                a["hash"].as_str().unwrap_or("?").chars().take(12).collect(),
            ]);
        }
        output::table(&rows);
    });
    Ok(())
}

/// `wasmkeep logs SCOPE`: the node's kept lines about a tenant, app, class
/// or actor, then, with `follow`, each new one as it comes (until the node
/// stops or Ctrl-C). One line each: time (UTC), level, actor, message;
/// `--json` prints the node's NDJSON as it is.
pub(crate) fn logs(
    conn: &Conn,
    out: Output,
    scope: &str,
    follow: bool,
    level: &str,
    lines: usize,
) -> Result<()> {
    let parts: Vec<&str> = scope.splitn(4, '/').collect();
    if parts.iter().any(|p| p.is_empty()) {
        bail!("expected TENANT[/APP[/CLASS[/NAME]]], got `{scope}`");
    }
    let mut path: Vec<String> = parts.iter().map(|p| enc(p)).collect();
    if let Some(name) = parts.get(3) {
        let name = wasmkeep_store::id::decode_name(name)
            .map_err(|why| anyhow::anyhow!("invalid_name: the name in `{scope}`: {why}"))?;
        path[3] = enc(&name);
    }
    let url = format!(
        "/admin/v1/logs/{}?follow={follow}&level={}&lines={lines}",
        path.join("/"),
        enc(level)
    );
    let mut resp = conn.open("GET", &url, None)?;
    let status = resp.status().as_u16();
    if status != 200 {
        let body = resp.body_mut().with_config().limit(1 << 20).read_to_vec()?;
        return Err(api_error(status, &body));
    }
    let reader = std::io::BufReader::new(resp.into_body().into_reader());
    use std::io::{BufRead, Write};
    let mut stdout = std::io::stdout();
    for line in reader.lines() {
        let line = line.context("read the node's log stream")?;
        if line.is_empty() {
            continue; // a heartbeat
        }
        if out.json {
            writeln!(stdout, "{line}")?;
        } else {
            let v: Value = serde_json::from_str(&line)
                .with_context(|| format!("a log line that is not JSON: {line}"))?;
            writeln!(stdout, "{}", log_line(&v))?;
        }
        stdout.flush()?;
    }
    Ok(())
}

/// One NDJSON log line for a person.
pub(crate) fn log_line(v: &Value) -> String {
    if let Some(n) = v["missed"].as_u64() {
        return format!("(missed {n} lines: this reader fell behind)");
    }
    let a = &v["actor"];
    format!(
        "{} {:<5} {}/{}/{}/{}  {}",
        output::clock(v["at_ms"].as_u64().unwrap_or(0)),
        v["level"].as_str().unwrap_or("?").to_uppercase(),
        a["tenant"].as_str().unwrap_or("?"),
        a["app"].as_str().unwrap_or("?"),
        a["class"].as_str().unwrap_or("?"),
        written_name(a["name"].as_str().unwrap_or("?")),
        output::indented(v["message"].as_str().unwrap_or(""), 4)
    )
}

/// `wasmkeep cluster`: the live nodes as the bucket shows them, one line a
/// node, with the actors each holds (the answering node asked every other
/// live node; `?` for one that did not answer it within 2 s).
pub(crate) fn cluster(conn: &Conn, out: Output) -> Result<()> {
    let v = conn
        .json("GET", "/admin/v1/cluster", None)
        .context("read the cluster view")?;
    if out.json {
        out.print(&v, |_| {});
        return Ok(());
    }
    let nodes = v["nodes"].as_array().cloned().unwrap_or_default();
    let mut rows = vec![[
        "NODE".to_owned(),
        "ADDRESS".to_owned(),
        "EPOCH".to_owned(),
        "LEASE AGE".to_owned(),
        "EXPIRES IN".to_owned(),
        "HELD".to_owned(),
    ]];
    for n in &nodes {
        let me = n["self"] == true;
        let address = n["address"].as_str().unwrap_or("?");
        let held = n["held_actors"]
            .as_u64()
            .map_or("?".into(), |h| h.to_string());
        let node = n["node"].as_str().unwrap_or("?");
        rows.push([
            if me {
                format!("{node} *")
            } else {
                node.to_owned()
            },
            address.to_owned(),
            n["epoch"].to_string(),
            seconds(&n["lease_age_ms"]),
            seconds(&n["expires_in_ms"]),
            held,
        ]);
    }
    let rows: Vec<Vec<String>> = rows.into_iter().map(Vec::from).collect();
    output::table(&rows);
    let mut notes = vec![format!("{} live", nodes.len())];
    for (key, what) in [("not_live", "not live"), ("unreadable", "unreadable")] {
        if let Some(k) = v[key].as_u64().filter(|k| *k > 0) {
            notes.push(format!("{k} {what}"));
        }
    }
    if v["truncated"] == true {
        notes.push("more nodes than the view lists".into());
    }
    println!("({}; * the node that answered)", notes.join(", "));
    Ok(())
}

/// `wasmkeep drain NODE`: starts (or, `undo`, ends) the node's drain, then
/// waits up to `wait_ms` for it to hold no actor, printing what it holds as
/// that changes.
pub(crate) fn drain(conn: &Conn, out: Output, node: &str, undo: bool, wait_ms: u64) -> Result<()> {
    let server = if node.contains("://") {
        node.trim_end_matches('/').to_owned()
    } else {
        let v = conn
            .json("GET", "/admin/v1/cluster", None)
            .context("read the cluster view to find the node")?;
        let nodes = v["nodes"].as_array().cloned().unwrap_or_default();
        let found = nodes.iter().find(|n| n["node"] == node);
        let Some(address) = found.and_then(|n| n["address"].as_str()) else {
            anyhow::bail!(
                "no live node `{node}` in the cluster as {} sees it (`wasmkeep cluster` lists them)",
                conn.server
            );
        };
        address.to_owned()
    };
    let target = Conn {
        server,
        token: conn.token.clone(),
        json: conn.json,
    };
    let method = if undo { "DELETE" } else { "POST" };
    let v = target
        .json(method, "/admin/v1/node/drain", None)
        .with_context(|| format!("ask {} to drain", target.server))?;
    if undo || wait_ms == 0 {
        out.print(&v, |v| {
            let what = if undo {
                "ended the drain of"
            } else {
                "draining"
            };
            println!("{what} {} (holds {})", target.server, v["held_actors"]);
        });
        return Ok(());
    }
    let start = wasmkeep_runtime::clock::instant();
    let mut last = None;
    loop {
        let n = target
            .json("GET", "/admin/v1/node", None)
            .context("read the node's state")?;
        let held = n["cluster"]["held_actors"].as_u64().unwrap_or(u64::MAX);
        if last != Some(held) && !out.json {
            println!("{}: holds {held} actors", target.server);
            last = Some(held);
        }
        if held == 0 {
            out.print(&n, |_| {
                println!(
                    "drained {}: it holds no actor and forwards what reaches it; stop it now, \
                     or end the drain with `wasmkeep drain {node} --undo`",
                    target.server
                );
            });
            return Ok(());
        }
        if start.elapsed() >= std::time::Duration::from_millis(wait_ms) {
            anyhow::bail!(
                "{} still holds {held} actors after --wait-ms={wait_ms}; the drain goes on \
                 (run the command again to keep waiting)",
                target.server
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Milliseconds as seconds with one decimal (`-0.4 s` for a lease in its
/// grace).
fn seconds(ms: &Value) -> String {
    ms.as_i64()
        .map_or("?".into(), |ms| format!("{:.1} s", ms as f64 / 1000.0))
}
