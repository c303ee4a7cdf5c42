//! What a user relies on, written once and run on every connection type (see `main.rs`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Barrier;
use std::time::Duration;

use idempotent_jobs::{JobKey, Outcome};

use crate::backends::Backend;
use crate::handlers::{Mode, Receipt, TestError};
use crate::harness::{self, Db};

/// The rule's check: the second run changes 0 rows in every table, `done_jobs` included, and adds
/// nothing to the outbox; the first run left exactly its effects.
pub fn second_run_changes_nothing<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let before = B::snapshot(&mut conn);

    // Runs the job twice and panics if the second run changed any row of any table.
    let receipt = B::assert_charge_idempotent(&mut conn, "order-1");

    let after = B::snapshot(&mut conn);
    let changes = after.changes_since(&before);
    let changed: Vec<&str> = changes.tables().map(|(table, _)| table).collect();
    assert_eq!(
        changed.len(),
        3,
        "the first run changes charges, done_jobs, outbox: {changes}"
    );
    assert_eq!(after.rows("charges").len(), 1);
    assert_eq!(after.rows("test_outbox").len(), 1);
    assert_eq!(after.rows("done_jobs").len(), 1);
    assert!(after.rows("charges")[0].contains(&receipt.charge_ref));
    assert!(after.rows("done_jobs")[0].contains("charge:order-1"));
}

/// The replay returns the first run's value, not a new one.
pub fn replay_returns_the_stored_result<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let first = B::charge(&mut conn, "order-1", 4200, Mode::Succeed).unwrap();
    let second = B::charge(&mut conn, "order-1", 9999, Mode::Succeed).unwrap();
    assert_eq!(
        second, first,
        "the replay returns the stored receipt, amount included"
    );
    assert_eq!(B::count_charges(&mut conn, "order-1"), 1);
}

/// `Err` rolls back the effects and the claim; a retry runs and leaves exactly one effect.
pub fn error_then_retry_runs_once<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let before = B::snapshot(&mut conn);

    let failed = B::charge(&mut conn, "order-1", 4200, Mode::Fail);
    assert!(matches!(failed, Err(TestError::Declined)), "{failed:?}");
    let changes = B::snapshot(&mut conn).changes_since(&before);
    assert!(
        changes.is_empty(),
        "a failed job leaves nothing:\n{changes}"
    );

    let retried = B::charge(&mut conn, "order-1", 4200, Mode::Succeed).unwrap();
    assert_eq!(B::count_charges(&mut conn, "order-1"), 1);
    assert_eq!(B::count_messages(&mut conn), 1);
    assert_eq!(
        B::charge(&mut conn, "order-1", 4200, Mode::Succeed).unwrap(),
        retried
    );
    assert_eq!(B::count_charges(&mut conn, "order-1"), 1);
}

/// A panic rolls back, leaves the connection outside any transaction, and then unwinds; a retry
/// runs once, and its commit is real (another connection sees it).
pub fn panic_then_retry_runs_once<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let before = B::snapshot(&mut conn);

    let panicked = catch_unwind(AssertUnwindSafe(|| {
        B::charge(&mut conn, "order-1", 4200, Mode::Panic)
    }));
    assert!(panicked.is_err(), "the panic reaches the caller");
    let changes = B::snapshot(&mut conn).changes_since(&before);
    assert!(
        changes.is_empty(),
        "a panicked job leaves nothing:\n{changes}"
    );

    B::charge(&mut conn, "order-1", 4200, Mode::Succeed).unwrap();
    let mut other = db.connect();
    assert_eq!(
        B::count_charges(&mut other, "order-1"),
        1,
        "the retry committed for real: the connection was not left inside a transaction"
    );
    assert_eq!(B::count_done(&mut other), 1);
}

