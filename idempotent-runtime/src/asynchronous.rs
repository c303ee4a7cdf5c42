//! Async jobs on diesel-async: the same claim, run, record and commit, for `AsyncPgConnection`,
//! `AsyncMysqlConnection` and `SyncConnectionWrapper<SqliteConnection>`, and for pooled connections
//! that deref to them (deadpool, bb8).
//!
//! One thing differs from sync code: a future can be dropped at any `.await` (a timeout, a
//! `select!`, a shut-down runtime). Dropping a job's future after its `BEGIN` would leave the
//! transaction open on the connection, and a later job on the same connection would "commit" into
//! it. The runtime marks such a connection broken instead: pools discard it, and a later job on it
//! fails with [`Error::Database`] rather than commit anything.

use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::pin::pin;
use std::task::Poll;
use std::time::Instant;

use diesel::result::{Error as DieselError, QueryResult};
use diesel_async::{AsyncConnection, TransactionManager};

use crate::error::{Error, Step};
use crate::job::Job;
use crate::key::JobKey;
use crate::outcome::Outcome;
use crate::run::{Call, JobCall, JobError, JobOutput, backoff};
use crate::stats::Ending;
use crate::store::{Claim, ClaimState, DoneRow, Nesting, NewOutboxMessage};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The statements the runtime needs from an async connection; the async twin of
/// [`JobStore`](crate::JobStore), implemented for diesel-async's connections.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an async database connection `idempotent-jobs` can claim jobs on",
    label = "an async job needs a diesel-async connection here",
    note = "use `AsyncPgConnection`, `AsyncMysqlConnection` or `SyncConnectionWrapper<SqliteConnection>` (features `async-postgres`, `async-mysql`, `async-sqlite`), or a pooled connection that derefs to one"
)]
pub trait AsyncJobStore: AsyncConnection + Send {
    /// Opens the job's transaction, or a savepoint inside the caller's.
    fn begin_job(&mut self) -> impl Future<Output = QueryResult<Nesting>> + Send;
    /// Inserts the claim: `Ok(true)` inserted, `Ok(false)` the key exists.
    fn insert_claim(&mut self, claim: &Claim<'_>)
    -> impl Future<Output = QueryResult<bool>> + Send;
    /// Reads the row of a claimed key.
    fn find_claim(
        &mut self,
        digest: &[u8; 32],
    ) -> impl Future<Output = QueryResult<Option<DoneRow>>> + Send;
    /// Takes over a claim that has lapsed.
    fn renew_lapsed_claim(
        &mut self,
        claim: &Claim<'_>,
    ) -> impl Future<Output = QueryResult<bool>> + Send;
    /// Stores the handler's result in the claimed row.
    fn record_result(
        &mut self,
        digest: &[u8; 32],
        result: &str,
    ) -> impl Future<Output = QueryResult<()>> + Send;
    /// Inserts an outbox message (inside the job's transaction).
    fn insert_outbox(
        &mut self,
        message: &NewOutboxMessage<'_>,
    ) -> impl Future<Output = QueryResult<()>> + Send;
    /// Deletes up to `limit` claims that lapsed before `now`; returns how many.
    fn prune_lapsed(
        &mut self,
        now: chrono::NaiveDateTime,
        limit: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;
    /// Errors after which the whole transaction can simply be tried again.
    fn is_transient(error: &DieselError) -> bool;
    /// Creates the runtime's tables if they do not exist yet.
    fn run_migrations(&mut self) -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// Creates the runtime's tables through an async connection; see [`migrate`](crate::migrate).
pub async fn migrate_async<C: AsyncJobStore>(conn: &mut C) -> crate::Result<()> {
    conn.run_migrations().await.map_err(Error::Migration)
}

/// The async [`run`](crate::run): claims `key` for `job`, runs `body`, stores its value and commits;
/// when the key is already claimed, the body does not run and the stored value comes back as
/// [`Outcome::Replayed`].
///
/// Beyond what `run` promises: dropping the returned future after the transaction opened marks the
/// connection broken (a pool discards it; a later job on it fails) instead of leaving a transaction
/// open for a later job to commit into. The future is `Send` when the body's future is.
pub async fn run_async<C, T, E, F>(
    conn: &mut C,
    job: &'static Job,
    key: &JobKey,
    body: F,
) -> Result<Outcome<T>, E>
where
    C: AsyncJobStore,
    T: JobOutput,
    E: JobError,
    F: AsyncFnOnce(&mut C) -> Result<T, E>,
{
    JobCall::new(job, key).run_async(conn, body).await
}

/// [`run_async`] for a connection reached through `store`, such as a pooled connection.
#[doc(hidden)]
pub async fn run_async_with<Conn, C, S, T, E, F>(
    conn: &mut Conn,
    store: S,
    job_call: JobCall<'_>,
    body: F,
) -> Result<Outcome<T>, E>
where
    Conn: ?Sized,
    C: AsyncJobStore,
    S: Fn(&mut Conn) -> &mut C,
    T: JobOutput,
    E: JobError,
    F: AsyncFnOnce(&mut Conn) -> Result<T, E>,
{
    let call = Call::new(job_call)?;
    if call.inside_own_claim()? {
        // The enclosing run of this job holds the key in this same transaction: run here.
        return body(conn).await.map(Outcome::Ran);
    }
    let span = call.span();
    tracing::Instrument::instrument(run_call(conn, &store, &call, body), span).await
}

async fn run_call<Conn, C, S, T, E, F>(
    conn: &mut Conn,
    store: &S,
    call: &Call,
    body: F,
) -> Result<Outcome<T>, E>
where
    Conn: ?Sized,
    C: AsyncJobStore,
    S: Fn(&mut Conn) -> &mut C,
    T: JobOutput,
    E: JobError,
    F: AsyncFnOnce(&mut Conn) -> Result<T, E>,
{
    let (nesting, state) = begin_and_claim(store(conn), call)
        .await
        .map_err(|e| call.failed(e))?;
    // No `.await` between the claim's guard letting go and this one taking over.
    let mut open = OpenTransaction {
        conn,
        store,
        finished: false,
    };
    if let ClaimState::Done(row) = state {
        let replay = call.replay(row);
        return match replay {
            Ok(value) => {
                open.commit(call).await.map_err(|e| call.failed(e))?;
                call.finished(Ending::Replayed);
                Ok(Outcome::Replayed(value))
            }
            Err(error) => {
                open.rollback(call).await;
                Err(call.failed(error).into())
            }
        };
    }
    tracing::debug!(?nesting, "claimed key");

    let result = {
        let mut running = pin!(body(&mut *open.conn));
        // Catch a panic in the body's poll, so the transaction can be rolled back before the
        // panic goes on.
        poll_fn(|cx| {
            match catch_unwind(AssertUnwindSafe(|| {
                // The body's key is current while it is polled, on whichever thread polls it.
                crate::context::enter(&call.context, || running.as_mut().poll(cx))
            })) {
                Ok(Poll::Pending) => Poll::Pending,
                Ok(Poll::Ready(result)) => Poll::Ready(Ok(result)),
                Err(panic) => Poll::Ready(Err(panic)),
            }
        })
        .await
    };
    match result {
        Err(panic) => {
            open.rollback(call).await;
            call.finished(Ending::Panicked);
            resume_unwind(panic)
        }
        Ok(Err(error)) => {
            open.rollback(call).await;
            call.finished(Ending::Failed);
            Err(error)
        }
        Ok(Ok(value)) => {
            let stored = match call.encode(&value) {
                Ok(Some(json)) => (open.store)(&mut *open.conn)
                    .record_result(&call.digest, &json)
                    .await
                    .map_err(|e| call.database(Step::Record, e)),
                Ok(None) => Ok(()),
                Err(error) => Err(error),
            };
            if let Err(error) = stored {
                open.rollback(call).await;
                return Err(call.failed(error).into());
            }
            open.commit(call).await.map_err(|e| call.failed(e))?;
            call.finished(Ending::Ran);
            Ok(Outcome::Ran(value))
        }
    }
}

/// A job's open transaction. Until it is committed or rolled back, dropping it (the job's future
/// was dropped, or a panic unwinds through it) marks the connection's transaction manager broken:
/// no async rollback can run in `drop`, and a transaction left open must never be committed into
/// by the next job on this connection.
struct OpenTransaction<'a, Conn: ?Sized, C: AsyncJobStore, S: Fn(&mut Conn) -> &mut C> {
    conn: &'a mut Conn,
    store: &'a S,
    finished: bool,
}

impl<Conn: ?Sized, C: AsyncJobStore, S: Fn(&mut Conn) -> &mut C> OpenTransaction<'_, Conn, C, S> {
    async fn commit(&mut self, call: &Call) -> Result<(), Error> {
        self.end(true)
            .await
            .map_err(|e| call.database(Step::Commit, e))
    }

    async fn rollback(&mut self, call: &Call) {
        if let Err(error) = self.end(false).await {
            tracing::error!(job = call.job.name(), %error, "rolling back the job's transaction failed");
        }
    }

    /// Commits or rolls back; either way the transaction is over, and dropping `self` is harmless.
    async fn end(&mut self, commit: bool) -> QueryResult<()> {
        let conn = (self.store)(&mut *self.conn);
        let result = if commit {
            C::TransactionManager::commit_transaction(conn).await
        } else {
            C::TransactionManager::rollback_transaction(conn).await
        };
        self.finished = true;
        result
    }
}

/// Runs `statements` in a short transaction of their own (a savepoint inside the caller's),
/// guarded as a job's is: a future dropped before the end marks the connection broken instead of
/// leaving the transaction open for whatever runs next on it. For the runtime's own transactions
/// outside a job, such as the outbox relay's lease.
pub(crate) async fn in_guarded_transaction<C: AsyncJobStore, T>(
    conn: &mut C,
    statements: impl AsyncFnOnce(&mut C) -> QueryResult<T>,
) -> QueryResult<T> {
    conn.begin_job().await?;
    let reach: fn(&mut C) -> &mut C = itself;
    let mut open = OpenTransaction {
        conn,
        store: &reach,
        finished: false,
    };
    match statements(&mut *open.conn).await {
        Ok(value) => open.end(true).await.map(|()| value),
        Err(error) => {
            let _ = open.end(false).await;
            Err(error)
        }
    }
}

impl<Conn: ?Sized, C: AsyncJobStore, S: Fn(&mut Conn) -> &mut C> Drop
    for OpenTransaction<'_, Conn, C, S>
{
    fn drop(&mut self) {
        if !self.finished {
            let conn = (self.store)(&mut *self.conn);
            C::TransactionManager::transaction_manager_status_mut(conn).set_in_error();
            tracing::warn!(
                "a job (or an outbox lease) was dropped inside its transaction; its connection is marked broken and will not be reused"
            );
        }
    }
}

fn itself<C>(conn: &mut C) -> &mut C {
    conn
}

/// Opens the transaction and claims the key, retrying the whole transaction on transient errors.
async fn begin_and_claim<C: AsyncJobStore>(
    conn: &mut C,
    call: &Call,
) -> Result<(Nesting, ClaimState), Error> {
    let started = Instant::now();
    let claim = call.claim();
    let reach: fn(&mut C) -> &mut C = itself;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let (step, error) = match conn.begin_job().await {
            Err(error) => (Step::Begin, error),
            Ok(nesting) => {
                let mut open = OpenTransaction {
                    conn: &mut *conn,
                    store: &reach,
                    finished: false,
                };
                match claim_key(&mut *open.conn, &claim).await {
                    Ok(state) => {
                        // The caller's guard takes over before anything else is awaited.
                        open.finished = true;
                        return Ok((nesting, state));
                    }
                    Err(error) => {
                        open.rollback(call).await;
                        if nesting == Nesting::Savepoint {
                            return Err(call.database(Step::Claim, error));
                        }
                        (Step::Claim, error)
                    }
                }
            }
        };
        call.retry_or_fail(step, error, C::is_transient, attempts, started)?;
        tokio::time::sleep(backoff(attempts)).await;
    }
}

