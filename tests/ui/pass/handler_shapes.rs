//! Every supported shape of handler compiles without a warning, and runs.
#![deny(warnings)]

use std::fmt::{self, Display};

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;

#[derive(Debug)]
pub enum AppError {
    Idempotent(idempotent_jobs::Error),
}

impl From<idempotent_jobs::Error> for AppError {
    fn from(error: idempotent_jobs::Error) -> Self {
        AppError::Idempotent(error)
    }
}

/// Doc comments and other attributes survive.
#[idempotent_job(key = "invoice:<month>:<customer_id>")]
#[inline]
#[must_use = "the invoice number"]
pub(crate) fn send_invoice(conn: &mut SqliteConnection, month: &str, customer_id: u64) -> Result<String, AppError> {
    let _ = conn;
    Ok(format!("INV-{month}-{customer_id}"))
}

/// A user type named like a runtime type.
pub struct Outcome(u8);

impl Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "outcome-{}", self.0)
    }
}

/// Parameters named like the wrapper's own locals do not clash with them.
#[idempotent_job(key = "clash:<key>:<conn2>:<display>:<result>:<outcome>:<job>:<writer>")]
#[allow(clippy::too_many_arguments)]
fn clash(
    conn: &mut SqliteConnection,
    key: &str,
    conn2: &str,
    display: &str,
    result: &str,
    outcome: Outcome,
    job: u8,
    writer: u8,
) -> Result<String, AppError> {
    let _ = conn;
    Ok(format!("{key}{conn2}{display}{result}{outcome}{job}{writer}"))
}

/// `mut` parameters, `impl Trait`, generics with a where-clause and lifetimes.
#[idempotent_job(key = "shapes:<count>:<name>:<id>:<tag>")]
fn shapes<'a, T>(conn: &mut SqliteConnection, mut count: u32, name: impl Display, id: T, tag: &'a str) -> Result<u32, AppError>
where
    T: Display + Copy + 'a,
{
    let _ = conn;
    count += 1;
    Ok(count + u32::try_from(format!("{name}{id}{tag}").len()).unwrap_or(0))
}

pub struct Billing {
    region: String,
}

impl Billing {
    /// A method, with a placeholder on a field of `self`.
    #[idempotent_job(key = "bill:<self.region>:<customer_id>")]
    pub fn bill(&self, conn: &mut SqliteConnection, customer_id: u64) -> Result<String, AppError> {
        let _ = conn;
        Ok(format!("{}/{customer_id}", self.region))
    }
}

pub struct Customer {
    id: u64,
}

pub struct InvoiceJob {
    customer: Customer,
    period: (u16, u8),
}

