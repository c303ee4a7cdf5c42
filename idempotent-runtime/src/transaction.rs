//! The one transaction guard: every transaction the runtime opens (a job's, a relay's lease, a
//! migration's) is committed or rolled back explicitly, and cleaned up by [`Store::abandon`] when
//! the guard is dropped open: a panic unwinding through it, or a future dropped at an `.await`. On
//! a sync connection that rolls back at once; on an async one, which cannot run a statement in
//! `drop`, it marks the connection broken so that no later job commits into what was left open.

use crate::retry::Retry;
use crate::store::{Database, Finish, Nesting, Store, Unfinished};

/// A transaction the runtime opened: committed or rolled back explicitly, cleaned up by
/// [`Store::abandon`] when dropped open.
pub(crate) struct Transaction<'a, Conn: ?Sized, S: Store, R: Fn(&mut Conn) -> &mut S> {
    conn: &'a mut Conn,
    reach: R,
    open: bool,
    /// Diesel's count of open transactions when the job's commit was sent (the job's own level).
    finished_at: Option<u32>,
    /// Inside a caller's transaction: Diesel's count of the caller's open transactions when the
    /// savepoint was opened, which names the mark set before it ([`enclosing_mark`]).
    enclosing: Option<u32>,
}

/// The name of the mark a transaction of the runtime's opened inside a caller's sets before
/// Diesel's savepoint (`enclosing` is Diesel's count of the caller's open transactions): a
/// savepoint of its own, which a statement of the body that releases the job's savepoint leaves
/// in place, and one that ends the caller's transaction takes with it. The runtime's savepoint
/// ends at it ([`end_at_mark`]: released, or rolled back to and released),
/// and its failure paths read it ([`Mark`]).
pub(crate) fn enclosing_mark(enclosing: u32) -> String {
    format!("{MARK_PREFIX}{enclosing}")
}

/// What every [`enclosing_mark`] begins with.
const MARK_PREFIX: &str = "idempotent_enclosing_";

/// Whether `error`, met opening a job's savepoint inside a caller's transaction, says that no
/// transaction was open: the mark set in the same batch was gone at once (MySQL and MariaDB; see
/// [`Database::TRANSACTION_MAY_END_UNDER_THE_SESSION`]). The server had ended the caller's
/// transaction before the call (a deadlock the caller caught and went on after), or a statement
/// of the caller's had; nothing of the job ran.
pub(crate) fn callers_transaction_gone<D: Database>(error: &diesel::result::Error) -> bool {
    D::TRANSACTION_MAY_END_UNDER_THE_SESSION
        && matches!(
            error,
            // 1305, "SAVEPOINT idempotent_enclosing_1 does not exist": the word `SAVEPOINT` and
            // the name are never translated (see `release_failed`). Not a syntax error that quotes
            // the batch ("... near 'ROLLBACK TO SAVEPOINT idempotent_enclosing_1 ...'").
            diesel::result::Error::DatabaseError(_, info)
                if info.message().starts_with("SAVEPOINT") && info.message().contains(MARK_PREFIX)
        )
}

/// How [`Transaction::check_and_finish`] ended a job inside a caller's transaction.
#[derive(Debug)]
pub(crate) enum Checked {
    /// The claim was there, and the job's savepoint is released into the caller's transaction.
    Finished,
    /// This run's claim is gone from the transaction (the release did not run).
    ClaimGone,
    /// The check failed on its own (the release did not run), as the result's `UPDATE` would.
    CheckFailed(diesel::result::Error),
    /// The check held and the release failed: the mark is gone, as with [`end_at_mark`].
    NotOwn(diesel::result::Error),
}

/// What became of a caller's transaction, read from the mark set before the job's savepoint
/// once that savepoint turned out gone ([`Transaction::back_to_mark`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// The mark was there: the caller's transaction is still open, and it is now back where it
    /// called the job, with nothing of the job in it (the mark released, Diesel counting the
    /// caller's transactions again).
    Restored,
    /// The mark was gone: a statement of the body (or the database) ended the caller's
    /// transaction; any transaction open now is another one.
    Gone,
    /// No answer (the connection failed), or no mark.
    Unknown,
}

