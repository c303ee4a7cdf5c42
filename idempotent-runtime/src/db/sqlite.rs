//! SQLite: every statement, error, lock, migration and inspection query, for `SqliteConnection`
//! and diesel-async's `SyncConnectionWrapper<SqliteConnection>`.
//!
//! * Transactions begin with `BEGIN IMMEDIATE`: the write lock first, since a deferred transaction
//!   that reads and then writes fails at once with "database is locked" when another connection
//!   wrote in between. Just before, the connection's `busy_timeout` is set, so that `BEGIN` waits
//!   for another writer and `COMMIT` waits for readers to let go (in the default rollback-journal
//!   mode a commit needs every reader gone) instead of failing at once after the body ran:
//!   concurrent workers on one file work with SQLite's defaults. WAL mode is faster (readers and
//!   the writer no longer wait for each other) but is the application's choice, not made here.
//! * Times are text, `YYYY-MM-DD HH:MM:SS.SSS` UTC, from `strftime('%Y-%m-%d %H:%M:%f', 'now')`;
//!   they compare correctly as text with the times Diesel writes. The claim binds the same text,
//!   formatted by the runtime from the clock SQLite reads in process ([`ClockText`]).
//! * The claim is `INSERT ... ON CONFLICT DO NOTHING`, then a read by the primary key when it
//!   inserted nothing. One writer at a time, so a claim never waits for another claim's row.

use diesel::result::{Error as DieselError, QueryResult};
use diesel::sql_types::{BigInt, Binary, Bool, Integer, Nullable, Text};
use diesel::sqlite::Sqlite;

use crate::sql::{Statement, bind};
use crate::store::{Claim, ClaimAttempt, Database, Fault, Lease, LeasedRow, Nesting, Store};

/// SQLite, with the bundled library (feature `sqlite`).
#[derive(Debug, Clone, Copy)]
pub struct SqliteDb;

