//! Parked replies (ADR 0042) under the test kit's clock: moving the clock
//! past a parked reply's deadline expires it, as time does on a real node,
//! and not a moment before.

use std::sync::mpsc;
use std::time::Duration;

use wasmkeep_guests::DEMO;
use wasmkeep_testkit::TestNode;

#[test]
fn advancing_the_clock_past_a_parked_replys_deadline_expires_it() {
    let node = TestNode::new();
    node.deploy("demo/examples", DEMO).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let r = node
                .actor("demo/examples/pinger/p")
                .request("POST", "/park?ms=120000", "");
            tx.send(r.map(|r| r.status).map_err(|e| e.code())).unwrap();
        });
        // The request's reply is parked once its batch committed.
        let mut polls = 0;
        while node.runtime().parked_replies() == 0 {
            polls += 1;
            assert!(polls < 3_000, "the request never parked its reply");
            std::thread::sleep(Duration::from_millis(10));
        }
        node.advance(Duration::from_secs(119));
        assert!(
            rx.recv_timeout(Duration::from_millis(500)).is_err(),
            "the reply left a second before its deadline"
        );
        node.advance(Duration::from_secs(2));
        let got = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("moving the clock past the deadline did not expire the parked reply");
        assert_eq!(got, Err("reply_expired".to_owned()));
    });
    assert_eq!(node.runtime().parked_replies(), 0);
}