impl<'a, Conn: ?Sized, S: Store, R: Fn(&mut Conn) -> &mut S> Transaction<'a, Conn, S, R> {
    /// Takes charge of the transaction just opened on `conn`.
    pub(crate) fn opened(conn: &'a mut Conn, reach: R) -> Self {
        Self {
            conn,
            reach,
            open: true,
            finished_at: None,
            enclosing: None,
        }
    }

    /// Opens a transaction (or a savepoint) on `conn`. The guard is armed before `BEGIN` is sent:
    /// a future dropped while `BEGIN` is in flight (on SQLite through diesel-async it completes on
    /// a blocking thread regardless) may leave a transaction open, and that must be cleaned up too.
    pub(crate) async fn begin(
        conn: &'a mut Conn,
        reach: R,
    ) -> diesel::QueryResult<(Self, Nesting)> {
        Self::begin_bounded(conn, reach, None).await
    }

    /// [`begin`](Self::begin), waiting at most `bound` for a write lock `BEGIN` takes (SQLite).
    pub(crate) async fn begin_bounded(
        conn: &'a mut Conn,
        reach: R,
        bound: Option<std::time::Duration>,
    ) -> diesel::QueryResult<(Self, Nesting)> {
        let mut transaction = Self::opened(conn, reach);
        let begun = match bound {
            Some(limit) => transaction.store().begin_bounded(limit).await,
            None => transaction.store().begin().await,
        };
        match begun {
            Ok(nesting) => Ok((transaction.marked(nesting), nesting)),
            Err(error) => {
                // Nothing was opened.
                transaction.open = false;
                Err(error)
            }
        }
    }

    /// Opens a transaction that takes no lock until it needs one ([`Store::begin_deferred`]).
    pub(crate) async fn begin_deferred(
        conn: &'a mut Conn,
        reach: R,
    ) -> diesel::QueryResult<(Self, Nesting)> {
        let mut transaction = Self::opened(conn, reach);
        match transaction.store().begin_deferred().await {
            Ok(nesting) => Ok((transaction.marked(nesting), nesting)),
            Err(error) => {
                transaction.open = false;
                Err(error)
            }
        }
    }

    /// Opens a job's own transaction ([`Store::begin_job`]), guarded from before `BEGIN` is sent.
    pub(crate) async fn begin_job(
        conn: &'a mut Conn,
        reach: R,
        bound: Option<std::time::Duration>,
    ) -> diesel::QueryResult<(Self, Nesting)> {
        let mut transaction = Self::opened(conn, reach);
        match transaction.store().begin_job(bound).await {
            Ok(nesting) => Ok((transaction.marked(nesting), nesting)),
            Err(error) => {
                transaction.open = false;
                Err(error)
            }
        }
    }

    /// Opens a job's own transaction, guarded from before `BEGIN` is sent, and makes the first
    /// claim in it ([`Database::begin_and_claim`]): the claim's result comes back with the open
    /// transaction.
    pub(crate) async fn begin_job_claiming(
        conn: &'a mut Conn,
        reach: R,
        claim: &crate::store::Claim<'_>,
    ) -> diesel::QueryResult<(
        Self,
        Nesting,
        diesel::QueryResult<crate::store::ClaimAttempt>,
    )> {
        let mut transaction = Self::opened(conn, reach);
        match S::Db::begin_and_claim(transaction.store(), claim).await {
            Ok((nesting, first)) => Ok((transaction.marked(nesting), nesting, first)),
            Err(error) => {
                transaction.open = false;
                Err(error)
            }
        }
    }

    /// Notes, for a savepoint inside a caller's transaction, which mark was set before it.
    pub(crate) fn marked(mut self, nesting: Nesting) -> Self {
        if nesting == Nesting::Savepoint {
            self.enclosing = self
                .store()
                .transaction_depth()
                .ok()
                .and_then(|d| d.checked_sub(1));
        }
        self
    }

    /// Diesel's count of the caller's open transactions, where the job runs in a savepoint of
    /// one.
    pub(crate) fn enclosing(&self) -> Option<u32> {
        self.enclosing
    }