/// [`retry_transient`](crate::run::retry_transient) for async connections.
pub(crate) async fn retry_transient_async<C: AsyncJobStore, T>(
    mut op: impl AsyncFnMut() -> QueryResult<T>,
) -> QueryResult<T> {
    let started = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match op().await {
            Err(error)
                if C::is_transient(&error) && started.elapsed() < crate::run::RETRY_WINDOW =>
            {
                tokio::time::sleep(backoff(attempts)).await;
            }
            result => return result,
        }
    }
}

/// The claim of [`store::claim`](crate::store), for an async connection.
async fn claim_key<C: AsyncJobStore>(conn: &mut C, claim: &Claim<'_>) -> QueryResult<ClaimState> {
    for _ in 0..3 {
        if conn.insert_claim(claim).await? {
            return Ok(ClaimState::Fresh);
        }
        match conn.find_claim(claim.digest).await? {
            Some(row) if row.expires_at.is_none_or(|at| at > claim.now) => {
                return Ok(ClaimState::Done(row));
            }
            Some(_lapsed) if conn.renew_lapsed_claim(claim).await? => return Ok(ClaimState::Fresh),
            Some(_) | None => {}
        }
    }
    Err(crate::store::claim_kept_changing())
}

/// Opens a transaction with `sql` on a diesel-async connection, or a savepoint inside the caller's.
#[allow(dead_code)] // used by the backends that are compiled in
async fn begin_with<C>(conn: &mut C, sql: &str) -> QueryResult<Nesting>
where
    C: AsyncConnection<TransactionManager = diesel_async::AnsiTransactionManager>,
{
    match diesel_async::AnsiTransactionManager::begin_transaction_sql(conn, sql).await {
        Ok(()) => Ok(Nesting::Outermost),
        Err(DieselError::AlreadyInTransaction) => {
            diesel_async::AnsiTransactionManager::begin_transaction(conn).await?;
            Ok(Nesting::Savepoint)
        }
        Err(e) => Err(e),
    }
}

