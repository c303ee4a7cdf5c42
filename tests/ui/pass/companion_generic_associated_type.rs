//! A generic handler whose key reads an associated type of its parameter (`id: E::Id`): `E`
//! cannot be inferred from `E::Id`, so the handler names it when it builds the key through the
//! companion's `key`, and so does a caller (`sync_entity::key::<User>(..)`).
#![deny(warnings)]

use std::fmt::Display;

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

pub trait Entity {
    type Id: Display;
    const KIND: &'static str;
}

pub struct User;

impl Entity for User {
    type Id = u64;
    const KIND: &'static str = "user";
}

pub struct Team;

impl Entity for Team {
    type Id = String;
    const KIND: &'static str = "team";
}

#[idempotent_job(key = "sync:<id>", name = "sync_entity")]
pub fn sync_entity<E: Entity>(conn: &mut SqliteConnection, id: E::Id) -> Result<String, idempotent_jobs::Error> {
    let _ = conn;
    Ok(format!("{}:{id}", E::KIND))
}

/// The same with a where-clause, a const generic and a lifetime.
#[idempotent_job(key = "sync-where:<id>:<tag>")]
pub fn sync_where<'a, E, const N: usize>(conn: &mut SqliteConnection, tag: &'a str, id: &E::Id) -> Result<String, idempotent_jobs::Error>
where
    E: Entity,
{
    let _ = conn;
    Ok(format!("{}:{id}:{tag}:{N}", E::KIND))
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();
    assert_eq!(sync_entity::<User>(&mut conn, 7).unwrap(), "user:7");
    assert_eq!(sync_entity::<User>(&mut conn, 7).unwrap(), "user:7");
    assert_eq!(sync_entity::<Team>(&mut conn, "t".to_owned()).unwrap(), "team:t");
    assert_eq!(sync_entity::key::<User>(&7).as_str(), "sync:7");
    assert!(sync_entity::outcome::<User>(&mut conn, 7).unwrap().is_replayed());
    assert_eq!(sync_where::<User, 2>(&mut conn, "a", &8).unwrap(), "user:8:a:2");
    assert_eq!(sync_where::key::<User>("a", &8).as_str(), "sync-where:8:a");
}
