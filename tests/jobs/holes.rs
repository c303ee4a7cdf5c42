//! The ways production breaks exactly-once, each reproduced: `keep` counted from the commit,
//! workers whose clocks disagree, statements that commit behind the runtime's back, busy SQLite
//! commits, lost commit replies, results too large, serialization failures at commit, a job called
//! with its own key on another connection. Written once, instantiated per backend in `main.rs`.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use idempotent_jobs::{Error, JobKey, WhileInProgress};

use crate::backends::Backend;
use crate::handlers::TestError;
use crate::harness::{self, Db};
use crate::signals;

fn runtime_error(result: Result<impl std::fmt::Debug, TestError>) -> Error {
    match result {
        Err(TestError::Idempotent(error)) => error,
        other => panic!("expected an error of the runtime, got {other:?}"),
    }
}

/// `keep = "1s"`, a body that works 2.5 s, a duplicate delivered 1.2 s into it (after `keep` has
/// passed since the first run began): the duplicate waits for the commit and replays. The claim
/// must not lapse before it is even committed.
pub fn keep_counts_from_the_commit<B: Backend>() {
    let db = Db::<B>::fresh();
    let id = harness::unique_name("held");
    let claimed = signals::expect(&id);
    let first_body_done = signals::expect(&signals::body_done(&id));
    std::thread::scope(|scope| {
        let first = scope.spawn(|| {
            let mut conn = db.connect();
            B::held(&mut conn, &id, 2_500)
        });
        claimed.wait("the first run claiming its key");
        std::thread::sleep(Duration::from_millis(1_200));
        let mut conn = db.connect();
        B::held(&mut conn, &id, 0).expect("the duplicate");
        // An order of events, not a duration: the duplicate came back only after the first run's
        // body had finished (its commit follows), so it waited for that commit.
        assert!(
            first_body_done.happened(),
            "the duplicate returned while the first run was still working: it did not wait for the first run's commit"
        );
        first.join().expect("the first run").expect("the first run");
    });
    let mut conn = db.connect();
    assert_eq!(
        B::count_topic(&mut conn, "held"),
        1,
        "the body ran once: the duplicate replayed instead of finding a lapsed claim"
    );
}

const FAKETIME_CHILD: &str = "IDEMPOTENT_TEST_FAKETIME_CHILD";
const RAN: &str = "IDEMPOTENT-TEST: the job call returned";

/// This test binary again, with its clock `offset` off (libfaketime), running `hourly(id)` once.
fn skewed_worker(test_path: &str, locator: &str, id: &str, offset: &str) {
    let library = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
    assert!(
        std::path::Path::new(library).exists(),
        "{library} is missing: install the Debian package libfaketime (scripts/test does)"
    );
    let child = harness::spawn_child_until(
        test_path,
        &[
            (FAKETIME_CHILD, &format!("{locator}|{id}")),
            ("LD_PRELOAD", library),
            ("FAKETIME", offset),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ("FAKETIME_DONT_RESET", "1"),
        ],
        RAN,
    );
    harness::finish(child);
}

/// A `keep = "1h"` job done by a worker whose clock is 2 h behind, then delivered again to a
/// worker with the right time, and done by a right worker then delivered to one 2 h ahead: each
/// redelivery replays, because every time that decides comes from the database's clock.
pub fn skewed_clocks_agree_on_keep<B: Backend>(test_path: &str) {
    if let Ok(task) = std::env::var(FAKETIME_CHILD) {
        let (locator, id) = task.split_once('|').expect("locator|id");
        let mut conn = Db::<B>::attach(locator).connect();
        B::hourly(&mut conn, id).expect("the skewed worker's job");
        println!("{RAN}");
        return;
    }
    let db = Db::<B>::fresh();
    // A worker 2 h behind runs first; a right one gets the redelivery.
    skewed_worker(test_path, db.locator(), "behind", "-2h");
    let mut conn = db.connect();
    B::hourly(&mut conn, "behind").expect("the redelivery");
    // A right worker runs first; a worker 2 h ahead gets the redelivery.
    B::hourly(&mut conn, "ahead").expect("the first run");
    skewed_worker(test_path, db.locator(), "ahead", "+2h");
    assert_eq!(
        B::count_topic(&mut conn, "hourly"),
        2,
        "each job ran once, whatever the workers' clocks said"
    );
}

