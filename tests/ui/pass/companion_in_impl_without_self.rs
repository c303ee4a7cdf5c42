//! Associated functions that neither take `self` nor name `Self`, without `no_companion`: the
//! attribute reads from the source file that they stand in an `impl` or `trait` block, where a
//! type cannot be declared, and gives them no companion (issue 27: the companion was emitted
//! inside the block, five errors and no word of `no_companion`).
#![deny(warnings)]

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;
use std::sync::atomic::{AtomicU32, Ordering};

static RUNS: AtomicU32 = AtomicU32::new(0);

pub struct Invoices;

impl Invoices {
    #[idempotent_job(key = "invoice:<id>")]
    pub fn send(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
        let _ = conn;
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(id)
    }
}

/// A default method of a trait.
pub trait Remind {
    #[idempotent_job(key = "remind:<id>")]
    fn remind(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
        let _ = conn;
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(id * 2)
    }
}

impl Remind for Invoices {}

/// A free function of the same name and a different signature keeps its companion (and needs a
/// job name of its own: two jobs called `send` would be refused when they first run).
#[idempotent_job(key = "send:<day>", name = "send_by_day")]
pub fn send(conn: &mut SqliteConnection, day: u32) -> Result<u32, idempotent_jobs::Error> {
    let _ = conn;
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(day)
}

fn main() {
    /// An `impl` block inside a function's body.
    struct Local;
    impl Local {
        #[idempotent_job(key = "local:<id>")]
        fn run(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
            let _ = conn;
            RUNS.fetch_add(1, Ordering::SeqCst);
            Ok(id + 1)
        }
    }

    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();
    for _ in 0..2 {
        assert_eq!(Invoices::send(&mut conn, 7).unwrap(), 7);
        assert_eq!(<Invoices as Remind>::remind(&mut conn, 7).unwrap(), 14);
        assert_eq!(Local::run(&mut conn, 7).unwrap(), 8);
        assert_eq!(send(&mut conn, 3).unwrap(), 3);
    }
    assert!(send::outcome(&mut conn, 3).unwrap().is_replayed());
    assert_eq!(RUNS.load(Ordering::SeqCst), 4, "each body ran once");
}
