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

use tracing::Instrument as _;

use crate::call::{Call, Equality, JobCall, JobError, JobOutput};
use crate::context;
use crate::drive::catch_panic;
use crate::error::{Error, Step};
use crate::outcome::Outcome;
use crate::retry::Retry;
use crate::stats::Ending;
use crate::store::{ClaimAttempt, Database, DoneRow, Fault, Finish, Nesting, Store};
use crate::transaction::{Checked, Mark, Ownership, Transaction, itself};

impl JobCall<'_> {
    /// Runs the call on a sync connection; see [`run`](crate::run).
    pub fn run<C, T, E, F>(self, conn: &mut C, body: F) -> Result<Outcome<T>, E>
    where
        C: crate::connection::JobStore,
        T: JobOutput,
        E: JobError,
        F: FnOnce(&mut C) -> Result<T, E>,
    {
        run_sync(conn, C::idempotent_store, self, Equality::none(), body)
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
        run(conn, C::idempotent_store, self, Equality::none(), body).await
    }
}

/// [`run`] on a sync connection, driven to completion on this thread.
pub(crate) fn run_sync<Conn, S, R, T, E, F>(
    conn: &mut Conn,
    reach: R,
    job_call: JobCall<'_>,
    equal: Equality<Result<T, E>>,
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
    crate::drive::block_on(run(
        conn,
        reach,
        job_call,
        equal,
        async move |conn: &mut Conn| body(conn),
    ))
}

/// One job call: see the [module docs](self). `reach` finds the runtime's connection inside the
/// caller's (a pooled connection derefs to it); the body gets the caller's own. `equal`: the
/// result type's `PartialEq`, where the attribute's wrapper found one (see [`Call::encode`]).
pub(crate) async fn run<Conn, S, R, T, E, F>(
    conn: &mut Conn,
    reach: R,
    job_call: JobCall<'_>,
    equal: Equality<Result<T, E>>,
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
        return reentrant(conn, reach, &call, body).await;
    }
    let span = call.span();
    steps(conn, reach, &call, equal, body)
        .instrument(span)
        .await
}

/// A call of a job with its own key from inside its own run, on the same connection: part of that
/// run, whose claim holds the key, in a savepoint of its own, so that a body that fails or panics
/// leaves nothing of its own behind, as any failed call does (it ran bare, and a failed call's
/// writes committed with the enclosing run). Its value is its body's; the enclosing run's is the
/// one stored.
async fn reentrant<Conn, S, R, T, E, F>(
    conn: &mut Conn,
    reach: R,
    call: &Call,
    body: F,
) -> Result<Outcome<T>, E>
where
    Conn: ?Sized,
    S: Store,
    R: Fn(&mut Conn) -> &mut S,
    E: JobError,
    F: AsyncFnOnce(&mut Conn) -> Result<T, E>,
{
    // Inside the enclosing run's transaction: nothing here commits, and a retry is that run's.
    call.enclosing
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let mut transaction = match Transaction::begin(conn, reach).await {
        Ok((transaction, _)) => transaction,
        Err(source) => {
            return Err(call
                .failed(call.database::<S::Db>(Step::Begin, source))
                .into());
        }
    };
    match catch_panic(body(transaction.conn())).await {
        Ok(Ok(value)) => match transaction.commit().await {
            Ok(()) => Ok(Outcome::Ran(value)),
            Err(source) => Err(call
                .failed(call.database::<S::Db>(Step::Body, source))
                .into()),
        },
        Ok(Err(error)) => {
            transaction.rollback().await;
            Err(error)
        }
        Err(panic) => {
            transaction.rollback().await;
            resume_unwind(panic)
        }
    }
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
    equal: Equality<Result<T, E>>,
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
        && !S::READ_FIRST_IN_TRANSACTION
        && reads_outside_safely(reach(conn)).await
        && let Some(value) = replay_before_claim::<S, T>(reach(conn), call).await
    {
        return Ok(Outcome::Replayed(value));
    }
    // A zero-sized result (`()`) has nothing to store: its claim is the whole record. Any other
    // result is recorded by every run, and the claim marks the row unfinished until then.
    let stores_result = std::mem::size_of::<T>() != 0;
    let (nesting, claimed) = match claim_or_replay::<S, T>(reach(conn), call, stores_result).await {
        Ok(Claimed::Open(nesting, claimed)) => (nesting, claimed),
        Ok(Claimed::Replayed(value)) => return Ok(Outcome::Replayed(value)),
        Err(error) => return Err(call.failed(error).into()),
    };
    // No `.await` between the claim's guard handing over and this one taking charge.
    let mut transaction = Transaction::opened(conn, reach).marked(nesting);
    tracing::debug!(?nesting, replay = claimed.is_some(), "claimed key");
    let first_done_micros = claimed.as_ref().map(|row| row.done_at_micros);
    let produced = produce(&mut transaction, call, claimed, equal, body).await;
    let job = JobEnd {
        transaction,
        call,
        nesting,
        stores_result,
    };
    job.end(produced, first_done_micros).await
}

/// Refuses, before anything is sent, a key larger than the database takes in the claim's statement
/// (where the server would close the connection under the claim, on every retry).
async fn key_fits<S: Store>(store: &mut S, call: &Call) -> Result<(), Error> {
    let bytes = call.key_text.len();
    match S::Db::too_large_for_a_statement(store, bytes).await {
        Ok(None) => Ok(()),
        Ok(Some(limit)) => Err(Error::KeyTooLarge {
            job: call.job.name(),
            bytes,
            limit: limit.largest,
            packet: limit.packet,
        }),
        Err(error) => Err(call.database::<S::Db>(Step::Begin, error)),
    }
}

/// Replays the claimed row, or runs the body with its key current; a panic in either (the body's,
/// or the result's `Serialize` or `Deserialize`) comes back as `Err`, for the rollback before it
/// goes on.
async fn produce<Conn, S, R, T, E, F>(
    transaction: &mut Transaction<'_, Conn, S, R>,
    call: &Call,
    claimed: Option<DoneRow>,
    equal: Equality<Result<T, E>>,
    body: F,
) -> Result<Produced<T, E>, Box<dyn std::any::Any + Send>>
where
    Conn: ?Sized,
    S: Store,
    R: Fn(&mut Conn) -> &mut S,
    T: JobOutput,
    F: AsyncFnOnce(&mut Conn) -> Result<T, E>,
{
    catch_panic(async {
        match claimed {
            Some(row) => Produced::Replayed(call.replay::<T>(row)),
            None => {
                let running = body(transaction.conn());
                let result = with_context(call, running).await;
                let json = call.encode(&result, equal);
                match result {
                    Ok(value) => Produced::Ran(value, json),
                    Err(error) => Produced::Failed(error),
                }
            }
        }
    })
    .await
}

/// A job's transaction after its body: what ends it, committed or not.
struct JobEnd<'t, 'c, Conn: ?Sized, S: Store, R: Fn(&mut Conn) -> &mut S> {
    transaction: Transaction<'t, Conn, S, R>,
    call: &'c Call,
    nesting: Nesting,
    /// The job records a result after its body: a claim of its left behind reads as unfinished.
    stores_result: bool,
}

