//! `crate = path` finds the runtime under another name.
#![deny(warnings)]

extern crate idempotent_jobs as jobs;

use diesel::prelude::*;
use jobs::idempotent_job;

#[idempotent_job(key = "renamed:<id>", crate = jobs)]
fn renamed(conn: &mut SqliteConnection, id: u64) -> Result<u64, jobs::Error> {
    let _ = conn;
    Ok(id)
}

#[idempotent_job(key = "renamed-str:<id>", crate = "::jobs")]
fn renamed_str(conn: &mut SqliteConnection, id: u64) -> Result<u64, jobs::Error> {
    let _ = conn;
    Ok(id)
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    jobs::migrate(&mut conn).unwrap();
    assert_eq!(renamed(&mut conn, 1).unwrap(), 1);
    assert_eq!(renamed_str(&mut conn, 2).unwrap(), 2);
}
