//! Handlers in `impl` blocks without a receiver: an associated function whose signature or body
//! names `Self` gets no companion (a type cannot stand in an `impl` block), and `no_companion` says
//! so for one that does not (issue 27: the companion was emitted inside the `impl`).
#![deny(warnings)]

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;
use serde::{Deserialize, Serialize};

#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    id: i64,
    runs: u32,
}

static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn ran() -> u32 {
    RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
}

impl Receipt {
    /// `Self` in the return type.
    #[idempotent_job(key = "receipt:<id>")]
    pub fn create(conn: &mut SqliteConnection, id: i64) -> Result<Self, idempotent_jobs::Error> {
        let _ = conn;
        Ok(Self { id, runs: ran() })
    }

    /// `Self` in a parameter.
    #[idempotent_job(key = "copy:<id>")]
    pub fn copy(conn: &mut SqliteConnection, id: i64, from: &Self) -> Result<i64, idempotent_jobs::Error> {
        let _ = (conn, ran());
        Ok(from.id + id)
    }

    /// `Self` in the body only.
    #[idempotent_job(key = "count:<id>")]
    pub fn count(conn: &mut SqliteConnection, id: i64) -> Result<i64, idempotent_jobs::Error> {
        let _ = (conn, ran());
        Ok(Self::base() + id)
    }

    /// No `Self` anywhere: `no_companion`.
    #[idempotent_job(key = "plain:<id>", no_companion)]
    pub fn plain(conn: &mut SqliteConnection, id: i64) -> Result<i64, idempotent_jobs::Error> {
        let _ = (conn, ran());
        Ok(id)
    }

    fn base() -> i64 {
        100
    }
}

/// A trait implemented with an associated handler.
pub trait Create: Sized {
    fn make(conn: &mut SqliteConnection, id: i64) -> Result<Self, idempotent_jobs::Error>;
}

impl Create for Receipt {
    #[idempotent_job(key = "make:<id>")]
    fn make(conn: &mut SqliteConnection, id: i64) -> Result<Self, idempotent_jobs::Error> {
        let _ = conn;
        Ok(Receipt { id, runs: ran() })
    }
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();

    let first = Receipt::create(&mut conn, 7).unwrap();
    assert_eq!(Receipt::create(&mut conn, 7).unwrap(), first, "replayed: the same receipt");
    assert_eq!(Receipt::copy(&mut conn, 1, &first).unwrap(), 8);
    assert_eq!(Receipt::copy(&mut conn, 1, &first).unwrap(), 8);
    assert_eq!(Receipt::count(&mut conn, 1).unwrap(), 101);
    assert_eq!(Receipt::count(&mut conn, 1).unwrap(), 101);
    assert_eq!(Receipt::plain(&mut conn, 2).unwrap(), 2);
    assert_eq!(Receipt::plain(&mut conn, 2).unwrap(), 2);
    let made = <Receipt as Create>::make(&mut conn, 9).unwrap();
    assert_eq!(<Receipt as Create>::make(&mut conn, 9).unwrap(), made);
    assert_eq!(RUNS.load(std::sync::atomic::Ordering::SeqCst), 5, "each body ran once");
}
