//! `presence`: the second seed's LivePresence object, with its structure
//! (issue 20): rings and rescue watches kept as two key-value values (whole
//! maps), sharing the actor's one alarm; claim and answer handlers; the
//! alarm asking an external authority over HTTP whether an expired ring
//! timed out (`settleSnapUnansweredCancellation`); missed-call and rescue
//! notifications sent through the outbox; watches aged from a fixed anchor,
//! their history capped on read.
//!
//! What differs from Durable Objects is where the await is. A wasmkeep
//! event never waits for the network: the alarm *sends* the authority call
//! (`outbox::fetch`) and ends; the answer arrives as a later event
//! (`response`), and other events (a claim, an answer) may run between the
//! two, exactly where the seed's input gate was open. So the answer's event
//! applies the decision only to the ring it was taken on (the seed's
//! generation check, `sql::apply_if_unchanged` in spirit: here
//! `generation_matches`) and to the map as storage holds it then.
//!
//! Each of the seed's rules can be removed, as its authors did to prove
//! them, with the app variable `PRESENCE_UNSAFE` (manifest `[vars]`):
//! - `stale_map`: the answer is applied to the map as the alarm read it
//!   (carried in the call's context) and the whole map written back: a ring
//!   claimed meanwhile vanishes.
//! - `no_generation_check`: the fresh map is read, but the decision is
//!   applied without checking the ring is the one evaluated: an answer
//!   given meanwhile is overwritten with the stale timeout.
//! - `moving_deadline`: a watch's age is measured from the boundary being
//!   processed, not its anchor: on-time drains keep it alive for ever.
//! - `anchor_from_tail`: a watch stored before anchors existed takes its
//!   anchor from its history *after* the cap on read, a later boundary:
//!   a watch that grew for days looks young and lives on.
//! - `own_job_alarm`: a claim or an arrival sets the alarm for its own
//!   job's time, whatever the other job needs: one job postpones the
//!   other (the seed's rule is the earliest candidate of both).
//!
//! Configuration: `AUTHORITY_URL` (variable) names the authority, which
//! serves `POST /settle` (body `{"booking","reason"}`, answers one word:
//! `timeout`, `answered`, `declined`, `inactive` or `pending`) and
//! `POST /notify`; `AUTHORITY_TOKEN` (a secret) goes in its
//! `authorization` header. The manifest's `[outbound] hosts` must allow it.
//!
//! Routes:
//! - `POST /claim?booking=B`: a pending ring for B, expiring `RING_MS` after
//!   now (`claimed_ms` and `expires_ms` are written once).
//! - `POST /answer?booking=B`: B answered (409 with the outcome if B is not
//!   pending).
//! - `POST /arrive?booking=B&due_ms=T`: someone arrived for B's session: a
//!   rescue watch, first due at T (an earlier T from a second arrival wins
//!   the alert but keeps the anchor).
//! - `GET /rings`, `GET /watches`: the two maps; `GET /alarm`:
//!   `{"alarm_ms": T|null}`.
//! - `PUT /watches` with a JSON map: replaces the stored watches as an
//!   earlier version of the object left them (tests start from a
//!   5,000-boundary fixture, as the seed's did).
//!
//! Two jobs share the alarm and must not share failures: a rescue check
//! that cannot be sent is logged and its watch still advanced, and a ring
//! whose authority call cannot be made gets the retry candidate.

use serde_json::{Map, Value as Json, json};
use wasmkeep_sdk::outbox::{self, Answer, Call};
use wasmkeep_sdk::{Actor, AlarmInfo, Error, Request, Response, Result, alarm, config, kv, now_ms};

/// How long a volunteer's screen rings (the seed's 2.5 minutes).
pub const RING_MS: u64 = 150_000;
/// An expired pending ring with no answer yet asks again this soon.
pub const RETRY_MS: u64 = 5_000;
/// Terminal rings are pruned this long after their claim.
pub const PRUNE_MS: u64 = 60 * 60 * 1000;
/// A watch's boundaries are this far apart...
pub const WATCH_STEP_MS: u64 = 5 * 60 * 1000;
/// ...and it retires this long after its anchor.
pub const WATCH_TTL_MS: u64 = 60 * 60 * 1000;
/// Boundaries a watch keeps in its history (applied on read).
pub const MAX_EVALUATED: usize = 24;
/// An authority call unanswered this long is asked again (the outbox's
/// own retries end well before).
const INQUIRY_STALE_MS: u64 = 10 * 60 * 1000;

