//! `mut conn` stays the handler's: the body can rebind and reborrow its connection, and a `mut`
//! the body does not need is still reported (issue 27: the wrapper used to drop it, so `&mut conn`
//! in the body did not compile and the signature's `mut` read as unused).
#![deny(warnings)]

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

#[derive(Debug)]
pub enum AppError {
    Idempotent(idempotent_jobs::Error),
    Database(diesel::result::Error),
}

impl From<idempotent_jobs::Error> for AppError {
    fn from(error: idempotent_jobs::Error) -> Self {
        AppError::Idempotent(error)
    }
}

impl From<diesel::result::Error> for AppError {
    fn from(error: diesel::result::Error) -> Self {
        AppError::Database(error)
    }
}

/// Counts the runs of the bodies below.
fn record(conn: &mut &mut SqliteConnection, what: &str) -> Result<(), AppError> {
    diesel::sql_query(format!("INSERT INTO runs (what) VALUES ('{what}')")).execute(&mut **conn)?;
    Ok(())
}

fn runs(conn: &mut SqliteConnection, what: &str) -> i64 {
    diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!("SELECT COUNT(*) FROM runs WHERE what = '{what}'"))
        .get_result(conn)
        .unwrap()
}

#[idempotent_job(key = "free:<id>")]
fn free(mut conn: &mut SqliteConnection, id: u64) -> Result<u64, AppError> {
    record(&mut conn, "free")?;
    Ok(id)
}

/// Named by `conn =`, with other `mut` parameters beside it.
#[idempotent_job(key = "named:<id>", conn = db)]
fn named(mut db: &mut SqliteConnection, id: u64, mut total: u64) -> Result<u64, AppError> {
    record(&mut db, "named")?;
    total += id;
    Ok(total)
}

pub struct Billing;

impl Billing {
    #[idempotent_job(key = "method:<id>")]
    fn method(&self, mut conn: &mut SqliteConnection, id: u64) -> Result<u64, AppError> {
        record(&mut conn, "method")?;
        Ok(id)
    }
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();
    diesel::sql_query("CREATE TABLE runs (what TEXT NOT NULL)").execute(&mut conn).unwrap();

    for _ in 0..2 {
        assert_eq!(free(&mut conn, 1).unwrap(), 1);
        assert_eq!(named(&mut conn, 2, 40).unwrap(), 42);
        assert_eq!(Billing.method(&mut conn, 3).unwrap(), 3);
    }
    assert!(free::outcome(&mut conn, 1).unwrap().is_replayed());
    for what in ["free", "named", "method"] {
        assert_eq!(runs(&mut conn, what), 1, "{what} ran once");
    }
}
