//! Measures the native stack SQLite uses on its recursive paths, at the
//! depth limits actors' connections have (`wasmkeep_store::stack`), by
//! painting a thread's stack before the statement and finding how much of
//! the paint it overwrote. The figures behind `SQL_STACK_BYTES_MIN`
//! (docs/adr/0045-a-node-any-tenant-can-share.md) come from
//! `cargo run --release -p wasmkeep-store --example stack_probe`.
//! A measuring tool, not a test: it asserts nothing.

use wasmkeep_store::{ActorDb, OpenMode, StoreLimits};

/// The byte the unused stack is painted with.
const PAINT: u8 = 0xA5;

/// The lowest address of this thread's stack.
fn stack_low() -> usize {
    // SAFETY: the attributes are filled by `pthread_getattr_np` before
    // they are read and destroyed once.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_getattr_np(libc::pthread_self(), &mut attr);
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        addr as usize
    }
}

/// Paints the stack from just below this frame down to its lowest 64 KiB;
/// returns where it started.
#[inline(never)]
fn paint(low: usize) -> usize {
    let marker = 0u8;
    let sp = &marker as *const u8 as usize;
    let from = low + 64 * 1024;
    let to = sp - 16 * 1024;
    for a in from..to {
        // SAFETY: the bytes lie in this thread's own stack, below every
        // live frame and above its guard; nothing reads them meanwhile.
        unsafe { std::ptr::write_volatile(a as *mut u8, PAINT) };
    }
    sp
}

/// The stack used below `sp` since [`paint`]: down to the lowest byte that
/// lost its paint.
fn used(low: usize, sp: usize) -> usize {
    let from = low + 64 * 1024;
    let mut a = from;
    // SAFETY: as in `paint`: this thread's own stack, below the live frames.
    while a < sp && unsafe { std::ptr::read_volatile(a as *const u8) } == PAINT {
        a += 1;
    }
    sp - a
}

/// Runs `setup` on a fresh database, then `stmt` on a freshly painted
/// 256 MiB stack, and prints the stack it used.
fn measure(name: &str, setup: Vec<String>, stmt: String) {
    let name = name.to_owned();
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let dir = tempfile::tempdir().unwrap();
            let mut db = ActorDb::open(
                &dir.path().join("a"),
                &StoreLimits::default(),
                OpenMode::Create,
            )
            .unwrap()
            .unwrap();
            db.begin().unwrap();
            for s in &setup {
                if let Err(e) = db.execute(s, &[]) {
                    println!("{name}: setup {s:.60}: {e}");
                    return;
                }
            }
            let low = stack_low();
            let sp = paint(low);
            let r = db.query(&stmt, &[]);
            let u = used(low, sp);
            println!(
                "{name}: {} KiB {:?}",
                u / 1024,
                r.map(|_| "ok")
                    .map_err(|e| e.to_string().chars().take(80).collect::<String>())
            );
        })
        .unwrap()
        .join()
        .unwrap();
}

/// `n` tables and the triggers `body` writes between them.
fn chain(n: usize, body: &dyn Fn(usize) -> String, extra: Vec<String>) -> Vec<String> {
    let mut setup = extra;
    for i in 0..n {
        setup.push(format!(
            "CREATE TABLE t{i}(id INTEGER PRIMARY KEY, x UNIQUE, y)"
        ));
    }
    for i in 0..n - 1 {
        setup.push(body(i));
    }
    setup
}

/// A chain of 990 views, each selecting from the one before.
fn views() -> Vec<String> {
    let mut v = vec![
        "CREATE TABLE vb(x)".to_string(),
        "CREATE VIEW v0 AS SELECT x FROM vb".into(),
    ];
    for i in 1..990 {
        v.push(format!("CREATE VIEW v{i} AS SELECT x FROM v{}", i - 1));
    }
    v
}

