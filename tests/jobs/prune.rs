//! A prune leaves the database to the workers: paced by its own batches, and on MySQL/MariaDB
//! holding no lock a new claim needs.

use std::time::{Duration, Instant};

use idempotent_jobs::Prune;

use crate::backends::Backend;
use crate::harness::Db;

/// After each batch but the last, a prune pauses nine times as long as that batch took (and
/// does pause: the run lasts at least as long as its pauses); `pace(0)` never pauses.
#[cfg(feature = "sqlite")]
#[test]
fn a_prune_pauses_after_each_batch_as_long_as_its_pace_says() {
    use crate::backends::Sqlite;

    let db = Db::<Sqlite>::fresh();
    let mut conn = db.connect();
    lapsed::<Sqlite>(&mut conn, "lapsed", 3500);
    let started = Instant::now();
    let (report, events) =
        crate::capture::events(|| Sqlite::prune(&mut conn, &Prune::default().batch_size(1_000)));
    let elapsed = started.elapsed();
    assert_eq!((report.removed, report.batches), (3_500, 4));
    let batches = batch_events(&events);
    assert_eq!(batches.len(), 4, "{events:?}");
    let mut paused = Duration::ZERO;
    for (i, (took_us, pause_us)) in batches.iter().enumerate() {
        if i == 3 {
            assert_eq!(*pause_us, 0, "no pause after the last batch");
        } else {
            // Both in whole microseconds, rounded down from the same duration.
            let paced = took_us * 9;
            assert!(
                (paced..paced + 9).contains(pause_us),
                "batch {i} took {took_us} µs and paused {pause_us} µs"
            );
        }
        paused += Duration::from_micros(*pause_us);
    }
    assert!(
        elapsed >= paused,
        "paused {paused:?} in a run of {elapsed:?}"
    );

    lapsed::<Sqlite>(&mut conn, "again", 2500);
    let (report, events) = crate::capture::events(|| {
        Sqlite::prune(&mut conn, &Prune::default().batch_size(1_000).pace(0))
    });
    assert_eq!((report.removed, report.batches), (2_500, 3));
    assert!(
        batch_events(&events)
            .iter()
            .all(|(_, pause_us)| *pause_us == 0),
        "{events:?}"
    );
}

/// A batch's duration, which sets its pause, is its own work, not its wait for SQLite's write
/// lock: beside busy workers a prune's `BEGIN IMMEDIATE` waits behind their claims, and charged
/// for that wait the benchmark's default prune paused seconds per batch (820 s for 100,000 rows
/// that took 5 s unpaced) and fell behind the keys lapsing. Here another connection holds the
/// write lock for 2 s as the prune starts: the first batch waits for it, and its pause is not
/// nine times that wait (18 s).
#[cfg(feature = "sqlite")]
#[test]
fn a_prune_pauses_for_its_work_not_for_its_wait_for_the_write_lock() {
    use crate::backends::Sqlite;

    const HOLD: Duration = Duration::from_secs(2);
    let db = Db::<Sqlite>::fresh();
    let mut conn = db.connect();
    lapsed::<Sqlite>(&mut conn, "lapsed", 1500);
    let mut holder = db.connect();
    Sqlite::execute(&mut holder, "BEGIN IMMEDIATE");
    let (report, events, released) = std::thread::scope(|scope| {
        let releasing = scope.spawn(move || {
            std::thread::sleep(HOLD);
            let releasing = Instant::now();
            Sqlite::execute(&mut holder, "COMMIT");
            releasing
        });
        let (report, events) = crate::capture::events(|| {
            Sqlite::prune(&mut conn, &Prune::default().batch_size(1_000))
        });
        let pruned = Instant::now();
        let released = releasing.join().expect("the lock holder");
        (report, events, released <= pruned)
    });
    assert!(
        released,
        "the prune finished while the write lock was still held"
    );
    assert_eq!((report.removed, report.batches), (1_500, 2));
    let batches = batch_events(&events);
    let (took_us, pause_us) = batches[0];
    // Tolerance: the batch's own work (1,000 deletes, milliseconds) would have to take as long as
    // the 2 s wait for the pause to reach nine times it.
    assert!(
        Duration::from_micros(pause_us) < HOLD * 9,
        "the first batch waited {HOLD:?} for the write lock and paused {pause_us} µs after it (its duration: {took_us} µs): the wait was charged as work"
    );
}

