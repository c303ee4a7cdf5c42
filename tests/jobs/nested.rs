//! Jobs called inside a caller's transaction (the job runs in a savepoint of it), where the
//! database or a statement of the body takes more than the job's savepoint: what the call says
//! must be what the database holds, the caller's rows included.

use std::sync::Barrier;
use std::time::Duration;

use diesel::{Connection as _, RunQueryDsl as _};
use idempotent_jobs::{Error, Job, JobKey, JobStore, Outcome};

use crate::backends::Backend;
use crate::handlers::TestError;
use crate::harness::{Db, Server};

static UNIT: Job = Job::new("nested_unit", "nested-unit:<n>");
static VALUE: Job = Job::new("nested_value", "nested-value:<n>");

fn fresh<B: Backend>() -> Db<B> {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::execute(
        &mut conn,
        match B::SERVER {
            Server::Mysql => "CREATE TABLE rows_written (tag VARCHAR(40)) ENGINE = InnoDB",
            _ => "CREATE TABLE rows_written (tag VARCHAR(40))",
        },
    );
    db
}

fn write<C: diesel::Connection>(conn: &mut C, tag: &str) -> Result<(), TestError>
where
    diesel::query_builder::SqlQuery: diesel::query_dsl::methods::ExecuteDsl<C>,
{
    diesel::sql_query(format!("INSERT INTO rows_written (tag) VALUES ('{tag}')")).execute(conn)?;
    Ok(())
}

fn count<B: Backend>(conn: &mut B::Conn, tag: &str) -> i64 {
    B::query_i64(
        conn,
        &format!("SELECT COUNT(*) AS n FROM rows_written WHERE tag = '{tag}'"),
    )
}

/// A unit job inside a caller's transaction whose body rolls back to the job's savepoint there
/// (Diesel's, `diesel_savepoint_1`), taking the claim made after it, and writes on. Before, the
/// call said `Ran` with no claim committed: the next delivery ran the job again. Now the call
/// finds its claim gone, as a job that records a result does: nothing of it is committed.
pub fn a_unit_job_whose_body_takes_its_claim_never_says_ran<B>()
where
    B: Backend,
    B::Conn: diesel::Connection + JobStore,
    diesel::query_builder::SqlQuery: diesel::query_dsl::methods::ExecuteDsl<B::Conn>,
{
    let db = fresh::<B>();
    let mut conn = db.connect();
    let key = JobKey::new("nested-unit:1");
    let mut call = None;
    conn.transaction::<(), TestError, _>(|conn| {
        write(conn, "caller-before")?;
        call = Some(idempotent_jobs::run(conn, &UNIT, &key, |conn| {
            diesel::sql_query("ROLLBACK TO SAVEPOINT diesel_savepoint_1").execute(conn)?;
            write(conn, "job-after")
        }));
        write(conn, "caller-after")?;
        Ok(())
    })
    .expect("the caller commits");
    let call = call.expect("the call");
    let claimed = B::count_done(&mut conn);
    let job_rows = count::<B>(&mut conn, "job-after");
    match &call {
        Ok(Outcome::Ran(())) => assert!(
            claimed == 1,
            "Ran, but no claim is committed: the next delivery runs the job again ({job_rows} rows)"
        ),
        Err(TestError::Idempotent(Error::TransactionRolledBackInBody {
            outside: false, ..
        })) => {
            assert_eq!((claimed, job_rows), (0, 0), "nothing of the job committed");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(count::<B>(&mut conn, "caller-before"), 1);
    assert_eq!(count::<B>(&mut conn, "caller-after"), 1);
}

/// A fresh MySQL/MariaDB database with the tables [`with_deadlock_partner`] locks, and a connection.
fn fresh_for_deadlock() -> (
    Db<crate::backends::Mysql>,
    <crate::backends::Mysql as Backend>::Conn,
) {
    use crate::backends::Mysql;
    let db = fresh::<Mysql>();
    let mut conn = db.connect();
    Mysql::execute(
        &mut conn,
        "CREATE TABLE locked (id INT PRIMARY KEY, v INT) ENGINE = InnoDB; \
         CREATE TABLE heavy (id INT) ENGINE = InnoDB; \
         INSERT INTO locked VALUES (1, 0), (2, 0)",
    );
    (db, conn)
}

/// Makes the transaction on the calling connection the victim of a deadlock (MySQL/MariaDB): the
/// other transaction, on its own connection, is the heavier, and asks for row 1 once `f` has
/// locked it and waits at the barrier for row 2.
fn with_deadlock_partner<R: Send>(
    db: &Db<crate::backends::Mysql>,
    f: impl FnOnce(&Barrier) -> R + Send,
) -> R {
    use crate::backends::Mysql;
    let barrier = Barrier::new(2);
    std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            let mut other = db.connect();
            Mysql::execute(&mut other, "START TRANSACTION");
            for _ in 0..100 {
                Mysql::execute(&mut other, "INSERT INTO heavy VALUES (1)");
            }
            Mysql::execute(&mut other, "UPDATE locked SET v = v + 1 WHERE id = 2");
            barrier.wait();
            std::thread::sleep(Duration::from_millis(400));
            Mysql::execute(&mut other, "UPDATE locked SET v = v + 1 WHERE id = 1");
            Mysql::execute(&mut other, "COMMIT");
        });
        let result = f(&barrier);
        other.join().expect("the other transaction commits");
        result
    })
}

