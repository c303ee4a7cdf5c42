//! A run-it-twice test kit: the rule's own check, for your jobs, in your tests.
//!
//! The rule from the
//! <a href="https://agentwranglers.se/playbook/scaling/background-jobs-and-queues/idempotent-jobs">Agent Wranglers scaling playbook</a>
//! says how to test a job: run it twice with the same input; the second run changes 0 rows and sends
//! nothing. [`assert_idempotent`] does exactly that, comparing the full contents of every table before
//! and after the second run, so a handler that writes anything outside its claim fails the test with
//! the rows it changed.
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
//! What "every table" means per backend: SQLite, every table of the main database; PostgreSQL, every
//! table in the schemas on the connection's `search_path`; MySQL, every table of the current database.

use std::collections::BTreeMap;
use std::fmt;

use diesel::QueryableByName;
use diesel::result::QueryResult;

use crate::store::JobStore;

/// The full contents of every table, as text, rows sorted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    tables: BTreeMap<String, Vec<String>>,
}

impl Snapshot {
    /// Reads every table through `conn`.
    pub fn take<C: Inspect>(conn: &mut C) -> QueryResult<Snapshot> {
        let mut tables = BTreeMap::new();
        for table in conn.table_names()? {
            let mut rows = conn.table_rows(&table)?;
            rows.sort_unstable();
            tables.insert(table, rows);
        }
        Ok(Snapshot { tables })
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
/// # Panics
///
/// When either run returns `Err`, or the second run changed rows (the message lists them).
#[track_caller]
pub fn assert_idempotent<C, T, E>(conn: &mut C, mut job: impl FnMut(&mut C) -> Result<T, E>) -> T
where
    C: Inspect,
    E: fmt::Debug,
{
    let first = match job(conn) {
        Ok(value) => value,
        Err(error) => panic!("the job's first run failed: {error:?}"),
    };
    assert_rerun_changes_nothing(conn, &mut job, "second run");
    first
}

/// The crash variant of [`assert_idempotent`]: runs `job` on a connection from `connect`, drops that
/// connection as a killed worker would (the queue never got its acknowledgement), then reruns the
/// job on a new connection and asserts the rerun changed nothing. Returns the first run's value.
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
    C: Inspect,
    E: fmt::Debug,
{
    let first = {
        let mut worker = connect();
        match job(&mut worker) {
            Ok(value) => value,
            Err(error) => panic!("the job's first run failed: {error:?}"),
        }
        // The worker dies here: its connection closes, the acknowledgement is never sent.
    };
    let mut retry = connect();
    assert_rerun_changes_nothing(&mut retry, &mut job, "rerun after the crash");
    first
}

#[track_caller]
fn assert_rerun_changes_nothing<C, T, E>(
    conn: &mut C,
    job: &mut impl FnMut(&mut C) -> Result<T, E>,
    which: &str,
) where
    C: Inspect,
    E: fmt::Debug,
{
    let before = match Snapshot::take(conn) {
        Ok(snapshot) => snapshot,
        Err(error) => panic!("reading the tables before the {which} failed: {error}"),
    };
    if let Err(error) = job(conn) {
        panic!("the job's {which} failed: {error:?}");
    }
    let after = match Snapshot::take(conn) {
        Ok(snapshot) => snapshot,
        Err(error) => panic!("reading the tables after the {which} failed: {error}"),
    };
    let changes = after.changes_since(&before);
    assert!(
        changes.is_empty(),
        "the job is not idempotent: its {which} changed rows\n{changes}"
    );
}

/// Reading every table, per backend.
pub trait Inspect: JobStore {
    /// The tables a [`Snapshot`] covers.
    fn table_names(&mut self) -> QueryResult<Vec<String>>;
    /// Every row of `table`, rendered as text, in any order.
    fn table_rows(&mut self, table: &str) -> QueryResult<Vec<String>>;
}

#[derive(QueryableByName)]
struct Name {
    #[diesel(sql_type = diesel::sql_types::Text)]
    name: String,
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = diesel::sql_types::Text)]
    row: String,
}

#[derive(QueryableByName)]
#[allow(dead_code)] // `data_type` is read on MySQL only
struct Column {
    #[diesel(sql_type = diesel::sql_types::Text)]
    name: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    data_type: String,
}

