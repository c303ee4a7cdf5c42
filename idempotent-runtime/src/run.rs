//! Claim, run, record, commit: the transaction around one job call.
//!
//! This is the rule from the
//! <a href="https://agentwranglers.se/playbook/scaling/background-jobs-and-queues/idempotent-jobs">Agent Wranglers scaling playbook</a>
//! in code: the key is recorded under a unique constraint in the same transaction as the work, and a
//! key that is already there means the work is done.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::time::{Duration, Instant};

use chrono::NaiveDateTime;
use diesel::connection::{AnsiTransactionManager, TransactionManager};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Step};
use crate::job::Job;
use crate::key::JobKey;
use crate::outcome::Outcome;
use crate::store::{self, Claim, ClaimState, DoneRow, JobStore, Nesting};

/// An error type a job handler can return: one that can hold this crate's [`Error`].
///
/// Implemented for every `E: From<idempotent::Error>`. With `thiserror`, one variant does it:
/// `#[error(transparent)] Idempotent(#[from] idempotent::Error)`.
#[diagnostic::on_unimplemented(
    message = "the handler's error type `{Self}` cannot hold the errors of `idempotent`",
    label = "`{Self}` needs `impl From<idempotent::Error>`",
    note = "the claim, the commit and a replay can fail; the handler returns those failures as its own error type",
    note = "add `impl From<idempotent::Error> for {Self}`, or with thiserror a variant `#[error(transparent)] Idempotent(#[from] idempotent::Error)`"
)]
pub trait JobError: From<Error> {}

impl<E: From<Error>> JobError for E {}

/// A value a job handler can return: it is stored as JSON with the claim and returned to every rerun.
///
/// Implemented for every `T: Serialize + DeserializeOwned`.
#[diagnostic::on_unimplemented(
    message = "the handler's `Ok` type `{Self}` cannot be stored for replays",
    label = "`{Self}` must implement `serde::Serialize` and `serde::Deserialize`",
    note = "the first run's `Ok` value is stored as JSON and returned to every rerun of the same key",
    note = "derive both: `#[derive(serde::Serialize, serde::Deserialize)]`, or return `()` to store nothing"
)]
pub trait JobOutput: Serialize + DeserializeOwned {}

impl<T: Serialize + DeserializeOwned> JobOutput for T {}

/// How long transient claim failures (SQLite busy, deadlocks) are retried before giving up.
pub(crate) const RETRY_WINDOW: Duration = Duration::from_secs(30);

/// Runs `body` once per key: claims `key` for `job` in a new transaction, runs the body in it,
/// stores the body's `Ok` value and commits. When the key is already claimed, the body does not run
/// and the stored value comes back as [`Outcome::Replayed`].
///
/// This is what `#[idempotent_job]` expands to; call it yourself to build keys your own way or to
/// learn whether a call ran or replayed.
///
/// * `Err` from the body rolls the transaction back, the claim with it, so a retry runs again.
/// * A panic in the body rolls back too, leaves the connection usable, and then continues unwinding.
/// * Inside a transaction the caller already opened, the job runs in a savepoint and its claim
///   commits or rolls back with the caller's transaction.
///
/// ```
/// use diesel::prelude::*;
/// use idempotent_runtime::{Job, JobKey, Outcome, run};
///
/// static WELCOME: Job = Job::new("welcome", "welcome:<user>");
///
/// # fn main() -> Result<(), idempotent_runtime::Error> {
/// let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
/// idempotent_runtime::migrate(&mut conn)?;
///
/// let key = JobKey::new("welcome:42");
/// let first: Outcome<u32> = run(&mut conn, &WELCOME, &key, |_conn| Ok::<_, idempotent_runtime::Error>(7))?;
/// let second: Outcome<u32> = run(&mut conn, &WELCOME, &key, |_conn| unreachable!("already done"))?;
/// assert_eq!(first, Outcome::Ran(7));
/// assert_eq!(second, Outcome::Replayed(7));
/// # Ok(())
/// # }
/// ```
pub fn run<C, T, E, F>(conn: &mut C, job: &Job, key: &JobKey, body: F) -> Result<Outcome<T>, E>
where
    C: JobStore,
    T: JobOutput,
    E: JobError,
    F: FnOnce(&mut C) -> Result<T, E>,
{
    run_with(conn, |conn| conn, job, key, body)
}

/// [`run`] for a connection reached through `store`, such as a pooled connection that derefs to a
/// Diesel connection: the body gets the caller's own connection value back.
#[doc(hidden)]
pub fn run_with<Conn, C, T, E, F>(
    conn: &mut Conn,
    store: impl Fn(&mut Conn) -> &mut C,
    job: &Job,
    key: &JobKey,
    body: F,
) -> Result<Outcome<T>, E>
where
    Conn: ?Sized,
    C: JobStore,
    T: JobOutput,
    E: JobError,
    F: FnOnce(&mut Conn) -> Result<T, E>,
{
    let call = Call::new(job, key);
    let span = tracing::info_span!("idempotent.job", job = job.name(), key = %call.key_text);
    let _entered = span.enter();

    let (nesting, state) = begin_and_claim(store(conn), &call)?;
    if let ClaimState::Done(row) = state {
        let replay = call.replay(row);
        return match replay {
            Ok(value) => {
                commit(store(conn), &call)?;
                tracing::info!(
                    outcome = "replayed",
                    "job already done; replayed its result"
                );
                Ok(Outcome::Replayed(value))
            }
            Err(error) => {
                rollback(store(conn), &call);
                Err(error.into())
            }
        };
    }
    tracing::debug!(?nesting, "claimed key");

    match catch_unwind(AssertUnwindSafe(|| body(conn))) {
        Err(panic) => {
            rollback(store(conn), &call);
            tracing::warn!(outcome = "panicked", "job panicked; rolled back");
            resume_unwind(panic)
        }
        Ok(Err(error)) => {
            rollback(store(conn), &call);
            tracing::info!(outcome = "failed", "job returned an error; rolled back");
            Err(error)
        }
        Ok(Ok(value)) => {
            let stored = call.encode(&value).and_then(|json| match json {
                Some(json) => store(conn)
                    .record_result(&call.digest, &json)
                    .map_err(|e| call.database(Step::Record, e)),
                None => Ok(()),
            });
            if let Err(error) = stored {
                rollback(store(conn), &call);
                return Err(error.into());
            }
            commit(store(conn), &call)?;
            tracing::info!(outcome = "ran", "job ran and committed");
            Ok(Outcome::Ran(value))
        }
    }
}

