//! The console (issue 39, ADR 0063): its session rules over raw HTTP, each
//! with its unsafe variant, and the whole console driven in Debian's
//! headless Chromium (`tests/browser/console.mjs`, with playwright-core;
//! `scripts/setup.sh --test` installs both).

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

mod common;

use std::path::Path;
use std::process::Command;

use common::hostile::{BASE, start, start_without};
use common::{Node, enc, raw_http, raw_status};

const ADMIN: &str = "console-admin-5e1d";

fn start_node(tmp: &Path, env: &[(&str, String)]) -> Node {
    let cfg = tmp.join("node.toml");
    std::fs::write(
        &cfg,
        format!("admin_token = \"{ADMIN}\"\naccess_log = true\ntrace_sample_pct = 100\n"),
    )
    .unwrap();
    Node::start_env(
        &tmp.join("data"),
        &["--examples", "--config", cfg.to_str().unwrap()],
        env,
    )
}

/// A login's answer: status, the session cookie (`name=value`) and the
/// CSRF value, or the raw answer when it failed.
struct Login {
    status: u16,
    cookie: String,
    csrf: String,
    answer: String,
}

fn login(node: &Node, token: &str, extra_headers: &str) -> Login {
    let body = serde_json::json!({ "token": token }).to_string();
    let answer = raw_http(
        node.addr(),
        &format!(
            "POST /console/login HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra_headers}connection: close\r\n\r\n{body}",
            node.addr(),
            body.len()
        ),
    );
    let status = raw_status(&answer);
    let cookie = answer
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or_else(|| l.strip_prefix("Set-Cookie: "))
        })
        .map(|v| v.split(';').next().unwrap().to_owned())
        .unwrap_or_default();
    let csrf = answer
        .split("\r\n\r\n")
        .nth(1)
        .and_then(|b| serde_json::from_str::<serde_json::Value>(b).ok())
        .and_then(|v| v["csrf"].as_str().map(str::to_owned))
        .unwrap_or_default();
    Login {
        status,
        cookie,
        csrf,
        answer,
    }
}

/// `GET /admin/v1/apps` as a console page: with the cookie and, if given,
/// a CSRF value, from a page of the node's own origin.
fn apps_as_page(node: &Node, cookie: &str, csrf: Option<&str>) -> u16 {
    let mut headers = vec![
        ("cookie", cookie.to_owned()),
        ("sec-fetch-site", "same-origin".to_owned()),
    ];
    if let Some(c) = csrf {
        headers.push(("x-wasmkeep-csrf", c.to_owned()));
    }
    node.send_headers("GET", "/admin/v1/apps", b"", &headers).0
}

