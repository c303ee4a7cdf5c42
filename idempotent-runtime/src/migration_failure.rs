//! Why a migration failed, as the source of [`Error::Migration`](crate::Error::Migration) holds
//! it: what lets `migrate` finish (its advice), and whether calling it again can. A leaf of its
//! own, so that the error type reads it without reaching into the migrations.

/// A step's DDL that failed, sorted by what lets `migrate` finish: the source of
/// [`Error::Migration`](crate::Error::Migration), whose advice ([`advice`]) and retryability it gives. Its text is the
/// database's error.
#[derive(Debug)]
pub(crate) struct StepFailed {
    pub(crate) cause: Cause,
    pub(crate) error: diesel::result::Error,
}

/// What a failed step needs before `migrate` can finish it.
#[derive(Debug)]
pub(crate) enum Cause {
    /// Nothing: it passes (a lost connection, a lock wait, a deadlock, a busy database).
    Transient,
    /// An index of the step's name is there that is not the step's made (PostgreSQL: one a
    /// failed `CREATE INDEX CONCURRENTLY` left invalid): `DROP INDEX` it.
    IndexInTheWay { index: &'static str },
    /// MySQL's 1709 or 1071: the table's row format (`COMPACT`, `REDUNDANT`) cannot hold the
    /// step's index.
    RowFormat { table: &'static str },
    /// A privilege the step needs, refused: the grant that gives it.
    Privilege { grant: String },
    /// Anything else: the database's error says what.
    Other,
}

impl std::fmt::Display for StepFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for StepFailed {}

/// The database's error a failed migration holds, if any (a step's sorted one, or one of the
/// reads around the steps).
pub(crate) fn database_error<'a>(
    source: &'a (dyn std::error::Error + Send + Sync + 'static),
) -> Option<&'a diesel::result::Error> {
    source.downcast_ref::<diesel::result::Error>().or_else(|| {
        source
            .downcast_ref::<StepFailed>()
            .map(|failed| &failed.error)
    })
}

/// Whether calling `migrate` again can finish what failed with `source` as it is: a failure that
/// passes (a lost connection, a lock wait, a deadlock).
pub(crate) fn retryable(source: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    if source.is::<LockWait>() {
        return true;
    }
    match source.downcast_ref::<StepFailed>() {
        Some(failed) => matches!(failed.cause, Cause::Transient),
        None => source
            .downcast_ref::<diesel::result::Error>()
            .is_some_and(passes),
    }
}

/// Whether a database error outside a step passes, on any database: a lost connection, a
/// serialization failure, a deadlock, a lock wait that timed out, a busy SQLite file (PostgreSQL
/// reports a deadlock by its message alone, through diesel-async).
fn passes(error: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind, Error as DieselError};
    if crate::lost::anywhere(error)
        || matches!(
            error,
            DieselError::DatabaseError(DatabaseErrorKind::SerializationFailure, _)
        )
    {
        return true;
    }
    let message = match error {
        DieselError::DatabaseError(_, info) => info.message().to_ascii_lowercase(),
        _ => return false,
    };
    [
        "deadlock",
        "lock wait timeout",
        "canceling statement due to lock timeout",
        "database is locked",
    ]
    .iter()
    .any(|said| message.contains(said))
}

/// Another migration (or writer) held the lock `migrate` waits for longer than its
/// `lock_timeout`: nothing was changed, and a later call passes once that one has finished.
#[derive(Debug)]
pub(crate) struct LockWait(pub(crate) String);

impl std::fmt::Display for LockWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LockWait {}

/// What [`Error::Migration`](crate::Error::Migration) says to do, by its source.
pub(crate) fn advice(source: &(dyn std::error::Error + Send + Sync + 'static)) -> String {
    const SAME: &str = "calling migrate again fails the same way until then";
    if source.is::<crate::schema_problem::SchemaProblem>() {
        return "nothing was changed, and calling migrate again fails the same way until its cause (this error's source) is dealt with".to_owned();
    }
    let Some(failed) = source.downcast_ref::<StepFailed>() else {
        return match source.downcast_ref::<diesel::result::Error>() {
            Some(_) if !retryable(source) => "deal with its cause (the database's error), then run migrate again; steps made before it are kept (MySQL) or were rolled back (SQLite, PostgreSQL)".to_owned(),
            _ => "calling migrate again resumes where this stopped".to_owned(),
        };
    };
    match &failed.cause {
        Cause::Transient => "calling migrate again resumes where this stopped".to_owned(),
        Cause::IndexInTheWay { index } => format!(
            "an index named `{index}` is there that is not the step's (on PostgreSQL, one a failed `CREATE INDEX CONCURRENTLY` left invalid): as the schema's owner, `DROP INDEX {index}`, then run migrate, which builds it (or build it again first, docs/operating.md); {SAME}"
        ),
        Cause::RowFormat { table } => format!(
            "`{table}`'s row format (`COMPACT` or `REDUNDANT`) cannot hold the step's index: run `ALTER TABLE {table} ROW_FORMAT=DYNAMIC` as the schema's owner, then migrate; {SAME}"
        ),
        Cause::Privilege { grant } => {
            format!("this connection may not make it: {grant}; then run migrate again; {SAME}")
        }
        Cause::Other => format!(
            "deal with its cause (the database's error), then run migrate again; steps made before it are kept (MySQL) or were rolled back (SQLite, PostgreSQL); {SAME}"
        ),
    }
}
