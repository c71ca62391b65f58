//! What a developer and an operator see of a running node (issue 22): the
//! log lines of a scope (`wasmkeep logs`, and `--follow` as they come),
//! the access log, failed requests and failing alarms with their counts,
//! metrics by tenant, app and class under a cap, and the CLI's readable
//! and `--json` output. Real node processes, real CLI processes.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::Node;

fn cli(node: &Node, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args(args)
        .args(["--server", &node.base])
        .output()
        .expect("run the CLI");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(node: &Node, args: &[&str]) -> String {
    let (status, stdout, stderr) = cli(node, args);
    assert_eq!(status, 0, "{args:?}: {stdout} {stderr}");
    stdout
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn config(dir: &std::path::Path, text: &str) -> String {
    let p = dir.join("node.toml");
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// A node with the examples and the configuration `text`, its own log
/// (at `info`) written to the file it returns.
fn logging_node(dir: &std::path::Path, text: &str) -> (Node, std::path::PathBuf) {
    let cfg = config(dir, text);
    let log = dir.join("node.log");
    let node = Node::start_logging(
        &dir.join("data"),
        &["--examples", "--config", &cfg],
        Some(&log),
        "info",
    );
    (node, log)
}

#[test]
fn logs_show_a_scopes_guest_lines_failed_requests_and_failing_alarms_with_their_count() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "alarm_retry_first_ms = 200\nfailed_request_log_per_s = 2\n",
    );
    let node = Node::start(&dir.path().join("data"), &["--examples", "--config", &cfg]);
    // A guest line, in an actor of another class too (the scope must
    // leave it out).
    assert_eq!(
        node.post("/v1/demo/examples/pinger/p1/config/log?name=LOG_ME", b"")
            .0,
        200
    );
    assert_eq!(
        node.post("/v1/demo/examples/counter/c1/increment", b"").0,
        200
    );
    // A failed request with its code.
    let (status, _) = node.post("/v1/demo/examples/reminder/r1/set", b"");
    assert_eq!(status, 400);
    // A flood of failures in one class is cut to the rate (2 a second,
    // here) and does not crowd out another class's failure.
    for _ in 0..6 {
        node.post("/v1/demo/examples/reminder/flood/set", b"");
    }
    assert_eq!(node.get("/v1/demo/examples/pinger/p1/config").0, 400);
    // An alarm that fails twice, then succeeds.
    let at = now_ms();
    let (status, body) = node.post(
        &format!("/v1/demo/examples/reminder/r1/set?at_ms={at}&fail_times=2"),
        b"",
    );
    assert_eq!(status, 200, "{body}");
    common::cluster::wait_for("the alarm to succeed", 30, 50, || {
        node.get("/v1/demo/examples/reminder/r1/fired")
            .1
            .contains("due_ms")
    });

    let pinger = ok(&node, &["logs", "demo/examples/pinger"]);
    assert!(
        pinger.contains("INFO  demo/examples/pinger/p1  config LOG_ME = (none)"),
        "{pinger}"
    );
    assert!(
        !pinger.contains("reminder"),
        "the scope is the class: {pinger}"
    );

    let flood = ok(&node, &["logs", "demo/examples/reminder/flood"]);
    let kept = flood.matches("reminder/flood/set 400 bad_request").count();
    assert!(
        (1..=4).contains(&kept),
        "6 failures within about a second, 2 a second kept: {flood}"
    );
    assert!(
        ok(&node, &["logs", "demo/examples/pinger"]).contains("pinger/p1/config 400 bad_request"),
        "the other class's failure is kept"
    );
    let reminder = ok(&node, &["logs", "demo/examples/reminder/r1"]);
    assert!(
        reminder.contains("POST /v1/demo/examples/reminder/r1/set 400 bad_request"),
        "a failed request, with its code: {reminder}"
    );
    let warns: Vec<&str> = reminder.lines().filter(|l| l.contains(" WARN ")).collect();
    assert!(
        warns
            .iter()
            .any(|l| l.contains("alarm failed (1 failures so far), retry in")),
        "{reminder}"
    );
    assert!(
        warns
            .iter()
            .any(|l| l.contains("alarm failed (2 failures so far)")),
        "{reminder}"
    );
    // `--level warn` leaves the request (INFO) out; `--json` is NDJSON.
    let only_warn = ok(
        &node,
        &["logs", "demo/examples/reminder", "--level", "warn"],
    );
    assert!(!only_warn.contains("bad_request") && only_warn.contains("alarm failed"));
    let json = ok(&node, &["logs", "demo", "--json", "--lines", "2"]);
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect();
    assert_eq!(lines.len(), 2, "{json}");
    assert!(lines[0]["seq"].as_u64() < lines[1]["seq"].as_u64());

    // Typos are errors, as everywhere.
    for (scope, code) in [
        ("nobody", "tenant_not_found"),
        ("demo/exampels", "app_not_found"),
        ("demo/examples/countr", "class_not_found"),
    ] {
        let (status, _, stderr) = cli(&node, &["logs", scope]);
        assert_eq!(status, 1);
        assert!(stderr.contains(code), "{scope}: {stderr}");
    }
}

/// Reads a child's stdout lines on a thread.
fn lines_of(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

fn wait_line(
    rx: &mpsc::Receiver<String>,
    what: &str,
    mut pred: impl FnMut(&str) -> bool,
) -> String {
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while let Some(left) = end.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(l) if pred(&l) => return l,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    panic!("no line {what} within 30 s");
}

#[test]
fn follow_prints_new_lines_as_they_come_and_followers_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (node, log) = logging_node(dir.path(), "access_log = true\nlog_followers_max = 1\n");
    let mut follower = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args([
            "logs",
            "demo/examples/counter",
            "--follow",
            "--server",
            &node.base,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines_of(&mut follower);
    // Once it prints a request, it follows (and holds the one place).
    node.post("/v1/demo/examples/counter/warm/increment", b"");
    wait_line(&rx, "for the first request", |l| l.contains("counter/warm"));
    let (status, _, stderr) = cli(&node, &["logs", "demo", "--follow"]);
    assert_eq!(status, 1, "a second follower is refused: {stderr}");
    assert!(stderr.contains("too_many_followers"), "{stderr}");
    assert_eq!(
        node.post("/v1/demo/examples/counter/a%2Fb/increment", b"")
            .0,
        200
    );
    let line = wait_line(&rx, "for the request", |l| l.contains("a%2Fb"));
    assert!(
        line.contains(
            "demo/examples/counter/a%2Fb  POST /v1/demo/examples/counter/a%2Fb/increment 200"
        ),
        "an access line: method, path, actor (its name written as in its URL), status, \
         duration: {line}"
    );
    assert!(line.ends_with(" ms"), "{line}");
    // Lines of another class do not reach this follower: every line up to
    // the next counter request is the counter's.
    node.post("/v1/demo/examples/notes/n/notes?title=x", b"x");
    node.post("/v1/demo/examples/counter/c2/increment", b"");
    let mut between = Vec::new();
    wait_line(&rx, "for c2", |l| {
        between.push(l.to_owned());
        l.contains("counter/c2")
    });
    assert!(
        between.iter().all(|l| l.contains("demo/examples/counter/")),
        "{between:?}"
    );
    let _ = follower.kill();
    let _ = follower.wait();
    // Its place is free again once the node notices the closed stream, at
    // its next write (a line, here, or the heartbeat).
    common::cluster::wait_for("the place to be freed", 30, 100, || {
        node.post("/v1/demo/examples/counter/c3/increment", b"");
        let mut again = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
            .args([
                "logs", "demo", "--follow", "--lines", "1", "--server", &node.base,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1_500));
        match again.try_wait().unwrap() {
            // Refused: still taken.
            Some(_) => false,
            None => {
                let _ = again.kill();
                let _ = again.wait();
                true
            }
        }
    });

    // The access log is structured, in the node's log; the node's log has
    // no colour codes when it is not a terminal.
    let text = std::fs::read_to_string(&log).unwrap();
    let access = text
        .lines()
        .find(|l| l.contains("wasmkeep::access") && l.contains("a%2Fb"))
        .unwrap_or_else(|| panic!("no access line in the node's log:\n{text}"));
    for field in ["method=\"POST\"", "status=200", "actor=", "ms="] {
        assert!(access.contains(field), "{field} in {access}");
    }
    assert!(!text.contains('\u{1b}'), "no ANSI escapes in a file");
}

/// Events that do not pass the HTTP edge (issue 37): an actor message
/// leaves an access line in the tenant's log and the node's, refused ones
/// with their code, and counts in its class's series.
#[test]
fn actor_messages_leave_access_lines_and_count_per_class() {
    let dir = tempfile::tempdir().unwrap();
    let (node, log) = logging_node(dir.path(), "access_log = true\n");
    let (status, body) = node.post("/v1/demo/examples/caller/c/add?name=t1&by=2", b"");
    assert_eq!(status, 200, "{body}");
    let (status, body) = node.post("/v1/demo/examples/caller/c/fail?name=t1&code=nope", b"");
    assert_eq!(status, 200, "{body}");
    let lines = || ok(&node, &["logs", "demo/examples/tally/t1"]);
    common::cluster::wait_for("both messages' lines", 30, 100, || {
        let l = lines();
        let from = "MESSAGE from demo/examples/caller/c #";
        l.lines().any(|l| l.contains(from) && l.contains(" ok "))
            && l.lines()
                .any(|l| l.contains(from) && l.contains(" refused nope: "))
    });
    let metrics = node.get("/metrics").1;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("wasmkeep_class_messages_total{")
                && l.contains("class=\"tally\"")
                && l.ends_with(" 2")),
        "{metrics}"
    );
    let node_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        node_log
            .lines()
            .any(|l| l.contains("wasmkeep::access") && l.contains("MESSAGE")),
        "{node_log}"
    );
}

