//! Handlers whose name starts a path elsewhere in their module, where the path does not reach a
//! crate the companion would hide: a block's own `use`, a module declared in a function's body, a
//! `macro_rules!` metavariable. Each keeps its companion (the review of the check that refuses a
//! handler named like a crate the module's code names found these refused).
#![deny(warnings)]

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "time:<id>")]
fn time(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id)
}

fn elapsed() -> bool {
    use std::time;
    time::Instant::now().elapsed() < time::Duration::from_secs(60)
}

#[idempotent_job(key = "report:<id>")]
fn report(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id)
}

fn level() -> u8 {
    mod report {
        pub fn level() -> u8 {
            3
        }
    }
    report::level()
}

#[idempotent_job(key = "url:<id>")]
fn url(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id)
}

macro_rules! made {
    ($url:ident) => {
        $url::default()
    };
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
    idempotent_jobs::migrate(&mut conn).expect("migrations");
    assert!(elapsed());
    assert_eq!(level(), 3);
    let made: String = made!(String);
    assert!(made.is_empty());
    assert_eq!(time(&mut conn, 1).expect("time"), 1);
    assert_eq!(report(&mut conn, 2).expect("report"), 2);
    assert_eq!(url(&mut conn, 3).expect("url"), 3);
    assert_eq!(time::key(&1).as_str(), "time:1");
    assert!(report::outcome(&mut conn, 2).expect("a replay").is_replayed());
    assert_eq!(url::job().name(), "url");
}
