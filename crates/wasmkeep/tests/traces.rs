//! Traces (issue 39, ADR 0064) through real processes: two cluster nodes on
//! one folder bucket export their spans over OTLP/HTTP to a small receiver
//! in this test (a TCP listener that decodes OpenTelemetry's protobuf). A
//! request with a sampled `traceparent` sent to the node that does not own
//! its actor yields one trace: the first node's `request` and `forward`,
//! the owner's `request` under that forward, and the owner's `queue`,
//! `guest` (with its `sql` statements), `commit` and `durable` under its
//! request. A request without a `traceparent` sent to the first node (at
//! `trace_sample_pct = 0`) is not traced, and not sampled again by the
//! owner (at 100). A replicated request has its `upload` span, a message
//! between the nodes' actors is one trace over both, and the admin API
//! merges one trace's spans from every live node.

#![allow(
    clippy::disallowed_methods,
    reason = "tests of real processes, sockets and threads wait and measure in real time"
)]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use common::Node;
use common::cluster::{self, free_port};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;

/// A span as the receiver got it: which node exported it (the resource's
/// `service.instance.id`), its name, ids and attributes.
#[derive(Debug, Clone)]
struct Got {
    node: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_id: String,
    attributes: BTreeMap<String, String>,
    /// The spans it links to: (trace id, span id).
    links: Vec<(String, String)>,
}

/// Accepts OTLP/HTTP exports (`POST /v1/traces`, protobuf) and keeps their
/// spans.
fn receiver() -> (u16, Arc<Mutex<Vec<Got>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&got);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let keep = Arc::clone(&keep);
            std::thread::spawn(move || serve(conn, &keep));
        }
    });
    (port, got)
}

/// One connection's requests, answered 200 with an empty (valid) response.
fn serve(conn: std::net::TcpStream, keep: &Mutex<Vec<Got>>) {
    let mut out = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        assert!(line.starts_with("POST /v1/traces"), "{line}");
        let mut length = 0;
        loop {
            let mut h = String::new();
            r.read_line(&mut h).unwrap();
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        r.read_exact(&mut body).unwrap();
        let req = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP protobuf");
        let mut spans = keep.lock().unwrap();
        for rs in req.resource_spans {
            let node = rs
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.instance.id")
                .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    spans.push(Got {
                        node: node.clone(),
                        name: s.name,
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent_id: hex(&s.parent_span_id),
                        attributes: s
                            .attributes
                            .iter()
                            .map(|kv| {
                                (
                                    kv.key.clone(),
                                    text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                                )
                            })
                            .collect(),
                        links: s
                            .links
                            .iter()
                            .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                            .collect(),
                    });
                }
            }
        }
        drop(spans);
        out.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        )
        .unwrap();
    }
}

