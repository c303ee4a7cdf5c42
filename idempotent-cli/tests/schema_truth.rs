//! What the CLI says, and what it leaves in the tables, when the schema is not one it can work
//! with: made by a newer release, in a schema the role may not use, on a session that cannot
//! write, and what `migrate` reports about what it made.

mod common;

use diesel::connection::SimpleConnection;
use diesel::{Connection, MysqlConnection, PgConnection, RunQueryDsl, SqliteConnection};
use idempotent_runtime::outbox;
use idempotent_runtime::{Error, JobKey, Outcome};

use common::*;

/// A lapsed key (what `prune` deletes), a held key (what `keys forget` deletes) and a parked
/// message (what `outbox retry` un-parks).
fn fill<C: Backend>(conn: &mut C) {
    let _ = charge(conn, 1);
    let _: Outcome<u32> =
        idempotent_runtime::run(conn, &DIGEST, &JobKey::new("digest:ada"), |_conn| {
            Ok::<_, Error>(1)
        })
        .expect("running the digest job");
    park_hook(conn);
}

/// The number of keys and parked messages the tables hold.
fn holdings<C: Backend>(conn: &mut C) -> (usize, i64) {
    let parked = outbox::counts(conn).expect("the outbox's counts").parked;
    (key_count(conn), parked)
}

/// A schema a newer release made (a version above this build's): `migrate` says a retry cannot
/// succeed, `verify`'s headline says to upgrade, the writing commands refuse and change nothing,
/// the reading ones warn.
fn newer_schema<C: Backend>() {
    let db = TestDb::empty::<C>();
    db.cli(&["migrate"]).ok();
    let mut conn: C = db.connect();
    fill(&mut conn);
    let before = holdings(&mut conn);
    assert_eq!(
        before,
        (3, 2),
        "two keys and a lapsed one; both messages parked"
    );
    conn.batch_execute(
        "INSERT INTO idempotent_schema (version, description, applied_at) \
         VALUES (99, 'a future release', CURRENT_TIMESTAMP)",
    )
    .expect("recording a future version");

    let run = db.cli(&["migrate"]).exit(4);
    assert!(
        !run.stderr.contains("resumes")
            && run.stderr.contains("nothing was changed")
            && run
                .stderr
                .contains("calling migrate again fails the same way")
            && run.stderr.contains("version 99"),
        "{run:#?}"
    );
    let run = db.cli(&["verify"]).exit(4);
    let headline = run.stderr.lines().next().unwrap_or_default();
    assert!(
        headline.contains("made by a newer release")
            && headline.contains("upgrade")
            && !headline.contains("run `idempotent-jobs migrate`")
            && !headline.contains("grant"),
        "{run:#?}"
    );
    for args in [
        &["prune"][..],
        &["outbox", "retry", "--all"],
        &["keys", "forget", "charge:order-1", "--yes"],
    ] {
        let run = db.cli(args).exit(4);
        assert!(
            run.stdout.is_empty()
                && run.stderr.contains("made by a newer release")
                && run.stderr.contains("nothing was changed")
                && run.stderr.contains("upgrade idempotent-jobs-cli"),
            "{args:?}: {run:#?}"
        );
        assert_eq!(holdings(&mut conn), before, "{args:?} changed the tables");
    }
    for args in [&["jobs"][..], &["keys", "list"], &["prune", "--dry-run"]] {
        let run = db.cli(args).ok();
        assert!(
            run.stderr.starts_with("warning: ") && run.stderr.contains("made by a newer release"),
            "{args:?}: {run:#?}"
        );
    }
    assert_eq!(holdings(&mut conn), before);
}

#[test]
fn sqlite_newer_schema() {
    newer_schema::<SqliteConnection>();
}

#[test]
fn postgres_newer_schema() {
    newer_schema::<PgConnection>();
}

#[test]
fn mysql_newer_schema() {
    newer_schema::<MysqlConnection>();
}

/// A PostgreSQL role of a test's own, dropped (with its grants) at the end.
struct Role {
    name: String,
    admin_url: String,
}

impl Role {
    fn create(name: &str) -> Self {
        let admin_url = Server::Postgres.base_url();
        let mut admin = PgConnection::open(&admin_url);
        admin
            .batch_execute(&format!(
                "DROP ROLE IF EXISTS {name}; CREATE ROLE {name} LOGIN PASSWORD 'x3-secret-pw'"
            ))
            .expect("creating a role");
        Self {
            name: name.to_owned(),
            admin_url,
        }
    }

