//! The databases, one module each ([`sqlite`], [`postgres`], [`mysql`]): every statement, error
//! classification, lock, migration and inspection query of that database, for sync and async
//! connections alike (see [`crate::store`]).
//!
//! This module holds what no database differs in: how a sync or an async connection type runs
//! statements and transactions ([`sync_store!`], [`async_store!`]).

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
use diesel::connection::{AnsiTransactionManager, Connection, TransactionManager};
use diesel::result::Error as DieselError;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
use diesel::result::QueryResult;

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
use crate::store::Nesting;

/// Opens a transaction with `sql` on a sync connection of database `D`, or a savepoint inside the
/// caller's.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn begin_sync<D, C>(conn: &mut C, sql: &str) -> QueryResult<Nesting>
where
    D: crate::store::Database,
    C: Connection<TransactionManager = AnsiTransactionManager>,
{
    match AnsiTransactionManager::begin_transaction_sql(conn, sql) {
        Ok(()) => Ok(Nesting::Outermost),
        Err(DieselError::AlreadyInTransaction) => {
            let depth = depth_sync(conn)?;
            conn.batch_execute(&marked_savepoint::<D>(depth))?;
            change_depth(
                <AnsiTransactionManager as TransactionManager<C>>::transaction_manager_status_mut(
                    conn,
                ),
            )?;
            Ok(Nesting::Savepoint)
        }
        Err(error) => Err(error),
    }
}

/// What Diesel sends to open a savepoint inside a caller's transaction at `depth`, with the
/// runtime's mark before it in the same batch (no round trip more). Where the server may have
/// ended the caller's transaction under it
/// ([`Database::TRANSACTION_MAY_END_UNDER_THE_SESSION`](crate::store::Database::TRANSACTION_MAY_END_UNDER_THE_SESSION)),
/// the mark is rolled back to at once: outside any transaction the savepoint is gone with the
/// statement that set it, and the batch stops there, before the job's savepoint, claim or body
/// ([`crate::transaction::callers_transaction_gone`]).
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "async"
))]
fn marked_savepoint<D: crate::store::Database>(depth: u32) -> String {
    let mark = crate::transaction::enclosing_mark(depth);
    match D::TRANSACTION_MAY_END_UNDER_THE_SESSION {
        true => format!(
            "SAVEPOINT {mark}; ROLLBACK TO SAVEPOINT {mark}; SAVEPOINT diesel_savepoint_{depth}"
        ),
        false => format!("SAVEPOINT {mark}; SAVEPOINT diesel_savepoint_{depth}"),
    }
}

/// Counts one transaction more in Diesel's manager (the savepoint just opened).
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "async"
))]
fn change_depth(
    status: &mut diesel::connection::TransactionManagerStatus,
) -> diesel::QueryResult<()> {
    match status {
        diesel::connection::TransactionManagerStatus::Valid(valid) => valid
            .change_transaction_depth(diesel::connection::TransactionDepthChange::IncreaseDepth),
        diesel::connection::TransactionManagerStatus::InError => {
            Err(DieselError::BrokenTransactionManager)
        }
    }
}

/// Opens a transaction the way Diesel does, with `sql` (one batch, sent as text).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn ansi_begin<C>(conn: &mut C, sql: &str) -> QueryResult<Nesting>
where
    C: Connection<TransactionManager = AnsiTransactionManager> + crate::store::Store,
{
    begin_sync::<C::Db, C>(conn, sql)
}

/// Commits the innermost transaction the way Diesel does.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn ansi_commit<C>(conn: &mut C) -> diesel::QueryResult<()>
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
{
    <AnsiTransactionManager as TransactionManager<C>>::commit_transaction(conn)
}

/// Rolls the innermost transaction back the way Diesel does.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn ansi_rollback<C>(conn: &mut C) -> diesel::QueryResult<()>
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
{
    <AnsiTransactionManager as TransactionManager<C>>::rollback_transaction(conn)
}

/// Opens a transaction with `sql`, a `BEGIN` bounded by
/// [`Database::bounded_begin_sql`](crate::store::Database::bounded_begin_sql), as [`begin_sync`]
/// does; when it fails, puts back the wait the bound set (it must not outlive the attempt).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn begin_bounded_sync<D, C>(conn: &mut C, sql: &str) -> QueryResult<Nesting>
where
    D: crate::store::Database,
    C: Connection<TransactionManager = AnsiTransactionManager>,
{
    let begun = begin_sync::<D, C>(conn, sql);
    if begun.is_err()
        && let Some(reset) = D::bounded_begin_failed_sql()
        && let Err(error) = conn.batch_execute(reset)
    {
        tracing::warn!(%error, "putting the connection's busy timeout back failed");
    }
    begun
}

/// How many transactions a transaction manager's status says are open.
fn depth(status: &mut diesel::connection::TransactionManagerStatus) -> diesel::QueryResult<u32> {
    Ok(status
        .transaction_depth()?
        .map_or(0, std::num::NonZeroU32::get))
}

/// [`depth`] for a sync connection.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn depth_sync<C>(conn: &mut C) -> QueryResult<u32>
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
{
    depth(<AnsiTransactionManager as TransactionManager<C>>::transaction_manager_status_mut(conn))
}

/// Where a connection's statements are not cancel-safe (`Store::STATEMENTS_CANCEL_SAFE`): its
/// transaction state, set to broken while a statement of the runtime's runs, to be put back by
/// [`put_back`] once it has run. A statement dropped midway leaves the connection broken.
#[cfg(feature = "async")]
pub(crate) fn hold_broken<C>(conn: &mut C) -> Option<diesel::connection::TransactionManagerStatus>
where
    C: diesel_async::AsyncConnection + crate::store::Store,
{
    use diesel_async::TransactionManager as _;
    if C::STATEMENTS_CANCEL_SAFE {
        return None;
    }
    Some(std::mem::replace(
        C::TransactionManager::transaction_manager_status_mut(conn),
        diesel::connection::TransactionManagerStatus::InError,
    ))
}

/// Puts back what [`hold_broken`] held.
#[cfg(feature = "async")]
pub(crate) fn put_back<C>(conn: &mut C, held: Option<diesel::connection::TransactionManagerStatus>)
where
    C: diesel_async::AsyncConnection,
{
    use diesel_async::TransactionManager as _;
    if let Some(status) = held {
        *C::TransactionManager::transaction_manager_status_mut(conn) = status;
    }
}

/// [`depth`] for a diesel-async connection.
#[cfg(feature = "async")]
pub(crate) fn depth_async<C: diesel_async::AsyncConnection>(
    conn: &mut C,
) -> diesel::QueryResult<u32> {
    use diesel_async::TransactionManager as _;
    depth(C::TransactionManager::transaction_manager_status_mut(conn))
}