    /// Inside a caller's transaction whose job savepoint turned out gone (its rollback or release
    /// failed): rolls back to the mark set before it, which tells whether the caller's
    /// transaction is still the one open ([`Mark`]). Where it is, that also undoes what the job
    /// left in it, and brings a transaction the failed release aborted (PostgreSQL) back to
    /// where the caller called the job.
    pub(crate) async fn back_to_mark(&mut self) -> Mark {
        let Some(enclosing) = self.enclosing else {
            return Mark::Unknown;
        };
        match end_at_mark(self.store(), enclosing, false).await {
            Ok(()) => Mark::Restored,
            Err(error) if S::Db::connection_lost(&error) => Mark::Unknown,
            Err(error) => {
                tracing::debug!(%error, "the caller's transaction was ended in the job's body");
                Mark::Gone
            }
        }
    }

    /// Commits a job's transaction, if it is still the job's own; see [`finish_job`].
    pub(crate) async fn finish_job(&mut self, nesting: Nesting) -> Result<(), Finish> {
        self.finished_at = self.store().transaction_depth().ok();
        let finished = match (nesting, self.enclosing) {
            // Releasing the mark releases Diesel's savepoint after it: it fails only where the
            // mark is gone, with the caller's transaction (a body that released Diesel's savepoint
            // alone left the job's work and claim, checked by the record, in the caller's).
            (Nesting::Savepoint, Some(enclosing)) => end_at_mark(self.store(), enclosing, true)
                .await
                .map_err(Finish::NotOwn),
            _ => finish_job(self.store(), nesting).await,
        };
        self.open = false;
        finished
    }

    /// Ends a job that returns `()` inside a caller's transaction in one flight where the
    /// database offers it ([`Database::check_and_release`]): the check that this run's claim is
    /// still in the transaction, and the release of the mark. `None`: not offered, or no mark.
    pub(crate) async fn check_and_finish(
        &mut self,
        digest: &[u8; 32],
        token: i64,
    ) -> Option<Checked> {
        let enclosing = self.enclosing?;
        let mark = enclosing_mark(enclosing);
        let sql = S::Db::check_and_release(digest, token, &mark)?;
        self.finished_at = self.store().transaction_depth().ok();
        Some(match self.store().batch(&sql).await {
            Ok(()) => {
                self.store().uncount_to(enclosing);
                self.open = false;
                Checked::Finished
            }
            Err(error) => {
                let message = match &error {
                    diesel::result::Error::DatabaseError(_, info) => info.message(),
                    _ => "",
                };
                if message.contains(crate::store::CLAIM_GONE) {
                    // The release did not run: the mark is there for the rollback.
                    Checked::ClaimGone
                } else if message.contains(&mark) || message.contains("RELEASE SAVEPOINT") {
                    // The check held and the release failed (the savepoint's name and the
                    // statement's are in the message in every language): the mark is gone with
                    // the caller's transaction, as after `end_at_mark`.
                    self.store().uncount_to(enclosing);
                    self.open = false;
                    Checked::NotOwn(error)
                } else {
                    Checked::CheckFailed(error)
                }
            }
        })
    }

    /// Whether the job's own transaction (not one nested in a caller's: there the job's
    /// savepoint is Diesel's, which only [`rollback_to_savepoint`](Self::rollback_to_savepoint)
    /// can test) is still its own: Diesel counts one transaction, and the job's savepoint is there
    /// (released now), so no statement of the body ended or replaced it.
    pub(crate) async fn ownership(&mut self) -> Ownership {
        if let Some(error) = unbalanced(self.store()) {
            return Ownership::from_failure::<S::Db>(&error);
        }
        match S::Db::release_job(self.store()).await {
            Ok(_) => Ownership::Own,
            Err(error) => Ownership::from_failure::<S::Db>(&error),
        }
    }