/// MySQL/MariaDB: a job inside a caller's transaction whose body catches a deadlock (its
/// transaction the victim) and goes on. The server rolled back the caller's whole transaction,
/// and the session runs each later statement on its own. The call must say that the caller's
/// transaction is gone (its rows before the call with it), and that what the body ran after may
/// be committed: `CallersTransactionRolledBack { outside: true }`. Before: a unit job said
/// `TransactionRolledBackInBody`, the job's rollback alone (a caller retrying the call as told ran
/// the job outside any transaction); a value job said "nothing of it was committed" while the
/// body's later row was.
pub fn a_deadlock_the_body_catches_says_the_callers_transaction_is_gone() {
    use crate::backends::Mysql;
    for value in [false, true] {
        let (db, mut conn) = fresh_for_deadlock();
        let caller = with_deadlock_partner(&db, |barrier| {
            conn.transaction::<(), TestError, _>(|conn| {
                write(conn, "caller-before")?;
                let body = |conn: &mut diesel::MysqlConnection| {
                    diesel::sql_query("UPDATE locked SET v = v + 10 WHERE id = 1").execute(conn)?;
                    barrier.wait();
                    // The deadlock, caught.
                    let _ = diesel::sql_query("UPDATE locked SET v = v + 10 WHERE id = 2")
                        .execute(conn);
                    write(conn, "job-after")
                };
                if value {
                    let key = JobKey::new("nested-value:1");
                    let _ran = idempotent_jobs::run(conn, &VALUE, &key, |conn| {
                        body(conn).map(|()| 7_u32)
                    })?;
                } else {
                    let key = JobKey::new("nested-unit:1");
                    let _ran = idempotent_jobs::run(conn, &UNIT, &key, body)?;
                }
                Ok(())
            })
        });
        let kind = if value { "value job" } else { "unit job" };
        let error = match caller {
            Err(TestError::Idempotent(error)) => error,
            other => panic!("{kind}: expected the call's error: {other:?}"),
        };
        assert!(
            matches!(
                error,
                Error::CallersTransactionRolledBack { outside: true, .. }
            ),
            "{kind}: the caller's transaction is gone, and what the body ran after may be committed: {error:?}: {error}"
        );
        assert!(
            error.to_string().contains("may be committed"),
            "{kind}: {error}"
        );
        assert_eq!(count::<Mysql>(&mut conn, "caller-before"), 0, "{kind}");
        assert_eq!(
            count::<Mysql>(&mut conn, "job-after"),
            1,
            "{kind}: the body's row after the deadlock ran on its own"
        );
        assert_eq!(Mysql::count_done(&mut conn), 0, "{kind}: no claim");
    }
}

