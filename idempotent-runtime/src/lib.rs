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

// First: the statement macro the database modules use, and their migration steps.
#[macro_use]
mod sql;
#[macro_use]
mod migrations;

mod call;
mod connection;
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
mod lost;
mod migration_failure;
pub mod outbox;
mod outcome;
#[cfg(feature = "async-postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "async-postgres")))]
pub mod pooler;
pub mod prune;
pub mod redelivery;
pub mod registry;
mod relay_report;
mod retry;
pub mod schema;
mod schema_problem;
mod shape;
pub mod stats;
mod store;
mod telemetry;
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
pub use schema_problem::SchemaProblem;

#[cfg(feature = "async")]
pub use prune::prune_async;

#[cfg(feature = "async")]
pub use connection::AsyncJobStore;
pub use connection::JobStore;

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

/// Reads `error`, which a statement of the caller's own on `conn` has just returned, as the
/// runtime reads the errors of its own statements: the error in terms that say what it is, and
/// whether it says the database was busy (a lock wait or a statement time limit that ran out, a
/// deadlock, a serialization failure, SQLite's lock), whatever the language of the server's
/// messages. Diesel passes on PostgreSQL's SQLSTATE only for serialization failures (40001) and
/// MySQL's error number only for deadlocks (1213): PostgreSQL's lock and statement timeouts and
/// deadlocks (55P03, 57014, 40P01) are known by their messages in each language of its catalogs,
/// and MySQL's (1205, 1969, 3024) by the error number, read from the session's diagnostics area
/// and appended to the message with its English words. Call it on the connection that failed,
/// before any other statement on it (inside a transaction: before it rolls back). A lost
/// connection is not "busy".
///
/// For the operator CLI's own statements (the dashboard's charts); not part of the public API.
#[doc(hidden)]
pub fn read_error<C: JobStore>(
    conn: &mut C,
    error: diesel::result::Error,
) -> (diesel::result::Error, bool) {
    use store::{Database, Store};
    type Db<C> = <<C as JobStore>::Runtime as Store>::Db;
    let error = drive::block_on(<Db<C> as Database>::in_known_terms(
        conn.idempotent_store(),
        error,
    ));
    let busy = <Db<C> as Database>::classify(&error).is_transient();
    (error, busy)
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
#[path = "private.rs"]
pub mod __private_0_1_0;

/// What `#[idempotent_job]` checks a handler's parts against. You never implement these: each is
/// implemented for every type that qualifies, and a compile error names the one a part misses.
pub mod handler {
    #[cfg(feature = "async")]
    pub use crate::__private_0_1_0::AsyncJobConnection;
    pub use crate::__private_0_1_0::{FingerprintInput, JobConnection, JobResult, KeyValue};
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
            source.contains(&format!("pub mod {expected};")),
            "rename the private module to `{expected}` (the macro crate generates that path)"
        );
    }
}
