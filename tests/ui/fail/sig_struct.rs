use diesel::SqliteConnection;
use idempotent::idempotent_job;

#[idempotent_job(key = "invoice:<customer_id>")]
struct SendInvoice {
    customer_id: u64,
}

fn main() {}
