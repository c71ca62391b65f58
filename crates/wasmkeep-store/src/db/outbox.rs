//! The actor's outbox and inbox tables (ADR 0040).
//!
//! `_wasmkeep_outbox` holds what the actor sent and has not yet heard
//! back about: a row is written in the sending event's savepoint (so it
//! commits or rolls back with the event) and deleted in the event that
//! applies its answer. `_wasmkeep_inbox` remembers, per sender, the last
//! message applied and its answer, so that a repeated delivery is answered
//! again without running the handler.
//!
//! Both tables are created on first use: an actor that never sends or
//! receives a message has neither.

use rusqlite::{OptionalExtension, params};

use super::ActorDb;
use crate::error::StoreError;

const OUTBOX_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS _wasmkeep_outbox (
    seq INTEGER PRIMARY KEY,
    kind INTEGER NOT NULL,
    target TEXT NOT NULL,
    method TEXT NOT NULL,
    headers TEXT NOT NULL,
    body BLOB NOT NULL,
    context BLOB NOT NULL,
    timeout_ms INTEGER NOT NULL,
    created_ms INTEGER NOT NULL
);
";

/// The `_wasmkeep_meta` key of the last sequence number given.
const OUTBOX_SEQ_KEY: &str = "outbox_seq";

/// The `_wasmkeep_meta` key of [`ActorDb::outbox_life`].
const OUTBOX_LIFE_KEY: &str = "outbox_life";

const INBOX_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS _wasmkeep_inbox (
    sender TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    answer BLOB NOT NULL
) WITHOUT ROWID;
";

/// What an outbox row asks the node to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxKind {
    /// A message to another actor; `target` is `app/class/name`, each
    /// part percent-encoded as in a URL path.
    Message = 1,
    /// An HTTP call; `target` is the URL.
    Http = 2,
}

impl OutboxKind {
    fn from_i64(n: i64) -> Option<OutboxKind> {
        match n {
            1 => Some(OutboxKind::Message),
            2 => Some(OutboxKind::Http),
            _ => None,
        }
    }
}

/// One message the actor sent, as the node delivers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    pub seq: u64,
    pub kind: OutboxKind,
    pub target: String,
    /// The HTTP method (empty for a message).
    pub method: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub context: Vec<u8>,
    /// Per attempt, for an HTTP call (0 for a message).
    pub timeout_ms: u32,
    pub created_ms: u64,
}

/// What the receiver remembers of the last message from one sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxSeen {
    pub seq: u64,
    /// The handler returned `ok` (`answer` is its body) or `err` (`answer`
    /// is `code\nmessage`).
    pub ok: bool,
    pub answer: Vec<u8>,
}

/// Headers are kept one per line as `name:value`; both were checked to
/// hold no line break (`check_header`).
pub fn encode_headers(headers: &[(String, String)]) -> String {
    let mut out = String::new();
    for (k, v) in headers {
        out.push_str(k);
        out.push(':');
        out.push_str(v);
        out.push('\n');
    }
    out
}

pub fn decode_headers(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(super) fn no_table(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(_, Some(m)) if m.starts_with("no such table"))
}

fn row_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<OutboxRow> {
    let kind: i64 = r.get(1)?;
    let headers: String = r.get(4)?;
    Ok(OutboxRow {
        seq: r.get::<_, i64>(0)? as u64,
        kind: OutboxKind::from_i64(kind).unwrap_or(OutboxKind::Message),
        target: r.get(2)?,
        method: r.get(3)?,
        headers: decode_headers(&headers),
        body: r.get(5)?,
        context: r.get(6)?,
        timeout_ms: r.get::<_, i64>(7)? as u32,
        created_ms: r.get::<_, i64>(8)? as u64,
    })
}

const SELECT_ROWS: &str = "SELECT seq, kind, target, method, headers, body, context, timeout_ms, created_ms FROM _wasmkeep_outbox";

