//! A MariaDB/MySQL database of a test's own, on the server at `IDEMPOTENT_MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306/test`), dropped when the test is done, passed or failed.

use diesel::connection::SimpleConnection as _;
use diesel::prelude::*;

/// The server's URL, with the database the tests start from.
pub fn base_url() -> String {
    std::env::var("IDEMPOTENT_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A connection to `url`, or a failure that says which server is missing and how to start it.
pub fn reach(url: &str) -> MysqlConnection {
    MysqlConnection::establish(url).unwrap_or_else(|e| {
        panic!(
            "MariaDB/MySQL is not reachable at {url}: {e}\nStart it with `start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd` (scripts/test does this), or point IDEMPOTENT_MYSQL_URL at a server."
        )
    })
}

/// `url` with its database replaced by `database`.
pub fn url_of(url: &str, database: &str) -> String {
    let (server, _) = url.rsplit_once('/').expect("a database in the URL");
    format!("{server}/{database}")
}

/// Creates the database `name` (`CREATE DATABASE name options`), runs `f` with its URL, and drops
/// it, whether `f` returned or panicked (the panic goes on).
pub fn in_database<T>(name: &str, options: &str, f: impl FnOnce(&str) -> T) -> T {
    let base = base_url();
    let mut admin = reach(&base);
    admin
        .batch_execute(&format!("CREATE DATABASE {name} {options}"))
        .expect("a database");
    let url = url_of(&base, name);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&url)));
    let _ = admin.batch_execute(&format!("DROP DATABASE {name}"));
    result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}