    /// `db`'s URL, logging in as this role.
    fn url(&self, db: &TestDb) -> String {
        db.url.replacen(
            "://postgres@",
            &format!("://{}:x3-secret-pw@", self.name),
            1,
        )
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        if let Ok(mut admin) = PgConnection::establish(&self.admin_url) {
            let _ = admin.batch_execute(&format!(
                "DROP OWNED BY {0}; DROP ROLE IF EXISTS {0}",
                self.name
            ));
        }
    }
}

/// The schema holding the tables on the search_path, but a role without USAGE on it: `verify` and
/// the role's own `migrate` name the missing grant (not "no tables", not "no schema"), `migrate`
/// changes nothing and does not say a retry resumes; once granted, `verify` is satisfied.
#[test]
fn postgres_schema_without_usage_names_the_grant() {
    let db = TestDb::empty::<PgConnection>();
    db.cli(&["migrate"]).ok();
    let mut owner: PgConnection = db.connect();
    let _ = charge(&mut owner, 1);
    let schema = db.url.rsplit("%3D").next().expect("the schema").to_owned();
    let role = Role::create(&format!("x3_nousage_{}", std::process::id()));
    owner
        .batch_execute(&format!(
            "GRANT SELECT ON {schema}.idempotent_schema TO {r}; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.done_jobs, {schema}.outbox TO {r}; \
             GRANT USAGE ON SEQUENCE {schema}.outbox_id_seq TO {r}",
            r = role.name
        ))
        .expect("granting all but USAGE on the schema");
    let url = role.url(&db);
    let grant = format!("GRANT USAGE ON SCHEMA {schema}");

    let run = run_cli(&url, &["verify"]).exit(4);
    assert!(
        run.stderr.contains(&grant)
            && !run.stderr.contains("has no idempotent-jobs tables")
            && !run.stderr.contains("is missing from"),
        "{run:#?}"
    );
    let run = run_cli(&url, &["migrate"]).exit(4);
    assert!(
        run.stderr.contains(&grant)
            && !run.stderr.contains("create one")
            && !run.stderr.contains("resumes")
            && run.stderr.contains("nothing was changed"),
        "{run:#?}"
    );
    // Nothing was created or recorded anywhere: no table of the role's own (other tests make
    // their own copies in this database meanwhile, so a count of every `done_jobs` would race).
    let owned_by_role = format!(
        "(SELECT COUNT(*) FROM pg_class WHERE relname = 'done_jobs' \
         AND relowner = (SELECT oid FROM pg_roles WHERE rolname = '{}'))::bigint",
        role.name
    );
    let tables: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
        &owned_by_role,
    ))
    .get_result(&mut owner)
    .expect("counting done_jobs tables");
    let before = tables;
    assert_eq!(before, 0, "the role made no tables");
    assert_eq!(key_count(&mut owner), 1);

    owner
        .batch_execute(&format!("GRANT USAGE ON SCHEMA {schema} TO {}", role.name))
        .expect("granting USAGE");
    run_cli(&url, &["verify"]).ok();
    run_cli(&url, &["migrate"]).ok();
    let after: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
        &owned_by_role,
    ))
    .get_result(&mut owner)
    .expect("counting done_jobs tables");
    assert_eq!(before, after, "no second copy of the tables");
}

/// An empty schema named by the search_path, and a role that may not use it or not create in it:
/// the role's `migrate` names the missing grant, as it does for a schema that holds the tables
/// (not "no schema exists", which sent the operator to create a schema that is there), says that
/// nothing was changed and that calling it again does not help, and creates nothing; once
/// granted, it migrates.
#[test]
fn postgres_empty_schema_without_grants_names_them() {
    let db = TestDb::empty::<PgConnection>();
    let mut owner: PgConnection = db.connect();
    let schema = db.url.rsplit("%3D").next().expect("the schema").to_owned();
    let role = Role::create(&format!("x3_emptyschema_{}", std::process::id()));
    let url = role.url(&db);
    let tables = |owner: &mut PgConnection| -> i64 {
        diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!(
            "(SELECT COUNT(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = '{schema}')::bigint"
        )))
        .get_result(owner)
        .expect("counting what the schema holds")
    };

    for (granted, missing) in [
        (None, format!("GRANT USAGE, CREATE ON SCHEMA {schema}")),
        (Some("USAGE"), format!("GRANT CREATE ON SCHEMA {schema}")),
    ] {
        if let Some(privilege) = granted {
            owner
                .batch_execute(&format!(
                    "GRANT {privilege} ON SCHEMA {schema} TO {}",
                    role.name
                ))
                .expect("granting");
        }
        let run = run_cli(&url, &["migrate"]).exit(4);
        assert!(
            run.stderr.contains(&missing)
                && !run
                    .stderr
                    .contains("no schema on the connection's search_path exists")
                && !run.stderr.contains("resumes")
                && run.stderr.contains("nothing was changed"),
            "granted {granted:?}: {run:#?}"
        );
        assert_eq!(
            tables(&mut owner),
            0,
            "granted {granted:?}: migrate created something"
        );
    }
    owner
        .batch_execute(&format!("GRANT CREATE ON SCHEMA {schema} TO {}", role.name))
        .expect("granting CREATE");
    run_cli(&url, &["migrate"]).ok();
    run_cli(&url, &["verify"]).ok();
}

