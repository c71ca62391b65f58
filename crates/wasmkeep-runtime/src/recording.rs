//! Recording each event of an app that asks for it, for replay (issue 38,
//! ADR 0062).
//!
//! An app opts in with a `[recording]` table in its manifest. Then every
//! event of its actors on this node (a request, an alarm, a message, an
//! answer to a send, a socket's event) is written to the actor's database
//! in a batch's transaction: the input, the time and random seed the
//! guest saw, the version that ran it, and its outcome
//! (`wasmkeep_store::db::recording`).
//!
//! **Held records (ADR 0067).** On a node without a bucket an actor's
//! records wait in memory and are written 32 (or 16 KiB) at a time in a
//! later batch's transaction, in the batch that starts a generation, and
//! between events before the database is read or the actor closes. The
//! first recorded batch of an open marks the database
//! (`recording.unflushed`); the close's write clears it. An open that
//! finds it set follows one that lost held records, and starts a new run.
//! A cluster node writes each record with its event.
//!
//! What makes an event repeatable:
//! - **Time.** While an app records, its guests' clock (`clock.now-ms` and
//!   WASI's clocks) stands still during an event at the time it started,
//!   as `Date.now()` does in Durable Objects. That time is recorded.
//! - **Randomness.** `identity.unique-id` and WASI's random sources draw
//!   from a generator seeded per event from the OS; the seed is recorded.
//!
//! The records of an actor are bounded by its app's limits: events and
//! bytes per actor, age, and bytes per app on this node. They come in
//! generations (see the store's module); a new generation starts when the
//! current one holds half the actor's limit of events or bytes, or when
//! its first event is half the age limit old. Its first batch copies the
//! database as it stands (the base a replay starts from) into the actor's
//! folder first. A generation that would pass the app's byte limit does
//! not start: that actor records nothing until room is made.
//!
//! A replay's sandbox (`crate::replay`) uses the same code the other way:
//! each event takes its time and seed from the tape the replay set.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use wasmkeep_store::ActorId;
use wasmkeep_store::db::recording::{Generation, GenerationUse, NewRecord, base_file_name};

use crate::actor::{ActorRequest, EventKind, Outcome, SocketEvent};
use crate::error::RuntimeError;
use crate::guest_tape::{EventTape, InstanceTape};
use crate::metrics::Metrics;
use crate::outbox::{Answer, Inbound, MessageAnswer};

/// Most events one actor keeps, the highest an app may set.
/// Most events one actor keeps, the highest an app may set.
pub const RECORDING_EVENTS_PER_ACTOR_MAX: u64 = 100_000;
/// Fewest events one actor keeps, the lowest an app may set: a copy of
/// the database is made at most every half of it.
pub const RECORDING_EVENTS_PER_ACTOR_MIN: u64 = 100;
/// Default events one actor keeps (two generations of half).
pub const RECORDING_EVENTS_PER_ACTOR_DEFAULT: u64 = 1_000;
/// Highest bytes of records one actor may keep.
pub const RECORDING_BYTES_PER_ACTOR_MAX: u64 = 256 << 20;
/// Lowest bytes of records an app may set per actor.
pub const RECORDING_BYTES_PER_ACTOR_MIN: u64 = 1 << 20;
/// Default bytes of records one actor keeps.
pub const RECORDING_BYTES_PER_ACTOR_DEFAULT: u64 = 4 << 20;
/// Highest age of the oldest record an app may ask for (30 days).
pub const RECORDING_AGE_MAX_S: u64 = 30 * 24 * 3600;
/// Default age past which records are let go (7 days).
pub const RECORDING_AGE_DEFAULT_S: u64 = 7 * 24 * 3600;
/// Highest bytes of base copies an app's actors may keep on one node.
pub const RECORDING_BYTES_PER_APP_MAX: u64 = 64 << 30;
/// Default bytes of base copies an app's actors keep on one node.
pub const RECORDING_BYTES_PER_APP_DEFAULT: u64 = 1 << 30;
/// Events a generation holds at least before its bytes start the next:
/// large events cannot make every batch copy the database.
pub const RECORDING_GENERATION_EVENTS_MIN: u64 = 16;
/// How long an actor whose generation could not start, or whose record
/// could not be written, records nothing before it tries again: a
/// database at its quota cannot make every batch copy itself.
pub const RECORDING_RETRY_MS: u64 = 60_000;
/// Most records of committed events an actor holds in memory before it
/// writes them in its next batch's transaction (ADR 0067).
pub(crate) const RECORDING_HELD_EVENTS_MAX: usize = 32;
/// Most bytes of records an actor holds in memory before it writes them.
/// They count in the node's memory budget; past it, each is written with
/// its event.
pub(crate) const RECORDING_HELD_BYTES_MAX: u64 = 16 << 10;
/// How long the count of an app's base copies on a node is trusted
/// before the folder is read again (copies removed with their actors).
const APP_BYTES_RESCAN_MS: u64 = 60_000;

