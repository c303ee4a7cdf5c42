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
//! * **Resumable.** Each step is one table or one column; on MySQL, whose DDL commits by itself,
//!   a step whose table (or column) exists is recorded, not run again.
//!
//! The steps as plain SQL, for teams with their own migration tool, are the files in
//! `idempotent-runtime/sql/<database>/`; each records its version in `idempotent_schema`.

pub(crate) use crate::migration_failure::LockWait;
use crate::migration_failure::{Cause, StepFailed};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Integer, Nullable};

use crate::error::Error;
use crate::schema_problem::SchemaProblem;
use crate::store::{Database, Step, Store};

/// The schema version this release creates on `D`: its last step's.
pub(crate) fn latest<D: Database>() -> i32 {
    D::STEPS.last().map_or(0, |step| step.version)
}

/// The runtime's tables and the columns its statements use, as `verify` checks them.
pub(crate) const TABLES: &[(&str, &[&str])] = &[
    (
        "idempotent_schema",
        &["version", "description", "applied_at"],
    ),
    (
        "done_jobs",
        &[
            "key_digest",
            "job_key",
            "job_name",
            "result",
            "fingerprint",
            "done_at",
            "expires_at",
            "claim_token",
        ],
    ),
    (
        "outbox",
        &[
            "id",
            "message_id",
            "topic",
            "payload",
            "job_key",
            "created_at",
            "available_at",
            "attempts",
            "last_error",
            "lease_owner",
            "lease_until",
            "delivered_at",
            "parked_at",
        ],
    ),
];

/// The runtime's tables among `names`, in [`TABLES`]' order, each once.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "async-postgres"))]
pub(crate) fn runtime_tables<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'static str> {
    let names: Vec<&str> = names.into_iter().collect();
    TABLES
        .iter()
        .map(|(table, _)| *table)
        .filter(|table| names.iter().any(|name| name.eq_ignore_ascii_case(table)))
        .collect()
}

/// Steps of routines (MySQL's job procedures) recorded at or below `version` whose routines are
/// not there: a `migrate` by a role that may not create routines records the step without them.
async fn routines_missing<S: Store>(
    conn: &mut S,
    version: i32,
) -> diesel::QueryResult<Vec<&'static Step>> {
    let mut missing = Vec::new();
    for step in S::Db::STEPS
        .iter()
        .filter(|step| !step.routines.is_empty() && step.version <= version)
    {
        if !S::Db::routines_exist(conn, step.routines).await? {
            missing.push(step);
        }
    }
    Ok(missing)
}

/// A column each runtime table has had since the step that created it, and an application's table
/// of the same name hardly has: a table without it is not the runtime's (an application's own
/// `outbox`), and `migrate` does not take it for a step made.
const SIGNATURES: &[(&str, &str)] = &[("done_jobs", "key_digest"), ("outbox", "message_id")];

/// A table named like one of the runtime's that is not the runtime's: `Some(problem)` when `table`
/// is there without its signature column ([`SIGNATURES`]).
async fn foreign<S: Store>(
    conn: &mut S,
    table: &'static str,
) -> diesel::QueryResult<Option<SchemaProblem>> {
    let Some((_, column)) = SIGNATURES.iter().find(|(name, _)| *name == table) else {
        return Ok(None);
    };
    if !S::Db::table_exists(conn, table).await? {
        return Ok(None);
    }
    let columns = S::Db::table_columns(conn, table).await?;
    Ok(
        (!columns.iter().any(|c| c == column)).then_some(SchemaProblem::ForeignTable {
            table,
            lacks: column,
        }),
    )
}

/// The step that creates `table` (not one that adds a column, an index or routines to it).
fn creating_step<D: Database>(table: &str) -> Option<&'static Step> {
    D::STEPS.iter().find(|step| {
        step.table == table
            && step.column.is_none()
            && step.routines.is_empty()
            && step.indexes.is_empty()
    })
}

/// A table `idempotent_schema` records as made (its creating step at or below `version`) that is
/// not there: dropped or renamed since. Every later step passes it by, so `migrate` would never
/// make it again.
async fn lost<S: Store>(conn: &mut S, version: i32) -> diesel::QueryResult<Option<SchemaProblem>> {
    for (table, _) in TABLES {
        let Some(step) = creating_step::<S::Db>(table).filter(|step| step.version <= version)
        else {
            continue;
        };
        if !S::Db::table_exists(conn, table).await? {
            return Ok(Some(SchemaProblem::Lost {
                table: step.table,
                version: step.version,
            }));
        }
    }
    Ok(None)
}

