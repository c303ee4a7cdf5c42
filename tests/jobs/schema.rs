//! The runtime's own tables: created once however many workers start together, found where the
//! job statements find them, upgraded in place. Written once for every connection type.

use std::sync::Barrier;
use std::time::Duration;

use idempotent_jobs::JobKey;

use crate::backends::Backend;
use crate::harness::{Db, Server};

/// Eight workers start at once on an empty database and each calls `migrate`: all succeed, and
/// the schema exists once, at the latest version.
pub fn concurrent_first_migrations_all_succeed<B: Backend>() {
    const WORKERS: usize = 8;
    let db = Db::<B>::empty();
    let barrier = Barrier::new(WORKERS);
    let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (db, barrier) = (&db, &barrier);
                scope.spawn(move || {
                    let mut conn = db.connect();
                    barrier.wait();
                    B::migrate(&mut conn).map_err(|e| e.to_string())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a worker thread"))
            .collect()
    });
    for result in &results {
        assert!(result.is_ok(), "{results:?}");
    }
    let mut conn = db.connect();
    let snapshot = B::snapshot(&mut conn);
    assert_eq!(
        snapshot.rows("idempotent_schema").len(),
        steps(B::SERVER),
        "every step recorded once: {:?}",
        snapshot.rows("idempotent_schema")
    );
    assert!(snapshot.table_names().any(|t| t.ends_with("done_jobs")));
    assert!(snapshot.table_names().any(|t| t.ends_with("outbox")));
}

/// How many steps the runtime's schema has on `server`: its shipped SQL files, less the version
/// table's own (SQLite and PostgreSQL 4; MySQL 5, with the job procedures).
fn steps(server: Server) -> usize {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("idempotent-runtime/sql")
        .join(match server {
            Server::Sqlite => "sqlite",
            Server::Postgres => "postgres",
            Server::Mysql => "mysql",
        });
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .filter(|f| !f.file_name().to_string_lossy().starts_with("000_"))
        .count()
}

/// Runs the application's own Diesel migrations through a sync connection of `server`: all of
/// them, then reverts the last two and runs them again, as `diesel migration run`, `revert` and
/// `redo` would. Returns the versions applied in the end.
fn application_migrations(server: Server, url: &str) -> Result<Vec<String>, String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/app_migrations")
        .join(match server {
            Server::Sqlite => "sqlite",
            Server::Postgres => "postgres",
            Server::Mysql => "mysql",
        });
    macro_rules! cycle {
        ($conn:ty) => {{
            use diesel::Connection as _;
            use diesel_migrations::{FileBasedMigrations, MigrationHarness as _};
            let mut conn = <$conn>::establish(url).map_err(|e| e.to_string())?;
            let migrations = FileBasedMigrations::from_path(&dir).map_err(|e| e.to_string())?;
            conn.run_pending_migrations(migrations.clone())
                .map_err(|e| format!("run: {e}"))?;
            conn.revert_last_migration(migrations.clone())
                .map_err(|e| format!("revert: {e}"))?;
            conn.revert_last_migration(migrations.clone())
                .map_err(|e| format!("revert: {e}"))?;
            conn.run_pending_migrations(migrations.clone())
                .map_err(|e| format!("run again: {e}"))?;
            let mut applied: Vec<String> = conn
                .applied_migrations()
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|v| v.to_string())
                .collect();
            applied.sort();
            Ok(applied)
        }};
    }
    match server {
        #[cfg(feature = "sqlite")]
        Server::Sqlite => cycle!(diesel::SqliteConnection),
        #[cfg(feature = "postgres")]
        Server::Postgres => cycle!(diesel::PgConnection),
        #[cfg(feature = "mysql")]
        Server::Mysql => cycle!(diesel::MysqlConnection),
        #[allow(unreachable_patterns)]
        other => panic!("the application's migrations need the sync {other:?} feature"),
    }
}

/// The runtime keeps its schema version to itself: the application's own Diesel migrations run and
/// revert before and after `migrate`, and their table holds only their own versions.
pub fn the_applications_own_migrations_keep_working<B: Backend>() {
    let db = Db::<B>::empty();
    let app = ["20261101000001".to_owned(), "20261102000001".to_owned()];
    assert_eq!(
        application_migrations(B::SERVER, db.locator()),
        Ok(app.to_vec())
    );
    let mut conn = db.connect();
    B::migrate(&mut conn).expect("the runtime's tables");
    assert_eq!(
        application_migrations(B::SERVER, db.locator()),
        Ok(app.to_vec()),
        "the application's migrations still run and revert"
    );
    B::migrate(&mut conn).expect("current: nothing to do");
    assert!(B::verify(&mut conn).is_ok());
    let snapshot = B::snapshot(&mut conn);
    assert_eq!(
        snapshot.rows("__diesel_schema_migrations").len(),
        2,
        "only the application's versions: {:?}",
        snapshot.rows("__diesel_schema_migrations")
    );
}

/// A literal of `bytes` as each database writes binary.
fn binary_literal(server: Server, bytes: &[u8]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    match server {
        Server::Postgres => format!("'\\x{hex}'::bytea"),
        Server::Sqlite | Server::Mysql => format!("X'{hex}'"),
    }
}

/// What the previous release (0.1.0 before this redesign) left: its tables, made by Diesel's
/// harness, which recorded their versions in the application's migration table; a claimed key
/// with a stored result, and a message not yet sent.
fn previous_release(server: Server) -> Vec<String> {
    let dir = match server {
        Server::Sqlite => "sqlite",
        Server::Postgres => "postgres",
        Server::Mysql => "mysql",
    };
    let fixture = |file: &str| {
        std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/v0_1")
                .join(dir)
                .join(file),
        )
        .expect("the previous release's SQL")
    };
    let digest = JobKey::new("plain:old").digest();
    vec![
        fixture("1_done_jobs.sql"),
        fixture("2_outbox.sql"),
        "CREATE TABLE __diesel_schema_migrations (version VARCHAR(50) PRIMARY KEY NOT NULL, run_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)".to_owned(),
        "INSERT INTO __diesel_schema_migrations (version) VALUES ('20261130000001'), ('20261130000002'), ('20261001000001')".to_owned(),
        format!(
            "INSERT INTO done_jobs (key_digest, job_key, job_name, result, done_at) VALUES ({}, 'plain:old', 'plain', '41', '2026-11-01 10:00:00.123456')",
            binary_literal(server, &digest)
        ),
        "INSERT INTO outbox (message_id, topic, payload, job_key, created_at, available_at) VALUES ('msg_old', 'old', '1', 'plain:old', '2026-11-01 10:00:00', '2026-11-01 10:00:00')".to_owned(),
    ]
}

