//! The one thing the runtime's API does not give the dashboard: keys done (and outbox messages
//! delivered) per hour over the last week, for the charts.
//!
//! Each backend has its own fixed statement, grouping `done_at` (`delivered_at`) by whole hours
//! ago by the database's clock. Nothing from the page reaches them: they take no parameters.

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Text};

/// Hours in the charts' longest span: a week.
pub const HOURS: i64 = 7 * 24;

/// How many rows of one series fell in one hour.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct HourRow {
    /// The job (keys) or the topic (outbox).
    #[diesel(sql_type = Text)]
    pub series: String,
    /// Whole hours before now: 0 is the last hour.
    #[diesel(sql_type = BigInt)]
    pub hours_ago: i64,
    /// How many.
    #[diesel(sql_type = BigInt)]
    pub n: i64,
}

/// Why a chart's statement failed: its error, read as the runtime reads its own (in terms that say
/// what it is, whatever the language of the server's messages), and whether it says the database
/// was busy (a lock wait or statement time limit that ran out, a deadlock, a serialization
/// failure).
#[derive(Debug)]
pub struct Failed {
    /// The error.
    pub error: diesel::result::Error,
    /// Whether it says the database was busy.
    pub busy: bool,
}

impl Failed {
    /// `error`, which a statement on `conn` has just returned, read before anything else runs on
    /// `conn` (MySQL's error number is read from the session's diagnostics area).
    fn read<C: idempotent_runtime::JobStore>(conn: &mut C, error: diesel::result::Error) -> Self {
        let (error, busy) = idempotent_runtime::read_error(conn, error);
        Self { error, busy }
    }
}

/// Beginning or ending the chart's transaction failed: not read as busy.
impl From<diesel::result::Error> for Failed {
    fn from(error: diesel::result::Error) -> Self {
        Self { error, busy: false }
    }
}

/// The hourly counts of a connection's backend.
pub trait Hourly {
    /// Keys done per job and hour, over the last week.
    fn keys_per_hour(&mut self) -> Result<Vec<HourRow>, Failed>;
    /// Outbox messages delivered per topic and hour, over the last week.
    fn delivered_per_hour(&mut self) -> Result<Vec<HourRow>, Failed>;
    /// Whether the connection still answers (after a failed statement: lost, or not).
    fn alive(&mut self) -> bool;
}

/// Implements [`Hourly`] for a connection type with the text that begins a transaction there
/// (MySQL: `START TRANSACTION`, which MariaDB's `sql_mode = 'ORACLE'` does not read as a PL/SQL
/// block, as it does `BEGIN`) and its two statements.
macro_rules! hourly {
    ($conn:ty, $begin:expr, $keys:expr, $delivered:expr) => {
        impl Hourly for $conn {
            // Each in a transaction of its own, committed: in a session with `autocommit = 0`
            // a bare read opens one that stays open, and the pooled connection would go back
            // holding it. A failed statement is read before its transaction rolls back.
            fn keys_per_hour(&mut self) -> Result<Vec<HourRow>, Failed> {
                use diesel::RunQueryDsl;
                crate::session::in_transaction(self, $begin, |conn| {
                    diesel::sql_query($keys)
                        .load(conn)
                        .map_err(|e| Failed::read(conn, e))
                })
            }

            fn delivered_per_hour(&mut self) -> Result<Vec<HourRow>, Failed> {
                use diesel::RunQueryDsl;
                crate::session::in_transaction(self, $begin, |conn| {
                    diesel::sql_query($delivered)
                        .load(conn)
                        .map_err(|e| Failed::read(conn, e))
                })
            }

            fn alive(&mut self) -> bool {
                diesel::connection::SimpleConnection::batch_execute(self, "SELECT 1").is_ok()
            }
        }
    };
}

#[cfg(feature = "postgres")]
hourly!(
    diesel::PgConnection,
    "BEGIN",
    "SELECT job_name AS series, \
     CAST(FLOOR(EXTRACT(EPOCH FROM ((now() AT TIME ZONE 'UTC') - done_at)) / 3600) AS BIGINT) AS hours_ago, \
     COUNT(*) AS n FROM done_jobs \
     WHERE done_at >= (now() AT TIME ZONE 'UTC') - INTERVAL '168 hours' GROUP BY 1, 2",
    "SELECT topic AS series, \
     CAST(FLOOR(EXTRACT(EPOCH FROM ((now() AT TIME ZONE 'UTC') - delivered_at)) / 3600) AS BIGINT) AS hours_ago, \
     COUNT(*) AS n FROM outbox \
     WHERE delivered_at >= (now() AT TIME ZONE 'UTC') - INTERVAL '168 hours' GROUP BY 1, 2"
);

