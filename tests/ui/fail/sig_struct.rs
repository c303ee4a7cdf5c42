use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "invoice:<customer_id>")]
struct SendInvoice {
    customer_id: u64,
}

fn main() {}
