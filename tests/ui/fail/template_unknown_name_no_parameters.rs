use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "report:<day>")]
fn nightly_report(conn: &mut SqliteConnection) -> Result<(), idempotent_jobs::Error> {
    Ok(())
}

fn main() {}
