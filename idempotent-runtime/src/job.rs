//! Static facts about a job: its name, template and how long its keys hold.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// What the runtime knows about one job type, independent of any one call.
///
/// The `#[idempotent_job]` attribute makes one per handler; callers of the plain function API
/// ([`run`](crate::run)) make their own, as a `static`:
///
/// ```
/// use idempotent_runtime::Job;
///
/// static SEND_INVOICE: Job = Job::new("send_invoice", "invoice:<month>:<customer_id>");
/// assert_eq!(SEND_INVOICE.name(), "send_invoice");
/// ```
///
/// The name is the job's identity in `done_jobs`: a key claimed by one job is never replayed for
/// another. Two definitions with one name are the same job only when both name it on purpose (an
/// explicit `name = "..."`, or `Job::new`) and agree on the template, `keep`, redaction and
/// fingerprint inputs (a sync handler and its async twin, say); any other pair is refused at its
/// first call with [`Error::DuplicateJobName`](crate::error::Error::DuplicateJobName), naming both.
pub struct Job {
    name: &'static str,
    template: &'static str,
    keep: Option<Duration>,
    redact_key: bool,
    fingerprint_inputs: &'static [&'static str],
    in_progress: WhileInProgress,
    /// The name is the handler's function name, not given on purpose.
    named_after_function: bool,
    /// This definition's identity has been checked against every other with its name.
    checked: AtomicBool,
    /// How its calls ended, counted here, per job, with no lock on the job's path.
    pub(crate) counters: crate::counters::JobCounters,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("name", &self.name)
            .field("template", &self.template)
            .field("keep", &self.keep)
            .field("redact_key", &self.redact_key)
            .field("fingerprint_inputs", &self.fingerprint_inputs)
            .field("in_progress", &self.in_progress)
            .finish()
    }
}

impl Job {
    /// The longest job name, in characters: what `done_jobs.job_name` holds on MySQL
    /// (`VARCHAR(255)`), so that no session's `sql_mode` can cut a name short and make its own
    /// runs look like another job's.
    pub const MAX_NAME_CHARS: usize = 255;

    /// A job called `name` whose keys follow `template` (recorded for humans and checks; the key
    /// itself is passed to each call).
    ///
    /// # Panics
    ///
    /// When `name` is longer than [`MAX_NAME_CHARS`](Self::MAX_NAME_CHARS), holds a control
    /// character (PostgreSQL refuses a `NUL` in text: every call would fail), is empty, or ends
    /// with a space (MySQL and MariaDB compare names ignoring trailing spaces): in a `static` (as
    /// the attribute declares it) that is a compile error.
    pub const fn new(name: &'static str, template: &'static str) -> Self {
        assert!(
            chars(name) <= Self::MAX_NAME_CHARS,
            "a job name is at most 255 characters (done_jobs.job_name on MySQL); give the job a shorter `name`"
        );
        assert!(
            !has_control(name),
            "a job name cannot hold a control character (NUL, a line break, ...): PostgreSQL refuses NUL in text, and the others would print the name broken"
        );
        assert!(
            !name.is_empty() && name.as_bytes()[name.len() - 1] != b' ',
            "a job name is not empty and does not end with a space: MySQL and MariaDB compare `done_jobs.job_name` ignoring trailing spaces, so that the keys API and the operator CLI would count `pad ` and `pad` as one job"
        );
        Self {
            name,
            template,
            keep: None,
            redact_key: false,
            fingerprint_inputs: &[],
            in_progress: WhileInProgress::Wait,
            named_after_function: false,
            checked: AtomicBool::new(false),
            counters: crate::counters::JobCounters::new(),
        }
    }

    /// Marks the name as the handler's function name (what the attribute does when no `name` is
    /// given), so that another definition with that name is an error, not the same job.
    #[doc(hidden)]
    pub const fn named_after_function(mut self) -> Self {
        self.named_after_function = true;
        self
    }

    /// Shows this job's keys as `redacted:<digest prefix>` in events, errors, the readable
    /// `job_key` column and the outbox, for keys built from personal data. The digest still finds
    /// the row. This is pseudonymisation, not encryption: the prefix is an unsalted SHA-256 of the
    /// key, so whoever can list candidate keys (every e-mail address of a customer table) can
    /// recompute it.
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

    /// Keys of this job hold for `keep` after the run that claimed them finished (the end of the
    /// job; inside a transaction of the caller's, before the caller's commit); after that a
    /// delivery with the same key runs the job again. Without this, keys hold for ever.
    pub const fn keep_for(mut self, keep: Duration) -> Self {
        self.keep = Some(keep);
        self
    }

    /// What a call does when another run of the same key is in progress (not yet committed):
    /// wait for it (the default), fail at once, or wait at most a while; see [`WhileInProgress`].
    pub const fn while_in_progress(mut self, policy: WhileInProgress) -> Self {
        self.in_progress = policy;
        self
    }

    /// The job's in-progress policy.
    pub const fn in_progress(&self) -> WhileInProgress {
        self.in_progress
    }

