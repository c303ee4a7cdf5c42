use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[allow(non_camel_case_types)]
struct report {
    day: u32,
}

#[idempotent_job(key = "report:<day>")]
fn report(conn: &mut SqliteConnection, day: u32) -> Result<u32, idempotent_jobs::Error> {
    let _ = conn;
    Ok(day)
}

fn main() {
    let _ = report { day: 1 }.day;
}
