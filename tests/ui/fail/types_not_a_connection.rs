use idempotent_jobs::idempotent_job;

struct Mailer;

#[idempotent_job(key = "invoice:<customer_id>")]
fn send_invoice(conn: &mut Mailer, customer_id: u64) -> Result<(), idempotent_jobs::Error> {
    let _ = conn;
    Ok(())
}

fn main() {}
