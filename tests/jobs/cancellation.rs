//! Async jobs can be dropped at any `.await`. A job dropped inside its transaction must never let
//! a later job commit into that transaction: the connection is marked broken, pools discard it,
//! and a later job on it fails instead of committing.

use std::pin::pin;

use deadpool::managed::Manager;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use idempotent_jobs::idempotent_job;

use crate::backends::{AsyncConn, Backend};
use crate::handlers::{self, AsyncTestConn, Mode, TestError};
use crate::harness::{Db, Server};

/// A deadpool of `size` connections to `url`.
fn pool<C>(url: &str, size: usize) -> Pool<C>
where
    C: AsyncTestConn + 'static,
    AsyncDieselConnectionManager<C>:
        Manager<Type = C, Error = diesel_async::pooled_connection::PoolError>,
{
    Pool::builder(AsyncDieselConnectionManager::<C>::new(url))
        .max_size(size)
        .runtime(deadpool::Runtime::Tokio1)
        .build()
        .expect("a pool")
}

/// Runs `charge_and_hang` until it is inside its transaction, then drops it.
async fn drop_mid_job<C: AsyncTestConn>(conn: &mut C, order_id: &str) {
    let (inside, entered) = tokio::sync::oneshot::channel();
    let mut job = pin!(handlers::charge_and_hang(conn, order_id, inside));
    tokio::select! {
        result = &mut job => panic!("the hanging job finished: {result:?}"),
        entered = entered => entered.expect("the job reached its body"),
    }
    // `job` is dropped here, inside its transaction.
}

pub fn dropped_job_never_commits<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn,
{
    let db = Db::<B>::fresh();
    let mut worker = db.connect();
    worker
        .runtime
        .block_on(drop_mid_job(&mut worker.conn, "order-dropped"));

    // The next job on that connection must not commit into the transaction left open.
    let next = B::charge(&mut worker, "order-next", 4200, Mode::Succeed);
    match &next {
        Err(TestError::Idempotent(error @ idempotent_jobs::Error::Database { source, .. })) => {
            assert!(
                matches!(source, diesel::result::Error::BrokenTransactionManager),
                "{source}"
            );
            // A worker that reconnects when the connection is lost must reconnect here: the
            // connection can never run a job again (and the server keeps the dropped job's
            // transaction, with its claim's lock, open on it). Before, `false`.
            assert!(error.is_connection_lost(), "{error}");
        }
        other => panic!("a job on the dropped job's connection must fail, got {other:?}"),
    }
    // Closing the connection ends its transaction on the server.
    drop(worker);

    let mut other = db.connect();
    assert_eq!(
        B::count_charges(&mut other, "order-dropped"),
        0,
        "the dropped job left nothing"
    );
    assert_eq!(B::count_charges(&mut other, "order-next"), 0);
    assert_eq!(B::count_done(&mut other), 0);
    // The dropped job runs again when redelivered.
    B::charge(&mut other, "order-dropped", 4200, Mode::Succeed).unwrap();
    assert_eq!(B::count_charges(&mut other, "order-dropped"), 1);
}

pub fn dropped_job_in_a_pool_never_reaches_the_next_job<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn + 'static,
    AsyncDieselConnectionManager<C>:
        Manager<Type = C, Error = diesel_async::pooled_connection::PoolError>,
{
    let db = Db::<B>::fresh();
    let mut checker = db.connect();
    let runtime = &checker.runtime;
    let pool = pool::<C>(db.locator(), 1);
    runtime.block_on(async {
        {
            let mut conn = pool.get().await.expect("a pooled connection");
            drop_mid_job(&mut *conn, "order-dropped").await;
        } // back to the pool, marked broken
        let mut conn = pool.get().await.expect("a pooled connection");
        handlers::charge_async(&mut *conn, "order-next", 4200, Mode::Succeed)
            .await
            .expect("the next job on the pool runs on a sound connection");
    });
    assert_eq!(
        pool.status().size,
        1,
        "the broken connection was replaced, not kept"
    );
    drop(pool);
    assert_eq!(B::count_charges(&mut checker, "order-dropped"), 0);
    assert_eq!(
        B::count_charges(&mut checker, "order-next"),
        1,
        "the next job committed for real"
    );
}

