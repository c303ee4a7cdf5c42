//! Where a handler stands is read at the position of its name in the file: a free function and a
//! method with the same name and signature are told apart, and a handler in an `impl` inside a
//! `const _` block is found there.
#![deny(warnings)]

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

pub struct Mailer;

impl Mailer {
    #[idempotent_job(key = "mailer:<id>", name = "mailer_send")]
    pub fn send(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
        let _ = conn;
        Ok(id)
    }
}

#[idempotent_job(key = "send:<id>")]
pub fn send(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id + 1)
}

pub struct Hidden;

const _: () = {
    impl Hidden {
        #[idempotent_job(key = "in-const:<id>")]
        pub fn in_const(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
            let _ = conn;
            Ok(id + 2)
        }
    }
};

// In a named static (not a `const _`), an `impl` of a type declared outside lints as non-local.
#[allow(non_local_definitions)]
static _S: () = {
    impl Mailer {
        #[idempotent_job(key = "in-static:<id>")]
        pub fn in_static(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
            let _ = conn;
            Ok(id + 3)
        }
    }
};

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();
    assert_eq!(Mailer::send(&mut conn, 1).unwrap(), 1);
    assert_eq!(send(&mut conn, 1).unwrap(), 2);
    assert_eq!(send::key(&1).as_str(), "send:1");
    assert_eq!(Hidden::in_const(&mut conn, 1).unwrap(), 3);
    assert_eq!(Mailer::in_static(&mut conn, 1).unwrap(), 4);
}
