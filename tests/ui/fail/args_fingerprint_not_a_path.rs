use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "charge:<order_id>", fingerprint(amount * 100))]
fn charge(conn: &mut SqliteConnection, order_id: u64, amount: u64) -> Result<(), idempotent_jobs::Error> {
    let _ = (conn, amount);
    Ok(())
}

fn main() {}
