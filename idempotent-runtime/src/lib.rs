//! The runtime behind `#[idempotent_job]`: the done-jobs schema and the claim-run-record transaction
//! for Diesel connections, sync and async.
//!
//! Most users depend on the `idempotent-jobs` facade crate and use the attribute. This crate holds
//! what the attribute expands to, public so that you can call it yourself:
//!
//! * [`run`] and [`run_async`]: one job call in one transaction, returning an [`Outcome`] (ran or
//!   replayed); [`JobCall`] adds an input fingerprint;
//! * [`JobKey`] and [`KeyBuilder`]: keys with escaped values;
//! * [`migrate`] and [`schema`]: the runtime's tables;
//! * [`outbox`], [`prune`](mod@prune), [`testing`], [`registry`], [`stats`].
//!
//! The rule it implements comes from the
//! <a href="https://agentwranglers.se/playbook/scaling/background-jobs-and-queues/idempotent-jobs">Agent Wranglers scaling playbook</a>.
//!
//! # How it is built
//!
//! One job call, the relay's rounds, pruning, migrations and the test kit are each written once, as
//! async code over an internal per-connection trait; a sync call drives that same code to completion
//! on its own thread (see `store.rs`). Each database has one module holding all of its SQL.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

#[cfg(not(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "async-postgres",
    feature = "async-mysql"
)))]
compile_error!(
    "idempotent-jobs needs a database: enable one or more of the features `bundled-sqlite` (the default: SQLite built in), `sqlite` (the system's libsqlite3), `postgres`, `mysql`, `async-postgres`, `async-mysql`, `async-sqlite`"
);

// First: the statement macro the database modules use.
#[macro_use]
mod sql;

mod call;
mod context;
mod counters;
mod db;
mod drive;
mod error;
pub mod fingerprint;
mod identity;
mod job;
pub mod key;
pub mod keys;
mod lifecycle;
mod migrations;
pub mod outbox;
mod outcome;
pub mod prune;
pub mod redelivery;
pub mod registry;
mod retry;
pub mod schema;
pub mod stats;
mod store;
pub mod testing;
mod time;
mod transaction;

pub use call::{JobCall, JobError, JobOutput};
pub use context::current_key;
pub use error::{Error, Result, Step};
pub use job::{Job, WhileInProgress};
pub use key::{JobKey, KeyBuilder, KeyError};
pub use migrations::Migrate;
pub use outcome::Outcome;
pub use prune::{Prune, PruneReport, prune};
pub use redelivery::{redelivered, redelivered_async};

#[cfg(feature = "async")]
pub use prune::prune_async;

/// A sync Diesel connection a job can run on: `SqliteConnection`, `PgConnection` or
/// `MysqlConnection` (each behind its feature). Pooled connections (r2d2) reach theirs through
/// `Deref`.
///
/// Sealed: the runtime implements it for Diesel's connection types; its methods are internal.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a database connection `idempotent-jobs` can claim jobs on",
    label = "a job needs a Diesel connection here",
    note = "use `SqliteConnection`, `PgConnection` or `MysqlConnection` (each behind its cargo feature), or a pooled connection that derefs to one"
)]
pub trait JobStore: diesel::Connection + sealed::Sealed + 'static {
    /// The runtime's view of the connection: itself.
    #[doc(hidden)]
    type Runtime: store::Store;

    /// Reaches the runtime's view of the connection. Its methods stay internal: they are on a
    /// trait users cannot name, reached only through this associated type.
    #[doc(hidden)]
    fn idempotent_store(&mut self) -> &mut Self::Runtime;
}

mod sealed {
    /// Implemented only by the runtime, for the connection types it supports.
    pub trait Sealed {}
}