    /// Whether keys are redacted.
    pub const fn redacts_key(&self) -> bool {
        self.redact_key
    }

    /// The names of the fingerprint's inputs.
    pub const fn fingerprint_input_names(&self) -> &'static [&'static str] {
        self.fingerprint_inputs
    }

    /// The job's name, recorded in `done_jobs.job_name`.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The key template, as written in the attribute.
    pub const fn template(&self) -> &'static str {
        self.template
    }

    /// How long a claimed key holds after its run committed, if not for ever.
    pub const fn keep(&self) -> Option<Duration> {
        self.keep
    }

    /// Whether `self` and `other` may share a name: both named on purpose, with one definition.
    pub(crate) fn same_job_as(&self, other: &Job) -> bool {
        std::ptr::eq(self, other)
            || (!self.named_after_function
                && !other.named_after_function
                && self.name == other.name
                && self.template == other.template
                && self.keep == other.keep
                && self.redact_key == other.redact_key
                && self.fingerprint_inputs == other.fingerprint_inputs)
    }

    /// Whether this definition was checked against every other with its name.
    pub(crate) fn checked(&self) -> bool {
        self.checked.load(Ordering::Acquire)
    }

    /// Records that this definition was checked.
    pub(crate) fn mark_checked(&self) {
        self.checked.store(true, Ordering::Release);
    }
}

/// What a call does when another run of the same key holds it and has not committed yet.
///
/// Waiting is always safe: when the other run commits, this call replays its result; when it rolls
/// back, this call runs. But it holds a worker and a connection for as long as the other run takes.
/// [`Fail`](Self::Fail) and [`WaitAtMost`](Self::WaitAtMost) give the worker back with
/// [`Error::InProgress`](crate::error::Error::InProgress), which is retryable: nothing ran, nothing was
/// recorded, and a later delivery replays or runs.
///
/// The wait is bounded by the database's own lock timeout, set for the claim statement only and
/// restored before the body runs: PostgreSQL's `lock_timeout` (transaction-local), MySQL/MariaDB's
/// `innodb_lock_wait_timeout` (whole seconds, at least 1: `Fail` waits up to 1 s there). On SQLite
/// a run holds the database's write lock, so the bound applies to that lock, whoever holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WhileInProgress {
    /// Wait for the other run to commit or roll back, then replay or run (the default).
    #[default]
    Wait,
    /// Fail at once with [`Error::InProgress`](crate::error::Error::InProgress).
    Fail,
    /// Wait up to this long, then fail with [`Error::InProgress`](crate::error::Error::InProgress).
    WaitAtMost(Duration),
}

impl WhileInProgress {
    /// The longest wait, or `None` for no bound of the runtime's.
    pub(crate) fn bound(self) -> Option<Duration> {
        match self {
            WhileInProgress::Wait => None,
            WhileInProgress::Fail => Some(Duration::ZERO),
            WhileInProgress::WaitAtMost(limit) => Some(limit),
        }
    }
}

/// The characters of `text`, counted in a `const fn`: its bytes that do not continue a UTF-8
/// sequence.
/// Whether `text` holds a control character: C0 (`U+0000`..`U+001F`), `DEL`, or C1
/// (`U+0080`..`U+009F`, encoded `C2 80`..`C2 9F`), as `char::is_control` says.
const fn has_control(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte < 0x20 || byte == 0x7F {
            return true;
        }
        if byte == 0xC2 && i + 1 < bytes.len() && bytes[i + 1] >= 0x80 && bytes[i + 1] <= 0x9F {
            return true;
        }
        i += 1;
    }
    false
}

const fn chars(text: &str) -> usize {
    let bytes = text.as_bytes();
    let (mut i, mut n) = (0, 0);
    while i < bytes.len() {
        if bytes[i] & 0xC0 != 0x80 {
            n += 1;
        }
        i += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::{Job, has_control};

    /// The `const` check says what `char::is_control` says, for every character alone and
    /// between others.
    #[test]
    fn a_control_character_is_found_wherever_it_is() {
        for c in (0..=u32::from(char::MAX)).filter_map(char::from_u32) {
            let mut buffer = [0; 4];
            assert_eq!(
                has_control(c.encode_utf8(&mut buffer)),
                c.is_control(),
                "{c:?}"
            );
            assert_eq!(has_control(&format!("a{c}é")), c.is_control(), "{c:?}");
        }
    }

    #[test]
    #[should_panic(expected = "a job name cannot hold a control character")]
    fn a_name_with_a_nul_is_refused() {
        let _ = Job::new("nul\0name", "nul:<id>");
    }

    /// MySQL and MariaDB compare `job_name` with `PAD SPACE`: the keys API grouped `pad ` with
    /// `pad` (one job of 3 keys where the tables hold 2 and 1).
    #[test]
    #[should_panic(expected = "does not end with a space")]
    fn a_name_ending_with_a_space_is_refused() {
        let _ = Job::new("pad ", "pad:<id>");
    }

    #[test]
    #[should_panic(expected = "is not empty")]
    fn an_empty_name_is_refused() {
        let _ = Job::new("", "empty:<id>");
    }
}
