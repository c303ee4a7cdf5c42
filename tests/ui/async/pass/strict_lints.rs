//! Every kind of legal `async fn` handler compiles without a warning under a strict lint set, and
//! runs its body once per key; `tests/lints.rs` also lints this file with clippy's `pedantic`
//! group. Pooled connections (deadpool, bb8) are built when their features are on.
#![deny(
    warnings,
    unused,
    nonstandard_style,
    rust_2018_idioms,
    missing_docs,
    single_use_lifetimes,
    unused_lifetimes,
    unused_qualifications,
    unused_results,
    trivial_casts,
    unit_bindings,
    let_underscore_drop,
    missing_debug_implementations
)]
// A crate-level lint group: `tests/lints.rs`, where this file is a module, denies it itself.
#![cfg_attr(not(test), deny(future_incompatible))]
// trybuild allows `dead_code` on its command line; every handler here is used.
#![warn(dead_code)]

use std::fmt::Display;
use std::sync::atomic::{AtomicU32, Ordering};

use diesel::SqliteConnection;
use diesel_async::AsyncConnection as _;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use idempotent_jobs::idempotent_job;

/// The async `SQLite` connection.
pub type Conn = SyncConnectionWrapper<SqliteConnection>;

/// Every run of every body below.
static RUNS: AtomicU32 = AtomicU32::new(0);

fn ran() {
    let _previous = RUNS.fetch_add(1, Ordering::SeqCst);
}

/// The result of the handlers below.
pub type JobResult<T> = Result<T, idempotent_jobs::Error>;

/// A free handler with a `mut` connection the body reborrows.
///
/// # Errors
///
/// When the job call fails.
#[idempotent_job(key = "welcome:<user_id>")]
#[allow(clippy::mut_mut, reason = "the point: `&mut conn` compiles")]
pub async fn welcome(mut conn: &mut Conn, user_id: u64) -> JobResult<u64> {
    let reborrowed: &mut &mut Conn = &mut conn;
    let _ = reborrowed;
    ran();
    Ok(user_id)
}

/// Generic, with a lifetime used twice and an `impl Trait` parameter.
///
/// # Errors
///
/// When the job call fails.
#[idempotent_job(key = "generic-async:<first>:<id>")]
pub async fn generic_async<'a, C: idempotent_jobs::AsyncJobStore>(
    conn: &mut C,
    first: &'a str,
    second: &'a str,
    id: impl Display + Send,
) -> JobResult<String> {
    let _ = conn;
    ran();
    Ok(format!("{first}{second}{id}"))
}

/// A job's worker: methods with receivers, an associated function naming `Self`.
#[derive(Debug, Clone)]
pub struct Mailer {
    /// Where it sends from.
    pub region: &'static str,
}

impl Mailer {
    /// `&self`.
    ///
    /// # Errors
    ///
    /// When the job call fails.
    #[idempotent_job(key = "send:<self.region>:<id>")]
    pub async fn send(&self, conn: &mut Conn, id: u64) -> JobResult<String> {
        let _ = conn;
        ran();
        Ok(format!("{}-{id}", self.region))
    }

    /// `self`, by value.
    ///
    /// # Errors
    ///
    /// When the job call fails.
    #[idempotent_job(key = "consume:<self.region>")]
    pub async fn consume(self, conn: &mut Conn) -> JobResult<String> {
        let _ = conn;
        ran();
        Ok(self.region.to_owned())
    }

    /// An associated function naming `Self`.
    ///
    /// # Errors
    ///
    /// When the job call fails.
    #[idempotent_job(key = "mailer:<id>")]
    pub async fn create(conn: &mut Conn, id: u64) -> JobResult<u64> {
        let _ = (conn, Self::default_region());
        ran();
        Ok(id)
    }

    fn default_region() -> &'static str {
        "eu"
    }
}

/// A trait with an async method, implemented by a handler.
pub trait Worker {
    /// Handles one message.
    fn handle(&self, conn: &mut Conn, id: u64) -> impl Future<Output = JobResult<u64>> + Send;
}