/// `name` as a double-quoted SQL identifier.
#[allow(dead_code)] // used by the backends that are compiled in
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `name` as a MySQL identifier.
#[allow(dead_code)] // used by the backends that are compiled in
fn backticked(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// The inspection queries per backend, for sync and async connections alike (`$($aw)*` is empty
/// or `.await`).
macro_rules! inspect_methods {
    (sqlite, [$($aw:tt)*]) => {
        async_or_sync!([$($aw)*] fn table_names(&mut self) -> QueryResult<Vec<String>> {
            run_query_dsl!([$($aw)*]);
            let names: Vec<Name> = diesel::sql_query(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
            )
            .load(self)$($aw)*?;
            Ok(names.into_iter().map(|n| n.name).collect())
        });

        async_or_sync!([$($aw)*] fn table_rows(&mut self, table: &str) -> QueryResult<Vec<String>> {
            run_query_dsl!([$($aw)*]);
            let columns: Vec<Column> = diesel::sql_query(
                "SELECT name, type AS data_type FROM pragma_table_info(?) ORDER BY cid",
            )
            .bind::<diesel::sql_types::Text, _>(table)
            .load(self)$($aw)*?;
            let row = columns
                .iter()
                .map(|c| format!("quote({})", quoted(&c.name)))
                .collect::<Vec<_>>()
                .join(" || ', ' || ");
            let rows: Vec<Row> = diesel::sql_query(format!("SELECT {row} AS row FROM {}", quoted(table)))
                .load(self)$($aw)*?;
            Ok(rows.into_iter().map(|r| r.row).collect())
        });
    };
    (postgres, [$($aw:tt)*]) => {
        async_or_sync!([$($aw)*] fn table_names(&mut self) -> QueryResult<Vec<String>> {
            run_query_dsl!([$($aw)*]);
            let names: Vec<Name> = diesel::sql_query(
                "SELECT quote_ident(table_schema) || '.' || quote_ident(table_name) AS name \
                 FROM information_schema.tables \
                 WHERE table_schema = ANY (current_schemas(false)) AND table_type = 'BASE TABLE' \
                 ORDER BY 1",
            )
            .load(self)$($aw)*?;
            Ok(names.into_iter().map(|n| n.name).collect())
        });

        async_or_sync!([$($aw)*] fn table_rows(&mut self, table: &str) -> QueryResult<Vec<String>> {
            run_query_dsl!([$($aw)*]);
            // `table` comes from `table_names`, already quoted per part.
            let rows: Vec<Row> = diesel::sql_query(format!("SELECT CAST(t AS text) AS row FROM {table} t"))
                .load(self)$($aw)*?;
            Ok(rows.into_iter().map(|r| r.row).collect())
        });
    };
    (mysql, [$($aw:tt)*]) => {
        async_or_sync!([$($aw)*] fn table_names(&mut self) -> QueryResult<Vec<String>> {
            run_query_dsl!([$($aw)*]);
            let names: Vec<Name> = diesel::sql_query(
                "SELECT CAST(table_name AS CHAR) AS name FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE' ORDER BY 1",
            )
            .load(self)$($aw)*?;
            Ok(names.into_iter().map(|n| n.name).collect())
        });

        async_or_sync!([$($aw)*] fn table_rows(&mut self, table: &str) -> QueryResult<Vec<String>> {
            run_query_dsl!([$($aw)*]);
            let columns: Vec<Column> = diesel::sql_query(
                "SELECT CAST(column_name AS CHAR) AS name, CAST(data_type AS CHAR) AS data_type \
                 FROM information_schema.columns \
                 WHERE table_schema = DATABASE() AND table_name = ? ORDER BY ordinal_position",
            )
            .bind::<diesel::sql_types::Text, _>(table)
            .load(self)$($aw)*?;
            let row = columns
                .iter()
                .map(|c| {
                    let column = backticked(&c.name);
                    if c.data_type.contains("binary") || c.data_type.contains("blob") {
                        format!("IFNULL(CONCAT('0x', HEX({column})), 'NULL')")
                    } else {
                        format!("QUOTE({column})")
                    }
                })
                .collect::<Vec<_>>()
                .join(", ");
            let rows: Vec<Row> = diesel::sql_query(format!(
                "SELECT CAST(CONCAT_WS(', ', {row}) AS CHAR) AS `row` FROM {}",
                backticked(table)
            ))
            .load(self)$($aw)*?;
            Ok(rows.into_iter().map(|r| r.row).collect())
        });
    };
}

/// Brings the sync or the async `RunQueryDsl` into scope.
macro_rules! run_query_dsl {
    ([]) => {
        use diesel::RunQueryDsl as _;
    };
    ([.await]) => {
        use diesel_async::RunQueryDsl as _;
    };
}

/// A method, `async` when the awaits are `.await`.
macro_rules! async_or_sync {
    ([] fn $($rest:tt)*) => { fn $($rest)* };
    ([.await] fn $($rest:tt)*) => { async fn $($rest)* };
}

#[cfg(feature = "sqlite")]
impl Inspect for diesel::sqlite::SqliteConnection {
    inspect_methods!(sqlite, []);
}

#[cfg(feature = "postgres")]
impl Inspect for diesel::pg::PgConnection {
    inspect_methods!(postgres, []);
}

#[cfg(feature = "mysql")]
impl Inspect for diesel::mysql::MysqlConnection {
    inspect_methods!(mysql, []);
}

#[cfg(feature = "async")]
pub use asynchronous::{AsyncInspect, assert_idempotent_async, assert_rerun_after_crash_async};

#[cfg(feature = "async")]
mod asynchronous {
    use super::*;
    use crate::AsyncJobStore;
    use std::future::Future;

    impl Snapshot {
        /// Reads every table through an async connection.
        pub async fn take_async<C: AsyncInspect>(conn: &mut C) -> QueryResult<Snapshot> {
            let mut tables = BTreeMap::new();
            for table in conn.table_names().await? {
                let mut rows = conn.table_rows(&table).await?;
                rows.sort_unstable();
                tables.insert(table, rows);
            }
            Ok(Snapshot { tables })
        }
    }

    /// [`Inspect`] for diesel-async connections.
    pub trait AsyncInspect: AsyncJobStore {
        /// The tables a [`Snapshot`] covers.
        fn table_names(&mut self) -> impl Future<Output = QueryResult<Vec<String>>> + Send;
        /// Every row of `table`, rendered as text, in any order.
        fn table_rows(
            &mut self,
            table: &str,
        ) -> impl Future<Output = QueryResult<Vec<String>>> + Send;
    }

    /// [`assert_idempotent`] for async jobs: runs `job` twice and asserts that the second run
    /// succeeded and changed no row in any table. Returns the first run's value.
    ///
    /// # Panics
    ///
    /// When either run returns `Err`, or the second run changed rows (the message lists them).
    pub async fn assert_idempotent_async<C, T, E>(
        conn: &mut C,
        mut job: impl AsyncFnMut(&mut C) -> Result<T, E>,
    ) -> T
    where
        C: AsyncInspect,
        E: fmt::Debug,
    {
        let first = match job(conn).await {
            Ok(value) => value,
            Err(error) => panic!("the job's first run failed: {error:?}"),
        };
        let before = match Snapshot::take_async(conn).await {
            Ok(snapshot) => snapshot,
            Err(error) => panic!("reading the tables before the second run failed: {error}"),
        };
        if let Err(error) = job(conn).await {
            panic!("the job's second run failed: {error:?}");
        }
        let after = match Snapshot::take_async(conn).await {
            Ok(snapshot) => snapshot,
            Err(error) => panic!("reading the tables after the second run failed: {error}"),
        };
        let changes = after.changes_since(&before);
        assert!(
            changes.is_empty(),
            "the job is not idempotent: its second run changed rows\n{changes}"
        );
        first
    }

    /// [`assert_rerun_after_crash`] for async jobs: runs `job` on a connection from `connect`,
    /// drops it as a killed worker would, and asserts that a rerun on a new connection changed
    /// nothing. Returns the first run's value.
    ///
    /// # Panics
    ///
    /// When either run returns `Err`, or the rerun changed rows (the message lists them).
    pub async fn assert_rerun_after_crash_async<C, T, E>(
        mut connect: impl AsyncFnMut() -> C,
        mut job: impl AsyncFnMut(&mut C) -> Result<T, E>,
    ) -> T
    where
        C: AsyncInspect,
        E: fmt::Debug,
    {
        let first = {
            let mut worker = connect().await;
            match job(&mut worker).await {
                Ok(value) => value,
                Err(error) => panic!("the job's first run failed: {error:?}"),
            }
            // The worker dies here: its connection closes, the acknowledgement is never sent.
        };
        let mut retry = connect().await;
        let before = match Snapshot::take_async(&mut retry).await {
            Ok(snapshot) => snapshot,
            Err(error) => panic!("reading the tables before the rerun failed: {error}"),
        };
        if let Err(error) = job(&mut retry).await {
            panic!("the job's rerun after the crash failed: {error:?}");
        }
        let after = match Snapshot::take_async(&mut retry).await {
            Ok(snapshot) => snapshot,
            Err(error) => panic!("reading the tables after the rerun failed: {error}"),
        };
        let changes = after.changes_since(&before);
        assert!(
            changes.is_empty(),
            "the job is not idempotent: its rerun after the crash changed rows\n{changes}"
        );
        first
    }

    #[cfg(feature = "async-postgres")]
    impl AsyncInspect for diesel_async::AsyncPgConnection {
        inspect_methods!(postgres, [.await]);
    }

    #[cfg(feature = "async-mysql")]
    impl AsyncInspect for diesel_async::AsyncMysqlConnection {
        inspect_methods!(mysql, [.await]);
    }

    #[cfg(feature = "async-sqlite")]
    impl AsyncInspect
        for diesel_async::sync_connection_wrapper::SyncConnectionWrapper<
            diesel::sqlite::SqliteConnection,
        >
    {
        async fn table_names(&mut self) -> QueryResult<Vec<String>> {
            self.spawn_blocking(Inspect::table_names).await
        }

        async fn table_rows(&mut self, table: &str) -> QueryResult<Vec<String>> {
            let table = table.to_owned();
            self.spawn_blocking(move |conn| Inspect::table_rows(conn, &table))
                .await
        }
    }
}
