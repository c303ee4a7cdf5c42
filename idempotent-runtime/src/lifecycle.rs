//! One job call, start to end, written once for sync and async connections.
//!
//! The rule from the
//! <a href="https://agentwranglers.se/playbook/scaling/background-jobs-and-queues/idempotent-jobs">Agent Wranglers scaling playbook</a>,
//! in code: the key is recorded under a unique constraint in the same transaction as the work,
//! and a key that is already there means the work is done.
//!
//! The steps, in order: **begin and claim** (retried from `BEGIN` while the database is busy or
//! reports a deadlock: nothing has run yet); then **replay** (the key was claimed: check the job
//! and the fingerprint, decode the stored result) or **run** (the body, with its key current);
//! then **record** (the result, and the start of `keep`, just before the commit) and **commit**,
//! or **roll back**.
//!
//! Every exit that is not a commit rolls back, whatever ends the call: an `Err`, a panic in the
//! body or in the result's `Serialize` or `Deserialize` (caught, rolled back, then resumed), or a
//! dropped future. The last is the job of [`Transaction`], a guard that rolls back on a sync
//! connection and marks an async connection broken when it is dropped unfinished.
//!
//! Sync and async share this code: it is async, and a sync call drives it with
//! [`drive::block_on`](crate::drive::block_on); see [`crate::store`] for why that is exact.

use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::pin::pin;
use std::task::Poll;

use tracing::Instrument as _;

use crate::call::{Call, JobCall, JobError, JobOutput};
use crate::context;
use crate::error::{Error, Step};
use crate::outcome::Outcome;
use crate::retry::Retry;
use crate::stats::Ending;
use crate::store::{ClaimAttempt, Database, DoneRow, Nesting, Store};
use crate::transaction::{Transaction, itself};

impl JobCall<'_> {
    /// Runs the call on a sync connection; see [`run`](crate::run).
    pub fn run<C, T, E, F>(self, conn: &mut C, body: F) -> Result<Outcome<T>, E>
    where
        C: crate::connection::JobStore,
        T: JobOutput,
        E: JobError,
        F: FnOnce(&mut C) -> Result<T, E>,
    {
        run_sync(conn, C::idempotent_store, self, body)
    }

    /// Runs the call on an async connection; see [`run_async`](crate::run_async).
    #[cfg(feature = "async")]
    #[cfg_attr(docsrs, doc(cfg(feature = "async")))]
    pub async fn run_async<C, T, E, F>(self, conn: &mut C, body: F) -> Result<Outcome<T>, E>
    where
        C: crate::connection::AsyncJobStore,
        T: JobOutput,
        E: JobError,
        F: AsyncFnOnce(&mut C) -> Result<T, E>,
    {
        run(conn, C::idempotent_store, self, body).await
    }
}

/// [`run`] on a sync connection, driven to completion on this thread.
pub(crate) fn run_sync<Conn, S, R, T, E, F>(
    conn: &mut Conn,
    reach: R,
    job_call: JobCall<'_>,
    body: F,
) -> Result<Outcome<T>, E>
where
    Conn: ?Sized,
    S: Store,
    R: Fn(&mut Conn) -> &mut S,
    T: JobOutput,
    E: JobError,
    F: FnOnce(&mut Conn) -> Result<T, E>,
{
    crate::drive::block_on(run(conn, reach, job_call, async move |conn: &mut Conn| {
        body(conn)
    }))
}

/// One job call: see the [module docs](self). `reach` finds the runtime's connection inside the
/// caller's (a pooled connection derefs to it); the body gets the caller's own.
pub(crate) async fn run<Conn, S, R, T, E, F>(
    conn: &mut Conn,
    reach: R,
    job_call: JobCall<'_>,
    body: F,
) -> Result<Outcome<T>, E>
where
    Conn: ?Sized,
    S: Store,
    R: Fn(&mut Conn) -> &mut S,
    T: JobOutput,
    E: JobError,
    F: AsyncFnOnce(&mut Conn) -> Result<T, E>,
{
    let connection = std::ptr::from_mut::<S>(reach(conn)) as usize;
    let call = Call::new(job_call, connection)?;
    if call.inside_own_claim()? {
        // The enclosing run of this job holds the key on this connection: run as part of it.
        return body(conn).await.map(Outcome::Ran);
    }
    let span = call.span();
    steps(conn, reach, &call, body).instrument(span).await
}

