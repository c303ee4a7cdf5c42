//! The one transaction guard: every transaction the runtime opens (a job's, a relay's lease, a
//! migration's) is committed or rolled back explicitly, and cleaned up by [`Store::abandon`] when
//! the guard is dropped open: a panic unwinding through it, or a future dropped at an `.await`. On
//! a sync connection that rolls back at once; on an async one, which cannot run a statement in
//! `drop`, it marks the connection broken so that no later job commits into what was left open.

use crate::retry::Retry;
use crate::store::{Nesting, Store, Unfinished};

/// A transaction the runtime opened: committed or rolled back explicitly, cleaned up by
/// [`Store::abandon`] when dropped open.
pub(crate) struct Transaction<'a, Conn: ?Sized, S: Store, R: Fn(&mut Conn) -> &mut S> {
    conn: &'a mut Conn,
    reach: R,
    open: bool,
}

impl<'a, Conn: ?Sized, S: Store, R: Fn(&mut Conn) -> &mut S> Transaction<'a, Conn, S, R> {
    /// Takes charge of the transaction just opened on `conn`.
    pub(crate) fn opened(conn: &'a mut Conn, reach: R) -> Self {
        Self {
            conn,
            reach,
            open: true,
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
            Ok(nesting) => Ok((transaction, nesting)),
            Err(error) => {
                // Nothing was opened.
                transaction.open = false;
                Err(error)
            }
        }
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
        let committed = self.store().commit().await;
        self.open = false;
        committed
    }

    /// Rolls back, logging a failure rather than returning it: the caller is already returning the
    /// error that made the rollback necessary, and Diesel marks the connection broken if it could
    /// not roll back, so no later job commits into what is left.
    pub(crate) async fn rollback(&mut self) {
        if let Err(error) = self.store().rollback().await {
            tracing::error!(%error, "rolling back failed; the connection is marked broken");
        }
        self.open = false;
    }

    /// Hands the open transaction on without ending it (to a guard the caller creates next, with
    /// no `.await` and nothing that can panic in between).
    pub(crate) fn hand_over(mut self) {
        self.open = false;
    }
}

impl<Conn: ?Sized, S: Store, R: Fn(&mut Conn) -> &mut S> Drop for Transaction<'_, Conn, S, R> {
    fn drop(&mut self) {
        if self.open {
            let store = (self.reach)(self.conn);
            store.abandon(Unfinished::Transaction);
        }
    }
}

/// The store itself, for transactions on a bare connection.
pub(crate) fn itself<S>(conn: &mut S) -> &mut S {
    conn
}

/// Runs `statements` in a short transaction of their own (a savepoint inside the caller's),
/// retried from `BEGIN` while the database is busy, guarded as a job's is.
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
