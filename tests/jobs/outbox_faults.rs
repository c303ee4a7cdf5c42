//! The outbox never loses, repeats or blocks a message: ids unique per run, poison messages that
//! kill or panic the relay, storable error texts, relays that keep their own leases, redaction,
//! counts and events. Written once for every sync connection type (see `main.rs`); the relay's
//! code is shared with the async one.

use std::time::Duration;

use idempotent_jobs::outbox::{self, OutboxMessage, Relay};
use idempotent_jobs::{Error, Job, JobKey};

use crate::backends::Backend;
use crate::effects::{deliver, send_receipt};
use crate::figures;
use crate::handlers::{TestConn, TestError};
use crate::harness::{self, Db};
use crate::receiver::Service;
use crate::signals;

fn order_of(message: &OutboxMessage) -> String {
    let payload: serde_json::Value = message.payload().expect("JSON");
    payload["order_id"].as_str().unwrap_or_default().to_owned()
}

/// A digest email that may go again a second after the last one, through the outbox.
#[idempotent_jobs::idempotent_job(
    key = "digest-email:<user_id>",
    keep = "1s",
    name = "digest_email"
)]
fn digest_email<C: TestConn>(conn: &mut C, user_id: i64) -> Result<String, TestError> {
    Ok(outbox::push(conn, "digest", &user_id)?)
}

/// A job whose key holds personal data.
#[idempotent_jobs::idempotent_job(key = "welcome-mail:<email>", redact_key, name = "welcome_mail")]
fn welcome_mail<C: TestConn>(conn: &mut C, email: &str) -> Result<String, TestError> {
    Ok(outbox::push(
        conn,
        "welcome",
        &serde_json::json!({ "to": email }),
    )?)
}

/// A job that runs again after its key lapsed gets new message ids, also after the old messages
/// were delivered and pruned: a receiver that drops duplicates by id never drops a real message,
/// and no run fails on the old run's id.
pub fn message_ids_are_unique_per_run<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let first = digest_email(&mut conn, 7).expect("the first run");
    assert_eq!(
        digest_email(&mut conn, 7).expect("a redelivery"),
        first,
        "a redelivery of the same run replays its id"
    );
    std::thread::sleep(Duration::from_millis(1_100));
    let second = digest_email(&mut conn, 7).expect("the run after the key lapsed");
    assert_ne!(second, first);
    let delivered = Relay::new()
        .drain(&mut conn, |_| Ok::<_, String>(()))
        .expect("a relay");
    assert_eq!(delivered.delivered, 2);
    outbox::prune_delivered(
        &mut conn,
        Duration::ZERO,
        &idempotent_jobs::Prune::default(),
    )
    .expect("pruning");
    std::thread::sleep(Duration::from_millis(1_100));
    let third = digest_email(&mut conn, 7).expect("the run after pruning");
    assert!(
        third != first && third != second,
        "{first} {second} {third}"
    );
}

/// Two raw keys with one readable form (`a\0b` shows as `a%00b`) get their own message ids.
pub fn raw_keys_sharing_a_readable_form_get_their_own_ids<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    static RAW: Job = Job::new("raw_keys", "raw:<value>");
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let mut ids = Vec::new();
    for key in ["raw:a\0b", "raw:a%00b"] {
        let id = idempotent_jobs::run(&mut conn, &RAW, &JobKey::new(key), |conn| {
            Ok::<_, TestError>(outbox::push(conn, "raw", &1)?)
        })
        .expect("each key's job")
        .into_inner();
        ids.push(id);
    }
    assert_ne!(ids[0], ids[1]);
    assert_eq!(conn.outbox_rows().expect("the outbox").len(), 2);
}

/// A message pushed inside a job's body but on another connection would commit on its own: it is
/// refused, and nothing is left behind when the job fails because of it.
pub fn push_on_another_connection_is_refused<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    static ELSEWHERE: Job = Job::new("push_elsewhere", "elsewhere:<n>");
    let db = Db::<B>::fresh();
    let (mut conn, mut other) = (db.connect(), db.connect());
    let result = idempotent_jobs::run(&mut conn, &ELSEWHERE, &JobKey::new("elsewhere:1"), |_| {
        Ok::<_, TestError>(outbox::push(&mut other, "elsewhere", &1)?)
    });
    assert!(
        matches!(
            result,
            Err(TestError::Idempotent(
                Error::OutboxOnAnotherConnection { .. }
            ))
        ),
        "{result:?}"
    );
    assert!(conn.outbox_rows().expect("the outbox").is_empty());
    assert_eq!(conn.count_done().expect("done jobs"), 0);
}

const POISON_CHILD: &str = "IDEMPOTENT_TEST_POISON_RELAY";
const SERVICE: &str = "IDEMPOTENT_TEST_SERVICE";
const RELAY_SAYS: &str = "IDEMPOTENT-TEST-RELAY:";
const LEASE: Duration = Duration::from_millis(800);
const MAX_ATTEMPTS: u32 = 3;

/// A message whose delivery kills the relay's process, again and again: each attempt is counted
/// when the message is leased, so after `max_attempts` it is parked, and every other message of
/// its batch is delivered exactly once.
pub fn a_message_that_kills_the_relay_is_parked<B, C>(test_path: &str)
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    if let Ok(locator) = std::env::var(POISON_CHILD) {
        let service = std::env::var(SERVICE).expect("the service's address");
        let mut conn = Db::<B>::attach(&locator).connect();
        let report = Relay::new()
            .batch_size(10)
            .lease(LEASE)
            .max_attempts(MAX_ATTEMPTS)
            .drain(&mut conn, |message| -> Result<(), String> {
                if order_of(message) == "order-2" {
                    println!("{RELAY_SAYS} poison");
                    harness::hold_until_killed();
                }
                deliver(&service, message)
            })
            .expect("the child relay");
        println!("{RELAY_SAYS} done {}", report.delivered);
        return;
    }

    let service = Service::start();
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    for order in 1..=6 {
        send_receipt(&mut conn, &format!("order-{order}")).expect("a receipt");
    }
    let mut kills = 0;
    let finished = loop {
        assert!(
            kills <= 2 * MAX_ATTEMPTS,
            "the relay was killed {kills} times and the poison message is still not parked"
        );
        let (child, line) = harness::spawn_child_until_line(
            test_path,
            &[(POISON_CHILD, db.locator()), (SERVICE, &service.addr())],
            RELAY_SAYS,
        );
        if line.contains("done") {
            harness::finish(child);
            break line;
        }
        let lapsed = std::time::Instant::now() + LEASE + Duration::from_millis(150);
        harness::kill(child);
        kills += 1;
        std::thread::sleep(lapsed.saturating_duration_since(std::time::Instant::now()));
    };
    let ledger = service.ledger();
    let parked = outbox::parked(&mut conn).expect("parked messages");
    figures::report(&format!(
        "poison message ({}): relay killed {kills} times in the poison's delivery, then: parked {}, other messages delivered {} ({} deliveries, {} duplicates dropped); {finished}",
        B::NAME,
        parked.len(),
        ledger.messages.len(),
        ledger.deliveries,
        ledger.duplicates_dropped,
    ));
    assert_eq!(kills, MAX_ATTEMPTS, "one kill per allowed attempt");
    assert_eq!(parked.len(), 1);
    assert_eq!(order_of(&parked[0]), "order-2");
    assert_eq!(parked[0].attempts(), MAX_ATTEMPTS);
    assert!(
        parked[0]
            .last_error()
            .is_some_and(|e| e.contains("stopped")),
        "{:?}",
        parked[0].last_error()
    );
    assert_eq!(ledger.messages.len(), 5, "every other message acted on");
    assert!(
        ledger.messages.values().all(|n| *n == 1),
        "each delivered exactly once: {:?}",
        ledger.messages
    );
}

