use diesel::SqliteConnection;
use idempotent::idempotent_job;

#[idempotent_job(key = "invoice:<customer_id>")]
fn send_invoice(conn: &mut SqliteConnection, customer_id: u64) -> Result<u64, idempotent::Error> {
    let total: u64 = "not a number";
    Ok(total + customer_id)
}

fn main() {}
