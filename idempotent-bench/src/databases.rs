//! The benchmark's own databases: a SQLite file, a PostgreSQL schema or a MariaDB database per
//! measurement, named after the process, dropped when done (the big ones as soon as measured).

use std::path::PathBuf;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;

enum Place {
    Sqlite {
        dir: PathBuf,
        wal: bool,
    },
    Postgres {
        admin: PgConnection,
        base: String,
    },
    Mysql {
        admin: MysqlConnection,
        server: String,
    },
}

pub struct Databases {
    place: Place,
    prefix: String,
    created: Vec<String>,
}

impl Databases {
    pub fn sqlite(dir: PathBuf, wal: bool) -> Self {
        Self::new(Place::Sqlite { dir, wal })
    }

    pub fn postgres(base: &str) -> Self {
        let admin = PgConnection::establish(base).unwrap_or_else(|e| {
            panic!("PostgreSQL at {base}: {e}; start it (scripts/test does) or set IDEMPOTENT_POSTGRES_URL")
        });
        Self::new(Place::Postgres {
            admin,
            base: base.to_owned(),
        })
    }

    pub fn mysql(base: &str) -> Self {
        let admin = MysqlConnection::establish(base).unwrap_or_else(|e| {
            panic!(
                "MariaDB at {base}: {e}; start it (scripts/test does) or set IDEMPOTENT_MYSQL_URL"
            )
        });
        let server = base.rsplit_once('/').map_or(base, |(s, _)| s).to_owned();
        Self::new(Place::Mysql { admin, server })
    }

    fn new(place: Place) -> Self {
        Self {
            place,
            prefix: format!("idempotent_bench_{}", std::process::id()),
            created: Vec::new(),
        }
    }

    /// The name of the database `part`.
    pub fn name(&self, part: &str) -> String {
        match &self.place {
            Place::Sqlite { wal: true, .. } => format!("{}_{part}_wal", self.prefix),
            _ => format!("{}_{part}", self.prefix),
        }
    }

    /// Creates the database `part` (empty) and returns its URL.
    pub fn create(&mut self, part: &str) -> String {
        let name = self.name(part);
        self.drop_database(&name);
        let url = match &mut self.place {
            Place::Sqlite { dir, wal } => {
                let url = dir
                    .join(format!("{name}.db"))
                    .to_string_lossy()
                    .into_owned();
                if *wal {
                    SqliteConnection::establish(&url)
                        .expect("SQLite")
                        .batch_execute("PRAGMA journal_mode = WAL")
                        .expect("WAL");
                }
                url
            }
            Place::Postgres { admin, base } => {
                admin
                    .batch_execute(&format!("CREATE SCHEMA {name}"))
                    .expect("a schema");
                let separator = if base.contains('?') { '&' } else { '?' };
                format!("{base}{separator}options=-csearch_path%3D{name}")
            }
            Place::Mysql { admin, server } => {
                admin
                    .batch_execute(&format!("CREATE DATABASE {name}"))
                    .expect("a database");
                format!("{server}/{name}")
            }
        };
        self.created.push(name);
        url
    }

    /// Drops the database `part`, freeing its disk at once.
    pub fn drop(&mut self, part: &str) {
        let name = self.name(part);
        self.drop_database(&name);
        self.created.retain(|n| *n != name);
    }

    fn drop_database(&mut self, name: &str) {
        match &mut self.place {
            Place::Sqlite { dir, .. } => {
                for suffix in ["", "-wal", "-shm", "-journal"] {
                    let _ = std::fs::remove_file(dir.join(format!("{name}.db{suffix}")));
                }
            }
            Place::Postgres { admin, .. } => {
                let _ = admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"));
            }
            Place::Mysql { admin, .. } => {
                let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"));
            }
        }
    }
}

impl Drop for Databases {
    fn drop(&mut self) {
        for name in std::mem::take(&mut self.created) {
            self.drop_database(&name);
        }
    }
}