/// How long `migrate` waits for another migration's lock before it gives up, unless told.
pub(crate) const LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Options for [`migrate`](crate::migrate): how long to wait for a migration running elsewhere.
///
/// ```
/// use std::time::Duration;
/// use diesel::prelude::*;
///
/// let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
/// idempotent_runtime::Migrate::new().lock_timeout(Duration::from_secs(10)).run(&mut conn)?;
/// # Ok::<(), idempotent_runtime::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migrate {
    lock_timeout: std::time::Duration,
}

impl Default for Migrate {
    fn default() -> Self {
        Self::new()
    }
}

impl Migrate {
    /// Waits up to 2 minutes for another migration.
    pub fn new() -> Self {
        Self {
            lock_timeout: LOCK_TIMEOUT,
        }
    }

    /// How long to wait for a migration running elsewhere before giving up with
    /// [`Error::Migration`]; nothing is changed then. At least a millisecond.
    pub fn lock_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.lock_timeout = timeout.max(std::time::Duration::from_millis(1));
        self
    }

    /// Creates or upgrades the tables through a sync connection; see [`migrate`](crate::migrate).
    pub fn run<C: crate::connection::JobStore>(&self, conn: &mut C) -> Result<(), Error> {
        crate::drive::block_on(run(conn.idempotent_store(), self.lock_timeout))
    }

    /// Creates or upgrades the tables through an async connection.
    #[cfg(feature = "async")]
    #[cfg_attr(docsrs, doc(cfg(feature = "async")))]
    pub async fn run_async<C: crate::connection::AsyncJobStore>(
        &self,
        conn: &mut C,
    ) -> Result<(), Error> {
        run(conn.idempotent_store(), self.lock_timeout).await
    }
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
pub(crate) async fn run<S: Store>(
    conn: &mut S,
    lock_timeout: std::time::Duration,
) -> Result<(), Error> {
    let current =
        crate::retry::retrying(conn, async |conn: &mut S| S::Db::schema_version(conn).await)
            .await
            .map_err(failed("idempotent_schema"))?;
    // Where the tables are as this connection finds them, a table recorded but gone, routines
    // recorded but missing: one transaction of reads, before any lock.
    let (shadowed, attached, lost_table, routines) =
        outside_migration(conn, async |conn: &mut S| {
            let shadowed = S::Db::shadowed_by_temporary(conn).await?;
            let attached = runtime_tables_attached(conn).await?;
            let (lost_table, routines) = match current {
                Some(version) => (
                    lost(conn, version).await?,
                    routines_missing(conn, version).await?,
                ),
                None => (None, Vec::new()),
            };
            Ok((shadowed, attached, lost_table, routines))
        })
        .await?;
    if let Some(table) = shadowed.first() {
        // A temporary table of the session hides the runtime's: what migrate read (the version
        // among it) and would make is the temporary one's. Nothing is changed.
        return Err(Error::Migration {
            table,
            source: Box::new(SchemaProblem::ShadowedByTemporary { table }),
        });
    }
    if let Some(problem) = lost_table {
        // Nothing is changed, and calling again meets the same: the source says what to do.
        return Err(Error::Migration {
            table: match &problem {
                SchemaProblem::Lost { table, .. } => table,
                _ => "idempotent_schema",
            },
            source: Box::new(problem),
        });
    }
    let latest = latest::<S::Db>();
    if current == Some(latest) && routines.is_empty() {
        return Ok(());
    }
    if let Some(newer) = current.filter(|version| *version > latest) {
        // Nothing is changed, and calling again meets the same: the source says so.
        return Err(Error::Migration {
            table: "idempotent_schema",
            source: Box::new(SchemaProblem::Newer {
                found: newer,
                known: latest,
            }),
        });
    }
    if let Some((table, database)) = attached.into_iter().next() {
        // SQLite: the tables are in an attached database. DDL from here would make a second copy
        // in main, which SQLite searches first: refused, nothing changed.
        return Err(Error::Migration {
            table,
            source: Box::new(SchemaProblem::AttachedDatabase { table, database }),
        });
    }
    if current.is_none() {
        // Tables this role cannot see are not tables to create (a second copy elsewhere on the
        // search_path, or "no schema exists"): the missing grant is named, nothing is changed.
        // (An empty schema of the search_path out of the role's reach is PostgreSQL's `migrate`'s
        // to name: it holds no table to find here.)
        if let Some(problem) = hidden_outside_migration(conn).await?.into_iter().next() {
            return Err(Error::Migration {
                table: "idempotent_schema",
                source: Box::new(problem),
            });
        }
    }
    S::Db::migrate(conn, lock_timeout).await
}