/// Sessions that cannot write (every transaction read-only, by the URL's options or by the role's
/// own setting): `verify` says so and exits 4 instead of "ready"; nothing is changed.
#[test]
fn postgres_read_only_session_is_not_ready() {
    let db = TestDb::empty::<PgConnection>();
    db.cli(&["migrate"]).ok();
    let mut owner: PgConnection = db.connect();
    let _ = charge(&mut owner, 1);
    run_cli(&db.url, &["verify"]).ok();

    let read_only = format!("{}%20-cdefault_transaction_read_only%3Don", db.url);
    let role = Role::create(&format!("x3_readonly_{}", std::process::id()));
    let schema = db.url.rsplit("%3D").next().expect("the schema").to_owned();
    owner
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA {schema} TO {r}; \
             GRANT SELECT ON {schema}.idempotent_schema TO {r}; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.done_jobs, {schema}.outbox TO {r}; \
             GRANT USAGE ON SEQUENCE {schema}.outbox_id_seq TO {r}; \
             ALTER ROLE {r} SET default_transaction_read_only = on",
            r = role.name
        ))
        .expect("a role whose sessions are read-only");
    for url in [read_only, role.url(&db)] {
        let run = run_cli(&url, &["verify"]).exit(4);
        assert!(
            run.stdout.is_empty()
                && run.stderr.contains("cannot write")
                && run.stderr.contains("read-only transaction"),
            "{run:#?}"
        );
        let run = run_cli(&url, &["--json", "verify"]).exit(4);
        assert_eq!(run.json()["ok"], false, "{run:#?}");
    }
    assert_eq!(key_count(&mut owner), 1, "verify changed nothing");
    // Once the role may write, it is ready.
    owner
        .batch_execute(&format!(
            "ALTER ROLE {} RESET default_transaction_read_only",
            role.name
        ))
        .expect("resetting the role");
    run_cli(&role.url(&db), &["verify"]).ok();
}

/// A SQLite file opened read-only: `verify` says the connection cannot write, and exits 4.
#[test]
fn sqlite_read_only_file_is_not_ready() {
    let db = TestDb::empty::<SqliteConnection>();
    db.cli(&["migrate"]).ok();
    let run = run_cli(&format!("file:{}?mode=ro", db.url), &["verify"]).exit(4);
    assert!(
        run.stderr.contains("cannot write") && run.stderr.contains("readonly database"),
        "{run:#?}"
    );
    run_cli(&db.url, &["verify"]).ok();
}

/// A MariaDB user that may only read: its `migrate` finds the tables current, then checks them as
/// `verify` does, and says what this user lacks (exit 4) instead of "ok".
#[test]
fn mysql_migrate_checks_as_verify_does() {
    let db = TestDb::empty::<MysqlConnection>();
    db.cli(&["migrate"]).ok();
    let database = db.url.rsplit('/').next().expect("the database").to_owned();
    let user = format!("x3_select_{}", std::process::id());
    let mut root = MysqlConnection::open(&Server::Mysql.base_url());
    root.batch_execute(&format!(
        "DROP USER IF EXISTS '{user}'@'%'; CREATE USER '{user}'@'%' IDENTIFIED BY 'x3-secret-pw'; \
         GRANT SELECT ON {database}.* TO '{user}'@'%'"
    ))
    .expect("a user that may only read");
    let url = db
        .url
        .replacen("://root@", &format!("://{user}:x3-secret-pw@"), 1);
    let verify = run_cli(&url, &["verify"]);
    let run = run_cli(&url, &["migrate"]);
    let _ = root.batch_execute(&format!("DROP USER IF EXISTS '{user}'@'%'"));
    let verify = verify.exit(4);
    let run = run.exit(4);
    assert!(
        !run.stdout.contains("ok")
            && run.stderr.contains("current")
            && run.stderr.contains("GRANT INSERT ON done_jobs"),
        "{run:#?}\nverify: {verify:#?}"
    );
    let mut conn: MysqlConnection = db.connect();
    idempotent_runtime::verify(&mut conn).expect("the tables as root made them");
}

