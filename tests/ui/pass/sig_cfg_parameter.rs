//! Parameters under `#[cfg]`: the companion's `outcome` takes those that exist in the build and
//! passes them on (`cfg(all())` is always on, `cfg(any())` always off).
#![deny(warnings)]

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "cfg:<id>")]
pub fn with_cfg(
    conn: &mut SqliteConnection,
    #[cfg(any())] never: u8,
    #[cfg(all())] always: u8,
    id: u64,
    #[cfg(all(not(any()), all()))] also: u8,
) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id + u64::from(always) + u64::from(also))
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();
    assert_eq!(with_cfg(&mut conn, 1, 2, 3).unwrap(), 6);
    assert!(with_cfg::outcome(&mut conn, 1, 2, 3).unwrap().is_replayed());
    assert!(with_cfg::outcome(&mut conn, 1, 5, 3).unwrap().is_ran());
}
