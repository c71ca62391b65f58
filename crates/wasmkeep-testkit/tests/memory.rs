//! What an open actor keeps in memory (W4, issue 8).

use wasmkeep_guests::DEMO;
use wasmkeep_testkit::TestNode;

/// Creating an actor writes pages (the internal tables) that most of its
/// events never read, and opening it reads some (the init mark, the alarm)
/// that its next events do not: neither stays cached. A counter's database
/// has seven pages of 4 KiB, each taking about 4.5 KiB in the cache; its
/// increments read two (the schema page and the counter's), and SQLite's
/// count of the cache also holds the cache's own bookkeeping.
#[test]
fn an_open_actor_caches_only_the_pages_its_events_use() {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    let a = node.actor("demo/examples/counter/a");
    for _ in 0..3 {
        assert_eq!(a.post("/increment", "").status, 200);
    }
    let info = node.runtime().actor_info(a.id()).unwrap();
    let cache = info.sqlite_memory.expect("the actor is open").cache_bytes;
    assert!(
        cache < 4 * 4096,
        "{cache} bytes cached: more than the pages increments read"
    );
}

/// `on-init` runs once in an actor's life: the statements it ran (table
/// creation, first rows) and the runtime's init mark are not kept
/// prepared, while the statements its requests run are.
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
