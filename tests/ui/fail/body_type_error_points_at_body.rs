use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "invoice:<customer_id>")]
fn send_invoice(conn: &mut SqliteConnection, customer_id: u64) -> Result<u64, idempotent_jobs::Error> {
    let total: u64 = "not a number";
    Ok(total + customer_id)
}

fn main() {}
