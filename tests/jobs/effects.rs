//! Effects beyond the database: the job key as another service's idempotency key, and the outbox,
//! against a real HTTP service on loopback, with workers and relays killed at the worst moments.
//! Written once for every sync backend (see `main.rs`).

use std::sync::Barrier;
use std::time::Duration;

use idempotent_jobs::idempotent_job;
use idempotent_jobs::outbox::{self, Relay};

use crate::backends::Backend;
use crate::figures;
use crate::handlers::{TestConn, TestError};
use crate::harness::{self, Db};
use crate::receiver::{self, Service};

/// Set in a child worker: hang after the charge request, before the commit.
const HANG_BEFORE_COMMIT: &str = "IDEMPOTENT_TEST_HANG_BEFORE_COMMIT";
const CHARGED: &str = "IDEMPOTENT-TEST: charged, now waiting to be killed before the commit";
/// Set in a child relay: hang after sending, before marking the message delivered.
const RELAY_CHILD: &str = "IDEMPOTENT_TEST_RELAY_CHILD";
const SENT: &str = "IDEMPOTENT-TEST: sent, now waiting to be killed before marking it delivered";
/// The child relay's lease: the parent's relay can take the message again once it has lapsed.
const RELAY_LEASE: Duration = Duration::from_secs(1);
const SERVICE: &str = "IDEMPOTENT_TEST_SERVICE";

/// Charges an order through the payment service, with the job's own key as the service's
/// idempotency key.
#[idempotent_job(key = "pay:<order_id>")]
fn pay<C: TestConn>(
    conn: &mut C,
    order_id: &str,
    amount: i64,
    service: &str,
) -> Result<String, TestError> {
    let key = idempotent_jobs::current_key()
        .expect("inside a job")
        .derive("charge");
    let (_, charge_id) = receiver::post(
        service,
        "/charges",
        &[("Idempotency-Key", key.as_str())],
        &format!("{{\"amount\":{amount}}}"),
    )
    .map_err(|e| TestError::Service(e.to_string()))?;
    conn.insert_charge(order_id, amount, &charge_id)?;
    if std::env::var(HANG_BEFORE_COMMIT).is_ok() {
        println!("{CHARGED}");
        harness::hold_until_killed();
    }
    Ok(charge_id)
}

/// Queues a receipt for an order through the runtime's outbox.
#[idempotent_job(key = "receipt:<order_id>", name = "send_receipt")]
pub(crate) fn send_receipt<C: TestConn>(conn: &mut C, order_id: &str) -> Result<String, TestError> {
    Ok(outbox::push(
        conn,
        "receipt",
        &serde_json::json!({ "order_id": order_id }),
    )?)
}

/// Delivers an outbox message to the service, which acts on each message id once.
pub(crate) fn deliver(service: &str, message: &outbox::OutboxMessage) -> Result<(), String> {
    match receiver::post(
        service,
        "/messages",
        &[("Message-Id", message.message_id())],
        message.payload_json(),
    ) {
        Ok((200 | 201, _)) => Ok(()),
        Ok((status, body)) => Err(format!("the service answered {status}: {body}")),
        Err(error) => Err(error.to_string()),
    }
}

fn outbox_rows<C: TestConn>(conn: &mut C) -> Vec<(String, Option<String>)> {
    conn.outbox_rows().expect("reading the outbox")
}

pub fn running_a_job_twice_leaves_one_message<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let first = send_receipt(&mut conn, "order-1").unwrap();
    let second = send_receipt(&mut conn, "order-1").unwrap();
    assert_eq!(
        first, second,
        "the replay returns the first run's message id"
    );
    assert_eq!(
        outbox_rows(&mut conn),
        [(first.clone(), Some("receipt:order-1".to_owned()))]
    );
    // An operator sees the one message waiting, until a relay delivers it.
    send_receipt(&mut conn, "order-2").unwrap();
    let unsent = outbox::unsent(&mut conn, 10).unwrap();
    let ids: Vec<&str> = unsent.iter().map(|m| m.message_id()).collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], first, "oldest first");
    assert_eq!(
        outbox::unsent(&mut conn, 1).unwrap().len(),
        1,
        "at most the limit"
    );
    assert!(
        outbox::unsent(&mut conn, 0).unwrap().is_empty(),
        "at most the limit, 0 too"
    );
    assert_eq!(B::drain_outbox(&mut conn).len(), 2);
    assert!(outbox::unsent(&mut conn, 10).unwrap().is_empty());
    let error = outbox::push(&mut conn, "receipt", &1).unwrap_err();
    assert!(
        matches!(error, idempotent_jobs::Error::OutboxOutsideJob { .. }),
        "{error}"
    );
}

