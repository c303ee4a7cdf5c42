//! Sessions with settings of their own: what each call reports must be what the database holds,
//! and a redelivery must behave as the error promised (`is_retryable`).

#![allow(dead_code)]

use std::sync::Barrier;
use std::time::Duration;

use diesel::Connection as _;
use idempotent_jobs::outbox::{self, Relay};
use idempotent_jobs::{Error, Job, JobKey, Outcome};

use crate::backends::Backend;
use crate::handlers::{TestConn, TestError};
use crate::harness::Db;

static UNIT: Job = Job::new("settings_unit", "settings-unit:<n>");
static VALUE: Job = Job::new("settings_value", "settings-value:<n>");
static PUSH: Job = Job::new("settings_push", "settings-push:<n>");

fn unit<C: TestConn>(conn: &mut C, id: &str, sleep_ms: u64) -> Result<Outcome<()>, TestError> {
    idempotent_jobs::run(
        conn,
        &UNIT,
        &JobKey::new(format!("settings-unit:{id}")),
        |c| {
            c.insert_message("unit", id)?;
            std::thread::sleep(Duration::from_millis(sleep_ms));
            Ok(())
        },
    )
}

fn value<C: TestConn>(conn: &mut C, id: &str, sleep_ms: u64) -> Result<Outcome<u32>, TestError> {
    idempotent_jobs::run(
        conn,
        &VALUE,
        &JobKey::new(format!("settings-value:{id}")),
        |c| {
            c.insert_message("value", id)?;
            std::thread::sleep(Duration::from_millis(sleep_ms));
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
        let _ = value(&mut other, "1", 0).expect("the other worker's run");
        call = Some(value(c, "1", 0));
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
            let again = conn.transaction::<_, TestError, _>(|c| value(c, "1", 0));
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

/// Eight workers racing on one key, each session with `innodb_snapshot_isolation = ON`: one runs,
/// the rest replay.
#[cfg(feature = "mysql")]
#[test]
fn mysql_snapshot_isolation_racing_workers_run_once() {
    use crate::backends::Mysql;
    let db = Db::<Mysql>::fresh();
    let barrier = Barrier::new(8);
    let results: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let (db, barrier) = (&db, &barrier);
                scope.spawn(move || {
                    let mut conn = db.connect();
                    Mysql::execute(&mut conn, "SET SESSION innodb_snapshot_isolation = ON");
                    barrier.wait();
                    format!("{:?}", value(&mut conn, "hot", 100))
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("worker")).collect()
    });
    let mut check = db.connect();
    assert_eq!(check.count_topic("value").expect("count"), 1, "{results:?}");
    assert!(
        results.iter().all(|r| r.starts_with("Ok(")),
        "every racing worker runs or replays: {results:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Broad probes: one sync session with a setting, every operation, checked against the database.
// ---------------------------------------------------------------------------------------------

/// Runs every operation on `conn` (which has the setting) and prints what each said beside what
/// `check` (a session without it) finds; returns the lines.
fn probe<B: Backend>(db: &Db<B>, conn: &mut B::Conn, label: &str) -> Vec<String>
where
    B::Conn: TestConn + diesel::Connection,
{
    let mut check = db.connect();
    let mut lines = Vec::new();
    let mut say = |what: &str, said: String, check: &mut B::Conn| {
        let held = format!(
            "done={} unit={} value={} push={} outbox={}",
            B::count_done(check),
            check.count_topic("unit").unwrap_or(-1),
            check.count_topic("value").unwrap_or(-1),
            check.count_topic("push").unwrap_or(-1),
            B::query_i64(check, "SELECT COUNT(*) AS n FROM outbox"),
        );
        let line = format!("{label}: {what}: {said} || held: {held}");
        println!("{line}");
        lines.push(line);
    };
    let describe = |r: Result<String, TestError>| match r {
        Ok(s) => format!("Ok({s})"),
        Err(TestError::Idempotent(e)) => {
            format!("Err(retryable={}, {e}; source: {:?})", e.is_retryable(), std::error::Error::source(&e))
        }
        Err(e) => format!("Err(body: {e})"),
    };
    let r = unit(conn, "1", 0).map(|o| format!("{o:?}"));
    say("unit", describe(r), &mut check);
    let r = unit(conn, "1", 0).map(|o| format!("{o:?}"));
    say("unit again", describe(r), &mut check);
    let r = value(conn, "1", 0).map(|o| format!("{o:?}"));
    say("value", describe(r), &mut check);
    let r = value(conn, "1", 0).map(|o| format!("{o:?}"));
    say("value again", describe(r), &mut check);
    let r = conn
        .transaction::<_, TestError, _>(|c| value(c, "2", 0))
        .map(|o| format!("{o:?}"));
    say("value in caller's transaction", describe(r), &mut check);
    let r = push(conn, "1").map(|o| format!("{o:?}"));
    say("push", describe(r), &mut check);
    let r = Relay::new()
        .run_once(conn, |_| Ok::<_, String>(()))
        .map(|r| format!("{r:?}"))
        .map_err(TestError::from);
    say("relay", describe(r), &mut check);
    let r = idempotent_jobs::keys::forget(conn, &JobKey::new("settings-unit:1"), "probe")
        .map(|b| format!("{b}"))
        .map_err(TestError::from);
    say("forget", describe(r), &mut check);
    let r = unit(conn, "1", 0).map(|o| format!("{o:?}"));
    say("unit after forget", describe(r), &mut check);
    let r = idempotent_jobs::prune(conn, &idempotent_jobs::Prune::default().pace(0))
        .map(|r| format!("{r:?}"))
        .map_err(TestError::from);
    say("prune", describe(r), &mut check);
    lines
}

#[cfg(feature = "mysql")]
#[test]
fn probe_mysql_settings() {
    use crate::backends::Mysql;
    for setting in [
        "SET SESSION sql_safe_updates = 1",
        "SET SESSION sql_safe_updates = 1, sql_select_limit = 1, max_join_size = 1",
        "SET SESSION TRANSACTION READ ONLY",
        "SET SESSION innodb_snapshot_isolation = ON",
        "SET SESSION sql_mode = 'PAD_CHAR_TO_FULL_LENGTH,SIMULTANEOUS_ASSIGNMENT,EMPTY_STRING_IS_NULL,HIGH_NOT_PRECEDENCE,PIPES_AS_CONCAT,NO_BACKSLASH_ESCAPES,ANSI_QUOTES'",
        "SET SESSION sql_mode = ''",
        "SET SESSION transaction_isolation = 'SERIALIZABLE'",
        "SET SESSION time_zone = '+13:00'",
        "SET SESSION max_statement_time = 0.0001",
        "SET SESSION group_concat_max_len = 4, SESSION max_sort_length = 8",
        "SET SESSION unique_checks = 0, foreign_key_checks = 0",
    ] {
        let db = Db::<Mysql>::fresh();
        let mut conn = db.connect();
        if let Err(e) = Mysql::try_execute(&mut conn, setting) {
            println!("{setting}: refused: {e}");
            continue;
        }
        probe::<Mysql>(&db, &mut conn, setting);
    }
}

#[cfg(feature = "postgres")]
#[test]
fn probe_postgres_settings() {
    use crate::backends::Postgres;
    for setting in [
        "SET default_transaction_read_only = on",
        "SET session_replication_role = replica",
        "SET statement_timeout = 1",
        "SET lock_timeout = 1",
        "SET default_transaction_isolation = 'serializable'",
        "SET default_transaction_isolation = 'repeatable read'",
        "SET synchronous_commit = off",
        "SET standard_conforming_strings = off",
        "SET bytea_output = 'escape'",
        "SET IntervalStyle = 'sql_standard'",
        "SET DateStyle = 'SQL, DMY'",
        "SET TimeZone = 'Pacific/Kiritimati'",
        "SET default_transaction_deferrable = on",
        "SET extra_float_digits = -15",
        "SET search_path = pg_catalog",
    ] {
        let db = Db::<Postgres>::fresh();
        let mut conn = db.connect();
        if let Err(e) = Postgres::try_execute(&mut conn, setting) {
            println!("{setting}: refused: {e}");
            continue;
        }
        probe::<Postgres>(&db, &mut conn, setting);
    }
}

#[cfg(feature = "sqlite")]
#[test]
fn probe_sqlite_settings() {
    use crate::backends::Sqlite;
    for setting in [
        "PRAGMA query_only = 1",
        "PRAGMA journal_mode = MEMORY",
        "PRAGMA busy_timeout = 0",
        "PRAGMA foreign_keys = ON",
        "PRAGMA recursive_triggers = ON",
        "PRAGMA synchronous = OFF",
        "PRAGMA reverse_unordered_selects = ON",
        "PRAGMA case_sensitive_like = ON",
        "PRAGMA count_changes = ON",
        "PRAGMA legacy_file_format = ON",
        "PRAGMA ignore_check_constraints = ON",
        "PRAGMA defer_foreign_keys = ON",
        "PRAGMA temp_store = MEMORY",
    ] {
        let db = Db::<Sqlite>::fresh();
        let mut conn = db.connect();
        if let Err(e) = Sqlite::try_execute(&mut conn, setting) {
            println!("{setting}: refused: {e}");
            continue;
        }
        probe::<Sqlite>(&db, &mut conn, setting);
    }
}

/// A forget on a read-only session (PostgreSQL's `default_transaction_read_only`, MySQL's
/// `SET SESSION TRANSACTION READ ONLY`, SQLite's `query_only`) of a key that is done: the row
/// cannot be deleted, so the forget must fail, never say the key was not done.
fn forget_on_a_read_only_session<B: Backend>(setting: &str)
where
    B::Conn: TestConn + diesel::Connection,
{
    let db = Db::<B>::fresh();
    let (mut conn, mut check) = (db.connect(), db.connect());
    let _ = unit(&mut check, "1", 0).expect("the first run");
    B::execute(&mut conn, setting);
    let forgot = idempotent_jobs::keys::forget(&mut conn, &JobKey::new("settings-unit:1"), "probe");
    let done = B::count_done(&mut check);
    let again = unit(&mut check, "1", 0);
    assert!(
        !(matches!(forgot, Ok(false)) && done == 1),
        "broken promise: under `{setting}`, keys::forget of a key that is done said Ok(false) (\"never done, nothing to forget\"), yet done_jobs still holds the key ({done} row) and the next delivery replays: {again:?}"
    );
    if let Ok(true) = forgot {
        assert_eq!(done, 0, "forget said it forgot the key, and the row is there");
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_forget_on_a_read_only_session() {
    forget_on_a_read_only_session::<crate::backends::Postgres>(
        "SET default_transaction_read_only = on",
    );
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_forget_on_a_read_only_session() {
    forget_on_a_read_only_session::<crate::backends::Mysql>("SET SESSION TRANSACTION READ ONLY");
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_forget_on_a_read_only_session() {
    forget_on_a_read_only_session::<crate::backends::Sqlite>("PRAGMA query_only = 1");
}

/// PostgreSQL's `idle_in_transaction_session_timeout` shorter than a pause in the body: the server
/// ends the session, and the job's transaction with it, uncommitted. The call must say nothing
/// was committed and that a retry can succeed (on a new connection), and the next delivery runs.
fn idle_in_transaction_timeout<B: Backend>(value_job: bool, in_callers: bool)
where
    B::Conn: TestConn + diesel::Connection,
{
    let db = Db::<B>::fresh();
    let (mut conn, mut check) = (db.connect(), db.connect());
    B::execute(&mut conn, "SET idle_in_transaction_session_timeout = '200ms'");
    let call: Result<String, TestError> = match (value_job, in_callers) {
        (true, false) => value(&mut conn, "1", 600).map(|o| format!("{o:?}")),
        (false, false) => unit(&mut conn, "1", 600).map(|o| format!("{o:?}")),
        (v, true) => conn
            .transaction::<_, TestError, _>(|c| {
                if v {
                    value(c, "1", 600).map(|o| format!("{o:?}"))
                } else {
                    unit(c, "1", 600).map(|o| format!("{o:?}"))
                }
            }),
    };
    let done = B::count_done(&mut check);
    let topic = if value_job { "value" } else { "unit" };
    let rows = check.count_topic(topic).expect("count");
    let again = if value_job {
        value(&mut check, "1", 0).map(|o| format!("{o:?}"))
    } else {
        unit(&mut check, "1", 0).map(|o| format!("{o:?}"))
    };
    let label = format!("value_job={value_job} in_callers={in_callers}");
    match &call {
        Ok(said) => panic!(
            "broken promise ({label}): the session was ended under the job, yet the call said {said}; held: done={done} rows={rows}"
        ),
        Err(e) => {
            let retryable = job_error(&call).map(Error::is_retryable);
            assert_eq!(
                (done, rows),
                (0, 0),
                "({label}) nothing was committed: {e}"
            );
            assert!(
                retryable == Some(true),
                "broken promise ({label}): the session's idle_in_transaction_session_timeout ended the job's transaction uncommitted (done={done}), and the next delivery runs ({again:?}), yet the call says retrying cannot help: is_retryable={retryable:?}: {e} / {:?}",
                std::error::Error::source(e)
            );
            assert!(
                matches!(again.as_deref(), Ok("Ran(())") | Ok("Ran(7)")),
                "({label}) the next delivery runs: {again:?}"
            );
        }
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_idle_in_transaction_timeout_unit() {
    idle_in_transaction_timeout::<crate::backends::Postgres>(false, false);
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_idle_in_transaction_timeout_value() {
    idle_in_transaction_timeout::<crate::backends::Postgres>(true, false);
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_idle_in_transaction_timeout_unit_in_callers_transaction() {
    idle_in_transaction_timeout::<crate::backends::Postgres>(false, true);
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_idle_in_transaction_timeout_value_in_callers_transaction() {
    idle_in_transaction_timeout::<crate::backends::Postgres>(true, true);
}