/// Charges, says it is inside its transaction, then never finishes; written for deadpool's pooled
/// connection itself, as a handler taking `&mut Object<C>` is.
#[idempotent_job(key = "charge:<order_id>", name = "charge")]
async fn charge_and_hang_pooled<C>(
    conn: &mut Object<C>,
    order_id: &str,
    inside: tokio::sync::oneshot::Sender<()>,
) -> Result<handlers::Receipt, TestError>
where
    C: AsyncTestConn + 'static,
    AsyncDieselConnectionManager<C>:
        Manager<Type = C, Error = diesel_async::pooled_connection::PoolError>,
{
    conn.insert_charge(order_id, 4200, "hung").await?;
    let _ = inside.send(());
    std::future::pending::<()>().await;
    unreachable!("the test drops this job while it waits")
}

/// A job dropped mid-transaction on a deadpool connection, and its redelivery on the same pool,
/// whose other connection is idle (first in, first out: deadpool's default). The dropped job's
/// transaction holds the key's row lock until its connection is closed; deadpool would hand the
/// broken connection out (and discard it) only after the sound one, so the redelivery waited for
/// the lock until the test's deadline. The runtime now takes the cancelled job's connection out of
/// the pool as soon as it is back, and the redelivery runs within the bound.
pub fn a_redelivery_after_a_drop_is_not_held_by_the_pool<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn + 'static,
    AsyncDieselConnectionManager<C>:
        Manager<Type = C, Error = diesel_async::pooled_connection::PoolError>,
{
    use std::time::{Duration, Instant};

    let db = Db::<B>::fresh();
    let mut checker = db.connect();
    let runtime = &checker.runtime;
    let (outcome, took, size) = runtime.block_on(async {
        let pool = pool::<C>(db.locator(), 2);
        // Two connections in the pool: the sound one is idle while the job hangs on the other.
        let sound = pool.get().await.expect("a pooled connection");
        {
            let mut conn = pool.get().await.expect("a pooled connection");
            drop(sound);
            let (inside, entered) = tokio::sync::oneshot::channel();
            let mut job = pin!(charge_and_hang_pooled(&mut conn, "order-dropped", inside));
            tokio::select! {
                result = &mut job => panic!("the hanging job finished: {result:?}"),
                entered = entered => entered.expect("the job reached its body"),
            }
        } // the job, then the object, dropped: a shut-down or a timeout
        let started = Instant::now();
        let redelivery = async {
            let mut conn = pool.get().await.expect("a pooled connection");
            handlers::charge_async(&mut *conn, "order-dropped", 4200, Mode::Succeed).await
        };
        // A deadline, not a measurement: without the eviction the dropped job's transaction, and
        // the key's lock with it, stays open for as long as the pool keeps the connection idle
        // (forever here). The eviction looks for the connection every 20 ms for 5 s; a minute
        // leaves a loaded machine all the room it needs and still fails a redelivery held for good.
        let outcome = tokio::time::timeout(Duration::from_secs(60), redelivery).await;
        (outcome, started.elapsed(), pool.status().size)
    });
    let receipt = outcome
        .unwrap_or_else(|_| {
            panic!("the redelivery was held by the dropped job's lock for {took:?}")
        })
        .expect("the redelivery ran");
    assert_eq!(receipt.amount, 4200);
    assert_eq!(size, 1, "the cancelled job's connection left the pool");
    assert_eq!(
        B::count_charges(&mut checker, "order-dropped"),
        1,
        "charged once: by the redelivery"
    );
    crate::figures::report(&format!(
        "deadpool, cancelled job ({}): the redelivery on the same pool finished {} ms after the drop",
        B::NAME,
        took.as_millis()
    ));
}

/// A handler written for a deadpool connection: the attribute reaches the connection by deref.
#[idempotent_job(key = "deadpool-welcome:<user_id>")]
async fn welcome<C>(conn: &mut Object<C>, user_id: u64) -> Result<String, TestError>
where
    C: AsyncTestConn + 'static,
    AsyncDieselConnectionManager<C>:
        Manager<Type = C, Error = diesel_async::pooled_connection::PoolError>,
{
    conn.insert_message("welcome", &user_id.to_string()).await?;
    Ok(format!("welcomed {user_id}"))
}

pub fn pooled_connections_work_through_deref<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn + 'static,
    AsyncDieselConnectionManager<C>:
        Manager<Type = C, Error = diesel_async::pooled_connection::PoolError>,
{
    let db = Db::<B>::fresh();
    let mut checker = db.connect();
    let pool = pool::<C>(db.locator(), 2);
    let (first, second) = checker.runtime.block_on(async {
        let first = welcome(&mut pool.get().await.expect("conn"), 7)
            .await
            .unwrap();
        let second = welcome(&mut pool.get().await.expect("conn"), 7)
            .await
            .unwrap();
        (first, second)
    });
    assert_eq!(first, second);
    assert_eq!(B::count_messages(&mut checker), 1);
}

