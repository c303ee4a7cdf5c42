//! Sessions with settings of their own: what each call reports must be what the database holds,
//! and a redelivery must behave as the error promised (`is_retryable`).

use std::sync::Barrier;
use std::time::Duration;

use diesel::Connection as _;
use idempotent_jobs::outbox::{self, Relay};
use idempotent_jobs::{Error, Job, JobKey, Outcome};

use crate::backends::Backend as _;
use crate::handlers::{TestConn, TestError};
use crate::harness::Db;

static VALUE: Job = Job::new("settings_value", "settings-value:<n>");
static PUSH: Job = Job::new("settings_push", "settings-push:<n>");

fn value<C: TestConn>(conn: &mut C, id: &str) -> Result<Outcome<u32>, TestError> {
    idempotent_jobs::run(
        conn,
        &VALUE,
        &JobKey::new(format!("settings-value:{id}")),
        |c| {
            c.insert_message("value", id)?;
            Ok(7)
        },
    )
}

fn push<C: TestConn>(conn: &mut C, id: &str) -> Result<Outcome<String>, TestError> {
    idempotent_jobs::run(
        conn,
        &PUSH,
        &JobKey::new(format!("settings-push:{id}")),
        |c| {
            c.insert_message("push", id)?;
            Ok(outbox::push(c, "settings", &id)?)
        },
    )
}

fn job_error<T: std::fmt::Debug>(result: &Result<T, TestError>) -> Option<&Error> {
    match result {
        Err(TestError::Idempotent(error)) => Some(error),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// MariaDB: `innodb_snapshot_isolation = ON` (a session variable since 10.6.18/10.11.8, the default
// from 11.6): at REPEATABLE READ a locking read or a write that meets a row committed after the
// transaction's read view fails with 1020 "Record has changed since last read ...; try restarting
// transaction". It passes: the transaction restarted sees the row.
// ---------------------------------------------------------------------------------------------

/// A job called inside a caller's transaction that read first (its read view starts), after
/// another worker committed the same key: without the setting the claim replays; with it the claim
/// meets 1020, which a restart of the caller's transaction gets past.
#[cfg(feature = "mysql")]
#[test]
fn mysql_snapshot_isolation_claim_in_a_callers_transaction_is_retryable() {
    use crate::backends::Mysql;
    let db = Db::<Mysql>::fresh();
    let (mut conn, mut other, mut check) = (db.connect(), db.connect(), db.connect());
    Mysql::execute(&mut conn, "SET SESSION innodb_snapshot_isolation = ON");
    let mut call = None;
    let caller = conn.transaction::<(), TestError, _>(|c| {
        c.count_messages()?; // the caller's read view starts
        c.insert_message("caller", "before the call")?;
        let _ = value(&mut other, "1").expect("the other worker's run");
        call = Some(value(c, "1"));
        Ok(())
    });
    let call = call.expect("the call ran");
    let rows = check.count_topic("value").expect("count");
    assert_eq!(rows, 1, "the body ran once: {call:?}");
    let callers = check.count_topic("caller").expect("count");
    if let Some(error @ Error::CallersTransactionRolledBack { .. }) = job_error(&call) {
        assert_eq!(
            callers, 0,
            "broken promise: the call said the whole enclosing transaction was rolled back, nothing it wrote before the call committed ({error}); yet the caller's row written before the call is committed (the caller's transaction went on and committed: {caller:?})"
        );
    }
    match &call {
        Ok(Outcome::Replayed(7)) => {}
        Ok(other) => panic!("a call that did not run its body said {other:?}"),
        Err(_) => {
            let error = job_error(&call).expect("the runtime's error");
            // The caller's transaction, retried from its start, replays: the condition passes.
            let again = conn.transaction::<_, TestError, _>(|c| value(c, "1"));
            assert!(
                matches!(again, Ok(Outcome::Replayed(7))),
                "a restart of the enclosing transaction: {again:?}"
            );
            assert!(
                error.is_retryable(),
                "broken promise: with innodb_snapshot_isolation = ON, a claim inside a caller's transaction that meets a key another worker committed after the caller's read view fails with 1020 (\"try restarting transaction\"), and a restart of the caller's transaction replays ({again:?}); yet the error says retrying cannot help (is_retryable() = false), so a worker dead-letters a job that would replay. Caller: {caller:?}. Error: {error}"
            );
        }
    }
}

/// Two relays draining one outbox at once, each session with `innodb_snapshot_isolation = ON`: a
/// lease reads its candidates (its read view starts), then locks them, by which time the other
/// relay may have leased and committed some; 1020 there passes as a lock wait does.
#[cfg(feature = "mysql")]
#[test]
fn mysql_snapshot_isolation_two_relays_never_stop_for_good() {
    use crate::backends::Mysql;
    let db = Db::<Mysql>::fresh();
    let mut conn = db.connect();
    for n in 0..300 {
        let _ = push(&mut conn, &n.to_string()).expect("a push");
    }
    let barrier = Barrier::new(2);
    let results: Vec<Result<usize, Error>> = std::thread::scope(|scope| {
        let relays: Vec<_> = (0..2)
            .map(|_| {
                let (db, barrier) = (&db, &barrier);
                scope.spawn(move || {
                    let mut conn = db.connect();
                    Mysql::execute(&mut conn, "SET SESSION innodb_snapshot_isolation = ON");
                    barrier.wait();
                    let mut delivered = 0;
                    let relay = Relay::new().batch_size(3);
                    loop {
                        let report = relay.run_once(&mut conn, |_| {
                            std::thread::sleep(Duration::from_millis(1));
                            Ok::<_, String>(())
                        })?;
                        delivered += report.delivered as usize;
                        if report.leased == 0 {
                            return Ok(delivered);
                        }
                    }
                })
            })
            .collect();
        relays.into_iter().map(|r| r.join().expect("relay")).collect()
    });
    for result in &results {
        if let Err(error) = result {
            assert!(
                error.is_retryable(),
                "broken promise: with innodb_snapshot_isolation = ON, two relays racing on one outbox: a relay round stopped with an error that says running the relay again cannot help (is_retryable() = false), though the failure (1020, \"Record has changed since last read ...; try restarting transaction\") passes: {error} / source: {:?}",
                std::error::Error::source(error)
            );
        }
    }
}
