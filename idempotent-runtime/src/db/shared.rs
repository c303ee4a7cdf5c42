//! Steps that two or three databases take alike, written once: generic over the connection's
//! [`Store`] and, where the SQL text is each database's own, over the statement ([`SqlText`]).
//! (The statements whose text is the same template everywhere are in `shared_statements!`.)

use diesel::QueryableByName;
use diesel::result::QueryResult;
use diesel::sql_types::{BigInt, Binary, Nullable, Text};

use crate::migrations::Version;
use crate::sql::{Bind, SqlText, Statement, bind};
use crate::store::{Claim, ClaimAttempt, Database, DoneRow, Store};

/// A claim's values, in the order of the `?`s of every database's `ClaimInsert`: `key_digest`,
/// `job_key`, `job_name`, `fingerprint`, `claim_token`, `result`.
pub(crate) type ClaimValues<'a> = (
    Bind<Binary, &'a [u8]>,
    Bind<Text, &'a str>,
    Bind<Text, &'a str>,
    Bind<Nullable<Binary>, Option<&'a [u8]>>,
    Bind<BigInt, i64>,
    Bind<Nullable<Text>, Option<&'a str>>,
);

/// The values `claim` binds to its database's `ClaimInsert`.
pub(crate) fn claim_values<'a>(claim: &Claim<'a>) -> ClaimValues<'a> {
    (
        bind::<Binary, _>(&claim.digest[..]),
        bind::<Text, _>(claim.key),
        bind::<Text, _>(claim.job),
        bind::<Nullable<Binary>, _>(claim.fingerprint),
        bind::<BigInt, _>(claim.token),
        bind::<Nullable<Text>, _>(claim.result),
    )
}

/// The key's row as `Read` (a database's `DoneRead`, or PostgreSQL's `DoneReadFirst`) reads it.
pub(crate) async fn done_row_by<Read, C>(
    conn: &mut C,
    digest: &[u8; 32],
) -> QueryResult<Option<DoneRow>>
where
    Read: SqlText,
    C: Store,
    for<'a> (Bind<Binary, &'a [u8]>,): crate::sql::Binds<<C::Db as Database>::Backend> + Send,
    DoneRow: QueryableByName<<C::Db as Database>::Backend>,
{
    let rows: Vec<DoneRow> = conn
        .load(Statement::<Read, _>::new((bind::<Binary, _>(&digest[..]),)))
        .await?;
    Ok(rows.into_iter().next())
}

/// What a claim that did not insert found: the row that holds the key, or `Missing` when there is
/// none to read (pruned meanwhile, or not yet visible to the read): the claim goes round again.
pub(crate) fn found(row: Option<DoneRow>) -> ClaimAttempt {
    row.map_or(ClaimAttempt::Missing, ClaimAttempt::Found)
}

/// One claim on a database whose `Insert` does nothing where the key is taken (`ON CONFLICT DO
/// NOTHING`: SQLite, PostgreSQL): the insert (of `values`, the claim's), and only when it inserted
/// nothing, the key's row in a statement of its own ([`Database::done_row`]). At READ COMMITTED
/// that statement's snapshot sees the row whose insert the claim waited for.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "async-postgres"))]
pub(crate) async fn insert_or_read<Insert, C, V>(
    conn: &mut C,
    claim: &Claim<'_>,
    values: V,
) -> QueryResult<ClaimAttempt>
where
    Insert: SqlText,
    C: Store,
    V: crate::sql::Binds<<C::Db as Database>::Backend> + Send,
{
    let inserted = conn.execute(Statement::<Insert, _>::new(values)).await?;
    if inserted == 1 {
        return Ok(ClaimAttempt::Inserted);
    }
    Ok(found(C::Db::done_row(conn, claim.digest).await?))
}

/// A lease's first step on SQLite and PostgreSQL: `Park` (each database's own `ParkAbandoned`)
/// parks the messages whose relay died during their last allowed attempt (`lease.max_attempts`),
/// and says how many. MySQL finds them with `SKIP LOCKED` and parks them one by one (`db::mysql`).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "async-postgres"))]
pub(crate) async fn park_abandoned<Park, C>(
    conn: &mut C,
    lease: &crate::store::Lease<'_>,
) -> QueryResult<u64>
where
    Park: SqlText,
    C: Store,
    (Bind<diesel::sql_types::Integer, i32>,): crate::sql::Binds<<C::Db as Database>::Backend>,
{
    conn.execute(Statement::<Park, _>::new((bind::<
        diesel::sql_types::Integer,
        _,
    >(lease.max_attempts),)))
        .await
        .map(|parked| parked as u64)
}

/// The version `idempotent_schema` records (0 when it holds none); `None` when the table does not
/// exist. No lock is taken.
/// `S`: the database's `SchemaVersion` (`shared_statements!`).
pub(crate) async fn recorded_version<C: Store, S: SqlText>(conn: &mut C) -> QueryResult<Option<i32>>
where
    Version: QueryableByName<<C::Db as Database>::Backend>,
{
    if !C::Db::table_exists(conn, "idempotent_schema").await? {
        return Ok(None);
    }
    let rows: Vec<Version> = conn.load(Statement::<S, _>::new(())).await?;
    Ok(Some(
        rows.into_iter().next().and_then(|v| v.version).unwrap_or(0),
    ))
}

/// The microseconds bound at the `?` of `now_plus!()`, on a database whose `now_plus!()` has one
/// (PostgreSQL, MySQL; SQLite's binds it twice, see `db::sqlite`).
#[cfg(any(
    feature = "postgres",
    feature = "async-postgres",
    feature = "mysql",
    feature = "async-mysql"
))]
pub(crate) fn later(micros: Option<i64>) -> Bind<Nullable<BigInt>, Option<i64>> {
    bind(micros)
}