/// A job's outermost transaction opened without its savepoint, which the lifecycle sets after the
/// claim ([`Nesting::Unmarked`]); Diesel's savepoint inside a caller's transaction stays as it is.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn unmarked(nesting: Nesting) -> Nesting {
    match nesting {
        Nesting::Outermost => Nesting::Unmarked,
        other => other,
    }
}

/// The text of a database error, for databases that report some conditions only in words.
pub(crate) fn message(error: &DieselError) -> Option<&str> {
    match error {
        DieselError::DatabaseError(_, info) => Some(info.message()),
        _ => None,
    }
}

/// A name read from a catalog.
#[derive(diesel::QueryableByName)]
pub(crate) struct Name {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub(crate) name: String,
}

/// A row rendered as text by the query that read it.
#[derive(diesel::QueryableByName)]
pub(crate) struct TextRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub(crate) row: String,
}

/// `name` as a double-quoted SQL identifier (SQLite, PostgreSQL).
#[cfg(feature = "sqlite")]
pub(crate) fn double_quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `name` as a MySQL identifier.
#[cfg(any(feature = "mysql", feature = "async-mysql"))]
pub(crate) fn backticked(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// The `Store` methods that run statements, through `$dsl`'s `RunQueryDsl` (`diesel` for a sync
/// connection, `diesel_async` with `await` for an async one) and `$simple`'s `batch_execute`.
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "async"
))]
macro_rules! statement_methods {
    ($dsl:ident, $simple:path $(, $await:ident)?) => {
        async fn execute<S, B>(
            &mut self,
            statement: $crate::sql::Statement<S, B>,
        ) -> diesel::QueryResult<usize>
        where
            S: $crate::sql::SqlText,
            B: $crate::sql::Binds<<Self::Db as $crate::store::Database>::Backend> + Send,
        {
            $(let held = { let _ = stringify!($await); $crate::db::hold_broken(self) };)?
            let done = match $dsl::RunQueryDsl::execute(statement, self)$(.$await)? {
                Err(error) => Err(
                    <Self::Db as $crate::store::Database>::in_known_terms(self, error).await,
                ),
                done => done,
            };
            $({ let _ = stringify!($await); $crate::db::put_back(self, held); })?
            done
        }

        async fn load<S, B, U>(
            &mut self,
            statement: $crate::sql::Statement<S, B>,
        ) -> diesel::QueryResult<Vec<U>>
        where
            S: $crate::sql::SqlText,
            B: $crate::sql::Binds<<Self::Db as $crate::store::Database>::Backend> + Send,
            U: diesel::QueryableByName<<Self::Db as $crate::store::Database>::Backend>
                + Send
                + 'static,
        {
            $(let held = { let _ = stringify!($await); $crate::db::hold_broken(self) };)?
            let rows = match $dsl::RunQueryDsl::load(statement, self)$(.$await)? {
                Err(error) => {
                    $crate::store::Store::after_failed_read(self);
                    Err(<Self::Db as $crate::store::Database>::in_known_terms(self, error).await)
                }
                rows => rows,
            };
            $({ let _ = stringify!($await); $crate::db::put_back(self, held); })?
            rows
        }

        async fn batch(&mut self, sql: &str) -> diesel::QueryResult<()> {
            $(let held = { let _ = stringify!($await); $crate::db::hold_broken(self) };)?
            let done = <Self as $simple>::batch_execute(self, sql)$(.$await)?;
            $({ let _ = stringify!($await); $crate::db::put_back(self, held); })?
            done
        }

        async fn text_rows(&mut self, sql: &str) -> diesel::QueryResult<Vec<String>> {
            $(let held = { let _ = stringify!($await); $crate::db::hold_broken(self) };)?
            let rows = match $dsl::RunQueryDsl::load::<$crate::db::TextRow>(diesel::sql_query(sql), self)$(.$await)? {
                Ok(rows) => Ok(rows.into_iter().map(|r| r.row).collect()),
                Err(error) => {
                    $crate::store::Store::after_failed_read(self);
                    Err(error)
                }
            };
            $({ let _ = stringify!($await); $crate::db::put_back(self, held); })?
            rows
        }
    };
}

