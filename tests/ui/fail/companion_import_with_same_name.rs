use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

mod mailers {
    pub mod welcome_email {}
    pub mod digest {}
}

#[allow(unused_imports)]
use mailers::welcome_email;

#[idempotent_job(key = "welcome:<id>")]
fn welcome_email(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id)
}

mod renamed {
    use diesel::SqliteConnection;
    use idempotent_jobs::idempotent_job;

    #[allow(unused_imports)]
    pub use super::mailers::{digest as send_digest};

    #[idempotent_job(key = "digest:<id>")]
    pub fn send_digest(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
        let _ = conn;
        Ok(id)
    }
}

fn main() {}
