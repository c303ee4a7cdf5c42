//! Sync MySQL opens a job's transaction with the job's savepoint, and releases the savepoint
//! with the `COMMIT`, in one prepared `CALL` each: the stored procedures of schema version 4
//! (`idempotent-runtime/sql/mysql/004_job_procedures.sql`), the first of which inserts the job's
//! claim too. A job of one statement then takes 3 round trips, one fewer than a hand-written
//! `BEGIN`, claim, statement, `COMMIT`. Where the procedures are missing (dropped, never made by a role that
//! could not create routines, or not callable by this role), or vanish while a job runs, jobs
//! lose nothing: they go the way of the statements of their own. Its own test binary: whether the
//! procedures are called is process-wide, and one test walks through the cases in order.

use diesel::connection::SimpleConnection as _;
use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

#[path = "support/figures.rs"]
mod figures;

diesel::table! {
    procedure_effects (id) {
        id -> BigInt,
        order_id -> Text,
    }
}

#[derive(Debug, thiserror::Error)]
enum TestError {
    #[error(transparent)]
    Idempotent(#[from] idempotent_jobs::Error),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
    #[error(transparent)]
    Connection(#[from] diesel::ConnectionError),
    #[error("the body refused")]
    Refused,
}

/// The URL of the test's database, for what a body does on a connection of its own.
static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Writes its effect, then runs `own` on the job's connection (DDL commits the job's transaction
/// on MySQL) and `aside` on a connection of its own.
#[idempotent_job(key = "procedures:<order_id>")]
fn charge(
    conn: &mut MysqlConnection,
    order_id: &str,
    own: &str,
    aside: &str,
) -> Result<(), TestError> {
    diesel::insert_into(procedure_effects::table)
        .values(procedure_effects::order_id.eq(order_id))
        .execute(conn)?;
    if !own.is_empty() {
        conn.batch_execute(own)?;
    }
    if !aside.is_empty() {
        MysqlConnection::establish(URL.get().expect("the URL"))?.batch_execute(aside)?;
    }
    Ok(())
}

fn n(conn: &mut MysqlConnection, sql: &str) -> i64 {
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query(sql)
        .get_result::<N>(conn)
        .unwrap_or_else(|e| panic!("`{sql}`: {e}"))
        .n
}

fn status(conn: &mut MysqlConnection, name: &str) -> i64 {
    n(
        conn,
        &format!(
            "SELECT CAST(VARIABLE_VALUE AS SIGNED) AS n FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = '{name}'"
        ),
    )
}

fn effects(conn: &mut MysqlConnection, order_id: &str) -> i64 {
    procedure_effects::table
        .filter(procedure_effects::order_id.eq(order_id))
        .count()
        .get_result(conn)
        .expect("a count")
}

fn procedures(conn: &mut MysqlConnection) -> i64 {
    n(
        conn,
        "SELECT COUNT(*) AS n FROM information_schema.routines WHERE routine_schema = DATABASE() AND routine_name LIKE 'idempotent\\_%'",
    )
}

/// Round trips (statements the server counts for this session: the sync client waits for each
/// answer; a procedure's own statements are not counted) and procedure calls of one job, less
/// the two status reads' own.
fn sent(conn: &mut MysqlConnection, order_id: &str) -> (i64, i64) {
    let before = (
        status(conn, "QUESTIONS"),
        status(conn, "COM_CALL_PROCEDURE"),
    );
    charge(conn, order_id, "", "").expect("a job");
    (
        status(conn, "QUESTIONS") - before.0 - 2,
        status(conn, "COM_CALL_PROCEDURE") - before.1,
    )
}

#[test]
fn jobs_use_the_procedures_and_lose_nothing_without_them() {
    let base = std::env::var("IDEMPOTENT_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let mut admin = MysqlConnection::establish(&base).unwrap_or_else(|e| {
        panic!(
            "MariaDB/MySQL is not reachable at {base}: {e}\nStart it with `start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd` (scripts/test does this), or point IDEMPOTENT_MYSQL_URL at a server."
        )
    });
    let database = format!("procedures_{}", std::process::id());
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .expect("a database");
    let (server, _) = base.rsplit_once('/').expect("a database in the URL");
    let url = format!("{server}/{database}");
    URL.set(url.clone()).expect("set once");
    let result = std::panic::catch_unwind(|| walk_through(&url, &database, &mut admin_of(&base)));
    let _ = admin.batch_execute(&format!("DROP DATABASE {database}"));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

fn admin_of(base: &str) -> MysqlConnection {
    MysqlConnection::establish(base).expect("an admin connection")
}

fn walk_through(url: &str, database: &str, admin: &mut MysqlConnection) {
    let mut conn = MysqlConnection::establish(url).expect("a connection");
    idempotent_jobs::migrate(&mut conn).expect("migrations");
    assert_eq!(
        procedures(&mut conn),
        3,
        "migrate made the three procedures"
    );
    conn.batch_execute(
        "CREATE TABLE procedure_effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id VARCHAR(100) NOT NULL)",
    )
    .expect("the effects table");

    // With the procedures: each statement is prepared on its first use, so a job and its replay
    // first, then the counts.
    charge(&mut conn, "warm-up", "", "").expect("a job");
    charge(&mut conn, "warm-up", "", "").expect("its replay");
    let (fresh, fresh_calls) = sent(&mut conn, "a");
    let (replay, replay_calls) = sent(&mut conn, "a");
    figures::report(&format!(
        "sync MySQL with the job procedures: a job of one statement {fresh} round trips ({fresh_calls} CALLs), its replay through the claim {replay} ({replay_calls} CALLs)"
    ));
    assert_eq!(
        (fresh, fresh_calls),
        (3, 2),
        "CALL begin-and-claim, the body's statement, CALL finish"
    );
    assert_eq!(
        (replay, replay_calls),
        (2, 1),
        "CALL begin-and-claim (the key's duplicate, rolled back in the procedure), the row's read"
    );
    assert_eq!(effects(&mut conn, "a"), 1, "ran once, replayed once");

    // Adversarial cases that need the procedures present (see `adversarial`).
    adversarial(url, &mut conn);

    // The finish procedure dropped while a job runs: the release and the commit go one after
    // the other, and the job commits once.
    charge(&mut conn, "b", "", "DROP PROCEDURE idempotent_finish_job")
        .expect("a job whose finish procedure vanished");
    charge(&mut conn, "b", "", "").expect("its replay");
    assert_eq!(effects(&mut conn, "b"), 1, "committed once, replayed");

    // Without them (a role that may not create routines migrated, or they were dropped): the
    // savepoint and its release go as statements of their own.
    admin
        .batch_execute(&format!(
            "DROP PROCEDURE {database}.idempotent_begin_job; DROP PROCEDURE {database}.idempotent_begin_and_claim"
        ))
        .expect("drop the begin procedures");
    charge(&mut conn, "warm-up-2", "", "").expect("a job without procedures");
    let (fresh, calls) = sent(&mut conn, "c");
    figures::report(&format!(
        "sync MySQL without the job procedures: a job of one statement {fresh} round trips"
    ));
    assert_eq!(
        (fresh, calls),
        (6, 0),
        "BEGIN, SAVEPOINT, claim, statement, RELEASE, COMMIT"
    );
    charge(&mut conn, "c", "", "").expect("its replay");
    assert_eq!(effects(&mut conn, "c"), 1);
    // A failing job leaves nothing; DDL in the body still ends the job's transaction where the
    // runtime notices: the claim is taken back and a retry runs.
    let error = charge(
        &mut conn,
        "d",
        "CREATE TABLE IF NOT EXISTS procedure_probe (id INT)",
        "",
    )
    .expect_err("the transaction ended in the body");
    assert!(
        matches!(
            error,
            TestError::Idempotent(idempotent_jobs::Error::TransactionEndedInBody { .. })
        ),
        "{error}"
    );
    charge(&mut conn, "d", "", "").expect("a retry runs");
    charge(&mut conn, "d", "", "").expect("and replays");
    assert_eq!(
        effects(&mut conn, "d"),
        2,
        "the run before the DDL committed its effect, as the error says; the retry ran once more"
    );

    // A role that may create tables but not routines migrates a new database: the procedures'
    // step is recorded with a warning, and its jobs run without them.
    let (server, _) = url.rsplit_once('/').expect("a database in the URL");
    let other = format!("{database}_norout");
    let user = format!("norout_{}", std::process::id());
    admin
        .batch_execute(&format!(
            "CREATE DATABASE {other};
             CREATE USER '{user}'@'%';
             GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, INDEX, DROP ON {other}.* TO '{user}'@'%';"
        ))
        .expect("a role without CREATE ROUTINE");
    let after_scheme = server.find("://").map_or(0, |i| i + 3);
    let host = server[after_scheme..]
        .rsplit_once('@')
        .map_or(&server[after_scheme..], |(_, h)| h);
    let restricted = MysqlConnection::establish(&format!("mysql://{user}@{host}/{other}"));
    let outcome = restricted.map_err(|e| e.to_string()).and_then(|mut worker| {
        let migrated = idempotent_jobs::migrate(&mut worker).map_err(|e| e.to_string());
        let versions = n(&mut worker, "SELECT COUNT(*) AS n FROM idempotent_schema");
        let made = procedures(&mut worker);
        worker
            .batch_execute(
                "CREATE TABLE procedure_effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id VARCHAR(100) NOT NULL)",
            )
            .map_err(|e| e.to_string())?;
        let ran = charge(&mut worker, "e", "", "").map_err(|e| e.to_string());
        let replayed = charge(&mut worker, "e", "", "").map_err(|e| e.to_string());
        Ok((migrated, versions, made, ran, replayed, effects(&mut worker, "e")))
    });
    let _ = admin.batch_execute(&format!("DROP USER '{user}'@'%'; DROP DATABASE {other}"));
    let (migrated, versions, made, ran, replayed, done) = outcome.expect("the restricted role");
    migrated.expect("migrate without CREATE ROUTINE");
    assert_eq!(
        (versions, made),
        (4, 0),
        "every step recorded, no procedure made"
    );
    ran.expect("a job without procedures");
    replayed.expect("its replay");
    assert_eq!(done, 1);
}

// ---------------------------------------------------------------------------------------------
// Adversarial cases: hostile keys, session settings, bodies that end the job's transaction
// themselves, nesting, races, lock waits and over-long job names.
// ---------------------------------------------------------------------------------------------

diesel::table! {
    adv_effects (id) {
        id -> BigInt,
        tag -> Text,
    }
}

/// Set: the next body of `adv` that runs with `then = "race"` fails.
static RACE_FAIL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes its effect (tagged), runs `own` on the job's connection, then does what `then` says:
/// `err` returns the body's own error, `panic` panics, `dup` swallows a unique violation of its
/// own, `sleep` holds the key for two seconds. Returns 42, which a replay must give back.
#[idempotent_job(key = "adv:<k>")]
fn adv(
    conn: &mut MysqlConnection,
    k: &str,
    tag: &str,
    own: &str,
    then: &str,
) -> Result<i64, TestError> {
    diesel::insert_into(adv_effects::table)
        .values(adv_effects::tag.eq(tag))
        .execute(conn)?;
    if !own.is_empty() {
        conn.batch_execute(own)?;
    }
    match then {
        "err" => return Err(TestError::Refused),
        "panic" => panic!("the body panics"),
        "dup" => {
            conn.batch_execute(&format!("INSERT INTO adv_unique (tag) VALUES ('{tag}')"))?;
            let again =
                conn.batch_execute(&format!("INSERT INTO adv_unique (tag) VALUES ('{tag}')"));
            assert!(again.is_err(), "the duplicate is refused");
        }
        "sleep" => std::thread::sleep(std::time::Duration::from_secs(2)),
        "race" => {
            std::thread::sleep(std::time::Duration::from_millis(100));
            if RACE_FAIL.swap(false, std::sync::atomic::Ordering::SeqCst) {
                return Err(TestError::Refused);
            }
        }
        _ => {}
    }
    Ok(42)
}

/// Meets the other side of a deadlock here (see the walk-through's deadlock case).
static DEADLOCK_MEET: std::sync::OnceLock<std::sync::Barrier> = std::sync::OnceLock::new();

/// Locks row 1 of `adv_deadlock`, meets the other connection (which holds row 2 and wants row 1),
/// then asks for row 2: a deadlock whose victim (the lighter transaction) is the job's. The body
/// swallows the error, writes once more, and returns `Ok`.
#[idempotent_job(key = "deadlock:<k>")]
fn deadlocking(conn: &mut MysqlConnection, k: &str) -> Result<String, TestError> {
    diesel::insert_into(adv_effects::table)
        .values(adv_effects::tag.eq(k))
        .execute(conn)?;
    conn.batch_execute("UPDATE adv_deadlock SET v = v + 1 WHERE id = 1")?;
    DEADLOCK_MEET.get().expect("the barrier").wait();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let swallowed = conn
        .batch_execute("UPDATE adv_deadlock SET v = v + 1 WHERE id = 2")
        .map_err(|e| e.to_string());
    diesel::insert_into(adv_effects::table)
        .values(adv_effects::tag.eq(format!("{k}-after")))
        .execute(conn)?;
    Ok(format!("{swallowed:?}"))
}

const ADV_TABLES: &str = "CREATE TABLE adv_effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, tag VARBINARY(64) NOT NULL);
     CREATE TABLE adv_unique (tag VARBINARY(64) PRIMARY KEY);
     CREATE TABLE key_probe (id BIGINT AUTO_INCREMENT PRIMARY KEY, job_key LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL)";

fn tagged(conn: &mut MysqlConnection, tag: &str) -> i64 {
    adv_effects::table
        .filter(adv_effects::tag.eq(tag))
        .count()
        .get_result(conn)
        .expect("a count")
}

fn calls(conn: &mut MysqlConnection) -> i64 {
    status(conn, "COM_CALL_PROCEDURE")
}

#[derive(QueryableByName)]
struct Stored {
    #[diesel(sql_type = diesel::sql_types::Text)]
    job_key: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    unfinished: i64,
}

/// The key's row as stored: its readable key, whether its result is unrecorded.
fn stored(conn: &mut MysqlConnection, key: &idempotent_jobs::JobKey) -> Option<Stored> {
    diesel::sql_query(
        "SELECT CAST(job_key AS CHAR CHARACTER SET utf8mb4) AS job_key, \
         CAST(result IS NOT NULL AND result = '' AS SIGNED) AS unfinished \
         FROM done_jobs WHERE key_digest = ?",
    )
    .bind::<diesel::sql_types::Binary, _>(key.digest().to_vec())
    .get_results::<Stored>(conn)
    .expect("the key's row")
    .into_iter()
    .next()
}

/// What a plain prepared `INSERT` of `text` into a `LONGTEXT utf8mb4_bin` column on `conn` stores
/// (or its error), read back on `check`.
fn probe_insert(
    conn: &mut MysqlConnection,
    check: &mut MysqlConnection,
    text: &str,
) -> Result<String, String> {
    #[derive(QueryableByName)]
    struct T {
        #[diesel(sql_type = diesel::sql_types::Text)]
        t: String,
    }
    diesel::sql_query("INSERT INTO key_probe (job_key) VALUES (?)")
        .bind::<diesel::sql_types::Text, _>(text)
        .execute(conn)
        .map_err(|e| e.to_string())?;
    let t = diesel::sql_query(
        "SELECT CAST(job_key AS CHAR CHARACTER SET utf8mb4) AS t FROM key_probe ORDER BY id DESC LIMIT 1",
    )
    .get_result::<T>(check)
    .map_err(|e| e.to_string())?
    .t;
    Ok(t)
}

fn fresh(url: &str, settings: &str) -> MysqlConnection {
    let mut conn = MysqlConnection::establish(url).expect("a connection");
    if !settings.is_empty() {
        conn.batch_execute(settings)
            .unwrap_or_else(|e| panic!("`{settings}`: {e}"));
    }
    conn
}

fn is_ended(result: &Result<i64, TestError>) -> bool {
    matches!(
        result,
        Err(TestError::Idempotent(
            idempotent_jobs::Error::TransactionEndedInBody { .. }
        ))
    )
}

fn is_rolled_back(result: &Result<i64, TestError>) -> bool {
    matches!(
        result,
        Err(TestError::Idempotent(
            idempotent_jobs::Error::TransactionRolledBackInBody { .. }
        ))
    )
}

/// The adversarial cases that need the procedures: run by the walk-through before it drops them.
fn adversarial(url: &str, check: &mut MysqlConnection) {
    check.batch_execute(ADV_TABLES).expect("the tables");

    // 1. Hostile keys through `idempotent_begin_and_claim`: the stored key is the key's readable
    // text, as a plain `INSERT` stores it; keys differing in trailing spaces or case are distinct.
    let mut c = fresh(url, "");
    adv(&mut c, "warm", "warm", "", "").expect("warm-up");
    let big = "x".repeat(5 << 20);
    let hostile: Vec<(&str, &str)> = vec![
        (big.as_str(), "big"),
        ("🦀💥𝄞 ￿ \u{10FFFF}", "emoji"),
        ("a\0b\x07\r\n\t\x7f\u{85}c", "control"),
        ("", "empty"),
        (" ", "space1"),
        ("  ", "space2"),
        ("k", "k"),
        ("k ", "k-space"),
        ("k  ", "k-space2"),
        ("K", "K"),
        ("k\u{a0}", "k-nbsp"),
        ("ß", "eszett"),
        ("ss", "ss"),
        ("'; DROP TABLE done_jobs; --", "sql"),
    ];
    for (k, tag) in &hostile {
        let before = calls(&mut c);
        assert_eq!(adv(&mut c, k, tag, "", "").expect("a hostile key runs"), 42);
        assert_eq!(
            calls(&mut c) - before,
            2,
            "{tag}: begin-and-claim and finish"
        );
        let key = adv::key(k);
        let row = stored(check, &key).unwrap_or_else(|| panic!("{tag}: the claim is committed"));
        assert_eq!(row.job_key, key.readable(), "{tag}: the stored key");
        assert_eq!(
            Ok(row.job_key.clone()),
            probe_insert(check, &mut fresh(url, ""), &key.readable()),
            "{tag}: as a plain INSERT stores it"
        );
        assert_eq!(row.unfinished, 0, "{tag}: the result is recorded");
        let record = idempotent_jobs::keys::lookup(check, &key)
            .expect("lookup")
            .expect("a record");
        assert_eq!(record.key, key.readable(), "{tag}: lookup");
    }
    for (k, tag) in &hostile {
        assert_eq!(adv(&mut c, k, tag, "", "").expect("a replay"), 42);
        assert_eq!(tagged(check, tag), 1, "{tag}: ran once, replayed once");
    }
    assert_eq!(
        n(
            check,
            "SELECT COUNT(*) AS n FROM done_jobs WHERE job_name = 'adv'"
        ),
        hostile.len() as i64 + 1,
        "every hostile key is a job of its own"
    );

    // 2. Session settings.
    let committed = |check: &mut MysqlConnection, k: &str, tag: &str| {
        (
            stored(check, &adv::key(k)).map(|r| r.unfinished),
            tagged(check, tag),
        )
    };
    for (i, settings) in [
        "SET SESSION sql_mode = ''",
        "SET SESSION sql_mode = 'ANSI_QUOTES,NO_BACKSLASH_ESCAPES,PIPES_AS_CONCAT,PAD_CHAR_TO_FULL_LENGTH'",
        "SET SESSION sql_mode = 'ORACLE'",
        "SET time_zone = '+05:00'",
        "SET time_zone = '-11:00'",
        "SET SESSION autocommit = 0",
        "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        "SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED",
        "SET SESSION completion_type = 'CHAIN'",
        "SET SESSION autocommit = 0; SET SESSION completion_type = 'CHAIN'",
        "SET NAMES utf8mb4 COLLATE utf8mb4_general_ci",
        "SET SESSION collation_connection = 'utf8mb4_unicode_ci'",
        "SET SESSION div_precision_increment = 0; SET SESSION max_sort_length = 8",
        "SET @idempotent_jobs_sql_mode = 'garbage'",
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = fresh(url, settings);
        let k = format!("session-{i} 🦀");
        let tag = format!("session-{i}");
        let before = calls(&mut c);
        assert_eq!(adv(&mut c, &k, &tag, "", "").map_err(|e| e.to_string()), Ok(42), "{settings}");
        assert_eq!(calls(&mut c) - before, 2, "{settings}: the procedures");
        assert_eq!(committed(check, &k, &tag), (Some(0), 1), "{settings}: committed, seen from another session");
        assert_eq!(adv(&mut c, &k, &tag, "", "").map_err(|e| e.to_string()), Ok(42), "{settings}: replay");
        let failed = adv(&mut c, &format!("{k} err"), &format!("{tag}e"), "", "err");
        assert!(matches!(failed, Err(TestError::Refused)), "{settings}: {failed:?}");
        assert_eq!(committed(check, &format!("{k} err"), &format!("{tag}e")), (None, 0), "{settings}: a failed job left nothing");
        assert_eq!(stored(check, &adv::key(&k)).map(|r| r.job_key), Some(adv::key(&k).readable().into_owned()), "{settings}: the key as given");
        let record = idempotent_jobs::keys::lookup(check, &adv::key(&k)).expect("lookup").expect("a record");
        let age = std::time::SystemTime::now()
            .duration_since(record.done_at)
            .unwrap_or_else(|e| e.duration());
        assert!(age < std::time::Duration::from_secs(120), "{settings}: done_at is UTC ({age:?} off)");
    }

    // `autocommit = 0` with a write of the caller's pending before the job: the job's
    // `START TRANSACTION` commits it (as the fallback's `BEGIN` does); the job is committed.
    let mut c = fresh(url, "SET SESSION autocommit = 0");
    c.batch_execute("INSERT INTO adv_effects (tag) VALUES ('pending-before')")
        .expect("pending");
    assert_eq!(
        adv(&mut c, "pending", "pending", "", "").expect("a job"),
        42
    );
    assert_eq!(committed(check, "pending", "pending"), (Some(0), 1));
    figures::report(&format!(
        "autocommit = 0, a write pending before a job that ran: seen committed by another session: {}",
        tagged(check, "pending-before")
    ));
    c.batch_execute("INSERT INTO adv_effects (tag) VALUES ('pending-before-err')")
        .expect("pending");
    let failed = adv(&mut c, "pending-err", "pending-err", "", "err");
    assert!(matches!(failed, Err(TestError::Refused)), "{failed:?}");
    assert_eq!(
        committed(check, "pending-err", "pending-err"),
        (None, 0),
        "the failed job left nothing"
    );
    figures::report(&format!(
        "autocommit = 0, a write pending before a job that failed: seen committed by another session: {}",
        tagged(check, "pending-before-err")
    ));
    drop(c);

    // A read-only session: the claim is refused, nothing is committed; read-write again, it runs.
    let mut c = fresh(url, "SET SESSION TRANSACTION READ ONLY");
    let refused = adv(&mut c, "read-only", "read-only", "", "");
    assert!(
        matches!(
            &refused,
            Err(TestError::Idempotent(
                idempotent_jobs::Error::Database { .. }
            ))
        ),
        "{refused:?}"
    );
    assert_eq!(committed(check, "read-only", "read-only"), (None, 0));
    c.batch_execute("SET SESSION TRANSACTION READ WRITE")
        .expect("read-write");
    assert_eq!(
        adv(&mut c, "read-only", "read-only", "", "").expect("runs"),
        42
    );
    assert_eq!(committed(check, "read-only", "read-only"), (Some(0), 1));

    // Character sets of the client (observed; see the ignored test for the latin1 case).
    for (i, settings) in [
        "SET NAMES latin1",
        "SET NAMES utf8mb3",
        "SET SESSION sql_mode = ''; SET NAMES utf8mb3",
        "SET character_set_client = 'binary'",
        "SET NAMES cp1251",
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = fresh(url, settings);
        let k = format!("charset-{i} é🦀");
        let tag = format!("charset-{i}");
        let probe = probe_insert(&mut c, check, &adv::key(&k).readable());
        let ran = adv(&mut c, &k, &tag, "", "").map_err(|e| e.to_string());
        let row = stored(check, &adv::key(&k));
        let replay = adv(&mut c, &k, &tag, "", "").map_err(|e| e.to_string());
        figures::report(&format!(
            "{settings}: job {ran:?}, stored key {:?}, a plain INSERT stored {probe:?}, replay {replay:?}",
            row.as_ref().map(|r| r.job_key.clone())
        ));
        assert_eq!(ran, replay, "{settings}: the replay is the run's");
        match ran {
            Ok(_) => {
                assert_eq!(committed(check, &k, &tag), (Some(0), 1), "{settings}");
                assert_eq!(
                    row.map(|r| r.job_key).ok_or_else(String::new),
                    probe,
                    "{settings}: as a plain INSERT stores it"
                );
            }
            Err(_) => {
                assert!(probe.is_err(), "{settings}: a plain INSERT is refused too");
                assert_eq!(
                    committed(check, &k, &tag),
                    (None, 0),
                    "{settings}: refused, nothing"
                );
            }
        }
    }

    // 3. Bodies that end the job's transaction, fail, panic or swallow errors.
    for (own, then, ends) in [
        ("COMMIT", "", "ended"),
        ("ROLLBACK", "", "rolled back"),
        ("START TRANSACTION", "", "ended"),
        ("BEGIN", "", "ended"),
        ("CREATE TABLE IF NOT EXISTS adv_probe (id INT)", "", "ended"),
        ("TRUNCATE TABLE adv_unique", "", "ended"),
        ("LOCK TABLES adv_effects WRITE", "", "ended"),
        ("SET autocommit = 0; SET autocommit = 1", "", "ended"),
        ("RELEASE SAVEPOINT idempotent_job", "", "rolled back"),
        (
            "ROLLBACK TO SAVEPOINT idempotent_job; RELEASE SAVEPOINT idempotent_job",
            "",
            "rolled back",
        ),
        ("CALL idempotent_finish_job()", "", "ended"),
        ("COMMIT", "err", "ended"),
        ("COMMIT", "panic", "ended"),
        ("ROLLBACK", "err", "rolled back"),
        ("START TRANSACTION; SAVEPOINT idempotent_job", "", "ran"),
        ("CALL idempotent_begin_job()", "", "ran"),
        ("SAVEPOINT idempotent_job", "", "ran"),
        ("SAVEPOINT other; ROLLBACK TO SAVEPOINT other", "", "ran"),
        ("", "dup", "ran"),
        ("", "err", "failed"),
        ("", "panic", "failed"),
    ] {
        let mut c = fresh(url, "");
        let k = format!("body {own} {then}");
        let tag = format!("b{:x}", fxhash(&k));
        let before = calls(&mut c);
        // A panic goes on unwinding once the job has ended: seen here as the body's own error.
        let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            adv(&mut c, &k, &tag, own, then)
        })) {
            Ok(result) => result,
            Err(_) => Err(TestError::Refused),
        };
        let own_error = matches!(result, Err(TestError::Refused)) && !then.is_empty();
        let _ = c.batch_execute("UNLOCK TABLES");
        assert!(
            calls(&mut c) - before >= 1,
            "{own}/{then}: the procedure opened the job"
        );
        let row = stored(check, &adv::key(&k)).map(|r| r.unfinished);
        let effects = tagged(check, &tag);
        let got = (
            result.as_ref().map_err(ToString::to_string).copied(),
            row,
            effects,
        );
        match ends {
            // What the body did before the statement was committed; the claim was taken back.
            "ended" => assert!(
                (is_ended(&result) || own_error) && row.is_none() && effects == 1,
                "{own}/{then}: {got:?}"
            ),
            // Nothing of the job's transaction was committed.
            "rolled back" => assert!(
                (is_rolled_back(&result) || own_error) && row.is_none() && effects == 0,
                "{own}/{then}: {got:?}"
            ),
            "failed" => assert!(
                matches!(result, Err(TestError::Refused)) && row.is_none() && effects == 0,
                "{own}/{then}: {got:?}"
            ),
            _ => assert!(
                matches!(result, Ok(42)) && row == Some(0) && effects == 1,
                "{own}/{then}: {got:?}"
            ),
        }
        // Whatever happened, a retry finishes the key and a replay returns its result.
        let mut c = fresh(url, "");
        assert_eq!(
            adv(&mut c, &k, &tag, "", "").map_err(|e| e.to_string()),
            Ok(42),
            "{own}/{then}: the retry"
        );
        assert_eq!(
            adv(&mut c, &k, &tag, "", "").map_err(|e| e.to_string()),
            Ok(42),
            "{own}/{then}: the replay"
        );
        assert_eq!(
            stored(check, &adv::key(&k)).map(|r| r.unfinished),
            Some(0),
            "{own}/{then}"
        );
    }
    assert_eq!(
        n(
            check,
            "SELECT COUNT(*) AS n FROM adv_unique WHERE tag LIKE 'b%'"
        ),
        1,
        "the body that swallowed its unique violation committed its first insert"
    );

    // 4. A job inside the caller's transaction: a savepoint, no procedure; the caller's commit or
    // rollback decides.
    let mut c = fresh(url, "");
    let before = calls(&mut c);
    c.transaction::<_, TestError, _>(|c| {
        assert_eq!(adv(c, "nested-commit", "nested-commit", "", "")?, 42);
        Ok(())
    })
    .expect("committed");
    assert_eq!(calls(&mut c) - before, 0, "nested: no procedure");
    assert_eq!(
        committed(check, "nested-commit", "nested-commit"),
        (Some(0), 1)
    );
    let rolled = c.transaction::<(), TestError, _>(|c| {
        assert_eq!(adv(c, "nested-rollback", "nested-rollback", "", "")?, 42);
        Err(TestError::Refused)
    });
    assert!(matches!(rolled, Err(TestError::Refused)));
    assert_eq!(
        committed(check, "nested-rollback", "nested-rollback"),
        (None, 0)
    );
    let before = calls(&mut c);
    assert_eq!(
        adv(&mut c, "nested-rollback", "nested-rollback", "", "").expect("the retry runs"),
        42
    );
    assert_eq!(calls(&mut c) - before, 2, "top level again: the procedures");
    assert_eq!(
        committed(check, "nested-rollback", "nested-rollback"),
        (Some(0), 1)
    );
    // A job that fails inside the caller's transaction rolls back to its savepoint only.
    c.transaction::<_, TestError, _>(|c| {
        diesel::insert_into(adv_effects::table)
            .values(adv_effects::tag.eq("nested-outer"))
            .execute(c)?;
        assert!(matches!(
            adv(c, "nested-err", "nested-err", "", "err"),
            Err(TestError::Refused)
        ));
        Ok(())
    })
    .expect("the caller commits");
    assert_eq!(
        (
            tagged(check, "nested-outer"),
            committed(check, "nested-err", "nested-err")
        ),
        (1, (None, 0))
    );

    // 7. Lock waits: another connection holds the key (its body sleeps) while this one, with a
    // lock wait timeout of 1 s, claims it through the procedure: it retries and replays, or gives
    // up; its body never runs, and the key is finished once.
    let holder_url = url.to_owned();
    let holder = std::thread::spawn(move || {
        let mut h = fresh(&holder_url, "");
        adv(&mut h, "held", "held", "", "sleep").map_err(|e| e.to_string())
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut c = fresh(url, "SET SESSION innodb_lock_wait_timeout = 1");
    let before = calls(&mut c);
    let waited = adv(&mut c, "held", "held-waiter", "", "");
    let waiter_calls = calls(&mut c) - before;
    assert_eq!(holder.join().expect("the holder"), Ok(42));
    figures::report(&format!(
        "a claim with innodb_lock_wait_timeout = 1 behind a run of 2 s: {:?} after {waiter_calls} CALLs",
        waited.as_ref().map_err(ToString::to_string)
    ));
    assert!(
        waiter_calls >= 2,
        "the waiter's claim went through the procedure"
    );
    assert!(matches!(waited, Ok(42)), "{waited:?}");
    assert_eq!(
        (tagged(check, "held"), tagged(check, "held-waiter")),
        (1, 0)
    );
    assert_eq!(committed(check, "held", "held"), (Some(0), 1));

    // A deadlock the body swallows: the database rolled the job's transaction back (with its
    // savepoint); the call says so, nothing of it is committed, and the retry runs.
    check
        .batch_execute(
            "CREATE TABLE adv_deadlock (id INT PRIMARY KEY, v INT NOT NULL);
             INSERT INTO adv_deadlock VALUES (1, 0), (2, 0);
             CREATE TABLE adv_heavy (id INT PRIMARY KEY, v INT NOT NULL);
             INSERT INTO adv_heavy SELECT seq, 0 FROM seq_1_to_500",
        )
        .expect("the deadlock's tables");
    DEADLOCK_MEET
        .set(std::sync::Barrier::new(2))
        .expect("set once");
    let other_url = url.to_owned();
    let other = std::thread::spawn(move || {
        let mut o = fresh(&other_url, "");
        o.batch_execute("BEGIN; UPDATE adv_heavy SET v = v + 1; UPDATE adv_deadlock SET v = v + 10 WHERE id = 2")
            .expect("the other side's locks");
        DEADLOCK_MEET.get().expect("the barrier").wait();
        let got = o.batch_execute("UPDATE adv_deadlock SET v = v + 10 WHERE id = 1");
        o.batch_execute("COMMIT").expect("the other side commits");
        got.map_err(|e| e.to_string())
    });
    let mut c = fresh(url, "");
    let before = calls(&mut c);
    let result = deadlocking(&mut c, "dl").map_err(|e| e.to_string());
    let used = calls(&mut c) - before;
    let other = other.join().expect("the other side");
    let row = stored(check, &deadlocking::key("dl")).map(|r| r.unfinished);
    let (effects, after) = (tagged(check, "dl"), tagged(check, "dl-after"));
    figures::report(&format!(
        "a deadlock the body swallowed: {result:?} ({used} CALLs; the other side {other:?}); row {row:?}, effects {effects}, written after the deadlock {after}"
    ));
    assert!(used >= 1, "the procedure opened the job");
    match &result {
        Ok(_) => assert_eq!(
            (row, effects, after),
            (Some(0), 1, 1),
            "Ok: all of it committed"
        ),
        Err(message) => {
            assert!(message.contains("rolled back"), "{message}");
            assert_eq!(
                (row, effects),
                (None, 0),
                "nothing of the job's transaction"
            );
        }
    }

    // The connection dies while the body runs (wait_timeout of 1 s, a body of 2 s): an error,
    // nothing committed, and a retry on a new connection runs.
    let mut c = fresh(url, "SET SESSION wait_timeout = 1");
    let result = adv(&mut c, "timeout", "timeout", "", "sleep").map_err(|e| e.to_string());
    figures::report(&format!(
        "the connection closed by wait_timeout while the body ran: {result:?}"
    ));
    assert!(result.is_err(), "{result:?}");
    assert_eq!(
        committed(check, "timeout", "timeout"),
        (None, 0),
        "nothing committed"
    );
    let mut c = fresh(url, "");
    assert_eq!(
        adv(&mut c, "timeout", "timeout", "", "").expect("the retry"),
        42
    );
    assert_eq!(committed(check, "timeout", "timeout"), (Some(0), 1));

    // A CALL the server refuses for its arguments (a 4-byte character where the client's
    // character set has none), in a session with `autocommit = 0` and a write of the caller's
    // pending: the job is refused, nothing of it committed; what became of the caller's write
    // is reported (the fallback's `BEGIN` would have committed it before its INSERT failed).
    let mut c = fresh(url, "SET SESSION autocommit = 0");
    c.batch_execute("INSERT INTO adv_effects (tag) VALUES ('pending-charset')")
        .expect("pending");
    c.batch_execute("SET NAMES utf8mb3").expect("utf8mb3");
    let result = adv(&mut c, "pending 🦀", "pending-charset-job", "", "");
    assert!(result.is_err(), "{result:?}");
    assert_eq!(tagged(check, "pending-charset-job"), 0);
    figures::report(&format!(
        "autocommit = 0, a write pending, a CALL refused for its key's characters: the caller's write seen committed by another session: {}, still seen by its own session: {}",
        tagged(check, "pending-charset"),
        tagged(&mut c, "pending-charset")
    ));
    drop(c);
    // 6. A job name longer than `done_jobs.job_name` (255 characters) is a compile error
    // (tests/ui/fail/args_name_too_long.rs): no session's `sql_mode` can cut it short.
}

fn fxhash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Runs `f` in a database of its own (migrated, with the adversarial tables), dropped after.
fn with_database(suffix: &str, f: impl FnOnce(&str, &mut MysqlConnection)) {
    let base = std::env::var("IDEMPOTENT_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let mut admin = MysqlConnection::establish(&base).expect("MariaDB/MySQL reachable");
    let database = format!("procedures_{}_{suffix}", std::process::id());
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .expect("a database");
    let (server, _) = base.rsplit_once('/').expect("a database in the URL");
    let url = format!("{server}/{database}");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut check = MysqlConnection::establish(&url).expect("a connection");
        idempotent_jobs::migrate(&mut check).expect("migrations");
        check.batch_execute(ADV_TABLES).expect("the tables");
        f(&url, &mut check);
    }));
    let _ = admin.batch_execute(&format!("DROP DATABASE {database}"));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// Case 5: connections racing one key: exactly one body's effect is committed, every caller gets the
