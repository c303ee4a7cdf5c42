use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = 42)]
fn send_invoice(conn: &mut SqliteConnection, customer_id: u64) -> Result<(), idempotent_jobs::Error> {
    Ok(())
}

fn main() {}
