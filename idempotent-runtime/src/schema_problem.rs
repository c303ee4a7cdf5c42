//! What [`verify`](crate::verify) finds wrong with the runtime's tables: one typed problem each, with
//! what to do about it in its `Display`.

/// One thing [`verify`](crate::verify) found wrong with the runtime's tables, and what to do about it.
///
/// Its `Display` is the problem in words, with the fix; match on the variant to act on it (the
/// operator CLI does).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaProblem {
    /// A table is not where the connection looks for it (`searched` says where that is).
    MissingTable {
        /// The table.
        table: &'static str,
        /// Where the connection looked (its database, its search_path).
        searched: String,
    },
    /// A table lacks a column the runtime's statements use.
    MissingColumn {
        /// The table.
        table: &'static str,
        /// The column.
        column: &'static str,
    },
    /// The connection's role or user lacks a privilege a worker needs; `grant` gives it.
    MissingPrivilege {
        /// The privilege (`SELECT`, `USAGE`, ...).
        privilege: &'static str,
        /// What it is needed on, in words.
        object: String,
        /// The statement that grants it.
        grant: String,
    },
    /// A column the claims rely on being unique has no unique index.
    NoUniqueIndex {
        /// The table.
        table: &'static str,
        /// The column.
        column: &'static str,
    },
    /// The schema is older than this release needs.
    Older {
        /// The version recorded.
        found: i32,
        /// The version this release needs.
        needed: i32,
    },
    /// The connection's sessions cannot write: a write that changes nothing was refused as
    /// read-only (PostgreSQL's `default_transaction_read_only`, or a hot standby; MySQL's
    /// `read_only` or `transaction_read_only`; a SQLite file opened read-only). Every claim would
    /// fail the same way.
    ReadOnly {
        /// The database's refusal.
        why: String,
    },
    /// A table has the name of one of the runtime's but is not the runtime's (an application's own
    /// `outbox`): it lacks the column `lacks` the runtime's has always had. `migrate` refuses to
    /// take it for its own.
    ForeignTable {
        /// The table.
        table: &'static str,
        /// The runtime's column it lacks.
        lacks: &'static str,
    },
    /// `idempotent_schema` records the step that made a table (`version`), but the table is not
    /// there: dropped or renamed since. `migrate` passes recorded steps by, so it cannot make it
    /// again until those versions are deleted; its `Display` gives the statement.
    Lost {
        /// The table.
        table: &'static str,
        /// The version of the step that made it.
        version: i32,
    },
    /// The session converts text through a character set other than the one Diesel sets at
    /// connect (MySQL/MariaDB: a `SET NAMES latin1`, or a `SET character_set_client`,
    /// `_connection` or `_results`, where Diesel set utf8mb4; PostgreSQL: a `SET client_encoding`,
    /// where it set UTF8): keys, results and outbox messages would be stored converted and read
    /// back changed on other sessions, or refused (a relay stops at a message the session cannot
    /// show). `found` names the settings.
    SessionCharset {
        /// The settings that are not utf8mb4, as `name = value`.
        found: String,
    },
    /// The session's clock is set apart from the server's (MySQL/MariaDB: `SET timestamp`). The
    /// database's clock the runtime reads (`UTC_TIMESTAMP()`) follows it: this session would
    /// take keys still kept for lapsed (and run their jobs again), or lapsed ones for kept, and
    /// prune keys other sessions keep.
    SessionClock {
        /// How far the session's clock is ahead of the server's, in seconds (behind: negative).
        offset_seconds: i64,
    },
    /// SQLite: a database file of the connection (its main one, or one attached) runs with
    /// `journal_mode = MEMORY` or `OFF`, which keep no journal on disk. A process killed in the
    /// middle of a job can leave in the file pages of its transaction that nothing undoes, such as
    /// the claim's without the work's: the key then replays, for ever, a run whose work is
    /// missing. (`OFF` also has no rollback: a failing job is `Error::CannotRollBack`.) An
    /// in-memory database, whose journal is always in memory, is not this problem: a killed
    /// process takes it whole.
    VolatileJournal {
        /// Each such database, as `name (journal_mode = mode)`.
        found: String,
    },
    /// This session has a temporary table of the name of one of the runtime's (PostgreSQL's
    /// `pg_temp`, searched before the search_path; a MySQL/MariaDB `TEMPORARY` table; SQLite's
    /// `temp` database), which every statement of the session finds instead of the runtime's: what
    /// jobs write there (their claims, their outbox messages) vanishes when the session
    /// disconnects, and the next delivery runs them again. `migrate` refuses, changing nothing.
    /// Jobs do not check: `verify` at the start of a worker (on each pooled connection's setup)
    /// does.
    ShadowedByTemporary {
        /// The runtime's table hidden.
        table: &'static str,
    },
    /// SQLite: the runtime's table is in a database attached to this connection (`database`), not
    /// in its main one. Jobs use it there, as SQLite finds tables (temp, main, then the attached
    /// databases in order); `migrate` does not make or upgrade tables there, nor a second copy in
    /// main, which SQLite would search first (the keys committed in `database` would run again):
    /// it refuses, changing nothing.
    AttachedDatabase {
        /// The table.
        table: &'static str,
        /// The attached database's name on this connection.
        database: String,
    },
    /// The schema was made by a newer release.
    Newer {
        /// The version recorded.
        found: i32,
        /// The newest version this release knows.
        known: i32,
    },
}

