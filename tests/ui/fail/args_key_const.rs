use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

const KEY: &str = "invoice:<customer_id>";

#[idempotent_job(key = KEY)]
fn send_invoice(conn: &mut SqliteConnection, customer_id: u64) -> Result<(), idempotent_jobs::Error> {
    Ok(())
}

fn main() {}
