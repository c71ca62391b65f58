//! Shared test helpers: a real moto S3 server, the three backends, and a
//! source actor database driven through the real store.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use wasmkeep_replica::Bucket;
use wasmkeep_replica::testing::FaultStore;
use wasmkeep_store::{ActorDb, ActorId, OpenMode, StoreLimits, Value};

pub(crate) use wasmkeep_replica::testing::Moto;

/// A bucket whose PUTs a test can hold or replay.
pub(crate) struct Backend {
    pub faults: Arc<FaultStore>,
    pub bucket: Bucket,
    _dir: Option<tempfile::TempDir>,
}

impl Backend {
    pub(crate) fn over(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        dir: Option<tempfile::TempDir>,
    ) -> Backend {
        let faults = Arc::new(FaultStore::new(store));
        let bucket = Bucket::new(faults.clone(), prefix);
        Backend {
            faults,
            bucket,
            _dir: dir,
        }
    }

    pub(crate) fn memory() -> Backend {
        Backend::over(Arc::new(InMemory::new()), "p", None)
    }

    pub(crate) fn file() -> Backend {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalFileSystem::new_with_prefix(dir.path()).unwrap();
        Backend::over(Arc::new(store), "", Some(dir))
    }

    pub(crate) fn moto(moto: &Moto, bucket: &str) -> Backend {
        Backend::over(moto.store(bucket), "cluster-1", None)
    }
}

pub(crate) fn actor(name: &str) -> ActorId {
    ActorId::new("t", "app", "c", name).unwrap()
}

/// A source actor: the real store's database, written through the same
/// batch transaction the runtime uses.
pub(crate) struct Source {
    pub db: Option<ActorDb>,
    pub dir: PathBuf,
}

impl Source {
    pub(crate) fn new(dir: &Path) -> Source {
        let db = ActorDb::open(dir, &StoreLimits::default(), OpenMode::Create)
            .unwrap()
            .unwrap();
        Source {
            db: Some(db),
            dir: dir.to_owned(),
        }
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.dir.join("actor.db")
    }

    /// The committed state, read through the open connection (which holds
    /// the file while it is open, as the runtime's does).
    pub(crate) fn image(&mut self) -> wasmkeep_replica::Image {
        let bytes = self.db.as_mut().unwrap().committed_image().unwrap();
        wasmkeep_replica::Image::from_bytes(bytes).unwrap()
    }

    pub(crate) fn commit(&mut self, statements: &[(&str, Vec<Value>)]) {
        let db = self.db.as_mut().unwrap();
        db.begin().unwrap();
        for (sql, params) in statements {
            db.execute(sql, params).unwrap();
        }
        db.commit().unwrap();
    }

    /// Checkpoints the log into the file in full (a close leaves a short
    /// one as it is, ADR 0076), closes the database and returns the file's
    /// bytes.
    pub(crate) fn close_and_read(&mut self) -> Vec<u8> {
        if let Some(db) = &self.db {
            db.freeze_file().unwrap();
        }
        self.db = None;
        let wal = std::fs::metadata(self.dir.join("actor.db-wal")).map(|m| m.len());
        assert!(
            matches!(wal, Ok(0) | Err(_)),
            "the log holds {wal:?} bytes after closing"
        );
        std::fs::read(self.path()).unwrap()
    }
}

/// Every table's rows, in a fixed order, as text.
pub(crate) fn dump(path: &Path) -> String {
    let c = rusqlite::Connection::open(path).unwrap();
    let tables: Vec<String> = c
        .prepare("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut out = String::new();
    for t in tables {
        out.push_str(&format!("[{t}]\n"));
        let mut st = c
            .prepare(&format!("SELECT * FROM \"{t}\" ORDER BY 1, 2"))
            .unwrap();
        let n = st.column_count();
        let rows = st
            .query_map([], |r| {
                let mut line = String::new();
                for i in 0..n {
                    let v: rusqlite::types::Value = r.get(i)?;
                    line.push_str(&format!("{v:?} "));
                }
                Ok(line)
            })
            .unwrap();
        for r in rows {
            out.push_str(&r.unwrap());
            out.push('\n');
        }
    }
    out
}

/// Writes exported bytes to a file and dumps it.
pub(crate) fn dump_bytes(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("export.db");
    std::fs::write(&p, bytes).unwrap();
    dump(&p)
}