/// The runtime's own tables in an attached SQLite database, with the database's name. Only the
/// runtime's: an application's table of that name there is a foreign table (refused as such, with
/// its own advice).
async fn runtime_tables_attached<S: Store>(
    conn: &mut S,
) -> diesel::QueryResult<Vec<(&'static str, String)>> {
    let mut attached = Vec::new();
    for (table, database) in S::Db::in_attached_databases(conn).await? {
        if foreign(conn, table).await?.is_none() {
            attached.push((table, database));
        }
    }
    Ok(attached)
}

/// Checks, changing nothing, that the tables are there at this release's version, with their
/// columns, unique indexes and the privileges a worker needs, and that the session can write; see
/// [`verify`](crate::verify). One pass for every database, in a transaction of its own; each
/// database says only how to look.
pub(crate) async fn verify<S: Store>(conn: &mut S) -> Result<(), Error> {
    let problems = crate::transaction::outside_transactions(
        conn,
        "idempotent_schema",
        async |conn: &mut S| problems_of(conn).await,
    )
    .await
    .map_err(|outside| match outside {
        crate::transaction::Outside::InsideTransaction => Error::InsideTransaction {
            what: "verify the runtime's tables",
        },
        crate::transaction::Outside::NotMigrated(table, _) => Error::NotMigrated { table },
        crate::transaction::Outside::Failed(source)
        | crate::transaction::Outside::CommitUnknown(source) => Error::Verify(source),
    })?;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::SchemaNotReady { problems })
    }
}

/// What is wrong with the tables as this connection sees them, each problem once.
async fn problems_of<S: Store>(conn: &mut S) -> diesel::QueryResult<Vec<SchemaProblem>> {
    // A schema of the search_path that holds the tables but that this role may not use hides
    // them (PostgreSQL): the grant is the problem, not tables to create.
    let mut problems = hidden_by(conn).await?;
    let hidden = !problems.is_empty();
    // A temporary table of the session that hides the runtime's: jobs here would write to it.
    for table in S::Db::shadowed_by_temporary(conn).await? {
        problems.push(SchemaProblem::ShadowedByTemporary { table });
    }
    let mut present = Vec::new();
    for (table, expected) in TABLES {
        if let Some(problem) = foreign(conn, table).await? {
            // Its columns are not the runtime's to list, nor to probe privileges on.
            problems.push(problem);
            continue;
        }
        if !S::Db::table_exists(conn, table).await? {
            if !hidden {
                problems.push(SchemaProblem::MissingTable {
                    table,
                    searched: S::Db::where_tables_are(conn).await?,
                });
            }
            continue;
        }
        present.push(*table);
        let columns = S::Db::table_columns(conn, table).await?;
        for column in *expected {
            if !columns.iter().any(|c| c == column) {
                problems.push(SchemaProblem::MissingColumn { table, column });
            }
        }
    }
    for problem in S::Db::missing_privileges(conn, &present).await? {
        if !problems.contains(&problem) {
            problems.push(problem);
        }
    }
    if present.contains(&"idempotent_schema")
        && !problems.iter().any(SchemaProblem::hides_the_version)
    {
        let latest = latest::<S::Db>();
        let recorded = S::Db::schema_version(conn).await?;
        if let Some(found) = recorded {
            // A table the version records as made is lost, not a table `migrate` would make.
            for problem in &mut problems {
                if let SchemaProblem::MissingTable { table, .. } = problem
                    && let Some(step) =
                        creating_step::<S::Db>(table).filter(|step| step.version <= found)
                {
                    *problem = SchemaProblem::Lost {
                        table: step.table,
                        version: step.version,
                    };
                }
            }
        }
        match recorded {
            Some(found) if found < latest => problems.push(SchemaProblem::Older {
                found,
                needed: latest,
            }),
            Some(found) if found > latest => problems.push(SchemaProblem::Newer {
                found,
                known: latest,
            }),
            _ => {}
        }
    }
    for (table, column) in [("done_jobs", "key_digest"), ("outbox", "message_id")] {
        if present.contains(&table) && !S::Db::has_unique_index(conn, table, column).await? {
            problems.push(SchemaProblem::NoUniqueIndex { table, column });
        }
    }
    if present.contains(&"done_jobs") {
        problems.extend(cannot_write(conn).await?);
    }
    problems.extend(session_problems(conn).await?);
    Ok(problems)
}

