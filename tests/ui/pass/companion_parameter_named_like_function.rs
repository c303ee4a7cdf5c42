//! A parameter named like its handler (`refund: &Refund` in `fn refund`): the companion's
//! `outcome` takes it under that name and still calls the handler, which the parameter would
//! shadow if `outcome` bound it as the user's code does.
#![deny(warnings)]

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

pub struct Refund {
    pub id: u64,
}

#[idempotent_job(key = "refund:<refund.id>")]
pub fn refund(conn: &mut SqliteConnection, refund: &Refund) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(refund.id)
}

/// The connection itself named like the function is no different.
#[idempotent_job(key = "conn:<id>", conn = conn_job)]
pub fn conn_job(conn_job: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn_job;
    Ok(id)
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();
    let r = Refund { id: 5 };
    assert!(refund::outcome(&mut conn, &r).unwrap().is_ran());
    assert_eq!(refund(&mut conn, &r).unwrap(), 5);
    assert!(refund::outcome(&mut conn, &r).unwrap().is_replayed());
    assert_eq!(refund::key(&r).as_str(), "refund:5");
    assert!(conn_job::outcome(&mut conn, 1).unwrap().is_ran());
}
