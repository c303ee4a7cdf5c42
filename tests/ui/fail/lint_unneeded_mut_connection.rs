#![deny(unused_mut)]

use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "invoice:<customer_id>")]
fn send_invoice(mut conn: &mut SqliteConnection, customer_id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(customer_id)
}

fn main() {}
