//! The actor's recording of its events (issue 38, ADR 0062).
//!
//! When an app records, each event's input (what a request, an alarm, a
//! message or an answer brought), the time and random seed the guest saw,
//! the version that ran it and its outcome are written here in the batch's
//! transaction: a record commits with what the event did or not at all.
//!
//! Records come in generations. A generation starts from a copy of the
//! database taken just before its first event (the runtime keeps it beside
//! the database, named by [`base_file_name`]); starting generation `g + 1`
//! removes the records of generations before `g`. So the records kept are
//! always one or two runs of consecutive events, each from a copy of the
//! database they started on: what a replay needs. The meta row names the
//! generation and a random tag, so that a copy from another database (a
//! restore) never passes for this one's.

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags, params};

use super::ActorDb;
use super::outbox::no_table;
use crate::error::StoreError;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS _wasmkeep_recorded (
    seq INTEGER PRIMARY KEY,
    generation INTEGER NOT NULL,
    at_ms INTEGER NOT NULL,
    seed BLOB NOT NULL,
    version INTEGER NOT NULL,
    kind TEXT NOT NULL,
    input BLOB NOT NULL,
    outcome BLOB NOT NULL
);
";
// No index on `generation`: it would add a page to every event's commit;
// a generation's records are counted once per open, by a scan of at most
// the actor's `events_per_actor_max` rows.

/// The meta key naming the current generation (`<n>:<tag>`).
const GENERATION_KEY: &str = "recording.generation";

/// The meta key set while records of committed events may be held in
/// memory only (ADR 0067): an open that found it set followed one that
/// ended without writing them, so the run of generations has a gap.
const UNFLUSHED_KEY: &str = "recording.unflushed";

/// Tables a replay does not compare: the recording itself and the
/// runtime's bookkeeping (times of initialization, versions).
const NOT_COMPARED: [&str; 2] = ["_wasmkeep_recorded", "_wasmkeep_meta"];

/// The copy a generation starts from, in the actor's folder.
pub fn base_file_name(generation: &Generation) -> String {
    format!("recording.{}.{}.db", generation.number, generation.tag)
}

/// Which generation records go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generation {
    pub number: u64,
    /// Random, hex: tells this database's copies from another's.
    pub tag: String,
}

/// What the current generation holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GenerationUse {
    pub events: u64,
    pub bytes: u64,
    pub first_at_ms: Option<u64>,
}

/// One event to record.
#[derive(Debug, Clone)]
pub struct NewRecord<'a> {
    pub generation: u64,
    pub at_ms: u64,
    pub seed: &'a [u8],
    pub version: u64,
    pub kind: &'a str,
    pub input: &'a [u8],
    pub outcome: &'a [u8],
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedEvent {
    pub seq: u64,
    pub generation: u64,
    pub at_ms: u64,
    pub seed: Vec<u8>,
    pub version: u64,
    pub kind: String,
    pub input: Vec<u8>,
    pub outcome: Vec<u8>,
}

/// What a database holds of its recording.
#[derive(Debug, Clone, Default)]
pub struct Recording {
    pub generation: Option<Generation>,
    /// In order of `seq`.
    pub events: Vec<RecordedEvent>,
}

/// Hex digits of a generation's tag (a copy's file name holds it: nothing
/// else is accepted there).
pub const TAG_CHARS: usize = 16;

fn parse_generation(value: &str) -> Option<Generation> {
    let (n, tag) = value.split_once(':')?;
    if tag.len() != TAG_CHARS || !tag.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some(Generation {
        number: n.parse().ok()?,
        tag: tag.to_owned(),
    })
}

impl ActorDb {
    /// The generation records go to, if the actor ever recorded.
    pub fn recording_generation(&self) -> Result<Option<Generation>, StoreError> {
        Ok(self
            .meta_get(GENERATION_KEY)?
            .as_deref()
            .and_then(parse_generation))
    }

