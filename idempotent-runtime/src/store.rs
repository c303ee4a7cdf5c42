//! What the runtime needs from a connection and from a database, as two internal traits.
//!
//! * [`Store`], one implementation per connection type (three sync Diesel connections, three
//!   diesel-async ones): open, commit and roll back transactions, run a [`Statement`], wait. This
//!   is the only place where sync and async connections differ.
//! * [`Database`], one implementation per database (`db::sqlite`, `db::postgres`, `db::mysql`):
//!   every statement of that database, its error classification, locking, migration and
//!   inspection SQL, written once as async code generic over any [`Store`] of that database.
//!
//! The job lifecycle, the relay, pruning, migrations and the test kit are written once, as async
//! code over `Store`. An async caller awaits it; a sync caller drives the same future to
//! completion with [`crate::drive::block_on`]: a sync connection's futures do their work when first
//! polled and are never pending, so the shared code runs exactly as straight-line sync code would,
//! on the caller's thread. One copy of each algorithm, with no sync/async twins to drift apart.
//!
//! Both traits are sealed: `JobStore` and `AsyncJobStore` (the public names of the connection
//! types a job can run on) have `Store` as a supertrait that users cannot name or implement.

use std::future::Future;
use std::time::Duration;

use diesel::QueryableByName;
use diesel::backend::Backend;
use diesel::result::{Error as DieselError, QueryResult};

use crate::sql::{Binds, SqlText, Statement};

/// Whether a transaction is the outermost one or a savepoint inside the caller's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nesting {
    /// This transaction's commit is the real commit.
    Outermost,
    /// The caller was already in a transaction: this commits when the caller's does.
    Savepoint,
}

/// What an unfinished transaction or lock needs when its guard is dropped without finishing it
/// (a panic unwinding, a dropped future).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfinished {
    /// A transaction: roll it back.
    Transaction,
    /// A session lock: release it with this statement.
    SessionLock(&'static str),
}

/// The kinds of database error the runtime reacts to; see [`Database::classify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Another connection holds the database's write lock (SQLite).
    Busy,
    /// A deadlock was detected and this transaction chosen as its victim.
    Deadlock,
    /// A row lock was waited for until the server's lock timeout.
    LockTimeout,
    /// The transaction could not be serialized with concurrent ones.
    Serialization,
    /// Anything else.
    Other,
}

impl Fault {
    /// Whether trying the whole transaction again can succeed.
    pub fn is_transient(self) -> bool {
        !matches!(self, Fault::Other)
    }
}

/// One connection type: transactions and statements, sync or async. See the module docs.
pub trait Store: Send + Sized {
    /// The database this connection talks to.
    #[doc(hidden)]
    type Db: Database;

    /// Opens a transaction (on SQLite taking the write lock first), or a savepoint inside the
    /// caller's.
    #[doc(hidden)]
    fn begin(&mut self) -> impl Future<Output = QueryResult<Nesting>> + Send;

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

    /// Opens a job's own transaction: as [`begin_bounded`](Self::begin_bounded) (or
    /// [`begin`](Self::begin) without a bound) and, when it is the outermost, the savepoint
    /// `idempotent_job` right after `BEGIN`, in the same round trip where the connection allows.
    /// A statement of the body that ends the transaction (`COMMIT`, `ROLLBACK`, an implicit
    /// commit) or replaces it (`BEGIN` again) takes that savepoint with it: that is how
    /// [`finish_job`](crate::transaction::finish_job) tells that the transaction is no longer the job's.
    #[doc(hidden)]
    fn begin_job(
        &mut self,
        bound: Option<Duration>,
    ) -> impl Future<Output = QueryResult<Nesting>> + Send;

    /// Whether one text batch of several statements is one round trip on this connection, so that
    /// releasing the job's savepoint can go out with the `COMMIT` (PostgreSQL; diesel-async's
    /// MySQL). Where it is not (Diesel's sync MySQL switches multi-statement mode on and off around
    /// a batch; SQLite has no round trips), the two go as prepared statements one after the other,
    /// which also tells a missing savepoint from a failed commit without looking at the error.
    #[doc(hidden)]
    fn finish_in_one_batch(&mut self) -> bool {
        false
    }

    /// Tells Diesel's transaction manager that no transaction is open on this connection, after
    /// the runtime ended the outermost one with statements of its own (or found it ended by the
    /// body); `broken`: the connection may be in any state, and must not be used for another job.
    #[doc(hidden)]
    fn forget_transaction(&mut self, broken: bool);

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

/// One database: all of its statements and what its errors mean. See the module docs.
///
/// Every time that decides anything (a claim's lapse, a lease, a retry's availability, pruning) is
/// taken from the database's clock inside the statement, never from the worker's: workers whose
/// clocks disagree still agree on what has lapsed.
pub trait Database: Sized + Send + Sync + 'static {
    /// Diesel's backend type.
    #[doc(hidden)]
    type Backend: Backend;

