#![doc = include_str!(concat!(env!("OUT_DIR"), "/README-docs.md"))]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// Makes a job handler safe to run twice: each call claims a key built from the job's purpose, in
/// the same database transaction as the handler's work, and a call whose key is already claimed
/// does not run the body but returns the first run's result.
///
/// The handler keeps its signature and its call sites. It takes a connection (`&mut` to a Diesel
/// connection, a diesel-async connection, or anything that derefs to one, such as a pooled
/// connection) and returns `Result<T, E>`, where `T: Serialize + DeserializeOwned` is stored and
/// returned on replay, and `E: From<idempotent_jobs::Error>`. An `async fn` works the same way on
/// diesel-async connections.
///
/// Every mistake in the arguments, the template or the signature is a compile error that names it;
/// every one of them is reported in the same build.
///
/// # Arguments
///
/// ## `key = "..."` (required)
///
/// The key template: literal text and `<name>` placeholders, each naming a parameter whose value is
/// `Display`. `<job.customer_id>` and `<pair.0>` reach into a parameter; `<self.id>` into a
/// method's receiver; `\<`, `\>` and `\\` are a literal `<`, `>` and `\`. Between two placeholders
/// the text must start with a symbol such as `:` (not a letter, digit or `%`): that symbol is
/// escaped inside values, so no two argument tuples ever share a key.
///
/// ```
/// # use diesel::prelude::*;
/// # #[derive(Debug, thiserror::Error)] enum AppError { #[error(transparent)] Idempotent(#[from] idempotent_jobs::Error) }
/// #[idempotent_jobs::idempotent_job(key = "invoice:<month>:<customer_id>")]
/// fn send_invoice(conn: &mut SqliteConnection, month: &str, customer_id: u64) -> Result<(), AppError> {
///     # let _ = conn;
///     Ok(())
/// }
/// ```
///
/// ## `conn = <parameter>`
///
/// The connection parameter, when it is not called `conn` and its type does not end in
/// `Connection` or `Conn`.
///
/// ```
/// # use diesel::prelude::*;
/// # type Error = idempotent_jobs::Error;
/// #[idempotent_jobs::idempotent_job(key = "welcome:<user_id>", conn = db)]
/// fn welcome(db: &mut SqliteConnection, user_id: i64) -> Result<(), Error> {
///     # let _ = db;
///     Ok(())
/// }
/// ```
///
/// ## `name = "..."`
///
/// The job's name, recorded with each key (default: the function's name). A key claimed by one job
/// is never replayed for another, and two different handlers with one name are refused at their
/// first call. Set it before renaming a function whose keys must keep holding, or to declare on
/// purpose that two handlers (a sync one and its async twin) are one job: both name it, with the
/// same template.
///
/// ```
/// # use diesel::prelude::*;
/// # type Error = idempotent_jobs::Error;
/// #[idempotent_jobs::idempotent_job(key = "invoice:<month>:<customer>", name = "send_invoice")]
/// fn send_invoice_v2(conn: &mut SqliteConnection, month: &str, customer: &str) -> Result<(), Error> {
///     # let _ = conn;
///     Ok(())
/// }
/// ```
///
/// ## `fingerprint(inputs, ...)`
///
/// Inputs that must be the same when a key comes back: a redelivery with other values is
/// [`Error::FingerprintMismatch`] and nothing runs. Inputs are parameters or field paths whose
/// values are `Serialize`; only a SHA-256 of their canonical JSON is stored.
///
/// ```
/// # use diesel::prelude::*;
/// # type Error = idempotent_jobs::Error;
/// #[idempotent_jobs::idempotent_job(key = "charge:<order_id>", fingerprint(amount, currency))]
/// fn charge(conn: &mut SqliteConnection, order_id: i64, amount: i64, currency: &str) -> Result<(), Error> {
///     # let _ = conn;
///     Ok(())
/// }
/// ```
///
/// ## `keep = "30d"`
///
/// Keys hold for this long after the run that claimed them committed; a delivery after that runs
/// the job again. Units `s`, `m`, `h`, `d`, `w`, combinable (`"1d12h"`). Without it keys hold for
/// ever. Lapsed rows stay until [`prune`](fn@prune) removes them.
///
/// ```
/// # use diesel::prelude::*;
/// # type Error = idempotent_jobs::Error;
/// #[idempotent_jobs::idempotent_job(key = "digest-email:<user_id>", keep = "1d")]
/// fn send_daily_digest(conn: &mut SqliteConnection, user_id: i64) -> Result<(), Error> {
///     # let _ = conn;
///     Ok(())
/// }
/// ```
///
/// ## `redact_key`
///
/// The key holds personal data: events, errors, the readable `job_key` column and the outbox show
/// `redacted:<digest prefix>` instead. The digest still finds and replays the row. This is
/// pseudonymisation: the prefix is an unsalted hash, which whoever can list the candidate values can
/// recompute.
///
/// ```
/// # use diesel::prelude::*;
/// # type Error = idempotent_jobs::Error;
/// #[idempotent_jobs::idempotent_job(key = "welcome:<email>", redact_key)]
/// fn send_welcome(conn: &mut SqliteConnection, email: &str) -> Result<(), Error> {
///     # let _ = (conn, email);
///     Ok(())
/// }
/// ```
///
/// ## `once`
///
/// The key has no placeholder on purpose: the job runs once, ever. (A template without
/// placeholders is otherwise an error: every call would share one key.)
///
/// ```
/// # use diesel::prelude::*;
/// # type Error = idempotent_jobs::Error;
/// #[idempotent_jobs::idempotent_job(key = "backfill-2026-invoices", once)]
/// fn backfill(conn: &mut SqliteConnection) -> Result<(), Error> {
///     # let _ = conn;
///     Ok(())
/// }
/// ```
///
/// ## `crate = path`
///
/// Where this crate is, when it was renamed in `Cargo.toml` or is re-exported by another crate.
///
/// ```
/// # use diesel::prelude::*;
/// use idempotent_jobs as jobs;
///
/// #[jobs::idempotent_job(key = "renamed:<id>", crate = jobs)]
/// fn renamed(conn: &mut SqliteConnection, id: u64) -> Result<u64, jobs::Error> {
///     # let _ = conn;
///     Ok(id)
/// }
/// ```
///
/// # What a call does
///
/// A first call opens a transaction, claims the key, runs the body, stores its `Ok` value and
/// commits; `Err` or a panic rolls everything back, the claim included. A later call with the same
/// key commits nothing new and returns the stored value. See [`run`](fn@run), which the attribute
/// expands to, for the details and for the plain function API.
pub use idempotent_macros::idempotent_job;

pub use idempotent_runtime::*;
