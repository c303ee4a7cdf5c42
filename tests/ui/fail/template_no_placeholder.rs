use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "nightly-report")]
fn nightly_report(conn: &mut SqliteConnection) -> Result<(), idempotent_jobs::Error> {
    Ok(())
}

fn main() {}