    /// The database's name in messages.
    #[doc(hidden)]
    const NAME: &'static str;

    /// Whether a redelivery reads its key inside the job's transaction, before the claim, rather
    /// than in a statement of its own before it (PostgreSQL: behind a transaction pooler a
    /// statement outside a transaction may be prepared on one server connection and executed on
    /// another, where a statement of another client may have its name; inside one, both are on the
    /// same connection). See [`crate::redelivery`].
    #[doc(hidden)]
    const READ_FIRST_IN_TRANSACTION: bool = false;

    /// Whether a transaction that writes takes the whole database's write lock at `BEGIN`
    /// (SQLite): then a claim waits there, not for the key's row.
    #[doc(hidden)]
    const WRITE_LOCK_AT_BEGIN: bool = false;

    /// What a failed statement means for the transaction.
    #[doc(hidden)]
    fn classify(error: &DieselError) -> Fault;

    /// Whether `error` says the connection itself failed (closed, reset, gone away): whatever was in
    /// flight may or may not have reached the server.
    #[doc(hidden)]
    fn connection_lost(error: &DieselError) -> bool {
        let _ = error;
        false
    }

    /// The largest result the database takes, and the limit that comes from, when a result of
    /// `bytes` is larger; `None` when it fits.
    #[doc(hidden)]
    fn result_too_large<C: Store<Db = Self>>(
        conn: &mut C,
        bytes: usize,
    ) -> impl Future<Output = QueryResult<Option<ResultLimit>>> + Send {
        let _ = (conn, bytes);
        async { Ok(None) }
    }

    /// Deletes the claim of the key with `digest`, in a statement of its own; returns whether
    /// there was one.
    #[doc(hidden)]
    fn forget<C: Store<Db = Self>>(
        conn: &mut C,
        digest: &[u8; 32],
    ) -> impl Future<Output = QueryResult<bool>> + Send;

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

    /// Whether the transaction just begun is in fact a transaction of the caller's that had
    /// written already (PostgreSQL answers a `BEGIN` inside a transaction with a warning only).
    #[doc(hidden)]
    fn begun_inside_another<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<bool>> + Send {
        let _ = conn;
        async { Ok(false) }
    }

    /// Releases the job's savepoint (`idempotent_job`): fails when the transaction is no longer
    /// the job's own.
    #[doc(hidden)]
    fn release_job<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        async move {
            conn.execute(Statement::<crate::db::ReleaseJob, _>::new(()))
                .await
                .map(drop)
        }
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

    /// Takes over a claim that has lapsed, or a committed one whose run never recorded its result
    /// ([`UNFINISHED`]): `true` if this transaction now holds it.
    #[doc(hidden)]
    fn renew<C: Store<Db = Self>>(
        conn: &mut C,
        claim: &Claim<'_>,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Stores the result in the claimed row and starts its `keep` (microseconds) from now, just
    /// before the commit.
    #[doc(hidden)]
    fn record<C: Store<Db = Self>>(
        conn: &mut C,
        digest: &[u8; 32],
        result: Option<&str>,
        keep_micros: Option<i64>,
    ) -> impl Future<Output = QueryResult<()>> + Send;

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
    ) -> impl Future<Output = QueryResult<Vec<LeasedRow>>> + Send;

    /// Marks a message delivered if `owner` still holds its lease.
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
    ) -> impl Future<Output = Result<(), crate::Error>> + Send;

    /// Where the connection looks for the runtime's tables, for a message saying one is missing.
    #[doc(hidden)]
    fn where_tables_are<C: Store<Db = Self>>(
        conn: &mut C,
    ) -> impl Future<Output = QueryResult<String>> + Send;

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

    /// The privileges a worker needs on the `present` tables that this connection lacks.
    #[doc(hidden)]
    fn missing_privileges<C: Store<Db = Self>>(
        conn: &mut C,
        present: &[&'static str],
    ) -> impl Future<Output = QueryResult<Vec<crate::migrations::SchemaProblem>>> + Send {
        let _ = (conn, present);
        async { Ok(Vec::new()) }
    }

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
}

/// What a claim writes: the key's digest and readable form, the job, the fingerprint.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    pub digest: &'a [u8; 32],
    /// This run's mark on the row it claims (`claim_token`), so that it takes back its own claim
    /// only.
    pub token: i64,
    pub key: &'a str,
    pub job: &'a str,
    pub fingerprint: Option<&'a [u8]>,
    /// What the claimed row's `result` holds until the run records its own: [`UNFINISHED`] for a
    /// job that stores a result (so a row committed without one, by a body that ended the
    /// transaction early, reads as a run that did not finish); `None` for a job whose result is
    /// zero-sized (`()`), which has nothing to store and whose claim is the whole record.
    pub result: Option<&'a str>,
}

