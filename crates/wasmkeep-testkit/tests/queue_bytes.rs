//! The bytes of requests an actor's queue and the node's queues may hold
//! (issue 17): a wedged actor cannot make the node keep its callers'
//! bodies without bound.

use std::time::Duration;

use wasmkeep_guests::TESTBED;
use wasmkeep_testkit::{RuntimeError, TestNode};

#[test]
fn an_actor_queue_is_bounded_in_bytes_and_the_node_in_all_queues() {
    let node = TestNode::with_config(|c| {
        c.event_cpu_ms_max = 4_000;
        c.actor_queue_bytes_max = 1024 * 1024;
        c.node_queue_bytes_max = 3 * 1024 * 1024;
    });
    node.deploy("t/bed", TESTBED).unwrap();
    let body = vec![b'x'; 400 * 1024];
    let outcomes = std::thread::scope(|s| {
        // One actor spins until its deadline; requests queue behind it.
        let wedged = s.spawn(|| node.actor("t/bed/probe/w").request("POST", "/loop", ""));
        std::thread::sleep(Duration::from_millis(300));
        let senders: Vec<_> = (0..4)
            .map(|_| {
                let body = body.clone();
                s.spawn(|| node.actor("t/bed/probe/w").request("POST", "/write", body))
            })
            .collect();
        let results: Vec<Result<_, RuntimeError>> =
            senders.into_iter().map(|h| h.join().unwrap()).collect();
        let _ = wedged.join().unwrap();
        results
    });
    let refused: Vec<&RuntimeError> = outcomes.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        !refused.is_empty(),
        "1.6 MB queued for an actor with a 1 MiB bound"
    );
    for e in &refused {
        assert_eq!(e.code(), "actor_overloaded", "{e}");
        assert!(e.to_string().contains("actor_queue_bytes_max"), "{e}");
    }
    let admitted = outcomes.iter().filter(|r| r.is_ok()).count();
    assert!(
        admitted >= 2,
        "two 400 KiB requests fit in 1 MiB: {outcomes:?}"
    );

    // Across actors: each queue is under its own bound, the node's is not.
    let node = &node;
    let outcomes = std::thread::scope(|s| {
        let wedged: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .map(|n| {
                s.spawn(move || {
                    node.actor(&format!("t/bed/probe/{n}"))
                        .request("POST", "/loop", "")
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let senders: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .flat_map(|n| [n, n])
            .map(|n| {
                let body = body.clone();
                s.spawn(move || {
                    node.actor(&format!("t/bed/probe/{n}"))
                        .request("POST", "/write", body)
                })
            })
            .collect();
        let results: Vec<Result<_, RuntimeError>> =
            senders.into_iter().map(|h| h.join().unwrap()).collect();
        for w in wedged {
            let _ = w.join().unwrap();
        }
        results
    });
    let node_refused = outcomes
        .iter()
        .filter_map(|r| r.as_ref().err())
        .filter(|e| e.code() == "node_overloaded")
        .count();
    assert!(
        node_refused >= 1,
        "3.2 MB queued on a node with a 3 MiB bound: {outcomes:?}"
    );
}