/// MySQL commits implicitly before DDL: a body that runs DDL between two writes and then fails
/// must not leave its claim committed (the rerun would replay a job that never finished).
pub fn implicit_commits_are_detected<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let error = runtime_error(B::ddl_in_body(&mut conn, "1", true));
    assert!(
        matches!(error, Error::TransactionEndedInBody { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("DDL"), "{error}");
    assert_eq!(B::count_done(&mut conn), 0, "the claim was taken back");
    // The rerun runs the job: nothing replays a run that did not finish in one transaction.
    let error = runtime_error(B::ddl_in_body(&mut conn, "1", false));
    assert!(
        matches!(error, Error::TransactionEndedInBody { .. }),
        "{error}"
    );
    assert_eq!(
        B::count_topic(&mut conn, "before-ddl"),
        2,
        "both runs ran their body (the work before the DDL was committed each time, as the error says)"
    );
    assert_eq!(B::count_done(&mut conn), 0);
    // The server's messages in another language (`lc_messages`, a session's own setting): the
    // same answers, and the claims taken back.
    for language in ["de_DE", "ja_JP"] {
        B::execute(
            &mut conn,
            &format!("SET SESSION lc_messages = '{language}'"),
        );
        for fail in [true, false] {
            let id = format!("{language}-{fail}");
            let error = runtime_error(B::ddl_in_body(&mut conn, &id, fail));
            assert!(
                matches!(error, Error::TransactionEndedInBody { .. }),
                "{language}, the body failing: {fail}: {error}"
            );
        }
        assert_eq!(
            B::count_done(&mut conn),
            0,
            "{language}: no claim of a run that did not finish in one transaction stays"
        );
    }
}

/// The server rolls the job's transaction back under the body (a caught deadlock; on Galera, a
/// brute-force abort by a write certified on another node), another delivery of the same key runs
/// to completion meanwhile, and then the body returns `Ok`. The first run must not touch the key's
/// row, which is now the other run's: taking it back would let a third delivery run the job again.
pub fn a_rolled_back_run_leaves_another_runs_claim_alone<B: Backend>() {
    let db = Db::<B>::fresh();
    let id = harness::unique_name("rolled");
    signals::barrier(&id, 2);
    let first = std::thread::scope(|scope| {
        let first = scope.spawn(|| {
            let mut conn = db.connect();
            B::rolled_back_in_body(&mut conn, &id, true)
        });
        signals::meet(&id); // the first run's transaction is rolled back
        let mut other = db.connect();
        B::rolled_back_in_body(&mut other, &id, false).expect("the second delivery runs");
        signals::meet(&id); // the first run's body returns Ok
        first.join().expect("the first run")
    });
    let mut conn = db.connect();
    assert_eq!(B::count_done(&mut conn), 1, "the second run's claim stands");
    B::rolled_back_in_body(&mut conn, &id, false).expect("a third delivery replays");
    assert_eq!(
        B::count_topic(&mut conn, "rolled"),
        1,
        "the job's effect is there once: the third delivery replayed"
    );
    let error = runtime_error(first);
    // The body's `ROLLBACK` ended the job's transaction: what it ran after that (here nothing)
    // ran outside it, and the error says so.
    assert!(
        matches!(
            error,
            Error::TransactionRolledBackInBody { outside: true, .. }
        ),
        "{error:?}"
    );
    assert!(error.is_retryable(), "{error}");
    assert!(
        error.to_string().contains("a retry runs the job again"),
        "{error}"
    );
}

/// Many workers on one SQLite file, with SQLite's defaults (rollback journal, no busy timeout of
/// their own): every call succeeds, none fails at COMMIT with "database is locked".
pub fn many_workers_share_one_sqlite_file<B: Backend>() {
    const WORKERS: usize = 8;
    const JOBS: usize = 60;
    let db = Db::<B>::fresh();
    let barrier = Barrier::new(WORKERS);
    let failures: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|worker| {
                let (db, barrier) = (&db, &barrier);
                scope.spawn(move || {
                    let mut conn = db.connect();
                    barrier.wait();
                    let mut failures = Vec::new();
                    for job in 0..JOBS {
                        // Half the keys are shared by all workers, half are each worker's own.
                        let order = if job % 2 == 0 {
                            format!("shared-{job}")
                        } else {
                            format!("own-{worker}-{job}")
                        };
                        if let Err(error) =
                            B::charge(&mut conn, &order, 100, crate::handlers::Mode::Succeed)
                        {
                            failures.push(format!("{order}: {error}"));
                        }
                    }
                    failures
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a worker"))
            .collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {} calls failed: {:?}",
        failures.len(),
        WORKERS * JOBS,
        &failures[..failures.len().min(5)]
    );
    let mut conn = db.connect();
    assert_eq!(
        B::count_done(&mut conn),
        (JOBS / 2 + WORKERS * JOBS / 2) as i64
    );
}

/// A result larger than MySQL takes in one statement is refused before it is sent, rolled back
/// whole, with an error that says so (not "server has gone away" on every retry).
pub fn results_too_large_are_refused<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let error = runtime_error(B::big_result(&mut conn, "1", 20 << 20));
    match &error {
        Error::ResultTooLarge { bytes, limit, .. } => {
            assert!(*bytes > 20 << 20);
            assert!(*limit < *bytes as u64, "{error}");
        }
        other => panic!("expected ResultTooLarge, got {other}"),
    }
    // The bound the error names is the real one: a result of exactly that many bytes of JSON is
    // stored, one byte more is refused, and the message says where the number comes from.
    let packet = u64::try_from(B::query_i64(
        &mut conn,
        "SELECT CAST(@@max_allowed_packet AS SIGNED) AS n",
    ))
    .expect("a size");
    let largest = packet - 64 * 1024;
    // A string's JSON is its characters and two quotes.
    let fits = usize::try_from(largest).expect("a size") - 2;
    assert_eq!(
        B::big_result(&mut conn, "at-the-limit", fits).expect("a result the error's bound allows"),
        fits
    );
    let error = runtime_error(B::big_result(&mut conn, "over-the-limit", fits + 1));
    match &error {
        Error::ResultTooLarge {
            limit,
            packet: named,
            ..
        } => {
            assert_eq!((*limit, *named), (largest, packet), "{error}");
        }
        other => panic!("expected ResultTooLarge, got {other}"),
    }
    let message = error.to_string();
    assert!(
        message.contains(&largest.to_string())
            && message.contains(&packet.to_string())
            && message.contains("max_allowed_packet"),
        "{message}"
    );
    assert!(!error.is_retryable());
    assert_eq!(B::count_done(&mut conn), 1, "only the result at the limit");
    assert_eq!(
        B::count_topic(&mut conn, "big"),
        1,
        "nothing else committed"
    );
    assert_eq!(
        B::big_result(&mut conn, "2", 1000).expect("a small result"),
        1000
    );
}

/// Two jobs at SERIALIZABLE that each read what the other writes: one commit fails with a
/// serialization failure, and the error says it is worth a retry; the retry succeeds.
pub fn serialization_failures_at_commit_are_retryable<B: Backend>() {
    let db = Db::<B>::fresh();
    let barrier = harness::unique_name("skew");
    signals::barrier(&barrier, 2);
    let results: Vec<Result<(), TestError>> = std::thread::scope(|scope| {
        let sides = [("left", "right"), ("right", "left")].map(|(side, other)| {
            let (db, barrier) = (&db, &barrier);
            scope.spawn(move || {
                let mut conn = db.connect();
                B::execute(
                    &mut conn,
                    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
                );
                B::write_skew(&mut conn, barrier, side, other)
            })
        });
        sides.map(|s| s.join().expect("a side")).into()
    });
    let failed: Vec<&Result<(), TestError>> = results.iter().filter(|r| r.is_err()).collect();
    assert_eq!(failed.len(), 1, "one side loses: {results:?}");
    let Err(TestError::Idempotent(error)) = failed[0] else {
        panic!("the failure is the runtime's: {results:?}");
    };
    assert!(
        matches!(
            error,
            Error::Database {
                step: idempotent_jobs::Step::Commit,
                ..
            }
        ),
        "the conflict surfaces at COMMIT: {error}"
    );
    assert!(error.is_retryable(), "{error}");
    assert!(error.to_string().contains("retrying is safe"), "{error}");
    // The retry, now that the other side committed, runs and commits.
    let mut conn = db.connect();
    let side = if results[0].is_err() {
        ("left", "right")
    } else {
        ("right", "left")
    };
    signals::barrier(&barrier, 1);
    B::write_skew(&mut conn, &barrier, side.0, side.1).expect("the retry");
    assert_eq!(B::count_done(&mut conn), 2);
}

/// A job called with its own key from inside its body, but on another connection, is refused: on
/// that connection it would wait for its own claim, or run without one.
pub fn own_key_on_another_connection_is_refused<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let mut other = db.connect();
    let key = JobKey::new("plain:nested");
    let error = runtime_error(B::plain_nested_elsewhere(&mut conn, &mut other, &key));
    assert!(
        matches!(error, Error::OwnKeyOnAnotherConnection { .. }),
        "{error}"
    );
    assert_eq!(B::count_done(&mut conn), 0, "the outer run rolled back");
}

/// A claim held past the retry window says why it gave up: another worker held the key (or the
/// database's write lock), not "deadlocks".
pub fn exhausted_retries_name_their_cause<B: Backend>(session_setup: &str) {
    let db = Db::<B>::fresh();
    let id = harness::unique_name("held");
    let claimed = signals::expect(&id);
    std::thread::scope(|scope| {
        let holder = scope.spawn(|| {
            let mut conn = db.connect();
            B::held(&mut conn, &id, 6_000)
        });
        claimed.wait("the holder claiming its key");
        let mut conn = db.connect();
        if !session_setup.is_empty() {
            B::execute(&mut conn, session_setup);
        }
        let error = runtime_error(B::held_retrying(&mut conn, &id, Duration::from_secs(2)));
        match &error {
            Error::ClaimRetriesExhausted { causes, .. } => assert!(
                causes.contains("held the key") || causes.contains("write lock"),
                "{error}"
            ),
            other => panic!("expected ClaimRetriesExhausted, got {other}"),
        }
        assert!(!error.to_string().contains("deadlock"), "{error}");
        assert!(error.is_retryable());
        holder.join().expect("the holder").expect("the holder");
    });
}

/// A duplicate delivered while the first run of its key still works: `Fail` gives the worker back
/// at once and `WaitAtMost` after its bound, both with a retryable `InProgress` while the first run
/// still holds the key; `Wait` waits and replays. Only the first run's body ran.
pub fn in_progress_policies_bound_the_wait<B: Backend>() {
    const HOLD_MS: u64 = 6_000;
    let db = Db::<B>::fresh();
    let id = harness::unique_name("busy");
    let claimed = signals::expect(&id);
    let bound = Duration::from_millis(1_200);
    let (failed_after, bounded_after, waited) = std::thread::scope(|scope| {
        let holder = scope.spawn(|| {
            let mut conn = db.connect();
            B::held(&mut conn, &id, HOLD_MS)
        });
        claimed.wait("the holder claiming its key");
        let mut conn = db.connect();

        let started = Instant::now();
        let error = runtime_error(B::held_with_policy(&mut conn, &id, WhileInProgress::Fail));
        let failed_after = started.elapsed();
        assert!(matches!(error, Error::InProgress { .. }), "{error}");
        assert!(error.is_retryable(), "{error}");
        assert!(
            !holder.is_finished(),
            "Fail did not wait for the run: {failed_after:?}"
        );
        if B::SERVER == harness::Server::Sqlite {
            // The bound was the BEGIN's busy timeout (0 ms): it must not outlive the attempt, or
            // the connection's later statements fail at once while anyone writes.
            assert_eq!(
                B::query_i64(&mut conn, "SELECT timeout AS n FROM pragma_busy_timeout"),
                5_000,
                "the busy timeout is back after a BEGIN that did not get the lock"
            );
            // SQLite's one writer: a job of another key is held up too, and the error says so
            // instead of naming another run of its own key (found by the explorer).
            let other = runtime_error(B::held_with_policy(
                &mut conn,
                &format!("{id}-other"),
                WhileInProgress::Fail,
            ));
            assert!(matches!(other, Error::InProgress { .. }), "{other}");
            assert!(
                other.to_string().contains("on SQLite, any job writing"),
                "the error blames another run of the key, while any job writing holds SQLite: {other}"
            );
        }

        let started = Instant::now();
        let error = runtime_error(B::held_with_policy(
            &mut conn,
            &id,
            WhileInProgress::WaitAtMost(bound),
        ));
        let bounded_after = started.elapsed();
        assert!(matches!(error, Error::InProgress { .. }), "{error}");
        assert!(error.is_retryable(), "{error}");
        // The bound is a timer the database runs on its own clock from when its wait began
        // (PostgreSQL's lock_timeout, InnoDB's lock wait in whole seconds, SQLite's busy handler),
        // which this client's clock does not match to the millisecond, in either direction (seen:
        // 1.197 s measured here for a 1.2 s lock_timeout). Half the bound is the tolerance: it
        // still tells a wait for the bound from giving up at once (`Fail` above takes
        // milliseconds), with 600 ms to spare for two clocks on one machine. That the wait ended
        // while the first run still held the key is asserted by events, below.
        assert!(
            bounded_after >= bound / 2,
            "gave up at once instead of waiting for its bound ({bound:?}): {bounded_after:?}"
        );
        assert!(
            !holder.is_finished(),
            "gave up before the run ended: {bounded_after:?}"
        );

        let started = Instant::now();
        B::held_with_policy(&mut conn, &id, WhileInProgress::Wait).expect("waits, then replays");
        let waited = started.elapsed();
        holder.join().expect("the holder").expect("the holder");
        (failed_after, bounded_after, waited)
    });
    let mut conn = db.connect();
    assert_eq!(
        B::count_topic(&mut conn, "held"),
        1,
        "only the first run's body ran"
    );
    // The connection that met the bounds still waits as its session says (MySQL's setting is
    // the session's): a run on it afterwards is unaffected.
    B::held(&mut conn, &harness::unique_name("after"), 0).expect("a later run");
    crate::figures::report(&format!(
        "in-progress policy ({}): the first run holds its key {HOLD_MS} ms; a duplicate with Fail gave up after {} ms, with WaitAtMost({} ms) after {} ms, with Wait replayed after {} ms",
        std::any::type_name::<B>()
            .rsplit("::")
            .next()
            .unwrap_or("?"),
        failed_after.as_millis(),
        bound.as_millis(),
        bounded_after.as_millis(),
        waited.as_millis()
    ));
}

/// A job called inside a transaction of the caller's whose connection is cut after the server
/// received the release of the job's savepoint (its mark, `idempotent_enclosing_N`) and before its
/// reply arrived: a release commits nothing, and the caller's transaction ended with the
/// connection, uncommitted. The error says so: nothing of the job was committed, and the retry is
/// the enclosing transaction's, from its start (a retry of the call alone, on another connection,
/// would run the job outside it). Before, it was `CommitOutcomeUnknown`: "the job may or may not
/// have been committed; retrying is safe".
pub fn a_lost_release_inside_a_callers_transaction_commits_nothing<B: Backend>() {
    let db = Db::<B>::fresh();
    let proxy = crate::proxy::CommitCutter::start(db.locator());
    let mut conn = B::connect(&proxy.url(db.locator()));
    let key = JobKey::new("plain:lost-release");
    proxy.arm_on("RELEASE SAVEPOINT idempotent_enclosing");
    let result = B::plain_in_callers_transaction(&mut conn, &key, "lost-release");
    assert_eq!(proxy.cuts(), 1, "the proxy cut the release's connection");
    let error = runtime_error(result);
    let text = error.to_string();
    assert!(
        matches!(
            error,
            Error::Database {
                enclosing: true,
                ..
            }
        ),
        "{text}"
    );
    assert!(
        text.contains("nothing of the job was committed")
            && text.contains("retry that transaction from its start"),
        "{text}"
    );
    assert!(!text.contains("may or may not"), "{text}");
    assert!(
        text.contains("releasing the job's savepoint in the enclosing transaction"),
        "says what the job was doing, not a commit of its own: {text}"
    );
    assert!(error.is_connection_lost(), "{text}");
    let mut direct = db.connect();
    assert_eq!(
        (
            B::count_topic(&mut direct, "lost-release"),
            B::count_done(&mut direct)
        ),
        (0, 0),
        "nothing committed: the body's write and the claim went with the caller's transaction"
    );
    // The caller's retry, from its start, on a connection of its own.
    let retried = B::plain_in_callers_transaction(&mut direct, &key, "lost-release");
    assert!(
        matches!(retried, Ok(idempotent_jobs::Outcome::Ran(1))),
        "{retried:?}"
    );
    assert_eq!(B::count_topic(&mut direct, "lost-release"), 1);
}

/// PostgreSQL: a job called inside a transaction of the caller's whose result's record the
/// database refuses on its own (a trigger on `done_jobs`), after a body that did nothing wrong.
/// The call is the database's error, at the record, not retryable, nothing of the job committed;
/// before, any refusal there was read as a body that had aborted the transaction and returned
/// `Ok` regardless (`TransactionRolledBackInBody`, "retrying is safe"). A refusal only because the
/// transaction was aborted already ("current transaction is aborted", in the server's language)
/// is still read so.
pub fn a_record_refused_inside_a_callers_transaction_is_the_databases_error<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::execute(
        &mut conn,
        "CREATE FUNCTION refuse_records() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'results are closed'; END $$",
    );
    B::execute(
        &mut conn,
        "CREATE TRIGGER refuse_records BEFORE UPDATE ON done_jobs FOR EACH ROW \
         EXECUTE FUNCTION refuse_records()",
    );
    let key = JobKey::new("plain:refused-record");
    let error = runtime_error(B::plain_in_callers_transaction(
        &mut conn,
        &key,
        "refused-record",
    ));
    let text = crate::names::with_causes(&error);
    assert!(
        matches!(
            error,
            Error::Database {
                enclosing: true,
                retryable: false,
                ..
            }
        ) && text.contains("results are closed"),
        "the database's own refusal: {text}"
    );
    assert!(!text.contains("returned Ok regardless"), "{text}");
    let mut direct = db.connect();
    assert_eq!(
        (
            B::count_topic(&mut direct, "refused-record"),
            B::count_done(&mut direct)
        ),
        (0, 0),
        "nothing of the job committed"
    );
}

