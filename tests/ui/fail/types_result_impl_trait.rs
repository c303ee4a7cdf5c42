use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "label:<id>")]
fn label(conn: &mut SqliteConnection, id: u64) -> Result<impl serde::Serialize, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id)
}

fn main() {}
