//! What the runtime needs from a connection and from a database, as two internal traits.
//!
//! * [`Store`], one implementation per connection type (three sync Diesel connections, three
//!   diesel-async ones): open, commit and roll back transactions, run a [`Statement`], wait. This
//!   is the only place where sync and async connections differ.
//! * [`Database`], one implementation per database (`db::sqlite`, `db::postgres`, `db::mysql`):
//!   every statement of that database, its error classification, locking, migration and
//!   inspection SQL, written once as async code generic over any [`Store`] of that database.
//!
//! The job lifecycle, the relay, pruning, migrations and the test kit are written once, as async
//! code over `Store`. An async caller awaits it; a sync caller drives the same future to
//! completion with [`crate::drive::block_on`]: a sync connection's futures do their work when first
//! polled and are never pending, so the shared code runs exactly as straight-line sync code would,
//! on the caller's thread. One copy of each algorithm, with no sync/async twins to drift apart.
//!
//! Both traits are sealed: `JobStore` and `AsyncJobStore` (the public names of the connection
//! types a job can run on) have `Store` as a supertrait that users cannot name or implement.

mod connection;
mod database;
mod rows;

pub use connection::Store;
pub use database::Database;
pub use rows::*;

sql! {
    /// Proves a job's transaction is still its own; see [`Store::begin_job`].
    ReleaseJob = "RELEASE SAVEPOINT idempotent_job";
    /// Sets the job's savepoint after its claim; see [`Nesting::Unmarked`].
    SetJobSavepoint = "SAVEPOINT idempotent_job";
}

/// What the check of [`Database::check_and_release`] says when this run's claim is no longer in
/// the caller's transaction; a failure whose message holds it is the check's. No quote in it: it
/// goes into SQL as a literal.
pub(crate) const CLAIM_GONE: &str =
    "idempotent-jobs: the claim of this run is no longer in the transaction";

const _: () = {
    let bytes = CLAIM_GONE.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        assert!(bytes[at] != b'\'', "CLAIM_GONE goes into SQL as a literal");
        at += 1;
    }
};

/// Whether a transaction is the outermost one or a savepoint inside the caller's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nesting {
    /// This transaction's commit is the real commit.
    Outermost,
    /// The outermost transaction of a job, opened by [`Store::begin_job`] without the job's
    /// savepoint: the lifecycle sets it after the claim ([`Database::set_job_savepoint`]), so that
    /// a body that rolls back to it cannot take the claim with it; then it is `Outermost`. Where
    /// the savepoint is a statement of its own anyway (SQLite, in process; sync MySQL without
    /// the job procedures). A claim that found its key taken sets no savepoint: its replay runs
    /// no body, and its transaction stays `Unmarked` until the rollback that ends it.
    Unmarked,
    /// The caller was already in a transaction: this commits when the caller's does.
    Savepoint,
}

/// What an unfinished transaction or lock needs when its guard is dropped without finishing it
/// (a panic unwinding, a dropped future).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfinished {
    /// A transaction: roll it back.
    Transaction,
    /// A session lock: release it with this statement.
    SessionLock(&'static str),
}

/// The kinds of database error the runtime reacts to; see [`Database::classify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Another connection holds the database's write lock (SQLite).
    Busy,
    /// A deadlock was detected and this transaction chosen as its victim.
    Deadlock,
    /// A row lock was waited for until the server's lock timeout.
    LockTimeout,
    /// The transaction could not be serialized with concurrent ones.
    Serialization,
    /// Anything else.
    Other,
}

impl Fault {
    /// Whether trying the whole transaction again can succeed.
    pub fn is_transient(self) -> bool {
        !matches!(self, Fault::Other)
    }
}
