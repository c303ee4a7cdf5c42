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
#[path = "support/mysql_database.rs"]
mod mysql_database;

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
    // It drops its procedures, which switches the process to the statements' way for a minute.
    let _gate = PROCEDURE_GATE
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let database = format!("procedures_{}", std::process::id());
    mysql_database::in_database(&database, "", |url| {
        URL.set(url.to_owned()).expect("set once");
        walk_through(
            url,
            &database,
            &mut mysql_database::reach(&mysql_database::base_url()),
        );
    });
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
    // savepoint and its release go as statements of their own, and so does the check that the
    // session holds no transaction of its own, which `START TRANSACTION` would commit.
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
        (7, 0),
        "the refusal of a transaction of the session's own, BEGIN, SAVEPOINT, claim, statement, RELEASE, COMMIT"
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
        (5, 0),
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

    // `autocommit = 0` with a write of the caller's pending before the job: the job is refused
    // with nothing begun (its `START TRANSACTION` would commit that write; it used to, whether the
    // job then ran or failed), the write stays the caller's to commit or roll back, and after the
    // caller's `ROLLBACK` the job runs.
    let mut c = fresh(url, "SET SESSION autocommit = 0");
    for (key, body) in [("pending", ""), ("pending-err", "err")] {
        let before = format!("{key}-before");
        c.batch_execute(&format!(
            "INSERT INTO adv_effects (tag) VALUES ('{before}')"
        ))
        .expect("pending");
        let refused = adv(&mut c, key, key, "", body);
        assert!(
            matches!(
                &refused,
                Err(TestError::Idempotent(
                    idempotent_jobs::Error::InsideTransaction { .. }
                ))
            ),
            "{key}: {refused:?}"
        );
        assert_eq!(
            tagged(check, &before),
            0,
            "{key}: the caller's write not committed"
        );
        assert_eq!(
            committed(check, key, key),
            (None, 0),
            "{key}: the job left nothing"
        );
        c.batch_execute("ROLLBACK").expect("the caller's rollback");
        assert_eq!(
            tagged(check, &before),
            0,
            "{key}: the caller's write rolled back"
        );
    }
    assert_eq!(
        adv(&mut c, "pending", "pending", "", "").expect("a job"),
        42
    );
    assert_eq!(committed(check, "pending", "pending"), (Some(0), 1));
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
        // The procedure refuses a session inside a transaction (here the job's own) before its
        // `START TRANSACTION`: the body's statement fails, and the job with it.
        ("CALL idempotent_begin_job()", "", "refused"),
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
            "refused" => assert!(
                matches!(&result, Err(TestError::Database(e)) if e.to_string().contains("holds a transaction of its own"))
                    && row.is_none()
                    && effects == 0,
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
    let database = format!("procedures_{}_{suffix}", std::process::id());
    mysql_database::in_database(&database, "", |url| {
        let mut check = MysqlConnection::establish(url).expect("a connection");
        idempotent_jobs::migrate(&mut check).expect("migrations");
        check.batch_execute(ADV_TABLES).expect("the tables");
        f(url, &mut check);
    });
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
/// transaction with it): the call says the caller's whole transaction was rolled back
/// (`CallersTransactionRolledBack`; it said `TransactionRolledBackInBody`, the job's rollback
/// alone), and nothing was committed; the key can be finished and replayed after.
#[test]
fn nested_job_whose_body_rolls_back() {
    with_database("nested", |url, check| {
        let (outer, row, effects, outer_effects) = nested_job(url, check, "ROLLBACK", "nr");
        assert!(
            matches!(
                &outer,
                Err(TestError::Idempotent(
                    idempotent_jobs::Error::CallersTransactionRolledBack { .. }
                ))
            ),
            "{outer:?}"
        );
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
    let database = format!("procedures_{}_nonstrict", std::process::id());
    mysql_database::in_database(&database, "", |url| {
        let mut c = fresh(url, "SET SESSION sql_mode = 'ALLOW_INVALID_DATES'");
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
}

// ---------------------------------------------------------------------------------------------
// The replay through the claim in 2 round trips (c7c70f1): `idempotent_begin_and_claim` rolls
// back on the key's duplicate and says so in its error; the row is then read outside any
// transaction and replayed when it is live, else claimed again the usual way.
// ---------------------------------------------------------------------------------------------

/// The walk-through drops its procedures, which switches the whole process to the statements'
/// way for a minute: the tests of the replay through the claim wait for it, and then for the
/// procedures to be called again, under this gate (the walk-through holds it for writing).
static PROCEDURE_GATE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// `adv` under a name of its own for these tests: a job's calls read first once 12 of its last 16
/// were replays (`crate::redelivery`), which other tests' many replays of `adv` would turn on here.
/// `then = "err"` returns the body's own error.
#[idempotent_job(key = "win:<k>")]
fn win(
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
    if then == "err" {
        return Err(TestError::Refused);
    }
    Ok(42)
}

/// The churn test's job: its many replays put it in read-first mode, which no other test shares.
#[idempotent_job(key = "churn:<k>")]
fn churned(conn: &mut MysqlConnection, k: &str) -> Result<i64, TestError> {
    diesel::insert_into(adv_effects::table)
        .values(adv_effects::tag.eq(k))
        .execute(conn)?;
    Ok(42)
}

/// A call of `churned`, as [`Called`].
fn churn_outcome(conn: &mut MysqlConnection, k: &str, tag: &str) -> Called {
    let _ = tag;
    churned::outcome(conn, k)
        .map(|o| (o.is_ran(), *o.value()))
        .map_err(|e| e.to_string())
}

/// A probe whose calls count nothing of another test's jobs.
#[idempotent_job(key = "probe:<k>")]
fn probe(conn: &mut MysqlConnection, k: &str) -> Result<(), TestError> {
    let _ = (conn, k);
    Ok(())
}

/// `adv` under a name of its own, for the counters (other tests call `adv` at the same time).
#[idempotent_job(key = "tally:<k>")]
fn tally(conn: &mut MysqlConnection, k: &str) -> Result<i64, TestError> {
    diesel::insert_into(adv_effects::table)
        .values(adv_effects::tag.eq(format!("tally-{k}")))
        .execute(conn)?;
    Ok(42)
}

/// A job with a fingerprint: its inputs must be the same when its key comes back.
#[idempotent_job(key = "priced:<k>", fingerprint(amount))]
fn priced(conn: &mut MysqlConnection, k: &str, amount: i64) -> Result<i64, TestError> {
    diesel::insert_into(adv_effects::table)
        .values(adv_effects::tag.eq(format!("priced-{k}")))
        .execute(conn)?;
    Ok(amount)
}

/// Another job whose keys are `win`'s: its calls must never replay `win`'s results.
#[idempotent_job(key = "win:<k>", name = "win_impostor")]
fn impostor(conn: &mut MysqlConnection, k: &str) -> Result<i64, TestError> {
    diesel::insert_into(adv_effects::table)
        .values(adv_effects::tag.eq(format!("impostor-{k}")))
        .execute(conn)?;
    Ok(7)
}

/// A result whose `Deserialize` panics on a negative number (a run never stores one; the test
/// writes one into the key's row).
#[derive(Debug, PartialEq, serde::Serialize)]
struct Touchy(i64);

impl<'de> serde::Deserialize<'de> for Touchy {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = <i64 as serde::Deserialize>::deserialize(deserializer)?;
        assert!(value >= 0, "Touchy's Deserialize panics on {value}");
        Ok(Touchy(value))
    }
}

#[idempotent_job(key = "touchy:<k>")]
fn touchy(conn: &mut MysqlConnection, k: &str) -> Result<Touchy, TestError> {
    diesel::insert_into(adv_effects::table)
        .values(adv_effects::tag.eq(format!("touchy-{k}")))
        .execute(conn)?;
    Ok(Touchy(42))
}

/// Runs `f` in a database of its own (see [`with_database`]) once this process calls the job
/// procedures again (see [`PROCEDURE_GATE`]).
fn with_procedures(suffix: &str, f: impl FnOnce(&str, &mut MysqlConnection)) {
    let _gate = PROCEDURE_GATE
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    with_database(suffix, |url, check| {
        let mut c = fresh(url, "");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
        for i in 0.. {
            let before = calls(&mut c);
            probe(&mut c, &format!("{suffix}-{i}")).expect("a probe");
            if calls(&mut c) - before == 2 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the process never called the procedures again"
            );
            std::thread::sleep(std::time::Duration::from_secs(2));
        }
        f(url, check);
    });
}

/// What the connection holds open: Diesel's transaction depth, and the server's
/// `@@in_transaction` for the session.
fn open(conn: &mut MysqlConnection) -> (u32, i64) {
    use diesel::connection::{AnsiTransactionManager, TransactionManager};
    let depth =
        <AnsiTransactionManager as TransactionManager<MysqlConnection>>::transaction_manager_status_mut(
            conn,
        )
        .transaction_depth()
        .expect("a valid transaction manager")
        .map_or(0, std::num::NonZeroU32::get);
    (
        depth,
        n(conn, "SELECT CAST(@@in_transaction AS SIGNED) AS n"),
    )
}

/// `f` on `conn`, with the round trips and procedure calls it took (see [`sent`]).
fn counted<R>(
    conn: &mut MysqlConnection,
    f: impl FnOnce(&mut MysqlConnection) -> R,
) -> (R, i64, i64) {
    let before = (
        status(conn, "QUESTIONS"),
        status(conn, "COM_CALL_PROCEDURE"),
    );
    let result = f(conn);
    (
        result,
        status(conn, "QUESTIONS") - before.0 - 2,
        status(conn, "COM_CALL_PROCEDURE") - before.1,
    )
}

/// The key's digest as an SQL literal.
fn hex(key: &idempotent_jobs::JobKey) -> String {
    let digits: String = key.digest().iter().map(|b| format!("{b:02x}")).collect();
    format!("X'{digits}'")
}

#[derive(QueryableByName, Debug, PartialEq)]
struct Held {
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    result: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Text)]
    job_name: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    lapsed: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    claim_token: Option<i64>,
}

/// The key's committed row: result, job, lapsed, claim token.
fn held(conn: &mut MysqlConnection, key: &idempotent_jobs::JobKey) -> Option<Held> {
    diesel::sql_query(format!(
        "SELECT CAST(result AS CHAR CHARACTER SET utf8mb4) AS result, \
         CAST(job_name AS CHAR CHARACTER SET utf8mb4) AS job_name, \
         CAST(expires_at IS NOT NULL AND expires_at <= UTC_TIMESTAMP(6) AS SIGNED) AS lapsed, \
         claim_token FROM done_jobs WHERE key_digest = {}",
        hex(key)
    ))
    .get_results::<Held>(conn)
    .expect("the key's row")
    .pop()
}

/// Waits (up to 10 s) until the session `id` has been in a statement on `done_jobs` for 300 ms:
/// waiting for the key's row lock.
fn await_lock_wait(check: &mut MysqlConnection, id: i64) {
    let sql = format!(
        "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE ID = {id} AND INFO LIKE '%done_jobs%' AND TIME_MS >= 300"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while n(check, &sql) == 0 {
        if std::time::Instant::now() >= deadline {
            #[derive(QueryableByName, Debug)]
            struct Session {
                #[diesel(sql_type = diesel::sql_types::Text)]
                s: String,
            }
            let sessions = diesel::sql_query(
                "SELECT CONCAT_WS(' | ', ID, COMMAND, STATE, LEFT(INFO, 120)) AS s FROM information_schema.PROCESSLIST",
            )
            .load::<Session>(check)
            .map(|rows| rows.into_iter().map(|r| r.s).collect::<Vec<_>>());
            panic!("session {id} never waited for the key's lock: {sessions:#?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn connection_id(conn: &mut MysqlConnection) -> i64 {
    n(conn, "SELECT CAST(CONNECTION_ID() AS SIGNED) AS n")
}

/// What a call of `win` came to: (whether its body ran, its value), or the error as text.
type Called = Result<(bool, i64), String>;

/// A call of `win` (no `own`, no `then`), as [`Called`].
fn win_outcome(conn: &mut MysqlConnection, k: &str, tag: &str) -> Called {
    win::outcome(conn, k, tag, "", "")
        .map(|o| (o.is_ran(), *o.value()))
        .map_err(|e| e.to_string())
}

/// Sets up the window between the `CALL` that finds `k` taken and the read of its row: `k`'s row
/// (committed, finished) is locked by a first admin session; a connection made with `settings`
/// calls `win` for `k` and waits in its `CALL`; a second admin session then queues `then` (its first
/// statement waits behind the call's lock on the key); the first admin session commits. The call
/// gets its duplicate, rolls back, which lets `then` go on while the call reads the row. `then`'s
/// session is rolled back after `hold`. What the call returned, what its session held open after
/// it (where it still answers), and how `then` ended.
fn between_the_claim_and_the_read(
    url: &str,
    check: &mut MysqlConnection,
    k: &str,
    settings: &str,
    then: impl FnOnce(i64) -> String,
    hold: std::time::Duration,
) -> (Called, Option<(u32, i64)>, Result<(), String>) {
    let key = win::key(k);
    let mut caller = fresh(url, settings);
    // Its statements prepared, on another key.
    win_outcome(&mut caller, &format!("{k}-warm"), &format!("{k}-warm")).expect("a warm-up");
    win_outcome(&mut caller, &format!("{k}-warm"), &format!("{k}-warm")).expect("its replay");
    let mut first = fresh(url, "");
    first
        .batch_execute(&format!(
            "BEGIN; UPDATE done_jobs SET claim_token = claim_token WHERE key_digest = {}",
            hex(&key)
        ))
        .expect("the first admin session locks the key's row");
    let caller_id = connection_id(&mut caller);
    let (k2, tag) = (k.to_owned(), format!("{k}-call"));
    let call = std::thread::spawn(move || {
        let called = win_outcome(&mut caller, &k2, &tag);
        (called, try_open(&mut caller))
    });
    await_lock_wait(check, caller_id);
    let mut second = fresh(url, "");
    let second_id = connection_id(&mut second);
    let sql = then(caller_id);
    let queued = std::thread::spawn(move || {
        let ran = second.batch_execute(&sql).map_err(|e| e.to_string());
        std::thread::sleep(hold);
        let _ = second.batch_execute("ROLLBACK");
        ran
    });
    await_lock_wait(check, second_id);
    first.batch_execute("COMMIT").expect("commit");
    let (called, left) = call.join().expect("the call's thread");
    (
        called,
        left,
        queued.join().expect("the second admin session"),
    )
}

/// A replay through the claim: the first run's result in 2 round trips and 1 `CALL`, nothing left
/// open (Diesel's depth, the server's `@@in_transaction`, the key's row lock: another session
/// locks it at once), counted once as a replay and never as a run; then, with `autocommit = 0` and
/// inside a caller's Diesel transaction, the replay goes the usual way and still leaves nothing
/// of its own open.
#[test]
fn a_replay_through_the_claim_leaves_nothing_open_and_is_counted_once() {
    with_procedures("rtc", |url, check| {
        let mut c = fresh(url, "");
        assert_eq!(tally(&mut c, "a").map_err(|e| e.to_string()), Ok(42));
        tally(&mut c, "warm").expect("warm-up");
        tally(&mut c, "warm").expect("warm-up replay");
        let before = idempotent_jobs::stats::counts_for("tally");
        let (replay, trips, called) = counted(&mut c, |c| {
            tally::outcome(c, "a").map(|o| (o.is_replayed(), o.into_inner()))
        });
        let after = idempotent_jobs::stats::counts_for("tally");
        assert_eq!(replay.map_err(|e| e.to_string()), Ok((true, 42)));
        assert_eq!(
            (trips, called),
            (2, 1),
            "the CALL (rolled back) and the read"
        );
        assert_eq!(open(&mut c), (0, 0), "nothing open after the replay");
        assert_eq!(
            (after.replayed - before.replayed, after.ran - before.ran),
            (1, 0),
            "counted once, as a replay: {before:?} -> {after:?}"
        );
        assert_eq!(
            (
                after.errors - before.errors,
                after.failed - before.failed,
                after.panicked - before.panicked
            ),
            (0, 0, 0)
        );
        assert_eq!(tagged(check, "tally-a"), 1, "ran once");
        // No lock of the replay's is held: another session takes the key's row at once.
        let mut other = fresh(url, "SET SESSION innodb_lock_wait_timeout = 1");
        other
            .batch_execute(&format!(
                "BEGIN; UPDATE done_jobs SET claim_token = claim_token WHERE key_digest = {}; ROLLBACK",
                hex(&tally::key("a"))
            ))
            .expect("the key's row is not locked by the replay");

        // `autocommit = 0`: the read outside a transaction is not trusted; the usual claim
        // replays, and commits (nothing of the job's left open).
        let mut c = fresh(url, "SET SESSION autocommit = 0");
        win_outcome(&mut fresh(url, ""), "ac0", "ac0").expect("a run");
        let (replay, trips, called) = counted(&mut c, |c| win_outcome(c, "ac0", "ac0"));
        figures::report(&format!(
            "autocommit = 0, a replay through the claim: {replay:?} in {trips} round trips, {called} CALLs"
        ));
        assert_eq!(replay, Ok((false, 42)), "replayed");
        assert_eq!(open(&mut c), (0, 0), "autocommit = 0: nothing open");
        assert_eq!(tagged(check, "ac0"), 1);

        // Inside the caller's Diesel transaction: no procedure; the replay is part of it.
        let mut c = fresh(url, "");
        let (inside, _, called) = counted(&mut c, |c| {
            c.transaction::<_, TestError, _>(|c| win(c, "ac0", "ac0", "", ""))
                .map_err(|e| e.to_string())
        });
        assert_eq!((inside, called), (Ok(42), 0));
        assert_eq!(open(&mut c), (0, 0));
        assert_eq!(tagged(check, "ac0"), 1);
    });
}

/// The session's open state, where the connection still answers.
fn try_open(conn: &mut MysqlConnection) -> Option<(u32, i64)> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| open(conn))).ok()
}

/// Keys whose rows are not live replays (lapsed, unfinished) go from the `CALL` that found them
/// taken to the usual claim, which takes them over: the body runs once more, its result is
/// recorded in the same row (a claim token of its own), nothing is left open, and the next call
/// replays through the claim in 2 round trips.
#[test]
fn a_key_whose_row_is_not_live_runs_again_the_usual_way() {
    with_procedures("notlive", |url, check| {
        let mut c = fresh(url, "");
        win_outcome(&mut c, "warm", "warm").expect("warm-up");
        win_outcome(&mut c, "warm", "warm").expect("warm-up replay");
        for (case, change) in [
            (
                "lapsed",
                "UPDATE done_jobs SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND",
            ),
            ("unfinished", "UPDATE done_jobs SET result = ''"),
        ] {
            let k = format!("notlive-{case}");
            let key = win::key(&k);
            assert_eq!(win_outcome(&mut c, &k, &k), Ok((true, 42)), "{case}");
            let token = held(check, &key).expect("the row").claim_token;
            check
                .batch_execute(&format!("{change} WHERE key_digest = {}", hex(&key)))
                .expect("the change");
            let again = format!("{k}-again");
            let (result, trips, called) = counted(&mut c, |c| win_outcome(c, &k, &again));
            figures::report(&format!(
                "a {case} row through the claim: {result:?} in {trips} round trips, {called} CALLs"
            ));
            assert_eq!(result, Ok((true, 42)), "{case}: runs again");
            assert_eq!(open(&mut c), (0, 0), "{case}: nothing open");
            let row = held(check, &key).expect("the row");
            assert_eq!(
                (row.result.as_deref(), row.lapsed, row.job_name.as_str()),
                (Some("42"), 0, "win"),
                "{case}: recorded"
            );
            assert_ne!(row.claim_token, token, "{case}: this run's claim");
            assert_eq!((tagged(check, &k), tagged(check, &again)), (1, 1), "{case}");
            let (replay, trips, called) = counted(&mut c, |c| win_outcome(c, &k, &again));
            assert_eq!(
                (replay, trips, called),
                (Ok((false, 42)), 2, 1),
                "{case}: the next call replays through the claim"
            );
            assert_eq!(tagged(check, &again), 1, "{case}");
        }
    });
}

/// Rows the call may not replay (another fingerprint, another job's key, a result that does not
/// decode) are refused after the `CALL` found the key taken, as the usual claim refuses them:
/// the error says why, the row and the effects are as they were, nothing is left open, a mismatch
/// is counted once as one, and the right call replays after.
#[test]
fn refused_replays_through_the_claim_change_nothing() {
    with_procedures("refusedreplay", |url, check| {
        let mut c = fresh(url, "");
        // Another fingerprint.
        assert_eq!(priced(&mut c, "p", 100).map_err(|e| e.to_string()), Ok(100));
        let before = idempotent_jobs::stats::counts_for("priced");
        let (mismatch, trips, called) = counted(&mut c, |c| priced(c, "p", 200));
        let after = idempotent_jobs::stats::counts_for("priced");
        figures::report(&format!(
            "another fingerprint through the claim: {} round trips, {called} CALLs",
            trips
        ));
        assert!(
            matches!(
                mismatch,
                Err(TestError::Idempotent(
                    idempotent_jobs::Error::FingerprintMismatch { .. }
                ))
            ),
            "{mismatch:?}"
        );
        assert_eq!(
            (
                after.fingerprint_mismatches - before.fingerprint_mismatches,
                after.replayed - before.replayed,
                after.ran - before.ran,
                after.errors - before.errors
            ),
            (1, 0, 0, 0),
            "counted once, as a mismatch"
        );
        assert_eq!(open(&mut c), (0, 0), "nothing open after the mismatch");
        assert_eq!(
            held(check, &priced::key("p")).and_then(|r| r.result),
            Some("100".to_owned())
        );
        assert_eq!(tagged(check, "priced-p"), 1);
        assert_eq!(priced(&mut c, "p", 100).map_err(|e| e.to_string()), Ok(100));
        assert_eq!(tagged(check, "priced-p"), 1, "replayed");

        // Another job's key.
        assert_eq!(win_outcome(&mut c, "shared", "shared"), Ok((true, 42)));
        let other = impostor(&mut c, "shared");
        assert!(
            matches!(
                other,
                Err(TestError::Idempotent(
                    idempotent_jobs::Error::KeyClaimedByOtherJob { .. }
                ))
            ),
            "{other:?}"
        );
        assert_eq!(open(&mut c), (0, 0), "nothing open after the conflict");
        assert_eq!(
            tagged(check, "impostor-shared"),
            0,
            "the impostor never ran"
        );
        let row = held(check, &win::key("shared")).expect("the row");
        assert_eq!(
            (row.job_name.as_str(), row.result.as_deref()),
            ("win", Some("42"))
        );
        assert_eq!(win_outcome(&mut c, "shared", "shared"), Ok((false, 42)));

        // A result that does not decode.
        assert_eq!(win_outcome(&mut c, "garbled", "garbled"), Ok((true, 42)));
        let key = win::key("garbled");
        check
            .batch_execute(&format!(
                "UPDATE done_jobs SET result = '\"forty-two\"' WHERE key_digest = {}",
                hex(&key)
            ))
            .expect("garble");
        let garbled = win(&mut c, "garbled", "garbled", "", "");
        assert!(
            matches!(
                garbled,
                Err(TestError::Idempotent(
                    idempotent_jobs::Error::ReplayDecode { .. }
                ))
            ),
            "{garbled:?}"
        );
        assert_eq!(
            open(&mut c),
            (0, 0),
            "nothing open after the decoding failure"
        );
        assert_eq!(tagged(check, "garbled"), 1, "the body did not run again");
        assert_eq!(
            held(check, &key).and_then(|r| r.result),
            Some("\"forty-two\"".to_owned()),
            "the row as it was"
        );
        check
            .batch_execute(&format!(
                "UPDATE done_jobs SET result = '42' WHERE key_digest = {}",
                hex(&key)
            ))
            .expect("mend");
        assert_eq!(win_outcome(&mut c, "garbled", "garbled"), Ok((false, 42)));
    });
}

/// A result whose `Deserialize` panics, replayed through the claim: the panic reaches the caller,
/// is counted once as a panic, nothing is left open (a job after it on the same connection
/// commits by itself), and the key replays once its row decodes.
#[test]
fn a_panicking_replay_through_the_claim_leaves_nothing_open() {
    with_procedures("panicreplay", |url, check| {
        let mut c = fresh(url, "");
        assert_eq!(
            touchy(&mut c, "t").map_err(|e| e.to_string()),
            Ok(Touchy(42))
        );
        let key = touchy::key("t");
        check
            .batch_execute(&format!(
                "UPDATE done_jobs SET result = '-1' WHERE key_digest = {}",
                hex(&key)
            ))
            .expect("a value that panics");
        let before = idempotent_jobs::stats::counts_for("touchy");
        let (panicked, _, called) = counted(&mut c, |c| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| touchy(c, "t"))).is_err()
        });
        let after = idempotent_jobs::stats::counts_for("touchy");
        assert!(panicked, "the replay's panic reached the caller");
        assert!(called >= 1, "through the procedure");
        assert_eq!(
            (
                after.panicked - before.panicked,
                after.replayed - before.replayed,
                after.errors - before.errors
            ),
            (1, 0, 0),
            "counted once, as a panic"
        );
        assert_eq!(open(&mut c), (0, 0), "nothing open after the panic");
        assert_eq!(
            win_outcome(&mut c, "after-panic", "after-panic"),
            Ok((true, 42))
        );
        assert_eq!(
            stored(check, &win::key("after-panic")).map(|r| r.unfinished),
            Some(0),
            "the next job on the connection committed"
        );
        assert_eq!(tagged(check, "after-panic"), 1);
        assert_eq!(tagged(check, "touchy-t"), 1, "the body did not run again");
        check
            .batch_execute(&format!(
                "UPDATE done_jobs SET result = '42' WHERE key_digest = {}",
                hex(&key)
            ))
            .expect("mend");
        assert_eq!(
            touchy(&mut c, "t").map_err(|e| e.to_string()),
            Ok(Touchy(42))
        );
        assert_eq!(tagged(check, "touchy-t"), 1);
    });
}

