//! A handler named like a module its module reaches through a glob import (`use super::*;`):
//! the companion, an item of the handler's module, would hide the module, so the build fails at the
//! function's name, pointing at `no_companion`. Before, the body's `report::level()` failed
//! looking for `level` on the companion's hidden type, saying nothing of `no_companion`.
use diesel::prelude::*;

pub mod report {
    pub fn level() -> u64 {
        3
    }
}

pub mod jobs {
    use super::*;
    use idempotent_jobs::idempotent_job;

    #[idempotent_job(key = "report:<id>")]
    pub fn report(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
        let _ = conn;
        Ok(id + report::level())
    }
}

fn main() {}