/// What the steps between the claim and the commit produced.
enum Produced<T, E> {
    Replayed(Result<T, Error>),
    Ran(T, Result<Option<String>, Error>),
    Failed(E),
}

async fn steps<Conn, S, R, T, E, F>(
    conn: &mut Conn,
    reach: R,
    call: &Call,
    body: F,
) -> Result<Outcome<T>, E>
where
    Conn: ?Sized,
    S: Store,
    R: Fn(&mut Conn) -> &mut S,
    T: JobOutput,
    E: JobError,
    F: AsyncFnOnce(&mut Conn) -> Result<T, E>,
{
    if call.read_first
        && let Some(value) = replay_before_claim::<S, T>(reach(conn), call).await
    {
        return Ok(Outcome::Replayed(value));
    }
    let (nesting, claimed) = begin_and_claim(reach(conn), call)
        .await
        .map_err(|e| call.failed(e))?;
    // No `.await` between the claim's guard handing over and this one taking charge.
    let mut transaction = Transaction::opened(conn, reach);
    tracing::debug!(?nesting, replay = claimed.is_some(), "claimed key");
    let first_done_micros = claimed.as_ref().map(|row| row.done_at_micros);

    let produced = catch_panic(async {
        match claimed {
            Some(row) => Produced::Replayed(call.replay::<T>(row)),
            None => {
                let running = body(transaction.conn());
                match with_context(call, running).await {
                    Ok(value) => {
                        let json = call.encode(&value);
                        Produced::Ran(value, json)
                    }
                    Err(error) => Produced::Failed(error),
                }
            }
        }
    })
    .await;

    if let Ok(Produced::Ran(..) | Produced::Failed(_)) = &produced {
        // A statement of the body may have committed the transaction behind our back (MySQL's
        // implicit commits): then nothing below would be atomic with the work.
        match S::Db::transaction_ended_early(transaction.store(), nesting).await {
            Ok(false) => {}
            Ok(true) => {
                transaction.rollback().await;
                // Either a statement of the body committed the transaction, claim included, or
                // the database rolled it back (a caught deadlock; on Galera, a write certified on
                // another node), and the key's row, if any, is another run's. Only this run's own
                // claim is taken back, so that the key is not "done" for a run that did not
                // finish in one transaction; another run's is never touched.
                let token = call.context.claim_token();
                let error = match S::Db::take_back(transaction.store(), &call.digest, token).await {
                    Ok(false) => Error::TransactionRolledBackInBody {
                        job: call.job.name(),
                        key: call.key_text.clone(),
                    },
                    Ok(true) => Error::TransactionEndedInBody {
                        job: call.job.name(),
                        key: call.key_text.clone(),
                    },
                    Err(error) => {
                        tracing::error!(%error, "taking back the claim of a job whose transaction ended early failed");
                        Error::TransactionEndedInBody {
                            job: call.job.name(),
                            key: call.key_text.clone(),
                        }
                    }
                };
                return Err(call.failed(error).into());
            }
            Err(error) => {
                transaction.rollback().await;
                return Err(call
                    .failed(call.database::<S::Db>(Step::Record, error))
                    .into());
            }
        }
    }

    match produced {
        Err(panic) => {
            transaction.rollback().await;
            call.finished(Ending::Panicked);
            resume_unwind(panic)
        }
        Ok(Produced::Failed(error)) => {
            transaction.rollback().await;
            call.finished(Ending::Failed);
            Err(error)
        }
        Ok(Produced::Replayed(Err(error)) | Produced::Ran(_, Err(error))) => {
            transaction.rollback().await;
            Err(call.failed(error).into())
        }
        Ok(Produced::Replayed(Ok(value))) => {
            transaction
                .commit()
                .await
                .map_err(|e| call.failed(call.database::<S::Db>(Step::Commit, e)))?;
            match first_done_micros {
                Some(micros) => crate::stats::replayed(call.job, call.started, micros),
                None => call.finished(Ending::Replayed),
            }
            Ok(Outcome::Replayed(value))
        }
        Ok(Produced::Ran(value, Ok(json))) => {
            if let Err(error) = record(transaction.store(), call, json.as_deref()).await {
                transaction.rollback().await;
                return Err(call.failed(error).into());
            }
            transaction
                .commit()
                .await
                .map_err(|e| call.failed(call.database::<S::Db>(Step::Commit, e)))?;
            call.finished(Ending::Ran);
            Ok(Outcome::Ran(value))
        }
    }
}

