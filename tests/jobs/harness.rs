//! One isolated database per test, on every backend compiled in.
//!
//! Backends are chosen with cargo features: SQLite always (embedded), PostgreSQL with `postgres`.
//! A backend whose server cannot be reached fails its tests with a message saying how to start it.

use std::sync::atomic::{AtomicU32, Ordering};

use diesel::Connection;

use crate::handlers::TestConn;

/// A fresh database for one test, dropped when the test ends.
pub trait Backend: Sized {
    /// The connection type the handlers take.
    type Conn: TestConn + 'static;

    /// A new, empty database with the runtime's and the tests' tables.
    fn fresh() -> Self;

    /// A new connection to this test's database.
    fn connect(&self) -> Self::Conn;

    /// Where a child process finds this database.
    fn locator(&self) -> String;

    /// The database a parent process made, by its locator.
    fn attach(locator: &str) -> Self;
}

/// A name no other test (in this process or another) uses.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}_{}_{}_{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn prepare<C: TestConn>(conn: &mut C) {
    idempotent::migrate(conn).expect("the runtime's migrations run");
    conn.create_test_tables()
        .expect("the tests' tables are created");
}

pub struct Sqlite {
    path: String,
    owner: bool,
}

impl Backend for Sqlite {
    type Conn = diesel::SqliteConnection;

    fn fresh() -> Self {
        let path = std::env::temp_dir()
            .join(format!("{}.db", unique_name("idempotent_test")))
            .to_string_lossy()
            .into_owned();
        let db = Sqlite { path, owner: true };
        let mut conn = db.connect();
        diesel::connection::SimpleConnection::batch_execute(&mut conn, "PRAGMA journal_mode = WAL")
            .expect("WAL mode");
        prepare(&mut conn);
        db
    }

    fn connect(&self) -> Self::Conn {
        diesel::SqliteConnection::establish(&self.path)
            .unwrap_or_else(|e| panic!("opening SQLite database {}: {e}", self.path))
    }

    fn locator(&self) -> String {
        self.path.clone()
    }

    fn attach(locator: &str) -> Self {
        Sqlite {
            path: locator.to_owned(),
            owner: false,
        }
    }
}

impl Drop for Sqlite {
    fn drop(&mut self) {
        if self.owner {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", self.path));
            }
        }
    }
}

#[cfg(feature = "postgres")]
pub use pg::Postgres;

#[cfg(feature = "postgres")]
mod pg {
    use super::*;

    pub const URL_VAR: &str = "IDEMPOTENT_POSTGRES_URL";
    const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

    /// A schema of its own per test, reached through `search_path`, so tests run in parallel and a
    /// snapshot of "every table" sees only this test's tables.
    pub struct Postgres {
        base: String,
        schema: String,
        owner: bool,
    }

    pub fn base_url() -> String {
        std::env::var(URL_VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned())
    }

    pub fn establish(url: &str) -> diesel::PgConnection {
        diesel::PgConnection::establish(url).unwrap_or_else(|e| {
            panic!(
                "PostgreSQL is not reachable at {url}: {e}\n\
                 Start it with `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` \
                 (scripts/test does this), or point {URL_VAR} at a server. \
                 To run only the SQLite tests, build without `--features postgres`."
            )
        })
    }

    impl Postgres {
        fn url(&self) -> String {
            let separator = if self.base.contains('?') { '&' } else { '?' };
            format!(
                "{}{separator}options=-csearch_path%3D{}",
                self.base, self.schema
            )
        }
    }

    impl Backend for Postgres {
        type Conn = diesel::PgConnection;

        fn fresh() -> Self {
            let base = base_url();
            let schema = unique_name("idempotent_test");
            let mut admin = establish(&base);
            diesel::connection::SimpleConnection::batch_execute(
                &mut admin,
                &format!("CREATE SCHEMA {schema}"),
            )
            .expect("creating the test schema");
            let db = Postgres {
                base,
                schema,
                owner: true,
            };
            prepare(&mut db.connect());
            db
        }

        fn connect(&self) -> Self::Conn {
            establish(&self.url())
        }

        fn locator(&self) -> String {
            format!("{}#{}", self.base, self.schema)
        }

        fn attach(locator: &str) -> Self {
            let (base, schema) = locator.rsplit_once('#').expect("base#schema");
            Postgres {
                base: base.to_owned(),
                schema: schema.to_owned(),
                owner: false,
            }
        }
    }

    impl Drop for Postgres {
        fn drop(&mut self) {
            if self.owner
                && let Ok(mut admin) = diesel::PgConnection::establish(&self.base)
            {
                let _ = diesel::connection::SimpleConnection::batch_execute(
                    &mut admin,
                    &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema),
                );
            }
        }
    }
}

#[cfg(feature = "mysql")]
pub use my::Mysql;

#[cfg(feature = "mysql")]
mod my {
    use super::*;

    pub const URL_VAR: &str = "IDEMPOTENT_MYSQL_URL";
    const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306/test";

    /// A database of its own per test.
    pub struct Mysql {
        server: String,
        database: String,
        owner: bool,
    }

    pub fn base_url() -> String {
        std::env::var(URL_VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned())
    }

    /// The server part of a URL, without the database.
    fn server_of(url: &str) -> String {
        let after_scheme = url.find("://").map_or(0, |i| i + 3);
        match url[after_scheme..].find('/') {
            Some(slash) => url[..after_scheme + slash].to_owned(),
            None => url.to_owned(),
        }
    }

    pub fn establish(url: &str) -> diesel::MysqlConnection {
        diesel::MysqlConnection::establish(url).unwrap_or_else(|e| {
            panic!(
                "MariaDB/MySQL is not reachable at {url}: {e}\n\
                 Start it with `start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd` \
                 (scripts/test does this), or point {URL_VAR} at a server. \
                 To skip MySQL, build without `--features mysql`."
            )
        })
    }

    impl Mysql {
        fn url(&self) -> String {
            format!("{}/{}", self.server, self.database)
        }
    }

    impl Backend for Mysql {
        type Conn = diesel::MysqlConnection;

        fn fresh() -> Self {
            let base = base_url();
            let database = unique_name("idempotent_test");
            let mut admin = establish(&base);
            diesel::connection::SimpleConnection::batch_execute(
                &mut admin,
                &format!("CREATE DATABASE {database} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"),
            )
            .expect("creating the test database");
            let db = Mysql {
                server: server_of(&base),
                database,
                owner: true,
            };
            prepare(&mut db.connect());
            db
        }

        fn connect(&self) -> Self::Conn {
            establish(&self.url())
        }

        fn locator(&self) -> String {
            self.url()
        }

        fn attach(locator: &str) -> Self {
            let (server, database) = locator.rsplit_once('/').expect("server/database");
            Mysql {
                server: server.to_owned(),
                database: database.to_owned(),
                owner: false,
            }
        }
    }

    impl Drop for Mysql {
        fn drop(&mut self) {
            if self.owner
                && let Ok(mut admin) = diesel::MysqlConnection::establish(&base_url())
            {
                let _ = diesel::connection::SimpleConnection::batch_execute(
                    &mut admin,
                    &format!("DROP DATABASE IF EXISTS {}", self.database),
                );
            }
        }
    }
}
