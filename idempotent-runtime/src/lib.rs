//! The runtime behind `#[idempotent_job]`: the done-jobs schema and the claim-run-record transaction
//! for Diesel connections.
//!
//! Most users depend on the `idempotent-jobs` facade crate and use the attribute. This crate holds what
//! the attribute expands to, public so that you can call it yourself:
//!
//! * [`run`]: one job call in one transaction, returning an [`Outcome`] (ran or replayed);
//! * [`JobKey`] and [`KeyBuilder`]: keys with escaped values;
//! * [`migrate`] and [`schema`]: the `done_jobs` table.
//!
//! The rule it implements comes from the
//! <a href="https://agentwranglers.se/playbook/scaling/background-jobs-and-queues/idempotent-jobs">Agent Wranglers scaling playbook</a>.
#![deny(missing_docs)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

// First: its statement macros are shared by the sync and async stores.
#[macro_use]
pub mod store;

#[cfg(feature = "async")]
pub mod asynchronous;
mod context;
mod error;
pub mod fingerprint;
mod job;
pub mod key;
mod migrations;
pub mod outbox;
mod outcome;
pub mod prune;
pub mod registry;
mod run;
pub mod schema;
pub mod stats;
pub mod testing;

pub use context::current_key;
pub use error::{Error, Result, Step};
pub use job::Job;
pub use key::{JobKey, KeyBuilder, KeyError};
pub use outcome::Outcome;
pub use prune::{Prune, PruneReport, prune};
pub use run::{JobCall, JobError, JobOutput, run};
pub use store::JobStore;

#[cfg(feature = "async")]
pub use asynchronous::{AsyncJobStore, migrate_async, run_async};
#[cfg(feature = "async")]
pub use prune::prune_async;

/// Creates the runtime's tables (`done_jobs`) if they do not exist yet, with Diesel's embedded
/// migrations for the connection's backend. Safe to call at every start.
///
/// Teams with their own migration tool can apply the plain SQL files under
/// `idempotent-runtime/migrations/<backend>/` instead.
///
/// ```
/// use diesel::prelude::*;
///
/// let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
/// idempotent_runtime::migrate(&mut conn)?;
/// # Ok::<(), idempotent_runtime::Error>(())
/// ```
pub fn migrate<C: JobStore>(conn: &mut C) -> Result<()> {
    conn.run_migrations().map_err(Error::Migration)
}

/// What generated code uses. Not part of the public API: it may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use crate::fingerprint::FingerprintBuilder;
    pub use crate::job::Job;
    pub use crate::key::KeyWriter;
    pub use crate::outcome::Outcome;
    pub use crate::registry::{Part, RegisteredJob};
    pub use crate::run::JobCall;
    pub use crate::run::run_with;

    #[cfg(feature = "async")]
    pub use crate::asynchronous::run_async_with;

    /// [`JobConnection`] for async connections.
    #[cfg(feature = "async")]
    pub trait AsyncJobConnection {
        /// The connection itself.
        fn async_job_connection(&mut self) -> &mut Self;
    }

    #[cfg(feature = "async")]
    impl<C: crate::AsyncJobStore> AsyncJobConnection for C {
        fn async_job_connection(&mut self) -> &mut Self {
            self
        }
    }
    pub use crate::store::JobStore;
    pub use inventory;

    /// Reaches the Diesel connection behind a handler's connection parameter. Called with method
    /// syntax, so auto-deref finds the connection inside an r2d2 pooled connection or a `Box`.
    pub trait JobConnection {
        /// The connection itself.
        fn job_connection(&mut self) -> &mut Self;
    }

    impl<C: JobStore> JobConnection for C {
        fn job_connection(&mut self) -> &mut Self {
            self
        }
    }

    /// A fingerprint input: anything `Serialize`.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be a fingerprint input: it does not implement `Serialize`",
        label = "this parameter is a fingerprint input, so its value must implement `serde::Serialize`",
        note = "derive `serde::Serialize` for it, or name a field that implements it: `fingerprint(param.field)`"
    )]
    pub trait FingerprintInput {
        /// Adds the value to the fingerprint under `name`.
        fn add_to(&self, name: &str, builder: FingerprintBuilder) -> FingerprintBuilder;
    }

    impl<T: serde::Serialize + ?Sized> FingerprintInput for T {
        fn add_to(&self, name: &str, builder: FingerprintBuilder) -> FingerprintBuilder {
            builder.input(name, self)
        }
    }

    /// A placeholder's value: anything `Display`, written into the key escaped.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be used in a job key: it does not implement `Display`",
        label = "this parameter is a key placeholder, so its value must implement `std::fmt::Display`",
        note = "implement `Display` for it, or name a field that does: `<param.field>`"
    )]
    pub trait KeyValue {
        /// Writes the value into the key.
        fn write_key(&self, writer: &mut KeyWriter);
    }

    impl<T: std::fmt::Display + ?Sized> KeyValue for T {
        fn write_key(&self, writer: &mut KeyWriter) {
            writer.value(self);
        }
    }
}