/// A database of the test's own with three receipts pushed (order-1 to order-3), and a connection.
fn three_receipts<B, C>() -> (Db<B>, C)
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    for order in 1..=3 {
        send_receipt(&mut conn, &format!("order-{order}")).expect("a receipt");
    }
    (db, conn)
}

/// Triggers that refuse the mark of message 1 as delivered: `(install, remove)`.
fn refuse_mark(
    server: crate::harness::Server,
) -> (&'static [&'static str], &'static [&'static str]) {
    use crate::harness::Server;

    match server {
        Server::Sqlite => (
            &[
                "CREATE TRIGGER refuse_mark BEFORE UPDATE OF delivered_at ON outbox \
               WHEN NEW.delivered_at IS NOT NULL AND OLD.id = 1 \
               BEGIN SELECT RAISE(ABORT, 'the trigger refuses this mark'); END",
            ],
            &["DROP TRIGGER refuse_mark"],
        ),
        Server::Postgres => (
            &[
                "CREATE FUNCTION refuse_mark() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'the trigger refuses this mark'; END $$",
                "CREATE TRIGGER refuse_mark BEFORE UPDATE ON outbox FOR EACH ROW \
                 WHEN (NEW.delivered_at IS NOT NULL AND OLD.id = 1) EXECUTE FUNCTION refuse_mark()",
            ],
            &[
                "DROP TRIGGER refuse_mark ON outbox",
                "DROP FUNCTION refuse_mark()",
            ],
        ),
        Server::Mysql => (
            &[
                "CREATE TRIGGER refuse_mark BEFORE UPDATE ON outbox FOR EACH ROW \
               BEGIN IF NEW.delivered_at IS NOT NULL AND OLD.id = 1 THEN \
               SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the trigger refuses this mark'; \
               END IF; END",
            ],
            &["DROP TRIGGER refuse_mark"],
        ),
    }
}

/// Triggers that refuse to give an attempt back (the release of an untried message):
/// `(install, remove)`.
fn refuse_release(
    server: crate::harness::Server,
) -> (&'static [&'static str], &'static [&'static str]) {
    use crate::harness::Server;

    match server {
        Server::Sqlite => (
            &[
                "CREATE TRIGGER refuse_release BEFORE UPDATE OF attempts ON outbox \
               WHEN NEW.attempts < OLD.attempts \
               BEGIN SELECT RAISE(ABORT, 'the trigger refuses this release'); END",
            ],
            &["DROP TRIGGER refuse_release"],
        ),
        Server::Postgres => (
            &[
                "CREATE FUNCTION refuse_release() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'the trigger refuses this release'; END $$",
                "CREATE TRIGGER refuse_release BEFORE UPDATE ON outbox FOR EACH ROW \
                 WHEN (NEW.attempts < OLD.attempts) EXECUTE FUNCTION refuse_release()",
            ],
            &[
                "DROP TRIGGER refuse_release ON outbox",
                "DROP FUNCTION refuse_release()",
            ],
        ),
        // MySQL has one BEFORE UPDATE trigger per table here: the mark's, extended.
        Server::Mysql => (
            &[
                "DROP TRIGGER refuse_mark",
                "CREATE TRIGGER refuse_mark BEFORE UPDATE ON outbox FOR EACH ROW \
               BEGIN IF NEW.delivered_at IS NOT NULL AND OLD.id = 1 THEN \
               SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the trigger refuses this mark'; \
               END IF; IF NEW.attempts < OLD.attempts THEN \
               SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the trigger refuses this release'; \
               END IF; END",
            ],
            &[],
        ),
    }
}

/// A relay round leases a batch (each message's attempt counted at the lease) and marks each
/// delivery as it goes. When a mark fails (a trigger here; a lock wait, a busy database), the
/// round stops with the error, and the messages after it had their attempt counted but were never
/// handed to the delivery: before, they stayed leased until the lease lapsed, and a message at its
/// last attempt was then parked "the relay stopped during the last allowed delivery attempt", an
/// attempt that never happened. The round now releases them, their attempt uncounted, and the
/// next round delivers them.
pub fn a_mark_that_fails_leaves_the_untried_messages_untried<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let (_db, mut conn) = three_receipts::<B, C>();
    let (install, remove) = refuse_mark(B::SERVER);
    for sql in install {
        B::execute(&mut conn, sql);
    }
    let relay = Relay::new()
        .max_attempts(1)
        .lease(Duration::from_secs(1))
        .backoff(Duration::ZERO, Duration::ZERO);
    let mut delivered = Vec::new();
    let first = relay.run_once(&mut conn, |message| -> Result<(), String> {
        delivered.push(order_of(message));
        Ok(())
    });
    assert!(first.is_err(), "the mark of order-1 fails: {first:?}");
    assert_eq!(delivered, ["order-1"], "the round stops at the failed mark");
    for sql in remove {
        B::execute(&mut conn, sql);
    }
    // order-1's lease lapses (it was delivered; its mark failed, so it is not known to be).
    std::thread::sleep(Duration::from_millis(1_200));
    let mut later = Vec::new();
    relay
        .drain(&mut conn, |message| -> Result<(), String> {
            later.push(order_of(message));
            Ok(())
        })
        .expect("the next rounds");
    let parked: Vec<String> = outbox::parked(&mut conn)
        .expect("parked")
        .iter()
        .map(|m| format!("{} ({:?})", order_of(m), m.last_error()))
        .collect();
    assert!(
        later.contains(&"order-2".to_owned()) && later.contains(&"order-3".to_owned()),
        "order-2 and order-3 were never tried; the next rounds delivered {later:?}, and parked {parked:?}"
    );
    // order-1, at its last attempt, is parked: its reason must not say the relay stopped (it
    // delivered it, and could not record so), but that it may have been delivered.
    assert!(
        parked.len() == 1
            && parked[0].starts_with("order-1")
            && parked[0].contains("may have been delivered")
            // The reason, shared with messages a dead relay never reached, says that too.
            && parked[0].contains("not tried at all"),
        "parked: {parked:?}"
    );
}