/// Upgrading from the previous release: its keys still replay, its pending messages still go
/// out, and its two rows leave the application's migration table (the application's own stay).
pub fn upgrades_keep_keys_and_messages<B: Backend>() {
    let db = Db::<B>::empty();
    let mut conn = db.connect();
    for sql in previous_release(B::SERVER) {
        B::execute(&mut conn, &sql);
    }
    B::migrate(&mut conn).expect("the upgrade");
    let replay = B::plain(&mut conn, &JobKey::new("plain:old"), None).expect("the old key");
    assert!(replay.is_replayed());
    assert_eq!(replay.into_inner(), 41, "the stored result of the old run");
    assert_eq!(B::drain_outbox(&mut conn), ["msg_old"]);
    let snapshot = B::snapshot(&mut conn);
    let versions = snapshot.rows("__diesel_schema_migrations");
    assert_eq!(versions.len(), 1, "{versions:?}");
    assert!(versions[0].contains("20261001000001"), "{versions:?}");
    assert_eq!(snapshot.rows("idempotent_schema").len(), steps(B::SERVER));
    assert!(B::verify(&mut conn).is_ok());
}

/// `verify` reads only: on an empty database it lists what is missing and creates nothing.
pub fn verify_lists_what_is_missing<B: Backend>() {
    let db = Db::<B>::empty();
    let mut conn = db.connect();
    match B::verify(&mut conn) {
        Err(idempotent_jobs::Error::SchemaNotReady { problems }) => {
            let all = problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n");
            for table in ["idempotent_schema", "done_jobs", "outbox"] {
                assert!(all.contains(table), "{all}");
            }
            // Each problem once: a missing version table is not also an unreadable version.
            assert_eq!(problems.len(), 3, "{all}");
        }
        other => panic!("expected SchemaNotReady, got {other:?}"),
    }
    assert!(
        B::snapshot(&mut conn).table_names().next().is_none(),
        "verify created nothing"
    );
    B::migrate(&mut conn).expect("the tables");
    B::verify(&mut conn).expect("ready");
}

/// An application's own table named `outbox` (a common name) is not the runtime's: `migrate`
/// refuses before it changes anything, naming it, and says a retry meets the same; `verify` names
/// it too. Before, `migrate` failed at the runtime's index on `lease_owner` with "calling migrate
/// again resumes where this stopped", every time; on MariaDB (whose DDL commits by itself) it had
/// recorded the outbox's steps as made, so even with the table renamed away no `migrate` could
/// ever make the runtime's; and MariaDB's `verify` failed on the unknown column.
pub fn migrate_refuses_an_applications_table_of_the_same_name<B: Backend>() {
    let db = Db::<B>::empty();
    let mut conn = db.connect();
    let text = match B::SERVER {
        crate::harness::Server::Mysql => "VARCHAR(200)",
        _ => "TEXT",
    };
    B::execute(
        &mut conn,
        &format!(
            "CREATE TABLE outbox (id BIGINT PRIMARY KEY, topic {text}, payload {text}, sent_at {text})"
        ),
    );
    B::execute(
        &mut conn,
        "INSERT INTO outbox (id, topic) VALUES (1, 'the application''s')",
    );
    let problem = idempotent_jobs::SchemaProblem::ForeignTable {
        table: "outbox",
        lacks: "message_id",
    };
    for _ in 0..2 {
        match B::migrate(&mut conn) {
            Err(error @ idempotent_jobs::Error::Migration { .. }) => {
                let text = crate::harness::with_causes(&error);
                assert!(
                    text.contains("nothing was changed")
                        && text.contains("not the runtime's")
                        && !text.contains("resumes"),
                    "{text}"
                );
            }
            other => panic!("migrate over the application's outbox: {other:?}"),
        }
        let tables: Vec<String> = B::snapshot(&mut conn)
            .table_names()
            .map(str::to_owned)
            .collect();
        assert!(
            tables.len() == 1 && (tables[0] == "outbox" || tables[0].ends_with(".outbox")),
            "nothing was made beside the application's table: {tables:?}"
        );
    }
    match B::verify(&mut conn) {
        Err(idempotent_jobs::Error::SchemaNotReady { problems }) => {
            assert!(problems.contains(&problem), "{problems:?}");
        }
        other => panic!("verify beside the application's outbox: {other:?}"),
    }
    let rename = match B::SERVER {
        crate::harness::Server::Mysql => "RENAME TABLE outbox TO app_outbox",
        _ => "ALTER TABLE outbox RENAME TO app_outbox",
    };
    B::execute(&mut conn, rename);
    B::migrate(&mut conn).expect("the runtime's tables, once the name is free");
    B::verify(&mut conn).expect("ready");

    // A schema whose outbox step is recorded, with the application's table in its place (what an
    // earlier build left) and a later outbox step (its index) pending: refused too, not "resumes".
    B::execute(&mut conn, "DROP TABLE outbox");
    B::execute(
        &mut conn,
        &format!(
            "CREATE TABLE outbox (id BIGINT PRIMARY KEY, topic {text}, payload {text}, sent_at {text})"
        ),
    );
    B::execute(&mut conn, "DELETE FROM idempotent_schema WHERE version > 3");
    match B::migrate(&mut conn) {
        Err(error @ idempotent_jobs::Error::Migration { .. }) => {
            let text = crate::harness::with_causes(&error);
            assert!(
                text.contains("not the runtime's") && !text.contains("resumes"),
                "{text}"
            );
        }
        other => panic!("migrate with the outbox's index pending: {other:?}"),
    }
}

/// A runtime table dropped (or renamed) after `migrate` made it: `idempotent_schema` still records
/// the step, and `migrate` passes recorded steps by. Before: `verify` said the table was missing,
/// "run migrate", and `migrate` returned `Ok(())` having made nothing, every time. Now both name
/// the lost table and the statement that lets `migrate` make it again, and after that statement
/// `migrate` does.
pub fn a_table_lost_after_migrate_is_named_with_its_repair<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::execute(&mut conn, "DROP TABLE outbox");
    match B::verify(&mut conn) {
        Err(idempotent_jobs::Error::SchemaNotReady { problems }) => {
            assert_eq!(
                problems,
                [idempotent_jobs::SchemaProblem::Lost {
                    table: "outbox",
                    version: 2
                }]
            );
        }
        other => panic!("verify without the outbox: {other:?}"),
    }
    match B::migrate(&mut conn) {
        Err(error @ idempotent_jobs::Error::Migration { .. }) => {
            let text = crate::harness::with_causes(&error);
            assert!(
                text.contains("DELETE FROM idempotent_schema WHERE version >= 2")
                    && text.contains("nothing was changed"),
                "{text}"
            );
        }
        other => panic!("migrate without the outbox: {other:?}"),
    }
    B::execute(
        &mut conn,
        "DELETE FROM idempotent_schema WHERE version >= 2",
    );
    B::migrate(&mut conn).expect("the outbox again");
    B::verify(&mut conn).expect("ready");
    assert_eq!(
        B::query_i64(
            &mut conn,
            "SELECT COUNT(*) - MAX(version) AS n FROM idempotent_schema"
        ),
        0,
        "every version recorded once"
    );
}

