//! Cron schedules (issue 36), in both SDKs: the `timers` class of the
//! Rust examples and of the TypeScript examples answer the same routes,
//! and every test runs against both. The virtual clock crosses real
//! daylight-saving changes of 2026.

use std::time::Duration;

use serde_json::Value;
use wasmkeep_guests::{DEMO, EXAMPLES_TS};
use wasmkeep_testkit::{ActorHandle, TestNode};

/// The `timers` class in each language.
const CLASSES: [&str; 2] = ["demo/examples/timers", "demo/examples-ts/timers"];

const HOUR: u64 = 3_600_000;
const DAY: u64 = 24 * HOUR;
/// 2026-03-27T00:00:00Z; Berlin springs forward on 03-29 at 01:00 UTC.
const MARCH_27: u64 = 1_774_569_600_000;
/// 2026-10-24T00:00:00Z; Berlin falls back on 10-25 at 01:00 UTC.
const OCTOBER_24: u64 = 1_792_800_000_000;

fn node() -> TestNode {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    node.deploy("demo/examples-ts", EXAMPLES_TS).unwrap();
    node
}

fn schedule(a: &ActorHandle<'_>, name: &str, expr: &str, zone: &str) -> u64 {
    let q = format!(
        "/cron?name={name}&expr={}&zone={zone}",
        expr.replace(' ', "%20").replace('*', "%2A")
    );
    let r = a.post(&q, "");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["next_ms"].as_u64().unwrap()
}

fn runs(a: &ActorHandle<'_>) -> Vec<Value> {
    a.get("/cron/runs").json()["runs"]
        .as_array()
        .unwrap()
        .clone()
}

