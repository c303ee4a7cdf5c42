//! Every kind of legal handler compiles without a warning under the strictest lint set a user might
//! deny, and runs its body once per key. `tests/lints.rs` compiles this same file as a module that
//! clippy lints with its `pedantic` group on top (`cargo clippy --all-targets --all-features`), so
//! a warning in generated code fails a test either way. The lints beyond the set are the
//! allow-by-default ones that generated code trips most easily.
#![deny(
    warnings,
    unused,
    nonstandard_style,
    rust_2018_idioms,
    missing_docs,
    single_use_lifetimes,
    unused_lifetimes,
    unused_qualifications,
    unused_results,
    unused_import_braces,
    trivial_casts,
    trivial_numeric_casts,
    unit_bindings,
    let_underscore_drop,
    redundant_lifetimes,
    missing_debug_implementations
)]
// A crate-level lint group: `tests/lints.rs`, where this file is a module, denies it itself.
#![cfg_attr(not(test), deny(future_incompatible))]
// trybuild allows `dead_code` on its command line; every handler here is used.
#![warn(dead_code)]

use std::fmt::Display;
use std::sync::atomic::{AtomicU32, Ordering};

use diesel::prelude::*;
use idempotent_jobs::idempotent_job;
use serde::{Deserialize, Serialize};

/// Every run of every body below, counted: each key is called twice, and must run once.
static RUNS: AtomicU32 = AtomicU32::new(0);

fn ran() {
    let _previous = RUNS.fetch_add(1, Ordering::SeqCst);
}

/// The handlers' error.
#[derive(Debug)]
pub enum AppError {
    /// The job's.
    Idempotent(idempotent_jobs::Error),
    /// The body's.
    Database(diesel::result::Error),
}

impl From<idempotent_jobs::Error> for AppError {
    fn from(error: idempotent_jobs::Error) -> Self {
        AppError::Idempotent(error)
    }
}

impl Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Idempotent(error) => error.fmt(f),
            AppError::Database(error) => error.fmt(f),
        }
    }
}

impl From<diesel::result::Error> for AppError {
    fn from(error: diesel::result::Error) -> Self {
        AppError::Database(error)
    }
}

/// A job's input, reached through fields.
#[derive(Debug, Serialize)]
pub struct Invoice {
    /// Who pays.
    pub customer: Customer,
    /// Year and month.
    pub period: (u16, u8),
}

/// A customer.
#[derive(Debug, Serialize)]
pub struct Customer {
    /// Its id.
    pub id: u64,
}

/// A stored result.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// Its number.
    pub number: String,
}

/// A pattern parameter's type.
#[derive(Debug, Clone, Copy)]
pub struct Cents(pub u64);

/// Field and tuple placeholders, a fingerprint over a field, `keep` and a redacted key.
///
/// # Errors
///
/// When the job call fails.
#[idempotent_job(
    key = "invoice:<invoice.customer.id>:<invoice.period.0>-<invoice.period.1>",
    fingerprint(invoice.customer.id),
    keep = "30d",
    redact_key
)]
pub fn send_invoice(conn: &mut SqliteConnection, invoice: &Invoice) -> Result<Receipt, AppError> {
    let _rows = diesel::sql_query("SELECT 1").execute(conn)?;
    ran();
    Ok(Receipt {
        number: format!("{}-{}", invoice.period.0, invoice.customer.id),
    })
}

/// Generics with bounds and a where-clause, a const generic, and a lifetime used twice by the
/// handler but once by the key (`generic::key` takes `tag` alone: no `single_use_lifetimes` there).
///
/// # Errors
///
/// When the job call fails.
#[idempotent_job(key = "generic:<tag>:<id>")]
pub fn generic<'a, T, const N: usize>(
    conn: &mut SqliteConnection,
    tag: &'a str,
    id: T,
    first: &'a str,
    sizes: [u8; N],
) -> Result<u64, AppError>
where
    T: Display + Copy,
{
    let _ = conn;
    ran();
    Ok(
        u64::try_from(N + sizes.len() + tag.len() + first.len()).unwrap_or_default()
            + u64::from(!id.to_string().is_empty()),
    )
}

/// `impl Trait` parameters, in the key and nested beside it.
///
/// # Errors
///
/// When the job call fails.
#[idempotent_job(key = "impl-trait:<name>")]
pub fn impl_trait(
    conn: &mut SqliteConnection,
    name: impl Display,
    extra: Option<impl Display>,
) -> Result<String, AppError> {
    let _ = conn;
    ran();
    Ok(format!(
        "{name}{}",
        extra.map(|e| e.to_string()).unwrap_or_default()
    ))
}