/// result (or the one whose body failed, its error), and the key is finished. The procedures may
/// or may not be called here (the walk-through drops its own for a minute, process-wide): both
/// ways must hold.
#[test]
fn racing_claims_commit_one_run() {
    with_database("race", |url, check| {
        for round in 0..6 {
            let k = format!("race-{round}");
            let fail_one = round % 2 == 1;
            RACE_FAIL.store(fail_one, std::sync::atomic::Ordering::SeqCst);
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
            let threads: Vec<_> = (0..6)
                .map(|_| {
                    let (url, k, barrier) = (url.to_owned(), k.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        let mut c = fresh(&url, "");
                        barrier.wait();
                        adv(&mut c, &k, &k, "", "race").map_err(|e| e.to_string())
                    })
                })
                .collect();
            let results: Vec<_> = threads
                .into_iter()
                .map(|t| t.join().expect("a thread"))
                .collect();
            let ok = results.iter().filter(|r| **r == Ok(42)).count();
            assert_eq!(
                ok,
                if fail_one { 5 } else { 6 },
                "round {round}: {results:?}"
            );
            assert_eq!(tagged(check, &k), 1, "round {round}: one run committed");
            assert_eq!(
                stored(check, &adv::key(&k)).map(|r| r.unfinished),
                Some(0),
                "round {round}"
            );
        }
    });
}

