use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

/// Reaches the crate `serde` by a path, as the derive's does: a companion type `serde` here would
/// hide the crate from it (the compiler's errors said "`serde` is a type alias, not a module").
#[derive(serde::Serialize)]
struct Report {
    day: u32,
}

#[idempotent_job(key = "serde:<day>")]
fn serde(conn: &mut SqliteConnection, day: u32) -> Result<u32, idempotent_jobs::Error> {
    let _ = (conn, Report { day });
    Ok(day)
}

fn main() {}