/// Pattern parameters beside the key's inputs, and raw identifiers (`<type>` names `r#type`).
///
/// # Errors
///
/// When the job call fails.
#[idempotent_job(key = "patterns:<type>")]
pub fn r#patterns(
    conn: &mut SqliteConnection,
    r#type: &str,
    (month, day): (u8, u8),
    Cents(cents): Cents,
) -> Result<u64, AppError> {
    let _ = (conn, r#type);
    ran();
    Ok(u64::from(month) + u64::from(day) + cents)
}

/// A `Cow` and a `String` in the key: the companion's `key` takes each by reference, which
/// clippy's `ptr_arg` flags in a signature of the user's own.
///
/// # Errors
///
/// When the job call fails.
#[idempotent_job(key = "owned-text:<name>:<list>")]
pub fn owned_text(
    conn: &mut SqliteConnection,
    name: ::std::borrow::Cow<'_, str>,
    list: String,
) -> Result<usize, AppError> {
    let _rows = diesel::sql_query("SELECT 1").execute(conn)?;
    ran();
    Ok(name.len() + list.len())
}

/// A connection rebound and reborrowed by the body, found by its type.
///
/// # Errors
///
/// When the job call fails.
#[idempotent_job(key = "mut-conn:<id>")]
#[allow(clippy::mut_mut, reason = "the point: `&mut database` compiles")]
pub fn mut_conn(mut database: &mut SqliteConnection, id: u64) -> Result<u64, AppError> {
    let reborrowed: &mut &mut SqliteConnection = &mut database;
    let _rows = diesel::sql_query("SELECT 1").execute(&mut **reborrowed)?;
    ran();
    Ok(id)
}

/// A deprecated handler: calls warn, its definition does not.
///
/// # Errors
///
/// When the job call fails.
#[idempotent_job(key = "deprecated:<id>")]
#[deprecated(note = "use `mut_conn`")]
pub fn deprecated(conn: &mut SqliteConnection, id: u64) -> Result<u64, AppError> {
    let _ = conn;
    ran();
    Ok(id)
}

/// An expectation the handler's own code meets.
///
/// # Errors
///
/// When the job call fails.
#[idempotent_job(key = "expected:<id>")]
#[expect(unused_variables, reason = "kept for the signature")]
pub fn expected(conn: &mut SqliteConnection, id: u64, unused: u8) -> Result<u64, AppError> {
    let _ = conn;
    ran();
    Ok(id)
}

/// Eight key inputs beside the connection, with clippy's limit on parameters allowed on the
/// handler: the companion's `key` (eight parameters) and `outcome` (nine) repeat them, and the
/// `allow` with them.
///
/// # Errors
///
/// When the job call fails.
#[idempotent_job(key = "wide:<year>:<month>:<day>:<hour>:<minute>:<second>:<shard>:<region>")]
#[allow(clippy::too_many_arguments, reason = "a key of eight parts")]
pub fn wide(
    conn: &mut SqliteConnection,
    year: u16,
    month: u8,
    day: u8,
    hour: u8,
    minute: u8,
    second: u8,
    shard: u8,
    region: &str,
) -> Result<u64, AppError> {
    let _ = (conn, region);
    ran();
    Ok(u64::from(year)
        + u64::from(month)
        + u64::from(day)
        + u64::from(hour)
        + u64::from(minute)
        + u64::from(second)
        + u64::from(shard))
}

/// The same limit met by an expectation, which the handler fulfils.
///
/// # Errors
///
/// When the job call fails.
#[idempotent_job(key = "wide-expected:<id>")]
#[expect(clippy::too_many_arguments, reason = "eight parameters")]
pub fn wide_expected(
    conn: &mut SqliteConnection,
    id: u64,
    first: u8,
    second: u8,
    third: u8,
    fourth: u8,
    fifth: u8,
    sixth: u8,
) -> Result<u64, AppError> {
    let _ = conn;
    ran();
    Ok(id
        + u64::from(first)
        + u64::from(second)
        + u64::from(third)
        + u64::from(fourth)
        + u64::from(fifth)
        + u64::from(sixth))
}

/// The result under another name.
pub type JobResult = Result<u64, AppError>;

/// A result alias without parameters, and a job that runs once, ever.
///
/// # Errors
///
/// When the job call fails.
#[idempotent_job(key = "backfill-2026", once, name = "backfill")]
pub fn aliased(conn: &mut SqliteConnection) -> JobResult {
    let _ = conn;
    ran();
    Ok(7)
}

/// Every prelude name shadowed around a handler: generated code names nothing through the prelude.
pub mod shadowed {
    #![allow(
        non_camel_case_types,
        missing_debug_implementations,
        unused_qualifications,
        dead_code
    )]
    use diesel::SqliteConnection;
    use idempotent_jobs::idempotent_job;

    /// Shadows.
    pub struct Result;
    /// Shadows.
    pub struct Option;
    /// Shadows.
    pub struct Some;
    /// Shadows.
    pub struct None;
    /// Shadows.
    pub struct Ok;
    /// Shadows.
    pub struct Err;
    /// Shadows.
    pub struct String;
    /// Shadows.
    pub struct Vec;
    /// Shadows.
    pub struct Box;
    /// Shadows.
    pub trait Fn {}
    /// Shadows.
    pub trait FnOnce {}
    /// Shadows.
    pub trait AsyncFnOnce {}
    /// Shadows.
    pub trait From {}
    /// Shadows.
    pub trait Into {}
    /// Shadows.
    pub trait Drop {}
    /// Shadows.
    pub trait Send {}
    /// Shadows.
    pub trait Sized {}
    /// Shadows.
    pub trait Default {}
    /// Shadows.
    pub mod core {}
    /// Shadows.
    pub mod std {}

    /// A handler among them.
    ///
    /// # Errors
    ///
    /// When the job call fails.
    #[idempotent_job(
        key = "shadowed:<id>",
        keep = "1d",
        in_progress = "wait at most 2s",
        fingerprint(id)
    )]
    pub fn shadowed(
        conn: &mut SqliteConnection,
        id: u64,
    ) -> ::core::result::Result<u64, super::AppError> {
        let _ = conn;
        super::ran();
        ::core::result::Result::Ok(id)
    }
}

