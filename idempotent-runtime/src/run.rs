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

use std::sync::Arc;

use crate::context::{self, JobContext};
use crate::error::{Error, Step};
use crate::fingerprint::{Fingerprint, FingerprintError};
use crate::job::Job;
use crate::key::JobKey;
use crate::outcome::Outcome;
use crate::stats::{self, Ending};
use crate::store::{self, Claim, ClaimState, DoneRow, JobStore, Nesting};

/// An error type a job handler can return: one that can hold this crate's [`Error`].
///
/// Implemented for every `E: From<idempotent_jobs::Error>`. With `thiserror`, one variant does it:
/// `#[error(transparent)] Idempotent(#[from] idempotent_jobs::Error)`.
#[diagnostic::on_unimplemented(
    message = "the handler's error type `{Self}` cannot hold the errors of `idempotent_jobs`",
    label = "`{Self}` needs `impl From<idempotent_jobs::Error>`",
    note = "the claim, the commit and a replay can fail; the handler returns those failures as its own error type",
    note = "add `impl From<idempotent_jobs::Error> for {Self}`, or with thiserror a variant `#[error(transparent)] Idempotent(#[from] idempotent_jobs::Error)`"
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
/// learn whether a call ran or replayed. [`JobCall`] adds an input fingerprint.
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
pub fn run<C, T, E, F>(
    conn: &mut C,
    job: &'static Job,
    key: &JobKey,
    body: F,
) -> Result<Outcome<T>, E>
where
    C: JobStore,
    T: JobOutput,
    E: JobError,
    F: FnOnce(&mut C) -> Result<T, E>,
{
    JobCall::new(job, key).run(conn, body)
}

/// One call of a job, for the plain function API: the job, the key, and optionally a fingerprint of
/// the inputs that must match when the key comes back.
///
/// ```
/// use diesel::prelude::*;
/// use idempotent_runtime::fingerprint::Fingerprint;
/// use idempotent_runtime::{Error, Job, JobCall, JobKey};
///
/// static CHARGE: Job = Job::new("charge", "charge:<order_id>").fingerprint_inputs(&["amount"]);
///
/// let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
/// idempotent_runtime::migrate(&mut conn)?;
/// let key = JobKey::new("charge:42");
/// let charge = |amount: u64| -> Result<_, Error> {
///     let fingerprint = Fingerprint::builder().input("amount", &amount).finish().expect("a number serializes");
///     JobCall::new(&CHARGE, &key).fingerprint(fingerprint).run(&mut conn, |_| Ok::<_, Error>(amount))
/// };
/// # let mut charge = charge;
/// assert!(charge(4200)?.is_ran());
/// assert!(charge(4200)?.is_replayed());
/// assert!(matches!(charge(9900), Err(Error::FingerprintMismatch { .. })));
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug)]
#[must_use = "a JobCall does nothing until it is run"]
pub struct JobCall<'a> {
    job: &'static Job,
    key: &'a JobKey,
    fingerprint: Option<Result<Fingerprint, FingerprintError>>,
}

impl<'a> JobCall<'a> {
    /// A call of `job` with `key`.
    pub fn new(job: &'static Job, key: &'a JobKey) -> Self {
        Self {
            job,
            key,
            fingerprint: None,
        }
    }

    /// Checks `fingerprint` against the first run's when the key comes back: a difference is an
    /// [`Error::FingerprintMismatch`] and nothing runs.
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = Some(Ok(fingerprint));
        self
    }

    /// As [`fingerprint`](Self::fingerprint), with a failure to build it reported when the call
    /// runs (what the attribute generates).
    #[doc(hidden)]
    pub fn fingerprint_result(
        mut self,
        fingerprint: Result<Fingerprint, FingerprintError>,
    ) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// Runs the call; see [`run`].
    pub fn run<C, T, E, F>(self, conn: &mut C, body: F) -> Result<Outcome<T>, E>
    where
        C: JobStore,
        T: JobOutput,
        E: JobError,
        F: FnOnce(&mut C) -> Result<T, E>,
    {
        run_with(conn, |conn| conn, self, body)
    }

    /// Runs the call on an async connection; see [`run_async`](crate::run_async).
    #[cfg(feature = "async")]
    pub async fn run_async<C, T, E, F>(self, conn: &mut C, body: F) -> Result<Outcome<T>, E>
    where
        C: crate::AsyncJobStore,
        T: JobOutput,
        E: JobError,
        F: AsyncFnOnce(&mut C) -> Result<T, E>,
    {
        crate::asynchronous::run_async_with(conn, |conn| conn, self, body).await
    }
}

