//! What the benchmark needs from each backend: its tables, the hand-written statements, the best
//! transaction transport it offers, bulk fills, and the settings every figure was measured with.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use idempotent_jobs::JobStore;
use sha2::{Digest as _, Sha256};

use crate::transport::{
    Begin, CallBeginJob, CallCommitJob, Commit, Count, Fixed, InTransaction, Rollback,
};

diesel::table! {
    bench_effects (id) {
        id -> BigInt,
        job -> BigInt,
    }
}

diesel::table! {
    two_phase_jobs (key_digest) {
        key_digest -> Binary,
        status -> Text,
    }
}

diesel::define_sql_function! {
    /// SHA-256, registered on SQLite connections that fill `done_jobs` (PostgreSQL and MariaDB
    /// have their own), so that filled keys have the digests the runtime computes.
    fn bench_sha256(text: diesel::sql_types::Text) -> diesel::sql_types::Binary;
}

/// One text column.
#[derive(QueryableByName)]
struct Setting {
    #[diesel(sql_type = diesel::sql_types::Text)]
    s: String,
}

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
}

/// The backend behind a [`BenchDb`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
    Mysql,
}

/// What the variants need from a backend.
pub trait BenchDb:
    JobStore + diesel::Connection + SimpleConnection + Sized + Send + 'static
{
    const NAME: &'static str;
    const KIND: Kind;
    fn create_tables(&mut self) -> QueryResult<()>;
    fn insert_effect(&mut self, job: i64) -> QueryResult<()>;
    /// The hand-written claim: one indexed insert, `true` if it claimed.
    fn hand_claim(&mut self, digest: &[u8; 32], key: &str) -> QueryResult<bool>;
    fn two_phase_start(&mut self, digest: &[u8; 32]) -> QueryResult<bool>;
    fn two_phase_finish(&mut self, digest: &[u8; 32]) -> QueryResult<()>;
    /// The hand-written result: the claimed row's `result`, updated (Diesel's DSL).
    fn hand_record(&mut self, digest: &[u8; 32], json: &str) -> QueryResult<()>;
    /// The same `UPDATE` as a cached prepared statement: one round trip on MySQL, where Diesel's
    /// `update(..).set(..)` is prepared anew each time there (two).
    fn fast_record(&mut self, digest: &[u8; 32], json: &str) -> QueryResult<()>;
    /// One indexed read of a key's row through this client, outside any transaction.
    fn read_done(&mut self, digest: &[u8; 32]) -> QueryResult<Option<(String, Option<String>)>>;
    /// `f` in a transaction the idiomatic Diesel way (`transaction`, or `immediate_transaction`
    /// on SQLite, as a writer should open it there).
    fn idiomatic(&mut self, f: &mut dyn FnMut(&mut Self) -> QueryResult<()>) -> QueryResult<()>;
    /// `BEGIN` with the best transport the backend offers (one round trip; prepared on MySQL).
    fn fast_begin(&mut self) -> QueryResult<()>;
    fn fast_commit(&mut self) -> QueryResult<()>;
    fn fast_rollback(&mut self) -> QueryResult<()>;
    /// `INSERT ... SELECT` of claims of `job` with keys `<prefix>:<n>` for `n` in `from..to` (and
    /// the runtime's digests), lapsed or not; `sorted` inserts them in digest order.
    fn fill_sql(from: u64, to: u64, prefix: &str, job: &str, lapsed: bool, sorted: bool) -> String;
    /// The statements that drop and re-create `done_jobs`' indexes around a bulk fill into an
    /// empty table ("" where the table is clustered on the digest: SQLite).
    const DROP_INDEXES: &'static str;
    const ADD_INDEXES: &'static str;
    /// Makes what [`fill_sql`](Self::fill_sql) needs available on this connection.
    fn before_fill(&mut self) -> QueryResult<()>;
    /// Flushes what a bulk fill left dirty, so that the next measurement does not pay for it.
    const SETTLE: &'static str;
    /// `INSERT ... SELECT` of outbox messages `n` in `from..to`: delivered long ago, or pending
    /// (available since long ago, never tried).
    fn outbox_fill_sql(from: u64, to: u64, delivered: bool) -> String;
    /// What the server does by itself after a bulk insert into the outbox (SQLite: nothing, it
    /// keeps no statistics unless the application runs `ANALYZE`).
    const SETTLE_OUTBOX: &'static str;
    /// Every undelivered message's next attempt put far ahead, as after failed deliveries.
    const OUTBOX_BACK_OFF: &'static str =
        "UPDATE outbox SET available_at = '2100-01-01 00:00:00' WHERE delivered_at IS NULL";
    /// The settings the figures were measured with, as the server reports them.
    const SETTINGS: &'static str;
    /// The size of `done_jobs` with its indexes, as the server reports it.
    const SIZE: &'static str;
    /// The type a number is cast to for text.
    const TEXT: &'static str = "TEXT";

    /// The text of a one-row, one-column (`s`) query, or why it failed.
    fn query_text(&mut self, sql: &str) -> String;

    /// MariaDB: `SELECT @@in_transaction` (prepared), the implicit-commit check the library sent
    /// before its savepoint; asserts the transaction is still open.
    fn check_in_transaction(&mut self) -> QueryResult<()> {
        Ok(())
    }

    /// MariaDB: stored procedures that open a transaction with the job's savepoint, and release it
    /// and commit (the `COMMIT` does not run when the savepoint is gone), each one prepared `CALL`:
    /// the library's implicit-commit check in 4 round trips per job instead of 6. Nothing elsewhere.
    fn create_procedures(&mut self) -> QueryResult<()> {
        Ok(())
    }

    /// `BEGIN` and the job's savepoint in one round trip (MariaDB: `CALL`); elsewhere `fast_begin`.
    fn call_begin_job(&mut self) -> QueryResult<()> {
        self.fast_begin()
    }

    /// The savepoint's release and `COMMIT` in one round trip (MariaDB: `CALL`); elsewhere
    /// `fast_commit`.
    fn call_commit_job(&mut self) -> QueryResult<()> {
        self.fast_commit()
    }

    /// PostgreSQL: a replay through the claim as it could be: `BEGIN`, the claim and the read in
    /// one statement ([`crate::transport::ClaimOrRead`]), `COMMIT`: three round trips where the
    /// library sends four. None elsewhere.
    fn one_statement_replay(&mut self, key: &str, digest: &[u8; 32]) -> Option<QueryResult<()>> {
        let _ = (key, digest);
        None
    }

    /// What [`other_prune_batch`](Self::other_prune_batch) does ("": nothing).
    const OTHER_PRUNE: &'static str = "";

    /// One prune batch of up to `batch` lapsed rows the way the library does not (yet): on
    /// MariaDB by primary key (a plain read of the ids, which locks nothing, then `DELETE ... WHERE
    /// id IN (...) AND expires_at <= now`: record locks only); on SQLite in `BEGIN IMMEDIATE`
    /// (the library's `BEGIN DEFERRED` transaction meets `SQLITE_BUSY_SNAPSHOT` when a claim
    /// commits between its read and its write). The rows deleted.
    fn other_prune_batch(&mut self, batch: u32) -> QueryResult<u64> {
        let _ = batch;
        unimplemented!("{}: no other prune", Self::NAME)
    }

    fn settings(&mut self) -> String {
        self.query_text(Self::SETTINGS)
    }

    fn size(&mut self) -> String {
        self.query_text(Self::SIZE)
    }

    fn settle_outbox(&mut self) {
        for statement in Self::SETTLE_OUTBOX
            .split(';')
            .filter(|s| !s.trim().is_empty())
        {
            self.batch_execute(statement)
                .expect("settling after an outbox fill");
        }
    }

    fn settle(&mut self) {
        // One statement at a time: PostgreSQL runs VACUUM only outside a transaction block.
        for statement in Self::SETTLE.split(';') {
            self.batch_execute(statement)
                .expect("settling after a fill");
        }
    }

    /// Adds the claims `<prefix>:<n>` for `n` in `from..to`; into a table holding fewer rows than
    /// that, with the indexes built after the rows (as a restore would), otherwise in digest order.
    fn fill(&mut self, from: u64, to: u64, prefix: &str, job: &str, lapsed: bool) {
        if to <= from {
            return;
        }
        self.before_fill().expect("the fill's functions");
        let held: u64 = self
            .query_text(&format!(
                "SELECT CAST(COUNT(*) AS {}) AS s FROM done_jobs",
                Self::TEXT
            ))
            .trim()
            .parse()
            .unwrap_or(u64::MAX);
        let rebuild = held < to - from && !Self::DROP_INDEXES.is_empty();
        if rebuild {
            self.batch_execute(Self::DROP_INDEXES)
                .expect("dropping indexes");
        }
        self.batch_execute(&Self::fill_sql(from, to, prefix, job, lapsed, !rebuild))
            .expect("filling done_jobs");
        if rebuild {
            self.batch_execute(Self::ADD_INDEXES)
                .expect("building indexes");
        }
        self.settle();
    }
}