/// After each `(set, found)`'s `set` on a session of its own, `verify` names the settings
/// (`found`) in a problem whose words hold `fix`; after `reset`, it finds none.
fn verify_names_each_character_set<B: Backend>(cases: &[(&str, &str)], fix: &str, reset: &str) {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::verify(&mut conn).expect("Diesel's own session");
    for (set, found) in cases {
        B::execute(&mut conn, set);
        match B::verify(&mut conn) {
            Err(idempotent_jobs::Error::SchemaNotReady { problems }) => {
                assert_eq!(
                    problems,
                    [idempotent_jobs::SchemaProblem::SessionCharset {
                        found: (*found).to_owned()
                    }],
                    "after {set}"
                );
                assert!(problems[0].to_string().contains(fix), "{}", problems[0]);
            }
            other => panic!("after {set}: {other:?}"),
        }
        B::execute(&mut conn, reset);
    }
    B::verify(&mut conn).unwrap_or_else(|error| panic!("after {reset}: {error}"));
}

/// MySQL/MariaDB: a session whose character set is not utf8mb4 (a pool's connection hook that
/// runs `SET NAMES latin1`) stores keys, results and messages converted through it, read back
/// changed on other sessions. `verify`, run on such a connection before the jobs, names the
/// settings; `binary` (which converts nothing) and no `character_set_results` pass.
pub fn verify_names_a_session_character_set_that_is_not_utf8mb4<B: Backend>() {
    verify_names_each_character_set::<B>(
        &[
            (
                "SET NAMES latin1",
                "character_set_client = latin1, character_set_connection = latin1, character_set_results = latin1",
            ),
            (
                "SET character_set_client = cp1251",
                "character_set_client = cp1251",
            ),
            (
                "SET character_set_connection = utf8mb3",
                "character_set_connection = utf8mb3",
            ),
            (
                "SET character_set_results = latin1",
                "character_set_results = latin1",
            ),
        ],
        "utf8mb4",
        "SET NAMES utf8mb4",
    );
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    for set in ["SET NAMES binary", "SET character_set_results = NULL"] {
        B::execute(&mut conn, set);
        B::verify(&mut conn).unwrap_or_else(|error| panic!("after {set}: {error}"));
        B::execute(&mut conn, "SET NAMES utf8mb4");
    }
}

/// PostgreSQL: a session whose `client_encoding` is not UTF8 (a pool's hook that runs
/// `SET client_encoding = 'LATIN1'`) converts text through it, and refuses a row holding a
/// character it cannot show as it reads it: a relay's lease of a batch with such a message failed
/// every time, rolled back, its attempts never counted, the batch never delivered nor parked, and
/// `verify` said all was well. It names the setting now.
pub fn verify_names_a_session_client_encoding_that_is_not_utf8<B: Backend>() {
    verify_names_each_character_set::<B>(
        &[
            ("SET client_encoding = 'LATIN1'", "client_encoding = LATIN1"),
            (
                "SET client_encoding = 'WIN1251'",
                "client_encoding = WIN1251",
            ),
            (
                "SET client_encoding = 'SQL_ASCII'",
                "client_encoding = SQL_ASCII",
            ),
        ],
        "SET client_encoding",
        "SET client_encoding = 'UTF8'",
    );
}

/// A session whose clock is set (`SET timestamp`): `UTC_TIMESTAMP()`, the database's clock the
/// runtime reads, follows it. Such a session ran a job twice within its `keep` and pruned keys
/// other sessions still kept, and `verify` said all was well. It names the clock now.
pub fn verify_names_a_session_clock_of_its_own<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::verify(&mut conn).expect("a session as Diesel connects it");
    for (set, ahead) in [
        ("SET timestamp = UNIX_TIMESTAMP() + 7200", true),
        ("SET timestamp = UNIX_TIMESTAMP() - 86400", false),
    ] {
        B::execute(&mut conn, set);
        match B::verify(&mut conn) {
            Err(idempotent_jobs::Error::SchemaNotReady { problems }) => {
                assert!(
                    matches!(
                        problems.as_slice(),
                        [idempotent_jobs::SchemaProblem::SessionClock { offset_seconds }]
                            if (*offset_seconds > 0) == ahead && offset_seconds.abs() >= 7000
                    ),
                    "after {set}: {problems:?}"
                );
                assert!(
                    problems[0].to_string().contains("SET timestamp = DEFAULT"),
                    "{}",
                    problems[0]
                );
            }
            other => panic!("after {set}: {other:?}"),
        }
    }
    B::execute(&mut conn, "SET timestamp = DEFAULT");
    B::verify(&mut conn).expect("the clock back");
}

/// While another migration holds the lock, `migrate` waits at most its timeout, then says so and
/// changes nothing.
pub fn a_held_migration_lock_times_out_clearly<B: Backend>(hold: &str, release: &str) {
    let db = Db::<B>::empty();
    let mut holder = db.connect();
    B::execute(&mut holder, hold);
    let mut conn = db.connect();
    // By events, not a duration: the holder lets go of the lock only once `migrate` has returned,
    // or, if `migrate` waits as if there were no timeout, after a minute; then `migrate` gets the
    // lock and succeeds, and the test fails saying so instead of hanging.
    let (returned, migrate_returned) = std::sync::mpsc::channel::<()>();
    let error = std::thread::scope(|scope| {
        let holder = &mut holder;
        let letting_go = scope.spawn(move || {
            let returned_first = migrate_returned
                .recv_timeout(Duration::from_secs(60))
                .is_ok();
            B::execute(holder, release);
            returned_first
        });
        let migrated = B::migrate_waiting(&mut conn, Duration::from_secs(1));
        let _ = returned.send(());
        let error = migrated.expect_err(
            "migrate waited for the migration lock until its holder let go, a minute later, instead of giving up after its 1 s timeout",
        );
        assert!(
            letting_go.join().expect("the holder"),
            "the holder let go before migrate returned"
        );
        error
    });
    assert!(
        crate::harness::with_causes(&error).contains("held"),
        "{}",
        crate::harness::with_causes(&error)
    );
    assert!(
        crate::harness::with_causes(&error).contains("nothing was changed"),
        "{error}"
    );
    // A wait that passes: a later call finishes once the other migration has (it said "not
    // retryable" while its text said to retry).
    assert!(error.is_retryable(), "{error}");
    assert!(B::snapshot(&mut conn).table_names().next().is_none());
    B::migrate_waiting(&mut conn, Duration::from_secs(1)).expect("the lock is free");
}

