//! A misspelt placeholder in an edition 2015 crate: the error names it. Before, every error of
//! the attribute read "cannot find `core` in the crate root" (syn's `::core::compile_error!`,
//! which a 2015 crate does not resolve without `extern crate core;`).
extern crate diesel;
extern crate idempotent_jobs;

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "invoice:<custmer_id>")]
fn send_invoice(conn: &mut SqliteConnection, customer_id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(customer_id)
}

fn main() {}