/// An async diesel-async connection a job can run on: `AsyncPgConnection`,
/// `AsyncMysqlConnection` or `SyncConnectionWrapper<SqliteConnection>` (features `async-postgres`,
/// `async-mysql`, `async-sqlite`). Pooled connections (deadpool, bb8) reach theirs through `Deref`;
/// a handler whose connection parameter is deadpool's `Object` itself (feature `deadpool`) also
/// takes that connection out of the pool when a job on it is cancelled.
///
/// Sealed: the runtime implements it for diesel-async's connection types.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an async database connection `idempotent-jobs` can claim jobs on",
    label = "an async job needs a diesel-async connection here",
    note = "use `AsyncPgConnection`, `AsyncMysqlConnection` or `SyncConnectionWrapper<SqliteConnection>` (features `async-postgres`, `async-mysql`, `async-sqlite`), or a pooled connection that derefs to one"
)]
pub trait AsyncJobStore: diesel_async::AsyncConnection + sealed::Sealed + 'static {
    /// The runtime's view of the connection: itself.
    #[doc(hidden)]
    type Runtime: store::Store;

    /// Reaches the runtime's view of the connection; see [`JobStore::idempotent_store`].
    #[doc(hidden)]
    fn idempotent_store(&mut self) -> &mut Self::Runtime;
}

/// Runs `body` once per key: claims `key` for `job` in a new transaction, runs the body in it,
/// stores the body's `Ok` value and commits. When the key is already claimed, the body does not run
/// and the stored value comes back as [`Outcome::Replayed`].
///
/// This is what `#[idempotent_job]` expands to; call it yourself to build keys your own way or to
/// learn whether a call ran or replayed. [`JobCall`] adds an input fingerprint.
///
/// * `Err` from the body rolls the transaction back, the claim with it, so a retry runs again.
/// * A panic anywhere after the claim (in the body, or in the result's `Serialize` or a stored
///   result's `Deserialize`) rolls back too, leaves the connection outside any transaction, and
///   then continues unwinding.
/// * Inside a transaction the caller already opened, the job runs in a savepoint and its claim
///   commits or rolls back with the caller's transaction.
///
/// ```
/// use diesel::prelude::*;
/// use idempotent_runtime::{Job, JobKey, Outcome, run};
///
/// static WELCOME: Job = Job::new("welcome", "welcome:<user>");
///
/// # fn main() -> Result<(), idempotent_runtime::Error> {
/// let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
/// idempotent_runtime::migrate(&mut conn)?;
///
/// let key = JobKey::new("welcome:42");
/// let first: Outcome<u32> = run(&mut conn, &WELCOME, &key, |_conn| Ok::<_, idempotent_runtime::Error>(7))?;
/// let second: Outcome<u32> = run(&mut conn, &WELCOME, &key, |_conn| unreachable!("already done"))?;
/// assert_eq!(first, Outcome::Ran(7));
/// assert_eq!(second, Outcome::Replayed(7));
/// # Ok(())
/// # }
/// ```
pub fn run<C, T, E, F>(
    conn: &mut C,
    job: &'static Job,
    key: &JobKey,
    body: F,
) -> Result<Outcome<T>, E>
where
    C: JobStore,
    T: JobOutput,
    E: JobError,
    F: FnOnce(&mut C) -> Result<T, E>,
{
    JobCall::new(job, key).run(conn, body)
}

/// The async [`run`]: claims `key` for `job`, runs `body`, stores its value and commits; when the
/// key is already claimed, the body does not run and the stored value comes back as
/// [`Outcome::Replayed`].
///
/// Beyond what `run` promises: dropping the returned future after the transaction opened marks the
/// connection broken (a pool discards it; a later job on it fails) instead of leaving a transaction
/// open for a later job to commit into. The future is `Send` when the body's future is.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
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

/// Creates the runtime's tables, or upgrades them, through a sync connection; see
/// [`migrate_async`] for async connections.
///
/// When the schema is current this is one `SELECT` and changes nothing, so a worker whose role may
/// not create tables can call it at every start. It keeps its own schema version beside its tables
/// (`idempotent_schema`) and never touches the application's migration table; on PostgreSQL it
/// finds and creates the tables through the connection's `search_path`, as every job statement
/// does. Teams with their own migration tool can apply the plain SQL files under
/// `idempotent-runtime/sql/<database>/` instead.
///
/// ```
/// use diesel::prelude::*;
///
/// let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
/// idempotent_runtime::migrate(&mut conn)?;
/// idempotent_runtime::migrate(&mut conn)?; // current: nothing to do
/// # Ok::<(), idempotent_runtime::Error>(())
/// ```
pub fn migrate<C: JobStore>(conn: &mut C) -> Result<()> {
    Migrate::new().run(conn)
}

