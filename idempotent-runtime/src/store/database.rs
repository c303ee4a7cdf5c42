//! [`Database`]: what the runtime needs from one database: its statements and what its errors mean.

use std::future::Future;

use diesel::backend::Backend;
use diesel::result::{Error as DieselError, QueryResult};

use super::*;
use crate::sql::Statement;

/// One database: all of its statements and what its errors mean. See the module docs.
///
/// Every time that decides anything (a claim's lapse, a lease, a retry's availability, pruning) is
/// taken from the database's clock inside the statement, never from the worker's: workers whose
/// clocks disagree still agree on what has lapsed.
pub trait Database: Sized + Send + Sync + 'static {
    /// Whether DDL is part of the transaction it runs in (PostgreSQL, SQLite), rather than
    /// committing by itself (MySQL): then a migration is all or nothing.
    #[doc(hidden)]
    const DDL_IN_TRANSACTION: bool = true;

    /// Whether any failed statement aborts the whole transaction, so that every later statement
    /// is refused until it ends (PostgreSQL).
    #[doc(hidden)]
    const A_FAILED_STATEMENT_ABORTS: bool = false;

    /// Whether the server can end a transaction under a session that goes on, each later
    /// statement then committing on its own while Diesel still counts the transaction open
    /// (MySQL and MariaDB: a deadlock or a Galera conflict rolls back the whole transaction, and a
    /// caller may catch it and go on). A job called inside such a caller's transaction checks at
    /// its savepoint that one is open: the runtime's mark is rolled back to as soon as it is set,
    /// in the same batch, which fails where no transaction holds it
    /// ([`crate::transaction::enclosing_mark`]).
    #[doc(hidden)]
    const TRANSACTION_MAY_END_UNDER_THE_SESSION: bool = false;

    /// Whether a transaction that writes takes the whole database's write lock at `BEGIN`
    /// (SQLite): then a claim waits there, not for the key's row.
    #[doc(hidden)]
    const WRITE_LOCK_AT_BEGIN: bool = false;

    /// Whether `error` says the connection itself failed (closed, reset, gone away): whatever was in
    /// flight may or may not have reached the server.
    #[doc(hidden)]
    fn connection_lost(error: &DieselError) -> bool {
        let _ = error;
        false
    }

    /// `error`, from a statement of the runtime's on `conn`, in terms the runtime's checks know
    /// whatever the language of the server's messages: MySQL's are the session's `lc_messages`
    /// ("Beim Warten auf eine Sperre wurde die zulässige Wartezeit überschritten"), and Diesel
    /// keeps no error number. By default `error` as it is.
    #[doc(hidden)]
    fn in_known_terms<C: Store<Db = Self>>(
        conn: &mut C,
        error: DieselError,
    ) -> impl Future<Output = DieselError> + Send {
        let _ = conn;
        async move { error }
    }

    /// The most characters an outbox topic may have, where the table bounds it.
    #[doc(hidden)]
    const MAX_TOPIC_CHARS: Option<usize> = None;

    /// The most bytes of values (a result, a key, an outbox message) the database takes in one
    /// statement, and the limit that comes from, when `bytes` is more; `None` when they fit.
    #[doc(hidden)]
    fn too_large_for_a_statement<C: Store<Db = Self>>(
        conn: &mut C,
        bytes: usize,
    ) -> impl Future<Output = QueryResult<Option<StatementLimit>>> + Send {
        let _ = (conn, bytes);
        async { Ok(None) }
    }

    /// The `BEGIN` that waits at most `limit` for the database's write lock, where `BEGIN` takes
    /// it (SQLite); `None` elsewhere.
    #[doc(hidden)]
    fn bounded_begin_sql(limit: std::time::Duration) -> Option<String> {
        let _ = limit;
        None
    }

    /// What puts the connection's wait back when a [`bounded_begin_sql`](Self::bounded_begin_sql)
    /// failed part-way (the bound must not outlive the attempt).
    #[doc(hidden)]
    fn bounded_begin_failed_sql() -> Option<&'static str> {
        None
    }

    /// Whether a rollback that [`rollback_left`](Self::rollback_left) says could not undo
    /// everything may have left the claim too (SQLite with `journal_mode = OFF`); on MySQL the
    /// claim's table is InnoDB, and only the body's other tables keep their rows.
    #[doc(hidden)]
    const PARTIAL_ROLLBACK_MAY_KEEP_THE_CLAIM: bool = true;

    /// Sent just before the rollback of a job's own transaction, for [`rollback_left`]
    /// (Self::rollback_left): MySQL clears the session's list of warnings, which a `ROLLBACK`
    /// that warns nothing leaves as the body's last statement left it.
    #[doc(hidden)]
    fn before_rollback(
        conn: &mut impl Store<Db = Self>,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let _ = conn;
        async { Ok(()) }
    }

    /// What the rollback just done could not undo, when it could not undo everything: SQLite
    /// with `journal_mode = OFF` (its `ROLLBACK` "behaves in an undefined way"), a MySQL table
    /// that is not transactional (warning 1196; known only when `cleared`, after
    /// [`before_rollback`](Self::before_rollback)). Asked only after a job's transaction was
    /// rolled back (a failed or panicked body, a failed step after it), as the next statement.
    #[doc(hidden)]
    fn rollback_left(
        conn: &mut impl Store<Db = Self>,
        cleared: bool,
    ) -> impl Future<Output = QueryResult<Option<&'static str>>> + Send {
        let _ = (conn, cleared);
        async { Ok(None) }
    }

    /// Whether [`session_in_transaction`](Self::session_in_transaction) asks the server (MySQL,
    /// MariaDB) rather than answering `false`.
    #[doc(hidden)]
    const KNOWS_SESSION_TRANSACTION: bool = false;

    /// Whether `error`, a statement's failure, rolled back the whole transaction by itself
    /// (SQLite on a full disk, an I/O error or memory run out; MySQL and MariaDB on a deadlock,
    /// and on a lock wait timeout with `innodb_rollback_on_timeout`): where a statement of the
    /// runtime's own fails so and the job's transaction is then found ended, it ended with that
    /// statement, not by the body's doing. By default never.
    #[doc(hidden)]
    fn rolled_back_whole(error: &DieselError) -> bool {
        let _ = error;
        false
    }

    /// Asked when a job's body returned `Err`, before any statement of the runtime's: whether the
    /// body's last statement failed with an error that rolled back the whole transaction. Where
    /// the database does that on its own (MySQL and MariaDB, on a deadlock, and on a lock wait
    /// timeout with `innodb_rollback_on_timeout`) and the session then runs each statement as one
    /// of its own, a body that returned at that failure ran nothing outside the rolled-back
    /// transaction. MySQL and MariaDB keep a statement's conditions until a statement that uses
    /// a table (`GET DIAGNOSTICS`); by default `false`, with no round trip.
    #[doc(hidden)]
    fn body_stopped_at_a_failure<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = bool> + Send {
        let _ = conn;
        async { false }
    }

    /// Asked on an error path only, once a job's transaction has turned out not to be its own and
    /// before the runtime ends it: whether a transaction is still open on the session.
    /// `Some(true)`: one is (aborted, or with the job's savepoint gone), and the runtime's rollback
    /// takes what the body wrote in it. `Some(false)`: none is; a statement of the body, or the
    /// database, ended the job's transaction, and what the body ran after that ran outside any
    /// transaction, each statement committed on its own. `None`: no answer. By default `None`.
    #[doc(hidden)]
    fn transaction_still_open<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = Option<bool>> + Send {
        let _ = conn;
        async { None }
    }

    /// Asked with [`transaction_still_open`](Self::transaction_still_open) on the same error
    /// paths, where it answered `Some(true)`: whether the open transaction holds all that the body
    /// ran after the job's transaction was found not to be its own, so that none of it ran outside
    /// any transaction. `Some(true)`: it is the job's still (PostgreSQL: its transaction-local
    /// mark is set, or, aborted, it still has the job's savepoint). `Some(false)`: it may not be
    /// (a statement began it: the body's `BEGIN` after a `ROLLBACK` or a deadlock it caught, a
    /// nested job's; or the body released the job's savepoint in an aborted transaction), and what
    /// the body ran before may have run outside any. MySQL answers `Some(false)` too: under
    /// `autocommit = 0` the session opens a transaction at the body's next statement by itself,
    /// but a `BEGIN` or `COMMIT` of the body's then commits it, which nothing shows afterwards.
    /// By default `Some(false)`.
    #[doc(hidden)]
    fn open_transaction_holds_the_rest<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = Option<bool>> + Send {
        let _ = conn;
        async { Some(false) }
    }

    /// Whether the connection's answers are in step with its statements: a statement that echoes
    /// `nonce` reads it back. Asked after a job's body, before the runtime's next statement, where
    /// statements are not cancel-safe (`Store::STATEMENTS_CANCEL_SAFE`: diesel-async's MySQL
    /// connection), so that a statement the body dropped midway, whose answer comes later, is
    /// found before that answer is read as the commit's. `Ok(true)` elsewhere, with nothing sent.
    ///
    /// An error read for the echo is another statement's answer, or the echo's own (a deadlock, a
    /// Galera brute-force abort of the transaction): a second echo tells which. In step, the error
    /// is the echo's own, returned as it is.
    #[doc(hidden)]
    fn answers_in_step<C: Store<Db = Self>>(
        conn: &mut C,
        nonce: i64,
    ) -> impl Future<Output = QueryResult<bool>> + Send {
        let _ = (conn, nonce);
        async { Ok(true) }
    }

    /// Whether the session holds a transaction that Diesel does not know of, before a transaction
    /// of the runtime's own begins (MySQL with `autocommit = 0` and statements pending: a `BEGIN`
    /// would commit them).
    #[doc(hidden)]
    fn session_in_transaction<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<bool>> + Send {
        let _ = conn;
        async { Ok(false) }
    }

    /// How a top-level transaction of the runtime's own commits, sent as text (the prepared and
    /// the stored-procedure forms say the same). MySQL and MariaDB: `COMMIT AND NO CHAIN NO
    /// RELEASE`, so that a session's `completion_type` neither opens the next transaction at once
    /// (`CHAIN`: the caller's later writes in autocommit mode would never commit) nor ends the
    /// session (`RELEASE`) when a job, a forget or a prune commits.
    #[doc(hidden)]
    const COMMIT: &'static str = "COMMIT";

    /// How a top-level transaction of the runtime's own rolls back; see [`COMMIT`](Self::COMMIT).
    #[doc(hidden)]
    const ROLLBACK: &'static str = "ROLLBACK";

    /// How the runtime begins a transaction as text. MySQL and MariaDB: `START TRANSACTION`,
    /// which MariaDB's `sql_mode = 'ORACLE'` does not read as the start of a PL/SQL block.
    #[doc(hidden)]
    const BEGIN: &'static str = "BEGIN";

    /// How the runtime begins, as text, a transaction of its own that Diesel does not count
    /// (a take-back after a statement of the body ended a caller's transaction, which Diesel
    /// still counts). SQLite: its `BEGIN IMMEDIATE` with the busy timeout set first.
    #[doc(hidden)]
    const BEGIN_UNCOUNTED: &'static str = Self::BEGIN;

    /// The job's savepoint released and the transaction committed in one text batch, the commit
    /// only when the release succeeded; see [`COMMIT`](Self::COMMIT).
    #[doc(hidden)]
    fn release_and_commit_sql() -> &'static str {
        "RELEASE SAVEPOINT idempotent_job; COMMIT"
    }

    /// SQL that puts the session back as it was after a migration step failed part way (MySQL:
    /// the `sql_mode` the routines' step sets for their creation).
    #[doc(hidden)]
    const AFTER_FAILED_STEP: Option<&'static str> = None;

    /// Whether a step's DDL failed because another migration made the same object meanwhile.
    #[doc(hidden)]
    fn made_concurrently(error: &DieselError) -> bool {
        let _ = error;
        false
    }

    /// Whether `error` says the role lacks a privilege (a migration step that only speeds jobs
    /// up is then left out, with a warning, rather than failing `migrate`).
    #[doc(hidden)]
    fn privilege_denied(error: &DieselError) -> bool {
        let _ = error;
        false
    }

    /// Whether every one of the stored procedures `names` exists in the connection's database
    /// (only MySQL's schema has any).
    #[doc(hidden)]
    fn routines_exist<C: Store<Db = Self>>(
        conn: &mut C,
        names: &[&str],
    ) -> impl Future<Output = QueryResult<bool>> + Send {
        let _ = conn;
        let none = names.is_empty();
        async move { Ok(none) }
    }

    /// Whether `error`, from releasing the job's savepoint and committing in one round trip
    /// ([`Store::release_and_commit`]), is the release's (no such savepoint, no transaction, an
    /// aborted transaction: the transaction is no longer the job's own) rather than the
    /// `COMMIT`'s. By default: an error of none of the kinds Diesel names; a failing `COMMIT` (a
    /// serialization failure, a deferred constraint) names its kind, and has ended the
    /// transaction.
    #[doc(hidden)]
    fn release_failed(error: &DieselError) -> bool {
        matches!(
            error,
            DieselError::DatabaseError(diesel::result::DatabaseErrorKind::Unknown, _)
        )
    }

    /// Whether `error`, which [`release_failed`](Self::release_failed) took for the release's,
    /// is the `COMMIT`'s own instead (PostgreSQL: a deferred constraint trigger's exception at the
    /// `COMMIT`), asked on `conn` before anything else is sent. When nothing of the run turns out
    /// committed, the call is then the `COMMIT`'s error, with its message, rather than the body's
    /// doing. By default never.
    #[doc(hidden)]
    fn commit_failed_instead<C: Store<Db = Self>>(
        conn: &mut C,
        error: &DieselError,
    ) -> impl Future<Output = bool> + Send {
        let _ = (conn, error);
        async { false }
    }

    /// [`table_exists`](Self::table_exists) asked with no transaction open (after a statement
    /// failed and its transaction rolled back). PostgreSQL asks in a transaction of its own:
    /// every statement the runtime prepares goes in one, for transaction poolers (`db::postgres`).
    #[doc(hidden)]
    fn table_exists_alone<C: Store<Db = Self>>(
        conn: &mut C,
        table: &str,
    ) -> impl Future<Output = QueryResult<bool>> + Send {
        Self::table_exists(conn, table)
    }

    /// Whether `error`, from [`begin_and_claim`](Self::begin_and_claim), says that the key is
    /// taken and that nothing is open: the claim's transaction ended with it (MySQL's
    /// `idempotent_begin_and_claim` rolls back on the key's duplicate). The key's row is then read
    /// outside any transaction, and replayed when it is live. By default never.
    #[doc(hidden)]
    fn taken_with_nothing_open(error: &DieselError) -> bool {
        let _ = error;
        false
    }

    /// Whether, after [`taken_with_nothing_open`](Self::taken_with_nothing_open), the key's row
    /// may be read outside any transaction: not on a MySQL session with `autocommit = 0`, where
    /// that read would open a transaction (and find nothing: reads there wait for a claim). By
    /// default always.
    #[doc(hidden)]
    fn read_after_taken(error: &DieselError) -> bool {
        let _ = error;
        true
    }

    /// Whether a redelivery's read before its claim, outside any transaction, may be sent now:
    /// it neither joins a transaction the session holds of its own (whose snapshot may be old)
    /// nor opens one that stays open (MySQL with `autocommit = 0`, where any read does). Asked
    /// where [`KNOWS_SESSION_TRANSACTION`](Self::KNOWS_SESSION_TRANSACTION); by default always,
    /// with no round trip.
    #[doc(hidden)]
    fn reads_outside_safely<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<bool>> + Send {
        let _ = conn;
        async { Ok(true) }
    }

    /// Whether `error`, from a job's `BEGIN` or its first claim, says that the session holds a
    /// transaction of its own that Diesel does not know of (a `BEGIN` sent as text): SQLite
    /// refuses the job's `BEGIN`; on PostgreSQL the `BEGIN` did nothing and the first claim
    /// found the transaction written already, and the runtime then sends
    /// [`LEAVE_CALLERS_TRANSACTION`](Self::LEAVE_CALLERS_TRANSACTION); MySQL and MariaDB refuse
    /// it before their `START TRANSACTION`, which would commit it. The job is refused with
    /// [`Error::InsideTransaction`](crate::Error::InsideTransaction). By default never.
    #[doc(hidden)]
    fn inside_callers_transaction(error: &DieselError) -> bool {
        let _ = error;
        false
    }

    /// Whether `error` is the database refusing a statement only because the transaction was
    /// aborted already, by an earlier failed statement ([`A_FAILED_STATEMENT_ABORTS`](Self::A_FAILED_STATEMENT_ABORTS);
    /// PostgreSQL's "current transaction is aborted", in the server's language), not a failure of
    /// the statement's own. By default never.
    #[doc(hidden)]
    fn refused_as_aborted(error: &DieselError) -> bool {
        let _ = error;
        false
    }

    /// The end of a job that returns `()` inside a caller's transaction, in one text batch where
    /// that saves a round trip: a statement that fails, its message holding `CLAIM_GONE`, when
    /// this run's claim (`digest`, `token`) is no longer in the transaction (a statement of the
    /// body rolled back to Diesel's savepoint, which comes before the claim), then the release
    /// of `mark` (the runtime's savepoint set before Diesel's, which ends the job). A batch stops
    /// at its first error, so the release runs only after the check held. `None` where the check
    /// and the release go as statements of their own (the result's `UPDATE` is the check).
    #[doc(hidden)]
    fn check_and_release(digest: &[u8; 32], token: i64, mark: &str) -> Option<String> {
        let _ = (digest, token, mark);
        None
    }

    /// Undoes what a job's `BEGIN` and claim did inside a transaction of the caller's (the job's
    /// savepoint, the claim's error), leaving the caller's transaction as it was.
    #[doc(hidden)]
    const LEAVE_CALLERS_TRANSACTION: &'static str = "";

    /// Whether the transaction just begun is in fact a transaction of the caller's that had
    /// written already (PostgreSQL answers a `BEGIN` inside a transaction with a warning only).
    #[doc(hidden)]
    fn begun_inside_another<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<bool>> + Send {
        let _ = conn;
        async { Ok(false) }
    }

    /// Sets the job's savepoint (`idempotent_job`) after its claim, in a transaction
    /// [`Store::begin_job`] opened [`Nesting::Unmarked`].
    #[doc(hidden)]
    fn set_job_savepoint<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        async move {
            conn.execute(Statement::<SetJobSavepoint, _>::new(()))
                .await
                .map(drop)
        }
    }

    /// Releases the job's savepoint (`idempotent_job`): fails when the transaction is no longer
    /// the job's own.
    #[doc(hidden)]
    fn release_job<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        async move {
            conn.execute(Statement::<ReleaseJob, _>::new(()))
                .await
                .map(drop)
        }
    }

    /// The session's character set settings that would change the text the runtime stores and
    /// reads back, as `name = value` (MySQL/MariaDB: any of `character_set_client`,
    /// `_connection`, `_results` that is not utf8mb4; PostgreSQL: `client_encoding` not UTF8);
    /// `None` where all is well, and on SQLite.
    #[doc(hidden)]
    fn session_charset<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<Option<String>>> + Send {
        let _ = conn;
        async { Ok(None) }
    }

    /// How far, in whole seconds, the session's clock is set apart from the server's (MySQL/MariaDB:
    /// `SET timestamp`, which the database's clock the runtime reads follows), where it is by a
    /// second or more; `None` where it is not, and on the other databases.
    #[doc(hidden)]
    fn session_clock_offset<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<Option<i64>>> + Send {
        let _ = conn;
        async { Ok(None) }
    }

    /// The runtime's tables that a temporary table of this session hides: one of the same name
    /// that the session's statements find first (PostgreSQL's `pg_temp`, searched before the
    /// search_path unless placed in it; a MySQL/MariaDB `TEMPORARY` table; SQLite's `temp`
    /// database). Asked by `verify` and `migrate` only: jobs do not check.
    #[doc(hidden)]
    fn shadowed_by_temporary<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<Vec<&'static str>>> + Send {
        let _ = conn;
        async { Ok(Vec::new()) }
    }

    /// SQLite: the runtime's tables that the connection finds in a database attached to it, not
    /// in its main one, with that database's name; `migrate` does not make tables there.
    #[doc(hidden)]
    fn in_attached_databases<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<Vec<(&'static str, String)>>> + Send {
        let _ = conn;
        async { Ok(Vec::new()) }
    }

    /// The databases of the connection that keep no journal on disk (SQLite's `journal_mode`
    /// `MEMORY` or `OFF` on a database in a file), as `name (journal_mode = mode)`; `None` where
    /// there is none, and on the other databases.
    #[doc(hidden)]
    fn volatile_journals<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<Option<String>>> + Send {
        let _ = conn;
        async { Ok(None) }
    }

    /// The privileges a worker needs on the `present` tables that this connection lacks.
    #[doc(hidden)]
    fn missing_privileges<C: Store<Db = Self>>(
        conn: &mut C,
        present: &[&'static str],
    ) -> impl Future<Output = QueryResult<Vec<crate::schema_problem::SchemaProblem>>> + Send {
        let _ = (conn, present);
        async { Ok(Vec::new()) }
    }

    /// Outside any transaction, just before a prune's `BEGIN`: makes that one transaction take the
    /// fewest locks its statement allows. MySQL/MariaDB: `SET TRANSACTION ISOLATION LEVEL READ
    /// COMMITTED` (the next transaction only). At the default REPEATABLE READ, `DELETE ... ORDER
    /// BY expires_at LIMIT n` takes next-key locks on the `expires_at` index, among them the gap
    /// just before the first lapsed entry, which is where every new claim's `NULL` entry goes:
    /// claims wait for the batch. At READ COMMITTED that gap is not locked. Elsewhere nothing.
    #[doc(hidden)]
    fn fewest_locks_next<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let _ = conn;
        std::future::ready(Ok(()))
    }

    /// Outside any transaction, just before the `BEGIN` of a relay's lease or of a read whose
    /// answer is reported: plain reads see only committed rows and lock nothing. MySQL/MariaDB:
    /// `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ` (the next transaction only). At a
    /// session's READ UNCOMMITTED a key's look-up would report a run not yet committed (which may
    /// roll back) as done, and the outbox's counts its pushed messages; at SERIALIZABLE the
    /// lease's plain reads would take shared locks and wait for a running job's pushed message.
    /// READ COMMITTED is refused under statement-based binary logging; REPEATABLE READ never is.
    /// SQLite: `PRAGMA read_uncommitted = 0` where the session has it on (a shared cache obeys
    /// it), put back by [`committed_reads_done`](Self::committed_reads_done) after the
    /// transaction. Elsewhere nothing (PostgreSQL reads nothing uncommitted at any level).
    /// Whether it changed a setting of the session's that is to be put back.
    #[doc(hidden)]
    fn committed_reads_next<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<bool>> + Send {
        let _ = conn;
        std::future::ready(Ok(false))
    }

    /// After the transaction [`committed_reads_next`](Self::committed_reads_next) prepared, where
    /// it changed the session's setting: puts it back.
    #[doc(hidden)]
    fn committed_reads_done<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let _ = conn;
        std::future::ready(Ok(()))
    }

    /// Whether `error` says a prune's statement cannot run at the isolation
    /// [`fewest_locks_next`](Self::fewest_locks_next) chose (MySQL/MariaDB with statement-based
    /// binary logging, error 1665), so that the prune goes on at the session's own.
    #[doc(hidden)]
    fn fewest_locks_refused(error: &DieselError) -> bool {
        let _ = error;
        false
    }

    /// Diesel's backend type.
    #[doc(hidden)]
    type Backend: Backend;

    /// The database's name in messages.
    #[doc(hidden)]
    const NAME: &'static str;

    /// What a failed statement means for the transaction.
    #[doc(hidden)]
    fn classify(error: &DieselError) -> Fault;

    /// Whether trying again can succeed after `error`, which rolled back what it was part of: a
    /// transient fault ([`classify`](Self::classify)), a lost connection, a transaction state
    /// Diesel no longer trusts (a new connection, as a pool hands out, fixes both), or a claim
    /// refused outside its job's transaction ([`claim_outside_job`](Self::claim_outside_job)).
    /// The one rule behind every database error's `Error::is_retryable`: jobs, keys, prune and
    /// the outbox.
    #[doc(hidden)]
    fn passes(error: &DieselError) -> bool {
        Self::classify(error).is_transient()
            || Self::connection_lost(error)
            || matches!(error, DieselError::BrokenTransactionManager)
            || Self::claim_outside_job(error)
            || Self::canceled_by_request(error)
    }

    /// Whether `error` is a statement canceled at someone's request (PostgreSQL's
    /// `pg_cancel_backend`, an operator stopping a slow statement): what it was part of rolled
    /// back, and a later try can succeed. Not a fault the runtime retries on its own (the cancel
    /// meant to stop it). By default never.
    #[doc(hidden)]
    fn canceled_by_request(error: &DieselError) -> bool {
        let _ = error;
        false
    }

    /// Whether `error` is a claim's refusal to run outside the transaction its job opened
    /// (PostgreSQL: `crate::error::OUTSIDE_JOB`): nothing of the job ran, and its next attempt
    /// checks again. By default never.
    #[doc(hidden)]
    fn claim_outside_job(error: &DieselError) -> bool {
        let _ = error;
        false
    }

    /// Deletes the claim of the key with `digest` that has no claim token (a row of a schema
    /// before them), in a statement of its own; returns whether there was one. A row renewed
    /// meanwhile has a token, and is left.
    #[doc(hidden)]
    fn forget<C: Store<Db = Self>>(
        conn: &mut C,
        digest: &[u8; 32],
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Bounds how long the statements after it wait for a row lock held by another transaction
    /// (the claim's wait for another run of its key) to `limit`, and returns the setting to
    /// restore; `None` where the database bounds that wait otherwise (SQLite: its write lock, taken
    /// at `BEGIN`).
    #[doc(hidden)]
    fn bound_lock_wait<C: Store<Db = Self>>(
        conn: &mut C,
        limit: std::time::Duration,
    ) -> impl Future<Output = QueryResult<Option<String>>> + Send;

    /// Puts back the setting [`bound_lock_wait`](Self::bound_lock_wait) returned.
    #[doc(hidden)]
    fn restore_lock_wait<C: Store<Db = Self>>(
        conn: &mut C,
        previous: &str,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// The row of the key with `digest`, read in a statement of its own.
    #[doc(hidden)]
    fn lookup_key<C: Store<Db = Self>>(
        conn: &mut C,
        digest: &[u8; 32],
    ) -> impl Future<Output = QueryResult<Option<KeyRow>>> + Send;

    /// Rows matching `filter`, newest first.
    #[doc(hidden)]
    fn list_keys<C: Store<Db = Self>>(
        conn: &mut C,
        filter: &KeyFilter<'_>,
    ) -> impl Future<Output = QueryResult<Vec<KeyRow>>> + Send;

    /// Keys per job, with the oldest and newest.
    #[doc(hidden)]
    fn job_counts<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<Vec<JobCountRow>>> + Send;

    /// The key's row as committed (a statement of its own, no lock): what a replay needs.
    #[doc(hidden)]
    fn done_row<C: Store<Db = Self>>(
        conn: &mut C,
        digest: &[u8; 32],
    ) -> impl Future<Output = QueryResult<Option<DoneRow>>> + Send;

    /// Whether a redelivery's read before its claim goes in a transaction of the runtime's own
    /// (which it rolls back), whose `BEGIN` the database refuses where the session holds a
    /// transaction of its own that Diesel does not count: SQLite, where a read outside a
    /// transaction would join that one, and its snapshot in WAL mode. Where false, the read is
    /// [`Self::done_row_before_claim`], a statement of its own.
    #[doc(hidden)]
    const FIRST_READ_IN_OWN_TRANSACTION: bool = false;

    /// A redelivery's read of the key's row before its claim ([`Self::done_row`] by default):
    /// `None` where the read could answer from a snapshot older than the latest commit (a
    /// transaction the session holds of its own, sent as text, whose snapshot is fixed), so that
    /// the claim decides. MySQL's read asks the session itself ([`Self::reads_outside_safely`]).
    #[doc(hidden)]
    fn done_row_before_claim<C: Store<Db = Self>>(
        conn: &mut C,
        digest: &[u8; 32],
    ) -> impl Future<Output = QueryResult<Option<DoneRow>>> + Send {
        Self::done_row(conn, digest)
    }

    /// Deletes the key's row if this run's claim (`token`) holds it; whether it did.
    #[doc(hidden)]
    fn take_back<C: Store<Db = Self>>(
        conn: &mut C,
        digest: &[u8; 32],
        token: i64,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    // ---- jobs ----

    /// One attempt at claiming: insert the key, or read the row that holds it.
    #[doc(hidden)]
    fn claim<C: Store<Db = Self>>(
        conn: &mut C,
        claim: &Claim<'_>,
    ) -> impl Future<Output = QueryResult<ClaimAttempt>> + Send;

    /// Opens the job's own transaction ([`Store::begin_job`], with no bound on its wait) and makes
    /// the first claim in it. `Err`: nothing is open. By default one after the other; PostgreSQL
    /// sends both in one flight where the connection pipelines ([`Store::begin_job_pipelined`]).
    #[doc(hidden)]
    fn begin_and_claim<C: Store<Db = Self>>(
        conn: &mut C,
        claim: &Claim<'_>,
    ) -> impl Future<Output = QueryResult<(Nesting, QueryResult<ClaimAttempt>)>> + Send {
        async move {
            let nesting = conn.begin_job(None).await?;
            Ok((nesting, Self::claim(conn, claim).await))
        }
    }

    /// Takes over a claim that has lapsed, or a committed one whose run never recorded its result
    /// ([`UNFINISHED`]): `true` if this transaction now holds it.
    #[doc(hidden)]
    fn renew<C: Store<Db = Self>>(
        conn: &mut C,
        claim: &Claim<'_>,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Stores the result in the row this run claimed (`token`) and starts its `keep`
    /// (microseconds) from now, just before the commit; whether the row was there to update (it
    /// is not when a statement of the body rolled back to the job's savepoint, or switched the
    /// session to another database).
    #[doc(hidden)]
    fn record<C: Store<Db = Self>>(
        conn: &mut C,
        digest: &[u8; 32],
        token: i64,
        result: Option<&str>,
        keep_micros: Option<i64>,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Deletes up to `limit` lapsed claims in one statement; returns how many.
    #[doc(hidden)]
    fn prune_lapsed<C: Store<Db = Self>>(
        conn: &mut C,
        limit: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    // ---- the outbox ----

    /// Inserts a message in the job's transaction.
    #[doc(hidden)]
    fn push<C: Store<Db = Self>>(
        conn: &mut C,
        message: &NewMessage<'_>,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// In the open lease transaction: parks messages whose relay died during their last allowed
    /// attempt, then leases either the oldest message whose relay died during its delivery (alone,
    /// so one poison message cannot take a batch down with it) or a batch of pending messages.
    /// Each leased message's attempt is counted now, before its delivery starts.
    #[doc(hidden)]
    fn lease<C: Store<Db = Self>>(
        conn: &mut C,
        lease: &Lease<'_>,
    ) -> impl Future<Output = QueryResult<crate::store::Leased>> + Send;

    /// Marks a message delivered if `owner` still holds its lease, or nobody does (it lapsed, and
    /// another relay parked the message or failed to deliver it).
    #[doc(hidden)]
    fn mark_delivered<C: Store<Db = Self>>(
        conn: &mut C,
        id: i64,
        owner: &str,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Records a failed delivery if `owner` still holds the lease: released to be tried again
    /// after `retry_after_micros`, or parked.
    #[doc(hidden)]
    fn mark_failed<C: Store<Db = Self>>(
        conn: &mut C,
        failure: &Failure<'_>,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Releases message `id`, which `owner` leased and never tried, with its attempt uncounted;
    /// how many rows (0 when the lease is no longer `owner`'s).
    #[doc(hidden)]
    fn release_untried<C: Store<Db = Self>>(
        conn: &mut C,
        owner: &str,
        id: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Messages not yet delivered and not parked (pending, leased, or backing off), oldest first.
    #[doc(hidden)]
    fn unsent<C: Store<Db = Self>>(
        conn: &mut C,
        limit: i64,
    ) -> impl Future<Output = QueryResult<Vec<LeasedRow>>> + Send;

    /// Parked messages, oldest first.
    #[doc(hidden)]
    fn parked<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<Vec<LeasedRow>>> + Send;

    /// Un-parks all parked messages, or the one with `message_id`.
    #[doc(hidden)]
    fn retry_parked<C: Store<Db = Self>>(
        conn: &mut C,
        message_id: Option<&str>,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Deletes up to `limit` messages delivered more than `older_than_micros` ago.
    #[doc(hidden)]
    fn prune_delivered<C: Store<Db = Self>>(
        conn: &mut C,
        older_than_micros: i64,
        limit: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// How many messages are in each state.
    #[doc(hidden)]
    fn outbox_counts<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<OutboxCounts>> + Send;

    // ---- the schema ----

    /// Creates or upgrades the runtime's tables, waiting up to `lock_timeout` for a migration
    /// running elsewhere; see `crate::migrate`.
    #[doc(hidden)]
    fn migrate<C: Store<Db = Self>>(
        conn: &mut C,
        lock_timeout: std::time::Duration,
    ) -> impl Future<Output = Result<(), crate::error::Error>> + Send;

    /// Where the connection looks for the runtime's tables, for a message saying one is missing.
    #[doc(hidden)]
    fn where_tables_are<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<String>> + Send;

    /// Whether `table`, as the connection finds it, has an index named `index`.
    #[doc(hidden)]
    fn index_exists<C: Store<Db = Self>>(
        conn: &mut C,
        table: &str,
        index: &str,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// The columns of `table`, as the connection finds it.
    #[doc(hidden)]
    fn table_columns<C: Store<Db = Self>>(
        conn: &mut C,
        table: &str,
    ) -> impl Future<Output = QueryResult<Vec<String>>> + Send;

    /// Whether `table.column` has a unique index of its own.
    #[doc(hidden)]
    fn has_unique_index<C: Store<Db = Self>>(
        conn: &mut C,
        table: &str,
        column: &str,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Whether `table` exists where the job statements find their tables (the connection's
    /// database; PostgreSQL: its `search_path`).
    #[doc(hidden)]
    fn table_exists<C: Store<Db = Self>>(
        conn: &mut C,
        table: &str,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// The version recorded in `idempotent_schema`, without taking a lock; `None` when that table
    /// does not exist (as seen through the connection's own name resolution).
    #[doc(hidden)]
    fn schema_version<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<Option<i32>>> + Send;

    // ---- inspection ----

    /// The tables a test-kit snapshot covers.
    #[doc(hidden)]
    fn table_names<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<Vec<String>>> + Send;

    /// Every row of `table`, rendered as text, in any order.
    #[doc(hidden)]
    fn table_rows<C: Store<Db = Self>>(
        conn: &mut C,
        table: &str,
    ) -> impl Future<Output = QueryResult<Vec<String>>> + Send;

    /// The schema's steps, in order (`idempotent-runtime/sql/<database>/`).
    #[doc(hidden)]
    const STEPS: &'static [Step];

    /// The version table's DDL.
    #[doc(hidden)]
    const VERSION_TABLE: &'static str;

    /// Records that the step of `version` is done.
    #[doc(hidden)]
    fn record_version<C: Store<Db = Self>>(
        conn: &mut C,
        version: i32,
        description: &str,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Takes the rows an earlier release wrote into the application's Diesel migration table back out.
    #[doc(hidden)]
    fn forget_diesel_versions<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<()>> + Send;
}
