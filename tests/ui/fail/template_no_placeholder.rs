use diesel::SqliteConnection;
use idempotent::idempotent_job;

#[idempotent_job(key = "nightly-report")]
fn nightly_report(conn: &mut SqliteConnection) -> Result<(), idempotent::Error> {
    Ok(())
}

fn main() {}
