//! [`Store`]: what the runtime needs from one connection type.

use std::future::Future;
use std::time::Duration;

use diesel::result::QueryResult;

use diesel::QueryableByName;

use super::{Database, Nesting, Unfinished};
use crate::sql::{Binds, SqlText, Statement};

/// One connection type: transactions and statements, sync or async. See the module docs.
pub trait Store: Send + Sized {
    /// [`begin`](Self::begin), waiting at most `limit` for the database's write lock where `BEGIN`
    /// takes it (SQLite); elsewhere the same as `begin`.
    #[doc(hidden)]
    fn begin_bounded(
        &mut self,
        limit: std::time::Duration,
    ) -> impl Future<Output = QueryResult<Nesting>> + Send {
        let _ = limit;
        self.begin()
    }

    /// Opens a transaction that takes no lock until it needs one (SQLite's `BEGIN DEFERRED`; a
    /// plain `BEGIN` elsewhere, which is that already): for the operations that are not jobs, so
    /// that a look-up never waits for a job in progress.
    #[doc(hidden)]
    fn begin_deferred(&mut self) -> impl Future<Output = QueryResult<Nesting>> + Send {
        self.begin()
    }

    /// After a statement that returns rows failed: makes sure no prepared statement of the
    /// connection is left in a state its next run cannot recover from. Diesel's sync MySQL
    /// connection (libmariadb): a cached statement whose result failed after its header (MariaDB's
    /// 1020 under `innodb_snapshot_isolation`, a row lock's error behind rows already sent) stays
    /// "waiting for its result", and its next run waits forever for packets the server never
    /// sends. Its cache is emptied (each statement closed, which is safe), to be prepared afresh.
    /// Elsewhere nothing.
    #[doc(hidden)]
    fn after_failed_read(&mut self) {}

    /// Whether releasing the job's savepoint goes out with the `COMMIT`, the `COMMIT` only when the
    /// release succeeded: one text batch that is one round trip (PostgreSQL; diesel-async's
    /// MySQL), one `sqlite3_exec` (SQLite), or one stored procedure (Diesel's sync MySQL with the
    /// job procedures). The database's `release_failed` then tells a missing savepoint from a
    /// failed commit by the error. Elsewhere the two go one after the other.
    #[doc(hidden)]
    fn finish_in_one_batch(&mut self) -> bool {
        false
    }

    /// Releases the job's savepoint and commits, the `COMMIT` only when the release succeeded,
    /// in one round trip: where [`finish_in_one_batch`](Self::finish_in_one_batch) says so.
    /// A text batch by default; Diesel's sync MySQL connection calls the stored procedure
    /// `idempotent_finish_job` (see `db::mysql`).
    #[doc(hidden)]
    fn release_and_commit(&mut self) -> impl Future<Output = QueryResult<()>> + Send {
        self.batch(<Self::Db as super::Database>::release_and_commit_sql())
    }

    /// The database this connection talks to.
    #[doc(hidden)]
    type Db: Database;

    /// Whether a redelivery reads its key inside the job's transaction, before the claim, rather
    /// than in a statement of its own before it: diesel-async's PostgreSQL connection, which
    /// prepares and executes a statement in two exchanges that a transaction pooler may send,
    /// outside a transaction, to two server connections (or to one where another client's
    /// statement has the same name); inside a transaction both go to one. Diesel's sync
    /// `PgConnection` sends an uncached statement with its values in one message, so its read
    /// goes alone, in one round trip. See [`crate::redelivery`].
    #[doc(hidden)]
    const READ_FIRST_IN_TRANSACTION: bool = false;

    /// Whether a statement's future may be dropped midway and the connection still be used:
    /// not diesel-async's MySQL connection, which then reads the dropped statement's answer as
    /// the next one's ("can't parse: buf doesn't have enough data"). Where not, the connection
    /// counts as broken while a statement of the runtime's runs (`db::hold_broken`), so that one
    /// dropped midway leaves it broken: a pool drops it, a later call says so.
    #[doc(hidden)]
    const STATEMENTS_CANCEL_SAFE: bool = true;

    /// Opens a transaction (on SQLite taking the write lock first), or a savepoint inside the
    /// caller's.
    #[doc(hidden)]
    fn begin(&mut self) -> impl Future<Output = QueryResult<Nesting>> + Send;