/// [`migrate`] through an async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn migrate_async<C: AsyncJobStore>(conn: &mut C) -> Result<()> {
    Migrate::new().run_async(conn).await
}

/// Checks, reading only, that the runtime's tables are ready for this connection: present (found
/// as the job statements find them), at this release's schema version, with the columns and unique
/// indexes the statements rely on, and (PostgreSQL, MySQL) with the privileges a worker needs
/// (`SELECT, INSERT, UPDATE` on `done_jobs` and `outbox`, `SELECT` on `idempotent_schema`, and
/// the outbox's id sequence on PostgreSQL). Every problem found is listed in
/// [`Error::SchemaNotReady`], each with what to do.
///
/// For workers that must not create tables: migrate once in the deploy step, as the schema's
/// owner, and let workers `verify` at start.
///
/// ```
/// use diesel::prelude::*;
///
/// let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
/// assert!(idempotent_runtime::verify(&mut conn).is_err(), "nothing there yet");
/// idempotent_runtime::migrate(&mut conn)?;
/// idempotent_runtime::verify(&mut conn)?;
/// # Ok::<(), idempotent_runtime::Error>(())
/// ```
pub fn verify<C: JobStore>(conn: &mut C) -> Result<()> {
    drive::block_on(migrations::verify(conn.idempotent_store()))
}

/// [`verify`] through an async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn verify_async<C: AsyncJobStore>(conn: &mut C) -> Result<()> {
    migrations::verify(conn.idempotent_store()).await
}

/// What generated code uses. Not part of the public API: it may change in any release. Its name
/// carries this crate's version, and the facade pins the macro crate to the same version, so
/// generated code from another release fails to compile here with a message naming this module.
#[doc(hidden)]
pub mod __private_0_1_0 {
    pub use crate::call::JobCall;
    pub use crate::fingerprint::FingerprintBuilder;
    pub use crate::job::{Job, WhileInProgress};
    pub use crate::key::{JobKey, KeyWriter};
    pub use crate::outcome::Outcome;
    pub use crate::registry::{Part, RegisteredJob};
    pub use inventory;

    /// The `T` and `E` of a handler's return type, however it is spelled (an alias such as
    /// `anyhow::Result<T>` included): the companion's `outcome` returns `Result<Outcome<T>, E>`.
    pub trait JobResult {
        /// The handler's `Ok` type.
        type Ok;
        /// The handler's `Err` type.
        type Err;
    }

    impl<T, E> JobResult for Result<T, E> {
        type Ok = T;
        type Err = E;
    }

    use crate::{JobError, JobOutput};

    /// [`run`](crate::run) for a connection reached through `reach`, such as a pooled connection
    /// that derefs to a Diesel connection: the body gets the caller's own connection value back.
    pub fn run_with<Conn, C, T, E, F>(
        conn: &mut Conn,
        reach: impl Fn(&mut Conn) -> &mut C,
        job_call: JobCall<'_>,
        body: F,
    ) -> Result<Outcome<T>, E>
    where
        Conn: ?Sized,
        C: crate::JobStore,
        T: JobOutput,
        E: JobError,
        F: FnOnce(&mut Conn) -> Result<T, E>,
    {
        crate::lifecycle::run_sync(conn, then_store(reach), job_call, body)
    }

    /// `reach`, then the runtime's view of what it reached.
    fn then_store<Conn: ?Sized, C: crate::JobStore>(
        reach: impl Fn(&mut Conn) -> &mut C,
    ) -> impl Fn(&mut Conn) -> &mut C::Runtime {
        move |conn| reach(conn).idempotent_store()
    }

    /// [`then_store`] for async connections.
    #[cfg(feature = "async")]
    fn then_async_store<Conn: ?Sized, C: AsyncJobRuntime>(
        reach: impl Fn(&mut Conn) -> &mut C,
    ) -> impl Fn(&mut Conn) -> &mut C::Runtime {
        move |conn| reach(conn).job_runtime()
    }

