//! WebSockets with hibernation (ADR 0043) through a real node: the bundled
//! class `chat`, real sockets from a real client.

mod common;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use common::Node;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn node_with(settings: &str) -> (tempfile::TempDir, Node) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("node.toml");
    std::fs::write(&config, settings).unwrap();
    let node = Node::start(
        &dir.path().join("data"),
        &["--examples", "--config", config.to_str().unwrap()],
    );
    (dir, node)
}

async fn open(node: &Node, room: &str) -> Socket {
    let url = format!("ws://{}/v1/demo/examples/chat/{room}/ws", node.addr());
    let (ws, resp) = tokio_tungstenite::connect_async(url)
        .await
        .expect("upgrade");
    assert_eq!(resp.status(), 101);
    ws
}

/// The next text message, within a bound; `None` if none comes.
async fn next_text(ws: &mut Socket, within: Duration) -> Option<String> {
    loop {
        match tokio::time::timeout(within, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => return Some(t.to_string()),
            Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => continue,
            _ => return None,
        }
    }
}

/// The close frame's code, within a bound.
async fn close_code(ws: &mut Socket) -> Option<u16> {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Ok(Some(Ok(Message::Close(f)))) => return f.map(|f| u16::from(f.code)),
            Ok(Some(Ok(_))) => continue,
            _ => return None,
        }
    }
}

