//! A generic handler whose return type is an alias of `Result` (not spelled `Result<T, E>`): its
//! `outcome` is called with the handler's turbofish alone. Before, `outcome` had the alias's `T`
//! and `E` as type parameters of its own: "associated function takes 3 generic arguments but 1
//! generic argument was supplied".
#![deny(warnings)]

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;
use serde::{Serialize, de::DeserializeOwned};

type Loaded<T> = Result<T, idempotent_jobs::Error>;

#[idempotent_job(key = "load:<id>")]
fn load<T: Serialize + DeserializeOwned + Default>(conn: &mut SqliteConnection, id: u64) -> Loaded<T> {
    let _ = (conn, id);
    Ok(T::default())
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
    idempotent_jobs::migrate(&mut conn).expect("migrations");
    assert!(load::outcome::<Vec<u8>>(&mut conn, 1).expect("a run").is_ran());
    assert!(load::outcome::<Vec<u8>>(&mut conn, 1).expect("a replay").is_replayed());
    assert_eq!(load::<Vec<u8>>(&mut conn, 1).expect("a replay"), Vec::<u8>::new());
}
