use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

struct Customer {
    id: u64,
}

#[idempotent_job(key = "invoice:<customer>")]
fn send_invoice(conn: &mut SqliteConnection, customer: &Customer) -> Result<(), idempotent_jobs::Error> {
    Ok(())
}

fn main() {}