/// The manifest's `[recording]` table: its presence turns recording on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordingSettings {
    /// Events one actor keeps (the newest; at least half of them).
    pub events_per_actor_max: Option<u64>,
    /// Bytes of records one actor keeps.
    pub bytes_per_actor_max: Option<u64>,
    /// Seconds after which records are let go.
    pub age_max_s: Option<u64>,
    /// Bytes the base copies of the app's actors may take on one node.
    pub bytes_per_app_max: Option<u64>,
}

/// [`RecordingSettings`] with defaults filled in, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordingLimits {
    pub events_per_actor: u64,
    pub bytes_per_actor: u64,
    pub age_ms: u64,
    pub bytes_per_app: u64,
}

impl RecordingSettings {
    /// The limits, or why the manifest's values cannot be used.
    pub fn limits(&self) -> Result<RecordingLimits, String> {
        fn within(
            field: &str,
            v: Option<u64>,
            default: u64,
            (min, max): (u64, u64),
        ) -> Result<u64, String> {
            let v = v.unwrap_or(default);
            if !(min..=max).contains(&v) {
                return Err(format!(
                    "recording.{field} = {v}: must be {min} to {max} (limit recording_{field})"
                ));
            }
            Ok(v)
        }
        Ok(RecordingLimits {
            events_per_actor: within(
                "events_per_actor_max",
                self.events_per_actor_max,
                RECORDING_EVENTS_PER_ACTOR_DEFAULT,
                (
                    RECORDING_EVENTS_PER_ACTOR_MIN,
                    RECORDING_EVENTS_PER_ACTOR_MAX,
                ),
            )?,
            bytes_per_actor: within(
                "bytes_per_actor_max",
                self.bytes_per_actor_max,
                RECORDING_BYTES_PER_ACTOR_DEFAULT,
                (RECORDING_BYTES_PER_ACTOR_MIN, RECORDING_BYTES_PER_ACTOR_MAX),
            )?,
            age_ms: within(
                "age_max_s",
                self.age_max_s,
                RECORDING_AGE_DEFAULT_S,
                (1, RECORDING_AGE_MAX_S),
            )? * 1000,
            bytes_per_app: within(
                "bytes_per_app_max",
                self.bytes_per_app_max,
                RECORDING_BYTES_PER_APP_DEFAULT,
                (1, RECORDING_BYTES_PER_APP_MAX),
            )?,
        })
    }
}

/// An actor's recording while it is open: the generation its records go
/// to and what that holds (read when it opens, counted as it records).
#[derive(Debug)]
pub(crate) struct ActorRecording {
    generation: Generation,
    used: GenerationUse,
    /// A generation to start in the batch's transaction (`Some(true)`: a
    /// new run, every older record goes).
    start: Option<bool>,
    /// Records of committed events not written yet, oldest first (ADR
    /// 0067): written in a later batch's transaction once
    /// [`RECORDING_HELD_EVENTS_MAX`] or [`RECORDING_HELD_BYTES_MAX`] are
    /// held or a generation starts, before the database is read between
    /// events, and when the actor closes.
    held: Held,
    /// Records may wait in memory: a node without a bucket. A cluster
    /// node writes each with its event (its commits are replicated as
    /// they are).
    may_hold: bool,
    /// The database's mark that records may be held in memory is set.
    marked: bool,
}

/// The records an actor holds, and the bytes they reserve in the node's
/// memory budget (`node_memory_bytes_max`), given back when they go.
#[derive(Debug, Default)]
struct Held {
    records: Vec<HeldRecord>,
    bytes: u64,
}

impl Held {
    /// Adds `record`; `true` if it may wait: `may_hold`, and the node's
    /// memory budget has room for its `bytes` (reserved then). Otherwise it
    /// is to be written at once, with any held before it.
    fn push(&mut self, record: HeldRecord, bytes: u64, may_hold: bool) -> bool {
        self.records.push(record);
        let reserved = may_hold && wasmkeep_store::memory_budget::reserve_host(bytes);
        if reserved {
            self.bytes += bytes;
        }
        reserved
    }