/// A panic after the body, in the result's `Serialize`, rolls the job back and leaves the
/// connection outside any transaction: the next job on it commits for real.
pub fn panic_in_serialize_leaves_no_transaction<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let panicked = catch_unwind(AssertUnwindSafe(|| B::explode_on_store(&mut conn, "1")));
    assert!(panicked.is_err(), "the panic reaches the caller");
    let mut other = db.connect();
    assert_eq!(
        B::count_done(&mut other),
        0,
        "the job rolled back, claim included"
    );
    assert_eq!(B::count_messages(&mut other), 0, "and its effects");

    B::charge(&mut conn, "order-after-panic", 4200, Mode::Succeed)
        .expect("the next job on the same connection");
    assert_eq!(
        B::count_charges(&mut other, "order-after-panic"),
        1,
        "the next job committed for real: the connection was not left inside a transaction"
    );
    assert_eq!(B::count_done(&mut other), 1);
}

/// A panic during a replay, in the stored result's `Deserialize`, leaves the connection outside
/// any transaction: the next job on it commits for real.
pub fn panic_in_replay_decode_leaves_no_transaction<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    assert_eq!(
        B::explode_on_replay(&mut conn, "1").expect("the first run"),
        7
    );
    crate::handlers::REPLAYS_EXPLODE.with(|explode| explode.set(true));
    let panicked = catch_unwind(AssertUnwindSafe(|| B::explode_on_replay(&mut conn, "1")));
    crate::handlers::REPLAYS_EXPLODE.with(|explode| explode.set(false));
    assert!(panicked.is_err(), "the panic reaches the caller");

    B::charge(&mut conn, "order-after-panic", 4200, Mode::Succeed)
        .expect("the next job on the same connection");
    let mut other = db.connect();
    assert_eq!(
        B::count_charges(&mut other, "order-after-panic"),
        1,
        "the next job committed for real: the connection was not left inside a transaction"
    );
    assert_eq!(B::count_done(&mut other), 2);
}

/// Eight workers with their own connections deliver one job at once: one runs, seven wait and
/// replay, and all eight return the same receipt.
pub fn racing_workers_run_once<B: Backend>() {
    const WORKERS: usize = 8;
    let db = Db::<B>::fresh();
    let barrier = Barrier::new(WORKERS);
    let results: Vec<Result<Receipt, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (db, barrier) = (&db, &barrier);
                scope.spawn(move || {
                    let mut conn = db.connect();
                    barrier.wait();
                    B::charge(&mut conn, "hot-order", 4200, Mode::Succeed)
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker thread"))
            .collect()
    });
    let receipts: Vec<Receipt> = results
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("a racing worker failed: {e}")))
        .collect();
    assert!(receipts.iter().all(|r| *r == receipts[0]), "{receipts:?}");
    let mut conn = db.connect();
    assert_eq!(B::count_charges(&mut conn, "hot-order"), 1);
    assert_eq!(B::count_messages(&mut conn), 1);
    assert_eq!(B::count_done(&mut conn), 1);
}

/// The environment variable that turns a re-run of this test binary into the crashing worker.
const CRASH_CHILD: &str = "IDEMPOTENT_TEST_CRASH_CHILD";
const COMMITTED: &str = "IDEMPOTENT-TEST: committed, now waiting to be killed before the ack";

/// A worker commits the job and is killed (SIGKILL) before it acknowledges; the redelivery replays,
/// and exactly one effect exists.
///
/// `test_path` is this test's libtest name; the parent runs it again in a child process.
pub fn crash_between_commit_and_ack<B: Backend>(test_path: &str) {
    if let Ok(locator) = std::env::var(CRASH_CHILD) {
        // The child: do the job, report the commit, then hang where the ack would be sent.
        let db = Db::<B>::attach(&locator);
        let mut conn = db.connect();
        B::charge(&mut conn, "order-crash", 4200, Mode::Succeed).expect("the child's job");
        println!("{COMMITTED}");
        std::thread::sleep(Duration::from_secs(600));
        std::process::exit(3); // not reached: the parent kills us first
    }

    let db = Db::<B>::fresh();
    let child = harness::spawn_child_until(test_path, &[(CRASH_CHILD, db.locator())], COMMITTED);
    harness::kill(child);

    let mut conn = db.connect();
    assert_eq!(
        B::count_charges(&mut conn, "order-crash"),
        1,
        "the killed worker's commit holds"
    );
    let outcome = B::charge_outcome(&mut conn, "order-crash").unwrap();
    assert!(
        outcome.is_replayed(),
        "the redelivered job replays: {outcome:?}"
    );
    assert_eq!(
        B::count_charges(&mut conn, "order-crash"),
        1,
        "exactly one effect"
    );
    assert_eq!(B::count_messages(&mut conn), 1);
}

