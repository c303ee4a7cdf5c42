use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

// The companion's `outcome` calls the handler once for each combination of the parameters under
// `#[cfg]` that exist: up to four of them.
#[idempotent_job(key = "cfg:<id>")]
fn five(
    conn: &mut SqliteConnection,
    id: u64,
    #[cfg(all())] a: u8,
    #[cfg(all())] b: u8,
    #[cfg(all())] c: u8,
    #[cfg(all())] d: u8,
    #[cfg(all())] e: u8,
) -> Result<u64, idempotent_jobs::Error> {
    let _ = (conn, a, b, c, d, e);
    Ok(id)
}

fn main() {
    let mut conn = diesel::Connection::establish(":memory:").unwrap();
    let _ = five(&mut conn, 1, 2, 3, 4, 5, 6);
}