impl<Conn: ?Sized, S: Store, R: Fn(&mut Conn) -> &mut S> JobEnd<'_, '_, Conn, S, R> {
    /// Ends the job after its body (or its replay): commits what ran, rolls back what failed,
    /// and says which.
    async fn end<T: JobOutput, E: JobError>(
        mut self,
        produced: Result<Produced<T, E>, Box<dyn std::any::Any + Send>>,
        first_done_micros: Option<i64>,
    ) -> Result<Outcome<T>, E> {
        let call = self.call;
        // A body that returned `Ok`: before its record and commit. After one that failed, the
        // rollback's reads find an answer out of step (the connection ends broken).
        if matches!(produced, Ok(Produced::Ran(..))) {
            match self.in_step().await {
                Ok(true) => {}
                Ok(false) => {
                    let error = self.out_of_step().await;
                    return Err(call.failed(error).into());
                }
                // As where the record met it: the echo is the first statement after the body.
                Err(source) => {
                    let error = call.database::<S::Db>(Step::Record, source);
                    return Err(call.failed(self.fail_after_body(error).await).into());
                }
            }
        }
        match produced {
            Err(panic) => {
                if let Some(error) = self.end_unfinished(true).await.error(call) {
                    tracing::error!(%error, "the job's body panicked");
                }
                call.finished(Ending::Panicked);
                resume_unwind(panic)
            }
            Ok(Produced::Failed(error)) => match self.end_unfinished(true).await.error(call) {
                None => {
                    call.finished(Ending::Failed);
                    Err(error)
                }
                Some(ended) => Err(call.failed(ended).into()),
            },
            Ok(Produced::Ran(_, Err(error))) => Err(self.fail_after_body(error).await.into()),
            Ok(Produced::Replayed(Err(error))) => {
                self.transaction.rollback().await;
                Err(call.failed(error).into())
            }
            Ok(Produced::Replayed(Ok(value))) => {
                self.finish_replay(first_done_micros).await?;
                Ok(Outcome::Replayed(value))
            }
            Ok(Produced::Ran(value, Ok(json))) => {
                self.record_and_commit(json.as_deref(), self.stores_result)
                    .await
                    .map_err(|error| call.failed(error))?;
                call.finished(Ending::Ran);
                Ok(Outcome::Ran(value))
            }
        }
    }

    /// Ends a replay's transaction (it wrote nothing) and counts the replay; `first_done_micros`:
    /// when the replayed run committed.
    async fn finish_replay(&mut self, first_done_micros: Option<i64>) -> Result<(), Error> {
        let call = self.call;
        if self.nesting == Nesting::Savepoint {
            self.transaction
                .finish_job(self.nesting)
                .await
                .map_err(|finish| call.failed(finish_failed::<S>(call, finish)))?;
        } else {
            // The job's own transaction wrote nothing (its claim found the key taken): one
            // `ROLLBACK` ends it, where `COMMIT` also released the job's savepoint (which, on
            // SQLite and sync MySQL, took a statement of its own to set). What the replay returns
            // was read from the committed row; a rollback that fails marks the connection broken
            // and takes nothing back.
            self.transaction.rollback().await;
        }
        match first_done_micros {
            Some(micros) => crate::stats::replayed(call.job, call.started, micros),
            None => call.finished(Ending::Replayed),
        }
        Ok(())
    }

    /// Whether the connection's answers are in step with its statements after the body
    /// (`Database::answers_in_step`), where its statements are not cancel-safe; `Ok(true)` with
    /// nothing sent elsewhere. An error is the echo's own (a deadlock, a lost connection).
    async fn in_step(&mut self) -> diesel::QueryResult<bool> {
        if S::STATEMENTS_CANCEL_SAFE {
            return Ok(true);
        }
        S::Db::answers_in_step(self.transaction.store(), self.call.context.claim_token()).await
    }