/// Values that contain the template's separator do not collide: `("a:b", "c")` and `("a", "b:c")`
/// are two jobs, each done once.
pub fn separators_inside_values_keep_keys_apart<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    for _ in 0..2 {
        B::pair(&mut conn, "a:b", "c").unwrap();
        B::pair(&mut conn, "a", "b:c").unwrap();
    }
    assert_eq!(
        B::count_messages(&mut conn),
        2,
        "two distinct jobs, each ran once"
    );
    let keys: Vec<String> = B::done_rows(&mut conn)
        .into_iter()
        .map(|row| row.0)
        .collect();
    assert_eq!(keys, ["pair:a%3Ab:c", "pair:a:b%3Ac"]);
}

/// A key already claimed by another job is an error, not a silent skip, and changes nothing.
pub fn another_jobs_key_is_an_error<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::charge(&mut conn, "order-1", 4200, Mode::Succeed).unwrap();
    let before = B::snapshot(&mut conn);
    let error = B::refund(&mut conn, "order-1").unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(
            error,
            TestError::Idempotent(idempotent_jobs::Error::KeyClaimedByOtherJob { .. })
        ),
        "{message}"
    );
    assert!(
        message.contains("`refund`") && message.contains("`charge`"),
        "{message}"
    );
    let changes = B::snapshot(&mut conn).changes_since(&before);
    assert!(changes.is_empty(), "{changes}");
}

