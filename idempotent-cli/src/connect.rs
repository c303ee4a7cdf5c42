//! Which database a URL names, how to show it without its password, and connecting to it.

#[cfg(feature = "sqlite")]
use std::path::PathBuf;

use diesel::Connection;
#[cfg(feature = "sqlite")]
use diesel::connection::SimpleConnection;

use crate::failure::{Code, Failure};
use crate::secret::{Redacted, is_scheme, redact_conninfo, redact_url, scrub_text};
use crate::table::printable;

/// How long libpq may take to connect, unless the URL says otherwise: a CLI should not hang for
/// the operating system's TCP timeout on an address that does not answer.
#[cfg(feature = "postgres")]
const PG_CONNECT_TIMEOUT_SECONDS: u32 = 10;

/// The kind of database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `postgres://`, `postgresql://`, or a libpq key=value string.
    Postgres,
    /// `mysql://` or `mariadb://`.
    Mysql,
    /// `sqlite://`, `sqlite:`, a `file:` URI, or a path.
    Sqlite,
}

impl Kind {
    /// The database's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Postgres => "PostgreSQL",
            Kind::Mysql => "MySQL/MariaDB",
            Kind::Sqlite => "SQLite",
        }
    }

    /// The cargo feature that builds this kind in.
    pub fn feature(self) -> &'static str {
        match self {
            Kind::Postgres => "postgres",
            Kind::Mysql => "mysql",
            Kind::Sqlite => "sqlite",
        }
    }

    /// Whether this build of the CLI can connect to this kind.
    pub fn built_in(self) -> bool {
        match self {
            Kind::Postgres => cfg!(feature = "postgres"),
            Kind::Mysql => cfg!(feature = "mysql"),
            Kind::Sqlite => cfg!(feature = "sqlite"),
        }
    }

    /// How URLs of this kind are written.
    fn forms(self) -> &'static str {
        match self {
            Kind::Postgres => {
                "postgres:// and postgresql:// URLs and libpq key=value strings (host=... dbname=...) for PostgreSQL"
            }
            Kind::Mysql => "mysql:// and mariadb:// URLs for MySQL and MariaDB",
            Kind::Sqlite => "sqlite:// URLs, file: URIs and file paths for SQLite",
        }
    }
}

/// What this build reads, and what it was built without: for messages and `--help`.
pub fn known_forms() -> String {
    let kinds = [Kind::Postgres, Kind::Mysql, Kind::Sqlite];
    let known: Vec<&str> = kinds
        .iter()
        .filter(|k| k.built_in())
        .map(|k| k.forms())
        .collect();
    let missing: Vec<&str> = kinds
        .iter()
        .filter(|k| !k.built_in())
        .map(|k| k.name())
        .collect();
    let mut text = if known.is_empty() {
        "no database at all".to_owned()
    } else {
        known.join("; ")
    };
    if !missing.is_empty() {
        text.push_str(&format!(
            " (this build has no {} support)",
            missing.join(" and no ")
        ));
    }
    text
}

/// A database URL, with what it takes to talk about it without leaking its password.
#[derive(Debug, Clone)]
pub struct Target {
    /// The URL as given.
    url: String,
    /// What the driver gets: the password encoded, `mariadb://` as `mysql://`, a timeout added.
    driver: String,
    /// Which database it names.
    pub kind: Kind,
    /// The URL with every secret replaced by `***`.
    pub shown: String,
    /// Texts that must never be printed: the password, as written, decoded and encoded.
    secrets: Vec<String>,
}

impl Target {
    /// Reads a database URL. An unknown scheme, a connection string that does not parse and a
    /// kind this build lacks are refused here, with messages that quote no secret.
    pub fn parse(url: &str) -> Result<Self, Failure> {
        let url = url.trim();
        if url.is_empty() {
            return Err(Failure::new(
                Code::Usage,
                "the database URL is empty: pass --database-url (-D) or set DATABASE_URL",
            ));
        }
        let (kind, redacted) = classify(url)?;
        Ok(Self {
            url: url.to_owned(),
            driver: driver_text(kind, redacted.driver),
            kind,
            shown: scrub_text(&redacted.shown),
            secrets: redacted.secrets,
        })
    }

    /// Whether the URL names an in-memory SQLite database (`:memory:`, `file::memory:`,
    /// `mode=memory`): one that is gone when the command's connection closes.
    pub fn in_memory(&self) -> bool {
        #[cfg(feature = "sqlite")]
        if self.kind == Kind::Sqlite {
            return sqlite_file(&self.url) == SqliteFile::Memory;
        }
        false
    }