/// An insert that reports whether it inserted, the way a user would write it for the backend:
/// `ON CONFLICT DO NOTHING`, or (MySQL) a plain insert whose duplicate-key error means "there".
macro_rules! insert_unless_present {
    (on_conflict_do_nothing, $conn:expr, $table:expr, $values:expr) => {
        diesel::insert_into($table)
            .values($values)
            .on_conflict_do_nothing()
            .execute($conn)
            .map(|n| n == 1)
    };
    (duplicate_key_error, $conn:expr, $table:expr, $values:expr) => {
        match diesel::insert_into($table).values($values).execute($conn) {
            Ok(n) => Ok(n == 1),
            Err(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::UniqueViolation,
                _,
            )) => Ok(false),
            Err(e) => Err(e),
        }
    };
}

/// The statements that are the same Diesel code on every backend.
macro_rules! common {
    ($id:literal, $binary:literal, $insert:ident) => {
        fn query_text(&mut self, sql: &str) -> String {
            diesel::sql_query(sql)
                .get_result::<Setting>(self)
                .map_or_else(|e| format!("unknown ({e})"), |row| row.s)
        }

        fn create_tables(&mut self) -> QueryResult<()> {
            self.batch_execute(concat!(
                "CREATE TABLE bench_effects (id ",
                $id,
                ", job BIGINT NOT NULL);",
                "CREATE TABLE two_phase_jobs (key_digest ",
                $binary,
                " PRIMARY KEY NOT NULL, status VARCHAR(20) NOT NULL);"
            ))
        }

        fn insert_effect(&mut self, job: i64) -> QueryResult<()> {
            diesel::insert_into(bench_effects::table)
                .values(bench_effects::job.eq(job))
                .execute(self)
                .map(drop)
        }

        fn hand_claim(&mut self, digest: &[u8; 32], key: &str) -> QueryResult<bool> {
            use idempotent_jobs::schema::done_jobs::dsl as dj;
            let values = (
                dj::key_digest.eq(&digest[..]),
                dj::job_key.eq(key),
                dj::job_name.eq("hand"),
                dj::done_at.eq(chrono::Utc::now().naive_utc()),
            );
            insert_unless_present!(
                $insert,
                self,
                idempotent_jobs::schema::done_jobs::table,
                values
            )
        }

        fn two_phase_start(&mut self, digest: &[u8; 32]) -> QueryResult<bool> {
            let values = (
                two_phase_jobs::key_digest.eq(&digest[..]),
                two_phase_jobs::status.eq("in_progress"),
            );
            insert_unless_present!($insert, self, two_phase_jobs::table, values)
        }

        fn two_phase_finish(&mut self, digest: &[u8; 32]) -> QueryResult<()> {
            diesel::update(two_phase_jobs::table.filter(two_phase_jobs::key_digest.eq(&digest[..])))
                .set(two_phase_jobs::status.eq("complete"))
                .execute(self)
                .map(drop)
        }

        fn hand_record(&mut self, digest: &[u8; 32], json: &str) -> QueryResult<()> {
            use idempotent_jobs::schema::done_jobs::dsl as dj;
            diesel::update(dj::done_jobs.filter(dj::key_digest.eq(&digest[..])))
                .set(dj::result.eq(json))
                .execute(self)
                .map(drop)
        }

        fn fast_record(&mut self, digest: &[u8; 32], json: &str) -> QueryResult<()> {
            crate::transport::RecordResult { digest, json }
                .execute(self)
                .map(drop)
        }

        fn read_done(
            &mut self,
            digest: &[u8; 32],
        ) -> QueryResult<Option<(String, Option<String>)>> {
            use idempotent_jobs::schema::done_jobs::dsl as dj;
            dj::done_jobs
                .filter(dj::key_digest.eq(&digest[..]))
                .select((dj::job_name, dj::result))
                .get_result(self)
                .optional()
        }
    };
}

