use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

struct Invoice {
    id: u64,
}

#[idempotent_job(key = "invoice:<customer_id>")]
fn send_invoice(conn: &mut SqliteConnection, customer_id: u64) -> Result<Invoice, idempotent_jobs::Error> {
    Ok(Invoice { id: customer_id })
}

fn main() {}
