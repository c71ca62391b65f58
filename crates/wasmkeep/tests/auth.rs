//! Tokens and exposure: the admin API and each tenant's actors are gated by
//! bearer tokens, a public address without tokens is refused, tenant tokens
//! need an admin token, an admin API without a token answers loopback only,
//! browser pages of other origins are refused, and tokens never reach the
//! log.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

mod common;

use std::process::Command;

use common::{Node, raw_http, raw_status};

const ADMIN: &str = "admin-secret-7f3a";
const ACME: &str = "acme-secret-91c2";

#[test]
fn tokens_gate_the_admin_api_and_each_tenant() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("node.toml");
    std::fs::write(
        &cfg,
        format!("admin_token = \"{ADMIN}\"\n[tenant_tokens]\ndemo = \"{ACME}\"\n"),
    )
    .unwrap();
    let log = tmp.path().join("node.log");
    let node = Node::start_logging(
        &tmp.path().join("data"),
        &["--examples", "--config", cfg.to_str().unwrap()],
        Some(&log),
        "debug",
    );
    let inc = "/v1/demo/examples/counter/x/increment";
    assert_eq!(node.send_with("POST", inc, b"", None).0, 401);
    assert_eq!(node.send_with("POST", inc, b"", Some("wrong")).0, 401);
    assert_eq!(node.send_with("POST", inc, b"", Some(ACME)).0, 200);
    assert_eq!(node.send_with("POST", inc, b"", Some(ADMIN)).0, 200);
    let (s, body) = node.send_with("GET", "/admin/v1/apps", b"", None);
    assert_eq!(s, 401);
    assert!(body.contains("\"unauthorized\""));
    assert_eq!(
        node.send_with("GET", "/admin/v1/apps", b"", Some(ACME)).0,
        401
    );
    assert_eq!(
        node.send_with("GET", "/admin/v1/apps", b"", Some(ADMIN)).0,
        200
    );
    // The health check and metrics stay open for probes.
    assert_eq!(node.get("/healthz").0, 200);
    drop(node);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.is_empty());
    assert!(
        !log.contains(ADMIN) && !log.contains(ACME),
        "a token reached the log"
    );
}

#[test]
fn a_public_address_without_tokens_is_refused_unless_insecure() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without an admin token"), "{err}");
    assert!(
        !tmp.path().join("actors").exists(),
        "it started before refusing"
    );
}

#[test]
fn tenant_tokens_without_an_admin_token_refuse_to_start_insecure_or_not() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("node.toml");
    std::fs::write(&cfg, format!("[tenant_tokens]\nacme = \"{ACME}\"\n")).unwrap();
    for extra in [&[][..], &["--insecure"][..]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_wasmkeep"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&cfg)
            .arg("--data")
            .arg(tmp.path().join("data"))
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A node that starts anyway would serve for ever: give it a minute.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let exited = loop {
            match child.try_wait().unwrap() {
                Some(status) => break Some(status),
                None if std::time::Instant::now() > end => break None,
                None => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        };
        if exited.is_none() {
            let _ = child.kill();
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            exited.is_some_and(|s| !s.success()),
            "it started with {extra:?}"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("tenant_tokens") && err.contains("admin_token") && !err.contains(ACME),
            "{err}"
        );
        assert!(
            !tmp.path().join("data").exists(),
            "it started before refusing"
        );
    }
}