impl BenchDb for SqliteConnection {
    const NAME: &'static str = "SQLite";
    const KIND: Kind = Kind::Sqlite;
    common!(
        "INTEGER PRIMARY KEY AUTOINCREMENT",
        "BLOB",
        on_conflict_do_nothing
    );
    const DROP_INDEXES: &'static str = "";
    const ADD_INDEXES: &'static str = "";
    const SETTLE: &'static str = "PRAGMA wal_checkpoint(TRUNCATE)";
    const SETTLE_OUTBOX: &'static str = "PRAGMA wal_checkpoint(TRUNCATE)";
    const SETTINGS: &'static str = "SELECT 'journal_mode=' || (SELECT journal_mode FROM pragma_journal_mode) || ', synchronous=' || \
        (SELECT CASE synchronous WHEN 0 THEN 'OFF' WHEN 1 THEN 'NORMAL' WHEN 2 THEN 'FULL' ELSE 'EXTRA' END FROM pragma_synchronous) || \
        ', cache_size=' || (SELECT cache_size FROM pragma_cache_size) || ' (negative: KiB), page_size=' || (SELECT page_size FROM pragma_page_size) || \
        ', SQLite ' || sqlite_version() AS s";
    const SIZE: &'static str = "SELECT CAST((SELECT page_count FROM pragma_page_count) * (SELECT page_size FROM pragma_page_size) / 1048576 AS TEXT) || ' MB (whole file)' AS s";