/// Implements [`AsyncJobStore`] for a diesel-async connection with the shared DSL statements.
#[cfg(any(feature = "async-postgres", feature = "async-mysql"))]
macro_rules! impl_async_job_store {
    (
        $conn:ty,
        migrations: $migrations:expr,
        migration_lock: [$migration_lock:expr, $migration_unlock:expr],
        begin: $begin:expr,
        insert: $insert:ident,
        find: $lock:ident,
        prune: $prune:expr,
        transient: $transient:path $(,)?
    ) => {
        impl AsyncJobStore for $conn {
            async fn begin_job(&mut self) -> QueryResult<Nesting> {
                begin_with(self, $begin).await
            }

            async fn insert_claim(&mut self, claim: &Claim<'_>) -> QueryResult<bool> {
                use diesel::prelude::*;
                use diesel_async::RunQueryDsl;
                statements!(insert_claim, self, claim, $insert, [.await])
            }

            async fn find_claim(&mut self, digest: &[u8; 32]) -> QueryResult<Option<DoneRow>> {
                use diesel::prelude::*;
                use diesel_async::RunQueryDsl;
                statements!(find_claim, self, digest, $lock, [.await])
            }

            async fn renew_lapsed_claim(&mut self, claim: &Claim<'_>) -> QueryResult<bool> {
                use diesel::prelude::*;
                use diesel_async::RunQueryDsl;
                statements!(renew_lapsed_claim, self, claim, [.await])
            }

            async fn record_result(&mut self, digest: &[u8; 32], result: &str) -> QueryResult<()> {
                use diesel::prelude::*;
                use diesel_async::RunQueryDsl;
                statements!(record_result, self, digest, result, [.await])
            }

            async fn insert_outbox(&mut self, message: &NewOutboxMessage<'_>) -> QueryResult<()> {
                use diesel::prelude::*;
                use diesel_async::RunQueryDsl;
                statements!(insert_outbox, self, message, [.await])
            }

            async fn prune_lapsed(
                &mut self,
                now: chrono::NaiveDateTime,
                limit: i64,
            ) -> QueryResult<usize> {
                use diesel_async::RunQueryDsl;
                statements!(prune_lapsed, self, $prune, now, limit, [.await])
            }

            fn is_transient(error: &DieselError) -> bool {
                $transient(error)
            }

            async fn run_migrations(&mut self) -> Result<(), BoxError> {
                use diesel::prelude::*;
                use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
                use migrations::__diesel_schema_migrations as applied_table;
                // Several workers may start at once: one migrates, the others wait, then find
                // nothing left to do.
                self.batch_execute($migration_lock).await?;
                let migrated: Result<(), BoxError> = async {
                    self.batch_execute(migrations::CREATE_TABLE).await?;
                    let applied: Vec<String> = applied_table::table
                        .select(applied_table::version)
                        .load(self)
                        .await?;
                    for (version, up) in $migrations {
                        if applied.iter().any(|v| v == version) {
                            continue;
                        }
                        begin_with(self, "BEGIN").await?;
                        let ran = async {
                            self.batch_execute(up).await?;
                            diesel::insert_into(applied_table::table)
                                .values(applied_table::version.eq(*version))
                                .execute(self)
                                .await
                        }
                        .await;
                        match ran {
                            Ok(_) => Self::TransactionManager::commit_transaction(self).await?,
                            Err(error) => {
                                let _ = Self::TransactionManager::rollback_transaction(self).await;
                                return Err(error.into());
                            }
                        }
                    }
                    Ok(())
                }
                .await;
                self.batch_execute($migration_unlock).await?;
                migrated
            }
        }
    };
}

