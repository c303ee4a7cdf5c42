use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

struct InvoiceJob {
    month: String,
    customer_id: u64,
}

#[idempotent_job(key = "invoice:<job.month>:<job.customer>")]
fn send_invoice(conn: &mut SqliteConnection, job: &InvoiceJob) -> Result<(), idempotent_jobs::Error> {
    Ok(())
}

fn main() {}