/// Field paths, tuple fields and raw identifiers (`<type>` and `<r#type>` both name `r#type`).
#[idempotent_job(key = "job:<job.customer.id>:<job.period.0>-<job.period.1>:<type>:<r#type>")]
fn nested(conn: &mut SqliteConnection, job: &InvoiceJob, r#type: &str) -> Result<u64, AppError> {
    let _ = (conn, r#type);
    Ok(job.customer.id)
}

/// The connection named by `conn =`, and found by its type.
#[idempotent_job(key = "named:<id>", conn = db)]
fn named(db: &mut SqliteConnection, id: u64) -> Result<u64, AppError> {
    let _ = db;
    Ok(id)
}

#[idempotent_job(key = "detected:<id>")]
fn detected(database: &mut SqliteConnection, id: u64) -> Result<u64, AppError> {
    let _ = database;
    Ok(id)
}

/// A job that runs once, ever, and a recorded name.
#[idempotent_job(key = "backfill-2026-11", once, name = "backfill")]
fn backfill(conn: &mut SqliteConnection) -> Result<(), AppError> {
    let _ = conn;
    Ok(())
}

/// A fingerprint over inputs and a field, a key that lapses, and a redacted key.
#[idempotent_job(key = "charge:<order_id>", fingerprint(amount, job.customer.id), keep = "1d12h", redact_key)]
fn charge(conn: &mut SqliteConnection, order_id: u64, amount: u64, job: &InvoiceJob) -> Result<u64, AppError> {
    let _ = (conn, job);
    Ok(order_id + amount)
}

/// The one duration grammar: words, spaces and milliseconds, for `keep` and `in_progress` alike.
#[idempotent_job(key = "digest:<id>", keep = "30 days", in_progress = "wait at most 1.5s")]
fn digest(conn: &mut SqliteConnection, id: u64) -> Result<u64, AppError> {
    let _ = conn;
    Ok(id)
}

/// A key that lapses half a second after its run.
#[idempotent_job(key = "blink:<id>", keep = "500ms")]
fn blink(conn: &mut SqliteConnection, id: u64) -> Result<u64, AppError> {
    let _ = conn;
    Ok(id)
}

/// Literal angle brackets.
#[idempotent_job(key = r"tag:\<b\>:<id>")]
fn escaped(conn: &mut SqliteConnection, id: u64) -> Result<(), AppError> {
    let _ = conn;
    let _ = id;
    Ok(())
}

/// A key passed through `macro_rules!`.
macro_rules! job {
    ($name:ident, $key:literal) => {
        #[idempotent_job(key = $key)]
        fn $name(conn: &mut SqliteConnection, id: u64) -> Result<u64, AppError> {
            let _ = conn;
            Ok(id)
        }
    };
}

job!(via_macro, "via-macro:<id>");

/// A generic connection.
#[idempotent_job(key = "generic:<id>")]
fn generic<C: idempotent_jobs::JobStore>(conn: &mut C, id: u64) -> Result<u64, AppError> {
    let _ = conn;
    Ok(id)
}

/// A pattern parameter at place 1 beside a parameter named `__arg1`, the name the companion made
/// up for the pattern (it was bound twice: E0415).
#[idempotent_job(key = "pattern:<id>")]
fn pattern(conn: &mut SqliteConnection, (a, b): (u8, u8), __arg1: u8, id: u8) -> Result<u32, AppError> {
    let _ = conn;
    Ok(u32::from(a) + u32::from(b) + u32::from(__arg1) + u32::from(id))
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();
    assert_eq!(send_invoice(&mut conn, "2026-10", 481).unwrap(), "INV-2026-10-481");
    assert!(clash(&mut conn, "k", "c", "d", "r", Outcome(1), 2, 3).is_ok());
    assert_eq!(shapes(&mut conn, 1, "n", 7, "t").unwrap(), 2 + 3);
    assert_eq!(shapes(&mut conn, 1, "n", 7, "t").unwrap(), 5, "replayed");
    let billing = Billing { region: "eu".into() };
    assert_eq!(billing.bill(&mut conn, 1).unwrap(), "eu/1");
    let job = InvoiceJob { customer: Customer { id: 9 }, period: (2026, 11) };
    assert_eq!(nested(&mut conn, &job, "monthly").unwrap(), 9);
    assert_eq!(named(&mut conn, 1).unwrap(), 1);
    assert_eq!(detected(&mut conn, 2).unwrap(), 2);
    backfill(&mut conn).unwrap();
    escaped(&mut conn, 1).unwrap();
    assert_eq!(digest(&mut conn, 5).unwrap(), 5);
    assert_eq!(blink(&mut conn, 6).unwrap(), 6);
    assert_eq!(via_macro(&mut conn, 3).unwrap(), 3);
    assert_eq!(generic(&mut conn, 4).unwrap(), 4);
    assert_eq!(pattern(&mut conn, (1, 2), 3, 4).unwrap(), 10);
    assert_eq!(charge(&mut conn, 1, 10, &job).unwrap(), 11);
    assert_eq!(charge(&mut conn, 1, 10, &job).unwrap(), 11, "same inputs: replayed");
    assert!(matches!(
        charge(&mut conn, 1, 20, &job),
        Err(AppError::Idempotent(idempotent_jobs::Error::FingerprintMismatch { .. }))
    ));

    let keys: Vec<String> = idempotent_jobs::schema::done_jobs::table
        .select(idempotent_jobs::schema::done_jobs::job_key)
        .order(idempotent_jobs::schema::done_jobs::job_key)
        .load(&mut conn)
        .unwrap();
    assert!(keys.contains(&"job:9:2026-11:monthly:monthly".to_owned()), "{keys:?}");
    assert!(keys.contains(&"tag:<b>:1".to_owned()), "{keys:?}");
    assert!(keys.contains(&"backfill-2026-11".to_owned()), "{keys:?}");
}