/// A body that rolls back to the job's savepoint (`ROLLBACK TO SAVEPOINT idempotent_job`) and
/// returns `Ok`. `idempotent_begin_and_claim` sets the savepoint after the claim, so the claim
/// stays and the job commits what the body left; where the claim came after the savepoint (the
/// statements' path), the record of the result finds this run's claim gone and nothing is
/// committed. Either way no `Ran` without its claim (it used to be: the record matched no row,
/// and a retry ran the body again).
#[test]
fn body_rolling_back_to_the_jobs_savepoint_is_not_reported_as_ran() {
    with_database("rbsp", |url, check| {
        let mut c = fresh(url, "");
        let before = calls(&mut c);
        let first = adv(
            &mut c,
            "rbsp",
            "rbsp",
            "ROLLBACK TO SAVEPOINT idempotent_job",
            "",
        )
        .map_err(|e| e.to_string());
        assert_eq!(
            calls(&mut c) - before,
            2,
            "the procedures opened and closed the job"
        );
        let row = stored(check, &adv::key("rbsp")).map(|r| r.unfinished);
        let second = adv(&mut c, "rbsp", "rbsp-retry", "", "").map_err(|e| e.to_string());
        let retried = tagged(check, "rbsp-retry");
        assert!(
            first.is_err() || row == Some(0),
            "reported {first:?}, but the key's row is {row:?}; then a retry {second:?} ran the body {retried} time(s)"
        );
    });
}

