//! The done-jobs and outbox tables in a schema of their own, and a worker role holding only the
//! grants docs/operating.md lists (its 'Security'): jobs run and replay; what the worker was not granted, it cannot do.

use diesel::connection::SimpleConnection as _;
use diesel::prelude::*;

use crate::handlers::{self, Mode, TestConn as _};
use crate::harness::{Server, unique_name};

#[test]
fn a_worker_with_the_documented_grants_runs_jobs() {
    let base = Server::Postgres.base_url();
    let (jobs, app, role) = (
        unique_name("jobs"),
        unique_name("app"),
        unique_name("worker"),
    );
    let mut admin = PgConnection::establish(&base)
        .unwrap_or_else(|e| panic!("{}", Server::Postgres.unreachable(&base, &e)));
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {jobs}; CREATE SCHEMA {app}; CREATE ROLE {role} LOGIN; SET search_path TO {jobs};"
        ))
        .expect("schemas and role");
    idempotent_jobs::migrate(&mut admin).expect("the runtime's tables, in their own schema");
    admin
        .batch_execute(&format!(
            "SET search_path TO {app}; {}; {};
             -- The grants a worker needs (docs/operating.md, 'Security'):
             GRANT USAGE ON SCHEMA {jobs} TO {role};
             GRANT SELECT ON {jobs}.idempotent_schema TO {role};
             GRANT SELECT, INSERT, UPDATE ON {jobs}.done_jobs TO {role};
             GRANT SELECT, INSERT, UPDATE ON {jobs}.outbox TO {role};
             GRANT USAGE ON SEQUENCE {jobs}.outbox_id_seq TO {role};
             -- and the application's own tables:
             GRANT USAGE ON SCHEMA {app} TO {role};
             GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA {app} TO {role};
             GRANT USAGE ON ALL SEQUENCES IN SCHEMA {app} TO {role};",
            handlers::test_tables(Server::Postgres)[0],
            handlers::test_tables(Server::Postgres)[1],
        ))
        .expect("grants");

    let worker_url = url_as(&base, &role, &format!("{app},{jobs}"));
    let result = std::panic::catch_unwind(|| {
        let mut worker =
            PgConnection::establish(&worker_url).expect("connecting as the worker role");
        // A worker may call migrate at start: with the schema current it takes no DDL, which
        // this role could not do; and verify finds nothing missing.
        idempotent_jobs::migrate(&mut worker).expect("migrate with nothing pending needs no DDL");
        idempotent_jobs::verify(&mut worker).expect("the documented grants are enough");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            use diesel_async::AsyncConnection as _;
            let mut worker = diesel_async::AsyncPgConnection::establish(&worker_url)
                .await
                .expect("connecting as the worker role");
            idempotent_jobs::migrate_async(&mut worker)
                .await
                .expect("migrate_async with nothing pending needs no DDL");
            idempotent_jobs::verify_async(&mut worker)
                .await
                .expect("the documented grants are enough");
        });
        let first = handlers::charge(&mut worker, "order-1", 4200, Mode::Succeed)
            .expect("a job with only the documented grants");
        assert_eq!(
            handlers::charge(&mut worker, "order-1", 4200, Mode::Succeed).unwrap(),
            first
        );
        assert_eq!(worker.count_charges("order-1").unwrap(), 1);
        let denied =
            idempotent_jobs::prune(&mut worker, &idempotent_jobs::Prune::default()).unwrap_err();
        let denied = crate::harness::with_causes(&denied);
        assert!(
            denied.contains("permission denied"),
            "pruning needs DELETE, which the worker lacks: {denied}"
        );
        let denied = worker.batch_execute("DROP TABLE done_jobs").unwrap_err();
        assert!(denied.to_string().contains("must be owner"), "{denied}");
    });
    let _ = admin.batch_execute(&format!(
        "DROP SCHEMA {jobs} CASCADE; DROP SCHEMA {app} CASCADE; DROP OWNED BY {role}; DROP ROLE {role};"
    ));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// `base` with another user and a `search_path`.