/// A step whose table was created but whose version was not recorded (MySQL's DDL commits by
/// itself; the process died in between) is found done, recorded, and `migrate` goes on.
pub fn an_interrupted_step_resumes<B: Backend>() {
    let db = Db::<B>::empty();
    let mut conn = db.connect();
    let file = |name: &str| {
        std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("idempotent-runtime/sql/mysql")
                .join(name),
        )
        .expect("a step's SQL")
    };
    B::execute(&mut conn, &file("000_idempotent_schema.sql"));
    B::execute(&mut conn, &file("001_done_jobs.sql"));
    let outbox = file("002_outbox.sql");
    let create_only = outbox
        .split("INSERT IGNORE INTO idempotent_schema")
        .next()
        .expect("the CREATE TABLE");
    B::execute(&mut conn, create_only);
    B::migrate(&mut conn).expect("migrate resumes");
    assert_eq!(
        B::snapshot(&mut conn).rows("idempotent_schema").len(),
        steps(B::SERVER)
    );
    B::verify(&mut conn).expect("ready");
}

/// The indexes of the last step (on the leased messages) on `server`, and how to drop them.
fn leased_indexes(server: Server) -> (&'static [&'static str], String) {
    match server {
        Server::Sqlite => (
            &["outbox_leased", "outbox_lease_owner"],
            "DROP INDEX outbox_leased; DROP INDEX outbox_lease_owner".to_owned(),
        ),
        Server::Postgres => (&["outbox_leased"], "DROP INDEX outbox_leased".to_owned()),
        Server::Mysql => (
            &["outbox_leased"],
            "DROP INDEX outbox_leased ON outbox".to_owned(),
        ),
    }
}

/// How many of `indexes` the outbox has, as the connection finds it.
fn outbox_indexes<B: Backend>(conn: &mut B::Conn, indexes: &[&str]) -> i64 {
    let list = indexes
        .iter()
        .map(|index| format!("'{index}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = match B::SERVER {
        Server::Sqlite => format!(
            "SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'index' AND tbl_name = 'outbox' AND name IN ({list})"
        ),
        Server::Postgres => format!(
            "SELECT COUNT(*) AS n FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
             WHERE i.indrelid = 'outbox'::regclass AND c.relname IN ({list})"
        ),
        Server::Mysql => format!(
            "SELECT COUNT(DISTINCT index_name) AS n FROM information_schema.statistics \
             WHERE table_schema = DATABASE() AND table_name = 'outbox' AND index_name IN ({list})"
        ),
    };
    B::query_i64(conn, &sql)
}

/// The last step only adds indexes to a table that exists: on a database of the release before
/// it (the step's version not recorded, its indexes not there), `migrate` makes them, and does
/// not take the table for the step's whole work. Where the indexes were made and the version not
/// recorded (an operator built them first, `CONCURRENTLY` on PostgreSQL; MySQL's DDL commits by
/// itself and the process died before the record), `migrate` records the step and succeeds.
pub fn an_index_step_is_made_on_upgrade_and_found_when_made_already<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let (indexes, drop) = leased_indexes(B::SERVER);
    let latest = i64::try_from(steps(B::SERVER)).expect("a few steps");
    let forget_the_step = format!("DELETE FROM idempotent_schema WHERE version = {latest}");
    let expected = i64::try_from(indexes.len()).expect("a few indexes");
    assert_eq!(
        outbox_indexes::<B>(&mut conn, indexes),
        expected,
        "made by migrate"
    );
    // The release before: neither the indexes nor the step's version.
    B::execute(&mut conn, &drop);
    B::execute(&mut conn, &forget_the_step);
    assert_eq!(outbox_indexes::<B>(&mut conn, indexes), 0);
    B::migrate(&mut conn).expect("the upgrade");
    assert_eq!(
        outbox_indexes::<B>(&mut conn, indexes),
        expected,
        "the upgrade made the indexes"
    );
    // Made, not recorded.
    B::execute(&mut conn, &forget_the_step);
    B::migrate(&mut conn).expect("the step found made");
    assert_eq!(
        B::query_i64(
            &mut conn,
            &format!("SELECT COUNT(*) AS n FROM idempotent_schema WHERE version = {latest}")
        ),
        1,
        "the step recorded"
    );
    B::verify(&mut conn).expect("ready");
}