/// The test kit's snapshot tells apart every two values of a column: its `assert_idempotent`
/// passes a job only if no row changed, so a change it cannot see lets a job that is not
/// idempotent pass. Before: MySQL/MariaDB `BIT` and spatial columns were cast to text, every byte
/// that is not UTF-8 read as `?` (`BIT(8)` 128 and 130 alike: a counter bumped outside the job's
/// transaction passed the kit); PostgreSQL's `float8` followed the session's own
/// `extra_float_digits` (at -15, 0.1 and 0.11 alike).
pub fn a_snapshot_sees_every_change<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let cases: &[(&str, &str, &str, &str)] = match B::SERVER {
        crate::harness::Server::Mysql => &[
            ("BIT(8)", "b'10000000'", "b'10000010'", ""),
            ("BIT(16)", "b'1000000010000000'", "b'1000000110000001'", ""),
            (
                "POINT",
                "POINT(1.1, 2.2)",
                "POINT(1.1, 2.2000000000000006)",
                "",
            ),
        ],
        crate::harness::Server::Postgres => {
            &[("float8", "0.1", "0.11", "SET extra_float_digits = -15")]
        }
        crate::harness::Server::Sqlite => &[],
    };
    for (i, (ty, old, new, session)) in cases.iter().enumerate() {
        let table = format!("kit_{i}");
        B::execute(
            &mut conn,
            &format!("CREATE TABLE {table} (id INT PRIMARY KEY, v {ty})"),
        );
        B::execute(&mut conn, &format!("INSERT INTO {table} VALUES (1, {old})"));
        if !session.is_empty() {
            B::execute(&mut conn, session);
        }
        let before = B::snapshot(&mut conn);
        B::execute(
            &mut conn,
            &format!("UPDATE {table} SET v = {new} WHERE id = 1"),
        );
        let changes = B::snapshot(&mut conn).changes_since(&before);
        assert!(
            !changes.is_empty(),
            "{ty} from {old} to {new} ({session}): the snapshot saw no change"
        );
    }
    // Columns whose names or sizes the snapshot's own SQL met: on PostgreSQL a column named `t`
    // (the row's alias there, which the column took: only it was compared); on MySQL a value
    // whose hex is past `max_allowed_packet` (16 MiB by default: `HEX` read NULL, every such
    // value alike), and a row whose values together are (the whole row read NULL: the snapshot
    // failed).
    let sized: &[(&str, &str, &str)] = match B::SERVER {
        crate::harness::Server::Mysql => &[
            (
                "CREATE TABLE kit_big_0 (id INT PRIMARY KEY, v LONGBLOB)",
                "INSERT INTO kit_big_0 VALUES (1, REPEAT('a', 9000000))",
                "UPDATE kit_big_0 SET v = CONCAT(v, 'x')",
            ),
            (
                "CREATE TABLE kit_big_1 (id INT PRIMARY KEY, a LONGTEXT, b LONGTEXT)",
                "INSERT INTO kit_big_1 VALUES (1, REPEAT('a', 9000000), REPEAT('b', 9000000))",
                "UPDATE kit_big_1 SET b = CONCAT(b, 'x')",
            ),
        ],
        crate::harness::Server::Postgres => &[(
            "CREATE TABLE kit_named_t (id INT PRIMARY KEY, t TEXT, amount INT)",
            "INSERT INTO kit_named_t VALUES (1, 'credit', 100)",
            "UPDATE kit_named_t SET amount = amount + 10",
        )],
        crate::harness::Server::Sqlite => &[],
    };
    for (create, insert, update) in sized {
        B::execute(&mut conn, create);
        B::execute(&mut conn, insert);
        let before = B::snapshot(&mut conn);
        B::execute(&mut conn, update);
        assert!(
            !B::snapshot(&mut conn).changes_since(&before).is_empty(),
            "{create}: the snapshot saw no change of `{update}`"
        );
    }
    // Tables of each kind a job may write to. MariaDB lists a system-versioned table as
    // `SYSTEM VERSIONED`, not `BASE TABLE`: the kit did not read it, and passed a job that wrote
    // to one twice.
    let kinds: &[&str] = match B::SERVER {
        crate::harness::Server::Mysql => {
            &["CREATE TABLE kit_kind_0 (id INT PRIMARY KEY, v INT) WITH SYSTEM VERSIONING"]
        }
        crate::harness::Server::Postgres => &[
            "CREATE UNLOGGED TABLE kit_kind_0 (id INT PRIMARY KEY, v INT)",
            "CREATE TABLE kit_kind_1 (id INT PRIMARY KEY, v INT) PARTITION BY RANGE (id); \
             CREATE TABLE kit_kind_1_all PARTITION OF kit_kind_1 FOR VALUES FROM (0) TO (100)",
        ],
        crate::harness::Server::Sqlite => &[
            "CREATE TABLE kit_kind_0 (id INT PRIMARY KEY, v INT) WITHOUT ROWID",
            "CREATE TABLE kit_kind_1 (id INT PRIMARY KEY, v INT) STRICT",
        ],
    };
    for (i, create) in kinds.iter().enumerate() {
        B::execute(&mut conn, create);
        let before = B::snapshot(&mut conn);
        B::execute(
            &mut conn,
            &format!("INSERT INTO kit_kind_{i} VALUES (1, 1)"),
        );
        assert!(
            !B::snapshot(&mut conn).changes_since(&before).is_empty(),
            "{create}: the snapshot saw no row inserted"
        );
    }
    if B::SERVER == crate::harness::Server::Postgres {
        // The session's own setting is as it was, after snapshots outside a transaction.
        let setting = "SELECT CAST(current_setting('extra_float_digits') AS BIGINT) AS n";
        assert_eq!(B::query_i64(&mut conn, setting), -15);
        // Inside a transaction whose setting is `LOCAL`: a snapshot that set its own and put back
        // what it read made that a session setting, for good.
        #[cfg(feature = "postgres")]
        if let Some(pg) =
            (&mut conn as &mut dyn std::any::Any).downcast_mut::<diesel::PgConnection>()
        {
            use diesel::Connection as _;
            use diesel::connection::SimpleConnection as _;
            pg.batch_execute("SET extra_float_digits = 1").expect("set");
            pg.transaction(|pg| {
                pg.batch_execute("SET LOCAL extra_float_digits = -15")?;
                let before = idempotent_jobs::testing::Snapshot::take(pg)?;
                pg.batch_execute("UPDATE kit_0 SET v = 0.12 WHERE id = 1")?;
                let changes = idempotent_jobs::testing::Snapshot::take(pg)?.changes_since(&before);
                assert!(!changes.is_empty(), "inside a transaction too");
                diesel::QueryResult::Ok(())
            })
            .expect("the transaction");
            assert_eq!(
                B::query_i64(&mut conn, setting),
                1,
                "the LOCAL setting ended with its transaction"
            );
        }
    }
}

