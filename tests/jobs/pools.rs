//! A handler that takes an r2d2 pooled connection: the attribute reaches the Diesel connection
//! through `Deref`, and the body keeps the pooled connection it was written for.

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool, PooledConnection};
use idempotent_jobs::idempotent_job;

use crate::backends::Sqlite;
use crate::handlers::{TestConn, TestError};
use crate::harness::Db;

type Pooled = PooledConnection<ConnectionManager<SqliteConnection>>;

#[idempotent_job(key = "r2d2-welcome:<user_id>", name = "r2d2_welcome")]
fn welcome(conn: &mut Pooled, user_id: u64) -> Result<String, TestError> {
    conn.insert_message("welcome", &user_id.to_string())?;
    Ok(format!("welcomed {user_id}"))
}

#[test]
fn pooled_connections_work_through_deref() {
    let db = Db::<Sqlite>::fresh();
    let pool = Pool::builder()
        .max_size(2)
        .build(ConnectionManager::<SqliteConnection>::new(db.locator()))
        .expect("pool");
    let first = welcome(&mut pool.get().unwrap(), 7).unwrap();
    let second = welcome(&mut pool.get().unwrap(), 7).unwrap();
    assert_eq!(first, second);
    assert_eq!(db.connect().count_messages().unwrap(), 1);
}