/// The connection is cut after the server received `COMMIT` and before its reply arrived: the
/// error says the outcome is unknown and a retry is safe, and the retry replays the committed run.
pub fn lost_commit_replies_leave_an_unknown_outcome<B: Backend>() {
    let db = Db::<B>::fresh();
    let proxy = crate::proxy::CommitCutter::start(db.locator());
    let mut conn = B::connect(&proxy.url(db.locator()));
    proxy.arm();
    let error = runtime_error(B::charge(
        &mut conn,
        "order-1",
        4200,
        crate::handlers::Mode::Succeed,
    ));
    assert_eq!(proxy.cuts(), 1, "the proxy cut the commit's connection");
    assert!(
        matches!(error, Error::CommitOutcomeUnknown { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("may or may not"), "{error}");
    assert!(error.is_retryable());
    let mut direct = db.connect();
    assert_eq!(
        B::count_charges(&mut direct, "order-1"),
        1,
        "the server did commit"
    );
    let outcome = B::charge_outcome(&mut direct, "order-1").expect("the retry");
    assert!(outcome.is_replayed(), "the retry replays the committed run");
    assert_eq!(B::count_charges(&mut direct, "order-1"), 1);
}

/// A session statement that makes the connection read-only (`on`) or writable again.
fn read_only(server: harness::Server, on: bool) -> &'static str {
    match (server, on) {
        (harness::Server::Postgres, true) => "SET default_transaction_read_only = on",
        (harness::Server::Postgres, false) => "SET default_transaction_read_only = off",
        (harness::Server::Mysql, true) => "SET SESSION TRANSACTION READ ONLY",
        (harness::Server::Mysql, false) => "SET SESSION TRANSACTION READ WRITE",
        (_, true) => "PRAGMA query_only = 1",
        (_, false) => "PRAGMA query_only = 0",
    }
}

/// A redelivery reads its key before anything else: a committed run's result comes back from that
/// one read, with no transaction and nothing written, so it replays even on a read-only session,
/// where a first delivery (which claims) fails. A redelivery of a key that never ran runs once.
pub fn redeliveries_replay_from_one_read<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let first = B::charge(&mut conn, "order-r", 4200, crate::handlers::Mode::Succeed)
        .expect("the first run");
    B::execute(&mut conn, read_only(B::SERVER, true));
    let replayed = B::charge_redelivered(&mut conn, "order-r", 4200, true)
        .expect("a redelivery replays from its read, on a read-only session too");
    assert_eq!(replayed, first);
    let error = B::charge_redelivered(&mut conn, "order-r", 4200, false)
        .expect_err("a first delivery claims, which a read-only session refuses");
    assert!(
        harness::with_causes(&error)
            .to_ascii_lowercase()
            .contains("read"),
        "the claim failed for being read-only: {error}"
    );
    B::execute(&mut conn, read_only(B::SERVER, false));
    assert_eq!(B::count_charges(&mut conn, "order-r"), 1);

    let ran = B::charge_redelivered(&mut conn, "order-s", 100, true)
        .expect("a redelivery of a key that never ran runs");
    assert_eq!(B::count_charges(&mut conn, "order-s"), 1);
    let again = B::charge_redelivered(&mut conn, "order-s", 100, true).expect("then replays");
    assert_eq!(again, ran);
    assert_eq!(B::count_charges(&mut conn, "order-s"), 1);
}

