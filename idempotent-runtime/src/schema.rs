//! The tables the runtime keeps, as Diesel `table!` definitions.
//!
//! Create them with [`migrate`](crate::migrate), or apply the plain SQL files under
//! `idempotent-runtime/sql/<database>/` with your own migration tool.

diesel::table! {
    /// One row per job that ran to completion (committed): the claim that makes reruns skip.
    ///
    /// Times are UTC, taken from the database's clock (never a worker's).
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
        /// Which run wrote the claim (schema version 3): a run whose transaction the database ended
        /// under it takes back its own claim only, never another run's.
        claim_token -> Nullable<BigInt>,
    }
}

diesel::table! {
    /// Messages recorded in a job's transaction, sent after it commits by a
    /// [`Relay`](crate::outbox::Relay).
    outbox (id) {
        /// Order of pushing.
        id -> BigInt,
        /// Stable across reruns of the job that pushed it: receivers drop duplicates by it.
        message_id -> Text,
        /// What kind of message it is; the relay's delivery function routes by it.
        topic -> Text,
        /// The message, as JSON.
        payload -> Text,
        /// The pushing job's key, as in `done_jobs.job_key`.
        job_key -> Nullable<Text>,
        /// When it was pushed (UTC).
        created_at -> Timestamp,
        /// Not sent before this: a failed delivery backs off.
        available_at -> Timestamp,
        /// Deliveries tried and failed.
        attempts -> Integer,
        /// The last delivery's error.
        last_error -> Nullable<Text>,
        /// The relay holding the message while it sends it.
        lease_owner -> Nullable<Text>,
        /// Until when that relay holds it.
        lease_until -> Nullable<Timestamp>,
        /// When it was delivered.
        delivered_at -> Nullable<Timestamp>,
        /// When it was parked after too many failed attempts.
        parked_at -> Nullable<Timestamp>,
    }
}

diesel::allow_tables_to_appear_in_same_query!(done_jobs, outbox);