/// The job's future can be spawned on a multi-threaded runtime: it is `Send`.
pub fn job_futures_are_send<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn + 'static,
{
    let db = Db::<B>::fresh();
    let AsyncConn { runtime, conn } = db.connect();
    let spawned = runtime.block_on(async move {
        let mut conn = conn;
        tokio::spawn(async move {
            handlers::charge_async(&mut conn, "order-spawned", 4200, Mode::Succeed).await?;
            handlers::charge_async(&mut conn, "order-spawned", 4200, Mode::Succeed).await?;
            Ok::<_, TestError>(
                handlers::AsyncTestConn::count_charges(&mut conn, "order-spawned").await?,
            )
        })
        .await
    });
    assert_eq!(spawned.expect("the task ran").expect("the jobs ran"), 1);
}

/// bb8's pooled connection works through deref too (on PostgreSQL; the handler is the same for
/// every backend).
#[cfg(feature = "async-postgres")]
mod bb8_pool {
    use diesel_async::AsyncPgConnection;
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::pooled_connection::bb8::{Pool, PooledConnection};
    use idempotent_jobs::idempotent_job;

    use crate::backends::{AsyncPostgres, Backend as _};
    use crate::handlers::{AsyncTestConn as _, TestError};
    use crate::harness::Db;

    #[idempotent_job(key = "greeting:<user_id>")]
    async fn greet_pooled(
        conn: &mut PooledConnection<'_, AsyncPgConnection>,
        user_id: u64,
    ) -> Result<u64, TestError> {
        conn.insert_message("greeting", &user_id.to_string())
            .await?;
        Ok(user_id)
    }

    #[test]
    fn bb8_pooled_connections_work_through_deref() {
        let db = Db::<AsyncPostgres>::fresh();
        let mut checker = db.connect();
        let greeted = checker.runtime.block_on(async {
            let pool: Pool<AsyncPgConnection> = Pool::builder()
                .max_size(2)
                .build(AsyncDieselConnectionManager::new(db.locator()))
                .await
                .expect("a bb8 pool");
            let first = greet_pooled(&mut pool.get().await.expect("a connection"), 5)
                .await
                .unwrap();
            let second = greet_pooled(&mut pool.get().await.expect("a connection"), 5)
                .await
                .unwrap();
            (first, second)
        });
        assert_eq!(greeted, (5, 5));
        assert_eq!(AsyncPostgres::count_messages(&mut checker), 1);
    }
}

/// diesel-async's SQLite connection on a current-thread runtime, a job's future dropped (a
/// timeout) while a statement of its body runs on the blocking pool: diesel-async panics there
/// (`block_in_place` needs a multi-thread runtime; the docs say so), and the job's guard, dropped
/// during that unwinding, must not panic again: a second panic while unwinding aborts the whole
/// process, every other job with it. Before, marking the connection broken asked for the
/// connection's transaction state while the blocking task still held it ("Cannot access shared
/// transaction state"): the process aborted.
#[cfg(feature = "async-sqlite")]
#[test]
fn a_dropped_async_sqlite_job_on_a_current_thread_runtime_never_aborts() {
    use diesel_async::RunQueryDsl as _;
    type Wrapped =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;
    static SLOW: idempotent_jobs::Job = idempotent_jobs::Job::new("slow", "slow:<n>");
    let db = Db::<crate::backends::AsyncSqlite>::fresh();
    let worker = db.connect();
    let mut conn: Wrapped = worker.conn;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(async {
            tokio::time::timeout(
                std::time::Duration::from_millis(50),
                idempotent_jobs::run_async(
                    &mut conn,
                    &SLOW,
                    &idempotent_jobs::JobKey::new("slow:1"),
                    async |c: &mut Wrapped| {
                        diesel::sql_query(
                            "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n \
                             WHERE x < 3000000) SELECT COUNT(*) FROM n",
                        )
                        .execute(c)
                        .await
                        .map_err(TestError::from)?;
                        Ok::<_, TestError>(())
                    },
                ),
            )
            .await
        })
    }));
    // Reaching here is the test: a panic (diesel-async's) or a timeout, not an abort.
    drop(runtime);
    match dropped {
        Ok(Err(_elapsed)) => {}
        Ok(Ok(outcome)) => panic!("the job finished within 50 ms: {outcome:?}"),
        Err(_panic) => {}
    }
}

