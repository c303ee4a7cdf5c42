//! What a relay run reports against what the outbox holds.

use std::time::Duration;

use idempotent_jobs::outbox::{self, Relay};
use idempotent_jobs::{Job, JobKey};

use crate::backends::Backend;
use crate::handlers::{TestConn, TestError};
use crate::harness::Db;

static PUSHER: Job = Job::new("relay_truth_push", "relay-truth:<n>");

/// A relay run parks the messages whose lease lapsed during their last allowed attempt (their
/// relay stopped, or outlived its lease) before it leases: it reports them, `parked`. Before, the
/// run said `parked: 0` beside a parked message, and relay A, whose delivery outlived its lease,
/// said its lease was lost: neither report had the park the outbox holds.
pub fn a_run_that_parks_lapsed_messages_reports_them<B>()
where
    B: Backend,
    B::Conn: TestConn,
{
    let db = Db::<B>::fresh();
    let (mut a, mut b) = (db.connect(), db.connect());
    let _pushed = idempotent_jobs::run(&mut a, &PUSHER, &JobKey::new("relay-truth:1"), |conn| {
        outbox::push(conn, "relay-truth", &serde_json::json!({ "n": 1 }))?;
        Ok::<_, TestError>(())
    })
    .expect("the pushing job");
    let relay = Relay::new()
        .lease(Duration::from_millis(100))
        .max_attempts(1);
    let mut b_report = None;
    let a_report = relay
        .run_once(&mut a, |_| -> Result<(), String> {
            std::thread::sleep(Duration::from_millis(300)); // outlives its lease
            b_report = Some(
                relay
                    .clone()
                    .run_once(&mut b, |_| Ok::<_, String>(()))
                    .expect("relay B"),
            );
            Err("receiver down".into())
        })
        .expect("relay A");
    let b_report = b_report.expect("relay B ran");
    let parked = outbox::parked(&mut b).expect("the parked messages").len() as u64;
    assert_eq!(parked, 1, "the message is parked");
    assert_eq!(
        (a_report.parked, b_report.parked),
        (0, 1),
        "relay B parked it: A {a_report:?}, B {b_report:?}"
    );
    assert_eq!((a_report.lease_lost, b_report.leased), (1, 0));
}
