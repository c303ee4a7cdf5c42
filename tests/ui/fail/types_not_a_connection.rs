use idempotent::idempotent_job;

struct Mailer;

#[idempotent_job(key = "invoice:<customer_id>")]
fn send_invoice(conn: &mut Mailer, customer_id: u64) -> Result<(), idempotent::Error> {
    let _ = conn;
    Ok(())
}

fn main() {}
