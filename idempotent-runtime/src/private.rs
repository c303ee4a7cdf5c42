//! What generated code uses (mounted as `__private_0_1_0`). Not part of the public API: it may
//! change in any release.
//!
//! The traits that compile errors name (`JobResult`, `KeyValue`, `FingerprintInput`,
//! `JobConnection`, `AsyncJobConnection`) are defined here and re-exported from the public
//! module `handler`, so that an error names them by that name, never by a path through this module.
//! Generated code checks each through a call of one of its own methods: an error then reads as the
//! trait's `on_unimplemented` message at the user's token, with no note about a bound of a function
//! of this module.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

pub use crate::call::{Equality, JobCall};
pub use crate::fingerprint::{FingerprintBuilder, Unordered};
pub use crate::job::{Job, WhileInProgress};
pub use crate::key::{JobKey, KeyWriter};
pub use crate::outcome::Outcome;
pub use crate::registry::{Part, RegisteredJob};
/// For the attribute's errors: `::core` does not resolve in an edition 2015 crate without
/// `extern crate core;`, this crate does (the crate names it with `extern crate`).
pub use core::compile_error;
pub use inventory;

use crate::call::{JobError, JobOutput};

/// The return type of a job handler: `Result<T, E>`, however it is spelled (`anyhow::Result<T>`,
/// a type alias of your own), with a `T` that can be stored ([`JobOutput`]) and an `E` that can
/// hold this crate's errors ([`JobError`]).
///
/// Implemented for every such `Result`; `#[idempotent_job]` checks a handler's return type
/// against it, and a compile error names it when the return type is not a `Result`.
#[diagnostic::on_unimplemented(
    message = "a job handler must return `Result<T, E>`, and `{Self}` is not a `Result`",
    label = "not a `Result`",
    note = "an `Err` rolls the job back, claim included, so that a retry runs it again; the `Ok` value is stored and returned to every replay",
    note = "return `Result<T, E>` (or an alias of it) where `T` implements `Serialize` and `Deserialize` and `E` implements `From<idempotent_jobs::Error>`"
)]
pub trait JobResult: Sized {
    /// The value a run stores and a replay returns.
    type Ok: JobOutput;
    /// The handler's error.
    type Err: JobError;

    /// The result as a `Result`.
    #[doc(hidden)]
    fn into_result(self) -> Result<Self::Ok, Self::Err>;

    /// A `Result` as the handler's return type.
    #[doc(hidden)]
    fn from_result(result: Result<Self::Ok, Self::Err>) -> Self;

    /// Runs a sync handler's body once per key: what the attribute's wrapper calls. The
    /// connection the body gets is the caller's own; `reach` finds the Diesel connection behind
    /// it. A companion's `outcome` learns from here whether the body ran or was replayed.
    ///
    /// `equal`: the `Ok` type's `PartialEq`, where the wrapper found one ([`Compared`]): a result
    /// that reads back from its JSON as a value unequal to it fails its run.
    #[doc(hidden)]
    fn run_sync<Conn, C, F>(
        conn: &mut Conn,
        reach: impl Fn(&mut Conn) -> &mut C,
        job_call: JobCall<'_>,
        equal: Equality<Self>,
        body: F,
    ) -> Self
    where
        Conn: ?Sized,
        C: crate::connection::JobStore,
        F: FnOnce(&mut Conn) -> Self;

    /// [`run_sync`](JobResult::run_sync) for an async handler.
    #[cfg(feature = "async")]
    #[doc(hidden)]
    fn run_async<Conn, C, F>(
        conn: &mut Conn,
        reach: impl Fn(&mut Conn) -> &mut C,
        job_call: JobCall<'_>,
        equal: Equality<Self>,
        body: F,
    ) -> impl Future<Output = Self>
    where
        Conn: ?Sized,
        C: AsyncJobRuntime,
        F: AsyncFnOnce(&mut Conn) -> Self;
}

/// [`JobResult`]'s items named through a parameter `P` of a generic handler: the companion's
/// `outcome` of a generic handler whose return type (an alias such as `anyhow::Result<()>`)
/// names none of its parameters has `<Ret as JobResultOf<P>>::Ok` for its `Ok` type, so that it
/// takes the handler's turbofish alone, and its bound `Ret: JobResultOf<P>` is checked where
/// `outcome` is called, not where it is written (a return type that is no `Result` is the
/// handler's one error).
pub trait JobResultOf<P: ?Sized>: Sized {
    /// [`JobResult::Ok`].
    type Ok: JobOutput;
    /// [`JobResult::Err`].
    type Err: JobError;