    /// `text` with every secret of the URL replaced by `***`: for database errors, which may
    /// quote parts of the URL.
    pub fn scrub(&self, text: &str) -> String {
        let mut text = text.replace(&self.driver, &self.shown);
        text = text.replace(&self.url, &self.shown);
        for secret in &self.secrets {
            text = text.replace(secret.as_str(), "***");
        }
        scrub_text(&text)
    }

    /// A connection failure, saying where and why.
    fn cannot_connect(&self, why: impl std::fmt::Display) -> Failure {
        // Drivers' messages span lines (libpq's hint): one line reads better after `error:`. The
        // secrets are hidden first: collapsing a secret's own runs of whitespace (two spaces, a
        // tab) first made it no longer match (`pwd=*** secret`); and again after, for a URL a
        // driver wrapped across lines.
        let why = self
            .scrub(&why.to_string())
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let why = printable(&self.scrub(&why));
        Failure::new(
            Code::Connect,
            format!("cannot connect to the database at {}: {why}", self.shown),
        )
    }

    /// The failure for a kind this build lacks, naming the feature that builds it in.
    fn not_built_in(&self) -> Failure {
        let kind = self.kind;
        Failure::new(
            Code::Connect,
            format!(
                "cannot connect to the database at {}: this idempotent-jobs was built without {} support (cargo feature `{}`); it reads {}. Install one that has it: cargo install idempotent-jobs-cli --locked --features {}",
                self.shown,
                kind.name(),
                kind.feature(),
                known_forms(),
                kind.feature()
            ),
        )
    }

    /// Opens a connection of the URL's kind.
    pub fn connect(&self) -> Result<Conn, Failure> {
        if !self.kind.built_in() {
            return Err(self.not_built_in());
        }
        match self.kind {
            #[cfg(feature = "postgres")]
            // Diesel's statement cache off: the URL may be a transaction pooler's (PgBouncer),
            // which sends each transaction to whichever server connection is free, where a
            // statement prepared by name in an earlier one does not exist ("prepared statement
            // \"__diesel_stmt_1\" does not exist" from a prune's second batch). Uncached,
            // each statement goes with its values in one unnamed message (docs/clusters.md).
            Kind::Postgres => diesel::PgConnection::establish(&self.driver)
                .map(|mut conn| {
                    diesel::connection::Connection::set_prepared_statement_cache_size(
                        &mut conn,
                        diesel::connection::CacheSize::Disabled,
                    );
                    Conn::Postgres(conn)
                })
                .map_err(|e| self.cannot_connect(e)),
            #[cfg(feature = "mysql")]
            Kind::Mysql => diesel::MysqlConnection::establish(&self.driver)
                .map(Conn::Mysql)
                .map_err(|e| self.cannot_connect(e)),
            #[cfg(feature = "sqlite")]
            Kind::Sqlite => self.connect_sqlite().map(Conn::Sqlite),
            #[allow(unreachable_patterns)]
            kind => Err(self.cannot_connect(format_args!("built without {} support", kind.name()))),
        }
    }

    /// Opens a SQLite file, which must exist.
    #[cfg(feature = "sqlite")]
    fn connect_sqlite(&self) -> Result<diesel::SqliteConnection, Failure> {
        let url = match sqlite_file(&self.driver) {
            SqliteFile::Memory => self.driver.clone(),
            SqliteFile::Path { path, url } => {
                match std::fs::metadata(&path) {
                    Ok(meta) if meta.is_file() => {}
                    Ok(_) => {
                        return Err(
                            self.cannot_connect(format_args!("{} is not a file", path.display()))
                        );
                    }
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                        return Err(self.cannot_connect(format_args!(
                            "the SQLite database file {} does not exist (SQLite would create an empty one; nothing was created). Check the path, or give a postgres:// or mysql:// URL",
                            path.display()
                        )));
                    }
                    Err(error) => {
                        return Err(
                            self.cannot_connect(format_args!("{}: {error}", path.display()))
                        );
                    }
                }
                url
            }
        };
        let mut conn =
            diesel::SqliteConnection::establish(&url).map_err(|e| self.cannot_connect(e))?;
        // Wait for a worker's write instead of failing at once; reading the schema also finds a
        // file that is not a SQLite database.
        conn.batch_execute("PRAGMA busy_timeout = 5000; SELECT count(*) FROM sqlite_master;")
            .map_err(|e| self.cannot_connect(e))?;
        Ok(conn)
    }
}