#[test]
fn metrics_are_labelled_by_class_under_a_cap() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "metrics_classes_max = 2\nmetrics_census_ms = 100\n",
    );
    let node = Node::start(&dir.path().join("data"), &["--examples", "--config", &cfg]);
    let apps = ok(&node, &["apps", "--json"]);
    let apps: serde_json::Value = serde_json::from_str(&apps).unwrap();
    let mut classes: Vec<String> = apps["apps"][0]["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    classes.sort();
    assert!(classes.len() > 3);
    for class in &classes {
        node.get(&format!("/v1/demo/examples/{class}/m/none"));
    }
    node.post("/v1/demo/examples/counter/m/increment", b"");
    node.get("/v1/demo/examples/typo/m/value");
    let metrics = || node.get("/metrics").1;
    // The actors gauge moves as actors are made; the bytes come with the
    // census, which has run once some class has bytes on disk.
    common::cluster::wait_for("the census", 30, 100, || {
        metrics()
            .lines()
            .any(|l| l.starts_with("wasmkeep_class_database_bytes{") && !l.ends_with(" 0"))
    });
    let text = metrics();
    let labelled: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("wasmkeep_class_requests_total{"))
        .collect();
    assert_eq!(labelled.len(), 3, "two classes and _other: {labelled:?}");
    assert!(!text.contains("class=\"typo\""), "no label from a typo");
    let folded = text
        .lines()
        .find(|l| l.starts_with("wasmkeep_class_label_sets_folded "))
        .unwrap();
    // Every class of every deployed app (`--examples` deploys the Rust
    // and the TypeScript examples) but the two labelled ones is folded.
    let all_classes: usize = apps["apps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["classes"].as_array().unwrap().len())
        .sum();
    assert_eq!(
        folded,
        format!("wasmkeep_class_label_sets_folded {}", all_classes - 2)
    );
    // Every request to a deployed class counted somewhere, the typo nowhere.
    let total: u64 = labelled
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, classes.len() as u64 + 1, "{labelled:?}");
    // Unknown routes are the actor's 404, not errors; the counter's
    // database is counted on disk.
    let bytes: u64 = text
        .lines()
        .filter(|l| l.starts_with("wasmkeep_class_database_bytes{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(bytes > 0, "{text}");
}

/// Without a token, nobody sees the series that name tenants, and nobody
/// writes into a tenant's lines: a refused request is in the node's own
/// log only.
#[test]
fn tenants_names_and_lines_are_the_admins() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "admin_token = \"adm\"\n[tenant_tokens]\ndemo = \"ten\"\n",
    );
    let node = Node::start(&dir.path().join("data"), &["--examples", "--config", &cfg]);
    let port: u16 = node.addr().rsplit(':').next().unwrap().parse().unwrap();
    let send = |path: &str, headers: &[(&str, &str)]| {
        common::cluster::send(port, "POST", path, headers).status
    };
    let tenant = ("authorization", "Bearer ten");
    assert_eq!(send("/v1/demo/examples/counter/x/increment", &[]), 401);
    assert_eq!(send("/v1/demo/examples/reminder/x/set", &[tenant]), 400);
    let (status, lines, stderr) = {
        let out = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
            .args(["logs", "demo", "--server", &node.base, "--token", "adm"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(status, Some(0), "{stderr}");
    assert!(lines.contains("reminder/x/set 400 bad_request"), "{lines}");
    assert!(
        !lines.contains("unauthorized") && !lines.contains("counter/x"),
        "{lines}"
    );

    let scrape = |headers: &[(&str, &str)]| {
        let a = common::cluster::send(port, "GET", "/metrics", headers);
        assert_eq!(a.status, 200);
        a.body.as_str().unwrap_or_default().to_owned()
    };
    let open = scrape(&[]);
    assert!(open.contains("wasmkeep_requests_total"), "{open}");
    assert!(
        !open.contains("wasmkeep_class_"),
        "no tenant names without the admin token"
    );
    let admin = scrape(&[("authorization", "Bearer adm")]);
    assert!(
        admin.contains("wasmkeep_class_requests_total{tenant=\"demo\""),
        "{admin}"
    );
}

#[test]
fn the_cli_prints_for_people_by_default_and_json_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("data"), &["--examples"]);
    node.post("/v1/demo/examples/counter/alice/increment", b"");
    let summary = ok(&node, &["inspect", "demo/examples/counter/alice"]);
    assert!(summary.contains("actor "), "{summary}");
    assert!(summary.contains(" KiB"), "sizes read as sizes: {summary}");
    assert!(summary.contains(" ago)"), "times read as times: {summary}");
    assert!(
        !summary.contains("null") && !summary.contains('{'),
        "{summary}"
    );
    let json: serde_json::Value = serde_json::from_str(&ok(
        &node,
        &["inspect", "demo/examples/counter/alice", "--json"],
    ))
    .unwrap();
    assert!(json["database_bytes"].as_u64().unwrap() > 0);

    // Alarms: a date and how far ahead, not unix milliseconds.
    let at = now_ms() + 3_600_000;
    node.post(&format!("/v1/demo/examples/reminder/r/set?at_ms={at}"), b"");
    let alarms = ok(&node, &["alarms", "demo"]);
    assert!(alarms.contains("reminder/r"), "{alarms}");
    assert!(
        alarms.contains("(in 59 min)") || alarms.contains("(in 1 h)"),
        "{alarms}"
    );
    assert!(!alarms.contains(&at.to_string()), "{alarms}");
    let apps = ok(&node, &["apps"]);
    assert!(apps.starts_with("APP "), "a table: {apps}");
    assert!(apps.contains("demo/examples"), "{apps}");
    assert!(!apps.contains("null"), "{apps}");

    // KV pairs decoded: UTF-8 as text, anything else as hex.
    node.send("PUT", "/v1/demo/examples/notes/n/settings/colour", b"blue");
    node.send(
        "PUT",
        "/v1/demo/examples/notes/n/settings/raw",
        &[0, 159, 146, 150],
    );
    node.send("PUT", "/v1/demo/examples/notes/n/settings/size", b"10");
    let kv = ok(&node, &["inspect", "demo/examples/notes/n", "--kv"]);
    let rows: Vec<Vec<&str>> = kv.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["KEY", "VALUE"]);
    assert!(rows.contains(&vec!["setting/colour", "blue"]), "{kv}");
    assert!(rows.contains(&vec!["setting/raw", "x'009f9296'"]), "{kv}");
    let some = ok(
        &node,
        &[
            "inspect",
            "demo/examples/notes/n",
            "--kv",
            "--prefix",
            "setting/s",
        ],
    );
    assert_eq!(
        some.lines().count(),
        2,
        "the header and setting/size: {some}"
    );
    assert!(some.contains("setting/size"));

    // Workflows (issue 36): none yet, then one with its recorded steps.
    assert_eq!(node.get("/v1/demo/examples/orders/o/effects").0, 200);
    let none = ok(&node, &["inspect", "demo/examples/orders/o", "--workflows"]);
    assert!(none.contains("(no rows)"), "{none}");
    let (s, _) = node.post("/v1/demo/examples/orders/o/start-ten?id=job-1", b"");
    assert_eq!(s, 204);
    let mut listed = String::new();
    for _ in 0..200 {
        listed = ok(&node, &["inspect", "demo/examples/orders/o", "--workflows"]);
        if listed.contains("done") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(listed.starts_with("ID"), "{listed}");
    assert!(
        listed.contains("job-1") && listed.contains("ten") && listed.contains("done"),
        "{listed}"
    );
    assert!(
        listed.contains("s0:1") && listed.contains("s9:1"),
        "{listed}"
    );
}

