//! Shared test helpers: a real moto S3 server, the three backends, and a
//! source actor database driven through the real store.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use wasmkeep_replica::Bucket;
use wasmkeep_replica::testing::FaultStore;
use wasmkeep_store::{ActorDb, ActorId, OpenMode, StoreLimits, Value};

/// A moto server on a free loopback port, killed on drop.
pub struct Moto {
    child: Child,
    pub port: u16,
}

fn moto_binary() -> PathBuf {
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let p = dir.join("moto_server");
            if p.is_file() {
                return p;
            }
        }
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/moto_server");
    if venv.is_file() {
        return venv;
    }
    panic!(
        "moto_server not found on PATH nor in .venv/bin: run `scripts/setup.sh --test` \
         (these tests need a real S3-compatible server and do not skip)"
    );
}

fn http(port: u16, request: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(request.as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

impl Moto {
    pub fn start() -> Moto {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(moto_binary())
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting moto_server");
        let moto = Moto { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let get =
                format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
            if let Ok(r) = http(port, &get)
                && r.starts_with("HTTP/1.1 200")
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "moto_server did not answer within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        moto
    }

    /// Creates a bucket (object_store cannot) with a plain HTTP PUT.
    pub fn create_bucket(&self, name: &str) {
        let put = format!(
            "PUT /{name} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        );
        let r = http(self.port, &put).expect("create bucket");
        assert!(r.starts_with("HTTP/1.1 200"), "create bucket: {r}");
    }

    pub fn options(&self) -> Vec<(String, String)> {
        [
            ("aws_endpoint", format!("http://127.0.0.1:{}", self.port)),
            ("aws_allow_http", "true".into()),
            ("aws_access_key_id", "test".into()),
            ("aws_secret_access_key", "test".into()),
            ("aws_region", "us-east-1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    pub fn store(&self, bucket: &str) -> Arc<dyn ObjectStore> {
        let mut b = AmazonS3Builder::new().with_bucket_name(bucket);
        for (k, v) in self.options() {
            b = b.with_config(k.parse().unwrap(), v);
        }
        Arc::new(b.build().unwrap())
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bucket whose PUTs a test can hold or replay.
pub struct Backend {
    pub faults: Arc<FaultStore>,
    pub bucket: Bucket,
    _dir: Option<tempfile::TempDir>,
}

impl Backend {
    pub fn over(
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

    pub fn memory() -> Backend {
        Backend::over(Arc::new(InMemory::new()), "p", None)
    }

    pub fn file() -> Backend {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalFileSystem::new_with_prefix(dir.path()).unwrap();
        Backend::over(Arc::new(store), "", Some(dir))
    }

    pub fn moto(moto: &Moto, bucket: &str) -> Backend {
        Backend::over(moto.store(bucket), "cluster-1", None)
    }
}

pub fn actor(name: &str) -> ActorId {
    ActorId::new("t", "app", "c", name).unwrap()
}

/// A source actor: the real store's database, written through the same
/// batch transaction the runtime uses.
pub struct Source {
    pub db: Option<ActorDb>,
    pub dir: PathBuf,
}

impl Source {
    pub fn new(dir: &Path) -> Source {
        let db = ActorDb::open(dir, &StoreLimits::default(), OpenMode::Create)
            .unwrap()
            .unwrap();
        Source {
            db: Some(db),
            dir: dir.to_owned(),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join("actor.db")
    }

    /// The committed state, read through the open connection (which holds
    /// the file while it is open, as the runtime's does).
    pub fn image(&mut self) -> wasmkeep_replica::Image {
        let bytes = self.db.as_mut().unwrap().committed_image().unwrap();
        wasmkeep_replica::Image::from_bytes(bytes).unwrap()
    }

    pub fn commit(&mut self, statements: &[(&str, Vec<Value>)]) {
        let db = self.db.as_mut().unwrap();
        db.begin().unwrap();
        for (sql, params) in statements {
            db.execute(sql, params).unwrap();
        }
        db.commit().unwrap();
    }

    /// Closes the database (SQLite checkpoints and removes the WAL) and
    /// returns the file's bytes.
    pub fn close_and_read(&mut self) -> Vec<u8> {
        self.db = None;
        assert!(!self.dir.join("actor.db-wal").exists());
        std::fs::read(self.path()).unwrap()
    }
}

/// Every table's rows, in a fixed order, as text.
pub fn dump(path: &Path) -> String {
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
pub fn dump_bytes(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("export.db");
    std::fs::write(&p, bytes).unwrap();
    dump(&p)
}
