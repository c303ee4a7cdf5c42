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
    /// rolled back (for a job called inside a caller's transaction, `enclosing`: the job's
    /// savepoint).
    ///
    /// What to do: requeue the job when [`is_retryable`](Error::is_retryable) (a deadlock, a
    /// busy database, a lost connection), else look at the source (the database's own error).
    /// Where `enclosing`, the retry is the enclosing transaction's, from its start: a retry of the
    /// call alone, inside it, can meet the same failure (on SQLite it always does where the
    /// transaction's snapshot is older than another connection's commit).
    #[error(
        "job `{job}` (key `{key}`): the database failed while {doing}{hint}; nothing of the job was committed{retry}",
        doing = doing(*step, *enclosing),
        hint = hint(source),
        retry = match (*retryable, *enclosing) {
            (true, false) => "; retrying is safe and can succeed",
            (true, true) => "; the job was called inside an enclosing transaction: return this error from it and retry that transaction from its start, which is safe and can succeed (a retry of the call alone, inside it, can meet the same failure)",
            (false, _) => "",
        }
    )]
    Database {
        /// The job's name.
        job: &'static str,
        /// The job's key (redacted when the job asks for it).
        key: String,
        /// What the runtime was doing.
        step: Step,
        /// The job was called inside a transaction of the caller's (it ran in a savepoint of
        /// it): a retry is that transaction's, from its start.
        enclosing: bool,
        /// Whether the failure passes (a deadlock, a serialization failure, a busy database, a
        /// lost connection), so that running the job again can succeed.
        retryable: bool,
        /// Diesel's error.
        #[source]
        source: diesel::result::Error,
    },

    /// The connection failed while the transaction was committing: the database may have committed
    /// the job or not, and there is no way to tell from here. Not for a job called inside a
    /// transaction of the caller's, whose end is the release of its savepoint: that commits
    /// nothing, and a connection lost there is [`Database`](Error::Database) with `enclosing`.
    ///
    /// What to do: retry. The retry replays the run if it committed, and runs the job if not.
    #[error(
        "job `{job}` (key `{key}`): the connection failed while committing: the job may or may not have been committed; retrying is safe"
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
    ///
    /// Inside a caller's transaction, the statement ended that transaction (its work before the
    /// call is committed with the job's). What the body did before the statement is committed,
    /// and the claim was taken back. What came after ran outside any transaction (each statement
    /// committed on its own) or in one that began after it (a `BEGIN` of the body's, a chained
    /// transaction, or the one MySQL's `autocommit = 0` opens at the next statement), which the
    /// runtime rolled back.
    ///
    /// What to do: take such statements out of the job's body (a nested `conn.transaction(..)`
    /// is a savepoint, and fine).
    #[error(
        "job `{job}` (key `{key}`): a statement of its body ended the job's transaction (COMMIT, ROLLBACK, BEGIN; on MySQL also DDL and its other implicit commits); the work before it was committed and the claim was taken back: a retry would run the job again over that work, so take the statement out of the body before retrying"
    )]
    TransactionEndedInBody {
        /// The job's name.
        job: &'static str,
        /// The job's key.
        key: String,
    },

    /// The job did not finish (its body returned `Err`, or a step after the body failed), and its
    /// transaction could not be rolled back whole: SQLite with `journal_mode = OFF` (whose
    /// `ROLLBACK` "behaves in an undefined way"), or a MySQL table the body wrote that is not
    /// transactional (MyISAM, Aria, MEMORY; the server's warning 1196). What the body wrote there
    /// may be in the database; the claim was taken back (or rolled back), so the next delivery
    /// runs the job again. A body that panicked is taken back the same way, and the panic goes on.
    /// On MySQL it is asked only after the runtime's own `ROLLBACK` of a job's own transaction:
    /// not for a job nested in the caller's transaction, nor for a transaction the server rolled
    /// back itself (a deadlock); there the error is the one that ended the transaction.
    ///
    /// What to do: keep a job's writes in transactional tables (InnoDB), and SQLite in a journal
    /// mode that can roll back (`DELETE`, the default, `TRUNCATE`, `PERSIST`, `MEMORY` or `WAL`);
    /// look at what the body wrote. Retrying runs the job again over whatever it left.
    #[error(
        "job `{job}` (key `{key}`): the job failed and its transaction could not be rolled back whole: {why}; what the body wrote there may be in the database; the claim was taken back: a retry would run the job again over what it left, so look at that before retrying"
    )]
    CannotRollBack {
        /// The job's name.
        job: &'static str,
        /// The job's key.
        key: String,
        /// What the database could not undo.
        why: &'static str,
    },

    /// The job did not finish, its claim may have been committed (a statement of its body ended
    /// the job's transaction, or the transaction could not be rolled back whole), and taking the
    /// claim back failed too (the source: a lost connection, a lock held past the wait, a trigger
    /// or privilege refusing the `DELETE`). The claim may be in the database, and what the body
    /// wrote too. Where `replays` (a job returning `()` records nothing more than its claim; a
    /// result recorded after a statement that ended the transaction may have been committed
    /// outside it) every delivery of the key replays a run that did not finish, until the key is
    /// forgotten; elsewhere the claim reads as unfinished, and the next delivery runs the job
    /// again, with it what the body had committed (so the message does not call that safe).
    /// A body that panicked is ended the same way, and the panic goes on (the failure is logged).
    /// Not reported where the connection failed under the job before the database could answer
    /// whether the transaction was still the job's: an open transaction ends with its connection,
    /// uncommitted, and the call is the error that ended it (retryable); unless a statement of
    /// the body had committed it before the connection failed, which the runtime cannot tell
    /// (then a unit job's claim stays, and replays). Inside a transaction of
    /// the caller's that is still open, the claim is in it: rolling it back undoes the claim.
    ///
    /// What to do: look at what the body wrote; where `replays`, look the key up
    /// ([`keys::lookup`](crate::keys::lookup), or `idempotent-jobs keys show`) and, if the job
    /// should run again, forget it ([`keys::forget`](crate::keys::forget),
    /// `idempotent-jobs keys forget`) before retrying; elsewhere retrying runs the job again.
    #[error(
        "job `{job}` (key `{key}`): the job did not finish ({ended}), and taking its claim back failed{hint}: the claim may be committed, {then}",
        hint = hint(source),
        then = if *replays {
            "and while it is, every delivery of the key replays a run that did not finish: look the key up and forget it (keys::forget, or `idempotent-jobs keys forget`) before retrying"
        } else {
            "but it reads as unfinished: the next delivery runs the job again, and what the body committed runs again with it"
        }
    )]
    ClaimNotTakenBack {
        /// The job's name.
        job: &'static str,
        /// The job's key.
        key: String,
        /// How the job's transaction ended, and what of it may be committed.
        ended: String,
        /// Whether the claim, if committed, reads as a finished run, replayed by every delivery
        /// until the key is forgotten (else it reads as unfinished, and a retry runs the job).
        replays: bool,
        /// The database's error from the take-back.
        #[source]
        source: diesel::result::Error,
    },

    /// Another run of the key is in progress and the job's in-progress policy does not wait for
    /// it (or waited as long as it allows); on SQLite, whose one writer locks the whole database,
    /// any job that holds the write lock counts. Nothing ran and nothing was recorded; a retry
    /// later replays the other run's result or, if it rolled back, runs.
    ///
    /// What to do: retry later (requeue with a delay). The retry replays the other run's result
    /// once it commits, or runs if it rolls back.
    #[error(
        "job `{job}` (key `{key}`): another transaction holds the key (another run of it; on SQLite, any job writing){waited}; nothing ran; retrying later is safe",
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

    /// The job's transaction was rolled back or aborted while the body ran: an error the body
    /// caught and went past (on PostgreSQL any failed statement aborts the whole transaction), a
    /// rollback the database made under it (a deadlock the body caught; on Galera a conflicting
    /// write certified on another node), or a statement of the body that rolled back itself
    /// (`ROLLBACK`). Neither the claim nor the body's work before that was committed, and the
    /// key's row, if another run has committed one since, is left alone.
    ///
    /// Where the transaction ended before the body was done (`outside`), the statements the body
    /// ran after that ran outside any transaction, each committed on its own: the error says
    /// they may be committed, and replaces an `Err` the body returned. Otherwise (an aborted
    /// transaction, which refuses every later statement) nothing of the job was committed.
    ///
    /// What to do: propagate statement errors with `?`, or run a statement whose failure the
    /// body handles in a nested `conn.transaction(..)` (a savepoint); do not end the job's
    /// transaction in its body. A retry runs the job again (and, when `outside`, the statements
    /// the body ran after the rollback with it).
    #[error("job `{job}` (key `{key}`): {}", rolled_back_in_body(*.outside))]
    TransactionRolledBackInBody {
        /// The job's name.
        job: &'static str,
        /// The job's key.
        key: String,
        /// The transaction had ended while the body went on: what the body ran after that ran
        /// outside any transaction and may be committed.
        outside: bool,
    },

    /// A job called inside a caller's transaction (a savepoint of it) ended where the database had
    /// rolled back the caller's whole transaction, not only the job's savepoint: a deadlock or,
    /// on Galera, a certification conflict on MySQL/MariaDB (at the claim, or caught by the
    /// body); a lock wait timeout with `innodb_rollback_on_timeout`; or a statement of the body
    /// that ended the caller's transaction (`ROLLBACK`). Nothing of the job's savepoint was
    /// committed, nor anything the caller's transaction wrote before the call, and the session
    /// is no longer in a transaction: statements the caller runs after this each commit on
    /// their own. Where `outside`, the body went on after the rollback, and what it ran then ran
    /// outside any transaction and may be committed.
    ///
    /// With [`Step::Begin`] (MySQL/MariaDB), the caller's transaction had ended before the call:
    /// the caller caught a deadlock and went on, or ran a statement that ended it. Opening the
    /// job's savepoint found no transaction open, and the job did not run (before, it ran outside
    /// any transaction, its claim and work each committed on their own, and its end took the
    /// claim back: the retry it asked for ran the job twice). What the caller's transaction wrote
    /// before the call was rolled back with it, or committed by the caller's statement, and what
    /// the caller ran after its end ran outside any transaction: the retry can succeed, and runs
    /// those statements again. Only with `autocommit = 1`: under `autocommit = 0` the job's
    /// savepoint opens the transaction the server begins at any statement, and the job runs in it.
    ///
    /// What to do: return the error from the caller's transaction (with `?`) and retry that
    /// transaction from its start when [`is_retryable`](Error::is_retryable); calling the job
    /// again alone would run it, and the rest of the caller's work, outside any transaction.
    #[error(
        "job `{job}` (key `{key}`): {what}{hint}: nothing of the job was committed{before}, and the connection is no longer in a transaction{after}; return this error from the enclosing transaction{retry}",
        what = callers_end(*step),
        before = match step {
            Step::Begin => " (it did not run); what that transaction wrote before the call was rolled back with it or committed by the caller's statement, and what the caller ran after its end ran outside any transaction and may be committed",
            _ => ", nor anything that transaction wrote before the call",
        },
        hint = source.as_ref().map_or("", hint),
        after = if *outside { ", but the statements the body ran after the rollback ran outside any transaction and may be committed" } else { "" },
        retry = match (*retryable, *outside, *step == Step::Begin) {
            (true, _, true) => " and retry that from its start, which can succeed: a retry runs the job once, and those statements of the caller's again",
            (true, false, false) => " and retry that from its start: retrying is safe and can succeed",
            (true, true, false) => " and retry that from its start, which can succeed: a retry runs the job again, those statements with it",
            (false, ..) => "",
        }
    )]
    CallersTransactionRolledBack {
        /// The job's name.
        job: &'static str,
        /// The job's key (redacted when the job asks for it).
        key: String,
        /// What the runtime was doing when it found out: [`Step::Claim`] for a claim that met
        /// the failure itself, [`Step::Body`] for a body that went on after it, [`Step::Begin`]
        /// where the caller's transaction had ended before the call.
        step: Step,
        /// The body ran statements after the rollback: they may be committed.
        outside: bool,
        /// Whether running the caller's transaction again can succeed.
        retryable: bool,
        /// Diesel's error, where a statement of the runtime's met the failure (the claim, or the
        /// job's savepoint).
        #[source]
        source: Option<diesel::result::Error>,
    },

    /// PostgreSQL, where the runtime could not roll the caller's transaction back to the mark it
    /// sets before the job's savepoint (the connection failed while it tried): a job called
    /// inside a caller's transaction whose savepoint there was gone at its end (a statement of the
    /// body released a savepoint of the caller's set before it): releasing it failed, and a
    /// failed statement aborts the whole transaction. Nothing of the job was committed, and nothing the enclosing transaction wrote
    /// will be: the database refuses its later statements, and its `COMMIT` rolls it back.
    ///
    /// What to do: return the error from the enclosing transaction (with `?`), which rolls it
    /// back, and take the statement that ends the job's savepoint out of the body. Retrying does
    /// not help while the body runs it.
    #[error(
        "job `{job}` (key `{key}`): the job's savepoint in the enclosing transaction was gone at the job's end (a statement of its body released it, or a savepoint of the enclosing transaction's set before it), and releasing it aborted that whole transaction: nothing of the job was committed, and nothing that transaction wrote will be (its COMMIT rolls it back); return this error from the enclosing transaction and take that statement out of the body: retrying does not help while it runs"
    )]
    CallersTransactionAborted {
        /// The job's name.
        job: &'static str,
        /// The job's key (redacted when the job asks for it).
        key: String,
    },

    /// The handler's result is too large for the database to take in one statement; nothing was
    /// committed, and the same result will not fit next time either.
    ///
    /// What to do: return less (an id to look the rest up by), or raise `max_allowed_packet`.
    /// Retrying does not help.
    #[error(
        "job `{job}` (key `{key}`): its result is {bytes} bytes of JSON, over the {limit} this server takes (max_allowed_packet {packet} less 64 KiB for the statement); nothing was committed"
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

    /// The job's key is too large for the database to take in one statement (MySQL's
    /// `max_allowed_packet`); refused before anything was sent, so nothing ran or was committed
    /// and the connection stays usable.
    ///
    /// What to do: build the key from ids, not from whole documents (the database keeps a digest
    /// of it; the key itself is for people to read), or raise `max_allowed_packet`. Retrying does
    /// not help.
    #[error(
        "job `{job}`: its key is {bytes} bytes, over the {limit} this server takes (max_allowed_packet {packet} less 64 KiB for the statement); nothing ran and nothing was committed"
    )]
    KeyTooLarge {
        /// The job's name.
        job: &'static str,
        /// The key's size in bytes (the key itself is left out of the error: it is that large).
        bytes: usize,
        /// The largest key the database takes, in bytes.
        limit: u64,
        /// The server's limit that comes from (MySQL's `max_allowed_packet`): 64 KiB more, kept
        /// for the statement around the key.
        packet: u64,
    },

    /// The handler's `Ok` value could not be stored as JSON that reads back as its type, or it
    /// would read back as another value: it holds a NaN or infinite float anywhere, or a `Some`
    /// of a value JSON writes as `null` (`Some(())`, `Some(None)`: JSON stores these as `null`,
    /// which an `Option` reads back as `None`), or an untagged enum's variant that reads back as
    /// another. Under `#[idempotent_job]`, a result type with `PartialEq` is also compared with
    /// `==`: a field serde skips, or an untagged variant of the same content as another's, fails
    /// here too.
    ///
    /// What to do: make the value round-trip through serde_json (maps need string keys; no NaN
    /// or infinite float; an enum instead of `Option<Option<T>>`). Retrying does not help.
    #[error(
        "job `{job}` (key `{key}`): its result does not read back from JSON as the same value; nothing was committed"
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
    ///
    /// What to do: if the type changed on purpose, keep it able to read the old JSON
    /// (`#[serde(default)]`, an enum with the old shape), or forget the key. Retrying does not
    /// help.
    #[error(
        "job `{job}` (key `{key}`) already ran, but its stored result no longer decodes into the handler's result type; the job did not run again"
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
    ///
    /// What to do: give each job its own key prefix (for example `{job}:...`). Retrying does not
    /// help.
    #[error("job `{job}`: key `{key}` is claimed by job `{claimed_by}`; nothing ran")]
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
    ///
    /// What to do: give them names of their own (`#[idempotent_job(name = "...")]`). If they are
    /// one job on purpose (a sync handler and its async twin), name both explicitly with the same
    /// `name` and the same key template.
    #[error("two different jobs use the name `{name}`: {first} and {second}; neither runs")]
    DuplicateJobName {
        /// The shared name.
        name: &'static str,
        /// One definition, with its source location when the attribute registered it.
        first: String,
        /// The other.
        second: String,
    },

    /// The key came back with inputs different from the first run's: nothing ran, nothing changed.
    /// (A first run whose fingerprint covered other inputs, by name, is not compared: a deploy
    /// that adds an input to the job's `fingerprint(...)`, or renames one, leaves the keys stored
    /// before it replaying.)
    ///
    /// What to do: a key reused with different input is usually a bug: make the key include what
    /// identifies the work, or let the first run's inputs stand. Retrying does not help. Where the
    /// inputs are the first run's but one's type now serializes otherwise (a field added to it),
    /// every key stored before differs: keep the serialized form (`#[serde(skip_serializing_if =
    /// "Option::is_none")]` on a new optional field), or forget the key (its job runs again).
    #[error(
        "job `{job}` (key `{key}`): called again with other values of its inputs ({inputs}) than its first run, or with values that serialize otherwise since (a field added to an input's type); nothing ran and nothing changed"
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
    #[error("job `{job}` (key `{key}`): a fingerprint input could not be serialized; nothing ran")]
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
        "job `{job}` (key `{key}`): gave up claiming after {attempts} attempts in {waited:.1?} ({causes}); nothing ran; retrying later is safe"
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
    ///
    /// What to do: call it with the body's own connection, where it runs as part of the
    /// enclosing run (on another it would wait for its own uncommitted claim, or run without one).
    #[error(
        "job `{job}` (key `{key}`): called with its own key from inside its running body, on another connection; nothing ran"
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

    /// A batch of [`prune`](crate::prune::prune()) or
    /// [`outbox::prune_delivered`](crate::outbox::prune_delivered) failed; the batches before it
    /// stay deleted (`removed` rows in `batches` batches), and the next prune continues where this
    /// one stopped. When the connection failed while the batch was committing
    /// (`outcome_unknown`), that batch may have been deleted too.
    #[error(
        "pruning {what} failed{hint}; {removed} deleted in {batches} batch(es) before it stay deleted{unknown}, and the next prune continues where this one stopped{retry}",
        hint = hint(source),
        unknown = if *outcome_unknown {
            "; the connection failed while the failing batch was committing, so it may or may not have been deleted too"
        } else {
            ""
        },
        retry = if *retryable { "; retrying is safe and can succeed" } else { "" }
    )]
    Prune {
        /// What was being pruned: "lapsed claims", "delivered outbox messages".
        what: &'static str,
        /// Rows deleted, and committed, by the batches before the failing one.
        removed: u64,
        /// How many batches those were.
        batches: u32,
        /// Whether the connection failed while the failing batch was committing: the database
        /// may have deleted its rows too.
        outcome_unknown: bool,
        /// The database's error.
        #[source]
        source: diesel::result::Error,
        /// Whether the failure passes (busy, a lock wait, a deadlock, a lost connection), as for
        /// every other error of the database's.
        retryable: bool,
    },

    /// [`outbox::push`](crate::outbox::push) was called outside a job's body.
    ///
    /// What to do: push from inside an annotated handler's body (or a body given to
    /// [`run`](crate::run)): a message is recorded in its job's transaction and takes its id from
    /// the job's key.
    #[error("outbox::push(\"{topic}\") was called outside a job; nothing was recorded")]
    OutboxOutsideJob {
        /// The message's topic.
        topic: String,
    },

    /// [`outbox::push`](crate::outbox::push) was called inside a job's body, but on another
    /// connection than the job's own.
    ///
    /// What to do: push with the connection the body was given (on another, the message would
    /// commit on its own, whatever becomes of the job).
    #[error(
        "outbox::push(\"{topic}\") was called inside job `{job}` on another connection than the job's; nothing was recorded"
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
        "{action} failed{hint}; nothing was changed{retry}",
        hint = hint(source),
        retry = if *retryable { "; retrying is safe and can succeed" } else { "" }
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

    /// The connection failed while an operation that runs in a transaction of its own (a
    /// [`keys`](crate::keys) forget, an outbox operation, ...) was committing: the database may
    /// have committed it or not.
    ///
    /// What to do: look again (`keys::lookup`, the outbox's counts) before acting on it; running
    /// the operation again is safe (a forget of a key already forgotten finds nothing).
    #[error(
        "{action}: the connection failed while committing{hint}; it may or may not have been committed: look again before acting on it; retrying is safe"
    , hint = hint(source))]
    OutcomeUnknown {
        /// What was being done.
        action: &'static str,
        /// The database's error.
        #[source]
        source: diesel::result::Error,
    },

    /// An operation that runs in a transaction of its own ([`keys`](crate::keys), pruning, the
    /// outbox's inspection, [`verify`](crate::verify)) was called inside a transaction the caller
    /// holds: one Diesel opened, or one the session holds that Diesel does not know of (MySQL with
    /// `autocommit = 0` and statements pending; a `BEGIN` sent as text that has written). A job
    /// (which runs in a savepoint of a transaction Diesel opened) is refused with it on a session
    /// holding a transaction Diesel does not know of: a `BEGIN` sent as text on SQLite and
    /// MySQL, on PostgreSQL once that transaction has written, and on MySQL with `autocommit = 0`
    /// once any statement touched a table; the caller's transaction is left as it was.
    ///
    /// What to do: use a connection outside any transaction (and, on MySQL, with `autocommit`
    /// on or nothing pending): inside one, this would see and change that transaction's
    /// uncommitted rows, and commit or roll back with them.
    #[error(
        "could not {what}: the connection is inside a transaction (Diesel's, or the session's own); nothing was changed"
    )]
    InsideTransaction {
        /// What was asked.
        what: &'static str,
    },

    /// A relay was run inside a transaction the caller holds open.
    ///
    /// What to do: run the relay on a connection outside any transaction (inside one its lease
    /// would hold row locks until that transaction ends, and a rollback would undo its marks).
    #[error("the outbox relay was run inside an open transaction; nothing was leased")]
    RelayInsideTransaction,

    /// A relay run ([`run_once`](crate::outbox::Relay::run_once),
    /// [`drain`](crate::outbox::Relay::drain)) stopped part-way, after it had handed messages to
    /// the delivery function: a statement failed (`source`). `report` counts what the run did and
    /// recorded before it stopped; all of that stays recorded. When the failure was the record of
    /// a delivery's outcome, `message_id` names that message and `delivered` says whether the
    /// delivery function returned `Ok` (it reached its receiver, and the database does not say
    /// so, unless `source` is [`OutcomeUnknown`](Error::OutcomeUnknown): the record's commit may
    /// have happened). Such a message stays leased until its lease lapses; it is then sent again
    /// (a copy its receiver drops by its id), or, when this was its last allowed attempt
    /// (`last_attempt`), parked as one that may have been delivered.
    ///
    /// When the connection failed at the `COMMIT` of a record that changed nothing (the message's
    /// lease had been taken over: counted in `lease_lost`), the run stops there with `message_id`
    /// `None` rather than hand the next message to the delivery on a dead connection.
    ///
    /// The messages the round had not handed over yet are given back untried; a WARN says when
    /// that failed too (the same [`Relay`](crate::outbox::Relay)'s next round tries again; until
    /// then they stay leased, their attempt counted). A run that fails before it hands any
    /// message over returns the failure itself.
    ///
    /// What to do: run the relay again (when [`is_retryable`](Error::is_retryable) says so).
    #[error(
        "the outbox relay stopped part-way{what}; before it stopped, this run recorded {} delivered, {} failed (to be tried again), {} parked and {} that lost their lease, of {} leased{retry}",
        report.delivered,
        report.failed,
        report.parked,
        report.lease_lost,
        report.leased,
        what = stopped_at(message_id.as_deref(), *delivered, *last_attempt, source),
        retry = match (source.is_retryable(), source.is_connection_lost()) {
            (true, false) => "; running the relay again is safe and can succeed",
            (true, true) => "; the connection is closed: running the relay again on a new connection is safe and can succeed",
            (false, true) => "; the connection is closed: reconnect",
            (false, false) => "",
        }
    )]
    RelayStopped {
        /// What the run did and recorded before it stopped.
        report: crate::relay_report::RelayReport,
        /// The message whose delivery's outcome could not be recorded, when that was the failure.
        message_id: Option<String>,
        /// Whether that message's delivery function returned `Ok`.
        delivered: bool,
        /// Whether that was the message's last allowed attempt
        /// ([`max_attempts`](crate::outbox::Relay::max_attempts)).
        last_attempt: bool,
        /// Why the run stopped.
        #[source]
        source: Box<Error>,
    },

    /// An outbox payload could not be turned into JSON, or holds a NaN or infinite float (JSON
    /// would write it as `null`, and the consumer would read another value). The job goes on;
    /// the message is not recorded. Retrying does not help.
    #[error(
        "the payload of outbox message \"{topic}\" could not be stored as JSON; nothing was recorded"
    )]
    OutboxPayload {
        /// The message's topic.
        topic: String,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },

    /// An outbox message the database cannot hold whole was refused before anything was sent:
    /// a topic longer than the table's column (MySQL: 255 characters), a topic with a NUL
    /// character (on every database, as PostgreSQL cannot hold it), or a message whose job key,
    /// topic and payload together are more than the server takes in one statement (MySQL's
    /// `max_allowed_packet`). Nothing was recorded; the job goes on (returning the error with `?`
    /// rolls it back whole) and the connection stays usable.
    ///
    /// What to do: a shorter topic; a smaller payload (an id the receiver looks the rest up by),
    /// or a larger `max_allowed_packet`. Retrying does not help.
    #[error(
        "outbox message \"{topic}\" was not recorded: {why}; nothing was recorded, and retrying does not help"
    )]
    OutboxMessageRefused {
        /// The message's topic (its first 255 characters when it was too long).
        topic: String,
        /// What the database cannot hold.
        why: String,
    },

    /// A statement of the outbox or its relay failed, and changed nothing: a push inside a job
    /// recorded no message (the job decides, by returning the error or not, whether it commits;
    /// on PostgreSQL a failed statement aborts the job's transaction, so the job cannot go on and
    /// commit: return the error); what a relay marked before the failure stays marked. What the
    /// runtime can tell before the statement (a topic too long, a NUL, a message over MySQL's
    /// packet) is [`OutboxMessageRefused`](Error::OutboxMessageRefused) instead, and the job
    /// goes on.
    #[error(
        "an outbox statement failed in the database{hint}; the statement changed nothing{retry}",
        hint = hint(source),
        retry = if *retryable { "; retrying is safe and can succeed" } else { "" }
    )]
    Outbox {
        /// The database's error.
        #[source]
        source: diesel::result::Error,
        /// Whether the failure passes (busy, a lock wait, a deadlock, a lost connection), as for
        /// every other error of the database's.
        retryable: bool,
    },

    /// A push inside a job failed with an error that rolled back the whole transaction the job
    /// ran in, as the database then answered (MySQL and MariaDB: a deadlock, a Galera node's
    /// abort, a lock wait timeout with `innodb_rollback_on_timeout`; SQLite: a full disk, an I/O
    /// error): no message was recorded, nothing of the job is committed (nor of a caller's
    /// transaction the job ran in), and a statement the body runs after this runs outside any
    /// transaction, committed on its own (a second push among them). Return it; the job's retry
    /// (a redelivery) runs it whole.
    #[error(
        "an outbox push to `{topic}` failed in the database{hint}, and the database rolled back the whole transaction the job ran in with it: no message was recorded and nothing of the job was committed (nor of a caller's transaction it ran in); return this error: a statement run after it (another push) runs outside any transaction and commits on its own{retry}",
        hint = hint(source),
        retry = if *retryable { "; a redelivery runs the job again, whole" } else { "" }
    )]
    OutboxPushRolledBackJob {
        /// The message's topic.
        topic: String,
        /// Whether the failure passes (a deadlock, a lock wait): the job's retry can succeed.
        retryable: bool,
        /// The database's error.
        #[source]
        source: diesel::result::Error,
    },

    /// A table of the runtime's is missing where the connection finds its tables: `migrate` has
    /// not run on this database (or, on PostgreSQL, not into a schema on this connection's
    /// `search_path`, or into one this role may not use). Nothing was changed; a retry meets the
    /// same until the tables are there. The message is the same on every database (it cannot
    /// tell which one): [`verify`](crate::verify) names where this connection looked.
    #[error(
        "the runtime's table `{table}` does not exist where this connection finds its tables: run `idempotent_jobs::migrate(&mut conn)` once before the first job (or `idempotent-jobs migrate` with the CLI), and `verify` says where it looked; nothing was changed"
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
    #[error("verifying the runtime's tables failed; nothing was changed")]
    Verify(#[source] diesel::result::Error),

    /// Creating or upgrading one of the runtime's tables failed. Steps already done stay done (on
    /// MySQL) or were rolled back with the rest (SQLite, PostgreSQL). The message says what lets
    /// `migrate` finish: calling it again resumes where a failure that passes stopped (a lost
    /// connection, a lock wait, a deadlock; [`is_retryable`](Error::is_retryable) is true for
    /// those alone); a step that fails the same way at every call is told with its fix (an
    /// invalid index in the way: `DROP INDEX` it; MySQL's `ROW_FORMAT` too small for an index; the
    /// grant a refused privilege needs). Where the source is a
    /// [`SchemaProblem`](crate::SchemaProblem) (a schema made by a newer release; on PostgreSQL,
    /// a schema holding the tables that the role may not use; a temporary table of the session
    /// hiding the runtime's), `migrate` refused before it changed anything, and calling it again
    /// meets the same until that is dealt with. Where the connection failed while the migration
    /// was committing, the error is [`OutcomeUnknown`](Error::OutcomeUnknown) instead: every step
    /// may be committed.
    #[error(
        "creating or upgrading the runtime's table `{table}` failed; {advice}",
        advice = crate::migration_failure::advice(source.as_ref())
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
    /// Running the job's body (a failure the body caught, or a statement of it).
    Body,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Begin => "opening the transaction",
            Step::Claim => "claiming the key",
            Step::Record => "storing the result",
            Step::Commit => "committing",
            Step::Rollback => "rolling back",
            Step::Body => "the body ran",
        })
    }
}

