//! The done-jobs and outbox tables in a schema of their own, and a worker role holding only the
//! grants the README lists: jobs run and replay; what the worker was not granted, it cannot do.

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
             -- The grants a worker needs (README, 'Security'):
             GRANT USAGE ON SCHEMA {jobs} TO {role};
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

    let worker_url = {
        let after_scheme = base.find("://").map_or(0, |i| i + 3);
        let host_and_rest = base[after_scheme..]
            .split_once('@')
            .map_or(&base[after_scheme..], |(_, rest)| rest);
        let separator = if host_and_rest.contains('?') {
            '&'
        } else {
            '?'
        };
        format!("postgres://{role}@{host_and_rest}{separator}options=-csearch_path%3D{app},{jobs}")
    };
    let result = std::panic::catch_unwind(|| {
        let mut worker =
            PgConnection::establish(&worker_url).expect("connecting as the worker role");
        let first = handlers::charge(&mut worker, "order-1", 4200, Mode::Succeed)
            .expect("a job with only the documented grants");
        assert_eq!(
            handlers::charge(&mut worker, "order-1", 4200, Mode::Succeed).unwrap(),
            first
        );
        assert_eq!(worker.count_charges("order-1").unwrap(), 1);
        let denied =
            idempotent_jobs::prune(&mut worker, &idempotent_jobs::Prune::default()).unwrap_err();
        assert!(
            denied.to_string().contains("permission denied"),
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