    fn idiomatic(&mut self, f: &mut dyn FnMut(&mut Self) -> QueryResult<()>) -> QueryResult<()> {
        self.immediate_transaction(f)
    }

    fn fast_begin(&mut self) -> QueryResult<()> {
        self.batch_execute("BEGIN IMMEDIATE")
    }

    fn fast_commit(&mut self) -> QueryResult<()> {
        self.batch_execute("COMMIT")
    }

    fn fast_rollback(&mut self) -> QueryResult<()> {
        self.batch_execute("ROLLBACK")
    }

    const OTHER_PRUNE: &'static str = "BEGIN IMMEDIATE, delete";

    fn other_prune_batch(&mut self, batch: u32) -> QueryResult<u64> {
        self.batch_execute("PRAGMA busy_timeout = 5000; BEGIN IMMEDIATE")?;
        let deleted = diesel::sql_query(format!(
            "DELETE FROM done_jobs WHERE key_digest IN (SELECT key_digest FROM done_jobs \
             WHERE expires_at <= strftime('%Y-%m-%d %H:%M:%f', 'now') LIMIT {batch})"
        ))
        .execute(self);
        match deleted {
            Ok(n) => self.batch_execute("COMMIT").map(|()| n as u64),
            Err(error) => {
                self.batch_execute("ROLLBACK")?;
                Err(error)
            }
        }
    }

    fn before_fill(&mut self) -> QueryResult<()> {
        self.batch_execute("PRAGMA temp_store = MEMORY")?;
        bench_sha256_utils::register_impl(self, |text: String| {
            Sha256::digest(text.as_bytes()).to_vec()
        })
    }

