//! The job a body is running for: its key, readable from inside the body.
//!
//! Pass the key on to other services as their idempotency key, so that their effect happens once
//! too, however often this job is retried:
//!
//! ```
//! # fn charge_card(_idempotency_key: &str) {}
//! // Inside an annotated handler's body:
//! if let Some(key) = idempotent_runtime::current_key() {
//!     // Stable across reruns of this job: `<job key>/charge`.
//!     charge_card(key.derive("charge").as_str());
//! }
//! ```
//!
//! The key is set while the body runs: for a sync body, on its thread; for an async body, during
//! every poll of its future, whichever thread polls it. Nested jobs see their own key.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::key::JobKey;

/// What the runtime knows about the job whose body is running.
#[derive(Debug)]
pub(crate) struct JobContext {
    pub(crate) key: JobKey,
    pub(crate) digest: [u8; 32],
    pub(crate) job: &'static str,
    /// The key as `done_jobs.job_key` shows it: readable, or redacted.
    pub(crate) key_text: String,
    /// The address of the connection the job's transaction is open on.
    pub(crate) connection: usize,
    /// The call's fingerprint, which a call of the job with its key from inside its body must
    /// match.
    pub(crate) fingerprint: Option<[u8; 32]>,
    /// This run's own id: outbox message ids derive from it, so a later run of the same key (after
    /// its claim lapsed, or was forgotten) never reuses an earlier run's ids. Made when first
    /// needed: a replay from its read before the claim never needs it.
    run: std::sync::OnceLock<[u8; 16]>,
    /// Outbox messages pushed so far, for their ids.
    pushes: AtomicU32,
}

impl JobContext {
    pub(crate) fn new(
        key: JobKey,
        digest: [u8; 32],
        job: &'static str,
        key_text: String,
        connection: usize,
        fingerprint: Option<[u8; 32]>,
    ) -> Arc<Self> {
        Arc::new(Self {
            key,
            digest,
            job,
            key_text,
            connection,
            fingerprint,
            run: std::sync::OnceLock::new(),
            pushes: AtomicU32::new(0),
        })
    }

    /// This run's own id; see the field.
    pub(crate) fn run(&self) -> &[u8; 16] {
        self.run.get_or_init(|| crate::key::run_id(&self.digest))
    }

    /// This run's mark on the `done_jobs` row it claims.
    pub(crate) fn claim_token(&self) -> i64 {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&self.run()[..8]);
        i64::from_be_bytes(bytes)
    }

    /// The position of the next outbox message of this run: 0, 1, 2, ...
    pub(crate) fn next_push(&self) -> u32 {
        self.pushes.fetch_add(1, Ordering::Relaxed)
    }
}

thread_local! {
    static CURRENT: RefCell<Vec<Arc<JobContext>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with `context` as the current job, restoring the previous one after, even on a panic.
pub(crate) fn enter<R>(context: &Arc<JobContext>, f: impl FnOnce() -> R) -> R {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            CURRENT.with(|current| current.borrow_mut().pop());
        }
    }
    CURRENT.with(|current| current.borrow_mut().push(Arc::clone(context)));
    let _leave = Leave;
    f()
}

/// The job whose body is running on this thread, if any.
pub(crate) fn current() -> Option<Arc<JobContext>> {
    CURRENT.with(|current| current.borrow().last().cloned())
}

/// The enclosing job (on this thread) that already holds the key with `digest`, if any.
pub(crate) fn enclosing_claim(digest: &[u8; 32]) -> Option<Arc<JobContext>> {
    CURRENT.with(|current| {
        current
            .borrow()
            .iter()
            .rev()
            .find(|context| context.digest == *digest)
            .cloned()
    })
}

/// The key of the job whose body is running, if any: outside a job's body, `None`.
///
/// Pass it on to other services as their idempotency key, so that their effect happens once too,
/// however often this job is retried; [`JobKey::derive`] gives each call from one job its own key,
/// stable across reruns. It is set while the body runs: for a sync body, on its thread; for an
/// async body, during every poll of its future, whichever thread polls it. Nested jobs see their
/// own key.
///
/// ```
/// # fn charge_card(_idempotency_key: &str) {}
/// // Inside an annotated handler's body:
/// if let Some(key) = idempotent_runtime::current_key() {
///     charge_card(key.derive("charge").as_str()); // `<job key>/charge`
/// }
/// ```
pub fn current_key() -> Option<JobKey> {
    current().map(|context| context.key.clone())
}