/// A missing table is named without PostgreSQL's search_path on SQLite, and `migrate` into an
/// in-memory database says the tables are gone when the command exits.
#[test]
fn sqlite_messages_say_what_sqlite_does() {
    let db = TestDb::empty::<SqliteConnection>();
    let run = db.cli(&["keys", "list"]).exit(4);
    assert!(
        !run.stderr.contains("PostgreSQL") && !run.stderr.contains("search_path"),
        "{run:#?}"
    );
    for memory in [":memory:", "file::memory:", "file:x3?mode=memory"] {
        let run = run_cli(memory, &["migrate"]).ok();
        assert!(
            run.stdout.contains("in-memory") && run.stdout.contains("gone when this command exits"),
            "{memory}: {run:#?}"
        );
    }
}

/// A session whose statement time limit is under a second (PostgreSQL `statement_timeout`, here
/// from the URL's options; MariaDB `max_statement_time`, here the user's own): `verify` still
/// says the tables are ready (they are), with a warning naming the setting and its value, as a
/// job's statements that take longer are cancelled. Without such a limit, no warning.
#[test]
fn postgres_verify_warns_of_a_short_statement_timeout() {
    let db = TestDb::empty::<PgConnection>();
    db.cli(&["migrate"]).ok();
    let run = db.cli(&["verify"]).ok();
    assert!(!run.stderr.contains("warning"), "{run:#?}");
    let run = run_cli(
        &format!("{}%20-cstatement_timeout%3D200ms", db.url),
        &["verify"],
    )
    .ok();
    assert!(
        run.stdout.starts_with("ok: ")
            && run.stderr.starts_with("warning: ")
            && run.stderr.contains("statement_timeout is 200ms"),
        "{run:#?}"
    );
    // The role's own 1ms, which cancels a read of `pg_settings`: still read, and named. Whether
    // verify's own statements finish in 1ms is the machine's affair: its exit code is not checked.
    let role = Role::create(&format!("x3_timeout_{}", std::process::id()));
    let schema = db.url.rsplit("%3D").next().expect("the schema").to_owned();
    let mut owner: PgConnection = db.connect();
    owner
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA {schema} TO {r}; \
             GRANT SELECT ON {schema}.idempotent_schema TO {r}; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.done_jobs, {schema}.outbox TO {r}; \
             GRANT USAGE ON SEQUENCE {schema}.outbox_id_seq TO {r}; \
             ALTER ROLE {r} SET statement_timeout = '1ms'",
            r = role.name
        ))
        .expect("a role whose statements may take 1ms");
    // Connecting runs statements of Diesel's own (the session's settings), which a loaded machine
    // may not finish in 1ms either: a run that could not connect says so and is tried again (seen
    // once in CI: "cannot connect ...: canceling statement due to statement timeout", exit 3).
    let mut run = run_cli(&role.url(&db), &["verify"]);
    for _ in 0..20 {
        if !(run.code == 3 && run.stderr.contains("cannot connect")) {
            break;
        }
        assert!(run.stderr.contains("statement timeout"), "{run:#?}");
        run = run_cli(&role.url(&db), &["verify"]);
    }
    assert!(
        run.stderr.starts_with("warning: ") && run.stderr.contains("statement_timeout is 1ms"),
        "{run:#?}"
    );
}

#[test]
fn mysql_verify_warns_of_a_short_max_statement_time() {
    let db = TestDb::empty::<MysqlConnection>();
    db.cli(&["migrate"]).ok();
    let run = db.cli(&["verify"]).ok();
    assert!(!run.stderr.contains("warning"), "{run:#?}");
    let database = db.url.rsplit('/').next().expect("the database").to_owned();
    let user = format!("x3_mst_{}", std::process::id());
    let mut root = MysqlConnection::open(&Server::Mysql.base_url());
    root.batch_execute(&format!(
        "DROP USER IF EXISTS '{user}'@'%'; \
         CREATE USER '{user}'@'%' IDENTIFIED BY 'x3-secret-pw' WITH MAX_STATEMENT_TIME 0.25; \
         GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE ON {database}.* TO '{user}'@'%'"
    ))
    .expect("a user with a short statement time");
    let url = db
        .url
        .replacen("://root@", &format!("://{user}:x3-secret-pw@"), 1);
    let run = run_cli(&url, &["verify"]);
    let _ = root.batch_execute(&format!("DROP USER IF EXISTS '{user}'@'%'"));
    let run = run.ok();
    assert!(
        run.stderr.starts_with("warning: ") && run.stderr.contains("max_statement_time is 0.25"),
        "{run:#?}"
    );
}
