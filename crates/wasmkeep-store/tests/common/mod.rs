//! Helpers the store's closing tests share (`closing.rs`,
//! `frozen_file.rs`).

use std::path::Path;

use wasmkeep_store::{ActorDb, OpenMode, StoreLimits, Value};

/// The actor at `dir`, created if missing, under the default limits.
pub(crate) fn open(dir: &Path) -> ActorDb {
    ActorDb::open(dir, &StoreLimits::default(), OpenMode::Create)
        .unwrap()
        .unwrap()
}

/// The rows of table `t` in the actor at `dir`, read by a new connection.
pub(crate) fn count(dir: &Path) -> i64 {
    let db = open(dir);
    let r = db
        .inspect(
            "SELECT count(*) FROM t",
            &wasmkeep_store::InspectBounds::rows(1),
        )
        .unwrap();
    match r.rows[0][0] {
        Value::Integer(n) => n,
        ref v => panic!("{v:?}"),
    }
}