    /// Opens a job's own transaction: as [`begin_bounded`](Self::begin_bounded) (or
    /// [`begin`](Self::begin) without a bound) and, when it is the outermost, the savepoint
    /// `idempotent_job` right after `BEGIN`, in the same round trip where the connection allows;
    /// where the savepoint is a statement of its own anyway, [`Nesting::Unmarked`] without it (the
    /// lifecycle sets it after the claim).
    /// A statement of the body that ends the transaction (`COMMIT`, `ROLLBACK`, an implicit
    /// commit) or replaces it (`BEGIN` again) takes that savepoint with it: that is how
    /// [`finish_job`](crate::transaction::finish_job) tells that the transaction is no longer the job's.
    #[doc(hidden)]
    fn begin_job(
        &mut self,
        bound: Option<Duration>,
    ) -> impl Future<Output = QueryResult<Nesting>> + Send;

    /// Opens a job's own outermost transaction and runs `first` in it, the two in one flight, where
    /// the connection pipelines requests (diesel-async's PostgreSQL connection) and no transaction
    /// is open yet; `None` elsewhere, with nothing open. `first` goes out before `BEGIN` has
    /// answered, so it must do nothing unless that `BEGIN` took effect (see `db::postgres`). On
    /// Diesel's sync `MysqlConnection`, `first` is the `CALL` of a stored procedure that begins
    /// the transaction itself (see `db::mysql`).
    ///
    /// `Some(Err)`: nothing is open (`first`'s result is then of no account). `Some(Ok)`: the
    /// transaction is open, whatever `first` returned.
    #[doc(hidden)]
    fn begin_job_pipelined<S, B>(
        &mut self,
        first: Statement<S, B>,
    ) -> impl Future<Output = Option<QueryResult<(Nesting, QueryResult<usize>)>>> + Send
    where
        S: SqlText,
        B: Binds<<Self::Db as Database>::Backend> + Send,
    {
        drop(first);
        async { None }
    }

    /// Tells Diesel's transaction manager that no transaction is open on this connection, after
    /// the runtime ended the outermost one with statements of its own (or found it ended by the
    /// body); `broken`: the connection may be in any state, and must not be used for another job.
    #[doc(hidden)]
    fn forget_transaction(&mut self, broken: bool);

    /// Tells Diesel's transaction manager that `depth` transactions are open (none for 0), after
    /// the runtime ended a caller's transaction that a statement of a job's body had replaced and
    /// began a new one to stand for it (PostgreSQL's sync connection forgets its count when the
    /// session is idle for a moment).
    #[doc(hidden)]
    fn count_transactions(&mut self, depth: u32);

    /// Tells Diesel's transaction manager that the transactions it counts past `depth` ended (a
    /// savepoint the runtime released or rolled back to with statements of its own), keeping the
    /// rest of its state.
    #[doc(hidden)]
    fn uncount_to(&mut self, depth: u32);

    /// Commits the innermost transaction (releases the savepoint).
    #[doc(hidden)]
    fn commit(&mut self) -> impl Future<Output = QueryResult<()>> + Send;

    /// Rolls the innermost transaction back.
    #[doc(hidden)]
    fn rollback(&mut self) -> impl Future<Output = QueryResult<()>> + Send;

    /// Cleans up after a guard dropped unfinished: a sync connection does it at once; an async one
    /// cannot run a statement in `drop`, so it marks its transaction manager broken, and a pool
    /// discards the connection (closing it ends the transaction and releases session locks).
    #[doc(hidden)]
    fn abandon(&mut self, unfinished: Unfinished);

    /// How many transactions are open on this connection (0 outside any).
    #[doc(hidden)]
    fn transaction_depth(&mut self) -> QueryResult<u32>;

    /// Waits without holding anything: a sleep for a sync connection, a timer for an async one.
    #[doc(hidden)]
    fn pause(duration: Duration) -> impl Future<Output = ()> + Send;

    /// Runs `statement`; returns the rows it changed.
    #[doc(hidden)]
    fn execute<S, B>(
        &mut self,
        statement: Statement<S, B>,
    ) -> impl Future<Output = QueryResult<usize>> + Send
    where
        S: SqlText,
        B: Binds<<Self::Db as Database>::Backend> + Send;

    /// Runs `statement` and reads its rows by column name.
    #[doc(hidden)]
    fn load<S, B, U>(
        &mut self,
        statement: Statement<S, B>,
    ) -> impl Future<Output = QueryResult<Vec<U>>> + Send
    where
        S: SqlText,
        B: Binds<<Self::Db as Database>::Backend> + Send,
        U: QueryableByName<<Self::Db as Database>::Backend> + Send + 'static;

    /// Runs SQL text with no bind values (DDL, locks), not prepared.
    #[doc(hidden)]
    fn batch(&mut self, sql: &str) -> impl Future<Output = QueryResult<()>> + Send;

    /// Runs a query built at run time (the test kit's reads of tables it discovers) and returns
    /// its one text column, `row`. Not prepared.
    #[doc(hidden)]
    fn text_rows(&mut self, sql: &str) -> impl Future<Output = QueryResult<Vec<String>>> + Send;
}
