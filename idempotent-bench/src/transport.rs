//! Statements with fixed text run as cached prepared statements: one round trip each, where
//! Diesel's own `sql_query` is never cached (prepare, execute, close) and a MySQL text batch takes
//! three (multi-statement mode on, the batch, off). What the true floor opens and closes its
//! transactions with on MySQL.

use std::marker::PhantomData;

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::result::QueryResult;
use diesel::sql_types::Untyped;

/// The text of a fixed statement.
pub trait FixedSql: 'static {
    const SQL: &'static str;
}

/// A fixed statement, prepared once per connection and found again by its type.
pub struct Fixed<M>(PhantomData<fn() -> M>);

impl<M: FixedSql> Fixed<M> {
    pub fn new() -> Self {
        Self(PhantomData)
    }
}

impl<M: FixedSql> QueryId for Fixed<M> {
    type QueryId = M;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<M: FixedSql, DB: Backend> QueryFragment<DB> for Fixed<M> {
    fn walk_ast<'b>(&'b self, mut pass: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        pass.push_sql(M::SQL);
        Ok(())
    }
}

impl<M> Query for Fixed<M> {
    type SqlType = Untyped;
}

impl<M, C> diesel::RunQueryDsl<C> for Fixed<M> {}

macro_rules! fixed {
    ($($name:ident = $sql:expr;)*) => {
        $(
            pub struct $name;
            impl FixedSql for $name {
                const SQL: &'static str = $sql;
            }
        )*
    };
}

fixed! {
    Begin = "BEGIN";
    Commit = "COMMIT";
    Rollback = "ROLLBACK";
    InTransaction = "SELECT CAST(@@in_transaction AS SIGNED) AS n";
    CallBeginJob = "CALL idempotent_bench_begin_job()";
    CallCommitJob = "CALL idempotent_bench_commit_job()";
}

/// One integer column `n`.
#[derive(diesel::QueryableByName)]
pub struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub n: i64,
}

/// `UPDATE done_jobs SET result = ? WHERE key_digest = ?`, cached.
pub struct RecordResult<'a> {
    pub digest: &'a [u8; 32],
    pub json: &'a str,
}

impl QueryId for RecordResult<'_> {
    type QueryId = RecordResult<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<DB> QueryFragment<DB> for RecordResult<'_>
where
    DB: Backend
        + diesel::sql_types::HasSqlType<diesel::sql_types::Text>
        + diesel::sql_types::HasSqlType<diesel::sql_types::Binary>,
    str: diesel::serialize::ToSql<diesel::sql_types::Text, DB>,
    [u8]: diesel::serialize::ToSql<diesel::sql_types::Binary, DB>,
{
    fn walk_ast<'b>(&'b self, mut pass: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        pass.push_sql("UPDATE done_jobs SET result = ");
        pass.push_bind_param::<diesel::sql_types::Text, str>(self.json)?;
        pass.push_sql(" WHERE key_digest = ");
        pass.push_bind_param::<diesel::sql_types::Binary, [u8]>(&self.digest[..])?;
        Ok(())
    }
}

impl<C> diesel::RunQueryDsl<C> for RecordResult<'_> {}

/// PostgreSQL: the claim and, when the key is there already, its row, in one statement (cached):
/// what a replay through the claim could send instead of the claim and then a read.
pub struct ClaimOrRead<'a> {
    pub digest: &'a [u8; 32],
    pub key: &'a str,
}

impl QueryId for ClaimOrRead<'_> {
    type QueryId = ClaimOrRead<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl QueryFragment<diesel::pg::Pg> for ClaimOrRead<'_> {
    fn walk_ast<'b>(&'b self, mut pass: AstPass<'_, 'b, diesel::pg::Pg>) -> QueryResult<()> {
        use diesel::sql_types::{Binary, Text};
        pass.push_sql(
            "WITH claimed AS (INSERT INTO done_jobs (key_digest, job_key, job_name, claim_token, done_at) VALUES (",
        );
        pass.push_bind_param::<Binary, [u8]>(&self.digest[..])?;
        pass.push_sql(", ");
        pass.push_bind_param::<Text, str>(self.key)?;
        pass.push_sql(
            ", 'macro_job', 1, (clock_timestamp() AT TIME ZONE 'UTC')) ON CONFLICT DO NOTHING RETURNING 1) \
             SELECT job_name AS s FROM done_jobs WHERE key_digest = ",
        );
        pass.push_bind_param::<Binary, [u8]>(&self.digest[..])?;
        pass.push_sql(" AND NOT EXISTS (SELECT 1 FROM claimed)");
        Ok(())
    }
}

impl Query for ClaimOrRead<'_> {
    type SqlType = Untyped;
}

impl<C> diesel::RunQueryDsl<C> for ClaimOrRead<'_> {}

/// One text column `s`.
#[derive(diesel::QueryableByName)]
pub struct Text {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub s: String,
}
