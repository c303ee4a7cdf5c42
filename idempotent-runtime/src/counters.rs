//! One job definition's counters: atomics in the job's own `static`, so that counting a call takes
//! no lock shared with other jobs or threads. [`crate::stats`] reads and publishes them and keeps
//! the list of jobs that have counted.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// How a job call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Ending {
    /// The body ran and committed.
    Ran,
    /// The stored result came back; nothing ran.
    Replayed,
    /// The body returned `Err`; rolled back.
    Failed,
    /// The body panicked; rolled back.
    Panicked,
    /// The key came back with different inputs; nothing ran.
    FingerprintMismatch,
    /// Another job holds the key; nothing ran.
    KeyConflict,
    /// The database or the result encoding failed; rolled back.
    Error,
    /// Another run of the key was in progress and the in-progress policy did not wait; nothing ran.
    InProgress,
}

/// One counter per [`Ending`], reached by an exhaustive match: an ending added to the enum is a
/// compile error here until it has a counter of its own.
#[derive(Debug)]
struct Endings {
    ran: AtomicU64,
    replayed: AtomicU64,
    failed: AtomicU64,
    panicked: AtomicU64,
    fingerprint_mismatch: AtomicU64,
    key_conflict: AtomicU64,
    error: AtomicU64,
    in_progress: AtomicU64,
}

impl Endings {
    const fn new() -> Self {
        Self {
            ran: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            panicked: AtomicU64::new(0),
            fingerprint_mismatch: AtomicU64::new(0),
            key_conflict: AtomicU64::new(0),
            error: AtomicU64::new(0),
            in_progress: AtomicU64::new(0),
        }
    }

    fn of(&self, ending: Ending) -> &AtomicU64 {
        match ending {
            Ending::Ran => &self.ran,
            Ending::Replayed => &self.replayed,
            Ending::Failed => &self.failed,
            Ending::Panicked => &self.panicked,
            Ending::FingerprintMismatch => &self.fingerprint_mismatch,
            Ending::KeyConflict => &self.key_conflict,
            Ending::Error => &self.error,
            Ending::InProgress => &self.in_progress,
        }
    }
}

#[derive(Debug)]
pub(crate) struct JobCounters {
    endings: Endings,
    claim_retries: AtomicU64,
    /// The last 32 calls that ran or replayed, newest in the lowest bit: 1 for a replay.
    recent_replays: AtomicU32,
    /// Whether the job is on `stats`' list of jobs that have counted.
    listed: AtomicBool,
}

impl JobCounters {
    pub(crate) const fn new() -> Self {
        Self {
            endings: Endings::new(),
            claim_retries: AtomicU64::new(0),
            recent_replays: AtomicU32::new(0),
            listed: AtomicBool::new(false),
        }
    }

    /// Counts one call that ended so; `ran_or_replayed` feeds the replay history.
    pub(crate) fn count(&self, ending: Ending, ran_or_replayed: Option<bool>) {
        self.endings.of(ending).fetch_add(1, Ordering::Relaxed);
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

    pub(crate) fn ended(&self, ending: Ending) -> u64 {
        self.endings.of(ending).load(Ordering::Relaxed)
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
