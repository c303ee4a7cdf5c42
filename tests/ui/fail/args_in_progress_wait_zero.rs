use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "export:<id>", in_progress = "wait at most 0s")]
fn export(conn: &mut SqliteConnection, id: u64) -> Result<(), idempotent_jobs::Error> {
    let _ = (conn, id);
    Ok(())
}

fn main() {}