/// How [`Error::CallersTransactionRolledBack`] says the caller's transaction ended, found at `step`.
fn callers_end(step: Step) -> String {
    match step {
        Step::Begin => "the enclosing transaction the job was called in had ended before the call (the database rolled it back, a deadlock the caller went on after, or a statement of the caller's ended it): opening the job's savepoint found no transaction open".to_owned(),
        step => format!("the whole enclosing transaction the job was called in was rolled back (by the database, or by a statement of the body) while {step}"),
    }
}

/// What the runtime was doing, as [`Error::Database`] says it: inside a caller's transaction the
/// job's end is the release of its savepoint there, not a commit of its own.
fn doing(step: Step, enclosing: bool) -> std::borrow::Cow<'static, str> {
    match (step, enclosing) {
        (Step::Commit, true) => "releasing the job's savepoint in the enclosing transaction".into(),
        _ => step.to_string().into(),
    }
}

/// What [`Error::TransactionRolledBackInBody`] says after the job and its key.
fn rolled_back_in_body(outside: bool) -> &'static str {
    if outside {
        "the job's transaction was rolled back while its body ran (by a statement of the body, or by the database), and the body went on: neither the claim nor the work before that was committed, but the statements the body ran after it ran outside any transaction and may be committed; a retry runs the job again, those statements with it"
    } else {
        "the job's transaction was rolled back or aborted while its body ran, and the body returned Ok regardless; nothing of it was committed; retrying is safe"
    }
}

