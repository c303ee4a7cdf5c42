use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

trait Billing {
    #[idempotent_job(key = "invoice:<customer_id>")]
    fn send_invoice(&self, conn: &mut SqliteConnection, customer_id: u64) -> Result<(), idempotent_jobs::Error>;
}

fn main() {}
