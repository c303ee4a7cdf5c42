use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

type Reply = Option<u64>;

#[idempotent_job(key = "reply:<id>")]
fn reply(conn: &mut SqliteConnection, id: u64) -> Reply {
    let _ = conn;
    Some(id)
}

fn main() {}