/// The key a body reads is the same in every run of the job, the failed ones included.
pub fn the_key_inside_the_body_is_stable<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    static JOB: idempotent_jobs::Job = idempotent_jobs::Job::new("stable_key", "stable:<order>");
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let key = idempotent_jobs::JobKey::new("stable:order-9");
    let mut seen = Vec::new();
    for attempt in 0..3 {
        let result = idempotent_jobs::run(&mut conn, &JOB, &key, |conn| {
            let inside = idempotent_jobs::current_key().expect("inside a job");
            seen.push((inside.derive("charge"), inside.derive("refund")));
            outbox::push(conn, "charge", &attempt)?;
            if attempt == 0 {
                Err(TestError::Declined)
            } else {
                Ok(())
            }
        });
        assert_eq!(result.is_ok(), attempt > 0);
    }
    assert_eq!(
        seen.len(),
        2,
        "the third call replayed without running the body"
    );
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[0].0.as_str(), "stable:order-9/charge");
    assert!(
        idempotent_jobs::current_key().is_none(),
        "outside the body there is no current key"
    );
    let rows = outbox_rows(&mut conn);
    assert_eq!(
        rows.len(),
        1,
        "the failed run's message rolled back with it"
    );
}

/// A worker charges through the service and is killed before its commit: the rerun charges again
/// with the same idempotency key, and the service charges once.
pub fn killed_worker_charges_once<B, C>(test_path: &str)
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    if let Ok(locator) = std::env::var(HANG_BEFORE_COMMIT) {
        let service = std::env::var(SERVICE).expect("the service's address");
        let mut conn = Db::<B>::attach(&locator).connect();
        pay(&mut conn, "order-1", 4200, &service).expect("the child's job");
        unreachable!("the child hangs inside its job until killed");
    }

    let service = Service::start();
    let db = Db::<B>::fresh();
    let child = harness::spawn_child_until(
        test_path,
        &[
            (HANG_BEFORE_COMMIT, db.locator()),
            (SERVICE, &service.addr()),
        ],
        CHARGED,
    );
    harness::kill(child);

    let mut conn = db.connect();
    assert_eq!(
        conn.count_charges("order-1").unwrap(),
        0,
        "the killed worker's transaction rolled back"
    );
    let charge_id = pay(&mut conn, "order-1", 4200, &service.addr()).unwrap();
    assert_eq!(
        pay(&mut conn, "order-1", 4200, &service.addr()).unwrap(),
        charge_id
    );

    let ledger = service.ledger();
    figures::report(&format!(
        "worker kill ({}): charge requests {}, charges made {}, jobs done {}",
        B::NAME,
        ledger.charge_requests,
        ledger.charges.len(),
        conn.count_done().unwrap()
    ));
    assert_eq!(
        ledger.charge_requests, 2,
        "the killed run and the rerun both asked"
    );
    assert_eq!(ledger.charges.len(), 1, "the customer is charged once");
    assert_eq!(ledger.charges.values().next(), Some(&charge_id));
    assert_eq!(conn.count_charges("order-1").unwrap(), 1);
}

