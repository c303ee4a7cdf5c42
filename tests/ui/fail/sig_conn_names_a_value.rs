use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "invoice:<customer_id>", conn = id)]
fn send_invoice(db: &mut SqliteConnection, id: i64, customer_id: u64) -> Result<(), idempotent_jobs::Error> {
    let _ = (db, id, customer_id);
    Ok(())
}

fn main() {}
