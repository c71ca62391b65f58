//! Schema migrations (issue 38): the ordered list of SQL statements a
//! class declares with [`Actor::migrations`](crate::Actor::migrations).
//!
//! Before each event of a class that declares any, the SDK reads how many
//! of them the actor's database has had (`wasmkeep_sdk_schema`, one row)
//! and runs the rest in order, in that event's transaction, before `init`
//! or the handler: the first event after a deploy that adds migrations
//! applies them, and a new actor gets all of them before its `init`. If
//! one fails, the event fails with `migration_failed` naming it, and
//! everything rolls back: the actor stays on its old schema, and its next
//! event tries again (after a fixed deploy, or a rollback).
//!
//! Migrations are append-only: never edit or remove one a deployed
//! version had, add a new one. A database that has had more migrations
//! than the running build declares (after a rollback to an older build)
//! is left as it is: the older build runs on the newer schema, which is
//! why a migration should keep older code working (add columns with
//! defaults, add tables; drop things in a later deploy).
//!
//! ```
//! use wasmkeep_sdk::{Actor, Request, Response, Result};
//!
//! #[derive(Default)]
//! struct Notes;
//!
//! impl Actor for Notes {
//!     fn migrations() -> &'static [&'static str] {
//!         &[
//!             "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL)",
//!             "ALTER TABLE notes ADD COLUMN body TEXT NOT NULL DEFAULT ''",
//!         ]
//!     }
//!
//!     fn request(&mut self, _req: Request) -> Result<Response> {
//!         Ok(Response::text(200, "ok"))
//!     }
//! }
//! ```
//!
//! Cost: one `SELECT` per event for a class that declares migrations;
//! none for one that does not.

use crate::{Error, Result, Value, sql};

/// The SDK's table of the schema version: how many migrations ran.
pub const TABLE: &str = "wasmkeep_sdk_schema";

const CREATE: &str = "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_schema \
    (id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER NOT NULL)";

/// How many migrations this actor's database has had (0 before any).
pub fn version() -> Result<u64> {
    match sql::query("SELECT version FROM wasmkeep_sdk_schema WHERE id = 0", &[]) {
        Ok(rows) => Ok(rows.rows.first().map_or(0, |r| r.int(0).max(0) as u64)),
        Err(e) if e.message.contains("no such table") => Ok(0),
        Err(e) => Err(e),
    }
}

/// Runs the migrations the database has not had (`app!` calls this before
/// each event of a class that declares any).
#[doc(hidden)]
pub fn __migrate(migrations: &[&str]) -> Result<()> {
    let n = migrations.len() as u64;
    let at = version()?;
    if at >= n {
        return Ok(());
    }
    sql::execute(CREATE, &[])?;
    for (i, statement) in migrations.iter().enumerate().skip(at as usize) {
        sql::execute(statement, &[]).map_err(|e| {
            Error::new(
                "migration_failed",
                format!(
                    "migration {} of {n} failed, the actor stays at schema version {at}: {}: {}",
                    i + 1,
                    e.code,
                    e.message
                ),
            )
        })?;
    }
    sql::execute(
        "INSERT INTO wasmkeep_sdk_schema (id, version) VALUES (0, ?1) \
         ON CONFLICT (id) DO UPDATE SET version = excluded.version",
        &[Value::Integer(n as i64)],
    )?;
    Ok(())
}