/// Implements `Store` (and `JobStore`) for a sync Diesel connection whose transactions begin with
/// `$begin`.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
macro_rules! sync_store {
    ($conn:ty, $db:ty, begin: $begin:expr, job: $job_begin:expr $(, deferred: $deferred:expr)? $(, one_batch: $one_batch:expr)?) => {
        sync_store!($conn, $db, begin: $begin, job: $job_begin, transactions: $crate::db::ansi_begin, $crate::db::ansi_begin, $crate::db::ansi_commit, $crate::db::ansi_rollback $(, deferred: $deferred)? $(, one_batch: $one_batch)?);
    };
    ($conn:ty, $db:ty, begin: $begin:expr, job: $job_begin:expr, transactions: $open:path, $open_job:path, $close:path, $undo:path $(, deferred: $deferred:expr)? $(, one_batch: $one_batch:expr)? $(, finish: $finish:path)? $(, pipelined: $pipelined:path)? $(, failed_read: $failed_read:path)?) => {
        impl $crate::store::Store for $conn {
            type Db = $db;
            $(fn after_failed_read(&mut self) {
                $failed_read(self)
            })?
            $(fn finish_in_one_batch(&mut self) -> bool {
                $one_batch
            })?

            $(async fn release_and_commit(&mut self) -> diesel::QueryResult<()> {
                $finish(self)
            })?

            $(async fn begin_job_pipelined<S, B>(
                &mut self,
                first: $crate::sql::Statement<S, B>,
            ) -> Option<diesel::QueryResult<($crate::store::Nesting, diesel::QueryResult<usize>)>>
            where
                S: $crate::sql::SqlText,
                B: $crate::sql::Binds<<Self::Db as $crate::store::Database>::Backend> + Send,
            {
                // The claim's error in terms the runtime knows, before anything else is sent.
                let known = <Self::Db as $crate::store::Database>::in_known_terms;
                Some(match $pipelined(self, first)? {
                    Ok((nesting, Err(error))) => Ok((nesting, Err(known(self, error).await))),
                    Err(error) => Err(known(self, error).await),
                    began => began,
                })
            })?

            $(async fn begin_deferred(&mut self) -> diesel::QueryResult<$crate::store::Nesting> {
                $open(self, $deferred)
            })?

            async fn begin(&mut self) -> diesel::QueryResult<$crate::store::Nesting> {
                $open(self, $begin)
            }

            async fn begin_job(
                &mut self,
                bound: Option<std::time::Duration>,
            ) -> diesel::QueryResult<$crate::store::Nesting> {
                let bounded = bound.and_then(<$db as $crate::store::Database>::bounded_begin_sql);
                match bounded {
                    // A bound on `BEGIN`'s wait for the write lock (SQLite's): unmarked, as its
                    // unbounded `BEGIN`, the job's savepoint set after the claim.
                    Some(sql) => $crate::db::begin_bounded_sync::<$db, _>(self, &sql)
                        .map($crate::db::unmarked),
                    None => $open_job(self, $job_begin),
                }
            }

            fn forget_transaction(&mut self, broken: bool) {
                $crate::db::forget_sync(self, broken);
            }

            fn count_transactions(&mut self, depth: u32) {
                $crate::db::counted(
                    <diesel::connection::AnsiTransactionManager as diesel::connection::TransactionManager<Self>>::transaction_manager_status_mut(self),
                    depth,
                );
            }

            fn uncount_to(&mut self, depth: u32) {
                $crate::db::uncounted(
                    <diesel::connection::AnsiTransactionManager as diesel::connection::TransactionManager<Self>>::transaction_manager_status_mut(self),
                    depth,
                );
            }

            async fn begin_bounded(
                &mut self,
                limit: std::time::Duration,
            ) -> diesel::QueryResult<$crate::store::Nesting> {
                match <$db as $crate::store::Database>::bounded_begin_sql(limit) {
                    Some(sql) => $crate::db::begin_bounded_sync::<$db, _>(self, &sql),
                    None => $open(self, $begin),
                }
            }

            async fn commit(&mut self) -> diesel::QueryResult<()> {
                $close(self)
            }

            async fn rollback(&mut self) -> diesel::QueryResult<()> {
                $undo(self)
            }

            fn abandon(&mut self, unfinished: $crate::store::Unfinished) {
                let cleaned = match unfinished {
                    $crate::store::Unfinished::Transaction => $undo(self),
                    $crate::store::Unfinished::SessionLock(release) => {
                        diesel::connection::SimpleConnection::batch_execute(self, release)
                    }
                };
                // Diesel marks the connection broken when a rollback fails, so no later job
                // commits into what is left of this transaction.
                if let Err(error) = cleaned {
                    tracing::error!(%error, "cleaning up after an unfinished transaction failed");
                }
            }

            fn transaction_depth(&mut self) -> diesel::QueryResult<u32> {
                $crate::db::depth_sync(self)
            }

            async fn pause(duration: std::time::Duration) {
                std::thread::sleep(duration);
            }

            statement_methods!(diesel, diesel::connection::SimpleConnection);
        }

        job_store!($conn, $crate::connection::JobStore);
    };
}

/// Implements `Sealed` and `$job_store` (`JobStore` or `AsyncJobStore`) for `$conn`, whose
/// `Store` is itself.
macro_rules! job_store {
    ($conn:ty, $job_store:path) => {
        impl $crate::connection::Sealed for $conn {}

        impl $job_store for $conn {
            type Runtime = Self;

            fn idempotent_store(&mut self) -> &mut Self {
                self
            }
        }
    };
}

/// The `Store` methods no diesel-async connection differs in (everything but how a transaction
/// begins): its own transaction manager counts, commits and rolls back (the top-level transaction
/// with the database's own `Database::COMMIT` and `ROLLBACK`); a dropped transaction marks
/// the connection broken; statements go through diesel-async's `RunQueryDsl`.
#[cfg(feature = "async")]
macro_rules! async_store_methods {
    () => {
        fn forget_transaction(&mut self, broken: bool) {
            $crate::db::forget_async(self, broken);
        }

        fn count_transactions(&mut self, depth: u32) {
            use diesel_async::TransactionManager as _;
            $crate::db::counted(
                <Self as diesel_async::AsyncConnection>::TransactionManager::transaction_manager_status_mut(self),
                depth,
            );
        }

        fn uncount_to(&mut self, depth: u32) {
            use diesel_async::TransactionManager as _;
            $crate::db::uncounted(
                <Self as diesel_async::AsyncConnection>::TransactionManager::transaction_manager_status_mut(self),
                depth,
            );
        }

        async fn commit(&mut self) -> diesel::QueryResult<()> {
            $crate::db::commit_async(self).await
        }

        async fn rollback(&mut self) -> diesel::QueryResult<()> {
            $crate::db::rollback_async(self).await
        }

        fn abandon(&mut self, _unfinished: $crate::store::Unfinished) {
            $crate::db::mark_broken(self);
        }

        fn transaction_depth(&mut self) -> diesel::QueryResult<u32> {
            $crate::db::depth_async(self)
        }

        async fn pause(duration: std::time::Duration) {
            tokio::time::sleep(duration).await;
        }

        statement_methods!(diesel_async, diesel_async::SimpleAsyncConnection, await);
    };
}

/// Implements `Store` (and `AsyncJobStore`) for a diesel-async connection with diesel-async's
/// `AnsiTransactionManager`, whose transactions begin with `$begin`.
#[cfg(any(feature = "async-postgres", feature = "async-mysql"))]
macro_rules! async_store {
    ($conn:ty, $db:ty, begin: $begin:expr, job: $job_begin:expr $(, read_first_in_transaction: $inside:expr)? $(, pipelined: $pipelined:path)? $(, cancel_safe: $safe:expr)?) => {
        impl $crate::store::Store for $conn {
            type Db = $db;
            $(const READ_FIRST_IN_TRANSACTION: bool = $inside;)?
            $(const STATEMENTS_CANCEL_SAFE: bool = $safe;)?
            fn finish_in_one_batch(&mut self) -> bool {
                true
            }

            async fn begin(&mut self) -> diesel::QueryResult<$crate::store::Nesting> {
                $crate::db::begin_async(self, $begin).await
            }

            async fn begin_job(
                &mut self,
                _bound: Option<std::time::Duration>,
            ) -> diesel::QueryResult<$crate::store::Nesting> {
                $crate::db::begin_async(self, $job_begin).await
            }

            $(async fn begin_job_pipelined<S, B>(
                &mut self,
                first: $crate::sql::Statement<S, B>,
            ) -> Option<diesel::QueryResult<($crate::store::Nesting, diesel::QueryResult<usize>)>>
            where
                S: $crate::sql::SqlText,
                B: $crate::sql::Binds<<Self::Db as $crate::store::Database>::Backend> + Send,
            {
                $pipelined(self, first).await
            })?

            async_store_methods!();
        }

        job_store!($conn, $crate::connection::AsyncJobStore);
    };
}

