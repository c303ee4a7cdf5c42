use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

struct Money {
    cents: u64,
}

#[idempotent_job(key = "charge:<order_id>", fingerprint(amount))]
fn charge(conn: &mut SqliteConnection, order_id: u64, amount: &Money) -> Result<(), idempotent_jobs::Error> {
    let _ = (conn, amount.cents);
    Ok(())
}

fn main() {}
