//! Which database a URL names, how to show it without its password, and connecting to it.

use std::path::PathBuf;

use diesel::connection::SimpleConnection;
use diesel::{Connection, MysqlConnection, PgConnection, SqliteConnection};

use crate::failure::{Code, Failure};
use crate::table::printable;

/// How long libpq may take to connect, unless the URL says otherwise: a CLI should not hang for
/// the operating system's TCP timeout on an address that does not answer.
const PG_CONNECT_TIMEOUT_SECONDS: u32 = 10;

/// The kind of database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://` (MySQL and MariaDB).
    Mysql,
    /// Anything else: a path, `sqlite://path` or a `file:` URI.
    Sqlite,
}

/// A database URL, with what it takes to talk about it without leaking its password.
#[derive(Debug, Clone)]
pub struct Target {
    /// The URL as given.
    url: String,
    /// Which database it names.
    pub kind: Kind,
    /// The URL with its password (and any `password=` parameter) replaced by `***`.
    pub shown: String,
    /// Texts that must never be printed: the password, as written and percent-decoded.
    secrets: Vec<String>,
}

impl Target {
    /// Reads a database URL.
    pub fn parse(url: &str) -> Result<Self, Failure> {
        let url = url.trim();
        if url.is_empty() {
            return Err(Failure::new(
                Code::Usage,
                "the database URL is empty: pass --database-url or set DATABASE_URL",
            ));
        }
        let lower = url.to_ascii_lowercase();
        let kind = if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            Kind::Postgres
        } else if lower.starts_with("mysql://") {
            Kind::Mysql
        } else {
            Kind::Sqlite
        };
        let (shown, secrets) = match kind {
            Kind::Sqlite => (url.to_owned(), Vec::new()),
            Kind::Postgres | Kind::Mysql => redact(url),
        };
        Ok(Self {
            url: url.to_owned(),
            kind,
            shown,
            secrets,
        })
    }

    /// `text` with every secret of the URL replaced by `***`: for database errors, which may
    /// quote parts of the URL.
    pub fn scrub(&self, text: &str) -> String {
        let mut text = text.replace(&self.url, &self.shown);
        for secret in &self.secrets {
            text = text.replace(secret.as_str(), "***");
        }
        text
    }

    /// A connection failure, saying where and why.
    fn cannot_connect(&self, why: impl std::fmt::Display) -> Failure {
        // Drivers' messages span lines (libpq's hint): one line reads better after `error:`.
        let why = why
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let why = printable(&self.scrub(&why));
        Failure::new(
            Code::Connect,
            format!("cannot connect to the database at {}: {why}", self.shown),
        )
    }

    /// Opens a connection of the URL's kind.
    pub fn connect(&self) -> Result<Conn, Failure> {
        match self.kind {
            Kind::Postgres => {
                let url = with_pg_connect_timeout(&self.url);
                PgConnection::establish(&url)
                    .map(Conn::Postgres)
                    .map_err(|e| self.cannot_connect(e))
            }
            Kind::Mysql => MysqlConnection::establish(&self.url)
                .map(Conn::Mysql)
                .map_err(|e| self.cannot_connect(e)),
            Kind::Sqlite => {
                let url = match sqlite_file(&self.url) {
                    SqliteFile::Memory => self.url.clone(),
                    SqliteFile::Path { path, url } => {
                        match std::fs::metadata(&path) {
                            Ok(meta) if meta.is_file() => {}
                            Ok(_) => {
                                return Err(self.cannot_connect(format_args!(
                                    "{} is not a file",
                                    path.display()
                                )));
                            }
                            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                                return Err(self.cannot_connect(format_args!(
                                    "the SQLite database file {} does not exist (SQLite would create an empty one; nothing was created). Check the path, or give a postgres:// or mysql:// URL",
                                    path.display()
                                )));
                            }
                            Err(error) => {
                                return Err(self
                                    .cannot_connect(format_args!("{}: {error}", path.display())));
                            }
                        }
                        url
                    }
                };
                let mut conn =
                    SqliteConnection::establish(&url).map_err(|e| self.cannot_connect(e))?;
                // Wait for a worker's write instead of failing at once; reading the schema also
                // finds a file that is not a SQLite database.
                conn.batch_execute(
                    "PRAGMA busy_timeout = 5000; SELECT count(*) FROM sqlite_master;",
                )
                .map_err(|e| self.cannot_connect(e))?;
                Ok(Conn::Sqlite(conn))
            }
        }
    }
}