    fn take(&mut self) -> Vec<HeldRecord> {
        wasmkeep_store::memory_budget::release_host(std::mem::take(&mut self.bytes));
        std::mem::take(&mut self.records)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        wasmkeep_store::memory_budget::release_host(self.bytes);
    }
}

/// One event's record, held in memory until it is written.
#[derive(Debug, Clone)]
struct HeldRecord {
    generation: u64,
    at_ms: u64,
    seed: [u8; 32],
    version: u64,
    kind: &'static str,
    input: Vec<u8>,
    outcome: String,
}

impl ActorRecording {
    fn new(rt: &crate::node::Inner, generation: Generation) -> Self {
        ActorRecording {
            generation,
            used: GenerationUse::default(),
            start: None,
            held: Held::default(),
            may_hold: rt.replication.is_none(),
            marked: false,
        }
    }

    /// Writes the records held, in the running transaction.
    fn write_held(
        &mut self,
        db: &wasmkeep_store::ActorDb,
    ) -> Result<(), wasmkeep_store::StoreError> {
        for h in self.held.take() {
            db.record_event(&NewRecord {
                generation: h.generation,
                at_ms: h.at_ms,
                seed: &h.seed,
                version: h.version,
                kind: h.kind,
                input: &h.input,
                outcome: h.outcome.as_bytes(),
            })?;
        }
        Ok(())
    }
}

/// What a batch does about recording, decided before its transaction.
#[derive(Debug, Default)]
pub(crate) struct BatchRecording {
    /// Where its records go, if it records.
    pub recording: Option<ActorRecording>,
    /// It does not record although the database names a generation: the
    /// run of generations ends in its transaction.
    pub break_run: bool,
}

/// Bytes of base copies per app on this node: counted from the folder,
/// again once [`APP_BYTES_RESCAN_MS`] old, and added to as copies are made.
#[derive(Default)]
pub(crate) struct AppBytes(Mutex<HashMap<(String, String), (u64, std::time::Instant)>>);

impl AppBytes {
    /// Whether `bytes` more fit in the app's `max`; if so they are counted.
    fn reserve(&self, data: &Path, id: &ActorId, bytes: u64, max: u64) -> bool {
        let key = (id.tenant.clone(), id.app.clone());
        let now = crate::clock::instant();
        let mut m = self.0.lock();
        let stale = m.get(&key).is_none_or(|(_, at)| {
            now.duration_since(*at).as_millis() as u64 >= APP_BYTES_RESCAN_MS
        });
        if stale {
            let counted = bases_under(&data.join("actors").join(&id.tenant).join(&id.app));
            m.insert(key.clone(), (counted, now));
        }
        let used = &mut m.get_mut(&key).expect("counted above").0;
        if *used + bytes > max {
            return false;
        }
        *used += bytes;
        true
    }

    fn release(&self, id: &ActorId, bytes: u64) {
        if let Some((used, _)) = self.0.lock().get_mut(&(id.tenant.clone(), id.app.clone())) {
            *used = used.saturating_sub(bytes);
        }
    }
}

fn is_base(name: &str) -> bool {
    name.starts_with("recording.") && name.ends_with(".db")
}

fn bases_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let ty = e.file_type().ok();
            if ty.is_some_and(|t| t.is_dir()) {
                bases_under(&e.path())
            } else if is_base(&e.file_name().to_string_lossy()) {
                e.metadata().map(|m| m.len()).unwrap_or(0)
            } else {
                0
            }
        })
        .sum()
}

