//! Deleting claims whose `keep` has lapsed, in bounded batches.
//!
//! A job with `keep = "30d"` may run again 30 days after it committed; its row stays until
//! pruned. The prune deletes lapsed rows a batch at a time, each batch one statement in a short
//! transaction of its own: it never holds locks for long, never builds one huge transaction, and
//! a table of millions of rows drains while workers keep claiming. What has lapsed is decided by
//! the database's clock. Run it from a periodic job, outside any transaction of yours.
//!
//! It leaves the database to the workers:
//!
//! * **Paced.** After each batch it pauses nine times as long as the batch took, at most 30 s
//!   ([`Prune::pace`]), so it takes at most a tenth of the database's time (unless a batch takes
//!   more than 3.3 s), and less when the database is busy.
//! * **No gap locks** on MySQL/MariaDB: each batch runs at READ COMMITTED (that transaction only),
//!   so it does not lock the index gap where every new claim's entry goes. Where statement-based
//!   binary logging forbids that (error 1665), it goes on at the session's isolation.
//! * **The write lock first** on SQLite (`BEGIN IMMEDIATE`): SQLite has one writer, and a batch
//!   that began by reading would lose its upgrade to any claim committed in between and start over.
//!
//! ```
//! use diesel::prelude::*;
//! use idempotent_runtime::prune::{Prune, prune};
//!
//! let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
//! idempotent_runtime::migrate(&mut conn)?;
//! let report = prune(&mut conn, &Prune::default().batch_size(5_000))?;
//! assert_eq!(report.removed, 0);
//! # Ok::<(), idempotent_runtime::Error>(())
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::store::{Database, Store};
use crate::transaction::{Outside, Own, outside_transactions_judged};

/// The longest pause pacing adds after one batch, however long the batch took.
const MAX_PACED_PAUSE: Duration = Duration::from_secs(30);

/// How to prune.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prune {
    batch_size: u32,
    pace: u32,
    pause: Duration,
    max_batches: Option<u32>,
    stop: StopFlag,
}

/// The flag [`Prune::stop_when`] reads: equal to another when it is the same flag.
#[derive(Debug, Clone, Default)]
struct StopFlag(Option<Arc<AtomicBool>>);

impl PartialEq for StopFlag {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(one), Some(other)) => Arc::ptr_eq(one, other),
            _ => false,
        }
    }
}

impl Eq for StopFlag {}

impl StopFlag {
    /// Whether the flag is set.
    fn raised(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|flag| flag.load(Ordering::SeqCst))
    }
}

/// How often a pause looks at [`Prune::stop_when`]'s flag.
const STOP_LOOKS: Duration = Duration::from_millis(50);

impl Default for Prune {
    /// Batches of 1,000 rows, paced 9 (a pause of nine times each batch's own duration after it),
    /// until none are left.
    fn default() -> Self {
        Self {
            batch_size: 1_000,
            pace: 9,
            pause: Duration::ZERO,
            max_batches: None,
            stop: StopFlag::default(),
        }
    }
}

impl Prune {
    /// Rows deleted per statement (at least 1).
    pub fn batch_size(mut self, rows: u32) -> Self {
        self.batch_size = rows.max(1);
        self
    }

    /// After each batch, a pause of `factor` times that batch's own duration (at most 30 s): the
    /// prune then takes at most `1 / (factor + 1)` of the database's time, however busy it is
    /// (as long as a batch takes less than `30 s / factor`: a slower one's pause is cut at 30 s),
    /// since a batch slowed by row locks or a busy disk is followed by a longer pause. A batch's
    /// duration runs from when its transaction has begun: waiting for SQLite's write lock is not
    /// work, and does not lengthen the pause. 9 by
    /// default: in the benchmark (`docs/performance.md`), claims running beside a prune of
    /// 100,000 lapsed rows kept their throughput and p99 latency on PostgreSQL only from about
    /// 9; unpaced, they lost 43% of their throughput there and 93% on MariaDB. `0` turns pacing
    /// off: the fastest prune, for a maintenance window with no workers.
    pub fn pace(mut self, factor: u32) -> Self {
        self.pace = factor;
        self
    }