/// `max_batches(0)`: no batch (a maintenance window's budget that came out as 0). It ran one
/// batch, and deleted up to a batch of keys.
#[cfg(feature = "sqlite")]
#[test]
fn a_prune_of_no_batches_deletes_nothing() {
    use crate::backends::Sqlite;
    let db = crate::harness::Db::<Sqlite>::fresh();
    let mut conn = db.connect();
    lapsed::<Sqlite>(&mut conn, "old", 10);
    let report =
        idempotent_jobs::prune(&mut conn, &idempotent_jobs::Prune::default().max_batches(0))
            .expect("a prune");
    assert_eq!((report.removed, report.batches), (0, 0), "{report:?}");
    assert_eq!(
        Sqlite::count_done(&mut conn),
        10,
        "every lapsed key is still there"
    );
    let report = idempotent_jobs::prune(
        &mut conn,
        &idempotent_jobs::Prune::default()
            .batch_size(4)
            .max_batches(2)
            .pace(0),
    )
    .expect("a prune");
    assert_eq!((report.removed, report.batches), (8, 2), "{report:?}");
}

/// A prune whose table is dropped after its first batch committed says what that batch deleted.
/// Before, the second batch's missing table was `Error::NotMigrated`, "nothing was changed", and
/// the 1,000 rows the first batch had deleted were in no report.
#[cfg(feature = "sqlite")]
#[test]
fn a_prune_that_loses_its_table_midway_counts_what_it_deleted() {
    use crate::backends::Sqlite;

    let db = Db::<Sqlite>::fresh();
    let mut conn = db.connect();
    lapsed::<Sqlite>(&mut conn, "lapsed", 1500);
    let mut dropper = db.connect();
    // Its reads wait out the prune's commits.
    Sqlite::execute(&mut dropper, "PRAGMA busy_timeout = 10000");
    let outcome = std::thread::scope(|scope| {
        scope.spawn(move || {
            // The first batch's commit, then the table gone during the pause after it.
            let deadline = Instant::now() + Duration::from_secs(30);
            while Sqlite::count_done(&mut dropper) > 500 {
                assert!(Instant::now() < deadline, "the first batch never committed");
                std::thread::sleep(Duration::from_millis(5));
            }
            Sqlite::execute(&mut dropper, "DROP TABLE done_jobs");
        });
        Sqlite::try_prune(
            &mut conn,
            &Prune::default()
                .batch_size(1_000)
                .pace(0)
                .pause(Duration::from_secs(2)),
        )
    });
    match outcome {
        Err(error @ idempotent_jobs::Error::Prune { .. }) => {
            let idempotent_jobs::Error::Prune {
                removed, batches, ..
            } = &error
            else {
                unreachable!()
            };
            assert_eq!((*removed, *batches), (1_000, 1), "{error}");
            let text = error.to_string();
            assert!(
                text.contains("1000 deleted in 1 batch(es) before it stay deleted")
                    && !text.contains("nothing was changed"),
                "{text}"
            );
        }
        other => {
            panic!("the second batch found no table, after the first deleted 1,000 rows: {other:?}")
        }
    }
}

/// A prune given a flag stops between two batches once it is set (an operator's Ctrl-C, a
/// service shutting down): the batch under way commits, a long pause ends at once, and the report
/// says it stopped and counts exactly the rows deleted, all committed. A flag set before the
/// prune starts stops it before its first batch.
#[cfg(feature = "sqlite")]
#[test]
fn a_prune_stops_between_batches_when_its_flag_is_set() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::backends::Sqlite;

    let db = Db::<Sqlite>::fresh();
    let mut conn = db.connect();
    lapsed::<Sqlite>(&mut conn, "lapsed", 50);
    let flag = Arc::new(AtomicBool::new(false));
    let options = Prune::default()
        .batch_size(5)
        .pause(Duration::from_secs(60))
        .stop_when(Arc::clone(&flag));
    let setter = {
        let flag = Arc::clone(&flag);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            flag.store(true, Ordering::SeqCst);
        })
    };
    let started = Instant::now();
    let report = Sqlite::try_prune(&mut conn, &options).expect("a prune");
    setter.join().expect("the setter");
    assert!(report.stopped, "{report:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the pause ended at the flag: {:?}",
        started.elapsed()
    );
    assert_eq!(
        (report.removed, report.batches),
        (5, 1),
        "one batch, then the pause"
    );
    assert_eq!(
        Sqlite::count_done(&mut conn),
        45,
        "what the report counts is deleted"
    );
    let again = Sqlite::try_prune(&mut conn, &options).expect("a prune");
    assert_eq!((again.removed, again.batches, again.stopped), (0, 0, true));
    assert_eq!(Sqlite::count_done(&mut conn), 45);
}

/// Inserts `rows` claims of the job `job` that lapsed in 2000.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
fn lapsed<B: Backend>(conn: &mut B::Conn, job: &str, rows: u32) {
    B::execute(
        conn,
        &crate::second_run::bulk_claims(B::SERVER, job, "2000-01-02 00:00:00")
            .replace("100000", &rows.to_string()),
    );
}

