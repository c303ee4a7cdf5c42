//! The runtime's one error type.

use std::fmt;

/// What went wrong while claiming, running or recording a job.
///
/// A handler's error type absorbs this with `From<idempotent_jobs::Error>`; with `thiserror` that is one
/// line: `#[error(transparent)] Idempotent(#[from] idempotent_jobs::Error)`.
///
/// Each message says what happened, what was and was not committed, and whether retrying helps;
/// [`Error::is_retryable`] answers the last for code (a queue worker requeues a retryable error
/// and dead-letters the rest). Unless a variant says otherwise, nothing of the job was committed:
/// its transaction was rolled back, its claim with it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database refused a statement of the claim, the record or the commit; the transaction was
    /// rolled back.
    #[error(
        "job `{job}` (key `{key}`): the database failed while {step}: {source}{hint}; nothing of the job was committed{retry}",
        hint = hint(source),
        retry = if *retryable { "; retrying is safe and can succeed" } else { "" }
    )]
    Database {
        /// The job's name.
        job: &'static str,
        /// The job's key (redacted when the job asks for it).
        key: String,
        /// What the runtime was doing.
        step: Step,
        /// Whether the failure passes (a deadlock, a serialization failure, a busy database, a
        /// lost connection), so that running the job again can succeed.
        retryable: bool,
        /// Diesel's error.
        #[source]
        source: diesel::result::Error,
    },

    /// The connection failed while the transaction was committing: the database may have committed
    /// the job or not, and there is no way to tell from here.
    #[error(
        "job `{job}` (key `{key}`): the connection failed while committing ({source}); the job's work and claim may or may not have been committed. Retrying is safe: the retry replays the run if it committed, and runs the job if it did not"
    )]
    CommitOutcomeUnknown {
        /// The job's name.
        job: &'static str,
        /// The job's key.
        key: String,
        /// Diesel's error.
        #[source]
        source: diesel::result::Error,
    },

    /// A statement in the body ended the job's transaction early (on MySQL and MariaDB, DDL such as
    /// `TRUNCATE` or `CREATE TABLE`, `LOCK TABLES`, `START TRANSACTION`, ... commit implicitly).
    #[error(
        "job `{job}` (key `{key}`): a statement in its body committed the job's transaction early (on MySQL/MariaDB: DDL such as TRUNCATE, CREATE or ALTER, LOCK TABLES, START TRANSACTION or SET autocommit = 1 commit implicitly). The work before that statement is committed; what came after ran outside any transaction; the claim was taken back, so a retry runs the job again. Keep such statements out of job bodies"
    )]
    TransactionEndedInBody {
        /// The job's name.
        job: &'static str,
        /// The job's key.
        key: String,
    },

    /// Another run of the key is in progress and the job's in-progress policy does not wait for
    /// it (or waited as long as it allows). Nothing ran and nothing was recorded; a retry later
    /// replays the other run's result or, if it rolled back, runs.
    #[error(
        "job `{job}` (key `{key}`): another run of this key is in progress{waited}; by the job's in-progress policy this call did not wait for it. Nothing ran and nothing was recorded; retry later: it replays the other run's result once that commits, or runs if it rolls back",
        waited = if waited.is_zero() { String::new() } else { format!(" (waited {waited:?})") }
    )]
    InProgress {
        /// The job's name.
        job: &'static str,
        /// The job's key.
        key: String,
        /// How long the claim waited.
        waited: std::time::Duration,
    },

    /// The database rolled the job's transaction back while the body ran, and the body returned
    /// `Ok` regardless: an error the body caught (a deadlock, a lock wait timeout), or on Galera a
    /// conflicting write certified on another node. Nothing of the job's transaction was committed;
    /// retrying is safe. The key's row, if another run has committed one since, is left alone.
    #[error(
        "job `{job}` (key `{key}`): the database rolled the job's transaction back while its body ran, and the body returned Ok regardless (it caught a deadlock or lock wait timeout, or on Galera a conflicting write won on another node). Nothing of the job's transaction was committed, its claim included (statements the body ran after the rollback ran outside any transaction); retrying is safe"
    )]
    TransactionRolledBackInBody {
        /// The job's name.
        job: &'static str,
        /// The job's key.
        key: String,
    },

    /// The handler's result is too large for the database to take in one statement; nothing was
    /// committed, and the same result will not fit next time either.
    #[error(
        "job `{job}` (key `{key}`): its result is {bytes} bytes of JSON, more than the {limit} bytes this server takes: its max_allowed_packet of {packet} bytes, less 64 KiB kept for the statement that records the result; the job was rolled back. Return less (an id to look the rest up by), or raise max_allowed_packet"
    )]
    ResultTooLarge {
        /// The job's name.
        job: &'static str,
        /// The job's key.
        key: String,
        /// The result's size as JSON.
        bytes: usize,
        /// The largest result the database takes, in bytes of JSON.
        limit: u64,
        /// The server's limit that comes from (MySQL's `max_allowed_packet`): 64 KiB more, kept
        /// for the statement around the result.
        packet: u64,
    },

    /// The handler's `Ok` value could not be stored as JSON that reads back as its type.
    #[error(
        "job `{job}` (key `{key}`): its result could not be stored as JSON that reads back as the same type ({source}); the job was rolled back. Make the value round-trip through serde_json (maps need string keys; a NaN float becomes null)"
    )]
    StoreResult {
        /// The job's name.
        job: &'static str,
        /// The job's key.
        key: String,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },

    /// The result stored by the first run no longer decodes into the handler's result type,
    /// usually because that type changed since.
    #[error(
        "job `{job}` (key `{key}`) already ran, but its stored result no longer decodes into the handler's result type ({source}). The job was not run again. If the type changed on purpose, keep it able to read the old JSON (`#[serde(default)]`, an enum with the old shape) or delete the row from done_jobs"
    )]
    ReplayDecode {
        /// The job's name.
        job: &'static str,
        /// The job's key.
        key: String,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },

    /// The key is already claimed, by a different job. Two jobs whose keys meet would silently skip
    /// each other's work, so this is an error, not a replay.
    #[error(
        "job `{job}` tried to claim key `{key}`, which job `{claimed_by}` already claimed. Give each job its own key prefix (for example `{job}:...`)"
    )]
    KeyClaimedByOtherJob {
        /// The job that tried to claim.
        job: &'static str,
        /// The key.
        key: String,
        /// The job recorded with the key.
        claimed_by: String,
    },

    /// Two different job definitions in this process use one job name, so each would replay the
    /// other's keys as done. Nothing ran.
    #[error(
        "two different jobs use the name `{name}`: {first} and {second}. Each would skip the other's work as already done, so neither runs until they have names of their own (`#[idempotent_job(name = \"...\")]`). If they are one job on purpose (a sync handler and its async twin), name both explicitly with the same `name` and the same key template"
    )]
    DuplicateJobName {
        /// The shared name.
        name: &'static str,
        /// One definition, with its source location when the attribute registered it.
        first: String,
        /// The other.
        second: String,
    },

    /// The key came back with inputs different from the first run's: nothing ran, nothing changed.
    #[error(
        "job `{job}` was called again with key `{key}` but with different inputs ({inputs}) than its first run; nothing ran and nothing changed. A key reused with different input is usually a bug: make the key include what identifies the work, or let the first run's inputs stand"
    )]
    FingerprintMismatch {
        /// The job's name.
        job: &'static str,
        /// The job's key.
        key: String,
        /// The names of the inputs the fingerprint covers.
        inputs: String,
    },

    /// A fingerprint input could not be serialized; nothing ran.
    #[error("job `{job}` (key `{key}`): {source}; nothing ran")]
    Fingerprint {
        /// The job's name.
        job: &'static str,
        /// The job's key.
        key: String,
        /// Which input, and why.
        #[source]
        source: crate::fingerprint::FingerprintError,
    },

    /// Claiming kept failing, for the whole retry window, with errors that are normally retried.
    #[error(
        "job `{job}` (key `{key}`): gave up claiming after {attempts} attempts in {waited:.1?} ({causes}); the last error: {source}. Nothing ran and nothing was committed; retrying later is safe"
    )]
    ClaimRetriesExhausted {
        /// The job's name.
        job: &'static str,
        /// The job's key.
        key: String,
        /// How many times the claim was tried.
        attempts: u32,
        /// How long it was tried for.
        waited: std::time::Duration,
        /// What the failures were: another worker holding the key or the database's write lock
        /// for longer than the window, deadlocks, serialization failures, with their counts.
        causes: String,
        /// The last error.
        #[source]
        source: diesel::result::Error,
    },

    /// A job was called with its own key from inside its own running body, on another connection
    /// than the one its transaction is open on.
    #[error(
        "job `{job}` was called with its own key `{key}` from inside its running body, but on another connection: there it would wait for its own uncommitted claim, or run without one. Call it with the body's own connection, where it runs as part of the enclosing run"
    )]
    OwnKeyOnAnotherConnection {
        /// The job's name.
        job: &'static str,
        /// The key.
        key: String,
    },

    /// A duration was longer than the runtime accepts (100 years).
    #[error(
        "{what} of {duration:?} is longer than the {max:?} the runtime accepts; nothing was done"
    )]
    InvalidDuration {
        /// Which setting.
        what: &'static str,
        /// The duration given.
        duration: std::time::Duration,
        /// The longest accepted.
        max: std::time::Duration,
    },

    /// A batch of [`prune`](crate::prune::prune()) failed; the batches before it stay deleted.
    #[error(
        "pruning lapsed claims failed: {0}; the batches before it stay deleted, and the next prune continues where this one stopped"
    )]
    Prune(#[source] diesel::result::Error),

    /// [`outbox::push`](crate::outbox::push) was called outside a job's body.
    #[error(
        "outbox::push(\"{topic}\") was called outside a job: a message is recorded in its job's transaction and takes its id from the job's key, so push it from inside an annotated handler's body (or a body given to idempotent_jobs::run)"
    )]
    OutboxOutsideJob {
        /// The message's topic.
        topic: String,
    },

    /// [`outbox::push`](crate::outbox::push) was called inside a job's body, but on another
    /// connection than the job's own.
    #[error(
        "outbox::push(\"{topic}\") was called inside job `{job}` on another connection than the job's: there the message would commit on its own, whatever becomes of the job. Push it with the connection the body was given"
    )]
    OutboxOnAnotherConnection {
        /// The message's topic.
        topic: String,
        /// The running job.
        job: &'static str,
    },

    /// A look-up, list or forget of [`keys`](crate::keys) failed; a forget is one statement, so
    /// either the key's row is gone or it is untouched.
    #[error(
        "{action} failed: {source}; nothing was changed{hint}",
        hint = hint(source)
    )]
    Keys {
        /// What was being done.
        action: &'static str,
        /// The database's error.
        #[source]
        source: diesel::result::Error,
        /// Whether the failure passes (busy, a lock wait, a deadlock, a lost connection).
        retryable: bool,
    },

    /// An operation that runs in a transaction of its own ([`keys`](crate::keys), pruning, the
    /// outbox's inspection, [`verify`](crate::verify)) was called inside a transaction the caller
    /// holds: one Diesel opened, or one the session holds that Diesel does not know of (MySQL with
    /// `autocommit = 0` and statements pending; a `BEGIN` sent as text that has written).
    #[error(
        "could not {what}: the connection is inside a transaction of its own (opened through Diesel, or held by the session: autocommit = 0 with statements pending, or a BEGIN sent as text), whose uncommitted rows this would see and change, and with which it would commit or roll back. Use a connection outside any transaction; nothing was changed"
    )]
    InsideTransaction {
        /// What was asked.
        what: &'static str,
    },

    /// A relay was run inside a transaction the caller holds open.
    #[error(
        "the outbox relay was run inside an open transaction: its lease would hold row locks until that transaction ends, and a rollback would undo its marks. Run the relay on a connection outside any transaction; nothing was leased"
    )]
    RelayInsideTransaction,

    /// An outbox payload could not be turned into JSON.
    #[error("the payload of outbox message \"{topic}\" could not be stored as JSON: {source}")]
    OutboxPayload {
        /// The message's topic.
        topic: String,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },

    /// A statement of the outbox or its relay failed.
    #[error("the outbox failed in the database: {0}")]
    Outbox(#[source] diesel::result::Error),

    /// A table of the runtime's is missing where the connection finds its tables: `migrate` has
    /// not run on this database (or, on PostgreSQL, not into a schema on this connection's
    /// `search_path`). Nothing was changed; a retry meets the same until the tables are there.
    #[error(
        "the runtime's table `{table}` does not exist on this connection (PostgreSQL: in no schema of its search_path): run `idempotent_jobs::migrate(&mut conn)` once before the first job (or `idempotent-jobs migrate` with the CLI); nothing was changed"
    )]
    NotMigrated {
        /// The missing table.
        table: &'static str,
    },

    /// [`verify`](crate::verify) found the runtime's tables missing, out of date, or not usable by
    /// this connection's role. Nothing was changed.
    #[error(
        "the runtime's tables are not ready for this worker: {}. Nothing was changed",
        problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    SchemaNotReady {
        /// Each problem; its `Display` says what to do about it.
        problems: Vec<crate::schema_problem::SchemaProblem>,
    },

    /// [`verify`](crate::verify) could not read what it checks (the catalog, the schema version).
    /// It changes nothing.
    #[error("verifying the runtime's tables failed: {0}; nothing was changed")]
    Verify(#[source] diesel::result::Error),

    /// Creating or upgrading one of the runtime's tables failed. Steps already done stay done (on
    /// MySQL) or were rolled back with the rest (SQLite, PostgreSQL); calling `migrate` again
    /// resumes.
    #[error(
        "creating or upgrading the runtime's table `{table}` failed: {source}. Calling migrate again resumes where this stopped"
    )]
    Migration {
        /// The table the failed step was about.
        table: &'static str,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The step of a job at which the database failed, for [`Error::Database`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Step {
    /// Opening the job's transaction.
    Begin,
    /// Inserting or reading the claim.
    Claim,
    /// Storing the handler's result.
    Record,
    /// Committing the transaction.
    Commit,
    /// Rolling the transaction back.
    Rollback,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Begin => "opening the transaction",
            Step::Claim => "claiming the key",
            Step::Record => "storing the result",
            Step::Commit => "committing",
            Step::Rollback => "rolling back",
        })
    }
}