/// MySQL/MariaDB: a caller catches a deadlock (the server rolled back its whole transaction; the
/// session runs each later statement on its own) and then calls a job, which Diesel still counts
/// as nested. Before, the job ran outside any transaction, its claim and its body's row each
/// committed on their own; the release of its savepoint failed, the claim was taken back, and the
/// call said `TransactionEndedInBody` ("a statement of its body ended the job's transaction"),
/// with the row committed and no claim: the caller's retry ran the job a second time (2 rows).
/// Now opening the job's savepoint finds no transaction open: the job does not run, and the call
/// says the caller's transaction had ended before it, which the caller retries from its start.
pub fn a_job_called_after_the_callers_transaction_died_does_not_run() {
    use crate::backends::Mysql;
    for value in [false, true] {
        let (db, mut conn) = fresh_for_deadlock();
        let kind = if value { "value job" } else { "unit job" };
        let call = |conn: &mut diesel::MysqlConnection| -> Result<(), TestError> {
            if value {
                let key = JobKey::new("nested-value:1");
                let _ran = idempotent_jobs::run(conn, &VALUE, &key, |conn| {
                    write(conn, "job").map(|()| 7_u32)
                })?;
            } else {
                let key = JobKey::new("nested-unit:1");
                let _ran = idempotent_jobs::run(conn, &UNIT, &key, |conn| write(conn, "job"))?;
            }
            Ok(())
        };
        let caller = with_deadlock_partner(&db, |barrier| {
            conn.transaction::<(), TestError, _>(|conn| {
                write(conn, "caller-before")?;
                diesel::sql_query("UPDATE locked SET v = v + 10 WHERE id = 1").execute(conn)?;
                barrier.wait();
                // The deadlock, caught by the caller, which goes on.
                let _ =
                    diesel::sql_query("UPDATE locked SET v = v + 10 WHERE id = 2").execute(conn);
                call(conn)
            })
        });
        said_ended_before_the_call(caller, kind);
        assert_eq!(
            count::<Mysql>(&mut conn, "job"),
            0,
            "{kind}: the job did not run"
        );
        assert_eq!(Mysql::count_done(&mut conn), 0, "{kind}: no claim");
        assert_eq!(count::<Mysql>(&mut conn, "caller-before"), 0, "{kind}");
        // The retry the call asks for: the caller's transaction, from its start, runs the job once.
        let retried = conn.transaction::<(), TestError, _>(|conn| {
            write(conn, "caller-before")?;
            call(conn)
        });
        assert!(retried.is_ok(), "{kind}: {retried:?}");
        assert_eq!(
            count::<Mysql>(&mut conn, "job"),
            1,
            "{kind}: the job ran once"
        );
        assert_eq!(Mysql::count_done(&mut conn), 1, "{kind}: one claim");
        assert_eq!(count::<Mysql>(&mut conn, "caller-before"), 1, "{kind}");
    }
}

/// The error of a job called where the caller's transaction had ended before the call: it says
/// so, and that the job did not run; the caller may retry its transaction.
fn said_ended_before_the_call<T: std::fmt::Debug>(said: Result<T, TestError>, kind: &str) -> Error {
    let error = match said {
        Err(TestError::Idempotent(error)) => error,
        other => panic!("{kind}: expected the call's error: {other:?}"),
    };
    assert!(
        matches!(
            error,
            Error::CallersTransactionRolledBack {
                step: idempotent_jobs::Step::Begin,
                outside: false,
                retryable: true,
                ..
            }
        ),
        "{kind}: the caller's transaction had ended before the call: {error:?}: {error}"
    );
    let text = error.to_string();
    assert!(
        text.contains("before the call") && text.contains("did not run"),
        "{kind}: {text}"
    );
    error
}

/// MySQL/MariaDB: a caller two transactions deep ends its transaction with a statement of its
/// own (`COMMIT`) and calls a job. The job does not run, and the caller's `?` gets the job's error
/// back through both of Diesel's rollbacks: an empty transaction, with Diesel's savepoints of the
/// caller's levels, stands for the caller's, as where a body ended it.
pub fn a_job_called_two_levels_deep_after_the_caller_ended_its_transaction_returns_its_error() {
    use crate::backends::Mysql;
    let db = fresh::<Mysql>();
    let mut conn = db.connect();
    let caller = conn.transaction::<(), TestError, _>(|conn| {
        conn.transaction::<(), TestError, _>(|conn| {
            write(conn, "caller-before")?;
            diesel::sql_query("COMMIT").execute(conn)?;
            let _ran = idempotent_jobs::run(conn, &UNIT, &JobKey::new("nested-unit:1"), |conn| {
                write(conn, "job")
            })?;
            Ok(())
        })
    });
    said_ended_before_the_call(caller, "two levels deep");
    assert_eq!(count::<Mysql>(&mut conn, "job"), 0, "the job did not run");
    assert_eq!(Mysql::count_done(&mut conn), 0, "no claim");
    assert_eq!(
        count::<Mysql>(&mut conn, "caller-before"),
        1,
        "the caller's COMMIT"
    );
}