// An explicit `LIMIT`: a server-wide `sql_select_limit` would cut the chart's rows short.
#[cfg(feature = "mysql")]
hourly!(
    diesel::MysqlConnection,
    "START TRANSACTION",
    "SELECT job_name AS series, TIMESTAMPDIFF(HOUR, done_at, UTC_TIMESTAMP(6)) AS hours_ago, \
     COUNT(*) AS n FROM done_jobs WHERE done_at >= UTC_TIMESTAMP(6) - INTERVAL 168 HOUR GROUP BY 1, 2 \
     LIMIT 18446744073709551615",
    "SELECT topic AS series, TIMESTAMPDIFF(HOUR, delivered_at, UTC_TIMESTAMP(6)) AS hours_ago, \
     COUNT(*) AS n FROM outbox WHERE delivered_at >= UTC_TIMESTAMP(6) - INTERVAL 168 HOUR GROUP BY 1, 2 \
     LIMIT 18446744073709551615"
);

#[cfg(feature = "sqlite")]
hourly!(
    diesel::SqliteConnection,
    "BEGIN",
    "SELECT job_name AS series, CAST((julianday('now') - julianday(done_at)) * 24 AS INTEGER) AS hours_ago, \
     COUNT(*) AS n FROM done_jobs WHERE julianday(done_at) >= julianday('now') - 7 GROUP BY 1, 2",
    "SELECT topic AS series, CAST((julianday('now') - julianday(delivered_at)) * 24 AS INTEGER) AS hours_ago, \
     COUNT(*) AS n FROM outbox WHERE julianday(delivered_at) >= julianday('now') - 7 GROUP BY 1, 2"
);

#[cfg(all(test, feature = "mysql"))]
mod tests {
    use diesel::connection::SimpleConnection;
    use diesel::{Connection, MysqlConnection, QueryableByName, RunQueryDsl};

    use super::Hourly;

    #[derive(QueryableByName)]
    struct Open {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }

    /// A session with `autocommit = 0` (a server default some sites set): any read opens a
    /// transaction that stays open. The dashboard's chart reads ran as bare statements, so the
    /// pooled connection went back holding one, and the next request's first call of the runtime
    /// was refused ("the connection is inside a transaction"). They now end what they open.
    #[test]
    fn the_hourly_reads_leave_no_transaction_open_where_autocommit_is_off() {
        assert_eq!(
            hourly_in_a_session("SET autocommit = 0"),
            0,
            "the chart reads left a transaction open"
        );
    }

    /// MariaDB's `sql_mode = 'ORACLE'` reads `BEGIN` as the start of a PL/SQL block: the chart
    /// reads' transactions, begun by Diesel's `BEGIN`, failed there (error 1064).
    #[test]
    fn the_hourly_reads_work_where_sql_mode_is_oracle() {
        assert_eq!(hourly_in_a_session("SET SESSION sql_mode = 'ORACLE'"), 0);
    }

    /// The session's statement limit, which the CLI warns of, read where `sql_mode = 'ORACLE'`
    /// (its transaction was begun with Diesel's `BEGIN`, refused there: no limit was shown).
    #[test]
    fn the_session_limit_is_read_where_sql_mode_is_oracle() {
        use crate::session::SessionLimits as _;
        let base = std::env::var("IDEMPOTENT_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
        let mut conn = MysqlConnection::establish(&base).unwrap_or_else(|e| {
            panic!("MariaDB at {base}: {e}; scripts/test starts it (or set IDEMPOTENT_MYSQL_URL)")
        });
        conn.batch_execute("SET SESSION sql_mode = 'ORACLE'; SET SESSION max_statement_time = 0.5")
            .expect("the session's settings");
        let limit = conn.statement_limit();
        assert_eq!(limit.map(|limit| limit.shown).as_deref(), Some("0.5"));
    }

    /// Both chart reads in a session with `setting`, on a database of the test's own; whether a
    /// transaction is open after them.
    fn hourly_in_a_session(setting: &str) -> i64 {
        let base = std::env::var("IDEMPOTENT_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
        let mut admin = MysqlConnection::establish(&base).unwrap_or_else(|e| {
            panic!("MariaDB at {base}: {e}; scripts/test starts it (or set IDEMPOTENT_MYSQL_URL)")
        });
        let name = format!("hourly_{}_{}", std::process::id(), setting.len());
        admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}"
            ))
            .expect("a database of the test's own");
        let (server, _) = base.rsplit_once('/').expect("a URL with a database");
        let mut conn =
            MysqlConnection::establish(&format!("{server}/{name}")).expect("a connection");
        idempotent_runtime::migrate(&mut conn).expect("the runtime's tables");
        conn.batch_execute(setting).expect("the session's setting");
        let keys = conn
            .keys_per_hour()
            .map(drop)
            .map_err(|e| e.error.to_string());
        let delivered = conn
            .delivered_per_hour()
            .map(drop)
            .map_err(|e| e.error.to_string());
        let open: Vec<Open> = diesel::sql_query("SELECT CAST(@@in_transaction AS SIGNED) AS n")
            .load(&mut conn)
            .expect("@@in_transaction");
        drop(conn); // its transaction, if any, ends with it (a DROP would wait for its locks)
        admin
            .batch_execute(&format!("DROP DATABASE {name}"))
            .expect("dropping the test's database");
        keys.expect("keys per hour");
        delivered.expect("delivered per hour");
        open[0].n
    }
}