/// MySQL with `autocommit = 0`: the session sits in a transaction Diesel does not know of, whose
/// snapshot may still hold a key forgotten since. A redelivery's read before the claim must not
/// replay from that snapshot: the call is refused while that transaction is open (the job's
/// `START TRANSACTION` would commit it), and after the caller's `COMMIT` the forgotten key runs
/// again, as the claim path would have it.
pub fn redeliveries_never_read_an_old_snapshot<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::charge(&mut conn, "order-f", 4200, crate::handlers::Mode::Succeed).expect("the first run");
    B::execute(&mut conn, "SET autocommit = 0");
    // A read opens the implicit transaction, and its snapshot.
    assert_eq!(B::count_charges(&mut conn, "order-f"), 1);
    let mut operator = db.connect();
    assert!(
        B::keys_forget(&mut operator, &JobKey::new("charge:order-f")).expect("forgets"),
        "the key was there"
    );
    let refused = B::charge_redelivered(&mut conn, "order-f", 4200, true);
    assert!(
        matches!(
            &refused,
            Err(crate::handlers::TestError::Idempotent(
                Error::InsideTransaction { .. }
            ))
        ),
        "refused inside the session's transaction, not replayed from its snapshot: {refused:?}"
    );
    B::execute(&mut conn, "COMMIT");
    B::charge_redelivered(&mut conn, "order-f", 4200, true).expect("runs again");
    B::execute(&mut conn, "SET autocommit = 1");
    assert_eq!(
        B::count_charges(&mut operator, "order-f"),
        2,
        "the forgotten key ran again instead of replaying from the old snapshot"
    );
}

/// The same on PostgreSQL and SQLite, whose sessions Diesel cannot ask about a transaction sent
/// as text: a caller's `BEGIN` (`begin`: PostgreSQL at REPEATABLE READ, SQLite in WAL mode) and a
/// read fix a snapshot; an operator forgets the key; a redelivery flagged as one read the key's
/// row first, in that snapshot, and replayed the forgotten run's receipt (`Replayed`, no row in
/// `done_jobs`). The read now finds nothing where its snapshot may be old, and the claim decides.
///
/// `refused`: the claim is then refused inside the caller's transaction, at once (SQLite); on
/// PostgreSQL a caller's transaction that has only read takes the job in (a documented limit).
pub fn redeliveries_never_replay_from_a_callers_old_snapshot<B: Backend>(
    setup: &str,
    begin: &str,
    refused: bool,
) {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    if !setup.is_empty() {
        B::execute(&mut conn, setup);
    }
    B::charge(&mut conn, "order-s", 4200, crate::handlers::Mode::Succeed).expect("the first run");
    B::execute(&mut conn, begin);
    // A read fixes the snapshot.
    assert_eq!(B::count_charges(&mut conn, "order-s"), 1);
    let mut operator = db.connect();
    assert!(
        B::keys_forget(&mut operator, &JobKey::new("charge:order-s")).expect("forgets"),
        "the key was there"
    );
    let started = std::time::Instant::now();
    let redelivered = B::charge_redelivered(&mut conn, "order-s", 4200, true);
    let took = started.elapsed();
    // The body did not run where the caller's transaction sees one charge still.
    let replayed = redelivered.is_ok() && B::count_charges(&mut conn, "order-s") == 1;
    let _ = B::try_execute(&mut conn, "ROLLBACK");
    assert!(
        !replayed,
        "the key is forgotten, yet the redelivery replayed from the caller's snapshot: {redelivered:?}"
    );
    // The claim cannot run in the caller's transaction: refused, and at once (SQLite's `BEGIN
    // IMMEDIATE` behind the old snapshot is "database is locked" every time; it was retried for
    // 30 s and reported as another connection holding the write lock).
    if refused {
        assert!(
            matches!(
                &redelivered,
                Err(crate::handlers::TestError::Idempotent(
                    Error::InsideTransaction { .. }
                ))
            ),
            "refused inside the caller's transaction: {redelivered:?}"
        );
        assert!(
            took < std::time::Duration::from_secs(5),
            "refused after {took:?}"
        );
    }
    B::charge_redelivered(&mut conn, "order-s", 4200, true).expect("runs again");
    assert_eq!(
        B::count_charges(&mut operator, "order-s"),
        2,
        "the forgotten key ran again"
    );
}

/// A `COMMIT` that PostgreSQL refuses with an error of no kind Diesel names: a deferred
/// constraint trigger raising its own exception (SQLSTATE P0001), which fires at the `COMMIT`.
/// Before, the runtime took any such error for the release of its savepoint failing (the body's
/// doing), found nothing of the run committed and said `TransactionRolledBackInBody`: "rolled
/// back while its body ran ... retrying is safe", retryable, the trigger's message lost. Now the
/// call is the `COMMIT`'s database error, with the trigger's message, and nothing committed.
pub fn a_commit_refused_by_a_deferred_trigger_says_so<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::execute(
        &mut conn,
        "CREATE FUNCTION refuse_after() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF NEW.topic LIKE 'after:refused-%' THEN \
         RAISE EXCEPTION 'the ledger does not balance for %', NEW.payload; END IF; \
         RETURN NULL; END $$",
    );
    B::execute(
        &mut conn,
        "CREATE CONSTRAINT TRIGGER balanced AFTER INSERT ON test_outbox \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_after()",
    );
    for (kind, unit) in [("value", false), ("unit", true)] {
        let id = format!("refused-{kind}");
        let result = if unit {
            B::statements_in_unit_body(&mut conn, &id, "", false)
        } else {
            B::statements_in_body(&mut conn, &id, "", false).map(drop)
        };
        let error = runtime_error(result);
        assert!(
            matches!(
                error,
                Error::Database {
                    step: idempotent_jobs::Step::Commit,
                    ..
                }
            ),
            "{kind}: the COMMIT's own error, not the body's: {error}"
        );
        let text = format!("{error} {:?}", std::error::Error::source(&error));
        assert!(
            text.contains("the ledger does not balance"),
            "{kind}: the trigger's message is kept: {text}"
        );
        assert!(
            text.contains("nothing of the job was committed"),
            "{kind}: {text}"
        );
        assert!(
            !error.is_retryable(),
            "{kind}: the trigger refuses every retry alike: {text}"
        );
        assert_eq!(
            B::count_topic(&mut conn, &format!("before:{id}")),
            0,
            "{kind}: nothing committed"
        );
    }
    assert_eq!(B::count_done(&mut conn), 0, "no claim committed");
}

