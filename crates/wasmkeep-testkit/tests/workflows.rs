//! Durable workflows (issue 36), in both SDKs: the `orders` class of the
//! Rust and of the TypeScript examples runs the same workflows with the
//! same routes, and every test runs against both. Each `run` step counts
//! its effect in the actor's `effects` table: a step that ran twice, or
//! whose failed attempt left something, shows.

#![allow(
    clippy::disallowed_methods,
    reason = "polls the node's own delivery threads in real time"
)]

use std::time::Duration;

use serde_json::{Value, json};
use wasmkeep_guests::{DEMO, EXAMPLES_TS};
use wasmkeep_testkit::{ActorHandle, TestNode};

const CLASSES: [&str; 2] = ["demo/examples/orders", "demo/examples-ts/orders"];

fn node() -> TestNode {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    node.deploy("demo/examples-ts", EXAMPLES_TS).unwrap();
    node
}

fn status(a: &ActorHandle<'_>, id: &str) -> Value {
    a.get(&format!("/status?id={id}")).json()
}

fn effects(a: &ActorHandle<'_>) -> Value {
    a.get("/effects").json()
}

fn post(a: &ActorHandle<'_>, path: &str) {
    let r = a.post(path, "");
    assert_eq!(r.status, 204, "{path}: {}", r.text());
}

