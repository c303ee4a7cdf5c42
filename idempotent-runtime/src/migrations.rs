//! The runtime's own tables, created and upgraded by [`migrate`](crate::migrate).
//!
//! The runtime keeps its schema version in a table of its own, `idempotent_schema`, beside
//! `done_jobs` and `outbox`; it never reads or writes the application's migration table
//! (`__diesel_schema_migrations`), so the application's own `diesel migration run` and `revert`
//! keep working. An earlier release did record its versions there: `migrate` adopts the tables it
//! made, and takes those two rows back out of the application's table.
//!
//! * **Current: no lock, no DDL.** `migrate` first reads the version with one `SELECT`; when the
//!   schema is current it returns at once, so a worker whose role may not create tables can call
//!   it at every start.
//! * **One place.** The tables are found as every job statement finds them (PostgreSQL: through
//!   the connection's `search_path`), and new tables go beside the existing ones, never as a
//!   second copy in another schema.
//! * **Serialized.** Concurrent callers wait for one another: an advisory lock held until the
//!   migration's transaction ends (PostgreSQL), the database's one writer (`BEGIN IMMEDIATE`,
//!   SQLite), a named lock released by a guard (MySQL).
//! * **Resumable.** Each step is one table; on MySQL, whose DDL commits by itself, a step whose
//!   table exists is recorded, not run again.
//!
//! The steps as plain SQL, for teams with their own migration tool, are the files in
//! `idempotent-runtime/sql/<database>/`; each records its version in `idempotent_schema`.

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Integer, Nullable};

use crate::error::Error;
use crate::store::{Database, Store};

/// The schema version this release creates.
pub(crate) const LATEST: i32 = 2;

/// One step of the schema: creates `table`.
#[derive(Debug)]
pub(crate) struct Step {
    pub(crate) version: i32,
    pub(crate) table: &'static str,
    pub(crate) sql: &'static str,
}

/// `MAX(version)` of `idempotent_schema`.
#[derive(QueryableByName)]
pub(crate) struct Version {
    #[diesel(sql_type = Nullable<Integer>)]
    pub(crate) version: Option<i32>,
}

/// A count from a catalog.
#[derive(QueryableByName)]
pub(crate) struct TableCount {
    #[diesel(sql_type = BigInt)]
    pub(crate) n: i64,
}

/// Maps a failure of a step about `table` to [`Error::Migration`].
pub(crate) fn failed<E: std::error::Error + Send + Sync + 'static>(
    table: &'static str,
) -> impl FnOnce(E) -> Error {
    move |source| Error::Migration {
        table,
        source: Box::new(source),
    }
}

/// Creates or upgrades the tables through `conn`; see the [module docs](self).
pub(crate) async fn run<S: Store>(conn: &mut S) -> Result<(), Error> {
    let current = crate::retry::retrying::<S, _>(async || S::Db::schema_version(conn).await)
        .await
        .map_err(failed("idempotent_schema"))?;
    if current == Some(LATEST) {
        return Ok(());
    }
    if let Some(newer) = current.filter(|version| *version > LATEST) {
        return Err(Error::Migration {
            table: "idempotent_schema",
            source: format!(
                "the schema is at version {newer}, made by a newer release of idempotent-jobs than this one (which knows versions up to {LATEST}); upgrade this worker"
            )
            .into(),
        });
    }
    S::Db::migrate(conn).await
}

/// Runs `steps` in one transaction, all or nothing (SQLite and PostgreSQL, whose DDL is
/// transactional), opening it again while the database is busy.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "async-postgres"))]
pub(crate) async fn in_transaction<S: Store>(
    conn: &mut S,
    mut steps: impl AsyncFnMut(&mut S) -> Result<(), Error>,
) -> Result<(), Error> {
    use crate::transaction::{Transaction, itself};
    let mut retry = crate::retry::Retry::new();
    loop {
        let mut transaction = match Transaction::begin(&mut *conn, itself::<S>).await {
            Ok((transaction, _)) => transaction,
            Err(error) if retry.failed::<S::Db>(&error).is_some() => {
                retry.pause::<S>().await;
                continue;
            }
            Err(error) => return Err(failed("idempotent_schema")(error)),
        };
        match steps(transaction.store()).await {
            Ok(()) => {
                return transaction
                    .commit()
                    .await
                    .map_err(failed("idempotent_schema"));
            }
            Err(error) => {
                transaction.rollback().await;
                return Err(error);
            }
        }
    }
}
