use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

type Db = SqliteConnection;

#[idempotent_job(key = "welcome:<user_id>")]
async fn welcome(conn: &mut Db, user_id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(user_id)
}

fn main() {}