/// Re-creates `idempotent_begin_and_claim` as it was made before c7c70f1: on the key's duplicate
/// its handler sets the job's savepoint and raises the server's own error, the transaction open.
fn make_old_body(check: &mut MysqlConnection) {
    check
        .batch_execute(
            "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';
             DROP PROCEDURE idempotent_begin_and_claim;
             CREATE PROCEDURE idempotent_begin_and_claim(
               IN p_digest LONGBLOB,
               IN p_job_key LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
               IN p_job_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
               IN p_fingerprint LONGBLOB,
               IN p_claim_token BIGINT,
               IN p_result LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
             ) SQL SECURITY INVOKER
             BEGIN
               DECLARE EXIT HANDLER FOR 1062
               BEGIN
                 SAVEPOINT idempotent_job;
                 RESIGNAL;
               END;
               START TRANSACTION;
               INSERT INTO done_jobs (key_digest, job_key, job_name, fingerprint, claim_token, result, done_at)
               VALUES (p_digest, p_job_key, p_job_name, p_fingerprint, p_claim_token, p_result, UTC_TIMESTAMP(6));
               SAVEPOINT idempotent_job;
             END;
             SET SESSION sql_mode = DEFAULT",
        )
        .expect("the old body");
}

/// `idempotent_begin_and_claim` as made before c7c70f1 (its handler sets the savepoint and raises
/// the server's own duplicate-key error, the transaction left open): a run of `adv` takes 4 round
/// trips (2 CALLs), a replay 3 (1 CALL: the claim, the locked read, the `ROLLBACK` that ends a
/// replay's transaction, which wrote nothing), nothing is left open;
/// a lapsed key and another fingerprint are handled as with the new body.
#[test]
fn a_procedure_made_before_the_change_still_replays() {
    with_procedures("oldbody", |url, check| {
        make_old_body(check);
        let mut c = fresh(url, "");
        win_outcome(&mut c, "warm", "warm").expect("warm-up");
        win_outcome(&mut c, "warm", "warm").expect("warm-up replay");
        let (ran, trips, called) = counted(&mut c, |c| win_outcome(c, "o", "o"));
        assert_eq!(
            (ran, trips, called),
            (Ok((true, 42)), 4, 2),
            "a run: CALL begin-and-claim, the body's INSERT, the result's record, CALL finish"
        );
        let (replay, trips, called) = counted(&mut c, |c| win_outcome(c, "o", "o"));
        figures::report(&format!(
            "the procedure made before c7c70f1: a replay through the claim in {trips} round trips, {called} CALLs"
        ));
        assert_eq!(
            (replay, trips, called),
            (Ok((false, 42)), 3, 1),
            "CALL (the key's duplicate, the transaction open), the locked read, ROLLBACK"
        );
        assert_eq!(open(&mut c), (0, 0), "nothing open");
        assert_eq!(tagged(check, "o"), 1);
        // A lapsed key runs again; a replay after it.
        check
            .batch_execute(&format!(
                "UPDATE done_jobs SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE key_digest = {}",
                hex(&win::key("o"))
            ))
            .expect("lapse");
        assert_eq!(win_outcome(&mut c, "o", "o-again"), Ok((true, 42)));
        assert_eq!(win_outcome(&mut c, "o", "o-again"), Ok((false, 42)));
        assert_eq!((tagged(check, "o"), tagged(check, "o-again")), (1, 1));
        assert_eq!(open(&mut c), (0, 0));
        // Another fingerprint.
        assert_eq!(priced(&mut c, "op", 1).map_err(|e| e.to_string()), Ok(1));
        assert!(matches!(
            priced(&mut c, "op", 2),
            Err(TestError::Idempotent(
                idempotent_jobs::Error::FingerprintMismatch { .. }
            ))
        ));
        assert_eq!(open(&mut c), (0, 0));
        assert_eq!(priced(&mut c, "op", 1).map_err(|e| e.to_string()), Ok(1));
        assert_eq!(tagged(check, "priced-op"), 1);
    });
}

