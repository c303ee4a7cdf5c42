use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "invoice:<customer_id>")]
#[idempotent_job(key = "invoice:<customer_id>")]
fn send_invoice(conn: &mut SqliteConnection, customer_id: u64) -> Result<(), idempotent_jobs::Error> {
    let _ = (conn, customer_id);
    Ok(())
}

fn main() {}
