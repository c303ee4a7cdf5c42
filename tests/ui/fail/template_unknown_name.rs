use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "invoice:<amount>")]
fn send_invoice(conn: &mut SqliteConnection, month: &str, customer_id: u64) -> Result<(), idempotent_jobs::Error> {
    Ok(())
}

fn main() {}