#[test]
fn an_order_goes_through_its_sleep_and_its_wait_running_each_step_once() {
    let node = node();
    for class in CLASSES {
        let a = node.actor(&format!("{class}/shop"));
        post(&a, "/start?id=o1");
        node.settle_outbox();
        let s = status(&a, "o1");
        assert_eq!(
            (s["state"].clone(), s["step"].clone()),
            (json!("sleeping"), json!(1)),
            "{class}: {s}"
        );
        assert_eq!(
            s["history"][0]["result"],
            json!({"reserved": true, "attempt": 1})
        );
        // An approval sent before the instance waits for it is kept.
        assert_eq!(a.post("/signal?id=o1&event=approved", "yes").status, 204);
    }
    node.advance(Duration::from_secs(60));
    node.settle_outbox();
    for class in CLASSES {
        let a = node.actor(&format!("{class}/shop"));
        let s = status(&a, "o1");
        assert_eq!(s["state"], "done", "{class}: {s}");
        let names: Vec<_> = s["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["name"].clone())
            .collect();
        assert_eq!(
            names,
            vec![
                json!("reserve"),
                json!("cool-off"),
                json!("approval"),
                json!("ship")
            ]
        );
        assert_eq!(s["history"][2]["result"], "yes");
        assert_eq!(
            s["history"][3]["result"],
            json!({"approved": "yes"}),
            "{class}"
        );
        assert_eq!(effects(&a), json!({"reserve": 1, "ship": 1}), "{class}");
    }
}

#[test]
fn a_wait_times_out_with_a_null_result_and_a_late_signal_changes_nothing() {
    let node = node();
    for class in CLASSES {
        post(&node.actor(&format!("{class}/late")), "/start?id=o2");
    }
    node.settle_outbox();
    node.advance(Duration::from_secs(60));
    for class in CLASSES {
        let s = status(&node.actor(&format!("{class}/late")), "o2");
        assert_eq!(s["state"], "waiting", "{class}: {s}");
    }
    node.advance(Duration::from_secs(3_600));
    node.settle_outbox();
    for class in CLASSES {
        let a = node.actor(&format!("{class}/late"));
        let s = status(&a, "o2");
        assert_eq!(s["state"], "done", "{class}: {s}");
        assert_eq!(s["history"][2]["result"], Value::Null, "{class}: timed out");
        assert_eq!(s["history"][3]["result"], json!({"approved": null}));
        assert_eq!(
            a.post("/signal?id=o2&event=approved", "too late").status,
            204
        );
        node.settle_outbox();
        assert_eq!(effects(&a)["ship"], 1, "{class}");
    }
}

#[test]
fn a_failing_step_is_retried_with_backoff_and_its_failed_attempts_leave_nothing() {
    let node = node();
    for class in CLASSES {
        post(
            &node.actor(&format!("{class}/retry")),
            "/start?id=o3&fail=2",
        );
        post(
            &node.actor(&format!("{class}/retry")),
            "/start?id=o4&fail=9",
        );
    }
    node.settle_outbox();
    for class in CLASSES {
        let s = status(&node.actor(&format!("{class}/retry")), "o3");
        assert_eq!(
            (s["state"].clone(), s["failures"].clone()),
            (json!("retrying"), json!(1)),
            "{class}: {s}"
        );
        assert!(
            s["error"].as_str().unwrap().starts_with("out_of_stock"),
            "{s}"
        );
    }
    // 1 s, then 2 s of backoff.
    for _ in 0..2 {
        node.advance(Duration::from_secs(2));
        node.settle_outbox();
    }
    for class in CLASSES {
        let a = node.actor(&format!("{class}/retry"));
        let s = status(&a, "o3");
        assert_eq!(s["state"], "sleeping", "{class}: {s}");
        assert_eq!(s["history"][0]["attempts"], 3, "{class}");
        assert_eq!(s["history"][0]["result"]["attempt"], 3);
        let f = status(&a, "o4");
        assert_eq!(
            (f["state"].clone(), f["failures"].clone()),
            (json!("failed"), json!(3)),
            "{class}: {f}"
        );
        // Only the attempt that succeeded left its effect.
        assert_eq!(effects(&a)["reserve"], 1, "{class}");
    }
}

#[test]
fn pause_resume_cancel_and_restart_from_a_step() {
    let node = node();
    for class in CLASSES {
        let a = node.actor(&format!("{class}/ctl"));
        node.hold_outbox(true);
        post(&a, "/start-ten?id=p");
        post(&a, "/start-ten?id=c");
        post(&a, "/pause?id=p");
        post(&a, "/cancel?id=c");
        node.hold_outbox(false);
        node.settle_outbox();
        assert_eq!(
            effects(&a),
            json!({}),
            "{class}: nothing ran while paused or after cancel"
        );
        assert_eq!(status(&a, "p")["state"], "paused");
        assert_eq!(status(&a, "c")["state"], "cancelled");
        post(&a, "/resume?id=p");
        node.settle_outbox();
        assert_eq!(status(&a, "p")["state"], "done", "{class}");
        post(&a, "/restart?id=p&step=s7");
        node.settle_outbox();
        let e = effects(&a);
        for i in 0..10 {
            assert_eq!(
                e[format!("s{i}")],
                if i >= 7 { 2 } else { 1 },
                "{class}: {e}"
            );
        }
        let s = status(&a, "p");
        assert_eq!(
            (s["state"].clone(), s["history"].as_array().unwrap().len()),
            (json!("done"), 10)
        );
        let e = a
            .request("POST", "/restart?id=p&step=nope", "")
            .unwrap_err();
        assert_eq!(e.code(), "bad_request", "{class}");
    }
}

/// Waits (real time, bounded) until the node runs nothing.
fn wait_idle(node: &TestNode) {
    for _ in 0..1_000 {
        std::thread::sleep(Duration::from_millis(2));
        if !node.runtime().busy() && node.runtime().outbox().pending() <= 1 {
            return;
        }
    }
}

/// The outbox held, the node lets deliveries out for a moment at a time,
/// so the workflow moves about one step per window; whenever it moved,
/// the node is restarted (its instances, queues and dispatcher dropped)
/// before the next step's message goes out. A window can let several
/// steps through: a workflow on a new actor runs again until restarts
/// fell after at least five different steps (a few tries at most).
#[test]
fn restarting_the_node_between_steps_runs_each_step_once() {
    let mut node = node();
    for class in CLASSES {
        let mut boundaries = std::collections::BTreeSet::new();
        for attempt in 0..4 {
            if boundaries.len() >= 5 {
                break;
            }
            let name = format!("{class}/crash{attempt}");
            let mut seen = 0;
            node.hold_outbox(true);
            post(&node.actor(&name), "/start-ten?id=t");
            for _ in 0..3_000 {
                let s = status(&node.actor(&name), "t");
                if s["state"] == "done" {
                    break;
                }
                node.hold_outbox(false);
                std::thread::sleep(Duration::from_micros(200));
                node.hold_outbox(true);
                wait_idle(&node);
                let step = status(&node.actor(&name), "t")["step"].as_u64().unwrap();
                if step > seen {
                    seen = step;
                    boundaries.insert(step);
                    node.restart();
                    node.hold_outbox(true);
                }
            }
            node.hold_outbox(false);
            node.settle_outbox();
            let a = node.actor(&name);
            assert_eq!(status(&a, "t")["state"], "done", "{name}");
            let e = effects(&a);
            for i in 0..10 {
                assert_eq!(e[format!("s{i}")], 1, "{name}: {e}");
            }
            eprintln!("{name}: restarted after steps {boundaries:?} so far");
        }
        assert!(
            boundaries.len() >= 5,
            "{class}: restarted only after {boundaries:?}"
        );
    }
}

/// A `call` step awaits a typed call's answer durably: each language's
/// workflow calls each language's tally; the answer is the step's result.
#[test]
fn a_call_step_awaits_the_typed_answer_and_a_refused_call_is_retried_then_fails() {
    let node = node();
    for (n, class) in CLASSES.iter().enumerate() {
        for to in ["examples", "examples-ts"] {
            let a = node.actor(&format!("{class}/calls-{to}"));
            // The instance's id names its tally: one per caller language.
            let (ok, no) = (format!("ok{n}-{to}"), format!("no{n}-{to}"));
            post(&a, &format!("/start-tallied?id={ok}&by=5&app={to}"));
            post(
                &a,
                &format!("/start-tallied?id={no}&by=5&app={to}&code=nope"),
            );
            node.settle_outbox();
            let s = status(&a, &ok);
            assert_eq!(s["state"], "done", "{class} -> {to}: {s}");
            assert_eq!(s["history"][0]["result"], 5, "{class} -> {to}: the answer");
            assert_eq!(s["history"][1]["result"], json!({"total": 5}));
            let tally = node.actor(&format!("demo/{to}/tally/{ok}"));
            assert_eq!(tally.get("/value").json()["value"], 5, "{class} -> {to}");
            let f = status(&a, &no);
            assert_eq!(f["state"], "retrying", "{class} -> {to}: {f}");
            assert!(f["error"].as_str().unwrap().starts_with("nope"), "{f}");
        }
    }
    node.advance(Duration::from_secs(1));
    node.settle_outbox();
    for (n, class) in CLASSES.iter().enumerate() {
        for to in ["examples", "examples-ts"] {
            let a = node.actor(&format!("{class}/calls-{to}"));
            let f = status(&a, &format!("no{n}-{to}"));
            assert_eq!(
                (f["state"].clone(), f["failures"].clone()),
                (json!("failed"), json!(2)),
                "{class} -> {to}"
            );
            let tally = node.actor(&format!("demo/{to}/tally/no{n}-{to}"));
            assert_eq!(
                tally.get("/value").json()["value"],
                0,
                "the refused calls rolled back"
            );
            assert_eq!(
                effects(&a)["record"],
                1,
                "{class} -> {to}: recorded once, for the good one"
            );
        }
    }
}

/// No answer within the step's timeout is a failed attempt: the call is
/// sent again, and a late answer to the first attempt is ignored (the
/// callee may see both: a retried call is at least once).
#[test]
fn a_call_with_no_answer_in_time_is_sent_again_and_the_late_answer_ignored() {
    let node = node();
    for (n, class) in CLASSES.iter().enumerate() {
        let a = node.actor(&format!("{class}/late-call"));
        let id = format!("slow{n}");
        node.hold_outbox(true);
        post(&a, &format!("/start-tallied?id={id}&by=5"));
        // Past the 30 s timeout, before the 1 s backoff ends.
        node.advance(Duration::from_millis(30_500));
        let s = status(&a, &id);
        assert_eq!(s["state"], "retrying", "{class}: {s}");
        assert!(s["error"].as_str().unwrap().starts_with("timeout"), "{s}");
        node.hold_outbox(false);
        node.settle_outbox();
        node.advance(Duration::from_secs(1));
        node.settle_outbox();
        let s = status(&a, &id);
        assert_eq!(s["state"], "done", "{class}: {s}");
        // Both calls reached the tally; the step recorded the second's
        // answer, its own attempt's.
        assert_eq!(s["history"][0]["result"], 10, "{class}: {s}");
        assert_eq!(s["history"][0]["attempts"], 2);
        assert_eq!(effects(&a)["record"], 1, "{class}");
    }
}
