use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

/// A generic handler whose return type is no `Result` and names none of its parameters: one
/// error, at the return type (a bound on `outcome` that named no parameter was a second one).
#[idempotent_job(key = "reply:<id>")]
fn reply<L: std::fmt::Display>(conn: &mut SqliteConnection, id: u64, label: L) -> Option<u64> {
    let _ = (conn, label);
    Some(id)
}

fn main() {}