/// A body that switches the connection's default database (`USE`): the record `UPDATE` goes to
/// the other database's `done_jobs`, which holds no claim of this run's (its `claim_token`), so
/// the call fails and nothing is committed. (It used to report `Ran` with the job's own claim left
/// unrecorded, and the next delivery took the key over and ran the body again.)
#[test]
fn body_switching_the_database_is_not_run_twice() {
    with_database("use2", |other_url, _| {
        let other = other_url.rsplit_once('/').expect("a database").1.to_owned();
        with_database("use1", |url, check| {
            let mut c = fresh(url, "");
            let before = calls(&mut c);
            let first =
                adv(&mut c, "use", "use", &format!("USE {other}"), "").map_err(|e| e.to_string());
            let used = calls(&mut c) - before;
            let row = stored(check, &adv::key("use")).map(|r| r.unfinished);
            let mut c = fresh(url, "");
            let second = adv(&mut c, "use", "use", "", "").map_err(|e| e.to_string());
            let effects = tagged(check, "use");
            assert!(
                first.is_err() || (row == Some(0) && effects == 1),
                "reported {first:?} ({used} CALLs), the key's row unfinished: {row:?}; the next call {second:?}; the body's effects: {effects}"
            );
        });
    });
}

/// A job inside the caller's transaction (a Diesel savepoint, no procedure) whose body runs `own`;
/// what the caller's transaction returned, the key's row (unfinished?), the job's effects and the
/// caller's own write, all as committed.
fn nested_job(
    url: &str,
    check: &mut MysqlConnection,
    own: &str,
    tag: &str,
) -> (Result<i64, TestError>, Option<i64>, i64, i64) {
    let mut c = fresh(url, "");
    let before = calls(&mut c);
    let outer = c.transaction::<_, TestError, _>(|c| {
        diesel::insert_into(adv_effects::table)
            .values(adv_effects::tag.eq(format!("{tag}-outer")))
            .execute(c)?;
        adv(c, tag, tag, own, "")
    });
    assert_eq!(calls(&mut c) - before, 0, "nested: no procedure");
    let row = stored(check, &adv::key(tag)).map(|r| r.unfinished);
    let (effects, outer_effects) = (tagged(check, tag), tagged(check, &format!("{tag}-outer")));
    figures::report(&format!(
        "a nested job whose body ran {own}: the caller's transaction returned {:?}; row {row:?}, effects {effects}, the caller's write {outer_effects}",
        outer.as_ref().map_err(ToString::to_string)
    ));
    (outer, row, effects, outer_effects)
}