/// Every option that takes a value says its default in `--help` (or is
/// one the command needs, or has no default by nature).
#[test]
fn every_option_states_its_default_in_help() {
    let commands = [
        "serve", "deploy", "call", "actors", "inspect", "alarms", "logs", "new", "dev", "secret",
        "apps", "cluster", "export", "restore", "upload", "bench",
    ];
    for c in commands {
        let out = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
            .args([c, "--help"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{c} --help");
        let help = String::from_utf8_lossy(&out.stdout).into_owned();
        // Options are blocks that start with `  -x, --name <V>` or
        // `      --name <V>`; the block runs to the next option.
        let mut blocks: Vec<(String, String)> = Vec::new();
        for line in help.lines() {
            let t = line.trim_start();
            if t.starts_with("--") || (t.starts_with('-') && t.get(2..4) == Some(", ")) {
                blocks.push((t.to_owned(), String::new()));
            } else if let Some(b) = blocks.last_mut() {
                b.1.push_str(line);
                b.1.push('\n');
            }
        }
        for (head, body) in blocks {
            let takes_value = head.contains('<');
            let whole = format!("{head}\n{body}").to_lowercase();
            let described = whole.lines().count() > 1 || head.split("  ").count() > 1;
            assert!(described, "{c}: {head} has no description");
            if takes_value && !head.starts_with("--help") {
                assert!(
                    whole.contains("default") || whole.contains("required"),
                    "{c}: `{head}` does not say its default:\n{whole}"
                );
            }
        }
    }
}