/// Polls `inner` until it has returned `Pending` `pendings` times more, then gives up on it
/// (`None`, and `inner` is dropped at that `.await`), or its output.
struct DropAfter<F: ?Sized> {
    inner: std::pin::Pin<Box<F>>,
    pendings: usize,
}

impl<F: std::future::Future + ?Sized> std::future::Future for DropAfter<F> {
    type Output = Option<F::Output>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.inner.as_mut().poll(cx) {
            std::task::Poll::Ready(output) => std::task::Poll::Ready(Some(output)),
            std::task::Poll::Pending if self.pendings == 0 => std::task::Poll::Ready(None),
            std::task::Poll::Pending => {
                self.pendings -= 1;
                std::task::Poll::Pending
            }
        }
    }
}

/// The row `drops_lock` 1, which the tests below hold from another session while a body's
/// `UPDATE` of it waits.
#[cfg(feature = "async-mysql")]
fn lock_row(conn: &mut AsyncConn<diesel_async::AsyncMysqlConnection>) {
    use crate::backends::AsyncMysql;
    <AsyncMysql as Backend>::execute(conn, "CREATE TABLE drops_lock (id INT PRIMARY KEY, v INT)");
    <AsyncMysql as Backend>::execute(conn, "INSERT INTO drops_lock VALUES (1, 0)");
}

/// A body that drops a statement of its own midway (a `timeout` around an `UPDATE` that waits for
/// a row lock), then returns `Ok`, on diesel-async's MySQL connection: the statement's answer (a
/// lock wait timeout) comes after the runtime's next statement is sent. Before, the runtime read
/// it as the commit's answer: the call said "nothing of the job was committed; retrying is safe"
/// while the work and the claim were committed, and the next call on the connection read stale
/// answers (it ran the body of the key already done). Now the runtime finds the answers out of
/// step before it commits: the job is rolled back, the connection marked broken, and the call
/// says so; a redelivery on another connection runs the job once.
#[cfg(feature = "async-mysql")]
#[test]
fn a_statement_the_body_drops_is_found_before_the_commit() {
    use crate::backends::AsyncMysql;
    use diesel_async::TransactionManager as _;
    static DROPS: idempotent_jobs::Job = idempotent_jobs::Job::new("drops", "drops:<n>");
    async fn job(
        conn: &mut diesel_async::AsyncMysqlConnection,
        key: &idempotent_jobs::JobKey,
    ) -> Result<idempotent_jobs::Outcome<()>, TestError> {
        use diesel_async::RunQueryDsl as _;
        idempotent_jobs::run_async(conn, &DROPS, key, async |c| {
            diesel::sql_query("INSERT INTO drops_work (n) VALUES (1)")
                .execute(c)
                .await?;
            let _ = tokio::time::timeout(
                std::time::Duration::from_millis(100),
                diesel::sql_query("UPDATE drops_lock SET v = v + 1 WHERE id = 1").execute(c),
            )
            .await;
            Ok::<_, TestError>(())
        })
        .await
    }
    let db = Db::<AsyncMysql>::fresh();
    let mut checker = db.connect();
    <AsyncMysql as Backend>::execute(&mut checker, "CREATE TABLE drops_work (n INT)");
    lock_row(&mut checker);
    let mut holder = db.connect();
    <AsyncMysql as Backend>::execute(&mut holder, "BEGIN");
    <AsyncMysql as Backend>::execute(&mut holder, "UPDATE drops_lock SET v = 10 WHERE id = 1");
    let mut worker = db.connect();
    <AsyncMysql as Backend>::execute(&mut worker, "SET SESSION innodb_lock_wait_timeout = 1");
    let key = idempotent_jobs::JobKey::new("drops:1");
    let first = worker.runtime.block_on(job(&mut worker.conn, &key));
    let held = |checker: &mut AsyncConn<_>| {
        (
            <AsyncMysql as Backend>::query_i64(checker, "SELECT COUNT(*) AS n FROM drops_work"),
            <AsyncMysql as Backend>::query_i64(checker, "SELECT COUNT(*) AS n FROM done_jobs"),
        )
    };
    match &first {
        Ok(idempotent_jobs::Outcome::Ran(())) => {
            assert_eq!(held(&mut checker), (1, 1), "it said Ran");
        }
        Err(TestError::Idempotent(error)) => {
            assert_eq!(
                held(&mut checker),
                (0, 0),
                "it said {error}, and what is held is not that"
            );
            assert!(error.is_retryable(), "{error}");
        }
        other => panic!("{other:?}"),
    }
    // The next call on the same connection: refused (broken), or run truthfully.
    let broken = <diesel_async::AsyncMysqlConnection as diesel_async::AsyncConnection>::TransactionManager::is_broken_transaction_manager(
        &mut worker.conn,
    );
    let again = worker.runtime.block_on(job(&mut worker.conn, &key));
    assert!(
        broken || matches!(again, Ok(idempotent_jobs::Outcome::Replayed(()))),
        "a call on the connection after the first ({first:?}): {again:?}"
    );
    <AsyncMysql as Backend>::execute(&mut holder, "ROLLBACK");
    // A redelivery on another connection: the job's work, once in all.
    let mut fresh = db.connect();
    let redelivered = fresh.runtime.block_on(job(&mut fresh.conn, &key));
    assert!(redelivered.is_ok(), "{redelivered:?}");
    assert_eq!(
        held(&mut checker),
        (1, 1),
        "{first:?}, then {redelivered:?}"
    );
}