    /// Rolls back to Diesel's savepoint inside a caller's transaction: [`Ownership::Own`] when
    /// it was there; else whether the database said it was not (a statement of the body that
    /// ended the caller's transaction took it) or could not be asked.
    ///
    /// Diesel's own rollback is not asked alone: after a statement failed with a deadlock or a
    /// serialization failure, sync Diesel expects the whole transaction to be rolled back and
    /// answers `Ok` for a savepoint that is gone (MySQL's deadlock rolls back the caller's whole
    /// transaction). The savepoint is rolled back to by its name first, which the database
    /// answers truly; Diesel's rollback then keeps its count of transactions.
    pub(crate) async fn rollback_to_savepoint(&mut self) -> Ownership {
        if let Some(enclosing) = self.enclosing {
            // Back to the mark set before Diesel's savepoint: it undoes the job whether the body
            // released Diesel's savepoint or not, and fails only where the caller's transaction
            // ended (or the connection did).
            let rolled_back = end_at_mark(self.store(), enclosing, false).await;
            self.open = false;
            return match rolled_back {
                Ok(()) => Ownership::Own,
                Err(error) => {
                    tracing::warn!(%error, "the caller's transaction ended in the job's body");
                    Ownership::from_failure::<S::Db>(&error)
                }
            };
        }
        let probed = match self.store().transaction_depth() {
            Ok(depth) if depth > 1 => {
                let back = format!("ROLLBACK TO SAVEPOINT diesel_savepoint_{}", depth - 1);
                self.store().batch(&back).await
            }
            _ => Ok(()),
        };
        let rolled_back = self.store().rollback().await;
        self.open = false;
        match probed.and(rolled_back) {
            Ok(()) => Ownership::Own,
            Err(error) => {
                tracing::warn!(%error, "the caller's transaction ended in the job's body");
                Ownership::from_failure::<S::Db>(&error)
            }
        }
    }

    /// Rolls back a job's transaction that did not get its claim: to Diesel's savepoint inside a
    /// caller's transaction ([`rollback_to_savepoint`](Self::rollback_to_savepoint), which says
    /// whether it was still there), else the whole transaction ([`Ownership::Own`]).
    pub(crate) async fn roll_back_job(&mut self, nesting: Nesting) -> Ownership {
        match nesting {
            Nesting::Savepoint => self.rollback_to_savepoint().await,
            Nesting::Outermost | Nesting::Unmarked => {
                self.rollback().await;
                Ownership::Own
            }
        }
    }

    /// Ends whatever transaction the connection is in, once the job's own turned out to be gone;
    /// see [`abort_job`].
    ///
    /// Inside a caller's transaction, after a failed release of the job's savepoint: Diesel may
    /// have left the savepoint already (sync Diesel rolls back to it when the transaction is in
    /// error; diesel-async counts it gone on any failure). Then a rollback of Diesel's innermost
    /// transaction would be the caller's, and the job's savepoint is rolled back to by its name
    /// instead: that undoes the job's work if Diesel only counted it gone, and brings an aborted
    /// transaction back to where the caller left it. A savepoint that is gone stays gone.
    pub(crate) async fn abort_job(&mut self, nesting: Nesting) {
        let depth = self.store().transaction_depth().ok();
        match (nesting, self.finished_at) {
            (Nesting::Savepoint, Some(job)) if depth.is_some_and(|depth| depth < job) => {
                let back = format!("ROLLBACK TO SAVEPOINT diesel_savepoint_{}", job - 1);
                if let Err(error) = self.store().batch(&back).await {
                    tracing::debug!(%error, "the job's savepoint is gone: a statement of its body took it");
                }
            }
            _ => abort_job(self.store(), nesting).await,
        }
        self.open = false;
    }

    /// The connection as the caller knows it (what a body gets).
    pub(crate) fn conn(&mut self) -> &mut Conn {
        self.conn
    }

    /// The connection the runtime's statements run on.
    pub(crate) fn store(&mut self) -> &mut S {
        (self.reach)(self.conn)
    }

    /// Commits. Diesel rolls back a top-level transaction whose commit failed, so either way the
    /// transaction is over when this returns.
    pub(crate) async fn commit(&mut self) -> diesel::QueryResult<()> {
        let committed = match self.enclosing {
            Some(enclosing) => end_at_mark(self.store(), enclosing, true).await,
            None => self.store().commit().await,
        };
        self.open = false;
        committed
    }

    /// Rolls back, logging a failure rather than returning it: the caller is already returning the
    /// error that made the rollback necessary, and Diesel marks the connection broken if it could
    /// not roll back, so no later job commits into what is left.
    pub(crate) async fn rollback(&mut self) {
        let rolled_back = match self.enclosing {
            Some(enclosing) => end_at_mark(self.store(), enclosing, false).await,
            None => self.store().rollback().await,
        };
        if let Err(error) = rolled_back {
            tracing::error!(%error, "rolling back failed; the connection is marked broken");
        }
        self.open = false;
    }

