//! Messages between actors held by different nodes of a cluster (ADR
//! 0040), through real processes on a shared folder bucket: the outbox's
//! dispatcher routes each message (and each answer) to whichever node
//! holds its actor, through the cluster's forwarding.

mod common;

use common::cluster::{self, send};
use common::load::{Cluster, Store};

fn wait_for(what: &str, f: impl FnMut() -> bool) {
    cluster::wait_for(what, 120, 50, f)
}

fn pinger(port: u16, name: &str, path: &str, method: &str) -> cluster::Answer {
    send(
        port,
        method,
        &format!("/v1/demo/examples/pinger/{name}{path}"),
        &[],
    )
}

#[test]
fn messages_reach_actors_on_other_nodes_and_their_answers_come_back() {
    let c = Cluster::new(Store::Folder);
    let a = c.start("a");
    let b = c.start("b");
    // x is a's, y is b's: each is created through its node.
    let x = pinger(a.port, "x", "/pongs", "GET");
    assert_eq!(x.status, 200, "{}", x.body);
    assert_eq!(x.node.as_deref(), Some(a.id.as_str()));
    let y = pinger(b.port, "y", "/pongs", "GET");
    assert_eq!(y.node.as_deref(), Some(b.id.as_str()));

    let sent = pinger(a.port, "x", "/ping?to=y&n=10", "POST");
    assert_eq!(sent.status, 200, "{}", sent.body);
    let sent = pinger(b.port, "y", "/ping?to=x&n=5", "POST");
    assert_eq!(sent.status, 200, "{}", sent.body);
    wait_for("x's ten answers", || {
        pinger(b.port, "x", "/pongs", "GET").body["answered"] == 10
    });
    wait_for("y's five answers", || {
        pinger(a.port, "y", "/pongs", "GET").body["answered"] == 5
    });
    let x = pinger(a.port, "x", "/pongs", "GET");
    assert_eq!(
        x.body,
        serde_json::json!({"sent": 10, "answered": 10, "duplicates": 0})
    );
    let ys = pinger(a.port, "y", "/stats", "GET");
    assert_eq!(ys.node.as_deref(), Some(b.id.as_str()), "y stayed on b");
    assert_eq!(ys.body["received"], 10);
    assert_eq!(ys.body["received_twice"], 0);
    let xs = pinger(b.port, "x", "/stats", "GET");
    assert_eq!(xs.body["received"], 5);

    // A parked reply (ADR 0042): the client asks x through b; x parks its
    // reply, asks y (on b), and answers from the event that applies y's
    // answer.
    let relayed = pinger(b.port, "x", "/relay?to=y", "POST");
    assert_eq!(relayed.status, 200, "{}", relayed.body);
    assert!(
        relayed
            .body
            .as_str()
            .unwrap_or_default()
            .starts_with("relayed: pong relay-"),
        "{}",
        relayed.body
    );
    assert_eq!(relayed.node.as_deref(), Some(a.id.as_str()));
}

#[test]
fn the_inbound_route_needs_a_nodes_signature() {
    let c = Cluster::new(Store::Folder);
    let a = c.start("a");
    let r = send(
        a.port,
        "POST",
        "/internal/inbound/v1/demo/examples/pinger/x",
        &[],
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.body["error"]["code"], "node_signature_invalid");
}

/// Messages an actor sent that were not delivered when its node died go
/// out after the node restarts, with no request to the actor: the
/// start-up scan finds its rows, and once the node acts (its lease
/// registered) it takes the actor (it opens no actor it does not hold,
/// ADR 0020) and sends them.
#[test]
fn unsent_messages_go_out_after_their_node_restarts() {
    let c = Cluster::new(Store::Folder);
    let mut a = c.start("a");
    let mut b = c.start("b");
    let y = pinger(b.port, "y", "/pongs", "GET");
    assert_eq!(y.node.as_deref(), Some(b.id.as_str()));
    // y's node dies: x's messages to y wait in x's outbox.
    b.node.kill();
    let sent = pinger(a.port, "x", "/ping?to=y&n=3", "POST");
    assert_eq!(sent.status, 200, "{}", sent.body);
    assert_eq!(sent.node.as_deref(), Some(a.id.as_str()));
    a.node.kill();
    let again = c.start_on(&a.data, a.port, None);
    assert_eq!(again.id, a.id);
    // Nothing asks x: y (taken by the restarted node once b's lease
    // lapsed) receives the three all the same.
    wait_for("y to receive x's messages", || {
        let ys = pinger(again.port, "y", "/stats", "GET");
        ys.status == 200 && ys.body["received"] == 3
    });
    wait_for("x's three answers", || {
        pinger(again.port, "x", "/pongs", "GET").body["answered"] == 3
    });
}