/// Runs `a` and `b` concurrently on this task, `a` polled first: two requests on a connection that
/// pipelines go out in that order, in one flight.
#[cfg(feature = "async-postgres")]
pub(crate) async fn both<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    use std::task::Poll;
    let (mut a, mut b) = (std::pin::pin!(a), std::pin::pin!(b));
    let (mut a_done, mut b_done) = (None, None);
    std::future::poll_fn(|cx| {
        if a_done.is_none()
            && let Poll::Ready(output) = a.as_mut().poll(cx)
        {
            a_done = Some(output);
        }
        if b_done.is_none()
            && let Poll::Ready(output) = b.as_mut().poll(cx)
        {
            b_done = Some(output);
        }
        match (a_done.take(), b_done.take()) {
            (Some(a), Some(b)) => Poll::Ready((a, b)),
            (a, b) => {
                (a_done, b_done) = (a, b);
                Poll::Pending
            }
        }
    })
    .await
}

/// Opens a transaction with `sql` on a diesel-async connection, or a savepoint inside the caller's.
#[cfg(any(feature = "async-postgres", feature = "async-mysql"))]
pub(crate) async fn begin_async<C>(
    conn: &mut C,
    sql: &str,
) -> diesel::QueryResult<crate::store::Nesting>
where
    C: diesel_async::AsyncConnection<TransactionManager = diesel_async::AnsiTransactionManager>
        + crate::store::Store,
{
    use diesel_async::{AnsiTransactionManager, TransactionManager};
    match AnsiTransactionManager::begin_transaction_sql(conn, sql).await {
        Ok(()) => Ok(crate::store::Nesting::Outermost),
        Err(DieselError::AlreadyInTransaction) => {
            // Diesel's savepoint with the runtime's mark before it (`transaction::enclosing_mark`). A
            // future dropped while it is in flight is the runtime's transaction guard's to mark
            // broken, as for any statement of a job's.
            let depth = depth_async(conn)?;
            let sql = marked_savepoint::<C::Db>(depth);
            diesel_async::SimpleAsyncConnection::batch_execute(conn, &sql).await?;
            change_depth(AnsiTransactionManager::transaction_manager_status_mut(conn))?;
            Ok(crate::store::Nesting::Savepoint)
        }
        Err(error) => Err(error),
    }
}

/// Commits the innermost transaction of a diesel-async connection: as its transaction manager
/// does, but the top-level one with [`Database::COMMIT`](crate::store::Database::COMMIT) where that
/// is not the manager's plain `COMMIT` (MySQL: whatever the session's `completion_type`). A failed
/// `COMMIT` is rolled back; a connection that cannot roll back is marked broken. (A future dropped
/// here is the caller's transaction guard's to mark broken.)
#[cfg(feature = "async")]
pub(crate) async fn commit_async<C>(conn: &mut C) -> diesel::QueryResult<()>
where
    C: diesel_async::AsyncConnection + crate::store::Store,
{
    use crate::store::Database;
    use diesel_async::TransactionManager;
    let sql = <C::Db as Database>::COMMIT;
    if sql == "COMMIT" || depth_async(conn)? != 1 {
        return C::TransactionManager::commit_transaction(conn).await;
    }
    match conn.batch_execute(sql).await {
        Ok(()) => left_async(conn),
        Err(commit_error) => match rollback_async(conn).await {
            Ok(()) => Err(commit_error),
            Err(rollback_error) => {
                C::TransactionManager::transaction_manager_status_mut(conn).set_in_error();
                Err(DieselError::RollbackErrorOnCommit {
                    rollback_error: Box::new(rollback_error),
                    commit_error: Box::new(commit_error),
                })
            }
        },
    }
}

/// Rolls the innermost transaction of a diesel-async connection back: see [`commit_async`]. A
/// connection that cannot roll back its top-level transaction is marked broken.
#[cfg(feature = "async")]
pub(crate) async fn rollback_async<C>(conn: &mut C) -> diesel::QueryResult<()>
where
    C: diesel_async::AsyncConnection + crate::store::Store,
{
    use crate::store::Database;
    use diesel_async::TransactionManager;
    let sql = <C::Db as Database>::ROLLBACK;
    if sql == "ROLLBACK" || depth_async(conn)? != 1 {
        return C::TransactionManager::rollback_transaction(conn).await;
    }
    match conn.batch_execute(sql).await {
        Ok(()) => left_async(conn),
        Err(error) => {
            C::TransactionManager::transaction_manager_status_mut(conn).set_in_error();
            Err(error)
        }
    }
}

/// Tells a diesel-async connection's transaction manager that its top-level transaction ended.
#[cfg(feature = "async")]
fn left_async<C: diesel_async::AsyncConnection>(conn: &mut C) -> diesel::QueryResult<()> {
    use diesel_async::TransactionManager as _;
    match C::TransactionManager::transaction_manager_status_mut(conn) {
        diesel::connection::TransactionManagerStatus::Valid(valid) => {
            match valid
                .change_transaction_depth(diesel::connection::TransactionDepthChange::DecreaseDepth)
            {
                // The connection may have noticed the end of the transaction itself.
                Ok(()) | Err(DieselError::NotInTransaction) => Ok(()),
                Err(error) => Err(error),
            }
        }
        diesel::connection::TransactionManagerStatus::InError => {
            Err(DieselError::BrokenTransactionManager)
        }
    }
}

/// Diesel's count lowered to `depth` open transactions, its other state kept.
pub(crate) fn uncounted(status: &mut diesel::connection::TransactionManagerStatus, depth: u32) {
    use diesel::connection::{TransactionDepthChange, TransactionManagerStatus};
    if let TransactionManagerStatus::Valid(valid) = status {
        while valid
            .transaction_depth()
            .is_some_and(|counted| counted.get() > depth)
        {
            if let Err(error) =
                valid.change_transaction_depth(TransactionDepthChange::DecreaseDepth)
            {
                tracing::warn!(%error, "uncounting the runtime's savepoint failed");
                return;
            }
        }
    }
}

/// Diesel's count set to `depth` open transactions, in a clean state.
pub(crate) fn counted(status: &mut diesel::connection::TransactionManagerStatus, depth: u32) {
    *status = diesel::connection::TransactionManagerStatus::Valid(Default::default());
    for _ in 0..depth {
        if let Err(error) = change_depth(status) {
            tracing::warn!(%error, "counting the caller's transactions failed");
            return;
        }
    }
}

/// What [`Store::forget_transaction`](crate::store::Store::forget_transaction) does to a
/// transaction manager's status: no transaction open, or broken.
fn forgotten(status: &mut diesel::connection::TransactionManagerStatus, broken: bool) {
    if broken {
        status.set_in_error();
    } else {
        *status = diesel::connection::TransactionManagerStatus::Valid(Default::default());
    }
}