impl ActorDb {
    /// Writes a message in the outbox, in the current event's savepoint,
    /// and returns its sequence number (never reused by this database).
    /// Refused with `outbox_full` while `pending_max` rows wait already.
    pub fn outbox_push(&mut self, row: &OutboxRow, pending_max: u64) -> Result<u64, StoreError> {
        let pending = self.outbox_len()?;
        if pending >= pending_max {
            return Err(StoreError::OutboxFull {
                pending,
                limit: pending_max,
            });
        }
        // The last number given is kept in the meta table, out of the
        // guest's reach (SQLite's `sqlite_sequence` is not).
        let last: u64 = self
            .meta_get(OUTBOX_SEQ_KEY)?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let seq = last + 1;
        self.meta_set(OUTBOX_SEQ_KEY, &seq.to_string())?;
        if last == 0 {
            self.outbox_life()?;
        }
        let headers = encode_headers(&row.headers);
        let insert = || {
            self.conn
            .prepare_cached(
                "INSERT INTO _wasmkeep_outbox (seq, kind, target, method, headers, body, context, timeout_ms, created_ms) VALUES (?9, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    row.kind as i64,
                    row.target,
                    row.method,
                    headers,
                    row.body,
                    row.context,
                    row.timeout_ms as i64,
                    row.created_ms as i64,
                    seq as i64
                ])
            })
        };
        // The table is made by the actor's first send, not checked on
        // every one.
        match insert() {
            Err(e) if no_table(&e) => {
                self.conn
                    .execute_batch(OUTBOX_SCHEMA)
                    .map_err(|e| self.err(e))?;
                insert().map_err(|e| self.err(e))?;
            }
            r => {
                r.map_err(|e| self.err(e))?;
            }
        }
        Ok(seq)
    }

    /// A random number drawn when this database first sent (and drawn
    /// again after the actor is deleted and created anew): receivers key
    /// what they applied by sender *and* life, so a new life's sequence
    /// numbers, which start over, are not taken for repeats.
    pub fn outbox_life(&self) -> Result<u64, StoreError> {
        if let Some(v) = self.meta_get(OUTBOX_LIFE_KEY)?
            && let Ok(n) = v.parse::<u64>()
        {
            return Ok(n);
        }
        let n: i64 = self
            .conn
            .query_row("SELECT random()", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        let n = n as u64;
        self.meta_set(OUTBOX_LIFE_KEY, &n.to_string())?;
        Ok(n)
    }

    /// The outbox's life if this database ever sent (read only).
    pub fn outbox_life_if_any(&self) -> Result<Option<u64>, StoreError> {
        Ok(self
            .meta_get(OUTBOX_LIFE_KEY)?
            .and_then(|v| v.parse::<u64>().ok()))
    }

    /// The highest sequence number waiting for its answer.
    pub fn outbox_max_seq(&self) -> Result<Option<u64>, StoreError> {
        match self
            .conn
            .prepare_cached("SELECT max(seq) FROM _wasmkeep_outbox")
            .and_then(|mut s| s.query_row([], |r| r.get::<_, Option<i64>>(0)))
        {
            Ok(n) => Ok(n.map(|n| n as u64)),
            Err(e) if no_table(&e) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    /// How many messages wait for their answer.
    pub fn outbox_len(&self) -> Result<u64, StoreError> {
        match self
            .conn
            .prepare_cached("SELECT count(*) FROM _wasmkeep_outbox")
            .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
        {
            Ok(n) => Ok(n as u64),
            Err(e) if no_table(&e) => Ok(0),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Whether a message to `target` waits for its answer (a receiver's
    /// messages from one sender are delivered one after another).
    pub fn outbox_has_message_to(&self, target: &str) -> Result<bool, StoreError> {
        let r = self
            .conn
            .prepare_cached("SELECT 1 FROM _wasmkeep_outbox WHERE kind = 1 AND target = ?1 LIMIT 1")
            .and_then(|mut s| s.exists([target]));
        match r {
            Ok(b) => Ok(b),
            Err(e) if no_table(&e) => Ok(false),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Rows with a sequence number above `after`, oldest first, at most
    /// `limit`.
    pub fn outbox_pending(&self, after: u64, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
        let sql = format!("{SELECT_ROWS} WHERE seq > ?1 ORDER BY seq LIMIT ?2");
        let r = self.conn.prepare_cached(&sql).and_then(|mut s| {
            s.query_map(params![after as i64, limit as i64], row_of)?
                .collect::<rusqlite::Result<Vec<_>>>()
        });
        match r {
            Ok(rows) => Ok(rows),
            Err(e) if no_table(&e) => Ok(Vec::new()),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Removes row `seq` and returns it: the event applying its answer
    /// took it. `None` if it is gone (the answer was applied already).
    pub fn outbox_take(&self, seq: u64) -> Result<Option<OutboxRow>, StoreError> {
        let sql = format!("{SELECT_ROWS} WHERE seq = ?1");
        let row = match self
            .conn
            .prepare_cached(&sql)
            .and_then(|mut s| s.query_row([seq as i64], row_of).optional())
        {
            Ok(r) => r,
            Err(e) if no_table(&e) => return Ok(None),
            Err(e) => return Err(self.err(e)),
        };
        if row.is_some() {
            self.conn
                .prepare_cached("DELETE FROM _wasmkeep_outbox WHERE seq = ?1")
                .and_then(|mut s| s.execute([seq as i64]))
                .map_err(|e| self.err(e))?;
        }
        Ok(row)
    }

    /// The last message applied from `sender`, if any.
    pub fn inbox_seen(&self, sender: &str) -> Result<Option<InboxSeen>, StoreError> {
        match self
            .conn
            .prepare_cached("SELECT seq, ok, answer FROM _wasmkeep_inbox WHERE sender = ?1")
            .and_then(|mut s| {
                s.query_row([sender], |r| {
                    Ok(InboxSeen {
                        seq: r.get::<_, i64>(0)? as u64,
                        ok: r.get::<_, i64>(1)? != 0,
                        answer: r.get(2)?,
                    })
                })
                .optional()
            }) {
            Ok(r) => Ok(r),
            Err(e) if no_table(&e) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Records that message `seq` of `sender` was applied, with its answer.
    pub fn inbox_record(&self, sender: &str, seen: &InboxSeen) -> Result<(), StoreError> {
        self.conn
            .execute_batch(INBOX_SCHEMA)
            .map_err(|e| self.err(e))?;
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO _wasmkeep_inbox (sender, seq, ok, answer) VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    sender,
                    seen.seq as i64,
                    seen.ok as i64,
                    seen.answer
                ])
            })
            .map(|_| ())
            .map_err(|e| self.err(e))
    }
}

/// Whether an inspection connection's database has messages waiting for
/// an answer (see `read_wake`).
pub(super) fn has_rows(
    conn: &rusqlite::Connection,
    denied: &crate::sandbox::Denied,
    guard: &crate::sandbox::Guard,
) -> Result<bool, StoreError> {
    let sql = "SELECT 1 FROM _wasmkeep_outbox LIMIT 1";
    match super::run_inspection(conn, denied, guard, sql, &super::InspectBounds::rows(1)) {
        Ok(r) => Ok(!r.rows.is_empty()),
        Err(StoreError::Sql(m)) if m.contains("no such table") => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OpenMode, StoreLimits};

    fn open(dir: &std::path::Path) -> ActorDb {
        ActorDb::open(dir, &StoreLimits::default(), OpenMode::Create)
            .expect("open")
            .expect("created")
    }

    fn row(target: &str) -> OutboxRow {
        OutboxRow {
            seq: 0,
            kind: OutboxKind::Message,
            target: target.into(),
            method: String::new(),
            headers: vec![("a".into(), "b:c".into())],
            body: b"hi".to_vec(),
            context: b"ctx".to_vec(),
            timeout_ms: 0,
            created_ms: 5,
        }
    }

    #[test]
    fn rows_commit_or_roll_back_with_their_event_and_seqs_are_never_reused() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = open(dir.path());
        assert_eq!(db.outbox_len().unwrap(), 0);
        db.begin().unwrap();
        db.event_begin().unwrap();
        let s1 = db.outbox_push(&row("a/b/c"), 10).unwrap();
        db.event_commit().unwrap();
        db.event_begin().unwrap();
        let s2 = db.outbox_push(&row("a/b/d"), 10).unwrap();
        assert!(s2 > s1);
        db.event_rollback().unwrap();
        db.commit().unwrap();
        let pending = db.outbox_pending(0, 10).unwrap();
        assert_eq!(pending.len(), 1, "the rolled-back send is gone");
        assert_eq!(
            pending[0].headers,
            vec![("a".to_string(), "b:c".to_string())]
        );
        let taken = db.outbox_take(s1).unwrap().expect("present");
        assert_eq!(taken.context, b"ctx");
        assert!(db.outbox_take(s1).unwrap().is_none(), "taken once");
        let s3 = db.outbox_push(&row("x/y/z"), 10).unwrap();
        assert!(s3 > s1, "a deleted row's number is not reused");
    }

    #[test]
    fn the_outbox_refuses_past_its_bound_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = open(dir.path());
        db.outbox_push(&row("a/b/c"), 1).unwrap();
        let e = db.outbox_push(&row("a/b/c"), 1).unwrap_err();
        assert_eq!(e.code(), "outbox_full");
        assert!(e.to_string().contains("outbox_pending_max"), "{e}");
    }

    #[test]
    fn the_inbox_keeps_the_last_answer_per_sender() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        assert!(db.inbox_seen("t/a/c/n").unwrap().is_none());
        let seen = InboxSeen {
            seq: 4,
            ok: true,
            answer: b"pong".to_vec(),
        };
        db.inbox_record("t/a/c/n", &seen).unwrap();
        assert_eq!(db.inbox_seen("t/a/c/n").unwrap(), Some(seen));
    }
}
