use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[derive(Debug)]
enum AppError {
    Declined,
}

#[idempotent_job(key = "invoice:<customer_id>")]
fn send_invoice(conn: &mut SqliteConnection, customer_id: u64) -> Result<(), AppError> {
    Err(AppError::Declined)
}

fn main() {}
