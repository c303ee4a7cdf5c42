//! One call of a job: the public [`JobCall`] a caller builds, and the [`Call`] the lifecycle
//! computes from it once (digest, key as shown, fingerprint, how long the key holds).

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::context::{self, JobContext};
use crate::error::{Error, Step};
use crate::fingerprint::{Compared, Fingerprint, FingerprintError};
use crate::job::Job;
use crate::key::JobKey;

use crate::stats::{self, Ending};
use crate::store::{Claim, Database, DoneRow};

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

#[diagnostic::do_not_recommend]
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

#[diagnostic::do_not_recommend]
impl<T: Serialize + DeserializeOwned> JobOutput for T {}

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
/// let mut charge = |amount: u64| -> Result<_, Error> {
///     let fingerprint = Fingerprint::builder().input("amount", &amount).finish().expect("a number serializes");
///     JobCall::new(&CHARGE, &key).fingerprint(fingerprint).run(&mut conn, |_| Ok::<_, Error>(amount))
/// };
/// assert!(charge(4200)?.is_ran());
/// assert!(charge(4200)?.is_replayed());
/// assert!(matches!(charge(9900), Err(Error::FingerprintMismatch { .. })));
/// # Ok::<(), Error>(())
/// ```
#[must_use = "a JobCall does nothing until it is run"]
pub struct JobCall<'a> {
    pub(crate) job: &'static Job,
    pub(crate) key: &'a JobKey,
    pub(crate) fingerprint: Option<Result<Fingerprint, FingerprintError>>,
    pub(crate) retry_window: Option<std::time::Duration>,
    pub(crate) in_progress: Option<crate::job::WhileInProgress>,
    pub(crate) redelivered: Option<bool>,
}

impl fmt::Debug for JobCall<'_> {
    /// Shows the key as events and errors do: redacted when the job redacts its keys.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobCall")
            .field("job", &self.job.name())
            .field("key", &shown_key(self.job, self.key))
            .field("fingerprint", &self.fingerprint)
            .field("retry_window", &self.retry_window)
            .field("in_progress", &self.in_progress)
            .field("redelivered", &self.redelivered)
            .finish()
    }
}

impl<'a> JobCall<'a> {
    /// A call of `job` with `key`.
    pub fn new(job: &'static Job, key: &'a JobKey) -> Self {
        Self {
            job,
            key,
            fingerprint: None,
            retry_window: None,
            in_progress: None,
            redelivered: None,
        }
    }

    /// Tells the call whether its message is a redelivery (as the broker reports it), in place of
    /// [`redelivered`](crate::redelivered)'s scope: a redelivery reads its key before opening a
    /// transaction and replays a committed result at once (unless reading first is off, see
    /// [`allow_read_first`](crate::redelivery::allow_read_first), or the caller's transaction is
    /// open); a first delivery never reads first. See [`crate::redelivery`].
    pub fn redelivered(mut self, redelivered: bool) -> Self {
        self.redelivered = Some(redelivered);
        self
    }

    /// What this call does while another run of its key is in progress, instead of the job's
    /// policy; see [`WhileInProgress`](crate::WhileInProgress).
    pub fn while_in_progress(mut self, policy: crate::job::WhileInProgress) -> Self {
        self.in_progress = Some(policy);
        self
    }