/// A lease parks the messages whose lease lapsed at their last allowed attempt, then takes one
/// whose lease lapsed: two statements, each reading the clock. A lease at its last attempt that
/// lapsed between them was taken again, an attempt past `max_attempts`. Here the park is made
/// slow (a trigger on the row it parks sleeps 1.2 s) and message 1's lease lapses during it,
/// at its last attempt (`max_attempts(1)`). Before: the round delivered order-1 a second time,
/// its attempts 2. Now it is not taken; the next round parks it.
pub fn a_message_at_its_last_attempt_is_never_taken_again<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn + 'static,
{
    let (_db, mut conn) = three_receipts::<B, C>();
    slow_park::<B, C>(&mut conn);
    let (dead, lapse_soon) = match B::SERVER {
        harness::Server::Sqlite => (
            "'2000-01-01 00:00:00.000'",
            "strftime('%Y-%m-%d %H:%M:%f', 'now', '+0.4 seconds')",
        ),
        harness::Server::Postgres => (
            "TIMESTAMP '2000-01-01 00:00:00'",
            "(clock_timestamp() AT TIME ZONE 'UTC') + INTERVAL '400 milliseconds'",
        ),
        harness::Server::Mysql => (
            "TIMESTAMP '2000-01-01 00:00:00'",
            "TIMESTAMPADD(MICROSECOND, 400000, UTC_TIMESTAMP(6))",
        ),
    };
    // Message 2: its relay died at its last attempt long ago (the park's row). Message 1: at its
    // last attempt, its lease lapsing during the park.
    B::execute(
        &mut conn,
        &format!(
            "UPDATE outbox SET lease_owner = 'dead-relay', attempts = 1, lease_until = {dead} WHERE id = 2"
        ),
    );
    B::execute(
        &mut conn,
        &format!(
            "UPDATE outbox SET lease_owner = 'dead-relay', attempts = 1, lease_until = {lapse_soon} WHERE id = 1"
        ),
    );
    let relay = Relay::new()
        .batch_size(3)
        .max_attempts(1)
        .lease(Duration::from_secs(60));
    let mut delivered = Vec::new();
    let report = relay
        .run_once(&mut conn, |message| -> Result<(), String> {
            delivered.push((order_of(message), message.attempts()));
            Ok(())
        })
        .expect("a round");
    assert_eq!(
        report.parked, 1,
        "the park (message 2) began before message 1's lease lapsed: {report:?}"
    );
    assert!(
        delivered.iter().all(|(order, _)| order != "order-1"),
        "order-1, at its last attempt, was taken again: {delivered:?}"
    );
    assert_eq!(delivered, [("order-3".to_owned(), 1)], "{report:?}");
    relay
        .run_once(&mut conn, |message| -> Result<(), String> {
            panic!("nothing is left to deliver: {}", order_of(message))
        })
        .expect("the next round");
    let mut parked: Vec<(String, u32)> = outbox::parked(&mut conn)
        .expect("parked")
        .iter()
        .map(|m| (order_of(m), m.attempts()))
        .collect();
    parked.sort();
    assert_eq!(
        parked,
        [("order-1".to_owned(), 1), ("order-2".to_owned(), 1)],
        "both parked at their one attempt"
    );
}

/// A park that takes 1.2 s: a trigger on the row it parks sleeps (on SQLite through a function
/// registered on this connection).
fn slow_park<B, C>(conn: &mut C)
where
    B: Backend<Conn = C>,
    C: TestConn + 'static,
{
    match B::SERVER {
        harness::Server::Sqlite => {
            #[cfg(feature = "sqlite")]
            {
                #[diesel::declare_sql_function]
                extern "SQL" {
                    fn sleep_ms(ms: diesel::sql_types::Integer) -> diesel::sql_types::Integer;
                }
                let sqlite = (conn as &mut dyn std::any::Any)
                    .downcast_mut::<diesel::SqliteConnection>()
                    .expect("the SQLite backend's connection");
                sleep_ms_utils::register_impl(sqlite, |ms: i32| {
                    std::thread::sleep(Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
                    ms
                })
                .expect("register sleep_ms");
            }
            B::execute(
                conn,
                "CREATE TRIGGER slow_park AFTER UPDATE OF parked_at ON outbox \
                 WHEN NEW.parked_at IS NOT NULL AND OLD.parked_at IS NULL \
                 BEGIN SELECT sleep_ms(1200); END",
            );
        }
        harness::Server::Postgres => {
            B::execute(
                conn,
                "CREATE FUNCTION slow_park() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN PERFORM pg_sleep(1.2); RETURN NEW; END $$",
            );
            B::execute(
                conn,
                "CREATE TRIGGER slow_park BEFORE UPDATE ON outbox FOR EACH ROW \
                 WHEN (NEW.parked_at IS NOT NULL AND OLD.parked_at IS NULL) \
                 EXECUTE FUNCTION slow_park()",
            );
        }
        harness::Server::Mysql => B::execute(
            conn,
            "CREATE TRIGGER slow_park BEFORE UPDATE ON outbox FOR EACH ROW \
             BEGIN IF NEW.parked_at IS NOT NULL AND OLD.parked_at IS NULL THEN \
             DO SLEEP(1.2); END IF; END",
        ),
    }
}

/// The triggers of [`refuse_mark`], for message `id`: `(install, remove)`.
fn refuse_mark_of(server: crate::harness::Server, id: i64) -> (Vec<String>, Vec<String>) {
    let (install, remove) = refuse_mark(server);
    let install = install
        .iter()
        .map(|sql| sql.replace("OLD.id = 1", &format!("OLD.id = {id}")))
        .collect();
    (
        install,
        remove.iter().map(|sql| (*sql).to_owned()).collect(),
    )
}

/// A relay run that stops part-way says what it did, and that is what the database holds. Here
/// the mark of the second message fails (a trigger; a lock wait or a lost connection in life):
/// the run had delivered and recorded the first, and delivered the second without recording it.
/// Before, `run_once` and `drain` returned the mark's `Outbox` error alone, "the statement
/// changed nothing": the delivery recorded before it and the one the database does not know of
/// were in a WARN only. Now the error is `RelayStopped`, with the run's counts (those of its
/// earlier batches too) and the message delivered twice to come.
pub fn a_relay_that_stops_says_what_it_did<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    for (batch, attempts) in [(3, 10), (1, 10), (3, 1)] {
        let (_db, mut conn) = three_receipts::<B, C>();
        let (install, remove) = refuse_mark_of(B::SERVER, 2);
        for sql in &install {
            B::execute(&mut conn, sql);
        }
        let relay = Relay::new()
            .batch_size(batch)
            .max_attempts(attempts)
            .lease(Duration::from_secs(60));
        let mut handed = Vec::new();
        let stopped = if batch == 1 {
            relay.drain(&mut conn, |message| -> Result<(), String> {
                handed.push(message.message_id().to_owned());
                Ok(())
            })
        } else {
            relay.run_once(&mut conn, |message| -> Result<(), String> {
                handed.push(message.message_id().to_owned());
                Ok(())
            })
        };
        for sql in &remove {
            B::execute(&mut conn, sql);
        }
        let counts = outbox::counts(&mut conn).expect("counts");
        let error = stopped.expect_err("the mark of the second message fails");
        let text = error.to_string();
        let Error::RelayStopped {
            report,
            message_id,
            delivered,
            last_attempt,
            ..
        } = &error
        else {
            panic!("batch {batch}: the run's own error, with what it did: {error:?}");
        };
        assert_eq!(handed.len(), 2, "batch {batch}: handed over {handed:?}");
        assert_eq!(
            (report.delivered, counts.delivered),
            (1, 1),
            "batch {batch}: one delivery recorded, and reported: {report:?}, {counts:?}"
        );
        assert_eq!(
            report.leased,
            if batch == 1 { 2 } else { 3 },
            "batch {batch}: {report:?}"
        );
        assert_eq!(message_id.as_deref(), Some(handed[1].as_str()));
        assert!(*delivered, "the second message reached its receiver");
        assert_eq!(*last_attempt, attempts == 1);
        let then = if attempts == 1 {
            "it is parked as one that may have been delivered"
        } else {
            "it is sent again"
        };
        assert!(
            text.contains(&handed[1])
                && text.contains(then)
                && text.contains("the database does not hold it")
                && text.contains("1 delivered"),
            "batch {batch}: {text}"
        );
        assert_eq!(
            counts.leased, 1,
            "batch {batch}: the second message stays leased until its lease lapses (the third, untried, is given back): {counts:?}"
        );
    }
}