/// [`forgotten`] for a sync connection.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn forget_sync<C>(conn: &mut C, broken: bool)
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
{
    forgotten(
        <AnsiTransactionManager as TransactionManager<C>>::transaction_manager_status_mut(conn),
        broken,
    );
}

/// [`forgotten`] for a diesel-async connection.
#[cfg(feature = "async")]
pub(crate) fn forget_async<C: diesel_async::AsyncConnection>(conn: &mut C, broken: bool) {
    use diesel_async::TransactionManager as _;
    forgotten(
        C::TransactionManager::transaction_manager_status_mut(conn),
        broken,
    );
}

/// Marks an async connection's transaction manager broken: the one thing `drop` can do for a
/// transaction or session lock left open, since no statement can run there. Pools discard such a
/// connection, and a job on it fails instead of committing into what was left open.
#[cfg(feature = "async")]
pub(crate) fn mark_broken<C: diesel_async::AsyncConnection>(conn: &mut C) {
    use diesel_async::TransactionManager as _;
    C::TransactionManager::transaction_manager_status_mut(conn).set_in_error();
    tracing::warn!(
        "a job, a lease or a migration was dropped unfinished; its connection is marked broken and will not be reused"
    );
}

/// The pending messages a relay may lease: not delivered, not parked, not leased, due (by the
/// database's clock, `now_bound!()`, each database module's own: a value an index searches by).
macro_rules! pending {
    () => {
        concat!(
            "delivered_at IS NULL AND parked_at IS NULL AND lease_owner IS NULL AND available_at <= ",
            now_bound!()
        )
    };
}

/// Messages whose relay died while it held them (leased, lease lapsed, never marked).
/// Why a message whose lease lapsed during its last allowed attempt is parked, as an SQL string
/// literal: nothing tells whether it was delivered (the relay stopped, or its mark failed), nor,
/// where the relay's process died or the `COMMIT` of its lease went unanswered, whether it was
/// handed to the delivery function at all (every attempt of a batch is counted when it is leased).
macro_rules! abandoned_reason {
    () => {
        "'its lease lapsed during its last allowed delivery attempt (the relay stopped, or could not record the outcome): it may have been delivered, or, where the relay stopped before it reached this message of its batch, not tried at all'"
    };
}

macro_rules! abandoned {
    () => {
        concat!(
            "delivered_at IS NULL AND parked_at IS NULL AND lease_owner IS NOT NULL AND lease_until <= ",
            now_bound!()
        )
    };
}

// After the macros, which the database modules use.
/// The statements whose text is the same on every database (forgetting and taking back a claim,
/// [`crate::keys`], [`crate::outbox::unsent`]): each database module
/// invokes this beside its own `now!()` (the database's clock), `micros!(column)` (a timestamp
/// as microseconds since the Unix epoch), `message_columns!()` and `read_guard!()` (a condition
/// under which a read outside the runtime's transactions sees the latest commit), and `shared_methods!()` inside
/// its `Database` impl.
///
/// `every_row!()` ends every `SELECT` without a `LIMIT` of its own: on MySQL an explicit `LIMIT`
/// as large as it takes, which a session's `sql_select_limit` cannot cut short (it applies to a
/// `SELECT` without one, and `= 0` returns no row at all). `by_primary_key!()` follows the table
/// of an `UPDATE` of one outbox message by its id: on MySQL `FORCE INDEX (PRIMARY)`, so that it
/// locks that row and no gap where the next push goes.
///
/// Listing and counting scan `done_jobs` (no index on `job_name` or `done_at`: claims, the hot path,
/// do not pay for one); they are for operators, bounded by `LIMIT`.
/// The key's committed row, as a replay reads it: `DoneRead` of `shared_statements!`, and the base
/// of a database's own read before a claim (PostgreSQL's `DoneReadFirst`). Expanded in each
/// database module, with its `micros!`, `now!`, `read_guard!` and `every_row!`.
macro_rules! done_read {
    () => {
        concat!(
            "SELECT job_name, result, fingerprint, ",
            micros!("done_at"),
            " AS done_at_micros, \
               (expires_at IS NOT NULL AND expires_at <= ",
            now!(),
            ") AS lapsed \
             FROM done_jobs WHERE key_digest = ?",
            read_guard!(),
            every_row!()
        )
    };
}

