use diesel::SqliteConnection;
use idempotent::idempotent_job;

#[idempotent_job(key = "invoice:<customer_id>")]
fn send_invoice<T>(conn: &mut SqliteConnection, customer_id: T) -> Result<(), idempotent::Error> {
    Ok(())
}

fn main() {}
