use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "report:<month>")]
fn report(conn: &mut SqliteConnection, (month, day): (u8, u8)) -> Result<u8, idempotent_jobs::Error> {
    let _ = conn;
    Ok(month + day)
}

fn main() {}