/// MySQL/MariaDB: the caller is a job of its own (its transaction the deadlock's victim), whose
/// body catches the deadlock and calls another job with `?`. Before, the inner job ran outside any
/// transaction, its row committed and its claim taken back, and the outer job's redelivery ran it
/// again. Now the inner job does not run: the outer call says its transaction was rolled back in
/// its body, no claim is left, and the redelivery runs both jobs once.
pub fn a_job_calling_a_job_after_a_caught_deadlock_runs_neither() {
    use crate::backends::Mysql;
    static OUTER: Job = Job::new("nested_outer", "nested-outer:<n>");
    let (db, mut conn) = fresh_for_deadlock();
    let outer_key = JobKey::new("nested-outer:1");
    let inner = |conn: &mut diesel::MysqlConnection| {
        idempotent_jobs::run(conn, &UNIT, &JobKey::new("nested-unit:1"), |conn| {
            write(conn, "inner")
        })
    };
    let mut inner_said = None;
    let first = with_deadlock_partner(&db, |barrier| {
        idempotent_jobs::run(&mut conn, &OUTER, &outer_key, |conn| {
            write(conn, "outer-before")?;
            diesel::sql_query("UPDATE locked SET v = v + 10 WHERE id = 1").execute(conn)?;
            barrier.wait();
            // The deadlock, caught.
            let _ = diesel::sql_query("UPDATE locked SET v = v + 10 WHERE id = 2").execute(conn);
            let said = inner(conn);
            inner_said = Some(format!("{said:?}"));
            let _ran = said?;
            Ok::<_, TestError>(())
        })
    });
    let inner_said = inner_said.expect("the inner job was called");
    assert!(
        inner_said.contains("CallersTransactionRolledBack") && inner_said.contains("step: Begin"),
        "the inner call says the caller's transaction had ended before it: {inner_said}"
    );
    let said = format!("{first:?}");
    assert!(
        matches!(
            first,
            Err(TestError::Idempotent(
                Error::TransactionRolledBackInBody { .. }
            ))
        ),
        "the outer job's transaction was rolled back in its body: {said}"
    );
    assert_eq!(count::<Mysql>(&mut conn, "inner"), 0, "{said}");
    assert_eq!(count::<Mysql>(&mut conn, "outer-before"), 0, "{said}");
    assert_eq!(Mysql::count_done(&mut conn), 0, "no claim: {said}");
    // The redelivery runs both, once.
    let again = idempotent_jobs::run(&mut conn, &OUTER, &outer_key, |conn| {
        write(conn, "outer-before")?;
        let _ran = inner(conn)?;
        Ok::<_, TestError>(())
    });
    assert!(again.is_ok(), "{again:?}");
    assert_eq!(count::<Mysql>(&mut conn, "inner"), 1);
    assert_eq!(count::<Mysql>(&mut conn, "outer-before"), 1);
    assert_eq!(Mysql::count_done(&mut conn), 2);
}

/// diesel-async's MySQL connection: a caller whose own statement ended its transaction (a raw
/// `COMMIT`: its row before it committed; Diesel still counts the transaction open) calls a job.
/// Opening the job's savepoint finds no transaction open: the job does not run, and the call says
/// the caller's transaction had ended before it (its writes rolled back or committed by the
/// caller's statement). Before the check, the job ran outside any transaction, as in
/// [`a_job_called_after_the_callers_transaction_died_does_not_run`].
#[cfg(feature = "async-mysql")]
pub fn an_async_job_called_after_the_caller_ended_its_transaction_does_not_run() {
    use crate::backends::AsyncMysql;
    use diesel_async::TransactionManager as _;
    type Manager =
        <diesel_async::AsyncMysqlConnection as diesel_async::AsyncConnection>::TransactionManager;
    let db = fresh::<AsyncMysql>();
    let mut c = db.connect();
    let said = c.runtime.block_on(async {
        let conn = &mut c.conn;
        Manager::begin_transaction(conn).await.expect("BEGIN");
        diesel_async::RunQueryDsl::execute(
            diesel::sql_query("INSERT INTO rows_written (tag) VALUES ('caller-before')"),
            conn,
        )
        .await
        .expect("the caller's row");
        // The caller's own statement ends its transaction.
        diesel_async::SimpleAsyncConnection::batch_execute(conn, "COMMIT")
            .await
            .expect("COMMIT");
        let said =
            idempotent_jobs::run_async(conn, &UNIT, &JobKey::new("nested-unit:1"), async |c| {
                diesel_async::RunQueryDsl::execute(
                    diesel::sql_query("INSERT INTO rows_written (tag) VALUES ('job')"),
                    c,
                )
                .await?;
                Ok::<_, TestError>(())
            })
            .await;
        Manager::rollback_transaction(conn)
            .await
            .expect("the caller's rollback, of nothing");
        said
    });
    let error = said_ended_before_the_call(said, "async unit job");
    let text = error.to_string();
    assert!(
        text.contains("committed by the caller's statement") && !text.contains("safe"),
        "what the caller wrote may be committed: a retry is not called safe: {text}"
    );
    assert_eq!(count::<AsyncMysql>(&mut c, "job"), 0, "the job did not run");
    assert_eq!(AsyncMysql::count_done(&mut c), 0, "no claim");
    assert_eq!(
        count::<AsyncMysql>(&mut c, "caller-before"),
        1,
        "the caller's COMMIT"
    );
}