/// One call of a job: everything the claim needs, computed once.
pub(crate) struct Call<'a> {
    pub(crate) job: &'a Job,
    pub(crate) key_text: String,
    pub(crate) digest: [u8; 32],
    pub(crate) now: NaiveDateTime,
}

impl<'a> Call<'a> {
    pub(crate) fn new(job: &'a Job, key: &JobKey) -> Self {
        Self {
            job,
            key_text: key.readable().into_owned(),
            digest: key.digest(),
            now: chrono::Utc::now().naive_utc(),
        }
    }

    pub(crate) fn claim(&self) -> Claim<'_> {
        Claim {
            digest: &self.digest,
            key: &self.key_text,
            job: self.job.name(),
            fingerprint: None,
            now: self.now,
            expires_at: self
                .job
                .keep()
                .and_then(|keep| chrono::TimeDelta::from_std(keep).ok())
                .and_then(|keep| self.now.checked_add_signed(keep)),
        }
    }

    pub(crate) fn database(&self, step: Step, source: diesel::result::Error) -> Error {
        Error::Database {
            job: self.job.name(),
            key: self.key_text.clone(),
            step,
            source,
        }
    }

    /// The JSON to store for `value`; `None` when it is `null` (as `()` is), which is what an
    /// empty `result` column reads back as.
    pub(crate) fn encode<T: Serialize>(&self, value: &T) -> Result<Option<String>, Error> {
        match serde_json::to_string(value) {
            Ok(json) if json == "null" => Ok(None),
            Ok(json) => Ok(Some(json)),
            Err(source) => Err(Error::StoreResult {
                job: self.job.name(),
                key: self.key_text.clone(),
                source,
            }),
        }
    }

    pub(crate) fn replay<T: DeserializeOwned>(&self, row: DoneRow) -> Result<T, Error> {
        if row.job_name != self.job.name() {
            return Err(Error::KeyClaimedByOtherJob {
                job: self.job.name(),
                key: self.key_text.clone(),
                claimed_by: row.job_name,
            });
        }
        serde_json::from_str(row.result.as_deref().unwrap_or("null")).map_err(|source| {
            Error::ReplayDecode {
                job: self.job.name(),
                key: self.key_text.clone(),
                source,
            }
        })
    }
}

/// Opens the transaction and claims the key, retrying the whole transaction on transient errors
/// (SQLite busy, deadlocks) for up to [`RETRY_WINDOW`]. Nothing has run yet, so a retry is safe.
fn begin_and_claim<C: JobStore>(
    conn: &mut C,
    call: &Call<'_>,
) -> Result<(Nesting, ClaimState), Error> {
    let started = Instant::now();
    let claim = call.claim();
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let (step, error) = match conn.begin_job() {
            Err(error) => (Step::Begin, error),
            Ok(nesting) => match store::claim(conn, &claim) {
                Ok(state) => return Ok((nesting, state)),
                Err(error) => {
                    rollback(conn, call);
                    if nesting == Nesting::Savepoint {
                        // A deadlock or busy error aborts the caller's whole transaction on some
                        // backends; only the caller can retry that.
                        return Err(call.database(Step::Claim, error));
                    }
                    (Step::Claim, error)
                }
            },
        };
        if !C::is_transient(&error) {
            return Err(call.database(step, error));
        }
        if started.elapsed() >= RETRY_WINDOW {
            return Err(Error::ClaimRetriesExhausted {
                job: call.job.name(),
                key: call.key_text.clone(),
                attempts,
                source: error,
            });
        }
        tracing::debug!(attempts, %error, "transient error while claiming; retrying");
        std::thread::sleep(backoff(attempts));
    }
}

/// Exponential backoff from 1 ms to 64 ms, with jitter so that racing workers spread out.
pub(crate) fn backoff(attempt: u32) -> Duration {
    let ceiling = 1u64 << attempt.clamp(1, 6);
    let jitter = u64::from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos()),
    ) % (ceiling * 1000);
    Duration::from_micros(ceiling * 500 + jitter / 2)
}

fn commit<C: JobStore>(conn: &mut C, call: &Call<'_>) -> Result<(), Error> {
    AnsiTransactionManager::commit_transaction(conn).map_err(|e| call.database(Step::Commit, e))
}

/// Rolls back, logging a failure rather than returning it: the caller is already returning the error
/// that made the rollback necessary, and Diesel marks the connection broken if it could not roll
/// back, so a pool will not hand it out again.
fn rollback<C: JobStore>(conn: &mut C, call: &Call<'_>) {
    if let Err(error) = AnsiTransactionManager::rollback_transaction(conn) {
        tracing::error!(job = call.job.name(), %error, "rolling back the job's transaction failed");
    }
}
