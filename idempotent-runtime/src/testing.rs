//! A run-it-twice test kit: the rule's own check, for your jobs, in your tests.
//!
//! The rule from the
//! <a href="https://agentwranglers.se/playbook/scaling/background-jobs-and-queues/idempotent-jobs">Agent Wranglers scaling playbook</a>
//! says how to test a job: run it twice with the same input; the second run changes 0 rows and sends
//! nothing. [`assert_idempotent`] does exactly that, comparing the full contents of every table before
//! and after the second run. Since a second run replays without running the body, it first runs the
//! job inside a transaction of its own that it rolls back (a first delivery that failed before its
//! commit), which must change nothing either. So a handler that writes anything outside its claim
//! (on a connection of its own, too) fails the test with the rows it changed.
//!
//! ```
//! use diesel::prelude::*;
//! use idempotent_runtime::{Job, JobKey, run, testing};
//!
//! static GREET: Job = Job::new("greet", "greet:<user>");
//!
//! type BoxError = Box<dyn std::error::Error + Send + Sync>;
//!
//! fn greet(conn: &mut SqliteConnection, user: &str) -> Result<(), BoxError> {
//!     let key = JobKey::builder().text("greet:").value(user).build()?;
//!     run(conn, &GREET, &key, |conn| {
//!         diesel::sql_query("INSERT INTO greetings (user) VALUES (?)")
//!             .bind::<diesel::sql_types::Text, _>(user)
//!             .execute(conn)?;
//!         Ok::<_, BoxError>(())
//!     })
//!     .map(|outcome| outcome.into_inner())
//! }
//!
//! let mut conn = SqliteConnection::establish(":memory:").unwrap();
//! idempotent_runtime::migrate(&mut conn).unwrap();
//! diesel::sql_query("CREATE TABLE greetings (user TEXT)").execute(&mut conn).unwrap();
//! testing::assert_idempotent(&mut conn, |conn| greet(conn, "ada"));
//! ```
//!
//! What "every table" means per backend: SQLite, every table of the main database but SQLite's own
//! (named `sqlite_...`); PostgreSQL, every table in the schemas on the connection's `search_path`;
//! MySQL, every table of the current database.

use std::collections::BTreeMap;
use std::fmt;

use diesel::result::QueryResult;

use crate::store::{Database, Store};
use crate::transaction::Transaction;

/// The full contents of every table, as text, rows sorted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    tables: BTreeMap<String, Vec<String>>,
}

impl Snapshot {
    /// Reads every table through a sync connection.
    pub fn take<C: crate::connection::JobStore>(conn: &mut C) -> QueryResult<Snapshot> {
        crate::drive::block_on(snapshot(conn.idempotent_store()))
    }

    /// Reads every table through an async connection.
    #[cfg(feature = "async")]
    #[cfg_attr(docsrs, doc(cfg(feature = "async")))]
    pub async fn take_async<C: crate::connection::AsyncJobStore>(
        conn: &mut C,
    ) -> QueryResult<Snapshot> {
        snapshot(conn.idempotent_store()).await
    }

    /// The tables, by name.
    pub fn table_names(&self) -> impl Iterator<Item = &str> {
        self.tables.keys().map(String::as_str)
    }

    /// The rows of `table`, rendered as text and sorted; empty if there is no such table.
    /// On PostgreSQL tables are named `schema.table`; `table` alone finds it too.
    pub fn rows(&self, table: &str) -> &[String] {
        let found = self.tables.get(table).or_else(|| {
            let suffix = format!(".{table}");
            let mut matching = self
                .tables
                .iter()
                .filter(|(name, _)| name.ends_with(&suffix));
            match (matching.next(), matching.next()) {
                (Some((_, rows)), None) => Some(rows),
                _ => None,
            }
        });
        found.map_or(&[], Vec::as_slice)
    }

    /// What changed from `before` to `self`.
    pub fn changes_since(&self, before: &Snapshot) -> Changes {
        let mut tables = BTreeMap::new();
        let names: std::collections::BTreeSet<&String> =
            self.tables.keys().chain(before.tables.keys()).collect();
        for name in names {
            let empty = Vec::new();
            let old = before.tables.get(name).unwrap_or(&empty);
            let new = self.tables.get(name).unwrap_or(&empty);
            let added = multiset_difference(new, old);
            let removed = multiset_difference(old, new);
            if !added.is_empty() || !removed.is_empty() {
                tables.insert(name.clone(), TableChange { added, removed });
            }
        }
        Changes { tables }
    }
}

async fn snapshot<S: Store>(conn: &mut S) -> QueryResult<Snapshot> {
    let mut tables = BTreeMap::new();
    for table in S::Db::table_names(conn).await? {
        let mut rows = S::Db::table_rows(conn, &table).await?;
        rows.sort_unstable();
        tables.insert(table, rows);
    }
    Ok(Snapshot { tables })
}