/// SQLite in WAL mode: a job called inside a caller's transaction that read before another
/// connection committed cannot claim: the transaction's snapshot is older than the database
/// (`SQLITE_BUSY_SNAPSHOT`), and no retry of the call inside that transaction can write. Before,
/// the call said "retrying is safe and can succeed" as for any busy claim, and a caller that
/// retried the call (inside) met the same failure. The call now says what the database holds (the
/// enclosing transaction still open, with what it wrote) and which retry can succeed: that
/// transaction's, from its start, which runs the job once.
pub fn a_claim_behind_a_stale_snapshot_says_to_retry_the_enclosing_transaction() {
    use crate::backends::Sqlite;
    let db = fresh::<Sqlite>();
    let (mut conn, mut other) = (db.connect(), db.connect());
    Sqlite::execute(&mut conn, "PRAGMA journal_mode = WAL");
    let key = JobKey::new("nested-unit:1");
    let mut calls = Vec::new();
    let caller = conn.transaction::<(), TestError, _>(|conn| {
        // The caller reads (its snapshot starts) ...
        assert_eq!(count::<Sqlite>(conn, "job"), 0);
        // ... and another worker's job commits after it.
        let _other =
            idempotent_jobs::run(&mut other, &UNIT, &JobKey::new("nested-unit:2"), |conn| {
                write(conn, "other-job")
            })?;
        for _ in 0..2 {
            calls.push(idempotent_jobs::run(conn, &UNIT, &key, |conn| {
                write(conn, "job")
            }));
        }
        Err(TestError::Service("the caller gives up".into()))
    });
    assert!(caller.is_err());
    let first = match &calls[0] {
        Err(TestError::Idempotent(error)) => error,
        other => panic!("the claim behind a stale snapshot: {other:?}"),
    };
    let text = first.to_string();
    assert!(
        matches!(
            first,
            Error::Database {
                retryable: true,
                ..
            }
        ),
        "{first:?}"
    );
    assert!(
        text.contains("enclosing transaction") && text.contains("from its start"),
        "the message says which retry can succeed: {text}"
    );
    assert!(
        calls[1].is_err(),
        "a retry of the call inside the same transaction fails the same way: {:?}",
        calls[1]
    );
    // The retry the message asks for: the enclosing transaction, from its start.
    let retried = conn.transaction::<_, TestError, _>(|conn| {
        write(conn, "caller-before")?;
        idempotent_jobs::run(conn, &UNIT, &key, |conn| write(conn, "job"))
    });
    assert!(matches!(retried, Ok(Outcome::Ran(()))), "{retried:?}");
    assert_eq!(count::<Sqlite>(&mut conn, "job"), 1);
    assert_eq!(count::<Sqlite>(&mut conn, "caller-before"), 1);
    assert_eq!(Sqlite::count_done(&mut conn), 2, "both jobs' claims");
}