    fn outbox_fill_sql(from: u64, to: u64, delivered: bool) -> String {
        let (prefix, attempts, delivered_at) = outbox_kind(delivered);
        format!(
            "WITH RECURSIVE s(n) AS (SELECT {from} UNION ALL SELECT n + 1 FROM s WHERE n + 1 < {to}) \
             INSERT INTO outbox (message_id, topic, payload, job_key, created_at, available_at, attempts, delivered_at) \
             SELECT '{prefix}' || n, 'bench', '{{}}', 'bench:' || n, '2000-01-01 00:00:00', '2000-01-01 00:00:00', \
             {attempts}, {delivered_at} FROM s"
        )
    }

    fn fill_sql(from: u64, to: u64, prefix: &str, job: &str, lapsed: bool, sorted: bool) -> String {
        format!(
            "WITH RECURSIVE s(n) AS (SELECT {from} UNION ALL SELECT n + 1 FROM s WHERE n + 1 < {to}) \
             INSERT INTO done_jobs (key_digest, job_key, job_name, done_at, expires_at) \
             SELECT bench_sha256('{prefix}:' || n), '{prefix}:' || n, '{job}', '2000-01-01 00:00:00', {} FROM s{}",
            expires(lapsed),
            if sorted { " ORDER BY 1" } else { "" }
        )
    }
}

impl BenchDb for PgConnection {
    const NAME: &'static str = "PostgreSQL";
    const KIND: Kind = Kind::Postgres;
    common!("BIGSERIAL PRIMARY KEY", "BYTEA", on_conflict_do_nothing);
    const DROP_INDEXES: &'static str =
        "ALTER TABLE done_jobs DROP CONSTRAINT done_jobs_pkey; DROP INDEX done_jobs_expires_at";
    const ADD_INDEXES: &'static str = "ALTER TABLE done_jobs ADD CONSTRAINT done_jobs_pkey PRIMARY KEY (key_digest); \
        CREATE INDEX done_jobs_expires_at ON done_jobs (expires_at) WHERE expires_at IS NOT NULL";
    const SETTLE: &'static str = "VACUUM ANALYZE done_jobs; CHECKPOINT";
    const SETTLE_OUTBOX: &'static str = "VACUUM ANALYZE outbox; CHECKPOINT";
    const SETTINGS: &'static str = "SELECT string_agg(name || '=' || setting || COALESCE(unit, ''), ', ' ORDER BY name) || \
        ', PostgreSQL ' || current_setting('server_version') AS s FROM pg_settings WHERE name IN \
        ('synchronous_commit', 'fsync', 'full_page_writes', 'wal_level', 'autovacuum', 'shared_buffers', \
         'effective_cache_size', 'max_wal_size', 'checkpoint_timeout', 'default_transaction_isolation', 'work_mem')";
    const SIZE: &'static str = "SELECT pg_size_pretty(pg_total_relation_size('done_jobs')) || ' (heap ' || \
        pg_size_pretty(pg_relation_size('done_jobs')) || ', indexes ' || pg_size_pretty(pg_indexes_size('done_jobs')) || ')' AS s";

    fn idiomatic(&mut self, f: &mut dyn FnMut(&mut Self) -> QueryResult<()>) -> QueryResult<()> {
        self.transaction(f)
    }

    fn fast_begin(&mut self) -> QueryResult<()> {
        // The simple query protocol: one round trip, as a prepared `BEGIN` would be.
        self.batch_execute("BEGIN")
    }

    fn fast_commit(&mut self) -> QueryResult<()> {
        self.batch_execute("COMMIT")
    }

    fn fast_rollback(&mut self) -> QueryResult<()> {
        self.batch_execute("ROLLBACK")
    }

    fn one_statement_replay(&mut self, key: &str, digest: &[u8; 32]) -> Option<QueryResult<()>> {
        let mut replay = || -> QueryResult<()> {
            self.fast_begin()?;
            let rows: Vec<crate::transport::Text> =
                crate::transport::ClaimOrRead { digest, key }.load(self)?;
            assert!(
                rows.len() == 1 && rows[0].s == "macro_job",
                "{key} was claimed before"
            );
            self.fast_commit()
        };
        Some(replay())
    }