/// Removes the base copies in an actor's folder: its database was
/// replaced (a restore), so no copy there is of its history.
pub(crate) fn forget_bases(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if is_base(&e.file_name().to_string_lossy()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Before a batch's transaction begins: whether the actor records in it
/// (and if a new generation starts, its base copied first), or whether a
/// run of generations must end because this batch will not be recorded.
/// `known_clear`: the database is known to name no generation (read once
/// per open for an app that does not record). `paused_until_ms`: no
/// generation starts before then ([`RECORDING_RETRY_MS`] after one could
/// not start or a record could not be written).
pub(crate) fn before_batch(
    rt: &crate::node::Inner,
    id: &ActorId,
    settings: Option<&RecordingSettings>,
    current: Option<ActorRecording>,
    db: &wasmkeep_store::ActorDb,
    (known_clear, paused_until_ms): (&mut bool, &mut u64),
) -> BatchRecording {
    let now = rt.clock.now_ms();
    let decided = match settings {
        Some(s) if !rt.config.replay_sandbox && now >= *paused_until_ms => {
            let d = decide(rt, id, s, current, db);
            if d.is_none() {
                *paused_until_ms = now + RECORDING_RETRY_MS;
            }
            d
        }
        _ => None,
    };
    if decided.is_some() {
        *known_clear = false;
        return BatchRecording {
            recording: decided,
            break_run: false,
        };
    }
    // Not recorded: a database that names a generation ends its run here.
    let break_run = !*known_clear
        && db.has_recording().unwrap_or(true)
        && !rt.faults.unsafe_recording_keeps_run();
    *known_clear = !break_run;
    BatchRecording {
        recording: None,
        break_run,
    }
}

fn decide(
    rt: &crate::node::Inner,
    id: &ActorId,
    settings: &RecordingSettings,
    current: Option<ActorRecording>,
    db: &wasmkeep_store::ActorDb,
) -> Option<ActorRecording> {
    let limits = settings.limits().ok()?;
    let mut rec = match current {
        // New limits apply to the generation as it stands.
        Some(r) => r,
        None => {
            let generation = db.recording_generation().ok()?;
            let base_ok = generation
                .as_ref()
                .is_some_and(|g| db.dir().join(base_file_name(g)).exists());
            // The open before this one ended with records of committed
            // events in memory (a crash): the run has a gap (ADR 0067).
            let gap =
                db.recording_unflushed().ok()? && !rt.faults.unsafe_recording_ignores_unflushed();
            let generation = match generation {
                Some(g) if base_ok && !gap => g,
                // Never recorded here, its base is not in this folder
                // (the actor came from elsewhere), or records are missing:
                // a new run.
                _ => return start_generation(rt, id, limits, None, db),
            };
            ActorRecording {
                used: db.recording_use(generation.number).ok()?,
                ..ActorRecording::new(rt, generation)
            }
        }
    };
    let now = rt.clock.now_ms();
    let full = rec.used.events >= limits.events_per_actor / 2
        || (rec.used.bytes >= limits.bytes_per_actor / 2
            && rec.used.events >= RECORDING_GENERATION_EVENTS_MIN)
        || rec
            .used
            .first_at_ms
            .is_some_and(|t| now.saturating_sub(t) >= limits.age_ms / 2);
    if full {
        let next = Generation {
            number: rec.generation.number + 1,
            tag: rec.generation.tag.clone(),
        };
        // The records held go on to be written (first, in the batch that
        // starts the next generation).
        return start_generation(rt, id, limits, Some(next), db).map(|r| ActorRecording {
            held: rec.held,
            marked: rec.marked,
            ..r
        });
    }
    rec.start = None;
    Some(rec)
}

/// Copies the database as it stands into the new generation's base
/// (fsynced) and removes the bases a replay can no longer start from:
/// those older than the one it follows, and any of another tag. `next`:
/// the generation that follows the current one; `None` starts a new run
/// (generation 1, a new random tag, every older record removed).
fn start_generation(
    rt: &crate::node::Inner,
    id: &ActorId,
    limits: RecordingLimits,
    next: Option<Generation>,
    db: &wasmkeep_store::ActorDb,
) -> Option<ActorRecording> {
    let fresh = next.is_none();
    let generation = match next {
        Some(g) => g,
        None => {
            let mut raw = [0u8; wasmkeep_store::db::recording::TAG_CHARS / 2];
            getrandom::fill(&mut raw).ok()?;
            Generation {
                number: 1,
                tag: hex::encode(raw),
            }
        }
    };
    let dir = db.dir().to_path_buf();
    let size = db.size_bytes().unwrap_or(0);
    if !rt
        .recording_bytes
        .reserve(&rt.config.data_dir, id, size, limits.bytes_per_app)
    {
        Metrics::inc(&rt.metrics.recording_refused_total);
        return None;
    }
    let base = dir.join(base_file_name(&generation));
    let _ = std::fs::remove_file(&base);
    let copied = db.copy_to(&base).map_err(|e| e.to_string()).and_then(|_| {
        wasmkeep_store::sync::sync_file(&base)
            .and_then(|()| wasmkeep_store::sync::sync_dir(&dir))
            .map_err(|e| e.to_string())
    });
    if let Err(e) = copied {
        rt.recording_bytes.release(id, size);
        let _ = std::fs::remove_file(&base);
        tracing::warn!(actor = %id, error = %e, "recording: the base copy failed; this batch is not recorded");
        return None;
    }
    let keep_previous = generation.number.saturating_sub(1);
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !is_base(&name) || name == base_file_name(&generation) {
                continue;
            }
            let mut parts = name.split('.').skip(1);
            let n: Option<u64> = parts.next().and_then(|n| n.parse().ok());
            let same_tag = parts.next() == Some(generation.tag.as_str());
            if !same_tag || n.is_none_or(|n| n < keep_previous) {
                let len = e.metadata().map(|m| m.len()).unwrap_or(0);
                if std::fs::remove_file(e.path()).is_ok() {
                    rt.recording_bytes.release(id, len);
                }
            }
        }
    }
    Some(ActorRecording {
        start: Some(fresh),
        ..ActorRecording::new(rt, generation)
    })
}