fn scheduled(a: &ActorHandle<'_>, name: &str) -> Vec<u64> {
    runs(a)
        .iter()
        .filter(|r| r["name"] == name)
        .map(|r| r["scheduled_ms"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_daily_schedule_keeps_its_local_time_across_the_spring_change() {
    let node = node();
    node.advance_to(MARCH_27 + 12 * HOUR);
    for class in CLASSES {
        let a = node.actor(&format!("{class}/berlin"));
        let first = schedule(&a, "nine", "0 9 * * *", "Europe/Berlin");
        assert_eq!(
            first,
            MARCH_27 + DAY + 8 * HOUR,
            "{class}: 09:00 CET is 08:00 UTC"
        );
    }
    node.advance(Duration::from_millis(4 * DAY));
    for class in CLASSES {
        let a = node.actor(&format!("{class}/berlin"));
        assert_eq!(
            scheduled(&a, "nine"),
            vec![
                MARCH_27 + DAY + 8 * HOUR,
                MARCH_27 + 2 * DAY + 7 * HOUR,
                MARCH_27 + 3 * DAY + 7 * HOUR,
                MARCH_27 + 4 * DAY + 7 * HOUR,
            ],
            "{class}: 09:00 CEST is 07:00 UTC from 03-29 on"
        );
        for r in runs(&a) {
            assert_eq!(r["ran_ms"], r["scheduled_ms"], "{class}: on time");
            assert_eq!(r["missed"], 0);
        }
    }
}

#[test]
fn a_skipped_local_time_runs_after_the_gap_and_a_repeated_one_runs_once() {
    let node = node();
    node.advance_to(MARCH_27 + 12 * HOUR);
    for class in CLASSES {
        let a = node.actor(&format!("{class}/dst"));
        schedule(&a, "half-past-two", "30 2 * * *", "Europe/Berlin");
    }
    node.advance(Duration::from_millis(3 * DAY));
    for class in CLASSES {
        let a = node.actor(&format!("{class}/dst"));
        // 03-28 02:30 CET = 01:30 UTC; 03-29 has no 02:30: 03:00 CEST =
        // 01:00 UTC; 03-30 02:30 CEST = 00:30 UTC.
        assert_eq!(
            scheduled(&a, "half-past-two"),
            vec![
                MARCH_27 + DAY + HOUR + HOUR / 2,
                MARCH_27 + 2 * DAY + HOUR,
                MARCH_27 + 3 * DAY + HOUR / 2,
            ],
            "{class}"
        );
        assert!(a.post("/cron/cancel?name=half-past-two", "").json()["cancelled"] == true);
    }
    node.advance_to(OCTOBER_24 + 12 * HOUR);
    for class in CLASSES {
        let a = node.actor(&format!("{class}/dst"));
        schedule(&a, "fixed", "30 2 * * *", "Europe/Berlin");
        schedule(&a, "hourly", "0 * * * *", "Europe/Berlin");
    }
    node.advance(Duration::from_millis(DAY + 6 * HOUR));
    for class in CLASSES {
        let a = node.actor(&format!("{class}/dst"));
        // 10-25: 02:30 occurs at 00:30 UTC (CEST) and 01:30 UTC (CET): once.
        assert_eq!(
            scheduled(&a, "fixed"),
            vec![OCTOBER_24 + DAY + HOUR / 2],
            "{class}"
        );
        // The hourly job runs once an hour by the clock of the world: in
        // both passes of the repeated hour.
        let hourly = scheduled(&a, "hourly");
        for w in hourly.windows(2) {
            assert_eq!(w[1] - w[0], HOUR, "{class}: {hourly:?}");
        }
        assert!(hourly.contains(&(OCTOBER_24 + DAY)), "02:00 CEST");
        assert!(hourly.contains(&(OCTOBER_24 + DAY + HOUR)), "02:00 CET");
    }
}

#[test]
fn runs_missed_while_the_node_was_down_come_as_one_run_with_their_count() {
    let mut node = node();
    let start = node.now_ms();
    for class in CLASSES {
        schedule(
            &node.actor(&format!("{class}/down")),
            "hourly",
            "0 * * * *",
            "UTC",
        );
    }
    node.advance(Duration::from_millis(HOUR));
    node.restart_after(Duration::from_millis(5 * HOUR + HOUR / 2));
    node.run_due_alarms();
    for class in CLASSES {
        let a = node.actor(&format!("{class}/down"));
        let r = runs(&a);
        assert_eq!(r.len(), 2, "{class}: {r:?}");
        assert_eq!(r[0]["scheduled_ms"], start + HOUR);
        assert_eq!(r[0]["missed"], 0);
        // Down from 01:00 to 06:30: 02:00 .. 06:00 passed; one run for them.
        assert_eq!(r[1]["scheduled_ms"], start + 2 * HOUR, "{class}");
        assert_eq!(r[1]["missed"], 4, "{class}");
        assert_eq!(r[1]["ran_ms"], start + 6 * HOUR + HOUR / 2);
        let s = &a.get("/cron").json()["schedules"][0];
        assert_eq!(
            s["next_ms"],
            start + 7 * HOUR,
            "{class}: on to the next time"
        );
        let h = a.get("/cron/history?name=hourly").json()["history"].clone();
        assert_eq!(h[0]["missed"], 4, "{class}: newest first");
    }
}

#[test]
fn a_failed_alarm_run_takes_its_cron_run_again_and_records_it_once() {
    let node = node();
    let start = node.now_ms();
    for class in CLASSES {
        let a = node.actor(&format!("{class}/retry"));
        schedule(&a, "hourly", "0 * * * *", "UTC");
        // Due with the cron run: the first alarm run fails.
        assert_eq!(
            a.post(&format!("/set?name=fail-once&due_ms={}", start + HOUR), "x")
                .status,
            204
        );
    }
    node.advance(Duration::from_millis(HOUR + 60_000));
    for class in CLASSES {
        let a = node.actor(&format!("{class}/retry"));
        assert_eq!(scheduled(&a, "hourly"), vec![start + HOUR], "{class}");
        let h = a.get("/cron/history?name=hourly").json()["history"].clone();
        assert_eq!(h.as_array().unwrap().len(), 1, "{class}: {h}");
        assert!(
            h[0]["ran_ms"].as_u64().unwrap() > start + HOUR,
            "{class}: the retry's"
        );
    }
}

#[test]
fn timers_and_schedules_share_the_alarm_at_the_earliest_of_both() {
    let node = node();
    let start = node.now_ms();
    for class in CLASSES {
        let a = node.actor(&format!("{class}/share"));
        assert_eq!(
            a.post(&format!("/set?name=t&due_ms={}", start + 3 * HOUR), "")
                .status,
            204
        );
        let next = schedule(&a, "two", "0 2 * * *", "UTC");
        assert_eq!(next, start + 2 * HOUR);
        assert_eq!(
            a.alarm(),
            Some(start + 2 * HOUR),
            "{class}: the schedule is earlier"
        );
        a.post("/cron/cancel?name=two", "");
        assert_eq!(
            a.alarm(),
            Some(start + 3 * HOUR),
            "{class}: back to the timer"
        );
        a.post("/cancel?name=t", "");
        assert_eq!(a.alarm(), None, "{class}");
    }
}

#[test]
fn history_keeps_the_last_runs_and_bad_expressions_are_refused() {
    let node = node();
    for class in CLASSES {
        let a = node.actor(&format!("{class}/minutely"));
        schedule(&a, "m", "* * * * *", "UTC");
    }
    node.advance(Duration::from_secs(25 * 60));
    for class in CLASSES {
        let a = node.actor(&format!("{class}/minutely"));
        assert_eq!(runs(&a).len(), 25, "{class}");
        let h = a.get("/cron/history?name=m").json()["history"].clone();
        let h = h.as_array().unwrap();
        assert_eq!(h.len(), 20, "{class}: HISTORY_MAX");
        assert!(
            h[0]["scheduled_ms"].as_u64() > h[19]["scheduled_ms"].as_u64(),
            "newest first"
        );
        for (expr, zone) in [("61 * * * *", "UTC"), ("0 9 * * *", "Mars/Olympus")] {
            let q = format!(
                "/cron?name=x&expr={}&zone={zone}",
                expr.replace(' ', "%20").replace('*', "%2A")
            );
            let e = a.request("POST", &q, "").unwrap_err();
            assert_eq!(e.code(), "invalid_cron", "{class} {expr} {zone}: {e}");
        }
    }
}