macro_rules! shared_statements {
    () => {
        sql! {
            // A row of a schema before claim tokens, and only while it has none: a run that
            // renews it meanwhile gives it one (a `DELETE` that waited for that run's lock then
            // finds the renewed row and leaves it).
            Forget = "DELETE FROM done_jobs WHERE key_digest = ? AND claim_token IS NULL";
            // A replay's read before any transaction: no lock, no `LIMIT` (the digest is the key).
            // `read_guard!()` is what the database needs for the read to see the latest commit.
            DoneRead = done_read!();
            TakeBack = "DELETE FROM done_jobs WHERE key_digest = ? AND claim_token = ?";
            Record = concat!(
                "UPDATE done_jobs SET result = ?, done_at = ", now!(), ", expires_at = ", now_plus!(),
                " WHERE key_digest = ? AND claim_token = ?"
            );
            Push = concat!(
                "INSERT INTO outbox (message_id, topic, payload, job_key, created_at, available_at) \
                 VALUES (?, ?, ?, ?, ", now!(), ", ", now!(), ")"
            );
            // Held by this lease, or by nobody: a delivery that outlived its lease, whose message
            // another relay then parked, or failed to deliver and backs off, did reach its
            // receiver. A lease another relay holds now is left alone (it delivers again).
            MarkDelivered = concat!(
                "UPDATE outbox", by_primary_key!(), " SET delivered_at = ", now!(), ", parked_at = NULL, lease_owner = NULL, lease_until = NULL \
                 WHERE id = ? AND delivered_at IS NULL AND (lease_owner = ? OR lease_owner IS NULL)"
            );
            MarkFailed = concat!(
                "UPDATE outbox", by_primary_key!(), " SET last_error = ?, lease_owner = NULL, lease_until = NULL, \
                 parked_at = CASE WHEN ? THEN ", now!(), " END, \
                 available_at = COALESCE(", now_plus!(), ", ", now!(), ") \
                 WHERE id = ? AND lease_owner = ?"
            );
            Parked = concat!(
                "SELECT ", message_columns!(), " FROM outbox WHERE parked_at IS NOT NULL ORDER BY id", every_row!()
            );
            // A message a round leased (by its owner token) and never handed to the delivery:
            // released, its attempt uncounted. By its primary key: on InnoDB a filter on
            // `lease_owner` (no index) would lock every row, the one whose mark failed among them.
            ReleaseUntried = concat!(
                "UPDATE outbox", by_primary_key!(), " SET lease_owner = NULL, lease_until = NULL, attempts = attempts - 1 \
                 WHERE id = ? AND lease_owner = ? AND delivered_at IS NULL AND attempts > 0"
            );
            ForgetDieselVersions = "DELETE FROM __diesel_schema_migrations WHERE version IN ('20261130000001', '20261130000002')";
            // Takes over a lapsed claim, or a committed one whose run never recorded its result.
            // No literal `''` in these statements: MariaDB's `sql_mode` `EMPTY_STRING_IS_NULL`
            // reads it as NULL (a bound `''`, the placeholder, is stored as it is).
            Renew = concat!(
                "UPDATE done_jobs SET job_key = ?, job_name = ?, fingerprint = ?, claim_token = ?, result = ?, done_at = ",
                now!(),
                ", expires_at = NULL WHERE key_digest = ? AND (expires_at <= ", now!(), " OR LENGTH(result) = 0)"
            );

            LookupKey = concat!(
                "SELECT key_digest, job_key, job_name, claim_token, \
                   (result IS NOT NULL AND LENGTH(result) > 0) AS has_result, (result IS NOT NULL AND LENGTH(result) = 0) AS unfinished, (fingerprint IS NOT NULL) AS has_fingerprint, ",
                micros!("done_at"), " AS done_at_micros, ", micros!("expires_at"), " AS expires_at_micros, \
                   (expires_at IS NOT NULL AND expires_at <= ", now!(), ") AS lapsed \
                 FROM done_jobs WHERE key_digest = ?", every_row!()
            );
            SchemaVersion = concat!("SELECT MAX(version) AS version FROM idempotent_schema", every_row!());
            ListKeys = concat!(
                "SELECT key_digest, job_key, job_name, claim_token, \
                   (result IS NOT NULL AND LENGTH(result) > 0) AS has_result, (result IS NOT NULL AND LENGTH(result) = 0) AS unfinished, (fingerprint IS NOT NULL) AS has_fingerprint, ",
                micros!("done_at"), " AS done_at_micros, ", micros!("expires_at"), " AS expires_at_micros, \
                   (expires_at IS NOT NULL AND expires_at <= ", now!(), ") AS lapsed \
                 FROM done_jobs \
                 WHERE (? IS NULL OR job_name = ?) \
                   AND (? IS NULL OR ", micros!("done_at"), " >= ?) \
                   AND (? IS NULL OR ", micros!("done_at"), " < ?) \
                   AND (? IS NULL OR ", micros!("done_at"), " < ? \
                        OR (", micros!("done_at"), " = ? AND key_digest > ?)) \
                 ORDER BY done_at DESC, key_digest LIMIT ?"
            );
            JobCounts = concat!(
                "SELECT job_name, COUNT(*) AS key_count, \
                   COUNT(CASE WHEN expires_at IS NOT NULL AND expires_at <= ", now!(), " THEN 1 END) AS lapsed_count, ",
                micros!("MIN(done_at)"), " AS oldest_micros, ", micros!("MAX(done_at)"), " AS newest_micros \
                 FROM done_jobs GROUP BY job_name ORDER BY job_name", every_row!()
            );
            Unsent = concat!(
                "SELECT ", message_columns!(), " FROM outbox \
                 WHERE delivered_at IS NULL AND parked_at IS NULL ORDER BY id LIMIT ?"
            );
        }
    };
}

