//! The CLI's client side: small HTTP calls to a node's API.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Where the node is and how to authenticate.
#[derive(clap::Args)]
pub struct Conn {
    /// The node's base URL.
    #[arg(long, env = "WASMKEEP_SERVER", default_value = "http://127.0.0.1:8080")]
    server: String,
    /// Bearer token (admin, or the tenant's for `call`).
    #[arg(long, env = "WASMKEEP_TOKEN", hide_env_values = true)]
    token: Option<String>,
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

    fn send(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<(u16, Vec<u8>)> {
        let url = self.url(path);
        let mut req = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req.body(body.unwrap_or_default())?;
        let mut resp = agent()
            .run(req)
            .with_context(|| format!("{method} {url}"))?;
        let status = resp.status().as_u16();
        let bytes = resp.body_mut().with_config().limit(1 << 30).read_to_vec()?;
        Ok((status, bytes))
    }

    fn json(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<Value> {
        let (status, bytes) = self.send(method, path, body)?;
        let v: Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("the node answered {status} with a body that is not JSON"))?;
        if !(200..300).contains(&status) {
            let code = v["error"]["code"].as_str().unwrap_or("?");
            let msg = v["error"]["message"].as_str().unwrap_or("");
            bail!("{status} {code}: {msg}");
        }
        Ok(v)
    }
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

fn print(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

pub fn deploy(conn: &Conn, target: &str, component: &Path, manifest: Option<&Path>) -> Result<()> {
    let [tenant, app] = split::<2>(target, "tenant/app")?;
    let wasm = std::fs::read(component).with_context(|| format!("read {}", component.display()))?;
    let mut path = format!("/admin/v1/apps/{}/{}", enc(&tenant), enc(&app));
    if let Some(m) = manifest {
        let text = std::fs::read_to_string(m).with_context(|| format!("read {}", m.display()))?;
        path.push_str(&format!("?manifest={}", enc(&text)));
    }
    let v = conn.json("PUT", &path, Some(wasm))?;
    println!(
        "deployed {tenant}/{app} ({} bytes, sha256 {}), classes: {}",
        v["component_bytes"],
        v["hash"].as_str().unwrap_or("?"),
        v["classes"]
            .as_array()
            .map(|a| a
                .iter()
                .filter_map(|c| c.as_str())
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    );
    Ok(())
}

/// `wasmkeep secret set|delete|list TENANT/APP [NAME]`; `set` reads the
/// value from standard input (a trailing newline is dropped), so that it
/// never appears in a shell's history or the process list.
pub fn secret(conn: &Conn, action: &str, target: &str, name: Option<&str>) -> Result<()> {
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
                anyhow::bail!("HTTP {status}: {}", String::from_utf8_lossy(&body));
            }
            println!("set {tenant}/{app} secret {}", name.unwrap_or_default());
        }
        "delete" => print(&conn.json("DELETE", &named()?, None)?),
        "list" => print(&conn.json("GET", &base, None)?),
        other => anyhow::bail!("unknown action `{other}`: set, delete or list"),
    }
    Ok(())
}

pub fn call(conn: &Conn, target: &str, method: &str, data: Option<String>) -> Result<()> {
    let path = format!("/v1/{}", target.trim_start_matches('/'));
    let (status, body) = conn.send(&method.to_uppercase(), &path, data.map(String::into_bytes))?;
    use std::io::Write;
    std::io::stdout().write_all(&body)?;
    if !body.ends_with(b"\n") && !body.is_empty() {
        println!();
    }
    if !(200..300).contains(&status) {
        eprintln!("HTTP {status}");
        std::process::exit(1);
    }
    Ok(())
}

pub fn actors(conn: &Conn, target: &str, after: Option<String>, limit: usize) -> Result<()> {
    let [t, a, c] = split::<3>(target, "tenant/app/class")?;
    let mut path = format!(
        "/admin/v1/actors/{}/{}/{}?limit={limit}",
        enc(&t),
        enc(&a),
        enc(&c)
    );
    if let Some(after) = after {
        path.push_str(&format!("&after={}", enc(&after)));
    }
    let v = conn.json("GET", &path, None)?;
    for name in v["actors"].as_array().into_iter().flatten() {
        println!("{}", name.as_str().unwrap_or_default());
    }
    if let Some(next) = v["next"].as_str() {
        eprintln!("(more: --after {next:?})");
    }
    Ok(())
}

pub fn inspect(conn: &Conn, target: &str, sql: Option<String>, tables: bool) -> Result<()> {
    let [t, a, c, n] = split::<4>(target, "tenant/app/class/name")?;
    let base = format!(
        "/admin/v1/actors/{}/{}/{}/{}",
        enc(&t),
        enc(&a),
        enc(&c),
        enc(&n)
    );
    let sql = if tables {
        Some("SELECT type, name, sql FROM sqlite_schema ORDER BY name".to_string())
    } else {
        sql
    };
    match sql {
        None => print(&conn.json("GET", &base, None)?),
        Some(sql) => {
            let v = conn.json("POST", &format!("{base}/sql"), Some(sql.into_bytes()))?;
            let cols: Vec<&str> = v["columns"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c.as_str())
                .collect();
            println!("{}", cols.join("\t"));
            for row in v["rows"].as_array().into_iter().flatten() {
                let cells: Vec<String> = row
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| match c {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect();
                println!("{}", cells.join("\t"));
            }
        }
    }
    Ok(())
}

pub fn alarms(conn: &Conn, tenant: &str, limit: usize) -> Result<()> {
    let v = conn.json(
        "GET",
        &format!("/admin/v1/alarms/{}?limit={limit}", enc(tenant)),
        None,
    )?;
    for a in v["alarms"].as_array().into_iter().flatten() {
        println!(
            "{}\t{}/{}/{}",
            a["alarm_ms"],
            a["app"].as_str().unwrap_or(""),
            a["class"].as_str().unwrap_or(""),
            a["name"].as_str().unwrap_or("")
        );
    }
    // A cluster node: the bucket's index, which every node's sweep reads.
    if let Some(index) = v["index"].as_array() {
        println!("# the bucket's index: due_ms app/class/name generation nonce");
        for e in index {
            println!(
                "{}\t{}/{}/{}\t{}\t{}",
                e["due_ms"],
                e["app"].as_str().unwrap_or("(tenant-wide)"),
                e["class"].as_str().unwrap_or(""),
                e["name"].as_str().unwrap_or(""),
                e["generation"],
                e["nonce"].as_str().unwrap_or("-")
            );
        }
    }
    Ok(())
}

pub fn apps(conn: &Conn) -> Result<()> {
    print(&conn.json("GET", "/admin/v1/apps", None)?);
    Ok(())
}

/// How long `cluster` waits for another node's `/admin/v1/node` (its held
/// actors) before printing `?` for it.
const PEER_TIMEOUT_MS: u64 = 2_000;

/// `wasmkeep cluster`: the live nodes as the bucket shows them, one line a
/// node. Held actors are the answering node's own count; for the others
/// the CLI asks each node's `/admin/v1/node` itself (with the same token,
/// within [`PEER_TIMEOUT_MS`]; `?` if it does not answer).
pub fn cluster(conn: &Conn) -> Result<()> {
    let v = conn
        .json("GET", "/admin/v1/cluster", None)
        .context("read the cluster view")?;
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
        let held = match n["held_actors"].as_u64() {
            Some(h) => h.to_string(),
            None => peer_held(conn, address).map_or("?".into(), |h| h.to_string()),
        };
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
    let widths: Vec<usize> = (0..6)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", cells.join("  ").trim_end());
    }
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

/// Milliseconds as seconds with one decimal (`-0.4 s` for a lease in its
/// grace).
fn seconds(ms: &Value) -> String {
    ms.as_i64()
        .map_or("?".into(), |ms| format!("{:.1} s", ms as f64 / 1000.0))
}

/// Another node's held actors, from its `/admin/v1/node`.
fn peer_held(conn: &Conn, address: &str) -> Option<u64> {
    let url = format!("{}/admin/v1/node", address.trim_end_matches('/'));
    let mut req = ureq::http::Request::builder().method("GET").uri(&url);
    if let Some(t) = &conn.token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_millis(PEER_TIMEOUT_MS)))
        .build()
        .new_agent();
    let mut resp = agent.run(req.body(Vec::new()).ok()?).ok()?;
    if resp.status().as_u16() != 200 {
        return None;
    }
    let body = resp
        .body_mut()
        .with_config()
        .limit(1 << 20)
        .read_to_vec()
        .ok()?;
    let v: Value = serde_json::from_slice(&body).ok()?;
    v["cluster"]["held_actors"].as_u64()
}
