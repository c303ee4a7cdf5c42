//! A body that starts with inner attributes: they move onto the function, where they apply to the
//! whole handler (inside the wrapper's closure they could not stand).
#![deny(warnings)]

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "inner:<id>")]
fn inner_attributes(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
    #![allow(unused_variables)]
    #![allow(clippy::let_unit_value)]
    let unused = ();
    let _ = conn;
    Ok(id)
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();
    assert_eq!(inner_attributes(&mut conn, 7).unwrap(), 7);
    assert_eq!(inner_attributes(&mut conn, 7).unwrap(), 7);
}