/// Two connections on one key: the claim waits in its `CALL` for a run in progress; when that run
/// commits, the waiter gets the duplicate and replays its result through the claim (1 `CALL`, its
/// body never runs); when it rolls back, the waiter's claim goes in and its body runs once.
#[test]
fn a_claim_waiting_for_a_run_in_progress_replays_or_runs() {
    with_procedures("waiting", |url, check| {
        for holder_fails in [false, true] {
            let k = format!("waited-{holder_fails}");
            let holder_url = url.to_owned();
            let (hk, htag) = (k.clone(), format!("{k}-holder"));
            let mut holder = fresh(url, "");
            let holder_id = connection_id(&mut holder);
            let run = std::thread::spawn(move || {
                let _ = &holder_url;
                let then = if holder_fails { "err" } else { "" };
                win(&mut holder, &hk, &htag, "DO SLEEP(1.5)", then).map_err(|e| e.to_string())
            });
            // The holder has claimed: its session is in the body's sleep.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while n(
                check,
                &format!(
                    "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE ID = {holder_id} AND INFO LIKE 'DO SLEEP%'"
                ),
            ) == 0
            {
                assert!(std::time::Instant::now() < deadline, "the holder never ran");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let mut c = fresh(url, "");
            win_outcome(&mut c, "warm", "warm").expect("warm-up");
            win_outcome(&mut c, "warm", "warm").expect("warm-up replay");
            let wtag = format!("{k}-waiter");
            let (waited, trips, called) = counted(&mut c, |c| win_outcome(c, &k, &wtag));
            let held_by = run.join().expect("the holder");
            figures::report(&format!(
                "a claim behind a run that {}: {waited:?} in {trips} round trips, {called} CALLs; the run: {held_by:?}",
                if holder_fails { "failed" } else { "committed" }
            ));
            assert_eq!(open(&mut c), (0, 0));
            let row = held(check, &win::key(&k)).expect("the row");
            assert_eq!(row.result.as_deref(), Some("42"), "finished");
            if holder_fails {
                assert_eq!(held_by, Err("the body refused".to_owned()));
                assert_eq!(waited, Ok((true, 42)), "the waiter ran");
                assert_eq!(
                    (tagged(check, &format!("{k}-holder")), tagged(check, &wtag)),
                    (0, 1)
                );
            } else {
                assert_eq!(held_by, Ok(42));
                assert_eq!(
                    (waited, called),
                    (Ok((false, 42)), 1),
                    "replayed through the claim"
                );
                assert_eq!(
                    (tagged(check, &format!("{k}-holder")), tagged(check, &wtag)),
                    (1, 0)
                );
            }
            assert_eq!(win_outcome(&mut c, &k, &wtag), Ok((false, 42)));
        }
    });
}