    /// Ends the transaction on a connection whose answers are out of step with its statements
    /// (`Database::answers_in_step`): a `ROLLBACK` sent as text, which the server runs after what
    /// is pending whatever answer is read for it, and the connection marked broken (a pool
    /// discards it; a later call on it fails), since no answer read from it can be trusted.
    pub(crate) async fn break_off(&mut self) {
        if let Err(error) = self.store().batch(S::Db::ROLLBACK).await {
            tracing::debug!(%error, "the rollback on a connection out of step read an error, perhaps another statement's");
        }
        self.store().abandon(Unfinished::Transaction);
        self.open = false;
    }

    /// Arms the guard again (or disarms it) around statements the runtime sends after the job's
    /// own transaction ended, which a dropped future must not leave half done: a transaction of
    /// the runtime's begun as text, which Diesel does not count.
    pub(crate) fn guard(&mut self, open: bool) {
        self.open = open;
    }

    /// Hands the open transaction on without ending it (to a guard the caller creates next, with
    /// no `.await` and nothing that can panic in between).
    pub(crate) fn hand_over(mut self) {
        self.open = false;
    }
}

impl<Conn: ?Sized, S: Store, R: Fn(&mut Conn) -> &mut S> Drop for Transaction<'_, Conn, S, R> {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        let store = (self.reach)(self.conn);
        if std::thread::panicking() {
            // Dropped while unwinding (diesel-async's SQLite connection panics when a future is
            // dropped mid-statement on a current-thread runtime, its blocking task still holding
            // the connection): a second panic escaping a destructor now would abort the process.
            let abandoned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                store.abandon(Unfinished::Transaction);
            }));
            if abandoned.is_err() {
                tracing::error!(
                    "a job dropped while unwinding could not mark its connection broken: do not reuse it"
                );
            }
            return;
        }
        store.abandon(Unfinished::Transaction);
    }
}

/// The store itself, for transactions on a bare connection.
pub(crate) fn itself<S>(conn: &mut S) -> &mut S {
    conn
}

/// Why work that must run in a transaction of its own ([`outside_transactions`]) did not run.
#[derive(Debug)]
pub(crate) enum Outside {
    /// The connection is inside a transaction of the caller's: one Diesel opened, or one the
    /// session holds that Diesel does not know of (`autocommit = 0` with statements pending on
    /// MySQL, a `BEGIN` sent as text that has written on PostgreSQL). Nothing was run.
    InsideTransaction,
    /// The database refused a statement; the transaction was rolled back.
    Failed(diesel::result::Error),
    /// The connection failed while the transaction was committing: the database may have
    /// committed it or not.
    CommitUnknown(diesel::result::Error),
    /// The table the statements work on is not there: `migrate` has not run
    /// ([`Error::NotMigrated`](crate::error::Error::NotMigrated)), or it was dropped since. The
    /// statement's error, for a caller that changed something before it (a prune's later batch).
    NotMigrated(&'static str, diesel::result::Error),
}

impl From<diesel::result::Error> for Outside {
    fn from(error: diesel::result::Error) -> Self {
        Outside::Failed(error)
    }
}

/// Runs `statements` in a short transaction of their own, committed before this returns, and
/// refuses to run inside the caller's: what every operation that is not a job runs in (looking up,
/// listing and forgetting keys, pruning, inspecting the outbox and relaying it, verifying the
/// schema). In a transaction of the caller's it would see and change the caller's uncommitted
/// rows, and commit or roll back with them; a session that holds a transaction Diesel does not
/// know of (`autocommit = 0`) would never commit it; and behind a transaction pooler (PgBouncer in
/// transaction mode) only a transaction keeps a statement's prepare and its execution on one
/// server connection. Retried from `BEGIN` while the database is busy.
pub(crate) async fn outside_transactions<S: Store, T>(
    conn: &mut S,
    table: &'static str,
    statements: impl AsyncFnMut(&mut S) -> diesel::QueryResult<T>,
) -> Result<T, Outside> {
    outside_transactions_as(conn, table, Own::Look, statements).await
}

/// What a transaction of the runtime's own is for, which decides how it begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Own {
    /// Looking up, listing, forgetting, inspecting: a transaction that takes no lock until it needs
    /// one, so that it never waits for a job in progress (SQLite's `BEGIN DEFERRED`).
    Look,
    /// A batch of a prune: it will delete, so it takes SQLite's write lock at `BEGIN` (a deferred
    /// one that read first would lose its upgrade to any claim committed in between, and start
    /// over); `fewest_locks`: at the isolation that takes the fewest locks where the database
    /// chooses one per transaction (MySQL: READ COMMITTED, no gap locks in front of new claims).
    Prune { fewest_locks: bool },
    /// A relay's lease, or a read whose answer is reported (a key's record, the outbox's
    /// counts): deferred, as [`Own::Look`], reading only committed rows and locking nothing it
    /// reads plainly, whatever the session's own isolation
    /// ([`Database::committed_reads_next`]).
    Committed,
}

