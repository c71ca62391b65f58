//! The actor's record of answered idempotent requests (issue 36).
//!
//! A request that carries an `Idempotency-Key` header is answered once:
//! the runtime writes its answer here in the request's own savepoint, so
//! the record commits with what the handler wrote or not at all. A repeat
//! of the key within the retention window reads the answer back instead
//! of running the handler again. The table is created on first use: an
//! actor that never saw a key has none.

use rusqlite::{OptionalExtension, params};

use super::ActorDb;
use super::outbox::{decode_headers, encode_headers, no_table};
use crate::error::StoreError;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS _wasmkeep_idempotency (
    key TEXT PRIMARY KEY,
    fingerprint BLOB NOT NULL,
    status INTEGER NOT NULL,
    headers TEXT NOT NULL,
    body BLOB NOT NULL,
    at_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS _wasmkeep_idempotency_at ON _wasmkeep_idempotency (at_ms);
";

/// How many expired records one new record removes at most: pruning
/// keeps pace with recording (each record removes up to this many) and
/// never makes one event pay for a large backlog.
const PRUNE_PER_RECORD: i64 = 16;

/// One recorded answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotentAnswer {
    /// What identifies the request the key was first used with (the
    /// runtime's hash of method, path, query and body).
    pub fingerprint: Vec<u8>,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// When the answer was recorded (the node's clock).
    pub at_ms: u64,
}

impl ActorDb {
    /// The answer recorded under `key` at or after `since_ms`, if any (an
    /// older record is as good as gone: it is pruned by a later record).
    pub fn idempotent_get(
        &self,
        key: &str,
        since_ms: u64,
    ) -> Result<Option<IdempotentAnswer>, StoreError> {
        let r = self
            .conn
            .prepare_cached(
                "SELECT fingerprint, status, headers, body, at_ms FROM _wasmkeep_idempotency \
                 WHERE key = ?1 AND at_ms >= ?2",
            )
            .and_then(|mut s| {
                s.query_row(params![key, since_ms as i64], |r| {
                    Ok(IdempotentAnswer {
                        fingerprint: r.get(0)?,
                        status: r.get::<_, i64>(1)? as u16,
                        headers: decode_headers(&r.get::<_, String>(2)?),
                        body: r.get(3)?,
                        at_ms: r.get::<_, i64>(4)? as u64,
                    })
                })
                .optional()
            });
        match r {
            Ok(a) => Ok(a),
            Err(e) if no_table(&e) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Records `answer` under `key` (replacing an expired record of the
    /// same key) and removes a few records older than `expired_before_ms`.
    pub fn idempotent_put(
        &self,
        key: &str,
        answer: &IdempotentAnswer,
        expired_before_ms: u64,
    ) -> Result<(), StoreError> {
        let headers = encode_headers(&answer.headers);
        let insert = || {
            self.conn
                .prepare_cached(
                    "INSERT OR REPLACE INTO _wasmkeep_idempotency \
                     (key, fingerprint, status, headers, body, at_ms) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        key,
                        answer.fingerprint,
                        answer.status as i64,
                        headers,
                        answer.body,
                        answer.at_ms as i64
                    ])
                })
        };
        match insert() {
            Err(e) if no_table(&e) => {
                self.conn.execute_batch(SCHEMA).map_err(|e| self.err(e))?;
                insert().map_err(|e| self.err(e))?;
            }
            r => {
                r.map_err(|e| self.err(e))?;
            }
        }
        self.conn
            .prepare_cached(
                "DELETE FROM _wasmkeep_idempotency WHERE key IN \
                 (SELECT key FROM _wasmkeep_idempotency WHERE at_ms < ?1 ORDER BY at_ms LIMIT ?2)",
            )
            .and_then(|mut s| s.execute(params![expired_before_ms as i64, PRUNE_PER_RECORD]))
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// How many answers are recorded (expired ones not yet pruned
    /// included); for `inspect` and tests.
    pub fn idempotent_count(&self) -> Result<u64, StoreError> {
        match self
            .conn
            .prepare_cached("SELECT count(*) FROM _wasmkeep_idempotency")
            .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
        {
            Ok(n) => Ok(n as u64),
            Err(e) if no_table(&e) => Ok(0),
            Err(e) => Err(self.err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OpenMode, StoreLimits};

    fn answer(at_ms: u64) -> IdempotentAnswer {
        IdempotentAnswer {
            fingerprint: vec![1, 2, 3],
            status: 201,
            headers: vec![("content-type".into(), "application/json".into())],
            body: br#"{"value":1}"#.to_vec(),
            at_ms,
        }
    }

    #[test]
    fn an_answer_is_read_back_until_it_expires_and_later_records_prune_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = ActorDb::open(dir.path(), &StoreLimits::default(), OpenMode::Create)
            .expect("open")
            .expect("created");
        assert_eq!(db.idempotent_get("k", 0).unwrap(), None);
        db.idempotent_put("k", &answer(1_000), 0).unwrap();
        assert_eq!(db.idempotent_get("k", 500).unwrap(), Some(answer(1_000)));
        // Past its window it is not an answer any more...
        assert_eq!(db.idempotent_get("k", 1_001).unwrap(), None);
        // ...and the next record removes it.
        db.idempotent_put("other", &answer(5_000), 1_001).unwrap();
        assert_eq!(db.idempotent_count().unwrap(), 1);
        assert_eq!(db.idempotent_get("other", 0).unwrap(), Some(answer(5_000)));
    }
}