    fn before_fill(&mut self) -> QueryResult<()> {
        self.batch_execute("SET work_mem = '256MB'; SET maintenance_work_mem = '512MB'")
    }

    fn outbox_fill_sql(from: u64, to: u64, delivered: bool) -> String {
        let (prefix, attempts, delivered_at) = outbox_kind(delivered);
        format!(
            "INSERT INTO outbox (message_id, topic, payload, job_key, created_at, available_at, attempts, delivered_at) \
             SELECT '{prefix}' || n, 'bench', '{{}}', 'bench:' || n, '2000-01-01 00:00:00', '2000-01-01 00:00:00', \
             {attempts}, {delivered_at} FROM generate_series({from}, {to} - 1) AS n"
        )
    }

    fn fill_sql(from: u64, to: u64, prefix: &str, job: &str, lapsed: bool, sorted: bool) -> String {
        format!(
            "INSERT INTO done_jobs (key_digest, job_key, job_name, done_at, expires_at) \
             SELECT sha256(convert_to('{prefix}:' || n, 'UTF8')), '{prefix}:' || n, '{job}', '2000-01-01 00:00:00', {} \
             FROM generate_series({from}, {to} - 1) AS n{}",
            expires(lapsed),
            if sorted { " ORDER BY 1" } else { "" }
        )
    }
}

impl BenchDb for MysqlConnection {
    const NAME: &'static str = "MariaDB";
    const KIND: Kind = Kind::Mysql;
    const TEXT: &'static str = "CHAR";
    common!(
        "BIGINT AUTO_INCREMENT PRIMARY KEY",
        "BINARY(32)",
        duplicate_key_error
    );
    const DROP_INDEXES: &'static str =
        "ALTER TABLE done_jobs DROP INDEX done_jobs_key_digest, DROP INDEX done_jobs_expires_at";
    const ADD_INDEXES: &'static str = "ALTER TABLE done_jobs ADD UNIQUE KEY done_jobs_key_digest (key_digest), \
        ADD INDEX done_jobs_expires_at (expires_at)";
    const SETTLE: &'static str = "ANALYZE TABLE done_jobs";
    // As PostgreSQL's `VACUUM`: the index entries a bulk fill or backoff left delete-marked are
    // purged before the rounds are timed (`innodb_max_purge_lag_wait = 0` waits for the purge of
    // every committed change), so the rows show the steady state of an outbox that changed
    // message by message, not a purge lag of 1,000,000 rows the bench made in one statement.
    const SETTLE_OUTBOX: &'static str =
        "SET GLOBAL innodb_max_purge_lag_wait = 0; ANALYZE TABLE outbox";
    const SETTINGS: &'static str = "SELECT CAST(CONCAT('innodb_flush_log_at_trx_commit=', @@innodb_flush_log_at_trx_commit, \
        ', sync_binlog=', @@sync_binlog, ', log_bin=', @@log_bin, ', binlog_format=', @@binlog_format, \
        ', innodb_buffer_pool_size=', @@innodb_buffer_pool_size DIV 1048576, 'M, innodb_flush_method=', @@innodb_flush_method, \
        ', innodb_doublewrite=', @@innodb_doublewrite, ', innodb_log_file_size=', @@innodb_log_file_size DIV 1048576, \
        'M, transaction_isolation=', @@tx_isolation, ', ', @@version) AS CHAR) AS s";
    const SIZE: &'static str = "SELECT CAST(CONCAT(ROUND((data_length + index_length) / 1048576), ' MB (data ', \
        ROUND(data_length / 1048576), ' MB, indexes ', ROUND(index_length / 1048576), ' MB, estimated)') AS CHAR) AS s \
        FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'done_jobs'";

    fn idiomatic(&mut self, f: &mut dyn FnMut(&mut Self) -> QueryResult<()>) -> QueryResult<()> {
        self.transaction(f)
    }

    fn fast_begin(&mut self) -> QueryResult<()> {
        Fixed::<Begin>::new().execute(self).map(drop)
    }

