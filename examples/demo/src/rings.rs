//! `rings`: the first scenario of the second seed, written the way that
//! lost a booking on Durable Objects, and safe here.
//!
//! Rings are kept as ONE key-value value, a JSON map from booking to ring,
//! read and written whole (the seed's shape). `on-alarm` reads the map,
//! makes a slow "external call" for each expired pending ring (a busy loop
//! standing in for the database call in the seed), decides `timeout`, and
//! writes the whole map back. On Durable Objects a claim that arrived during
//! the slow call was erased by that write-back. In wasmkeep an event runs to
//! completion before the next starts, so a claim arriving meanwhile waits,
//! and sees (and keeps) the alarm's result.
//!
//! - `POST /claim?booking=B&expires_ms=T`: a pending ring for B, alarm at
//!   the earliest pending expiry.
//! - `POST /answer?booking=B`: B answered (409 with the outcome if B is no
//!   longer pending).
//! - `POST /config?slow_iterations=N`: how long the "external call" spins.
//! - `GET /rings`: the map.

use serde_json::{Map, Value as Json, json};
use wasmkeep_sdk::{Actor, AlarmInfo, Error, Request, Response, Result, alarm, kv, now_ms};

#[derive(Default)]
pub struct Rings;

fn read() -> Result<Map<String, Json>> {
    Ok(match kv::get("rings")? {
        Some(b) => serde_json::from_slice(&b).map_err(|e| Error::new("corrupt", e.to_string()))?,
        None => Map::new(),
    })
}

fn write(m: &Map<String, Json>) -> Result<()> {
    kv::put("rings", Json::Object(m.clone()).to_string().as_bytes())
}

/// The alarm goes to the earliest pending expiry, or is cleared.
fn rearm(m: &Map<String, Json>) -> Result<()> {
    let next = m
        .values()
        .filter(|r| r["outcome"] == "pending")
        .filter_map(|r| r["expires_ms"].as_u64())
        .min();
    match next {
        Some(at) => alarm::set(at),
        None => {
            alarm::delete();
            Ok(())
        }
    }
}

impl Actor for Rings {
    fn request(&mut self, req: Request) -> Result<Response> {
        let booking = req.query_param("booking").unwrap_or_default();
        match req.route() {
            ("POST", "/claim") => {
                let expires = req
                    .query_u64("expires_ms")?
                    .ok_or_else(|| Error::bad_request("`expires_ms` is required"))?;
                let mut m = read()?;
                m.insert(
                    booking,
                    json!({ "claimed_ms": now_ms(), "expires_ms": expires, "outcome": "pending" }),
                );
                write(&m)?;
                rearm(&m)?;
                Ok(Response::status(204))
            }
            ("POST", "/answer") => {
                let mut m = read()?;
                let Some(r) = m.get_mut(&booking) else {
                    return Ok(Response::not_found());
                };
                if r["outcome"] != "pending" {
                    // Decided on the state as it is now, never a stale copy.
                    return Ok(Response::json(409, json!({ "outcome": r["outcome"] }).to_string()));
                }
                r["outcome"] = json!("answered");
                write(&m)?;
                rearm(&m)?;
                Ok(Response::status(204))
            }
            ("POST", "/config") => {
                let n = req.query_u64("slow_iterations")?.unwrap_or(0);
                kv::put("slow_iterations", n.to_string().as_bytes())?;
                Ok(Response::status(204))
            }
            ("GET", "/rings") => Ok(Response::json(200, Json::Object(read()?).to_string())),
            _ => Ok(Response::not_found()),
        }
    }

    fn alarm(&mut self, _info: AlarmInfo) -> Result<()> {
        let mut m = read()?;
        let now = now_ms();
        let slow: u64 = kv::get("slow_iterations")?
            .and_then(|b| String::from_utf8(b).ok()?.parse().ok())
            .unwrap_or(0);
        for ring in m.values_mut() {
            let expired = ring["expires_ms"].as_u64().is_some_and(|e| now >= e);
            if ring["outcome"] == "pending" && expired {
                slow_external_call(slow);
                ring["outcome"] = json!("timeout");
            }
        }
        // The seed's unsafe shape: the whole map, as read before the slow
        // call, written back.
        write(&m)?;
        rearm(&m)
    }
}

/// Stands in for the seed's database call: it takes time, during which
/// other requests for this actor arrive.
fn slow_external_call(iterations: u64) {
    let mut x = 0u64;
    for i in 0..iterations {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
    }
    std::hint::black_box(x);
}
