//! The tables the runtime keeps, as Diesel `table!` definitions.
//!
//! Create them with [`migrate`](crate::migrate), or apply the plain SQL files under
//! `idempotent-runtime/migrations/<backend>/` with your own migration tool.

diesel::table! {
    /// One row per job that ran to completion (committed): the claim that makes reruns skip.
    ///
    /// Times are UTC, taken from the worker's clock.
    done_jobs (key_digest) {
        /// SHA-256 of the job key: fixed size, so any key fits the unique index on every backend.
        key_digest -> Binary,
        /// The job key, readable (control characters percent-encoded).
        job_key -> Text,
        /// The name of the job that claimed the key.
        job_name -> Text,
        /// The handler's `Ok` value as JSON; NULL when it was `()` or JSON `null`.
        result -> Nullable<Text>,
        /// SHA-256 over the job's fingerprint inputs, when the job declares any.
        fingerprint -> Nullable<Binary>,
        /// When the job committed (UTC).
        done_at -> Timestamp,
        /// When the claim lapses and the job may run again (UTC); NULL: never.
        expires_at -> Nullable<Timestamp>,
    }
}