/// The key's row changes between the `CALL` that found it taken and the read (forgotten, lapsed,
/// made unfinished, handed to another job, each committed by another session as soon as the
/// `CALL`'s rollback lets it): whichever came first, what the call says is what the database
/// holds (a run's effect for `Ran`, none for a replay), nothing is left open, the key ends
/// finished, and the next call replays it.
#[test]
fn a_row_changed_between_the_claim_and_the_read() {
    with_procedures("between", |url, check| {
        for (case, change) in [
            ("forgotten", "DELETE FROM done_jobs"),
            (
                "lapsed",
                "UPDATE done_jobs SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND",
            ),
            ("unfinished", "UPDATE done_jobs SET result = ''"),
            (
                "another job's",
                "UPDATE done_jobs SET job_name = 'win_impostor'",
            ),
        ] {
            let k = format!("between-{}", case.replace(' ', "-").replace('\'', ""));
            let key = win::key(&k);
            assert_eq!(win_outcome(&mut fresh(url, ""), &k, &k), Ok((true, 42)));
            let sql = format!("{change} WHERE key_digest = {}", hex(&key));
            let (called, left, queued) = between_the_claim_and_the_read(
                url,
                check,
                &k,
                "",
                |_| sql,
                std::time::Duration::ZERO,
            );
            assert_eq!(left, Some((0, 0)), "{case}: nothing left open by the call");
            figures::report(&format!(
                "a row {case} between the CALL and the read: the call {called:?}; the change {queued:?}"
            ));
            queued.expect("the change");
            let call_tag = format!("{k}-call");
            let ran = tagged(check, &call_tag);
            match (&called, case) {
                (Ok((true, 42)), "forgotten" | "lapsed" | "unfinished") => {
                    assert_eq!(ran, 1, "{case}: ran once")
                }
                (Ok((false, 42)), _) => assert_eq!(ran, 0, "{case}: replayed"),
                (Err(e), "another job's")
                    if e.contains("another job") || e.contains("win_impostor") =>
                {
                    assert_eq!(ran, 0)
                }
                _ => panic!("{case}: the call said {called:?}; its effects {ran}"),
            }
            // Gone only where the call replayed before the row was forgotten.
            let row = held(check, &key);
            if called.as_ref().is_ok_and(|o| o.0) {
                let row = row.as_ref().expect("the run's row");
                assert_eq!(
                    (row.result.as_deref(), row.lapsed, row.job_name.as_str()),
                    (Some("42"), 0, "win"),
                    "{case}: the run's row, finished and live"
                );
            }
            // The next call: a replay where the row is live and adv's, a run where the change
            // (committed after the read) left it lapsed or unfinished, a refusal where it is
            // another job's; then a replay.
            let mut c = fresh(url, "");
            let next_tag = format!("{k}-next");
            let next = win_outcome(&mut c, &k, &next_tag);
            let expected = match row {
                None => Some((true, 42)),
                Some(Held { ref job_name, .. }) if job_name != "win" => None,
                Some(Held { lapsed: 1, .. }) => Some((true, 42)),
                Some(Held {
                    result: Some(ref r),
                    ..
                }) if r.is_empty() => Some((true, 42)),
                _ => Some((false, 42)),
            };
            match expected {
                Some(outcome) => {
                    assert_eq!(next, Ok(outcome), "{case}: the next call");
                    assert_eq!(
                        win_outcome(&mut c, &k, &next_tag),
                        Ok((false, 42)),
                        "{case}: then a replay"
                    );
                    assert_eq!(tagged(check, &next_tag), i64::from(outcome.0), "{case}");
                }
                None => assert!(next.is_err(), "{case}: {next:?}"),
            }
            assert_eq!(open(&mut c), (0, 0), "{case}");
            assert_eq!(tagged(check, &call_tag), ran, "{case}");
            assert_eq!(tagged(check, &k), 1, "{case}: the first run's effect");
        }
    });
}