/// An open connection of one of the three kinds.
pub enum Conn {
    /// PostgreSQL.
    Postgres(PgConnection),
    /// MySQL or MariaDB.
    Mysql(MysqlConnection),
    /// SQLite.
    Sqlite(SqliteConnection),
}

/// Where a SQLite URL points.
#[derive(Debug, PartialEq, Eq)]
enum SqliteFile {
    /// An in-memory database: nothing to check.
    Memory,
    /// A file: its path, and the URL to give Diesel.
    Path {
        /// The file.
        path: PathBuf,
        /// The URL to give Diesel.
        url: String,
    },
}

/// Finds the file a SQLite URL names: a plain path, `sqlite://path` (`sqlite:///abs/path`),
/// `sqlite:path`, or a `file:` URI (`file:data.db?mode=ro`, `file:///abs/path`).
fn sqlite_file(url: &str) -> SqliteFile {
    // Diesel reads `sqlite://x` as the URI `file:x`.
    let rest = if let Some(rest) = url.strip_prefix("sqlite://") {
        rest
    } else if let Some(rest) = url.strip_prefix("file:") {
        rest
    } else if let Some(rest) = url.strip_prefix("sqlite:") {
        return plain(rest);
    } else {
        return plain(url);
    };
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, query),
        None => (rest, ""),
    };
    let path = path.split('#').next().unwrap_or_default();
    if query
        .split('&')
        .any(|pair| pair.eq_ignore_ascii_case("mode=memory"))
        || path == ":memory:"
        || path.is_empty()
    {
        return SqliteFile::Memory;
    }
    // `file://localhost/abs` and `file:///abs`: an authority, then the absolute path.
    let path = match path.strip_prefix("//") {
        Some(after) => match after.find('/') {
            Some(slash) => &after[slash..],
            None => after,
        },
        None => path,
    };
    SqliteFile::Path {
        path: PathBuf::from(percent_decode(path)),
        url: format!("file:{rest}"),
    }
}

/// A plain SQLite path (or `:memory:`).
fn plain(path: &str) -> SqliteFile {
    if path == ":memory:" || path.is_empty() {
        SqliteFile::Memory
    } else {
        SqliteFile::Path {
            path: PathBuf::from(path),
            url: path.to_owned(),
        }
    }
}

/// The URL as it may be shown, and the secrets it holds.
fn redact(url: &str) -> (String, Vec<String>) {
    let mut secrets = Vec::new();
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return (url.to_owned(), secrets);
    };
    let (scheme, rest) = url.split_at(scheme_end);
    // The user info ends at the last `@`, so that a password holding an unescaped `@`, `/` or `?`
    // is still hidden whole (an `@` in the query hides more than the password: safe).
    let mut shown = match rest.rfind('@') {
        Some(at) => {
            let (userinfo, host_and_rest) = (&rest[..at], &rest[at..]);
            match userinfo.split_once(':') {
                Some((user, password)) => {
                    if !password.is_empty() {
                        secrets.push(password.to_owned());
                        secrets.push(percent_decode(password));
                    }
                    format!("{scheme}{user}:***{host_and_rest}")
                }
                None => url.to_owned(),
            }
        }
        None => url.to_owned(),
    };
    // A password given as a query parameter (`?password=...`, libpq and MySQL both read it).
    if let Some(query_start) = shown.find('?') {
        let (base, query) = shown.split_at(query_start + 1);
        let query = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, value)) if name.eq_ignore_ascii_case("password") => {
                    if !value.is_empty() {
                        secrets.push(value.to_owned());
                        secrets.push(percent_decode(value));
                    }
                    format!("{name}=***")
                }
                _ => pair.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("&");
        shown = format!("{base}{query}");
    }
    // Very short secrets would blank out ordinary words of an error message; they are not
    // quoted by the drivers' messages anyway.
    secrets.retain(|secret| secret.len() >= 4);
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    secrets.dedup();
    (shown, secrets)
}