/// An error the runtime does not know by its text (a trigger's `SIGNAL`) is read by its number
/// from the server, and never as another error: not from a number a session variable kept from
/// an earlier error, where the session keeps no conditions (`max_error_count = 0`), nor from a
/// warning raised before the error. The call is the trigger's error, not retryable, at once.
pub fn an_unknown_error_is_never_read_as_another<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::execute(
        &mut conn,
        "CREATE TRIGGER refuse_claims BEFORE INSERT ON done_jobs FOR EACH ROW BEGIN \
         IF NEW.job_key LIKE 'in-body:refused%' THEN \
         SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'claims are closed'; END IF; END",
    );
    for (case, settings) in [
        (
            "a number kept from an earlier error",
            // Every variable the runtime reads a failed statement's numbers into
            // (`error_number_sql` in db/mysql.rs), a lock wait's number left in each.
            "SET @idempotent_jobs_conditions = 1, @idempotent_jobs_errno_last = 1205, \
             @idempotent_jobs_errno_1 = 1205, @idempotent_jobs_errno_2 = 1205, \
             @idempotent_jobs_errno_3 = 1205, @idempotent_jobs_errno_4 = 1205; \
             SET SESSION max_error_count = 0",
        ),
        (
            "the session as it comes",
            "SET SESSION max_error_count = DEFAULT",
        ),
    ] {
        B::execute(&mut conn, settings);
        let started = std::time::Instant::now();
        let error = runtime_error(B::statements_in_body(&mut conn, "refused", "", false));
        let text = format!("{error} {:?}", std::error::Error::source(&error));
        assert!(
            matches!(error, Error::Database { .. }) && text.contains("claims are closed"),
            "{case}: the trigger's error: {text}"
        );
        assert!(!text.contains("Lock wait"), "{case}: {text}");
        assert!(!error.is_retryable(), "{case}: {text}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{case}: not retried as a lock wait ({:?})",
            started.elapsed()
        );
    }
    assert_eq!(B::count_done(&mut conn), 0);
}

/// The other side of [`a_commit_refused_by_a_deferred_trigger_says_so`]: a body that goes past a
/// failed statement of its own (PostgreSQL aborts the transaction) and returns `Ok(())` (a job
/// that stores a result already fails storing it) is the body's doing,
/// `TransactionRolledBackInBody`, retryable, in whatever language the server writes
/// "current transaction is aborted" (the runtime asks the connection whether the transaction is
/// still open, aborted, rather than read that text).
#[cfg(feature = "postgres")]
pub fn a_body_that_goes_past_a_failed_statement_is_reported_as_such() {
    use crate::backends::Postgres;
    use diesel::RunQueryDsl as _;
    static CARELESS: idempotent_jobs::Job = idempotent_jobs::Job::new("careless", "careless:<n>");

    let db = Db::<Postgres>::fresh();
    let mut conn = db.connect();
    Postgres::execute(&mut conn, "CREATE TABLE careless_effects (n INT)");
    let careless = |conn: &mut diesel::PgConnection| -> Result<(), TestError> {
        diesel::sql_query("INSERT INTO careless_effects VALUES (1)")
            .execute(conn)
            .map_err(TestError::from)?;
        // "Try it, ignore the failure": the transaction is aborted from here.
        let _ignored = diesel::sql_query("SELECT * FROM no_such_table").execute(conn);
        Ok(())
    };
    // A job that returns `()` (its claim is its whole record: the commit finds the transaction
    // aborted), and one that returns a value (storing it finds the transaction aborted first).
    let unit = idempotent_jobs::run(&mut conn, &CARELESS, &JobKey::new("careless:1"), |conn| {
        careless(conn)
    });
    let value = idempotent_jobs::run(&mut conn, &CARELESS, &JobKey::new("careless:2"), |conn| {
        careless(conn).map(|()| 7_u32)
    });
    for (what, error) in [
        ("unit", runtime_error(unit)),
        ("value", runtime_error(value)),
    ] {
        // The aborted transaction refused every later statement: nothing ran outside it.
        assert!(
            matches!(
                error,
                Error::TransactionRolledBackInBody { outside: false, .. }
            ),
            "{what}: {error:?}"
        );
        assert!(error.is_retryable(), "{what}: {error}");
    }
    assert_eq!(
        Postgres::query_i64(&mut conn, "SELECT COUNT(*) AS n FROM careless_effects"),
        0,
        "nothing committed"
    );
    assert_eq!(Postgres::count_done(&mut conn), 0, "no claim committed");
}

/// MySQL/MariaDB: a deadlock rolls back the job's whole transaction, and the session then runs
/// each statement as one of its own. A body that returns at that failure (`?`) ran nothing
/// outside the transaction: the call is the body's own error (the deadlock, which a retry can
/// pass), not the runtime's warning that statements after the rollback may be committed; and
/// nothing of the job is committed.
pub fn a_deadlock_the_body_returns_at_is_the_bodys_own_error() {
    use crate::backends::Mysql;
    use diesel::RunQueryDsl as _;
    static LOCKER: idempotent_jobs::Job = idempotent_jobs::Job::new("locker", "locker:<n>");

    let db = Db::<Mysql>::fresh();
    let mut conn = db.connect();
    Mysql::execute(
        &mut conn,
        "CREATE TABLE locked_rows (id INT PRIMARY KEY, v INT) ENGINE = InnoDB",
    );
    Mysql::execute(&mut conn, "CREATE TABLE heavy (id INT) ENGINE = InnoDB");
    Mysql::execute(&mut conn, "INSERT INTO locked_rows VALUES (1, 0), (2, 0)");
    let id = harness::unique_name("deadlock");
    signals::barrier(&id, 2);
    let result = std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            let mut other = db.connect();
            // The heavier transaction: the server picks the job's as the deadlock's victim.
            Mysql::execute(&mut other, "START TRANSACTION");
            for _ in 0..50 {
                Mysql::execute(&mut other, "INSERT INTO heavy VALUES (1)");
            }
            Mysql::execute(&mut other, "UPDATE locked_rows SET v = v + 1 WHERE id = 2");
            signals::meet(&id);
            std::thread::sleep(Duration::from_millis(300)); // the job waits for row 2
            let closed =
                Mysql::try_execute(&mut other, "UPDATE locked_rows SET v = v + 1 WHERE id = 1");
            Mysql::execute(&mut other, "ROLLBACK");
            closed
        });
        let result = idempotent_jobs::run(&mut conn, &LOCKER, &JobKey::new("locker:1"), |conn| {
            diesel::sql_query("UPDATE locked_rows SET v = v + 1 WHERE id = 1")
                .execute(conn)
                .map_err(TestError::from)?;
            signals::meet(&id);
            diesel::sql_query("UPDATE locked_rows SET v = v + 1 WHERE id = 2")
                .execute(conn)
                .map_err(TestError::from)?;
            Ok::<_, TestError>(())
        });
        let closed = other.join().expect("the other transaction");
        assert!(
            closed.is_ok(),
            "the job's transaction was the victim: {closed:?}"
        );
        result
    });
    match &result {
        Err(TestError::Database(error)) => assert!(
            error.to_string().contains("Deadlock"),
            "the body's own error: {error}"
        ),
        other => panic!("expected the body's own error, the deadlock: {other:?}"),
    }
    assert_eq!(Mysql::count_done(&mut conn), 0, "no claim committed");
    assert_eq!(
        Mysql::query_i64(
            &mut conn,
            "SELECT CAST(SUM(v) AS SIGNED) AS n FROM locked_rows"
        ),
        0,
        "nothing of the job committed"
    );
}