/// A stored result that no longer decodes (the result type changed) is a clear error, not a panic,
/// and the job does not run again.
pub fn undecodable_stored_result_is_an_error<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::charge(&mut conn, "order-1", 4200, Mode::Succeed).unwrap();
    let before = B::snapshot(&mut conn);
    let error = B::charge_v2(&mut conn, "order-1").unwrap_err();
    assert!(
        matches!(
            error,
            TestError::Idempotent(idempotent_jobs::Error::ReplayDecode { .. })
        ),
        "{error}"
    );
    assert!(error.to_string().contains("no longer decodes"), "{error}");
    let changes = B::snapshot(&mut conn).changes_since(&before);
    assert!(changes.is_empty(), "{changes}");
}

/// Inside a transaction the caller opened, the job's claim commits and rolls back with it.
pub fn claims_join_the_callers_transaction<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let rolled_back = B::charge_in_transaction(&mut conn, "order-1", false);
    assert!(
        matches!(rolled_back, Err(TestError::Declined)),
        "{rolled_back:?}"
    );
    assert_eq!(B::count_charges(&mut conn, "order-1"), 0);
    assert_eq!(
        B::count_done(&mut conn),
        0,
        "the claim rolled back with the caller"
    );

    assert_eq!(
        B::charge_in_transaction(&mut conn, "order-1", true).unwrap(),
        1
    );
    assert_eq!(B::count_charges(&mut db.connect(), "order-1"), 1);
    assert!(
        B::charge_outcome(&mut conn, "order-1")
            .unwrap()
            .is_replayed()
    );
}

/// The outcome of the plain function API tells a run from a replay.
pub fn outcome_tells_ran_from_replayed<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let key = JobKey::builder().text("plain:").value(7).build().unwrap();
    assert_eq!(
        B::plain(&mut conn, &key, Some(42)).unwrap(),
        Outcome::Ran(42)
    );
    assert_eq!(
        B::plain(&mut conn, &key, None).unwrap(),
        Outcome::Replayed(42)
    );
    let fresh = B::charge_outcome(&mut conn, "order-2").unwrap();
    assert!(fresh.is_ran(), "{fresh:?}");
    assert!(
        B::charge_outcome(&mut conn, "order-2")
            .unwrap()
            .is_replayed()
    );
}

/// The plain API wrapped around the annotated handler, with the same job and key: the inner call
/// runs inside the outer claim, once, and a redelivery replays the outer run.
pub fn a_job_inside_its_own_body_runs_once<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let first = B::charge_wrapped(&mut conn, "order-1").unwrap();
    assert!(first.is_ran(), "{first:?}");
    let again = B::charge_wrapped(&mut conn, "order-1").unwrap();
    assert_eq!(again, Outcome::Replayed(first.into_inner()));
    assert_eq!(B::count_charges(&mut conn, "order-1"), 1);
    assert_eq!(B::count_done(&mut conn), 1);
}