/// PostgreSQL: a `CREATE INDEX CONCURRENTLY` of the last step's index that failed half-way (here a
/// unique index over duplicates, under the step's name) leaves an index that is not valid. It is
/// not taken for the step made: `migrate` fails, naming the outbox, records nothing, and succeeds
/// once the index is dropped.
pub fn an_invalid_index_is_not_the_step_made<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let latest = i64::try_from(steps(B::SERVER)).expect("a few steps");
    B::execute(&mut conn, "DROP INDEX outbox_leased");
    B::execute(
        &mut conn,
        &format!("DELETE FROM idempotent_schema WHERE version = {latest}"),
    );
    B::execute(
        &mut conn,
        "INSERT INTO outbox (message_id, topic, payload, created_at, available_at) \
         VALUES ('a', 'same', '{}', now(), now()), ('b', 'same', '{}', now(), now())",
    );
    let failed = B::try_execute(
        &mut conn,
        "CREATE UNIQUE INDEX CONCURRENTLY outbox_leased ON outbox (topic)",
    );
    assert!(
        failed.is_err(),
        "the concurrent build fails on the duplicates"
    );
    let error = B::migrate(&mut conn).expect_err("an invalid index is not the step made");
    assert!(
        matches!(
            error,
            idempotent_jobs::Error::Migration {
                table: "outbox",
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(
        B::query_i64(
            &mut conn,
            &format!("SELECT COUNT(*) AS n FROM idempotent_schema WHERE version = {latest}")
        ),
        0,
        "the step is not recorded"
    );
    B::execute(&mut conn, "DROP INDEX outbox_leased");
    B::migrate(&mut conn).expect("the step made");
    B::verify(&mut conn).expect("ready");
}

/// A step that fails names its table.
pub fn a_failed_step_names_its_table<B: Backend>() {
    let db = Db::<B>::empty();
    let mut conn = db.connect();
    B::execute(&mut conn, "CREATE VIEW outbox AS SELECT 1 AS id");
    let error = B::migrate(&mut conn).expect_err("a view stands where the outbox goes");
    assert!(
        matches!(
            error,
            idempotent_jobs::Error::Migration {
                table: "outbox",
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("`outbox`"), "{error}");
}

/// A dropped `migrate_async` future never leaves the migration lock held by a connection that
/// stays in use: either it finished, or its connection is marked broken (a pool discards it, and
/// closing it releases the lock).
pub fn a_dropped_migration_never_keeps_the_lock<
    B: Backend<Conn = crate::backends::AsyncConn<C>>,
    C,
>(
    lock_is_free: &str,
    reset: &str,
) where
    C: idempotent_jobs::AsyncJobStore + crate::async_effects::TransactionDepth,
{
    let db = Db::<B>::empty();
    let mut checker = db.connect();
    let (mut finished, mut broken) = (0, 0);
    for pendings in 1..=8 {
        B::execute(&mut checker, reset);
        let crate::backends::AsyncConn { runtime, mut conn } = db.connect();
        let completed = runtime.block_on(crate::async_effects::drop_after_pendings(
            pendings,
            idempotent_jobs::migrate_async(&mut conn),
        ));
        if completed.is_some() {
            finished += 1;
            continue;
        }
        match runtime.block_on(conn.transaction_depth()) {
            // Broken, or left inside a transaction: diesel-async's pools discard both (see
            // `is_broken_transaction_manager`), and closing it releases whatever it held.
            Err(_) | Ok(Some(_)) => {
                broken += 1;
                drop(conn);
            }
            Ok(None) => assert_eq!(
                B::query_i64(&mut checker, lock_is_free),
                1,
                "dropped after {pendings} pendings, the connection is still usable, and it holds the migration lock"
            ),
        }
        drop(runtime);
        // The server ends a closed session's locks once it has read the disconnect.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while B::query_i64(&mut checker, lock_is_free) != 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "dropped after {pendings} pendings: 10 s after the drop and the close, the lock is still held"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    crate::figures::report(&format!(
        "dropped migrations ({}): 8 drops, {broken} marked their connection broken, {finished} finished first",
        B::NAME
    ));
}

/// The README's `diesel.toml` filter names every table the runtime creates.
#[test]
fn the_readme_print_schema_filter_names_every_table() {
    let readme =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .expect("the README");
    let filter = readme
        .lines()
        .find(|line| line.contains("except_tables"))
        .expect("a diesel.toml filter in the README");
    for table in ["idempotent_schema", "done_jobs", "outbox"] {
        assert!(filter.contains(&format!("\"{table}\"")), "{filter}");
    }
}

/// The index entries of `indexes` the server counts as read so far on this connection's tables,
/// after this connection's own counts are flushed (PostgreSQL).
fn index_entries_read<B: Backend>(conn: &mut B::Conn, indexes: &str) -> i64 {
    B::execute(conn, "SELECT pg_stat_force_next_flush()");
    B::query_i64(
        conn,
        &format!(
            "SELECT COALESCE(SUM(idx_tup_read), 0)::bigint AS n FROM pg_stat_user_indexes \
             WHERE schemaname = current_schema() AND indexrelname IN ({indexes})"
        ),
    )
}

/// A relay round with nothing due reads no message backing off, and a prune with nothing lapsed
/// reads no key that expires later: each searches its index up to the database's clock, never
/// walks it. On PostgreSQL the clock (`clock_timestamp()`, volatile) in those conditions was
/// checked entry by entry, so every idle round walked every message backing off (0.3 s a round
/// with 995,000 of them), and every prune's last batch every key with a later expiry.
pub fn time_conditions_search_their_indexes<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::execute(
        &mut conn,
        "INSERT INTO outbox (message_id, topic, payload, created_at, available_at) \
         SELECT 'later-' || g, 't', '{}', now(), now() + interval '1 day' FROM generate_series(1, 2000) g; \
         INSERT INTO done_jobs (key_digest, job_key, job_name, done_at, expires_at) \
         SELECT sha256(('later-' || g)::bytea), 'later-' || g, 'later', now(), now() + interval '1 day' \
         FROM generate_series(1, 2000) g; \
         ANALYZE outbox; ANALYZE done_jobs",
    );
    let pending = index_entries_read::<B>(&mut conn, "'outbox_pending'");
    assert!(B::drain_outbox(&mut conn).is_empty(), "nothing is due");
    let after = index_entries_read::<B>(&mut conn, "'outbox_pending'");
    assert_eq!(
        after - pending,
        0,
        "an idle round read {} entries of messages backing off",
        after - pending
    );
    let expiring = index_entries_read::<B>(&mut conn, "'done_jobs_expires_at'");
    let report = B::prune(&mut conn, &idempotent_jobs::Prune::default());
    assert_eq!(report.removed, 0, "nothing lapsed");
    let after = index_entries_read::<B>(&mut conn, "'done_jobs_expires_at'");
    assert_eq!(
        after - expiring,
        0,
        "a prune with nothing lapsed read {} entries of keys that expire later",
        after - expiring
    );
    assert_eq!(
        B::query_i64(&mut conn, "SELECT COUNT(*) AS n FROM outbox"),
        2000
    );
    assert_eq!(
        B::query_i64(&mut conn, "SELECT COUNT(*) AS n FROM done_jobs"),
        2000
    );
}

/// MySQL/MariaDB: a relay on a database not migrated to `outbox_leased` yet (schema version 4)
/// reads leases as it did before that index: through `outbox_delivered`, over the undelivered
/// messages, never by a scan of the whole table with every delivered message kept until
/// `prune_delivered`. Before, the lease reads' hint ruled out `outbox_delivered` too and left
/// them a scan: each round read every delivered message, twice.
pub fn a_relay_before_the_leased_index_reads_no_delivered_message<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::execute(
        &mut conn,
        "DROP INDEX outbox_leased ON outbox; \
         INSERT INTO outbox (message_id, topic, payload, created_at, available_at, delivered_at) \
         WITH RECURSIVE a (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM a WHERE n < 49), \
         b (m) AS (SELECT 0 UNION ALL SELECT m + 1 FROM b WHERE m < 39) \
         SELECT CONCAT('sent-', n * 40 + m), 't', '{}', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), \
         UTC_TIMESTAMP(6) FROM a, b; \
         INSERT INTO outbox (message_id, topic, payload, created_at, available_at) \
         VALUES ('due-1', 't', '{}', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)), \
                ('due-2', 't', '{}', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)); \
         ANALYZE TABLE outbox",
    );
    let rows_scanned = |conn: &mut B::Conn| {
        B::query_i64(
            conn,
            "SELECT CAST(VARIABLE_VALUE AS SIGNED) AS n FROM information_schema.SESSION_STATUS \
             WHERE VARIABLE_NAME = 'HANDLER_READ_RND_NEXT'",
        )
    };
    let before = rows_scanned(&mut conn);
    let delivered = B::drain_outbox(&mut conn);
    let scanned = rows_scanned(&mut conn) - before;
    assert_eq!(delivered.len(), 2, "the due messages: {delivered:?}");
    // Reading the session's status scans a temporary table of it (a few hundred rows); a scan of
    // `outbox` reads its 2,002 rows in each lease read.
    assert!(
        scanned < 2_000,
        "a relay round scanned {scanned} rows: the delivered messages"
    );
    assert_eq!(
        B::query_i64(
            &mut conn,
            "SELECT COUNT(*) AS n FROM outbox WHERE delivered_at IS NOT NULL"
        ),
        2_002
    );
}

/// `Migrate::lock_timeout(Duration::MAX)` (wait as long as another migration takes): migrates.
/// On PostgreSQL it was `SET LOCAL lock_timeout = '18446744073709551615000ms'`, refused as out of
/// range: `Error::Migration`, nothing migrated.
pub fn a_migration_with_no_time_limit_migrates<B: Backend>() {
    let db = Db::<B>::empty();
    let mut conn = db.connect();
    B::migrate_waiting(&mut conn, Duration::MAX)
        .unwrap_or_else(|error| panic!("migrate with no time limit: {error}"));
    B::verify(&mut conn).unwrap_or_else(|error| panic!("verify after it: {error}"));
}

/// SQLite: a database file the connection keeps no journal of on disk (`journal_mode = MEMORY`
/// or `OFF`, on the main database or one attached): a process killed in the middle of a job can
/// leave the claim's page committed without the work's, and the key then replays, for ever, a
/// run whose work is missing; `verify` said all was well. It names each such database now; the
/// default journal, WAL, and an in-memory database (whose journal is always in memory, and which a
/// killed process takes whole) pass.
pub fn verify_names_a_journal_a_killed_process_cannot_undo<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::verify(&mut conn).expect("the default journal");
    let attached = format!("{}-attached.db", db.locator());
    B::execute(&mut conn, "ATTACH DATABASE ':memory:' AS scratch");
    B::verify(&mut conn).expect("an attached in-memory database");
    B::execute(&mut conn, &format!("ATTACH DATABASE '{attached}' AS aux"));
    for (set, found) in [
        (
            "PRAGMA main.journal_mode = MEMORY",
            "main (journal_mode = memory)",
        ),
        (
            "PRAGMA main.journal_mode = OFF",
            "main (journal_mode = off)",
        ),
        (
            "PRAGMA aux.journal_mode = MEMORY",
            "aux (journal_mode = memory)",
        ),
    ] {
        B::execute(&mut conn, set);
        match B::verify(&mut conn) {
            Err(idempotent_jobs::Error::SchemaNotReady { problems }) => {
                assert_eq!(
                    problems,
                    [idempotent_jobs::SchemaProblem::VolatileJournal {
                        found: found.to_owned()
                    }],
                    "after {set}"
                );
                assert!(
                    problems[0].to_string().contains("journal_mode = WAL"),
                    "{}",
                    problems[0]
                );
            }
            other => panic!("after {set}: {other:?}"),
        }
        B::execute(
            &mut conn,
            "PRAGMA journal_mode = DELETE; PRAGMA aux.journal_mode = DELETE",
        );
    }
    B::execute(&mut conn, "PRAGMA journal_mode = WAL");
    B::verify(&mut conn).expect("WAL");
    // Unqualified, the setting is every database's: each is named.
    B::execute(&mut conn, "PRAGMA journal_mode = MEMORY");
    match B::verify(&mut conn) {
        Err(idempotent_jobs::Error::SchemaNotReady { problems }) => assert_eq!(
            problems,
            [idempotent_jobs::SchemaProblem::VolatileJournal {
                found: "main (journal_mode = memory), aux (journal_mode = memory)".to_owned()
            }]
        ),
        other => panic!("after journal_mode = MEMORY everywhere: {other:?}"),
    }
    B::execute(&mut conn, "PRAGMA journal_mode = DELETE");
    B::execute(&mut conn, "DETACH DATABASE aux");
    let _ = std::fs::remove_file(&attached);
}