    /// [`JobResult::into_result`].
    fn into_result(self) -> Result<Self::Ok, Self::Err>;
}

impl<R: JobResult, P: ?Sized> JobResultOf<P> for R {
    type Ok = R::Ok;
    type Err = R::Err;

    fn into_result(self) -> Result<Self::Ok, Self::Err> {
        JobResult::into_result(self)
    }
}

/// The `PartialEq` of a handler's result type, where it has one, found by the attribute's
/// wrapper where the handler's return type `R` is known: `Compared::<R>::NEW.equality()` picks
/// [`ComparedByEq`] (the receiver by value) when `R` is `Result<T, E>` with `T: PartialEq`,
/// else [`ComparedByShape`] (one autoref), which has none. A replay must return what the first
/// run returned, and values serde writes alike (an untagged enum's variants of the same content,
/// a field serde skips) are told apart only by `==`. No bound on `R`: a return type that is no
/// `Result` is the runner's error alone.
pub struct Compared<R>(std::marker::PhantomData<fn() -> R>);

impl<R> Compared<R> {
    /// The probe.
    pub const NEW: Self = Compared(std::marker::PhantomData);
}

/// [`Compared`] for a result type with `PartialEq`.
pub trait ComparedByEq<R> {
    /// `==`.
    fn equality(self) -> Equality<R>;
}

impl<T: PartialEq, E> ComparedByEq<Result<T, E>> for Compared<Result<T, E>> {
    fn equality(self) -> Equality<Result<T, E>> {
        Equality::partial_eq()
    }
}

/// [`Compared`] for any other result type: compared as serde shows it.
pub trait ComparedByShape<R> {
    /// None.
    fn equality(self) -> Equality<R>;
}

impl<R> ComparedByShape<R> for &Compared<R> {
    fn equality(self) -> Equality<R> {
        Equality::none()
    }
}

impl<T: JobOutput, E: JobError> JobResult for Result<T, E> {
    type Ok = T;
    type Err = E;

    fn into_result(self) -> Self {
        self
    }

    fn from_result(result: Self) -> Self {
        result
    }

    fn run_sync<Conn, C, F>(
        conn: &mut Conn,
        reach: impl Fn(&mut Conn) -> &mut C,
        job_call: JobCall<'_>,
        equal: Equality<Self>,
        body: F,
    ) -> Self
    where
        Conn: ?Sized,
        C: crate::connection::JobStore,
        F: FnOnce(&mut Conn) -> Self,
    {
        let recorder = Recorder::take();
        let result = crate::lifecycle::run_sync(conn, then_store(reach), job_call, equal, body);
        recorder.record(result)
    }

    #[cfg(feature = "async")]
    fn run_async<Conn, C, F>(
        conn: &mut Conn,
        reach: impl Fn(&mut Conn) -> &mut C,
        job_call: JobCall<'_>,
        equal: Equality<Self>,
        body: F,
    ) -> impl Future<Output = Self>
    where
        Conn: ?Sized,
        C: AsyncJobRuntime,
        F: AsyncFnOnce(&mut Conn) -> Self,
    {
        // Taken when the wrapper's future first runs: a companion's `outcome` has armed it then.
        let recorder = Recorder::take();
        async move {
            let result =
                crate::lifecycle::run(conn, then_async_store(reach), job_call, equal, body).await;
            recorder.record(result)
        }
    }
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

// A companion's `outcome` calls the handler itself, so that the handler's body is compiled once,
// where the user wrote it; the handler returns its plain result, and tells whether it ran or
// replayed through this slot. `outcome` arms it on its thread for the length of the call (of each
// poll, for an async handler); the first job call that starts in it takes it, so that a job the
// body calls in turn does not answer for the handler.

/// Nothing recorded yet.
const UNKNOWN: u8 = 0;
const RAN: u8 = 1;
const REPLAYED: u8 = 2;

thread_local! {
    static ARMED: Cell<Option<Arc<AtomicU8>>> = const { Cell::new(None) };
}

/// The slot a job call reports to, if a companion's `outcome` armed one.
struct Recorder(Option<Arc<AtomicU8>>);

impl Recorder {
    fn take() -> Self {
        Recorder(ARMED.with(Cell::take))
    }