/// Values that try to break keys: each claims its own key, replays it, and changes no other
/// key's fate; SQL-shaped values are stored verbatim, as bound parameters.
pub fn hostile_values_claim_and_replay<B: Backend>() {
    const INJECTION: &str = "'; DROP TABLE done_jobs; --";
    let megabyte_of_x = "x".repeat(1 << 20);
    let megabyte_of_separators = ":%".repeat(1 << 19);
    let values: Vec<&str> = vec![
        "",
        "\0",
        "a\0b",
        ":",
        "a:b",
        "%",
        "%3A",
        "%%25",
        "\n",
        "\r\n\t",
        INJECTION,
        "\" OR 1=1 --",
        "Robert'); DROP TABLE charges;--",
        "\\'\\\"",
        "😀",
        "é",
        "e\u{301}",
        "\u{202E}gnp.exe",
        "\u{FEFF}",
        "\u{10FFFF}",
        &megabyte_of_x,
        &megabyte_of_separators,
    ];
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    for round in 0..2 {
        for value in &values {
            let length =
                B::hostile(&mut conn, value).unwrap_or_else(|e| panic!("{value:.40?}: {e}"));
            assert_eq!(length, value.len(), "round {round}: {value:.40?}");
        }
    }
    assert_eq!(
        B::count_messages(&mut conn),
        values.len() as i64,
        "each value ran once"
    );
    assert_eq!(
        B::count_done(&mut conn),
        values.len() as i64,
        "each value has a key of its own"
    );
    let keys: Vec<String> = B::done_rows(&mut conn)
        .into_iter()
        .map(|row| row.0)
        .collect();
    assert!(
        keys.contains(&format!("hostile:{INJECTION}")),
        "SQL-shaped text is stored verbatim"
    );
    assert!(
        keys.contains(&"hostile:a%00b".to_owned()),
        "NUL is escaped in the readable key"
    );
    assert!(keys.iter().all(|k| !k.contains('\0')));
}

/// `()` results store nothing (a NULL result column) and replay as `()`.
pub fn unit_results_store_nothing<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::pair(&mut conn, "x", "y").unwrap();
    B::pair(&mut conn, "x", "y").unwrap();
    let stored: Vec<Option<String>> = B::done_rows(&mut conn)
        .into_iter()
        .map(|row| row.2)
        .collect();
    assert_eq!(stored, [None]);
}

/// `assert_rerun_after_crash` whose `connect` opens a new database each time (`:memory:`): the
/// rerun's connection sees nothing of the first run, and the kit says so. Before, it said the job
/// was not idempotent ("its rerun after the crash changed rows", listing the first run's own
/// rows), of a job that is.
#[cfg(feature = "sqlite")]
#[test]
fn a_rerun_after_a_crash_on_another_database_is_told_apart() {
    use diesel::{Connection as _, RunQueryDsl as _, SqliteConnection};

    static MARK: idempotent_jobs::Job = idempotent_jobs::Job::new("mark", "mark:<n>");
    let connect = || {
        let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
        idempotent_jobs::migrate(&mut conn).expect("the runtime's tables");
        diesel::sql_query("CREATE TABLE marks (n INTEGER NOT NULL)")
            .execute(&mut conn)
            .expect("the table");
        conn
    };
    let job = |conn: &mut SqliteConnection| {
        idempotent_jobs::run(conn, &MARK, &JobKey::new("mark:1"), |conn| {
            diesel::sql_query("INSERT INTO marks (n) VALUES (1)")
                .execute(conn)
                .map(drop)
                .map_err(TestError::from)
        })
    };
    let told = catch_unwind(AssertUnwindSafe(|| {
        let _replayed = idempotent_jobs::testing::assert_rerun_after_crash(connect, job);
    }))
    .expect_err("the kit fails it");
    let told = told.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        told.contains("must reach the same database") && !told.contains("not idempotent"),
        "{told}"
    );
}
