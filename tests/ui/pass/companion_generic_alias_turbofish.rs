//! A generic handler whose return type is an alias of `Result` (not spelled `Result<T, E>`): its
//! `outcome` is called with the handler's turbofish alone. Before, `outcome` had the alias's `T`
//! and `E` as type parameters of its own: "associated function takes 3 generic arguments but 1
//! generic argument was supplied". The same for an alias that names none of the handler's
//! parameters (`anyhow::Result<()>`'s shape): `send::outcome::<Sms>` failed alike.
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

/// An alias naming none of the handler's parameters.
type Sent = Result<usize, idempotent_jobs::Error>;

trait Channel {
    const NAME: &'static str;
}

struct Sms;

impl Channel for Sms {
    const NAME: &'static str = "sms";
}

#[idempotent_job(key = "send:<id>")]
fn send<C: Channel>(conn: &mut SqliteConnection, id: u64) -> Sent {
    let _ = (conn, id);
    Ok(C::NAME.len())
}

/// The same with a const parameter alone.
#[idempotent_job(key = "batch:<id>")]
fn batch<const N: usize>(conn: &mut SqliteConnection, id: u64) -> Sent {
    let _ = (conn, id);
    Ok(N)
}

/// A const parameter that is not a `usize` (no array length can name it): `outcome` keeps the
/// alias's parameters of its own; the handler compiles and runs. Before the fix above it failed
/// to compile ("the constant `B` is not of type `usize`").
#[idempotent_job(key = "flag:<id>")]
fn flag<const B: bool>(conn: &mut SqliteConnection, id: u64) -> Sent {
    let _ = (conn, id);
    Ok(usize::from(B))
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
    idempotent_jobs::migrate(&mut conn).expect("migrations");
    assert!(load::outcome::<Vec<u8>>(&mut conn, 1).expect("a run").is_ran());
    assert!(load::outcome::<Vec<u8>>(&mut conn, 1).expect("a replay").is_replayed());
    assert_eq!(load::<Vec<u8>>(&mut conn, 1).expect("a replay"), Vec::<u8>::new());
    assert_eq!(send::outcome::<Sms>(&mut conn, 2).expect("a run").into_inner(), 3);
    assert!(send::outcome::<Sms>(&mut conn, 2).expect("a replay").is_replayed());
    assert_eq!(batch::outcome::<4>(&mut conn, 3).expect("a run").into_inner(), 4);
    assert_eq!(flag::<true>(&mut conn, 4).expect("a run"), 1);
}
