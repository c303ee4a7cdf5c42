use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "reminder:<user_id>", name = "remind_users ")]
fn remind(conn: &mut SqliteConnection, user_id: u64) -> Result<(), idempotent_jobs::Error> {
    let _ = (conn, user_id);
    Ok(())
}

fn main() {}
