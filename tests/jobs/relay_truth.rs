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

/// A delivery error whose `Display` panics.
struct Unprintable;

impl std::fmt::Display for Unprintable {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        panic!("this error cannot be shown")
    }
}

/// A delivery error whose `Display` (or `Drop`) panics is the delivery's own code panicking: the
/// round goes on as for any failed delivery, the message backed off with its attempt counted and
/// the panic in its `last_error`, and the next message delivered. Before, the panic escaped
/// `run_once` from outside the delivery's `catch_unwind`: no report, and the batch stayed leased,
/// neither failed nor delivered, until its lease lapsed.
pub fn a_delivery_error_that_panics_when_shown_is_a_failed_delivery<B>()
where
    B: Backend,
    B::Conn: TestConn,
{
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    for n in 1..=2 {
        let _pushed = idempotent_jobs::run(
            &mut conn,
            &PUSHER,
            &JobKey::new(format!("relay-truth:{n}")),
            |conn| {
                outbox::push(conn, "relay-truth", &serde_json::json!({ "n": n }))?;
                Ok::<_, TestError>(())
            },
        )
        .expect("the pushing job");
    }
    let mut calls = 0;
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Relay::new()
            .backoff(Duration::from_secs(3600), Duration::from_secs(3600))
            .run_once(&mut conn, |_| {
                calls += 1;
                match calls {
                    1 => Err(Unprintable),
                    _ => Ok(()),
                }
            })
    }));
    let report = run
        .expect("the error's panic stays inside the relay run")
        .expect("the relay run");
    assert_eq!(
        (report.leased, report.failed, report.delivered),
        (2, 1, 1),
        "{report:?}"
    );
    let unsent = outbox::unsent(&mut conn, 10).expect("the unsent messages");
    assert_eq!(unsent.len(), 1, "one message backs off: {unsent:?}");
    assert_eq!(unsent[0].attempts(), 1);
    let last_error = unsent[0].last_error().unwrap_or_default();
    assert!(
        last_error.contains("this error cannot be shown"),
        "the stored error names the panic: {last_error:?}"
    );
    let counts = outbox::counts(&mut conn).expect("the outbox's counts");
    assert_eq!((counts.delivered, counts.leased), (1, 0), "{counts:?}");
}