/// [`run`] for a connection reached through `store`, such as a pooled connection that derefs to a
/// Diesel connection: the body gets the caller's own connection value back.
#[doc(hidden)]
pub fn run_with<Conn, C, T, E, F>(
    conn: &mut Conn,
    store: impl Fn(&mut Conn) -> &mut C,
    job_call: JobCall<'_>,
    body: F,
) -> Result<Outcome<T>, E>
where
    Conn: ?Sized,
    C: JobStore,
    T: JobOutput,
    E: JobError,
    F: FnOnce(&mut Conn) -> Result<T, E>,
{
    let call = Call::new(job_call)?;
    let span = call.span();
    let _entered = span.enter();
    if call.inside_own_claim()? {
        // The enclosing run of this job holds the key in this same transaction: run here.
        return body(conn).map(Outcome::Ran);
    }

    let (nesting, state) = begin_and_claim(store(conn), &call).map_err(|e| call.failed(e))?;
    if let ClaimState::Done(row) = state {
        return match call.replay(row) {
            Ok(value) => {
                commit(store(conn), &call).map_err(|e| call.failed(e))?;
                call.finished(Ending::Replayed);
                Ok(Outcome::Replayed(value))
            }
            Err(error) => {
                rollback(store(conn), &call);
                Err(call.failed(error).into())
            }
        };
    }
    tracing::debug!(?nesting, "claimed key");

    match catch_unwind(AssertUnwindSafe(|| {
        context::enter(&call.context, || body(conn))
    })) {
        Err(panic) => {
            rollback(store(conn), &call);
            call.finished(Ending::Panicked);
            resume_unwind(panic)
        }
        Ok(Err(error)) => {
            rollback(store(conn), &call);
            call.finished(Ending::Failed);
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
                return Err(call.failed(error).into());
            }
            commit(store(conn), &call).map_err(|e| call.failed(e))?;
            call.finished(Ending::Ran);
            Ok(Outcome::Ran(value))
        }
    }
}

/// One call of a job: everything the claim needs, computed once.
pub(crate) struct Call {
    pub(crate) job: &'static Job,
    /// The key as shown in events and errors and stored in `job_key`: readable, or redacted.
    pub(crate) key_text: String,
    pub(crate) digest: [u8; 32],
    pub(crate) fingerprint: Option<Fingerprint>,
    pub(crate) now: NaiveDateTime,
    pub(crate) started: Instant,
    /// What the body can ask about its job: its key, its outbox messages so far.
    pub(crate) context: Arc<JobContext>,
}

impl Call {
    pub(crate) fn new(job_call: JobCall<'_>) -> Result<Self, Error> {
        let JobCall {
            job,
            key,
            fingerprint,
        } = job_call;
        let digest = key.digest();
        let key_text = if job.redacts_key() {
            redacted(&digest)
        } else {
            key.readable().into_owned()
        };
        let fingerprint = match fingerprint.transpose() {
            Ok(fingerprint) => fingerprint,
            Err(source) => {
                return Err(Error::Fingerprint {
                    job: job.name(),
                    key: key_text,
                    source,
                });
            }
        };
        Ok(Self {
            job,
            key_text,
            digest,
            fingerprint,
            now: chrono::Utc::now().naive_utc(),
            started: Instant::now(),
            context: JobContext::new(key.clone(), digest, job.name()),
        })
    }

    pub(crate) fn span(&self) -> tracing::Span {
        tracing::info_span!("idempotent.job", job = self.job.name(), key = %self.key_text)
    }

