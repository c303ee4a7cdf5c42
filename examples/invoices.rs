//! The invoice job from the README, run twice: the second run is a redelivery and changes nothing.
//!
//! ```text
//! cargo run --example invoices                      # SQLite, a fresh database file, no server
//! DATABASE_URL=postgres://postgres@127.0.0.1/test \
//!     cargo run --example invoices --features postgres
//! ```

use diesel::prelude::*;
use idempotent_jobs::{JobKey, Outcome, idempotent_job};

diesel::table! {
    invoices (id) {
        id -> Integer,
        number -> Text,
        customer_id -> Text,
        amount_cents -> BigInt,
    }
}

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Idempotent(#[from] idempotent_jobs::Error),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// The example's own data access, written once for every backend it runs on.
trait InvoiceDb: idempotent_jobs::JobStore {
    fn create_tables(&mut self) -> QueryResult<()>;
    fn insert_invoice(
        &mut self,
        number: &str,
        customer_id: &str,
        amount_cents: i64,
    ) -> QueryResult<()>;
    fn counts(&mut self) -> QueryResult<(i64, i64)>;
}

macro_rules! impl_invoice_db {
    ($conn:ty, $id:literal) => {
        impl InvoiceDb for $conn {
            fn create_tables(&mut self) -> QueryResult<()> {
                // A fresh start each run, so the output always shows one run and one replay.
                diesel::sql_query("DROP TABLE IF EXISTS invoices").execute(self)?;
                diesel::sql_query(concat!(
                    "CREATE TABLE invoices (id ",
                    $id,
                    ", number TEXT NOT NULL, ",
                    "customer_id TEXT NOT NULL, amount_cents BIGINT NOT NULL)"
                ))
                .execute(self)?;
                // ...and forget earlier runs of this demo job and its messages.
                diesel::delete(
                    idempotent_jobs::schema::done_jobs::table
                        .filter(idempotent_jobs::schema::done_jobs::job_name.eq("send_invoice")),
                )
                .execute(self)?;
                diesel::delete(
                    idempotent_jobs::schema::outbox::table
                        .filter(idempotent_jobs::schema::outbox::topic.eq("invoice-email")),
                )
                .execute(self)?;
                Ok(())
            }

            fn insert_invoice(
                &mut self,
                number: &str,
                customer_id: &str,
                amount_cents: i64,
            ) -> QueryResult<()> {
                diesel::insert_into(invoices::table)
                    .values((
                        invoices::number.eq(number),
                        invoices::customer_id.eq(customer_id),
                        invoices::amount_cents.eq(amount_cents),
                    ))
                    .execute(self)
                    .map(drop)
            }

            fn counts(&mut self) -> QueryResult<(i64, i64)> {
                Ok((
                    invoices::table.count().get_result(self)?,
                    idempotent_jobs::schema::outbox::table
                        .count()
                        .get_result(self)?,
                ))
            }
        }
    };
}

impl_invoice_db!(SqliteConnection, "INTEGER PRIMARY KEY AUTOINCREMENT");
#[cfg(feature = "postgres")]
impl_invoice_db!(PgConnection, "SERIAL PRIMARY KEY");

/// The job: create the month's invoice for a customer and queue its email, once. Its name is
/// given explicitly because the plain-API call in `demo` is the same job under the same name.
#[idempotent_job(key = "invoice:<month>:<customer_id>", name = "send_invoice")]
fn send_invoice<C: InvoiceDb>(
    conn: &mut C,
    month: &str,
    customer_id: &str,
) -> Result<String, AppError> {
    create_invoice(conn, month, customer_id)
}

/// The work itself, with no idempotency of its own.
fn create_invoice<C: InvoiceDb>(
    conn: &mut C,
    month: &str,
    customer_id: &str,
) -> Result<String, AppError> {
    let number = format!("INV-{month}-{customer_id}");
    conn.insert_invoice(&number, customer_id, 12_900)?;
    // Recorded in this job's transaction; a relay sends it after the commit (examples/outbox.rs).
    idempotent_jobs::outbox::push(conn, "invoice-email", &number)?;
    Ok(number)
}

fn demo<C: InvoiceDb>(conn: &mut C, backend: &str) -> Result<(), AppError> {
    idempotent_jobs::migrate(conn)?;
    conn.create_tables()?;
    println!("backend: {backend}");

    // `#[idempotent_job]` expands to `idempotent_jobs::run`; called directly, it also says whether the
    // call ran or replayed. Same job name and key as the annotated handler, so they share the claim.
    static JOB: idempotent_jobs::Job =
        idempotent_jobs::Job::new("send_invoice", "invoice:<month>:<customer_id>");
    let (month, customer_id) = ("2026-10", "cust_481");
    let key = JobKey::builder()
        .text("invoice:")
        .value(month)
        .text(":")
        .value(customer_id)
        .build()
        .expect("the template has a separator between its values");
    for delivery in ["first delivery", "redelivery"] {
        let outcome: Outcome<String> = idempotent_jobs::run(conn, &JOB, &key, |conn| {
            create_invoice(conn, month, customer_id)
        })?;
        let (invoices, outbox) = conn.counts()?;
        let how = if outcome.is_replayed() {
            "replayed"
        } else {
            "ran"
        };
        println!(
            "{delivery}: {how} (invoice {}); invoices: {invoices}, outbox messages: {outbox}",
            outcome.value()
        );
    }

    // The annotated handler, delivered a third time: the key is claimed, nothing runs, and the
    // caller gets the first run's invoice number back.
    let number = send_invoice(conn, month, customer_id)?;
    let (invoices, outbox) = conn.counts()?;
    println!(
        "annotated handler: replayed (invoice {number}); invoices: {invoices}, outbox messages: {outbox}"
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres") => postgres(&url),
        Ok(url) => {
            let mut conn = SqliteConnection::establish(&url)?;
            Ok(demo(&mut conn, &format!("SQLite at {url}"))?)
        }
        Err(_) => {
            let path = std::env::temp_dir().join("idempotent-invoices-example.db");
            let _ = std::fs::remove_file(&path);
            let path = path.to_string_lossy().into_owned();
            let mut conn = SqliteConnection::establish(&path)?;
            Ok(demo(&mut conn, &format!("SQLite at {path}"))?)
        }
    }
}

#[cfg(feature = "postgres")]
fn postgres(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut conn = PgConnection::establish(url)?;
    Ok(demo(&mut conn, "PostgreSQL")?)
}

#[cfg(not(feature = "postgres"))]
fn postgres(_url: &str) -> Result<(), Box<dyn std::error::Error>> {
    Err("DATABASE_URL points at PostgreSQL; run with `--features postgres`".into())
}