/// A job inside a caller's transaction whose body went past a failed statement: on PostgreSQL the
/// job's savepoint is aborted and its release fails, and Diesel then leaves the savepoint itself
/// (rolls back to it, or, diesel-async, counts it gone). The runtime must not roll back what is
/// left, which is the caller's transaction: the call fails alone (retryable, nothing of it
/// committed), and the caller's transaction goes on and commits what it wrote before and after.
/// Elsewhere the failed statement aborts nothing and the job runs. Either way, what the call says
/// is what the database holds, and the caller's rows are all there.
pub fn a_careless_job_inside_a_callers_transaction_leaves_the_caller_whole<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    // A job whose claim is its whole record, and one that stores its result after its body
    // (whose record is the statement the aborted savepoint refuses).
    for (value, ids) in [(false, ["1", "2"]), (true, ["3", "4"])] {
        let kind = if value { "value job" } else { "unit job" };
        let callers = B::count_topic(&mut conn, "caller");
        let effects = B::count_topic(&mut conn, "careless");
        let claims = B::count_done(&mut conn);
        let (job, caller) = B::careless_in_callers_transaction(
            &mut conn,
            ids[0],
            "SELECT * FROM no_such_table",
            value,
        );
        let added = (
            B::count_topic(&mut conn, "careless") - effects,
            B::count_done(&mut conn) - claims,
        );
        assert!(
            caller.is_ok(),
            "{kind}: the caller's transaction commits: {caller:?} (the job said {job:?})"
        );
        assert_eq!(
            B::count_topic(&mut conn, "caller") - callers,
            2,
            "{kind}: the caller's rows before and after the job"
        );
        match job {
            Ok(()) => assert_eq!(
                added,
                (1, 1),
                "{kind}: a job that ran is committed with the caller"
            ),
            Err(_) => {
                let error = runtime_error(job);
                assert!(
                    matches!(
                        error,
                        Error::TransactionRolledBackInBody { outside: false, .. }
                    ),
                    "{kind}: {error:?}"
                );
                assert!(error.is_retryable(), "{kind}: {error}");
                assert_eq!(added, (0, 0), "{kind}: nothing of the job is committed");
            }
        }
        // The connection is back where the caller left it: the next job runs at the top level.
        let effects = B::count_topic(&mut conn, "careless");
        let (job, caller) = B::careless_in_callers_transaction(&mut conn, ids[1], "", value);
        assert!(job.is_ok() && caller.is_ok(), "{kind}: {job:?} {caller:?}");
        assert_eq!(B::count_topic(&mut conn, "careless"), effects + 1, "{kind}");
    }
}

/// SQLite in its default rollback-journal mode: a `COMMIT` needs every reader gone, and a reader
/// that holds on past the busy timeout (which the body shortened here) fails it with "database is
/// locked". The job's savepoint and `COMMIT` go in one `sqlite3_exec`; the call must be the
/// `COMMIT`'s error (retryable, nothing committed), not the body's doing: "database is locked"
/// names no savepoint, so the release did not fail.
pub fn a_commit_that_finds_the_database_busy_says_so() {
    use crate::backends::Sqlite;
    use diesel::RunQueryDsl as _;
    static BUSY: idempotent_jobs::Job = idempotent_jobs::Job::new("busy", "busy:<n>");

    let db = Db::<Sqlite>::fresh();
    let mut conn = db.connect();
    Sqlite::execute(&mut conn, "CREATE TABLE busy_effects (n INT)");
    let mut reader = db.connect();
    let key = JobKey::new("busy:1");
    let result = idempotent_jobs::run(&mut conn, &BUSY, &key, |conn| {
        diesel::sql_query("INSERT INTO busy_effects VALUES (1)")
            .execute(conn)
            .map_err(TestError::from)?;
        diesel::sql_query("PRAGMA busy_timeout = 50")
            .execute(conn)
            .map_err(TestError::from)?;
        // Another connection starts reading, and keeps its shared lock past the job's COMMIT.
        Sqlite::execute(&mut reader, "BEGIN");
        assert_eq!(
            Sqlite::query_i64(&mut reader, "SELECT COUNT(*) AS n FROM busy_effects"),
            0
        );
        Ok::<_, TestError>(())
    });
    Sqlite::execute(&mut reader, "COMMIT");
    let error = runtime_error(result);
    assert!(
        matches!(
            error,
            Error::Database {
                step: idempotent_jobs::Step::Commit,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.is_retryable(), "a busy database passes: {error}");
    assert_eq!(
        Sqlite::query_i64(&mut conn, "SELECT COUNT(*) AS n FROM busy_effects"),
        0,
        "nothing committed"
    );
    assert_eq!(Sqlite::count_done(&mut conn), 0, "no claim committed");
    let ran = idempotent_jobs::run(&mut conn, &BUSY, &key, |conn| {
        diesel::sql_query("INSERT INTO busy_effects VALUES (1)")
            .execute(conn)
            .map_err(TestError::from)
    });
    assert!(ran.is_ok(), "the retry runs: {ran:?}");
    assert_eq!(
        Sqlite::query_i64(&mut conn, "SELECT COUNT(*) AS n FROM busy_effects"),
        1
    );
}

/// MySQL/MariaDB: a job called inside a caller's transaction whose claim is the victim of a
/// deadlock. The server rolls back the caller's whole transaction, not the job's savepoint, and
/// the session then runs each statement as one of its own. The call must say so: what the caller
/// wrote before the call is gone with the job, and retrying the call alone would run the job
/// outside any transaction. Before, it said "nothing of the job was committed; retrying is safe",
/// as for a failure that leaves the caller whole.
pub fn a_deadlock_at_the_claim_inside_a_callers_transaction_says_the_caller_was_rolled_back() {
    use crate::backends::Mysql;
    use diesel::{Connection as _, RunQueryDsl as _};
    static HOLDER: idempotent_jobs::Job = idempotent_jobs::Job::new("holder", "holder:<n>");

    let db = Db::<Mysql>::fresh();
    let mut conn = db.connect();
    Mysql::execute(
        &mut conn,
        "CREATE TABLE caller_rows (id INT PRIMARY KEY, v INT) ENGINE = InnoDB",
    );
    Mysql::execute(&mut conn, "CREATE TABLE heavy (id INT) ENGINE = InnoDB");
    Mysql::execute(&mut conn, "INSERT INTO caller_rows VALUES (1, 0)");
    let id = harness::unique_name("claim-deadlock");
    signals::barrier(&id, 2);
    let key = JobKey::new("holder:1");
    let (caller, other) = std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            let mut other = db.connect();
            // The heavier transaction, holding the key: the caller's is the deadlock's victim.
            idempotent_jobs::run(&mut other, &HOLDER, &key, |conn| {
                for _ in 0..50 {
                    diesel::sql_query("INSERT INTO heavy VALUES (1)")
                        .execute(conn)
                        .map_err(TestError::from)?;
                }
                signals::meet(&id);
                std::thread::sleep(Duration::from_millis(300)); // the caller waits for the key
                diesel::sql_query("UPDATE caller_rows SET v = v + 10 WHERE id = 1")
                    .execute(conn)
                    .map_err(TestError::from)?;
                Ok::<_, TestError>(())
            })
        });
        let caller = conn.transaction::<(), TestError, _>(|conn| {
            diesel::sql_query("UPDATE caller_rows SET v = v + 1 WHERE id = 1").execute(conn)?;
            signals::meet(&id);
            let outcome = idempotent_jobs::run(conn, &HOLDER, &key, |_| Ok::<_, TestError>(()))?;
            assert!(
                matches!(outcome, idempotent_jobs::Outcome::Ran(())),
                "{outcome:?}"
            );
            Ok(())
        });
        (caller, other.join().expect("the other run"))
    });
    assert!(
        matches!(other, Ok(idempotent_jobs::Outcome::Ran(()))),
        "the other run was not the victim: {other:?}"
    );
    let error = match caller {
        Err(TestError::Idempotent(error)) => error,
        other => panic!("expected the call's error: {other:?}"),
    };
    let text = error.to_string();
    assert!(
        text.contains("enclosing transaction") && text.contains("rolled back"),
        "the error says the caller's transaction was rolled back: {text}"
    );
    assert!(
        !text.contains("failed while claiming the key; nothing of the job was committed"),
        "not the error of a failure that leaves the caller whole: {text}"
    );
    assert!(
        error.is_retryable(),
        "the caller's retry can succeed: {error}"
    );
    assert_eq!(
        Mysql::query_i64(
            &mut conn,
            "SELECT CAST(SUM(v) AS SIGNED) AS n FROM caller_rows"
        ),
        10,
        "the caller's write is gone, the other run's committed"
    );
    assert_eq!(
        Mysql::count_done(&mut conn),
        1,
        "the other run's claim only"
    );
}