/// 4, harder: a job inside the caller's transaction whose body rolls back (the caller's
/// transaction with it): the call says nothing was committed, and nothing was; the key can be
/// finished and replayed after.
#[test]
fn nested_job_whose_body_rolls_back() {
    with_database("nested", |url, check| {
        let (outer, row, effects, outer_effects) = nested_job(url, check, "ROLLBACK", "nr");
        assert!(is_rolled_back(&outer), "{outer:?}");
        assert_eq!(
            (row, effects, outer_effects),
            (None, 0, 0),
            "nothing committed"
        );
        let mut c = fresh(url, "");
        assert_eq!(
            adv(&mut c, "nr", "nr", "", "").map_err(|e| e.to_string()),
            Ok(42),
            "retry"
        );
        assert_eq!(
            adv(&mut c, "nr", "nr", "", "").map_err(|e| e.to_string()),
            Ok(42),
            "replay"
        );
        assert_eq!(tagged(check, "nr"), 1);
    });
}

/// A job inside the caller's transaction whose body commits (`COMMIT`, or DDL's implicit commit):
/// the claim and the body's write (and the caller's) are committed by the body. The call says so
/// (`TransactionEndedInBody`: the work before the statement committed, the claim taken back), and
/// the claim is gone, so a retry runs the job. It used to say `TransactionRolledBackInBody`
/// ("nothing of it was committed"): the take-back opened a Diesel savepoint (Diesel still counted
/// the caller's transaction) outside any transaction, its `DELETE` autocommitted and the
/// savepoint's release failed.
#[test]
fn nested_job_whose_body_commits_reports_what_was_committed() {
    with_database("nestcommit", |url, check| {
        for (own, tag) in [("COMMIT", "nc"), ("CREATE TABLE nest_probe (id INT)", "nd")] {
            let (outer, row, effects, outer_effects) = nested_job(url, check, own, tag);
            let mut c = fresh(url, "");
            let retry = adv(&mut c, tag, tag, "", "").map_err(|e| e.to_string());
            let after_retry = tagged(check, tag);
            assert!(
                matches!(
                    &outer,
                    Err(TestError::Idempotent(
                        idempotent_jobs::Error::TransactionEndedInBody { .. }
                    ))
                ) && effects == 1
                    && row.is_none(),
                "{own}: reported {:?} (\"nothing of it was committed\"), but the body's write is committed ({effects}; the caller's {outer_effects}; the key's row {row:?}); the retry {retry:?} left {after_retry} writes",
                outer.as_ref().map_err(ToString::to_string)
            );
        }
    });
}