/// `done_jobs.result` of a row whose run claimed the key and has not recorded its result: never
/// valid JSON, so never replayed. A committed row that still holds it was committed early (a
/// statement of the body ended the job's transaction, and the worker died before it could take
/// its claim back); the next delivery takes the key over and runs the job.
pub const UNFINISHED: &str = "";

/// A `done_jobs` row as a claim reads it back.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct DoneRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub job_name: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub result: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Binary>)]
    pub fingerprint: Option<Vec<u8>>,
    /// When the claiming run committed (or, with no result and no `keep`, claimed), in
    /// microseconds since the Unix epoch, UTC.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub done_at_micros: i64,
    /// Whether `expires_at` has passed, by the database's clock.
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub lapsed: bool,
}

impl DoneRow {
    /// Whether the run that committed this row never recorded its result ([`UNFINISHED`]).
    pub fn unfinished(&self) -> bool {
        self.result.as_deref() == Some(UNFINISHED)
    }
}

/// The largest result a database takes in the statement that records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultLimit {
    /// The largest result, in bytes of JSON.
    pub largest: u64,
    /// The server's own limit on one statement it comes from (MySQL's `max_allowed_packet`).
    pub packet: u64,
}

/// How finishing a job's transaction failed; see [`crate::transaction::finish_job`].
#[derive(Debug)]
pub enum Finish {
    /// The transaction was no longer the job's own: a statement of the body ended it, replaced it
    /// with another, or (PostgreSQL) a failed statement aborted it. Nothing was committed by the
    /// runtime; whether the body committed the claim is for the caller to find out.
    NotOwn(DieselError),
    /// The connection failed before the `COMMIT` was sent: nothing was committed.
    BeforeCommit(DieselError),
    /// The `COMMIT` failed (rolled back), or its connection did (outcome unknown).
    Commit(DieselError),
}

/// What one attempt at claiming found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimAttempt {
    /// The key was free and is now claimed by this transaction.
    Inserted,
    /// The key is claimed; the row says by whom, with what result, and whether it has lapsed.
    Found(DoneRow),
    /// The key's row vanished (pruned) or is not yet visible to this statement: try again.
    Missing,
}

/// An outbox message as `outbox::push` writes it.
#[derive(Debug, Clone, Copy)]
pub struct NewMessage<'a> {
    pub message_id: &'a str,
    pub topic: &'a str,
    pub payload: &'a str,
    /// The pushing job's key as `done_jobs` shows it: readable, or redacted.
    pub job_key: &'a str,
}

/// One lease round.
#[derive(Debug, Clone, Copy)]
pub struct Lease<'a> {
    /// This round's own owner token.
    pub owner: &'a str,
    pub lease_micros: i64,
    pub limit: i64,
    /// Attempts after which a message is parked.
    pub max_attempts: i32,
}

/// A failed delivery to record.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    pub id: i64,
    pub owner: &'a str,
    pub error: &'a str,
    /// `None`: park the message.
    pub retry_after_micros: Option<i64>,
}

/// An outbox row as the relay reads it.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct LeasedRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub id: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub message_id: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub topic: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub payload: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub job_key: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pub attempts: i32,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub last_error: Option<String>,
    /// Microseconds from the push to now, by the database's clock.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub age_micros: i64,
}

/// How many outbox messages are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, QueryableByName)]
pub struct OutboxCounts {
    /// Waiting to be sent (including those backing off after a failure).
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub pending: i64,
    /// Held by a relay right now.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub leased: i64,
    /// Delivered and not yet pruned.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub delivered: i64,
    /// Parked after too many failed attempts.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub parked: i64,
}

/// A `done_jobs` row as [`crate::keys`] shows it.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct KeyRow {
    #[diesel(sql_type = diesel::sql_types::Binary)]
    pub key_digest: Vec<u8>,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub job_key: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub job_name: String,
    /// Which run wrote the row; NULL for rows of schema versions before 3.
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    pub claim_token: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub has_result: bool,
    /// The run that committed the row never recorded its result ([`UNFINISHED`]).
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub unfinished: bool,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub has_fingerprint: bool,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub done_at_micros: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    pub expires_at_micros: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub lapsed: bool,
}

/// Which rows [`Database::list_keys`] returns.
#[derive(Debug, Clone, Copy)]
pub struct KeyFilter<'a> {
    pub job: Option<&'a str>,
    pub done_from_micros: Option<i64>,
    pub done_before_micros: Option<i64>,
    pub limit: i64,
}

/// One job's keys, as [`Database::job_counts`] counts them.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct JobCountRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub job_name: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub key_count: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub lapsed_count: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub oldest_micros: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub newest_micros: i64,
}

/// A setting's value as text.
#[cfg(any(
    feature = "postgres",
    feature = "async-postgres",
    feature = "mysql",
    feature = "async-mysql"
))]
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct SettingRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub previous: String,
}
