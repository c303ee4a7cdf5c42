use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "charge:<order_id>", fingerprint(amount))]
fn charge(conn: &mut SqliteConnection, order_id: u64, (amount, currency): (u64, &str)) -> Result<u64, idempotent_jobs::Error> {
    let _ = (conn, currency);
    Ok(order_id + amount)
}

fn main() {}