/// A relay sends a message and is killed before marking it delivered; a new relay sends it again
/// once the lease lapses, and the receiver drops the duplicate by its id.
pub fn killed_relay_delivers_once<B, C>(test_path: &str)
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    if let Ok(locator) = std::env::var(RELAY_CHILD) {
        let service = std::env::var(SERVICE).expect("the service's address");
        let mut conn = Db::<B>::attach(&locator).connect();
        let relay = Relay::new().batch_size(1).lease(RELAY_LEASE);
        relay
            .run_once(&mut conn, |message| -> Result<(), String> {
                deliver(&service, message)?;
                println!("{SENT}");
                harness::hold_until_killed();
            })
            .expect("the child relay");
        unreachable!("the child hangs inside its delivery until killed");
    }

    let service = Service::start();
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    for order in ["order-1", "order-2", "order-3"] {
        send_receipt(&mut conn, order).unwrap();
        send_receipt(&mut conn, order).unwrap();
    }
    assert_eq!(outbox_rows(&mut conn).len(), 3);

    let child = harness::spawn_child_until(
        test_path,
        &[(RELAY_CHILD, db.locator()), (SERVICE, &service.addr())],
        SENT,
    );
    // The child took its lease before it sent and printed SENT, so the lease ends before
    // `RELAY_LEASE` from now; the margin covers the clock's and the stored timestamp's precision.
    // Only then is the message the dead relay held due again; the test waits for that, no more.
    let lapsed = std::time::Instant::now() + RELAY_LEASE + Duration::from_millis(100);
    harness::kill(child);
    std::thread::sleep(lapsed.saturating_duration_since(std::time::Instant::now()));

    let report = Relay::new()
        .drain(&mut conn, |message| deliver(&service.addr(), message))
        .unwrap();
    let ledger = service.ledger();
    figures::report(&format!(
        "relay kill ({}): messages {}, deliveries {}, duplicates dropped {}, effects {}",
        B::NAME,
        outbox_rows(&mut conn).len(),
        ledger.deliveries,
        ledger.duplicates_dropped,
        ledger.messages.len()
    ));
    assert_eq!(
        report.delivered, 3,
        "the restarted relay sends all three, the first again"
    );
    assert_eq!(ledger.deliveries, 4);
    assert_eq!(ledger.duplicates_dropped, 1);
    assert_eq!(ledger.messages.len(), 3, "each message acted on once");
    let again = Relay::new()
        .drain(&mut conn, |message| deliver(&service.addr(), message))
        .unwrap();
    assert_eq!(again.leased, 0, "delivered messages are not sent again");
}

/// Two relays drain one outbox at once: no message is handed to both while both live.
pub fn two_relays_deliver_no_message_twice<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    const MESSAGES: usize = 200;
    let service = Service::start();
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    for n in 0..MESSAGES {
        send_receipt(&mut conn, &format!("order-{n}")).unwrap();
    }
    let barrier = Barrier::new(2);
    let reports: Vec<outbox::RelayReport> = std::thread::scope(|scope| {
        let relays: Vec<_> = (0..2)
            .map(|_| {
                let (db, barrier, service) = (&db, &barrier, &service);
                scope.spawn(move || {
                    let mut conn = db.connect();
                    barrier.wait();
                    Relay::new()
                        .batch_size(7)
                        .drain(&mut conn, |message| deliver(&service.addr(), message))
                        .expect("a relay")
                })
            })
            .collect();
        relays
            .into_iter()
            .map(|r| r.join().expect("relay thread"))
            .collect()
    });
    let ledger = service.ledger();
    figures::report(&format!(
        "two relays ({}): messages {MESSAGES}, deliveries {} ({} + {}), duplicates {}",
        B::NAME,
        ledger.deliveries,
        reports[0].delivered,
        reports[1].delivered,
        ledger.duplicates_dropped
    ));
    each_delivered_once(&ledger, &reports, MESSAGES);
}

/// What relays sharing one outbox of `messages` messages must have done: every message reached
/// the service once, none was handed to two relays, and no lease lapsed.
pub(crate) fn each_delivered_once(
    ledger: &receiver::Ledger,
    reports: &[outbox::RelayReport],
    messages: usize,
) {
    assert_eq!(
        ledger.messages.len(),
        messages,
        "the relays reported {reports:?}"
    );
    assert_eq!(
        ledger.deliveries, messages as u64,
        "no message was delivered twice"
    );
    assert_eq!(ledger.duplicates_dropped, 0);
    assert_eq!(
        reports.iter().map(|r| r.delivered).sum::<u64>(),
        messages as u64
    );
    assert!(reports.iter().all(|r| r.lease_lost == 0));
}

