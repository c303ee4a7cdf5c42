use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

pub struct Invoices;

impl Invoices {
    #[idempotent_job(key = "invoice:<id>")]
    pub fn send(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
        let _ = conn;
        Ok(id)
    }
}

fn main() {}
