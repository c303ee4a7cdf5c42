//! What happened to jobs, for operators: `tracing` events, counters you can read, and (with the
//! `metrics` feature) counters and histograms through the `metrics` facade.
//!
//! Every job call runs in a `tracing` span `idempotent.job` with fields `job` and `key`, and ends
//! with one event whose `outcome` field is one of:
//!
//! | outcome                | level | meaning                                                         |
//! |------------------------|-------|-----------------------------------------------------------------|
//! | `ran`                  | DEBUG | the key was free; the body ran and committed                    |
//! | `replayed`             | DEBUG | the key was claimed; the stored result came back, nothing ran   |
//! | `failed`               | DEBUG | the body returned `Err`; rolled back, claim included            |
//! | `in_progress`          | DEBUG | another run of the key was in progress; nothing ran             |
//! | `panicked`             | WARN  | the body panicked; rolled back, then the panic went on          |
//! | `fingerprint_mismatch` | WARN  | the key came back with different inputs; nothing ran            |
//! | `key_conflict`         | WARN  | another job holds the key; nothing ran                          |
//! | `error`                | WARN  | the database or the result encoding failed; rolled back         |
//!
//! The DEBUG ones are at INFO after [`job_events_at_info`]`(true)`. Each event carries
//! `duration_us`, the time from the claim's start to the commit or rollback. A job with
//! `redact_key` shows `redacted:<digest prefix>` in place of its key, here and in errors.
//!
//! With the `metrics` feature the runtime records the metrics of [`METRICS`], all named
//! `idempotent_jobs_*` with their unit last, and describes them (unit and meaning) to the recorder
//! before it records the first ([`describe_metrics`]).

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use crate::job::Job;

pub use crate::counters::Ending;
#[cfg(feature = "metrics")]
pub use crate::telemetry::describe_metrics;
pub use crate::telemetry::{METRICS, Metric, MetricKind};

impl Ending {
    /// The name used in events and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Ending::Ran => "ran",
            Ending::Replayed => "replayed",
            Ending::Failed => "failed",
            Ending::Panicked => "panicked",
            Ending::FingerprintMismatch => "fingerprint_mismatch",
            Ending::KeyConflict => "key_conflict",
            Ending::Error => "error",
            Ending::InProgress => "in_progress",
        }
    }
}

/// Counts of job calls by outcome, since the process started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Calls whose body ran and committed.
    pub ran: u64,
    /// Calls that replayed a stored result.
    pub replayed: u64,
    /// Calls whose body returned `Err`.
    pub failed: u64,
    /// Calls whose body panicked.
    pub panicked: u64,
    /// Calls refused because their inputs differed from the first run's.
    pub fingerprint_mismatches: u64,
    /// Calls refused because another job holds their key.
    pub key_conflicts: u64,
    /// Calls that failed in the database or encoding their result.
    pub errors: u64,
    /// Calls that met another run of their key in progress and, by their policy, did not wait.
    pub in_progress: u64,
    /// Transient errors (busy, deadlock) after which the claim was tried again.
    pub claim_retries: u64,
}

impl Counts {
    fn merge(&mut self, other: &Counts) {
        self.ran += other.ran;
        self.in_progress += other.in_progress;
        self.replayed += other.replayed;
        self.failed += other.failed;
        self.panicked += other.panicked;
        self.fingerprint_mismatches += other.fingerprint_mismatches;
        self.key_conflicts += other.key_conflicts;
        self.errors += other.errors;
        self.claim_retries += other.claim_retries;
    }
}

/// A job's counts, read from its counters.
fn counts_of(job: &Job) -> Counts {
    let get = |ending: Ending| job.counters.ended(ending);
    Counts {
        ran: get(Ending::Ran),
        replayed: get(Ending::Replayed),
        failed: get(Ending::Failed),
        panicked: get(Ending::Panicked),
        fingerprint_mismatches: get(Ending::FingerprintMismatch),
        key_conflicts: get(Ending::KeyConflict),
        errors: get(Ending::Error),
        in_progress: get(Ending::InProgress),
        claim_retries: job.counters.retries(),
    }
}

/// Every job definition that has counted a call.
static LISTED: Mutex<Vec<&'static Job>> = Mutex::new(Vec::new());