/// A session at READ COMMITTED, REPEATABLE READ or SERIALIZABLE whose `CALL` finds the key taken,
/// while another session's uncommitted update (made as soon as the `CALL`'s rollback let it, and
/// rolled back later) rewrites the key's result: the call replays the committed result, 42, never
/// the uncommitted one.
#[test]
fn a_replay_through_the_claim_reads_only_committed_results() {
    with_procedures("committed", |url, check| {
        for (i, level) in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"]
            .into_iter()
            .enumerate()
        {
            let k = format!("committed-{i}");
            dirty_rewrite(url, check, &k, level, true);
        }
    });
}

/// [`a_replay_through_the_claim_reads_only_committed_results`] at READ UNCOMMITTED.
#[test]
fn a_replay_through_the_claim_reads_only_committed_results_at_read_uncommitted() {
    with_procedures("uncommitted", |url, check| {
        dirty_rewrite(url, check, "uncommitted", "READ UNCOMMITTED", true);
    });
}

/// The same at READ UNCOMMITTED with the procedure made before c7c70f1: its replay reads the row
/// with `FOR UPDATE` inside the claim's transaction, which waits for the rewrite to roll back, and
/// replays 42 (what the replay through the claim did before the change).
#[test]
fn the_old_procedure_reads_only_committed_results_at_read_uncommitted() {
    with_procedures("uncommittedold", |url, check| {
        make_old_body(check);
        dirty_rewrite(url, check, "uncommitted-old", "READ UNCOMMITTED", false);
    });
}

