//! `Self` inside an item nested in the body (a local `impl X { fn new() -> Self }`) belongs to that
//! item: the handler is still a free function, with a companion.
#![deny(warnings)]

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "local:<id>")]
pub fn local_impl(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
    struct Counter(u64);
    impl Counter {
        fn new(start: u64) -> Self {
            Self(start)
        }
    }
    let _ = conn;
    Ok(Counter::new(id).0)
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();
    assert!(local_impl::outcome(&mut conn, 4).unwrap().is_ran());
    assert_eq!(local_impl::key(&4).as_str(), "local:4");
    assert_eq!(local_impl(&mut conn, 4).unwrap(), 4);
}