/// Which kind a URL names, and its secrets; an unknown scheme or an unreadable connection
/// string is refused (exit code 3), quoting it only with its secrets hidden.
fn classify(url: &str) -> Result<(Kind, Redacted), Failure> {
    let lower = url.to_ascii_lowercase();
    if let Some(scheme_end) = lower.find("://")
        && is_scheme(&lower[..scheme_end])
    {
        let kind = match &lower[..scheme_end] {
            "postgres" | "postgresql" => Kind::Postgres,
            "mysql" | "mariadb" => Kind::Mysql,
            "sqlite" | "file" => Kind::Sqlite,
            scheme => {
                return Err(Failure::new(
                    Code::Connect,
                    format!(
                        "cannot connect to the database at {}: unknown scheme `{}://`. This idempotent-jobs reads {}",
                        scrub_text(&redact_url(url).shown),
                        printable(scheme),
                        known_forms()
                    ),
                ));
            }
        };
        return Ok((kind, redact_url(url)));
    }
    if is_conninfo(url) {
        return redact_conninfo(url)
            .map(|redacted| (Kind::Postgres, redacted))
            .map_err(|why| {
                Failure::new(
                    Code::Connect,
                    format!(
                        "cannot connect: the libpq connection string (host=... dbname=...) does not parse: {}",
                        why.0
                    ),
                )
            });
    }
    // A path shown as typed text is: a `name=value` in it whose name no driver knows (`pw=x`, a
    // misspelt keyword) has its value hidden, here and in every error that quotes the path.
    Ok((Kind::Sqlite, crate::secret::redact_typed(url)))
}

/// Whether `text` is a libpq connection string: it starts with a libpq keyword and `=`, or it is
/// all `name=value` pairs, one of them a libpq keyword's (a misspelt first keyword,
/// `pasword=x host=db`, is one: libpq refuses the name it does not know, and its value is hidden
/// as every unknown name's is).
fn is_conninfo(text: &str) -> bool {
    let is_keyword = |name: &str| crate::secret::LIBPQ_KEYWORDS.contains(&name.trim());
    if text
        .trim_start()
        .split_once('=')
        .is_some_and(|(first, _)| is_keyword(first))
    {
        return true;
    }
    crate::secret::conninfo_pairs(text).is_ok_and(|pairs| {
        pairs.iter().all(|pair| !pair.keyword.is_empty())
            && pairs.iter().any(|pair| is_keyword(pair.keyword))
    })
}

/// What the driver of `kind` is given: `mariadb://` spelled `mysql://` (the MySQL client reads
/// only that), a PostgreSQL connect timeout added.
fn driver_text(kind: Kind, driver: String) -> String {
    match kind {
        Kind::Mysql => match driver.find("://") {
            Some(end) => format!("mysql{}", &driver[end..]),
            None => driver,
        },
        #[cfg(feature = "postgres")]
        Kind::Postgres => with_pg_connect_timeout(&driver),
        _ => driver,
    }
}

/// An open connection of one of the three kinds.
pub enum Conn {
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(diesel::PgConnection),
    /// MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    Mysql(diesel::MysqlConnection),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(diesel::SqliteConnection),
}

/// Where a SQLite URL points.
#[cfg(feature = "sqlite")]
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
#[cfg(feature = "sqlite")]
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
        path: PathBuf::from(crate::secret::percent_decode(path)),
        url: format!("file:{rest}"),
    }
}

/// A plain SQLite path (or `:memory:`).
#[cfg(feature = "sqlite")]
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

