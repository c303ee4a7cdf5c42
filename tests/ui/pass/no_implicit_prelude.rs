//! Generated code names nothing through the prelude: handlers in a module without it compile and
//! run, a fingerprinted one and a key with a non-ASCII parameter name among them (the fingerprint's
//! builder was made with `FingerprintBuilder::default()`, the prelude's `Default`: E0599).
#![deny(warnings)]

#[no_implicit_prelude]
mod jobs {
    use ::diesel::SqliteConnection;
    use ::idempotent_jobs::idempotent_job;
    use ::std::result::Result;

    #[idempotent_job(key = "plain:<id>")]
    pub fn plain(conn: &mut SqliteConnection, id: u64) -> Result<u64, ::idempotent_jobs::Error> {
        let _ = conn;
        Result::Ok(id)
    }

    #[idempotent_job(key = "priced:<id>", fingerprint(id, amount))]
    pub fn priced(
        conn: &mut SqliteConnection,
        id: u64,
        amount: i64,
    ) -> Result<i64, ::idempotent_jobs::Error> {
        let _ = (conn, id);
        Result::Ok(amount)
    }

    #[idempotent_job(key = "krama:<क्रम>")]
    pub fn krama(conn: &mut SqliteConnection, क्रम: u64) -> Result<u64, ::idempotent_jobs::Error> {
        let _ = conn;
        Result::Ok(क्रम)
    }
}

fn main() {
    use diesel::prelude::*;
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();
    assert_eq!(jobs::plain(&mut conn, 1).unwrap(), 1);
    assert_eq!(jobs::priced(&mut conn, 2, 300).unwrap(), 300);
    assert_eq!(jobs::priced(&mut conn, 2, 300).unwrap(), 300);
    assert_eq!(jobs::krama(&mut conn, 3).unwrap(), 3);
    let record = idempotent_jobs::keys::lookup(&mut conn, &idempotent_jobs::JobKey::new("krama:3"))
        .unwrap()
        .expect("the key as the template gives it");
    assert_eq!(record.job, "krama");
}
