use diesel::SqliteConnection;
use idempotent::idempotent_job;

#[idempotent_job(key = "report:<day>")]
fn nightly_report(conn: &mut SqliteConnection) -> Result<(), idempotent::Error> {
    Ok(())
}

fn main() {}