/// What the session's own settings would change of what jobs store and decide (MySQL/MariaDB: a
/// character set other than utf8mb4, a clock set apart by `SET timestamp`; SQLite: a journal a
/// killed process leaves nothing of).
async fn session_problems<S: Store>(conn: &mut S) -> diesel::QueryResult<Vec<SchemaProblem>> {
    let mut problems = Vec::new();
    if let Some(found) = S::Db::session_charset(conn).await? {
        problems.push(SchemaProblem::SessionCharset { found });
    }
    if let Some(offset_seconds) = S::Db::session_clock_offset(conn).await? {
        problems.push(SchemaProblem::SessionClock { offset_seconds });
    }
    if let Some(found) = S::Db::volatile_journals(conn).await? {
        problems.push(SchemaProblem::VolatileJournal { found });
    }
    Ok(problems)
}

/// Whether the session refuses writes as read-only, told by a write that matches no row, under a
/// savepoint rolled back at once (a refused statement aborts a PostgreSQL transaction; the
/// savepoint keeps verify's usable). It asks what the settings would only hint at: a PostgreSQL
/// session's `default_transaction_read_only` or a hot standby, MySQL's `read_only` (which a user
/// with `SUPER` passes), a read-only SQLite file. Any other refusal (no `UPDATE` privilege, which
/// the privilege check reports) is not this problem.
async fn cannot_write<S: Store>(conn: &mut S) -> diesel::QueryResult<Option<SchemaProblem>> {
    conn.batch("SAVEPOINT idempotent_verify_write").await?;
    let probe = conn
        .batch("UPDATE done_jobs SET job_name = job_name WHERE 1 = 0")
        .await;
    conn.batch("ROLLBACK TO SAVEPOINT idempotent_verify_write")
        .await?;
    conn.batch("RELEASE SAVEPOINT idempotent_verify_write")
        .await?;
    Ok(probe.err().and_then(|error| {
        let text = error.to_string();
        let lower = text.to_lowercase();
        ["read-only", "read only", "readonly"]
            .iter()
            .any(|said| lower.contains(said))
            .then_some(SchemaProblem::ReadOnly { why: text })
    }))
}

/// The grants missing on schemas of the search_path that hold the runtime's tables but that this
/// role may not use (PostgreSQL's `USAGE`; none elsewhere): asked of the database's privilege
/// check with no table present, which then reports only those.
async fn hidden_by<S: Store>(conn: &mut S) -> diesel::QueryResult<Vec<SchemaProblem>> {
    S::Db::missing_privileges(conn, &[]).await
}

/// [`hidden_by`], before `migrate` takes its lock: in a transaction (a statement's prepare and its
/// execution stay on one server connection behind PgBouncer) that takes no lock (SQLite's
/// `BEGIN DEFERRED`: a migration holding the write lock is waited for by `migrate`'s own, bounded
/// wait, not here).
async fn hidden_outside_migration<S: Store>(conn: &mut S) -> Result<Vec<SchemaProblem>, Error> {
    outside_migration(conn, async |conn: &mut S| hidden_by(conn).await).await
}

/// `check`'s reads before `migrate` takes its lock, in a transaction as [`hidden_outside_migration`]'s
/// (outside one, behind PgBouncer in transaction mode, a statement prepared on one server
/// connection ran on another: "prepared statement does not exist").
async fn outside_migration<S: Store, T>(
    conn: &mut S,
    check: impl AsyncFnOnce(&mut S) -> diesel::QueryResult<T>,
) -> Result<T, Error> {
    use crate::transaction::{Transaction, itself};
    let (mut transaction, _) = Transaction::begin_deferred(&mut *conn, itself::<S>)
        .await
        .map_err(failed("idempotent_schema"))?;
    match check(transaction.store()).await {
        Ok(found) => {
            transaction
                .commit()
                .await
                .map_err(failed("idempotent_schema"))?;
            Ok(found)
        }
        Err(error) => {
            transaction.rollback().await;
            Err(failed("idempotent_schema")(error))
        }
    }
}