/// When the release of the untried messages fails too (the connection that failed the mark
/// usually fails it), the round's WARN must not say they were released: they stay leased, their
/// attempt counted, until the lease lapses. Before, it said "the messages it had not tried are
/// released" whatever became of the release.
pub fn a_release_that_fails_is_not_reported_done<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let (_db, mut conn) = three_receipts::<B, C>();
    let (install, remove) = refuse_mark(B::SERVER);
    let (also, _) = refuse_release(B::SERVER);
    for sql in install.iter().chain(also) {
        B::execute(&mut conn, sql);
    }
    let relay = Relay::new().max_attempts(1).lease(Duration::from_secs(60));
    let (first, events) =
        crate::capture::events(|| relay.run_once(&mut conn, |_| Ok::<_, String>(())));
    assert!(first.is_err(), "the mark of order-1 fails: {first:?}");
    let (_, remove_release) = refuse_release(B::SERVER);
    for sql in remove_release.iter().chain(remove) {
        B::execute(&mut conn, sql);
    }
    let counts = outbox::counts(&mut conn).expect("counts");
    assert_eq!(
        counts.leased, 3,
        "order-1, and the two untried, still leased"
    );
    let said: Vec<&String> = events.iter().filter_map(|e| e.get("message")).collect();
    assert!(
        !said.iter().any(|m| m.contains("are released")),
        "an event says the untried messages were released; they are leased: {said:?}"
    );
}

/// A delivery that panics counts as a failed attempt; the rest of the batch goes on, and the relay
/// does not unwind.
pub fn a_panicking_delivery_fails_alone<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let (_db, mut conn) = three_receipts::<B, C>();
    let mut delivered = Vec::new();
    let report = Relay::new()
        .max_attempts(2)
        .backoff(Duration::ZERO, Duration::ZERO)
        .drain(&mut conn, |message| -> Result<(), String> {
            let order = order_of(message);
            assert_ne!(order, "order-2", "the delivery of order-2 exploded");
            delivered.push(order);
            Ok(())
        })
        .expect("the relay survives its delivery's panic");
    assert_eq!(delivered, ["order-1", "order-3"]);
    assert_eq!((report.delivered, report.failed, report.parked), (2, 1, 1));
    let parked = outbox::parked(&mut conn).expect("parked");
    assert_eq!(parked.len(), 1);
    assert!(
        parked[0]
            .last_error()
            .is_some_and(|e| e.contains("panicked")),
        "{:?}",
        parked[0].last_error()
    );
}

/// A relay takes the messages that became due first, on every database: a message whose delivery
/// failed waits out its backoff behind the messages pushed meanwhile. (PostgreSQL and MySQL took
/// them in id order, the failed one first.)
pub fn a_relay_takes_messages_in_the_order_they_became_due<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let (_db, mut conn) = three_receipts::<B, C>();
    let backoff = Duration::from_millis(300);
    let relay = Relay::new()
        .batch_size(1)
        .backoff(backoff, backoff)
        .lease(Duration::from_secs(60));
    let first = relay
        .run_once(&mut conn, |message| -> Result<(), String> {
            assert_eq!(
                order_of(message),
                "order-1",
                "the first message pushed goes first"
            );
            Err("the receiver is down".to_owned())
        })
        .expect("a round");
    assert_eq!((first.leased, first.failed), (1, 1), "{first:?}");
    send_receipt(&mut conn, "order-4").expect("a receipt pushed during order-1's backoff");
    std::thread::sleep(backoff + Duration::from_millis(200));
    let mut delivered = Vec::new();
    let report = relay
        .drain(&mut conn, |message| -> Result<(), String> {
            delivered.push(order_of(message));
            Ok(())
        })
        .expect("the relay drains the outbox");
    assert_eq!(report.delivered, 4, "{report:?}");
    assert_eq!(
        delivered,
        ["order-2", "order-3", "order-4", "order-1"],
        "in the order the messages became due: order-1 at the end of its backoff"
    );
}

/// A delivery error with a NUL byte (which PostgreSQL text cannot hold) and one of megabytes are
/// stored sanitized and bounded; the relay goes on.
pub fn delivery_errors_are_stored_sanitized<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    send_receipt(&mut conn, "order-1").expect("a receipt");
    send_receipt(&mut conn, "order-2").expect("a receipt");
    let report = Relay::new()
        .max_attempts(1)
        .drain(&mut conn, |message| match order_of(message).as_str() {
            "order-1" => Err(format!("bad\0byte {}", "x".repeat(1 << 20))),
            _ => Ok(()),
        })
        .expect("the relay goes on");
    assert_eq!((report.delivered, report.parked), (1, 1));
    let parked = outbox::parked(&mut conn).expect("parked");
    let error = parked[0].last_error().expect("the stored error");
    assert!(error.starts_with("bad\u{fffd}byte"), "{}", &error[..20]);
    assert!(error.chars().count() <= 2_001);
}

/// `relay` runs a round on a connection of its own; while its delivery waits, its lease lapses
/// and `copy` runs a round on `conn`, whose deliveries return `copy_delivers`; then the first
/// delivery returns `first_delivers`. The events of the first round, and both reports.
fn while_a_delivery_outlives_its_lease<B, C>(
    db: &Db<B>,
    conn: &mut C,
    (relay, first_delivers): (&Relay, Result<(), String>),
    (copy, copy_delivers): (&Relay, Result<(), String>),
) -> (
    outbox::RelayReport,
    Vec<crate::capture::Fields>,
    outbox::RelayReport,
)
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let name = harness::unique_name("relay-lapse");
    let delivering = signals::expect(&format!("{name}-delivering"));
    let copy_done = signals::expect(&format!("{name}-copy-done"));
    std::thread::scope(|scope| {
        let name = &name;
        let first = scope.spawn(move || {
            let mut conn = db.connect();
            crate::capture::events(|| {
                relay
                    .run_once(&mut conn, |_| {
                        signals::notify(&format!("{name}-delivering"));
                        copy_done.wait("the copy's round");
                        first_delivers.clone()
                    })
                    .expect("the first copy")
            })
        });
        delivering.wait("the first copy delivering");
        std::thread::sleep(Duration::from_millis(450));
        let second = copy
            .run_once(conn, |_| copy_delivers.clone())
            .expect("the second copy");
        signals::notify(&format!("{name}-copy-done"));
        let (first, events) = first.join().expect("the first copy");
        (first, events, second)
    })
}

/// Copies of one relay never take each other's leases for their own: when a copy's lease lapsed and
/// another copy delivered the message, the first copy reports the lease as lost.
pub fn relay_copies_keep_their_own_leases<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    send_receipt(&mut conn, "order-1").expect("a receipt");
    let relay = Relay::new().lease(Duration::from_millis(300));
    let copy = relay.clone();
    assert_ne!(relay.owner(), copy.owner());
    let (first, _, second) =
        while_a_delivery_outlives_its_lease(&db, &mut conn, (&relay, Ok(())), (&copy, Ok(())));
    assert_eq!(second.delivered, 1, "the copy took the lapsed lease");
    assert_eq!(
        (first.delivered, first.lease_lost),
        (0, 1),
        "the first copy knows it lost its lease"
    );
}

