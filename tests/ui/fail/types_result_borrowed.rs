use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "greeting:<id>")]
fn greeting(conn: &mut SqliteConnection, id: u64) -> Result<&'static str, idempotent_jobs::Error> {
    let _ = (conn, id);
    Ok("hello")
}

fn main() {}