/// Handlers made by a macro, from fragments of every kind.
macro_rules! handler {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($conn:ident: $conn_ty:ty, $id:ident: $id_ty:ty) -> $ret:ty { $($body:tt)* } key = $key:literal) => {
        $(#[$meta])*
        #[idempotent_job(key = $key)]
        $vis fn $name($conn: $conn_ty, $id: $id_ty) -> $ret {
            $($body)*
        }
    };
}

handler! {
    /// Made by `macro_rules!`.
    ///
    /// # Errors
    ///
    /// When the job call fails.
    pub fn via_macro(conn: &mut SqliteConnection, id: u64) -> Result<u64, AppError> {
        let _ = conn;
        ran();
        Ok(id)
    }
    key = "via-macro:<id>"
}

/// A job's methods, with every kind of receiver; placeholders on fields of `self`.
#[derive(Debug, Clone)]
pub struct Account {
    /// Its id.
    pub id: u64,
}

impl Account {
    /// `&self`.
    ///
    /// # Errors
    ///
    /// When the job call fails.
    #[idempotent_job(key = "ref:<self.id>")]
    pub fn by_ref(&self, conn: &mut SqliteConnection) -> Result<u64, AppError> {
        let _ = conn;
        ran();
        Ok(self.id)
    }

    /// `&mut self`.
    ///
    /// # Errors
    ///
    /// When the job call fails.
    #[idempotent_job(key = "mut:<self.id>")]
    pub fn by_mut(&mut self, conn: &mut SqliteConnection) -> Result<u64, AppError> {
        let _ = conn;
        ran();
        self.id += 1;
        Ok(self.id)
    }

    /// `self`.
    ///
    /// # Errors
    ///
    /// When the job call fails.
    #[idempotent_job(key = "value:<self.id>")]
    pub fn by_value(self, conn: &mut SqliteConnection) -> Result<u64, AppError> {
        let _ = conn;
        ran();
        Ok(self.id)
    }

    /// `mut self`.
    ///
    /// # Errors
    ///
    /// When the job call fails.
    #[idempotent_job(key = "mut-value:<self.id>")]
    pub fn by_mut_value(mut self, conn: &mut SqliteConnection) -> Result<u64, AppError> {
        let _ = conn;
        ran();
        self.id *= 2;
        Ok(self.id)
    }

    /// `self: Box<Self>`.
    ///
    /// # Errors
    ///
    /// When the job call fails.
    #[idempotent_job(key = "boxed:<self.id>")]
    pub fn boxed(
        self: ::std::boxed::Box<Self>,
        conn: &mut SqliteConnection,
    ) -> Result<u64, AppError> {
        let _ = conn;
        ran();
        Ok(self.id)
    }

    /// `self: Rc<Self>`.
    ///
    /// # Errors
    ///
    /// When the job call fails.
    #[idempotent_job(key = "rc:<self.id>")]
    pub fn rc(self: ::std::rc::Rc<Self>, conn: &mut SqliteConnection) -> Result<u64, AppError> {
        let _ = conn;
        ran();
        Ok(self.id)
    }

    /// An associated function naming `Self`: no companion, in an `impl` block.
    ///
    /// # Errors
    ///
    /// When the job call fails.
    #[idempotent_job(key = "open:<id>")]
    pub fn open(conn: &mut SqliteConnection, id: u64) -> Result<Self, AppError> {
        let _ = conn;
        ran();
        Ok(Self { id })
    }