    /// A body that returned `Ok` after it dropped a statement of its own midway (a `timeout`
    /// around a query), on a connection whose statements are not cancel-safe: that statement's
    /// answer comes after the runtime's next statement is sent, and would be read as its answer
    /// (the commit's). The transaction is broken off (`Transaction::break_off`): rolled back, the
    /// connection marked broken. Inside a caller's transaction that `ROLLBACK` ends the caller's
    /// too.
    async fn out_of_step(&mut self) -> Error {
        self.transaction.break_off().await;
        let source = diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::Unknown,
            Box::new(
                "the body dropped a statement of its own before its answer came (a timeout around a query), and the connection's answers fell out of step with its statements: the job's transaction was rolled back and the connection is marked broken; run the job again on another connection"
                    .to_owned(),
            ),
        );
        let call = self.call;
        if self.nesting == Nesting::Savepoint {
            return Error::CallersTransactionRolledBack {
                job: call.job.name(),
                key: call.key_text.clone(),
                step: Step::Body,
                outside: false,
                retryable: true,
                source: Some(source),
            };
        }
        Error::Database {
            job: call.job.name(),
            key: call.key_text.clone(),
            step: Step::Body,
            enclosing: false,
            retryable: true,
            source,
        }
    }

    /// Records the result and commits, when the transaction is still the job's own.
    async fn record_and_commit(
        &mut self,
        json: Option<&str>,
        stores_result: bool,
    ) -> Result<(), Error> {
        // Inside a caller's transaction the claim comes after the job's savepoint (Diesel's), which
        // a statement of the body can roll back to: every job there checks that its claim is
        // still in the transaction, as one that records a result does.
        let check = stores_result || self.nesting == Nesting::Savepoint;
        if check && !stores_result && json.is_none() && self.call.keep_micros.is_none() {
            // A unit job's check and the mark's release in one flight, where that saves a trip.
            let (digest, token) = (&self.call.digest, self.call.context.claim_token());
            match self.transaction.check_and_finish(digest, token).await {
                None => {}
                Some(Checked::Finished) => return Ok(()),
                Some(Checked::ClaimGone) => {
                    return Err(self
                        .fail_after_body(rolled_back_in_body(self.call, false))
                        .await);
                }
                Some(Checked::CheckFailed(error)) => {
                    let error = self.call.database::<S::Db>(Step::Record, error);
                    return Err(self.fail_after_body(error).await);
                }
                Some(Checked::NotOwn(source)) => return Err(self.not_own_at_commit(source).await),
            }
        }
        if let Err(error) = record(self.transaction.store(), self.call, json, check).await {
            return Err(self.fail_after_body(error).await);
        }
        match self.transaction.finish_job(self.nesting).await {
            Ok(()) => Ok(()),
            Err(Finish::NotOwn(source)) => Err(self.not_own_at_commit(source).await),
            Err(finish) => Err(finish_failed::<S>(self.call, finish)),
        }
    }

    /// A step after the body failed with `error`: the transaction ends uncommitted; when the body
    /// had committed the claim itself, that is the error.
    ///
    /// The body returned `Ok` here: a transaction that the database says is no longer the job's
    /// (a statement of the body aborted it, on PostgreSQL any failed statement does), and that
    /// ended with nothing of the job committed, was rolled back in the body, as for a job whose
    /// claim is its whole record; `error` (storing the result "failed") would hide why.
    ///
    /// Inside a caller's transaction the job's savepoint is Diesel's, and the rollback to it
    /// succeeds whether a statement of the body had aborted it or not. Where any failed statement
    /// aborts the transaction (PostgreSQL), a statement of the runtime's that the database refused
    /// because the transaction was aborted already, after a body that returned `Ok`, is read as
    /// the job's own transaction reads it (its savepoint's release is refused): the body left it
    /// aborted, and it was rolled back. A refusal of the statement's own (a trigger, a grant) is
    /// the database's error, in a caller's transaction and in the job's own; before, any refusal
    /// there was read as the body's doing ("retrying is safe", while every retry failed alike).
    async fn fail_after_body(&mut self, error: Error) -> Error {
        let refused = S::Db::A_FAILED_STATEMENT_ABORTS
            && self.nesting == Nesting::Savepoint
            && matches!(&error, Error::Database { source, .. } if S::Db::refused_as_aborted(source));
        // The runtime's own statement failed with an error that ended the whole transaction: the
        // transaction is gone by the database's doing, not the body's.
        let ended_by_it =
            matches!(&error, Error::Database { source, .. } if S::Db::rolled_back_whole(source));
        // In the job's own transaction, the runtime's statement was refused on its own (a
        // trigger, a grant; not for a transaction aborted before it) and that aborted the
        // transaction: the savepoint's release is refused for it, not for the body's doing.
        let aborted_by_it = S::Db::A_FAILED_STATEMENT_ABORTS
            && self.nesting == Nesting::Outermost
            && matches!(&error, Error::Database { source, .. }
                if !S::Db::refused_as_aborted(source) && !S::Db::connection_lost(source));
        let error = match self.end_unfinished(false).await {
            Ended::RolledBackByBody { .. } if ended_by_it => error,
            Ended::RolledBackByBody { outside: false } if aborted_by_it => error,
            // Inside a caller's transaction, that transaction went with it, whole.
            Ended::CallersRolledBack { .. } if ended_by_it => match error {
                Error::Database {
                    job,
                    key,
                    step,
                    retryable,
                    source,
                    ..
                } => Error::CallersTransactionRolledBack {
                    job,
                    key,
                    step,
                    outside: false,
                    retryable,
                    source: Some(source),
                },
                other => other,
            },
            Ended::RolledBackByBody { outside } => rolled_back_in_body(self.call, outside),
            Ended::RolledBack if refused => rolled_back_in_body(self.call, false),
            ended => ended.error(self.call).unwrap_or(error),
        };
        self.call.failed(error)
    }

    /// Ends a job's transaction that will not commit (its body failed or panicked, or a step
    /// after the body did): rolls it back when it is still the job's own; when it is not (a
    /// statement of the body ended or replaced it), ends whatever is open and takes back this
    /// run's claim, in case the body committed it; on a connection that cannot roll back, takes
    /// the claim back too.
    ///
    /// `body_failed`: the body returned `Err` (else a step after a body that returned `Ok` failed).
    async fn end_unfinished(&mut self, body_failed: bool) -> Ended {
        if self.nesting == Nesting::Unmarked {
            // Only a replay keeps a transaction opened without the job's savepoint (the claim
            // found its key taken, `attempt_claim`): nothing of the job's is in it, no savepoint
            // to test, no body to have ended it (a replay whose result's `Deserialize` panicked).
            self.transaction.rollback().await;
            return Ended::RolledBack;
        }
        // Before any statement of the runtime's: a body that returned at the failure that ended
        // its transaction (a MySQL deadlock) ran nothing after it.
        let stopped_at_failure =
            body_failed && S::Db::body_stopped_at_a_failure(self.transaction.store()).await;
        if body_failed {
            // A read of the body's that failed midway may have left its cached statement unable
            // to run again (Diesel's sync MySQL connection): the next delivery would hang in it.
            self.transaction.store().after_failed_read();
        }
        // Where the database answered that the transaction is not the job's, a statement of the
        // body may have committed the claim: a failed take-back leaves it. Where the connection
        // failed, the transaction ended with it, uncommitted.
        let replays = !self.stores_result;
        let committed = |taken, ownership, outside| match taken {
            Ok(true) => Ended::CommittedInBody,
            Ok(false) if ownership == Ownership::NotOwn => Ended::RolledBackByBody { outside },
            Ok(false) => Ended::RolledBack,
            Err(source) if ownership == Ownership::NotOwn => {
                Ended::ClaimKept(ENDED_IN_BODY.to_owned(), source, replays)
            }
            Err(error) => {
                tracing::warn!(%error, "the connection failed under a job that did not finish: its transaction ends with it, uncommitted, unless a statement of its body had committed it");
                Ended::RolledBack
            }
        };
        if self.nesting == Nesting::Savepoint {
            // Only the rollback to Diesel's savepoint can tell whether the caller's transaction is
            // still there.
            let ownership = self.transaction.rollback_to_savepoint().await;
            if ownership == Ownership::Own {
                return self.after_rollback(false, false).await;
            }
            if ownership == Ownership::NotOwn
                && let Some(ended) = self.savepoint_gone(stopped_at_failure, false).await
            {
                return ended;
            }
            let outside = !stopped_at_failure && self.ended_outside(ownership).await;
            return match committed(
                take_back_after_callers_end(self.transaction.store(), self.call).await,
                ownership,
                outside,
            ) {
                // With no transaction open, the caller's is gone: not the job's savepoint alone.
                Ended::RolledBackByBody { outside: true } => {
                    Ended::CallersRolledBack { outside: true }
                }
                ended => ended,
            };
        }
        let ownership = self.transaction.ownership().await;
        if ownership == Ownership::Own {
            let cleared = match S::Db::before_rollback(self.transaction.store()).await {
                Ok(()) => true,
                Err(error) => {
                    tracing::warn!(%error, "preparing to ask whether the rollback undoes everything failed; it is not asked");
                    false
                }
            };
            self.transaction.rollback().await;
            return self.after_rollback(true, cleared).await;
        }
        let outside = !stopped_at_failure && self.ended_outside(ownership).await;
        self.transaction.abort_job(self.nesting).await;
        committed(
            take_back_claim(self.transaction.store(), self.call).await,
            ownership,
            outside,
        )
    }

    /// Inside a caller's transaction, once the job's savepoint turned out gone (its rollback or
    /// release failed, and the connection answered): the mark set before it tells what became of
    /// the caller's transaction ([`Mark`]). `None` where it cannot tell; the job then ends as
    /// before the mark was read.
    ///
    /// - The mark is there (the savepoint's own end failed): the rollback to it undid the job in
    ///   the caller's transaction, which goes on.
    /// - The mark is gone: a statement of the body (or the database) ended the caller's
    ///   transaction, committing or rolling back the claim with it, and whatever transaction is
    ///   open now (one the body began, or MySQL's `autocommit = 0` opened at its next statement)
    ///   is not the caller's: a take-back in it would be undone by the caller's `ROLLBACK`, and
    ///   one the caller commits would commit what the body wrote after the end. That transaction
    ///   is rolled back, and the claim taken back in a transaction of its own.
    ///
    /// `body_ok`: the body returned `Ok` (the result was recorded after its statement).
    async fn savepoint_gone(&mut self, stopped_at_failure: bool, body_ok: bool) -> Option<Ended> {
        match self.transaction.back_to_mark().await {
            Mark::Unknown => None,
            Mark::Restored => Some(Ended::RolledBack),
            Mark::Gone => {
                self.transaction.guard(true);
                let store = self.transaction.store();
                // What the body ran after the end may have run outside any transaction
                // ([`after_end`]); where it did not, the rollback here undoes it.
                let after = after_end(store).await;
                let outside = !stopped_at_failure && after.outside;
                if let Err(error) = store.batch(S::Db::ROLLBACK).await {
                    tracing::debug!(%error, "no transaction was open after the caller's ended");
                }
                let taken = take_back_on_its_own(self.transaction.store(), self.call).await;
                // Diesel still counts the caller's transaction: a new one, empty, stands for it,
                // so that the caller's `ROLLBACK` (the `?` on this error) ends it, and Diesel
                // returns the job's error rather than "no transaction is active".
                let enclosing = self.transaction.enclosing().unwrap_or(1);
                let store = self.transaction.store();
                // A plain `BEGIN` (on SQLite a deferred one, which takes no lock until written),
                // with Diesel's savepoints of a caller nested deeper, for its rollbacks to find.
                match store.batch(&stand_in::<S::Db>(enclosing)).await {
                    Ok(()) => store.count_transactions(enclosing),
                    Err(error) => {
                        tracing::warn!(%error, "opening a transaction for the caller's to end failed");
                        store.count_transactions(0);
                    }
                }
                self.transaction.guard(false);
                Some(match taken {
                    Ok(true) => Ended::CommittedInBody,
                    Ok(false) => Ended::CallersRolledBack { outside },
                    Err(source) => Ended::ClaimKept(
                        match body_ok {
                            true => ENDED_BEFORE_COMMIT,
                            false => ENDED_IN_BODY,
                        }
                        .to_owned(),
                        source,
                        !self.stores_result || (body_ok && !after.open),
                    ),
                })
            }
        }
    }

    /// Asked before the runtime ends a transaction that the database said is no longer the
    /// job's: whether what the body ran after its end may have run outside any transaction, each
    /// statement committed on its own ([`after_end`]). The call then says such statements may be
    /// committed.
    async fn ended_outside(&mut self, ownership: Ownership) -> bool {
        ownership == Ownership::NotOwn && after_end(self.transaction.store()).await.outside
    }

    /// After a rollback the database reported done: on a connection that has no rollback, the
    /// claim is taken back (in a transaction of its own when `own`, else in the caller's).
    async fn after_rollback(&mut self, own: bool, cleared: bool) -> Ended {
        let store = self.transaction.store();
        let why = match S::Db::rollback_left(store, cleared).await {
            Ok(Some(why)) => why,
            Ok(None) => return Ended::RolledBack,
            Err(error) => {
                tracing::warn!(%error, "asking whether the rollback undid everything failed");
                return Ended::RolledBack;
            }
        };
        if !S::Db::PARTIAL_ROLLBACK_MAY_KEEP_THE_CLAIM {
            // The claim's table rolled back: there is nothing to take back.
            return Ended::NoRollback(why);
        }
        let call = self.call;
        let taken = match own {
            true => take_back_claim(store, call).await,
            false => S::Db::take_back(store, &call.digest, call.context.claim_token()).await,
        };
        match taken {
            Ok(_) => Ended::NoRollback(why),
            Err(source) => Ended::ClaimKept(
                format!(
                    "its transaction could not be rolled back whole: {why}; what the body wrote there may be in the database"
                ),
                source,
                !self.stores_result,
            ),
        }
    }

    /// The job's transaction turned out not to be its own at the commit (`source` said so):
    /// nothing the runtime did was committed; the body may have committed the claim (then taken
    /// back here) or not.
    async fn not_own_at_commit(&mut self, source: diesel::result::Error) -> Error {
        let source = match lost_unnamed(self.transaction.store(), source).await {
            Ok(lost) => {
                // The connection failed at the end of the job: not a statement of the body.
                self.transaction.store().forget_transaction(true);
                return self.call.database::<S::Db>(Step::Commit, lost);
            }
            Err(source) => source,
        };
        let commit_failed = self.nesting != Nesting::Savepoint
            && S::Db::commit_failed_instead(self.transaction.store(), &source).await;
        let after = after_end(self.transaction.store()).await;
        self.transaction.abort_job(self.nesting).await;
        if self.nesting == Nesting::Savepoint
            && Ownership::from_failure::<S::Db>(&source) == Ownership::NotOwn
            && let Some(ended) = self.savepoint_gone(false, true).await
        {
            // Rolled back to the mark, which was there after all: the release's own failure.
            return ended
                .error(self.call)
                .unwrap_or_else(|| self.call.database::<S::Db>(Step::Commit, source));
        }
        if self.nesting == Nesting::Savepoint && S::Db::A_FAILED_STATEMENT_ABORTS && after.open {
            // The release of Diesel's savepoint failed with the caller's transaction still open:
            // the body had released it (the claim, checked by the record, was still there), and
            // the failed release aborted the whole transaction, which nothing can commit now.
            return Error::CallersTransactionAborted {
                job: self.call.job.name(),
                key: self.call.key_text.clone(),
            };
        }
        let taken = match self.nesting {
            Nesting::Savepoint => {
                take_back_after_callers_end(self.transaction.store(), self.call).await
            }
            Nesting::Outermost | Nesting::Unmarked => {
                take_back_claim(self.transaction.store(), self.call).await
            }
        };
        match taken {
            Ok(true) => ended_in_body(self.call),
            // Nothing of the run is committed, and the error may be the `COMMIT`'s own (a
            // deferred trigger's): it, not the body, says what happened.
            Ok(false) if commit_failed => self.call.database::<S::Db>(Step::Commit, source),
            Ok(false) if after.outside && self.nesting == Nesting::Savepoint => {
                callers_rolled_back(self.call, true)
            }
            Ok(false) => rolled_back_in_body(self.call, after.outside),
            // The result was recorded after the body's statement. Where no transaction was open
            // any more (the body's `COMMIT` alone, or no answer), the record ran outside any, and
            // a committed row of it reads as finished, whatever the job returns. Where one was (the
            // body's `COMMIT; BEGIN`), the record ran in it and was rolled back with it: the claim
            // of a job that records a result reads as unfinished, and the next delivery runs it.
            Err(error) => match Ownership::from_failure::<S::Db>(&source) {
                Ownership::NotOwn => claim_kept(
                    self.call,
                    ENDED_BEFORE_COMMIT.to_owned(),
                    error,
                    !after.open || !self.stores_result,
                ),
                // The connection failed at the commit (inside a caller's transaction, releasing
                // Diesel's savepoint): the transaction ended with it, uncommitted.
                _ => self.call.database::<S::Db>(Step::Commit, source),
            },
        }
    }
}

