use diesel::SqliteConnection;
use diesel::r2d2::{ConnectionManager, PooledConnection};
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "welcome:<user_id>")]
async fn welcome(conn: &mut PooledConnection<ConnectionManager<SqliteConnection>>, user_id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(user_id)
}

fn main() {}