wasmkeep_sdk::context! {
    /// What an outbound call remembers until its answer.
    pub enum Ctx {
        /// The ring evaluated: its generation, and for the unsafe
        /// `stale_map` variant the whole map as the alarm read it.
        Settle { booking: String, claimed_ms: u64, expires_ms: u64, outcome: String, stale_map: String },
        Notify { booking: String, kind: String },
    }
}

#[derive(Default)]
pub struct Presence;

fn unsafe_rule(name: &str) -> bool {
    config::get("PRESENCE_UNSAFE").is_some_and(|v| v.split(',').any(|r| r.trim() == name))
}

fn read_map(key: &str) -> Result<Map<String, Json>> {
    Ok(match kv::get(key)? {
        Some(b) => match serde_json::from_slice(&b) {
            Ok(Json::Object(m)) => m,
            // A malformed value degrades to an empty map, never an error
            // that would take the other job on the alarm down with it.
            _ => Map::new(),
        },
        None => Map::new(),
    })
}

fn write_map(key: &str, m: &Map<String, Json>) -> Result<()> {
    kv::put(key, Json::Object(m.clone()).to_string().as_bytes())
}

fn num(v: &Json, field: &str) -> u64 {
    v[field].as_u64().unwrap_or(0)
}

/// "Still the same ring": a claim sets both times once and nothing
/// rewrites them, and an outcome changes only from pending.
fn generation_matches(fresh: Option<&Json>, claimed_ms: u64, expires_ms: u64, outcome: &str) -> bool {
    fresh.is_some_and(|f| {
        num(f, "claimed_ms") == claimed_ms
            && num(f, "expires_ms") == expires_ms
            && f["outcome"] == outcome
    })
}

/// A watch as read: history filtered to numbers and capped, a missing
/// anchor taken from the untrimmed history's first entry.
fn normalized_watch(w: &Json) -> Option<Json> {
    let due = w["due_ms"].as_u64()?;
    let history: Vec<u64> = w["evaluated"]
        .as_array()
        .map(|a| a.iter().filter_map(Json::as_u64).collect())
        .unwrap_or_default();
    let kept = history[history.len().saturating_sub(MAX_EVALUATED)..].to_vec();
    // A missing anchor is rebuilt from the untrimmed history's first entry
    // (the fallback, not necessarily the minimum), before the cap.
    let from = if unsafe_rule("anchor_from_tail") {
        &kept
    } else {
        &history
    };
    let anchor = w["anchor_ms"]
        .as_u64()
        .or_else(|| from.first().copied())
        .unwrap_or(due);
    Some(json!({ "anchor_ms": anchor, "due_ms": due, "evaluated": kept }))
}

fn authority_call(path: &str, body: Json) -> Result<Call> {
    let base = config::get("AUTHORITY_URL")
        .ok_or_else(|| Error::new("not_configured", "the app variable AUTHORITY_URL is not set"))?;
    let mut call = Call::post(&format!("{}{path}", base.trim_end_matches('/')), body.to_string())
        .header("content-type", "application/json");
    if let Some(token) = config::get("AUTHORITY_TOKEN") {
        call = call.header("authorization", &format!("Bearer {token}"));
    }
    Ok(call)
}

fn notify(booking: &str, kind: &str) -> Result<()> {
    let call = authority_call("/notify", json!({ "booking": booking, "kind": kind }))?;
    outbox::fetch(
        call,
        &Ctx::Notify {
            booking: booking.into(),
            kind: kind.into(),
        },
    )?;
    Ok(())
}

/// The earliest candidate among both jobs; a future alarm is replaced
/// only by an earlier one (inside `on-alarm` none is set).
fn arm_alarm(now: u64) -> Result<()> {
    let rings = read_map("rings")?;
    let watches = read_map("watches")?;
    let mut candidate: Option<u64> = None;
    let mut offer = |t: u64| candidate = Some(candidate.map_or(t, |c| c.min(t)));
    for r in rings.values() {
        if r["outcome"] != "pending" {
            // Pruned by a later run once old enough.
            offer(num(r, "claimed_ms") + PRUNE_MS + 1);
            continue;
        }
        let expires = num(r, "expires_ms");
        if now < expires {
            offer(expires);
        } else if r["asking_since_ms"].is_null() {
            offer(now + RETRY_MS);
        } else {
            offer(num(r, "asking_since_ms") + INQUIRY_STALE_MS);
        }
    }
    for w in watches.values() {
        if let Some(due) = w["due_ms"].as_u64() {
            offer(due);
        }
    }
    let Some(next) = candidate else {
        return Ok(());
    };
    match alarm::get() {
        Some(current) if current > now && current <= next => Ok(()),
        _ => alarm::set(next),
    }
}

