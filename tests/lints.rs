//! The expansion is clean in a user crate that denies warnings and `clippy::pedantic`: CI runs
//! `cargo clippy --all-targets -- -D warnings`, which lints this file as the user's code.
#![deny(warnings, clippy::pedantic)]

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idempotent(#[from] idempotent_jobs::Error),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    number: String,
}

struct Job {
    customer_id: u64,
    month: String,
}

/// Sends an invoice.
///
/// # Errors
///
/// When the database fails.
#[idempotent_job(key = "invoice:<job.month>:<job.customer_id>")]
fn send_invoice(conn: &mut SqliteConnection, job: &Job) -> Result<Receipt, AppError> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(Receipt {
        number: format!("{}-{}", job.month, job.customer_id),
    })
}

#[idempotent_job(key = "welcome:<user_id>")]
fn welcome(conn: &mut SqliteConnection, user_id: u64) -> Result<(), AppError> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    let _ = user_id;
    Ok(())
}

#[test]
fn pedantic_handlers_run() {
    let mut conn = SqliteConnection::establish(":memory:").expect("SQLite");
    idempotent_jobs::migrate(&mut conn).expect("migrations");
    let job = Job {
        customer_id: 7,
        month: "2026-11".to_owned(),
    };
    let first = send_invoice(&mut conn, &job).expect("first run");
    assert_eq!(send_invoice(&mut conn, &job).expect("replay"), first);
    welcome(&mut conn, 1).expect("welcome");
}