/// A delivery that succeeds after its lease lapsed and the message was given up on: another relay
/// parked it ("it may have been delivered"), or its next delivery failed and it waits for a retry.
/// Nobody holds it, and it did reach its receiver: the mark records it delivered. Before, the mark
/// found its lease gone and recorded nothing: the round said `lease_lost` ("may reach its receiver
/// twice") and the message stayed parked for an operator to look at (or was sent again), though
/// it had been delivered.
pub fn a_delivery_that_outlived_its_lease_is_recorded_when_nobody_holds_it<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    for copy_attempts in [1, 5] {
        let db = Db::<B>::fresh();
        let mut conn = db.connect();
        send_receipt(&mut conn, "order-1").expect("a receipt");
        let relay = Relay::new()
            .lease(Duration::from_millis(300))
            .max_attempts(1);
        // With 1 allowed attempt the copy parks the lapsed message; with 5 it takes it, and its
        // delivery fails (the message then waits for its backoff, held by nobody).
        let copy = Relay::new()
            .lease(Duration::from_millis(300))
            .max_attempts(copy_attempts)
            .backoff(Duration::from_secs(60), Duration::from_secs(60));
        let (first, _, second) = while_a_delivery_outlives_its_lease(
            &db,
            &mut conn,
            (&relay, Ok(())),
            (&copy, Err("the receiver is down".to_owned())),
        );
        let counts = outbox::counts(&mut conn).expect("counts");
        assert_eq!(
            (second.leased, second.failed),
            if copy_attempts == 1 { (0, 0) } else { (1, 1) },
            "copy with {copy_attempts} attempts: {second:?}"
        );
        assert_eq!(
            (first.delivered, first.lease_lost),
            (1, 0),
            "copy with {copy_attempts} attempts: the delivery is recorded: {first:?}"
        );
        assert_eq!(
            (counts.delivered, counts.parked, counts.pending),
            (1, 0, 0),
            "copy with {copy_attempts} attempts: the database holds the message delivered: {counts:?}"
        );
    }
}

/// The same race with a delivery that fails: the first copy's lease lapses while it delivers, the
/// copy takes the message and delivers it, then the first copy's delivery fails. Its mark finds
/// the lease gone and records nothing; before, the round counted the failure anyway (at its last
/// attempt, `parked`, with a WARN "outbox message parked" and the metric), though the message was
/// delivered and parked nowhere.
pub fn a_failed_delivery_that_lost_its_lease_is_reported_lost<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    send_receipt(&mut conn, "order-1").expect("a receipt");
    let relay = Relay::new()
        .lease(Duration::from_millis(300))
        .max_attempts(1);
    let copy = Relay::new()
        .lease(Duration::from_millis(300))
        .max_attempts(5);
    let (first, events, second) = while_a_delivery_outlives_its_lease(
        &db,
        &mut conn,
        (&relay, Err("the receiver timed out".to_owned())),
        (&copy, Ok(())),
    );
    assert_eq!(second.delivered, 1, "the copy took the lapsed lease");
    assert_eq!(
        (first.failed, first.parked, first.lease_lost),
        (0, 0, 1),
        "the first copy's failure recorded nothing: {first:?}"
    );
    assert!(
        outbox::parked(&mut conn).expect("parked").is_empty(),
        "nothing is parked"
    );
    assert_eq!(outbox::counts(&mut conn).expect("counts").delivered, 1);
    assert!(
        !events
            .iter()
            .any(|e| e.get("message").is_some_and(|m| m.contains("parked"))),
        "no event says the message was parked: {events:?}"
    );
}

/// The key of the job [`while_a_job_holds_a_push`] runs.
const PUSHED_KEY: &str = "pushing:1";

/// Runs `while_held` while a job (key [`PUSHED_KEY`]) holds its claim and the message it pushed
/// for `order_id`, neither committed; the job commits once `while_held` has returned.
fn while_a_job_holds_a_push<B, C, T>(
    db: &Db<B>,
    order_id: &str,
    while_held: impl FnOnce() -> T,
) -> T
where
    B: Backend<Conn = C>,
    C: TestConn + Send,
{
    static PUSHING: Job = Job::new("pushing", "pushing:<n>");
    let (pushed, holds) = std::sync::mpsc::channel();
    let (finish, finishing) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let job = scope.spawn(move || {
            let mut conn = db.connect();
            idempotent_jobs::run(&mut conn, &PUSHING, &JobKey::new(PUSHED_KEY), |conn| {
                outbox::push(
                    conn,
                    "receipt",
                    &serde_json::json!({ "order_id": order_id }),
                )?;
                let _ = pushed.send(());
                let _ = finishing.recv_timeout(Duration::from_secs(120));
                Ok::<_, Error>(())
            })
            .expect("the pushing job")
        });
        holds
            .recv_timeout(Duration::from_secs(60))
            .expect("the job pushed");
        let seen = while_held();
        finish.send(()).expect("finishing the job");
        assert!(
            job.join().expect("the job's thread").is_ran(),
            "the job ran"
        );
        seen
    })
}

/// A job that has pushed a message and is still running holds that row uncommitted; a relay's
/// lease must pass it by (`SKIP LOCKED`) and deliver the rest. Before, on MySQL and MariaDB the
/// lease's first statement (parking messages abandoned at their last attempt) was a plain `UPDATE`
/// that scanned the outbox and waited for the job's row: every relay stood still for as long as
/// any job that pushed ran, then failed with a lock wait timeout (and its locks held other
/// relays' marks). Not SQLite: a job holding its one write lock holds every writer.
///
/// Also when the relay's session is SERIALIZABLE, where MySQL's plain reads take shared locks:
/// the lease reads at an isolation of its own.
pub fn a_relay_never_waits_for_a_job_that_pushed<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn + Send,
{
    let serializable = match B::SERVER {
        crate::harness::Server::Mysql => "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        _ => "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
    };
    for session in [None, Some(serializable)] {
        a_relay_passes_a_running_job_by::<B, C>(session);
    }
}

fn a_relay_passes_a_running_job_by<B, C>(session: Option<&str>)
where
    B: Backend<Conn = C>,
    C: TestConn + Send,
{
    let (db, mut conn) = three_receipts::<B, C>();
    if B::SERVER == crate::harness::Server::Mysql {
        // A failing run fails in seconds rather than the default 50.
        B::execute(&mut conn, "SET SESSION innodb_lock_wait_timeout = 2");
    }
    if let Some(sql) = session {
        B::execute(&mut conn, sql);
    }
    let report = while_a_job_holds_a_push(&db, "order-4", || {
        let started = std::time::Instant::now();
        let report = Relay::new().run_once(&mut conn, |_| Ok::<_, String>(()));
        (report, started.elapsed())
    });
    let (report, took) = report;
    assert!(
        matches!(&report, Ok(r) if r.delivered == 3),
        "the relay delivers the three committed messages beside the running job (in {took:?}, session: {session:?}): {report:?}"
    );
    let counts = outbox::counts(&mut conn).expect("counts");
    assert_eq!(
        (counts.delivered, counts.pending),
        (3, 1),
        "the job's message, committed since, waits for the next round"
    );
}

