use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "later:<id>")]
fn later(conn: &mut SqliteConnection, id: u64) -> impl std::future::Future<Output = Result<u64, idempotent_jobs::Error>> {
    let _ = conn;
    async move { Ok(id) }
}

fn main() {}