/// Trigger chains of `n` tables that insert (also through the view chain
/// `views`), update and delete.
fn measure_write_chains(n: usize, views: &[String]) {
    measure(
        "insert chain",
        chain(
            n,
            &|i| {
                format!(
                    "CREATE TRIGGER g{i} AFTER INSERT ON t{i} BEGIN INSERT INTO t{}(x) VALUES(new.x); END",
                    i + 1
                )
            },
            vec![],
        ),
        "INSERT INTO t0(x) VALUES(1)".into(),
    );
    measure(
        "insert-select-view chain",
        chain(
            n,
            &|i| {
                format!(
                    "CREATE TRIGGER g{i} AFTER INSERT ON t{i} BEGIN INSERT INTO t{}(x) SELECT new.x FROM v989 UNION ALL SELECT new.x; END",
                    i + 1
                )
            },
            views.to_vec(),
        ),
        "INSERT INTO t0(x) VALUES(1)".into(),
    );
    measure(
        "update chain",
        chain(
            n,
            &|i| {
                format!(
                    "CREATE TRIGGER g{i} AFTER UPDATE ON t{i} BEGIN UPDATE t{} SET y = new.y WHERE x = new.x; END",
                    i + 1
                )
            },
            vec![],
        ),
        "UPDATE t0 SET y = 2".into(),
    );
    measure(
        "delete chain",
        chain(
            n,
            &|i| {
                format!(
                    "CREATE TRIGGER g{i} AFTER DELETE ON t{i} BEGIN DELETE FROM t{} WHERE x = old.x; END",
                    i + 1
                )
            },
            vec![],
        ),
        "DELETE FROM t0".into(),
    );
}

/// Trigger chains of `n` tables that upsert, and that insert from a
/// `BEFORE` trigger whose `WHEN` reads the next table.
fn measure_upsert_and_before_chains(n: usize) {
    measure(
        "upsert chain",
        chain(
            n,
            &|i| {
                format!(
                    "CREATE TRIGGER g{i} AFTER INSERT ON t{i} BEGIN INSERT INTO t{}(x) VALUES(new.x) ON CONFLICT(x) DO UPDATE SET y = excluded.y; END",
                    i + 1
                )
            },
            vec![],
        ),
        "INSERT INTO t0(x) VALUES(1)".into(),
    );
    measure(
        "before chain",
        chain(
            n,
            &|i| {
                format!(
                    "CREATE TRIGGER g{i} BEFORE INSERT ON t{i} WHEN new.x IN (SELECT x FROM t{}) BEGIN INSERT INTO t{}(x) VALUES(new.x); END",
                    i + 1,
                    i + 1
                )
            },
            vec![],
        ),
        "INSERT INTO t0(x) VALUES(1)".into(),
    );
}

/// Foreign keys that cascade an update and a delete through `n` tables.
fn measure_fk_cascades(n: usize) {
    let mut setup = vec!["CREATE TABLE f0(id INTEGER PRIMARY KEY)".to_string()];
    for i in 1..n {
        setup.push(format!("CREATE TABLE f{i}(id INTEGER PRIMARY KEY, p REFERENCES f{}(id) ON DELETE CASCADE ON UPDATE CASCADE)", i - 1));
    }
    measure(
        "fk cascade update",
        setup.clone(),
        "UPDATE f0 SET id = id + 1".into(),
    );
    measure("fk cascade delete", setup, "DELETE FROM f0".into());
}

/// `INSTEAD OF` triggers that insert through a chain of `n` views.
fn measure_instead_of_chain(n: usize) {
    let mut setup = vec![
        "CREATE TABLE b0(x)".to_string(),
        "CREATE VIEW w0 AS SELECT x FROM b0".into(),
    ];
    for i in 1..n {
        setup.push(format!("CREATE TABLE b{i}(x)"));
        setup.push(format!("CREATE VIEW w{i} AS SELECT x FROM b{i}"));
        setup.push(format!("CREATE TRIGGER i{i} INSTEAD OF INSERT ON w{} BEGIN INSERT INTO w{i}(x) VALUES(new.x); END", i - 1));
    }
    measure(
        "instead-of chain",
        setup,
        "INSERT INTO w0(x) VALUES(1)".into(),
    );
}

/// Common table expressions, each selecting from the one before (at most
/// 990 of them).
fn measure_chained_ctes(n: usize) {
    let k = n.min(990);
    let ctes = (0..k)
        .map(|i| match i {
            0 => "c0(x) AS (SELECT 1)".to_string(),
            _ => format!("c{i}(x) AS (SELECT x FROM c{})", i - 1),
        })
        .collect::<Vec<_>>()
        .join(", ");
    measure(
        "chained ctes",
        vec![],
        format!("WITH {ctes} SELECT * FROM c{}", k - 1),
    );
}

/// Each recursive path at its limit (`n` tables, views, ... default 999).
fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(999);
    let views = views();
    measure_write_chains(n, &views);
    measure_upsert_and_before_chains(n);
    measure_fk_cascades(n);
    measure_instead_of_chain(n);
    measure_chained_ctes(n);
    measure("view chain", views, "SELECT * FROM v989".into());
    measure(
        "json",
        vec![],
        format!("SELECT json('{}{}')", "[".repeat(999), "]".repeat(999)),
    );
    measure(
        "compound",
        vec![],
        format!("SELECT 1{}", " UNION ALL SELECT 1".repeat(499)),
    );
}