#[test]
fn a_console_session_needs_its_cookie_and_its_csrf_value() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start_node(tmp.path(), &[]);

    let wrong = login(&node, "not-the-token", "");
    assert_eq!(wrong.status, 401, "{}", wrong.answer);
    assert!(
        wrong.answer.contains("\"unauthorized\""),
        "{}",
        wrong.answer
    );
    assert!(wrong.cookie.is_empty(), "a failed login set a cookie");

    let a = login(&node, ADMIN, "");
    assert_eq!(a.status, 200, "{}", a.answer);
    let set_cookie = a
        .answer
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/admin/v1/;"] {
        assert!(set_cookie.contains(attr), "{set_cookie}");
    }
    assert!(a.cookie.starts_with("wasmkeep_console=") && a.csrf.len() == 64);

    // A tenant's page on the node's origin makes the browser send the
    // cookie, but cannot know the CSRF value.
    assert_eq!(apps_as_page(&node, &a.cookie, None), 401);
    assert_eq!(
        apps_as_page(&node, &a.cookie, Some("0".repeat(64).as_str())),
        401
    );
    assert_eq!(apps_as_page(&node, &a.cookie, Some(&a.csrf)), 200);
    // Another session's CSRF value is not this one's.
    let b = login(&node, ADMIN, "");
    assert_eq!(apps_as_page(&node, &a.cookie, Some(&b.csrf)), 401);
    assert_eq!(apps_as_page(&node, &b.cookie, Some(&b.csrf)), 200);
    // A page of another origin is refused before any session is looked at.
    let foreign = node
        .send_headers(
            "GET",
            "/admin/v1/apps",
            b"",
            &[
                ("cookie", a.cookie.clone()),
                ("x-wasmkeep-csrf", a.csrf.clone()),
                ("sec-fetch-site", "cross-site".to_owned()),
            ],
        )
        .0;
    assert_eq!(foreign, 403);
    let cross = login(&node, ADMIN, "sec-fetch-site: cross-site\r\n");
    assert_eq!(cross.status, 403, "{}", cross.answer);
    assert!(cross.answer.contains("cross_origin"), "{}", cross.answer);

    // A cookie of the same name planted on a longer path (a tenant's
    // script can) comes first; the real session still works.
    let planted = format!("wasmkeep_console=planted; {}", a.cookie);
    assert_eq!(apps_as_page(&node, &planted, Some(&a.csrf)), 200);
    // Logging out needs the CSRF value too.
    let (s, _) = node.send_headers(
        "POST",
        "/admin/v1/console/logout",
        b"",
        &[
            ("cookie", a.cookie.clone()),
            ("sec-fetch-site", "same-origin".to_owned()),
        ],
    );
    assert_eq!(s, 401);
    assert_eq!(apps_as_page(&node, &a.cookie, Some(&a.csrf)), 200);
    // Logging out ends the session; the other stays.
    let (s, _) = node.send_headers(
        "POST",
        "/admin/v1/console/logout",
        b"",
        &[
            ("cookie", a.cookie.clone()),
            ("x-wasmkeep-csrf", a.csrf.clone()),
        ],
    );
    assert_eq!(s, 204);
    assert_eq!(apps_as_page(&node, &a.cookie, Some(&a.csrf)), 401);
    assert_eq!(apps_as_page(&node, &b.cookie, Some(&b.csrf)), 200);

    // Guessing the token: past the minute's failures, even the right one
    // waits until the minute ends. (Enough guesses for the count to fill
    // even if a minute ends among them.)
    let minute = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            / 60
    };
    let limit = wasmkeep_server::api::CONSOLE_LOGIN_FAILURES_PER_MINUTE;
    let mut throttled_from = None;
    for i in 0..=2 * limit {
        let m0 = minute();
        let l = login(&node, &format!("guess-{i}"), "");
        if l.status == 429 {
            throttled_from = Some(m0);
            assert!(l.answer.contains("console_login_throttled"), "{}", l.answer);
            break;
        }
        assert_eq!(l.status, 401, "{}", l.answer);
    }
    let m0 = throttled_from.expect("the guesses were never throttled");
    // The right token too, unless a minute ended since the refused guess
    // was sent.
    let right = login(&node, ADMIN, "");
    if minute() == m0 {
        assert_eq!(right.status, 429, "{}", right.answer);
    }
}

/// The unsafe variant `console_without_csrf`: the cookie alone opens the
/// admin API, to any page of the node's origin.
#[test]
fn without_the_csrf_rule_any_page_of_the_origin_rides_the_session() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start_node(
        tmp.path(),
        &[("WASMKEEP_UNSAFE", "console_without_csrf".to_owned())],
    );
    let a = login(&node, ADMIN, "");
    assert_eq!(a.status, 200, "{}", a.answer);
    assert_eq!(apps_as_page(&node, &a.cookie, None), 200);
}

