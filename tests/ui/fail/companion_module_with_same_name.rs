use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

mod report {}

#[idempotent_job(key = "report:<day>")]
fn report(conn: &mut SqliteConnection, day: u32) -> Result<u32, idempotent_jobs::Error> {
    let _ = conn;
    Ok(day)
}

mod nested {
    use diesel::SqliteConnection;
    use idempotent_jobs::idempotent_job;

    #[allow(non_camel_case_types)]
    pub trait summary {}

    #[idempotent_job(key = "summary:<day>")]
    pub fn summary(conn: &mut SqliteConnection, day: u32) -> Result<u32, idempotent_jobs::Error> {
        let _ = conn;
        Ok(day)
    }
}

fn main() {}