/// In the batch's transaction, once it began: a new generation starts
/// (the records held of the one before written first), or a run ends; an
/// actor that may hold records sets the database's mark that it does. A
/// generation that cannot start ends the run instead (the batch records
/// nothing).
pub(crate) fn after_begin(
    batch: BatchRecording,
    db: &wasmkeep_store::ActorDb,
) -> Option<ActorRecording> {
    let mut recording = batch.recording;
    let mut break_run = batch.break_run;
    if let Some(r) = &mut recording {
        let started = match r.start {
            Some(fresh) => {
                r.write_held(db).is_ok()
                    && db.start_recording_generation(&r.generation, fresh).is_ok()
            }
            None => true,
        };
        let marked =
            started && (r.marked || !r.may_hold || db.mark_recording_unflushed(true).is_ok());
        if marked {
            r.marked = r.may_hold;
        } else {
            recording = None;
            break_run = true;
        }
    }
    if break_run {
        end_run(db);
    }
    recording
}

/// Ends an actor's run of generations in the running transaction: its
/// records and its copies go (a failure to end it is logged; the copies'
/// removal alone already keeps a replay from starting there).
pub(crate) fn end_run(db: &wasmkeep_store::ActorDb) {
    forget_bases(db.dir());
    if let Err(e) = db.break_recording() {
        tracing::warn!(error = %e, dir = %db.dir().display(), "recording: the run of generations could not be ended in the database");
    }
}

/// Between events: writes the records an actor holds in a transaction of
/// their own, before its database is read (`closing`: it closes, and the
/// database's mark that records are held is cleared with them, so that
/// its next open goes on with the run). If they cannot be written the
/// actor records nothing more in this open and the mark stays: its next
/// batch that records starts a new run (ADR 0067).
pub(crate) fn write_held_between(
    recording: &mut Option<ActorRecording>,
    db: &mut wasmkeep_store::ActorDb,
    closing: bool,
) {
    let Some(r) = recording.as_mut() else {
        return;
    };
    if r.held.records.is_empty() && !(closing && r.marked) {
        return;
    }
    if db.in_transaction() {
        // A batch that did not end (a panic): what it did is not known.
        *recording = None;
        return;
    }
    let written = db
        .begin()
        .and_then(|()| r.write_held(db))
        .and_then(|()| match closing && r.marked {
            true => db.mark_recording_unflushed(false),
            false => Ok(()),
        })
        .and_then(|()| db.commit());
    match written {
        Ok(()) if closing => *recording = None,
        Ok(()) => {}
        Err(e) => {
            db.rollback();
            tracing::warn!(dir = %db.dir().display(), error = %e, "recording: the records held could not be written; the actor's next recorded batch starts a new run");
            *recording = None;
        }
    }
}