#[test]
fn a_node_without_an_admin_token_logs_nobody_into_the_console() {
    let tmp = tempfile::tempdir().unwrap();
    let node = Node::start(&tmp.path().join("data"), &[]);
    let l = login(&node, "anything", "");
    assert_eq!(l.status, 403, "{}", l.answer);
    assert!(
        l.answer.contains("console_needs_admin_token"),
        "{}",
        l.answer
    );
    // The page itself is served (it says what to do), with its policy.
    let page = raw_http(
        node.addr(),
        &format!(
            "GET /console HTTP/1.1\r\nhost: {}\r\nconnection: close\r\n\r\n",
            node.addr()
        ),
    );
    assert_eq!(raw_status(&page), 200);
    let lower = page.to_ascii_lowercase();
    assert!(lower.contains("content-security-policy: default-src 'none'; script-src 'self'"));
    assert!(lower.contains("frame-ancestors 'none'"));
    assert!(lower.contains("cross-origin-opener-policy: same-origin"));
}

/// An actor never sees an operator's console session, and what it answers
/// cannot reach the console on the node's origin: a `Service-Worker-Allowed`
/// header (a worker over `/console` would read the token as it is typed), a
/// `Clear-Site-Data` header (it would log the operator out) and the
/// console's cookie are dropped.
#[test]
fn an_actor_cannot_widen_a_worker_over_the_console_or_set_its_cookie() {
    let seen_cookies = |node: &Node| {
        let (s, v) = node.send_headers(
            "GET",
            "/v1/evil/x/attacker/a/headers",
            b"",
            &[(
                "cookie",
                "theirs=1; wasmkeep_console=operator; other=2".to_owned(),
            )],
        );
        assert_eq!(s, 200, "{v}");
        let v: serde_json::Value = serde_json::from_str(&v).unwrap();
        v["headers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h[0] == "cookie")
            .map(|h| h[1].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let answer_headers = |node: &Node| {
        let body = "service-worker-allowed: /\nclear-site-data: \"cookies\"\nset-cookie: wasmkeep_console=planted; Path=/\nset-cookie: theirs=kept\n\nhello";
        raw_http(
            node.addr(),
            &format!(
                "POST /v1/evil/x/attacker/a/respond?status=200 HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                node.addr(),
                body.len()
            ),
        )
        .to_ascii_lowercase()
    };
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path(), BASE);
    let got = answer_headers(&node);
    assert_eq!(raw_status(&got), 200, "{got}");
    assert!(!got.contains("service-worker-allowed"), "{got}");
    assert!(!got.contains("clear-site-data"), "{got}");
    assert!(!got.contains("wasmkeep_console="), "{got}");
    assert!(got.contains("set-cookie: theirs=kept"), "{got}");
    assert_eq!(seen_cookies(&node), ["theirs=1; other=2"]);
    drop(node);

    let tmp = tempfile::tempdir().unwrap();
    let node = start_without(tmp.path(), BASE, "actor_answer_unfiltered");
    let got = answer_headers(&node);
    assert!(got.contains("service-worker-allowed: /"), "{got}");
    assert!(got.contains("clear-site-data"), "{got}");
    assert!(got.contains("wasmkeep_console=planted"), "{got}");
    assert_eq!(
        seen_cookies(&node),
        ["theirs=1; wasmkeep_console=operator; other=2"]
    );
}

/// The console as an operator uses it, in a real browser: log in, see the
/// app, find and open an actor whose name and KV value are HTML, run SQL,
/// browse a table, watch a log line arrive, see an alarm set through the
/// API in the alarm list and run it, export and delete with confirmation,
/// a phone-width screen, log out. Screenshots go to
/// `WASMKEEP_CONSOLE_SHOTS` when set (docs/console/ holds a run's).
#[test]
fn the_console_in_a_real_browser() {
    let chromium = std::env::var("WASMKEEP_CHROMIUM").unwrap_or("/usr/bin/chromium".into());
    let script_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    assert!(
        Path::new(&chromium).exists(),
        "no Chromium at {chromium}: scripts/setup.sh --test installs Debian's"
    );
    assert!(
        script_dir.join("node_modules/playwright-core").exists(),
        "playwright-core is not installed in {}: scripts/setup.sh --test installs it",
        script_dir.display()
    );
    let tmp = tempfile::tempdir().unwrap();
    let node = start_node(tmp.path(), &[]);
    let auth = [("authorization", format!("Bearer {ADMIN}"))];
    let call = |method: &str, path: &str, body: &str| {
        let (s, b) = node.send_headers(method, path, body.as_bytes(), &auth);
        assert!(s < 300, "{method} {path}: {s} {b}");
    };
    let hostile = "<img src=x onerror=window.pwned=1>";
    let kv_value = "<script>window.pwned=3</script>";
    let notes = format!("/v1/demo/examples/notes/{}", enc(hostile));
    call("POST", &format!("{notes}/notes?title=first-note"), "text");
    call("PUT", &format!("{notes}/settings/theme"), kv_value);
    call("POST", "/v1/demo/examples/notes/doomed/notes?title=x", "x");
    call("GET", "/v1/demo/examples/pinger/p1/stats", "");
    let in_an_hour = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 3_600_000;
    call(
        "POST",
        &format!("/v1/demo/examples/reminder/r1/set?at_ms={in_an_hour}"),
        "",
    );
    // An alarm that keeps failing: the index page shows it retrying.
    call(
        "POST",
        &format!(
            "/v1/demo/examples/reminder/flaky/set?at_ms={}&fail_times=1000",
            in_an_hour - 3_600_000
        ),
        "",
    );
    common::cluster::wait_for("the flaky alarm's first failure", 60, 50, || {
        let (_, b) = node.send_headers("GET", "/admin/v1/alarms/demo", b"", &auth);
        let v: serde_json::Value = serde_json::from_str(&b).unwrap_or_default();
        v["alarms"].as_array().is_some_and(|a| {
            a.iter()
                .any(|x| x["name"] == "flaky" && x["retry_count"].as_u64() >= Some(1))
        })
    });
    let timer = "<b>nightly</b>";
    call(
        "POST",
        &format!(
            "/v1/demo/examples/timers/t1/set?name={}&due_ms={in_an_hour}",
            enc(timer)
        ),
        "payload",
    );
    let shots = std::env::var("WASMKEEP_CONSOLE_SHOTS").ok();
    let input = serde_json::json!({
        "base": format!("http://{}", node.addr()),
        "token": ADMIN,
        "hostile": hostile,
        "kv_value": kv_value,
        "note_title": "first-note",
        "pinger": "p1",
        "reminder": "r1",
        "flaky": "flaky",
        "doomed": "doomed",
        "timers": "t1",
        "timer": timer,
        "shots": shots,
        "chromium": chromium,
    });
    run_browser("console.mjs", &input);
}

/// Runs one of `tests/browser`'s scripts with `input`; it must say it passed.
fn run_browser(script: &str, input: &serde_json::Value) {
    let script_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    let out = Command::new("node")
        .arg(script)
        .current_dir(&script_dir)
        .env("CONSOLE_TEST", input.to_string())
        .output()
        .expect("run node");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(said.contains("console test passed"), "{said}");
}

/// The console's cluster-wide views over two real nodes on one folder
/// bucket: asked on A, the cluster page counts B's holds, the alarm list
/// and an actor's log show what only B has (each naming B), and the
/// overview's history carries B's own series. Asked without
/// `cluster=true`, A shows only its own (so the fan-out is what finds B's).
/// Then the same pages in the browser, logged in to A
/// (`tests/browser/cluster.mjs`).
#[test]
fn the_consoles_cluster_views_ask_every_live_node() {
    use common::cluster;
    let tmp = tempfile::tempdir().unwrap();
    let bucket = format!("file://{}", tmp.path().join("bucket").display());
    let more = format!("access_log = true\nadmin_token = \"{ADMIN}\"\n");
    let start = |name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let port = cluster::free_port();
        let config = cluster::node_config(&dir, 1500, 500, 2000, &more);
        let flags = cluster::serve_flags(port, &config, &bucket);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        (Node::start(&dir.join("data"), &flags), port)
    };
    let auth = [("authorization", format!("Bearer {ADMIN}"))];
    let admin = |node: &Node, path: &str| {
        let (s, b) = node.send_headers("GET", path, b"", &auth);
        (
            s,
            serde_json::from_str::<serde_json::Value>(&b).unwrap_or(serde_json::Value::String(b)),
        )
    };
    let (a, _) = start("a");
    let (b, b_port) = start("b");
    let b_id = admin(&b, "/admin/v1/node").1["cluster"]["node"]
        .as_str()
        .unwrap()
        .to_owned();
    cluster::wait_for("both nodes in the view", 120, 100, || {
        let (s, v) = admin(&a, "/admin/v1/cluster");
        s == 200 && v["nodes"].as_array().is_some_and(|n| n.len() == 2)
    });
    // An actor of B's, with an alarm far ahead.
    cluster::wait_for("B takes the actor", 120, 100, || {
        let r = cluster::send(
            b_port,
            "POST",
            "/v1/demo/examples/reminder/far/set?at_ms=9999999999999",
            &[("authorization", &format!("Bearer {ADMIN}"))],
        );
        r.status == 200 && r.node.as_deref() == Some(b_id.as_str())
    });

    let (s, v) = admin(&a, "/admin/v1/cluster");
    assert_eq!(s, 200, "{v}");
    let nodes = v["nodes"].as_array().unwrap();
    let theirs = nodes.iter().find(|n| n["node"] == b_id.as_str()).unwrap();
    assert!(theirs["held_actors"].as_u64() >= Some(1), "{v}");
    assert!(nodes.iter().all(|n| n["held_actors"].is_u64()), "{v}");

    let far = |v: &serde_json::Value| {
        v["alarms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == "far")
            .cloned()
    };
    let (_, own) = admin(&a, "/admin/v1/alarms/demo");
    assert_eq!(far(&own), None, "A's own timer lacks B's alarm: {own}");
    let (s, all) = admin(&a, "/admin/v1/alarms/demo?cluster=true");
    assert_eq!(s, 200, "{all}");
    let found = far(&all).expect("B's alarm, asked through A");
    assert_eq!(found["node"], b_id.as_str());
    assert_eq!(found["alarm_ms"], 9_999_999_999_999u64);
    assert_eq!(all["nodes_unreachable"], serde_json::json!([]));

    let scope = "/admin/v1/logs/demo/examples/reminder/far?lines=50";
    let (_, own) = a.send_headers("GET", scope, b"", &auth);
    assert!(!own.contains("/set"), "A ran nothing of it: {own}");
    let (s, merged) = a.send_headers("GET", &format!("{scope}&cluster=true"), b"", &auth);
    assert_eq!(s, 200, "{merged}");
    let line = merged
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| {
            l["access"]["path"]
                .as_str()
                .is_some_and(|p| p.contains("/set"))
        })
        .unwrap_or_else(|| panic!("B's access line, asked through A: {merged}"));
    assert_eq!(line["node"], b_id.as_str());
    let (s, refused) = admin(&a, &format!("{scope}&cluster=true&follow=true"));
    assert_eq!(
        (s, refused["error"]["code"].as_str()),
        (400, Some("bad_request"))
    );

    let (s, h) = admin(&a, "/admin/v1/node/history?cluster=true");
    assert_eq!(s, 200, "{h}");
    let others = h["others"].as_array().unwrap();
    assert_eq!(others.len(), 1, "{h}");
    assert_eq!(others[0]["node"], b_id.as_str());
    assert!(
        others[0]["points"].is_array(),
        "B answered its own history: {h}"
    );

    let input = serde_json::json!({
        "base": format!("http://{}", a.addr()),
        "b_base": format!("http://127.0.0.1:{b_port}"),
        "token": ADMIN,
        "b_node": b_id,
        "actor": "far",
        "shots": std::env::var("WASMKEEP_CONSOLE_SHOTS").ok(),
        "chromium": std::env::var("WASMKEEP_CHROMIUM").unwrap_or("/usr/bin/chromium".into()),
    });
    run_browser("cluster.mjs", &input);
}
