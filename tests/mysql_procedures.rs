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
        (3, 2),
        "CALL begin-and-claim (the key's duplicate), the row's read, CALL finish"
    );
    assert_eq!(effects(&mut conn, "a"), 1, "ran once, replayed once");

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