/// Rows of sorted `a` not matched by a row of sorted `b`.
fn multiset_difference(a: &[String], b: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut j = 0;
    for row in a {
        while j < b.len() && b[j] < *row {
            j += 1;
        }
        if j < b.len() && b[j] == *row {
            j += 1;
        } else {
            out.push(row.clone());
        }
    }
    out
}

/// The rows that differ between two snapshots, per table. An updated row shows as one removed and one
/// added.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Changes {
    tables: BTreeMap<String, TableChange>,
}

/// The rows of one table that differ.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TableChange {
    /// Rows present after, not before.
    pub added: Vec<String>,
    /// Rows present before, not after.
    pub removed: Vec<String>,
}

impl Changes {
    /// `true` when no row of any table changed.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// The tables that changed.
    pub fn tables(&self) -> impl Iterator<Item = (&str, &TableChange)> {
        self.tables
            .iter()
            .map(|(name, change)| (name.as_str(), change))
    }
}

impl fmt::Display for Changes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tables.is_empty() {
            return f.write_str("no rows changed");
        }
        for (name, change) in &self.tables {
            writeln!(f, "table `{name}`:")?;
            for row in &change.removed {
                writeln!(f, "  - {}", shorten(row))?;
            }
            for row in &change.added {
                writeln!(f, "  + {}", shorten(row))?;
            }
        }
        Ok(())
    }
}

fn shorten(row: &str) -> String {
    const LIMIT: usize = 300;
    if row.len() <= LIMIT {
        return row.to_owned();
    }
    let mut end = LIMIT;
    while !row.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &row[..end], row.len())
}

/// Runs `job` twice through `conn` and asserts the rule's check: the first run succeeds, and the
/// second run succeeds and changes no row in any table. Returns the first run's value.
///
/// Before them it runs `job` once inside a transaction it then rolls back, as a first delivery
/// that failed before its commit, and asserts that this left every table as it was, whatever the
/// job returned: the second run replays without running the body, so only this run shows a write
/// a rollback cannot undo (on another connection, say), which a redelivery would repeat. The body
/// thus runs twice, and on PostgreSQL and MySQL the rolled-back run uses up sequence and
/// `AUTO_INCREMENT` numbers.
///
/// # Panics
///
/// When either run returns `Err`, the rolled-back run changed rows, or the second run changed rows
/// (the message names the run, and lists the rows by table).
#[track_caller]
pub fn assert_idempotent<C, T, E>(conn: &mut C, mut job: impl FnMut(&mut C) -> Result<T, E>) -> T
where
    C: crate::connection::JobStore,
    E: fmt::Debug,
{
    crate::drive::block_on(rolled_back_run_changes_nothing(
        conn,
        C::idempotent_store,
        async |conn| job(conn),
    ));
    let first = first_run(job(conn));
    crate::drive::block_on(rerun_changes_nothing(
        conn,
        C::idempotent_store,
        async |conn| job(conn),
        "second run",
    ));
    first
}

/// The crash variant of [`assert_idempotent`]: runs `job` on a connection from `connect`, drops that
/// connection as a killed worker would (the queue never got its acknowledgement), then reruns the
/// job on a new connection and asserts the rerun changed nothing. Returns the first run's value.
/// On the first connection, before the first run, it runs `job` in a transaction it rolls back, as
/// [`assert_idempotent`] does.
///
/// # Panics
///
/// As [`assert_idempotent`], and when `connect` fails.
#[track_caller]
pub fn assert_rerun_after_crash<C, T, E>(
    mut connect: impl FnMut() -> C,
    mut job: impl FnMut(&mut C) -> Result<T, E>,
) -> T
where
    C: crate::connection::JobStore,
    E: fmt::Debug,
{
    let (first, left) = {
        let mut worker = connect();
        crate::drive::block_on(rolled_back_run_changes_nothing(
            &mut worker,
            C::idempotent_store,
            async |conn| job(conn),
        ));
        let first = first_run(job(&mut worker));
        let left = crate::drive::block_on(read_tables(
            worker.idempotent_store(),
            "after the",
            "first run",
        ));
        (first, left)
        // The worker dies here: its connection closes, the acknowledgement is never sent.
    };
    let mut retry = connect();
    crate::drive::block_on(same_database(retry.idempotent_store(), &left));
    crate::drive::block_on(rerun_changes_nothing(
        &mut retry,
        C::idempotent_store,
        async |conn| job(conn),
        "rerun after the crash",
    ));
    first
}

/// Panics where the rerun's connection does not see what the first run left (`left`): `connect`
/// reached another database (`:memory:` opens a new one each time), and every row of the first
/// run would read as the rerun's change, "not idempotent", of a job that may well be.
async fn same_database<S: Store>(conn: &mut S, left: &Snapshot) {
    let found = read_tables(conn, "before the", "rerun after the crash").await;
    let missing = found.changes_since(left);
    assert!(
        missing.is_empty(),
        "the rerun's connection does not see what the first run left: `connect` must reach the same database each time (a file or a server; `:memory:` opens a new, empty one each time)\n{missing}"
    );
}

