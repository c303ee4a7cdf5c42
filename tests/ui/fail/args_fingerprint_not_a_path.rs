use diesel::SqliteConnection;
use idempotent::idempotent_job;

#[idempotent_job(key = "charge:<order_id>", fingerprint(amount * 100))]
fn charge(conn: &mut SqliteConnection, order_id: u64, amount: u64) -> Result<(), idempotent::Error> {
    let _ = (conn, amount);
    Ok(())
}

fn main() {}
