use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "tags:<id>")]
fn tags(conn: &mut SqliteConnection, id: u64) -> Result<Vec<&'static str>, idempotent_jobs::Error> {
    let _ = (conn, id);
    Ok(vec!["a"])
}

fn main() {}
