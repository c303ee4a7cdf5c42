//! Retrying statements the database refused for a reason that passes: one policy for every
//! transaction the runtime opens (claims, leases, prunes, migrations), sync and async alike.
//!
//! Retrying is safe because nothing has run yet: a claim is retried from `BEGIN`, before the body;
//! a relay's or a prune's statements change nothing they would not change again.

use std::time::{Duration, Instant};

use diesel::result::{Error as DieselError, QueryResult};

use crate::store::{Database, Fault, Store};

/// How long transient failures (a busy database, deadlocks, lock timeouts) are retried.
pub(crate) const WINDOW: Duration = Duration::from_secs(30);

/// The state of one retried operation: attempts so far, and what the failures were.
#[derive(Debug)]
pub(crate) struct Retry {
    started: Instant,
    window: Duration,
    pub(crate) attempts: u32,
    pub(crate) busy: u32,
    pub(crate) deadlocks: u32,
    pub(crate) lock_timeouts: u32,
    pub(crate) serialization: u32,
    /// The claim found the key's row changing under it every turn ([`key_kept_changing`]).
    pub(crate) changing: u32,
}

/// The error a claim gives when the key's row changed under each of its turns (pruned, or renewed
/// by other workers): transient, retried as a serialization failure, and counted as itself.
pub(crate) fn key_kept_changing() -> DieselError {
    DieselError::DatabaseError(
        diesel::result::DatabaseErrorKind::SerializationFailure,
        Box::new(String::from(KEY_KEPT_CHANGING)),
    )
}

const KEY_KEPT_CHANGING: &str =
    "the claimed key kept changing under the claim (pruned or renewed by other workers)";

fn is_key_kept_changing(error: &DieselError) -> bool {
    matches!(error, DieselError::DatabaseError(_, info) if info.message() == KEY_KEPT_CHANGING)
}

impl Retry {
    pub(crate) fn new() -> Self {
        Self::within(WINDOW)
    }

    /// Retries for up to `window`.
    pub(crate) fn within(window: Duration) -> Self {
        Self {
            started: Instant::now(),
            window,
            attempts: 0,
            busy: 0,
            deadlocks: 0,
            lock_timeouts: 0,
            serialization: 0,
            changing: 0,
        }
    }

    /// Counts a failed attempt: `Some(fault)` when it is worth another try within the window,
    /// after [`pause`](Self::pause).
    pub(crate) fn failed<D: Database>(&mut self, error: &DieselError) -> Option<Fault> {
        self.attempts += 1;
        if is_key_kept_changing(error) {
            // Not the database's deadlock or serialization failure, whatever it classifies it as.
            self.changing += 1;
            return (self.started.elapsed() < self.window).then_some(Fault::Serialization);
        }
        let fault = D::classify(error);
        match fault {
            Fault::Busy => self.busy += 1,
            Fault::Deadlock => self.deadlocks += 1,
            Fault::LockTimeout => self.lock_timeouts += 1,
            Fault::Serialization => self.serialization += 1,
            Fault::Other => return None,
        }
        (self.started.elapsed() < self.window).then_some(fault)
    }

    /// Whether the window ran out (as opposed to an error that is not transient).
    pub(crate) fn exhausted<D: Database>(&self, error: &DieselError) -> bool {
        is_key_kept_changing(error) || D::classify(error).is_transient()
    }

    /// Waits before the next attempt, without holding anything.
    pub(crate) async fn pause<S: Store>(&self) {
        S::pause(backoff(self.attempts)).await;
    }

    /// How long it was retried for.
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// What the failures were, for an error message.
    pub(crate) fn explain(&self) -> String {
        let mut parts = Vec::new();
        if self.busy > 0 {
            parts.push(format!(
                "{} times another connection held the database's write lock",
                self.busy
            ));
        }
        if self.lock_timeouts > 0 {
            parts.push(format!(
                "{} times another transaction held the key (or a row lock) past the session's lock wait or statement timeout",
                self.lock_timeouts
            ));
        }
        if self.deadlocks > 0 {
            parts.push(format!("{} deadlocks", self.deadlocks));
        }
        if self.serialization > 0 {
            parts.push(format!("{} serialization failures", self.serialization));
        }
        if self.changing > 0 {
            parts.push(format!(
                "{} times the key's row changed under the claim (pruned or renewed by other workers; where none runs, a trigger on `done_jobs` that drops or changes the claim's row)",
                self.changing
            ));
        }
        parts.join(", ")
    }
}

/// Runs `op` on `conn` until it succeeds or fails in a way that is not transient for `S`'s
/// database, for up to [`WINDOW`]. The connection is passed in, not captured: an async closure
/// that borrows makes a future rustc cannot prove `Send` (tests/jobs/spawnable.rs).
pub(crate) async fn retrying<S: Store, T>(
    conn: &mut S,
    mut op: impl AsyncFnMut(&mut S) -> QueryResult<T>,
) -> QueryResult<T> {
    let mut retry = Retry::new();
    loop {
        match op(conn).await {
            Err(error) if retry.failed::<S::Db>(&error).is_some() => retry.pause::<S>().await,
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