    /// A fixed pause between batches, on top of [`pace`](Self::pace)'s.
    pub fn pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// Stops after this many batches, even if lapsed rows remain (the next run continues).
    pub fn max_batches(mut self, batches: u32) -> Self {
        self.max_batches = Some(batches);
        self
    }

    /// Stops between two batches once `flag` is set (a signal handler's, a shutdown's): the batch
    /// under way commits, the pause after it ends within 50 ms, and the report says so
    /// ([`PruneReport::stopped`]), counting what was deleted, all of it committed. The lapsed rows
    /// left wait for the next prune. A flag set before the prune starts stops it before its first
    /// batch.
    pub fn stop_when(mut self, flag: Arc<AtomicBool>) -> Self {
        self.stop = StopFlag(Some(flag));
        self
    }

    /// The pause after a batch that took `took`.
    fn pause_after(&self, took: Duration) -> Duration {
        took.saturating_mul(self.pace)
            .min(MAX_PACED_PAUSE)
            .saturating_add(self.pause)
    }
}

/// What a prune did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Rows deleted.
    pub removed: u64,
    /// Statements run (the last one may have deleted fewer than a batch, or none).
    pub batches: u32,
    /// The prune stopped at [`Prune::stop_when`]'s flag, lapsed rows perhaps left.
    pub stopped: bool,
}

/// Deletes lapsed claims in batches; see the [module docs](self).
pub fn prune<C: crate::connection::JobStore>(
    conn: &mut C,
    options: &Prune,
) -> Result<PruneReport, Error> {
    crate::drive::block_on(prune_lapsed(conn.idempotent_store(), options))
}

/// [`prune`] through an async connection.
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub async fn prune_async<C: crate::connection::AsyncJobStore>(
    conn: &mut C,
    options: &Prune,
) -> Result<PruneReport, Error> {
    prune_lapsed(conn.idempotent_store(), options).await
}

async fn prune_lapsed<S: Store>(conn: &mut S, options: &Prune) -> Result<PruneReport, Error> {
    let batches = Batches {
        what: "lapsed claims",
        table: "done_jobs",
    };
    batches
        .run(
            conn,
            options,
            async |conn: &mut S, limit| S::Db::prune_lapsed(conn, limit).await,
            "prune lapsed claims",
        )
        .await
}

/// A prune of one table: batches of one `DELETE ... LIMIT` each, every one in a short transaction
/// of its own that takes the write lock at `BEGIN` and the fewest locks it can
/// ([`Own::Prune`]), paced as the options say, until one comes back short or the options say to
/// stop.
pub(crate) struct Batches {
    /// What is deleted, for the events.
    pub(crate) what: &'static str,
    /// The table, for a message saying it is missing.
    pub(crate) table: &'static str,
}

impl Batches {
    /// The error of a prune that stopped at a batch, with what the batches before it deleted. A
    /// table missing at the first batch is [`Error::NotMigrated`], "nothing was changed"; one
    /// dropped after a batch deleted rows is the prune's error, which counts them.
    fn error<S: Store>(&self, outside: Outside, asked: &'static str, report: PruneReport) -> Error {
        let (source, outcome_unknown) = match outside {
            Outside::InsideTransaction => return Error::InsideTransaction { what: asked },
            Outside::NotMigrated(table, _) if report.batches == 0 => {
                return Error::NotMigrated { table };
            }
            Outside::NotMigrated(_, source) => (source, false),
            Outside::Failed(source) => (source, false),
            Outside::CommitUnknown(source) => (source, true),
        };
        Error::Prune {
            what: self.what,
            removed: report.removed,
            batches: report.batches,
            outcome_unknown,
            retryable: outcome_unknown || S::Db::passes(&source),
            source,
        }
    }