#[cfg(feature = "async-postgres")]
impl_async_job_store!(
    diesel_async::AsyncPgConnection,
    migrations: crate::migrations::POSTGRES,
    migration_lock: [
        "SELECT pg_advisory_lock(7307305512431843179)",
        "SELECT pg_advisory_unlock(7307305512431843179)"
    ],
    begin: crate::store::begin::POSTGRES,
    insert: on_conflict_do_nothing,
    find: plain,
    prune: crate::store::prune::POSTGRES,
    transient: crate::store::pg_is_transient,
);

#[cfg(feature = "async-mysql")]
impl_async_job_store!(
    diesel_async::AsyncMysqlConnection,
    migrations: crate::migrations::MYSQL,
    migration_lock: [
        crate::store::migration_lock::MYSQL_LOCK,
        crate::store::migration_lock::MYSQL_UNLOCK
    ],
    begin: crate::store::begin::MYSQL,
    insert: duplicate_key_error,
    find: for_update,
    prune: crate::store::prune::MYSQL,
    transient: crate::store::mysql_is_transient,
);

/// SQLite through diesel-async runs the sync statements on a blocking thread: the wrapper's own
/// model, and the one way to reach `BEGIN IMMEDIATE` on its inner connection.
#[cfg(feature = "async-sqlite")]
mod sqlite {
    use super::*;
    use crate::store::JobStore;
    use diesel::SqliteConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