    fn record<T, E>(self, result: Result<Outcome<T>, E>) -> Result<T, E> {
        if let (Some(slot), Ok(outcome)) = (&self.0, &result) {
            let kind = if outcome.is_replayed() { REPLAYED } else { RAN };
            slot.store(kind, Ordering::Relaxed);
        }
        result.map(Outcome::into_inner)
    }
}

/// Arms a fresh slot on this thread until dropped, then puts back what was armed before.
struct Armed {
    previous: Option<Arc<AtomicU8>>,
}

impl Armed {
    fn new(slot: &Arc<AtomicU8>) -> Self {
        Armed {
            previous: ARMED.with(|armed| armed.replace(Some(Arc::clone(slot)))),
        }
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        let previous = self.previous.take();
        ARMED.with(|armed| armed.set(previous));
    }
}

/// What the slot says about a call that returned `Ok(value)`.
fn outcome<T>(slot: &AtomicU8, value: T) -> Outcome<T> {
    match slot.load(Ordering::Relaxed) {
        REPLAYED => Outcome::Replayed(value),
        // `RAN`; `UNKNOWN` cannot happen (every handler reports before it returns `Ok`).
        _ => Outcome::Ran(value),
    }
}

/// A companion's `outcome`: calls the handler and says whether its body ran or was replayed.
///
/// Without bounds: the handler's own call checks its types, and a companion that checked them
/// again would report each mistake twice.
pub fn outcome_of<T, E>(call: impl FnOnce() -> Result<T, E>) -> Result<Outcome<T>, E> {
    let slot = Arc::new(AtomicU8::new(UNKNOWN));
    let result = {
        let _armed = Armed::new(&slot);
        call()
    };
    result.map(|value| outcome(&slot, value))
}

/// [`outcome_of`] for an async handler: the slot is armed while the handler's future is polled.
#[cfg(feature = "async")]
pub async fn outcome_of_async<T, E>(
    call: impl Future<Output = Result<T, E>>,
) -> Result<Outcome<T>, E> {
    let slot = Arc::new(AtomicU8::new(UNKNOWN));
    let mut call = std::pin::pin!(call);
    let result = std::future::poll_fn(|cx| {
        let _armed = Armed::new(&slot);
        call.as_mut().poll(cx)
    })
    .await;
    result.map(|value| outcome(&slot, value))
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

/// The connection parameter of a sync handler: a Diesel connection ([`JobStore`](crate::JobStore)),
/// or anything that derefs to one, such as an r2d2 pooled connection or a `Box`.
///
/// Generated code reaches the connection with method syntax, so that auto-deref finds it.
pub trait JobConnection {
    /// The connection itself.
    #[doc(hidden)]
    fn job_connection(&mut self) -> &mut Self;
}

impl<C: crate::connection::JobStore> JobConnection for C {
    fn job_connection(&mut self) -> &mut Self {
        self
    }
}

/// The connection parameter of an async handler: a diesel-async connection
/// ([`AsyncJobStore`](crate::AsyncJobStore)), a deadpool `Object`, or anything that derefs to one.
#[cfg(feature = "async")]
pub trait AsyncJobConnection {
    /// The connection itself.
    #[doc(hidden)]
    fn async_job_connection(&mut self) -> &mut Self;
}

#[cfg(feature = "async")]
impl<C: crate::connection::AsyncJobStore> AsyncJobConnection for C {
    fn async_job_connection(&mut self) -> &mut Self {
        self
    }
}

/// A fingerprint input: any value that implements `serde::Serialize`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a fingerprint input: it does not implement `Serialize`",
    label = "this parameter is a fingerprint input, so its value must implement `serde::Serialize`",
    note = "derive `serde::Serialize` for it (for a type parameter, bound it: `T: Serialize`), or name a field that implements it: `fingerprint(param.field)`"
)]
pub trait FingerprintInput {
    /// Adds the value to the fingerprint under `name`.
    #[doc(hidden)]
    fn add_to(&self, name: &str, builder: FingerprintBuilder) -> FingerprintBuilder;
}

#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + ?Sized> FingerprintInput for T {
    fn add_to(&self, name: &str, builder: FingerprintBuilder) -> FingerprintBuilder {
        builder.input(name, self)
    }
}

/// A key placeholder's value: any value that implements `Display`, written into the key escaped.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used in a job key: it does not implement `Display`",
    label = "this parameter is a key placeholder, so its value must implement `std::fmt::Display`",
    note = "implement `Display` for it (for a type parameter, bound it: `T: Display`), or name a field that does: `<param.field>`"
)]
pub trait KeyValue {
    /// Writes the value into the key.
    #[doc(hidden)]
    fn write_key(&self, writer: &mut KeyWriter);
}

#[diagnostic::do_not_recommend]
impl<T: std::fmt::Display + ?Sized> KeyValue for T {
    fn write_key(&self, writer: &mut KeyWriter) {
        writer.value(self);
    }
}
