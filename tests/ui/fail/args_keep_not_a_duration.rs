use diesel::SqliteConnection;
use idempotent::idempotent_job;

#[idempotent_job(key = "reminder:<user_id>", keep = "30 days")]
fn remind(conn: &mut SqliteConnection, user_id: u64) -> Result<(), idempotent::Error> {
    let _ = conn;
    Ok(())
}

fn main() {}