/// Runs `steps` in one transaction, all or nothing (SQLite and PostgreSQL, whose DDL is
/// transactional), opening it again while the database is busy.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "async-postgres"))]
pub(crate) async fn in_transaction<S: Store>(
    conn: &mut S,
    lock_timeout: std::time::Duration,
    mut steps: impl AsyncFnMut(&mut S) -> Result<(), Error>,
) -> Result<(), Error> {
    use crate::transaction::{Transaction, itself};
    let mut retry = crate::retry::Retry::within(lock_timeout);
    loop {
        let mut transaction = match Transaction::begin(&mut *conn, itself::<S>).await {
            Ok((transaction, _)) => transaction,
            Err(error) if retry.failed::<S::Db>(&error).is_some() => {
                retry.pause::<S>().await;
                continue;
            }
            Err(error) if S::Db::classify(&error).is_transient() => {
                return Err(Error::Migration {
                    table: "idempotent_schema",
                    source: Box::new(LockWait(format!(
                        "another connection held the database's write lock for more than {lock_timeout:?} ({error}); nothing was changed. Retry once it has finished"
                    ))),
                });
            }
            Err(error) => return Err(failed("idempotent_schema")(error)),
        };
        match steps(transaction.store()).await {
            Ok(()) => {
                return transaction.commit().await.map_err(|error| {
                    // The server may have committed every step: not "failed, rolled back".
                    match S::Db::connection_lost(&error) {
                        true => Error::OutcomeUnknown {
                            action: "migrating the runtime's tables",
                            source: error,
                        },
                        false => failed("idempotent_schema")(error),
                    }
                });
            }
            Err(error) => {
                transaction.rollback().await;
                return Err(error);
            }
        }
    }
}

/// After a statement on `table` failed for a reason that does not pass: [`Error::NotMigrated`] when
/// the table is not there (the usual first mistake), `None` when it is, or when looking fails too.
pub(crate) async fn not_migrated<S: Store>(conn: &mut S, table: &'static str) -> Option<Error> {
    match S::Db::table_exists_alone(conn, table).await {
        Ok(false) => Some(Error::NotMigrated { table }),
        Ok(true) | Err(_) => None,
    }
}

/// A database's migration steps and version table, from `idempotent-runtime/sql/<$db>/`, with
/// the steps that database alone has after the shared three (its procedures on MySQL, and the
/// index on leased messages, whose version differs by one there).
macro_rules! migration_steps {
    ($db:literal $(, $own:expr)*) => {
        const STEPS: &'static [$crate::store::Step] = &[
            $crate::store::Step {
                version: 1,
                table: "done_jobs",
                column: None,
                routines: &[],
                indexes: &[],
                sql: include_str!(concat!("../../sql/", $db, "/001_done_jobs.sql")),
            },
            $crate::store::Step {
                version: 2,
                table: "outbox",
                column: None,
                routines: &[],
                indexes: &[],
                sql: include_str!(concat!("../../sql/", $db, "/002_outbox.sql")),
            },
            $crate::store::Step {
                version: 3,
                table: "done_jobs",
                column: Some("claim_token"),
                routines: &[],
                indexes: &[],
                sql: include_str!(concat!("../../sql/", $db, "/003_claim_token.sql")),
            },
            $($own,)*
        ];
        const VERSION_TABLE: &'static str =
            include_str!(concat!("../../sql/", $db, "/000_idempotent_schema.sql"));
    };
}