/// [`outside_transactions`], beginning as `own` says.
pub(crate) async fn outside_transactions_as<S: Store, T>(
    conn: &mut S,
    table: &'static str,
    own: Own,
    statements: impl AsyncFnMut(&mut S) -> diesel::QueryResult<T>,
) -> Result<T, Outside> {
    outside_transactions_judged(conn, table, own, |_| true, statements).await
}

/// [`outside_transactions_as`], where `wrote` tells from the statements' answer whether they
/// changed anything: a transaction that changed nothing (a read, a forget that found nothing to
/// forget, a batch that deleted no row) whose `COMMIT` reply is lost has its answer all the same,
/// where one that wrote is [`Outside::CommitUnknown`].
pub(crate) async fn outside_transactions_judged<S: Store, T>(
    conn: &mut S,
    table: &'static str,
    own: Own,
    wrote: impl Fn(&T) -> bool,
    statements: impl AsyncFnMut(&mut S) -> diesel::QueryResult<T>,
) -> Result<T, Outside> {
    outside_transactions_told(conn, table, own, wrote, statements)
        .await
        .map(|(value, _)| value)
}

/// [`outside_transactions_judged`], and the connection's failure at a `COMMIT` whose statements
/// changed nothing (their answer stands, and the connection is of no more use: a caller that
/// goes on to do more, a relay's next delivery, stops instead).
pub(crate) async fn outside_transactions_told<S: Store, T>(
    conn: &mut S,
    table: &'static str,
    own: Own,
    wrote: impl Fn(&T) -> bool,
    statements: impl AsyncFnMut(&mut S) -> diesel::QueryResult<T>,
) -> Result<(T, Option<diesel::result::Error>), Outside> {
    match in_own_transaction(conn, own, wrote, statements).await {
        // The usual first mistake, named: a failure that does not pass, on a table not there.
        Err(Outside::Failed(error))
            if !S::Db::classify(&error).is_transient()
                && !S::Db::connection_lost(&error)
                && matches!(S::Db::table_exists_alone(conn, table).await, Ok(false)) =>
        {
            Err(Outside::NotMigrated(table, error))
        }
        result => result,
    }
}

