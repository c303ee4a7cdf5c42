//! Parameters named as an edition 2015 crate allows, where a later edition reserves the name:
//! written raw (`r#async`), as syn reads the signature in the latest edition. They work as
//! placeholders (`<async>`), fingerprint inputs (`fingerprint(r#dyn)`) and in the body, and the
//! job runs once per key.
extern crate diesel;
extern crate idempotent_jobs;

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "batch:<async>:<try>", fingerprint(r#dyn))]
fn batch(
    conn: &mut SqliteConnection,
    r#async: u32,
    r#try: u32,
    r#dyn: u32,
) -> Result<u32, idempotent_jobs::Error> {
    let _ = conn;
    Ok(r#async + r#try + r#dyn)
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
    idempotent_jobs::migrate(&mut conn).expect("migrations");
    assert!(batch::outcome(&mut conn, 1, 2, 3).expect("a run").is_ran());
    assert!(batch::outcome(&mut conn, 1, 2, 3).expect("a replay").is_replayed());
    assert_eq!(batch::key(&1, &2).as_str(), "batch:1:2");
}