/// The statements that give this session a temporary table of `table`'s name, a copy of the
/// runtime's, which the session's statements then find first (PostgreSQL's `pg_temp`, searched
/// before the search_path; MySQL's temporary tables; SQLite's `temp` database).
fn shadow(server: Server, table: &str) -> Vec<String> {
    match server {
        Server::Postgres => vec![format!(
            "CREATE TEMP TABLE {table} (LIKE {table} INCLUDING ALL)"
        )],
        Server::Mysql => vec![
            format!("CREATE TEMPORARY TABLE shadow_{table} LIKE {table}"),
            format!("ALTER TABLE shadow_{table} RENAME TO {table}"),
        ],
        Server::Sqlite => vec![format!(
            "CREATE TEMP TABLE {table} AS SELECT * FROM main.{table} WHERE 0"
        )],
    }
}

/// A session's temporary table named `done_jobs`, `outbox` or `idempotent_schema` hides the
/// runtime's from every statement of that session: its jobs claimed keys and pushed messages into
/// it, said `Ran`, and at disconnect the claims and messages were gone (the redelivery ran the
/// work again), while `verify` and `migrate` said all was well (PostgreSQL's `verify` failed with
/// an opaque `UnexpectedNullError` for a temporary outbox). `verify` names each such table now,
/// with what happens and what to do, and `migrate` refuses, changing nothing.
pub fn a_temporary_table_that_hides_the_runtimes_is_named<B: Backend>() {
    use idempotent_jobs::SchemaProblem;
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    B::verify(&mut conn).expect("no temporary table yet");
    let versions = |conn: &mut B::Conn| {
        B::query_i64(
            conn,
            &format!(
                "SELECT COUNT(*) AS n FROM {} idempotent_schema",
                match B::SERVER {
                    Server::Sqlite => "main.",
                    _ => "",
                }
            ),
        )
    };
    let recorded = i64::try_from(steps(B::SERVER)).expect("a few steps");
    for table in ["done_jobs", "outbox", "idempotent_schema"] {
        for sql in shadow(B::SERVER, table) {
            B::execute(&mut conn, &sql);
        }
        match B::verify(&mut conn) {
            Err(idempotent_jobs::Error::SchemaNotReady { problems }) => {
                let named = problems
                    .iter()
                    .find(|p| matches!(p, SchemaProblem::ShadowedByTemporary { table: t } if *t == table))
                    .unwrap_or_else(|| panic!("{table}: {problems:?}"));
                let text = named.to_string();
                assert!(text.contains("temporary table"), "{text}");
                assert!(text.contains("runs them again"), "{text}");
                assert!(text.contains("DROP"), "{text}");
            }
            other => panic!("a temporary {table}: {other:?}"),
        }
        let error = B::migrate(&mut conn).expect_err("migrate refuses a hidden table");
        let text = crate::harness::with_causes(&error);
        assert!(
            matches!(&error, idempotent_jobs::Error::Migration { source, .. }
                if matches!(source.downcast_ref::<SchemaProblem>(), Some(SchemaProblem::ShadowedByTemporary { .. }))),
            "{text}"
        );
        assert!(!text.contains("resumes"), "{text}");
        assert!(!error.is_retryable(), "{text}");
    }
    // Nothing changed: the runtime's own tables are as they were.
    let mut other = db.connect();
    assert_eq!(versions(&mut other), recorded);
    B::verify(&mut other).expect("another session sees the runtime's tables");
    for table in ["done_jobs", "outbox", "idempotent_schema"] {
        B::execute(
            &mut conn,
            &match B::SERVER {
                Server::Postgres => format!("DROP TABLE pg_temp.{table}"),
                Server::Mysql => format!("DROP TEMPORARY TABLE {table}"),
                Server::Sqlite => format!("DROP TABLE temp.{table}"),
            },
        );
    }
    B::verify(&mut conn).expect("the temporary tables dropped");
    B::migrate(&mut conn).expect("nothing to do");
    if B::SERVER == Server::Postgres {
        // `pg_temp` last in the search_path: the session finds the runtime's tables first.
        for sql in shadow(B::SERVER, "done_jobs") {
            B::execute(&mut conn, &sql);
        }
        B::execute(
            &mut conn,
            "SELECT set_config('search_path', current_schema() || ', pg_temp', false)",
        );
        B::verify(&mut conn).expect("pg_temp searched last");
        B::migrate(&mut conn).expect("pg_temp searched last");
    }
}

