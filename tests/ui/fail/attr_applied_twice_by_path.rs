use diesel::SqliteConnection;

#[idempotent_jobs::idempotent_job(key = "invoice:<customer_id>")]
#[idempotent_jobs::idempotent_job(key = "invoice:v2:<customer_id>", name = "send_invoice_v2")]
fn send_invoice(conn: &mut SqliteConnection, customer_id: u64) -> Result<(), idempotent_jobs::Error> {
    let _ = (conn, customer_id);
    Ok(())
}

fn main() {}