/// As above, but the body returns `Err`, and the dropped statement's answer comes just after the
/// drop (the lock is let go at 150 ms; 120, 250 and 400 ms measured alike): the call returns the
/// body's error with nothing committed, and a key done before on that connection is never run
/// again there (the rollback's reads find the answers out of step, and the connection ends
/// broken). It held before the check after a body that returned `Ok`, too.
#[cfg(feature = "async-mysql")]
#[test]
fn a_statement_a_failing_body_drops_leaves_no_answer_behind() {
    use crate::backends::AsyncMysql;
    use diesel_async::TransactionManager as _;
    static DROPS: idempotent_jobs::Job = idempotent_jobs::Job::new("drops", "drops:<n>");
    async fn job(
        conn: &mut diesel_async::AsyncMysqlConnection,
        key: &idempotent_jobs::JobKey,
        fail: bool,
    ) -> Result<idempotent_jobs::Outcome<()>, TestError> {
        use diesel_async::RunQueryDsl as _;
        idempotent_jobs::run_async(conn, &DROPS, key, async |c| {
            diesel::sql_query(format!(
                "INSERT INTO drops_work (k) VALUES ('{}')",
                key.as_str()
            ))
            .execute(c)
            .await?;
            if fail {
                let _ = tokio::time::timeout(
                    std::time::Duration::from_millis(100),
                    diesel::sql_query("UPDATE drops_lock SET v = v + 1 WHERE id = 1").execute(c),
                )
                .await;
                return Err(TestError::Declined);
            }
            Ok(())
        })
        .await
    }
    let db = Db::<AsyncMysql>::fresh();
    let mut checker = db.connect();
    <AsyncMysql as Backend>::execute(&mut checker, "CREATE TABLE drops_work (k VARCHAR(64))");
    lock_row(&mut checker);
    let mut worker = db.connect();
    let done = idempotent_jobs::JobKey::new("drops:done");
    let first = worker.runtime.block_on(job(&mut worker.conn, &done, false));
    assert!(
        matches!(first, Ok(idempotent_jobs::Outcome::Ran(()))),
        "{first:?}"
    );
    let mut holder = db.connect();
    <AsyncMysql as Backend>::execute(&mut holder, "BEGIN");
    <AsyncMysql as Backend>::execute(&mut holder, "UPDATE drops_lock SET v = 10 WHERE id = 1");
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(150));
        <AsyncMysql as Backend>::execute(&mut holder, "ROLLBACK");
    });
    let failing = idempotent_jobs::JobKey::new("drops:failing");
    let failed = worker
        .runtime
        .block_on(job(&mut worker.conn, &failing, true));
    release.join().expect("the holder");
    let rows = |checker: &mut AsyncConn<_>, key: &str| {
        <AsyncMysql as Backend>::query_i64(
            checker,
            &format!("SELECT COUNT(*) AS n FROM drops_work WHERE k = '{key}'"),
        )
    };
    assert!(matches!(failed, Err(TestError::Declined)), "{failed:?}");
    assert_eq!(
        rows(&mut checker, "drops:failing"),
        0,
        "the failed run committed"
    );
    // The connection, broken or not, never runs the done key's body again.
    for _ in 0..3 {
        let again = worker.runtime.block_on(job(&mut worker.conn, &done, false));
        let broken = <diesel_async::AsyncMysqlConnection as diesel_async::AsyncConnection>::TransactionManager::is_broken_transaction_manager(
            &mut worker.conn,
        );
        assert!(
            broken || matches!(again, Ok(idempotent_jobs::Outcome::Replayed(()))),
            "after the failed run ({failed:?}): {again:?}"
        );
        assert_eq!(
            rows(&mut checker, "drops:done"),
            1,
            "the done key's body ran again: {again:?}"
        );
    }
}

