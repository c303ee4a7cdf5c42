//! One job definition's counters: atomics in the job's own `static`, so that counting a call takes
//! no lock shared with other jobs or threads. [`crate::stats`] gives them their meaning (which
//! slot is which outcome) and keeps the list of jobs that have counted.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// How many ways a call can end (`stats::Ending`'s variants, in declaration order).
const ENDINGS: usize = 8;

#[derive(Debug)]
pub(crate) struct JobCounters {
    /// By ending, in `stats::Ending`'s declaration order.
    endings: [AtomicU64; ENDINGS],
    claim_retries: AtomicU64,
    /// The last 32 calls that ran or replayed, newest in the lowest bit: 1 for a replay.
    recent_replays: AtomicU32,
    /// Whether the job is on `stats`' list of jobs that have counted.
    listed: AtomicBool,
}

impl JobCounters {
    pub(crate) const fn new() -> Self {
        Self {
            endings: [const { AtomicU64::new(0) }; ENDINGS],
            claim_retries: AtomicU64::new(0),
            recent_replays: AtomicU32::new(0),
            listed: AtomicBool::new(false),
        }
    }

    /// Counts one call that ended in slot `ending`; `ran_or_replayed` feeds the replay history.
    pub(crate) fn count(&self, ending: usize, ran_or_replayed: Option<bool>) {
        self.endings[ending].fetch_add(1, Ordering::Relaxed);
        if let Some(replayed) = ran_or_replayed {
            // Lost updates between racing threads only blur a heuristic.
            let recent = self.recent_replays.load(Ordering::Relaxed);
            self.recent_replays
                .store((recent << 1) | u32::from(replayed), Ordering::Relaxed);
        }
    }

    pub(crate) fn count_retry(&self) {
        self.claim_retries.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn ended(&self, ending: usize) -> u64 {
        self.endings[ending].load(Ordering::Relaxed)
    }

    pub(crate) fn retries(&self) -> u64 {
        self.claim_retries.load(Ordering::Relaxed)
    }

    /// `true` the first time it is asked, for one caller only.
    pub(crate) fn first_listing(&self) -> bool {
        !self.listed.load(Ordering::Acquire) && !self.listed.swap(true, Ordering::AcqRel)
    }

    /// Whether 12 of the job's last 16 calls that ran or replayed were replays.
    pub(crate) fn mostly_replays(&self) -> bool {
        (self.recent_replays.load(Ordering::Relaxed) & 0xFFFF).count_ones() >= 12
    }
}