    /// How many events and bytes generation `number` holds.
    pub fn recording_use(&self, number: u64) -> Result<GenerationUse, StoreError> {
        let r = self.conn.query_row(
            "SELECT count(*), coalesce(sum(length(input) + length(outcome) + length(seed) + 64), 0), \
             min(at_ms) FROM _wasmkeep_recorded WHERE generation = ?1",
            params![number as i64],
            |r| {
                Ok(GenerationUse {
                    events: r.get::<_, i64>(0)? as u64,
                    bytes: r.get::<_, i64>(1)? as u64,
                    first_at_ms: r.get::<_, Option<i64>>(2)?.map(|v| v as u64),
                })
            },
        );
        match r {
            Ok(u) => Ok(u),
            Err(e) if no_table(&e) => Ok(GenerationUse::default()),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Starts `generation` (inside a transaction): the records of every
    /// generation before the one it follows are removed; with `fresh` (a
    /// new run of generations, a new tag), every record.
    pub fn start_recording_generation(
        &self,
        generation: &Generation,
        fresh: bool,
    ) -> Result<(), StoreError> {
        self.conn.execute_batch(SCHEMA).map_err(|e| self.err(e))?;
        let keep_from = if fresh {
            i64::MAX
        } else {
            generation.number as i64
        };
        self.conn
            .execute(
                "DELETE FROM _wasmkeep_recorded WHERE generation + 1 < ?1",
                params![keep_from],
            )
            .map_err(|e| self.err(e))?;
        self.meta_set(
            GENERATION_KEY,
            &format!("{}:{}", generation.number, generation.tag),
        )
    }

    /// Whether the database names a generation (it recorded, and its run
    /// of generations was not broken since).
    pub fn has_recording(&self) -> Result<bool, StoreError> {
        Ok(self.meta_get(GENERATION_KEY)?.is_some())
    }

    /// Whether records of committed events were held in memory when the
    /// database was last written: set by [`ActorDb::mark_recording_unflushed`]
    /// and cleared when they were all written.
    pub fn recording_unflushed(&self) -> Result<bool, StoreError> {
        Ok(self.meta_get(UNFLUSHED_KEY)?.is_some())
    }

    /// Sets (inside a transaction) or clears the mark that records of
    /// committed events may be held in memory only.
    pub fn mark_recording_unflushed(&self, unflushed: bool) -> Result<(), StoreError> {
        if unflushed {
            self.meta_set(UNFLUSHED_KEY, "1")
        } else {
            self.conn
                .execute(
                    "DELETE FROM _wasmkeep_meta WHERE key = ?1",
                    params![UNFLUSHED_KEY],
                )
                .map(|_| ())
                .map_err(|e| self.err(e))
        }
    }

    /// Ends the run of generations (inside a transaction): a batch commits
    /// without being recorded, so no replay may start from before it. The
    /// records go (and the mark that some were held in memory); the next
    /// batch that records starts a new run.
    pub fn break_recording(&self) -> Result<(), StoreError> {
        self.conn
            .execute(
                "DELETE FROM _wasmkeep_meta WHERE key IN (?1, ?2)",
                params![GENERATION_KEY, UNFLUSHED_KEY],
            )
            .map_err(|e| self.err(e))?;
        match self.conn.execute("DELETE FROM _wasmkeep_recorded", []) {
            Ok(_) => Ok(()),
            Err(e) if no_table(&e) => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Writes one event's record (inside the batch's transaction).
    pub fn record_event(&self, r: &NewRecord<'_>) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO _wasmkeep_recorded \
                 (generation, at_ms, seed, version, kind, input, outcome) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    r.generation as i64,
                    r.at_ms as i64,
                    r.seed,
                    r.version as i64,
                    r.kind,
                    r.input,
                    r.outcome
                ])
            })
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Everything recorded, between events.
    pub fn recording(&self) -> Result<Recording, StoreError> {
        read_recording(&self.conn).map_err(|e| self.err(e))
    }

    /// Every compared table's rows (see [`table_rows_of`]), or `None` if
    /// they would take more than `bytes_max` bytes.
    pub fn table_rows(&self, bytes_max: usize) -> Result<Option<TableRows>, StoreError> {
        table_rows_of(&self.conn, bytes_max).map_err(|e| self.err(e))
    }
}

fn read_recording(conn: &Connection) -> rusqlite::Result<Recording> {
    let generation = match conn.query_row(
        "SELECT value FROM _wasmkeep_meta WHERE key = ?1",
        params![GENERATION_KEY],
        |r| r.get::<_, String>(0),
    ) {
        Ok(v) => parse_generation(&v),
        Err(rusqlite::Error::QueryReturnedNoRows) => None,
        Err(e) if no_table(&e) => None,
        Err(e) => return Err(e),
    };
    let mut events = Vec::new();
    let stmt = conn.prepare(
        "SELECT seq, generation, at_ms, seed, version, kind, input, outcome \
         FROM _wasmkeep_recorded ORDER BY seq",
    );
    let mut stmt = match stmt {
        Ok(s) => s,
        Err(e) if no_table(&e) => return Ok(Recording { generation, events }),
        Err(e) => return Err(e),
    };
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        events.push(RecordedEvent {
            seq: r.get::<_, i64>(0)? as u64,
            generation: r.get::<_, i64>(1)? as u64,
            at_ms: r.get::<_, i64>(2)? as u64,
            seed: r.get(3)?,
            version: r.get::<_, i64>(4)? as u64,
            kind: r.get(5)?,
            input: r.get(6)?,
            outcome: r.get(7)?,
        });
    }
    Ok(Recording { generation, events })
}

/// Reads a closed actor's database at `db_path` with `read`, on a
/// read-only connection of its own.
fn read_closed<T>(
    db_path: &Path,
    read: impl FnOnce(&Connection) -> rusqlite::Result<T>,
) -> Result<T, StoreError> {
    super::sqlite_setup();
    let conn = Connection::open_with_flags(
        db_path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| StoreError::Io(format!("{}: {e}", db_path.display())))?;
    read(&conn).map_err(|e| StoreError::Sql(e.to_string()))
}