    /// What a generated async wrapper runs a job on: an [`AsyncJobStore`](crate::AsyncJobStore),
    /// or (feature `deadpool`) deadpool's pooled `Object`, which also leaves its pool when a job
    /// on it is cancelled.
    #[cfg(feature = "async")]
    pub trait AsyncJobRuntime: 'static {
        /// The runtime's view of the connection.
        #[doc(hidden)]
        type Runtime: crate::store::Store;

        /// Reaches it.
        #[doc(hidden)]
        fn job_runtime(&mut self) -> &mut Self::Runtime;
    }

    #[cfg(feature = "async")]
    impl<C: crate::AsyncJobStore> AsyncJobRuntime for C {
        type Runtime = C::Runtime;

        fn job_runtime(&mut self) -> &mut C::Runtime {
            self.idempotent_store()
        }
    }

    /// [`run_async`](crate::run_async) for a connection reached through `reach`.
    #[cfg(feature = "async")]
    pub async fn run_async_with<Conn, C, T, E, F>(
        conn: &mut Conn,
        reach: impl Fn(&mut Conn) -> &mut C,
        job_call: JobCall<'_>,
        body: F,
    ) -> Result<Outcome<T>, E>
    where
        Conn: ?Sized,
        C: AsyncJobRuntime,
        T: JobOutput,
        E: JobError,
        F: AsyncFnOnce(&mut Conn) -> Result<T, E>,
    {
        crate::lifecycle::run(conn, then_async_store(reach), job_call, body).await
    }

    /// Reaches the Diesel connection behind a handler's connection parameter. Called with method
    /// syntax, so auto-deref finds the connection inside an r2d2 pooled connection or a `Box`.
    pub trait JobConnection {
        /// The connection itself.
        fn job_connection(&mut self) -> &mut Self;
    }

    impl<C: crate::JobStore> JobConnection for C {
        fn job_connection(&mut self) -> &mut Self {
            self
        }
    }

    /// [`JobConnection`] for async connections.
    #[cfg(feature = "async")]
    pub trait AsyncJobConnection {
        /// The connection itself.
        fn async_job_connection(&mut self) -> &mut Self;
    }

    #[cfg(feature = "async")]
    impl<C: crate::AsyncJobStore> AsyncJobConnection for C {
        fn async_job_connection(&mut self) -> &mut Self {
            self
        }
    }

    /// A fingerprint input: anything `Serialize`.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be a fingerprint input: it does not implement `Serialize`",
        label = "this parameter is a fingerprint input, so its value must implement `serde::Serialize`",
        note = "derive `serde::Serialize` for it, or name a field that implements it: `fingerprint(param.field)`"
    )]
    pub trait FingerprintInput {
        /// Adds the value to the fingerprint under `name`.
        fn add_to(&self, name: &str, builder: FingerprintBuilder) -> FingerprintBuilder;
    }

    impl<T: serde::Serialize + ?Sized> FingerprintInput for T {
        fn add_to(&self, name: &str, builder: FingerprintBuilder) -> FingerprintBuilder {
            builder.input(name, self)
        }
    }

    /// A placeholder's value: anything `Display`, written into the key escaped.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be used in a job key: it does not implement `Display`",
        label = "this parameter is a key placeholder, so its value must implement `std::fmt::Display`",
        note = "implement `Display` for it, or name a field that does: `<param.field>`"
    )]
    pub trait KeyValue {
        /// Writes the value into the key.
        fn write_key(&self, writer: &mut KeyWriter);
    }

    impl<T: std::fmt::Display + ?Sized> KeyValue for T {
        fn write_key(&self, writer: &mut KeyWriter) {
            writer.value(self);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_private_module_is_named_with_this_version() {
        let expected = format!(
            "__private_{}",
            env!("CARGO_PKG_VERSION").replace(['.', '-', '+'], "_")
        );
        let source = include_str!("lib.rs");
        assert!(
            source.contains(&format!("pub mod {expected} {{")),
            "rename the private module to `{expected}` (the macro crate generates that path)"
        );
    }
}
