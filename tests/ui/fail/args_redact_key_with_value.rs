use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "greet:<email>", redact_key = true)]
fn greet(conn: &mut SqliteConnection, email: &str) -> Result<(), idempotent_jobs::Error> {
    let _ = conn;
    Ok(())
}

fn main() {}
