use diesel::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "welcome:<user_id>")]
fn welcome(conn: &mut SyncConnectionWrapper<SqliteConnection>, user_id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(user_id)
}

fn main() {}