/// The database's clock, UTC, in the text form the tables hold.
macro_rules! now {
    () => {
        "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    };
}

/// The clock in a condition that chooses rows by a time: `now!()`, which the planner searches an
/// index by (one value for the whole statement).
macro_rules! now_bound {
    () => {
        "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    };
}

/// The database's clock plus the microseconds bound at `?` (the value is bound twice: once to
/// test for NULL, which gives NULL).
macro_rules! now_plus {
    () => {
        "CASE WHEN ? IS NULL THEN NULL ELSE strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', ? / 1000000.0)) END"
    };
}

/// The columns the relay reads.
macro_rules! message_columns {
    () => {
        "id, message_id, topic, payload, job_key, attempts, last_error, \
         CAST((julianday('now') - julianday(created_at)) * 86400000000.0 AS INTEGER) AS age_micros"
    };
}

/// A timestamp column (or aggregate of one) as microseconds since the Unix epoch; NULL stays NULL.
/// The stored text has milliseconds, and julianday's double is good only to tens of microseconds:
/// rounded to the millisecond first.
macro_rules! micros {
    ($column:expr) => {
        concat!(
            "CAST(ROUND((julianday(",
            $column,
            ") - 2440587.5) * 86400000.0) AS INTEGER) * 1000"
        )
    };
}

sql! {
    // The claim's time is bound ([`ClockText`]): SQLite's clock is this process's, and
    // `strftime` for it cost a claim more than the rest of the statement's own work.
    ClaimInsert = "INSERT INTO done_jobs (key_digest, job_key, job_name, fingerprint, claim_token, result, done_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING";
    PruneLapsed = concat!(
        "DELETE FROM done_jobs WHERE key_digest IN \
         (SELECT key_digest FROM done_jobs WHERE expires_at <= ", now!(), " LIMIT ?)"
    );
    ParkAbandoned = concat!(
        "UPDATE outbox SET parked_at = ", now!(), ", lease_owner = NULL, lease_until = NULL, \
         last_error = ", abandoned_reason!(), " WHERE ", abandoned!(), " AND attempts >= ?"
    );
    // In the order of `outbox_leased` (schema version 4: `lease_until, id` of the leased messages
    // alone): the messages not leased, however many are due or backing off, are never read. One
    // at its last attempt is not taken (`attempts < ?`, the relay's `max_attempts`): its lease can
    // lapse between `ParkAbandoned`'s clock and this one's, and the next lease parks it.
    TakeAbandoned = concat!(
        "UPDATE outbox SET lease_owner = ?, lease_until = ", now_plus!(), ", attempts = attempts + 1 \
         WHERE id = (SELECT id FROM outbox WHERE ", abandoned!(), " AND attempts < ? ORDER BY lease_until, id LIMIT 1)"
    );
    // In the order of `outbox_pending` (`available_at, id`: the order in which messages became
    // available, pushed or at the end of their backoff), which the index reads and stops at the
    // limit. With `ORDER BY id`, SQLite's planner (no statistics unless the application runs
    // ANALYZE) scanned the table in id order instead, delivered rows included, under the write
    // lock that every job waits for: measured at 1,000,000 delivered rows kept, 207 ms and 174 ms
    // a round; through the index 0.19 ms and 0.26 ms.
    TakePending = concat!(
        "UPDATE outbox SET lease_owner = ?, lease_until = ", now_plus!(), ", attempts = attempts + 1 \
         WHERE id IN (SELECT id FROM outbox WHERE ", pending!(), " ORDER BY available_at, id LIMIT ?)"
    );
    // Through `outbox_lease_owner` (schema version 4: the leased messages alone, by owner). A
    // leased message is neither delivered nor parked: these conditions kept a schema without it
    // to the partial index `outbox_pending`, the undelivered rows (measured at 1,000,000
    // delivered rows: a scan of the table, 93 ms a round; through that index, 0.03 ms, but every
    // due message read with a backlog). Sorted after the read: with `ORDER BY id` the planner
    // scans the table in id order instead.
    Leased = concat!(
        "SELECT ", message_columns!(), " FROM outbox WHERE lease_owner = ? \
         AND delivered_at IS NULL AND parked_at IS NULL"
    );
    RetryParked = concat!(
        "UPDATE outbox SET parked_at = NULL, attempts = 0, last_error = NULL, available_at = ",
        now!(),
        " WHERE parked_at IS NOT NULL AND (? IS NULL OR message_id = ?)"
    );
    PruneDelivered = "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE delivered_at <= \
         strftime('%Y-%m-%d %H:%M:%f', 'now', printf('-%.6f seconds', ? / 1000000.0)) \
         ORDER BY delivered_at LIMIT ?)";
    Counts = "SELECT \
         COUNT(CASE WHEN delivered_at IS NULL AND parked_at IS NULL AND lease_owner IS NULL THEN 1 END) AS pending, \
         COUNT(CASE WHEN delivered_at IS NULL AND parked_at IS NULL AND lease_owner IS NOT NULL THEN 1 END) AS leased, \
         COUNT(delivered_at) AS delivered, \
         COUNT(CASE WHEN delivered_at IS NULL THEN parked_at END) AS parked \
         FROM outbox";
    // In any database of the connection (temp, main, or one attached), as SQLite finds an
    // unqualified name: the job statements find the tables wherever they are.
    TableExists = "SELECT COUNT(*) AS n FROM pragma_table_list WHERE type = 'table' AND name = ?";
    // Where each of the runtime's tables resolves: first in temp, then main, then the attached
    // databases in the order they were attached (`seq`).
    TablesResolved = "SELECT lower(t.name) AS name, t.schema AS schema FROM pragma_table_list AS t \
         LEFT JOIN pragma_database_list AS d ON d.name = t.schema \
         WHERE lower(t.name) IN ('idempotent_schema', 'done_jobs', 'outbox') \
         AND t.type IN ('table', 'view', 'virtual') \
         ORDER BY CASE t.schema WHEN 'temp' THEN 0 WHEN 'main' THEN 1 ELSE 2 + COALESCE(d.seq, 0) END";
    RecordVersion = concat!(
        "INSERT INTO idempotent_schema (version, description, applied_at) VALUES (?, ?, ", now!(), ")"
    );
    // Of every database of the connection, the main one and each attached one: a body may write
    // to any of them.
    JournalMode = "SELECT COALESCE((SELECT journal_mode FROM pragma_journal_mode WHERE schema = d.name), '') AS name FROM pragma_database_list AS d";
    // The databases in a file (an in-memory one, `temp` included, has the file name '') whose
    // journal is kept in memory or not at all.
    VolatileJournals = "SELECT name || ' (journal_mode = ' || mode || ')' AS name FROM \
         (SELECT d.seq, d.name, d.file, lower(COALESCE((SELECT journal_mode FROM pragma_journal_mode WHERE schema = d.name), '')) AS mode \
         FROM pragma_database_list AS d) WHERE file <> '' AND mode IN ('memory', 'off') ORDER BY seq";
    // SQLite's own tables begin with exactly `sqlite_` (it refuses that prefix, in any case, to
    // others); `LIKE` would ignore case and read `_` as any character.
    TableNames = "SELECT name AS name FROM sqlite_master WHERE type = 'table' AND substr(name, 1, 7) <> 'sqlite_' ORDER BY name";
    TableColumns = "SELECT name AS name FROM pragma_table_info(?) ORDER BY cid";
    // On the table the name resolves to, in whichever database it is.
    IndexExists = "SELECT COUNT(*) AS n FROM pragma_index_list(?) WHERE name = ?";
    // A primary key or a unique index whose only column is the one asked for.
    UniqueIndexOn = "SELECT COUNT(*) AS n FROM pragma_index_list(?) AS l \
         WHERE l.\"unique\" = 1 AND (SELECT COUNT(*) FROM pragma_index_info(l.name)) = 1 \
         AND (SELECT name FROM pragma_index_info(l.name)) = ?";
}

/// Every statement outside a transaction is its own, and reads the latest commit.
macro_rules! read_guard {
    () => {
        ""
    };
}

/// Nothing: `by_primary_key!()` is MySQL's (see `shared_statements!`).
macro_rules! by_primary_key {
    () => {
        ""
    };
}

/// Nothing: `every_row!()` is MySQL's (see `shared_statements!`).
macro_rules! every_row {
    () => {
        ""
    };
}

shared_statements!();

sql! {
    // A redelivery's read before its claim: no row where the session reads rows not committed
    // (`PRAGMA read_uncommitted = 1`, which a shared cache obeys), so that the claim decides. It
    // saw another connection's claim before that run committed, and replayed a run that then
    // rolled back.
    DoneReadFirst = concat!(
        done_read!(),
        " AND (SELECT read_uncommitted FROM pragma_read_uncommitted) = 0"
    );
}

/// The microseconds bound in `now_plus!()`, which binds it twice (to test it for NULL first).
fn later(micros: Option<i64>) -> crate::sql::Twice<Nullable<BigInt>, Option<i64>> {
    crate::sql::twice(micros)
}

impl Database for SqliteDb {
    const FIRST_READ_IN_OWN_TRANSACTION: bool = true;

    async fn committed_reads_next<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<bool> {
        let on = conn
            .text_rows("SELECT CAST(read_uncommitted AS TEXT) AS row FROM pragma_read_uncommitted")
            .await?;
        if on.first().is_some_and(|setting| setting == "1") {
            conn.batch("PRAGMA read_uncommitted = 0").await?;
            return Ok(true);
        }
        Ok(false)
    }

    async fn committed_reads_done<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<()> {
        conn.batch("PRAGMA read_uncommitted = 1").await
    }

    async fn done_row_before_claim<C: Store<Db = Self>>(
        conn: &mut C,
        digest: &[u8; 32],
    ) -> QueryResult<Option<crate::store::DoneRow>> {
        super::shared::done_row_by::<DoneReadFirst, _>(conn, digest).await
    }

    const BEGIN_UNCOUNTED: &'static str = BEGIN;
    shared_methods!();
    migration_steps!(
        "sqlite",
        crate::store::Step {
            version: 4,
            table: "outbox",
            column: None,
            routines: &[],
            indexes: &["outbox_leased", "outbox_lease_owner"],
            sql: include_str!("../../sql/sqlite/004_outbox_leased.sql"),
        }
    );

    async fn rollback_left(
        conn: &mut impl Store<Db = Self>,
        _cleared: bool,
    ) -> QueryResult<Option<&'static str>> {
        let modes: Vec<super::Name> = conn.load(Statement::<JournalMode, _>::new(())).await?;
        Ok(modes
            .iter()
            .any(|mode| mode.name.eq_ignore_ascii_case("off"))
            .then_some(
                "this SQLite connection runs with journal_mode = OFF (on its main database or one attached), which has no rollback",
            ))
    }

    async fn volatile_journals<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<Option<String>> {
        let found: Vec<super::Name> = conn.load(Statement::<VolatileJournals, _>::new(())).await?;
        Ok((!found.is_empty()).then(|| {
            found
                .into_iter()
                .map(|database| database.name)
                .collect::<Vec<_>>()
                .join(", ")
        }))
    }

    /// The busy timeout bounds the wait for the write lock, and goes back to the usual one as soon
    /// as the lock is held, for the commit.
    fn bounded_begin_sql(limit: std::time::Duration) -> Option<String> {
        let millis = limit.as_millis().min(i32::MAX as u128);
        Some(format!(
            "PRAGMA busy_timeout = {millis}; BEGIN IMMEDIATE; PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}"
        ))
    }

    fn bounded_begin_failed_sql() -> Option<&'static str> {
        Some(BEGIN_FAILED)
    }

    /// A run holds SQLite's write lock from `BEGIN IMMEDIATE`: the claim never waits for a row,
    /// and the in-progress bound applies to the retries of `BEGIN` instead.
    async fn bound_lock_wait<C: Store<Db = Self>>(
        _conn: &mut C,
        _limit: std::time::Duration,
    ) -> QueryResult<Option<String>> {
        Ok(None)
    }

    async fn restore_lock_wait<C: Store<Db = Self>>(
        _conn: &mut C,
        _previous: &str,
    ) -> QueryResult<()> {
        Ok(())
    }

    type Backend = Sqlite;
    const NAME: &'static str = "SQLite";
    const WRITE_LOCK_AT_BEGIN: bool = true;

    /// The job's savepoint and `COMMIT` go in one `sqlite3_exec` (which stops at its first
    /// error): only the release names the savepoint it cannot find. (`COMMIT`'s own failures, a
    /// busy database, a full disk, an I/O error, name none.)
    fn release_failed(error: &DieselError) -> bool {
        super::message(error).is_some_and(|m| m.contains("no such savepoint"))
    }

    async fn transaction_still_open<C: Store<Db = Self>>(conn: &mut C) -> Option<bool> {
        // A deferred `BEGIN` takes no lock: outside a transaction it opens one, ended at once;
        // inside one it is refused (and then the batch stops).
        match conn.batch("BEGIN DEFERRED; ROLLBACK").await {
            Ok(()) => Some(false),
            Err(error) if Self::inside_callers_transaction(&error) => Some(true),
            Err(_) => None,
        }
    }

    /// SQLite's errors that may roll back the whole transaction ("Response To Errors Within A
    /// Transaction"): `SQLITE_FULL`, `SQLITE_IOERR`, `SQLITE_NOMEM`, reported by their messages.
    fn rolled_back_whole(error: &DieselError) -> bool {
        super::message(error).is_some_and(|m| {
            [
                "database or disk is full",
                "disk I/O error",
                "out of memory",
            ]
            .iter()
            .any(|known| m.contains(known))
        })
    }

    fn inside_callers_transaction(error: &DieselError) -> bool {
        // The job's `BEGIN IMMEDIATE` in a transaction Diesel does not know of: refused, and the
        // caller's transaction goes on untouched.
        super::message(error)
            .is_some_and(|m| m.contains("cannot start a transaction within a transaction"))
    }

    fn classify(error: &DieselError) -> Fault {
        if let DieselError::DatabaseError(
            diesel::result::DatabaseErrorKind::SerializationFailure,
            _,
        ) = error
        {
            return Fault::Serialization;
        }
        match super::message(error) {
            Some(m)
                if m.contains("database is locked") || m.contains("database table is locked") =>
            {
                Fault::Busy
            }
            _ => Fault::Other,
        }
    }

    async fn claim<C: Store<Db = Self>>(
        conn: &mut C,
        claim: &Claim<'_>,
    ) -> QueryResult<ClaimAttempt> {
        let clock = ClockText::now();
        let (digest, key, job, fingerprint, token, result) = super::shared::claim_values(claim);
        let values = (
            digest,
            key,
            job,
            fingerprint,
            token,
            result,
            bind::<Text, _>(clock.as_str()),
        );
        super::shared::insert_or_read::<ClaimInsert, _, _>(conn, claim, values).await
    }

    async fn lease<C: Store<Db = Self>>(
        conn: &mut C,
        lease: &Lease<'_>,
    ) -> QueryResult<crate::store::Leased> {
        let parked = super::shared::park_abandoned::<ParkAbandoned, _>(conn, lease).await?;
        let abandoned = conn
            .execute(Statement::<TakeAbandoned, _>::new((
                bind::<Text, _>(lease.owner),
                bind::<Nullable<BigInt>, _>(Some(lease.lease_micros)),
                bind::<Nullable<BigInt>, _>(Some(lease.lease_micros)),
                bind::<Integer, _>(lease.max_attempts),
            )))
            .await?;
        if abandoned == 0 {
            conn.execute(Statement::<TakePending, _>::new((
                bind::<Text, _>(lease.owner),
                bind::<Nullable<BigInt>, _>(Some(lease.lease_micros)),
                bind::<Nullable<BigInt>, _>(Some(lease.lease_micros)),
                bind::<BigInt, _>(lease.limit),
            )))
            .await?;
        }
        let mut leased: Vec<LeasedRow> = conn
            .load(Statement::<Leased, _>::new((bind::<Text, _>(lease.owner),)))
            .await?;
        leased.sort_by_key(|m| m.id);
        Ok(crate::store::Leased {
            parked,
            rows: leased,
        })
    }

    async fn schema_version<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<Option<i32>> {
        super::shared::recorded_version::<_, SchemaVersion>(conn).await
    }

    async fn migrate<C: Store<Db = Self>>(
        conn: &mut C,
        lock_timeout: std::time::Duration,
    ) -> Result<(), crate::error::Error> {
        // SQLite's DDL is transactional and `BEGIN IMMEDIATE` makes this the only writer: the
        // whole upgrade is one transaction, all or nothing, and concurrent callers wait for it.
        crate::migrations::in_transaction(conn, lock_timeout, async |conn: &mut C| {
            crate::migrations::pass(conn, None).await
        })
        .await
    }

    async fn where_tables_are<C: Store<Db = Self>>(_conn: &mut C) -> QueryResult<String> {
        Ok("this connection's databases (its main file, and those attached to it)".to_owned())
    }

    async fn shadowed_by_temporary<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> QueryResult<Vec<&'static str>> {
        Ok(resolved(conn)
            .await?
            .into_iter()
            .filter(|(_, schema)| schema == "temp")
            .map(|(table, _)| table)
            .collect())
    }

    async fn in_attached_databases<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> QueryResult<Vec<(&'static str, String)>> {
        Ok(resolved(conn)
            .await?
            .into_iter()
            .filter(|(_, schema)| schema != "temp" && schema != "main")
            .collect())
    }

    async fn table_rows<C: Store<Db = Self>>(
        conn: &mut C,
        table: &str,
    ) -> QueryResult<Vec<String>> {
        let columns = Self::table_columns(conn, table).await?;
        let row = columns
            .iter()
            .map(|name| format!("quote({})", super::double_quoted(name)))
            .collect::<Vec<_>>()
            .join(" || ', ' || ");
        conn.text_rows(&format!(
            "SELECT {row} AS row FROM {}",
            super::double_quoted(table)
        ))
        .await
    }
}