fn count(node: &Node, room: &str) -> u64 {
    let (_, v) = node.json("GET", &format!("/v1/demo/examples/chat/{room}/count"), b"");
    v["sockets"].as_u64().unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn every_text_reaches_every_socket_of_the_room_and_no_other() {
    let (_dir, node) = node_with("");
    rt().block_on(async {
        let mut a = open(&node, "r1").await;
        let mut b = open(&node, "r1").await;
        let mut c = open(&node, "r1").await;
        let mut other = open(&node, "r2").await;
        assert_eq!(count(&node, "r1"), 3);
        assert_eq!(count(&node, "r2"), 1);
        a.send(Message::Text("hello room".into())).await.unwrap();
        for ws in [&mut a, &mut b, &mut c] {
            assert_eq!(
                next_text(ws, Duration::from_secs(10)).await.as_deref(),
                Some("hello room")
            );
        }
        assert_eq!(
            next_text(&mut other, Duration::from_millis(300)).await,
            None
        );

        // The node answers the auto-response pair itself.
        b.send(Message::Text("ping".into())).await.unwrap();
        assert_eq!(
            next_text(&mut b, Duration::from_secs(10)).await.as_deref(),
            Some("pong")
        );

        // A broadcast whose event fails is never sent; the next one is.
        c.send(Message::Text("!fail this".into())).await.unwrap();
        c.send(Message::Text("after".into())).await.unwrap();
        assert_eq!(
            next_text(&mut a, Duration::from_secs(10)).await.as_deref(),
            Some("after")
        );

        a.close(None).await.unwrap();
        for _ in 0..200 {
            if count(&node, "r1") == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(count(&node, "r1"), 2);
    });
}

#[test]
fn sockets_stay_open_while_their_actor_is_closed_and_wake_it() {
    // Actors close after 200 ms without events: the room hibernates.
    let (_dir, node) = node_with("actor_idle_ms = 200\n");
    rt().block_on(async {
        let mut a = open(&node, "sleepy").await;
        let mut b = open(&node, "sleepy").await;
        assert_eq!(count(&node, "sleepy"), 2);
        // Instances alive on the node, read from /metrics (asking the
        // actor itself would be an event, which keeps it open).
        let instances = |node: &Node| -> u64 {
            let (_, text) = node.get("/metrics");
            text.lines()
                .find_map(|l| l.strip_prefix("wasmkeep_instances_active "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap()
        };
        for _ in 0..300 {
            if instances(&node) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(instances(&node), 0, "the room was closed, its sockets open");
        // Nothing asked the room anything since it closed: the message
        // below is what opens it again.
        a.send(Message::Text("still here".into())).await.unwrap();
        assert_eq!(
            next_text(&mut b, Duration::from_secs(10)).await.as_deref(),
            Some("still here")
        );
    });
}

#[test]
fn a_message_over_its_bound_closes_the_socket_with_1009() {
    let (_dir, node) = node_with("socket_message_bytes_max = 1024\n");
    rt().block_on(async {
        let mut a = open(&node, "big").await;
        a.send(Message::Text("x".repeat(4096).into()))
            .await
            .unwrap();
        assert_eq!(close_code(&mut a).await, Some(u16::from(CloseCode::Size)));
    });
}

#[test]
fn an_idle_socket_is_closed_with_1001() {
    let (_dir, node) = node_with("socket_idle_ms = 300\n");
    rt().block_on(async {
        let mut a = open(&node, "idle").await;
        assert_eq!(close_code(&mut a).await, Some(1001));
    });
}

#[test]
fn a_request_that_is_not_an_upgrade_is_refused_by_the_actor() {
    let (_dir, node) = node_with("");
    let (status, v) = node.json("GET", "/v1/demo/examples/chat/r/ws", b"");
    assert_eq!(status, 500, "{v}");
    assert_eq!(v["error"]["code"], "not_an_upgrade", "{v}");
}

/// In a cluster a socket opened on any node reaches the actor's owner
/// (the node it reached relays it, one hop), and an actor with open
/// sockets stays held by its node however idle it is.
#[test]
fn in_a_cluster_a_socket_reaches_the_owner_from_any_node_and_keeps_the_actor_held() {
    use common::cluster::send;
    use common::load::{Cluster, Store};
    let c = Cluster::with_idle(Store::Folder, 300);
    let a = c.start("a");
    let b = c.start("b");
    let first = send(a.port, "GET", "/v1/demo/examples/chat/x/count", &[]);
    assert_eq!(first.node.as_deref(), Some(a.id.as_str()));
    rt().block_on(async {
        let on_a = format!("ws://127.0.0.1:{}/v1/demo/examples/chat/x/ws", a.port);
        let via_b = format!("ws://127.0.0.1:{}/v1/demo/examples/chat/x/ws", b.port);
        let (mut direct, _) = tokio_tungstenite::connect_async(on_a).await.unwrap();
        let (mut relayed, resp) = tokio_tungstenite::connect_async(via_b).await.unwrap();
        assert_eq!(resp.status(), 101);
        // Well past the idle time and a release scan or two.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = send(b.port, "GET", "/v1/demo/examples/chat/x/count", &[]);
        assert_eq!(after.node.as_deref(), Some(a.id.as_str()), "still a's");
        assert_eq!(after.body["sockets"], 2, "both sockets are the owner's");
        relayed.send(Message::Text("from b".into())).await.unwrap();
        for ws in [&mut direct, &mut relayed] {
            assert_eq!(
                next_text(ws, Duration::from_secs(10)).await.as_deref(),
                Some("from b")
            );
        }
        direct.send(Message::Text("from a".into())).await.unwrap();
        assert_eq!(
            next_text(&mut relayed, Duration::from_secs(10))
                .await
                .as_deref(),
            Some("from a")
        );
        // A close through the relay reaches the owner.
        relayed.close(None).await.unwrap();
        let mut left = 2;
        for _ in 0..200 {
            left = send(a.port, "GET", "/v1/demo/examples/chat/x/count", &[]).body["sockets"]
                .as_u64()
                .unwrap();
            if left == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(left, 1);
    });
}

/// A class migration (ADR 0060) closes the sockets of the actors it moves
/// with 1012: the socket belongs to the old address.
#[test]
fn a_class_migration_closes_its_actors_sockets() {
    let (_dir, node) = node_with("");
    rt().block_on(async {
        let mut ws = open(&node, "room1").await;
        let manifest = "[[migrations]]\ntag = \"chat-to-counter\"\nrenamed_classes = [{ from = \"chat\", to = \"counter\" }]\n";
        let (status, v) = node.json(
            "PUT",
            &format!("/admin/v1/apps/demo/examples?manifest={}", common::enc(manifest)),
            wasmkeep_guests::HELLO,
        );
        assert_eq!(status, 200, "{v}");
        assert_eq!(close_code(&mut ws).await, Some(1012));
    });
}