async fn in_own_transaction<S: Store, T>(
    conn: &mut S,
    own: Own,
    wrote: impl Fn(&T) -> bool,
    mut statements: impl AsyncFnMut(&mut S) -> diesel::QueryResult<T>,
) -> Result<(T, Option<diesel::result::Error>), Outside> {
    if conn.transaction_depth()? > 0 || S::Db::session_in_transaction(conn).await? {
        return Err(Outside::InsideTransaction);
    }
    let mut retry = Retry::new();
    loop {
        // A setting of the session's that `committed_reads_next` changed, put back below.
        let mut to_put_back = false;
        let attempt = async {
            let (mut transaction, _) = match own {
                Own::Look => Transaction::begin_deferred(&mut *conn, itself::<S>).await?,
                Own::Committed => {
                    to_put_back = S::Db::committed_reads_next(&mut *conn).await?;
                    Transaction::begin_deferred(&mut *conn, itself::<S>).await?
                }
                Own::Prune { fewest_locks } => {
                    if fewest_locks {
                        S::Db::fewest_locks_next(&mut *conn).await?;
                    }
                    Transaction::begin(&mut *conn, itself::<S>).await?
                }
            };
            match S::Db::begun_inside_another(transaction.store()).await {
                Ok(false) => {}
                Ok(true) => {
                    // The `BEGIN` did nothing: the transaction is the caller's, and stays open.
                    transaction.store().forget_transaction(false);
                    transaction.hand_over();
                    return Err(Outside::InsideTransaction);
                }
                Err(error) => {
                    transaction.rollback().await;
                    return Err(Outside::Failed(error));
                }
            }
            match statements(transaction.store()).await {
                Ok(value) => match transaction.commit().await {
                    Ok(()) => Ok((value, None)),
                    // The `COMMIT` may have reached the server: what it did is not known here,
                    // unless there was nothing for it to do.
                    Err(error) if S::Db::connection_lost(&error) => {
                        if wrote(&value) {
                            Err(Outside::CommitUnknown(error))
                        } else {
                            tracing::debug!(%error, "the connection failed at the COMMIT of statements that changed nothing; their answer stands");
                            Ok((value, Some(error)))
                        }
                    }
                    Err(error) => Err(Outside::Failed(error)),
                },
                Err(error) => {
                    transaction.rollback().await;
                    Err(Outside::Failed(error))
                }
            }
        };
        let attempt = attempt.await;
        if to_put_back && let Err(error) = S::Db::committed_reads_done(&mut *conn).await {
            tracing::warn!(%error, "putting back the session's reading of uncommitted rows failed");
        }
        match attempt {
            // SQLite refuses the `BEGIN` inside a transaction the caller sent as text: the
            // caller's, left open as it was.
            Err(Outside::Failed(error)) if S::Db::inside_callers_transaction(&error) => {
                return Err(Outside::InsideTransaction);
            }
            Err(Outside::Failed(error)) if retry.failed::<S::Db>(&error).is_some() => {
                retry.pause::<S>().await;
            }
            result => return result,
        }
    }
}

/// Runs `statements` in a short transaction of their own (a savepoint inside the caller's),
/// retried from `BEGIN` while the database is busy, guarded as a job's is.
#[cfg(any(feature = "postgres", feature = "async-postgres"))]
pub(crate) async fn in_transaction<S: Store, T>(
    conn: &mut S,
    mut statements: impl AsyncFnMut(&mut S) -> diesel::QueryResult<T>,
) -> diesel::QueryResult<T> {
    let mut retry = Retry::new();
    loop {
        let attempt = async {
            let (mut transaction, _) = Transaction::begin(&mut *conn, itself::<S>).await?;
            match statements(transaction.store()).await {
                Ok(value) => transaction.commit().await.map(|()| value),
                Err(error) => {
                    transaction.rollback().await;
                    Err(error)
                }
            }
        };
        match attempt.await {
            Err(error) if retry.failed::<S::Db>(&error).is_some() => retry.pause::<S>().await,
            result => return result,
        }
    }
}

/// Ends a savepoint the runtime opened inside a caller's transaction by its mark (see
/// [`enclosing_mark`]), so that no mark outlives its savepoint: `commit` releases the
/// mark (and Diesel's savepoint after it, with everything in it); else the rollback to the mark
/// undoes everything after it and releases it. One batch either way; after it Diesel counts the
/// caller's transactions again. It fails where the mark is gone: a statement of the body ended
/// the caller's transaction (or the connection failed).
pub(crate) async fn end_at_mark<S: Store>(
    store: &mut S,
    enclosing: u32,
    commit: bool,
) -> diesel::QueryResult<()> {
    let mark = enclosing_mark(enclosing);
    let sql = match commit {
        true => format!("RELEASE SAVEPOINT {mark}"),
        false => format!("ROLLBACK TO SAVEPOINT {mark}; RELEASE SAVEPOINT {mark}"),
    };
    let ended = store.batch(&sql).await;
    // The savepoint is gone either way (ended here, or with the caller's transaction): Diesel
    // counts the caller's transactions again, as its own failed rollback of a savepoint does, so
    // that the caller's rollback is the caller's.
    store.uncount_to(enclosing);
    ended
}