/// A flagged redelivery (`redelivered(true, ..)`) in a READ UNCOMMITTED session, while another
/// session holds an uncommitted rewrite of the key's result: it must never replay that result
/// (999). It skips the read first (not trusted at READ UNCOMMITTED) and claims, whose locked read
/// of the taken key waits for the rewrite (rolled back after 3 s, past one lock wait timeout of
/// 2 s, within the retry window), and replays 42. (Not the path of c7c70f1: the read before any
/// claim that the replay through the claim shares.)
#[test]
fn a_flagged_redelivery_reads_only_committed_results_at_read_uncommitted() {
    with_procedures("uncommittedflag", |url, check| {
        let k = "flagged";
        let key = win::key(k);
        assert_eq!(win_outcome(&mut fresh(url, ""), k, k), Ok((true, 42)));
        let mut other = fresh(url, "");
        other
            .batch_execute(&format!(
                "BEGIN; UPDATE done_jobs SET result = '999' WHERE key_digest = {}",
                hex(&key)
            ))
            .expect("an uncommitted rewrite");
        let mut c = fresh(
            url,
            "SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED; SET SESSION innodb_lock_wait_timeout = 2",
        );
        let rewrite = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs(3));
            other.batch_execute("ROLLBACK").expect("rolled back");
        });
        let replay = idempotent_jobs::redelivered(true, || win_outcome(&mut c, k, "flagged-call"));
        rewrite.join().expect("the rewrite's thread");
        assert_eq!(
            held(check, &key).and_then(|r| r.result),
            Some("42".to_owned())
        );
        assert_eq!(tagged(check, "flagged-call"), 0);
        assert_eq!(replay, Ok((false, 42)), "the committed result");
    });
}

/// `k` run, then rewritten to 999 by another session between the `CALL` and the read (uncommitted,
/// rolled back later) while a session at `level` calls it: the call must replay 42. `window`: the
/// rewrite must get in (the new procedure's rollback lets it); without, it may fail (the old
/// procedure holds the key's lock through the read: a deadlock whose victim is the rewrite).
fn dirty_rewrite(url: &str, check: &mut MysqlConnection, k: &str, level: &str, window: bool) {
    let key = win::key(k);
    assert_eq!(win_outcome(&mut fresh(url, ""), k, k), Ok((true, 42)));
    let sql = format!(
        "BEGIN; UPDATE done_jobs SET result = '999' WHERE key_digest = {}",
        hex(&key)
    );
    let (called, left, queued) = between_the_claim_and_the_read(
        url,
        check,
        k,
        &format!("SET SESSION TRANSACTION ISOLATION LEVEL {level}"),
        |_| sql,
        std::time::Duration::from_millis(1500),
    );
    figures::report(&format!(
        "{level}: another session rewrote the result, uncommitted, between the CALL and the read: the call {called:?}; the rewrite {queued:?}"
    ));
    if window {
        queued.expect("the uncommitted rewrite");
    }
    assert_eq!(left, Some((0, 0)), "{level}: nothing left open by the call");
    assert_eq!(
        held(check, &key).and_then(|r| r.result),
        Some("42".to_owned()),
        "the database holds 42"
    );
    assert_eq!(
        called,
        Ok((false, 42)),
        "{level}: the call must replay what the database holds"
    );
    assert_eq!(tagged(check, &format!("{k}-call")), 0);
}

