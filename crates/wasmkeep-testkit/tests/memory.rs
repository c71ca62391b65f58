//! What an open actor keeps in memory (W4, issue 8).

use wasmkeep_guests::DEMO;
use wasmkeep_testkit::TestNode;

/// Creating an actor writes pages (the internal tables) that most of its
/// events never read; they are not kept cached. A counter's database has
/// seven pages, all cached once it was created (about 31 KiB by SQLite's
/// count, each page 4 KiB plus its header); its increments read five.
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
        cache < 6 * 4096,
        "{cache} bytes cached: more than the pages increments read"
    );
}