fn url_as(base: &str, role: &str, search_path: &str) -> String {
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let host_and_rest = base[after_scheme..]
        .split_once('@')
        .map_or(&base[after_scheme..], |(_, rest)| rest);
    let separator = if host_and_rest.contains('?') {
        '&'
    } else {
        '?'
    };
    let search_path = search_path.replace(',', "%2C");
    format!("postgres://{role}@{host_and_rest}{separator}options=-csearch_path%3D{search_path}")
}

/// Runs `test`, then `cleanup` as the admin, whether or not the test passed.
fn with_cleanup(admin: &mut PgConnection, cleanup: &str, test: impl FnOnce()) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(test));
    if let Err(error) = admin.batch_execute(cleanup) {
        eprintln!("cleaning up: {error}");
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

fn admin() -> (String, PgConnection) {
    let base = Server::Postgres.base_url();
    let admin = PgConnection::establish(&base)
        .unwrap_or_else(|e| panic!("{}", Server::Postgres.unreachable(&base, &e)));
    (base, admin)
}

fn done_jobs_tables(admin: &mut PgConnection, schemas: &[&str]) -> i64 {
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let list = schemas
        .iter()
        .map(|s| format!("'{s}'"))
        .collect::<Vec<_>>()
        .join(", ");
    diesel::sql_query(format!(
        "SELECT COUNT(*) AS n FROM pg_tables WHERE tablename = 'done_jobs' AND schemaname IN ({list})"
    ))
    .get_result::<N>(admin)
    .expect("counting done_jobs tables")
    .n
}

/// An application role that owns a schema of its own, first on its search_path, with the runtime's
/// tables in another schema further along: `migrate` (sync and async) finds the existing tables
/// and never makes a second `done_jobs` in the application's schema, so a rerun after a restart
/// claims in the same table and charges once.
#[test]
fn an_owner_of_another_schema_never_gets_a_second_done_jobs() {
    let (base, mut admin) = admin();
    let (jobs, app, role) = (
        unique_name("jobs"),
        unique_name("app"),
        unique_name("appowner"),
    );
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {jobs}; CREATE ROLE {role} LOGIN; CREATE SCHEMA {app} AUTHORIZATION {role};
             SET search_path TO {jobs};"
        ))
        .expect("schemas and role");
    idempotent_jobs::migrate(&mut admin).expect("the runtime's tables, in their own schema");
    admin
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA {jobs} TO {role};
             GRANT SELECT ON {jobs}.idempotent_schema TO {role};
             GRANT SELECT, INSERT, UPDATE ON {jobs}.done_jobs, {jobs}.outbox TO {role};
             GRANT USAGE ON SEQUENCE {jobs}.outbox_id_seq TO {role};"
        ))
        .expect("grants");
    let url = url_as(&base, &role, &format!("{app},{jobs}"));
    let cleanup = format!(
        "DROP SCHEMA {jobs} CASCADE; DROP SCHEMA {app} CASCADE; DROP OWNED BY {role}; DROP ROLE {role};"
    );
    with_cleanup(&mut admin, &cleanup, || {
        let mut conn = PgConnection::establish(&url).expect("connecting as the application");
        conn.batch_execute(&format!(
            "{}; {};",
            handlers::test_tables(Server::Postgres)[0],
            handlers::test_tables(Server::Postgres)[1]
        ))
        .expect("the application's own tables, in its schema");
        idempotent_jobs::migrate(&mut conn).expect("migrate finds the tables");
        let first = handlers::charge(&mut conn, "order-1", 4200, Mode::Succeed).expect("a job");
        drop(conn);
        // A restart: a new process migrates again (async this time), then the job is redelivered.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            use diesel_async::AsyncConnection as _;
            let mut conn = diesel_async::AsyncPgConnection::establish(&url)
                .await
                .expect("connecting as the application");
            idempotent_jobs::migrate_async(&mut conn)
                .await
                .expect("migrate_async finds the tables");
        });
        let mut conn = PgConnection::establish(&url).expect("connecting as the application");
        idempotent_jobs::migrate(&mut conn).expect("migrate finds the tables");
        let again = handlers::charge(&mut conn, "order-1", 4200, Mode::Succeed).expect("a replay");
        assert_eq!(again, first);
        assert_eq!(conn.count_charges("order-1").unwrap(), 1, "charged once");
        let mut check = PgConnection::establish(&base).unwrap();
        assert_eq!(
            done_jobs_tables(&mut check, &[&app]),
            0,
            "no second done_jobs"
        );
        assert_eq!(done_jobs_tables(&mut check, &[&jobs]), 1);
    });
}