/// The connection killed (`KILL CONNECTION` from another session) right after the `CALL` found the
/// key taken: the call fails (or replays, if its read came first), nothing of it is committed, the
/// row is as it was, and a new connection replays the key through the claim.
#[test]
fn a_connection_killed_between_the_claim_and_the_read() {
    with_procedures("killed", |url, check| {
        let k = "killed";
        let key = win::key(k);
        assert_eq!(win_outcome(&mut fresh(url, ""), k, k), Ok((true, 42)));
        let lock = format!(
            "BEGIN; UPDATE done_jobs SET claim_token = claim_token WHERE key_digest = {}",
            hex(&key)
        );
        let (called, _, queued) = between_the_claim_and_the_read(
            url,
            check,
            k,
            "",
            |id| format!("{lock}; KILL CONNECTION {id}"),
            std::time::Duration::ZERO,
        );
        figures::report(&format!(
            "the connection killed between the CALL and the read: the call {called:?}; the kill {queued:?}"
        ));
        queued.expect("the kill");
        assert!(called.is_err() || called == Ok((false, 42)), "{called:?}");
        let row = held(check, &key).expect("the row");
        assert_eq!((row.result.as_deref(), row.lapsed), (Some("42"), 0));
        assert_eq!(tagged(check, &format!("{k}-call")), 0);
        let mut c = fresh(url, "");
        win_outcome(&mut c, "warm", "warm").expect("warm-up");
        win_outcome(&mut c, "warm", "warm").expect("warm-up replay");
        let (replay, trips, called) = counted(&mut c, |c| win_outcome(c, k, "killed-next"));
        assert_eq!((replay, trips, called), (Ok((false, 42)), 2, 1));
        assert_eq!(tagged(check, "killed-next"), 0);
    });
}

/// Session settings of the caller's (the server's messages in German, `sql_mode`s, character sets
/// of results, isolation levels, a statement time limit, `completion_type = 'CHAIN'`): the
/// procedure's duplicate is still recognised (the replay takes 2 round trips and 1 `CALL`), the
/// replay returns the run's result, the body ran once, and neither the run nor the replay leaves
/// anything open. At READ UNCOMMITTED the read outside a transaction is not trusted
/// (it could see an uncommitted result): the replay claims again the usual way, with its read of
/// the taken key locked (6 round trips, 3 `CALL`s).
#[test]
fn session_settings_replay_through_the_claim() {
    with_procedures("sessions", |url, check| {
        for (i, settings) in [
            "SET SESSION lc_messages = 'de_DE'",
            "SET SESSION lc_messages = 'ja_JP'; SET NAMES utf8mb4",
            "SET SESSION sql_mode = 'ORACLE'",
            "SET SESSION sql_mode = 'ANSI_QUOTES,NO_BACKSLASH_ESCAPES,PIPES_AS_CONCAT'",
            "SET SESSION sql_mode = ''",
            "SET NAMES latin1",
            "SET character_set_results = NULL",
            "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            "SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED",
            "SET SESSION max_statement_time = 0.5",
            "SET SESSION completion_type = 'CHAIN'",
            "SET SESSION big_tables = 1",
        ]
        .into_iter()
        .enumerate()
        {
            let mut c = fresh(url, settings);
            let k = format!("sess-{i}");
            let run = counted(&mut c, |c| win_outcome(c, &k, &k));
            let after_run = open(&mut c);
            win_outcome(&mut c, &format!("{k}-warm"), "warm").expect("warm-up");
            win_outcome(&mut c, &format!("{k}-warm"), "warm").expect("warm-up replay");
            let replay = counted(&mut c, |c| win_outcome(c, &k, &k));
            let after_replay = open(&mut c);
            figures::report(&format!(
                "{settings}: run {run:?} (open after: {after_run:?}), replay {replay:?} (open after: {after_replay:?})"
            ));
            assert_eq!(run.0, Ok((true, 42)), "{settings}");
            let expected = match settings.contains("READ UNCOMMITTED") {
                // The replay's transaction ends with its ROLLBACK, not a CALL of the finish.
                true => (Ok((false, 42)), 6, 2),
                false => (Ok((false, 42)), 2, 1),
            };
            assert_eq!(replay, expected, "{settings}: through the claim");
            assert_eq!(
                (after_run, after_replay),
                ((0, 0), (0, 0)),
                "{settings}: nothing left open after a run, nor after a replay (completion_type = \
                 CHAIN opened the next transaction after both before they ended theirs AND NO CHAIN)"
            );
            assert_eq!(tagged(check, &k), 1, "{settings}");
        }
    });
}

/// A read-only session (`SET SESSION TRANSACTION READ ONLY`) calls a finished key without the
/// redelivery flag: it replays the run's result, or is refused; either way nothing is written or
/// left open. Flagged as a redelivery, it replays from one read (after one question).
#[test]
fn a_read_only_session_replays_or_is_refused_cleanly() {
    with_procedures("readonly", |url, check| {
        let k = "ro";
        assert_eq!(win_outcome(&mut fresh(url, ""), k, k), Ok((true, 42)));
        let mut c = fresh(url, "SET SESSION TRANSACTION READ ONLY");
        let (plain, trips, called) = counted(&mut c, |c| win_outcome(c, k, "ro-plain"));
        figures::report(&format!(
            "a read-only session, a finished key, not flagged: {plain:?} in {trips} round trips, {called} CALLs"
        ));
        assert!(plain.is_err() || plain == Ok((false, 42)), "{plain:?}");
        assert_eq!(open(&mut c), (0, 0));
        let (flagged, trips, _) = counted(&mut c, |c| {
            idempotent_jobs::redelivered(true, || win_outcome(c, k, "ro-flagged"))
        });
        // The read, after the question whether it may read outside a transaction.
        assert_eq!((flagged, trips), (Ok((false, 42)), 2));
        assert_eq!(
            (
                tagged(check, k),
                tagged(check, "ro-plain"),
                tagged(check, "ro-flagged")
            ),
            (1, 0, 0)
        );
        assert_eq!(
            held(check, &win::key(k)).and_then(|r| r.result),
            Some("42".to_owned())
        );
    });
}

