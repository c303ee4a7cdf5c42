use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "pair:<id>")]
fn pair(conn: &mut SqliteConnection, id: u64) -> (u64, u64) {
    let _ = conn;
    (id, id)
}

fn main() {}