/// A delivery that keeps failing backs off, is parked after the last attempt, stays visible, and
/// goes out after a retry by hand; delivered messages can be pruned.
pub fn failing_deliveries_back_off_then_park<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let id = send_receipt(&mut conn, "order-1").unwrap();
    let relay = Relay::new()
        .max_attempts(3)
        .backoff(Duration::ZERO, Duration::ZERO);
    let mut attempts = 0;
    let report = relay
        .drain(&mut conn, |_| {
            attempts += 1;
            Err("the mail server is down")
        })
        .unwrap();
    assert_eq!((attempts, report.failed, report.parked), (3, 2, 1));
    let parked = outbox::parked(&mut conn).unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(
        (parked[0].message_id(), parked[0].attempts()),
        (id.as_str(), 3)
    );
    assert_eq!(
        relay
            .drain(&mut conn, |_| Ok::<_, String>(()))
            .unwrap()
            .leased,
        0,
        "parked stays parked"
    );

    // With a real backoff, a failed message waits.
    let slow = Relay::new().backoff(Duration::from_secs(3600), Duration::from_secs(3600));
    assert_eq!(outbox::retry_parked(&mut conn, Some(&id)).unwrap(), 1);
    assert_eq!(
        slow.drain(&mut conn, |_| Err("still down")).unwrap().failed,
        1
    );
    assert_eq!(
        slow.drain(&mut conn, |_| Ok::<_, String>(()))
            .unwrap()
            .leased,
        0,
        "backing off"
    );

    conn.batch_execute_ok("UPDATE outbox SET available_at = created_at");
    assert_eq!(
        relay
            .drain(&mut conn, |_| Ok::<_, String>(()))
            .unwrap()
            .delivered,
        1
    );
    let pruned = outbox::prune_delivered(
        &mut conn,
        Duration::ZERO,
        &idempotent_jobs::Prune::default(),
    );
    assert_eq!(pruned.unwrap().removed, 1);
    assert!(outbox_rows(&mut conn).is_empty());
}

/// `SimpleConnection::batch_execute` that must succeed.
trait ExecuteOk {
    fn batch_execute_ok(&mut self, sql: &str);
}

impl<C: diesel::connection::SimpleConnection> ExecuteOk for C {
    fn batch_execute_ok(&mut self, sql: &str) {
        self.batch_execute(sql)
            .unwrap_or_else(|e| panic!("`{sql}`: {e}"));
    }
}

/// Durations too long for any timestamp arithmetic are clear errors, not panics or overflows.
pub fn overlong_durations_are_errors<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    send_receipt(&mut conn, "order-1").unwrap();
    let leased = Relay::new()
        .lease(Duration::MAX)
        .run_once(&mut conn, |_| Ok::<_, String>(()));
    assert!(
        matches!(leased, Err(idempotent_jobs::Error::InvalidDuration { .. })),
        "{leased:?}"
    );
    let pruned =
        outbox::prune_delivered(&mut conn, Duration::MAX, &idempotent_jobs::Prune::default());
    assert!(
        matches!(pruned, Err(idempotent_jobs::Error::InvalidDuration { .. })),
        "{pruned:?}"
    );
    assert_eq!(
        outbox_rows(&mut conn).len(),
        1,
        "the message is still there, unleased"
    );
    // A first backoff too long for the database is refused before anything is leased; before,
    // the delivery ran, and its failure was never recorded (the message stayed leased with its
    // attempt counted, and every round after it failed the same way).
    let refused = Relay::new()
        .backoff(Duration::MAX, Duration::MAX)
        .run_once(&mut conn, |_| Err::<(), _>("down".to_owned()));
    assert!(
        matches!(refused, Err(idempotent_jobs::Error::InvalidDuration { .. })),
        "{refused:?}"
    );
    let counts = outbox::counts(&mut conn).expect("counts");
    assert_eq!((counts.pending, counts.leased), (1, 0), "nothing leased");
    // "No longest delay" (`Duration::MAX`): a backoff that has doubled past what the database can
    // add to its clock is the longest it can, and the failure is recorded.
    B::execute(&mut conn, "UPDATE outbox SET attempts = 20");
    let failed = Relay::new()
        .backoff(Duration::from_secs(3600), Duration::MAX)
        .max_attempts(30)
        .run_once(&mut conn, |_| Err::<(), _>("down".to_owned()));
    assert!(
        matches!(&failed, Ok(report) if report.failed == 1),
        "the 21st failure, backing off 3600 s * 2^20, is recorded: {failed:?}"
    );
    let counts = outbox::counts(&mut conn).expect("counts");
    assert_eq!(
        (counts.pending, counts.leased),
        (1, 0),
        "the message waits for its retry, not leased"
    );
    B::execute(
        &mut conn,
        "UPDATE outbox SET attempts = 0, available_at = created_at",
    );
    let delivered = Relay::new()
        .drain(&mut conn, |_| Ok::<_, String>(()))
        .unwrap();
    assert_eq!(delivered.delivered, 1, "and goes out with a sane lease");
}