fn text(v: Option<&AnyValue>) -> String {
    match v {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn start(tmp: &std::path::Path, name: &str, bucket: &str, otlp: u16, pct: u8) -> (Node, u16) {
    let port = free_port();
    let more = format!("trace_sample_pct = {pct}\n");
    let config = cluster::node_config(&tmp.join(name), 1500, 500, 2000, &more);
    let mut flags = cluster::serve_flags(port, &config, bucket);
    flags.extend([
        "--otlp-endpoint".to_owned(),
        format!("http://127.0.0.1:{otlp}"),
    ]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    (Node::start(&tmp.join(name).join("data"), &flags), port)
}

#[test]
fn a_request_through_two_nodes_is_one_trace_exported_over_otlp() {
    let (otlp, got) = receiver();
    let tmp = tempfile::tempdir().unwrap();
    let bucket = format!("file://{}", tmp.path().join("bucket").display());
    for n in ["a", "b"] {
        std::fs::create_dir_all(tmp.path().join(n)).unwrap();
    }
    // B samples every request a client sends it, never one A forwards (A
    // decided: it traces none).
    let (a, a_port) = start(tmp.path(), "a", &bucket, otlp, 0);
    let (b, b_port) = start(tmp.path(), "b", &bucket, otlp, 100);
    let b_id = cluster::status(&b)["node"].as_str().unwrap().to_owned();
    let a_id = cluster::status(&a)["node"].as_str().unwrap().to_owned();
    cluster::wait_for("both nodes in the view", 120, 100, || {
        let (s, v) = a.json("GET", "/admin/v1/cluster", b"");
        s == 200 && v["nodes"].as_array().is_some_and(|n| n.len() == 2)
    });
    // The actor is B's: B answers its first request.
    cluster::wait_for("B takes the actor", 120, 100, || {
        let r = cluster::increment(b_port, "traced");
        r.status == 200 && r.node.as_deref() == Some(b_id.as_str())
    });

    // A client that claims to be a node forwarding is refused, and its
    // sampled context leaves no span.
    let forged_trace = "7df92f3577b34da6a3ce929d0e0e4739";
    let forged = cluster::send(
        a_port,
        "POST",
        "/v1/demo/examples/counter/traced/increment",
        &[
            ("x-wasmkeep-forwarded", "1"),
            (
                "traceparent",
                &format!("00-{forged_trace}-00f067aa0ba902b7-01"),
            ),
        ],
    );
    assert_eq!(forged.status, 403, "{:?}", forged.body);
    assert_eq!(forged.traceresponse, None);
    let (s, v) = a.json("GET", &format!("/admin/v1/traces/{forged_trace}"), b"");
    assert_eq!(
        (s, v["spans"].as_array().map(Vec::len)),
        (200, Some(0)),
        "{v}"
    );

    // Not sampled at A, and not sampled again at B: no traceresponse.
    let plain = cluster::send(
        a_port,
        "POST",
        "/v1/demo/examples/counter/traced/increment",
        &[],
    );
    assert_eq!(plain.status, 200);
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{client_trace}-{client_span}-01");
    let answer = cluster::send(
        a_port,
        "POST",
        "/v1/demo/examples/counter/traced/increment",
        &[("traceparent", traceparent.as_str())],
    );
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(
        answer.node.as_deref(),
        Some(b_id.as_str()),
        "forwarded to B"
    );
    let traceresponse = answer
        .traceresponse
        .clone()
        .expect("a traced request's answer names its trace");
    assert!(
        traceresponse.starts_with(&format!("00-{client_trace}-")),
        "{traceresponse}"
    );
    assert_eq!(plain.traceresponse, None, "an unsampled request was traced");

    // Every span of the trace reaches the receiver.
    let names = [
        "request", "forward", "queue", "guest", "sql", "commit", "durable",
    ];
    let mut spans = Vec::new();
    cluster::wait_for("the trace's spans at the receiver", 60, 100, || {
        spans = got
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace_id == client_trace)
            .cloned()
            .collect();
        names.iter().all(|n| spans.iter().any(|s| &s.name == n))
            && spans.iter().filter(|s| s.name == "request").count() == 2
    });
    let one = |node: &str, name: &str| {
        spans
            .iter()
            .find(|s| s.node == node && s.name == name)
            .unwrap_or_else(|| panic!("no {name} span from {node}: {spans:#?}"))
            .clone()
    };
    let a_request = one(&a_id, "request");
    let forward = one(&a_id, "forward");
    let b_request = one(&b_id, "request");
    assert_eq!(
        a_request.parent_id, client_span,
        "A's request is the client's child"
    );
    assert_eq!(forward.parent_id, a_request.span_id);
    assert_eq!(forward.attributes["wasmkeep.node.to"], b_id);
    assert_eq!(
        b_request.parent_id, forward.span_id,
        "B's request is A's forward's child"
    );
    assert_eq!(
        b_request.attributes["wasmkeep.actor"],
        "demo/examples/counter/traced"
    );
    assert_eq!(b_request.attributes["http.response.status_code"], "200");
    for name in ["queue", "guest", "commit", "durable"] {
        assert_eq!(one(&b_id, name).parent_id, b_request.span_id, "{name}");
    }
    let guest = one(&b_id, "guest");
    let sql = one(&b_id, "sql");
    assert_eq!(sql.parent_id, guest.span_id);
    assert!(
        sql.attributes["db.query.text"].contains("UPDATE counter"),
        "{sql:?}"
    );
    // Only B ran the event.
    assert!(
        spans
            .iter()
            .all(|s| s.node == b_id || ["request", "forward"].contains(&s.name.as_str()))
    );
    // Every span came once.
    for (name, n) in [
        ("request", 2),
        ("forward", 1),
        ("queue", 1),
        ("guest", 1),
        ("commit", 1),
        ("durable", 1),
    ] {
        assert_eq!(
            spans.iter().filter(|s| s.name == name).count(),
            n,
            "{name} spans: {spans:#?}"
        );
    }

    // The admin API merges the trace's spans from both nodes.
    let (s, v) = a.json(
        "GET",
        &format!("/admin/v1/traces/{client_trace}?cluster=true"),
        b"",
    );
    assert_eq!(s, 200, "{v}");
    let merged: Vec<&str> = v["spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    for n in names {
        assert!(merged.contains(&n), "{n} missing from {merged:?}");
    }
    assert_eq!(v["nodes_unreachable"], serde_json::json!([]));
    let (s, here) = a.json("GET", &format!("/admin/v1/traces/{client_trace}"), b"");
    assert_eq!(s, 200);
    assert!(
        here["spans"].as_array().unwrap().len() < merged.len(),
        "without cluster=true only A's spans: {here}"
    );

    // A request that waits for the bucket has an `upload` span under its
    // request, after its `durable`.
    let upload_trace = "6cf92f3577b34da6a3ce929d0e0e4738";
    let replicated = cluster::send(
        b_port,
        "POST",
        "/v1/demo/examples/counter/traced/increment",
        &[
            (
                "traceparent",
                &format!("00-{upload_trace}-{client_span}-01"),
            ),
            ("wasmkeep-durability", "replicated"),
        ],
    );
    assert_eq!(replicated.status, 200, "{:?}", replicated.body);
    let (s, v) = b.json("GET", &format!("/admin/v1/traces/{upload_trace}"), b"");
    assert_eq!(s, 200);
    let spans_of = |v: &serde_json::Value, name: &str| {
        v["spans"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["name"] == name)
            .cloned()
            .collect::<Vec<_>>()
    };
    let (request, upload) = (spans_of(&v, "request"), spans_of(&v, "upload"));
    assert_eq!((request.len(), upload.len()), (1, 1), "{v}");
    assert_eq!(upload[0]["parent_id"], request[0]["span_id"]);
    assert_eq!(upload[0]["error"], serde_json::Value::Null);

    // A message from B's actor to A's crosses the nodes with its trace: A
    // runs the message's event under B's `send` span.
    cluster::wait_for("A takes pa", 120, 100, || {
        let r = cluster::send(a_port, "GET", "/v1/demo/examples/pinger/pa/stats", &[]);
        r.status == 200 && r.node.as_deref() == Some(a_id.as_str())
    });
    cluster::wait_for("B takes pb", 120, 100, || {
        let r = cluster::send(b_port, "GET", "/v1/demo/examples/pinger/pb/stats", &[]);
        r.status == 200 && r.node.as_deref() == Some(b_id.as_str())
    });
    let ping_trace = "5bf92f3577b34da6a3ce929d0e0e4737";
    let ping = cluster::send(
        b_port,
        "POST",
        "/v1/demo/examples/pinger/pb/ping?to=pa&n=1",
        &[("traceparent", &format!("00-{ping_trace}-{client_span}-01"))],
    );
    assert_eq!(ping.status, 200, "{:?}", ping.body);
    let mut spans = Vec::new();
    cluster::wait_for("the message's spans", 60, 100, || {
        spans = got
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace_id == ping_trace)
            .cloned()
            .collect();
        let guests = spans.iter().filter(|s| s.name == "guest").count();
        // pb's request, pa's message, pb's answer.
        spans.iter().any(|s| s.name == "send") && guests >= 3
    });
    let send = spans.iter().find(|s| s.name == "send").unwrap();
    assert_eq!(send.node, b_id);
    assert!(
        send.attributes["wasmkeep.to"].ends_with("pinger/pa"),
        "{send:?}"
    );
    let guest_of = |actor: &str, parent: &str| {
        spans.iter().any(|s| {
            s.name == "guest" && s.attributes["wasmkeep.actor"] == actor && s.parent_id == parent
        })
    };
    assert!(
        guest_of("demo/examples/pinger/pa", &send.span_id),
        "pa's event under pb's send: {spans:#?}"
    );
    assert!(
        spans.iter().any(|s| s.name == "guest"
            && s.node == a_id
            && s.attributes["wasmkeep.actor"] == "demo/examples/pinger/pa"),
        "pa's event ran on A"
    );
    assert!(
        guest_of("demo/examples/pinger/pb", &send.span_id),
        "the answer's event on pb under the send: {spans:#?}"
    );
}

/// A call the handler of a traced request makes through the outbox carries
/// the trace on: the called server gets a `traceparent` of the trace, and
/// the node records a `fetch` span with that id under the event's `guest`
/// span once the call is answered. A call from an untraced request carries
/// no `traceparent`.
#[test]
fn a_fetch_from_a_traced_event_carries_the_trace_on() {
    // A server that answers 200 and keeps each request's `traceparent`.
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let keep = Arc::clone(&seen);
    std::thread::spawn(move || {
        for conn in server.incoming() {
            let Ok(conn) = conn else { continue };
            let mut out = conn.try_clone().unwrap();
            let mut r = BufReader::new(conn);
            let mut traceparent = None;
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) == 0 {
                    break;
                }
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':')
                    && k.eq_ignore_ascii_case("traceparent")
                {
                    traceparent = Some(v.trim().to_owned());
                }
            }
            keep.lock().unwrap().push(traceparent);
            let _ = out
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
        }
    });
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("node.toml");
    std::fs::write(&cfg, "outbound_private_allowed = true\n").unwrap();
    let node = Node::start(
        &tmp.path().join("data"),
        &["--config", cfg.to_str().unwrap()],
    );
    let manifest = format!("[outbound]\nhosts = [\"127.0.0.1:{port}\"]\n");
    let (s, v) = node.json(
        "PUT",
        &format!(
            "/admin/v1/apps/acme/web?manifest={}",
            common::enc(&manifest)
        ),
        wasmkeep_guests::DEMO,
    );
    assert_eq!(s, 200, "{v}");
    let fetch = format!(
        "/v1/acme/web/pinger/p1/fetch?url={}",
        common::enc(&format!("http://127.0.0.1:{port}/"))
    );
    // Untraced first: its call carries no traceparent.
    assert_eq!(node.post(&fetch, b"").0, 200);
    cluster::wait_for("the untraced call", 60, 50, || {
        seen.lock().unwrap().len() == 1
    });
    assert_eq!(seen.lock().unwrap()[0], None);

    let trace = "0af7651916cd43dd8448eb211c80319c";
    let (s, b) = node.send_headers(
        "POST",
        &fetch,
        b"",
        &[("traceparent", format!("00-{trace}-b7ad6b7169203331-01"))],
    );
    assert_eq!(s, 200, "{b}");
    cluster::wait_for("the traced call", 60, 50, || {
        seen.lock().unwrap().len() == 2
    });
    let sent = seen.lock().unwrap()[1]
        .clone()
        .expect("the call carries a traceparent");
    assert!(sent.starts_with(&format!("00-{trace}-")), "{sent}");
    let call_span = &sent[36..52];
    let mut spans = serde_json::Value::Null;
    cluster::wait_for("the fetch span", 60, 50, || {
        let (s, v) = node.json("GET", &format!("/admin/v1/traces/{trace}"), b"");
        spans = v;
        s == 200
            && spans["spans"]
                .as_array()
                .is_some_and(|a| a.iter().any(|sp| sp["name"] == "fetch"))
    });
    let all = spans["spans"].as_array().unwrap();
    let fetch_span = all.iter().find(|sp| sp["name"] == "fetch").unwrap();
    let guest = all.iter().find(|sp| sp["name"] == "guest").unwrap();
    assert_eq!(
        fetch_span["span_id"], call_span,
        "the span the server was told of"
    );
    assert_eq!(fetch_span["parent_id"], guest["span_id"]);
    assert_eq!(fetch_span["kind"], "client");
    assert_eq!(fetch_span["attributes"]["http.response.status_code"], 200);
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The node's kept `alarm` root spans of one actor (newest first).
fn alarm_spans(node: &Node, actor: &str) -> Vec<serde_json::Value> {
    let (s, v) = node.json("GET", "/admin/v1/traces?limit=200", b"");
    assert_eq!(s, 200, "{v}");
    v["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|sp| sp["name"] == "alarm" && sp["attributes"]["wasmkeep.actor"] == actor)
        .cloned()
        .collect()
}

/// One trace's spans as this node keeps them.
fn trace_spans(node: &Node, trace_id: &str) -> Vec<serde_json::Value> {
    let (s, v) = node.json("GET", &format!("/admin/v1/traces/{trace_id}"), b"");
    assert_eq!(s, 200, "{v}");
    v["spans"].as_array().unwrap().clone()
}

#[test]
fn an_alarm_runs_in_a_trace_linked_to_the_event_that_set_it() {
    let tmp = tempfile::tempdir().unwrap();
    // Nothing sampled: only a client's sampled traceparent is traced.
    let cfg = tmp.path().join("node.toml");
    std::fs::write(&cfg, "trace_sample_pct = 0\n").unwrap();
    let (otlp, got) = receiver();
    let endpoint = format!("http://127.0.0.1:{otlp}");
    let node = Node::start(
        &tmp.path().join("data"),
        &[
            "--examples",
            "--config",
            cfg.to_str().unwrap(),
            "--otlp-endpoint",
            &endpoint,
        ],
    );
    let set = |name: &str, query: &str, traceparent: Option<&str>| {
        let path = format!("/v1/demo/examples/reminder/{name}/set?{query}");
        let headers: Vec<(&str, String)> = traceparent
            .map(|t| vec![("traceparent", t.to_owned())])
            .unwrap_or_default();
        let (s, b) = node.send_headers("POST", &path, b"", &headers);
        assert_eq!(s, 200, "{b}");
    };
    let fired = |name: &str| {
        let (_, v) = node.json(
            "GET",
            &format!("/v1/demo/examples/reminder/{name}/fired"),
            b"",
        );
        v["fired"].as_array().map_or(0, Vec::len)
    };
    let traced = "4bf92f3577b34da6a3ce929d0e0e4736";
    let soon = unix_ms() + 300;
    // r1: set by a traced request; r2: by an untraced one; r3: by a
    // traced request, then again by an untraced one (the link goes).
    set(
        "r1",
        &format!("at_ms={soon}"),
        Some(&format!("00-{traced}-00f067aa0ba902b7-01")),
    );
    set("r2", &format!("at_ms={soon}"), None);
    let other = "5bf92f3577b34da6a3ce929d0e0e4736";
    set(
        "r3",
        &format!("at_ms={soon}"),
        Some(&format!("00-{other}-00f067aa0ba902b7-01")),
    );
    set("r3", &format!("at_ms={soon}"), None);
    // r4: set by a traced request, failing its first run: the retry is
    // linked too. Due after the others, so once its spans are kept, theirs
    // would be.
    let third = "6bf92f3577b34da6a3ce929d0e0e4736";
    set(
        "r4",
        &format!("at_ms={}&fail_times=1", soon + 300),
        Some(&format!("00-{third}-00f067aa0ba902b7-01")),
    );
    cluster::wait_for("the alarms", 60, 50, || {
        fired("r1") == 1 && fired("r2") == 1 && fired("r3") == 1 && fired("r4") == 1
    });
    let mut runs = Vec::new();
    cluster::wait_for("r1's alarm span", 60, 50, || {
        runs = alarm_spans(&node, "demo/examples/reminder/r1");
        !runs.is_empty()
    });
    assert_eq!(runs.len(), 1, "{runs:?}");
    let run = &runs[0];
    assert_eq!(run["kind"], "consumer");
    assert_eq!(
        run["parent_id"],
        serde_json::Value::Null,
        "a trace of its own"
    );
    assert_ne!(run["trace_id"], traced);
    // Linked to the `guest` span of the request that set it.
    let setter = trace_spans(&node, traced);
    let guest = setter
        .iter()
        .find(|sp| sp["name"] == "guest")
        .expect("the setting request's guest span");
    assert_eq!(run["links"][0]["trace_id"], traced);
    assert_eq!(run["links"][0]["span_id"], guest["span_id"]);
    // The run's own event spans hang under it.
    let run_trace = run["trace_id"].as_str().unwrap();
    let own = trace_spans(&node, run_trace);
    let run_guest = own.iter().find(|sp| sp["name"] == "guest").expect("guest");
    assert_eq!(run_guest["parent_id"], run["span_id"]);
    assert!(own.iter().any(|sp| sp["name"] == "commit"), "{own:?}");
    // OTLP carries the link.
    cluster::wait_for("the exported alarm span", 60, 50, || {
        got.lock()
            .unwrap()
            .iter()
            .any(|g| g.name == "alarm" && g.trace_id == run_trace)
    });
    let exported = got
        .lock()
        .unwrap()
        .iter()
        .find(|g| g.name == "alarm")
        .cloned()
        .unwrap();
    assert_eq!(
        exported.links,
        vec![(
            traced.to_owned(),
            guest["span_id"].as_str().unwrap().to_owned()
        )]
    );
    assert_eq!(exported.parent_id, "");
    // The failed run and its retry, both linked to r4's setter.
    let mut r4 = Vec::new();
    cluster::wait_for("r4's two runs", 60, 50, || {
        r4 = alarm_spans(&node, "demo/examples/reminder/r4");
        r4.len() == 2
    });
    let setter = trace_spans(&node, third);
    let guest = setter.iter().find(|sp| sp["name"] == "guest").unwrap();
    for run in &r4 {
        assert_eq!(run["links"][0]["span_id"], guest["span_id"], "{run}");
    }
    // Newest first: the retry succeeded, the first run failed.
    assert_eq!(r4[0]["error"], serde_json::Value::Null);
    assert_eq!(r4[1]["error"], "guest_error", "{:?}", r4[1]);
    // Only alarms a traced event set are traced.
    assert!(alarm_spans(&node, "demo/examples/reminder/r2").is_empty());
    assert!(
        alarm_spans(&node, "demo/examples/reminder/r3").is_empty(),
        "an untraced request set r3's alarm last"
    );
}

#[test]
fn a_retrying_alarm_shows_its_failures_in_the_pending_list() {
    let tmp = tempfile::tempdir().unwrap();
    let node = Node::start(&tmp.path().join("data"), &["--examples"]);
    let path = format!(
        "/v1/demo/examples/reminder/flaky/set?at_ms={}&fail_times=5",
        unix_ms()
    );
    assert_eq!(node.post(&path, b"").0, 200);
    let (s, _) = node.post(
        "/v1/demo/examples/reminder/steady/set?at_ms=9999999999999",
        b"",
    );
    assert_eq!(s, 200);
    let mut listed = serde_json::Value::Null;
    cluster::wait_for("a failed run", 60, 50, || {
        let (s, v) = node.json("GET", "/admin/v1/alarms/demo", b"");
        assert_eq!(s, 200, "{v}");
        listed = v;
        listed["alarms"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["name"] == "flaky" && a["retry_count"].as_u64() >= Some(1))
    });
    let steady = listed["alarms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "steady")
        .expect("the steady alarm is pending");
    assert_eq!(steady["retry_count"], 0, "{listed}");
}

#[test]
fn a_sampled_socket_message_is_the_root_of_its_own_trace() {
    use futures_util::SinkExt;
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("node.toml");
    std::fs::write(&cfg, "trace_sample_pct = 100\n").unwrap();
    let node = Node::start(
        &tmp.path().join("data"),
        &["--examples", "--config", cfg.to_str().unwrap()],
    );
    let url = format!(
        "ws://{}/v1/demo/examples/chat/room1/ws?name=ada",
        node.addr()
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut ws = rt.block_on(async {
        let (mut ws, resp) = tokio_tungstenite::connect_async(url)
            .await
            .expect("upgrade");
        assert_eq!(resp.status(), 101);
        ws.send(tokio_tungstenite::tungstenite::Message::Text(
            "hello".into(),
        ))
        .await
        .unwrap();
        ws
    });
    let mut root = serde_json::Value::Null;
    cluster::wait_for("the socket span", 60, 50, || {
        let (_, v) = node.json("GET", "/admin/v1/traces?limit=200", b"");
        root = v["requests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|sp| sp["name"] == "socket")
            .cloned()
            .unwrap_or_default();
        !root.is_null()
    });
    assert_eq!(root["kind"], "consumer");
    assert_eq!(root["parent_id"], serde_json::Value::Null);
    assert_eq!(
        root["attributes"]["wasmkeep.actor"],
        "demo/examples/chat/room1"
    );
    let spans = trace_spans(&node, root["trace_id"].as_str().unwrap());
    let guest = spans
        .iter()
        .find(|sp| sp["name"] == "guest")
        .expect("guest");
    assert_eq!(guest["parent_id"], root["span_id"]);
    assert_eq!(guest["error"], serde_json::Value::Null);
    rt.block_on(async { ws.close(None).await.ok() });
}