/// `%XX` sequences decoded (as UTF-8, lossily); anything else kept.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(byte) = text
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The URL with `connect_timeout` added, unless it has one.
fn with_pg_connect_timeout(url: &str) -> String {
    let has_timeout = url.split_once('?').is_some_and(|(_, query)| {
        query
            .split('&')
            .any(|pair| pair.starts_with("connect_timeout="))
    });
    if has_timeout {
        url.to_owned()
    } else {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}connect_timeout={PG_CONNECT_TIMEOUT_SECONDS}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        let kind = |url: &str| Target::parse(url).map(|t| t.kind).ok();
        assert_eq!(kind("postgres://h/db"), Some(Kind::Postgres));
        assert_eq!(kind("PostgreSQL://h/db"), Some(Kind::Postgres));
        assert_eq!(kind("mysql://h/db"), Some(Kind::Mysql));
        assert_eq!(kind("/var/lib/app.db"), Some(Kind::Sqlite));
        assert_eq!(kind("sqlite://app.db"), Some(Kind::Sqlite));
        assert_eq!(kind("  "), None);
    }

    #[test]
    fn passwords_are_never_shown() {
        for (url, shown) in [
            (
                "postgres://app:s3cret@db:5432/main",
                "postgres://app:***@db:5432/main",
            ),
            (
                "postgres://app:p@ss/w0rd@db/main?sslmode=require",
                "postgres://app:***@db/main?sslmode=require",
            ),
            (
                "mysql://root@127.0.0.1:3306/test",
                "mysql://root@127.0.0.1:3306/test",
            ),
            (
                "postgres://db/main?user=app&password=hunter22",
                "postgres://db/main?user=app&password=***",
            ),
            ("mysql://app:%40secret@db", "mysql://app:***@db"),
        ] {
            let target = Target::parse(url).expect("a URL");
            assert_eq!(target.shown, shown);
            assert!(!target.scrub(url).contains("ecret"), "{url}");
        }
        let target = Target::parse("mysql://app:%40secret@db").expect("a URL");
        assert_eq!(target.scrub("bad password '@secret'"), "bad password '***'");
    }

    #[test]
    fn sqlite_files() {
        let path = |p: &str| SqliteFile::Path {
            path: PathBuf::from(p),
            url: p.to_owned(),
        };
        assert_eq!(sqlite_file("app.db"), path("app.db"));
        assert_eq!(sqlite_file("sqlite:app.db"), path("app.db"));
        assert_eq!(sqlite_file(":memory:"), SqliteFile::Memory);
        assert_eq!(
            sqlite_file("file::memory:?cache=shared"),
            SqliteFile::Memory
        );
        assert_eq!(sqlite_file("file:x?mode=memory"), SqliteFile::Memory);
        assert_eq!(
            sqlite_file("sqlite:///var/lib/app.db"),
            SqliteFile::Path {
                path: PathBuf::from("/var/lib/app.db"),
                url: "file:/var/lib/app.db".to_owned()
            }
        );
        assert_eq!(
            sqlite_file("file:my%20app.db?mode=ro"),
            SqliteFile::Path {
                path: PathBuf::from("my app.db"),
                url: "file:my%20app.db?mode=ro".to_owned()
            }
        );
    }

    #[test]
    fn pg_timeout_is_added_once() {
        assert_eq!(
            with_pg_connect_timeout("postgres://h/db"),
            "postgres://h/db?connect_timeout=10"
        );
        assert_eq!(
            with_pg_connect_timeout("postgres://h/db?options=-csearch_path%3Dx"),
            "postgres://h/db?options=-csearch_path%3Dx&connect_timeout=10"
        );
        assert_eq!(
            with_pg_connect_timeout("postgres://h/db?connect_timeout=3"),
            "postgres://h/db?connect_timeout=3"
        );
    }
}
