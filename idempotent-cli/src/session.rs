//! What `verify` reads of the session besides the tables: a statement time limit so short that
//! jobs' statements are cancelled.

#[cfg(any(feature = "postgres", feature = "mysql"))]
use diesel::{QueryableByName, sql_types::Text};

/// Below this, `verify` warns of the session's statement time limit.
const SHORT_SECONDS: f64 = 1.0;

/// A session setting that cancels statements running longer than its value.
#[derive(Debug, Clone, PartialEq)]
pub struct StatementLimit {
    /// The setting's name.
    pub setting: &'static str,
    /// Its value, as the database shows it.
    pub shown: String,
    /// Its value in seconds; 0 for none.
    pub seconds: f64,
}

impl StatementLimit {
    /// The warning for a limit under a second; `None` for none, or a longer one.
    pub fn warning(&self) -> Option<String> {
        if self.seconds <= 0.0 || self.seconds >= SHORT_SECONDS {
            return None;
        }
        Some(format!(
            "warning: this session's {} is {}: any statement that runs longer is cancelled, a job's claim, its body's statements and its commit included, and the job fails. If the workers' sessions have it too (a role's or user's setting), raise it for them or unset it",
            self.setting, self.shown
        ))
    }
}

/// A row of [`SessionLimits::statement_limit`]'s statement: the setting as the database shows it.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Text)]
    shown: String,
}

/// PostgreSQL's text of a time setting (`0`, `1ms`, `200ms`, `5s`, `10min`, `1h`, `1d`, `500us`)
/// in seconds.
#[cfg(any(feature = "postgres", test))]
fn postgres_seconds(shown: &str) -> Option<f64> {
    let split = shown
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(shown.len());
    let (number, unit) = shown.split_at(split);
    let number: f64 = number.parse().ok()?;
    let per = match unit.trim() {
        "us" => 1e-6,
        "" | "ms" => 1e-3,
        "s" => 1.0,
        "min" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        _ => return None,
    };
    Some(number * per)
}

/// `read` in a transaction of its own begun with `begin` (MySQL: `START TRANSACTION`, which
/// MariaDB's `sql_mode = 'ORACLE'` does not read as a PL/SQL block, as it does Diesel's `BEGIN`),
/// committed, or rolled back when it failed.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "serve"))]
pub fn in_transaction<C, T, E>(
    conn: &mut C,
    begin: &str,
    read: impl FnOnce(&mut C) -> Result<T, E>,
) -> Result<T, E>
where
    C: diesel::Connection<TransactionManager = diesel::connection::AnsiTransactionManager>,
    E: From<diesel::result::Error>,
{
    use diesel::connection::{AnsiTransactionManager, TransactionManager};
    AnsiTransactionManager::begin_transaction_sql(conn, begin)?;
    match read(conn) {
        Ok(rows) => {
            AnsiTransactionManager::commit_transaction(conn)?;
            Ok(rows)
        }
        Err(failed) => {
            // A rollback that fails marks the connection broken; the read's error is the one.
            let _ = AnsiTransactionManager::rollback_transaction(conn);
            Err(failed)
        }
    }
}

/// The session's statement time limit, where the database has one.
pub trait SessionLimits {
    /// The limit; `None` where the database has none, or it cannot be read (MySQL's
    /// `max_execution_time` bounds only `SELECT`s: not read).
    fn statement_limit(&mut self) -> Option<StatementLimit>;
}

/// Reads the setting with `load`, in a transaction of its own begun with `begin`, committed: in a
/// MySQL session with `autocommit = 0` a bare read opens one that stays open, and `verify` would
/// then refuse to run inside it. MySQL's `begin` is `START TRANSACTION`: MariaDB's `sql_mode =
/// 'ORACLE'` reads Diesel's `BEGIN` as the start of a PL/SQL block.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn read<C>(
    conn: &mut C,
    begin: &str,
    setting: &'static str,
    seconds: fn(&str) -> Option<f64>,
    load: impl FnOnce(&mut C) -> diesel::QueryResult<Vec<Row>>,
) -> Option<StatementLimit>
where
    C: diesel::Connection<TransactionManager = diesel::connection::AnsiTransactionManager>,
{
    let rows = in_transaction(conn, begin, load).ok()?;
    let shown = rows.into_iter().next()?.shown;
    Some(StatementLimit {
        setting,
        seconds: seconds(&shown)?,
        shown,
    })
}

#[cfg(feature = "postgres")]
impl SessionLimits for diesel::PgConnection {
    fn statement_limit(&mut self) -> Option<StatementLimit> {
        use diesel::RunQueryDsl;
        use diesel::connection::SimpleConnection;
        // A limit of 1ms may cancel the read itself: lifted for this transaction, and the
        // session's value read as RESET gives it back (the role's, the URL's options).
        read(
            self,
            "BEGIN",
            "statement_timeout",
            postgres_seconds,
            |conn| {
                conn.batch_execute("SET LOCAL statement_timeout = 0")?;
                diesel::sql_query(
                    "SELECT reset_val || COALESCE(unit, '') AS shown FROM pg_settings \
                 WHERE name = 'statement_timeout'",
                )
                .load(conn)
            },
        )
    }
}

