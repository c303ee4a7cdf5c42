//! Make background jobs safe to run twice.
//!
//! Queues deliver at least once, and a worker can crash after doing the work but before it
//! acknowledges the job. `#[idempotent_job]` makes the rerun harmless: it gives each call a key built
//! from the job's purpose, records the key under a unique constraint *in the same Diesel transaction
//! as the work*, and skips the work when the key is already there, returning the first run's result.
//!
//! ```
//! use diesel::prelude::*;
//! use idempotent_jobs::idempotent_job;
//!
//! #[derive(Debug, thiserror::Error)]
//! enum AppError {
//!     #[error(transparent)]
//!     Idempotent(#[from] idempotent_jobs::Error),
//!     #[error(transparent)]
//!     Database(#[from] diesel::result::Error),
//! }
//!
//! #[idempotent_job(key = "invoice:<month>:<customer_id>")]
//! fn send_invoice(conn: &mut SqliteConnection, month: &str, customer_id: &str) -> Result<i64, AppError> {
//!     diesel::sql_query("INSERT INTO invoices (month, customer_id) VALUES (?, ?)")
//!         .bind::<diesel::sql_types::Text, _>(month)
//!         .bind::<diesel::sql_types::Text, _>(customer_id)
//!         .execute(conn)?;
//!     Ok(diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>("last_insert_rowid()")).get_result(conn)?)
//! }
//!
//! # fn main() -> Result<(), AppError> {
//! let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
//! idempotent_jobs::migrate(&mut conn)?;
//! diesel::sql_query("CREATE TABLE invoices (id INTEGER PRIMARY KEY, month TEXT, customer_id TEXT)").execute(&mut conn)?;
//!
//! let first = send_invoice(&mut conn, "2026-10", "cust_481")?;
//! let again = send_invoice(&mut conn, "2026-10", "cust_481")?; // a redelivery: nothing runs
//! assert_eq!(first, again);
//! # Ok(())
//! # }
//! ```
//!
//! The rule this implements comes from the
//! <a href="https://agentwranglers.se/playbook/scaling/background-jobs-and-queues/idempotent-jobs">Agent Wranglers scaling playbook</a>.
//! See the README for the attribute's arguments, the guarantees and their limits.
#![deny(missing_docs)]

/// Makes a job handler safe to run twice.
///
/// ```text
/// #[idempotent_job(key = "invoice:<month>:<customer_id>")]
/// fn send_invoice(conn: &mut PgConnection, month: &str, customer_id: &str) -> Result<InvoiceId, AppError>
/// ```
///
/// * `key = "..."` (required): the key template. Literal text plus `<name>` placeholders, each naming
///   a parameter whose value is `Display`; `<job.field>` reaches into a parameter; `\<`, `\>` and `\\`
///   are a literal `<`, `>` and `\`. Between two placeholders the text must start with a symbol
///   such as `:`; that symbol is escaped inside values, so no two argument tuples share a key.
/// * `conn = <param>`: the connection parameter, when it is not called `conn`. It is a `&mut` to a
///   Diesel connection or to anything that derefs to one (an r2d2 pooled connection).
/// * `name = "..."`: the job's name as recorded in `done_jobs` (default: the function's name).
///   Set it before renaming a function whose keys must keep holding.
/// * `once`: the key has no placeholder on purpose: the job runs once, ever.
/// * `crate = path`: where the `idempotent-jobs` crate is, if renamed.
///
/// The handler returns `Result<T, E>` where `T: Serialize + DeserializeOwned` (stored and returned
/// on replay) and `E: From<idempotent_jobs::Error>`. Its signature and call sites do not change.
pub use idempotent_macros::idempotent_job;

pub use idempotent_runtime::*;