impl Error {
    /// Whether running the job again can succeed: the failure passes (a busy database, a deadlock,
    /// a serialization failure, a lost connection, an outcome that is unknown). `false` for what a
    /// retry would meet again: a fingerprint mismatch, a key claimed by another job, a stored
    /// result that no longer decodes, a result that cannot be stored, a misused API.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Database { retryable, .. }
            | Error::CallersTransactionRolledBack { retryable, .. } => *retryable,
            Error::CommitOutcomeUnknown { .. }
            | Error::OutcomeUnknown { .. }
            | Error::ClaimRetriesExhausted { .. }
            | Error::TransactionRolledBackInBody { .. }
            | Error::InProgress { .. } => true,
            Error::ClaimNotTakenBack { replays, .. } => !replays,
            Error::RelayStopped { source, .. } => source.is_retryable(),
            Error::Migration { source, .. } => crate::migration_failure::retryable(source.as_ref()),
            Error::Keys { retryable, .. }
            | Error::Prune { retryable, .. }
            | Error::Outbox { retryable, .. }
            | Error::OutboxPushRolledBackJob { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// Whether the database connection failed under the call (closed, reset, killed, gone away),
    /// or was found of no more use by it (Diesel's transaction manager broken: a job's future
    /// dropped inside its transaction, whose claim the server holds until the connection
    /// closes): open a new connection (a pool drops this one by itself); what the error says was
    /// and was not committed holds. For a job, see
    /// [`CommitOutcomeUnknown`](Error::CommitOutcomeUnknown) for a failure at the commit; the
    /// operator CLI exits 3 for a lost connection that changed nothing.
    pub fn is_connection_lost(&self) -> bool {
        let source = match self {
            Error::Database { source, .. }
            | Error::CommitOutcomeUnknown { source, .. }
            | Error::ClaimNotTakenBack { source, .. }
            | Error::ClaimRetriesExhausted { source, .. }
            | Error::Prune { source, .. }
            | Error::Keys { source, .. }
            | Error::OutcomeUnknown { source, .. }
            | Error::Outbox { source, .. }
            | Error::OutboxPushRolledBackJob { source, .. }
            | Error::Verify(source) => source,
            Error::Migration { source, .. } => {
                match crate::migration_failure::database_error(source.as_ref()) {
                    Some(source) => source,
                    None => return false,
                }
            }
            Error::RelayStopped { source, .. } => return source.is_connection_lost(),
            _ => return false,
        };
        crate::lost::anywhere(source)
            || matches!(source, diesel::result::Error::BrokenTransactionManager)
    }

    /// Whether the database may hold something a failed job left that a person should look at
    /// (what its body wrote, a claim that may be committed): [`ClaimNotTakenBack`](Error::ClaimNotTakenBack) (a
    /// claim of a run that did not finish may be committed),
    /// [`CannotRollBack`](Error::CannotRollBack) (what the body wrote where a rollback cannot
    /// reach), and
    /// [`TransactionEndedInBody`](Error::TransactionEndedInBody) (the work before a statement of
    /// the body that committed). The runtime logs each at `ERROR`, in the job's span (its name
    /// and key); a worker alerts on them rather than only dead-lettering.
    pub fn needs_operator(&self) -> bool {
        matches!(
            self,
            Error::ClaimNotTakenBack { .. }
                | Error::CannotRollBack { .. }
                | Error::TransactionEndedInBody { .. }
        )
    }
}

/// Where a relay run stopped, for [`Error::RelayStopped`].
fn stopped_at(
    message_id: Option<&str>,
    delivered: bool,
    last_attempt: bool,
    source: &Error,
) -> String {
    let Some(id) = message_id else {
        return if source.is_connection_lost() {
            ": its connection failed".to_owned()
        } else {
            ": taking its next batch failed".to_owned()
        };
    };
    let unknown = matches!(source, Error::OutcomeUnknown { .. });
    let recorded = if unknown {
        "its record may or may not be committed"
    } else {
        "the database does not hold it"
    };
    // Where the record may have committed, what follows holds only if it did not.
    let unless = if unknown {
        "if it was not committed, "
    } else {
        ""
    };
    let then = if last_attempt {
        "it was its last allowed attempt, so once its lease lapses it is parked as one that may have been delivered"
    } else if delivered {
        "once its lease lapses it is sent again (its receiver drops the copy by its id)"
    } else {
        "once its lease lapses it is tried again, this attempt counted"
    };
    let then = then.replacen(
        "once its lease lapses",
        &format!("{unless}once its lease lapses"),
        1,
    );
    if delivered {
        format!(": message {id} was delivered, and recording so failed ({recorded}); {then}")
    } else {
        format!(": the failed delivery of message {id} could not be recorded ({recorded}); {then}")
    }
}

/// What the error says of a claim that did not run in the transaction its job opened (PostgreSQL's
/// claims check a transaction-local mark that the job's `BEGIN` sets): the connection's
/// statements are not all reaching the server in one transaction. Nothing of the job ran.
pub(crate) const OUTSIDE_JOB: &str =
    "idempotent-jobs: the claim did not run in the job's transaction";

/// What to do about a database error, where there is something to say.
fn hint(error: &diesel::result::Error) -> &'static str {
    match error {
        diesel::result::Error::BrokenTransactionManager => {
            " (this connection's transaction state is broken: a job's future was dropped inside its transaction, or a rollback failed; close the connection and use a new one, as a pool does by itself)"
        }
        diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::ClosedConnection,
            _,
            // Whether to retry is each message's own advice (by `is_retryable`): a claim that replays
            // must not be retried before it is forgotten, whatever ended the connection.
        ) => " (the connection is closed: reconnect)",
        diesel::result::Error::DatabaseError(_, info) if info.message().contains(OUTSIDE_JOB) => {
            " (the claim did not run in the transaction the job opened: this connection's statements are not all reaching the database in one transaction, as through PgBouncer in transaction mode when another client of it sends statements outside a transaction, such as diesel-async's own `establish`; see docs/clusters.md)"
        }
        _ => "",
    }
}