/// The `Database` methods over [`shared_statements!`]' statements.
macro_rules! shared_methods {
    () => {
        async fn forget<C: Store<Db = Self>>(conn: &mut C, digest: &[u8; 32]) -> QueryResult<bool> {
            let deleted = conn
                .execute(Statement::<Forget, _>::new((bind::<Binary, _>(
                    &digest[..],
                ),)))
                .await?;
            Ok(deleted == 1)
        }

        async fn table_exists<C: Store<Db = Self>>(conn: &mut C, table: &str) -> QueryResult<bool> {
            let rows: Vec<crate::migrations::TableCount> = conn
                .load(Statement::<TableExists, _>::new((bind::<Text, _>(table),)))
                .await?;
            Ok(rows.first().is_some_and(|r| r.n > 0))
        }

        async fn index_exists<C: Store<Db = Self>>(
            conn: &mut C,
            table: &str,
            index: &str,
        ) -> QueryResult<bool> {
            let rows: Vec<crate::migrations::TableCount> = conn
                .load(Statement::<IndexExists, _>::new((
                    bind::<Text, _>(table),
                    bind::<Text, _>(index),
                )))
                .await?;
            Ok(rows.first().is_some_and(|r| r.n > 0))
        }

        async fn table_columns<C: Store<Db = Self>>(
            conn: &mut C,
            table: &str,
        ) -> QueryResult<Vec<String>> {
            let columns: Vec<super::Name> = conn
                .load(Statement::<TableColumns, _>::new((bind::<Text, _>(table),)))
                .await?;
            Ok(columns.into_iter().map(|c| c.name).collect())
        }

        async fn done_row<C: Store<Db = Self>>(
            conn: &mut C,
            digest: &[u8; 32],
        ) -> QueryResult<Option<crate::store::DoneRow>> {
            super::shared::done_row_by::<DoneRead, _>(conn, digest).await
        }

        async fn renew<C: Store<Db = Self>>(conn: &mut C, claim: &Claim<'_>) -> QueryResult<bool> {
            let renewed = conn
                .execute(Statement::<Renew, _>::new((
                    bind::<Text, _>(claim.key),
                    bind::<Text, _>(claim.job),
                    bind::<Nullable<Binary>, _>(claim.fingerprint),
                    bind::<BigInt, _>(claim.token),
                    bind::<Nullable<Text>, _>(claim.result),
                    bind::<Binary, _>(&claim.digest[..]),
                )))
                .await?;
            Ok(renewed == 1)
        }

        async fn record<C: Store<Db = Self>>(
            conn: &mut C,
            digest: &[u8; 32],
            token: i64,
            result: Option<&str>,
            keep_micros: Option<i64>,
        ) -> QueryResult<bool> {
            // Rows matched, not changed, on MySQL too (Diesel connects with `CLIENT_FOUND_ROWS`).
            let updated = conn
                .execute(Statement::<Record, _>::new((
                    bind::<Nullable<Text>, _>(result),
                    later(keep_micros),
                    bind::<Binary, _>(&digest[..]),
                    bind::<BigInt, _>(token),
                )))
                .await?;
            Ok(updated == 1)
        }

        async fn prune_lapsed<C: Store<Db = Self>>(conn: &mut C, limit: i64) -> QueryResult<usize> {
            conn.execute(Statement::<PruneLapsed, _>::new(
                (bind::<BigInt, _>(limit),),
            ))
            .await
        }

        async fn push<C: Store<Db = Self>>(
            conn: &mut C,
            message: &crate::store::NewMessage<'_>,
        ) -> QueryResult<()> {
            conn.execute(Statement::<Push, _>::new((
                bind::<Text, _>(message.message_id),
                bind::<Text, _>(message.topic),
                bind::<Text, _>(message.payload),
                bind::<Text, _>(message.job_key),
            )))
            .await
            .map(drop)
        }

        async fn mark_delivered<C: Store<Db = Self>>(
            conn: &mut C,
            id: i64,
            owner: &str,
        ) -> QueryResult<bool> {
            let marked = conn
                .execute(Statement::<MarkDelivered, _>::new((
                    bind::<BigInt, _>(id),
                    bind::<Text, _>(owner),
                )))
                .await?;
            Ok(marked == 1)
        }

        async fn mark_failed<C: Store<Db = Self>>(
            conn: &mut C,
            failure: &crate::store::Failure<'_>,
        ) -> QueryResult<bool> {
            let marked = conn
                .execute(Statement::<MarkFailed, _>::new((
                    bind::<Text, _>(failure.error),
                    bind::<Bool, _>(failure.retry_after_micros.is_none()),
                    later(failure.retry_after_micros),
                    bind::<BigInt, _>(failure.id),
                    bind::<Text, _>(failure.owner),
                )))
                .await?;
            Ok(marked == 1)
        }

        async fn release_untried<C: Store<Db = Self>>(
            conn: &mut C,
            owner: &str,
            id: i64,
        ) -> QueryResult<usize> {
            conn.execute(Statement::<ReleaseUntried, _>::new((
                bind::<BigInt, _>(id),
                bind::<Text, _>(owner),
            )))
            .await
        }

        async fn parked<C: Store<Db = Self>>(
            conn: &mut C,
        ) -> QueryResult<Vec<crate::store::LeasedRow>> {
            conn.load(Statement::<Parked, _>::new(())).await
        }

        async fn retry_parked<C: Store<Db = Self>>(
            conn: &mut C,
            message_id: Option<&str>,
        ) -> QueryResult<usize> {
            conn.execute(Statement::<RetryParked, _>::new((
                bind::<Nullable<Text>, _>(message_id),
                bind::<Nullable<Text>, _>(message_id),
            )))
            .await
        }

        async fn prune_delivered<C: Store<Db = Self>>(
            conn: &mut C,
            older_than_micros: i64,
            limit: i64,
        ) -> QueryResult<usize> {
            conn.execute(Statement::<PruneDelivered, _>::new((
                bind::<BigInt, _>(older_than_micros),
                bind::<BigInt, _>(limit),
            )))
            .await
        }

        async fn outbox_counts<C: Store<Db = Self>>(
            conn: &mut C,
        ) -> QueryResult<crate::store::OutboxCounts> {
            let rows: Vec<crate::store::OutboxCounts> =
                conn.load(Statement::<Counts, _>::new(())).await?;
            Ok(rows.into_iter().next().unwrap_or_default())
        }

        async fn table_names<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<Vec<String>> {
            let names: Vec<super::Name> = conn.load(Statement::<TableNames, _>::new(())).await?;
            Ok(names.into_iter().map(|n| n.name).collect())
        }

        async fn has_unique_index<C: Store<Db = Self>>(
            conn: &mut C,
            table: &str,
            column: &str,
        ) -> QueryResult<bool> {
            let unique: Vec<crate::migrations::TableCount> = conn
                .load(Statement::<UniqueIndexOn, _>::new((
                    bind::<Text, _>(table),
                    bind::<Text, _>(column),
                )))
                .await?;
            Ok(unique.first().is_some_and(|r| r.n > 0))
        }

        async fn record_version<C: Store<Db = Self>>(
            conn: &mut C,
            version: i32,
            description: &str,
        ) -> QueryResult<()> {
            conn.execute(Statement::<RecordVersion, _>::new((
                bind::<Integer, _>(version),
                bind::<Text, _>(description),
            )))
            .await
            .map(drop)
        }

        async fn forget_diesel_versions<C: Store<Db = Self>>(conn: &mut C) -> QueryResult<()> {
            conn.execute(Statement::<ForgetDieselVersions, _>::new(()))
                .await
                .map(drop)
        }

        async fn take_back<C: Store<Db = Self>>(
            conn: &mut C,
            digest: &[u8; 32],
            token: i64,
        ) -> QueryResult<bool> {
            let deleted = conn
                .execute(Statement::<TakeBack, _>::new((
                    bind::<Binary, _>(&digest[..]),
                    bind::<BigInt, _>(token),
                )))
                .await?;
            Ok(deleted == 1)
        }

        async fn lookup_key<C: Store<Db = Self>>(
            conn: &mut C,
            digest: &[u8; 32],
        ) -> QueryResult<Option<crate::store::KeyRow>> {
            let rows: Vec<crate::store::KeyRow> = conn
                .load(Statement::<LookupKey, _>::new((bind::<Binary, _>(
                    &digest[..],
                ),)))
                .await?;
            Ok(rows.into_iter().next())
        }

        async fn list_keys<C: Store<Db = Self>>(
            conn: &mut C,
            filter: &crate::store::KeyFilter<'_>,
        ) -> QueryResult<Vec<crate::store::KeyRow>> {
            conn.load(Statement::<ListKeys, _>::new((
                bind::<Nullable<Text>, _>(filter.job),
                bind::<Nullable<Text>, _>(filter.job),
                bind::<Nullable<BigInt>, _>(filter.done_from_micros),
                bind::<Nullable<BigInt>, _>(filter.done_from_micros),
                bind::<Nullable<BigInt>, _>(filter.done_before_micros),
                bind::<Nullable<BigInt>, _>(filter.done_before_micros),
                bind::<Nullable<BigInt>, _>(filter.after_micros),
                bind::<Nullable<BigInt>, _>(filter.after_micros),
                bind::<Nullable<BigInt>, _>(filter.after_micros),
                bind::<Nullable<Binary>, _>(filter.after_digest.map(|d| &d[..])),
                bind::<BigInt, _>(filter.limit),
            )))
            .await
        }

        async fn job_counts<C: Store<Db = Self>>(
            conn: &mut C,
        ) -> QueryResult<Vec<crate::store::JobCountRow>> {
            conn.load(Statement::<JobCounts, _>::new(())).await
        }

        async fn unsent<C: Store<Db = Self>>(
            conn: &mut C,
            limit: i64,
        ) -> QueryResult<Vec<crate::store::LeasedRow>> {
            conn.load(Statement::<Unsent, _>::new((bind::<BigInt, _>(limit),)))
                .await
        }
    };
}

