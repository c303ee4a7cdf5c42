//! What generated code uses (mounted as `__private_0_1_0`). Not part of the public API: it may
//! change in any release.

pub use crate::call::JobCall;
pub use crate::fingerprint::FingerprintBuilder;
pub use crate::job::{Job, WhileInProgress};
pub use crate::key::{JobKey, KeyWriter};
pub use crate::outcome::Outcome;
pub use crate::registry::{Part, RegisteredJob};
pub use inventory;

/// The `T` and `E` of a handler's return type, however it is spelled (an alias such as
/// `anyhow::Result<T>` included): the companion's `outcome` returns `Result<Outcome<T>, E>`.
pub trait JobResult {
    /// The handler's `Ok` type.
    type Ok;
    /// The handler's `Err` type.
    type Err;
}

impl<T, E> JobResult for Result<T, E> {
    type Ok = T;
    type Err = E;
}

use crate::{JobError, JobOutput};

/// [`run`](crate::run) for a connection reached through `reach`, such as a pooled connection
/// that derefs to a Diesel connection: the body gets the caller's own connection value back.
pub fn run_with<Conn, C, T, E, F>(
    conn: &mut Conn,
    reach: impl Fn(&mut Conn) -> &mut C,
    job_call: JobCall<'_>,
    body: F,
) -> Result<Outcome<T>, E>
where
    Conn: ?Sized,
    C: crate::connection::JobStore,
    T: JobOutput,
    E: JobError,
    F: FnOnce(&mut Conn) -> Result<T, E>,
{
    crate::lifecycle::run_sync(conn, then_store(reach), job_call, body)
}

/// `reach`, then the runtime's view of what it reached.
fn then_store<Conn: ?Sized, C: crate::connection::JobStore>(
    reach: impl Fn(&mut Conn) -> &mut C,
) -> impl Fn(&mut Conn) -> &mut C::Runtime {
    move |conn| reach(conn).idempotent_store()
}

/// [`then_store`] for async connections.
#[cfg(feature = "async")]
fn then_async_store<Conn: ?Sized, C: AsyncJobRuntime>(
    reach: impl Fn(&mut Conn) -> &mut C,
) -> impl Fn(&mut Conn) -> &mut C::Runtime {
    move |conn| reach(conn).job_runtime()
}

/// What a generated async wrapper runs a job on: an [`AsyncJobStore`](crate::connection::AsyncJobStore),
/// or (feature `deadpool`) deadpool's pooled `Object`, which also leaves its pool when a job
/// on it is cancelled.
#[cfg(feature = "async")]
pub trait AsyncJobRuntime: 'static {
    /// The runtime's view of the connection.
    #[doc(hidden)]
    type Runtime: crate::store::Store;

    /// Reaches it.
    #[doc(hidden)]
    fn job_runtime(&mut self) -> &mut Self::Runtime;
}

#[cfg(feature = "async")]
impl<C: crate::connection::AsyncJobStore> AsyncJobRuntime for C {
    type Runtime = C::Runtime;

    fn job_runtime(&mut self) -> &mut C::Runtime {
        self.idempotent_store()
    }
}

/// [`run_async`](crate::run_async) for a connection reached through `reach`.
#[cfg(feature = "async")]
pub async fn run_async_with<Conn, C, T, E, F>(
    conn: &mut Conn,
    reach: impl Fn(&mut Conn) -> &mut C,
    job_call: JobCall<'_>,
    body: F,
) -> Result<Outcome<T>, E>
where
    Conn: ?Sized,
    C: AsyncJobRuntime,
    T: JobOutput,
    E: JobError,
    F: AsyncFnOnce(&mut Conn) -> Result<T, E>,
{
    crate::lifecycle::run(conn, then_async_store(reach), job_call, body).await
}

/// Reaches the Diesel connection behind a handler's connection parameter. Called with method
/// syntax, so auto-deref finds the connection inside an r2d2 pooled connection or a `Box`.
pub trait JobConnection {
    /// The connection itself.
    fn job_connection(&mut self) -> &mut Self;
}

impl<C: crate::connection::JobStore> JobConnection for C {
    fn job_connection(&mut self) -> &mut Self {
        self
    }
}

/// [`JobConnection`] for async connections.
#[cfg(feature = "async")]
pub trait AsyncJobConnection {
    /// The connection itself.
    fn async_job_connection(&mut self) -> &mut Self;
}

#[cfg(feature = "async")]
impl<C: crate::connection::AsyncJobStore> AsyncJobConnection for C {
    fn async_job_connection(&mut self) -> &mut Self {
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
