use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "generic:<id>")]
fn generic<C: diesel::Connection>(conn: &mut C, id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id)
}

fn main() {}