    fn fast_commit(&mut self) -> QueryResult<()> {
        Fixed::<Commit>::new().execute(self).map(drop)
    }

    fn fast_rollback(&mut self) -> QueryResult<()> {
        Fixed::<Rollback>::new().execute(self).map(drop)
    }

    fn before_fill(&mut self) -> QueryResult<()> {
        Ok(())
    }

    fn create_procedures(&mut self) -> QueryResult<()> {
        self.batch_execute(
            "CREATE PROCEDURE idempotent_bench_begin_job() BEGIN START TRANSACTION; SAVEPOINT idempotent_job; END",
        )?;
        self.batch_execute(
            "CREATE PROCEDURE idempotent_bench_commit_job() BEGIN RELEASE SAVEPOINT idempotent_job; COMMIT; END",
        )
    }

    fn call_begin_job(&mut self) -> QueryResult<()> {
        Fixed::<CallBeginJob>::new().execute(self).map(drop)
    }

    fn call_commit_job(&mut self) -> QueryResult<()> {
        Fixed::<CallCommitJob>::new().execute(self).map(drop)
    }

    fn check_in_transaction(&mut self) -> QueryResult<()> {
        let open: Vec<Count> = Fixed::<InTransaction>::new().load(self)?;
        assert_eq!(
            open.first().map(|r| r.n),
            Some(1),
            "still in the transaction"
        );
        Ok(())
    }

    const OTHER_PRUNE: &'static str = "REPEATABLE READ, read ids, delete by id";

    fn other_prune_batch(&mut self, batch: u32) -> QueryResult<u64> {
        let ids: Vec<Id> = diesel::sql_query(format!(
            "SELECT id FROM done_jobs WHERE expires_at <= UTC_TIMESTAMP(6) ORDER BY expires_at LIMIT {batch}"
        ))
        .load(self)?;
        if ids.is_empty() {
            return Ok(0);
        }
        let list: Vec<String> = ids.iter().map(|r| r.id.to_string()).collect();
        let deleted = diesel::sql_query(format!(
            "DELETE FROM done_jobs WHERE id IN ({}) AND expires_at <= UTC_TIMESTAMP(6)",
            list.join(",")
        ))
        .execute(self)?;
        Ok(deleted as u64)
    }

    fn outbox_fill_sql(from: u64, to: u64, delivered: bool) -> String {
        let (prefix, attempts, delivered_at) = outbox_kind(delivered);
        format!(
            "INSERT INTO outbox (message_id, topic, payload, job_key, created_at, available_at, attempts, delivered_at) \
             SELECT CONCAT('{prefix}', seq), 'bench', '{{}}', CONCAT('bench:', seq), '2000-01-01 00:00:00', \
             '2000-01-01 00:00:00', {attempts}, {delivered_at} FROM seq_{from}_to_{}",
            to - 1
        )
    }

    fn fill_sql(from: u64, to: u64, prefix: &str, job: &str, lapsed: bool, sorted: bool) -> String {
        format!(
            "INSERT INTO done_jobs (key_digest, job_key, job_name, done_at, expires_at) \
             SELECT UNHEX(SHA2(CONCAT('{prefix}:', seq), 256)), CONCAT('{prefix}:', seq), '{job}', '2000-01-01 00:00:00', {} \
             FROM seq_{from}_to_{}{}",
            expires(lapsed),
            to - 1,
            if sorted { " ORDER BY 1" } else { "" }
        )
    }
}

fn expires(lapsed: bool) -> &'static str {
    if lapsed {
        "'2000-01-02 00:00:00'"
    } else {
        "NULL"
    }
}

/// The message ids' prefix, the attempts and `delivered_at` of the outbox messages
/// [`BenchDb::outbox_fill_sql`] inserts.
fn outbox_kind(delivered: bool) -> (&'static str, u8, &'static str) {
    if delivered {
        ("bench-delivered-", 1, "'2000-01-02 00:00:00'")
    } else {
        ("bench-pending-", 0, "NULL")
    }
}