/// SQLite: the runtime's tables in a database the worker ATTACHes (its main file is the
/// application's). Jobs, replays and the keys API found them there, but `verify` looked in the
/// main database alone and said to migrate, and `migrate` then made empty tables in main, which
/// SQLite searches first: committed keys ran again. Now `verify` finds them where SQLite does
/// (temp, main, then the attached databases in order), a current `migrate` changes nothing, and
/// one with steps to make refuses to make a second copy in main, naming the attached database.
pub fn tables_in_an_attached_database_are_found_there<B: Backend>() {
    use idempotent_jobs::SchemaProblem;
    let jobs = Db::<B>::fresh();
    let app = Db::<B>::empty();
    let mut conn = app.connect();
    B::execute(
        &mut conn,
        &format!("ATTACH DATABASE '{}' AS jobs", jobs.locator()),
    );
    let in_main = |conn: &mut B::Conn| {
        B::query_i64(
            conn,
            "SELECT COUNT(*) AS n FROM main.sqlite_master \
             WHERE name IN ('idempotent_schema', 'done_jobs', 'outbox')",
        )
    };
    B::verify(&mut conn).expect("the tables are in the attached database");
    assert!(
        B::charge_outcome(&mut conn, "attached-1")
            .expect("ran")
            .is_ran()
    );
    B::migrate(&mut conn).expect("current: nothing to do");
    assert_eq!(in_main(&mut conn), 0, "no second copy in main");
    assert!(
        !B::charge_outcome(&mut conn, "attached-1")
            .expect("replayed")
            .is_ran(),
        "the redelivery replays"
    );
    // An older schema there: migrate has a step to make, and refuses to make it in main.
    let (indexes, drop) = leased_indexes(B::SERVER);
    let latest = i64::try_from(steps(B::SERVER)).expect("a few steps");
    B::execute(&mut conn, &drop.replace("DROP INDEX ", "DROP INDEX jobs."));
    B::execute(
        &mut conn,
        &format!("DELETE FROM jobs.idempotent_schema WHERE version = {latest}"),
    );
    let error = B::migrate(&mut conn)
        .expect_err("an attached database's tables are not migrated from here");
    let text = crate::harness::with_causes(&error);
    assert!(
        matches!(&error, idempotent_jobs::Error::Migration { source, .. }
            if matches!(source.downcast_ref::<SchemaProblem>(),
                Some(SchemaProblem::AttachedDatabase { database, .. }) if database == "jobs")),
        "{text}"
    );
    assert!(text.contains("main database"), "{text}");
    assert!(!text.contains("resumes"), "{text}");
    assert_eq!(in_main(&mut conn), 0, "no second copy in main");
    let _ = indexes;
    assert!(
        !B::charge_outcome(&mut conn, "attached-1")
            .expect("replayed")
            .is_ran(),
        "the redelivery still replays"
    );
    // Migrated on a connection whose main database is that file.
    B::migrate(&mut jobs.connect()).expect("migrate on the jobs file");
    B::verify(&mut conn).expect("current again");
    B::execute(&mut conn, "DETACH DATABASE jobs");
}