/// What the session holds once the job's transaction has ended under its body.
#[derive(Debug, Clone, Copy)]
struct AfterEnd {
    /// A transaction is open now, not the job's: where a result is recorded after the body, the
    /// record ran in it (and the runtime's rollback undoes it), not outside any transaction.
    open: bool,
    /// What the body ran after the end may have run outside any transaction, each statement
    /// committed on its own.
    outside: bool,
}

/// What the session holds once the job's transaction has ended under its body ([`AfterEnd`]).
/// What the body ran after the end may have run outside any transaction where none is open now,
/// or where the database does not answer. Where one is open, it holds all of it only where it is
/// the job's own still (aborted, say); else a statement began it (the body's `BEGIN` after a
/// `ROLLBACK` or a deadlock it caught, a nested job's; on MySQL under `autocommit = 0` also a
/// `BEGIN` or `COMMIT` that committed what the session had opened by itself), and what the body
/// ran before that statement may have run outside any transaction
/// ([`Database::open_transaction_holds_the_rest`]). Before, every open transaction was read as
/// holding it all: a body that caught a deadlock, wrote, and began again was told nothing of it
/// was committed, with its write committed.
async fn after_end<S: Store>(store: &mut S) -> AfterEnd {
    match S::Db::transaction_still_open(store).await {
        Some(true) => AfterEnd {
            open: true,
            outside: S::Db::open_transaction_holds_the_rest(store).await != Some(true),
        },
        _ => AfterEnd {
            open: false,
            outside: true,
        },
    }
}

/// `source`, the failure of a job's last statements that no known text calls a lost connection (a
/// pooler's own farewell, say), as a lost connection (`Ok`) when the connection answers nothing
/// after it: the job's transaction ended with the connection, its commit's outcome unknown, and
/// the body did nothing wrong. `Err(source)` when it answers, or `source` is known already: a
/// lost connection, the database saying the job's savepoint is gone, or the runtime's own count
/// saying so (a body that ended the transaction, whose connection may die after, without
/// changing what the body did); only a database's error of no known kind is asked about.
async fn lost_unnamed<S: Store>(
    store: &mut S,
    source: diesel::result::Error,
) -> Result<diesel::result::Error, diesel::result::Error> {
    let unknown = crate::db::message(&source).is_some_and(|m| {
        !["idempotent_", "RELEASE SAVEPOINT", "no such savepoint"]
            .iter()
            .any(|named| m.contains(named))
    });
    if S::Db::connection_lost(&source) || !unknown {
        return Err(source);
    }
    match store.batch("SELECT 1 AS connection_alive").await {
        Err(probe) if S::Db::connection_lost(&probe) => Ok(diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::ClosedConnection,
            Box::new(format!(
                "{source} (the connection answered nothing after it: it was lost)"
            )),
        )),
        _ => Err(source),
    }
}