/// One event while it runs: its tape, and its input when it records.
pub(crate) struct EventRecorder {
    tape: EventTape,
    input: Option<(&'static str, Vec<u8>)>,
    /// A sweep's delivery: recorded only if its alarm ran.
    delivery: bool,
}

impl EventRecorder {
    /// The time and seed the event runs with.
    pub(crate) fn tape(&self) -> EventTape {
        self.tape
    }
}

/// Before an event runs: its time and seed (from the OS when recording,
/// from the replay's tape in a sandbox), set on the instance.
pub(crate) fn begin_event(
    rt: &crate::node::Inner,
    recording: bool,
    instance: &InstanceTape,
    kind: &EventKind,
) -> Option<EventRecorder> {
    let (tape, input) = if rt.config.replay_sandbox {
        if rt.faults.unsafe_replay_without_tape() {
            return None;
        }
        let tape = rt.sandbox_tape.lock().take().unwrap_or(EventTape {
            at_ms: rt.clock.now_ms(),
            seed: [0; 32],
        });
        (tape, None)
    } else if recording {
        let input = input_of(kind)?;
        // The thread's generator (ChaCha, seeded and reseeded by the OS):
        // no system call per event.
        let mut seed = [0u8; 32];
        rand::Rng::fill_bytes(&mut rand::rng(), &mut seed);
        let tape = EventTape {
            at_ms: rt.clock.now_ms(),
            seed,
        };
        (tape, Some(input))
    } else {
        return None;
    };
    instance.play(&tape);
    Some(EventRecorder {
        tape,
        input,
        delivery: matches!(kind, EventKind::Deliver { .. }),
    })
}

/// After an event ran: the instance's clock and random go back to the
/// node's, and the record is kept when the actor records: held in memory
/// on a node without a bucket (written with the held ones once enough
/// are), written at once otherwise. An event whose record cannot be
/// written (the transaction is gone, or the write failed) ends the run:
/// the rest of the batch is not recorded.
pub(crate) fn end_event(
    rt: &crate::node::Inner,
    id: &ActorId,
    rec: EventRecorder,
    instance: &InstanceTape,
    (recording, paused_until_ms): (&mut Option<ActorRecording>, &mut u64),
    db: &wasmkeep_store::ActorDb,
    (version, outcome, parked): (u64, &Result<Outcome, RuntimeError>, bool),
) {
    instance.stop();
    let (Some((kind, input)), Some(r)) = (rec.input, recording.as_mut()) else {
        return;
    };
    if rec.delivery
        && let Ok(Outcome::Delivered(d)) = outcome
        && !matches!(d, crate::index::Delivered::Ran)
    {
        // No guest ran and nothing the replay compares was written. (A
        // failed handler is recorded: its retry was committed.)
        return;
    }
    if !db.in_transaction() {
        // SQLite rolled the batch back, records with it: the batch goes on
        // unrecorded (`batch_rolled_back` ends the run).
        *recording = None;
        return;
    }
    let outcome = match outcome {
        Ok(_) if parked => describe_outcome(&Ok(Outcome::Parked)),
        _ => describe_outcome(outcome),
    };
    let bytes = input.len() + outcome.len() + 32 + 64;
    let record = HeldRecord {
        generation: r.generation.number,
        at_ms: rec.tape.at_ms,
        seed: rec.tape.seed,
        version,
        kind,
        input,
        outcome,
    };
    r.used.events += 1;
    r.used.bytes += bytes as u64;
    r.used.first_at_ms.get_or_insert(rec.tape.at_ms);
    let reserved = r.held.push(record, bytes as u64, r.may_hold);
    let write_now = !reserved
        || r.held.records.len() >= RECORDING_HELD_EVENTS_MAX
        || r.held.bytes >= RECORDING_HELD_BYTES_MAX;
    match if write_now { r.write_held(db) } else { Ok(()) } {
        Ok(()) => Metrics::inc(&rt.metrics.events_recorded_total),
        Err(e) => {
            tracing::warn!(actor = %id, error = %e, "recording an event failed: the actor's recording starts again in a minute");
            end_run(db);
            *recording = None;
            *paused_until_ms = rt.clock.now_ms() + RECORDING_RETRY_MS;
        }
    }
}

#[derive(Default)]
struct Enc(Vec<u8>);

impl Enc {
    fn bytes(mut self, b: &[u8]) -> Enc {
        self.0.extend_from_slice(&(b.len() as u32).to_be_bytes());
        self.0.extend_from_slice(b);
        self
    }
    fn str(self, s: &str) -> Enc {
        self.bytes(s.as_bytes())
    }
    fn num(self, n: u64) -> Enc {
        self.bytes(&n.to_be_bytes())
    }
}

struct Dec<'a>(&'a [u8]);

impl<'a> Dec<'a> {
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = u32::from_be_bytes(self.0.get(..4)?.try_into().ok()?) as usize;
        let b = self.0.get(4..4 + len)?;
        self.0 = &self.0[4 + len..];
        Some(b)
    }
    fn str(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }
    fn num(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.bytes()?.try_into().ok()?))
    }
}

fn encode_answer(e: Enc, answer: &Answer) -> Enc {
    match answer {
        Answer::Message(MessageAnswer::Reply(b)) => e.str("reply").bytes(b),
        Answer::Message(MessageAnswer::Refused { code, message }) => {
            e.str("refused").str(code).str(message)
        }
        Answer::Http {
            status,
            headers,
            body,
        } => e
            .str("http")
            .num(u64::from(*status))
            .str(&wasmkeep_store::db::encode_headers(headers))
            .bytes(body),
        Answer::Failed { code, message } => e.str("failed").str(code).str(message),
    }
}

