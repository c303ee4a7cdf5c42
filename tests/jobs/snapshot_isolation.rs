//! MariaDB with `innodb_snapshot_isolation = ON` (the default from MariaDB 11.6): a transaction
//! at REPEATABLE READ that locks a row another transaction changed after its snapshot fails with
//! error 1020 ("Record has changed since last read in table ...; try restarting transaction").
//! It is a serialization failure: trying the whole transaction again succeeds. What each call
//! reports must say so, and what it reports must be what the database holds.

use std::time::Duration;

use diesel::{Connection as _, MysqlConnection, RunQueryDsl as _};
use idempotent_jobs::outbox::{self, Relay};
use idempotent_jobs::{Job, JobKey, Outcome};

use crate::backends::{Backend, Mysql};
use crate::handlers::TestError;
use crate::harness::Db;

static VALUE: Job = Job::new("snapshot_value", "snapshot-value:<n>");
static PUSHER: Job = Job::new("snapshot_push", "snapshot-push:<n>");

const SNAPSHOT_ISOLATION: &str = "SET SESSION innodb_snapshot_isolation = ON";

fn connect(db: &Db<Mysql>) -> MysqlConnection {
    let mut conn = db.connect();
    Mysql::execute(&mut conn, SNAPSHOT_ISOLATION);
    conn
}

fn fresh() -> Db<Mysql> {
    let db = Db::<Mysql>::fresh();
    let mut conn = db.connect();
    Mysql::execute(
        &mut conn,
        "CREATE TABLE rows_written (tag VARCHAR(40)) ENGINE = InnoDB",
    );
    db
}

fn write(conn: &mut MysqlConnection, tag: &str) -> Result<(), TestError> {
    diesel::sql_query(format!("INSERT INTO rows_written (tag) VALUES ('{tag}')")).execute(conn)?;
    Ok(())
}

/// A value job called inside a caller's transaction whose snapshot is older than another
/// worker's committed claim of the same key: the claim meets error 1020. Before, the call said
/// `CallersTransactionRolledBack { retryable: false }` ("retrying does not help"), though a retry
/// of the caller's transaction replays the other worker's result. Now the call says to retry that
/// transaction, and the retry replays.
pub fn a_claim_behind_a_changed_row_says_to_retry_the_callers_transaction() {
    let db = fresh();
    let (mut conn, mut other) = (connect(&db), connect(&db));
    let key = JobKey::new("snapshot-value:1");
    let mut call = None;
    let caller = conn.transaction::<(), TestError, _>(|conn| {
        // The caller's snapshot starts with this read ...
        assert_eq!(
            Mysql::query_i64(conn, "SELECT COUNT(*) AS n FROM rows_written"),
            0
        );
        write(conn, "caller-before")?;
        // ... and another worker runs the same job, and commits, after it.
        let theirs = idempotent_jobs::run(&mut other, &VALUE, &key, |_| Ok::<_, TestError>(7_u32))?;
        assert!(matches!(theirs, Outcome::Ran(7)), "{theirs:?}");
        let mine = idempotent_jobs::run(conn, &VALUE, &key, |_| Ok::<_, TestError>(8_u32));
        let failed = mine.is_err();
        call = Some(mine);
        if failed {
            return Err(TestError::Service("the call failed".into()));
        }
        Ok(())
    });
    let call = call.expect("the call");
    match &call {
        Ok(Outcome::Replayed(7)) => {
            assert!(caller.is_ok(), "{caller:?}");
        }
        Err(TestError::Idempotent(error)) => {
            assert!(
                error.is_retryable(),
                "a serialization failure: a retry of the caller's transaction replays, but the \
                 call says retrying does not help: {error:?} ({error})"
            );
            let text = error.to_string();
            assert!(
                text.contains("transaction") && !text.contains("does not help"),
                "{text}"
            );
            assert!(caller.is_err());
            // The retry the error asks for: the caller's transaction, from its start.
            let retried = conn.transaction::<_, TestError, _>(|conn| {
                write(conn, "caller-before")?;
                idempotent_jobs::run(conn, &VALUE, &key, |_| Ok::<_, TestError>(8_u32))
            });
            assert!(
                matches!(retried, Ok(Outcome::Replayed(7))),
                "the retry replays the other worker's result: {retried:?}"
            );
        }
        other => panic!("the claim behind a changed row: {other:?}"),
    }
    assert_eq!(Mysql::count_done(&mut conn), 1, "one claim");
    assert_eq!(
        Mysql::query_i64(
            &mut conn,
            "SELECT COUNT(*) AS n FROM rows_written WHERE tag = 'caller-before'"
        ),
        1,
        "the caller's row, once"
    );
}

