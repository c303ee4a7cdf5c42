//! The connection types a job can run on, sync and async: sealed traits whose methods reach the
//! runtime's internal view of the connection.

use crate::store;

/// A sync Diesel connection a job can run on: `SqliteConnection`, `PgConnection` or
/// `MysqlConnection` (each behind its feature). Pooled connections (r2d2) reach theirs through
/// `Deref`.
///
/// Sealed: the runtime implements it for Diesel's connection types; its methods are internal.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a database connection `idempotent-jobs` can claim jobs on",
    label = "a job needs a Diesel connection here",
    note = "use `SqliteConnection`, `PgConnection` or `MysqlConnection` (each behind its cargo feature), or a pooled connection that derefs to one",
    note = "if it is a diesel-async connection, make the handler an `async fn`",
    note = "for a type parameter, bound it by this trait: `C: idempotent_jobs::JobStore` (`diesel::Connection` is not enough)"
)]
pub trait JobStore: diesel::Connection + Sealed + 'static {
    /// The runtime's view of the connection: itself.
    #[doc(hidden)]
    type Runtime: store::Store;

    /// Reaches the runtime's view of the connection. Its methods stay internal: they are on a
    /// trait users cannot name, reached only through this associated type.
    #[doc(hidden)]
    fn idempotent_store(&mut self) -> &mut Self::Runtime;
}

/// Implemented only by the runtime, for the connection types it supports; users cannot name it.
pub trait Sealed {}

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
    note = "use `AsyncPgConnection`, `AsyncMysqlConnection` or `SyncConnectionWrapper<SqliteConnection>` (features `async-postgres`, `async-mysql`, `async-sqlite`), or a pooled connection that derefs to one",
    note = "if it is a sync Diesel connection, make the handler a plain `fn` (remove `async`)",
    note = "for a type parameter, bound it by this trait: `C: idempotent_jobs::AsyncJobStore` (`diesel_async::AsyncConnection` is not enough)"
)]
pub trait AsyncJobStore: diesel_async::AsyncConnection + Sealed + 'static {
    /// The runtime's view of the connection: itself.
    #[doc(hidden)]
    type Runtime: store::Store;

    /// Reaches the runtime's view of the connection; see [`JobStore::idempotent_store`].
    #[doc(hidden)]
    fn idempotent_store(&mut self) -> &mut Self::Runtime;
}