/// A redelivery's read before any transaction (see [`crate::redelivery`]): the stored result of
/// a committed, live row of this job with this fingerprint, replayed with no transaction and no
/// lock. `None` sends the call down the usual path, whatever the reason (no row, lapsed, another
/// job's, another fingerprint, a failed read, or a transaction of the caller's already open), and
/// the claim decides there, under the key's lock.
async fn replay_before_claim<S: Store, T: JobOutput>(store: &mut S, call: &Call) -> Option<T> {
    if store.transaction_depth().ok()? != 0 {
        return None;
    }
    let row = match S::Db::done_row(store, &call.digest).await {
        Ok(Some(row)) if !row.lapsed => row,
        Ok(_) => return None,
        Err(error) => {
            crate::redelivery::read_failed(&error);
            return None;
        }
    };
    let first_done_micros = row.done_at_micros;
    match catch_unwind(AssertUnwindSafe(|| call.replay::<T>(row))) {
        Ok(Ok(value)) => {
            crate::stats::replayed(call.job, call.started, first_done_micros);
            Some(value)
        }
        Ok(Err(_)) => None,
        Err(panic) => {
            // Nothing is open to roll back.
            call.finished(Ending::Panicked);
            resume_unwind(panic)
        }
    }
}

/// Stores the result and starts `keep`, when there is either; refuses a result larger than the
/// database takes in one statement before sending it.
async fn record<S: Store>(store: &mut S, call: &Call, json: Option<&str>) -> Result<(), Error> {
    if json.is_none() && call.keep_micros.is_none() {
        return Ok(());
    }
    if let Some(json) = json {
        let limit = S::Db::result_too_large(store, json.len())
            .await
            .map_err(|e| call.database::<S::Db>(Step::Record, e))?;
        if let Some(limit) = limit {
            return Err(Error::ResultTooLarge {
                job: call.job.name(),
                key: call.key_text.clone(),
                bytes: json.len(),
                limit,
            });
        }
    }
    S::Db::record(store, &call.digest, json, call.keep_micros)
        .await
        .map_err(|e| call.database::<S::Db>(Step::Record, e))
}

/// Polls `future` with the call's key current, on whichever thread polls it.
async fn with_context<O>(call: &Call, future: impl Future<Output = O>) -> O {
    let mut future = pin!(future);
    poll_fn(|cx| {
        context::enter(&call.context, || {
            crate::redelivery::cleared(|| future.as_mut().poll(cx))
        })
    })
    .await
}

/// Polls `future`, turning a panic in any poll into `Err` so the transaction can be rolled back
/// before the panic goes on.
async fn catch_panic<O>(
    future: impl Future<Output = O>,
) -> Result<O, Box<dyn std::any::Any + Send>> {
    let mut future = pin!(future);
    poll_fn(
        |cx| match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(panic) => Poll::Ready(Err(panic)),
        },
    )
    .await
}

