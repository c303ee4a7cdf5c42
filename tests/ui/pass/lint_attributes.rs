//! Lint attributes on a handler apply to it as written, once: an `expect` is fulfilled by the
//! handler's own code, and a deprecated handler warns where it is called, not where it is defined
//! (issue 27: the `expect` was copied onto generated code and reported unfulfilled; the companion
//! used the deprecated function).
#![deny(warnings)]
// trybuild allows `dead_code` on its command line; this file is about it.
#![warn(dead_code)]

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

/// `note` is never read: the expectation is met.
#[idempotent_job(key = "expect:<id>")]
#[expect(unused_variables, reason = "the note is for the log, later")]
fn expects(conn: &mut SqliteConnection, id: u64, note: &str) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id)
}

/// Deprecated: calls warn, the definition does not.
#[idempotent_job(key = "old-charge:<order_id>")]
#[deprecated(note = "use `charge`")]
fn old_charge(conn: &mut SqliteConnection, order_id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(order_id)
}

/// An `allow` for the body, and one for the signature, both as written.
#[idempotent_job(key = "allowed:<id>")]
#[allow(clippy::needless_pass_by_value, non_snake_case)]
fn allowed(conn: &mut SqliteConnection, id: u64, Unused: String) -> Result<u64, idempotent_jobs::Error> {
    #[allow(unused_variables)]
    let spare = 1;
    let _ = (conn, Unused);
    Ok(id)
}

/// Never called: the expectation of dead code is met by the handler, and its companion does not
/// keep it alive.
#[idempotent_job(key = "unused:<id>")]
#[expect(dead_code)]
fn unused(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id)
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();
    assert_eq!(expects(&mut conn, 1, "hello").unwrap(), 1);
    #[allow(deprecated)]
    {
        assert_eq!(old_charge(&mut conn, 2).unwrap(), 2);
        assert!(old_charge::outcome(&mut conn, 2).unwrap().is_replayed());
    }
    assert_eq!(allowed(&mut conn, 3, String::new()).unwrap(), 3);
    assert!(expects::outcome(&mut conn, 1, "again").unwrap().is_replayed());
}
