//! A handler taking an r2d2 pooled connection: the attribute reaches the Diesel connection by deref.
#![deny(warnings)]

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool, PooledConnection};
use idempotent_jobs::idempotent_job;

type Pooled = PooledConnection<ConnectionManager<SqliteConnection>>;

#[idempotent_job(key = "pooled:<id>")]
fn pooled(conn: &mut Pooled, id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id)
}

#[idempotent_job(key = "boxed:<id>")]
fn boxed(conn: &mut Box<SqliteConnection>, id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id)
}

fn main() {
    let pool = Pool::builder()
        .max_size(1)
        .build(ConnectionManager::<SqliteConnection>::new(":memory:"))
        .unwrap();
    let mut conn = pool.get().unwrap();
    idempotent_jobs::migrate(&mut *conn).unwrap();
    assert_eq!(pooled(&mut conn, 1).unwrap(), 1);
    let mut boxed_conn = Box::new(SqliteConnection::establish(":memory:").unwrap());
    idempotent_jobs::migrate(&mut *boxed_conn).unwrap();
    assert_eq!(boxed(&mut boxed_conn, 2).unwrap(), 2);
}
