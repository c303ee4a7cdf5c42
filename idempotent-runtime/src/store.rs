//! The store: the handful of statements a job needs, per connection type.
//!
//! [`JobStore`] is implemented for each Diesel connection type this crate supports. The statements
//! are Diesel DSL, so they are prepared once per connection and cached: a fresh claim is one
//! `INSERT`, a replay one `INSERT` that inserts nothing plus one `SELECT`.
//!
//! The claim follows the rule from the
//! <a href="https://agentwranglers.se/playbook/scaling/background-jobs-and-queues/idempotent-jobs">Agent Wranglers scaling playbook</a>:
//! record the key under a unique constraint in the same transaction as the work, and skip when it
//! exists.

use chrono::NaiveDateTime;
use diesel::connection::{AnsiTransactionManager, Connection};
use diesel::result::{DatabaseErrorKind, Error as DieselError, QueryResult};

/// Whether the job's transaction is the outermost one or a savepoint inside the caller's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nesting {
    /// The job opened the transaction: its commit is the real commit.
    Outermost,
    /// The caller was already in a transaction: the job runs in a savepoint and its claim commits
    /// when the caller's transaction does.
    Savepoint,
}

/// What the runtime writes when it claims a key.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    /// SHA-256 of the key: the primary key of `done_jobs`.
    pub digest: &'a [u8; 32],
    /// The readable key.
    pub key: &'a str,
    /// The claiming job's name.
    pub job: &'a str,
    /// The fingerprint of the inputs that must match on a replay.
    pub fingerprint: Option<&'a [u8]>,
    /// The worker's clock, UTC.
    pub now: NaiveDateTime,
    /// When the claim lapses, if it does.
    pub expires_at: Option<NaiveDateTime>,
}

/// An outbox message as [`outbox::push`](crate::outbox::push) writes it.
#[derive(Debug, Clone, Copy)]
pub struct NewOutboxMessage<'a> {
    /// Stable across reruns of the pushing job.
    pub message_id: &'a str,
    /// What kind of message it is.
    pub topic: &'a str,
    /// The payload as JSON.
    pub payload: &'a str,
    /// The pushing job's key.
    pub job_key: &'a str,
    /// The worker's clock, UTC.
    pub now: NaiveDateTime,
}

/// A `done_jobs` row as the claim reads it back.
#[derive(Debug, Clone, PartialEq, Eq, diesel::Queryable)]
pub struct DoneRow {
    /// The job that claimed the key.
    pub job_name: String,
    /// The stored result (JSON), if any.
    pub result: Option<String>,
    /// The stored fingerprint, if any.
    pub fingerprint: Option<Vec<u8>>,
    /// When the claim lapses, if it does.
    pub expires_at: Option<NaiveDateTime>,
}

/// What claiming a key found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimState {
    /// The key was free (or its claim had lapsed) and is now claimed by this transaction.
    Fresh,
    /// The key was already claimed; the row says by whom and with what result.
    Done(DoneRow),
}

/// The statements the runtime needs from a connection, implemented for `SqliteConnection`,
/// `PgConnection` and `MysqlConnection` (with their features).
///
/// You do not call these yourself; [`run`](crate::run) and the `#[idempotent_job]` attribute do.
/// Every method runs inside the job's transaction.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a database connection `idempotent-jobs` can claim jobs on",
    label = "a job needs a Diesel connection here",
    note = "use `SqliteConnection`, `PgConnection` or `MysqlConnection` (each behind its cargo feature), or a pooled connection that derefs to one"
)]
pub trait JobStore: Connection<TransactionManager = AnsiTransactionManager> {
    /// Opens the job's transaction: on SQLite `BEGIN IMMEDIATE` (take the write lock first: a
    /// deferred transaction that reads and then writes fails at once with "database is locked"),
    /// elsewhere a plain `BEGIN` (see `begin::POSTGRES` on isolation levels). Inside a caller's
    /// transaction, opens a savepoint instead.
    fn begin_job(&mut self) -> QueryResult<Nesting>;