impl Actor for Presence {
    fn request(&mut self, req: Request) -> Result<Response> {
        let booking = req.query_param("booking").unwrap_or_default();
        let now = now_ms();
        match req.route() {
            ("POST", "/claim") => {
                if booking.is_empty() {
                    return Err(Error::bad_request("`booking` is required"));
                }
                let mut rings = read_map("rings")?;
                rings.insert(
                    booking,
                    json!({ "claimed_ms": now, "expires_ms": now + RING_MS, "outcome": "pending", "asking_since_ms": null }),
                );
                write_map("rings", &rings)?;
                if unsafe_rule("own_job_alarm") {
                    alarm::set(now + RING_MS)?;
                } else {
                    arm_alarm(now)?;
                }
                Ok(Response::status(204))
            }
            ("POST", "/answer") => {
                let mut rings = read_map("rings")?;
                let Some(r) = rings.get_mut(&booking) else {
                    return Ok(Response::not_found());
                };
                if r["outcome"] != "pending" {
                    return Ok(Response::json(409, json!({ "outcome": r["outcome"] }).to_string()));
                }
                r["outcome"] = json!("answered");
                write_map("rings", &rings)?;
                Ok(Response::status(204))
            }
            ("POST", "/arrive") => {
                let due = req
                    .query_u64("due_ms")?
                    .ok_or_else(|| Error::bad_request("`due_ms` is required"))?;
                let mut watches = read_map("watches")?;
                let next = match watches.get(&booking).and_then(normalized_watch) {
                    // An earlier boundary wins the alert but buys no life.
                    Some(mut w) => {
                        if due < num(&w, "due_ms") {
                            w["due_ms"] = json!(due);
                        }
                        w
                    }
                    None => json!({ "anchor_ms": due, "due_ms": due, "evaluated": [] }),
                };
                let due_now = num(&next, "due_ms");
                watches.insert(booking, next);
                write_map("watches", &watches)?;
                if unsafe_rule("own_job_alarm") {
                    alarm::set(due_now)?;
                } else {
                    arm_alarm(now)?;
                }
                Ok(Response::status(204))
            }
            ("PUT", "/watches") => {
                let stored: Json = serde_json::from_slice(&req.body)
                    .map_err(|e| Error::bad_request(format!("not JSON: {e}")))?;
                kv::put("watches", stored.to_string().as_bytes())?;
                arm_alarm(now)?;
                Ok(Response::status(204))
            }
            ("GET", "/rings") => Ok(Response::json(200, Json::Object(read_map("rings")?).to_string())),
            ("GET", "/watches") => Ok(Response::json(200, Json::Object(read_map("watches")?).to_string())),
            ("GET", "/alarm") => Ok(Response::json(200, json!({ "alarm_ms": alarm::get() }).to_string())),
            _ => Ok(Response::not_found()),
        }
    }

    fn alarm(&mut self, _info: AlarmInfo) -> Result<()> {
        let now = now_ms();
        self.drain_watches(now)?;
        let mut rings = read_map("rings")?;
        let stale_snapshot = Json::Object(rings.clone()).to_string();
        for (booking, ring) in rings.iter_mut() {
            let expired = now >= num(ring, "expires_ms");
            let asking = ring["asking_since_ms"]
                .as_u64()
                .is_some_and(|since| now < since + INQUIRY_STALE_MS);
            if ring["outcome"] == "pending" && expired && !asking {
                // The authority decides; its answer arrives as an event of
                // its own, with the generation evaluated here.
                let call = match authority_call("/settle", json!({ "booking": booking, "reason": "timeout" })) {
                    Ok(c) => c,
                    Err(e) => {
                        // No decision: the ring stays pending and asks again.
                        wasmkeep_sdk::log::warn(&format!("ring {booking}: cannot ask the authority: {e}"));
                        continue;
                    }
                };
                let sent = outbox::fetch(
                    call,
                    &Ctx::Settle {
                        booking: booking.clone(),
                        claimed_ms: num(ring, "claimed_ms"),
                        expires_ms: num(ring, "expires_ms"),
                        outcome: "pending".into(),
                        stale_map: if unsafe_rule("stale_map") {
                            stale_snapshot.clone()
                        } else {
                            String::new()
                        },
                    },
                );
                match sent {
                    // Not part of the generation: marks the inquiry in flight.
                    Ok(_) => ring["asking_since_ms"] = json!(now),
                    Err(e) => wasmkeep_sdk::log::warn(&format!("ring {booking}: cannot ask the authority: {e}")),
                }
            }
        }
        // Prune terminal rings an hour after their claim (within this
        // turn: nothing else runs between this read and this write).
        rings.retain(|_, r| r["outcome"] == "pending" || now <= num(r, "claimed_ms") + PRUNE_MS);
        write_map("rings", &rings)?;
        arm_alarm(now)
    }