/// A PostgreSQL server answers in its `lc_messages` (a server set up in a German or Japanese
/// locale does by default): a lock or statement timeout that ends the claim's wait for another
/// run of its key is still a wait that passes, retried and then retryable. Before, the English
/// texts alone were known: the German timeout was "another failure", not retried, and said that
/// retrying could not help.
pub fn waits_that_pass_are_known_in_the_servers_language<B: Backend>() {
    for (wait, language) in [
        ("SET statement_timeout = '500ms'", "de_DE.UTF-8"),
        ("SET lock_timeout = '500ms'", "ja_JP.UTF-8"),
    ] {
        let db = Db::<B>::fresh();
        let mut conn = db.connect();
        let set = format!("SET lc_messages = '{language}'");
        if let Err(error) = B::try_execute(&mut conn, &set) {
            panic!(
                "PostgreSQL cannot switch its messages to {language} ({error}): build the locale with `localedef --no-archive -i {} -f UTF-8 {language}` (scripts/test does)",
                &language[..5]
            );
        }
        drop(conn);
        exhausted_retries_name_their_cause::<B>(&format!("{wait}; {set}"));
    }
}

/// PostgreSQL ends the job's connection while its `COMMIT` runs (an operator's
/// `pg_terminate_backend`, a failover, an idle timeout), and the server answers in German: the
/// call says the outcome is unknown (the server may have committed: a commit waiting for a
/// synchronous standby is committed locally when it is cut), and a retry runs or replays. Before,
/// diesel-async passed on the server's "Verbindung wird abgebrochen ...", which was not known as
/// a lost connection: `Error::Database`, "nothing of the job was committed", not retryable.
pub fn a_commit_cut_by_the_server_in_its_language_is_an_unknown_outcome<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::execute(
        &mut conn,
        "CREATE FUNCTION slow_after() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF NEW.topic LIKE 'after:slow-%' THEN PERFORM pg_sleep(5); END IF; \
         RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON test_outbox \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_after()",
    );
    if let Err(error) = B::try_execute(&mut conn, "SET lc_messages = 'de_DE.UTF-8'") {
        panic!(
            "PostgreSQL cannot switch its messages to German ({error}): build the locale with `localedef --no-archive -i de_DE -f UTF-8 de_DE.UTF-8` (scripts/test does)"
        );
    }
    let mut operator = db.connect();
    let pid = B::query_i64(&mut conn, "SELECT CAST(pg_backend_pid() AS BIGINT) AS n");
    let result = std::thread::scope(|scope| {
        let cutter = scope.spawn(|| {
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(20) {
                let cut = B::query_i64(
                    &mut operator,
                    &format!(
                        "SELECT COUNT(pg_terminate_backend(pid)) AS n FROM pg_stat_activity \
                         WHERE pid = {pid} AND wait_event = 'PgSleep'"
                    ),
                );
                if cut > 0 {
                    return cut;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            0
        });
        let result = B::statements_in_body(&mut conn, "slow-1", "", false);
        assert_eq!(
            cutter.join().expect("the operator"),
            1,
            "one commit cut: {:?}",
            result.as_ref().map(drop)
        );
        result
    });
    let error = runtime_error(result.map(drop));
    assert!(
        matches!(error, Error::CommitOutcomeUnknown { .. }),
        "the server ended the connection during the COMMIT: {error}"
    );
    assert!(error.is_retryable(), "{error}");
    let mut direct = db.connect();
    B::execute(&mut direct, "DROP TRIGGER slow ON test_outbox");
    assert_eq!(
        B::count_topic(&mut direct, "before:slow-1"),
        0,
        "the server did not commit"
    );
    B::statements_in_body(&mut direct, "slow-1", "", false).expect("the retry runs");
    assert_eq!(B::count_topic(&mut direct, "before:slow-1"), 1);
}

/// What PgBouncer sends a client whose server connection it lost or ended (`FATAL`, SQLSTATE
/// 08P01, then the socket closes): a failover or a killed server, its `query_timeout`, its
/// `idle_transaction_timeout`.
const POOLER_FAREWELLS: [&str; 3] = [
    "server conn crashed?",
    "query timeout",
    "idle transaction timeout",
];

/// PostgreSQL behind PgBouncer: the `COMMIT` reached the server, and the client hears PgBouncer's
/// farewell in place of its reply. The outcome is unknown and a retry is safe (it replays the
/// run, which did commit). Before, the farewell was not known as a lost connection: it was read as
/// the job's savepoint gone, and the call said a statement of the body had ended its transaction,
/// not retryable, "forget the key before retrying" (which would run the job twice).
pub fn a_poolers_farewell_at_commit_is_an_unknown_outcome<B: Backend>() {
    for (n, farewell) in POOLER_FAREWELLS.into_iter().enumerate() {
        let db = Db::<B>::fresh();
        let proxy = crate::proxy::CommitCutter::start(db.locator());
        let mut conn = B::connect(&proxy.url(db.locator()));
        proxy.arm_with_farewell(farewell);
        let order = format!("order-{n}");
        let error = runtime_error(B::charge(
            &mut conn,
            &order,
            4200,
            crate::handlers::Mode::Succeed,
        ));
        assert_eq!(proxy.cuts(), 1, "the proxy cut the commit's connection");
        assert!(
            matches!(error, Error::CommitOutcomeUnknown { .. }),
            "PgBouncer's `{farewell}` at COMMIT: {error}"
        );
        assert!(
            error.is_retryable() && error.is_connection_lost(),
            "{error}"
        );
        let mut direct = db.connect();
        assert_eq!(
            B::count_charges(&mut direct, &order),
            1,
            "the server did commit"
        );
        let outcome = B::charge_outcome(&mut direct, &order).expect("the retry");
        assert!(outcome.is_replayed(), "the retry replays the committed run");
        assert_eq!(B::count_charges(&mut direct, &order), 1);
    }
}

/// The same inside a transaction of the caller's, at the release of the job's savepoint: the
/// caller's whole transaction went with the connection, so nothing of the job was committed and
/// the caller retries its transaction. Before: "a statement of its body ended its transaction".
pub fn a_poolers_farewell_inside_a_callers_transaction_commits_nothing<B: Backend>() {
    for (n, farewell) in POOLER_FAREWELLS.into_iter().enumerate() {
        let db = Db::<B>::fresh();
        let proxy = crate::proxy::CommitCutter::start(db.locator());
        let mut conn = B::connect(&proxy.url(db.locator()));
        let topic = format!("farewell-{n}");
        let key = JobKey::new(format!("plain:{topic}"));
        proxy.arm_on("RELEASE SAVEPOINT idempotent_enclosing");
        proxy.say_at_the_cut(farewell);
        let error = runtime_error(B::plain_in_callers_transaction(&mut conn, &key, &topic));
        assert_eq!(proxy.cuts(), 1, "the proxy cut the release's connection");
        let text = error.to_string();
        assert!(
            matches!(
                error,
                Error::Database {
                    enclosing: true,
                    ..
                }
            ) && text.contains("nothing of the job was committed"),
            "PgBouncer's `{farewell}` at the release: {text}"
        );
        assert!(error.is_connection_lost(), "{text}");
        let mut direct = db.connect();
        assert_eq!(
            (
                B::count_topic(&mut direct, &topic),
                B::count_done(&mut direct)
            ),
            (0, 0),
            "nothing committed"
        );
    }
}

/// PostgreSQL: a body that commits the job's transaction itself (`COMMIT`), after which the
/// runtime's release is refused ("RELEASE SAVEPOINT can only be used in transaction blocks")
/// and the connection is lost before anything else is asked. What the body did is known: it
/// committed the claim and its work, and the call must not say the commit's outcome is unknown
/// and a retry safe (a retry would run the job again). Before, the runtime asked whether the
/// connection still answered, heard nothing, and said `CommitOutcomeUnknown`.
pub fn a_body_that_committed_before_the_connection_died_is_no_unknown_outcome<B: Backend>() {
    let db = Db::<B>::fresh();
    let proxy = crate::proxy::CommitCutter::start(db.locator());
    let mut conn = B::connect(&proxy.url(db.locator()));
    proxy.arm_on("connection_alive");
    let result = B::statements_in_body(&mut conn, "body-commit", "COMMIT", false);
    let error = runtime_error(result.map(drop));
    assert!(
        !matches!(error, Error::CommitOutcomeUnknown { .. })
            && !error.to_string().contains("retrying is safe"),
        "the body committed: {error} ({} cuts; {error:?})",
        proxy.cuts()
    );
}

/// Every call that runs in a transaction of its own (looking up, listing, counting and forgetting
/// keys, pruning), made while the session holds a transaction the caller opened as text (`BEGIN`,
/// which Diesel does not count), one that has written and one that has only read: refused as
/// `Error::InsideTransaction`, at once, and the caller's transaction is left as it was, open, to
/// commit or roll back as the caller says (its later write goes with its `ROLLBACK`).
///
/// Before: on SQLite the call's own `BEGIN` was refused ("cannot start a transaction within a
/// transaction") and the call reported that as a failure of the database's (`Error::Keys`); on
/// PostgreSQL, inside a caller's transaction that had only read, the call ran in it and its
/// `COMMIT` ended it (the forget committed, the caller's later write autocommitted).
pub fn calls_inside_a_callers_text_transaction_are_refused_and_change_nothing<B: Backend>() {
    use idempotent_jobs::{Prune, keys::KeyQuery};
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::charge(&mut conn, "order-t", 4200, crate::handlers::Mode::Succeed).expect("the first run");
    let key = JobKey::new("charge:order-t");
    let inside = |what: &str, result: Result<String, Error>| match result {
        Err(Error::InsideTransaction { .. }) => {}
        other => panic!("{what} inside the caller's transaction: {other:?}"),
    };
    for wrote in [false, true] {
        B::execute(&mut conn, "BEGIN");
        if wrote {
            B::execute(
                &mut conn,
                "INSERT INTO charges (order_id, amount, charge_ref) VALUES ('callers', 1, 'c')",
            );
        } else {
            assert_eq!(B::count_charges(&mut conn, "order-t"), 1);
        }
        let started = Instant::now();
        inside(
            "lookup",
            B::keys_lookup(&mut conn, &key).map(|r| format!("{r:?}")),
        );
        inside(
            "forget",
            B::keys_forget(&mut conn, &key).map(|r| format!("{r:?}")),
        );
        inside(
            "list",
            B::keys_list(&mut conn, &KeyQuery::default()).map(|r| format!("{r:?}")),
        );
        inside(
            "job counts",
            B::keys_job_counts(&mut conn).map(|r| format!("{r:?}")),
        );
        inside(
            "prune",
            B::try_prune(&mut conn, &Prune::default()).map(|r| format!("{r:?}")),
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "refused after {:?}",
            started.elapsed()
        );
        // The caller's transaction is still open and still the caller's: its rollback undoes its
        // rows, the one written after the refusals too.
        B::execute(
            &mut conn,
            "INSERT INTO charges (order_id, amount, charge_ref) VALUES ('callers', 2, 'c')",
        );
        B::execute(&mut conn, "ROLLBACK");
        let mut other = db.connect();
        assert_eq!(
            B::count_charges(&mut other, "callers"),
            0,
            "a call ended the caller's transaction (wrote first: {wrote})"
        );
        assert!(
            B::keys_lookup(&mut other, &key)
                .expect("a lookup")
                .is_some(),
            "the key was forgotten (wrote first: {wrote})"
        );
    }
    assert_eq!(B::count_charges(&mut conn, "order-t"), 1);
}

/// SQLite with a shared cache and `PRAGMA read_uncommitted = 1` on the redelivery's connection:
/// its read before the claim saw another connection's claim before that run committed, and
/// replayed it. Here worker A's run claims the key, writes its charge and fails a second later
/// (rolled back); worker B's redelivery of the same key, while A's run is open, said
/// `Replayed(())` (its caller acknowledges, and the job never runs), with nothing committed, and
/// B's `keys::lookup` reported A's run. The read before the claim now answers only where the
/// session reads committed rows, and B's claim waits for A's run, then runs the job; a look-up
/// turns the session's setting off for its own transaction, and back on after it.
#[cfg(feature = "sqlite")]
#[test]
fn a_read_of_uncommitted_rows_never_replays_a_run_that_did_not_commit() {
    use diesel::Connection as _;
    use idempotent_jobs::{Job, JobCall, Outcome};

    use crate::backends::Sqlite;
    use crate::handlers::TestConn as _;

    static UNCOMMITTED: Job = Job::new("uncommitted_read", "uncommitted:<id>");
    let db = Db::<Sqlite>::fresh();
    let uri = format!("file:{}?cache=shared", db.locator());
    let mut a = diesel::SqliteConnection::establish(&uri).expect("worker A");
    let mut b = diesel::SqliteConnection::establish(&uri).expect("worker B");
    Sqlite::execute(&mut b, "PRAGMA read_uncommitted = 1");
    let key = JobKey::new("uncommitted:1");
    let (claimed, told) = std::sync::mpsc::channel();
    let (first, second) = std::thread::scope(|scope| {
        let worker_a = scope.spawn(|| {
            JobCall::new(&UNCOMMITTED, &key).run(&mut a, |conn| {
                conn.insert_charge("order-u", 100, "a")?;
                claimed.send(()).expect("the test");
                std::thread::sleep(Duration::from_secs(1));
                Err::<(), _>(TestError::Declined)
            })
        });
        told.recv().expect("A's run claimed the key");
        // A look-up reports only what is committed: it said A's run was done.
        let looked = idempotent_jobs::keys::lookup(&mut b, &key);
        assert!(
            matches!(looked, Ok(None)),
            "B's look-up while A's run was open, then rolled back: {looked:?}"
        );
        let second = JobCall::new(&UNCOMMITTED, &key)
            .redelivered(true)
            .run(&mut b, |conn| {
                conn.insert_charge("order-u", 100, "b")?;
                Ok::<(), TestError>(())
            });
        (worker_a.join().expect("worker A"), second)
    });
    assert!(matches!(first, Err(TestError::Declined)), "{first:?}");
    assert!(
        matches!(second, Ok(Outcome::Ran(()))),
        "B's redelivery, while A's run was open and then rolled back: {second:?}"
    );
    let mut check = db.connect();
    assert_eq!(
        Sqlite::count_charges(&mut check, "order-u"),
        1,
        "B's charge"
    );
    assert_eq!(Sqlite::count_done(&mut check), 1, "B's claim");
    // The look-up read committed rows and put the session's own setting back.
    let setting: Vec<i32> = diesel::RunQueryDsl::load(
        diesel::dsl::sql::<diesel::sql_types::Integer>(
            "SELECT read_uncommitted FROM pragma_read_uncommitted",
        ),
        &mut b,
    )
    .expect("the setting");
    assert_eq!(setting, [1], "B's own read_uncommitted");
}
