use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "charge:<order_id>", fingerprint(amout, currency))]
fn charge(conn: &mut SqliteConnection, order_id: u64, amount: u64, currency: &str) -> Result<(), idempotent_jobs::Error> {
    let _ = (conn, amount, currency);
    Ok(())
}

fn main() {}
