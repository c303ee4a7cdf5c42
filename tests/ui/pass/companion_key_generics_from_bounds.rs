//! The companion's `key` declares every generic parameter its inputs' types need, through their
//! bounds and the where-clause too (`Id: Into<Raw>` needs `Raw`), lifetimes included (`'b: 'a`).
#![deny(warnings)]

use std::fmt::Display;

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "convert:<id>")]
pub fn convert<Id: Display + Into<Raw>, Raw: Into<u64>>(conn: &mut SqliteConnection, id: Id) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id.into().into())
}

#[idempotent_job(key = "convert-where:<id>")]
pub fn convert_where<Id, Raw, Other>(conn: &mut SqliteConnection, id: Id, other: Other) -> Result<u64, idempotent_jobs::Error>
where
    Id: Display + Into<Raw>,
    Raw: Into<u64>,
    Other: Into<u64>,
{
    let _ = conn;
    Ok(id.into().into() + other.into())
}

#[idempotent_job(key = "outlives:<name>")]
pub fn outlives<'a, 'b: 'a>(conn: &mut SqliteConnection, name: &'b str, longer: &'a str) -> Result<String, idempotent_jobs::Error> {
    let _ = conn;
    Ok(format!("{name}{longer}"))
}

/// `'a` is not `'ab`.
#[idempotent_job(key = "prefix:<name>")]
pub fn prefix<'a, 'ab>(conn: &mut SqliteConnection, name: &'ab str, other: &'a str) -> Result<String, idempotent_jobs::Error> {
    let _ = conn;
    Ok(format!("{name}{other}"))
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();
    assert_eq!(convert::<u8, u16>(&mut conn, 3).unwrap(), 3);
    assert_eq!(convert::key::<u8, u16>(&3).as_str(), "convert:3");
    assert_eq!(convert_where::<u8, u16, u8>(&mut conn, 3, 1).unwrap(), 4);
    assert_eq!(outlives(&mut conn, "a", "b").unwrap(), "ab");
    assert_eq!(outlives::key("a").as_str(), "outlives:a");
    assert_eq!(prefix(&mut conn, "a", "b").unwrap(), "ab");
}
