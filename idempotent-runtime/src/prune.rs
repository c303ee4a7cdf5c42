//! Deleting claims whose `keep` has lapsed, in bounded batches.
//!
//! A job with `keep = "30d"` may run again 30 days after it ran; its row stays until pruned. The
//! prune deletes lapsed rows a batch at a time, each batch one statement and so one short
//! transaction: it never holds locks for long, never builds one huge transaction, and a table of
//! millions of rows drains while workers keep claiming. Run it from a periodic job, outside any
//! transaction of yours.
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

use std::time::Duration;

use crate::error::Error;
use crate::store::JobStore;

/// How to prune.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prune {
    batch_size: u32,
    pause: Duration,
    max_batches: Option<u32>,
}

impl Default for Prune {
    /// Batches of 1,000 rows, no pause, until none are left.
    fn default() -> Self {
        Self {
            batch_size: 1_000,
            pause: Duration::ZERO,
            max_batches: None,
        }
    }
}

impl Prune {
    /// Rows deleted per statement (at least 1).
    pub fn batch_size(mut self, rows: u32) -> Self {
        self.batch_size = rows.max(1);
        self
    }

    /// A pause between batches, to leave the database room for other work.
    pub fn pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// Stops after this many batches, even if lapsed rows remain (the next run continues).
    pub fn max_batches(mut self, batches: u32) -> Self {
        self.max_batches = Some(batches);
        self
    }
}

/// What a prune did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Rows deleted.
    pub removed: u64,
    /// Statements run (the last one may have deleted fewer than a batch, or none).
    pub batches: u32,
}

/// Deletes lapsed claims in batches; see the [module docs](self).
pub fn prune<C: JobStore>(conn: &mut C, options: &Prune) -> Result<PruneReport, Error> {
    let now = chrono::Utc::now().naive_utc();
    in_batches(options, |limit| {
        crate::run::retry_transient::<C, _>(|| conn.prune_lapsed(now, limit)).map_err(Error::Prune)
    })
}

/// Runs `batch` (which deletes at most `limit` rows and says how many) until one comes back short
/// or `options` says to stop, pausing between batches as it says.
pub(crate) fn in_batches(
    options: &Prune,
    mut batch: impl FnMut(i64) -> Result<usize, Error>,
) -> Result<PruneReport, Error> {
    let mut report = PruneReport::default();
    loop {
        let removed = batch(i64::from(options.batch_size))?;
        report.record(removed);
        if report.done(removed, options) {
            return Ok(report);
        }
        if !options.pause.is_zero() {
            std::thread::sleep(options.pause);
        }
    }
}

/// [`prune`] through an async connection.
#[cfg(feature = "async")]
pub async fn prune_async<C: crate::AsyncJobStore>(
    conn: &mut C,
    options: &Prune,
) -> Result<PruneReport, Error> {
    let now = chrono::Utc::now().naive_utc();
    in_batches_async(options, async |limit| {
        crate::asynchronous::retry_transient_async::<C, _>(async || {
            conn.prune_lapsed(now, limit).await
        })
        .await
        .map_err(Error::Prune)
    })
    .await
}

/// [`in_batches`] with an async batch, pausing without blocking the runtime.
#[cfg(feature = "async")]
pub(crate) async fn in_batches_async(
    options: &Prune,
    mut batch: impl AsyncFnMut(i64) -> Result<usize, Error>,
) -> Result<PruneReport, Error> {
    let mut report = PruneReport::default();
    loop {
        let removed = batch(i64::from(options.batch_size)).await?;
        report.record(removed);
        if report.done(removed, options) {
            return Ok(report);
        }
        if !options.pause.is_zero() {
            tokio::time::sleep(options.pause).await;
        }
    }
}

impl PruneReport {
    fn record(&mut self, removed: usize) {
        self.removed += removed as u64;
        self.batches += 1;
        tracing::debug!(
            removed,
            batch = self.batches,
            "pruned a batch of lapsed claims"
        );
    }

    fn done(&self, removed: usize, options: &Prune) -> bool {
        let finished = removed < options.batch_size as usize
            || options.max_batches.is_some_and(|max| self.batches >= max);
        if finished {
            tracing::info!(
                removed = self.removed,
                batches = self.batches,
                "pruned lapsed claims"
            );
        }
        finished
    }
}