/// A key larger than `max_allowed_packet` (the `CALL`'s packet is refused), and a job begun inside
/// an XA transaction (the procedure's `START TRANSACTION` is refused): errors, nothing committed.
#[test]
fn refused_calls_commit_nothing() {
    with_database("refused", |url, check| {
        let packet = n(check, "SELECT @@max_allowed_packet AS n") as usize;
        let mut c = fresh(url, "");
        let huge = "h".repeat(packet + 1024);
        let result = adv(&mut c, &huge, "huge", "", "").map_err(|e| e.to_string());
        figures::report(&format!(
            "a key larger than max_allowed_packet: {}",
            match &result {
                Ok(v) => format!("Ok({v})"),
                Err(e) => e
                    .chars()
                    .rev()
                    .take(200)
                    .collect::<String>()
                    .chars()
                    .rev()
                    .collect(),
            }
        ));
        assert!(result.is_err());
        assert_eq!(
            (
                stored(check, &adv::key(&huge)).is_some(),
                tagged(check, "huge")
            ),
            (false, 0)
        );

        let mut c = fresh(url, "XA START 'adv'");
        let before = calls(&mut c);
        let result = adv(&mut c, "xa", "xa", "", "").map_err(|e| e.to_string());
        let used = calls(&mut c) - before;
        let _ = c.batch_execute("XA END 'adv'; XA ROLLBACK 'adv'");
        figures::report(&format!(
            "a job begun in an XA transaction: {result:?} ({used} CALLs)"
        ));
        assert!(result.is_err());
        assert_eq!(
            (
                stored(check, &adv::key("xa")).is_some(),
                tagged(check, "xa")
            ),
            (false, 0)
        );
        let mut c = fresh(url, "");
        assert_eq!(
            adv(&mut c, "xa", "xa", "", "").map_err(|e| e.to_string()),
            Ok(42)
        );
        assert_eq!(tagged(check, "xa"), 1);
    });
}