/// MySQL/MariaDB: a relay marking a delivery must not hold up a job that pushes a message. The
/// mark's `UPDATE` runs at the session's REPEATABLE READ; read through the index on
/// `delivered_at` (the plan MariaDB chose once the statement said `delivered_at IS NULL`), it
/// left a gap lock after the newest undelivered message, where the next push goes: the job waited
/// for the mark's commit, and failed with a lock wait timeout if the relay stalled there. Here a
/// trigger holds the mark open until the test lets it go, and a job pushes meanwhile.
pub fn a_job_that_pushes_never_waits_for_a_relays_mark<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn + Send,
{
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    send_receipt(&mut conn, "order-1").expect("a receipt");
    B::execute(
        &mut conn,
        "CREATE TRIGGER gate_mark BEFORE UPDATE ON outbox FOR EACH ROW \
         BEGIN IF NEW.delivered_at IS NOT NULL AND OLD.delivered_at IS NULL THEN \
         SET @reached = GET_LOCK(CONCAT(DATABASE(), ':reached'), 60); \
         SET @gate = GET_LOCK(CONCAT(DATABASE(), ':gate'), 60); \
         SET @gate = RELEASE_LOCK(CONCAT(DATABASE(), ':gate')); \
         SET @reached = RELEASE_LOCK(CONCAT(DATABASE(), ':reached')); \
         END IF; END",
    );
    let mut gate = db.connect();
    B::execute(&mut gate, "DO GET_LOCK(CONCAT(DATABASE(), ':gate'), 60)");
    let (report, pushed) = std::thread::scope(|scope| {
        let db = &db;
        let relay = scope.spawn(move || {
            let mut conn = db.connect();
            Relay::new().run_once(&mut conn, |_| Ok::<_, String>(()))
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while B::query_i64(
            &mut conn,
            "SELECT CAST(IS_USED_LOCK(CONCAT(DATABASE(), ':reached')) IS NOT NULL AS SIGNED) AS n",
        ) == 0
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the relay never reached its mark"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // The mark is in flight, its row locked. A job pushes a message now.
        let mut job = db.connect();
        B::execute(&mut job, "SET SESSION innodb_lock_wait_timeout = 2");
        let pushed = send_receipt(&mut job, "order-2");
        B::execute(&mut gate, "DO RELEASE_LOCK(CONCAT(DATABASE(), ':gate'))");
        (relay.join().expect("the relay's thread"), pushed)
    });
    assert!(
        pushed.is_ok(),
        "the job pushed while the relay was marking, without waiting for it: {pushed:?}"
    );
    assert!(
        matches!(&report, Ok(r) if r.delivered == 1),
        "the relay's mark: {report:?}"
    );
    let counts = outbox::counts(&mut conn).expect("counts");
    assert_eq!((counts.delivered, counts.pending), (1, 1), "{counts:?}");
}

/// Triggers that stop a lease at its first message's take, once, until the test lets it go:
/// `(install, reached, open_gate)`. The trigger takes the lock `reached` shows, then waits for
/// the gate, a lock the test's own session holds (`close_gate`, run first).
fn gate_first_take(
    server: crate::harness::Server,
) -> (
    &'static [&'static str],
    &'static str,
    &'static str,
    &'static str,
) {
    use crate::harness::Server;

    match server {
        Server::Postgres => (
            &[
                "CREATE FUNCTION gate_first_take() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 PERFORM pg_advisory_lock(hashtext(current_schema() || ':reached')); \
                 PERFORM pg_advisory_lock(hashtext(current_schema() || ':gate')); \
                 PERFORM pg_advisory_unlock(hashtext(current_schema() || ':gate')); \
                 PERFORM pg_advisory_unlock(hashtext(current_schema() || ':reached')); \
                 RETURN NEW; END $$",
                "CREATE TRIGGER gate_first_take BEFORE UPDATE ON outbox FOR EACH ROW \
                 WHEN (OLD.id = 1 AND OLD.attempts = 0 AND NEW.attempts = 1) \
                 EXECUTE FUNCTION gate_first_take()",
            ],
            "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM pg_locks \
             WHERE locktype = 'advisory' AND granted \
             AND objid = CAST(CAST(hashtext(current_schema() || ':reached') AS BIGINT) & 4294967295 AS OID)",
            "SELECT pg_advisory_lock(hashtext(current_schema() || ':gate'))",
            "SELECT pg_advisory_unlock(hashtext(current_schema() || ':gate'))",
        ),
        Server::Mysql => (
            &[
                "CREATE TRIGGER gate_first_take BEFORE UPDATE ON outbox FOR EACH ROW \
               BEGIN IF OLD.id = 1 AND OLD.attempts = 0 AND NEW.attempts = 1 THEN \
               SET @reached = GET_LOCK(CONCAT(DATABASE(), ':reached'), 60); \
               SET @gate = GET_LOCK(CONCAT(DATABASE(), ':gate'), 60); \
               SET @gate = RELEASE_LOCK(CONCAT(DATABASE(), ':gate')); \
               SET @reached = RELEASE_LOCK(CONCAT(DATABASE(), ':reached')); \
               END IF; END",
            ],
            "SELECT CAST(IS_USED_LOCK(CONCAT(DATABASE(), ':reached')) IS NOT NULL AS SIGNED) AS n",
            "DO GET_LOCK(CONCAT(DATABASE(), ':gate'), 60)",
            "DO RELEASE_LOCK(CONCAT(DATABASE(), ':gate'))",
        ),
        Server::Sqlite => unreachable!("SQLite's relays take its one write lock in turn"),
    }
}

/// A relay's lease locks only the messages it takes: another relay leasing at the same moment
/// takes all the others. Before, on MySQL and MariaDB, the lease's scans for abandoned messages
/// ran at REPEATABLE READ, which keeps the lock on every row a scan reads whether or not it
/// matches: for as long as one relay's lease lasted, every other relay's `SKIP LOCKED` found
/// nothing, and its `drain` returned at once with the outbox full. Two relays could even hide
/// the outbox from each other across two indexes, and both return with nothing delivered (seen
/// once in the suite: 120 messages, 0 delivered). Not SQLite: its relays lease in turn.
pub fn a_lease_hides_no_message_it_does_not_take<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn + Send,
{
    const MESSAGES: usize = 20;
    const BATCH: u32 = 7;
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    for order in 1..=MESSAGES {
        send_receipt(&mut conn, &format!("order-{order}")).expect("a receipt");
    }
    let (install, reached, close_gate, open_gate) = gate_first_take(B::SERVER);
    for sql in install {
        B::execute(&mut conn, sql);
    }
    let mut gate = db.connect();
    B::execute(&mut gate, close_gate);
    let (first, second) = std::thread::scope(|scope| {
        let db = &db;
        let first = scope.spawn(move || {
            let mut conn = db.connect();
            Relay::new()
                .batch_size(BATCH)
                .drain(&mut conn, |_| Ok::<_, String>(()))
        });
        let waiting = std::time::Instant::now();
        while B::query_i64(&mut conn, reached) == 0 {
            assert!(
                waiting.elapsed() < Duration::from_secs(60) && !first.is_finished(),
                "the first relay never reached its first take"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // The first relay's lease holds its batch, and stands still.
        let second = Relay::new()
            .batch_size(BATCH)
            .drain(&mut conn, |_| Ok::<_, String>(()));
        B::execute(&mut gate, open_gate);
        (first.join().expect("the first relay's thread"), second)
    });
    let (first, second) = (
        first.expect("the first relay"),
        second.expect("the second relay"),
    );
    assert_eq!(
        second.delivered,
        (MESSAGES - BATCH as usize) as u64,
        "the second relay delivers every message the first one's lease did not take: {second:?}, the first: {first:?}"
    );
    assert_eq!(first.delivered, u64::from(BATCH), "{first:?}");
    assert_eq!(
        outbox::counts(&mut conn).expect("counts").delivered,
        MESSAGES as i64
    );
}

/// An operator's retry of parked messages passes a running job's pushed, uncommitted message by,
/// as a relay does. Before, on MySQL and MariaDB it was an `UPDATE` that scanned the outbox,
/// waited for the job's row (50 s, then a lock wait timeout), and meanwhile held every row it had
/// read from every relay.
pub fn retrying_parked_messages_never_waits_for_a_job_that_pushed<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn + Send,
{
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let parked = send_receipt(&mut conn, "order-1").expect("a receipt");
    let report = Relay::new()
        .max_attempts(1)
        .drain(&mut conn, |_| Err("the mail server is down"))
        .expect("a relay");
    assert_eq!(report.parked, 1, "{report:?}");
    send_receipt(&mut conn, "order-2").expect("a receipt");
    Relay::new()
        .drain(&mut conn, |_| Ok::<_, String>(()))
        .expect("a relay");
    if B::SERVER == crate::harness::Server::Mysql {
        // A failing run fails in seconds rather than the default 50.
        B::execute(&mut conn, "SET SESSION innodb_lock_wait_timeout = 2");
    }
    let (all, one) = while_a_job_holds_a_push(&db, "order-3", || {
        let one = outbox::retry_parked(&mut conn, Some(&parked));
        // Parked again, by its primary key (a statement that waits for no other row).
        B::execute(
            &mut conn,
            "UPDATE outbox SET parked_at = created_at, attempts = 1 WHERE id = 1",
        );
        (outbox::retry_parked(&mut conn, None), one)
    });
    assert!(
        matches!(one, Ok(1)),
        "the one parked message is retried beside the running job: {one:?}"
    );
    assert!(
        matches!(all, Ok(1)),
        "every parked message is retried beside the running job: {all:?}"
    );
    let counts = outbox::counts(&mut conn).expect("counts");
    assert_eq!(
        (counts.pending, counts.delivered, counts.parked),
        (2, 1, 0),
        "the retried message and the job's wait for the relay"
    );
}

/// A session at READ UNCOMMITTED (MySQL/MariaDB) reads rows no transaction has committed. The
/// runtime's reads report what the database holds: a job still running (its claim and its pushed
/// message not committed, and they may yet roll back) is not a done key, nor a pending message.
pub fn a_read_uncommitted_session_reports_only_what_was_committed<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn + Send,
{
    use idempotent_jobs::keys;

    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::execute(
        &mut conn,
        "SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED",
    );
    let key = JobKey::new(PUSHED_KEY);
    let (record, listed, counts, unsent) = while_a_job_holds_a_push(&db, "order-1", || {
        (
            keys::lookup(&mut conn, &key),
            keys::list(&mut conn, &keys::KeyQuery::default()),
            outbox::counts(&mut conn),
            outbox::unsent(&mut conn, 10),
        )
    });
    assert!(
        matches!(record, Ok(None)),
        "a run not committed is no done key: {record:?}"
    );
    assert!(
        matches!(&listed, Ok(keys) if keys.is_empty()),
        "nor listed: {listed:?}"
    );
    assert!(
        matches!(&counts, Ok(c) if c.pending == 0),
        "a message not committed is not pending: {counts:?}"
    );
    assert!(
        matches!(&unsent, Ok(m) if m.is_empty()),
        "nor unsent: {unsent:?}"
    );
    assert!(
        keys::lookup(&mut conn, &key).expect("a look-up").is_some(),
        "once committed, the key is done"
    );
    assert_eq!(outbox::counts(&mut conn).expect("counts").pending, 1);
}

/// A relay inside a transaction of the caller's would hold its row locks until that transaction
/// ends: it is refused, and nothing is leased.
pub fn relays_refuse_to_run_inside_a_transaction<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    send_receipt(&mut conn, "order-1").expect("a receipt");
    let inside: Result<u64, TestError> = diesel::Connection::transaction(&mut conn, |conn| {
        Ok(Relay::new().run_once(conn, |_| Ok::<_, String>(()))?.leased)
    });
    assert!(
        matches!(
            inside,
            Err(TestError::Idempotent(Error::RelayInsideTransaction))
        ),
        "{inside:?}"
    );
    let counts = outbox::counts(&mut conn).expect("counts");
    assert_eq!((counts.pending, counts.leased), (1, 0));
}

/// A job with `redact_key` keeps its key's values out of the outbox too.
pub fn redacted_keys_stay_out_of_the_outbox<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    welcome_mail(&mut conn, "ada@example.com").expect("the job");
    let rows = conn.outbox_rows().expect("the outbox");
    assert!(
        rows.iter()
            .all(|(_, key)| key.as_deref().is_some_and(|k| k.starts_with("redacted:"))),
        "{rows:?}"
    );
    let mut seen = Vec::new();
    Relay::new()
        .drain(&mut conn, |message| {
            seen.push(message.job_key().unwrap_or_default().to_owned());
            Ok::<_, String>(())
        })
        .expect("a relay");
    assert!(
        seen.iter()
            .all(|k| k.starts_with("redacted:") && !k.contains("ada")),
        "{seen:?}"
    );
}

/// Counts by state, one event per delivery with its id, topic and outcome, and (with the
/// `metrics` feature) the delivery counter and the delay from push to delivery.
pub fn deliveries_are_counted_and_reported<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let (_db, mut conn) = three_receipts::<B, C>();
    let before = outbox::counts(&mut conn).expect("counts");
    assert_eq!((before.pending, before.delivered, before.parked), (3, 0, 0));
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (report, events) = crate::capture::events(|| {
        metrics::with_local_recorder(&recorder, || {
            Relay::new()
                .max_attempts(1)
                .drain(&mut conn, |message| match order_of(message).as_str() {
                    "order-3" => Err("refused".to_owned()),
                    _ => Ok(()),
                })
                .expect("a relay")
        })
    });
    assert_eq!((report.delivered, report.parked), (2, 1));
    let deliveries: Vec<_> = events
        .iter()
        .filter(|e| e.get("message").is_some_and(|m| m == "outbox delivery"))
        .collect();
    assert_eq!(deliveries.len(), 3, "{events:?}");
    for event in &deliveries {
        assert!(event["message_id"].starts_with("msg_"), "{event:?}");
        assert_eq!(event["topic"], "receipt");
    }
    let outcomes: Vec<&str> = deliveries.iter().map(|e| e["outcome"].as_str()).collect();
    assert_eq!(outcomes, ["delivered", "delivered", "parked"]);
    let after = outbox::counts(&mut conn).expect("counts");
    assert_eq!((after.pending, after.delivered, after.parked), (0, 2, 1));

    let metrics = snapshotter.snapshot().into_vec();
    let delivered_total: u64 = metrics
        .iter()
        .filter(|(key, ..)| {
            key.key().name() == "idempotent_jobs_outbox_deliveries_total"
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == "outcome" && l.value() == "delivered")
        })
        .map(|(.., value)| match value {
            metrics_util::debugging::DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum();
    assert_eq!(delivered_total, 2, "{metrics:?}");
    assert!(
        metrics
            .iter()
            .any(|(key, ..)| key.key().name() == "idempotent_jobs_outbox_delivery_delay_seconds"),
        "the delay from push to delivery is recorded"
    );
}

/// A topic with a NUL character (PostgreSQL text cannot hold one) is refused before it reaches
/// the database, on every database alike, as `OutboxMessageRefused`: the job goes on, and what it
/// pushes after commits with it. Before, on PostgreSQL the push failed in the database
/// (`Error::Outbox`, not refused) and left the job's transaction aborted, so the body could not go
/// on; SQLite and MySQL stored it.
pub fn a_message_that_would_arrive_changed_is_refused_and_the_job_goes_on<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    static NUL_TOPIC: Job = Job::new("nul_topic", "nul-topic:<n>");
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let outcome =
        idempotent_jobs::run(&mut conn, &NUL_TOPIC, &JobKey::new("nul-topic:1"), |conn| {
            let refused = outbox::push(conn, "a\0b", &"payload");
            // JSON writes a NaN as `null`: the consumer would read another amount.
            let not_a_number = outbox::push(conn, "nan", &vec![1.5, f64::NAN]);
            let next = outbox::push(conn, "after", &"payload")?;
            Ok::<_, Error>((
                refused.map_err(|e| format!("{e:?}")),
                not_a_number.map_err(|e| format!("{e:?}")),
                next,
            ))
        })
        .expect("the job");
    let (refused, not_a_number, _) = outcome.into_inner();
    assert!(
        matches!(&refused, Err(e) if e.starts_with("OutboxMessageRefused")),
        "{refused:?}"
    );
    assert!(
        matches!(&not_a_number, Err(e) if e.starts_with("OutboxPayload")),
        "{not_a_number:?}"
    );
    let mut delivered = Vec::new();
    Relay::new()
        .drain(&mut conn, |message| {
            delivered.push(message.topic().to_owned());
            Ok::<_, String>(())
        })
        .expect("a relay");
    assert_eq!(delivered, ["after"], "the job's other message committed");
}