/// A local address that is not loopback: a connection to the node through
/// it has a peer address off loopback, as a client on the network would.
/// `None` on a machine with no such interface.
fn non_loopback_local_ip() -> Option<std::net::IpAddr> {
    // Connecting a UDP socket sends nothing; it only picks a route and the
    // source address the kernel would use.
    ["192.0.2.1:9", "203.0.113.1:9", "10.255.255.1:9"]
        .iter()
        .find_map(|to| {
            let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
            s.connect(to).ok()?;
            let ip = s.local_addr().ok()?.ip();
            (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
        })
}

fn admin_apps(addr: &str, host: &str, extra: &str) -> String {
    raw_http(
        addr,
        &format!("GET /admin/v1/apps HTTP/1.1\r\nhost: {host}\r\n{extra}connection: close\r\n\r\n"),
    )
}

#[test]
fn with_insecure_and_no_admin_token_the_admin_api_answers_loopback_only() {
    let Some(ip) = non_loopback_local_ip() else {
        eprintln!("skipped: this machine has no address off loopback to connect from");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let node = Node::start(
        tmp.path(),
        &["--listen", "0.0.0.0:0", "--insecure", "--examples"],
    );
    let port = node.addr().rsplit(':').next().unwrap().to_owned();
    let lo = format!("127.0.0.1:{port}");
    let net = format!("{ip}:{port}");
    let a = admin_apps(&lo, &lo, "");
    assert_eq!(raw_status(&a), 200, "{a}");
    // The network reaches the actors (that is what --insecure allows)...
    let inc = "POST /v1/demo/examples/counter/x/increment HTTP/1.1\r\n";
    let a = raw_http(
        &net,
        &format!("{inc}host: {net}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"),
    );
    assert_eq!(raw_status(&a), 200, "{a}");
    // ...but not the admin API, whatever Host it names.
    for host in [&net, &lo] {
        let a = admin_apps(&net, host, "");
        assert_eq!(raw_status(&a), 403, "{a}");
        assert!(a.contains("\"admin_loopback_only\""), "{a}");
    }
    // A page whose name was re-pointed at 127.0.0.1 (DNS rebinding) sends
    // its own name as Host.
    let a = admin_apps(&lo, &format!("rebind.example:{port}"), "");
    assert_eq!(raw_status(&a), 403, "{a}");
    assert!(a.contains("\"host_not_loopback\""), "{a}");
}

#[test]
fn the_admin_api_refuses_browser_pages_and_answers_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let locked = Node::start(&tmp.path().join("a"), &["--admin-token", ADMIN]);
    let addr = locked.addr().to_owned();
    let auth = format!("authorization: Bearer {ADMIN}\r\n");
    for page in [
        "origin: http://evil.example\r\n".to_owned(),
        "origin: null\r\n".to_owned(),
        "sec-fetch-site: cross-site\r\n".to_owned(),
    ] {
        let a = admin_apps(&addr, &addr, &format!("{auth}{page}"));
        assert_eq!(raw_status(&a), 403, "{page}: {a}");
        assert!(a.contains("\"cross_origin\""), "{a}");
    }
    let own = format!("{auth}origin: http://{addr}\r\nsec-fetch-site: same-origin\r\n");
    let a = admin_apps(&addr, &addr, &own);
    assert_eq!(
        raw_status(&a),
        200,
        "the node's own origin was refused: {a}"
    );
    let cli = |node: &Node, token: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_wasmkeep"));
        c.args(["apps", "--server", &node.base]);
        if let Some(t) = token {
            c.args(["--token", t]);
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    cli(&locked, Some(ADMIN));
    // Without a token every page is refused, the node's own origin too
    // (tenants' pages are served from it); the CLI still gets in.
    let open = Node::start(&tmp.path().join("b"), &[]);
    let addr = open.addr().to_owned();
    for page in [
        format!("origin: http://{addr}\r\n"),
        "sec-fetch-site: same-origin\r\n".to_owned(),
        "origin: http://evil.example\r\n".to_owned(),
    ] {
        let a = admin_apps(&addr, &addr, &page);
        assert_eq!(raw_status(&a), 403, "{page}: {a}");
        assert!(a.contains("\"cross_origin\""), "{a}");
    }
    let a = admin_apps(&addr, &addr, "sec-fetch-site: none\r\n");
    assert_eq!(raw_status(&a), 200, "a typed address was refused: {a}");
    cli(&open, None);
}

/// The unsafe variants of the admin API's rules (`WASMKEEP_UNSAFE`): with
/// `admin_open_to_network` a request naming a foreign `Host` (what a
/// rebinding page sends; a remote peer is refused by the same rule) gets
/// in without a token; with `admin_takes_any_page` a page of another
/// origin gets in with the admin token it rides on.
#[test]
fn without_their_rules_the_admin_api_takes_what_it_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let open = Node::start_env(
        &tmp.path().join("a"),
        &[],
        &[("WASMKEEP_UNSAFE", "admin_open_to_network".to_owned())],
    );
    let addr = open.addr().to_owned();
    let port = addr.rsplit(':').next().unwrap();
    let a = admin_apps(&addr, &format!("rebind.example:{port}"), "");
    assert_eq!(raw_status(&a), 200, "{a}");
    let locked = Node::start_env(
        &tmp.path().join("b"),
        &["--admin-token", ADMIN],
        &[("WASMKEEP_UNSAFE", "admin_takes_any_page".to_owned())],
    );
    let addr = locked.addr().to_owned();
    let page = format!("authorization: Bearer {ADMIN}\r\norigin: http://evil.example\r\n");
    let a = admin_apps(&addr, &addr, &page);
    assert_eq!(raw_status(&a), 200, "{a}");
}
