//! Actors that misbehave on purpose, for the runtime's tests.
//!
//! Class `probe` writes a row, then does what the path says:
//!
//! - `POST /write` (`?v=`): writes and succeeds.
//! - `POST /trap`, `/panic`, `/err`, `/loop`, `/membomb`: writes, then traps,
//!   panics, returns an error, spins for ever, or allocates until memory
//!   runs out.
//! - `GET /count`: rows written so far.
//! - `GET /big?bytes=N`: a response body of N bytes.
//! - `POST /sql` (body: a statement): runs it; answers 200 or the error as
//!   `{"code","message"}` with status 422.
//! - `POST /kv?key=K&bytes=N`: stores N bytes under K.
//! - `POST /grow?bytes=N`, `POST /shrink`: the second seed's outage, one
//!   value that grows by N bytes per event, and the event that cuts it down.
//! - `POST /alarm?at_ms=T&mode=M`: sets the alarm; on-alarm records a row,
//!   then per mode: `ok`, `fail`, `reschedule-and-fail` (sets the alarm for
//!   now, fails), `later-and-fail` (sets it an hour later, fails),
//!   `clear-and-fail`, `trap`.
//! - `GET /env`: what the guest can see of files, environment and network.

use wasmkeep_sdk::{Actor, AlarmInfo, Error, Request, Response, Result, alarm, kv, now_ms, params, sql};

#[derive(Default)]
struct Probe;

fn write_row(v: &str) -> Result<()> {
    sql::execute("INSERT INTO writes (v) VALUES (?1)", params![v])?;
    Ok(())
}

fn error_json(e: &Error) -> Response {
    Response::json(
        422,
        format!(
            "{{\"code\":{:?},\"message\":{:?}}}",
            e.code,
            e.message.replace('"', "'")
        ),
    )
}

impl Actor for Probe {
    fn init(&mut self) -> Result<()> {
        sql::execute("CREATE TABLE writes (id INTEGER PRIMARY KEY, v TEXT)", &[])?;
        sql::execute("CREATE TABLE blob (id INTEGER PRIMARY KEY CHECK (id = 0), b TEXT NOT NULL)", &[])?;
        sql::execute("INSERT INTO blob VALUES (0, '')", &[])?;
        Ok(())
    }

    fn alarm(&mut self, info: AlarmInfo) -> Result<()> {
        self.on_alarm(info)
    }

    fn request(&mut self, req: Request) -> Result<Response> {
        let v = req.query_param("v").unwrap_or_else(|| req.path.clone());
        match req.route() {
            ("POST", "/write") => {
                write_row(&v)?;
                Ok(Response::status(204))
            }
            ("POST", "/trap") => {
                write_row(&v)?;
                #[cfg(target_arch = "wasm32")]
                core::arch::wasm32::unreachable();
                #[cfg(not(target_arch = "wasm32"))]
                unreachable!()
            }
            ("POST", "/panic") => {
                write_row(&v)?;
                panic!("the probe panicked on purpose");
            }
            ("POST", "/err") => {
                write_row(&v)?;
                Err(Error::new("probe_failed", "the probe failed on purpose"))
            }
            ("POST", "/loop") => {
                write_row(&v)?;
                let mut x: u64 = 0;
                loop {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            }
            ("POST", "/membomb") => {
                write_row(&v)?;
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 8 * 1024 * 1024]);
                    std::hint::black_box(&hoard);
                }
            }
            ("GET", "/count") => {
                let n = sql::query("SELECT count(*) FROM writes", &[])?.rows[0].int(0);
                Ok(Response::json(200, format!("{{\"count\":{n}}}")))
            }
            (m @ ("GET" | "POST"), "/big") => {
                // A POST writes a row too, to show whether it stood.
                if m == "POST" {
                    write_row(&v)?;
                }
                let n = req.query_u64("bytes")?.unwrap_or(0) as usize;
                Ok(Response {
                    status: 200,
                    headers: Vec::new(),
                    body: vec![b'x'; n],
                })
            }
            ("POST", "/sql") => match sql::query(req.text()?, &[]) {
                Ok(r) => Ok(Response::json(200, format!("{{\"rows\":{}}}", r.rows.len()))),
                Err(e) => Ok(error_json(&e)),
            },
            ("POST", "/kv") => {
                let key = req.query_param("key").unwrap_or_default();
                let n = req.query_u64("bytes")?.unwrap_or(0) as usize;
                kv::put(&key, &vec![7u8; n])?;
                Ok(Response::status(204))
            }
            ("POST", "/grow") => {
                let n = req.query_u64("bytes")?.unwrap_or(1024) as i64;
                // Text of n characters ('0'), appended to the one value.
                sql::execute(
                    "UPDATE blob SET b = b || substr(hex(zeroblob((?1 + 1) / 2)), 1, ?1) WHERE id = 0",
                    params![n],
                )?;
                let len = sql::query("SELECT length(b) FROM blob WHERE id = 0", &[])?.rows[0].int(0);
                Ok(Response::json(200, format!("{{\"bytes\":{len}}}")))
            }
            ("POST", "/shrink") => {
                sql::execute("UPDATE blob SET b = substr(b, 1, 16) WHERE id = 0", &[])?;
                Ok(Response::status(204))
            }
            ("POST", "/alarm") => {
                let at = req.query_u64("at_ms")?.unwrap_or(0);
                let mode = req.query_param("mode").unwrap_or_else(|| "ok".into());
                kv::put("alarm_mode", mode.as_bytes())?;
                alarm::set(at)?;
                Ok(Response::status(204))
            }
            ("GET", "/env") => {
                let files = std::fs::read_dir("/").is_ok() || std::fs::read("/etc/passwd").is_ok();
                let env = std::env::vars().count();
                let net = std::net::TcpStream::connect("127.0.0.1:1").is_ok();
                Ok(Response::json(
                    200,
                    format!("{{\"files\":{files},\"env_vars\":{env},\"network\":{net}}}"),
                ))
            }
            _ => Ok(Response::not_found()),
        }
    }
}

impl Probe {
    fn on_alarm(&mut self, info: AlarmInfo) -> Result<()> {
        let mode = kv::get("alarm_mode")?.unwrap_or_default();
        let now = now_ms();
        sql::execute(
            "INSERT INTO writes (v) VALUES (?1)",
            params![format!("alarm retry={} at={now}", info.retry_count)],
        )?;
        match mode.as_slice() {
            b"ok" => Ok(()),
            b"fail" => Err(Error::new("probe_failed", "alarm failing on purpose")),
            // Sets the alarm again for now (or sooner than the retry), then
            // fails: the retry rule must still back off.
            b"reschedule-and-fail" => {
                alarm::set(now)?;
                Err(Error::new("probe_failed", "rescheduled, then failed"))
            }
            b"later-and-fail" => {
                alarm::set(now + 3_600_000)?;
                Err(Error::new("probe_failed", "set a later alarm, then failed"))
            }
            b"clear-and-fail" => {
                alarm::delete();
                Err(Error::new("probe_failed", "cleared, then failed"))
            }
            b"trap" => {
                #[cfg(target_arch = "wasm32")]
                core::arch::wasm32::unreachable();
                #[cfg(not(target_arch = "wasm32"))]
                unreachable!()
            }
            other => Err(Error::new(
                "probe_failed",
                format!("unknown alarm mode {}", String::from_utf8_lossy(other)),
            )),
        }
    }
}

wasmkeep_sdk::app!("probe" => Probe);