    /// Inserts the claim. `Ok(true)`: inserted; `Ok(false)`: the key exists (and, if another
    /// transaction holds it, that transaction has finished).
    fn insert_claim(&mut self, claim: &Claim<'_>) -> QueryResult<bool>;

    /// Reads the row of a claimed key (on MySQL with a locking read, which sees the latest committed
    /// row where a REPEATABLE READ snapshot might not).
    fn find_claim(&mut self, digest: &[u8; 32]) -> QueryResult<Option<DoneRow>>;

    /// Takes over a claim that has lapsed: `Ok(true)` if this transaction now holds it.
    fn renew_lapsed_claim(&mut self, claim: &Claim<'_>) -> QueryResult<bool>;

    /// Stores the handler's result in the claimed row.
    fn record_result(&mut self, digest: &[u8; 32], result: &str) -> QueryResult<()>;

    /// Inserts an outbox message (inside the job's transaction).
    fn insert_outbox(&mut self, message: &NewOutboxMessage<'_>) -> QueryResult<()>;

    /// Deletes up to `limit` claims that lapsed before `now`, in one statement of its own; returns
    /// how many it deleted.
    fn prune_lapsed(&mut self, now: NaiveDateTime, limit: i64) -> QueryResult<usize>;

    /// Errors after which the whole transaction can simply be tried again (SQLite busy, deadlocks).
    fn is_transient(error: &DieselError) -> bool;

    /// Runs the embedded migrations that create this backend's tables, if they have not run yet.
    fn run_migrations(&mut self) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
}

/// Claims `claim.digest` in the open transaction: insert, or read what is there.
pub(crate) fn claim<C: JobStore>(conn: &mut C, claim: &Claim<'_>) -> QueryResult<ClaimState> {
    // Each turn either claims, or finds a live row; a row that vanishes (pruned) or lapses between
    // our statements sends us round again. Three turns cover every interleaving of two writers.
    for _ in 0..3 {
        if conn.insert_claim(claim)? {
            return Ok(ClaimState::Fresh);
        }
        match conn.find_claim(claim.digest)? {
            Some(row) if row.expires_at.is_none_or(|at| at > claim.now) => {
                return Ok(ClaimState::Done(row));
            }
            Some(_lapsed) if conn.renew_lapsed_claim(claim)? => return Ok(ClaimState::Fresh),
            // Renewed by another worker first, or pruned between our statements: go round.
            Some(_) | None => {}
        }
    }
    Err(claim_kept_changing())
}

/// A key that vanished or lapsed under three claims in a row: treated as a serialization failure,
/// so the whole transaction is tried again.
pub(crate) fn claim_kept_changing() -> DieselError {
    DieselError::DatabaseError(
        DatabaseErrorKind::SerializationFailure,
        Box::new(String::from(
            "the claimed key kept changing under the claim (pruned or renewed by other workers)",
        )),
    )
}

/// Opens a transaction with `sql`, or a savepoint when the caller already holds one.
pub(crate) fn begin_with<C>(conn: &mut C, sql: &str) -> QueryResult<Nesting>
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
{
    match AnsiTransactionManager::begin_transaction_sql(conn, sql) {
        Ok(()) => Ok(Nesting::Outermost),
        Err(DieselError::AlreadyInTransaction) => {
            <AnsiTransactionManager as diesel::connection::TransactionManager<C>>::begin_transaction(
                conn,
            )?;
            Ok(Nesting::Savepoint)
        }
        Err(e) => Err(e),
    }
}

/// The statements, as Diesel DSL, written once for every backend and for sync and async
/// connections alike; `$($aw)*` is empty for a sync connection and `.await` for an async one.
macro_rules! statements {
    (insert_claim, $conn:expr, $claim:expr, on_conflict_do_nothing, [$($aw:tt)*]) => {{
        use $crate::schema::done_jobs::dsl as dj;
        // A conflicting row from a transaction still in flight makes this wait for it; when that
        // transaction commits we insert nothing, when it rolls back we insert.
        let insert = diesel::insert_into(dj::done_jobs)
            .values(statements!(values, $claim))
            .on_conflict_do_nothing();
        let inserted = $crate::store::CachedClaim(insert).execute($conn)$($aw)*?;
        Ok(inserted == 1)
    }};
    (insert_claim, $conn:expr, $claim:expr, duplicate_key_error, [$($aw:tt)*]) => {{
        use $crate::schema::done_jobs::dsl as dj;
        // A plain INSERT: the duplicate-key error is the "already done" signal, and on MySQL it
        // rolls back only this statement. Not `INSERT IGNORE` (it turns other errors, such as
        // truncation, into warnings: a false "already done"), and not `ON DUPLICATE KEY UPDATE`
        // (with Diesel's CLIENT_FOUND_ROWS it reports 1 row either way). A conflicting row from
        // a transaction in flight makes this wait for it, as on PostgreSQL.
        match diesel::insert_into(dj::done_jobs)
            .values(statements!(values, $claim))
            .execute($conn)$($aw)*
        {
            Ok(inserted) => Ok(inserted == 1),
            Err(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::UniqueViolation,
                _,
            )) => Ok(false),
            Err(error) => Err(error),
        }
    }};
    (values, $claim:expr) => {
        (
            dj::key_digest.eq(&$claim.digest[..]),
            dj::job_key.eq($claim.key),
            dj::job_name.eq($claim.job),
            dj::fingerprint.eq($claim.fingerprint),
            dj::done_at.eq($claim.now),
            dj::expires_at.eq($claim.expires_at),
        )
    };
    (find_claim, $conn:expr, $digest:expr, $lock:ident, [$($aw:tt)*]) => {{
        use $crate::schema::done_jobs::dsl as dj;
        let query = dj::done_jobs
            .filter(dj::key_digest.eq(&$digest[..]))
            .select((dj::job_name, dj::result, dj::fingerprint, dj::expires_at));
        statements!(lock, query, $lock)
            .first::<$crate::store::DoneRow>($conn)$($aw)*
            .optional()
    }};
    (lock, $query:expr, plain) => { $query };
    // A locking read: under MySQL's REPEATABLE READ a plain SELECT may read an older snapshot and
    // miss the row whose duplicate we just hit.
    (lock, $query:expr, for_update) => { $query.for_update() };
    (renew_lapsed_claim, $conn:expr, $claim:expr, [$($aw:tt)*]) => {{
        use $crate::schema::done_jobs::dsl as dj;
        let renewed = diesel::update(
            dj::done_jobs
                .filter(dj::key_digest.eq(&$claim.digest[..]))
                .filter(dj::expires_at.le($claim.now)),
        )
        .set((
            dj::job_key.eq($claim.key),
            dj::job_name.eq($claim.job),
            dj::fingerprint.eq($claim.fingerprint),
            dj::result.eq(None::<&str>),
            dj::done_at.eq($claim.now),
            dj::expires_at.eq($claim.expires_at),
        ))
        .execute($conn)$($aw)*?;
        Ok(renewed == 1)
    }};
    (prune_lapsed, $conn:expr, $sql:expr, $now:expr, $limit:expr, [$($aw:tt)*]) => {
        diesel::sql_query($sql)
            .bind::<diesel::sql_types::Timestamp, _>($now)
            .bind::<diesel::sql_types::BigInt, _>($limit)
            .execute($conn)$($aw)*
    };
    (insert_outbox, $conn:expr, $m:expr, [$($aw:tt)*]) => {{
        use $crate::schema::outbox::dsl as o;
        diesel::insert_into(o::outbox)
            .values((
                o::message_id.eq($m.message_id),
                o::topic.eq($m.topic),
                o::payload.eq($m.payload),
                o::job_key.eq(Some($m.job_key)),
                o::created_at.eq($m.now),
                o::available_at.eq($m.now),
            ))
            .execute($conn)$($aw)*
            .map(drop)
    }};
    (record_result, $conn:expr, $digest:expr, $result:expr, [$($aw:tt)*]) => {{
        use $crate::schema::done_jobs::dsl as dj;
        diesel::update(dj::done_jobs.filter(dj::key_digest.eq(&$digest[..])))
            .set(dj::result.eq($result))
            .execute($conn)$($aw)*?;
        Ok(())
    }};
}

/// The claim's `INSERT ... ON CONFLICT DO NOTHING` with a static query id. Diesel 2.3 gives
/// upserts none, so it would build the statement's SQL text on every call to look up its prepared
/// statement (measured: about 7,000 instructions, 2 µs, per claim); with this id it finds the
/// statement by type. Sound because the claim insert has one shape per backend, and prepared
/// statement caches are per connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CachedClaim<Q>(pub(crate) Q);

/// The query id of [`CachedClaim`].
#[allow(dead_code)] // only named as a type
pub(crate) struct CachedClaimId;

impl<Q> diesel::query_builder::QueryId for CachedClaim<Q> {
    type QueryId = CachedClaimId;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<DB, Q> diesel::query_builder::QueryFragment<DB> for CachedClaim<Q>
where
    DB: diesel::backend::Backend,
    Q: diesel::query_builder::QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, pass: diesel::query_builder::AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.0.walk_ast(pass)
    }
}

impl<Q, Conn> diesel::RunQueryDsl<Conn> for CachedClaim<Q> {}

/// Implements [`JobStore`] for a sync connection type.
macro_rules! impl_job_store {
    (
        $conn:ty,
        migrations: $migrations:expr,
        migration_lock: $migration_lock:expr,
        begin: $begin:expr,
        insert: $insert:ident,
        find: $lock:ident,
        prune: $prune:expr,
        transient: |$err:ident| $transient:expr $(,)?
    ) => {
        impl $crate::store::JobStore for $conn {
            fn begin_job(&mut self) -> diesel::QueryResult<$crate::store::Nesting> {
                $crate::store::begin_with(self, $begin)
            }

            fn insert_claim(
                &mut self,
                claim: &$crate::store::Claim<'_>,
            ) -> diesel::QueryResult<bool> {
                use diesel::prelude::*;
                statements!(insert_claim, self, claim, $insert, [])
            }

            fn find_claim(
                &mut self,
                digest: &[u8; 32],
            ) -> diesel::QueryResult<Option<$crate::store::DoneRow>> {
                use diesel::prelude::*;
                statements!(find_claim, self, digest, $lock, [])
            }

            fn renew_lapsed_claim(
                &mut self,
                claim: &$crate::store::Claim<'_>,
            ) -> diesel::QueryResult<bool> {
                use diesel::prelude::*;
                statements!(renew_lapsed_claim, self, claim, [])
            }

            fn record_result(
                &mut self,
                digest: &[u8; 32],
                result: &str,
            ) -> diesel::QueryResult<()> {
                use diesel::prelude::*;
                statements!(record_result, self, digest, result, [])
            }

            fn insert_outbox(
                &mut self,
                message: &$crate::store::NewOutboxMessage<'_>,
            ) -> diesel::QueryResult<()> {
                use diesel::prelude::*;
                statements!(insert_outbox, self, message, [])
            }

            fn prune_lapsed(
                &mut self,
                now: chrono::NaiveDateTime,
                limit: i64,
            ) -> diesel::QueryResult<usize> {
                use diesel::prelude::*;
                statements!(prune_lapsed, self, $prune, now, limit, [])
            }

            fn is_transient($err: &diesel::result::Error) -> bool {
                $transient
            }

            fn run_migrations(&mut self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
                $crate::store::with_migration_lock(self, $migration_lock, |conn| {
                    diesel_migrations::MigrationHarness::run_pending_migrations(conn, $migrations)
                        .map(drop)
                })
            }
        }
    };
}

/// How migrations keep out of each other's way when several workers start at once (two
/// `CREATE TABLE`s of one table race and fail on PostgreSQL).
#[derive(Debug, Clone, Copy)]
#[allow(dead_code)] // each variant is used by the backends that are compiled in
pub(crate) enum MigrationLock {
    /// In one `BEGIN IMMEDIATE` transaction: SQLite's single writer.
    Immediate,
    /// In one transaction that first takes this lock (released by the commit): PostgreSQL, whose
    /// DDL is transactional.
    Transaction(&'static str),
    /// Between a session lock and its release: MySQL, whose DDL commits by itself.
    Session(&'static str, &'static str),
}

#[allow(dead_code)] // used by the backends that are compiled in
pub(crate) mod migration_lock {
    /// An advisory lock held until the migrations' transaction ends.
    pub const POSTGRES: &str = "SELECT pg_advisory_xact_lock(7307305512431843179)";
    /// A named lock, waited for up to ten minutes.
    pub const MYSQL_LOCK: &str = "SELECT GET_LOCK('idempotent_migrations', 600)";
    /// Its release.
    pub const MYSQL_UNLOCK: &str = "SELECT RELEASE_LOCK('idempotent_migrations')";
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Runs `migrate` under `lock`, retrying while the database is busy.
#[allow(dead_code)] // used by the backends that are compiled in
pub(crate) fn with_migration_lock<C: JobStore>(
    conn: &mut C,
    lock: MigrationLock,
    mut migrate: impl FnMut(&mut C) -> Result<(), BoxError>,
) -> Result<(), BoxError> {
    use diesel::connection::TransactionManager as _;
    match lock {
        MigrationLock::Session(lock, unlock) => {
            crate::run::retry_transient::<C, _>(|| conn.batch_execute(lock))?;
            let result = migrate(conn);
            let released = conn.batch_execute(unlock);
            result.and(released.map_err(Into::into))
        }
        MigrationLock::Immediate | MigrationLock::Transaction(_) => {
            crate::run::retry_transient::<C, _>(|| {
                conn.begin_job()?;
                if let MigrationLock::Transaction(lock) = lock
                    && let Err(error) = conn.batch_execute(lock)
                {
                    let _ = AnsiTransactionManager::rollback_transaction(conn);
                    return Err(error);
                }
                Ok(())
            })?;
            match migrate(conn) {
                Ok(()) => AnsiTransactionManager::commit_transaction(conn).map_err(Into::into),
                Err(error) => {
                    let _ = AnsiTransactionManager::rollback_transaction(conn);
                    Err(error)
                }
            }
        }
    }
}

/// How each backend opens a job's transaction; see [`JobStore::begin_job`].
#[allow(dead_code)] // used by the backends that are compiled in
pub(crate) mod begin {
    /// The write lock first.
    pub const SQLITE: &str = "BEGIN IMMEDIATE";
    /// The session's isolation level: READ COMMITTED unless changed, where a waiter sees the
    /// winner's row at once. At stricter levels the waiter's serialization failure is retried from
    /// `BEGIN`, and the retry sees the row. (`BEGIN ISOLATION LEVEL READ COMMITTED` measured 10 µs
    /// slower per job than `BEGIN`.)
    pub const POSTGRES: &str = "BEGIN";
    /// The server's isolation level; the claim's read is a locking read.
    pub const MYSQL: &str = "BEGIN";
}

/// One batch of pruning, per backend: lapsed claims, at most `$2` of them, oldest first where the
/// backend allows it. Each runs as a statement of its own, so no batch holds locks for long.
#[allow(dead_code)] // used by the backends that are compiled in
pub(crate) mod prune {
    /// Through the partial index on `expires_at`.
    pub const SQLITE: &str = "DELETE FROM done_jobs WHERE key_digest IN \
        (SELECT key_digest FROM done_jobs WHERE expires_at <= ? LIMIT ?)";
    /// Rows a claim is renewing right now are skipped, not waited for.
    pub const POSTGRES: &str = "DELETE FROM done_jobs WHERE key_digest IN \
        (SELECT key_digest FROM done_jobs WHERE expires_at <= $1 \
         ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)";
    /// MySQL takes no `LIMIT` in an `IN` subquery, but does in `DELETE`.
    pub const MYSQL: &str =
        "DELETE FROM done_jobs WHERE expires_at <= ? ORDER BY expires_at LIMIT ?";
}

/// Whether a PostgreSQL error is worth retrying the whole transaction for.
#[allow(dead_code)] // used by the backends that are compiled in
pub(crate) fn pg_is_transient(error: &DieselError) -> bool {
    matches!(
        error,
        DieselError::DatabaseError(DatabaseErrorKind::SerializationFailure, _)
    ) || database_message(error).is_some_and(|m| m.contains("deadlock detected"))
}

/// Whether a MySQL error is worth retrying the whole transaction for: 1213 (deadlock; a third
/// waiter on a key whose first holder rolled back gets it) rolls the whole transaction back, 1205
/// (lock wait timeout) only the statement. Both are retried from BEGIN: nothing has run yet.
#[allow(dead_code)] // used by the backends that are compiled in
pub(crate) fn mysql_is_transient(error: &DieselError) -> bool {
    matches!(
        error,
        DieselError::DatabaseError(DatabaseErrorKind::SerializationFailure, _)
    ) || database_message(error).is_some_and(|m| {
        // diesel-async's MySQL driver reports these by message only.
        m.contains("Deadlock found") || m.contains("Lock wait timeout")
    })
}

/// Whether a SQLite error is worth retrying the whole transaction for: another connection holds
/// the write lock.
#[allow(dead_code)] // used by the backends that are compiled in
pub(crate) fn sqlite_is_transient(error: &DieselError) -> bool {
    database_message(error)
        .is_some_and(|m| m.contains("database is locked") || m.contains("database table is locked"))
}

/// The text of a database error, for backends that report transient conditions only in words.
#[allow(dead_code)] // used by the backends that are compiled in
pub(crate) fn database_message(error: &DieselError) -> Option<&str> {
    match error {
        DieselError::DatabaseError(_, info) => Some(info.message()),
        _ => None,
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use diesel::sqlite::SqliteConnection;
    use diesel_migrations::{EmbeddedMigrations, embed_migrations};

    const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

    impl_job_store!(
        SqliteConnection,
        migrations: MIGRATIONS,
        migration_lock: super::MigrationLock::Immediate,
        begin: super::begin::SQLITE,
        insert: on_conflict_do_nothing,
        find: plain,
        prune: super::prune::SQLITE,
        transient: |error| super::sqlite_is_transient(error),
    );
}

#[cfg(feature = "postgres")]
mod pg {
    use diesel::pg::PgConnection;
    use diesel_migrations::{EmbeddedMigrations, embed_migrations};

    const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

    impl_job_store!(
        PgConnection,
        migrations: MIGRATIONS,
        migration_lock: super::MigrationLock::Transaction(super::migration_lock::POSTGRES),
        begin: super::begin::POSTGRES,
        insert: on_conflict_do_nothing,
        find: plain,
        prune: super::prune::POSTGRES,
        transient: |error| super::pg_is_transient(error),
    );
}

#[cfg(feature = "mysql")]
mod mysql {
    use diesel::mysql::MysqlConnection;
    use diesel_migrations::{EmbeddedMigrations, embed_migrations};

    const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/mysql");

    impl_job_store!(
        MysqlConnection,
        migrations: MIGRATIONS,
        migration_lock: super::MigrationLock::Session(super::migration_lock::MYSQL_LOCK, super::migration_lock::MYSQL_UNLOCK),
        begin: super::begin::MYSQL,
        insert: duplicate_key_error,
        find: for_update,
        prune: super::prune::MYSQL,
        transient: |error| super::mysql_is_transient(error),
    );
}