#[cfg(feature = "mysql")]
impl SessionLimits for diesel::MysqlConnection {
    fn statement_limit(&mut self) -> Option<StatementLimit> {
        use diesel::RunQueryDsl;
        // MariaDB's, in seconds; MySQL has no such variable, and the read fails.
        read(
            self,
            "START TRANSACTION",
            "max_statement_time",
            |shown| shown.parse().ok(),
            |conn| {
                diesel::sql_query(
                    "SELECT TRIM(TRAILING '.' FROM TRIM(TRAILING '0' FROM \
                     CAST(@@max_statement_time AS CHAR))) AS shown",
                )
                .load(conn)
            },
        )
    }
}

#[cfg(feature = "sqlite")]
impl SessionLimits for diesel::SqliteConnection {
    fn statement_limit(&mut self) -> Option<StatementLimit> {
        None
    }
}

/// What the session's role may not do to the runtime's tables, as the statement that grants it.
pub trait Privileges {
    /// The `GRANT` that lets this session's role delete from `table` (as the session finds it),
    /// when the role may not: `error` is the text of the failure of a statement that deleted
    /// from it, on this connection. `None` when the role may, or where it cannot be told.
    ///
    /// PostgreSQL is asked (`has_table_privilege`), whatever the language of its messages;
    /// MySQL's refusal is its error number 1142, which the runtime adds to the message.
    fn delete_refused(&mut self, table: &str, error: &str) -> Option<String>;
}

/// A row of [`Privileges::delete_refused`]'s statement.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(QueryableByName)]
struct GrantRow {
    /// The table, qualified and quoted as a `GRANT` names it.
    #[diesel(sql_type = Text)]
    object: String,
    /// The role (PostgreSQL) or `user@host` account (MySQL).
    #[diesel(sql_type = Text)]
    grantee: String,
}

#[cfg(feature = "postgres")]
impl Privileges for diesel::PgConnection {
    fn delete_refused(&mut self, table: &str, _error: &str) -> Option<String> {
        use diesel::RunQueryDsl;
        let rows: Vec<GrantRow> = in_transaction(self, "BEGIN", |conn| {
            diesel::sql_query(
                "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS object, \
                 quote_ident(current_user) AS grantee \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.oid = to_regclass($1) AND NOT has_table_privilege(c.oid, 'DELETE')",
            )
            .bind::<Text, _>(table)
            .load(conn)
        })
        .ok()?;
        let row = rows.into_iter().next()?;
        Some(format!("GRANT DELETE ON {} TO {}", row.object, row.grantee))
    }
}

#[cfg(feature = "mysql")]
impl Privileges for diesel::MysqlConnection {
    fn delete_refused(&mut self, table: &str, error: &str) -> Option<String> {
        use diesel::RunQueryDsl;
        // ER_TABLEACCESS_DENIED_ERROR: "DELETE command denied to user ... for table ...".
        if !error.contains("(MySQL error 1142") {
            return None;
        }
        let rows: Vec<GrantRow> = in_transaction(self, "START TRANSACTION", |conn| {
            diesel::sql_query(
                "SELECT COALESCE(DATABASE(), '') AS object, CURRENT_USER() AS grantee",
            )
            .load(conn)
        })
        .ok()?;
        let row = rows.into_iter().next()?;
        let (user, host) = row.grantee.rsplit_once('@')?;
        let quoted = |text: &str| text.replace('\'', "''");
        let object = match row.object.as_str() {
            "" => format!("`{table}`"),
            database => format!("`{}`.`{table}`", database.replace('`', "``")),
        };
        Some(format!(
            "GRANT DELETE ON {object} TO '{}'@'{}'",
            quoted(user),
            quoted(host)
        ))
    }
}

#[cfg(feature = "sqlite")]
impl Privileges for diesel::SqliteConnection {
    fn delete_refused(&mut self, _table: &str, _error: &str) -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_limit_under_a_second_is_warned_of() {
        let limit = |seconds| StatementLimit {
            setting: "statement_timeout",
            shown: "x".to_owned(),
            seconds,
        };
        assert!(limit(0.0).warning().is_none(), "no limit");
        assert!(limit(1.0).warning().is_none());
        assert!(limit(30.0).warning().is_none());
        assert!(
            limit(0.001)
                .warning()
                .is_some_and(|w| w.contains("statement_timeout is x"))
        );
    }

    #[test]
    fn postgres_time_settings_are_read_in_seconds() {
        for (shown, seconds) in [
            ("0", 0.0),
            ("1ms", 0.001),
            ("200ms", 0.2),
            ("5s", 5.0),
            ("10min", 600.0),
            ("1h", 3600.0),
            ("1d", 86400.0),
            ("500us", 0.0005),
        ] {
            assert_eq!(postgres_seconds(shown), Some(seconds), "{shown}");
        }
        assert_eq!(postgres_seconds("soon"), None);
    }
}
