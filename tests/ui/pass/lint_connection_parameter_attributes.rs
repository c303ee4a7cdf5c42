//! Lint attributes on the connection parameter reach the body's use of it: the body gets the
//! connection as a closure's parameter, which takes them with the parameter's `mut`.
#![deny(warnings)]

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "unused-conn:<id>")]
pub fn unused_conn(#[allow(unused_variables)] conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
    Ok(id)
}

#[idempotent_job(key = "unused-mut:<id>")]
pub fn unused_mut(#[allow(unused_mut)] mut conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id)
}

#[idempotent_job(key = "expected:<id>")]
pub fn expected(#[expect(unused_variables)] conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
    Ok(id)
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();
    assert_eq!(unused_conn(&mut conn, 1).unwrap(), 1);
    assert_eq!(unused_mut(&mut conn, 2).unwrap(), 2);
    assert_eq!(expected(&mut conn, 3).unwrap(), 3);
}
