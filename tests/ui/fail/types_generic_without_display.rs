use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "invoice:<customer_id>")]
fn send_invoice<T>(conn: &mut SqliteConnection, customer_id: T) -> Result<(), idempotent_jobs::Error> {
    Ok(())
}

fn main() {}