/// Steps that fail the same way at every call said "calling migrate again resumes where this
/// stopped" (PostgreSQL: an invalid `outbox_leased` left by a failed `CREATE INDEX
/// CONCURRENTLY`; MariaDB: an `outbox` rebuilt `ROW_FORMAT=COMPACT`, error 1709; a user without
/// `CREATE`). Each says what to do now, and is not retryable; the step succeeds once it is done.
pub fn a_step_that_fails_the_same_way_says_what_to_do<B: Backend>() {
    let db = Db::<B>::fresh();
    let mut conn = db.connect();
    let latest = i64::try_from(steps(B::SERVER)).expect("a few steps");
    let (fix, undo) = match B::SERVER {
        Server::Postgres => {
            B::execute(&mut conn, "DROP INDEX outbox_leased");
            B::execute(
                &mut conn,
                "INSERT INTO outbox (message_id, topic, payload, created_at, available_at) \
                 VALUES ('a', 'same', '{}', now(), now()), ('b', 'same', '{}', now(), now())",
            );
            assert!(
                B::try_execute(
                    &mut conn,
                    "CREATE UNIQUE INDEX CONCURRENTLY outbox_leased ON outbox (topic)",
                )
                .is_err()
            );
            ("DROP INDEX outbox_leased", "DROP INDEX outbox_leased")
        }
        Server::Mysql => {
            B::execute(
                &mut conn,
                "ALTER TABLE outbox DROP INDEX outbox_leased, ROW_FORMAT=COMPACT",
            );
            (
                "ALTER TABLE outbox ROW_FORMAT=DYNAMIC",
                "ALTER TABLE outbox ROW_FORMAT=DYNAMIC",
            )
        }
        Server::Sqlite => return,
    };
    B::execute(
        &mut conn,
        &format!("DELETE FROM idempotent_schema WHERE version = {latest}"),
    );
    for _ in 0..2 {
        let error = B::migrate(&mut conn).expect_err("the step fails the same way");
        let text = crate::harness::with_causes(&error);
        assert!(text.contains(fix), "{text}");
        assert!(!text.contains("resumes"), "{text}");
        assert!(!error.is_retryable(), "{text}");
    }
    B::execute(&mut conn, undo);
    B::migrate(&mut conn).expect("done what it said");
    B::verify(&mut conn).expect("ready");
}

/// A URL of `db`'s database for `user` (password `pw`) instead of root.
fn mysql_url_as(locator: &str, user: &str) -> String {
    locator.replacen("root@", &format!("{user}:pw@"), 1)
}

/// A MySQL user made for one test, with `grants` on `db`'s database, dropped at the end.
struct MysqlUser<B: Backend> {
    name: String,
    backend: std::marker::PhantomData<fn() -> B>,
}

impl<B: Backend> MysqlUser<B> {
    fn new(db: &Db<B>, grants: &str) -> Self {
        let name = crate::harness::unique_name("mig");
        let database = db
            .locator()
            .rsplit('/')
            .next()
            .expect("a database")
            .to_owned();
        let mut admin = B::connect(&Server::Mysql.base_url());
        B::execute(
            &mut admin,
            &format!("CREATE USER '{name}'@'%' IDENTIFIED BY 'pw'"),
        );
        B::execute(
            &mut admin,
            &format!("GRANT {grants} ON `{database}`.* TO '{name}'@'%'"),
        );
        MysqlUser {
            name,
            backend: std::marker::PhantomData,
        }
    }
}

impl<B: Backend> Drop for MysqlUser<B> {
    fn drop(&mut self) {
        if let Ok(mut admin) = B::try_connect(&Server::Mysql.base_url()) {
            let _ = B::try_execute(
                &mut admin,
                &format!("DROP USER IF EXISTS '{}'@'%'", self.name),
            );
        }
    }
}

/// MySQL: a user without `CREATE` was told "calling migrate again resumes where this stopped",
/// with no grant named. It is told the grant now, and that a retry alone fails the same way.
pub fn a_user_without_create_is_told_the_grant<B: Backend>() {
    let db = Db::<B>::empty();
    let user = MysqlUser::new(&db, "SELECT, INSERT, UPDATE");
    let mut conn = B::connect(&mysql_url_as(db.locator(), &user.name));
    let error = B::migrate(&mut conn).expect_err("no CREATE");
    let text = crate::harness::with_causes(&error);
    assert!(text.contains("GRANT CREATE"), "{text}");
    assert!(!text.contains("resumes"), "{text}");
    assert!(!error.is_retryable(), "{text}");
    assert!(
        B::snapshot(&mut db.connect())
            .table_names()
            .next()
            .is_none()
    );
}

/// MySQL: a `migrate` by a user without `CREATE ROUTINE` records the step of the job procedures
/// without them (a warning). A later `migrate` as a user that may (the runtime's own advice)
/// found the version current and changed nothing: the procedures never came. It makes them now.
pub fn a_later_migrate_makes_the_procedures_an_earlier_one_could_not<B: Backend>() {
    let db = Db::<B>::empty();
    let user = MysqlUser::new(
        &db,
        "SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, INDEX, DROP",
    );
    let routines = |conn: &mut B::Conn| {
        B::query_i64(
            conn,
            "SELECT COUNT(*) AS n FROM information_schema.routines WHERE routine_schema = DATABASE()",
        )
    };
    let mut limited = B::connect(&mysql_url_as(db.locator(), &user.name));
    B::migrate(&mut limited).expect("migrates without the procedures");
    let mut owner = db.connect();
    assert_eq!(routines(&mut owner), 0);
    B::migrate(&mut limited).expect("still without them, and no error");
    assert_eq!(routines(&mut owner), 0);
    B::migrate(&mut owner).expect("as a user that may create routines");
    assert_eq!(routines(&mut owner), 3, "the procedures are made");
    assert_eq!(
        B::query_i64(
            &mut owner,
            "SELECT COUNT(*) AS n FROM idempotent_schema WHERE version = 4"
        ),
        1
    );
    B::migrate(&mut owner).expect("current");
    B::verify(&mut owner).expect("ready");
}

/// SQLite: an attached database of the application's with a table `outbox` of its own (not the
/// runtime's), and no runtime tables anywhere: `migrate` refused with `AttachedDatabase`, telling
/// the user to migrate that file as its main database, which would fail the same way. It is the
/// foreign table it is (`ForeignTable`, rename it or give the runtime a database of its own), and
/// nothing is made in main, where it would hide the application's table from its own statements.
pub fn an_applications_table_in_an_attached_database_is_foreign<B: Backend>() {
    use idempotent_jobs::SchemaProblem;
    let app = Db::<B>::empty();
    let aux = format!("{}-aux.db", app.locator());
    let mut conn = app.connect();
    B::execute(&mut conn, &format!("ATTACH DATABASE '{aux}' AS app"));
    B::execute(
        &mut conn,
        "CREATE TABLE app.outbox (id INTEGER PRIMARY KEY, body TEXT)",
    );
    match B::migrate(&mut conn) {
        Err(idempotent_jobs::Error::Migration { source, .. }) => {
            assert!(
                matches!(
                    source.downcast_ref::<SchemaProblem>(),
                    Some(SchemaProblem::ForeignTable {
                        table: "outbox",
                        ..
                    })
                ),
                "{source}"
            );
        }
        other => panic!("migrate beside an application's attached outbox: {other:?}"),
    }
    assert_eq!(
        B::query_i64(
            &mut conn,
            "SELECT COUNT(*) AS n FROM main.sqlite_master WHERE type = 'table'"
        ),
        0,
        "nothing made in main"
    );
    B::execute(&mut conn, "DETACH DATABASE app");
    let _ = std::fs::remove_file(&aux);
}