/// [`assert_idempotent`] for async jobs, with its rolled-back run first.
///
/// # Panics
///
/// When either run returns `Err`, the rolled-back run changed rows, or the second run changed rows
/// (the message names the run, and lists the rows by table).
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn assert_idempotent_async<C, T, E>(
    conn: &mut C,
    mut job: impl AsyncFnMut(&mut C) -> Result<T, E>,
) -> T
where
    C: crate::connection::AsyncJobStore,
    E: fmt::Debug,
{
    rolled_back_run_changes_nothing(conn, C::idempotent_store, &mut job).await;
    let first = first_run(job(conn).await);
    rerun_changes_nothing(conn, C::idempotent_store, job, "second run").await;
    first
}

/// [`assert_rerun_after_crash`] for async jobs, with its rolled-back run first.
///
/// # Panics
///
/// When either run returns `Err`, the rolled-back run changed rows, or the rerun changed rows (the
/// message names the run, and lists the rows by table).
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn assert_rerun_after_crash_async<C, T, E>(
    mut connect: impl AsyncFnMut() -> C,
    mut job: impl AsyncFnMut(&mut C) -> Result<T, E>,
) -> T
where
    C: crate::connection::AsyncJobStore,
    E: fmt::Debug,
{
    let (first, left) = {
        let mut worker = connect().await;
        rolled_back_run_changes_nothing(&mut worker, C::idempotent_store, &mut job).await;
        let first = first_run(job(&mut worker).await);
        let left = read_tables(worker.idempotent_store(), "after the", "first run").await;
        (first, left)
    };
    let mut retry = connect().await;
    same_database(retry.idempotent_store(), &left).await;
    rerun_changes_nothing(
        &mut retry,
        C::idempotent_store,
        job,
        "rerun after the crash",
    )
    .await;
    first
}

#[track_caller]
fn first_run<T, E: fmt::Debug>(result: Result<T, E>) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("the job's first run failed: {error:?}"),
    }
}

/// Runs `job` once inside a transaction of the kit's, then rolls that transaction back: a first
/// delivery that failed before its commit (a crash, a failed `COMMIT`). Whatever the run returned,
/// it must leave every table as it was: a row it wrote where the rollback cannot reach (on a
/// connection of its own, say) would be written again by the redelivery, which a replay, skipping
/// the body, never shows.
async fn rolled_back_run_changes_nothing<C, S: Store, T, E: fmt::Debug>(
    conn: &mut C,
    store: impl Fn(&mut C) -> &mut S,
    mut job: impl AsyncFnMut(&mut C) -> Result<T, E>,
) {
    let which = "run rolled back before its commit";
    let before = read_tables(store(conn), "before the", which).await;
    let returned = {
        let (mut transaction, _) = match Transaction::begin(conn, &store).await {
            Ok(begun) => begun,
            Err(error) => panic!("opening the transaction of the {which} failed: {error}"),
        };
        let returned = match job(transaction.conn()).await {
            Ok(_) => "Ok".to_owned(),
            Err(error) => format!("Err({error:?})"),
        };
        // A body that ended the kit's transaction itself left nothing to roll back.
        if transaction.store().transaction_depth().unwrap_or(1) > 0 {
            transaction.rollback().await;
        } else {
            transaction.hand_over();
        }
        returned
    };
    let after = read_tables(store(conn), "after the", which).await;
    let changes = after.changes_since(&before);
    assert!(
        changes.is_empty(),
        "the job is not idempotent: a run rolled back before its commit (a first delivery that \
         failed; it returned {returned}) changed rows, which its redelivery will change again\n\
         {changes}"
    );
}

/// Reads every table, or panics saying when.
async fn read_tables<S: Store>(conn: &mut S, when: &str, which: &str) -> Snapshot {
    match snapshot(conn).await {
        Ok(snapshot) => snapshot,
        Err(error) => panic!("reading the tables {when} {which} failed: {error}"),
    }
}

async fn rerun_changes_nothing<C, S: Store, T, E: fmt::Debug>(
    conn: &mut C,
    store: impl Fn(&mut C) -> &mut S,
    mut job: impl AsyncFnMut(&mut C) -> Result<T, E>,
    which: &str,
) {
    let before = read_tables(store(conn), "before the", which).await;
    if let Err(error) = job(conn).await {
        panic!("the job's {which} failed: {error:?}");
    }
    let after = read_tables(store(conn), "after the", which).await;
    let changes = after.changes_since(&before);
    assert!(
        changes.is_empty(),
        "the job is not idempotent: its {which} changed rows\n{changes}"
    );
}