/// A job inside a caller's transaction whose body releases the job's savepoint (Diesel's,
/// `diesel_savepoint_1`) and returns `Ok`: what the call says must be what the database holds once
/// the caller's transaction has ended. The job's end releases the mark the runtime set before that
/// savepoint, which the body's release left in place: the job's work and its claim (checked by
/// its record) are in the caller's transaction, the call says it ran, and the caller commits all
/// of it, on every database. Before the mark, PostgreSQL's failed release aborted the caller's
/// whole transaction (`CallersTransactionAborted`, nothing committable), and on SQLite and
/// MySQL/MariaDB the call said `TransactionEndedInBody` ("the work before it was committed", the
/// claim taken back) while the body's work committed with the caller's. (A body that returns
/// `Err` after such a release is rolled back to the mark: `truth::statements_in_a_nested_body_*`.)
pub fn a_body_that_releases_the_jobs_savepoint_is_told_truly<B>()
where
    B: Backend,
    B::Conn: diesel::Connection + JobStore,
    diesel::query_builder::SqlQuery: diesel::query_dsl::methods::ExecuteDsl<B::Conn>,
{
    for value in [false, true] {
        let db = fresh::<B>();
        let mut conn = db.connect();
        let key = JobKey::new("nested-unit:1");
        let mut call = None;
        let mut caller_after = None;
        conn.transaction::<(), TestError, _>(|conn| {
            write(conn, "caller-before")?;
            let body = |conn: &mut B::Conn| {
                write(conn, "job-before")?;
                diesel::sql_query("RELEASE SAVEPOINT diesel_savepoint_1").execute(conn)?;
                write(conn, "job-after")
            };
            call = Some(match value {
                false => idempotent_jobs::run(conn, &UNIT, &key, body).map(drop),
                true => {
                    idempotent_jobs::run(conn, &VALUE, &key, |c| body(c).map(|()| 7u32)).map(drop)
                }
            });
            caller_after = Some(write(conn, "caller-after").is_ok());
            Ok(())
        })
        .expect("the caller's transaction ends without an error of Diesel's");
        let call = call.expect("the call");
        let claimed = B::count_done(&mut conn);
        let rows: Vec<i64> = ["caller-before", "job-before", "job-after", "caller-after"]
            .iter()
            .map(|tag| count::<B>(&mut conn, tag))
            .collect();
        let case = format!("value job {value}: {call:?}, claims {claimed}, rows {rows:?}");
        match &call {
            Ok(()) => {
                assert_eq!(caller_after, Some(true), "the caller goes on: {case}");
                assert_eq!((claimed, rows), (1, vec![1, 1, 1, 1]), "{case}");
            }
            _ => panic!("the call did not say what the database holds: {case}"),
        }
    }
}

/// A job's mark must not outlive it. In a caller's transaction: job A runs, the caller sets a
/// savepoint of its own (`sp`) and writes, then job B's body releases `sp` (taking B's savepoint
/// and mark with it) and fails; the caller goes on past B's error and commits. Before, A's mark
/// stayed to the end of the caller's transaction (only Diesel's savepoint was released), and on
/// PostgreSQL and SQLite, which keep savepoints of the same name side by side, B's rollback found
/// A's mark and said the caller's transaction was back where it called B, with what it wrote
/// before still in it: the caller's write after A was gone with the rollback to A's mark. Now a
/// job's end releases its mark, B finds none, and the runtime rolls the caller's whole
/// transaction back, as the call says.
pub fn a_body_that_takes_a_savepoint_of_the_callers_is_told_truly<B>()
where
    B: Backend,
    B::Conn: diesel::Connection + JobStore,
    diesel::query_builder::SqlQuery: diesel::query_dsl::methods::ExecuteDsl<B::Conn>,
{
    let db = fresh::<B>();
    let mut conn = db.connect();
    let mut second = None;
    let ended = conn.transaction::<(), TestError, _>(|conn| {
        write(conn, "caller-before")?;
        let first = idempotent_jobs::run(conn, &UNIT, &JobKey::new("nested-unit:1"), |c| {
            write(c, "first")
        });
        assert!(matches!(first, Ok(Outcome::Ran(()))), "{first:?}");
        diesel::sql_query("SAVEPOINT sp").execute(conn)?;
        write(conn, "caller-between")?;
        second = Some(idempotent_jobs::run(
            conn,
            &UNIT,
            &JobKey::new("nested-unit:2"),
            |c| {
                write(c, "second")?;
                let _ = diesel::sql_query("RELEASE SAVEPOINT sp").execute(c);
                Err::<(), _>(TestError::Declined)
            },
        ));
        write(conn, "caller-after")?;
        Ok(())
    });
    let second = second.expect("the second call");
    let rows: Vec<i64> = [
        "caller-before",
        "first",
        "caller-between",
        "second",
        "caller-after",
    ]
    .iter()
    .map(|tag| count::<B>(&mut conn, tag))
    .collect();
    let claims = B::count_done(&mut conn);
    let case = format!("second job: {second:?}; caller: {ended:?}; rows {rows:?}, claims {claims}");
    match &second {
        Err(TestError::Idempotent(Error::CallersTransactionRolledBack { .. })) => {
            assert_eq!(
                (&rows[..4], claims),
                (&[0, 0, 0, 0][..], 0),
                "nothing the caller's transaction wrote before the call is committed: {case}"
            );
        }
        _ => panic!("the call did not say what the database holds: {case}"),
    }
}

