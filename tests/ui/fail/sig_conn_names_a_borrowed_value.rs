use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "invoice:<customer_id>", conn = note)]
fn send_invoice(db: &mut SqliteConnection, note: &mut String, customer_id: u64) -> Result<(), idempotent_jobs::Error> {
    let _ = (db, note, customer_id);
    Ok(())
}

fn main() {}