/// Two relays racing for the same pending messages, each on a session with snapshot isolation:
/// a lease whose candidate rows another relay changed meets error 1020. Before, the relay stopped
/// with `Error::Outbox { retryable: false }`. Now the lease is retried (it is a serialization
/// failure), no relay stops, and every message is delivered once.
pub fn racing_relays_deliver_every_message_once() {
    const MESSAGES: u32 = 300;
    let db = fresh();
    let mut conn = db.connect();
    for n in 0..MESSAGES {
        let _pushed = idempotent_jobs::run(
            &mut conn,
            &PUSHER,
            &JobKey::new(format!("snapshot-push:{n}")),
            |conn| {
                outbox::push(conn, "snapshot", &serde_json::json!({ "n": n }))?;
                Ok::<_, TestError>(())
            },
        )
        .expect("the pushing job");
    }
    let delivered = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let locator = db.locator().to_owned();
    let shared = std::sync::Arc::clone(&delivered);
    within(
        &db,
        Duration::from_secs(150),
        "the racing relays",
        move || {
            let db = Db::<Mysql>::attach(&locator);
            let delivered = &*shared;
            std::thread::scope(|scope| {
                let relays: Vec<_> = (0..2)
                    .map(|_| {
                        let (db, delivered) = (&db, &delivered);
                        scope.spawn(move || {
                            let mut conn = connect(db);
                            loop {
                                assert!(
                                    std::time::Instant::now() < deadline,
                                    "the relays did not finish within 120 s"
                                );
                                let report = Relay::new()
                                    .batch_size(3)
                                    .run_once(&mut conn, |message| {
                                        let payload: serde_json::Value =
                                            message.payload().expect("json");
                                        let n = payload["n"].as_u64().expect("n") as u32;
                                        delivered.lock().expect("delivered").push(n);
                                        Ok::<_, String>(())
                                    })
                                    .unwrap_or_else(|error| {
                                        panic!("a relay stopped: {error:?} ({error})")
                                    });
                                if report.leased == 0 {
                                    break;
                                }
                            }
                        })
                    })
                    .collect();
                for relay in relays {
                    relay.join().expect("a relay");
                }
            });
        },
    );
    let mut delivered = delivered.lock().expect("delivered").clone();
    delivered.sort_unstable();
    assert_eq!(delivered, (0..MESSAGES).collect::<Vec<_>>(), "each once");
    assert_eq!(
        Mysql::query_i64(
            &mut conn,
            "SELECT COUNT(*) AS n FROM outbox WHERE delivered_at IS NULL"
        ),
        0
    );
}

diesel::table! {
    rows_to_lock (id) {
        id -> Integer,
        v -> Integer,
    }
}

static LOCKING: Job = Job::new("snapshot_locking", "snapshot-locking:<n>");

/// Runs `f` on a thread of its own; fails the test if it has not returned within `limit` (a hang
/// is what this file looks for).
///
/// On a hang, the connections to `db` are killed first: their open transactions would hold the
/// database's `DROP` at the test's end for `lock_wait_timeout` (a year by default).
fn within<T: Send + 'static>(
    db: &Db<Mysql>,
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match finished.recv_timeout(limit) {
        Ok(Ok(value)) => value,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => {
            let mut admin = db.connect();
            let name = db
                .locator()
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned();
            for _ in 0..20 {
                let id = Mysql::query_i64(
                    &mut admin,
                    &format!(
                        "SELECT COALESCE(MIN(id), 0) AS n FROM information_schema.processlist \
                         WHERE db = '{name}' AND id <> CONNECTION_ID()"
                    ),
                );
                if id == 0 {
                    break;
                }
                let _ = diesel::sql_query(format!("KILL {id}")).execute(&mut admin);
            }
            panic!("{what} did not return within {limit:?}: it hangs")
        }
    }
}

/// A job whose body's own locking read (a Diesel query, a cached prepared statement) fails with
/// 1020 after the statement's result header; the next delivery, on the same connection, runs
/// the same read. Before, that run never returned: libmariadb left the cached statement waiting
/// for the failed result, and its next execution waited for packets the server never sends (the
/// relay test below hung the same way in the runtime's own lease). Now the failed call empties
/// the connection's statement cache, and the next delivery runs the job.
pub fn a_job_whose_read_failed_midway_runs_at_its_next_delivery() {
    let db = fresh();
    let locator = db.locator().to_owned();
    let mut setup = db.connect();
    Mysql::execute(
        &mut setup,
        "CREATE TABLE rows_to_lock (id INT PRIMARY KEY, v INT) ENGINE = InnoDB",
    );
    Mysql::execute(
        &mut setup,
        "INSERT INTO rows_to_lock SELECT seq, 0 FROM seq_1_to_2000",
    );
    let (first, second) = within(
        &db,
        Duration::from_secs(60),
        "the second delivery",
        move || {
            use diesel::prelude::*;
            let db = Db::<Mysql>::attach(&locator);
            let (mut conn, mut other) = (connect(&db), db.connect());
            let key = JobKey::new("snapshot-locking:1");
            let mut deliver = |interfere: bool| {
                idempotent_jobs::run(&mut conn, &LOCKING, &key, |conn| {
                    // The job's snapshot starts with this read ...
                    let _ = Mysql::query_i64(conn, "SELECT COUNT(*) AS n FROM rows_to_lock");
                    if interfere {
                        // ... another transaction changes a row after it ...
                        Mysql::execute(
                            &mut other,
                            "UPDATE rows_to_lock SET v = v + 1 WHERE id = 1999",
                        );
                    }
                    // ... and the job locks the rows.
                    let locked = rows_to_lock::table
                        .select(rows_to_lock::id)
                        .order(rows_to_lock::id)
                        .for_update()
                        .load::<i32>(conn)?;
                    write(conn, "locked")?;
                    Ok::<_, TestError>(locked.len())
                })
            };
            let first = deliver(true);
            let second = deliver(false);
            (format!("{first:?}"), second.map_err(|e| e.to_string()))
        },
    );
    assert!(
        first.contains("Record has changed since last read"),
        "the first delivery met 1020: {first}"
    );
    assert!(
        matches!(second, Ok(Outcome::Ran(2000))),
        "the next delivery runs the job: {second:?}"
    );
    let mut conn = db.connect();
    assert_eq!(Mysql::count_done(&mut conn), 1, "one claim");
    assert_eq!(
        Mysql::query_i64(
            &mut conn,
            "SELECT COUNT(*) AS n FROM rows_written WHERE tag = 'locked'"
        ),
        1,
        "the job's row, once"
    );
}
