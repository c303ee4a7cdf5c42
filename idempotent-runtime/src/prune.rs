//! Deleting claims whose `keep` has lapsed, in bounded batches.
//!
//! A job with `keep = "30d"` may run again 30 days after it committed; its row stays until
//! pruned. The prune deletes lapsed rows a batch at a time, each batch one statement and so one
//! short transaction: it never holds locks for long, never builds one huge transaction, and a table
//! of millions of rows drains while workers keep claiming. What has lapsed is decided by the
//! database's clock. Run it from a periodic job, outside any transaction of yours.
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
use crate::store::{Database, Store};

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
    in_batches::<S>(options, "lapsed claims", async |limit| {
        crate::transaction::outside_transactions(conn, "done_jobs", async |conn: &mut S| {
            S::Db::prune_lapsed(conn, limit).await
        })
        .await
        .map_err(|outside| match outside {
            crate::transaction::Outside::InsideTransaction => Error::InsideTransaction {
                what: "prune lapsed claims",
            },
            crate::transaction::Outside::NotMigrated(table) => Error::NotMigrated { table },
            crate::transaction::Outside::Failed(source) => Error::Prune(source),
        })
    })
    .await
}

/// Runs `batch` (which deletes at most `limit` rows and says how many) until one comes back short
/// or `options` says to stop, pausing between batches as it says.
pub(crate) async fn in_batches<S: Store>(
    options: &Prune,
    what: &'static str,
    mut batch: impl AsyncFnMut(i64) -> Result<usize, Error>,
) -> Result<PruneReport, Error> {
    let mut report = PruneReport::default();
    loop {
        let removed = batch(i64::from(options.batch_size)).await?;
        report.removed += removed as u64;
        report.batches += 1;
        tracing::debug!(removed, batch = report.batches, what, "pruned a batch");
        let finished = removed < options.batch_size as usize
            || options.max_batches.is_some_and(|max| report.batches >= max);
        if finished {
            tracing::info!(
                removed = report.removed,
                batches = report.batches,
                what,
                "pruned"
            );
            return Ok(report);
        }
        if !options.pause.is_zero() {
            S::pause(options.pause).await;
        }
    }
}