/// A job that pushes `bytes` characters of payload to any topic.
#[idempotent_jobs::idempotent_job(key = "notify-any:<id>", name = "notify_any")]
fn notify_any<C: TestConn>(
    conn: &mut C,
    id: &str,
    topic: &str,
    bytes: usize,
) -> Result<String, TestError> {
    Ok(outbox::push(conn, topic, &"p".repeat(bytes))?)
}

/// A job that stores nothing and does nothing: only its key matters.
#[idempotent_jobs::idempotent_job(key = "plain:<id>", name = "plain_key")]
fn plain_key<C: TestConn>(conn: &mut C, id: &str) -> Result<(), TestError> {
    let _ = (conn, id);
    Ok(())
}

/// Whether `result` is the refusal of an outbox message, with `why` in its reason.
fn refused<T: std::fmt::Debug>(result: Result<T, TestError>, why: &str) {
    match result {
        Err(TestError::Idempotent(error @ Error::OutboxMessageRefused { .. })) => {
            assert!(error.to_string().contains(why), "{error}");
            assert!(!error.is_retryable(), "{error}");
        }
        other => panic!("expected OutboxMessageRefused ({why}), got {other:?}"),
    }
}

/// A job key or an outbox message the database cannot hold whole is refused before anything is
/// sent, with an error that says so, loses nothing, and leaves the connection usable. Before, on
/// MariaDB, a topic of 300 characters was cut to 255 by a session's non-strict `sql_mode` (a
/// user's own setting) and delivered to that other topic; a payload or a key of 20 MiB made the
/// server close the connection under the job ("retrying is safe and can succeed" for the payload,
/// and every later job on the connection failed). On PostgreSQL and SQLite both are stored and
/// delivered whole. The bound the errors name is the real one: a message and a key of exactly
/// that many bytes go through, one byte more is refused.
pub fn what_the_database_cannot_hold_is_refused_whole<B, C>()
where
    B: Backend<Conn = C>,
    C: TestConn,
{
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let mysql = B::SERVER == harness::Server::Mysql;
    if mysql {
        B::execute(&mut conn, "SET SESSION sql_mode = ''");
    }
    let long_topic = "t".repeat(300);
    let huge = 20 << 20;
    let huge_key = "k".repeat(huge);
    let long = notify_any(&mut conn, "long-topic", &long_topic, 10);
    let big = notify_any(&mut conn, "big-payload", "big", huge);
    let keyed = plain_key(&mut conn, &huge_key);
    notify_any(&mut conn, "after", "small", 1).expect("a job on the same connection after those");
    let mut delivered = Vec::new();
    Relay::new()
        .drain(&mut conn, |message| {
            delivered.push((message.topic().to_owned(), message.payload_json().len()));
            Ok::<_, String>(())
        })
        .expect("a relay");
    if mysql {
        refused(long, "its topic is 300 characters, over the 255");
        refused(big, "max_allowed_packet");
        match keyed {
            Err(TestError::Idempotent(error @ Error::KeyTooLarge { .. })) => {
                let message = error.to_string();
                assert!(
                    message.contains(&format!("{} bytes", huge + "plain:".len())),
                    "{message}"
                );
                assert!(
                    message.len() < 1_000,
                    "the key is left out of its error: {message}"
                );
                assert!(!error.is_retryable());
            }
            other => panic!("expected KeyTooLarge, got {other:?}"),
        }
        assert_eq!(
            delivered,
            [("small".to_owned(), 3)],
            "only what was pushed whole"
        );
        assert_eq!(
            B::count_done(&mut conn),
            1,
            "only the job after them committed"
        );
    } else {
        long.expect("a long topic");
        big.expect("a large payload");
        keyed.expect("a large key");
        assert_eq!(
            delivered,
            [
                (long_topic, 12),
                ("big".to_owned(), huge + 2),
                ("small".to_owned(), 3)
            ],
            "every message whole"
        );
        assert_eq!(B::count_done(&mut conn), 4);
        return;
    }
    // At the bound: the key, topic and payload of a message (the payload's JSON is its characters
    // and two quotes), and a key, of exactly the named number of bytes go through.
    let packet = u64::try_from(B::query_i64(
        &mut conn,
        "SELECT CAST(@@max_allowed_packet AS SIGNED) AS n",
    ))
    .expect("a size");
    let largest = usize::try_from(packet - 64 * 1024).expect("a size");
    let payload = largest - "notify-any:edge".len() - "edge".len() - 2;
    notify_any(&mut conn, "edge", "edge", payload).expect("a message at the bound");
    refused(
        notify_any(&mut conn, "over", "edge", payload + 1),
        &format!("are {} bytes, over the {largest}", largest + 1),
    );
    let key = "k".repeat(largest - "plain:".len());
    plain_key(&mut conn, &key).expect("a key at the bound");
    match plain_key(&mut conn, &format!("{key}k")) {
        Err(TestError::Idempotent(Error::KeyTooLarge { bytes, limit, .. })) => {
            assert_eq!((bytes, limit), (largest + 1, largest as u64));
        }
        other => panic!("expected KeyTooLarge, got {other:?}"),
    }
    assert_eq!(B::count_done(&mut conn), 3, "and nothing over it");
    assert_eq!(
        B::query_i64(
            &mut conn,
            "SELECT COUNT(*) AS n FROM outbox WHERE topic = 'edge'"
        ),
        1
    );
}
