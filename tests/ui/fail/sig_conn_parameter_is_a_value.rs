use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "invoice:<customer_id>")]
fn send_invoice(conn: &str, customer_id: u64) -> Result<(), idempotent_jobs::Error> {
    let _ = (conn, customer_id);
    Ok(())
}

fn main() {}