impl SchemaProblem {
    /// The missing table this problem is about, if it is one.
    pub fn missing_table(&self) -> Option<&'static str> {
        match self {
            SchemaProblem::MissingTable { table, .. } => Some(table),
            _ => None,
        }
    }

    /// Whether the problem keeps `idempotent_schema` from being read.
    pub(crate) fn hides_the_version(&self) -> bool {
        match self {
            SchemaProblem::MissingTable { table, .. } => *table == "idempotent_schema",
            SchemaProblem::MissingPrivilege { object, .. } => object.contains("idempotent_schema"),
            _ => false,
        }
    }
}

impl std::fmt::Display for SchemaProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SchemaProblem::MissingTable { table, searched } => write!(
                f,
                "the table `{table}` is missing from {searched}: run migrate as the schema's owner"
            ),
            SchemaProblem::MissingColumn { table, column } => {
                write!(
                    f,
                    "the table `{table}` has no column `{column}`: run migrate as the schema's owner"
                )
            }
            SchemaProblem::MissingPrivilege {
                privilege,
                object,
                grant,
            } => write!(f, "this connection lacks {privilege} on {object}: {grant}"),
            SchemaProblem::NoUniqueIndex { table, column } => write!(
                f,
                "`{table}.{column}` has no unique index: two workers could both claim"
            ),
            SchemaProblem::Older { found, needed } => write!(
                f,
                "the schema is at version {found}, this release needs {needed}: run migrate as the schema's owner"
            ),
            SchemaProblem::ReadOnly { why } => write!(
                f,
                "this connection cannot write ({why}): every job's claim would fail; connect where writes are accepted (the primary; a SQLite file opened for writing), or turn off the read-only setting of this session, role or user (PostgreSQL: default_transaction_read_only; MySQL: read_only, transaction_read_only)"
            ),
            SchemaProblem::ForeignTable { table, lacks } => write!(
                f,
                "a table `{table}` is there that is not the runtime's (it has no column `{lacks}`): the runtime's `{table}` cannot be made beside it; rename that table, or give the runtime a database (PostgreSQL: a schema) of its own, then run migrate"
            ),
            SchemaProblem::Lost { table, version } => write!(
                f,
                "`idempotent_schema` records version {version}, which made `{table}`, but `{table}` is not there (dropped or renamed since): migrate passes recorded versions by; as the schema's owner, delete the versions from {version} on (`DELETE FROM idempotent_schema WHERE version >= {version}`), then run migrate, which makes what is missing and records again what is there"
            ),
            SchemaProblem::SessionCharset { found } => write!(
                f,
                "this session's character set is not the one Diesel sets when it connects, utf8mb4 on MySQL and MariaDB, UTF8 on PostgreSQL ({found}): keys, results and outbox messages would be stored converted through it and read back changed on other sessions (`é` as `Ã©`), or refused (a relay would stop at a message it cannot show, every time); keep that character set: drop the `SET NAMES`, `SET character_set_...` or `SET client_encoding` of the pool's connection hook, or of the code that runs before the jobs"
            ),
            SchemaProblem::SessionClock { offset_seconds } => write!(
                f,
                "this session's clock is set {} s {} the server's (`SET timestamp`), and the database's clock the runtime reads follows it: jobs here would take keys still kept for lapsed and run again, and prune keys other sessions keep; run `SET timestamp = DEFAULT` (in the pool's connection hook, or after the code that set it) before jobs",
                offset_seconds.unsigned_abs(),
                if *offset_seconds > 0 {
                    "ahead of"
                } else {
                    "behind"
                }
            ),
            SchemaProblem::VolatileJournal { found } => write!(
                f,
                "this SQLite connection keeps no journal on disk ({found}): a process killed in the middle of a job can leave the job's claim committed without its work, and the key would then replay, for ever, a run whose work is missing; use the default journal (`PRAGMA journal_mode = DELETE`) or WAL (`PRAGMA journal_mode = WAL`) on that database, in the pool's connection hook or wherever the connection is set up"
            ),
            SchemaProblem::ShadowedByTemporary { table } => write!(
                f,
                "this session has a temporary table `{table}`, which its statements find instead of the runtime's `{table}`: what jobs write there (their claims, their outbox messages) vanishes when the session disconnects, and their next delivery runs them again; drop it where the session's setup makes it (PostgreSQL: `DROP TABLE pg_temp.{table}`, or put pg_temp last in the search_path, `SET search_path = <your schemas>, pg_temp`; MySQL/MariaDB: `DROP TEMPORARY TABLE {table}`; SQLite: `DROP TABLE temp.{table}`), or give it another name; migrate changes nothing while it is there"
            ),
            SchemaProblem::AttachedDatabase { table, database } => write!(
                f,
                "the runtime's `{table}` is in the database `{database}` attached to this connection, not in its main database: jobs find it there, but migrate does not make or upgrade tables in an attached database, nor a second copy in the main one, which SQLite searches first (the keys committed in `{database}` would run again); run migrate on a connection that opens `{database}`'s file as its main database, then attach it again; nothing was changed"
            ),
            SchemaProblem::Newer { found, known } => write!(
                f,
                "the schema is at version {found}, made by a newer release of idempotent-jobs than this one (which knows versions up to {known}): upgrade this worker (or this CLI) to that release or later; migrate cannot take a schema back"
            ),
        }
    }
}

/// A problem is also the reason [`migrate`](crate::migrate) refuses to start, as the source of
/// [`Error::Migration`](crate::Error::Migration) (a schema made by a newer release): nothing was
/// changed, and calling it again meets the same until the problem is dealt with.
impl std::error::Error for SchemaProblem {}