/// The URL or connection string with `connect_timeout` added, unless it has one.
#[cfg(feature = "postgres")]
fn with_pg_connect_timeout(url: &str) -> String {
    if !url.contains("://") {
        let has_timeout = crate::secret::conninfo_pairs(url)
            .is_ok_and(|pairs| pairs.iter().any(|p| p.keyword == "connect_timeout"));
        return if has_timeout {
            url.to_owned()
        } else {
            format!("{url} connect_timeout={PG_CONNECT_TIMEOUT_SECONDS}")
        };
    }
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
        assert_eq!(kind("MariaDB://h/db"), Some(Kind::Mysql));
        assert_eq!(kind("host=db dbname=app"), Some(Kind::Postgres));
        assert_eq!(kind(" dbname = app"), Some(Kind::Postgres));
        assert_eq!(kind("file:app.db?mode=ro"), Some(Kind::Sqlite));
        assert_eq!(kind("data=1.db"), Some(Kind::Sqlite));
        assert_eq!(kind("  "), None);
        assert_eq!(kind("postgress://h/db"), None);
        assert_eq!(kind("host=db password='x"), None);
        let error = Target::parse("postgress://u:pw12345@h/db").expect_err("unknown");
        assert_eq!(error.code, Code::Connect);
        assert!(
            error.message.contains("postgress://u:***@h/db") && !error.message.contains("pw12345"),
            "{error}"
        );
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

    /// A valid URL with `@` in its query or path reaches the host and database it names (it
    /// connected to another database, or opened another file: a prune or a forget there would
    /// change the wrong one).
    #[test]
    fn an_at_sign_in_the_query_or_path_keeps_the_database() {
        for url in [
            "postgres://postgres:pw@127.0.0.1/keys_explore?application_name=ops/x@127.0.0.1",
            "mysql://root:pw@127.0.0.1/db?ssl_ca=/etc/x@y",
        ] {
            let target = Target::parse(url).expect("a URL");
            assert!(
                target.driver.starts_with(url),
                "{url}: the driver gets {}",
                target.driver
            );
        }
        #[cfg(feature = "sqlite")]
        for url in [
            "file:///work/scratch/u@h/app.db",
            "sqlite:///work/scratch/u@h/app.db",
        ] {
            let target = Target::parse(url).expect("a URL");
            let SqliteFile::Path { path, .. } = sqlite_file(&target.driver) else {
                panic!("{url}: not a file");
            };
            assert_eq!(path, PathBuf::from("/work/scratch/u@h/app.db"), "{url}");
        }
        #[cfg(feature = "sqlite")]
        {
            let target = Target::parse("sqlite://data/u@h/app.db").expect("a URL");
            let SqliteFile::Path { path, .. } = sqlite_file(&target.driver) else {
                panic!("not a file");
            };
            assert_eq!(path, PathBuf::from("data/u@h/app.db"));
        }
    }

    /// A key=value string whose first keyword is misspelt is a connection string, not a SQLite
    /// path: its values are hidden (it printed "the SQLite database file pasword=S3cretPW ...
    /// does not exist"). A text read as a SQLite path is shown with the values of names no driver
    /// knows hidden.
    #[test]
    fn a_misspelt_first_keyword_is_still_a_connection_string() {
        let target = Target::parse("pasword=S3cretPW host=127.0.0.1 dbname=keys_explore")
            .expect("a connection string");
        assert_eq!(target.kind, Kind::Postgres);
        assert_eq!(
            target.shown,
            "pasword=*** host=127.0.0.1 dbname=keys_explore"
        );
        assert!(!target.scrub("no S3cretPW here").contains("S3cretPW"));
        let target = Target::parse("pw=secret").expect("a path");
        assert_eq!(target.kind, Kind::Sqlite);
        assert_eq!(target.shown, "pw=***");
        assert!(!target.scrub("file sqlite:pw=secret").contains("secret"));
    }

    #[test]
    fn a_build_without_a_backend_says_so() {
        for (url, kind) in [
            ("postgres://u:pw12345@h/db", Kind::Postgres),
            ("mysql://h/db", Kind::Mysql),
            ("app.db", Kind::Sqlite),
        ] {
            let target = Target::parse(url).expect("a URL");
            assert_eq!(target.kind, kind);
            if kind.built_in() {
                continue;
            }
            let Err(error) = target.connect() else {
                panic!("{url} connected without {} support", kind.name());
            };
            assert_eq!(error.code, Code::Connect);
            for part in [kind.name(), &format!("--features {}", kind.feature())] {
                assert!(error.message.contains(part), "{part}: {error}");
            }
            assert!(!error.message.contains("pw12345"), "{error}");
            assert!(
                known_forms().contains(&format!("no {}", kind.name()))
                    || known_forms().contains(&format!("no {} support", kind.name()))
            );
        }
    }

    #[test]
    fn drivers_get_mysql_urls_and_encoded_passwords() {
        let target = Target::parse("mariadb://u:a/b@h/db").expect("a URL");
        assert_eq!(target.driver, "mysql://u:a%2Fb@h/db");
        assert_eq!(target.shown, "mariadb://u:***@h/db");
    }

    #[cfg(feature = "sqlite")]
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

    #[cfg(feature = "postgres")]
    #[test]
    fn pg_timeout_is_added_once() {
        assert_eq!(
            with_pg_connect_timeout("host=h dbname=x"),
            "host=h dbname=x connect_timeout=10"
        );
        assert_eq!(
            with_pg_connect_timeout("host=h connect_timeout = 3"),
            "host=h connect_timeout = 3"
        );
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