/// A job with `in_progress = "fail"` on diesel-async's MySQL connection, whose claim waits for a
/// row another session holds, bounded by a lock wait timeout of 1 s the runtime sets for it:
/// dropped at each of its `.await`s in turn (a `timeout`, a `select!`), the connection is either
/// marked broken (a pool drops it) or has its own `innodb_lock_wait_timeout` back. Before, a job
/// dropped while it put the setting back, after its rollback, left the connection unbroken, its
/// `SET`'s answer unread: the next statement on it failed with "can't parse: buf doesn't have
/// enough data" (or, its answer read in time, ran with a lock wait of 1 s).
#[cfg(feature = "async-mysql")]
#[test]
fn a_bounded_job_dropped_anywhere_leaves_no_bound_behind() {
    use crate::backends::AsyncMysql;
    use diesel_async::{AsyncConnection as _, TransactionManager as _};
    static BUSY: idempotent_jobs::Job = idempotent_jobs::Job::new("busy", "busy:<n>")
        .while_in_progress(idempotent_jobs::WhileInProgress::Fail);
    let db = Db::<AsyncMysql>::fresh();
    let mut worker = db.connect();
    let key = idempotent_jobs::JobKey::new("busy:1");
    // The key's row, committed; then held by another session, so that the claim waits.
    let first = worker.runtime.block_on(idempotent_jobs::run_async(
        &mut worker.conn,
        &BUSY,
        &key,
        async |_c| Ok::<_, idempotent_jobs::Error>(1u32),
    ));
    assert!(
        matches!(first, Ok(idempotent_jobs::Outcome::Ran(1))),
        "{first:?}"
    );
    let mut holder = db.connect();
    AsyncMysql::execute(&mut holder, "BEGIN");
    AsyncMysql::execute(&mut holder, "SELECT * FROM done_jobs FOR UPDATE");
    let setting = "SELECT @@SESSION.innodb_lock_wait_timeout AS n";
    let own = AsyncMysql::query_i64(&mut worker, setting);
    fn bounded<'c>(
        conn: &'c mut diesel_async::AsyncMysqlConnection,
        key: &'c idempotent_jobs::JobKey,
        pendings: usize,
    ) -> DropAfter<
        impl std::future::Future<Output = Result<idempotent_jobs::Outcome<u32>, idempotent_jobs::Error>>
        + 'c,
    > {
        DropAfter {
            inner: Box::pin(idempotent_jobs::run_async(conn, &BUSY, key, async |_c| {
                Ok::<_, idempotent_jobs::Error>(2u32)
            })),
            pendings,
        }
    }
    let mut drops = 0;
    for pendings in 0..100 {
        // Each drop on a connection of its own, whose statements are prepared already (a call
        // run to its end first): the same `.await`s in the same order every time.
        let mut conn = worker
            .runtime
            .block_on(diesel_async::AsyncMysqlConnection::establish(db.locator()))
            .expect("a connection");
        let warm = worker
            .runtime
            .block_on(bounded(&mut conn, &key, usize::MAX));
        assert!(
            matches!(warm, Some(Err(idempotent_jobs::Error::InProgress { .. }))),
            "undropped, the call is InProgress: {warm:?}"
        );
        let Some(ended) = worker.runtime.block_on(bounded(&mut conn, &key, pendings)) else {
            drops += 1;
            let broken =
                <diesel_async::AsyncMysqlConnection as diesel_async::AsyncConnection>::TransactionManager::is_broken_transaction_manager(
                    &mut conn,
                );
            if !broken {
                let mut conn = crate::backends::AsyncConn {
                    runtime: tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("a runtime"),
                    conn,
                };
                assert_eq!(
                    AsyncMysql::query_i64(&mut conn, setting),
                    own,
                    "dropped after {pendings} waits: the connection is in use again, with the job's bound"
                );
            }
            continue;
        };
        assert!(
            matches!(ended, Err(idempotent_jobs::Error::InProgress { .. })),
            "undropped, the call is InProgress: {ended:?}"
        );
        assert!(drops > 2, "dropped at {drops} points only");
        break;
    }
    AsyncMysql::execute(&mut holder, "ROLLBACK");
}