/// `verify` as a role that lacks a grant names the grant, the table, and what to run; and it
/// changes nothing.
#[test]
fn verify_names_a_missing_grant() {
    let (base, mut admin) = admin();
    let (jobs, role) = (unique_name("jobs"), unique_name("nogrant"));
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {jobs}; CREATE ROLE {role} LOGIN; SET search_path TO {jobs};"
        ))
        .expect("schema and role");
    idempotent_jobs::migrate(&mut admin).expect("the runtime's tables");
    admin
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA {jobs} TO {role};
             GRANT SELECT ON {jobs}.idempotent_schema TO {role};
             GRANT SELECT, INSERT ON {jobs}.done_jobs TO {role};
             GRANT SELECT, INSERT, UPDATE ON {jobs}.outbox TO {role};"
        ))
        .expect("grants, missing UPDATE on done_jobs and the sequence");
    let url = url_as(&base, &role, &jobs);
    let cleanup = format!("DROP SCHEMA {jobs} CASCADE; DROP OWNED BY {role}; DROP ROLE {role};");
    with_cleanup(&mut admin, &cleanup, || {
        let mut conn = PgConnection::establish(&url).expect("connecting as the role");
        let error = idempotent_jobs::verify(&mut conn).expect_err("a grant is missing");
        let idempotent_jobs::Error::SchemaNotReady { problems } = &error else {
            panic!("expected SchemaNotReady, got {error}");
        };
        let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert!(
            problems
                .iter()
                .any(|p| p.contains("UPDATE") && p.contains("`done_jobs`") && p.contains("GRANT")),
            "{problems:#?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("outbox") && p.contains("USAGE")),
            "{problems:#?}"
        );
        assert!(!error.is_retryable());
    });
}

/// `verify` as a role that may not read `idempotent_schema`, or may not use the tables' schema at
/// all: a read-only check that names each missing grant and the `GRANT` that gives it (it used to
/// fail reading the schema version and say "creating or upgrading the runtime's table
/// idempotent_schema failed ... Calling migrate again resumes").
#[test]
fn verify_names_grants_it_cannot_read_past() {
    let (base, mut admin) = admin();
    let (jobs, role) = (unique_name("jobs"), unique_name("noread"));
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {jobs}; CREATE ROLE {role} LOGIN; SET search_path TO {jobs};"
        ))
        .expect("schema and role");
    idempotent_jobs::migrate(&mut admin).expect("the runtime's tables");
    admin
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA {jobs} TO {role};
             GRANT SELECT, INSERT, UPDATE ON {jobs}.done_jobs TO {role};
             GRANT SELECT, INSERT, UPDATE ON {jobs}.outbox TO {role};
             GRANT USAGE ON SEQUENCE {jobs}.outbox_id_seq TO {role};"
        ))
        .expect("every grant but SELECT on idempotent_schema");
    let url = url_as(&base, &role, &jobs);
    let cleanup = format!("DROP SCHEMA {jobs} CASCADE; DROP OWNED BY {role}; DROP ROLE {role};");
    with_cleanup(&mut admin, &cleanup, || {
        let mut conn = PgConnection::establish(&url).expect("connecting as the role");
        let error = idempotent_jobs::verify(&mut conn).expect_err("a grant is missing");
        let idempotent_jobs::Error::SchemaNotReady { problems } = &error else {
            panic!("expected SchemaNotReady, got {error}");
        };
        let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(
            problems[0].contains("GRANT SELECT ON idempotent_schema"),
            "{problems:#?}"
        );
        let mut owner = PgConnection::establish(&base).expect("connecting as the owner");
        owner
            .batch_execute(&format!("REVOKE USAGE ON SCHEMA {jobs} FROM {role}"))
            .expect("no use of the schema");
        let error = idempotent_jobs::verify(&mut conn).expect_err("the schema is out of reach");
        assert!(
            matches!(&error, idempotent_jobs::Error::SchemaNotReady { problems } if problems.iter().any(|p| p.to_string().contains(&format!("GRANT USAGE ON SCHEMA {jobs}")))),
            "{error}"
        );
    });
}