#[cfg(any(feature = "mysql", feature = "async-mysql"))]
pub(crate) mod mysql;
#[cfg(any(feature = "postgres", feature = "async-postgres"))]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

mod shared;

/// deadpool's pooled connection as a job connection of its own: everything is the connection's,
/// except that a job dropped inside its transaction also takes the connection out of the pool.
///
/// A connection marked broken stays idle in the pool, its transaction (and the key's row lock) open
/// on the server, until deadpool hands it out again, after the others. The pool's `retain` takes
/// idle connections only, and the object goes back to the pool when the caller drops it, just
/// after the job's future; so a task looks for it for a few seconds and drops it, which closes the
/// connection and ends its transaction.
#[cfg(feature = "deadpool")]
mod pooled {
    use std::time::Duration;

    use deadpool::managed::{Manager, Object};
    use diesel::result::QueryResult;

    use crate::sql::{Binds, SqlText, Statement};
    use crate::store::{Database, Nesting, Store, Unfinished};

    /// The runtime's view of the pooled connection.
    type Inner<M> = <<M as Manager>::Type as crate::connection::AsyncJobStore>::Runtime;

    fn inner<M>(object: &mut Object<M>) -> &mut Inner<M>
    where
        M: Manager + 'static,
        M::Type: crate::connection::AsyncJobStore,
    {
        crate::connection::AsyncJobStore::idempotent_store(&mut **object)
    }

    impl<M> crate::__private_0_1_0::AsyncJobRuntime for Object<M>
    where
        M: Manager + 'static,
        M::Type: crate::connection::AsyncJobStore,
    {
        type Runtime = Self;

        fn job_runtime(&mut self) -> &mut Self {
            self
        }
    }

    /// Found before the connection it derefs to, so the wrapper runs the job on the object.
    impl<M> crate::__private_0_1_0::AsyncJobConnection for Object<M>
    where
        M: Manager + 'static,
        M::Type: crate::connection::AsyncJobStore,
    {
        fn async_job_connection(&mut self) -> &mut Self {
            self
        }
    }

    impl<M> Store for Object<M>
    where
        M: Manager + 'static,
        M::Type: crate::connection::AsyncJobStore,
    {
        type Db = <Inner<M> as Store>::Db;
        const READ_FIRST_IN_TRANSACTION: bool = <Inner<M> as Store>::READ_FIRST_IN_TRANSACTION;

        fn begin(&mut self) -> impl Future<Output = QueryResult<Nesting>> + Send {
            inner(self).begin()
        }

        fn begin_bounded(
            &mut self,
            limit: Duration,
        ) -> impl Future<Output = QueryResult<Nesting>> + Send {
            inner(self).begin_bounded(limit)
        }

        fn begin_job(
            &mut self,
            bound: Option<Duration>,
        ) -> impl Future<Output = QueryResult<Nesting>> + Send {
            inner(self).begin_job(bound)
        }

        fn begin_deferred(&mut self) -> impl Future<Output = QueryResult<Nesting>> + Send {
            inner(self).begin_deferred()
        }

        fn finish_in_one_batch(&mut self) -> bool {
            inner(self).finish_in_one_batch()
        }

        fn release_and_commit(&mut self) -> impl Future<Output = QueryResult<()>> + Send {
            inner(self).release_and_commit()
        }

        fn begin_job_pipelined<S, B>(
            &mut self,
            first: Statement<S, B>,
        ) -> impl Future<Output = Option<QueryResult<(Nesting, QueryResult<usize>)>>> + Send
        where
            S: SqlText,
            B: Binds<<Self::Db as Database>::Backend> + Send,
        {
            inner(self).begin_job_pipelined(first)
        }

        fn forget_transaction(&mut self, broken: bool) {
            inner(self).forget_transaction(broken);
        }

        fn count_transactions(&mut self, depth: u32) {
            inner(self).count_transactions(depth);
        }

        fn uncount_to(&mut self, depth: u32) {
            inner(self).uncount_to(depth);
        }

        fn commit(&mut self) -> impl Future<Output = QueryResult<()>> + Send {
            inner(self).commit()
        }

        fn rollback(&mut self) -> impl Future<Output = QueryResult<()>> + Send {
            inner(self).rollback()
        }

        fn abandon(&mut self, unfinished: Unfinished) {
            inner(self).abandon(unfinished);
            take_out_of_pool(self);
        }

        fn transaction_depth(&mut self) -> QueryResult<u32> {
            inner(self).transaction_depth()
        }

        fn pause(duration: Duration) -> impl Future<Output = ()> + Send {
            <Inner<M> as Store>::pause(duration)
        }

        fn execute<S, B>(
            &mut self,
            statement: Statement<S, B>,
        ) -> impl Future<Output = QueryResult<usize>> + Send
        where
            S: SqlText,
            B: Binds<<Self::Db as Database>::Backend> + Send,
        {
            inner(self).execute(statement)
        }

        fn load<S, B, U>(
            &mut self,
            statement: Statement<S, B>,
        ) -> impl Future<Output = QueryResult<Vec<U>>> + Send
        where
            S: SqlText,
            B: Binds<<Self::Db as Database>::Backend> + Send,
            U: diesel::QueryableByName<<Self::Db as Database>::Backend> + Send + 'static,
        {
            inner(self).load(statement)
        }

        fn batch(&mut self, sql: &str) -> impl Future<Output = QueryResult<()>> + Send {
            inner(self).batch(sql)
        }

        fn text_rows(
            &mut self,
            sql: &str,
        ) -> impl Future<Output = QueryResult<Vec<String>>> + Send {
            inner(self).text_rows(sql)
        }
    }

    /// How long to look for the object among the pool's idle ones: its owner drops it right after
    /// the job's future, as a rule; one kept longer is discarded by the pool when handed out.
    const LOOK_FOR: Duration = Duration::from_secs(5);
    const EVERY: Duration = Duration::from_millis(20);

    fn take_out_of_pool<M: Manager + 'static>(object: &Object<M>) {
        let Some(pool) = Object::pool(object) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // An object's identity in the pool: when it was made (no two share an instant).
        let created = Object::metrics(object).created;
        runtime.spawn(async move {
            let mut waited = Duration::ZERO;
            while waited < LOOK_FOR {
                let taken = pool.retain(|_, metrics| metrics.created != created);
                if !taken.removed.is_empty() {
                    drop(taken);
                    tracing::debug!(
                        ?waited,
                        "took a cancelled job's connection out of its deadpool; closing it ends its transaction"
                    );
                    return;
                }
                tokio::time::sleep(EVERY).await;
                waited += EVERY;
            }
            tracing::warn!(
                "a cancelled job's pooled connection was not returned to its deadpool within 5 s; the pool discards it when it hands it out next"
            );
        });
    }
}