/// Deletes this run's claim if it was committed (by a statement of the body), in a transaction of
/// its own; whether there was one. Only this run's own claim (by its token): another run's is never
/// touched. A failure that passes (busy, a lock wait, a deadlock) is retried for as long as any
/// other statement of the runtime's; one that remains is the caller's to report
/// ([`Error::ClaimNotTakenBack`]): the claim may be committed.
async fn take_back_claim<S: Store>(store: &mut S, call: &Call) -> diesel::QueryResult<bool> {
    let (digest, token) = (&call.digest, call.context.claim_token());
    // A loop rather than `retry::retrying`: an async closure here makes the job's future one
    // rustc cannot prove `Send` (tests/jobs/spawnable.rs).
    let mut retry = crate::retry::Retry::new();
    let taken = loop {
        match take_back_in_own_transaction(store, digest, token).await {
            Err(error) if retry.failed::<S::Db>(&error).is_some() => retry.pause::<S>().await,
            taken => break taken,
        }
    };
    match taken {
        // The `DELETE` can fail where there is nothing of this run's to delete (it waited on
        // another run's row of the key past the lock wait; a statement-level trigger): a read
        // that locks nothing tells.
        Err(error) if !S::Db::connection_lost(&error) => {
            match claim_is_there(store, digest, token).await {
                Ok(false) => Ok(false),
                _ => Err(error),
            }
        }
        taken => taken,
    }
}

/// Whether this run's claim (by its token) is committed: one read that locks nothing, in a short
/// transaction of its own (a session with `autocommit = 0` would otherwise keep it open).
async fn claim_is_there<S: Store>(
    store: &mut S,
    digest: &[u8; 32],
    token: i64,
) -> diesel::QueryResult<bool> {
    let (mut transaction, _) = Transaction::begin_deferred(store, itself::<S>).await?;
    match S::Db::lookup_key(transaction.store(), digest).await {
        Ok(row) => {
            transaction.commit().await?;
            Ok(row.is_some_and(|row| row.claim_token == Some(token)))
        }
        Err(error) => {
            transaction.rollback().await;
            Err(error)
        }
    }
}

/// [`take_back_claim`] for a job inside a caller's transaction that a statement of the body ended
/// (a `COMMIT`, MySQL's implicit commit before DDL): Diesel still counts the caller's transaction
/// as open, so a transaction of the take-back's own would be a savepoint outside any transaction
/// (its `DELETE` autocommitted, its release failed, and the call said nothing was committed). Where
/// the database says the session holds no transaction (MySQL and MariaDB), the claim is taken back
/// by a statement of its own and a `COMMIT` (for a session with `autocommit = 0`).
async fn take_back_after_callers_end<S: Store>(
    store: &mut S,
    call: &Call,
) -> diesel::QueryResult<bool> {
    if !S::Db::KNOWS_SESSION_TRANSACTION
        || S::Db::session_in_transaction(store).await.unwrap_or(true)
    {
        return take_back_claim(store, call).await;
    }
    let taken = S::Db::take_back(store, &call.digest, call.context.claim_token()).await?;
    match store.batch(S::Db::COMMIT).await {
        Ok(()) => Ok(taken),
        // With nothing taken back, the COMMIT only ended the session's transaction.
        Err(error) if !taken => {
            tracing::warn!(%error, "committing outside the caller's ended transaction failed; no claim was there to take back");
            Ok(false)
        }
        Err(error) => Err(error),
    }
}

/// Where opening a job's savepoint found the caller's transaction ended before the call, with
/// Diesel still counting it: opens its [`stand_in`], so that each of the caller's rollbacks finds
/// its own and Diesel returns the job's error (a caller two levels deep got Diesel's "SAVEPOINT
/// diesel_savepoint_1 does not exist" instead).
async fn stand_in_for_callers<S: Store>(store: &mut S) {
    let Ok(enclosing) = store.transaction_depth() else {
        return;
    };
    if let Err(error) = store.batch(&stand_in::<S::Db>(enclosing)).await {
        tracing::warn!(%error, "opening a transaction for the caller's to end failed");
        store.count_transactions(0);
    }
}

/// The empty transaction that stands for a caller's that a statement of the body ended, at
/// Diesel's count of `enclosing` transactions: `BEGIN`, and Diesel's savepoints of the levels past
/// the first (`diesel_savepoint_1` ..), so that each of the caller's rollbacks finds its own and
/// Diesel returns the caller's error.
fn stand_in<D: Database>(enclosing: u32) -> String {
    let mut sql = String::from(D::BEGIN);
    for level in 1..enclosing {
        sql.push_str(&format!("; SAVEPOINT diesel_savepoint_{level}"));
    }
    sql
}

/// [`Database::take_back`] in a transaction of its own begun and committed as text, where Diesel
/// still counts a caller's transaction that a statement of the body ended (its own `BEGIN` would
/// be a savepoint there) and the session holds none (the runtime rolled back what was open).
/// A failure that passes (busy, a lock wait, a deadlock) is retried as [`take_back_claim`]'s is.
async fn take_back_on_its_own<S: Store>(store: &mut S, call: &Call) -> diesel::QueryResult<bool> {
    let mut retry = crate::retry::Retry::new();
    let taken = loop {
        match take_back_once_uncounted(store, call).await {
            Err(error) if retry.failed::<S::Db>(&error).is_some() => retry.pause::<S>().await,
            taken => break taken,
        }
    };
    match taken {
        // As in `take_back_claim`: the `DELETE` can fail where there is nothing of this run's to
        // delete (it waited on another run's row of the key past the lock wait): a read that
        // locks nothing tells.
        Err(error) if !S::Db::connection_lost(&error) => {
            match claim_is_there_uncounted(store, call).await {
                Ok(false) => Ok(false),
                _ => Err(error),
            }
        }
        taken => taken,
    }
}

/// [`claim_is_there`] in a transaction begun as text, which Diesel does not count.
async fn claim_is_there_uncounted<S: Store>(
    store: &mut S,
    call: &Call,
) -> diesel::QueryResult<bool> {
    store.batch(S::Db::BEGIN).await?;
    let row = S::Db::lookup_key(store, &call.digest).await;
    if let Err(error) = store.batch(S::Db::ROLLBACK).await {
        tracing::debug!(%error, "ending the read of the claim failed");
    }
    Ok(row?.is_some_and(|row| row.claim_token == Some(call.context.claim_token())))
}

/// One attempt of [`take_back_on_its_own`]: begun, the `DELETE`, committed; rolled back on any
/// failure, so that nothing is left open.
async fn take_back_once_uncounted<S: Store>(
    store: &mut S,
    call: &Call,
) -> diesel::QueryResult<bool> {
    store.batch(S::Db::BEGIN_UNCOUNTED).await?;
    let taken = match S::Db::take_back(store, &call.digest, call.context.claim_token()).await {
        Ok(taken) => store.batch(S::Db::COMMIT).await.map(|()| taken),
        Err(error) => Err(error),
    };
    if let Err(error) = &taken
        && !S::Db::connection_lost(error)
        && let Err(rollback) = store.batch(S::Db::ROLLBACK).await
    {
        tracing::debug!(%rollback, "nothing was left open by the failed take-back");
    }
    taken
}

/// [`Database::take_back`] in a short transaction of its own (a session with `autocommit = 0`
/// would otherwise never commit it).
async fn take_back_in_own_transaction<S: Store>(
    store: &mut S,
    digest: &[u8; 32],
    token: i64,
) -> diesel::QueryResult<bool> {
    let (mut transaction, _) = Transaction::begin(store, itself::<S>).await?;
    match S::Db::take_back(transaction.store(), digest, token).await {
        Ok(taken) => transaction.commit().await.map(|()| taken),
        Err(error) => {
            transaction.rollback().await;
            Err(error)
        }
    }
}