    /// One batch in a transaction of its own: how many rows it deleted, and when its transaction
    /// had begun. Where the database refuses the isolation that takes the fewest locks, it runs
    /// at the session's own, from then on (`fewest_locks` is cleared).
    async fn batch<S: Store>(
        &self,
        conn: &mut S,
        limit: i64,
        fewest_locks: &mut bool,
        delete: impl AsyncFn(&mut S, i64) -> diesel::QueryResult<usize> + Copy,
    ) -> Result<(usize, Instant), Outside> {
        loop {
            let own = Own::Prune {
                fewest_locks: *fewest_locks,
            };
            // The closure owns what it uses (a copy of `delete`): an async closure that
            // borrows makes a future rustc cannot prove `Send` (tests/jobs/spawnable.rs).
            // A batch that deleted nothing, whose `COMMIT` reply is lost, deleted nothing.
            let deleted = |(removed, _): &(usize, Instant)| *removed > 0;
            match outside_transactions_judged(
                conn,
                self.table,
                own,
                deleted,
                async move |conn: &mut S| {
                    let began = Instant::now();
                    delete(conn, limit).await.map(|removed| (removed, began))
                },
            )
            .await
            {
                Err(Outside::Failed(refused))
                    if *fewest_locks && S::Db::fewest_locks_refused(&refused) =>
                {
                    tracing::info!(
                        error = %refused,
                        what = self.what,
                        "the database refused the prune's isolation; pruning at the session's own"
                    );
                    *fewest_locks = false;
                }
                result => return result,
            }
        }
    }

    pub(crate) async fn run<S: Store>(
        &self,
        conn: &mut S,
        options: &Prune,
        delete: impl AsyncFn(&mut S, i64) -> diesel::QueryResult<usize> + Copy,
        asked: &'static str,
    ) -> Result<PruneReport, Error> {
        let mut report = PruneReport::default();
        if options.max_batches == Some(0) {
            return Ok(report);
        }
        let mut fewest_locks = true;
        loop {
            if options.stop.raised() {
                report.stopped = true;
                tracing::info!(
                    removed = report.removed,
                    batches = report.batches,
                    what = self.what,
                    "prune stopped at its flag"
                );
                return Ok(report);
            }
            // The batch's own time runs from when its transaction has begun: waiting for
            // SQLite's write lock (`BEGIN IMMEDIATE` behind the workers' claims) puts no load on
            // the database, and charged to the pace it made a prune beside busy workers pause
            // seconds per batch and fall behind the keys lapsing.
            let limit = i64::from(options.batch_size);
            let (removed, began) = self
                .batch(conn, limit, &mut fewest_locks, delete)
                .await
                .map_err(|outside| self.error::<S>(outside, asked, report))?;
            let took = began.elapsed();
            report.removed += removed as u64;
            report.batches += 1;
            let finished = removed < options.batch_size as usize
                || options.max_batches.is_some_and(|max| report.batches >= max);
            let pause = if finished {
                Duration::ZERO
            } else {
                options.pause_after(took)
            };
            tracing::debug!(
                removed,
                batch = report.batches,
                what = self.what,
                took_us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
                pause_us = u64::try_from(pause.as_micros()).unwrap_or(u64::MAX),
                "pruned a batch"
            );
            if finished {
                tracing::info!(
                    removed = report.removed,
                    batches = report.batches,
                    what = self.what,
                    "pruned"
                );
                return Ok(report);
            }
            pause_unless_stopped::<S>(pause, &options.stop).await;
        }
    }
}

/// Pauses for `pause`, looking at `stop` every [`STOP_LOOKS`] where there is one, and ending once
/// it is set.
async fn pause_unless_stopped<S: Store>(pause: Duration, stop: &StopFlag) {
    if stop.0.is_none() {
        if !pause.is_zero() {
            S::pause(pause).await;
        }
        return;
    }
    let mut left = pause;
    while !left.is_zero() && !stop.raised() {
        let slice = left.min(STOP_LOOKS);
        S::pause(slice).await;
        left = left.saturating_sub(slice);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pause of `Duration::MAX` (for "never go on by myself") saturates: it was "overflow when
    /// adding durations", a panic after the first batch had committed, its report lost.
    #[test]
    fn pauses_saturate() {
        let prune = Prune::default().pause(Duration::MAX);
        assert_eq!(prune.pause_after(Duration::from_millis(5)), Duration::MAX);
        assert_eq!(prune.pause_after(Duration::MAX), Duration::MAX);
        let paced = Prune::default().pace(9);
        assert_eq!(
            paced.pause_after(Duration::from_millis(10)),
            Duration::from_millis(90)
        );
    }
}
