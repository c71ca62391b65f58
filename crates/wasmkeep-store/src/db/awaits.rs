//! The actor's suspended event (issue 36, ADR 0056).
//!
//! An event that awaits a call whose answer it does not have yet is rolled
//! back and kept here instead, in a transaction of its own with the outbox
//! row of the call: what the event was (its kind and input, as a recording
//! encodes them), the answers it already had (its journal), the call it
//! waits on (the outbox row's seq), its deadline, the parked reply of a
//! request, and the time and seed it first ran with. At most one row: an
//! actor runs nothing else while one is here. The table is created on first
//! use.

use rusqlite::{OptionalExtension, params};

use super::ActorDb;
use super::outbox::no_table;
use crate::error::StoreError;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS _wasmkeep_await (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    kind TEXT NOT NULL,
    input BLOB NOT NULL,
    journal BLOB NOT NULL,
    seq INTEGER NOT NULL,
    deadline_ms INTEGER NOT NULL,
    ticket INTEGER NOT NULL,
    at_ms INTEGER NOT NULL,
    seed BLOB NOT NULL,
    chain TEXT NOT NULL
);
";

/// A suspended event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suspended {
    /// The event's kind (`request`, `alarm`), as a recording names it.
    pub kind: String,
    /// The event's input, as a recording encodes it.
    pub input: Vec<u8>,
    /// The answers the event had when it suspended (the runtime's
    /// encoding).
    pub journal: Vec<u8>,
    /// The outbox row of the call it waits on.
    pub seq: u64,
    /// When the wait ends without an answer (node clock, ms).
    pub deadline_ms: u64,
    /// The parked reply of a request (0: none).
    pub ticket: u64,
    /// The time and random seed the event first ran with.
    pub at_ms: u64,
    pub seed: Vec<u8>,
    /// The actors waiting on this event's answer, comma-separated, this
    /// one last, then `>` and the actor it waits on (empty for an HTTP
    /// call): what finds cycles of waits.
    pub chain: String,
}

impl ActorDb {
    /// The suspended event, if any.
    pub fn suspended(&self) -> Result<Option<Suspended>, StoreError> {
        let r = self
            .conn
            .prepare_cached(
                "SELECT kind, input, journal, seq, deadline_ms, ticket, at_ms, seed, chain \
                 FROM _wasmkeep_await WHERE id = 0",
            )
            .and_then(|mut s| {
                s.query_row([], |r| {
                    Ok(Suspended {
                        kind: r.get(0)?,
                        input: r.get(1)?,
                        journal: r.get(2)?,
                        seq: r.get::<_, i64>(3)? as u64,
                        deadline_ms: r.get::<_, i64>(4)? as u64,
                        ticket: r.get::<_, i64>(5)? as u64,
                        at_ms: r.get::<_, i64>(6)? as u64,
                        seed: r.get(7)?,
                        chain: r.get(8)?,
                    })
                })
                .optional()
            });
        match r {
            Ok(s) => Ok(s),
            Err(e) if no_table(&e) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Keeps `s` as the suspended event (inside a transaction), replacing
    /// the one before.
    pub fn suspend(&self, s: &Suspended) -> Result<(), StoreError> {
        self.conn.execute_batch(SCHEMA).map_err(|e| self.err(e))?;
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO _wasmkeep_await \
                 (id, kind, input, journal, seq, deadline_ms, ticket, at_ms, seed, chain) \
                 VALUES (0, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )
            .and_then(|mut st| {
                st.execute(params![
                    s.kind,
                    s.input,
                    s.journal,
                    s.seq as i64,
                    s.deadline_ms as i64,
                    s.ticket as i64,
                    s.at_ms as i64,
                    s.seed,
                    s.chain
                ])
            })
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Forgets the suspended event (inside a transaction): it ran to its
    /// end.
    pub fn resume_done(&self) -> Result<(), StoreError> {
        match self.conn.execute("DELETE FROM _wasmkeep_await", []) {
            Ok(_) => Ok(()),
            Err(e) if no_table(&e) => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }
}
