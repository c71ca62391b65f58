//! Typed calls between actors (issue 36): the `caller` and `tally`
//! classes of the Rust and the TypeScript examples share one wire format,
//! so every test runs each caller against each tally.

use serde_json::{Value, json};
use wasmkeep_guests::{DEMO, EXAMPLES_TS};
use wasmkeep_testkit::TestNode;

const APPS: [&str; 2] = ["examples", "examples-ts"];

fn node() -> TestNode {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    node.deploy("demo/examples-ts", EXAMPLES_TS).unwrap();
    node
}

/// The caller's recorded answers, without the time each was applied.
fn replies(node: &TestNode, caller: &str) -> Vec<Value> {
    let mut r = node.actor(caller).get("/replies").json()["replies"]
        .as_array()
        .unwrap()
        .clone();
    for x in &mut r {
        x.as_object_mut().unwrap().remove("answered_ms");
    }
    r
}

#[test]
fn a_typed_call_gets_its_typed_answer_and_context_in_every_pairing() {
    let node = node();
    for from in APPS {
        for to in APPS {
            let caller = format!("demo/{from}/caller/{to}");
            let c = node.actor(&caller);
            let name = format!("from-{from}");
            assert_eq!(
                c.post(&format!("/add?app={to}&name={name}&by=5&note=first"), "")
                    .status,
                200
            );
            node.settle_outbox();
            assert_eq!(
                c.post(&format!("/add?app={to}&name={name}&by=2&note=second"), "")
                    .status,
                200
            );
            c.post(&format!("/get?app={to}&name={name}&note=third"), "");
            node.settle_outbox();
            let r = replies(&node, &caller);
            let want = json!([
                {"method": "add", "ok": true, "value": 5, "code": null, "note": "first"},
                {"method": "add", "ok": true, "value": 7, "code": null, "note": "second"},
                {"method": "get", "ok": true, "value": 7, "code": null, "note": "third"},
            ]);
            assert_eq!(Value::Array(r), want, "{from} -> {to}");
            let tally = node.actor(&format!("demo/{to}/tally/{name}"));
            assert_eq!(tally.get("/value").json()["value"], 7, "{from} -> {to}");
        }
    }
}

#[test]
fn a_failing_method_answers_its_code_and_rolls_back_and_bad_calls_are_refused() {
    let node = node();
    for from in APPS {
        for to in APPS {
            let caller = format!("demo/{from}/caller/{to}");
            let c = node.actor(&caller);
            let name = format!("f-{from}");
            c.post(&format!("/add?app={to}&name={name}&by=1&note=a"), "");
            node.settle_outbox();
            c.post(
                &format!("/fail?app={to}&name={name}&code=too_big&note=b"),
                "",
            );
            // Arguments that do not decode as the declared type: a Rust
            // caller cannot send them (its stub is typed; the route
            // refuses `abc`), a TypeScript caller can (NaN goes as null).
            let bad = c.request(
                "POST",
                &format!("/add?app={to}&name={name}&by=abc&note=c"),
                "",
            );
            match from {
                "examples" => assert_eq!(bad.unwrap_err().code(), "bad_request"),
                _ => assert_eq!(bad.unwrap().status, 200),
            }
            node.settle_outbox();
            let r = replies(&node, &caller);
            assert_eq!(r[1]["ok"], false, "{from} -> {to}: {r:?}");
            assert_eq!(r[1]["code"], "too_big", "{from} -> {to}");
            assert_eq!(r[1]["note"], "b");
            // Either callee refuses a `by` that is not a number.
            if from == "examples-ts" {
                let bad = r
                    .iter()
                    .find(|x| x["note"] == "c")
                    .unwrap_or_else(|| panic!("{r:?}"));
                let refusal = (bad["ok"].clone(), bad["code"].clone());
                assert_eq!(
                    refusal,
                    (json!(false), json!("bad_arguments")),
                    "{from} -> {to}"
                );
            }
            let tally = node.actor(&format!("demo/{to}/tally/{name}"));
            assert_eq!(
                tally.get("/value").json()["value"],
                1,
                "{from} -> {to}: the failed call rolled back"
            );
        }
    }
    // A method the callee does not have (a caller on a newer interface).
    for to in APPS {
        let caller = format!("demo/examples-ts/caller/nope-{to}");
        node.actor(&caller)
            .post(&format!("/nope?app={to}&name=n&note=x"), "");
        node.settle_outbox();
        let r = replies(&node, &caller);
        assert_eq!(r[0]["code"], "unknown_method", "-> {to}: {r:?}");
    }
}