/// A job two levels inside a caller's transactions (`conn.transaction(|c| c.transaction(..))`)
/// whose body ends them (`COMMIT; BEGIN`): the call says the claim was taken back, and each of
/// the caller's `?` returns the caller's own error. Before, the transaction that stood for the
/// ended one was a bare `BEGIN` while Diesel counted two levels: the inner rollback to Diesel's
/// `diesel_savepoint_1` failed, and Diesel returned that error in place of the caller's.
pub fn a_body_that_ends_a_doubly_nested_callers_transaction_leaves_the_callers_errors_theirs<B>()
where
    B: Backend,
    B::Conn: diesel::Connection + JobStore,
    diesel::query_builder::SqlQuery: diesel::query_dsl::methods::ExecuteDsl<B::Conn>,
{
    let db = fresh::<B>();
    let mut conn = db.connect();
    let mut job = None;
    let mut inner = None;
    let outer = conn.transaction::<(), TestError, _>(|conn| {
        write(conn, "outer")?;
        inner = Some(conn.transaction::<(), TestError, _>(|conn| {
            write(conn, "inner")?;
            let ran = idempotent_jobs::run(conn, &UNIT, &JobKey::new("nested-unit:1"), |c| {
                write(c, "job")?;
                diesel::connection::SimpleConnection::batch_execute(c, "COMMIT; BEGIN")?;
                write(c, "job-after")
            });
            let failed = ran.is_err();
            job = Some(ran);
            match failed {
                true => Err(TestError::Declined),
                false => Ok(()),
            }
        }));
        Err(TestError::Declined)
    });
    let job = job.expect("the call");
    let rows: Vec<i64> = ["outer", "inner", "job", "job-after"]
        .iter()
        .map(|tag| count::<B>(&mut conn, tag))
        .collect();
    let claims = B::count_done(&mut conn);
    let case =
        format!("job {job:?}; inner {inner:?}; outer {outer:?}; rows {rows:?}, claims {claims}");
    assert!(
        matches!(
            job,
            Err(TestError::Idempotent(Error::TransactionEndedInBody { .. }))
        ),
        "{case}"
    );
    assert_eq!((rows, claims), (vec![1, 1, 1, 0], 0), "{case}");
    assert!(
        matches!(inner, Some(Err(TestError::Declined))),
        "the inner `?`: {case}"
    );
    assert!(
        matches!(outer, Err(TestError::Declined)),
        "the outer `?`: {case}"
    );
}

/// A unit job inside a caller's transaction ends with one statement where the database takes a
/// batch (PostgreSQL): the check that its claim is still there and the release of the mark go
/// together, one round trip, where they were two (the result's `UPDATE` as the check, then the
/// release). The claim commits with the caller's transaction, and the call says `Ran`; a second
/// call in the same transaction replays.
pub fn a_nested_unit_job_ends_in_one_statement<B>()
where
    B: Backend,
    B::Conn: diesel::Connection + JobStore,
    diesel::query_builder::SqlQuery: diesel::query_dsl::methods::ExecuteDsl<B::Conn>,
{
    use std::sync::{Arc, Mutex};

    use diesel::connection::InstrumentationEvent;

    let db = fresh::<B>();
    let mut conn = db.connect();
    let key = JobKey::new("nested-unit:1");
    let statements = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&statements);
    conn.set_instrumentation(move |event: InstrumentationEvent<'_>| {
        if let InstrumentationEvent::StartQuery { query, .. } = event {
            seen.lock().expect("statements").push(query.to_string());
        }
    });
    let (mut first, mut second) = (None, None);
    conn.transaction::<(), TestError, _>(|conn| {
        write(conn, "caller-before")?;
        statements.lock().expect("statements").clear();
        first = Some(idempotent_jobs::run(conn, &UNIT, &key, |conn| {
            write(conn, "job")
        }));
        let sent = statements.lock().expect("statements").clone();
        assert!(
            sent.last()
                .is_some_and(|s| s.starts_with("SELECT CAST(CASE WHEN EXISTS")
                    && s.trim_end()
                        .ends_with("RELEASE SAVEPOINT idempotent_enclosing_1")),
            "{sent:?}"
        );
        assert!(
            !sent.iter().any(|s| s.starts_with("UPDATE done_jobs")),
            "{sent:?}"
        );
        assert_eq!(
            sent.len(),
            4,
            "the mark, the claim, the body, the end: {sent:?}"
        );
        second = Some(idempotent_jobs::run(conn, &UNIT, &key, |conn| {
            write(conn, "job")
        }));
        write(conn, "caller-after")?;
        Ok(())
    })
    .expect("the caller commits");
    assert!(matches!(first, Some(Ok(Outcome::Ran(())))), "{first:?}");
    assert!(
        matches!(second, Some(Ok(Outcome::Replayed(())))),
        "{second:?}"
    );
    assert_eq!(B::count_done(&mut conn), 1);
    for tag in ["caller-before", "job", "caller-after"] {
        assert_eq!(count::<B>(&mut conn, tag), 1, "{tag}");
    }
}

