//! Redeliveries: when a job is likely done already, read its key before opening a transaction.
//!
//! A job call normally opens a write transaction and claims its key; when the key is already
//! claimed, the claim finds the first run's row and replays it. That costs a transaction for what
//! one indexed read answers. When the broker says a message is a **redelivery** (RabbitMQ's
//! `redelivered` flag, a delivery count above one, an attempt number above one), the first run
//! has likely committed, and the call reads the key first, in a statement of its own:
//!
//! * a committed row of the same job, with the same fingerprint, that has not lapsed: its result
//!   is replayed at once, with no transaction and no lock (what a replay under the claim would
//!   have returned);
//! * anything else (no row, a run still in progress, a lapsed row, a row whose run never finished,
//!   another job's row, a different fingerprint, a failed read): the call takes the usual path,
//!   claim first, which decides under the key's lock. So does a read that could see an old
//!   snapshot: on a PostgreSQL hot standby (it finds nothing there, and the claim, which writes, is
//!   refused), on MySQL/MariaDB in a session with `autocommit = 0`, and on a Galera node whose
//!   session does not read causally (`wsrep_sync_wait` without bit 1). The read only ever
//!   short-cuts to the answer the claim would give. A call inside a transaction of the caller's
//!   does not read first, nor does any call once [`allow_read_first`]`(false)` was called.
//!
//! On diesel-async's PostgreSQL connection the read runs inside the job's transaction, just before
//! the claim (a replay then commits a transaction that wrote nothing): it prepares and executes a
//! statement in two exchanges, and behind a transaction pooler (PgBouncer with
//! `pool_mode = transaction`) a statement outside a transaction may be prepared on one server
//! connection and executed on another, where another client's statement may carry its name; within
//! a transaction both happen on one. Elsewhere (Diesel's sync `PgConnection`, which sends the read
//! in one message; MySQL/MariaDB) it is a statement of its own, before any transaction. On SQLite
//! it goes in a read transaction of the runtime's own (`BEGIN DEFERRED`, the read, `ROLLBACK`: in
//! process, no round trip), which SQLite refuses where the session holds a transaction of its own,
//! whose snapshot (WAL mode) may be older than the key's last change.
//!
//! First deliveries (`redelivered(false, ..)`) skip the read, so they pay nothing for it. A call
//! told nothing reads first when 12 of its job's last 16 calls that ran or replayed were replays
//! (a redelivery storm after an outage, on a broker that does not say), and not otherwise, until
//! fresh calls bring the job back below that.
//!
//! ```
//! # use diesel::prelude::*;
//! # #[derive(Debug)] struct Error; impl From<idempotent_runtime::Error> for Error { fn from(_: idempotent_runtime::Error) -> Self { Error } }
//! # fn send_invoice(_conn: &mut SqliteConnection, _month: &str) -> Result<(), Error> { Ok(()) }
//! # let mut conn = SqliteConnection::establish(":memory:").unwrap();
//! # let redelivered = true;
//! // `redelivered` as the broker reports it for this message:
//! idempotent_runtime::redelivered(redelivered, || send_invoice(&mut conn, "2026-10"))?;
//! # Ok::<(), Error>(())
//! ```

use std::cell::Cell;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether calls may read their key before claiming it; see [`allow_read_first`].
static READ_FIRST: AtomicBool = AtomicBool::new(true);

/// Allows (the default) or forbids, for the whole process, reading a key before the claim: with
/// `false`, every call claims first, as a first delivery does.
pub fn allow_read_first(allowed: bool) {
    READ_FIRST.store(allowed, Ordering::Relaxed);
}

pub(crate) fn read_first_allowed() -> bool {
    READ_FIRST.load(Ordering::Relaxed)
}

/// A read before the claim failed: the call goes on to claim, which decides.
pub(crate) fn read_failed(error: &diesel::result::Error) {
    tracing::debug!(%error, "reading a key before its claim failed; claiming");
}

thread_local! {
    static REDELIVERED: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Puts the previous flag back when dropped, on a panic as well.
struct Restore(Option<bool>);

impl Drop for Restore {
    fn drop(&mut self) {
        REDELIVERED.with(|flag| flag.set(self.0));
    }
}

fn set(redelivered: Option<bool>) -> Restore {
    Restore(REDELIVERED.with(|flag| flag.replace(redelivered)))
}

/// Runs `f`, telling the job calls it makes (on this thread, not their bodies' nested jobs) whether
/// their message is a redelivery; see the [module docs](self).
pub fn redelivered<R>(redelivered: bool, f: impl FnOnce() -> R) -> R {
    let _restore = set(Some(redelivered));
    f()
}

/// [`redelivered`] for an async job call: the flag holds during every poll of `future`.
pub async fn redelivered_async<F: Future>(redelivered: bool, future: F) -> F::Output {
    let mut future = pin!(future);
    poll_fn(|cx| {
        let _restore = set(Some(redelivered));
        future.as_mut().poll(cx)
    })
    .await
}

/// Whether the call starting now was told its message is a redelivery (`Some(true)`), a first
/// delivery (`Some(false)`), or nothing.
pub(crate) fn current() -> Option<bool> {
    REDELIVERED.with(Cell::get)
}

/// Runs `f` (a poll of a job's body) with the flag cleared: the jobs a body calls are not
/// redeliveries because their caller's message is.
pub(crate) fn cleared<R>(f: impl FnOnce() -> R) -> R {
    let _restore = set(None);
    f()
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use diesel::connection::SimpleConnection as _;
    use diesel::{Connection as _, SqliteConnection};

    use crate::{Error, Job, JobCall, JobKey};

    static STORM: Job = Job::new("redelivery_storm", "storm:<n>");

    fn call(conn: &mut SqliteConnection, n: u32) -> Result<crate::Outcome<u32>, Error> {
        let key = JobKey::new(format!("storm:{n}"));
        JobCall::new(&STORM, &key).run(conn, |_| Ok::<_, Error>(n))
    }

    /// Without a hint, a job reads first once 12 of its last 16 calls replayed, and stops once
    /// fresh calls bring it below that; on a read-only connection only a call that reads first can
    /// replay (the claim writes).
    #[test]
    fn a_run_of_replays_reads_first_until_fresh_calls_return() {
        let mut conn = SqliteConnection::establish(":memory:").expect("SQLite");
        crate::migrate(&mut conn).expect("the runtime's tables");
        for n in 0..20 {
            assert!(call(&mut conn, n).expect("runs").is_ran());
        }
        conn.batch_execute("PRAGMA query_only = 1")
            .expect("read-only");
        call(&mut conn, 0).expect_err("after fresh calls, a replay claims, which is refused");
        conn.batch_execute("PRAGMA query_only = 0")
            .expect("writable");
        for n in 0..16 {
            assert!(call(&mut conn, n).expect("replays").is_replayed());
        }
        conn.batch_execute("PRAGMA query_only = 1")
            .expect("read-only");
        let replayed = call(&mut conn, 3).expect("in a run of replays, a replay reads first");
        assert_eq!(replayed.into_inner(), 3);
        conn.batch_execute("PRAGMA query_only = 0")
            .expect("writable");
        for n in 100..116 {
            assert!(call(&mut conn, n).expect("runs").is_ran());
        }
        conn.batch_execute("PRAGMA query_only = 1")
            .expect("read-only");
        call(&mut conn, 4).expect_err("fresh calls again: a replay claims");
        // A hint wins over the history either way.
        let told = super::redelivered(true, || call(&mut conn, 4)).expect("told it is redelivered");
        assert!(told.is_replayed());
    }
}