/// What a call on a connection of diesel-async's does, as a boxed future: the calls that
/// [`dropped_at_each_await`] drops.
type Call<'c> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'c>>;

/// A named call of [`dropped_at_each_await`]'s, on a connection, its `usize` a number of its own
/// for a key of its own.
type NamedCall<C> = (&'static str, for<'c> fn(&'c mut C, usize) -> Call<'c>);

static EVERYWHERE: idempotent_jobs::Job = idempotent_jobs::Job::new("everywhere", "everywhere:<n>");

/// Runs `EVERYWHERE` on `key` through `conn`: whether it ran.
async fn everywhere<C: idempotent_jobs::AsyncJobStore>(conn: &mut C, key: &str) -> bool {
    everywhere_result(conn, key).await.expect("a job").is_ran()
}

/// Runs `EVERYWHERE` on `key` through `conn`: what the call said.
async fn everywhere_result<C: idempotent_jobs::AsyncJobStore>(
    conn: &mut C,
    key: &str,
) -> Result<idempotent_jobs::Outcome<u32>, idempotent_jobs::Error> {
    idempotent_jobs::run_async(
        conn,
        &EVERYWHERE,
        &idempotent_jobs::JobKey::new(key),
        async |_c| Ok::<_, idempotent_jobs::Error>(7u32),
    )
    .await
}

/// Each call of `calls`, dropped at each of its `.await`s in turn on a warm connection of its own
/// (one call run to its end first, so that the same `.await`s come in the same order): the
/// connection is then either marked broken (a pool drops it), or whole, with no transaction
/// left open and nothing left unread, so that a job on it runs and commits.
fn dropped_at_each_await<B, C>(calls: &[NamedCall<C>])
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn,
{
    use diesel_async::TransactionManager as _;
    let db = Db::<B>::fresh();
    let mut direct = db.connect();
    // (On the tests' runtime, multi-threaded as `#[tokio::main]` is, a call may also finish
    // within one poll: the count of places dropped at varies.)
    let mut points = 0;
    for (name, call) in calls {
        for pendings in 0..200 {
            let mut worker = db.connect();
            let runtime = &worker.runtime;
            runtime.block_on(call(&mut worker.conn, usize::MAX - pendings));
            let dropped = runtime.block_on(DropAfter {
                inner: call(&mut worker.conn, pendings),
                pendings,
            });
            if dropped.is_some() {
                break;
            }
            points += 1;
            if C::TransactionManager::is_broken_transaction_manager(&mut worker.conn) {
                // The next call on it says the connection is of no more use (a pool drops it),
                // nothing else: before, on async MySQL, a table check after the refusal read the
                // dropped statement's answer, and the call said the tables were never migrated
                // (not retryable, not a lost connection).
                let key = format!("everywhere:after-broken-{name}-{pendings}");
                match runtime.block_on(everywhere_result(&mut worker.conn, &key)) {
                    Err(error) if error.is_connection_lost() && error.is_retryable() => {}
                    other => panic!(
                        "{name}, dropped after {pendings} waits: the next job on its broken connection said {other:?}"
                    ),
                }
                continue;
            }
            let key = format!("everywhere:{name}-{pendings}");
            let ran = runtime.block_on(everywhere(&mut worker.conn, &key));
            drop(worker);
            assert!(
                ran,
                "{name}, dropped after {pendings} waits: a job on its connection"
            );
            assert!(
                B::keys_lookup(&mut direct, &idempotent_jobs::JobKey::new(key.as_str()))
                    .expect("a look-up")
                    .is_some(),
                "{name}, dropped after {pendings} waits: the next job on its connection committed"
            );
        }
    }
    assert!(points > calls.len(), "dropped at {points} places only");
}

/// The calls [`dropped_at_each_await`] drops: a job that runs (its key new each time), its replay,
/// a look-up, a forget, a prune.
fn calls<C: AsyncTestConn>() -> Vec<NamedCall<C>> {
    vec![
        ("ran", |c, n| {
            Box::pin(async move {
                everywhere(c, &format!("everywhere:ran-{n}")).await;
            })
        }),
        // A body whose own statement is in flight at the drop.
        ("body", |c, n| {
            Box::pin(async move {
                let key = idempotent_jobs::JobKey::new(format!("everywhere:body-{n}"));
                let _ran = idempotent_jobs::run_async(c, &EVERYWHERE, &key, async |c| {
                    c.insert_message("everywhere", "body").await?;
                    c.insert_message("everywhere", "body").await?;
                    Ok::<_, crate::handlers::TestError>(7u32)
                })
                .await
                .expect("a job");
            })
        }),
        ("replayed", |c, _| {
            Box::pin(async move {
                everywhere(c, "everywhere:replayed").await;
            })
        }),
        ("lookup", |c, _| {
            Box::pin(async move {
                let key = idempotent_jobs::JobKey::new("everywhere:replayed");
                idempotent_jobs::keys::lookup_async(c, &key)
                    .await
                    .expect("a look-up");
            })
        }),
        ("forget", |c, _| {
            Box::pin(async move {
                everywhere(c, "everywhere:forgotten").await;
                let key = idempotent_jobs::JobKey::new("everywhere:forgotten");
                idempotent_jobs::keys::forget_async(c, &key, "test")
                    .await
                    .expect("a forget");
            })
        }),
        ("prune", |c, _| {
            Box::pin(async move {
                idempotent_jobs::prune_async(c, &idempotent_jobs::Prune::default())
                    .await
                    .expect("a prune");
            })
        }),
    ]
}

/// What the database tells of the statements the worker's session ran (`None` on SQLite, where
/// nothing is sent): MySQL's session counter `Questions`, read on the connection itself (the
/// read is one more); on PostgreSQL, whether the last one is still the read of its process id
/// (1) or not (0), from `pg_stat_activity`, read by `watcher` for `pid`.
fn sessions_statements<B, C>(
    worker: &mut AsyncConn<C>,
    watcher: &mut AsyncConn<C>,
    pid: i64,
) -> Option<i64>
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn,
{
    match B::SERVER {
        Server::Mysql => Some(B::query_i64(
            worker,
            "SELECT CAST(VARIABLE_VALUE AS SIGNED) AS n FROM information_schema.SESSION_STATUS \
             WHERE VARIABLE_NAME = 'QUESTIONS'",
        )),
        Server::Postgres => Some(B::query_i64(
            watcher,
            &format!(
                "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE pid = {pid} \
                 AND query LIKE 'SELECT CAST(pg_backend_pid()%'"
            ),
        )),
        Server::Sqlite => None,
    }
}

/// A job called on a connection whose transaction manager is broken (a job's future dropped in
/// flight left it so) says the connection is of no more use, and sends nothing on it: the
/// dropped statement's answer may still be on its way. Before, the runtime asked whether its
/// table was there on that connection, read the dropped statement's answer as no rows (async
/// MySQL), and said the tables were never migrated: not retryable, not a lost connection.
pub fn a_job_on_a_broken_connection_sends_nothing<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn,
{
    use diesel_async::TransactionManager as _;
    let db = Db::<B>::fresh();
    let mut worker = db.connect();
    let mut watcher = db.connect();
    let pid = match B::SERVER {
        Server::Postgres => {
            B::query_i64(&mut worker, "SELECT CAST(pg_backend_pid() AS BIGINT) AS n")
        }
        _ => 0,
    };
    let before = sessions_statements::<B, C>(&mut worker, &mut watcher, pid);
    C::TransactionManager::transaction_manager_status_mut(&mut worker.conn).set_in_error();
    let said = worker
        .runtime
        .block_on(everywhere_result(&mut worker.conn, "everywhere:broken"));
    assert!(
        matches!(&said, Err(error) if error.is_connection_lost() && error.is_retryable()),
        "a job on a broken connection said {said:?}"
    );
    let after = sessions_statements::<B, C>(&mut worker, &mut watcher, pid);
    let expected = match B::SERVER {
        // The read of the counter itself is one statement.
        Server::Mysql => before.map(|n| n + 1),
        _ => before,
    };
    assert_eq!(
        after, expected,
        "statements the job sent on its broken connection"
    );
}

pub fn every_call_dropped_at_each_await_leaves_a_whole_or_broken_connection<B, C>()
where
    B: Backend<Conn = AsyncConn<C>>,
    C: AsyncTestConn,
{
    dropped_at_each_await::<B, C>(&calls::<C>());
}