/// Opens the transaction and claims the key (`None`: claimed now; `Some(row)`: it was already),
/// retrying the whole transaction on transient errors within the retry window.
async fn begin_and_claim<S: Store>(
    store: &mut S,
    call: &Call,
) -> Result<(Nesting, Option<DoneRow>), Error> {
    let claim = call.claim();
    // Where the claim waits at BEGIN for the database's write lock (SQLite), the in-progress bound
    // bounds those retries; elsewhere the database's lock timeout bounds the claim's own wait.
    let window = match call.in_progress {
        Some(bound) if S::Db::WRITE_LOCK_AT_BEGIN => bound.min(call.retry_window),
        _ => call.retry_window,
    };
    let mut retry = Retry::within(window);
    loop {
        let begun = Transaction::begin_bounded(&mut *store, itself::<S>, call.in_progress).await;
        let (step, error) = match begun {
            Err(error) => (Step::Begin, error),
            Ok((mut transaction, nesting)) => {
                match bounded_claim_key(transaction.store(), &claim, call.in_progress).await {
                    Ok(state) => {
                        transaction.hand_over();
                        return Ok((nesting, state));
                    }
                    Err((error, previous)) => {
                        transaction.rollback().await;
                        if let Some(previous) = previous {
                            // MySQL's setting is the session's: put it back after the rollback.
                            if let Err(error) =
                                S::Db::restore_lock_wait(transaction.store(), &previous).await
                            {
                                tracing::warn!(%error, "restoring the lock wait timeout failed");
                            }
                        }
                        if call.in_progress.is_some()
                            && S::Db::classify(&error) == crate::store::Fault::LockTimeout
                        {
                            return Err(in_progress(call, retry.elapsed()));
                        }
                        if nesting == Nesting::Savepoint {
                            // A deadlock or a busy database aborts the caller's whole transaction
                            // on some databases; only the caller can retry that.
                            return Err(call.database::<S::Db>(Step::Claim, error));
                        }
                        (Step::Claim, error)
                    }
                }
            }
        };
        match retry.failed::<S::Db>(&error) {
            Some(_) => {
                crate::stats::retried(call.job, retry.attempts, &error);
                retry.pause::<S>().await;
            }
            None if call.in_progress.is_some()
                && S::Db::classify(&error) == crate::store::Fault::Busy =>
            {
                return Err(in_progress(call, retry.elapsed()));
            }
            None if retry.exhausted::<S::Db>(&error) => {
                return Err(Error::ClaimRetriesExhausted {
                    job: call.job.name(),
                    key: call.key_text.clone(),
                    attempts: retry.attempts,
                    waited: retry.elapsed(),
                    causes: retry.explain(),
                    source: error,
                });
            }
            None => return Err(call.database::<S::Db>(step, error)),
        }
    }
}

/// The claim, its wait for another run of the key bounded by `bound` (the database's lock
/// timeout, put back before the body runs). On failure, the setting to put back after the rollback.
async fn bounded_claim_key<S: Store>(
    store: &mut S,
    claim: &crate::store::Claim<'_>,
    bound: Option<std::time::Duration>,
) -> Result<Option<DoneRow>, (diesel::result::Error, Option<String>)> {
    let previous = match bound {
        Some(limit) => S::Db::bound_lock_wait(store, limit)
            .await
            .map_err(|error| (error, None))?,
        None => None,
    };
    let claimed = claim_key(store, claim).await;
    match (claimed, previous) {
        (Ok(state), Some(previous)) => match S::Db::restore_lock_wait(store, &previous).await {
            Ok(()) => Ok(state),
            Err(error) => Err((error, Some(previous))),
        },
        (Ok(state), None) => Ok(state),
        (Err(error), previous) => Err((error, previous)),
    }
}

fn in_progress(call: &Call, waited: std::time::Duration) -> Error {
    Error::InProgress {
        job: call.job.name(),
        key: call.key_text.clone(),
        waited,
    }
}

/// Claims in the open transaction: each turn either claims, or finds a live row; a row that
/// vanishes (pruned), is not visible yet, or lapses between statements sends it round again.
/// Three turns cover every interleaving of two writers.
async fn claim_key<S: Store>(
    store: &mut S,
    claim: &crate::store::Claim<'_>,
) -> diesel::QueryResult<Option<DoneRow>> {
    for _ in 0..3 {
        match S::Db::claim(store, claim).await? {
            ClaimAttempt::Inserted => return Ok(None),
            ClaimAttempt::Found(row) if !row.lapsed => return Ok(Some(row)),
            ClaimAttempt::Found(_) if S::Db::renew(store, claim).await? => return Ok(None),
            // Renewed by another worker first, pruned, or committed after this statement began.
            ClaimAttempt::Found(_) | ClaimAttempt::Missing => {}
        }
    }
    Err(diesel::result::Error::DatabaseError(
        diesel::result::DatabaseErrorKind::SerializationFailure,
        Box::new(String::from(
            "the claimed key kept changing under the claim (pruned or renewed by other workers)",
        )),
    ))
}
