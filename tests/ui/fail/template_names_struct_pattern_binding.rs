use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

struct Period {
    month: u8,
    year: u16,
}

#[idempotent_job(key = "report:<year>")]
fn report(conn: &mut SqliteConnection, Period { month, year }: Period) -> Result<u16, idempotent_jobs::Error> {
    let _ = conn;
    Ok(year + u16::from(month))
}

fn main() {}