    fn response(&mut self, r: outbox::Response) -> Result<()> {
        let now = now_ms();
        match r.context::<Ctx>() {
            Some(Ctx::Settle {
                booking,
                claimed_ms,
                expires_ms,
                outcome,
                stale_map,
            }) => {
                let authority = match &r.answer {
                    Answer::Http(h) if h.status == 200 => {
                        Some(String::from_utf8_lossy(&h.body).trim().to_string())
                    }
                    // A failure records no decision: the ring, still
                    // pending, asks again (the retry candidate).
                    _ => None,
                };
                let unsafe_stale = !stale_map.is_empty();
                let mut rings = if unsafe_stale {
                    serde_json::from_str::<Map<String, Json>>(&stale_map).unwrap_or_default()
                } else {
                    read_map("rings")?
                };
                let check = !unsafe_rule("no_generation_check") && !unsafe_stale;
                let same = generation_matches(rings.get(&booking), claimed_ms, expires_ms, &outcome);
                if let Some(ring) = rings.get_mut(&booking)
                    && (same || !check)
                {
                    ring["asking_since_ms"] = Json::Null;
                    match authority.as_deref() {
                        Some("timeout") => {
                            ring["outcome"] = json!("timeout");
                            notify(&booking, "missed-call")?;
                        }
                        Some(o @ ("answered" | "declined")) => ring["outcome"] = json!(o),
                        Some("inactive") => {
                            rings.remove(&booking);
                        }
                        _ => {}
                    }
                }
                write_map("rings", &rings)?;
                arm_alarm(now)
            }
            Some(Ctx::Notify { booking, kind }) => {
                let delivered = matches!(&r.answer, Answer::Http(h) if (200..300).contains(&h.status));
                let mut log = read_map("notified")?;
                log.insert(format!("{booking}/{kind}/{}", r.seq), json!(delivered));
                write_map("notified", &log)
            }
            None => Ok(()),
        }
    }
}

impl Presence {
    /// Each due watch: the rescue check (a notification through the
    /// outbox), its boundary recorded, the next one five minutes on, and
    /// retirement measured from the anchor.
    fn drain_watches(&mut self, now: u64) -> Result<()> {
        let stored = read_map("watches")?;
        let mut watches = Map::new();
        let moving = unsafe_rule("moving_deadline");
        for (booking, w) in &stored {
            let Some(w) = normalized_watch(w) else {
                continue;
            };
            let due = num(&w, "due_ms");
            if now < due {
                watches.insert(booking.clone(), w);
                continue;
            }
            // A failure here is logged and the watch advanced all the same:
            // it must never take the ring timeouts down with it.
            if let Err(e) = notify(booking, "rescue-check") {
                wasmkeep_sdk::log::warn(&format!("watch {booking}: rescue check not sent: {e}"));
            }
            let mut evaluated: Vec<Json> = w["evaluated"].as_array().cloned().unwrap_or_default();
            evaluated.push(json!(due));
            let evaluated = evaluated[evaluated.len().saturating_sub(MAX_EVALUATED)..].to_vec();
            let age_from = if moving { due } else { num(&w, "anchor_ms") };
            if now.saturating_sub(age_from) > WATCH_TTL_MS {
                continue;
            }
            watches.insert(
                booking.clone(),
                json!({
                    "anchor_ms": num(&w, "anchor_ms"),
                    "due_ms": due + WATCH_STEP_MS,
                    "evaluated": evaluated,
                }),
            );
        }
        write_map("watches", &watches)
    }
}