/// MySQL: a user holding only the README's rights migrates (nothing pending, so no DDL, which it
/// could not do) and verifies, sync and async; `verify` names a missing right; jobs run once.
#[test]
fn a_mysql_worker_with_the_documented_grants_runs_jobs() {
    use crate::backends::{Backend as _, Mysql};
    let db = crate::harness::Db::<Mysql>::empty();
    let mut admin = db.connect();
    Mysql::prepare(&mut admin);
    let user = unique_name("worker");
    let database = db
        .locator()
        .rsplit('/')
        .next()
        .expect("a database")
        .to_owned();
    let after_scheme = db.locator().find("://").map_or(0, |i| i + 3);
    let host_and_rest = db.locator()[after_scheme..]
        .split_once('@')
        .map_or(&db.locator()[after_scheme..], |(_, rest)| rest);
    let url = format!("mysql://{user}@{host_and_rest}");
    admin
        .batch_execute(&format!(
            "CREATE USER '{user}'@'%';
             GRANT SELECT ON {database}.idempotent_schema TO '{user}'@'%';
             GRANT SELECT, INSERT, UPDATE ON {database}.done_jobs TO '{user}'@'%';
             GRANT EXECUTE ON PROCEDURE {database}.idempotent_begin_job TO '{user}'@'%';
             GRANT EXECUTE ON PROCEDURE {database}.idempotent_begin_and_claim TO '{user}'@'%';
             GRANT EXECUTE ON PROCEDURE {database}.idempotent_finish_job TO '{user}'@'%';
             GRANT SELECT, INSERT ON {database}.outbox TO '{user}'@'%';
             GRANT SELECT, INSERT ON {database}.charges TO '{user}'@'%';
             GRANT SELECT, INSERT ON {database}.test_outbox TO '{user}'@'%';"
        ))
        .expect("a user with the README's rights, less UPDATE on the outbox");
    let cleanup = format!("DROP USER '{user}'@'%'");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut worker = MysqlConnection::establish(&url).expect("connecting as the worker");
        idempotent_jobs::migrate(&mut worker).expect("migrate with nothing pending needs no DDL");
        let error = idempotent_jobs::verify(&mut worker).expect_err("UPDATE on outbox is missing");
        let idempotent_jobs::Error::SchemaNotReady { problems } = &error else {
            panic!("expected SchemaNotReady, got {error}");
        };
        let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(
            problems[0].contains("UPDATE") && problems[0].contains("`outbox`"),
            "{problems:#?}"
        );
        admin
            .batch_execute(&format!(
                "GRANT UPDATE ON {database}.outbox TO '{user}'@'%'"
            ))
            .expect("the missing right");
        idempotent_jobs::verify(&mut worker).expect("the README's rights are enough");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            use diesel_async::AsyncConnection as _;
            let mut worker = diesel_async::AsyncMysqlConnection::establish(&url)
                .await
                .expect("connecting as the worker");
            idempotent_jobs::migrate_async(&mut worker)
                .await
                .expect("migrate_async with nothing pending needs no DDL");
            idempotent_jobs::verify_async(&mut worker)
                .await
                .expect("the README's rights are enough");
        });
        let first = handlers::charge(&mut worker, "order-1", 4200, Mode::Succeed)
            .expect("a job with only the README's rights");
        assert_eq!(
            handlers::charge(&mut worker, "order-1", 4200, Mode::Succeed).unwrap(),
            first
        );
        assert_eq!(worker.count_charges("order-1").unwrap(), 1);
        let denied = worker.batch_execute("DROP TABLE done_jobs").unwrap_err();
        assert!(denied.to_string().contains("denied"), "{denied}");
    }));
    if let Err(error) = admin.batch_execute(&cleanup) {
        eprintln!("cleaning up: {error}");
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