fn decode_answer(d: &mut Dec<'_>) -> Option<Answer> {
    Some(match d.str()?.as_str() {
        "reply" => Answer::Message(MessageAnswer::Reply(d.bytes()?.to_vec())),
        "refused" => Answer::Message(MessageAnswer::Refused {
            code: d.str()?,
            message: d.str()?,
        }),
        "http" => Answer::Http {
            status: d.num()? as u16,
            headers: wasmkeep_store::db::decode_headers(&d.str()?),
            body: d.bytes()?.to_vec(),
        },
        "failed" => Answer::Failed {
            code: d.str()?,
            message: d.str()?,
        },
        _ => return None,
    })
}

/// The answers a suspended event had: each call's digest and its answer.
pub(crate) type Answered = Vec<([u8; 32], Answer)>;

/// A suspended event's journal (ADR 0056): each answered call's digest
/// and answer, then the digest of the call it waits on.
pub(crate) fn encode_journal(answered: &[([u8; 32], Answer)], waiting: &[u8; 32]) -> Vec<u8> {
    let mut e = Enc::default().num(answered.len() as u64);
    for (digest, answer) in answered {
        e = encode_answer(e.bytes(digest), answer);
    }
    e.bytes(waiting).0
}

/// [`encode_journal`]'s answered calls and waiting digest.
pub(crate) fn decode_journal(bytes: &[u8]) -> Option<(Answered, [u8; 32])> {
    let mut d = Dec(bytes);
    let n = d.num()?;
    let mut answered = Vec::new();
    for _ in 0..n {
        let digest: [u8; 32] = d.bytes()?.try_into().ok()?;
        answered.push((digest, decode_answer(&mut d)?));
    }
    let waiting: [u8; 32] = d.bytes()?.try_into().ok()?;
    Some((answered, waiting))
}