/// How a job's transaction that will not commit ended.
#[derive(Debug)]
enum Ended {
    /// Rolled back: nothing of the job is in the database.
    RolledBack,
    /// Rolled back, and the database had said the transaction was no longer the job's own: a
    /// statement of the body rolled it back or aborted it. Nothing of the job's transaction is in
    /// the database; when `outside`, no transaction was open any more, and what the body ran after
    /// its end ran outside it.
    RolledBackByBody {
        /// What the body ran after the end of its transaction may be committed.
        outside: bool,
    },
    /// Inside a caller's transaction: the whole of it was rolled back (by the database, or a
    /// statement of the body); nothing of it is in the database. Where `outside`, the body went
    /// on, and what it ran after the rollback ran outside any transaction.
    CallersRolledBack {
        /// What the body ran after the rollback may be committed.
        outside: bool,
    },
    /// A statement of the body had committed it (its work before that statement); the claim was
    /// taken back.
    CommittedInBody,
    /// The rollback could not undo everything (why): what the body wrote may be in the database;
    /// the claim was taken back.
    NoRollback(&'static str),
    /// The claim may have been committed (how the transaction ended, in words), and taking it
    /// back failed (the error); whether such a claim replays (see [`Error::ClaimNotTakenBack`]).
    ClaimKept(String, diesel::result::Error, bool),
}

impl Ended {
    /// The error that replaces the job's own, unless the transaction simply rolled back.
    fn error(self, call: &Call) -> Option<Error> {
        match self {
            Ended::RolledBack | Ended::RolledBackByBody { outside: false } => None,
            // The body's own error would say nothing of what it ran after the end.
            Ended::RolledBackByBody { outside: true } => Some(rolled_back_in_body(call, true)),
            Ended::CallersRolledBack { outside } => Some(callers_rolled_back(call, outside)),

            Ended::CommittedInBody => Some(ended_in_body(call)),
            Ended::NoRollback(why) => Some(Error::CannotRollBack {
                job: call.job.name(),
                key: call.key_text.clone(),
                why,
            }),
            Ended::ClaimKept(ended, source, replays) => {
                Some(claim_kept(call, ended, source, replays))
            }
        }
    }
}

/// [`Error::CallersTransactionRolledBack`] for `call`, found after its body; `outside`: the body
/// went on after the rollback.
fn callers_rolled_back(call: &Call, outside: bool) -> Error {
    Error::CallersTransactionRolledBack {
        job: call.job.name(),
        key: call.key_text.clone(),
        step: Step::Body,
        outside,
        retryable: true,
        source: None,
    }
}

/// [`Error::TransactionRolledBackInBody`] for `call`.
fn rolled_back_in_body(call: &Call, outside: bool) -> Error {
    Error::TransactionRolledBackInBody {
        job: call.job.name(),
        key: call.key_text.clone(),
        outside,
    }
}

fn claim_kept(call: &Call, ended: String, source: diesel::result::Error, replays: bool) -> Error {
    Error::ClaimNotTakenBack {
        job: call.job.name(),
        key: call.key_text.clone(),
        ended,
        replays,
        source,
    }
}

/// [`Ended::ClaimKept`]: a statement of the body ended or replaced the job's transaction.
const ENDED_IN_BODY: &str = "a statement of its body ended or rolled back its transaction; what the body wrote before that statement may be committed";

/// [`Ended::ClaimKept`] found at the commit.
const ENDED_BEFORE_COMMIT: &str = "a statement of its body ended or rolled back its transaction and the body returned Ok; what the body wrote before that statement, and after it, may be committed";

fn ended_in_body(call: &Call) -> Error {
    Error::TransactionEndedInBody {
        job: call.job.name(),
        key: call.key_text.clone(),
    }
}

/// The error for a failed [`finish_job`](crate::transaction::finish_job) other than
/// [`Finish::NotOwn`].
fn finish_failed<S: Store>(call: &Call, finish: Finish) -> Error {
    match finish {
        Finish::BeforeCommit(source) => Error::Database {
            job: call.job.name(),
            key: call.key_text.clone(),
            step: Step::Commit,
            enclosing: call.enclosing(),
            retryable: true,
            source,
        },
        Finish::Commit(source) | Finish::NotOwn(source) => {
            call.database::<S::Db>(Step::Commit, source)
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
    let read = if S::Db::FIRST_READ_IN_OWN_TRANSACTION {
        read_in_own_transaction(store, &call.digest).await
    } else {
        S::Db::done_row_before_claim(store, &call.digest).await
    };
    let row = match read {
        Ok(Some(row)) if !row.lapsed && !row.unfinished() => row,
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

/// The key's row for a redelivery's read, in a transaction of the runtime's own that it rolls back
/// ([`Database::FIRST_READ_IN_OWN_TRANSACTION`]: SQLite, where a read outside one joins a
/// transaction the session holds of its own, sent as text, and in WAL mode that transaction's
/// snapshot): `None` where the `BEGIN` is refused (such a transaction is open) or nests, and the
/// claim decides.
async fn read_in_own_transaction<S: Store>(
    store: &mut S,
    digest: &[u8; 32],
) -> diesel::QueryResult<Option<DoneRow>> {
    let Ok((mut transaction, nesting)) =
        Transaction::begin_deferred(&mut *store, itself::<S>).await
    else {
        return Ok(None);
    };
    if !matches!(nesting, Nesting::Outermost) {
        transaction.rollback().await;
        return Ok(None);
    }
    let row = S::Db::done_row_before_claim(transaction.store(), digest).await;
    // It read; nothing to commit.
    transaction.rollback().await;
    row
}

/// Whether a redelivery may read before its claim, outside any transaction
/// ([`Database::reads_outside_safely`]); where the database cannot say, or the question fails, it
/// does not, and the claim decides. Inside a transaction Diesel knows of, nothing is asked: the
/// read is not sent there ([`replay_before_claim`]).
async fn reads_outside_safely<S: Store>(store: &mut S) -> bool {
    if !S::Db::KNOWS_SESSION_TRANSACTION {
        return true;
    }
    store.transaction_depth().is_ok_and(|depth| depth == 0)
        && S::Db::reads_outside_safely(store).await.unwrap_or(false)
}

/// The key's committed row, when it is live and finished: what a claim would replay.
async fn live_row<S: Store>(store: &mut S, call: &Call) -> diesel::QueryResult<Option<DoneRow>> {
    Ok(S::Db::done_row(store, &call.digest)
        .await?
        .filter(|row| !row.lapsed && !row.unfinished()))
}

/// Stores the result and starts `keep`, unless the job stores no result (zero-sized) and keeps
/// its key for ever; refuses a result larger than the database takes in one statement before
/// sending it.
async fn record<S: Store>(
    store: &mut S,
    call: &Call,
    json: Option<&str>,
    stores_result: bool,
) -> Result<(), Error> {
    if !stores_result && json.is_none() && call.keep_micros.is_none() {
        return Ok(());
    }
    if let Some(json) = json {
        let limit = S::Db::too_large_for_a_statement(store, json.len())
            .await
            .map_err(|e| call.database::<S::Db>(Step::Record, e))?;
        if let Some(limit) = limit {
            return Err(Error::ResultTooLarge {
                job: call.job.name(),
                key: call.key_text.clone(),
                bytes: json.len(),
                limit: limit.largest,
                packet: limit.packet,
            });
        }
    }
    let recorded = S::Db::record(
        store,
        &call.digest,
        call.context.claim_token(),
        json,
        call.keep_micros,
    )
    .await
    .map_err(|e| call.database::<S::Db>(Step::Record, e))?;
    if recorded {
        Ok(())
    } else {
        // This run's claim is gone from its transaction: a statement of the body rolled back to
        // the job's savepoint (the claim with it) or switched the session to another database.
        // Whether what the body ran after that is committed, the end of the job's transaction
        // tells (`JobEnd::fail_after_body`).
        Err(rolled_back_in_body(call, false))
    }
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

/// How the claim came out: a transaction open with the key claimed now (`None`) or found taken
/// (`Some(row)`), or the key's row replayed with nothing open.
enum Claimed<T> {
    Open(Nesting, Option<DoneRow>),
    Replayed(T),
}

/// How [`begin_and_claim`] came out: a transaction open with the key claimed now (`None`) or found
/// taken (`Some(row)`); or the key taken with nothing open ([`Database::taken_with_nothing_open`]),
/// and whether its row may be read outside any transaction ([`Database::read_after_taken`]).
enum Began {
    Open(Nesting, Option<DoneRow>),
    Taken { read: bool },
}

/// [`begin_and_claim`]; where the key is found taken with nothing open
/// ([`Database::taken_with_nothing_open`]), its row read outside any transaction and replayed when
/// it is live, else the claim again, in a transaction it leaves open.
async fn claim_or_replay<S: Store, T: JobOutput>(
    store: &mut S,
    call: &Call,
    stores_result: bool,
) -> Result<Claimed<T>, Error> {
    key_fits(store, call).await?;
    let read_inside = call.read_first && S::READ_FIRST_IN_TRANSACTION;
    let mut together = true;
    loop {
        match begin_and_claim(store, call, stores_result, read_inside, together).await? {
            Began::Open(nesting, claimed) => return Ok(Claimed::Open(nesting, claimed)),
            Began::Taken { read } => {
                if read && let Some(value) = replay_before_claim::<S, T>(store, call).await {
                    return Ok(Claimed::Replayed(value));
                }
                together = false;
            }
        }
    }
}

/// Opens the transaction and claims the key (`None`: claimed now; `Some(row)`: it was already),
/// retrying the whole transaction on transient errors within the retry window; or finds the key
/// taken with nothing open ([`Began::Taken`]).
///
/// `read_inside`: a redelivery on a database whose read-first runs inside the transaction
/// ([`Store::READ_FIRST_IN_TRANSACTION`]) reads the key's committed row first, and replays a live
/// one without claiming. `together`: the first claim may go with `BEGIN`.
async fn begin_and_claim<S: Store>(
    store: &mut S,
    call: &Call,
    stores_result: bool,
    read_inside: bool,
    together: bool,
) -> Result<Began, Error> {
    let claim = call.claim(stores_result);
    // Where the claim waits at BEGIN for the database's write lock (SQLite), the in-progress bound
    // bounds those retries; elsewhere the database's lock timeout bounds the claim's own wait.
    let window = match call.in_progress {
        Some(bound) if S::Db::WRITE_LOCK_AT_BEGIN => bound.min(call.retry_window),
        _ => call.retry_window,
    };
    let mut retry = Retry::within(window);
    loop {
        let attempt = attempt_claim(store, call, &claim, read_inside, together, &retry).await;
        let (step, error) = match attempt {
            Ok((nesting, claimed)) => return Ok(Began::Open(nesting, claimed)),
            Err(Attempt::Taken { read }) => return Ok(Began::Taken { read }),
            Err(Attempt::Over(error)) => {
                if let Error::CallersTransactionRolledBack {
                    step: Step::Begin, ..
                } = error
                {
                    stand_in_for_callers(store).await;
                }
                return Err(error);
            }
            Err(Attempt::Failed(step, error)) => {
                // SQLite in WAL mode: a `BEGIN IMMEDIATE` inside a transaction the session holds
                // of its own, whose snapshot another connection's commit has made old, is
                // "database is locked" at once, every time, not "within a transaction": asked
                // (nothing of the job's is open after a failed `BEGIN`), so that the job is
                // refused now, not retried for the whole window as if another connection held the
                // write lock.
                if step == Step::Begin
                    && S::Db::WRITE_LOCK_AT_BEGIN
                    && S::Db::classify(&error) == Fault::Busy
                    && S::Db::transaction_still_open(store).await == Some(true)
                {
                    return Err(Error::InsideTransaction {
                        what: "run the job",
                    });
                }
                (step, error)
            }
        };
        match retry.failed::<S::Db>(&error) {
            Some(_) => {
                crate::stats::retried(call.job, retry.attempts, &error);
                retry.pause::<S>().await;
            }
            None => return Err(claim_failed(store, call, &retry, step, error).await),
        }
    }
}

/// How one attempt at opening the transaction and claiming failed.
enum Attempt {
    /// At `Step`, with an error that may pass: retried while the window lasts.
    Failed(Step, diesel::result::Error),
    /// For good: the call returns this.
    Over(Error),
    /// The key is taken, and the claim's transaction ended with the attempt; whether its row may
    /// be read outside any transaction.
    Taken { read: bool },
}

/// A job's `BEGIN` that did nothing inside a transaction of the caller's that Diesel does not
/// know of: the first claim refused it (sent with `BEGIN`), or, opened on its own, the
/// transaction is asked whether it had written before. Committing or rolling back would end the
/// caller's transaction, with its writes: the job's savepoint is undone and the transaction
/// handed back to the caller as it was.
async fn refuse_inside_callers<'a, S: Store, R: Fn(&mut S) -> &mut S>(
    mut transaction: Transaction<'a, S, S, R>,
    nesting: Nesting,
    first: Option<&diesel::QueryResult<crate::store::ClaimAttempt>>,
) -> Result<Transaction<'a, S, S, R>, Attempt> {
    let inside = match (first, nesting) {
        (_, Nesting::Savepoint) | (Some(Ok(_)), _) => Ok(false),
        (Some(Err(error)), _) => Ok(S::Db::inside_callers_transaction(error)),
        (None, _) => S::Db::begun_inside_another(transaction.store()).await,
    };
    match inside {
        Ok(false) => Ok(transaction),
        Ok(true) => {
            let left = transaction
                .store()
                .batch(S::Db::LEAVE_CALLERS_TRANSACTION)
                .await;
            if let Err(error) = &left {
                tracing::warn!(%error, "undoing the job's savepoint in the caller's transaction failed");
            }
            transaction.store().forget_transaction(left.is_err());
            transaction.hand_over();
            Err(Attempt::Over(Error::InsideTransaction {
                what: "run the job",
            }))
        }
        Err(error) => {
            transaction.rollback().await;
            Err(Attempt::Failed(Step::Begin, error))
        }
    }
}

/// Opens the job's transaction (with the first claim in the same flight when `together`), and
/// refuses one the caller opened behind Diesel's back.
async fn open_job<'a, S: Store>(
    store: &'a mut S,
    call: &Call,
    claim: &crate::store::Claim<'_>,
    together: bool,
) -> Result<
    (
        Transaction<'a, S, S, impl Fn(&mut S) -> &mut S + use<'a, S>>,
        Nesting,
        Option<diesel::QueryResult<ClaimAttempt>>,
    ),
    Attempt,
> {
    // The common case, a first delivery with no bound on the wait: `BEGIN` and the first claim
    // go together, in one flight where the connection pipelines.
    let (transaction, nesting, first) = match together {
        true => Transaction::begin_job_claiming(&mut *store, itself::<S>, claim)
            .await
            .map(|(transaction, nesting, first)| (transaction, nesting, Some(first))),
        false => Transaction::begin_job(&mut *store, itself::<S>, call.in_progress)
            .await
            .map(|(transaction, nesting)| (transaction, nesting, None)),
    }
    .map_err(|error| {
        if S::Db::taken_with_nothing_open(&error) {
            Attempt::Taken {
                read: S::Db::read_after_taken(&error),
            }
        } else if S::Db::inside_callers_transaction(&error) {
            Attempt::Over(Error::InsideTransaction {
                what: "run the job",
            })
        } else if crate::transaction::callers_transaction_gone::<S::Db>(&error) {
            Attempt::Over(Error::CallersTransactionRolledBack {
                job: call.job.name(),
                key: call.key_text.clone(),
                step: Step::Begin,
                outside: false,
                retryable: true,
                source: Some(error),
            })
        } else {
            Attempt::Failed(Step::Begin, error)
        }
    })?;
    let transaction = refuse_inside_callers(transaction, nesting, first.as_ref()).await?;
    if nesting == Nesting::Savepoint {
        call.enclosing
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    Ok((transaction, nesting, first))
}

/// One attempt: `BEGIN` (with the job's savepoint), the read of a redelivery whose database reads
/// inside the transaction, and the claim; the transaction handed over open on success, rolled back
/// otherwise.
async fn attempt_claim<S: Store>(
    store: &mut S,
    call: &Call,
    claim: &crate::store::Claim<'_>,
    read_inside: bool,
    together: bool,
    retry: &Retry,
) -> Result<(Nesting, Option<DoneRow>), Attempt> {
    let together = together && !read_inside && call.in_progress.is_none();
    let (mut transaction, nesting, first) = open_job(store, call, claim, together).await?;
    let claim = &crate::store::Claim {
        own: nesting != Nesting::Savepoint,
        ..*claim
    };
    let claimed = match (first, read_inside && nesting != Nesting::Savepoint) {
        (Some(Ok(first)), _) => claim_key(transaction.store(), claim, Some(first))
            .await
            .map_err(|error| (error, None)),
        (Some(Err(error)), _) => Err((error, None)),
        (None, true) => match live_row(transaction.store(), call).await {
            Ok(Some(row)) => Ok(Some(row)),
            Ok(None) => bounded_claim_key(transaction.store(), claim, call.in_progress).await,
            Err(error) => Err((error, None)),
        },
        (None, false) => bounded_claim_key(transaction.store(), claim, call.in_progress).await,
    };
    // Opened without the job's savepoint: set now, after the claim (a body that rolls back to it
    // cannot take the claim with it); not for a key found taken, whose replay runs no body and
    // ends its transaction with a rollback (`JobEnd::finish_replay`).
    let (nesting, claimed) = match (nesting, claimed) {
        (Nesting::Unmarked, Ok(None)) => (
            Nesting::Outermost,
            S::Db::set_job_savepoint(transaction.store())
                .await
                .map(|()| None)
                .map_err(|error| (error, None)),
        ),
        other => other,
    };
    match claimed {
        Ok(state) => {
            transaction.hand_over();
            Ok((nesting, state))
        }
        Err((error, previous)) => {
            Err(claim_not_taken(transaction, nesting, call, retry, error, previous).await)
        }
    }
}

/// Ends a job's transaction whose claim failed with `error`, the lock wait `previous` to a bound
/// on it put back, and says what the attempt came to.
async fn claim_not_taken<S: Store, R: Fn(&mut S) -> &mut S>(
    mut transaction: Transaction<'_, S, S, R>,
    nesting: Nesting,
    call: &Call,
    retry: &Retry,
    error: diesel::result::Error,
    previous: Option<String>,
) -> Attempt {
    // MySQL's setting is the session's: put back while the transaction's guard still holds the
    // connection, so that a call dropped during it leaves the connection marked broken (a pool
    // drops it), never in use with the bound, or with the answer unread. Where a failed
    // statement aborts the transaction (PostgreSQL's `SET LOCAL`), after the rollback.
    let restore_first = !S::Db::A_FAILED_STATEMENT_ABORTS;
    if restore_first
        && let Some(previous) = &previous
        && let Err(error) = S::Db::restore_lock_wait(transaction.store(), previous).await
    {
        tracing::warn!(%error, "restoring the lock wait timeout failed");
    }
    // Inside a caller's transaction, a savepoint gone with the claim's failure: the database
    // rolled back the caller's whole transaction under it (a MySQL deadlock).
    let callers_gone = transaction.roll_back_job(nesting).await == Ownership::NotOwn;
    if !restore_first
        && let Some(previous) = previous
        && let Err(error) = S::Db::restore_lock_wait(transaction.store(), &previous).await
    {
        tracing::warn!(%error, "restoring the lock wait timeout failed");
    }
    if callers_gone {
        // Before the in-progress bound's answer: a lock wait timeout that rolled back the whole
        // transaction (`innodb_rollback_on_timeout`) took the caller's work with it.
        return Attempt::Over(Error::CallersTransactionRolledBack {
            job: call.job.name(),
            key: call.key_text.clone(),
            step: Step::Claim,
            outside: false,
            retryable: S::Db::passes(&error),
            source: Some(error),
        });
    }
    if call.in_progress.is_some() && S::Db::classify(&error) == crate::store::Fault::LockTimeout {
        return Attempt::Over(in_progress(call, retry.elapsed()));
    }
    if nesting == Nesting::Savepoint {
        // Only the caller can retry a failure inside its transaction.
        return Attempt::Over(call.database::<S::Db>(Step::Claim, error));
    }
    Attempt::Failed(Step::Claim, error)
}

/// The error of a claim that will not be retried (any more): the in-progress bound spent, the
/// retry window spent, tables never migrated, or the database's own refusal.
async fn claim_failed<S: Store>(
    store: &mut S,
    call: &Call,
    retry: &Retry,
    step: Step,
    error: diesel::result::Error,
) -> Error {
    if call.in_progress.is_some() && S::Db::classify(&error) == crate::store::Fault::Busy {
        return in_progress(call, retry.elapsed());
    }
    if retry.exhausted::<S::Db>(&error) {
        return Error::ClaimRetriesExhausted {
            job: call.job.name(),
            key: call.key_text.clone(),
            attempts: retry.attempts,
            waited: retry.elapsed(),
            causes: retry.explain(),
            source: error,
        };
    }
    // On a connection of no more use nothing more is sent: a statement dropped in flight may
    // have its answer on the way, which the table's check would read as its own.
    let unusable = S::Db::connection_lost(&error)
        || matches!(error, diesel::result::Error::BrokenTransactionManager);
    if !unusable && let Some(missing) = crate::migrations::not_migrated(store, "done_jobs").await {
        return missing;
    }
    call.database::<S::Db>(step, error)
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
    let claimed = claim_key(store, claim, None).await;
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
/// Three turns cover every interleaving of two writers. `first`: the first turn's attempt, made
/// already (with `BEGIN`).
async fn claim_key<S: Store>(
    store: &mut S,
    claim: &crate::store::Claim<'_>,
    mut first: Option<ClaimAttempt>,
) -> diesel::QueryResult<Option<DoneRow>> {
    // Turns after the first run in the transaction the first proved the job's own; a renewal
    // that waited for a row lock (a prune's, a forget's, another run's) gave that transaction an
    // id, which the first turn's check would refuse as the session's own (PostgreSQL).
    let later = &crate::store::Claim {
        own: false,
        ..*claim
    };
    for turn in 0..3 {
        let attempt = match first.take() {
            Some(attempt) => attempt,
            None => S::Db::claim(store, if turn == 0 { claim } else { later }).await?,
        };
        match attempt {
            ClaimAttempt::Inserted => return Ok(None),
            ClaimAttempt::Found(row) if !row.lapsed && !row.unfinished() => return Ok(Some(row)),
            ClaimAttempt::Found(row) if S::Db::renew(store, claim).await? => {
                if row.unfinished() {
                    tracing::warn!(
                        "the key was committed by a run that never recorded its result (a statement of its body ended the job's transaction, and its worker died before it could take the claim back); this run takes the key over and runs the job"
                    );
                }
                return Ok(None);
            }
            // Renewed by another worker first, pruned, or committed after this statement began.
            ClaimAttempt::Found(_) | ClaimAttempt::Missing => {}
        }
    }
    Err(crate::retry::key_kept_changing())
}