/// One pass over the steps not yet recorded, for every database, under the lock (and, where DDL
/// is transactional, in the transaction) its dialect's `migrate` holds. `ddl_prelude`, run just
/// before the first DDL, is what the dialect needs there (PostgreSQL: the schema the tables go
/// into). Which steps are made is read first, as the connection finds tables.
pub(crate) async fn pass<S: Store>(conn: &mut S, ddl_prelude: Option<&str>) -> Result<(), Error> {
    let version = S::Db::schema_version(conn)
        .await
        .map_err(failed("idempotent_schema"))?;
    let mut pending = Vec::new();
    for step in S::Db::STEPS
        .iter()
        .filter(|step| step.version > version.unwrap_or(0))
    {
        // A table of the step's name that is not the runtime's: refused before anything is
        // changed (taken for the step made, its version was recorded, and every later step failed
        // on its missing columns, for good), whether the step makes it or adds to it.
        if let Some(problem) = foreign(conn, step.table)
            .await
            .map_err(failed(step.table))?
        {
            return Err(Error::Migration {
                table: step.table,
                source: Box::new(problem),
            });
        }
        pending.push((
            step,
            step_made(conn, step).await.map_err(failed(step.table))?,
        ));
    }
    // Routines a step recorded without (its role could not create them): made now, by a role
    // that may; a role that may not is warned again, and the step stays recorded.
    let repair = match version {
        Some(version) => routines_missing(conn, version)
            .await
            .map_err(failed("idempotent_schema"))?,
        None => Vec::new(),
    };
    if version.is_none()
        && S::Db::table_exists(conn, "__diesel_schema_migrations")
            .await
            .map_err(failed("__diesel_schema_migrations"))?
    {
        // An earlier release kept its versions in the application's own Diesel migration
        // table: take those rows back out.
        S::Db::forget_diesel_versions(conn)
            .await
            .map_err(failed("__diesel_schema_migrations"))?;
    }
    if let Some(prelude) = ddl_prelude {
        conn.batch(prelude).await.map_err(failed("done_jobs"))?;
    }
    if version.is_none() {
        create(conn, "idempotent_schema", S::Db::VERSION_TABLE, None).await?;
    }
    for step in repair {
        remake_routines(conn, step).await?;
    }
    for (step, made) in pending {
        if made {
            // Made by an earlier release, or by a run that stopped before it recorded the step
            // (MySQL's DDL commits by itself): the table is the step's whole work.
            record_version(conn, step).await?;
        } else {
            create(conn, step.table, step.sql, Some(step)).await?;
        }
    }
    Ok(())
}

/// Whether `step`'s table (or column, or routines, or indexes) is there.
async fn step_made<S: Store>(conn: &mut S, step: &Step) -> diesel::QueryResult<bool> {
    if !step.routines.is_empty() {
        return S::Db::routines_exist(conn, step.routines).await;
    }
    if !S::Db::table_exists(conn, step.table).await? {
        return Ok(false);
    }
    for index in step.indexes {
        if !S::Db::index_exists(conn, step.table, index).await? {
            return Ok(false);
        }
    }
    Ok(match step.column {
        None => true,
        Some(column) => S::Db::table_columns(conn, step.table)
            .await?
            .iter()
            .any(|c| c == column),
    })
}

async fn record_version<S: Store>(conn: &mut S, step: &Step) -> Result<(), Error> {
    S::Db::record_version(conn, step.version, &step.description())
        .await
        .map_err(failed("idempotent_schema"))
}

/// Makes again the routines of a step recorded without them. A role that may not (or that may not
/// even see them: MySQL lists a routine only to a user with a privilege on it) is warned, and
/// nothing changes: the step stays recorded, and jobs run correctly without them.
async fn remake_routines<S: Store>(conn: &mut S, step: &Step) -> Result<(), Error> {
    let Err(error) = conn.batch(step.sql).await else {
        tracing::info!(
            routines = step.routines.join(", "),
            "made the stored procedures a migration recorded without them"
        );
        return Ok(());
    };
    if let Some(reset) = S::Db::AFTER_FAILED_STEP
        && let Err(reset_error) = conn.batch(reset).await
    {
        tracing::warn!(%reset_error, "restoring the session after a failed migration step failed");
    }
    if S::Db::privilege_denied(&error) {
        tracing::warn!(
            %error,
            routines = step.routines.join(", "),
            "the stored procedures of this schema are missing (or this role may not see them), and this role may not create them: jobs run correctly without them, with four more round trips each (7 where they take 3); to add them, run migrate as a role that may create routines (CREATE ROUTINE, ALTER ROUTINE), and grant EXECUTE on them to the workers' role"
        );
        return Ok(());
    }
    Err(step_failed::<S::Db>(step.table, Some(step), error))
}