impl Worker for Mailer {
    #[idempotent_job(key = "worker:<self.region>:<id>")]
    async fn handle(&self, conn: &mut Conn, id: u64) -> JobResult<u64> {
        let _ = conn;
        ran();
        Ok(id)
    }
}

/// A handler on deadpool's pooled connection.
///
/// # Errors
///
/// When the job call fails.
#[cfg(feature = "deadpool")]
#[idempotent_job(key = "deadpool:<id>")]
pub async fn on_deadpool(
    conn: &mut diesel_async::pooled_connection::deadpool::Object<Conn>,
    id: u64,
) -> JobResult<u64> {
    let _ = conn;
    ran();
    Ok(id)
}

/// A handler on bb8's pooled connection.
///
/// # Errors
///
/// When the job call fails.
#[cfg(feature = "bb8")]
#[idempotent_job(key = "bb8:<id>")]
pub async fn on_bb8(
    conn: &mut diesel_async::pooled_connection::bb8::PooledConnection<'_, Conn>,
    id: u64,
) -> JobResult<u64> {
    let _ = conn;
    ran();
    Ok(id)
}

fn assert_send<T: Send>(value: T) -> T {
    value
}

/// Runs every handler above twice, and the body of each once.
pub fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut conn = Conn::establish(":memory:").await.expect("in-memory SQLite");
        idempotent_jobs::migrate_async(&mut conn)
            .await
            .expect("migrations");
        let mailer = Mailer { region: "eu" };
        let mut handlers = 6;
        for _ in 0..2 {
            assert_eq!(
                assert_send(welcome(&mut conn, 1)).await.expect("welcome"),
                1
            );
            assert_eq!(
                generic_async(&mut conn, "a", "b", 2)
                    .await
                    .expect("generic"),
                "ab2"
            );
            assert_eq!(
                assert_send(mailer.send(&mut conn, 3)).await.expect("send"),
                "eu-3"
            );
            assert_eq!(
                mailer.clone().consume(&mut conn).await.expect("consume"),
                "eu"
            );
            assert_eq!(Mailer::create(&mut conn, 4).await.expect("create"), 4);
            assert_eq!(
                assert_send(mailer.handle(&mut conn, 5))
                    .await
                    .expect("handle"),
                5
            );
        }
        assert!(
            welcome::outcome(&mut conn, 1)
                .await
                .expect("outcome")
                .is_replayed()
        );
        assert!(
            welcome::outcome(&mut conn, 9)
                .await
                .expect("outcome")
                .is_ran()
        );
        assert_eq!(welcome::key(&9).as_str(), "welcome:9");
        handlers += 1;
        #[cfg(feature = "deadpool")]
        {
            let manager =
                diesel_async::pooled_connection::AsyncDieselConnectionManager::<Conn>::new(
                    ":memory:",
                );
            let pool = diesel_async::pooled_connection::deadpool::Pool::builder(manager)
                .max_size(1)
                .build()
                .expect("pool");
            let mut object = pool.get().await.expect("connection");
            idempotent_jobs::migrate_async(&mut *object)
                .await
                .expect("migrations");
            for _ in 0..2 {
                assert_eq!(on_deadpool(&mut object, 6).await.expect("deadpool"), 6);
            }
            handlers += 1;
        }
        #[cfg(feature = "bb8")]
        {
            let manager =
                diesel_async::pooled_connection::AsyncDieselConnectionManager::<Conn>::new(
                    ":memory:",
                );
            let pool = diesel_async::pooled_connection::bb8::Pool::builder()
                .max_size(1)
                .build(manager)
                .await
                .expect("pool");
            let mut pooled = pool.get().await.expect("connection");
            idempotent_jobs::migrate_async(&mut *pooled)
                .await
                .expect("migrations");
            for _ in 0..2 {
                assert_eq!(on_bb8(&mut pooled, 7).await.expect("bb8"), 7);
            }
            handlers += 1;
        }
        assert_eq!(
            RUNS.load(Ordering::SeqCst),
            handlers,
            "each handler ran once per key"
        );
    });
}
