//! The runtime's one error type.

use std::fmt;

/// What went wrong while claiming, running or recording a job.
///
/// A handler's error type absorbs this with `From<idempotent_jobs::Error>`; with `thiserror` that is one
/// line: `#[error(transparent)] Idempotent(#[from] idempotent_jobs::Error)`.
///
/// Every variant leaves the database as it was before the call: the job's transaction was rolled back,
/// its claim with it, so retrying the job is safe.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database refused a statement of the claim, the record or the commit.
    #[error(
        "job `{job}` (key `{key}`): the database failed while {step}: {source}{hint}; nothing of the job was committed",
        hint = hint(source)
    )]
    Database {
        /// The job's name.
        job: &'static str,
        /// The job's key (redacted when the job asks for it).
        key: String,
        /// What the runtime was doing.
        step: Step,
        /// Diesel's error.
        #[source]
        source: diesel::result::Error,
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

    /// Claiming kept failing with errors that are normally retried (SQLite busy, MySQL deadlock).
    #[error(
        "job `{job}` (key `{key}`): gave up claiming after {attempts} attempts; the database stayed busy or kept reporting deadlocks: {source}"
    )]
    ClaimRetriesExhausted {
        /// The job's name.
        job: &'static str,
        /// The job's key.
        key: String,
        /// How many times the claim was tried.
        attempts: u32,
        /// The last error.
        #[source]
        source: diesel::result::Error,
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

    /// Running the migrations of the done-jobs schema failed.
    #[error("creating the done_jobs schema failed: {0}")]
    Migration(#[source] Box<dyn std::error::Error + Send + Sync>),
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