/// Runs a step's DDL (the version table's when `step` is `None`). Where DDL commits by itself
/// (MySQL), a failure because another migration made the table meanwhile is told by looking: on
/// Galera, `GET_LOCK` holds on one node only, while DDL is ordered across the cluster, so workers
/// starting together on two nodes both try. The step is then done; its version is recorded unless
/// the other migration recorded it first.
///
/// A step of routines replaces a half-made set (`DROP ... IF EXISTS`, then `CREATE`); a migration
/// on another node doing the same between the two makes the `CREATE` fail ("already exists"), so
/// it runs again, a few times.
async fn create<S: Store>(
    conn: &mut S,
    table: &'static str,
    sql: &str,
    step: Option<&Step>,
) -> Result<(), Error> {
    let routines = step.is_some_and(|step| !step.routines.is_empty());
    let mut attempt = 0;
    let error = loop {
        attempt += 1;
        let Err(error) = conn.batch(sql).await else {
            return Ok(());
        };
        if let Some(reset) = S::Db::AFTER_FAILED_STEP
            && let Err(reset_error) = conn.batch(reset).await
        {
            tracing::warn!(%reset_error, "restoring the session after a failed migration step failed");
        }
        if !(routines && attempt < 5 && S::Db::made_concurrently(&error)) {
            break error;
        }
        tracing::info!(%error, attempt, "another migration is creating these routines; running the step again");
        S::pause(std::time::Duration::from_millis(50 * attempt)).await;
    };
    if S::Db::DDL_IN_TRANSACTION {
        return Err(step_failed::<S::Db>(table, step, error));
    }
    let made_meanwhile = match step {
        Some(step) => step_made(conn, step).await,
        None => S::Db::table_exists(conn, table).await,
    }
    .map_err(failed(table))?;
    if !made_meanwhile {
        if let Some(step) = step.filter(|step| !step.routines.is_empty())
            && S::Db::privilege_denied(&error)
        {
            tracing::warn!(
                %error,
                routines = step.routines.join(", "),
                "this role may not create stored procedures: jobs run correctly without them, with four more round trips each (7 where they take 3); to add them, run migrate as a role that may create routines (CREATE ROUTINE, ALTER ROUTINE), or this step's SQL (idempotent-runtime/sql/)"
            );
            return record_version(conn, step).await;
        }
        return Err(step_failed::<S::Db>(table, step, error));
    }
    tracing::info!(table, "another migration created this table meanwhile");
    match step {
        Some(step) => record_version(conn, step).await,
        None => Ok(()),
    }
}

/// Sorts the failure of a step's DDL (`step` `None`: the version table's).
fn step_failed<D: crate::store::Database>(
    table: &'static str,
    step: Option<&Step>,
    error: diesel::result::Error,
) -> Error {
    let message = match &error {
        diesel::result::Error::DatabaseError(_, info) => info.message().to_owned(),
        _ => String::new(),
    };
    let cause = if D::connection_lost(&error) || D::classify(&error).is_transient() {
        Cause::Transient
    } else if D::privilege_denied(&error) {
        Cause::Privilege {
            grant: grant_for::<D>(&message),
        }
    } else if message.contains("Index column size too large")
        || message.contains("key was too long")
    {
        Cause::RowFormat { table }
    } else if let Some(index) = step
        .filter(|_| message.contains("already exists"))
        .and_then(|step| step.indexes.iter().find(|index| message.contains(**index)))
    {
        Cause::IndexInTheWay { index }
    } else {
        Cause::Other
    };
    Error::Migration {
        table,
        source: Box::new(StepFailed { cause, error }),
    }
}

/// The grant a refused step needs, from the database's refusal.
fn grant_for<D: crate::store::Database>(message: &str) -> String {
    if D::NAME == "PostgreSQL" {
        return "as the schema's owner, grant the role that migrates CREATE on the schema (`GRANT USAGE, CREATE ON SCHEMA <schema> TO <the role that migrates>`); an index or a column on a table of the runtime's needs that table's owner: migrate as the schema's owner".to_owned();
    }
    // MySQL/MariaDB: "CREATE command denied to user 'u'@'h' for table `db`.`t`".
    let privilege = message
        .split(" command denied")
        .next()
        .filter(|head| head.len() < message.len())
        .and_then(|head| head.rsplit(": ").next())
        .map(str::trim)
        .filter(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphabetic() || c == ' '))
        .unwrap_or("CREATE");
    let user = message
        .split("to user ")
        .nth(1)
        .and_then(|rest| rest.split(" for ").next())
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .unwrap_or("<the user that migrates>");
    let database = message
        .split("for table `")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .filter(|d| !d.is_empty())
        .map_or_else(|| "<the database>".to_owned(), |d| format!("`{d}`"));
    format!(
        "as an administrator, `GRANT {privilege} ON {database}.* TO {user}` (migrate needs SELECT, INSERT, DELETE, CREATE, ALTER, INDEX and DROP there, and CREATE ROUTINE and ALTER ROUTINE for the job procedures), or migrate as the schema's owner"
    )
}