/// The job's counters, listing the job at its first count (the one time a lock is taken).
fn counting(job: &'static Job) -> &'static crate::counters::JobCounters {
    if job.counters.first_listing() {
        LISTED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(job);
    }
    &job.counters
}

fn listed() -> Vec<&'static Job> {
    // A panic elsewhere while holding this lock cannot leave the list inconsistent.
    LISTED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// The counts of one job, by its name (a sync handler and its async twin with one name count
/// together).
pub fn counts_for(job: &str) -> Counts {
    let mut total = Counts::default();
    for listed in listed().into_iter().filter(|j| j.name() == job) {
        total.merge(&counts_of(listed));
    }
    total
}

/// The counts of every job together.
pub fn totals() -> Counts {
    let mut total = Counts::default();
    for job in listed() {
        total.merge(&counts_of(job));
    }
    total
}

/// Every job's counts, by name.
pub fn all() -> Vec<(&'static str, Counts)> {
    let mut by_name: std::collections::BTreeMap<&'static str, Counts> = Default::default();
    for job in listed() {
        by_name
            .entry(job.name())
            .or_default()
            .merge(&counts_of(job));
    }
    by_name.into_iter().collect()
}

/// Whether the event that ends each job call is at INFO rather than DEBUG; see
/// [`job_events_at_info`].
static JOB_EVENTS_AT_INFO: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Emits the event that ends each job call that ran, replayed, failed or met a run in progress at
/// INFO (`true`) instead of DEBUG (the default, as database libraries log each statement): for a
/// worker whose log is its record of jobs done. Calls that end in a warning (a panic, a
/// fingerprint mismatch, a key of another job, a database error) are at WARN either way.
pub fn job_events_at_info(info: bool) {
    JOB_EVENTS_AT_INFO.store(info, std::sync::atomic::Ordering::Relaxed);
}

/// Records the end of a job call: counters, metrics, and the event.
pub(crate) fn finished(job: &'static Job, outcome: Ending, started: Instant) {
    finished_with(job, outcome, started, None);
}

/// [`finished`], for a replay: the event also says when the first run was done
/// (`first_done_at`, RFC 3339 UTC, the database's clock).
pub(crate) fn replayed(job: &'static Job, started: Instant, first_done_micros: i64) {
    finished_with(job, Ending::Replayed, started, Some(first_done_micros));
}

fn finished_with(
    job: &'static Job,
    outcome: Ending,
    started: Instant,
    first_done_micros: Option<i64>,
) {
    let elapsed = started.elapsed();
    let ran_or_replayed = match outcome {
        Ending::Ran => Some(false),
        Ending::Replayed => Some(true),
        _ => None,
    };
    counting(job).count(outcome, ran_or_replayed);
    #[cfg(feature = "metrics")]
    let job = job.name();
    #[cfg(feature = "metrics")]
    {
        crate::telemetry::described();
        metrics::counter!(crate::telemetry::CALLS.name, "job" => job, "outcome" => outcome.as_str())
            .increment(1);
        metrics::histogram!(
            crate::telemetry::CALL_DURATION.name,
            "job" => job,
            "outcome" => outcome.as_str()
        )
        .record(elapsed.as_secs_f64());
    }
    let duration_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    let message = match outcome {
        Ending::Ran => "job ran and committed",
        Ending::Replayed => "job already done; replayed its stored result",
        Ending::Failed => "job returned an error; rolled back",
        Ending::Panicked => "job panicked; rolled back",
        Ending::FingerprintMismatch => "job key came back with different inputs; refused",
        Ending::KeyConflict => "job key is held by another job; refused",
        Ending::Error => "job failed in the database; rolled back",
        Ending::InProgress => {
            "another run of the job's key is in progress; did not wait, by the job's policy"
        }
    };
    match outcome {
        Ending::Ran | Ending::Replayed | Ending::Failed | Ending::InProgress => {
            // The time is formatted only for a subscriber that takes the event.
            let first_done_at = || first_done_micros.map(crate::time::rfc3339);
            if JOB_EVENTS_AT_INFO.load(std::sync::atomic::Ordering::Relaxed) {
                tracing::info!(
                    outcome = outcome.as_str(),
                    duration_us,
                    first_done_at = first_done_at(),
                    "{message}"
                );
            } else {
                tracing::debug!(
                    outcome = outcome.as_str(),
                    duration_us,
                    first_done_at = first_done_at(),
                    "{message}"
                );
            }
        }
        _ => tracing::warn!(outcome = outcome.as_str(), duration_us, "{message}"),
    }
}

/// Records a transient error after which the claim is tried again.
pub(crate) fn retried(job: &'static Job, attempts: u32, error: &diesel::result::Error) {
    counting(job).count_retry();
    #[cfg(feature = "metrics")]
    {
        crate::telemetry::described();
        metrics::counter!(crate::telemetry::CLAIM_RETRIES.name, "job" => job.name()).increment(1);
    }
    tracing::debug!(attempts, %error, "transient error while claiming; retrying");
}

/// What became of one leased message, as its round recorded it (and as the metrics label it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Delivered and marked so.
    Delivered,
    /// Delivered, but another round had taken the lease meanwhile: it was not marked here.
    LeaseLost,
    /// Failed; tried again after a backoff.
    Failed,
    /// Failed with its attempts spent: parked until an operator retries it.
    Parked,
}

