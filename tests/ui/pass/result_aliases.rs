//! A return type is a `Result` by what it is, whatever it is called: an alias with no parameter,
//! one with the error fixed, `anyhow`-style defaults, and a shadowed `Result` (issue 27: the check
//! went by the name and refused `-> JobResult` and `-> Res<T>`). Their companions' `outcome`s
//! work too. A type of the user's named `T` or `E` beside an alias (the companion's own parameters
//! were named so, and shadowed it: "expected `E`, found type parameter `E`").
#![deny(warnings)]

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

#[derive(Debug)]
pub struct AppError(#[allow(dead_code)] idempotent_jobs::Error);

impl From<idempotent_jobs::Error> for AppError {
    fn from(error: idempotent_jobs::Error) -> Self {
        AppError(error)
    }
}

pub type JobResult = std::result::Result<u64, AppError>;
pub type Res<T> = std::result::Result<T, AppError>;

mod shadowing {
    /// An `anyhow::Result`-style alias that shadows the prelude's `Result`.
    pub type Result<T, E = super::AppError> = std::result::Result<T, E>;
}

#[idempotent_job(key = "plain-alias:<id>")]
fn plain_alias(conn: &mut SqliteConnection, id: u64) -> JobResult {
    let _ = conn;
    Ok(id)
}

#[idempotent_job(key = "generic-alias:<id>")]
fn generic_alias(conn: &mut SqliteConnection, id: u64) -> Res<String> {
    let _ = conn;
    Ok(format!("#{id}"))
}

#[idempotent_job(key = "defaulted:<id>")]
fn defaulted(conn: &mut SqliteConnection, id: u64) -> shadowing::Result<u64> {
    let _ = conn;
    Ok(id * 2)
}

use shadowing::Result;

#[idempotent_job(key = "shadowed:<id>")]
fn shadowed(conn: &mut SqliteConnection, id: u64) -> Result<u64> {
    let _ = conn;
    Ok(id * 3)
}

#[idempotent_job(key = "io-style:<id>")]
fn io_style(conn: &mut SqliteConnection, id: u64) -> idempotent_jobs::Result<u64> {
    let _ = conn;
    Ok(id)
}

mod user_types_named_t_and_e {
    use super::{AppError, idempotent_job};
    use diesel::SqliteConnection;

    pub type R<X> = std::result::Result<X, AppError>;
    pub type T = u64;

    /// A key value of a type of the user's named `E`.
    #[derive(Clone, Copy)]
    pub struct E(pub u64);

    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            self.0.fmt(f)
        }
    }

    #[idempotent_job(key = "alias-t:<id>")]
    pub fn alias_t(conn: &mut SqliteConnection, id: T) -> R<T> {
        let _ = conn;
        Ok(id)
    }

    #[idempotent_job(key = "alias-e:<id>")]
    pub fn alias_e(conn: &mut SqliteConnection, id: E) -> R<u64> {
        let _ = conn;
        Ok(id.0)
    }
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();

    assert!(plain_alias::outcome(&mut conn, 1).unwrap().is_ran());
    assert_eq!(plain_alias(&mut conn, 1).unwrap(), 1);
    assert!(plain_alias::outcome(&mut conn, 1).unwrap().is_replayed());

    assert_eq!(generic_alias(&mut conn, 2).unwrap(), "#2");
    let replay: idempotent_jobs::Outcome<String> = generic_alias::outcome(&mut conn, 2).unwrap();
    assert_eq!(replay, idempotent_jobs::Outcome::Replayed("#2".to_owned()));

    assert_eq!(defaulted(&mut conn, 3).unwrap(), 6);
    assert!(defaulted::outcome(&mut conn, 3).unwrap().is_replayed());
    assert_eq!(shadowed(&mut conn, 4).unwrap(), 12);
    assert!(shadowed::outcome(&mut conn, 4).unwrap().is_replayed());
    assert_eq!(io_style(&mut conn, 5).unwrap(), 5);
    assert!(io_style::outcome(&mut conn, 5).unwrap().is_replayed());

    use user_types_named_t_and_e::{E, alias_e, alias_t};
    assert_eq!(alias_t(&mut conn, 6).unwrap(), 6);
    assert!(alias_t::outcome(&mut conn, 6).unwrap().is_replayed());
    assert_eq!(alias_e(&mut conn, E(7)).unwrap(), 7);
    assert!(alias_e::outcome(&mut conn, E(7)).unwrap().is_replayed());
}
