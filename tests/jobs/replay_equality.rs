//! Results that serde writes alike for two different values (an untagged enum's variants of the
//! same content, a field serde skips, a flattened `Option` of an all-optional struct): a replay
//! would return the other value. A handler under `#[idempotent_job]` whose result type implements
//! `PartialEq` has each result compared with `==` against what its JSON reads back as, and such a
//! result fails its run, rolled back, nothing committed. Before, the run said `Ran(Refused(7))` and
//! every redelivery `Replayed(Approved(7))`: a decision the first run never made.

use diesel::SqliteConnection;
use idempotent_jobs::{Error, Outcome, idempotent_job};
use serde::{Deserialize, Serialize};

use crate::backends::{Backend as _, Sqlite};
use crate::harness::Db;

/// A decision whose variants carry the same content: written `7` either way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Decision {
    Approved(u32),
    Refused(u32),
}

/// A unit variant after the first: written `null` either way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Step {
    First,
    Second,
}

/// A field serde skips: a replay reads it as its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cached {
    pub id: u32,
    #[serde(skip)]
    pub cache: String,
}

/// Optional fields, each left out when empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inner {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub a: Option<u32>,
}

/// A flattened `Option` of them: `None` reads back as `Some(Inner { a: None })`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Flattened {
    pub id: u32,
    #[serde(flatten)]
    pub inner: Option<Inner>,
}

/// The same decision without `PartialEq`: only what serde shows can be compared.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Unequal {
    Approved(u32),
    Refused(u32),
}

#[idempotent_job(key = "decide:<n>")]
fn decide(conn: &mut SqliteConnection, n: u32) -> Result<Decision, Error> {
    let _ = conn;
    Ok(Decision::Refused(n))
}

#[idempotent_job(key = "step:<n>")]
fn step(conn: &mut SqliteConnection, n: u32) -> Result<Step, Error> {
    let _ = (conn, n);
    Ok(Step::Second)
}

#[idempotent_job(key = "cached:<n>")]
fn cached(conn: &mut SqliteConnection, n: u32) -> Result<Cached, Error> {
    let _ = conn;
    Ok(Cached {
        id: n,
        cache: "warm".into(),
    })
}

#[idempotent_job(key = "flattened:<n>")]
fn flattened(conn: &mut SqliteConnection, n: u32) -> Result<Flattened, Error> {
    let _ = conn;
    Ok(Flattened { id: n, inner: None })
}

/// A result alias, with the `Ok` type reached through it.
type Decided<T> = Result<T, Error>;

#[idempotent_job(key = "decide-async:<n>")]
async fn decide_async(
    conn: &mut diesel_async::sync_connection_wrapper::SyncConnectionWrapper<SqliteConnection>,
    n: u32,
) -> Decided<Decision> {
    let _ = conn;
    Ok(Decision::Refused(n))
}

#[idempotent_job(key = "unequal:<n>")]
fn unequal(conn: &mut SqliteConnection, n: u32) -> Result<Unequal, Error> {
    let _ = conn;
    Ok(Unequal::Refused(n))
}

/// Asserts that `first` failed as a result that would replay as another value, and that nothing
/// of it was committed.
fn refused<T: std::fmt::Debug>(conn: &mut SqliteConnection, name: &str, first: Result<T, Error>) {
    match &first {
        Err(Error::StoreResult { source, .. }) => assert!(
            source.to_string().contains("another value"),
            "{name}: {source}"
        ),
        other => panic!("{name}: the run must fail, nothing committed: {other:?}"),
    }
    assert_eq!(Sqlite::count_done(conn), 0, "{name}: nothing committed");
}

pub fn results_that_replay_as_other_values_are_refused() {
    let db = Db::<Sqlite>::fresh();
    let mut conn = db.connect();
    let first = decide(&mut conn, 7);
    refused(&mut conn, "untagged", first);
    let first = step(&mut conn, 1);
    refused(&mut conn, "untagged unit", first);
    let first = cached(&mut conn, 1);
    refused(&mut conn, "skipped field", first);
    let first = flattened(&mut conn, 1);
    refused(&mut conn, "flattened None", first);

    let mut async_conn = crate::backends::AsyncSqlite::connect(db.locator());
    let first = async_conn
        .runtime
        .block_on(decide_async(&mut async_conn.conn, 7));
    refused(&mut conn, "untagged, async, through an alias", first);
}

/// Without `PartialEq` the value cannot be compared: the run and its replay go as serde shows
/// them (documented: give such a type `PartialEq`, or a tag).
pub fn results_without_partial_eq_are_compared_as_serde_shows_them() {
    let db = Db::<Sqlite>::fresh();
    let mut conn = db.connect();
    let first = unequal(&mut conn, 7).expect("the run");
    assert!(matches!(first, Unequal::Refused(7)), "{first:?}");
    let replay = unequal(&mut conn, 7).expect("the replay");
    assert!(matches!(replay, Unequal::Approved(7)), "{replay:?}");
    let outcome = unequal::outcome(&mut conn, 7);
    assert!(matches!(outcome, Ok(Outcome::Replayed(_))), "{outcome:?}");
}