/// Commits a job's transaction, proving first that it is still the job's own: its savepoint
/// ([`Store::begin_job`]) is released, and only then is `COMMIT` sent, in one text batch where that
/// is one round trip (the `COMMIT` does not run when the release fails) and one after the other
/// elsewhere. Inside a caller's transaction it releases Diesel's savepoint (the job's own
/// transaction ends at its mark instead: [`Transaction::finish_job`]).
///
/// A transaction that is no longer the job's own ([`Finish::NotOwn`]) was ended, replaced or
/// aborted by a statement of the body; the connection is left for [`abort_job`].
pub(crate) async fn finish_job<S: Store>(store: &mut S, nesting: Nesting) -> Result<(), Finish> {
    if nesting == Nesting::Savepoint {
        return store.commit().await.map_err(Finish::NotOwn);
    }
    if let Some(error) = unbalanced(store) {
        return Err(Finish::NotOwn(error));
    }
    if store.finish_in_one_batch() {
        let finished = match store.release_and_commit().await {
            Err(error) => Err(S::Db::in_known_terms(store, error).await),
            finished => finished,
        };
        return match finished {
            Ok(()) => {
                store.forget_transaction(false);
                Ok(())
            }
            Err(error) if S::Db::connection_lost(&error) => {
                store.forget_transaction(true);
                Err(Finish::Commit(error))
            }
            Err(error) if S::Db::release_failed(&error) => Err(Finish::NotOwn(error)),
            Err(error) => {
                abort_job(store, nesting).await;
                Err(Finish::Commit(error))
            }
        };
    }
    if let Err(error) = S::Db::release_job(store).await {
        let error = S::Db::in_known_terms(store, error).await;
        return Err(if S::Db::connection_lost(&error) {
            store.forget_transaction(true);
            Finish::BeforeCommit(error)
        } else {
            Finish::NotOwn(error)
        });
    }
    match store.commit().await {
        Err(error) => Err(Finish::Commit(S::Db::in_known_terms(store, error).await)),
        committed => committed.map_err(Finish::Commit),
    }
}

/// Whether a body left Diesel's count of open transactions above the job's own one (a nested
/// `conn.transaction(..)` whose savepoint a statement of the body took away, so that its release
/// or rollback failed): then the job's own `COMMIT` or `ROLLBACK` would go to a savepoint that is
/// gone, and the transaction must be ended with [`abort_job`]. The error that says so, if it did.
pub(crate) fn unbalanced<S: Store>(store: &mut S) -> Option<diesel::result::Error> {
    match store.transaction_depth() {
        Ok(1) => None,
        Ok(depth) => Some(diesel::result::Error::QueryBuilderError(
            format!(
                "the job's body left {depth} transactions open where its own is 1: a statement of \
                 the body took away the savepoint of a transaction it nested"
            )
            .into(),
        )),
        Err(error) => Some(error),
    }
}

/// Whether a job's transaction is still its own, once its body is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ownership {
    /// Its savepoint is there: no statement of the body ended or replaced it.
    Own,
    /// The database answered that it is not (the savepoint is gone, the transaction aborted, or
    /// Diesel counts other depths): a statement of the body ended, replaced or aborted it, and may
    /// have committed the claim.
    NotOwn,
    /// No answer: the connection failed (or Diesel's transaction state is broken). An open
    /// transaction ends with its connection, uncommitted.
    Unknown,
}

impl Ownership {
    /// What a failed test of the transaction (releasing the job's savepoint, or Diesel's) says.
    pub(crate) fn from_failure<D: Database>(error: &diesel::result::Error) -> Self {
        if D::connection_lost(error)
            || matches!(error, diesel::result::Error::BrokenTransactionManager)
        {
            Ownership::Unknown
        } else {
            Ownership::NotOwn
        }
    }
}

/// Ends whatever transaction the connection is in with `ROLLBACK` (when the body ended the job's
/// own, it may have begun another), and tells Diesel that none is open; inside a caller's
/// transaction, rolls back to Diesel's savepoint.
pub(crate) async fn abort_job<S: Store>(store: &mut S, nesting: Nesting) {
    if nesting == Nesting::Savepoint {
        if let Err(error) = store.rollback().await {
            tracing::error!(%error, "rolling back a job's savepoint failed; the connection is marked broken");
        }
        return;
    }
    let rolled_back = store.batch(S::Db::ROLLBACK).await;
    // "No transaction is active" is what some databases answer; only a lost connection is broken.
    store.forget_transaction(matches!(&rolled_back, Err(error) if S::Db::connection_lost(error)));
}