/// `(took_us, pause_us)` of each "pruned a batch" event.
#[cfg(feature = "sqlite")]
fn batch_events(events: &[crate::capture::Fields]) -> Vec<(u64, u64)> {
    events
        .iter()
        .filter(|e| e.get("message").is_some_and(|m| m == "pruned a batch"))
        .map(|e| {
            let number = |field: &str| -> u64 {
                e[field]
                    .parse()
                    .unwrap_or_else(|_| panic!("{field}: {e:?}"))
            };
            (number("took_us"), number("pause_us"))
        })
        .collect()
}

/// On MySQL/MariaDB a prune's batch holds no lock a new claim needs. The batch is made to stop
/// half-way, waiting for a lapsed row another transaction holds, with the rows before it deleted
/// and locked; a job claiming a fresh key then runs and commits before the batch goes on. At
/// REPEATABLE READ the batch's next-key locks on `expires_at` cover the gap where every new
/// claim's entry goes, and the claim waited for the batch.
#[cfg(feature = "mysql")]
#[test]
fn a_claim_never_waits_for_a_prune_batch_on_mysql() {
    use diesel::connection::SimpleConnection as _;

    use crate::backends::Mysql;
    use crate::handlers::Mode;

    let db = Db::<Mysql>::fresh();
    let mut conn = db.connect();
    lapsed::<Mysql>(&mut conn, "lapsed", 3);
    Mysql::charge(&mut conn, "kept", 1, Mode::Succeed).expect("a live claim");
    // The last lapsed row the batch reaches, locked by its primary key alone.
    let mut holder = db.connect();
    holder
        .batch_execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; BEGIN")
        .expect("a transaction");
    let held = ids(
        &mut holder,
        "SELECT id FROM done_jobs WHERE id = \
         (SELECT MAX(id) FROM done_jobs WHERE job_key LIKE 'lapsed:%') FOR UPDATE",
    );
    assert_eq!(held.len(), 1, "the last lapsed row, locked");

    // The first row the batch deletes: once it is locked, the batch has begun, and it cannot end
    // before the held row is let go.
    let first = ids(
        &mut holder,
        "SELECT MIN(id) AS id FROM done_jobs WHERE job_key LIKE 'lapsed:%'",
    )[0];
    let pruning = {
        let mut conn = db.connect();
        std::thread::spawn(move || Mysql::prune(&mut conn, &Prune::default().pace(0)))
    };
    let mut watcher = db.connect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !locked(&mut watcher, first) {
        assert!(
            Instant::now() < deadline,
            "the prune never waited for the held row"
        );
        assert!(
            !pruning.is_finished(),
            "the prune finished past a held row: {:?}",
            pruning.join()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let (done, claimed) = std::sync::mpsc::channel();
    let claiming = {
        let mut conn = db.connect();
        std::thread::spawn(move || {
            let result = Mysql::charge(&mut conn, "fresh", 1, Mode::Succeed);
            let _ = done.send(());
            result
        })
    };
    // A claim takes milliseconds; the bound is for a machine under load.
    let waited = claimed.recv_timeout(Duration::from_secs(30)).is_err();
    holder.batch_execute("ROLLBACK").expect("releasing the row");
    let report = pruning.join().expect("the prune's thread");
    claiming
        .join()
        .expect("the claim's thread")
        .expect("the claim");
    assert!(
        !waited,
        "a fresh claim waited for a prune batch that was itself waiting"
    );
    assert_eq!(report.removed, 3);
    assert_eq!(
        Mysql::count_done(&mut conn),
        2,
        "the live claim and the fresh one"
    );
}

/// The `id` column of `sql`'s rows.
#[cfg(feature = "mysql")]
fn ids(conn: &mut diesel::MysqlConnection, sql: &str) -> Vec<i64> {
    use diesel::prelude::*;

    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
    }
    let rows: Vec<Id> = diesel::sql_query(sql)
        .load(conn)
        .unwrap_or_else(|e| panic!("`{sql}`: {e}"));
    rows.into_iter().map(|row| row.id).collect()
}

/// Whether another transaction holds a lock on the row `id` of `done_jobs`: the row read
/// `FOR UPDATE NOWAIT` (a lock the statement lets go of at once, in autocommit) or refused.
#[cfg(feature = "mysql")]
fn locked(conn: &mut diesel::MysqlConnection, id: i64) -> bool {
    use diesel::prelude::*;

    match diesel::sql_query(format!(
        "SELECT id FROM done_jobs WHERE id = {id} FOR UPDATE NOWAIT"
    ))
    .execute(conn)
    {
        Ok(_) => false,
        Err(e) if e.to_string().contains("Lock wait timeout") => true,
        Err(e) => panic!("probing row {id}'s lock: {e}"),
    }
}
