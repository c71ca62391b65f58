//! Actors written in TypeScript (issue 35) on a real node: `serve
//! --examples` deploys `demo/examples-ts` beside `demo/examples`, and each
//! contract check below runs against both apps, so the TypeScript classes
//! answer what their Rust namesakes answer. The components are built from
//! `examples/ts` with the SDK in `sdk/ts` (crates/wasmkeep-guests).

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt, StreamExt};
use serde_json::Value as Json;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use common::Node;

/// Both bundled apps: every check runs on each.
const APPS: [&str; 2] = ["examples", "examples-ts"];

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn examples_node() -> (tempfile::TempDir, Node) {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("data"), &["--examples"]);
    (dir, node)
}

/// Polls `path` until `done` holds for its JSON answer, for at most 30 s.
fn wait_for(node: &Node, path: &str, done: impl Fn(&Json) -> bool) -> Json {
    let deadline = now_ms() + 30_000;
    loop {
        let (s, v) = node.json("GET", path, b"");
        if s == 200 && done(&v) {
            return v;
        }
        assert!(now_ms() < deadline, "{path} never got there: {s} {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn serve_examples_deploys_the_typescript_app_and_its_counter_counts_as_the_rust_one() {
    let (_dir, node) = examples_node();
    let (s, apps) = node.json("GET", "/admin/v1/apps", b"");
    assert_eq!(s, 200, "{apps}");
    let names: Vec<&str> = apps
        .as_array()
        .or_else(|| apps["apps"].as_array())
        .unwrap()
        .iter()
        .map(|a| a["app"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"examples") && names.contains(&"examples-ts"),
        "{apps}"
    );
    for app in APPS {
        let base = format!("/v1/demo/{app}/counter/c");
        for want in 1..=3 {
            let (s, v) = node.json("POST", &format!("{base}/increment"), b"");
            assert_eq!(
                (s, v.clone()),
                (200, serde_json::json!({ "value": want })),
                "{app}"
            );
        }
        let (s, v) = node.json("GET", &format!("{base}/value"), b"");
        assert_eq!((s, v), (200, serde_json::json!({ "value": 3 })), "{app}");
        let (s, _) = node.json("GET", &format!("{base}/nope"), b"");
        assert_eq!(s, 404, "{app}: an unknown route");
    }
}

#[test]
fn the_typescript_reminder_fires_retries_and_repeats_as_the_rust_one() {
    let (_dir, node) = examples_node();
    let mut fired = Vec::new();
    for app in APPS {
        let base = format!("/v1/demo/{app}/reminder");
        // Fails twice, then succeeds on the second retry.
        let due = now_ms() + 300;
        let (s, v) = node.json(
            "POST",
            &format!("{base}/r/set?at_ms={due}&fail_times=2"),
            b"",
        );
        assert_eq!(
            (s, v.clone()),
            (200, serde_json::json!({ "alarm": due })),
            "{app}"
        );
        // Every 200 ms from a fixed anchor, three runs.
        let anchor = now_ms() + 200;
        let (s, v) = node.json(
            "POST",
            &format!("{base}/e/set?at_ms={anchor}&every_ms=200&count=3"),
            b"",
        );
        assert_eq!(s, 200, "{app}: {v}");
        let (s, v) = node.json("POST", &format!("{base}/x/set?at_ms=soon"), b"");
        assert_eq!((s, common::code(&v)), (400, "bad_request"), "{app}: {v}");
        let r = wait_for(&node, &format!("{base}/r/fired"), |v| {
            !v["fired"].as_array().unwrap().is_empty()
        });
        let run = &r["fired"][0];
        assert_eq!(run["retry_count"], 2, "{app}: {r}");
        assert_eq!(run["is_retry"], true, "{app}: {r}");
        assert_eq!(run["alarm_in_handler"], Json::Null, "{app}: {r}");
        assert!(
            run["fired_ms"].as_u64().unwrap() >= due,
            "{app}: fired early: {r}"
        );
        let e = wait_for(&node, &format!("{base}/e/fired"), |v| {
            v["fired"].as_array().unwrap().len() == 3
        });
        let dues: Vec<u64> = e["fired"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["due_ms"].as_u64().unwrap())
            .collect();
        assert_eq!(dues, [anchor, anchor + 200, anchor + 400], "{app}: {e}");
        let (_, a) = node.json("GET", &format!("{base}/e/alarm"), b"");
        assert_eq!(a, serde_json::json!({ "alarm": null }), "{app}");
        // The same fields, of the same kinds, in both languages.
        let keys = |v: &Json| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        fired.push(keys(run));
    }
    assert_eq!(fired[0], fired[1], "the two reminders answer other fields");
}

#[test]
fn the_typescript_pinger_sends_once_relays_and_sends_nothing_for_a_failed_event() {
    let (_dir, node) = examples_node();
    for app in APPS {
        let base = format!("/v1/demo/{app}/pinger");
        let (s, v) = node.json("POST", &format!("{base}/a/ping?to=b&n=5"), b"");
        assert_eq!(s, 200, "{app}: {v}");
        assert_eq!(v["queued"], 5, "{app}: {v}");
        let pongs = wait_for(&node, &format!("{base}/a/pongs"), |v| v["answered"] == 5);
        assert_eq!(
            pongs,
            serde_json::json!({ "sent": 5, "answered": 5, "duplicates": 0 }),
            "{app}"
        );
        let (_, stats) = node.json("GET", &format!("{base}/b/stats"), b"");
        assert_eq!(
            stats,
            serde_json::json!({ "received": 5, "received_twice": 0, "failed": 0 }),
            "{app}"
        );
        // A send in an event that fails never leaves.
        let (s, v) = node.json("POST", &format!("{base}/c/ping?to=d&n=3&fail=1"), b"");
        assert_eq!(s, 500, "{app}: {v}");
        let (s, body) = node.send("POST", &format!("{base}/a/relay?to=b"), b"");
        assert_eq!(s, 200, "{app}: {body}");
        assert!(body.starts_with("relayed: pong relay-"), "{app}: {body}");
        std::thread::sleep(Duration::from_millis(300));
        let (_, stats) = node.json("GET", &format!("{base}/d/stats"), b"");
        assert_eq!(
            stats["received"], 0,
            "{app}: the failed event's sends left: {stats}"
        );
        let (_, v) = node.json("GET", &format!("{base}/a/config?name=missing"), b"");
        assert_eq!(v, serde_json::json!({ "value": null }), "{app}");
    }
}

#[test]
fn the_typescript_chat_room_broadcasts_and_drops_a_failed_events_messages() {
    let (_dir, node) = examples_node();
    let rt = current_thread();
    for app in APPS {
        rt.block_on(async {
            let url =
                |who: &str| format!("ws://{}/v1/demo/{app}/chat/room/ws?name={who}", node.addr());
            let (mut a, resp) = tokio_tungstenite::connect_async(url("ada")).await.unwrap();
            assert_eq!(resp.status(), 101, "{app}");
            let (mut b, _) = tokio_tungstenite::connect_async(url("bob")).await.unwrap();
            a.send(Message::text("!fail first")).await.unwrap();
            a.send(Message::text("hello")).await.unwrap();
            for ws in [&mut a, &mut b] {
                let got = next_text(ws).await;
                assert_eq!(
                    got.as_deref(),
                    Some("hello"),
                    "{app}: the failed event's broadcast left"
                );
            }
            // The node answers the keep-alive itself.
            b.send(Message::text("ping")).await.unwrap();
            assert_eq!(next_text(&mut b).await.as_deref(), Some("pong"), "{app}");
            // While both sockets are open: the names they gave, kept as
            // their attachments.
            let (_, who) = node.json("GET", &format!("/v1/demo/{app}/chat/room/who"), b"");
            assert_eq!(who, serde_json::json!({ "names": ["ada", "bob"] }), "{app}");
        });
    }
}

/// One socket closes with a close frame, the other's connection just ends:
/// the room hears the first in `socket_close` and the second in
/// `socket_error` (code 1006, Durable Objects' `webSocketError`), in both
/// languages.
#[test]
fn a_chat_room_tells_a_failed_connection_from_a_closed_one() {
    let (_dir, node) = examples_node();
    let rt = current_thread();
    for app in APPS {
        let left = format!("/v1/demo/{app}/chat/gone/left");
        rt.block_on(async {
            let url =
                |who: &str| format!("ws://{}/v1/demo/{app}/chat/gone/ws?name={who}", node.addr());
            let (mut ada, _) = tokio_tungstenite::connect_async(url("ada")).await.unwrap();
            let (bob, _) = tokio_tungstenite::connect_async(url("bob")).await.unwrap();
            ada.close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "bye".into(),
            }))
            .await
            .unwrap();
            wait_for(&node, &left, |v| {
                v["left"].as_array().is_some_and(|l| l.len() == 1)
            });
            // Dropped without a close frame: the TCP connection ends.
            drop(bob);
        });
        let v = wait_for(&node, &left, |v| {
            v["left"].as_array().is_some_and(|l| l.len() == 2)
        });
        let ends: Vec<(&str, u64, bool)> = v["left"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap(),
                    e["code"].as_u64().unwrap(),
                    e["failed"].as_bool().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            ends,
            [("ada", 1000, false), ("bob", 1006, true)],
            "{app}: {v}"
        );
        assert!(
            !v["left"][1]["reason"].as_str().unwrap().is_empty(),
            "{app}: a failure says what happened: {v}"
        );
    }
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn next_text(
    ws: &mut tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
) -> Option<String> {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => return Some(t.to_string()),
            Ok(Some(Ok(_))) => continue,
            _ => return None,
        }
    }
}