/// Shorthand for results whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use diesel::result::{DatabaseErrorKind, Error as DieselError};

    fn closed() -> DieselError {
        DieselError::DatabaseError(
            DatabaseErrorKind::ClosedConnection,
            Box::new("server closed the connection unexpectedly".to_string()),
        )
    }

    /// A message that tells the reader not to retry never says, in the same breath, that it can
    /// be retried: the advice on retrying is each variant's own, by `is_retryable`.
    #[test]
    fn no_message_contradicts_its_advice_on_retrying() {
        let cases = [
            Error::ClaimNotTakenBack {
                job: "invoice",
                key: "invoice:1".into(),
                ended: "a statement of the body committed".into(),
                replays: true,
                source: closed(),
            },
            Error::ClaimNotTakenBack {
                job: "invoice",
                key: "invoice:1".into(),
                ended: "a statement of the body committed".into(),
                replays: false,
                source: closed(),
            },
            Error::Database {
                job: "invoice",
                key: "invoice:1".into(),
                step: Step::Claim,
                enclosing: false,
                retryable: false,
                source: closed(),
            },
            Error::Database {
                job: "invoice",
                key: "invoice:1".into(),
                step: Step::Claim,
                enclosing: true,
                retryable: true,
                source: closed(),
            },
            Error::Keys {
                action: "forgetting key invoice:1",
                source: closed(),
                retryable: false,
            },
            Error::Outbox {
                source: closed(),
                retryable: false,
            },
            Error::OutboxPushRolledBackJob {
                topic: "email".into(),
                retryable: true,
                source: closed(),
            },
            Error::OutboxPushRolledBackJob {
                topic: "email".into(),
                retryable: false,
                source: closed(),
            },
            relay_stopped(true),
            relay_stopped(false),
        ];
        for error in cases {
            let text = error.to_string();
            let says_retry = says_to_retry(&text);
            assert_eq!(
                says_retry,
                error.is_retryable(),
                "the message and is_retryable disagree: {text}"
            );
            assert!(
                text.contains("connection is closed"),
                "the message says what happened to the connection: {text}"
            );
        }
        // The errors that ask for an operator say what a retry would do, not to retry.
        for error in [
            Error::TransactionEndedInBody {
                job: "invoice",
                key: "invoice:1".into(),
            },
            Error::CannotRollBack {
                job: "invoice",
                key: "invoice:1".into(),
                why: "a table that is not transactional",
            },
        ] {
            let text = error.to_string();
            assert!(
                !error.is_retryable() && !says_to_retry(&text) && text.contains("before retrying"),
                "{text}"
            );
        }
        let aborted = Error::CallersTransactionAborted {
            job: "invoice",
            key: "invoice:1".into(),
        };
        let text = aborted.to_string();
        assert!(!aborted.is_retryable() && !says_to_retry(&text), "{text}");
    }

    /// No message calls a retry safe while it says that work of the job's may be committed: a
    /// retry runs the job again, and that work with it. Before, `ClaimNotTakenBack` (a job that
    /// records a result) and `CallersTransactionRolledBack` (a body that went on after the
    /// rollback) said both.
    #[test]
    fn no_message_calls_a_retry_safe_where_work_may_be_committed() {
        let mut cases = vec![
            Error::TransactionRolledBackInBody {
                job: "invoice",
                key: "invoice:1".into(),
                outside: true,
            },
            Error::TransactionRolledBackInBody {
                job: "invoice",
                key: "invoice:1".into(),
                outside: false,
            },
            Error::TransactionEndedInBody {
                job: "invoice",
                key: "invoice:1".into(),
            },
        ];
        for replays in [true, false] {
            cases.push(Error::ClaimNotTakenBack {
                job: "invoice",
                key: "invoice:1".into(),
                ended: "a statement of its body ended or rolled back its transaction; what the body wrote before that statement may be committed".into(),
                replays,
                source: closed(),
            });
        }
        for (outside, retryable) in [(true, true), (true, false), (false, true), (false, false)] {
            cases.push(Error::CallersTransactionRolledBack {
                job: "invoice",
                key: "invoice:1".into(),
                step: Step::Body,
                outside,
                retryable,
                source: None,
            });
        }
        cases.push(Error::CallersTransactionRolledBack {
            job: "invoice",
            key: "invoice:1".into(),
            step: Step::Begin,
            outside: false,
            retryable: true,
            source: None,
        });
        for error in cases {
            let text = error.to_string();
            assert!(
                !(text.contains("may be committed") && text.contains("safe")),
                "a retry called safe beside work that may be committed: {text}"
            );
            assert_eq!(
                says_to_retry(&text),
                error.is_retryable(),
                "the message and is_retryable disagree: {text}"
            );
        }
    }

    /// A delivery whose record's `COMMIT` went unanswered: the record may have committed, and
    /// then the message is delivered and neither sent again nor parked. The text says what
    /// follows only for a record that did not commit (it said "once its lease lapses it is
    /// parked" as a certainty).
    #[test]
    fn a_record_of_unknown_outcome_promises_nothing_of_what_follows() {
        for (delivered, last_attempt) in
            [(true, true), (true, false), (false, true), (false, false)]
        {
            let error = Error::RelayStopped {
                report: crate::relay_report::RelayReport::default(),
                message_id: Some("m-1".into()),
                delivered,
                last_attempt,
                source: Box::new(Error::OutcomeUnknown {
                    action: "recording a delivery",
                    source: closed(),
                }),
            };
            let text = error.to_string();
            assert!(
                text.contains("may or may not be committed)")
                    && text.contains("if it was not committed, once its lease lapses"),
                "{text}"
            );
        }
    }

    /// A relay run stopped by a lost connection, after it had recorded one delivery.
    fn relay_stopped(retryable: bool) -> Error {
        Error::RelayStopped {
            report: crate::relay_report::RelayReport {
                leased: 2,
                delivered: 1,
                ..Default::default()
            },
            message_id: Some("m-2".into()),
            delivered: true,
            last_attempt: false,
            source: Box::new(Error::Outbox {
                source: closed(),
                retryable,
            }),
        }
    }

    /// Whether a message reads as advice to retry.
    fn says_to_retry(text: &str) -> bool {
        [
            "retried",
            "retrying is safe",
            "is safe and can succeed",
            "a retry runs",
            "delivery runs the job again",
        ]
        .iter()
        .any(|phrase| text.contains(phrase))
    }
}
