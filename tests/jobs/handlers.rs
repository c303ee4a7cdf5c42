//! The handlers under test, written once and generic over the connection.

use diesel::prelude::*;
use idempotent::idempotent_job;
use serde::{Deserialize, Serialize};

diesel::table! {
    charges (id) {
        id -> Integer,
        order_id -> Text,
        amount -> BigInt,
        charge_ref -> Text,
    }
}

diesel::table! {
    test_outbox (id) {
        id -> Integer,
        topic -> Text,
        payload -> Text,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TestError {
    #[error(transparent)]
    Idempotent(#[from] idempotent::Error),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
    #[error("the card was declined")]
    Declined,
}

/// What the charge handler does after writing its effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Succeed,
    Fail,
    Panic,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub charge_ref: String,
    pub amount: i64,
}

/// The tests' own tables, per backend.
pub trait TestConn: idempotent::JobStore + idempotent::testing::Inspect + Send {
    fn create_test_tables(&mut self) -> QueryResult<()>;
    fn insert_charge(&mut self, order_id: &str, amount: i64, charge_ref: &str) -> QueryResult<()>;
    fn insert_message(&mut self, topic: &str, payload: &str) -> QueryResult<()>;
    fn count_charges(&mut self, order_id: &str) -> QueryResult<i64>;
    fn count_messages(&mut self) -> QueryResult<i64>;
    fn count_done(&mut self) -> QueryResult<i64>;
    /// `(job_key, job_name, result)` of every done job, by key.
    fn done_rows(&mut self) -> QueryResult<Vec<(String, String, Option<String>)>>;
}

macro_rules! impl_test_conn {
    ($conn:ty, $serial:literal) => {
        impl TestConn for $conn {
            fn create_test_tables(&mut self) -> QueryResult<()> {
                diesel::sql_query(concat!(
                    "CREATE TABLE charges (id ",
                    $serial,
                    ", order_id TEXT NOT NULL, ",
                    "amount BIGINT NOT NULL, charge_ref TEXT NOT NULL)"
                ))
                .execute(self)?;
                diesel::sql_query(concat!(
                    "CREATE TABLE test_outbox (id ",
                    $serial,
                    ", topic TEXT NOT NULL, payload TEXT NOT NULL)"
                ))
                .execute(self)?;
                Ok(())
            }

            fn insert_charge(
                &mut self,
                order_id: &str,
                amount: i64,
                charge_ref: &str,
            ) -> QueryResult<()> {
                diesel::insert_into(charges::table)
                    .values((
                        charges::order_id.eq(order_id),
                        charges::amount.eq(amount),
                        charges::charge_ref.eq(charge_ref),
                    ))
                    .execute(self)
                    .map(drop)
            }

            fn insert_message(&mut self, topic: &str, payload: &str) -> QueryResult<()> {
                diesel::insert_into(test_outbox::table)
                    .values((
                        test_outbox::topic.eq(topic),
                        test_outbox::payload.eq(payload),
                    ))
                    .execute(self)
                    .map(drop)
            }

            fn count_charges(&mut self, order_id: &str) -> QueryResult<i64> {
                charges::table
                    .filter(charges::order_id.eq(order_id))
                    .count()
                    .get_result(self)
            }

            fn count_messages(&mut self) -> QueryResult<i64> {
                test_outbox::table.count().get_result(self)
            }

            fn count_done(&mut self) -> QueryResult<i64> {
                idempotent::schema::done_jobs::table
                    .count()
                    .get_result(self)
            }

            fn done_rows(&mut self) -> QueryResult<Vec<(String, String, Option<String>)>> {
                use idempotent::schema::done_jobs::dsl::*;
                done_jobs
                    .select((job_key, job_name, result))
                    .order(job_key)
                    .load(self)
            }
        }
    };
}

impl_test_conn!(
    diesel::SqliteConnection,
    "INTEGER PRIMARY KEY AUTOINCREMENT"
);
#[cfg(feature = "postgres")]
impl_test_conn!(diesel::PgConnection, "SERIAL PRIMARY KEY");
#[cfg(feature = "mysql")]
impl_test_conn!(
    diesel::MysqlConnection,
    "INTEGER PRIMARY KEY AUTO_INCREMENT"
);

/// A reference no two runs share, so a test can tell which run produced a stored result.
pub fn fresh_charge_ref() -> String {
    crate::harness::unique_name("ch")
}

/// Charges an order once: a charge row and an outbox message, then succeeds, fails or panics.
#[idempotent_job(key = "charge:<order_id>")]
pub fn charge<C: TestConn>(
    conn: &mut C,
    order_id: &str,
    amount: i64,
    mode: Mode,
) -> Result<Receipt, TestError> {
    let charge_ref = fresh_charge_ref();
    conn.insert_charge(order_id, amount, &charge_ref)?;
    conn.insert_message("charge-succeeded", order_id)?;
    match mode {
        Mode::Succeed => Ok(Receipt { charge_ref, amount }),
        Mode::Fail => Err(TestError::Declined),
        Mode::Panic => panic!("the card service exploded mid-job"),
    }
}

/// A different job whose key space overlaps `charge`'s (a bug the runtime must refuse to hide).
#[idempotent_job(key = "charge:<order_id>")]
pub fn refund<C: TestConn>(conn: &mut C, order_id: &str) -> Result<(), TestError> {
    conn.insert_message("refund", order_id)?;
    Ok(())
}

/// Two placeholders separated by `:`, for the key-escaping checks.
#[idempotent_job(key = "pair:<left>:<right>")]
pub fn pair<C: TestConn>(conn: &mut C, left: &str, right: &str) -> Result<(), TestError> {
    conn.insert_message("pair", &format!("{left:?} {right:?}"))?;
    Ok(())
}

/// Same name and key as `charge`, but a result type the stored JSON does not decode into.
#[idempotent_job(key = "charge:<order_id>", name = "charge")]
pub fn charge_v2<C: TestConn>(conn: &mut C, order_id: &str) -> Result<Vec<u32>, TestError> {
    conn.insert_message("charge-v2", order_id)?;
    Ok(vec![1, 2, 3])
}