impl Error {
    /// Whether running the job again can succeed: the failure passes (a busy database, a deadlock,
    /// a serialization failure, a lost connection, an outcome that is unknown). `false` for what a
    /// retry would meet again: a fingerprint mismatch, a key claimed by another job, a stored
    /// result that no longer decodes, a result that cannot be stored, a misused API.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Database { retryable, .. } => *retryable,
            Error::CommitOutcomeUnknown { .. }
            | Error::ClaimRetriesExhausted { .. }
            | Error::TransactionRolledBackInBody { .. }
            | Error::InProgress { .. } => true,
            Error::Keys { retryable, .. } => *retryable,
            Error::Prune(source) | Error::Outbox(source) => {
                matches!(
                    source,
                    diesel::result::Error::DatabaseError(
                        diesel::result::DatabaseErrorKind::SerializationFailure
                            | diesel::result::DatabaseErrorKind::ClosedConnection,
                        _
                    )
                )
            }
            _ => false,
        }
    }
}

/// What to do about a database error, where there is something to say.
fn hint(error: &diesel::result::Error) -> &'static str {
    match error {
        diesel::result::Error::BrokenTransactionManager => {
            " (this connection's transaction state is broken: a job's future was dropped inside its transaction, or a rollback failed; close the connection and use a new one, as a pool does by itself)"
        }
        diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::ClosedConnection,
            _,
        ) => " (the connection is closed: reconnect, and the job can be retried)",
        _ => "",
    }
}

/// Shorthand for results whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