/// Four workers call five keys over and over while a fifth session forgets, lapses and unfinishes
/// their rows at random moments (some between a `CALL` that found a key taken and its read): every
/// call returns 42, each key's effects are exactly the calls that said `Ran`, no worker's session
/// is left in a transaction, and every key ends finished (or forgotten).
#[test]
fn workers_and_an_operator_churning_keys_agree_with_the_database() {
    with_procedures("churn", |url, check| {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let operator = {
            let (url, stop) = (url.to_owned(), stop.clone());
            std::thread::spawn(move || {
                let mut o = fresh(&url, "");
                let mut changes = 0u32;
                let mut x = 0x2545_f491_u64;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let key = churned::key(&format!("churn-{}", x % 5));
                    let change = match (x >> 8) % 3 {
                        0 => "DELETE FROM done_jobs",
                        1 => "UPDATE done_jobs SET expires_at = UTC_TIMESTAMP(6)",
                        _ => "UPDATE done_jobs SET result = ''",
                    };
                    // A deadlock's victim now and then: the change is simply not made.
                    if o.batch_execute(&format!("{change} WHERE key_digest = {}", hex(&key)))
                        .is_ok()
                    {
                        changes += 1;
                    }
                    std::thread::sleep(std::time::Duration::from_micros(500 + (x >> 20) % 3000));
                }
                changes
            })
        };
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let url = url.to_owned();
                std::thread::spawn(move || {
                    let mut c = fresh(&url, "");
                    let mut ran = [0i64; 5];
                    let mut outcomes = Vec::new();
                    for i in 0..120 {
                        let k = (i * 7 + w * 3) % 5;
                        let name = format!("churn-{k}");
                        let got = churn_outcome(&mut c, &name, &name);
                        if got == Ok((true, 42)) {
                            ran[k] += 1;
                        }
                        outcomes.push(got);
                    }
                    (ran, outcomes, try_open(&mut c))
                })
            })
            .collect();
        let mut ran = [0i64; 5];
        let mut replayed = 0;
        for worker in workers {
            let (r, outcomes, left) = worker.join().expect("a worker");
            for (k, n) in r.iter().enumerate() {
                ran[k] += n;
            }
            let bad: Vec<_> = outcomes
                .iter()
                .filter(|o| o.as_ref().map(|o| o.1) != Ok(42))
                .collect();
            assert!(bad.is_empty(), "calls that did not return 42: {bad:?}");
            replayed += outcomes.iter().filter(|o| **o == Ok((false, 42))).count();
            assert_eq!(left, Some((0, 0)), "a worker's session left open");
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let changes = operator.join().expect("the operator");
        figures::report(&format!(
            "churn: runs per key {ran:?}, {replayed} replays, {changes} changes by the operator"
        ));
        for (k, runs) in ran.iter().enumerate() {
            let name = format!("churn-{k}");
            assert_eq!(
                tagged(check, &name),
                *runs,
                "{name}: effects against runs reported"
            );
            let mut c = fresh(url, "");
            let last = churn_outcome(&mut c, &name, &name);
            let extra = i64::from(last == Ok((true, 42)));
            assert_eq!(last.map(|o| o.1), Ok(42));
            assert_eq!(tagged(check, &name), runs + extra);
            assert_eq!(
                held(check, &churned::key(&name)).and_then(|r| r.result),
                Some("42".to_owned()),
                "{name}: finished"
            );
        }
    });
}

/// A worker's role that may call the job procedures but not insert into `done_jobs` (a grant
/// forgotten): `idempotent_begin_and_claim` has begun its transaction when its claim is refused
/// (INSERT command denied, error 1142). The job fails saying so, and no transaction is left open
/// on the connection. Before, "command denied" was read as the procedure itself refused: the
/// runtime took it for "nothing begun", its fallback then met the procedure's open transaction
/// and said `InsideTransaction`, and that transaction stayed open: every later job on the
/// connection was refused, and the application's own writes on it (autocommit, it thought) were
/// lost when the connection closed.
#[test]
fn a_role_that_may_not_claim_leaves_no_transaction_open() {
    with_database("noinsert", |url, check| {
        check
            .batch_execute(
                "CREATE TABLE procedure_effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id VARCHAR(100) NOT NULL)",
            )
            .expect("the effects table");
        let database = url.rsplit_once('/').expect("a database").1;
        let user = format!("noinsert_{}", std::process::id());
        check
            .batch_execute(&format!(
                "CREATE USER '{user}'@'%';
                 GRANT SELECT, UPDATE, DELETE ON {database}.done_jobs TO '{user}'@'%';
                 GRANT SELECT ON {database}.idempotent_schema TO '{user}'@'%';
                 GRANT SELECT, INSERT ON {database}.procedure_effects TO '{user}'@'%';
                 GRANT EXECUTE ON PROCEDURE {database}.idempotent_begin_job TO '{user}'@'%';
                 GRANT EXECUTE ON PROCEDURE {database}.idempotent_begin_and_claim TO '{user}'@'%';
                 GRANT EXECUTE ON PROCEDURE {database}.idempotent_finish_job TO '{user}'@'%';"
            ))
            .expect("a role without INSERT on done_jobs");
        let (server, _) = url.rsplit_once('/').expect("a database in the URL");
        let after_scheme = server.find("://").map_or(0, |i| i + 3);
        let host = server[after_scheme..]
            .rsplit_once('@')
            .map_or(&server[after_scheme..], |(_, h)| h);
        let outcome = MysqlConnection::establish(&format!("mysql://{user}@{host}/{database}"))
            .map_err(|e| e.to_string())
            .map(|mut worker| {
                let error = charge(&mut worker, "denied", "", "").map_err(|e| {
                    let mut shown = e.to_string();
                    let mut source = std::error::Error::source(&e);
                    while let Some(cause) = source {
                        shown.push_str(&format!(": {cause}"));
                        source = cause.source();
                    }
                    shown
                });
                let open = n(&mut worker, "SELECT @@in_transaction AS n");
                let written = worker
                    .batch_execute("INSERT INTO procedure_effects (order_id) VALUES ('after')");
                (error, open, written.map_err(|e| e.to_string()))
            });
        let kept = n(
            check,
            "SELECT COUNT(*) AS n FROM procedure_effects WHERE order_id = 'after'",
        );
        let _ = check.batch_execute(&format!("DROP USER '{user}'@'%'"));
        let (error, open, written) = outcome.expect("the restricted role connects");
        let error = error.expect_err("the claim is refused");
        assert!(
            error.contains("INSERT command denied") && !error.contains("inside a transaction"),
            "the refusal, not a transaction of the caller's: {error}"
        );
        assert_eq!(
            open, 0,
            "no transaction is left open after the refused claim"
        );
        written.expect("the application's own write");
        assert_eq!(kept, 1, "the application's write after it is committed");
    });
}