    pub(crate) fn claim(&self) -> Claim<'_> {
        Claim {
            digest: &self.digest,
            key: &self.key_text,
            job: self.job.name(),
            fingerprint: self.fingerprint.as_ref().map(|f| &f.as_bytes()[..]),
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

    /// Whether an enclosing body on this thread already holds this key, for this job: then the
    /// call is part of that run. For another job it is [`Error::KeyClaimedByOtherJob`].
    pub(crate) fn inside_own_claim(&self) -> Result<bool, Error> {
        match context::enclosing_claim(&self.digest) {
            None => Ok(false),
            Some(job) if job == self.job.name() => Ok(true),
            Some(job) => Err(self.failed(Error::KeyClaimedByOtherJob {
                job: self.job.name(),
                key: self.key_text.clone(),
                claimed_by: job.to_owned(),
            })),
        }
    }

    /// After a failed claim attempt: `Ok` to try again (a transient error, within
    /// [`RETRY_WINDOW`]), or the error to give up with.
    pub(crate) fn retry_or_fail(
        &self,
        step: Step,
        error: diesel::result::Error,
        is_transient: fn(&diesel::result::Error) -> bool,
        attempts: u32,
        started: Instant,
    ) -> Result<(), Error> {
        if !is_transient(&error) {
            return Err(self.database(step, error));
        }
        if started.elapsed() >= RETRY_WINDOW {
            return Err(Error::ClaimRetriesExhausted {
                job: self.job.name(),
                key: self.key_text.clone(),
                attempts,
                source: error,
            });
        }
        stats::retried(self.job.name(), attempts, &error);
        Ok(())
    }

    /// Records how the call ended.
    pub(crate) fn finished(&self, ending: Ending) {
        stats::finished(self.job.name(), ending, self.started);
    }

    /// Records a call that ended in `error`, and passes the error on.
    pub(crate) fn failed(&self, error: Error) -> Error {
        self.finished(match &error {
            Error::FingerprintMismatch { .. } => Ending::FingerprintMismatch,
            Error::KeyClaimedByOtherJob { .. } => Ending::KeyConflict,
            _ => Ending::Error,
        });
        error
    }

    /// The JSON to store for `value`; `None` when it is `null` (as `()` is), which is what an
    /// empty `result` column reads back as.
    ///
    /// The JSON must read back as a `T`, or the first replay would fail where this run succeeded:
    /// serde_json writes a NaN as `null`, and some `Serialize` impls have no matching
    /// `Deserialize`. Such a value fails this run instead, rolled back, while its cause is at hand.
    pub(crate) fn encode<T: JobOutput>(&self, value: &T) -> Result<Option<String>, Error> {
        let stored = serde_json::to_string(value)
            .and_then(|json| serde_json::from_str::<T>(&json).map(|_| json));
        match stored {
            Ok(json) if json == "null" => Ok(None),
            Ok(json) => Ok(Some(json)),
            Err(source) => Err(Error::StoreResult {
                job: self.job.name(),
                key: self.key_text.clone(),
                source,
            }),
        }
    }

    /// The first run's result, if this call is the same job with the same inputs.
    pub(crate) fn replay<T: DeserializeOwned>(&self, row: DoneRow) -> Result<T, Error> {
        if row.job_name != self.job.name() {
            return Err(Error::KeyClaimedByOtherJob {
                job: self.job.name(),
                key: self.key_text.clone(),
                claimed_by: row.job_name,
            });
        }
        // A row from before the job had a fingerprint, or a call without one, is not compared.
        if let (Some(stored), Some(ours)) = (&row.fingerprint, &self.fingerprint)
            && stored.as_slice() != ours.as_bytes()
        {
            return Err(Error::FingerprintMismatch {
                job: self.job.name(),
                key: self.key_text.clone(),
                inputs: self.job.fingerprint_input_names().join(", "),
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

/// What a redacted key looks like: enough of its digest to find its row, nothing of its values.
pub(crate) fn redacted(digest: &[u8; 32]) -> String {
    let mut text = String::from("redacted:");
    for byte in &digest[..8] {
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

/// Opens the transaction and claims the key, retrying the whole transaction on transient errors
/// (SQLite busy, deadlocks) for up to [`RETRY_WINDOW`]. Nothing has run yet, so a retry is safe.
fn begin_and_claim<C: JobStore>(conn: &mut C, call: &Call) -> Result<(Nesting, ClaimState), Error> {
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
        call.retry_or_fail(step, error, C::is_transient, attempts, started)?;
        std::thread::sleep(backoff(attempts));
    }
}

/// Runs `op` until it succeeds or fails with an error that is not transient for `C` (SQLite busy,
/// deadlocks), for up to [`RETRY_WINDOW`]. For statements outside a job's claim: the relay's and
/// the prune's.
pub(crate) fn retry_transient<C: JobStore, T>(
    mut op: impl FnMut() -> diesel::QueryResult<T>,
) -> diesel::QueryResult<T> {
    let started = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match op() {
            Err(error) if C::is_transient(&error) && started.elapsed() < RETRY_WINDOW => {
                std::thread::sleep(backoff(attempts));
            }
            result => return result,
        }
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

fn commit<C: JobStore>(conn: &mut C, call: &Call) -> Result<(), Error> {
    AnsiTransactionManager::commit_transaction(conn).map_err(|e| call.database(Step::Commit, e))
}

/// Rolls back, logging a failure rather than returning it: the caller is already returning the error
/// that made the rollback necessary, and Diesel marks the connection broken if it could not roll
/// back, so a pool will not hand it out again.
fn rollback<C: JobStore>(conn: &mut C, call: &Call) {
    if let Err(error) = AnsiTransactionManager::rollback_transaction(conn) {
        tracing::error!(job = call.job.name(), %error, "rolling back the job's transaction failed");
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use diesel::prelude::*;

    use crate::{Error, Job, JobKey, run};

    fn done(conn: &mut SqliteConnection) -> i64 {
        crate::schema::done_jobs::table
            .count()
            .get_result(conn)
            .expect("count")
    }

    #[test]
    fn a_result_that_would_not_replay_fails_the_first_run_instead() {
        static JOB: Job = Job::new("not_storable", "k:<n>");
        let mut conn = SqliteConnection::establish(":memory:").expect("SQLite");
        crate::migrate(&mut conn).expect("migrations");

        // serde_json writes NaN as null, which does not read back as an f64.
        let nan = run(&mut conn, &JOB, &JobKey::new("k:1"), |_| {
            Ok::<f64, Error>(f64::NAN)
        });
        assert!(matches!(nan, Err(Error::StoreResult { .. })), "{nan:?}");
        // Maps need string keys in JSON.
        let map = run(&mut conn, &JOB, &JobKey::new("k:2"), |_| {
            Ok::<_, Error>(std::collections::HashMap::from([((1, 2), 3)]))
        });
        assert!(matches!(map, Err(Error::StoreResult { .. })), "{map:?}");
        assert_eq!(done(&mut conn), 0, "both rolled back, claims included");

        let fine = run(&mut conn, &JOB, &JobKey::new("k:3"), |_| {
            Ok::<f64, Error>(1.5)
        });
        assert_eq!(fine.expect("a number").into_inner(), 1.5);
        assert_eq!(done(&mut conn), 1);
    }
}