    /// A claim that can move to the blocking thread.
    struct OwnedClaim {
        digest: [u8; 32],
        key: String,
        job: String,
        fingerprint: Option<Vec<u8>>,
        now: chrono::NaiveDateTime,
        expires_at: Option<chrono::NaiveDateTime>,
    }

    impl OwnedClaim {
        fn new(claim: &Claim<'_>) -> Self {
            Self {
                digest: *claim.digest,
                key: claim.key.to_owned(),
                job: claim.job.to_owned(),
                fingerprint: claim.fingerprint.map(<[u8]>::to_vec),
                now: claim.now,
                expires_at: claim.expires_at,
            }
        }

        fn claim(&self) -> Claim<'_> {
            Claim {
                digest: &self.digest,
                key: &self.key,
                job: &self.job,
                fingerprint: self.fingerprint.as_deref(),
                now: self.now,
                expires_at: self.expires_at,
            }
        }
    }

    impl AsyncJobStore for SyncConnectionWrapper<SqliteConnection> {
        async fn begin_job(&mut self) -> QueryResult<Nesting> {
            self.spawn_blocking(JobStore::begin_job).await
        }

        async fn insert_claim(&mut self, claim: &Claim<'_>) -> QueryResult<bool> {
            let claim = OwnedClaim::new(claim);
            self.spawn_blocking(move |conn| conn.insert_claim(&claim.claim()))
                .await
        }

        async fn find_claim(&mut self, digest: &[u8; 32]) -> QueryResult<Option<DoneRow>> {
            let digest = *digest;
            self.spawn_blocking(move |conn| conn.find_claim(&digest))
                .await
        }

        async fn renew_lapsed_claim(&mut self, claim: &Claim<'_>) -> QueryResult<bool> {
            let claim = OwnedClaim::new(claim);
            self.spawn_blocking(move |conn| conn.renew_lapsed_claim(&claim.claim()))
                .await
        }

        async fn record_result(&mut self, digest: &[u8; 32], result: &str) -> QueryResult<()> {
            let (digest, result) = (*digest, result.to_owned());
            self.spawn_blocking(move |conn| conn.record_result(&digest, &result))
                .await
        }

        async fn insert_outbox(&mut self, message: &NewOutboxMessage<'_>) -> QueryResult<()> {
            let (id, topic, payload, key, now) = (
                message.message_id.to_owned(),
                message.topic.to_owned(),
                message.payload.to_owned(),
                message.job_key.to_owned(),
                message.now,
            );
            self.spawn_blocking(move |conn| {
                conn.insert_outbox(&NewOutboxMessage {
                    message_id: &id,
                    topic: &topic,
                    payload: &payload,
                    job_key: &key,
                    now,
                })
            })
            .await
        }

        async fn prune_lapsed(
            &mut self,
            now: chrono::NaiveDateTime,
            limit: i64,
        ) -> QueryResult<usize> {
            self.spawn_blocking(move |conn| conn.prune_lapsed(now, limit))
                .await
        }

        fn is_transient(error: &DieselError) -> bool {
            crate::store::sqlite_is_transient(error)
        }

        async fn run_migrations(&mut self) -> Result<(), BoxError> {
            // The migration error is not `Send`-able through `QueryResult`; carry its text.
            let outcome = self
                .spawn_blocking(|conn| Ok(conn.run_migrations().map_err(|e| e.to_string())))
                .await?;
            outcome.map_err(Into::into)
        }
    }
}

/// Diesel's own record of applied migrations, so sync and async runs agree on what has run.
#[allow(dead_code)] // used by the backends that are compiled in
mod migrations {
    diesel::table! {
        __diesel_schema_migrations (version) {
            version -> VarChar,
            run_on -> Timestamp,
        }
    }

    /// As diesel_migrations creates it.
    pub(crate) const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS __diesel_schema_migrations (\
         version VARCHAR(50) PRIMARY KEY NOT NULL, \
         run_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)";
}
