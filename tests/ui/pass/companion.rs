//! The companion the attribute generates beside a free function: `name::key(..)` builds the key a
//! call claims from the key's inputs alone, `name::job()` describes the job, and
//! `name::outcome(..)` runs the handler and says whether it ran or replayed. `no_companion` leaves
//! the type namespace to the user.
#![deny(warnings)]

use std::fmt::Display;

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

pub struct Order {
    id: u64,
    amount: u64,
}

/// Inputs by value, by reference and through a field; an input that is not in the key.
#[idempotent_job(key = "invoice:<month>:<customer_id>:<order.id>", keep = "30d")]
pub fn send_invoice(
    conn: &mut SqliteConnection,
    month: &str,
    customer_id: u64,
    order: &Order,
    note: String,
) -> Result<u64, AppError> {
    let _ = (conn, note);
    Ok(order.amount)
}

/// Generics used by the key and by the body only; values that need escaping.
#[idempotent_job(key = "generic:<tag>/<id>")]
fn generic<T: Display, U: Into<u64>>(conn: &mut SqliteConnection, tag: &str, id: T, extra: U) -> Result<u64, AppError> {
    let _ = (conn, id);
    Ok(extra.into())
}

/// An in-progress policy: a duplicate waits at most 250 ms for a run of its key in progress.
#[idempotent_job(key = "report:<id>", in_progress = "wait at most 250ms")]
fn report(conn: &mut SqliteConnection, id: u64) -> Result<u64, AppError> {
    let _ = conn;
    Ok(id)
}

/// And one that gives the worker back at once.
#[idempotent_job(key = "export:<id>", in_progress = "fail")]
fn export(conn: &mut SqliteConnection, id: u64) -> Result<u64, AppError> {
    let _ = conn;
    Ok(id)
}

/// A nested `impl Trait` parameter, outside the key: the companion still compiles.
pub trait Mailer {
    fn send(&self, to: u64) -> u64;
}

struct Postman;

impl Mailer for Postman {
    fn send(&self, to: u64) -> u64 {
        to
    }
}

#[idempotent_job(key = "welcome:<user_id>")]
fn welcome(conn: &mut SqliteConnection, mailer: &impl Mailer, user_id: u64, tags: Option<impl Display>) -> Result<u64, AppError> {
    let _ = (conn, tags.map(|t| t.to_string()));
    Ok(mailer.send(user_id))
}

/// A job without a placeholder: its key takes no input.
#[idempotent_job(key = "backfill-2026-11", once)]
fn backfill(conn: &mut SqliteConnection) -> Result<(), AppError> {
    let _ = conn;
    Ok(())
}

/// `no_companion`: the user's own type of the same name stays theirs.
#[allow(non_camel_case_types)]
pub struct plain {
    pub field: u8,
}

#[idempotent_job(key = "plain:<id>", no_companion)]
fn plain(conn: &mut SqliteConnection, id: u64) -> Result<u64, AppError> {
    let _ = conn;
    Ok(id)
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    idempotent_jobs::migrate(&mut conn).unwrap();
    let order = Order { id: 7, amount: 4200 };

    // The key, from the inputs alone, is the one the run claims.
    let key = send_invoice::key("2026-10", &481, &order);
    assert_eq!(key.as_str(), "invoice:2026-10:481:7");
    assert_eq!(send_invoice::job().name(), "send_invoice");

    let first = send_invoice::outcome(&mut conn, "2026-10", 481, &order, "a".into()).unwrap();
    assert!(first.is_ran());
    assert_eq!(first.into_inner(), 4200);
    let second = send_invoice::outcome(&mut conn, "2026-10", 481, &order, "b".into()).unwrap();
    assert!(second.is_replayed());
    assert_eq!(send_invoice(&mut conn, "2026-10", 481, &order, "c".into()).unwrap(), 4200);

    let stored: Vec<String> = idempotent_jobs::schema::done_jobs::table
        .select(idempotent_jobs::schema::done_jobs::job_key)
        .load(&mut conn)
        .unwrap();
    assert_eq!(stored, vec![key.as_str().to_owned()]);

    // Escaping is the handler's: a value holding the separator cannot pose as another key.
    assert_eq!(generic(&mut conn, "a/b", 1, 5u8).unwrap(), 5);
    let escaped = generic::key("a/b", &1);
    assert_ne!(escaped.as_str(), "generic:a/b/1");
    assert!(generic::outcome(&mut conn, "a/b", 1, 6u8).unwrap().is_replayed());
    assert_eq!(generic::key("a", &"b/1").digest().len(), 32);
    assert_ne!(generic::key("a", &"b/1"), escaped);

    assert_eq!(
        report::job().in_progress(),
        idempotent_jobs::WhileInProgress::WaitAtMost(std::time::Duration::from_millis(250))
    );
    assert_eq!(export::job().in_progress(), idempotent_jobs::WhileInProgress::Fail);
    assert_eq!(send_invoice::job().in_progress(), idempotent_jobs::WhileInProgress::Wait);
    assert_eq!(report(&mut conn, 1).unwrap(), 1);
    assert_eq!(export(&mut conn, 2).unwrap(), 2);

    assert!(welcome::outcome(&mut conn, &Postman, 5, Some("new")).unwrap().is_ran());
    assert_eq!(welcome(&mut conn, &Postman, 5, None::<&str>).unwrap(), 5);

    backfill(&mut conn).unwrap();
    assert_eq!(backfill::key().as_str(), "backfill-2026-11");

    let mine = plain { field: 1 };
    assert_eq!(plain(&mut conn, u64::from(mine.field)).unwrap(), 1);
}