/// `migrate` from a session with a non-strict `sql_mode`: the procedures are made strict (so the
/// claim refuses a name too long for its column), and the session's own mode is put back. (No job
/// here: the walk-through may have switched the process to the fallback meanwhile.)
#[test]
fn procedures_migrated_from_a_non_strict_session_are_strict() {
    let base = std::env::var("IDEMPOTENT_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let mut admin = MysqlConnection::establish(&base).expect("MariaDB/MySQL reachable");
    let database = format!("procedures_{}_nonstrict", std::process::id());
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .expect("a database");
    let (server, _) = base.rsplit_once('/').expect("a database in the URL");
    let url = format!("{server}/{database}");
    let result = std::panic::catch_unwind(|| {
        let mut c = fresh(&url, "SET SESSION sql_mode = 'ALLOW_INVALID_DATES'");
        idempotent_jobs::migrate(&mut c).expect("migrations");
        assert_eq!(procedures(&mut c), 3);
        assert_eq!(
            n(
                &mut c,
                "SELECT CAST(@@SESSION.sql_mode = 'ALLOW_INVALID_DATES' AS SIGNED) AS n"
            ),
            1,
            "the session's mode put back"
        );
        assert_eq!(
            n(
                &mut c,
                "SELECT COUNT(*) AS n FROM information_schema.routines WHERE routine_schema = DATABASE() AND routine_name LIKE 'idempotent\\_%' AND FIND_IN_SET('STRICT_ALL_TABLES', sql_mode) > 0"
            ),
            3,
            "every procedure strict"
        );
    });
    let _ = admin.batch_execute(&format!("DROP DATABASE {database}"));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
