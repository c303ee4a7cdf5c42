//! Every metric the runtime records, by one name each, with its kind, unit, labels and meaning:
//! the one list the recording code, [`describe_metrics`] and the guide's table all come from.

/// What kind of metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// Observations, such as durations.
    Histogram,
    /// A value set from time to time.
    Gauge,
}

/// One metric the runtime records through the `metrics` facade (feature `metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// Its name: every name starts `idempotent_jobs_`, and ends with its unit (`_total` for a
    /// count, `_seconds`).
    pub name: &'static str,
    /// Its kind.
    pub kind: MetricKind,
    /// Its unit, in words.
    pub unit: &'static str,
    /// Its labels.
    pub labels: &'static [&'static str],
    /// What it counts or measures.
    pub description: &'static str,
}

impl Metric {
    /// A metric: its name, kind, unit, labels and description.
    const fn new(
        name: &'static str,
        kind: MetricKind,
        unit: &'static str,
        labels: &'static [&'static str],
        description: &'static str,
    ) -> Self {
        Metric {
            name,
            kind,
            unit,
            labels,
            description,
        }
    }
}

/// Job calls, by job and outcome (`ran`, `replayed`, `failed`, ...; see [`crate::stats::Ending`]).
pub const CALLS: Metric = Metric::new(
    "idempotent_jobs_calls_total",
    MetricKind::Counter,
    "calls",
    &["job", "outcome"],
    "Job calls, by how they ended (ran, replayed, failed, panicked, fingerprint_mismatch, key_conflict, error, in_progress).",
);

/// How long job calls took, from the claim's start to the commit or rollback.
pub const CALL_DURATION: Metric = Metric::new(
    "idempotent_jobs_call_duration_seconds",
    MetricKind::Histogram,
    "seconds",
    &["job", "outcome"],
    "How long a job call took, from the claim's start to its commit or rollback.",
);

/// Claims tried again after a transient failure.
pub const CLAIM_RETRIES: Metric = Metric::new(
    "idempotent_jobs_claim_retries_total",
    MetricKind::Counter,
    "retries",
    &["job"],
    "Claims tried again after a transient failure (a busy database, a deadlock, a lock wait timeout, a serialization failure).",
);

/// Keys an operator forgot.
pub const KEYS_FORGOTTEN: Metric = Metric::new(
    "idempotent_jobs_keys_forgotten_total",
    MetricKind::Counter,
    "keys",
    &["job"],
    "Keys forgotten with keys::forget, so that their job runs again.",
);

/// Outbox deliveries, by topic and outcome.
pub const DELIVERIES: Metric = Metric::new(
    "idempotent_jobs_outbox_deliveries_total",
    MetricKind::Counter,
    "deliveries",
    &["topic", "outcome"],
    "Outbox deliveries, by how they ended (delivered, lease_lost, failed, parked).",
);

/// The delay from a message's push to its delivery.
pub const DELIVERY_DELAY: Metric = Metric::new(
    "idempotent_jobs_outbox_delivery_delay_seconds",
    MetricKind::Histogram,
    "seconds",
    &["topic"],
    "The time from a message's push (its job's commit) to its delivery.",
);

/// Outbox messages by state, as `outbox::counts` last found them.
pub const MESSAGES: Metric = Metric::new(
    "idempotent_jobs_outbox_messages",
    MetricKind::Gauge,
    "messages",
    &["state"],
    "Outbox messages by state (pending, leased, delivered, parked), as outbox::counts last found them.",
);

/// Every metric, in the order the guide lists them.
pub const METRICS: &[Metric] = &[
    CALLS,
    CALL_DURATION,
    CLAIM_RETRIES,
    KEYS_FORGOTTEN,
    DELIVERIES,
    DELIVERY_DELAY,
    MESSAGES,
];

/// Describes every metric (unit and meaning) to the installed `metrics` recorder. The runtime
/// calls it before it records its first metric; call it yourself after installing a recorder later
/// than that, or to have the descriptions before any job ran.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe_metrics() {
    for metric in METRICS {
        let unit = match metric.unit {
            "seconds" => metrics::Unit::Seconds,
            _ => metrics::Unit::Count,
        };
        match metric.kind {
            MetricKind::Counter => {
                metrics::describe_counter!(metric.name, unit, metric.description)
            }
            MetricKind::Histogram => {
                metrics::describe_histogram!(metric.name, unit, metric.description);
            }
            MetricKind::Gauge => metrics::describe_gauge!(metric.name, unit, metric.description),
        }
    }
}

/// [`describe_metrics`], once per process, before the first metric is recorded.
#[cfg(feature = "metrics")]
pub(crate) fn described() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(describe_metrics);
}
