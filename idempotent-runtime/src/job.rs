//! Static facts about a job: its name, template and how long its keys hold.

use std::time::Duration;

/// What the runtime knows about one job type, independent of any one call.
///
/// The `#[idempotent_job]` attribute makes one per handler; callers of the plain function API
/// ([`run`](crate::run)) make their own:
///
/// ```
/// use idempotent_runtime::Job;
///
/// static SEND_INVOICE: Job = Job::new("send_invoice", "invoice:<month>:<customer_id>");
/// assert_eq!(SEND_INVOICE.name(), "send_invoice");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    name: &'static str,
    template: &'static str,
    keep: Option<Duration>,
    redact_key: bool,
    fingerprint_inputs: &'static [&'static str],
}

impl Job {
    /// A job called `name` whose keys follow `template` (recorded for humans and checks; the key
    /// itself is passed to each call).
    pub const fn new(name: &'static str, template: &'static str) -> Self {
        Self {
            name,
            template,
            keep: None,
            redact_key: false,
            fingerprint_inputs: &[],
        }
    }

    /// Shows this job's keys as `redacted:<digest prefix>` in events, errors and the readable
    /// `job_key` column, for keys built from personal data. The digest still finds the row.
    pub const fn redact_key(mut self) -> Self {
        self.redact_key = true;
        self
    }

    /// Names the inputs whose fingerprint must match when a key comes back (for the error
    /// message; the fingerprint itself is passed to each call).
    pub const fn fingerprint_inputs(mut self, inputs: &'static [&'static str]) -> Self {
        self.fingerprint_inputs = inputs;
        self
    }

    /// Whether keys are redacted.
    pub const fn redacts_key(&self) -> bool {
        self.redact_key
    }

    /// The names of the fingerprint's inputs.
    pub const fn fingerprint_input_names(&self) -> &'static [&'static str] {
        self.fingerprint_inputs
    }

    /// Keys of this job hold for `keep`; after that a delivery with the same key runs the job again.
    /// Without this, keys hold for ever.
    pub const fn keep_for(mut self, keep: Duration) -> Self {
        self.keep = Some(keep);
        self
    }

    /// The job's name, recorded in `done_jobs.job_name`.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The key template, as written in the attribute.
    pub const fn template(&self) -> &'static str {
        self.template
    }

    /// How long a claimed key holds, if not for ever.
    pub const fn keep(&self) -> Option<Duration> {
        self.keep
    }
}
