use diesel::SqliteConnection;
use idempotent::idempotent_job;

#[idempotent_job(key = "charge:<order_id>", fingerprint(amout, currency))]
fn charge(conn: &mut SqliteConnection, order_id: u64, amount: u64, currency: &str) -> Result<(), idempotent::Error> {
    let _ = (conn, amount, currency);
    Ok(())
}

fn main() {}