    /// One that does not: `no_companion`.
    ///
    /// # Errors
    ///
    /// When the job call fails.
    #[idempotent_job(key = "close:<id>", no_companion)]
    pub fn close(conn: &mut SqliteConnection, id: u64) -> Result<u64, AppError> {
        let _ = conn;
        ran();
        Ok(id)
    }
}

impl Serialize for Account {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.id)
    }
}

impl<'de> Deserialize<'de> for Account {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        u64::deserialize(deserializer).map(|id| Account { id })
    }
}

/// Runs every handler above twice, and the body of each once.
pub fn main() {
    let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
    idempotent_jobs::migrate(&mut conn).expect("migrations");
    let invoice = Invoice {
        customer: Customer { id: 481 },
        period: (2026, 11),
    };
    let account = Account { id: 3 };
    let mut calls = 0;
    for _ in 0..2 {
        let receipt = send_invoice(&mut conn, &invoice).expect("send_invoice");
        assert_eq!(receipt.number, "2026-481");
        assert_eq!(
            generic(&mut conn, "t", 9_u8, "f", [1, 2]).expect("generic"),
            2 + 2 + 1 + 1 + 1
        );
        assert_eq!(
            impl_trait(&mut conn, "n", Option::<u8>::None).expect("impl_trait"),
            "n"
        );
        assert_eq!(
            r#patterns(&mut conn, "monthly", (11, 2), Cents(5)).expect("patterns"),
            18
        );
        assert_eq!(mut_conn(&mut conn, 4).expect("mut_conn"), 4);
        assert_eq!(
            owned_text(&mut conn, "ab".into(), "c".to_owned()).expect("owned_text"),
            3
        );
        #[expect(deprecated, reason = "called on purpose")]
        let old = deprecated(&mut conn, 5).expect("deprecated");
        assert_eq!(old, 5);
        assert_eq!(expected(&mut conn, 6, 0).expect("expected"), 6);
        assert_eq!(aliased(&mut conn).expect("aliased"), 7);
        assert_eq!(
            wide(&mut conn, 2026, 1, 2, 3, 4, 5, 6, "eu").expect("wide"),
            2026 + 21
        );
        assert_eq!(
            wide_expected(&mut conn, 1, 1, 1, 1, 1, 1, 1).expect("wide_expected"),
            7
        );
        assert_eq!(shadowed::shadowed(&mut conn, 8).expect("shadowed"), 8);
        assert_eq!(via_macro(&mut conn, 9).expect("via_macro"), 9);
        assert_eq!(account.by_ref(&mut conn).expect("by_ref"), 3);
        assert_eq!(account.clone().by_mut(&mut conn).expect("by_mut"), 4);
        assert_eq!(account.clone().by_value(&mut conn).expect("by_value"), 3);
        assert_eq!(
            account
                .clone()
                .by_mut_value(&mut conn)
                .expect("by_mut_value"),
            6
        );
        assert_eq!(
            ::std::boxed::Box::new(account.clone())
                .boxed(&mut conn)
                .expect("boxed"),
            3
        );
        assert_eq!(
            ::std::rc::Rc::new(account.clone())
                .rc(&mut conn)
                .expect("rc"),
            3
        );
        assert_eq!(Account::open(&mut conn, 10).expect("open").id, 10);
        assert_eq!(Account::close(&mut conn, 11).expect("close"), 11);
        calls += 1;
    }
    assert_eq!(calls, 2);
    assert_eq!(
        RUNS.load(Ordering::SeqCst),
        21,
        "each of the 21 handlers ran once"
    );

    companions(&mut conn);
}

/// The companions: the key from the inputs alone, the job, and whether a call ran.
fn companions(conn: &mut SqliteConnection) {
    assert_eq!(generic::key("t", &9_u8).as_str(), "generic:t:9");
    assert_eq!(aliased::job().name(), "backfill");
    assert_eq!(
        owned_text::key(&"ab".into(), &"c".to_owned()).as_str(),
        "owned-text:ab:c"
    );
    assert!(via_macro::outcome(conn, 9).expect("outcome").is_replayed());
    assert!(via_macro::outcome(conn, 10).expect("outcome").is_ran());
    assert_eq!(
        wide::key(&2026, &1, &2, &3, &4, &5, &6, "eu").as_str(),
        "wide:2026:1:2:3:4:5:6:eu"
    );
    assert!(
        wide::outcome(conn, 2026, 1, 2, 3, 4, 5, 6, "eu")
            .expect("outcome")
            .is_replayed()
    );
    assert!(
        wide_expected::outcome(conn, 1, 1, 1, 1, 1, 1, 1)
            .expect("outcome")
            .is_replayed()
    );
}
