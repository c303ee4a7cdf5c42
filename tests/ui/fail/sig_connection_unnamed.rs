use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "wildcard:<id>")]
fn wildcard(_: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
    Ok(id)
}

fn main() {}