/// The recording of a closed actor's database at `db_path`.
pub fn recording_at(db_path: &Path) -> Result<Recording, StoreError> {
    read_closed(db_path, read_recording)
}

/// Every compared table's rows of a closed actor's database (`None`
/// past `bytes_max`).
pub fn table_rows_at(db_path: &Path, bytes_max: usize) -> Result<Option<TableRows>, StoreError> {
    read_closed(db_path, |c| table_rows_of(c, bytes_max))
}

/// Each compared table's rows, each row one canonical line (its values
/// quoted as SQL literals), sorted: two databases hold the same rows
/// exactly when these are equal.
pub type TableRows = BTreeMap<String, Vec<String>>;

fn table_rows_of(conn: &Connection, bytes_max: usize) -> rusqlite::Result<Option<TableRows>> {
    let mut names: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    names.retain(|n| !NOT_COMPARED.contains(&n.as_str()));
    let mut out = TableRows::new();
    let mut bytes = 0usize;
    for name in names {
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        let mut stmt = conn.prepare(&format!("SELECT * FROM {quoted}"))?;
        let columns = stmt.column_count();
        let mut rows = stmt.query([])?;
        let mut lines = Vec::new();
        while let Some(r) = rows.next()? {
            let mut line = String::new();
            for i in 0..columns {
                if i > 0 {
                    line.push_str(", ");
                }
                line.push_str(&literal(r.get_ref(i)?));
            }
            bytes += line.len();
            if bytes > bytes_max {
                return Ok(None);
            }
            lines.push(line);
        }
        lines.sort();
        out.insert(name, lines);
    }
    Ok(Some(out))
}

/// A value as SQL would write it (text quoted, blobs in hex).
fn literal(v: ValueRef<'_>) -> String {
    match v {
        ValueRef::Null => "NULL".to_owned(),
        ValueRef::Integer(i) => i.to_string(),
        ValueRef::Real(f) => format!("{f:?}"),
        ValueRef::Text(t) => format!("'{}'", String::from_utf8_lossy(t).replace('\'', "''")),
        ValueRef::Blob(b) => format!("X'{}'", hex::encode_upper(b)),
    }
}

/// The rows of `a` not in `b` and of `b` not in `a`, per table (tables
/// only one side has count every row); tables that agree are left out.
pub fn compare_tables(
    a: &TableRows,
    b: &TableRows,
) -> BTreeMap<String, (Vec<String>, Vec<String>)> {
    let empty = Vec::new();
    let mut out = BTreeMap::new();
    for name in a.keys().chain(b.keys()) {
        if out.contains_key(name) {
            continue;
        }
        let (ra, rb) = (a.get(name).unwrap_or(&empty), b.get(name).unwrap_or(&empty));
        if ra == rb {
            continue;
        }
        let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
        let (mut i, mut j) = (0, 0);
        while i < ra.len() || j < rb.len() {
            match (ra.get(i), rb.get(j)) {
                (Some(x), Some(y)) if x == y => {
                    i += 1;
                    j += 1;
                }
                (Some(x), Some(y)) if x < y => {
                    only_a.push(x.clone());
                    i += 1;
                }
                (Some(_), Some(y)) => {
                    only_b.push(y.clone());
                    j += 1;
                }
                (Some(x), None) => {
                    only_a.push(x.clone());
                    i += 1;
                }
                (None, Some(y)) => {
                    only_b.push(y.clone());
                    j += 1;
                }
                (None, None) => break,
            }
        }
        out.insert(name.clone(), (only_a, only_b));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(t: &[(&str, &[&str])]) -> TableRows {
        t.iter()
            .map(|(n, r)| (n.to_string(), r.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn compare_names_rows_each_side_lacks() {
        let a = rows(&[("t", &["1", "2", "4"]), ("same", &["x"]), ("gone", &["z"])]);
        let b = rows(&[("t", &["1", "3", "4", "5"]), ("same", &["x"])]);
        let d = compare_tables(&a, &b);
        assert_eq!(d.len(), 2);
        assert_eq!(
            d["t"],
            (vec!["2".to_owned()], vec!["3".to_owned(), "5".to_owned()])
        );
        assert_eq!(d["gone"], (vec!["z".to_owned()], vec![]));
    }

    #[test]
    fn literals_tell_types_apart() {
        assert_eq!(literal(ValueRef::Integer(1)), "1");
        assert_eq!(literal(ValueRef::Text(b"1")), "'1'");
        assert_eq!(literal(ValueRef::Text(b"it's")), "'it''s'");
        assert_eq!(literal(ValueRef::Blob(&[1, 255])), "X'01FF'");
        assert_eq!(literal(ValueRef::Null), "NULL");
    }
}