impl Settled {
    /// The label of metrics and events.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Settled::Delivered => "delivered",
            Settled::LeaseLost => "lease_lost",
            Settled::Failed => "failed",
            Settled::Parked => "parked",
        }
    }
}

/// Records one outbox delivery: a DEBUG event with the message's id, topic, outcome and attempt,
/// and (with the `metrics` feature) [`DELIVERIES`](crate::telemetry::DELIVERIES) and the delay from
/// the push to this delivery in [`DELIVERY_DELAY`](crate::telemetry::DELIVERY_DELAY).
pub(crate) fn delivery(
    message_id: &str,
    topic: &str,
    attempt: u32,
    settled: Settled,
    delay: std::time::Duration,
) {
    let outcome = settled.as_str();
    #[cfg(feature = "metrics")]
    {
        let topic = topic.to_owned();
        crate::telemetry::described();
        metrics::counter!(crate::telemetry::DELIVERIES.name, "topic" => topic.clone(), "outcome" => outcome)
            .increment(1);
        if settled == Settled::Delivered {
            metrics::histogram!(crate::telemetry::DELIVERY_DELAY.name, "topic" => topic)
                .record(delay.as_secs_f64());
        }
    }
    tracing::debug!(
        message_id,
        topic,
        outcome,
        attempt,
        delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        "outbox delivery"
    );
}

/// Publishes the outbox's counts by state as gauges (`metrics` feature).
pub(crate) fn outbox_counts(counts: &crate::store::OutboxCounts) {
    #[cfg(feature = "metrics")]
    crate::telemetry::described();
    #[cfg(feature = "metrics")]
    for (state, count) in [
        ("pending", counts.pending),
        ("leased", counts.leased),
        ("delivered", counts.delivered),
        ("parked", counts.parked),
    ] {
        #[allow(clippy::cast_precision_loss)] // counts far below 2^52
        metrics::gauge!(crate::telemetry::MESSAGES.name, "state" => state).set(count as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = counts;
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use diesel::{Connection as _, SqliteConnection};

    use crate::fingerprint::Fingerprint;
    use crate::{Error, Job, JobCall, JobKey};

    /// Counters are atomics in each job's own `static`: threads counting at once lose nothing, and
    /// two definitions sharing a name count together.
    #[test]
    fn counting_from_many_threads_loses_nothing() {
        static FIRST: Job = Job::new("stats_many_threads", "m:<n>");
        static TWIN: Job = Job::new("stats_many_threads", "m:<n>");
        std::thread::scope(|scope| {
            for thread in 0..8 {
                scope.spawn(move || {
                    let job = if thread % 2 == 0 { &FIRST } else { &TWIN };
                    for call in 0..500 {
                        let ending = if call % 5 == 0 {
                            super::Ending::Replayed
                        } else {
                            super::Ending::Ran
                        };
                        super::finished(job, ending, std::time::Instant::now());
                    }
                });
            }
        });
        let counts = super::counts_for("stats_many_threads");
        assert_eq!((counts.ran, counts.replayed), (3_200, 800));
        assert_eq!(
            super::all()
                .iter()
                .filter(|(name, _)| *name == "stats_many_threads")
                .count(),
            1,
            "one line per name"
        );
    }

    #[test]
    fn counts_follow_each_outcome() {
        static JOB: Job = Job::new("stats_counts_follow_each_outcome", "k:<n>");
        let mut conn = SqliteConnection::establish(":memory:").expect("SQLite");
        crate::migrate(&mut conn).expect("the runtime's tables");
        let run = |conn: &mut SqliteConnection, n: u32, amount: u32, fail: bool| {
            let key = JobKey::new(format!("k:{n}"));
            let fingerprint = Fingerprint::builder()
                .input("amount", &amount)
                .finish()
                .expect("fingerprint");
            JobCall::new(&JOB, &key)
                .fingerprint(fingerprint)
                .run(conn, |_| {
                    if fail {
                        Err(Error::RelayInsideTransaction)
                    } else {
                        Ok(())
                    }
                })
        };
        assert!(run(&mut conn, 1, 10, false).expect("ran").is_ran());
        assert!(
            run(&mut conn, 1, 10, false)
                .expect("replayed")
                .is_replayed()
        );
        run(&mut conn, 1, 11, false).expect_err("fingerprint mismatch");
        run(&mut conn, 2, 10, true).expect_err("failed");
        let counts = super::counts_for(JOB.name());
        assert_eq!(
            (
                counts.ran,
                counts.replayed,
                counts.fingerprint_mismatches,
                counts.failed
            ),
            (1, 1, 1, 1)
        );
        assert!(super::totals().ran >= 1);
        assert!(super::all().iter().any(|(name, _)| *name == JOB.name()));
    }
}
