use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

struct Billing {
    region: String,
}

impl Billing {
    #[idempotent_job(key = "invoice:<self>:<customer_id>")]
    fn send_invoice(&self, conn: &mut SqliteConnection, customer_id: u64) -> Result<(), idempotent_jobs::Error> {
        Ok(())
    }
}

fn main() {}
