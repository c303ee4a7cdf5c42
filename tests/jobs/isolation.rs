//! PostgreSQL sessions whose default isolation is stricter than READ COMMITTED: a worker waiting on
//! another's claim fails with a serialization error, which the claim retries from `BEGIN`; the
//! retry sees the winner's row and replays.

use std::sync::Barrier;

use diesel::connection::SimpleConnection as _;
use diesel::prelude::*;

use crate::handlers::{self, Mode, Receipt, TestConn as _};
use crate::harness::{Server, unique_name};

fn racing_at(isolation: &str) {
    const WORKERS: usize = 8;
    let base = Server::Postgres.base_url();
    let schema = unique_name("isolation");
    let mut admin = PgConnection::establish(&base)
        .unwrap_or_else(|e| panic!("{}", Server::Postgres.unreachable(&base, &e)));
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; SET search_path TO {schema};"
        ))
        .expect("schema");
    idempotent_jobs::migrate(&mut admin).expect("migrations");
    for sql in handlers::test_tables(Server::Postgres) {
        admin.batch_execute(&sql).expect("test tables");
    }
    let separator = if base.contains('?') { '&' } else { '?' };
    let url = format!(
        "{base}{separator}options=-csearch_path%3D{schema}%20-cdefault_transaction_isolation%3D{}",
        isolation.replace(' ', "%5C%20")
    );
    let barrier = Barrier::new(WORKERS);
    let receipts: Vec<Receipt> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (url, barrier) = (&url, &barrier);
                scope.spawn(move || {
                    let mut conn = PgConnection::establish(url).expect("a worker connection");
                    let level: String =
                        diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>(
                            "current_setting('transaction_isolation')",
                        ))
                        .get_result(&mut conn)
                        .expect("the session's isolation");
                    assert_eq!(level, isolation);
                    barrier.wait();
                    handlers::charge(&mut conn, "hot-order", 4200, Mode::Succeed)
                        .expect("claim, or retry and replay")
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    });
    let charges = PgConnection::establish(&url)
        .expect("checker")
        .count_charges("hot-order")
        .expect("count");
    let _ = admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"));
    assert!(receipts.iter().all(|r| *r == receipts[0]), "{receipts:?}");
    assert_eq!(charges, 1);
}

#[test]
fn racing_workers_at_repeatable_read_run_once() {
    racing_at("repeatable read");
}

#[test]
fn racing_workers_at_serializable_run_once() {
    racing_at("serializable");
}