/// A request's encoded input, as a record keeps it.
pub(crate) fn request_input(
    method: &str,
    path: &str,
    query: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Vec<u8> {
    Enc::default()
        .str(method)
        .str(path)
        .str(query)
        .str(&wasmkeep_store::db::encode_headers(headers))
        .bytes(body)
        .0
}

/// The kind and encoded input of an event a guest runs; `None` for those
/// it does not (an open ahead of an alarm, a hand-over of outbox rows).
fn input_of(kind: &EventKind) -> Option<(&'static str, Vec<u8>)> {
    Some(match kind {
        EventKind::Request(r) => (
            "request",
            request_input(&r.method, &r.path, &r.query, &r.headers, &r.body),
        ),
        EventKind::Alarm { force } => ("alarm", Enc::default().num(u64::from(*force)).0),
        EventKind::Deliver { .. } => ("alarm", Enc::default().num(0).0),
        EventKind::Inbound(Inbound::Message {
            from,
            life,
            seq,
            body,
            ..
        }) => (
            "message",
            Enc::default()
                .str(&from.tenant)
                .str(&from.app)
                .str(&from.class)
                .str(&from.name)
                .num(*life)
                .num(*seq)
                .bytes(body)
                .0,
        ),
        EventKind::Inbound(Inbound::Response {
            life,
            seq,
            answer,
            attempts,
            discard,
            trace: _,
        }) => {
            let e = Enc::default()
                .num(*life)
                .num(*seq)
                .num(u64::from(*attempts))
                .num(u64::from(*discard));
            ("response", encode_answer(e, answer).0)
        }
        EventKind::Socket(ev) => {
            let what = match ev {
                SocketEvent::Message { id, .. } => format!("message on socket {id}"),
                SocketEvent::Closed { info, code, .. } => {
                    format!("close of socket {} ({code})", info.id)
                }
            };
            ("socket", Enc::default().str(&what).0)
        }
        // A deadline runs a suspended event again (ADR 0056).
        EventKind::AwaitDeadline { seq } => ("await_deadline", Enc::default().num(*seq).0),
        EventKind::Prepare | EventKind::OutboxResume { .. } | EventKind::Between(_) => return None,
    })
}

/// The event a record stands for, to run again; `None` for a kind a
/// replay does not run (a socket's event: its socket is gone) or an input
/// that does not decode.
pub(crate) fn event_of(kind: &str, input: &[u8]) -> Option<EventKind> {
    let mut d = Dec(input);
    Some(match kind {
        "request" => EventKind::Request(ActorRequest {
            method: d.str()?,
            path: d.str()?,
            query: d.str()?,
            headers: wasmkeep_store::db::decode_headers(&d.str()?),
            body: d.bytes()?.to_vec(),
            replicated: false,
            trace: None,
        }),
        "alarm" => EventKind::Alarm {
            force: d.num()? == 1,
        },
        "await_deadline" => EventKind::AwaitDeadline { seq: d.num()? },
        "message" => {
            let (tenant, app, class, name) = (d.str()?, d.str()?, d.str()?, d.str()?);
            let from = ActorId::new(&tenant, &app, &class, &name).ok()?;
            EventKind::Inbound(Inbound::Message {
                from,
                life: d.num()?,
                seq: d.num()?,
                body: d.bytes()?.to_vec(),
                trace: None,
                chain: Vec::new(),
            })
        }
        "response" => {
            let life = d.num()?;
            let seq = d.num()?;
            let attempts = d.num()? as u32;
            let discard = d.num()? == 1;
            let answer = decode_answer(&mut d)?;
            EventKind::Inbound(Inbound::Response {
                life,
                seq,
                answer,
                attempts,
                discard,
                trace: None,
            })
        }
        _ => return None,
    })
}

/// A body as a person reads it: its text, or its bytes in hex.
fn show_body(body: &[u8]) -> String {
    match std::str::from_utf8(body) {
        Ok(t) => t.to_owned(),
        Err(_) => format!("hex:{}", hex::encode(body)),
    }
}

/// What an event answered, as one text both production's record and a
/// replay's run are compared by: a response's status, headers (those the
/// runtime adds left out) and body; a message's answer; an error's code.
pub(crate) fn describe_outcome(r: &Result<Outcome, RuntimeError>) -> String {
    match r {
        Ok(Outcome::Response(resp)) => {
            let mut headers: Vec<String> = resp
                .headers
                .iter()
                .filter(|(k, _)| !k.to_ascii_lowercase().starts_with("x-wasmkeep-"))
                .map(|(k, v)| format!("{}: {v}", k.to_ascii_lowercase()))
                .collect();
            headers.sort();
            let mut s = format!("response {}\n", resp.status);
            for h in headers {
                s.push_str(&h);
                s.push('\n');
            }
            s.push('\n');
            s.push_str(&show_body(&resp.body));
            s
        }
        Ok(Outcome::Answered(MessageAnswer::Reply(b))) => format!("reply\n{}", show_body(b)),
        Ok(Outcome::Answered(MessageAnswer::Refused { code, message })) => {
            format!("refused {code}: {message}")
        }
        Ok(Outcome::Alarm(ran)) => format!("alarm ran={ran}"),
        Ok(Outcome::Parked) => "parked (answered by a later event)".to_owned(),
        Ok(Outcome::Delivered(_)) => "alarm ran=true".to_owned(),
        Ok(_) => "done".to_owned(),
        Err(e) => format!("error {}", e.code()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_decode_to_the_event_they_came_from() {
        let req = EventKind::Request(ActorRequest {
            method: "POST".into(),
            path: "/add".into(),
            query: "n=1".into(),
            headers: vec![("content-type".into(), "text/plain".into())],
            body: vec![0, 1, 2, 255],
            replicated: false,
            trace: None,
        });
        let (kind, input) = input_of(&req).unwrap();
        let back = event_of(kind, &input).unwrap();
        assert_eq!(input_of(&back).unwrap(), (kind, input));
        let answer = EventKind::Inbound(Inbound::Response {
            life: 3,
            seq: 9,
            answer: Answer::Http {
                status: 201,
                headers: vec![("a".into(), "b".into())],
                body: b"ok".to_vec(),
            },
            attempts: 2,
            discard: false,
            trace: None,
        });
        let (kind, input) = input_of(&answer).unwrap();
        assert_eq!(
            input_of(&event_of(kind, &input).unwrap()).unwrap(),
            (kind, input.clone())
        );
        assert!(event_of("request", &input[..3]).is_none());
    }

    #[test]
    fn limits_default_and_refuse_out_of_range() {
        let l = RecordingSettings::default().limits().unwrap();
        assert_eq!(l.events_per_actor, RECORDING_EVENTS_PER_ACTOR_DEFAULT);
        let bad = RecordingSettings {
            bytes_per_actor_max: Some(RECORDING_BYTES_PER_ACTOR_MAX + 1),
            ..Default::default()
        };
        let e = bad.limits().unwrap_err();
        assert!(e.contains("recording_bytes_per_actor_max"), "{e}");
    }
}
