use diesel::SqliteConnection;
use idempotent::idempotent_job;

#[idempotent_job(key = "invoice:<customer_id>")]
fn send_invoice(conn: SqliteConnection, customer_id: u64) -> Result<(), idempotent::Error> {
    Ok(())
}

fn main() {}