/// A job that calls itself with its own key, on the same connection, from inside its body: the
/// inner call is part of the enclosing run. Before, it ran its body bare: an inner call that
/// returned `Err` left its writes to commit with the enclosing run (a retry loop in a handler
/// that calls itself committed every failed attempt's charge), and one with other inputs said
/// `Ran` with a value the key never replays, where the same call at the top is refused. Now the
/// inner call runs in a savepoint of its own (its failure leaves nothing behind) and is refused
/// with `FingerprintMismatch` when its inputs differ.
pub fn a_job_calling_itself_fails_and_differs_as_any_call_does<B>()
where
    B: Backend,
    B::Conn: diesel::Connection + JobStore,
    diesel::query_builder::SqlQuery: diesel::query_dsl::methods::ExecuteDsl<B::Conn>,
{
    use idempotent_jobs::JobCall;
    use idempotent_jobs::fingerprint::Fingerprint;

    static PRICED: Job =
        Job::new("nested_priced", "nested-priced:<n>").fingerprint_inputs(&["amount"]);
    let db = fresh::<B>();
    let mut conn = db.connect();
    let priced = |amount: i64| {
        Fingerprint::builder()
            .input("amount", &amount)
            .finish()
            .expect("a number")
    };
    let key = JobKey::new("nested-priced:1");
    let mut inner_failed = None;
    let mut inner_other = None;
    let outer = JobCall::new(&PRICED, &key)
        .fingerprint(priced(100))
        .run(&mut conn, |conn| {
            write(conn, "outer")?;
            inner_failed = Some(JobCall::new(&PRICED, &key).fingerprint(priced(100)).run(
                conn,
                |conn| {
                    write(conn, "inner-failed")?;
                    Err::<i64, _>(TestError::Declined)
                },
            ));
            inner_other = Some(JobCall::new(&PRICED, &key).fingerprint(priced(999)).run(
                conn,
                |conn| {
                    write(conn, "inner-other")?;
                    Ok::<i64, TestError>(999)
                },
            ));
            Ok::<i64, TestError>(100)
        });
    assert!(matches!(outer, Ok(Outcome::Ran(100))), "{outer:?}");
    assert!(
        matches!(inner_failed, Some(Err(TestError::Declined))),
        "{inner_failed:?}"
    );
    assert_eq!(count::<B>(&mut conn, "outer"), 1);
    assert_eq!(
        count::<B>(&mut conn, "inner-failed"),
        0,
        "the inner call said Err: nothing of it is left"
    );
    assert!(
        matches!(
            inner_other,
            Some(Err(TestError::Idempotent(
                Error::FingerprintMismatch { .. }
            )))
        ),
        "other inputs than the run's: {inner_other:?}"
    );
    assert_eq!(count::<B>(&mut conn, "inner-other"), 0, "nothing ran");
    // At the top, the key replays the enclosing run's value.
    let again = JobCall::new(&PRICED, &key)
        .fingerprint(priced(100))
        .run(&mut conn, |_| Ok::<i64, TestError>(0));
    assert!(matches!(again, Ok(Outcome::Replayed(100))), "{again:?}");
}
