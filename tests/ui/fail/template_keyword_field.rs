//! A placeholder whose field is a keyword no field can be named (`super`, `crate`, `Self`): the
//! attribute panicked, making a raw identifier of it.
use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

pub struct Job {
    pub id: u64,
}

#[idempotent_job(key = "kw:<job.super>")]
fn kw(conn: &mut SqliteConnection, job: &Job) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(job.id)
}

fn main() {}
