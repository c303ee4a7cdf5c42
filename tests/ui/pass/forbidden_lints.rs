//! A crate that forbids the style lints and `unused_imports` (and `unsafe_code`) compiles its
//! handlers: the expansion carries no `allow` of those lints, which `forbid` turns into an error
//! (E0453: "allow(non_camel_case_types) incompatible with previous forbid"), but where a handler
//! needs one (a parameter named against `non_snake_case`, which such a crate cannot have).
//! `forbid(non_upper_case_globals)` and `forbid(deprecated)` stay out of reach (the registration
//! of `inventory` and `thiserror`'s derive allow them): docs/attribute.md says so.
#![forbid(non_camel_case_types, non_snake_case, unused_imports, unsafe_code)]
#![deny(warnings)]

use diesel::SqliteConnection;
use idempotent_jobs::idempotent_job;

#[idempotent_job(key = "plain:<id>")]
fn plain(conn: &mut SqliteConnection, id: u64) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id)
}

#[idempotent_job(key = "unit:<id>")]
fn unit(conn: &mut SqliteConnection, id: u64) -> Result<(), idempotent_jobs::Error> {
    let _ = (conn, id);
    Ok(())
}

#[idempotent_job(key = "priced:<order_id>:<r#type>", fingerprint(amount))]
fn priced(
    conn: &mut SqliteConnection,
    order_id: u64,
    r#type: &str,
    amount: i64,
) -> Result<i64, idempotent_jobs::Error> {
    let _ = (conn, order_id, r#type);
    Ok(amount)
}

#[idempotent_job(key = "generic:<id>")]
fn generic<C: idempotent_jobs::JobStore>(
    conn: &mut C,
    id: u64,
) -> Result<u64, idempotent_jobs::Error> {
    let _ = conn;
    Ok(id)
}

struct Account {
    id: u64,
}

impl Account {
    #[idempotent_job(key = "account:<self.id>")]
    fn close(&self, conn: &mut SqliteConnection) -> Result<u64, idempotent_jobs::Error> {
        let _ = conn;
        Ok(self.id)
    }
}

macro_rules! handler {
    ($name:ident, $param:ident) => {
        #[idempotent_job(key = "made:<order>")]
        fn $name(conn: &mut SqliteConnection, $param: u64) -> Result<u64, idempotent_jobs::Error> {
            let _ = conn;
            Ok($param)
        }
    };
}

handler!(made, order);

fn main() {
    use diesel::Connection as _;
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();
    assert_eq!(plain(&mut conn, 1).unwrap(), 1);
    unit(&mut conn, 1).unwrap();
    assert_eq!(priced(&mut conn, 2, "card", 300).unwrap(), 300);
    assert_eq!(generic(&mut conn, 3).unwrap(), 3);
    assert_eq!(Account { id: 4 }.close(&mut conn).unwrap(), 4);
    assert_eq!(made(&mut conn, 5).unwrap(), 5);
    assert_eq!(made::key(&5).as_str(), "made:5");
    assert_eq!(plain::key(&1).as_str(), "plain:1");
    assert!(plain::outcome(&mut conn, 1).unwrap().is_replayed());
    assert_eq!(idempotent_jobs::keys::list(&mut conn, &idempotent_jobs::keys::KeyQuery::default()).unwrap().len(), 6);
}
