//! What an open actor keeps in memory (W4, issue 8).

use wasmkeep_guests::DEMO;
use wasmkeep_runtime::runtime::SqliteMemoryInfo;
use wasmkeep_testkit::TestNode;

/// What SQLite holds for a counter that served three increments and is
/// still open.
fn memory_of_a_counter_after_three_increments() -> SqliteMemoryInfo {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    let a = node.actor("demo/examples/counter/a");
    for _ in 0..3 {
        assert_eq!(a.post("/increment", "").status, 200);
    }
    let info = node.runtime().actor_info(a.id()).unwrap();
    info.sqlite_memory.expect("the actor is open")
}

/// Creating an actor writes pages (the internal tables) that most of its
/// events never read, and opening it reads some (the init mark, the alarm)
/// that its next events do not: neither stays cached. A counter's database
/// has seven pages of 4 KiB, each taking about 4.5 KiB in the cache; its
/// increments read two (the schema page and the counter's), and SQLite's
/// count of the cache also holds the cache's own bookkeeping.
#[test]
fn an_open_actor_caches_only_the_pages_its_events_use() {
    let cache = memory_of_a_counter_after_three_increments().cache_bytes;
    assert!(
        cache < 4 * 4096,
        "{cache} bytes cached: more than the pages increments read"
    );
}

/// SQLite zeroes the write-ahead log's whole 32 KiB index when the log
/// starts; a counter's index uses its first page (the header and the
/// frames' page numbers) and one or two of its hash pages. The rest is
/// given back (ADR 0028; the store's tests cover a log that starts over).
#[test]
fn an_open_actor_keeps_only_the_wal_index_pages_it_uses() {
    let bytes = memory_of_a_counter_after_three_increments().wal_index_bytes;
    // Kept through wasmkeep's VFS (0 would mean in SQLite's heap).
    assert!(bytes > 0, "no index through the VFS");
    assert!(bytes <= 3 * 4096, "{bytes} bytes of the index resident");
}

/// `on-init` runs once in an actor's life: the statements it ran (table
/// creation, first rows) and the runtime's init mark are not kept
/// prepared, nor is the alarm's read of an actor without an alarm, while
/// the statements its requests run are.
#[test]
fn an_open_actor_keeps_no_statement_only_its_init_ran() {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    let a = node.actor("demo/examples/counter/a");
    for _ in 0..2 {
        assert_eq!(a.post("/increment", "").status, 200);
    }
    let kept = a.prepared_statements();
    let has = |what: &str| kept.iter().any(|s| s.contains(what));
    assert!(has("UPDATE counter SET n = n + 1"), "{kept:?}");
    assert!(!has("CREATE TABLE counter"), "{kept:?}");
    assert!(!has("INSERT INTO counter"), "{kept:?}");
    assert!(!has("_wasmkeep_meta"), "{kept:?}");
    // Nor the alarm's read, which opening ran, for an actor without one.
    assert!(!has("_wasmkeep_alarm"), "{kept:?}");
    // A request after init still prepares (and keeps) its statements.
    assert_eq!(a.get("/value").status, 200);
    assert!(
        a.prepared_statements()
            .iter()
            .any(|s| s.contains("SELECT n FROM counter")),
        "{:?}",
        a.prepared_statements()
    );
}

/// ADR 0027: an app's manifest sets the page size of its actor databases
/// created from then on; a database keeps the size it was created with
/// when the setting changes.
#[test]
fn a_new_database_takes_the_page_size_of_its_app_and_keeps_it() {
    let node = TestNode::new();
    let small = "[storage]\nsqlite_page_bytes = 1024\n";
    node.deploy_with_manifest("demo/examples", DEMO, small)
        .unwrap();
    let a = node.actor("demo/examples/counter/a");
    assert_eq!(a.post("/increment", "").text(), "{\"value\":1}");
    assert_eq!(a.sql_i64("PRAGMA page_size"), 1024);
    // Back to the node's default (4096): only new databases take it.
    node.deploy("demo/examples", DEMO).unwrap();
    let b = node.actor("demo/examples/counter/b");
    assert_eq!(b.post("/increment", "").status, 200);
    assert_eq!(b.sql_i64("PRAGMA page_size"), 4096);
    assert_eq!(a.post("/increment", "").text(), "{\"value\":2}");
    assert_eq!(a.sql_i64("PRAGMA page_size"), 1024);
    let pages = a.sql_i64("PRAGMA page_count") as u64;
    let (a, b) = (a.id().clone(), b.id().clone());
    // Closed (after a restart), each actor's size is still counted in its
    // own pages.
    let mut node = node;
    node.restart();
    let info = node.runtime().actor_info(&a).unwrap();
    assert!(!info.active);
    assert_eq!(info.database_bytes, pages * 1024);
    let info = node.runtime().actor_info(&b).unwrap();
    assert_eq!(info.database_bytes % 4096, 0);
    assert!(info.database_bytes > 0);
}