    /// How long a claim is retried while the database reports transient failures (busy, deadlocks,
    /// lock wait timeouts) before the call gives up with [`Error::ClaimRetriesExhausted`]; 30 s
    /// unless set. Nothing has run while a claim is retried.
    pub fn retry_for(mut self, window: std::time::Duration) -> Self {
        self.retry_window = Some(window);
        self
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
}

/// The key as the job shows it in events, errors and `job_key`: readable, or redacted.
fn shown_key(job: &Job, key: &JobKey) -> String {
    if job.redacts_key() {
        redacted(&key.digest())
    } else {
        key.readable().into_owned()
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

/// One call of a job: everything its steps need, computed once.
pub(crate) struct Call {
    pub(crate) job: &'static Job,
    /// The key as shown in events and errors and stored in `job_key`: readable, or redacted.
    pub(crate) key_text: String,
    pub(crate) digest: [u8; 32],
    pub(crate) fingerprint: Option<Fingerprint>,
    /// What the claim stores of the fingerprint ([`Fingerprint::stored`]).
    stored_fingerprint: Option<[u8; 64]>,
    /// How long the key holds after the commit, in microseconds.
    pub(crate) keep_micros: Option<i64>,
    pub(crate) started: Instant,
    /// How long transient claim failures are retried.
    pub(crate) retry_window: std::time::Duration,
    /// How long the claim may wait for another run of the key; `None`: until it ends.
    pub(crate) in_progress: Option<std::time::Duration>,
    /// What the body can ask about its job: its key, its outbox messages so far.
    pub(crate) context: Arc<JobContext>,
    /// Read the key before claiming it: a redelivery, or a job whose calls mostly replay.
    pub(crate) read_first: bool,
    /// The job runs inside a transaction of the caller's (in a savepoint of it): a failure's
    /// retry is that transaction's, from its start. Set once the claim's transaction is open.
    pub(crate) enclosing: std::sync::atomic::AtomicBool,
}

impl Call {
    /// The call of `job_call` on the connection at address `connection`.
    pub(crate) fn new(job_call: JobCall<'_>, connection: usize) -> Result<Self, Error> {
        let JobCall {
            job,
            key,
            fingerprint,
            retry_window,
            in_progress,
            redelivered,
        } = job_call;
        let digest = key.digest();
        let key_text = shown_key(job, key);
        crate::identity::check(job)
            .inspect_err(|_| stats::finished(job, Ending::Error, Instant::now()))?;
        let fingerprint = fingerprint
            .transpose()
            .map_err(|source| Error::Fingerprint {
                job: job.name(),
                key: key_text.clone(),
                source,
            })?;
        let keep_micros = job
            .keep()
            .map(|keep| crate::time::micros(keep, "the job's `keep`"))
            .transpose()?;
        Ok(Self {
            job,
            context: JobContext::new(
                key.clone(),
                digest,
                job.name(),
                key_text.clone(),
                connection,
                fingerprint.as_ref().map(|f| *f.as_bytes()),
            ),
            key_text,
            digest,
            stored_fingerprint: fingerprint.as_ref().map(Fingerprint::stored),
            fingerprint,
            keep_micros,
            started: Instant::now(),
            retry_window: retry_window.unwrap_or(crate::retry::WINDOW),
            in_progress: in_progress.unwrap_or(job.in_progress()).bound(),
            read_first: crate::redelivery::read_first_allowed()
                && redelivered
                    .or_else(crate::redelivery::current)
                    .unwrap_or_else(|| job.counters.mostly_replays()),
            enclosing: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Whether the job runs inside a transaction of the caller's.
    pub(crate) fn enclosing(&self) -> bool {
        self.enclosing.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn span(&self) -> tracing::Span {
        tracing::info_span!("idempotent.job", job = self.job.name(), key = %self.key_text)
    }

    /// What the claim writes; `stores_result`: the run records a result, and the row reads as
    /// unfinished until it does.
    pub(crate) fn claim(&self, stores_result: bool) -> Claim<'_> {
        Claim {
            digest: &self.digest,
            token: self.context.claim_token(),
            key: &self.key_text,
            job: self.job.name(),
            fingerprint: self.stored_fingerprint.as_ref().map(|f| &f[..]),
            result: stores_result.then_some(crate::store::UNFINISHED),
            own: false,
        }
    }

    /// The error for a statement of `step` that `D` refused: a commit whose connection failed has
    /// an unknown outcome; anything else rolled back, and may pass. Inside a caller's transaction
    /// the job's "commit" is the release of its savepoint, which commits nothing: a connection
    /// that failed there took the caller's whole transaction with it, uncommitted, and the retry is
    /// that transaction's (a retry of the call alone, on another connection, would run the job
    /// outside it).
    pub(crate) fn database<D: Database>(&self, step: Step, source: diesel::result::Error) -> Error {
        let lost = D::connection_lost(&source);
        if step == Step::Commit && lost && !self.enclosing() {
            return Error::CommitOutcomeUnknown {
                job: self.job.name(),
                key: self.key_text.clone(),
                source,
            };
        }
        Error::Database {
            job: self.job.name(),
            key: self.key_text.clone(),
            step,
            enclosing: self.enclosing(),
            retryable: D::passes(&source),
            source,
        }
    }

    /// Whether an enclosing body on this thread already holds this key: for this job on the same
    /// connection, the call is part of that run (`Ok(true)`). On another connection it would run
    /// with no claim of its own, or wait for its own enclosing transaction; for another job, the
    /// key is that job's. Both are errors.
    pub(crate) fn inside_own_claim(&self) -> Result<bool, Error> {
        let Some(enclosing) = context::enclosing_claim(&self.digest) else {
            return Ok(false);
        };
        if enclosing.job != self.job.name() {
            return Err(self.failed(Error::KeyClaimedByOtherJob {
                job: self.job.name(),
                key: self.key_text.clone(),
                claimed_by: enclosing.job.to_owned(),
            }));
        }
        if enclosing.connection != self.context.connection {
            return Err(self.failed(Error::OwnKeyOnAnotherConnection {
                job: self.job.name(),
                key: self.key_text.clone(),
            }));
        }
        // Other inputs than the enclosing run's, as a call at the top would be refused once that
        // run committed (it ran, and said `Ran` with a value the key never replays).
        if let (Some(enclosing), Some(ours)) = (&enclosing.fingerprint, &self.context.fingerprint)
            && enclosing != ours
        {
            return Err(self.failed(Error::FingerprintMismatch {
                job: self.job.name(),
                key: self.key_text.clone(),
                inputs: self.job.fingerprint_input_names().join(", "),
            }));
        }
        Ok(true)
    }

    /// Records how the call ended.
    pub(crate) fn finished(&self, ending: Ending) {
        stats::finished(self.job, ending, self.started);
    }

    /// Records a call that ended in `error`, and passes the error on.
    pub(crate) fn failed(&self, error: Error) -> Error {
        if error.needs_operator() {
            let mut causes = String::new();
            let mut cause = std::error::Error::source(&error);
            while let Some(source) = cause {
                causes.push_str(": ");
                causes.push_str(&source.to_string());
                cause = source.source();
            }
            tracing::error!(%error, causes, "the database may hold what the failed job left: look at the key");
        }
        self.finished(match &error {
            Error::FingerprintMismatch { .. } => Ending::FingerprintMismatch,
            Error::KeyClaimedByOtherJob { .. } => Ending::KeyConflict,
            Error::InProgress { .. } => Ending::InProgress,
            _ => Ending::Error,
        });
        error
    }

    /// The JSON to store for `value`; `None` when it is `null` (as `()` is), which is what an
    /// empty `result` column reads back as.
    ///
    /// The JSON must read back as a `T`, or the first replay would fail where this run succeeded:
    /// serde_json writes a NaN as `null`, and some `Serialize` impls have no matching
    /// `Deserialize`; nor must it read back as another value (a NaN inside an `Option`, or
    /// `Some(())` and `Some(None)`, read back as `None`; an untagged enum's other variant): the
    /// [`Shape`](crate::shape::Shape)s of the value and of what its JSON reads back as must be
    /// equal. Such a value fails this run instead, rolled back, while its cause is at hand.
    ///
    /// `equal`: the result type's `PartialEq`, where the attribute's wrapper found one. Values
    /// serde writes alike (an untagged enum's variants of the same content, a field serde skips)
    /// have equal shapes; `==` tells them apart.
    ///
    /// `ran` is the body's result (an `Err` stores nothing).
    pub(crate) fn encode<T: JobOutput, E>(
        &self,
        ran: &Result<T, E>,
        equal: Equality<Result<T, E>>,
    ) -> Result<Option<String>, Error> {
        let Ok(value) = ran else {
            return Ok(None);
        };
        let stored = crate::fingerprint::refuse_non_finite(value)
            .and_then(|()| serde_json::to_string(value))
            .and_then(|json| {
                let back = serde_json::from_str::<T>(&json)?;
                same_shape(value, &back)?;
                match equal.equal(ran, &Ok(back)) {
                    Some(false) => Err(unequal()),
                    _ => Ok(json),
                }
            });
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
        // A row from before the job had a fingerprint, or a call without one, is not compared;
        // nor one of other inputs than the call's (the job's fingerprint changed since).
        if let (Some(stored), Some(ours)) = (&row.fingerprint, &self.fingerprint) {
            match ours.compare_stored(stored) {
                Compared::Same => {}
                Compared::OtherInputs => tracing::warn!(
                    job = self.job.name(),
                    key = %self.key_text,
                    inputs = %self.job.fingerprint_input_names().join(", "),
                    "the key's first run stored a fingerprint of other inputs (the job's fingerprint changed since): not compared; its result replays"
                ),
                Compared::Differs => {
                    return Err(Error::FingerprintMismatch {
                        job: self.job.name(),
                        key: self.key_text.clone(),
                        inputs: self.job.fingerprint_input_names().join(", "),
                    });
                }
            }
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

/// The `PartialEq` of the `Ok` type of a handler's return type `R` (a `Result`), where the
/// attribute's wrapper found one; [`none`](Equality::none) elsewhere. Values serde writes alike
/// (an untagged enum's variants of the same content, a field serde skips) are told apart only by
/// `==`. Named by `R` rather than by its `Ok` type, so that a return type that is no `Result`
/// is reported once, where the wrapper calls the runner.
pub struct Equality<R> {
    /// Whether two `Ok`s are equal (`true` for anything else).
    equal: Option<fn(&R, &R) -> bool>,
}

impl<R> Clone for Equality<R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R> Copy for Equality<R> {}

impl<R> Equality<R> {
    /// No `PartialEq`: values are compared as serde shows them.
    pub const fn none() -> Self {
        Self { equal: None }
    }
}

impl<T, E> Equality<Result<T, E>> {
    /// `T`'s `==`.
    pub fn partial_eq() -> Self
    where
        T: PartialEq,
    {
        Self {
            equal: Some(|a, b| match (a, b) {
                (Ok(a), Ok(b)) => a == b,
                _ => true,
            }),
        }
    }

    /// Whether `a == b`, where `T`'s `==` is known.
    fn equal(self, a: &Result<T, E>, b: &Result<T, E>) -> Option<bool> {
        self.equal.map(|equal| equal(a, b))
    }
}

/// Whether `back`, read from the JSON of `value`, is the same value as serde shows it: their
/// [`Shape`](crate::shape::Shape)s are equal.
fn same_shape<T: serde::Serialize>(value: &T, back: &T) -> Result<(), serde_json::Error> {
    use serde::ser::Error as _;
    let shape = |value: &T| crate::shape::Shape::of(value).map_err(serde_json::Error::custom);
    if shape(value)? == shape(back)? {
        Ok(())
    } else {
        Err(serde_json::Error::custom(
            "it reads back from its JSON as another value (`Some(())` or `Some(None)` as `None`, \
             an untagged enum as another of its variants): a replay would return another answer",
        ))
    }
}

/// A value that reads back from its JSON as one its type's `PartialEq` calls unequal.
fn unequal() -> serde_json::Error {
    use serde::ser::Error as _;
    serde_json::Error::custom(
        "it reads back from its JSON as another value, by its type's `PartialEq` (an untagged \
         enum's variant of the same content as another's, a field serde skips or fills with a \
         default, a flattened `Option`): a replay would return another answer",
    )
}

#[cfg(test)]
mod tests {
    use crate::{Job, JobCall, JobKey};

    #[test]
    fn a_call_of_a_redacting_job_never_shows_its_key() {
        static WELCOME: Job = Job::new("welcome", "welcome:<email>").redact_key();
        let key = JobKey::new("welcome:ada@example.com");
        let shown = format!("{:?}", JobCall::new(&WELCOME, &key));
        assert!(!shown.contains("ada@example.com"), "{shown}");
        assert!(shown.contains("redacted:"), "{shown}");
        static PLAIN: Job = Job::new("plain", "plain:<n>");
        let key = JobKey::new("plain:7");
        assert!(format!("{:?}", JobCall::new(&PLAIN, &key)).contains("plain:7"));
    }
}