/// A runtime table's name, and the database it is in.
#[derive(diesel::QueryableByName)]
struct Resolved {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    schema: String,
}

/// Each of the runtime's tables the connection finds, with the database SQLite finds it in (the
/// first of temp, main, then the attached ones in order, that holds one of that name).
async fn resolved<C: Store<Db = SqliteDb>>(
    conn: &mut C,
) -> QueryResult<Vec<(&'static str, String)>> {
    let rows: Vec<Resolved> = conn.load(Statement::<TablesResolved, _>::new(())).await?;
    let mut found: Vec<(&'static str, String)> = Vec::new();
    for row in rows {
        if let Some(table) = crate::migrations::runtime_tables([row.name.as_str()]).pop()
            && !found.iter().any(|(seen, _)| *seen == table)
        {
            found.push((table, row.schema));
        }
    }
    Ok(found)
}

/// The clock as `strftime('%Y-%m-%d %H:%M:%f', 'now')` gives it, read by the runtime: SQLite
/// reads the same system clock in process (its VFS's `xCurrentTimeInt64`, milliseconds since the
/// Julian epoch, truncated), and formatting it here costs about a tenth of the SQL function's
/// `printf`-driven formatting on every claim (measured with callgrind: ~4,500 instructions a
/// claim).
struct ClockText([u8; 23]);

impl ClockText {
    /// Now, UTC, to the millisecond (truncated, as SQLite reads it).
    fn now() -> Self {
        let millis = match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            Ok(since) => i64::try_from(since.as_millis()).unwrap_or(i64::MAX),
            // A clock set before 1970: the millisecond the instant falls in, counted back (down,
            // as SQLite's `1000 * tv_sec + tv_usec / 1000` rounds).
            Err(before) => {
                -i64::try_from(before.duration().as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
            }
        };
        Self::at(millis)
    }

    /// `millis` since the Unix epoch, as text.
    fn at(millis: i64) -> Self {
        let seconds = millis.div_euclid(1000);
        let millis = millis.rem_euclid(1000);
        let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
        let of_day = seconds.rem_euclid(86_400);
        let mut text = *b"0000-00-00 00:00:00.000";
        let mut put = |at: usize, width: usize, mut value: i64| {
            for place in (at..at + width).rev() {
                text[place] = b'0' + (value % 10) as u8;
                value /= 10;
            }
        };
        // SQLite's own range is the years 0000 to 9999.
        put(0, 4, year.clamp(0, 9999));
        put(5, 2, month);
        put(8, 2, day);
        put(11, 2, of_day / 3600);
        put(14, 2, of_day / 60 % 60);
        put(17, 2, of_day % 60);
        put(20, 3, millis);
        Self(text)
    }

    fn as_str(&self) -> &str {
        // ASCII digits and separators only.
        std::str::from_utf8(&self.0).unwrap_or("1970-01-01 00:00:00.000")
    }
}

/// The proleptic Gregorian date (year, month, day) of `days` since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let of_era = z.rem_euclid(146_097);
    let year_of_era = (of_era - of_era / 1460 + of_era / 36_524 - of_era / 146_096) / 365;
    let day_of_year = of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// How a transaction begins; see the module docs.
/// How long `BEGIN` waits for another writer, and `COMMIT` for readers, by default.
const BUSY_TIMEOUT_MS: u32 = 5000;
const BEGIN: &str = "PRAGMA busy_timeout = 5000; BEGIN IMMEDIATE";
/// What is not a job: no lock until one is needed (a look-up never waits for a job in progress).
const BEGIN_DEFERRED: &str = "PRAGMA busy_timeout = 5000; BEGIN DEFERRED";
/// After a bounded `BEGIN` that did not get the lock: the usual wait again.
const BEGIN_FAILED: &str = "PRAGMA busy_timeout = 5000";

// A job's own transaction begins as any other, `Nesting::Unmarked`: its savepoint comes after the
// claim.
sync_store!(diesel::SqliteConnection, SqliteDb, begin: BEGIN, job: BEGIN, transactions: crate::db::ansi_begin, begin_job, crate::db::ansi_commit, crate::db::ansi_rollback, deferred: BEGIN_DEFERRED, one_batch: true);

/// Opens a job's own transaction: `BEGIN IMMEDIATE` (`sql`), without the job's savepoint, which
/// costs nothing after the claim in process ([`Nesting::Unmarked`]); or Diesel's savepoint inside
/// the caller's transaction.
fn begin_job(conn: &mut diesel::SqliteConnection, sql: &str) -> QueryResult<Nesting> {
    crate::db::begin_sync::<SqliteDb, _>(conn, sql).map(super::unmarked)
}

/// diesel-async's SQLite runs the sync connection on a blocking thread; statements go through
/// its own `RunQueryDsl`, transactions through its wrapper of Diesel's transaction manager.
#[cfg(feature = "async-sqlite")]
mod wrapper {
    use diesel::SqliteConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

    use crate::store::{Database, Nesting, Store};

    type Wrapper = SyncConnectionWrapper<SqliteConnection>;

    impl Store for Wrapper {
        type Db = super::SqliteDb;

        async fn begin(&mut self) -> diesel::QueryResult<Nesting> {
            self.spawn_blocking(|conn| {
                crate::db::begin_sync::<super::SqliteDb, _>(conn, super::BEGIN)
            })
            .await
        }

        async fn begin_bounded(
            &mut self,
            limit: std::time::Duration,
        ) -> diesel::QueryResult<Nesting> {
            let sql = <super::SqliteDb as Database>::bounded_begin_sql(limit)
                .unwrap_or_else(|| super::BEGIN.to_owned());
            self.spawn_blocking(move |conn| {
                crate::db::begin_bounded_sync::<super::SqliteDb, _>(conn, &sql)
            })
            .await
        }

        async fn begin_job(
            &mut self,
            bound: Option<std::time::Duration>,
        ) -> diesel::QueryResult<Nesting> {
            // Without the job's savepoint, which comes after the claim.
            let sql = bound
                .and_then(<super::SqliteDb as Database>::bounded_begin_sql)
                .unwrap_or_else(|| super::BEGIN.to_owned());
            self.spawn_blocking(move |conn| {
                crate::db::begin_bounded_sync::<super::SqliteDb, _>(conn, &sql)
            })
            .await
            .map(crate::db::unmarked)
        }

        fn finish_in_one_batch(&mut self) -> bool {
            true
        }

        async fn begin_deferred(&mut self) -> diesel::QueryResult<Nesting> {
            self.spawn_blocking(|conn| {
                crate::db::begin_sync::<super::SqliteDb, _>(conn, super::BEGIN_DEFERRED)
            })
            .await
        }

        async_store_methods!();
    }

    job_store!(Wrapper, crate::connection::AsyncJobStore);
}

#[cfg(test)]
mod tests {
    use diesel::prelude::*;
    use diesel::sql_types::{BigInt, Text};

    use super::ClockText;

    #[test]
    fn the_clock_text_is_sqlites_format() {
        for (millis, text) in [
            (0, "1970-01-01 00:00:00.000"),
            (-1, "1969-12-31 23:59:59.999"),
            (951_782_400_000, "2000-02-29 00:00:00.000"),
            (4_102_444_799_999, "2099-12-31 23:59:59.999"),
            (1_796_342_400_123, "2026-12-04 00:00:00.123"),
            (-86_400_001, "1969-12-30 23:59:59.999"),
        ] {
            assert_eq!(ClockText::at(millis).as_str(), text, "{millis}");
        }
    }

    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        text: String,
    }

    /// Against SQLite's own `strftime` for whole seconds over five centuries (every 7 days and
    /// 11,113 seconds, so every weekday, month end and leap day comes round), milliseconds added.
    #[test]
    fn the_clock_text_agrees_with_sqlite() {
        let mut conn = SqliteConnection::establish(":memory:").expect("an in-memory database");
        let step = 7 * 86_400 + 11_113;
        let mut seconds: i64 = -2_208_988_800; // 1900-01-01
        let mut compared = 0;
        while seconds < 13_569_465_600 {
            // 2400-01-01
            let sqlite: Row =
                diesel::sql_query("SELECT strftime('%Y-%m-%d %H:%M:%S', ?, 'unixepoch') AS text")
                    .bind::<BigInt, _>(seconds)
                    .get_result(&mut conn)
                    .expect("strftime");
            let millis = (seconds.rem_euclid(997)) % 1000;
            let ours = ClockText::at(seconds * 1000 + millis);
            assert_eq!(
                ours.as_str(),
                format!("{}.{millis:03}", sqlite.text),
                "{seconds}"
            );
            seconds += step;
            compared += 1;
        }
        assert!(compared > 20_000, "{compared}");
    }

    /// `now` reads the clock SQLite reads: SQLite's `'now'` just after is the same or a few
    /// milliseconds later, never earlier.
    #[test]
    fn the_clock_text_reads_sqlites_clock() {
        let mut conn = SqliteConnection::establish(":memory:").expect("an in-memory database");
        for _ in 0..100 {
            let ours = ClockText::now();
            let sqlite: Row =
                diesel::sql_query("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now') AS text")
                    .get_result(&mut conn)
                    .expect("strftime");
            assert!(
                ours.as_str() <= sqlite.text.as_str(),
                "{} > {}",
                ours.as_str(),
                sqlite.text
            );
            let after = ClockText::now();
            assert!(
                sqlite.text.as_str() <= after.as_str(),
                "{} > {}",
                sqlite.text,
                after.as_str()
            );
        }
    }
}
